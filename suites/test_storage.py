"""Storage: fio on every scratch path the inventory declares, node-local and shared.

Local scratch (kind: local): sequential 1 MiB read and write at a deep queue (GB/s), random 4 KiB
read and write (IOPS), and read latency percentiles at queue depth 1 (us), per node; then the
nodes against each other. Shared scratch (kind: shared): the mount and its filesystem type on
every node, then every node at once against its own file, as an aggregate and against the median.
fio writes only in files of its own under those paths, and removes them (runners/fio.py).
"""
from __future__ import annotations

import statistics
from typing import Callable, Optional

import pytest

from handover.failures import ExpectationFailure, PerformanceFailure, SanityFailure, excerpt
from handover.plugin import acceptance_session
from runners import fio, system
from runners.parsing import ParseError
from runners.transport import Result
from suites.checks import parsed, require, require_scratch_run

pytestmark = [pytest.mark.storage]

# A node under this fraction of the cluster median is named as a failure, not only a note.
FAR_BELOW_MEDIAN = 0.5
GB = 1e9
NO_SCRATCH = "no scratch path declared"
SYSTEM_STEP = "system_facts"  # test_system's probe, shared: an unreachable node fails, not skips

DEPTHS = [pytest.param(fio.QUICK, marks=pytest.mark.quick, id="quick"),
          pytest.param(fio.FULL, marks=pytest.mark.full, id="full")]


def slug(path: str) -> str:
    """A scratch path as a test id and raw/ directory name: /scratch/nvme0 -> scratch_nvme0."""
    return path.strip("/").replace("/", "_")


def no_scratch_reason(scratch, kind: str) -> str:
    return NO_SCRATCH if not scratch else f"no {kind} scratch path declared"


def _scratch_params(scratch, kind: str, per_node: bool) -> list:
    """One parameter per declared path of this kind; without any, one that skips.

    Per-node checks skip in the body, once the node has answered (skip_unless_declared), so an
    unreachable node still fails every check rather than skipping some.
    """
    paths = [entry.path for entry in scratch if entry.kind == kind]
    if paths:
        return [pytest.param(path, id=slug(path)) for path in paths]
    marks = () if per_node else pytest.mark.skip(reason=no_scratch_reason(scratch, kind))
    return [pytest.param(None, id=f"no-{kind}-scratch", marks=marks)]


def skip_unless_declared(path: Optional[str], on_node, cluster, kind: str) -> None:
    if path is None:
        require(on_node(SYSTEM_STEP, system.probe))
        pytest.skip(no_scratch_reason(cluster.scratch, kind))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    acceptance = acceptance_session(metafunc.config)
    scratch = acceptance.cluster.scratch
    per_node = "node" in metafunc.fixturenames
    if "local_path" in metafunc.fixturenames:
        metafunc.parametrize("local_path", _scratch_params(scratch, "local", per_node))
    if "shared_path" in metafunc.fixturenames:
        metafunc.parametrize("shared_path", _scratch_params(scratch, "shared", per_node))
    if "plan" in metafunc.fixturenames:
        metafunc.parametrize("plan", DEPTHS)


# ---------------------------------------------------------------- steps and sanity


def local_step(cluster, path: str, plan: fio.Plan) -> tuple[str, Callable]:
    argv = fio.local_argv(plan)
    return (f"fio_local_{plan.depth}_{slug(path)}",
            lambda transport: fio.run_on_scratch(transport, path, cluster.scratch, plan, argv))


def shared_step(cluster, path: str, plan: fio.Plan) -> tuple[str, Callable]:
    argv = fio.shared_argv(plan)
    return (f"fio_shared_{plan.depth}_{slug(path)}",
            lambda transport: fio.run_on_scratch(transport, path, cluster.scratch, plan, argv))


def sane(result: Result) -> fio.FioRun:
    """fio's figures, once the run is known good: refusals, missing fio, job errno, exit code."""
    require_scratch_run(result, "refused to write",
                        ", but the inventory declares scratch paths to test")
    try:
        run = fio.parse_fio(result.stdout)
    except ParseError as exc:
        require(result)
        raise SanityFailure(f"{result.node}: {exc}", excerpt(result.stdout)) from None
    if not run.ok:
        raise SanityFailure(f"{result.node}: fio {'; '.join(run.failures())}",
                            excerpt(result.stderr or result.stdout))
    require(result)
    return run


def job(run: fio.FioRun, name: str, node: str) -> fio.FioJob:
    try:
        return run.job(name)
    except KeyError:
        raise SanityFailure(f"{node}: fio output has no job {name!r}") from None


def local_run(on_node, cluster, path: Optional[str], plan: fio.Plan) -> fio.FioRun:
    skip_unless_declared(path, on_node, cluster, "local")
    return sane(on_node(*local_step(cluster, path, plan)))


def microseconds(ns: Optional[int]) -> Optional[float]:
    return None if ns is None else round(ns / 1000, 1)


# ---------------------------------------------------------------- node-local scratch


def test_scratch_throughput(on_node, cluster, node, local_path, plan, metrics, record):
    run = local_run(on_node, cluster, local_path, plan)
    read = job(run, "seq_read", node).read_bw_bytes / GB
    write = job(run, "seq_write", node).write_bw_bytes / GB
    record.note(f"{local_path}: sequential 1 MiB read {read:.2f} GB/s, write {write:.2f} GB/s "
                f"({plan.depth})")
    metrics.judge(scratch_seq_read=(round(read, 3), "GB/s"), scratch_seq_write=(round(write, 3), "GB/s"))


def test_scratch_iops(on_node, cluster, node, local_path, plan, metrics, record):
    run = local_run(on_node, cluster, local_path, plan)
    read = job(run, "rand_read", node).read_iops
    write = job(run, "rand_write", node).write_iops
    record.note(f"{local_path}: random 4 KiB read {read:,.0f} IOPS, write {write:,.0f} IOPS "
                f"({plan.depth})")
    metrics.judge(scratch_rand_read=(round(read), "IOPS"), scratch_rand_write=(round(write), "IOPS"))


def test_scratch_latency(on_node, cluster, node, local_path, plan, metrics, record):
    latency = job(local_run(on_node, cluster, local_path, plan), "read_latency", node)
    p50, p99, p999 = (microseconds(latency.read_clat_p50_ns), microseconds(latency.read_clat_p99_ns),
                      microseconds(latency.read_clat_p999_ns))
    record.note(f"{local_path}: 4 KiB read latency at QD1 p50 {p50} us, p99 {p99} us, "
                f"p99.9 {p999} us ({plan.depth})")
    metrics.judge(scratch_read_lat_p50=(p50, "us"), scratch_read_lat_p99=(p99, "us"),
                  scratch_read_lat_p999=(p999, "us"))


LOCAL_FIGURES = {
    "sequential read": (lambda run: run.job("seq_read").read_bw_bytes / GB, "GB/s"),
    "sequential write": (lambda run: run.job("seq_write").write_bw_bytes / GB, "GB/s"),
    "random read": (lambda run: run.job("rand_read").read_iops, "IOPS"),
    "random write": (lambda run: run.job("rand_write").write_iops, "IOPS"),
}


def sane_runs(results: dict[str, Result]) -> tuple[dict[str, fio.FioRun], dict[str, str]]:
    """Runs that passed sanity, and why the others did not, per node."""
    runs, problems = {}, {}
    for node, result in results.items():
        try:
            runs[node] = sane(result)
        except AssertionError as failure:
            problems[node] = str(failure)
    return runs, problems


def spread(label: str, values: dict[str, float], unit: str) -> tuple[str, Optional[str]]:
    """(note on the slowest node against the median, failure naming nodes far below it or None)."""
    median = statistics.median(values.values())
    slowest = min(values, key=values.get)
    ratio = values[slowest] / median if median else 1.0
    note = f"{label}: slowest {slowest} {values[slowest]:,.3g} {unit} ({ratio:.2f} x median {median:,.3g})"
    far = sorted(node for node, value in values.items() if median and value < FAR_BELOW_MEDIAN * median)
    if not far:
        return note, None
    listed = ", ".join(f"{node} {values[node]:,.3g}" for node in far)
    return note, (f"{label}: {listed} {unit}, below {FAR_BELOW_MEDIAN:g} x the cluster median "
                  f"{median:,.3g} {unit}")


@pytest.mark.cluster
def test_scratch_spread(cluster_run, cluster, local_path, plan, record):
    """The nodes against each other on the same scratch path: slowest named, stragglers fail."""
    runs, problems = sane_runs(cluster_run.gather(*local_step(cluster, local_path, plan)))
    if len(runs) < 2:
        pytest.skip(f"{len(runs)} node(s) measured on {local_path}: nothing to compare")
    notes, failures = [], []
    for label, (figure, unit) in LOCAL_FIGURES.items():
        note, failure = spread(label, {node: figure(run) for node, run in runs.items()}, unit)
        notes.append(note)
        if failure:
            failures.append(failure)
    silent = f"; no figures from {', '.join(sorted(problems))}" if problems else ""
    record.note(f"{local_path} ({plan.depth}), {len(runs)} node(s): " + "; ".join(notes) + silent)
    if failures:
        raise PerformanceFailure("; ".join(failures))


# ---------------------------------------------------------------- shared scratch


@pytest.mark.quick
def test_shared_mount(on_node, cluster, node, shared_path, profile, record):
    """The shared path exists on every node, on a filesystem of a type the profile expects."""
    skip_unless_declared(shared_path, on_node, cluster, "shared")
    facts = parsed(fio.parse_mount,
                   on_node(f"mount_{slug(shared_path)}", lambda t: fio.probe_mount(t, shared_path)))
    if not facts.exists:
        raise ExpectationFailure(f"{node}: shared scratch path {shared_path} does not exist "
                                 "or is not a directory")
    record.note(f"{shared_path} on {facts.mount_point} ({facts.fstype} from {facts.source})")
    allowed = profile.expect.shared_fstypes
    if allowed and facts.fstype not in allowed:
        raise ExpectationFailure(f"{node}: {shared_path} is on {facts.fstype} ({facts.mount_point}), "
                                 f"not one of the types profile {profile.name} expects: "
                                 f"{', '.join(allowed)}")


@pytest.mark.cluster
def test_shared_throughput(cluster_run, cluster, shared_path, plan, metrics, record):
    """Every node at once against its own file: the aggregate, and each node against the median."""
    runs, problems = sane_runs(cluster_run.gather(*shared_step(cluster, shared_path, plan)))
    if problems:
        raise SanityFailure("; ".join(problems[node] for node in sorted(problems)))
    write = {node: run.job("seq_write").write_bw_bytes / GB for node, run in runs.items()}
    read = {node: run.job("seq_read").read_bw_bytes / GB for node, run in runs.items()}
    total_write, total_read = sum(write.values()), sum(read.values())
    notes, failures = [], []
    for label, values in (("write", write), ("read", read)):
        note, failure = spread(label, values, "GB/s")
        notes.append(note)
        if failure:
            failures.append(failure)
    record.note(f"{shared_path} ({plan.depth}), {len(runs)} node(s) at once: aggregate write "
                f"{total_write:.2f} GB/s, read {total_read:.2f} GB/s; " + "; ".join(notes))
    try:
        metrics.judge(shared_seq_write=(round(total_write, 3), "GB/s"),
                      shared_seq_read=(round(total_read, 3), "GB/s"))
    except PerformanceFailure as miss:
        failures.insert(0, str(miss))
    if failures:
        raise PerformanceFailure("; ".join(failures))
