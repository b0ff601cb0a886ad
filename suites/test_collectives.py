"""Training: collective bandwidth (all-reduce busbw; all-gather, reduce-scatter, all-to-all in
`full`) within each node, and all-reduce across all nodes.

Within a node: nccl-tests' `all_reduce_perf` over all GPUs where it is installed, else the torch
payload under torchrun (nccl on GPUs, gloo with two CPU ranks). Across nodes: `all_reduce_perf`
under the inventory's MPI launcher from the first node (mpirun, or srun under `launch: {engine:
slurm}`; one rank per GPU) where every node has nccl-tests and that launcher,
else the torch payload, torchrun on every node with a c10d rendezvous on the first. busbw is
judged at the largest size (runners.nccl_tests.peak_busbw, the figure `handover parse
nccl-tests` prints), never nccl-tests' "Avg bus bandwidth"; the NCCL version and NCCL_*
environment go beside every figure, and busbw against message size goes into the report as a
curve (every row of the run). Without torch (and nccl-tests) on a node the checks skip on
cpu-only and fail where the profile expects GPUs.

An all-reduce across nodes below its band, or with no figure at all (it hung, or a rank died:
one dead rank or link stops every rank), does not just fail the cluster or name the launching
node: the node(s) behind it are isolated (runners/isolation.py plans it: disjoint groups of
about sqrt(N) nodes at once, the failing ones bisected, each suspect confirmed beside a
known-good node, within the profile's isolation_budget_s; a group still running long after the
others is cut as hung) and named in the check's message with every step's figure. At full depth
allreduce_scales runs the collective at every scale (within each node, pairs, each leaf's and
rack's nodes, the cluster), so a slow spine is told from a bad node; every such run is linear
in the nodes.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

import pytest

from handover.failures import (
    CheckFailure,
    ExpectationFailure,
    SanityFailure,
    excerpt,
)
from runners import collectives, isolation, nccl_tests
from runners.collectives import Figure, Plan, plan_for
from runners.parsing import ParseError
from runners.transport import Result, Transport
from suites.checks import (
    HangWatch,
    at_once,
    band_low,
    fail_isolated,
    first_line,
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

PROBE_STEP = "collectives_probe"
NODE_STEP = "allreduce_node"
CLUSTER_STEP = "allreduce_cluster"
CLUSTER_METRIC = "allreduce_busbw_cluster"
ISOLATION_STEP = "allreduce_isolation"
SCALES_STEP = "allreduce_scales"
SCALES = ("node", "pair", "leaf", "rack", "cluster")
PROBE_ITERS = 3  # each isolation or table run: the largest size only, a few iterations
NODE_TIMEOUT_S = 600
SLOWEST_NAMED = 3


def unavailable(why: str, profile) -> None:
    """Skip on a profile without GPUs; fail where the profile expects them."""
    if profile.expect.gpu_count:
        raise ExpectationFailure(f"{why}; profile {profile.name} needs the collectives measured")
    pytest.skip(why)


def probe_of(result: Result) -> collectives.NodeProbe:
    return parsed(collectives.parse_probe, result)


def planned(cluster_run, profile, node: str) -> tuple[Optional[Plan], Result]:
    """This node's plan from the probe step (None when it cannot run), and the probe's Result."""
    found = cluster_run.gather(PROBE_STEP, collectives.probe)[node]
    try:
        plan, _ = plan_for(collectives.parse_probe(found.stdout), profile)
    except ParseError:
        plan = None
    return (plan if found.ok else None), found


@pytest.fixture(scope="session")
def measure_node(cluster_run, profile):
    """The per-node step: nccl-tests or the torch payload, as the node's probe allows."""

    def measure(transport: Transport) -> Result:
        plan, found = planned(cluster_run, profile, transport.node.name)
        if plan is None:
            return found  # the test has already skipped or failed on the probe
        if plan.tool == "nccl-tests":
            return nccl_tests.run(transport, "all_reduce", plan.ranks, timeout=NODE_TIMEOUT_S)
        sizes = collectives.GPU_SIZES if plan.gpu else collectives.CPU_SIZES
        return collectives.run_on_node(transport, plan.ranks, sizes=sizes, timeout=NODE_TIMEOUT_S)

    return measure


OTHER_COLLECTIVES = ("all_gather", "reduce_scatter", "all_to_all")


@pytest.fixture(scope="session")
def measure_other(cluster_run, profile):
    """measure_other(collective) -> the per-node step for all_gather, reduce_scatter or all_to_all.

    nccl-tests runs one binary per collective; the torch payload measures all three in one
    launch (torch's start-up dominates on CPUs), kept for the other two steps.
    """
    torch_runs: dict[str, Result] = {}

    def for_collective(collective: str):
        def measure(transport: Transport) -> Result:
            node = transport.node.name
            plan, found = planned(cluster_run, profile, node)
            if plan is None:
                return found
            if plan.tool == "nccl-tests":
                return nccl_tests.run(transport, collective, plan.ranks, timeout=NODE_TIMEOUT_S)
            if node not in torch_runs:
                sizes = collectives.GPU_SIZES if plan.gpu else collectives.CPU_SIZES
                torch_runs[node] = collectives.run_on_node(
                    transport, plan.ranks, sizes=sizes, collectives=OTHER_COLLECTIVES,
                    timeout=NODE_TIMEOUT_S)
            return torch_runs[node]

        return measure

    return for_collective


def figure_of(plan: Plan, result: Result, collective: str = "all_reduce") -> Figure:
    """Sanity before figures: data check, every rank present, then busbw at the largest size."""
    if plan.tool == "nccl-tests":
        report = parsed(nccl_tests.parse_nccl_tests, result)
        why = nccl_tests.judge(result, report)
        if why:
            raise SanityFailure(why, excerpt(result.stdout))
        figure, why = collectives.nccl_tests_figure(result, report, plan.ranks)
        if why:
            raise SanityFailure(why)
        return figure
    report = parsed(collectives.parse_collectives, require(result))
    return torch_figure(result.node, report, plan.ranks, collective)


def torch_figure(where: str, report: collectives.CollectivesReport, ranks: int,
                 collective: str = "all_reduce") -> Figure:
    """The payload's figure once its values and ranks are right; a collective its backend
    cannot run skips."""
    why = collectives.report_problem(where, report, ranks)
    if why:
        raise SanityFailure(why)
    if collective in report.unsupported:
        pytest.skip(f"{where}: {collective} is not supported by {report.unsupported[collective]}")
    figure, why = collectives.torch_figure(where, report, collective)
    if why:
        raise SanityFailure(why)
    return figure


def record_curve(record, collective: str, figure: Figure) -> None:
    """busbw against message size, every row of the run, as a curve in the report."""
    record.series(f"{collective.replace('_', '')} busbw", x=("message size", "B"),
                  y=("busbw", "GB/s"), lines=figure.lines, x_scale="log2")


@pytest.mark.quick
def test_allreduce(on_node, profile, measure_node, metrics, record, acceptance, node):
    """All-reduce busbw among this node's ranks (its GPUs, or two CPU ranks)."""
    probe = probe_of(on_node(PROBE_STEP, collectives.probe))
    plan, why = plan_for(probe, profile)
    if plan is None:
        unavailable(why, profile)
    if probe.torch:
        acceptance.record_tool(node, "torch", probe.torch)
    figure = figure_of(plan, on_node(NODE_STEP, measure_node))
    if figure.nccl_version:
        acceptance.record_tool(node, "nccl", figure.nccl_version)
    record_curve(record, "all_reduce", figure)
    record.note(figure.describe())
    skip_one_rank(figure)
    metrics.judge(allreduce_busbw=(round(figure.busbw, 3), "GB/s"))


def skip_one_rank(figure: Figure) -> None:
    """A node with one GPU has nothing to reduce between ranks: skipped with the reason, never
    judged against a band for many ranks."""
    why = figure.unjudgeable()
    if why:
        pytest.skip(why)


def measure_other_collective(collective, on_node, profile, measure_other, record) -> Figure:
    """all_gather, reduce_scatter or all_to_all among this node's ranks, sanity checked."""
    probe = probe_of(on_node(PROBE_STEP, collectives.probe))
    plan, why = plan_for(probe, profile)
    if plan is None:
        unavailable(why, profile)
    figure = figure_of(plan, on_node(f"{collective}_node", measure_other(collective)), collective)
    record_curve(record, collective, figure)
    record.note(f"{collective}: " + figure.describe())
    skip_one_rank(figure)
    return figure


@pytest.mark.full
def test_allgather(on_node, profile, measure_other, metrics, record):
    figure = measure_other_collective("all_gather", on_node, profile, measure_other, record)
    metrics.judge(allgather_busbw=(round(figure.busbw, 3), "GB/s"))


@pytest.mark.full
def test_reducescatter(on_node, profile, measure_other, metrics, record):
    figure = measure_other_collective("reduce_scatter", on_node, profile, measure_other, record)
    metrics.judge(reducescatter_busbw=(round(figure.busbw, 3), "GB/s"))


@pytest.mark.full
def test_alltoall(on_node, profile, measure_other, metrics, record):
    figure = measure_other_collective("all_to_all", on_node, profile, measure_other, record)
    metrics.judge(alltoall_busbw=(round(figure.busbw, 3), "GB/s"))


def node_figures(cluster_run, profile, measure_node) -> dict[str, tuple[Optional[float], str, int]]:
    """node -> (busbw or None, why not, ranks) of each node's own all-reduce (nodes without a plan
    are left out: their own checks say why)."""
    probes = cluster_run.gather(PROBE_STEP, collectives.probe)
    figures = {}
    for node, result in cluster_run.gather(NODE_STEP, measure_node).items():
        try:
            plan, _ = plan_for(collectives.parse_probe(probes[node].stdout), profile)
        except ParseError:
            continue
        if plan is None:
            continue
        try:
            figures[node] = (figure_of(plan, result).busbw, "", plan.ranks)
        except AssertionError as failure:
            figures[node] = (None, first_line(failure), plan.ranks)
    return figures


@pytest.mark.quick
@pytest.mark.cluster
def test_allreduce_spread(cluster_run, profile, measure_node, record):
    """The per-node figures side by side, the slowest nodes named (each node is judged by itself)."""
    figures = {node: busbw for node, (busbw, _, _) in node_figures(cluster_run, profile, measure_node).items()
               if busbw is not None}
    if not figures:
        pytest.skip("no node measured an all-reduce")
    slowest = sorted(figures.items(), key=lambda item: item[1])[:SLOWEST_NAMED]
    record.note(f"{len(figures)} node(s) measured; slowest: "
                + ", ".join(f"{node} {busbw:.3f} GB/s" for node, busbw in slowest))


@dataclass(frozen=True)
class Across:
    """How an all-reduce across nodes runs on this cluster: nccl-tests under mpirun from the first
    node where every node has both, else the torch payload under torchrun on every node."""

    tool: str  # "nccl-tests" or "torch"
    plans: dict[str, Plan]
    gpus: int = 0  # nccl-tests: GPUs (ranks) per node
    root: bool = False  # nccl-tests: mpirun runs as root

    def sizes(self) -> tuple[int, ...]:
        gpu = next(iter(self.plans.values())).gpu
        return collectives.GPU_SIZES if gpu else collectives.CPU_SIZES


def across_plan(cluster_run, profile, nodes: list[str]) -> Across:
    """The launch every run across nodes uses; skips or fails (with the reason) when none can run."""
    probes = cluster_run.gather(PROBE_STEP, collectives.probe)
    plans, missing_torch = {}, []
    for node in nodes:
        probe = probe_of(probes[node])
        plan, why = plan_for(probe, profile)
        if plan is None:
            unavailable(why, profile)
        plans[node] = plan
        if not probe.torch:
            missing_torch.append(node)
    detected = None
    if all(plan.tool == "nccl-tests" for plan in plans.values()):
        detected = nccl_tests.mpirun_everywhere(cluster_run, nodes)
    if detected is not None:
        gpus = {plan.ranks for plan in plans.values()}
        if len(gpus) > 1:
            raise ExpectationFailure("nodes have different GPU counts: " + ", ".join(
                f"{node} {plan.ranks}" for node, plan in plans.items()))
        return Across("nccl-tests", plans, gpus.pop(), detected[nodes[0]].root)
    if missing_torch:
        unavailable(f"{missing_torch[0]}: torch is missing, and nccl-tests across nodes needs "
                    "all_reduce_perf and mpirun on every node", profile)
    return Across("torch", plans)


@dataclass(frozen=True)
class Measured:
    """One all-reduce across a set of nodes: its figure or its failure, and its raw output."""

    figure: Optional[Figure]
    failure: Optional[CheckFailure]
    raw: list[str]
    timeout_s: float

    def outcome(self) -> isolation.Outcome:
        """As the isolation reads it; a timeout shorter than a node's own was the budget's."""
        return isolation_outcome(self.figure.busbw if self.figure is not None else None, self.failure,
                                 self.timeout_s, NODE_TIMEOUT_S)


def nccl_tests_across(cluster_run, nodes: Sequence[str], across: Across, acceptance, step: str,
                      saved: list[str], timeout: float) -> Figure:
    """all_reduce_perf under mpirun from the first node, one rank per GPU; sanity, then busbw."""
    interface = cluster_run.cluster.launch_interface
    launcher = cluster_run.mpi_launcher(nodes[0], as_root=across.root, interfaces=(interface,) if interface else (),
                                        export_env=("NCCL_DEBUG",) + ((f"NCCL_SOCKET_IFNAME={interface}",)
                                                                      if interface else ()),
                                        timeout=timeout)
    hosts = launcher.hosts([cluster_run.cluster.node(node) for node in nodes])
    result = nccl_tests.run_across(cluster_run.transport(nodes[0]), launcher, hosts, across.gpus,
                                   timeout=timeout)
    saved += acceptance.save_result(step, result)
    return figure_of(Plan("nccl-tests", across.gpus * len(nodes), True), result)


def torch_across(cluster_run, nodes: Sequence[str], across: Across, acceptance, step: str,
                 saved: list[str], timeout: float, sizes: Sequence[int], iters: int) -> Figure:
    """The torch payload under torchrun on every node, rendezvous on the first."""
    first = across.plans[nodes[0]]
    ranks = first.ranks if first.gpu else 1
    transports = {node: cluster_run.transport(node) for node in nodes}
    addresses = {node: cluster_run.cluster.node(node).address for node in nodes}
    launch = collectives.run_across(transports, addresses, ranks, sizes=sizes, iters=iters, timeout=timeout,
                                    socket_ifname=cluster_run.cluster.launch_interface,
                                    join_timeout_s=cluster_run.cluster.launch.rendezvous_timeout_s)
    for result in launch.results.values():
        saved += acceptance.save_result(step, result)
    if launch.first_failure is not None:
        launch_failure(launch)
    if launch.leftovers:
        raise SanityFailure("processes left after the run (killed): "
                            + "; ".join(f"{node}: {lines.splitlines()[0]}" for node, lines in launch.leftovers.items()))
    report, result = collectives.report_of(launch)
    if report is None:
        raise SanityFailure("no rank printed a measurement", excerpt(
            "\n".join(r.stdout for r in launch.results.values())))
    return torch_figure(result.node, report, ranks * len(nodes))


def measure_across(cluster_run, across: Across, nodes: Sequence[str], acceptance, step: str, *,
                   timeout: float = NODE_TIMEOUT_S, sizes: Optional[Sequence[int]] = None,
                   iters: int = collectives.ITERS) -> Measured:
    """One all-reduce across `nodes` (all sizes unless given), its failure kept as data."""
    saved: list[str] = []
    try:
        require_launchable(cluster_run, nodes, step)
        if across.tool == "nccl-tests":
            figure = nccl_tests_across(cluster_run, nodes, across, acceptance, step, saved, timeout)
        else:
            figure = torch_across(cluster_run, nodes, across, acceptance, step, saved, timeout,
                                  sizes or across.sizes(), iters)
    except CheckFailure as failure:
        return Measured(None, failure, saved, timeout)
    return Measured(figure, None, saved, timeout)


def measure_at_once(cluster_run, across: Across, groups: Sequence[tuple[str, ...]], acceptance, step: str,
                    timeout: float, hangs: Optional[HangWatch] = None) -> dict[tuple[str, ...], Measured]:
    """One all-reduce per group (disjoint node sets), all at once, each its own launch and
    rendezvous (on its own first node); the largest size only, the one a figure is judged at.
    With `hangs`, a group still running long after the others is cut (suites.checks.HangWatch)."""
    def measure(group: tuple[str, ...]) -> Measured:
        return measure_across(cluster_run, across, group, acceptance, step, timeout=timeout,
                              sizes=across.sizes()[-1:], iters=PROBE_ITERS)

    return at_once(groups, measure, step, hangs)


_cluster_allreduce: dict[tuple[str, ...], Measured] = {}  # nodes -> the one run every check reads


def cluster_allreduce(cluster_run, profile, acceptance) -> tuple[Across, Measured]:
    """The all-reduce across every selected node, run once for the checks that read it."""
    nodes = tuple(node.name for node in cluster_run.nodes)
    if len(nodes) < 2:
        pytest.skip("needs at least two nodes")
    across = across_plan(cluster_run, profile, list(nodes))
    if nodes not in _cluster_allreduce:
        _cluster_allreduce[nodes] = measure_across(cluster_run, across, nodes, acceptance, CLUSTER_STEP)
    return across, _cluster_allreduce[nodes]


def cluster_band(profile) -> Optional[float]:
    """The lowest all-reduce busbw across nodes the profile admits, None when it sets none."""
    return band_low(profile, CLUSTER_METRIC, isolation.BUSBW.name)


def isolate(cluster_run, profile, across: Across, measured: Measured, acceptance,
            record) -> Optional[isolation.Verdict]:
    """Below its band, or with no figure at all (it hung or broke): find the node(s) behind it
    (suites.checks.isolate_below_band, isolate_failed_run: each round's all-reduces at once, the
    largest size only, a hung one cut), within the profile's budget. None when the figure is
    within the band, the failure names its node already, or the profile's isolation_budget_s is 0."""
    hangs: HangWatch[Measured] = HangWatch(cluster_run.transport, gave_figure=lambda run: run.figure is not None,
                                           floor_s=hang_floor(cluster_run.cluster))

    def measure(groups: list[tuple[str, ...]], round_: int, timeout: float) -> dict[tuple[str, ...], isolation.Outcome]:
        measured = measure_at_once(cluster_run, across, groups, acceptance, f"{ISOLATION_STEP}_round{round_}",
                                   min(NODE_TIMEOUT_S, timeout), hangs)
        for result in measured.values():
            record.raw(result.raw)
        return {group: hangs.outcome(group, result.outcome()) for group, result in measured.items()}

    series = ("allreduce isolation busbw", "busbw")
    if measured.failure is not None:
        return isolate_failed_run(profile, record, cluster_run.nodes, CLUSTER_METRIC, measured.failure,
                                  isolation.BUSBW, series, measure)
    assert measured.figure is not None
    return isolate_below_band(profile, record, cluster_run.nodes, CLUSTER_METRIC, measured.figure.busbw,
                              isolation.BUSBW, series, measure)


@pytest.mark.quick
@pytest.mark.cluster
def test_allreduce_cluster(cluster_run, profile, acceptance, metrics, record):
    """All-reduce busbw across every selected node: nccl-tests under mpirun where every node has
    both, else torchrun on each node with the rendezvous on the first. Below its band, the
    node(s) behind it are isolated (screened, bisected, confirmed) and named with the evidence."""
    across, measured = cluster_allreduce(cluster_run, profile, acceptance)
    record.raw(measured.raw)
    if measured.failure is not None:
        failure = measured.failure
        verdict = isolate(cluster_run, profile, across, measured, acceptance, record)
        if verdict is None:
            raise failure
        fail_isolated(metrics, verdict, failure, f"the all-reduce across {len(cluster_run.nodes)} nodes gave no figure")
    figure = measured.figure
    assert figure is not None
    record_curve(record, "all_reduce", figure)
    record.note(f"{len(cluster_run.nodes)} node(s): " + figure.describe())
    verdict = isolate(cluster_run, profile, across, measured, acceptance, record)
    judge_isolated(metrics, verdict, **{CLUSTER_METRIC: (round(figure.busbw, 3), "GB/s")})


@pytest.mark.full
@pytest.mark.cluster
def test_allreduce_scales(cluster_run, profile, measure_node, acceptance, metrics, record):
    """All-reduce busbw at every scale: within each node, pairs (a ring), the nodes under each
    leaf and each rack (inventory `leaf:`/`rack:`), and the whole cluster, so a slow spine is
    told from a bad node. The table and its reading go into the results; each scale's figures
    are judged by the checks that own them (allreduce, allreduce_cluster)."""
    across, measured = cluster_allreduce(cluster_run, profile, acceptance)
    everyone, cluster_outcome = tuple(n.name for n in cluster_run.nodes), measured.outcome()
    runs = [isolation.ScaleRun("node", node, (node,), busbw, why)
            for node, (busbw, why, ranks) in node_figures(cluster_run, profile, measure_node).items() if ranks > 1]
    skipped = {} if runs else {"node": "no node runs more than one rank: nothing to reduce within a node"}
    for level in isolation.scale_levels(cluster_run.nodes):
        if level.skipped:
            skipped[level.name] = level.skipped
        for index, groups in enumerate(level.rounds, start=1):
            # The pair of a two-node cluster is the cluster: its all-reduce is read, not run again.
            outcomes = {group: cluster_outcome for group in groups if set(group) == set(everyone)}
            others = [group for group in groups if group not in outcomes]
            step = f"{SCALES_STEP}_{level.name}{index}"
            for group, result in measure_at_once(cluster_run, across, others, acceptance, step, NODE_TIMEOUT_S).items():
                record.raw(result.raw)
                outcomes[group] = result.outcome()
            runs += [isolation.ScaleRun(level.name, level.labels.get(group, "-".join(group)), group,
                                        outcomes[group].figure, outcomes[group].why) for group in groups]
    runs.append(isolation.ScaleRun("cluster", "cluster", everyone, cluster_outcome.figure, cluster_outcome.why))
    node_reference = profile.references.get("allreduce_busbw")
    bounds = dict.fromkeys(("pair", "leaf", "rack", "cluster"), cluster_band(profile))
    bounds["node"] = node_reference.low_bound if node_reference is not None else None
    table = [isolation.level_line(level, [run for run in runs if run.level == level]) if level not in skipped
             else f"{level}: skipped ({skipped[level]})" for level in SCALES]
    record.note("; ".join(table) + ". " + isolation.read_scales(runs, bounds))
    figures = {}
    for level in SCALES:
        values = [run.busbw for run in runs if run.level == level and run.busbw is not None]
        if values:
            figures[f"allreduce_busbw_{level}_median"] = (round(statistics.median(values), 3), "GB/s")
            figures[f"allreduce_busbw_{level}_min"] = (round(min(values), 3), "GB/s")
    metrics.judge(**figures)
