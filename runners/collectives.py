"""Collective bandwidth through the node-side torch payload: probe, per-node and cross-node runs,
and a pure parser of the payload's JSON; which tool a node runs (plan_for), and the one figure
either tool's run gives (Figure).

Per node, torchrun runs with one node (its rendezvous on the node's own loopback) and one rank per
GPU, or a given number of CPU ranks. Across nodes, runners.torchrun launches it on every node.
nccl-tests, where installed, is run by runners.nccl_tests instead; both give rows of the same
shape (runners.nccl_tests.NcclRow), so a suite judges them alike: busbw at the largest size
(runners.nccl_tests.peak_busbw).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

from inventory.model import RENDEZVOUS_TIMEOUT_S, Profile
from runners import nccl_tests, payloads, torchrun
from runners.nccl_tests import NcclRow, NcclTestsReport
from runners.parsing import ParseError
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
ITERS = 5  # timed iterations per size, after one warm-up


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
            wrong += sum(row.wrong or 0 for row in rows)
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
                collectives: Sequence[str] = ("all_reduce",), iters: int = ITERS,
                timeout: float = 300) -> Result:
    """torchrun with one node and `ranks` local ranks; the rendezvous on the node's loopback."""
    python = transport.node.python
    return torchrun.run_on_node(transport, ranks, lambda marker: payload_command(
        python, sizes=sizes, collectives=collectives, iters=iters, marker=marker,
        op_timeout_s=min(timeout, 120)), timeout=timeout)


def run_across(transports: Mapping[str, Transport], addresses: Mapping[str, str],
               ranks_per_node: int, *, sizes: Sequence[int] = CPU_SIZES,
               collectives: Sequence[str] = ("all_reduce",), iters: int = ITERS, timeout: float = 300,
               socket_ifname: Optional[str] = None, join_timeout_s: int = RENDEZVOUS_TIMEOUT_S) -> Launch:
    """torchrun on every node, rendezvous on the first; rank 0's node prints the measurement."""
    python = transports[next(iter(transports))].node.python
    return torchrun.run_across(transports, addresses, ranks_per_node, lambda marker: payload_command(
        python, sizes=sizes, collectives=collectives, iters=iters, marker=marker,
        op_timeout_s=min(timeout, 120)), timeout=timeout, socket_ifname=socket_ifname,
        join_timeout_s=join_timeout_s)


@dataclass(frozen=True)
class Plan:
    tool: str  # "nccl-tests" or "torch"
    ranks: int  # per node
    gpu: bool


def plan_for(probe: NodeProbe, profile: Profile) -> tuple[Optional[Plan], str]:
    """What to run on a node, or why nothing can run there."""
    expected_gpus = profile.expect.gpu_count
    gpus = probe.cuda_devices or (expected_gpus if probe.nccl_tests and not probe.torch else 0)
    if probe.nccl_tests and gpus:
        return Plan("nccl-tests", gpus, True), ""
    if probe.torch and expected_gpus and not probe.cuda_devices:
        return None, (f"torch {probe.torch} sees no CUDA device, but profile {profile.name} "
                      f"expects {expected_gpus} GPU(s)")
    if probe.torch:
        return Plan("torch", gpus or CPU_RANKS, bool(gpus)), ""
    return None, f"neither torch nor nccl-tests on {probe.hostname} ({probe.python} cannot import torch)"


@dataclass(frozen=True)
class Figure:
    """One collective's measurement, whichever tool made it."""

    busbw: float  # GB/s at the largest size
    size: int  # bytes
    ranks: int
    nccl_version: Optional[str]
    env: dict
    tool: str
    note: str = ""
    lines: dict = field(default_factory=dict)  # legend -> [(size B, busbw GB/s)], every row of the run

    def unjudgeable(self) -> str:
        """Why busbw says nothing about the hardware ('' when it does): one rank sends nothing to
        another, so busbw is algbw x 2(n-1)/n = 0 by definition (nccl-tests doc/PERFORMANCE.md)
        and no band for n ranks applies; the data check before it is all one rank can show."""
        if self.ranks == 1:
            return (f"one rank ({self.tool}): busbw is 0 by definition (factor 2(n-1)/n), nothing crosses "
                    "a link to judge against the band; the data check passed")
        return ""

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()) if k.startswith(("NCCL_", "GLOO_")))
        parts = [f"{self.busbw:.3f} GB/s busbw at {self.size / 2**20:g} MiB over {self.ranks} rank(s) ({self.tool})",
                 f"NCCL {self.nccl_version}" if self.nccl_version else "",
                 env, self.note]
        return "; ".join(part for part in parts if part)


def nccl_tests_figure(result: Result, report: NcclTestsReport, ranks: int) -> tuple[Optional[Figure], str]:
    """(figure, '') of an nccl-tests run that nccl_tests.judge found sane, every row as a curve;
    (None, why) when the run did not report `ranks` ranks or its largest size has no busbw."""
    if report.ranks and report.ranks != ranks:
        return None, f"{result.node}: {report.ranks} rank(s) reported, expected {ranks}"
    if report.peak_busbw is None or report.largest_size is None:
        return None, f"{result.node}: no busbw at the largest size ({report.largest_size} B)"
    return Figure(report.peak_busbw, report.largest_size, ranks, report.nccl_version,
                  nccl_tests.nccl_env(result), "nccl-tests",
                  "one rank: busbw is 0 by definition" if ranks == 1 else "",
                  nccl_tests.busbw_lines(report.rows)), ""


def report_problem(where: str, report: CollectivesReport, ranks: int) -> str:
    """'' when every value came back right from all `ranks` ranks; else why not, in words."""
    if report.wrong:
        return f"{where}: {report.wrong} wrong element(s) in the reduced values"
    if report.ranks != ranks or len(report.hosts) != ranks:
        return f"{where}: {report.ranks} rank(s) answered ({', '.join(report.hosts)}), expected {ranks}"
    return ""


def torch_figure(where: str, report: CollectivesReport, collective: str = "all_reduce") -> tuple[Optional[Figure], str]:
    """(figure, '') of the payload's `collective`, every row as a curve; (None, why) when it
    measured none."""
    rows = report.collectives.get(collective) or []
    if not rows:
        return None, f"{where}: the payload measured no {collective}"
    largest, busbw = report.largest(collective), nccl_tests.peak_busbw(rows)
    if largest is None or busbw is None:
        return None, f"{where}: the payload's {collective} has no busbw at its largest size"
    tool = f"torch {report.torch} {report.backend}"
    return Figure(busbw, largest.size, report.ranks, report.nccl_version,
                  {**report.env}, tool, report.note,
                  {tool: [(row.size, row.busbw) for row in rows]}), ""


def report_of(launch: Launch) -> tuple[Optional[CollectivesReport], Optional[Result]]:
    """The measurement (printed by rank 0, on whichever node that landed) and its Result."""
    for result in launch.results.values():
        if result.ok:
            try:
                return parse_collectives(result.stdout), result
            except ParseError:
                continue
    return None, None
