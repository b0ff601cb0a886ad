"""Training: a GPT-style decoder trained with DistributedDataParallel, on every node alone and on
all nodes together, launched by torchrun (runners/training.py).

A cluster can pass every micro-benchmark and still fail the customer's first training job;
this suite runs one. Sanity first: every rank started, ran every step and exited, and the loss
fell far on the fixed synthetic batch. Then the figures: tokens/s (total and per rank, one rank
per GPU), step time median and p99, time to the first step, GPU utilisation and memory from
NVML, stragglers, the scaling from one node to all, and a checkpoint's round trip through the
shared filesystem. Loss curves go into the report, and into TensorBoard event files in the run
directory where tensorboard is installed.

A scaling efficiency below its band, or a run on all nodes that gives none (it hung or broke),
does not just fail the cluster: the node(s) behind it are isolated as the collectives' are
(runners/isolation.py; suites.checks.isolate_below_band, isolate_failed_run), each run a DDP run
of a few steps on a group of nodes, all of a round's groups at once, its figure the group's own
efficiency against its nodes' own runs, a group still running long after the others cut as hung
(suites.checks.HangWatch); the culprits and every step's figure go into the check's message,
within the profile's isolation_budget_s.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from handover.failures import (
    CheckFailure,
    CommandTimedOut,
    ExpectationFailure,
    PerformanceFailure,
    SanityFailure,
    excerpt,
    transport_failure,
)
from reports import tensorboard
from runners import collectives, isolation, training
from runners.parsing import ParseError
from runners.torchrun import Launch
from runners.transport import Result, Transport
from suites.checks import (
    HangWatch,
    at_once,
    fail_isolated,
    hang_floor,
    isolate_below_band,
    isolate_failed_run,
    isolation_outcome,
    judge_isolated,
    launch_failure,
    parsed,
    require,
    require_launchable,
)

pytestmark = [pytest.mark.training]

PROBE_STEP = "collectives_probe"  # the same probe the collectives suite runs: torch, CUDA devices
TIMEOUT_S = {"quick": 600, "full": 1800}
STRAGGLER_FRACTION = 0.2  # unless the profile sets training_straggler_fraction
SCALING_METRIC = "scaling_efficiency"
EFFICIENCY = isolation.Unit("%", 1)  # as scaling_efficiency is judged
ISOLATION_STEP = "training_isolation"
ISOLATION_STEPS = 6  # each isolation run: the quick model for a few steps (the first is warm-up), timed


@dataclass(frozen=True)
class Plan:
    ranks: int  # per node: one per GPU, or two CPU ranks
    model: training.ModelConfig
    gpu: bool


def plan_of(probe: collectives.NodeProbe, profile, depth: str) -> tuple[Optional[Plan], str]:
    """What this node trains with, or why it cannot train."""
    expected_gpus = profile.expect.gpu_count
    if not probe.torch:
        return None, f"{probe.python} on {probe.hostname} cannot import torch"
    if expected_gpus and not probe.cuda_devices:
        return None, (f"torch {probe.torch} sees no CUDA device, but profile {profile.name} "
                      f"expects {expected_gpus} GPU(s)")
    gpu = probe.cuda_devices > 0
    model = training.GPU_MODEL if gpu else training.CPU_MODEL
    if depth == "full":
        model = model.with_steps(training.FULL_STEPS["gpu" if gpu else "cpu"])
    return Plan(probe.cuda_devices or training.CPU_RANKS, model, gpu), ""


def unavailable(why: str, profile) -> None:
    """Skip on a profile without GPUs; fail where the profile expects them."""
    if profile.expect.gpu_count:
        raise ExpectationFailure(f"{why}; profile {profile.name} needs the training run")
    pytest.skip(why)


def probe_result(cluster_run, node: str) -> Result:
    return cluster_run.gather(PROBE_STEP, collectives.probe)[node]


def node_plan(cluster_run, profile, node: str, depth: str) -> Plan:
    """The node's plan; skips or fails (with the reason) when it has none."""
    plan, why = plan_of(parsed(collectives.parse_probe, require(probe_result(cluster_run, node))),
                        profile, depth)
    if plan is None:
        unavailable(why, profile)
    return plan


def checkpoint_path(cluster, nodes: list[str]) -> tuple[Optional[str], str]:
    """Where the checkpoint goes: a shared scratch path; one node may use its local scratch."""
    shared = [entry.path for entry in cluster.scratch if entry.kind == "shared"]
    if shared:
        return shared[0], f"shared scratch {shared[0]}"
    local = [entry.path for entry in cluster.scratch if entry.kind == "local"]
    if len(nodes) == 1 and local:
        return local[0], f"local scratch {local[0]} (one node: its ranks share it)"
    return None, ("no shared scratch path declared" if len(nodes) > 1 else "no scratch path declared")


def node_step(cluster_run, profile, depth: str, checkpoint_dir: Optional[str]) -> Callable[[Transport], Result]:
    """Train on one node alone; with one node selected this is also the run on all nodes."""

    def run(transport: Transport) -> Result:
        found = probe_result(cluster_run, transport.node.name)
        try:
            plan, _ = plan_of(collectives.parse_probe(found.stdout), profile, depth)
        except ParseError:
            plan = None
        if plan is None or not found.ok:
            return found  # the test has skipped or failed on the probe already
        return training.run_on_node(transport, plan.ranks, plan.model, timeout=TIMEOUT_S[depth],
                                    checkpoint_dir=checkpoint_dir)

    return run


def explain_failed_run(result: Result, ranks: int) -> None:
    """Raise the failure of a run that did not exit cleanly, naming the ranks torchrun names."""
    transport_failed = transport_failure(result.failure)
    if transport_failed is not None:
        raise transport_failed(result.explain())
    if result.timed_out:
        raise CommandTimedOut(result.explain(), excerpt(result.stderr))
    failed = training.failed_ranks(result.stderr)
    if failed:
        first = failed[0]
        stopped = [f.describe() for f in failed[1:]]
        raise SanityFailure(f"{result.node}: {first.describe()} failed first"
                            + (f"; then stopped: {', '.join(stopped)}" if stopped else "")
                            + f" ({ranks} rank(s) launched)", excerpt(result.stderr))
    require(result)


def sane_report(result: Result, ranks: int, *, learning: bool = True) -> training.TrainingReport:
    """Every rank started, ran every step and exited cleanly; the loss fell far (when `learning`)."""
    if not result.ok:
        explain_failed_run(result, ranks)
    report = parsed(training.parse_training, result)
    why = training.why_not_sane(report, ranks, learning=learning)
    if why:
        raise SanityFailure(f"{result.node}: {why}")
    return report


def judge_run(report: training.TrainingReport, *, where: str, profile, metrics, record, acceptance,
              check: str) -> None:
    """The run's figures against the profile, its curves in the report, stragglers named."""
    steps = report.step_times()
    slowest_rank = min(report.per_rank, key=lambda rank: rank.tokens_per_s)
    gpus = [gpu for rank in report.per_rank for gpu in (rank.gpus or {}).values()]
    figures = {
        "training_tokens_per_s": (round(report.tokens_per_s or 0, 1), "tokens/s"),
        "tokens_per_s_per_rank": (round(slowest_rank.tokens_per_s, 1), "tokens/s"),
        "step_time_median": (round(statistics.median(steps), 4) if steps else None, "s"),
        "step_time_p99": (round(training.percentile(steps, 0.99), 4) if steps else None, "s"),
        "time_to_first_step": (round(max(rank.first_step_s for rank in report.per_rank), 2), "s"),
    }
    if gpus:
        figures["gpu_util_mean"] = (round(statistics.mean(g["util_mean"] for g in gpus), 1), "%")
        figures["gpu_memory_max"] = (round(max(g["memory_max_gib"] for g in gpus), 2), "GiB")
    losses = list(enumerate(report.losses, start=1))
    record.series("training loss", x=("step", ""), y=("loss", ""), lines={where: losses})
    record.note(f"{report.ranks} rank(s) on {', '.join(report.hosts)}: {report.parameters / 1e6:.1f}M "
                f"parameters, {report.backend} on {report.device}, torch {report.torch}"
                + (f", NCCL {report.nccl_version}" if report.nccl_version else "")
                + f"; loss {report.losses[0]:.3f} -> {report.losses[-1]:.3f} in {len(losses)} steps; "
                + f"{report.tokens_per_s or 0:,.0f} tokens/s")
    tensorboard.write_scalars(acceptance.run_dir, f"{check}/{where}", {
        "loss": losses,
        "step_time_s": list(enumerate((max(r.step_times[i] for r in report.per_rank)
                                       for i in range(len(report.losses))), start=1)),
    })
    fraction = (STRAGGLER_FRACTION if profile.expect.training_straggler_fraction is None
                else profile.expect.training_straggler_fraction)
    slow = training.stragglers(report.per_rank, fraction)
    metrics.judge(**figures)
    if slow:
        raise PerformanceFailure("straggler(s): " + "; ".join(
            f"rank {s.rank} on {s.host}: forward {s.median_s * 1000:.1f} ms, {s.over:.0%} above the ranks' median"
            for s in slow) + f" (limit {fraction:.0%})")


def depth_of(request) -> str:
    return "full" if request.node.get_closest_marker("full") else "quick"


def run_on_every_node(request, cluster_run, cluster, profile, node, record) -> training.TrainingReport:
    """This node's own run (shared by the checks of one depth), sanity checked."""
    depth = depth_of(request)
    plan = node_plan(cluster_run, profile, node, depth)
    nodes = [n.name for n in cluster_run.nodes]
    checkpoint_dir = checkpoint_path(cluster, nodes)[0] if len(nodes) == 1 else None
    result = cluster_run.gather(f"training_node_{depth}", node_step(cluster_run, profile, depth, checkpoint_dir))[node]
    record.raw(cluster_run.raw_paths(f"training_node_{depth}", node))
    return sane_report(result, plan.ranks)


@pytest.mark.quick
def test_training(request, cluster_run, cluster, profile, node, metrics, record, acceptance):
    """A short DDP run on this node alone: sane, loss falling, tokens/s within the band."""
    report = run_on_every_node(request, cluster_run, cluster, profile, node, record)
    acceptance.record_tool(node, "torch", report.torch)
    judge_run(report, where=node, profile=profile, metrics=metrics, record=record,
              acceptance=acceptance, check="training")


@pytest.mark.full
def test_training_sustained(request, cluster_run, cluster, profile, node, metrics, record, acceptance):
    """Minutes of training on this node alone: throughput that holds, no straggler."""
    report = run_on_every_node(request, cluster_run, cluster, profile, node, record)
    judge_run(report, where=node, profile=profile, metrics=metrics, record=record,
              acceptance=acceptance, check="training_sustained")


# ---------------------------------------------------------------------------------------------
# All nodes together


@dataclass(frozen=True)
class ClusterRun:
    """The run on all nodes as every check that reads it sees it: its report or its failure."""

    report: Optional[training.TrainingReport]
    failure: Optional[CheckFailure]
    checkpoint_where: str  # the path's description, or why there is no checkpoint
    nodes: int
    raw: list[str]  # raw output paths of the launch


_cluster_runs: dict[str, ClusterRun] = {}  # depth and nodes -> the one launch every check reads


def run_on_all_nodes(request, cluster_run, cluster, profile, acceptance, record) -> ClusterRun:
    """All selected nodes in one DDP run (one launch per depth, shared by that depth's checks)."""
    depth = depth_of(request)
    nodes = [n.name for n in cluster_run.nodes]
    key = f"{depth}:{','.join(nodes)}"
    plans = {node: node_plan(cluster_run, profile, node, depth) for node in nodes}
    ranks = plans[nodes[0]].ranks
    if any(plan.ranks != ranks for plan in plans.values()):
        raise ExpectationFailure("nodes differ in GPU count: " + ", ".join(
            f"{node} {plan.ranks}" for node, plan in plans.items()))
    if key not in _cluster_runs:
        _cluster_runs[key] = launch_on_all_nodes(cluster_run, cluster, profile, acceptance, depth,
                                                 nodes, plans[nodes[0]])
    run = _cluster_runs[key]
    record.raw(run.raw)
    if run.failure is not None:
        raise run.failure
    return run


def launch_on_all_nodes(cluster_run, cluster, profile, acceptance, depth: str, nodes: list[str],
                        plan: Plan) -> ClusterRun:
    checkpoint_dir, where = checkpoint_path(cluster, nodes)
    if len(nodes) == 1:  # one node: its own run is the run on all nodes
        step = f"training_node_{depth}"
        result = cluster_run.gather(step, node_step(cluster_run, profile, depth, checkpoint_dir))[nodes[0]]
        return judged_launch(lambda: sane_report(result, plan.ranks), where, 1,
                             cluster_run.raw_paths(step, nodes[0]))
    launch, raw = launch_across(cluster_run, cluster, acceptance, f"training_cluster_{depth}", nodes,
                                plan.ranks, plan.model, timeout=TIMEOUT_S[depth], checkpoint_dir=checkpoint_dir)
    return judged_launch(lambda: sane_launch(launch, plan.ranks * len(nodes)), where, len(nodes), raw)


def launch_across(cluster_run, cluster, acceptance, step: str, nodes, ranks: int, model: training.ModelConfig,
                  *, timeout: float, checkpoint_dir: Optional[str] = None) -> tuple[Launch, list[str]]:
    """One DDP run on `nodes` (the rendezvous on the first), every node's raw output saved."""
    require_launchable(cluster_run, nodes, step)
    transports = {node: cluster_run.transport(node) for node in nodes}
    addresses = {node: cluster.node(node).address for node in nodes}
    launch = training.run_across(transports, addresses, ranks, model, timeout=timeout,
                                 checkpoint_dir=checkpoint_dir, socket_ifname=cluster.launch_interface,
                                 join_timeout_s=cluster.launch.rendezvous_timeout_s)
    return launch, [path for result in launch.results.values() for path in acceptance.save_result(step, result)]


def sane_launch(launch: Launch, ranks: int, *, learning: bool = True) -> training.TrainingReport:
    if launch.first_failure is not None:
        launch_failure(launch, training.launch_cause(launch, ranks))
    if launch.leftovers:
        raise SanityFailure("processes left after the run (killed): " + "; ".join(
            f"{node}: {lines.splitlines()[0]}" for node, lines in launch.leftovers.items()))
    report, result = training.report_of(launch)
    if result is None:
        raise SanityFailure("no rank printed the run's report", excerpt(
            "\n".join(r.stdout for r in launch.results.values())))
    return sane_report(result, ranks, learning=learning)


def judged_launch(judge: Callable[[], training.TrainingReport], where: str, nodes: int,
                  raw: list[str]) -> ClusterRun:
    try:
        return ClusterRun(judge(), None, where, nodes, raw)
    except CheckFailure as failure:
        return ClusterRun(None, failure, where, nodes, raw)


@pytest.mark.quick
@pytest.mark.cluster
def test_training_cluster(request, cluster_run, cluster, profile, metrics, record, acceptance):
    """A short DDP run on all selected nodes together."""
    run = run_on_all_nodes(request, cluster_run, cluster, profile, acceptance, record)
    judge_run(run.report, where="cluster", profile=profile, metrics=metrics, record=record,
              acceptance=acceptance, check="training_cluster")


@pytest.mark.full
@pytest.mark.cluster
def test_training_cluster_sustained(request, cluster_run, cluster, profile, metrics, record, acceptance):
    """Minutes of DDP training on all selected nodes together."""
    run = run_on_all_nodes(request, cluster_run, cluster, profile, acceptance, record)
    judge_run(run.report, where="cluster", profile=profile, metrics=metrics, record=record,
              acceptance=acceptance, check="training_cluster_sustained")


def measure_groups(cluster_run, cluster, plan: Plan, single: dict[str, float], acceptance,
                   record) -> isolation.MeasureAtOnce:
    """The isolation's runs: per group a DDP run of ISOLATION_STEPS steps, its efficiency (tokens/s
    over the group's size times the median of its nodes' own runs) the figure."""
    model = plan.model.with_steps(ISOLATION_STEPS)
    hangs: HangWatch[tuple[list[str], isolation.Outcome]] = HangWatch(
        cluster_run.transport, gave_figure=lambda done: done[1].figure is not None,
        floor_s=hang_floor(cluster))

    def measure(groups: list[tuple[str, ...]], round_: int, timeout: float) -> dict[tuple[str, ...], isolation.Outcome]:
        step, timeout = f"{ISOLATION_STEP}_round{round_}", min(TIMEOUT_S["quick"], timeout)

        def run(group: tuple[str, ...]) -> tuple[list[str], isolation.Outcome]:
            raw: list[str] = []
            try:
                launch, raw = launch_across(cluster_run, cluster, acceptance, step, group, plan.ranks, model,
                                            timeout=timeout)
                report = sane_launch(launch, plan.ranks * len(group), learning=False)
            except CheckFailure as failure:
                return raw, isolation_outcome(None, failure, timeout, TIMEOUT_S["quick"])
            own = {node: single[node] for node in group}
            return raw, isolation.Outcome(training.scaling_efficiency(report.tokens_per_s, own))

        done = at_once(groups, run, step, hangs)
        for raw, _ in done.values():
            record.raw(raw)
        return {group: hangs.outcome(group, outcome) for group, (_, outcome) in done.items()}

    return measure


def own_runs(cluster_run, profile, nodes: list[str], ranks: int) -> dict[str, float]:
    """Each node's tokens/s in its own quick run: the baseline of the scaling efficiency."""
    single = {}
    for node in nodes:
        result = cluster_run.gather("training_node_quick", node_step(cluster_run, profile, "quick", None))[node]
        try:
            single[node] = sane_report(result, ranks).tokens_per_s
        except CheckFailure as failure:  # of its kind: a lost node's baseline is unreachable, not insane
            raise type(failure)(f"{node}'s own run, the baseline, failed: {failure}", failure.log,
                                failure.action) from None
    return single


@pytest.mark.quick
@pytest.mark.cluster
def test_training_scaling(request, cluster_run, cluster, profile, metrics, record, acceptance):
    """Tokens/s on all nodes over N times one node (the median node's own run). Below its band,
    or with no figure (the run on all nodes hung or broke), the node(s) behind it are isolated
    (screened, bisected, confirmed) and named with the evidence."""
    nodes = [n.name for n in cluster_run.nodes]
    if len(nodes) < 2:
        pytest.skip("scaling needs at least two nodes")
    plan = node_plan(cluster_run, profile, nodes[0], "quick")
    series = ("training isolation efficiency", "efficiency")
    try:
        run = run_on_all_nodes(request, cluster_run, cluster, profile, acceptance, record)
    except CheckFailure as failure:  # it hung or broke: isolated like a low figure
        verdict = isolate_failed_run(profile, record, cluster_run.nodes, SCALING_METRIC, failure, EFFICIENCY, series,
                                     measure_groups(cluster_run, cluster, plan,
                                                    own_runs(cluster_run, profile, nodes, plan.ranks), acceptance,
                                                    record))
        if verdict is None:
            raise
        fail_isolated(metrics, verdict, failure, f"the training across {len(nodes)} nodes gave no figure")
    single = own_runs(cluster_run, profile, nodes, plan.ranks)
    efficiency = training.scaling_efficiency(run.report.tokens_per_s, single)
    record.series("training tokens/s against nodes", x=("nodes", ""), y=("throughput", "tokens/s"),
                  lines={"measured": [(1, statistics.median(single.values())), (len(nodes), run.report.tokens_per_s)],
                         "linear": [(1, statistics.median(single.values())),
                                    (len(nodes), len(nodes) * statistics.median(single.values()))]})
    record.note(f"{len(nodes)} nodes: {run.report.tokens_per_s:,.0f} tokens/s; one node (median of "
                f"{len(single)}): {statistics.median(single.values()):,.0f} tokens/s; "
                f"efficiency {efficiency:.1f}%")
    verdict = isolate_below_band(profile, record, cluster_run.nodes, SCALING_METRIC, efficiency, EFFICIENCY,
                                 series, measure_groups(cluster_run, cluster, plan, single, acceptance, record))
    judge_isolated(metrics, verdict,  # the scaling table's three rows
                   scaling_efficiency=(round(efficiency, EFFICIENCY.decimals), EFFICIENCY.name),
                   tokens_per_s_one_node=(round(statistics.median(single.values()), 1), "tokens/s"),
                   tokens_per_s_all_nodes=(round(run.report.tokens_per_s, 1), "tokens/s"))


@pytest.mark.quick
@pytest.mark.cluster
def test_checkpoint(request, cluster_run, cluster, profile, metrics, record, acceptance):
    """The run's model and optimizer written to the shared filesystem by rank 0 and read back
    by every rank on every node: same digest, same tensors; write and read times."""
    nodes = [n.name for n in cluster_run.nodes]
    if checkpoint_path(cluster, nodes)[0] is None:
        pytest.skip(checkpoint_path(cluster, nodes)[1])
    run = run_on_all_nodes(request, cluster_run, cluster, profile, acceptance, record)
    saved = [(rank, rank.checkpoint) for rank in run.report.per_rank]
    missing = [rank.rank for rank, checkpoint in saved if checkpoint is None]
    if missing:
        raise SanityFailure(f"rank(s) {missing} made no checkpoint round trip")
    wrong = [f"rank {rank.rank} on {rank.host}: " + (checkpoint.error or "differs from what rank 0 wrote")
             for rank, checkpoint in saved if checkpoint.error or not checkpoint.matches]
    if wrong:
        raise SanityFailure("checkpoint round trip failed: " + "; ".join(wrong))
    written = saved[0][1]
    slowest_read = max(checkpoint.read_s for _, checkpoint in saved)
    record.note(f"{written.bytes / 2**20:.1f} MiB through {run.checkpoint_where}: written in "
                f"{written.write_s:.2f} s, read back by {len(saved)} rank(s) on {run.nodes} node(s), "
                f"slowest {slowest_read:.2f} s; digests and tensors equal")
    metrics.judge(checkpoint_size=(round(written.bytes / 2**20, 2), "MiB"),
                  checkpoint_write_time=(round(written.write_s, 3), "s"),
                  checkpoint_read_time=(round(slowest_read, 3), "s"))
