"""Many nodes in a few words: a hostlist (gpu[0001-1024]), as Slurm, pdsh and ClusterShell
write them, and how many it names. Every place that names nodes together uses these two, so a
terminal line, results.json's reasons and the report say it alike."""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable

import hostlist


def hostlist_of(names: Iterable[str]) -> str:
    """node1,node2,node3 -> node[1-3]; a plain list for names hostlist rejects."""
    return _collected(tuple(names))


@lru_cache(maxsize=256)
def _collected(names: tuple[str, ...]) -> str:
    """Cached: at a thousand nodes many sections name the same nodes (all but the unreachable
    ones), and hostlist takes milliseconds for each."""
    try:
        return hostlist.collect_hostlist(list(names))
    except Exception:  # hostlist raises its own BadHostlist and ValueError on odd names
        return ", ".join(names)


def counted(names: Iterable[str]) -> str:
    """A node by its name; several by their hostlist and how many: 'gpu[0001-1024] (1,024 nodes)'."""
    names = tuple(names)
    return names[0] if len(names) == 1 else f"{_collected(names)} ({len(names):,} nodes)"
