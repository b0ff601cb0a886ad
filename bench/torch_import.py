"""Benchmark: what importing torch costs a process, the usual way against the payloads' way.

Every torchrun launch starts two Python processes per node and rank that import torch (the agent
and the rank), and an isolation or a scale sweep launches dozens. runners/payloads/torch_import.py
pauses the cyclic garbage collector while torch loads and then freezes what is there. For
--repeat rounds, one after the other in each round so that both see the same machine:

  usual       python3 -c "import torch", the interpreter then exiting as usual (a user's job)
  payloads'   the same interpreter running torch_import's import_torch(), then exiting as usual

Each figure is the median over the rounds of the child's CPU (user + system, from wait4) and its
wall time from start to exit. Run from the repository root: `.venv/bin/python bench/torch_import.py`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runners import payloads  # noqa: E402

WAYS = {"usual": "import torch\n",
        "payloads'": payloads.load("torch_import") + "import_torch()\n"}


def run_once(python: str, script: str) -> tuple[float, float]:
    """(CPU s, wall s) of one `python -c script`, which must exit 0."""
    started = time.perf_counter()
    child = subprocess.Popen([python, "-c", script])
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"torch_import: {python} could not import torch (exit {os.waitstatus_to_exitcode(status)})")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(prog="torch_import", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="rounds (default 10)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch (default: this one)")
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(args.repeat):
        for way, script in WAYS.items():
            figures[way].append(run_once(args.python, script))
    print(f"{args.python}, {args.repeat} rounds, medians\n")
    print("| import | CPU s | wall s |\n|---|---:|---:|")
    for way, runs in figures.items():
        print(f"| {way} | {statistics.median(c for c, _ in runs):.2f} | {statistics.median(w for _, w in runs):.2f} |")
    usual, ours = (statistics.median(c for c, _ in figures[way]) for way in WAYS)
    print(f"\nthe payloads' way spends {100 * (1 - ours / usual):.0f} % less CPU")


if __name__ == "__main__":
    main()
