"""One small transport interface: run an argv (or ship a Python payload) on one node.

Every command is wrapped so that it cannot outlive its welcome on the node:

    env HANDOVER_TAG=<tag> HANDOVER_LEASE=<lease> timeout -k 5 <seconds> <argv...>

GNU ``timeout`` makes itself a process-group leader and signals the whole group when time is
up, so a run timeout holds on the node even if the harness dies. The tag is inherited by every
descendant, so ``kill()`` finds them all through /proc/*/environ, including processes that
started a new session, when the harness times out or is interrupted first.

The lease is the node-side watchdog of one connection: a small POSIX-sh process started with it,
which reads a heartbeat byte from the harness every HEARTBEAT_S and echoes it back. When its
input ends (the harness died and sshd closed the session) or no heartbeat came for
NODE_PATIENCE_S (the harness's machine or the link is gone), it kills every process tagged with
its lease, so nothing runs on until its own long timeout, and removes the temporary directories
named after it (OWN_TEMP_PREFIX). The echo is how the harness knows the node still answers
(runners.ssh). The transport itself writes nothing on the node's disk.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shlex
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from inventory.model import LaunchSettings, Node

TAG_VARIABLE = "HANDOVER_TAG"
LEASE_VARIABLE = "HANDOVER_LEASE"
KILL_GRACE_S = 5  # TERM first, KILL this much later
LEASE_END_S = KILL_GRACE_S + 2  # how long closing a connection waits for its watchdog's cleanup
HARNESS_GRACE_S = KILL_GRACE_S + 10  # how long the harness waits beyond the node-side timeout
# Reading /proc/PID/environ waits for that process's memory map, so a process stuck on a hung
# NFS mount can hold a kill with it: each read has PROC_READ_S, and the whole kill KILL_BOUND_S
# on the node (its TERM grace and its scans of /proc on a busy node take seconds, not a minute).
# The harness waits KILL_WAIT_S for it (and HARNESS_GRACE_S), then goes on.
PROC_READ_S = 5
KILL_BOUND_S = 60
KILL_WAIT_S = 15
HEARTBEAT_S = 3  # the harness sends a heartbeat this often
# The lease kills its work after this long without a heartbeat: longer than the harness waits
# for an echo (runners.ssh.LINK_DEAD_AFTER_S, and as much longer as the harness waits longer on a
# slower link: runners.ssh.link_dead_after), so that a link the harness still takes for sound (a
# blip, answered late by TCP's resends) never has the node kill what the harness waits on.
NODE_PATIENCE_S = 25
# A node lost (a dead link, a refused or timed-out connect) is tried again by the first command
# after each of these intervals, counted from the loss and then from each try: a blip costs the
# checks that fall inside it, where a loss kept for good cost all of a node's later ones; a node
# that stays dead costs a few connect timeouts in all, then fails at once for the rest of the run.
# Sooner where its SSH port is seen to answer again (runners.ssh.Knocker: `heard`).
RECONNECT_AFTER_S = (15, 45, 240)
SILENCES_KEPT = 5  # a node's link silences on the run's record one by one; the rest as one entry
# A command that needs a temporary directory names it OWN_TEMP_PREFIX + its lease (or its tag,
# where it has no lease) + "-", under TMPDIR: whatever kills the command removes it as well.
OWN_TEMP_PREFIX = "handover-"
LONG_WORD = 120  # longer argv words (inline input, scripts) show as their size in messages
# Where distributions install system tools (ibstat, dmidecode; ip and lspci on RHEL), which a
# non-root user's PATH leaves out (sshd's default, Debian's and RHEL's): every command runs with
# them appended, so that such a tool is found rather than taken for missing.
SYSTEM_DIRS = ("/usr/sbin", "/sbin")

log = logging.getLogger("handover.transport")

# Fixed text: it interpolates constants only; the tag (hex digits) arrives as $1, quoted anyway.
# TERM first, so that tools tidy up (torchrun removes its log directory), KILL after the grace;
# then the temporary directories named after the tag or lease (OWN_TEMP_PREFIX) go too, since a
# process killed where it hung (a torchrun waiting on a dead link) never removed its own. They
# are looked for under /tmp, this script's TMPDIR, the TMPDIRs the tagged processes had (theirs
# need not be this one's: sudo resets it for a root watchdog, pam_tmpdir gives each user a TMPDIR
# of its own) and, for a watchdog, its session's TMPDIR ($session_tmpdir): a command that died by
# itself (KILLed by its own timeout) leaves no process to learn it from.
_KILL_TAGGED = r"""
tagged() { timeout %d grep -lsxz "$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
tmpdirs() {
  for pid in $1; do timeout %d tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | sed -n 's/^TMPDIR=//p'; done
}
kill_tagged() {
  pids=$(tagged "$1")
  dirs=$(tmpdirs "$pids")
  if [ -n "$pids" ]; then
    kill -TERM $pids 2>/dev/null
    for _ in $(seq %d); do sleep 0.2; pids=$(tagged "$1"); [ -z "$pids" ] && break; done
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  fi
  own="${1#*=}"
  [ -z "$own" ] && return 0
  printf '%%s\n' /tmp "${TMPDIR:-/tmp}" "$session_tmpdir" "$dirs" | sort -u | while IFS= read -r dir; do
    [ -n "$dir" ] && rm -rf -- "$dir/%s$own-"* 2>/dev/null
  done
  return 0
}
""" % (PROC_READ_S, PROC_READ_S, KILL_GRACE_S * 5, OWN_TEMP_PREFIX)
# $1: the tag's variable; $2: the TMPDIR of the session that started it, which sudo resets (_script_argv)
_KILL_SCRIPT = _KILL_TAGGED + 'session_tmpdir="${2:-}"\nkill_tagged "$1"\n'
# $1: seconds without a heartbeat before the work is killed (0: wait for the end of input only);
# $2: the lease's variable; $3: as $2 above
_LEASE_SCRIPT = _KILL_TAGGED + r"""
session_tmpdir="${3:-}"
while beat=$(timeout "$1" dd bs=1 count=1 2>/dev/null) && [ -n "$beat" ]; do
  printf %s "$beat" || break
done
kill_tagged "$2"
"""


NOT_REACHED = ("unreachable", "auth", "host-key")  # Result.failure words: the node was never reached


@dataclass(frozen=True)
class Result:
    """What one command on one node gave, whatever happened: a dead node is data, not an exception."""

    node: str
    command: str  # for messages: the program and the payload's name, never inline input or scripts
    exit_code: Optional[int]  # None when the command never ran or never finished
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    failure: Optional[str] = None  # transport-level: 'unreachable', 'auth', 'host-key', 'error'
    detail: str = ""  # the transport's one-line explanation of a failure
    full_command: str = ""  # the whole argv, inline input included, for raw logs only

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.failure is None

    @property
    def not_reached(self) -> bool:
        """The node was never reached (unreachable, or its login refused): nothing ran there."""
        return self.failure in NOT_REACHED

    @property
    def status(self) -> str:
        """One word for tables and progress: ok, exit-N, timeout, unreachable, auth, host-key, error."""
        if self.failure:
            return self.failure
        if self.timed_out:
            return "timeout"
        return "ok" if self.exit_code == 0 else f"exit-{self.exit_code}"

    def explain(self) -> str:
        """One line saying what went wrong, for check messages."""
        if self.failure:
            return f"{self.node} {self.failure}: {self.detail}"
        if self.timed_out:
            return f"{self.node}: `{self.command}` timed out after {self.duration_s:.0f} s"
        if self.exit_code != 0:
            return f"{self.node}: `{self.command}` exited {self.exit_code}: {last_word(self.stderr)}"
        return f"{self.node}: ok"


def last_word(stderr: str) -> str:
    """The last line of a command's stderr that says something: the scratch payloads' note that
    they removed their files (`handover-hpl: removed /scratch/...`) comes after the tool's error."""
    lines = stderr.strip().splitlines()
    said = [line for line in lines if not (line.startswith("handover-") and ": removed " in line)]
    return (said or lines or [""])[-1]


@dataclass(frozen=True)
class Loss:
    """When and why a node stopped answering; until its next try (RECONNECT_AFTER_S) its commands
    fail at once, and once those tries are spent, for the rest of the run."""

    at: float  # time.time()
    reason: str
    tries: int = 0  # reconnects tried since, every one in vain
    last_try: Optional[float] = None
    earlier: int = 0  # losses before this one that the node came back from: a link that keeps
    # dropping spends RECONNECT_AFTER_S as a dead node does, and then stays lost
    heard_at: Optional[float] = None  # its SSH port answered since the loss or its last try

    @property
    def clock(self) -> str:
        return clock(self.at)

    @property
    def next_try(self) -> Optional[float]:
        """When a command may try the node again; None once RECONNECT_AFTER_S is spent."""
        spent = self.earlier + self.tries
        if spent >= len(RECONNECT_AFTER_S):
            return None
        return (self.last_try or self.at) + RECONNECT_AFTER_S[spent]

    def due(self) -> bool:
        """A try is left, and its time has come or the node was heard since."""
        next_try = self.next_try
        return next_try is not None and (self.heard_at is not None or time.time() >= next_try)

    def tried(self, when: float) -> "Loss":
        return dataclasses.replace(self, tries=self.tries + 1, last_try=when, heard_at=None)

    def result(self, node: str, command: str) -> Result:
        """What a command of the lost node gives: the loss's time and reason only, the same for
        every check of it whatever its tries since, so that a node's (and a rack's) checks read
        as one reason below the verdict; the tries are in the log."""
        return Result(node, command, None, "", "", 0.0, failure="unreachable",
                      detail=f"lost at {self.clock} ({self.reason})")


class Silences:
    """A node's silences on the run's record: the first SILENCES_KEPT one by one, the rest as one
    entry (how many, the longest, from the first's start to the last's end). A link that flaps
    through a 24-hour soak would put thousands of rows in the report."""

    def __init__(self) -> None:
        self.kept: list[tuple[Loss, float]] = []
        self.more = 0
        self._longest = 0.0
        self._since = self._back = 0.0

    def note(self, since: float, back: float, reason: str) -> None:
        if len(self.kept) < SILENCES_KEPT:
            self.kept.append((Loss(since, reason), back))
            return
        self.more += 1
        self._longest = max(self._longest, back - since)
        self._since, self._back = self._since or since, back

    def entries(self) -> list[tuple[Loss, float]]:
        if not self.more:
            return list(self.kept)
        rest = Loss(self._since, f"{self.more} more silence{'s' if self.more > 1 else ''} of the link, "
                                 f"the longest {self._longest:.0f} s")
        return self.kept + [(rest, self._back)]


class Unavailable(Exception):
    """No connection to run on: the per-node outcome word and its one-line explanation."""

    def __init__(self, failure: str, detail: str):
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


class Lease:
    """A connection's node-side watchdog as the harness holds it (see the module docstring)."""

    def __init__(self, tag: str):
        self.tag = tag

    @property
    def standing(self) -> bool:
        """Whether commands can still go through this lease's connection."""
        return True

    def close(self) -> None:
        """End the connection once its node-side watchdog has killed whatever of ours is left and
        removed our temporary directories, or LEASE_END_S has passed."""


def clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def new_tag() -> str:
    return secrets.token_hex(8)


def short_command(argv: Sequence[str]) -> str:
    """The argv as messages show it: a long or multi-line word (inline input, a script) becomes
    its size, so a message names the program and the payload but never carries their text."""
    return " ".join(shlex.quote(word) if len(word) <= LONG_WORD and "\n" not in word
                    else f"<{len(word.encode())} bytes>" for word in argv)


def wrap(argv: Sequence[str], *, tag: str, timeout: float, root: bool,
         env: Optional[Mapping[str, str]] = None, lease: Optional[str] = None) -> list[str]:
    """The argv the node actually runs: tagged, bounded by a node-side timeout, maybe via sudo."""
    tags = [f"{TAG_VARIABLE}={tag}"] + ([f"{LEASE_VARIABLE}={lease}"] if lease else [])
    assignments = tags + [f"{k}={v}" for k, v in (env or {}).items()]
    wrapped = ["env", *assignments, *bounded(timeout), *argv]
    return ["sudo", "-n", *wrapped] if root else wrapped


def with_system_dirs(path: str) -> str:
    """PATH with the SYSTEM_DIRS it lacks appended: the user's own directories still come first."""
    present = [entry for entry in path.split(":") if entry]
    return ":".join(present + [entry for entry in SYSTEM_DIRS if entry not in present])


def bounded(seconds: float) -> list[str]:
    """GNU timeout's words for a node-side bound: TERM after `seconds`, KILL KILL_GRACE_S later."""
    return ["timeout", "-k", str(KILL_GRACE_S), str(max(1, int(round(seconds))))]


def kill_argv(tag: str, *, root: bool, bound_s: int = KILL_BOUND_S) -> list[str]:
    """Kill everything tagged `tag`, ending itself after bound_s (KILLed KILL_GRACE_S later)."""
    return _script_argv(_KILL_SCRIPT, "handover-kill", [f"{TAG_VARIABLE}={tag}"], root=root, bound_s=bound_s)


def lease_argv(lease: str, *, patience_s: float, root: bool) -> list[str]:
    """The node-side watchdog of one connection; as root where root commands may run."""
    return _script_argv(_LEASE_SCRIPT, "handover-lease", [str(int(patience_s)), f"{LEASE_VARIABLE}={lease}"],
                        root=root)


def _script_argv(script: str, name: str, args: list[str], *, root: bool,
                 bound_s: Optional[int] = None) -> list[str]:
    """`sh -c script name args...`, under `timeout` where bounded; as root, through sudo, which
    resets TMPDIR: the session's own shell reads it first and passes it on after the args, where
    a command's leftovers may be. The bound goes inside sudo, so that it signals every process
    of the script's as root."""
    bound = bounded(bound_s) if bound_s else []
    if not root:
        return [*bound, "sh", "-c", script, name, *args]
    positional = " ".join(f'"${{{index}}}"' for index in range(2, len(args) + 2))
    sudo = " ".join(["sudo", "-n", *bound])
    return ["sh", "-c", f'exec {sudo} sh -c "$1" {name} {positional} "${{TMPDIR:-/tmp}}"', name, script, *args]


def node_timed_out(exit_code: Optional[int], duration_s: float, timeout: float) -> bool:
    """GNU timeout exits 124 (TERM worked) or 137 (needed KILL) once the time is up."""
    return exit_code in (124, 137) and duration_s >= timeout - 0.5


class Transport(ABC):
    """Runs commands on one node. Implementations: LocalTransport, runners.ssh.SshTransport.

    An unreachable outcome is kept as the node's `loss`: later commands fail at once with its
    time and reason instead of waiting for a connect timeout again, until the loss's next try
    is due; the command that finds it due tries the node. A node that answers again is used as
    before, and its loss is kept in `recovered`: a link that dropped is news for the report. So is
    a silence the node answered again after before it was lost (`blipped`, kept in `silences`);
    `came_back` gives both.
    """

    def __init__(self, node: Node):
        self.node = node
        # The inventory's launch: settings where Slurm starts multi-node jobs (runners.slurm).
        self.launch: Optional[LaunchSettings] = None
        self.loss: Optional[Loss] = None
        self.recovered: list[tuple[Loss, float]] = []  # (a loss, when the node answered again)
        self.silences = Silences()
        self._retrying = False  # a command is trying the lost node again; the others fail at once
        self._lease: Optional[Lease] = None
        self._running: dict[str, bool] = {}  # tag -> needs root to kill
        self._lock = threading.Lock()
        self._killing = threading.Lock()  # one kill at a time on the node (kill())
        self._closed = False  # by the session's end: a worker thread left behind must not connect again

    @property
    def may_answer(self) -> bool:
        """Whether a command now would reach for the node: it is not lost, or its next try is due."""
        loss = self.loss
        return loss is None or loss.due()

    def run(self, argv: Sequence[str], *, timeout: float, stdin: Optional[str] = None,
            root: bool = False, env: Optional[Mapping[str, str]] = None,
            label: Optional[str] = None, tag: Optional[str] = None) -> Result:
        """Run argv on the node; every element is passed as one word, never re-split by a shell.

        label is what messages call the command (default: the argv with long words shortened).
        tag marks what the command starts on the node (new_tag() gives one): a caller that may
        have to kill this command alone, while others of the node run on, passes its own to kill().
        """
        argv = [str(a) for a in argv]
        display = label or short_command(argv)
        if self._closed:
            return Result(self.node.name, display, None, "", "", 0.0, failure="error",
                          detail="the run closed its connection to the node; nothing more is started there")
        loss, trying = self._standing_loss()
        if loss is not None:
            return loss.result(self.node.name, display)
        try:
            result = self._reach(argv, display, timeout=timeout, stdin=stdin, root=root, env=env,
                                 tag=tag or new_tag())
        except BaseException:  # Ctrl-C mid-try: the next due command may try the node again
            if trying:
                self._retrying = False
            raise
        return self._tried_again(result) if trying else result

    def _reach(self, argv: list[str], display: str, *, timeout: float, stdin: Optional[str], root: bool,
               env: Optional[Mapping[str, str]], tag: str) -> Result:
        started = time.monotonic()
        try:
            lease = self._open()
        except Unavailable as exc:
            return self._noted(Result(self.node.name, display, None, "", "", time.monotonic() - started,
                                      failure=exc.failure, detail=exc.detail, full_command=shlex.join(argv)))
        root = root and self.node.sudo
        command = wrap(argv, tag=tag, lease=lease.tag, timeout=timeout, root=root, env=env)
        log.debug("%s: %s", self.node.name, shlex.join(command))
        with self._lock:
            self._running[tag] = root
        try:
            result = self._execute(lease, command, display=display, stdin=stdin, timeout=timeout)
            if result.timed_out or result.failure == "error":
                self.kill(tag, root=root)
            return self._noted(dataclasses.replace(result, full_command=shlex.join(argv)))
        except BaseException:
            # KeyboardInterrupt or a harness bug: the node must not keep running our work.
            self.kill(tag, root=root)
            raise
        finally:
            with self._lock:
                self._running.pop(tag, None)

    def run_script(self, script: str, args: Sequence[str] = (), *, timeout: float,
                   root: bool = False, label: Optional[str] = None) -> Result:
        """Ship a node-side Python payload through stdin and run it with the node's interpreter.

        Nothing is written on the node: the payload never touches its disk. Messages name the
        payload (runners.payloads gives its name), never show its text.
        """
        name = getattr(script, "name", None) or f"<script of {len(script.encode())} bytes>"
        display = label or " ".join(filter(None, [short_command([self.node.python, "-"]), name,
                                                  short_command(args)]))
        return self.run([self.node.python, "-", *args], timeout=timeout, stdin=script, root=root,
                        label=display)

    def kill_running(self) -> None:
        """Kill everything this transport has running on the node (used on Ctrl-C)."""
        with self._lock:
            running = dict(self._running)
        for tag, root in running.items():
            self.kill(tag, root=root)

    def kill(self, tag: str, *, root: bool = False) -> None:
        """Nothing of ours runs where no connection stands (the lease took care of it); don't wait.

        One kill at a time on a node: each takes a session of sshd's MaxSessions (10 by default),
        and where every rail of a pair runs at once (8 commands and the watchdog), two kills at
        once were one too many: the node refused the second, and its command ran on."""
        self._kill_on_node(tag, root=root)

    def _kill_on_node(self, tag: str, *, root: bool) -> Optional[Result]:
        """The node-side kill of what carries `tag` (kill()); None where no connection stands or
        it could not be asked. Best effort: the node-side timeout still bounds the work."""
        lease = self._lease
        if lease is None or not lease.standing:
            return None
        try:
            with self._killing:
                return self._execute(lease, kill_argv(tag, root=root), display="kill", stdin=None,
                                     timeout=KILL_WAIT_S)
        except Exception:
            return None

    def lose(self, reason: str) -> Loss:
        """Mark the node unreachable, once: the first time and reason are the ones kept."""
        with self._lock:
            if self.loss is None:
                self.loss = Loss(time.time(), reason, earlier=len(self.recovered))
                log.warning("%s unreachable: %s", self.node.name, reason)
            return self.loss

    def blipped(self, since: float, back: float, reason: str) -> None:
        """Record a silence of the node's link (time.time() of its last answer before, and of its
        first after) that it answered again after before the node was lost: the run goes on with
        it, and its record says that the link dropped."""
        with self._lock:
            self.silences.note(since, back, reason)
        log.warning("%s: no answer from %s to %s (%s); it answers again", self.node.name, clock(since),
                    clock(back), reason)

    def retriable_loss(self) -> Optional[Loss]:
        """The node's loss while a try of it is left (and the run has not closed the node): a sign
        of the node (`heard`) can bring that try forward."""
        loss = self.loss
        if self._closed or loss is None or loss.next_try is None:
            return None
        return loss

    def heard(self, loss: Loss) -> None:
        """The node's SSH port answered since `loss`: its next command tries it at once, rather
        than at the loss's next try. A try that came first has made it another loss."""
        with self._lock:
            if self.loss is not loss:
                return
            self.loss = dataclasses.replace(loss, heard_at=time.time())
        log.warning("%s: its SSH port answers again; its next command tries it", self.node.name)

    def came_back(self) -> list[tuple[Loss, float]]:
        """Every loss and silence the node answered again after, with when it did."""
        with self._lock:
            return self.recovered + self.silences.entries()

    def _noted(self, result: Result) -> Result:
        if result.failure == "unreachable":
            self.lose(result.detail)
        return result

    def _standing_loss(self) -> tuple[Optional[Loss], bool]:
        """The loss this command fails with at once (None where the node answers), and whether
        this command is the one to try the lost node again: its next try is due (one at a time)."""
        with self._lock:
            loss = self.loss
            if loss is None:
                return None, False
            if self._retrying or not loss.due():
                return loss, False
            self._retrying = True
        log.warning("%s: trying again, lost at %s (%s)", self.node.name, loss.clock, loss.reason)
        return None, True

    def _tried_again(self, result: Result) -> Result:
        """Settle a try of a lost node: back where the command got an answer of the node's own
        (whatever its exit status), still lost where it did not; then the command's result reads
        as the loss's (the try's own failure is in the log)."""
        with self._lock:
            self._retrying = False
            loss = self.loss
            if loss is None:
                return result
            if result.not_reached:
                self.loss = loss.tried(time.time())
                next_try = self.loss.next_try
                log.warning("%s: still unreachable (%s); %s", self.node.name, result.detail,
                            f"next try at {clock(next_try)}" if next_try else "not tried again")
                return dataclasses.replace(result, detail=loss.result(result.node, result.command).detail)
            self.loss = None
            self.recovered.append((loss, time.time()))
        log.warning("%s answers again (lost at %s: %s)", self.node.name, loss.clock, loss.reason)
        return result

    @abstractmethod
    def _open(self) -> Lease:
        """The lease of the connection commands go through, connecting first where needed;
        raises Unavailable when there is none to be had."""

    @abstractmethod
    def _execute(self, lease: Lease, command: list[str], *, display: str, stdin: Optional[str],
                 timeout: float) -> Result:
        """Run an already wrapped argv; return a Result, never raise for node-side trouble."""

    def close(self) -> None:
        """Release the node's connection for good; its lease kills whatever of ours still runs there."""
        self._closed = True
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.close()


class LocalLease(Lease):
    """The watchdog as a child process: its stdin ends when the harness does, however it dies."""

    def __init__(self, tag: str, *, root: bool):
        super().__init__(tag)
        self._process = subprocess.Popen(
            lease_argv(tag, patience_s=0, root=root), stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=LEASE_END_S)  # the lease gives TERM its grace first
        except subprocess.TimeoutExpired:
            pass


class LocalTransport(Transport):
    """This machine, through subprocess; needs no SSH library."""

    def _open(self) -> Lease:
        with self._lock:
            if self._lease is None:
                try:
                    self._lease = LocalLease(new_tag(), root=self.node.sudo)
                except OSError as exc:
                    raise Unavailable("error", f"cannot start the watchdog: {exc}") from None
            return self._lease

    def _execute(self, lease, command, *, display, stdin, timeout):
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                env={**os.environ, "PATH": with_system_dirs(os.environ.get("PATH", os.defpath))},
                text=True, errors="replace")
        except OSError as exc:
            return Result(self.node.name, display, None, "", "", time.monotonic() - started,
                          failure="error", detail=str(exc))
        try:
            stdout, stderr = proc.communicate(stdin, timeout=timeout + HARNESS_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            stdout, stderr = proc.communicate()
            return Result(self.node.name, display, None, stdout, stderr,
                          time.monotonic() - started, timed_out=True)
        except BaseException:
            _kill_group(proc.pid)
            raise
        duration = time.monotonic() - started
        return Result(self.node.name, display, proc.returncode, stdout, stderr, duration,
                      timed_out=node_timed_out(proc.returncode, duration, timeout))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, 9)
    except ProcessLookupError:
        pass


def make_transport(node: Node) -> Transport:
    """The transport the inventory asks for; the SSH libraries load only when needed."""
    if node.transport == "local":
        return LocalTransport(node)
    from runners.ssh import SshTransport

    return SshTransport(node)
