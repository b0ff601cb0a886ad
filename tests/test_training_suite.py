"""The training suite end to end: pytest against two namespace nodes with a shared scratch path,
then results.json, the report's curves and the TensorBoard files, as an operator reads them."""
from __future__ import annotations

import pytest
from test_e2e import results_of, run_dir_of, run_suites

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")


@pytest.fixture(scope="module")
def training_run(ns_cluster, sign_key, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("training")
    shared = tmp / "shared"
    shared.mkdir()
    inventory = ns_cluster.write_inventory(
        tmp / "cluster.yaml", nodes=["node1", "node2"],
        extra={"scratch": [{"path": str(shared), "kind": "shared"}]})
    done = run_suites(inventory, tmp / "out", sign_key, "suites/test_training.py", "-m", "not full",
                      timeout=600)
    return done, run_dir_of(tmp / "out", "nscluster"), shared


def checks_by_name(results: dict) -> dict:
    return {(c["check"], c["node"]): c for c in results["checks"]}


def test_every_training_check_passes_on_two_nodes(training_run):
    done, run_dir, shared = training_run
    assert done.returncode == 0, done.stdout[-3000:]
    checks = checks_by_name(results_of(run_dir))
    for key in [("training", "node1"), ("training", "node2"), ("training_cluster", None),
                ("training_scaling", None), ("checkpoint", None)]:
        assert checks[key]["outcome"] == "passed", checks[key]
    assert "4 rank(s) on node1, node2" in checks[("training_cluster", None)]["message"]
    assert list(shared.iterdir()) == []  # the checkpoint was removed after its round trip


def metrics_of(checks: dict, check: str, node=None) -> dict:
    return {m["name"]: m["value"] for m in checks[(check, node)]["metrics"]}


def test_figures_are_recorded_with_units(training_run):
    checks = checks_by_name(results_of(training_run[1]))
    metrics = {m["name"]: m for m in checks[("training", "node1")]["metrics"]}
    assert metrics["training_tokens_per_s"]["unit"] == "tokens/s" and metrics["training_tokens_per_s"]["value"] > 0
    assert {"tokens_per_s_per_rank", "step_time_median", "step_time_p99", "time_to_first_step"} <= metrics.keys()
    scaling = {m["name"]: m for m in checks[("training_scaling", None)]["metrics"]}
    assert scaling["scaling_efficiency"]["unit"] == "%" and scaling["scaling_efficiency"]["value"] > 0
    assert scaling["tokens_per_s_all_nodes"]["value"] == metrics_of(checks, "training_cluster")["training_tokens_per_s"]
    checkpoint = {m["name"]: m["value"] for m in checks[("checkpoint", None)]["metrics"]}
    assert checkpoint["checkpoint_size"] > 1 and checkpoint["checkpoint_read_time"] >= 0
    assert "read back by 4 rank(s) on 2 node(s)" in checks[("checkpoint", None)]["message"]


def test_loss_curves_reach_the_report_and_tensorboard(training_run):
    run_dir = training_run[1]
    curve = checks_by_name(results_of(run_dir))[("training_cluster", None)]["series"][0]
    losses = [y for _, y in curve["lines"][0]["points"]]
    assert curve["name"] == "training loss" and losses[-1] < losses[0] / 2
    page = (run_dir / "report.html").read_text()
    assert 'id="curves"' in page and "training loss" in page

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / "tensorboard" / "training_cluster" / "cluster"),
                              size_guidance={"tensors": 0})  # 0: keep every step
    events.Reload()
    logged = [event.tensor_proto.float_val[0] for event in events.Tensors("loss")]
    assert logged == pytest.approx(losses, rel=1e-6)
