"""Benchmark: the system suite on N real sshd nodes, against `xargs -P ssh` doing the same work.

For each cluster size N this starts N sshd nodes in network namespaces (tests/netns.py; past 253
nodes, several clusters under one inventory), then, in the same run and on the same nodes:

  harness   `pytest --inventory CLUSTER.yaml -m system`: the whole acceptance run (start-up,
            collection, the fan-outs, the ledger, the signed report), in its own process
  xargs     what an operator would type instead: `xargs -P N` running, per node, `ssh node
            python3 - < payload` for each payload the system suite ships (system_facts,
            gpu_config), with OpenSSH

and reports each one's wall-clock seconds, and the harness's own CPU seconds and peak memory
(getrusage of its process: all its threads; the sshd sessions and remote commands, which on a
real cluster run on the nodes, are not in it). A least-squares line through every size projects
the harness's CPU and memory to a 1,024-node system suite, and the CPU per extra node of each
step between sizes is printed beside it, so a cost that grows faster than the nodes shows.

Each figure is the median of --repeat runs; a harness run counts only if pytest passed, an
xargs run only if every ssh exited 0. Run as root from the repository root:
`.venv/bin/python bench/system_suite.py` (the nodes are namespaces on this machine's cores).
"""
from __future__ import annotations

import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Optional

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # the harness packages, and tests/netns.py by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fanout import (  # noqa: E402
    FLEET_MAX,
    cluster_arguments,
    fleet,
    log,
    machine,
    markdown_table,
    measure_sizes,
    run_bench,
)

from inventory.loader import load_inventory  # noqa: E402
from runners import payloads  # noqa: E402

PAYLOADS = ("system_facts", "gpu_config")  # what `-m system` ships to every node
PROJECT_TO = 1024


def timed(argv: list[str], *, stdin: Optional[int] = None, cwd: Optional[Path] = None,
          stdout: Optional[IO[bytes]] = None) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS in KiB, exit status) of one command, from its own rusage."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdin=stdin, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE,
                               cwd=cwd)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0 and process.stderr is not None:
        log(process.stderr.read().decode(errors="replace")[-2000:])
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, process.returncode


def harness_run(inventory: Path, out: Path) -> tuple[float, float, int]:
    wall, cpu, rss, status = timed([sys.executable, "-m", "pytest", "--inventory", str(inventory),
                                    "-m", "system", "--out", str(out), "-q", "-p", "no:cacheprovider"],
                                   cwd=ROOT)
    if status != 0:
        raise RuntimeError(f"the system suite exited {status} on {inventory}")
    return wall, cpu, rss


def xargs_script(inventory: Path, workdir: Path) -> tuple[Path, Path]:
    """The nodes, a line each (address, key, known_hosts: each cluster of a fleet has its own),
    and the per-node script xargs runs with them: one plain ssh per payload."""
    cluster = load_inventory(inventory)
    lines = ["#!/bin/sh", "set -e", "address=$1 key=$2 known_hosts=$3"]
    for name in PAYLOADS:
        payload = workdir / f"{name}.py"
        payload.write_text(payloads.load(name))
        lines.append('ssh -o BatchMode=yes -o UserKnownHostsFile="$known_hosts" -o StrictHostKeyChecking=yes '
                     f'-i "$key" -l root "$address" {shlex.quote(cluster.nodes[0].python)} - '
                     f'< {shlex.quote(str(payload))} > /dev/null')
    script = workdir / "per-node.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    hosts = workdir / "hosts"
    hosts.write_text("".join(f"{node.address} {node.ssh.identity_file} {node.ssh.known_hosts}\n"
                             for node in cluster.nodes))
    return hosts, script


def xargs_run(hosts: Path, script: Path, n: int) -> float:
    with hosts.open("rb") as listed:
        wall, _, _, status = timed(["xargs", "-P", str(n), "-n", "3", str(script)], stdin=listed.fileno())
    if status != 0:
        raise RuntimeError(f"xargs -P ssh exited {status}")
    return wall


def measure(n: int, *, repeat: int, workdir: Path) -> dict:
    with fleet(n, workdir) as (inventory, _):
        hosts, script = xargs_script(inventory, workdir / f"n{n}")
        harness, xargs = [], []
        for run in range(repeat):
            harness.append(harness_run(inventory, workdir / f"n{n}" / "out"))
            xargs.append(xargs_run(hosts, script, n))
            log(f"N={n}: run {run + 1}/{repeat}: harness {harness[-1][0]:.2f} s "
                f"(CPU {harness[-1][1]:.2f} s, {harness[-1][2] / 1024:.0f} MiB), xargs -P ssh {xargs[-1]:.2f} s")
    return {"nodes": n,
            "harness_s": statistics.median(run[0] for run in harness),
            "harness_cpu_s": statistics.median(run[1] for run in harness),
            "harness_peak_mib": statistics.median(run[2] for run in harness) / 1024,
            "xargs_s": statistics.median(xargs),
            "runs": {"harness": harness, "xargs_s": xargs}}


def projection(rows: list[dict]) -> dict:
    """The harness's CPU and memory per extra node, and at PROJECT_TO nodes.

    The slope is a least-squares line through every size, not the two ends alone, and each step
    between sizes keeps its own slope: a cost that grows faster than the nodes (a file every
    connection reads whole, a scan of every node per node) shows as slopes that rise from step
    to step, which a straight projection would hide.
    """
    xs = [row["nodes"] for row in rows]

    def slope(key: str) -> float:
        ys = [row[key] for row in rows]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0

    cpu_per_node, mib_per_node = slope("harness_cpu_s"), slope("harness_peak_mib")
    first = rows[0]
    steps = [{"from": a["nodes"], "to": b["nodes"],
              "cpu_ms_per_node": 1000 * (b["harness_cpu_s"] - a["harness_cpu_s"]) / (b["nodes"] - a["nodes"])}
             for a, b in itertools.pairwise(rows)]
    return {"cpu_ms_per_node": 1000 * cpu_per_node, "mib_per_node": mib_per_node, "steps": steps,
            "cpu_s_at": first["harness_cpu_s"] + cpu_per_node * (PROJECT_TO - first["nodes"]),
            "mib_at": first["harness_peak_mib"] + mib_per_node * (PROJECT_TO - first["nodes"])}


def table(rows: list[dict]) -> str:
    base = rows[0]
    header = ("N", "harness s", "xargs -P ssh s", "harness / xargs", f"harness vs N={base['nodes']}",
              "harness CPU s", "harness peak MiB")
    lines = [header] + [(
        str(row["nodes"]), f"{row['harness_s']:.2f}", f"{row['xargs_s']:.2f}",
        f"{row['harness_s'] / row['xargs_s']:.1f}x", f"{row['harness_s'] / base['harness_s']:.2f}x",
        f"{row['harness_cpu_s']:.2f}", f"{row['harness_peak_mib']:.0f}") for row in rows]
    return markdown_table(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = cluster_arguments(__doc__, "1,8,32,64", largest=FLEET_MAX)
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    when = datetime.now(timezone.utc)
    rows = measure_sizes("system suite", args.sizes,
                         lambda n, workdir: measure(n, repeat=args.repeat, workdir=workdir))
    if rows is None:
        return 2
    info, ahead = machine(), projection(rows)
    print(f"`pytest -m system` against `xargs -P ssh` on namespace sshd nodes; median of {args.repeat} runs; "
          f"{info['cpus']} CPUs, {when:%Y-%m-%d %H:%M} UTC")
    print(table(rows))
    print(f"Harness per extra node (least squares over every size): {ahead['cpu_ms_per_node']:.1f} ms CPU, "
          f"{ahead['mib_per_node']:.2f} MiB; projected to {PROJECT_TO} nodes: {ahead['cpu_s_at']:.1f} s CPU, "
          f"{ahead['mib_at']:.0f} MiB peak.")
    if ahead["steps"]:
        print("CPU per extra node, step by step (rising steps would mean a cost growing faster than the nodes): "
              + ", ".join(f"{step['from']}->{step['to']}: {step['cpu_ms_per_node']:.1f} ms" for step in ahead["steps"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"date": when.isoformat(timespec="seconds"), "machine": info,
                                         "repeat": args.repeat, "results": rows, "projection": ahead},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_bench(main, "system suite")
