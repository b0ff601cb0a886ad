"""The error of a node source the inventory points at (slurm.conf, an Ansible inventory)."""
from __future__ import annotations

from typing import Optional


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
