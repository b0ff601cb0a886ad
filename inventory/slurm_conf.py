"""Read the nodes of a Slurm partition from slurm.conf text, without Slurm.

The operator's workstation often has the cluster's slurm.conf but no Slurm, and Slurm itself
refuses many real files for options it no longer knows. So this reads only the lines it needs,
as Slurm's parser reads them (src/common/parse_config.c, read_config.c, node_conf.c):

- `#` starts a comment unless escaped (`\\#`); a line ending in an odd number of backslashes
  continues on the next one; the remaining backslashes escape the character after them;
- keys are case-insensitive, `Key=Value` or `Key="value with spaces"`, blanks around `=` allowed;
- `Include PATH` (relative paths start at the directory of the slurm.conf being read, `%c` is the
  lower-cased ClusterName; Slurm has no globs);
- `NodeName=` lines with hostlist expressions, `NodeAddr`/`NodeHostname`/`Port` lists matched to
  the names one by one (or one value for all), `NodeName=DEFAULT` merged into the lines after it;
- `NodeSet=` (by `Nodes=` and/or `Feature=`) and `PartitionName=` with `Nodes=ALL`, nodesets and
  hostlists, `PartitionName=DEFAULT` likewise;
- where the nodes sit, from the topology files beside slurm.conf (where Slurm reads them): with
  `TopologyPlugin=topology/tree`, topology.conf's leaf switch of each node, the first
  `SwitchName=` whose `Nodes=` lists it (`Switches=` lines join switches above the leaves, and are
  passed over); with `topology/block`, its `BlockName=` as the node's rack (a block is the set of
  nodes on one low-latency domain: a GB200 NVL72 rack's NVLink, a scalable unit); a
  topology.yaml, which Slurm reads instead of topology.conf where it exists (topology.yaml(5)),
  gives both from its tree and block topologies, the `cluster_default` one first.

Every other line and option is ignored. A partition's nodes come in the order of their NodeName
lines (Slurm keeps a partition as a bitmap over that table). Nothing here runs anything.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import hostlist
import yaml

from inventory.source_error import SourceFileError


class SlurmConfError(SourceFileError):
    """A slurm.conf that cannot be read as Slurm would; str() is one line naming file and line."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    hostname: str  # NodeHostname, else the name
    address: str  # NodeAddr, else the hostname: where slurmctld reaches the node
    port: Optional[int]  # slurmd's Port when given (not SSH's)
    features: tuple[str, ...]
    file: str
    line: int
    address_given: bool  # NodeAddr or NodeHostname was written, so address is not just the name


@dataclass(frozen=True)
class _Record:
    """One NodeSet or PartitionName line: its name, its node specification, where it was."""

    name: str
    nodes: Optional[str]
    feature: Optional[str]
    file: str
    line: int


@dataclass(frozen=True)
class SlurmPlaces:
    """Where Slurm's topology puts each node: under a leaf switch (topology/tree), in a block
    (topology/block), which handover takes as the node's rack."""

    leaves: dict[str, str]  # node -> its leaf switch
    racks: dict[str, str]  # node -> its block

    def of(self, node: str) -> dict[str, str]:
        """The node's `leaf` and `rack` settings, those Slurm gives."""
        return {key: at[node] for key, at in (("leaf", self.leaves), ("rack", self.racks)) if node in at}


@dataclass(frozen=True)
class SlurmConf:
    path: str  # the file that was read (includes are inside it)
    nodes: dict[str, SlurmNode]  # in NodeName order
    partitions: dict[str, _Record]
    nodesets: dict[str, _Record]
    files: tuple[str, ...] = ()  # every file read, includes too, in reading order
    places: SlurmPlaces = field(default_factory=lambda: SlurmPlaces({}, {}))

    def partition_nodes(self, name: str) -> list[SlurmNode]:
        """The partition's nodes in NodeName order; an unknown partition names those there are."""
        if name not in self.partitions:
            known = ", ".join(self.partitions) or "(none)"
            raise SlurmConfError(f"no partition {name!r}; partitions: {known}", self.path)
        partition = self.partitions[name]
        if not partition.nodes:
            return []
        wanted = self._expand(partition.nodes, f"PartitionName={name}", partition, frozenset())
        return [node for node in self.nodes.values() if node.name in wanted]

    def _expand(self, spec: str, owner: str, where: _Record, active: frozenset[str]) -> set[str]:
        """Names in a Nodes= value: ALL, NodeSets (their Feature and Nodes) and hostlists."""
        if spec.upper() == "ALL":
            return set(self.nodes)
        names: set[str] = set()
        for token in _hostlist(spec, where.file, where.line, "Nodes"):
            if token in self.nodesets and token not in active:
                nodeset = self.nodesets[token]
                if nodeset.feature:
                    names.update(n.name for n in self.nodes.values() if nodeset.feature in n.features)
                if nodeset.nodes:
                    names.update(self._expand(nodeset.nodes, f"NodeSet={token}", nodeset, active | {token}))
            elif token in self.nodes:
                names.add(token)
            else:
                raise SlurmConfError(
                    f"{owner}: {token!r} in Nodes= is neither a NodeName nor a NodeSet", where.file, where.line
                )
        return names


# Key=Value, Key = Value, Key="quoted value": the pattern of parse_config.c's keyvalue_pattern.
_KEY_VALUE = re.compile(r'\s*([A-Za-z0-9_.]+)\s*([-*+/]?)=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE = re.compile(r"include\s+(\S+)", re.IGNORECASE)
_NEEDED = ("nodename", "nodeset", "partitionname")
TREE_TOPOLOGY = "topology/tree"
BLOCK_TOPOLOGY = "topology/block"
TOPOLOGY_FILE = "topology.conf"
TOPOLOGY_YAML = "topology.yaml"  # Slurm 25.05 and later; where it exists topology.conf is ignored


def read_slurm_conf(path: Union[str, os.PathLike]) -> SlurmConf:
    """Read slurm.conf and its includes into nodes, nodesets and partitions, or raise SlurmConfError."""
    top = os.path.normpath(os.path.abspath(path))
    reader = _Reader(top)
    reader.read(top, ())
    places = reader.read_topology()
    return SlurmConf(top, reader.nodes, reader.partitions, reader.nodesets, tuple(reader.files), places)


class _Reader:
    def __init__(self, top: str):
        self.top = top
        self.cluster: Optional[str] = None
        self.topology: Optional[str] = None  # TopologyPlugin
        self.nodes: dict[str, SlurmNode] = {}
        self.partitions: dict[str, _Record] = {}
        self.nodesets: dict[str, _Record] = {}
        self.node_default: dict[str, str] = {}
        self.partition_default: dict[str, str] = {}
        self.files: list[str] = []

    def read(self, file: str, including: tuple[str, ...]) -> None:
        text = _text(file, including)
        self.files.append(file)
        for line_number, line in _logical_lines(text):
            include = _INCLUDE.match(line.lstrip())
            if include:
                self.read(self._include_path(include.group(1), file, line_number), including + (file,))
                continue
            first = _KEY_VALUE.match(line)
            if not first:
                continue  # not a line this reader needs; Slurm decides what it thinks of it
            key = first.group(1).lower()
            if key == "clustername":
                self.cluster = _value(first)
            elif key == "topologyplugin":
                self.topology = _value(first)
            elif key in _NEEDED:
                pairs = _pairs(line, file, line_number)
                getattr(self, f"_{key}")(pairs, file, line_number)

    def read_topology(self) -> SlurmPlaces:
        """Where the topology file beside slurm.conf that Slurm would read places each node:
        topology.yaml where it exists, else topology.conf as TopologyPlugin reads it."""
        here = os.path.dirname(self.top)
        plugin = (self.topology or "").lower()
        yaml_file, conf_file = os.path.join(here, TOPOLOGY_YAML), os.path.join(here, TOPOLOGY_FILE)
        if os.path.isfile(yaml_file):
            self.files.append(yaml_file)
            return _topology_yaml_places(_text(yaml_file, ()), yaml_file)
        if plugin not in (TREE_TOPOLOGY, BLOCK_TOPOLOGY) or not os.path.isfile(conf_file):
            return SlurmPlaces({}, {})
        self.files.append(conf_file)
        lines = _logical_lines(_text(conf_file, ()))
        if plugin == TREE_TOPOLOGY:
            return SlurmPlaces(_grouped(lines, conf_file, TREE_LINES), {})
        return SlurmPlaces({}, _grouped(lines, conf_file, BLOCK_LINES))

    def _include_path(self, written: str, file: str, line: int) -> str:
        if "*" in written:
            raise SlurmConfError(f"Include {written!r}: Slurm does not expand globs", file, line)
        if "%c" in written:
            if self.cluster is None:
                raise SlurmConfError(f"Include {written!r}: %c needs a ClusterName line before it", file, line)
            written = written.replace("%c", self.cluster.lower())
        # get_extra_conf_path(): relative to the directory of the slurm.conf Slurm was given.
        return os.path.normpath(os.path.join(os.path.dirname(self.top), written))

    def _nodename(self, pairs: dict[str, str], file: str, line: int) -> None:
        value = pairs["nodename"]
        if value.upper() == "DEFAULT":
            for key in ("nodeaddr", "nodehostname"):
                if key in pairs:
                    raise SlurmConfError(f"{_SPELLING[key]} is not allowed with NodeName=DEFAULT", file, line)
            self.node_default.update(pairs)
            return
        if value.upper() == "ALL":
            raise SlurmConfError("'ALL' is a reserved word, not a NodeName", file, line)
        names = _hostlist(value, file, line, "NodeName")
        hostnames = _hostlist(pairs["nodehostname"], file, line, "NodeHostname") if "nodehostname" in pairs else names
        addresses = _hostlist(pairs["nodeaddr"], file, line, "NodeAddr") if "nodeaddr" in pairs else hostnames
        port_text = pairs.get("port", self.node_default.get("port"))
        ports = _ports(port_text, file, line) if port_text else []
        # node_conf.c: one value each, or a single one for all (Port: at most one).
        for what, values in (("NodeHostname", hostnames), ("NodeAddr", addresses), ("Port", ports)):
            if len(values) not in (len(names), 1) and (values or what != "Port"):
                raise SlurmConfError(
                    f"{len(values)} {what} value(s) for {len(names)} NodeName(s); give one each or a single one",
                    file, line,
                )
        feature_text = next((pairs[k] for k in ("feature", "features") if k in pairs), None)
        if feature_text is None:
            feature_text = next((self.node_default[k] for k in ("feature", "features") if k in self.node_default), "")
        features = tuple(f for f in feature_text.split(",") if f)
        for index, name in enumerate(names):
            if name in self.nodes:
                first = self.nodes[name]
                raise SlurmConfError(f"NodeName {name!r} defined twice; first at {first.file}:{first.line}", file, line)
            self.nodes[name] = SlurmNode(
                name=name,
                hostname=hostnames[min(index, len(hostnames) - 1)],
                address=addresses[min(index, len(addresses) - 1)],
                port=ports[min(index, len(ports) - 1)] if ports else None,
                features=features,
                file=file,
                line=line,
                address_given="nodeaddr" in pairs or "nodehostname" in pairs,
            )

    def _nodeset(self, pairs: dict[str, str], file: str, line: int) -> None:
        name = pairs["nodeset"]
        if name in self.nodesets:
            first = self.nodesets[name]
            raise SlurmConfError(f"NodeSet {name!r} defined twice; first at {first.file}:{first.line}", file, line)
        self.nodesets[name] = _Record(name, pairs.get("nodes"), pairs.get("feature"), file, line)

    def _partitionname(self, pairs: dict[str, str], file: str, line: int) -> None:
        name = pairs["partitionname"]
        if name.upper() == "DEFAULT":
            self.partition_default.update(pairs)
            return
        if name in self.partitions:
            first = self.partitions[name]
            raise SlurmConfError(f"PartitionName {name!r} defined twice; first at {first.file}:{first.line}",
                                 file, line)
        nodes = pairs.get("nodes", self.partition_default.get("nodes"))
        self.partitions[name] = _Record(name, nodes, None, file, line)


_SPELLING = {"nodeaddr": "NodeAddr", "nodehostname": "NodeHostname"}


def _text(file: str, including: tuple[str, ...]) -> str:
    if file in including:
        raise SlurmConfError(f"includes itself (through {' -> '.join(including)})", file)
    what = "Include file" if including else "slurm.conf"
    try:
        data = Path(file).read_bytes()
    except FileNotFoundError:
        raise SlurmConfError(f"no such file; {what} not found", file) from None
    except IsADirectoryError:
        raise SlurmConfError(f"is a directory, not a {what}", file) from None
    except OSError as exc:
        raise SlurmConfError(f"cannot read: {exc.strerror}", file) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SlurmConfError(f"not UTF-8 text (byte {exc.start})", file) from None


def _strip_comment(line: str) -> str:
    """Cut at the first `#` preceded by an even number of backslashes (_strip_comments)."""
    backslashes = 0
    for index, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:index]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with comments cut, continuations joined, escapes removed."""
    pending: Optional[tuple[int, str]] = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw)
        trimmed = line.rstrip()
        trailing = len(trimmed) - len(trimmed.rstrip("\\"))
        continued = trailing % 2 == 1
        if continued:
            line = trimmed[:-1]
        start, before = pending if pending else (number, "")
        if continued:
            pending = (start, before + line)
            continue
        pending = None
        yield start, _unescape(before + line)
    if pending:  # fgets() ran out: Slurm takes what it joined so far
        yield pending[0], _unescape(pending[1])


def _unescape(line: str) -> str:
    """_strip_escapes(): a backslash keeps the character after it and goes."""
    return re.sub(r"\\(.)", r"\1", line)


def _value(match: re.Match) -> str:
    return match.group(3) if match.group(3) is not None else match.group(4)


def _pairs(line: str, file: str, number: int) -> dict[str, str]:
    """Every Key=Value of a line we need, keys lower-cased; text that is none is an error."""
    pairs: dict[str, str] = {}
    position = 0
    while line[position:].strip():
        match = _KEY_VALUE.match(line, position)
        if not match:
            raise SlurmConfError(f"cannot read {line[position:].strip()!r} as Key=Value", file, number)
        key = match.group(1).lower()
        if match.group(2) and key in ("nodename", "nodeset", "partitionname", "nodes", "nodeaddr",
                                      "nodehostname", "port", "feature", "features"):
            raise SlurmConfError(f"{match.group(1)}{match.group(2)}= is not valid here", file, number)
        pairs[key] = _value(match)
        position = match.end()
    return pairs


@dataclass(frozen=True)
class _Grouping:
    """How one topology plugin's lines (topology.conf, `scontrol show topology`) group nodes."""

    plugin: str  # topology/tree or topology/block
    key: str  # the line's name: SwitchName or BlockName
    passed_over: tuple[str, ...] = ()  # lines that place no node (BlockSizes=)


TREE_LINES = _Grouping(TREE_TOPOLOGY, "SwitchName")
BLOCK_LINES = _Grouping(BLOCK_TOPOLOGY, "BlockName", ("BlockSizes",))


def _grouped(lines: Iterable[tuple[int, str]], file: str, grouping: _Grouping) -> dict[str, str]:
    """node -> its switch or block: the lowest `Level=` (0 where not given: in topology.conf only
    leaf switches list `Nodes=`, and blocks have no levels) of the lines listing it, the first of
    those."""
    found: dict[str, tuple[int, str]] = {}
    key, passed_over = grouping.key.lower(), {word.lower() for word in grouping.passed_over}
    for number, line in lines:
        if not line.strip():
            continue
        pairs = _pairs(line, file, number)
        if key not in pairs and passed_over & set(pairs):
            continue
        if key not in pairs:
            starts = " or ".join(f"{word}=" for word in (grouping.key, *grouping.passed_over))
            raise SlurmConfError(f"a {grouping.plugin} line starts with {starts}", file, number)
        level = pairs.get("level", "0")
        if not level.isdigit():
            raise SlurmConfError(f"Level={level}: not a switch level", file, number)
        for name in _hostlist(pairs["nodes"], file, number, "Nodes") if "nodes" in pairs else ():
            if name not in found or int(level) < found[name][0]:
                found[name] = (int(level), pairs[key])
    return {name: group for name, (_, group) in found.items()}


def _topology_yaml_places(text: str, file: str) -> SlurmPlaces:
    """Leaves and racks from topology.yaml's `tree` and `block` topologies (`flat` places no
    node), the first `cluster_default: true` one first, then the others in the file's order; a
    node keeps the first place it is given. Errors name the file and the YAML line."""
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SlurmConfError(f"not YAML: {getattr(exc, 'problem', exc)}", file,
                             mark.line + 1 if mark else None) from None
    topologies = _yaml_list(document, file, "its top level (a list of topologies)") if document else []
    entries = [_yaml_map(entry, file, "a topology") for entry in topologies]
    entries.sort(key=lambda entry: _yaml_scalar(entry.get("cluster_default"), file).lower() != "true")
    leaves: dict[str, str] = {}
    racks: dict[str, str] = {}
    for entry in entries:
        for kind, key, named, found in (("tree", "switches", "switch", leaves), ("block", "blocks", "block", racks)):
            if kind not in entry:
                continue
            body = _yaml_map(entry[kind], file, f"{kind}:")
            for item in _yaml_list(body.get(key), file, f"{kind}: {key}:") if key in body else []:
                fields = _yaml_map(item, file, f"an item of {key}:")
                if named not in fields:
                    raise SlurmConfError(f"an item of {key}: has no {named}:", file, item.start_mark.line + 1)
                owner = _yaml_scalar(fields[named], file)
                if "nodes" in fields:  # in a tree only the leaf switches list nodes
                    nodes = fields["nodes"]
                    for name in _hostlist(_yaml_scalar(nodes, file), file, nodes.start_mark.line + 1, "nodes"):
                        found.setdefault(name, owner)
    return SlurmPlaces(leaves, racks)


def _yaml_map(node: Optional[yaml.Node], file: str, what: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise SlurmConfError(f"{what} is not a mapping", file, node.start_mark.line + 1 if node else None)
    return {key.value: value for key, value in node.value if isinstance(key, yaml.ScalarNode)}


def _yaml_list(node: Optional[yaml.Node], file: str, what: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise SlurmConfError(f"{what} is not a list", file, node.start_mark.line + 1 if node else None)
    return list(node.value)


def _yaml_scalar(node: Optional[yaml.Node], file: str) -> str:
    if node is None:
        return ""
    if not isinstance(node, yaml.ScalarNode):
        raise SlurmConfError("expected a single value", file, node.start_mark.line + 1)
    return str(node.value)


def _hostlist(expression: str, file: str, line: int, what: str) -> list[str]:
    try:
        names = hostlist.expand_hostlist(expression, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise SlurmConfError(f"{what}={expression}: not a hostlist expression ({exc})", file, line) from None
    if not names:
        raise SlurmConfError(f"{what}= is empty", file, line)
    return names


def _ports(text: str, file: str, line: int) -> list[int]:
    """Port=6818, Port=40001-40032 or Port=[1,3-4]: node_conf.c brackets a bare range first."""
    expression = f"[{text}]" if not text.startswith("[") and ("-" in text or "," in text) else text
    ports = []
    for value in _hostlist(expression, file, line, "Port"):
        if not value.isdigit() or not 0 < int(value) <= 65535:
            raise SlurmConfError(f"Port={text}: {value!r} is not a port number", file, line)
        ports.append(int(value))
    return ports


# -- a partition from a live Slurm ----------------------------------------------------------------

SINFO_TIMEOUT_S = 30
LIVE_SOURCE = "sinfo"  # what errors from a live partition name as their file
LIVE_TOPOLOGY = "scontrol show topology"  # and those from its topology


def parse_partition_sinfo(text: str) -> list[tuple[str, str]]:
    """(name, address) per node from `sinfo -h -N -p P -o '%N|%o'` (NodeName, NodeAddr), in order."""
    nodes: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, bar, address = line.strip().partition("|")
        if not bar or not name or " " in name or " " in address:
            raise SlurmConfError(f"not a `sinfo -N -o %N|%o` line: {line!r}", LIVE_SOURCE, number)
        nodes.setdefault(name, address or name)
    return list(nodes.items())


def live_partition_nodes(partition: str) -> list[SlurmNode]:
    """The nodes of a partition as the Slurm this machine is a client of says (sinfo), with each
    node's NodeAddr; a missing client, an unknown partition or an error is a SlurmConfError."""
    listed = _client(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%o"], LIVE_SOURCE)
    found = parse_partition_sinfo(listed)
    if not found:
        known = sorted(set(_client(["sinfo", "-h", "-o", "%R"], LIVE_SOURCE).split()))
        raise SlurmConfError(f"Slurm has no partition {partition!r} (or it has no nodes); "
                             f"partitions: {', '.join(known) or '(none)'}", LIVE_SOURCE)
    return [SlurmNode(name, name, address, None, (), LIVE_SOURCE, 0, address != name)
            for name, address in found]


def live_places() -> SlurmPlaces:
    """Where the live Slurm's topology places each node (`scontrol show topology`): topology/tree's
    Level=0 switches list their nodes (the ones above all theirs), topology/block's blocks theirs;
    none where Slurm has no topology ("No topology information available", on stderr, exit 0)."""
    return parse_scontrol_topology(_client(["scontrol", "show", "topology"], LIVE_TOPOLOGY))


def parse_scontrol_topology(text: str) -> SlurmPlaces:
    """Leaves and racks from `scontrol show topology`: SwitchName= lines (Level=, Nodes=) give
    each node's leaf switch, BlockName= lines (BlockIndex=, Nodes=, BlockSize=) its block."""
    lines = list(enumerate(text.splitlines(), 1))

    def of(grouping: _Grouping) -> dict[str, str]:
        start = f"{grouping.key.lower()}="
        return _grouped([(n, line) for n, line in lines if line.lstrip().lower().startswith(start)],
                        LIVE_TOPOLOGY, grouping)

    return SlurmPlaces(of(TREE_LINES), of(BLOCK_LINES))


def _client(argv: list[str], source: str) -> str:
    """A Slurm client's stdout; a missing client, a timeout or a failure is a SlurmConfError
    naming `source` as its file."""
    program = argv[0]
    try:
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=SINFO_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmConfError(f"Slurm's {program} is not installed here; give conf: the path of the "
                             "cluster's slurm.conf to read it without Slurm", source) from None
    except subprocess.TimeoutExpired:
        raise SlurmConfError(f"did not answer within {SINFO_TIMEOUT_S} s", source) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SlurmConfError(f"exited {done.returncode}: {last}", source)
    return done.stdout
