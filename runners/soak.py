"""The soak: a burn-in of hours on every node at once, run by a node-side supervisor that outlives
the harness (runners/payloads/soak_supervisor.py), polled, re-attached and judged from its samples.

The harness starts the supervisor on every node at once through the transport, then polls: each
node's new sample lines are appended to the run directory's raw/soak/<node>.jsonl as they come.
The run directory's soak.json holds the plan (soak id, tag, end, each node's folder and peer), so
a harness killed mid-soak re-attaches by reading it and carrying on from what raw/ already has.
A node that stops answering is polled again with a fresh connection; one silent for DROP_GRACE_S
once the end has passed is named as dropped out. Everything about a node's samples is decided by
the pure functions at the end of this module, from the lines alone.

Under Slurm (`transport: slurm`) a step's processes end with the step, and the run's allocation
with the harness: there the supervisors are the tasks of a batch job of the soak's own
(submit_job, batch_script), which outlives the harness as a detached process does over SSH, and
the harness's commands to them are steps of that job.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import re
import secrets
import shlex
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from inventory.model import (
    SOAK_MIX_COUNTS,
    SOAK_MIX_DEFAULTS,
    SOAK_MIX_SECONDS,
    LaunchSettings,
    Node,
    ScratchPath,
    soak_mix_problem,
)
from reports.files import write_atomically
from runners.burn import FAILING_REASONS, decode_reasons, majority_digest
from runners.fanout import Progress, close_everywhere, fan_out
from runners.ibstat import LINK_COUNTER_CEILINGS
from runners.launchers import JOB_PREFIX, SRUN, job_options, minutes_for
from runners.node_lock import SoakHolder
from runners.parsing import ParseError
from runners.payloads import load
from runners.slurm import SCANCEL, SlurmError, SlurmSteps, SlurmTransport, client, job_state, node_states
from runners.transport import Result, Transport, kill_argv, make_transport

SOAK_FILE = "soak.json"
RAW_STEP = "soak"
PORT = 5399  # the supervisors' iperf3 server
IB_PORT = 5400  # rail i's ib_write_bw server listens on IB_PORT + i
ROUND_KEYS = {"gpu": "gpu_round_s"}  # a load part's round length in the mix; the others' is round_s
# How late a round may end past its length, and a busy peer be retried, on the supervisor's side
# (soak_supervisor.py's ROUND_GRACE_S and RETRY_FOR_S).
ROUND_SLACK_S = 20 + 60
POLL_S = 5.0
START_TIMEOUT_S = 60
COMMAND_TIMEOUT_S = 30
COLLECT_LIMIT = 8 * 2**20  # bytes of new samples one poll takes from a node; the rest comes next poll
LINGER_S = 24 * 3600  # a supervisor keeps its samples this long after the end for the harness
# How long a node must have been silent, once the end has passed, before it dropped out: one that
# went quiet just before the end has this long to come back with its last samples; one silent for
# longer already is named at the end.
DROP_GRACE_S = 60
STOP_WAIT_S = 30  # --soak-stop: how long each supervisor has to end and clean up
EXIT_NO_SOAK = 3
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_S = 30 * 86400  # burn-in contracts ask for 24-72 h; a typo's 99999999d would hold the nodes for good
STATUS_PREFIX = "handover-soak: "

# $1 the node's soak folder, $2 the payload's interpreter, $3 the config; the payload on stdin.
# A supervisor that does not start (another soak holds the node) leaves no folder behind.
_START = r"""
mkdir -p "$1" && cat > "$1/soak_supervisor.py" || exit 1
"$2" "$1/soak_supervisor.py" start "$3"; rc=$?
[ "$rc" -eq 0 ] || rm -rf "$1"
exit "$rc"
"""
# $1 folder, $2 byte offset already collected: the supervisor's state on stderr, new lines on stdout.
_COLLECT = r"""
[ -d "$1" ] || { echo "handover-soak: no-soak" >&2; exit 3; }
pid=$(cat "$1/pid" 2>/dev/null)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "handover-soak: alive $pid" >&2
else echo "handover-soak: gone" >&2; fi
tail -c +"$(($2 + 1))" "$1/samples.jsonl" 2>/dev/null | head -c "$3"
"""
# $1 folder, $2 the file that tells the supervisor: stop (end now) or collected (clean up).
_TELL = r"""[ -d "$1" ] || exit 3; : > "$1/$2"
"""


class SoakError(Exception):
    """An option or a soak file the harness cannot use; str() is the one line to show."""


def parse_duration(text: str, option: str = "--soak-duration") -> float:
    """'90s', '30m', '24h', '2d' in seconds; anything else is one line naming the option."""
    match = DURATION.match(str(text).strip())
    if not match or float(match.group(1)) <= 0:
        raise SoakError(f"{option} {text!r}: a positive number and a unit, s, m, h or d (90s, 30m, 24h)")
    seconds = float(match.group(1)) * UNIT_S[match.group(2)]
    if seconds > MAX_DURATION_S:
        raise SoakError(f"{option} {text!r}: at most {MAX_DURATION_S // 86400}d: a soak's load holds its nodes "
                        "until it ends, whether or not a harness comes back for it")
    return seconds


def parse_mix(text: Optional[str], profile_mix: Optional[dict] = None) -> dict[str, object]:
    """--soak-mix 'cpu_workers=1,cpu_load=10,vm_workers=0,net_rate=20M' over the profile's `soak:`
    over the defaults (inventory.model.SOAK_MIX_DEFAULTS)."""
    mix = {**SOAK_MIX_DEFAULTS, **(profile_mix or {})}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, _, value = item.partition("=")
        if key not in SOAK_MIX_DEFAULTS or not value:
            raise SoakError(f"--soak-mix {item!r}: KEY=VALUE with KEY one of {', '.join(SOAK_MIX_DEFAULTS)}")
        if key in SOAK_MIX_COUNTS + SOAK_MIX_SECONDS:
            try:
                mix[key] = float(value) if key in SOAK_MIX_SECONDS else int(value)
            except ValueError:
                raise SoakError(f"--soak-mix {item!r}: {key} takes a number") from None
        else:
            mix[key] = value
        problem = soak_mix_problem(key, mix[key])
        if problem:
            raise SoakError(f"--soak-mix {item!r}: {key}: {problem}")
    return mix


def too_short(duration_s: float, mix: Mapping[str, object], option: str = "--soak-duration",
              gpus: bool = False) -> Optional[str]:
    """Why a soak of duration_s could not be judged, or None: each load part's first rounds are
    compared with its last (drift), which takes two rounds, and a last round shorter than half a
    round is not run, so two whole ones; where the nodes have GPUs (`gpus`), two GPU burn rounds
    too, whose figure the GPU profiles' soak_gpu_retained band judges."""
    rounds = [("load rounds", "round_s")]
    if gpus and int(mix.get("gpu", 1)):  # type: ignore[call-overload]
        rounds.append(("GPU burn rounds", ROUND_KEYS["gpu"]))
    for what, key in rounds:
        round_s = float(mix[key])  # type: ignore[arg-type]
        if duration_s < 2 * round_s:
            return (f"{option} {duration_s:g}s is shorter than two {what} ({key}={round_s:g}), and a soak "
                    f"is judged by its first rounds against its last: give at least {math.ceil(2 * round_s)}s, "
                    f"or a smaller {key} in --soak-mix")
    return None


# ---------------------------------------------------------------------------------------------
# The plan, kept in the run directory


@dataclass(frozen=True)
class NodePlan:
    dir: str  # the node's soak folder, inside a declared scratch path
    peer: Optional[str] = None  # the node its iperf3 client sends to
    peer_address: Optional[str] = None
    io_dir: Optional[str] = None  # its fio folder on the first shared scratch path; None without one


@dataclass
class SoakPlan:
    soak_id: str
    tag: str  # every process of the soak carries HANDOVER_TAG=<tag>: --soak-stop's last resort
    started: float
    end: float
    mix: dict
    nodes: dict[str, NodePlan]
    refused: dict[str, str] = field(default_factory=dict)  # node -> why it runs no soak
    slurm_job: Optional[str] = None  # under Slurm: the soak's batch job, which holds its supervisors
    collected: bool = False  # every node's samples are in the run directory
    stopped: bool = False  # --soak-stop ended it

    @property
    def duration_s(self) -> float:
        return self.end - self.started

    @property
    def interval_s(self) -> float:
        return float(self.mix["interval_s"])  # type: ignore[arg-type]

    def save(self, run_dir: Path) -> None:
        data = asdict(self)
        write_atomically(run_dir / SOAK_FILE, json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> "SoakPlan":
        path = Path(run_dir) / SOAK_FILE
        try:
            data = json.loads(path.read_text())
            data["nodes"] = {name: NodePlan(**entry) for name, entry in data["nodes"].items()}
            return cls(**data)
        except (FileNotFoundError, NotADirectoryError):
            raise SoakError(f"{path}: no such file; {run_dir} is not a soak's run directory") from None
        except OSError as error:
            raise SoakError(f"{path}: cannot read: [Errno {error.errno}] {error.strerror}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise SoakError(f"{path}: not a soak plan ({error})") from None


def new_plan(nodes: Sequence[Node], scratch: Sequence[ScratchPath], duration_s: float,
             mix: dict) -> SoakPlan:
    """Every node's folder in the first local scratch path, its fio folder in the first shared
    one (when declared), and a ring of iperf3 peers."""
    local = next((entry.path for entry in scratch if entry.kind == "local"), None)
    shared = next((entry.path for entry in scratch if entry.kind == "shared"), None)
    soak_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    started = time.time()
    plans, refused = {}, {}
    for index, node in enumerate(nodes):
        if local is None:
            refused[node.name] = "no local scratch path declared: the soak keeps its samples only there"
            continue
        peer = nodes[(index + 1) % len(nodes)] if len(nodes) > 1 else None
        plans[node.name] = NodePlan(
            dir=f"{local.rstrip('/')}/handover-soak-{soak_id}-{node.name}", peer=peer.name if peer else None,
            peer_address=(peer.data_address or peer.address) if peer else None,
            io_dir=f"{shared.rstrip('/')}/handover-soak-{soak_id}-{node.name}" if shared else None)
    return SoakPlan(soak_id, secrets.token_hex(8), started, started + duration_s, mix, plans, refused)


def unfinished_soak(out: Path, cluster: str, inventory_sha256: str) -> Optional[Path]:
    """The newest run directory of `cluster` under `out` whose soak, started from this inventory,
    has not been collected or stopped: re-running the same command attaches to it."""
    base = Path(out) / cluster
    for plan_file in sorted(base.glob(f"*/{SOAK_FILE}"), reverse=True):
        try:
            plan = SoakPlan.load(plan_file.parent)
            header = json.loads((plan_file.parent / "ledger.jsonl").open().readline())
        except (SoakError, OSError, ValueError):
            continue
        if plan.collected or plan.stopped or time.time() > plan.end + LINGER_S:
            continue
        if (header.get("inventory") or {}).get("sha256") == inventory_sha256:
            return plan_file.parent.resolve()
    return None


# ---------------------------------------------------------------------------------------------
# Node commands


def supervisor_config(plan: SoakPlan, name: str, run_dir: Path, linger_s: float) -> dict:
    """What node `name`'s supervisor is told (soak_supervisor.py's CONFIG_JSON). linger_s: how
    long after the end it keeps its samples, uncollected, before it removes them."""
    node = plan.nodes[name]
    return {"soak_id": plan.soak_id, "tag": plan.tag, "node": name, "dir": node.dir,
            "end": plan.end, "interval_s": plan.interval_s, "linger_s": linger_s, "mix": plan.mix,
            "peer": node.peer, "peer_address": node.peer_address, "port": PORT if len(plan.nodes) > 1 else None,
            "ib_port": IB_PORT if len(plan.nodes) > 1 else None, "io_dir": node.io_dir,
            "run_dir": str(run_dir)}


def start(transport: Transport, plan: SoakPlan, run_dir: Path, linger_s: float = LINGER_S) -> Result:
    """Start the supervisor on one node (exit 75 and the holder's JSON: another soak is there)."""
    node = plan.nodes[transport.node.name]
    config = supervisor_config(plan, transport.node.name, run_dir, linger_s)
    if int(plan.mix.get("gpu", 1)):  # beside the supervisor, which runs it in rounds where GPUs are
        shipped = transport.run(["sh", "-c", 'mkdir -p "$1" && cat > "$1/gpu_burn.py"', "handover-soak", node.dir],
                                timeout=COMMAND_TIMEOUT_S, stdin=load("gpu_burn"), label="soak: ship gpu_burn")
        if not shipped.ok:
            return shipped
    argv = ["sh", "-c", _START, "handover-soak", node.dir, transport.node.python, json.dumps(config)]
    return transport.run(argv, timeout=START_TIMEOUT_S, stdin=load("soak_supervisor"),
                         label=f"{transport.node.python} soak_supervisor start")


def collect(transport: Transport, folder: str, offset: int) -> Result:
    return transport.run(["sh", "-c", _COLLECT, "handover-soak", folder, str(offset), str(COLLECT_LIMIT)],
                         timeout=COMMAND_TIMEOUT_S, label="soak: collect")


def tell(transport: Transport, folder: str, what: str) -> Result:
    """Touch DIR/stop (end now) or DIR/collected (the harness has everything: clean up)."""
    return transport.run(["sh", "-c", _TELL, "handover-soak", folder, what], timeout=COMMAND_TIMEOUT_S,
                         label=f"soak: {what}")


def holder(refusal: str) -> str:
    """The soak that holds a node, in words, from the supervisor's refusal (exit 75)."""
    try:
        held = SoakHolder.parse(json.loads(refusal)["busy"])
    except (ValueError, KeyError, TypeError):
        held = None
    return held.describe() if held else refusal.strip() or "its lock holder did not say which"


def supervisor_state(result: Result) -> Optional[str]:
    """'alive', 'gone' or 'no-soak' from a collect; None when the node did not answer."""
    if result.failure or result.timed_out:
        return None
    for line in result.stderr.splitlines():
        if line.startswith(STATUS_PREFIX):
            return line[len(STATUS_PREFIX):].split()[0]
    return None


# ---------------------------------------------------------------------------------------------
# Under Slurm: the soak's own batch job


SLURM_LINGER_S = 3600  # the soak's job holds its nodes while its samples wait: an hour, not LINGER_S
SLURM_START_S = 60  # how long the soak's job may wait in the queue, and its supervisors to start
# Under Slurm each poll is a step of the soak's job, and a job may have MaxStepCount steps (40,000
# by default): every 5 s, a 72-hour soak would pass it; every 30 s it takes 8,640.
SLURM_POLL_S = 30.0
SBATCH = "sbatch"
_HEREDOC = "HANDOVER_SOAK_BATCH"
# Each node's task of the soak's job: its config by SLURMD_NODENAME from the batch on stdin, the
# payloads written into its folder, then the supervisor held in this task (soak_supervisor hold).
BOOT = r"""
import json, os, sys
batch = json.load(sys.stdin)
config = batch["configs"][os.environ["SLURMD_NODENAME"]]
os.makedirs(config["dir"], exist_ok=True)
for name, text in batch["payloads"].items():
    with open(os.path.join(config["dir"], name + ".py"), "w") as out:
        out.write(text)
supervisor = os.path.join(config["dir"], "soak_supervisor.py")
os.execv(sys.executable, [sys.executable, supervisor, "hold", json.dumps(config)])
"""


def batch_script(plan: SoakPlan, run_dir: Path, python: str) -> str:
    """The soak's batch job: one srun, a task on each of its nodes, each node's supervisor held in
    its task until the end and the collection (or SLURM_LINGER_S); the batch on stdin, one line."""
    configs = {name: supervisor_config(plan, name, run_dir, SLURM_LINGER_S) for name in plan.nodes
               if name not in plan.refused}
    payloads = {"soak_supervisor": load("soak_supervisor")}
    if int(plan.mix.get("gpu", 1)):
        payloads["gpu_burn"] = load("gpu_burn")
    srun = [SRUN, "--ntasks-per-node=1", "--input=all", "--kill-on-bad-exit=0", "--no-kill", "--quiet",
            python, "-c", BOOT]
    batch = json.dumps({"configs": configs, "payloads": payloads})
    return (f"#!/bin/sh\n# handover soak {plan.soak_id}: the supervisor on every node, until {clock_utc(plan.end)}\n"
            f"exec {shlex.join(srun)} <<'{_HEREDOC}'\n{batch}\n{_HEREDOC}\n")


def job_name(plan: SoakPlan) -> str:
    """The soak's batch job's name: --soak-stop finds the job by it, its ID recorded or not."""
    return f"{JOB_PREFIX}soak-{plan.soak_id}"


def sbatch_argv(plan: SoakPlan, nodes: Sequence[str], settings: LaunchSettings, script: str) -> list[str]:
    """The soak's job: its nodes whole, its time the soak's and SLURM_LINGER_S (not the inventory's
    time_limit, which bounds a run's allocation), never requeued (a soak restarted would be new)."""
    minutes = minutes_for(plan.end - time.time() + SLURM_LINGER_S + ROUND_SLACK_S)
    return [SBATCH, "--parsable", f"--job-name={job_name(plan)}", f"--nodelist={','.join(nodes)}",
            f"--nodes={len(nodes)}", "--exclusive", "--no-requeue", "--output=/dev/null", "--error=/dev/null",
            *job_options(replace(settings, time_limit_min=None), minutes=minutes), script]


def submit_job(plan: SoakPlan, run_dir: Path, python: str, settings: LaunchSettings) -> str:
    """Submit the soak's job on its nodes that Slurm can give whole now (the others are refused in
    the plan, with Slurm's word) and wait until it runs; its ID."""
    names = [name for name in plan.nodes if name not in plan.refused]
    try:
        states = node_states(names)
    except SlurmError as error:
        raise SoakError(f"the soak's Slurm job: {error}") from None
    for name in names:
        node = states.get(name)
        if node is None or not node.usable or node.busy:
            plan.refused[name] = f"Slurm cannot give it to the soak's job: {node.explain() if node else 'unknown'}"
    nodes = [name for name in names if name not in plan.refused]
    if not nodes:
        raise SoakError("Slurm can give the soak's job none of its nodes now")
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="handover-soak-") as script:
        script.write(batch_script(plan, run_dir, python))
        script.flush()
        try:
            done = client(sbatch_argv(plan, nodes, settings, script.name))
        except SlurmError as error:
            raise SoakError(f"the soak's Slurm job: {error}") from None
    job = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job.isdigit():
        raise SoakError(f"sbatch refused the soak's job: {(done.stderr or done.stdout).strip() or done.returncode}")
    try:
        return _running(job)
    except BaseException:  # refused, or Ctrl-C while it waits: no job of the soak stays in the queue
        client([SCANCEL, job])
        raise


def _running(job: str) -> str:
    """The job's ID once Slurm runs it; SoakError where it ends first or waits SLURM_START_S."""
    deadline = time.monotonic() + SLURM_START_S
    while True:
        state = job_state(job)  # None: squeue did not answer this time
        said = "no word from squeue" if state is None else state.state or "gone from squeue"
        if said == "RUNNING":
            return job
        if state is not None and said not in ("PENDING", "CONFIGURING"):
            raise SoakError(f"the soak's Slurm job {job} ended as it started: Slurm says it is {said}")
        if time.monotonic() > deadline:
            raise SoakError(f"Slurm did not start the soak's job {job} within {SLURM_START_S} s ({said}); "
                            "it was cancelled")
        time.sleep(1)


# ---------------------------------------------------------------------------------------------
# The harness's side of a running soak


@dataclass
class NodeState:
    """What the harness knows of one node's soak while it polls."""

    name: str
    offset: int = 0  # bytes of its samples in raw/
    state: Optional[str] = None  # the supervisor as last seen: alive, gone, no-soak
    ended: bool = False  # its end line is in raw/
    done: Optional[str] = None  # why polling it is over: ended, gone, dropped out, no soak
    unreachable: str = ""  # the last transport failure, while it does not answer
    silent_since: Optional[float] = None  # time.time() of the first poll it did not answer, in a row

    def answered(self, seen: str) -> None:
        self.state, self.unreachable, self.silent_since = seen, "", None

    def unanswered(self, why: str, now: float, end: float) -> None:
        """A poll the node did not answer (at `now`, time.time()); it dropped out once the soak's
        end has passed and it has been silent for DROP_GRACE_S."""
        self.unreachable = why
        if self.silent_since is None:
            self.silent_since = now
        if now > end and now - self.silent_since > DROP_GRACE_S:
            self.done = "dropped out"


@dataclass
class SoakProgress(Progress):
    """A soak's progress line: the nodes alive, elapsed and remaining time."""

    alive: int = 0
    duration_s: float = 0.0

    def line(self) -> str:
        elapsed = min(time.monotonic() - self.started, self.duration_s)  # started: monotonic, as Progress's
        unreached = self.total - self.alive - len(self.done)
        return (f"soak: {self.alive}/{self.total} nodes alive{f', {unreached} not answering' if unreached else ''}, "
                f"{elapsed:.0f} s of {self.duration_s:.0f} s, {self.duration_s - elapsed:.0f} s left"
                f"{f'; {len(self.done)} done' if self.done else ''}")


class SoakRun:
    """Polls a soak's nodes until each has ended (or dropped out), copying samples into raw/soak/."""

    def __init__(self, plan: SoakPlan, run_dir: Path, nodes: Mapping[str, Node],
                 on_progress: Optional[Callable[[Progress], None]] = None, launch: Optional[LaunchSettings] = None):
        self.plan = plan
        self.run_dir = Path(run_dir)
        self.raw = self.run_dir / "raw" / RAW_STEP
        self.specs = dict(nodes)
        self.on_progress = on_progress
        self.launch = launch or LaunchSettings()  # the inventory's, for the soak's Slurm job
        self.slurm = any(spec.transport == "slurm" for spec in self.specs.values())
        self._transports: dict[str, Transport] = {}
        self._slurm_steps: Optional[SlurmSteps] = None  # steps of the soak's job (plan.slurm_job)
        self.sealed = False  # the run is signed, or another process collects: samples are not kept here
        self._collector: Optional[int] = None  # the flock of collecting(), while this process holds it
        self.states = {name: NodeState(name, offset=self._complete_bytes(name)) for name in plan.nodes}
        self.readers = {name: SoakReader().feed(self.raw_lines(name)) for name in plan.nodes}  # re-attached: raw/'s
        for state in self.states.values():
            state.ended = self.readers[state.name].ended

    def raw_path(self, node: str) -> Path:
        return self.raw / f"{node}.jsonl"

    def raw_lines(self, node: str) -> Iterator[str]:
        """The node's collected sample lines, read as they are used (a day's are tens of MB)."""
        path = self.raw_path(node)
        if path.exists():
            with path.open(encoding="utf-8", errors="replace") as lines:
                yield from lines

    def log(self, node: str) -> "SoakLog":
        """The node's samples so far, reduced (runners.soak.SoakReader)."""
        return self.readers[node].log()

    def _complete_bytes(self, node: str) -> int:
        """The collected bytes up to the last whole line; a torn tail (the harness died while
        appending) is cut off, so the next collect appends whole lines after whole lines."""
        path = self.raw_path(node)
        if not path.exists():
            return 0
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep != len(data) and not (self.run_dir / "results.json").exists():  # a signed run stays as it is
            with path.open("r+b") as handle:
                handle.truncate(keep)
        return keep

    def transport(self, node: str) -> Transport:
        """The node's transport; a fresh one once the last was lost: a node may come back. Under
        Slurm, its commands are steps of the soak's job (--jobid, --overlap)."""
        transport = self._transports.get(node)
        if transport is None or transport.loss is not None:
            if transport is not None:
                transport.close()
            transport = self._transports[node] = self._connect(self.specs[node])
        return transport

    def _connect(self, spec: Node) -> Transport:
        if spec.transport != "slurm":
            return make_transport(spec)
        if self._slurm_steps is None:
            self._slurm_steps = SlurmSteps(replace(self.launch, allocation=self.plan.slurm_job))
        return SlurmTransport(spec, self._slurm_steps)

    def start_all(self) -> dict[str, Result]:
        """Start the supervisor on every planned node at once; a node that refuses (another
        soak runs there) or fails to start is refused in the plan, with why. The plan is saved
        first, so a harness killed while starting still leaves a soak to attach to."""
        self.plan.save(self.run_dir)
        if self.slurm:
            return self._start_job()
        started = fan_out({name: self.transport(name) for name in self.plan.nodes},
                          lambda t: start(t, self.plan, self.run_dir), name="soak start")
        for name, result in started.items():
            if not result.ok:
                self.plan.refused[name] = (f"another soak runs there: {holder(result.stdout)}" if result.exit_code == 75
                                           else f"the supervisor did not start: {result.explain()}")
                self.states[name].done = "not started"
        self.plan.save(self.run_dir)
        # A start the harness gave up on (its timeout) may have started the supervisor all the
        # same, and a refused node is neither followed nor stopped: end what it left.
        given_up = {name: self.transport(name) for name, result in started.items()
                    if not result.ok and result.exit_code != 75}
        fan_out(given_up, lambda t: self._end_leftovers(t.node.name), name="soak unstart")
        return started

    def _start_job(self) -> dict[str, Result]:
        """Under Slurm: the soak's batch job (submit_job), then each node's supervisor seen in it
        (its pid file) within SLURM_START_S; a node where none appears is refused, as is one that
        another soak holds (its supervisor refuses and removes its folder)."""
        first = self.specs[next(iter(self.plan.nodes))]
        try:
            self.plan.slurm_job = submit_job(self.plan, self.run_dir, first.python, self.launch)
        except SoakError as error:  # no job: no soak on any node, each node's checks say why
            self.plan.refused.update((name, str(error)) for name in self.plan.nodes if name not in self.plan.refused)
        for name in self.plan.refused:
            self.states[name].done = "not started"
        self.plan.save(self.run_dir)
        waiting = {name for name in self.plan.nodes if name not in self.plan.refused}
        seen: dict[str, Result] = {}
        deadline = time.monotonic() + SLURM_START_S
        while waiting and time.monotonic() < deadline:
            looked = fan_out({name: self.transport(name) for name in waiting},
                             lambda t: t.run(["test", "-s", f"{self.plan.nodes[t.node.name].dir}/pid"],
                                             timeout=COMMAND_TIMEOUT_S), name="soak started")
            seen.update((name, result) for name, result in looked.items() if result.ok)
            waiting -= seen.keys()
            if waiting:
                time.sleep(1)
        for name in waiting:
            self.plan.refused[name] = (f"its supervisor did not start within {SLURM_START_S} s in Slurm job "
                                       f"{self.plan.slurm_job} (another soak may hold the node)")
            self.states[name].done = "not started"
        self.plan.save(self.run_dir)
        return seen

    def poll_once(self) -> None:
        pending = {name: self.transport(name) for name, state in self.states.items()
                   if state.done is None and name not in self.plan.refused}
        if not pending:
            return
        results = fan_out(pending, lambda t: collect(t, self.plan.nodes[t.node.name].dir,
                                                     self.states[t.node.name].offset), name="soak collect")
        now = time.time()
        for name, result in results.items():
            self._take(self.states[name], result, now)

    def _take(self, state: NodeState, result: Result, now: float) -> None:
        seen = supervisor_state(result)
        if seen is None:
            state.unanswered(result.explain(), now, self.plan.end)
            return
        state.answered(seen)
        text = result.stdout
        whole = text[:text.rfind("\n") + 1]
        if whole and not self.sealed:
            self.raw.mkdir(parents=True, exist_ok=True)
            with self.raw_path(state.name).open("a", encoding="utf-8") as out:
                out.write(whole)
        state.offset += len(whole.encode())
        state.ended = self.readers[state.name].feed(whole.splitlines()).ended
        more = len(text.encode()) >= COLLECT_LIMIT
        if state.ended and not more:
            if self._collector is not None:  # else the harness that collects tells it
                tell(self.transport(state.name), self.plan.nodes[state.name].dir, "collected")
            state.done = "ended"
        elif seen == "no-soak":
            state.done = "no soak"  # its folder is gone: cleaned up, or the node was wiped
        elif seen == "gone" and not more:
            state.done = "gone"  # the supervisor died (a crash, a reboot) before its end line
            if self._collector is not None and not self.sealed:  # its samples are in raw/
                self._end_leftovers(state.name)

    def progress(self) -> "SoakProgress":
        alive = [s.name for s in self.states.values() if s.state == "alive" and not s.unreachable and not s.done]
        done = {s.name: ("ok" if s.done == "ended" else s.done or "") for s in self.states.values() if s.done}
        return SoakProgress(step=RAW_STEP, total=len(self.states), done=done,
                            running={s.name for s in self.states.values() if not s.done},
                            started=time.monotonic() - (time.time() - self.plan.started), alive=len(alive),
                            duration_s=self.plan.duration_s)

    def collecting(self) -> bool:
        """Become the one process that copies this soak's samples into raw/ (flock on the raw/soak
        folder, held until close or death): two harnesses, or a harness and --soak-stop, would
        append the same lines twice. False when another process already is."""
        if self._collector is None:
            self.raw.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.raw, os.O_RDONLY)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(descriptor)
                return False
            self._collector = descriptor
        return True

    def follow(self) -> None:
        """Poll until every node is done; then the plan says collected, so nothing re-attaches."""
        if not self.collecting():
            raise SoakError(f"another harness follows the soak of {self.run_dir}; let it finish, "
                            f"or end the soak with --soak-stop {self.run_dir}")
        while True:
            self.poll_once()
            if self.on_progress:
                self.on_progress(self.progress())
            if all(state.done for state in self.states.values()):
                break
            time.sleep(SLURM_POLL_S if self.slurm else POLL_S)
        self.plan.stopped = self.plan.stopped or SoakPlan.load(self.run_dir).stopped  # by --soak-stop meanwhile
        self.plan.collected = True
        self.plan.save(self.run_dir)

    def stop(self) -> dict[str, str]:
        """End the soak on every node now: stop, collect what is left, let each supervisor clean up,
        then kill whatever still carries the soak's tag. {node: what happened}. While a harness
        follows the soak, it collects and lets the supervisors clean up; this only waits for them."""
        collector = self.collecting()
        signed = (self.run_dir / "results.json").exists()  # a signed run directory stays as it was signed
        self.sealed = signed or not collector
        live = {name: self.transport(name) for name in self.plan.nodes if name not in self.plan.refused}
        told = fan_out(live, lambda t: tell(t, self.plan.nodes[t.node.name].dir, "stop"), name="soak stop")
        self.plan.stopped = True
        if not signed:  # at once: a harness following the soak keeps it when it saves the plan
            self.plan.save(self.run_dir)
        deadline = time.time() + STOP_WAIT_S
        for state in self.states.values():
            state.done = None if state.name in live else "not started"
        outcome: dict[str, str] = {}
        for name, result in told.items():
            if result.exit_code == EXIT_NO_SOAK:
                outcome[name] = "no soak running (already ended and cleaned up)"
                self.states[name].done = "no soak"
            elif not result.ok:
                outcome[name] = f"not reached: {result.explain()}"
                self.states[name].done = "unreachable"
        while time.time() < deadline and not all(s.done for s in self.states.values()):
            self.poll_once()
            time.sleep(1)
        self._wait_cleaned([name for name in live if name not in outcome], deadline)
        killed = fan_out({name: self.transport(name) for name in live if name not in outcome},
                         lambda t: self._end_tools(t.node.name), name="soak kill")
        unclean = [name for name in killed if self.states[name].done != "ended"]  # killed, or dead before
        if unclean and self._collector is not None and not self.sealed:
            fan_out({name: self.transport(name) for name in unclean}, lambda t: self._remove_folders(t.node.name),
                    name="soak remove")
        if self.slurm:  # the job's supervisors have ended: the job goes at once, with anything left in it
            try:
                client([SCANCEL, f"--name={job_name(self.plan)}"])
            except SlurmError as error:
                for name in live:
                    outcome.setdefault(name, f"stopped; the soak's Slurm job may remain: {error}")
        for name in killed:
            kept = ("the run was already signed: samples since are not kept" if self.sealed and self._collector
                    else "the harness following it has its samples" if self.sealed else "its samples are in raw/")
            outcome.setdefault(name, f"stopped; {kept}" if self.states[name].done == "ended"
                               else f"killed ({self.states[name].done or 'did not end in time'})")
        return outcome

    def _end_leftovers(self, name: str) -> Result:
        """End what a supervisor that cannot clean up (dead, or started by a start the harness
        gave up on) left on the node: its tools, then its folders."""
        self._end_tools(name)
        return self._remove_folders(name)

    def _end_tools(self, name: str) -> Result:
        """Kill every process of the soak on the node, by the soak's tag."""
        return self.transport(name).run(kill_argv(self.plan.tag, root=False), timeout=COMMAND_TIMEOUT_S,
                                        label="soak: end its tools")

    def _remove_folders(self, name: str) -> Result:
        """The supervisor's folder in the local scratch path and its fio folder in the shared one
        (1 GiB by default), for a supervisor that cannot remove them any more."""
        node = self.plan.nodes[name]
        return self.transport(name).run(["rm", "-rf", "--", node.dir, *([node.io_dir] if node.io_dir else [])],
                                        timeout=COMMAND_TIMEOUT_S, label="soak: remove its folders")

    def _wait_cleaned(self, names: list[str], deadline: float) -> None:
        """Until each supervisor told `collected` has removed its folder (and so ended), or the deadline."""
        waiting = list(names)
        while waiting and time.time() < deadline:
            looked = fan_out({name: self.transport(name) for name in waiting},
                             lambda t: t.run(["test", "-d", self.plan.nodes[t.node.name].dir],
                                             timeout=COMMAND_TIMEOUT_S), name="soak cleaned")
            waiting = [name for name, result in looked.items() if result.exit_code != 1]
            if waiting:
                time.sleep(1)

    def close(self) -> None:
        close_everywhere(self._transports.values())
        if self._collector is not None:
            os.close(self._collector)
            self._collector = None


# ---------------------------------------------------------------------------------------------
# Pure parsers and judgements of a node's sample lines


@dataclass(frozen=True)
class Part:
    part: str  # cpu, net, gpu
    t0: float
    t1: float
    value: Optional[float]
    unit: str
    error: Optional[str]


# The sample fields the judgements read across the whole soak: their peak, and their trend in
# time buckets (about TREND_BUCKETS over the soak). A node's log is reduced to these while it is
# read, so a day of samples from eight GPUs (30 MB of lines) holds about a megabyte, not a hundred.
SAMPLED = ("cpu_temp_c", "gpus.temp_c", "gpus.power_w")  # gpus.*: the highest of the node's GPUs
TREND_BUCKETS = 240
GPU_LOST = "GPU is lost"  # what pynvml's NVMLError_GpuIsLost says, as a sample's `errors` keep it
DIGESTS_KEPT = 32  # distinct result digests kept per GPU; a corrupting GPU's further ones are only counted
OTHER_DIGESTS = "other digests"


@dataclass
class SoakLog:
    """A node's soak as its sample lines tell it, reduced as it is read: the start and end lines,
    every round, Xid and event, every sample's time (the heartbeat), the last sample whole (the
    counters against the start's baseline), and of the SAMPLED fields their peak and trend."""

    start: Optional[dict]
    parts: list[Part]
    xids: list[dict]
    events: list[dict]
    end: Optional[dict]
    torn: int = 0  # lines that were not JSON: a write cut short (unreadable() says so)
    times: list[float] = field(default_factory=list)
    last: Optional[dict] = None
    peaks: dict[str, float] = field(default_factory=dict)
    slowdowns: dict[str, list[str]] = field(default_factory=dict)  # GPU -> failing slowdown reasons seen
    lost: dict[str, float] = field(default_factory=dict)  # GPU -> the first sample NVML could not reach it
    digests: dict[str, dict[str, int]] = field(default_factory=dict)  # GPU -> the burn's result digest -> checks
    # What each error counter rose by over the soak, summed sample to sample from the start's
    # baseline: a counter reset (a GPU reset, a cleared port) counts again from 0, and a last
    # sample that could not read it keeps what the earlier ones saw. GPU -> ecc_uncorrected,
    # ecc_corrected, remap (rows); port -> symbol_error, link_downed, ...
    gpu_rises: dict[str, dict[str, int]] = field(default_factory=dict)
    link_rises: dict[str, dict[str, int]] = field(default_factory=dict)
    remap_failed: list[str] = field(default_factory=list)  # GPUs a sample said a row remap failed on
    link_saturated: dict[str, list[str]] = field(default_factory=dict)  # port -> counters at their ceiling
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (epoch s, mean) per bucket


def parse_soak(text: str) -> SoakLog:
    """A supervisor's samples.jsonl (or the harness's raw/soak/<node>.jsonl copy of it)."""
    return SoakReader().feed(text.splitlines()).log()


class SoakReader:
    """A node's sample lines reduced to its SoakLog as they come: fed what raw/ holds when a
    harness attaches, then each collected chunk, so judging at the end reads nothing again."""

    def __init__(self) -> None:
        self._log = SoakLog(start=None, parts=[], xids=[], events=[], end=None)
        self._buckets: dict[str, dict[int, list[float]]] = {key: {} for key in SAMPLED}
        self._origin: Optional[float] = None
        self._width = 60.0
        self._written = self._objects = self._known = 0
        self._counters: dict[tuple[str, str], dict[str, int]] = {}  # (gpu|link, GPU or port) -> last reads
        self._gpu_counters: dict[str, tuple] = {}  # GPU -> its counters as the last sample had them

    def feed(self, lines: Iterable[str]) -> "SoakReader":
        log = self._log
        for line in lines:
            if not line.strip():
                continue
            self._written += 1
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            self._objects += 1
            kind = record.get("kind")
            self._known += kind in ("start", "sample", "part", "end")
            if kind == "start" and log.start is None:
                log.start = record
                baseline = record.get("baseline")
                if isinstance(baseline, dict):
                    _count_rises(log, self._counters, self._gpu_counters, baseline, baseline=True)
                origin, until = _number(record.get("t")), _number(record.get("end"))
                self._origin = origin if self._origin is None else self._origin
                if origin is not None and until is not None and until > origin:
                    self._width = (until - origin) / TREND_BUCKETS
            elif kind == "sample" and _number(record.get("t")) is not None:
                moment = float(record["t"])
                self._origin = moment if self._origin is None else self._origin
                log.times.append(moment)
                log.last = record
                _reduce(log, self._buckets, record, int(max(0.0, moment - self._origin) // self._width))
                _count_rises(log, self._counters, self._gpu_counters, record)
            elif kind == "part":
                value = record.get("value")
                log.parts.append(Part(str(record.get("part")), float(record["t0"]), float(record["t1"]),
                                      float(value) if isinstance(value, (int, float)) else None,
                                      str(record.get("unit") or ""), record.get("error")))
                _count_digests(log.digests, record.get("digests"))
            elif kind == "xid":
                log.xids.append(record)
            elif kind == "event":
                log.events.append(record)
            elif kind == "end":
                log.end = record
        return self

    @property
    def ended(self) -> bool:
        return self._log.end is not None

    def log(self) -> SoakLog:
        """What the lines so far say; ParseError for lines that are not a soak supervisor's."""
        if self._written and not self._objects:
            raise ParseError("soak samples: no JSON line of the soak supervisor")
        if self._objects and not self._known:
            raise ParseError("soak samples: JSON lines, but none of kind start, sample, part or end")
        series = {key: [(t / n, v / n) for _, (t, v, n) in sorted(found.items())]
                  for key, found in self._buckets.items() if found}
        return replace(self._log, torn=self._written - self._objects, series=series)


def _count_digests(kept: dict[str, dict[str, int]], digests: object) -> None:
    """A GPU burn round's {gpu: {digest: checks}} added to the log's tallies."""
    if not isinstance(digests, dict):
        return
    for gpu, tally in digests.items():
        if not isinstance(tally, dict):
            continue
        mine = kept.setdefault(str(gpu), {})
        for digest, checks in tally.items():
            if not isinstance(checks, int):
                continue
            key = digest if digest in mine or len(mine) < DIGESTS_KEPT else OTHER_DIGESTS
            mine[key] = mine.get(key, 0) + checks


GPU_COUNTERS = ("ecc_uncorrected", "ecc_corrected")


def _count_rises(log: SoakLog, seen: dict[tuple[str, str], dict[str, int]], unchanged: dict[str, tuple],
                 sample: dict, baseline: bool = False) -> None:
    """A sample's (or the start's baseline's) error counters into the log's rises. Read for every
    sample of every node: a GPU whose counters read as they did last time (nearly all, nearly
    always) costs one comparison (`unchanged`: each GPU's counters as last read)."""
    for entry in sample.get("gpus") or ():
        if not isinstance(entry, dict) or "gpu" not in entry:
            continue
        gpu = str(entry["gpu"])
        as_read = (entry.get("ecc_uncorrected"), entry.get("ecc_corrected"), entry.get("remap"))
        if unchanged.get(gpu) == as_read:
            continue
        unchanged[gpu] = as_read
        readings = [(key, entry.get(key)) for key in GPU_COUNTERS]
        rows = entry.get("remap")
        if isinstance(rows, list) and len(rows) >= 2 and type(rows[0]) is int and type(rows[1]) is int:
            readings.append(("remap", rows[0] + rows[1]))
            if len(rows) >= 4 and rows[3] and gpu not in log.remap_failed:
                log.remap_failed.append(gpu)
        _rise(log.gpu_rises, seen.setdefault(("gpu", gpu), {}), gpu, readings, baseline)
    ports = sample.get("ib")
    for port, counters in (ports.items() if isinstance(ports, dict) else ()):
        if isinstance(counters, dict):
            _rise(log.link_rises, seen.setdefault(("link", str(port)), {}), str(port),
                  [(str(name), value) for name, value in counters.items()], baseline,
                  LINK_COUNTER_CEILINGS, log.link_saturated)


def _rise(rises: dict[str, dict[str, int]], last: dict[str, int], owner: str,
          readings: list[tuple[str, object]], baseline: bool,
          ceilings: Mapping[str, int] = MappingProxyType({}),
          saturated: Optional[dict[str, list[str]]] = None) -> None:
    """Each counter's rise since its last reading into rises[owner]; a reading below the last is
    a reset, counted again from 0; one that is not a number (unreadable this time) is skipped.
    A counter that reads its ceiling (`ceilings`) goes into saturated[owner]: it counts no more."""
    for name, value in readings:
        if type(value) is not int:
            continue
        previous = last.get(name)
        if previous == value:
            continue
        last[name] = value
        if saturated is not None and value == ceilings.get(name) and name not in saturated.get(owner, ()):
            saturated.setdefault(owner, []).append(name)
        if baseline or previous is None:
            continue
        rise = value - previous if value > previous else value
        if rise > 0:
            mine = rises.setdefault(owner, {})
            mine[name] = mine.get(name, 0) + rise


def _number(value: object) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _reduce(log: SoakLog, buckets: dict[str, dict[int, list[float]]], sample: dict, bucket: int) -> None:
    """One sample into the log's peaks, slowdown reasons, lost GPUs and trend buckets."""
    for gpu, mask in _gpu_values(sample, "reasons").items():
        if isinstance(mask, int) and mask & FAILING_REASONS:
            seen = set(log.slowdowns.get(str(gpu), [])) | set(decode_reasons(mask & FAILING_REASONS))
            log.slowdowns[str(gpu)] = sorted(seen)
    for gpu, errors in _gpu_values(sample, "errors").items():
        if isinstance(errors, dict) and GPU_LOST in errors.values():
            log.lost.setdefault(str(gpu), float(sample["t"]))
    for key in SAMPLED:
        if key.startswith("gpus."):
            values = [v for v in map(_number, _gpu_values(sample, key[5:]).values()) if v is not None]
            value = max(values) if values else None
        else:
            value = _number(sample.get(key))
        if value is None:
            continue
        log.peaks[key] = max(value, log.peaks.get(key, value))
        total = buckets[key].setdefault(bucket, [0.0, 0.0, 0])
        total[0] += float(sample["t"])
        total[1] += value
        total[2] += 1


PARSERS = {"soak": parse_soak}


def round_length(plan: SoakPlan, part: str) -> tuple[str, float]:
    """The mix's key for a load part's round length, and its seconds."""
    key = ROUND_KEYS.get(part, "round_s")
    return key, float(plan.mix.get(key, SOAK_MIX_DEFAULTS[key]))  # type: ignore[arg-type]


def no_round(plan: SoakPlan, log: SoakLog, part: str) -> Optional[str]:
    """Why a load part that should have run on the node has no round at all (a soak stopped early
    is not held to it), or None."""
    if plan.stopped or any(p.part == part for p in log.parts):
        return None
    key, round_s = round_length(plan, part)
    if plan.duration_s < round_s / 2:
        return f"no round ran: the soak's {plan.duration_s:g} s is shorter than half a round ({key}={round_s:g})"
    return "no round ran"


def rounds_stop_early(plan: SoakPlan, log: SoakLog, part: str, until: Optional[float] = None) -> Optional[str]:
    """Why a load part's rounds end well before the node's samples do (its supervisor went on
    sampling, its load did not: the part's round thread died), or None. The rounds are due
    until the soak's end, the node's last sample (a node that dropped out, a soak stopped early)
    or `until` (its peer dropped out then); a round may take its length and the supervisor's
    slack, and the next may retry a busy peer for a while."""
    ended = [p.t1 for p in log.parts if p.part == part]
    if not ended or not log.times:
        return None
    due = min(plan.end, max(log.times), math.inf if until is None else until)
    allowed = 3 * round_length(plan, part)[1] + ROUND_SLACK_S + gap_allowed(plan.interval_s)
    last = max(ended)
    if due - last <= allowed:
        return None
    return (f"its rounds stop at {clock_utc(last)}, {due - last:.0f} s before they were due to "
            f"({clock_utc(due)}): the load stopped, the node did not")


def heartbeat_gaps(times: Sequence[float], allowed_s: float) -> list[tuple[float, float]]:
    """(from, to) of each stretch longer than allowed_s without a sample."""
    ordered = sorted(times)
    return [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b - a > allowed_s]


def gap_allowed(interval_s: float) -> float:
    """A heartbeat this late means a hang or a reboot, not a busy node: three missed samples."""
    return 3 * interval_s + 5


def dropped_out(log: SoakLog, plan_end: float, interval_s: float, stopped: bool = False) -> Optional[str]:
    """Why the node's samples stop before the end (None when they reach it). An end line does not
    make up for them: a supervisor ended by a signal writes one early, and so does one whose
    sampling hung (a GPU fallen off the bus) and came back only after the end."""
    if log.start is None:
        return "no sample of its soak reached the harness"
    last = max(log.times, default=float(log.start["t"]))
    if stopped or last >= plan_end - gap_allowed(interval_s):
        return None
    if log.end is not None:
        ended, reason = _number(log.end.get("t")) or last, log.end.get("reason") or "no reason given"
        return (f"its samples stop at {clock_utc(last)}, {plan_end - last:.0f} s before the end; "
                f"its supervisor ended at {clock_utc(ended)}: {reason}")
    return f"its samples stop at {clock_utc(last)}, {plan_end - last:.0f} s before the end, with no end line"


def unreadable(log: SoakLog) -> Optional[str]:
    """Why the node's record of its soak is not whole (None when every line read): a line that is
    not JSON is a write the supervisor began and the node never finished. The harness collects
    whole lines only, so such a line was cut short on the node itself."""
    if not log.torn:
        return None
    return (f"{log.torn} line(s) of its samples are not whole: a write cut short on the node (its scratch "
            f"full, or the node down mid-write), and the samples in them lost")


def clock_utc(epoch: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(epoch))


@dataclass(frozen=True)
class Drift:
    part: str
    unit: str
    first: float  # the median figure of the first quarter of the rounds
    last: float  # of the last quarter
    median: float  # of every round
    rounds: int
    failed: int  # rounds without a figure

    @property
    def retained_pct(self) -> float:
        return 100.0 * self.last / self.first if self.first else 0.0


def drift(parts: Sequence[Part], part: str, until: Optional[float] = None) -> Optional[Drift]:
    """First against last quarter of a load part's rounds (at least one round each); rounds that
    ended after `until` (its peer dropped out then) are left out. None without two figures."""
    chosen = [p for p in parts if p.part == part and (until is None or p.t1 <= until)]
    figures = [p.value for p in chosen if p.value is not None]
    if len(figures) < 2:
        return None
    quarter = max(1, len(figures) // 4)
    return Drift(part, chosen[0].unit, statistics.median(figures[:quarter]), statistics.median(figures[-quarter:]),
                 statistics.median(figures), len(chosen), len(chosen) - len(figures))


def lone_round(parts: Sequence[Part], part: str, until: Optional[float] = None) -> Optional[Part]:
    """The one round of a load part that gave a figure, where it gave exactly one (a GPU burn
    round of gpu_round_s in a soak shorter than two): too few for drift, still worth saying."""
    figured = [p for p in parts if p.part == part and p.value is not None and (until is None or p.t1 <= until)]
    return figured[0] if len(figured) == 1 else None


def _gpu_values(sample: dict, key: str) -> dict[int, object]:
    return {int(g["gpu"]): g.get(key) for g in sample.get("gpus") or [] if isinstance(g, dict) and "gpu" in g}


def gpu_problems(log: SoakLog) -> list[str]:
    """A GPU NVML lost, new Xids, new ECC errors and row remaps against the soak's start, and the
    slowdown reasons that mean cooling or power delivery fails (runners.burn.FAILING_REASONS), per GPU."""
    problems = [f"GPU {gpu}: NVML lost it at {clock_utc(moment)} ({GPU_LOST}): fallen off the bus"
                for gpu, moment in sorted(log.lost.items(), key=lambda item: int(item[0]))]
    problems += [f"{'a GPU' if x.get('gpu') is None else 'GPU %s' % x['gpu']}: Xid {x.get('xid')} "
                 f"at {clock_utc(float(x['t']))}" for x in log.xids]
    gpus = sorted(log.gpu_rises, key=int)
    for key, what in (("ecc_uncorrected", "uncorrected ECC errors"), ("ecc_corrected", "corrected ECC errors")):
        problems += [f"GPU {gpu}: {log.gpu_rises[gpu][key]} new {what}" for gpu in gpus if key in log.gpu_rises[gpu]]
    for gpu in sorted(set(gpus) | set(log.remap_failed), key=int):
        if "remap" in log.gpu_rises.get(gpu, {}):
            problems.append(f"GPU {gpu}: {log.gpu_rises[gpu]['remap']} rows remapped during the soak")
        if gpu in log.remap_failed:
            problems.append(f"GPU {gpu}: a row remap failed")
    slowed = sorted(log.slowdowns.items(), key=lambda item: int(item[0]))
    problems += [f"GPU {gpu}: {', '.join(names)}" for gpu, names in slowed]
    return problems + digest_problems(log)


def digest_problems(log: SoakLog) -> list[str]:
    """The burn's silent-corruption check over the whole soak: every GPU of the node multiplies the
    same inputs all the time, so every result digest should be the one most checks gave."""
    gpus = sorted(log.digests, key=lambda gpu: int(gpu) if gpu.isdigit() else -1)
    counts: Counter = Counter()
    for tally in log.digests.values():
        counts.update({digest: checks for digest, checks in tally.items() if digest != OTHER_DIGESTS})
    reference, tie = majority_digest(counts, gpus)
    if reference is None:
        return tie
    problems = []
    for gpu in gpus:
        checks = sum(log.digests[gpu].values())
        wrong = checks - log.digests[gpu].get(reference, 0)
        if wrong:
            problems.append(f"GPU {gpu}: result differs bit for bit from the reference in {wrong} of "
                            f"{checks} checks during the soak: silent data corruption")
    return problems


def link_problems(log: SoakLog) -> list[str]:
    """InfiniBand error counters that rose during the soak, per port; and those that read their
    ceiling, whose rises cannot be seen (a port that had that many errors before is no better)."""
    return [f"{port}: {name} +{rise}" for port, rises in sorted(log.link_rises.items())
            for name, rise in sorted(rises.items())] + [
        f"{port}: {name} saturated at {LINK_COUNTER_CEILINGS[name]} (it counts no further: clear the port's "
        "counters, perfquery -x -R, and soak again)" for port, names in sorted(log.link_saturated.items())
        for name in sorted(names)]


def peak(log: SoakLog, key: str) -> Optional[float]:
    """The highest reading of a SAMPLED field (cpu_temp_c) or of any GPU's (gpus.temp_c)."""
    return log.peaks.get(key)


def trend(log: SoakLog, key: str, started: float, points: int = 120) -> list[tuple[float, float]]:
    """(minutes into the soak, value) of a SAMPLED field (its time buckets), or of a load part's
    rounds ('part:cpu'), thinned to about `points` by averaging neighbours."""
    if key.startswith("part:"):
        raw = [((p.t1 - started) / 60, p.value) for p in sorted(log.parts, key=lambda p: p.t1)
               if p.part == key[5:] and p.value is not None]
    else:
        raw = [((moment - started) / 60, value) for moment, value in log.series.get(key, [])]
    if len(raw) <= points:
        return raw
    size = math.ceil(len(raw) / points)
    return [(statistics.fmean(x for x, _ in raw[i:i + size]), statistics.fmean(y for _, y in raw[i:i + size]))
            for i in range(0, len(raw), size)]


def worst_first(lines: Mapping[str, list[tuple[float, float]]], *, high_is_bad: bool, shown_max: int,
                worst_shown: int, of: str = "nodes") -> dict[str, list[tuple[float, float]]]:
    """A trend's lines for the report, the worst node (or rack: `of`) first, by the highest peak
    or the lowest dip; above shown_max lines, the worst_shown worst and the median of all, so a
    thousand-node soak draws a handful of lines. Lines without points are left out."""
    drawn = {node: points for node, points in lines.items() if points}
    ranked = sorted(drawn, key=lambda node: (max if high_is_bad else min)(y for _, y in drawn[node]),
                    reverse=high_is_bad)
    if len(ranked) <= shown_max:
        return {node: drawn[node] for node in ranked}
    shown = {node: drawn[node] for node in ranked[:worst_shown]}
    shown[f"median of all {of}"] = median_line(drawn.values())
    return shown


def median_line(lines: Iterable[list[tuple[float, float]]], points: int = 120) -> list[tuple[float, float]]:
    """The median of several lines against time: their points binned by time (about `points`
    bins over the longest line), each bin's median value at its points' mean time. By time, not by
    index: nodes' rounds end at their own moments, and a node that dropped out has fewer points."""
    every = [point for line in lines for point in line]
    if not every:
        return []
    span = max(x for x, _ in every) or 1.0
    bins: dict[int, list[tuple[float, float]]] = {}
    for x, y in every:
        bins.setdefault(min(points - 1, int(x / span * points)), []).append((x, y))
    return [(statistics.fmean(x for x, _ in found), statistics.median(y for _, y in found))
            for _, found in sorted(bins.items())]


def group_lines(lines: Mapping[str, list[tuple[float, float]]],
                group_of: Mapping[str, Optional[str]]) -> dict[str, list[tuple[float, float]]]:
    """Each group's (rack's) median line, named with its node count: where a facility's cooling
    or power fails, a rack drifts as one. {} unless two groups have nodes with points (nothing to
    compare); nodes of no group are left out."""
    members: dict[str, list[list[tuple[float, float]]]] = {}
    for node, points in lines.items():
        if points and group_of.get(node):
            members.setdefault(str(group_of[node]), []).append(points)
    if len(members) < 2:
        return {}
    return {f"{group} ({len(found)} node{'s' if len(found) > 1 else ''})": median_line(found)
            for group, found in sorted(members.items())}
