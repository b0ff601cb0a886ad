"""Bad-node isolation inside a run across nodes, and the multi-scale table of collectives: the planning.

An all-reduce (or a DDP training run) across N nodes that misses its band says the cluster is
slow, not why. Running it again on all nodes says nothing new, and every pair is N(N-1)/2 runs.
Instead (group testing): screen disjoint groups of about sqrt(N) nodes at once, bisect the groups
that miss the band, and pair each suspect with a node already cleared. A suspect whose pair with a
known-good node still misses the band is the culprit, each step's figure its evidence. One bad
node costs one round of sqrt(N) runs, then about log2(sqrt(N)) rounds of a few runs, all within a
time budget; what the budget did not allow is said, never guessed. The figure is whatever the run
measures, in its unit (busbw in GB/s, scaling efficiency in %), higher being better.

The multi-scale table runs the collective at every scale the inventory can name: pairs (a ring,
each node in two), the nodes under one leaf, under one rack, and the whole cluster, beside each
node's own figure. A bad node drags down both its pairs and every group it is in; a slow spine
leaves pairs and leaf groups alone and shows only at the scale above them.

The planning is pure: node names and figures in, runs and readings out. run_rounds drives a plan
with the caller's "measure these groups at once" (suites/test_collectives.py, suites/test_training.py).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from inventory.model import Node
from runners.pairs import attribute, placement_order, ring_rounds

SCREEN, BISECT, CONFIRM, PAIR, CLUSTER = "screen", "bisect", "confirm", "pair", "cluster"
DEFAULT_BUDGET_S = 600.0  # unless the profile sets isolation_budget_s
CONFIRM_ALL_AT = 3  # a failing group this small: every node paired with a known-good one at once
PAIR_ROUNDS = 2  # with no node known good, rounds of suspects paired with each other, at most
HANG_FACTOR = 5  # a run still going at this many times the longest run that gave a figure is hung
HANG_FLOOR_S = 60.0  # ... and never before this: a launch across nodes takes tens of seconds to start
NAMED_AT_MOST = 8  # nodes listed in a summary before "and N more"
LISTED_GROUP_AT_MOST = 4  # a larger group is described by its ends and size


def group_size(count: int) -> int:
    """About sqrt(count), at least 2: a collective across nodes needs two of them."""
    return max(2, math.isqrt(max(count - 1, 0)) + 1)


def screen_groups(nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Disjoint groups of group_size(N) in the given order; a last group of one joins the one before."""
    size = group_size(len(nodes))
    groups = [tuple(nodes[i:i + size]) for i in range(0, len(nodes), size)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2:] = [groups[-2] + groups[-1]]
    return groups


def describe_nodes(nodes: Sequence[str], joiner: str = ",") -> str:
    """'a,b,c', or 'a..z (32 nodes)' for a large group."""
    if len(nodes) <= LISTED_GROUP_AT_MOST:
        return joiner.join(nodes)
    return f"{nodes[0]}..{nodes[-1]} ({len(nodes)} nodes)"


def hang_cut_s(finished_s: Sequence[float], floor_s: float = HANG_FLOOR_S) -> Optional[float]:
    """How long into a round a run still going is called hung and cut: HANG_FACTOR times the
    longest run of the isolation that gave a figure, at least floor_s; None while none has.

    A collective waiting on a dead rank waits forever (NCCL has no timeout of its own), so one
    hung group would otherwise hold its round, and the isolation's budget, for its whole timeout.
    """
    return max(HANG_FACTOR * max(finished_s), floor_s) if finished_s else None


def listed(nodes: Sequence[str]) -> str:
    """Names for a message, at most NAMED_AT_MOST of them."""
    shown = ", ".join(nodes[:NAMED_AT_MOST])
    return shown + (f" and {len(nodes) - NAMED_AT_MOST} more" if len(nodes) > NAMED_AT_MOST else "")


@dataclass(frozen=True)
class Run:
    """One collective on a set of nodes; a confirmation's nodes are (suspect, known-good node)."""

    # SCREEN, BISECT, CONFIRM; PAIR: two suspects while no node is known good; CLUSTER: the run
    # that triggered the isolation
    phase: str
    nodes: tuple[str, ...]

    def describe(self) -> str:
        if self.phase == CONFIRM:
            return f"confirm {self.nodes[0]} with {self.nodes[1]}"
        return f"{self.phase} {describe_nodes(self.nodes)}"


@dataclass(frozen=True)
class Unit:
    """How the isolated figure is written: '0.035 GB/s', '87.5 %'; also how it is rounded when judged."""

    name: str
    decimals: int

    def format(self, figure: float) -> str:
        return f"{figure:.{self.decimals}f} {self.name}"


BUSBW = Unit("GB/s", 3)  # an all-reduce's busbw at its largest size, the first figure isolated


@dataclass(frozen=True)
class Outcome:
    figure: Optional[float]  # in the isolation's unit; None: the run gave no figure
    why: str = ""  # why there is no figure, in one line
    cut: bool = False  # stopped by the budget's deadline: says nothing about its nodes


@dataclass(frozen=True)
class Step:
    round: int  # 0: the run that triggered the isolation
    run: Run
    outcome: Outcome
    unit: Unit

    def met(self, low_bound: Optional[float]) -> bool:
        """It gave a figure within the band; any figure where there is no band (a run that failed)."""
        figure = self.outcome.figure
        return figure is not None and (low_bound is None or figure >= low_bound)

    def describe(self) -> str:
        figure = (self.unit.format(self.outcome.figure) if self.outcome.figure is not None
                  else f"no figure ({self.outcome.why or 'no reason given'})")
        return f"{self.run.describe()} {figure}" + (" (cut by the budget)" if self.outcome.cut else "")


@dataclass(frozen=True)
class Verdict:
    culprits: tuple[str, ...]
    cleared: tuple[str, ...]
    unresolved: dict[str, str]  # node -> why the isolation left it undecided
    steps: tuple[Step, ...]
    rounds: int
    spent_s: float
    budget_s: float
    low_bound: Optional[float]  # None: a run passes by giving a figure (the run isolated failed)
    unit: Unit
    findings: tuple[str, ...] = ()  # what the steps say beyond single nodes (the fabric)

    def evidence(self, node: str) -> list[Step]:
        """Every step the node took part in, in order."""
        return [step for step in self.steps if node in step.run.nodes]

    def figures_by_phase(self) -> dict[str, list[tuple[float, float]]]:
        """phase -> (round, figure) of each step with a figure: the report's curve of the isolation."""
        lines: dict[str, list[tuple[float, float]]] = {}
        for step in self.steps:
            if step.outcome.figure is not None:
                lines.setdefault(step.run.phase, []).append((step.round, step.outcome.figure))
        return lines

    def summary(self) -> str:
        """One paragraph for the check's message: culprits with each step's figure, the rest counted."""
        parts = []
        for node in self.culprits[:NAMED_AT_MOST]:
            parts.append(f"isolated {node} ("
                         + "; ".join(step.describe() for step in self.evidence(node)) + ")")
        if len(self.culprits) > NAMED_AT_MOST:
            parts.append(f"and {len(self.culprits) - NAMED_AT_MOST} more: {listed(self.culprits[NAMED_AT_MOST:])}")
        if not self.culprits:
            parts.append("no single node isolated")
        parts += self.findings
        total = len(self.culprits) + len(self.cleared) + len(self.unresolved)
        passing = (f"band >= {self.low_bound:g} {self.unit.name}" if self.low_bound is not None
                   else "a run passes by giving a figure")
        parts.append(f"{passing}; cleared {len(self.cleared)} of {total} node(s); "
                     f"{self.rounds} round(s) in {self.spent_s:.0f} s of a {self.budget_s:g} s budget")
        by_reason: dict[str, list[str]] = {}
        for node, why in self.unresolved.items():
            by_reason.setdefault(why, []).append(node)
        parts += [f"not finished: {listed(nodes)} ({why})" for why, nodes in by_reason.items()]
        return "; ".join(parts)


class Isolation:
    """The isolation of a run across nodes that missed its band (or, low_bound None, gave no
    figure at all), one round of concurrent runs at a time.

    next_round(spent_s) gives the runs to start now (disjoint node sets), record() takes each
    run's outcome, and verdict() says what was found once next_round gives nothing more.
    `spent_s` is the wall time since the isolation began, measured by the caller; a round
    starts only when the budget has room for one as long as the longest so far, and every run
    of it is to be stopped after timeout_s(spent_s).
    """

    def __init__(self, nodes: Sequence[str], low_bound: Optional[float], *, unit: Unit = BUSBW,
                 budget_s: float = DEFAULT_BUDGET_S, cluster: Optional[Outcome] = None):
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"node names must be distinct: {list(nodes)}")
        if len(nodes) < 2:
            raise ValueError("isolation needs at least two nodes")
        self.nodes = tuple(nodes)
        self.low_bound = low_bound
        self.unit = unit
        self.budget_s = budget_s
        self.steps: list[Step] = []
        self._pending: list[Run] = []  # group runs for the next round
        self._failing: list[tuple[str, ...]] = []  # groups that missed, split at the next round
        self._suspects: list[str] = []  # awaiting a pair with a known-good node
        self._good: list[str] = []
        self._culprits: list[str] = []
        self._cut: dict[str, str] = {}
        self._in_flight: list[Run] = []
        self._rounds = 0
        self._round_started = 0.0
        self._longest_round = 0.0
        self._spent = 0.0
        self._stopped = ""  # why no further round started while work was left
        self._pair_rounds = 0
        groups = screen_groups(self.nodes)
        if cluster is not None:
            self.steps.append(Step(0, Run(CLUSTER, self.nodes), cluster, unit))
        if len(groups) == 1:  # the one group is the whole cluster, whose run already missed
            self._failing.append(groups[0])
        else:
            self._pending = [Run(SCREEN, group) for group in groups]

    def timeout_s(self, spent_s: float) -> float:
        """How long the runs of a round started now may take: what is left of the budget."""
        return max(self.budget_s - spent_s, 0.0)

    def next_round(self, spent_s: float) -> list[Run]:
        """The runs to start at once now; [] when the isolation is over (finished or out of time)."""
        if self._in_flight:
            raise ValueError("record the outcome of every run of the round first: "
                             + ", ".join(run.describe() for run in self._in_flight))
        self._spent = spent_s
        if self._rounds:
            self._longest_round = max(self._longest_round, spent_s - self._round_started)
        for group in self._failing:
            self._split(group)
        self._failing = []
        runs = list(self._pending)
        pairs = list(zip(self._suspects, self._good, strict=False))  # one pair per good node
        runs += [Run(CONFIRM, pair) for pair in pairs]
        untried = self._untried_pairs() if not runs and self._pair_rounds < PAIR_ROUNDS else []
        runs += [Run(PAIR, pair) for pair in untried]
        if not runs:
            return []
        left = self.budget_s - spent_s
        if left <= 0 or left < self._longest_round:
            self._stopped = (f"{max(left, 0):.0f} s of the {self.budget_s:g} s budget left, "
                             f"less than a round takes ({self._longest_round:.0f} s)")
            return []
        self._pending = []
        paired = {node for pair in untried for node in pair}  # a set: suspects x pairs would be quadratic
        self._suspects = [node for node in self._suspects[len(pairs):] if node not in paired]
        self._pair_rounds += bool(untried)
        self._rounds += 1
        self._round_started = spent_s
        self._in_flight = list(runs)
        return runs

    def record(self, run: Run, outcome: Outcome) -> None:
        """The outcome of one run of the current round."""
        if run not in self._in_flight:
            raise ValueError(f"{run.describe()} is not a run of the current round")
        self._in_flight.remove(run)
        step = Step(self._rounds, run, outcome, self.unit)
        self.steps.append(step)
        if outcome.cut:
            for node in run.nodes[:1] if run.phase == CONFIRM else run.nodes:
                self._cut[node] = f"its {run.phase} run was cut by the budget"
        elif run.phase == CONFIRM:
            (self._good if step.met(self.low_bound) else self._culprits).append(run.nodes[0])
        elif run.phase == PAIR:
            (self._good if step.met(self.low_bound) else self._suspects).extend(run.nodes)
        elif step.met(self.low_bound):
            self._good += list(run.nodes)
        else:
            self._failing.append(run.nodes)

    def _split(self, group: tuple[str, ...]) -> None:
        """A group that missed: small ones (with a known-good node to pair with) go to
        confirmation whole; others are halved, a half of one node being a suspect."""
        if len(group) <= CONFIRM_ALL_AT and self._good:
            self._suspects += group
            return
        middle = len(group) // 2
        for half in (group[:middle], group[middle:]):
            if len(half) == 1:
                self._suspects += half
            else:
                self._pending.append(Run(BISECT, half))

    def _untried_pairs(self) -> list[tuple[str, str]]:
        """Disjoint pairs of suspects never measured as that pair: with no node known good, a
        pair that meets the band clears both and gives the others a partner."""
        measured = {frozenset(step.run.nodes) for step in self.steps}
        free, pairs = list(self._suspects), []
        while free:
            first = free.pop(0)
            partner = next((node for node in free if frozenset((first, node)) not in measured), None)
            if partner is not None:
                free.remove(partner)
                pairs.append((first, partner))
        return pairs

    def verdict(self) -> Verdict:
        """What the isolation found, and what it left undecided and why."""
        unresolved = dict(self._cut)
        waiting = [(run.nodes, "awaiting its " + run.phase) for run in self._pending]
        waiting += [(group, "awaiting bisection") for group in self._failing]
        for nodes, why in waiting:
            for node in nodes:
                unresolved[node] = f"{why}: {self._stopped}" if self._stopped else why
        for node in self._suspects:
            unresolved[node] = (f"awaiting confirmation: {self._stopped}" if self._stopped
                                else "awaiting confirmation: no node was cleared to pair it with")
        findings = []
        screened = [step for step in self.steps if step.run.phase == SCREEN]
        met, trouble, fabric = (("met the band", "slowdown", "slow") if self.low_bound is not None
                                else ("gave a figure", "failure", "failing"))
        if screened and all(step.met(self.low_bound) for step in screened):
            findings.append(f"every group of about {group_size(len(self.nodes))} node(s) {met} "
                            f"while all nodes together did not: the {trouble} is between the groups "
                            "(spine or fabric), not in one node")
        elif not self._good and self._rounds:
            findings.append(f"no run {met}, so no node could be cleared: the whole fabric is "
                            f"{fabric}, or more nodes are bad than the groups can separate")
        good = set(self._good)  # looked up once per node: the list would cost nodes x cleared
        cleared = tuple(node for node in self.nodes if node in good)
        return Verdict(tuple(self._culprits), cleared, unresolved, tuple(self.steps), self._rounds,
                       self._spent, self.budget_s, self.low_bound, self.unit, tuple(findings))


# measure(groups, round, timeout_s) -> each group's outcome: one run per group (disjoint node sets),
# all at once, each stopped after timeout_s; `round` (from 1) names the round's raw output
MeasureAtOnce = Callable[[list[tuple[str, ...]], int, float], Mapping[tuple[str, ...], Outcome]]


def run_rounds(plan: Isolation, measure: MeasureAtOnce,
               clock: Callable[[], float] = time.monotonic) -> Verdict:
    """The plan run to its end, one round of `measure` at a time, the budget's time on `clock`."""
    started = clock()
    rounds = 0
    while runs := plan.next_round(clock() - started):
        rounds += 1
        outcomes = measure([run.nodes for run in runs], rounds, plan.timeout_s(clock() - started))
        for run in runs:
            plan.record(run, outcomes[run.nodes])
    return plan.verdict()


# ---------------------------------------------------------------------------------------------
# The multi-scale table


PLACEMENT_KEYS = ("leaf", "rack")


@dataclass(frozen=True)
class Level:
    """One scale of the table: its runs in rounds of disjoint node sets, or why it is skipped."""

    name: str  # "pair", "leaf" or "rack"
    rounds: tuple[tuple[tuple[str, ...], ...], ...] = ()
    labels: dict[tuple[str, ...], str] = field(default_factory=dict)  # run -> its leaf/rack name
    skipped: str = ""


def placement_level(nodes: Sequence[Node], key: str) -> Level:
    """One collective per leaf (or rack) with two or more nodes, all in one round."""
    places: dict[str, list[str]] = {}
    for node in nodes:
        place = getattr(node, key)
        if place is not None:
            places.setdefault(place, []).append(node.name)
    if not places:
        return Level(key, skipped=f"the inventory gives no {key}: for any node")
    if len(places) == 1 and len(next(iter(places.values()))) == len(nodes):
        return Level(key, skipped=f"every node is under {key} {next(iter(places))}: the cluster row measures it")
    groups = {tuple(names): place for place, names in places.items() if len(names) > 1}
    if not groups:
        return Level(key, skipped=f"no {key} holds two or more nodes")
    return Level(key, (tuple(groups),), groups)


def scale_levels(nodes: Sequence[Node]) -> list[Level]:
    """The cross-node scales below the whole cluster: pairs in a ring, then leaf and rack groups."""
    ordered = placement_order(nodes)
    pair = Level("pair", tuple(tuple(tuple(p) for p in round_) for round_ in ring_rounds([n.name for n in ordered])))
    return [pair] + [placement_level(ordered, key) for key in PLACEMENT_KEYS]


@dataclass(frozen=True)
class ScaleRun:
    level: str  # "node", "pair", "leaf", "rack" or "cluster"
    label: str  # the node, the pair, the leaf's or rack's name, "cluster"
    nodes: tuple[str, ...]
    busbw: Optional[float]  # GB/s; None: no figure
    why: str = ""


def level_line(level: str, runs: Sequence[ScaleRun]) -> str:
    """'pair: 8 run(s), median 0.21, min 0.02 GB/s (node4-node5)', one line of the table."""
    figures = {run.label: run.busbw for run in runs if run.busbw is not None}
    failed = [run.label for run in runs if run.busbw is None]
    line = f"{level}: {len(runs)} run(s)"
    if figures:
        slowest = min(figures, key=lambda label: figures[label])
        line += (f", median {statistics.median(figures.values()):.3f}, "
                 f"min {figures[slowest]:.3f} GB/s ({slowest})")
    if failed:
        line += f", no figure from {listed(failed)}"
    return line


def read_scales(runs: Sequence[ScaleRun], low_bounds: dict[str, Optional[float]]) -> str:
    """What the table says: bad nodes (every pair low, as runners.pairs.attribute blames them, and
    no leaf or rack group of theirs meeting its band), groups low with no bad node in them, or the
    whole cluster low while every smaller scale meets its band."""
    def low(run: ScaleRun) -> bool:
        bound = low_bounds.get(run.level)
        return run.busbw is None or (bound is not None and run.busbw < bound)

    by_level: dict[str, list[ScaleRun]] = {}
    for run in runs:
        by_level.setdefault(run.level, []).append(run)
    judged = [level for level in by_level if low_bounds.get(level) is not None]
    if not judged:
        return "no band to judge the scales against"
    findings = []
    own = [run.label for run in by_level.get("node", []) if low(run)]
    if own:
        findings.append(f"own all-reduce low on {listed(own)}")
    suspects = attribute({(run.nodes[0], run.nodes[1]): not low(run) for run in by_level.get("pair", [])}).suspect_nodes
    vouched = {node for level in PLACEMENT_KEYS for run in by_level.get(level, []) if not low(run)
               for node in run.nodes}  # a group that met its band clears its nodes of noisy pairs
    bad = [node for node in suspects if node not in vouched]
    if bad:
        findings.append(f"every pair of {listed(bad)} is low: bad node(s), not the fabric")
    for level in PLACEMENT_KEYS:
        groups = [run.label for run in by_level.get(level, [])
                  if low(run) and not set(run.nodes) & set(bad)]
        if groups:
            findings.append(f"{level} group(s) {listed(groups)} low with no bad node in them: "
                            f"that {level}'s switch or uplinks")
    smaller = [run for level in ("pair",) + PLACEMENT_KEYS for run in by_level.get(level, [])]
    cluster = by_level.get("cluster", [])
    if cluster and all(low(run) for run in cluster) and smaller and not any(low(run) for run in smaller):
        findings.append("the whole cluster is low while every pair and group meets the band: "
                        "the links between leaves or racks (the spine)")
    if not findings:
        return "every scale meets its band" if not any(low(run) for run in runs) else \
            "low runs with no single pattern: " + listed([f"{run.level} {run.label}" for run in runs if low(run)])
    return "; ".join(findings)
