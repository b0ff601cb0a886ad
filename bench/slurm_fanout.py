"""Benchmark: a per-node check on N namespace nodes through one srun against the SSH fan-out.

For each cluster size N (default 8, 16, 32) this starts N sshd nodes in network namespaces with
munged, slurmctld and a slurmd on each (tests/netns.py), and times fan-outs of
runners.system.probe (the system-facts payload, shipped through stdin) on all N nodes:

  ssh cold    N SSH sessions from this machine on fresh transports (connect, handshake, auth, probe)
  ssh warm    the same again on the open connections
  srun        the slurm transport: the N commands as one srun (a job of its own each time, with
              --immediate), one task per node under the dispatcher; there is no connection to keep
  srun step   the same inside an allocation (`salloc --no-shell`, SLURM_JOB_ID set, as when the
              harness runs in an operator's job): each fan-out is a step of it (--overlap)

Each figure is the median of --repeat runs; in every run every node must answer with its own
hostname. Run from the repository root as root: `.venv/bin/python bench/slurm_fanout.py`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # the harness packages, and tests/netns.py by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from netns import NamespaceCluster, SlurmCluster, netns_available, slurm_available  # noqa: E402

from inventory.loader import load_inventory  # noqa: E402
from runners import system  # noqa: E402
from runners.fanout import fan_out  # noqa: E402
from runners.slurm import SlurmSteps, SlurmTransport  # noqa: E402
from runners.transport import Transport, make_transport  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(transports: Mapping[str, Transport]) -> float:
    """Seconds for one fan-out of the probe; every node must answer with its own facts."""
    started = time.monotonic()
    results = fan_out(transports, system.probe, name="probe")
    elapsed = time.monotonic() - started
    bad = {node: result.explain() for node, result in results.items() if not result.ok}
    if bad:
        raise RuntimeError(f"{len(bad)} node(s) did not answer: {next(iter(bad.values()))}")
    for node, result in results.items():
        if system.parse_system_facts(result.stdout).hostname != node:
            raise RuntimeError(f"{node} answered with another node's facts")
    return elapsed


def median_of(repeat: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeat))


def bench_size(count: int, repeat: int, workdir: Path) -> dict:
    with NamespaceCluster(workdir / f"n{count}", count) as nodes, SlurmCluster(nodes) as slurm:
        os.environ["SLURM_CONF"] = str(slurm.conf)
        ssh_cluster = load_inventory(nodes.write_inventory(workdir / f"n{count}" / "ssh.yaml"))
        slurm_cluster = load_inventory(nodes.write_inventory(workdir / f"n{count}" / "slurm.yaml",
                                                             extra={"transport": "slurm"}))

        def ssh_cold() -> float:
            transports = {n.name: make_transport(n) for n in ssh_cluster.nodes}
            try:
                return timed(transports)
            finally:
                for transport in transports.values():
                    transport.close()

        warm = {n.name: make_transport(n) for n in ssh_cluster.nodes}
        try:
            timed(warm)
            figures = {"nodes": count, "ssh_cold_s": median_of(repeat, ssh_cold),
                       "ssh_warm_s": median_of(repeat, lambda: timed(warm))}
        finally:
            for transport in warm.values():
                transport.close()
        steps = SlurmSteps(slurm_cluster.launch)
        through_slurm: dict[str, Transport] = {n.name: SlurmTransport(n, steps) for n in slurm_cluster.nodes}
        figures["srun_s"] = median_of(repeat, lambda: timed(through_slurm))
        granted = subprocess.run(["salloc", "--no-shell", "--immediate=30", f"--nodes={count}",
                                  "--job-name=handover-bench"], capture_output=True, text=True, timeout=60)
        job = re.search(r"Granted job allocation (\d+)", granted.stderr)
        if not job:
            raise RuntimeError(f"salloc: {granted.stderr.strip()}")
        os.environ["SLURM_JOB_ID"] = job.group(1)
        try:
            figures["srun_step_s"] = median_of(repeat, lambda: timed(through_slurm))
        finally:
            del os.environ["SLURM_JOB_ID"]
            subprocess.run(["scancel", job.group(1)], timeout=60)
            del os.environ["SLURM_CONF"]
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32", help="comma-separated node counts (default 8,16,32)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    for available, why in (netns_available(), slurm_available()):
        if not available:
            log(f"slurm_fanout: cannot run here: {why}")
            return 2
    sizes = [int(part) for part in args.sizes.split(",") if part.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as workdir:
        for count in sizes:
            log(f"slurm_fanout: {count} nodes ...")
            rows.append(bench_size(count, args.repeat, Path(workdir)))
    print(f"{'nodes':>5}  {'ssh cold s':>10}  {'ssh warm s':>10}  {'srun s':>7}  {'srun step s':>11}")
    for row in rows:
        print(f"{row['nodes']:>5}  {row['ssh_cold_s']:>10.2f}  {row['ssh_warm_s']:>10.2f}  "
              f"{row['srun_s']:>7.2f}  {row['srun_step_s']:>11.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "slurm_fanout", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpus": os.cpu_count(), "repeat": args.repeat, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
