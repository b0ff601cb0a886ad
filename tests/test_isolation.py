"""The isolation planner, its round loop and the multi-scale table (runners/isolation.py), without nodes.

A model cluster stands in for the collective: a run's busbw is the slowest member's speed
(1.0 GB/s for a good node, 0.1 for a bad one), which is what a ring all-reduce does, and every
round takes the same time. The suite runs the same plan on real nodes (test_collectives.py).
"""
from __future__ import annotations

import math
import random
import re
import signal
import threading

import pytest
from nodes import wait_for_no_leftovers

from inventory.loader import load_inventory
from inventory.model import Node
from runners import isolation
from runners.isolation import BISECT, CONFIRM, SCREEN, Isolation, Outcome, ScaleRun
from runners.transport import LocalTransport, Result
from suites.checks import HangWatch, at_once, hang_floor

GOOD, BAD, BAND = 1.0, 0.1, 0.5
ROUND_S = 10.0


def names(count: int) -> list[str]:
    return [f"n{i:04d}" for i in range(1, count + 1)]


def simulate(nodes, bad, budget_s=isolation.DEFAULT_BUDGET_S, cut_after=None):
    """Run the plan to its end against the model; every run's node set checked for overlap."""
    plan = Isolation(nodes, BAND, budget_s=budget_s,
                     cluster=Outcome(BAD if bad else GOOD))
    spent, cleared_before = 0.0, set()
    while runs := plan.next_round(spent):
        members = [node for run in runs for node in run.nodes]
        assert len(members) == len(set(members)), f"a node in two runs of one round: {runs}"
        for run in runs:
            if run.phase == CONFIRM:
                assert run.nodes[1] in cleared_before, f"{run.nodes[1]} was not known good"
            if cut_after is not None and plan.timeout_s(spent) < cut_after:
                plan.record(run, Outcome(None, "timed out", cut=True))
            else:
                plan.record(run, Outcome(BAD if set(run.nodes) & set(bad) else GOOD))
        spent += ROUND_S
        cleared_before = set(plan.verdict().cleared)
    return plan.verdict()


@pytest.mark.parametrize("count", [4, 5, 8, 9, 16, 17, 50, 64, 1024])
def test_one_bad_node_is_named_and_every_other_node_cleared(count):
    nodes = names(count)
    for bad in {nodes[0], nodes[count // 2], nodes[-1]}:
        verdict = simulate(nodes, {bad})
        assert verdict.culprits == (bad,), verdict.summary()
        assert set(verdict.cleared) == set(nodes) - {bad} and not verdict.unresolved
        # one screen round, bisection down to about 3 nodes, one confirmation round
        assert verdict.rounds <= 2 + math.ceil(math.log2(isolation.group_size(count))), verdict.summary()
        assert len(verdict.steps) <= 2 * count  # linear in nodes, never all pairs


def test_the_evidence_is_every_step_the_culprit_took_part_in():
    verdict = simulate(names(8), {"n0005"})
    assert [step.run.phase for step in verdict.evidence("n0005")] == ["cluster", SCREEN, CONFIRM]
    summary = verdict.summary()
    assert summary.startswith("isolated n0005 (cluster n0001..n0008 (8 nodes) 0.100 GB/s; "
                              "screen n0004,n0005,n0006 0.100 GB/s; confirm n0005 with n0002 0.100 GB/s)")
    assert "cleared 7 of 8 node(s); 2 round(s) in 20 s of a 600 s budget" in summary
    assert "band >= 0.5 GB/s" in summary


def test_screen_groups_are_disjoint_about_sqrt_n_and_cover_every_node():
    for count in range(2, 200):
        groups = isolation.screen_groups(names(count))
        assert [node for group in groups for node in group] == names(count)
        assert all(2 <= len(group) <= 2 * isolation.group_size(count) for group in groups)
        assert len(groups) <= isolation.group_size(count) + 1
    assert [len(g) for g in isolation.screen_groups(names(8))] == [3, 3, 2]
    assert [len(g) for g in isolation.screen_groups(names(10))] == [4, 4, 2]
    assert [len(g) for g in isolation.screen_groups(names(7))] == [3, 4]  # a last node alone joins


def test_large_groups_are_bisected_before_confirmation():
    verdict = simulate(names(64), {"n0030"})
    phases = [step.run.phase for step in verdict.evidence("n0030")]
    assert phases[:2] == ["cluster", SCREEN] and BISECT in phases and phases[-1] == CONFIRM
    assert len([step for step in verdict.steps if step.run.phase == SCREEN]) == 8


@pytest.mark.parametrize("bad", [("n0002", "n0003"), ("n0002", "n0014"), ("n0001", "n0016")])
def test_two_bad_nodes_in_one_group_or_two(bad):
    verdict = simulate(names(16), set(bad))
    assert sorted(verdict.culprits) == sorted(bad), verdict.summary()
    assert len(verdict.cleared) == 14 and not verdict.unresolved


def test_budget_exhausted_says_what_it_could_not_finish():
    """Rounds of 10 s in a 25 s budget: the screen and the bisection run, the confirmation not."""
    verdict = simulate(names(64), {"n0030"}, budget_s=25)
    assert verdict.rounds == 2 and not verdict.culprits
    assert verdict.unresolved and set(verdict.unresolved) <= {f"n{i:04d}" for i in range(25, 33)}
    assert all("10 s" in why and "25 s budget" in why for why in verdict.unresolved.values())
    summary = verdict.summary()
    assert "no single node isolated" in summary and "not finished: " in summary
    assert "2 round(s) in 20 s of a 25 s budget" in summary


def test_runs_cut_by_the_budget_leave_their_nodes_unresolved():
    """The second round's runs get 15 s of the budget and need 20: its bisection is cut."""
    verdict = simulate(names(16), {"n0003"}, budget_s=25, cut_after=20)
    assert verdict.rounds == 2 and not verdict.culprits
    assert set(verdict.unresolved) == {"n0001", "n0002", "n0003", "n0004"}
    assert all(why == "its bisect run was cut by the budget" for why in verdict.unresolved.values())
    assert "(cut by the budget)" in "; ".join(step.describe() for step in verdict.steps)


def test_every_group_meeting_the_band_points_at_the_fabric_between_groups():
    verdict = simulate(names(9), set())
    assert not verdict.culprits and set(verdict.cleared) == set(names(9)) and verdict.rounds == 1
    assert "between the groups (spine or fabric)" in verdict.summary()


@pytest.mark.parametrize("bad", ["n0001", "n0002", "n0003"])
def test_three_nodes_pair_suspects_with_each_other_until_one_is_known_good(bad):
    verdict = simulate(names(3), {bad})
    assert verdict.culprits == (bad,) and len(verdict.cleared) == 2, verdict.summary()


def test_no_known_good_node_leaves_the_suspects_unconfirmed():
    verdict = simulate(names(2), {"n0001"})
    assert verdict.rounds == 0 and not verdict.culprits
    assert verdict.unresolved == {node: "awaiting confirmation: no node was cleared to pair it with"
                                  for node in names(2)}
    every_bad = simulate(names(9), set(names(9)))
    assert not every_bad.culprits and "whole fabric is slow" in every_bad.summary()


def test_a_run_without_a_figure_counts_as_missing_the_band():
    plan = Isolation(names(4), BAND)
    first = plan.next_round(0)
    assert [run.nodes for run in first] == [("n0001", "n0002"), ("n0003", "n0004")]
    plan.record(first[0], Outcome(None, "rank 1 failed"))
    plan.record(first[1], Outcome(GOOD))
    confirm = plan.next_round(ROUND_S)
    assert [run.nodes for run in confirm] == [("n0001", "n0003"), ("n0002", "n0004")]
    with pytest.raises(ValueError, match="record the outcome"):
        plan.next_round(ROUND_S)
    assert "screen n0001,n0002 no figure (rank 1 failed)" in [step.describe() for step in plan.steps]


class Clock:
    """The budget's time: each round of the model takes ROUND_S."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_run_rounds_measures_each_round_at_once_until_the_plan_ends():
    """The loop both suites share: one call per round with disjoint groups, the round's number
    and what is left of the budget; the verdict is what the plan alone would give."""
    clock, calls = Clock(), []

    def measure(groups, round_, timeout_s):
        calls.append((round_, timeout_s, list(groups)))
        clock.now += ROUND_S
        return {group: Outcome(BAD if "n0005" in group else GOOD) for group in groups}

    verdict = isolation.run_rounds(Isolation(names(8), BAND, budget_s=100, cluster=Outcome(BAD)), measure, clock)
    assert verdict == simulate(names(8), {"n0005"}, budget_s=100)
    assert [(round_, timeout_s) for round_, timeout_s, _ in calls] == [(1, 100.0), (2, 90.0)]
    assert calls[0][2] == [("n0001", "n0002", "n0003"), ("n0004", "n0005", "n0006"), ("n0007", "n0008")]
    assert verdict.figures_by_phase() == {"cluster": [(0, BAD)], "screen": [(1, GOOD), (1, BAD), (1, GOOD)],
                                          "confirm": [(2, GOOD), (2, BAD), (2, GOOD)]}


def test_any_figure_with_its_unit_reads_in_that_unit():
    """A training run's efficiency in %, one decimal, where the all-reduce writes GB/s with three."""
    percent = isolation.Unit("%", 1)
    plan = Isolation(names(4), 40.0, unit=percent, cluster=Outcome(27.46))
    while runs := plan.next_round(0):
        for run in runs:
            plan.record(run, Outcome(21.04 if "n0003" in run.nodes else 96.5))
    summary = plan.verdict().summary()
    assert summary.startswith("isolated n0003 (cluster n0001,n0002,n0003,n0004 27.5 %; screen n0003,n0004 21.0 %; "
                              "confirm n0003 with n0001 21.0 %)"), summary
    assert "band >= 40 %; cleared 3 of 4 node(s)" in summary
    assert isolation.BUSBW.format(0.0351) == "0.035 GB/s"


def test_nodes_must_be_distinct_and_two_or_more():
    with pytest.raises(ValueError, match="distinct"):
        Isolation(["a", "a"], BAND)
    with pytest.raises(ValueError, match="two"):
        Isolation(["a"], BAND)


# ---------------------------------------------------------------------------------------------
# The multi-scale table


def node(name, rack=None, leaf=None) -> Node:
    return Node(name=name, address=name, transport="ssh", rack=rack, leaf=leaf)


def test_scales_without_placement_skip_leaf_and_rack_with_the_reason():
    pair, leaf, rack = isolation.scale_levels([node(n) for n in names(5)])
    assert [len(r) for r in pair.rounds] == [2, 2, 1]  # a ring: five pairs, each node in two
    assert leaf.skipped == "the inventory gives no leaf: for any node" and not leaf.rounds
    assert rack.skipped == "the inventory gives no rack: for any node"


def test_scales_group_by_leaf_and_rack_in_one_round_each():
    nodes = [node("a1", "r1", "l1"), node("b1", "r2", "l3"), node("a2", "r1", "l1"),
             node("a3", "r1", "l2"), node("a4", "r1", "l2"), node("b2", "r2", "l3"), node("c1")]
    assert [n.name for n in isolation.placement_order(nodes)] == ["a1", "a2", "a3", "a4", "b1", "b2", "c1"]
    pair, leaf, rack = isolation.scale_levels(nodes)
    assert leaf.rounds == ((("a1", "a2"), ("a3", "a4"), ("b1", "b2")),)
    assert leaf.labels[("a3", "a4")] == "l2"
    assert rack.rounds == ((("a1", "a2", "a3", "a4"), ("b1", "b2")),)
    assert ("a2", "a3") in pair.rounds[0] + pair.rounds[1]  # ring neighbours follow placement
    one_rack = isolation.scale_levels([node(n, rack="r9") for n in names(3)])[2]
    assert one_rack.skipped == "every node is under rack r9: the cluster row measures it"
    alone = isolation.placement_level([node("x", leaf="l1"), node("y", leaf="l2")], "leaf")
    assert alone.skipped == "no leaf holds two or more nodes"


def scale_runs(pair_figures: dict, leaf_figures: dict, cluster: float) -> list[ScaleRun]:
    runs = [ScaleRun("pair", "-".join(p), p, v) for p, v in pair_figures.items()]
    runs += [ScaleRun("leaf", label, nodes, v) for (label, nodes), v in leaf_figures.items()]
    return runs + [ScaleRun("cluster", "cluster", ("a", "b", "c", "d"), cluster)]


BOUNDS = {"pair": BAND, "leaf": BAND, "cluster": BAND, "node": BAND}
RING = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]
LEAVES = [("l1", ("a", "b")), ("l2", ("c", "d"))]


def test_the_table_tells_a_bad_node_from_a_slow_spine():
    bad_c = scale_runs({p: BAD if "c" in p else GOOD for p in RING},
                       {leaf: BAD if "c" in leaf[1] else GOOD for leaf in LEAVES}, BAD)
    assert isolation.read_scales(bad_c, BOUNDS) == "every pair of c is low: bad node(s), not the fabric"
    noisy = scale_runs({p: BAD if "a" in p else GOOD for p in RING}, dict.fromkeys(LEAVES, GOOD), GOOD)
    assert isolation.read_scales(noisy, BOUNDS) == "low runs with no single pattern: pair a-b, pair d-a"
    spine = scale_runs(dict.fromkeys(RING, GOOD), dict.fromkeys(LEAVES, GOOD), BAD)
    assert "the spine" in isolation.read_scales(spine, BOUNDS)
    leaf = scale_runs(dict.fromkeys(RING, GOOD), {LEAVES[0]: GOOD, LEAVES[1]: BAD}, BAD)
    assert isolation.read_scales(leaf, BOUNDS).startswith("leaf group(s) l2 low with no bad node")
    healthy = scale_runs(dict.fromkeys(RING, GOOD), dict.fromkeys(LEAVES, GOOD), GOOD)
    assert isolation.read_scales(healthy, BOUNDS) == "every scale meets its band"
    assert isolation.read_scales(healthy, {}) == "no band to judge the scales against"


def test_a_table_line_names_the_slowest_run_and_those_without_a_figure():
    runs = [ScaleRun("pair", "a-b", ("a", "b"), 0.4), ScaleRun("pair", "b-c", ("b", "c"), 0.1),
            ScaleRun("pair", "c-a", ("c", "a"), None, "timed out")]
    assert isolation.level_line("pair", runs) == \
        "pair: 3 run(s), median 0.250, min 0.100 GB/s (b-c), no figure from c-a"


def test_a_groups_failure_waits_for_the_other_groups_and_ctrl_c_does_not():
    """The groups of a round run at once. An error in one is raised once the others have ended
    (their runs hold the nodes the next check needs); a Ctrl-C is raised at once, the groups'
    remote work left to the session's end, which kills it (an executor waited out every group's
    run first, up to its timeout)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Ctrl-C reaches the main thread only, as KeyboardInterrupt by Python's own handler")
    ended = []

    def failing(group):
        if group == "bad":
            raise ValueError("no figure")
        ended.append(group)
        return group

    with pytest.raises(ValueError, match="no figure"):
        at_once(["bad", "good"], failing, "rounds")
    assert ended == ["good"]

    release = threading.Event()

    def interrupted(group):
        if group == "ctrl-c":
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return group
        release.wait(60)  # a bound if the interrupt never comes, not a speed measure
        return group

    with pytest.raises(KeyboardInterrupt):
        at_once(["ctrl-c", "running"], interrupted, "ctrlc")
    still_running = not release.is_set()
    release.set()
    assert still_running


def test_a_pair_round_takes_its_suspects_off_the_wait_and_the_cleared_keep_inventory_order():
    """No node cleared: n0001, n0004, n0005, n0002, n0003 are all suspects, paired with each other
    but for n0003, which waits; n0005-n0002 meets the band, so the next round confirms n0003 and
    n0001 with them. Cleared in the order n0005, n0002, they are listed in inventory order."""
    verdict = simulate(names(5), {"n0001", "n0003", "n0004"})
    assert [step.run.describe() for step in verdict.steps if step.round == 3] == [
        "pair n0001,n0004", "pair n0005,n0002"]
    assert [step.run.describe() for step in verdict.steps if step.round == 4] == [
        "confirm n0003 with n0005", "confirm n0001 with n0002"]
    assert verdict.culprits == ("n0003", "n0001", "n0004") and not verdict.unresolved
    assert verdict.cleared == ("n0002", "n0005")


def test_a_hang_is_cut_at_five_times_the_longest_run_with_a_figure_and_never_before_the_floor():
    assert isolation.hang_cut_s([]) is None  # nothing finished: nothing to compare with
    assert isolation.hang_cut_s([4.0, 20.0, 9.0]) == 100.0
    assert isolation.hang_cut_s([3.0]) == isolation.HANG_FLOOR_S
    assert isolation.hang_cut_s([3.0], floor_s=2.0) == 15.0


def test_the_hang_floor_is_the_profiles_where_it_sets_one_else_no_shorter_than_the_rendezvous(tmp_path):
    """isolation_hang_floor_s, overridden with its reason by an inventory: the watch's floor.
    Unset, a run is not cut before its rendezvous could have ended (launch.rendezvous_timeout_s)."""
    plain = tmp_path / "plain.yaml"
    plain.write_text("cluster: lab\nprofile: cpu-only\ntransport: local\nnodes: [n1]\n")
    assert hang_floor(load_inventory(plain)) == isolation.HANG_FLOOR_S
    patient = tmp_path / "patient.yaml"
    patient.write_text(plain.read_text() + "expect:\n  isolation_hang_floor_s: "
                       "{value: 300, reason: \"srun starts the groups in minutes here\"}\n")
    assert hang_floor(load_inventory(patient)) == 300.0
    slow_start = tmp_path / "slow_start.yaml"
    slow_start.write_text(plain.read_text() + "launch: {rendezvous_timeout_s: 240}\n")
    assert hang_floor(load_inventory(slow_start)) == 240.0
    quick_start = tmp_path / "quick_start.yaml"
    quick_start.write_text(plain.read_text() + "launch: {rendezvous_timeout_s: 20}\n")
    assert hang_floor(load_inventory(quick_start)) == isolation.HANG_FLOOR_S


@pytest.mark.parametrize("count", [4, 17, 1024])
def test_a_run_that_gave_no_figure_is_isolated_with_any_figure_passing(count):
    """No band: the cluster run failed (a dead rank), every run with the bad node fails, and any
    figure clears a run's nodes, however low."""
    nodes = names(count)
    bad = nodes[count // 3]
    plan = Isolation(nodes, None, cluster=Outcome(None, "timeout"))
    spent = 0.0
    while runs := plan.next_round(spent):
        for run in runs:
            plan.record(run, Outcome(None, "hung") if bad in run.nodes else Outcome(0.001))
        spent += ROUND_S
    verdict = plan.verdict()
    assert verdict.culprits == (bad,) and len(verdict.cleared) == count - 1, verdict.summary()
    summary = verdict.summary()
    assert summary.startswith(f"isolated {bad} (cluster ") and "no figure (timeout)" in summary
    assert "a run passes by giving a figure; cleared" in summary and "band >=" not in summary


def test_with_no_band_the_findings_speak_of_figures_not_of_the_band():
    every_group = Isolation(names(9), None, cluster=Outcome(None, "sanity"))
    for run in every_group.next_round(0.0):
        every_group.record(run, Outcome(0.2))
    assert "every group of about 3 node(s) gave a figure while all nodes together did not: the failure " \
           "is between the groups" in every_group.verdict().summary()
    none = Isolation(names(4), None, cluster=Outcome(None, "sanity"))
    while runs := none.next_round(0.0):
        for run in runs:
            none.record(run, Outcome(None, "exit 1"))
    assert "no run gave a figure, so no node could be cleared: the whole fabric is failing" in none.verdict().summary()


def test_a_group_still_running_long_after_the_others_is_cut_on_its_node_and_named_hung():
    """Real commands on this machine: two groups sleep 1 s, the third sleeps 300 s. Once it has run
    five times the longest finished run (at least the floor, 2 s here), the watch kills its
    command on its node, and the round ends with it named hung."""
    transports = {name: LocalTransport(Node(name, "localhost", "local")) for name in ("a", "b", "c")}
    marker = f"{random.randint(300, 899)}.{random.randint(1, 10**6)}"
    seconds = {"a": "1", "b": "1.2", "c": marker}
    watch: HangWatch[Result] = HangWatch(transports.__getitem__, gave_figure=lambda result: result.ok, floor_s=2.0)
    try:
        results = at_once([(name,) for name in transports],
                          lambda group: transports[group[0]].run(["sleep", seconds[group[0]]], timeout=600),
                          "hangs", watch)
    finally:
        for transport in transports.values():
            transport.close()
    assert results[("a",)].ok and results[("b",)].ok and not results[("c",)].ok, results
    assert list(watch.hung) == [("c",)] and watch.hung[("c",)].startswith("hung: still running after "), watch.hung
    assert re.search(r"while the longest run that gave a figure took \d+ s$", watch.hung[("c",)]), watch.hung
    assert watch.outcome(("c",), Outcome(1.0)) == Outcome(None, watch.hung[("c",)])
    assert watch.outcome(("a",), Outcome(1.0)) == Outcome(1.0)
    assert not wait_for_no_leftovers(f"sleep {marker}")
