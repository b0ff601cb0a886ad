"""The results ledger: an append-only JSON-lines file, written as each check completes.

It is the source of truth of a run. results.json, report.html, junit.xml and metrics.csv are
renderings of it, so a run that was interrupted can still be reported (`handover report`).

Run directory layout (a public interface; keep the names):
    out/<cluster>/<run-id>/ledger.jsonl      one JSON object per line; the first is the run header
    out/<cluster>/<run-id>/raw/<step>/<node>.stdout|.stderr   raw tool output
    out/<cluster>/<run-id>/results.json, report.html, junit.xml, metrics.csv (+ .sig files)
    out/<cluster>/latest -> <run-id>
"""
from __future__ import annotations

import json
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

LEDGER_SCHEMA = "handover.ledger/1"
LEDGER_FILE = "ledger.jsonl"
RAW_DIR = "raw"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


def safe_name(text: str) -> str:
    """A file name component that cannot escape its directory."""
    return _UNSAFE.sub("_", text).lstrip(".") or "_"


class LedgerError(Exception):
    """A run directory without a readable ledger; the message names the file."""


class Ledger:
    """Appends entries durably (flush + fsync per entry) from any thread."""

    def __init__(self, run_dir: Path, started: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.started = started  # the header's start time, when this process wrote the header
        self.path = self.run_dir / LEDGER_FILE
        self._lock = threading.Lock()

    @classmethod
    def create(cls, base: Path, cluster: str, header: dict) -> "Ledger":
        """Make out/<cluster>/<run-id>/, point `latest` at it, and write the run header."""
        cluster_dir = Path(base) / safe_name(cluster)
        cluster_dir.mkdir(parents=True, exist_ok=True)
        while True:  # two runs started in the same second must not share a directory
            run_id = new_run_id()
            run_dir = cluster_dir / run_id
            try:
                run_dir.mkdir()
                break
            except FileExistsError:
                continue
        (run_dir / RAW_DIR).mkdir()
        latest = cluster_dir / "latest"
        temporary = cluster_dir / f".latest-{run_id}"
        temporary.symlink_to(run_id)
        os.replace(temporary, latest)
        ledger = cls(run_dir, started=now_iso())
        ledger.append({"type": "run", "schema": LEDGER_SCHEMA, "run_id": run_id,
                       "started": ledger.started, **header})
        return ledger

    def append(self, entry: dict) -> None:
        line = json.dumps(entry, sort_keys=False, default=str) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())

    def save_raw(self, step: str, node: str, stdout: str, stderr: str) -> list[str]:
        """Keep a tool's raw output beside the ledger; returns paths relative to the run dir."""
        folder = self.run_dir / RAW_DIR / safe_name(step)
        folder.mkdir(parents=True, exist_ok=True)
        saved = []
        for suffix, text in (("stdout", stdout), ("stderr", stderr)):
            if text:
                path = folder / f"{safe_name(node)}.{suffix}"
                path.write_text(text, encoding="utf-8")
                saved.append(str(path.relative_to(self.run_dir)))
        return saved


@dataclass
class RunRecord:
    """A ledger read back: the header, the latest entry per check, tools, and how it ended."""

    run_dir: Path
    header: dict
    checks: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    selection: Optional[dict] = None  # nodes and test ids left after -k/-m/--nodes
    end: Optional[dict] = None

    @property
    def nodes(self) -> list[str]:
        return (self.selection or self.header)["nodes"]

    @property
    def planned(self) -> list[str]:
        return (self.selection or {}).get("tests", [])

    @property
    def interrupted(self) -> bool:
        return self.end is None or bool(self.end.get("interrupted"))


def read_ledger(run_dir: Path) -> RunRecord:
    """Read a ledger, tolerating a torn last line (the run may have died mid-write)."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise LedgerError(f"{path}: no ledger here; is {run_dir} a handover run directory?")
    lines = path.read_text(encoding="utf-8").splitlines()
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise LedgerError(f"{path}:{number}: not a JSON object") from None
    if not entries or entries[0].get("type") != "run":
        raise LedgerError(f"{path}:1: the first entry is not a run header")
    if entries[0].get("schema") != LEDGER_SCHEMA:
        raise LedgerError(f"{path}:1: schema {entries[0].get('schema')!r}, expected {LEDGER_SCHEMA!r}")
    record = RunRecord(run_dir=Path(run_dir), header=entries[0])
    latest: dict[str, dict] = {}
    for entry in entries[1:]:
        kind = entry.get("type")
        if kind == "check":
            latest.pop(entry["test_id"], None)  # a resumed run's newer outcome replaces the old
            latest[entry["test_id"]] = entry
        elif kind == "tool":
            record.tools.append(entry)
        elif kind == "selection":
            record.selection = entry
        elif kind == "end":
            record.end = entry
    record.checks = list(latest.values())
    return record
