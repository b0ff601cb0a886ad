"""Hardware: GPU health and configuration through NVML, kernel-log Xids, stress-ng, DCGM,
GPU burn with a silent-data-corruption check, HBM and PCIe bandwidth.

A node without NVML skips the GPU checks on a profile that expects no GPUs (no `gpu_count`),
and fails them on a GPU profile: a GPU node whose driver cannot be reached is not deliverable.
Every check is `quick` except the long burn (`full`). Burn lengths in seconds come from the
environment: HANDOVER_GPU_BURN_S (quick, default 60) and HANDOVER_GPU_BURN_FULL_S (default 600).
The kernel log is read last, so Xids the burn and bandwidth runs caused fall in this run's window.
"""
from __future__ import annotations

import os

import pytest

from handover.failures import ExpectationFailure, PerformanceFailure, SanityFailure, excerpt
from runners import burn, dcgmi, nvidia_smi, nvml, stress_ng
from runners.parsing import ParseError
from suites.checks import (
    Metrics,
    describe_kernel_events,
    fail_on_critical_kernel_events,
    kernel_log_of,
    odd_ones_out,
    parsed,
    require,
)

pytestmark = [pytest.mark.hardware]
quick = pytest.mark.quick

GPU_STEP = "gpu_facts"
STRESS_STEP = "stress_ng"
KERNEL_STEP = "kernel_log"
DCGM_STEP = "dcgmi_diag"
BURN_STEP = "gpu_burn"
BURN_FULL_STEP = "gpu_burn_full"
BANDWIDTH_STEP = "gpu_bandwidth"
TOPOLOGY_STEP = "nvidia_smi_topo"
GIB_PER_MIB = 1 / 1024


def gpu_facts_of(on_node, profile) -> nvml.GpuFacts:
    """This node's NVML facts; skip or fail (by profile) when the node has no NVML."""
    facts = parsed(nvml.parse_gpu_facts, on_node(GPU_STEP, nvml.probe))
    if not facts.available:
        expected = profile.expect.gpu_count
        if expected:
            raise ExpectationFailure(f"profile {profile.name} expects {expected} GPU(s), but "
                                     f"{facts.reason}")
        pytest.skip(facts.reason)
    return facts


# What to do next where the check knows the part (handover.failures.ACTIONS has the rest).
GPU_MISSING = "reseat the GPU(s) named (or power-cycle the node); a GPU still missing or wrong: replace it (RMA)"
PCIE_LINK = ("reseat the GPU (and its riser or cable); a link still degraded: replace the GPU or the "
             "baseboard (RMA)")
NVLINK = "reset the GPUs (nvidia-smi -r) or reboot; NVLinks still down: replace the GPU or the baseboard (RMA)"
DCGM = "run dcgmi diag -r 3 again; a GPU that fails it again: replace the GPU (RMA)"
BURN = ("a GPU whose results differ bit for bit: replace it (RMA); one that throttles or is slow: check its "
        "cooling and power, then re-run")


def fail_on(problems: list[str], kind=ExpectationFailure, action: str = "") -> None:
    if problems:
        raise kind("; ".join(problems), action=action)


@quick
def test_gpu_inventory(on_node, profile, acceptance, node, record, metrics):
    facts = gpu_facts_of(on_node, profile)
    acceptance.record_tool(node, "nvidia-driver", facts.driver)
    models = sorted({gpu.name for gpu in facts.gpus})
    firmware = nvml.firmware_set(facts)
    record.note(f"{len(facts.gpus)} GPU(s): {', '.join(models) or 'none'}; driver {facts.driver}, "
                f"CUDA driver {facts.cuda_driver}, VBIOS {firmware['VBIOS']}, InfoROM "
                f"{firmware['InfoROM']}; serials {', '.join(g.serial for g in facts.gpus)}")
    fail_on(nvml.inventory_problems(facts, profile.expect), action=GPU_MISSING)
    sizes = [gpu.memory_total_mib for gpu in facts.gpus if gpu.memory_total_mib is not None]
    smallest = round(min(sizes) * GIB_PER_MIB, 2) if sizes else None
    metrics.judge(gpu_memory=(smallest, "GiB"))


@quick
def test_gpu_ecc(on_node, profile, record):
    facts = gpu_facts_of(on_node, profile)
    problems, warnings = nvml.ecc_problems(facts, profile.expect)
    record.note("; ".join(["WARNING: " + w for w in warnings])
                or f"ECC clean on {len(facts.gpus)} GPU(s)")
    fail_on(problems, action=nvml.ecc_action(problems))


@quick
def test_gpu_pcie(on_node, profile, record):
    """Link capability as the profile says, and the link running at it while the GPU is busy."""
    facts = gpu_facts_of(on_node, profile)
    problems, notes = nvml.pcie_problems(facts, profile.expect)
    capable = sorted({f"Gen{g.pcie_gen_max} x{g.pcie_width_max}" for g in facts.gpus})
    running = sorted({"Gen{} x{}".format(*nvml.running_link(g)) for g in facts.gpus})
    replays = sum(g.pcie_replay or 0 for g in facts.gpus)
    record.note(f"capable of {', '.join(capable)}; running {', '.join(running)}; {replays} replay(s)"
                + ("; " + "; ".join(notes) if notes else ""))
    fail_on(problems, action=PCIE_LINK)


@quick
def test_gpu_nvlink(on_node, profile, record):
    facts = gpu_facts_of(on_node, profile)
    active = [g.nvlink_active or 0 for g in facts.gpus]
    record.note(f"active NVLinks per GPU: {active}")
    fail_on(nvml.nvlink_problems(facts, profile.expect), action=NVLINK)


@quick
def test_gpu_modes(on_node, profile, record):
    facts = gpu_facts_of(on_node, profile)
    record.note(f"{len(facts.gpus)} GPU(s) checked for persistence, MIG, compute mode, power limit")
    fail_on(nvml.mode_problems(facts, profile.expect))


@quick
def test_gpu_topology(on_node, profile, node, record):
    """`nvidia-smi topo -m`: NV<links> between every GPU pair where the profile expects NVLink."""
    gpu_facts_of(on_node, profile)
    if not profile.expect.nvlink_links:
        pytest.skip(f"profile {profile.name} expects no NVLink between GPUs (no `nvlink_links`)")
    topology = parsed(nvidia_smi.parse_topo, on_node(TOPOLOGY_STEP, nvidia_smi.topo))
    pairs = {topology.links[a][b] for i, a in enumerate(topology.gpus) for b in topology.gpus[i + 1:]}
    record.note(f"{len(topology.gpus)} GPU(s); GPU pairs joined by {', '.join(sorted(pairs)) or 'nothing'}; "
                f"NUMA affinity {','.join(topology.numa_affinity.values())}")
    fail_on([f"{node}: {problem}" for problem in nvidia_smi.nvlink_pair_problems(topology, profile.expect)],
            action=NVLINK)


@quick
@pytest.mark.cluster
def test_gpu_uniformity(cluster_run, record):
    """Same driver, VBIOS and InfoROM set on every node with NVML; odd ones out are named, and
    so are nodes whose own GPUs run different VBIOS or InfoROM versions."""
    sets, every = {}, {}
    for node, result in cluster_run.gather(GPU_STEP, nvml.probe).items():
        try:
            facts = nvml.parse_gpu_facts(result.stdout) if result.ok else None
        except ParseError:
            facts = None
        if facts is not None and facts.available:
            sets[node], every[node] = nvml.firmware_set(facts), facts
    if not sets:
        pytest.skip("no node answered with NVML facts")
    record.note(f"{len(sets)} node(s) compared")
    differences = [odd_ones_out(label, {n: s[label] for n, s in sets.items()})
                   for label in ("driver", "VBIOS", "InfoROM")]
    mixed = [f"{node}: {problem}" for node, facts in sorted(every.items())
             for problem in nvml.mixed_firmware_problems(facts)]
    fail_on([d for d in differences if d] + mixed)


def stress_text(result) -> str:
    """The log (stderr) followed by the --yaml document (stdout): the parser reads both."""
    return result.stderr + "\n" + result.stdout


@quick
def test_stress_ng(on_node, acceptance, node, record, metrics):
    result = on_node(STRESS_STEP, stress_ng.stress)
    if result.exit_code == 127 and result.failure is None:
        pytest.skip("stress-ng is not installed (apt-get install stress-ng)")
    if result.failure or result.timed_out:
        require(result)
    try:
        run = stress_ng.parse_stress_ng(stress_text(result))
    except ParseError as error:
        raise SanityFailure(f"{node}: stress-ng exited {result.exit_code} "
                            f"({stress_ng.exit_meaning(result.exit_code)}): {error}",
                            excerpt(result.stderr or result.stdout)) from None
    acceptance.record_tool(node, "stress-ng", run.version or "unknown")
    if result.exit_code != 0 or not run.ok:
        details = run.failures or [f"{s.name}: {s.bogo_ops:g} bogo ops" for s in run.stressors]
        raise SanityFailure(f"{node}: stress-ng exited {result.exit_code} "
                            f"({stress_ng.exit_meaning(result.exit_code)}): {'; '.join(details)}",
                            excerpt(result.stderr))
    # A node far below its peers is named by the outlier rule when results are built (reports/results.py).
    record.note(", ".join(f"{s.name} {s.bogo_ops_per_s:.1f}" for s in run.stressors) + " bogo-ops/s")
    metrics.judge(**{f"stress_{s.name}": (round(s.bogo_ops_per_s, 2), "bogo-ops/s")
                     for s in run.stressors})


@quick
def test_dcgm_diag(on_node, profile, record):
    facts = gpu_facts_of(on_node, profile)
    result = on_node(DCGM_STEP, dcgmi.diag)
    if dcgmi.dcgmi_missing(result):
        pytest.skip("dcgmi is not installed (DCGM); NVIDIA's diagnostic was not run")
    if result.failure or result.timed_out:
        require(result)
    meaning = dcgmi.EXIT_MEANINGS.get(result.exit_code, f"exit {result.exit_code}")
    if result.exit_code not in (0, *dcgmi.RAN_AND_FOUND_FAILURES):
        raise SanityFailure(f"dcgmi diag: {meaning}", excerpt(result.stderr or result.stdout))
    try:
        diag = dcgmi.parse_dcgmi(result.stdout)
    except ParseError as error:
        raise SanityFailure(f"dcgmi diag ({meaning}): {error}", excerpt(result.stdout)) from None
    failing = [f"{t.name}{f' on GPU(s) {t.gpus}' if t.gpus else ''}: {t.status}"
               + (f" ({'; '.join(t.warnings)})" if t.warnings else "")
               for t in diag.tests if t.status.lower() not in dcgmi.PASSING_STATUSES]
    record.note(f"DCGM {diag.version}: {len(diag.tests)} result(s) on {len(facts.gpus)} GPU(s)")
    if diag.runtime_error:
        failing.append(f"runtime error: {diag.runtime_error}")
    if failing or result.exit_code != 0:
        raise ExpectationFailure(f"dcgmi diag ({meaning}): " + ("; ".join(failing) or "no failing test named"),
                                 action=DCGM)


def burn_seconds(variable: str, default: int) -> float:
    value = os.environ.get(variable, "")
    try:
        return float(value) if value else float(default)
    except ValueError:
        raise pytest.UsageError(f"{variable}={value!r}: expected a number of seconds") from None


def gpu_payload_unavailable(profile, what: str, reason: str) -> None:
    """No torch or no CUDA device: a failure on a GPU profile, a skip elsewhere."""
    expected = profile.expect.gpu_count
    if expected:
        raise ExpectationFailure(f"profile {profile.name} expects {expected} GPU(s), but the {what} "
                                 f"could not run: {reason}")
    pytest.skip(f"{what} not run: {reason}")


def judge_burn(on_node, profile, node, record, metrics, step, seconds) -> None:
    facts = gpu_facts_of(on_node, profile)
    result = on_node(step, lambda transport: burn.run(transport, seconds))
    run = parsed(burn.parse_burn, result)
    if not run.available:
        gpu_payload_unavailable(profile, "GPU burn", run.reason)
    analysis = burn.analyze(run)
    record.note(f"{seconds:g} s {run.dtype} {run.size}^3 GEMMs: {analysis.summary()}"
                + (f"; {run.telemetry_error}" if run.telemetry_error else ""))
    hidden = burn.unmeasured_gpus([(gpu.index, gpu.bus_id) for gpu in run.gpus], facts, "GPU burn",
                                  run.cuda_visible_devices)
    problems = [f"{node}: {problem}" for problem in hidden + analysis.problems]
    try:
        metrics.judge(gpu_burn_tflops=(analysis.min_tflops, "TFLOP/s"),
                      gpu_burn_vs_matmul=(analysis.min_burn_vs_matmul_pct, "%"))
    except PerformanceFailure as miss:
        if not problems:
            raise
        problems.append(str(miss))
    fail_on(problems, action=BURN)


@quick
def test_gpu_burn(on_node, profile, node, record, metrics):
    """Back-to-back bf16 GEMMs on every GPU at once: sustained TFLOP/s, throttling, SDC digests."""
    judge_burn(on_node, profile, node, record, metrics, BURN_STEP,
               burn_seconds("HANDOVER_GPU_BURN_S", burn.QUICK_SECONDS))


@pytest.mark.full
def test_gpu_burn_full(on_node, profile, node, record):
    """The long burn, judged against the same references as the quick one (check gpu_burn)."""
    metrics = Metrics("gpu_burn", profile, record.metrics)
    judge_burn(on_node, profile, node, record, metrics, BURN_FULL_STEP,
               burn_seconds("HANDOVER_GPU_BURN_FULL_S", burn.FULL_SECONDS))


# The bandwidth payload's figures and the profile's reference for each.
BANDWIDTH_METRICS = {"hbm_copy_tbps": "hbm_copy_bandwidth", "h2d_gbps": "h2d_bandwidth",
                     "d2h_gbps": "d2h_bandwidth"}


def bandwidth_of(on_node, profile, node, record, attributes: tuple[str, ...], title: str,
                 digits: int) -> burn.BandwidthRun:
    """The bandwidth run once its `attributes` are sane on every GPU: no error, a figure, within
    what the GPU's hardware (and the profile's upper bound) allows, and every NVML GPU measured.
    The per-GPU figures are noted before any failure, so the report shows them either way."""
    facts = gpu_facts_of(on_node, profile)
    run = parsed(burn.parse_bandwidth, on_node(BANDWIDTH_STEP, burn.bandwidth))
    if not run.available:
        gpu_payload_unavailable(profile, "GPU bandwidth payload", run.reason)
    numa = [f"{gpu.index}: node {gpu.host_numa}" for gpu in run.gpus if gpu.host_numa is not None]
    record.note(f"{title} per GPU: {run.per_gpu(attributes, digits)}"
                + (f"; pinned buffers on NUMA {', '.join(numa)}" if numa else ""))
    references = {attribute: profile.references.get(BANDWIDTH_METRICS[attribute]) for attribute in attributes}
    limits = {attribute: reference.high_bound for attribute, reference in references.items() if reference}
    problems = burn.unmeasured_gpus([(gpu.index, gpu.bus_id) for gpu in run.gpus], facts,
                                    "GPU bandwidth payload", run.cuda_visible_devices)
    problems += burn.bandwidth_problems(run, attributes, facts, limits)
    if problems:
        raise SanityFailure("; ".join(f"{node}: {problem}" for problem in problems))
    return run


@quick
def test_hbm_bandwidth(on_node, profile, node, record, metrics):
    run = bandwidth_of(on_node, profile, node, record, ("hbm_copy_tbps",), "HBM copy TB/s (read+write)", 2)
    metrics.judge(hbm_copy_bandwidth=(run.slowest("hbm_copy_tbps"), "TB/s"))


@quick
def test_pcie_bandwidth(on_node, profile, node, record, metrics):
    run = bandwidth_of(on_node, profile, node, record, ("h2d_gbps", "d2h_gbps"), "pinned GB/s (H2D/D2H)", 1)
    metrics.judge(h2d_bandwidth=(run.slowest("h2d_gbps"), "GB/s"),
                  d2h_bandwidth=(run.slowest("d2h_gbps"), "GB/s"))


@quick
def test_kernel_log(on_node, profile, acceptance, record):
    """Xid/SXid, PCIe AER and degraded links since boot, split at this run's start.

    Last in the module so the window covers the burn and bandwidth runs before it. A critical
    event fails the node whether it came during this run or earlier since boot (the GPU needs a
    reset or more either way); the note says which. Unreadable log: skip on a CPU-only profile,
    fail on a GPU profile.
    """
    log = kernel_log_of(on_node, KERNEL_STEP, acceptance.started, profile)
    during, before = log.during_run(), log.before_run()
    record.note(f"{log.source}: {log.log.lines} line(s) since boot; during this run: "
                + ("; ".join(describe_kernel_events(during)[:5]) or "no event")
                + "; earlier since boot: " + ("; ".join(describe_kernel_events(before)[:5]) or "no event"))
    fail_on_critical_kernel_events((("during this run", during), ("earlier since boot", before)))
