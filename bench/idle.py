"""Benchmark: what N idle SSH connections cost the harness while its checks wait on the nodes.

A long check (stress-ng for minutes, a soak for hours) leaves every node's connection idle but
for its heartbeat. For each N this starts N sshd nodes (several namespace clusters past 253),
connects to every node (a fan-out of `true`), and measures CPU over --window seconds of idling:

  harness     this process, with the connections as the harness keeps them: paramiko's thread
              wakes for data or every runners.ssh.IDLE_POLL_S
  0.1 s poll  the same connections with paramiko's own 0.1 s socket timeout put back, as the
              harness kept them before (AeadFirstTransport.settle)
  OpenSSH     N plain `ssh` clients to the same nodes, ServerAliveInterval 3 (the harness's
              heartbeat), their CPU summed from /proc: what an operator's own ssh would cost

with the nodes lost (no answer to their heartbeats) in the harness's window and in the 0.1 s
poll's; then a warm fan-out of `true`, and the close of every connection. Run from the
repository root as root: `.venv/bin/python bench/idle.py --sizes 64,253,1024`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "bench", ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import paramiko  # noqa: E402
from fanout import (  # noqa: E402
    FLEET_MAX,
    fleet,
    log,
    machine,
    markdown_table,
    measure_sizes,
    openssh_argv,
    positive_int,
    run_bench,
    sizes_up_to,
)

from handover.session import raise_open_files  # noqa: E402
from inventory.model import Node  # noqa: E402
from runners.fanout import close_everywhere, fan_out  # noqa: E402
from runners.neighbours import neighbour_table_warning  # noqa: E402
from runners.ssh import IDLE_POLL_S  # noqa: E402
from runners.transport import HEARTBEAT_S, Transport, make_transport  # noqa: E402

PARAMIKO_POLL_S = 0.1  # paramiko's own socket timeout
TICKS = os.sysconf("SC_CLK_TCK")


def harness_cpu_percent(window_s: float) -> float:
    """This process's CPU (all its threads) over window_s of idling, in % of one core."""
    started = time.process_time()
    time.sleep(window_s)
    return 100 * (time.process_time() - started) / window_s


def set_paramiko_poll(seconds: float) -> None:
    """Every open connection's socket timeout: how often its paramiko thread wakes when idle."""
    for thread in threading.enumerate():
        if isinstance(thread, paramiko.Transport) and thread.is_active():
            thread.sock.settimeout(seconds)


def openssh_cpu_percent(nodes: list[Node], window_s: float) -> float:
    """N idle OpenSSH clients' CPU over window_s, in % of one core, once every one is logged in."""
    clients = [subprocess.Popen([*openssh_argv(node), "-o", f"ServerAliveInterval={HEARTBEAT_S}",
                                 *(["-p", str(node.ssh.port)] if node.ssh.port else []), node.address,
                                 "echo up; exec sleep 100000"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
               for node in nodes]
    try:
        for node, client in zip(nodes, clients, strict=True):
            assert client.stdout is not None
            if client.stdout.readline().strip() != b"up":
                raise RuntimeError(f"plain ssh to {node.name} did not log in")
        before = sum(map(_cpu_ticks, clients))
        time.sleep(window_s)
        return 100 * (sum(map(_cpu_ticks, clients)) - before) / TICKS / window_s
    finally:
        for client in clients:
            client.kill()
        for client in clients:
            client.wait()


def _cpu_ticks(process: subprocess.Popen) -> int:
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def fan_out_true(transports: dict[str, Transport]) -> tuple[float, int]:
    """Seconds for a fan-out of `true`, and how many nodes did not answer."""
    started = time.perf_counter()
    results = fan_out(transports, lambda transport: transport.run(["true"], timeout=60), name="true")
    return time.perf_counter() - started, sum(not result.ok for result in results.values())


def lost_nodes(transports: dict[str, Transport]) -> int:
    """The nodes marked lost so far: no answer to their heartbeats for LINK_DEAD_AFTER_S."""
    return sum(transport.loss is not None for transport in transports.values())


def rss_mib() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def measure(n: int, window_s: float, workdir: Path) -> dict:
    raise_open_files(2 * n)  # the harness's connections, and the OpenSSH clients' pipes
    with fleet(n, workdir) as (_, nodes):
        crowded = neighbour_table_warning(nodes)
        if crowded:
            raise RuntimeError(crowded)
        transports = {node.name: make_transport(node) for node in nodes}
        try:
            cold_s, cold_failed = fan_out_true(transports)
            if cold_failed:
                raise RuntimeError(f"{cold_failed} of {n} nodes did not connect")
            log(f"N={n}: {n} connections in {cold_s:.1f} s; idling {window_s:g} s three ways")
            harness = harness_cpu_percent(window_s)
            lost = lost_nodes(transports)
            set_paramiko_poll(PARAMIKO_POLL_S)
            polling = harness_cpu_percent(window_s)
            lost_polling = lost_nodes(transports) - lost
            set_paramiko_poll(IDLE_POLL_S)
            openssh = openssh_cpu_percent(nodes, window_s)
            warm_s, _ = fan_out_true(transports)
            rss = rss_mib()
        finally:
            started = time.perf_counter()
            close_everywhere(transports.values())
            close_s = time.perf_counter() - started
    return {"nodes": n, "cold_s": cold_s, "harness_cpu_pct": harness, "poll_cpu_pct": polling,
            "openssh_cpu_pct": openssh, "lost": lost, "lost_polling": lost_polling, "warm_s": warm_s,
            "close_s": close_s, "rss_mib": rss}


def table(rows: list[dict]) -> str:
    header = ("N", "harness % CPU", "lost", "0.1 s poll % CPU", "lost, 0.1 s poll", "OpenSSH % CPU", "cold s",
              "warm s", "close s", "harness RSS MiB")
    lines = [header] + [(str(row["nodes"]), f"{row['harness_cpu_pct']:.1f}", str(row["lost"]),
                         f"{row['poll_cpu_pct']:.1f}", str(row["lost_polling"]),
                         f"{row['openssh_cpu_pct']:.1f}", f"{row['cold_s']:.1f}",
                         f"{row['warm_s']:.2f}", f"{row['close_s']:.2f}", f"{row['rss_mib']:.0f}")
                        for row in rows]
    return markdown_table(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_up_to(FLEET_MAX), default=[64, 253],
                        help=f"numbers of nodes, comma-separated, up to {FLEET_MAX} (default 64,253)")
    parser.add_argument("--window", type=positive_int, default=20,
                        help="seconds of idling per measurement (default 20)")
    args = parser.parse_args(argv)
    when = datetime.now(timezone.utc)
    rows = measure_sizes("idle", args.sizes, lambda n, workdir: measure(n, args.window, workdir))
    if rows is None:
        return 2
    print(f"{args.window} s of idle SSH connections to namespace sshd nodes; {machine()['cpus']} CPUs, "
          f"{when:%Y-%m-%d %H:%M} UTC; CPU in % of one core")
    print(table(rows))
    return 0


if __name__ == "__main__":
    run_bench(main, "idle")
