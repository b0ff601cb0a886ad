"""The slurm engine's pure parts: parsers on real Slurm 22.05 output, argv, the dispatcher, the
inventory's launch: key. The real cluster is in tests/test_slurm_cluster.py."""
from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inventory.loader import InventoryError, load_inventory
from inventory.model import LaunchSettings
from inventory.slurm_conf import SlurmConfError, parse_partition_sinfo
from runners.launchers import Launcher, SrunLauncher, allocation_options
from runners.parsing import ParseError
from runners.slurm import (
    DISPATCH,
    FRAME_CHUNK,
    LEASE_GRACE_S,
    Frames,
    HostJob,
    JobState,
    TimeLimit,
    allocation_argv,
    batch_argv,
    lease_kill_argv,
    lease_step_argv,
    minutes_for,
    parse_granted,
    parse_job_state,
    parse_launch_failures,
    parse_revoked,
    parse_sinfo_nodes,
    parse_time_limit,
    read_frame,
    revoke_message,
    salloc_problem,
)

DATA = Path(__file__).parent / "data" / "slurm-clients"


def test_sinfo_states_say_which_nodes_take_a_task_and_why_not():
    states = parse_sinfo_nodes((DATA / "sinfo_nodes_down_drain.stdout").read_text())
    assert {name: state.usable for name, state in states.items()} == {
        "node1": True, "node2": True, "node3": False, "node4": False}
    assert states["node3"].explain() == "Slurm says node3 is down* (Not responding)"
    assert states["node4"].explain() == "Slurm says node4 is drain (DIMM B2 replaced, burn-in pending)"
    assert states["node2"].explain() == "Slurm says node2 is idle"


@pytest.mark.parametrize("state, usable", [
    ("idle", True), ("mix", True), ("alloc", True), ("idle*", False), ("idle~", False), ("drng", False),
    ("down", False), ("fail", False), ("resv", True), ("mix-", True), ("idle#", False)])
def test_node_state_flags(state, usable):
    assert parse_sinfo_nodes(f"n1|{state}|none\n")["n1"].usable is usable


def test_sinfo_text_that_is_not_the_format_is_refused():
    with pytest.raises(ParseError, match="not a `sinfo"):
        parse_sinfo_nodes("NODELIST STATE REASON\nnode1 idle none\n")


def test_a_task_slurm_could_not_start_names_its_node():
    assert parse_launch_failures((DATA / "srun_slurmd_dead.stderr").read_text()) == {
        "node3": "Communication connection failure"}
    assert parse_launch_failures((DATA / "srun_down_immediate.stderr").read_text()) == {}


def test_a_live_partitions_nodes_and_addresses():
    assert parse_partition_sinfo((DATA / "sinfo_partition.stdout").read_text()) == [
        (f"node{i}", f"10.77.142.{i}") for i in range(1, 5)]
    with pytest.raises(SlurmConfError, match="not a `sinfo"):
        parse_partition_sinfo("PARTITION AVAIL  TIMELIMIT\n")


def run_dispatcher(batch: dict, node: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DISPATCH], input=json.dumps(batch), capture_output=True,
                          text=True, env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"})


def test_the_dispatcher_runs_its_nodes_command_and_frames_the_outcome():
    """The node-side dispatcher, run here as a task would run it: long and multi-line output comes
    back byte for byte in frames short enough that srun keeps them whole."""
    long_line = "x" * 5000
    batch = {"inputs": [f"{long_line}\nsecond line\n"],
             "nodes": {"node1": {"argv": ["sh", "-c", "cat; echo oops >&2; exit 3"], "stdin": 0},
                       "node2": {"argv": ["true"], "stdin": None}}}
    done = run_dispatcher(batch, "node1")
    assert done.returncode == 3
    lines = done.stdout.splitlines()
    assert all(len(line) <= FRAME_CHUNK + 40 for line in lines)
    frames: dict[str, Frames] = {}
    ended = [read_frame(line, frames) for line in lines]
    assert ended[-1] == "node1" and set(frames) == {"node1"}
    assert frames["node1"].text("out") == f"{long_line}\nsecond line\n"
    assert frames["node1"].text("err") == "oops\n"
    assert frames["node1"].end is not None and frames["node1"].end[0] == 3


def test_the_dispatcher_on_a_node_without_a_command_and_a_missing_program():
    batch = {"inputs": [], "nodes": {"node1": {"argv": ["/nonexistent/tool"], "stdin": None}}}
    assert run_dispatcher(batch, "node9").stdout == ""
    frames: dict[str, Frames] = {}
    for line in run_dispatcher(batch, "node1").stdout.splitlines():
        read_frame(line, frames)
    assert frames["node1"].end is not None and frames["node1"].end[0] == 127
    assert "No such file" in frames["node1"].text("err")


def test_a_batch_is_one_task_per_node_bounded_and_named(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    settings = LaunchSettings(engine="slurm", partition="gpu", account="acme", reservation="handover",
                              time_limit_min=120)
    argv = batch_argv(["gpu001", "gpu002"], "python3", settings, name="handover-abc", timeout=100)
    assert argv[:-1] == [
        "srun", "--nodelist=gpu001,gpu002", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--immediate=30", "--job-name=handover-abc", "--input=all", "--kill-on-bad-exit=0", "--no-kill", "--quiet",
        "--partition=gpu", "--account=acme", "--reservation=handover", "--time=2", "python3", "-c"]
    assert argv[-1] == DISPATCH
    assert minutes_for(100) == 2 and minutes_for(1) == 1 and minutes_for(3000) == 51


def test_inside_an_allocation_every_srun_is_a_step_of_it(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    settings = LaunchSettings(engine="slurm", partition="gpu", time_limit_min=30)
    assert allocation_options(settings, minutes=5) == ["--jobid=4711", "--overlap", "--time=5"]
    monkeypatch.delenv("SLURM_JOB_ID")
    assert allocation_options(settings, minutes=45) == ["--partition=gpu", "--time=30"]
    assert allocation_options(LaunchSettings()) == []


def test_srun_launcher_renders_ranks_per_node_on_named_nodes(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    launcher = SrunLauncher(settings=LaunchSettings(engine="slurm", account="acme"), job_name="handover-x",
                            time_min=10)
    assert isinstance(launcher, Launcher) and (launcher.name, launcher.starts_on) == ("srun", "first")
    assert launcher.argv(["gpu001", "gpu002"], 8, ["xhpl"]) == [
        "srun", "--nodelist=gpu001,gpu002", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
        "--immediate=30", "--job-name=handover-x", "--kill-on-bad-exit=1", "--account=acme", "--time=10",
        "xhpl"]
    assert SrunLauncher().job_name != SrunLauncher().job_name


def test_the_runs_allocation_is_salloc_of_whole_nodes_holding_a_pipe(monkeypatch):
    """salloc's command is cat on this machine: the allocation lasts as long as the harness's
    pipe; the inventory's partition, account, reservation and time limit are the job's."""
    monkeypatch.setenv("SLURM_JOB_ID", "99")  # never read here: the harness asks only outside one
    settings = LaunchSettings(engine="slurm", partition="gpu", account="acme", reservation="handover",
                              time_limit_min=120, allocation="4711")
    assert allocation_argv(["gpu001", "gpu002"], settings, name="handover-run-x") == [
        "salloc", "--nodelist=gpu001,gpu002", "--nodes=2", "--exclusive", "--immediate=30", "--no-kill",
        "--job-name=handover-run-x", "--partition=gpu", "--account=acme", "--reservation=handover",
        "--time=120", "--", "sh", "-c", "cat; sleep 5"]


def test_salloc_says_the_job_or_why_there_is_none():
    granted = (DATA / "salloc_granted.stderr").read_text().splitlines(keepends=True)
    assert [parse_granted(line) for line in granted] == ["1", None]
    refused = (DATA / "salloc_down_immediate.stderr").read_text().splitlines(keepends=True)
    assert not any(parse_granted(line) for line in refused)
    assert salloc_problem(refused) == "salloc: error: Unable to allocate resources: Connection timed out"
    assert salloc_problem([]) == "no answer"


def test_salloc_says_when_slurm_revoked_the_allocation_under_its_command():
    """Real salloc lines: a time limit that ran out, a scancel; the granted line is not one."""
    timed_out = (DATA / "salloc_revoked_time_limit.stderr").read_text().splitlines(keepends=True)
    assert [parse_revoked(line) for line in timed_out] == [
        None, "Job 3 has exceeded its time limit and its allocation has been revoked."]
    cancelled = (DATA / "salloc_revoked_scancel.stderr").read_text().splitlines(keepends=True)
    assert [parse_revoked(line) for line in cancelled] == [None, "Job allocation 1 has been revoked."]
    assert parse_revoked("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.") is None


def test_an_allocations_time_limit_from_squeue():
    """Its end in this machine's local time, as squeue writes it."""
    assert parse_time_limit((DATA / "squeue_time_limit_end.stdout").read_text()) == TimeLimit(
        "10:00", "2026-12-07T22:51:25", time.mktime((2026, 12, 7, 22, 51, 25, 0, 0, -1)))
    assert parse_time_limit((DATA / "squeue_time_limit_unlimited.stdout").read_text()) == TimeLimit(
        "UNLIMITED", None, None)
    with pytest.raises(ParseError, match="not a `squeue -o %l|%e` line: 'slurm_load_jobs error: Invalid job id'"):
        parse_time_limit("slurm_load_jobs error: Invalid job id\n")


def test_an_allocation_that_ended_says_how_and_where_its_time_ran_out_what_to_change():
    limit = TimeLimit("1:00", "2026-12-07T22:40:17", time.mktime((2026, 12, 7, 22, 40, 17, 0, 0, -1)))
    assert limit.ends_at is not None
    assert revoke_message("3", limit.ends_at, "its time limit ran out", limit, limit_given=False) == (
        "the run's Slurm allocation (job 3) ended at 22:40:17: its time limit ran out (the time limit: 1:00, "
        "the partition's default: the inventory gives no launch.time_limit); to finish the run, --resume it inside "
        "an allocation of your own with the time (salloc --time=...: a resume needs the inventory unchanged), and "
        "give later runs a launch.time_limit of the whole run's time")
    said = "Job 3 has exceeded its time limit and its allocation has been revoked."  # salloc's, 29 s later
    assert revoke_message("3", limit.ends_at + 29, said, limit, limit_given=True) == (
        f"the run's Slurm allocation (job 3) ended at 22:40:46: {said} (the time limit: 1:00, launch.time_limit); "
        "to finish the run, --resume it inside an allocation of your own with the time (salloc --time=...: a "
        "resume needs the inventory unchanged), and give later runs a launch.time_limit of the whole run's time")
    assert revoke_message("3", limit.ends_at, "Job allocation 3 has been revoked.", limit, limit_given=True) == (
        "the run's Slurm allocation (job 3) ended at 22:40:17: Job allocation 3 has been revoked.")


def test_the_operators_allocation_ends_at_its_end_time_and_the_message_says_whose_it_was():
    past = TimeLimit("1:00:00", "2026-12-07T22:40:17", time.mktime((2026, 12, 7, 22, 40, 17, 0, 0, -1)))
    assert HostJob("4711", past).revoked() == (
        "Slurm job 4711, the allocation the run runs in, ended at 22:40:17: its time limit ran out (the time "
        "limit: 1:00:00); to finish the run, --resume it inside an allocation with the time (salloc --time=...)")
    later = time.time() + 3600
    assert HostJob("4711", TimeLimit("2:00:00", time.strftime("%Y-%m-%dT%H:%M:%S"), later)).revoked() is None
    assert HostJob("4711", TimeLimit("UNLIMITED", None, None)).revoked() is None
    assert HostJob("4711", None).revoked() is None  # squeue did not say: srun's own words stand



def local(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_a_jobs_state_from_squeue_says_whether_and_how_its_allocation_ended():
    """Asked after a step failed without results: an end moved by an administrator, a cancel,
    Slurm's time-out, a job Slurm no longer lists (squeue's real words)."""
    moved = parse_job_state((DATA / "squeue_job_state_running_moved.stdout").read_text())
    assert moved == JobState("RUNNING", TimeLimit("3:00", "2026-12-08T01:00:22", local("2026-12-08T01:00:22")))
    assert moved.ended(now=local("2026-12-08T01:00:21")) is None  # RUNNING, and its end not yet here
    assert moved.ended(now=local("2026-12-08T01:00:40")) == (local("2026-12-08T01:00:22"), "its time limit ran out")
    cancelled = parse_job_state((DATA / "squeue_job_state_cancelled.stdout").read_text())
    assert cancelled.ended(now=time.time()) == (local("2026-12-08T00:58:22"), "Slurm says it is CANCELLED")
    timeout = parse_job_state((DATA / "squeue_job_state_timeout.stdout").read_text())
    assert timeout.ended(now=time.time()) == (local("2026-12-08T00:59:51"), "its time limit ran out")
    gone = parse_job_state((DATA / "squeue_job_state_gone.stderr").read_text())
    assert gone == JobState(None) and gone.ended(now=1000.0) == (1000.0, "squeue no longer lists it")
    with pytest.raises(ParseError, match="not a `squeue -o %T|%l|%e` line: 'squeue: error: Unable to contact'"):
        parse_job_state("squeue: error: Unable to contact slurm controller (connect failure)\n")

def test_the_lease_step_waits_on_the_harnesss_pipe_on_every_node():
    settings = LaunchSettings(engine="slurm", allocation="4711")
    argv = lease_step_argv(["gpu001", "gpu002"], settings, lease="abc123", name="handover-lease-x", root=False)
    assert argv[:12] == [
        "srun", "--nodelist=gpu001,gpu002", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--immediate=30", "--job-name=handover-lease-x", "--input=all", "--kill-on-bad-exit=0", "--no-kill", "--quiet",
        "--jobid=4711"]
    assert argv[-4:-2] == ["sh", "-c"] and argv[-1] == "handover-lease-step"
    script = argv[-2]
    assert script.startswith("trap '' TERM HUP; read -r said; ")
    assert script.count(shlex.join(lease_kill_argv("abc123", root=False))) == 2
    assert "sudo -n" in lease_step_argv(["a"], settings, lease="abc123", name="n", root=True)[-2]


def test_the_lease_step_kills_once_when_told_end_and_for_a_while_when_its_input_just_ends():
    """The task's script itself, here: the kill's program stands in for the lease's kill."""
    script = lease_step_argv(["a"], LaunchSettings(), lease="abc", name="n", root=False)[-2]
    kill = shlex.join(lease_kill_argv("abc", root=False))
    counting = script.replace(kill, "echo killed")
    told = subprocess.run(["sh", "-c", counting, "x"], input="end\n", capture_output=True, text=True, timeout=30)
    lost = subprocess.run(["sh", "-c", counting, "x"], input="", capture_output=True, text=True, timeout=30)
    assert told.stdout.split() == ["killed"]
    assert lost.stdout.split() == ["killed"] * (1 + LEASE_GRACE_S)


def test_lease_kill_finds_the_leases_processes():
    argv = lease_kill_argv("abc123", root=False)
    assert argv[:6] == ["timeout", "-k", "5", "60", "sh", "-c"] and argv[-1] == "HANDOVER_LEASE=abc123"
    as_root = lease_kill_argv("abc123", root=True)
    assert as_root[2].startswith("exec sudo -n timeout -k 5 60 sh -c") and as_root[-1] == "HANDOVER_LEASE=abc123"


def write_inventory(tmp_path: Path, launch: str, transport: str = "slurm") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"cluster: c\nprofile: cpu-only\ntransport: {transport}\nnodes: [node1]\nlaunch: {launch}\n")
    return path


@pytest.mark.parametrize("launch, expected", [
    ('{engine: slurm, partition: gpu, account: acme, reservation: handover, time_limit: "1:30:00"}',
     LaunchSettings("slurm", None, "gpu", "acme", "handover", 90)),
    ("{engine: slurm, time_limit: 45, interface: eth0}", LaunchSettings("slurm", "eth0", time_limit_min=45)),
    ('{engine: slurm, time_limit: "2-00:00:30"}', LaunchSettings("slurm", time_limit_min=2881)),
    # as Slurm's --time reads them: minutes:seconds, days-hours, days-hours:minutes
    ('{engine: slurm, time_limit: "30:00"}', LaunchSettings("slurm", time_limit_min=30)),
    ('{engine: slurm, time_limit: "45:30"}', LaunchSettings("slurm", time_limit_min=46)),
    ('{engine: slurm, time_limit: "1-12"}', LaunchSettings("slurm", time_limit_min=2160)),
    ('{engine: slurm, time_limit: "1-0:30"}', LaunchSettings("slurm", time_limit_min=1470)),
    # quoted minutes, as sbatch reads them
    ('{engine: slurm, time_limit: "90"}', LaunchSettings("slurm", time_limit_min=90)),
    ("{interface: ib0}", LaunchSettings(interface="ib0")),
])
def test_launch_key(tmp_path, launch, expected):
    cluster = load_inventory(write_inventory(tmp_path, launch))
    assert cluster.launch == expected and cluster.transport == "slurm"
    assert cluster.launch_interface == expected.interface


def test_the_transport_alone_takes_slurms_allocation_settings(tmp_path):
    cluster = load_inventory(write_inventory(tmp_path, "{partition: gpu, time_limit: 20}"))
    assert cluster.launch == LaunchSettings(partition="gpu", time_limit_min=20)
    with pytest.raises(InventoryError, match="launch.partition is a Slurm setting; it needs engine: slurm "
                                             "or transport: slurm"):
        load_inventory(write_inventory(tmp_path, "{partition: gpu}", transport="ssh"))


@pytest.mark.parametrize("launch, message", [
    ("{engine: slurn}", "launch.engine: unknown engine 'slurn'; did you mean 'slurm'? allowed: default, slurm"),
    ("{engine: slurm, time_limit: 0}", "launch.time_limit: time_limit must be at least 1 minute, got 0"),
    ("{engine: slurm, time_limit: soon}", "launch.time_limit: time_limit 'soon': give minutes (e.g. 30)"),
    ('{engine: slurm, partition: "a,b"}', "launch.partition: partition 'a,b' is not a Slurm partition name"),
    ("{engine: slurm, queue: gpu}", "launch.queue: unknown key"),
])
def test_launch_key_mistakes_are_one_line(tmp_path, launch, message):
    with pytest.raises(InventoryError) as caught:
        load_inventory(write_inventory(tmp_path, launch))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path / 'c.yaml'}:5: ")


def test_a_cancel_that_fails_still_ends_srun_here(monkeypatch, tmp_path):
    """Cleanup after a timeout or Ctrl-C: scancel's squeue missing (or past its timeout) is said
    and let be; the srun process here is killed all the same, so nothing of the step stays."""
    from runners import slurm

    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue, no scancel: the cancel fails
    proc = subprocess.Popen(["/bin/sleep", "300"], start_new_session=True)
    slurm._cancel_and_stop("handover-x", proc)
    assert proc.wait(10) == -signal.SIGKILL
