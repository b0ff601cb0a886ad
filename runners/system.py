"""System facts of a node, and which programs it has: probes (run the payloads) and parsers (pure:
text in, SystemFacts or Programs out)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from runners import payloads
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

PROBE_TIMEOUT_S = 30
PROGRAMS_TIMEOUT_S = 30


@dataclass(frozen=True)
class Clock:
    """The kernel's clock as adjtimex(2) reads it: synchronized (by NTP, chrony or PTP) or not,
    and its maximum error; `unknown` says why neither could be read."""

    synced: Optional[bool]
    max_error_us: Optional[int]
    unknown: str = ""

    @property
    def max_error_ms(self) -> Optional[float]:
        return None if self.max_error_us is None else self.max_error_us / 1000


@dataclass(frozen=True)
class SystemFacts:
    hostname: str
    os_id: str
    os_version: str
    os_pretty: str
    kernel: str
    arch: str
    cpu_model: str
    cpu_sockets: Optional[int]
    logical_cpus: int
    memory_total_kib: int
    python: str
    clock: Optional[Clock] = None  # None from a payload that did not read it

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_kib / 2**20


def probe(transport: Transport) -> Result:
    return transport.run_script(payloads.load("system_facts"), timeout=PROBE_TIMEOUT_S)


REQUIRED_FACTS = tuple(name for name in SystemFacts.__dataclass_fields__ if name != "clock")


def parse_system_facts(text: str) -> SystemFacts:
    data = json_object(text, "system facts")
    missing = [name for name in REQUIRED_FACTS if name not in data]
    if missing:
        raise ParseError(f"system facts lack {', '.join(missing)}")
    if not isinstance(data["logical_cpus"], int) or not isinstance(data["memory_total_kib"], int):
        raise ParseError("system facts: logical_cpus and memory_total_kib must be integers")
    return SystemFacts(**{name: data[name] for name in REQUIRED_FACTS}, clock=_clock(data.get("clock")))


def _clock(data: object) -> Optional[Clock]:
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("synced"), (bool, type(None))) \
            or not isinstance(data.get("max_error_us"), (int, type(None))):
        raise ParseError(f"system facts: clock is not {{synced, max_error_us, unknown}}: {data!r}")
    return Clock(data["synced"], data["max_error_us"], str(data.get("unknown") or ""))


@dataclass(frozen=True)
class Programs:
    """The programs looked for on a node's PATH, and whether a launch there runs as root."""

    paths: dict  # program name -> its path on the node, or None
    root: bool

    def has(self, program: str) -> bool:
        return bool(self.paths.get(program))


def probe_programs(transport: Transport, names: Sequence[str]) -> Result:
    """Which of `names` are on the node's PATH (shutil.which there), and whether the user is root."""
    return transport.run_script(payloads.load("programs"), list(names), timeout=PROGRAMS_TIMEOUT_S)


def parse_programs(text: str) -> Programs:
    data = json_object(text, "the programs probe's output")
    if not isinstance(data.get("programs"), dict) or not isinstance(data.get("root"), bool):
        raise ParseError("the programs probe's output lacks 'programs' and a boolean 'root'")
    return Programs(paths=data["programs"], root=data["root"])
