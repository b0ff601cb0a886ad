"""pytest glue: the --inventory option, node parametrization and the fixtures checks use.

    pytest --inventory inventory/<cluster>.yaml [--out DIR] [--nodes PATTERN] [--sign-key KEY]

Tests parametrized by `node` get one test per selected node, with the node name as the id
(test_kernel[gpu017]), so `-k gpu017` and JUnit line up with the inventory.
"""
from __future__ import annotations

import fnmatch
import signal
from pathlib import Path
from typing import Optional

import hostlist
import pytest

from inventory.loader import InventoryError, load_inventory
from inventory.model import Cluster, Node, Profile
from reports import signing
from reports.ledger import Ledger, LedgerError, read_ledger
from reports.recorder import (PROPERTY_METRICS, PROPERTY_NOTE, PROPERTY_PAIR_STATE, PROPERTY_RAW,
                              PROPERTY_SERIES, Recorder, run_header)
from suites.checks import Metrics, series_entry

DEFAULT_OUT = "out"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("handover", "handover acceptance runs")
    group.addoption("--inventory", metavar="FILE",
                    help="cluster inventory YAML (e.g. inventory/local.yaml); required for the suites")
    group.addoption("--out", metavar="DIR", default=DEFAULT_OUT,
                    help="base directory for run directories (default: out/)")
    group.addoption("--nodes", metavar="PATTERN",
                    help="only these nodes: comma-separated hostlist expressions or globs "
                         "(gpu[001-004],gpu01*)")
    group.addoption("--resume", metavar="RUN_DIR",
                    help="continue an interrupted run: run only the checks it has no result for, "
                         "appending to its ledger (e.g. out/<cluster>/latest)")
    group.addoption("--sign-key", metavar="KEY",
                    help="Ed25519 OpenSSH private key that signs the report "
                         "(default: a per-machine key, created on first use)")


def pytest_configure(config: pytest.Config) -> None:
    inventory = config.getoption("--inventory")
    if not inventory:
        return
    try:
        cluster = load_inventory(inventory)
    except InventoryError as error:
        raise pytest.UsageError(str(error)) from None
    nodes = select_nodes(cluster, config.getoption("--nodes"))
    key = signing_key(config)
    resume = config.getoption("--resume")
    if resume:
        ledger, resumed = resumed_ledger(Path(resume), cluster)
    else:
        ledger, resumed = Ledger.create(Path(config.getoption("--out")), cluster.name,
                                        run_header(cluster, nodes)), None
    config.pluginmanager.register(Recorder(config, cluster, nodes, ledger, key, resumed),
                                  Recorder.name)
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)


def interrupt_on_sigterm(signum, frame):
    """A CI job cancelled or a `timeout` that fired sends SIGTERM: treat it as Ctrl-C, so the
    work on the nodes is killed and the run is written as interrupted, not silently dropped."""
    raise KeyboardInterrupt(f"signal {signum}")


def resumed_ledger(run_dir: Path, cluster: Cluster):
    """The ledger of an earlier run of the same inventory, and what it holds."""
    try:
        record = read_ledger(run_dir)
    except LedgerError as error:
        raise pytest.UsageError(f"--resume: {error}") from None
    if record.header.get("inventory", {}).get("sha256") != cluster.digest:
        raise pytest.UsageError(
            f"--resume: {run_dir} was run with a different inventory "
            f"({record.header.get('inventory', {}).get('path')}); resume with the same file")
    return Ledger(run_dir.resolve()), record


def signing_key(config: pytest.Config):
    path = config.getoption("--sign-key")
    try:
        if path:
            return signing.load_signing_key(Path(path).expanduser())
        key, created = signing.ensure_default_key()
    except signing.SigningError as error:
        raise pytest.UsageError(f"--sign-key: {error}") from None
    if created:
        print(f"handover: created signing key {key.path} ({key.fingerprint}); "
              "give customers its public key to verify reports")
    return key


def select_nodes(cluster: Cluster, pattern: str | None) -> list[Node]:
    """The inventory's nodes that --nodes names, in inventory order; an empty match is an error."""
    if not pattern:
        return list(cluster.nodes)
    wanted: list[str] = []
    try:
        for item in hostlist.expand_hostlist(pattern):
            wanted.append(item)
    except hostlist.BadHostlist as error:
        raise pytest.UsageError(f"--nodes {pattern!r}: {error}") from None
    chosen = [n for n in cluster.nodes if any(fnmatch.fnmatchcase(n.name, w) for w in wanted)]
    unmatched = [w for w in wanted if not any(fnmatch.fnmatchcase(n.name, w) for n in cluster.nodes)]
    if unmatched:
        known = hostlist.collect_hostlist([n.name for n in cluster.nodes])
        raise pytest.UsageError(f"--nodes: {', '.join(unmatched)} match no node of "
                                f"{cluster.source_path} (it has {known})")
    return chosen


def _recorder(config: pytest.Config):
    recorder = config.pluginmanager.get_plugin("handover-recorder")
    if recorder is None:
        raise pytest.UsageError("the acceptance suites need --inventory FILE "
                                "(e.g. pytest --inventory inventory/local.yaml)")
    return recorder


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node" in metafunc.fixturenames:
        names = [node.name for node in _recorder(metafunc.config).cluster_run.nodes]
        metafunc.parametrize("node", names, ids=names)


@pytest.fixture(scope="session")
def recorder(pytestconfig):
    return _recorder(pytestconfig)


@pytest.fixture(scope="session")
def cluster(recorder) -> Cluster:
    return recorder.cluster


@pytest.fixture(scope="session")
def profile(cluster) -> Profile:
    return cluster.profile


@pytest.fixture(scope="session")
def cluster_run(recorder):
    return recorder.cluster_run


@pytest.fixture
def record(request):
    """Evidence a check leaves in the results: a note, raw output paths, metrics."""
    class Evidence:
        def note(self, text: str) -> None:
            request.node.user_properties.append((PROPERTY_NOTE, text))

        def raw(self, paths: list[str]) -> None:
            request.node.user_properties.append((PROPERTY_RAW, paths))

        def metrics(self, rows: list[dict]) -> None:
            request.node.user_properties.append((PROPERTY_METRICS, rows))

        def series(self, name: str, *, x: tuple[str, str], y: tuple[str, str],
                   lines: dict[str, list[tuple[float, float]]], x_scale: str = "linear") -> None:
            """A curve for the report: `x`/`y` are (label, unit); `lines` maps a legend to points."""
            request.node.user_properties.append((PROPERTY_SERIES, series_entry(
                name, x=x, y=y, lines=lines, x_scale=x_scale)))

        def pair_state(self, state: str, median: Optional[float]) -> None:
            """A pair test's state for the heatmaps (ok, low, failed), judged once against the campaign's median."""
            request.node.user_properties.append((PROPERTY_PAIR_STATE, {"state": state, "median": median}))

    return Evidence()


@pytest.fixture
def on_node(cluster_run, node, record):
    """on_node(step, run) -> this node's Result of a step run once on all selected nodes."""

    def result_of(step, run):
        result = cluster_run.gather(step, run)[node]
        record.raw(cluster_run.raw_paths(step, node))
        return result

    return result_of


@pytest.fixture
def metrics(request, profile, record):
    """metrics.judge(name=(value, unit), ...) against the profile's references for this check."""
    return Metrics(request.node.originalname.removeprefix("test_"), profile, record.metrics)
