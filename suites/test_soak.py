"""Soak: hours of load on every node at once, under a node-side supervisor that outlives the harness.

    pytest --inventory X -m soak --soak-duration 24h [--soak-mix cpu_load=80,net_rate=10G]
    pytest --inventory X -m soak --soak-attach RUN_DIR     (or the same command again)
    pytest --inventory X --soak-stop RUN_DIR

The first check starts the soak on every node (runners.soak) and follows it to the end, copying
samples into raw/soak/ as they come; a re-run attaches to the soak its run directory holds. Then
each node is judged from its samples: did it report throughout (heartbeat, dropped out), did its
load hold (first against last rounds, against its peers by the outlier rule, against the profile's
soak_* bands), did a GPU fall off the bus, log an Xid, new ECC errors or row remaps, slow down for
heat or power, or compute a result that differs from its node's (silent data corruption),
did the kernel log a critical Xid, PCIe or link event, did a link's error counters rise. The
trends (temperature, power, throughput against time) go into the report, worst nodes first, and
per rack where the inventory names racks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn, Optional, Sequence

import pytest

from handover.failures import CheckFailure, ExpectationFailure, NodeUnreachable, PerformanceFailure, SanityFailure
from handover.plugin import ProgressDisplay
from inventory.model import placement
from reports.results import outliers
from runners import soak as soaking
from suites.checks import Metrics, describe_kernel_events, fail_on_critical_kernel_events, kernel_log_of

pytestmark = [pytest.mark.soak]

PARTS = {"cpu": ("stress-ng CPU", "bogo-ops/s", "soak_cpu_rate"),
         "net": ("iperf3 to its peer", "Gbit/s", "soak_net_gbps"),
         "ib": ("ib_write_bw to its peer (slowest rail)", "Gbit/s", "soak_ib_gbps"),
         "io": ("fio on the shared scratch", "MB/s", "soak_io_mbps"),
         "gpu": ("GPU burn (slowest GPU)", "TFLOP/s", "soak_gpu_tflops")}
LOAD_PARTS = ("cpu", "net", "gpu")  # soak_load's; ib and io run only where there are rails and a shared scratch
PART_TOOLS = {"cpu": "stress-ng", "net": "iperf3", "ib": "ib_write_bw", "io": "fio"}  # the GPU burn is torch's
KERNEL_STEP = "soak_kernel_log"
PEER_PARTS = ("net", "ib")  # rounds to the ring peer: not held against a node after the peer dropped out
TREND_NODES = 8  # up to this many nodes, a line each; above, the worst of them and the median of all
WORST_SHOWN = 5
TRENDS = (("temperature", "cpu_temp_c", "CPU temperature", "°C", True),  # True: high is bad
          ("temperature", "gpus.temp_c", "GPU temperature (hottest)", "°C", True),
          ("power", "gpus.power_w", "GPU power (highest)", "W", True),
          ("throughput", "part:cpu", "stress-ng CPU rate", "bogo-ops/s", False),
          ("throughput", "part:net", "iperf3 rate", "Gbit/s", False),
          ("throughput", "part:ib", "ib_write_bw rate (slowest rail)", "Gbit/s", False),
          ("throughput", "part:io", "shared-storage fio rate", "MB/s", False),
          ("throughput", "part:gpu", "GPU burn rate (slowest GPU)", "TFLOP/s", False))


@dataclass
class SoakOutcome:
    plan: soaking.SoakPlan
    logs: dict[str, soaking.SoakLog]
    states: dict[str, soaking.NodeState]
    run_dir: Path
    far_below: dict[str, list[tuple[str, str]]]  # node -> (part, why) of its figures the outlier rule names

    def dropped(self, node: str) -> Optional[str]:
        """Why a node's samples end before the soak does: the harness's and the samples' view."""
        log = self.logs.get(node)
        state = self.states.get(node)
        if log is None:
            return None
        why = soaking.dropped_out(log, self.plan.end, self.plan.interval_s, stopped=self.plan.stopped)
        if why and state is not None and state.unreachable:
            why += f"; the harness cannot reach it: {state.unreachable}"
        elif why and state is not None and state.done == "gone":
            why += "; its supervisor is gone (a crash or a reboot)"
        return why


@pytest.fixture(scope="module")
def soak(acceptance, cluster_run, pytestconfig) -> SoakOutcome:
    """Start the soak (or attach to the one this run directory holds) and follow it to the end."""
    if acceptance.cluster.transport == "slurm" and os.environ.get("SLURM_JOB_ID"):
        pytest.skip("under Slurm the soak is a batch job of its own, which would wait for the allocation this "
                    f"run runs in (SLURM_JOB_ID={os.environ['SLURM_JOB_ID']}): run the soak outside an "
                    "allocation (README: Soak)")
    run_dir = acceptance.run_dir
    specs = {node.name: node for node in acceptance.nodes}
    if (run_dir / soaking.SOAK_FILE).exists():
        plan = soaking.SoakPlan.load(run_dir)
        specs = {name: acceptance.cluster.node(name) for name in plan.nodes}
    else:
        duration = pytestconfig.getoption("--soak-duration")
        if not duration:
            pytest.skip("no soak asked for: give --soak-duration (e.g. 24h)")
        mix = soaking.parse_mix(pytestconfig.getoption("--soak-mix"), acceptance.cluster.profile.soak_mix)
        profile = acceptance.cluster.profile
        short = soaking.too_short(soaking.parse_duration(duration), mix, gpus=bool(profile.expect.gpu_count))
        if short:  # the profile's rounds or its GPUs (the option's check, before, knew neither)
            pytest.fail(f"{short} (profile {profile.name})", pytrace=False)
        plan = soaking.new_plan(acceptance.nodes, acceptance.cluster.scratch, soaking.parse_duration(duration), mix)
    run = soaking.SoakRun(plan, run_dir, specs, on_progress=ProgressDisplay(pytestconfig).show,
                          launch=acceptance.cluster.launch)
    try:
        if not (run_dir / soaking.SOAK_FILE).exists():
            run.start_all()
        run.follow()
    except KeyboardInterrupt:
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"handover: the soak goes on on the nodes until {soaking.clock_utc(plan.end)}; "
                                f"re-attach with --soak-attach {run_dir}, end it with --soak-stop {run_dir}")
        raise
    finally:
        run.close()
    for name, state in run.states.items():
        if state.state is not None and not state.unreachable:  # answered the soak's last poll
            cluster_run.reconnect(name)
    logs = {name: run.log(name) for name in plan.nodes if name not in plan.refused}
    return SoakOutcome(plan, logs, run.states, run_dir, far_below(logs, plan, acceptance.cluster.profile))


def far_below(logs: dict[str, soaking.SoakLog], plan: soaking.SoakPlan, profile) -> dict[str, list[tuple[str, str]]]:
    """Each node's load figures (median of its rounds) that sit far below its peers', by the
    results' outlier rule (reports.results.outliers) and the profile's outliers: settings."""
    entries = []
    for name, log in logs.items():
        rows = []
        for part, (_, unit, metric) in PARTS.items():
            until = peer_lost_at(name, logs, plan) if part in PEER_PARTS else None
            figure = soaking.drift(log.parts, part, until=until)
            if figure is not None:
                rows.append({"name": metric, "value": figure.median, "unit": unit})
        entries.append({"check": "soak_load", "node": name, "metrics": rows})
    part_of = {metric: part for part, (_, _, metric) in PARTS.items()}
    found: dict[str, list[tuple[str, str]]] = {}
    for outlier in outliers(entries, profile.outliers):
        found.setdefault(outlier["node"], []).append((part_of[outlier["metric"]], (
            f"{outlier['metric']} {outlier['value']:.3g} {outlier['unit']} is {-outlier['deviation']:.0%} below "
            f"its peers' median {outlier['median']:.3g} ({outlier['rule']})")))
    return found


def peer_lost_at(node: str, logs: dict[str, soaking.SoakLog], plan: soaking.SoakPlan) -> Optional[float]:
    """When the node's iperf3 peer dropped out (its last sample), so rounds after it are not held
    against this node; None while the peer ran to the end."""
    peer = plan.nodes[node].peer if node in plan.nodes else None
    if peer in plan.refused:
        return plan.started  # no soak there: no server to send to
    log = logs.get(peer) if peer else None
    if log is None or soaking.dropped_out(log, plan.end, plan.interval_s, plan.stopped) is None:
        return None
    return max(log.times, default=plan.started)


def log_of(soak: SoakOutcome, node: str) -> soaking.SoakLog:
    """The node's samples; a node the soak could not start on fails with why."""
    if node in soak.plan.refused:
        raise ExpectationFailure(f"{node}: no soak: {soak.plan.refused[node]}")
    return soak.logs[node]


@pytest.mark.hardware
def test_soak_heartbeat(soak, node, record, metrics: Metrics):
    """The node's supervisor reported throughout: no heartbeat gap, samples to the end, every
    line of them whole."""
    log = log_of(soak, node)
    record.raw([str(soak.run_dir.joinpath("raw", soaking.RAW_STEP, f"{node}.jsonl").relative_to(soak.run_dir))])
    times = log.times
    covered = (max(times) - min(times)) if len(times) > 1 else 0.0
    figures: dict[str, tuple[Optional[float], str]] = {
        "soak_samples": (len(times), "samples"),
        "soak_covered": (round(100 * covered / soak.plan.duration_s, 1) if soak.plan.duration_s else None, "%")}
    dropped = soak.dropped(node)
    if dropped and log.end is None:
        judge_despite(metrics, figures, NodeUnreachable(f"{node} dropped out of the soak: {dropped}"))
    if dropped:  # it answered to the end, and its supervisor said it stopped early
        judge_despite(metrics, figures, SanityFailure(f"{node} did not soak to the end: {dropped}"))
    allowed = soaking.gap_allowed(soak.plan.interval_s)
    gaps = soaking.heartbeat_gaps(log.times, allowed)
    record.note(f"{len(times)} samples every {soak.plan.interval_s:g} s from {soaking.clock_utc(min(times))} "
                f"to {soaking.clock_utc(max(times))}; ended: {(log.end or {}).get('reason', 'no end line')}"
                if times else "no samples")
    if gaps:
        shown = ", ".join(f"{soaking.clock_utc(a)}..{soaking.clock_utc(b)} ({b - a:.0f} s)" for a, b in gaps[:5])
        judge_despite(metrics, figures, SanityFailure(f"{node}: {len(gaps)} heartbeat gap(s) over {allowed:.0f} s: "
                                                      f"{shown} (the node hung, rebooted or its supervisor stalled)"))
    unread = soaking.unreadable(log)
    if unread:
        judge_despite(metrics, figures, SanityFailure(f"{node}: {unread}"))
    metrics.judge(**figures)


@pytest.mark.hardware
def test_soak_load(soak, node, record, metrics: Metrics, acceptance):
    """The node's load held: stress-ng, iperf3 to its peer and the GPU burn, each round that ran,
    first against last quarter, against its peers."""
    log = log_of(soak, node)
    versions = (log.start or {}).get("tools") or {}
    for part in dict.fromkeys(p.part for p in log.parts):
        if PART_TOOLS.get(part) in versions:
            acceptance.record_tool(node, PART_TOOLS[part], versions[PART_TOOLS[part]])
    temperature = soaking.peak(log, "cpu_temp_c")
    events = [f"{len(log.events)} supervisor event(s), the last: {log.events[-1].get('event')}"] if log.events else []
    burned = bool((log.start or {}).get("gpus")) and bool(soak.plan.mix.get("gpu", 1))
    due = {"cpu": bool(soak.plan.mix.get("cpu", 1)), "gpu": burned,
           "net": soak.plan.nodes[node].peer not in (None, *soak.plan.refused)}
    judge_parts(soak, node, LOAD_PARTS, record, metrics, notes_after=events,  # the supervisor's own troubles
                extra={"soak_cpu_temp_max": (temperature, "°C")} if temperature is not None else {},
                required=tuple(part for part, runs in due.items() if runs))


@pytest.mark.network
def test_soak_ib(soak, node, record, metrics: Metrics):
    """ib_write_bw on every rail to the same rail of its peer held (the slowest rail each round)."""
    log = log_of(soak, node)
    if not soak.plan.mix.get("ib", 1):
        pytest.skip("the soak's mix leaves ib_write_bw out (ib=0)")
    if log.start is not None and not log.start.get("rails"):
        pytest.skip(f"no active InfiniBand port on {node}")
    if soak.plan.nodes[node].peer is None:
        pytest.skip("a soak of one node: no peer to send to")
    judge_parts(soak, node, ("ib",), record, metrics, required=("ib",))


@pytest.mark.storage
def test_soak_io(soak, node, record, metrics: Metrics):
    """fio on the node's folder of the shared scratch path held, first against last quarter."""
    log_of(soak, node)  # a node without a soak fails here, with why
    if not soak.plan.mix.get("io", 1):
        pytest.skip("the soak's mix leaves fio out (io=0)")
    if soak.plan.nodes[node].io_dir is None:
        pytest.skip("no shared scratch path declared: the soak's storage load runs only there")
    judge_parts(soak, node, ("io",), record, metrics, required=("io",))


def judge_despite(metrics: Metrics, figures: dict[str, tuple[Optional[float], str]], failure: CheckFailure,
                  more: Sequence[str] = ()) -> NoReturn:
    """Fail with `failure`, found beside figures the check measured: the figures are recorded and
    judged first, so the ledger keeps them (a soak's GPU figure when its stress-ng rounds failed),
    and their misses and `more` follow the failure's own message. No figure, nothing is judged."""
    problems = []
    if figures:
        try:
            metrics.judge(**figures)
        except PerformanceFailure as miss:
            problems.append(str(miss))
    problems += more
    if problems:
        raise type(failure)("; ".join([str(failure), *problems]), failure.log, failure.action) from None
    raise failure


def judge_parts(soak: SoakOutcome, node: str, parts: tuple[str, ...], record, metrics: Metrics,
                extra: Optional[dict] = None, notes_after: Optional[list[str]] = None,
                required: tuple[str, ...] = ()) -> None:
    """These load parts' rounds on the node: rounds that failed, first against last quarter,
    against its peers (the outlier rule), against the profile's soak_* bands. extra: more figures
    to judge with them; notes_after: more words for the note; required: parts the node's mix
    runs, whose rounds must go on for as long as the node's soak (and its peer's) did."""
    log = log_of(soak, node)
    lost_peer = peer_lost_at(node, soak.logs, soak.plan)
    figures: dict[str, tuple[Optional[float], str]] = {}
    failed, notes = [], []
    for part in parts:
        what, unit, metric = PARTS[part]
        until = lost_peer if part in PEER_PARTS else None
        if part in required:
            unrun = soaking.no_round(soak.plan, log, part) or soaking.rounds_stop_early(soak.plan, log, part, until)
            failed += [f"{what}: {unrun}"] if unrun else []
        figure = soaking.drift(log.parts, part, until=until)
        errors = [p for p in log.parts if p.part == part and p.value is None and (until is None or p.t1 <= until)]
        if errors:
            failed.append(f"{what}: {len(errors)} round(s) failed, last: {errors[-1].error}")
        if figure is None:
            alone = soaking.lone_round(log.parts, part, until=until)
            if alone is not None and alone.value is not None:
                notes.append(f"{what} {alone.value:.3g} {unit} in its one round: no drift to judge")
            continue
        figures[metric] = (round(figure.median, 3), unit)
        figures[metric.rsplit("_", 1)[0] + "_retained"] = (round(figure.retained_pct, 1), "%")
        notes.append(f"{what} {figure.first:.3g} -> {figure.last:.3g} {unit} over {figure.rounds} rounds")
    peered = " and ".join(PART_TOOLS[part] for part in parts if part in PEER_PARTS)
    peer = soak.plan.nodes[node].peer
    if peered and peer in soak.plan.refused:
        notes.append(f"{peered} not judged: its peer {peer} runs no soak")
    elif peered and lost_peer is not None:
        notes.append(f"{peered} rounds after {soaking.clock_utc(lost_peer)} not judged: "
                     f"its peer {peer} dropped out then")
    figures.update(extra or {})
    record.note("; ".join(notes + (notes_after or [])) or "no load part gave two figures")
    dropped = soak.dropped(node)
    if dropped and not figures:
        raise NodeUnreachable(f"{node} dropped out of the soak before a load round gave a figure: {dropped}")
    below = [why for part, why in soak.far_below.get(node, []) if part in parts]
    if failed:  # what the rounds that ran measured is judged and kept all the same
        judge_despite(metrics, figures, SanityFailure(f"{node}: " + "; ".join(failed)), below)
    if not figures:
        raise SanityFailure(f"{node}: no load part of the soak gave the two rounds' figures its drift is judged on")
    try:
        metrics.judge(**figures)
    except PerformanceFailure as miss:
        raise PerformanceFailure(f"{miss}; {'; '.join(below)}" if below else str(miss)) from None
    if below:
        raise PerformanceFailure(f"{node}: " + "; ".join(below))


@pytest.mark.hardware
def test_soak_gpu(soak, node, record, metrics: Metrics):
    """No GPU lost, no Xid, no new ECC error or row remap, no thermal or power slowdown, and every
    burn result bit for bit the node's reference (no silent data corruption) on any GPU."""
    log = log_of(soak, node)
    start = log.start or {}
    if not start.get("gpus"):
        pytest.skip(f"no GPU telemetry on {node}: {start.get('nvml') or 'NVML found no GPU'}")
    problems = soaking.gpu_problems(log)
    record.note(f"{start['gpus']} GPU(s), {len(log.times)} samples, {len(log.xids)} Xid event(s)")
    figures: dict[str, tuple[Optional[float], str]] = {
        "soak_gpu_temp_max": (soaking.peak(log, "gpus.temp_c"), "°C"),
        "soak_gpu_power_max": (soaking.peak(log, "gpus.power_w"), "W")}
    if problems:
        judge_despite(metrics, figures, SanityFailure(f"{node}: " + "; ".join(problems),
                                                      action="drain the node and replace the GPU it names (RMA)"))
    metrics.judge(**figures)


@pytest.mark.hardware
def test_soak_kernel_log(soak, on_node, profile, node, record):
    """No critical Xid/SXid, PCIe AER or link event in the kernel log during the soak: what NVML's
    critical Xid events miss (the other Xids, a GPU NVML could not watch, PCIe's own errors)."""
    log_of(soak, node)  # a node the soak did not start on fails with why
    started = datetime.fromtimestamp(soak.plan.started, timezone.utc)
    log = kernel_log_of(on_node, KERNEL_STEP, started, profile)
    during = log.during_run()
    record.note(f"{log.source}: during the soak: " + ("; ".join(describe_kernel_events(during)[:5]) or "no event"))
    fail_on_critical_kernel_events((("during the soak", during),))


@pytest.mark.hardware
def test_soak_links(soak, node, record):
    """No InfiniBand error counter rose during the soak, or read its ceiling (where it stops
    counting, so no rise would show)."""
    log = log_of(soak, node)
    if not ((log.start or {}).get("baseline") or {}).get("ib"):
        pytest.skip(f"no /sys/class/infiniband on {node}")
    problems = soaking.link_problems(log)
    if problems:
        raise SanityFailure(f"{node}: " + "; ".join(problems),
                            action="reseat or replace the cable of the port it names")
    record.note("no link error counter rose")


@pytest.mark.hardware
@pytest.mark.cluster
def test_soak_trends(soak, acceptance, record):
    """Temperature, power and throughput against time: a line per node, worst first (above
    TREND_NODES nodes, the WORST_SHOWN worst and the median of all); where the inventory places
    the nodes in two racks or more (else under two leaf switches or more), a median line per rack
    (leaf) as well, worst first the same way."""
    started = soak.plan.started
    level, places = placement(acceptance.cluster.node(node) for node in soak.logs)
    drawn = 0
    for kind, key, label, unit, high_is_bad in TRENDS:
        lines = {node: soaking.trend(log, key, started) for node, log in soak.logs.items()}
        grouped = soaking.group_lines(lines, places)
        for title, chosen, of in ((f"soak {kind}: {label}", lines, "nodes"),
                                  (f"soak {kind} by {level}: {label}", grouped, f"{level}s")):
            shown = soaking.worst_first(chosen, high_is_bad=high_is_bad, shown_max=TREND_NODES,
                                        worst_shown=WORST_SHOWN, of=of)
            if shown:
                record.series(title, x=("minutes into the soak", "min"), y=(label, unit), lines=shown)
                drawn += 1
    record.note(f"{drawn} trend(s) over {soak.plan.duration_s / 60:.1f} min on {len(soak.logs)} node(s)")

