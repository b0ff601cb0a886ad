"""Render results.json (schema handover.results/1) into one self-contained HTML report.

The report is signed and attached to contracts, so it loads nothing from anywhere, prints
well, and renders the same bytes for the same results (no "generated at" timestamp). Every
string in the results is untrusted: the Jinja environment autoescapes everything, and this
module only hands the template plain values and numbers, never markup.

A failure the inventory waived (results.json marks it `waived`) has a state of its own here,
"waived": it is drawn as waived in the matrix, listed in its own section with the waiver's
reason and owner, and never counted or drawn as passed, nor as a failure to act on.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Optional, Union

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from inventory.model import place_by
from reports.bundle import BUNDLE_SIGNED, CHECKSUMS_FILE, REPORT_FILE
from reports.curves import CurveChart, build_curves, nice_ticks
from reports.files import write_atomically
from reports.hostlists import counted, hostlist_of
from reports.retest import addendum_view
from reports.soak_view import SoakTable, soak_table
from reports.verdict import FLEET_NODES, alike, masked_node_words

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "report.html.j2"

AREA_ORDER = ("system", "hardware", "network", "storage", "hpc", "training")
# Worst first: a matrix cell holding several results shows the worst of them.
OUTCOME_RANK = {"error": 5, "failed": 4, "waived": 3, "skipped": 2, "passed": 1}
RESULT_OUTCOMES = ("passed", "failed", "skipped", "error")  # what results.json may say
FAILED_OUTCOMES = ("failed", "error")
SYMBOLS = {"passed": "✓", "failed": "✗", "error": "!", "waived": "W", "skipped": "–", "missing": "?"}
SIGN_OFF_ROLES = (("engineer", "Operator engineer"), ("customer", "Customer"))
VERDICT_CLASSES = {"CERTIFIED": "certified", "NOT CERTIFIED": "not-certified",
                   "INCOMPLETE": "incomplete"}
CLUSTER_ROW = "cluster"
TOOLTIP_CHARS = 400
# Above FLEET_NODES nodes (reports.verdict) the report summarises: alike nodes share a matrix
# row, metrics are histograms with their worst nodes listed; every node's detail is a search away.
OUTLIERS_NAMED = 6  # a metric's outliers named above its chart; the rest are in the outliers table
FLEET_WORST = 10  # a fleet's metric table: the failures and outliers, and this many worst margins
BANNER_REASONS = 8
BANNER_WARNINGS = 5
NODE_REASONS = 8  # a node's reasons in the attention table (an unreachable node has one per check)
BANNER_CHARS = 240  # a long reason is cut in the banner, whole in the list below
SIGNATURE_NAMESPACE = "handover"

_SHELL_SAFE = re.compile(r"[A-Za-z0-9@._+/=:-]+")
_CONTROL_CHARS = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# The page's one script, the node search; the policy allows it, and the data block it reads, by hash.
NODE_SEARCH_SCRIPT = (TEMPLATE_DIR / "node_search.js").read_text(encoding="utf-8")
NODE_MESSAGE_CHARS = 200
NODE_NAME_MARK = "\0"  # stands for the node's own name in the node search's reasons and messages
_SCRIPT_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"))

_environment = Environment(loader=FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                           undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                           keep_trailing_newline=True)
_environment.filters["thousands"] = "{:,}".format  # 1,024 nodes, as every other line names them
_environment.filters["hostlist"] = hostlist_of


def render_html(results: dict) -> str:
    """One complete HTML document for a results dict; pure, so the same input gives the same bytes."""
    view = build_view(results)
    page = {"script": Markup(NODE_SEARCH_SCRIPT), "node_data": Markup(view.node_data),
            "script_sources": " ".join(_csp_hash(inline) for inline in (NODE_SEARCH_SCRIPT, view.node_data))}
    return _environment.get_template(TEMPLATE).render(report=view, page=page)


def _csp_hash(inline: str) -> str:
    """A Content-Security-Policy source that allows exactly this inline script."""
    return f"'sha256-{base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()}'"


def write_html(results: dict, path: Union[str, Path]) -> Path:
    """Write the report as UTF-8 bytes exactly as rendered, so the signature covers what is read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, render_html(results))


# ---------------------------------------------------------------------------------------------
# Formatting


def text(value) -> str:
    """A printable string: ANSI colour codes and control characters from tool output removed."""
    if value is None:
        return ""
    value = str(value)
    return value if value.isprintable() else _CONTROL_CHARS.sub("", value)


def format_number(value) -> str:
    """Three significant digits; whole numbers (counts, exact sizes) are kept exact below 10^6."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return text(value)
    number = float(value)
    if not math.isfinite(number):
        return str(number)
    if number == int(number) and abs(number) < 1e6:
        return f"{int(number):,}"
    magnitude = math.floor(math.log10(abs(number)))
    if magnitude >= 6 or magnitude < -3:
        return f"{number:.3g}"
    decimals = 2 - magnitude
    return f"{round(number, decimals):,.{max(decimals, 0)}f}"


def format_margin(margin) -> str:
    """A margin (fraction of the reference value) as a signed percentage."""
    if margin is None or not isinstance(margin, (int, float)):
        return "—"
    percent = format_number(abs(margin) * 100)
    return f"{'-' if margin < 0 else '+'}{percent}%"


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{format_number(seconds)} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _parse_time(value) -> Optional[datetime]:
    try:
        return datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None


def _tooltip(lines: list[str]) -> str:
    return _cut("\n".join(lines), TOOLTIP_CHARS)


def _cut(line: str, chars: int) -> str:
    return line if len(line) <= chars else line[: chars - 1] + "…"


# ---------------------------------------------------------------------------------------------
# View model: what the template shows, already ordered, formatted and counted.


@dataclass
class Cell:
    state: str  # passed | failed | error | skipped | missing | blank (not applicable)
    symbol: str = ""
    tooltip: str = ""
    anchor: str = ""
    outlier: bool = False  # a figure of this check on this node stands out from its peers'


@dataclass
class MatrixRow:
    label: str
    is_cluster: bool
    status: str
    cells: list[Cell]
    warnings: list[str] = field(default_factory=list)  # the node's outliers, one line each
    rows: list[int] = field(default_factory=list)  # the layout rows it stands for: several when collapsed

    @property
    def count(self) -> int:
        return len(self.rows)


@dataclass
class Column:
    check: str
    area: str
    failed: int = 0


@dataclass
class Matrix:
    areas: list[tuple[str, int]]  # (area, number of columns), in column order
    columns: list[Column]
    rows: list[MatrixRow]

    @property
    def print_zoom(self) -> float:
        """The scale that fits the matrix on a printed page (a column a check: 56 are 1,610 px)."""
        return print_zoom(MATRIX_FIXED_PX + MATRIX_COLUMN_PX * len(self.columns))


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    state: str  # ok | fail | none | outlier (within its band or unjudged, far from its peers)
    tooltip: str


@dataclass
class Plot:
    """A bar chart's frame: its size in pixels, the plotting area inside it, and its bars."""

    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    bars: list[Bar]


@dataclass
class Chart(Plot):
    band: Optional[tuple[float, float]]  # (y top, y bottom) of the accepted band
    reference_y: Optional[float]
    ticks: list[tuple[float, str]]
    labels: list[tuple[float, str]]  # node names under the bars, every n-th when crowded
    caption: str  # the prefix cut from crowded labels (gpu-h100-01 -> 01), if any
    title: str
    kind: str = "bars"


@dataclass
class MetricRow:
    name: str
    node: str
    is_cluster: bool
    value: str
    criterion: str
    margin: str
    source: str
    ok: Optional[bool]
    anchor: str


@dataclass
class MetricView:
    key: str
    check: str
    name: str
    unit: str
    rows: list[MetricRow]
    count: int
    failed: int
    low: str
    median: str
    high: str
    criterion: str
    sources: list[str]
    outliers: list[str]  # "node5: 0.19 Gb/s (-94% vs the median, robust z -13.6)"
    chart: Optional[Union[Chart, "Histogram"]]
    outlier_rule: str = ""  # the rule that named them, as results.json says it
    outliers_more: int = 0  # outliers beyond the OUTLIERS_NAMED worst, in the outliers table
    hidden: int = 0  # nodes left out of a fleet's table: within the band, not outliers, not the worst


@dataclass
class Failure:
    anchor: str
    where: str
    is_cluster: bool
    check: str
    area: str
    outcome: str
    kind: str
    message: str
    log_excerpt: str
    test_id: str
    duration: str
    finished: str
    raw: list[str]
    metrics: list[MetricRow]
    action: str = ""
    # a fleet's failures of a check alike but for their node's own words are one block: `nodes`
    # is then their hostlist, `count` how many, and the details are those of `shown`, the first
    count: int = 1
    nodes: str = ""
    shown: str = ""


@dataclass
class Waived:
    """A failure the inventory waived: the failure as recorded, and the waiver beside it."""

    anchor: str
    where: str
    check: str
    kind: str
    message: str
    reason: str
    owner: str
    expires: str


@dataclass
class AreaFailure:
    """Failures of one check alike in kind and action, on the nodes listed."""

    check: str
    kind: str
    where: str  # the nodes, as a hostlist
    count: int
    message: str  # the first one's first line
    action: str
    anchor: str  # the first one's details
    waived: bool = False
    checks: int = 1  # checks named in `check`, when alike failures of several are one line


@dataclass
class AreaSummary:
    area: str
    status: str  # failed | waived | passed | skipped (nothing but skips)
    counts: dict  # outcome -> number of checks
    failures: list[AreaFailure]  # the failures first, then the waived ones


@dataclass
class Place:
    """The nodes the inventory places in one rack (or under one leaf), in run order, each a
    square of its status: a rack that lost power or cooling is a row of red."""

    name: str
    nodes: list[tuple[str, str]]  # (node, status)

    @property
    def passed(self) -> int:
        return sum(status == "passed" for _, status in self.nodes)


@dataclass
class Skip:
    """Checks skipped alike on the nodes listed (the message is the first one's)."""

    anchor: str
    where: str
    check: str
    kind: str
    message: str
    count: int = 1


@dataclass
class Count:
    label: str
    value: int
    state: str


@dataclass
class HeatCell:
    state: str  # ok | low | fail | broken | skipped | none | self
    label: str  # the figure, shown in the cell when the matrix is small
    tooltip: str
    anchor: str = ""


@dataclass
class HeatRow:
    node: str
    cells: list[HeatCell]
    bad: int  # cells of this node that failed or are low
    measured: int  # cells of this node with an outcome


@dataclass
class Heatmap:
    key: str
    check: str
    rail: Optional[str]
    metric: str
    unit: str
    criterion: str
    median: str
    nodes: list[str]
    rows: list[HeatRow]
    compact: bool  # too many nodes to print figures in the cells
    counts: dict  # state -> number of pairs
    matrix: bool = True  # node x node; False for a fleet: only the nodes with bad pairs
    unmeasured: list[str] = field(default_factory=list)  # nodes whose own check measured no pair

    @property
    def print_zoom(self) -> float:
        """The scale that fits the node x node matrix on a printed page (a fleet's list fits)."""
        if not self.matrix:
            return 1.0
        cell = HEAT_CELL_PX[self.compact]
        return print_zoom(HEAT_FIXED_PX + (cell + 1) * len(self.nodes))


@dataclass
class OutlierRow:
    """One outlier as results.json decided it, formatted for the outliers table."""

    node: str
    check: str
    metric: str
    value: str
    median: str
    deviation: str
    robust_z: str
    severity: str  # warning | failure
    rule: str
    anchor: str  # the metric's section
    name: str = ""  # the node alone (node may name a rail too), for the node search


@dataclass
class PairSection:
    heatmaps: list[Heatmap]
    tools_without_pairs: list[str]  # pair tools (rails) no node measured a pair with, and why
    attribution: Optional[dict]  # the attribution check's outcome and message
    low_percent: str = ""  # how far from the median a figure is amber, e.g. "25%"


@dataclass
class View:
    title: str
    cluster: str
    profile: str
    profile_description: str
    run_id: str
    verdict: str
    verdict_class: str
    banner_reasons: list[str]
    reasons: list[str]
    interrupted: bool
    node_counts: list[Count]
    check_counts: list[Count]
    matrix: Matrix
    symbols: dict
    attention_nodes: list[dict]
    metrics: list[MetricView]
    failures: list[Failure]
    skips: list[Skip]
    provenance: dict
    tools: list[dict]
    signer: Optional[dict]
    pairs: Optional[PairSection] = None
    schema: str = ""
    curves: list[CurveChart] = field(default_factory=list)
    report_id: str = ""
    cluster_id: str = ""
    areas: list[AreaSummary] = field(default_factory=list)
    waived: list[Waived] = field(default_factory=list)
    waivers: list[dict] = field(default_factory=list)  # as the inventory declared them
    sign_off: list[dict] = field(default_factory=list)  # [{role, name}], name "" for a blank line
    warnings: list[str] = field(default_factory=list)  # results.json's verdict.warnings
    soak: Optional[SoakTable] = None  # results.json's soak section, worst first
    banner_warnings: list[str] = field(default_factory=list)  # the first BANNER_WARNINGS of them
    outliers: list[OutlierRow] = field(default_factory=list)
    addendum: Optional[dict] = None  # a re-test: the report it completes, original -> re-test per check
    expect_overrides: list[dict] = field(default_factory=list)  # the inventory's changes to profile.expect
    unlocked: list[dict] = field(default_factory=list)  # [{nodes, reason}]: tested without their node lock
    dropped: list[dict] = field(default_factory=list)  # [{nodes, reason}]: stopped answering, then came back
    node_reasons: int = NODE_REASONS
    fleet_nodes: int = FLEET_NODES
    fleet_worst: int = FLEET_WORST
    search_example: str = ""  # a node name and a hostlist of this run, for the search box
    node_data: str = "{}"  # every node's results, compact JSON for the node search (see _node_data)
    place_level: str = ""  # "rack" or "leaf": what `places` groups by; "" where the inventory places no nodes
    places: list[Place] = field(default_factory=list)

    @property
    def warning_count(self) -> str:
        """"3 warnings", beside the status; "" without any."""
        count = len(self.warnings)
        return f"{count} warning{'s' if count != 1 else ''}" if count else ""


def build_view(results: dict) -> View:
    """Order, count and format the results for the template (no markup is produced here)."""
    run = results.get("run") or {}
    verdict = results.get("verdict") or {}
    checks = list(results.get("checks") or [])
    node_entries = list(results.get("nodes") or [])
    layout = _layout(run, node_entries, checks)
    fleet = len(layout.nodes) > FLEET_NODES
    status_of = {text(n.get("name")): text(n.get("status")) for n in node_entries}
    status_of[CLUSTER_ROW] = text(verdict.get("cluster_checks"))

    status = text(verdict.get("status")) or "INCOMPLETE"
    reasons = [text(r) for r in verdict.get("reasons") or []]
    cluster = text(run.get("cluster")) or "unnamed cluster"
    standing_out = [o for o in results.get("outliers") or [] if isinstance(o, dict)]
    skips, skip_anchors = _skips(checks, layout)
    failures, failure_anchors = _failures(checks, layout, fleet=fleet)
    layout.anchors = {**{i: f"waived-{i}" for i, check in enumerate(checks) if _outcome(check) == "waived"},
                      **failure_anchors, **skip_anchors}
    metrics = _metrics(checks, layout, standing_out)
    node_warnings: dict[str, list[str]] = {}
    for outlier in standing_out:
        node_warnings.setdefault(text(outlier.get("node")), []).append(_outlier_text(outlier))
    return View(
        soak=soak_table(results, shown=FLEET_WORST if fleet else None),
        title=f"{cluster}: {status} — handover report {text(run.get('run_id'))}",
        cluster=cluster,
        profile=text(run.get("profile")),
        profile_description=text(run.get("profile_description")),
        run_id=text(run.get("run_id")),
        verdict=status,
        verdict_class=VERDICT_CLASSES.get(status, "unknown"),
        banner_reasons=[_cut(reason, BANNER_CHARS) for reason in reasons[:BANNER_REASONS]],
        reasons=reasons,
        interrupted=bool(run.get("interrupted")),
        node_counts=_node_counts(node_entries),
        check_counts=_check_counts(checks),
        matrix=_matrix(checks, layout, status_of, standing_out, node_warnings),
        symbols=SYMBOLS,
        attention_nodes=_attention(node_entries, node_warnings, fleet=fleet),
        metrics=metrics,
        failures=failures,
        skips=skips,
        provenance=_provenance(run),
        tools=_tools(run.get("tools") or []),
        signer=_signer(results.get("signer")),
        pairs=_pair_section(checks, layout, _number(run.get("pair_low_fraction"))),
        schema=text(results.get("schema")),
        curves=build_curves(checks, lambda check: text(_where(check)), format_number),
        report_id=text(run.get("report_id")),
        cluster_id=text(run.get("cluster_id")),
        areas=_areas(checks, layout),
        waived=_waived(checks, layout),
        waivers=_waivers(run.get("waivers") or []),
        sign_off=[{"role": label, "name": text((run.get("sign_off") or {}).get(role))}
                  for role, label in SIGN_OFF_ROLES],
        warnings=[text(w) for w in verdict.get("warnings") or []],
        banner_warnings=[text(w) for w in verdict.get("warnings") or []][:BANNER_WARNINGS],
        outliers=_outlier_rows(standing_out, metrics),
        addendum=addendum_view(results, text, fleet=fleet),
        expect_overrides=_expect_overrides(run.get("expect_overrides") or []),
        unlocked=_nodes_saying([(u.get("node"), u.get("reason")) for u in run.get("unlocked") or []
                                if isinstance(u, dict)], fleet=fleet),
        dropped=_nodes_saying([(d.get("node"), _dropped_words(d)) for d in run.get("dropped") or []
                               if isinstance(d, dict)], fleet=fleet),
        search_example=("" if not layout.nodes else f"e.g. {layout.nodes[0]}" if len(layout.nodes) == 1
                        else f"e.g. {layout.nodes[-1]} or {hostlist_of(layout.nodes[:2])}"),
        node_data=_node_data(checks, layout, node_entries, node_warnings),
        **_places(node_entries),
    )


# Printing: an A4 or Letter page's width inside the report's 12 mm margins, in CSS pixels; a
# table wider than that is scaled to it (the matrix and heatmap's column widths are fixed in
# the template's CSS), or the browser would cut its right side off and shrink every page.
PRINT_WIDTH_PX = 700
MATRIX_FIXED_PX = 170 + 96 + 4  # the node and status columns, borders
MATRIX_COLUMN_PX = 24
HEAT_FIXED_PX = 166 + 48  # the row's node name, its count of bad pairs
HEAT_CELL_PX = {False: 40, True: 11}  # by Heatmap.compact


def print_zoom(width_px: int) -> float:
    """The CSS zoom that fits width_px on a printed page: 1 when it fits, else down to two places."""
    return 1.0 if width_px <= PRINT_WIDTH_PX else math.floor(PRINT_WIDTH_PX / width_px * 100) / 100


NOT_PLACED = "not placed"


def _places(node_entries: list[dict]) -> dict:
    """The nodes by rack, or by leaf (results.json nodes[].rack, .leaf; inventory.model.place_by
    chooses), places in the order their first node runs; nothing where neither tells them apart."""
    level, place_of = place_by({text(entry.get("name")): entry for entry in node_entries})
    if not level:
        return {}
    by_place: dict[str, list[tuple[str, str]]] = {}
    for entry in node_entries:
        name = text(entry.get("name"))
        by_place.setdefault(text(place_of[name]) or NOT_PLACED, []).append((name, text(entry.get("status"))))
    return {"place_level": level, "places": [Place(place, nodes) for place, nodes in by_place.items()]}


def _attention(node_entries: list[dict], node_warnings: dict[str, list[str]], fleet: bool) -> list[dict]:
    """The nodes that did not pass or have outliers, with why; nodes with the same status and
    reasons and no outlier share a row named by their hostlist (six nodes missing the same six
    mandatory checks are one row of six reasons, not six). In a fleet, reasons alike but for the
    node's own words (masked_node_words) are the same, the first node's standing for all."""
    alike: dict[tuple, list[tuple[str, list[str]]]] = {}
    for entry in node_entries:
        name = text(entry.get("name"))
        if entry.get("status") == "passed" and name not in node_warnings:
            continue
        reasons = [text(r) for r in entry.get("reasons") or []]
        likeness = tuple(masked_node_words(r, name) for r in reasons) if fleet else tuple(reasons)
        key = (text(entry.get("status")), likeness, name if name in node_warnings else "")
        alike.setdefault(key, []).append((name, reasons))
    return [{"name": found[0][0] if len(found) == 1 else hostlist_of(name for name, _ in found),
             "count": len(found), "status": status, "reasons": found[0][1],
             "warnings": node_warnings.get(found[0][0], []) if outlier else []}
            for (status, _, outlier), found in alike.items()]


def _node_data(checks: list[dict], layout: "Layout", node_entries: list[dict],
               node_warnings: dict[str, list[str]]) -> str:
    """Each node's results for the page's node search, as JSON fit for a <script> data block:
    {columns: [check], outcomes: [outcome], metrics: [[name, unit]], texts: [a reason or a
    message's first line, its node's name as NODE_NAME_MARK], nodes: [[name, status, [reason],
    warnings, matrix row, [[column, outcome, rail, message, anchor, [[metric, value, ok]]]]]]},
    names, reasons and messages by their index in the lists, so a thousand nodes' detail stays
    about 2 MB that the browser parses only when asked.
    Its "<", ">" and "&" are JSON escapes, so no string in it can close the block."""
    outcomes = list(OUTCOME_RANK)
    metric_index: dict[tuple[str, str], int] = {}
    # a skip's reason is the same on a thousand nodes: once; so is "gpu0001 unreachable: ..." with
    # the node's name as NODE_NAME_MARK (text() leaves no NUL in a message), put back by the script
    text_index: dict[str, int] = {}

    def said(words: str, node: str) -> int:
        return text_index.setdefault(words.replace(node, NODE_NAME_MARK) if node else words, len(text_index))

    status_of = {text(n.get("name")): n for n in node_entries}
    per_node: dict[int, list] = {}  # matrix row -> its entries
    outcome_index = {outcome: number for number, outcome in enumerate(outcomes)}
    for entry in layout.entries:
        if entry["row"] == layout.cluster_row:
            continue
        index, outcome, check = entry["index"], entry["outcome"], checks[entry["index"]]
        figures = []
        for metric in check.get("metrics") or []:
            key = (text(metric.get("name")), text(metric.get("unit")))
            figures.append([metric_index.setdefault(key, len(metric_index)), _number(metric.get("value")),
                            _ok(metric.get("ok"))])
        anchor = layout.anchor(index)
        rail = check.get("rail")
        message = _first_line(check.get("message"))[:NODE_MESSAGE_CHARS]
        per_node.setdefault(entry["row"], []).append(
            [layout.position[entry["check"]], outcome_index[outcome], None if rail is None else text(rail),
             said(message, layout.nodes[entry["row"]]), anchor, figures])
    nodes = [[name, text((status_of.get(name) or {}).get("status")) or "untested",
              [said(text(r), name) for r in (status_of.get(name) or {}).get("reasons") or []],
              node_warnings.get(name, []), row, sorted(per_node.get(row, []), key=lambda e: e[0])]
             for row, name in enumerate(layout.nodes)]
    document = {"columns": [column.check for column in layout.columns], "outcomes": outcomes,
                "metrics": [list(key) for key in metric_index], "texts": list(text_index), "nodes": nodes}
    encoded = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    for character, escape in _SCRIPT_ESCAPES:
        encoded = encoded.replace(character, escape)
    return encoded


def _outlier_text(outlier: dict) -> str:
    """An outlier in a line: "iperf3 · iperf3_bandwidth 0.19 Gb/s, -94% vs the median 3.02 Gb/s"."""
    unit = text(outlier.get("unit"))
    rail = f" rail {text(outlier.get('rail'))}" if outlier.get("rail") is not None else ""
    return (f"{text(outlier.get('check'))}{rail} · {text(outlier.get('metric'))} "
            f"{_with_unit(_number(outlier.get('value')), unit)}, "
            f"{format_margin(_number(outlier.get('deviation')))} vs the median "
            f"{_with_unit(_number(outlier.get('median')), unit)}"
            + (" (fails)" if outlier.get("severity") == "failure" else ""))


def _outlier_rows(standing_out: list[dict], metrics: list["MetricView"]) -> list[OutlierRow]:
    """The outliers table, in results.json's order (worst first), each linked to its metric."""
    sections = {(view.check, view.name): view.key for view in metrics}
    rows = []
    for outlier in standing_out:
        unit = text(outlier.get("unit"))
        z = _number(outlier.get("robust_z"))
        rail = f" rail {text(outlier.get('rail'))}" if outlier.get("rail") is not None else ""
        rows.append(OutlierRow(
            node=text(outlier.get("node")) + rail, check=text(outlier.get("check")),
            metric=text(outlier.get("metric")), value=_with_unit(_number(outlier.get("value")), unit),
            median=_with_unit(_number(outlier.get("median")), unit),
            deviation=format_margin(_number(outlier.get("deviation"))),
            robust_z="∞ (all others at the median)" if z is None else format_number(z),
            severity="failure" if outlier.get("severity") == "failure" else "warning",
            rule=text(outlier.get("rule")),
            anchor=sections.get((text(outlier.get("check")), text(outlier.get("metric"))), ""),
            name=text(outlier.get("node"))))
    return rows


@dataclass
class Layout:
    """Where each check sits: matrix rows (nodes, then the cluster row) and columns (checks)."""

    nodes: list[str]  # node rows in run order; the cluster row, if any, is at len(nodes)
    row_of: dict[str, int]
    entries: list[dict]  # one per check entry: index, row, check, area, outcome, rank
    columns: list[Column]
    position: dict[str, int]  # check name -> column number
    # check entry -> the id of the block below that details it (a failure, a waived failure, a
    # skip; alike ones share a block), once build_view has made the blocks
    anchors: dict[int, str] = field(default_factory=dict)

    @property
    def cluster_row(self) -> int:
        return len(self.nodes)

    def row(self, check: dict) -> int:
        node = check.get("node")
        return self.cluster_row if node is None else self.row_of[text(node)]

    def label(self, row: int) -> str:
        return CLUSTER_ROW if row == self.cluster_row else self.nodes[row]

    def anchor(self, index: int) -> str:
        """The id of the block that details check entry `index`; "" for one without (a pass)."""
        return self.anchors.get(index, "")

    def order(self, index: int, check: dict) -> tuple:
        """Reading order for per-check sections: node rows as in the matrix, then its columns."""
        position = self.position.get(text(check.get("check")) or "unnamed", 0)
        return (self.row(check), position, index)


def _layout(run: dict, node_entries: list[dict], checks: list[dict]) -> Layout:
    """Rows: the selected nodes in run order, then any node only seen in the results."""
    named = [*(run.get("nodes") or []), *(n.get("name") for n in node_entries),
             *(c.get("node") for c in checks)]
    nodes = list(dict.fromkeys(text(name) for name in named if name is not None))
    row_of = {name: row for row, name in enumerate(nodes)}
    records = []
    for index, check in enumerate(checks):
        outcome = _outcome(check)
        node = check.get("node")
        records.append({"index": index, "row": len(nodes) if node is None else row_of[text(node)],
                        "check": text(check.get("check")) or "unnamed",
                        "area": text(check.get("area")) or "other",
                        "outcome": outcome, "rank": OUTCOME_RANK[outcome]})
    columns = _column_order(records)
    return Layout(nodes=nodes, row_of=row_of, entries=records, columns=columns,
                  position={column.check: number for number, column in enumerate(columns)})


def _column_order(entries: list[dict]) -> list[Column]:
    """Checks grouped by area (known areas in pipeline order), each group in first-seen order."""
    firsts: dict[str, tuple[str, int]] = {}  # check -> (area of its first entry, its first index)
    area_first: dict[str, int] = {}
    for entry in entries:
        firsts.setdefault(entry["check"], (entry["area"], entry["index"]))
        area_first.setdefault(entry["area"], entry["index"])
    known = {area: position for position, area in enumerate(AREA_ORDER)}
    ordered = sorted(firsts.items(), key=lambda item: (known.get(item[1][0], len(known)),
                                                       area_first[item[1][0]], item[1][1]))
    return [Column(check=check, area=area) for check, (area, _) in ordered]


def _where(check: dict) -> str:
    """The node (with its rail, for a perftest check), or the cluster."""
    if check.get("node") is None:
        return CLUSTER_ROW
    rail = check.get("rail")
    return text(check.get("node")) + (f" rail {text(rail)}" if rail is not None else "")


def _outcome(check: dict) -> str:
    """The check's outcome, or "waived" for a failure results.json marks waived; anything
    unrecognised counts as an error, so it cannot pass unseen."""
    outcome = check.get("outcome")  # compared as it is: called per check by every section
    if outcome not in RESULT_OUTCOMES:
        return "error"
    if outcome in FAILED_OUTCOMES and isinstance(check.get("waived"), dict):
        return "waived"
    return outcome


def _first_line(value) -> str:
    lines = text(value).strip().splitlines()
    return lines[0] if lines else ""


def _matrix(checks: list[dict], layout: Layout, status_of: dict[str, str],
            standing_out: Optional[list[dict]] = None,
            node_warnings: Optional[dict[str, list[str]]] = None) -> Matrix:
    """standing_out: results.json's outliers, marked on their (node, check) cells;
    node_warnings: each node's outliers as lines, beside its status; a cell links to the block
    that details its worst entry (layout.anchor).

    Beyond FLEET_NODES nodes, nodes without a warning whose status and squares are all alike
    are one row, named by their hostlist (for nodes that did not pass, alike means each square's
    failure is the same block of Failures): the nodes unlike the others first, then alike ones
    that did not pass, then the alike passed ones. A thousand rows of green squares hide the few
    that matter, a rack lost together is one row, and neither costs seconds to load."""
    columns = layout.columns
    # Worst outcome per (row, check); ties go to the earliest entry so the anchor is stable.
    # Plain dicts in one pass: pandas lookups per cell cost seconds at a thousand nodes.
    worst: dict[tuple[int, str], tuple[str, int]] = {}
    members: dict[tuple[int, str], list[int]] = {}
    for entry in layout.entries:
        key = (entry["row"], entry["check"])
        members.setdefault(key, []).append(entry["index"])
        if key not in worst or entry["rank"] > OUTCOME_RANK[worst[key][0]]:
            worst[key] = (entry["outcome"], entry["index"])
    has_cluster_row = any(row == layout.cluster_row for row, _ in worst)
    marked: dict[tuple[int, str], list[str]] = {}
    for outlier in standing_out or []:
        row = layout.row_of.get(text(outlier.get("node")))
        if row is not None:
            marked.setdefault((row, text(outlier.get("check"))), []).append(
                f"outlier: {_outlier_text(outlier)}")
    per_node_checks = {check for row, check in worst if row < layout.cluster_row}
    cluster_checks = {check for row, check in worst if row == layout.cluster_row}
    warnings_of = node_warnings or {}

    def state(row: int, column: Column, is_cluster: bool) -> str:
        key = (row, column.check)
        if key in worst:
            return worst[key][0]
        return "missing" if column.check in (cluster_checks if is_cluster else per_node_checks) else "blank"

    def cells_of(row: int, label: str, is_cluster: bool) -> list[Cell]:
        cells = []
        for column in columns:
            key = (row, column.check)
            if key in worst:
                outcome, first = worst[key]
                tooltip = _tooltip([*marked.get(key, []), *(_cell_line(checks[i], label) for i in members[key])])
                anchor = layout.anchor(first)
                cells.append(Cell(outcome, SYMBOLS[outcome], tooltip, anchor, outlier=key in marked))
            elif column.check in (cluster_checks if is_cluster else per_node_checks):
                cells.append(Cell("missing", SYMBOLS["missing"], f"{label} · {column.check}: no result"))
            else:
                cells.append(Cell("blank"))
        return cells

    def anchor_of(row: int, column: Column) -> str:
        key = (row, column.check)
        return layout.anchor(worst[key][1]) if key in worst else ""

    node_rows = range(len(layout.nodes))
    alike: dict[tuple, list[int]] = {}
    if len(layout.nodes) > FLEET_NODES:
        for row in node_rows:
            label = layout.label(row)
            if warnings_of.get(label) or any((row, column.check) in marked for column in columns):
                continue
            status = status_of.get(label, "")
            states = tuple(state(row, column, False) for column in columns)
            # nodes that did not pass are alike when each square's failure is one block of Failures
            blocks = () if status == "passed" else tuple(anchor_of(row, column) for column in columns)
            alike.setdefault((status, states, blocks), []).append(row)
    collapsed = {row for rows in alike.values() for row in rows if len(rows) > 1}
    matrix_rows = [MatrixRow(layout.label(row), False, status_of.get(layout.label(row), ""),
                             cells_of(row, layout.label(row), False), warnings_of.get(layout.label(row), []),
                             rows=[row])
                   for row in node_rows if row not in collapsed]
    for (status, states, _), rows in sorted(alike.items(), key=lambda item: (item[0][0] == "passed", -len(item[1]))):
        if len(rows) < 2:
            continue
        where = hostlist_of(layout.label(row) for row in rows)
        cells = []
        for outcome, column in zip(states, columns, strict=True):
            anchors = {anchor_of(row, column) for row in rows}
            tooltip = "" if outcome == "blank" else f"{where} · {column.check}: {outcome} on all {len(rows)} nodes"
            cells.append(Cell(outcome, SYMBOLS.get(outcome, ""), tooltip, anchors.pop() if len(anchors) == 1 else ""))
        matrix_rows.append(MatrixRow(where, False, status, cells, rows=rows))
    if has_cluster_row:
        row = layout.cluster_row
        matrix_rows.append(MatrixRow(CLUSTER_ROW, True, status_of.get(CLUSTER_ROW, ""),
                                     cells_of(row, CLUSTER_ROW, True), rows=[row]))
    failed_per_check: dict[str, int] = {}
    for (_, check), (outcome, _) in worst.items():
        if outcome in FAILED_OUTCOMES:
            failed_per_check[check] = failed_per_check.get(check, 0) + 1
    for column in columns:
        column.failed = failed_per_check.get(column.check, 0)

    areas: list[tuple[str, int]] = []
    for column in columns:
        if areas and areas[-1][0] == column.area:
            areas[-1] = (column.area, areas[-1][1] + 1)
        else:
            areas.append((column.area, 1))
    return Matrix(areas=areas, columns=columns, rows=matrix_rows)


def _cell_line(check: dict, label: str) -> str:
    kind = f" ({text(check.get('kind'))})" if check.get("kind") else ""
    message = _first_line(check.get("message"))
    line = f"{label} · {text(check.get('check'))}: {_outcome(check)}{kind}"
    return f"{line} — {message}" if message else line


def _node_counts(node_entries: list[dict]) -> list[Count]:
    statuses = [text(n.get("status")) for n in node_entries]
    counts = [Count("nodes", len(statuses), "total"),
              Count("passed", statuses.count("passed"), "passed"),
              Count("failed", statuses.count("failed"), "failed")]
    if statuses.count("waived"):
        counts.append(Count("waived", statuses.count("waived"), "waived"))
    if statuses.count("incomplete"):
        counts.append(Count("incomplete", statuses.count("incomplete"), "skipped"))
    counts.append(Count("untested", statuses.count("untested"), "missing"))
    return counts


def _check_counts(checks: list[dict]) -> list[Count]:
    outcomes = [_outcome(c) for c in checks]
    counts = [Count("checks", len(outcomes), "total"),
              Count("passed", outcomes.count("passed"), "passed"),
              Count("failed", outcomes.count("failed"), "failed")]
    if outcomes.count("error"):
        counts.append(Count("errors", outcomes.count("error"), "error"))
    if outcomes.count("waived"):
        counts.append(Count("waived", outcomes.count("waived"), "waived"))
    counts.append(Count("skipped", outcomes.count("skipped"), "skipped"))
    return counts


def _failures(checks: list[dict], layout: Layout, fleet: bool) -> tuple[list[Failure], dict[int, str]]:
    """The failed checks in matrix order, and each one's block id. In a fleet, failures of a
    check alike but for the node's own words (its name, address, clock times: PER_NODE_WORDS)
    and with the same figures share a block named by their hostlist: 1,024 nodes lost together
    are one block per check, not 14,000 (each node's own message stays in the node search)."""
    failed = sorted(((i, c) for i, c in enumerate(checks) if _outcome(c) in FAILED_OUTCOMES),
                    key=lambda pair: layout.order(*pair))
    alike: dict[tuple, list[tuple[int, dict]]] = {}
    for index, check in failed:
        per_node = fleet and check.get("node") is not None
        alike.setdefault(_failure_likeness(check) if per_node else (index,), []).append((index, check))
    failures: list[Failure] = []
    anchors: dict[int, str] = {}
    for found in alike.values():
        index, check = found[0]
        anchor = f"fail-{index}"
        anchors.update((member, anchor) for member, _ in found)
        metrics = [_metric_row(check, metric, "") for metric in check.get("metrics") or []]
        rail = check.get("rail")
        nodes = hostlist_of(text(member.get("node")) for _, member in found) if len(found) > 1 else ""
        failures.append(Failure(
            anchor=anchor,
            where=nodes + (f" rail {text(rail)}" if rail is not None else "") if nodes else _where(check),
            is_cluster=check.get("node") is None,
            check=text(check.get("check")),
            area=text(check.get("area")),
            outcome=_outcome(check),
            kind=text(check.get("kind")),
            message=text(check.get("message")).strip(),
            log_excerpt=text(check.get("log_excerpt")).rstrip(),
            test_id=text(check.get("test_id")),
            duration=format_duration(check.get("duration_s")),
            finished=text(check.get("finished")),
            raw=[text(r) for r in check.get("raw") or []],
            metrics=[m for m in metrics if m.ok is False] or metrics,
            action=text(check.get("action")),
            count=len(found),
            nodes=nodes,
            shown=text(check.get("node")) if nodes else "",
        ))
    return failures, anchors


def _failure_likeness(check: dict) -> tuple:
    """What a fleet's alike failures of a check share: outcome, kind, action, rail, figures, and
    message and log with the node's own words masked."""
    node = text(check.get("node"))

    def masked(value) -> str:
        return masked_node_words(text(value).strip(), node)

    figures = tuple((text(m.get("name")), text(m.get("value")), text(m.get("ok"))) for m in check.get("metrics") or [])
    return (text(check.get("check")), _outcome(check), text(check.get("kind")), text(check.get("action")),
            text(check.get("rail")), figures, masked(check.get("message")), masked(check.get("log_excerpt")))


def _waived(checks: list[dict], layout: Layout) -> list[Waived]:
    """The waived failures, in matrix order, each with its waiver."""
    waived = [(i, c) for i, c in enumerate(checks) if _outcome(c) == "waived"]
    return [Waived(anchor=f"waived-{index}", where=_where(check), check=text(check.get("check")),
                   kind=text(check.get("kind")), message=_first_line(check.get("message")),
                   reason=text(check["waived"].get("reason")), owner=text(check["waived"].get("owner")),
                   expires=text(check["waived"].get("expires")) or "no end")
            for index, check in sorted(waived, key=lambda pair: layout.order(*pair))]


def _waivers(waivers: list) -> list[dict]:
    """The inventory's waivers, nodes as a hostlist, with how many failures each waived."""
    return [{"check": text(w.get("check")), "nodes": hostlist_of(text(n) for n in w.get("nodes") or []),
             "reason": text(w.get("reason")), "owner": text(w.get("owner")),
             "expires": text(w.get("expires")) or "no end", "waived": int(_number(w.get("waived")) or 0)}
            for w in waivers if isinstance(w, dict)]


def _expect_overrides(overrides: list) -> list[dict]:
    """The inventory's changes to the profile's expected facts, values as a profile writes them."""
    return [{"key": text(o.get("key")), "profile_value": _fact(o.get("profile_value"), "not declared"),
             "value": _fact(o.get("value"), "not checked"), "reason": text(o.get("reason"))}
            for o in overrides if isinstance(o, dict)]


def _dropped_words(dropped: dict) -> str:
    """One loss a node came back from, in words: its times (UTC, to the second) and why."""
    def at(iso: object) -> str:
        return f"{str(iso)[11:19]} UTC" if isinstance(iso, str) and len(iso) >= 19 else "an unknown time"
    return (f"stopped answering at {at(dropped.get('lost_at'))} ({dropped.get('reason')}); "
            f"answered again at {at(dropped.get('back_at'))}")


def _nodes_saying(pairs: list[tuple[object, object]], fleet: bool) -> list[dict]:
    """A row per (node, reason): nodes tested without their lock, nodes that dropped. In a fleet,
    nodes whose reasons are alike but for their own words share a row, named by hostlist."""
    said = [(text(node), text(reason)) for node, reason in pairs]
    if not fleet:
        return [{"nodes": node, "reason": reason} for node, reason in said]
    return [{"nodes": counted(nodes), "reason": reason} for nodes, reason in alike(said)]


def _fact(value, absent: str) -> str:
    if value is None:
        return absent
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_fact(item, "null") for item in value) + "]"
    return text(value)


def _areas(checks: list[dict], layout: Layout) -> list[AreaSummary]:
    """One summary per area: the areas with failures first, each listing its failures (alike
    ones on their nodes together) before its waived ones; then the areas with waived failures,
    then the rest in pipeline order. One pass over the checks: tens of thousands at 1,024 nodes."""
    counts: dict[str, dict[str, int]] = {}
    failing: dict[str, list[tuple[int, dict, str]]] = {}
    for index, check in enumerate(checks):
        area, outcome = text(check.get("area")) or "other", _outcome(check)
        tally = counts.setdefault(area, {})
        tally[outcome] = tally.get(outcome, 0) + 1
        if outcome in FAILED_OUTCOMES or outcome == "waived":
            failing.setdefault(area, []).append((index, check, outcome))
    summaries = []
    for area, tally in counts.items():
        alike: dict[tuple[bool, str, str, str], list[tuple[int, dict, str]]] = {}
        for found in sorted(failing.get(area, []), key=lambda item: layout.order(item[0], item[1])):
            _, check, outcome = found
            key = (outcome == "waived", text(check.get("check")), text(check.get("kind")), text(check.get("action")))
            alike.setdefault(key, []).append(found)
        failures = [AreaFailure(check=check_name, kind=kind, action=action, waived=waived,
                                where=hostlist_of(dict.fromkeys(text(check.get("node")) or CLUSTER_ROW
                                                              for _, check, _ in found)), count=len(found),
                                message=_first_line(found[0][1].get("message")),
                                anchor=layout.anchor(found[0][0]))
                    for (waived, check_name, kind, action), found in alike.items()]
        failures = _merged_across_checks(failures)
        failures.sort(key=lambda failure: (failure.waived, -failure.count))
        ordered = {outcome: tally[outcome] for outcome in OUTCOME_RANK if outcome in tally}
        failed = sum(tally.get(outcome, 0) for outcome in FAILED_OUTCOMES)
        status = ("failed" if failed else "waived" if tally.get("waived") else
                  "passed" if tally.get("passed") else "skipped")
        summaries.append(AreaSummary(area, status, ordered, failures))
    known = {area: position for position, area in enumerate(AREA_ORDER)}
    rank = {"failed": 0, "waived": 1}
    return sorted(summaries, key=lambda s: (rank.get(s.status, 2), known.get(s.area, len(known))))


def _merged_across_checks(failures: list[AreaFailure]) -> list[AreaFailure]:
    """Failures alike but for their check (the same nodes, kind, action and message: an
    unreachable node fails every check so) in one line that names the checks, not one per check."""
    alike: dict[tuple, list[AreaFailure]] = {}
    for failure in failures:
        alike.setdefault((failure.waived, failure.kind, failure.action, failure.where, failure.message),
                         []).append(failure)
    return [found[0] if len(found) == 1 else
            dataclasses.replace(found[0], check=", ".join(f.check for f in found), checks=len(found),
                                count=sum(f.count for f in found))
            for found in alike.values()]


def _skips(checks: list[dict], layout: Layout) -> tuple[list[Skip], dict[int, str]]:
    """The skipped checks, one row per check, reason and message alike but for the node's own
    words (masked_node_words: a profile that asks for no governor skips it on every node: one
    row, not 1,024), in matrix order; and each skipped entry's row anchor, for the matrix's links."""
    alike: dict[tuple[str, str, str, str], list[tuple[int, dict]]] = {}
    skipped = sorted((entry for entry in layout.entries if entry["outcome"] == "skipped"),
                     key=lambda entry: (entry["row"], layout.position[entry["check"]], entry["index"]))
    for entry in skipped:
        index, check = entry["index"], checks[entry["index"]]
        message = text(check.get("message")).strip()
        node = text(check.get("node"))
        rail = check.get("rail")
        key = (entry["check"], text(check.get("kind")), "" if rail is None else text(rail),
               masked_node_words(message, node))
        alike.setdefault(key, []).append((index, check))
    skips: list[Skip] = []
    anchors: dict[int, str] = {}
    for (name, kind, _, _), found in alike.items():
        anchor = f"skip-{found[0][0]}"
        anchors.update((index, anchor) for index, _ in found)
        where = (_where(found[0][1]) if len(found) == 1 else
                 hostlist_of(dict.fromkeys(text(check.get("node")) or CLUSTER_ROW for _, check in found))
                 + (f" rail {text(found[0][1].get('rail'))}" if found[0][1].get("rail") is not None else ""))
        skips.append(Skip(anchor=anchor, where=where, check=name, kind=kind,
                          message=text(found[0][1].get("message")).strip(), count=len(found)))
    return skips, anchors


# ---------------------------------------------------------------------------------------------
# Metrics


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def band_of(metric: dict) -> tuple[Optional[float], Optional[float]]:
    """The accepted band's absolute bounds, as the check that judged the metric stored them."""
    band = metric.get("band")
    if not isinstance(band, (list, tuple)) or len(band) != 2:
        return None, None
    return _number(band[0]), _number(band[1])


def _ok(value) -> Optional[bool]:
    """A metric's verdict as True, False or None (no reference), whatever container held it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return bool(value)


def _metric_row(check: dict, metric: dict, anchor: str) -> MetricRow:
    reference = metric.get("reference") or {}
    measured = _with_unit(_number(metric.get("value")), text(metric.get("unit")))
    return MetricRow(
        name=text(metric.get("name")),
        node=_where(check),
        is_cluster=check.get("node") is None,
        value=measured,
        criterion=text(metric.get("criterion")) or ("no reference" if not reference else "—"),
        margin=format_margin(_number(metric.get("margin"))),
        source=text(reference.get("source")) or "—",
        ok=_ok(metric.get("ok")),
        anchor=anchor,
    )


def _metric_records(checks: list[dict], layout: Layout) -> dict[tuple[str, str], list[dict]]:
    """(check, metric) -> one record per measurement, with the band's absolute bounds for charts
    and outliers; in first-seen order. Plain dicts: a DataFrame per metric cost seconds at 1,024 nodes."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for index, check in enumerate(checks):
        for position, metric in enumerate(check.get("metrics") or []):
            reference = metric.get("reference") or {}
            low, high = band_of(metric)
            name = (text(check.get("check")) or "unnamed", text(metric.get("name")))
            groups.setdefault(name, []).append({
                "unit": text(metric.get("unit")), "reference_unit": text(reference.get("unit")),
                "row": layout.row(check), "where": _where(check), "index": index,
                "position": position,
                "value": _number(metric.get("value")), "margin": _number(metric.get("margin")),
                "ok": _ok(metric.get("ok")), "low": low, "high": high,
                "reference": _number(reference.get("value")),
            })
    return groups


def _metrics(checks: list[dict], layout: Layout, outliers: list[dict]) -> list[MetricView]:
    """One view per (check, metric), in matrix column order."""
    groups = sorted(_metric_records(checks, layout).items(),
                    key=lambda item: (layout.position.get(item[0][0], 0), item[1][0]["index"]))
    called_out: dict[tuple[str, str], list[dict]] = {}
    for outlier in outliers:
        called_out.setdefault((text(outlier.get("check")), text(outlier.get("metric"))), []).append(outlier)
    return [_metric_view(f"metric-{number}", check_name, metric_name, group, checks, layout,
                         called_out.get((check_name, metric_name), []))
            for number, ((check_name, metric_name), group) in enumerate(groups)]


def _worst_first(entry: dict) -> tuple:
    """Sort key: smallest margin first, failures before unjudged values, then matrix order."""
    margin = entry["margin"]
    known = margin is not None and not math.isnan(margin)
    return (not known, margin if known else 0.0, _ok(entry["ok"]) is not False, entry["row"],
            entry["index"])


def _metric_view(key: str, check_name: str, metric_name: str, group: list[dict],
                 checks: list[dict], layout: Layout, outliers: list[dict]) -> MetricView:
    """The table worst margin first, min/median/max, outliers (results.json's, marked on the
    chart's bars) and a bar chart for one metric."""
    standing_out = {text(o.get("node")) + (f" rail {text(o.get('rail'))}" if o.get("rail") is not None else ""): o
                    for o in outliers}
    records = sorted(group, key=_worst_first)
    if len(records) > FLEET_NODES:  # a fleet: the failures, the outliers, then the worst others
        named = [entry for entry in records if _ok(entry["ok"]) is False or entry["where"] in standing_out]
        others = [entry for entry in records if _ok(entry["ok"]) is not False and entry["where"] not in standing_out]
        records = sorted(named, key=lambda entry: _ok(entry["ok"]) is not False) + others[:FLEET_WORST]
    table = []
    for entry in records:
        check = checks[entry["index"]]
        metric = check["metrics"][entry["position"]]
        table.append(_metric_row(check, metric, layout.anchor(entry["index"])))

    values = [entry["value"] for entry in group if entry["value"] is not None]
    unit = next((entry["unit"] for entry in group if entry["unit"]), "")
    criterion = next((r.criterion for r in table if r.criterion not in ("—", "no reference")), "")
    return MetricView(
        key=key,
        check=check_name,
        name=metric_name,
        unit=unit,
        rows=table,
        count=len(group),
        failed=sum(1 for entry in group if entry["ok"] is False),
        hidden=len(group) - len(table),
        low=_with_unit(min(values) if values else None, unit),
        median=_with_unit(statistics.median(values) if values else None, unit),
        high=_with_unit(max(values) if values else None, unit),
        criterion=criterion,
        sources=list(dict.fromkeys(r.source for r in table if r.source != "—")),
        outliers=[_called_out(where, outlier) for where, outlier in standing_out.items()][:OUTLIERS_NAMED],
        outliers_more=max(len(standing_out) - OUTLIERS_NAMED, 0),
        outlier_rule=text(outliers[0].get("rule")) if outliers else "",
        chart=(None if not values else
               _histogram(group, f"{check_name} · {metric_name}", unit, standing_out) if len(values) > FLEET_NODES
               else _chart(group, layout, f"{check_name} · {metric_name}", unit, standing_out)),
    )


def _called_out(where: str, outlier: dict) -> str:
    """"node5: 0.19 Gb/s (-94% vs the median, robust z -13.6)", under a metric's chart."""
    z = _number(outlier.get("robust_z"))
    details = [f"{format_margin(_number(outlier.get('deviation')))} vs the median",
               *([f"robust z {format_number(z)}"] if z is not None else []),
               *(["fails"] if outlier.get("severity") == "failure" else [])]
    return f"{where}: {_with_unit(_number(outlier.get('value')), text(outlier.get('unit')))} ({', '.join(details)})"


def _with_unit(value: Optional[float], unit: str) -> str:
    return "—" if value is None else f"{format_number(float(value))} {unit}".strip()


CHART_WIDTH, CHART_HEIGHT = 640, 168
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 58, 630, 10, 128
MAX_BAR_WIDTH = 40
LABEL_CHAR_PX = 6.0
LABEL_CHARS = 14


def _chart(group: list[dict], layout: Layout, title: str, unit: str,
           standing_out: Optional[dict[str, dict]] = None) -> Chart:
    """Bars per node in node order on a zero-based axis, with the accepted band shaded.

    Zero-based so bar lengths stay honest; the band and the reference are drawn only when
    they are in the metric's own unit. standing_out (where -> outlier) marks the outliers'
    bars, unless the band already failed them.
    """
    measured = sorted((entry for entry in group if entry["value"] is not None),
                      key=lambda entry: (entry["row"], entry["index"]))
    values = [entry["value"] for entry in measured]
    low, high, reference = _band_marks(measured, unit)
    marks = [m for m in (low, high, reference) if m is not None]

    axis_low, axis_high = min([0.0, *values, *marks]), max([0.0, *values, *marks])
    if axis_high == axis_low:
        axis_high = axis_low + 1.0
    axis_high += (axis_high - axis_low) * 0.06
    ticks = nice_ticks(axis_low, axis_high)
    axis_low, axis_high = min(axis_low, ticks[0]), max(axis_high, ticks[-1])

    def y_of(value: float) -> float:
        fraction = (value - axis_low) / (axis_high - axis_low)
        return round(PLOT_BOTTOM - fraction * (PLOT_BOTTOM - PLOT_TOP), 2)

    slot = (PLOT_RIGHT - PLOT_LEFT) / len(values)
    gap = max(slot - MAX_BAR_WIDTH, slot * 0.2) if slot >= 4 else 0.0
    zero = y_of(0.0)
    nodes = [entry["where"] for entry in measured]
    bars = []
    for position, (node, entry) in enumerate(zip(nodes, measured, strict=True)):
        top = y_of(entry["value"])
        judged = _ok(entry["ok"])
        state = "none" if judged is None else "ok" if judged else "fail"
        tooltip = f"{node}: {_with_unit(entry['value'], unit)}"
        outlier = (standing_out or {}).get(node)
        if outlier is not None:
            state = "fail" if state == "fail" else "outlier"
            tooltip += f", outlier: {format_margin(_number(outlier.get('deviation')))} vs the median"
        bars.append(Bar(x=round(PLOT_LEFT + position * slot + gap / 2, 2), y=min(top, zero),
                        width=round(max(slot - gap, 0.5), 2), height=round(abs(zero - top), 2),
                        state=state, tooltip=tooltip))
    prefix, names = "", nodes
    if _label_step(names, slot) > 1:
        prefix, names = _short_names(nodes)
    step = _label_step(names, slot)
    labels = [(round(PLOT_LEFT + (position + 0.5) * slot, 2),
               name if len(name) <= LABEL_CHARS else name[:LABEL_CHARS - 1] + "…")
              for position, name in enumerate(names) if position % step == 0]

    band = None
    if low is not None or high is not None:
        band = (y_of(high) if high is not None else PLOT_TOP,
                y_of(low) if low is not None else PLOT_BOTTOM)
    return Chart(width=CHART_WIDTH, height=CHART_HEIGHT, plot_left=PLOT_LEFT,
                 plot_right=PLOT_RIGHT, plot_top=PLOT_TOP, plot_bottom=PLOT_BOTTOM, bars=bars,
                 band=band, reference_y=None if reference is None else y_of(reference),
                 ticks=[(y_of(t), format_number(t)) for t in ticks], labels=labels,
                 caption=f"{prefix}…" if prefix else "",
                 title=f"{title} ({unit})" if unit else title)


def _band_marks(measured: list[dict], unit: str) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(lowest floor, highest ceiling, the one reference value) of a metric's entries, each None
    when absent, or when a reference is in another unit than the metric's own."""
    if not all(not e["reference_unit"] or e["reference_unit"] == unit for e in measured):
        return None, None, None
    lows = [e["low"] for e in measured if _present(e["low"])]
    highs = [e["high"] for e in measured if _present(e["high"])]
    references = {e["reference"] for e in measured if _present(e["reference"])}
    return (min(lows) if lows else None, max(highs) if highs else None,
            references.pop() if len(references) == 1 else None)


HISTOGRAM_BINS = 40


@dataclass
class Histogram(Plot):
    """How many nodes measured each range of a metric's values: a fleet's distribution at a glance,
    the band shaded, the bins holding failures red and those holding outliers amber."""

    band: Optional[tuple[float, float]]  # (x left, x right) of the accepted band, clipped to the axis
    reference_x: Optional[float]
    y_ticks: list[tuple[float, str]]
    x_ticks: list[tuple[float, str]]
    title: str
    kind: str = "histogram"


def _histogram(group: list[dict], title: str, unit: str, standing_out: dict[str, dict]) -> Histogram:
    """The values' range in HISTOGRAM_BINS bins; the axis spans the values (the band's bounds
    beyond them are in the criterion), so a tight fleet's spread stays visible."""
    measured = [entry for entry in group if entry["value"] is not None]
    values = [entry["value"] for entry in measured]
    low, high, reference = _band_marks(measured, unit)
    first, last = min(values), max(values)
    pad = (last - first) * 0.04 or abs(first) * 0.01 or 1.0
    axis_low, axis_high = first - pad, last + pad
    width = (last - first) / HISTOGRAM_BINS or 1.0
    bins: list[list[dict]] = [[] for _ in range(HISTOGRAM_BINS)]
    for entry in measured:
        bins[min(int((entry["value"] - first) / width), HISTOGRAM_BINS - 1)].append(entry)

    def x_of(value: float) -> float:
        fraction = (value - axis_low) / (axis_high - axis_low)
        return round(PLOT_LEFT + fraction * (PLOT_RIGHT - PLOT_LEFT), 2)

    tallest = max(len(members) for members in bins)
    y_ticks = [t for t in nice_ticks(0.0, float(tallest)) if t == int(t)]
    y_high = max(y_ticks[-1], tallest)

    def y_of(count: float) -> float:
        return round(PLOT_BOTTOM - count / y_high * (PLOT_BOTTOM - PLOT_TOP), 2)

    bars = []
    for number, members in enumerate(bins):
        if not members:
            continue
        start = first + number * width
        judged = [_ok(entry["ok"]) for entry in members]
        state = ("fail" if False in judged else "outlier" if any(e["where"] in standing_out for e in members)
                 else "none" if all(ok is None for ok in judged) else "ok")
        named = sorted(members, key=lambda e: e["value"])
        names = ", ".join(e["where"] for e in named[:8]) + (f" and {len(named) - 8} more" if len(named) > 8 else "")
        left, right = x_of(start), x_of(start + width) if (last - first) else x_of(start) + 8
        bars.append(Bar(x=left, y=y_of(len(members)), width=round(max(right - left - 1, 1.0), 2),
                        height=round(PLOT_BOTTOM - y_of(len(members)), 2), state=state,
                        tooltip=f"{_with_unit(start, unit)} to {_with_unit(start + width, unit)}: "
                                f"{len(members)} node(s): {names}"))
    band = None
    if low is not None or high is not None:
        left = PLOT_LEFT if low is None else min(max(x_of(low), PLOT_LEFT), PLOT_RIGHT)
        right = PLOT_RIGHT if high is None else min(max(x_of(high), PLOT_LEFT), PLOT_RIGHT)
        band = (left, right) if right > left else None
    return Histogram(width=CHART_WIDTH, height=CHART_HEIGHT, plot_left=PLOT_LEFT, plot_right=PLOT_RIGHT,
                     plot_top=PLOT_TOP, plot_bottom=PLOT_BOTTOM, bars=bars, band=band,
                     reference_x=x_of(reference) if reference is not None and axis_low <= reference <= axis_high
                     else None,
                     y_ticks=[(y_of(t), format_number(t)) for t in y_ticks],
                     x_ticks=[(x_of(t), format_number(t)) for t in nice_ticks(axis_low, axis_high)
                              if axis_low <= t <= axis_high],
                     title=f"{title}: nodes per value ({unit})" if unit else f"{title}: nodes per value")


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _short_names(nodes: list[str]) -> tuple[str, list[str]]:
    """Drop the prefix all node names share (gpu-h100-01 -> 01) so bar labels fit under bars."""
    prefix = os.path.commonprefix(nodes) if len(set(nodes)) > 1 else ""
    if any(len(node) == len(prefix) for node in nodes):
        prefix = ""
    return prefix, [node[len(prefix):] for node in nodes]


def _label_step(names: list[str], slot: float) -> int:
    """Label every n-th bar so that labels of about LABEL_CHAR_PX per character do not overlap."""
    widest = min(max((len(name) for name in names), default=1), LABEL_CHARS) * LABEL_CHAR_PX + 4
    return max(1, math.ceil(widest / slot))


# ---------------------------------------------------------------------------------------------
# Pairs: a node x node heatmap per pair tool (and rail), from each node's `pairs`

PAIR_STATES = {"ok": "ok", "low": "low", "failed": "fail"}  # a pair's state -> cell state
COMPACT_NODES = 16  # above this many nodes the cells are bare squares (figures in tooltips)
MATRIX_MAX_NODES = 64  # above it, only the nodes with bad pairs, and those pairs: linear in nodes
ATTRIBUTION_CHECK = "network_attribution"


def _pair_section(checks: list[dict], layout: Layout,
                  low_fraction: Optional[float] = None) -> Optional[PairSection]:
    """Heatmaps of every pair tool's pairs, node against node, from the node checks' `pairs`.

    Each cell is coloured by the pair's state, judged by the network suite against the median
    of its campaign; low_fraction, the profile's pair_low_fraction, only names the rule.
    """
    groups: dict[tuple[str, Optional[str]], list[int]] = {}
    for index, check in enumerate(checks):
        if isinstance(check.get("pairs"), list):
            rail = check.get("rail")
            key = (text(check.get("check")) or "unnamed", None if rail is None else text(rail))
            groups.setdefault(key, []).append(index)
    if not groups:
        return None
    heatmaps, tools_without_pairs = [], []
    for number, ((name, rail), members) in enumerate(groups.items()):
        if not any(checks[i]["pairs"] for i in members):
            where = f"{name}" + (f" rail {rail}" if rail is not None else "")
            tools_without_pairs.append(_tool_without_pairs(where, [checks[i] for i in members]))
            continue
        heatmaps.append(_heatmap(f"pairs-{number}", name, rail, [(i, checks[i]) for i in members],
                                 layout))
    attribution = next(({"outcome": _outcome(c), "message": text(c.get("message")).strip(),
                         "anchor": layout.anchor(i)}
                        for i, c in enumerate(checks) if c.get("check") == ATTRIBUTION_CHECK), None)
    return PairSection(heatmaps=heatmaps, tools_without_pairs=tools_without_pairs, attribution=attribution,
                       low_percent=f"{low_fraction * 100:g}%" if low_fraction else "")


def _tool_without_pairs(where: str, members: list[dict]) -> str:
    """One line for a pair tool no node measured a pair with, instead of an empty heatmap: how
    many nodes skipped or failed it and the first reason of each (ib_write_bw on a fleet without
    HCAs whose lost nodes failed it: 'skipped on 1,019 node(s) — no RDMA device ...; failed on 5
    node(s) — unreachable ...'). Reasons alike but for the node's own words count as one."""
    by_outcome: dict[str, list[tuple[str, str]]] = {}
    for check in members:
        reason = (text(check.get("node")), _first_line(check.get("message")))
        by_outcome.setdefault(_outcome(check), []).append(reason)
    parts = []
    for outcome, reasons in sorted(by_outcome.items(), key=lambda item: -OUTCOME_RANK[item[0]]):
        kinds = alike(reasons)
        others = f" (and {len(kinds) - 1} other reason(s))" if len(kinds) > 1 else ""
        every = "all " if len(by_outcome) == 1 else ""
        parts.append(f"{outcome} on {every}{len(reasons):,} node(s) — {kinds[0][1] or 'no message'}{others}")
    return f"{where}: " + "; ".join(parts)


def _main_metric(members: list[tuple[int, dict]]) -> Optional[dict]:
    """The figure a pair tool is judged on: its first metric with a reference, else its first."""
    first = None
    for _, check in members:
        for metric in check.get("metrics") or []:
            if metric.get("reference"):
                return metric
            first = first or metric
    return first


def _heatmap(key: str, name: str, rail: Optional[str], members: list[tuple[int, dict]],
             layout: Layout) -> Heatmap:
    main = _main_metric(members)
    metric_name = text(main.get("name")) if main else ""
    unit = text(main.get("unit")) if main else ""
    median = next((m for m in (_number(c.get("pair_median")) for _, c in members) if m), None)
    on_rail = f" rail {rail}" if rail is not None else ""
    cells: dict[str, dict[str, HeatCell]] = {}  # node -> peer -> cell
    counted: set[tuple[str, str]] = set()
    counts: dict[str, int] = {}
    for index, check in members:
        node = text(check.get("node"))
        anchor = layout.anchor(index)
        links = cells.setdefault(node, {})
        for link in check.get("pairs") or []:
            peer = text(link.get("peer"))
            value = _number(link.get("figure"))
            state = PAIR_STATES.get(text(link.get("state")), "fail")
            if state == "fail" and value is None:
                state = "broken"
            second = link.get("pass") == 2
            if (peer, node) not in counted:  # each pair is in both its nodes' checks
                counted.add((node, peer))
                counts[state] = counts.get(state, 0) + 1
            lines = [f"{node} ↔ {peer}{on_rail}: {text(link.get('state'))}"
                     + (" (second pass)" if second else "")]
            if value is not None:
                lines.append(f"{metric_name} = {_with_unit(value, unit)}")
                if median:
                    lines.append(f"{format_margin((value - median) / median)} vs the median "
                                 f"{_with_unit(median, unit)} of its campaign")
            label = SYMBOLS["failed"] if state == "broken" else _short_figure(value)
            links[peer] = HeatCell(state, label, _tooltip(lines), anchor)
    seen = set(cells) | {peer for row in cells.values() for peer in row}
    nodes = [n for n in layout.nodes if n in seen] + sorted(seen - set(layout.nodes))
    matrix = len(nodes) <= MATRIX_MAX_NODES
    rows = []
    for node in nodes:
        mine = cells.get(node, {})
        bad = sum(cell.state in ("fail", "broken", "low") for cell in mine.values())
        if matrix:
            row = [HeatCell("self", "", node) if other == node else
                   mine.get(other, HeatCell("none", "", f"{node} ↔ {other}: not measured"))
                   for other in nodes]
        elif bad:  # a fleet: the nodes with bad pairs, each with those pairs, peers named
            row = [HeatCell(cell.state, peer, cell.tooltip, cell.anchor)
                   for peer, cell in mine.items() if cell.state in ("fail", "broken", "low")]
        else:
            continue
        rows.append(HeatRow(node, row, bad=bad, measured=len(mine)))
    criterion = text(main.get("criterion")) if main and main.get("criterion") else ""
    return Heatmap(key=key, check=name, rail=rail, metric=metric_name, unit=unit,
                   criterion=criterion, median=_with_unit(median, unit), nodes=nodes, rows=rows,
                   compact=len(nodes) > COMPACT_NODES, counts=counts, matrix=matrix,
                   unmeasured=[node for node in nodes if node in cells and not cells[node]])


def _short_figure(value: Optional[float]) -> str:
    """At most four characters, so the figure fits in a cell: 7.81, 13.7, 389, 1.2k."""
    if value is None:
        return ""
    magnitude = abs(value)
    if magnitude >= 10000:
        return f"{value / 1000:.0f}k"
    if magnitude >= 1000:
        return f"{value / 1000:.1f}k"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# ---------------------------------------------------------------------------------------------
# Provenance


def _provenance(run: dict) -> dict:
    harness = run.get("harness") or {}
    inventory = run.get("inventory") or {}
    started, finished = _parse_time(run.get("started")), _parse_time(run.get("finished"))
    duration = None
    if started and finished:
        try:
            duration = format_duration((finished - started).total_seconds())
        except TypeError:  # one timestamp naive, the other aware
            duration = None
    if run.get("finished"):
        finished_text = text(run.get("finished"))
    else:
        finished_text = "not finished (interrupted)" if run.get("interrupted") else "not recorded"
    nodes = [text(n) for n in run.get("nodes") or []]
    return {
        "harness_version": text(harness.get("version")) or "unknown",
        "harness_commit": text(harness.get("commit")) or "not recorded",
        "inventory_path": text(inventory.get("path")) or "not recorded",
        "inventory_sha256": text(inventory.get("sha256")) or "not recorded",
        "profile": text(run.get("profile")) or "not recorded",
        "profile_description": text(run.get("profile_description")),
        "argv": " ".join(text(a) for a in run.get("argv") or []) or "not recorded",
        "started": text(run.get("started")) or "not recorded",
        "finished": finished_text,
        "duration": duration or "—",
        "nodes": f"{len(nodes):,}: {hostlist_of(nodes)}" if nodes else "none recorded",
    }


def _tools(tools: list[dict]) -> list[dict]:
    """One line per tool and version with the nodes that have it; a tool with several versions is flagged."""
    if not tools:
        return []
    frame = pd.DataFrame.from_records(
        [{"tool": text(t.get("tool")), "version": text(t.get("version")) or "unknown",
          "node": text(t.get("node")) or CLUSTER_ROW} for t in tools],
        columns=["tool", "version", "node"])
    versions_per_tool = frame.groupby("tool", sort=False)["version"].nunique()
    lines = []
    for (tool, version), group in frame.groupby(["tool", "version"], sort=False):
        nodes = list(dict.fromkeys(group["node"]))
        lines.append({"tool": tool, "version": version, "count": len(nodes),
                      "nodes": hostlist_of(nodes), "mixed": bool(versions_per_tool[str(tool)] > 1)})
    return sorted(lines, key=lambda line: (line["tool"], -line["count"], line["version"]))


def _signer(signer: Optional[dict]) -> Optional[dict]:
    """Signer details and the exact commands to check report.html against its signature."""
    if not signer:
        return None
    public_key = text(signer.get("public_key")).strip()
    fields = public_key.split()
    # Only plain tokens go into the shell commands, so copying them is always harmless.
    identity = fields[2] if len(fields) > 2 and _SHELL_SAFE.fullmatch(fields[2]) else "handover"
    key_ok = len(fields) >= 2 and all(_SHELL_SAFE.fullmatch(f) for f in fields[:2])
    return {
        "fingerprint": text(signer.get("fingerprint")) or "not recorded",
        "public_key": public_key or "not recorded",
        "identity": identity,
        # the run directory's own allowed_signers line, so that writing it there changes no digest
        "allowed_signers": f'{identity} namespaces="{SIGNATURE_NAMESPACE}" {fields[0]} {fields[1]}' if key_ok else "",
        "verify": _verify_command(identity, REPORT_FILE),
        # the README's order: the list of digests, the files against it, then each signed file
        "bundle": [_verify_command(identity, CHECKSUMS_FILE), f"sha256sum -c --strict --quiet {CHECKSUMS_FILE}",
                   *(_verify_command(identity, name) for name in BUNDLE_SIGNED if name != CHECKSUMS_FILE)],
    }


def _verify_command(identity: str, name: str) -> str:
    """The stock command that checks one signed file of the run directory against its signature."""
    return f"ssh-keygen -Y verify -f allowed_signers -I {identity} -n {SIGNATURE_NAMESPACE} -s {name}.sig < {name}"
