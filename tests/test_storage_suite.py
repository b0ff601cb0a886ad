"""The storage suite with real fio: guarded runs on this machine, then end to end on namespace nodes.

Every refusal shows that nothing was written: fio never ran (no output) and the scratch directory
holds nothing the harness created. Nodes share this filesystem, so each writes its own file.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_e2e import run_suites

from inventory.model import Node, ScratchPath
from runners import fio
from runners.scratch import REFUSED_EXIT, ScratchRefused, refusal
from runners.transport import LocalTransport

ROOT = Path(__file__).resolve().parent.parent
SMALL = fio.Plan("quick", size_bytes=32 * fio.MiB, runtime_s=1, ramp_s=0)


@pytest.fixture
def local():
    return LocalTransport(Node(name="localhost", address="localhost", transport="local"))


@pytest.fixture
def scratch_dir(tmp_path):
    path = tmp_path / "scratch"
    path.mkdir()
    return path


def ours(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("handover-fio-*"))


def run(local, path, scratch, plan=SMALL, argv=None, timeout=None):
    return fio.run_on_scratch(local, str(path), scratch, plan, argv or fio.shared_argv(plan),
                              timeout=timeout)


def fio_default_files() -> set[Path]:
    """Files fio names after a job (seq_read.0.0) when a job has no file: in the working directory."""
    return set(Path.cwd().glob("*.0.0"))


def test_fio_runs_in_a_file_of_its_own_and_removes_it(local, scratch_dir):
    before = fio_default_files()
    result = run(local, scratch_dir, (ScratchPath(str(scratch_dir)),), argv=fio.local_argv(SMALL))
    assert result.ok, result.stderr
    parsed = fio.parse_fio(result.stdout)
    assert parsed.ok and [j.name for j in parsed.jobs] == [
        "seq_write", "seq_read", "rand_write", "rand_read", "read_latency"]
    assert parsed.job("seq_write").write_bw_bytes > 0 and parsed.job("rand_read").read_iops > 0
    assert parsed.job("read_latency").read_clat_p999_ns > 0
    document = json.loads(result.stdout)  # every job writes the harness's file, none its own
    assert document["global options"]["filename"].startswith(f"{scratch_dir}/handover-fio-localhost-")
    assert not any("filename" in job["job options"] for job in document["jobs"])
    assert fio_default_files() == before
    removed = [line for line in result.stderr.splitlines() if line.startswith("handover-fio: removed")]
    assert len(removed) == 1 and f"{scratch_dir}/handover-fio-localhost-" in removed[0]
    assert list(scratch_dir.iterdir()) == []


def test_an_undeclared_path_is_refused_before_the_node_is_asked(local, scratch_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ScratchRefused, match=f"{other} is not a scratch path"):
        run(local, other, (ScratchPath(str(scratch_dir)),))
    with pytest.raises(ScratchRefused):  # a subdirectory of a scratch path is not one either
        run(local, scratch_dir / "sub", (ScratchPath(str(scratch_dir)),))
    assert list(other.iterdir()) == [] and list(scratch_dir.iterdir()) == []


@pytest.fixture
def block_device(tmp_path):
    """A block special file for /dev/loop0's numbers: unbacked here, so it holds 0 bytes."""
    path = tmp_path / "blockdev"
    try:
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    except OSError as error:
        pytest.skip(f"cannot create a block device node: {error.strerror}")
    return path


def test_a_raw_block_device_is_refused_unless_destructive(local, block_device, tmp_path):
    result = run(local, block_device, (ScratchPath(str(block_device)),))
    assert result.exit_code == REFUSED_EXIT and result.stdout == ""
    assert "raw block device" in refusal(result) and "destructive: true" in refusal(result)
    # destructive: true passes that guard; the size check still stops fio on a 0-byte device.
    result = run(local, block_device, (ScratchPath(str(block_device), destructive=True),))
    assert result.stdout == "" and "holds 0 MiB, the job needs 96 MiB" in refusal(result)
    assert ours(tmp_path) == []


def test_short_free_space_is_refused(local, scratch_dir):
    huge = fio.Plan("quick", size_bytes=2**50, runtime_s=1, ramp_s=0)
    result = run(local, scratch_dir, (ScratchPath(str(scratch_dir)),), plan=huge, timeout=30)
    assert result.exit_code == REFUSED_EXIT and result.stdout == ""
    assert "MiB free, the job needs" in refusal(result)
    assert list(scratch_dir.iterdir()) == []


def test_a_missing_path_or_a_plain_file_is_refused(local, tmp_path):
    missing = tmp_path / "absent"
    result = run(local, missing, (ScratchPath(str(missing)),))
    assert "does not exist on this node" in refusal(result) and not missing.exists()
    plain = tmp_path / "file"
    plain.write_text("keep")
    result = run(local, plain, (ScratchPath(str(plain)),))
    assert "neither a directory nor a block device" in refusal(result)
    assert plain.read_text() == "keep" and ours(tmp_path) == []


def test_a_job_naming_its_own_files_is_refused(local, scratch_dir, tmp_path):
    argv = [*fio.shared_argv(SMALL), f"--directory={tmp_path}"]
    result = run(local, scratch_dir, (ScratchPath(str(scratch_dir)),), argv=argv)
    assert result.stdout == "" and "names its own files" in refusal(result)
    assert ours(tmp_path) == [] and list(scratch_dir.iterdir()) == []


def test_the_file_is_removed_after_fio_fails(local, scratch_dir):
    argv = [*fio.shared_argv(SMALL), "--rw=sideways"]
    result = run(local, scratch_dir, (ScratchPath(str(scratch_dir)),), argv=argv)
    assert result.exit_code not in (0, REFUSED_EXIT)
    assert "handover-fio: removed" in result.stderr
    assert list(scratch_dir.iterdir()) == []


def test_the_file_is_removed_when_the_run_timeout_kills_fio(local, scratch_dir):
    long = fio.Plan("quick", size_bytes=32 * fio.MiB, runtime_s=120, ramp_s=0)
    result = run(local, scratch_dir, (ScratchPath(str(scratch_dir)),), plan=long, timeout=3)
    assert result.timed_out
    assert "handover-fio: removed" in result.stderr
    assert list(scratch_dir.iterdir()) == []


def test_leftovers_of_this_node_are_swept_and_nothing_else(local, scratch_dir):
    """A SIGKILLed run leaves its file; the next run removes it by the node's prefix only: not
    another node's, not one of a node whose name begins with this one's (localhost-a on a shared
    path), not a live run's."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    left = f"handover-fio-localhost-{ended.pid}-0badc0ffee00"
    running = f"handover-fio-localhost-{os.getpid()}-0badc0ffee00"  # a run still going: this test
    kept = [f"handover-fio-node9-{ended.pid}-0badc0ffee00", f"handover-fio-localhost-a-{ended.pid}-0badc0ffee00",
            "notes.txt", running]
    for name in (left, *kept):
        (scratch_dir / name).write_text("x")
    result = run(local, scratch_dir, (ScratchPath(str(scratch_dir)),))
    assert result.ok, result.stderr
    assert f"{left}, left by an interrupted earlier run" in result.stderr
    assert sorted(p.name for p in scratch_dir.iterdir()) == sorted(kept)


# ---------------------------------------------------------------- end to end on namespace nodes


def checks_of(out: Path) -> list[dict]:
    return json.loads((out / "nscluster" / "latest" / "results.json").read_text())["checks"]


def scratch_inventory(ns_cluster, tmp_path, **kwargs):
    local_dir, shared_dir = tmp_path / "nvme", tmp_path / "shared"
    local_dir.mkdir()
    shared_dir.mkdir()
    scratch = [{"path": str(local_dir), "kind": "local"}, {"path": str(shared_dir), "kind": "shared"}]
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", extra={"scratch": scratch}, **kwargs)
    return inventory, local_dir, shared_dir


def names_the_slowest(check: dict, note: str) -> bool:
    """Passed: the note names the slowest node. The nodes share one disk, so one may lag far
    behind the median; then the check fails as a performance miss naming it."""
    if check["outcome"] == "passed":
        return note in check["message"] and "slowest node" in check["message"]
    return check["kind"] == "performance" and "x the cluster median" in check["message"]


def test_quick_storage_on_four_nodes(ns_cluster, sign_key, tmp_path):
    inventory, local_dir, shared_dir = scratch_inventory(ns_cluster, tmp_path)
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "storage and quick")
    checks = checks_of(tmp_path / "out")
    by_check = {}
    for check in checks:
        by_check.setdefault(check["check"], []).append(check)
    for name, units in (("scratch_throughput", {"GB/s"}), ("scratch_iops", {"IOPS"}),
                        ("scratch_latency", {"us"})):
        assert sorted(c["node"] for c in by_check[name]) == ["node1", "node2", "node3", "node4"]
        assert all(c["outcome"] == "passed" for c in by_check[name]), done.stdout
        assert {m["unit"] for c in by_check[name] for m in c["metrics"]} == units
        assert all(m["value"] > 0 for c in by_check[name] for m in c["metrics"])
    assert [c["outcome"] for c in by_check["shared_mount"]] == ["passed"] * 4
    assert all("ext4" in c["message"] or " on " in c["message"] for c in by_check["shared_mount"])
    [shared] = by_check["shared_throughput"]
    assert {m["name"] for m in shared["metrics"]} == {"shared_seq_write", "shared_seq_read"}
    assert names_the_slowest(shared, "4 node(s) at once: aggregate write")
    [spread] = by_check["scratch_spread"]
    assert names_the_slowest(spread, "4 node(s): sequential read: slowest node")
    assert list(local_dir.iterdir()) == [] and list(shared_dir.iterdir()) == []
    step = f"fio_local_quick_{str(local_dir).strip('/').replace('/', '_')}"
    raw = tmp_path / "out" / "nscluster" / "latest" / "raw" / step
    parsed = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "fio", str(raw / "node3.stdout")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert parsed.returncode == 0 and json.loads(parsed.stdout)["ok"] is True


def test_unexpected_filesystem_type_and_a_missed_band_fail_by_name(ns_cluster, sign_key, tmp_path):
    profile = tmp_path / "storage-sku.yaml"
    profile.write_text(yaml.safe_dump({
        "profile": "storage-sku", "description": "a SKU whose shared scratch must be Lustre",
        "mandatory": [], "expect": {"shared_fstypes": ["lustre"]},
        "references": {"scratch_seq_read": {
            "check": "scratch_throughput", "value": 1000, "lower": -0.1, "upper": None,
            "unit": "GB/s", "source": "test: a band no disk here reaches"}}}))
    inventory, local_dir, shared_dir = scratch_inventory(ns_cluster, tmp_path, profile=str(profile),
                                                         nodes=["node1", "node2"])
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "storage and quick",
                      "-k", "shared_mount or scratch_throughput")
    assert done.returncode == 1, done.stdout
    checks = checks_of(tmp_path / "out")
    mounts = [c for c in checks if c["check"] == "shared_mount"]
    assert [(c["outcome"], c["kind"]) for c in mounts] == [("failed", "expectation")] * 2
    assert all("not one of the types profile storage-sku expects: lustre" in c["message"] for c in mounts)
    throughput = [c for c in checks if c["check"] == "scratch_throughput"]
    assert [(c["outcome"], c["kind"]) for c in throughput] == [("failed", "performance")] * 2
    assert all("scratch_seq_read = " in c["message"] and ">= 900 GB/s" in c["message"] for c in throughput)
    assert list(local_dir.iterdir()) == [] and list(shared_dir.iterdir()) == []


def test_a_refused_scratch_path_fails_the_checks_and_writes_nothing(ns_cluster, sign_key, tmp_path):
    """A scratch path that is a plain file on the nodes: every node refuses, by name."""
    plain = tmp_path / "not-a-dir"
    plain.write_text("keep")
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", nodes=["node1", "node2"],
                                           extra={"scratch": [{"path": str(plain), "kind": "local"}]})
    done = run_suites(inventory, tmp_path / "out", sign_key, "-m", "storage and quick",
                      "-k", "scratch_throughput")
    assert done.returncode == 1, done.stdout
    checks = checks_of(tmp_path / "out")
    assert [(c["node"], c["kind"]) for c in checks] == [("node1", "expectation"), ("node2", "expectation")]
    assert all("refused to write" in c["message"] and "neither a directory" in c["message"] for c in checks)
    assert plain.read_text() == "keep" and ours(tmp_path) == []
