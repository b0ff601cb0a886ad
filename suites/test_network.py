"""Network: InfiniBand port health on every node; iperf3 and perftest (rail-aligned) between
node pairs in rounds, judged per node; and blame.

Per-node checks cannot see a bad cable: a link only shows up in a test between its two ends.
So each tool measures pairs of nodes in rounds of disjoint pairs (runners.pairs) once per run,
and every node's check (test_iperf3[gpu017], test_ib_write_bw[gpu017-rail3]) judges that node by
its pairs: its best pair against the band, and what attribution holds against it after a
second pass that re-paired failing nodes with good ones. The pairs (peer, state, figure) are
the check's evidence in the results and the report's heatmaps, so the checks stay one per node
(and rail) however many pairs a schedule has.

Schedules, by the depth -m selects (suites.checks.depth_of_selection): quick is a ring in
placement order (every node in two pairs, neighbours mostly on one leaf); full is every pair
in N-1 rounds up to the profile's pair_all_max_nodes, above it a bounded sample of
pair_sample_partners per node across the fleet.
Each tool is one PairCampaign (pairs, rails, rounds, ports, raw outputs, both passes) with a
small runners.pairs.PairTool (iperf3.Iperf3Tool; perftest.PerftestTool) for what differs.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace
from typing import Callable, Optional

import pytest

from handover.failures import (
    CommandTimedOut,
    ExpectationFailure,
    NodeUnreachable,
    PerformanceFailure,
    SanityFailure,
    excerpt,
    transport_failure,
)
from handover.plugin import acceptance_session
from runners import ibstat, iperf3, pairs, perftest
from runners.pairs import Pair, PairRun, PairTool, Rail, RailRun, pair_id, pair_rail_id
from runners.parsing import ParseError
from runners.transport import Result
from suites.checks import depth_of_selection, odd_ones_out, parsed

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
    # ibpanic/ibwarn go to stderr, and ibstat (rdma-core 703b52c on) exits 0 leaving out the CA it
    # could not read: its error lines are read with the ports, so such a node fails.
    return parsed(ibstat.parse_ibstat, replace(result, stdout=f"{result.stdout}\n{result.stderr}"))


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
        raise ExpectationFailure("; ".join(problems), action=ibstat.PORT_ACTION)


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
        raise ExpectationFailure("; ".join(problems), action=ibstat.COUNTERS_ACTION)


# ------------------------------------------------------------------------------ pairs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """perftest checks: one per node and rail, id 'gpu017-rail3' (the node comes from conftest)."""
    if "rail" in metafunc.fixturenames:
        rails = list(range(acceptance_session(metafunc.config).cluster.profile.expect.ib_hcas or 1))
        metafunc.parametrize("rail", rails, ids=[f"rail{rail}" for rail in rails])


@dataclass(frozen=True)
class NodeLinks:
    """One node's part of a campaign for one rail: its pairs of both passes with their states,
    what attribution holds against it, their runs and raw outputs."""

    links: list[pairs.Link]
    finding: str
    runs: list[RailRun]
    raw: list[str]
    median: Optional[float]
    action: str = ""  # what to do about the links attribution holds against the node
    unreached: bool = False  # the node itself was not reached, or was lost, during its pairs


class PairCampaign:
    """One tool's pairs, measured once when the first of its checks asks: the schedule of the
    run's depth among the nodes whose checks are selected, every selected rail of a pair at
    once, then the second pass that re-pairs failing nodes with good ones, then attribution.

    Pair i of a round listens on the tool's base port + i, rail r of it RAIL_PORT_STRIDE * r
    above. Raw outputs go under <tool>_<a-b[-railR]>, the second pass's under
    <tool>_second_pass_..., on ports of its own.
    """

    def __init__(self, session: pytest.Session, cluster_run, acceptance, tool: PairTool, profile):
        self._session = session
        self._cluster_run = cluster_run
        self._acceptance = acceptance
        self.tool = tool
        expect = profile.expect
        self.low_fraction = pairs.LOW_FRACTION if expect.pair_low_fraction is None else expect.pair_low_fraction
        self.all_pairs_max = expect.pair_all_max_nodes or pairs.ALL_PAIRS_MAX_NODES
        self.partners = expect.pair_sample_partners or pairs.SAMPLE_PARTNERS
        self.depth = depth_of_selection(session.config.option.markexpr, "network")
        self._lock = threading.Lock()
        self._measured = False
        self.runs: dict[tuple[Pair, Rail], RailRun] = {}
        self.second_runs: dict[tuple[Pair, Rail], RailRun] = {}
        self.raw: dict[tuple[Pair, Rail], list[str]] = {}  # both passes
        self.second_raw: list[str] = []  # the second pass's raw outputs, evidence of the attribution
        self.verdicts: dict[Rail, pairs.PairVerdicts] = {}
        self.attributions: dict[Rail, pairs.Attribution] = {}
        self._links: dict[Rail, dict[str, list[pairs.Link]]] = {}
        self._findings: dict[Rail, dict[str, str]] = {}
        self._medians: dict[Rail, Optional[float]] = {}  # of each rail's first pass
        self._pairs_of: dict[tuple[str, Rail], list[Pair]] = {}  # (node, rail) -> its pairs
        self._unreached: dict[str, str] = {}  # node -> why, not reached during its pairs

    @functools.cached_property
    def nodes(self) -> list[str]:
        """The nodes under test in placement order (rack, leaf), which the ring follows; taken
        when the first check asks, once nodes another run holds are left out."""
        return [node.name for node in pairs.placement_order(self._cluster_run.nodes)]

    def node(self, node: str, rail: Rail = None) -> NodeLinks:
        """This node's links on a rail, measuring the whole campaign first if no check has yet."""
        self.measure()
        mine = self._pairs_of.get((node, rail), [])  # first pass, then second
        return NodeLinks(links=self._links.get(rail, {}).get(node, []),
                         finding=self._findings.get(rail, {}).get(node, ""),
                         runs=[self.runs.get((pair, rail)) or self.second_runs[(pair, rail)] for pair in mine],
                         raw=[path for pair in mine for path in self.raw.get((pair, rail), [])],
                         median=self._medians.get(rail),
                         action=pairs.link_action(self.attributions.get(rail), node, rail, self.tool.name),
                         unreached=node in self._unreached)

    def measure(self) -> None:
        with self._lock:
            if self._measured:
                return
            self._measured = True
            order = self.nodes
            selected = self._selected()
            planned = pairs.pair_schedule(order, self.depth, self.all_pairs_max, self.partners)
            wanted = {pair: sorted(selected.get(pair[0], set()) | selected.get(pair[1], set()),
                                   key=lambda rail: rail or 0)
                      for pair in planned if pair[0] in selected or pair[1] in selected}
            first = self._run_all(wanted, second=False)
            by_rail = pairs.by_kind({key: self.tool.outcome(run) for key, run in first.items()})
            self.verdicts = {rail: pairs.PairVerdicts(outcomes, self.low_fraction, self.tool.higher_is_better)
                             for rail, outcomes in sorted(by_rail.items(), key=lambda entry: entry[0] or 0)}
            again = {rail: verdicts.second_pass_pairs(order) for rail, verdicts in self.verdicts.items()}
            again = {rail: chosen for rail, chosen in again.items() if chosen}
            if again:
                second = self._run_all(pairs.kinds_by_pair(again), second=True)
                for rail, outcomes in pairs.by_kind({key: self.tool.outcome(run)
                                                     for key, run in second.items()}).items():
                    self.verdicts[rail].second = outcomes
            self._unreached = pairs.unreached_ends([*first.values(), *self.second_runs.values()])
            for rail, verdicts in self.verdicts.items():
                verdicts.unreached = self._unreached
                self._medians[rail] = verdicts.median
                self._links[rail] = verdicts.links_by_node()
                self.attributions[rail] = verdicts.attribution()
                self._findings[rail] = pairs.findings(self.attributions[rail])

    def _selected(self) -> dict[str, set[Rail]]:
        """The rails of this tool's selected checks, by node."""
        chosen: dict[str, set[Rail]] = {}
        for item in self._session.items:
            callspec = getattr(item, "callspec", None)
            if item.originalname == f"test_{self.tool.name}" and callspec and "node" in callspec.params:
                chosen.setdefault(callspec.params["node"], set()).add(callspec.params.get("rail"))
        return chosen

    def _run_all(self, wanted: dict[Pair, list[Rail]], *, second: bool) -> dict[tuple[Pair, Rail], RailRun]:
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
        for pair, rails in pairs.run_rounds(pairs.schedule(self.nodes, wanted), base_port, run_pair).items():
            for rail, run in rails.items():
                runs[(pair, rail)] = run
                for node in pair:
                    self._pairs_of.setdefault((node, rail), []).append(pair)
                saved = []
                if isinstance(run, PairRun):
                    for result in (run.client_result, run.server_result):
                        if result is not None:
                            saved += self._acceptance.save_result(f"{step}/{pair_rail_id(pair, rail)}", result)
                self.raw[(pair, rail)] = saved
                if second:
                    self.second_raw += saved
                    self.second_runs[(pair, rail)] = run
                else:
                    self.runs[(pair, rail)] = run
        return runs


_CAMPAIGNS = pytest.StashKey[dict[str, PairCampaign]]()


def _campaign(request, cluster_run, acceptance, profile, tool: PairTool) -> PairCampaign:
    """The session's one campaign of this tool."""
    campaigns = request.session.stash.setdefault(_CAMPAIGNS, {})
    if tool.name not in campaigns:
        campaigns[tool.name] = PairCampaign(request.session, cluster_run, acceptance, tool, profile)
    return campaigns[tool.name]


@pytest.fixture(scope="session")
def pairwise_iperf3(request, cluster_run, acceptance, profile) -> PairCampaign:
    return _campaign(request, cluster_run, acceptance, profile, iperf3.Iperf3Tool(profile))


@pytest.fixture(scope="session")
def pairwise_ib_write_bw(request, cluster_run, acceptance, profile) -> PairCampaign:
    return _campaign(request, cluster_run, acceptance, profile, perftest.PerftestTool(profile, "ib_write_bw"))


@pytest.fixture(scope="session")
def pairwise_ib_write_lat(request, cluster_run, acceptance, profile) -> PairCampaign:
    return _campaign(request, cluster_run, acceptance, profile, perftest.PerftestTool(profile, "ib_write_lat"))


LINKS_NAMED = 8  # a note names this many of a node's low or failed pairs, then counts the rest


def node_links(campaign: PairCampaign, node: str, rail: Rail, record) -> NodeLinks:
    """This node's links, recorded as its evidence (pairs with states, raw outputs) before any
    verdict; a node in no measured pair skips."""
    if len(campaign.nodes) < 2:
        pytest.skip(NEEDS_TWO)
    found = campaign.node(node, rail)
    if not found.links and not found.runs:
        pytest.skip(f"{node} is in no {campaign.depth} pair of the selected nodes")
    record.raw(found.raw)
    record.pairs([link.as_dict() for link in found.links], found.median)
    return found


def own_result(run: PairRun, node: str) -> Optional[Result]:
    return run.client_result if run.client == node else run.server_result


def partner_result(run: PairRun, node: str) -> Optional[Result]:
    return run.server_result if run.client == node else run.client_result


def sane_runs(found: NodeLinks, node: str, judge: Callable, finding: str):
    """[(run, report)] of the node's sane pairs; none sane fails the check as its first broken
    pair says (unreachable, timed out, or not sane), with attribution's words. A partner that was
    not reached fails it so, by name: the refused connect to its server measured nothing."""
    sane, broken = [], []
    for run in found.runs:
        report, why = judge(run)
        (broken if why else sane).append((run, report if not why else why))
    if sane:
        return sane
    run, why = broken[0]
    mine = own_result(run, node)
    blamed = f"{why}" + (f"; {finding}" if finding else "")
    own = transport_failure(mine.failure) if mine is not None else None
    if own is not None:  # this node's side never ran: unreachable, host key, ...
        raise own(mine.explain())
    theirs = partner_result(run, node)
    other = transport_failure(theirs.failure) if theirs is not None else None
    if other is not None:
        raise other(f"{why}: its partner {theirs.explain()}")
    if run.client_result.timed_out:
        raise CommandTimedOut(blamed, excerpt(run.client_result.stdout + run.client_result.stderr))
    raise SanityFailure(blamed, excerpt(run.client_result.stdout + run.client_result.stderr), found.action)


def links_note(found: NodeLinks, depth: str, best: str) -> str:
    """'4 pair(s) (full): best 9.3 Gb/s with node2; low or failed: node4 failed, ...'"""
    bad = [link for link in found.links if link.state != pairs.PAIR_OK]
    named = ", ".join(f"{link.peer} {link.state}" + (" (2nd pass)" if link.second_pass else "")
                      for link in bad[:LINKS_NAMED])
    more = f" and {len(bad) - LINKS_NAMED} more" if len(bad) > LINKS_NAMED else ""
    return (f"{len(found.links)} pair(s) ({depth}): best {best}"
            + (f"; low or failed: {named}{more}" if bad else ""))


def judge_links(metrics, figures: dict[str, tuple[Optional[float], str]], found: NodeLinks) -> None:
    """The node's best pair against the bands, then what attribution holds against it; the
    failure says which cable or port to look at, where attribution names one. A node lost
    during its pairs is unreachable, whatever its pairs before the loss gave: its links were not
    all measured, and a resume measures them again."""
    finding = found.finding
    try:
        metrics.judge(**figures)
    except PerformanceFailure as miss:
        if found.unreached:
            raise NodeUnreachable(finding) from None
        raise PerformanceFailure(f"{miss}; {finding}" if finding else str(miss), action=found.action) from None
    if found.unreached:
        raise NodeUnreachable(finding)
    if finding:
        raise PerformanceFailure(finding, action=found.action)


@pytest.mark.quick
@pytest.mark.full
def test_iperf3(node, pairwise_iperf3, metrics, record, acceptance):
    """TCP throughput of this node's links (the ring; at full depth every pair, or a sample of
    partners across the fleet): its best pair against the band, and it fails when its links
    point at it after the second pass (or at a link it ends)."""
    found = node_links(pairwise_iperf3, node, None, record)
    sane = sane_runs(found, node, iperf3.judge, found.finding)
    run, best = max(sane, key=lambda entry: entry[1].gbps)
    for _, report in sane:
        acceptance.record_tool(node, "iperf3", report.version or "unknown")
    peer = run.server if run.client == node else run.client
    record.note(links_note(found, pairwise_iperf3.depth,
                           f"{best.gbps:.2f} Gb/s with {peer}, {best.retransmits} retransmits"))
    judge_links(metrics, {"iperf3_bandwidth": (round(best.gbps, 3), "Gb/s"),
                          "iperf3_retransmits": (best.retransmits, "count")}, found)


def rail_links(pairwise: PairCampaign, node: str, rail: int, profile, record) -> tuple[NodeLinks, list]:
    """The node's links on one rail and its sane perftest reports: a rail it has no HCA for
    fails, no RDMA device skips (cpu-only) or fails when the profile expects HCAs."""
    found = node_links(pairwise, node, rail, record)
    started = [run for run in found.runs if isinstance(run, PairRun)]
    if not started:
        raise ExpectationFailure(str(found.runs[0]))
    mine = [own_result(run, node) for run in started]
    absent = next((result for result in mine if result is not None and perftest.no_rdma_device(result)), None)
    if absent is not None:
        said = next(m for m in perftest.NO_DEVICE_MARKERS if m in absent.stdout + absent.stderr)
        reason = f"no RDMA device: {pairwise.tool.name} on {node} says {said!r}"
        expected = profile.expect.ib_hcas
        if expected:
            raise ExpectationFailure(f"{reason}, but profile {profile.name} expects {expected} HCA(s)",
                                     excerpt(absent.stderr or absent.stdout))
        pytest.skip(reason)
    found = NodeLinks(found.links, found.finding, started, found.raw, found.median, found.action)
    return found, sane_runs(found, node, perftest.judge, found.finding)


def best_figures(tool: perftest.PerftestTool, sane: list) -> tuple[PairRun, dict[str, Optional[float]]]:
    """The run and figures of the node's best pair on the tool's main metric."""
    measured = [(run, tool.figures(report)) for run, report in sane]
    usable = [entry for entry in measured if entry[1].get(tool.main_metric) is not None] or measured
    pick = max if tool.higher_is_better else min
    return pick(usable, key=lambda entry: entry[1].get(tool.main_metric) or 0.0)


@pytest.mark.quick
@pytest.mark.full
def test_ib_write_bw(node, rail: int, pairwise_ib_write_bw, profile, metrics, record):
    """RDMA write bandwidth of this node's rail (HCA i to HCA i of its partners), large messages,
    in Gb/s per port: its best pair against the band; it fails when its links point at it."""
    found, sane = rail_links(pairwise_ib_write_bw, node, rail, profile, record)
    tool = pairwise_ib_write_bw.tool
    run, figures = best_figures(tool, sane)
    peer = run.server if run.client == node else run.client
    mode = (" bidirectional" if tool.mode.bidirectional else "") + (" GPUDirect" if tool.mode.use_cuda else "")
    record.note(f"rail {rail}{mode}: " + links_note(
        found, pairwise_ib_write_bw.depth, f"{figures[tool.main_metric]:.2f} Gb/s with {peer}"))
    judge_links(metrics, {name: (value, "Gb/s") for name, value in figures.items()}, found)


@pytest.mark.quick
@pytest.mark.full
def test_ib_write_lat(node, rail: int, pairwise_ib_write_lat, profile, metrics, record):
    """RDMA write latency of this node's rail: typical (median) and 99th percentile of its best
    pair against the bands; it fails when its links point at it."""
    found, sane = rail_links(pairwise_ib_write_lat, node, rail, profile, record)
    tool = pairwise_ib_write_lat.tool
    run, figures = best_figures(tool, sane)
    peer = run.server if run.client == node else run.client
    record.note(f"rail {rail}: " + links_note(
        found, pairwise_ib_write_lat.depth,
        f"typical {figures['ib_write_lat_typical']} us, p99 {figures['ib_write_lat_p99']} us with {peer}"))
    judge_links(metrics, {name: (value, "us") for name, value in figures.items()}, found)


@pytest.mark.quick
@pytest.mark.full
@pytest.mark.cluster
def test_network_attribution(pairwise_iperf3, pairwise_ib_write_bw, pairwise_ib_write_lat, record):
    """The suspect nodes and links of every tool and rail in one place, after the second pass
    that re-paired every failing node with nodes that passed; the pair counts of each."""
    suspects, lows, counts = [], [], []
    campaigns = (pairwise_iperf3, pairwise_ib_write_bw, pairwise_ib_write_lat)
    for campaign in campaigns:
        campaign.measure()
        tool = campaign.tool
        for rail, verdicts in campaign.verdicts.items():
            found = campaign.attributions[rail]
            if not found.clean:
                suspects.append(f"{tool.label(rail)}: {found.summary()}")
            lows += [f"{tool.label(rail)} {pair_id(pair)}: {why} {tool.unit}" for pair, why in verdicts.low.items()]
            counts.append(tool.tally(rail, verdicts.first))
    if not counts:
        pytest.skip(f"no pair measured ({NEEDS_TWO}, no RDMA device, or none selected)")
    record.raw([path for campaign in campaigns for path in campaign.second_raw])
    shown = lows[:LINKS_NAMED * 4]
    far = "; ".join(shown) + (f"; and {len(lows) - len(shown)} more" if len(lows) > len(shown) else "")
    record.note("; ".join(counts) + (f"; far from the median: {far}" if lows else ""))
    if suspects:
        raise ExpectationFailure("suspects: " + "; ".join(suspects)
                                 + (f" (far from the median: {far})" if lows else ""))
