"""Read an inventory file and its SKU profile into the typed model, rejecting anything doubtful.

Operators write these files by hand shortly before a customer handover. A typo that was silently
ignored would test the wrong thing and sign off on it, so every key is checked, and every error
names the file, the line and the field.

The YAML is composed (not constructed) with PyYAML's safe loader and walked node by node: that
keeps every line number, and it lets fields declared as strings take a scalar exactly as written
(a node named `no` stays "no", a kernel version `4.10` stays "4.10" rather than becoming 4.1).
"""
from __future__ import annotations

import ast
import dataclasses
import datetime
import difflib
import functools
import hashlib
import ipaddress
import math
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence, Union

import hostlist
import yaml
from yaml.constructor import ConstructorError, SafeConstructor

from inventory.metrics import checks_recording, known_metrics
from inventory.model import (
    ENGINES,
    HOST_KEY_POLICIES,
    PLACES,
    RENDEZVOUS_TIMEOUT_MAX_S,
    SCRATCH_KINDS,
    SOAK_MIX_COUNTS,
    SOAK_MIX_DEFAULTS,
    SOAK_MIX_SECONDS,
    TRANSPORTS,
    Cluster,
    Expectations,
    ExpectOverride,
    LaunchSettings,
    Node,
    OutlierRule,
    Profile,
    Reference,
    ScratchPath,
    SignOff,
    SshSettings,
    Waiver,
    soak_mix_problem,
)
from inventory.source_error import SourceFileError, quoted

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
# The suites ship beside this package; their check names are read from the files, not imported.
SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"

# Cluster, group, node, profile and metric names end up in pytest ids and report anchors.
# Names become file and folder names (out/<cluster>/, raw/<step>/<node>.stdout): at most 200
# characters leaves room in a file system's 255 for what the harness adds. A node's name is its
# address when it gives none, a word on ssh's, mpirun's and ib_write_bw's command lines: a first
# '-' would make it an option there (-Efile: ssh logging to a file on the node).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
NAME_RULE = "use letters, digits, '.', '_' and '-' (a letter, digit or '_' first), at most 200 of them"
# An address or a login, wherever it comes from: a host name or IP address, a plain login; nothing
# that ssh, or mpirun's host list handed to ssh, would read as an option or split (`-oProxyCommand=`,
# `a,b`, blanks).
ADDRESS_PATTERN = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]*")
USER_PATTERN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@$\\-]*")

SSH_KEYS = ("user", "port", "identity_file", "known_hosts", "host_keys", "jump", "connect_timeout")
NODE_SETTING_KEYS = SSH_KEYS + ("python", "sudo") + PLACES
# These may be set to null in a group or node mapping to undo a cluster-wide value (e.g. no jump).
NULLABLE_SETTINGS = ("user", "port", "identity_file", "known_hosts", "jump")

TOP_LEVEL_KEYS = (
    "cluster", "profile", "transport", "python", "sudo", "ssh", "nodes", "groups", "scratch",
    "references", "launch", "cluster_id", "waivers", "sign_off", "expect",
)
LAUNCH_KEYS = ("interface", "engine", "rendezvous_timeout_s", "partition", "account", "reservation", "time_limit")
SLURM_LAUNCH_KEYS = ("partition", "account", "reservation", "time_limit")
NODE_KEYS = ("name", "address", "data_address") + NODE_SETTING_KEYS
GROUP_KEYS = ("nodes",) + NODE_SETTING_KEYS
SCRATCH_KEYS = ("path", "kind", "destructive")
WAIVER_KEYS = ("check", "nodes", "reason", "owner", "expires")
WAIVER_REQUIRED = ("check", "nodes", "reason", "owner")
SIGN_OFF_KEYS = ("engineer", "customer")
PROFILE_KEYS = ("profile", "description", "mandatory", "expect", "references", "outliers", "soak")
OUTLIER_KEYS = ("z", "min_deviation", "min_nodes", "fail", "ignore")
REFERENCE_KEYS = ("check", "value", "lower", "upper", "unit", "source")
# What a metric new to the profile must give; lower/upper default to unbounded, source to the file.
REFERENCE_REQUIRED = ("check", "value", "unit")
# An inventory's change to one of its profile's expected facts: the new value and why.
EXPECT_OVERRIDE_KEYS = ("value", "reason")

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_SCALAR_CONSTRUCTOR = SafeConstructor()


class InventoryError(Exception):
    """A problem in an inventory or profile file; str() is one self-contained line for the CLI."""

    def __init__(
        self,
        problem: str,
        file: Optional[str] = None,
        line: Optional[int] = None,
        field: Optional[str] = None,
    ):
        self.problem = problem
        self.file = file
        self.line = line
        self.field = field
        super().__init__(problem, file, line, field)

    def __str__(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(self.file if self.line is None else f"{self.file}:{self.line}")
        if self.field:
            parts.append(self.field)
        parts.append(self.problem)
        return ": ".join(parts)


@dataclass(frozen=True)
class _Source:
    """One YAML file being read: how errors name it and where its relative paths start."""

    display: str
    directory: Path


@dataclass(frozen=True)
class _At:
    """A composed YAML node plus its file and field path, so any check on it can raise precisely."""

    node: yaml.Node
    source: _Source
    field: Optional[str]
    key_line: Optional[int] = None  # the line of the key this value belongs to, if any

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, problem: str) -> InventoryError:
        return InventoryError(problem, self.source.display, self.line, self.field)

    def whole_error(self, problem: str) -> InventoryError:
        """An error about the whole value, shown at its key (a block mapping starts a line below)."""
        return InventoryError(problem, self.source.display, self.key_line or self.line, self.field)

    def key(self, name: str, node: yaml.Node, key_line: Optional[int] = None) -> "_At":
        field = name if self.field is None else f"{self.field}.{name}"
        return _At(node, self.source, field, key_line)

    def item(self, index: int, node: yaml.Node) -> "_At":
        return _At(node, self.source, f"{self.field}[{index}]")

    def is_null(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode) and self.node.tag == _NULL


class _Setting(NamedTuple):
    """A parsed value and where it was written, kept so later cross-checks can point back at it."""

    value: Any  # what the field's reader returned: its type is the reader's
    at: _At


# ---------------------------------------------------------------- YAML node readers


def _describe(at: _At) -> str:
    """What a wrong value looks like in an error: the scalar as written, or its kind."""
    node = at.node
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    if node.tag == _STR:
        return quoted(node.value)
    return node.value


def _wrong_type(at: _At, expected: str) -> InventoryError:
    return at.error(f"expected {expected}, got {_describe(at)}")


def _scalar_value(at: _At) -> Any:
    """The Python value of a scalar as the safe loader would build it."""
    construct = SafeConstructor.yaml_constructors.get(at.node.tag)
    if construct is None or not isinstance(at.node, yaml.ScalarNode):
        raise at.error(f"unsupported YAML tag {at.node.tag!r}")
    try:
        return construct(_SCALAR_CONSTRUCTOR, at.node)
    except (ConstructorError, ValueError) as exc:
        raise at.error(f"unreadable value {at.node.value!r}: {exc}") from None


_MERGE = "tag:yaml.org,2002:merge"


def _read_mapping(at: _At) -> list[tuple[str, _At, _At]]:
    """(key, key node, value node) in written order; duplicate keys are an error, `<<:` merges."""
    if not isinstance(at.node, yaml.MappingNode):
        raise _wrong_type(at, "a mapping")
    seen: dict[str, int] = {}
    for key_node, _ in at.node.value:
        if key_node.tag == _MERGE:
            continue
        _check_key(at, key_node)
        if key_node.value in seen:
            raise at.key(key_node.value, key_node).error(
                f"duplicate key; first given at line {seen[key_node.value]}"
            )
        seen[key_node.value] = key_node.start_mark.line + 1
    entries: dict[str, tuple[_At, _At]] = {}
    for key_node, value_node in _merged_pairs(at, at.node, set()):
        key_at = at.key(key_node.value, key_node)
        entries[key_node.value] = (key_at, at.key(key_node.value, value_node, key_at.line))
    return [(name, key_at, value_at) for name, (key_at, value_at) in entries.items()]


def _check_key(at: _At, key_node: yaml.Node) -> None:
    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _NULL:
        raise _At(key_node, at.source, at.field).error("keys must be plain names")


def _merged_pairs(at: _At, node: yaml.MappingNode, active: set[int],
                  read: Optional[dict[int, list[tuple]]] = None) -> list[tuple]:
    """Key/value node pairs with `<<:` merges spliced in first, so later (own) keys win: each key
    once, where it first came, with the value that wins.

    Done here rather than with PyYAML's flatten_mapping, which rewrites the shared anchored nodes.
    Each mapping is read once however often it is merged, so a document that merges one anchor
    many times over, level upon level, costs what its text does, not a power of it.
    """
    read = {} if read is None else read
    if id(node) in read:
        return read[id(node)]
    if id(node) in active:
        raise at.error("a `<<:` merge refers to itself")
    pairs: dict[str, tuple] = {}
    own: list[tuple] = []
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE:
            own.append((key_node, value_node))
            continue
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        # Of several merged mappings the first one wins, so it is spliced in last.
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                raise _At(source, at.source, at.field).error(
                    "`<<:` must merge a mapping or a list of mappings"
                )
            for key_node, value_node in _merged_pairs(at, source, active | {id(node)}, read):
                pairs[key_node.value] = (key_node, value_node)
    for key_node, value_node in own:
        _check_key(at, key_node)
        pairs[key_node.value] = (key_node, value_node)
    read[id(node)] = list(pairs.values())
    return read[id(node)]


def _fields(at: _At, allowed: Sequence[str], required: Sequence[str] = ()) -> dict[str, _At]:
    """A mapping with a fixed set of keys: unknown ones get a did-you-mean, missing ones named."""
    children = {}
    for name, key_at, value_at in _read_mapping(at):
        if name not in allowed:
            raise key_at.error(_unknown("unknown key", name, allowed))
        children[name] = value_at
    for name in required:
        if name not in children:
            raise at.whole_error(f"missing required key {name!r}")
    return children


def _unknown(head: str, given: str, choices: Iterable[str], listing: Optional[str] = None) -> str:
    """head, a did-you-mean when one is close, then '<listing>: ...' of all choices.

    Unknown keys get just the hint when there is one; unknown values (listing given) always show
    every choice.
    """
    choices = list(choices)
    close = difflib.get_close_matches(given, choices, n=1)
    tail = [f"did you mean {close[0]!r}?"] if close else []
    if listing or not close:
        tail.append(f"{listing or 'allowed'}: {', '.join(choices) or '(none)'}")
    return f"{head}; {' '.join(tail)}"


def _list(at: _At) -> list[_At]:
    if not isinstance(at.node, yaml.SequenceNode):
        raise _wrong_type(at, "a list")
    return [at.item(index, node) for index, node in enumerate(at.node.value)]


def _string(at: _At) -> str:
    """A non-empty string; other scalars are taken as written, so `no` and `4.10` stay text."""
    if not isinstance(at.node, yaml.ScalarNode) or at.node.tag == _NULL:
        raise _wrong_type(at, "a string")
    if at.node.tag != _STR:
        _scalar_value(at)  # rejects unknown tags such as !vault
    if not at.node.value.strip():
        raise at.error("must not be empty")
    return at.node.value


def _name(at: _At, what: str) -> str:
    value = _string(at)
    if not NAME_PATTERN.fullmatch(value):
        raise at.error(f"invalid {what} {value!r}; {NAME_RULE}")
    return value


def _choice(at: _At, what: str, allowed: Sequence[str]) -> str:
    value = _string(at)
    if value not in allowed:
        raise at.error(_unknown(f"unknown {what} {value!r}", value, allowed, "allowed"))
    return value


def _integer(at: _At) -> int:
    if not isinstance(at.node, yaml.ScalarNode) or at.node.tag != _INT:
        raise _wrong_type(at, "an integer")
    return _scalar_value(at)


def _checked(read: Callable[[_At], Any], ok: Callable[[Any], bool], expected: str) -> Callable[[_At], Any]:
    """read, refusing a value that is not ok: 'expected <expected>, got <as written>'."""
    def checked(at: _At) -> Any:
        value = read(at)
        if not ok(value):
            raise at.error(f"expected {expected}, got {at.node.value}")
        return value
    return checked


# All pairs grow with nodes x nodes: 128 nodes are 8,128 pairs in 127 rounds (the default 64: 2,016 in 63).
PAIR_ALL_MAX_NODES_MOST = 128
# The sample is partners / 2 pairs a node: 32 give 16N (16,384 at 1,024 nodes; the default 8: 4N).
PAIR_SAMPLE_PARTNERS_MOST = 32


def _pair_count(most: int, why: str) -> Callable[[_At], int]:
    """A reader of a count of nodes or partners for pair schedules: a pair needs two, and above
    `most` the pairs measured, and results.json, would grow with nodes x nodes."""
    def read(at: _At) -> int:
        value = _integer(at)
        if value < 2:
            raise at.error(f"{value} is too few; a pair needs at least 2")
        if value > most:
            raise at.error(f"{value} is too many; at most {most}, {why}")
        return value
    return read


def _number(at: _At) -> float:
    if not isinstance(at.node, yaml.ScalarNode) or at.node.tag not in (_INT, _FLOAT):
        raise _wrong_type(at, "a number")
    value = float(_scalar_value(at))
    if not math.isfinite(value):
        raise at.error(f"expected a finite number, got {at.node.value}")
    return value


def _optional_number(at: _At) -> Optional[float]:
    return None if at.is_null() else _number(at)


def _boolean(at: _At) -> bool:
    if not isinstance(at.node, yaml.ScalarNode) or at.node.tag != _BOOL:
        raise _wrong_type(at, "true or false")
    return _scalar_value(at)


def _string_list(at: _At) -> tuple[str, ...]:
    return tuple(_string(item) for item in _list(at))


def _version(at: _At) -> str:
    value = _string(at)
    if not re.fullmatch(r"\d+(\.\d+)*", value):
        raise at.error(f"expected a dotted version like '4.18', got {quoted(value)}")
    return value


def _regex(at: _At) -> str:
    value = _string(at)
    try:
        re.compile(value)
    except re.error as exc:
        raise at.error(f"invalid regular expression {value!r}: {exc}") from None
    return value


def _compose(path: Path, display: str) -> tuple[bytes, Optional[yaml.Node]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError("no such file", display) from None
    except IsADirectoryError:
        raise InventoryError("is a directory, not a YAML file", display) from None
    except OSError as exc:
        raise InventoryError(f"cannot read: {exc.strerror}", display) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"not UTF-8 text (byte {exc.start})", display) from None
    try:
        return data, yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "unreadable"
        line = mark.line + 1 if mark is not None else None
        raise InventoryError(f"YAML syntax error: {problem}", display, line) from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"YAML error: {exc}", display) from None


def _document(path: Path, what: str) -> tuple[bytes, _At]:
    """The file's bytes and its top-level mapping."""
    display = _display_path(path)
    data, root = _compose(path, display)
    if root is None:
        raise InventoryError(f"empty file; expected {what}", display)
    at = _At(root, _Source(display, Path(os.path.abspath(path)).parent), None)
    if not isinstance(root, yaml.MappingNode):
        raise at.error(f"expected {what}, got {_describe(at)}")
    return data, at


def _display_path(path: Path) -> str:
    """The path relative to the working directory when it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


# ---------------------------------------------------------------- profiles

_count = _checked(_integer, lambda value: value >= 0, "0 or more")  # GPUs, links, errors allowed
_positive_integer = _checked(_integer, lambda value: value >= 1, "1 or more")  # PCIe gen, width, block
_positive_number = _checked(_number, lambda value: value > 0, "a number above 0")  # rates, peaks, budgets


# How each Expectations field is read and validated, by name; the names a profile's `expect:`
# may use are the dataclass's fields (EXPECT_KEYS).
EXPECT_READERS: dict[str, Callable[[_At], Any]] = {
    "os_ids": _string_list,
    "kernel_min": _version,
    "clock_synced": _boolean,
    "cpu_model": _regex,
    "shared_fstypes": _string_list,
    "gpu_count": _count,
    "gpu_model": _regex,
    "ecc": _boolean,
    "ecc_correctable_max": _count,
    "pcie_gen": _positive_integer,
    "pcie_width": _positive_integer,
    "nvlink_links": _count,
    "persistence_mode": _boolean,
    "mig_mode": _boolean,
    "compute_mode": lambda at: _choice(at, "compute mode", ("Default", "Exclusive_Process", "Prohibited")),
    "nvswitch": _boolean,
    "gpudirect_rdma": _boolean,
    "pcie_acs_disabled": _boolean,
    "iommu_modes": lambda at: tuple(_choice(item, "IOMMU mode", ("off", "passthrough", "translated"))
                                    for item in _list(at)),
    "cpu_governor": _string,
    "numa_balancing": _boolean,
    "gpu_numa_nodes": lambda at: tuple(_count(item) for item in _list(at)),
    "nic_numa_nodes": lambda at: tuple(_count(item) for item in _list(at)),
    "driver_version": _regex,
    "cuda_version": _regex,
    "ofed_version": _regex,
    "nic_firmware": _regex,
    "vbios_version": _regex,
    "container_toolkit": _boolean,
    "ib_hcas": _count,
    "ib_ca_type": _string,
    "ib_rate": _positive_number,
    "ib_link_layer": lambda at: _choice(at, "link layer", ("InfiniBand", "Ethernet")),
    "hpl_flavour": lambda at: _choice(at, "HPL flavour", ("hpl-nvidia", "xhpl", "hpcc")),
    "hpl_nb": _positive_integer,
    "fp64_peak_tflops": _positive_number,
    "training_straggler_fraction": _positive_number,
    "isolation_budget_s": _positive_number,
    "isolation_hang_floor_s": _positive_number,
    "ib_symbol_errors_max": _count,
    "ib_link_downed_max": _count,
    "ib_port_rcv_errors_max": _count,
    "ib_bidirectional": _boolean,
    "ib_gpudirect": _boolean,
    "pair_low_fraction": _positive_number,
    "pair_all_max_nodes": _pair_count(PAIR_ALL_MAX_NODES_MOST, "since every pair of that many nodes is measured"),
    "pair_sample_partners": _pair_count(PAIR_SAMPLE_PARTNERS_MOST, "since every node is paired with that many"),
}
EXPECT_KEYS = tuple(item.name for item in dataclasses.fields(Expectations))


def _outlier_rule(at: _At) -> OutlierRule:
    """The profile's `outliers:` ({z, min_deviation, min_nodes, fail, ignore}); keys left out
    keep OutlierRule's defaults."""
    given = _fields(at, OUTLIER_KEYS)
    values: dict[str, Any] = {}
    if "z" in given:
        values["z"] = _number(given["z"])
        if values["z"] <= 0:
            raise given["z"].error(f"must be a positive number of scaled MADs, got {given['z'].node.value}")
    if "min_deviation" in given:
        values["min_deviation"] = _number(given["min_deviation"])
        if values["min_deviation"] < 0:
            raise given["min_deviation"].error(
                f"a fraction of the median, must be >= 0, got {given['min_deviation'].node.value}")
    if "min_nodes" in given:
        values["min_nodes"] = _integer(given["min_nodes"])
        if values["min_nodes"] < 3:
            raise given["min_nodes"].error(
                f"{values['min_nodes']} is too few; a median and its MAD need at least 3 nodes")
    for key in ("fail", "ignore"):
        if key in given:
            names: list[str] = []
            for item in _list(given[key]):
                metric = _recorded_metric(item)
                if metric in names:
                    raise item.error(f"metric {metric!r} listed twice")
                if key == "ignore" and metric in values.get("fail", ()):
                    raise item.error(f"metric {metric!r} is in fail too; an ignored metric cannot fail")
                names.append(metric)
            values[key] = tuple(names)
    return OutlierRule(**values)


def _soak_mix(at: _At) -> dict[str, object]:
    """The profile's `soak:`, the load mix of its soaks (keys of SOAK_MIX_DEFAULTS); --soak-mix
    overrides it, key by key."""
    mix: dict[str, object] = {}
    for key, value_at in _fields(at, tuple(SOAK_MIX_DEFAULTS)).items():
        if key in SOAK_MIX_COUNTS:
            mix[key] = _integer(value_at)
        elif key in SOAK_MIX_SECONDS:
            mix[key] = _number(value_at)
        else:
            mix[key] = _string(value_at)
        problem = soak_mix_problem(key, mix[key])
        if problem:
            raise value_at.error(problem)
    return mix


def known_profiles() -> list[str]:
    """Names of the profiles shipped in inventory/profiles."""
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str, relative_to: Union[str, os.PathLike, None] = None) -> Profile:
    """Load a SKU profile by name (inventory/profiles/<name>.yaml) or by path to a .yaml file.

    relative_to is the directory a relative path starts from (a file means its directory);
    None means the working directory.
    """
    path, problem = _locate_profile(str(name_or_path), relative_to)
    if path is None:
        raise InventoryError(problem, field="profile")
    return _read_profile(path)[0]


def _locate_profile(
    value: str, relative_to: Union[str, os.PathLike, None]
) -> tuple[Optional[Path], str]:
    """The profile file a name or a path refers to, or None and why there is none.

    Anything that looks like a file (a .yaml/.yml suffix or a slash) is a path; the rest are names.
    """
    if value.endswith((".yaml", ".yml")) or "/" in value or os.sep in value:
        base = Path(relative_to) if relative_to is not None else Path.cwd()
        if base.is_file():
            base = base.parent
        path = Path(os.path.normpath(base / Path(value).expanduser()))
        if path.is_file():
            return path, ""
        return None, f"no such profile file {str(path)!r}"
    known = known_profiles()
    if value in known:
        return PROFILES_DIR / f"{value}.yaml", ""
    return None, _unknown(f"unknown profile {value!r}", value, known, "known")


_RawReference = dict[str, _Setting]


def _read_profile(path: Path) -> tuple[Profile, dict[str, _RawReference]]:
    """The profile, plus each reference's fields and lines, for merging inventory overrides."""
    _, root = _document(path, "a profile mapping")
    fields = _fields(root, PROFILE_KEYS, required=("profile", "description", "mandatory"))
    name = _name(fields["profile"], "profile name")
    if name != path.stem:
        raise fields["profile"].error(
            f"profile name {name!r} does not match its file name {path.name!r}"
        )
    mandatory: list[str] = []
    checks = known_checks()
    for item in _list(fields["mandatory"]):
        check = _name(item, "check name")
        if check not in checks:  # it would fail every node of every run for want of a result
            raise item.error(_unknown(f"unknown check {check!r}", check, sorted(checks)))
        if check in mandatory:
            raise item.error(f"check {check!r} listed twice")
        mandatory.append(check)
    declared = {}
    if "expect" in fields:
        for key, value_at in _fields(fields["expect"], EXPECT_KEYS).items():
            declared[key] = EXPECT_READERS[key](value_at)
    raw: dict[str, _RawReference] = {}
    metrics: dict[str, _At] = {}
    if "references" in fields:
        for metric, key_at, value_at in _read_mapping(fields["references"]):
            _recorded_metric(key_at)
            raw[metric] = _reference_fields(value_at)
            metrics[metric] = value_at
    references = {}
    for metric, fields_of_metric in raw.items():
        for required in REFERENCE_REQUIRED + ("source",):
            if required not in fields_of_metric:
                raise metrics[metric].whole_error(f"missing required key {required!r}")
        references[metric] = _build_reference(metric, fields_of_metric, {})
    profile = Profile(
        name=name,
        description=_string(fields["description"]),
        mandatory=tuple(mandatory),
        expect=Expectations(**declared),
        references=references,
        source_path=str(path.resolve()),
        outliers=_outlier_rule(fields["outliers"]) if "outliers" in fields else OutlierRule(),
        soak_mix=_soak_mix(fields["soak"]) if "soak" in fields else {},
    )
    return profile, raw


def _reference_fields(at: _At) -> _RawReference:
    readers = {
        "check": lambda value: _name(value, "check name"),
        "value": _number,
        "lower": _optional_number,
        "upper": _optional_number,
        "unit": _string,
        "source": _string,
    }
    return {
        key: _Setting(readers[key](value_at), value_at)
        for key, value_at in _fields(at, REFERENCE_KEYS).items()
    }


def _recorded_metric(at: _At) -> str:
    """A metric name that a suite records (inventory/metrics.py): a misspelt one would leave a
    band, or an outlier rule, that never judges anything."""
    metric = _name(at, "metric name")
    if not checks_recording(metric):
        close = difflib.get_close_matches(metric, known_metrics(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "inventory/metrics.py lists those the suites record"
        raise at.error(f"no check records a metric {metric!r}; {hint}")
    return metric


def _build_reference(metric: str, merged: _RawReference, override: _RawReference) -> Reference:
    """A Reference with its band checked, for a check that records the metric in the reference's
    unit; a bad band, check or unit is blamed on the override if it made it so."""

    def blame(key: str) -> _At:
        if key in override:
            return override[key].at
        return override["value"].at if "value" in override else merged[key].at

    recording = checks_recording(metric)
    check, unit = merged["check"], merged["unit"]
    if check.value not in recording:
        raise blame("check").error(
            f"{metric!r} is recorded by check {' and '.join(map(repr, recording))}, not {check.value!r}")
    if unit.value != recording[check.value]:
        raise blame("unit").error(f"{check.value} records {metric!r} in {recording[check.value]}, not {unit.value!r}")
    value = merged["value"].value
    lower = merged["lower"].value if "lower" in merged else None
    upper = merged["upper"].value if "upper" in merged else None
    if value < 0:  # its fractional band would turn over: -1 with lower -0.02 let anything above -0.98 pass
        raise blame("value").error(f"value must be 0 or more (with 0 the bounds are absolute), got {value:g}")
    if value != 0:
        if lower is not None and lower > 0:
            raise blame("lower").error(
                f"lower is a fraction of value and must be <= 0, got {lower:g}"
            )
        if upper is not None and upper < 0:
            raise blame("upper").error(
                f"upper is a fraction of value and must be >= 0, got {upper:g}"
            )
    elif lower is not None and upper is not None and lower > upper:
        raise blame("lower").error(
            f"with value 0 the bounds are absolute, and lower {lower:g} is above upper {upper:g}"
        )
    return Reference(
        metric=metric,
        check=merged["check"].value,
        value=value,
        unit=merged["unit"].value,
        lower=lower,
        upper=upper,
        source=merged["source"].value,
    )


def _apply_reference_overrides(
    at: _At, profile: Profile, raw: dict[str, _RawReference], inventory_name: str
) -> Profile:
    """Merge the inventory's `references:` into the profile's, field by field."""
    references = dict(profile.references)
    for metric, key_at, value_at in _read_mapping(at):
        _recorded_metric(key_at)
        override = _reference_fields(value_at)
        if metric not in raw:
            missing = [key for key in REFERENCE_REQUIRED if key not in override]
            if missing:
                raise value_at.whole_error(
                    f"metric not in profile {profile.name!r}, so it needs "
                    f"{', '.join(missing)} as well"
                )
        merged = {**raw.get(metric, {}), **override}
        if "source" not in override:
            # The inventory changed the band; the profile's justification no longer covers it.
            merged["source"] = _Setting(f"inventory {inventory_name}", value_at)
        references[metric] = _build_reference(metric, merged, override)
    return dataclasses.replace(profile, references=references)


def _apply_expect_overrides(at: _At, profile: Profile) -> tuple[Profile, tuple[ExpectOverride, ...]]:
    """The inventory's `expect:`: facts of the profile replaced, each with its reason, so a
    partial or test machine is judged for what it is; a null value leaves the fact unchecked."""
    overrides = []
    for key, value_at in _fields(at, EXPECT_KEYS).items():
        if not isinstance(value_at.node, yaml.MappingNode):
            raise value_at.error(f"expected {{value: ..., reason: ...}}, got {_describe(value_at)}")
        fields = _fields(value_at, EXPECT_OVERRIDE_KEYS, required=EXPECT_OVERRIDE_KEYS)
        value = None if fields["value"].is_null() else EXPECT_READERS[key](fields["value"])
        declared = getattr(profile.expect, key)
        if value == declared:
            said = "does not declare it either" if declared is None else f"already declares {_show(declared)}"
            raise fields["value"].error(f"profile {profile.name!r} {said}; remove the override")
        overrides.append(ExpectOverride(key, value, declared, _string(fields["reason"])))
    expect = dataclasses.replace(profile.expect, **{override.key: override.value for override in overrides})
    return dataclasses.replace(profile, expect=expect), tuple(overrides)


# ---------------------------------------------------------------- inventories


def _path_setting(at: _At) -> str:
    """A local file path: `~` expanded, relative paths taken from the inventory's directory."""
    path = Path(_string(at)).expanduser()
    if not path.is_absolute():
        path = at.source.directory / path
    return os.path.normpath(path)


def _port(at: _At) -> int:
    port = _integer(at)
    if not 1 <= port <= 65535:
        raise at.error(f"port must be between 1 and 65535, got {port}")
    return port


def _timeout(at: _At) -> float:
    seconds = _number(at)
    if seconds <= 0:
        raise at.error(f"must be a positive number of seconds, got {at.node.value}")
    return seconds


_JUMP_HOP = re.compile(r"(?:([^@\s,]+)@)?(\[[0-9A-Fa-f:.]+\]|[^@\s,:\[\]]+)(?::(\d+))?")


def _jump(at: _At) -> str:
    """ssh -J syntax: [user@]host[:port], several hops separated by commas; each user a login
    and each host a host name or IP address, as for the nodes themselves."""
    value = _string(at)
    for hop in value.split(","):
        match = _JUMP_HOP.fullmatch(hop)
        if not match or (match.group(3) and not 1 <= int(match.group(3)) <= 65535) \
                or (match.group(1) and not USER_PATTERN.fullmatch(match.group(1))) \
                or not (_bracketed_ipv6(match.group(2)) if match.group(2).startswith("[")
                        else ADDRESS_PATTERN.fullmatch(match.group(2))):
            raise at.error(f"expected [user@]host[:port] (like ssh -J), got {quoted(value)}")
    return value


def canonical_address(address: str) -> str:
    """An IPv6 address in its one written form (fd00:77::2: lower case, zeros compressed), as ssh
    writes it into known_hosts and the host key check looks it up; any other address as given."""
    try:
        return ipaddress.IPv6Address(address).compressed
    except ValueError:
        return address


def _bracketed_ipv6(host: str) -> bool:
    """[2001:db8::1] as ssh -J writes an IPv6 address; [:::::] is not one."""
    try:
        ipaddress.IPv6Address(host[1:-1])
    except ValueError:
        return False
    return True


def _matching(pattern: re.Pattern[str], expected: str) -> Callable[[_At], str]:
    """A reader of strings the whole of which pattern matches."""
    def read(at: _At) -> str:
        value = _string(at)
        if not pattern.fullmatch(value):
            raise at.error(f"expected {expected}, got {quoted(value)}")
        return value
    return read


_address = _matching(ADDRESS_PATTERN, "a host name or IP address")
_user = _matching(USER_PATTERN, "a login name")


_SETTING_READERS: dict[str, Callable[[_At], Any]] = {
    "user": _user,
    "port": _port,
    "identity_file": _path_setting,
    "known_hosts": _path_setting,
    "host_keys": lambda at: _choice(at, "host key policy", HOST_KEY_POLICIES),
    "jump": _jump,
    "connect_timeout": _timeout,
    "python": _matching(re.compile(r"[^\s-][^\x00-\x1f]*"), "a program on the node (a path or a command name)"),
    "sudo": _boolean,
    "rack": lambda at: _name(at, "rack name"),
    "leaf": lambda at: _name(at, "leaf name"),
}


def _settings(fields: dict[str, _At]) -> dict[str, _Setting]:
    """The node settings among a mapping's fields; null resets a nullable one to ssh's default."""
    settings = {}
    for key, at in fields.items():
        if key not in _SETTING_READERS:
            continue
        if at.is_null() and key in NULLABLE_SETTINGS:
            settings[key] = _Setting(None, at)
        else:
            settings[key] = _Setting(_SETTING_READERS[key](at), at)
    return settings


@dataclass
class _NodeEntry:
    name: str
    at: _At  # the nodes[] entry it came from
    address: Optional[str]
    settings: dict[str, _Setting]
    data_address: Optional[str] = None  # the node on the data network (iperf3), if not `address`
    source: str = "yaml"  # where the node was listed (Node.source)
    files: tuple[str, ...] = ()  # the files that listed it (slurm.conf and includes, Ansible's)


def _expand(at: _At, what: str) -> list[str]:
    """Names from a python-hostlist expression, in written order, duplicates kept for the caller."""
    expression = _string(at)
    try:
        names = hostlist.expand_hostlist(expression, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise at.error(f"malformed hostlist expression {expression!r} ({exc})") from None
    for name in names:
        if not NAME_PATTERN.fullmatch(name):
            raise at.error(f"invalid {what} {name!r} in {expression!r}; {NAME_RULE}")
    return names


def _node_entries(at: _At) -> list[_NodeEntry]:
    entries: list[_NodeEntry] = []
    first_line: dict[str, int] = {}
    items = _list(at)
    if not items:
        raise at.error("empty; list at least one node")
    for item in items:
        if isinstance(item.node, yaml.MappingNode) and _is_source_entry(item):
            new = _source_entries(item)
        elif isinstance(item.node, yaml.MappingNode):
            fields = _fields(item, NODE_KEYS, required=("name",))
            new = [
                _NodeEntry(
                    name=_name(fields["name"], "node name"),
                    at=item,
                    address=_address(fields["address"]) if "address" in fields else None,
                    settings=_settings(fields),
                    data_address=_address(fields["data_address"]) if "data_address" in fields else None,
                )
            ]
        elif isinstance(item.node, yaml.ScalarNode) and item.node.tag != _NULL:
            new = [_NodeEntry(name, item, None, {}) for name in _expand(item, "node name")]
        else:
            raise _wrong_type(item, "a hostlist string or a mapping with 'name'")
        for entry in new:
            if entry.name in first_line:
                first = first_line[entry.name]
                raise item.error(f"duplicate node {entry.name!r}; already listed at line {first}")
            first_line[entry.name] = item.line
        entries.extend(new)
    return entries


SOURCE_KEYS = ("slurm", "ansible")


def _is_source_entry(item: _At) -> bool:
    return any(isinstance(key, yaml.ScalarNode) and key.value in SOURCE_KEYS for key, _ in item.node.value)


def _source_entries(item: _At) -> list[_NodeEntry]:
    """`{slurm: {conf, partition}}` or `{ansible: {inventory, group}}`: the nodes another file lists.

    The files are read, never run (inventory/slurm_conf.py, inventory/ansible_inventory.py), and
    what they say is data: each node's name, address, from Ansible its port, user and key, and from
    Slurm's topology its leaf switch and rack (its block), as the node's own settings (over the
    inventory's groups and ssh:). slurm.conf's Port is slurmd's, not SSH's, so it is not used.
    Without conf:, the partition is read from the live Slurm (`sinfo`).
    """
    from inventory.ansible_inventory import read_ansible_inventory
    from inventory.slurm_conf import live_partition_nodes, live_places, read_slurm_conf

    fields = _fields(item, SOURCE_KEYS)
    if len(fields) != 1:
        raise item.error("give either slurm: or ansible: in one entry, not both")
    kind, at = next(iter(fields.items()))
    found: list[tuple[str, Optional[str], dict[str, Any]]] = []  # name, address, settings
    files: tuple[str, ...] = ()  # what was read, for the inventory's digest
    try:
        if kind == "slurm":
            spec = _fields(at, ("conf", "partition"), required=("partition",))
            name = _string(spec["partition"])
            if "conf" not in spec:  # the live Slurm this machine is a client of
                source, empty = f"sinfo partition {name}", f"partition {name!r} has no nodes"
                try:
                    live = live_partition_nodes(name)
                except SourceFileError as exc:
                    raise at.whole_error(f"partition {name!r} from the live Slurm (sinfo): {exc.problem}") from None
                places = live_places()
                found = [(n.name, n.address if n.address_given else None, places.of(n.name)) for n in live]
            else:
                written = _string(spec["conf"])
                conf = read_slurm_conf(_path_setting(spec["conf"]))
                files = conf.files
                shown = _display_path(Path(conf.path))
                if name not in conf.partitions:
                    raise spec["partition"].error(_unknown(f"no partition {name!r} in {shown}", name,
                                                           conf.partitions, "partitions"))
                source = f"slurm.conf {written} partition {name}"
                empty = f"partition {name!r} in {shown} has no nodes"
                found = [(n.name, n.address if n.address_given else None, conf.places.of(n.name))
                         for n in conf.partition_nodes(name)]
        else:
            spec = _fields(at, ("inventory", "group"), required=("inventory", "group"))
            written, name = _string(spec["inventory"]), _string(spec["group"])
            inventory = read_ansible_inventory(_path_setting(spec["inventory"]))
            files = inventory.files
            shown = _display_path(Path(inventory.path))
            if name not in inventory.groups:
                raise spec["group"].error(_unknown(f"no group {name!r} in {shown}", name, inventory.groups, "groups"))
            source, empty = f"ansible {written} group {name}", f"group {name!r} in {shown} has no hosts"
            for host in inventory.group_hosts(name):
                target = host.connection()
                settings: dict[str, Any] = {"port": target.port, "user": target.user}
                if target.identity_file is not None:
                    settings["identity_file"] = _ansible_key(item, host, target.identity_file, shown)
                found.append((host.name, target.address, {k: v for k, v in settings.items() if v is not None}))
    except SourceFileError as exc:
        raise InventoryError(exc.problem, _display_path(Path(exc.file)), exc.line) from None
    if not found:
        raise at.whole_error(empty)
    entries = []
    for name, address, settings in found:
        if not NAME_PATTERN.fullmatch(name):
            raise item.error(f"invalid node name {name!r} from {source}; {NAME_RULE}")
        if address is not None and not ADDRESS_PATTERN.fullmatch(address):
            raise item.error(f"node {name!r} from {source}: address {address!r} is not a host name or IP address")
        if "user" in settings and not USER_PATTERN.fullmatch(settings["user"]):
            raise item.error(f"node {name!r} from {source}: user {settings['user']!r} is not a login name")
        for place, what in (("leaf", "leaf switch"), ("rack", "block")):
            if place in settings and not NAME_PATTERN.fullmatch(settings[place]):
                raise item.error(f"node {name!r} from {source}: {what} {settings[place]!r} (Slurm's topology) "
                                 f"is not a name; {NAME_RULE}")
        entries.append(_NodeEntry(name, item, address, {k: _Setting(v, item) for k, v in settings.items()},
                                  source=source, files=files))
    return entries


def _ansible_key(item: _At, host: Any, written: str, shown: str) -> str:
    """An Ansible host's key file: `~` expanded; relative paths refused, since Ansible takes them
    from wherever it runs; the file must exist here."""
    path = Path(written).expanduser()
    where = f"host {host.name!r} in {shown}: ansible_ssh_private_key_file {written!r}"
    if not path.is_absolute():
        raise item.error(f"{where} is relative, and Ansible resolves it from where it runs; make it absolute")
    if not path.is_file():
        raise item.error(f"{where}: no such file")
    return os.path.normpath(path)


@dataclass
class _Group:
    name: str
    members: list[str]
    settings: dict[str, _Setting]


def _groups(at: _At, position: dict[str, int]) -> list[_Group]:
    groups = []
    for name, key_at, value_at in _read_mapping(at):
        _name(key_at, "group name")
        fields = _fields(value_at, GROUP_KEYS, required=("nodes",))
        members = _inventory_nodes(fields["nodes"], position, "a group")
        groups.append(_Group(name, members, _settings(fields)))
    return groups


def _groups_of(node_names: list[str], groups: list[_Group]) -> dict[str, list[_Group]]:
    """Node name -> the groups it is in, in written order: built once, since searching every
    group for every node grew with nodes x groups."""
    groups_of: dict[str, list[_Group]] = {name: [] for name in node_names}
    for group in groups:
        for member in group.members:
            groups_of[member].append(group)
    return groups_of


def _inventory_nodes(at: _At, position: dict[str, int], what: str) -> list[str]:
    """Nodes of the inventory (`position`: name -> index, in inventory order) named by a hostlist
    expression or a list of them, in inventory order; a name that is no node of the inventory is
    an error with a did-you-mean."""
    if isinstance(at.node, yaml.SequenceNode):
        listed = [(item, n) for item in _list(at) for n in _expand(item, "node name")]
    else:
        listed = [(at, n) for n in _expand(at, "node name")]
    if not listed:
        raise at.error(f"empty; {what} needs at least one node")
    members: set[str] = set()
    for where, member in listed:
        if member not in position:
            close = difflib.get_close_matches(member, list(position), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise where.error(f"unknown node {member!r}{hint}")
        members.add(member)
    return sorted(members, key=position.__getitem__)


@functools.lru_cache(maxsize=1)
def known_checks() -> dict[str, bool]:
    """Check name -> whether it runs once for the whole cluster, from the suites' test functions
    (test_<check>, marked `cluster`), read with ast rather than imported: the suites import
    the harness, and an inventory is checked before any of it runs. Read once a process."""
    checks: dict[str, bool] = {}
    for path in sorted(SUITES_DIR.glob("test_*.py")):
        for function in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            if isinstance(function, ast.FunctionDef) and function.name.startswith("test_"):
                marks = {decorator.attr for decorator in function.decorator_list
                         if isinstance(decorator, ast.Attribute)}
                checks[function.name.removeprefix("test_")] = "cluster" in marks
    return checks


def _iso_date(at: _At) -> str:
    """A calendar date written as YYYY-MM-DD, kept as text (YAML would read it as a date, and
    stop at an impossible one with its own words)."""
    if not isinstance(at.node, yaml.ScalarNode) or at.node.tag == _NULL:
        raise _wrong_type(at, "a date as YYYY-MM-DD")
    if at.node.tag not in (_STR, _TIMESTAMP):
        _scalar_value(at)  # rejects unknown tags such as !vault
    value = at.node.value
    try:
        if len(value) != 10:
            raise ValueError
        datetime.date.fromisoformat(value)
    except ValueError:
        raise at.error(f"expected a date as YYYY-MM-DD, got {quoted(value)}") from None
    return value


def _waivers(at: _At, position: dict[str, int]) -> tuple[Waiver, ...]:
    """waivers: known failures the delivery accepts, each a check on nodes with a reason and an
    owner; a check the suites do not have, or one that runs once for the whole cluster (it has
    no node to waive it on), is an error."""
    checks = known_checks()
    waivers = []
    for item in _list(at):
        fields = _fields(item, WAIVER_KEYS, required=WAIVER_REQUIRED)
        check = _name(fields["check"], "check name")
        if check not in checks:
            raise fields["check"].error(_unknown(f"unknown check {check!r}", check, sorted(checks)))
        if checks[check]:
            raise fields["check"].error(
                f"check {check!r} runs once for the whole cluster, so it has no node to waive it on")
        waivers.append(Waiver(
            check=check,
            nodes=tuple(_inventory_nodes(fields["nodes"], position, "a waiver")),
            reason=_string(fields["reason"]),
            owner=_string(fields["owner"]),
            expires=_iso_date(fields["expires"]) if "expires" in fields else None,
        ))
    return tuple(waivers)


def _sign_off(at: _At) -> SignOff:
    fields = _fields(at, SIGN_OFF_KEYS)
    return SignOff(**{key: _string(value) for key, value in fields.items()})


def _resolve_settings(
    entry: _NodeEntry, cluster: dict[str, _Setting], groups: list[_Group]
) -> dict[str, _Setting]:
    """cluster < group < node, `groups` being the node's own; two groups disagreeing on a key the
    node leaves open is an error."""
    resolved = dict(cluster)
    from_group: dict[str, tuple[_Group, _Setting]] = {}
    for group in groups:
        for key, setting in group.settings.items():
            if key in from_group and key not in entry.settings:
                other, earlier = from_group[key]
                if earlier.value != setting.value:
                    raise setting.at.error(
                        f"{_show(setting.value)} conflicts with {_show(earlier.value)} from group "
                        f"{other.name!r} (line {earlier.at.line}) for node {entry.name!r}, which "
                        f"is in both groups; set {key} on the node or make the groups agree"
                    )
            from_group[key] = (group, setting)
    resolved.update({key: setting for key, (_, setting) in from_group.items()})
    resolved.update(entry.settings)
    return resolved


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def _ssh_settings(settings: dict[str, _Setting]) -> SshSettings:
    """SshSettings from resolved settings, checking the local files ssh will need."""
    ssh = SshSettings(**{key: settings[key].value for key in SSH_KEYS if key in settings})
    if ssh.identity_file is not None:
        _require_file(settings["identity_file"], "")
    if ssh.known_hosts is not None and ssh.host_keys == "strict":
        _require_file(
            settings["known_hosts"],
            " (host_keys is strict; collect the keys first, or use host_keys: accept-new)",
        )
    return ssh


def _require_file(setting: _Setting, why: str) -> None:
    path = Path(setting.value)
    if not path.exists():
        raise setting.at.error(f"no such file {str(path)!r}{why}")
    if not path.is_file():
        raise setting.at.error(f"not a regular file {str(path)!r}{why}")


def _launch_interface(at: _At) -> Optional[str]:
    """launch.interface: one network interface name, as ip(8) and the MPI/NCCL variables take it."""
    fields = _fields(at, LAUNCH_KEYS)
    if "interface" not in fields:
        return None
    name = _string(fields["interface"])
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", name):
        raise fields["interface"].error(f"{name!r} is not a network interface name (e.g. eth0, ib0)")
    return name


# What Slurm takes as a partition, account or reservation name, and nothing srun would read as
# an option or a list.
_SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# Slurm's --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), "time formats").
_TIME_LIMIT = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def _time_limit(at: _At) -> int:
    """launch.time_limit: whole minutes, or a time as Slurm's --time reads it (30:00 is thirty
    minutes, 2:00:00 two hours, 1-12 a day and a half); rounded up to whole minutes."""
    text = _string(at)  # as written: YAML 1.1 would read 1:30:00 as a base-60 integer
    usage = (f"time_limit {text!r}: give minutes (e.g. 30) or a time as Slurm's --time takes it "
             "(MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)")
    if ":" not in text and "-" not in text:
        if not text.isdigit():
            raise at.error(usage)
        whole = int(text)
        if whole < 1:
            raise at.error(f"time_limit must be at least 1 minute, got {whole}")
        return whole
    match = _TIME_LIMIT.fullmatch(text)
    if not match:
        raise at.error(usage)
    days, first, second, third = match.groups()
    if days is None:  # M:S or H:M:S
        hours, minutes, seconds = (first, second, third) if third is not None else ("0", first, second)
    else:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = first, second, third
    total = int(days or 0) * 1440 + int(hours or 0) * 60 + int(minutes or 0) + (1 if int(seconds or 0) else 0)
    if total < 1:
        raise at.error(f"time_limit {text!r} is shorter than a minute")
    return total


def _rendezvous_timeout(at: _At) -> int:
    """launch.rendezvous_timeout_s: whole seconds, within what a run across nodes is given."""
    seconds = _positive_integer(at)
    if seconds > RENDEZVOUS_TIMEOUT_MAX_S:
        raise at.error(f"{seconds} s is too long; at most {RENDEZVOUS_TIMEOUT_MAX_S}, half of the "
                       f"{2 * RENDEZVOUS_TIMEOUT_MAX_S} s a quick run across nodes is given")
    return seconds


def _launch(at: _At, transport: str) -> LaunchSettings:
    """launch: the engine of multi-node jobs, torchrun's rendezvous timeout and, where Slurm runs
    them or the per-node checks, the allocation to ask for."""
    fields = _fields(at, LAUNCH_KEYS)
    engine = _choice(fields["engine"], "engine", ENGINES) if "engine" in fields else "default"
    settings: dict[str, Any] = {}
    for key in SLURM_LAUNCH_KEYS:
        if key not in fields:
            continue
        if engine != "slurm" and transport != "slurm":
            raise fields[key].error(f"launch.{key} is a Slurm setting; it needs engine: slurm "
                                    "or transport: slurm")
        if key == "time_limit":
            settings["time_limit_min"] = _time_limit(fields[key])
            continue
        value = _string(fields[key])
        if not _SLURM_NAME.fullmatch(value):
            raise fields[key].error(f"{key} {value!r} is not a Slurm {key} name")
        settings[key] = value
    if "rendezvous_timeout_s" in fields:
        settings["rendezvous_timeout_s"] = _rendezvous_timeout(fields["rendezvous_timeout_s"])
    return LaunchSettings(engine=engine, interface=_launch_interface(at), **settings)


def _scratch(at: _At) -> tuple[ScratchPath, ...]:
    paths: list[ScratchPath] = []
    first_line: dict[str, int] = {}
    for item in _list(at):
        if isinstance(item.node, yaml.MappingNode):
            fields = _fields(item, SCRATCH_KEYS, required=("path",))
            path_at = fields["path"]
            kind = _choice(fields["kind"], "kind", SCRATCH_KINDS) if "kind" in fields else "local"
            destructive = _boolean(fields["destructive"]) if "destructive" in fields else False
        elif isinstance(item.node, yaml.ScalarNode) and item.node.tag != _NULL:
            path_at, kind, destructive = item, "local", False
        else:
            raise _wrong_type(item, "a path or a mapping with 'path'")
        path = _string(path_at)
        if not path.startswith("/"):
            raise path_at.error(f"scratch paths must be absolute, got {quoted(path)}")
        if any(ord(character) < 0x20 or ord(character) == 0x7F for character in path):
            raise path_at.error(f"scratch path {path!r} holds a control character")
        if ":" in path:  # fio would write to each part: /scratch/a:b is /scratch/a and b
            raise path_at.error(f"scratch path {path!r} holds ':', which fio reads as a list of files")
        path = posixpath.normpath(path)
        if path == "/" or path.startswith("//"):
            raise path_at.error(f"{path!r} is not a scratch directory")
        if path in first_line:
            first = first_line[path]
            raise path_at.error(f"duplicate scratch path {path!r}; first at line {first}")
        first_line[path] = path_at.line
        paths.append(ScratchPath(path=path, kind=kind, destructive=destructive))
    return tuple(paths)


def _digest(data: bytes, files: list[str]) -> str:
    """sha256 of the inventory's bytes and, after them, those of every slurm.conf (and include)
    and Ansible file its `nodes:` read, each once in reading order: a run pinned to it and its
    --resume see the same nodes. An inventory that reads none keeps the digest of its own bytes."""
    digest = hashlib.sha256(data)
    for file in dict.fromkeys(files):
        try:
            digest.update(b"\0" + hashlib.sha256(Path(file).read_bytes()).digest())
        except OSError as exc:
            raise InventoryError(f"cannot read it again for the inventory's digest: {exc.strerror}",
                                 _display_path(Path(file))) from None
    return digest.hexdigest()


def load_inventory(path: Union[str, os.PathLike]) -> Cluster:
    """Read and fully validate an inventory file, with its profile and its reference and expect
    overrides."""
    path = Path(path)
    data, root = _document(path, "an inventory mapping")
    fields = _fields(root, TOP_LEVEL_KEYS, required=("cluster", "profile", "nodes"))

    name = _name(fields["cluster"], "cluster name")
    transport = (
        _choice(fields["transport"], "transport", TRANSPORTS) if "transport" in fields else "ssh"
    )
    profile_at = fields["profile"]
    profile_path, problem = _locate_profile(_string(profile_at), root.source.directory)
    if profile_path is None:
        raise profile_at.error(problem)
    profile, raw_references = _read_profile(profile_path)
    if "references" in fields:
        profile = _apply_reference_overrides(
            fields["references"], profile, raw_references, path.name
        )
    expect_overrides: tuple[ExpectOverride, ...] = ()
    if "expect" in fields:
        profile, expect_overrides = _apply_expect_overrides(fields["expect"], profile)

    cluster_fields: dict[str, _At] = {key: fields[key] for key in ("python", "sudo") if key in fields}
    if "ssh" in fields:
        # Checked for typos even with transport local, where it is then ignored.
        cluster_fields.update(_fields(fields["ssh"], SSH_KEYS))
    cluster_settings = _settings(cluster_fields)

    entries = _node_entries(fields["nodes"])
    if transport == "local" and len(entries) != 1:
        raise fields["nodes"].error(
            f"transport 'local' means this machine, so exactly one node; got {len(entries)}"
        )
    node_names = [entry.name for entry in entries]
    position = {name: index for index, name in enumerate(node_names)}
    groups = _groups(fields["groups"], position) if "groups" in fields else []
    groups_of = _groups_of(node_names, groups)

    nodes = []
    for entry in entries:
        settings = _resolve_settings(entry, cluster_settings, groups_of[entry.name])
        ssh = SshSettings() if transport == "local" else _ssh_settings(settings)
        nodes.append(
            Node(
                name=entry.name,
                address=canonical_address(entry.address or entry.name),
                transport=transport,
                ssh=ssh,
                python=settings["python"].value if "python" in settings else "python3",
                sudo=settings["sudo"].value if "sudo" in settings else False,
                groups=tuple(sorted(g.name for g in groups_of[entry.name])),
                data_address=canonical_address(entry.data_address) if entry.data_address else None,
                rack=settings["rack"].value if "rack" in settings else None,
                leaf=settings["leaf"].value if "leaf" in settings else None,
                source=entry.source,
            )
        )

    launch = _launch(fields["launch"], transport) if "launch" in fields else LaunchSettings()
    return Cluster(
        name=name,
        profile=profile,
        transport=transport,
        nodes=tuple(nodes),
        groups={group.name: tuple(group.members) for group in groups},
        scratch=_scratch(fields["scratch"]) if "scratch" in fields else (),
        launch_interface=launch.interface,
        launch=launch,
        source_path=os.path.abspath(path),
        digest=_digest(data, [file for entry in entries for file in entry.files]),
        cluster_id=_name(fields["cluster_id"], "cluster ID") if "cluster_id" in fields else "",
        waivers=_waivers(fields["waivers"], position) if "waivers" in fields else (),
        sign_off=_sign_off(fields["sign_off"]) if "sign_off" in fields else SignOff(),
        expect_overrides=expect_overrides,
    )
