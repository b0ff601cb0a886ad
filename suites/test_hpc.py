"""HPC: HPL per node (quick: a small N on two ranks, via mpirun) and across all nodes (full,
via the inventory's launcher: mpirun, or srun under `launch: {engine: slurm}`); cuBLAS GEMM and
cuFFT throughput per GPU (quick).

The flavour is the profile's `hpl_flavour`, else the first one found on the node: HPL-NVIDIA's
hpl.sh (GPU profiles only), netlib xhpl, Debian's hpcc. Sanity first: a result exists and its
scaled residual says PASSED (hpcc: also Success=1); then `hpl_gflops` against the profile's
band, and as a percentage of the node's FP64 peak when the profile gives `fp64_peak_tflops`.
HPL runs in a directory of its own under a declared scratch path (it reads its input from, and
hpcc writes its output to, its working directory); without one the check skips.

GEMM (bf16, fp16, tf32, fp32, fp64) and batched 2D complex FFT: the torch payload measures every
GPU in turn; each check judges the node's slowest GPU against the profile and names every GPU's
figure in the note. Without CUDA it measures the CPU with small shapes (fp32, fp64, FFT; the
reduced precisions skip as not measured on CPU), which a profile expecting GPUs fails; without
torch the checks skip on cpu-only and fail where the profile expects GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pytest

from handover.failures import ExpectationFailure, SanityFailure, excerpt
from runners import gemm_fft, hpl, system
from runners.launchers import MPIRUN, MpirunLauncher, launch_program
from runners.parsing import ParseError
from runners.transport import Result, Transport
from suites.checks import parsed, require, require_launchable, require_scratch_run

pytestmark = [pytest.mark.hpc]

SYSTEM_STEP = "system_facts"  # test_system's probe, shared: an unreachable node fails, not skips
DETECT_STEP = "hpl_detect"
QUICK_RANKS = 2  # per node on CPUs: small and quick, and it still exercises MPI
NO_SCRATCH = ("no scratch path declared: HPL reads its input from (and hpcc writes its output "
              "to) its working directory, and the harness writes only in declared scratch")


@dataclass(frozen=True)
class Plan:
    """One HPL job: which flavour, what input, and the argv that launches it."""

    flavour: str
    hpl_input: hpl.HplInput
    argv: list[str]
    timeout: float
    scratch: str
    timeout_note: str = ""  # hpl.timeout_cap_note: set when the depth's cap set the timeout


def scratch_path(cluster, prefer: str) -> Optional[str]:
    """The declared scratch path HPL runs in: one of kind `prefer` if any, else the first."""
    ordered = sorted(cluster.scratch, key=lambda entry: entry.kind != prefer)
    return ordered[0].path if ordered else None


def choose_flavour(profile, detected: system.Programs, node: str, launcher: str = MPIRUN) -> str:
    """The profile's flavour (its absence a failure), else the first installed; none: skip.
    `launcher` (mpirun or srun) must be there too."""
    wanted = profile.expect.hpl_flavour
    if wanted:
        for program in (hpl.PROGRAMS[wanted], launcher):
            if not detected.has(program):
                raise ExpectationFailure(f"{node}: profile {profile.name} runs HPL as {wanted}, "
                                         f"but {program} is not on the node's PATH")
        return wanted
    candidates = [f for f in hpl.FLAVOURS if f != "hpl-nvidia" or profile.expect.gpu_count]
    found = [f for f in candidates if detected.has(hpl.PROGRAMS[f])]
    if not found:
        pytest.skip("no HPL program on the node (looked for "
                    f"{', '.join(hpl.PROGRAMS[f] for f in candidates)})")
    if not detected.has(launcher):
        pytest.skip(f"{hpl.PROGRAMS[found[0]]} is installed but {launcher} is not")
    return found[0]


def ranks_per_node(flavour: str, profile, depth: hpl.Depth, logical_cpus: int) -> int:
    if flavour == "hpl-nvidia":
        return profile.expect.gpu_count or 1
    return QUICK_RANKS if depth is hpl.QUICK else logical_cpus


def make_plan(cluster_run, cluster, profile, depth: hpl.Depth, flavour: str, detected: system.Programs,
              hosts: list, ranks: int, memory_bytes: int, logical_cpus: int, scratch: str) -> Plan:
    """One node: mpirun on its loopback; across nodes: the inventory's launcher (ClusterRun)."""
    nb = profile.expect.hpl_nb or hpl.DEFAULT_NB[flavour]
    hpl_input = hpl.plan_input(depth, memory_bytes, ranks * len(hosts), nb)
    timeout = hpl.timeout_for(depth, hpl_input)
    interfaces = (cluster.launch_interface,) if cluster.launch_interface else ()
    if len(hosts) > 1:
        launcher = cluster_run.mpi_launcher(hosts[0], as_root=detected.root,
                                            oversubscribe=ranks > logical_cpus, interfaces=interfaces,
                                            timeout=timeout)
        addresses = launcher.hosts([cluster.node(name) for name in hosts])
    else:
        launcher = MpirunLauncher(ssh=cluster.nodes[0].ssh, as_root=detected.root,
                                  oversubscribe=ranks > logical_cpus, interfaces=interfaces)
        addresses = ["localhost"]
    return Plan(flavour, hpl_input, hpl.command(flavour, launcher, addresses, ranks),
                timeout, scratch, hpl.timeout_cap_note(depth, hpl_input))


def not_run(node: str, why: str) -> Result:
    """The step's entry for a node the job does not run on (it skipped, or another node leads)."""
    return Result(node, "hpl (not run)", None, "", why, 0.0, failure="error", detail=why)


def run_plan(transport: Transport, plan: Plan, cluster) -> Result:
    return hpl.run_on_scratch(transport, plan.scratch, cluster.scratch, plan.flavour,
                              plan.hpl_input, plan.argv, plan.timeout)


def node_plan(cluster_run, cluster, profile, node: str) -> Plan:
    """This node's quick plan, or the skip/failure that says why it has none."""
    facts = parsed(system.parse_system_facts, cluster_run.gather(SYSTEM_STEP, system.probe)[node])
    detected = parsed(system.parse_programs, cluster_run.gather(DETECT_STEP, hpl.detect)[node])
    flavour = choose_flavour(profile, detected, node)
    scratch = scratch_path(cluster, "local")
    if scratch is None:
        pytest.skip(NO_SCRATCH)
    return make_plan(cluster_run, cluster, profile, hpl.QUICK, flavour, detected, [node],
                     ranks_per_node(flavour, profile, hpl.QUICK, facts.logical_cpus),
                     facts.memory_total_kib * 1024, facts.logical_cpus, scratch)


def quick_step(cluster_run, cluster, profile) -> tuple[str, Callable[[Transport], Result]]:
    def run(transport: Transport) -> Result:
        name = transport.node.name
        try:
            plan = node_plan(cluster_run, cluster, profile, name)
        except (AssertionError, pytest.skip.Exception) as reason:
            return not_run(name, str(reason))
        return run_plan(transport, plan, cluster)

    return "hpl_quick", run


def sane(result: Result, timeout_note: str = "") -> hpl.HplRun:
    """The HPL figures, once the run is known good: refusal, missing tool, result, residual.
    A timeout the depth's cap set says so (timeout_note)."""
    require_scratch_run(result, "refused to run HPL", timeout_note=timeout_note)
    try:
        run = hpl.parse_hpl(result.stdout)
    except ParseError as exc:
        require(result)
        raise SanityFailure(f"{result.node}: {exc}", excerpt(result.stderr or result.stdout)) from None
    if not run.ok:
        raise SanityFailure(f"{result.node}: {run.flavour}: {'; '.join(run.problems)}",
                            excerpt(result.stdout + result.stderr))
    require(result)
    return run


def judge(run: hpl.HplRun, profile, metrics, nodes: int, prefix: str) -> str:
    """Record Gflop/s (and the fraction of peak) and return the note's figures."""
    gflops = run.best_gflops
    measured = {f"{prefix}_gflops": (round(gflops, 3), "Gflop/s")}
    note = f"{gflops:,.2f} Gflop/s"
    peak = profile.expect.fp64_peak_tflops
    if peak:
        fraction = 100 * gflops / (peak * 1000 * nodes)
        measured[f"{prefix}_peak_fraction"] = (round(fraction, 2), "%")
        note += f" ({fraction:.1f} % of {peak * nodes:g} Tflop/s FP64 peak)"
    metrics.judge(**measured)
    return note


def describe(run: hpl.HplRun) -> str:
    result = max((r for r in run.results if r.passed), key=lambda r: r.gflops)
    return (f"{run.flavour} {run.version or ''}".strip() + f", N={result.n} NB={result.nb} "
            f"{result.p}x{result.q}, {result.time:g} s, residual {result.residual:g}")


@pytest.mark.quick
def test_hpl(on_node, cluster_run, cluster, profile, node, acceptance, metrics, record):
    """HPL on each node alone, small N: the FP64 path, MPI and the residual check work."""
    require(on_node(SYSTEM_STEP, system.probe))
    plan = node_plan(cluster_run, cluster, profile, node)  # skips or fails before any run
    run = sane(on_node(*quick_step(cluster_run, cluster, profile)), plan.timeout_note)
    acceptance.record_tool(node, run.flavour, run.version or "unknown")
    record.note(f"{describe(run)}: " + judge(run, profile, metrics, 1, "hpl"))


@pytest.mark.full
@pytest.mark.cluster
def test_hpl_cluster(cluster_run, cluster, profile, metrics, record):
    """One HPL job across every selected node, N from their memory, started on the first node by
    the inventory's launcher (mpirun, or srun under `launch: {engine: slurm}`)."""
    answers = cluster_run.gather(SYSTEM_STEP, system.probe)
    detections = cluster_run.gather(DETECT_STEP, hpl.detect)
    names = [node.name for node in cluster_run.nodes]
    facts = {name: parsed(system.parse_system_facts, answers[name]) for name in names}
    detected = {name: parsed(system.parse_programs, detections[name]) for name in names}
    launcher = launch_program(cluster.launch) if len(names) > 1 else MPIRUN
    flavours = {name: choose_flavour(profile, detected[name], name, launcher) for name in names}
    if len(set(flavours.values())) > 1:
        raise ExpectationFailure("nodes have different HPL programs: " + ", ".join(
            f"{name} {flavour}" for name, flavour in flavours.items()))
    scratch = scratch_path(cluster, "shared")
    if scratch is None:
        pytest.skip(NO_SCRATCH)
    flavour, first = flavours[names[0]], names[0]
    step = f"hpl_full_{len(names)}_nodes"
    require_launchable(cluster_run, names, step)
    cpus = min(f.logical_cpus for f in facts.values())
    plan = make_plan(cluster_run, cluster, profile, hpl.FULL, flavour, detected[first], names,
                     ranks_per_node(flavour, profile, hpl.FULL, cpus),
                     min(f.memory_total_kib for f in facts.values()) * 1024 * len(names),
                     cpus, scratch)
    results = cluster_run.gather(
        step,
        lambda t: run_plan(t, plan, cluster) if t.node.name == first
        else not_run(t.node.name, f"the job runs from {first}"))
    run = sane(results[first], plan.timeout_note)
    record.note(f"{len(names)} node(s) from {first}: {describe(run)}: "
                + judge(run, profile, metrics, len(names), "hpl_cluster"))


GEMM_FFT_STEP = "gemm_fft"


def gemm_fft_step(profile) -> Callable[[Transport], Result]:
    timeout = gemm_fft.GPU_TIMEOUT_S if profile.expect.gpu_count else gemm_fft.CPU_TIMEOUT_S
    return lambda transport: gemm_fft.run(transport, timeout=timeout)


def measured(on_node, profile, node: str) -> gemm_fft.GemmFftReport:
    """The node's GEMM/FFT figures, once it is known they are the GPUs' the profile expects."""
    report = parsed(gemm_fft.parse_gemm_fft, on_node(GEMM_FFT_STEP, gemm_fft_step(profile)))
    expected = profile.expect.gpu_count
    if report.torch is None:
        why = f"{node}: {report.torch_error or 'torch cannot be imported'} (the payload needs torch)"
        if expected:
            raise ExpectationFailure(f"{why}; profile {profile.name} needs GEMM and FFT measured "
                                     "on its GPUs")
        pytest.skip(why)
    if expected and report.device != "cuda":
        raise ExpectationFailure(f"{node}: torch {report.torch} sees no CUDA device, but profile "
                                 f"{profile.name} expects {expected} GPU(s)")
    if expected and len(report.devices) != expected:
        raise ExpectationFailure(f"{node}: the payload measured {len(report.devices)} GPU(s), "
                                 f"profile {profile.name} expects {expected}")
    return report


def gemm_check(dtype: str, on_node, profile, node, metrics, record) -> None:
    """Sanity of every device's dtype GEMM, then the slowest device's TFLOP/s against the profile."""
    report = measured(on_node, profile, node)
    problems = [device.problem(dtype) for device in report.devices if device.problem(dtype)]
    if problems:
        raise SanityFailure("; ".join(problems))
    slowest = report.slowest(dtype)
    if slowest is None:
        reasons = sorted({d.not_measured.get(dtype, "") for d in report.devices} - {""})
        pytest.skip(f"{node}: {dtype} GEMM {', '.join(reasons) or 'not measured'}")
    n = report.gemm_size
    record.note(f"{dtype} GEMM {n}x{n}x{n}: " + gemm_fft.per_device(
        report, slowest, lambda device: device.gemm_tflops[dtype], "TFLOP/s", 4))
    metrics.judge(**{f"gemm_{dtype}_tflops": (round(slowest.gemm_tflops[dtype], 4), "TFLOP/s")})


@pytest.mark.quick
def test_gemm_bf16(on_node, profile, node, metrics, record):
    """bf16 GEMM (tensor cores), the precision training runs in."""
    gemm_check("bf16", on_node, profile, node, metrics, record)


@pytest.mark.quick
def test_gemm_fp16(on_node, profile, node, metrics, record):
    """fp16 GEMM (tensor cores), the precision much inference runs in."""
    gemm_check("fp16", on_node, profile, node, metrics, record)


@pytest.mark.quick
def test_gemm_tf32(on_node, profile, node, metrics, record):
    """fp32 inputs on tensor cores (torch.backends.cuda.matmul.allow_tf32 on)."""
    gemm_check("tf32", on_node, profile, node, metrics, record)


@pytest.mark.quick
def test_gemm_fp32(on_node, profile, node, metrics, record):
    """IEEE fp32 (allow_tf32 off): the CUDA cores' rate."""
    gemm_check("fp32", on_node, profile, node, metrics, record)


@pytest.mark.quick
def test_gemm_fp64(on_node, profile, node, metrics, record):
    """fp64 GEMM, the HPC precision HPL leans on."""
    gemm_check("fp64", on_node, profile, node, metrics, record)


@pytest.mark.quick
def test_fft(on_node, profile, acceptance, node, metrics, record):
    """Batched 2D complex64 FFT (cuFFT), GFLOP/s at 5 N log2 N per transform; records torch's
    version (every check here reads the same run)."""
    report = measured(on_node, profile, node)
    acceptance.record_tool(node, "torch", report.torch)
    problems = [device.fft_problem() for device in report.devices if device.fft_problem()]
    if problems:
        raise SanityFailure("; ".join(problems))
    slowest = report.slowest_fft()
    batch, nx, ny = report.fft_shape
    record.note(f"{batch} x {nx}x{ny} complex64 FFT: " + gemm_fft.per_device(
        report, slowest, lambda device: device.fft_c64_gflops, "GFLOP/s", 5))
    metrics.judge(fft_c64_gflops=(round(slowest.fft_c64_gflops, 3), "GFLOP/s"))
