"""junit.xml rendered from results.json, so CI systems show every node and check.

Test case names equal pytest's ids (test_memory[node07]); nodes without any result and the
verdict itself are test cases too, so a run where nodes vanished never looks green.

A failure's text ends with what to do next; a waived failure is a <skipped> case whose message
names the waiver and the failure: Jenkins, GitLab and GitHub's test reporters all list skipped
cases with their message, apart from passes, and a waiver must not turn the pipeline red when
the gate (pytest's exit status) is green. Both carry <properties> (handover.action,
handover.waived_owner, handover.waived_reason) for tools that read them.

An outlier (results.json's outliers: a node's figure far from its peers') is carried by the
node's test case of that check: a property handover.outlier.<metric> and a line in its
<system-out>, so a passing case still shows it; an outlier the profile fails is a <failure>.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from reports.files import write_atomically
from reports.verdict import outlier_line

JUNIT_FILE = "junit.xml"

# Characters XML 1.0 cannot carry (tool output has ANSI escapes and the odd NUL).
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def render_junit(results: dict) -> bytes:
    run = results["run"]
    suite = ET.Element("testsuite", name=f"handover.{run['cluster']}", timestamp=run["started"] or "")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    standing_out: dict[tuple, list[dict]] = {}
    for outlier in results.get("outliers") or []:
        standing_out.setdefault((outlier["check"], outlier["node"], outlier.get("rail")), []).append(outlier)
    for check in results["checks"]:
        module, _, name = check["test_id"].rpartition("::")
        case = _case(suite, counts, module.removesuffix(".py").replace("/", "."), _xml_text(name),
                     check.get("duration_s") or 0)
        message = check.get("message") or ""
        evidence = check.get("log_excerpt") or message
        action = check.get("action") or ""
        waived = check.get("waived") if check["outcome"] in ("failed", "error") else None
        if isinstance(waived, dict):
            _properties(case, {"handover.action": action, "handover.waived_owner": waived.get("owner"),
                               "handover.waived_reason": waived.get("reason")})
            _outcome(case, counts, "skipped",
                     f"waived ({waived.get('owner')}: {waived.get('reason')}); failed "
                     f"[{check.get('kind')}] {message}", _with_action(evidence, action))
        elif check["outcome"] == "failed":
            _properties(case, {"handover.action": action})
            _outcome(case, counts, "failure", f"[{check.get('kind')}] {message}", _with_action(evidence, action))
        elif check["outcome"] == "error":
            _properties(case, {"handover.action": action})
            _outcome(case, counts, "error", message, _with_action(evidence, action))
        elif check["outcome"] == "skipped":
            _outcome(case, counts, "skipped", message, "")
        found = standing_out.get((check["check"], check.get("node"), check.get("rail"))) if check.get("node") else None
        if found:
            _outliers(case, counts, found, check["outcome"] == "passed")
    for node in results["nodes"]:
        if node["status"] == "untested":
            case = _case(suite, counts, "handover", f"results[{node['name']}]", 0)
            _outcome(case, counts, "failure", "no check has a result for this node", "")
    verdict = results["verdict"]
    case = _case(suite, counts, "handover", "certification", 0)
    if verdict["status"] != "CERTIFIED":
        _outcome(case, counts, "failure", verdict["status"], "\n".join(verdict["reasons"]))
    if verdict.get("warnings"):
        ET.SubElement(case, "system-out").text = _xml_text(
            "\n".join(f"warning: outlier {line}" for line in verdict["warnings"]))
    for key, value in counts.items():
        suite.set(key, str(value))
    return _document(suite)


def _document(suite: ET.Element) -> bytes:
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _case(suite, counts, classname, name, seconds) -> ET.Element:
    counts["tests"] += 1
    return ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")


def _with_action(text: str, action: str) -> str:
    return f"{text}\n\nwhat to do next: {action}" if action else text


def _properties(case: ET.Element, values: dict) -> None:
    """<properties> of a test case, as pytest's record_property writes them; empty values left out."""
    given = {name: str(value) for name, value in values.items() if value}
    if given:
        properties = ET.SubElement(case, "properties")
        for name, value in given.items():
            ET.SubElement(properties, "property", name=name, value=_xml_text(value))


def _outliers(case: ET.Element, counts: dict, found: list[dict], passed: bool) -> None:
    """A case's outliers: properties, system-out, and a <failure> for a passed case whose
    outlier the profile fails (a case that failed already says so)."""
    lines = [("failure" if o.get("severity") == "failure" else "warning") + ": outlier " + outlier_line(o)
             for o in found]
    properties = case.find("properties")
    if properties is None:
        properties = ET.Element("properties")
        case.insert(0, properties)
    for outlier, line in zip(found, lines, strict=True):
        ET.SubElement(properties, "property", name=f"handover.outlier.{outlier['metric']}",
                      value=_xml_text(line))
    failing = [line for outlier, line in zip(found, lines, strict=True) if outlier.get("severity") == "failure"]
    if passed and failing:
        _outcome(case, counts, "failure", f"[outlier] {failing[0]}", "\n".join(failing))
    ET.SubElement(case, "system-out").text = _xml_text("\n".join(lines))


def _outcome(case, counts, tag, message, text) -> None:
    counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[tag]] += 1
    first_line = message.splitlines()[0] if message else ""
    element = ET.SubElement(case, tag, message=_xml_text(first_line))
    element.text = _xml_text(text)


def write_junit(results: dict, run_dir: Path) -> Path:
    return write_atomically(Path(run_dir) / JUNIT_FILE, render_junit(results))
