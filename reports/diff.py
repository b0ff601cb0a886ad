"""Two runs of a cluster side by side: what failed anew, what was fixed, which figures moved.

`handover diff OLD_RUN NEW_RUN` reads each run directory's results.json (or builds it from the
ledger when there is none, e.g. after Ctrl-C) and compares checks by test id, so a node's check
(and rail) is compared with itself. Something got worse when the verdict fell, a check fails
that did not, a node's status became failed, a node of the old run is missing from the new one,
a metric left its band, or a metric moved by more than the threshold on the side its band
bounds (a floor: down is worse; a ceiling: up is worse). A waived failure is listed, but, as for
the gate, it is not worse. The document diff_runs() returns is what `--json` prints.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from reports.hostlists import counted, hostlist_of
from reports.ledger import LedgerError, read_ledger
from reports.results import RESULTS_FILE, build_results
from reports.schema import SchemaError, validate_results
from reports.verdict import CERTIFIED, FAILED_OUTCOMES, INCOMPLETE, NOT_CERTIFIED, masked_node_words

DEFAULT_THRESHOLD = 0.1
STATUS_RANK = {CERTIFIED: 0, INCOMPLETE: 1, NOT_CERTIFIED: 2}


class DiffError(Exception):
    """A run that cannot be compared; str() is one line naming the directory or file."""


def load_run(run_dir: Path) -> dict:
    """A run's results.json, checked against its schema; built from the ledger when absent."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DiffError(f"{run_dir}: no such run directory")
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        try:
            return build_results(read_ledger(run_dir))[0]
        except LedgerError as error:
            raise DiffError(str(error)) from None
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DiffError(f"{path}: not a readable results document ({error})") from None
    try:
        validate_results(results, source=str(path))
    except SchemaError as error:
        raise DiffError(str(error)) from None
    return results


def state(check: Optional[dict]) -> Optional[str]:
    """passed, skipped, failed (errors too), waived, or None for a check the run does not have."""
    if check is None:
        return None
    if check.get("outcome") in FAILED_OUTCOMES:
        return "waived" if isinstance(check.get("waived"), dict) else "failed"
    return str(check.get("outcome"))


def diff_runs(old: dict, new: dict, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """The differences from `old` to `new` (results documents), each judged better or worse."""
    old_checks = {c["test_id"]: c for c in old.get("checks") or []}
    new_checks = {c["test_id"]: c for c in new.get("checks") or []}
    new_failures, fixed = [], []
    for test_id, check in new_checks.items():
        before, after = state(old_checks.get(test_id)), state(check)
        if (after == "failed" and before != "failed") or (after == "waived" and before not in ("failed", "waived")):
            new_failures.append({**_identity(check), "before": before, "after": after,
                                 "kind": check.get("kind"), "message": _first_line(check.get("message")),
                                 "action": check.get("action") or "", "worse": after == "failed"})
        elif after == "passed" and before in ("failed", "waived"):
            fixed.append({**_identity(check), "before": before, "after": after,
                          "kind": old_checks[test_id].get("kind")})
    metrics = [moved for test_id, check in new_checks.items() if test_id in old_checks
               for moved in _metrics(old_checks[test_id], check, threshold)]

    old_status = {n["name"]: n["status"] for n in old.get("nodes") or []}
    new_status = {n["name"]: n["status"] for n in new.get("nodes") or []}
    old_nodes = list((old.get("run") or {}).get("nodes") or [])
    new_nodes = list((new.get("run") or {}).get("nodes") or [])
    old_node_set, new_node_set = set(old_nodes), set(new_nodes)  # searching the lists grew with nodes x nodes
    nodes = {
        "failed": [n for n in new_nodes if new_status.get(n) == "failed" and old_status.get(n, "failed") != "failed"],
        "fixed": [n for n in new_nodes if new_status.get(n) == "passed" and old_status.get(n) in ("failed", "waived")],
        "added": [n for n in new_nodes if n not in old_node_set],
        "missing": [n for n in old_nodes if n not in new_node_set],
    }
    verdict_old = (old.get("verdict") or {}).get("status")
    verdict_new = (new.get("verdict") or {}).get("status")
    verdict = {"old": verdict_old, "new": verdict_new,
               "worse": STATUS_RANK.get(str(verdict_new), 2) > STATUS_RANK.get(str(verdict_old), 2)}
    worse = (verdict["worse"] or any(f["worse"] for f in new_failures) or bool(nodes["failed"])
             or bool(nodes["missing"]) or any(m["worse"] for m in metrics))
    return {"old": _run(old), "new": _run(new), "threshold": threshold, "verdict": verdict,
            "new_failures": new_failures, "fixed": fixed, "nodes": nodes, "metrics": metrics,
            "worse": worse}


def _run(results: dict) -> dict:
    run = results.get("run") or {}
    return {"run_id": run.get("run_id"), "report_id": run.get("report_id"), "cluster": run.get("cluster"),
            "status": (results.get("verdict") or {}).get("status")}


def _identity(check: dict) -> dict:
    found = {"test_id": check["test_id"], "check": check.get("check"), "node": check.get("node")}
    if check.get("rail") is not None:
        found["rail"] = check["rail"]
    return found


def _metrics(old: dict, new: dict, threshold: float) -> list[dict]:
    """A check's metrics that left or re-entered their band, or moved by more than threshold."""
    before = {m["name"]: m for m in old.get("metrics") or []}
    found = []
    for metric in new.get("metrics") or []:
        previous = before.get(metric["name"])
        if previous is None:
            continue
        old_value, new_value = previous.get("value"), metric.get("value")
        old_ok, new_ok = previous.get("ok"), metric.get("ok")
        change = None
        if _finite(old_value) and _finite(new_value) and old_value != 0:
            change = round((new_value - old_value) / abs(old_value), 4)
        if old_ok is True and new_ok is False:
            why, direction = "left its band", "worse"
        elif old_ok is False and new_ok is True:
            why, direction = "back in its band", "better"
        elif change is not None and abs(change) > threshold:
            why, direction = f"moved more than {threshold:.0%}", _direction(metric, change)
        else:
            continue
        found.append({**_identity(new), "metric": metric["name"], "unit": metric.get("unit"),
                      "old": old_value, "new": new_value, "change": change, "criterion": metric.get("criterion"),
                      "why": why, "direction": direction, "worse": direction == "worse"})
    return found


def _direction(metric: dict, change: float) -> str:
    """worse or better by the side the band bounds; unknown for a band with both bounds or none."""
    band = metric.get("band") or [None, None]
    floor, ceiling = band[0] is not None, band[1] is not None
    if floor == ceiling:
        return "unknown"
    return "worse" if (change < 0) == floor else "better"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _first_line(value) -> str:
    lines = str(value or "").strip().splitlines()
    return lines[0] if lines else ""


# ---------------------------------------------------------------------------------------------
# For a terminal


def _where(items: list[dict]) -> str:
    """The node (or the nodes, by hostlist and count) and the rail of alike items."""
    rail = items[0].get("rail")
    where = counted([item.get("node") or "cluster" for item in items])
    return f"{where} rail {rail}" if rail is not None else where


def _alike(items: list[dict], fleet: bool, *fields: str) -> list[list[dict]]:
    """Each item alone; in a fleet, items of other nodes alike in `fields` and in their message
    but for the node's own words (masked_node_words) together, in first-seen order."""
    if not fleet:
        return [[item] for item in items]
    groups: dict[tuple, list[dict]] = {}
    for item in items:
        message = masked_node_words(str(item.get("message") or ""), str(item.get("node") or ""))
        key = (item.get("node") is None and item["test_id"], *(item.get(name) for name in fields), message)
        groups.setdefault(key, []).append(item)
    return list(groups.values())


def _number(value) -> str:
    return f"{value:g}" if _finite(value) else "none"


def render_text(diff: dict, fleet: bool = False) -> str:
    """The differences as a person reads them in a terminal, the worse ones marked. In a fleet
    (more than FLEET_NODES nodes), the nodes that changed alike share a line, named by hostlist:
    a rack lost is a line per check, not 44,000; each item stays in --json."""
    lines = []
    for side in ("old", "new"):
        run = diff[side]
        lines.append(f"{side}: {run['report_id'] or run['run_id']} ({run['cluster']}): {run['status']}")
    verdict = diff["verdict"]
    if verdict["old"] != verdict["new"]:
        lines.append(f"verdict: {verdict['old']} -> {verdict['new']}" + (" (worse)" if verdict["worse"] else ""))
    if diff["new_failures"]:
        lines.append(f"new failures ({len(diff['new_failures'])}):")
        for items in _alike(diff["new_failures"], fleet, "check", "rail", "before", "after", "kind", "action"):
            item = items[0]
            lines.append(f"  {_where(items)} · {item['check']}: {item['before'] or 'no result'} -> {item['after']} "
                         f"({item['kind']}): {item['message']}" + ("" if item["worse"] else " (waived)"))
            if item["action"] and item["worse"]:
                lines.append(f"    next: {item['action']}")
    if diff["fixed"]:
        lines.append(f"fixed ({len(diff['fixed'])}):")
        lines += [f"  {_where(items)} · {items[0]['check']}: {items[0]['before']} ({items[0]['kind']}) -> passed"
                  for items in _alike(diff["fixed"], fleet, "check", "rail", "before", "kind")]
    nodes = diff["nodes"]
    said = [f"{label} {hostlist_of(nodes[key])}" for key, label in
            (("failed", "failed"), ("fixed", "fixed"), ("added", "added"), ("missing", "missing"))
            if nodes[key]]
    if said:
        lines.append("nodes: " + "; ".join(said) + (" (missing is worse)" if nodes["missing"] else ""))
    if diff["metrics"]:
        lines.append(f"metrics ({len(diff['metrics'])}):")
        for items in _alike(diff["metrics"], fleet, "check", "rail", "metric", "unit", "why", "direction", "criterion"):
            lines.append(_metric_line(items))
    if not (diff["new_failures"] or diff["fixed"] or said or diff["metrics"]) and verdict["old"] == verdict["new"]:
        lines.append("no differences")
    lines.append("something got worse" if diff["worse"] else "nothing got worse")
    return "\n".join(lines) + "\n"


def _metric_line(items: list[dict]) -> str:
    """'gpu001 · stress_ng · stress_cpu: 100 -> 65 bogo-ops/s (-35.0%): moved more than 10% (worse)';
    for alike nodes, the range of their changes and the one that moved most."""
    changes = [item["change"] for item in items if item["change"] is not None]
    most = max(items, key=lambda item: abs(item["change"]) if item["change"] is not None else -1.0)
    figures = f"{_number(most['old'])} -> {_number(most['new'])} {most['unit'] or ''}".rstrip()
    if len(items) == 1:
        said = figures + (f" ({most['change']:+.1%})" if most["change"] is not None else "")
    else:
        spread = f"{min(changes):+.1%} to {max(changes):+.1%}, " if changes else ""
        said = f"{spread}the most {most['node']}: {figures}"
    band = f" {most['criterion']}" if most["criterion"] and "band" in most["why"] else ""
    direction = f" ({most['direction']})" if most["direction"] != "unknown" else ""
    return f"  {_where(items)} · {most['check']} · {most['metric']}: {said}: {most['why']}{band}{direction}"
