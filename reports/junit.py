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
from dataclasses import dataclass, field
from pathlib import Path

from reports.files import write_atomically
from reports.verdict import outlier_line

JUNIT_FILE = "junit.xml"

# Characters XML 1.0 cannot carry (tool output has ANSI escapes and the odd NUL).
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# What an attribute value escapes beyond text's &, < and >, in ElementTree's order and spelling.
_ATTRIBUTE_REFERENCES = (('"', "&quot;"), ("\r", "&#13;"), ("\n", "&#10;"), ("\t", "&#09;"))
_TEXT_SPECIAL = re.compile("[&<>]")
_ATTRIBUTE_SPECIAL = re.compile('[&<>"\r\n\t]')


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


@dataclass
class _Case:
    """One <testcase>: its properties come first, then what was added to it, in order."""

    attributes: str
    properties: list[str] = field(default_factory=list)  # <property .../> lines
    body: list[str] = field(default_factory=list)  # <failure>, <skipped>, <system-out> ... lines

    def xml(self) -> str:
        if not self.properties and not self.body:
            return f"\n    <testcase{self.attributes} />"
        properties = (["\n      <properties>", *self.properties, "\n      </properties>"]
                      if self.properties else [])
        return "".join([f"\n    <testcase{self.attributes}>", *properties, *self.body, "\n    </testcase>"])


def render_junit(results: dict) -> bytes:
    """The document ElementTree would write, indented by ET.indent, from strings: at a thousand
    nodes building the tree and ElementTree's writer took most of the rendering's time."""
    run = results["run"]
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    cases = []
    standing_out: dict[tuple, list[dict]] = {}
    for outlier in results.get("outliers") or []:
        standing_out.setdefault((outlier["check"], outlier["node"], outlier.get("rail")), []).append(outlier)
    for check in results["checks"]:
        module, _, name = check["test_id"].rpartition("::")
        case = _case(counts, module.removesuffix(".py").replace("/", "."), _xml_text(name),
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
        cases.append(case)
    for node in results["nodes"]:
        if node["status"] == "untested":
            case = _case(counts, "handover", f"results[{node['name']}]", 0)
            _outcome(case, counts, "failure", "no check has a result for this node", "")
            cases.append(case)
    verdict = results["verdict"]
    case = _case(counts, "handover", "certification", 0)
    if verdict["status"] != "CERTIFIED":
        _outcome(case, counts, "failure", verdict["status"], "\n".join(verdict["reasons"]))
    if verdict.get("warnings"):
        _system_out(case, "\n".join(f"warning: outlier {line}" for line in verdict["warnings"]))
    cases.append(case)
    name, timestamp = _escape_attribute(f"handover.{run['cluster']}"), _escape_attribute(run["started"] or "")
    suite = f' name="{name}" timestamp="{timestamp}"' + "".join(f' {key}="{n}"' for key, n in counts.items())
    document = "".join(["<?xml version='1.0' encoding='utf-8'?>\n<testsuites>", f"\n  <testsuite{suite}>",
                        *(case.xml() for case in cases), "\n  </testsuite>\n</testsuites>"])
    return document.encode("utf-8", "xmlcharrefreplace")  # as ElementTree writes what UTF-8 cannot


def _case(counts, classname, name, seconds) -> _Case:
    counts["tests"] += 1
    return _Case(f' classname="{_escape_attribute(classname)}" name="{_escape_attribute(name)}" '
                 f'time="{seconds:.3f}"')


def _with_action(text: str, action: str) -> str:
    return f"{text}\n\nwhat to do next: {action}" if action else text


def _properties(case: _Case, values: dict) -> None:
    """<properties> of a test case, as pytest's record_property writes them; empty values left out."""
    case.properties += [_property(name, str(value)) for name, value in values.items() if value]


def _property(name: str, value: str) -> str:
    return f'\n        <property name="{_escape_attribute(name)}" value="{_escape_attribute(_xml_text(value))}" />'


def _outliers(case: _Case, counts: dict, found: list[dict], passed: bool) -> None:
    """A case's outliers: properties, system-out, and a <failure> for a passed case whose
    outlier the profile fails (a case that failed already says so)."""
    lines = [("failure" if o.get("severity") == "failure" else "warning") + ": outlier " + outlier_line(o)
             for o in found]
    case.properties += [_property(f"handover.outlier.{outlier['metric']}", line)
                        for outlier, line in zip(found, lines, strict=True)]
    failing = [line for outlier, line in zip(found, lines, strict=True) if outlier.get("severity") == "failure"]
    if passed and failing:
        _outcome(case, counts, "failure", f"[outlier] {failing[0]}", "\n".join(failing))
    _system_out(case, "\n".join(lines))


def _outcome(case: _Case, counts, tag, message, text) -> None:
    counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[tag]] += 1
    first_line = message.splitlines()[0] if message else ""
    case.body.append(_element(tag, f' message="{_escape_attribute(_xml_text(first_line))}"', _xml_text(text)))


def _system_out(case: _Case, text: str) -> None:
    case.body.append(_element("system-out", "", _xml_text(text)))


def _element(tag: str, attributes: str, text: str) -> str:
    """A child of a test case on its own line; without text, an empty element."""
    if not text:
        return f"\n      <{tag}{attributes} />"
    return f"\n      <{tag}{attributes}>{_escape_text(text)}</{tag}>"


def _escape_text(text: str) -> str:
    if not _TEXT_SPECIAL.search(text):
        return text
    if "&" in text:
        text = text.replace("&", "&amp;")
    if "<" in text:
        text = text.replace("<", "&lt;")
    if ">" in text:
        text = text.replace(">", "&gt;")
    return text


def _escape_attribute(value: str) -> str:
    if not _ATTRIBUTE_SPECIAL.search(value):
        return value
    value = _escape_text(value)
    for character, reference in _ATTRIBUTE_REFERENCES:
        if character in value:
            value = value.replace(character, reference)
    return value


def write_junit(results: dict, run_dir: Path) -> Path:
    return write_atomically(Path(run_dir) / JUNIT_FILE, render_junit(results))
