"""fio on scratch paths: job plans, the guarded node-side run, and the pure JSON parser.

Every run goes through the `fio_scratch` payload, which writes only inside a scratch path the
inventory declares, in a file it creates (handover-fio-<node>-<random>) and removes afterwards.
The harness refuses an undeclared path before contacting the node; the node refuses a raw block
device not marked destructive and a path short of free space, before fio writes a byte.
"""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence

from inventory.model import ScratchPath
from runners import payloads
from runners.parsing import ParseError, json_object
from runners.scratch import declared
from runners.transport import Result, Transport

MiB = 2**20
GiB = 2**30
LAYOUT_RATE = 50 * 10**6  # B/s assumed for writing a job's file, to size the run timeout
TIMEOUT_MARGIN_S = 30
FIO = "fio"


@dataclass(frozen=True)
class Plan:
    """How long and how big each fio job runs: `quick` briefly, `full` long enough to defeat caches."""

    depth: str
    size_bytes: int  # the file each node writes and reads
    runtime_s: int  # per time-based job
    ramp_s: int  # warm-up per time-based job, excluded from the figures

    @property
    def needed_bytes(self) -> int:
        """Free space the job needs: its file plus room for the filesystem's own use."""
        return self.size_bytes + max(self.size_bytes // 20, 64 * MiB)


QUICK = Plan("quick", size_bytes=128 * MiB, runtime_s=1, ramp_s=0)
FULL = Plan("full", size_bytes=16 * GiB, runtime_s=30, ramp_s=5)

DEEP_QUEUE = 32
LATENCY_PERCENTILES = (50.0, 99.0, 99.9)


def _global_options(plan: Plan) -> list[str]:
    # Direct I/O in both depths: the page cache would otherwise answer the reads.
    return [FIO, "--output-format=json", "--ioengine=libaio", "--direct=1",
            f"--size={plan.size_bytes}"]


def _write_file_job(name: str) -> list[str]:
    """Sequential 1 MiB writes over the whole file once: measures, and lays out real data to read."""
    return [f"--name={name}", "--rw=write", "--bs=1M", f"--iodepth={DEEP_QUEUE}"]


def _timed_job(name: str, plan: Plan, rw: str, bs: str, iodepth: int, *extra: str) -> list[str]:
    ramp = [f"--ramp_time={plan.ramp_s}"] if plan.ramp_s else []
    return [f"--name={name}", "--stonewall", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
            "--time_based", f"--runtime={plan.runtime_s}", *ramp, *extra]


def local_argv(plan: Plan) -> list[str]:
    """The node-local job set, one after another on one file (the payload adds --filename)."""
    percentiles = ":".join(f"{p:g}" for p in LATENCY_PERCENTILES)
    return [*_global_options(plan),
            *_write_file_job("seq_write"),
            *_timed_job("seq_read", plan, "read", "1M", DEEP_QUEUE),
            *_timed_job("rand_write", plan, "randwrite", "4k", DEEP_QUEUE),
            *_timed_job("rand_read", plan, "randread", "4k", DEEP_QUEUE),
            *_timed_job("read_latency", plan, "randread", "4k", 1, f"--percentile_list={percentiles}")]


def shared_argv(plan: Plan) -> list[str]:
    """The shared-filesystem job set: each node writes its own file, then reads it back."""
    return [*_global_options(plan),
            *_write_file_job("seq_write"),
            *_timed_job("seq_read", plan, "read", "1M", DEEP_QUEUE)]


def timeout_for(plan: Plan, argv: Sequence[str]) -> float:
    timed_jobs = sum(1 for arg in argv if arg == "--time_based")
    return (timed_jobs * (plan.runtime_s + plan.ramp_s) + plan.size_bytes / LAYOUT_RATE
            + TIMEOUT_MARGIN_S)


def run_on_scratch(transport: Transport, path: str, scratch: Sequence[ScratchPath], plan: Plan,
                   argv: Sequence[str], timeout: Optional[float] = None) -> Result:
    """Run fio `argv` in a file of its own under the declared scratch `path` on one node.

    timeout defaults to what the plan needs with a margin.
    """
    entry = declared(path, scratch)
    spec = {"action": "run", "node": transport.node.name, "path": entry.path,
            "destructive": entry.destructive, "needed_bytes": plan.needed_bytes, "fio": list(argv)}
    return transport.run_script(payloads.load("fio_scratch"), [json.dumps(spec)],
                                timeout=timeout or timeout_for(plan, argv))


def probe_mount(transport: Transport, path: str) -> Result:
    """Whether `path` exists on the node, and the mount point and filesystem type it lies on."""
    spec = {"action": "mount", "path": path}
    return transport.run_script(payloads.load("fio_scratch"), [json.dumps(spec)], timeout=30)


# ---------------------------------------------------------------- parsing


@dataclass(frozen=True)
class FioJob:
    name: str
    error: int  # errno; 0 = the job ran
    read_bw_bytes: int  # B/s
    read_iops: float
    write_bw_bytes: int
    write_iops: float
    read_clat_p99_ns: Optional[int]
    write_clat_p99_ns: Optional[int]
    read_clat_p50_ns: Optional[int]
    read_clat_p999_ns: Optional[int]


@dataclass(frozen=True)
class FioRun:
    version: str
    jobs: list[FioJob]
    ok: bool  # every job's error is 0

    def job(self, name: str) -> FioJob:
        for job in self.jobs:
            if job.name == name:
                return job
        raise KeyError(name)

    def failures(self) -> list[str]:
        return [f"job {job.name} failed with errno {job.error} ({_errno_name(job.error)})"
                for job in self.jobs if job.error]


def _errno_name(number: int) -> str:
    return f"{errno.errorcode.get(number, '?')}: {os.strerror(number)}"


def _document(text: str) -> dict:
    """fio's JSON object, skipping lines fio printed before it (`fio: pid=..., err=...`)."""
    decoder = json.JSONDecoder()
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("{"):
            try:
                data, _ = decoder.raw_decode(text, offset + len(line) - len(line.lstrip()))
            except json.JSONDecodeError as exc:
                raise ParseError(f"fio output has no valid JSON document: {exc}") from None
            if isinstance(data, dict):
                return data
        offset += len(line)
    raise ParseError("no JSON object found (expected fio --output-format=json)")


def _percentile(direction: dict, wanted: float) -> Optional[int]:
    """clat percentile in ns; fio puts them on lat_ns instead when lat_percentiles=1 (superbench)."""
    for key in ("clat_ns", "lat_ns"):
        table = (direction.get(key) or {}).get("percentile")
        if isinstance(table, dict):
            for label, value in table.items():
                try:
                    if abs(float(label) - wanted) < 1e-6:
                        return int(value)
                except (TypeError, ValueError):
                    raise ParseError(f"percentile {label!r}: {value!r} is not a number") from None
    return None


def _direction(job: dict, name: str, key: str) -> dict:
    direction = job.get(key)
    if not isinstance(direction, dict):
        raise ParseError(f"job {name!r} has no {key!r} section")
    for field in ("bw_bytes", "iops"):
        if not isinstance(direction.get(field), (int, float)):
            raise ParseError(f"job {name!r}: {key}.{field} is missing or not a number")
    return direction


def parse_fio(text: str) -> FioRun:
    """fio --output-format=json or json+ (3.x) into jobs with throughput, IOPS and latency."""
    data = _document(text)
    version = data.get("fio version")
    if not isinstance(version, str) or not isinstance(data.get("jobs"), list):
        raise ParseError("JSON lacks fio's 'fio version' and 'jobs' keys")
    if not data["jobs"]:
        raise ParseError("fio output has no jobs")
    jobs = []
    for index, job in enumerate(data["jobs"]):
        if not isinstance(job, dict) or not isinstance(job.get("jobname"), str):
            raise ParseError(f"jobs[{index}] has no jobname")
        name = job["jobname"]
        if not isinstance(job.get("error"), int):
            raise ParseError(f"job {name!r} has no integer 'error'")
        read, write = _direction(job, name, "read"), _direction(job, name, "write")
        jobs.append(FioJob(
            name=name, error=job["error"],
            read_bw_bytes=int(read["bw_bytes"]), read_iops=float(read["iops"]),
            write_bw_bytes=int(write["bw_bytes"]), write_iops=float(write["iops"]),
            read_clat_p99_ns=_percentile(read, 99.0), write_clat_p99_ns=_percentile(write, 99.0),
            read_clat_p50_ns=_percentile(read, 50.0), read_clat_p999_ns=_percentile(read, 99.9)))
    return FioRun(version=version, jobs=jobs, ok=all(job.error == 0 for job in jobs))


PARSERS = {"fio": parse_fio}


@dataclass(frozen=True)
class MountFacts:
    path: str
    exists: bool
    resolved: Optional[str] = None
    mount_point: Optional[str] = None
    fstype: Optional[str] = None
    source: Optional[str] = None


def parse_mount(text: str) -> MountFacts:
    """The `mount` action's JSON: where a path lies and on which filesystem type."""
    data = json_object(text, "mount facts")
    if not isinstance(data, dict) or not isinstance(data.get("exists"), bool) or "path" not in data:
        raise ParseError("mount facts lack 'path' and a boolean 'exists'")
    if data["exists"] and not all(isinstance(data.get(k), str) for k in ("mount_point", "fstype")):
        raise ParseError("mount facts of an existing path lack 'mount_point' and 'fstype'")
    return MountFacts(path=str(data["path"]), exists=data["exists"], resolved=data.get("resolved"),
                      mount_point=data.get("mount_point"), fstype=data.get("fstype"), source=data.get("source"))
