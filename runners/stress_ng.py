"""stress-ng: CPU (matrixprod), matrix and VM stressors with --verify, and their bogo-ops rates.

Where the --yaml goes: to /dev/stdout. stress-ng writes every log and metrics line to stderr,
so its stdout is free, and the YAML document reaches the harness through the same pipe as any
output, without a file on the node. The harness writes nothing outside declared scratch paths,
and the cpu, matrix and vm stressors create no files, so this step needs no scratch path.

The parser takes stress-ng's log (stderr, with or without `--timestamp`), its YAML, or both
interleaved (`2>&1`): the log gives failures and whether the run completed; the YAML gives the
precise rates; the log's metrics table stands in when there is no YAML.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import yaml

from runners.parsing import ParseError
from runners.transport import Result, Transport

# stress-ng(1), EXIT STATUS (stress-ng.1 @ 291fc43).
EXIT_MEANINGS = {
    0: "success",
    1: "error: bad user options or a fatal resource problem in the harness",
    2: "one or more stressors failed",
    3: "a stressor failed to initialise for lack of resources (ENOMEM, ENOSPC, a missing syscall)",
    4: "a stressor is not implemented on this architecture or operating system",
    5: "a stressor was killed by an unexpected signal",
    6: "a stressor exited via exit(2) unexpectedly, leaving no metrics",
    7: "bogo-ops metrics are untrustworthy (e.g. a stressor was OOM-killed while updating them)",
}

# `--timestamp` puts the time of day after "stress-ng: " on every line ("stress-ng: 00:09:46.53 info:  [13839] ").
_LOG_LINE = re.compile(r"^stress-ng: (?:\d{2}:\d{2}:\d{2}(?:\.\d+)? )?"
                       r"(?P<tag>\w+):\s*\[(?P<pid>\d+)\]\s?(?P<text>.*)$")
_TABLE_ROW = re.compile(
    r"^(?P<name>[A-Za-z][\w-]*)\s+(?P<ops>\d+)\s+(?P<real>[\d.]+)\s+[\d.]+\s+[\d.]+"
    r"\s+(?P<rate>[\d.]+)\s+(?P<cpu_rate>[\d.]+)(?:\s|$)")
_SUMMARY_COUNT = re.compile(r"^(failed|metrics untrustworthy): (\d+)")


@dataclass(frozen=True)
class StressPlan:
    """What to run: workers per stressor (0 = one per online CPU) for `seconds`."""

    seconds: int = 3
    cpu_workers: int = 1
    matrix_workers: int = 1
    vm_workers: int = 1
    # The vm stressor maps its whole region in (system time) before its first bogo op. With 64M,
    # on a machine shared with other load (a CI run), that took the 3 s: 0.33 s of system time,
    # none of user time, `vm: 0 bogo ops`, the run insane. A quarter of it leaves the stressor
    # its 3 s.
    vm_bytes: str = "16M"


QUICK = StressPlan()


@dataclass(frozen=True)
class Stressor:
    name: str
    bogo_ops: float
    bogo_ops_per_s: float  # real (wall-clock) time: what the node delivered
    bogo_ops_per_s_cpu: float  # per usr+sys CPU second


@dataclass(frozen=True)
class StressNgRun:
    version: Optional[str]
    stressors: list[Stressor]
    failures: list[str] = field(default_factory=list)  # `fail:`/`error:` lines and summary counts
    completed: Optional[bool] = None  # the final "successful/unsuccessful run" line; None: absent
    ok: bool = False


def stress_argv(plan: StressPlan = QUICK) -> list[str]:
    return ["stress-ng",
            "--cpu", str(plan.cpu_workers), "--cpu-method", "matrixprod",
            "--matrix", str(plan.matrix_workers),
            "--vm", str(plan.vm_workers), "--vm-bytes", plan.vm_bytes,
            "--verify", "--metrics", "--timeout", f"{plan.seconds}s",
            "--yaml", "/dev/stdout"]


def stress(transport: Transport, plan: StressPlan = QUICK) -> Result:
    return transport.run(stress_argv(plan), timeout=plan.seconds + 30)


def exit_meaning(code: Optional[int]) -> str:
    known = EXIT_MEANINGS.get(code) if code is not None else None
    return known or "not an exit status stress-ng documents"


class _StringLoader(yaml.SafeLoader):
    """Every plain scalar stays a string: stress-ng writes dates like 2026:11:30 unquoted, which
    YAML 1.1 would read as a base-60 integer."""


_StringLoader.yaml_implicit_resolvers = {}


def parse_stress_ng(text: str) -> StressNgRun:
    """A stress-ng run from its log lines, its --yaml document, or both."""
    log, other = [], []
    for line in text.splitlines():
        match = _LOG_LINE.match(line)
        if match:
            log.append((match["tag"], match["text"]))
        else:
            other.append(line)
    document = _yaml_document(other)
    if not log and document is None:
        raise ParseError("no stress-ng log lines (`stress-ng: info: [pid] ...`) and no --yaml "
                         "document with `metrics:`")
    failures = [f"{tag}: {message}" for tag, message in log if tag in ("fail", "error")]
    completed = None
    for _, message in log:
        if message.startswith("successful run completed"):
            completed = True
        elif message.startswith("unsuccessful run completed"):
            completed = False
        count = _SUMMARY_COUNT.match(message)
        if count and int(count[2]) > 0:
            failures.append(message)
    if document is not None:
        version, stressors = _from_yaml(document)
    else:
        version, stressors = None, _from_table(log)
    ok = (bool(stressors) and not failures and completed is not False
          and all(s.bogo_ops > 0 and s.bogo_ops_per_s > 0 for s in stressors))
    return StressNgRun(version, stressors, failures, completed, ok)


def _yaml_document(lines: list[str]) -> Optional[dict]:
    try:
        start = lines.index("---")
    except ValueError:
        return None
    body = []
    for line in lines[start + 1:]:
        if line == "...":
            break
        body.append(line)
    try:
        data = yaml.load("\n".join(body), Loader=_StringLoader)
    except yaml.YAMLError as exc:
        raise ParseError(f"stress-ng --yaml document is not YAML: {exc}") from None
    if not isinstance(data, dict) or "metrics" not in data:
        return None
    return data


def _number(value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ParseError(f"stress-ng YAML: {what} is {value!r}, not a number") from None


def _from_yaml(data: dict) -> tuple[Optional[str], list[Stressor]]:
    info = data.get("system-info") or {}
    version = info.get("stress-ng-version") if isinstance(info, dict) else None
    entries = data.get("metrics") or []
    if not isinstance(entries, list):
        raise ParseError("stress-ng YAML: `metrics` is not a list")
    stressors = []
    for entry in entries:
        if not isinstance(entry, dict) or "stressor" not in entry:
            raise ParseError(f"stress-ng YAML: metrics entry without `stressor`: {entry!r}")
        name = entry["stressor"]
        stressors.append(Stressor(
            name=name,
            bogo_ops=_number(entry.get("bogo-ops"), f"{name} bogo-ops"),
            bogo_ops_per_s=_number(entry.get("bogo-ops-per-second-real-time"),
                                   f"{name} bogo-ops-per-second-real-time"),
            bogo_ops_per_s_cpu=_number(entry.get("bogo-ops-per-second-usr-sys-time"),
                                       f"{name} bogo-ops-per-second-usr-sys-time")))
    return version, stressors


def _from_table(log: list[tuple[str, str]]) -> list[Stressor]:
    """Rows of the metrics table: tag `metrc` since 0.15.05, `info` before."""
    stressors, in_table = [], False
    for tag, text in log:
        if tag not in ("metrc", "info"):
            continue
        if text.startswith("stressor") and "bogo ops" in text:
            in_table = True
            continue
        if not in_table:
            continue
        row = _TABLE_ROW.match(text)
        if row:
            stressors.append(Stressor(row["name"], float(row["ops"]), float(row["rate"]),
                                      float(row["cpu_rate"])))
        elif text.startswith("miscellaneous metrics"):
            in_table = False
    return stressors


PARSERS = {"stress-ng": parse_stress_ng}
