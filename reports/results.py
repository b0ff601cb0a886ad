"""results.json (schema handover.results/1): the ledger plus the verdict, in one versioned document.

Everything a rendering colours is decided here or earlier (in the check, stored in the ledger):
the verdict, each node's status, the outliers among per-node figures. The renderings draw it.

Keys (a public interface; add, never rename; reports/schemas/results.schema.json describes each):
    schema, run{run_id, cluster, profile, profile_description, inventory{path, sha256},
    harness{version, commit}, started, finished, interrupted, argv, nodes, tools[],
    pair_low_fraction? (the profile's: a pair this far from the median of its peers is low),
    report_id, cluster_id, sign_off{engineer, customer},
    waivers[{check, nodes[], reason, owner, expires, waived}],
    expect_overrides[{key, value, profile_value, reason}] (the inventory's changes to profile.expect),
    unlocked[{node, reason}] (nodes tested without their node lock),
    dropped[{node, lost_at, back_at, reason}] (nodes that stopped answering and came back)},
    signer{fingerprint, public_key}?, verdict{status, reasons, cluster_checks?, waived, warnings[]?},
    nodes[{name, status, reasons}],
    checks[{test_id, check, area, depth[], node, outcome, kind, message, log_excerpt, duration_s,
            finished, raw[], metrics[{name, value, unit, reference, criterion, margin, ok, band?}],
            action? (failures: what to do next), waived{reason, owner, expires}? (a waived failure),
            pair[a, b]? (tests between two nodes), rail? (perftest: HCA index),
            pair_state?, pair_median? (the pair's heatmap state, judged against its campaign),
            series[{name, x_label, x_unit, y_label, y_unit, x_scale, lines[{label, points[[x, y]]}]}]?
            (curves such as busbw against message size or loss against step),
            unreached[]? (a cluster-wide check: the nodes it judged the cluster without)}],
    outliers[{check, metric, node, value, unit, median, deviation, rule, robust_z, severity, rail?}]
    (per-node figures far from their peers: warnings, or failures for the profile's outliers.fail),
    soak{nodes[{node, status, failed[], reasons[], cpu_retained_pct, net_retained_pct, ib_retained_pct,
         io_retained_pct, gpu_retained_pct, cpu_temp_max_c, gpu_temp_max_c, gpu_power_max_w, samples}],
         trends[]}? (a soak ran: worst first)
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Optional

from inventory.model import PLACES, OutlierRule
from reports.files import write_atomically
from reports.ledger import RunRecord
from reports.schema import validate_results
from reports.soak_view import soak_section
from reports.verdict import Verdict, is_waived, judge

RESULTS_SCHEMA = "handover.results/1"
SIGN_OFF_ROLES = ("engineer", "customer")  # the operator's engineer, then the customer
WAIVER_KEYS = ("check", "nodes", "reason", "owner", "expires")
MAD_SCALE = 1.4826  # MAD -> standard deviation, for normally distributed figures
RATE_UNITS = ("IOPS",)  # rates without "/s" in their unit: low is bad
TIME_UNITS = ("s", "ms", "us", "µs", "ns")  # times (latency, step time): high is bad
DEFAULT_OUTLIER_RULE = OutlierRule()  # a profile without `outliers:`
EXPECT_OVERRIDE_KEYS = ("key", "value", "profile_value", "reason")
DROPPED_KEYS = ("node", "lost_at", "back_at", "reason")
RESULTS_FILE = "results.json"
METRICS_CSV = "metrics.csv"


def report_id(cluster_id: str, run_id: str) -> str:
    """The report's ID: the cluster ID and the run ID, so it is the same however often the run is
    rendered, and tells apart reports of different clusters started in the same second."""
    return f"{cluster_id}-{run_id}"


def build_results(record: RunRecord, signer: Optional[dict] = None,
                  judged_nodes: Optional[list[str]] = None) -> tuple[dict, Verdict]:
    """results.json of a run, and its verdict. judged_nodes: the nodes the verdict judges one by
    one (default: every node of the run); a re-test's addendum judges those it re-tested."""
    header = record.header
    profile = header.get("profile", {})
    found = outliers(record.checks, outlier_rule(profile))
    verdict = judge(profile, record.nodes if judged_nodes is None else judged_nodes, record.checks,
                    record.planned, record.interrupted, found)
    cluster_id = header.get("cluster_id") or header.get("cluster") or ""
    results: dict = {
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
            "report_id": report_id(cluster_id, header["run_id"]),
            "cluster_id": cluster_id,
            "sign_off": {role: (header.get("sign_off") or {}).get(role) for role in SIGN_OFF_ROLES},
            "waivers": waivers_applied(header.get("waivers") or [], record.checks),
            "expect_overrides": [{key: override.get(key) for key in EXPECT_OVERRIDE_KEYS}
                                 for override in header.get("expect_overrides") or []],
            "unlocked": unlocked_nodes(record),
            "dropped": dropped_nodes(record),
        },
        "verdict": {"status": verdict.status, "reasons": verdict.reasons, "waived": verdict.waived},
        "nodes": [{**node, "source": (header.get("node_sources") or {}).get(node["name"]),
                   **{key: ((header.get("node_places") or {}).get(node["name"]) or {}).get(key) for key in PLACES}}
                  for node in verdict.nodes],
        "checks": [{k: v for k, v in entry.items() if k != "type"} for entry in record.checks],
        "outliers": found,
    }
    if verdict.cluster_checks is not None:
        results["verdict"]["cluster_checks"] = verdict.cluster_checks
    if verdict.warnings:  # beside the status, which stays one of the three
        results["verdict"]["warnings"] = verdict.warnings
    low_fraction = (profile.get("expect") or {}).get("pair_low_fraction")
    if low_fraction is not None:  # the report's heatmaps mark low pairs as the attribution does
        results["run"]["pair_low_fraction"] = low_fraction
    soak = soak_section(record.checks)
    if soak is not None:  # a soak ran: its nodes worst first (reports/soak_view.py)
        results["soak"] = soak
    if signer:
        results["signer"] = signer
    return results, verdict


def unlocked_nodes(record: RunRecord) -> list[dict]:
    """The nodes a session of the run tested without holding their node lock (runners.node_lock),
    each with why: another run or a soak could have loaded them meanwhile (--busy-nodes ignore
    says so). Nodes refused as busy, or not reached at all, were not tested; locks entries that do
    not list them (written before they did) cannot tell those apart and are left out."""
    unlocked: dict[str, str] = {}
    for entry in record.locks:
        if "refused" not in entry or "not_reached" not in entry:
            continue
        untested = set(entry["refused"]) | set(entry["not_reached"])
        unlocked.update((node, why) for node, why in (entry.get("not_held") or {}).items() if node not in untested)
    selected = set(record.nodes)
    return [{"node": node, "reason": why} for node, why in unlocked.items() if node in selected]


def dropped_nodes(record: RunRecord) -> list[dict]:
    """Every loss of a node under test that it came back from (runners.transport tries a lost
    node again): its link or sshd dropped during the run, whether or not a check failed then."""
    selected = set(record.nodes)
    return [{key: entry.get(key) for key in DROPPED_KEYS} for entry in record.dropped if entry.get("node") in selected]


def waivers_applied(waivers: list[dict], checks: list[dict]) -> list[dict]:
    """The inventory's waivers as the run held them, each with how many failures it waived
    (0: nothing failed there, or the waiver had expired)."""
    def count(waiver: dict) -> int:
        nodes = set(waiver.get("nodes") or [])  # a fleet-wide waiver's list, searched per check, grew with N^2
        return sum(1 for entry in checks if is_waived(entry) and entry["check"] == waiver.get("check")
                   and entry.get("node") in nodes
                   and entry["waived"].get("reason") == waiver.get("reason"))
    return [{**{key: waiver.get(key) for key in WAIVER_KEYS}, "waived": count(waiver)} for waiver in waivers]


def outlier_rule(profile: dict) -> OutlierRule:
    """The run header's profile.outliers (inventory.model.OutlierRule.as_dict) as a rule; a ledger
    written before profiles had the key, or a profile without it, gets the defaults."""
    given = profile.get("outliers") or {}
    defaults = DEFAULT_OUTLIER_RULE
    return OutlierRule(z=float(given.get("z", defaults.z)),
                       min_deviation=float(given.get("min_deviation", defaults.min_deviation)),
                       min_nodes=int(given.get("min_nodes", defaults.min_nodes)),
                       fail=tuple(given.get("fail") or ()), ignore=tuple(given.get("ignore") or ()))


def outliers(checks: list[dict], rule: OutlierRule = DEFAULT_OUTLIER_RULE) -> list[dict]:
    """Per-node figures far from the same figure of their peers, on the side that is bad for
    the metric, worst first: a node inside its band can still be the slow one of its fleet.

    Robust, so the outliers themselves do not move the yardstick: the median of the nodes and
    their MAD (median absolute deviation, scaled by 1.4826 to read like a standard deviation
    on normal data). A node is named when its robust z is above rule.z and it is more than
    rule.min_deviation from the median (a fraction of it): in a tight fleet the MAD is tiny
    and z alone would name noise; in a spread-out one z keeps a 10% miss from counting.
    Every node that measured the metric counts, passed or not, and at least rule.min_nodes of
    them are needed for a median worth comparing with. The bad side is the one the band
    bounds (a floor: low is bad; a ceiling: high is bad); without a band, or with both bounds,
    the unit says it (a rate, per second: low; a time: high); else a band's two sides are, and
    a metric without a band or a telling unit (a count of retransmits) is not judged.
    rule.ignore names metrics that are not judged at all.
    """
    groups: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for entry in checks:
        if entry.get("node") is None:
            continue
        for metric in entry.get("metrics") or []:
            if _finite(metric.get("value")):
                groups.setdefault((entry["check"], metric["name"]), []).append((entry, metric))
    found = []
    for (check, name), measured in groups.items():
        if name in rule.ignore or len({entry["node"] for entry, _ in measured}) < rule.min_nodes:
            continue
        values = [metric["value"] for _, metric in measured]
        median = statistics.median(values)
        if median == 0:
            continue  # no scale to take a fraction of
        spread = MAD_SCALE * statistics.median(abs(value - median) for value in values)
        low_bad, high_bad = _bad_sides([metric for _, metric in measured])
        if not (low_bad or high_bad):
            continue
        unit = next((metric.get("unit") for _, metric in measured if metric.get("unit")), None)
        side = "below" if not high_bad else "above" if not low_bad else "from"
        rule_text = (f"robust z above {rule.z:g} and more than {rule.min_deviation:.0%} {side} the "
                     f"median of {len(measured)} nodes (scaled MAD {spread:.3g}{' ' + unit if unit else ''})")
        for entry, metric in measured:
            deviation = (metric["value"] - median) / abs(median)
            bad = (low_bad and deviation < 0) or (high_bad and deviation > 0)
            if not bad or abs(deviation) <= rule.min_deviation:
                continue
            z = (metric["value"] - median) / spread if spread else None  # None: every peer at the median
            if z is not None and abs(z) <= rule.z:
                continue
            outlier = {"check": check, "metric": name, "node": entry["node"], "value": metric["value"],
                       "unit": metric.get("unit"), "median": median, "deviation": round(deviation, 4),
                       "rule": rule_text, "robust_z": None if z is None else round(z, 2),
                       "severity": "failure" if name in rule.fail else "warning"}
            if entry.get("rail") is not None:
                outlier["rail"] = entry["rail"]
            found.append(outlier)
    return sorted(found, key=lambda o: -abs(o["deviation"]))


def _bad_sides(metrics: list[dict]) -> tuple[bool, bool]:
    """(low is bad, high is bad) for a metric: from its band, else from its unit."""
    bands = [metric.get("band") or [None, None] for metric in metrics]
    floor = any(band[0] is not None for band in bands)
    ceiling = any(band[1] is not None for band in bands)
    if floor != ceiling:
        return floor, ceiling
    unit = next((metric.get("unit") for metric in metrics if metric.get("unit")), "") or ""
    if unit.endswith("/s") or unit in RATE_UNITS:
        return True, False
    if unit in TIME_UNITS:
        return False, True
    return floor, ceiling  # both bounds: both sides; no band and a unit that says nothing: neither


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def write_results(results: dict, run_dir: Path) -> Path:
    """Write results.json, checked against its schema first: a consumer may rely on the schema.
    Compact, one document: indented, a thousand-node run's file was half white space and took
    the pure-Python encoder (`jq .` shows it indented)."""
    validate_results(results)
    return write_atomically(Path(run_dir) / RESULTS_FILE, json.dumps(results, separators=(",", ":")) + "\n")


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
    return write_atomically(Path(run_dir) / METRICS_CSV, pd.DataFrame(rows, columns=columns).to_csv(index=False))
