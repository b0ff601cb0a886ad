"""The round schedule (circle and ring), port allocation, attribution and the second pass: pure."""
from __future__ import annotations

import itertools

import pytest

from runners.pairs import (attribute, circle_rounds, greedy_rounds, low_pairs, pair_id, ports_for, ring_pairs,
                           ring_rounds, run_rounds, schedule, second_pass_pairs)


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
