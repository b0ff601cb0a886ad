"""End to end: the acceptance suites run by pytest against real nodes, then the run directory
(results.json, junit.xml, report.html, signatures) is checked as an operator and a customer would.
"""
from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import pytest
from nodes import local_inventory_without_scratch, wait_for_no_leftovers

from handover.plugin import FAILURES_SECTION_MAX

ROOT = Path(__file__).resolve().parent.parent


def handover(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handover.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def run_suites(inventory, out, key, *extra, timeout=300, form="space") -> subprocess.CompletedProcess:
    """pytest --inventory FILE --out DIR --sign-key KEY ..., as the README says; form 'equals'
    writes --inventory=FILE instead (both work with paths anywhere)."""
    values = {"--inventory": inventory, "--out": out, "--sign-key": key}
    words = [word for option, value in values.items()
             for word in ([option, str(value)] if form == "space" else [f"{option}={value}"])]
    return subprocess.run([sys.executable, "-m", "pytest", *words, "-p", "no:cacheprovider", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def run_dir_of(out: Path, cluster: str) -> Path:
    return (out / cluster / "latest").resolve()


def ledger_types(out: Path) -> set[str]:
    """The entry types in the ledgers under out so far (a line being written is left out)."""
    return {json.loads(line)["type"] for ledger in out.glob("*/*/ledger.jsonl")
            for line in ledger.read_text().splitlines() if line.endswith("}")}


def results_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def ssh_keygen_verifies(run_dir: Path, name: str) -> bool:
    with open(run_dir / name, "rb") as data:
        return subprocess.run(
            ["ssh-keygen", "-Y", "verify", "-f", str(run_dir / "allowed_signers"),
             "-I", "ops@example.com", "-n", "handover", "-s", str(run_dir / f"{name}.sig")],
            stdin=data, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def healthy_run(ns_cluster, sign_key, tmp_path_factory):
    """The quick acceptance run on four healthy nodes, less its torch checks: those are most of its
    time on two cores, and run on namespace nodes in tests/test_collectives.py (healthy) and
    tests/test_training_suite.py (every training check, one node behind a slow link)."""
    tmp = tmp_path_factory.mktemp("healthy")
    inventory = ns_cluster.write_inventory(tmp / "cluster.yaml")
    done = run_suites(inventory, tmp / "out", sign_key, "-m", "quick and not training")
    return done, run_dir_of(tmp / "out", "nscluster")


def test_four_node_cluster_is_certified(healthy_run):
    done, run_dir = healthy_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: CERTIFIED" in done.stdout
    results = results_of(run_dir)
    assert results["schema"] == "handover.results/1"
    assert results["verdict"]["status"] == "CERTIFIED"
    assert [n["status"] for n in results["nodes"]] == ["passed"] * 4
    memory = [c for c in results["checks"] if c["check"] == "memory"]
    assert sorted(c["node"] for c in memory) == ["node1", "node2", "node3", "node4"]
    assert all(m["metrics"][0]["ok"] and m["metrics"][0]["unit"] == "GiB" for m in memory)
    assert (run_dir / "raw" / "system_facts" / "node3.stdout").is_file()


def test_junit_ids_are_node_names(healthy_run):
    _, run_dir = healthy_run
    cases = {c.get("name") for c in ET.parse(run_dir / "junit.xml").iter("testcase")}
    assert {f"test_kernel[node{i}]" for i in range(1, 5)} <= cases
    assert "test_uniformity" in cases and "certification" in cases


def test_report_and_results_are_signed_and_verify_with_stock_ssh_keygen(healthy_run, trusted_signers):
    _, run_dir = healthy_run
    html = (run_dir / "report.html").read_text()
    assert "CERTIFIED" in html and "node4" in html
    assert ssh_keygen_verifies(run_dir, "report.html")
    assert ssh_keygen_verifies(run_dir, "results.json")
    verified = handover("verify", run_dir, "--allowed-signers", trusted_signers)
    assert verified.returncode == 0, verified.stdout
    assert verified.stdout.count("good signature by ops@example.com") == 4


def test_changing_one_byte_fails_verification(healthy_run, tmp_path):
    _, run_dir = healthy_run
    copy = tmp_path / "run"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    report = copy / "report.html"
    data = bytearray(report.read_bytes())
    data[len(data) // 2] ^= 0x01
    report.write_bytes(bytes(data))
    verified = handover("verify", copy)
    assert verified.returncode == 1
    assert "BAD report.html" in verified.stdout and "OK  results.json" in verified.stdout
    assert not ssh_keygen_verifies(copy, "report.html")


def test_local_inventory_is_certified(sign_key, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    inventory = tmp_path / "local.yaml"
    inventory.write_text((ROOT / "inventory" / "local.yaml").read_text()
                         .replace("/var/tmp/handover-scratch", str(scratch)))
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "quick")
    assert done.returncode == 0, done.stdout + done.stderr
    assert results_of(run_dir_of(tmp_path / "out", "local"))["verdict"]["status"] == "CERTIFIED"


def test_stopped_node_fails_as_unreachable_and_the_others_pass(ns_cluster_factory, sign_key, tmp_path):
    nodes = ns_cluster_factory(4)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    nodes.stop_sshd("node2")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system")
    assert done.returncode == 1
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    assert results["verdict"]["status"] == "NOT CERTIFIED"
    status = {n["name"]: n["status"] for n in results["nodes"]}
    assert status == {"node1": "passed", "node2": "failed", "node3": "passed", "node4": "passed"}
    node2 = [c for c in results["checks"] if c["node"] == "node2"]
    assert node2 and all(c["outcome"] == "failed" and c["kind"] == "unreachable" for c in node2)
    assert "node2 unreachable" in node2[0]["message"]
    uniformity = next(c for c in results["checks"] if c["check"] == "uniformity")
    assert uniformity["outcome"] == "passed" and "no facts from node2" in uniformity["message"]
    assert results["run"]["unlocked"] == []  # node2 was not locked, nor tested: not listed as tested unlocked
    assert "NOT CERTIFIED" in (run_dir / "report.html").read_text()
    assert ssh_keygen_verifies(run_dir, "report.html")


def test_a_login_banner_on_stdout_is_not_taken_for_the_tools_output(ns_cluster_factory, sign_key, tmp_path):
    """bash reads ~/.bashrc for an ssh command, and HPC sites' often greet from it: the banner
    comes before every command's output (every payload's JSON failed to parse, 56 checks)."""
    nodes = ns_cluster_factory(2)
    with open(nodes.workdir / "empty", "w") as bashrc:  # in place: each node's root .bashrc is bound to it
        bashrc.write('echo "Welcome to cluster X"\necho "Welcome to cluster X (stderr)" >&2\n')
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system")
    assert done.returncode == 0, done.stdout[-3000:]
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    assert results["verdict"]["status"] == "CERTIFIED"
    memory = next(c for c in results["checks"] if (c["check"], c["node"]) == ("memory", "node2"))
    assert memory["outcome"] == "passed" and memory["metrics"][0]["value"] > 0


@pytest.mark.skipif(shutil.which("tcsh") is None, reason="tcsh is not installed (make test's set-up installs it)")
def test_a_csh_login_shell_runs_the_node_side_scripts(ns_cluster_factory, sign_key, tmp_path):
    """sshd hands each command line to the user's login shell: tcsh could not parse the node-side
    scripts (a quoted newline), so node locks and the watchdog were silently off and the run was
    CERTIFIED all the same. root's shell is tcsh on both nodes (their own /etc/passwd)."""
    nodes = ns_cluster_factory(2)
    passwd = tmp_path / "passwd"
    passwd.write_text(re.sub(r"^(root:.*:)[^:\n]*$", rf"\g<1>{shutil.which('tcsh')}",
                             Path("/etc/passwd").read_text(), count=1, flags=re.M))
    for node in nodes.nodes:  # into each sshd's own mount namespace, as its /etc/hosts
        subprocess.run(["nsenter", "-t", str(node.sshd_pid), "-m", "mount", "--bind", str(passwd), "/etc/passwd"],
                       check=True)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system")
    assert done.returncode == 0 and "not locked" not in done.stdout, done.stdout[-3000:]
    assert results_of(run_dir_of(tmp_path / "out", "nscluster"))["verdict"]["status"] == "CERTIFIED"


def test_a_fleet_that_cannot_be_reached_reads_as_one_reason_without_a_failures_section(sign_key, tmp_path):
    """65 nodes (a fleet) whose SSH port refuses, each at its own address: 975 failed checks.
    Their reasons differ only by name, address and clock time, so the verdict gives one; pytest's
    FAILURES section and short summary FAILED lines, past FAILURES_SECTION_MAX, are left out and
    said so, the verdict ending the output (--tb=short and -rf bring them back, and -rf alone
    leaves the section out); the nodes not locked, alike but for their own words, are one line."""
    nodes = ", ".join(f"{{name: d{index:04d}, address: 127.0.0.{index + 1}}}" for index in range(65))
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(f"cluster: fleet\nprofile: cpu-only\nnodes: [{nodes}]\nssh: {{port: 1, host_keys: "
                         f"accept-new, known_hosts: {tmp_path / 'known_hosts'}, connect_timeout: 2}}\n")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "  - d[0000-0064] (65 nodes): fabric_manager, peermem, pcie_acs, iommu, cpu_governor and 10 more " \
           "checks failed (unreachable): d0000 unreachable: " in done.stdout, done.stdout
    assert (f"handover: 975 checks failed (more than {FAILURES_SECTION_MAX}): pytest's FAILURES section and "
            "short summary's FAILED lines are left out (--tb=short and -rf ask for them)") in done.stdout
    lines = done.stdout.splitlines()
    assert "= FAILURES =" not in done.stdout and not any(line.startswith("FAILED ") for line in lines)
    assert " 975 failed, " in lines[-1] and lines[-2].startswith("signed by ")  # the verdict ends the output
    assert "handover: d[0000-0064] (65 nodes): d0000 not locked: d0000 unreachable: " in done.stdout
    assert done.stdout.count(" not locked: ") == 1
    asked = run_suites(inventory, tmp_path / "out2", sign_key, "-m", "system", "--tb=short", "-rf")
    assert "= FAILURES =" in asked.stdout and "left out" not in asked.stdout
    assert "[unreachable] d0000 unreachable: lost at " in asked.stdout and "Traceback" not in asked.stdout
    assert any(line.startswith("FAILED ") and "test_memory[d0064]" in line for line in asked.stdout.splitlines())
    listed = run_suites(inventory, tmp_path / "out3", sign_key, "-m", "system", "-rf")
    assert "pytest's FAILURES section is left out (--tb=short asks for it)" in listed.stdout
    assert sum(line.startswith("FAILED ") for line in listed.stdout.splitlines()) == 975


def test_nodes_option_and_k_select_nodes(ns_cluster, sign_key, tmp_path):
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system", "--nodes", "node[2-3]")
    assert done.returncode == 0, done.stdout
    assert results_of(run_dir_of(tmp_path / "out", "nscluster"))["run"]["nodes"] == ["node2", "node3"]
    done = run_suites(inventory, tmp_path / "out2", sign_key, "-k", "node4 and memory")
    assert done.returncode == 0, done.stdout
    results = results_of(run_dir_of(tmp_path / "out2", "nscluster"))
    assert results["run"]["nodes"] == ["node4"]
    assert [c["test_id"].split("::")[1] for c in results["checks"]] == ["test_memory[node4]"]
    assert results["verdict"]["status"] == "INCOMPLETE"  # the other mandatory checks did not run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_run_keeps_its_results_and_can_be_reported_and_resumed(
        ns_cluster_factory, sign_key, tmp_path, signum):
    """Ctrl-C (or a CI job's SIGTERM) while a node hangs at connect: what finished is kept, the
    report says the run was interrupted, and --resume completes it."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml", extra={})
    text = inventory.read_text().replace("connect_timeout: 5", "connect_timeout: 60")
    inventory.write_text(text)
    nodes.link_down("node2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", f"--inventory={inventory}", f"--out={tmp_path / 'out'}",
         f"--sign-key={sign_key}", "-p", "no:cacheprovider", "-m", "system"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120  # a busy machine starts pytest slowly: wait for the checks to begin
    while "selection" not in ledger_types(tmp_path / "out"):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never selected its checks"
        time.sleep(0.05)
    time.sleep(1)  # node1's checks run, node2's connect hangs
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output  # pytest's "interrupted"
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    assert results["run"]["interrupted"] is True
    assert results["verdict"]["status"] in ("INCOMPLETE", "NOT CERTIFIED")
    assert any("interrupted" in reason for reason in results["verdict"]["reasons"])
    (run_dir / "report.html").unlink()
    rendered = handover("report", run_dir, "--sign-key", sign_key)
    assert rendered.returncode == 0, rendered.stderr
    assert "verdict:" in rendered.stdout and (run_dir / "report.html").is_file()
    assert ssh_keygen_verifies(run_dir, "report.html")

    # The link is mended; --resume runs only what has no result and completes the same run.
    nodes.link_up("node2")
    done_before = {c["test_id"] for c in results["checks"]}
    resumed = run_suites(inventory, tmp_path / "unused", sign_key, "-m", "system", f"--resume={run_dir}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    results = results_of(run_dir)
    assert results["verdict"]["status"] == "CERTIFIED" and results["run"]["interrupted"] is False
    assert {c["node"] for c in results["checks"]} == {"node1", "node2", None}
    if done_before:
        assert f"{len(done_before)} deselected" in resumed.stdout
    assert not (tmp_path / "unused").exists()


def test_a_run_directory_is_one_harness_at_a_time_and_resuming_a_finished_run_changes_nothing(
        ns_cluster_factory, sign_key, tmp_path):
    """Two harnesses on one run directory (a resume started while the run, or another resume of
    it, still went) each took the other's node locks for another run's and recorded its checks
    as busy over the first one's results. A held directory is refused to a second resume and to
    `handover report`. A finished run resumed has nothing to run: it exits 0 (pytest's 5 before,
    a CI gate's failure), and --collect-only lists it without writing to it."""
    nodes = ns_cluster_factory(1)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system and quick")
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from reports.ledger import Ledger; "
                               "Ledger(sys.argv[1]).hold(); print('held', flush=True); time.sleep(120)", str(run_dir)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system and quick", f"--resume={run_dir}")
        assert refused.returncode != 0
        assert f"--resume: {run_dir} is in use by another harness (the run itself, or a resume of it, still " \
               "going): wait for it to end" in refused.stdout + refused.stderr
        report = handover("report", run_dir, "--sign-key", sign_key)
        assert report.returncode == 2 and "is in use by another harness" in report.stderr, report.stderr
    finally:
        holder.kill()
        holder.wait()
    ledger = (run_dir / "ledger.jsonl").read_bytes()
    listed = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system and quick", f"--resume={run_dir}",
                        "--collect-only")
    assert listed.returncode in (0, 5) and (run_dir / "ledger.jsonl").read_bytes() == ledger, listed.stdout
    resumed = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system and quick", f"--resume={run_dir}")
    assert resumed.returncode == 0 and "verdict: CERTIFIED" in resumed.stdout, resumed.stdout + resumed.stderr


def test_a_resume_after_an_outage_runs_the_checks_that_never_reached_their_node(ns_cluster_factory, sign_key,
                                                                                tmp_path):
    """node2 unreachable for the whole run (its link down, or the harness's own network): its
    checks measured nothing. Once it answers, --resume runs them again, and only them (it kept
    them as done, so the run could not be completed), and the run is certified."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    nodes.link_down("node2")
    try:
        first = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system and quick")
    finally:
        nodes.link_up("node2")
    assert first.returncode == 1, first.stdout + first.stderr
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    lost = {c["test_id"] for c in results_of(run_dir)["checks"] if c["kind"] == "unreachable"}
    assert lost and all(test_id.endswith("[node2]") for test_id in lost), lost
    resumed = run_suites(inventory, tmp_path / "out", sign_key, "-m", "system and quick", f"--resume={run_dir}")
    assert resumed.returncode == 0 and "verdict: CERTIFIED" in resumed.stdout, resumed.stdout + resumed.stderr
    results = results_of(run_dir)
    assert {c["outcome"] for c in results["checks"] if c["test_id"] in lost} == {"passed", "skipped"}
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    again = [e["test_id"] for e in ledger if e["type"] == "check"][len(results["checks"]):]
    assert set(again) >= lost and all(not test_id.endswith("[node1]") for test_id in again), again
    # uniformity passed comparing node1 alone: it runs again, with node2's facts beside node1's
    uniformity = "suites/test_system.py::test_uniformity"
    assert uniformity in again and uniformity not in lost
    assert "2 node(s) compared" in next(c["message"] for c in results["checks"] if c["test_id"] == uniformity)


def test_a_resume_after_a_late_outage_runs_again_only_the_cluster_wide_checks_that_missed_the_node(
        ns_cluster_factory, sign_key, tmp_path):
    """node2's link cut once uniformity had compared it with node1: uniformity had its facts and
    is not run again on resume (a storage spread would be fio on every node again), while the
    checks that failed as unreachable are, and so is every cluster-wide check that passed or
    skipped without node2 (its `unreached` names it)."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    selection = ["-m", "(system or training) and quick", "-k", "not allreduce and not training_"]
    uniformity = "suites/test_system.py::test_uniformity"
    harness = subprocess.Popen([sys.executable, "-m", "pytest", "--inventory", str(inventory), "--out",
                                str(tmp_path / "out"), "--sign-key", str(sign_key), *selection, "-q",
                                "-p", "no:cacheprovider"], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not any(f'"test_id": "{uniformity}"' in line for ledger in (tmp_path / "out").glob("*/*/ledger.jsonl")
                      for line in ledger.read_text().splitlines() if line.startswith('{"type": "check"')):
            assert harness.poll() is None and time.monotonic() < deadline, "the run ended before uniformity"
            time.sleep(0.1)
        nodes.link_down("node2")
        assert harness.wait(400) == 1
    finally:
        nodes.link_up("node2")
        if harness.poll() is None:
            harness.kill()
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    first = results_of(run_dir)["checks"]
    lost = {c["test_id"] for c in first if c["kind"] == "unreachable"}
    assert lost and all(c["node"] in ("node2", None) for c in first if c["test_id"] in lost), lost
    unreached = {c["test_id"]: c["unreached"] for c in first if c["node"] is None}
    assert unreached[uniformity] == [], unreached
    without = {test_id for test_id, names in unreached.items() if names == ["node2"]
               and next(c["outcome"] for c in first if c["test_id"] == test_id) in ("passed", "skipped")}
    assert without, unreached  # the checkpoint check, skipped without node2
    resumed = run_suites(inventory, tmp_path / "out", sign_key, *selection, f"--resume={run_dir}", timeout=400)
    assert resumed.returncode in (0, 1), resumed.stdout[-3000:] + resumed.stderr[-2000:]
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    again = [e["test_id"] for e in ledger if e["type"] == "check"][len(first):]
    assert lost <= set(again) and without <= set(again), (again, lost, without)
    assert uniformity not in again and not any(test_id.endswith("[node1]") for test_id in again), again


def test_a_reader_that_goes_away_leaves_the_run_to_finish_and_exit_by_its_verdict(ns_cluster, sign_key, tmp_path):
    """`pytest ... | head -3`, or a `| tee` killed by a hang-up: the pipe's reader is gone, and
    the next write raised BrokenPipeError, which ended the run with exit 1 before its run
    directory was made. The run now goes on with its output going nowhere, and exits by its
    verdict with its report signed."""
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", nodes=["node1"])
    command = [sys.executable, "-m", "pytest", "--inventory", str(inventory), "--out", str(tmp_path / "out"),
               "--sign-key", str(sign_key), "-p", "no:cacheprovider", "-m", "system and quick"]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout is not None and run.stderr is not None
    first = [run.stdout.readline() for _ in range(3)]
    run.stdout.close()  # as `head -3` does once it has its lines
    run.stderr.close()
    assert run.wait(timeout=300) == 0 and first[0].startswith(b"====")
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    assert results_of(run_dir)["verdict"]["status"] == "CERTIFIED"
    assert (run_dir / "report.html.sig").is_file()


def test_a_hung_up_terminal_ends_the_run_as_ctrl_c_does_and_renders_its_report(ns_cluster_factory, sign_key,
                                                                               tmp_path):
    """The operator's session to the head node drops (SIGHUP from the kernel when the terminal's
    far end closes): the run ends as interrupted with its report signed, although every write to
    the terminal now fails, and nothing of it stays on the nodes. Before, SIGHUP's default action
    killed the harness: no report, no end in the ledger."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml", extra={})
    inventory.write_text(inventory.read_text().replace("connect_timeout: 5", "connect_timeout: 60"))
    nodes.link_down("node2")  # node2's connect hangs: the run is sure to be in progress
    pid, terminal = pty.fork()
    if pid == 0:  # the child: pytest on the terminal, as an operator's shell starts it
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "pytest", f"--inventory={inventory}",
                                  f"--out={tmp_path / 'out'}", f"--sign-key={sign_key}",
                                  "-p", "no:cacheprovider", "-m", "system"])
    shown = b""
    deadline = time.monotonic() + 120
    try:
        while "selection" not in ledger_types(tmp_path / "out"):
            assert time.monotonic() < deadline, f"the run never selected its checks: {shown[-2000:]!r}"
            if select.select([terminal], [], [], 0.1)[0]:
                shown += os.read(terminal, 65536)
        time.sleep(1)  # node1's checks run, node2's connect hangs
    finally:
        os.close(terminal)  # the terminal hangs up: SIGHUP to pytest
    status = exit_status(pid, within_s=60)
    assert status == 2, f"pytest ended with {status}, not as interrupted: {shown[-2000:]!r}"
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    assert results["run"]["interrupted"] is True
    assert any("interrupted" in reason for reason in results["verdict"]["reasons"])
    assert ssh_keygen_verifies(run_dir, "report.html") and ssh_keygen_verifies(run_dir, "results.json")
    end = json.loads((run_dir / "ledger.jsonl").read_text().splitlines()[-1])
    assert (end["type"], end["exitstatus"], end["interrupted"]) == ("end", 2, True)
    assert wait_for_no_leftovers("handover-node-lock", within_s=15, on=nodes) == []


def test_a_run_under_nohup_goes_on_when_its_terminal_hangs_up(ns_cluster_factory, sign_key, tmp_path):
    """What the README says to do for a long run: under nohup, SIGHUP is ignored when the run
    starts and stays so; the run goes on to its end when the terminal hangs up."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml", extra={})
    pid, terminal = pty.fork()
    if pid == 0:  # nohup: SIGHUP ignored, output to nohup.out here
        os.chdir(tmp_path)
        os.execvp("nohup", ["nohup", sys.executable, "-m", "pytest", f"--inventory={inventory}",
                            f"--out={tmp_path / 'out'}", f"--sign-key={sign_key}", "-p", "no:cacheprovider",
                            "-m", "system"])
    deadline = time.monotonic() + 120
    try:
        while "selection" not in ledger_types(tmp_path / "out"):
            assert time.monotonic() < deadline, "the run never selected its checks"
            time.sleep(0.1)  # nohup left the terminal: nothing is written to it
    finally:
        os.close(terminal)  # the terminal hangs up while the checks run
    status = exit_status(pid, within_s=240)
    said = (tmp_path / "nohup.out").read_text()
    assert status == 0, said[-3000:]
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    assert results["run"]["interrupted"] is False and results["verdict"]["status"] == "CERTIFIED"
    assert "verdict: CERTIFIED" in said


def exit_status(pid: int, *, within_s: float) -> Optional[int]:
    """The exit code of child `pid` (negative: killed by that signal); None, killing it, if it
    runs on past within_s."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


FINALIZED_WHEN_SIGNALLED = """
import os, signal, time, weakref
from pathlib import Path


def signal_and_run_on():
    os.kill(os.getpid(), signal.SIGINT)
    started = time.monotonic()
    while time.monotonic() - started < 0.2:
        pass


class Finalized:
    def __del__(self):
        signal_and_run_on()


class Held:
    pass


def test_first():
    if os.environ["FINALIZER"] == "weakref":
        weakref.finalize(Held(), signal_and_run_on)  # called as the Held is dropped, at once
    else:
        Finalized()
    time.sleep(5)  # where a signal that was not dropped ends the check
    Path(os.environ["WENT_ON"]).write_text("the check went on")


def test_second():
    pass
"""


@pytest.mark.parametrize("finalizer", ["__del__", "weakref"])
def test_ctrl_c_that_lands_in_a_finalizer_still_interrupts_the_run(sign_key, tmp_path, finalizer):
    """Python drops a KeyboardInterrupt raised while a finalizer runs (as one did in a Slurm
    harness run, which went on to the end and exited 0) and hands it to sys.unraisablehook, whose
    handover part sends the signal again a moment later: the check itself is interrupted in its
    sleep, whichever kind of finalizer it was. The run stops, marked interrupted, and the next
    check does not run."""
    suite = tmp_path / "test_finalized.py"
    suite.write_text(FINALIZED_WHEN_SIGNALLED)
    went_on = tmp_path / "went-on"
    done = subprocess.run([sys.executable, "-m", "pytest", f"--inventory={local_inventory_without_scratch(tmp_path)}",
                           f"--out={tmp_path / 'out'}", f"--sign-key={sign_key}", "-p", "no:cacheprovider",
                           str(suite)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "WENT_ON": str(went_on), "FINALIZER": finalizer})
    assert done.returncode == 2, done.stdout + done.stderr
    results = results_of(run_dir_of(tmp_path / "out", "local"))
    assert results["run"]["interrupted"] is True
    recorded = [c["test_id"].split("::")[1] for c in results["checks"]]
    assert (recorded, went_on.exists()) == ([], False)
    assert "Exception ignored" not in done.stdout + done.stderr  # the dropped interrupt was taken up


def test_resume_refuses_a_different_inventory(ns_cluster, sign_key, tmp_path):
    first = ns_cluster.write_inventory(tmp_path / "a.yaml", nodes=["node1"])
    run_suites(first, tmp_path / "out", sign_key, "-k", "reachable")
    other = ns_cluster.write_inventory(tmp_path / "b.yaml", nodes=["node2"])
    done = run_suites(other, tmp_path / "out", sign_key, f"--resume={run_dir_of(tmp_path / 'out', 'nscluster')}")
    assert done.returncode != 0
    assert "--resume" in done.stderr and "different inventory" in done.stderr
    first.write_text(first.read_text() + "# edited after the run\n")  # the same file, changed in place
    edited = run_suites(first, tmp_path / "out", sign_key, f"--resume={run_dir_of(tmp_path / 'out', 'nscluster')}")
    assert edited.returncode != 0
    assert f"--resume: {first} has changed since " in edited.stderr, edited.stderr


def test_resume_refuses_another_signing_key_than_the_one_that_signed_the_run(ns_cluster, sign_key, tmp_path):
    """The run was rendered and signed by the operator's key; a resume with another key re-signed
    the whole bundle with it, without a word. It is refused, naming both keys and the way to
    re-sign on purpose; with the same key it goes on."""
    inventory = ns_cluster.write_inventory(tmp_path / "a.yaml", nodes=["node1"])
    run_suites(inventory, tmp_path / "out", sign_key, "-k", "reachable")
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    other = tmp_path / "other-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    signed = (run_dir / "results.json.sig").read_bytes()
    done = run_suites(inventory, tmp_path / "out", other, "-k", "reachable or os", f"--resume={run_dir}")
    assert done.returncode == 4 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    signer = results_of(run_dir)["signer"]["fingerprint"]
    assert f"--resume: {run_dir} was signed by key {signer}, not by SHA256:" in done.stderr, done.stderr
    assert f"`handover report {run_dir} --sign-key {other}`" in done.stderr
    assert (run_dir / "results.json.sig").read_bytes() == signed
    again = run_suites(inventory, tmp_path / "out", sign_key, "-k", "reachable or os", f"--resume={run_dir}")
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.parametrize("inventory_text, message", [
    ("cluster: x\nprofile: cpu-only\nnodez: [a]\n", "nodez: unknown key; did you mean 'nodes'?"),
    ("cluster: x\nprofile: h100\nnodes: [a]\n", "profile: unknown profile 'h100'"),
    ("cluster: x\nprofile: cpu-only\nnodes: [gpu[01-]\n", "YAML syntax error"),
])
@pytest.mark.parametrize("form", ["space", "equals"])
def test_bad_inventory_is_one_message_and_a_nonzero_exit(inventory_text, message, sign_key, tmp_path, form):
    inventory = tmp_path / "bad.yaml"
    inventory.write_text(inventory_text)
    done = run_suites(inventory, tmp_path / "out", sign_key, form=form)
    assert done.returncode != 0
    assert message in done.stderr and "bad.yaml" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    checked = handover("inventory", inventory)
    assert checked.returncode == 2 and message in checked.stderr and "Traceback" not in checked.stderr


def test_suites_without_an_inventory_say_what_is_missing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--inventory" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_default_signing_key_is_created_once(tmp_path):
    env = {**os.environ, "HANDOVER_HOME": str(tmp_path / "home")}
    inventory = ROOT / "inventory" / "local.yaml"
    args = [sys.executable, "-m", "pytest", f"--inventory={inventory}", f"--out={tmp_path / 'out'}",
            "-p", "no:cacheprovider", "-m", "system"]
    first = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert "created signing key" in first.stdout and "created signing key" not in second.stdout
    assert (tmp_path / "home" / "signing_key").is_file()
