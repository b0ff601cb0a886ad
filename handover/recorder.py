"""The adapter from pytest's reports to ledger entries: one line per check outcome, as it completes.

Checks hand over their evidence through item.user_properties (metrics, notes, raw output paths,
curves, a node's pairs), as pytest's record_property does; the record fixture writes them.

A failure says what to do next (`action`, the failure's own or its kind's). A failure the
inventory waives stays failed in the ledger, marked `waived` with the waiver's reason and owner,
and is reported to pytest as an expected failure (xfail, with the waiver as its reason): it is
shown, and it does not fail the run's exit status, the CI gate.
"""
from __future__ import annotations

import functools
import gc
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, cast

import pytest

from handover.failures import CheckFailure, action_for, excerpt
from inventory.model import Waiver
from reports.ledger import now_iso

if TYPE_CHECKING:
    from runners.cluster import ClusterRun

AREAS = ("system", "hardware", "network", "storage", "hpc", "training")
DEPTHS = ("quick", "full")
PROPERTY_METRICS, PROPERTY_NOTE, PROPERTY_RAW = "handover_metrics", "handover_note", "handover_raw"
PROPERTY_SERIES, PROPERTY_PAIRS = "handover_series", "handover_pairs"
# The suites ship beside this package (in a checkout and installed alike); found, not imported.
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


class Recorder:
    """Registered by the plugin for a session; appends each outcome to the session's ledger."""

    name = "handover-recorder"

    def __init__(self, append, waivers: Sequence[Waiver] = (), cluster_run: Optional[ClusterRun] = None):
        self._append = append
        self._waivers = tuple(waivers)
        self._cluster_run = cluster_run  # notes the nodes a cluster-wide check missed

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self._cluster_run is not None and node_of(item) is None:
            self._cluster_run.watch()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The collected items (14 a node in the system suite alone) live as long as the session,
        and every full garbage collection would walk them all again: a cost per item that grows
        with the nodes (at 64 nodes, about a tenth of the run's CPU). Freeze what exists now out
        of the collector's sight; the session's end unfreezes it."""
        gc.freeze()
        session.config.add_cleanup(gc.unfreeze)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
        """pytest's report of the check (made here in its place), filed in the ledger."""
        error = call.excinfo.value if call.excinfo else None
        report = (failure_report(item, call, error) if isinstance(error, CheckFailure)
                  else pytest.TestReport.from_item_and_call(item, call))
        if report.when == "call" or (report.when == "setup" and not report.passed) or \
                (report.when == "teardown" and report.failed):
            entry = check_entry(item, call, report, self._waivers)
            if self._cluster_run is not None and entry["node"] is None:
                entry["unreached"] = self._cluster_run.missed()
            if entry.get("waived"):
                waived = entry["waived"]
                report.outcome = "skipped"  # as pytest's own xfail does: shown, not counted failed
                report.wasxfail = f"waived ({waived['owner']}): {waived['reason']}"
            self._append(entry)
        return report


def failure_report(item: pytest.Item, call: pytest.CallInfo, error: CheckFailure) -> pytest.TestReport:
    """An expected kind of failure as pytest reports it, with the reason and the evidence where a
    traceback would be. pytest's own report formats the traceback first, parsing the suite's source
    for every frame: about 14 ms a failure, 200 s of CPU for 1,024 unreachable nodes' 14 checks."""
    report = pytest.TestReport.from_item_and_call(item, pytest.CallInfo.from_call(lambda: None, call.when))
    report.outcome = "failed"
    report.longrepr = f"[{error.kind}] {error}" + (f"\n{error.log}" if error.log else "")
    report.start, report.stop, report.duration = call.start, call.stop, call.duration
    return report


def test_id(item: pytest.Item) -> str:
    """The id a check has in the ledger: pytest's node id with the file named from the folder
    that holds the suites package (suites/test_system.py::test_os[gpu017]), so the id is the
    same whichever directory pytest ran from, and --resume finds it again. A file outside
    pytest's rootdir, which pytest's node id leaves unnamed (`::test_x`), is named by its path:
    two such files' tests of one name are two checks."""
    file, _, rest = item.nodeid.partition("::")
    return f"{_suite_file(str(item.path)) or file or item.path.as_posix()}::{rest}"


@functools.lru_cache(maxsize=None)
def _suite_file(path: str) -> str:
    """'suites/test_system.py' for a file of the suites, else ''; once per file, not per test
    (tens of thousands of tests on a big cluster share a dozen files)."""
    resolved = Path(path).resolve()
    if resolved.is_relative_to(SUITES_DIR):
        return f"{SUITES_DIR.name}/{resolved.relative_to(SUITES_DIR).as_posix()}"
    return ""


def check_entry(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport,
                waivers: Sequence[Waiver] = ()) -> dict:
    """One ledger line for one test outcome."""
    props: dict = dict(report.user_properties)
    markers = {mark.name for mark in item.iter_markers()}
    params = params_of(item)
    outcome: str = report.outcome
    kind, message, log, action = None, "", "", ""
    if report.skipped:
        message = _skip_reason(report)
    elif report.failed:
        excinfo = call.excinfo
        error = excinfo.value if excinfo else None
        if isinstance(error, CheckFailure):
            kind, message, log, action = error.kind, str(error), error.log, error.action
        elif isinstance(error, AssertionError):
            kind, message, log = "expectation", str(error).split("\nassert")[0], excerpt(report.longreprtext)
        else:
            kind, message = "error", f"{type(error).__name__}: {error}" if error else report.longreprtext
            log = excerpt(report.longreprtext)
        if report.when != "call" and not isinstance(error, CheckFailure):
            outcome = "error"
        action = action or action_for(kind or "error")
    entry: dict = {
        "type": "check",
        "test_id": test_id(item),
        "check": getattr(item, "originalname", item.name).removeprefix("test_"),
        "area": next((area for area in AREAS if area in markers), None),
        "depth": [depth for depth in DEPTHS if depth in markers],
        "node": params.get("node"),
        "outcome": outcome,
        "kind": kind,
        "message": message.strip() or props.get(PROPERTY_NOTE, ""),
        "log_excerpt": log,
        "duration_s": round(report.duration, 3),
        "finished": now_iso(),
        "raw": list(dict.fromkeys(_every(report, PROPERTY_RAW))),
        "metrics": _every(report, PROPERTY_METRICS),
    }
    series = [curve for key, curve in report.user_properties if key == PROPERTY_SERIES]
    if series:  # curves (busbw against size, loss against step) for the report's charts
        entry["series"] = series
    if "rail" in params:  # perftest: the HCA index this check tested
        entry["rail"] = params["rail"]
    if PROPERTY_PAIRS in props:  # a node's pairs with their states, judged once by the suite
        entry["pairs"] = props[PROPERTY_PAIRS]["pairs"]
        entry["pair_median"] = props[PROPERTY_PAIRS]["median"]
    if report.failed:
        entry["action"] = action
        day = entry["finished"][:10]  # UTC: the date an expiring waiver is held against
        waiver = next((w for w in waivers if w.covers(entry["check"], entry["node"], day)), None)
        if waiver is not None:
            entry["waived"] = {"reason": waiver.reason, "owner": waiver.owner, "expires": waiver.expires}
    return entry


def params_of(item: pytest.Item) -> dict:
    callspec = getattr(item, "callspec", None)
    return callspec.params if callspec else {}


def node_of(item: pytest.Item) -> Optional[str]:
    """The node a per-node check tests; None for a cluster-wide check."""
    return params_of(item).get("node")


def _every(report: pytest.TestReport, key: str) -> list:
    """The items of every list a check recorded under key (a check may read several steps)."""
    return [item for name, items in report.user_properties if name == key for item in cast(list, items)]


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    return str(report.longrepr)
