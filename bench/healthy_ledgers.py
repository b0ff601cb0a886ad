"""Record ledgers of healthy namespace-node runs, for tests that judge real healthy figures.

The outlier rule (reports/results.py) must name no node of a healthy cluster. Running a
six-node cluster three times in CI to show it would cost minutes, so this records such runs
once: a NamespaceCluster (tests/netns.py) of --nodes nodes, the acceptance suites run by
pytest --runs times on the same cluster with the selection given after `--` (default: the
checks tests/test_outliers.py degrades, `-m quick -k "stress_ng or iperf3"`), and each run's
ledger.jsonl copied to bench/data/nscluster-<nodes>-healthy-<i>.ledger.jsonl. Run as root
from the repository root:

    .venv/bin/python bench/healthy_ledgers.py --nodes 6 --runs 3

The ledgers hold the machine's load of the hour they were made; bench/data/README.md says when
and how each one was recorded.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"
DEFAULT_SELECTION = ["-m", "quick", "-k", "stress_ng or iperf3"]

sys.path.insert(0, str(ROOT / "tests"))
from netns import NamespaceCluster, netns_available  # noqa: E402


def record(nodes: int, runs: int, selection: list[str]) -> list[Path]:
    """Run the selection on one healthy cluster until `runs` runs passed (at most 3 x runs
    tries: beside other work a healthy node's stress-ng vm stressor can finish no bogo op and
    fail its sanity check); the passing runs' ledgers written under DATA."""
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="handover-healthy-") as scratch:
        work = Path(scratch)
        with NamespaceCluster(work / "cluster", nodes) as cluster:
            inventory = cluster.write_inventory(work / "cluster.yaml")
            for attempt in range(1, 3 * runs + 1):
                if len(written) == runs:
                    break
                out = work / f"out{attempt}"
                done = subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(inventory),
                                       "--out", str(out), "-q", "-p", "no:cacheprovider", *selection],
                                      cwd=ROOT, capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
                    print(f"try {attempt}: exit {done.returncode}, not kept: {'; '.join(failed)}", flush=True)
                    continue
                target = DATA / f"nscluster-{nodes}-healthy-{len(written) + 1}.ledger.jsonl"
                shutil.copyfile((out / "nscluster" / "latest" / "ledger.jsonl").resolve(), target)
                print(f"try {attempt}: {target.relative_to(ROOT)}", flush=True)
                written.append(target)
    if len(written) < runs:
        raise SystemExit(f"only {len(written)} of {runs} runs passed")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("selection", nargs="*", help="pytest's selection, after --")
    args = parser.parse_args()
    available, reason = netns_available()
    if not available:
        raise SystemExit(f"namespace nodes are unavailable: {reason}")
    record(args.nodes, args.runs, args.selection or DEFAULT_SELECTION)


if __name__ == "__main__":
    main()
