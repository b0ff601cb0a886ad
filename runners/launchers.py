"""Launchers: small classes that render the argv an existing engine needs to start a parallel job.

A launcher never runs anything and never builds a shell string: `argv(hosts, ranks_per_node,
command)` returns a list, which a Transport runs (and bounds with its timeout) on the node(s)
named by `starts_on`:

- "first": one process on the first host starts every rank (mpirun; srun, wherever a Slurm
  client is: the harness's machine or the first host);
- "every": the same argv runs on every host and the ranks meet at a rendezvous (torchrun).

Which engine starts an MPI job across nodes is the inventory's (`launch.engine`), and
`mpi_launcher` is the one place that reads it: the suites ask it for the launcher, never pick.
A launcher names its hosts by address (mpirun's ssh reaches them) or by node name (Slurm's
--nodelist): `hosts_by`, and `hosts(nodes)` gives them in that form.

As in ReFrame, launchers are unit-tested by comparing argv.
"""
from __future__ import annotations

import math
import os
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from inventory.model import LaunchSettings, Node, SshSettings
from runners.transport import HARNESS_GRACE_S

STARTS_ON = ("first", "every")
SRUN = "srun"
MPIRUN = "mpirun"
# srun --mpi for Open MPI and HPC-X ranks: both take their rank and peers from PMIx (Open MPI 4's
# pmi2 support needs Slurm's libpmi2 at its build, which Debian's and HPC-X's builds lack).
SRUN_MPI = "pmix"
JOB_PREFIX = "handover-"  # srun jobs and steps are named JOB_PREFIX + a unique part: scancel finds them
IMMEDIATE_S = 30  # how long srun may wait for its nodes before it gives up (--immediate)


class LaunchError(ValueError):
    """The launch cannot be rendered as asked (no hosts, a value the engine would split)."""


class Launcher(ABC):
    """Renders the argv that starts `command` with `ranks_per_node` ranks on each of `hosts`."""

    name: str = ""
    starts_on: str = "first"  # one of STARTS_ON
    hosts_by: str = "address"  # how argv names hosts: "address" or "name" (the node's, Slurm's)

    def hosts(self, nodes: Sequence[Node]) -> list[str]:
        """The nodes as this launcher's argv names them, in rank order."""
        return [node.name if self.hosts_by == "name" else node.address for node in nodes]

    @abstractmethod
    def argv(self, hosts: Sequence[str], ranks_per_node: int, command: Sequence[str]) -> list[str]:
        """hosts are addresses as the engine reaches them, in rank order; the first one leads."""

    @staticmethod
    def _check(hosts: Sequence[str], ranks_per_node: int, command: Sequence[str]) -> None:
        if not hosts:
            raise LaunchError("no hosts to launch on")
        if len(set(hosts)) != len(hosts):
            raise LaunchError(f"hosts listed twice: {', '.join(hosts)}")
        if ranks_per_node < 1:
            raise LaunchError(f"ranks per node must be at least 1, got {ranks_per_node}")
        if not command:
            raise LaunchError("no command to launch")


def _one_word(value: str, what: str) -> str:
    """Open MPI splits plm_rsh_args at whitespace: a path with a space would become two words."""
    if not value or any(char.isspace() for char in value):
        raise LaunchError(f"{what} {value!r} is empty or contains whitespace, which mpirun "
                          "would split; use a path without spaces")
    return value


# The engine's ssh gives up on a link that answers no keepalive for 18 s, as the harness's own
# transport does (runners.ssh.LINK_DEAD_AFTER_S): a dead link ends the launch, not its timeout.
ENGINE_KEEPALIVE = ("-o", "ServerAliveInterval=6", "-o", "ServerAliveCountMax=3")


def ssh_options(ssh: SshSettings) -> list[str]:
    """ssh's options for the engine's own connections: the inventory's identity, port and host
    keys, never a prompt, a bounded connect and keepalives, like the harness's own transport.

    Nothing is written on a node outside its scratch paths: under `host_keys: accept-new` the
    keys the first node's ssh learns go to /dev/null, not into the node user's ~/.ssh/known_hosts
    or the inventory's known_hosts file (read as a global file there, which ssh never writes;
    without one the system-wide known hosts are still checked), and no key is updated
    (UpdateHostKeys, on by default in OpenSSH 8.5+ for the user's own file)."""
    options = []
    if ssh.user:
        options += ["-l", _one_word(ssh.user, "ssh user")]
    if ssh.port:
        options += ["-p", str(ssh.port)]
    if ssh.identity_file:
        options += ["-i", _one_word(ssh.identity_file, "identity file")]
    known = _one_word(ssh.known_hosts, "known_hosts file") if ssh.known_hosts else None
    if ssh.host_keys == "accept-new":
        options += (["-o", "GlobalKnownHostsFile=" + known] if known else []) + ["-o", "UserKnownHostsFile=/dev/null"]
    elif known:
        options += ["-o", "UserKnownHostsFile=" + known]
    policy = "accept-new" if ssh.host_keys == "accept-new" else "yes"
    options += ["-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={policy}", "-o", "UpdateHostKeys=no",
                "-o", f"ConnectTimeout={max(1, int(round(ssh.connect_timeout)))}", *ENGINE_KEEPALIVE]
    return options


@dataclass(frozen=True)
class MpirunLauncher(Launcher):
    """Open MPI / HPC-X `mpirun`, started on the first host; it reaches the others over ssh.

    Hosts go on the command line (`--host a:2,b:2`), so no hostfile is written anywhere. When
    mpirun is signalled (the transport's timeout or kill), it takes its daemons and ranks on
    every host down with it.
    """

    ssh: SshSettings = field(default_factory=SshSettings)
    as_root: bool = False  # the launching user is root: Open MPI refuses root without a flag
    oversubscribe: bool = False  # more ranks than cores (tests on small machines)
    interfaces: tuple[str, ...] = ()  # btl_tcp_if_include and oob_tcp_if_include
    mca: Mapping[str, str] = field(default_factory=dict)  # further MCA parameters, by name
    program: str = MPIRUN
    export_env: tuple[str, ...] = ()  # environment variable names passed to every rank (-x)

    name = "mpirun"
    starts_on = "first"

    def argv(self, hosts, ranks_per_node, command):
        self._check(hosts, ranks_per_node, command)
        ipv6 = [host for host in hosts if ":" in host]
        if ipv6:  # Open MPI reads a:b:2 as host a, and refuses [a:b]:2 as an illegal node name
            raise LaunchError(f"mpirun's --host cannot name the IPv6 address {ipv6[0]}: give the nodes host "
                              "names as their address (names the first node resolves), or launch with Slurm")
        argv = [self.program, "-np", str(len(hosts) * ranks_per_node),
                "--host", ",".join(f"{host}:{ranks_per_node}" for host in hosts),
                "--map-by", f"ppr:{ranks_per_node}:node"]
        if self.as_root:
            argv.append("--allow-run-as-root")
        if self.oversubscribe:
            argv.append("--oversubscribe")
        for name, value in self._mca().items():
            argv += ["--mca", name, value]
        for name in self.export_env:
            argv += ["-x", name]
        return argv + list(command)

    def _mca(self) -> dict[str, str]:
        parameters = {"plm_rsh_args": " ".join(ssh_options(self.ssh))}
        if self.interfaces:
            listed = ",".join(_one_word(name, "interface") for name in self.interfaces)
            parameters.update(btl_tcp_if_include=listed, oob_tcp_if_include=listed)
        parameters.update(self.mca)
        return parameters


def allocation_options(settings: LaunchSettings, *, minutes: Optional[int] = None) -> list[str]:
    """Where srun runs: a step of the run's allocation (the harness's, or the one it runs in), or
    a job of its own (job_options)."""
    job = settings.allocation or os.environ.get("SLURM_JOB_ID")
    if job:
        return [f"--jobid={job}", "--overlap"] + ([f"--time={minutes}"] if minutes else [])
    return job_options(settings, minutes=minutes)


def job_options(settings: LaunchSettings, *, minutes: Optional[int] = None) -> list[str]:
    """A new job's: the inventory's partition, account, reservation and time limit (the shorter
    of it and `minutes`)."""
    options = [f"--partition={settings.partition}"] if settings.partition else []
    options += [f"--account={settings.account}"] if settings.account else []
    options += [f"--reservation={settings.reservation}"] if settings.reservation else []
    limits = [m for m in (minutes, settings.time_limit_min) if m]
    return options + ([f"--time={min(limits)}"] if limits else [])


@dataclass(frozen=True)
class SrunLauncher(Launcher):
    """`srun` as the launcher of multi-node jobs: ranks_per_node tasks on each host, started from
    wherever a Slurm client is (the harness's machine or the first host), bounded by --immediate
    and a --time limit, and named, so that a cancel finds the step."""

    settings: LaunchSettings = field(default_factory=LaunchSettings)
    job_name: str = field(default_factory=lambda: JOB_PREFIX + secrets.token_hex(6))
    time_min: Optional[int] = None
    options: tuple[str, ...] = ()  # further srun options, before the command
    mpi: Optional[str] = None  # srun --mpi: the PMI the ranks speak (SRUN_MPI for MPI jobs)
    overcommit: bool = False  # more ranks than CPUs (tests on small machines)
    env: Mapping[str, str] = field(default_factory=dict)  # set for every rank, beyond srun's own

    name = "srun"
    starts_on = "first"
    hosts_by = "name"

    def argv(self, hosts, ranks_per_node, command):
        self._check(hosts, ranks_per_node, command)
        argv = [SRUN, f"--nodelist={','.join(hosts)}", f"--nodes={len(hosts)}",
                f"--ntasks={len(hosts) * ranks_per_node}", f"--ntasks-per-node={ranks_per_node}",
                f"--immediate={IMMEDIATE_S}", f"--job-name={self.job_name}", "--kill-on-bad-exit=1",
                *allocation_options(self.settings, minutes=self.time_min)]
        argv += [f"--mpi={self.mpi}"] if self.mpi else []
        argv += ["--overcommit"] if self.overcommit else []
        if self.env:
            argv.append("--export=" + ",".join(["ALL", *(f"{k}={_no_comma(v, k)}" for k, v in self.env.items())]))
        return argv + list(self.options) + list(command)


def _no_comma(value: str, name: str) -> str:
    """srun --export separates variables with commas: a value with one would be cut."""
    if "," in value:
        raise LaunchError(f"{name}={value!r}: srun --export cannot carry a value with a comma")
    return value


def uses_srun(launch: Optional[LaunchSettings]) -> bool:
    """Whether Slurm's srun starts the multi-node jobs (the inventory's launch.engine)."""
    return launch is not None and launch.engine == "slurm"


def mpi_launcher(launch: LaunchSettings, *, ssh: SshSettings, as_root: bool = False,
                 oversubscribe: bool = False, interfaces: tuple[str, ...] = (),
                 export_env: tuple[str, ...] = (), timeout: Optional[float] = None) -> Launcher:
    """The launcher of an MPI job across nodes (HPL, nccl-tests), as the inventory says: srun with
    PMIx under `launch: {engine: slurm}`, else mpirun over ssh. The same job either way: the TCP
    interfaces, more ranks than CPUs, and `export_env` (mpirun -x's NAME or NAME=VALUE) for every
    rank; srun passes the launching node's whole environment, and Open MPI under srun does not
    refuse root. `timeout` (s) becomes srun's --time."""
    if not uses_srun(launch):
        return MpirunLauncher(ssh=ssh, as_root=as_root, oversubscribe=oversubscribe,
                              interfaces=interfaces, export_env=export_env)
    env = dict(entry.split("=", 1) for entry in export_env if "=" in entry)
    if interfaces:
        env["OMPI_MCA_btl_tcp_if_include"] = ",".join(_one_word(name, "interface") for name in interfaces)
    return SrunLauncher(settings=launch, mpi=SRUN_MPI, overcommit=oversubscribe, env=env,
                        time_min=None if timeout is None else minutes_for(timeout))


def minutes_for(seconds: float) -> int:
    """srun's --time in whole minutes, beyond the node-side timeout and its kill grace: Slurm's
    limit must not fire with the node's own timeout, whose exit (124, 137) says what happened."""
    return max(1, math.ceil((seconds + HARNESS_GRACE_S) / 60))


def launch_program(launch: Optional[LaunchSettings]) -> str:
    """The program an MPI job across nodes is started with: it must be on the first node."""
    return SRUN if uses_srun(launch) else MPIRUN
