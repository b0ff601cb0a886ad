"""The fio parser on real outputs (tests/data/fio, see PROVENANCE.md), the job argv, and `handover parse fio`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.model import ScratchPath
from runners import fio
from runners.parsing import ParseError
from runners.scratch import ScratchRefused, declared

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "fio"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_sequential_read_json():
    run = fio.parse_fio(read("local_fio333_seqread_1M.json"))
    assert run.ok and run.version == "fio-3.33"
    [job] = run.jobs
    assert job.name == "seqread_1m" and job.error == 0
    assert job.read_bw_bytes // 1024 == 903625  # PROVENANCE: read.bw 903,625 KiB/s
    assert round(job.read_iops) == 882 and job.write_iops == 0
    assert job.read_clat_p99_ns == 33816576 and job.write_clat_p99_ns is None


def test_sequential_write_json():
    [job] = fio.parse_fio(read("local_fio333_seqwrite_1M.json")).jobs
    assert job.write_bw_bytes // 1024 == 1643471 and job.read_bw_bytes == 0


def test_random_read_json_plus_with_histogram_bins():
    [job] = fio.parse_fio(read("local_fio333_randread_4k_jsonplus.json")).jobs
    assert round(job.read_iops) == 54314
    assert job.read_clat_p50_ns < job.read_clat_p99_ns < job.read_clat_p999_ns


def test_superbench_fio316_percentiles_on_lat_ns():
    """lat_percentiles=1 moves the percentiles from clat_ns to lat_ns; they are still found."""
    run = fio.parse_fio(read("superbench_disk_performance.json"))
    assert run.ok and run.version == "fio-3.16"
    [job] = run.jobs
    assert round(job.read_iops) == 85139 and round(job.write_iops) == 85066
    assert job.read_clat_p99_ns == 2244608 and job.read_clat_p999_ns == 3620864
    assert job.write_clat_p99_ns is not None


def test_enotdir_job_error_is_not_ok_though_the_json_is_valid():
    run = fio.parse_fio(read("local_fio333_error_enotdir.json"))
    assert not run.ok
    assert run.jobs[0].error == 20
    assert run.failures() == ["job err_enotdir failed with errno 20 (ENOTDIR: Not a directory)"]


def test_lines_before_the_json_are_skipped():
    """Derived from real files: fio's real stderr line put before the real ENOTDIR JSON, as fio
    does on stdout for some errors (PROVENANCE.md)."""
    text = read("local_fio333_error_enotdir.stderr.txt") + read("local_fio333_error_enotdir.json")
    assert text.startswith("file:filesetup.c")
    run = fio.parse_fio(text)
    assert not run.ok and run.jobs[0].error == 20


@pytest.mark.parametrize("text, message", [
    ("", "no JSON object"),
    (read("PROVENANCE.md"), "no JSON object"),
    ('{"jobs": []}', "'fio version'"),
    ('{"fio version": "fio-3.33", "jobs": []}', "no jobs"),
    ('{"fio version": "fio-3.33", "jobs": [{"jobname": "a", "error": 0}]}', "no 'read' section"),
    ('{"fio version": "fio-3.33", "jobs": [{"jobname": "a"}]}', "no integer 'error'"),
    ("{ not json", "no valid JSON"),
])
def test_text_that_is_not_fio_output_is_a_parse_error(text, message):
    with pytest.raises(ParseError, match=message):
        fio.parse_fio(text)


def handover_parse(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handover.cli", "parse", "fio", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_handover_parse_fio_prints_the_issue_keys():
    done = handover_parse(DATA / "superbench_disk_performance.json")
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert parsed["ok"] is True
    assert {"name", "error", "read_bw_bytes", "read_iops", "write_bw_bytes", "write_iops",
            "read_clat_p99_ns", "write_clat_p99_ns"} <= parsed["jobs"][0].keys()
    failing = json.loads(handover_parse(DATA / "local_fio333_error_enotdir.json").stdout)
    assert failing["ok"] is False and failing["jobs"][0]["error"] == 20


def test_handover_parse_fio_refuses_other_files_in_one_line():
    done = handover_parse(DATA / "PROVENANCE.md")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "not fio output" in done.stderr


def test_local_job_set_argv():
    argv = fio.local_argv(fio.QUICK)
    assert argv[0] == "fio" and "--output-format=json" in argv and "--direct=1" in argv
    names = [a.removeprefix("--name=") for a in argv if a.startswith("--name=")]
    assert names == ["seq_write", "seq_read", "rand_write", "rand_read", "read_latency"]
    assert argv.count("--stonewall") == 4 and argv.count("--runtime=1") == 4
    assert "--percentile_list=50:99:99.9" in argv and "--iodepth=1" in argv
    assert f"--size={128 * 2**20}" in argv
    assert not any(a.startswith("--filename") for a in argv)  # the payload adds its own file
    full = fio.local_argv(fio.FULL)
    assert "--runtime=30" in full and "--ramp_time=5" in full


def test_timeout_covers_the_plan():
    assert fio.timeout_for(fio.QUICK, fio.local_argv(fio.QUICK)) > 4 * 1
    assert fio.timeout_for(fio.FULL, fio.local_argv(fio.FULL)) > 4 * 35 + 16 * 2**30 / 50e6


def test_only_declared_scratch_paths_are_accepted():
    scratch = (ScratchPath("/scratch/a"), ScratchPath("/dev/nvme1n1", destructive=True))
    assert declared("/dev/nvme1n1", scratch).destructive
    with pytest.raises(ScratchRefused, match="/scratch/a/sub is not a scratch path"):
        declared("/scratch/a/sub", scratch)
    with pytest.raises(ScratchRefused, match=r"declared: none"):
        declared("/tmp", ())


def test_mount_facts():
    facts = fio.parse_mount('{"path": "/s", "exists": true, "resolved": "/s", "mount_point": "/",'
                            ' "fstype": "ext4", "source": "/dev/vda"}')
    assert facts.fstype == "ext4" and facts.mount_point == "/"
    assert not fio.parse_mount('{"path": "/s", "exists": false}').exists
    with pytest.raises(ParseError):
        fio.parse_mount('{"path": "/s", "exists": true}')
