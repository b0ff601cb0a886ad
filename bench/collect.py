"""Benchmark: collecting every suite for clusters of 64 to 1,024 nodes, in time and memory.

Before a check runs, pytest collects one item per check and node (and rail); a harness whose
items grow with node pairs cannot start on a big cluster. For each size this writes an
inventory of that many H100 nodes (nothing is contacted: collection only reads the inventory)
and times `pytest --inventory X --collect-only -q` in its own process: wall-clock seconds from
start to exit, peak memory (getrusage of that process), and the number of items, per node too,
so a growth faster than linear shows at a glance.

Run from the repository root: `.venv/bin/python bench/collect.py` (or `make bench`).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fanout import log, machine, positive_int, sizes_up_to  # noqa: E402
from system_suite import timed  # noqa: E402

COLLECTED = re.compile(r"(\d+) tests? collected")
PROFILE = "h100-sxm-8gpu"


def inventory(path: Path, nodes: int) -> Path:
    """An inventory of `nodes` H100 nodes, as an operator writes one (hostlist, scratch path)."""
    path.write_text(f"cluster: scale{nodes}\nprofile: {PROFILE}\ntransport: ssh\n"
                    "ssh: {user: root, host_keys: accept-new}\n"
                    f"nodes:\n  - gpu[0001-{nodes:04d}]\n"
                    "scratch:\n  - {path: /scratch/handover, kind: local}\n")
    return path


def collect(path: Path, workdir: Path) -> tuple[float, float, int]:
    """(wall s, peak MiB, items) of one collection of every suite."""
    out = workdir / "collected.txt"
    with out.open("wb") as listing:
        wall, _, rss, status = timed([sys.executable, "-m", "pytest", "--inventory", str(path),
                                      "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=ROOT, stdout=listing)
    if status != 0:
        raise RuntimeError(f"collection exited {status} for {path}")
    found = COLLECTED.search(out.read_text())
    if found is None:
        raise RuntimeError(f"no item count in pytest's output for {path}")
    return wall, rss / 1024, int(found.group(1))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sizes = sizes_up_to(9999)  # nothing is started: only the inventory's length
    parser.add_argument("--sizes", type=sizes, default=sizes("64,128,256,512,1024"),
                        help="cluster sizes, comma-separated (default 64,128,256,512,1024)")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="runs per size; the median is reported (default 3)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    when = datetime.now(timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory(prefix="handover-collect-") as tmp:
        for nodes in sorted(set(args.sizes)):
            path = inventory(Path(tmp) / f"h100-{nodes}.yaml", nodes)
            runs = [collect(path, Path(tmp)) for _ in range(args.repeat)]
            rows.append({"nodes": nodes, "wall_s": statistics.median(r[0] for r in runs),
                         "peak_mib": statistics.median(r[1] for r in runs), "items": runs[0][2],
                         "runs": runs})
            log(f"N={nodes}: {rows[-1]['items']} items, {rows[-1]['wall_s']:.2f} s, {rows[-1]['peak_mib']:.0f} MiB")
    info = machine()
    print(f"`pytest --inventory X --collect-only` for {PROFILE} clusters, every suite and depth; "
          f"median of {args.repeat} runs; {info['cpus']} CPUs, {when:%Y-%m-%d %H:%M} UTC")
    print("| nodes | items | items per node | wall s | ms per node | peak MiB |")
    print("|------:|------:|---------------:|-------:|------------:|---------:|")
    for row in rows:
        print(f"| {row['nodes']} | {row['items']} | {row['items'] / row['nodes']:.1f} | {row['wall_s']:.2f} | "
              f"{1000 * row['wall_s'] / row['nodes']:.1f} | {row['peak_mib']:.0f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"date": when.isoformat(timespec="seconds"), "machine": info,
                                         "profile": PROFILE, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
