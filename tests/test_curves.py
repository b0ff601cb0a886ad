"""Curves in the report: one line chart per check and curve, every node's line on it."""
from __future__ import annotations

import re

from reports.curves import LEGEND_ENTRIES, build_curves
from reports.html import format_number, render_html
from suites.checks import series_entry
from tests.test_html import SCRIPT, check, results

MIB, GIB = 1 << 20, 1 << 30


def busbw_check(node: str, scale: float = 1.0) -> dict:
    entry = check(node, "allreduce", area="training")
    entry["series"] = [series_entry("allreduce busbw", x=("message size", "B"), y=("busbw", "GB/s"),
                                    lines={"": [(MIB, 10 * scale), (GIB, 300 * scale), (8 * GIB, 360 * scale)]},
                                    x_scale="log2")]
    return entry


def charts_of(checks):
    return build_curves(checks, lambda c: c["node"] or "cluster", format_number)


def test_one_chart_per_check_and_curve_with_a_line_per_node():
    charts = charts_of([busbw_check("gpu01"), busbw_check("gpu02", 0.5)])
    assert len(charts) == 1
    chart = charts[0]
    assert chart.title == "allreduce busbw" and chart.check == "allreduce"
    assert [line.label for line in chart.lines] == ["gpu01", "gpu02"]
    assert chart.y_title == "busbw (GB/s)" and chart.x_title == "message size"


def test_log2_axis_labels_bytes_as_binary_multiples():
    labels = [label for _, label in charts_of([busbw_check("gpu01")])[0].x_ticks]
    assert labels[0] == "1 MiB" and "1 GiB" in labels


def test_the_slower_node_draws_lower():
    chart = charts_of([busbw_check("gpu01"), busbw_check("gpu02", 0.5)])[0]
    last_y = [float(line.points.split()[-1].split(",")[1]) for line in chart.lines]
    assert last_y[1] > last_y[0]  # SVG y grows downwards


def test_points_that_cannot_be_drawn_are_dropped_and_empty_curves_omitted():
    entry = check("n1", "training", area="training")
    entry["series"] = [series_entry("loss", x=("step", ""), y=("loss", ""),
                                    lines={"rank 0": [(1, 5.0), (2, float("nan")), (3, 2.0)]}),
                       series_entry("empty", x=("step", ""), y=("loss", ""), lines={"rank 0": []})]
    charts = charts_of([entry])
    assert [chart.title for chart in charts] == ["loss"]
    assert len(charts[0].lines[0].points.split()) == 2
    assert charts[0].lines[0].label == "n1"  # one line per node: the node names it


def test_many_nodes_the_legend_counts_the_rest():
    checks = [busbw_check(f"gpu{i:02d}") for i in range(LEGEND_ENTRIES + 3)]
    chart = charts_of(checks)[0]
    assert len(chart.lines) == LEGEND_ENTRIES + 3
    assert len(chart.legend) == LEGEND_ENTRIES and chart.legend_more == 3


def test_curve_labels_are_escaped_in_the_report():
    entry = busbw_check("gpu01")
    entry["series"][0]["name"] = SCRIPT
    entry["series"][0]["lines"][0]["label"] = SCRIPT
    page = render_html(results(["gpu01"], [entry]))
    assert SCRIPT not in page
    assert 'id="curves"' in page and re.search(r"<polyline class=\"line\"", page)
