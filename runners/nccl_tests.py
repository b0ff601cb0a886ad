"""nccl-tests (`all_reduce_perf`, `all_gather_perf`, ...): argv, a run on one node, a pure parser.

The parser reads the text table of any version (old `error` columns without `root`, the
`#wrong` columns of 2.x, an EMPTY redop field in alltoall rows) and the `-J` JSON document.
Columns are found by the header's names and data rows are read from the right, so a blank
redop never shifts them; NCCL INFO/WARN lines and MPI's `[1,0]<stdout>:` prefixes are skipped.
The figure to judge is busbw at the largest size (peak_busbw), never "Avg bus bandwidth" (a mean
over every size, dominated by small messages).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from runners import system
from runners.cluster import ClusterRun
from runners.launchers import MPIRUN, SRUN, Launcher, LaunchError, launch_program
from runners.parsing import ParseError, json_object
from runners.transport import Result, Transport

# nccl-tests' exit status 7 (testNumResults): #wrong / out-of-bounds > 0, or avg busbw below
# 0.9 x NCCL_TESTS_MIN_BW (src/common.h).
EXIT_DATA_ERRORS = 7
BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
            "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf"}

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s.*\bdevice\s+\d+")
_ERROR_LINE = re.compile(r"Test (?:NCCL|CUDA) failure|Test failure|Test timeout|^# error:\s*\S")
_NCCL_VERSION = re.compile(r"NCCL version (\S+)")
_LIBRARY_CODE = re.compile(r"nccl-library=(\d+)")


@dataclass(frozen=True)
class NcclRow:
    size: int  # bytes
    algbw: Optional[float]  # GB/s (1e9 B/s), out-of-place
    busbw: Optional[float]  # GB/s, out-of-place
    busbw_inplace: Optional[float]  # GB/s
    wrong: Optional[int]  # wrong elements, out-of-place + in-place; None when validation was off


@dataclass(frozen=True)
class NcclTestsReport:
    collective: Optional[str]  # all_reduce_perf ... when the output names it
    ranks: int
    rows: list[NcclRow]
    peak_busbw: Optional[float]  # GB/s, the headline figure: see peak_busbw()
    wrong: Optional[int]  # total wrong elements; None when validation was off
    out_of_bounds_ok: Optional[bool]
    min_bw_ok: Optional[bool]  # the "OK|FAILED" NCCL_TESTS_MIN_BW verdict, None when unchecked
    avg_busbw: Optional[float]  # GB/s, for the record only: never a pass criterion
    nccl_version: Optional[str]
    errors: list[str] = field(default_factory=list)
    ok: bool = False

    @property
    def largest_size(self) -> Optional[int]:
        return max((row.size for row in self.rows), default=None)


def _number(text) -> Optional[float]:
    """nccl-tests numbers: '135.8', '1e+06', 'N/A'; JSON may hold "nan" as a string."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _wrong(text) -> Optional[int]:
    value = _number(text)
    return None if value is None else int(value)


def _sum_wrong(values: list[Optional[int]]) -> Optional[int]:
    counted = [value for value in values if value is not None]
    return sum(counted) if len(counted) == len(values) else None


def _strip(line: str) -> str:
    return _MPI_PREFIX.sub("", line.rstrip("\r\n"))


def parse_nccl_tests(text: str) -> NcclTestsReport:
    """nccl-tests text output (any version) or its -J JSON document."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return _parse_json(stripped)
    return _parse_text(text)


def _placement_columns(header: str) -> tuple[int, list[str]]:
    """(leading column count, names of one placement's columns) from the '# size count ...' line."""
    names = header.lstrip("#").split()
    starts = [i for i, name in enumerate(names) if name in ("time", "cputime")]
    if len(starts) != 2:
        raise ParseError(f"nccl-tests header has {len(starts)} time columns, expected 2: {header.strip()!r}")
    return starts[0], names[starts[0]:starts[1]]


def _parse_text(text: str) -> NcclTestsReport:
    lines = [_strip(line) for line in text.splitlines()]
    header = next((line for line in lines if line.startswith("#") and "algbw" in line
                   and "busbw" in line), None)
    if header is None:
        raise ParseError("no nccl-tests table header (a '#' line naming algbw and busbw)")
    leading, placement = _placement_columns(header)
    width = len(placement)
    wrong_name = next((n for n in placement if n in ("#wrong", "error")), None)
    if "busbw" not in placement or "algbw" not in placement:
        raise ParseError(f"nccl-tests header lacks algbw/busbw per placement: {header.strip()!r}")
    collective = None
    ranks: set[int] = set()
    rows, errors = [], []
    out_of_bounds_ok = min_bw_ok = avg_busbw = version = None
    for line in lines:
        fields = line.split()
        if line.startswith("#"):
            if match := _RANK_LINE.match(line):
                ranks.add(int(match.group(1)))
            elif line.startswith("# Collective test starting:"):
                collective = line.split(":", 1)[1].strip() or None
            elif line.startswith("# Out of bounds values"):
                out_of_bounds_ok = not line.rstrip().endswith("FAILED")
            elif line.startswith("# Avg bus bandwidth"):
                value = line.split(":", 1)[1].split()
                avg_busbw = _number(value[0]) if value else None
                if len(value) > 1 and value[1] in ("OK", "FAILED"):
                    min_bw_ok = value[1] == "OK"
            elif match := _LIBRARY_CODE.search(line):
                version = version or _version_from_code(int(match.group(1)))
            if _ERROR_LINE.search(line):
                errors.append(line.strip())
            continue
        if match := _NCCL_VERSION.search(line):
            version = match.group(1)
        if _ERROR_LINE.search(line):
            errors.append(line.strip())
        if len(fields) < 2 + 2 * width or not (fields[0].isdigit() and fields[1].isdigit()):
            continue  # log lines, a truncated row, anything that is not a data row
        if len(fields) > leading + 2 * width:
            continue  # more fields than the header names: not this table's row
        out = dict(zip(placement, fields[-2 * width:-width], strict=True))
        inplace = dict(zip(placement, fields[-width:], strict=True))
        wrongs: list[Optional[int]] = ([_wrong(out.get(wrong_name)), _wrong(inplace.get(wrong_name))]
                                       if wrong_name else [None])
        rows.append(NcclRow(size=int(fields[0]), algbw=_number(out["algbw"]),
                            busbw=_number(out["busbw"]), busbw_inplace=_number(inplace["busbw"]),
                            wrong=_sum_wrong(wrongs)))
    if not rows:
        raise ParseError("nccl-tests table has no data rows")
    return _report(collective, len(ranks), rows, out_of_bounds_ok, min_bw_ok, avg_busbw, version,
                   errors)


def _version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (22809 -> 2.28.9)."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def _parse_json(text: str) -> NcclTestsReport:
    data = json_object(text, "nccl-tests -J output")
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) \
            or not isinstance(data.get("config"), dict):
        raise ParseError("not an nccl-tests -J document: no 'results' list and 'config' object")
    rows = []
    for entry in data["results"]:
        out, inplace = entry.get("out_of_place") or {}, entry.get("in_place") or {}
        rows.append(NcclRow(size=int(entry["size"]), algbw=_number(out.get("alg_bw")),
                            busbw=_number(out.get("bus_bw")), busbw_inplace=_number(inplace.get("bus_bw")),
                            wrong=_sum_wrong([_wrong(out.get("nwrong")), _wrong(inplace.get("nwrong"))])))
    if not rows:
        raise ParseError("nccl-tests -J document has no results")
    args = data.get("args") or []
    collective = args[0].rsplit("/", 1)[-1] if args else None
    bounds = data.get("out_of_bounds") or {}
    average = data.get("average_bus_bandwidth") or {}
    code = data.get("nccl_version")
    errors = [e for e in data.get("errors") or [] if isinstance(e, str) and e.strip()]
    return _report(collective, len(data["config"].get("devices") or []), rows,
                   _truth(bounds.get("okay")) if "okay" in bounds else None,
                   _truth(average.get("okay")), _number(average.get("bandwidth")),
                   _version_from_code(code) if isinstance(code, int) else None, errors)


def _truth(value) -> Optional[bool]:
    """JSON booleans arrive as true/"true"/"false"; "unchecked" means no verdict."""
    if isinstance(value, bool):
        return value
    return {"true": True, "false": False}.get(str(value).lower())


def _report(collective, ranks, rows, out_of_bounds_ok, min_bw_ok, avg_busbw, version,
            errors) -> NcclTestsReport:
    wrong = _sum_wrong([row.wrong for row in rows])
    ok = ((wrong is None or wrong == 0) and out_of_bounds_ok is not False
          and min_bw_ok is not False and not errors)
    return NcclTestsReport(collective=collective, ranks=ranks, rows=rows,
                           peak_busbw=peak_busbw(rows), wrong=wrong,
                           out_of_bounds_ok=out_of_bounds_ok, min_bw_ok=min_bw_ok,
                           avg_busbw=avg_busbw, nccl_version=version, errors=errors, ok=ok)


def peak_busbw(rows: list[NcclRow]) -> Optional[float]:
    """The run's headline busbw: the better of the two placements at the largest message size.

    This is how NCCL figures are quoted ("486.49 GB/s @16 GiB" for 2 x 8 H200, "235.26 @8 GiB"
    for 8 x A100: each run's last row): busbw climbs with the size until the links saturate,
    so the largest size the run reached says what the fabric can do, and the figure is one row
    a reader finds in the raw output. The suite judges exactly this figure and `handover parse
    nccl-tests` prints it; "Avg bus bandwidth" is never judged. None when that row has no busbw.
    """
    largest = max(rows, key=lambda row: row.size)
    values = [v for v in (largest.busbw, largest.busbw_inplace) if v is not None]
    return max(values) if values else None


def busbw_lines(rows: list[NcclRow]) -> dict:
    """busbw against size as the report's curves: the two placements as two lines (in-place
    only where the run printed it)."""
    lines = {"nccl-tests out-of-place": [(row.size, row.busbw) for row in rows if row.busbw is not None],
             "nccl-tests in-place": [(row.size, row.busbw_inplace) for row in rows
                                     if row.busbw_inplace is not None]}
    return {legend: points for legend, points in lines.items() if points}


PARSERS = {"nccl-tests": parse_nccl_tests}


def argv(collective: str, gpus: int, *, min_bytes: str = "1G", max_bytes: str = "8G") -> list[str]:
    """One process driving every local GPU (-g), data checking on (-c 1), sizes doubling."""
    return [BINARIES[collective], "-b", min_bytes, "-e", max_bytes, "-f", "2", "-g", str(gpus),
            "-c", "1"]


def present(transport: Transport) -> bool:
    """Whether all_reduce_perf is on the node's PATH."""
    found = transport.run(["sh", "-c", "command -v all_reduce_perf"], timeout=15)
    return found.ok and bool(found.stdout.strip())


# Fixed text: lists the NCCL_* environment on stderr, then runs the argv given as arguments.
_WITH_NCCL_ENV = 'env | grep "^NCCL_" | sort >&2; exec "$@"'


def run(transport: Transport, collective: str, gpus: int, *, timeout: float = 600) -> Result:
    """nccl-tests on one node; the NCCL_* environment goes to stderr, recorded beside the figure.

    NCCL_DEBUG=VERSION makes the library print its version next to the table.
    """
    return transport.run(["sh", "-c", _WITH_NCCL_ENV, "nccl-tests", *argv(collective, gpus)],
                         timeout=timeout, env={"NCCL_DEBUG": "VERSION"})


LAUNCH_DETECT_STEP = "nccl_tests_mpirun_detect"


def detect_launch(transport: Transport) -> Result:
    """Whether the node has all_reduce_perf, mpirun and srun on its PATH, and runs as root
    (runners.system.parse_programs reads it)."""
    return system.probe_programs(transport, [BINARIES["all_reduce"], MPIRUN, SRUN])


def mpirun_everywhere(cluster_run: ClusterRun, nodes: list[str]) -> Optional[dict[str, system.Programs]]:
    """Each node's programs and user when every node has all_reduce_perf and the inventory's MPI
    launcher (mpirun, or srun under engine slurm); else None (a node that did not answer counts
    as one without them)."""
    found = cluster_run.gather(LAUNCH_DETECT_STEP, detect_launch)
    detected = {}
    for node in nodes:
        if not found[node].ok:
            return None
        try:
            detected[node] = system.parse_programs(found[node].stdout)
        except ParseError:
            return None
    wanted = (BINARIES["all_reduce"], launch_program(cluster_run.cluster.launch))
    if all(d.has(program) for d in detected.values() for program in wanted):
        return detected
    return None


def across_argv(launcher: Launcher, hosts: list[str], gpus_per_node: int,
                collective: str = "all_reduce") -> list[str]:
    """One rank per GPU on every host, each driving one GPU (-g 1), started by a launcher that
    starts every rank from the first host (mpirun)."""
    if launcher.starts_on != "first":
        raise LaunchError(f"nccl-tests across nodes needs a launcher that starts every rank from "
                          f"the first host; {launcher.name} starts on {launcher.starts_on}")
    return launcher.argv(hosts, gpus_per_node, argv(collective, 1))


def run_across(transport: Transport, launcher: Launcher, hosts: list[str], gpus_per_node: int,
               collective: str = "all_reduce", *, timeout: float = 600) -> Result:
    """nccl-tests across `hosts`, launched from `transport`'s node (the first host) and bounded
    by its timeout (mpirun takes its daemons and ranks down when signalled). The launching
    node's NCCL_* environment goes to stderr, as for one node."""
    return transport.run(["sh", "-c", _WITH_NCCL_ENV, "nccl-tests",
                          *across_argv(launcher, hosts, gpus_per_node, collective)],
                         timeout=timeout, env={"NCCL_DEBUG": "VERSION"})


def nccl_env(result: Result) -> dict[str, str]:
    """The NCCL_* variables the run saw, from its stderr."""
    pairs = (line.split("=", 1) for line in result.stderr.splitlines()
             if line.startswith("NCCL_") and "=" in line)
    return {key: value for key, value in pairs}


def judge(result: Result, report: NcclTestsReport) -> str:
    """'' when the run is sane; else why not, in words (exit 7 and #wrong first)."""
    if report.wrong is None:
        return f"{result.node}: validation was off (#wrong N/A); run with -c 1"
    if report.wrong:
        return f"{result.node}: {report.wrong} wrong element(s) in the data check"
    if report.out_of_bounds_ok is False:
        return f"{result.node}: out-of-bounds values FAILED"
    if report.min_bw_ok is False:
        return f"{result.node}: average bus bandwidth below NCCL_TESTS_MIN_BW"
    if report.errors:
        return f"{result.node}: {report.errors[0]}"
    if result.exit_code == EXIT_DATA_ERRORS:
        return f"{result.node}: nccl-tests exited 7 (data errors or below NCCL_TESTS_MIN_BW)"
    if result.exit_code != 0:
        return result.explain()
    return ""
