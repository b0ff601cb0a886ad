"""Benchmark: what judging a day-long soak of eight-GPU nodes holds in memory, per node.

A node of a 24-hour soak sends a sample every 5 s (17,280 a day); with eight GPUs each is about
1.7 kB of JSON, some 30 MB a day per node, and the harness judges every node of the fleet at
once (peers, the fleet's median trend). This writes such a day (the derived H200 sample of
tests/data/soak/ for eight GPUs, every 5 s) to a file and reads it two ways, each in a process of
its own (wall, what stays held after reading by tracemalloc, peak RSS):

  reduced   runners.soak.SoakReader fed the file's lines: peaks, trend buckets, every sample's time
  parsed    every line parsed and kept (json.loads into a list), what the harness did before

and gives both at 1,024 nodes (one core), with what the file costs `handover report` and
`handover verify`, which hash every file of the run directory for its manifest
(reports.bundle.sha256_of, one file after another). The harness feeds each node's reader the chunks it
collects as the soak goes, so the reduced reading is spread over the soak and done whole only by
a harness that re-attaches. Run from the repository root:
`.venv/bin/python bench/soak_log.py [--samples 17280]`.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from fanout import log, machine, positive_int  # noqa: E402

SAMPLE = ROOT / "tests" / "data" / "soak" / "derived_h200_burn_nvml_as_soak_samples.jsonl"
FLEET = 1024


def write_day(path: Path, samples: int) -> None:
    lines = SAMPLE.read_text().splitlines()
    start, sample = json.loads(lines[0]), json.loads(lines[2])
    start["end"] = start["t"] + 5 * samples
    with path.open("w") as out:
        out.write(json.dumps(start) + "\n")
        for index in range(samples):
            gpus = [dict(sample["gpus"][0], gpu=gpu) for gpu in range(8)]
            out.write(json.dumps(dict(sample, t=start["t"] + 5 * index, gpus=gpus), separators=(",", ":")) + "\n")


def read(way: str, path: Path) -> object:
    if way == "reduced":
        from runners.soak import SoakReader

        with path.open() as lines:
            return SoakReader().feed(lines).log()
    with path.open() as lines:
        return [json.loads(line) for line in lines]


def measure(way: str, path: Path) -> dict:
    """Read the file one way in this process: its wall time, then (read again under tracemalloc,
    which slows it) what stays held once it is read."""
    began = time.perf_counter()
    read(way, path)
    wall = time.perf_counter() - began
    tracemalloc.start()
    kept = read(way, path)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert kept is not None
    return {"wall_s": round(wall, 2), "held_mib": round(held / 2**20, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=positive_int, default=17280, help="samples of the day (default 17,280)")
    parser.add_argument("--way", choices=("reduced", "parsed"), help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        print(json.dumps(measure(args.way, args.file)))
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "node.jsonl"
        write_day(path, args.samples)
        size = path.stat().st_size
        log(f"a day of {args.samples} samples of 8 GPUs: {size / 1e6:.1f} MB; {machine()}")
        for way in ("reduced", "parsed"):
            ran = subprocess.run([sys.executable, __file__, "--way", way, "--file", str(path)],
                                 capture_output=True, text=True, check=True)
            figures = json.loads(ran.stdout)
            print(f"  {way:<8} wall {figures['wall_s']:>5} s  held {figures['held_mib']:>7} MiB  "
                  f"peak RSS {figures['peak_rss_mib']:>7} MiB;  at {FLEET} nodes: held "
                  f"{figures['held_mib'] * FLEET / 1024:.1f} GiB, read in {figures['wall_s'] * FLEET / 60:.0f} min")
        hashed = seal_time(path)
        print(f"  sealed   wall {hashed:>5.2f} s ({size / hashed / 1e9:.2f} GB/s, the file in the page cache);  "
              f"at {FLEET} nodes: {size * FLEET / 1e9:.1f} GB hashed in {hashed * FLEET:.0f} s")
    return 0


def seal_time(path: Path) -> float:
    """The best of three SHA-256 passes over the file, as the manifest makes them."""
    from reports.bundle import sha256_of

    times = []
    for _ in range(3):
        began = time.perf_counter()
        sha256_of(path)
        times.append(time.perf_counter() - began)
    return min(times)


if __name__ == "__main__":
    sys.exit(main())
