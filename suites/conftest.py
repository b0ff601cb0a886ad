"""The fixtures checks use: the node under test, its step results, evidence and metrics.

Tests parametrized by `node` get one test per selected node, with the node name as the id
(test_kernel[gpu017]), so `-k gpu017` and JUnit line up with the inventory. The session behind
them is opened by the handover plugin (handover/plugin.py) from --inventory.
"""
from __future__ import annotations

import pytest

from handover.plugin import acceptance_session
from handover.recorder import PROPERTY_METRICS, PROPERTY_NOTE, PROPERTY_PAIRS, PROPERTY_RAW, PROPERTY_SERIES
from handover.session import AcceptanceSession
from inventory.model import Cluster, Profile
from runners.cluster import ClusterRun
from suites.checks import Metrics, series_entry


@pytest.hookimpl(trylast=True)  # after the plugin's, which opens the session
def pytest_configure(config: pytest.Config) -> None:
    """Collecting the suites without --inventory is a usage error, said once; asking pytest for
    its help, its markers or the suites' fixtures in the checkout is not."""
    if not (config.option.help or config.option.markers or config.option.showfixtures):
        acceptance_session(config)


@pytest.hookimpl(tryfirst=True)  # before a module's own parameters: ids read gpu017-rail3
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node" in metafunc.fixturenames:
        names = [node.name for node in acceptance_session(metafunc.config).nodes]
        metafunc.parametrize("node", names, ids=names)


@pytest.fixture(scope="session")
def acceptance(pytestconfig) -> AcceptanceSession:
    return acceptance_session(pytestconfig)


@pytest.fixture(scope="session")
def cluster(acceptance) -> Cluster:
    return acceptance.cluster


@pytest.fixture(scope="session")
def profile(cluster) -> Profile:
    return cluster.profile


@pytest.fixture(scope="session")
def cluster_run(acceptance) -> ClusterRun:
    return acceptance.cluster_run


class Evidence:
    """What a check leaves in the results beside its outcome, written into its ledger entry."""

    def __init__(self, item: pytest.Item):
        self._properties = item.user_properties
        self._note = ""
        self._caveats: list[str] = []

    def note(self, text: str) -> None:
        self._note = text
        self._write_note()

    def caveat(self, text: str) -> None:
        """A note that stays beside whatever the check notes later (the last note is the one kept)."""
        if text not in self._caveats:
            self._caveats.append(text)
        self._write_note()

    def _write_note(self) -> None:
        self._properties.append((PROPERTY_NOTE, "; ".join(filter(None, [self._note, *self._caveats]))))

    def raw(self, paths: list[str]) -> None:
        self._properties.append((PROPERTY_RAW, paths))

    def metrics(self, rows: list[dict]) -> None:
        self._properties.append((PROPERTY_METRICS, rows))

    def series(self, name: str, *, x: tuple[str, str], y: tuple[str, str],
               lines: dict[str, list[tuple[float, float]]], x_scale: str = "linear") -> None:
        """A curve for the report: `x`/`y` are (label, unit); `lines` maps a legend to points."""
        self._properties.append((PROPERTY_SERIES, series_entry(
            name, x=x, y=y, lines=lines, x_scale=x_scale)))

    def pairs(self, links: list[dict], median: float | None) -> None:
        """A node's pairs with a tool (peer, state, figure, pass) for the heatmaps, judged once
        against the median of the tool's campaign."""
        self._properties.append((PROPERTY_PAIRS, {"pairs": links, "median": median}))


@pytest.fixture
def record(request) -> Evidence:
    """Evidence a check leaves in the results: a note, raw output paths, metrics, curves."""
    return Evidence(request.node)


@pytest.fixture
def on_node(cluster_run, node, record):
    """on_node(step, run) -> this node's Result of a step run once on all selected nodes.

    A result taken before the node was lost says so in the check's note.
    """

    def result_of(step, run):
        result = cluster_run.gather(step, run)[node]
        record.raw(cluster_run.raw_paths(step, node))
        stale = cluster_run.taken_before_loss(step, node)
        if stale:
            record.caveat(stale)
        return result

    return result_of


@pytest.fixture
def metrics(request, profile, record) -> Metrics:
    """metrics.judge(name=(value, unit), ...) against the profile's references for this check."""
    return Metrics(request.node.originalname.removeprefix("test_"), profile, record.metrics)
