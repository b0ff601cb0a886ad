"""Collective bandwidth through the node-side torch payload: probe, per-node and cross-node runs,
and a pure parser of the payload's JSON.

Per node, torchrun runs with one node (its rendezvous on the node's own loopback) and one rank per
GPU, or a given number of CPU ranks. Across nodes, runners.torchrun launches it on every node.
nccl-tests, where installed, is run by runners.nccl_tests instead; both give rows of the same
shape (runners.nccl_tests.NcclRow), so a suite judges them alike.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

from runners import payloads
from runners.nccl_tests import NcclRow
from runners.parsing import ParseError
from runners import torchrun
from runners.torchrun import Launch
from runners.transport import Result, Transport

PAYLOAD = "collectives"
PROBE_TIMEOUT_S = 60
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MIB = 1 << 20
GIB = 1 << 30
CPU_SIZES = (1 * MIB, 16 * MIB, 64 * MIB)  # gloo on CPUs: about 1 GB/s, so 64 MiB is ~0.1 s an op
GPU_SIZES = (1 * GIB, 2 * GIB, 4 * GIB, 8 * GIB)  # NVLink/IB figures need >= 1 GiB messages
CPU_RANKS = 2


@dataclass(frozen=True)
class NodeProbe:
    hostname: str
    python: str
    torch: Optional[str]
    cuda_devices: int
    nccl_tests: Optional[str]  # path of all_reduce_perf, None when not on PATH


def probe(transport: Transport) -> Result:
    return transport.run_script(payloads.load(PAYLOAD), ["--probe"], timeout=PROBE_TIMEOUT_S)


def parse_probe(text: str) -> NodeProbe:
    data = _last_json(text, "hostname")
    try:
        return NodeProbe(hostname=str(data["hostname"]), python=str(data["python"]),
                         torch=data["torch"], cuda_devices=int(data["cuda_devices"]),
                         nccl_tests=data["nccl_tests"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseError(f"collectives probe lacks or mistypes {exc}") from None


@dataclass(frozen=True)
class CollectivesReport:
    """The payload's measurement: rows per collective and the environment beside the figures."""

    ranks: int
    hosts: list[str]
    backend: str
    torch: str
    nccl_version: Optional[str]
    device: str
    env: dict[str, str]  # NCCL_*, GLOO_* and MASTER_ADDR as the ranks saw them
    note: str
    collectives: dict[str, list[NcclRow]]
    unsupported: dict[str, str] = field(default_factory=dict)  # collective -> why the backend can't
    wrong: int = 0
    ok: bool = False

    def largest(self, collective: str) -> Optional[NcclRow]:
        rows = self.collectives.get(collective) or []
        return max(rows, key=lambda row: row.size) if rows else None


def _last_json(text: str, key: str) -> dict:
    """The last line that is a JSON object with `key`: torchrun and torch print other lines too."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and key in data:
                return data
    raise ParseError(f"no JSON line with {key!r} in the collectives payload's output")


def parse_collectives(text: str) -> CollectivesReport:
    data = _last_json(text, "collectives")
    try:
        collectives, unsupported, wrong = {}, {}, 0
        for name, entry in data["collectives"].items():
            rows = [NcclRow(size=int(r["size"]), algbw=float(r["algbw"]), busbw=float(r["busbw"]),
                            busbw_inplace=None, wrong=int(r["wrong"])) for r in entry["rows"]]
            collectives[name] = rows
            wrong += sum(row.wrong for row in rows)
            if entry.get("unsupported"):
                unsupported[name] = str(entry["unsupported"])
        report = CollectivesReport(
            ranks=int(data["ranks"]), hosts=list(data["hosts"]), backend=str(data["backend"]),
            torch=str(data["torch"]), nccl_version=data.get("nccl_version"), device=str(data["device"]),
            env=dict(data.get("env") or {}), note=str(data.get("note") or ""),
            collectives=collectives, unsupported=unsupported, wrong=wrong)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ParseError(f"collectives payload output lacks or mistypes {exc}") from None
    measured = any(collectives.values())
    return replace(report, ok=measured and wrong == 0 and len(report.hosts) == report.ranks)


PARSERS = {"collectives": parse_collectives}


def payload_command(python: str, *, sizes: Sequence[int], collectives: Sequence[str], iters: int,
                    marker: str, op_timeout_s: float) -> list[str]:
    """The payload as torchrun starts it on each rank: `python -c SOURCE ...`, nothing on disk."""
    unknown = [name for name in collectives if name not in COLLECTIVES]
    if unknown:
        raise ValueError(f"unknown collective(s) {', '.join(unknown)}; known: {', '.join(COLLECTIVES)}")
    return [python, "-c", payloads.load(PAYLOAD), "--sizes", ",".join(map(str, sizes)),
            "--collectives", ",".join(collectives), "--iters", str(iters),
            "--op-timeout", str(int(op_timeout_s)), "--marker", marker]


def run_on_node(transport: Transport, ranks: int, *, sizes: Sequence[int] = CPU_SIZES,
                collectives: Sequence[str] = ("all_reduce",), iters: int = 5,
                timeout: float = 300) -> Result:
    """torchrun with one node and `ranks` local ranks; the rendezvous on the node's loopback."""
    python = transport.node.python
    return torchrun.run_on_node(transport, ranks, lambda marker: payload_command(
        python, sizes=sizes, collectives=collectives, iters=iters, marker=marker,
        op_timeout_s=min(timeout, 120)), timeout=timeout)


def run_across(transports: Mapping[str, Transport], addresses: Mapping[str, str],
               ranks_per_node: int, *, sizes: Sequence[int] = CPU_SIZES,
               collectives: Sequence[str] = ("all_reduce",), iters: int = 5, timeout: float = 300,
               socket_ifname: Optional[str] = None, join_timeout_s: int = 60) -> Launch:
    """torchrun on every node, rendezvous on the first; rank 0's node prints the measurement."""
    python = transports[next(iter(transports))].node.python
    return torchrun.run_across(transports, addresses, ranks_per_node, lambda marker: payload_command(
        python, sizes=sizes, collectives=collectives, iters=iters, marker=marker,
        op_timeout_s=min(timeout, 120)), timeout=timeout, socket_ifname=socket_ifname,
        join_timeout_s=join_timeout_s)


def report_of(launch: Launch) -> tuple[Optional[CollectivesReport], Optional[Result]]:
    """The measurement (printed by rank 0, on whichever node that landed) and its Result."""
    for result in launch.results.values():
        if result.ok:
            try:
                return parse_collectives(result.stdout), result
            except ParseError:
                continue
    return None, None
