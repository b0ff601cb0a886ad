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

from runners.parsing import ParseError
from runners.transport import Result

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
    for name, value in zip(columns[2:], fields[2:]):
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
    for name, value in zip(columns[2:], fields[2:]):
        if name in _LAT_COLUMNS:
            row[_LAT_COLUMNS[name]] = float(value)
    return row


PARSERS = {"perftest": parse_perftest}


def no_rdma_device(result: Result) -> bool:
    """perftest ran and said this node has no RDMA device (it exits 1 with this on stderr)."""
    return result.exit_code not in (0, None) and any(
        marker in result.stderr + result.stdout for marker in NO_DEVICE_MARKERS)


def write_bw_server_argv(device: str, port: int, *, size: int = 8388608) -> list[str]:
    return ["ib_write_bw", "--ib-dev", device, "--port", str(port), "--size", str(size),
            "--report_gbits"]


def write_bw_client_argv(device: str, port: int, server: str, *, size: int = 8388608) -> list[str]:
    return [*write_bw_server_argv(device, port, size=size), server]
