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

A soak (runners/soak.py) loads a node for hours after its harness has gone; its node-side
supervisor holds a soak lock of its own beside this one. Taking the node lock looks at that one
too: while a soak's load runs (before its end time), the node is busy with the soak, except for the
harness run that re-attaches to that very soak. A soak past its end time that only keeps its
samples for collection does not hold the node.

Nodes that share one /dev/shm (containers or network namespaces on one host, as the harness's own
test nodes do) are told apart by their network namespace, which names the lock files.
The shell text is fixed; every value reaches it as a positional argument.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

from runners.fanout import fan_out
from runners.transport import Result, Transport

LOCK_DIR = "/dev/shm"
HOLD_S = 7 * 24 * 3600  # the node-side bound on a holder; the run's watchdog ends it with the run
BUSY_WAIT_S = 300  # --busy-nodes wait: how long a run waits for another to end on a node
SETTLE_S = 30  # beyond any wait: time to connect and take the lock
EXIT_BUSY = 75  # EX_TEMPFAIL: another run holds the lock
SOAK_BUSY = "soak "  # a busy node's answer starts so when a soak's load runs there

_LOCK_FILE = r"""namespace=$(readlink /proc/self/ns/net 2>/dev/null | tr -dc 0-9)
lock="$1/handover-node-$namespace.lock"
"""

# $1 lock dir, $2 what the lock file says, $3 seconds to wait for the lock (0: do not wait),
# $4 seconds the holder may hold it at most, $5 the soak this run re-attaches to ('' for none).
# A soak's supervisor holds its lock file (soak_supervisor.py) exclusively, so a shared flock of
# it fails while the soak lives; its JSON says until when its load runs. The holder (the subshell)
# keeps the node's lock file open; its sleeps do not, so killing the holder frees the lock at
# once, and its last sleep ends within a second.
_TAKE = _LOCK_FILE + r"""
command -v flock >/dev/null 2>&1 || { echo "flock(1) is not installed on the node" >&2; exit 69; }
umask 0
exec 9<>"$lock"
if [ "$3" -gt 0 ]; then flock -w "$3" 9; else flock -n 9; fi || { cat "$lock"; exit 75; }
soak="$1/handover-soak-$namespace.lock"
if [ -s "$soak" ] && ! flock -n -s "$soak" true 2>/dev/null; then
  soak_id=$(sed -n 's/.*"soak_id": *"\([^"]*\)".*/\1/p' "$soak")
  soak_end=$(sed -n 's/.*"end": *\([0-9][0-9]*\).*/\1/p' "$soak")
  if [ "$soak_id" != "$5" ] && [ "${soak_end:-0}" -gt "$(date +%s)" ]; then printf 'soak '; cat "$soak"; exit 75; fi
fi
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
class SoakHolder:
    """The soak whose node-side supervisor holds a node, as its soak lock file says it."""

    soak_id: str
    run_dir: Optional[str]  # the harness's run directory, as that harness named it
    end: float  # when its load ends (epoch seconds)
    pid: int

    def describe(self) -> str:
        until = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.end))
        return f"soak {self.soak_id} of {self.run_dir or 'another harness'}, until {until} (supervisor pid {self.pid})"

    @classmethod
    def parse(cls, text: str) -> Optional["SoakHolder"]:
        """The holder in a soak lock file's JSON; None for an empty or foreign file."""
        try:
            fields = json.loads(text)
            return cls(str(fields["soak_id"]), fields.get("run_dir"), float(fields["end"]), int(fields["pid"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class NodeLock:
    """How taking one node's lock went: held, busy (another run or a soak has it) or unlocked
    (could not tell: the node did not answer, or it has no flock)."""

    node: str
    state: str
    owner: Optional[Owner] = None  # busy: the run that holds it
    soak: Optional[SoakHolder] = None  # busy: the soak whose load runs there
    detail: str = ""  # unlocked: why
    not_reached: bool = False  # unlocked: the node was never reached, so nothing is tested there either

    def describe(self) -> str:
        if self.state == "busy" and self.soak is not None:
            return f"{self.node} is in use by {self.soak.describe()}"
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

    def take(self, wait_s: float = 0, soak_id: str = "") -> dict[str, NodeLock]:
        """Take every node's lock at once; {node: NodeLock}, held, busy or unlocked.

        wait_s > 0 waits that long for another run's lock to go before the node is refused (a
        soak's end time is known: it is not waited for). soak_id: the soak this run re-attaches
        to, whose load does not make a node busy for it.
        """
        content = json.dumps(asdict(self.owner))
        argv = lock_argv(_TAKE, content, str(int(wait_s)), str(HOLD_S), soak_id)
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
    if result.exit_code == EXIT_BUSY and result.stdout.startswith(SOAK_BUSY):
        return NodeLock(node, "busy", soak=SoakHolder.parse(result.stdout.removeprefix(SOAK_BUSY)))
    if result.exit_code == EXIT_BUSY:
        return NodeLock(node, "busy", owner=Owner.parse(result.stdout))
    return NodeLock(node, "unlocked", detail=result.explain(), not_reached=result.not_reached)
