"""The error of a node source the inventory points at (slurm.conf, an Ansible inventory)."""
from __future__ import annotations

from typing import Optional

QUOTED_CHARS = 60  # past this, an error quotes a value's start and says how long it is


def quoted(value: str) -> str:
    """A value as a one-line error quotes it: whole when short; else its start and its length,
    so that a wrong file (a passwd, a hosts file) or a pasted key does not flood the line."""
    if len(value) <= QUOTED_CHARS:
        return repr(value)
    return f"{value[:QUOTED_CHARS - 20]!r}... ({len(value):,} characters)"


class SourceFileError(Exception):
    """A source file handover will not read; str() is one line naming the file and line."""

    def __init__(self, problem: str, file: str, line: Optional[int] = None):
        self.problem = problem
        self.file = file
        self.line = line
        super().__init__(problem, file, line)

    def __str__(self) -> str:
        location = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{location}: {self.problem}"
