"""Benchmark: a fleet that cannot be reached fails at once, at a cost that grows with its nodes.

A rack that lost power, or a switch that is down, leaves hundreds of nodes unreachable: every one
of their checks fails as `unreachable`, and the run must say so quickly and readably. For each N
this writes an inventory of N nodes whose SSH port refuses (127.0.x.y port 1, each node an
address of its own, as a rack's nodes are), runs `pytest --inventory FILE -m system` as an
operator would, and measures:

  wall s, CPU s    the whole pytest process (its children's rusage), report included
  ms per check     CPU per failed check
  terminal lines   what the operator's terminal received
  verdict lines    the reasons below the verdict (a fleet's alike reasons share one)
  xargs -P ssh s   `xargs -P 64 ssh -p 1 ...` to the same addresses: what plain OpenSSH takes
                   to find them all refusing

Run from the repository root: `.venv/bin/python bench/unreachable.py --sizes 1,64,256,1024`.
"""
from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from fanout import log, machine, markdown_table, run_bench, sizes_up_to  # noqa: E402

MAX_NODES = 4096
REFUSED_PORT = 1  # nothing listens there: every connect is refused at once


def address(index: int) -> str:
    return f"127.0.{index // 250}.{index % 250 + 1}"


def write_inventory(n: int, folder: Path) -> Path:
    nodes = ", ".join(f"{{name: d{index:04d}, address: {address(index)}}}" for index in range(n))
    path = folder / f"unreachable-{n}.yaml"
    path.write_text(f"cluster: unreachable{n}\nprofile: cpu-only\nnodes: [{nodes}]\n"
                    f"ssh: {{port: {REFUSED_PORT}, host_keys: accept-new, known_hosts: {folder / 'known_hosts'}, "
                    f"connect_timeout: 2}}\n")
    return path


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_suite(n: int, folder: Path) -> dict:
    inventory = write_inventory(n, folder)
    cpu, started = children_cpu_s(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(inventory), "--out", str(folder / "out"),
                           "-m", "system", "-q", "-p", "no:cacheprovider"], cwd=folder, capture_output=True,
                          text=True, timeout=3600)
    wall, cpu = time.perf_counter() - started, children_cpu_s() - cpu
    lines = done.stdout.splitlines()
    counted = re.search(r"(\d+) failed", lines[-1] if lines else "")
    failed = int(counted.group(1)) if counted else 0
    if done.returncode != 1 or not failed:
        raise RuntimeError(f"N={n}: expected failed checks, got exit {done.returncode}: {done.stdout[-2000:]}")
    verdict = lines.index("verdict: NOT CERTIFIED")
    reasons = [line for line in lines[verdict + 1:] if line.startswith("  ")]
    return {"nodes": n, "wall_s": wall, "cpu_s": cpu, "failed": failed, "cpu_ms_per_check": 1000 * cpu / failed,
            "terminal_lines": len(lines), "verdict_lines": len(reasons), "xargs_s": xargs_ssh(n)}


def xargs_ssh(n: int) -> float:
    """Plain OpenSSH, 64 at a time, to the same refusing addresses."""
    started = time.perf_counter()
    subprocess.run(["xargs", "-P", "64", "-I", "{}", "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                    "-p", str(REFUSED_PORT), "{}", "true"], input="\n".join(map(address, range(n))),
                   capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - started


def table(rows: list[dict]) -> str:
    header = ("N", "failed checks", "wall s", "CPU s", "ms per check", "terminal lines", "verdict lines",
              "xargs -P ssh s")
    return markdown_table([header] + [(str(row["nodes"]), f"{row['failed']:,}", f"{row['wall_s']:.1f}",
                                       f"{row['cpu_s']:.1f}", f"{row['cpu_ms_per_check']:.2f}",
                                       f"{row['terminal_lines']:,}", str(row["verdict_lines"]),
                                       f"{row['xargs_s']:.1f}") for row in rows])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_up_to(MAX_NODES), default=[1, 64, 256, 1024],
                        help=f"numbers of unreachable nodes, comma-separated, up to {MAX_NODES} "
                             "(default 1,64,256,1024)")
    args = parser.parse_args(argv)
    when = datetime.now(timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory(prefix="handover-bench-") as tmp:
        for n in sorted(set(args.sizes)):
            log(f"N={n}: pytest -m system against {n} unreachable node(s)")
            folder = Path(tmp) / f"n{n}"
            folder.mkdir()
            rows.append(run_suite(n, folder))
    print(f"pytest --inventory <N unreachable nodes> -m system; {machine()['cpus']} CPUs, {when:%Y-%m-%d %H:%M} UTC")
    print(table(rows))
    return 0


if __name__ == "__main__":
    run_bench(main, "unreachable")
