"""`handover diff OLD_RUN NEW_RUN`: what got worse or better from one run of a cluster to the next.

Both runs are ledgers written with the real Ledger and run_header for an inventory, their metric
rows judged by suites.checks.Metrics against its profile, as a run writes them; one side is also
rendered to results.json, the other read from its ledger, as the command does for a run cut short.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

from handover import failures
from handover.cli import main
from handover.session import run_header
from inventory.loader import load_inventory
from reports.diff import diff_runs, load_run, render_text
from reports.ledger import Ledger, now_iso, read_ledger
from reports.results import build_results, write_results
from suites.checks import Metrics

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = """
    cluster: pod
    profile: cpu-only
    nodes: ['gpu[001-005]']
    references:
      stress_cpu: {check: stress_ng, value: 100, lower: -0.5, unit: bogo-ops/s, source: "test floor"}
    waivers:
      - {check: cpu, nodes: gpu005, reason: "CPU swap booked", owner: ops@example.com}
    """


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = tmp_path_factory.mktemp("inventory") / "pod.yaml"
    path.write_text(textwrap.dedent(INVENTORY).lstrip("\n"))
    return load_inventory(path)


def judged(cluster, check: str, **measured) -> tuple[list[dict], Optional[str]]:
    """The metric rows Metrics.judge records, and its failure message, if any."""
    rows: list[dict] = []
    try:
        Metrics(check, cluster.profile, rows.extend).judge(**measured)
    except failures.PerformanceFailure as miss:
        return rows, str(miss)
    return rows, None


def entry(cluster, node: str, check: str, outcome: Optional[str] = None, *, kind: Optional[str] = None,
          message: str = "", waived: Optional[dict] = None, **measured) -> dict:
    """A check entry as the recorder writes it; a performance miss fails it, as in a run."""
    metrics, miss = judged(cluster, check, **measured)
    outcome = outcome or ("failed" if miss else "passed")
    kind = kind or ("performance" if miss else None)
    found = {"type": "check", "test_id": f"suites/test_system.py::test_{check}[{node}]", "check": check,
             "area": "system", "depth": ["quick"], "node": node, "outcome": outcome, "kind": kind,
             "message": message or miss or "", "log_excerpt": "", "duration_s": 0.5, "finished": now_iso(),
             "raw": [], "metrics": metrics}
    if outcome == "failed":
        found["action"] = failures.action_for(kind or "error")
    if waived:
        found["waived"] = waived
    return found


def write_run(tmp_path: Path, cluster, nodes: list[str], entries: list[dict]) -> Path:
    ledger = Ledger.create(tmp_path, cluster.name, run_header(cluster, [cluster.node(n) for n in nodes]))
    ledger.append({"type": "selection", "nodes": nodes, "tests": [e["test_id"] for e in entries]})
    for item in entries:
        ledger.append(item)
    ledger.append({"type": "end", "finished": now_iso(), "exitstatus": 0, "interrupted": False})
    return ledger.run_dir


WAIVER = {"reason": "CPU swap booked", "owner": "ops@example.com", "expires": None}


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """An old run rendered to results.json and a newer one only in its ledger: gpu002 lost
    memory, gpu003 became reachable again, gpu004 is gone, gpu005 is new with a waived failure,
    and gpu001's CPU rate fell by 35% inside its band while its GPU memory moved."""
    old = write_run(tmp_path_factory.mktemp("old"), cluster, ["gpu001", "gpu002", "gpu003", "gpu004"], [
        entry(cluster, "gpu001", "memory", memory_total=(23.5, "GiB")),
        entry(cluster, "gpu002", "memory", memory_total=(23.5, "GiB")),
        entry(cluster, "gpu003", "reachable", "failed", kind="unreachable", message="gpu003 unreachable"),
        entry(cluster, "gpu004", "memory", memory_total=(23.5, "GiB")),
        entry(cluster, "gpu001", "stress_ng", stress_cpu=(100.0, "bogo-ops/s")),
        entry(cluster, "gpu001", "gpu_inventory", gpu_memory=(80.0, "GiB")),
    ])
    write_results(build_results(read_ledger(old))[0], old)
    new = write_run(tmp_path_factory.mktemp("new"), cluster, ["gpu001", "gpu002", "gpu003", "gpu005"], [
        entry(cluster, "gpu001", "memory", memory_total=(23.4, "GiB")),
        entry(cluster, "gpu002", "memory", memory_total=(0.5, "GiB")),
        entry(cluster, "gpu003", "reachable"),
        entry(cluster, "gpu005", "cpu", "failed", kind="expectation", message="wrong CPU model", waived=WAIVER),
        entry(cluster, "gpu001", "stress_ng", stress_cpu=(65.0, "bogo-ops/s")),
        entry(cluster, "gpu001", "gpu_inventory", gpu_memory=(60.0, "GiB")),
    ])
    return old, new


def handover(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handover.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def diff_command(capsys, *args) -> tuple[int, str, str]:
    """`handover diff ...` in this process (the command's own main), for its exit status and output."""
    try:
        status = main(["diff", *map(str, args)])
    except SystemExit as usage:  # argparse's usage errors
        status = int(usage.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def test_what_got_worse_and_what_got_better(runs):
    old, new = runs
    assert (old / "results.json").is_file() and not (new / "results.json").exists()
    found = diff_runs(load_run(old), load_run(new))
    assert found["worse"] is True
    assert found["verdict"] == {"old": "NOT CERTIFIED", "new": "NOT CERTIFIED", "worse": False}
    assert [(f["node"], f["check"], f["before"], f["after"], f["worse"]) for f in found["new_failures"]] == [
        ("gpu002", "memory", "passed", "failed", True), ("gpu005", "cpu", None, "waived", False)]
    assert found["new_failures"][0]["action"] == failures.ACTIONS["performance"]
    assert [(f["node"], f["check"], f["before"], f["kind"]) for f in found["fixed"]] == [
        ("gpu003", "reachable", "failed", "unreachable")]
    assert found["nodes"] == {"failed": ["gpu002"], "fixed": [], "added": ["gpu005"], "missing": ["gpu004"]}
    moved = {(m["node"], m["metric"]): m for m in found["metrics"]}
    assert set(moved) == {("gpu002", "memory_total"), ("gpu001", "stress_cpu"), ("gpu001", "gpu_memory")}
    assert (moved["gpu002", "memory_total"]["why"], moved["gpu002", "memory_total"]["worse"]) == ("left its band", True)
    cpu = moved["gpu001", "stress_cpu"]
    assert (cpu["old"], cpu["new"], cpu["change"], cpu["direction"]) == (100.0, 65.0, -0.35, "worse")
    assert cpu["why"] == "moved more than 10%"
    assert moved["gpu001", "gpu_memory"]["direction"] == "unknown"  # no band: listed, not judged
    assert not moved["gpu001", "gpu_memory"]["worse"]


def test_a_threshold_above_the_change_leaves_it_out(runs):
    old, new = runs
    found = diff_runs(load_run(old), load_run(new), threshold=0.5)
    assert {(m["node"], m["metric"]) for m in found["metrics"]} == {("gpu002", "memory_total")}


def test_a_run_compared_with_itself_has_no_differences(runs):
    old, _ = runs
    found = diff_runs(load_run(old), load_run(old))
    assert not found["worse"] and not found["new_failures"] and not found["metrics"]
    assert render_text(found).endswith("no differences\nnothing got worse\n")


def test_the_other_way_round_only_the_missing_node_and_the_fall_back_are_worse(runs):
    old, new = runs
    found = diff_runs(load_run(new), load_run(old))
    assert [(f["node"], f["check"]) for f in found["new_failures"]] == [("gpu003", "reachable")]
    assert [(f["node"], f["before"]) for f in found["fixed"]] == [("gpu002", "failed")]
    assert found["nodes"]["missing"] == ["gpu005"] and found["worse"]
    moved = {(m["node"], m["metric"]): m["direction"] for m in found["metrics"]}
    assert moved[("gpu002", "memory_total")] == "better" and moved[("gpu001", "stress_cpu")] == "better"


def test_the_command_prints_text_and_exits_1_when_something_got_worse(runs):
    old, new = runs
    done = handover("diff", old, new)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"old: pod-{old.name} (pod): NOT CERTIFIED"
    assert "new failures (2):" in lines
    assert any(line.startswith("  gpu002 · memory: passed -> failed (performance): memory_total = 0.5 GiB")
               for line in lines)
    assert f"    next: {failures.ACTIONS['performance']}" in lines
    assert "  gpu005 · cpu: no result -> waived (expectation): wrong CPU model (waived)" in lines
    assert "  gpu003 · reachable: failed (unreachable) -> passed" in lines
    assert "nodes: failed gpu002; added gpu005; missing gpu004 (missing is worse)" in lines
    assert "  gpu001 · stress_ng · stress_cpu: 100 -> 65 bogo-ops/s (-35.0%): moved more than 10% (worse)" in lines
    assert lines[-1] == "something got worse"
    same = handover("diff", old, old)
    assert same.returncode == 0 and same.stdout.endswith("nothing got worse\n") and same.stderr == ""


def test_the_command_prints_json_for_scripts(runs, capsys):
    old, new = runs
    status, out, _ = diff_command(capsys, old, new, "--json", "--threshold", "0.5")
    assert status == 1
    found = json.loads(out)
    assert found == diff_runs(load_run(old), load_run(new), 0.5)
    assert found["old"]["report_id"] == f"pod-{old.name}" and found["threshold"] == 0.5


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "nowhere", "nowhere: no such run directory"),
    (lambda tmp: tmp, "no ledger here"),
    (lambda tmp: (tmp / "results.json").write_text("{not json") and tmp, "results.json: not a readable results"),
    (lambda tmp: (tmp / "results.json").write_text('{"schema": "handover.results/1"}') and tmp,
     "results.json: run: required, but missing"),
])
def test_a_run_that_cannot_be_read_is_one_line_and_exit_2(runs, tmp_path, capsys, make, message):
    old, _ = runs
    status, out, err = diff_command(capsys, old, make(tmp_path))
    assert status == 2
    assert err.startswith("handover: ") and message in err and err.count("\n") == 1
    assert out == ""


def test_a_threshold_that_is_no_fraction_is_a_usage_error(runs, capsys):
    old, new = runs
    status, _, err = diff_command(capsys, old, new, "--threshold", "ten")
    assert status == 2 and "expected a fraction such as 0.1, got 'ten'" in err
    status, help_text, _ = diff_command(capsys, "--help")
    assert status == 0 and "0 when nothing got worse, 1 when" in " ".join(help_text.split())


def fleet_run(nodes: list[str], checks: list[dict], status: str) -> dict:
    """A results document of many nodes, with what diff_runs reads."""
    failed = {c["node"] for c in checks if c["outcome"] == "failed"}
    return {"run": {"run_id": status.lower(), "cluster": "fleet", "nodes": nodes}, "verdict": {"status": status},
            "nodes": [{"name": n, "status": "failed" if n in failed else "passed"} for n in nodes], "checks": checks}


def fleet_check(node: str, check: str, outcome: str = "passed", message: str = "", rate: float = 100.0) -> dict:
    return {"test_id": f"suites/test_system.py::test_{check}[{node}]", "check": check, "node": node,
            "outcome": outcome, "kind": "unreachable" if outcome == "failed" else None, "message": message,
            "metrics": [{"name": "stress_cpu", "value": rate, "unit": "bogo-ops/s", "ok": True, "band": [50, None]}]
            if check == "stress_ng" and outcome == "passed" else []}


def test_in_a_fleet_the_nodes_that_changed_alike_share_a_line():
    """70 nodes: a rack of 20 lost (each reason names its own address), 30 others' CPU rate fell
    by 20-30 %: two lines of new failures (one per check) and one line of metrics with the range
    and the node that moved most; --json keeps every item. Below a fleet, a line each."""
    nodes = [f"gpu{i:03d}" for i in range(1, 71)]
    rack, slow = nodes[:20], nodes[20:50]
    old = fleet_run(nodes, [fleet_check(n, c) for n in nodes for c in ("memory", "stress_ng")], "CERTIFIED")
    lost = {n: f"{n} unreachable: port 22 on 10.0.3.{i} refused" for i, n in enumerate(rack)}
    new = fleet_run(nodes, [fleet_check(n, c, "failed", lost[n]) if n in rack else
                            fleet_check(n, c, rate=80.0 - (slow.index(n) % 3) * 5 if n in slow else 100.0)
                            for n in nodes for c in ("memory", "stress_ng")], "NOT CERTIFIED")
    found = diff_runs(old, new)
    assert len(found["new_failures"]) == 40 and len(found["metrics"]) == 30
    lines = render_text(found, fleet=True).splitlines()
    assert "new failures (40):" in lines and "metrics (30):" in lines
    assert [line for line in lines if line.startswith("  ")] == [
        "  gpu[001-020] (20 nodes) · memory: passed -> failed (unreachable): gpu001 unreachable: port 22 on "
        "10.0.3.0 refused",
        "  gpu[001-020] (20 nodes) · stress_ng: passed -> failed (unreachable): gpu001 unreachable: port 22 on "
        "10.0.3.0 refused",
        "  gpu[021-050] (30 nodes) · stress_ng · stress_cpu: -30.0% to -20.0%, the most gpu023: 100 -> 70 "
        "bogo-ops/s: moved more than 10% (worse)"]
    assert len([line for line in render_text(found).splitlines() if line.startswith("  ")]) == 70
