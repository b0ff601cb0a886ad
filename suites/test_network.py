"""Network: InfiniBand port health on every node, iperf3 between node pairs in rounds, and blame.

Per-node checks cannot see a bad cable: a link only shows up in a test between its two ends.
Pairs run in rounds of disjoint pairs (runners.pairs); `-m quick` runs a ring (every node in two
pairs), `-m full` every pair. The cluster-wide summary re-pairs failing nodes with passing ones
and names the suspect nodes and links.
"""
from __future__ import annotations

import itertools
import threading
from typing import Optional

import pytest

from runners import ibstat, iperf3, pairs
from runners.parsing import ParseError
from runners.pairs import Pair, pair_id
from suites.checks import (CommandTimedOut, ExpectationFailure, NodeUnreachable, SanityFailure,
                           excerpt, parsed)
from suites.test_system import odd_ones_out

pytestmark = [pytest.mark.network]

IBSTAT_STEP = "ibstat"
IPERF3_SECONDS = 2
IPERF3_BASE_PORT = 5301  # pair i of a round uses IPERF3_BASE_PORT + i
SECOND_PASS_BASE_PORT = 5401
NEEDS_TWO = "needs at least two nodes"


# ------------------------------------------------------------------------------ port health


def devices_of(on_node, profile) -> ibstat.IbDevices:
    """This node's HCAs; no ibstat or no HCA is a skip, unless the profile expects HCAs."""
    result = on_node(IBSTAT_STEP, ibstat.probe)
    absent = None
    if ibstat.tool_missing(result):
        absent = "ibstat is not installed (Debian/Ubuntu: infiniband-diags)"
    elif ibstat.no_device(result):
        absent = "no InfiniBand/RoCE device: ibstat lists no HCA"
    if absent:
        expected = profile.expect.get("ib_hcas")
        if expected:
            raise ExpectationFailure(f"{result.node}: {absent}, but profile {profile.name} "
                                     f"expects {expected} HCA(s)")
        pytest.skip(absent)
    return parsed(ibstat.parse_ibstat, result)


@pytest.mark.quick
def test_ib_ports(on_node, profile, record, recorder, node):
    """HCA count and type, every port Active/LinkUp at the expected rate and link layer."""
    devices = devices_of(on_node, profile)
    recorder.record_tool(node, "ibstat", "infiniband-diags")
    ports = [(hca, port) for hca in devices.hcas for port in hca.ports]
    record.note(f"{len(devices.hcas)} HCA(s): " + ", ".join(
        f"{hca.name}/{port.port} {port.state} {port.rate:g} Gb/s" if port.rate is not None
        else f"{hca.name}/{port.port} {port.state}" for hca, port in ports))
    problems = port_problems(devices, profile.expect)
    if problems:
        raise ExpectationFailure("; ".join(problems))


def port_problems(devices: ibstat.IbDevices, expect: dict) -> list[str]:
    """Every way the HCAs differ from the profile's expect block, in words."""
    problems = []
    count, ca_type = expect.get("ib_hcas"), expect.get("ib_ca_type")
    rate, layer = expect.get("ib_rate"), expect.get("ib_link_layer")
    if count is not None and len(devices.hcas) != count:
        problems.append(f"{len(devices.hcas)} HCA(s), expected {count}")
    for hca in devices.hcas:
        if ca_type and hca.ca_type != ca_type:
            problems.append(f"{hca.name}: CA type {hca.ca_type}, expected {ca_type}")
        if not hca.ports:
            problems.append(f"{hca.name}: no ports listed")
        for port in hca.ports:
            where = f"{hca.name} port {port.port}"
            if not port.healthy:
                problems.append(f"{where}: {port.state}/{port.physical_state}, expected Active/LinkUp")
            if rate is not None and port.rate != rate:
                problems.append(f"{where}: rate {port.rate} Gb/s, expected {rate:g}")
            if layer and port.link_layer != layer:
                problems.append(f"{where}: link layer {port.link_layer}, expected {layer}")
    return problems


@pytest.mark.quick
@pytest.mark.cluster
def test_ib_firmware_uniformity(cluster_run, record):
    """Same HCA firmware on every node that has HCAs; odd ones out are named."""
    firmware = {}
    for node, result in cluster_run.gather(IBSTAT_STEP, ibstat.probe).items():
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


# ------------------------------------------------------------------------------ iperf3 pairs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per pair, id 'a-b': ring pairs are quick and full, the other pairs full only."""
    if "pair" not in metafunc.fixturenames:
        return
    recorder = metafunc.config.pluginmanager.get_plugin("handover-recorder")
    if recorder is None:
        raise pytest.UsageError("the acceptance suites need --inventory FILE")
    nodes = [node.name for node in recorder.cluster_run.nodes]
    if len(nodes) < 2:
        metafunc.parametrize("pair", [pytest.param(None, id="single-node",
                                                   marks=[pytest.mark.quick, pytest.mark.full])])
        return
    ring = set(pairs.ring_pairs(nodes))
    metafunc.parametrize("pair", [
        pytest.param(pair, id=pair_id(pair),
                     marks=[pytest.mark.quick, pytest.mark.full] if pair in ring else [pytest.mark.full])
        for pair in itertools.combinations(nodes, 2)])


class PairwiseIperf3:
    """iperf3 for every selected pair, run once in rounds when the first pair test asks."""

    def __init__(self, session: pytest.Session, cluster_run, recorder, profile):
        self._session = session
        self._cluster_run = cluster_run
        self._recorder = recorder
        self._reference = profile.references.get("iperf3_bandwidth")
        self._lock = threading.Lock()
        self.runs: dict[Pair, iperf3.PairRun] = {}
        self.raw: dict[Pair, list[str]] = {}

    def run(self, pair: Pair) -> iperf3.PairRun:
        with self._lock:
            if pair not in self.runs:
                self._run_all(self._selected() or [pair], IPERF3_BASE_PORT, "iperf3")
            return self.runs[pair]

    def _selected(self) -> list[Pair]:
        chosen = []
        for item in self._session.items:
            callspec = getattr(item, "callspec", None)
            if item.originalname == "test_iperf3" and callspec and callspec.params.get("pair"):
                chosen.append(callspec.params["pair"])
        return chosen

    def _run_all(self, wanted: list[Pair], base_port: int, step: str) -> dict[Pair, iperf3.PairRun]:
        nodes = [node.name for node in self._cluster_run.nodes]
        transports = {node: self._cluster_run.transport(node) for node in nodes}
        address = {node: self._cluster_run.cluster.node(node).address for node in nodes}

        def run_pair(pair: Pair, port: int) -> iperf3.PairRun:
            server, client = pair
            return iperf3.run_pair(transports[server], transports[client], address[server], port,
                                   IPERF3_SECONDS)

        done = pairs.run_rounds(pairs.schedule(nodes, wanted), base_port, run_pair)
        for pair, run in done.items():
            saved = []
            for result in (run.client_result, run.server_result):
                if result is not None:
                    saved += self._recorder.ledger.save_raw(f"{step}/{pair_id(pair)}", result.node,
                                                            result.stdout, result.stderr)
            self.raw[pair] = saved
        self.runs.update(done)
        return done

    def passed(self, run: iperf3.PairRun) -> bool:
        """Sane, and within the profile's band when it has one."""
        report, why = iperf3.judge(run)
        if why:
            return False
        return self._reference is None or self._reference.admits(report.gbps)

    def second_pass(self, first: dict[Pair, bool]) -> dict[Pair, bool]:
        """Re-pair the nodes of failed pairs with nodes that passed; their outcomes."""
        nodes = [node.name for node in self._cluster_run.nodes]
        again = pairs.second_pass_pairs(first, nodes)
        if not again:
            return {}
        with self._lock:
            done = self._run_all(again, SECOND_PASS_BASE_PORT, "iperf3_second_pass")
        return {pair: self.passed(run) for pair, run in done.items()}


_PAIRWISE_KEY = pytest.StashKey[PairwiseIperf3]()


@pytest.fixture(scope="session")
def pairwise_iperf3(request, cluster_run, recorder, profile) -> PairwiseIperf3:
    stash = request.session.stash
    if _PAIRWISE_KEY not in stash:
        stash[_PAIRWISE_KEY] = PairwiseIperf3(request.session, cluster_run, recorder, profile)
    return stash[_PAIRWISE_KEY]


def test_iperf3(pair: Optional[Pair], pairwise_iperf3, metrics, record, recorder):
    """TCP throughput from one node to the other (client b, server a), sanity before figures."""
    if pair is None:
        pytest.skip(NEEDS_TWO)
    run = pairwise_iperf3.run(pair)
    record.raw(pairwise_iperf3.raw.get(pair, []))
    result = run.client_result
    report, why = iperf3.judge(run)
    if why:
        if result.failure in ("unreachable", "auth", "host-key"):
            raise NodeUnreachable(why)
        if result.timed_out:
            raise CommandTimedOut(why, excerpt(result.stdout + result.stderr))
        raise SanityFailure(why, excerpt(result.stdout or result.stderr))
    for node in pair:
        recorder.record_tool(node, "iperf3", report.version or "unknown")
    record.note(f"{run.client} -> {run.server}: {report.gbps:.2f} Gb/s, "
                f"{report.retransmits} retransmits")
    metrics.judge(iperf3_bandwidth=(round(report.gbps, 3), "Gb/s"),
                  iperf3_retransmits=(report.retransmits, "count"))


@pytest.mark.quick
@pytest.mark.full
@pytest.mark.cluster
def test_network_attribution(pairwise_iperf3, record):
    """Which nodes or links the failed pairs point at, after a second pass with passing nodes."""
    if not pairwise_iperf3.runs:
        pytest.skip(f"no iperf3 pair ran ({NEEDS_TWO}, or none selected)")
    first = {pair: pairwise_iperf3.passed(run) for pair, run in pairwise_iperf3.runs.items()}
    outcomes = {**first, **pairwise_iperf3.second_pass(first)}
    failed = sorted(pair_id(pair) for pair, ok in outcomes.items() if not ok)
    record.note(f"{len(outcomes)} pair(s) measured, {len(failed)} failed"
                + (f": {', '.join(failed)}" if failed else ""))
    blame = pairs.attribute(outcomes)
    if not blame.clean:
        raise ExpectationFailure(f"suspects: {blame.summary()}")
