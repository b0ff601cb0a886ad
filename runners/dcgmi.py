"""dcgmi diag -r LEVEL -j: NVIDIA's own GPU diagnostic, when DCGM is installed on the node.

Both JSON shapes are read: DCGM <= 3.x (`"DCGM GPU Diagnostic"`, results keyed by `gpu_ids` or
`gpu_id`, nvvs writes "PASS") and 4.x (`"DCGM Diagnostic"`, `entity_id`, `runtime_error`).
dcgmi may print lines before the document (NVIDIA's own real-output fixture starts with a
warning line, and has `null` entries among the tests): the document starts at the first `{`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON document (expected `dcgmi diag -j` output)")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise ParseError(f"dcgmi JSON is malformed: {exc}") from None
    if "iterations" in data and isinstance(data["iterations"], list) and data["iterations"]:
        data = data["iterations"][-1]
    body = data.get("DCGM Diagnostic") or data.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict) or "test_categories" not in body:
        raise ParseError("neither `DCGM Diagnostic` nor `DCGM GPU Diagnostic` with "
                         "`test_categories` at the top of the document")
    version = str(body.get("version") or (data.get("metadata") or {}).get("version") or "")
    tests = []
    for category in body["test_categories"] or []:
        for test in category.get("tests") or []:
            if not test:
                continue  # NVIDIA's real output has null entries between tests
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


PARSERS = {"dcgmi": parse_dcgmi}
