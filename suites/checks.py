"""The check vocabulary the suites share: sanity of a tool's run, metrics against references.

As in ReFrame, a check first asks whether the tool ran correctly (sanity), then whether each
named, unit-bearing metric lies in its reference band (performance). Failures are raised as the
kinds in handover.failures, so a report can tell an unreachable node from a slow one.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from collections import Counter
from datetime import datetime
from typing import Callable, Generic, NoReturn, Optional, Sequence, TypeVar, cast

import pytest
from _pytest.mark.expression import Expression  # how -m is evaluated; pytest has no public API for it

from handover.failures import (
    CheckFailure,
    CommandTimedOut,
    ExpectationFailure,
    NodeUnreachable,
    PerformanceFailure,
    SanityFailure,
    excerpt,
    transport_failure,
)
from inventory.metrics import unrecorded
from inventory.model import Cluster, Node, Profile
from runners import isolation, kernel_log
from runners.fanout import kill_everywhere
from runners.parsing import ParseError
from runners.scratch import missing_tool, refusal
from runners.torchrun import Launch, rendezvous_cause
from runners.transport import Result, Transport

T = TypeVar("T")
K = TypeVar("K")


def depth_of_selection(markexpr: str, area: str) -> str:
    """The depth of a check marked both quick and full that scales its work by depth (the pair
    schedules): full when -m would select a check of `area` marked full alone, or when there is
    no -m; else quick. Read from the expression as pytest evaluates -m."""
    if not markexpr:
        return "full"
    full_only = {area, "full"}
    selected = Expression.compile(markexpr).evaluate(lambda name, **kwargs: not kwargs and name in full_only)
    return "full" if selected else "quick"


def require(result: Result, timeout_note: str = "") -> Result:
    """Fail the check unless the command ran to a zero exit; says why in the report's words.

    timeout_note says why the timeout was what it was, where a cap rather than an estimate set it.
    """
    failed = transport_failure(result.failure)
    if failed is not None:
        raise failed(result.explain())
    if result.timed_out:
        raise CommandTimedOut(result.explain() + (f": {timeout_note}" if timeout_note else ""),
                              excerpt(result.stdout + result.stderr))
    if not result.ok:
        raise SanityFailure(result.explain(), excerpt(result.stderr or result.stdout))
    return result


def require_launchable(cluster_run, nodes: Sequence[str], step: str) -> None:
    """Before a run across `nodes`: fail it as unreachable, naming the lost nodes, where one of
    them cannot be reached (ClusterRun.beyond_launch); nothing is started on the others."""
    lost = cluster_run.beyond_launch(nodes, step)
    if lost:
        first, *others = lost.values()
        more = f"; also lost: {isolation.listed([result.node for result in others])}" if others else ""
        raise NodeUnreachable(first.explain() + more)


def launch_failure(launch: Launch, cause: Optional[tuple[str, str]] = None) -> NoReturn:
    """Raise the failure of a launch across nodes (runners.torchrun), naming where it was killed.

    An unreachable node first; then `cause`, (node, why) of the rank the others followed as the
    tool's runner reads it, or of a rendezvous that failed, with that node's stderr; else the
    first failure's timeout or error.
    """
    cause = cause or rendezvous_cause(launch)
    failed = launch.results.get(launch.first_failure)
    killed = f"; killed the launch on {', '.join(launch.killed)}" if launch.killed else ""
    if failed is None:
        raise NodeUnreachable(f"{launch.first_failure}: no result{killed}")
    transport_failed = transport_failure(failed.failure)
    if transport_failed is not None:
        raise transport_failed(failed.explain() + killed)
    if cause is not None:
        node, why = cause
        raise SanityFailure(why + killed, excerpt(launch.results[node].stderr))
    if failed.timed_out:
        raise CommandTimedOut(failed.explain() + killed, excerpt(failed.stderr))
    raise SanityFailure(failed.explain() + killed, excerpt(failed.stderr or failed.stdout))


def require_scratch_run(result: Result, refused_as: str, missing_hint: str = "",
                        timeout_note: str = "") -> None:
    """Before any figure of a tool run in a scratch path: the node answered, its guard did not
    refuse the path, and the tool is installed (runners.scratch's protocol)."""
    if result.failure or result.timed_out:
        require(result, timeout_note)
    refused = refusal(result)
    if refused:
        raise ExpectationFailure(f"{result.node}: {refused_as}: {refused}")
    missing = missing_tool(result)
    if missing:
        raise ExpectationFailure(f"{result.node}: {missing}{missing_hint}")


def parsed(parser: Callable[[str], T], result: Result) -> T:
    """Run a pure parser on a successful result; unparseable output is a sanity failure."""
    require(result)
    try:
        return parser(result.stdout)
    except ParseError as exc:
        raise SanityFailure(f"{result.node}: {exc}", excerpt(result.stdout)) from None


def kernel_log_of(on_node, step: str, started: datetime, profile: Profile) -> kernel_log.KernelRead:
    """The node's kernel log since boot, split at `started`. Unreadable: skipped on a CPU-only
    profile, failed on a GPU profile (a GPU's Xids are only there)."""
    log = parsed(kernel_log.parse_kernel_read, on_node(step, lambda transport: kernel_log.read(transport, started)))
    if not log.readable:
        if profile.expect.gpu_count:
            raise ExpectationFailure(f"profile {profile.name} expects GPUs, whose Xids are in the "
                                     f"kernel log, but {log.unreadable_reason()}")
        pytest.skip(log.unreadable_reason())
    return log


def describe_kernel_events(events: Sequence[kernel_log.KernelEvent]) -> list[str]:
    return [f"{e.kind} {e.code if e.code is not None else ''} {e.device}: {e.meaning} -> "
            f"{e.action}".replace("  ", " ") for e in events]


def fail_on_critical_kernel_events(windows: Sequence[tuple[str, Sequence[kernel_log.KernelEvent]]]) -> None:
    """A sanity failure naming the critical events of each (label, events) window, their lines
    as the excerpt and the action the worst calls for."""
    critical = {label: [e for e in events if e.severity == kernel_log.CRITICAL] for label, events in windows}
    problems = [f"{label}: " + " | ".join(describe_kernel_events(events))
                for label, events in critical.items() if events]
    if problems:
        every = [e for events in critical.values() for e in events]
        raise SanityFailure("critical kernel event(s) " + "; ".join(problems), "\n".join(e.line for e in every),
                            action=kernel_log.kernel_action(every))


class Metrics:
    """Judges a check's measurements against the profile's references, all misses at once."""

    def __init__(self, check: str, profile: Profile, record: Callable[[list[dict]], None]):
        self.check = check
        self.profile = profile
        self._record = record

    def judge(self, **measured: tuple[Optional[float], str]) -> None:
        """judge(memory_total=(23.4, "GiB"), ...): record every metric, then fail on any miss."""
        rows, misses = [], []
        expected = {name for name, ref in self.profile.references.items() if ref.check == self.check}
        for name in sorted(expected - measured.keys()):
            measured[name] = (None, self.profile.references[name].unit)
        for name, (value, unit) in measured.items():
            unlisted = unrecorded(self.check, name, unit)
            if unlisted:  # the harness's own mistake: the profiles could not name the metric
                raise LookupError(unlisted)
            if value is not None and not math.isfinite(value):
                value = None  # NaN or infinity is no measurement (and no JSON)
            reference = self.profile.references.get(name)
            row = {"name": name, "value": value, "unit": unit, "reference": None,
                   "criterion": None, "margin": None, "ok": None}
            if reference is not None:
                row.update(reference=_reference_dict(reference), criterion=reference.criterion(),
                           band=[reference.low_bound, reference.high_bound])
                if value is None:
                    row["ok"] = False
                    misses.append(f"{name}: no measurement, but the profile has a reference "
                                  f"({reference.criterion()})")
                elif unit != reference.unit:
                    row["ok"] = False
                    misses.append(f"{name}: measured in {unit}, reference in {reference.unit}")
                else:
                    row.update(margin=reference.margin(value), ok=reference.admits(value))
                    if not row["ok"]:
                        misses.append(f"{name} = {value:g} {unit}, expected {reference.criterion()}")
            rows.append(row)
        self._record(rows)
        if misses:
            raise PerformanceFailure("; ".join(misses))


def _reference_dict(reference) -> dict:
    return {"value": reference.value, "lower": reference.lower, "upper": reference.upper,
            "unit": reference.unit, "source": reference.source}


X_SCALES = ("linear", "log2")


def series_entry(name: str, *, x: tuple[str, str], y: tuple[str, str],
                 lines: dict[str, list[tuple[float, float]]], x_scale: str = "linear") -> dict:
    """The results' form of one curve: named axes with units, and points per legend entry.

    Non-finite points are dropped (a loss that went to NaN shows as a gap, the check fails
    on its own); a log2 axis needs positive x.
    """
    if x_scale not in X_SCALES:
        raise ValueError(f"x_scale {x_scale!r}: one of {', '.join(X_SCALES)}")
    def usable(px: float, py: float) -> bool:
        finite = math.isfinite(px) and math.isfinite(py)
        return finite and (x_scale == "linear" or px > 0)
    return {"name": name, "x_label": x[0], "x_unit": x[1], "y_label": y[0], "y_unit": y[1],
            "x_scale": x_scale,
            "lines": [{"label": str(label), "points": [[float(px), float(py)] for px, py in points
                                                       if usable(float(px), float(py))]}
                      for label, points in lines.items()]}


def odd_ones_out(label: str, values: dict[str, object]) -> str:
    """'' when all agree; else which nodes differ from the most common value."""
    counts = Counter(values.values())
    if len(counts) < 2:
        return ""
    common, count = counts.most_common(1)[0]
    odd = {node: value for node, value in values.items() if value != common}
    listed = ", ".join(f"{node} has {value!r}" for node, value in sorted(odd.items()))
    return f"{label}: {listed}, while {count} node(s) have {common!r}"


def first_line(failure: BaseException) -> str:
    """A failure in one line, for a figure's place in a table or an isolation step."""
    return str(failure).splitlines()[0][:200] if str(failure) else type(failure).__name__


class HangWatch(Generic[T]):
    """Cuts the runs of a round that are still going long after the others finished
    (runners.isolation.hang_cut_s), across the rounds of one isolation: a group's work is killed
    on its nodes (`transport_of(node)`), and `hung` keeps why for each group cut."""

    def __init__(self, transport_of: Callable[[str], Transport], gave_figure: Callable[[T], bool], *,
                 floor_s: float):
        self._transport_of = transport_of
        self._gave_figure = gave_figure
        self._floor_s = floor_s
        self._finished_s: list[float] = []  # how long each run that gave a figure took
        self.hung: dict[tuple[str, ...], str] = {}

    def finished(self, value: T, seconds: float) -> None:
        if self._gave_figure(value):
            self._finished_s.append(seconds)

    def outcome(self, group: tuple[str, ...], outcome: isolation.Outcome) -> isolation.Outcome:
        """The group's outcome as the isolation reads it: no figure, and why, where it was cut."""
        return isolation.Outcome(None, self.hung[group]) if group in self.hung else outcome

    def cut_overdue(self, running: Sequence[tuple[str, ...]], seconds: float) -> None:
        """Cut each run still going `seconds` into its round once that is past the hang cut."""
        limit = isolation.hang_cut_s(self._finished_s, self._floor_s)
        if limit is None or seconds < limit:
            return
        for group in running:
            if group not in self.hung:
                self.hung[group] = (f"hung: still running after {seconds:.0f} s, while the longest run "
                                    f"that gave a figure took {max(self._finished_s):.0f} s")
                kill_everywhere(self._transport_of(node) for node in group)


def at_once(groups: Sequence[K], measure: Callable[[K], T], name: str,
            hangs: Optional[HangWatch[T]] = None) -> dict[K, T]:
    """measure(group) for every group at once (disjoint node sets: one thread each); the first
    group's exception, if any, once every group has ended. A Ctrl-C does not wait for them (an
    executor would wait out each group's run across nodes, up to its timeout, before the
    interrupt reached the session, whose end kills their remote work): daemon threads.
    With `hangs`, a group still running long after the others is cut (HangWatch)."""
    ended: queue.SimpleQueue = queue.SimpleQueue()
    outcomes: dict[int, tuple[Optional[T], Optional[BaseException]]] = {}
    started = time.monotonic()

    def work(index: int, group: K) -> None:
        try:
            ended.put((index, measure(group), None))
        except BaseException as error:
            ended.put((index, None, error))

    for index, group in enumerate(groups):
        threading.Thread(target=work, args=(index, group), name=f"{name}-{index}", daemon=True).start()
    while len(outcomes) < len(groups):
        try:
            index, value, error = ended.get(timeout=1.0)
        except queue.Empty:
            if hangs is not None:
                running = [group for i, group in enumerate(groups) if i not in outcomes]
                hangs.cut_overdue(cast(list[tuple[str, ...]], running),  # a watch's groups are node names
                                  time.monotonic() - started)
            continue
        outcomes[index] = (value, error)
        if hangs is not None and error is None:
            hangs.finished(value, time.monotonic() - started)
    failed = next((outcomes[i][1] for i in range(len(groups)) if outcomes[i][1] is not None), None)
    if failed is not None:
        raise failed
    return {group: outcomes[index][0] for index, group in enumerate(groups)}


# ---------------------------------------------------------------------------------------------
# Bad-node isolation behind a figure across nodes (runners/isolation.py plans it)


def band_low(profile: Profile, metric: str, unit: str) -> Optional[float]:
    """The lowest figure the profile admits for `metric` in `unit`, None when it sets none."""
    reference = profile.references.get(metric)
    return reference.low_bound if reference is not None and reference.unit == unit else None


def isolation_outcome(figure: Optional[float], failure: Optional[CheckFailure], timeout_s: float,
                      full_timeout_s: float) -> isolation.Outcome:
    """A run as the isolation reads it; a timeout shorter than the run's own was the budget's."""
    if figure is not None:
        return isolation.Outcome(figure)
    cut = isinstance(failure, CommandTimedOut) and timeout_s < full_timeout_s
    return isolation.Outcome(None, first_line(failure) if failure else "", cut)


def isolation_budget(profile: Profile) -> float:
    """The profile's isolation_budget_s, DEFAULT_BUDGET_S where it sets none."""
    budget = profile.expect.isolation_budget_s
    return isolation.DEFAULT_BUDGET_S if budget is None else budget


def hang_floor(cluster: Cluster) -> float:
    """How long a run of an isolation round goes on, at least, before it can be called hung and
    cut: the profile's isolation_hang_floor_s, where it sets none HANG_FLOOR_S or, if longer, the
    rendezvous timeout (a run whose nodes start slowly is not cut before its rendezvous could end)."""
    floor = cluster.profile.expect.isolation_hang_floor_s
    return max(isolation.HANG_FLOOR_S, cluster.launch.rendezvous_timeout_s) if floor is None else floor


def isolate_below_band(profile: Profile, record, nodes: Sequence[Node], metric: str, figure: float,
                       unit: isolation.Unit, series: tuple[str, str],
                       measure: isolation.MeasureAtOnce) -> Optional[isolation.Verdict]:
    """Below its band, the node(s) behind a figure across all nodes, found by runners.isolation's
    plan, each round's runs at once by `measure`, within the profile's isolation_budget_s; the
    steps' figures go into the report as `series` (its name, the figure's label). None when the
    figure (rounded as judged) is within the band, no band is set in `unit`, or the budget is 0."""
    low = band_low(profile, metric, unit.name)
    if low is None or round(figure, unit.decimals) >= low or isolation_budget(profile) <= 0:
        return None
    return _isolated(profile, record, nodes, low, isolation.Outcome(figure), unit, series, measure)


def isolate_failed_run(profile: Profile, record, nodes: Sequence[Node], metric: str, failure: CheckFailure,
                       unit: isolation.Unit, series: tuple[str, str],
                       measure: isolation.MeasureAtOnce) -> Optional[isolation.Verdict]:
    """A run across all nodes that hung or broke (a timeout or a sanity failure: one node's dead
    rank or link stops every rank), isolated like a figure below its band: a run passes where it
    gives a figure within the band, or any figure where there is none. None where the failure
    already names its node (unreachable, host key, a busy node), or the budget is 0."""
    if failure.kind not in (CommandTimedOut.kind, SanityFailure.kind) or isolation_budget(profile) <= 0:
        return None
    low = band_low(profile, metric, unit.name)
    return _isolated(profile, record, nodes, low, isolation.Outcome(None, failure.kind), unit, series, measure)


def _isolated(profile: Profile, record, nodes: Sequence[Node], low: Optional[float], cluster: isolation.Outcome,
              unit: isolation.Unit, series: tuple[str, str], measure: isolation.MeasureAtOnce) -> isolation.Verdict:
    plan = isolation.Isolation([node.name for node in isolation.placement_order(nodes)], low, unit=unit,
                               budget_s=isolation_budget(profile), cluster=cluster)
    verdict = isolation.run_rounds(plan, measure)
    record.series(series[0], x=("round", ""), y=(series[1], unit.name), lines=verdict.figures_by_phase())
    return verdict


def isolated_action(verdict: isolation.Verdict) -> str:
    """What to do about the isolated nodes; '' when none was isolated (the kind's default stands)."""
    if not verdict.culprits:
        return ""
    return (f"take {isolation.listed(verdict.culprits)} out of the cluster's jobs and check each on its own "
            "(its node checks, its network pairs: GPUs, NICs, cables), then run the checks across the rest again")


def isolation_figures(verdict: isolation.Verdict) -> dict[str, tuple[Optional[float], str]]:
    """The isolation's time, rounds and culprit count, as metrics beside the figure it isolated."""
    return {"isolation_time": (round(verdict.spent_s, 1), "s"), "isolation_rounds": (verdict.rounds, "rounds"),
            "isolated_nodes": (len(verdict.culprits), "nodes")}


def fail_isolated(metrics: Metrics, verdict: isolation.Verdict, failure: CheckFailure, headline: str) -> NoReturn:
    """Raise the failure of a run across nodes that gave no figure with what its isolation found:
    the headline and the verdict's summary, the run's own failure first in the log, the isolation's
    figures recorded (the run's own figure as not measured)."""
    try:
        metrics.judge(**isolation_figures(verdict))
    except PerformanceFailure:
        pass  # the figure it misses is the run's own, whose failure this is
    raise type(failure)(f"{headline}; {verdict.summary()}", f"{failure}\n{failure.log}".strip(),
                        isolated_action(verdict) or failure.action)


def judge_isolated(metrics: Metrics, verdict: Optional[isolation.Verdict],
                   **figures: tuple[Optional[float], str]) -> None:
    """metrics.judge(**figures) with the isolation's time, rounds and culprit count beside them;
    a miss carries the verdict's summary (the culprits and their evidence)."""
    if verdict is not None:
        figures.update(isolation_figures(verdict))
    try:
        metrics.judge(**figures)
    except PerformanceFailure as miss:
        if verdict is None:
            raise
        raise PerformanceFailure(f"{miss}; {verdict.summary()}", miss.log,
                                 isolated_action(verdict) or miss.action) from None
