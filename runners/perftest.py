"""perftest (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat, ...): argv and a pure text parser.

The result table is found by its header (` #bytes  #iterations  BW peak[MB/sec] ...` or the
latency columns) and read by column name, so extra columns (#sl, CPU_Util) and interleaved lines
(`Conflicting CPU frequency values detected ...`, the server's copy of the table) do not shift
the figures. MB/sec and MiB/sec are both 2^20 bytes/s in perftest; Gb/sec is 1e9 bit/s.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from runners import ibstat
from runners.pairs import Measure, Pair, PairOutcome, PairRun, PairTool, Rail, RailRun, run_server_client
from runners.parsing import ParseError
from runners.transport import Result, Transport

MAIN_METRICS = {"ib_write_bw": "ib_write_bw", "ib_write_lat": "ib_write_lat_typical"}  # judged, drawn
NO_DEVICE_MARKERS = ("Unable to find the Infiniband/RoCE device", "Did not detect devices")
ERROR_MARKERS = ("Completion with error", "Failed status", "Couldn't connect", "Unable to create QP",
                 "Couldn't create IB resources", "Couldn't set the link layer") + NO_DEVICE_MARKERS
MIB_PER_S_IN_GBPS = 2**20 * 8 / 1e9

_TITLE = re.compile(r"^\s*(\S.*?(?:BW|Latency) Test)\s*$")
_HEADER_COLUMN = re.compile(r"#\w+|tps average|(?:[^\s\[\]]+ )?[^\s\[\]]+\[[^\]]*\]")
_ROW = re.compile(r"^\s*\d+\s+\d+(?:\s+[\d.]+)+\s*$")
_BW_UNITS = {"MB/sec": MIB_PER_S_IN_GBPS, "MiB/sec": MIB_PER_S_IN_GBPS, "Gb/sec": 1.0}
_LAT_COLUMNS = {"t_min[usec]": "t_min_us", "t_max[usec]": "t_max_us",
                "t_typical[usec]": "t_typical_us", "t_avg[usec]": "t_avg_us",
                "t_stdev[usec]": "t_stdev_us", "99% percentile[usec]": "p99_us",
                "99.9% percentile[usec]": "p999_us"}


@dataclass(frozen=True)
class PerftestReport:
    test: str  # the tool's title, e.g. "RDMA_Write BW Test"
    kind: str  # bw or lat
    rows: list[dict]  # bw: bytes, iterations, bw_peak_gbps, bw_avg_gbps, msg_rate_mpps; lat: *_us
    peak_bw_gbps: Optional[float]  # the highest average bandwidth of any message size (bw tests)
    errors: list[str]  # error lines the tool printed
    ok: bool


def parse_perftest(text: str) -> PerftestReport:
    """A perftest run's text (client, server or both interleaved); rows deduplicated in order."""
    lines = text.splitlines()
    title = next((m.group(1) for m in map(_TITLE.match, lines) if m), None)
    header_at = next((i for i, line in enumerate(lines)
                      if "#bytes" in line and "#iterations" in line), None)
    errors = [line.strip() for line in lines if any(marker in line for marker in ERROR_MARKERS)]
    if header_at is None:
        if title is None:
            raise ParseError("no perftest title ('... BW Test' / '... Latency Test') "
                             "and no '#bytes #iterations' table header")
        return PerftestReport(title, _kind(title, ""), [], None, errors, False)
    columns = _HEADER_COLUMN.findall(lines[header_at])
    kind = _kind(title or "", lines[header_at])
    rows: list[dict] = []
    for line in lines[header_at + 1:]:
        if not _ROW.match(line):
            continue
        fields = line.split()
        if len(fields) != len(columns):
            continue  # a different table's row (e.g. the duration-mode layout): never guess columns
        row = _bw_row(columns, fields) if kind == "bw" else _lat_row(columns, fields)
        if row not in rows:
            rows.append(row)
    if kind == "bw" and rows and "bw_avg_gbps" not in rows[0]:
        raise ParseError(f"bandwidth table without a known 'BW average[unit]' column: {columns}")
    peak = max((row["bw_avg_gbps"] for row in rows), default=None) if kind == "bw" else None
    return PerftestReport(title or "", kind, rows, peak, errors, bool(rows) and not errors)


def _kind(title: str, header: str) -> str:
    if "Latency" in title or "usec" in header:
        return "lat"
    return "bw"


def _bw_row(columns: list[str], fields: list[str]) -> dict:
    row: dict = {"bytes": int(fields[0]), "iterations": int(fields[1])}
    for name, value in zip(columns[2:], fields[2:], strict=False):
        unit = name[name.find("[") + 1:-1] if "[" in name else ""
        if name.startswith("BW peak") and unit in _BW_UNITS:
            row["bw_peak_gbps"] = round(float(value) * _BW_UNITS[unit], 4)
        elif name.startswith("BW average") and unit in _BW_UNITS:
            row["bw_avg_gbps"] = round(float(value) * _BW_UNITS[unit], 4)
        elif name == "MsgRate[Mpps]":
            row["msg_rate_mpps"] = float(value)
    return row


def _lat_row(columns: list[str], fields: list[str]) -> dict:
    row: dict = {"bytes": int(fields[0]), "iterations": int(fields[1])}
    for name, value in zip(columns[2:], fields[2:], strict=False):
        if name in _LAT_COLUMNS:
            row[_LAT_COLUMNS[name]] = float(value)
    return row


PARSERS = {"perftest": parse_perftest}


def no_rdma_device(result: Result) -> bool:
    """perftest ran and said this node has no RDMA device (it exits 1 with this on stderr)."""
    return result.exit_code not in (0, None) and any(
        marker in result.stderr + result.stdout for marker in NO_DEVICE_MARKERS)


LARGE_MESSAGE_BYTES = 8388608  # 8 MiB: the size where HDR/NDR ports reach line rate
LATENCY_MESSAGE_BYTES = 2  # perftest's default latency size
RUN_TIMEOUT_S = 60
NOT_LISTENING = "Couldn't connect to"  # the client started before its server listened
# Both sides of a pair on IPv6 addresses need this flag (perftest 23.07 and later); an older
# perftest refuses it with the getopt line below.
IPV6_FLAG = "--ipv6-addr"
IPV6_FLAG_UNKNOWN = f"unrecognized option '{IPV6_FLAG}'"
RETRY_S = 5


@dataclass(frozen=True)
class PerftestMode:
    """How one rail-aligned pair test runs: which tool, message size, and optional modes."""

    tool: str = "ib_write_bw"  # or ib_write_lat
    size: int = LARGE_MESSAGE_BYTES
    bidirectional: bool = False  # -b: both directions at once (bandwidth tools only)
    use_cuda: bool = False  # GPUDirect RDMA: buffers on the rail's GPU (perftest built with CUDA)


def server_argv(mode: PerftestMode, device: Optional[str], port: int,
                gpu: Optional[int] = None, *, ipv6: bool = False) -> list[str]:
    """The server side; device None lets perftest take the first RDMA device it finds. ipv6: the
    server's address is an IPv6 one, so both sides exchange their parameters over IPv6
    (--ipv6-addr; perftest takes IPv4 otherwise)."""
    argv = [mode.tool, "--port", str(port), "--size", str(mode.size)] + ([IPV6_FLAG] if ipv6 else [])
    if device:
        argv += ["--ib-dev", device]
    if mode.tool.endswith("_bw"):
        argv.append("--report_gbits")
        if mode.bidirectional:
            argv.append("--bidirectional")
    if mode.use_cuda and gpu is not None:
        argv.append(f"--use_cuda={gpu}")
    return argv


def client_argv(mode: PerftestMode, device: Optional[str], port: int, server: str,
                gpu: Optional[int] = None) -> list[str]:
    return [*server_argv(mode, device, port, gpu, ipv6=is_ipv6(server)), server]


def is_ipv6(address: str) -> bool:
    """An IPv6 literal, as the inventory keeps it (a host name never holds a colon)."""
    return ":" in address


def run_pair(server: Transport, client: Transport, server_address: str, port: int,
             mode: PerftestMode, server_device: Optional[str], client_device: Optional[str],
             gpu: Optional[int] = None) -> PairRun:
    """One rail between two nodes: server HCA on one, client HCA on the other, torn down always."""
    return run_server_client(
        server, client, server_argv(mode, server_device, port, gpu, ipv6=is_ipv6(server_address)),
        client_argv(mode, client_device, port, server_address, gpu), port=port,
        server_timeout=RUN_TIMEOUT_S + RETRY_S + 5, client_timeout=RUN_TIMEOUT_S,
        retry_while=lambda result: NOT_LISTENING in result.stdout + result.stderr, retry_s=RETRY_S)


def judge(run: PairRun) -> tuple[Optional[PerftestReport], str]:
    """(report, '') when the client measured; (report or None, why) otherwise.

    Sanity before figures: the error lines perftest prints (between rows too) fail the pair
    even when a table was printed, and a zero exit without a table is no measurement.
    """
    result = run.client_result
    where = f"{run.client} -> {run.server}:{run.port}"
    if result.failure:
        return None, result.explain()
    too_old = dict.fromkeys(node for node, side in ((run.client, result), (run.server, run.server_result))
                            if side is not None and IPV6_FLAG_UNKNOWN in side.stderr)
    if too_old:  # the client may have waited for a server that refused the flag at once
        return None, (f"{where}: the perftest on {' and '.join(too_old)} predates {IPV6_FLAG} (perftest 23.07), "
                      "which a pair on IPv6 addresses needs: update perftest there, or give the nodes IPv4 addresses")
    if result.timed_out:
        return None, f"{where}: `{result.command}` timed out after {result.duration_s:.0f} s"
    try:
        report = parse_perftest(result.stdout + "\n" + result.stderr)
    except ParseError as exc:
        last = (result.stderr.strip().splitlines() or [""])[-1].strip()
        return None, f"{where}: {exc} (exit {result.exit_code}{': ' + last if last else ''})"
    if report.errors:
        return report, f"{where}: {'; '.join(dict.fromkeys(report.errors))}"
    if result.exit_code != 0:
        return report, f"{where}: " + result.explain().split(": ", 1)[-1]
    if not report.rows:
        return report, f"{where}: {report.test or 'perftest'} printed no result row"
    return report, ""


class PerftestTool(PairTool):
    """One perftest tool (ib_write_bw, ib_write_lat), one rail at a time.

    Rail r joins the r-th HCA ibstat lists on each node (rail-aligned, in natural name order:
    mlx5_2 before mlx5_10); a node whose ibstat lists no HCA runs perftest without --ib-dev, so
    perftest itself says whether it finds an RDMA device.
    """

    def __init__(self, profile, tool: str):
        self.name = tool
        self.unit = "Gb/s" if tool.endswith("_bw") else "us"
        self.references = {name: ref for name, ref in profile.references.items() if ref.check == tool}
        self.main_metric = MAIN_METRICS[tool]
        self.higher_is_better = tool.endswith("_bw")
        self.mode = PerftestMode(
            tool=tool,
            size=LARGE_MESSAGE_BYTES if tool.endswith("_bw") else LATENCY_MESSAGE_BYTES,
            bidirectional=bool(profile.expect.ib_bidirectional),
            use_cuda=bool(profile.expect.ib_gpudirect))

    def measurer(self, cluster_run) -> Measure:
        nodes = [node.name for node in cluster_run.nodes]
        transports = {node: cluster_run.transport(node) for node in nodes}
        address = {node: cluster_run.cluster.node(node).address for node in nodes}
        hcas = hca_names(cluster_run)

        def device(node: str, rail: int) -> tuple[Optional[str], str]:
            if not hcas[node]:
                return None, ""
            if rail >= len(hcas[node]):
                return None, (f"{node} has {len(hcas[node])} HCA(s) ({', '.join(hcas[node])}): "
                              f"no HCA for rail {rail}")
            return hcas[node][rail], ""

        def measure(pair: Pair, rail: Rail, port: int) -> RailRun:
            server, client = pair
            (server_device, server_problem), (client_device, client_problem) = (
                device(server, rail or 0), device(client, rail or 0))
            if server_problem or client_problem:
                return server_problem or client_problem
            return run_pair(
                transports[server], transports[client], address[server], port, self.mode,
                server_device, client_device, gpu=rail if self.mode.use_cuda else None)

        return measure

    def figures(self, report: PerftestReport) -> dict[str, Optional[float]]:
        """The figures a rail is judged on: bandwidth at the largest message; latency typical
        (median) and 99th percentile of the first (only) size."""
        if self.higher_is_better:
            return {self.main_metric: max(report.rows, key=lambda row: row["bytes"])["bw_avg_gbps"]}
        row = report.rows[0]
        return {self.main_metric: row.get("t_typical_us"), "ib_write_lat_p99": row.get("p99_us")}

    def outcome(self, run: RailRun) -> Optional[PairOutcome]:
        """None for a rail that says nothing about the link (no HCA for the rail, no RDMA
        device on a node); else sane and every figure within its band."""
        if isinstance(run, str) or any(no_rdma_device(result)
                                       for result in (run.client_result, run.server_result)
                                       if result is not None):
            return None
        report, why = judge(run)
        if why or report is None:
            return PairOutcome(False)
        figures = self.figures(report)
        within = all(figures.get(name) is not None and reference.admits(figures[name])
                     for name, reference in self.references.items())
        return PairOutcome(within, figures[self.main_metric])


def hca_names(cluster_run) -> dict[str, list[str]]:
    """Each node's HCA names, naturally ordered ([] when it lists none or did not answer)."""
    names = {}
    for node, result in cluster_run.gather(ibstat.STEP, ibstat.probe).items():
        try:
            names[node] = ibstat.natural_order(hca.name for hca in ibstat.parse_ibstat(result.stdout).hcas)
        except ParseError:
            names[node] = []
    return names
