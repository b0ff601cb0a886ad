"""A re-test: after repairs, run again only what a run lacked, as an addendum tied to its report.

`pytest --inventory FILE --retest RUN_DIR` makes a new run directory beside the original's. Its
ledger header holds `retest_of`: the original's report ID and run ID, the SHA-256 of its signed
results.json, and its outstanding checks (failed or errored; planned without a result; mandatory
ones skipped or without a result; and, when a node has any of those, the cluster-wide checks that
passed without that node's facts) with the outcome each had there. Those are run again, on the
nodes they concern (a cluster-wide check on the nodes the original ran on). The original is never
touched, so both stay signed and the history stays visible: the addendum's report shows original
-> re-test per check, and its verdict counts an outstanding check it did not run as the original
recorded it (a failure stays a failure on that record).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from reports.bundle import Finding, sha256_of, verify
from reports.hostlists import counted
from reports.ledger import LedgerError, RunRecord, read_ledger
from reports.results import RESULTS_FILE, build_results, report_id
from reports.verdict import CERTIFIED, FAILED_OUTCOMES, INCOMPLETE, NOT_CERTIFIED, Verdict, masked_node_words

RETEST_OF = "retest_of"
NOT_RUN = "not run"  # the original planned it, or the profile makes it mandatory, and it has no result
SUMMARY_KEYS = ("outcome", "kind", "message")


class RetestError(Exception):
    """A run directory that cannot be re-tested; str() is the one line to show."""


@dataclass(frozen=True)
class Original:
    """The run a re-test completes: who it is, and its latest outcome per check."""

    run_dir: Path
    record: RunRecord
    report_id: str
    results_sha256: str

    @property
    def cluster(self) -> str:
        return str(self.record.header.get("cluster"))

    @property
    def cluster_id(self) -> str:
        return str(self.record.header.get("cluster_id") or self.record.header.get("cluster"))

    @property
    def nodes(self) -> list[str]:
        return self.record.nodes

    def header(self, checks: list[dict]) -> dict:
        """The re-test's `retest_of`: the tie to this run and the checks it set out to run again."""
        return {"report_id": self.report_id, "run_id": self.record.header["run_id"],
                "results_sha256": self.results_sha256,
                "inventory_sha256": self.record.header.get("inventory", {}).get("sha256"),
                "checks": checks}

    def outstanding(self, collected: Iterable[tuple[str, str, Optional[str]]]) -> list[dict]:
        """What a re-test runs again: the (test_id, check, node) of the original that failed,
        errored or had no result though planned, and the collected checks the profile makes
        mandatory that the original skipped or has no result for; each with its outcome there."""
        known = {test_id: (check, node) for test_id, check, node in collected}
        current = latest_outcomes(self.record)
        for test_id, entry in current.items():  # a test without a result: collected, it says its node
            if entry["outcome"] == NOT_RUN and test_id in known:
                entry["check"], entry["node"] = known[test_id]
        mandatory = set(self.record.header.get("profile", {}).get("mandatory", []))
        found = {test_id: entry for test_id, entry in current.items()
                 if entry["outcome"] in FAILED_OUTCOMES or entry["outcome"] == NOT_RUN
                 or (entry["outcome"] == "skipped" and entry["check"] in mandatory)}
        if not is_retest(self.record):  # a re-test's passes are on the record it re-tested
            seen = {(entry["check"], entry["node"]) for entry in current.values()}
            for test_id, (check, node) in known.items():
                if check in mandatory and (check, node) not in seen and test_id not in found:
                    found[test_id] = {"test_id": test_id, "check": check, "node": node, "outcome": NOT_RUN,
                                      "kind": None, "message": ""}
        return list(found.values()) + self._cluster_wide_again(found, current, known)

    @staticmethod
    def _cluster_wide_again(found: dict[str, dict], current: dict[str, dict],
                            known: dict[str, tuple[str, Optional[str]]]) -> list[dict]:
        """The cluster-wide checks that passed while a node re-tested now was failing or had no
        result: they judged the cluster without that node's facts (uniformity without node2's
        memory), so the repaired node is not yet judged beside its peers. Run again, still
        collected, when any node has a check to run again."""
        if not any(entry.get("node") for entry in found.values()):
            return []
        return [entry for test_id, entry in current.items()
                if entry.get("node") is None and entry["outcome"] == "passed" and test_id in known
                and test_id not in found]


def load_original(run_dir: Path) -> Original:
    """The run directory --retest names, read and identified; it must have been rendered, since
    the re-test is tied to its signed results.json."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RetestError(f"{run_dir}: no such run directory")
    try:
        record = read_ledger(run_dir)
    except LedgerError as error:
        raise RetestError(str(error)) from None
    results = run_dir / RESULTS_FILE
    try:
        digest, _ = sha256_of(results)
    except FileNotFoundError:
        raise RetestError(f"{run_dir}: no {RESULTS_FILE} to tie the re-test to; render it first with "
                          f"`handover report {run_dir}`") from None
    except OSError as error:
        raise RetestError(f"{results}: cannot read: {error.strerror or error}") from None
    header = record.header
    identity = report_id(str(header.get("cluster_id") or header.get("cluster")), header["run_id"])
    return Original(run_dir.resolve(), record, identity, digest)


def summary(entry: dict) -> dict:
    """A check's outcome as an addendum shows it: outcome, kind of failure, first line of its message."""
    lines = str(entry.get("message") or "").strip().splitlines()
    return {"test_id": entry["test_id"], "check": entry["check"], "node": entry.get("node"),
            "outcome": entry["outcome"], "kind": entry.get("kind"), "message": lines[0] if lines else ""}


def latest_outcomes(record: RunRecord) -> dict[str, dict]:
    """test_id -> summary of its latest outcome: a planned test without a result is NOT_RUN, and
    a re-test's outcomes lie over those of the run it re-tested (so a re-test can be re-tested)."""
    current: dict[str, dict] = {}
    for entry in (record.header.get(RETEST_OF) or {}).get("checks", []):
        current[entry["test_id"]] = dict(entry)
    for test_id in record.planned:
        if test_id not in current:
            check, node = _check_and_node(test_id)
            current[test_id] = {"test_id": test_id, "check": check, "node": node, "outcome": NOT_RUN,
                                "kind": None, "message": ""}
    for entry in record.checks:
        current[entry["test_id"]] = summary(entry)
    return current


def _check_and_node(test_id: str) -> tuple[str, Optional[str]]:
    """suites/test_system.py::test_memory[node2] -> (memory, node2), for a planned test that is
    no longer collected: a per-node check's id is its node (perftest's add the rail: gpu017-rail3)."""
    name = test_id.rpartition("::")[2]
    function, _, params = name.partition("[")
    node = params.rstrip("]").split("-rail")[0] if params else None
    return function.removeprefix("test_"), node or None


# --- The addendum, from the re-test's ledger ---------------------------------------------------


def is_retest(record: RunRecord) -> bool:
    return isinstance(record.header.get(RETEST_OF), dict)


def addendum_rows(record: RunRecord) -> list[dict]:
    """Per outstanding check of the original: its outcome there and here (null: not re-tested)."""
    latest = {entry["test_id"]: entry for entry in record.checks}
    rows = []
    for original in record.header[RETEST_OF]["checks"]:
        new = latest.get(original["test_id"])
        rows.append({"test_id": original["test_id"], "check": original["check"], "node": original.get("node"),
                     "original": {key: original.get(key) for key in SUMMARY_KEYS},
                     "retest": {key: summary(new)[key] for key in SUMMARY_KEYS} if new else None})
    return rows


def build_addendum(record: RunRecord, signer: Optional[dict] = None) -> tuple[dict, Verdict]:
    """results.json of a re-test. Its own checks are judged as any run's, but not against the
    profile's mandatory list (the original's record holds what passed there); then each
    outstanding check of the original counts: failed again, not re-tested (a failure stays one,
    a missing result stays missing), or skipped where the profile makes it mandatory. An optional
    check may skip, as in any run: one that failed as unreachable may find no GPU to check.
    The nodes judged one by one are those with a check of their own to re-test: a node that only
    took part in a cluster-wide check re-run beside them stands on the original's record."""
    profile = {**record.header.get("profile", {}), "mandatory": []}
    judged = dataclasses.replace(record, header={**record.header, "profile": profile})
    rows = addendum_rows(record)
    retested = {row["node"] for row in rows if row["node"]}
    results, own = build_results(judged, signer, judged_nodes=[node for node in record.nodes if node in retested])
    tie = record.header[RETEST_OF]
    mandatory = set(record.header.get("profile", {}).get("mandatory", []))
    failed: list[str] = []
    incomplete: list[str] = []
    for row in rows:
        where = row["node"] or "cluster"
        if row["retest"] is None:
            line = f"{where}: {row['check']} was not re-tested; it stays {row['original']['outcome']} " \
                   f"on the record of {tie['report_id']}"
            (failed if row["original"]["outcome"] in FAILED_OUTCOMES else incomplete).append(line)
        elif row["retest"]["outcome"] == "skipped" and row["check"] in mandatory:
            incomplete.append(f"{where}: mandatory check {row['check']!r} skipped: {row['retest']['message']}")
    passing = sum(1 for row in rows if row["retest"] and row["retest"]["outcome"] == "passed")
    headline = f"addendum to {tie['report_id']}: {passing} of {len(rows)} outstanding check(s) now pass"
    if own.status == NOT_CERTIFIED or failed:
        status = NOT_CERTIFIED
    elif own.status == INCOMPLETE or incomplete:
        status = INCOMPLETE
    else:
        status = CERTIFIED
    own_reasons = own.reasons if own.status != CERTIFIED or status == CERTIFIED else []
    verdict = dataclasses.replace(own, status=status, reasons=[headline, *failed, *own_reasons, *incomplete])
    results["verdict"].update(status=verdict.status, reasons=verdict.reasons)
    results["run"][RETEST_OF] = {key: tie.get(key) for key in
                                 ("report_id", "run_id", "results_sha256", "inventory_sha256")}
    results["retest"] = rows
    return results, verdict


# --- handover verify: the tie to the original, when it lies beside the re-test ------------------


def tie_findings(run_dir: Path, results: dict, signed: Iterable[str],
                 allowed_signers: Optional[Path] = None, key: Optional[str] = None) -> list[Finding]:
    """For a re-test whose original run directory lies beside it: the original's bundle verifies,
    and its results.json is the one the re-test names (its SHA-256). Without it there, a line
    saying the tie was not checked (never that it holds). key: the re-test's signing key, which
    must have signed the original too where no trust list of the customer's checks both."""
    run = results.get("run")
    tie = run.get(RETEST_OF) if isinstance(run, dict) else None
    if not isinstance(tie, dict):
        return []
    where = f"{RETEST_OF} {tie.get('report_id')}"
    original = Path(run_dir).resolve().parent / str(tie.get("run_id"))
    if not (original / RESULTS_FILE).is_file():
        return [Finding(True, where, f"the original run directory {original.name} is not beside this one: "
                        "the tie is not checked (put it there and verify again)", checked=False)]
    try:
        digest, _ = sha256_of(original / RESULTS_FILE)
    except OSError as error:
        return [Finding(False, where, f"cannot read {original.name}/{RESULTS_FILE}: {error.strerror or error}")]
    if digest != tie.get("results_sha256"):
        return [Finding(False, where, f"{original.name}/{RESULTS_FILE} has SHA-256 {digest}, "
                        f"not the {tie.get('results_sha256')} this re-test was run against")]
    check = verify(original, tuple(signed), allowed_signers)
    if not check.ok:
        return [Finding(False, where, f"the original {original.name} has {len(check.problems)} problem(s): "
                        f"{check.problems[0]}")]
    if not check.trusted and check.fingerprint != key:
        return [Finding(False, where, f"the original {original.name} was signed by key {check.fingerprint}, "
                        f"not by {key}, which signed this re-test")]
    return [Finding(True, where, f"the original {original.name} verifies and its {RESULTS_FILE} is the "
                    f"one this re-test was run against (SHA-256 {digest[:16]}...)")]


# --- The report's banner and table -------------------------------------------------------------

_ROW_ORDER = {"failed": 0, "error": 0, "skipped": 1, None: 2, "passed": 3}  # still failing first


def addendum_view(results: dict, clean: Callable[[object], str], fleet: bool = False) -> Optional[dict]:
    """What the report's addendum banner and table show, as plain strings (clean: the report's
    own text filter); None for a run that is not a re-test. In a fleet, the checks of nodes
    whose row is alike but for the node's own words share a row, the nodes by hostlist."""
    tie = (results.get("run") or {}).get(RETEST_OF)
    if not isinstance(tie, dict):
        return None
    alike: dict[tuple, tuple[int, dict, list[str]]] = {}
    for number, row in enumerate(results.get("retest") or []):
        original, new = row.get("original") or {}, row.get("retest")
        outcome = new.get("outcome") if isinstance(new, dict) else None
        node = clean(row.get("node") or "")
        shown = {"check": clean(row.get("check")), "original": clean(original.get("outcome")),
                 "original_message": clean(original.get("message")), "retest": clean(outcome or "not re-tested"),
                 "retest_message": clean((new or {}).get("message"))}
        key = (tuple(masked_node_words(value, node) for value in shown.values()) if fleet and node else (number,))
        alike.setdefault(key, (_ROW_ORDER.get(outcome, 2), shown, []))[2].append(node or "cluster")
    rows = [{**shown, "where": counted(nodes), "count": len(nodes)}
            for _, shown, nodes in sorted(alike.values(), key=lambda group: group[0])]
    return {"report_id": clean(tie.get("report_id")), "run_id": clean(tie.get("run_id")),
            "results_sha256": clean(tie.get("results_sha256")), "rows": rows,
            "checks": sum(row["count"] for row in rows),
            "passing": sum(row["count"] for row in rows if row["retest"] == "passed")}
