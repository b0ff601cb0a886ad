"""Slurm as the engine: per-node steps as one srun, multi-node jobs as srun steps, and scancel.

The `slurm` transport keeps the per-node Transport interface, so the suites do not change, but a
fan-out's commands do not become N SSH sessions: every node's command that arrives within a short
window goes into one batch, and a batch is one

    srun --nodelist=a,b,... --ntasks-per-node=1 --immediate=S --time=M python3 -c DISPATCH

whose stdin (sent to every task) holds each node's command and input. The dispatcher on each node
picks its own by SLURMD_NODENAME, runs it, and writes its stdout, stderr, exit status and
duration back as framed base64 lines (`@hov NODE out|err|end ...`), short enough that Slurm never
splits one; the harness reads them as they come, so each node's Result is there as soon as its
task ends. Before a batch, `sinfo` says which nodes Slurm would not run on (down, drained, not
responding): those are unreachable with Slurm's state and reason and the batch runs without them.
A task that cannot start (`Task launch ... failed on node X`) makes its node unreachable too;
srun aborts the whole step then, so the other nodes' commands run once more without it. A node
that fails under a running step ends its own task alone (--no-kill).

Every srun has --immediate (a busy or down node never leaves it queued), a --time limit, the
node-side `timeout` of runners.transport, and a harness-side deadline; on a timeout, Ctrl-C or
SIGTERM the step is cancelled with scancel (found by its unique name), which kills its tasks on
every node; one command killed in a step it shares with other nodes' commands is killed on its
node by its tag instead (SlurmTransport.kill). Inside an allocation (SLURM_JOB_ID set) every
srun is a step of it (--overlap); else the session asks for one of its own (Allocation, with
the inventory's partition, account, reservation and time limit: `launch: {engine: slurm, ...}`)
and, failing that, each srun asks for its own job. In the session's allocation, or the one the
harness runs in, a LeaseStep is the nodes' watchdog, as an SSH connection's lease is: a harness
that dies, however it dies, leaves nothing running. Where the allocation ends under the run
(its time limit, a cancel), the run's later commands fail at once with why (Allocation.revoked,
HostJob.revoked for the operator's allocation the harness runs in); the first step refused for
an end nothing here heard of asks squeue how the job stands (SlurmJob.ask).
"""
from __future__ import annotations

import abc
import base64
import json
import logging
import os
import re
import secrets
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from inventory.model import LaunchSettings, Node
from runners.launchers import IMMEDIATE_S, JOB_PREFIX, SRUN, allocation_options, job_options, minutes_for
from runners.parsing import ParseError
from runners.transport import (
    HARNESS_GRACE_S,
    LEASE_VARIABLE,
    SYSTEM_DIRS,
    TAG_VARIABLE,
    Lease,
    Result,
    Transport,
    clock,
    kill_argv,
    new_tag,
    node_timed_out,
)

log = logging.getLogger("handover.slurm")

SINFO, SCANCEL, SQUEUE, SALLOC = "sinfo", "scancel", "squeue", "salloc"
ALLOCATION_PREFIX = JOB_PREFIX + "run-"  # the harness's own allocation: handover-run-<hex>
CLIENT_TIMEOUT_S = 30  # sinfo, squeue, scancel
KILL_WAIT_S = 10  # how long srun may take to end after its step was cancelled
RELAUNCH_WAIT_S = 60  # how long an aborted step may take to leave its nodes (KillWait, 30 s by default)
LEASE_GRACE_S = 5  # a lost harness's allocation outlives it this long: its lease step kills first
BATCH_QUIET_S = 0.05  # a batch closes once no node's command came for this long ...
BATCH_MAX_WAIT_S = 0.5  # ... or this long after its first
FRAME_CHUNK = 700  # base64 characters per frame line: well under what Slurm's I/O keeps whole
# Base states (sinfo %t, without its flag suffix) a task can start on.
USABLE_STATES = ("idle", "mix", "alloc", "comp", "resv", "plnd")
# ... of which these run other jobs: a step of a job of theirs could start there, the run's own
# whole-node allocation cannot.
BUSY_STATES = ("mix", "alloc")
# sinfo %t's suffixes: * not responding, ~ powered off, # powering up, ! powering down,
# % powering down, $ maintenance reservation, @ pending reboot, ^ reboot issued, - planned
_STATE_FLAGS = "*~#!%$@^-"
_LAUNCH_FAILED = re.compile(r"Task launch for StepId=\S+ failed on node (\S+?): (.+)$")
_GRANTED = re.compile(r"Granted job allocation (\d+)")
# salloc's word that Slurm took its allocation back while its command ran: `Job 3 has exceeded
# its time limit and its allocation has been revoked.`, or `Job allocation 1 has been revoked.`
# (a scancel, an administrator's or a preemption); salloc itself runs on until its command ends.
_REVOKED = re.compile(r"^salloc: (Job .*has been revoked\.?)\s*$")
REVOKE_WAIT_S = 3.0  # how long a step that failed without results waits to see its allocation end

# Runs on every node of a batch with the node's interpreter; its text is fixed, the batch is data.
DISPATCH = r"""
import base64, json, os, subprocess, sys, time
batch = json.load(sys.stdin)
me = os.environ.get("SLURMD_NODENAME", "")
job = batch["nodes"].get(me)
def frame(kind, data):
    text = base64.b64encode(data).decode()
    for start in range(0, len(text), CHUNK):
        sys.stdout.write("@hov %s %s %s\n" % (me, kind, text[start:start + CHUNK]))
# The node's command runs as it would over SSH: without the step's SLURM_* variables, which
# would make an srun it starts (HPL's, nccl-tests') a step of this one-node step.
env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
# and with the system directories appended to PATH, as transport.with_system_dirs does.
path = [entry for entry in env.get("PATH", "").split(":") if entry]
env["PATH"] = ":".join(path + [entry for entry in SYSTEM_DIRS if entry not in path])
if job is not None:
    started = time.monotonic()
    given = job["stdin"]
    try:
        proc = subprocess.run(job["argv"], capture_output=True, env=env,
                              **({"input": batch["inputs"][given].encode()} if given is not None
                                 else {"stdin": subprocess.DEVNULL}))
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except OSError as exc:
        code, out, err = 127, b"", str(exc).encode()
    frame("out", out)
    frame("err", err)
    code = 128 - code if code < 0 else code
    sys.stdout.write("@hov %s end %d %.3f\n" % (me, code, time.monotonic() - started))
    sys.stdout.flush()
    sys.exit(code)
""".replace("CHUNK", str(FRAME_CHUNK)).replace("SYSTEM_DIRS", repr(SYSTEM_DIRS))


class SlurmError(Exception):
    """A Slurm client could not do what was asked; str() is one line naming the command."""


# -- pure parsers -------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeState:
    """One node as `sinfo -h -N -o '%N|%t|%E'` prints it."""

    name: str
    state: str  # compact, with Slurm's flag suffix: idle, down*, drain, idle~, ...
    reason: str  # Slurm's reason ('none' when there is none)

    @property
    def usable(self) -> bool:
        """Whether a task can start there now (a not-responding or powered-off node cannot)."""
        base = self.state.rstrip(_STATE_FLAGS)
        return base in USABLE_STATES and not any(flag in self.state for flag in "*~#!%")

    @property
    def busy(self) -> bool:
        """Whether other jobs run there, so the run cannot have the node to itself."""
        return self.state.rstrip(_STATE_FLAGS) in BUSY_STATES

    def explain(self) -> str:
        reason = f" ({self.reason})" if self.reason and self.reason.lower() != "none" else ""
        return f"Slurm says {self.name} is {self.state}{reason}"


def parse_sinfo_nodes(text: str) -> dict[str, NodeState]:
    """{node: NodeState} from `sinfo -h -N -o '%N|%t|%E'`; a node in several partitions once."""
    states: dict[str, NodeState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise ParseError(f"not a `sinfo -N -o %N|%t|%E` line: {line!r}")
        name, state, reason = (part.strip() for part in parts)
        states.setdefault(name, NodeState(name, state, reason))
    return states


def parse_launch_failures(stderr: str) -> dict[str, str]:
    """{node: why} from srun's `Task launch for StepId=... failed on node X: WHY` lines."""
    failures: dict[str, str] = {}
    for line in stderr.splitlines():
        match = _LAUNCH_FAILED.search(line)
        if match:
            failures.setdefault(match.group(1), match.group(2).strip())
    return failures


@dataclass
class Frames:
    """What the dispatcher sent back for one node so far."""

    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    end: Optional[tuple[int, float]] = None  # exit status, node-side duration

    def text(self, kind: str) -> str:
        chunks = self.out if kind == "out" else self.err
        return base64.b64decode("".join(chunks)).decode("utf-8", errors="replace")


def read_frame(line: str, frames: dict[str, Frames]) -> Optional[str]:
    """Add one line of srun's stdout to `frames`; the node when the line ended its task."""
    parts = line.rstrip("\n").split(" ")
    if len(parts) < 3 or parts[0] != "@hov":
        return None
    node, kind = parts[1], parts[2]
    found = frames.setdefault(node, Frames())
    if kind in ("out", "err") and len(parts) == 4:
        (found.out if kind == "out" else found.err).append(parts[3])
    elif kind == "end" and len(parts) == 5:
        found.end = (int(parts[3]), float(parts[4]))
        return node
    return None


def parse_granted(line: str) -> Optional[str]:
    """The job ID from salloc's `Granted job allocation N` line, None for any other line."""
    match = _GRANTED.search(line)
    return match.group(1) if match else None


def parse_revoked(line: str) -> Optional[str]:
    """salloc's word that the allocation was revoked under its command, without its `salloc: `;
    None for any other line."""
    match = _REVOKED.match(line)
    return match.group(1) if match else None


@dataclass(frozen=True)
class TimeLimit:
    """An allocation's time limit as Slurm writes it (`10:00`, `2:00:00`, `1-12:00:00`,
    `UNLIMITED`) and its end time (None where it has none)."""

    limit: str
    ends: Optional[str]
    ends_at: Optional[float]  # ends as time.time(): squeue writes it in this machine's local time


def parse_time_limit(text: str) -> TimeLimit:
    """From `squeue -h -j JOB -o %l|%e`: `10:00|2026-12-07T22:51:25`, or `UNLIMITED|NONE`."""
    parts = text.strip().split("|")
    if len(parts) != 2 or not parts[0]:
        raise ParseError(f"not a `squeue -o %l|%e` line: {text.strip()!r}")
    try:
        ends_at = time.mktime(time.strptime(parts[1], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:  # NONE, Unknown: no end
        return TimeLimit(parts[0], None, None)
    return TimeLimit(parts[0], parts[1], ends_at)


# Job states (squeue %T) in which a job still holds its allocation; in any other (CANCELLED,
# TIMEOUT, COMPLETING, NODE_FAIL, PREEMPTED, a requeued job's PENDING ...) its steps are refused.
HOLDING_STATES = ("RUNNING", "CONFIGURING", "SUSPENDED", "SIGNALING", "STOPPED", "RESIZING")
_NO_SUCH_JOB = "Invalid job id specified"


@dataclass(frozen=True)
class JobState:
    """How Slurm says a job stands, from `squeue -h -j JOB -t all -o %T|%l|%e`; state None: squeue
    no longer lists it (it ended more than MinJobAge ago)."""

    state: Optional[str]
    time_limit: Optional[TimeLimit] = None

    def ended(self, now: float) -> Optional[tuple[float, str]]:
        """(when, how) the job's allocation ended by `now` (time.time()); None while it holds."""
        if self.state is None:
            return now, "squeue no longer lists it"
        if self.state in HOLDING_STATES:  # still RUNNING up to half a minute past its end time
            return _time_ran_out(self.time_limit, now)
        at = self.time_limit.ends_at if self.time_limit is not None and self.time_limit.ends_at else now
        return at, "its time limit ran out" if self.state == "TIMEOUT" else f"Slurm says it is {self.state}"


def parse_job_state(text: str) -> JobState:
    """`RUNNING|3:00|2026-12-08T01:00:22`, `CANCELLED|...`; squeue's `Invalid job id specified`
    (on stderr) for a job it no longer lists."""
    if _NO_SUCH_JOB in text:
        return JobState(None)
    state, _, limit = text.strip().partition("|")
    if not state.isupper() or not limit:
        raise ParseError(f"not a `squeue -o %T|%l|%e` line: {text.strip()!r}")
    return JobState(state, parse_time_limit(limit))


def job_state(job: str) -> Optional[JobState]:
    """How Slurm says the job stands now; None where squeue does not answer."""
    try:
        done = client([SQUEUE, "-h", "-j", job, "-t", "all", "-o", "%T|%l|%e"])
        return parse_job_state(done.stdout if done.returncode == 0 else done.stderr)
    except (SlurmError, ParseError) as exc:
        log.warning("squeue did not say how Slurm job %s stands: %s", job, exc)
        return None


def revoke_message(job: str, at: float, word: str, time_limit: Optional[TimeLimit], *,
                   limit_given: Optional[bool]) -> str:
    """Why a run's steps fail once the allocation they were steps of ended at `at`: `word` says
    how (salloc's, or that the time limit ran out). Where it was the time limit, how to finish the
    run and what to change. limit_given: whether the inventory gave the run's own allocation its
    launch.time_limit (else the partition's default applied); None for the operator's
    allocation the harness runs in (SLURM_JOB_ID)."""
    whose = f"the run's Slurm allocation (job {job})" if limit_given is not None else \
        f"Slurm job {job}, the allocation the run runs in,"
    why = f"{whose} ended at {clock(at)}: {word}"
    if "time limit" not in word:
        return why
    limit = time_limit.limit if time_limit is not None else "its --time"
    if limit_given is None:
        return why + (f" (the time limit: {limit}); to finish the run, --resume it inside an allocation with the "
                      "time (salloc --time=...)")
    given = "launch.time_limit" if limit_given else "the partition's default: the inventory gives no launch.time_limit"
    return why + (f" (the time limit: {limit}, {given}); to finish the run, --resume it inside an allocation of "
                  "your own with the time (salloc --time=...: a resume needs the inventory unchanged), and give "
                  "later runs a launch.time_limit of the whole run's time")


def time_limit_of(job: str) -> Optional[TimeLimit]:
    """The job's time limit and end, as squeue gives them; None where it does not say (messages
    only: the run goes on without it)."""
    try:
        return parse_time_limit(client([SQUEUE, "-h", "-j", job, "-o", "%l|%e"]).stdout)
    except (SlurmError, ParseError) as exc:
        log.warning("no time limit for Slurm job %s: %s", job, exc)
        return None


def _ended_by_then(ended: Callable[[], Optional[tuple[float, str]]], wait_s: float) -> Optional[tuple[float, str]]:
    """ended(), waiting up to wait_s for it to say (a step that failed at the end may fail a
    moment before this machine's clock reaches the end, or salloc hears of it)."""
    deadline = time.monotonic() + wait_s
    while (found := ended()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


class SlurmJob(abc.ABC):
    """A job the run's steps are steps of: its time limit as squeue gave it when the run took it,
    and what Slurm said of it when asked since."""

    def __init__(self, job: Optional[str], time_limit: Optional[TimeLimit]):
        self.job = job
        self.time_limit = time_limit
        self._said: Optional[tuple[float, str]] = None  # Slurm's word that it ended, once asked

    @abc.abstractmethod
    def revoked(self, wait_s: float = 0.0) -> Optional[str]:
        """Why the run's steps cannot start any more; None while the job stands. wait_s: how long
        to wait for it to end (a step that failed at its end may fail a moment before it shows)."""

    def ask(self) -> Optional[str]:
        """revoked(), once Slurm is asked how the job stands: for a step that failed without
        results, where nothing here knew of an end (an administrator moved it after the run read
        it, or cancelled the operator's job, of which no salloc of the harness's hears). One
        squeue, paid only by a failed step."""
        state = job_state(self.job) if self.job else None
        if state is not None:
            self.time_limit = state.time_limit or self.time_limit
            self._said = state.ended(time.time())
        return self.revoked()


class HostJob(SlurmJob):
    """The operator's allocation the harness runs in (SLURM_JOB_ID): the run's steps are steps
    of it, so from its end time on they fail at once saying so, as with the run's own
    (Allocation); no salloc of the harness's hears of a cancel there: ask() does."""

    def revoked(self, wait_s: float = 0.0) -> Optional[str]:
        """Why the run's steps cannot start any more; None while the job stands. Its end time
        tells, or Slurm when asked: it waits only where the end time comes within wait_s."""
        ends_at = self.time_limit.ends_at if self.time_limit is not None else None
        soon = ends_at is not None and ends_at - time.time() <= wait_s
        ended = _ended_by_then(lambda: self._said or _time_ran_out(self.time_limit), wait_s if soon else 0.0)
        return None if ended is None else revoke_message(self.job or "?", *ended, self.time_limit,
                                                         limit_given=None)


def _time_ran_out(time_limit: Optional[TimeLimit], now: Optional[float] = None) -> Optional[tuple[float, str]]:
    """(its end, how) once this machine's clock (or `now`) has passed the end time squeue gave."""
    ends_at = time_limit.ends_at if time_limit is not None else None
    if ends_at is None or (time.time() if now is None else now) < ends_at:
        return None
    return ends_at, "its time limit ran out"


def salloc_problem(lines: Sequence[str]) -> str:
    """Why salloc gave no allocation: its last error line, else its last line."""
    errors = [line.strip() for line in lines if "error:" in line]
    return errors[-1] if errors else last_line("".join(lines)) or "no answer"


# -- argv ---------------------------------------------------------------------------------------

def batch_argv(nodes: Sequence[str], python: str, settings: LaunchSettings, *, name: str,
               timeout: float) -> list[str]:
    """One task on each node, each running the dispatcher with the batch on its stdin. --no-kill:
    a node that fails during the step (`srun: error: Node failure on node7`) ends its own task
    alone, where Slurm would end the whole step, every other node's command with it."""
    return [SRUN, f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--immediate={IMMEDIATE_S}",
            f"--job-name={name}", "--input=all", "--kill-on-bad-exit=0", "--no-kill", "--quiet",
            *allocation_options(settings, minutes=minutes_for(timeout)), python, "-c", DISPATCH]


def allocation_argv(nodes: Sequence[str], settings: LaunchSettings, *, name: str) -> list[str]:
    """salloc for the run's nodes, whole (an acceptance run measures them alone), with the
    inventory's partition, account, reservation and time limit; --immediate: a node Slurm cannot
    give at once fails the request instead of queueing the run; --no-kill: a node that fails
    during the run leaves the allocation to the others (Slurm would end the whole job, and every
    node's later checks with it), its own checks failing. Its command runs on this
    machine and reads the harness's pipe: when the harness ends, however it ends, it reads the
    end of its input and, after LEASE_GRACE_S (the lease step's time to kill what it tags, as
    its input ended at the same moment), salloc gives the allocation back, ending every step."""
    return [SALLOC, f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}", "--exclusive",
            f"--immediate={IMMEDIATE_S}", "--no-kill", f"--job-name={name}", *job_options(settings),
            "--", "sh", "-c", f"cat; sleep {LEASE_GRACE_S}"]


# -- running Slurm's clients ------------------------------------------------------------------

def client(argv: Sequence[str], *, timeout: float = CLIENT_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run sinfo/squeue/scancel here; a missing client or a hang is a SlurmError."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed here: the slurm engine needs Slurm's "
                         "clients on the harness's machine") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(argv)}` did not answer within {timeout:g} s") from None


def node_states(nodes: Sequence[str]) -> dict[str, NodeState]:
    """What Slurm says of each node now; a node it does not know is left out."""
    done = client([SINFO, "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%t|%E"])
    if done.returncode != 0:
        raise SlurmError(f"sinfo exited {done.returncode}: {last_line(done.stderr)}")
    return parse_sinfo_nodes(done.stdout)


def cancel(name: str) -> None:
    """scancel every job and step named `name` (ours are unique): their tasks die on every node."""
    steps = client([SQUEUE, "-h", "-s", "-o", "%i|%j"])
    ids = [line.split("|", 1)[0] for line in steps.stdout.splitlines()
           if line.partition("|")[2].strip() == name]
    if ids:
        client([SCANCEL, *ids])
    if not os.environ.get("SLURM_JOB_ID"):  # our own job, maybe still pending
        client([SCANCEL, f"--name={name}"])


def wait_gone(name: str, within_s: float) -> bool:
    """Whether Slurm lists no job or step named `name` any more, waiting up to within_s for one
    that is completing (its tasks get KillWait, 30 s by default, to end): its nodes are busy until
    then, and a job asking for them with --immediate is refused."""
    deadline = time.monotonic() + within_s
    while True:
        jobs = client([SQUEUE, "-h", f"--name={name}", "-o", "%i"]).stdout.split()
        steps = client([SQUEUE, "-h", "-s", "-o", "%j"]).stdout.split()
        if not jobs and name not in steps:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def last_line(text: str) -> str:
    """The last line of a client's message: the one that says what went wrong."""
    return (text.strip().splitlines() or [""])[-1]


def _cancel_and_stop(name: str, proc: subprocess.Popen) -> None:
    """Cancel the job or step named `name` and kill its srun or salloc here, whatever the cancel
    did: a squeue past its timeout, or a second Ctrl-C in it, must neither leave srun running nor
    stand in for the error that brought the cleanup on (which is re-raised after it)."""
    try:
        cancel(name)
    except SlurmError as error:
        log.warning("could not cancel %s: %s", name, error)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_here(argv: Sequence[str], *, name: str, timeout: float, node: str = "slurm",
             stdin: Optional[str] = None) -> Result:
    """Run an srun (a launcher's argv) on this machine; on timeout, Ctrl-C or SIGTERM the step
    named `name` is cancelled, so nothing of it stays on the nodes."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True)
    except OSError as exc:
        return Result(node, argv[0], None, "", "", 0.0, failure="error", detail=str(exc))
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout + HARNESS_GRACE_S + IMMEDIATE_S)
    except subprocess.TimeoutExpired:
        _cancel_and_stop(name, proc)
        stdout, stderr = proc.communicate()
        return Result(node, argv[0], None, stdout, stderr, time.monotonic() - started, timed_out=True,
                      full_command=shlex.join(argv))
    except BaseException:
        _cancel_and_stop(name, proc)
        raise
    return Result(node, argv[0], proc.returncode, stdout, stderr, time.monotonic() - started,
                  full_command=shlex.join(argv))


class Allocation(SlurmJob):
    """The run's own Slurm allocation, asked for when the harness does not run inside one: every
    srun of the run is a step of it (--jobid, --overlap), and releasing it ends them all.

    salloc holds it while its command runs, and that command reads a pipe only the harness
    writes to: Ctrl-C, SIGTERM, an error or the end of the run release it (release()), and a
    SIGKILLed harness closes the pipe, which releases it too. Where the harness's whole machine
    is lost, the allocation's --time (the inventory's time_limit) bounds it.

    Slurm may take it back first: its time limit (the inventory's, else the partition's default)
    ran out, or someone cancelled it. `revoked()` then says why, and the run's later steps fail
    at once as unreachable with that reason (srun said only `Job/step already completing or
    completed`), so that a resume runs them again. Slurm refuses new steps from the end time
    squeue gave at the grant, while salloc hears of the end only once the job is gone (up to
    half a minute, and KillWait, later); a cancel, salloc says at once.
    """

    def __init__(self, nodes: Sequence[str], settings: LaunchSettings):
        self.name = ALLOCATION_PREFIX + secrets.token_hex(6)
        self.argv = allocation_argv(nodes, settings, name=self.name)
        self.nodes = list(nodes)
        self.settings = settings
        super().__init__(None, None)  # the job and its time limit, once granted (None: squeue did not say)
        self._messages: list[str] = []
        self._granted = threading.Event()
        self._revoked: Optional[tuple[float, str]] = None  # time.time() and salloc's word
        self._releasing = False  # our own cancel: salloc's word of it is no news
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True, errors="replace",
                                          start_new_session=True)
        except FileNotFoundError:
            raise SlurmError(f"`{SALLOC}` is not installed here: the slurm engine needs Slurm's "
                             "clients on the harness's machine") from None
        threading.Thread(target=self._read, daemon=True, name="salloc").start()
        try:
            granted = self._granted.wait(IMMEDIATE_S + CLIENT_TIMEOUT_S)
        except BaseException:  # Ctrl-C while Slurm decides: no allocation may stay behind
            self.release()
            raise
        if not granted or self.job is None:
            self.release()
            why = salloc_problem(self._messages)
            raise SlurmError(f"salloc for {len(self.nodes)} node(s) gave no allocation: {why}")
        self.time_limit = time_limit_of(self.job)

    def _read(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._messages.append(line)
            if self.job is None:
                self.job = parse_granted(line)
                if self.job is not None:
                    self._granted.set()
            elif not self._releasing and self._revoked is None and (word := parse_revoked(line)) is not None:
                self._revoked = (time.time(), word)
                log.warning("Slurm revoked the run's allocation, job %s: %s", self.job, word)
        self._granted.set()  # salloc ended: granted or not, nothing more comes

    def revoked(self, wait_s: float = 0.0) -> Optional[str]:
        """Why the run no longer has its allocation, for the message of every command that
        needed it; None while it stands. wait_s: how long to wait for it to end."""
        ended = _ended_by_then(lambda: self._revoked or self._said or _time_ran_out(self.time_limit), wait_s)
        if ended is None:
            return None
        return revoke_message(self.job or "?", *ended, self.time_limit,
                              limit_given=self.settings.time_limit_min is not None)

    def record(self) -> str:
        """The raw record of the allocation (raw/slurm_allocation): its job ID, its time limit."""
        lines = [f"job {self.job}"]
        if self.time_limit is not None:
            until = f", until {self.time_limit.ends}" if self.time_limit.ends else ""
            lines.append(f"time limit {self.time_limit.limit}{until}")
        return "\n".join(lines) + "\n"

    def release(self) -> None:
        """Give the allocation back (its steps end on every node) at once; idempotent."""
        self._releasing = True
        proc = self._proc
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            if self.job is not None and proc.poll() is None:
                client([SCANCEL, self.job])  # rather than wait out the grace of a harness lost
        except (OSError, SlurmError):
            pass
        try:
            proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            _stop(proc)
            proc.wait()


def lease_kill_argv(lease: str, *, root: bool) -> list[str]:
    """runners.transport's kill of everything tagged, for a lease's tag instead of a command's."""
    argv = kill_argv("", root=root)
    argv[-1] = f"{LEASE_VARIABLE}={lease}"
    return argv


def lease_step_argv(nodes: Sequence[str], settings: LaunchSettings, *, lease: str, name: str,
                    root: bool) -> list[str]:
    """One task per node, its input the harness's pipe (--input=all), that kills every process
    carrying the lease tag once the input ends: once when the harness wrote `end` first (a run
    that ends as it should), else again every second for LEASE_GRACE_S, since a lost harness's
    last commands may still start what they start (a lock's holder) in the meantime. SIGTERM and
    SIGHUP are ignored, so that the allocation's end (which sends them) does not cut that short.
    --no-kill: a node that fails ends its own task alone, not every node's watchdog."""
    kill = shlex.join(lease_kill_argv(lease, root=root))
    script = (f"trap '' TERM HUP; read -r said; {kill}; [ \"$said\" = end ] && exit 0; "
              f"for second in $(seq {LEASE_GRACE_S}); do sleep 1; {kill}; done")
    return [SRUN, f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--immediate={IMMEDIATE_S}", f"--job-name={name}", "--input=all",
            "--kill-on-bad-exit=0", "--no-kill", "--quiet", *allocation_options(settings),
            "sh", "-c", script, "handover-lease-step"]


class LeaseStep:
    """The node-side watchdog of a session's slurm transports, as an SSH connection's lease is of
    its node's: one step of the run's allocation on all its nodes, whose input is a pipe only the
    harness writes to. When the input ends (close(), or the harness died however it died), each
    node's task kills every process carrying the session's lease tag (lease_step_argv), such as
    a node lock's holder, which left its own step's process tree (Slurm's proctrack/linuxproc
    does not follow it; proctrack/cgroup would end it with the step that started it)."""

    def __init__(self, nodes: Sequence[str], settings: LaunchSettings, *, root: bool, job: Optional[str] = None):
        self.tag = new_tag()
        self.nodes = frozenset(nodes)  # the allocation's: no step of it can run elsewhere
        # Where the run's steps run, and why a node is not there, for its checks' message: the
        # run's own allocation, or the job the harness runs in (`job`).
        self.allocation, self.outside = (
            (f"Slurm job {job}, the allocation the run runs in", "it holds the nodes SLURM_JOB_NODELIST names")
            if job else ("the run's Slurm allocation", "Slurm could not give it to the run when the run began"))
        self.name = JOB_PREFIX + "lease-" + secrets.token_hex(6)
        self.argv = lease_step_argv(nodes, settings, lease=self.tag, name=self.name, root=root)
        try:
            self._proc: Optional[subprocess.Popen] = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except FileNotFoundError:
            raise SlurmError(f"`{SRUN}` is not installed here: the slurm transport needs Slurm's "
                             "clients on the harness's machine") from None

    @property
    def standing(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Say `end` and end the input: every node's lease kills what it tags, and the step ends."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.write(b"end\n")
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            _cancel_and_stop(self.name, proc)
            proc.wait()


# -- the transport ------------------------------------------------------------------------------

@dataclass
class _Entry:
    node: Node
    command: list[str]
    display: str
    stdin: Optional[str]
    timeout: float
    tag: str
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[Result] = None


class _Batch:
    """The commands of one srun: filled for a moment, then run by the thread that opened it."""

    def __init__(self, python: str):
        self.python = python
        self.name = JOB_PREFIX + secrets.token_hex(6)
        self.entries: dict[str, _Entry] = {}
        self.opened = time.monotonic()
        self.last = self.opened
        self.closed = False
        self.cancelled = False
        self.cancelled_for: Optional[str] = None  # the node whose command it was cancelled for (cancel())




class SlurmSteps:
    """Batches the per-node commands of a session's slurm transports into sruns (module docstring)."""

    def __init__(self, settings: LaunchSettings, lease: Optional[LeaseStep] = None,
                 allocation: Optional[SlurmJob] = None):
        self.settings = settings
        self.lease = lease  # the session's node-side watchdog, where the run has its allocation
        self.allocation = allocation  # the run's own or the one it runs in: revoked() says if it is gone
        self._lock = threading.Lock()
        self._open: dict[str, _Batch] = {}  # interpreter -> the batch still taking commands
        self._running: dict[str, _Batch] = {}  # tag -> the batch its command is in

    def submit(self, entry: _Entry) -> Result:
        with self._lock:
            batch = self._open.get(entry.node.python)
            leader = batch is None or entry.node.name in batch.entries
            if leader:
                batch = _Batch(entry.node.python)
                self._open[entry.node.python] = batch
            assert batch is not None
            batch.entries[entry.node.name] = entry
            batch.last = time.monotonic()
            self._running[entry.tag] = batch
        if leader:
            threading.Thread(target=self._fill_and_run, args=(batch,), daemon=True, name=batch.name).start()
        try:
            entry.done.wait()
        except BaseException:  # Ctrl-C in the caller's thread: the step ends with it, on every node
            try:
                self.cancel(entry.tag)
            except SlurmError:  # best effort: --time and the node-side timeout still bound the work
                pass
            raise
        finally:
            with self._lock:
                self._running.pop(entry.tag, None)
        assert entry.result is not None
        return entry.result

    def shares_step(self, tag: str) -> bool:
        """Whether the command tagged `tag` runs in an srun with other nodes' commands."""
        with self._lock:
            batch = self._running.get(tag)
            return batch is not None and len(batch.entries) > 1

    def cancel(self, tag: str) -> None:
        """Cancel the srun that runs the command tagged `tag` (with every node's part of it)."""
        with self._lock:
            batch = self._running.get(tag)
            if batch is None or batch.cancelled:
                return
            batch.cancelled = True
            batch.cancelled_for = next((name for name, entry in batch.entries.items() if entry.tag == tag), None)
        cancel(batch.name)

    def _fill_and_run(self, batch: _Batch) -> None:
        """The batch, on a thread of its own: its first command's caller, like every other, has its
        result as its own task ends. Run on that caller's thread, a client's result waited for
        the whole step, up to the timeout of the server it had to retry (an iperf3 pair's)."""
        self._fill(batch)
        self._run(batch)

    def _fill(self, batch: _Batch) -> None:
        """Let the other nodes of the same fan-out join, then close the batch."""
        while True:
            now = time.monotonic()
            with self._lock:
                if now - batch.last >= BATCH_QUIET_S or now - batch.opened >= BATCH_MAX_WAIT_S:
                    batch.closed = True
                    if self._open.get(batch.python) is batch:
                        del self._open[batch.python]
                    return
            time.sleep(BATCH_QUIET_S / 2)

    def _run(self, batch: _Batch) -> None:
        entries = dict(batch.entries)
        revoked = self.allocation.revoked() if self.allocation is not None else None
        if revoked is not None:  # no step of it can start: say why, rather than srun's `expired`
            for entry in entries.values():
                _finish(entry, failure="unreachable", detail=revoked)
            return
        try:
            try:
                states = node_states(list(entries))
            except SlurmError as exc:
                for entry in entries.values():
                    _finish(entry, failure="error", detail=str(exc))
                return
            ready = {}
            for name, entry in entries.items():
                state = states.get(name)
                if state is None:
                    _finish(entry, failure="unreachable", detail=f"Slurm knows no node {name}")
                elif not state.usable:
                    _finish(entry, failure="unreachable", detail=state.explain())
                elif self.lease is not None and name not in self.lease.nodes:  # one srun: all or none
                    _finish(entry, failure="unreachable", detail=f"{name} is not in {self.lease.allocation}: "
                            f"{self.lease.outside} ({state.explain()} now)")
                else:
                    ready[name] = entry
            if ready:
                self._srun(batch, ready)
        except Exception as exc:  # whatever broke, every command waiting on the batch has its answer
            for entry in entries.values():
                if not entry.done.is_set():
                    _finish(entry, failure="error", detail=f"{type(exc).__name__}: {exc}")

    def _srun(self, batch: _Batch, entries: dict[str, _Entry], *, again: bool = True) -> None:
        inputs: list[str] = []
        jobs = {}
        for name, entry in entries.items():
            index = None
            if entry.stdin is not None:
                if entry.stdin not in inputs:
                    inputs.append(entry.stdin)
                index = inputs.index(entry.stdin)
            jobs[name] = {"argv": entry.command, "stdin": index}
        timeout = max(entry.timeout for entry in entries.values())
        argv = batch_argv(list(entries), batch.python, self.settings, name=batch.name, timeout=timeout)
        payload = json.dumps({"inputs": inputs, "nodes": jobs})
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)
        errors: list[str] = []
        helpers = [threading.Thread(target=_feed, args=(proc, payload), daemon=True),
                   threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True)]
        for helper in helpers:
            helper.start()
        deadline = threading.Timer(timeout + HARNESS_GRACE_S + IMMEDIATE_S, self._expire, (batch, proc))
        deadline.daemon = True
        deadline.start()
        frames: dict[str, Frames] = {}
        try:
            for line in proc.stdout or []:
                node = read_frame(line, frames)
                if node in entries and not entries[node].done.is_set():
                    _finish_framed(entries[node], frames[node])
            proc.wait()
        except BaseException:  # the step is not left running on the nodes, whatever broke here
            batch.cancelled = True
            _cancel_and_stop(batch.name, proc)
            raise
        finally:
            deadline.cancel()
            for helper in helpers:
                helper.join(5)
        stderr = "".join(errors)
        expired = batch.cancelled
        failed = parse_launch_failures(stderr)
        missing = [name for name, entry in entries.items() if not entry.done.is_set()]
        spared = {name: entries[name] for name in missing if failed and name not in failed}
        if again and spared and not expired and self._rebatch(batch, spared, failed):
            missing = [name for name in missing if name not in spared]
        states = _states_or_none(missing) if missing and not expired else {}
        revoked = (self.allocation.revoked(wait_s=REVOKE_WAIT_S) or self.allocation.ask()
                   if missing and not expired and self.allocation is not None else None)
        for name in missing:
            entry, state = entries[name], states.get(name)
            frame = frames.get(name, Frames())
            partial = (frame.text("out"), frame.text("err"))
            if revoked is not None:
                _finish(entry, failure="unreachable", duration=time.monotonic() - started, output=partial,
                        detail=revoked)
            elif expired and batch.cancelled_for not in (None, name):  # not its own deadline, nor its own kill
                _finish(entry, failure="error", duration=time.monotonic() - started, output=partial,
                        detail=f"srun step {batch.name} was cancelled for {batch.cancelled_for}'s command, "
                               f"and {name}'s with it")
            elif expired:
                _finish(entry, timed_out=True, duration=time.monotonic() - started, output=partial,
                        detail=f"srun step {batch.name} cancelled")
            elif name in failed:
                _finish(entry, failure="unreachable", detail=f"Slurm could not start the task on {name}: "
                        f"{failed[name]}" + (f"; {state.explain()}" if state else ""))
            elif state is not None and not state.usable:
                _finish(entry, failure="unreachable", detail=state.explain())
            else:
                _finish(entry, failure="error", detail=f"srun exited {proc.returncode} without "
                        f"{name}'s result: {last_line(stderr) or 'no message'}", output=partial)

    def _rebatch(self, batch: _Batch, spared: dict[str, _Entry], failed: dict[str, str]) -> bool:
        """srun aborts the whole step when a task cannot start on one node (a node whose slurmd
        died before slurmctld noticed, for up to SlurmdTimeout), killing every other node's
        command: run those once more, in a step without the failed nodes. False where the batch
        was cancelled meanwhile."""
        again = _Batch(batch.python)
        with self._lock:
            if batch.cancelled:
                return False
            again.entries = dict(spared)
            for entry in spared.values():
                self._running[entry.tag] = again
        log.warning("srun step %s could not start on %s; its %d other node(s) run again as %s",
                    batch.name, ", ".join(failed), len(spared), again.name)
        try:
            wait_gone(batch.name, RELAUNCH_WAIT_S)
        except SlurmError as error:  # the new step's own --immediate still bounds a busy node
            log.warning("could not see %s end: %s", batch.name, error)
        self._srun(again, spared, again=False)
        return True

    def _expire(self, batch: _Batch, proc: subprocess.Popen) -> None:
        """The harness-side deadline: cancel the step, then make sure srun itself is gone."""
        batch.cancelled = True
        try:
            cancel(batch.name)
        finally:
            try:
                proc.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                _stop(proc)



def _feed(proc: subprocess.Popen, payload: str) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _states_or_none(nodes: Sequence[str]) -> dict[str, NodeState]:
    try:
        return node_states(nodes)
    except SlurmError:
        return {}


def _finish(entry: _Entry, *, failure: Optional[str] = None, detail: str = "", timed_out: bool = False,
            duration: float = 0.0, output: tuple[str, str] = ("", "")) -> None:
    entry.result = Result(entry.node.name, entry.display, None, output[0], output[1], duration,
                          timed_out=timed_out, failure=failure, detail=detail)
    entry.done.set()


def _finish_framed(entry: _Entry, frames: Frames) -> None:
    assert frames.end is not None
    code, duration = frames.end
    entry.result = Result(entry.node.name, entry.display, code, frames.text("out"), frames.text("err"),
                          duration, timed_out=node_timed_out(code, duration, entry.timeout))
    entry.done.set()


def _own_tag(command: Sequence[str]) -> str:
    """The tag wrap() gave the command (among its `env` assignments), else a new one: a kill's
    arguments name the tag of the command it kills, not its own."""
    words = list(command)
    if "env" in words:
        for word in words[words.index("env") + 1:]:
            if "=" not in word:
                break
            if word.startswith(f"{TAG_VARIABLE}="):
                return word.split("=", 1)[1]
    return new_tag()


class SlurmTransport(Transport):
    """A node reached through Slurm: its commands go into the session's srun batches (SlurmSteps)."""

    def __init__(self, node: Node, steps: SlurmSteps):
        super().__init__(node)
        self.steps = steps

    def _open(self) -> Lease:
        """The session's lease step's tag where there is one; else a tag of the node's own, and
        slurmstepd is the watchdog (a step's tasks end with it)."""
        with self._lock:
            if self._lease is None:
                self._lease = Lease(self.steps.lease.tag if self.steps.lease is not None else new_tag())
            return self._lease

    def _execute(self, lease, command, *, display, stdin, timeout):
        return self.steps.submit(_Entry(self.node, list(command), display, stdin, timeout, _own_tag(command)))

    def release(self) -> Result:
        """Kill what our steps left running on the node (node locks' holders: a process that left
        its task's tree escapes Slurm's process tracking), by the lease's tag, as the SSH lease does."""
        lease = self._lease
        if lease is None:
            return Result(self.node.name, "release", 0, "", "", 0.0)
        return self._execute(lease, lease_kill_argv(lease.tag, root=self.node.sudo), display="release",
                             stdin=None, timeout=CLIENT_TIMEOUT_S)

    def kill(self, tag: str, *, root: bool = False) -> None:
        """scancel the step the command is in, where it runs alone: Slurm kills its tasks. One
        that shares its step with other nodes' commands (a batch: a round's pair servers and
        clients) is killed on its node by its tag, as over SSH, through a step of its own: a
        cancel ended the others' too, and one pair's stuck server failed the whole round. Where
        that kill could not run there, the step is cancelled still: over-killed, not left running."""
        if self.steps.shares_step(tag):
            killed = self._kill_on_node(tag, root=root)
            if killed is not None and killed.ok:
                return
        try:
            self.steps.cancel(tag)
        except SlurmError:  # best effort: --time and the node-side timeout still bound the work
            pass
