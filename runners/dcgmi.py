"""dcgmi diag -r LEVEL -j: NVIDIA's own GPU diagnostic, when DCGM is installed on the node.

Both JSON shapes are read: DCGM <= 3.x (`"DCGM GPU Diagnostic"`, results keyed by `gpu_ids` or
`gpu_id`, nvvs writes "PASS") and 4.x (`"DCGM Diagnostic"`, `entity_id`, `runtime_error`).
dcgmi may print lines before the document (NVIDIA's own real-output fixture starts with a
warning line, and has `null` entries among the tests): the document starts at the first `{`.
`--iterations N` wraps N such documents in `{"iterations": [...], "Overall Result": ...}`: every
run counts, not just the last.

Operators also paste the text table (`dcgmi diag -r N` without `-j`), read by the same parser:
3.x writes one status per test ("Fail - All", "Pass - GPUs: 1, 2", a second line "Fail - GPU:
0"), 4.x a test-level status and then one "GPU0: Pass" line per GPU. Each status is a result,
so a test-level Fail fails the diagnostic even when every per-GPU line says Pass.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Optional

from runners.parsing import ParseError
from runners.transport import Result, Transport

QUICK_LEVEL = 2
# Seconds a level may take on an 8-GPU node (level 3 runs targeted stress/power and memory
# bandwidth, roughly 30 minutes on HGX boards; level 2 a few minutes).
LEVEL_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 4 * 3600}

# dcgmi returns the DCGM status as its exit status (negative codes wrap mod 256).
EXIT_MEANINGS = {
    0: "the diagnostic passed",
    226: "the diagnostic ran and found a failure (DCGM_ST_NVVS_ERROR)",
    205: "the diagnostic found a failure that requires isolating the GPU (DCGM_ST_NVVS_ISOLATE_ERROR)",
    204: "the nvvs binary was not found (DCGM_ST_NVVS_BINARY_NOT_FOUND)",
    227: "the diagnostic requires root (DCGM_ST_REQUIRES_ROOT)",
    253: "generic DCGM error",
    127: "dcgmi is not installed",
}
RAN_AND_FOUND_FAILURES = (226, 205)
PASSING_STATUSES = ("pass", "skip")

# The text table: "|" + 27 columns + "|" + 48 columns + "|"; messages wrap every 45 characters,
# mid-word, after the value cell's one leading space.
_TABLE_HEADER = re.compile(r"^\|\s*Diagnostic\s*\|\s*Result\s*\|")
_TABLE_CATEGORY = re.compile(r"^[|+]-----\s+(?P<category>\w[\w ]*?)\s+-+\+")
_TABLE_STATUS = re.compile(r"^(?P<status>Pass|Fail|Skip|Warn|Not Run)(?: - (?P<gpus>All|GPUs?: [\d, ]+))?$")
_TABLE_ENTITY = re.compile(r"^GPU(?P<gpu>\d+): (?P<status>Pass|Fail|Skip|Warn|Not Run)$")
_TABLE_MESSAGES = ("Warning", "Error", "Info")
_WRAP = 45


@dataclass(frozen=True)
class DiagResult:
    name: str
    category: str
    gpus: str  # "0,1,2" (3.x deployment tests), "3", or "" when the result names none
    status: str  # as written: Pass, PASS, Fail, Skip, Warn, Not Run
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DcgmiDiag:
    version: str
    tests: list[DiagResult]
    runtime_error: Optional[str]
    ok: bool


def diag_argv(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(level), "-j"]


def diag(transport: Transport, level: int = QUICK_LEVEL) -> Result:
    return transport.run(diag_argv(level), timeout=LEVEL_TIMEOUT_S[level])


def dcgmi_missing(result: Result) -> bool:
    """GNU timeout exits 127 when it cannot find the command it was asked to run."""
    return result.exit_code == 127 and result.failure is None


def parse_dcgmi(text: str) -> DcgmiDiag:
    """`dcgmi diag -j` JSON (3.x or 4.x), or the text table dcgmi prints without -j."""
    if _is_table(text):
        return _parse_table(text)
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON document and no results table (expected `dcgmi diag -j` output, or "
                         "the table `dcgmi diag` prints without -j)")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise ParseError(f"dcgmi JSON is malformed: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("iterations"), list) and data["iterations"]:
        return _parse_iterations(data)
    return _parse_document(data)


def _parse_iterations(data: dict) -> DcgmiDiag:
    """`dcgmi diag --iterations N -j`: every run's results, named by iteration, and dcgmi's own
    "Overall Result" (a failure in the first run fails the diagnostic, whatever the last said)."""
    runs = [_parse_document(run) for run in data["iterations"]]
    tests = [replace(test, name=f"{test.name} (iteration {i})")
             for i, run in enumerate(runs, start=1) for test in run.tests]
    overall = str(data.get("Overall Result") or "")
    runtime_error = next((run.runtime_error for run in runs if run.runtime_error), None)
    ok = all(run.ok for run in runs) and overall.lower() in ("", *PASSING_STATUSES)
    return DcgmiDiag(version=runs[0].version, tests=tests, runtime_error=runtime_error, ok=ok)


def _parse_document(data: object) -> DcgmiDiag:
    """One diagnostic's document, 3.x or 4.x. A 4.x test's own `test_summary` status is a result
    too (without a GPU), as in the table: a test that failed as a whole fails the diagnostic
    even when every GPU's result says Pass."""
    body = (data.get("DCGM Diagnostic") or data.get("DCGM GPU Diagnostic")) if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(body, dict) or "test_categories" not in body:
        raise ParseError("neither `DCGM Diagnostic` nor `DCGM GPU Diagnostic` with "
                         "`test_categories` at the top of the document")
    version = str(body.get("version") or (data.get("metadata") or {}).get("version") or "")
    tests = []
    for category in body["test_categories"] or []:
        for test in category.get("tests") or []:
            if not test:
                continue  # NVIDIA's real output has null entries between tests
            summary = test.get("test_summary")
            if isinstance(summary, dict) and summary.get("status"):
                tests.append(DiagResult(name=str(test.get("name", "")), category=str(category.get("category", "")),
                                        gpus="", status=str(summary["status"])))
            for result in test.get("results") or []:
                tests.append(DiagResult(
                    name=str(test.get("name", "")),
                    category=str(category.get("category", "")),
                    gpus=_gpus_of(result),
                    status=str(result.get("status", "")),
                    warnings=[_warning(w) for w in result.get("warnings") or []]))
    runtime_error = body.get("runtime_error") or None
    ok = (bool(tests) and runtime_error is None
          and all(t.status.lower() in PASSING_STATUSES for t in tests))
    return DcgmiDiag(version=version, tests=tests, runtime_error=runtime_error, ok=ok)


def _gpus_of(result: dict) -> str:
    for key in ("gpu_ids", "gpu_id", "entity_id"):
        if key in result:
            return str(result[key])
    return ""


def _warning(entry) -> str:
    if isinstance(entry, dict):
        text = str(entry.get("warning", ""))
        return f"{text} (error {entry['error_id']})" if "error_id" in entry else text
    return str(entry)


def _is_table(text: str) -> bool:
    return any(_TABLE_HEADER.match(line) or _TABLE_CATEGORY.match(line) or
               ((cells := _cells(line)) is not None and _TABLE_STATUS.match(cells[1].strip()))
               for line in text.splitlines())


def _cells(line: str) -> Optional[tuple[str, str]]:
    """The name and raw value cell of a table row ("| name | value |"), or None."""
    line = line.rstrip()
    split = line.find("|", 1)
    if not line.startswith("|") or split < 0 or line.startswith("|-----"):
        return None
    value = line[split + 1:]
    return line[1:split].strip(), value[:-1] if value.endswith("|") else value


def _parse_table(text: str) -> DcgmiDiag:
    """The last table in the text: per test, one result per status (3.x: "Fail - GPU: 0";
    4.x: the test's own and each "GPUn:" line); Warning and Error rows are the warnings of the
    test above them (an Error row with no test above it is a failed result of its own)."""
    version, category = "", ""
    tests: list[DiagResult] = []
    message: list[str] = []  # the raw chunks of the Warning/Error row being read
    runtime_error = None
    current: Optional[DiagResult] = None  # the result that Warning/Error rows belong to

    def close_message():
        if message and current is not None:
            current.warnings.append(" ".join("".join(message).split()))
        message.clear()

    for line in text.splitlines():
        if line.startswith("Error: "):
            runtime_error = line[len("Error: "):].strip()
        if _TABLE_HEADER.match(line):
            close_message()
            version, category, tests, current = "", "", [], None  # a later table replaces it
            continue
        if match := _TABLE_CATEGORY.match(line):
            close_message()
            category, current = match["category"], None
            continue
        cells = _cells(line)
        if cells is None:
            continue
        name, raw = cells
        value = raw.strip()
        if category == "Metadata":
            if name == "DCGM Version":
                version = value
            continue
        if name in _TABLE_MESSAGES:
            close_message()
            if name == "Info":
                continue
            if current is None:
                current = DiagResult(name, category, _gpu_named(value), "Fail")
                tests.append(current)
            message.append(raw[1:_WRAP + 1])
            continue
        if name:
            close_message()
        elif message:
            message.append(raw[1:_WRAP + 1])
            continue
        status = _TABLE_STATUS.match(value) or _TABLE_ENTITY.match(value)
        if status is None:
            continue  # an Info row's continuation
        test_name = name or (current.name if current else "")
        gpus = status.groupdict().get("gpu") or _gpu_list(status.groupdict().get("gpus"))
        current = DiagResult(test_name, category, gpus, status["status"])
        tests.append(current)
    close_message()
    if not tests:
        raise ParseError("a dcgmi diag table without a test result")
    ok = runtime_error is None and all(t.status.lower() in PASSING_STATUSES for t in tests)
    return DcgmiDiag(version=version, tests=tests, runtime_error=runtime_error, ok=ok)


def _gpu_list(gpus: Optional[str]) -> str:
    """3.x's "GPUs: 1, 2, 3" or "GPU: 0" as "1,2,3" or "0"; "All" (or nothing) as ""."""
    if not gpus or gpus == "All":
        return ""
    return ",".join(part.strip() for part in gpus.split(":", 1)[1].split(","))


def _gpu_named(text: str) -> str:
    match = re.match(r"GPU (\d+)\b", text.strip())
    return match.group(1) if match else ""


PARSERS = {"dcgmi": parse_dcgmi}
