"""Helpers the transport, fan-out and end-to-end tests share."""
from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

from inventory.loader import load_inventory
from inventory.model import Cluster
from runners.cluster import ClusterRun


def ns_inventory(ns_cluster, path: Path, **kwargs) -> Cluster:
    return load_inventory(ns_cluster.write_inventory(path, **kwargs))


def cluster_run_of(cluster: Cluster, names: Optional[Sequence[str]] = None) -> ClusterRun:
    """A run of the cluster's nodes (the named ones, where given) that keeps no raw output."""
    nodes = list(cluster.nodes) if names is None else [cluster.node(name) for name in names]
    return ClusterRun(cluster, nodes, save_raw=lambda step, result: [])


def unique_sleep() -> str:
    """A command line no other test (or earlier run) shares, to look for leftovers by."""
    return f"sleep {random.randint(300, 899)}.{random.randint(1, 10**6)}"


def leftovers(marker: str, on=None) -> list[str]:
    """Processes whose command line contains marker (the nodes share this PID namespace).

    With on (a NamespaceCluster), only those on its nodes: tests run two at a time, so another
    test's mpirun or lock holder may be running here too.
    """
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    lines = [line for line in found.splitlines() if "pgrep" not in line]
    if on is None:
        return lines
    ours = on.processes()
    return [line for line in lines if int(line.split(maxsplit=1)[0]) in ours]


def wait_for_no_leftovers(marker: str, within_s: float = 10, on=None) -> list[str]:
    deadline = time.monotonic() + within_s
    while (found := leftovers(marker, on)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def wait_until(condition, within_s: float) -> bool:
    """Whether condition() came true within `within_s` (for what the far side does a moment later)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def local_inventory_without_scratch(tmp_path: Path) -> Path:
    """inventory/local.yaml as shipped, less its scratch path: checks that need one skip."""
    shipped = Path(__file__).resolve().parent.parent / "inventory" / "local.yaml"
    copy = tmp_path / "local.yaml"
    copy.write_text(shipped.read_text().split("\nscratch:")[0] + "\n")
    return copy
