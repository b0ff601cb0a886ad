"""The verdict: CERTIFIED only when nothing failed and nothing is missing, judged from real ledgers.

Every run here is written with the real Ledger (create + append) under tmp_path and read back
with read_ledger and build_results, the path `handover report` takes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from handover.session import run_header
from inventory.loader import load_inventory
from reports.ledger import Ledger, now_iso, read_ledger
from reports.results import build_results
from reports.verdict import (
    CERTIFIED,
    INCOMPLETE,
    NOT_CERTIFIED,
    REASONS_SHOWN,
    Verdict,
    judge,
    masked_node_words,
    terminal_summary,
)

REPO = Path(__file__).resolve().parent.parent
MODULE = "suites/test_system.py"
NODES = ["n1", "n2"]

REFERENCES = {
    "memory_total": {"check": "memory", "value": 4.0, "lower": -0.5, "upper": None,
                     "unit": "GiB", "source": "smoke floor"},
    "cpu_cores": {"check": "cpu", "value": 2.0, "lower": -0.5, "upper": None,
                  "unit": "cores", "source": "smoke floor"},
}
PROFILE = {"name": "test-profile", "description": "profile of the verdict tests",
           "mandatory": ["reachable", "memory", "uniformity"], "expect": {},
           "references": REFERENCES}


def header(nodes=NODES, profile=PROFILE) -> dict:
    return {"cluster": "testcluster", "profile": profile,
            "inventory": {"path": "/inventory/testcluster.yaml", "sha256": "0" * 64},
            "harness": {"version": "0.1.0", "commit": "abc1234"},
            "argv": ["pytest", "--inventory", "inventory/testcluster.yaml"], "nodes": list(nodes)}


def metric(name: str, value: Optional[float], unit: str, judged: bool = True) -> dict:
    """A metric row as suites.checks.Metrics.judge records it."""
    reference = REFERENCES.get(name) if judged else None
    row = {"name": name, "value": value, "unit": unit, "reference": None, "criterion": None,
           "margin": None, "ok": None}
    if reference is not None:
        row.update(reference={k: v for k, v in reference.items() if k != "check"},
                   criterion=f">= {reference['value'] * (1 + reference['lower']):g} {unit}",
                   margin=0.5, ok=True)
    return row


def check(node: Optional[str], name: str, outcome: str = "passed", *, kind: Optional[str] = None,
          message: str = "", metrics: Optional[list] = None, test_id: Optional[str] = None) -> dict:
    """A check entry with the keys recorder.check_entry writes."""
    if test_id is None:
        test_id = f"{MODULE}::test_{name}[{node}]" if node else f"{MODULE}::test_{name}"
    return {"type": "check", "test_id": test_id, "check": name, "area": "system",
            "depth": ["quick"], "node": node, "outcome": outcome, "kind": kind,
            "message": message, "log_excerpt": "", "duration_s": 0.25, "finished": now_iso(),
            "raw": [], "metrics": metrics or []}


def node_checks(node: str) -> list[dict]:
    """What a clean node records: every mandatory per-node check passed, metrics judged."""
    return [check(node, "reachable", message=f"answered as {node}"),
            check(node, "memory", metrics=[metric("memory_total", 31.2, "GiB")]),
            check(node, "cpu", metrics=[metric("cpu_cores", 16, "cores")])]


def clean_run(nodes=NODES) -> list[dict]:
    return [entry for node in nodes for entry in node_checks(node)] + [check(None, "uniformity")]


def selection(entries: list[dict], nodes=NODES) -> dict:
    return {"type": "selection", "nodes": list(nodes),
            "tests": [e["test_id"] for e in entries if e["type"] == "check"]}


END = {"type": "end", "finished": "2030-01-01T00:00:00+00:00", "exitstatus": 0, "interrupted": False}


def write_run(tmp_path: Path, entries: list[dict], *, head: Optional[dict] = None,
              planned: Optional[list[dict]] = None, end: Optional[dict] = END) -> Path:
    """A ledger as the recorder writes it: header, selection, checks as they finish, end."""
    head = header() if head is None else head
    ledger = Ledger.create(tmp_path / "out", head["cluster"], head)
    ledger.append(selection(entries if planned is None else planned, head["nodes"]))
    for entry in entries:
        ledger.append(entry)
    if end is not None:
        ledger.append(end)
    return ledger.run_dir


def verdict_of(run_dir: Path) -> Verdict:
    return build_results(read_ledger(run_dir))[1]


def node_row(verdict: Verdict, name: str) -> dict:
    return next(row for row in verdict.nodes if row["name"] == name)


def replaced(entries: list[dict], new: dict) -> list[dict]:
    return [new if e["test_id"] == new["test_id"] else e for e in entries]


# CERTIFIED


def test_certified_when_everything_passed_and_every_metric_is_judged(tmp_path):
    verdict = verdict_of(write_run(tmp_path, clean_run()))
    assert verdict.status == CERTIFIED
    assert verdict.reasons == ["all 7 checks passed on 2 node(s)"]
    assert verdict.nodes == [{"name": "n1", "status": "passed", "reasons": []},
                             {"name": "n2", "status": "passed", "reasons": []}]
    assert verdict.untested_nodes == []
    assert verdict.gate_failed is False


def test_certified_with_the_header_the_recorder_writes_for_the_local_inventory(tmp_path):
    cluster = load_inventory(REPO / "inventory" / "local.yaml")
    head = run_header(cluster, list(cluster.nodes))
    profile = head["profile"]
    [node] = head["nodes"]
    entries = []
    for name in profile["mandatory"]:
        rows = [{"name": metric_name, "value": 2 * ref["value"], "unit": ref["unit"],
                 "reference": ref, "criterion": "at least half", "margin": 1.0, "ok": True}
                for metric_name, ref in profile["references"].items() if ref["check"] == name]
        entries.append(check(None if name == "uniformity" else node, name, metrics=rows))
    verdict = verdict_of(write_run(tmp_path, entries, head=head))
    assert verdict.status == CERTIFIED, verdict.reasons
    assert verdict.nodes == [{"name": node, "status": "passed", "reasons": []}]


def test_the_header_holds_the_profiles_declared_expectations_as_a_json_object():
    """Only the keys the profile writes, with their values (lists for lists): what results.py reads."""
    cluster = load_inventory(REPO / "inventory" / "local.yaml")
    expect = json.loads(json.dumps(run_header(cluster, list(cluster.nodes))))["profile"]["expect"]
    assert expect == {"os_ids": ["debian", "ubuntu", "rhel", "rocky", "almalinux", "centos", "sles",
                                 "opensuse-leap", "fedora", "amzn"],
                      "kernel_min": "4.18", "pair_low_fraction": 0.75, "training_straggler_fraction": 2.0}


def test_an_unreferenced_metric_of_a_check_that_is_not_mandatory_is_informational(tmp_path):
    """verdict.py: only a *mandatory* metric without a reference makes the run INCOMPLETE."""
    entries = clean_run() + [check("n1", "disk", metrics=[metric("disk_gib", 900, "GiB", judged=False)])]
    assert verdict_of(write_run(tmp_path, entries)).status == CERTIFIED


# NOT CERTIFIED: failed checks


@pytest.mark.parametrize("outcome", ["failed", "error"])
def test_a_failed_check_is_not_certified_and_named(tmp_path, outcome):
    bad = check("n2", "memory", outcome, kind="performance",
                message="memory_total = 1 GiB, expected >= 2 GiB\nsecond line stays in the log",
                metrics=[metric("memory_total", 1, "GiB")])
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), bad)))
    why = "n2: memory failed (performance): memory_total = 1 GiB, expected >= 2 GiB"
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == [why]
    assert verdict.gate_failed is True
    assert node_row(verdict, "n2") == {"name": "n2", "status": "failed", "reasons": [why]}
    assert node_row(verdict, "n1")["status"] == "passed"


def test_checks_that_failed_alike_on_a_node_are_one_reason(tmp_path):
    down = "n2 unreachable: no answer within the connect timeout (10 s)"
    entries = [check(e["node"], e["check"], "failed", kind="unreachable", message=down)
               if e["node"] == "n2" else e for e in clean_run()]
    verdict = verdict_of(write_run(tmp_path, entries))
    assert verdict.reasons == [f"n2: reachable, memory, cpu failed (unreachable): {down}"]
    assert len(node_row(verdict, "n2")["reasons"]) == 3  # the node table keeps each check


@pytest.mark.parametrize("count, named", [
    (5, "reachable, memory, cpu, os, kernel"),
    (6, "reachable, memory, cpu, os, kernel and 1 more check"),
    (8, "reachable, memory, cpu, os, kernel and 3 more checks")])
def test_a_reason_for_many_checks_that_failed_alike_names_the_first_few_and_counts_the_rest(
        tmp_path, count, named):
    down = "n2 unreachable: no answer within the connect timeout (10 s)"
    names = ["reachable", "memory", "cpu", "os", "kernel", "disk", "gpu", "fabric"][:count]
    entries = [*node_checks("n1"), *(check("n2", name, "failed", kind="unreachable", message=down) for name in names),
               check(None, "uniformity")]
    verdict = verdict_of(write_run(tmp_path, entries))
    assert verdict.reasons == [f"n2: {named} failed (unreachable): {down}"]
    assert len(node_row(verdict, "n2")["reasons"]) == count  # the node table keeps each check


def test_in_a_fleet_nodes_that_failed_alike_share_one_reason_named_by_their_hostlist(tmp_path):
    """70 nodes (a fleet: more than FLEET_NODES): three failed memory the same way but for their
    own name, two are unreachable, one failed otherwise, and memory never ran on two others; each
    node's own reasons are kept whole."""
    nodes = [f"gpu{i:04d}" for i in range(1, 71)]
    slow = {"gpu0003", "gpu0013", "gpu0023"}
    down = {"gpu0040", "gpu0041"}
    entries = []
    for node in nodes:
        if node in slow:
            entries += [check(node, "reachable"), check(node, "cpu", metrics=[metric("cpu_cores", 16, "cores")]),
                        check(node, "memory", "failed", kind="expectation", message=f"{node}: 8 DIMMs, not 16")]
        elif node in down:
            # as a rack's nodes go: a second and an address apart
            lost = (f"{node} unreachable: lost at 10:00:0{node[-1]} (NoValidConnectionsError: [Errno None] Unable "
                    f"to connect to port 22 on 10.0.3.{node[-2:]} (after 3 tries)); not tried again")
            entries += [check(node, name, "failed", kind="unreachable", message=lost)
                        for name in ("reachable", "memory", "cpu")]
        elif node in ("gpu0044", "gpu0045"):  # lost in the middle of a command, each at its own second
            cut = f"{node} unreachable: no answer to SSH keepalives for 12 s, 1{node[-1]} s into `python3 - gpu_config`"
            entries += [check(node, "reachable"), check(node, "memory", "failed", kind="unreachable", message=cut)]
        elif node == "gpu0050":
            entries += [*node_checks(node)[:2], check(node, "cpu", "failed", kind="sanity", message="lscpu failed")]
        elif node in ("gpu0060", "gpu0061"):
            entries += [node_checks(node)[0], node_checks(node)[2]]
        else:
            entries += node_checks(node)
    entries.append(check(None, "uniformity"))
    verdict = verdict_of(write_run(tmp_path, entries, head=header(nodes)))
    assert verdict.reasons[:5] == [
        "gpu[0003,0013,0023] (3 nodes): memory failed (expectation): gpu0003: 8 DIMMs, not 16",
        "gpu[0040-0041] (2 nodes): reachable, memory, cpu failed (unreachable): gpu0040 unreachable: lost at "
        "10:00:00 (NoValidConnectionsError: [Errno None] Unable to connect to port 22 on 10.0.3.40 (after 3 tries)); "
        "not tried again",
        "gpu[0044-0045] (2 nodes): memory failed (unreachable): gpu0044 unreachable: no answer to SSH keepalives "
        "for 12 s, 14 s into `python3 - gpu_config`",
        "gpu0050: cpu failed (sanity): lscpu failed",
        "gpu[0060-0061] (2 nodes): mandatory check 'memory' has no result"]
    assert node_row(verdict, "gpu0013")["reasons"] == ["gpu0013: memory failed (expectation): gpu0013: 8 DIMMs, not 16"]


@pytest.mark.parametrize("words, masked", [
    ("gpu7 lost at 10:00:03 (port 22 on 10.0.3.34)", "\0 lost at \0 (port 22 on \0)"),
    ("gpu7 unreachable: port 22 on 2001:db8::a3.", "\0 unreachable: port 22 on \0."),
    ("gpu7 unreachable: [fe80::1%eth0]:22 refused", "\0 unreachable: [\0]:22 refused"),
    ("no answer for 12 s, 14 s into `python3 - gpu_config`", "no answer for 12 s, \0 `python3 - gpu_config`"),
    # a GPU's bus id and a driver's version say which one, not which node: kept
    ("GPU 00000000:17:00.0 fell off the bus (driver 550.54.15)",
     "GPU 00000000:17:00.0 fell off the bus (driver 550.54.15)"),
])
def test_a_nodes_own_words_are_masked_and_which_gpu_is_not(words, masked):
    assert masked_node_words(words, "gpu7") == masked


def test_the_terminal_summary_shows_the_first_reasons_and_warnings_and_counts_the_rest():
    reasons = [f"n{i}: memory failed (performance): slow" for i in range(1, 26)]
    warnings = [f"n{i}: stress_ng stress_cpu = 40 bogo-ops/s, 60% below the median" for i in range(1, 24)]
    lines = terminal_summary(Verdict(NOT_CERTIFIED, reasons, nodes=[], warnings=warnings))
    assert lines == ([f"  - {reason}" for reason in reasons[:REASONS_SHOWN]]
                     + [f"  ... and {25 - REASONS_SHOWN} more (see the report)"]
                     + [f"  - warning, an outlier: {warning}" for warning in warnings[:REASONS_SHOWN]]
                     + [f"  ... and {23 - REASONS_SHOWN} more warnings (see the report)"])
    assert terminal_summary(Verdict(CERTIFIED, ["all 3 checks passed on 1 node(s)"], nodes=[])) == [
        "  - all 3 checks passed on 1 node(s)"]


def test_a_failure_without_a_kind_is_called_an_error(tmp_path):
    bad = check("n1", "reachable", "error", message="ConnectionError: no route to host")
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), bad)))
    assert verdict.reasons == ["n1: reachable failed (error): ConnectionError: no route to host"]


def test_a_failed_cluster_wide_check_is_named_for_the_cluster(tmp_path):
    bad = check(None, "uniformity", "failed", kind="expectation", message="kernel differs: n2")
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), bad)))
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["cluster: uniformity failed (expectation): kernel differs: n2"]
    assert verdict.gate_failed is True
    assert [row["status"] for row in verdict.nodes] == ["passed", "passed"]


def test_failures_come_before_what_is_missing(tmp_path):
    entries = replaced(clean_run(), check("n1", "cpu", "failed", kind="expectation", message="wrong CPU"))
    entries = [e for e in entries if e["test_id"] != f"{MODULE}::test_memory[n2]"]
    verdict = verdict_of(write_run(tmp_path, entries))
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["n1: cpu failed (expectation): wrong CPU",
                               "n2: mandatory check 'memory' has no result"]
    assert node_row(verdict, "n1")["status"] == "failed"
    assert node_row(verdict, "n2")["status"] == "incomplete"


def test_a_node_that_failed_and_is_incomplete_is_failed(tmp_path):
    entries = replaced(clean_run(), check("n1", "cpu", "failed", kind="expectation", message="wrong CPU"))
    entries = replaced(entries, check("n1", "memory", "skipped", message="no meminfo"))
    verdict = verdict_of(write_run(tmp_path, entries))
    assert node_row(verdict, "n1") == {"name": "n1", "status": "failed",
                                       "reasons": ["n1: cpu failed (expectation): wrong CPU"]}


# INCOMPLETE: mandatory checks skipped or missing


def test_a_mandatory_check_skipped_on_one_node_is_incomplete(tmp_path):
    skipped = check("n2", "memory", "skipped", message="no /proc/meminfo\non this kernel")
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), skipped)))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == ["n2: mandatory check 'memory' skipped: no /proc/meminfo"]
    assert verdict.gate_failed is False
    assert node_row(verdict, "n2") == {
        "name": "n2", "status": "incomplete",
        "reasons": ["mandatory check 'memory' skipped: no /proc/meminfo"]}
    assert node_row(verdict, "n1")["status"] == "passed"


def test_a_skipped_check_that_is_not_mandatory_does_not_block(tmp_path):
    entries = replaced(clean_run(), check("n1", "cpu", "skipped", message="not on this SKU"))
    assert verdict_of(write_run(tmp_path, entries)).status == CERTIFIED


def test_a_mandatory_check_without_any_result_is_incomplete(tmp_path):
    entries = [e for e in clean_run() if e["check"] != "memory"]
    verdict = verdict_of(write_run(tmp_path, entries, planned=clean_run(), end=None))
    assert verdict.status == INCOMPLETE
    assert "mandatory check 'memory' has no result" in verdict.reasons
    assert verdict.gate_failed is False
    assert [node_row(verdict, n)["status"] for n in NODES] == ["incomplete", "incomplete"]


def test_a_mandatory_check_the_selection_left_out_says_so(tmp_path):
    """-m soak alone, say: the run is incomplete for a delivery, and the reason says why."""
    entries = [e for e in clean_run() if e["check"] != "memory"]
    verdict = verdict_of(write_run(tmp_path, entries))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == ["mandatory check 'memory' has no result: -m/-k did not select it "
                               "(a delivery's run needs it)"]


def test_a_mandatory_check_missing_on_one_node_names_that_node(tmp_path):
    entries = [e for e in clean_run() if e["test_id"] != f"{MODULE}::test_reachable[n1]"]
    verdict = verdict_of(write_run(tmp_path, entries))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == ["n1: mandatory check 'reachable' has no result"]
    assert node_row(verdict, "n1") == {"name": "n1", "status": "incomplete",
                                       "reasons": ["mandatory check 'reachable' has no result"]}
    assert node_row(verdict, "n2")["status"] == "passed"


def test_a_cluster_wide_mandatory_check_satisfies_every_node(tmp_path):
    profile = {**PROFILE, "mandatory": ["reachable", "uniformity"]}
    nodes = ["n1", "n2", "n3"]
    entries = [check(n, "reachable") for n in nodes] + [check(None, "uniformity")]
    verdict = verdict_of(write_run(tmp_path, entries, head=header(nodes, profile)))
    assert verdict.status == CERTIFIED, verdict.reasons
    assert [row["status"] for row in verdict.nodes] == ["passed"] * 3


def test_a_skipped_cluster_wide_mandatory_check_is_incomplete(tmp_path):
    skipped = check(None, "uniformity", "skipped", message="no node answered the system probe")
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), skipped)))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == [
        "cluster: mandatory check 'uniformity' skipped: no node answered the system probe"]
    assert verdict.gate_failed is False


def test_a_mandatory_metric_without_a_reference_is_incomplete(tmp_path):
    unjudged = check("n1", "memory", metrics=[metric("memory_total", 31.2, "GiB"),
                                              metric("swap_total", 8, "GiB", judged=False)])
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), unjudged)))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == ["n1: mandatory check 'memory': no reference for swap_total"]
    assert verdict.gate_failed is False
    assert node_row(verdict, "n1")["status"] == "incomplete"
    assert "no reference" in node_row(verdict, "n1")["reasons"][0]


def test_a_cluster_wide_mandatory_metric_without_a_reference_is_incomplete(tmp_path):
    unjudged = check(None, "uniformity", metrics=[metric("kernel_versions", 1, "count", judged=False)])
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), unjudged)))
    assert verdict.status == INCOMPLETE
    assert any("no reference for kernel_versions" in reason for reason in verdict.reasons)


# NOT CERTIFIED: a referenced metric that was not measured


@pytest.mark.parametrize("metrics", [[], [metric("memory_total", None, "GiB")]],
                         ids=["metric-absent", "metric-value-null"])
def test_a_passed_check_without_its_referenced_metric_is_not_certified(tmp_path, metrics):
    unmeasured = check("n2", "memory", metrics=metrics)
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), unmeasured)))
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["n2: memory: metric 'memory_total' has a reference but no measurement"]
    assert verdict.gate_failed is True
    assert node_row(verdict, "n2") == {
        "name": "n2", "status": "failed",
        "reasons": ["memory: metric 'memory_total' has a reference but no measurement"]}


def test_a_referenced_metric_is_required_of_checks_that_are_not_mandatory_too(tmp_path):
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), check("n1", "cpu"))))
    assert "cpu" not in PROFILE["mandatory"]
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["n1: cpu: metric 'cpu_cores' has a reference but no measurement"]


# Nodes without results


def test_a_node_without_any_entry_is_untested_and_fails_the_gate(tmp_path):
    nodes = ["n1", "n2", "n3"]
    verdict = verdict_of(write_run(tmp_path, clean_run(NODES), head=header(nodes)))
    assert verdict.status != CERTIFIED
    assert verdict.status == INCOMPLETE
    assert verdict.reasons[0] == "1 node(s) without any result: n3"
    assert "n3: mandatory check 'reachable' has no result" in verdict.reasons
    assert verdict.untested_nodes == ["n3"]
    assert verdict.gate_failed is True
    assert node_row(verdict, "n3") == {"name": "n3", "status": "untested",
                                       "reasons": ["no check has a result"]}


def test_a_run_without_any_check_is_incomplete_and_fails_the_gate(tmp_path):
    verdict = verdict_of(write_run(tmp_path, []))
    assert verdict.status == INCOMPLETE
    assert verdict.untested_nodes == NODES
    assert verdict.gate_failed is True
    assert [row["status"] for row in verdict.nodes] == ["untested", "untested"]


def test_node_statuses_passed_failed_incomplete_untested_in_inventory_order(tmp_path):
    nodes = ["d", "c", "b", "a"]
    entries = (node_checks("d") + node_checks("c") + node_checks("b") + [check(None, "uniformity")])
    entries = replaced(entries, check("c", "memory", "failed", kind="performance", message="slow"))
    entries = replaced(entries, check("b", "reachable", "skipped", message="maintenance"))
    verdict = verdict_of(write_run(tmp_path, entries, head=header(nodes)))
    assert [(row["name"], row["status"]) for row in verdict.nodes] == [
        ("d", "passed"), ("c", "failed"), ("b", "incomplete"), ("a", "untested")]
    assert verdict.status == NOT_CERTIFIED


# Planned tests and interrupted runs


def test_planned_tests_without_results_are_incomplete(tmp_path):
    entries = clean_run()
    planned = entries + [check("n1", "kernel"), check("n2", "kernel")]
    verdict = verdict_of(write_run(tmp_path, entries, planned=planned))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == [
        f"2 planned check(s) have no result, e.g. {MODULE}::test_kernel[n1]"]
    assert verdict.gate_failed is False


def test_a_run_without_an_end_entry_is_interrupted_and_incomplete(tmp_path):
    record = read_ledger(write_run(tmp_path, clean_run(), end=None))
    results, verdict = build_results(record)
    assert record.interrupted is True
    assert results["run"]["interrupted"] is True
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == ["the run was interrupted before it finished"]
    assert verdict.gate_failed is False


def test_an_end_entry_marked_interrupted_is_interrupted(tmp_path):
    end = {**END, "exitstatus": 2, "interrupted": True}
    verdict = verdict_of(write_run(tmp_path, clean_run(), end=end))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons[0] == "the run was interrupted before it finished"


def test_an_interrupted_run_with_a_failure_is_not_certified(tmp_path):
    entries = replaced(clean_run(), check("n1", "memory", "failed", kind="performance", message="slow",
                                          metrics=[metric("memory_total", 1, "GiB")]))
    verdict = verdict_of(write_run(tmp_path, entries, end=None))
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["n1: memory failed (performance): slow",
                               "the run was interrupted before it finished"]
    assert verdict.gate_failed is True


def test_interrupted_untested_and_unplanned_reasons_together(tmp_path):
    nodes = ["n1", "n2"]
    entries = node_checks("n1")
    verdict = verdict_of(write_run(tmp_path, entries, head=header(nodes),
                                   planned=entries + node_checks("n2"), end=None))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons[:2] == ["the run was interrupted before it finished",
                                   "1 node(s) without any result: n2"]
    assert "3 planned check(s) have no result, e.g. " \
           f"{MODULE}::test_reachable[n2]" in verdict.reasons
    assert ("mandatory check 'uniformity' has no result: -m/-k did not select it (a delivery's run needs it)"
            in verdict.reasons)


# Re-runs


def test_a_later_passing_entry_for_the_same_test_replaces_a_failure(tmp_path):
    entries = clean_run()
    failed = check("n1", "memory", "failed", kind="performance", message="slow",
                   metrics=[metric("memory_total", 1, "GiB")])
    verdict = verdict_of(write_run(tmp_path, [failed] + entries))
    assert verdict.status == CERTIFIED, verdict.reasons


def test_a_later_failing_entry_for_the_same_test_replaces_a_pass(tmp_path):
    failed = check("n1", "memory", "failed", kind="performance", message="slow",
                   metrics=[metric("memory_total", 1, "GiB")])
    verdict = verdict_of(write_run(tmp_path, clean_run() + [failed]))
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["n1: memory failed (performance): slow"]


# Edge cases found while writing these tests


@pytest.mark.parametrize("skipped_first", [True, False],
                         ids=["skipped-variant-first", "skipped-variant-last"])
def test_a_skipped_variant_of_a_mandatory_check_on_a_node_is_incomplete(tmp_path, skipped_first):
    """A mandatory check parametrized beyond the node (test_memory[n1-dimm0]) has several entries."""
    variants = [check("n1", "memory", "skipped", message="dimm0 not readable",
                      test_id=f"{MODULE}::test_memory[n1-dimm0]"),
                check("n1", "memory", metrics=[metric("memory_total", 31.2, "GiB")],
                      test_id=f"{MODULE}::test_memory[n1-dimm1]")]
    if not skipped_first:
        variants.reverse()
    entries = [e for e in clean_run() if e["test_id"] != f"{MODULE}::test_memory[n1]"] + variants
    verdict = verdict_of(write_run(tmp_path, entries))
    assert verdict.status == INCOMPLETE
    assert verdict.reasons == ["n1: mandatory check 'memory' skipped: dimm0 not readable"]


def test_a_failed_check_with_a_blank_message_is_still_not_certified(tmp_path):
    bad = check("n1", "memory", "failed", kind="performance", message="\n",
                metrics=[metric("memory_total", 1, "GiB")])
    verdict = verdict_of(write_run(tmp_path, replaced(clean_run(), bad)))
    assert verdict.status == NOT_CERTIFIED
    assert verdict.reasons == ["n1: memory failed (performance): "]


# judge() on its own


def test_judge_with_an_empty_profile_needs_only_results_on_every_node():
    checks = [check("n1", "anything"), check("n2", "anything")]
    verdict = judge({}, NODES, checks, planned=[], interrupted=False)
    assert verdict.status == CERTIFIED
    assert verdict.reasons == ["all 2 checks passed on 2 node(s)"]


def test_judge_ignores_results_of_nodes_outside_the_selection_for_node_rows():
    checks = [check("n1", "anything"), check("n9", "anything")]
    verdict = judge({}, ["n1"], checks, planned=[], interrupted=False)
    assert verdict.nodes == [{"name": "n1", "status": "passed", "reasons": []}]
    assert verdict.status == CERTIFIED
