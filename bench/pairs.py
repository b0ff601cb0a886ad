"""Benchmark: all pairs of N real nodes in rounds against the same pairs one after another.

For each N this starts N sshd nodes in network namespaces (tests/netns.py) and runs iperf3 for
every pair (runners.iperf3.run_pair, --seconds each) twice: scheduled in the circle method's
rounds (the pairs of a round at once) and serially. Every pair must measure in both runs. On one
VM the nodes share the CPUs, so concurrent pairs each get less bandwidth: the figure of interest
is the wall time, which on a real fabric is what the rounds save.
Run from the repository root as root: `.venv/bin/python bench/pairs.py --nodes 4 6 8`.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # the harness packages, and tests/netns.py by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from netns import NamespaceCluster, netns_available  # noqa: E402

from inventory.loader import load_inventory  # noqa: E402
from runners import iperf3, pairs  # noqa: E402
from runners.transport import make_transport  # noqa: E402


def measure(count: int, seconds: int, workdir: Path) -> dict:
    with NamespaceCluster(workdir / f"n{count}", count) as nodes:
        cluster = load_inventory(nodes.write_inventory(workdir / f"n{count}.yaml"))
        transports = {node.name: make_transport(node) for node in cluster.nodes}
        address = {node.name: node.address for node in cluster.nodes}
        names = list(transports)
        base = random.randint(46000, 46900)

        def run_pair(pair, port):
            return iperf3.run_pair(transports[pair[0]], transports[pair[1]], address[pair[0]], port, seconds)

        try:
            rounds = pairs.circle_rounds(names)
            started = time.monotonic()
            scheduled = pairs.run_rounds(rounds, base, run_pair)
            in_rounds = time.monotonic() - started
            started = time.monotonic()
            serial = pairs.run_rounds([[pair] for r in rounds for pair in r], base, run_pair)
            one_by_one = time.monotonic() - started
        finally:
            for transport in transports.values():
                transport.close()
    failures = [f"{pairs.pair_id(p)}: {iperf3.judge(run)[1]}" for outcome in (scheduled, serial)
                for p, run in outcome.items() if iperf3.judge(run)[1]]
    if failures:
        raise SystemExit(f"{count} nodes: pairs failed: {'; '.join(failures)}")
    mean = lambda runs: sum(iperf3.judge(r)[0].gbps for r in runs.values()) / len(runs)  # noqa: E731
    return {"nodes": count, "pairs": len(scheduled), "rounds": len(rounds), "seconds_per_pair": seconds,
            "rounds_wall_s": round(in_rounds, 2), "serial_wall_s": round(one_by_one, 2),
            "speedup": round(one_by_one / in_rounds, 2),
            "mean_gbps_rounds": round(mean(scheduled), 2), "mean_gbps_serial": round(mean(serial), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--seconds", type=int, default=1, help="iperf3 --time per pair")
    args = parser.parse_args()
    available, reason = netns_available()
    if not available:
        print(f"bench/pairs.py: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="handover-bench-pairs-") as workdir:
        for count in args.nodes:
            print(json.dumps(measure(count, args.seconds, Path(workdir))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
