"""Launchers render argv lists (pure tests), and mpirun really starts and stops ranks across
namespace nodes: a hung rank is bounded by the transport's timeout and leaves nothing behind."""
from __future__ import annotations

import pytest
from nodes import ns_inventory, unique_sleep, wait_for_no_leftovers

from inventory.model import LaunchSettings, Node, SshSettings
from runners import nccl_tests
from runners.launchers import (
    Launcher,
    LaunchError,
    MpirunLauncher,
    SrunLauncher,
    launch_program,
    mpi_launcher,
    ssh_options,
)
from runners.ssh import SshTransport

SSH = SshSettings(user="root", port=2222, identity_file="/keys/id_ed25519",
                  known_hosts="/keys/known_hosts", connect_timeout=5)


def test_mpirun_argv_places_ranks_per_node_on_named_hosts():
    argv = MpirunLauncher().argv(["gpu001", "gpu002"], 8, ["xhpl"])
    assert argv[:7] == ["mpirun", "-np", "16", "--host", "gpu001:8,gpu002:8", "--map-by", "ppr:8:node"]
    assert argv[-1] == "xhpl"
    assert "--allow-run-as-root" not in argv and "--oversubscribe" not in argv


def test_mpirun_argv_root_oversubscribe_interfaces_and_extra_mca():
    launcher = MpirunLauncher(as_root=True, oversubscribe=True, interfaces=("ib0", "eth0"),
                              mca={"pml": "ucx"}, export_env=("NCCL_DEBUG",))
    argv = launcher.argv(["a"], 2, ["hpcc"])
    assert "--allow-run-as-root" in argv and "--oversubscribe" in argv
    mca = {argv[i + 1]: argv[i + 2] for i, word in enumerate(argv) if word == "--mca"}
    assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == "ib0,eth0"
    assert mca["pml"] == "ucx"
    assert argv[argv.index("-x") + 1] == "NCCL_DEBUG"
    assert argv[-1] == "hpcc"


def test_plm_rsh_args_carry_the_inventory_ssh_settings_as_one_word():
    argv = MpirunLauncher(ssh=SSH).argv(["a", "b"], 1, ["true"])
    rsh = argv[argv.index("plm_rsh_args") + 1]
    assert rsh == ("-l root -p 2222 -i /keys/id_ed25519 -o UserKnownHostsFile=/keys/known_hosts "
                   "-o BatchMode=yes -o StrictHostKeyChecking=yes -o UpdateHostKeys=no -o ConnectTimeout=5 "
                   "-o ServerAliveInterval=6 -o ServerAliveCountMax=3")
    learning = ssh_options(SshSettings(host_keys="accept-new"))
    assert "StrictHostKeyChecking=accept-new" in learning and "-i" not in learning
    # what it learns is not written into the node user's ~/.ssh/known_hosts
    assert "UserKnownHostsFile=/dev/null" in learning
    assert "UserKnownHostsFile=/dev/null" not in ssh_options(SshSettings())
    # nor into the inventory's known_hosts file, read as a global file (ssh never writes those)
    given = ssh_options(SshSettings(host_keys="accept-new", known_hosts="/keys/known_hosts"))
    assert " ".join(given).startswith("-o GlobalKnownHostsFile=/keys/known_hosts -o UserKnownHostsFile=/dev/null ")


@pytest.mark.parametrize("hosts, ranks, command, message", [
    ([], 1, ["x"], "no hosts"),
    (["a", "a"], 1, ["x"], "listed twice"),
    (["a"], 0, ["x"], "at least 1"),
    (["a"], 1, [], "no command"),
])
def test_mpirun_refuses_launches_it_cannot_render(hosts, ranks, command, message):
    with pytest.raises(LaunchError, match=message):
        MpirunLauncher().argv(hosts, ranks, command)


def test_an_ipv6_address_mpirun_cannot_take_is_refused_with_what_to_do():
    """Open MPI 4.1.4 here: `--host fd00:77::1:2` has ssh resolve `fd00`, `--host [fd00:77::1]:2`
    is "illegal character in the following node name"."""
    with pytest.raises(LaunchError, match=r"cannot name the IPv6 address fd00:77::2: give the nodes host names"):
        MpirunLauncher().argv(["10.0.0.1", "fd00:77::2"], 1, ["x"])


def test_a_path_mpirun_would_split_is_refused():
    with pytest.raises(LaunchError, match="whitespace"):
        MpirunLauncher(ssh=SshSettings(identity_file="/my keys/id")).argv(["a"], 1, ["x"])


def test_both_engines_are_launchers_that_say_where_they_start():
    from runners.torchrun import TorchrunLauncher

    mpirun, torchrun = MpirunLauncher(as_root=True), TorchrunLauncher()
    assert isinstance(mpirun, Launcher) and isinstance(torchrun, Launcher)
    assert (mpirun.name, mpirun.starts_on) == ("mpirun", "first")
    assert (torchrun.name, torchrun.starts_on) == ("torchrun", "every")


def test_the_inventory_chooses_the_mpi_launcher(monkeypatch):
    """launch.engine decides, not the suite: mpirun over ssh by default, srun with PMIx under
    engine slurm, the same job either way (interfaces, more ranks than CPUs, NAME=VALUE
    variables), and each names its hosts as its engine reaches them."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    nodes = [Node("gpu001", "10.0.0.1", "ssh"), Node("gpu002", "10.0.0.2", "ssh")]
    asked = dict(ssh=SSH, as_root=True, oversubscribe=True, interfaces=("ib0",),
                 export_env=("NCCL_DEBUG", "NCCL_SOCKET_IFNAME=ib0"), timeout=125)
    mpirun = mpi_launcher(LaunchSettings(), **asked)
    assert isinstance(mpirun, MpirunLauncher) and mpirun.hosts(nodes) == ["10.0.0.1", "10.0.0.2"]
    assert launch_program(LaunchSettings()) == "mpirun"
    srun = mpi_launcher(LaunchSettings(engine="slurm", partition="gpu", allocation="4711"), **asked)
    assert isinstance(srun, SrunLauncher) and srun.hosts(nodes) == ["gpu001", "gpu002"]
    assert launch_program(LaunchSettings(engine="slurm")) == "srun"
    argv = srun.argv(srun.hosts(nodes), 8, ["xhpl"])
    assert argv[:5] == ["srun", "--nodelist=gpu001,gpu002", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8"]
    assert argv[argv.index("--jobid=4711"):] == [
        "--jobid=4711", "--overlap", "--time=3", "--mpi=pmix", "--overcommit",
        "--export=ALL,NCCL_SOCKET_IFNAME=ib0,OMPI_MCA_btl_tcp_if_include=ib0", "xhpl"]
    assert "--partition=gpu" not in argv  # a step of the allocation, which has the partition
    # Slurm's limit comes after the node's own timeout and its kill grace, never with it
    assert mpi_launcher(LaunchSettings(engine="slurm"), ssh=SSH, timeout=120).time_min == 3
    with pytest.raises(LaunchError, match="comma"):
        mpi_launcher(LaunchSettings(engine="slurm"), ssh=SSH, interfaces=("ib0", "ib1")).argv(["a"], 1, ["x"])


def test_nccl_tests_across_nodes_under_srun_is_one_rank_per_gpu(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    launcher = mpi_launcher(LaunchSettings(engine="slurm", allocation="4711"), ssh=SSH,
                            export_env=("NCCL_DEBUG", "NCCL_SOCKET_IFNAME=ib0"))
    argv = nccl_tests.across_argv(launcher, ["gpu001", "gpu002"], 8)
    assert argv[:5] == ["srun", "--nodelist=gpu001,gpu002", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8"]
    assert "--mpi=pmix" in argv and "--export=ALL,NCCL_SOCKET_IFNAME=ib0" in argv
    assert argv[argv.index("all_reduce_perf"):] == nccl_tests.argv("all_reduce", 1)


def _two_nodes(ns_cluster, tmp_path):
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    first = cluster.node("node1")
    launcher = MpirunLauncher(ssh=first.ssh, as_root=True)
    return cluster, SshTransport(first), launcher


def test_mpirun_from_the_first_node_starts_ranks_on_both_nodes(ns_cluster, tmp_path):
    cluster, transport, launcher = _two_nodes(ns_cluster, tmp_path)
    hosts = [node.address for node in cluster.nodes]
    try:
        result = transport.run(launcher.argv(hosts, 2, ["hostname"]), timeout=60)
    finally:
        transport.close()
    assert result.ok, result.stderr
    assert sorted(result.stdout.split()) == ["node1", "node1", "node2", "node2"]


def test_a_hung_rank_is_bounded_and_leaves_no_rank_or_daemon(ns_cluster, tmp_path):
    cluster, transport, launcher = _two_nodes(ns_cluster, tmp_path)
    sleep = unique_sleep()
    hosts = [node.address for node in cluster.nodes]
    try:
        result = transport.run(launcher.argv(hosts, 1, sleep.split()), timeout=6)
    finally:
        transport.close()
    assert result.timed_out and result.status == "timeout"
    assert wait_for_no_leftovers(sleep) == []
    assert wait_for_no_leftovers("orted", on=ns_cluster) == []
