"""The schedules (circle, ring, sample), port allocation, attribution, the second pass and each
node's links: pure."""
from __future__ import annotations

import itertools
import random

import pytest

from inventory.model import Node
from runners.pairs import (
    LOW_FRACTION,
    Attribution,
    Link,
    PairOutcome,
    PairRun,
    PairVerdicts,
    attribute,
    by_kind,
    circle_rounds,
    findings,
    greedy_rounds,
    kinds_by_pair,
    link_action,
    median_of,
    off_median,
    other,
    pair_id,
    pair_rail_id,
    pair_schedule,
    pair_state,
    placement_order,
    ports_for,
    ring_pairs,
    ring_rounds,
    run_rounds,
    sample_pairs,
    schedule,
    second_pass_pairs,
    unreached_ends,
)
from runners.transport import Result


def names(count: int) -> list[str]:
    return [f"n{i:02d}" for i in range(1, count + 1)]


def assert_disjoint(rounds) -> None:
    for round_pairs in rounds:
        seen = [node for pair in round_pairs for node in pair]
        assert len(seen) == len(set(seen)), f"a node twice in one round: {round_pairs}"


@pytest.mark.parametrize("count", range(2, 34))
def test_circle_covers_every_pair_once_in_n_minus_1_rounds_of_disjoint_pairs(count):
    nodes = names(count)
    rounds = circle_rounds(nodes)
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)
    flat = [pair for round_pairs in rounds for pair in round_pairs]
    assert sorted(flat) == sorted(itertools.combinations(nodes, 2))
    assert_disjoint(rounds)
    idle = [set(nodes) - {n for pair in r for n in pair} for r in rounds]
    assert all(len(left) == count % 2 for left in idle)  # odd: exactly one node sits out a round


@pytest.mark.parametrize("count", range(2, 34))
def test_ring_puts_every_node_in_two_pairs_in_two_or_three_rounds(count):
    nodes = names(count)
    rounds = ring_rounds(nodes)
    assert_disjoint(rounds)
    flat = [pair for round_pairs in rounds for pair in round_pairs]
    assert sorted(flat) == sorted(ring_pairs(nodes)) and len(set(flat)) == len(flat)
    per_node = {n: sum(n in pair for pair in flat) for n in nodes}
    assert set(per_node.values()) == ({1} if count == 2 else {2})
    assert len(rounds) <= (2 if count % 2 == 0 else 3)


@pytest.mark.parametrize("count", range(2, 34))
def test_ports_are_distinct_within_a_round(count):
    for round_pairs in circle_rounds(names(count)):
        ports = ports_for(round_pairs, 5201)
        assert len(set(ports.values())) == len(round_pairs) and min(ports.values()) == 5201


def test_fewer_than_two_nodes_have_no_pairs():
    assert circle_rounds(["a"]) == [] and ring_rounds(["a"]) == [] and circle_rounds([]) == []


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        circle_rounds(["a", "b", "a"])


def test_schedule_of_all_pairs_is_the_circle_and_of_a_subset_first_fit():
    nodes = names(6)
    assert schedule(nodes, itertools.combinations(nodes, 2)) == circle_rounds(nodes)
    subset = [("n02", "n01"), ("n03", "n04"), ("n01", "n03")]
    assert schedule(nodes, subset) == [[("n01", "n02"), ("n03", "n04")], [("n01", "n03")]]
    assert_disjoint(greedy_rounds(ring_pairs(nodes)))


def test_run_rounds_runs_each_pair_once_with_its_port():
    calls = []
    rounds = circle_rounds(names(5))
    outcome = run_rounds(rounds, 6000, lambda pair, port: calls.append((pair, port)) or port)
    assert sorted(p for p, _ in calls) == sorted(itertools.combinations(names(5), 2))
    assert list(outcome) == [pair for r in rounds for pair in r]
    assert pair_id(("n01", "n02")) == "n01-n02"


def outcomes(failed: set, pairs) -> dict:
    return {pair: pair not in failed for pair in pairs}


def test_a_node_whose_pairs_all_fail_is_the_suspect_not_its_partners():
    nodes = names(4)
    pairs = ring_pairs(nodes)  # n01-n02, n02-n03, n03-n04, n01-n04
    result = attribute(outcomes({("n02", "n03"), ("n03", "n04")}, pairs))
    assert list(result.suspect_nodes) == ["n03"] and not result.suspect_links
    assert "all 2 of its pairs failed" in result.summary() and "node n03" in result.summary()


def test_one_low_pair_between_healthy_nodes_blames_the_link():
    pairs = list(itertools.combinations(names(4), 2))
    result = attribute(outcomes({("n01", "n04")}, pairs))
    assert not result.suspect_nodes
    assert result.suspect_links == {("n01", "n04"): "failed while both nodes passed with other partners"}


def test_all_pairs_with_one_dead_node():
    nodes = names(5)
    pairs = list(itertools.combinations(nodes, 2))
    result = attribute(outcomes({p for p in pairs if "n05" in p}, pairs))
    assert list(result.suspect_nodes) == ["n05"] and not result.suspect_links


def test_two_nodes_one_failed_pair_cannot_tell_node_from_link():
    result = attribute({("a", "b"): False})
    assert not result.suspect_nodes and ("a", "b") in result.suspect_links
    assert attribute({("a", "b"): True}).clean


def test_second_pass_pairs_failing_nodes_with_passing_ones():
    nodes = names(6)
    pairs = ring_pairs(nodes)  # n03 dead: n02-n03 and n03-n04 fail
    passed = outcomes({("n02", "n03"), ("n03", "n04")}, pairs)
    again = second_pass_pairs(passed, nodes)
    good = {"n01", "n05", "n06"}
    assert {n for pair in again for n in pair} >= {"n02", "n03", "n04"}
    for pair in again:
        assert pair not in passed and len(set(pair) & good) == 1
    assert second_pass_pairs({("a", "b"): False}, ["a", "b"]) == []


def low_pairs(figures, fraction=LOW_FRACTION, higher_is_better=True):
    """Pairs far on the bad side of the median of all measured pairs, as the suites find them."""
    return off_median(figures, median_of(figures), fraction, higher_is_better)


def test_a_pair_far_below_the_median_is_low_even_when_it_passed():
    figures = {("a", "b"): 390.0, ("a", "c"): 388.0, ("b", "c"): 391.0, ("c", "d"): 250.0,
               ("b", "d"): 385.0, ("a", "d"): None}
    low = low_pairs(figures)
    assert list(low) == [("c", "d")] and "36% below the median 388" in low[("c", "d")]
    assert low_pairs({("a", "b"): 1.0, ("c", "d"): 100.0}) == {}  # two pairs: no median to trust
    assert low_pairs({pair: 0.0 for pair in [("a", "b"), ("a", "c"), ("b", "c")]}) == {}


def test_a_node_whose_pairs_are_all_low_is_the_suspect():
    nodes = names(5)
    pairs = list(itertools.combinations(nodes, 2))
    figures = {pair: (200.0 if "n02" in pair else 390.0) for pair in pairs}
    low = low_pairs(figures)
    assert set(low) == {pair for pair in pairs if "n02" in pair}
    result = attribute({pair: pair not in low for pair in pairs})
    assert list(result.suspect_nodes) == ["n02"] and not result.suspect_links
    assert "failed or were low" in result.suspect_nodes["n02"]


def ring_with_dead(count: int, dead: set, figure: float = 10.0) -> dict:
    """A ring's first pass where every pair touching a dead node failed without a figure."""
    return {pair: PairOutcome(False) if set(pair) & dead else PairOutcome(True, figure)
            for pair in ring_pairs(names(count))}


def test_two_dead_nodes_on_a_ring_would_blame_their_common_neighbour_without_a_second_pass():
    """n03 and n05 dead: n04's two ring pairs both fail, so the first pass alone blames n04 too."""
    verdicts = PairVerdicts(ring_with_dead(6, {"n03", "n05"}))
    assert list(verdicts.attribution().suspect_nodes) == ["n03", "n04", "n05"]


def test_the_second_pass_re_pairs_failing_nodes_with_good_ones_in_disjoint_rounds_on_distinct_ports():
    nodes = names(6)
    verdicts = PairVerdicts(ring_with_dead(6, {"n03", "n05"}))
    again = verdicts.second_pass_pairs(nodes)
    assert again == [("n01", "n03"), ("n01", "n04"), ("n01", "n05")]  # n01: the only node all of whose pairs passed
    rounds = schedule(nodes, again)
    assert_disjoint(rounds) and len(rounds) == 3
    for round_pairs in rounds:
        assert len(set(ports_for(round_pairs, 5401).values())) == len(round_pairs)


def test_the_second_pass_clears_the_partner_and_confirms_the_bad_nodes():
    verdicts = PairVerdicts(ring_with_dead(6, {"n03", "n05"}))
    verdicts.second = {("n01", "n03"): PairOutcome(False), ("n01", "n04"): PairOutcome(True, 9.8),
                       ("n01", "n05"): PairOutcome(False)}
    blame = verdicts.attribution()
    assert list(blame.suspect_nodes) == ["n03", "n05"] and not blame.suspect_links
    assert blame.suspect_nodes["n03"] == ("all 3 of its pairs failed or were low (with n02, n04, n01); "
                                          "n02, n04, n01 passed with other nodes; "
                                          "failed again with n01 in the second pass")
    # n02 and n06 passed with n01 in the first pass already: only n04 needed the second pass
    assert blame.cleared_nodes == {"n04": "failed with n03, n05, passed with n01 in the second pass"}
    assert "cleared n04: failed with n03, n05, passed with n01 in the second pass" in blame.summary()


def test_a_second_pass_figure_is_judged_against_the_first_passs_median():
    """A second-pass pair within its band but far below what the fabric reached still fails."""
    first = {pair: PairOutcome(True, 390.0) for pair in itertools.combinations(names(4), 2)}
    first[("n01", "n02")] = PairOutcome(False)
    verdicts = PairVerdicts(first)
    verdicts.second = {("n01", "n05"): PairOutcome(True, 150.0), ("n02", "n05"): PairOutcome(True, 389.0)}
    assert verdicts.low == {("n01", "n05"): "150 is 62% below the median 390"}
    blame = verdicts.attribution()  # n02 and n05 failed with n01 alone: n01 is common to both
    assert list(blame.suspect_nodes) == ["n01"] and not blame.suspect_links


def test_a_node_lost_during_its_pairs_is_the_suspect_not_the_link_to_the_partner_after_the_loss():
    """node2 passed with node1, then was lost: its pair with node3 failed (a refused connect to a
    server that never started, no figure). node2 is the suspect, named with why, and no link is;
    before, node2-node3 was a suspect link and healthy node3 failed as one of its ends."""
    pairs = list(itertools.combinations(["node1", "node2", "node3"], 2))
    passed = outcomes({("node2", "node3")}, pairs)
    assert attribute(passed).suspect_links == {("node2", "node3"): "failed while both nodes passed with other partners"}
    lost = Result("node2", "iperf3 -s", None, "", "", 0.0, failure="unreachable",
                  detail="lost at 10:00:01 (no answer to SSH keepalives for 12 s)")
    refused = Result("node3", "iperf3 -c", 1, "", "iperf3: error - unable to connect to server", 0.1)
    runs = [PairRun("node1", "node2", 5201, Result("node2", "iperf3 -c", 0, "{}", "", 10.0),
                    Result("node1", "iperf3 -s", 0, "", "", 10.0)),
            PairRun("node2", "node3", 5202, refused, lost), "no HCA on rail 3"]
    unreached = unreached_ends(runs)
    assert unreached == {"node2": "unreachable: lost at 10:00:01 (no answer to SSH keepalives for 12 s)"}
    blame = attribute(passed, unreached)
    assert blame.suspect_nodes == {"node2": "not reached during its pairs: unreachable: lost at 10:00:01 "
                                            "(no answer to SSH keepalives for 12 s)"}
    assert not blame.suspect_links and set(findings(blame)) == {"node2"}


def test_a_node_that_fails_with_some_partners_only_is_blamed_not_its_healthy_partners_links():
    """At 5% packet loss node2 passed with node1 but failed with node3 and node4, which passed
    with everyone else: node2 is the suspect. Before, the links node2-node3 and node2-node4 were,
    which failed healthy node3 and node4 as the ends of suspect links."""
    pairs = list(itertools.combinations(["node1", "node2", "node3", "node4"], 2))
    blame = attribute(outcomes({("node2", "node3"), ("node2", "node4")}, pairs))
    assert list(blame.suspect_nodes) == ["node2"] and not blame.suspect_links
    assert blame.suspect_nodes["node2"] == ("2 of its 3 pairs failed or were low (with node3, node4), and node3, "
                                            "node4 failed with no other node: one node common to those failures, "
                                            "not as many bad links")
    assert set(findings(blame)) == {"node2"}
    # one failed pair, or partners that failed elsewhere too, still blame links
    assert not attribute(outcomes({("node2", "node3")}, pairs)).suspect_nodes
    spread = attribute(outcomes({("node2", "node3"), ("node2", "node4"), ("node3", "node4")}, pairs))
    assert not spread.suspect_nodes and len(spread.suspect_links) == 3


def test_latency_is_bad_far_above_the_median():
    figures = {("a", "b"): 1.0, ("a", "c"): 1.02, ("b", "c"): 0.98, ("c", "d"): 2.5, ("b", "d"): 1.01}
    assert low_pairs(figures, 0.25, higher_is_better=False) == {("c", "d"): "2.5 is 148% above the median 1.01"}
    assert low_pairs(figures, 0.25) == {}
    verdicts = PairVerdicts({pair: PairOutcome(True, value) for pair, value in figures.items()},
                            higher_is_better=False)
    assert verdicts.second_pass_pairs(["a", "b", "c", "d"]) == [("a", "d")]  # c has met a and b already


def test_no_second_pass_when_every_pair_passed_or_no_node_is_good():
    assert PairVerdicts(ring_with_dead(4, set())).second_pass_pairs(names(4)) == []
    assert PairVerdicts({("a", "b"): PairOutcome(False)}).second_pass_pairs(["a", "b"]) == []
    clean = PairVerdicts(ring_with_dead(4, set()))
    assert clean.attribution().clean and not clean.attribution().cleared_nodes


def test_a_pairs_state_is_failed_when_it_did_not_pass_low_far_from_the_median_else_ok():
    median = 390.0
    assert pair_state(PairOutcome(False), median) == "failed"  # not sane: no figure
    assert pair_state(PairOutcome(False, 389.0), median) == "failed"  # out of its band, at the median
    assert pair_state(PairOutcome(True, 250.0), median) == "low"  # 36% below, LOW_FRACTION 0.25
    assert pair_state(PairOutcome(True, 292.5), median) == "ok"  # exactly 25% below is not beyond
    assert pair_state(PairOutcome(True, 500.0), median) == "ok"  # above is never low for bandwidth
    assert pair_state(PairOutcome(True, 250.0), median, 0.75) == "ok"  # the profile's fraction
    assert pair_state(PairOutcome(True, 90.0), median, 0.75) == "low"
    assert pair_state(PairOutcome(True, None), median) == "ok"
    assert pair_state(PairOutcome(True, 1.0), None) == "ok"  # no median to be low against


def test_a_latencys_state_is_low_far_above_the_median():
    assert pair_state(PairOutcome(True, 2.5), 1.01, higher_is_better=False) == "low"
    assert pair_state(PairOutcome(True, 0.2), 1.01, higher_is_better=False) == "ok"
    assert pair_state(PairOutcome(False, 1.0), 1.01, higher_is_better=False) == "failed"


def test_fewer_figures_than_min_pairs_for_median_leave_every_passed_pair_ok():
    two = {("a", "b"): PairOutcome(True, 1.0), ("c", "d"): PairOutcome(True, 100.0)}
    median = median_of({pair: outcome.figure for pair, outcome in two.items()})
    assert median is None and {pair_state(outcome, median) for outcome in two.values()} == {"ok"}


@pytest.mark.parametrize("figures, out_of_band, higher_is_better", [
    ({("a", "b"): 390.0, ("a", "c"): 388.0, ("b", "c"): None, ("c", "d"): 250.0, ("b", "d"): 385.0,
      ("a", "d"): 100.0}, {("a", "d")}, True),
    ({("a", "b"): 1.0, ("a", "c"): 1.02, ("b", "c"): 0.98, ("c", "d"): 2.5, ("b", "d"): None}, set(), False),
    ({("a", "b"): 5.0, ("c", "d"): 1.0}, set(), True),
])
def test_attribution_and_the_pair_states_judge_with_one_rule(figures, out_of_band, higher_is_better):
    """The heatmaps' states and PairVerdicts agree pair for pair: low is exactly PairVerdicts.low
    among the passed pairs, and only ok pairs count as good for the second pass and blame.
    A pair without a figure failed its sanity check."""
    first = {pair: PairOutcome(value is not None and pair not in out_of_band, value)
             for pair, value in figures.items()}
    verdicts = PairVerdicts(first, 0.25, higher_is_better)
    states = {pair: pair_state(outcome, verdicts.median, 0.25, higher_is_better) for pair, outcome in first.items()}
    assert {pair for pair, state in states.items() if state == "low"} == \
        {pair for pair in verdicts.low if first[pair].passed}
    assert {pair for pair, state in states.items() if state == "failed"} == \
        {pair for pair, outcome in first.items() if not outcome.passed}
    nodes = ["a", "b", "c", "d"]
    good = {pair: state == "ok" for pair, state in states.items()}
    assert verdicts.second_pass_pairs(nodes) == second_pass_pairs(good, nodes)
    assert verdicts.attribution() == attribute(good)


def test_outcomes_group_by_rail_and_a_second_pass_runs_a_pairs_rails_together():
    assert kinds_by_pair({0: [("a", "b"), ("a", "c")], 1: [("a", "b")]}) == {("a", "b"): [0, 1], ("a", "c"): [0]}
    outcomes = {(("a", "b"), 0): PairOutcome(True, 1.0), (("a", "b"), 1): None,
                (("a", "c"), 0): PairOutcome(False)}
    assert by_kind(outcomes) == {0: {("a", "b"): PairOutcome(True, 1.0), ("a", "c"): PairOutcome(False)}}
    assert by_kind({(("a", "b"), None): PairOutcome(True, 9.0)}) == {None: {("a", "b"): PairOutcome(True, 9.0)}}
    assert pair_rail_id(("a", "b"), None) == "a-b" and pair_rail_id(("a", "b"), 3) == "a-b-rail3"


# ------------------------------------------------------------------------------ fleet schedules


@pytest.mark.parametrize("count", [65, 100, 257, 1024, 4096])
def test_the_sample_gives_every_node_the_same_partners_and_grows_linearly(count):
    nodes = names(count)
    chosen = sample_pairs(nodes, 8)
    partners: dict[str, set[str]] = {}
    for a, b in chosen:
        assert a != b
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    assert len(chosen) == len(set(chosen)) == 4 * count  # 8 partners each, every pair once
    assert {len(p) for p in partners.values()} == {8} and len(partners) == count
    rounds = schedule(nodes, chosen)
    assert_disjoint(rounds)
    assert len(rounds) <= 12  # a handful of rounds, whatever the size
    assert sorted(p for r in rounds for p in r) == sorted(chosen)


def test_the_sample_reaches_across_the_fleet_and_the_ring_stays_on_a_leaf():
    """Nodes in placement order, 32 per leaf: stride 1 keeps ring pairs on a leaf; the other
    strides give every node partners on other leaves, spread over the fleet."""
    nodes = names(256)
    leaf = {node: f"leaf{index // 32}" for index, node in enumerate(nodes)}
    chosen = sample_pairs(nodes, 8)
    for node in nodes:
        mine = [b if a == node else a for a, b in chosen if node in (a, b)]
        leaves = {leaf[peer] for peer in mine}
        assert len(leaves - {leaf[node]}) >= 3, (node, mine)
    ring = pair_schedule(nodes, "quick")
    assert sum(leaf[a] == leaf[b] for a, b in ring) == 256 - 8  # only the hop to the next leaf crosses


def test_placement_order_groups_nodes_by_leaf_and_rack_keeping_inventory_order_within():
    placement = {"a1": ("L1", "r1"), "a2": ("L1", "r1"), "a3": ("L1", "r1"),
                 "b1": ("L2", "r2"), "b2": ("L2", "r2")}
    names = ["a1", "b1", "a2", "c1", "b2", "a3"]
    nodes = [Node(name, name, "ssh", leaf=placement.get(name, (None, None))[0],
                  rack=placement.get(name, (None, None))[1]) for name in names]
    assert [node.name for node in placement_order(nodes)] == ["a1", "a2", "a3", "b1", "b2", "c1"]
    unplaced = [Node(name, name, "ssh") for name in names]
    assert placement_order(unplaced) == unplaced  # nothing said: the inventory's order


def test_pair_schedules_by_depth():
    small, big = names(10), names(80)
    assert pair_schedule(small, "quick") == ring_pairs(small)
    assert sorted(pair_schedule(small, "full")) == sorted(itertools.combinations(small, 2))
    assert len(pair_schedule(big, "full")) == 4 * 80  # above 64 nodes: the sample
    assert len(pair_schedule(big, "full", all_pairs_max=80)) == 80 * 79 // 2
    assert len(pair_schedule(big, "full", partners=4)) == 2 * 80


def test_each_nodes_links_carry_both_passes_and_their_states():
    first = {("n1", "n2"): PairOutcome(True, 9.0), ("n2", "n3"): PairOutcome(False),
             ("n3", "n4"): PairOutcome(True, 8.8), ("n1", "n4"): PairOutcome(True, 2.0)}
    verdicts = PairVerdicts(first, 0.25)
    verdicts.second = {("n1", "n3"): PairOutcome(True, 9.1)}
    links = verdicts.links_by_node()
    assert links["n1"] == [Link("n2", "ok", 9.0), Link("n4", "low", 2.0), Link("n3", "ok", 9.1, True)]
    assert links["n2"][1] == Link("n3", "failed", None)
    assert Link("n3", "ok", 9.1, True).as_dict() == {"peer": "n3", "state": "ok", "figure": 9.1, "pass": 2}


def test_findings_hold_a_suspect_node_and_both_ends_of_a_suspect_link():
    blame = Attribution(suspect_nodes={"n3": "all 3 of its pairs failed"},
                        suspect_links={("n1", "n2"): "failed while both nodes passed with other partners"})
    held = findings(blame)
    assert held == {"n3": "suspect node: all 3 of its pairs failed",
                    "n1": "suspect link n1-n2: failed while both nodes passed with other partners",
                    "n2": "suspect link n1-n2: failed while both nodes passed with other partners"}


def test_attribution_looks_up_each_nodes_pairs_and_says_what_scanning_every_pair_said():
    """attribution() reads a node's pairs of each pass from an index built once; on a generated
    case (nodes with several failed pairs and two second-pass partners) its words, and their
    order, are those of scanning every pair for every node."""
    rng = random.Random(11)
    nodes = names(48)
    bad = {"n05", "n30"}
    first = {pair: PairOutcome(False) if set(pair) & bad or rng.random() < 0.05 else PairOutcome(True, 100.0)
             for pair in sample_pairs(nodes, 8)}
    first_ok = {pair: outcome.passed for pair, outcome in first.items()}
    good = [node for node in nodes if all(ok for pair, ok in first_ok.items() if node in pair)]
    failing = [node for node in nodes if node not in good]
    second = {}
    for index, node in enumerate(failing):
        for partner in (good[index % len(good)], good[(index + 1) % len(good)]):
            pair = (node, partner) if nodes.index(node) < nodes.index(partner) else (partner, node)
            if pair not in first:
                second[pair] = PairOutcome(node not in bad and rng.random() > 0.2, 100.0)
    second_ok = {pair: outcome.passed for pair, outcome in second.items()}
    verdicts = PairVerdicts(first)
    verdicts.second = second

    def scan(passes: dict, node: str, passed: bool) -> list[str]:
        return [other(pair, node) for pair, ok in passes.items() if node in pair and ok == passed]

    plain = attribute({**first_ok, **second_ok})
    suspects = {node: why + (f"; failed again with {', '.join(again)} in the second pass" if again else "")
                for node, why in plain.suspect_nodes.items() for again in [scan(second_ok, node, False)]}
    cleared = {node: f"failed with {', '.join(scan(first_ok, node, False))}, passed with "
                     f"{', '.join(scan(second_ok, node, True))} in the second pass"
               for node in nodes
               if node not in suspects and scan(first_ok, node, False) and scan(second_ok, node, True)}
    blame = verdicts.attribution()
    assert list(blame.suspect_nodes.items()) == list(suspects.items()) and "n05" in suspects
    assert list(blame.cleared_nodes.items()) == list(cleared.items())
    assert any(why.count(",") >= 2 for why in blame.cleared_nodes.values())  # several pairs per node, in order
    assert blame.suspect_links == plain.suspect_links


def test_link_action_names_a_nodes_suspect_links_in_the_order_attribution_gave_them():
    """link_action() reads a node's suspect links from an index the attribution builds once; with
    30% flaky pairs (several suspect links per node) its steps are those of scanning every link."""
    rng = random.Random(5)
    blame = attribute({pair: rng.random() >= 0.3 for pair in sample_pairs(names(64), 8)})
    several = 0
    for node in names(64):
        mine = [pair for pair in blame.suspect_links if node in pair]
        several += len(mine) >= 2
        steps = [f"check {node}'s HCA port on rail 2 (ibstat, its error counters): reseat its cable, then "
                 "replace the transceiver or the NIC"] if node in blame.suspect_nodes else []
        steps += [f"reseat or replace the cable between {a} and {b} on rail 2 and check the switch ports at both "
                  "ends" for a, b in mine]
        assert link_action(blame, node, 2, "ib_write_bw") == ("; ".join(steps) + ", then re-run ib_write_bw"
                                                               if steps else "")
    assert several >= 10
