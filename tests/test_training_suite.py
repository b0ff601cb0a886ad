"""The training suite end to end: pytest against four namespace nodes with a shared scratch path,
one node behind a slow link, then results.json, the isolation of that node, the report's curves
and the TensorBoard files, as an operator reads them. (tests/test_e2e.py has them healthy.)"""
from __future__ import annotations

import re
import subprocess

import pytest
from test_e2e import results_of, run_dir_of, run_suites

from runners import isolation

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")


SLOW_NODE = "node3"
# 10 Mbit/s into one node: a DDP step of the CPU model moves about 3 MB through each node's link,
# so the 4 nodes together measured 9.6 % and every pair with node3 11-12 %. At 20 Mbit/s a slower
# CI machine's longer steps hid the link (23 % together, pairs with node3 above the band): the
# margin has to hold when compute is slower. Healthy, the 4 together measured 92 %, pairs 56-116 %
# (2 shared cores), down to 31 % beside other work, and a healthy pair beside node3's 120-244 %
# (node3's ranks wait on the link and leave it the cores).
SLOW_RATE = "10mbit"
BAND = {"check": "training_scaling", "value": 50, "lower": -0.5, "upper": None, "unit": "%",
        "source": "test: 4 healthy namespace nodes measured 92 % together, 31-116 % in pairs"}


@pytest.fixture(scope="module")
def training_run(module_ns_cluster_factory, sign_key, tmp_path_factory):  # noqa: F811
    """The quick training suite on four namespace nodes with a shared scratch path, node3's
    bridge-side veth limited by tbf: one run for every test here."""
    cluster = module_ns_cluster_factory(4)
    subprocess.run(["tc", "qdisc", "add", "dev", cluster.node(SLOW_NODE).veth_host, "root", "tbf",
                    "rate", SLOW_RATE, "burst", "32kbit", "latency", "50ms"], check=True)
    tmp = tmp_path_factory.mktemp("training")
    shared = tmp / "shared"
    shared.mkdir()
    inventory = cluster.write_inventory(tmp / "cluster.yaml", extra={
        "scratch": [{"path": str(shared), "kind": "shared"}], "references": {"scaling_efficiency": BAND}})
    done = run_suites(inventory, tmp / "out", sign_key, "suites/test_training.py", "-m", "not full",
                      timeout=900)
    return done, run_dir_of(tmp / "out", "nscluster"), shared


def checks_by_name(results: dict) -> dict:
    return {(c["check"], c["node"]): c for c in results["checks"]}


def test_every_training_check_passes_but_the_scaling_the_slow_node_drags_down(training_run):
    done, run_dir, shared = training_run
    assert done.returncode == 1, done.stdout[-3000:]
    checks = checks_by_name(results_of(run_dir))
    for key in [*((("training", f"node{i}") for i in range(1, 5))), ("training_cluster", None), ("checkpoint", None)]:
        assert checks[key]["outcome"] == "passed", checks[key]
    assert "8 rank(s) on node1, node2, node3, node4" in checks[("training_cluster", None)]["message"]
    assert list(shared.iterdir()) == []  # the checkpoint was removed after its round trip
    assert [key for key, check in checks.items() if check["outcome"] == "failed"] == [("training_scaling", None)]


def test_a_slow_node_is_isolated_inside_the_training_across_nodes(training_run):
    _, run_dir, _ = training_run
    check = checks_by_name(results_of(run_dir))[("training_scaling", None)]
    message = check["message"]
    assert (check["outcome"], check["kind"]) == ("failed", "performance"), message
    assert message.startswith("scaling_efficiency = ") and "expected >= 25 %" in message
    assert re.findall(r"isolated (\w+)", message) == [SLOW_NODE], message
    # Screened with node4, confirmed beside a node cleared by its group's (or a pair's) run.
    assert re.search(r"isolated node3 \(cluster node1,node2,node3,node4 \d+\.\d %; screen node3,node4 \d+\.\d %; "
                     r".*confirm node3 with node[124] \d+\.\d %\)", message), message
    assert "cleared 3 of 4 node(s)" in message and "not finished" not in message
    figures = {m["name"]: m["value"] for m in check["metrics"]}
    # Two rounds (screen, confirm); a third when a healthy pair beside other work misses the band
    # and the suspects are paired with each other first.
    assert figures["isolated_nodes"] == 1 and 2 <= figures["isolation_rounds"] <= 3
    assert figures["isolation_time"] <= isolation.DEFAULT_BUDGET_S  # cpu-only leaves the default
    [steps] = [s for s in check["series"] if s["name"] == "training isolation efficiency"]
    assert {"cluster", "screen", "confirm"} <= {line["label"] for line in steps["lines"]}
    assert steps["y_unit"] == "%"
    assert {"raw/training_isolation_round1/node1.command", "raw/training_isolation_round2/node3.command"} \
        <= set(check["raw"]) and (run_dir / "raw/training_isolation_round2/node3.command").is_file()
    page = (run_dir / "report.html").read_text()
    assert "training isolation efficiency" in page and "isolated node3" in page


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
    assert "read back by 8 rank(s) on 4 node(s)" in checks[("checkpoint", None)]["message"]


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
