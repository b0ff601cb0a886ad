"""Benchmark: `handover report` on a 1,024-node run, and the page it renders in headless Chromium.

The run is built from a real one: bench/data/nscluster-4-quick.ledger.jsonl, the ledger of
`pytest --inventory ... -m quick` on four namespace sshd nodes of this machine (2026-12-01). Each of
the N nodes (default 1,024, named gpu0001...) takes the per-node entries of one of the four in
turn, every other node name in them (pair peers, raw paths) moved by the same offset, so pairs
stay ring neighbours; every figure is scaled by a random factor around 1 (sd 2 %). A few nodes are
made to differ as a real fleet does: 1 in 200 unreachable (every check failed as such), 1 in 100
with a failed check, 1 in 50 with figures 20 % low; 32 nodes to a rack. The cluster-wide entries
are kept once.

It then times `handover report RUN_DIR` in its own process (wall, CPU, peak RSS), gives the sizes of
report.html and results.json, and the time headless Chromium takes to load report.html and print
its DOM (`--dump-dom`), less the same for an empty page (the browser's own start), and the
machine's load average at the end (on 2 shared cores the wall times stretch with it; the CPU
time of `handover report` much less). Issue 12's goals
on this machine: report at most 5 s, report.html at most 10 MB, results.json at most 15 MB, the page
loaded in at most 3 s. Run from the repository root: `.venv/bin/python bench/report.py`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "bench" / "data" / "nscluster-4-quick.ledger.jsonl"
GOALS = {"report_s": 5.0, "report_html_mb": 10.0, "results_json_mb": 15.0, "load_s": 3.0}
UNREACHABLE_EVERY, FAILED_EVERY, SLOW_EVERY = 200, 100, 50
RACK_NODES = 32  # nodes per rack, as the inventory's `rack:` would place them
JITTER = 0.02
_NODE = re.compile(r"\bnode(\d+)\b")

sys.path.insert(0, str(ROOT / "bench"))
from fanout import log, machine, positive_int  # noqa: E402


def node_name(index: int) -> str:
    return f"gpu{index + 1:04d}"


def synthetic_ledger(template: list[dict], count: int, seed: int = 1,
                     unreachable_every: int = UNREACHABLE_EVERY) -> list[dict]:
    """The template's entries for `count` nodes, as the module docstring says."""
    rng = random.Random(seed)
    header, per_node, cluster, ends = template[0], {}, [], []
    for entry in template[1:]:
        node = entry.get("node")
        if node:
            per_node.setdefault(node, []).append(entry)
        elif entry["type"] == "check":
            cluster.append(entry)
        else:
            ends.append(entry)
    sources = sorted(per_node, key=lambda name: int(_NODE.match(name).group(1)))  # type: ignore[union-attr]
    entries = []
    for index in range(count):
        source = sources[index % len(sources)]
        rename = renamer(index - sources.index(source), count)
        scale = 0.8 if index % SLOW_EVERY == SLOW_EVERY - 1 else 1.0
        for position, entry in enumerate(per_node[source]):
            copied = json.loads(_NODE.sub(rename, json.dumps(entry)))
            if copied["type"] == "check":
                vary(copied, rng, scale)
                if index % unreachable_every == unreachable_every // 2:
                    copied.update(outcome="failed", kind="unreachable", metrics=[],
                                  message=f"{copied['node']} unreachable: no answer within the connect timeout (10 s)")
                    if "pairs" in copied:  # a pair check measured none; other checks gain no pairs key
                        copied["pairs"] = []
                    copied.pop("series", None)  # nor did a curve's check draw its curve
                elif index % FAILED_EVERY == FAILED_EVERY // 3 and position == 3:
                    copied.update(outcome="failed", kind="expectation",
                                  message=f"{copied['node']}: not what the profile expects")
            entries.append(copied)
    names = [node_name(index) for index in range(count)]
    header = dict(header, nodes=names, node_places={name: {"rack": f"r{index // RACK_NODES + 1:02d}", "leaf": None}
                                                    for index, name in enumerate(names)})
    for entry in ends:
        if entry["type"] == "selection":
            entry = dict(entry, nodes=names, tests=[e["test_id"] for e in entries if e["type"] == "check"]
                         + [e["test_id"] for e in cluster])
        entries.append(entry) if entry["type"] != "end" else None
    return [header] + entries + cluster + [e for e in ends if e["type"] == "end"]


def renamer(offset: int, count: int):
    """nodeK -> the synthetic node `offset` places further on, around the ring of `count`."""
    def rename(match: re.Match) -> str:
        return node_name((int(match.group(1)) - 1 + offset) % count)
    return rename


def vary(entry: dict, rng: random.Random, scale: float) -> None:
    """Figures moved around the real ones; each metric's ok recomputed from its band."""
    for metric in entry.get("metrics", []):
        value = metric.get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            metric["value"] = round(value * scale * rng.gauss(1, JITTER), 4)
            low, high = (metric.get("band") or (None, None))
            if metric.get("ok") is not None:
                metric["ok"] = (low is None or metric["value"] >= low) and (high is None or metric["value"] <= high)
    for pair in entry.get("pairs", []):
        if isinstance(pair.get("figure"), (int, float)):
            pair["figure"] = pair["figure"] * scale * rng.gauss(1, JITTER)


def write_run(run_dir: Path, entries: list[dict]) -> None:
    (run_dir / "raw").mkdir(parents=True)
    with (run_dir / "ledger.jsonl").open("w") as out:
        for entry in entries:
            out.write(json.dumps(entry) + "\n")


def timed(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KiB) of one command; its output is thrown away, its errors kept."""
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            errors.seek(0)
            raise RuntimeError(f"{argv[:3]} failed: {errors.read().decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def chromium_load_s(page: Path, blank: Path, repeat: int) -> Optional[float]:
    """Median wall of `chromium --headless --dump-dom page`, less the same for an empty page."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None

    def load(path: Path) -> float:
        return timed([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions",
                      "--no-first-run", "--dump-dom", path.as_uri()])[0]

    return statistics.median(load(page) - load(blank) for _ in range(repeat))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=positive_int, default=1024, help="nodes in the synthetic run (default 1024)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per figure; the median (default 3)")
    parser.add_argument("--unreachable-every", type=positive_int, default=UNREACHABLE_EVERY, metavar="K",
                        help=f"1 node in K unreachable (default {UNREACHABLE_EVERY}; 1: none can be reached)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="leave the rendered run in DIR")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    template = [json.loads(line) for line in TEMPLATE.read_text().splitlines()]
    entries = synthetic_ledger(template, args.nodes, unreachable_every=args.unreachable_every)
    checks = sum(entry["type"] == "check" for entry in entries)
    when = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="handover-bench-report-") as tmp:
        run_dir = (args.keep or Path(tmp)) / "run"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        write_run(run_dir, entries)
        key = Path(tmp) / "key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench@example.com", "-f", str(key)],
                       check=True)
        log(f"{args.nodes} nodes, {checks} check entries; rendering {args.repeat} time(s)")
        runs = [timed([sys.executable, "-m", "handover.cli", "report", str(run_dir), "--sign-key", str(key)])
                for _ in range(args.repeat)]
        blank = Path(tmp) / "blank.html"
        blank.write_text("<!doctype html><title>blank</title>")
        figures = {
            "nodes": args.nodes, "checks": checks, "unreachable_every": args.unreachable_every,
            "report_s": statistics.median(run[0] for run in runs),
            "report_cpu_s": statistics.median(run[1] for run in runs),
            "report_peak_mib": statistics.median(run[2] for run in runs) / 1024,
            "report_html_mb": (run_dir / "report.html").stat().st_size / 1e6,
            "results_json_mb": (run_dir / "results.json").stat().st_size / 1e6,
            "load_s": chromium_load_s(run_dir / "report.html", blank, args.repeat),
            "load_average": os.getloadavg()[0],  # others' work on the machine: wall times stretch with it
        }
    print(f"`handover report` on {args.nodes} nodes ({checks} check entries, 1 node in "
          f"{args.unreachable_every} unreachable), median of {args.repeat}; "
          f"{machine()['cpus']} CPUs, {when:%Y-%m-%d %H:%M} UTC")
    for name, goal in [("report_s", GOALS["report_s"]), ("report_cpu_s", None), ("report_peak_mib", None),
                       ("report_html_mb", GOALS["report_html_mb"]), ("results_json_mb", GOALS["results_json_mb"]),
                       ("load_s", GOALS["load_s"]), ("load_average", None)]:
        value = figures[name]
        shown = "n/a (no chromium)" if value is None else f"{value:.2f}"
        verdict = "" if goal is None or value is None else (" ok" if value <= goal else f" over the goal of {goal:g}")
        print(f"  {name:16s} {shown}{verdict}")
    if args.json:
        args.json.write_text(json.dumps({"date": when.isoformat(timespec="seconds"), "machine": machine(),
                                         "figures": figures, "goals": GOALS}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
