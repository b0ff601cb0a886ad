"""The metrics the suites record, by check, with their units: the names a profile's `references:`
and `outliers:` may use. The loader checks those against this table when it reads them, so a
misspelt metric fails there rather than leaving a band that never judges anything; and
suites.checks.Metrics records no name missing from it, so the table cannot fall behind the suites.
"""
from __future__ import annotations

from typing import Optional

STRESSOR = "<stressor>"  # a family: stress_cpu, stress_matrix, ... one per stress-ng stressor run

_ISOLATION = {"isolation_time": "s", "isolation_rounds": "rounds", "isolated_nodes": "nodes"}
_TRAINING_RUN = {"training_tokens_per_s": "tokens/s", "tokens_per_s_per_rank": "tokens/s",
                 "step_time_median": "s", "step_time_p99": "s", "time_to_first_step": "s",
                 "gpu_util_mean": "%", "gpu_memory_max": "GiB"}
_SCALES = ("node", "pair", "leaf", "rack", "cluster")  # suites/test_collectives.py's SCALES

# check -> {metric: unit}; a check is its test's name without `test_`, as in the results.
RECORDED: dict[str, dict[str, str]] = {
    # suites/test_system.py
    "cpu": {"cpu_cores": "cores"},
    "memory": {"memory_total": "GiB"},
    # suites/test_hardware.py
    "gpu_inventory": {"gpu_memory": "GiB"},
    "stress_ng": {f"stress_{STRESSOR}": "bogo-ops/s"},
    "gpu_burn": {"gpu_burn_tflops": "TFLOP/s", "gpu_burn_vs_matmul": "%"},
    "hbm_bandwidth": {"hbm_copy_bandwidth": "TB/s"},
    "pcie_bandwidth": {"h2d_bandwidth": "GB/s", "d2h_bandwidth": "GB/s"},
    # suites/test_hpc.py
    "hpl": {"hpl_gflops": "Gflop/s", "hpl_peak_fraction": "%"},
    "hpl_cluster": {"hpl_cluster_gflops": "Gflop/s", "hpl_cluster_peak_fraction": "%"},
    **{f"gemm_{dtype}": {f"gemm_{dtype}_tflops": "TFLOP/s"} for dtype in ("bf16", "fp16", "tf32", "fp32", "fp64")},
    "fft": {"fft_c64_gflops": "GFLOP/s"},
    # suites/test_collectives.py
    **{collective: {f"{collective}_busbw": "GB/s"}
       for collective in ("allreduce", "allgather", "reducescatter", "alltoall")},
    "allreduce_cluster": {"allreduce_busbw_cluster": "GB/s", **_ISOLATION},
    "allreduce_scales": {f"allreduce_busbw_{scale}_{statistic}": "GB/s"
                         for scale in _SCALES for statistic in ("median", "min")},
    # suites/test_network.py
    "iperf3": {"iperf3_bandwidth": "Gb/s", "iperf3_retransmits": "count"},
    "ib_write_bw": {"ib_write_bw": "Gb/s"},
    "ib_write_lat": {"ib_write_lat_typical": "us", "ib_write_lat_p99": "us"},
    # suites/test_storage.py
    "scratch_throughput": {"scratch_seq_read": "GB/s", "scratch_seq_write": "GB/s"},
    "scratch_iops": {"scratch_rand_read": "IOPS", "scratch_rand_write": "IOPS"},
    "scratch_latency": {"scratch_read_lat_p50": "us", "scratch_read_lat_p99": "us", "scratch_read_lat_p999": "us"},
    "shared_throughput": {"shared_seq_write": "GB/s", "shared_seq_read": "GB/s"},
    # suites/test_training.py
    **{check: _TRAINING_RUN
       for check in ("training", "training_sustained", "training_cluster", "training_cluster_sustained")},
    "training_scaling": {"scaling_efficiency": "%", "tokens_per_s_one_node": "tokens/s",
                         "tokens_per_s_all_nodes": "tokens/s", **_ISOLATION},
    "checkpoint": {"checkpoint_size": "MiB", "checkpoint_write_time": "s", "checkpoint_read_time": "s"},
    # suites/test_soak.py
    "soak_heartbeat": {"soak_samples": "samples", "soak_covered": "%"},
    "soak_load": {"soak_cpu_rate": "bogo-ops/s", "soak_cpu_retained": "%", "soak_net_gbps": "Gbit/s",
                  "soak_net_retained": "%", "soak_gpu_tflops": "TFLOP/s", "soak_gpu_retained": "%",
                  "soak_cpu_temp_max": "°C"},
    "soak_ib": {"soak_ib_gbps": "Gbit/s", "soak_ib_retained": "%"},
    "soak_io": {"soak_io_mbps": "MB/s", "soak_io_retained": "%"},
    "soak_gpu": {"soak_gpu_temp_max": "°C", "soak_gpu_power_max": "W"},
}


def _family(metric: str) -> str:
    """The table's name for `metric`: itself, or its family's (stress_cpu -> stress_<stressor>)."""
    if metric.startswith("stress_") and len(metric) > len("stress_"):
        return f"stress_{STRESSOR}"
    return metric


def checks_recording(metric: str) -> dict[str, str]:
    """{check: unit} of the checks that record `metric`; empty for a name no suite records."""
    name = _family(metric)
    return {check: recorded[name] for check, recorded in RECORDED.items() if name in recorded}


def known_metrics() -> list[str]:
    """Every name of the table, families as their pattern, sorted: for did-you-mean hints."""
    return sorted({name for recorded in RECORDED.values() for name in recorded})


def unrecorded(check: str, metric: str, unit: str) -> Optional[str]:
    """Why `check` may not record `metric` in `unit`: None when the table has it so."""
    recording = checks_recording(metric)
    if check not in recording:
        return f"check {check!r} records no metric {metric!r} (inventory/metrics.py)"
    if recording[check] != unit:
        return f"check {check!r} records {metric!r} in {recording[check]}, not {unit}"
    return None
