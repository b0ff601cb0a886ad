"""Network: InfiniBand port health on every node; perftest (rail-aligned) and iperf3 between node
pairs in rounds; and blame.

Per-node checks cannot see a bad cable: a link only shows up in a test between its two ends.
Pairs run in rounds of disjoint pairs (runners.pairs); `-m quick` runs a ring (every node in two
pairs), `-m full` every pair. perftest tests one rail at a time per pair test (HCA i of one node
to HCA i of the other, all rails of a pair at once). The cluster-wide summary compares every
pair's figure with the median of all pairs, re-pairs failing nodes with passing ones in a second
pass (one implementation, runners.pairs.PairVerdicts and blame(), for iperf3 and every perftest
rail), and names the suspect nodes and links with the evidence.

Each tool is one PairCampaign (which pairs and rails, rounds, ports, raw outputs, both passes)
with a small runners.pairs.PairTool (iperf3.Iperf3Tool; perftest.PerftestTool, with rails) for
what differs: how one pair is measured and what its run says. Every pair test records its
state for the heatmaps (ok, low, failed), judged once by runners.pairs.pair_state against its
campaign's first-pass median: the rule attribution applies, so the two never disagree.
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable, Optional, TypeVar

import pytest

from handover.failures import CommandTimedOut, ExpectationFailure, NodeUnreachable, SanityFailure, excerpt
from handover.plugin import acceptance_session
from runners import ibstat, iperf3, pairs, perftest
from runners.pairs import Pair, PairRun, PairTool, Rail, RailRun, pair_id, pair_rail_id
from runners.parsing import ParseError
from suites.checks import odd_ones_out, parsed

pytestmark = [pytest.mark.network]

BASE_PORTS = {"iperf3": 5301, "ib_write_bw": 18515, "ib_write_lat": 19515}  # pair i of a round: base + i
SECOND_PASS_BASE_PORTS = {"iperf3": 5401, "ib_write_bw": 23515, "ib_write_lat": 24515}
RAIL_PORT_STRIDE = 100  # rail r of pair i in a round listens on base + r * stride + i
COUNTERS_STEP = "ib_counters"
NEEDS_TWO = "needs at least two nodes"


# ------------------------------------------------------------------------------ port health


def devices_of(on_node, profile) -> ibstat.IbDevices:
    """This node's HCAs; no ibstat or no HCA is a skip, unless the profile expects HCAs."""
    result = on_node(ibstat.STEP, ibstat.probe)
    absent = None
    if ibstat.tool_missing(result):
        absent = "ibstat is not installed (Debian/Ubuntu: infiniband-diags)"
    elif ibstat.no_device(result):
        absent = "no InfiniBand/RoCE device: ibstat lists no HCA"
    if absent:
        expected = profile.expect.ib_hcas
        if expected:
            raise ExpectationFailure(f"{result.node}: {absent}, but profile {profile.name} "
                                     f"expects {expected} HCA(s)")
        pytest.skip(absent)
    return parsed(ibstat.parse_ibstat, result)


@pytest.mark.quick
def test_ib_ports(on_node, profile, record, acceptance, node):
    """HCA count and type, every port Active/LinkUp at the expected rate and link layer."""
    devices = devices_of(on_node, profile)
    acceptance.record_tool(node, "ibstat", "infiniband-diags")
    ports = [(hca, port) for hca in devices.hcas for port in hca.ports]
    record.note(f"{len(devices.hcas)} HCA(s): " + ", ".join(
        f"{hca.name}/{port.port} {port.state} {port.rate:g} Gb/s" if port.rate is not None
        else f"{hca.name}/{port.port} {port.state}" for hca, port in ports))
    problems = ibstat.port_problems(devices, profile.expect)
    if problems:
        raise ExpectationFailure("; ".join(problems))


@pytest.mark.quick
@pytest.mark.cluster
def test_ib_firmware_uniformity(cluster_run, record):
    """Same HCA firmware on every node that has HCAs; odd ones out are named."""
    firmware = {}
    for node, result in cluster_run.gather(ibstat.STEP, ibstat.probe).items():
        if result.ok and result.stdout.strip():
            try:
                devices = ibstat.parse_ibstat(result.stdout)
            except ParseError:
                continue
            firmware.update({f"{node}/{hca.name}": hca.firmware for hca in devices.hcas})
    if not firmware:
        pytest.skip("no node listed an HCA")
    record.note(f"{len(firmware)} HCA(s) compared")
    difference = odd_ones_out("HCA firmware", firmware)
    if difference:
        raise ExpectationFailure(difference)


@pytest.mark.quick
def test_ib_counters(on_node, profile, record):
    """Symbol errors, link downed and port receive errors of every port, at or below the limits."""
    found = parsed(ibstat.parse_ib_counters, on_node(COUNTERS_STEP, ibstat.probe_counters))
    if not found.present or not found.ports:
        absent = (f"no InfiniBand/RoCE device: {found.root} "
                  + ("lists no port" if found.present else "does not exist"))
        expected = profile.expect.ib_hcas
        if expected:
            raise ExpectationFailure(f"{absent}, but profile {profile.name} expects {expected} HCA(s)")
        pytest.skip(absent)
    record.note(f"{len(found.ports)} port(s): " + ", ".join(
        f"{p.hca}/{p.port} " + " ".join(f"{name}={p.counters.get(name)}" for name in ibstat.ERROR_COUNTERS)
        for p in found.ports))
    problems = ibstat.counter_problems(found, profile.expect)
    if problems:
        raise ExpectationFailure("; ".join(problems))


# ------------------------------------------------------------------------------ pairs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per pair, id 'a-b': ring pairs are quick and full, the other pairs full only."""
    if "pair" not in metafunc.fixturenames:
        return
    acceptance = acceptance_session(metafunc.config)
    nodes = [node.name for node in acceptance.cluster_run.nodes]
    if len(nodes) < 2:
        names, single = ("pair, rail", (None, 0)) if "rail" in metafunc.fixturenames else ("pair", (None,))
        metafunc.parametrize(names, [pytest.param(*single, id="single-node",
                                                  marks=[pytest.mark.quick, pytest.mark.full])])
        return
    ring = set(pairs.ring_pairs(nodes))

    def marks(pair: Pair) -> list:
        return [pytest.mark.quick, pytest.mark.full] if pair in ring else [pytest.mark.full]

    if "rail" in metafunc.fixturenames:
        rails = range(acceptance.cluster.profile.expect.ib_hcas or 1)
        metafunc.parametrize("pair, rail", [
            pytest.param(pair, rail, id=pair_rail_id(pair, rail), marks=marks(pair))
            for pair in itertools.combinations(nodes, 2) for rail in rails])
        return
    metafunc.parametrize("pair", [pytest.param(pair, id=pair_id(pair), marks=marks(pair))
                                  for pair in itertools.combinations(nodes, 2)])


class PairCampaign:
    """One tool's every selected pair test (a pair, or a rail of it), measured once in rounds
    when the first of them asks; the second pass; the outcomes, medians and states by rail.

    Pair i of a round listens on the tool's base port + i, rail r of it RAIL_PORT_STRIDE * r
    above; every rail of a pair runs at once. Raw outputs go under <tool>/<a-b[-railR]>, the
    second pass's under <tool>_second_pass/..., on ports of its own.
    """

    def __init__(self, session: pytest.Session, cluster_run, acceptance, tool: PairTool,
                 low_fraction: float):
        self._session = session
        self._cluster_run = cluster_run
        self._acceptance = acceptance
        self.tool = tool
        self.low_fraction = low_fraction  # the profile's pair_low_fraction: low vs the median
        self._lock = threading.Lock()
        self.runs: dict[tuple[Pair, Rail], RailRun] = {}
        self.raw: dict[tuple[Pair, Rail], list[str]] = {}
        self.second_raw: list[str] = []  # the second pass's raw outputs, evidence of the attribution
        self._outcomes: dict[tuple[Pair, Rail], Optional[pairs.PairOutcome]] = {}
        self._medians: dict[Rail, Optional[float]] = {}

    def run(self, pair: Pair, rail: Rail = None) -> RailRun:
        with self._lock:
            if (pair, rail) not in self.runs:
                done = self._run_all(self._selected() or {pair: [rail]}, second=False)
                self.runs.update(done)
                self._outcomes.update((key, self.tool.outcome(run)) for key, run in done.items())
                self._medians = {kind: pairs.median_of({p: o.figure for p, o in first.items()})
                                 for kind, first in self.first_pass().items()}
            return self.runs[(pair, rail)]

    def _selected(self) -> dict[Pair, list[Rail]]:
        chosen: dict[Pair, list[Rail]] = {}
        for item in self._session.items:
            callspec = getattr(item, "callspec", None)
            if item.originalname == f"test_{self.tool.name}" and callspec and callspec.params.get("pair"):
                chosen.setdefault(callspec.params["pair"], []).append(callspec.params.get("rail"))
        return chosen

    def _run_all(self, wanted: dict[Pair, list[Rail]], *, second: bool) -> dict[tuple[Pair, Rail], RailRun]:
        nodes = [node.name for node in self._cluster_run.nodes]
        measure = self.tool.measurer(self._cluster_run)
        step = f"{self.tool.name}_second_pass" if second else self.tool.name
        base_port = (SECOND_PASS_BASE_PORTS if second else BASE_PORTS)[self.tool.name]

        def run_pair(pair: Pair, port: int) -> dict[Rail, RailRun]:
            done: dict[Rail, RailRun] = {}

            def run_rail(rail: Rail) -> None:
                done[rail] = measure(pair, rail, port + (rail or 0) * RAIL_PORT_STRIDE)

            threads = [threading.Thread(target=run_rail, args=(rail,), daemon=True,
                                        name=f"{self.tool.name}-{pair_rail_id(pair, rail)}")
                       for rail in wanted[pair]]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return {rail: done[rail] for rail in wanted[pair]}

        runs: dict[tuple[Pair, Rail], RailRun] = {}
        for pair, rails in pairs.run_rounds(pairs.schedule(nodes, wanted), base_port, run_pair).items():
            for rail, run in rails.items():
                runs[(pair, rail)] = run
                saved = []
                if isinstance(run, PairRun):
                    for result in (run.client_result, run.server_result):
                        if result is not None:
                            saved += self._acceptance.save_raw(
                                f"{step}/{pair_rail_id(pair, rail)}", result.node,
                                result.stdout, result.stderr)
                if second:
                    self.second_raw += saved
                else:
                    self.raw[(pair, rail)] = saved
        return runs

    def first_pass(self) -> dict[Rail, dict[Pair, pairs.PairOutcome]]:
        """Every measured pair test's outcome by rail (in rail order), those that say nothing
        about a link left out."""
        return dict(sorted(pairs.by_kind(self._outcomes).items(), key=lambda entry: entry[0] or 0))

    def state(self, pair: Pair, rail: Rail = None) -> tuple[str, Optional[float]]:
        """(state, median) of a measured pair test for the heatmaps: pairs.pair_state against
        the first pass's median of its rail, as attribution judges it. A rail attribution leaves
        out (no HCA for it, no RDMA device) is failed: its test fails whenever it does not skip."""
        median = self._medians.get(rail)
        outcome = self._outcomes[(pair, rail)] or pairs.PairOutcome(False)
        return pairs.pair_state(outcome, median, self.low_fraction, self.tool.higher_is_better), median

    def second_pass(self, wanted: dict[Rail, list[Pair]]) -> dict[Rail, dict[Pair, pairs.PairOutcome]]:
        """Every rail's second-pass pairs at once (a pair's rails together), on their own ports."""
        with self._lock:
            done = self._run_all(pairs.kinds_by_pair(wanted), second=True)
        return pairs.by_kind({key: self.tool.outcome(run) for key, run in done.items()})


_CAMPAIGNS = pytest.StashKey[dict[str, PairCampaign]]()


def _campaign(request, cluster_run, acceptance, profile, tool: PairTool) -> PairCampaign:
    """The session's one campaign of this tool."""
    campaigns = request.session.stash.setdefault(_CAMPAIGNS, {})
    if tool.name not in campaigns:
        low_fraction = (pairs.LOW_FRACTION if profile.expect.pair_low_fraction is None
                        else profile.expect.pair_low_fraction)
        campaigns[tool.name] = PairCampaign(request.session, cluster_run, acceptance, tool, low_fraction)
    return campaigns[tool.name]


@pytest.fixture(scope="session")
def pairwise_iperf3(request, cluster_run, acceptance, profile) -> PairCampaign:
    return _campaign(request, cluster_run, acceptance, profile, iperf3.Iperf3Tool(profile))


def test_iperf3(pair: Optional[Pair], pairwise_iperf3, metrics, record, acceptance):
    """TCP throughput from one node to the other (client b, server a), sanity before figures."""
    if pair is None:
        pytest.skip(NEEDS_TWO)
    run = pairwise_iperf3.run(pair)
    record.raw(pairwise_iperf3.raw.get((pair, None), []))
    record.pair_state(*pairwise_iperf3.state(pair))
    result = run.client_result
    report, why = iperf3.judge(run)
    if why:
        if result.failure in ("unreachable", "auth", "host-key"):
            raise NodeUnreachable(why)
        if result.timed_out:
            raise CommandTimedOut(why, excerpt(result.stdout + result.stderr))
        raise SanityFailure(why, excerpt(result.stdout or result.stderr))
    for node in pair:
        acceptance.record_tool(node, "iperf3", report.version or "unknown")
    record.note(f"{run.client} -> {run.server}: {report.gbps:.2f} Gb/s, "
                f"{report.retransmits} retransmits")
    metrics.judge(iperf3_bandwidth=(round(report.gbps, 3), "Gb/s"),
                  iperf3_retransmits=(report.retransmits, "count"))


# ------------------------------------------------------------------------------ perftest pairs


@pytest.fixture(scope="session")
def pairwise_ib_write_bw(request, cluster_run, acceptance, profile) -> PairCampaign:
    return _campaign(request, cluster_run, acceptance, profile, perftest.PerftestTool(profile, "ib_write_bw"))


@pytest.fixture(scope="session")
def pairwise_ib_write_lat(request, cluster_run, acceptance, profile) -> PairCampaign:
    return _campaign(request, cluster_run, acceptance, profile, perftest.PerftestTool(profile, "ib_write_lat"))


def measured_rail(pairwise: PairCampaign, pair: Optional[Pair], rail: int, profile,
                  record) -> perftest.PerftestReport:
    """The rail's perftest report, sanity first: no RDMA device skips (cpu-only) or fails.
    Every rail that does not skip records its pair state first."""
    if pair is None:
        pytest.skip(NEEDS_TWO)
    run = pairwise.run(pair, rail)
    record.raw(pairwise.raw.get((pair, rail), []))
    if isinstance(run, str):
        record.pair_state(*pairwise.state(pair, rail))
        raise ExpectationFailure(run)
    results = [r for r in (run.client_result, run.server_result) if r is not None]
    absent = next((r for r in results if perftest.no_rdma_device(r)), None)
    if absent is not None:
        said = next(m for m in perftest.NO_DEVICE_MARKERS if m in absent.stdout + absent.stderr)
        reason = f"no RDMA device: {pairwise.tool.name} on {absent.node} says {said!r}"
        expected = profile.expect.ib_hcas
        if expected:
            record.pair_state(*pairwise.state(pair, rail))
            raise ExpectationFailure(f"{reason}, but profile {profile.name} expects {expected} HCA(s)",
                                     excerpt(absent.stderr or absent.stdout))
        pytest.skip(reason)
    record.pair_state(*pairwise.state(pair, rail))
    report, why = perftest.judge(run)
    if why:
        result = run.client_result
        if result.failure in ("unreachable", "auth", "host-key"):
            raise NodeUnreachable(why)
        if result.timed_out:
            raise CommandTimedOut(why, excerpt(result.stdout + result.stderr))
        raise SanityFailure(why, excerpt(result.stdout + result.stderr))
    return report


def test_ib_write_bw(pair: Optional[Pair], rail: int, pairwise_ib_write_bw, profile, metrics,
                     record):
    """RDMA write bandwidth of one rail between two nodes, large messages, in Gb/s per port."""
    report = measured_rail(pairwise_ib_write_bw, pair, rail, profile, record)
    largest = max(report.rows, key=lambda row: row["bytes"])
    mode = pairwise_ib_write_bw.tool.mode
    record.note(f"rail {rail}: {largest['bw_avg_gbps']:.2f} Gb/s at {largest['bytes']} B"
                + (" bidirectional" if mode.bidirectional else "") + (" GPUDirect" if mode.use_cuda else ""))
    metrics.judge(**{name: (value, "Gb/s")
                     for name, value in pairwise_ib_write_bw.tool.figures(report).items()})


def test_ib_write_lat(pair: Optional[Pair], rail: int, pairwise_ib_write_lat, profile, metrics,
                      record):
    """RDMA write latency of one rail between two nodes: typical (median) and 99th percentile."""
    report = measured_rail(pairwise_ib_write_lat, pair, rail, profile, record)
    figures = pairwise_ib_write_lat.tool.figures(report)
    record.note(f"rail {rail}: typical {figures['ib_write_lat_typical']} us, "
                f"p99 {figures['ib_write_lat_p99']} us at {report.rows[0]['bytes']} B")
    metrics.judge(**{name: (value, "us") for name, value in figures.items()})


Kind = TypeVar("Kind")


def blame(kinds: dict[Kind, tuple[str, str, pairs.PairVerdicts]], nodes: list[str],
          second_pass: Callable[[dict[Kind, list[Pair]]], dict[Kind, dict[Pair, pairs.PairOutcome]]]
          ) -> tuple[list[str], list[str]]:
    """(suspects, low pairs) in words for kinds of pair test (iperf3; a perftest tool's rails).

    The one second pass for every tool: each kind names the pairs to re-measure (failing nodes
    with good ones), `second_pass` measures them all at once, and each kind blames on both passes.
    kinds: key -> (label, unit, verdicts).
    """
    wanted = {key: verdicts.second_pass_pairs(nodes) for key, (_, _, verdicts) in kinds.items()}
    wanted = {key: again for key, again in wanted.items() if again}
    if wanted:
        for key, outcomes in second_pass(wanted).items():
            kinds[key][2].second = outcomes
    suspects, lows = [], []
    for label, unit, verdicts in kinds.values():
        found = verdicts.attribution()
        if not found.clean:
            suspects.append(f"{label}: {found.summary()}")
        lows += [f"{label} {pair_id(pair)}: {why} {unit}" for pair, why in verdicts.low.items()]
    return suspects, lows


@pytest.mark.quick
@pytest.mark.full
@pytest.mark.cluster
def test_network_attribution(pairwise_iperf3, pairwise_ib_write_bw, pairwise_ib_write_lat, cluster_run,
                             record):
    """Which nodes or links the failed or low pairs point at, after a second pass that re-pairs
    every failing node with nodes that passed (iperf3, and each rail of ib_write_bw/ib_write_lat)."""
    suspects, lows, counts = [], [], []
    nodes = [node.name for node in cluster_run.nodes]
    campaigns = (pairwise_iperf3, pairwise_ib_write_bw, pairwise_ib_write_lat)
    for campaign in campaigns:
        by_rail = campaign.first_pass().items()
        if not by_rail:
            continue
        tool = campaign.tool
        kinds = {rail: (tool.label(rail), tool.unit,
                        pairs.PairVerdicts(first, campaign.low_fraction, tool.higher_is_better))
                 for rail, first in by_rail}
        found = blame(kinds, nodes, campaign.second_pass)
        suspects += found[0]
        lows += found[1]
        counts += [tool.tally(rail, first) for rail, first in by_rail]
    if not counts:
        pytest.skip(f"no pair measured ({NEEDS_TWO}, no RDMA device, or none selected)")
    record.raw([path for campaign in campaigns for path in campaign.second_raw])
    record.note("; ".join(counts) + (f"; far from the median: {'; '.join(lows)}" if lows else ""))
    if suspects:
        raise ExpectationFailure("suspects: " + "; ".join(suspects)
                                 + (f" (far from the median: {'; '.join(lows)})" if lows else ""))
