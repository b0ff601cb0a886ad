"""Read hosts and their SSH settings from a static Ansible inventory file, INI or YAML, without Ansible.

Operators keep their node lists in Ansible inventories; handover reads the same file the way
ansible-core 2.19 does (plugins/inventory/ini.py and yaml.py, inventory/data.py and group.py,
vars/manager.py), so that `handover inventory` and `ansible-inventory --list` agree host by host:

- groups, `[group:children]` / `children:` (declared before or after), hosts before any section
  and hosts only in `all` end up in `ungrouped`;
- host patterns with ranges: `node[01:16]` (zero padding from the start), `[a:c]`, `[1:10:2]`,
  several ranges in one name, `host:2222` setting ansible_port when the host is first seen;
- values: INI values go through Python's literal_eval, as Ansible does (a `# comment` after a
  `[group:vars]` value is part of a string value, not a comment); YAML as YAML;
- variables merged in Ansible's order: `all`, then the host's groups by depth, priority
  (ansible_group_priority) and name, then group_vars/ files beside the inventory (`all` first),
  then the host's own variables, then host_vars/ files;
- ansible_host, ansible_port, ansible_user and ansible_ssh_private_key_file (with the
  ansible_ssh_host/_port/_user and ansible_private_key_file spellings, which Ansible prefers
  when both are set) give each host's address, port, user and key.

Nothing is executed or evaluated: an executable file, a script (`#!`), an inventory plugin
configuration (YAML with `plugin:`), a directory, a TOML inventory or a vault-encrypted file is
refused, and so is a connection value that is a Jinja template. A file is read whole or not at
all: where Ansible would warn and skip part of it (an unknown key in a YAML group, a duplicate
key, a range that names no host) this refuses it, naming the file, the line and the problem.
"""
from __future__ import annotations

import ast
import dataclasses
import ipaddress
import os
import re
import shlex
import stat
import string
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

import hostlist
import yaml
from yaml.constructor import ConstructorError

from inventory.source_error import SourceFileError, quoted

INI_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
INI_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
YAML_EXTENSIONS = (".yml", ".yaml", ".json")
VAULT_HEADER = "$ANSIBLE_VAULT;"

# Ansible's variable names for each connection setting; the first one present wins, as in
# ansible.constants.MAGIC_VARIABLE_MAPPING (and the ssh plugin, which takes the last listed).
ADDRESS_VARS = ("ansible_ssh_host", "ansible_host")
PORT_VARS = ("ansible_ssh_port", "ansible_port")
USER_VARS = ("ansible_ssh_user", "ansible_user")
KEY_VARS = ("ansible_ssh_private_key_file", "ansible_private_key_file")


class AnsibleInventoryError(SourceFileError):
    """An inventory handover will not read; str() is one line naming the file and line."""


class _Var(NamedTuple):
    """A variable's value and where it was set, so a bad one can be blamed precisely."""

    value: Any
    file: str
    line: Optional[int]


@dataclass(frozen=True)
class _Vaulted:
    """A `!vault` value: encrypted, so unreadable here."""

    text: str


@dataclass
class _Group:
    name: str
    file: str
    line: Optional[int]
    hosts: list[str] = field(default_factory=list)
    # hosts as a set, kept beside the list: asking the list whether it holds a host grew with hosts x hosts
    host_set: set[str] = field(default_factory=set)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    variables: dict[str, _Var] = field(default_factory=dict)
    priority: int = 1


@dataclass
class _Host:
    name: str
    file: str
    line: Optional[int]
    groups: list[str] = field(default_factory=list)  # groups listing it directly
    variables: dict[str, _Var] = field(default_factory=dict)


@dataclass(frozen=True)
class Connection:
    """How Ansible would reach a host over SSH; None is "not set", left to ssh's defaults."""

    address: str
    port: Optional[int]
    user: Optional[str]
    identity_file: Optional[str]  # as written; relative paths are the caller's to resolve


@dataclass(frozen=True)
class AnsibleHost:
    name: str
    groups: tuple[str, ...]  # the groups that list it directly (not `all`), in Ansible's order
    variables: dict[str, _Var]  # merged as Ansible merges them for this host
    file: str
    line: Optional[int]  # where the host is first named

    def value(self, name: str) -> Any:
        return self.variables[name].value if name in self.variables else None

    def connection(self) -> Connection:
        """The host's address, port, user and key, or AnsibleInventoryError for an unusable one."""
        address = self._pick(ADDRESS_VARS, _text_value)
        port = self._pick(PORT_VARS, _port_value)
        user = self._pick(USER_VARS, _text_value)
        key = self._pick(KEY_VARS, _text_value)
        return Connection(address if address is not None else self.name, port, user, key)

    def _pick(self, names: tuple[str, ...], convert) -> Any:
        for name in names:
            var = self.variables.get(name)
            if var is None or var.value is None:
                continue
            try:
                return convert(var.value)
            except ValueError as exc:
                raise AnsibleInventoryError(f"host {self.name!r}: {name}: {exc}", var.file, var.line) from None
        return None


@dataclass(frozen=True)
class AnsibleGroup:
    name: str
    hosts: tuple[str, ...]  # listed directly, in order
    children: tuple[str, ...]
    file: str
    line: Optional[int]


@dataclass(frozen=True)
class AnsibleInventory:
    path: str
    format: str  # "ini" or "yaml"
    hosts: dict[str, AnsibleHost]
    groups: dict[str, AnsibleGroup]  # including all and ungrouped
    files: tuple[str, ...] = ()  # every file read: the inventory, then its group_vars/host_vars files

    def group_hosts(self, name: str) -> list[AnsibleHost]:
        """The group's hosts and its descendants', breadth first in written order, each once."""
        if name not in self.groups:
            known = ", ".join(self.groups)
            raise AnsibleInventoryError(f"no group {name!r}; groups: {known}", self.path)
        order: dict[str, None] = {}  # ordered, and asked whether it holds a host in constant time
        queue, seen = [name], {name}
        while queue:
            group = self.groups[queue.pop(0)]
            order.update(dict.fromkeys(group.hosts))
            for child in group.children:
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
        return [self.hosts[host] for host in order]


def read_ansible_inventory(path: Union[str, os.PathLike]) -> AnsibleInventory:
    """Read a static inventory file and its group_vars/ and host_vars/, or raise AnsibleInventoryError."""
    file = os.path.normpath(os.path.abspath(path))
    text = _static_text(file)
    extension = os.path.splitext(file)[1].lower()
    builder = _Builder(file)
    fmt = "ini"
    if extension in ("",) + YAML_EXTENSIONS:
        root, yaml_error = _compose(text, file)
        if isinstance(root, yaml.MappingNode):
            fmt = "yaml"
            _read_yaml(root, file, builder)
        elif extension in YAML_EXTENSIONS:
            # Ansible falls back to its INI reader; when that fails too, the YAML problem is the one to tell.
            try:
                _read_ini(text, file, builder)
            except AnsibleInventoryError:
                raise yaml_error or AnsibleInventoryError(
                    f"expected a YAML mapping of groups, got {_kind(root)}", file, _line(root)) from None
        else:
            _read_ini(text, file, builder)
    else:
        _read_ini(text, file, builder)
    builder.reconcile()
    directory = os.path.dirname(file)
    group_vars, host_vars = (_VarsFiles(os.path.join(directory, "group_vars")),
                             _VarsFiles(os.path.join(directory, "host_vars")))
    inventory = builder.result(fmt, group_vars, host_vars)
    return dataclasses.replace(inventory, files=(file, *group_vars.read, *host_vars.read))


# ---------------------------------------------------------------- refusals


def _static_text(file: str) -> str:
    """The file's text, after refusing anything Ansible would run or could not read statically."""
    try:
        status = os.stat(file)
    except FileNotFoundError:
        raise AnsibleInventoryError("no such file", file) from None
    except OSError as exc:
        raise AnsibleInventoryError(f"cannot read: {exc.strerror}", file) from None
    if stat.S_ISDIR(status.st_mode):
        raise AnsibleInventoryError(
            "is a directory; Ansible would read every file in it, scripts and plugins included: "
            "name one static inventory file", file)
    if status.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
        raise AnsibleInventoryError(
            "is executable, so Ansible would run it as a dynamic inventory script; handover runs "
            "nothing from an inventory: give a static INI or YAML file", file)
    if file.lower().endswith(".toml"):
        raise AnsibleInventoryError("TOML inventories are not read; give an INI or YAML inventory", file)
    try:
        data = Path(file).read_bytes()
    except OSError as exc:
        raise AnsibleInventoryError(f"cannot read: {exc.strerror}", file) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AnsibleInventoryError(f"not UTF-8 text (byte {exc.start})", file) from None
    if text.startswith("#!"):
        raise AnsibleInventoryError(
            "starts with #!, a dynamic inventory script; handover runs nothing from an inventory: "
            "give a static INI or YAML file (e.g. the script's `--list` output, converted)", file, 1)
    if text.lstrip().startswith(VAULT_HEADER):
        raise AnsibleInventoryError("is encrypted with ansible-vault; handover cannot read it", file, 1)
    return text


# ---------------------------------------------------------------- the inventory being built


class _Builder:
    """Ansible's InventoryData, reduced to what a static file can say."""

    def __init__(self, file: str):
        self.file = file
        self.groups: dict[str, _Group] = {}
        self.hosts: dict[str, _Host] = {}
        self.add_group("all", file, None)
        self.add_group("ungrouped", file, None)
        self.add_child("all", "ungrouped", file, None)

    def add_group(self, name: Any, file: str, line: Optional[int]) -> str:
        if not isinstance(name, str) or not name:
            raise AnsibleInventoryError(f"group name {name!r} is not a string; quote it", file, line)
        if name not in self.groups:
            self.groups[name] = _Group(name, file, line)
        return name

    def add_host(self, name: str, group: str, port: Optional[int], file: str, line: Optional[int]) -> _Host:
        if not name:
            raise AnsibleInventoryError("empty host name", file, line)
        if name not in self.hosts:
            host = self.hosts[name] = _Host(name, file, line)
            if port:  # only when first seen, as Ansible's Host(name, port)
                host.variables["ansible_port"] = _Var(port, file, line)
        host = self.hosts[name]
        if name not in self.groups[group].host_set:
            self.groups[group].hosts.append(name)
            self.groups[group].host_set.add(name)
            host.groups.append(group)
        return host

    def add_child(self, parent: str, child: str, file: str, line: Optional[int]) -> None:
        if parent == child:
            raise AnsibleInventoryError(f"group {child!r} cannot be a child of itself", file, line)
        if child in self.groups[parent].children:
            return
        if child in self._ancestors(parent):
            raise AnsibleInventoryError(f"making {child!r} a child of {parent!r} creates a loop", file, line)
        self.groups[parent].children.append(child)
        if parent not in self.groups[child].parents:
            self.groups[child].parents.append(parent)

    def set_group_var(self, group: str, key: Any, var: _Var) -> None:
        if key == "ansible_group_priority":
            try:
                self.groups[group].priority = int(var.value)
            except (TypeError, ValueError):
                raise AnsibleInventoryError(
                    f"ansible_group_priority of group {group!r} must be an integer, got {quoted(var.value)}",
                    var.file, var.line) from None
            return
        self.groups[group].variables[_var_name(key)] = var

    def _ancestors(self, group: str) -> set[str]:
        return self._reachable(group, lambda name: self.groups[name].parents)

    @staticmethod
    def _reachable(group: str, edges: Callable[[str], Iterable[str]]) -> set[str]:
        """Every group reached from `group` along `edges` (its parents), not itself."""
        found: set[str] = set()
        stack = list(edges(group))
        while stack:
            name = stack.pop()
            if name not in found:
                found.add(name)
                stack.extend(edges(name))
        return found

    def reconcile(self) -> None:
        """Top-level groups under `all`; hosts with no other group in `ungrouped`, and only there."""
        for name in list(self.groups):
            if name != "all" and not self.groups[name].parents:
                self.add_child("all", name, self.file, None)
        for name in set(self.hosts) & set(self.groups):
            raise AnsibleInventoryError(
                f"{name!r} is both a host and a group; Ansible would set the host's variables on the group",
                self.hosts[name].file, self.hosts[name].line)
        ungrouped = self.groups["ungrouped"]
        leaving: set[str] = set()  # taken out of ungrouped's list at the end, in one pass, not one search each
        for host in self.hosts.values():
            member_of = set(host.groups)
            for group in host.groups:
                member_of |= self._ancestors(group)
            if "ungrouped" in host.groups:
                if member_of - {"all", "ungrouped"}:
                    host.groups.remove("ungrouped")
                    leaving.add(host.name)
            elif not member_of - {"all"}:
                ungrouped.hosts.append(host.name)
                ungrouped.host_set.add(host.name)
                host.groups.append("ungrouped")
        ungrouped.hosts = [name for name in ungrouped.hosts if name not in leaving]
        ungrouped.host_set -= leaving

    def _depths(self) -> dict[str, int]:
        """Longest distance from `all`, as Ansible's Group.depth ends up."""
        depth: dict[str, int] = {}

        def visit(name: str) -> int:
            if name not in depth:
                parents = self.groups[name].parents
                depth[name] = 1 + max(visit(parent) for parent in parents) if parents else 0
            return depth[name]

        for name in self.groups:
            visit(name)
        return depth

    def result(self, fmt: str, group_vars: "_VarsFiles", host_vars: "_VarsFiles") -> AnsibleInventory:
        depth = self._depths()
        hosts = {}
        for host in self.hosts.values():
            member_of: set[str] = set()
            for group in host.groups:
                member_of |= {group} | self._ancestors(group)
            ordered = sorted(member_of - {"all"},
                             key=lambda g: (depth[g], self.groups[g].priority, g))
            merged: dict[str, _Var] = dict(self.groups["all"].variables)
            for group in ordered:
                merged.update(self.groups[group].variables)
            merged.update(group_vars.of("all"))
            for group in ordered:
                merged.update(group_vars.of(group))
            merged.update(host.variables)
            merged.update(host_vars.of(host.name))
            hosts[host.name] = AnsibleHost(host.name, tuple(g for g in host.groups if g != "all"),
                                           merged, host.file, host.line)
        groups = {
            g.name: AnsibleGroup(g.name, tuple(g.hosts), tuple(g.children), g.file, g.line)
            for g in self.groups.values()
        }
        return AnsibleInventory(self.file, fmt, hosts, groups)


# ---------------------------------------------------------------- host patterns


_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_HEX_RANGE = r"\[(?:[0-9a-f]+:[0-9a-f]+)(?::[0-9]+)?\]"
_NUM_RANGE = r"\[(?:[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.IGNORECASE)
_IPV4_PART = rf"(?:[01]?[0-9]{{1,2}}|2[0-4][0-9]|25[0-5]|{_NUM_RANGE})"
_IPV4 = re.compile(rf"^(?:{_IPV4_PART}\.){{3}}{_IPV4_PART}$")
_BRACKETED_PORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")


def _is_ipv6(text: str) -> bool:
    """An IPv6 address, hexadecimal ranges allowed in place of a group, as Ansible's pattern admits."""
    if ":" not in text:
        return False
    try:
        ipaddress.IPv6Address(re.sub(_HEX_RANGE, "0", text, flags=re.IGNORECASE))
    except ValueError:
        return False
    return True


def _split_port(pattern: str) -> tuple[str, Optional[int]]:
    """parse_address(): (host, port) or, for what is no address at all, (pattern, None)."""
    host, port = pattern, None
    for regex in (_BRACKETED_PORT, _HOST_PORT):
        match = regex.match(host)
        if match:
            host, port = match.group(1), int(match.group(2))
    if _IPV4.match(host) or _is_ipv6(host) or _HOSTNAME.match(host):
        return host, port
    return pattern, None


# The most names one host pattern may give: what python-hostlist allows one of the YAML's
# hostlists, so a typo (node[0:99999999]) is refused before it is spelt out.
MAX_HOSTS = hostlist.MAX_SIZE


class _TooMany(ValueError):
    pass


def expand_host_pattern(pattern: str) -> list[str]:
    """`db[01:03]-[a:b]` -> db01-a, db01-b, ...; ValueError in Ansible's words where it refuses."""
    try:
        return _expand(pattern, MAX_HOSTS)
    except _TooMany:
        raise ValueError(f"host pattern {pattern!r} names more than {MAX_HOSTS} hosts") from None


def _expand(pattern: str, limit: int) -> list[str]:
    """expand_host_pattern's work, naming at most `limit` hosts (_TooMany beyond)."""
    if "[" not in pattern:
        return [pattern]
    pieces = pattern.replace("[", "|", 1).replace("]", "|", 1).split("|")
    if len(pieces) != 3:
        raise ValueError(f"unbalanced brackets in host range {pattern!r}")
    head, inner, tail = pieces
    bounds = inner.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError(f"host range [{inner}] must be begin:end or begin:end:step")
    begin, end = bounds[0] or "0", bounds[1]
    step = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise ValueError(f"host range [{inner}] must give an end")
    width = len(begin) if begin[0] == "0" and len(begin) > 1 else 0
    if width and len(end) != width:
        raise ValueError(f"host range [{inner}]: begin and end must have the same width")
    try:
        stride = int(step)
        if stride < 1:
            raise ValueError
    except ValueError:
        raise ValueError(f"host range [{inner}]: step must be a positive integer") from None
    if begin in string.ascii_letters and end in string.ascii_letters and len(begin) == len(end) == 1:
        first, last = string.ascii_letters.index(begin), string.ascii_letters.index(end)
        if first > last:
            raise ValueError(f"host range [{inner}] must have begin <= end")
        values = list(string.ascii_letters[first:last + 1:stride])
    else:
        try:
            numbers = range(int(begin), int(end) + 1, stride)
        except ValueError:
            raise ValueError(f"host range [{inner}] is neither numeric nor one letter to one letter") from None
        if len(numbers) > limit:
            raise _TooMany
        values = [str(n).zfill(width) if width else str(n) for n in numbers]
    if not values:
        raise ValueError(f"host range [{inner}] names no host (Ansible would silently add none)")
    if len(values) > limit:
        raise _TooMany
    names: list[str] = []
    for value in values:
        names.extend(_expand(f"{head}{value}{tail}", limit // len(values)))
    return names


def _hosts_of(pattern: str, file: str, line: Optional[int], ini: bool) -> tuple[list[str], Optional[int]]:
    host, port = _split_port(pattern)
    if ini and pattern.strip().endswith(":") and port is None:
        raise AnsibleInventoryError(
            f"host pattern {pattern!r} ends in ':', which is reserved for a port", file, line)
    try:
        names = expand_host_pattern(host)
    except ValueError as exc:
        raise AnsibleInventoryError(str(exc), file, line) from None
    if ini and any(name.strip() == "---" for name in names):
        raise AnsibleInventoryError(f"host pattern {pattern!r}: '---' is a sign this is a YAML file", file, line)
    return names, port


# ---------------------------------------------------------------- INI


def _ini_value(text: str) -> Any:
    """A value as Ansible's INI reader makes it: a Python literal when it is one, else the text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    except (TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"unreadable value {text!r} ({type(exc).__name__})") from None
    return _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple, set)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return value


def _read_ini(text: str, file: str, b: _Builder) -> None:
    group, state = "ungrouped", "hosts"
    pending: dict[str, dict[str, Any]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        section = INI_SECTION.match(line)
        if section:
            group, state = section.group(1), section.group(2) or "hosts"
            if state not in ("hosts", "children", "vars"):
                raise AnsibleInventoryError(
                    f"section [{group}:{state}] has unknown type {state!r}; use children or vars", file, number)
            if group not in b.groups:
                if state == "vars" and group not in pending:
                    pending[group] = {"line": number, "state": "vars", "parents": []}
                b.add_group(group, file, number)
            if group in pending and state != "vars":
                if pending[group]["state"] == "children":
                    _add_pending_children(b, group, pending, file)
                else:
                    del pending[group]
            continue
        if line.startswith("[") and line.endswith("]"):
            raise AnsibleInventoryError(
                f"invalid section {line!r}: no spaces, and only :children or :vars after the group name",
                file, number)
        if state == "hosts":
            _ini_host_line(line, group, file, number, b)
        elif state == "vars":
            if "=" not in line:
                raise AnsibleInventoryError(f"expected key=value in [{group}:vars], got {quoted(line)}", file, number)
            key, value = (part.strip() for part in line.split("=", 1))
            b.set_group_var(group, key, _Var(_ini_checked(value, file, number), file, number))
        else:
            match = INI_GROUP_NAME.match(line)
            if not match:
                raise AnsibleInventoryError(f"expected a group name in [{group}:children], got {quoted(line)}",
                                            file, number)
            child = match.group(1)
            if child not in b.groups:
                pending.setdefault(child, {"line": number, "state": "children", "parents": []})
                pending[child]["parents"].append(group)
            else:
                b.add_child(group, child, file, number)
    for name, declaration in pending.items():
        if declaration["state"] == "vars":
            raise AnsibleInventoryError(f"section [{name}:vars] is for group {name!r}, which is never defined",
                                        file, declaration["line"])
        raise AnsibleInventoryError(
            f"section [{declaration['parents'][-1]}:children] names group {name!r}, which is never defined",
            file, declaration["line"])


def _add_pending_children(b: _Builder, group: str, pending: dict, file: str) -> None:
    for parent in pending[group]["parents"]:
        b.add_child(parent, group, file, pending[group]["line"])
        if parent in pending and pending[parent]["state"] == "children":
            _add_pending_children(b, parent, pending, file)
    del pending[group]


def _ini_checked(text: str, file: str, line: int) -> Any:
    try:
        return _ini_value(text)
    except ValueError as exc:
        raise AnsibleInventoryError(str(exc), file, line) from None


def _ini_host_line(line: str, group: str, file: str, number: int, b: _Builder) -> None:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        raise AnsibleInventoryError(f"cannot split host line {line!r}: {exc}", file, number) from None
    if not tokens:
        return
    names, port = _hosts_of(tokens[0], file, number, ini=True)
    variables: dict[str, _Var] = {}
    for token in tokens[1:]:
        if "=" not in token:
            raise AnsibleInventoryError(f"expected key=value after host {tokens[0]!r}, got {quoted(token)}",
                                        file, number)
        key, value = token.split("=", 1)
        variables[key] = _Var(_ini_checked(value, file, number), file, number)
    for name in names:
        host = b.add_host(name, group, port, file, number)
        host.variables.update(variables)


# ---------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """YAML as Ansible's loader reads it: `!unsafe` is text, `!vault` is an encrypted value."""


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]


_Loader.add_constructor("!unsafe", _unsafe)
_Loader.add_constructor("!vault", lambda loader, node: _Vaulted(str(node.value)))
_Loader.add_constructor("!vault-encrypted", lambda loader, node: _Vaulted(str(node.value)))


def _compose(text: str, file: str) -> tuple[Optional[yaml.Node], Optional[AnsibleInventoryError]]:
    try:
        return yaml.compose(text, Loader=_Loader), None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "unreadable"
        return None, AnsibleInventoryError(f"YAML syntax error: {problem}", file,
                                           mark.line + 1 if mark is not None else None)
    except yaml.YAMLError as exc:
        return None, AnsibleInventoryError(f"YAML error: {exc}", file)


def _line(node: Optional[yaml.Node]) -> Optional[int]:
    return node.start_mark.line + 1 if node is not None else None


def _kind(node: Optional[yaml.Node]) -> str:
    if node is None:
        return "an empty file"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "null" if node.tag == "tag:yaml.org,2002:null" else quoted(node.value)


def _construct(node: yaml.Node, file: str) -> Any:
    loader = _Loader("")
    try:
        return loader.construct_document(node)
    except ConstructorError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise AnsibleInventoryError(f"unreadable YAML value: {exc.problem or exc}", file,
                                    mark.line + 1 if mark is not None else _line(node)) from None
    except (TypeError, ValueError) as exc:
        raise AnsibleInventoryError(f"unreadable YAML value: {exc}", file, _line(node)) from None


def _pairs(node: yaml.MappingNode, file: str, what: str) -> list[tuple[Any, yaml.Node, int]]:
    """(constructed key, value node, key line) in written order; a key written twice is refused.
    A key of the mapping's own replaces one it merged (`<<: *base`), as in YAML and Ansible."""
    own = {id(key_node) for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge"}
    _Loader("").flatten_mapping(node)  # merged pairs first, then the mapping's own
    pairs: dict[Any, tuple[Any, yaml.Node, int]] = {}
    written: dict[Any, int] = {}  # the line of each key the mapping itself gives
    for key_node, value_node in node.value:
        key = _construct(key_node, file)
        line = _line(key_node) or 0
        try:
            first = written.get(key) if id(key_node) in own else None
        except TypeError:
            raise AnsibleInventoryError(f"{what}: a key must be a plain value, got {_kind(key_node)}",
                                        file, line) from None
        if first is not None:
            raise AnsibleInventoryError(
                f"{what}: {key!r} given twice (first at line {first}); Ansible would keep only the last",
                file, line)
        if id(key_node) in own:
            written[key] = line
        pairs[key] = (key, value_node, line)
    return list(pairs.values())


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _read_yaml(root: yaml.MappingNode, file: str, b: _Builder) -> None:
    pairs = _pairs(root, file, "the top level")
    if not pairs:
        raise AnsibleInventoryError("empty YAML inventory", file, _line(root))
    for key, value_node, line in pairs:
        if key == "plugin" and not _is_null(value_node) and _construct(value_node, file):
            raise AnsibleInventoryError(
                "an inventory plugin configuration (`plugin:`), which Ansible would run; handover runs "
                "nothing from an inventory: give a static INI or YAML file", file, line)
    for key, value_node, line in pairs:
        _yaml_group(key, value_node, line, file, b)


_SECTIONS = ("hosts", "children", "vars")


def _yaml_group(name: Any, node: yaml.Node, line: int, file: str, b: _Builder) -> str:
    if not isinstance(node, yaml.MappingNode) and not _is_null(node):
        raise AnsibleInventoryError(
            f"group {name!r}: expected a mapping of hosts, children and vars, got {_kind(node)} "
            "(Ansible would skip the group)", file, line)
    group = b.add_group(name, file, line)
    if not isinstance(node, yaml.MappingNode):
        return group
    for key, value_node, key_line in _pairs(node, file, f"group {group!r}"):
        if key not in _SECTIONS:
            raise AnsibleInventoryError(
                f"group {group!r}: unknown key {key!r}; a group has hosts, children and vars "
                "(Ansible would skip it)", file, key_line)
        entries: list[tuple[Any, Optional[yaml.Node], int]]
        if isinstance(value_node, yaml.ScalarNode) and value_node.tag == "tag:yaml.org,2002:str":
            entries = [(value_node.value, None, key_line)]  # a string stands for {string: null}
        elif _is_null(value_node):
            continue
        elif isinstance(value_node, yaml.MappingNode):
            entries = list(_pairs(value_node, file, f"group {group!r} {key}"))
        else:
            raise AnsibleInventoryError(f"group {group!r}: {key} must be a mapping, got {_kind(value_node)}",
                                        file, key_line)
        for entry, entry_node, entry_line in entries:
            if key == "vars":
                value = _construct(entry_node, file) if entry_node is not None else None
                b.set_group_var(group, entry, _Var(value, file, entry_line))
            elif key == "children":
                child = _yaml_group(entry, entry_node if entry_node is not None else yaml.ScalarNode(
                    "tag:yaml.org,2002:null", ""), entry_line, file, b)
                b.add_child(group, child, file, entry_line)
            else:
                _yaml_hosts(group, entry, entry_node, entry_line, file, b)
    return group


def _yaml_hosts(group: str, pattern: Any, node: Optional[yaml.Node], line: int, file: str, b: _Builder) -> None:
    if not isinstance(pattern, str):
        raise AnsibleInventoryError(
            f"group {group!r}: host {pattern!r} is not a string; quote it", file, line)
    names, port = _hosts_of(pattern, file, line, ini=False)
    variables: dict[str, _Var] = {}
    if node is not None and not _is_null(node):
        if not isinstance(node, yaml.MappingNode):
            value = _construct(node, file)
            if value:  # Ansible takes any false value for "no variables"
                raise AnsibleInventoryError(
                    f"host {pattern!r}: expected a mapping of variables, got {_kind(node)}", file, line)
        else:
            for key, value_node, key_line in _pairs(node, file, f"host {pattern!r}"):
                variables[_var_name(key)] = _Var(_construct(value_node, file), file, key_line)
    for name in names:
        host = b.add_host(name, group, port, file, line)
        host.variables.update(variables)


def _var_name(key: Any) -> str:
    """A variable's name; Ansible still accepts non-string names (deprecated) and shows them as text."""
    if isinstance(key, bool):
        return str(key).lower()
    return key if isinstance(key, str) else str(key)


# ---------------------------------------------------------------- group_vars/ and host_vars/


class _VarsFiles:
    """group_vars/NAME[.yml|.yaml|.json] or group_vars/NAME/..., as Ansible's host_group_vars finds them."""

    def __init__(self, directory: str):
        self.directory = directory
        self.cache: dict[str, dict[str, _Var]] = {}
        self.read: list[str] = []  # the files read, in order

    def of(self, name: str) -> dict[str, _Var]:
        if name not in self.cache:
            merged: dict[str, _Var] = {}
            if not name.startswith(os.sep) and os.path.isdir(self.directory):
                for file in self._files(name):
                    merged.update(_vars_file(file))
                    self.read.append(file)
            self.cache[name] = merged
        return self.cache[name]

    def _files(self, name: str) -> list[str]:
        base = os.path.join(self.directory, name)
        for extension in ("",) + YAML_EXTENSIONS:
            candidate = base + extension
            if os.path.isdir(candidate):
                return _directory_files(candidate)
            if os.path.exists(candidate):
                return [candidate]
        return []


def _directory_files(directory: str) -> list[str]:
    found = []
    for entry in sorted(os.listdir(directory)):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        path = os.path.join(directory, entry)
        extension = os.path.splitext(entry)[1]
        if os.path.isdir(path) and not extension:
            found.extend(_directory_files(path))
        elif os.path.isfile(path) and (not extension or extension in YAML_EXTENSIONS):
            found.append(path)
    return found


def _vars_file(file: str) -> dict[str, _Var]:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AnsibleInventoryError(f"cannot read variables file: {exc}", file) from None
    if text.lstrip().startswith(VAULT_HEADER):
        raise AnsibleInventoryError(
            "is encrypted with ansible-vault; handover cannot read the variables it may set", file, 1)
    root, error = _compose(text, file)
    if error:
        raise error
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        if _construct(root, file) in (None, "", [], {}):
            return {}
        raise AnsibleInventoryError(f"expected a mapping of variables, got {_kind(root)}", file, _line(root))
    return {_var_name(key): _Var(_construct(node, file), file, line)
            for key, node, line in _pairs(root, file, "variables")}


# ---------------------------------------------------------------- connection values


def _text_value(value: Any) -> str:
    if isinstance(value, _Vaulted):
        raise ValueError("is encrypted with ansible-vault; handover cannot read it")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected text, got {value!r}")
    text = str(value)
    if "{{" in text or "{%" in text:
        raise ValueError(f"{text!r} is a Jinja template; handover does not evaluate templates")
    if not text.strip():
        raise ValueError("is empty")
    return text


def _port_value(value: Any) -> int:
    if isinstance(value, _Vaulted):
        raise ValueError("is encrypted with ansible-vault; handover cannot read it")
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        raise ValueError(f"{value!r} is a Jinja template; handover does not evaluate templates")
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
        raise ValueError(f"expected a port number, got {value!r}")
    port = int(value)
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be between 1 and 65535, got {port}")
    return port
