"""HPL in three flavours: input generation, the guarded node-side run, and the pure parser.

Flavours (FLAVOURS): `hpcc` (Debian's HPC Challenge, HPL inside; the CPU path), netlib `xhpl`,
and NVIDIA's `hpl.sh` (HPL-NVIDIA, GPU nodes). Each reads its input (hpccinf.txt or HPL.dat)
from its working directory, and hpcc writes hpccoutf.txt there, so every run happens in a
directory of its own under a scratch path the inventory declares, created and removed by the
`hpl_scratch` payload. The job is started by a launcher (runners/launchers.py), bounded by the
transport's timeout.

The parser never trusts the exit code: xhpl exits 0 when the residual check FAILED, and a run
that aborts (an NCCL or MPI error) prints no result line at all; both are failures.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from inventory.model import ScratchPath
from runners import payloads, system
from runners.launchers import MPIRUN, SRUN, Launcher
from runners.parsing import ParseError
from runners.scratch import declared
from runners.transport import Result, Transport, short_command

FLAVOURS = ("hpl-nvidia", "xhpl", "hpcc")  # in the order detection prefers them
PROGRAMS = {"hpl-nvidia": "hpl.sh", "xhpl": "xhpl", "hpcc": "hpcc"}
INPUT_FILES = {"hpl-nvidia": "HPL.dat", "xhpl": "HPL.dat", "hpcc": "hpccinf.txt"}
OUTPUT_FILES = {"hpcc": "hpccoutf.txt"}  # the others print their results on stdout
DEFAULT_NB = {"hpl-nvidia": 1024, "xhpl": 192, "hpcc": 192}
THRESHOLD = 16.0  # HPL's usual bound on the scaled residual
DOUBLE_BYTES = 8


# The longest an HPL job may run, per depth, whatever N suggests (see timeout_for).
QUICK_TIMEOUT_CAP_S = 15 * 60  # a fixed small N: minutes at most
FULL_TIMEOUT_CAP_S = 4 * 60 * 60  # half of memory: a healthy run on 2 TiB at 3-5 Tflop/s is 2-3 h


@dataclass(frozen=True)
class Depth:
    """How big a run is: `quick` a fixed small N (seconds), `full` a fraction of memory."""

    name: str
    fixed_n: Optional[int]  # quick: this N (capped by memory); full: None
    memory_fraction: float  # of the memory the matrix may fill
    timeout_s: float  # beyond the estimated solve time
    min_gflops_per_rank: float  # pessimistic rate, only to size the timeout
    timeout_cap_s: float  # the longest the run may take, whatever the estimate


# hpcc runs its whole suite (RandomAccess alone is bounded at 60 s per variant), hence margins.
QUICK = Depth("quick", fixed_n=2000, memory_fraction=0.05, timeout_s=240, min_gflops_per_rank=0.05,
              timeout_cap_s=QUICK_TIMEOUT_CAP_S)
FULL = Depth("full", fixed_n=None, memory_fraction=0.5, timeout_s=900, min_gflops_per_rank=0.5,
             timeout_cap_s=FULL_TIMEOUT_CAP_S)
DEPTHS = {depth.name: depth for depth in (QUICK, FULL)}


@dataclass(frozen=True)
class HplInput:
    n: int
    nb: int
    p: int
    q: int
    threshold: float = THRESHOLD


def grid(ranks: int) -> tuple[int, int]:
    """The most nearly square P x Q = ranks with P <= Q, as HPL runs best."""
    if ranks < 1:
        raise ValueError(f"HPL needs at least one rank, got {ranks}")
    p = max(d for d in range(1, math.isqrt(ranks) + 1) if ranks % d == 0)
    return p, ranks // p


def problem_size(memory_bytes: int, fraction: float, nb: int) -> int:
    """The largest N, a multiple of NB, whose N x N doubles fill `fraction` of `memory_bytes`."""
    n = math.isqrt(int(memory_bytes * fraction) // DOUBLE_BYTES)
    return max(nb, n // nb * nb)


def plan_input(depth: Depth, memory_bytes: int, ranks: int, nb: int) -> HplInput:
    """N from the memory of the nodes taking part; quick uses its small N unless memory is shorter."""
    largest = problem_size(memory_bytes, depth.memory_fraction, nb)
    n = min(largest, max(nb, depth.fixed_n // nb * nb)) if depth.fixed_n else largest
    return HplInput(n, nb, *grid(ranks))


def estimated_timeout(depth: Depth, hpl_input: HplInput) -> float:
    """The depth's margin plus the solve time at the pessimistic rate per rank, uncapped."""
    ranks = hpl_input.p * hpl_input.q
    flops = 2 / 3 * hpl_input.n ** 3
    return depth.timeout_s + flops / (depth.min_gflops_per_rank * 1e9 * ranks)


def timeout_for(depth: Depth, hpl_input: HplInput) -> float:
    """The node-side timeout: the estimate, at most the depth's cap (QUICK/FULL_TIMEOUT_CAP_S).

    The estimate uses a deliberately pessimistic rate per rank, so that it never cuts a healthy
    run short; where N fills half of a large memory it grows to hours or days (2 TiB and 224 CPU
    ranks: about 84 h). A hung or crawling job must not hold an acceptance run that long: past
    the cap the check fails as a timeout whose message names the cap (timeout_cap_note), and the
    operator chooses a smaller N or a longer cap knowingly.
    """
    return min(estimated_timeout(depth, hpl_input), depth.timeout_cap_s)


def timeout_cap_note(depth: Depth, hpl_input: HplInput) -> str:
    """What a timeout message adds when the cap, not the estimate, set the timeout; else ''."""
    estimate = estimated_timeout(depth, hpl_input)
    if estimate <= depth.timeout_cap_s:
        return ""
    return (f"the {depth.name} depth caps HPL at {depth.timeout_cap_s / 3600:g} h "
            f"(estimate for N={hpl_input.n} on {hpl_input.p * hpl_input.q} rank(s): "
            f"{estimate / 3600:.1f} h); choose a smaller N or a longer cap")


_HPL_DAT = """HPLinpack benchmark input file
Innovative Computing Laboratory, University of Tennessee
HPL.out      output file name (if any)
{device:<12} device out (6=stdout,7=stderr,file)
1            # of problems sizes (N)
{n:<12} Ns
1            # of NBs
{nb:<12} NBs
0            PMAP process mapping (0=Row-,1=Column-major)
1            # of process grids (P x Q)
{p:<12} Ps
{q:<12} Qs
{threshold:<12} threshold
1            # of panel fact
2            PFACTs (0=left, 1=Crout, 2=Right)
1            # of recursive stopping criterium
4            NBMINs (>= 1)
1            # of panels in recursion
2            NDIVs
1            # of recursive panel fact.
1            RFACTs (0=left, 1=Crout, 2=Right)
1            # of broadcast
1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)
1            # of lookahead depth
1            DEPTHs (>=0)
2            SWAP (0=bin-exch,1=long,2=mix)
64           swapping threshold
0            L1 in (0=transposed,1=no-transposed) form
0            U  in (0=transposed,1=no-transposed) form
1            Equilibration (0=no,1=yes)
8            memory alignment in double (> 0)
"""

# hpcc reads PTRANS's sizes after HPL's lines; none beyond HPL's own, as in Debian's sample.
_HPCC_TAIL = """##### This line (no. 32) is ignored (it serves as a separator). ######
0                               Number of additional problem sizes for PTRANS
1200 10000 30000                values of N
0                               number of additional blocking sizes for PTRANS
40 9 8 13 13 20 16 32 64        values of NB
"""


def hpl_dat(hpl_input: HplInput) -> str:
    """HPL.dat for xhpl and HPL-NVIDIA: one N, one NB, one grid, results on stdout."""
    return _HPL_DAT.format(device=6, threshold=f"{hpl_input.threshold:g}", n=hpl_input.n,
                           nb=hpl_input.nb, p=hpl_input.p, q=hpl_input.q)


def hpccinf(hpl_input: HplInput) -> str:
    """hpccinf.txt: HPL.dat's lines (hpcc sends them to hpccoutf.txt) and PTRANS's."""
    return _HPL_DAT.format(device=8, threshold=f"{hpl_input.threshold:.1f}", n=hpl_input.n,
                           nb=hpl_input.nb, p=hpl_input.p, q=hpl_input.q) + _HPCC_TAIL


def input_text(flavour: str, hpl_input: HplInput) -> str:
    return hpccinf(hpl_input) if flavour == "hpcc" else hpl_dat(hpl_input)


def program_argv(flavour: str) -> list[str]:
    """What each rank runs; HPL-NVIDIA's script is told where its HPL.dat is."""
    if flavour == "hpl-nvidia":
        return [PROGRAMS[flavour], "--dat", INPUT_FILES[flavour]]
    return [PROGRAMS[flavour]]


def command(flavour: str, launcher: Launcher, hosts: Sequence[str], ranks_per_node: int) -> list[str]:
    """The launcher's argv that runs `flavour` with ranks_per_node ranks on every host."""
    return launcher.argv(hosts, ranks_per_node, program_argv(flavour))


# ---------------------------------------------------------------- node side


def detect(transport: Transport) -> Result:
    """Which HPL programs and mpirun the node has, and whether the user is root
    (runners.system.parse_programs reads it)."""
    return system.probe_programs(transport, [*PROGRAMS.values(), MPIRUN, SRUN])


def run_on_scratch(transport: Transport, path: str, scratch: Sequence[ScratchPath], flavour: str,
                   hpl_input: HplInput, argv: Sequence[str], timeout: float) -> Result:
    """Run `argv` in a fresh directory under the declared scratch `path`, with the flavour's
    input file in it; stdout is the HPL output (hpcc's hpccoutf.txt, else the program's own)."""
    entry = declared(path, scratch)
    spec = {"node": transport.node.name, "path": entry.path,
            "files": {INPUT_FILES[flavour]: input_text(flavour, hpl_input)},
            "output": OUTPUT_FILES.get(flavour), "argv": list(argv)}
    label = f"{short_command(argv)} ({INPUT_FILES[flavour]} inline, via hpl_scratch)"
    return transport.run_script(payloads.load("hpl_scratch"), [json.dumps(spec)], timeout=timeout,
                                label=label)


# ---------------------------------------------------------------- parsing


@dataclass(frozen=True)
class HplResult:
    tv: str  # encoded variant, e.g. WR11C2R4 (netlib), WC0 (HPL-NVIDIA)
    n: int
    nb: int
    p: int
    q: int
    time: float  # s
    gflops: float  # Gflop/s of the whole job
    residual: Optional[float]  # scaled residual; None when the check line is missing
    passed: bool  # the residual line says PASSED
    gflops_per_gpu: Optional[float] = None  # HPL-NVIDIA only


@dataclass(frozen=True)
class HplRun:
    flavour: str  # hpcc, hpl-nvidia or xhpl
    version: Optional[str]  # hpcc's, HPL-NVIDIA's or HPLinpack's own, from its banner
    results: list[HplResult]
    threshold: Optional[float]  # the residual bound the run used
    success: Optional[bool]  # hpcc's summary Success=1; None for xhpl and HPL-NVIDIA
    hpl_tflops: Optional[float]  # hpcc's summary HPL_Tflops (Tflop/s, not Gflop/s)
    problems: list[str] = field(default_factory=list)
    ok: bool = False

    @property
    def best_gflops(self) -> Optional[float]:
        passed = [result.gflops for result in self.results if result.passed]
        return max(passed) if passed else None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")  # mpirun --tag-output
_HEADER = re.compile(r"^T/V\s+N\s+NB\s+P\s+Q\s+Time\s+Gflops\b")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RESULT = re.compile(rf"^(W\S*)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+({_NUMBER})\s+({_NUMBER})"
                     rf"(?:\s+\(\s*({_NUMBER})\s*\))?\s*$")
_RESIDUAL = re.compile(r"^\|\|Ax-b\|\|_oo\s*/\s*\(\s*eps\s*\*.*\)\s*=\s*(\S+)\s+\.+\s+(PASSED|FAILED)\b")
_THRESHOLD = re.compile(rf"scaled residuals are less than\s+({_NUMBER})")
_FAILED_COUNT = re.compile(r"^\s*(\d+) tests completed and failed residual checks")
_BANNER = re.compile(r"HPLinpack\s+\d+(?:\.\d+)*\s+--")
_SUMMARY = re.compile(r"^Begin of Summary section\.\s*$(.*?)^End of Summary section\.", re.M | re.S)


def _clean_lines(text: str) -> list[str]:
    return [_MPI_TAG.sub("", _ANSI.sub("", line)).strip() for line in text.splitlines()]


def _flavour(text: str) -> str:
    if "HPC Challenge" in text or "Begin of Summary section." in text:
        return "hpcc"
    if "HPL-NVIDIA" in text:
        return "hpl-nvidia"
    return "xhpl"


_VERSIONS = {"hpcc": re.compile(r"HPC Challenge Benchmark version (\S+)"),
             "hpl-nvidia": re.compile(r"HPL-NVIDIA (\S+)"),
             "xhpl": re.compile(r"HPLinpack (\d+(?:\.\d+)*)")}


def _version(flavour: str, text: str) -> Optional[str]:
    match = _VERSIONS[flavour].search(text)
    return match.group(1) if match else None


def _residual(value: str) -> Optional[float]:
    try:
        return float(value)
    except ValueError:  # HPL prints nan or garbage when the solve blew up
        return None


def _hpcc_summary(text: str) -> dict[str, str]:
    match = _SUMMARY.search(text)
    if not match:
        return {}
    pairs = (line.split("=", 1) for line in match.group(1).splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def parse_hpl(text: str) -> HplRun:
    """xhpl's, HPL-NVIDIA's or hpcc's (hpccoutf.txt) output into results and a sanity verdict."""
    lines = _clean_lines(text)
    clean = "\n".join(lines)
    if not _BANNER.search(clean) and not any(_HEADER.match(line) for line in lines):
        raise ParseError("no HPLinpack banner and no 'T/V N NB P Q Time Gflops' header "
                         "(expected xhpl, HPL-NVIDIA or hpcc's hpccoutf.txt)")
    flavour = _flavour(clean)
    results: list[dict] = []
    in_table = False
    failed_count = 0
    for line in lines:
        if _HEADER.match(line):
            in_table = True
            continue
        match = _RESULT.match(line) if in_table else None
        if match:
            tv, n, nb, p, q, time, gflops, per_gpu = match.groups()
            results.append({"tv": tv, "n": int(n), "nb": int(nb), "p": int(p), "q": int(q),
                            "time": float(time), "gflops": float(gflops), "residual": None,
                            "passed": False,
                            "gflops_per_gpu": float(per_gpu) if per_gpu else None})
            in_table = False
            continue
        match = _RESIDUAL.match(line)
        if match and results and results[-1]["residual"] is None and not results[-1]["passed"]:
            results[-1].update(residual=_residual(match.group(1)), passed=match.group(2) == "PASSED")
            continue
        match = _FAILED_COUNT.match(line)
        if match:
            failed_count += int(match.group(1))
    threshold = _THRESHOLD.search(clean)
    summary = _hpcc_summary(clean) if flavour == "hpcc" else {}
    run = [HplResult(**result) for result in results]
    problems = _problems(run, failed_count, summary)
    return HplRun(
        flavour=flavour, version=_version(flavour, clean), results=run,
        threshold=float(threshold.group(1)) if threshold else None,
        success={"1": True, "0": False}.get(summary.get("Success") or "") if summary else None,
        hpl_tflops=_float_or_none(summary.get("HPL_Tflops")),
        problems=problems, ok=not problems)


def _float_or_none(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _problems(results: list[HplResult], failed_count: int, summary: dict[str, str]) -> list[str]:
    """Why the run is not sane, in the report's words; empty when it is."""
    problems = []
    if not results:
        problems.append("no HPL result: no T/V result line was printed (the run aborted "
                        "before the solve finished)")
    for result in results:
        label = f"{result.tv} N={result.n} NB={result.nb} {result.p}x{result.q}"
        if result.residual is None and not result.passed:
            problems.append(f"{label}: the scaled residual check did not say PASSED "
                            "(no residual line, or no number in it)")
        elif not result.passed:
            problems.append(f"{label}: scaled residual {result.residual:g} FAILED")
    if failed_count and not any(not result.passed for result in results):
        problems.append(f"{failed_count} test(s) completed and failed residual checks")
    if summary and summary.get("Success") != "1":
        problems.append(f"hpcc summary says Success={summary.get('Success', '(missing)')}: "
                        "a test of the suite failed")
    return problems


PARSERS = {"hpl": parse_hpl}
