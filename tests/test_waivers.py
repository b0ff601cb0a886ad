"""Waivers, the cluster ID, the report ID and the sign-off block: the record a delivery needs.

The inventory declares them (each mistake one line naming the field); a waived failure stays
failed in the ledger, is counted apart by the verdict, shown as waived (never as passed) and does
not fail the gate. One real run on this machine (transport local, `-m system`) checks the whole
path; the rest are pure tests on ledgers and results shaped like it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from handover.session import run_header
from inventory.loader import NAME_RULE, InventoryError, known_checks, load_inventory
from inventory.model import SignOff, Waiver
from reports.html import render_html
from reports.junit import render_junit
from reports.ledger import Ledger, now_iso, read_ledger
from reports.results import build_results, report_id
from reports.schema import validate_ledger_entry, validate_results
from reports.verdict import CERTIFIED, NOT_CERTIFIED, judge

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert(1)</script>"


def write(directory: Path, text: str, name: str = "inv.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def local(extra: str = "") -> str:
    """A local one-node inventory (this machine), plus extra top-level YAML from line 5."""
    return "cluster: here\nprofile: cpu-only\ntransport: local\nnodes: [localhost]\n" + textwrap.dedent(extra)


def cluster_of(extra: str = "") -> str:
    """Four SSH nodes without key files (the loader only checks files that are named)."""
    return "cluster: pod\nprofile: cpu-only\nnodes: ['gpu[001-004]']\n" + textwrap.dedent(extra)


def error_of(path: Path) -> str:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- the inventory


def test_waivers_cluster_id_and_sign_off_load(tmp_path):
    path = write(tmp_path, cluster_of("""
        cluster_id: ACME-POD7
        sign_off: {engineer: "Jane Doe, GPU Cloud", customer: "John Roe, ACME"}
        waivers:
          - {check: gpu_ecc, nodes: "gpu[003,001]", reason: "RMA 4711 under way", owner: ops@example.com,
             expires: 2027-01-31}
          - check: memory
            nodes: [gpu002, "gpu[004]"]
            reason: DIMM on order
            owner: Jane Doe
        """))
    cluster = load_inventory(path)
    assert cluster.identity == "ACME-POD7"
    assert cluster.sign_off == SignOff(engineer="Jane Doe, GPU Cloud", customer="John Roe, ACME")
    assert cluster.waivers == (
        Waiver("gpu_ecc", ("gpu001", "gpu003"), "RMA 4711 under way", "ops@example.com", "2027-01-31"),
        Waiver("memory", ("gpu002", "gpu004"), "DIMM on order", "Jane Doe", None))
    header = run_header(cluster, list(cluster.nodes))
    assert header["cluster_id"] == "ACME-POD7"
    assert header["sign_off"] == {"engineer": "Jane Doe, GPU Cloud", "customer": "John Roe, ACME"}
    assert header["waivers"][0] == {"check": "gpu_ecc", "nodes": ["gpu001", "gpu003"],
                                    "reason": "RMA 4711 under way", "owner": "ops@example.com",
                                    "expires": "2027-01-31"}
    validate_ledger_entry({"type": "run", "schema": "handover.ledger/1", "run_id": "20261201T000000Z-0123abcd",
                           "started": now_iso(), **header})


def test_without_them_the_cluster_id_is_the_name_and_nothing_is_waived(tmp_path):
    cluster = load_inventory(write(tmp_path, local()))
    assert (cluster.identity, cluster.waivers, cluster.sign_off) == ("here", (), SignOff())
    assert cluster.delivery() == {"cluster_id": "here", "waivers": [],
                                  "sign_off": {"engineer": None, "customer": None}}


@pytest.mark.parametrize("extra, message", [
    ("waivers:\n  - {check: gpu_eccc, nodes: gpu001, reason: r, owner: o}\n",
     "inv.yaml:5: waivers[0].check: unknown check 'gpu_eccc'; did you mean 'gpu_ecc'?"),
    ("waivers:\n  - {check: gpu_uniformity, nodes: gpu001, reason: r, owner: o}\n",
     "inv.yaml:5: waivers[0].check: check 'gpu_uniformity' runs once for the whole cluster, "
     "so it has no node to waive it on"),
    ("waivers:\n  - {check: memory, nodes: 'gpu[001-005]', reason: r, owner: o}\n",
     "inv.yaml:5: waivers[0].nodes: unknown node 'gpu005'; did you mean 'gpu004'?"),
    ("waivers:\n  - {check: memory, nodes: [gpu001, gpu01], reason: r, owner: o}\n",
     "inv.yaml:5: waivers[0].nodes[1]: unknown node 'gpu01'; did you mean 'gpu001'?"),
    ("waivers:\n  - {check: memory, nodes: gpu001, reason: r}\n",
     "inv.yaml:5: waivers[0]: missing required key 'owner'"),
    ("waivers:\n  - {check: memory, nodes: gpu001, reason: '', owner: o}\n",
     "inv.yaml:5: waivers[0].reason: must not be empty"),
    ("waivers:\n  - {check: memory, nodes: gpu001, reason: r, owner: o, expires: 2027-02-30}\n",
     "inv.yaml:5: waivers[0].expires: expected a date as YYYY-MM-DD, got '2027-02-30'"),
    ("waivers:\n  - {check: memory, nodes: gpu001, reason: r, owner: o, expires: next week}\n",
     "inv.yaml:5: waivers[0].expires: expected a date as YYYY-MM-DD, got 'next week'"),
    ("waivers:\n  - {check: memory, node: gpu001, reason: r, owner: o}\n",
     "inv.yaml:5: waivers[0].node: unknown key; did you mean 'nodes'?"),
    ("waivers: {check: memory}\n", "inv.yaml:4: waivers: expected a list, got a mapping"),
    ("sign_off: {engineer: Jane, custmer: John}\n",
     "inv.yaml:4: sign_off.custmer: unknown key; did you mean 'customer'?"),
    ("cluster_id: ACME POD 7\n",
     f"inv.yaml:4: cluster_id: invalid cluster ID 'ACME POD 7'; {NAME_RULE}"),
])
def test_a_wrong_waiver_or_record_field_is_one_line_naming_it(tmp_path, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    assert error_of(write(tmp_path, cluster_of(extra))) == message


def test_the_known_checks_are_the_suites_test_functions():
    checks = known_checks()
    assert checks["memory"] is False and checks["ib_write_bw"] is False and checks["gpu_burn_full"] is False
    assert checks["uniformity"] is True and checks["network_attribution"] is True
    assert not any(name.startswith("test_") for name in checks)


def test_a_waiver_holds_for_its_check_and_nodes_through_its_last_day():
    waiver = Waiver("gpu_ecc", ("gpu001",), "RMA", "ops", "2027-01-31")
    assert waiver.covers("gpu_ecc", "gpu001", "2027-01-31")
    assert not waiver.covers("gpu_ecc", "gpu001", "2027-02-01")
    assert not waiver.covers("gpu_ecc", "gpu002", "2026-12-01")
    assert not waiver.covers("memory", "gpu001", "2026-12-01")
    assert not waiver.covers("gpu_ecc", None, "2026-12-01")
    assert Waiver("gpu_ecc", ("gpu001",), "RMA", "ops").covers("gpu_ecc", "gpu001", "2999-12-31")


def test_the_example_inventory_shows_a_waiver_the_loader_accepts(tmp_path):
    lines = (ROOT / "inventory" / "example-cluster.yaml").read_text().splitlines()
    start = lines.index("# waivers:")
    block = [lines[start][2:]]
    for line in lines[start + 1:]:
        if not line.startswith("#   "):
            break
        block.append(line[2:])
    inventory = "cluster: example\nprofile: cpu-only\nnodes: ['gpu[001-032]']\n" + "\n".join(block) + "\n"
    cluster = load_inventory(write(tmp_path, inventory, "example.yaml"))
    assert [(w.check, w.nodes, w.expires) for w in cluster.waivers] == [("gpu_ecc", ("gpu017",), "2027-01-31")]
    assert "cluster_id: ACME-DC3-POD7" in lines and any(line.startswith("sign_off:") for line in lines)


# ---------------------------------------------------------------- verdict and results


def entry(node: str, check: str, outcome: str = "passed", **extra) -> dict:
    return {"type": "check", "test_id": f"suites/test_system.py::test_{check}[{node}]", "check": check,
            "area": "system", "depth": ["quick"], "node": node, "outcome": outcome,
            "kind": "performance" if outcome == "failed" else None, "message": f"{check} on {node}",
            "log_excerpt": "", "duration_s": 0.1, "finished": "2026-12-01T10:00:00+00:00", "raw": [],
            "metrics": [], **extra}


WAIVED = {"reason": "RMA 4711", "owner": "ops@example.com", "expires": None}


def test_a_waived_failure_is_counted_apart_and_certifies():
    checks = [entry("n1", "memory"), entry("n2", "memory", "failed", waived=WAIVED),
              entry("n3", "memory", "failed", waived=WAIVED)]
    verdict = judge({}, ["n1", "n2", "n3"], checks, [], False)
    assert verdict.status == CERTIFIED and not verdict.gate_failed
    assert verdict.waived == 2
    assert verdict.reasons == ["1 checks passed on 3 node(s), 2 failure(s) waived",
                               "waived: memory failed on n[2-3] (ops@example.com: RMA 4711)"]
    assert [row["status"] for row in verdict.nodes] == ["passed", "waived", "waived"]
    assert verdict.nodes[1]["reasons"] == [
        "n2: memory failed (performance), waived (ops@example.com: RMA 4711): memory on n2"]


def test_a_failure_beside_a_waived_one_still_fails_and_both_are_named():
    checks = [entry("n1", "memory", "failed"), entry("n1", "cpu", "failed", waived=WAIVED),
              entry("n2", "cpu", "failed", waived=WAIVED)]
    verdict = judge({}, ["n1", "n2"], checks, [], False)
    assert verdict.status == NOT_CERTIFIED and verdict.gate_failed and verdict.waived == 2
    assert verdict.reasons[0] == "n1: memory failed (performance): memory on n1"
    assert verdict.reasons[-1] == "waived: cpu failed on n[1-2] (ops@example.com: RMA 4711)"
    assert [row["status"] for row in verdict.nodes] == ["failed", "waived"]


def write_run(tmp_path: Path, entries: list[dict], inventory: str) -> Path:
    cluster = load_inventory(write(tmp_path, inventory, "run.yaml"))
    ledger = Ledger.create(tmp_path / "out", cluster.name, run_header(cluster, list(cluster.nodes)))
    ledger.append({"type": "selection", "nodes": [n.name for n in cluster.nodes],
                   "tests": [e["test_id"] for e in entries]})
    for item in entries:
        ledger.append(item)
    ledger.append({"type": "end", "finished": now_iso(), "exitstatus": 0, "interrupted": False})
    return ledger.run_dir


WAIVING = """
    cluster_id: ACME-POD7
    waivers:
      - {check: memory, nodes: "gpu[002-003]", reason: "RMA 4711", owner: ops@example.com}
      - {check: cpu, nodes: gpu004, reason: "%s", owner: ops@example.com, expires: 2026-01-31}
    """ % SCRIPT


def waived_results(tmp_path: Path) -> dict:
    entries = [entry("gpu001", "memory"), entry("gpu002", "memory", "failed", waived=WAIVED, action="re-run"),
               entry("gpu003", "memory"), entry("gpu004", "memory"),
               entry("gpu004", "cpu", "failed", action="replace the CPU")]  # its waiver had expired
    results, _ = build_results(read_ledger(write_run(tmp_path, entries, cluster_of(WAIVING))))
    return results


def test_results_carry_the_report_id_the_waivers_and_how_many_each_waived(tmp_path):
    results = waived_results(tmp_path)
    validate_results(results)
    run = results["run"]
    assert run["cluster_id"] == "ACME-POD7"
    assert run["report_id"] == report_id("ACME-POD7", run["run_id"]) == f"ACME-POD7-{run['run_id']}"
    assert run["sign_off"] == {"engineer": None, "customer": None}
    assert [(w["check"], w["nodes"], w["waived"]) for w in run["waivers"]] == [
        ("memory", ["gpu002", "gpu003"], 1), ("cpu", ["gpu004"], 0)]
    assert results["verdict"]["status"] == NOT_CERTIFIED and results["verdict"]["waived"] == 1
    waived = next(c for c in results["checks"] if c.get("waived"))
    assert (waived["node"], waived["outcome"], waived["waived"]) == ("gpu002", "failed", WAIVED)


def test_junit_shows_a_waived_failure_as_skipped_with_the_waiver(tmp_path):
    suite = ET.fromstring(render_junit(waived_results(tmp_path))).find("testsuite")
    assert suite is not None
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    waived = cases["test_memory[gpu002]"]
    skipped = waived.find("skipped")
    assert skipped is not None and waived.find("failure") is None
    assert skipped.get("message") == ("waived (ops@example.com: RMA 4711); failed [performance] "
                                      "memory on gpu002")
    assert "what to do next: re-run" in (skipped.text or "")
    properties = {p.get("name"): p.get("value") for p in waived.iter("property")}
    assert properties == {"handover.action": "re-run", "handover.waived_owner": "ops@example.com",
                          "handover.waived_reason": "RMA 4711"}
    failed = cases["test_cpu[gpu004]"].find("failure")
    assert failed is not None and (failed.text or "").endswith("what to do next: replace the CPU")
    assert suite.get("skipped") == "1" and suite.get("failures") == "2"  # cpu, and the verdict


def test_the_report_shows_waived_failures_apart_never_as_passed(tmp_path):
    html = render_html(waived_results(tmp_path))
    assert '<h2 id="waived">Waived failures (1)</h2>' in html
    assert '<tr id="waived-1">' in html and "RMA 4711" in html
    assert 'class="sq sq-skipped" href="#waived-1"' in html  # the matrix cell: W, not a pass
    assert '<li><span class="badge">waived</span> <a href="#waived-1">memory</a> on gpu002' in html  # by area
    assert html.count('id="fail-') == 1  # only the cpu failure is one to act on
    assert SCRIPT not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Waivers in the inventory" in html


def test_the_report_header_and_sign_off_block(tmp_path):
    results = waived_results(tmp_path)
    html = render_html(results)
    masthead = html[html.index('<header class="masthead"'):html.index("</header>")]
    assert f"<b>{results['run']['report_id']}</b>" in masthead and "ACME-POD7" in masthead
    sign_off = html[html.index('<h2 id="sign-off">'):html.index("<footer>")]
    assert sign_off.count("Signature</dt><dd>______________________________") == 2
    assert sign_off.count("Name</dt><dd>______________________________") == 2  # no names: blank lines
    results["run"]["sign_off"] = {"engineer": "Jane Doe", "customer": f"John {SCRIPT}"}
    signed = render_html(results)
    sign_off = signed[signed.index('<h2 id="sign-off">'):signed.index("<footer>")]
    assert "Operator engineer" in sign_off and "<dd>Jane Doe</dd>" in sign_off
    assert "John &lt;script&gt;" in sign_off and SCRIPT not in signed


# ---------------------------------------------------------------- one real run


LOCAL_WAIVED = """
    cluster: local
    cluster_id: ACME-POD7
    profile: cpu-only
    transport: local
    nodes: [localhost]
    references:
      memory_total: {value: 100000000, lower: -0.01, source: "more memory than any machine here has"}
    waivers:
      - {check: memory, nodes: localhost, reason: "DIMMs on order, RMA 4711", owner: ops@example.com,
         expires: 2999-12-31}
    sign_off: {engineer: "Jane Doe, GPU Cloud", customer: "John Roe, ACME"}
    """


@pytest.fixture(scope="module")
def waived_run(sign_key, tmp_path_factory):
    """`pytest -m system` on this machine, its memory check failing against a band no machine
    meets and waived by the inventory."""
    tmp = tmp_path_factory.mktemp("waived")
    inventory = write(tmp, LOCAL_WAIVED, "local.yaml")
    done = subprocess.run([sys.executable, "-m", "pytest", f"--inventory={inventory}", f"--out={tmp / 'out'}",
                           f"--sign-key={sign_key}", "-p", "no:cacheprovider", "-m", "system", "-rx"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done, (tmp / "out" / "local" / "latest").resolve()


def test_a_waived_failure_passes_the_gate_and_says_so(waived_run):
    done, _ = waived_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert "XFAIL suites/test_system.py::test_memory[localhost] - waived (ops@example.com): " \
           "DIMMs on order, RMA 4711" in done.stdout
    assert "verdict: CERTIFIED" in done.stdout
    assert "waived: memory failed on localhost (ops@example.com: DIMMs on order, RMA 4711)" in done.stdout


def test_the_ledger_keeps_the_failure_failed_with_its_waiver_and_action(waived_run):
    _, run_dir = waived_run
    lines = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    for number, line in enumerate(lines, 1):
        validate_ledger_entry(line, source=f"ledger.jsonl:{number}")
    assert lines[0]["cluster_id"] == "ACME-POD7" and lines[0]["waivers"][0]["check"] == "memory"
    memory = next(line for line in lines if line.get("check") == "memory")
    assert (memory["outcome"], memory["kind"]) == ("failed", "performance")
    assert memory["waived"] == {"reason": "DIMMs on order, RMA 4711", "owner": "ops@example.com",
                                "expires": "2999-12-31"}
    assert memory["action"].startswith("re-run the check; if the figure stays outside its band")
    assert all("action" not in line for line in lines if line.get("outcome") == "passed")


def test_the_renderings_of_the_real_run(waived_run):
    _, run_dir = waived_run
    results = json.loads((run_dir / "results.json").read_text())
    assert results["run"]["report_id"] == f"ACME-POD7-{run_dir.name}"
    assert results["verdict"]["status"] == CERTIFIED and results["verdict"]["waived"] == 1
    assert {n["name"]: n["status"] for n in results["nodes"]} == {"localhost": "waived"}
    assert results["run"]["waivers"][0]["waived"] == 1
    html = (run_dir / "report.html").read_text()
    assert "Jane Doe, GPU Cloud" in html and "John Roe, ACME" in html
    assert f"ACME-POD7-{run_dir.name}" in html and "Waived failures (1)" in html
    cases = {c.get("name"): c for c in ET.parse(run_dir / "junit.xml").iter("testcase")}
    assert cases["test_memory[localhost]"].find("skipped") is not None
    assert cases["certification"].find("failure") is None
