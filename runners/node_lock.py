"""Node locks: one acceptance run at a time on a node, and a second one told which run is there.

Two runs on one node slow each other's figures into failures, so a run locks every node it
tests before any check runs there. The lock is flock(1) on a file in /dev/shm, held by a small
shell process that the run starts through its transport and that lives as long as the run:

- /dev/shm is a tmpfs on every Linux node: the lock writes nothing to a customer's disks, cannot
  outlive a reboot, and needs no clean-up (the lock is the open file, not the file).
- The holder writes a heartbeat byte down its own session every second. When the run ends, even
  by SIGKILL of the harness, that SSH channel (or pipe) goes away, the next write kills the holder
  with SIGPIPE, and the kernel drops the lock with it: locks end with their run.
- The file says who holds it (run id, start, harness host), so a refused run can say who.

Nodes that share one /dev/shm (containers or network namespaces on one host, as the harness's own
test nodes do) are told apart by their network namespace, which names the lock file.
The shell text is fixed; every value reaches it as a positional argument.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

from runners.fanout import fan_out
from runners.transport import Result, Transport

LOCK_DIR = "/dev/shm"
HOLD_S = 7 * 24 * 3600  # the node-side bound on a holder; its heartbeat ends it with the run
BUSY_WAIT_S = 300  # --busy-nodes wait: how long a run waits for another to end on a node
SETTLE_S = 30  # beyond any wait: time for a holder to connect, start and say it has the lock
PROBE_EVERY_S = 0.2
RELEASE_JOIN_S = 15
EXIT_BUSY = 75  # EX_TEMPFAIL: another run holds the lock

_LOCK_FILE = 'lock="$1/handover-node-$(readlink /proc/self/ns/net 2>/dev/null | tr -dc 0-9).lock"\n'

# $1 lock dir, $2 what the lock file says, $3 seconds to wait for the lock (0: do not wait).
_HOLD = _LOCK_FILE + r"""
command -v flock >/dev/null 2>&1 || { echo "flock(1) is not installed on the node" >&2; exit 69; }
umask 0
exec 9<>"$lock"
if [ "$3" -gt 0 ]; then flock -w "$3" 9; else flock -n 9; fi || { cat "$lock"; exit 75; }
printf '%s %s\n' "$$" "$2" > "$lock"
while printf .; do sleep 1 9>&-; done
"""

# $1 lock dir: who says they hold the lock.
_SHOW = _LOCK_FILE + r"""
cat "$lock" 2>/dev/null
exit 0
"""

# $1 lock dir, $2 the run's token: end our holder, never another run's.
_RELEASE = _LOCK_FILE + r"""
read -r pid owner < "$lock" 2>/dev/null || exit 0
case "$owner" in *"$2"*) kill "$pid" 2>/dev/null ;; esac
exit 0
"""


@dataclass(frozen=True)
class Owner:
    """The run a lock belongs to, as the lock file says it."""

    run_id: str
    started: str
    host: str
    token: str  # this process's, so a resumed run's old holder is not taken for its own

    def describe(self) -> str:
        return f"run {self.run_id} (started {self.started}, from host {self.host})"

    @classmethod
    def parse(cls, text: str) -> Optional["Owner"]:
        """The owner in a lock file's 'PID JSON' line; None for an empty or foreign file."""
        try:
            fields = json.loads(text.strip().partition(" ")[2])
            return cls(**{name: str(fields[name]) for name in ("run_id", "started", "host", "token")})
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class NodeLock:
    """How taking one node's lock went: held, busy (another run has it) or unlocked (could not
    tell: the node did not answer, or it has no flock)."""

    node: str
    state: str
    owner: Optional[Owner] = None  # busy: the run that holds it
    detail: str = ""  # unlocked: why

    def describe(self) -> str:
        if self.state == "busy":
            holder = self.owner.describe() if self.owner else "another run (not yet named in its lock file)"
            return f"{self.node} is in use by {holder}"
        if self.state == "unlocked":
            return f"{self.node} not locked: {self.detail}"
        return f"{self.node} locked"


def lock_argv(script: str, *args: str) -> list[str]:
    return ["sh", "-c", script, "handover-node-lock", LOCK_DIR, *args]


class NodeLocks:
    """The locks one run holds: taken on every node at once, released at the end of the run."""

    def __init__(self, owner: Owner, transports: Mapping[str, Transport]):
        self.owner = owner
        self.transports = dict(transports)
        self._threads: dict[str, threading.Thread] = {}
        self._ended: dict[str, Result] = {}  # node -> its holder's result, once it ended

    def take(self, wait_s: float = 0) -> dict[str, NodeLock]:
        """Start a holder on every node; {node: NodeLock} once each holds, is refused or gave up.

        wait_s > 0 waits that long for another run's lock to go before the node is refused.
        """
        content = json.dumps(asdict(self.owner))
        self._ended.clear()
        # One look first connects every node: one that does not answer costs one connect timeout
        # here, not one per round, and gets no holder.
        taken = {node: NodeLock(node, "unlocked", detail=result.explain())
                 for node, result in self._show(self.transports).items() if not result.ok}
        for node, transport in self.transports.items():
            if node not in taken:
                thread = threading.Thread(target=self._hold, args=(node, transport, content, wait_s),
                                          name=f"node-lock-{node}", daemon=True)
                self._threads[node] = thread
                thread.start()
        deadline = time.monotonic() + wait_s + SETTLE_S
        while len(taken) < len(self.transports):
            for node, result in list(self._ended.items()):
                if node not in taken:
                    taken[node] = _refused(node, result)
            pending = {n: t for n, t in self.transports.items() if n not in taken}
            if not pending:
                break
            for node, shown in self._show(pending).items():
                if node not in self._ended and Owner.parse(shown.stdout) == self.owner:
                    taken[node] = NodeLock(node, "held")
            if time.monotonic() > deadline:
                for node in pending:
                    taken.setdefault(node, NodeLock(node, "unlocked",
                                                    detail=f"its lock holder said nothing within "
                                                           f"{wait_s + SETTLE_S:.0f} s"))
                break
            time.sleep(PROBE_EVERY_S)
        return {node: taken[node] for node in self.transports}

    def release(self) -> None:
        """End this run's holders (the lock goes with them) and wait for their sessions to close."""
        if self._threads:
            fan_out({node: self.transports[node] for node in self._threads},
                    lambda t: t.run(lock_argv(_RELEASE, self.owner.token), timeout=15), name="node unlock")
        deadline = time.monotonic() + RELEASE_JOIN_S
        for thread in self._threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    @staticmethod
    def _show(transports: Mapping[str, Transport]) -> dict[str, Result]:
        """What each node's lock file says (who holds the lock)."""
        return fan_out(transports, lambda t: t.run(lock_argv(_SHOW), timeout=15), name="node lock")

    def _hold(self, node: str, transport: Transport, content: str, wait_s: float) -> None:
        self._ended[node] = transport.run(lock_argv(_HOLD, content, str(int(wait_s))), timeout=HOLD_S)


def _refused(node: str, result: Result) -> NodeLock:
    """A holder that ended before it held the lock: another run has it, or it could not run."""
    if result.exit_code == EXIT_BUSY:
        return NodeLock(node, "busy", owner=Owner.parse(result.stdout))
    return NodeLock(node, "unlocked", detail=result.explain())
