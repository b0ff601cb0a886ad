"""The torch collectives payload run for real (gloo, two ranks and one rank on this machine), its
parser, the suite's plan per node, and the suite end to end on namespace nodes: healthy, and with
one node's link slowed so that the cluster all-reduce misses its band and that node is isolated."""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_e2e import results_of, run_dir_of, run_suites

from inventory.loader import load_profile
from inventory.model import Node
from runners import collectives, isolation, nccl_tests, payloads
from runners.collectives import plan_for
from runners.parsing import ParseError
from runners.payloads import collectives as collectives_payload
from runners.transport import LocalTransport, Result

pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")

VENV_PYTHON = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python")
NO_TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3: torch is not installed there


def local_transport() -> LocalTransport:
    import sys

    return LocalTransport(Node(name="localhost", address="localhost", transport="local",
                               python=sys.executable))


@pytest.fixture(scope="module")
def four_collectives_two_ranks():
    """One real run of every collective with two gloo ranks on this machine, 1 MiB and 4 MiB."""
    result = collectives.run_on_node(local_transport(), 2, sizes=(1 << 20, 4 << 20),
                                     collectives=collectives.COLLECTIVES, iters=2, timeout=120)
    assert result.ok, result.stderr[-2000:]
    return result


def test_every_collective_is_checked_and_uses_the_nccl_tests_factors(four_collectives_two_ranks):
    report = collectives.parse_collectives(four_collectives_two_ranks.stdout)
    assert report.ok and report.wrong == 0 and report.ranks == 2 and report.backend == "gloo"
    assert set(report.collectives) == set(collectives.COLLECTIVES) and not report.unsupported
    for name, rows in report.collectives.items():
        assert [row.size for row in rows] == [1 << 20, 4 << 20]
        factor = 1.0 if name == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n for n = 2
        for row in rows:
            assert row.wrong == 0 and row.algbw > 0
            assert row.busbw == pytest.approx(row.algbw * factor)
    assert report.env["GLOO_SOCKET_IFNAME"] == "lo"


def test_one_rank_reports_zero_busbw_by_definition_rather_than_failing():
    result = collectives.run_on_node(local_transport(), 1, sizes=(1 << 20,), iters=2, timeout=120)
    assert result.ok, result.stderr[-2000:]
    report = collectives.parse_collectives(result.stdout)
    assert report.ok and report.ranks == 1
    assert report.largest("all_reduce").busbw == 0.0 and report.largest("all_reduce").algbw > 0
    assert "busbw is 0 by definition" in report.note
    figure, _ = collectives.torch_figure("here", report)
    assert figure is not None and figure.unjudgeable().startswith("one rank (torch ")


H200 = Path(__file__).resolve().parent / "data" / "h200-1gpu"


def test_one_gpu_nccl_tests_figure_is_not_judged_against_the_band():
    """The REAL all_reduce_perf -g 1 of the recorded H200: sane, busbw 0 by definition, so the suite
    skips with the reason instead of failing the 8-GPU band; two ranks are judged."""
    text = (H200 / "all_reduce_perf_h200_g1.txt").read_text()
    result = Result("h200", "all_reduce_perf", 0, text, "", 1.0)
    report = nccl_tests.parse_nccl_tests(text)
    assert nccl_tests.judge(result, report) == ""
    figure, why = collectives.nccl_tests_figure(result, report, 1)
    assert why == "" and figure is not None and figure.busbw == 0
    assert figure.unjudgeable() == ("one rank (nccl-tests): busbw is 0 by definition (factor 2(n-1)/n), "
                                    "nothing crosses a link to judge against the band; the data check passed")
    assert replace(figure, ranks=2).unjudgeable() == ""


@pytest.fixture
def one_gloo_rank():
    """A real gloo process group of one rank in this process (an in-memory store)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch 2.13 renames the payload's older names
@pytest.mark.parametrize("name", collectives.COLLECTIVES)
def test_the_timed_run_is_the_collective_alone_and_the_check_refills(name, one_gloo_rank):
    """run() (what the loop times) writes no input: inputs set to 7 after fill() reach the outputs
    as 7, where a fill inside run() would send 1. check() fills again: no wrong element."""
    import torch

    op = collectives_payload.build(torch, one_gloo_rank, name, 16, 1, torch.device("cpu"))
    op.fill(0)
    op.inputs.fill_(7)
    op.run()
    assert op.outputs.tolist() == [7.0] * len(op.outputs)
    assert op.check(0) == 0


@pytest.mark.parametrize("name", collectives.COLLECTIVES)
def test_each_collective_allocates_only_the_buffers_it_moves(name):
    """All four once built the gathered values beside their buffers, all_reduce too: at 8 GiB on
    one rank, an 8 GiB copy more beside the one it reduces. Now the bytes torch's profiler counts
    while a collective is built (four ranks' shapes: building needs no process group) are its
    input and output (all_reduce's one buffer, in place), and at most a column of one expected
    value per rank."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    elements, world = 1 << 20, 4
    chunk = elements // world
    moved = {"all_reduce": elements, "all_gather": chunk + elements, "reduce_scatter": elements + chunk,
             "all_to_all": 2 * elements}[name] * collectives_payload.FLOAT_BYTES
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
        op = collectives_payload.build(torch, torch.distributed, name, elements, world, torch.device("cpu"))
    allocated = sum(event.self_cpu_memory_usage for event in profiled.events() if event.self_cpu_memory_usage > 0)
    assert moved <= allocated <= moved + 4096, (allocated, moved)
    assert op.inputs.numel() + (0 if op.outputs is op.inputs else op.outputs.numel()) == moved // 4


def test_wrong_values_and_a_missing_rank_are_not_ok(four_collectives_two_ranks):
    """Derived from the real run above: one row's wrong count set to 3; then one host removed."""
    data = json.loads(four_collectives_two_ranks.stdout.strip().splitlines()[-1])
    data["collectives"]["all_reduce"]["rows"][0]["wrong"] = 3
    report = collectives.parse_collectives(json.dumps(data))
    assert report.wrong == 3 and not report.ok
    data["collectives"]["all_reduce"]["rows"][0]["wrong"] = 0
    data["hosts"] = data["hosts"][:1]
    assert not collectives.parse_collectives(json.dumps(data)).ok


@pytest.mark.parametrize("text", ["", "torchrun said nothing useful\n", '{"collectives": 1}\n'])
def test_output_without_a_measurement_is_a_parse_error(text):
    with pytest.raises(ParseError):
        collectives.parse_collectives(text)


def test_payload_command_refuses_an_unknown_collective():
    with pytest.raises(ValueError, match="broadcast"):
        collectives.payload_command("python3", sizes=[1], collectives=["broadcast"], iters=1,
                                    marker="m", op_timeout_s=1)


def test_probe_says_whether_torch_is_there():
    result = collectives.probe(LocalTransport(Node(name="n", address="n", transport="local",
                                                   python=NO_TORCH_PYTHON)))
    probe = collectives.parse_probe(result.stdout)
    assert probe.torch is None and probe.cuda_devices == 0 and probe.nccl_tests is None


IMPORT_TORCH = payloads.load("torch_import") + """
import gc
try:
    torch = import_torch()
except ImportError as exc:
    print("ImportError", gc.isenabled(), gc.get_freeze_count())
else:
    print(torch.__name__, gc.isenabled(), gc.get_freeze_count() > 100_000)
"""


@pytest.mark.parametrize("python, printed", [(VENV_PYTHON, "torch True True"),
                                             (NO_TORCH_PYTHON, "ImportError True ")])
def test_payloads_import_torch_out_of_the_collectors_way_and_leave_it_on(python, printed):
    """torch's objects frozen (none to freeze where the import failed); the collector on for
    whatever the payload does next."""
    shown = subprocess.run([python, "-c", IMPORT_TORCH], capture_output=True, text=True, check=True).stdout
    assert shown.startswith(printed), shown


PROBE = collectives.NodeProbe(hostname="gpu001", python="python3", torch="2.13.0", cuda_devices=0,
                              nccl_tests=None)


def test_plan_per_node_from_the_probe_and_the_profile():
    cpu, gpu = load_profile("cpu-only"), load_profile("h200-sxm-8gpu")
    assert plan_for(PROBE, cpu)[0].ranks == collectives.CPU_RANKS
    assert plan_for(replace(PROBE, cuda_devices=8), gpu)[0] == plan_for(replace(PROBE, cuda_devices=8), cpu)[0]
    assert plan_for(replace(PROBE, cuda_devices=8, nccl_tests="/usr/bin/all_reduce_perf"), gpu)[0].tool == "nccl-tests"
    nccl_only = plan_for(replace(PROBE, torch=None, nccl_tests="/usr/bin/all_reduce_perf"), gpu)[0]
    assert (nccl_only.tool, nccl_only.ranks) == ("nccl-tests", 8)  # GPU count from the profile
    plan, why = plan_for(PROBE, gpu)
    assert plan is None and "sees no CUDA device" in why
    assert plan_for(replace(PROBE, torch=None), cpu) == (None, "neither torch nor nccl-tests on gpu001 "
                                                         "(python3 cannot import torch)")


def checks_of(results: dict) -> dict:
    return {(c["check"], c["node"]): c for c in results["checks"]}


def test_training_suite_on_two_namespace_nodes(ns_cluster, sign_key, tmp_path):  # noqa: F811
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    done = run_suites(inventory, tmp_path / "out", sign_key, "suites/test_collectives.py", "-m", "training")
    assert done.returncode == 0, done.stdout[-3000:]
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    checks = checks_of(results_of(run_dir))
    for node in ("node1", "node2"):
        check = checks[("allreduce", node)]
        assert check["outcome"] == "passed" and "gloo" in check["message"]
        metric = check["metrics"][0]
        assert metric["name"] == "allreduce_busbw" and metric["unit"] == "GB/s" and metric["ok"]
        [curve] = check["series"]  # busbw against size: every row of the run, one line per tool
        assert (curve["name"], curve["x_unit"], curve["y_unit"], curve["x_scale"]) == \
            ("allreduce busbw", "B", "GB/s", "log2")
        [line] = curve["lines"]
        assert line["label"].startswith("torch ") and line["label"].endswith(" gloo")
        assert [x for x, _ in line["points"]] == list(collectives.CPU_SIZES)
    cluster = checks[("allreduce_cluster", None)]
    assert cluster["outcome"] == "passed", cluster["message"]
    assert "GLOO_SOCKET_IFNAME=eth0" in cluster["message"] and cluster["metrics"][0]["value"] > 0
    assert [x for x, _ in cluster["series"][0]["lines"][0]["points"]] == list(collectives.CPU_SIZES)
    assert "slowest: node" in checks[("allreduce_spread", None)]["message"]
    scales = checks[("allreduce_scales", None)]  # two nodes: their pair is the cluster, no placement
    assert scales["outcome"] == "passed", scales["message"]
    assert scales["message"].startswith("node: 2 run(s), median ")
    assert "leaf: skipped (the inventory gives no leaf: for any node)" in scales["message"]
    assert scales["message"].endswith(". every scale meets its band")
    figures = {m["name"]: m["value"] for m in scales["metrics"]}
    assert figures["allreduce_busbw_pair_min"] == figures["allreduce_busbw_cluster_median"] > 0
    assert not list((run_dir / "raw").glob("allreduce_scales*"))  # the pair's figure is the cluster run's
    for check, collective in [("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
                              ("alltoall", "all_to_all")]:
        assert checks[(check, "node2")]["outcome"] == "passed"
        assert checks[(check, "node2")]["message"].startswith(f"{collective}: ")
        assert checks[(check, "node2")]["metrics"][0]["name"] == f"{check}_busbw"
        assert checks[(check, "node2")]["series"][0]["name"] == f"{check} busbw"


@pytest.mark.parametrize("profile, outcome", [("cpu-only", "skipped"), ("h200-sxm-8gpu", "failed")])
def test_without_torch_cpu_only_skips_and_a_gpu_profile_fails(profile, outcome, ns_cluster, sign_key,
                                                              tmp_path):  # noqa: F811
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", nodes=["node3", "node4"],
                                           profile=profile, extra={"python": NO_TORCH_PYTHON})
    run_suites(inventory, tmp_path / "out", sign_key, "suites/test_collectives.py", "-m", "training")
    checks = checks_of(results_of(run_dir_of(tmp_path / "out", "nscluster")))
    for key in [("allreduce", "node3"), ("allreduce", "node4"), ("allreduce_cluster", None)]:
        assert checks[key]["outcome"] == outcome, checks[key]
        assert "cannot import torch" in checks[key]["message"]
    if outcome == "failed":
        assert checks[("allreduce", "node3")]["kind"] == "expectation"


SLOW_NODE = "node5"
# 300 Mbit/s into one node: busbw, the bandwidth per link, cannot pass its link's 0.0375 GB/s, below
# the band's 0.04, while 3-node groups of healthy namespace nodes measured 0.14-0.17 and 8 together
# 0.15 on 2 quiet shared cores, and a healthy pair beside other pairs on a loaded machine (load
# average 20) 0.043. (200 Mbit/s tells the same at twice the test's time.)
SLOW_RATE = "300mbit"
BAND = {"value": 0.1, "lower": -0.6, "source": "test: 3-8 healthy namespace nodes measured 0.14-0.17 GB/s"}


@pytest.fixture
def six_nodes_one_slow(ns_cluster_factory):
    """Six namespace nodes under two leaves, node5's bridge-side veth limited by tbf."""
    cluster = ns_cluster_factory(6)
    subprocess.run(["tc", "qdisc", "add", "dev", cluster.node(SLOW_NODE).veth_host, "root", "tbf",
                    "rate", SLOW_RATE, "burst", "32kbit", "latency", "50ms"], check=True)
    return cluster


def test_a_slow_node_is_isolated_inside_the_cluster_all_reduce(six_nodes_one_slow, sign_key, tmp_path):
    inventory = six_nodes_one_slow.write_inventory(tmp_path / "cluster.yaml", extra={
        "groups": {"leaf-a": {"nodes": "node[1-3]", "leaf": "leaf-a"},
                   "leaf-b": {"nodes": "node[4-6]", "leaf": "leaf-b"}},
        "references": {"allreduce_busbw_cluster": BAND}})
    run_suites(inventory, tmp_path / "out", sign_key, "suites/test_collectives.py", "-m", "training",
               "-k", "allreduce_cluster or allreduce_scales", timeout=1500)
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    checks = checks_of(results_of(run_dir))
    assert (run_dir / "report.html").is_file()

    cluster = checks[("allreduce_cluster", None)]
    message = cluster["message"]
    assert (cluster["outcome"], cluster["kind"]) == ("failed", "performance"), message
    assert message.startswith("allreduce_busbw_cluster = ") and "expected >= 0.04 GB/s" in message
    assert re.findall(r"isolated (\w+)", message) == [SLOW_NODE], message
    # The evidence: every step with node5 in it, from the cluster run to its confirmation beside a
    # cleared node. Healthy groups beside each other on 2 shared cores sometimes miss the band too
    # (0.035 GB/s seen): they are bisected and their nodes cleared by confirmation, a round more.
    assert re.search(r"isolated node5 \(cluster node1\.\.node6 \(6 nodes\) 0\.0\d\d GB/s; "
                     r"screen node4,node5,node6 0\.0\d\d GB/s; .*confirm node5 with node\d 0\.0\d\d GB/s\)",
                     message), message
    assert "cleared 5 of 6 node(s)" in message and "not finished" not in message
    figures = {m["name"]: m["value"] for m in cluster["metrics"]}
    assert figures["isolated_nodes"] == 1 and 2 <= figures["isolation_rounds"] <= 5
    assert figures["isolation_time"] <= isolation.DEFAULT_BUDGET_S  # cpu-only leaves the default
    [steps] = [s for s in cluster["series"] if s["name"] == "allreduce isolation busbw"]
    assert {"cluster", "screen", "confirm"} <= {line["label"] for line in steps["lines"]}

    scales = checks[("allreduce_scales", None)]
    table = scales["message"]
    assert scales["outcome"] == "passed", table
    assert table.startswith("node: 6 run(s)") and "pair: 6 run(s)" in table and "leaf: 2 run(s)" in table
    assert "rack: skipped (the inventory gives no rack: for any node)" in table
    # Three pairs at once share the 2 cores, so a healthy pair may miss the band too (0.03 GB/s seen);
    # leaf-a's group meeting it clears its nodes, and node5's pairs are the slowest.
    [named] = re.findall(r"\. every pair of ([^:]+) is low: bad node\(s\), not the fabric$", table) or [table]
    assert SLOW_NODE in named.split(", ") and not {"node1", "node2", "node3"} & set(named.split(", "))
    assert re.search(r"pair: 6 run\(s\), median 0\.\d+, min 0\.0\d\d GB/s \((node4-node5|node5-node6)\)", table)
    assert "min 0.0" in table.split("leaf: ")[1].split(";")[0] and "(leaf-b)" in table
