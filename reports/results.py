"""results.json (schema handover.results/1): the ledger plus the verdict, in one versioned document.

Keys (a public interface; add, never rename):
    schema, run{run_id, cluster, profile, profile_description, inventory{path, sha256},
    harness{version, commit}, started, finished, interrupted, argv, nodes, tools[],
    pair_low_fraction? (the profile's: a pair this far from the median of its peers is low)},
    signer{fingerprint, public_key}?, verdict{status, reasons}, nodes[{name, status, reasons}],
    checks[{test_id, check, area, node, outcome, kind, message, log_excerpt, duration_s,
            finished, raw[], metrics[{name, value, unit, reference, criterion, margin, ok}],
            pair[a, b]? (tests between two nodes), rail? (perftest: HCA index),
            series[{name, x_label, x_unit, y_label, y_unit, x_scale, lines[{label, points[[x, y]]}]}]?
            (curves such as busbw against message size or loss against step)}]
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from reports.ledger import RunRecord
from reports.verdict import Verdict, judge

RESULTS_SCHEMA = "handover.results/1"
RESULTS_FILE = "results.json"
METRICS_CSV = "metrics.csv"


def build_results(record: RunRecord, signer: Optional[dict] = None) -> tuple[dict, Verdict]:
    header = record.header
    profile = header.get("profile", {})
    verdict = judge(profile, record.nodes, record.checks, record.planned, record.interrupted)
    results = {
        "schema": RESULTS_SCHEMA,
        "run": {
            "run_id": header["run_id"],
            "cluster": header.get("cluster"),
            "profile": profile.get("name"),
            "profile_description": profile.get("description", ""),
            "inventory": header.get("inventory", {}),
            "harness": header.get("harness", {}),
            "started": header.get("started"),
            "finished": (record.end or {}).get("finished"),
            "interrupted": record.interrupted,
            "argv": header.get("argv", []),
            "nodes": record.nodes,
            "tools": [{k: t.get(k) for k in ("node", "tool", "version")} for t in record.tools],
        },
        "verdict": {"status": verdict.status, "reasons": verdict.reasons},
        "nodes": verdict.nodes,
        "checks": [{k: v for k, v in entry.items() if k != "type"} for entry in record.checks],
    }
    low_fraction = (profile.get("expect") or {}).get("pair_low_fraction")
    if low_fraction is not None:  # the report's heatmaps mark low pairs as the attribution does
        results["run"]["pair_low_fraction"] = low_fraction
    if signer:
        results["signer"] = signer
    return results, verdict


def write_results(results: dict, run_dir: Path) -> Path:
    path = Path(run_dir) / RESULTS_FILE
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return path


def write_metrics_csv(results: dict, run_dir: Path) -> Path:
    """One row per measured metric, for spreadsheets and trend tracking across runs."""
    import pandas as pd

    rows = [{"run_id": results["run"]["run_id"], "cluster": results["run"]["cluster"],
             "node": c.get("node") or "cluster", "check": c["check"], "metric": m["name"],
             "value": m.get("value"), "unit": m.get("unit"), "criterion": m.get("criterion"),
             "margin": m.get("margin"), "ok": m.get("ok")}
            for c in results["checks"] for m in c.get("metrics", [])]
    columns = ["run_id", "cluster", "node", "check", "metric", "value", "unit", "criterion",
               "margin", "ok"]
    path = Path(run_dir) / METRICS_CSV
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return path
