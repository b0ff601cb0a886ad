"""Slurm as the engine, for real: munged, slurmctld and a slurmd on each of 4 namespace nodes.

The system suite runs through the slurm transport (one srun per step), the training suite's
cross-node run through the slurm launcher (one srun step), a node whose slurmd is stopped is
unreachable with Slurm's reason while the others pass, a node whose task Slurm cannot start
fails alone (srun aborts the whole step: the others run again), a node set down leaves the run's
allocation to the others, a node that fails under a step ends its own task alone and fails a
later run across the nodes at once, a node running another job is left out of it alone, and Ctrl-C
during an srun step leaves no step in squeue and no task on any node (nor a SIGKILL, in the run's
allocation or an operator's). One Slurm cluster serves
the module, its tests in this order: the launch failure's test kills node3's slurmd, the
training run leaves node3 out, and the last test finds it down.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from netns import NETNS_DIR, NamespaceCluster, SlurmCluster, slurm_available
from nodes import cluster_run_of, leftovers, unique_sleep, wait_for_no_leftovers, wait_until
from test_e2e import ROOT, results_of, run_dir_of

from handover.failures import NodeUnreachable
from inventory.loader import InventoryError, load_inventory
from inventory.model import LaunchSettings
from runners import hpl
from runners.cluster import ClusterRun
from runners.fanout import fan_out
from runners.slurm import Allocation, SlurmSteps, SlurmTransport
from runners.transport import LEASE_VARIABLE, Result, Transport, new_tag
from suites.checks import require_launchable

STEP_WAIT_S = 60  # how long the Ctrl-C test waits for the harness to start an srun step
SLOW_TESTS = "HANDOVER_SLOW_TESTS"
# After a SIGKILLed harness, how long Slurm may take to end everything of its allocation:
# slurmctld's KillWait (2 s here) and a few of SlurmdTimeout's rounds.
KILLED_HARNESS_BOUND_S = 30


@pytest.fixture(scope="module")
def slurm_nodes(module_ns_cluster_factory):
    available, why = slurm_available()
    if not available:
        pytest.skip(why)
    nodes: NamespaceCluster = module_ns_cluster_factory(4)
    with SlurmCluster(nodes) as slurm:
        yield nodes, slurm


def inventory(slurm_nodes, path: Path, **launch) -> Path:
    nodes, slurm = slurm_nodes
    extra: dict = {"transport": "slurm"}
    if launch:
        extra["launch"] = launch
    return nodes.write_inventory(path, extra=extra)


def run_pytest(slurm: SlurmCluster, inventory_path: Path, out: Path, key, *extra: str,
               ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(inventory_path), "--out", str(out),
                           "--sign-key", str(key), "-p", "no:cacheprovider", *extra],
                          cwd=ROOT, env=slurm.env, capture_output=True, text=True, timeout=600)


def tasks_on_nodes(nodes: NamespaceCluster) -> list[str]:
    """Our processes in the nodes' network namespaces: what Slurm started for one of our jobs or
    steps, and what our commands started (they carry a lease tag, runners.transport), such as a
    node lock's holder. slurmd itself is neither."""
    namespaces = {os.stat(NETNS_DIR / node.namespace).st_ino for node in nodes.nodes}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino not in namespaces:
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(var.startswith((b"SLURM_JOB_NAME=handover-", LEASE_VARIABLE.encode() + b"=")) for var in environ):
            found.append(f"{entry} {command}")
    return found


def test_system_suite_through_the_slurm_transport(slurm_nodes, sign_key, tmp_path):
    """The nodes come from the cluster's slurm.conf; the run asks for one allocation of them,
    runs every step in it and gives it back: no job is left in squeue."""
    nodes, slurm = slurm_nodes
    path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
    listed = f"nodes:\n- slurm: {{conf: {slurm.conf}, partition: debug}}\n"
    path.write_text(path.read_text().split("nodes:")[0] + listed)
    done = run_pytest(slurm, path, tmp_path / "out", sign_key, "-m", "system and quick")
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    assert results["verdict"]["status"] == "CERTIFIED"
    assert {n["name"]: n["status"] for n in results["nodes"]} == {f"node{i}": "passed" for i in range(1, 5)}
    assert {n["source"] for n in results["nodes"]} == {f"slurm.conf {slurm.conf} partition debug"}
    salloc = (run_dir / "raw" / "slurm_allocation" / "slurm.command").read_text()
    assert "salloc --nodelist=node1,node2,node3,node4 --nodes=4 --exclusive" in salloc
    assert nothing_left(slurm, 20) == ([], [])  # a job given back may be COMPLETING a moment
    kernel = [c for c in results["checks"] if c["check"] == "kernel"]
    assert len(kernel) == 4 and all(c["outcome"] == "passed" for c in kernel)
    hostnames = {c["node"]: c for c in results["checks"] if c["check"] == "os"}
    assert set(hostnames) == {"node1", "node2", "node3", "node4"}


def test_live_partition_resolves_through_sinfo(slurm_nodes, tmp_path, monkeypatch):
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    path = tmp_path / "live.yaml"
    path.write_text("cluster: live\nprofile: cpu-only\ntransport: slurm\nnodes:\n"
                    "  - {slurm: {partition: debug}}\n")
    cluster = load_inventory(path)
    assert [(n.name, n.address, n.source) for n in cluster.nodes] == [
        (node.name, node.address, "sinfo partition debug") for node in nodes.nodes]
    assert {n.leaf for n in cluster.nodes} == {None}  # this Slurm has no topology
    path.write_text(path.read_text().replace("partition: debug", "partition: gpu"))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value) == (f"{path}:5: nodes[0].slurm: partition 'gpu' from the live Slurm (sinfo): "
                                 "Slurm has no partition 'gpu' (or it has no nodes); partitions: debug")


TREE = "SwitchName=s0 Nodes=node1\nSwitchName=s1 Nodes=node2\nSwitchName=s2 Switches=s[0-1]\n"


def test_nodes_sit_under_the_leaf_switch_of_slurms_topology(ns_cluster_factory, tmp_path, monkeypatch):
    """A Slurm of its own with TopologyPlugin=topology/tree (node1 under s0, node2 under s1, s2
    above both): the live partition (sinfo, then `scontrol show topology`) and its slurm.conf with
    the topology.conf beside it place each node under its leaf, as Slurm itself does."""
    available, why = slurm_available()
    if not available:
        pytest.skip(why)
    with SlurmCluster(ns_cluster_factory(2), topology=TREE) as slurm:
        monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
        path = tmp_path / "tree.yaml"
        for source in ("{partition: debug}", f"{{conf: {slurm.conf}, partition: debug}}"):
            path.write_text(f"cluster: tree\nprofile: cpu-only\ntransport: slurm\nnodes:\n  - {{slurm: {source}}}\n")
            assert [(n.name, n.leaf) for n in load_inventory(path).nodes] == [("node1", "s0"), ("node2", "s1")]


def test_a_fan_out_past_its_deadline_cancels_the_step(slurm_nodes, tmp_path, monkeypatch):
    """The harness's deadline, not the node's: the srun step is scancelled, its tasks die."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml"))
    steps = SlurmSteps(cluster.launch)
    transports: dict[str, Transport] = {n.name: SlurmTransport(n, steps) for n in cluster.nodes}
    sleep = unique_sleep()
    results = fan_out(transports, lambda t: t.run(sleep.split(), timeout=300), deadline_s=5)
    assert all(r.timed_out for r in results.values()), {n: r.status for n, r in results.items()}
    assert wait_for_no_leftovers(sleep.split()[1]) == []
    assert nothing_left(slurm, 20) == ([], [])


def test_a_step_runs_with_the_system_directories_on_its_path(slurm_nodes, tmp_path, monkeypatch):
    """srun passes the harness's environment on: a non-root operator's PATH lacks /usr/sbin,
    where ibstat and dmidecode live; the node's command has it appended, as over SSH."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/games")
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml"))
    steps = SlurmSteps(cluster.launch)
    transports: dict[str, Transport] = {n.name: SlurmTransport(n, steps) for n in cluster.nodes[:2]}
    results = fan_out(transports, lambda t: t.run(["sh", "-c", 'printf %s "$PATH"'], timeout=60))
    assert {name: r.stdout for name, r in results.items()} == {
        name: "/usr/local/bin:/usr/bin:/bin:/usr/games:/usr/sbin:/sbin" for name in transports}, \
        {name: r.explain() for name, r in results.items()}


def test_each_command_of_a_batch_has_its_result_as_its_own_task_ends(slurm_nodes, tmp_path, monkeypatch):
    """node2's command starts a batch, node1's joins it and waits for a file that appears only
    once node2's result is back. The batch used to run in its first command's thread, so that
    command's result waited for the whole step: an iperf3 client's `Connection refused`, which it
    retries while its server starts, came back only once the server, in the same step, had
    timed out, and the pair failed."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml"))
    steps = SlurmSteps(cluster.launch)
    leading, joining = (SlurmTransport(cluster.node(name), steps) for name in ("node2", "node1"))
    answered = tmp_path / "node2-answered"
    results: dict[str, Result] = {}
    leader = threading.Thread(target=lambda: results.update(node2=leading.run(["echo", "led"], timeout=30)))
    joiner = threading.Thread(target=lambda: results.update(node1=joining.run(
        ["sh", "-c", f"while [ ! -e {answered} ]; do sleep 0.2; done; echo waited"], timeout=30)))
    leader.start()
    time.sleep(0.01)  # within the batch's quiet time (BATCH_QUIET_S): node1's command joins it
    joiner.start()
    leader.join(60)
    answered.touch()
    joiner.join(60)
    assert {name: result.stdout for name, result in results.items()} == {"node2": "led\n", "node1": "waited\n"}, \
        {name: result.explain() for name, result in results.items()}


def test_a_command_killed_in_a_batch_ends_alone_and_the_others_run_on(slurm_nodes, tmp_path, monkeypatch):
    """Two nodes' commands in one srun (a batch, as a round's pair servers are), in an allocation.
    Killing one (a server that outlived its client) cancelled the whole step, and the other
    node's command with it: one stuck pair failed its round. It is killed on its node by its
    tag now, through a step of its own, and the other command finishes."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    held = slurm.client("salloc", "--no-shell", "--nodelist=node[1-2]", "--nodes=2", "--exclusive",
                        "--immediate=30", "--job-name=operator", "--time=10")
    [job] = re.findall(r"Granted job allocation (\d+)", held.stderr) or [held.stderr]
    monkeypatch.setenv("SLURM_JOB_ID", job)
    try:
        sleep, tag = unique_sleep(), new_tag()
        transports, threads, results = start_in_one_step(
            slurm_nodes, tmp_path, {"node1": sleep.split(), "node2": ["sh", "-c", "sleep 8; echo finished"]}, tag)
        assert wait_until(lambda: leftovers(sleep), 30) and transports["node1"].steps.shares_step(tag)
        transports["node1"].kill(tag)
        for thread in threads:
            thread.join(90)
        assert results["node2"].stdout == "finished\n", results["node2"].explain()
        assert not results["node1"].ok and results["node1"].duration_s < 60, results["node1"]
    finally:
        slurm.client("scancel", job)
    assert wait_for_no_leftovers(sleep) == []
    assert nothing_left(slurm, 20) == ([], [])


def test_a_step_cancelled_for_one_nodes_command_says_so_for_the_others(slurm_nodes, tmp_path, monkeypatch):
    """A step cancelled for node1's command (a Ctrl-C in its caller, or a kill that could not run
    on node1 alone) ends node2's command too; node2's result said it timed out after 0 s, and
    now says why it ended."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    sleeps, tag = (unique_sleep(), unique_sleep()), new_tag()
    transports, threads, results = start_in_one_step(
        slurm_nodes, tmp_path, {"node1": sleeps[0].split(), "node2": sleeps[1].split()}, tag)
    steps = transports["node1"].steps
    assert wait_until(lambda: all(leftovers(sleep) for sleep in sleeps), 30) and steps.shares_step(tag)
    steps.cancel(tag)
    for thread in threads:
        thread.join(60)
    [step] = re.findall(r"srun step (\S+) cancelled$", results["node1"].detail) or [results["node1"].detail]
    assert results["node1"].timed_out
    assert (results["node2"].failure, results["node2"].detail) == (
        "error", f"srun step {step} was cancelled for node1's command, and node2's with it"), results["node2"]
    assert [wait_for_no_leftovers(sleep) for sleep in sleeps] == [[], []]
    assert nothing_left(slurm, 20) == ([], [])


def test_an_allocation_slurm_revokes_fails_the_steps_in_it_and_after_it_as_unreachable_saying_why(
        slurm_nodes, tmp_path, monkeypatch):
    """The run's allocation taken back under it (its time limit ran out, or a scancel: salloc says
    `... has been revoked` either way): the step running then, the steps after it and a launch
    across the nodes fail as unreachable with Slurm's word and when, at once, where srun said
    only `Job/step already completing or completed`; a resume runs them again."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    raw: dict[str, str] = {}
    gathered: dict[str, dict[str, Result]] = {}
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml", time_limit=5))
    run = ClusterRun(cluster, list(cluster.nodes),
                     save_raw=lambda step, result: raw.update({step: result.stdout}) or [])
    sleep = unique_sleep()
    try:
        running = threading.Thread(target=lambda: gathered.update(
            sleeping=run.gather("sleeping", lambda transport: transport.run(sleep.split(), timeout=600))))
        running.start()
        assert wait_until(lambda: sum(line.split(" ", 1)[1] == sleep for line in leftovers(sleep)) == 4, 30), \
            leftovers(sleep)
        job = raw["slurm_allocation"].split()[1]
        assert re.fullmatch(rf"job {job}\ntime limit 5:00, until \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\n",
                            raw["slurm_allocation"]), raw["slurm_allocation"]
        assert slurm.client("scancel", job).returncode == 0
        running.join(60)
        # salloc's word, or, on a loaded machine where it comes later than REVOKE_WAIT_S, squeue's
        revoked = rf"the run's Slurm allocation \(job {job}\) ended at \d\d:\d\d:\d\d: " \
                  rf"(Job allocation {job} has been revoked\.|Slurm says it is (CANCELLED|COMPLETING))"
        for result in gathered["sleeping"].values():
            assert result.failure == "unreachable" and re.fullmatch(revoked, result.detail), result.explain()
        started = time.monotonic()
        after = run.gather("after", lambda transport: transport.run(["true"], timeout=60))
        assert all(r.failure == "unreachable" and re.search(revoked, r.detail) for r in after.values()), after
        assert time.monotonic() - started < 5  # no srun: the nodes were lost with the allocation
        with pytest.raises(NodeUnreachable, match=revoked):
            require_launchable(run, ["node1", "node2"], "allreduce_cluster")
    finally:
        run.close()
    assert wait_for_no_leftovers(sleep) == []
    assert nothing_left(slurm, 20) == ([], [])


def test_the_operators_allocation_ending_under_the_run_fails_its_later_steps_at_once_saying_why(
        slurm_nodes, tmp_path, monkeypatch):
    """Inside an operator's allocation (SLURM_JOB_ID) whose end an administrator brings to a few
    seconds away after the run read it (scontrol update EndTime): Slurm refuses every later step
    (`Job/step already completing or completed`); the first step refused asks Slurm once, and the
    run's commands and launches fail as unreachable, saying which job ended and how to finish the
    run."""
    _, slurm = slurm_nodes
    with inside_operators_allocation(slurm_nodes, tmp_path, monkeypatch) as (job, run):
        ends_at = time.time() + 3
        end_time = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ends_at))
        assert slurm.client("scontrol", "update", f"JobId={job}", f"EndTime={end_time}").returncode == 0
        time.sleep(max(0.0, ends_at + 1 - time.time()))
        after = run.gather("after", lambda transport: transport.run(["true"], timeout=60))
        ended = (rf"Slurm job {job}, the allocation the run runs in, ended at \d\d:\d\d:\d\d: its time limit "
                 r"ran out \(the time limit: \d+:\d\d\); to finish the run, --resume it inside an allocation "
                 r"with the time \(salloc --time=\.\.\.\)")
        assert all(r.failure == "unreachable" and re.search(ended, r.detail) for r in after.values()), \
            {n: r.explain() for n, r in after.items()}
        with pytest.raises(NodeUnreachable, match=ended):
            require_launchable(run, ["node1", "node2"], "allreduce_cluster")


def test_the_operators_allocation_cancelled_under_the_run_fails_its_later_steps_saying_so(
        slurm_nodes, tmp_path, monkeypatch):
    """The operator's allocation scancelled under the run: no salloc of the harness's hears of it,
    so the first step Slurm refuses asks; that one and every later one fail as unreachable with
    Slurm's word, the later ones at once."""
    _, slurm = slurm_nodes
    with inside_operators_allocation(slurm_nodes, tmp_path, monkeypatch) as (job, run):
        assert slurm.client("scancel", job).returncode == 0
        ended = (rf"Slurm job {job}, the allocation the run runs in, ended at \d\d:\d\d:\d\d: "
                 r"Slurm says it is (CANCELLED|COMPLETING)")
        after = run.gather("after", lambda transport: transport.run(["true"], timeout=60))
        assert all(r.failure == "unreachable" and re.search(ended, r.detail) for r in after.values()), \
            {n: r.explain() for n, r in after.items()}
        started = time.monotonic()
        later = run.gather("later", lambda transport: transport.run(["true"], timeout=60))
        assert all(r.failure == "unreachable" and re.search(ended, r.detail) for r in later.values()), later
        assert time.monotonic() - started < 5  # no srun: Slurm said so once


@contextlib.contextmanager
def inside_operators_allocation(slurm_nodes, tmp_path: Path, monkeypatch) -> Iterator[tuple[str, ClusterRun]]:
    """(job, run): an operator's allocation of the four nodes (salloc --no-shell), and a run of
    the harness inside it (SLURM_JOB_ID) whose first step ran; afterwards nothing of either is left."""
    _, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    held = slurm.client("salloc", "--no-shell", "--nodelist=node[1-4]", "--nodes=4", "--exclusive",
                        "--immediate=30", "--job-name=operator", "--time=10")
    [job] = re.findall(r"Granted job allocation (\d+)", held.stderr) or [held.stderr]
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-4]")
    try:
        run = cluster_run_of(load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml")))
        try:
            before = run.gather("before", lambda transport: transport.run(["true"], timeout=60))
            assert all(result.ok for result in before.values()), {n: r.explain() for n, r in before.items()}
            yield job, run
        finally:
            run.close()
    finally:
        slurm.client("scancel", job)
    assert nothing_left(slurm, 30) == ([], [])


SOAK_MIX = "cpu_workers=1,cpu_load=5,vm_workers=0,net_rate=2M,round_s=10,interval_s=2,gpu=0"


def test_a_soak_under_slurm_is_a_batch_job_that_outlives_the_harness_and_is_collected_or_stopped(
        slurm_nodes, sign_key, tmp_path):
    """`transport: slurm`: the soak's supervisors are the tasks of a batch job of its own (sbatch),
    which the harness does not hold: SIGKILLed mid-soak, the job and its load run on; the same
    command again re-attaches (its collections are steps of the soak's job), follows it to its end
    and the job ends once collected. A second soak, ended by --soak-stop while its harness follows
    it, leaves no job, task or folder either."""
    nodes, slurm = slurm_nodes
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = nodes.write_inventory(tmp_path / "cluster.yaml", nodes=["node1", "node2"], extra={
        "transport": "slurm", "scratch": [{"path": str(scratch), "kind": "local"}]})
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pytest", "--inventory", str(path), "--out", str(out), "--sign-key",
               str(sign_key), "-p", "no:cacheprovider", "-m", "soak", "--soak-mix", SOAK_MIX]
    first = subprocess.Popen(command + ["--soak-duration", "40s"], cwd=ROOT, env=slurm.env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    raw = out / "nscluster" / "latest" / "raw" / "soak"
    assert wait_until(lambda: min(samples_in(raw / f"{name}.jsonl") for name in ("node1", "node2")) >= 3, 120)
    first.kill()  # SIGKILL: nothing reaches Slurm or the nodes from the harness
    killed = first.communicate()[0]
    soak_jobs = [job for job in slurm.jobs() if "handover-soak-" in job]
    assert len(soak_jobs) == 1, (slurm.jobs(), killed)
    held = [task for task in tasks_on_nodes(slurm.nodes) if "soak_supervisor.py hold" in task]
    assert len(held) == 2, tasks_on_nodes(slurm.nodes)  # a supervisor on each node, in the job's task
    again = subprocess.run(command + ["--soak-duration", "40s"], cwd=ROOT, env=slurm.env, capture_output=True,
                           text=True, timeout=600)
    assert "attaching to the soak in" in again.stdout, again.stdout + again.stderr
    run_dir = run_dir_of(out, "nscluster")
    plan = json.loads((run_dir / "soak.json").read_text())
    assert plan["slurm_job"] and plan["collected"] and not plan["refused"], plan
    checks = results_of(run_dir)["checks"]
    assert {c["outcome"] for c in checks} == {"passed", "skipped"}, again.stdout[-3000:]
    assert [c["node"] for c in checks if c["check"] == "soak_heartbeat" and c["outcome"] == "passed"] == [
        "node1", "node2"]
    assert nothing_left(slurm, 30) == ([], []) and list(scratch.iterdir()) == []

    following = subprocess.Popen(command + ["--soak-duration", "10m"], cwd=ROOT, env=slurm.env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_until(lambda: run_dir_of(out, "nscluster") != run_dir and min(
        samples_in(run_dir_of(out, "nscluster") / "raw" / "soak" / f"{name}.jsonl") for name in ("node1", "node2"))
        >= 2, 120)
    stopped = subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(path), "--soak-stop",
                              str(run_dir_of(out, "nscluster"))], cwd=ROOT, env=slurm.env, capture_output=True,
                             text=True, timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    followed = following.communicate(timeout=300)[0]
    assert "soak" in followed and nothing_left(slurm, 30) == ([], []), followed[-3000:]
    assert list(scratch.iterdir()) == []


def samples_in(path: Path) -> int:
    return path.read_text().count('"kind":"sample"') if path.exists() else 0


def start_in_one_step(slurm_nodes, tmp_path: Path, argvs: dict[str, list[str]], tag: str) -> tuple[
        dict[str, SlurmTransport], list[threading.Thread], dict[str, Result]]:
    """Each node's command through the slurm transport, started at once (within the batch's quiet
    time, BATCH_QUIET_S: one srun), node1's tagged `tag`; the threads, and the Results as they end."""
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml"))
    steps = SlurmSteps(cluster.launch)
    transports = {name: SlurmTransport(cluster.node(name), steps) for name in argvs}
    results: dict[str, Result] = {}

    def run(name: str) -> None:
        results[name] = transports[name].run(argvs[name], timeout=600, tag=tag if name == "node1" else None)

    threads = [threading.Thread(target=run, args=(name,)) for name in argvs]
    for thread in threads:
        thread.start()
    return transports, threads, results


def harness_in_an_srun_step(slurm: SlurmCluster, path: Path, out: Path, key, **env: str) -> subprocess.Popen:
    """The harness running the per-node training check through the slurm transport, once one of
    its srun steps has tasks on the nodes; `env` beside Slurm's (an allocation it runs in). A step
    of an earlier test, still ending, is not taken for one of its own: a SIGINT sent on its word
    once reached the harness before Python had started (exit 1, not pytest's 2)."""
    earlier = set(slurm.steps())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", f"--inventory={path}", f"--out={out}",
         f"--sign-key={key}", "-p", "no:cacheprovider", "-m", "training and quick",
         "-k", "test_training and not cluster and not sustained and not scaling"],
        cwd=ROOT, env={**slurm.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + STEP_WAIT_S
    while (not any("handover-" in step and step not in earlier for step in slurm.steps())
           or not tasks_on_nodes(slurm.nodes)):
        assert proc.poll() is None and time.monotonic() < deadline, "no srun step started"
        time.sleep(0.2)
    return proc


def nothing_left(slurm: SlurmCluster, within_s: float) -> tuple[list[str], list[str]]:
    """squeue's jobs and our tasks on the nodes, once both are gone or `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while (slurm.jobs() or tasks_on_nodes(slurm.nodes)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return slurm.jobs(), tasks_on_nodes(slurm.nodes)


def test_ctrl_c_during_an_srun_step_leaves_nothing(slurm_nodes, sign_key, tmp_path):
    nodes, slurm = slurm_nodes
    pytest.importorskip("torch")
    path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
    proc = harness_in_an_srun_step(slurm, path, tmp_path / "out", sign_key)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, output  # pytest's "interrupted"
    assert nothing_left(slurm, 20) == ([], [])  # the run's allocation was given back too
    assert results_of(run_dir_of(tmp_path / "out", "nscluster"))["run"]["interrupted"] is True


def test_a_sigkilled_harness_leaves_nothing_once_its_allocation_ends(slurm_nodes, sign_key, tmp_path):
    """No cleanup of the harness's runs: the end of salloc's input (the harness's pipe) gives the
    allocation back, Slurm ends its steps, and the node locks' holders end with them."""
    nodes, slurm = slurm_nodes
    pytest.importorskip("torch")
    path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
    proc = harness_in_an_srun_step(slurm, path, tmp_path / "out", sign_key)
    proc.kill()
    proc.communicate(timeout=30)
    assert nothing_left(slurm, KILLED_HARNESS_BOUND_S) == ([], [])


def test_a_node_that_fails_leaves_the_run_its_allocation_on_the_others(slurm_nodes, monkeypatch):
    """Slurm ends a job whose node fails unless salloc says --no-kill: then one dead node would
    take every later step of the run with it, where it should be that node's checks alone."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    allocation = Allocation(["node1", "node2"], LaunchSettings(engine="slurm", partition=slurm.partition,
                                                               time_limit_min=5))
    try:
        # slurmctld deals with a node set down within the update (the jobs on it first); this
        # Slurm's ReturnToService gives the node back as soon as its slurmd answers again
        failed = slurm.client("scontrol", "update", "nodename=node2", "state=down", "reason=handover-test")
        assert failed.returncode == 0, failed.stderr
        assert f"{allocation.job} {allocation.name} RUNNING" in slurm.jobs(), slurm.jobs()
        step = slurm.client("srun", f"--jobid={allocation.job}", "--overlap", "--nodelist=node1", "--nodes=1",
                            "--immediate=10", "hostname")
        assert step.returncode == 0 and step.stdout.strip() == "node1", step.stdout + step.stderr
        assert "--no-kill" in allocation.argv
    finally:
        allocation.release()
        slurm.client("scontrol", "update", "nodename=node2", "state=resume")
    assert allocation.revoked() is None  # salloc says `revoked` at our own release too: no news


def test_a_node_running_another_job_fails_alone_and_the_others_are_tested(slurm_nodes, sign_key, tmp_path):
    """A node busy with someone else's job: Slurm would refuse a whole-node allocation that asks
    for it (and each srun of the run would wait for it, then fail on every node); the run takes
    the other nodes, and that node's checks fail saying why."""
    nodes, slurm = slurm_nodes
    other = slurm.client("sbatch", "--parsable", "--nodelist=node4", "--exclusive", "--job-name=someone-else",
                         "--output=/dev/null",
                         "--wrap", "sleep 300")
    assert other.returncode == 0, other.stderr
    job = other.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 30  # a bound on Slurm starting the job, not a speed measure
        while slurm.states().get("node4") != "alloc" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slurm.states().get("node4") == "alloc", slurm.states()
        path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
        done = run_pytest(slurm, path, tmp_path / "out", sign_key, "-m", "system and quick", "-k", "os or kernel")
        results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
        outcomes = {(c["node"], c["check"]): c["outcome"] for c in results["checks"] if c["node"]}
        assert {node for (node, _), outcome in outcomes.items() if outcome != "passed"} == {"node4"}, done.stdout
        assert {node for node, _ in outcomes} == {"node1", "node2", "node3", "node4"}
        node4 = [c for c in results["checks"] if c["node"] == "node4"]
        assert node4 and all(c["kind"] == "unreachable" for c in node4)
        assert "not in the run's Slurm allocation" in node4[0]["message"]
        assert "Slurm says node4 is alloc" in node4[0]["message"], node4[0]["message"]
    finally:
        slurm.client("scancel", job)
    assert nothing_left(slurm, 20) == ([], [])


@pytest.mark.skipif(not os.environ.get(SLOW_TESTS), reason=f"about 40 s of hpcc across two namespace "
                    f"nodes under srun; {SLOW_TESTS}=1 runs it")
def test_hpl_across_two_nodes_under_srun(slurm_nodes, tmp_path, monkeypatch):
    """test_hpl_cluster's path under `launch: {engine: slurm}` at the quick N: the run's own
    allocation, the MPI launcher the inventory chooses (srun --mpi=pmix, started on node1 through
    the slurm transport), hpcc's ranks on node1 and node2; the residual PASSED, and once the run
    is closed no job is left in squeue and no task on a node."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    path = nodes.write_inventory(tmp_path / "cluster.yaml", extra={
        "transport": "slurm", "launch": {"engine": "slurm", "time_limit": 10},
        "scratch": [{"path": str(shared), "kind": "shared"}]})
    cluster = load_inventory(path)
    names = ["node1", "node2"]
    run = cluster_run_of(cluster, names)
    try:
        hpl_input = hpl.plan_input(hpl.QUICK, 4 << 30, 2, hpl.DEFAULT_NB["hpcc"])
        timeout = hpl.timeout_for(hpl.QUICK, hpl_input)
        launcher = run.mpi_launcher("node1", timeout=timeout)
        argv = hpl.command("hpcc", launcher, launcher.hosts(run.nodes), 1)
        assert argv[:2] == ["srun", "--nodelist=node1,node2"] and "--mpi=pmix" in argv
        assert f"--jobid={run.launch.allocation}" in argv
        result = hpl.run_on_scratch(run.transport("node1"), str(shared), cluster.scratch, "hpcc",
                                    hpl_input, argv, timeout=timeout)
    finally:
        run.close()
    assert result.ok, result.stderr[-2000:]
    hpcc = hpl.parse_hpl(result.stdout)
    assert hpcc.ok and all(r.passed and r.p * r.q == 2 for r in hpcc.results)
    assert list(shared.iterdir()) == []
    assert nothing_left(slurm, 20) == ([], [])


def test_a_sigkilled_harness_inside_an_operators_allocation_leaves_nothing_on_its_nodes(slurm_nodes, sign_key,
                                                                                         tmp_path):
    """Run inside an operator's allocation (SLURM_JOB_ID), the harness has none of its own to give
    back when it dies: its lease step in that job ends what it tagged on every node (before, its
    commands ran on to their own timeouts); the operator's job stays."""
    nodes, slurm = slurm_nodes
    pytest.importorskip("torch")
    held = slurm.client("salloc", "--no-shell", "--nodelist=node[1-4]", "--nodes=4", "--exclusive",
                        "--immediate=30", "--job-name=operator", "--time=10")
    [job] = re.findall(r"Granted job allocation (\d+)", held.stderr) or [held.stderr]
    try:
        path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
        proc = harness_in_an_srun_step(slurm, path, tmp_path / "out", sign_key, SLURM_JOB_ID=job,
                                       SLURM_JOB_NODELIST="node[1-4]")
        proc.kill()
        proc.communicate(timeout=30)
        deadline = time.monotonic() + KILLED_HARNESS_BOUND_S
        while tasks_on_nodes(slurm.nodes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tasks_on_nodes(slurm.nodes) == []
        assert any(line.startswith(f"{job} operator RUNNING") for line in slurm.jobs()), slurm.jobs()
    finally:
        slurm.client("scancel", job)
    assert nothing_left(slurm, 20) == ([], [])


def test_a_task_slurm_cannot_start_fails_its_node_and_the_others_run_again(slurm_nodes, tmp_path, monkeypatch):
    """node3's slurmd is gone, slurmctld does not know yet (for up to SlurmdTimeout: 300 s by
    default): the task launch fails there and srun aborts the whole step, killing the other
    nodes' commands. They run again without node3, which alone is unreachable. (node3 stays
    stopped: the next test finds it down.)"""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml"))
    steps = SlurmSteps(cluster.launch)
    transports: dict[str, Transport] = {n.name: SlurmTransport(n, steps) for n in cluster.nodes}
    slurm.kill_slurmd("node3")
    assert slurm.states().get("node3") == "idle", slurm.states()  # slurmctld has not noticed
    results = fan_out(transports, lambda t: t.run(["sh", "-c", "sleep 3; hostname"], timeout=60))
    assert {name: r.stdout.strip() for name, r in results.items() if r.ok} == {
        "node1": "node1", "node2": "node2", "node4": "node4"}, {n: r.explain() for n, r in results.items()}
    assert results["node3"].failure == "unreachable"
    assert results["node3"].detail.startswith("Slurm could not start the task on node3: "), results["node3"].detail
    assert nothing_left(slurm, 20) == ([], [])


def test_training_across_nodes_through_the_slurm_launcher(slurm_nodes, sign_key, tmp_path):
    nodes, slurm = slurm_nodes
    pytest.importorskip("torch")
    # For the last test: slurmctld takes a while to call node3 not responding; this run leaves
    # node3 out, so it takes that while here (its slurmd is already gone where the tests run in order).
    slurm.kill_slurmd("node3")
    path = inventory(slurm_nodes, tmp_path / "cluster.yaml", engine="slurm", partition=slurm.partition,
                     time_limit=10)
    done = run_pytest(slurm, path, tmp_path / "out", sign_key, "-m", "training and quick",
                      "-k", "training_cluster", "--nodes", "node[1-2]")
    assert "1 passed" in done.stdout, done.stdout + done.stderr  # the per-node checks were left out
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    across = [c for c in results["checks"] if c["check"] == "training_cluster"]
    assert across and all(c["outcome"] == "passed" for c in across), across
    raw = "".join(p.read_text() for p in (run_dir / "raw").rglob("*.stdout"))
    commands = "".join(p.read_text() for p in (run_dir / "raw").rglob("*") if p.is_file())
    salloc = (run_dir / "raw" / "slurm_allocation" / "slurm.command").read_text()
    assert "--nodelist=node1,node2" in salloc and "--partition=debug --time=10" in salloc
    job = (run_dir / "raw" / "slurm_allocation" / "slurm.stdout").read_text().split()[1]
    assert "srun --nodelist=node1,node2 --nodes=2 --ntasks=2 --ntasks-per-node=1" in commands
    assert f"--jobid={job} --overlap" in commands  # the training's step is one of the run's allocation
    assert raw
    assert nothing_left(slurm, 20) == ([], [])


def test_a_node_whose_slurmd_is_stopped_is_unreachable_with_slurms_reason(slurm_nodes, sign_key, tmp_path):
    nodes, slurm = slurm_nodes
    slurm.stop_slurmd("node3")
    path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
    done = run_pytest(slurm, path, tmp_path / "out", sign_key, "-m", "system and quick")
    assert done.returncode == 1, done.stdout + done.stderr
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    status = {n["name"]: n["status"] for n in results["nodes"]}
    assert status == {"node1": "passed", "node2": "passed", "node3": "failed", "node4": "passed"}
    node3 = [c for c in results["checks"] if c["node"] == "node3"]
    assert node3 and all(c["outcome"] == "failed" and c["kind"] == "unreachable" for c in node3)
    assert re.search(r"Slurm says node3 is down\*? \(Not responding\)", node3[0]["message"]), node3[0]["message"]


def test_a_soak_inside_an_allocation_is_skipped_saying_why(slurm_nodes, sign_key, tmp_path):
    """Under Slurm the soak is a batch job of its own, which would wait for the allocation the
    harness runs in (SLURM_JOB_ID): every soak check is skipped saying so, and nothing is planned."""
    nodes, slurm = slurm_nodes
    held = slurm.client("salloc", "--no-shell", "--nodelist=node1,node2", "--nodes=2", "--immediate=30",
                        "--job-name=operator", "--time=10")
    [job] = re.findall(r"Granted job allocation (\d+)", held.stderr) or [held.stderr]
    path = inventory(slurm_nodes, tmp_path / "cluster.yaml")
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(path), "--out", str(tmp_path / "out"),
                               "--sign-key", str(sign_key), "-p", "no:cacheprovider", "--nodes", "node1,node2",
                               "-m", "soak", "--soak-duration", "2m"], cwd=ROOT,
                              env={**slurm.env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "node[1-2]"},
                              capture_output=True, text=True, timeout=600)
    finally:
        slurm.client("scancel", job)
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    soak = [c for c in results["checks"] if c["test_id"].startswith("suites/test_soak.py::")]
    assert soak and {c["outcome"] for c in soak} == {"skipped"}, done.stdout[-3000:]
    assert {c["message"] for c in soak} == {
        f"under Slurm the soak is a batch job of its own, which would wait for the allocation this run runs in "
        f"(SLURM_JOB_ID={job}): run the soak outside an allocation (README: Soak)"}
    assert not (run_dir_of(tmp_path / "out", "nscluster") / "soak.json").exists()  # no soak was planned
    assert nothing_left(slurm, 20) == ([], [])


def test_a_node_lost_under_slurm_ends_its_own_task_alone_and_fails_a_run_across_the_nodes_at_once(
        slurm_nodes, tmp_path, monkeypatch):
    """node2's slurmd dies under a step (node3's is down since the tests before). The step goes
    on for the others (--no-kill: Slurm would end it whole, `srun: error: node1: task 0: Killed`)
    and node2 is unreachable with Slurm's word. The run's allocation goes on without it, and has
    let it go for good: a step that names it is refused whole, even once its next try is due,
    so a run across the nodes fails at once as node2's unreachable, where its srun failed as an
    error of the first node (`srun exited 1 without node1's result: ... Only allocated 2 nodes
    asked for 3`). The lease step's task on node2 outlives the run, as any step's there while
    its slurmd is gone; the slurmd, back, ends it."""
    nodes, slurm = slurm_nodes
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    cluster = load_inventory(inventory(slurm_nodes, tmp_path / "cluster.yaml", engine="slurm",
                                       partition=slurm.partition, time_limit=5))
    names = ["node1", "node2", "node4"]
    run = cluster_run_of(cluster, names)
    flag = tmp_path / "node2-is-down"

    def fail_node2() -> None:
        assert wait_until((tmp_path / "started-node2").exists, within_s=60)
        slurm.stop_slurmd("node2")
        time.sleep(5)  # slurmctld ends the steps on a node it calls down (without --no-kill) meanwhile
        flag.touch()

    try:
        assert run.gather("before", lambda transport: transport.run(["true"], timeout=60))["node2"].ok
        failing = threading.Thread(target=fail_node2, daemon=True)
        failing.start()
        waits = f"touch {tmp_path}/started-$(hostname); while [ ! -e {flag} ]; do sleep 0.2; done; hostname"
        during = run.gather("during", lambda transport: transport.run(["sh", "-c", waits], timeout=120))
        failing.join()
        assert {name: during[name].stdout.strip() for name in ("node1", "node4")} == {
            "node1": "node1", "node4": "node4"}, {name: result.explain() for name, result in during.items()}
        assert during["node2"].failure == "unreachable", during["node2"].explain()
        assert "Slurm says node2 is down" in during["node2"].detail, during["node2"].detail
        loss = run.lost("node2")
        assert loss is not None
        run.transport("node2").heard(loss)  # as though its port answered: its next try is due
        assert run.transport("node2").may_answer
        refused = slurm.client("srun", f"--jobid={run.launch.allocation}", "--overlap", "--nodelist=node1,node2,node4",
                               "--nodes=3", "--immediate=10", "hostname")
        assert refused.returncode != 0 and "Only allocated 2 nodes asked for 3" in refused.stderr, refused.stderr
        with pytest.raises(NodeUnreachable) as raised:
            require_launchable(run, names, "allreduce_cluster")
        assert str(raised.value) == f"node2 unreachable: lost at {loss.clock} ({loss.reason})"
    finally:
        run.close()
    try:
        assert wait_until(lambda: len(tasks_on_nodes(nodes)) <= 1, within_s=20)
        left = tasks_on_nodes(nodes)
        assert len(left) == 1 and "read -r said" in left[0], left  # node2's lease
    finally:
        slurm.start_slurmd("node2")
    assert nothing_left(slurm, 60) == ([], [])  # about 25 s here, once slurmctld hears the node again
