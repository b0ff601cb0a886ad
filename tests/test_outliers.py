"""Degraded, not only dead: the outlier rule, where its outliers go (results.json, the verdict,
JUnit, the report), the profile's `outliers:` key, healthy namespace runs in which it names no
node, and six real namespace nodes of which one has a slow link and one a fraction of a core.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import pytest
from test_e2e import results_of, run_dir_of, run_suites
from test_html import parse
from test_verdict import END, check, header, write_run

from inventory.loader import InventoryError, load_inventory, load_profile
from inventory.model import OutlierRule
from reports.html import render_html
from reports.junit import render_junit
from reports.ledger import read_ledger
from reports.results import build_results, outlier_rule, outliers
from reports.schema import validate_results
from reports.verdict import CERTIFIED, NOT_CERTIFIED

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATA = ROOT / "bench" / "data"


def entry(node: str, value: Optional[float], *, check_name: str = "stress_ng", name: str = "stress_cpu",
          unit: str = "bogo-ops/s", band: Optional[tuple] = None, rail: Optional[int] = None) -> dict:
    metric = {"name": name, "value": value, "unit": unit, "band": list(band) if band else None}
    found = {"check": check_name, "node": node, "outcome": "passed", "metrics": [metric]}
    if rail is not None:
        found["rail"] = rail
    return found


def fleet(values: list[float], **kwargs) -> list[dict]:
    return [entry(f"n{i}", value, **kwargs) for i, value in enumerate(values, start=1)]


# ---------------------------------------------------------------------------------------------
# The rule


def test_a_tight_healthy_fleet_names_nobody():
    """Within 2 % of each other, a robust z above 3.5 is only noise: the minimum deviation holds."""
    tight = [1000.0, 1004.0, 996.0, 1001.0, 999.0, 1003.0, 980.0, 1020.0]
    assert outliers(fleet(tight)) == []
    assert outliers(fleet(tight, name="iperf3_bandwidth", unit="Gb/s", band=(0.1, None))) == []


def test_one_low_node_is_named_with_its_median_deviation_and_rule():
    found = outliers(fleet([1000.0, 1010.0, 990.0, 1005.0, 995.0, 610.0]))
    assert [(o["node"], o["metric"], o["value"], o["median"], o["deviation"], o["severity"]) for o in found] == [
        ("n6", "stress_cpu", 610.0, 997.5, -0.3885, "warning")]
    assert found[0]["robust_z"] == -34.85
    assert found[0]["rule"] == ("robust z above 3.5 and more than 10% below the median of 6 nodes "
                                "(scaled MAD 11.1 bogo-ops/s)")


def test_a_high_node_of_a_metric_where_high_is_good_is_not_named():
    """A floor (band's lower bound), or a rate without a band: being fast is no fault."""
    assert outliers(fleet([1000.0, 1010.0, 990.0, 1005.0, 995.0, 1900.0], band=(500.0, None))) == []
    assert outliers(fleet([1000.0, 1010.0, 990.0, 1005.0, 995.0, 1900.0])) == []


def test_a_time_is_bad_high_and_a_ceiling_bounds_the_bad_side():
    slow = outliers(fleet([0.20, 0.21, 0.20, 0.19, 0.20, 0.31], name="step_time_median", unit="s"))
    assert [o["node"] for o in slow] == ["n6"]
    assert outliers(fleet([0.20, 0.21, 0.20, 0.19, 0.20, 0.11], name="step_time_median", unit="s")) == []
    latency = outliers(fleet([5.0, 5.1, 4.9, 5.0, 9.0, 2.0], name="lat", unit="usec", band=(None, 20.0)))
    assert [o["node"] for o in latency] == ["n5"]


def test_a_spread_out_fleet_needs_a_robust_z_beyond_the_threshold():
    """20 % below the median, but the peers spread as widely: not an outlier; the profile's z decides."""
    spread = [1000.0, 1250.0, 800.0, 1150.0, 900.0, 790.0]
    assert outliers(fleet(spread)) == []
    assert [o["node"] for o in outliers(fleet(spread), OutlierRule(z=0.5))] == ["n6", "n3"]


def test_too_few_nodes_an_ignored_metric_and_a_zero_median_make_no_call():
    assert outliers(fleet([1000.0, 1000.0, 400.0])) == []
    assert [o["node"] for o in outliers(fleet([1000.0, 1000.0, 400.0]), OutlierRule(min_nodes=3))] == ["n3"]
    assert outliers(fleet([1000.0, 1000.0, 1000.0, 400.0]), OutlierRule(ignore=("stress_cpu",))) == []
    assert outliers(fleet([0.0, 0.0, 0.0, 5.0], unit="errors/s")) == []


def test_a_metric_the_profile_fails_is_a_failure_and_a_rail_is_kept():
    found = outliers(fleet([100.0, 101.0, 99.0, 100.0, 40.0], check_name="ib_write_bw", name="ib_write_bw",
                           unit="Gb/s", band=(50.0, None), rail=3), OutlierRule(fail=("ib_write_bw",)))
    assert [(o["node"], o["rail"], o["severity"]) for o in found] == [("n5", 3, "failure")]


def test_the_rule_comes_from_the_run_header_with_defaults_for_older_ledgers():
    assert outlier_rule({}) == OutlierRule()
    assert outlier_rule({"outliers": {"z": 3.0, "fail": ["a"]}}) == OutlierRule(z=3.0, fail=("a",))
    cpu_only = load_profile("cpu-only").outliers
    assert outlier_rule({"outliers": cpu_only.as_dict()}) == cpu_only


# ---------------------------------------------------------------------------------------------
# results.json, the verdict, JUnit and the report


def slow_node_run(tmp_path: Path, profile_outliers: Optional[dict] = None) -> dict:
    """Five nodes with a passed stress_ng check each, node n5 at 40 % of its peers; as ledger."""
    nodes = [f"n{i}" for i in range(1, 6)]
    head = header(nodes)
    if profile_outliers is not None:
        head["profile"] = {**head["profile"], "outliers": profile_outliers}
    head["profile"] = {**head["profile"], "mandatory": []}
    entries = [check(node, "stress_ng", metrics=[
        {"name": "stress_cpu", "value": value, "unit": "bogo-ops/s", "reference": None, "criterion": None,
         "margin": None, "ok": None}]) for node, value in zip(nodes, [100.0, 101.0, 99.0, 100.0, 40.0], strict=True)]
    return build_results(read_ledger(write_run(tmp_path, entries, head=head, end=END)))[0]


def test_an_outlier_is_a_warning_beside_a_certified_verdict(tmp_path):
    results = slow_node_run(tmp_path)
    validate_results(results)
    assert results["verdict"]["status"] == CERTIFIED
    assert results["verdict"]["reasons"] == ["all 5 checks passed on 5 node(s)"]
    assert results["verdict"]["warnings"] == [
        "n5: stress_ng stress_cpu = 40 bogo-ops/s, 60% below the median 100 bogo-ops/s of its peers (robust z -40.47)"]
    [found] = results["outliers"]
    assert (found["node"], found["severity"]) == ("n5", "warning")
    assert {row["name"]: row["status"] for row in results["nodes"]}["n5"] == "passed"
    verdict = build_results(read_ledger(next((tmp_path / "out").glob("*/*"))))[1]
    assert verdict.headline == "CERTIFIED, 1 warning"


def test_an_outlier_of_a_metric_the_profile_fails_fails_the_node_and_the_verdict(tmp_path):
    results = slow_node_run(tmp_path, {"fail": ["stress_cpu"]})
    validate_results(results)
    assert results["verdict"]["status"] == NOT_CERTIFIED and "warnings" not in results["verdict"]
    assert results["verdict"]["reasons"][0].startswith("n5: stress_ng stress_cpu = 40 bogo-ops/s, 60% below")
    assert results["verdict"]["reasons"][0].endswith("an outlier, which the profile fails for stress_cpu")
    node = {row["name"]: row for row in results["nodes"]}["n5"]
    assert node["status"] == "failed" and node["reasons"][0].startswith("outlier: n5: stress_ng stress_cpu")


def junit_case(results: dict, name: str) -> ET.Element:
    root = ET.fromstring(render_junit(results))
    return next(case for case in root.iter("testcase") if case.get("name") == name)


def test_junit_carries_an_outlier_on_the_nodes_test_case(tmp_path):
    results = slow_node_run(tmp_path)
    case = junit_case(results, "test_stress_ng[n5]")
    assert case.find("failure") is None
    [prop] = case.find("properties").findall("property")
    assert prop.get("name") == "handover.outlier.stress_cpu" and "60% below the median" in prop.get("value")
    assert case.find("system-out").text.startswith("warning: outlier n5: stress_ng stress_cpu = 40 bogo-ops/s")
    assert junit_case(results, "test_stress_ng[n4]").find("system-out") is None
    certification = junit_case(results, "certification")
    assert certification.find("failure") is None and "warning: outlier n5" in certification.find("system-out").text


def test_junit_fails_the_nodes_test_case_when_the_profile_fails_the_outlier(tmp_path):
    results = slow_node_run(tmp_path, {"fail": ["stress_cpu"]})
    root = ET.fromstring(render_junit(results))
    case = junit_case(results, "test_stress_ng[n5]")
    assert case.find("failure").get("message").startswith("[outlier] failure: outlier n5: stress_ng stress_cpu")
    assert root.find("testsuite").get("failures") == "2"  # the node's case and the certification


def test_the_report_shows_the_warnings_beside_the_status_and_marks_the_node(tmp_path):
    results = slow_node_run(tmp_path)
    root = parse(render_html(results))
    verdict = root.by_id("verdict")
    assert verdict.find("div", "status").text() == "CERTIFIED, 1 warning"
    assert "n5: stress_ng stress_cpu = 40 bogo-ops/s" in verdict.find("div", "warnings").text()
    marked = [cell for cell in root.find("table", "matrix").find_all("span", "outlier")]
    assert len(marked) == 1 and "outlier: stress_ng · stress_cpu 40 bogo-ops/s" in marked[0].attrs["title"]
    badge = root.find("table", "matrix").find("a", "badge-warning")
    assert badge.text() == "⚠ 1" and badge.attrs["href"] == "#outliers"
    table = root.find("table", "outlier-table")
    assert [row.find_all("td")[0].text() for row in table.find("tbody").find_all("tr")] == ["n5"]
    bars = root.find("section", "metric").find("svg", "chart").find_all("rect", "bar")
    assert ["bar-outlier" in bar.classes() for bar in bars] == [False, False, False, False, True]
    assert "n5: 40 bogo-ops/s (-60% vs the median, robust z -40.5)" in root.find("div", "outliers").text()
    nodes = root.find("table", "attention-table").find("tbody").find_all("tr")
    assert [row.find("td").text() for row in nodes] == ["n5"]  # passed, but listed with its outlier


# ---------------------------------------------------------------------------------------------
# The profile's outliers key


def profile_with(tmp_path: Path, outliers_yaml: str) -> Path:
    source = (ROOT / "inventory" / "profiles" / "cpu-only.yaml").read_text()
    start = source.index("outliers:\n")
    end = source.index("\n\n", start)
    path = tmp_path / "outlier-test.yaml"
    path.write_text(source.replace("profile: cpu-only", "profile: outlier-test")
                    .replace(source[start:end], outliers_yaml.rstrip("\n")))
    return path


def test_the_profile_key_is_read_typed_and_reaches_the_run_header(tmp_path):
    from handover.session import run_header

    path = profile_with(tmp_path, "outliers: {fail: [iperf3_bandwidth], z: 3, min_deviation: 0.2, min_nodes: 5}\n")
    assert load_profile(str(path)).outliers == OutlierRule(z=3.0, min_deviation=0.2, min_nodes=5,
                                                           fail=("iperf3_bandwidth",))
    cluster = load_inventory(ROOT / "inventory" / "local.yaml")
    assert run_header(cluster, list(cluster.nodes))["profile"]["outliers"] == {
        "z": 1.0, "min_deviation": 0.4, "min_nodes": 4, "fail": [], "ignore": ["stress_vm"]}
    assert load_profile("h100-sxm-8gpu").outliers == OutlierRule()


@pytest.mark.parametrize("written, problem", [
    ("outliers: {z: 0}", "outliers.z: must be a positive number of scaled MADs, got 0"),
    ("outliers: {min_deviation: -0.1}", "outliers.min_deviation: a fraction of the median, must be >= 0, got -0.1"),
    ("outliers: {min_nodes: 2}", "outliers.min_nodes: 2 is too few; a median and its MAD need at least 3 nodes"),
    ("outliers: {min_nodes: 4.5}", "outliers.min_nodes: expected an integer, got 4.5"),
    ("outliers: {fail: [stress_cpu, stress_cpu]}", "outliers.fail[1]: metric 'stress_cpu' listed twice"),
    ("outliers: {fail: [stress_cpu], ignore: [stress_cpu]}",
     "outliers.ignore[0]: metric 'stress_cpu' is in fail too; an ignored metric cannot fail"),
    ("outliers: {fails: [stress_cpu]}", "outliers.fails: unknown key; did you mean 'fail'?"),
    ("outliers: {fail: [allreduce_bsbw]}",
     "outliers.fail[0]: no check records a metric 'allreduce_bsbw'; did you mean 'allreduce_busbw'?"),
], ids=["z", "deviation", "nodes", "integer", "twice", "both", "typo", "unknown-metric"])
def test_a_wrong_outliers_key_is_one_line_naming_the_field(tmp_path, written, problem):
    path = profile_with(tmp_path, written)
    with pytest.raises(InventoryError) as raised:
        load_profile(str(path))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}:") and message.endswith(problem), message


# ---------------------------------------------------------------------------------------------
# Healthy namespace runs, recorded by bench/healthy_ledgers.py (bench/data/README.md)


@pytest.mark.parametrize("name", sorted(p.name for p in BENCH_DATA.glob("*.ledger.jsonl")))
def test_healthy_namespace_runs_name_no_node(tmp_path, name):
    shutil.copyfile(BENCH_DATA / name, tmp_path / "ledger.jsonl")
    record = read_ledger(tmp_path)
    measured = {m["name"] for c in record.checks if c.get("node") for m in c.get("metrics") or []}
    assert {"stress_cpu", "iperf3_bandwidth"} <= measured
    assert outliers(record.checks, load_profile("cpu-only").outliers) == []


# ---------------------------------------------------------------------------------------------
# Six real nodes: node2 behind a slow link, node5 held to a fraction of a core

SLOW_LINK_NODE, SLOW_CPU_NODE = "node2", "node5"
# 200 Mbit/s both ways, against the 1.8-4.3 Gb/s of a healthy pair in the healthy six-node runs.
SLOW_RATE = "200mbit"
CALM_SPREAD = 0.05  # the healthy nodes' stress_cpu MAD over their median, on a machine calm enough to judge
# A tenth of a core, and half the weight of one task: the healthy nodes' three stressors weigh a
# task each, so beside other work (where a tenth of a core is more than a node's share, and the
# quota alone did not bite) the slow node still gets about a sixth of a healthy node's share.
# Measured: stress_cpu 49-60 % and stress_matrix 41-50 % below the peers' median; a fifth of that
# share starved the vm stressor to no bogo op, a sanity failure without figures, as heavy load on
# the machine does to healthy nodes too (then the CPU part is skipped, saying so).
CPU_QUOTA_US, CPU_PERIOD_US, CPU_WEIGHT_V1, CPU_WEIGHT_V2 = 10000, 100000, 512, 50
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_cgroup() -> tuple[Path, dict[str, str]]:
    """A new cgroup with the CPU limit, and its files: cgroup v2's cpu.max where the unified
    hierarchy has the cpu controller, else cgroup v1's cpu controller (cfs_quota_us)."""
    name = f"handover-test-{os.getpid()}"
    unified = CGROUP_ROOT / "cgroup.controllers"
    if unified.is_file() and "cpu" in unified.read_text().split():
        return CGROUP_ROOT / name, {"cpu.max": f"{CPU_QUOTA_US} {CPU_PERIOD_US}", "cpu.weight": str(CPU_WEIGHT_V2)}
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").is_file():
        return CGROUP_ROOT / "cpu" / name, {"cpu.cfs_period_us": str(CPU_PERIOD_US),
                                             "cpu.cfs_quota_us": str(CPU_QUOTA_US), "cpu.shares": str(CPU_WEIGHT_V1)}
    pytest.skip("no cgroup cpu controller (cgroup v2 cpu.max or v1 cpu.cfs_quota_us) to limit a node with")


@pytest.fixture
def held_to_a_fraction_of_a_core():
    """hold(pid): the process and everything it starts held to CPU_QUOTA_US of CPU_PERIOD_US;
    released (moved back to the root group, the group removed) at the end."""
    group, settings = cpu_cgroup()
    group.mkdir()
    for name, value in settings.items():
        (group / name).write_text(value)

    def hold(pid: int) -> None:
        (group / "cgroup.procs").write_text(str(pid))

    yield hold
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            (group.parent / "cgroup.procs").write_text(pid)
        except ProcessLookupError:
            pass
    group.rmdir()


def test_six_nodes_name_the_slow_link_on_network_figures_and_the_slow_cpu_on_cpu_figures(
        ns_cluster_factory, held_to_a_fraction_of_a_core, sign_key, tmp_path):
    cluster = ns_cluster_factory(6)
    inventory = cluster.write_inventory(tmp_path / "cluster.yaml")
    limit = ["root", "tbf", "rate", SLOW_RATE, "burst", "64kb", "latency", "100ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", cluster.node(SLOW_LINK_NODE).veth_host, *limit], check=True)
    shaped = cluster.node_exec(SLOW_LINK_NODE, ["tc", "qdisc", "add", "dev", "eth0", *limit], timeout=10)
    assert shaped.returncode == 0, shaped.stderr
    held_to_a_fraction_of_a_core(cluster.node(SLOW_CPU_NODE).sshd_pid)  # sshd's sessions inherit it
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "quick", "-k", "stress_ng or iperf3")
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    named: dict[str, set[str]] = {}
    for outlier in results["outliers"]:
        named.setdefault(outlier["node"], set()).add(outlier["metric"])
    assert set(named) <= {SLOW_LINK_NODE, SLOW_CPU_NODE}, results["outliers"]  # no healthy node
    assert named.get(SLOW_LINK_NODE) == {"iperf3_bandwidth"}, results["outliers"]  # its CPU is as good
    warnings = results["verdict"].get("warnings", [])
    assert any(line.startswith(f"{SLOW_LINK_NODE}: iperf3 iperf3_bandwidth") for line in warnings), warnings
    report = (run_dir / "report.html").read_text()
    assert 'id="outliers"' in report and "bar-outlier" in report
    assert json.loads((run_dir / "ledger.jsonl").read_text().splitlines()[0])["profile"]["outliers"]["ignore"] == [
        "stress_vm"]
    stress = {c["node"]: c for c in results["checks"] if c["check"] == "stress_ng"}
    starved = sorted(node for node, c in stress.items()
                     if c["outcome"] != "passed" and "vm: 0 bogo ops" in c["message"])
    measured = [node for node, c in stress.items() if c["outcome"] == "passed"]
    if SLOW_CPU_NODE in starved or len(measured) < load_profile("cpu-only").outliers.min_nodes:
        # beside other work on this machine's 2 cores, even a healthy node's vm stressor can
        pytest.skip(f"stress-ng's vm stressor finished no bogo op on {', '.join(starved)}: the machine is "
                    "too busy for CPU figures; the slow link was named, the slow CPU is not judged")
    assert sorted(measured + starved) == cluster.node_names(), done.stdout[-3000:]
    healthy = [m["value"] for node in measured if node != SLOW_CPU_NODE for m in stress[node]["metrics"]
               if m["name"] == "stress_cpu" and m["value"]]
    spread = statistics.median(abs(v - statistics.median(healthy)) for v in healthy) / statistics.median(healthy)
    if not named.get(SLOW_CPU_NODE, set()) & {"stress_cpu", "stress_matrix"} and spread > CALM_SPREAD:
        # a test beside this one loads the 2 cores unevenly: the healthy nodes' own figures spread
        pytest.skip(f"the healthy nodes' stress_cpu figures spread {spread:.0%} about their median: the machine "
                    "is too busy to tell a slow CPU; the slow link was named")
    assert named.get(SLOW_CPU_NODE, set()) & {"stress_cpu", "stress_matrix"}, (spread, results["outliers"])
    junit = ET.parse(run_dir / "junit.xml").getroot()
    case = next(c for c in junit.iter("testcase") if c.get("name") == f"test_stress_ng[{SLOW_CPU_NODE}]")
    assert "warning: outlier node5: stress_ng stress_" in case.find("system-out").text
