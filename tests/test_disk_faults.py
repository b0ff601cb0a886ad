"""A full or failing disk under --out, for real: a 256 KiB tmpfs filled up before or during a run.

Whatever the disk does, no run file is left torn or empty, the error is one line naming the file
and the errno, the run stops cleanly, and the ledger renders later once there is room.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reports.files import WriteError, write_atomically
from reports.ledger import LEDGER_FILE, Ledger, read_ledger

ROOT = Path(__file__).resolve().parent.parent
LOCAL_INVENTORY = ROOT / "inventory" / "local.yaml"


@pytest.fixture
def inventory(tmp_path) -> Path:
    copy = tmp_path / "local.yaml"
    copy.write_text(LOCAL_INVENTORY.read_text())
    return copy


def acceptance(inventory: Path, key: Path, *args: str) -> subprocess.CompletedProcess:
    """The system suite on this machine (a second or two), as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(inventory),
                           "--sign-key", str(key), "-p", "no:cacheprovider", "-m", "system", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def handover(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handover.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def ledger_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]


def only_run_dir(out: Path) -> Path:
    runs = [p for p in (out / "local").iterdir() if p.name != "latest"]
    assert len(runs) == 1, runs
    return runs[0]


def test_a_disk_that_fills_mid_run_stops_it_in_one_line_and_the_ledger_renders_later(
        tiny_disk, inventory, sign_key):
    out = tiny_disk.path / "out"
    tiny_disk.fill(leave_kib=16)  # room for the header and a check or two, not for the run
    done = acceptance(inventory, sign_key, "--out", str(out))
    output = done.stdout + done.stderr
    assert done.returncode == 2, output  # pytest's "interrupted"
    errors = [line for line in output.splitlines() if line.startswith("handover: cannot write ")]
    assert len(errors) == 1 and errors[0].endswith(": [Errno 28] No space left on device"), output
    assert "INTERNALERROR" not in output and "Traceback" not in output
    assert len(output.splitlines()) < 30, output
    run_dir = only_run_dir(out)
    assert str(run_dir) in errors[0]
    assert (out / "local" / "latest").resolve() == run_dir
    in_ledger = {e["test_id"] for e in ledger_lines(run_dir) if e["type"] == "check"}
    assert not list(run_dir.rglob(".*")), "no temporary file is left behind"

    tiny_disk.free()
    rendered = handover("report", run_dir, "--sign-key", sign_key)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert {c["test_id"] for c in results["checks"]} == in_ledger
    assert results["run"]["interrupted"] is True
    assert handover("verify", run_dir).returncode == 3  # every file as signed (no trust list given)

    resumed = acceptance(inventory, sign_key, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "verdict: CERTIFIED" in resumed.stdout


def test_report_on_a_full_disk_keeps_the_previous_results(tiny_disk, inventory, sign_key):
    out = tiny_disk.path / "out"
    first = acceptance(inventory, sign_key, "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = only_run_dir(out)
    before = {name: (run_dir / name).read_bytes() for name in ("results.json", "results.json.sig")}
    tiny_disk.fill()
    again = handover("report", run_dir, "--sign-key", sign_key)
    assert again.returncode != 0
    assert again.stderr.splitlines() == [
        f"handover: cannot write {run_dir / 'results.json'}: [Errno 28] No space left on device"]
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert not list(run_dir.glob(".*")), "no temporary file is left behind"


def test_report_on_a_read_only_disk_is_one_line_with_the_errno(tiny_disk, inventory, sign_key):
    out = tiny_disk.path / "out"
    assert acceptance(inventory, sign_key, "--out", str(out)).returncode == 0
    run_dir = only_run_dir(out)
    before = (run_dir / "report.html").read_bytes()
    tiny_disk.remount("ro")
    try:
        again = handover("report", run_dir, "--sign-key", sign_key)
    finally:
        tiny_disk.remount("rw")
    assert again.returncode != 0
    assert again.stderr.strip().endswith("[Errno 30] Read-only file system"), again.stderr
    assert len(again.stderr.splitlines()) == 1
    assert (run_dir / "report.html").read_bytes() == before


def test_a_read_only_out_is_refused_before_anything_runs(tiny_disk, inventory, sign_key):
    tiny_disk.remount("ro")
    try:
        done = acceptance(inventory, sign_key, "--out", str(tiny_disk.path / "out"))
    finally:
        tiny_disk.remount("rw")
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert f"--out {tiny_disk.path / 'out'}: {tiny_disk.path} is not writable" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_no_room_for_the_header_leaves_no_run_and_latest_alone(tiny_disk, inventory, sign_key):
    out = tiny_disk.path / "out"
    assert acceptance(inventory, sign_key, "--out", str(out), "-k", "memory").returncode == 0
    latest = (out / "local" / "latest").resolve()
    tiny_disk.fill()
    done = acceptance(inventory, sign_key, "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "[Errno 28] No space left on device" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert only_run_dir(out) == latest == (out / "local" / "latest").resolve()


def test_an_append_that_fails_leaves_no_torn_line(tiny_disk):
    ledger = Ledger.create(tiny_disk.path, "c", {"nodes": ["n1"]})
    ledger.append({"type": "check", "test_id": "a", "node": "n1"})
    whole = ledger.path.read_bytes()
    tiny_disk.fill()
    with pytest.raises(WriteError) as raised:
        ledger.append({"type": "note", "text": "x" * 64 * 1024})
    assert raised.value.errno == 28 and str(ledger.path) in str(raised.value)
    assert ledger.path.read_bytes() == whole
    tiny_disk.free()
    ledger.append({"type": "check", "test_id": "b", "node": "n1"})
    record = read_ledger(ledger.run_dir)
    assert [c["test_id"] for c in record.checks] == ["a", "b"] and record.torn is None


def test_an_atomic_write_that_fails_keeps_the_old_file(tiny_disk):
    target = tiny_disk.path / "results.json"
    write_atomically(target, "old\n")
    tiny_disk.fill()
    with pytest.raises(WriteError, match=r"results.json: \[Errno 28\] No space left on device"):
        write_atomically(target, "new\n" * 100_000)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tiny_disk.path.iterdir()) == sorted(["results.json", tiny_disk.FILLER])


def test_a_torn_ledger_renders_with_a_warning_and_resume_repairs_it(tmp_path, inventory, sign_key):
    out = tmp_path / "out"
    first = acceptance(inventory, sign_key, "--out", str(out), "-k", "memory or os")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = only_run_dir(out)
    whole = (run_dir / LEDGER_FILE).read_bytes()
    lines = len(whole.splitlines())
    entry = json.dumps({"type": "check", "test_id": "suites/test_system.py::test_kernel[localhost]"})
    with open(run_dir / LEDGER_FILE, "ab") as ledger:  # the harness killed in the middle of a write
        ledger.write(entry[: len(entry) // 2].encode())

    rendered = handover("report", run_dir, "--sign-key", sign_key)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert f"{run_dir / LEDGER_FILE}:{lines + 1}: torn last line" in rendered.stderr

    resumed = acceptance(inventory, sign_key, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"handover: {run_dir / LEDGER_FILE}:{lines + 1}: cut off a torn last line" in resumed.stdout
    assert (run_dir / LEDGER_FILE).read_bytes().startswith(whole)
    record = read_ledger(run_dir)
    assert record.torn is None and not record.interrupted
    assert "verdict: CERTIFIED" in resumed.stdout
