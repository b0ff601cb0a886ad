"""iperf3 between two nodes: server and client argv, one pair run with teardown, and a pure parser.

iperf3 3.11/3.12 with -J exits 0 on client-side errors (esnet/iperf#1405) and reports them in
the document's "error" key, so the parser, not the exit code, decides whether a run worked.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from runners.pairs import Measure, Pair, PairOutcome, PairRun, PairTool, Rail, RailRun, pair_id, run_server_client
from runners.parsing import ParseError
from runners.transport import Transport

PAIR_SECONDS = 2  # how long each pair test sends
CONNECT_TIMEOUT_S = 3
REFUSED_RETRY_S = 5  # how long a client retries "connection refused" while the server starts
REFUSED = "Connection refused"
INTERRUPTED = "interrupt - the server has terminated"  # a server ended by a signal while it listened
LISTEN_ERROR = "unable to start listener"  # iperf3's IELISTEN: its server could not listen on the port
# iperf3's own node failing before any traffic: each stream's buffer is a file it makes in TMPDIR
# (IECREATESTREAM), so a missing or full TMPDIR fails the pair whatever the link.
OWN_NODE_ERROR = "unable to create a new stream"


@dataclass(frozen=True)
class Iperf3Report:
    bits_per_second: Optional[float]  # received, bit/s (decimal)
    retransmits: Optional[int]  # TCP sender's, None on the server side and for UDP
    error: Optional[str]
    ok: bool
    role: str  # client, server, or unknown (an error before the connection)
    protocol: Optional[str]
    version: Optional[str]
    lost_percent: Optional[float] = None  # UDP: the datagrams that did not arrive; None for TCP

    @property
    def gbps(self) -> Optional[float]:
        return None if self.bits_per_second is None else self.bits_per_second / 1e9


def parse_iperf3(text: str) -> Iperf3Report:
    """An iperf3 -J document (client or server, TCP or UDP), its error key included."""
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON object in iperf3 output")
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise ParseError(f"iperf3 -J output is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("start"), dict):
        raise ParseError("not an iperf3 -J document: no 'start' object")
    begun, end = data["start"], data.get("end") or {}
    if not isinstance(end, dict):
        raise ParseError("iperf3 -J: 'end' is not an object")
    error = data.get("error")
    role = ("client" if "connecting_to" in begun else
            "server" if "accepted_connection" in begun else "unknown")
    received = end.get("sum_received") or end.get("sum") or {}
    sent = end.get("sum_sent") or {}
    bits = received.get("bits_per_second")
    retransmits = sent.get("retransmits") if role == "client" else None
    protocol = (begun.get("test_start") or {}).get("protocol")
    lost = received.get("lost_percent") if protocol == "UDP" else None
    ok = error is None and isinstance(bits, (int, float)) and bits > 0
    return Iperf3Report(
        bits_per_second=float(bits) if isinstance(bits, (int, float)) else None,
        retransmits=retransmits if isinstance(retransmits, int) else None,
        error=str(error) if error is not None else None, ok=ok, role=role,
        protocol=protocol, version=begun.get("version"),
        lost_percent=float(lost) if isinstance(lost, (int, float)) else None)


PARSERS = {"iperf3": parse_iperf3}


def server_argv(port: int) -> list[str]:
    """A one-off server: it serves one client and exits, so nothing lingers after a good run."""
    return ["iperf3", "--server", "--one-off", "--json", "--port", str(port)]


def client_argv(server: str, port: int, seconds: int) -> list[str]:
    return ["iperf3", "--client", server, "--port", str(port), "--time", str(seconds), "--json",
            "--connect-timeout", str(CONNECT_TIMEOUT_S * 1000)]


def run_pair(server: Transport, client: Transport, server_address: str, port: int,
             seconds: int) -> PairRun:
    """Server on one node, client on the other (runners.pairs.run_server_client); the client
    retries while the server is not yet listening ("connection refused")."""
    return run_server_client(
        server, client, server_argv(port), client_argv(server_address, port, seconds), port=port,
        server_timeout=seconds + CONNECT_TIMEOUT_S + REFUSED_RETRY_S + 15,
        client_timeout=seconds + CONNECT_TIMEOUT_S + 5,
        retry_while=lambda result: REFUSED in result.stdout, retry_s=REFUSED_RETRY_S)


def failed_on_its_own_node(report: Iperf3Report) -> bool:
    """The client failed before any traffic for a reason of its own node (OWN_NODE_ERROR)."""
    return (report.error or "").startswith(OWN_NODE_ERROR)


def server_error(run: PairRun) -> str:
    """The server's own "error" key, "" where it had none or its output is not iperf3's JSON."""
    if run.server_result is None:
        return ""
    try:
        return parse_iperf3(run.server_result.stdout).error or ""
    except ParseError:
        return ""


def listen_error(run: PairRun) -> Optional[str]:
    """The server's own reason it could not listen (LISTEN_ERROR: "... Address already in use"),
    or None: such a server leaves its client only "connection refused"."""
    error = server_error(run)
    return error.removeprefix("error - ") if LISTEN_ERROR in error else None


def server_interrupted(run: PairRun) -> bool:
    """The server listened until the pair ended it (INTERRUPTED): a refused client was refused by
    something else on the way, not for want of a server."""
    return server_error(run).startswith(INTERRUPTED)


def judge(run: PairRun) -> tuple[Optional[Iperf3Report], str]:
    """(report, '') when the client measured; (report or None, why) when it did not.

    Sanity before figures: an unreachable node, a timeout, a non-zero exit, unparseable output
    and the "error" key each fail the pair, whatever the exit code said. A client refused by a
    server that could not listen is said with the server's reason, which is where the fix is; one
    refused while its server ran throughout, with what refuses it: a firewall's REJECT, or a wrong address.
    """
    result = run.client_result
    where = f"{run.client} -> {run.server}:{run.port}"
    if result.failure:
        return None, result.explain()
    try:
        report = parse_iperf3(result.stdout)
    except ParseError as exc:
        if result.timed_out:
            return None, f"{where}: iperf3 timed out after {result.duration_s:.0f} s"
        return None, f"{where}: {exc} (exit {result.exit_code})"
    if result.timed_out:  # killed by the limit: its own "error" (interrupt) is a consequence
        return report, f"{where}: iperf3 timed out after {result.duration_s:.0f} s"
    if failed_on_its_own_node(report):
        return report, (f"{where}: iperf3 error on {run.client} itself: {report.error} (it makes each "
                        f"stream's buffer file in {run.client}'s TMPDIR)")
    if report.error and REFUSED in report.error and (refused_by := listen_error(run)):
        return report, f"{where}: the iperf3 server on {run.server} could not listen: {refused_by}"
    if report.error and REFUSED in report.error and server_interrupted(run):
        return report, (f"{where}: iperf3 error: {report.error}, while the iperf3 server on {run.server} ran "
                        f"throughout: a firewall rejects port {run.port} on {run.server} or on the way, or the address "
                        f"the client was given is not {run.server}'s")
    if report.error:
        return report, f"{where}: iperf3 error: {report.error}"
    if result.exit_code != 0:
        return report, f"{where}: " + result.explain().split(": ", 1)[-1]
    if not report.ok:
        return report, f"{where}: iperf3 measured no traffic"
    return report, ""


class Iperf3Tool(PairTool):
    """TCP throughput with iperf3 (client b, server a) over the data network: one rail, None."""

    name, unit = "iperf3", "Gb/s"

    def __init__(self, profile):
        self._reference = profile.references.get("iperf3_bandwidth")

    def measurer(self, cluster_run) -> Measure:
        nodes = [node.name for node in cluster_run.nodes]
        transports = {node: cluster_run.transport(node) for node in nodes}
        # iperf3 measures the data network: a node's data_address when the inventory names one.
        address = {node: cluster_run.cluster.node(node).data_address
                   or cluster_run.cluster.node(node).address for node in nodes}

        def measure(pair: Pair, rail: Rail, port: int) -> RailRun:
            server, client = pair
            return run_pair(transports[server], transports[client], address[server], port,
                                   PAIR_SECONDS)

        return measure

    def outcome(self, run: RailRun) -> Optional[PairOutcome]:
        """Sane, and within the profile's band when it has one; the figure in Gb/s. None when the
        client failed on its own node (OWN_NODE_ERROR): that says nothing about the link."""
        if isinstance(run, str):  # it could not start
            return PairOutcome(False)
        report, why = judge(run)
        if report is not None and failed_on_its_own_node(report):
            return None
        if why or report is None:
            return PairOutcome(False)
        return PairOutcome(self._reference is None or self._reference.admits(report.gbps), report.gbps)

    def tally(self, rail: Rail, first: dict[Pair, PairOutcome]) -> str:
        failed = sorted(pair_id(pair) for pair, outcome in first.items() if not outcome.passed)
        return (f"{super().tally(rail, first)}, {len(failed)} failed"
                + (f" ({', '.join(failed)})" if failed else ""))
