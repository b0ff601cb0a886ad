"""System facts of a node: probe (runs the payload) and parse (pure: text in, SystemFacts out)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from runners import payloads
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

PROBE_TIMEOUT_S = 30


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

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_kib / 2**20


def probe(transport: Transport) -> Result:
    return transport.run_script(payloads.load("system_facts"), timeout=PROBE_TIMEOUT_S)


def parse_system_facts(text: str) -> SystemFacts:
    data = json_object(text, "system facts")
    missing = [name for name in SystemFacts.__dataclass_fields__ if name not in data]
    if missing:
        raise ParseError(f"system facts lack {', '.join(missing)}")
    if not isinstance(data["logical_cpus"], int) or not isinstance(data["memory_total_kib"], int):
        raise ParseError("system facts: logical_cpus and memory_total_kib must be integers")
    return SystemFacts(**{name: data[name] for name in SystemFacts.__dataclass_fields__})
