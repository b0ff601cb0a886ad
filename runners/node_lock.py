"""Node locks: one acceptance run at a time on a node, and a second one told which run is there.

Two runs on one node slow each other's figures into failures, so a run locks every node it
tests before any check runs there. The lock is flock(1) on a file in /dev/shm, held by a small
shell process that the run starts through its transport and that lives as long as the run:

- /dev/shm is a tmpfs on every Linux node: the lock writes nothing to a customer's disks, cannot
  outlive a reboot, and needs no clean-up (the lock is the open file, not the file).
- Taking it is one short command per node, which leaves a background holder behind: a quiet
  subshell that keeps the lock's file open. It carries the run's lease tag (runners.transport),
  so when the run ends, even by SIGKILL of the harness, the node-side watchdog of the run's
  connection kills it and the kernel drops the lock: locks end with their run. A holder costs
  the harness nothing while it holds: no channel, no heartbeat of its own.
- The file says who holds it (run id, start, harness host), so a refused run can say who.

Nodes that share one /dev/shm (containers or network namespaces on one host, as the harness's own
test nodes do) are told apart by their network namespace, which names the lock file.
The shell text is fixed; every value reaches it as a positional argument.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

from runners.fanout import fan_out
from runners.transport import Result, Transport

LOCK_DIR = "/dev/shm"
HOLD_S = 7 * 24 * 3600  # the node-side bound on a holder; the run's watchdog ends it with the run
BUSY_WAIT_S = 300  # --busy-nodes wait: how long a run waits for another to end on a node
SETTLE_S = 30  # beyond any wait: time to connect and take the lock
EXIT_BUSY = 75  # EX_TEMPFAIL: another run holds the lock

_LOCK_FILE = 'lock="$1/handover-node-$(readlink /proc/self/ns/net 2>/dev/null | tr -dc 0-9).lock"\n'

# $1 lock dir, $2 what the lock file says, $3 seconds to wait for the lock (0: do not wait),
# $4 seconds the holder may hold it at most. The holder (the subshell) keeps the lock file open;
# its sleeps do not, so killing the holder frees the lock at once, and its last sleep ends
# within a second.
_TAKE = _LOCK_FILE + r"""
command -v flock >/dev/null 2>&1 || { echo "flock(1) is not installed on the node" >&2; exit 69; }
umask 0
exec 9<>"$lock"
if [ "$3" -gt 0 ]; then flock -w "$3" 9; else flock -n 9; fi || { cat "$lock"; exit 75; }
( held=0; while [ "$held" -lt "$4" ]; do sleep 1 9>&-; held=$((held + 1)); done ) </dev/null >/dev/null 2>&1 &
printf '%s %s\n' "$!" "$2" > "$lock"
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
        self._held: list[str] = []

    def take(self, wait_s: float = 0) -> dict[str, NodeLock]:
        """Take every node's lock at once; {node: NodeLock}, held, busy or unlocked.

        wait_s > 0 waits that long for another run's lock to go before the node is refused.
        """
        content = json.dumps(asdict(self.owner))
        argv = lock_argv(_TAKE, content, str(int(wait_s)), str(HOLD_S))
        taken = {node: _taken(node, result) for node, result in
                 fan_out(self.transports, lambda t: t.run(argv, timeout=wait_s + SETTLE_S), name="node lock").items()}
        self._held = [node for node, lock in taken.items() if lock.state == "held"]
        return taken

    def release(self) -> None:
        """End this run's holders (the lock goes with them) before the connections close, so a
        run started right after this one finds the nodes free."""
        if self._held:
            fan_out({node: self.transports[node] for node in self._held},
                    lambda t: t.run(lock_argv(_RELEASE, self.owner.token), timeout=15), name="node unlock")
        self._held = []


def _taken(node: str, result: Result) -> NodeLock:
    """held; busy when another run has the lock; unlocked when the node could not tell."""
    if result.ok:
        return NodeLock(node, "held")
    if result.exit_code == EXIT_BUSY:
        return NodeLock(node, "busy", owner=Owner.parse(result.stdout))
    return NodeLock(node, "unlocked", detail=result.explain())
