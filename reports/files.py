"""Writing a run's files so that a full or failing disk never leaves one torn or empty.

Every output (results.json, report.html, junit.xml, metrics.csv, the .sig files, raw tool output,
the `latest` link) is written to a temporary file in its own directory and renamed over the old
one: a reader sees the previous file or the new one, never half of either. A write that fails is
a WriteError, whose str() is the one line to show: the file and the errno.

The renderings are fsynced before they are renamed. The many small files written while checks
run (ledger lines, raw outputs) are in the kernel as soon as they are written, which is all a
killed harness needs; a DeferredSync makes them durable on disk within a second, in its own
thread, so that a run on a thousand nodes does not wait for a disk flush per file.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO, Optional, Union

SYNC_WITHIN_S = 1.0  # a DeferredSync flushes what it was given at most this long after
# write_atomically's temporary file (mkstemp: ".<name>.<8 characters>"), which a process killed
# between writing and renaming it leaves behind
TEMPORARY = re.compile(r"\.(.+)\.[a-z0-9_]{8}")


class WriteError(OSError):
    """A run file could not be written; str() names the file and the errno, on one line."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: [Errno {self.errno}] {self.strerror}"


def open_regular(path: Union[str, Path]) -> BinaryIO:
    """Open a regular file to read, refusing anything else without blocking: a FIFO or a device
    put where a bundle's file belongs would hang a plain open() (OSError EINVAL, "not a regular
    file")."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def remove_stale_temporaries(folder: Union[str, Path]) -> None:
    """Remove what killed writers left under folder (TEMPORARY names; links not followed), so
    that a run directory sealed after a kill does not sign a half-written or outdated copy of
    one of its files. Call it only while no writer is at work there (the run directory held:
    reports.ledger.Ledger.hold)."""
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            if TEMPORARY.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)


def read_regular(path: Union[str, Path]) -> bytes:
    """A regular file's bytes (open_regular)."""
    with open_regular(path) as stream:
        return stream.read()


def write_error(path: Union[str, Path], error: OSError) -> WriteError:
    """The WriteError for path, keeping the errno of what went wrong."""
    if isinstance(error, WriteError):
        return error
    return WriteError(error.errno, error.strerror or str(error), str(path))


def write_atomically(path: Union[str, Path], data: Union[bytes, str], mode: int = 0o644,
                     deferred: Optional["DeferredSync"] = None) -> Path:
    """Replace path with data in one step (temporary file, fsync, rename, fsync of the folder);
    with `deferred`, the fsyncs are its to do, soon after."""
    path = Path(path)
    content = data.encode("utf-8") if isinstance(data, str) else data
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as error:
        raise write_error(path, error) from None
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(content)
            stream.flush()
            if deferred is None:
                os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError as error:
        _remove(temporary)
        raise write_error(path, error) from None
    except BaseException:
        _remove(temporary)
        raise
    if deferred is None:
        sync_folder(path.parent)
    else:
        deferred.add(path)
    return path


def link_atomically(link: Path, target: str) -> None:
    """Point the symlink `link` at target in one step, as `latest` is repointed."""
    temporary = link.with_name(f".{link.name}-{os.getpid()}-{target}")
    try:
        temporary.symlink_to(target)
        os.replace(temporary, link)
    except OSError as error:
        _remove(str(temporary))
        raise write_error(link, error) from None
    sync_folder(link.parent)


def sync_folder(folder: Path) -> None:
    """Make a rename in folder durable; a filesystem that cannot fsync a folder is left be."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


class DeferredSync:
    """Files to fsync (with their folders) soon, in one background pass within SYNC_WITHIN_S of
    the first of them; a failure is kept and raised, naming the file, by the next check()."""

    def __init__(self, within_s: float = SYNC_WITHIN_S):
        self.within_s = within_s
        self._pending: dict[Path, None] = {}  # in the order given
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None
        self._failed: Optional[WriteError] = None

    def add(self, path: Path) -> None:
        with self._lock:
            self._pending[Path(path)] = None
            if self._timer is None:
                self._timer = threading.Timer(self.within_s, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def check(self) -> None:
        """Raise the WriteError of a background flush that failed (once)."""
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def flush(self) -> None:
        """fsync every pending file and folder now; safe to call from any thread."""
        with self._lock:
            pending, self._pending = list(self._pending), {}
            self._timer = None
        folders: dict[Path, None] = {}
        for path in pending:
            try:
                descriptor = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
            except FileNotFoundError:
                continue  # replaced or removed since: its successor is pending, or nothing is
            except OSError as error:
                self._failed = self._failed or write_error(path, error)
            folders[path.parent] = None
        for folder in folders:
            sync_folder(folder)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
