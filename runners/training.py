"""Distributed training: the GPT-style DDP payload under torchrun, its parser and its analyses.

Per node, torchrun runs with that node alone (one rank per GPU, or two CPU ranks); across
nodes, runners.torchrun launches it on every node with the rendezvous on the first. The
parser and the analyses (does the loss fall, which rank straggles, how well it scales) are
pure functions of the payload's JSON, so they are tested on real outputs.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Mapping, Optional, Sequence

from inventory.model import RENDEZVOUS_TIMEOUT_S
from runners import payloads, torchrun
from runners.parsing import ParseError
from runners.torchrun import Launch
from runners.transport import Result, Transport

PAYLOAD = "train_gpt"
CPU_RANKS = 2
LOSS_FALL_FRACTION = 0.5  # the last loss at most half the first: the H200 run reached 0.4%


@dataclass(frozen=True)
class ModelConfig:
    """The decoder and its batch; steps set how long it trains."""

    vocab: int
    width: int
    layers: int
    heads: int
    seq: int
    batch: int  # sequences per rank per step
    steps: int
    lr: float

    def with_steps(self, steps: int) -> "ModelConfig":
        return replace(self, steps=steps)


# 167M parameters with a 32000-token vocabulary, like the recorded H200 run (166M; its first loss
# 10.38 is ln 32000): 8 layers x 12 x 1024^2 plus untied 32000 x 1024 embedding and head.
GPU_MODEL = ModelConfig(vocab=32000, width=1024, layers=8, heads=16, seq=1024, batch=16, steps=50,
                        lr=3e-4)
# Half a million parameters: a few seconds on two CPU ranks sharing two cores.
CPU_MODEL = ModelConfig(vocab=512, width=128, layers=2, heads=4, seq=128, batch=8, steps=30, lr=3e-3)
FULL_STEPS = {"gpu": 600, "cpu": 200}  # `full` depth: minutes of training instead of seconds


@dataclass(frozen=True)
class Checkpoint:
    """The round trip through a scratch path, as one rank saw it."""

    path: str
    bytes: int
    write_s: Optional[float]
    read_s: Optional[float]
    matches: Optional[bool]  # the bytes' digest and every tensor equal what rank 0 wrote
    error: str


@dataclass(frozen=True)
class RankStats:
    rank: int
    local_rank: int
    host: str
    step_times: list[float]  # whole steps; they end in an all-reduce, so alike on every rank
    forward_times: list[float]  # the forward pass alone: this rank's own speed
    tokens_per_s: float
    init_s: float  # process start to the process group's initialisation
    first_step_s: float  # process start to the end of the first step
    max_memory_gib: Optional[float]
    gpus: Optional[dict]  # local rank 0 on GPUs: NVML index -> util_mean, memory_max_gib, samples
    nvml_error: str
    checkpoint: Optional[Checkpoint]


@dataclass(frozen=True)
class TrainingReport:
    ranks: int
    backend: str
    device: str
    torch: str
    nccl_version: Optional[str]
    parameters: int
    config: dict
    tokens_per_step: int
    tokens_per_s: Optional[float]
    losses: list[Optional[float]]
    per_rank: list[RankStats]
    env: dict[str, str]
    ok: bool = False  # every rank reported, every step ran, every loss is finite

    @property
    def hosts(self) -> list[str]:
        return sorted({rank.host for rank in self.per_rank})

    def step_times(self) -> list[float]:
        """Each step's time as the slowest rank saw it, after the first (warm-up) step."""
        steps = min((len(rank.step_times) for rank in self.per_rank), default=0)
        return [max(rank.step_times[i] for rank in self.per_rank) for i in range(1, steps)]


def _last_json(text: str) -> dict:
    """The payload's line: torchrun and torch print other lines (warnings, banners) too."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"training"' in line:
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and data.get("training") is True:
                return data
    raise ParseError("no training payload JSON line in the output")


def parse_training(text: str) -> TrainingReport:
    data = _last_json(text)
    try:
        per_rank = []
        for entry in data["per_rank"]:
            saved = entry.get("checkpoint")
            checkpoint = None if saved is None else Checkpoint(
                path=str(saved["path"]), bytes=int(saved["bytes"]), write_s=saved["write_s"],
                read_s=saved["read_s"], matches=saved["matches"], error=str(saved["error"]))
            per_rank.append(RankStats(
                rank=int(entry["rank"]), local_rank=int(entry["local_rank"]), host=str(entry["host"]),
                step_times=[float(t) for t in entry["step_times"]],
                forward_times=[float(t) for t in entry["forward_times"]],
                tokens_per_s=float(entry["tokens_per_s"]), init_s=float(entry["init_s"]),
                first_step_s=float(entry["first_step_s"]), max_memory_gib=entry["max_memory_gib"],
                gpus=entry.get("gpus"), nvml_error=str(entry.get("nvml_error") or ""),
                checkpoint=checkpoint))
        report = TrainingReport(
            ranks=int(data["ranks"]), backend=str(data["backend"]), device=str(data["device"]),
            torch=str(data["torch"]), nccl_version=data.get("nccl_version"),
            parameters=int(data["parameters"]), config=dict(data["config"]),
            tokens_per_step=int(data["tokens_per_step"]), tokens_per_s=data["tokens_per_s"],
            losses=[None if v is None else float(v) for v in data["losses"]],
            per_rank=sorted(per_rank, key=lambda rank: rank.rank), env=dict(data.get("env") or {}))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ParseError(f"training payload output lacks or mistypes {exc}") from None
    steps = int(report.config.get("steps", 0))
    complete = (len(report.per_rank) == report.ranks
                and sorted(rank.rank for rank in report.per_rank) == list(range(report.ranks))
                and all(len(rank.step_times) == steps for rank in report.per_rank)
                and len(report.losses) == steps and None not in report.losses)
    return replace(report, ok=complete)


PARSERS = {"training": parse_training}


# ---------------------------------------------------------------------------------------------
# Analyses: pure judgements of a report

def loss_falls(losses: Sequence[Optional[float]], fraction: float) -> Optional[str]:
    """Why the loss did not fall to `fraction` of its first value, None when it did.

    On a fixed batch a working model memorises it: the recorded H200 run went from 10.38 to
    0.04 in 30 steps. A loss that stays put means the gradients or their all-reduce are broken.
    """
    if not losses:
        return "no step finished"
    finite = [value for value in losses if value is not None]
    if len(finite) < len(losses):
        first_bad = next(i for i, value in enumerate(losses) if value is None) + 1
        return f"the loss is not a finite number from step {first_bad}"
    first, last = finite[0], finite[-1]
    if last > first * fraction:
        return (f"the loss fell from {first:.4g} to {last:.4g} in {len(losses)} steps; "
                f"a healthy run reaches {fraction:.0%} of its first value or less")
    return None


def why_not_sane(report: TrainingReport, ranks: int, *, learning: bool = True) -> Optional[str]:
    """Why the run is not sane, None when it is: all `ranks` ranks reported, every rank ran every
    step with a finite loss, and (unless `learning` is False: a run of a few steps, timed for its
    throughput, is too short to show it) the loss fell to LOSS_FALL_FRACTION of its first value."""
    if report.ranks != ranks or len(report.per_rank) != ranks:
        return f"{len(report.per_rank)} of {ranks} rank(s) reported"
    if not report.ok:
        short = [r.rank for r in report.per_rank if len(r.step_times) != report.config.get("steps")]
        return "the run is incomplete" + (f": rank(s) {short} missed steps" if short else ": a loss is not finite")
    return loss_falls(report.losses, LOSS_FALL_FRACTION) if learning else None


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    median_s: float
    over: float  # fraction above the median of all ranks' medians


def stragglers(per_rank: Sequence[RankStats], fraction: float) -> list[Straggler]:
    """Ranks whose median forward time is above the ranks' median by more than `fraction`.

    Every step ends in all-reduces, so whole steps take the same time on every rank: the
    others wait for the slow one. Its own forward pass, before any collective, is what shows
    which rank they wait for.
    """
    medians = {rank.rank: statistics.median(rank.forward_times[1:] or rank.forward_times)
               for rank in per_rank if rank.forward_times}
    if len(medians) < 2:
        return []
    middle = statistics.median(medians.values())
    hosts = {rank.rank: rank.host for rank in per_rank}
    return [Straggler(rank, hosts[rank], median, median / middle - 1)
            for rank, median in sorted(medians.items())
            if middle > 0 and median > middle * (1 + fraction)]


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile: the smallest value with `share` of all values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1))]


def scaling_efficiency(cluster_tokens_per_s: float, single_node: Mapping[str, float]) -> float:
    """Tokens/s on N nodes over N times one node (the median single-node run), as a percentage."""
    nodes = len(single_node)
    baseline = statistics.median(single_node.values())
    return 100.0 * cluster_tokens_per_s / (nodes * baseline)


_ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.MULTILINE)
_ROOT_CAUSE_HOST = re.compile(r"^\s*host\s*:\s*(\S+)", re.MULTILINE)
_ROOT_CAUSE_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


@dataclass(frozen=True)
class FailedRank:
    rank: int
    local_rank: int
    host: str
    exit_code: Optional[int]
    root_cause: bool  # torchrun's "first observed failure"; the others were stopped after it

    def describe(self) -> str:
        how = "" if self.exit_code is None else (
            f" (killed by signal {-self.exit_code})" if self.exit_code < 0 else f" (exit code {self.exit_code})")
        return f"rank {self.rank} (local rank {self.local_rank}) on {self.host}{how}"


def failed_ranks(text: str) -> list[FailedRank]:
    """The ranks torchrun's failure summary names, the root cause first.

    torchrun ends a failed run with "Failures:" (ranks it stopped) and "Root Cause (first
    observed failure):" blocks, one `[i]:` entry per rank with host, rank and exitcode lines.
    """
    found = []
    for section in re.split(r"^(?=Root Cause|Failures:)", text, flags=re.MULTILINE)[1:]:
        root_cause = section.startswith("Root Cause")
        for block in re.split(r"^\s*\[\d+\]:\s*$", section, flags=re.MULTILINE)[1:]:
            rank = _ROOT_CAUSE_RANK.search(block)
            if not rank:
                continue
            host = _ROOT_CAUSE_HOST.search(block)
            code = _ROOT_CAUSE_EXIT.search(block)
            found.append(FailedRank(int(rank.group(1)), int(rank.group(2)),
                                    host.group(1) if host else "?",
                                    int(code.group(1)) if code else None, root_cause))
    return sorted(found, key=lambda failed: not failed.root_cause)


def root_cause(stderr_by_node: Mapping[str, str]) -> Optional[tuple[str, FailedRank]]:
    """The node and rank that failed first in a run across nodes, from every torchrun's summary.

    Each node's torchrun names its own first failure; a rank whose peer died fails too (a lost
    connection, exit code 1), and torchrun stops its other ranks with SIGTERM. A rank that died
    by another signal (SIGKILL, SIGSEGV, the OOM killer) is the cause the others followed.
    """
    causes = [(node, failed) for node, text in stderr_by_node.items()
              for failed in failed_ranks(text) if failed.root_cause]
    died = [(node, failed) for node, failed in causes
            if failed.exit_code is not None and failed.exit_code < 0 and failed.exit_code != -15]
    return (died or causes)[0] if died or causes else None


def launch_cause(launch: Launch, ranks: int) -> Optional[tuple[str, str]]:
    """(node, why) of the rank a failed launch across nodes followed, from every torchrun's
    failure summary (root_cause); None when no summary names one."""
    cause = root_cause({node: result.stderr for node, result in launch.results.items()})
    if cause is None:
        return None
    node, rank = cause
    return node, f"{rank.describe()} failed first (torchrun on {node}); {ranks} rank(s) launched"


# ---------------------------------------------------------------------------------------------
# Running it

def payload_command(python: str, config: ModelConfig, *, marker: str, op_timeout_s: float,
                    checkpoint_dir: Optional[str] = None) -> list[str]:
    """The payload as torchrun starts it on each rank: `python -c SOURCE ...`, nothing on disk."""
    argv = [python, "-c", payloads.load(PAYLOAD)]
    for name, value in asdict(config).items():
        argv += [f"--{name}", str(value)]
    argv += ["--op-timeout", str(int(op_timeout_s)), "--marker", marker]
    if checkpoint_dir:
        argv += ["--checkpoint-dir", checkpoint_dir]
    return argv


def run_on_node(transport: Transport, ranks: int, config: ModelConfig, *, timeout: float,
                checkpoint_dir: Optional[str] = None) -> Result:
    python = transport.node.python
    return torchrun.run_on_node(transport, ranks, lambda marker: payload_command(
        python, config, marker=marker, op_timeout_s=min(timeout, 300), checkpoint_dir=checkpoint_dir),
        timeout=timeout)


def run_across(transports: Mapping[str, Transport], addresses: Mapping[str, str],
               ranks_per_node: int, config: ModelConfig, *, timeout: float,
               checkpoint_dir: Optional[str] = None, socket_ifname: Optional[str] = None,
               join_timeout_s: int = RENDEZVOUS_TIMEOUT_S) -> Launch:
    python = transports[next(iter(transports))].node.python
    return torchrun.run_across(transports, addresses, ranks_per_node, lambda marker: payload_command(
        python, config, marker=marker, op_timeout_s=min(timeout, 300), checkpoint_dir=checkpoint_dir),
        timeout=timeout, socket_ifname=socket_ifname, join_timeout_s=join_timeout_s)


def report_of(launch: Launch) -> tuple[Optional[TrainingReport], Optional[Result]]:
    """The report rank 0 printed (on whichever node it landed) and that node's Result."""
    for result in launch.results.values():
        try:
            return parse_training(result.stdout), result
        except ParseError:
            continue
    return None, None
