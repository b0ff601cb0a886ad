"""Real sshd "nodes" in network namespaces, so the harness's own tests talk SSH to real hosts.

Each node is a network namespace with an ``eth0`` veth on a private bridge in the root namespace,
and one sshd started inside it in its own UTS and mount namespaces: its own hostname, a generated
/etc/hosts naming every node, an empty /etc/resolv.conf and an empty root .bashrc (a slow login
shell would otherwise dominate every remote command). Nodes get no default route, so all they
can reach is each other and the bridge's address in the root namespace.

Names, with X the third octet of the cluster's 10.77.X.0/24: bridge ``hovbrX`` (address .254),
host-side veths ``hovXn<i>``, namespaces ``hov<pid>-X-<node name>``. Creating the bridge claims X.

Per-cluster files live in the workdir: ``client_ed25519`` (the identity), ``known_hosts``,
``authorized_keys``, ``hosts`` and, per node, ``<name>/`` with its host key, ``sshd_config``,
``sshd.pid`` and ``sshd.log`` (sshd's stderr).
"""
from __future__ import annotations

import atexit
import functools
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

SSHD = Path("/usr/sbin/sshd")
SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")
SSH_PORT = 22
NETNS_DIR = Path("/run/netns")
BRIDGE_HOST_OCTET = 254
VETH_RELEASE_TIMEOUT = 1.0  # seconds for the kernel to free a deleted namespace's veths
MAX_NODES = 253  # .1 .. .253 of a /24; .254 is the bridge
_HOSTNAME_LABEL = re.compile(r"^[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class NsNode:
    name: str
    address: str
    namespace: str
    veth_host: str  # the bridge-side end; eth0 is its peer inside the namespace
    sshd_pid: int


@functools.lru_cache(maxsize=1)
def netns_available() -> tuple[bool, str]:
    """Whether this machine can host a NamespaceCluster, and if not, why (for a skip reason)."""
    if os.geteuid() != 0:
        return False, "namespace nodes need root"
    for tool in ("ip", "unshare", "ssh-keygen"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed"
    if not SSHD.exists():
        return False, f"{SSHD} is missing (apt-get install openssh-server)"
    probe = f"hovprobe{os.getpid()}"
    added = _ip("netns", "add", probe)
    if added.returncode != 0:
        return False, f"`ip netns add` failed: {added.stderr.strip()}"
    _ip("netns", "del", probe)
    return True, ""


def _ip(*args: str, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True)


def _ip_batch(lines: list[str], *, force: bool = False) -> subprocess.CompletedProcess:
    """One `ip` process for many commands: spawning one per command is most of the start-up time."""
    argv = (["-force"] if force else []) + ["-batch", "-"]
    return _ip(*argv, stdin="".join(line + "\n" for line in lines))


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}")


def _link_names() -> set[str]:
    result = _ip("-j", "link", "show")
    _check(result, "ip link show")
    return {link["ifname"] for link in json.loads(result.stdout or "[]")}


def _ipv4_networks_in_use() -> list[ipaddress.IPv4Network]:
    result = _ip("-j", "-4", "addr", "show")
    _check(result, "ip addr show")
    return [
        ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
        for link in json.loads(result.stdout or "[]")
        for info in link.get("addr_info", [])
    ]


def _namespace_names() -> set[str]:
    try:
        return set(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return set()


def _node_processes(namespaces: list[str], sshd_pids: set[int]) -> set[int]:
    """PIDs in these network namespaces or descended from these sshds.

    sshd's sessions outlive it and keep its namespace (and veth) alive; descent still finds them
    when a namespace's name is already gone.
    """
    wanted = set()
    for name in namespaces:
        try:
            st = os.stat(NETNS_DIR / name)
        except OSError:
            continue
        wanted.add((st.st_dev, st.st_ino))
    in_namespaces, parent_of = set(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            parent_of[pid] = int(stat[stat.rindex(")") + 2:].split()[1])
            st = os.stat(f"/proc/{entry}/ns/net")
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) in wanted:
            in_namespaces.add(pid)
    descendants = set()
    for pid in parent_of:
        lineage, ancestor = [], pid
        while ancestor in parent_of and ancestor not in sshd_pids and len(lineage) < 64:
            lineage.append(ancestor)
            ancestor = parent_of[ancestor]
        if ancestor in sshd_pids:
            descendants.update(lineage)
    return (in_namespaces | descendants | sshd_pids) - {os.getpid()}


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _accepts_tcp(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


class NamespaceCluster:
    """N real sshd nodes, each in its own network namespace on a private bridge."""

    def __init__(self, workdir: Path, count: int, prefix: str = "node", start_timeout: float = 15.0):
        if not 1 <= count <= MAX_NODES:
            raise ValueError(f"count must be 1..{MAX_NODES}, got {count}")
        if not _HOSTNAME_LABEL.match(f"{prefix}{count}"):
            raise ValueError(f"prefix {prefix!r} does not make valid hostnames")
        self.workdir = Path(workdir).absolute()
        self.count = count
        self.prefix = prefix
        self.start_timeout = start_timeout
        self.identity_file = self.workdir / "client_ed25519"
        self.known_hosts = self.workdir / "known_hosts"
        self.nodes: list[NsNode] = []
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self._started = False
        # What exists (or may exist) on the machine; stop() removes exactly these.
        self._bridge: Optional[str] = None
        self._namespaces: list[str] = []
        self._veths: list[str] = []
        self._sshds: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "NamespaceCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def node_names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, self.count + 1)]

    def node(self, name: str) -> NsNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def node_dir(self, name: str) -> Path:
        return self.workdir / name

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "NamespaceCluster":
        """Bring every node up and return once each accepts TCP on port 22; a no-op when started."""
        if self._started:
            return self
        _LIVE.add(self)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        index = self._claim_bridge()
        self.subnet = ipaddress.ip_network(f"10.77.{index}.0/24")
        names = self.node_names()
        addresses = [str(self.subnet[i]) for i in range(1, len(names) + 1)]
        self._namespaces = [f"hov{os.getpid()}-{index}-{name}" for name in names]
        self._veths = [f"hov{index}n{i}" for i in range(1, len(names) + 1)]
        self._create_network(addresses)
        self._write_shared_files(names, addresses)
        for name, address in zip(names, addresses, strict=True):
            self._write_sshd_config(name, address)
        self._generate_keys(names)
        self._write_keys_files(names, addresses)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for name, namespace in zip(names, self._namespaces, strict=True):
            self._sshds[name] = self._launch_sshd(name, namespace)
        self.nodes = [
            NsNode(name=name, address=address, namespace=namespace, veth_host=veth, sshd_pid=self._sshds[name].pid)
            for name, address, namespace, veth in zip(names, addresses, self._namespaces, self._veths, strict=True)
        ]
        self.wait_until_listening()

    def _claim_bridge(self) -> int:
        """Pick a free 10.77.X.0/24; creating bridge hovbrX is the atomic claim between processes."""
        in_use = _ipv4_networks_in_use()
        links = _link_names()
        first = os.getpid() % 256
        for step in range(256):
            index = (first + step) % 256
            subnet = ipaddress.ip_network(f"10.77.{index}.0/24")
            bridge = f"hovbr{index}"
            if any(subnet.overlaps(net) for net in in_use):
                continue
            if bridge in links or any(link.startswith(f"hov{index}n") for link in links):
                continue
            added = _ip("link", "add", bridge, "type", "bridge")
            if added.returncode == 0:
                self._bridge = bridge
                return index
            if "exists" not in added.stderr:  # anything but losing the race to another process
                raise RuntimeError(f"ip link add {bridge} type bridge failed: {added.stderr.strip()}")
        raise RuntimeError("no free 10.77.X.0/24 subnet for a namespace cluster")

    def _create_network(self, addresses: list[str]) -> None:
        """Bridge with an address (so this process reaches the nodes), one veth and namespace per node."""
        bridge_address = f"{self.subnet[BRIDGE_HOST_OCTET]}/{self.subnet.prefixlen}"
        lines = [f"addr add {bridge_address} dev {self._bridge}", f"link set {self._bridge} up"]
        for namespace, veth in zip(self._namespaces, self._veths, strict=True):
            lines += [
                f"netns add {namespace}",
                f"link add {veth} type veth peer name eth0 netns {namespace}",
                f"link set {veth} master {self._bridge} up",
            ]
        _check(_ip_batch(lines), "creating the bridge, namespaces and veths")
        inside = [
            subprocess.Popen(
                ["ip", "-n", namespace, "-batch", "-"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for namespace in self._namespaces
        ]
        failures = []
        for namespace, address, proc in zip(self._namespaces, addresses, inside, strict=True):
            out, _ = proc.communicate(
                f"link set lo up\naddr add {address}/{self.subnet.prefixlen} dev eth0\nlink set eth0 up\n"
            )
            if proc.returncode != 0:
                failures.append(f"{namespace}: {out.strip()}")
        if failures:
            raise RuntimeError("configuring eth0 in the namespaces failed: " + "; ".join(failures))

    def _generate_keys(self, names: list[str]) -> None:
        """The client key and every host key, with all ssh-keygens running at once."""
        targets = [(self.identity_file, "handover-test-client")]
        targets += [(self.node_dir(name) / "ssh_host_ed25519_key", f"host-key-{name}") for name in names]
        procs = []
        for key, comment in targets:
            key.unlink(missing_ok=True)  # ssh-keygen would ask before overwriting
            key.with_suffix(".pub").unlink(missing_ok=True)
            procs.append(
                subprocess.Popen(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        failures = [f"{key}: {proc.communicate()[1].strip()}" for (key, _), proc in zip(targets, procs, strict=True)
                    if proc.wait() != 0]
        if failures:
            raise RuntimeError("ssh-keygen failed: " + "; ".join(failures))

    def _write_shared_files(self, names: list[str], addresses: list[str]) -> None:
        (self.workdir / "empty").write_text("")
        hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        hosts += "".join(f"{address}\t{name}\n" for name, address in zip(names, addresses, strict=True))
        (self.workdir / "hosts").write_text(hosts)

    def _write_keys_files(self, names: list[str], addresses: list[str]) -> None:
        pubkey = self.identity_file.with_suffix(".pub").read_text()
        (self.workdir / "authorized_keys").write_text(pubkey)
        lines = []
        for name, address in zip(names, addresses, strict=True):
            keytype, blob = (self.node_dir(name) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            lines.append(f"{address} {keytype} {blob}\n")
        self.known_hosts.write_text("".join(lines))

    def _write_sshd_config(self, name: str, address: str) -> None:
        node_dir = self.node_dir(name)
        node_dir.mkdir(exist_ok=True)
        settings = [
            ("ListenAddress", address),
            ("Port", str(SSH_PORT)),
            ("HostKey", node_dir / "ssh_host_ed25519_key"),
            ("PidFile", node_dir / "sshd.pid"),
            ("AuthorizedKeysFile", self.workdir / "authorized_keys"),
            ("PermitRootLogin", "prohibit-password"),
            ("PasswordAuthentication", "no"),
            ("KbdInteractiveAuthentication", "no"),
            ("UsePAM", "no"),
            ("StrictModes", "no"),
            ("MaxStartups", "100:30:200"),
            ("MaxSessions", "100"),
            ("Subsystem", f"sftp {SFTP_SERVER}"),  # fabric's put() needs it
            ("LogLevel", "ERROR"),
        ]
        lines = [f'{key} "{value}"\n' if isinstance(value, Path) else f"{key} {value}\n" for key, value in settings]
        (node_dir / "sshd_config").write_text("".join(lines))

    def _launch_sshd(self, name: str, namespace: str) -> subprocess.Popen:
        """Exec sshd in the node's namespaces; every step execs, so the Popen PID is sshd's."""
        empty = self.workdir / "empty"
        bashrc = Path(os.path.expanduser("~root")) / ".bashrc"
        q = shlex.quote
        script = "; ".join(
            [
                "set -e",
                f"hostname {q(name)}",
                f"if [ -e {q(str(bashrc))} ]; then mount --bind {q(str(empty))} {q(str(bashrc))}; fi",
                f"mount --bind {q(str(self.workdir / 'hosts'))} /etc/hosts",
                f"if [ -e /etc/resolv.conf ]; then mount --bind {q(str(empty))} /etc/resolv.conf; fi",
                f"exec {SSHD} -D -e -f {q(str(self.node_dir(name) / 'sshd_config'))}",
            ]
        )
        with open(self.node_dir(name) / "sshd.log", "ab") as log:
            return subprocess.Popen(
                ["ip", "netns", "exec", namespace,
                 "unshare", "--uts", "--mount", "--propagation", "private",
                 "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C to pytest must not kill nodes behind stop()'s back
            )

    def wait_until_listening(self) -> None:
        """Return once every node accepts TCP on port 22 (after start, or once links are up again)."""
        pending = list(self.nodes)
        deadline = time.monotonic() + self.start_timeout
        while pending:
            for node in list(pending):
                proc = self._sshds[node.name]
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"sshd on {node.name} exited with {proc.returncode}:\n"
                        + _tail(self.node_dir(node.name) / "sshd.log")
                    )
                if _accepts_tcp(node.address, SSH_PORT):
                    pending.remove(node)
            if not pending:
                return
            if time.monotonic() > deadline:
                node = pending[0]
                raise RuntimeError(
                    f"{len(pending)} node(s) not listening on port {SSH_PORT} after {self.start_timeout:g} s, "
                    f"e.g. {node.name} ({node.address}):\n" + _tail(self.node_dir(node.name) / "sshd.log")
                )
            time.sleep(0.01)

    def stop(self) -> None:
        """Remove everything start() made; parts already gone are fine, parts that remain raise."""
        sshd_pids = {proc.pid for proc in self._sshds.values() if proc.poll() is None}
        for pid in _node_processes(self._namespaces, sshd_pids):
            _kill(pid)
        for proc in self._sshds.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        existing = _namespace_names()
        doomed = [f"netns del {ns}" for ns in self._namespaces if ns in existing]
        if doomed:
            _ip_batch(doomed, force=True)
        # The kernel deletes a dead namespace's veth pairs itself, in one pass: about ten times
        # faster than `ip link del` for each. A namespace can stay held for seconds (seen after a
        # test deleted a veth by hand), so whatever is left after a short wait is deleted here.
        self._wait_for_links_to_go(self._veths, VETH_RELEASE_TIMEOUT)
        links = _link_names()
        stragglers = [f"link del {link}" for link in [*self._veths, self._bridge] if link and link in links]
        if stragglers:
            _ip_batch(stragglers, force=True)
        leftovers = self._leftovers()
        self._started = False
        if leftovers:  # stays in _LIVE so that the atexit pass tries again
            raise RuntimeError(f"namespace cluster teardown left: {', '.join(leftovers)}")
        _LIVE.discard(self)
        self._sshds.clear()
        self._bridge = None
        self._namespaces, self._veths = [], []

    @staticmethod
    def _wait_for_links_to_go(names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while names and set(names) & _link_names() and time.monotonic() < deadline:
            time.sleep(0.005)

    def processes(self) -> set[int]:
        """PIDs running on these nodes: in their namespaces or under their sshds."""
        return _node_processes(self._namespaces, {proc.pid for proc in self._sshds.values()})

    def _leftovers(self) -> list[str]:
        links = _link_names()
        namespaces = _namespace_names()
        left = [f"link {link}" for link in [*self._veths, self._bridge] if link and link in links]
        left += [f"netns {namespace}" for namespace in self._namespaces if namespace in namespaces]
        left += [f"sshd {proc.pid}" for proc in self._sshds.values() if proc.poll() is None]
        return left

    # -- breaking nodes --------------------------------------------------------------------

    def stop_sshd(self, name: str) -> None:
        """Kill the node's sshd: new connections are refused, the namespace stays up. Once, on a
        loaded machine, a connect still succeeded after the kill: most likely a child sshd had forked
        for a connection and not yet closed its copy of the listening socket (sshd.c closes it first
        thing in the child), and the kernel completes handshakes on it meanwhile. So this waits
        until the port refuses."""
        node = self.node(name)
        proc = self._sshds[node.name]
        _kill(proc.pid)
        proc.wait(timeout=5)
        deadline = time.monotonic() + self.start_timeout
        while _accepts_tcp(node.address, SSH_PORT):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}'s SSH port still accepts {self.start_timeout:g} s after its sshd "
                                   "was killed")
            time.sleep(0.05)

    def start_sshd(self, name: str) -> None:
        """Start a node's sshd again after stop_sshd, in the namespace it had, and wait for it."""
        node = self.node(name)
        self._sshds[node.name] = self._launch_sshd(node.name, node.namespace)
        deadline = time.monotonic() + self.start_timeout
        while not _accepts_tcp(node.address, SSH_PORT):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {name} not listening again:\n" + _tail(self.node_dir(name) / "sshd.log"))
            time.sleep(0.05)

    def firewall(self, name: str, ruleset: str) -> None:
        """Load an nftables ruleset in the node's namespace only (nft -f -)."""
        subprocess.run(["ip", "netns", "exec", self.node(name).namespace, "nft", "-f", "-"], input=ruleset,
                       text=True, check=True)

    def link_down(self, name: str) -> None:
        """Take the node's bridge port down: packets are dropped, so connects time out."""
        _check(_ip("link", "set", self.node(name).veth_host, "down"), f"link down {name}")

    def link_up(self, name: str) -> None:
        _check(_ip("link", "set", self.node(name).veth_host, "up"), f"link up {name}")

    def node_exec(self, name: str, argv: list[str], *, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
        """Run argv in the node's network namespace (the host's hostname, /etc and ~/.bashrc)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.node(name).namespace, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    # -- inventory ---------------------------------------------------------------------------

    def write_inventory(
        self,
        path: Path,
        *,
        profile: str = "cpu-only",
        nodes: Optional[list[str]] = None,
        host_keys: str = "strict",
        known_hosts: Optional[Path] = None,
        extra: Optional[dict] = None,
    ) -> Path:
        """Write an inventory YAML for these nodes (or the named subset, in that order)."""
        chosen = [self.node(name) for name in nodes] if nodes is not None else list(self.nodes)
        data = {
            "cluster": "nscluster",
            "profile": profile,
            "transport": "ssh",
            "ssh": {
                "user": "root",
                "port": SSH_PORT,
                "identity_file": str(self.identity_file),
                "known_hosts": str(Path(known_hosts).absolute() if known_hosts else self.known_hosts),
                "host_keys": host_keys,
                "connect_timeout": 5,
            },
            # Nodes share this filesystem, and their empty .bashrc leaves PATH minimal.
            "python": sys.executable,
            "nodes": [{"name": node.name, "address": node.address} for node in chosen],
        }
        data.update(extra or {})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


_LIVE: set[NamespaceCluster] = set()


@atexit.register
def _stop_live_clusters() -> None:
    """Last resort when a session ends without stop(): leaked namespaces outlive the process."""
    for cluster in list(_LIVE):
        try:
            cluster.stop()
        except Exception as exc:  # keep tearing down the others
            print(f"netns: stopping cluster in {cluster.workdir} failed: {exc}", file=sys.stderr)


# -- Slurm on the namespace nodes --------------------------------------------------------------

SLURMCTLD = Path("/usr/sbin/slurmctld")
SLURMD = Path("/usr/sbin/slurmd")
MUNGED = Path("/usr/sbin/munged")
SLURM_CLIENTS = ("srun", "sinfo", "scontrol", "scancel", "squeue")
SLURM_RUN_DIR = Path("/run/handover-slurm")  # munged (as munge) must reach its files: not under /tmp/pytest-of-root


@functools.lru_cache(maxsize=1)
def slurm_available() -> tuple[bool, str]:
    """Whether munged, slurmctld, slurmd and the clients are installed, and if not, why."""
    for daemon in (MUNGED, SLURMCTLD, SLURMD):
        if not daemon.exists():
            return False, f"{daemon} is missing (apt-get install munge slurmctld slurmd slurm-client)"
    for tool in (*SLURM_CLIENTS, "nsenter", "runuser"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed"
    return True, ""


def _free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


class SlurmCluster:
    """munged, slurmctld (in the root namespace, on the bridge) and one slurmd per namespace node.

    The daemons run as root from their own slurm.conf (`SLURM_CONF`, see `env`), with their own
    munge socket, key, ports, state and spool directories, so several can run on one machine.
    Each slurmd runs in its node's network namespace through nsenter (`ip netns exec` would hide
    /sys/fs/cgroup), with the node's hostname, hosts file and empty .bashrc, like its sshd.
    SlurmdTimeout is short, so a stopped slurmd is `down*` (Not responding) within seconds.
    """

    def __init__(self, nodes: NamespaceCluster, *, partition: str = "debug", slurmd_timeout_s: int = 4,
                 start_timeout: float = 60.0, topology: Optional[str] = None):
        if not nodes.nodes:
            raise ValueError("start the namespace cluster first")
        self.nodes = nodes
        self.partition = partition
        self.topology = topology  # topology.conf's text, for TopologyPlugin=topology/tree; None: none
        self.slurmd_timeout_s = slurmd_timeout_s
        self.start_timeout = start_timeout
        self.dir = SLURM_RUN_DIR / f"{os.getpid()}-{nodes.subnet.network_address.packed[2]}"
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self._munged: Optional[subprocess.Popen] = None
        self._slurmctld: Optional[subprocess.Popen] = None
        self._slurmds: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> "SlurmCluster":
        _LIVE_SLURM.add(self)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "munge").mkdir(parents=True)
        (self.dir / "state").mkdir()
        for node in self.nodes.nodes:
            (self.dir / f"tmp-{node.name}").mkdir(mode=0o1777)
        os.chmod(SLURM_RUN_DIR, 0o755)
        os.chmod(self.dir, 0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        subprocess.run(["chown", "-R", "munge:munge", str(self.dir / "munge")], check=True)
        munge_dir = self.dir / "munge"
        self._munged = subprocess.Popen(
            ["runuser", "-u", "munge", "--", str(MUNGED), "--foreground", f"--socket={self.socket}",
             f"--key-file={key}", f"--pid-file={munge_dir / 'munged.pid'}",
             f"--log-file={munge_dir / 'munged.log'}", f"--seed-file={munge_dir / 'munged.seed'}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self._wait_for(lambda: self.socket.exists(), "munged's socket", munge_dir / "munged.log")
        self.conf.write_text(self._config())
        if self.topology is not None:
            (self.dir / "topology.conf").write_text(self.topology)
        with open(self.dir / "slurmctld.out", "ab") as out:
            self._slurmctld = subprocess.Popen(
                [str(SLURMCTLD), "-D", "-i", "-f", str(self.conf)], env=self.env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for node in self.nodes.nodes:
            self._slurmds[node.name] = self._launch_slurmd(node)
        self._wait_for(lambda: self.states() == {n.name: "idle" for n in self.nodes.nodes},
                       "every node idle in sinfo", self.dir / "slurmctld.log")

    def _config(self) -> str:
        bridge = str(self.nodes.subnet[BRIDGE_HOST_OCTET])
        d = self.dir
        lines = [
            "ClusterName=handover",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({bridge})",
            f"SlurmctldPort={_free_tcp_port()}",
            "SlurmdPort=6818",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool-%n'}",
            # The nodes share /tmp; PMIx's per-step directories (spmix_appdir_UID_JOB.STEP) go
            # under TmpFS, which must therefore differ per node.
            f"TmpFS={d / 'tmp-%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none",
            "ReturnToService=2", f"SlurmdTimeout={self.slurmd_timeout_s}", "InactiveLimit=0",
            "KillWait=2", "MinJobAge=5", "SlurmdParameters=config_overrides",
            *(["TopologyPlugin=topology/tree"] if self.topology is not None else []),
        ]
        lines += [f"NodeName={node.name} NodeAddr={node.address} CPUs=16 State=UNKNOWN"
                  for node in self.nodes.nodes]
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE "
                     "State=UP OverSubscribe=FORCE:16")
        return "\n".join(lines) + "\n"

    def _launch_slurmd(self, node: NsNode) -> subprocess.Popen:
        """Exec slurmd in the node's network namespace, with its hostname and hosts file."""
        workdir = self.nodes.workdir
        bashrc = Path(os.path.expanduser("~root")) / ".bashrc"
        q = shlex.quote
        script = "; ".join([
            "set -e",
            f"hostname {q(node.name)}",
            f"if [ -e {q(str(bashrc))} ]; then mount --bind {q(str(workdir / 'empty'))} {q(str(bashrc))}; fi",
            f"mount --bind {q(str(workdir / 'hosts'))} /etc/hosts",
            f"exec {SLURMD} -D -N {q(node.name)} -f {q(str(self.conf))}",
        ])
        with open(self.dir / f"slurmd-{node.name}.out", "ab") as out:
            return subprocess.Popen(
                ["nsenter", f"--net={NETNS_DIR / node.namespace}", "unshare", "--uts", "--mount",
                 "--propagation", "private", "sh", "-c", script],
                env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def _wait_for(self, ready, what: str, log: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm: no {what} after {self.start_timeout:g} s:\n{_tail(log)}")
            time.sleep(0.2)

    def client(self, *argv: str) -> subprocess.CompletedProcess:
        """A Slurm client command (sinfo, squeue, scontrol) against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=60)

    def states(self) -> dict[str, str]:
        """node -> its state as `sinfo -N -o %t` prints it (idle, alloc, down*, drain, ...)."""
        done = self.client("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)

    def steps(self) -> list[str]:
        """Running job steps (`squeue -s`), as `STEPID NAME NODES` lines."""
        done = self.client("squeue", "-h", "-s", "-o", "%i %j %N")
        return [line for line in done.stdout.splitlines() if line.strip()]

    def jobs(self) -> list[str]:
        """Jobs in squeue, whatever their state, as `JOBID NAME STATE` lines."""
        done = self.client("squeue", "-h", "-o", "%i %j %T")
        return [line for line in done.stdout.splitlines() if line.strip()]

    def kill_slurmd(self, name: str) -> None:
        """Kill the node's slurmd (again: a no-op); slurmctld notices within a few SlurmdTimeouts."""
        proc = self._slurmds[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def start_slurmd(self, name: str) -> None:
        """Start the node's slurmd again (after kill_slurmd); ReturnToService=2 gives the node back."""
        self.kill_slurmd(name)
        self._slurmds[name] = self._launch_slurmd(self.nodes.node(name))

    def stop_slurmd(self, name: str, *, wait_for: str = "down*") -> None:
        """Kill the node's slurmd and wait until slurmctld calls it `wait_for` (not responding)."""
        self.kill_slurmd(name)
        self._wait_for(lambda: self.states().get(name) == wait_for, f"{name} {wait_for}",
                       self.dir / "slurmctld.log")

    def stop(self) -> None:
        """Stop every daemon this cluster started, by its PID; their files go with the directory."""
        for proc in [*self._slurmds.values(), self._slurmctld, self._munged]:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        self._slurmds.clear()
        self._slurmctld = self._munged = None
        shutil.rmtree(self.dir, ignore_errors=True)
        _LIVE_SLURM.discard(self)


_LIVE_SLURM: set[SlurmCluster] = set()


@atexit.register
def _stop_live_slurm() -> None:
    """Slurm daemons outlive the test process otherwise (each in its own session)."""
    for cluster in list(_LIVE_SLURM):
        cluster.stop()
