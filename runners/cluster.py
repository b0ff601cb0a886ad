"""A cluster under test for one session: transports per node and per-step results, gathered once.

The first check that needs a step (say, system facts) runs it on every selected node at once;
every per-node test then reads its node's entry. So 32 nodes cost about what one costs.
A node found unreachable (its transport's `loss`) is left out of later steps, which are
unreachable at once with the time and reason it was lost, until its transport's next try is
due (runners.transport.RECONNECT_AFTER_S), or a caller that saw it answer since says so
(`reconnect`).

Where Slurm runs the work (`transport: slurm` or `launch: {engine: slurm}`) and the harness is
not inside an allocation (SLURM_JOB_ID), the session asks for one before its first command, on
the selected nodes Slurm can give (runners.slurm.Allocation), runs every srun as a step of it,
and gives it back at close(). If Slurm gives none, every srun asks for its own, as before, and a
node Slurm cannot run on is reported by name; so does a soak's session (`allocate=False`), whose
nodes go to the soak's own batch job (runners.soak.submit_job). ClusterRun is also where the launcher of MPI jobs
across nodes is chosen (`mpi_launcher`), with the allocation in its settings.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import threading
import time
from typing import Callable, Optional, Sequence

import hostlist

from inventory.model import Cluster, LaunchSettings, Node
from runners.fanout import Progress, close_everywhere, fan_out
from runners.launchers import Launcher, mpi_launcher, uses_srun
from runners.slurm import (
    Allocation,
    HostJob,
    LeaseStep,
    SlurmError,
    SlurmJob,
    SlurmSteps,
    SlurmTransport,
    node_states,
    time_limit_of,
)
from runners.transport import Loss, Result, Transport, clock, make_transport

ALLOCATION_STEP = "slurm_allocation"  # the raw record of the run's salloc
log = logging.getLogger("handover.cluster")


class ClusterRun:
    def __init__(self, cluster: Cluster, nodes: list[Node],
                 save_raw: Callable[[str, Result], list[str]],
                 on_progress: Optional[Callable[[Progress], None]] = None, allocate: bool = True):
        self.cluster = cluster
        self.allocate = allocate  # False: a soak's session, whose nodes are its own job's (runners.soak)
        self.nodes = nodes
        self._save_raw = save_raw
        self._on_progress = on_progress
        self._transports: dict[str, Transport] = {}
        self._steps: dict[str, dict[str, Result]] = {}
        self._raw: dict[tuple[str, str], list[str]] = {}
        self._taken: dict[str, float] = {}  # step -> when its results came in (time.time())
        self._unreached: dict[str, frozenset[str]] = {}  # step -> the nodes it did not reach
        self._missed: Optional[set[str]] = None  # what the cluster-wide check under way missed
        self._came_back: list[tuple[str, Loss, float]] = []  # losses of transports since replaced
        self._lock = threading.Lock()
        self._slurm_steps: Optional[SlurmSteps] = None  # transport slurm: one batcher per session
        self._allocation: Optional[Allocation] = None
        self._host_job: Optional[HostJob] = None  # the operator's allocation the harness runs in
        self._launch: Optional[LaunchSettings] = None  # cluster.launch, with the allocation once asked

    @property
    def launch(self) -> LaunchSettings:
        """The inventory's launch settings, with the run's allocation once there is one."""
        with self._lock:
            return self._launch_settings()

    def _launch_settings(self) -> LaunchSettings:
        if self._launch is None:
            self._launch = self.cluster.launch
            slurm = self.cluster.transport == "slurm" or uses_srun(self.cluster.launch)
            job = os.environ.get("SLURM_JOB_ID")
            if slurm and job:
                self._host_job = HostJob(job, time_limit_of(job))
            elif slurm and self.allocate:
                self._allocate()
        return self._launch

    @property
    def _allocation_in_use(self) -> Optional[SlurmJob]:
        """The allocation the run's steps are steps of, where Slurm runs them: its own or the one
        it runs in."""
        return self._allocation or self._host_job

    def _allocate(self) -> None:
        """The run's allocation on the selected nodes Slurm can give it whole now: not down, not
        running another job (one such node would have Slurm refuse the whole request, and every
        node's checks would fail); none: each srun asks for its own."""
        names = [node.name for node in self.nodes]
        try:
            usable = [name for name, state in node_states(names).items() if state.usable and not state.busy]
            if not usable:
                raise SlurmError(f"Slurm can give the run none of {', '.join(names)} now")
            self._allocation = Allocation([name for name in names if name in usable], self.cluster.launch)
        except SlurmError as exc:
            log.warning("no Slurm allocation for the run, each srun asks for its own: %s", exc)
            self._save_raw(ALLOCATION_STEP, Result("slurm", "salloc", None, "", str(exc), 0.0,
                                                   failure="error", detail=str(exc)))
            return
        allocation = self._allocation
        log.info("Slurm allocation %s (%s) for the run: %s", allocation.job, allocation.name,
                 allocation.record().strip().replace("\n", "; "))
        self._save_raw(ALLOCATION_STEP, Result("slurm", "salloc", 0, allocation.record(), "", 0.0,
                                               full_command=shlex.join(allocation.argv)))
        self._launch = dataclasses.replace(self.cluster.launch, allocation=allocation.job)

    def _lease_step(self, launch: LaunchSettings) -> Optional[LeaseStep]:
        """The slurm transports' watchdog, on the nodes of the run's allocation, or of the job the
        harness runs in (SLURM_JOB_ID: the selected nodes SLURM_JOB_NODELIST names, all of them
        where it is not set); none where each srun asks for a job of its own. Without it, a
        harness SIGKILLed inside an operator's salloc left its commands to their own timeouts."""
        job = None if self._allocation is not None else os.environ.get("SLURM_JOB_ID")
        if self._allocation is not None:
            names = self._allocation.nodes
        elif job:
            try:
                held = set(hostlist.expand_hostlist(os.environ.get("SLURM_JOB_NODELIST") or ""))
            except hostlist.BadHostlist:
                held = set()
            held = held or {node.name for node in self.nodes}
            names = [node.name for node in self.nodes if node.name in held]
        else:
            return None
        if not names:
            return None
        nodes = [self.cluster.node(name) for name in names]
        try:
            return LeaseStep(names, launch, root=any(node.sudo for node in nodes), job=job)
        except SlurmError as exc:
            log.warning("no lease step for the slurm transport: %s", exc)
            return None

    def mpi_launcher(self, first: str, *, as_root: bool = False, oversubscribe: bool = False,
                     interfaces: tuple[str, ...] = (), export_env: tuple[str, ...] = (),
                     timeout: Optional[float] = None) -> Launcher:
        """The launcher of an MPI job across nodes started on node `first`: the inventory's
        (runners.launchers.mpi_launcher), inside the run's allocation where there is one."""
        return mpi_launcher(self.launch, ssh=self.cluster.node(first).ssh, as_root=as_root,
                            oversubscribe=oversubscribe, interfaces=interfaces, export_env=export_env,
                            timeout=timeout)

    def transport(self, node: str) -> Transport:
        with self._lock:
            if node not in self._transports:
                spec = self.cluster.node(node)
                launch = self._launch_settings()
                if spec.transport == "slurm":
                    if self._slurm_steps is None:
                        self._slurm_steps = SlurmSteps(launch, self._lease_step(launch), self._allocation_in_use)
                    self._transports[node] = SlurmTransport(spec, self._slurm_steps)
                else:
                    self._transports[node] = make_transport(spec)
                if uses_srun(launch):
                    self._transports[node].launch = launch
            return self._transports[node]

    def gather(self, step: str, run: Callable[[Transport], Result], *,
               deadline_s: Optional[float] = None) -> dict[str, Result]:
        """{node: Result} of `run` on every selected node; computed once per step and session."""
        if step not in self._steps:
            transports = {node.name: self.transport(node.name) for node in self.nodes}
            answering = {name: transport for name, transport in transports.items() if transport.may_answer}
            results = fan_out(answering, run, name=step, deadline_s=deadline_s,
                              on_progress=self._on_progress)
            for name, transport in transports.items():
                loss = transport.loss
                if loss is not None and name not in results:
                    results[name] = loss.result(name, step)
            for node, result in results.items():
                self._raw[(step, node)] = self._save_raw(step, result)
            self._steps[step] = {name: results[name] for name in transports}
            self._taken[step] = time.time()
            self._unreached[step] = frozenset(name for name, result in results.items() if result.not_reached)
        if self._missed is not None:
            self._missed |= self._unreached[step]
        return self._steps[step]

    def watch(self) -> None:
        """Start noting the nodes a cluster-wide check misses (`missed`). Per-node checks are not
        watched: a gather then costs nothing more per node."""
        self._missed = set()

    def missed(self) -> list[str]:
        """The nodes that the steps read since `watch` did not reach, and those lost now: the
        check judged the cluster without their facts, and a resume that runs a check of theirs
        again runs it again too. Ends the watch."""
        missed, self._missed = self._missed or set(), None
        with self._lock:
            lost = {name for name, transport in self._transports.items() if transport.loss is not None}
        return sorted(missed | lost)

    def reconnect(self, node: str) -> None:
        """Try a lost node afresh in the steps to come: for a caller that has seen it answer since
        (a soak's collection, hours after a blip). Steps already gathered keep their results."""
        with self._lock:
            transport = self._transports.get(node)
            if transport is not None and transport.loss is not None:
                transport.close()
                del self._transports[node]
                self._came_back += [(node, loss, back) for loss, back in transport.came_back()]
                self._came_back.append((node, transport.loss, time.time()))

    def dropped(self) -> list[tuple[str, Loss, float]]:
        """(node, loss, when it answered again) for every loss a node came back from, in the order
        they came back: their link or sshd dropped, which the run's record keeps."""
        with self._lock:
            found = self._came_back + [(name, loss, back) for name, transport in self._transports.items()
                                       for loss, back in transport.came_back()]
        return sorted(found, key=lambda each: each[2])

    def beyond_launch(self, nodes: Sequence[str], step: str) -> dict[str, Result]:
        """The results, as their losses', of the nodes among `nodes` that a launch across them
        cannot reach: lost, and no try of them due; under Slurm lost at all, as the allocation
        let them go (a step that names one is refused whole: `Only allocated 11 nodes asked for
        12`). A launch with one of them fails at once, where it would start every other node's
        ranks only to wait for it."""
        under_slurm = uses_srun(self.launch) or self.cluster.transport == "slurm"
        allocation = self._allocation_in_use
        revoked = allocation.revoked() if allocation is not None else None
        if revoked is not None:  # the launch would be a step of it
            return {name: Result(name, step, None, "", "", 0.0, failure="unreachable", detail=revoked)
                    for name in nodes}
        found = {}
        for name in nodes:
            transport = self.transport(name)
            loss = transport.loss
            if loss is not None and (under_slurm or not transport.may_answer):
                found[name] = loss.result(name, step)
        return found

    def lost(self, node: str) -> Optional[Loss]:
        """When and why the node stopped answering, if it did."""
        transport = self._transports.get(node)
        return transport.loss if transport is not None else None

    def taken_before_loss(self, step: str, node: str) -> Optional[str]:
        """A note for checks that judge a step's results taken before their node was lost."""
        loss, taken = self.lost(node), self._taken.get(step)
        if loss is None or taken is None or taken >= loss.at:
            return None
        return f"{step} taken at {clock(taken)}, before {node} was lost at {loss.clock} ({loss.reason})"

    def raw_paths(self, step: str, node: str) -> list[str]:
        return self._raw.get((step, node), [])

    def close(self) -> None:
        slurm = {name: t for name, t in self._transports.items() if isinstance(t, SlurmTransport)}
        if slurm:  # one srun for every node: what escaped Slurm's tracking (lock holders) ends
            fan_out(slurm, lambda transport: slurm[transport.node.name].release(), name="release")
        close_everywhere(self._transports.values())
        try:
            if self._slurm_steps is not None and self._slurm_steps.lease is not None:
                self._slurm_steps.lease.close()
        finally:  # whatever the lease's end did (a second Ctrl-C in it), the allocation goes back
            if self._allocation is not None:  # last: its end would end the release's srun too
                self._allocation.release()
                self._allocation = None
