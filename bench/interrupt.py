"""Benchmark: what a Ctrl-C costs on N real sshd nodes, until nothing of the run is left on them.

For each cluster size N this starts N sshd nodes in network namespaces (tests/netns.py), then,
in the same run and on the same nodes, starts a long command on every node (a fan-out of a
`sleep`, as a check's tool would run) and times how each of these ends them all:

  harness   runners.fanout.kill_everywhere: every node's kill_running() at once (what the
            fan-out does on Ctrl-C), each a TERM, a wait until the node's tagged processes are
            gone, KILL only after a grace
  serial    the same kill_running(), one node after the other (what the fan-out did before)
  xargs     what an operator would type instead: `xargs -P N` running `ssh node pkill -f CMD`
            with OpenSSH, a fresh connection per node

A run counts only once the fan-out has returned and no `sleep` of the run is left on any node.
Each figure is the median of --repeat runs. Last, once per size, the end of a run:

  close     runners.fanout.close_everywhere, every connection's watchdog told to finish and
            waited for; it counts only if no watchdog is left on any node when it returns
  cut       the same on fresh connections once every node's link is cut (down, unnoticed yet):
            each close waits out LEASE_END_S, on a thread per node
  cut/64    the same cut close on a pool of 64 threads (what the fan-out had): why each node has one

Run as root from the repository root: `.venv/bin/python bench/interrupt.py` (the nodes are
namespaces on this machine's cores).
"""
from __future__ import annotations

import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Optional

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # the harness packages, and tests/netns.py by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fanout import (  # noqa: E402
    cluster_arguments,
    log,
    machine,
    measure_sizes,
    namespace_nodes,
    openssh_argv,
    run_bench,
)
from netns import NamespaceCluster  # noqa: E402

from inventory.loader import load_inventory  # noqa: E402
from inventory.model import Cluster  # noqa: E402
from runners.fanout import close_everywhere, fan_out, kill_everywhere  # noqa: E402
from runners.transport import Transport, make_transport  # noqa: E402

WAIT_S = 60  # for the sleeps to start on every node, and for them to be gone
POOL_OF_64 = 64  # the fan-out's threads before each node had its own


def sleepers(command: str) -> int:
    """Processes running exactly `command` (the nodes share this machine's PID namespace)."""
    found = subprocess.run(["pgrep", "-x", "-f", command], capture_output=True, text=True).stdout
    return len(found.split())


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {WAIT_S} s waiting for {what}")
        time.sleep(0.05)


Kill = Callable[[str], None]  # ends every node's run of this command line


def harness_kill(transports: Mapping[str, Transport]) -> Kill:
    return lambda command: kill_everywhere(transports.values())


def serial_kill(transports: Mapping[str, Transport]) -> Kill:
    def kill(command: str) -> None:
        for transport in transports.values():
            transport.kill_running()
    return kill


def xargs_kill(cluster: Cluster) -> Kill:
    ssh = openssh_argv(cluster.nodes[0])
    hosts = "".join(f"{node.address}\n" for node in cluster.nodes).encode()

    def kill(command: str) -> None:
        script = f'{shlex.join(ssh)} "$1" pkill -x -f {shlex.quote(shlex.quote(command))}; exit 0'
        subprocess.run(["xargs", "-P", str(len(cluster.nodes)), "-n", "1", "sh", "-c", script, "xargs-kill"],
                       input=hosts, check=True, stdout=subprocess.DEVNULL)
    return kill


def one_run(transports: Mapping[str, Transport], kill: Kill) -> float:
    """Seconds from the kill until the fan-out returned and no sleep of this run is left."""
    command = f"sleep {random.randint(300, 899)}.{random.randint(1, 10**6)}"
    ended: list[dict] = []
    running = threading.Thread(target=lambda: ended.append(fan_out(  # every node's sleep at once
        transports, lambda transport: transport.run(command.split(), timeout=WAIT_S * 5), name="sleep")))
    running.start()
    wait_for(lambda: sleepers(command) == len(transports), f"{len(transports)} sleeps to start")
    started = time.perf_counter()
    kill(command)
    running.join(WAIT_S)
    wait_for(lambda: sleepers(command) == 0, "the sleeps to be gone")
    elapsed = time.perf_counter() - started
    if not ended or any(result.ok for result in ended[0].values()):
        raise RuntimeError("the fan-out did not end with every node's sleep killed")
    return elapsed


def timed_close(transports: Mapping[str, Transport]) -> float:
    """Seconds to close every node's connection, each once its watchdog has exited."""
    started = time.perf_counter()
    close_everywhere(transports.values())
    elapsed = time.perf_counter() - started
    left = subprocess.run(["pgrep", "-c", "-f", "[h]andover-lease"], capture_output=True, text=True).stdout
    if int(left or 0):
        raise RuntimeError(f"{left.strip()} watchdog(s) still running after the close")
    return elapsed


def timed_cut_close(inventory: Cluster, nodes: NamespaceCluster, workers: Optional[int]) -> float:
    """Seconds to close fresh connections to every node once all their links are cut: each
    close waits out LEASE_END_S for a watchdog that cannot answer. `workers` None: close_everywhere."""
    transports = {node.name: make_transport(node) for node in inventory.nodes}
    try:
        if not all(result.ok for result in fan_out(transports, lambda t: t.run(["true"], timeout=30)).values()):
            raise RuntimeError("not every node answered before its link was cut")
        for node in inventory.nodes:
            nodes.link_down(node.name)
        started = time.perf_counter()
        if workers is None:
            close_everywhere(transports.values())
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(Transport.close, transports.values()))
        return time.perf_counter() - started
    finally:
        for node in inventory.nodes:
            nodes.link_up(node.name)
        nodes.wait_until_listening()  # a port just up drops the first connects for a moment


def measure(n: int, *, repeat: int, serial_max: int, workdir: Path) -> dict:
    transports: dict[str, Transport] = {}
    with namespace_nodes(n, workdir) as (inventory_file, _, nodes):
        try:
            inventory = load_inventory(inventory_file)
            transports = {node.name: make_transport(node) for node in inventory.nodes}
            ways = {"harness": harness_kill(transports), "xargs": xargs_kill(inventory)}
            if n <= serial_max:
                ways["serial"] = serial_kill(transports)
            runs: dict[str, list[float]] = {way: [] for way in ways}
            for run in range(repeat):
                for way, kill in ways.items():
                    runs[way].append(one_run(transports, kill))
                log(f"N={n}: run {run + 1}/{repeat}: " + ", ".join(f"{way} {runs[way][-1]:.2f} s" for way in ways))
            closes = {"close_s": timed_close(transports),
                      "cut_s": timed_cut_close(inventory, nodes, None),
                      "cut64_s": timed_cut_close(inventory, nodes, POOL_OF_64)}
            log(f"N={n}: " + ", ".join(f"{key[:-2]} {value:.2f} s" for key, value in closes.items()))
        finally:
            close_everywhere(transports.values())
    return {"nodes": n, **{f"{way}_s": statistics.median(times) for way, times in runs.items()},
            **closes, "runs": runs}


def table(rows: list[dict]) -> str:
    def cell(row: dict, key: str) -> str:
        return f"{row[key]:.2f}" if key in row else "-"

    keys = ("harness_s", "xargs_s", "serial_s", "close_s", "cut_s", "cut64_s")
    lines = ["|   N | harness s | xargs -P ssh pkill s | serial s | close s | cut s | cut/64 s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {row['nodes']:>3} | " + " | ".join(cell(row, key) for key in keys) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = cluster_arguments(__doc__, "8,32,64,128")
    parser.add_argument("--serial-max", type=int, default=64,
                        help="largest N also killed one node after the other (default 64)")
    args = parser.parse_args(argv)
    when = datetime.now(timezone.utc)
    rows = measure_sizes("interrupt", args.sizes, lambda n, workdir: measure(
        n, repeat=args.repeat, serial_max=args.serial_max, workdir=workdir))
    if rows is None:
        return 2
    info = machine()
    print(f"a Ctrl-C on namespace sshd nodes, until no sleep is left, median of {args.repeat} runs; the closes once; "
          f"{info['cpus']} CPUs, {when:%Y-%m-%d %H:%M} UTC")
    print(table(rows))
    return 0


if __name__ == "__main__":
    run_bench(main, "interrupt")
