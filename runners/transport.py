"""One small transport interface: run an argv (or ship a Python payload) on one node.

Every command is wrapped so that it cannot outlive its welcome on the node:

    env HANDOVER_TAG=<tag> timeout -k 5 <seconds> <argv...>

GNU ``timeout`` makes itself a process-group leader and signals the whole group when time is
up, so a run timeout holds on the node even if the harness dies. The tag is inherited by every
descendant, so ``kill()`` finds them all through /proc/*/environ, including processes that
started a new session, when the harness times out or is interrupted first.
"""
from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from inventory.model import Node

TAG_VARIABLE = "HANDOVER_TAG"
KILL_GRACE_S = 5  # TERM first, KILL this much later
HARNESS_GRACE_S = KILL_GRACE_S + 10  # how long the harness waits beyond the node-side timeout

# Fixed text: the only interpolation is a tag made of hex digits, and it is quoted anyway.
_KILL_SCRIPT = r"""
tagged() { grep -lsxz "$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
pids=$(tagged "$1"); [ -z "$pids" ] && exit 0
kill -TERM $pids 2>/dev/null; sleep 1
pids=$(tagged "$1"); [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
exit 0
"""


@dataclass(frozen=True)
class Result:
    """What one command on one node gave, whatever happened: a dead node is data, not an exception."""

    node: str
    command: str  # the argv as the operator would type it, without the harness's wrapper
    exit_code: Optional[int]  # None when the command never ran or never finished
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    failure: Optional[str] = None  # transport-level: 'unreachable', 'auth', 'host-key', 'error'
    detail: str = ""  # the transport's one-line explanation of a failure

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.failure is None

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
            last = (self.stderr.strip().splitlines() or [""])[-1]
            return f"{self.node}: `{self.command}` exited {self.exit_code}: {last}"
        return f"{self.node}: ok"


def new_tag() -> str:
    return secrets.token_hex(8)


def wrap(argv: Sequence[str], *, tag: str, timeout: float, root: bool,
         env: Optional[Mapping[str, str]] = None) -> list[str]:
    """The argv the node actually runs: tagged, bounded by a node-side timeout, maybe via sudo."""
    seconds = max(1, int(round(timeout)))
    assignments = [f"{TAG_VARIABLE}={tag}"] + [f"{k}={v}" for k, v in (env or {}).items()]
    wrapped = ["env", *assignments, "timeout", "-k", str(KILL_GRACE_S), str(seconds), *argv]
    return ["sudo", "-n", *wrapped] if root else wrapped


def kill_argv(tag: str, *, root: bool) -> list[str]:
    argv = ["sh", "-c", _KILL_SCRIPT, "handover-kill", f"{TAG_VARIABLE}={tag}"]
    return ["sudo", "-n", *argv] if root else argv


def node_timed_out(exit_code: Optional[int], duration_s: float, timeout: float) -> bool:
    """GNU timeout exits 124 (TERM worked) or 137 (needed KILL) once the time is up."""
    return exit_code in (124, 137) and duration_s >= timeout - 0.5


class Transport(ABC):
    """Runs commands on one node. Implementations: LocalTransport, runners.ssh.SshTransport."""

    def __init__(self, node: Node):
        self.node = node
        self._running: dict[str, bool] = {}  # tag -> needs root to kill
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], *, timeout: float, stdin: Optional[str] = None,
            root: bool = False, env: Optional[Mapping[str, str]] = None) -> Result:
        """Run argv on the node; every element is passed as one word, never re-split by a shell."""
        argv = [str(a) for a in argv]
        tag = new_tag()
        root = root and self.node.sudo
        command = wrap(argv, tag=tag, timeout=timeout, root=root, env=env)
        with self._lock:
            self._running[tag] = root
        try:
            result = self._execute(command, display=shlex.join(argv), stdin=stdin, timeout=timeout)
            if result.timed_out or result.failure == "error":
                self.kill(tag, root=root)
            return result
        except BaseException:
            # KeyboardInterrupt or a harness bug: the node must not keep running our work.
            self.kill(tag, root=root)
            raise
        finally:
            with self._lock:
                self._running.pop(tag, None)

    def run_script(self, script: str, args: Sequence[str] = (), *, timeout: float,
                   root: bool = False) -> Result:
        """Ship a node-side Python payload through stdin and run it with the node's interpreter.

        Nothing is written on the node: the payload never touches its disk.
        """
        return self.run([self.node.python, "-", *args], timeout=timeout, stdin=script, root=root)

    def kill_running(self) -> None:
        """Kill everything this transport has running on the node (used on Ctrl-C)."""
        with self._lock:
            running = dict(self._running)
        for tag, root in running.items():
            self.kill(tag, root=root)

    def kill(self, tag: str, *, root: bool = False) -> None:
        try:
            self._execute(kill_argv(tag, root=root), display="kill", stdin=None, timeout=15)
        except Exception:  # best effort: the node-side timeout still bounds the work
            pass

    @abstractmethod
    def _execute(self, command: list[str], *, display: str, stdin: Optional[str],
                 timeout: float) -> Result:
        """Run an already wrapped argv; return a Result, never raise for node-side trouble."""

    @abstractmethod
    def close(self) -> None:
        """Release the node's connections."""


class LocalTransport(Transport):
    """This machine, through subprocess; needs no SSH library."""

    def close(self) -> None:
        """Nothing to release: every command is its own process."""

    def _execute(self, command, *, display, stdin, timeout):
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
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
