"""The renderings of a ledger: junit.xml (parsed back with xml.etree), results.json and metrics.csv."""
from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import pytest

from reports.junit import JUNIT_FILE, render_junit, write_junit
from reports.ledger import Ledger, now_iso, read_ledger
from reports.results import METRICS_CSV, RESULTS_FILE, RESULTS_SCHEMA, build_results, write_metrics_csv, write_results
from reports.schema import SchemaError

MODULE = "suites/test_system.py"
CLASSNAME = "suites.test_system"
REFERENCES = {"memory_total": {"check": "memory", "value": 4.0, "lower": -0.5, "upper": None,
                               "unit": "GiB", "source": "smoke floor"}}
PROFILE = {"name": "test-profile", "description": "junit test profile",
           "mandatory": ["reachable", "memory"], "expect": {}, "references": REFERENCES}
END = {"type": "end", "finished": "2030-01-01T00:10:00+00:00", "exitstatus": 0, "interrupted": False}
CSV_COLUMNS = ["run_id", "cluster", "node", "check", "metric", "value", "unit", "criterion",
               "margin", "ok"]


def header(nodes) -> dict:
    return {"cluster": "testcluster", "profile": PROFILE,
            "inventory": {"path": "/inventory/testcluster.yaml", "sha256": "f" * 64},
            "harness": {"version": "0.1.0", "commit": "abc1234"},
            "argv": ["pytest", "--inventory", "inventory/testcluster.yaml"], "nodes": list(nodes)}


def memory(value: Optional[float], ok: Optional[bool] = True) -> dict:
    return {"name": "memory_total", "value": value, "unit": "GiB",
            "reference": {k: v for k, v in REFERENCES["memory_total"].items() if k != "check"},
            "criterion": ">= 2 GiB", "margin": None if value is None else (value - 2) / 2, "ok": ok}


def check(node: Optional[str], name: str, outcome: str = "passed", *, kind: Optional[str] = None,
          message: str = "", log: str = "", metrics: Optional[list] = None,
          duration: Optional[float] = 1.5) -> dict:
    test_id = f"{MODULE}::test_{name}[{node}]" if node else f"{MODULE}::test_{name}"
    return {"type": "check", "test_id": test_id, "check": name, "area": "system",
            "depth": ["quick"], "node": node, "outcome": outcome, "kind": kind, "message": message,
            "log_excerpt": log, "duration_s": duration, "finished": now_iso(),
            "raw": [f"raw/system_facts/{node}.stdout"] if node else [], "metrics": metrics or []}


def clean(node: str) -> list[dict]:
    return [check(node, "reachable"), check(node, "memory", metrics=[memory(16.0)])]


def write_run(tmp_path: Path, entries: list[dict], nodes=("n1", "n2"), *, selected=None,
              tools=(), end: Optional[dict] = END) -> Path:
    ledger = Ledger.create(tmp_path / "out", "testcluster", header(nodes))
    for tool in tools:
        ledger.append({"type": "tool", **tool})
    if selected is not None:
        ledger.append({"type": "selection", "nodes": list(selected),
                       "tests": [e["test_id"] for e in entries]})
    for entry in entries:
        ledger.append(entry)
    if end is not None:
        ledger.append(end)
    return ledger.run_dir


def results_of(run_dir: Path, signer: Optional[dict] = None) -> dict:
    return build_results(read_ledger(run_dir), signer)[0]


def parse(results: dict) -> ET.Element:
    root = ET.fromstring(render_junit(results))
    assert root.tag == "testsuites"
    [suite] = list(root)
    assert suite.tag == "testsuite"
    return suite


def cases(suite: ET.Element) -> dict[str, ET.Element]:
    found = {case.get("name"): case for case in suite.iter("testcase")}
    assert len(found) == len(suite.findall("testcase"))
    return found


def outcome_of(case: ET.Element) -> str:
    children = [child.tag for child in case]
    assert len(children) <= 1
    return children[0] if children else "passed"


MIXED = [check("n1", "reachable"),
         check("n2", "reachable", "error", message="TimeoutError: 30 s\nwhile connecting",
               log="Traceback (most recent call last):\n  ...\nTimeoutError: 30 s"),
         check("n1", "memory", metrics=[memory(16.0)]),
         check("n2", "memory", "failed", kind="performance",
               message="memory_total = 1 GiB, expected >= 2 GiB\nsee the log",
               log="MemTotal: 1048576 kB", metrics=[memory(1.0, ok=False)]),
         check("n1", "cpu", "skipped", message="no cpu probe on this SKU"),
         check(None, "uniformity", duration=None)]


# junit.xml


def test_testcase_names_are_the_pytest_ids_after_the_module(tmp_path):
    nodes = ("n1", "n2", "n3")
    suite = parse(results_of(write_run(tmp_path, MIXED, nodes)))
    assert set(cases(suite)) == {
        "test_reachable[n1]", "test_reachable[n2]", "test_memory[n1]", "test_memory[n2]",
        "test_cpu[n1]", "test_uniformity", "results[n3]", "certification"}
    for entry in MIXED:
        assert entry["test_id"].split("::", 1)[1] in cases(suite)


def test_testcase_classnames_and_times(tmp_path):
    found = cases(parse(results_of(write_run(tmp_path, MIXED, ("n1", "n2", "n3")))))
    for name in ("test_reachable[n1]", "test_memory[n2]", "test_uniformity"):
        assert found[name].get("classname") == CLASSNAME
    assert found["test_memory[n1]"].get("time") == "1.500"
    assert found["test_uniformity"].get("time") == "0.000"
    assert found["results[n3]"].get("classname") == "handover"
    assert found["certification"].get("classname") == "handover"


def test_suite_counts_match_the_outcomes(tmp_path):
    suite = parse(results_of(write_run(tmp_path, MIXED, ("n1", "n2", "n3"))))
    found = cases(suite)
    tally = {"passed": 0, "failure": 0, "error": 0, "skipped": 0}
    for case in found.values():
        tally[outcome_of(case)] += 1
    assert suite.get("tests") == str(len(found)) == "8"
    assert suite.get("failures") == str(tally["failure"]) == "3"  # memory[n2], results[n3], certification
    assert suite.get("errors") == str(tally["error"]) == "1"
    assert suite.get("skipped") == str(tally["skipped"]) == "1"
    assert suite.get("name") == "handover.testcluster"
    assert suite.get("timestamp") == read_ledger(
        next((tmp_path / "out" / "testcluster").glob("2*"))).header["started"]


def test_a_failed_check_is_a_failure_with_its_kind_and_log(tmp_path):
    found = cases(parse(results_of(write_run(tmp_path, MIXED))))
    [failure] = list(found["test_memory[n2]"])
    assert failure.tag == "failure"
    assert failure.get("message") == "[performance] memory_total = 1 GiB, expected >= 2 GiB"
    assert failure.text == "MemTotal: 1048576 kB"


def test_an_errored_check_is_an_error_with_its_log(tmp_path):
    found = cases(parse(results_of(write_run(tmp_path, MIXED))))
    [error] = list(found["test_reachable[n2]"])
    assert error.tag == "error"
    assert error.get("message") == "TimeoutError: 30 s"
    assert error.text.startswith("Traceback")


def test_without_a_log_excerpt_the_message_is_the_text(tmp_path):
    entries = clean("n1") + [check("n2", "reachable", "failed", kind="expectation",
                                   message="wrong hostname\nn2 answered as n3")]
    found = cases(parse(results_of(write_run(tmp_path, entries))))
    [failure] = list(found["test_reachable[n2]"])
    assert failure.get("message") == "[expectation] wrong hostname"
    assert failure.text == "wrong hostname\nn2 answered as n3"


def test_a_skipped_check_is_skipped_with_its_reason(tmp_path):
    found = cases(parse(results_of(write_run(tmp_path, MIXED))))
    [skipped] = list(found["test_cpu[n1]"])
    assert skipped.tag == "skipped"
    assert skipped.get("message") == "no cpu probe on this SKU"
    assert outcome_of(found["test_reachable[n1]"]) == "passed"
    assert outcome_of(found["test_uniformity"]) == "passed"


def test_an_untested_node_is_a_failing_testcase(tmp_path):
    found = cases(parse(results_of(write_run(tmp_path, clean("n1") + clean("n2"), ("n1", "n2", "n3")))))
    [failure] = list(found["results[n3]"])
    assert failure.tag == "failure"
    assert failure.get("message") == "no check has a result for this node"
    assert "results[n1]" not in found and "results[n2]" not in found


def test_a_run_without_results_still_shows_every_node(tmp_path):
    suite = parse(results_of(write_run(tmp_path, [], ("n1", "n2"), end=None)))
    found = cases(suite)
    assert set(found) == {"results[n1]", "results[n2]", "certification"}
    assert suite.get("failures") == "3"


def test_the_certification_testcase_passes_when_certified(tmp_path):
    suite = parse(results_of(write_run(tmp_path, clean("n1") + clean("n2"))))
    found = cases(suite)
    assert outcome_of(found["certification"]) == "passed"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "5", "0", "0", "0")


@pytest.mark.parametrize("entries,end,status", [
    (clean("n1") + [check("n2", "reachable", "failed", kind="expectation", message="down"),
                    check("n2", "memory", metrics=[memory(16.0)])], END, "NOT CERTIFIED"),
    (clean("n1") + clean("n2"), None, "INCOMPLETE"),
    (clean("n1") + [check("n2", "reachable", "skipped", message="maintenance"),
                    check("n2", "memory", metrics=[memory(16.0)])], END, "INCOMPLETE"),
], ids=["not-certified", "interrupted", "mandatory-skipped"])
def test_the_certification_testcase_fails_unless_certified(tmp_path, entries, end, status):
    results = results_of(write_run(tmp_path, entries, end=end))
    assert results["verdict"]["status"] == status
    [failure] = list(cases(parse(results))["certification"])
    assert failure.tag == "failure"
    assert failure.get("message") == status
    assert failure.text == "\n".join(results["verdict"]["reasons"])


def test_control_characters_in_messages_still_make_parseable_xml(tmp_path):
    ansi = "\x1b[31mFAILED\x1b[0m: bad\x00byte \x07bell \ud800lone"
    entries = [check("n1", "reachable", "failed", kind="expectation", message=ansi,
                     log=f"log {ansi}\nmore\x1b[K \x0bvt \x0cff"),
               check("n1", "memory", "error", message=ansi, metrics=[memory(16.0)]),
               check("n2", "reachable", "skipped", message=ansi),
               check("n2", "memory", metrics=[memory(16.0)])]
    run_dir = write_run(tmp_path, entries)
    path = write_junit(results_of(run_dir), run_dir)
    assert path == run_dir / JUNIT_FILE
    suite = ET.parse(path).getroot().find("testsuite")
    found = cases(suite)
    texts = []
    for name in ("test_reachable[n1]", "test_memory[n1]", "test_reachable[n2]", "certification"):
        [element] = list(found[name])
        texts += [element.get("message"), element.text or ""]
    assert any("FAILED" in text for text in texts)
    for text in texts:
        for bad in ("\x1b", "\x00", "\x07", "\x0b", "\x0c", "\ud800"):
            assert bad not in text
    [failure] = list(found["test_reachable[n1]"])
    assert failure.get("message") == ("[expectation] \ufffd[31mFAILED\ufffd[0m: bad\ufffdbyte "
                                      "\ufffdbell \ufffdlone")
    assert failure.text.startswith("log \ufffd[31mFAILED")


def test_write_junit_declares_utf8_and_keeps_unicode(tmp_path):
    entries = clean("n1") + [check("n2", "reachable", "failed", kind="expectation",
                                   message="température ≥ 90 °C"),
                             check("n2", "memory", metrics=[memory(16.0)])]
    run_dir = write_run(tmp_path, entries)
    path = write_junit(results_of(run_dir), run_dir)
    assert path.read_bytes().startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    [failure] = list(cases(ET.parse(path).getroot().find("testsuite"))["test_reachable[n2]"])
    assert failure.get("message") == "[expectation] température ≥ 90 °C"


def as_elementtree_writes_it(document: bytes) -> bytes:
    root = ET.fromstring(document)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def test_junit_xml_is_byte_for_byte_what_elementtree_writes(tmp_path):
    """render_junit writes strings, not a tree: read back and written again by ElementTree, the
    document is unchanged (escapes, indentation, empty elements, properties, outliers)."""
    nodes = [f"n{i}" for i in range(1, 6)]
    tricky = 'a "quoted" <tag> & more\twith a tab\nsecond line, température ≥ 90 °C'
    stress = [check(node, "stress_ng", metrics=[{"name": "stress_cpu", "value": value, "unit": "bogo-ops/s",
                                                 "reference": None, "criterion": None, "margin": None, "ok": None}])
              for node, value in zip(nodes, [100.0, 101.0, 99.0, 100.0, 40.0], strict=True)]
    entries = stress + [
        {**check("n1", "reachable", "failed", kind="expectation", message=tricky, log=tricky), "action": tricky},
        {**check("n2", "reachable", "failed", kind="expectation", message=tricky),
         "waived": {"owner": "ops@example.com", "reason": tricky}},
        check("n3", "reachable", "error", message=tricky),
        check("n4", "reachable", "skipped", message=tricky),
        *clean("n5")]
    results = results_of(write_run(tmp_path, entries, (*nodes, "n6")))
    assert results["outliers"] and any(entry.get("waived") for entry in results["checks"])
    document = render_junit(results)
    assert document == as_elementtree_writes_it(document)


# results.json


def test_results_document(tmp_path):
    tools = [{"node": "n1", "tool": "python", "version": "3.11.2", "path": "/usr/bin/python3"},
             {"node": "n2", "tool": "python", "version": "3.12.0"}]
    run_dir = write_run(tmp_path, MIXED, ("n1", "n2", "n3"), selected=("n1", "n2"), tools=tools)
    header_line = json.loads((run_dir / "ledger.jsonl").read_text(encoding="utf-8").splitlines()[0])
    signer = {"fingerprint": "SHA256:abc", "public_key": "ssh-ed25519 AAAA operator@example.com"}
    results, verdict = build_results(read_ledger(run_dir), signer)
    assert results["schema"] == RESULTS_SCHEMA == "handover.results/1"
    run = results["run"]
    assert run == {
        "run_id": run_dir.name, "cluster": "testcluster", "profile": "test-profile",
        "profile_description": "junit test profile",
        "inventory": {"path": "/inventory/testcluster.yaml", "sha256": "f" * 64},
        "harness": {"version": "0.1.0", "commit": "abc1234"},
        "started": header_line["started"], "finished": END["finished"], "interrupted": False,
        "argv": ["pytest", "--inventory", "inventory/testcluster.yaml"],
        "nodes": ["n1", "n2"],
        "tools": [{"node": "n1", "tool": "python", "version": "3.11.2"},
                  {"node": "n2", "tool": "python", "version": "3.12.0"}],
        "report_id": f"testcluster-{run_dir.name}", "cluster_id": "testcluster",
        "sign_off": {"engineer": None, "customer": None}, "waivers": [], "expect_overrides": [], "unlocked": [],
        "dropped": []}
    assert results["signer"] == signer
    assert results["verdict"] == {"status": verdict.status, "reasons": verdict.reasons,
                                  "cluster_checks": verdict.cluster_checks, "waived": 0}
    assert results["verdict"]["status"] == "NOT CERTIFIED"
    # each node row as the verdict judged it, with where the inventory found and placed the node
    # (none named here)
    assert results["nodes"] == [{**row, "source": None, "rack": None, "leaf": None} for row in verdict.nodes]
    assert [row["name"] for row in results["nodes"]] == ["n1", "n2"]
    assert [c["test_id"] for c in results["checks"]] == [e["test_id"] for e in MIXED]
    assert results["checks"][0] == {k: v for k, v in MIXED[0].items() if k != "type"}
    assert all("type" not in c for c in results["checks"])


def test_results_nodes_come_from_the_header_without_a_selection(tmp_path):
    results = results_of(write_run(tmp_path, clean("n1"), ("n1", "n2")))
    assert results["run"]["nodes"] == ["n1", "n2"]
    assert [row["name"] for row in results["nodes"]] == ["n1", "n2"]
    assert results["nodes"][1]["status"] == "untested"


def test_results_without_a_signer_has_no_signer_key(tmp_path):
    results = results_of(write_run(tmp_path, clean("n1") + clean("n2")))
    assert "signer" not in results
    assert results["run"]["tools"] == []
    assert results["verdict"]["status"] == "CERTIFIED"


def test_results_of_an_interrupted_run(tmp_path):
    results = results_of(write_run(tmp_path, clean("n1") + clean("n2"), end=None))
    assert results["run"]["finished"] is None
    assert results["run"]["interrupted"] is True
    assert results["verdict"]["status"] == "INCOMPLETE"


def test_write_results_round_trips(tmp_path):
    recorded = [{**entry, "duration_s": entry["duration_s"] or 0.0} for entry in MIXED]  # as recorded
    run_dir = write_run(tmp_path, recorded)
    results = results_of(run_dir, {"fingerprint": "SHA256:x", "public_key": "ssh-ed25519 AAAA"})
    path = write_results(results, run_dir)
    assert path == run_dir / RESULTS_FILE
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    assert json.loads(text) == results


def test_a_results_document_off_its_schema_is_not_written(tmp_path):
    """A harness bug (here a missing duration) fails loudly instead of reaching a customer."""
    run_dir = write_run(tmp_path, MIXED)
    with pytest.raises(SchemaError, match=r"results\.json: checks\[5\]\.duration_s: None is not of type"):
        write_results(results_of(run_dir), run_dir)
    assert not (run_dir / RESULTS_FILE).exists()


# metrics.csv


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_metrics_csv_has_one_row_per_metric(tmp_path):
    cluster_metric = {"name": "kernel_versions", "value": 1, "unit": "count", "reference": None,
                      "criterion": None, "margin": None, "ok": None}
    entries = [check("n1", "memory", metrics=[memory(16.0), {**memory(None, ok=False), "name": "swap"}]),
               check("n2", "memory", "failed", kind="performance", message="low",
                     metrics=[memory(1.0, ok=False)]),
               check("n1", "reachable"),
               check(None, "uniformity", metrics=[cluster_metric])]
    run_dir = write_run(tmp_path, entries)
    results = results_of(run_dir)
    path = write_metrics_csv(results, run_dir)
    assert path == run_dir / METRICS_CSV
    columns, rows = read_csv(path)
    assert columns == CSV_COLUMNS
    assert len(rows) == sum(len(c["metrics"]) for c in results["checks"]) == 4
    assert [(r["node"], r["check"], r["metric"]) for r in rows] == [
        ("n1", "memory", "memory_total"), ("n1", "memory", "swap"),
        ("n2", "memory", "memory_total"), ("cluster", "uniformity", "kernel_versions")]
    assert all(r["run_id"] == run_dir.name and r["cluster"] == "testcluster" for r in rows)
    first = rows[0]
    assert float(first["value"]) == 16.0
    assert (first["unit"], first["criterion"], float(first["margin"]), first["ok"]) == (
        "GiB", ">= 2 GiB", 7.0, "True")
    assert (rows[1]["value"], rows[1]["ok"]) == ("", "False")
    assert (rows[3]["criterion"], rows[3]["margin"], rows[3]["ok"]) == ("", "", "")


def test_metrics_csv_without_metrics_has_only_the_header(tmp_path):
    run_dir = write_run(tmp_path, [check("n1", "reachable"), check("n2", "reachable")])
    path = write_metrics_csv(results_of(run_dir), run_dir)
    assert path.read_text(encoding="utf-8").splitlines() == [",".join(CSV_COLUMNS)]
