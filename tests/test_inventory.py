"""The inventory loader: good files become the model, every bad one gets a one-line, located error."""
from __future__ import annotations

import dataclasses
import hashlib
import textwrap
from pathlib import Path

import pytest
import yaml

from handover.session import run_header
from inventory.loader import (
    EXPECT_KEYS,
    EXPECT_READERS,
    NAME_RULE,
    PROFILES_DIR,
    InventoryError,
    known_profiles,
    load_inventory,
    load_profile,
)
from inventory.model import Expectations, ExpectOverride, Reference, ScratchPath, SshSettings, placement
from reports.html import render_html
from reports.ledger import Ledger, now_iso, read_ledger
from reports.results import build_results
from reports.schema import validate_ledger_entry, validate_results

REPO = Path(__file__).resolve().parent.parent


def write(directory: Path, text: str, name: str = "inv.yaml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def error_of(path: Path) -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return caught.value


def assert_error(path: Path, line, field, problem: str) -> None:
    """The exception's attributes and its one-line rendering agree with what the CLI will print."""
    error = error_of(path)
    assert (error.file, error.line, error.field) == (str(path), line, field)
    location = str(path) if line is None else f"{path}:{line}"
    expected = ": ".join(part for part in (location, field, problem) if part)
    assert str(error) == expected
    assert "\n" not in str(error)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """An identity file for inventories that use ssh transport."""
    path = tmp_path / "id_test"
    path.write_text("not a real key; the loader only checks that it exists\n")
    return path


def minimal(key: Path, extra: str = "") -> str:
    """A valid inventory of one node, plus extra top-level YAML starting at line 5."""
    head = f"cluster: demo\nprofile: cpu-only\nssh: {{identity_file: {key}}}\nnodes: [gpu001]\n"
    return head + textwrap.dedent(extra).lstrip("\n")


# ---------------------------------------------------------------- good paths


def test_both_node_spellings_keep_written_order_and_default_address(tmp_path, key):
    path = write(tmp_path, f"""
        cluster: demo
        profile: cpu-only
        ssh: {{user: root, identity_file: {key}}}
        nodes:
          - gpu[003,001-002]
          - {{name: gpu005, address: 10.0.0.5, port: 2222}}
          - gpu004
        """)
    cluster = load_inventory(path)
    assert [n.name for n in cluster.nodes] == ["gpu003", "gpu001", "gpu002", "gpu005", "gpu004"]
    assert cluster.node("gpu001").address == "gpu001"
    gpu005 = cluster.node("gpu005")
    assert gpu005.address == "10.0.0.5"
    assert gpu005.ssh == SshSettings(user="root", port=2222, identity_file=str(key))
    assert cluster.node("gpu004").ssh.port is None
    assert {n.transport for n in cluster.nodes} == {"ssh"}
    assert cluster.transport == "ssh"
    assert (cluster.groups, cluster.scratch) == ({}, ())


def test_digest_and_source_path(tmp_path, key):
    path = write(tmp_path, minimal(key))
    cluster = load_inventory(path)
    assert cluster.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert cluster.source_path == str(path)
    assert cluster.name == "demo"


def test_full_ssh_block(tmp_path, key):
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = write(tmp_path, f"""
        cluster: demo
        profile: cpu-only
        python: /usr/bin/python3.11
        sudo: true
        ssh: {{user: ops, port: 2200, identity_file: {key}, known_hosts: {known},
              host_keys: strict, jump: "admin@bastion:22,jump2", connect_timeout: 2.5}}
        nodes: [gpu001]
        """)
    node = load_inventory(path).node("gpu001")
    assert node.ssh == SshSettings(
        user="ops", port=2200, identity_file=str(key), known_hosts=str(known),
        host_keys="strict", jump="admin@bastion:22,jump2", connect_timeout=2.5,
    )
    assert (node.python, node.sudo) == ("/usr/bin/python3.11", True)


def test_an_ipv6_address_is_kept_in_the_form_known_hosts_holds(tmp_path):
    """ssh writes an IPv6 address compressed and in lower case into known_hosts, and the host key
    check looks the node up by its address: FD00:77:0:0::2 would not be found there."""
    path = write(tmp_path, """
        cluster: demo
        profile: cpu-only
        nodes:
          - {name: gpu001, address: "FD00:77:0:0::2", data_address: "fd00:0078:0000::0002"}
          - {name: gpu002, address: 10.0.0.2}
        """)
    cluster = load_inventory(path)
    assert (cluster.node("gpu001").address, cluster.node("gpu001").data_address) == ("fd00:77::2", "fd00:78::2")
    assert (cluster.node("gpu002").address, cluster.node("gpu002").data_address) == ("10.0.0.2", None)


def test_precedence_cluster_then_group_then_node(tmp_path, key):
    path = write(tmp_path, f"""
        cluster: demo
        profile: cpu-only
        python: python3
        ssh: {{user: root, identity_file: {key}, jump: bastion}}
        nodes:
          - gpu[001-003]
          - {{name: gpu004, python: /node/python, jump: null}}
        groups:
          venv-nodes: {{nodes: "gpu[002-004]", python: /opt/venv/bin/python, sudo: true, user: admin}}
          ops: {{nodes: [gpu004, gpu003]}}
        """)
    cluster = load_inventory(path)
    gpu001, gpu002, gpu003, gpu004 = cluster.nodes
    assert (gpu001.python, gpu001.sudo, gpu001.ssh.user, gpu001.groups) == ("python3", False, "root", ())
    assert (gpu002.python, gpu002.sudo, gpu002.ssh.user) == ("/opt/venv/bin/python", True, "admin")
    assert gpu002.groups == ("venv-nodes",)
    assert gpu003.groups == ("ops", "venv-nodes")
    assert (gpu004.python, gpu004.ssh.jump, gpu004.ssh.user) == ("/node/python", None, "admin")
    assert gpu002.ssh.jump == "bastion"
    assert cluster.groups == {"venv-nodes": ("gpu002", "gpu003", "gpu004"), "ops": ("gpu003", "gpu004")}


def test_rack_and_leaf_come_from_groups_or_the_node(tmp_path, key):
    """Where a node sits is a setting like any other: a rack's group says it, a node may differ."""
    path = write(tmp_path, f"""
        cluster: demo
        profile: cpu-only
        ssh: {{identity_file: {key}}}
        nodes:
          - gpu[001-003]
          - {{name: gpu004, rack: r2, leaf: leaf-b}}
        groups:
          rack1: {{nodes: "gpu[001-003]", rack: r1, leaf: leaf-a}}
          odd: {{nodes: [gpu003], leaf: leaf-c}}
        """)
    with pytest.raises(InventoryError, match=r":9: .*leaf.* is in both groups"):
        load_inventory(path)
    path.write_text(path.read_text().replace("leaf: leaf-c", "rack: r1"))
    placed = [(node.name, node.rack, node.leaf) for node in load_inventory(path).nodes]
    assert placed == [("gpu001", "r1", "leaf-a"), ("gpu002", "r1", "leaf-a"), ("gpu003", "r1", "leaf-a"),
                      ("gpu004", "r2", "leaf-b")]
    path.write_text(path.read_text().replace("rack: r2", "rack: 'r 2'"))
    with pytest.raises(InventoryError, match=r":6: nodes\[1\]\.rack: invalid rack name 'r 2'"):
        load_inventory(path)


def test_groups_that_agree_or_are_settled_by_the_node_are_fine(tmp_path, key):
    path = write(tmp_path, minimal(key, """
        groups:
          a: {nodes: "gpu[001-002]", python: /opt/a}
          b: {nodes: gpu002, python: /opt/a}
          c: {nodes: gpu003, python: /opt/c}
          d: {nodes: gpu003, python: /opt/d}
        """).replace("nodes: [gpu001]", "nodes: [gpu001, gpu002, {name: gpu003, python: /mine}]"))
    cluster = load_inventory(path)
    assert cluster.node("gpu002").python == "/opt/a"
    assert cluster.node("gpu003").python == "/mine"


def test_relative_and_home_paths_are_expanded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id").write_text("")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_rack2").write_text("")
    monkeypatch.setenv("HOME", str(home))
    path = write(tmp_path / "inv", """
        cluster: demo
        profile: cpu-only
        ssh: {identity_file: ~/.ssh/id, known_hosts: ~/.ssh/not-yet, host_keys: accept-new}
        nodes: [gpu001, {name: gpu002, identity_file: ../keys/id_rack2, known_hosts: hosts}]
        """)
    cluster = load_inventory(path)
    assert cluster.node("gpu001").ssh.identity_file == str(home / ".ssh" / "id")
    assert cluster.node("gpu001").ssh.known_hosts == str(home / ".ssh" / "not-yet")
    assert cluster.node("gpu002").ssh.identity_file == str(tmp_path / "keys" / "id_rack2")
    assert cluster.node("gpu002").ssh.known_hosts == str(tmp_path / "inv" / "hosts")


def test_scratch_spellings(tmp_path, key):
    path = write(tmp_path, minimal(key, """
        scratch:
          - {path: /scratch/handover/, kind: local}
          - /mnt/nvme0/handover
          - {path: /lustre/handover, kind: shared, destructive: true}
        """))
    assert load_inventory(path).scratch == (
        ScratchPath("/scratch/handover", "local", False),
        ScratchPath("/mnt/nvme0/handover", "local", False),
        ScratchPath("/lustre/handover", "shared", True),
    )


def test_scalars_in_string_fields_stay_as_written(tmp_path, key):
    path = write(tmp_path, f"""
        cluster: 2026.11
        profile: cpu-only
        ssh: {{identity_file: {key}, user: 0700}}
        nodes: [no, {{name: yes, address: 10.0}}]
        """)
    cluster = load_inventory(path)
    assert cluster.name == "2026.11"
    assert [n.name for n in cluster.nodes] == ["no", "yes"]
    assert cluster.node("yes").address == "10.0"
    assert cluster.node("no").ssh.user == "0700"


def test_yaml_anchors_and_merge_keys(tmp_path, key):
    path = write(tmp_path, minimal(key, """
        groups:
          a: &venv {nodes: gpu001, python: /opt/venv/bin/python, sudo: true}
          b: {<<: *venv, sudo: false}
        """))
    with pytest.raises(InventoryError, match=r"groups\.b\.sudo: false conflicts with true from group 'a'"):
        load_inventory(path)
    write(tmp_path, minimal(key, """
        groups:
          a: &venv {nodes: gpu001, python: /opt/venv/bin/python}
          b: {<<: *venv, user: ops}
        """))
    node = load_inventory(path).node("gpu001")
    assert (node.python, node.ssh.user, node.groups) == ("/opt/venv/bin/python", "ops", ("a", "b"))


def test_local_yaml_loads():
    cluster = load_inventory(REPO / "inventory" / "local.yaml")
    assert (cluster.name, cluster.transport, cluster.profile.name) == ("local", "local", "cpu-only")
    (node,) = cluster.nodes
    assert (node.name, node.address, node.transport, node.ssh) == ("localhost", "localhost", "local", SshSettings())


def test_example_cluster_loads_once_its_key_files_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    example = REPO / "inventory" / "example-cluster.yaml"
    error = error_of(example)
    assert (error.field, error.problem) == (
        "ssh.identity_file", f"no such file '{tmp_path}/.ssh/handover_ed25519'"
    )
    assert example.read_text().splitlines()[error.line - 1].lstrip().startswith("identity_file:")
    (tmp_path / ".ssh" / "known_hosts.d").mkdir(parents=True)
    (tmp_path / ".ssh" / "handover_ed25519").write_text("")
    (tmp_path / ".ssh" / "known_hosts.d" / "example-hgx").write_text("")
    cluster = load_inventory(example)
    assert len(cluster.nodes) == 32
    assert (cluster.nodes[0].name, cluster.nodes[-1].name) == ("gpu001", "gpu032")
    assert cluster.nodes[0].ssh.jump == "handover@bastion.example.net:22"
    assert (cluster.nodes[0].ssh.user, cluster.nodes[0].sudo, cluster.nodes[0].groups) == ("admin", True, ("rack1",))
    assert (cluster.nodes[8].ssh.user, cluster.nodes[8].python) == ("root", "python3")
    assert {s.kind for s in cluster.scratch} == {"local", "shared"}
    memory = cluster.profile.references["memory_total"]
    assert (memory.value, memory.unit, memory.check) == (2048, "GiB", "memory")


def test_local_transport_ignores_ssh_but_still_checks_its_keys(tmp_path):
    path = write(tmp_path, """
        cluster: here
        profile: cpu-only
        transport: local
        sudo: true
        ssh: {identity_file: /nonexistent/key, known_hosts: /nonexistent/hosts}
        nodes: [{name: me, port: 2222}]
        """)
    (node,) = load_inventory(path).nodes
    assert (node.transport, node.ssh, node.sudo) == ("local", SshSettings(), True)
    write(tmp_path, """
        cluster: here
        profile: cpu-only
        transport: local
        ssh: {identity: /nonexistent/key}
        nodes: [me]
        """)
    assert_error(path, 4, "ssh.identity", "unknown key; did you mean 'identity_file'?")


# ---------------------------------------------------------------- profiles and references


def test_load_profile_by_name():
    profile = load_profile("cpu-only")
    assert profile.name == "cpu-only"
    assert profile.mandatory == ("reachable", "os", "kernel", "cpu", "memory", "uniformity")
    assert "ubuntu" in profile.expect.os_ids
    assert profile.expect.kernel_min == "4.18"
    assert profile.source_path == str(REPO / "inventory" / "profiles" / "cpu-only.yaml")
    for reference in profile.references.values():
        assert reference.source and reference.unit and reference.check


def test_profile_reference_bands_through_the_model():
    memory = load_profile("cpu-only").references["memory_total"]
    assert (memory.low_bound, memory.high_bound) == (2, None)
    assert memory.admits(2) and memory.admits(512) and not memory.admits(1.9)
    assert memory.criterion() == ">= 2 GiB"
    assert memory.margin(3) == pytest.approx(0.25)
    cores = load_profile("cpu-only").references["cpu_cores"]
    assert cores.admits(1) and not cores.admits(0)


def test_reference_overrides_merge_per_field(tmp_path, key):
    path = write(tmp_path, minimal(key, """
        references:
          memory_total: {value: 2048, lower: -0.02, upper: 0.01, source: "customer contract 2026-11"}
          cpu_cores: {value: 112}
          hbm_copy_bandwidth: {check: hbm_bandwidth, value: 0, lower: 2.4, unit: TB/s}
        """))
    references = load_inventory(path).profile.references
    assert references["memory_total"] == Reference(
        metric="memory_total", check="memory", value=2048, unit="GiB", lower=-0.02, upper=0.01,
        source="customer contract 2026-11",
    )
    assert references["memory_total"].criterion() == "2007.04 .. 2068.48 GiB"
    cores = references["cpu_cores"]
    assert (cores.value, cores.lower, cores.unit, cores.source) == (112, -0.5, "cores", "inventory inv.yaml")
    hbm = references["hbm_copy_bandwidth"]
    assert (hbm.low_bound, hbm.high_bound, hbm.source) == (2.4, None, "inventory inv.yaml")
    assert hbm.admits(2.4) and not hbm.admits(2.3)
    assert load_profile("cpu-only").references["memory_total"].value == 4


def test_profile_by_path_relative_to_the_inventory(tmp_path, key):
    write(tmp_path / "profiles", """
        profile: site
        description: A site profile.
        mandatory: [reachable]
        expect: {kernel_min: 5.10, cpu_model: "AMD EPYC 9[0-9]{3}"}
        """, name="site.yaml")
    path = write(tmp_path, minimal(key).replace("cpu-only", "profiles/site.yaml"))
    profile = load_inventory(path).profile
    assert (profile.name, profile.references) == ("site", {})
    assert profile.expect.declared() == {"kernel_min": "5.10", "cpu_model": "AMD EPYC 9[0-9]{3}"}
    assert profile.expect == Expectations(kernel_min="5.10", cpu_model="AMD EPYC 9[0-9]{3}")
    assert load_profile("profiles/site.yaml", relative_to=tmp_path).name == "site"
    assert load_profile("profiles/site.yaml", relative_to=path).name == "site"


def test_expect_keys_are_one_extensible_table():
    """The keys a profile may declare are the Expectations fields, each with its reader."""
    assert {"os_ids", "kernel_min", "cpu_model"} <= set(EXPECT_KEYS)
    assert EXPECT_KEYS == tuple(field.name for field in dataclasses.fields(Expectations))
    assert set(EXPECT_READERS) == set(EXPECT_KEYS)
    assert all(callable(validate) for validate in EXPECT_READERS.values())


def test_a_misspelt_expectation_is_an_error_not_a_silent_none():
    expect = load_profile("h200-sxm-8gpu").expect
    assert expect.gpu_count == 8
    with pytest.raises(AttributeError):
        _ = expect.gpu_cout  # a misspelt fact is an error, not None
    with pytest.raises(TypeError):
        Expectations(gpu_cout=8)


@pytest.mark.parametrize("name", known_profiles())
def test_every_expect_key_of_every_shipped_profile_loads_into_the_dataclass(name):
    """Each key written in the profile's `expect:` is a field of Expectations, set; no other is."""
    written = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())["expect"]
    expect = load_profile(name).expect
    assert written and set(written) <= set(EXPECT_KEYS)
    assert {key for key in EXPECT_KEYS if getattr(expect, key) is not None} == set(written)
    assert list(expect.declared()) == [key for key in EXPECT_KEYS if key in written]


# ---------------------------------------------------------------- file-level errors


def test_missing_file(tmp_path):
    assert_error(tmp_path / "nope.yaml", None, None, "no such file")


def test_missing_file_relative_to_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as caught:
        load_inventory("inventory/x.yaml")
    assert str(caught.value) == "inventory/x.yaml: no such file"


def test_yaml_syntax_error_has_the_line_yaml_reports(tmp_path):
    path = write(tmp_path, "cluster: demo\nprofile: cpu-only\nnodes:\n  - gpu001\n  bad: [\n")
    error = error_of(path)
    assert (error.line, error.field) == (5, None)
    assert str(error).startswith(f"{path}:5: YAML syntax error: ")


def test_empty_file_and_non_mapping(tmp_path):
    assert_error(write(tmp_path, "# nothing yet\n"), None, None,
                 "empty file; expected an inventory mapping")
    assert_error(write(tmp_path, "- gpu001\n"), 1, None,
                 "expected an inventory mapping, got a list")


def test_missing_required_top_level_key(tmp_path):
    assert_error(write(tmp_path, "cluster: demo\nnodes: [a]\n"), 1, None, "missing required key 'profile'")


def test_duplicate_yaml_key(tmp_path, key):
    path = write(tmp_path, minimal(key, "cluster: again\n"))
    assert_error(path, 5, "cluster", "duplicate key; first given at line 1")


# ---------------------------------------------------------------- unknown keys


def test_unknown_top_level_key_with_did_you_mean(tmp_path, key):
    path = write(tmp_path, minimal(key, "scrach: [/scratch]\n"))
    assert_error(path, 5, "scrach", "unknown key; did you mean 'scratch'?")


def test_unknown_key_without_a_close_match_lists_the_allowed(tmp_path, key):
    path = write(tmp_path, minimal(key, "ssh_options: {}\n").replace("ssh: ", "ssh:  "))
    error = error_of(path)
    assert str(error) == (
        f"{path}:5: ssh_options: unknown key; allowed: cluster, profile, transport, python, sudo,"
        " ssh, nodes, groups, scratch, references, launch, cluster_id, waivers, sign_off, expect"
    )


def test_unknown_ssh_key_with_did_you_mean(tmp_path, key):
    path = write(tmp_path, f"""
        cluster: demo
        profile: cpu-only
        ssh:
          identity_file: {key}
          host_key: strict
        nodes: [gpu001]
        """)
    assert_error(path, 5, "ssh.host_key", "unknown key; did you mean 'host_keys'?")


@pytest.mark.parametrize("extra, line, field, problem", [
    ("nodes: [{name: gpu002, adress: 10.0.0.2}]", 5, "nodes[0].adress",
     "unknown key; did you mean 'address'?"),
    ("groups: {g: {nodes: gpu001, pyhton: /opt/py}}", 5, "groups.g.pyhton",
     "unknown key; did you mean 'python'?"),
    ("scratch: [{path: /scratch, knd: local}]", 5, "scratch[0].knd",
     "unknown key; did you mean 'kind'?"),
    ("references: {memory_total: {vaule: 8}}", 5, "references.memory_total.vaule",
     "unknown key; did you mean 'value'?"),
])
def test_unknown_nested_keys(tmp_path, key, extra, line, field, problem):
    text = minimal(key, extra + "\n")
    if extra.startswith("nodes:"):
        text = text.replace("nodes: [gpu001]\n", "")
    assert_error(write(tmp_path, text), line if not extra.startswith("nodes:") else 4, field, problem)


def test_unknown_key_in_a_profile_points_at_the_profile(tmp_path, key):
    profile = write(tmp_path, """
        profile: bad
        description: A profile with a typo.
        mandatory: [reachable]
        expect:
          kernel_minimum: "5.4"
        """, name="bad.yaml")
    inventory = write(tmp_path, minimal(key).replace("cpu-only", "bad.yaml"))
    error = error_of(inventory)
    assert str(error) == f"{profile}:5: expect.kernel_minimum: unknown key; did you mean 'kernel_min'?"
    assert (error.file, error.line, error.field) == (str(profile), 5, "expect.kernel_minimum")


# ---------------------------------------------------------------- wrong types and values


@pytest.mark.parametrize("ssh, field, problem", [
    ("{port: abc}", "ssh.port", "expected an integer, got 'abc'"),
    ("{port: 22.5}", "ssh.port", "expected an integer, got 22.5"),
    ("{port: '22'}", "ssh.port", "expected an integer, got '22'"),
    ("{port: 70000}", "ssh.port", "port must be between 1 and 65535, got 70000"),
    ("{connect_timeout: 0}", "ssh.connect_timeout", "must be a positive number of seconds, got 0"),
    ("{connect_timeout: soon}", "ssh.connect_timeout", "expected a number, got 'soon'"),
    ("{user: [a, b]}", "ssh.user", "expected a string, got a list"),
    ("{host_keys: yes-please}", "ssh.host_keys",
     "unknown host key policy 'yes-please'; allowed: strict, accept-new"),
    ("{host_keys: accept}", "ssh.host_keys",
     "unknown host key policy 'accept'; did you mean 'accept-new'? allowed: strict, accept-new"),
    ("{jump: 'admin@bastion:99999'}", "ssh.jump",
     "expected [user@]host[:port] (like ssh -J), got 'admin@bastion:99999'"),
    # What ssh would read as an option (mpirun hands hosts and users to ssh as words of their own)
    ("{user: '-oProxyCommand=x'}", "ssh.user", "expected a login name, got '-oProxyCommand=x'"),
    ("{user: 'a b'}", "ssh.user", "expected a login name, got 'a b'"),
    ("{jump: '-oProxyCommand=x'}", "ssh.jump",
     "expected [user@]host[:port] (like ssh -J), got '-oProxyCommand=x'"),
    ("{jump: 'ops@bastion,-oProxyCommand=x'}", "ssh.jump",
     "expected [user@]host[:port] (like ssh -J), got 'ops@bastion,-oProxyCommand=x'"),
    ("{jump: '-l@bastion'}", "ssh.jump", "expected [user@]host[:port] (like ssh -J), got '-l@bastion'"),
    ("{jump: 'u@[:::::]:22'}", "ssh.jump", "expected [user@]host[:port] (like ssh -J), got 'u@[:::::]:22'"),
    ("[root]", "ssh", "expected a mapping, got a list"),
])
def test_wrong_ssh_values(tmp_path, ssh, field, problem):
    path = write(tmp_path, f"cluster: demo\nprofile: cpu-only\nssh: {ssh}\nnodes: [gpu001]\n")
    assert_error(path, 3, field, problem)


@pytest.mark.parametrize("node, field, problem", [
    ("{name: a, address: '-oProxyCommand=x'}", "nodes[0].address",
     "expected a host name or IP address, got '-oProxyCommand=x'"),
    ("{name: a, data_address: 'a,b'}", "nodes[0].data_address", "expected a host name or IP address, got 'a,b'"),
    ("{name: a, address: '[::1]'}", "nodes[0].address", "expected a host name or IP address, got '[::1]'"),
    ("{name: a, user: '-l'}", "nodes[0].user", "expected a login name, got '-l'"),
    # srun reads a word after its own options as one of them: -o would name its output file
    ("{name: a, python: '-o'}", "nodes[0].python",
     "expected a program on the node (a path or a command name), got '-o'"),
])
def test_an_address_or_user_that_ssh_would_read_as_an_option_is_refused(tmp_path, node, field, problem):
    assert_error(write(tmp_path, f"cluster: demo\nprofile: cpu-only\nnodes: [{node}]\n"), 3, field, problem)


def test_addresses_users_and_jumps_as_ssh_takes_them_are_kept(tmp_path):
    path = write(tmp_path, "cluster: demo\nprofile: cpu-only\n"
                           "ssh: {jump: 'ops@bastion:2222,[2001:db8::1]:22,jump2'}\n"
                           "nodes: [{name: a, address: 'fe80::1%eth0', data_address: 10.0.0.1, user: svc.acme},\n"
                           "        {name: b, address: gpu002.example.com, user: 'j.doe@corp'}]\n")
    a, b = load_inventory(path).nodes
    assert (a.address, a.data_address, a.ssh.user) == ("fe80::1%eth0", "10.0.0.1", "svc.acme")
    assert (b.address, b.ssh.user, b.ssh.jump) == ("gpu002.example.com", "j.doe@corp",
                                                   "ops@bastion:2222,[2001:db8::1]:22,jump2")


@pytest.mark.parametrize("line_text, field, problem", [
    ("sudo: 'yes'", "sudo", "expected true or false, got 'yes'"),
    ("python: ", "python", "expected a string, got null"),
    ("python: ''", "python", "must not be empty"),
    ("cluster2: x", "cluster2", "unknown key; did you mean 'cluster'?"),
])
def test_wrong_top_level_values(tmp_path, key, line_text, field, problem):
    assert_error(write(tmp_path, minimal(key, line_text + "\n")), 5, field, problem)


def test_invalid_cluster_name(tmp_path, key):
    path = write(tmp_path, minimal(key).replace("cluster: demo", "cluster: my cluster"))
    assert_error(path, 1, "cluster", f"invalid cluster name 'my cluster'; {NAME_RULE}")
    long_name = "c" * 201  # out/<cluster>/ is a folder: a file system takes 255 bytes a name
    write(tmp_path, minimal(key).replace("cluster: demo", f"cluster: {long_name}"))
    assert_error(path, 1, "cluster", f"invalid cluster name '{long_name}'; {NAME_RULE}")


def test_unknown_transport(tmp_path, key):
    path = write(tmp_path, minimal(key, "transport: rsh\n"))
    assert_error(path, 5, "transport", "unknown transport 'rsh'; did you mean 'ssh'? allowed: ssh, local, slurm")


def test_bad_scratch_paths_and_kinds(tmp_path, key):
    path = write(tmp_path, minimal(key, "scratch:\n  - /ok\n  - {path: /x, kind: nfs}\n"))
    assert_error(path, 7, "scratch[1].kind", "unknown kind 'nfs'; allowed: local, shared")
    write(tmp_path, minimal(key, "scratch:\n  - scratch/handover\n"))
    assert_error(path, 6, "scratch[0]", "scratch paths must be absolute, got 'scratch/handover'")
    write(tmp_path, minimal(key, "scratch:\n  - {path: /}\n"))
    assert_error(path, 6, "scratch[0].path", "'/' is not a scratch directory")
    write(tmp_path, minimal(key, "scratch: [/a, /a/]\n"))
    assert_error(path, 5, "scratch[1]", "duplicate scratch path '/a'; first at line 5")
    write(tmp_path, minimal(key, 'scratch: ["/tmp/x\\ny"]\n'))
    assert_error(path, 5, "scratch[0]", "scratch path '/tmp/x\\ny' holds a control character")
    write(tmp_path, minimal(key, "scratch: [/scratch/a:b]\n"))
    assert_error(path, 5, "scratch[0]", "scratch path '/scratch/a:b' holds ':', which fio reads as a list of files")


# ---------------------------------------------------------------- nodes and groups


def test_duplicate_node_names_name_both_lines(tmp_path, key):
    path = write(tmp_path, f"""
        cluster: demo
        profile: cpu-only
        ssh: {{identity_file: {key}}}
        nodes:
          - gpu[001-004]
          - gpu005
          - {{name: gpu003, address: 10.0.0.3}}
        """)
    assert_error(path, 7, "nodes[2]", "duplicate node 'gpu003'; already listed at line 5")


def test_malformed_hostlist(tmp_path, key):
    path = write(tmp_path, minimal(key).replace("nodes: [gpu001]", "nodes:\n  - gpu000\n  - gpu[001-"))
    assert_error(path, 6, "nodes[1]", "malformed hostlist expression 'gpu[001-' (unbalanced brackets)")


def test_empty_and_malformed_node_lists(tmp_path, key):
    path = write(tmp_path, minimal(key).replace("nodes: [gpu001]", "nodes: []"))
    assert_error(path, 4, "nodes", "empty; list at least one node")
    write(tmp_path, minimal(key).replace("nodes: [gpu001]", "nodes:\n  - gpu001\n  - [gpu002]"))
    assert_error(path, 6, "nodes[1]", "expected a hostlist string or a mapping with 'name', got a list")
    write(tmp_path, minimal(key).replace("nodes: [gpu001]", "nodes:\n  -\n"))
    assert_error(path, 5, "nodes[0]", "expected a hostlist string or a mapping with 'name', got null")
    write(tmp_path, minimal(key).replace("nodes: [gpu001]", "nodes: gpu[001-004]"))
    assert_error(path, 4, "nodes", "expected a list, got 'gpu[001-004]'")
    write(tmp_path, minimal(key).replace("nodes: [gpu001]", "nodes: [{address: 10.0.0.1}]"))
    assert_error(path, 4, "nodes[0]", "missing required key 'name'")


def test_local_transport_takes_exactly_one_node(tmp_path):
    path = write(tmp_path, "cluster: here\nprofile: cpu-only\ntransport: local\nnodes: ['a[1-2]']\n")
    assert_error(path, 4, "nodes", "transport 'local' means this machine, so exactly one node; got 2")


def test_group_members_must_exist(tmp_path, key):
    path = write(tmp_path, minimal(key, "groups:\n  g:\n    nodes: [gpu001, gpu01]\n"))
    assert_error(path, 7, "groups.g.nodes[1]", "unknown node 'gpu01'; did you mean 'gpu001'?")
    write(tmp_path, minimal(key, "groups:\n  g:\n    python: /x\n"))
    assert_error(path, 6, "groups.g", "missing required key 'nodes'")


def test_conflicting_groups_are_both_named(tmp_path, key):
    path = write(tmp_path, minimal(key, """
        groups:
          a: {nodes: gpu001, python: /opt/a}
          b: {nodes: gpu001, python: /opt/b}
        """))
    assert_error(path, 7, "groups.b.python",
                 "'/opt/b' conflicts with '/opt/a' from group 'a' (line 6) for node 'gpu001', "
                 "which is in both groups; set python on the node or make the groups agree")


# ---------------------------------------------------------------- files ssh needs


def test_missing_identity_file(tmp_path):
    path = write(tmp_path, "cluster: demo\nprofile: cpu-only\nssh:\n  identity_file: keys/id\nnodes: [a]\n")
    assert_error(path, 4, "ssh.identity_file", f"no such file '{tmp_path}/keys/id'")


def test_missing_identity_file_set_on_a_node(tmp_path, key):
    path = write(tmp_path, minimal(key).replace("[gpu001]", "[gpu001, {name: b, identity_file: /no/key}]"))
    assert_error(path, 4, "nodes[1].identity_file", "no such file '/no/key'")


def test_known_hosts_must_exist_only_with_strict_host_keys(tmp_path, key):
    path = write(tmp_path, minimal(key).replace("}", ", known_hosts: kh, host_keys: strict}"))
    assert_error(path, 3, "ssh.known_hosts",
                 f"no such file '{tmp_path}/kh' (host_keys is strict; collect the keys first, "
                 "or use host_keys: accept-new)")
    write(tmp_path, minimal(key).replace("}", ", known_hosts: kh, host_keys: accept-new}"))
    assert load_inventory(path).nodes[0].ssh.known_hosts == str(tmp_path / "kh")


# ---------------------------------------------------------------- profile and reference errors


def test_unknown_profile(tmp_path, key):
    known = ", ".join(known_profiles())
    assert "cpu-only" in known
    path = write(tmp_path, minimal(key).replace("cpu-only", "zx81"))
    assert_error(path, 2, "profile", f"unknown profile 'zx81'; known: {known}")
    write(tmp_path, minimal(key).replace("cpu-only", "cpu_only"))
    assert_error(path, 2, "profile", f"unknown profile 'cpu_only'; did you mean 'cpu-only'? known: {known}")
    write(tmp_path, minimal(key).replace("cpu-only", "site/h100.yaml"))
    assert_error(path, 2, "profile", f"no such profile file '{tmp_path}/site/h100.yaml'")


def test_load_profile_errors_without_an_inventory(tmp_path):
    with pytest.raises(InventoryError) as caught:
        load_profile("zx81")
    assert str(caught.value) == f"profile: unknown profile 'zx81'; known: {', '.join(known_profiles())}"
    profile = write(tmp_path, """
        profile: wrong-name
        description: x
        mandatory: [reachable, reachable]
        """, name="p.yaml")
    with pytest.raises(InventoryError) as caught:
        load_profile(str(profile))
    assert str(caught.value) == (
        f"{profile}:1: profile: profile name 'wrong-name' does not match its file name 'p.yaml'"
    )
    write(tmp_path, "profile: p\ndescription: x\nmandatory: [reachable, reachable]\n", name="p.yaml")
    with pytest.raises(InventoryError, match=r"p\.yaml:3: mandatory\[1\]: check 'reachable' listed twice"):
        load_profile(profile)
    write(tmp_path, "profile: p\ndescription: x\nmandatory: [reachable, memroy]\n", name="p.yaml")
    with pytest.raises(InventoryError) as caught:  # it would fail every node for want of a result
        load_profile(profile)
    assert str(caught.value) == f"{profile}:3: mandatory[1]: unknown check 'memroy'; did you mean 'memory'?"


@pytest.mark.parametrize("reference, line, field, problem", [
    ("{check: cpu, value: 2, unit: cores}", 5, "references.cpu_cores", "missing required key 'source'"),
    ("{check: cpu, value: 2, lower: 0.1, unit: cores, source: s}", 5, "references.cpu_cores.lower",
     "lower is a fraction of value and must be <= 0, got 0.1"),
    ("{check: cpu, value: 2, upper: -0.1, unit: cores, source: s}", 5, "references.cpu_cores.upper",
     "upper is a fraction of value and must be >= 0, got -0.1"),
    ("{check: cpu, value: 0, lower: 5, upper: 1, unit: cores, source: s}", 5,
     "references.cpu_cores.lower",
     "with value 0 the bounds are absolute, and lower 5 is above upper 1"),
    ("{check: cpu, value: many, unit: cores, source: s}", 5, "references.cpu_cores.value",
     "expected a number, got 'many'"),
    ("{check: cpu, value: -1, lower: -0.02, unit: cores, source: s}", 5, "references.cpu_cores.value",
     "value must be 0 or more (with 0 the bounds are absolute), got -1"),
    ("{check: memory, value: 2, unit: cores, source: s}", 5, "references.cpu_cores.check",
     "'cpu_cores' is recorded by check 'cpu', not 'memory'"),
    ("{check: cpu, value: 2, unit: threads, source: s}", 5, "references.cpu_cores.unit",
     "cpu records 'cpu_cores' in cores, not 'threads'"),
])
def test_bad_profile_references(tmp_path, reference, line, field, problem):
    profile = write(tmp_path, f"""
        profile: p
        description: x
        mandatory: [cpu]
        references:
          cpu_cores: {reference}
        """, name="p.yaml")
    with pytest.raises(InventoryError) as caught:
        load_profile(profile)
    assert (caught.value.file, caught.value.line, caught.value.field) == (str(profile), line, field)
    assert str(caught.value) == f"{profile}:{line}: {field}: {problem}"


@pytest.mark.parametrize("entry, field, problem", [
    ("memory_total: {lower: 0.5}", "memory_total.lower", "lower is a fraction of value and must be <= 0, got 0.5"),
    ("gpu_memory: {value: 8}", "gpu_memory", "metric not in profile 'cpu-only', so it needs check, unit as well"),
    ("memory_totl: {value: 8}", "memory_totl", "no check records a metric 'memory_totl'; did you mean 'memory_total'?"),
    ("gpu_count: {check: gpu_inventory, value: 8, unit: GPUs}", "gpu_count",
     "no check records a metric 'gpu_count'; inventory/metrics.py lists those the suites record"),
    ("memory_total: {unit: GB}", "memory_total.unit", "memory records 'memory_total' in GiB, not 'GB'"),
    ("gpu_memory: {check: gpu, value: 80, unit: GiB}", "gpu_memory.check",
     "'gpu_memory' is recorded by check 'gpu_inventory', not 'gpu'"),
    ("memory_total: 2048", "memory_total", "expected a mapping, got 2048"),
], ids=["band", "not-in-profile", "misspelt", "unrecorded", "unit", "check", "not-a-mapping"])
def test_bad_reference_overrides(tmp_path, key, entry, field, problem):
    assert_error(write(tmp_path, minimal(key, f"references:\n  {entry}\n")), 6, f"references.{field}", problem)


# ---------------------------------------------------------------- YAML corner cases


def test_a_merged_anchor_can_be_reused_and_the_first_merge_wins(tmp_path, key):
    path = write(tmp_path, minimal(key, """
        groups:
          a: &base {nodes: gpu001, python: /opt/a}
          b: &more {<<: *base, python: /opt/a, user: ops}
          c: *more
          d: {<<: [{nodes: gpu001, user: ops}, *base]}
        """))
    cluster = load_inventory(path)
    assert cluster.node("gpu001").groups == ("a", "b", "c", "d")
    assert (cluster.node("gpu001").ssh.user, cluster.node("gpu001").python) == ("ops", "/opt/a")


def test_one_anchor_merged_many_times_over_is_read_once(tmp_path, key):
    """Fourteen levels, each merging the one below four times: read merge by merge, 4**14
    pairs (minutes, gigabytes); read once per mapping, the same answer at once."""
    merges = f"{{user: ops, identity_file: {key}}}"
    for level in range(14):
        merges = f"{{<<: [&l{level} {merges}, *l{level}, *l{level}, *l{level}]}}"
    path = write(tmp_path, minimal(key).replace(f"ssh: {{identity_file: {key}}}", f"ssh: {merges}"))
    assert load_inventory(path).node("gpu001").ssh.user == "ops"


def test_merge_errors(tmp_path, key):
    path = write(tmp_path, minimal(key, "groups:\n  a: &self {nodes: gpu001, <<: *self}\n"))
    assert_error(path, 6, "groups.a", "a `<<:` merge refers to itself")
    write(tmp_path, minimal(key, "groups:\n  a: {nodes: gpu001, <<: [gpu001]}\n"))
    assert_error(path, 6, "groups.a", "`<<:` must merge a mapping or a list of mappings")


def test_unsupported_tags_non_scalar_keys_and_bad_encoding(tmp_path, key):
    path = write(tmp_path, minimal(key, "python: !vault abc\n"))
    assert_error(path, 5, "python", "unsupported YAML tag '!vault'")
    write(tmp_path, minimal(key, "? [a, b]\n: c\n"))
    assert_error(path, 5, None, "keys must be plain names")
    path.write_bytes(b"cluster: caf\xe9\n")
    assert_error(path, None, None, "not UTF-8 text (byte 12)")


def test_invalid_node_names(tmp_path, key):
    path = write(tmp_path, minimal(key).replace("[gpu001]", "['gpu 1']"))
    assert_error(path, 4, "nodes[0]", f"invalid node name 'gpu 1' in 'gpu 1'; {NAME_RULE}")
    write(tmp_path, minimal(key).replace("[gpu001]", "[{name: -Ehandover.log}]"))  # ssh -E: a log file
    assert_error(path, 4, "nodes[0].name", f"invalid node name '-Ehandover.log'; {NAME_RULE}")
    write(tmp_path, minimal(key).replace("[gpu001]", "[{name: 'gpu[1-2]'}]"))
    assert_error(path, 4, "nodes[0].name", f"invalid node name 'gpu[1-2]'; {NAME_RULE}")


def test_identity_file_that_is_a_directory(tmp_path):
    path = write(tmp_path, f"cluster: demo\nprofile: cpu-only\nssh: {{identity_file: {tmp_path}}}\nnodes: [a]\n")
    assert_error(path, 3, "ssh.identity_file", f"not a regular file '{tmp_path}'")


# ---------------------------------------------------------------- launch settings


def test_launch_interface_is_read_and_defaults_to_none(tmp_path, key):
    assert load_inventory(write(tmp_path, minimal(key))).launch_interface is None
    cluster = load_inventory(write(tmp_path, minimal(key, "launch: {interface: ib0}\n")))
    assert cluster.launch_interface == "ib0"


def test_launch_interface_must_be_an_interface_name(tmp_path, key):
    path = write(tmp_path, minimal(key, "launch:\n  interface: 'eth0; reboot'\n"))
    assert_error(path, 6, "launch.interface", "'eth0; reboot' is not a network interface name (e.g. eth0, ib0)")
    write(tmp_path, minimal(key, "launch: {ifname: eth0}\n"))
    assert_error(path, 5, "launch.ifname", "unknown key; allowed: interface, engine, rendezvous_timeout_s, "
                 "partition, account, reservation, time_limit")


def test_launch_rendezvous_timeout_is_whole_seconds_and_a_minute_by_default(tmp_path, key):
    assert load_inventory(write(tmp_path, minimal(key))).launch.rendezvous_timeout_s == 60
    cluster = load_inventory(write(tmp_path, minimal(key, "launch: {rendezvous_timeout_s: 300}\n")))
    assert cluster.launch.rendezvous_timeout_s == 300
    path = write(tmp_path, minimal(key, "launch:\n  rendezvous_timeout_s: 0\n"))
    assert_error(path, 6, "launch.rendezvous_timeout_s", "expected 1 or more, got 0")
    write(tmp_path, minimal(key, "launch:\n  rendezvous_timeout_s: 301\n"))
    assert_error(path, 6, "launch.rendezvous_timeout_s",
                 "301 s is too long; at most 300, half of the 600 s a quick run across nodes is given")


# ---------------------------------------------------------------- expect overrides


def one_gpu(extra: str = "") -> str:
    """One node under the eight-GPU H200 profile; `expect:` entries start at line 6."""
    return "cluster: lab\nprofile: h200-sxm-8gpu\ntransport: local\nnodes: [gpu1]\nexpect:\n" + extra


def test_expect_overrides_replace_the_profiles_facts_and_keep_why(tmp_path):
    path = write(tmp_path, one_gpu("""\
          gpu_count: {value: 1, reason: "one-GPU test machine"}
          nvlink_links: {value: null, reason: "one GPU has no NVLink peer"}
          gpu_numa_nodes: {value: [0], reason: "its GPU on NUMA node 0"}
          nvswitch: {value: false, reason: "no NVSwitch"}
          cpu_model: {value: "EPYC", reason: "the lab's CPU"}
        """))
    cluster = load_inventory(path)
    expect = cluster.profile.expect
    assert (expect.gpu_count, expect.nvlink_links, expect.gpu_numa_nodes, expect.nvswitch, expect.cpu_model) == (
        1, None, (0,), False, "EPYC")
    assert expect.gpu_model == load_profile("h200-sxm-8gpu").expect.gpu_model  # the rest is the profile's
    assert cluster.expect_overrides == (
        ExpectOverride("gpu_count", 1, 8, "one-GPU test machine"),
        ExpectOverride("nvlink_links", None, 18, "one GPU has no NVLink peer"),
        ExpectOverride("gpu_numa_nodes", (0,), (0, 0, 0, 0, 1, 1, 1, 1), "its GPU on NUMA node 0"),
        ExpectOverride("nvswitch", False, True, "no NVSwitch"),
        ExpectOverride("cpu_model", "EPYC", None, "the lab's CPU"),
    )
    assert cluster.expect_overrides[2].as_dict() == {
        "key": "gpu_numa_nodes", "value": [0], "profile_value": [0, 0, 0, 0, 1, 1, 1, 1],
        "reason": "its GPU on NUMA node 0"}
    assert "nvlink_links" not in expect.declared() and expect.declared()["gpu_count"] == 1


def test_no_expect_section_overrides_nothing(tmp_path, key):
    cluster = load_inventory(write(tmp_path, minimal(key)))
    assert cluster.expect_overrides == () and cluster.profile.expect == load_profile("cpu-only").expect


@pytest.mark.parametrize("entry, field, problem", [
    ("gpu_count: {value: 1}", "expect.gpu_count", "missing required key 'reason'"),
    ("gpu_count: {reason: why}", "expect.gpu_count", "missing required key 'value'"),
    ("gpu_count: {value: 1, reason: ''}", "expect.gpu_count.reason", "must not be empty"),
    ("gpu_count: {value: 1, reason: why, owner: me}", "expect.gpu_count.owner", "unknown key; allowed: value, reason"),
    ("gpu_cuont: {value: 1, reason: why}", "expect.gpu_cuont", "unknown key; did you mean 'gpu_count'?"),
    ("gpu_count: {value: one, reason: why}", "expect.gpu_count.value", "expected an integer, got 'one'"),
    ("nvswitch: {value: 0, reason: why}", "expect.nvswitch.value", "expected true or false, got 0"),
    ("gpu_numa_nodes: {value: 0, reason: why}", "expect.gpu_numa_nodes.value", "expected a list, got 0"),
    ("kernel_min: {value: 'six', reason: why}", "expect.kernel_min.value",
     "expected a dotted version like '4.18', got 'six'"),
    ("gpu_count: 1", "expect.gpu_count", "expected {value: ..., reason: ...}, got 1"),
    ("gpu_count: {value: 8, reason: why}", "expect.gpu_count.value",
     "profile 'h200-sxm-8gpu' already declares 8; remove the override"),
    ("cpu_model: {value: null, reason: why}", "expect.cpu_model.value",
     "profile 'h200-sxm-8gpu' does not declare it either; remove the override"),
])
def test_bad_expect_overrides(tmp_path, entry, field, problem):
    assert_error(write(tmp_path, one_gpu(f"  {entry}\n")), 6, field, problem)


def test_expect_must_be_a_mapping_of_facts(tmp_path):
    assert_error(write(tmp_path, one_gpu("  - gpu_count\n")), 6, "expect", "expected a mapping, got a list")


@pytest.mark.parametrize("fact, value, problem", [
    ("gpu_count", "-3", "expected 0 or more, got -3"),
    ("hpl_nb", "0", "expected 1 or more, got 0"),
    ("ib_rate", "-400", "expected a number above 0, got -400"),
    ("gpu_numa_nodes", "[0, -1]", "expected 0 or more, got -1"),
])
def test_an_expected_fact_no_node_could_have_is_refused(tmp_path, fact, value, problem):
    path = write(tmp_path, one_gpu(f"  {fact}: {{value: {value}, reason: x}}\n"))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value).endswith(problem) and f"expect.{fact}" in str(caught.value)


def pair_profile(directory: Path, expect: str) -> Path:
    """A profile whose `expect:` (line 4) is the flow mapping given."""
    return write(directory, f"profile: p\ndescription: x\nmandatory: [reachable]\nexpect: {expect}\n", name="p.yaml")


@pytest.mark.parametrize("fact, value, problem", [
    ("pair_all_max_nodes", 2048, "2048 is too many; at most 128, since every pair of that many nodes is measured"),
    ("pair_sample_partners", 1024, "1024 is too many; at most 32, since every node is paired with that many"),
    ("pair_sample_partners", 1, "1 is too few; a pair needs at least 2"),
])
def test_pair_counts_that_would_grow_with_node_pairs_are_refused(tmp_path, fact, value, problem):
    """In a profile's `expect:` and in an inventory's override alike: above the caps the pairs
    measured, and results.json, grow with nodes x nodes."""
    profile = pair_profile(tmp_path, f"{{{fact}: {value}}}")
    with pytest.raises(InventoryError) as caught:
        load_profile(profile)
    assert str(caught.value) == f"{profile}:4: expect.{fact}: {problem}"
    assert_error(write(tmp_path, one_gpu(f"  {fact}: {{value: {value}, reason: why}}\n")), 6,
                 f"expect.{fact}.value", problem)


def test_pair_counts_at_the_caps_load(tmp_path):
    expect = load_profile(pair_profile(tmp_path, "{pair_all_max_nodes: 128, pair_sample_partners: 32}")).expect
    assert (expect.pair_all_max_nodes, expect.pair_sample_partners) == (128, 32)


def recorded_run(tmp_path: Path, inventory: str, header_without: tuple[str, ...] = ()) -> dict:
    """results.json of a run of the inventory that recorded no check, its header as run_header
    makes it (less the keys named, as a ledger written before them has it)."""
    cluster = load_inventory(write(tmp_path, inventory))
    header = {k: v for k, v in run_header(cluster, list(cluster.nodes)).items() if k not in header_without}
    ledger = Ledger.create(tmp_path / "out", cluster.name, header)
    ledger.append({"type": "selection", "nodes": [n.name for n in cluster.nodes], "tests": []})
    ledger.append({"type": "end", "finished": now_iso(), "exitstatus": 0, "interrupted": False})
    record = read_ledger(ledger.run_dir)
    validate_ledger_entry(record.header)
    results, _ = build_results(record)
    validate_results(results)
    return results


def test_expect_overrides_are_recorded_in_the_run_and_shown_in_the_report_header(tmp_path):
    results = recorded_run(tmp_path, one_gpu("""\
          gpu_count: {value: 1, reason: "one-GPU test machine <script>alert(1)</script>"}
          nvlink_links: {value: null, reason: "one GPU has no NVLink peer"}
          gpu_numa_nodes: {value: [0], reason: "its GPU on NUMA node 0"}
        """))
    assert results["run"]["expect_overrides"] == [
        {"key": "gpu_count", "value": 1, "profile_value": 8,
         "reason": "one-GPU test machine <script>alert(1)</script>"},
        {"key": "nvlink_links", "value": None, "profile_value": 18, "reason": "one GPU has no NVLink peer"},
        {"key": "gpu_numa_nodes", "value": [0], "profile_value": [0, 0, 0, 0, 1, 1, 1, 1],
         "reason": "its GPU on NUMA node 0"},
    ]
    page = render_html(results)
    section = page[page.index('<section class="overrides"'):page.index("</section>", page.index('class="overrides"'))]
    assert page.index('class="overrides"') < page.index('id="summary"')  # the header area, before the summary
    assert "Expectations overridden by the inventory" in section
    rows = [[cell.strip() for cell in row.split("</td>")[:-1]] for row in section.split("<tr>")[2:]]
    assert [[cell.rsplit(">", 1)[-1] for cell in row] for row in rows] == [
        ["gpu_count", "8", "1", "one-GPU test machine &lt;script&gt;alert(1)&lt;/script&gt;"],
        ["nvlink_links", "18", "not checked", "one GPU has no NVLink peer"],
        ["gpu_numa_nodes", "[0, 0, 0, 0, 1, 1, 1, 1]", "[0]", "its GPU on NUMA node 0"],
    ]
    assert "<script>alert" not in page


def test_a_run_without_overrides_records_none_and_shows_no_section(tmp_path):
    for without in ((), ("expect_overrides",)):  # this harness's header, and one from before the key
        inventory = one_gpu().removesuffix("expect:\n")
        results = recorded_run(tmp_path / str(len(without)), inventory, without)
        assert results["run"]["expect_overrides"] == []
        assert 'class="overrides"' not in render_html(results)


def test_a_wrong_file_is_quoted_by_its_start_and_length_not_whole(tmp_path):
    """A passwd given as the inventory, or a key pasted into a field, must not flood the line."""
    passwd = "\n".join(f"user{n}:x:{n}:{n}::/home/user{n}:/bin/sh" for n in range(200))
    message = str(error_of(write(tmp_path, passwd + "\n")))
    assert message.startswith(f"{tmp_path / 'inv.yaml'}:1: expected an inventory mapping, got 'user0:x:0")
    assert message.endswith(f"... ({len(passwd.replace(chr(10), ' ')):,} characters)")
    assert len(message) < len(str(tmp_path)) + 140
    jump = "a" * 500
    inventory = f"cluster: demo\nprofile: cpu-only\nnodes: [a]\nssh: {{jump: '{jump}@'}}\n"
    message = str(error_of(write(tmp_path, inventory)))
    assert message.endswith("ssh.jump: expected [user@]host[:port] (like ssh -J), got "
                            f"{jump[:40]!r}... (501 characters)")


def test_nodes_are_placed_by_rack_where_any_has_one_else_by_leaf(tmp_path):
    """`placement`: racks where they tell nodes apart (the soak's grouping, as the report's),
    else leaf switches; a node placed nowhere is None."""
    path = tmp_path / "placed.yaml"
    path.write_text("cluster: c\nprofile: cpu-only\nnodes: ['n[1-3]']\ngroups:\n"
                    "  a: {nodes: 'n[1-2]', leaf: l1}\n  b: {nodes: n3, leaf: l2, rack: r9}\n")
    assert placement(load_inventory(path).nodes) == ("rack", {"n1": None, "n2": None, "n3": "r9"})
    path.write_text(path.read_text().replace(", rack: r9", ""))
    assert placement(load_inventory(path).nodes) == ("leaf", {"n1": "l1", "n2": "l1", "n3": "l2"})
    path.write_text(path.read_text() + "  all: {nodes: 'n[1-3]', rack: r1}\n")  # one rack, two leaves
    assert placement(load_inventory(path).nodes) == ("leaf", {"n1": "l1", "n2": "l1", "n3": "l2"})


def test_the_readmes_example_inventory_loads_as_it_says(tmp_path, monkeypatch):
    """The inventory a newcomer copies from the README ("Writing an inventory") is one the loader
    takes, with its ~/.ssh files in place."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = readme.split("### Writing an inventory\n\n", 1)[1].split("\n\nAn inventory is data", 1)[0]
    (tmp_path / ".ssh").mkdir()
    for name in ("id_ed25519", "known_hosts"):
        (tmp_path / ".ssh" / name).touch()
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "demo.yaml"
    path.write_text(textwrap.dedent(example) + "\n")
    cluster = load_inventory(path)
    assert (cluster.name, cluster.profile.name) == ("demo", "h100-sxm-8gpu")
    assert [node.name for node in cluster.nodes] == [f"gpu00{index}" for index in range(1, 6)]
    assert {override.key for override in cluster.expect_overrides} == {"gpu_count", "nvlink_links"}
    assert cluster.profile.references["memory_total"].source == "contract 2026-11"
