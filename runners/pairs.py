"""Pairwise tests in rounds: which node pairs run together, on which ports, and who is to blame.

A link test needs two nodes; N nodes have N(N-1)/2 pairs. Run one pair at a time and a 64-node
cluster takes hours; run every pair at once and the pairs fight over the same NICs. The circle
method splits all pairs into N-1 rounds in which no node appears twice (N odd: one idle node per
round), so each round runs all of its pairs concurrently without sharing a port on any node.

Everything here but run_rounds and run_server_client is pure, so the schedule and the
attribution are unit-tested; those two are tested with real iperf3 between real nodes.
"""
from __future__ import annotations

import functools
import math
import statistics
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from inventory.model import Node
from runners.transport import Result, Transport, new_tag

Pair = tuple[str, str]
T = TypeVar("T")
K = TypeVar("K")  # a kind of pair test: a tool's rail (None for a tool with one)


def pair_id(pair: Pair) -> str:
    """How a pair is named in test ids and reports: 'a-b'."""
    return f"{pair[0]}-{pair[1]}"


def pair_rail_id(pair: Pair, rail: Optional[int]) -> str:
    """A pair test's id and raw step name: 'a-b', or 'a-b-rail0' for one rail of the pair."""
    return pair_id(pair) if rail is None else f"{pair_id(pair)}-rail{rail}"


def circle_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    """Every pair exactly once, in len(nodes)-1 rounds (len(nodes) when odd) of disjoint pairs.

    The circle method: fix the first node, rotate the rest one step per round and pair position
    i with position n-1-i. An odd count gets a placeholder; whoever meets it sits the round out.
    """
    players: list = list(nodes)
    if len(set(players)) != len(players):
        raise ValueError(f"node names must be distinct: {players}")
    if len(players) < 2:
        return []
    if len(players) % 2:
        players.append(None)
    count = len(players)
    position = {node: index for index, node in enumerate(nodes)}
    rounds = []
    for _ in range(count - 1):
        pairs = []
        for i in range(count // 2):
            a, b = players[i], players[count - 1 - i]
            if a is not None and b is not None:
                pairs.append(_ordered_by(a, b, position))
        rounds.append(sorted(pairs, key=lambda p: position[p[0]]))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def ring_pairs(nodes: Sequence[str]) -> list[Pair]:
    """Each node paired with the next (the last with the first): every node in two pairs.

    Two pairs per node is what attribution needs: a node whose both pairs are low is the suspect,
    one low pair points at a link. Two nodes make one pair.
    """
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [(nodes[0], nodes[1])]
    position = {node: index for index, node in enumerate(nodes)}
    return [_ordered_by(nodes[i], nodes[(i + 1) % len(nodes)], position) for i in range(len(nodes))]


ALL_PAIRS_MAX_NODES = 64  # full depth measures every pair up to this many nodes (N-1 rounds)
SAMPLE_PARTNERS = 8  # above it, each node is paired with about this many partners


def placement_order(nodes: Sequence[Node]) -> list[Node]:
    """Nodes grouped by rack, then leaf, each in order of first appearance, the unplaced last in
    inventory order: ring neighbours and screened groups then mostly share a leaf, and the
    sample's long strides cross leaves."""
    first_rack: dict[Optional[str], int] = {}
    first_leaf: dict[Optional[str], int] = {}
    for index, node in enumerate(nodes):
        first_rack.setdefault(node.rack, index)
        first_leaf.setdefault(node.leaf, index)
    return sorted(nodes, key=lambda node: (first_rack[node.rack] if node.rack else math.inf,
                                           first_leaf[node.leaf] if node.leaf else math.inf))


def sample_pairs(nodes: Sequence[str], partners: int = SAMPLE_PARTNERS) -> list[Pair]:
    """Each node paired with about `partners` others spread over the whole list: linear in nodes.

    A circulant graph: stride 1 (the ring, within a leaf when the nodes are in placement_order)
    and strides evenly spread up to half the list, each giving a node two partners. Every node
    has the same number of pairs, so attribution weighs every node alike, and a slow node meets
    partners from every part of the fabric.
    """
    count = len(nodes)
    if count < 2:
        return []
    strides = {1} | {max(1, round(count * j / partners)) for j in range(1, partners // 2)}
    position = {node: index for index, node in enumerate(nodes)}
    chosen: dict[Pair, None] = {}
    for stride in sorted(s for s in strides if s <= count // 2):
        for index, node in enumerate(nodes):
            peer = nodes[(index + stride) % count]
            if peer != node:
                chosen[_ordered_by(node, peer, position)] = None
    return list(chosen)


def pair_schedule(nodes: Sequence[str], depth: str, all_pairs_max: int = ALL_PAIRS_MAX_NODES,
                  partners: int = SAMPLE_PARTNERS) -> list[Pair]:
    """Which pairs a depth measures: quick the ring; full every pair up to all_pairs_max nodes,
    above it the bounded sample (so the work stays linear in the nodes)."""
    if depth == "quick":
        return ring_pairs(nodes)
    if len(nodes) <= all_pairs_max:
        return [pair for round_pairs in circle_rounds(nodes) for pair in round_pairs]
    return sample_pairs(nodes, partners)


def ring_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    """The ring's pairs in two rounds of disjoint pairs (three when the count is odd)."""
    return greedy_rounds(ring_pairs(nodes))


def greedy_rounds(pairs: Iterable[Pair]) -> list[list[Pair]]:
    """Any set of pairs in rounds where no node appears twice: first fit, in the order given."""
    rounds: list[list[Pair]] = []
    busy: list[set[str]] = []
    for pair in pairs:
        for index, taken in enumerate(busy):
            if pair[0] not in taken and pair[1] not in taken:
                rounds[index].append(pair)
                taken.update(pair)
                break
        else:
            rounds.append([pair])
            busy.append(set(pair))
    return rounds


def schedule(nodes: Sequence[str], wanted: Iterable[Pair]) -> list[list[Pair]]:
    """The wanted pairs in rounds: the circle's rounds when they are all pairs, else first fit."""
    position = {node: index for index, node in enumerate(nodes)}
    wanted = list(dict.fromkeys(_ordered_by(a, b, position) for a, b in wanted))
    if len(wanted) == len(nodes) * (len(nodes) - 1) // 2:
        return circle_rounds(nodes)
    return greedy_rounds(wanted)


def ports_for(round_pairs: Sequence[Pair], base_port: int) -> dict[Pair, int]:
    """A distinct port per pair of a round, so no two servers of a round ever collide."""
    return {pair: base_port + index for index, pair in enumerate(round_pairs)}


def _ordered_by(a: str, b: str, position: Mapping[str, int]) -> Pair:
    return (a, b) if position[a] < position[b] else (b, a)


def run_rounds(rounds: Sequence[Sequence[Pair]], base_port: int,
               run_pair: Callable[[Pair, int], T]) -> dict[Pair, T]:
    """run_pair(pair, port) for every pair; the pairs of a round at once, the rounds in turn.

    run_pair must not raise (it returns its failure as data), so one broken pair never stops
    its round; a round ends when its slowest pair does, each bounded by its own timeouts.
    """
    outcomes: dict[Pair, T] = {}
    lock = threading.Lock()

    def work(pair: Pair, port: int) -> None:
        outcome = run_pair(pair, port)
        with lock:
            outcomes[pair] = outcome

    for round_pairs in rounds:
        threads = [threading.Thread(target=work, args=(pair, port), name=f"pair-{pair_id(pair)}",
                                    daemon=True)
                   for pair, port in ports_for(round_pairs, base_port).items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return {pair: outcomes[pair] for round_pairs in rounds for pair in round_pairs}


# ------------------------------------------------------------------------------ one pair


SERVER_GRACE_S = 3  # how long a server may take to exit after its client finished


@dataclass(frozen=True)
class PairRun:
    """One pair's server/client tool run: both Results (the client's is the measurement)."""

    server: str
    client: str
    port: int
    client_result: Result
    server_result: Optional[Result]


def run_server_client(server: Transport, client: Transport, server_argv: Sequence[str],
                      client_argv: Sequence[str], *, port: int, server_timeout: float,
                      client_timeout: float, retry_while: Callable[[Result], bool],
                      retry_s: float) -> PairRun:
    """Server on one node, client on the other; the server is torn down whatever happens.

    The client is retried while retry_while(result) says the server was not listening yet, for
    at most retry_s. Once the client has finished (measured, failed or timed out), a server still
    running after SERVER_GRACE_S is killed on its node, with everything it started, and nothing
    else: the same node may be serving the pair's other rails at that moment.
    """
    served: dict[str, Result] = {}
    server_tag = new_tag()

    def serve() -> None:
        served["result"] = server.run(server_argv, timeout=server_timeout, tag=server_tag)

    thread = threading.Thread(target=serve, name=f"pair-server-{server.node.name}-{port}",
                              daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + retry_s
        while True:
            result = client.run(client_argv, timeout=client_timeout)
            if not retry_while(result) or time.monotonic() > deadline or not thread.is_alive():
                break
            time.sleep(0.2)
    finally:
        thread.join(SERVER_GRACE_S)
        if thread.is_alive():
            server.kill(server_tag)
            thread.join(SERVER_GRACE_S + 15)
    return PairRun(server.node.name, client.node.name, port, result, served.get("result"))


# ------------------------------------------------------------------------------ attribution


@dataclass(frozen=True)
class Attribution:
    """Who is to blame for the failed pairs, with the evidence in words; not changed once made
    (suspect_links_by_node keeps the index it builds)."""

    suspect_nodes: dict[str, str] = field(default_factory=dict)  # node -> evidence
    suspect_links: dict[Pair, str] = field(default_factory=dict)  # pair -> evidence
    cleared_nodes: dict[str, str] = field(default_factory=dict)  # node -> second-pass evidence

    @property
    def clean(self) -> bool:
        return not self.suspect_nodes and not self.suspect_links

    def summary(self) -> str:
        parts = [f"node {node}: {why}" for node, why in self.suspect_nodes.items()]
        parts += [f"link {pair_id(pair)}: {why}" for pair, why in self.suspect_links.items()]
        parts += [f"cleared {node}: {why}" for node, why in self.cleared_nodes.items()]
        return "; ".join(parts)

    @functools.cached_property
    def suspect_links_by_node(self) -> dict[str, list[Pair]]:
        """Each node's suspect links, in order, indexed on first use: link_action() asks for
        every node's, and scanning all links for each would cost nodes x links."""
        found: dict[str, list[Pair]] = {}
        for pair in self.suspect_links:
            for node in set(pair):  # each end once
                found.setdefault(node, []).append(pair)
        return found


def attribute(passed: dict[Pair, bool], unreached: Optional[Mapping[str, str]] = None) -> Attribution:
    """Blame nodes not reached, whose every pair failed, or that several failed pairs have in
    common, and links for failed pairs no suspect node explains.

    A node that was not reached, or was lost, during a pair is a suspect first (unreached: node ->
    why): its failed pairs measured nothing of the link, and a partner that passed with it before
    the loss and failed after is not to blame. A node is a suspect when all its pairs failed and
    either it had two or more pairs, or a partner of it passed with someone else (so the partner
    is not the problem). It is one too
    when INTERMITTENT_PAIRS or more of its pairs failed with partners that failed with no one
    else: a node that drops now and then passes with some partners and fails with others, and
    one node common to those failures is likelier than as many bad links (a pair's path is the
    two nodes' ports and the switches between them, so the common end's port is where to look).
    A lone failed pair with no such evidence (two nodes only) blames the link, naming both ends.
    """
    pairs_of: dict[str, list[Pair]] = {}
    for pair in passed:
        for node in pair:
            pairs_of.setdefault(node, []).append(pair)
    healthy = {node for node, pairs in pairs_of.items() if any(passed[p] for p in pairs)}
    suspects = {node: f"not reached during its pairs: {why}" for node, why in (unreached or {}).items()
                if node in pairs_of}
    for node, pairs in pairs_of.items():
        if node in suspects or any(passed[p] for p in pairs):
            continue
        partners = [other(p, node) for p in pairs]
        vouched = [partner for partner in partners if partner in healthy]
        if len(pairs) >= 2 or vouched:
            evidence = f"all {len(pairs)} of its pairs failed or were low (with {', '.join(partners)})"
            if vouched:
                evidence += f"; {', '.join(vouched)} passed with other nodes"
            suspects[node] = evidence
    suspects.update(_intermittent(passed, pairs_of, suspects))
    links = {}
    for pair, ok in passed.items():
        if not ok and not (set(pair) & suspects.keys()):
            ends_ok = [n for n in pair if n in healthy]
            if len(ends_ok) == 2:
                links[pair] = "failed while both nodes passed with other partners"
            else:
                links[pair] = "failed; no other pair tells the nodes apart"
    return Attribution(suspects, links)


INTERMITTENT_PAIRS = 2  # failed pairs a node must have in common before it, not each link, is blamed


def _intermittent(passed: dict[Pair, bool], pairs_of: dict[str, list[Pair]],
                  suspects: dict[str, str]) -> dict[str, str]:
    """Nodes that passed with some partners and failed with INTERMITTENT_PAIRS or more that failed
    with no one else, with the evidence in words."""
    unexplained = {pair for pair, ok in passed.items() if not ok and not set(pair) & suspects.keys()}
    failed_with: dict[str, list[str]] = {}
    for pair in unexplained:
        for node in pair:
            failed_with.setdefault(node, []).append(other(pair, node))
    found = {}
    for node, partners in failed_with.items():
        alone = [partner for partner in partners if failed_with[partner] == [node]]
        if len(alone) >= INTERMITTENT_PAIRS:
            named = sorted(alone)
            found[node] = (f"{len(partners)} of its {len(pairs_of[node])} pairs failed or were low "
                           f"(with {', '.join(sorted(partners))}), and {', '.join(named)} failed with no other "
                           "node: one node common to those failures, not as many bad links")
    return found


LOW_FRACTION = 0.25  # a pair this far below the median of all pairs is low, whatever its band says
MIN_PAIRS_FOR_MEDIAN = 3


def median_of(figures: dict[Pair, Optional[float]]) -> Optional[float]:
    """The median of the measured figures; None with too few pairs to trust, or a median <= 0."""
    values = [value for value in figures.values() if value is not None]
    if len(values) < MIN_PAIRS_FOR_MEDIAN:
        return None
    median = statistics.median(values)
    return median if median > 0 else None


def beyond_median(value: Optional[float], median: Optional[float], fraction: float,
                  higher_is_better: bool = True) -> str:
    """Why `value` is more than `fraction` on the bad side of `median`; '' when it is not (or
    either is unknown). The one comparison behind low pairs, attribution and pair states."""
    if value is None or median is None:
        return ""
    if higher_is_better and value < median * (1 - fraction):
        return f"{value:.3g} is {(1 - value / median) * 100:.0f}% below the median {median:.3g}"
    if not higher_is_better and value > median * (1 + fraction):
        return f"{value:.3g} is {(value / median - 1) * 100:.0f}% above the median {median:.3g}"
    return ""


def off_median(figures: dict[Pair, Optional[float]], median: Optional[float], fraction: float,
               higher_is_better: bool = True) -> dict[Pair, str]:
    """Pairs whose figure is more than `fraction` on the bad side of `median`, with the words why.

    A band says what a healthy link should reach; the median of all measured pairs says what
    this fabric does reach. A pair 40% below its peers is a bad cable or port even when the
    band is generous (or missing), so it counts against its nodes in attribute() as a failure
    would. Latencies (higher_is_better False) are bad far above the median."""
    found = {}
    for pair, value in figures.items():
        why = beyond_median(value, median, fraction, higher_is_better)
        if why:
            found[pair] = why
    return found


def other(pair: Pair, node: str) -> str:
    return pair[1] if pair[0] == node else pair[0]


def _verdicts_by_node(passed: Mapping[Pair, bool]) -> dict[str, list[tuple[str, bool]]]:
    """Each node's (peer, passed) in the order of `passed`, built in one sweep: a node's pairs
    looked up, where searching all pairs for each node would cost nodes x pairs."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for pair, ok in passed.items():
        for node in set(pair):  # each end once
            found.setdefault(node, []).append((other(pair, node), ok))
    return found


def second_pass_pairs(passed: dict[Pair, bool], nodes: Sequence[str]) -> list[Pair]:
    """Re-pair every node of a failed pair with a node all of whose pairs passed.

    So one bad node does not fail its partners: a partner that passes with a known-good node is
    cleared, and a node that fails again with a known-good node is confirmed. Pairs already
    measured are not repeated; good partners are used in turn to spread the load.
    """
    verdicts_of: dict[str, list[bool]] = {}
    for pair, ok in passed.items():
        for node in pair:
            verdicts_of.setdefault(node, []).append(ok)
    good = [n for n in nodes if n in verdicts_of and all(verdicts_of[n])]
    failing = [n for n in nodes if n in verdicts_of and not all(verdicts_of[n])]
    if not good:
        return []
    position = {node: index for index, node in enumerate(nodes)}
    chosen: dict[Pair, None] = {}
    turn = 0
    for node in failing:
        for step in range(len(good)):
            partner = good[(turn + step) % len(good)]
            pair = _ordered_by(node, partner, position)
            if pair not in passed and pair not in chosen:
                chosen[pair] = None
                turn = (turn + step + 1) % len(good)
                break
    return list(chosen)


# ------------------------------------------------------------------------------ both passes


@dataclass(frozen=True)
class PairOutcome:
    """One pair test as attribution sees it: sane and within its band (passed), and its figure."""

    passed: bool
    figure: Optional[float] = None  # None when nothing was measured


PAIR_OK, PAIR_LOW, PAIR_FAILED = "ok", "low", "failed"


def pair_state(outcome: PairOutcome, median: Optional[float], fraction: float = LOW_FRACTION,
               higher_is_better: bool = True) -> str:
    """A pair test's state, decided once for the heatmaps and attribution alike: failed (not
    sane, or out of its band), low (passed, but more than `fraction` on the bad side of the
    first pass's median), else ok. Only an ok pair counts as good in attribute()."""
    if not outcome.passed:
        return PAIR_FAILED
    if beyond_median(outcome.figure, median, fraction, higher_is_better):
        return PAIR_LOW
    return PAIR_OK


def by_kind(outcomes: dict[tuple[Pair, K], Optional[PairOutcome]]) -> dict[K, dict[Pair, PairOutcome]]:
    """(pair, kind) outcomes grouped by kind (a tool's rail), those that say nothing (None) left out."""
    grouped: dict[K, dict[Pair, PairOutcome]] = {}
    for (pair, kind), outcome in outcomes.items():
        if outcome is not None:
            grouped.setdefault(kind, {})[pair] = outcome
    return grouped


def kinds_by_pair(wanted: dict[K, list[Pair]]) -> dict[Pair, list[K]]:
    """Each kind's wanted pairs turned into each pair's kinds, so a pair's kinds run together."""
    grouped: dict[Pair, list[K]] = {}
    for kind, kind_pairs in wanted.items():
        for pair in kind_pairs:
            grouped.setdefault(pair, []).append(kind)
    return grouped


@dataclass
class PairVerdicts:
    """One kind of pair test (a tool, a rail): first pass, second pass, and who is to blame.

    The first pass is what the pair tests measured. A pair counts as failed when its pair_state()
    is not ok: it did not pass, or its figure is far from the first pass's median (the pair
    tests record that same state for the heatmaps). second_pass_pairs() names the
    pairs to measure next: every node of a failed pair with a node all of whose pairs passed;
    their outcomes go in `second`, judged against the FIRST pass's median (a handful of
    second-pass pairs has no median of its own). attribution() then blames on both passes.
    """

    first: dict[Pair, PairOutcome]
    fraction: float = LOW_FRACTION
    higher_is_better: bool = True
    second: dict[Pair, PairOutcome] = field(default_factory=dict)
    unreached: dict[str, str] = field(default_factory=dict)  # node -> why: not reached during a pair

    @property
    def median(self) -> Optional[float]:
        return median_of({pair: outcome.figure for pair, outcome in self.first.items()})

    def _off(self, outcomes: dict[Pair, PairOutcome]) -> dict[Pair, str]:
        return off_median({pair: outcome.figure for pair, outcome in outcomes.items()},
                          self.median, self.fraction, self.higher_is_better)

    @property
    def low(self) -> dict[Pair, str]:
        """Pairs of either pass far from the first pass's median, with the words why."""
        return {**self._off(self.first), **self._off(self.second)}

    def _verdicts(self, outcomes: dict[Pair, PairOutcome]) -> dict[Pair, bool]:
        median = self.median
        return {pair: pair_state(outcome, median, self.fraction, self.higher_is_better) == PAIR_OK
                for pair, outcome in outcomes.items()}

    def second_pass_pairs(self, nodes: Sequence[str]) -> list[Pair]:
        """The pairs a second pass measures (none when every pair passed or no node is good)."""
        return second_pass_pairs(self._verdicts(self.first), nodes)

    def attribution(self) -> Attribution:
        """attribute() on both passes, the second pass named in the evidence."""
        first, second = self._verdicts(self.first), self._verdicts(self.second)
        blame = attribute({**first, **second}, self.unreached)
        if not second:
            return blame
        first_of, second_of = _verdicts_by_node(first), _verdicts_by_node(second)
        suspects = dict(blame.suspect_nodes)
        for node in suspects:
            again = [peer for peer, ok in second_of.get(node, []) if not ok]
            if again:
                suspects[node] += f"; failed again with {', '.join(again)} in the second pass"
        failed_first = {node for pair, ok in first.items() if not ok for node in pair}
        order = {node: index for index, node in enumerate(self._nodes())}
        cleared = {}
        for node in sorted(failed_first - suspects.keys(), key=order.__getitem__):
            partners = [peer for peer, ok in second_of.get(node, []) if ok]
            if partners:
                failed_with = [peer for peer, ok in first_of.get(node, []) if not ok]
                cleared[node] = (f"failed with {', '.join(failed_with)}, passed with "
                                 f"{', '.join(partners)} in the second pass")
        return Attribution(suspects, blame.suspect_links, cleared)

    def _nodes(self) -> dict[str, None]:
        return dict.fromkeys(node for pair in [*self.first, *self.second] for node in pair)

    def links_by_node(self) -> dict[str, list[Link]]:
        """Every node's pairs of both passes, with their states: each node's evidence, built in
        one sweep (a node's links looked up one by one would cost nodes x pairs)."""
        median = self.median
        found: dict[str, list[Link]] = {}
        for second, outcomes in ((False, self.first), (True, self.second)):
            for pair, outcome in outcomes.items():
                state = pair_state(outcome, median, self.fraction, self.higher_is_better)
                for node in pair:
                    found.setdefault(node, []).append(Link(other(pair, node), state, outcome.figure, second))
        return found


@dataclass(frozen=True)
class Link:
    """One pair a node was measured in, as that node's evidence."""

    peer: str
    state: str  # pair_state(): ok, low or failed
    figure: Optional[float]
    second_pass: bool = False

    def as_dict(self) -> dict:
        """The form results keep in the node's entry (`pairs`)."""
        return {"peer": self.peer, "state": self.state, "figure": self.figure,
                "pass": 2 if self.second_pass else 1}


def unreached_ends(runs: Iterable[RailRun]) -> dict[str, str]:
    """node -> why, for the ends of pair runs whose node was not reached or was lost under the run
    (the first reason each): such a pair measured nothing, whatever its client printed."""
    found: dict[str, str] = {}
    for run in runs:
        if isinstance(run, PairRun):
            for node, result in ((run.server, run.server_result), (run.client, run.client_result)):
                if result is not None and result.not_reached:  # when it was lost, not when tried next
                    found.setdefault(node, f"{result.failure}: {result.detail.split('; ')[0]}")
    return found


def findings(attribution: Attribution) -> dict[str, str]:
    """What attribution holds against each node: its suspicion, or the suspect links it ends
    (a link fails both its ends: the fix, a cable or a port, is on one of them)."""
    held: dict[str, list[str]] = {node: [f"suspect node: {why}"]
                                  for node, why in attribution.suspect_nodes.items()}
    for pair, why in attribution.suspect_links.items():
        for node in pair:
            held.setdefault(node, []).append(f"suspect link {pair_id(pair)}: {why}")
    return {node: "; ".join(words) for node, words in held.items()}


# ---------------------------------------------------------------- a tool measured between pairs

Rail = Optional[int]  # perftest's HCA index; None for a tool with one path per pair (iperf3)
RailRun = Union[PairRun, str]  # the run, or why it could not start (e.g. a missing HCA)
Measure = Callable[[Pair, Rail, int], RailRun]  # measure(pair, rail, port); never raises


class PairTool(ABC):
    """What a PairCampaign needs from one tool: how to measure one pair (one rail of it), what
    a run says for attribution, and how its figures are named."""

    name: str  # its pair test is test_<name>; its ports and raw steps are keyed by it
    unit: str  # of the figure it is judged on
    higher_is_better: bool = True  # False for latencies

    @abstractmethod
    def measurer(self, cluster_run) -> Measure:
        """measure(pair, rail, port) for one pass over the cluster's selected nodes."""

    @abstractmethod
    def outcome(self, run: RailRun) -> Optional[PairOutcome]:
        """The run for attribution; None when it says nothing about the link."""

    def label(self, rail: Rail) -> str:
        return self.name if rail is None else f"{self.name} rail {rail}"

    def tally(self, rail: Rail, first: dict[Pair, PairOutcome]) -> str:
        """How many pairs of this rail the first pass measured, for the attribution's note."""
        return f"{self.label(rail)}: {len(first)} pair(s)"


def link_action(attribution: Optional[Attribution], node: str, rail: Rail, tool: str) -> str:
    """What to do about what attribution holds against a node: the cable between the two ends
    of a suspect link (on its rail), or the node's own port when all its pairs failed."""
    if attribution is None:
        return ""
    if rail is None:  # iperf3: the data (Ethernet) network
        port, cable = "data-network port (NIC, cable, switch port)", "the data-network cabling"
    else:
        port, cable = f"HCA port on rail {rail} (ibstat, its error counters)", "the cable"
    steps = []
    if node in attribution.suspect_nodes:
        steps.append(f"check {node}'s {port}: reseat its cable, then replace the transceiver or the NIC")
    steps += [f"reseat or replace {cable} between {a} and {b}" + (f" on rail {rail}" if rail is not None else "")
              + " and check the switch ports at both ends" for a, b in attribution.suspect_links_by_node.get(node, [])]
    return "; ".join(steps) + f", then re-run {tool}" if steps else ""
