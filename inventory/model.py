"""The typed form of an inventory: what the loader produces and everything else consumes."""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Optional

HOST_KEY_POLICIES = ("strict", "accept-new")
TRANSPORTS = ("ssh", "local", "slurm")
# Who starts multi-node jobs: mpirun/torchrun over SSH from the nodes (default), or Slurm's srun.
ENGINES = ("default", "slurm")
SCRATCH_KINDS = ("local", "shared")
# The soak's load mix (runners/soak.py): a profile's `soak:` and --soak-mix override these
# defaults. Every CPU at half duty, one memory worker on a tenth of memory, unlimited iperf3,
# ib_write_bw on every active InfiniBand rail, the GPU burn where there are GPUs, unlimited fio
# on a 1 GiB file per node where a shared scratch path is declared; one figure a minute.
SOAK_MIX_DEFAULTS: dict[str, object] = {"cpu": 1, "cpu_workers": 0, "cpu_load": 50, "vm_workers": 1,
                                        "vm_bytes": "10%", "net_rate": "0", "ib": 1, "gpu": 1, "io": 1,
                                        "io_size": "1G", "io_rate": "0", "round_s": 60, "gpu_round_s": 300,
                                        "interval_s": 5}
SOAK_MIX_COUNTS = ("cpu", "cpu_workers", "cpu_load", "vm_workers", "ib", "gpu", "io")  # integers
# positive numbers; the other keys are text (sizes, rates). A GPU burn round restarts torch and
# remakes its inputs, seconds with the GPUs idle: its rounds are longer, so the GPUs stay loaded.
SOAK_MIX_SECONDS = ("round_s", "gpu_round_s", "interval_s")
# The text keys' forms, as the tools take them: stress-ng's --vm-bytes (b, k, m, g or a share of
# memory), iperf3's -b and fio's --size and --rate (k, m, g, t); 0 is no limit for the rates.
_SIZE = re.compile(r"[0-9]+[kmgtKMGT]?")
SOAK_MIX_FORMS = {
    "vm_bytes": (re.compile(r"[0-9]+[bkmgBKMG]?|[0-9]+%"), "a size such as 4G, or a share of memory such as 10%"),
    "net_rate": (_SIZE, "a rate such as 20M, or 0 for no limit"),
    "io_size": (_SIZE, "a size such as 1G"),
    "io_rate": (_SIZE, "a rate such as 100M, or 0 for no limit")}


def soak_mix_problem(key: str, value: object) -> Optional[str]:
    """What is wrong with a value of the soak's load mix, or None: the one rule a profile's `soak:`
    and --soak-mix share, so that a soak never starts with a round it cannot run (round_s=0 ran
    none, for a day)."""
    if key in SOAK_MIX_COUNTS:
        if key == "cpu_load" and not 0 <= value <= 100:  # type: ignore[operator]
            return f"expected 0 to 100 (% duty), got {value}"
        return f"expected 0 or more, got {value}" if value < 0 else None  # type: ignore[operator]
    if key in SOAK_MIX_SECONDS:
        seconds = float(value)  # type: ignore[arg-type]
        if math.isfinite(seconds) and seconds > 0:
            return None
        return f"expected a positive number of seconds, got {seconds:g}"
    pattern, form = SOAK_MIX_FORMS[key]
    return None if pattern.fullmatch(str(value)) else f"expected {form}, got {value!r}"


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
    # Where it sits (inventory `rack:`/`leaf:`, on the node or its group); None: not said.
    rack: Optional[str] = None
    leaf: Optional[str] = None
    # Where the node was listed: "yaml", "slurm.conf PATH partition NAME", "ansible PATH group NAME".
    source: str = "yaml"


# Where a node sits in the fabric, coarsest first (inventory `rack:`, `leaf:`): pair schedules,
# collectives, the soak's trends and the report's picture group by them.
PLACES = ("rack", "leaf")


def placement(nodes: Iterable[Node]) -> tuple[str, dict[str, Optional[str]]]:
    """How to group nodes by where they sit (see place_by), for the soak's trends."""
    return place_by({node.name: {"rack": node.rack, "leaf": node.leaf} for node in nodes})


def place_by(places: Mapping[str, Mapping[str, Optional[str]]]) -> tuple[str, dict[str, Optional[str]]]:
    """node -> {rack, leaf} -> (level, node -> its rack or leaf): by rack where the nodes sit in two
    places or more so (nodes placed nowhere are one), else by leaf; ("", {}) where neither tells
    them apart. The soak's trends and the report's picture group by it."""
    for level in PLACES:
        chosen = {name: at.get(level) or None for name, at in places.items()}
        if len(set(chosen.values())) >= 2:
            return level, chosen
    return "", {}


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
class Expectations:
    """The facts a profile's `expect:` declares; None is "not declared, not checked".

    Read by attribute (profile.expect.gpu_count), so a misspelt name fails loudly instead of
    silently disabling the check. The fields are the keys a profile may write: a suite that
    needs a new fact adds it here and its reader in inventory/loader.py (EXPECT_READERS).
    """

    os_ids: Optional[tuple[str, ...]] = None  # accepted os-release IDs
    kernel_min: Optional[str] = None  # lowest acceptable kernel release, e.g. "4.18"
    clock_synced: Optional[bool] = None  # the kernel's clock must be synchronized (NTP, chrony, PTP)
    cpu_model: Optional[str] = None  # pattern the CPU model name must match
    shared_fstypes: Optional[tuple[str, ...]] = None  # filesystem types a shared scratch path may have (lustre, nfs4)
    # GPU SKUs (suites/test_hardware.py); gpu_count present makes a missing NVML a failure.
    gpu_count: Optional[int] = None  # GPUs per node
    gpu_model: Optional[str] = None  # pattern NVML's device name must match
    ecc: Optional[bool] = None  # ECC must be enabled (checked unless false)
    ecc_correctable_max: Optional[int] = None  # aggregate correctable ECC errors above this warn
    pcie_gen: Optional[int] = None  # maximum PCIe link generation of every GPU
    pcie_width: Optional[int] = None  # maximum PCIe link width of every GPU
    nvlink_links: Optional[int] = None  # active NVLinks per GPU
    persistence_mode: Optional[bool] = None  # persistence mode on (true) or off (false) on every GPU
    mig_mode: Optional[bool] = None  # MIG mode on (true) or off (false) on every GPU
    compute_mode: Optional[str] = None  # every GPU's: Default, Exclusive_Process or Prohibited
    # GPU node configuration (suites/test_gpu_config.py); absent keys are not checked.
    nvswitch: Optional[bool] = None  # Fabric Manager active and every GPU's fabric state Completed
    gpudirect_rdma: Optional[bool] = None  # nvidia_peermem loaded
    pcie_acs_disabled: Optional[bool] = None  # no ACSCtl flag set on any PCIe bridge
    iommu_modes: Optional[tuple[str, ...]] = None  # modes accepted: off, passthrough, translated
    cpu_governor: Optional[str] = None  # scaling_governor of every CPU, e.g. performance
    numa_balancing: Optional[bool] = None  # kernel.numa_balancing on (true) or off (false)
    gpu_numa_nodes: Optional[tuple[int, ...]] = None  # in PCI address order
    nic_numa_nodes: Optional[tuple[int, ...]] = None  # mlx5_0, mlx5_1, ...
    driver_version: Optional[str] = None  # NVIDIA driver (/sys/module/nvidia/version)
    cuda_version: Optional[str] = None  # CUDA driver API version, e.g. "^13\\.0$"
    ofed_version: Optional[str] = None  # ofed_info -s (MLNX_OFED or DOCA)
    nic_firmware: Optional[str] = None  # fw_ver of every InfiniBand device
    vbios_version: Optional[str] = None  # Video BIOS of every GPU (/proc/driver/nvidia/gpus)
    container_toolkit: Optional[bool] = None  # nvidia-ctk / nvidia-container-cli installed
    # InfiniBand (suites/test_network.py); ib_hcas present makes a missing HCA a failure.
    ib_hcas: Optional[int] = None  # compute HCAs per node
    ib_ca_type: Optional[str] = None  # ibstat's CA type, e.g. MT4129 (ConnectX-7)
    ib_rate: Optional[float] = None  # Gb/s of every port: NDR 400
    ib_link_layer: Optional[str] = None  # of every port: InfiniBand or Ethernet
    # HPL (suites/test_hpc.py); hpl_flavour present makes a missing program a failure.
    hpl_flavour: Optional[str] = None  # hpl-nvidia, xhpl or hpcc
    hpl_nb: Optional[int] = None  # HPL block size NB (default: 1024 for HPL-NVIDIA, 192 on CPUs)
    fp64_peak_tflops: Optional[float] = None  # theoretical FP64 peak of one node, Tflop/s
    # Training (suites/test_training.py)
    training_straggler_fraction: Optional[float] = None  # a rank's forward pass this far above the median straggles
    isolation_budget_s: Optional[float] = None  # s to find the node(s) behind a low all-reduce or scaling (600)
    isolation_hang_floor_s: Optional[float] = None  # s before an isolation run can be cut as hung (60 or rendezvous)
    ib_symbol_errors_max: Optional[int] = None  # per port sysfs symbol_error above this fails (default 0)
    ib_link_downed_max: Optional[int] = None  # per port sysfs link_downed above this fails (default 0)
    ib_port_rcv_errors_max: Optional[int] = None  # per port sysfs port_rcv_errors above this fails (default 0)
    ib_bidirectional: Optional[bool] = None  # ib_write_bw pairs run with -b (both directions at once)
    ib_gpudirect: Optional[bool] = None  # perftest pairs use --use_cuda=<rail>: buffers on the rail's GPU
    pair_low_fraction: Optional[float] = None  # a pair this far below the median of all pairs is low (default 0.25)
    pair_all_max_nodes: Optional[int] = None  # full depth tests all pairs up to this many nodes (default 64)
    pair_sample_partners: Optional[int] = None  # above it, each node's partners across the fleet (default 8)

    def declared(self) -> dict:
        """The declared facts only, as JSON holds them (lists for tuples): the run header's form."""
        values = {item.name: getattr(self, item.name) for item in fields(self)}
        return {name: _as_json(value) for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class ExpectOverride:
    """An inventory's change to one fact of its profile's `expect:`, and why: a partial or test
    machine (one GPU of an eight-GPU SKU) is judged against what it is, and the report says so."""

    key: str  # an Expectations field
    value: Any  # as Expectations holds it; None: not checked on this cluster
    profile_value: Any  # what the profile declared; None: it did not declare the fact
    reason: str

    def as_dict(self) -> dict:
        """The run header's form (and results.json's run.expect_overrides): JSON lists for tuples."""
        return {"key": self.key, "value": _as_json(self.value),
                "profile_value": _as_json(self.profile_value), "reason": self.reason}


def _as_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class OutlierRule:
    """When a node's figure stands out from the same figure of its peers (reports/results.py).

    A node is an outlier on a metric when its robust z (distance from the nodes' median in
    scaled MADs) is above `z` and it is more than `min_deviation` (a fraction of the median)
    from the median, on the side that is bad for the metric, among at least `min_nodes` nodes:
    the z alone would flag the noise of a tight fleet, the deviation alone a spread-out one.
    An outlier is a warning, or a failure for the metrics named in `fail`; the metrics named in
    `ignore` are not judged (figures too noisy on the SKU to tell a node from its peers).
    """

    z: float = 3.5  # Iglewicz and Hoaglin's cut for the modified z-score
    min_deviation: float = 0.1
    min_nodes: int = 4
    fail: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """The run header's form (JSON: lists for fail and ignore)."""
        return {"z": self.z, "min_deviation": self.min_deviation, "min_nodes": self.min_nodes,
                "fail": list(self.fail), "ignore": list(self.ignore)}


@dataclass(frozen=True)
class Profile:
    """Expected facts and metric references for one SKU."""

    name: str
    description: str
    mandatory: tuple[str, ...]  # check names that must have a result on every node
    expect: Expectations  # expected facts; those the profile leaves out are None
    references: dict[str, Reference]  # metric name -> reference
    source_path: str = ""
    outliers: OutlierRule = field(default_factory=OutlierRule)  # the profile's `outliers:`
    soak_mix: dict[str, object] = field(default_factory=dict)  # the profile's `soak:` (SOAK_MIX_DEFAULTS' keys)


@dataclass(frozen=True)
class Waiver:
    """A known failure the delivery accepts: `check` on `nodes`, with why and who answers for it.

    A waived failure stays failed in the ledger and is shown as waived, never as passed; the
    verdict counts it apart and does not fail the gate on it. `expires` (an ISO date, the last
    day it holds) makes a forgotten waiver lapse: the failure counts again after it.
    """

    check: str
    nodes: tuple[str, ...]
    reason: str
    owner: str
    expires: Optional[str] = None  # YYYY-MM-DD, inclusive

    def covers(self, check: str, node: Optional[str], day: str) -> bool:
        """Whether a failure of `check` on `node` recorded on `day` (YYYY-MM-DD) is waived."""
        return (check == self.check and node in self._node_set
                and (self.expires is None or day <= self.expires))

    @functools.cached_property
    def _node_set(self) -> frozenset[str]:
        """The nodes as a set: a fleet-wide waiver is asked once per node, and the tuple is searched
        end to end."""
        return frozenset(self.nodes)

    def as_dict(self) -> dict:
        """The run header's form (and results.json's run.waivers)."""
        return {"check": self.check, "nodes": list(self.nodes), "reason": self.reason,
                "owner": self.owner, "expires": self.expires}


@dataclass(frozen=True)
class SignOff:
    """Who signs the delivery on paper; None leaves a blank line to write the name on."""

    engineer: Optional[str] = None  # the operator's engineer who ran the acceptance
    customer: Optional[str] = None  # who accepts the cluster for the customer


# torchrun's wait for every node of a run across nodes (its join_timeout, 600 s by default): a
# minute, so that a node that never joins fails the run soon; more where nodes start slowly.
RENDEZVOUS_TIMEOUT_S = 60
# A quick run across nodes has 600 s in all (suites/test_training.py, test_collectives.py): its
# rendezvous may take half of that at most, leaving the run the other half.
RENDEZVOUS_TIMEOUT_MAX_S = 300


@dataclass(frozen=True)
class LaunchSettings:
    """The inventory's `launch:`: the engine of multi-node jobs and, for Slurm, the allocation
    the harness asks for when it does not run inside one (SLURM_JOB_ID); None: Slurm's default."""

    engine: str = "default"  # one of ENGINES
    interface: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    reservation: Optional[str] = None
    time_limit_min: Optional[int] = None
    # How long torchrun waits for every node to join a run's rendezvous, and to reach its store.
    rendezvous_timeout_s: int = RENDEZVOUS_TIMEOUT_S
    # The Slurm job the run's steps go in: set by the harness once it holds its allocation
    # (runners.slurm.Allocation), never read from an inventory.
    allocation: Optional[str] = None


@dataclass(frozen=True)
class Cluster:
    name: str
    profile: Profile  # with the inventory's reference and expect overrides applied
    transport: str
    nodes: tuple[Node, ...]
    groups: dict[str, tuple[str, ...]]  # group name -> node names
    scratch: tuple[ScratchPath, ...]
    source_path: str  # the inventory file, absolute
    digest: str  # sha256 of the inventory file's bytes and of the slurm.conf/Ansible files its nodes: read
    # The interface multi-node jobs' sockets use (Gloo/NCCL bootstrap, mpirun's TCP); None: each
    # node's route toward its peers decides.
    launch_interface: Optional[str] = None
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    # The customer's or the contract's identifier of the cluster (`cluster_id:`); else the name.
    cluster_id: str = ""
    waivers: tuple[Waiver, ...] = ()
    sign_off: SignOff = field(default_factory=SignOff)
    # The inventory's `expect:` changes to the profile's facts, in written order, each with why.
    expect_overrides: tuple[ExpectOverride, ...] = ()

    @property
    def identity(self) -> str:
        """The cluster ID reports carry: the inventory's cluster_id, or the cluster's name."""
        return self.cluster_id or self.name

    def delivery(self) -> dict:
        """What the run header records for the delivery's paperwork: the cluster ID, the
        waivers in force and the names of the sign-off block."""
        return {"cluster_id": self.identity, "waivers": [w.as_dict() for w in self.waivers],
                "sign_off": {"engineer": self.sign_off.engineer, "customer": self.sign_off.customer}}

    def node(self, name: str) -> Node:
        return self._nodes_by_name[name]

    @functools.cached_property
    def _nodes_by_name(self) -> dict[str, Node]:
        """Name -> node, the first of that name: node() is asked once per node by many checks, and
        a search of the tuple made each of them grow with nodes x nodes."""
        by_name: dict[str, Node] = {}
        for node in self.nodes:
            by_name.setdefault(node.name, node)
        return by_name
