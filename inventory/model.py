"""The typed form of an inventory: what the loader produces and everything else consumes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

HOST_KEY_POLICIES = ("strict", "accept-new")
TRANSPORTS = ("ssh", "local")
SCRATCH_KINDS = ("local", "shared")


@dataclass(frozen=True)
class SshSettings:
    """How to reach a node over SSH; None leaves the choice to ~/.ssh/config and ssh's defaults."""

    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None  # expanded, absolute
    known_hosts: Optional[str] = None  # expanded, absolute; None means ~/.ssh/known_hosts
    host_keys: str = "strict"  # one of HOST_KEY_POLICIES
    jump: Optional[str] = None  # [user@]host[:port], like ssh -J
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class Node:
    name: str  # the name in reports and pytest ids
    address: str  # what ssh connects to (defaults to the name, resolved as ssh resolves it)
    transport: str  # one of TRANSPORTS
    ssh: SshSettings = field(default_factory=SshSettings)
    python: str = "python3"  # interpreter for node-side payloads
    sudo: bool = False  # run commands that need root through `sudo -n`
    groups: tuple[str, ...] = ()
    # Where the node's data (Ethernet) network reaches it, for iperf3 between nodes; None: address.
    data_address: Optional[str] = None


@dataclass(frozen=True)
class ScratchPath:
    """A path the harness may write to (storage tests); nothing else is ever written."""

    path: str
    kind: str = "local"  # one of SCRATCH_KINDS
    destructive: bool = False


@dataclass(frozen=True)
class Reference:
    """A ReFrame-style reference band: value with signed fractional tolerances and a unit.

    lower/upper are fractions of value (lower <= 0 <= upper), None for unbounded; when value
    is 0 they are absolute bounds.
    """

    metric: str
    check: str
    value: float
    unit: str
    lower: Optional[float] = None
    upper: Optional[float] = None
    source: str = ""

    @property
    def low_bound(self) -> Optional[float]:
        if self.lower is None:
            return None
        return self.lower if self.value == 0 else self.value * (1 + self.lower)

    @property
    def high_bound(self) -> Optional[float]:
        if self.upper is None:
            return None
        return self.upper if self.value == 0 else self.value * (1 + self.upper)

    def admits(self, measured: float) -> bool:
        lo, hi = self.low_bound, self.high_bound
        return (lo is None or measured >= lo) and (hi is None or measured <= hi)

    def criterion(self) -> str:
        """The band as a person reads it, e.g. '>= 1.8 GiB' or '380 .. 395 Gb/s'."""
        lo, hi = self.low_bound, self.high_bound
        if lo is not None and hi is not None:
            return f"{lo:g} .. {hi:g} {self.unit}"
        if lo is not None:
            return f">= {lo:g} {self.unit}"
        if hi is not None:
            return f"<= {hi:g} {self.unit}"
        return f"any {self.unit} (reference {self.value:g})"

    def margin(self, measured: float) -> Optional[float]:
        """Distance to the nearest bound as a fraction of the reference value (negative: outside)."""
        scale = abs(self.value) or 1.0
        distances = []
        if self.low_bound is not None:
            distances.append((measured - self.low_bound) / scale)
        if self.high_bound is not None:
            distances.append((self.high_bound - measured) / scale)
        return min(distances) if distances else None


@dataclass(frozen=True)
class Profile:
    """Expected facts and metric references for one SKU."""

    name: str
    description: str
    mandatory: tuple[str, ...]  # check names that must have a result on every node
    expect: dict  # expected facts, e.g. {"os_id": ["debian", "ubuntu"]}
    references: dict[str, Reference]  # metric name -> reference
    source_path: str = ""


@dataclass(frozen=True)
class Cluster:
    name: str
    profile: Profile  # with the inventory's reference overrides applied
    transport: str
    nodes: tuple[Node, ...]
    groups: dict[str, tuple[str, ...]]  # group name -> node names
    scratch: tuple[ScratchPath, ...]
    source_path: str  # the inventory file, absolute
    digest: str  # sha256 of the inventory file's bytes
    # The interface multi-node jobs' sockets use (Gloo/NCCL bootstrap, mpirun's TCP); None: each
    # node's route toward its peers decides.
    launch_interface: Optional[str] = None

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)
