"""Run one step on many nodes at once and get a per-node map back.

A dead, slow or refusing node is an entry in the map, never an exception that hides the other
nodes. Each node has a thread of its own: a node's step mostly waits on its node (a 60 s
stress-ng, an srun), so 1,024 nodes cost about what one costs, where a pool of 64 would run them
in 16 waves (and the slurm transport's batches in 16 sruns one after the other). What costs the
harness's own CPU at once, the SSH handshakes of a cold fan-out, is bounded where it happens
(runners.ssh.CONNECTS_AT_ONCE). The whole fan-out has a deadline, and Ctrl-C kills what is still
running on every node before it propagates.
"""
from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional

from runners.transport import Result, Transport

log = logging.getLogger("handover.fanout")


RUNNING_SHOWN = 4  # running nodes a progress line names, the first by name


@dataclass
class Progress:
    """What a fan-out has done so far, for a progress display.

    Nodes start and finish through start() and finish(), which keep the failure count and a heap
    of the running names: a line is drawn after every node's event, and counting the results or
    sorting the running nodes for each would cost nodes squared per fan-out.
    """

    step: str
    total: int
    done: dict[str, str] = field(default_factory=dict)  # node -> status word
    running: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._failed = sum(1 for status in self.done.values() if status != "ok")
        self._names_started = sorted(self.running)  # a min-heap: finished names leave it as lines pop them

    @property
    def failed(self) -> int:
        return self._failed

    def start(self, node: str) -> None:
        self.running.add(node)
        heapq.heappush(self._names_started, node)

    def finish(self, node: str, status: str) -> None:
        self.running.discard(node)
        self._failed += (status != "ok") - (self.done.get(node, "ok") != "ok")
        self.done[node] = status

    def _first_running(self) -> list[str]:
        """The RUNNING_SHOWN first running names, in order: popped off the heap and pushed back,
        finished ones dropped on the way for good, so each finished name is popped once in all."""
        first: list[str] = []
        while self._names_started and len(first) < RUNNING_SHOWN:
            name = heapq.heappop(self._names_started)
            if name in self.running and name not in first:  # a node started again is in twice
                first.append(name)
        for name in first:
            heapq.heappush(self._names_started, name)
        return first

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        running = ", ".join(self._first_running()) + (" ..." if len(self.running) > RUNNING_SHOWN else "")
        text = (f"{self.step}: {len(self.done)}/{self.total} nodes done, {self.failed} failed, "
                f"{elapsed:.0f} s")
        return f"{text}; running: {running}" if self.running else text


def fan_out(transports: Mapping[str, Transport], step: Callable[[Transport], Result], *,
            name: str = "step", workers: Optional[int] = None, deadline_s: Optional[float] = None,
            on_progress: Optional[Callable[[Progress], None]] = None) -> dict[str, Result]:
    """Call step(transport) for every node concurrently; return {node name: Result} in input order.

    A step that raises becomes a Result with failure 'error'; a node still running at the
    deadline becomes a timed-out Result and its remote work is killed. `workers` (default: one
    per node) caps the threads, for a bench that times the nodes one after the other. Workers are
    daemon threads, so a node stuck in connect cannot hold the harness after Ctrl-C.
    """
    progress = Progress(step=name, total=len(transports))
    results: dict[str, Result] = {}
    started = time.monotonic()
    waiting: queue.SimpleQueue = queue.SimpleQueue()
    finished: queue.SimpleQueue = queue.SimpleQueue()  # (node, None) on start, (node, Result) at the end
    stop = threading.Event()
    for item in transports.items():
        waiting.put(item)

    def work() -> None:
        while not stop.is_set():
            try:
                node, transport = waiting.get_nowait()
            except queue.Empty:
                return
            finished.put((node, None))  # started; the main thread alone keeps the progress
            finished.put((node, _guarded(step, node, transport)))

    for index in range(max(1, min(workers or len(transports), len(transports)))):
        threading.Thread(target=work, name=f"fanout-{name}-{index}", daemon=True).start()
    try:
        while len(results) < len(transports):
            remaining = None if deadline_s is None else deadline_s - (time.monotonic() - started)
            if remaining is not None and remaining <= 0:
                break
            try:
                node, result = finished.get(timeout=_tick(remaining))
            except queue.Empty:
                pass
            else:
                if result is None:
                    progress.start(node)
                    continue
                results[node] = result
                progress.finish(node, result.status)
            if on_progress:
                on_progress(progress)
    except BaseException:
        stop.set()
        kill_everywhere(transports.values())
        raise
    stop.set()
    kill_everywhere(transports[node] for node in transports if node not in results)
    for node in transports:
        if node not in results:  # past the deadline, running or never started
            results[node] = Result(node, name, None, "", "", time.monotonic() - started,
                                   timed_out=True, detail=f"fan-out deadline of {deadline_s} s")
    return {node: results[node] for node in transports}


def kill_everywhere(transports: Iterable[Transport]) -> None:
    """kill_running() on every node at once (Ctrl-C, a deadline, a failed launch)."""
    at_once(transports, Transport.kill_running, name="kill")


def close_everywhere(transports: Iterable[Transport]) -> None:
    """close() every node's transport at once (the end of a run), each once its node's watchdog
    has finished its cleanup: at most about LEASE_END_S, however many links died unnoticed."""
    at_once(transports, Transport.close, name="close")


def at_once(transports: Iterable[Transport], action: Callable[[Transport], None], *, name: str) -> None:
    """action(transport) on every node at once, for what returns nothing (kills, closes), on a
    thread per node: each mostly waits on its node (a TERM's grace, a watchdog's exit, a dead
    link's timeout), so the waits overlap and the whole costs about the slowest node's.
    Bounded by the action's own timeouts; one that raises is logged and the others go on."""
    def work(transport: Transport) -> None:
        try:
            action(transport)
        except Exception:
            log.exception("%s: %s failed", transport.node.name, name)

    threads = [threading.Thread(target=work, args=(transport,), name=f"{name}-{transport.node.name}",
                                daemon=True) for transport in transports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _tick(remaining: Optional[float]) -> float:
    """Wake at least once a second so progress and Ctrl-C stay responsive."""
    return 1.0 if remaining is None else max(0.0, min(1.0, remaining))


def _guarded(step: Callable[[Transport], Result], node: str, transport: Transport) -> Result:
    started = time.monotonic()
    try:
        return step(transport)
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return Result(node, getattr(step, "__name__", "step"), None, "", "",
                      time.monotonic() - started, failure="error",
                      detail=f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})")
