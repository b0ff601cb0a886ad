"""The results ledger: an append-only JSON-lines file, written as each check completes.

It is the source of truth of a run. results.json, report.html, junit.xml and metrics.csv are
renderings of it, so a run that was interrupted can still be reported (`handover report`).

Run directory layout (a public interface; keep the names):
    out/<cluster>/<run-id>/ledger.jsonl      one JSON object per line; the first is the run header
    out/<cluster>/<run-id>/raw/<step>/<node>.stdout|.stderr   raw tool output
    out/<cluster>/<run-id>/raw/<step>/<node>.command          the whole command that gave it
    out/<cluster>/<run-id>/raw/<step>/<node>.resume-<n>.*     the same, of a step a --resume ran again
    out/<cluster>/<run-id>/results.json, report.html, junit.xml, metrics.csv (+ .sig files)
    out/<cluster>/latest -> <run-id>

Each entry is one write of one whole line, undone if the write fails, so a full disk never leaves
half a line for later appends to build on; a line torn all the same (the harness killed mid-write)
can only be the last, which reading ignores with a warning and --resume cuts off before appending.
An entry is in the kernel once append() returns, so a killed harness loses nothing; the ledger and
the raw outputs reach the disk within a second (reports.files.DeferredSync), and at once when the
run ends, so a crash of the harness's own machine costs at most that last second of checks, which
--resume runs again.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from reports.files import DeferredSync, WriteError, link_atomically, write_atomically, write_error
from reports.redact import redact

LEDGER_SCHEMA = "handover.ledger/1"
LEDGER_FILE = "ledger.jsonl"
RAW_DIR = "raw"
RAW_SUFFIXES = ("command", "stdout", "stderr")
REDACTED_FIELDS = ("message", "log_excerpt")  # of a check entry: text quoted from tool output

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def iso_at(epoch: float) -> str:
    """A time.time() as the ledger writes times: ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


def safe_name(text: str) -> str:
    """A file name component that cannot escape its directory."""
    return _UNSAFE.sub("_", text).lstrip(".") or "_"


class LedgerError(Exception):
    """A run directory without a readable ledger; the message names the file."""


class RunDirectoryBusy(LedgerError):
    """Another harness process holds the run directory: the run itself, or a resume of it."""


class Ledger:
    """Appends entries from any thread, each line whole or not at all; durable within a second."""

    def __init__(self, run_dir: Path, started: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.started = started  # the header's start time, when this process wrote the header
        self.path = self.run_dir / LEDGER_FILE
        self._lock = threading.Lock()
        self._torn_at: Optional[int] = None  # where a failed append could not be cut back yet
        self._sync = DeferredSync()
        self._raw_written: set[Path] = set()  # this process's raw files, its own to replace
        self._held: Optional[int] = None  # the run directory's descriptor while this process holds it

    def hold(self) -> None:
        """Hold the run directory for this process (flock on the directory itself: nothing is
        written, and the kernel lets go when the process ends, SIGKILL included). Two harnesses
        appending to one ledger, a run and a resume of it or two resumes, each took the other's
        node locks for another run's and recorded its checks as busy, over results the first had.
        RunDirectoryBusy when another process holds it."""
        descriptor = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise RunDirectoryBusy(f"{self.run_dir} is in use by another harness (the run itself, or a resume "
                                   "of it, still going): wait for it to end") from None
        self._held = descriptor

    @classmethod
    def held(cls, run_dir: Path) -> "Ledger":
        """The ledger of an existing run directory, held by this process (hold()); where run_dir
        is no directory it is not held, and reading its ledger says what is wrong."""
        ledger = cls(run_dir)
        try:
            ledger.hold()
        except OSError:  # no such directory, or none to read: reading its ledger says so
            pass
        return ledger

    @classmethod
    def create(cls, base: Path, cluster: str, header: dict, hold: bool = False) -> "Ledger":
        """Make out/<cluster>/<run-id>/ with its run header, then point `latest` at it; with
        hold, held by this process (hold()) before anyone can find it there.

        A disk too full for the header leaves no run directory behind and `latest` where it was.
        """
        cluster_dir = Path(base) / safe_name(cluster)
        try:
            cluster_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise write_error(cluster_dir, error) from None
        while True:  # two runs started in the same second must not share a directory
            run_id = new_run_id()
            run_dir = cluster_dir / run_id
            try:
                run_dir.mkdir()
                break
            except FileExistsError:
                continue
            except OSError as error:
                raise write_error(run_dir, error) from None
        ledger = cls(run_dir, started=now_iso())
        if hold:
            ledger.hold()
        header = {"type": "run", "schema": LEDGER_SCHEMA, "run_id": run_id, "started": ledger.started,
                  **header}
        if isinstance(header.get("argv"), list):  # a secret given on the command line stays there
            header["argv"] = shlex.split(redact(shlex.join(map(str, header["argv"]))))
        try:
            _make_folder(run_dir / RAW_DIR)
            write_atomically(ledger.path, _line(header))
            link_atomically(cluster_dir / "latest", run_id)
        except WriteError:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return ledger

    def append(self, entry: dict) -> None:
        """Add one line; a failed write is cut back off, so the ledger stays whole. A check's
        message and log excerpt quote tool output, so they are redacted like the raw files."""
        if entry.get("type") == "check":
            entry = {**entry, **{field: redact(entry[field]) for field in REDACTED_FIELDS
                                 if isinstance(entry.get(field), str)}}
        data = _line(entry).encode("utf-8")
        self._sync.check()
        with self._lock:
            try:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as error:
                raise write_error(self.path, error) from None
            try:
                if self._torn_at is not None:  # never build on half a line
                    os.ftruncate(descriptor, self._torn_at)
                    self._torn_at = None
                whole = os.fstat(descriptor).st_size
                try:
                    written = 0
                    while written < len(data):
                        written += os.write(descriptor, data[written:])
                except OSError:
                    self._cut_back(descriptor, whole)
                    raise
            except OSError as error:
                raise write_error(self.path, error) from None
            finally:
                os.close(descriptor)
        self._sync.add(self.path)

    def sync(self) -> None:
        """Make everything appended and saved so far durable now (the end of a run)."""
        self._sync.flush()
        self._sync.check()

    def _cut_back(self, descriptor: int, size: int) -> None:
        """Undo a partial append; if even that fails, the next append tries again first."""
        try:
            os.ftruncate(descriptor, size)
        except OSError:
            self._torn_at = size

    def repair(self, record: "RunRecord") -> Optional[str]:
        """Cut off the torn last line a read found, before anything is appended after it;
        what was done, in one line (None when the ledger was whole)."""
        if record.torn is None:
            return None
        with self._lock:
            try:
                os.truncate(self.path, record.torn.offset)
            except OSError as error:
                raise write_error(self.path, error) from None
        return f"{record.torn.where}: cut off a torn last line ({record.torn.size} bytes)"

    def save_raw(self, step: str, node: str, stdout: str, stderr: str, command: str = "") -> list[str]:
        """Keep a tool's raw output beside the ledger, and the whole command that gave it (inline
        input included, which messages leave out); returns paths relative to the run dir."""
        folder = self.run_dir / RAW_DIR / safe_name(step)
        _make_folder(folder)
        stem = self._raw_stem(folder, safe_name(node))
        saved = []
        for suffix, text in zip(RAW_SUFFIXES, (command, stdout, stderr), strict=True):
            if text:
                path = write_atomically(folder / f"{stem}.{suffix}", redact(text), deferred=self._sync)
                self._raw_written.add(path)
                saved.append(str(path.relative_to(self.run_dir)))
        return saved

    def _raw_stem(self, folder: Path, node: str) -> str:
        """The name of a node's files in a step's folder. Files an earlier session of the run wrote
        are the evidence its finished checks cite: a --resume that runs the step again names its
        own beside them (gpu017.resume-1.stdout), never over them, nor mixed with them."""
        stem, resumes = node, 0
        while any((path := folder / f"{stem}.{suffix}") not in self._raw_written and path.exists()
                  for suffix in RAW_SUFFIXES):
            resumes += 1
            stem = f"{node}.resume-{resumes}"
        return stem


def _line(entry: dict) -> str:
    return json.dumps(entry, sort_keys=False, default=str) + "\n"


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise write_error(folder, error) from None


@dataclass(frozen=True)
class TornLine:
    """A last ledger line that was never completely written: where it starts, for --resume."""

    where: str  # file:line
    offset: int
    size: int


@dataclass
class RunRecord:
    """A ledger read back: the header, the latest entry per check, tools, and how it ended."""

    run_dir: Path
    header: dict
    checks: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    selection: Optional[dict] = None  # nodes and test ids left after -k/-m/--nodes
    locks: list[dict] = field(default_factory=list)  # each session's locks entry, in order
    dropped: list[dict] = field(default_factory=list)  # every session's nodes lost and back, in order
    end: Optional[dict] = None
    torn: Optional[TornLine] = None  # a last line cut short, ignored

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
    """Read a ledger, tolerating a torn last line (the run may have died mid-write): it is left
    out and named in record.torn. A line that is not a JSON object anywhere else is an error."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise LedgerError(f"{path}: no ledger here; is {run_dir} a handover run directory?")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise LedgerError(f"{path}: cannot read: [Errno {error.errno}] {error.strerror}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # a whole ledger ends in a newline
    torn_last = bool(lines) and not data.endswith(b"\n")  # a last line without its newline is torn
    entries = _entries_at_once(lines[:-1] if torn_last else lines)
    if entries is None:
        entries, torn = _entries_line_by_line(path, data, lines)
    else:
        torn = TornLine(f"{path}:{len(lines)}", len(data) - len(lines[-1]), len(lines[-1])) if torn_last else None
    if not entries or entries[0].get("type") != "run":
        raise LedgerError(f"{path}:1: the first entry is not a run header")
    if entries[0].get("schema") != LEDGER_SCHEMA:
        raise LedgerError(f"{path}:1: schema {entries[0].get('schema')!r}, expected {LEDGER_SCHEMA!r}")
    record = RunRecord(run_dir=Path(run_dir), header=entries[0], torn=torn)
    latest: dict[str, dict] = {}
    for number, entry in enumerate(entries[1:], 2):
        kind = entry.get("type")
        if kind == "check":
            test_id = entry.get("test_id")
            if not isinstance(test_id, str):
                raise LedgerError(f"{path}:{number}: a check entry without a test_id")
            latest.pop(test_id, None)  # a resumed run's newer outcome replaces the old
            latest[test_id] = entry
        elif kind == "tool":
            record.tools.append(entry)
        elif kind == "selection":
            record.selection = entry
        elif kind == "locks":
            record.locks.append(entry)
        elif kind == "dropped":
            record.dropped.extend(entry.get("nodes") or [])
        elif kind == "end":
            record.end = entry
    record.checks = list(latest.values())
    return record


def _entries_at_once(lines: list[bytes]) -> Optional[list[dict]]:
    """Every line read by one json.loads, as one JSON array: a third faster than a call per line
    at a thousand nodes. None unless each line is one JSON object: then reading line by line
    names the one that is not."""
    try:
        entries = json.loads((b"[" + b",".join(lines) + b"]").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if len(entries) != len(lines) or not all(isinstance(entry, dict) for entry in entries):
        return None
    return entries


def _entries_line_by_line(path: Path, data: bytes, lines: list[bytes]) -> tuple[list[dict], Optional[TornLine]]:
    """The entries of a ledger with a line that is not a JSON object: an error unless it is the last."""
    entries: list[dict] = []
    offset = 0
    for number, line in enumerate(lines, 1):
        last = number == len(lines)
        entry = _entry(line)
        if entry is None or (last and not data.endswith(b"\n")):
            if not last:
                raise LedgerError(f"{path}:{number}: not a JSON object")
            return entries, TornLine(f"{path}:{number}", offset, len(data) - offset)
        entries.append(entry)
        offset += len(line) + 1
    return entries, None


def _entry(line: bytes) -> Optional[dict]:
    try:
        entry = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return entry if isinstance(entry, dict) else None


def torn_warning(record: RunRecord) -> Optional[str]:
    """The warning to show for a ledger read with a torn last line."""
    if record.torn is None:
        return None
    return f"warning: {record.torn.where}: torn last line ({record.torn.size} bytes, written when the run " \
           "stopped mid-write), ignored"
