"""Training: collective bandwidth (all-reduce busbw; all-gather, reduce-scatter, all-to-all in
`full`) within each node, and all-reduce across all nodes.

Within a node: nccl-tests' `all_reduce_perf` over all GPUs where it is installed, else the torch
payload under torchrun (nccl on GPUs, gloo with two CPU ranks). Across nodes: `all_reduce_perf`
under mpirun from the first node (one rank per GPU) where every node has nccl-tests and mpirun,
else the torch payload, torchrun on every node with a c10d rendezvous on the first. busbw is
judged at the largest size (runners.nccl_tests.peak_busbw, the figure `handover parse
nccl-tests` prints), never nccl-tests' "Avg bus bandwidth"; the NCCL version and NCCL_*
environment go beside every figure, and busbw against message size goes into the report as a
curve (every row of the run). Without torch (and nccl-tests) on a node the checks skip on
cpu-only and fail where the profile expects GPUs.
"""
from __future__ import annotations

from typing import Optional

import pytest

from handover.failures import ExpectationFailure, SanityFailure, excerpt
from runners import collectives, nccl_tests
from runners.collectives import Figure, Plan, plan_for
from runners.launchers import MpirunLauncher
from runners.parsing import ParseError
from runners.transport import Result, Transport
from suites.checks import launch_failure, parsed, require

pytestmark = [pytest.mark.training]

PROBE_STEP = "collectives_probe"
NODE_STEP = "allreduce_node"
CLUSTER_STEP = "allreduce_cluster"
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
    metrics.judge(allreduce_busbw=(round(figure.busbw, 3), "GB/s"))


def measure_other_collective(collective, on_node, profile, measure_other, record) -> Figure:
    """all_gather, reduce_scatter or all_to_all among this node's ranks, sanity checked."""
    probe = probe_of(on_node(PROBE_STEP, collectives.probe))
    plan, why = plan_for(probe, profile)
    if plan is None:
        unavailable(why, profile)
    figure = figure_of(plan, on_node(f"{collective}_node", measure_other(collective)), collective)
    record_curve(record, collective, figure)
    record.note(f"{collective}: " + figure.describe())
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


@pytest.mark.quick
@pytest.mark.cluster
def test_allreduce_spread(cluster_run, profile, measure_node, record):
    """The per-node figures side by side, the slowest nodes named (each node is judged by itself)."""
    probes = cluster_run.gather(PROBE_STEP, collectives.probe)
    figures = {}
    for node, result in cluster_run.gather(NODE_STEP, measure_node).items():
        try:
            plan, _ = plan_for(collectives.parse_probe(probes[node].stdout), profile)
            if plan is not None:
                figures[node] = figure_of(plan, result).busbw
        except (ParseError, AssertionError):
            continue
    if not figures:
        pytest.skip("no node measured an all-reduce")
    slowest = sorted(figures.items(), key=lambda item: item[1])[:SLOWEST_NAMED]
    record.note(f"{len(figures)} node(s) measured; slowest: "
                + ", ".join(f"{node} {busbw:.3f} GB/s" for node, busbw in slowest))


def nccl_tests_across(cluster_run, nodes: list[str], gpus: int, root: bool, acceptance,
                      record) -> Figure:
    """all_reduce_perf under mpirun from the first node, one rank per GPU; sanity, then busbw."""
    first = cluster_run.cluster.node(nodes[0])
    interface = cluster_run.cluster.launch_interface
    launcher = MpirunLauncher(ssh=first.ssh, as_root=root, interfaces=(interface,) if interface else (),
                              export_env=("NCCL_DEBUG",) + ((f"NCCL_SOCKET_IFNAME={interface}",)
                                                            if interface else ()))
    hosts = [cluster_run.cluster.node(node).address for node in nodes]
    result = nccl_tests.run_across(cluster_run.transport(first.name), launcher, hosts, gpus,
                                   timeout=NODE_TIMEOUT_S)
    record.raw(acceptance.save_raw(CLUSTER_STEP, first.name, result.stdout, result.stderr))
    return figure_of(Plan("nccl-tests", gpus * len(nodes), True), result)


def torch_across(cluster_run, nodes: list[str], plans: dict[str, Plan], acceptance, record) -> Figure:
    """The torch payload under torchrun on every node, rendezvous on the first."""
    ranks = plans[nodes[0]].ranks if plans[nodes[0]].gpu else 1
    transports = {node: cluster_run.transport(node) for node in nodes}
    addresses = {node: cluster_run.cluster.node(node).address for node in nodes}
    sizes = collectives.GPU_SIZES if plans[nodes[0]].gpu else collectives.CPU_SIZES
    launch = collectives.run_across(transports, addresses, ranks, sizes=sizes, timeout=NODE_TIMEOUT_S,
                                    socket_ifname=cluster_run.cluster.launch_interface)
    saved = []
    for node, result in launch.results.items():
        saved += acceptance.save_raw(CLUSTER_STEP, node, result.stdout, result.stderr)
    record.raw(saved)
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


@pytest.mark.quick
@pytest.mark.cluster
def test_allreduce_cluster(cluster_run, profile, acceptance, metrics, record):
    """All-reduce busbw across every selected node: nccl-tests under mpirun where every node has
    both, else torchrun on each node with the rendezvous on the first."""
    nodes = [node.name for node in cluster_run.nodes]
    if len(nodes) < 2:
        pytest.skip("needs at least two nodes")
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
        figure = nccl_tests_across(cluster_run, nodes, gpus.pop(), detected[nodes[0]].root,
                                   acceptance, record)
    elif missing_torch:
        unavailable(f"{missing_torch[0]}: torch is missing, and nccl-tests across nodes needs "
                    "all_reduce_perf and mpirun on every node", profile)
    else:
        figure = torch_across(cluster_run, nodes, plans, acceptance, record)
    record_curve(record, "all_reduce", figure)
    record.note(f"{len(nodes)} node(s): " + figure.describe())
    metrics.judge(allreduce_busbw_cluster=(round(figure.busbw, 3), "GB/s"))
