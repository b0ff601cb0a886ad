"""The hardware suite end to end: pytest on this machine (cpu-only) and on namespace nodes with
the h200 profile, where the missing NVML must fail the GPU checks instead of skipping them."""
from __future__ import annotations

from nodes import local_inventory_without_scratch
from test_e2e import results_of, run_dir_of, run_suites


def checks(run_dir, name):
    return [c for c in results_of(run_dir)["checks"] if c["check"] == name]


def test_local_cpu_only_skips_gpu_checks_with_the_nvml_reason(sign_key, tmp_path):  # noqa: F811
    done = run_suites(local_inventory_without_scratch(tmp_path), tmp_path / "out", sign_key,
                      "-m", "hardware and not full", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = run_dir_of(tmp_path / "out", "local")
    inventory = checks(run_dir, "gpu_inventory")[0]
    assert inventory["outcome"] == "skipped" and "NVML unavailable" in inventory["message"]
    stress = checks(run_dir, "stress_ng")[0]
    assert stress["outcome"] == "passed" and "bogo-ops/s" in stress["message"]
    assert {m["name"] for m in stress["metrics"]} == {"stress_cpu", "stress_matrix", "stress_vm"}
    assert all(m["unit"] == "bogo-ops/s" and m["value"] > 0 for m in stress["metrics"])
    kernel = checks(run_dir, "kernel_log")[0]  # root here: dmesg is readable, the VM has no GPU
    assert kernel["outcome"] == "passed", kernel["message"]
    assert kernel["message"].startswith("dmesg: ") and "during this run: no event" in kernel["message"]


def test_gpu_profile_without_nvml_fails_gpu_checks_on_every_node(ns_cluster, sign_key, tmp_path):  # noqa: F811
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", nodes=["node1", "node2"],
                                           profile="h200-sxm-8gpu")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "hardware", timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    assert results["verdict"]["status"] == "NOT CERTIFIED"
    for check in ("gpu_inventory", "gpu_ecc", "gpu_pcie"):
        outcomes = checks(run_dir, check)
        assert sorted(c["node"] for c in outcomes) == ["node1", "node2"]
        assert all(c["outcome"] == "failed" and "expects 8 GPU(s)" in c["message"] for c in outcomes)
    assert all(c["outcome"] == "passed" for c in checks(run_dir, "stress_ng"))
