"""Benchmark: a per-node check on N real sshd nodes costs close to what it costs on one.

For each cluster size N this starts N sshd nodes in network namespaces (tests/netns.py), loads
the inventory they write, and times fan-outs of runners.system.probe (a Python payload shipped
over SSH that returns the node's system facts; --step true times the remote command `true`):

  cold    the first fan-out on fresh transports: TCP connect, SSH handshake and key auth, probe
  warm    a second fan-out on the same transports: the connections are reused
  serial  the warm step again, one node after another (workers=1), for N <= --serial-max
  pool/64 the warm step again on 64 threads, for N > 64: the fan-out's pool before each node had
          a thread of its own (--step sleep shows what that cost a long check: a wave per 64)

Each figure is the median of --repeat runs; in every run every node must answer (probe: with\nits own hostname).
Run from the repository root as root: `.venv/bin/python bench/fanout.py` (or `make bench`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, Mapping, NoReturn, Optional

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # the harness packages, and tests/netns.py by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import yaml  # noqa: E402
from netns import MAX_NODES, NamespaceCluster, netns_available  # noqa: E402

from inventory.loader import load_inventory  # noqa: E402
from inventory.model import Node  # noqa: E402
from runners import system  # noqa: E402
from runners.fanout import close_everywhere, fan_out  # noqa: E402
from runners.transport import Result, Transport, make_transport  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sizes_up_to(largest: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated cluster sizes of 1..largest nodes."""
    def sizes(text: str) -> list[int]:
        try:
            found = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not found or any(not 1 <= n <= largest for n in found):
            raise argparse.ArgumentTypeError(f"sizes must be 1..{largest} nodes each")
        return found
    return sizes


FLEET_MAX = 2048  # nodes: eight namespace clusters' worth


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cluster_arguments(description: str, default_sizes: str, largest: int = MAX_NODES) -> argparse.ArgumentParser:
    """The options every namespace-cluster bench takes: the sizes, and runs per measurement."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    sizes = sizes_up_to(largest)
    parser.add_argument("--sizes", type=sizes, default=sizes(default_sizes),
                        help=f"cluster sizes to measure, comma-separated (default {default_sizes})")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="runs per measurement; the median is reported (default 3)")
    return parser


def measure_sizes(bench: str, sizes: list[int], measure: Callable[[int, Path], dict]) -> Optional[list[dict]]:
    """measure(n, workdir) for each size, smallest first, in one temporary directory; None (and
    why, on stderr) where namespace nodes cannot start here."""
    available, reason = netns_available()
    if not available:
        log(f"{bench} bench: cannot start namespace nodes: {reason}")
        return None
    with tempfile.TemporaryDirectory(prefix="handover-bench-") as tmp:
        return [measure(n, Path(tmp)) for n in sorted(set(sizes))]


@contextmanager
def namespace_nodes(n: int, workdir: Path) -> Iterator[tuple[Path, float, NamespaceCluster]]:
    """N started sshd nodes: their inventory file, how long they took to start, and the nodes
    (to cut links); stopped on the way out, whatever happened."""
    cluster = NamespaceCluster(workdir / f"n{n}", n)
    try:
        log(f"N={n}: starting {n} sshd node(s)")
        started = time.perf_counter()
        cluster.start()
        start_s = time.perf_counter() - started
        yield cluster.write_inventory(workdir / f"n{n}" / "inventory.yaml"), start_s, cluster
    finally:
        log(f"N={n}: stopping the nodes")
        cluster.stop()


@contextmanager
def fleet(n: int, workdir: Path) -> Iterator[tuple[Path, list[Node]]]:
    """N started sshd nodes, in clusters of up to MAX_NODES with a prefix each (c0n1, c1n1, ...),
    and one inventory for them all (each node with its cluster's key and known_hosts); every
    cluster stopped on the way out."""
    with ExitStack() as stack:
        entries: list[dict] = []
        inventory: dict = {}
        for index in range(math.ceil(n / MAX_NODES)):
            size = min(MAX_NODES, n - index * MAX_NODES)
            cluster = NamespaceCluster(workdir / f"n{n}c{index}", size, prefix=f"c{index}n", start_timeout=180)
            stack.callback(cluster.stop)
            log(f"N={n}: starting cluster {index + 1} ({size} nodes)")
            cluster.start()
            written = cluster.write_inventory(workdir / f"n{n}c{index}" / "inventory.yaml")
            inventory = yaml.safe_load(written.read_text())
            ssh = inventory["ssh"]
            entries += [{**node, "identity_file": ssh["identity_file"], "known_hosts": ssh["known_hosts"]}
                        for node in inventory["nodes"]]
        for key in ("identity_file", "known_hosts"):
            inventory["ssh"].pop(key)
        path = workdir / f"n{n}" / "inventory.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({**inventory, "nodes": entries}, sort_keys=False))
        yield path, load_inventory(path).nodes


def openssh_argv(node: Node) -> list[str]:
    """Plain OpenSSH to the namespace nodes, as an operator would type it: their key and known_hosts."""
    return ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={node.ssh.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-i", str(node.ssh.identity_file), "-l", "root"]


def run_bench(main: Callable[[], int], name: str) -> NoReturn:
    """Exit with main's status; on Ctrl-C say so (each bench stops its nodes on the way out)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log(f"{name} bench: interrupted; its nodes were stopped")
        sys.exit(130)


def run_true(transport: Transport) -> Result:
    """The cheapest remote command: what the transport and the fan-out cost by themselves."""
    return transport.run(["true"], timeout=30)


SLEEP_S = 2
POOL_OF_64 = 64  # the fan-out's threads before each node had its own


def run_sleep(transport: Transport) -> Result:
    """A long per-node check in little: it waits on its node (as stress-ng does), costing no CPU."""
    return transport.run(["sleep", str(SLEEP_S)], timeout=30)


# name -> (step, whether its stdout is system facts to check against the node's name)
STEPS: dict[str, tuple[Callable[[Transport], Result], bool]] = {
    "probe": (system.probe, True),
    "true": (run_true, False),
    "sleep": (run_sleep, False),
}


def timed_fan_out(transports: Mapping[str, Transport], step: str, *,
                  workers: Optional[int]) -> tuple[float, float, dict[str, Result]]:
    """Wall-clock and harness CPU seconds of one fan-out of the step, once every node answered.

    The CPU time is this process's (all its threads): what the harness itself spends, apart from
    the sshd sessions and remote commands, which on a real cluster run on the nodes' own CPUs.
    """
    function, gives_facts = STEPS[step]
    cpu_started, started = time.process_time(), time.perf_counter()
    results = fan_out(transports, function, name=step, workers=workers)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    failed = [result.explain() for result in results.values() if not result.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} nodes failed, e.g. {failed[0]}")
    for name, result in results.items():
        hostname = system.parse_system_facts(result.stdout).hostname if gives_facts else name
        if hostname != name:
            raise RuntimeError(f"{name} answered with the facts of {hostname!r}")
    return elapsed, cpu, results


def measure(n: int, step: str, *, repeat: int, workers: Optional[int], serial_max: int,
            workdir: Path) -> dict:
    transports: dict[str, Transport] = {}
    with namespace_nodes(n, workdir) as (inventory_file, start_s, _):
        try:
            inventory = load_inventory(inventory_file)
            transports = {node.name: make_transport(node) for node in inventory.nodes}
            cold, warm, warm_cpu, warm_node_s = [], [], [], []
            for run in range(repeat):
                close_everywhere(transports.values())  # the next fan-out connects and authenticates again
                cold.append(timed_fan_out(transports, step, workers=workers)[0])
                elapsed, cpu, results = timed_fan_out(transports, step, workers=workers)
                warm.append(elapsed)
                warm_cpu.append(cpu)
                warm_node_s.append(statistics.median(r.duration_s for r in results.values()))
                log(f"N={n}: run {run + 1}/{repeat}: cold {cold[-1]:.3f} s, warm {warm[-1]:.3f} s")
            serial = []
            if n <= serial_max:
                for run in range(repeat):
                    serial.append(timed_fan_out(transports, step, workers=1)[0])
                    log(f"N={n}: run {run + 1}/{repeat}: serial {serial[-1]:.3f} s")
            pool = []
            if n > POOL_OF_64:
                for run in range(repeat):
                    pool.append(timed_fan_out(transports, step, workers=POOL_OF_64)[0])
                    log(f"N={n}: run {run + 1}/{repeat}: on 64 threads {pool[-1]:.3f} s")
        finally:
            close_everywhere(transports.values())
    warm_s = statistics.median(warm)
    serial_s = statistics.median(serial) if serial else None
    pool_s = statistics.median(pool) if pool else None
    return {
        "nodes": n,
        "cold_s": statistics.median(cold),
        "warm_s": warm_s,
        "serial_s": serial_s,
        "pool64_s": pool_s,
        "warm_per_node_ms": 1000 * warm_s / n,
        "warm_harness_cpu_s": statistics.median(warm_cpu),
        "speedup_vs_serial": serial_s / warm_s if serial_s is not None else None,
        "warm_node_step_median_ms": 1000 * statistics.median(warm_node_s),
        "cluster_start_s": start_s,
        "runs": {"cold_s": cold, "warm_s": warm, "warm_harness_cpu_s": warm_cpu, "serial_s": serial,
                 "pool64_s": pool},
    }


def markdown_table(lines: list[tuple[str, ...]]) -> str:
    """A header line and rows of cells as a Markdown table, right-aligned, as the READMEs quote them."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["| " + " | ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) + " |"
           for line in lines]
    out.insert(1, "|" + "|".join("-" * (width + 1) + ":" for width in widths) + "|")
    return "\n".join(out)


def table(rows: list[dict]) -> str:
    base = rows[0]["warm_s"]
    header = ("N", "cold s", "warm s", "serial s", "pool/64 s", "warm per-node ms", "speed-up vs serial",
              f"warm vs N={rows[0]['nodes']}", "warm harness CPU s")
    lines = [header]
    for row in rows:
        serial = row["serial_s"]
        lines.append((
            str(row["nodes"]),
            f"{row['cold_s']:.3f}",
            f"{row['warm_s']:.3f}",
            f"{serial:.3f}" if serial is not None else "-",
            f"{row['pool64_s']:.3f}" if row["pool64_s"] is not None else "-",
            f"{row['warm_per_node_ms']:.1f}",
            f"{row['speedup_vs_serial']:.1f}x" if serial is not None else "-",
            f"{row['warm_s'] / base:.1f}x",
            f"{row['warm_harness_cpu_s']:.3f}",
        ))
    return markdown_table(lines)


def conclusion(rows: list[dict], step: str) -> str:
    first, last = rows[0], rows[-1]
    text = (f"Warm {STEP_LABELS[step]} on {last['nodes']} node(s) took {last['warm_s']:.2f} s against "
            f"{first['warm_s']:.2f} s on {first['nodes']}: {last['nodes'] / first['nodes']:g}x the nodes "
            f"for {last['warm_s'] / first['warm_s']:.1f}x the time")
    serial = [row for row in rows if row["serial_s"] is not None and row["nodes"] > 1]
    if serial:
        best = serial[-1]
        text += (f"; at {best['nodes']} nodes, one node after another took "
                 f"{best['speedup_vs_serial']:.1f}x as long as the fan-out")
    if last["pool64_s"] is not None:
        text += f"; on 64 threads, {last['nodes']} nodes took {last['pool64_s']:.2f} s"
    return text + "."


STEP_LABELS = {"probe": "system.probe", "true": "`true`", "sleep": f"`sleep {SLEEP_S}`"}


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = cluster_arguments(__doc__, "1,8,32,64")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="cap the fan-out's threads (default: one per node, as the harness does)")
    parser.add_argument("--serial-max", type=int, default=32,
                        help="largest N also timed serially (default 32)")
    parser.add_argument("--step", choices=sorted(STEPS), default="probe",
                        help="probe: runners.system.probe, the Python payload shipped through stdin "
                             "(default); true: the remote command `true`, the transport alone; "
                             f"sleep: `sleep {SLEEP_S}` on every node, a long check in little")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)

    when = datetime.now(timezone.utc)
    rows = measure_sizes("fanout", args.sizes, lambda n, workdir: measure(
        n, args.step, repeat=args.repeat, workers=args.workers, serial_max=args.serial_max, workdir=workdir))
    if rows is None:
        return 2

    info = machine()
    print(f"fan-out of {STEP_LABELS[args.step]} over SSH to namespace sshd nodes; median of {args.repeat} runs; "
          f"{info['cpus']} CPUs, {when:%Y-%m-%d %H:%M} UTC")
    print(table(rows))
    print(conclusion(rows, args.step))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "date": when.isoformat(timespec="seconds"),
            "machine": info,
            "step": args.step,
            "repeat": args.repeat,
            "workers": args.workers,
            "serial_max": args.serial_max,
            "results": rows,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_bench(main, "fanout")
