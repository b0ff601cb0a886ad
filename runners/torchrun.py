"""torchrun: the launcher (argv only) and a launch on every node that cannot leave ranks behind.

torchrun starts on every node (over each node's Transport) and the nodes meet at a c10d
rendezvous on the first one. A rank that cannot reach its peers makes torchrun's rank 0 wait
forever, so every launch is bounded by the transport's node-side timeout, and as soon as one
node's launch fails, the launches on all the other nodes are killed (transport.kill_running()).
Afterwards each node is asked for processes still carrying the run's marker; any found are
reported (and killed again), never silently left. Under `launch: {engine: slurm}` the same
torchrun argv runs instead as one srun step from the harness's machine (srun_across).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import secrets
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from inventory.model import RENDEZVOUS_TIMEOUT_S, LaunchSettings
from runners import payloads
from runners.fanout import fan_out, kill_everywhere
from runners.launchers import Launcher, LaunchError, SrunLauncher, uses_srun
from runners.slurm import DISPATCH, Frames, last_line, minutes_for, parse_launch_failures, read_frame, run_here
from runners.transport import (
    HARNESS_GRACE_S,
    LEASE_VARIABLE,
    OWN_TEMP_PREFIX,
    TAG_VARIABLE,
    Result,
    Transport,
    kill_argv,
    new_tag,
    node_timed_out,
    wrap,
)

DEFAULT_PORT = 29431  # torchrun's rendezvous port when the rendezvous node cannot name a free one
MARKER_PREFIX = "handover-run-"
LEFTOVER_CHECK_TIMEOUT_S = 15
LEFTOVER_GRACE_S = 10  # how long ranks may take to exit once their torchrun is gone
PEER_FAILURE_GRACE_S = 5  # after one node's launch fails, how long the others may end by themselves
_ROUTE_DEV = re.compile(r"\bdev\s+(\S+)")
# One node: sockets between its ranks over loopback (NCCL itself uses NVLink/PCIe for the data).
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
# A port free on IPv6 and IPv4 at once (a dual-stack socket), where the node has IPv6: the c10d
# store listens on both, and a port free on one alone could be taken on the other.
FREE_PORT_SCRIPT = """import socket
try:
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 0))
except OSError:
    s = socket.socket()
    s.bind(("", 0))
print(s.getsockname()[1])
"""
# torchrun makes its log directory under the node's TMPDIR and never removes it (a torchelastic_*
# per launch left on a customer's node): it gets one that is removed when torchrun ends, named
# after the command's lease (runners.transport.OWN_TEMP_PREFIX) for when torchrun is killed where
# it hangs, on a dead link, before it could remove it: the lease's kill removes it then. torch is
# imported first the payloads' way (runners/payloads/torch_import.py): the agent's start and exit
# cost a third less CPU.
OWN_LOG_DIR_SCRIPT = (
    "# handover: torch.distributed.run (torchrun) in a log directory removed when it ends\n"
    + payloads.load("torch_import") + "import_torch()\n"
    "import os, runpy, shutil, sys, tempfile\n"
    f"owner = os.environ.get({LEASE_VARIABLE!r}) or os.environ.get({TAG_VARIABLE!r}, 'untagged')\n"
    f"log_dir = tempfile.mkdtemp(prefix={OWN_TEMP_PREFIX!r} + owner + '-torchrun-')\n"
    "sys.argv = ['torchrun', '--log-dir', log_dir, *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    "    shutil.rmtree(log_dir, ignore_errors=True)\n")


# The last line of torchrun's traceback where its rendezvous failed (torch.distributed.elastic):
# not every node joined in time (RendezvousTimeoutError), or the node lost the rendezvous store
# (RendezvousConnectionError): it could not reach it at all, or the store's host ended first.
RENDEZVOUS_ERRORS = "torch.distributed.elastic.rendezvous.api."
_STORE_UNREACHED = re.compile(r"timed out after \d+ ?ms while trying to connect to \(([^,]+), (\d+)\)")


def rendezvous_failure(stderr: str, timeout_s: int, store_node: str = "") -> Optional[tuple[int, str]]:
    """Why a torchrun's rendezvous failed, from its stderr (the rendezvous waited timeout_s; the
    node holding the store, where known, named), with how telling that is: 0 the node could not
    reach the store (it, or the store's node, is cut off), 1 it waited in vain for the others,
    2 the store went away under it (its node's torchrun ended first); None where it did not fail."""
    errors = {line.strip()[len(RENDEZVOUS_ERRORS):].partition(":")[0] for line in stderr.splitlines()
              if line.strip().startswith(RENDEZVOUS_ERRORS)}
    within = f"within launch.rendezvous_timeout_s ({timeout_s} s)"
    store = _STORE_UNREACHED.search(stderr)
    if "RendezvousConnectionError" in errors and store:
        held = f"of {store_node} " if store_node else ""
        return 0, (f"torchrun could not reach the rendezvous store {held}on {_endpoint_host(store[1])}:{store[2]} "
                   f"{within} (RendezvousConnectionError)")
    if "RendezvousTimeoutError" in errors:
        return 1, (f"not every node joined torchrun's rendezvous {within} (RendezvousTimeoutError): one did not "
                   "start torchrun or could not reach the store; raise it where nodes start slowly")
    if "RendezvousConnectionError" in errors:
        return 2, ("torchrun lost the rendezvous store (RendezvousConnectionError): the torchrun that held it "
                   "ended first")
    return None


def rendezvous_cause(launch: "Launch") -> Optional[tuple[str, str]]:
    """(node, why) of a launch whose rendezvous failed, the most telling node first: one that
    could not reach the store (of the launch's first node); None where none failed there."""
    store_node = next(iter(launch.results), "")
    failures = {node: failure for node, result in launch.results.items()
                if (failure := rendezvous_failure(result.stderr, launch.rendezvous_timeout_s, store_node)) is not None}
    if not failures:
        return None
    node = min(failures, key=lambda name: failures[name][0])
    return node, f"{node}: {failures[node][1]}"


def new_run_id() -> str:
    """Run-unique: names the rendezvous and marks the run's processes on every node."""
    return f"{MARKER_PREFIX}{secrets.token_hex(6)}"


@dataclass(frozen=True)
class TorchrunLauncher(Launcher):
    """`python -m torch.distributed.run` (torchrun) with a c10d rendezvous on the first host.

    The node's own interpreter runs torchrun, so no `torchrun` script needs to be on PATH,
    in a log directory of its own that goes when it ends (OWN_LOG_DIR_SCRIPT);
    `--no-python` makes it start `command` as given (a payload passed with `python -c`).
    No restarts: an acceptance run reports the first failure instead of hiding it.
    """

    rdzv_id: str = field(default_factory=new_run_id)
    port: int = DEFAULT_PORT
    python: str = "python3"
    # how long the rendezvous waits for every node to join, and each node to reach its store
    join_timeout_s: int = RENDEZVOUS_TIMEOUT_S

    name = "torchrun"
    starts_on = "every"

    def argv(self, hosts: Sequence[str], ranks_per_node: int, command: Sequence[str], *,
             on: Optional[str] = None) -> list[str]:
        """`on`: the host (one of hosts) this argv runs on. It then hosts the rendezvous store
        exactly when it is the first (is_host) and gives its own address for rank 0's
        (--local-addr, torch 2.0 and later): torch would otherwise guess both from the machine's
        hostname, which Debian and cloud-init resolve to 127.0.1.1."""
        self._check(hosts, ranks_per_node, command)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.rdzv_id):
            raise LaunchError(f"rendezvous id {self.rdzv_id!r}: letters, digits, '_', '.', '-' only")
        if on is not None and on not in hosts:
            raise LaunchError(f"{on} is not one of the hosts: {', '.join(hosts)}")
        conf, local = f"join_timeout={self.join_timeout_s},read_timeout={self.join_timeout_s}", []
        if on is not None:
            conf += ",is_host=" + ("true" if on == hosts[0] else "false")
            local = ["--local-addr", on]
        return [self.python, "-c", OWN_LOG_DIR_SCRIPT,
                "--nnodes", str(len(hosts)), "--nproc-per-node", str(ranks_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{_endpoint_host(hosts[0])}:{self.port}",
                "--rdzv-id", self.rdzv_id, "--rdzv-conf", conf, *local,
                "--max-restarts", "0", "--no-python", *command]


def _endpoint_host(host: str) -> str:
    """IPv6 addresses need brackets before ':port'."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


@dataclass(frozen=True)
class Launch:
    """What one launch on every node gave."""

    results: dict[str, Result]  # node -> its torchrun's Result, in launch order
    first_failure: Optional[str]  # the node whose launch failed first, None when all succeeded
    killed: tuple[str, ...]  # nodes whose launch the harness killed after that failure
    leftovers: dict[str, str]  # node -> processes still carrying the marker afterwards
    marker: str
    rendezvous_timeout_s: int = RENDEZVOUS_TIMEOUT_S  # what its rendezvous waited (join_timeout)

    @property
    def ok(self) -> bool:
        return self.first_failure is None and not self.leftovers


def launch_every(transports: Mapping[str, Transport], argv: Mapping[str, Sequence[str]], *, timeout: float,
                 marker: str, env: Optional[Mapping[str, Mapping[str, str]]] = None) -> Launch:
    """Run each node's argv on every node at once; one failure kills the launches everywhere.

    After the first failure the other launches get PEER_FAILURE_GRACE_S to end by themselves:
    the node whose rank died is often not the first to report, and its torchrun's summary is
    what names the rank. Whatever still runs after that is killed.

    `marker` must appear in each argv (the rendezvous id does): it finds the run's processes on
    each node afterwards. `env` gives per-node environment variables.
    """
    if any(marker not in " ".join(argv[node]) for node in transports):
        raise LaunchError(f"marker {marker!r} is not in the argv, so leftovers could not be found")
    results: dict[str, Result] = {}
    failed = threading.Event()
    lock = threading.Lock()
    order: list[str] = []

    def work(node: str, transport: Transport) -> None:
        result = transport.run(argv[node], timeout=timeout, env=dict((env or {}).get(node, {})))
        with lock:
            results[node] = result
            order.append(node)
        if not result.ok:
            failed.set()

    threads = {node: threading.Thread(target=work, args=(node, transport), daemon=True,
                                      name=f"torchrun-{node}")
               for node, transport in transports.items()}
    for thread in threads.values():
        thread.start()
    deadline = timeout + HARNESS_GRACE_S + 5
    waited = 0.0
    while any(t.is_alive() for t in threads.values()) and not failed.is_set() and waited < deadline:
        failed.wait(0.2)
        waited += 0.2
    if failed.is_set():  # the peers' torchruns usually notice within seconds and say which rank died
        stop_waiting = time.monotonic() + PEER_FAILURE_GRACE_S
        while any(t.is_alive() for t in threads.values()) and time.monotonic() < stop_waiting:
            time.sleep(0.2)
    killed = [node for node in transports if threads[node].is_alive()]
    kill_everywhere(transports[node] for node in killed)
    for thread in threads.values():
        thread.join(HARNESS_GRACE_S + 20)
    first = next((node for node in order if not results[node].ok), None)
    if first is None and any(node not in results for node in transports):
        first = next(node for node in transports if node not in results)
    leftovers = find_leftovers(transports, marker)
    ordered = {node: results[node] for node in transports if node in results}
    return Launch(ordered, first, tuple(killed), leftovers, marker)


def leftover_argv(marker: str) -> list[str]:
    """pgrep for the marker; '[x]yz' never matches the pgrep's own wrappers' command lines."""
    return ["pgrep", "-a", "-f", f"[{marker[0]}]{marker[1:]}"]


def kill_marked_argv(marker: str) -> list[str]:
    """SIGKILL every process whose command line carries this run's unique marker, and only those."""
    return ["pkill", "-KILL", "-f", f"[{marker[0]}]{marker[1:]}"]


def find_leftovers(transports: Mapping[str, Transport], marker: str, *, tag: Optional[str] = None,
                   grace_s: float = LEFTOVER_GRACE_S) -> dict[str, str]:
    """node -> `pgrep -a` lines of processes still carrying the marker after a grace period.

    Every node at once. Ranks signalled by torchrun take a moment to exit, so a node is asked
    again until the grace is over; whatever is still there is killed by the marker and reported.
    With the launch's `tag` (a launch that no lease watches: srun_across), what carries the tag
    is killed as well and its own temporary directories (torchrun's log directory) go with it.
    """
    def look(transport: Transport) -> Result:
        deadline = time.monotonic() + grace_s
        while True:
            result = transport.run(leftover_argv(marker), timeout=LEFTOVER_CHECK_TIMEOUT_S)
            if not result.ok or not result.stdout.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if result.ok:
            transport.run(kill_marked_argv(marker), timeout=LEFTOVER_CHECK_TIMEOUT_S)
        if tag is not None:
            transport.run(kill_argv(tag, root=False), timeout=LEFTOVER_CHECK_TIMEOUT_S, label="cleanup")
        return result

    looked = fan_out(transports, look, name="leftovers")
    return {node: result.stdout.strip() for node, result in looked.items()
            if result.ok and result.stdout.strip()}


def route_toward(transport: Transport, peer_address: str) -> Result:
    """`ip -o route get` on the node toward a peer, its name resolved here as the launch gets it."""
    try:
        address = str(socket.getaddrinfo(peer_address, None)[0][4][0])
    except (socket.gaierror, IndexError):
        return Result(transport.node.name, "ip route get", None, "", "", 0.0, failure="error",
                      detail=f"cannot resolve {peer_address}")
    return transport.run(["ip", "-o", "route", "get", address], timeout=15)


def route_device(result: Result) -> Optional[str]:
    """The interface `ip -o route get` names (`dev X`), None when it ran badly or named none."""
    match = _ROUTE_DEV.search(result.stdout) if result.ok else None
    return match.group(1) if match else None


def socket_env(interfaces: Mapping[str, Optional[str]], override: Optional[str] = None,
               ) -> dict[str, dict[str, str]]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME per node: the override, else what was detected.

    A wrong interface (lo across nodes) makes Gloo's connectFullMesh fail, so nodes whose
    interface is unknown get none and leave the choice to the libraries.
    """
    env = {}
    for node, detected in interfaces.items():
        name = override or detected
        env[node] = {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name} if name else {}
    return env


def detect_interfaces(transports: Mapping[str, Transport], addresses: Mapping[str, str],
                      ) -> dict[str, Optional[str]]:
    """Each node's interface toward the next node in the list (the first toward the second),
    asked of every node at once.

    Toward a peer, not toward the rendezvous host: the rendezvous host would pick `lo` for itself.
    """
    nodes = list(transports)
    if len(nodes) < 2:
        return {node: None for node in nodes}
    peers = {node: addresses[nodes[(i + 1) % len(nodes)]] for i, node in enumerate(nodes)}
    routes = fan_out(transports, lambda transport: route_toward(transport, peers[transport.node.name]),
                     name="routes")
    return {node: route_device(routes[node]) for node in nodes}


def free_port(transport: Transport) -> int:
    """A port the kernel calls free on the rendezvous node right now; DEFAULT_PORT if it cannot say.

    A fixed port collides with anything the customer runs there (or a previous run's store
    still in TIME_WAIT); asking the node is what torchrun's own standalone mode does.
    """
    result = transport.run([transport.node.python, "-c", FREE_PORT_SCRIPT], timeout=15)
    text = result.stdout.strip()
    return int(text) if result.ok and text.isdigit() else DEFAULT_PORT


CommandOf = Callable[[str], Sequence[str]]  # the run's marker -> the command every rank runs


def run_on_node(transport: Transport, ranks: int, command_of: CommandOf, *, timeout: float,
                join_timeout_s: int = RENDEZVOUS_TIMEOUT_S) -> Result:
    """torchrun with one node and `ranks` local ranks; the rendezvous on the node's loopback."""
    marker = new_run_id()
    launcher = TorchrunLauncher(rdzv_id=marker, port=free_port(transport),
                                python=transport.node.python,
                                join_timeout_s=int(min(timeout, join_timeout_s)))
    return transport.run(launcher.argv(["localhost"], ranks, command_of(marker)), timeout=timeout,
                         env=LOOPBACK_ENV)


def run_across(transports: Mapping[str, Transport], addresses: Mapping[str, str],
               ranks_per_node: int, command_of: CommandOf, *, timeout: float,
               socket_ifname: Optional[str] = None, join_timeout_s: int = RENDEZVOUS_TIMEOUT_S) -> Launch:
    """torchrun on every node, the rendezvous on the first; one node's failure stops them all.

    Interfaces for Gloo/NCCL sockets: `socket_ifname` when given, else each node's route
    toward a peer.
    """
    nodes = list(transports)
    first = transports[nodes[0]]
    marker = new_run_id()
    launcher = TorchrunLauncher(rdzv_id=marker, port=free_port(first), python=first.node.python,
                                join_timeout_s=join_timeout_s)
    env = socket_env(detect_interfaces(transports, addresses) if not socket_ifname
                     else {node: None for node in nodes}, socket_ifname)
    hosts, command = [addresses[node] for node in nodes], command_of(marker)
    argv = {node: launcher.argv(hosts, ranks_per_node, command, on=addresses[node]) for node in nodes}
    if uses_srun(first.launch):
        assert first.launch is not None
        launch = srun_across(transports, argv, settings=first.launch, marker=marker, timeout=timeout,
                             env=env[nodes[0]])
    else:
        launch = launch_every(transports, argv, timeout=timeout, marker=marker, env=env)
    return dataclasses.replace(launch, rendezvous_timeout_s=join_timeout_s)


def srun_across(transports: Mapping[str, Transport], torchrun_argv: Mapping[str, Sequence[str]], *,
                settings: LaunchSettings, marker: str, timeout: float,
                env: Optional[Mapping[str, str]] = None) -> Launch:
    """torchrun on every node as one srun step (one task per node, torchrun starts the ranks),
    from this machine. Each task runs under the dispatcher, so each node's output comes back
    whole and apart (srun cuts long lines). The step is named by the run's marker, so a timeout
    or Ctrl-C cancels it; --kill-on-bad-exit ends the others when one node's torchrun fails;
    leftovers are looked for on every node afterwards, and what the step's tag marks (a torchrun
    killed where it hung, its log directory) is removed."""
    nodes = list(transports)
    tag = new_tag()  # no lease watches the step's tasks: the tag finds what they leave behind
    commands = {node: wrap(torchrun_argv[node], tag=tag, timeout=timeout, root=False, env=env) for node in nodes}
    python = transports[nodes[0]].node.python
    launcher = SrunLauncher(settings=settings, job_name=marker, time_min=minutes_for(timeout),
                            options=("--input=all",))
    argv = launcher.argv(nodes, 1, [python, "-c", DISPATCH])
    batch = json.dumps({"inputs": [], "nodes": {node: {"argv": commands[node], "stdin": None} for node in nodes}})
    step = run_here(argv, name=marker, timeout=timeout, node=nodes[0], stdin=batch)
    frames: dict[str, Frames] = {}
    for line in step.stdout.splitlines():
        read_frame(line, frames)
    failed = parse_launch_failures(step.stderr)
    results = {}
    for node in nodes:
        shown = shlex.join(argv[:argv.index("-c") + 1] + ["<dispatcher>", *commands[node]])
        found = frames.get(node, Frames())
        if found.end is not None:
            code, duration = found.end
            result = Result(node, "srun torchrun", code, found.text("out"), found.text("err"), duration,
                            timed_out=node_timed_out(code, duration, timeout))
        elif node in failed:
            result = Result(node, "srun torchrun", None, "", "", step.duration_s, failure="unreachable",
                            detail=f"Slurm could not start the task on {node}: {failed[node]}")
        else:
            result = Result(node, "srun torchrun", None, found.text("out"), found.text("err") or step.stderr,
                            step.duration_s, timed_out=step.timed_out, failure=step.failure or (
                                None if step.timed_out else "error"),
                            detail=step.detail or f"srun exited {step.exit_code} without {node}'s result: "
                                                  f"{last_line(step.stderr) or 'no message'}")
        results[node] = dataclasses.replace(result, full_command=shown)
    first = next((node for node in nodes if not results[node].ok), None)
    return Launch(results, first, (), find_leftovers(transports, marker, tag=tag), marker)
