"""results.json's `soak` section: each soaked node's standing, worst first, from the soak's checks.

The judgements are the checks' (suites/test_soak.py, in the ledger); this only gathers them per
node and orders the nodes, so a reader of a thousand-node soak starts with the nodes that need
attention. The trends themselves are the series of the `soak_trends` check (the report draws
them with the other curves). soak_table() formats the section for the report's partial,
templates/soak.html.j2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SOAK_CHECKS = ("soak_heartbeat", "soak_load", "soak_ib", "soak_io", "soak_gpu", "soak_kernel_log", "soak_links")
FIGURES = {"soak_cpu_retained": "cpu_retained_pct", "soak_net_retained": "net_retained_pct",
           "soak_ib_retained": "ib_retained_pct", "soak_io_retained": "io_retained_pct",
           "soak_gpu_retained": "gpu_retained_pct", "soak_cpu_temp_max": "cpu_temp_max_c",
           "soak_gpu_temp_max": "gpu_temp_max_c", "soak_gpu_power_max": "gpu_power_max_w",
           "soak_samples": "samples"}
FAILED = ("failed", "error")


def soak_section(checks: list[dict]) -> Optional[dict]:
    """{"nodes": [{node, status, failed[], reasons[], <figures>}], "trends": [names]}, the nodes
    worst first: most failed soak checks, then the lowest share of throughput kept; None when
    the run has no soak check."""
    per_node: dict[str, dict] = {}
    trends: list[str] = []
    for entry in checks:
        if entry.get("check") == "soak_trends":
            trends += [series.get("name") for series in entry.get("series") or []]
        if entry.get("check") not in SOAK_CHECKS or entry.get("node") is None:
            continue
        row = per_node.setdefault(entry["node"], {"node": entry["node"], "status": "skipped", "failed": [],
                                                  "reasons": [], **{key: None for key in FIGURES.values()}})
        if entry.get("outcome") in FAILED:
            row["failed"].append(entry["check"])
            row["reasons"].append((str(entry.get("message") or "").splitlines() or [""])[0])
            row["status"] = "failed"
        elif entry.get("outcome") == "passed" and row["status"] == "skipped":
            row["status"] = "passed"  # skipped: none of its soak checks ran (no soak there)
        for metric in entry.get("metrics") or []:
            if metric.get("name") in FIGURES:
                row[FIGURES[metric["name"]]] = metric.get("value")
    if not per_node:
        return None
    return {"nodes": sorted(per_node.values(), key=_worst_first), "trends": [t for t in trends if t]}


def _worst_first(row: dict) -> tuple:
    kept = [row[key] for key in ("cpu_retained_pct", "net_retained_pct", "ib_retained_pct", "io_retained_pct",
                                 "gpu_retained_pct")
            if isinstance(row[key], (int, float))]
    return (-len(row["failed"]), min(kept) if kept else float("inf"), row["node"])


# ---------------------------------------------------------------------------------------------
# The report's soak table (templates/soak.html.j2): results.json's section, formatted


@dataclass(frozen=True)
class SoakRow:
    node: str
    status: str
    failed: str  # the failed soak checks, comma-separated
    reasons: list[str]
    figures: list[str]  # one cell per COLUMNS entry, "" where not measured


COLUMNS = (("cpu_retained_pct", "CPU kept", "%"), ("net_retained_pct", "net kept", "%"),
           ("ib_retained_pct", "IB kept", "%"), ("io_retained_pct", "I/O kept", "%"),
           ("gpu_retained_pct", "GPU kept", "%"), ("cpu_temp_max_c", "CPU max", "°C"),
           ("gpu_temp_max_c", "GPU max", "°C"), ("gpu_power_max_w", "GPU power max", "W"),
           ("samples", "samples", ""))


@dataclass(frozen=True)
class SoakTable:
    columns: list[str]
    rows: list[SoakRow]
    trends: list[str]
    left_out: int = 0  # nodes with no failed soak check not listed (a fleet's table), all in results.json


def soak_table(results: dict, shown: Optional[int] = None) -> Optional[SoakTable]:
    """What the report's soak partial shows, in results.json's order (worst first); None without a
    soak. With `shown`, a fleet's table: every failed node, then that many more."""
    section = results.get("soak")
    if not isinstance(section, dict):
        return None
    def cell(value, unit: str) -> str:
        return "" if not isinstance(value, (int, float)) else f"{value:g}{' ' + unit if unit else ''}"
    nodes = [row for row in section.get("nodes") or [] if isinstance(row, dict)]
    # A figure no node has (no GPU, no InfiniBand, no shared scratch) is no column.
    columns = [column for column in COLUMNS if any(isinstance(row.get(column[0]), (int, float)) for row in nodes)]
    rows = [SoakRow(node=str(row.get("node")), status=str(row.get("status")), failed=", ".join(row.get("failed") or []),
                    reasons=[str(reason) for reason in row.get("reasons") or []],
                    figures=[cell(row.get(key), unit) for key, _, unit in columns])
            for row in nodes]
    kept = len(rows) if shown is None else sum(row.status == "failed" for row in rows) + shown
    return SoakTable([label for _, label, _ in columns], rows[:kept], [str(t) for t in section.get("trends") or []],
                     left_out=max(0, len(rows) - kept))
