"""The pytest plugin that writes each check outcome to the ledger as it completes, then renders.

Registered by conftest.py when --inventory is given. Tests hand it their evidence through
item.user_properties (metrics, notes, raw output paths), as pytest's record_property does.
"""
from __future__ import annotations

import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

import pytest

from inventory.model import Cluster, Node
from reports import signing
from reports.ledger import Ledger, RunRecord, now_iso
from reports.render import RenderedRun, render_run
from runners.cluster import ClusterRun
from runners.fanout import Progress
from runners.transport import Result
from handover.failures import CheckFailure, excerpt

AREAS = ("system", "hardware", "network", "storage", "hpc", "training")
DEPTHS = ("quick", "full")
PROGRESS_EVERY_S = 15  # without a terminal (CI logs), one progress line this often
PROPERTY_METRICS, PROPERTY_NOTE, PROPERTY_RAW = "handover_metrics", "handover_note", "handover_raw"
PROPERTY_SERIES = "handover_series"
PROPERTY_PAIR_STATE = "handover_pair_state"


class Recorder:
    name = "handover-recorder"

    def __init__(self, config: pytest.Config, cluster: Cluster, nodes: list[Node],
                 ledger: Ledger, key: signing.SigningKey, resumed: Optional[RunRecord] = None):
        self.config = config
        self.cluster = cluster
        self.key = key
        self.ledger = ledger
        self.resumed = resumed
        self.cluster_run = ClusterRun(cluster, nodes, self._save_raw, self._progress)
        self.rendered: Optional[RenderedRun] = None
        self._printed_at: dict[str, float] = {}  # step -> seconds into it

    @property
    def run_dir(self) -> Path:
        return self.ledger.run_dir

    def record_tool(self, node: str, tool: str, version: str) -> None:
        self.ledger.append({"type": "tool", "node": node, "tool": tool, "version": version})

    def _save_raw(self, step: str, result: Result) -> list[str]:
        return self.ledger.save_raw(step, result.node, result.stdout, result.stderr)

    def _progress(self, progress: Progress) -> None:
        """A live line on a terminal; a line every PROGRESS_EVERY_S in CI logs."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or capture is None:
            return
        finished = len(progress.done) == progress.total
        elapsed = time.monotonic() - progress.started
        with capture.global_and_fixture_disabled():
            if reporter.isatty():
                reporter.write("\r\x1b[K" + ("" if finished else "[handover] " + progress.line()))
            elif elapsed - self._printed_at.get(progress.step, 0.0) >= PROGRESS_EVERY_S:
                self._printed_at[progress.step] = elapsed
                reporter.write_line("[handover] " + progress.line())

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """When resuming, leave out what the run already has a result for."""
        if self.resumed is None:
            return
        done = {entry["test_id"] for entry in self.resumed.checks}
        keep = [item for item in items if item.nodeid not in done]
        deselected = [item for item in items if item.nodeid in done]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = keep
        self.ledger.append({"type": "resume", "at": now_iso(), "already_done": len(deselected)})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Narrow the run to the nodes that -k/-m left tests for, and note what is planned.

        Cluster-wide checks need every node, so any of them keeps the whole --nodes selection.
        """
        params = [getattr(item, "callspec", None) for item in session.items]
        per_node = {p.params["node"] for p in params if p and "node" in p.params}
        cluster_wide = any(not (p and "node" in p.params) for p in params)
        if not cluster_wide:
            self.cluster_run.nodes = [n for n in self.cluster_run.nodes if n.name in per_node]
        planned = [item.nodeid for item in session.items]
        if self.resumed is not None:
            planned = list(dict.fromkeys(self.resumed.planned + planned))
        self.ledger.append({"type": "selection",
                            "nodes": [n.name for n in self.cluster_run.nodes],
                            "tests": planned})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        error = call.excinfo.value if call.excinfo else None
        if isinstance(error, CheckFailure):
            # An expected kind of failure: the reason and the evidence, not a traceback.
            report.longrepr = f"[{error.kind}] {error}" + (f"\n{error.log}" if error.log else "")
        if report.when == "call" or (report.when == "setup" and not report.passed) or \
                (report.when == "teardown" and report.failed):
            self.ledger.append(check_entry(item, call, report))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.cluster_run.close()
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        self.ledger.append({"type": "end", "finished": now_iso(), "exitstatus": int(exitstatus),
                            "interrupted": interrupted})
        self.rendered = render_run(self.run_dir, self.key)
        if self.rendered.verdict.gate_failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.rendered is None:
            return
        verdict = self.rendered.verdict
        colour = {"CERTIFIED": {"green": True}, "NOT CERTIFIED": {"red": True}}.get(
            verdict.status, {"yellow": True})
        terminalreporter.section("handover", sep="=", bold=True)
        terminalreporter.write_line(f"verdict: {verdict.status}", bold=True, **colour)
        for reason in verdict.reasons[:20]:
            terminalreporter.write_line(f"  - {reason}")
        if len(verdict.reasons) > 20:
            terminalreporter.write_line(f"  ... and {len(verdict.reasons) - 20} more (see the report)")
        terminalreporter.write_line(f"report: {self.rendered.report}")
        if self.key:
            terminalreporter.write_line(f"signed by {self.key.fingerprint}; check with: "
                                        f"handover verify {self.run_dir}")


def check_entry(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> dict:
    """One ledger line for one test outcome."""
    props = dict(report.user_properties)
    markers = {mark.name for mark in item.iter_markers()}
    params = getattr(item, "callspec", None)
    outcome, kind, message, log = report.outcome, None, "", ""
    if report.skipped:
        message = _skip_reason(report)
    elif report.failed:
        excinfo = call.excinfo
        error = excinfo.value if excinfo else None
        if isinstance(error, CheckFailure):
            kind, message, log = error.kind, str(error), error.log
        elif isinstance(error, AssertionError):
            kind, message, log = "expectation", str(error).split("\nassert")[0], excerpt(report.longreprtext)
        else:
            kind, message = "error", f"{type(error).__name__}: {error}" if error else report.longreprtext
            log = excerpt(report.longreprtext)
        if report.when != "call" and not isinstance(error, CheckFailure):
            outcome = "error"
    entry = {
        "type": "check",
        "test_id": item.nodeid,
        "check": getattr(item, "originalname", item.name).removeprefix("test_"),
        "area": next((area for area in AREAS if area in markers), None),
        "depth": [depth for depth in DEPTHS if depth in markers],
        "node": params.params.get("node") if params else None,
        "outcome": outcome,
        "kind": kind,
        "message": message.strip() or props.get(PROPERTY_NOTE, ""),
        "log_excerpt": log,
        "duration_s": round(report.duration, 3),
        "finished": now_iso(),
        "raw": props.get(PROPERTY_RAW, []),
        "metrics": props.get(PROPERTY_METRICS, []),
    }
    series = [curve for key, curve in report.user_properties if key == PROPERTY_SERIES]
    if series:  # curves (busbw against size, loss against step) for the report's charts
        entry["series"] = series
    pair = params.params.get("pair") if params else None
    if pair:  # a test between two nodes: the report places it without parsing test ids
        entry["pair"] = list(pair)
        if "rail" in params.params:
            entry["rail"] = params.params["rail"]
        if PROPERTY_PAIR_STATE in props:
            entry["pair_state"] = props[PROPERTY_PAIR_STATE]["state"]
            entry["pair_median"] = props[PROPERTY_PAIR_STATE]["median"]
    return entry


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    return str(report.longrepr)


def run_header(cluster: Cluster, nodes: list[Node]) -> dict:
    profile = cluster.profile
    return {
        "cluster": cluster.name,
        "profile": {
            "name": profile.name, "description": profile.description,
            "mandatory": list(profile.mandatory), "expect": profile.expect,
            "references": {name: {"check": r.check, "value": r.value, "lower": r.lower,
                                  "upper": r.upper, "unit": r.unit, "source": r.source}
                           for name, r in profile.references.items()},
        },
        "inventory": {"path": cluster.source_path, "sha256": cluster.digest},
        "harness": harness_identity(),
        "argv": sys.argv,
        "nodes": [node.name for node in nodes],
    }


def harness_identity() -> dict:
    try:
        version = metadata.version("handover")
    except metadata.PackageNotFoundError:
        version = "unknown"
    source = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(source), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version, "commit": commit}
