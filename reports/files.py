"""Writing a run's files so that a full or failing disk never leaves one torn or empty.

Every output (results.json, report.html, junit.xml, metrics.csv, the .sig files, raw tool output,
the `latest` link) is written to a temporary file in its own directory, fsynced, and renamed over
the old one: a reader sees the previous file or the new one, never half of either. A write that
fails is a WriteError, whose str() is the one line to show: the file and the errno.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


class WriteError(OSError):
    """A run file could not be written; str() names the file and the errno, on one line."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: [Errno {self.errno}] {self.strerror}"


def write_error(path: Union[str, Path], error: OSError) -> WriteError:
    """The WriteError for path, keeping the errno of what went wrong."""
    if isinstance(error, WriteError):
        return error
    return WriteError(error.errno, error.strerror or str(error), str(path))


def write_atomically(path: Union[str, Path], data: Union[bytes, str], mode: int = 0o644) -> Path:
    """Replace path with data in one step (temporary file, fsync, rename, fsync of the folder)."""
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
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError as error:
        _remove(temporary)
        raise write_error(path, error) from None
    except BaseException:
        _remove(temporary)
        raise
    sync_folder(path.parent)
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


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
