"""A cluster under test for one session: transports per node and per-step results, gathered once.

The first check that needs a step (say, system facts) runs it on every selected node at once;
every per-node test then reads its node's entry. So 32 nodes cost about what one costs.
A node found unreachable (its transport's `loss`) is not tried again: its later steps are
unreachable at once, with the time and reason it was lost.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from inventory.model import Cluster, Node
from runners.fanout import Progress, fan_out
from runners.slurm import SlurmSteps, SlurmTransport
from runners.transport import Loss, Result, Transport, clock, make_transport


class ClusterRun:
    def __init__(self, cluster: Cluster, nodes: list[Node],
                 save_raw: Callable[[str, Result], list[str]],
                 on_progress: Optional[Callable[[Progress], None]] = None):
        self.cluster = cluster
        self.nodes = nodes
        self._save_raw = save_raw
        self._on_progress = on_progress
        self._transports: dict[str, Transport] = {}
        self._steps: dict[str, dict[str, Result]] = {}
        self._raw: dict[tuple[str, str], list[str]] = {}
        self._taken: dict[str, float] = {}  # step -> when its results came in (time.time())
        self._lock = threading.Lock()
        self._slurm_steps: Optional[SlurmSteps] = None  # transport slurm: one batcher per session

    def transport(self, node: str) -> Transport:
        with self._lock:
            if node not in self._transports:
                spec = self.cluster.node(node)
                if spec.transport == "slurm":
                    if self._slurm_steps is None:
                        self._slurm_steps = SlurmSteps(self.cluster.launch)
                    self._transports[node] = SlurmTransport(spec, self._slurm_steps)
                else:
                    self._transports[node] = make_transport(spec)
                if self.cluster.launch.engine == "slurm":
                    self._transports[node].launch = self.cluster.launch
            return self._transports[node]

    def gather(self, step: str, run: Callable[[Transport], Result], *,
               deadline_s: Optional[float] = None) -> dict[str, Result]:
        """{node: Result} of `run` on every selected node; computed once per step and session."""
        if step not in self._steps:
            transports = {node.name: self.transport(node.name) for node in self.nodes}
            answering = {name: transport for name, transport in transports.items() if transport.loss is None}
            results = fan_out(answering, run, name=step, deadline_s=deadline_s,
                              on_progress=self._on_progress)
            for name, transport in transports.items():
                if transport.loss is not None and name not in results:
                    results[name] = transport.loss.result(name, step)
            for node, result in results.items():
                self._raw[(step, node)] = self._save_raw(step, result)
            self._steps[step] = {name: results[name] for name in transports}
            self._taken[step] = time.time()
        return self._steps[step]

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
        for transport in self._transports.values():
            transport.close()
