"""The ledger: run directory layout, durable appends, reading back (torn lines, schema, re-runs), raw output."""
from __future__ import annotations

import json
import os
import re
import threading
from datetime import datetime
from pathlib import Path

import pytest

from reports.ledger import (
    LEDGER_FILE,
    LEDGER_SCHEMA,
    RAW_DIR,
    Ledger,
    LedgerError,
    new_run_id,
    read_ledger,
    safe_name,
    torn_warning,
)

RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")
HEADER = {"cluster": "testcluster", "profile": {"name": "p", "mandatory": [], "references": {}},
          "inventory": {"path": "/inv.yaml", "sha256": "0" * 64}, "argv": ["pytest"],
          "nodes": ["n1", "n2"]}


def check(node, name, outcome="passed", test_id=None, **extra) -> dict:
    return {"type": "check", "test_id": test_id or f"suites/test_system.py::test_{name}[{node}]",
            "check": name, "node": node, "outcome": outcome, "kind": None, "message": "",
            "metrics": [], **extra}


def lines_of(ledger: Ledger) -> list[str]:
    return ledger.path.read_text(encoding="utf-8").splitlines()


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger.create(tmp_path / "out", "testcluster", HEADER)


# Creating a run directory


def test_create_lays_out_the_run_directory(tmp_path, ledger):
    cluster_dir = tmp_path / "out" / "testcluster"
    assert ledger.run_dir.parent == cluster_dir
    assert RUN_ID.fullmatch(ledger.run_dir.name)
    assert ledger.path == ledger.run_dir / LEDGER_FILE == ledger.run_dir / "ledger.jsonl"
    assert ledger.path.is_file()
    assert (ledger.run_dir / RAW_DIR).is_dir()
    assert sorted(p.name for p in cluster_dir.iterdir()) == sorted([ledger.run_dir.name, "latest"])


def test_the_header_is_the_first_line_and_carries_the_schema(ledger):
    [line] = lines_of(ledger)
    first = json.loads(line)
    assert first["type"] == "run"
    assert first["schema"] == LEDGER_SCHEMA == "handover.ledger/1"
    assert first["run_id"] == ledger.run_dir.name
    assert datetime.fromisoformat(first["started"]).utcoffset() is not None
    assert {k: first[k] for k in HEADER} == HEADER
    assert list(first)[:4] == ["type", "schema", "run_id", "started"]


def test_latest_points_at_the_newest_run_after_two_creates(tmp_path):
    first = Ledger.create(tmp_path / "out", "testcluster", HEADER)
    second = Ledger.create(tmp_path / "out", "testcluster", HEADER)
    latest = tmp_path / "out" / "testcluster" / "latest"
    assert latest.is_symlink()
    assert os.readlink(latest) == second.run_dir.name  # relative: the out/ tree can be moved
    assert latest.resolve() == second.run_dir.resolve()
    assert read_ledger(latest).header["run_id"] == second.run_dir.name
    assert first.run_dir.is_dir() and first.path.is_file()
    leftovers = [p.name for p in latest.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_run_ids_are_unique(tmp_path):
    ledgers = [Ledger.create(tmp_path / "out", "testcluster", HEADER) for _ in range(3)]
    ids = [read_ledger(ledger.run_dir).header["run_id"] for ledger in ledgers]
    assert len(set(ids)) == 3
    assert all(RUN_ID.fullmatch(run_id) for run_id in ids)
    assert len({ledger.run_dir for ledger in ledgers}) == 3


def test_runs_of_two_clusters_are_kept_apart(tmp_path):
    one = Ledger.create(tmp_path / "out", "alpha", {**HEADER, "cluster": "alpha"})
    two = Ledger.create(tmp_path / "out", "beta", {**HEADER, "cluster": "beta"})
    assert one.run_dir.parent.name == "alpha" and two.run_dir.parent.name == "beta"
    assert (tmp_path / "out" / "alpha" / "latest").resolve() == one.run_dir.resolve()


@pytest.mark.parametrize("cluster", ["../escape", "..", "a/b", "/abs/olute", "sp ace"])
def test_an_unsafe_cluster_name_stays_under_the_base(tmp_path, cluster):
    base = tmp_path / "out"
    ledger = Ledger.create(base, cluster, {**HEADER, "cluster": cluster})
    assert ledger.run_dir.resolve().parent.parent == base.resolve()
    assert read_ledger(ledger.run_dir).header["cluster"] == cluster


def test_new_run_id_does_not_repeat_within_a_second():
    ids = [new_run_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)


# Appending


def test_append_is_on_disk_and_readable_line_by_line_after_each_entry(ledger):
    entries = [check("n1", "reachable"), {"type": "tool", "node": "n1", "tool": "python", "version": "3.11"},
               check("n2", "reachable", "failed", message="no route\nto host")]
    for count, entry in enumerate(entries, 2):
        ledger.append(entry)
        lines = lines_of(ledger)
        assert len(lines) == count
        assert json.loads(lines[-1]) == entry
        assert len(read_ledger(ledger.run_dir).checks) == sum(e["type"] == "check" for e in entries[:count - 1])


def test_a_second_ledger_object_on_the_same_directory_appends_to_the_same_file(ledger):
    Ledger(ledger.run_dir).append(check("n1", "reachable"))
    ledger.append(check("n2", "reachable"))
    assert [c["node"] for c in read_ledger(ledger.run_dir).checks] == ["n1", "n2"]


def test_append_writes_values_json_cannot_as_strings(ledger):
    ledger.append(check("n1", "reachable", path=Path("/tmp/x")))
    assert json.loads(lines_of(ledger)[-1])["path"] == "/tmp/x"


def test_concurrent_appends_from_threads_keep_every_line_whole(ledger):
    threads, per_thread = 8, 40

    def work(index: int) -> None:
        for number in range(per_thread):
            ledger.append(check(f"n{index}", "stress", test_id=f"t{index}-{number}",
                                message="x" * 2000))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    lines = lines_of(ledger)
    assert len(lines) == 1 + threads * per_thread
    assert all(json.loads(line)["type"] in ("run", "check") for line in lines)
    assert len(read_ledger(ledger.run_dir).checks) == threads * per_thread


# Reading back


def test_read_ledger_sorts_entries_by_type(ledger):
    ledger.append({"type": "tool", "node": "n1", "tool": "python", "version": "3.11.2"})
    ledger.append({"type": "selection", "nodes": ["n2"], "tests": ["a::test_x[n2]"]})
    ledger.append(check("n2", "x", test_id="a::test_x[n2]"))
    ledger.append({"type": "end", "finished": "2030-01-01T00:00:00+00:00", "exitstatus": 0,
                   "interrupted": False})
    record = read_ledger(ledger.run_dir)
    assert record.run_dir == ledger.run_dir
    assert record.header["run_id"] == ledger.run_dir.name
    assert record.tools == [{"type": "tool", "node": "n1", "tool": "python", "version": "3.11.2"}]
    assert record.selection["nodes"] == ["n2"]
    assert record.nodes == ["n2"]
    assert record.planned == ["a::test_x[n2]"]
    assert [c["test_id"] for c in record.checks] == ["a::test_x[n2]"]
    assert record.end["exitstatus"] == 0
    assert record.interrupted is False


def test_without_selection_the_nodes_come_from_the_header_and_nothing_is_planned(ledger):
    record = read_ledger(ledger.run_dir)
    assert record.nodes == ["n1", "n2"]
    assert record.planned == []
    assert record.selection is None


@pytest.mark.parametrize("end,interrupted", [
    (None, True),
    ({"type": "end", "finished": "2030-01-01T00:00:00+00:00", "exitstatus": 2, "interrupted": True}, True),
    ({"type": "end", "finished": "2030-01-01T00:00:00+00:00", "exitstatus": 1, "interrupted": False}, False),
], ids=["no-end", "end-interrupted", "end-finished"])
def test_interrupted(ledger, end, interrupted):
    if end is not None:
        ledger.append(end)
    assert read_ledger(ledger.run_dir).interrupted is interrupted


def test_unknown_entry_types_are_ignored(ledger):
    ledger.append({"type": "note", "text": "from a newer harness"})
    ledger.append(check("n1", "reachable"))
    record = read_ledger(ledger.run_dir)
    assert [c["check"] for c in record.checks] == ["reachable"]


def test_a_torn_last_line_is_tolerated(ledger):
    ledger.append(check("n1", "reachable"))
    ledger.append(check("n2", "reachable"))
    whole = json.dumps(check("n1", "memory"))
    with open(ledger.path, "a", encoding="utf-8") as out:
        out.write(whole[: len(whole) // 2])
    record = read_ledger(ledger.run_dir)
    assert [c["node"] for c in record.checks] == ["n1", "n2"]
    assert record.interrupted is True
    assert record.torn is not None and record.torn.where == f"{ledger.path}:4"
    assert torn_warning(record) is not None and f"{ledger.path}:4: torn last line" in torn_warning(record)


def test_a_whole_ledger_has_no_torn_line(ledger):
    ledger.append(check("n1", "reachable"))
    record = read_ledger(ledger.run_dir)
    assert record.torn is None and torn_warning(record) is None and ledger.repair(record) is None


def test_a_last_entry_without_its_newline_is_torn_too(ledger):
    """Appends write the line and its newline at once: without it, the write never finished,
    and an append after it would make one line of two."""
    ledger.append(check("n1", "reachable"))
    with open(ledger.path, "a", encoding="utf-8") as out:
        out.write(json.dumps(check("n2", "reachable")))
    record = read_ledger(ledger.run_dir)
    assert [c["node"] for c in record.checks] == ["n1"]
    assert record.torn is not None and record.torn.where == f"{ledger.path}:3"


def test_repair_cuts_off_the_torn_line_so_later_appends_stay_whole(ledger):
    ledger.append(check("n1", "reachable"))
    whole = ledger.path.read_bytes()
    with open(ledger.path, "a", encoding="utf-8") as out:
        out.write('{"type": "check", "test_')
    said = ledger.repair(read_ledger(ledger.run_dir))
    assert said == f"{ledger.path}:3: cut off a torn last line (24 bytes)"
    assert ledger.path.read_bytes() == whole
    ledger.append(check("n2", "reachable"))
    record = read_ledger(ledger.run_dir)
    assert [c["node"] for c in record.checks] == ["n1", "n2"] and record.torn is None


def test_a_torn_middle_line_raises_naming_file_and_line(ledger):
    ledger.append(check("n1", "reachable"))
    with open(ledger.path, "a", encoding="utf-8") as out:
        out.write('{"type": "check", "test_id": "suites/test_sys\n')
    ledger.append(check("n2", "reachable"))
    with pytest.raises(LedgerError) as raised:
        read_ledger(ledger.run_dir)
    assert f"{ledger.path}:3:" in str(raised.value)


def test_a_blank_middle_line_raises_naming_the_line(ledger):
    with open(ledger.path, "a", encoding="utf-8") as out:
        out.write("\n")
    ledger.append(check("n1", "reachable"))
    with pytest.raises(LedgerError, match=re.escape(f"{ledger.path}:2:")):
        read_ledger(ledger.run_dir)


@pytest.mark.parametrize("schema", ["handover.ledger/2", None, ""])
def test_a_header_with_another_schema_raises(tmp_path, schema):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    header = {"type": "run", "run_id": "x", **({} if schema is None else {"schema": schema})}
    (run_dir / LEDGER_FILE).write_text(json.dumps(header) + "\n", encoding="utf-8")
    with pytest.raises(LedgerError) as raised:
        read_ledger(run_dir)
    assert f"{run_dir / LEDGER_FILE}:1:" in str(raised.value)
    assert LEDGER_SCHEMA in str(raised.value)


@pytest.mark.parametrize("content", ["", json.dumps(check("n1", "reachable")) + "\n",
                                     '{"type": "run", "sch'],
                         ids=["empty", "no-header", "torn-header"])
def test_a_ledger_without_a_header_raises(tmp_path, content):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LEDGER_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(LedgerError, match=re.escape(f"{run_dir / LEDGER_FILE}:1: the first entry is not a run header")):
        read_ledger(run_dir)


def test_a_directory_without_a_ledger_raises_naming_it(tmp_path):
    with pytest.raises(LedgerError) as raised:
        read_ledger(tmp_path)
    assert str(tmp_path / LEDGER_FILE) in str(raised.value)
    assert "no ledger" in str(raised.value)


def test_a_rerun_of_the_same_test_replaces_the_earlier_entry(ledger):
    ledger.append(check("n1", "reachable", "failed", message="first try"))
    ledger.append(check("n2", "reachable"))
    ledger.append(check("n1", "memory"))
    ledger.append(check("n1", "reachable", "passed", message="second try"))
    checks = read_ledger(ledger.run_dir).checks
    assert [(c["test_id"].split("::")[1], c["outcome"]) for c in checks] == [
        ("test_reachable[n2]", "passed"), ("test_memory[n1]", "passed"),
        ("test_reachable[n1]", "passed")]
    assert checks[-1]["message"] == "second try"


def test_the_same_check_on_different_nodes_is_kept_apart(ledger):
    for node in ("n1", "n2", "n3"):
        ledger.append(check(node, "reachable"))
    assert [c["node"] for c in read_ledger(ledger.run_dir).checks] == ["n1", "n2", "n3"]


# Raw tool output


def test_save_raw_writes_stdout_and_stderr_under_raw_step_node(ledger):
    saved = ledger.save_raw("system_facts", "n1", "out ✓\n", "warning\n")
    assert saved == ["raw/system_facts/n1.stdout", "raw/system_facts/n1.stderr"]
    assert (ledger.run_dir / saved[0]).read_text(encoding="utf-8") == "out ✓\n"
    assert (ledger.run_dir / saved[1]).read_text(encoding="utf-8") == "warning\n"


def test_save_raw_skips_empty_streams(ledger):
    assert ledger.save_raw("probe", "n1", "", "only stderr") == ["raw/probe/n1.stderr"]
    assert ledger.save_raw("probe", "n2", "only stdout", "") == ["raw/probe/n2.stdout"]
    assert ledger.save_raw("probe", "n3", "", "") == []
    assert sorted(p.name for p in (ledger.run_dir / RAW_DIR / "probe").iterdir()) == [
        "n1.stderr", "n2.stdout"]


def test_save_raw_overwrites_a_rerun_of_the_same_step_on_the_same_node(ledger):
    ledger.save_raw("probe", "n1", "first", "")
    [path] = ledger.save_raw("probe", "n1", "second", "")
    assert (ledger.run_dir / path).read_text(encoding="utf-8") == "second"


def test_a_resumed_session_names_its_raw_files_beside_the_earlier_sessions(ledger):
    """The first session's files are what its finished checks cite: a --resume (a Ledger opened
    on the same directory) that runs the step again writes resume-1, the next resume-2, each
    whole (no stderr of one run beside the stdout of another); a session replaces only its own."""
    first = ledger.save_raw("fio", "n1", "read 1.049 GB/s", "a warning", "fio job")
    resumed = Ledger(ledger.run_dir)
    second = resumed.save_raw("fio", "n1", "read 0.914 GB/s", "", "fio job")
    again = resumed.save_raw("fio", "n1", "read 0.920 GB/s", "", "fio job")
    third = Ledger(ledger.run_dir).save_raw("fio", "n1", "read 0.930 GB/s", "", "")

    assert first == ["raw/fio/n1.command", "raw/fio/n1.stdout", "raw/fio/n1.stderr"]
    assert second == again == ["raw/fio/n1.resume-1.command", "raw/fio/n1.resume-1.stdout"]
    assert third == ["raw/fio/n1.resume-2.stdout"]
    read = {path: (ledger.run_dir / path).read_text() for path in (*first, *again, *third)}
    assert read["raw/fio/n1.stdout"] == "read 1.049 GB/s" and read["raw/fio/n1.stderr"] == "a warning"
    assert read["raw/fio/n1.resume-1.stdout"] == "read 0.920 GB/s"
    assert read["raw/fio/n1.resume-2.stdout"] == "read 0.930 GB/s"
    assert resumed.save_raw("fio", "n2", "read 1.0 GB/s", "") == ["raw/fio/n2.stdout"]


UNSAFE = ["../../../escape", "..", ".", "/etc/passwd", "a/../../b", "sp ace", "tab\there",
          ".hidden", "", "nul\x00byte", "ünïcode", "back\\slash", "~root"]


@pytest.mark.parametrize("name", UNSAFE)
def test_save_raw_neutralises_unsafe_node_and_step_names(ledger, name):
    raw = (ledger.run_dir / RAW_DIR).resolve()
    saved = ledger.save_raw(name, name, "out", "err")
    assert len(saved) == 2
    for relative in saved:
        path = Path(relative)
        assert not path.is_absolute()
        assert ".." not in path.parts
        assert path.parts[0] == RAW_DIR and len(path.parts) == 3
        full = (ledger.run_dir / path).resolve()
        assert full.is_file()
        assert full.parent.parent == raw
    assert not (ledger.run_dir.parent / "escape").exists()


@pytest.mark.parametrize("name", UNSAFE)
def test_safe_name_is_a_single_visible_path_component(name):
    safe = safe_name(name)
    assert safe and "/" not in safe and "\x00" not in safe
    assert not safe.startswith(".")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", safe)


@pytest.mark.parametrize("name", ["gpu001", "node-07.rack1", "n_1"])
def test_safe_name_keeps_inventory_names(name):
    assert safe_name(name) == name


def test_a_checks_message_and_excerpt_are_redacted_like_raw_output(ledger):
    """Made-up lines in the shapes tools print (an `env` line, a JSON member); the message of a
    failed check quotes them, and the ledger (so results.json and the report) must not."""
    excerpt = 'NCCL_DEBUG=INFO\nHF_TOKEN=hf_made_up_value\n{"WANDB_API_KEY": "made-up-key"}'
    ledger.append(check("n1", "training", "failed", message="rank 0: HF_TOKEN=hf_made_up_value",
                        log_excerpt=excerpt))
    ledger.append({"type": "tool", "node": "n1", "tool": "torch", "version": "2.13.0"})
    [entry] = read_ledger(ledger.run_dir).checks
    assert entry["message"] == "rank 0: HF_TOKEN=[REDACTED]"
    assert entry["log_excerpt"] == 'NCCL_DEBUG=INFO\nHF_TOKEN=[REDACTED]\n{"WANDB_API_KEY": "[REDACTED]"}'
    assert "made" not in ledger.path.read_text()
