"""Where the harness may write on a node: only the scratch paths the inventory declares."""
from __future__ import annotations

from typing import Sequence

from inventory.model import ScratchPath


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
