"""Where the harness may write on a node: only the scratch paths the inventory declares."""
from __future__ import annotations

from typing import Optional, Sequence

from inventory.model import ScratchPath
from runners.transport import Result

# How the node-side scratch guards (payloads fio_scratch, hpl_scratch) say they did not run.
REFUSED_EXIT = 3  # refused to write: not a directory, too little space, raw device, ...
MISSING_EXIT = 127  # the tool is not installed on the node
REFUSED_PREFIX = "handover-refused: "
MISSING_PREFIX = "handover-missing: "


class ScratchRefused(Exception):
    """The harness will not write to this path: the inventory does not declare it as scratch."""


def declared(path: str, scratch: Sequence[ScratchPath]) -> ScratchPath:
    """The inventory's scratch entry for exactly this path (not a subdirectory), or ScratchRefused."""
    for entry in scratch:
        if entry.path == path:
            return entry
    known = ", ".join(entry.path for entry in scratch) or "none"
    raise ScratchRefused(f"{path} is not a scratch path the inventory declares (declared: {known}); "
                         "the harness writes nowhere else")


def refusal(result: Result) -> Optional[str]:
    """Why the node refused to write in the scratch path, or None when it did not refuse."""
    return _prefixed_line(result, REFUSED_EXIT, REFUSED_PREFIX)


def missing_tool(result: Result) -> Optional[str]:
    """Which tool the node lacks, or None."""
    return _prefixed_line(result, MISSING_EXIT, MISSING_PREFIX)


def _prefixed_line(result: Result, exit_code: int, prefix: str) -> Optional[str]:
    if result.exit_code != exit_code:
        return None
    for line in result.stderr.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):]
    return None
