"""From a run's check outcomes to a verdict: CERTIFIED only when nothing failed and nothing is missing.

Fail closed: a mandatory check without a result on some node, a mandatory metric without a
reference to judge it, a node with no result at all, or an interrupted run make the verdict
INCOMPLETE; any failed check makes it NOT CERTIFIED, unless the inventory waived it: a waived
failure (its entry marked `waived` when it was recorded) is counted apart, named in the reasons,
and makes its node `waived`, never `passed`, but it does not fail the verdict or the gate.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from reports.hostlists import counted, hostlist_of

CERTIFIED = "CERTIFIED"
NOT_CERTIFIED = "NOT CERTIFIED"
INCOMPLETE = "INCOMPLETE"

FAILED_OUTCOMES = ("failed", "error")
CHECKS_NAMED = 5  # a reason for checks that failed alike names this many, then counts the rest
# Beyond this many nodes a run is a fleet: the report summarises (reports.html), and nodes whose
# reasons say the same but for their name (address, clock times) share one, named by hostlist.
FLEET_NODES = 64
# Words that differ from node to node by nature in reasons otherwise the same: a node's IPv4 or
# IPv6 address, the clock time its trouble began and how far into a command it came (a rack that
# lost power: "lost at 10:00:03 (... Unable to connect to port 22 on 10.0.3.34)" on every node, a
# second and an address apart; "no answer to SSH keepalives for 12 s, 14 s into `...`").
PER_NODE_WORDS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\b\d\d:\d\d:\d\d\b|\b\d+ s into\b"
                            r"|(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%[\w.-]+)?(?![\w:]|\.\d)")
REASONS_SHOWN = 20  # reasons (and as many warnings) a terminal shows below the headline; the report has all


@dataclass
class Verdict:
    status: str
    reasons: list[str]
    nodes: list[dict]  # [{"name", "status": passed|failed|incomplete|waived|untested, "reasons"}]
    untested_nodes: list[str] = field(default_factory=list)
    cluster_checks: Optional[str] = None  # passed|failed|incomplete; None: no cluster-wide check
    waived: int = 0  # failures the inventory waived: not counted against the verdict
    warnings: list[str] = field(default_factory=list)  # outliers the profile does not fail, one line each

    @property
    def headline(self) -> str:
        """The status with its warnings beside it: "CERTIFIED, 3 warnings"."""
        count = len(self.warnings)
        return f"{self.status}, {count} warning{'s' if count != 1 else ''}" if count else self.status

    @property
    def gate_failed(self) -> bool:
        """What the CI gate (pytest's exit code) fails on: a failed check or a node with no result."""
        return self.status == NOT_CERTIFIED or bool(self.untested_nodes)


def judge(profile: dict, nodes: list[str], checks: list[dict], planned: list[str],
          interrupted: bool, outliers: Sequence[dict] = ()) -> Verdict:
    """profile: the run header's profile (mandatory, references); planned: collected test ids;
    outliers: reports.results.outliers of the checks, warnings unless their severity is failure."""
    mandatory: list[str] = profile.get("mandatory", [])
    references: dict = profile.get("references", {})

    failures, incomplete = [], []
    # One unreachable node fails every check the same way: say so once, naming the checks.
    failed_alike: dict[tuple[str, str, str], list[str]] = {}
    # Waived failures, one reason per waiver: (check, owner, reason) -> nodes.
    waived: dict[tuple[str, str, str], list[str]] = {}
    per_node: dict = defaultdict(lambda: {"failed": [], "incomplete": [], "waived": [], "seen": False})
    by_check: dict = defaultdict(list)
    for entry in checks:
        by_check[entry["check"]].append(entry)
        where = entry.get("node") or "cluster"
        if entry.get("node"):
            per_node[entry["node"]]["seen"] = True
        if entry["outcome"] in FAILED_OUTCOMES and is_waived(entry):
            waiver = entry["waived"]
            waived.setdefault((entry["check"], str(waiver.get("owner")), str(waiver.get("reason"))),
                              []).append(where)
            if entry.get("node"):
                per_node[entry["node"]]["waived"].append(
                    f"{where}: {entry['check']} failed ({entry.get('kind') or 'error'}), waived "
                    f"({waiver.get('owner')}: {waiver.get('reason')}): {_first_line(entry)}")
        elif entry["outcome"] in FAILED_OUTCOMES:
            kind, message = entry.get("kind") or "error", _first_line(entry)
            failed_alike.setdefault((where, kind, message), []).append(entry["check"])
            why = f"{where}: {entry['check']} failed ({kind}): {message}"
            if entry.get("node"):
                per_node[entry["node"]]["failed"].append(why)
        elif entry["outcome"] == "passed":
            for miss in _unmeasured(entry, references):
                failures.append(f"{where}: {miss}")
                if entry.get("node"):
                    per_node[entry["node"]]["failed"].append(miss)

    failures[:0] = _alike([(where, f"{_named(names)} failed ({kind}): {message}")
                           for (where, kind, message), names in failed_alike.items()], fleet=len(nodes) > FLEET_NODES)
    warnings = []
    for outlier in outliers:
        line = outlier_line(outlier)
        if outlier.get("severity") == "failure":
            failures.append(f"{line}: an outlier, which the profile fails for {outlier['metric']}")
            per_node[outlier["node"]]["failed"].append(f"outlier: {line}")
        else:
            warnings.append(line)

    selected = {check_of(test_id) for test_id in planned}
    for check in mandatory:
        entries = by_check.get(check, [])
        if not entries:
            why = (f"mandatory check {check!r} has no result" if check in selected or not planned else
                   f"mandatory check {check!r} has no result: -m/-k did not select it (a delivery's run needs it)")
            incomplete.append(why)
            for node in nodes:
                per_node[node]["incomplete"].append(why)
            continue
        cluster_wide = [e for e in entries if e.get("node") is None]
        if cluster_wide:
            incomplete.extend(f"cluster: {reason}" for e in cluster_wide if (reason := _not_done(e)))
            continue
        by_node: dict[str, list[dict]] = {}
        for entry in entries:
            by_node.setdefault(entry.get("node"), []).append(entry)
        not_done = []
        for node in nodes:
            reasons = [_not_done(e) for e in by_node.get(node, [])] or \
                [f"mandatory check {check!r} has no result"]
            for reason in filter(None, reasons):
                per_node[node]["incomplete"].append(reason)
                not_done.append((node, reason))
        incomplete += _alike(not_done, fleet=len(nodes) > FLEET_NODES)

    done_ids = {entry["test_id"] for entry in checks}
    missing = [test_id for test_id in planned if test_id not in done_ids]
    if missing:
        incomplete.append(f"{len(missing)} planned check(s) have no result, e.g. {missing[0]}")

    untested = [n for n in nodes if not per_node[n]["seen"]]
    node_rows = []
    for name in nodes:
        state = per_node[name]
        if not state["seen"]:
            node_rows.append({"name": name, "status": "untested", "reasons": ["no check has a result"]})
        elif state["failed"]:
            node_rows.append({"name": name, "status": "failed", "reasons": state["failed"]})
        elif state["incomplete"]:
            node_rows.append({"name": name, "status": "incomplete", "reasons": state["incomplete"]})
        elif state["waived"]:
            node_rows.append({"name": name, "status": "waived", "reasons": state["waived"]})
        else:
            node_rows.append({"name": name, "status": "passed", "reasons": []})

    cluster_checks = cluster_status([e for e in checks if e.get("node") is None])
    if untested:
        incomplete.insert(0, f"{len(untested)} node(s) without any result: {', '.join(untested)}")
    if interrupted:
        incomplete.insert(0, "the run was interrupted before it finished")
    waived_count = sum(len(where) for where in waived.values())
    waived_reasons = [f"waived: {check} failed on {hostlist_of(where)} ({owner}: {reason})"
                      for (check, owner, reason), where in waived.items()]
    if failures:
        return Verdict(NOT_CERTIFIED, failures + incomplete + waived_reasons, node_rows, untested,
                       cluster_checks, waived_count, warnings)
    passed = sum(1 for entry in checks if entry["outcome"] == "passed")
    if not passed:
        incomplete.append("no check passed")
    if incomplete:
        return Verdict(INCOMPLETE, incomplete + waived_reasons, node_rows, untested, cluster_checks,
                       waived_count, warnings)
    skipped = sum(1 for entry in checks if entry["outcome"] == "skipped")
    summary = (f"all {passed} checks passed on {len(nodes)} node(s)" if not skipped and not waived_count else
               f"{passed} checks passed on {len(nodes)} node(s)"
               + (f", {skipped} optional ones skipped" if skipped else "")
               + (f", {waived_count} failure(s) waived" if waived_count else ""))
    return Verdict(CERTIFIED, [summary, *waived_reasons], node_rows, untested, cluster_checks, waived_count,
                   warnings)


def terminal_summary(verdict: Verdict, shown: int = REASONS_SHOWN) -> list[str]:
    """The lines below the headline in a terminal (pytest's summary, `handover report`): the
    first `shown` reasons and warnings, each then counting the ones left to the report."""
    lines = [f"  - {reason}" for reason in verdict.reasons[:shown]]
    if len(verdict.reasons) > shown:
        lines.append(f"  ... and {len(verdict.reasons) - shown} more (see the report)")
    lines += [f"  - warning, an outlier: {warning}" for warning in verdict.warnings[:shown]]
    if len(verdict.warnings) > shown:
        lines.append(f"  ... and {len(verdict.warnings) - shown} more warnings (see the report)")
    return lines


def masked_node_words(words: str, node: str) -> str:
    """`words` with what is its node's own masked (its name, PER_NODE_WORDS): the same for
    two nodes whose trouble is alike."""
    return PER_NODE_WORDS.sub("\0", words.replace(node, "\0") if node else words)


def _alike(reasons: list[tuple[str, str]], fleet: bool) -> list[str]:
    """'node: reason' for each (node, reason); in a fleet, the nodes whose reasons are the same
    but for their own name, address and clock times (PER_NODE_WORDS) share one, in first-seen
    order: 'gpu[0034,0134] (2 nodes): peermem failed (expectation): gpu0034: ...', the first
    node's words standing for all."""
    if not fleet:
        return [f"{where}: {reason}" for where, reason in reasons]
    return [f"{counted(names)}: {words}" for names, words in alike(reasons)]


def alike(said: Iterable[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """(nodes, words) for each set of nodes whose (node, words) are the same but for their own
    (masked_node_words), in first-seen order; the first node's words stand for all."""
    groups: dict[str, tuple[list[str], str]] = {}
    for node, words in said:
        groups.setdefault(masked_node_words(words, node), ([], words))[0].append(node)
    return list(groups.values())


def check_of(test_id: str) -> str:
    """The check a pytest id runs: its test function's name without 'test_' (memory for
    suites/test_system.py::test_memory[gpu017])."""
    return test_id.rpartition("::")[2].partition("[")[0].removeprefix("test_")


def _named(checks: list[str]) -> str:
    """The checks as a reason names them: all up to CHECKS_NAMED, then the first few and a count
    ("a, b, c, d, e and 39 more checks"): an unreachable node fails every check, and a line
    naming them all buries the reasons after it. The node's own reasons keep each check."""
    if len(checks) <= CHECKS_NAMED:
        return ", ".join(checks)
    more = len(checks) - CHECKS_NAMED
    return f"{', '.join(checks[:CHECKS_NAMED])} and {more} more check{'s' if more != 1 else ''}"


def outlier_line(outlier: dict) -> str:
    """One outlier as a person reads it, for the verdict, the node table and JUnit."""
    unit = f" {outlier['unit']}" if outlier.get("unit") else ""
    rail = f" rail {outlier['rail']}" if outlier.get("rail") is not None else ""
    z = outlier.get("robust_z")
    return (f"{outlier['node']}{rail}: {outlier['check']} {outlier['metric']} = {outlier['value']:g}{unit}, "
            f"{abs(outlier['deviation']):.0%} {'below' if outlier['deviation'] < 0 else 'above'} the median "
            f"{outlier['median']:.4g}{unit} of its peers "
            f"({'robust z ' + format(z, 'g') if z is not None else 'every other node at the median'})")


def is_waived(entry: dict) -> bool:
    """A failure the inventory waived when it was recorded (see handover.recorder)."""
    return entry.get("outcome") in FAILED_OUTCOMES and isinstance(entry.get("waived"), dict)


def cluster_status(entries: list[dict]) -> Optional[str]:
    """The cluster-wide checks (and tests between pairs) as one row's status, like a node's."""
    if not entries:
        return None
    outcomes = {entry["outcome"] for entry in entries}
    if outcomes & set(FAILED_OUTCOMES):
        return "failed"
    return "incomplete" if "skipped" in outcomes else "passed"


def _first_line(entry: dict) -> str:
    lines = (entry.get("message") or "").strip().splitlines()
    return lines[0] if lines else ""


def _unmeasured(entry: dict, references: dict) -> list[str]:
    """A passing entry's referenced metrics that have no value or lie outside their band."""
    metrics = entry.get("metrics", [])
    measured = {m["name"] for m in metrics if m.get("value") is not None}
    return [f"{entry['check']}: metric {name!r} has a reference but no measurement"
            for name, ref in references.items()
            if ref.get("check") == entry["check"] and name not in measured] + \
        [f"{entry['check']}: metric {m['name']!r} is outside its band ({m.get('criterion')})"
         for m in metrics if m.get("ok") is False]


def _not_done(entry: dict) -> str:
    """Why a mandatory check's entry does not count: skipped, or a metric with no reference."""
    if entry["outcome"] == "skipped":
        return f"mandatory check {entry['check']!r} skipped: {_first_line(entry)}"
    loose = [m["name"] for m in entry.get("metrics", []) if m.get("reference") is None]
    if loose:
        return f"mandatory check {entry['check']!r}: no reference for {', '.join(loose)}"
    return ""
