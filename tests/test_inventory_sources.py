"""Nodes from the inventories operators already have: slurm.conf partitions and Ansible groups.

The readers run on real files from public repositories (tests/data/slurm, tests/data/ansible, each
with its PROVENANCE.md); the Ansible reader is compared host by host with `ansible-inventory
--list`, run once per file for the whole module. Short inventories that these tests write
themselves are marked "constructed"; ansible-inventory's view of those is real too.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inventory.ansible_inventory import (
    ADDRESS_VARS,
    KEY_VARS,
    PORT_VARS,
    USER_VARS,
    AnsibleInventoryError,
    expand_host_pattern,
    read_ansible_inventory,
)
from inventory.loader import InventoryError, load_inventory
from inventory.slurm_conf import SlurmConfError, SlurmPlaces, parse_scontrol_topology, read_slurm_conf

REPO = Path(__file__).resolve().parent.parent
SLURM = REPO / "tests" / "data" / "slurm"
ANSIBLE = REPO / "tests" / "data" / "ansible"
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")

# Real files ansible-inventory reads (the refused ones are tested apart).
REAL_ANSIBLE = [
    "ansible_examples_hosts_2012",
    "ansible_ansible-inventory_complex.ini",
    "ansible_inventory_yaml_test.yml",
    "ansible_delegate_to_inventory",
    "ansible_inventory_ini_inventory.ini",
    "ansible_ansible-inventory_invalid_sample.yml",
    "deepops_virtual_inventory_large_slurm",
    "deepops_config.example_inventory",
    "stackhpc_common_inventory_groups",
]

# Constructed: every feature the reader claims, in INI and YAML, with group_vars/ and host_vars/.
CONSTRUCTED = {
    "edge/hosts.ini": """
        # constructed for handover's tests
        login01 ansible_host=10.0.0.1 ansible_port=2222
        gpu[01:04] ansible_user=ops
        rack[a:c]-n[1:5:2]
        [gpu]
        gpu[01:04]
        gpu05:2200 ansible_ssh_private_key_file=~/.ssh/gpu_ed25519
        [gpu:vars]
        ansible_user=gpuadmin
        ansible_ssh_user=legacy
        [cpu]
        cpu[1:10:3] ansible_ssh_host=10.1.0.9
        [cluster:children]
        gpu
        cpu
        [cluster:vars]
        ansible_user=clusteradmin
        ansible_port=22
        [all:vars]
        ansible_user=root
        [ib:children]
        gpu
        [ib:vars]
        ansible_group_priority=10
        ansible_ssh_user=ibuser
        """,
    "edge/group_vars/all.yml": "ansible_private_key_file: /keys/all_ed25519\n",
    "edge/group_vars/gpu/10-conn.yml": 'ansible_port: "2022"\n',
    "edge/host_vars/gpu03": "ansible_host: 10.2.0.3\n",
    # YAML: ranges, a port in a host's name, group vars at two levels, and a host that merges
    # another's variables (`<<: *gpu_defaults`) and replaces one of them.
    "yaml/hosts.yml": """
        all:
          vars:
            ansible_user: root
          hosts:
            bastion:
              ansible_host: 192.0.2.10
          children:
            gpu:
              hosts:
                gpu[01:04]:
                gpu05:2200:
                  ansible_ssh_private_key_file: ~/.ssh/gpu_ed25519
                gpu06: &gpu_defaults
                  ansible_port: 2202
                  ansible_user: ops
                gpu07:
                  <<: *gpu_defaults
                  ansible_user: ops2
              vars:
                ansible_user: gpuadmin
            cluster:
              children:
                gpu:
                cpu:
                  hosts:
                    cpu[1:10:3]:
                      ansible_port: 2201
              vars:
                ansible_user: clusteradmin
        """,
    # Ansible's quirks: a port on a host's second mention is ignored; a [group:vars] value is a
    # Python literal when it is one, and a trailing "# ..." is part of a string value.
    "quirks/hosts.ini": """
        [web]
        h1
        [b]
        h1:2222
        h2:2200 ansible_port=22
        [web:vars]
        http_port=8080
        ansible_user=admin # not a comment
        v=23 # a comment here, to literal_eval
        """,
}


def write(directory: Path, text: str, name: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


@pytest.fixture(scope="module")
def constructed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("constructed")
    for name, text in CONSTRUCTED.items():
        write(root, text, name)
    return root


def ansible_files(constructed: Path) -> list[Path]:
    return [ANSIBLE / name for name in REAL_ANSIBLE] + [
        constructed / "edge/hosts.ini", constructed / "yaml/hosts.yml", constructed / "quirks/hosts.ini"]


@pytest.fixture(scope="module")
def ansible_view(tmp_path_factory, constructed) -> dict[Path, dict]:
    """`ansible-inventory -i FILE --list` of every file, all at once, from a clean directory."""
    assert ANSIBLE_INVENTORY.exists(), "ansible-core is in the test extra: make setup"
    home = tmp_path_factory.mktemp("ansible-home")
    (home / "ansible.cfg").write_text("")
    env = dict(os.environ, ANSIBLE_CONFIG=str(home / "ansible.cfg"), ANSIBLE_HOME=str(home),
               ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
               ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_NOCOLOR="1")
    runs = {path: subprocess.Popen([str(ANSIBLE_INVENTORY), "-i", str(path), "--list"], cwd=home, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for path in ansible_files(constructed)}
    views = {}
    for path, run in runs.items():
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, f"{path}: {err}"
        views[path] = json.loads(out)
    return views


def first(variables: dict, names: tuple[str, ...]):
    for name in names:
        if variables.get(name) is not None:
            return variables[name]
    return None


def expected_connection(name: str, variables: dict) -> tuple:
    """What ansible-inventory's merged variables say, read with Ansible's own variable names."""
    port = first(variables, PORT_VARS)
    return (first(variables, ADDRESS_VARS) or name, int(port) if port is not None else None,
            first(variables, USER_VARS), first(variables, KEY_VARS))


# ---------------------------------------------------------------- Ansible, host by host


@pytest.mark.parametrize("index", range(len(REAL_ANSIBLE) + 3))
def test_ansible_reader_agrees_with_ansible_inventory_host_by_host(index, constructed, ansible_view):
    path = ansible_files(constructed)[index]
    view = ansible_view[path]
    mine = read_ansible_inventory(path)
    groups = {name: body for name, body in view.items() if name != "_meta"}
    hostvars = {host: {} for body in groups.values() for host in body.get("hosts", [])}
    hostvars.update(view["_meta"]["hostvars"])

    assert set(mine.hosts) == set(hostvars)
    for name, body in groups.items():  # ansible-inventory leaves out empty groups
        if name != "all":
            assert list(mine.groups[name].hosts) == body.get("hosts", []), name
        assert list(mine.groups[name].children) == body.get("children", []), name
    assert {n for n, g in mine.groups.items() if g.hosts or g.children} == set(groups)
    for name, variables in hostvars.items():
        host = mine.hosts[name]
        assert set(host.groups) == {g for g, body in groups.items() if name in body.get("hosts", [])}, name
        assert json.loads(json.dumps({k: v.value for k, v in host.variables.items()})) == variables, name
        if any("{{" in str(variables.get(var)) for var in ADDRESS_VARS):
            continue  # a template: refused below
        target = host.connection()
        assert (target.address, target.port, target.user, target.identity_file) == \
            expected_connection(name, variables), name


def test_ansible_real_inventories_give_what_their_lines_say():
    slurm = read_ansible_inventory(ANSIBLE / "deepops_virtual_inventory_large_slurm")
    nodes = slurm.group_hosts("slurm-node")
    assert [h.name for h in nodes] == ["virtual-gpu01", "virtual-gpu02"]
    assert nodes[0].connection().address == "10.0.0.9" and nodes[0].connection().user == "vagrant"
    assert len(slurm.group_hosts("slurm-cluster")) == 10
    examples = read_ansible_inventory(ANSIBLE / "ansible_examples_hosts_2012")
    assert [h.name for h in examples.group_hosts("ungrouped")][-6:] == [f"mail{i}.example.com" for i in range(6)]
    web = [h.name for h in examples.group_hosts("webservers")]
    assert web[-6:] == [f"www{i:03d}.example.com" for i in range(1, 7)]
    db = examples.group_hosts("dbservers")
    assert [h.name for h in db][-3:] == ["db-99-node.example.com", "db-100-node.example.com",
                                         "db-101-node.example.com"]
    assert set(examples.hosts["myserver.com"].groups) == {"webservers", "dbservers"}
    complex_ini = read_ansible_inventory(ANSIBLE / "ansible_ansible-inventory_complex.ini")
    assert [h.name for h in complex_ini.group_hosts("parent_3")] == ["test2", "test1", "test4", "test5", "test3",
                                                                    "test6"]


def test_ansible_template_and_alias_from_a_real_file():
    inventory = read_ansible_inventory(ANSIBLE / "ansible_delegate_to_inventory")
    assert inventory.hosts["testhost3"].connection().address == "127.0.0.3"  # ansible_ssh_host
    with pytest.raises(AnsibleInventoryError) as caught:
        inventory.hosts["testhost6"].connection()
    assert str(caught.value) == (f"{inventory.path}:16: host 'testhost6': ansible_host: '{{{{myhost}}}}' is a "
                                 "Jinja template; handover does not evaluate templates")


def test_ansible_ranges_as_ansible_expands_them():
    assert expand_host_pattern("rack[a:c]-n[1:5:2]")[:4] == ["racka-n1", "racka-n3", "racka-n5", "rackb-n1"]
    assert expand_host_pattern("node[01:16]")[::15] == ["node01", "node16"]
    assert expand_host_pattern("mail[:2]") == ["mail0", "mail1", "mail2"]
    assert len(expand_host_pattern("n[0:1]x[00000:49999]")) == 100000  # as many as a hostlist may name
    for pattern, problem in [("n[5:1]", "names no host"),
                             ("n[0:2]x[00000:49999]", "more than 100000 hosts"), ("n[01:100]", "same width"),
                             ("n[1:3:0]", "positive"), ("n[a:3]", "neither numeric"), ("n[1]", "begin:end")]:
        with pytest.raises(ValueError, match=problem):
            expand_host_pattern(pattern)


# ---------------------------------------------------------------- Ansible, refused


def ansible_error(path: Path) -> AnsibleInventoryError:
    with pytest.raises(AnsibleInventoryError) as caught:
        read_ansible_inventory(path)
    assert "\n" not in str(caught.value)
    return caught.value


def test_ansible_refuses_what_it_would_have_to_run(tmp_path):
    plugin = ansible_error(ANSIBLE / "ansible_inventory_constructed_constructed.yml")
    assert plugin.line == 1 and "inventory plugin configuration (`plugin:`)" in plugin.problem
    script = ansible_error(ANSIBLE / "deepops_maas_inventory_script")
    assert script.line == 1 and script.problem.startswith("starts with #!, a dynamic inventory script")
    executable = tmp_path / "hosts"
    shutil.copy(ANSIBLE / "ansible_ansible-inventory_complex.ini", executable)
    executable.chmod(0o755)
    assert ansible_error(executable).problem.startswith("is executable, so Ansible would run it")
    assert ansible_error(tmp_path).problem.startswith("is a directory")
    vaulted = write(tmp_path, "$ANSIBLE_VAULT;1.1;AES256\n6162\n", "vaulted.yml")
    assert str(ansible_error(vaulted)) == f"{vaulted}:1: is encrypted with ansible-vault; handover cannot read it"


@pytest.mark.parametrize("name, text, line, problem", [  # constructed
    ("hosts.ini", "[gpu:childs]\nx\n", 1, "section [gpu:childs] has unknown type 'childs'; use children or vars"),
    ("hosts.ini", "[all:children]\ngpu\n", 2, "section [all:children] names group 'gpu', which is never defined"),
    ("hosts.ini", "[gpu:vars]\nansible_user=x\n", 1, "section [gpu:vars] is for group 'gpu', which is never defined"),
    ("hosts.ini", "[gpu]\nn[3:1]\n", 2, "host range [3:1] names no host (Ansible would silently add none)"),
    ("hosts.ini", "[gpu]\nnode[0:99999999]\n", 2, "host pattern 'node[0:99999999]' names more than 100000 hosts"),
    ("hosts.yml", "gpu:\n  hosts:\n    n[0:999]x[0:999]:\n", 3,
     "host pattern 'n[0:999]x[0:999]' names more than 100000 hosts"),
    ("hosts.ini", "[gpu]\nn1 ansible_user='x\n", 2,
     "cannot split host line \"n1 ansible_user='x\": No closing quotation"),
    ("hosts.ini", "[gpu]\nn1 oops\n", 2, "expected key=value after host 'n1', got 'oops'"),
    ("hosts.ini", "[gpu name]\n", 1,
     "invalid section '[gpu name]': no spaces, and only :children or :vars after the group name"),
    ("hosts.ini", "[a:children]\nb\n[b:children]\na\n", 4, "making 'a' a child of 'b' creates a loop"),
    ("hosts.yml", "all:\n  hosts:\n    n1: {ansible_port: 22\n", 4,
     "YAML syntax error: expected ',' or '}', but got '<stream end>'"),
    ("hosts.yml", "all:\n  host:\n    n1:\n", 2,
     "group 'all': unknown key 'host'; a group has hosts, children and vars (Ansible would skip it)"),
    ("hosts.yml", "gpu:\n  hosts:\n    n1:\n    n1:\n", 4,
     "group 'gpu' hosts: 'n1' given twice (first at line 3); Ansible would keep only the last"),
])
def test_ansible_bad_input_is_one_line_with_file_and_line(tmp_path, name, text, line, problem):
    path = write(tmp_path, text, name)
    error = ansible_error(path)
    assert str(error) == f"{path}:{line}: {problem}"


def test_ansible_vault_encrypted_values_and_vars_files_are_refused(tmp_path):  # constructed
    path = write(tmp_path, "gpu:\n  hosts:\n    g1:\n      ansible_user: !vault |\n        $ANSIBLE_VAULT;1.1;AES256\n"
                           "        6162\n", "hosts.yml")
    with pytest.raises(AnsibleInventoryError) as caught:
        read_ansible_inventory(path).hosts["g1"].connection()
    assert str(caught.value) == (f"{path}:4: host 'g1': ansible_user: is encrypted with ansible-vault; handover "
                                 "cannot read it")
    vars_file = write(tmp_path, "$ANSIBLE_VAULT;1.1;AES256\n6162\n", "group_vars/all/vault")
    assert str(ansible_error(path)) == (f"{vars_file}:1: is encrypted with ansible-vault; handover cannot read the "
                                        "variables it may set")


def test_ansible_integer_host_name_refused_like_ansible():
    error = ansible_error(ANSIBLE / "ansible_inventory_yaml_test_int_hostname.yml")
    assert (error.line, error.problem) == (5, "group 'kids': host 1234 is not a string; quote it")


# ---------------------------------------------------------------- slurm.conf


def test_slurm_real_files_partitions_in_nodename_order():
    example = read_slurm_conf(SLURM / "schedmd_etc_slurm.conf.example")
    assert [n.name for n in example.partition_nodes("debug")] == [f"linux{i}" for i in range(1, 33)]  # Nodes=ALL
    man = read_slurm_conf(SLURM / "schedmd_man5_example_slurm.conf")
    debug = man.partition_nodes("debug")
    assert [n.name for n in debug] == [f"dev{i}" for i in [*range(0, 9), *range(18, 26)]]
    assert debug[-1].address == "edev25" and debug[-1].hostname == "dev25"
    mcr = read_slurm_conf(SLURM / "schedmd_quickstart_admin_mcr_slurm.conf")
    assert len(mcr.nodes) == 1152 and len(mcr.partition_nodes("pbatch")) == 960
    assert mcr.partition_nodes("pdebug")[191].address == "emcr191"


def test_slurm_keys_in_any_case_one_address_for_all_and_port_lists():
    conf = read_slurm_conf(SLURM / "schedmd_test7.17.1_slurm.conf")
    assert [(n.name, n.address, n.port) for n in conf.nodes.values()][::9] == [
        ("test_node0", "localhost", 27001), ("test_node9", "localhost", 27010)]
    topology = read_slurm_conf(SLURM / "schedmd_check_topology_slurm.conf")
    assert topology.nodes["node32"].port == 40032 and topology.nodes["node32"].features == ("block",)
    with pytest.raises(SlurmConfError) as caught:
        conf.partition_nodes("debug")
    assert str(caught.value) == f"{conf.path}: no partition 'debug'; partitions: (none)"


def test_slurm_includes_and_nodesets_of_parallelcluster():
    conf = read_slurm_conf(SLURM / "parallelcluster" / "slurm_parallelcluster.conf")
    assert list(conf.partitions) == ["multiple_spot", "efa", "gpu"]
    gpu = conf.partition_nodes("gpu")
    assert [n.name for n in gpu][:2] == ["gpu-st-gpu-g38xlarge-1", "gpu-dy-gpu-g38xlarge-1"]
    assert len(gpu) == 15 and gpu[-1].name == "gpu-dy-gpu-p3dn24xlarge-10"
    assert gpu[0].file.endswith("pcluster/slurm_parallelcluster_gpu_partition.conf")
    assert "p3dn.24xlarge" in gpu[-1].features and not gpu[0].address_given


def test_slurm_partition_naming_no_node_is_one_line_with_its_line():
    conf = read_slurm_conf(SLURM / "parallelcluster_custom_slurm_settings_include_file_slurm.conf")
    assert len(conf.partition_nodes("test-partition")) == 100
    with pytest.raises(SlurmConfError) as caught:
        conf.partition_nodes("test-wrong-partition")
    assert str(caught.value) == (f"{conf.path}:10: PartitionName=test-wrong-partition: 'test-wrong-nodelist' in "
                                 "Nodes= is neither a NodeName nor a NodeSet")


def test_slurm_constructed_continuations_escapes_defaults_and_features(tmp_path):
    write(tmp_path, """
        NodeName=g[1-2] Feature=a100 NodeHostname=host[1-2]
        """, "conf.d/linux_gpu.conf")
    path = write(tmp_path, r"""
        # constructed for handover's tests
        ClusterName=Linux
        nodename=DEFAULT Port=7000 Features=cpu   # comment
        NodeName=c[1-3,7] \
          NodeAddr=10.0.0.[1-3,7] Reason="under \#maintenance"
        Include conf.d/%c_gpu.conf
        NodeSet=gpus Feature=a100
        PARTITIONNAME=default Nodes=c[1-2]
        PartitionName = cpu
        PartitionName=gpu Nodes=gpus,c7
        PartitionName=all Nodes=all
        """, "slurm.conf")
    conf = read_slurm_conf(path)
    assert [n.name for n in conf.partition_nodes("cpu")] == ["c1", "c2"]  # DEFAULT's Nodes
    assert [n.name for n in conf.partition_nodes("gpu")] == ["c7", "g1", "g2"]  # NodeName order
    assert conf.nodes["c7"].address == "10.0.0.7" and conf.nodes["c7"].port == 7000
    assert conf.nodes["g2"].address == "host2" and conf.nodes["g2"].features == ("a100",)
    assert conf.nodes["c1"].features == ("cpu",) and len(conf.partition_nodes("all")) == 6


@pytest.mark.parametrize("text, line, problem", [
    ("NodeName=DEFAULT NodeAddr=x\n", 1, "NodeAddr is not allowed with NodeName=DEFAULT"),
    ("NodeName=n[1-3] NodeAddr=a[1-2]\n", 1, "2 NodeAddr value(s) for 3 NodeName(s); give one each or a single one"),
    ("NodeName=n1\nNodeName=n[0-1]\n", 2, "NodeName 'n1' defined twice; first at {path}:1"),
    ("NodeName=n[1-2 CPUs=2\n", 1, "NodeName=n[1-2: not a hostlist expression (unbalanced brackets)"),
    ("NodeName=n1 Port=70000\n", 1, "Port=70000: '70000' is not a port number"),
    ("NodeName=n1 CPUs 2\n", 1, "cannot read 'CPUs 2' as Key=Value"),
    ("Include fragments/*.conf\n", 1, "Include 'fragments/*.conf': Slurm does not expand globs"),
    ("Include %c.conf\n", 1, "Include '%c.conf': %c needs a ClusterName line before it"),
    ("PartitionName=p Nodes=n1\nPartitionName=p\n", 2, "PartitionName 'p' defined twice; first at {path}:1"),
])
def test_slurm_bad_input_is_one_line_with_file_and_line(tmp_path, text, line, problem):
    path = write(tmp_path, text, "slurm.conf")  # constructed
    with pytest.raises(SlurmConfError) as caught:
        read_slurm_conf(path)
    assert str(caught.value) == f"{path}:{line}: {problem.format(path=path)}"


def test_slurm_missing_include_and_include_loop(tmp_path):
    path = write(tmp_path, "Include missing.conf\n", "slurm.conf")
    with pytest.raises(SlurmConfError) as caught:
        read_slurm_conf(path)
    assert str(caught.value) == f"{tmp_path / 'missing.conf'}: no such file; Include file not found"
    write(tmp_path, "Include slurm.conf\n", "missing.conf")
    with pytest.raises(SlurmConfError, match=r"includes itself \(through .*slurm.conf -> .*missing.conf\)"):
        read_slurm_conf(path)


# ---------------------------------------------------------------- the inventory hook and the CLI


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """An inventory with nodes from slurm.conf, from Ansible and from its own YAML (constructed)."""
    key = write(tmp_path, "not a key; the loader checks that it exists\n", "keys/gpu_ed25519")
    shutil.copytree(SLURM / "parallelcluster", tmp_path / "slurm")
    write(tmp_path, f"""
        [gpu]
        gpu01 ansible_host=10.9.0.1 ansible_port=2200
        gpu02 ansible_host=10.9.0.2 ansible_port=2200
        gpu03 ansible_ssh_host=10.9.0.3 ansible_ssh_private_key_file={key}
        [gpu:vars]
        ansible_user=ops
        """, "ansible/hosts.ini")
    return write(tmp_path, f"""
        cluster: mixed
        profile: cpu-only
        ssh: {{user: root, port: 22, identity_file: {key}}}
        nodes:
          - {{slurm: {{conf: slurm/slurm_parallelcluster.conf, partition: efa}}}}
          - {{ansible: {{inventory: ansible/hosts.ini, group: gpu}}}}
          - login01
        groups:
          efa: {{nodes: "efa-dy-efa-c5n-[1-4]", user: ec2-user}}
        """, "cluster.yaml")


def test_hook_expands_sources_into_nodes_that_remember_where_they_came_from(sources):
    cluster = load_inventory(sources)
    assert [n.name for n in cluster.nodes][:5] == ["efa-st-efa-c5n-1", "efa-dy-efa-c5n-1", "efa-dy-efa-c5n-2",
                                                   "efa-dy-efa-c5n-3", "efa-dy-efa-c5n-4"]
    static, dynamic = cluster.node("efa-st-efa-c5n-1"), cluster.node("efa-dy-efa-c5n-1")
    assert static.source == "slurm.conf slurm/slurm_parallelcluster.conf partition efa"
    assert (static.address, static.ssh.user, static.ssh.port) == ("efa-st-efa-c5n-1", "root", 22)
    assert dynamic.ssh.user == "ec2-user" and dynamic.groups == ("efa",)  # a group of the inventory applies
    gpu01, gpu03 = cluster.node("gpu01"), cluster.node("gpu03")
    assert gpu01.source == "ansible ansible/hosts.ini group gpu"
    assert (gpu01.address, gpu01.ssh.port, gpu01.ssh.user) == ("10.9.0.1", 2200, "ops")
    assert (gpu03.address, gpu03.ssh.port) == ("10.9.0.3", 22)  # Ansible says no port: ssh: applies
    assert gpu03.ssh.identity_file == str(sources.parent / "keys" / "gpu_ed25519")
    assert cluster.node("login01").source == "yaml"


def test_the_digest_covers_the_files_that_listed_the_nodes(sources, tmp_path):
    """A run pins the inventory's digest and --resume compares it: a changed include of the
    slurm.conf, or a changed group_vars file, is a different inventory; an inventory that reads
    no other file keeps the digest of its own bytes."""
    before = load_inventory(sources).digest
    include = tmp_path / "slurm" / "pcluster" / "slurm_parallelcluster_efa_partition.conf"
    include.write_text(include.read_text() + "# a comment changes the bytes, not the nodes\n")
    after_include = load_inventory(sources).digest
    write(tmp_path, "ansible_user: admin\n", "ansible/group_vars/gpu.yml")
    after_vars = load_inventory(sources)
    assert len({before, after_include, after_vars.digest}) == 3
    assert after_vars.node("gpu01").ssh.user == "admin"  # group_vars/ outranks [gpu:vars], as in Ansible
    plain = write(tmp_path, "cluster: c\nprofile: cpu-only\nnodes: [a]\n", "plain.yaml")
    assert load_inventory(plain).digest == hashlib.sha256(plain.read_bytes()).hexdigest()


def hook_error(tmp_path: Path, entry: str) -> InventoryError:
    path = write(tmp_path, f"cluster: c\nprofile: cpu-only\ntransport: ssh\nnodes:\n  - {entry}\n", "inv.yaml")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert "\n" not in str(caught.value)
    return caught.value


def test_hook_bad_entries_are_one_line_naming_file_line_and_field(tmp_path):
    shutil.copy(SLURM / "schedmd_man5_example_slurm.conf", tmp_path / "slurm.conf")
    shutil.copy(ANSIBLE / "deepops_virtual_inventory_large_slurm", tmp_path / "hosts")
    shutil.copy(ANSIBLE / "deepops_config.example_inventory", tmp_path / "template")
    inv = tmp_path / "inv.yaml"
    assert str(hook_error(tmp_path, "{slurm: {conf: slurm.conf, partition: debg}}")) == (
        f"{inv}:5: nodes[0].slurm.partition: no partition 'debg' in {tmp_path / 'slurm.conf'}; "
        "did you mean 'debug'? partitions: debug, batch, long")
    assert str(hook_error(tmp_path, "{slurm: {partition: gpu}}")).startswith(
        f"{inv}:5: nodes[0].slurm: partition 'gpu' from the live Slurm (sinfo): ")
    assert str(hook_error(tmp_path, "{ansible: {inventory: hosts, group: slurm-nodes}}")).startswith(
        f"{inv}:5: nodes[0].ansible.group: no group 'slurm-nodes' in {tmp_path / 'hosts'}; did you mean "
        "'slurm-node'? groups: all, ungrouped,")
    assert str(hook_error(tmp_path, "{ansible: {inventory: template, group: slurm-node}}")) == (
        f"{inv}:5: nodes[0].ansible: group 'slurm-node' in {tmp_path / 'template'} has no hosts")
    assert str(hook_error(tmp_path, "{ansible: {inventory: nowhere.ini, group: all}}")) == (
        f"{tmp_path / 'nowhere.ini'}: no such file")
    assert str(hook_error(tmp_path, "{slurm: {conf: slurm.conf, partition: debug}, ansible: {}}")) == (
        f"{inv}:5: nodes[0]: give either slurm: or ansible: in one entry, not both")
    write(tmp_path, "[gpu]\ng1 ansible_ssh_private_key_file=keys/id\n", "rel.ini")
    assert str(hook_error(tmp_path, "{ansible: {inventory: rel.ini, group: gpu}}")) == (
        f"{inv}:5: nodes[0]: host 'g1' in {tmp_path / 'rel.ini'}: ansible_ssh_private_key_file 'keys/id' is "
        "relative, and Ansible resolves it from where it runs; make it absolute")
    write(tmp_path, "[gpu]\ng1 ansible_host=-oProxyCommand=touch\n", "inject.ini")
    assert str(hook_error(tmp_path, "{ansible: {inventory: inject.ini, group: gpu}}")) == (
        f"{inv}:5: nodes[0]: node 'g1' from ansible inject.ini group gpu: address '-oProxyCommand=touch' is not "
        "a host name or IP address")
    write(tmp_path, "[gpu]\ng1 ansible_port=ssh\n", "port.ini")
    assert str(hook_error(tmp_path, "{ansible: {inventory: port.ini, group: gpu}}")) == (
        f"{tmp_path / 'port.ini'}:2: host 'g1': ansible_port: expected a port number, got 'ssh'")


def test_hook_a_node_in_two_sources_is_a_duplicate(tmp_path):
    shutil.copy(SLURM / "schedmd_man5_example_slurm.conf", tmp_path / "slurm.conf")
    path = write(tmp_path, """
        cluster: c
        profile: cpu-only
        transport: ssh
        nodes:
          - {slurm: {conf: slurm.conf, partition: batch}}
          - {slurm: {conf: slurm.conf, partition: long}}
        """, "inv.yaml")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value) == f"{path}:6: nodes[1]: duplicate node 'dev9'; already listed at line 5"


def handover(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handover.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_inventory_shows_each_nodes_source_and_json_for_scripts(sources):
    shown = handover("inventory", sources)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == (
        "cluster mixed: 9 node(s) efa-dy-efa-c5n-[1-4],efa-st-efa-c5n-1,gpu[01-03],login01")
    assert ("node gpu01: address 10.9.0.1, user ops, port 2200; from ansible ansible/hosts.ini group gpu"
            in shown.stdout.splitlines())
    listed = handover("inventory", sources, "--json")
    assert listed.returncode == 0, listed.stderr
    nodes = json.loads(listed.stdout)["nodes"]
    assert list(json.loads(listed.stdout)) == ["nodes"]
    assert nodes[0] == {"name": "efa-st-efa-c5n-1", "address": "efa-st-efa-c5n-1", "port": 22, "user": "root",
                        "identity_file": str(sources.parent / "keys" / "gpu_ed25519"), "rack": None, "leaf": None,
                        "source": "slurm.conf slurm/slurm_parallelcluster.conf partition efa"}
    assert [n["source"] for n in nodes][-1] == "yaml"


def test_cli_inventory_refuses_a_plugin_config_in_one_line(tmp_path):
    shutil.copy(ANSIBLE / "ansible_inventory_constructed_constructed.yml", tmp_path / "constructed.yml")
    path = write(tmp_path, "cluster: c\nprofile: cpu-only\nnodes:\n  - {ansible: {inventory: constructed.yml, "
                           "group: all}}\n", "inv.yaml")
    done = handover("inventory", path, "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"handover: {tmp_path / 'constructed.yml'}:1: an inventory plugin configuration "
                           "(`plugin:`), which Ansible would run; handover runs nothing from an inventory: give "
                           "a static INI or YAML file\n")


def test_slurm_nodes_take_their_leaf_switch_from_topology_conf_beside_slurm_conf(tmp_path):
    """slurm.conf's man page example with `TopologyPlugin=topology/tree` added (the test writes
    that line) and topology.conf's man page example beside it: each node of the partition sits
    under the first leaf switch whose Nodes= lists it (the spine's Switches= line is passed over),
    a node no switch lists takes its group's `leaf:`, and the inventory's digest covers
    topology.conf. Without the plugin line Slurm reads no topology, and neither does this."""
    conf = tmp_path / "slurm.conf"
    conf.write_text((SLURM / "schedmd_man5_example_slurm.conf").read_text() + "TopologyPlugin=topology/tree\n")
    shutil.copy(SLURM / "schedmd_man5_example_topology.conf", tmp_path / "topology.conf")
    path = write(tmp_path, """
        cluster: c
        profile: cpu-only
        nodes:
          - {slurm: {conf: slurm.conf, partition: debug}}
        groups:
          outside: {nodes: "dev[18-25]", leaf: edge}
        """, "inv.yaml")
    cluster = load_inventory(path)
    leaves = {node.name: node.leaf for node in cluster.nodes}
    assert leaves == {**{f"dev{i}": "s0" for i in range(6)}, **{f"dev{i}": "s1" for i in range(6, 9)},
                      **{f"dev{i}": "edge" for i in range(18, 26)}}
    assert read_slurm_conf(conf).files[-1] == str(tmp_path / "topology.conf")
    shown = handover("inventory", path)
    assert ("node dev0: address edev0, user (ssh default), port (ssh default), leaf s0; from slurm.conf slurm.conf "
            "partition debug") in shown.stdout.splitlines()
    before = cluster.digest
    (tmp_path / "topology.conf").write_text("SwitchName=s9 Nodes=dev[0-25]\n")
    assert {node.leaf for node in load_inventory(path).nodes} == {"s9"} and load_inventory(path).digest != before
    conf.write_text((SLURM / "schedmd_man5_example_slurm.conf").read_text())
    assert read_slurm_conf(conf).places == SlurmPlaces({}, {})
    (tmp_path / "topology.conf").write_text("SwitchName=s0 Nodes=dev[0-5\n")
    conf.write_text(conf.read_text() + "TopologyPlugin=topology/tree\n")
    with pytest.raises(SlurmConfError) as caught:
        read_slurm_conf(conf)
    assert str(caught.value).startswith(f"{tmp_path / 'topology.conf'}:1: Nodes=dev[0-5: not a hostlist expression")


def test_scontrol_show_topology_gives_each_node_its_lowest_switch():
    """Slurm 22.05's real `scontrol show topology` (tests/data/slurm-clients): the spine s2 lists
    every node at Level=1, each node's leaf is its Level=0 switch."""
    text = (REPO / "tests" / "data" / "slurm-clients" / "scontrol_show_topology_tree.stdout").read_text()
    assert parse_scontrol_topology(text) == SlurmPlaces({"node1": "s0", "node2": "s0", "node3": "s1", "node4": "s1"},
                                                        {})
    assert parse_scontrol_topology("") == SlurmPlaces({}, {})  # no TopologyPlugin: the message is on stderr
    with pytest.raises(SlurmConfError) as caught:
        parse_scontrol_topology("SwitchName=s0 Level=x Nodes=node1\n")
    assert str(caught.value) == "scontrol show topology:1: Level=x: not a switch level"


def test_scontrol_show_topology_of_blocks_gives_each_node_its_rack():
    """topology/block (Slurm 23.11 and later; this machine's 22.05 has no such plugin, so the test
    writes the lines, in the format topology_block.c prints: `BlockName=%s BlockIndex=%u` then
    ` Nodes=%s`, and BlockSize=): each node's block is its rack, and no node has a leaf."""
    text = ("BlockName=b1 BlockIndex=0 Nodes=gpu[001-004] BlockSize=4\n"
            "BlockName=b2 BlockIndex=1 Nodes=gpu[005-008] BlockSize=4\n")
    places = parse_scontrol_topology(text)
    assert places.leaves == {}
    assert places.racks == {**{f"gpu{i:03}": "b1" for i in range(1, 5)}, **{f"gpu{i:03}": "b2" for i in range(5, 9)}}
    assert places.of("gpu005") == {"rack": "b2"} and places.of("gpu009") == {}


def test_slurm_nodes_take_their_rack_from_topology_block(tmp_path):
    """topology.conf's man page example for topology/block beside a slurm.conf the test writes
    (the example's node[1-128] in one partition, `TopologyPlugin=topology/block`): each node's
    block is its rack, the BlockSizes= line places nobody, `handover inventory` shows the rack."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=node[1-128]\nPartitionName=gpu Nodes=ALL\nTopologyPlugin=topology/block\n")
    shutil.copy(SLURM / "schedmd_man5_example_topology_block.conf", tmp_path / "topology.conf")
    path = write(tmp_path, "cluster: c\nprofile: cpu-only\nnodes:\n  - {slurm: {conf: slurm.conf, partition: gpu}}\n",
                 "inv.yaml")
    racks = {node.name: node.rack for node in load_inventory(path).nodes}
    assert racks == {f"node{i}": f"block{(i - 1) // 32 + 1}" for i in range(1, 129)}
    assert {node.leaf for node in load_inventory(path).nodes} == {None}
    shown = handover("inventory", path).stdout.splitlines()
    assert ("nodes node[33-64] (32 nodes): address its own name, user (ssh default), port (ssh default), "
            "rack block2; from slurm.conf slurm.conf partition gpu") in shown
    listed = json.loads(handover("inventory", path, "--json").stdout)["nodes"]
    assert [(n["name"], n["rack"], n["leaf"]) for n in listed[31:33]] == [("node32", "block1", None),
                                                                         ("node33", "block2", None)]
    (tmp_path / "topology.conf").write_text("BlockName=b1 Nodes=node[1-128]\nSwitchName=s0 Nodes=node1\n")
    with pytest.raises(SlurmConfError) as caught:
        read_slurm_conf(conf)
    assert str(caught.value) == (f"{tmp_path / 'topology.conf'}:2: a topology/block line starts with BlockName= "
                                 "or BlockSizes=")


def test_topology_yaml_is_read_instead_of_topology_conf(tmp_path):
    """topology.yaml's man page example beside a slurm.conf the test writes (node[01-16]): Slurm
    reads it and ignores topology.conf (here one that would put every node under s9), so do we.
    The cluster_default tree gives node01-04 their leaf, the block topology every node its rack,
    the flat one nothing; the digest covers the file; a bad file is one line naming its line."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=node[01-16]\nPartitionName=gpu Nodes=ALL\nTopologyPlugin=topology/tree\n")
    (tmp_path / "topology.conf").write_text("SwitchName=s9 Nodes=node[01-16]\n")
    shutil.copy(SLURM / "schedmd_man5_example_topology.yaml", tmp_path / "topology.yaml")
    path = write(tmp_path, "cluster: c\nprofile: cpu-only\nnodes:\n  - {slurm: {conf: slurm.conf, partition: gpu}}\n",
                 "inv.yaml")
    cluster = load_inventory(path)
    assert {node.name: (node.rack, node.leaf) for node in cluster.nodes} == {
        f"node{i:02}": (f"b{(i - 1) // 4 + 1}", "sw_root" if i <= 4 else None) for i in range(1, 17)}
    assert read_slurm_conf(conf).files[-1] == str(tmp_path / "topology.yaml")
    text = (SLURM / "schedmd_man5_example_topology.yaml").read_text()
    (tmp_path / "topology.yaml").write_text(text.replace("b2", "b9"))
    assert load_inventory(path).digest != cluster.digest
    (tmp_path / "topology.yaml").write_text(text.replace("    - block: b3\n", "    - name: b3\n"))
    with pytest.raises(SlurmConfError) as caught:
        read_slurm_conf(conf)
    assert str(caught.value) == f"{tmp_path / 'topology.yaml'}:18: an item of blocks: has no block:"
    (tmp_path / "topology.yaml").write_text(text.replace("node[13-16]", "node[13-16"))
    done = handover("inventory", path)
    assert done.returncode == 2 and done.stderr.startswith(
        f"handover: {tmp_path / 'topology.yaml'}:21: nodes=node[13-16: not a hostlist expression")
    (tmp_path / "topology.yaml").write_text("- topology: [\n")
    with pytest.raises(SlurmConfError, match=r"topology.yaml:2: not YAML"):
        read_slurm_conf(conf)
