"""The HTML report: what it shows, that untrusted strings stay inert, and that it stands alone."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Optional

import pytest

from reports.html import NODE_SEARCH_SCRIPT, format_margin, format_number, render_html, write_html
from reports.results import outliers
from reports.verdict import cluster_status
from runners.pairs import sample_pairs

SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE_BREAK = '"><img src=x onerror=alert(2)>'
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
             "track", "wbr"}


# ---------------------------------------------------------------------------------------------
# Builders: results dicts shaped like handover.results/1


def metric(name: str, value: Optional[float], floor: Optional[float] = None, unit: str = "GiB",
           source: str = "smoke floor") -> dict:
    """A metric judged against a floor (reference value with a zero lower tolerance), or unjudged;
    `band` holds the absolute bounds, as the check that judged it stores them."""
    if floor is None:
        return {"name": name, "value": value, "unit": unit, "reference": None, "criterion": None,
                "margin": None, "ok": None}
    margin = (value - floor) / floor
    return {"name": name, "value": value, "unit": unit,
            "reference": {"value": floor, "lower": 0.0, "upper": None, "unit": unit, "source": source},
            "criterion": f">= {floor:g} {unit}", "margin": margin, "ok": margin >= 0,
            "band": [floor, None]}


def check(node: Optional[str], name: str, outcome: str = "passed", *, area: str = "system",
          kind: Optional[str] = None, message: str = "", log: str = "",
          metrics: tuple = ()) -> dict:
    where = node if node is not None else "cluster"
    return {"test_id": f"suites/test_{area}.py::test_{name}[{where}]", "check": name, "area": area,
            "node": node, "outcome": outcome, "kind": kind, "message": message,
            "log_excerpt": log, "duration_s": 0.12, "finished": "2026-11-30T15:17:03+00:00",
            "raw": [f"raw/{name}/{where}.stdout"], "metrics": list(metrics)}


def results(nodes: list[str], checks: list[dict], *, status: str = "CERTIFIED",
            reasons: Optional[list[str]] = None, node_status: Optional[dict] = None,
            signer: bool = True, **run: object) -> dict:
    """A complete results dict; node statuses, the cluster row's status and the outliers are
    what the checks imply, computed as results.json's builder computes them."""
    statuses = []
    for name in nodes:
        outcomes = {c["outcome"] for c in checks if c["node"] == name}
        default = ("untested" if not outcomes else
                   "failed" if outcomes & {"failed", "error"} else "passed")
        state = (node_status or {}).get(name, default)
        statuses.append({"name": name, "status": state,
                         "reasons": [] if state == "passed" else [f"{name} is {state}"]})
    document = {
        "schema": "handover.results/1",
        "run": {"run_id": "20261130T151700Z-3fa2", "cluster": "demo", "profile": "cpu-only",
                "profile_description": "CPU-only smoke profile",
                "inventory": {"path": "/abs/inventory/demo.yaml", "sha256": "ab" * 32},
                "harness": {"version": "0.1.0", "commit": "abc1234"},
                "started": "2026-11-30T15:17:00+00:00", "finished": "2026-11-30T15:19:12+00:00",
                "interrupted": False, "argv": ["pytest", "--inventory", "inventory/demo.yaml"],
                "nodes": list(nodes),
                "tools": [{"node": n, "tool": "stress-ng", "version": "0.15.06"} for n in nodes]},
        "verdict": {"status": status, "reasons": reasons if reasons is not None else ["all good"]},
        "nodes": statuses,
        "checks": checks,
        "outliers": outliers(checks),
    }
    cluster_checks = cluster_status([c for c in checks if c["node"] is None])
    if cluster_checks:
        document["verdict"]["cluster_checks"] = cluster_checks
    if signer:
        document["signer"] = {"fingerprint": "SHA256:abcdefghijklmnop",
                              "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample handover@vm"}
    document["run"].update(run)
    return document


def cluster_of(node_count: int, check_names: list[str]) -> dict:
    nodes = [f"node{i}" for i in range(1, node_count + 1)]
    checks = [check(n, name, area=("system", "hardware", "network")[k % 3],
                    metrics=(metric(f"{name}_value", 10.0 + i % 7, floor=8.0),))
              for i, n in enumerate(nodes) for k, name in enumerate(check_names)]
    return results(nodes, checks)


# ---------------------------------------------------------------------------------------------
# A small DOM from html.parser, strict about nesting so unbalanced output fails loudly


@dataclass
class Element:
    tag: str
    attrs: dict
    children: list = field(default_factory=list)
    parent: Optional["Element"] = None

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def iter(self):
        for child in self.children:
            if isinstance(child, Element):
                yield child
                yield from child.iter()

    def find_all(self, tag: str, cls: Optional[str] = None) -> list["Element"]:
        return [e for e in self.iter() if e.tag == tag and (cls is None or cls in e.classes())]

    def find(self, tag: str, cls: Optional[str] = None) -> "Element":
        found = self.find_all(tag, cls)
        assert found, f"no <{tag} class={cls}>"
        return found[0]

    def by_id(self, element_id: str) -> "Element":
        found = [e for e in self.iter() if e.attrs.get("id") == element_id]
        assert len(found) == 1, f"{len(found)} elements with id {element_id!r}"
        return found[0]


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs), parent=self.current)
        self.current.children.append(element)
        if tag not in VOID_TAGS:
            self.current = element

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Element(tag, dict(attrs), parent=self.current))

    def handle_endtag(self, tag):
        assert tag not in VOID_TAGS, f"end tag for void element <{tag}>"
        assert self.current.tag == tag, f"</{tag}> closes <{self.current.tag}>"
        self.current = self.current.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(document: str) -> Element:
    builder = TreeBuilder()
    builder.feed(document)
    builder.close()
    assert builder.current is builder.root, f"<{builder.current.tag}> never closed"
    return builder.root


def matrix_rows(root: Element) -> list[tuple[str, list[str]]]:
    """(row label, cell symbols) for each matrix body row; '' for a not-applicable cell."""
    rows = []
    for tr in root.find("table", "matrix").find("tbody").find_all("tr"):
        label = tr.find("th").text().strip()
        cells = [td.text().strip() for td in tr.find_all("td") if "status" not in td.classes()]
        rows.append((label, cells))
    return rows


def metric_table(root: Element, metric_name: str) -> list[list[str]]:
    section = next(s for s in root.find_all("section", "metric")
                   if s.find("h3").text().startswith(metric_name))
    return [[td.text().strip() for td in tr.find_all("td")]
            for tr in section.find("table").find("tbody").find_all("tr")]


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("status, css_class", [
    ("CERTIFIED", "verdict-certified"),
    ("NOT CERTIFIED", "verdict-not-certified"),
    ("INCOMPLETE", "verdict-incomplete"),
])
def test_verdict_banner_shows_status_reasons_and_colour_class(status, css_class):
    document = results(["node1"], [check("node1", "memory")], status=status,
                       reasons=[f"reason for {status}"])
    banner = parse(render_html(document)).by_id("verdict")
    assert css_class in banner.classes()
    assert banner.find("div", "status").text() == status
    assert f"reason for {status}" in banner.text()


def test_header_names_cluster_profile_and_run():
    header = parse(render_html(results(["node1"], [check("node1", "memory")]))).by_id("top")
    assert "demo" in header.text()
    assert "cpu-only" in header.text()
    assert "20261130T151700Z-3fa2" in header.text()


def test_matrix_has_a_row_per_node_plus_cluster_row_with_symbols():
    nodes = ["node1", "node2", "node3", "node4"]
    checks = [
        *(check(n, "memory") for n in nodes),
        check("node1", "cpu"), check("node2", "cpu", "failed", kind="sanity", message="2 cores"),
        check("node3", "cpu", "skipped", kind="unreachable", message="ssh timed out"),
        *(check(n, "nvme", area="storage") for n in nodes[:3]),
        check("node4", "nvme", "error", area="storage", kind="error", message="Traceback"),
        check(None, "uniformity", message="identical"),
    ]
    rows = matrix_rows(parse(render_html(results(nodes, checks, status="NOT CERTIFIED"))))
    # Columns: system (memory, cpu, uniformity) then storage (nvme).
    assert rows == [
        ("node1", ["✓", "✓", "", "✓"]),
        ("node2", ["✓", "✗", "", "✓"]),
        ("node3", ["✓", "–", "", "✓"]),
        ("node4", ["✓", "?", "", "!"]),
        ("cluster", ["", "", "✓", ""]),
    ]


def test_matrix_columns_grouped_by_area_and_cells_carry_the_message():
    checks = [check("node1", "nccl", area="training"), check("node1", "memory", area="system"),
              check("node1", "hbm", area="hardware", message="HBM bandwidth 3.0 TB/s")]
    root = parse(render_html(results(["node1"], checks)))
    areas = [th.text() for th in root.find("table", "matrix").find("tr", "areas").find_all("th")]
    assert areas[1:-1] == ["system", "hardware", "training"]
    titles = [s.attrs.get("title", "") for s in root.find("table", "matrix").find_all("span", "sq")]
    assert any("HBM bandwidth 3.0 TB/s" in title for title in titles)


def test_failed_cell_links_to_its_details_with_the_log_excerpt():
    log = "stress-ng: fail: [1234] memory corruption at 0x7f00\nexit status 2"
    checks = [check("node1", "memory"),
              check("node2", "memory", "failed", kind="sanity", message="memory corrupted", log=log)]
    root = parse(render_html(results(["node1", "node2"], checks, status="NOT CERTIFIED")))
    links = [a for a in root.find("table", "matrix").find_all("a", "sq-failed")]
    assert len(links) == 1 and links[0].text() == "✗"
    target = root.by_id(links[0].attrs["href"].lstrip("#"))
    assert "node2" in target.find("h3").text()
    assert "memory corrupted" in target.text()
    assert target.find("pre", "log").text() == log


def test_skipped_checks_are_listed_with_their_reason():
    checks = [check("node1", "memory"),
              check("node2", "memory", "skipped", kind="unreachable", message="no route to host")]
    root = parse(render_html(results(["node1", "node2"], checks, status="INCOMPLETE")))
    rows = [[td.text().strip() for td in tr.find_all("td")]
            for tr in root.by_id("skipped").parent.find_all("tr") if tr.find_all("td")]
    assert ["node2", "memory", "unreachable", "no route to host"] in rows


def test_skips_alike_but_for_the_nodes_own_name_and_address_share_a_row():
    nodes = ["node1", "node2", "node3"]
    checks = [check(node, "mtu", "skipped", message=f"{node} ({address}): no interface routes to the fabric")
              for node, address in zip(nodes, ("10.0.0.1", "10.0.0.2", "fd00::3"), strict=True)]
    root = parse(render_html(results(nodes, checks)))
    rows = [[td.text().strip() for td in tr.find_all("td")]
            for tr in root.by_id("skipped").parent.find_all("tr") if tr.find_all("td")]
    assert [row[0] for row in rows if row[1:2] == ["mtu"]] == ["node[1-3] (3)"]


def test_failed_and_untested_nodes_are_listed_with_reasons():
    checks = [check("node1", "memory"), check("node2", "memory", "failed", message="too small")]
    root = parse(render_html(results(["node1", "node2", "node3"], checks, status="NOT CERTIFIED")))
    table = root.by_id("nodes").parent
    text = " ".join(tr.text() for tr in table.find_all("tr"))
    assert "node2 is failed" in text and "node3 is untested" in text
    assert "node1 is" not in text


def test_untrusted_strings_are_escaped_everywhere():
    evil = SCRIPT + ATTRIBUTE_BREAK
    checks = [
        check(evil, evil, "failed", area=evil, kind=evil, message=evil, log=evil,
              metrics=(metric(evil, 1.0, floor=2.0, unit=evil, source=evil),)),
        check(evil, "disk", "skipped", kind=evil, message=evil),
        check(None, evil, "error", message=evil, log=evil),
    ]
    document = results([evil], checks, status=evil, reasons=[evil], node_status={evil: evil},
                       cluster=evil, profile=evil, profile_description=evil, run_id=evil,
                       argv=[evil], inventory={"path": evil, "sha256": evil},
                       harness={"version": evil, "commit": evil},
                       started=evil, finished=evil,
                       tools=[{"node": evil, "tool": evil, "version": evil}],
                       unlocked=[{"node": evil, "reason": evil}],
                       dropped=[{"node": evil, "lost_at": evil, "back_at": evil, "reason": evil}])
    document["signer"] = {"fingerprint": evil, "public_key": f"ssh-ed25519 AAAA {evil}"}
    output = render_html(document)
    assert output.lower().count("<script") == 2  # the node search's data block and its code: ours
    assert SCRIPT not in output and "<img" not in output.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img" in output
    root = parse(output)
    data, code = root.find_all("script")
    assert data.attrs == {"type": "application/json", "id": "node-data"} and code.text() == NODE_SEARCH_SCRIPT
    assert json.loads(data.text())["nodes"][0][0] == evil  # in the data, as JSON escapes
    assert not root.find_all("img")
    assert all(not name.startswith("on") for e in root.iter() for name in e.attrs)
    assert [label for label, _ in matrix_rows(root)] == [evil, "cluster"]


def test_report_loads_nothing_from_outside():
    output = render_html(cluster_of(4, ["memory", "cpu"])).lower()
    for pattern in (r"src\s*=\s*[\"']?\s*(https?:)?//", r"href\s*=\s*[\"']?\s*(https?:)?//",
                    r"@import", r"url\(", r"<link", r"<script[^>]*src", r"<iframe", r"<object",
                    r"fetch\(", r"xmlhttprequest", r"\.src\s*=", r"import\("):
        assert not re.search(pattern, output), pattern


def test_metric_table_lists_worst_margin_first_and_highlights_failures():
    values = {"node1": 30.0, "node2": 3.0, "node3": 12.0, "node4": 4.1}
    checks = [check(n, "memory", "failed" if v < 4 else "passed",
                    metrics=(metric("memory_total", v, floor=4.0),)) for n, v in values.items()]
    root = parse(render_html(results(list(values), checks, status="NOT CERTIFIED")))
    rows = metric_table(root, "memory_total")
    assert [r[0] for r in rows] == ["node2", "node4", "node3", "node1"]
    assert [r[3] for r in rows] == ["-25%", "+2.50%", "+200%", "+650%"]
    assert rows[0][1] == "3 GiB"
    section = next(s for s in root.find_all("section", "metric"))
    bad_rows = [tr for tr in section.find("tbody").find_all("tr") if "bad" in tr.classes()]
    assert len(bad_rows) == 1 and "node2" in bad_rows[0].text()
    assert bad_rows[0].find("a").attrs["href"].startswith("#fail-")


def test_metric_chart_draws_band_and_marks_nodes_below_it():
    values = {"node1": 30.0, "node2": 3.0, "node3": 12.0}
    checks = [check(n, "memory", metrics=(metric("memory_total", v, floor=4.0),))
              for n, v in values.items()]
    root = parse(render_html(results(list(values), checks)))
    svg = root.find("section", "metric").find("svg", "chart")
    bars = svg.find_all("rect", "bar")
    assert len(bars) == 3
    assert [b.find("title").text() for b in bars] == ["node1: 30 GiB", "node2: 3 GiB",
                                                      "node3: 12 GiB"]
    assert ["bar-fail" in b.classes() for b in bars] == [False, True, False]
    assert svg.find_all("rect", "band")
    assert "median 12 GiB" in root.find("section", "metric").find("div", "stats").text()
    assert not root.find("section", "metric").find_all("div", "outliers")  # 3 nodes: too few to compare


def test_sixty_four_nodes_keep_a_row_each_and_stay_small():
    """Speed is bench/report.py's to measure (README); here, what the page holds."""
    document = cluster_of(64, [f"check{k:02d}" for k in range(12)])
    output = render_html(document)
    assert len(output.encode()) < 3_000_000
    rows = matrix_rows(parse(output))
    assert len(rows) == 64 and all(cells == ["✓"] * 12 for _, cells in rows)


def test_interrupted_run_says_so():
    document = results(["node1", "node2"], [check("node1", "memory")], status="INCOMPLETE",
                       interrupted=True, finished=None)
    root = parse(render_html(document))
    assert "interrupted" in root.by_id("interrupted").text()
    assert "not finished (interrupted)" in root.by_id("top").text()


def test_nodes_tested_without_their_lock_are_listed_alike_ones_together_in_a_fleet():
    """A rack's nodes whose lock failed alike (but for name and address) share a row by hostlist
    in a fleet; a node another run held keeps its own; below a fleet each node has its row."""
    rack = [{"node": f"d{i:04d}", "reason": f"d{i:04d} not locked: exited 1: flock: 10.0.3.{i}: busy"}
            for i in range(70)]
    busy = {"node": "d0070", "reason": "d0070 is in use by run 20260101T000000Z-0badcafe"}
    names = [u["node"] for u in rack] + ["d0070"]
    fleet = parse(render_html(results(names, [check(n, "memory") for n in names], unlocked=[*rack, busy])))
    rows = [[td.text() for td in tr.find_all("td")] for tr in fleet.by_id("unlocked").find_all("tr")[1:]]
    assert rows == [["d[0000-0069] (70 nodes)", rack[0]["reason"]], ["d0070", busy["reason"]]]
    few = parse(render_html(results(["n1", "n2"], [check("n1", "memory")], unlocked=rack[:2])))
    assert [tr.find("td").text() for tr in few.by_id("unlocked").find_all("tr")[1:]] == ["d0000", "d0001"]
    assert 'id="unlocked"' not in render_html(results(["n1"], [check("n1", "memory")], unlocked=[]))


def test_nodes_that_dropped_and_came_back_are_listed_with_when_and_why():
    """Each loss a node came back from is a row with its times; in a fleet a rack that dropped
    at once, alike but for names and times, shares one row."""
    def dropped(node: str, lost: str, back: str) -> dict:
        return {"node": node, "lost_at": f"2026-12-06T{lost}+00:00", "back_at": f"2026-12-06T{back}+00:00",
                "reason": "no answer to SSH keepalives for 12 s"}
    few = parse(render_html(results(["n1", "n2"], [check("n1", "memory")],
                                    dropped=[dropped("n2", "10:00:01", "10:00:31")])))
    rows = [[td.text() for td in tr.find_all("td")] for tr in few.by_id("dropped").find_all("tr")[1:]]
    assert rows == [["n2", "stopped answering at 10:00:01 UTC (no answer to SSH keepalives for 12 s); "
                           "answered again at 10:00:31 UTC"]]
    names = [f"d{i:04d}" for i in range(70)]
    rack = [dropped(name, f"10:00:{i % 60:02d}", f"10:01:{i % 60:02d}") for i, name in enumerate(names)]
    fleet = parse(render_html(results(names, [check(n, "memory") for n in names], dropped=rack)))
    assert [tr.find("td").text() for tr in fleet.by_id("dropped").find_all("tr")[1:]] == ["d[0000-0069] (70 nodes)"]
    assert 'id="dropped"' not in render_html(results(["n1"], [check("n1", "memory")], dropped=[]))


def test_wide_tables_are_scaled_to_the_printed_page_which_is_numbered():
    """A matrix of 56 checks is 1,614 px wide and a 64-node heatmap about 1,000 px: printed, the
    browser cut their right side off (a failed square and the status column with it) and shrank
    every page to fit them. Each is scaled to the page's 700 px instead; the pages are numbered,
    and the signer's fingerprint is on the first."""
    names = [f"check{k:02d}" for k in range(56)]
    root = parse(render_html(cluster_of(2, names)))
    wrap = root.find("div", "matrix-wrap")
    assert wrap.attrs["style"] == "--print-zoom: 0.43"  # 700 / (270 + 24 * 56)
    assert parse(render_html(cluster_of(2, names[:10]))).find("div", "matrix-wrap").attrs["style"] == \
        "--print-zoom: 1.0"
    output = render_html(cluster_of(2, names))
    assert ".matrix-wrap, .heat-wrap { zoom: var(--print-zoom, 1); }" in output
    assert 'content: "page " counter(page) " of " counter(pages)' in output
    # printed (64 nodes, bench/report.py): 67 pages, 9 of them nearly empty, the totals twice -> 54, once
    assert ".matrix tfoot { display: table-row-group; }" in output and ".metric { break-inside: auto; }" in output
    assert "SHA256:abcdefghijklmnop" in root.by_id("top").text()
    nodes = [f"n{i}" for i in range(1, 65)]
    ring = link_checks(nodes, {(f"n{i}", f"n{i % 64 + 1}"): (9.0, "ok") for i in range(1, 65)}, median=9.0)
    heat = parse(render_html(results(nodes, ring))).find("div", "heat-wrap")
    assert heat.attrs["style"] == "--print-zoom: 0.71"  # 700 / (214 + 12 * 64): compact cells


def test_finished_run_has_no_interrupted_notice():
    output = render_html(results(["node1"], [check("node1", "memory")]))
    assert 'id="interrupted"' not in output


def test_missing_optional_fields_render():
    document = results(["node1"], [check("node1", "memory", metrics=(metric("memory_total", 8.0),))],
                       signer=False, harness={"version": "0.1.0", "commit": None}, finished=None)
    root = parse(render_html(document))
    provenance = root.by_id("provenance").parent.text()
    assert "not signed" in provenance
    assert "commit not recorded" in provenance
    assert metric_table(root, "memory_total") == [["node1", "8 GiB", "no reference", "—", "—"]]


def test_bare_results_render_as_incomplete():
    root = parse(render_html({"schema": "handover.results/1"}))
    assert "verdict-incomplete" in root.by_id("verdict").classes()


def test_signer_and_verification_command_are_shown():
    root = parse(render_html(results(["node1"], [check("node1", "memory")])))
    provenance = root.by_id("provenance").parent.text()
    assert "SHA256:abcdefghijklmnop" in provenance
    assert ("ssh-keygen -Y verify -f allowed_signers -I handover@vm -n handover "
            "-s report.html.sig < report.html") in provenance
    assert 'handover@vm namespaces="handover" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample' in provenance
    bundle = root.by_id("verify-bundle").parent.find_all("pre", "cmd")[-1].text().splitlines()
    assert bundle == [  # the README's order: the digests' list, the files against it, each signed file
        "ssh-keygen -Y verify -f allowed_signers -I handover@vm -n handover -s manifest.sha256.sig < manifest.sha256",
        "sha256sum -c --strict --quiet manifest.sha256",
        "ssh-keygen -Y verify -f allowed_signers -I handover@vm -n handover -s results.json.sig < results.json",
        "ssh-keygen -Y verify -f allowed_signers -I handover@vm -n handover -s report.html.sig < report.html",
        "ssh-keygen -Y verify -f allowed_signers -I handover@vm -n handover -s manifest.json.sig < manifest.json",
    ]


def test_provenance_lists_inventory_harness_and_tools():
    root = parse(render_html(results(["node1", "node2"], [check("node1", "memory")])))
    provenance = root.by_id("provenance").parent.text()
    for fact in ("/abs/inventory/demo.yaml", "ab" * 32, "abc1234", "0.1.0",
                 "pytest --inventory inventory/demo.yaml", "2 min 12 s", "stress-ng", "0.15.06",
                 "node[1-2]"):
        assert fact in provenance, fact


def test_document_is_well_formed_and_self_contained():
    root = parse(render_html(cluster_of(3, ["memory", "cpu"])))
    for tag in ("html", "head", "body", "main", "style"):
        assert len(root.find_all(tag)) == 1, tag
    assert [e.tag for e in root.find("head").children if isinstance(e, Element)].count("title") == 1
    assert root.find("html").attrs.get("lang") == "en"


def test_write_html_writes_the_rendered_bytes(tmp_path):
    document = cluster_of(2, ["memory"])
    path = write_html(document, tmp_path / "run" / "report.html")
    assert path.read_bytes() == render_html(document).encode("utf-8")
    assert render_html(document) == render_html(document)


@pytest.mark.parametrize("value, expected", [
    (23.456, "23.5"), (0.12, "0.120"), (4, "4"), (4.0, "4"), (51234.5, "51,200"),
    (2048, "2,048"), (-3.14159, "-3.14"), (999.7, "1,000"),
    (12345678.9, "1.23e+07"), (0.000123, "0.000123"), (0.0000123, "1.23e-05"), (None, "—"),
])
def test_numbers_have_three_significant_digits(value, expected):
    assert format_number(value) == expected


@pytest.mark.parametrize("margin, expected", [(5.37, "+537%"), (-0.0512, "-5.12%"), (0, "+0%"),
                                              (None, "—")])
def test_margins_are_signed_percentages(margin, expected):
    assert format_margin(margin) == expected


def test_terminal_colour_codes_are_stripped_from_logs():
    log = "\x1b[31mFAIL\x1b[0m: link down\x07"
    checks = [check("node1", "ib_links", "failed", area="network", message="link down", log=log)]
    root = parse(render_html(results(["node1"], checks, status="NOT CERTIFIED")))
    assert root.find("pre", "log").text() == "FAIL: link down"


# ---------------------------------------------------------------------------------------------
# Pair heatmaps


def link_checks(nodes: list[str], links: dict[tuple[str, str], tuple[Optional[float], str]], *,
                name: str = "iperf3", floor: float = 1.0, rail: Optional[int] = None,
                median: Optional[float] = None, outcomes: Optional[dict[str, str]] = None,
                messages: Optional[dict[str, str]] = None) -> list[dict]:
    """Each node's entry of a pair tool as the recorder writes it: the node (and rail), its best
    pair's metric, and its pairs (peer, state, figure, pass) with the campaign's median, from
    `links` {(a, b): (figure, state)} as the network suite judged them."""
    entries = []
    for node in nodes:
        mine = [{"peer": b if a == node else a, "state": state, "figure": figure, "pass": 1}
                for (a, b), (figure, state) in links.items() if node in (a, b)]
        figures = [link["figure"] for link in mine if link["figure"] is not None]
        outcome = (outcomes or {}).get(node, "passed")
        entry = check(node, name, outcome, area="network", message=(messages or {}).get(node, ""),
                      metrics=(metric(f"{name}_bandwidth", max(figures), floor=floor, unit="Gb/s"),)
                      if figures else ())
        where = node if rail is None else f"{node}-rail{rail}"
        entry["test_id"] = f"suites/test_network.py::test_{name}[{where}]"
        if rail is not None:
            entry["rail"] = rail
        entry["pairs"], entry["pair_median"] = mine, median
        entries.append(entry)
    return entries


def heat_cells(section: Element) -> dict[tuple[str, str], Element]:
    """{(row node, column node): the cell's span or link} of one heatmap."""
    table = section.find("table", "heat")
    columns = [th.attrs["title"] for th in table.find("thead").find_all("th")[1:-1]]
    cells = {}
    for tr in table.find("tbody").find_all("tr"):
        node = tr.find("th").text()
        for column, td in zip(columns, [td for td in tr.find_all("td") if "bad" not in td.classes()], strict=True):
            cells[(node, column)] = next(e for e in td.iter() if "hc" in e.classes())
    return cells


def test_pair_heatmap_draws_each_pairs_judged_state():
    nodes = ["n1", "n2", "n3", "n4"]
    links = {("n1", "n2"): (9.0, "ok"), ("n1", "n3"): (2.0, "low"),  # in band, far below the median
             ("n1", "n4"): (0.5, "failed"),  # below the 1 Gb/s floor
             ("n2", "n3"): (None, "failed"), ("n2", "n4"): (9.5, "ok"), ("n3", "n4"): (8.0, "ok")}
    checks = link_checks(nodes, links, median=8.5, outcomes={"n3": "failed"}, messages={"n3": "n3 unreachable"})
    checks.append(check(None, "network_attribution", "failed", area="network",
                        message="suspects: iperf3: link n1-n4: failed"))
    root = parse(render_html(results(nodes, checks, status="NOT CERTIFIED")))
    section = root.by_id("pairs").parent.find("section", "heatmap")
    cells = heat_cells(section)
    state = {key: next(c for c in cell.classes() if c.startswith("hc-")) for key, cell in cells.items()}
    assert state[("n1", "n2")] == state[("n2", "n1")] == "hc-ok"
    assert state[("n1", "n3")] == "hc-low" and state[("n1", "n4")] == "hc-fail"
    assert state[("n2", "n3")] == "hc-broken" and cells[("n2", "n3")].text() == "✗"
    assert state[("n1", "n1")] == "hc-self"
    assert cells[("n1", "n2")].text() == "9.00"
    tooltip = cells[("n4", "n1")].attrs["title"]
    assert "n4 ↔ n1: failed" in tooltip and "0.500 Gb/s" in tooltip and "vs the median" in tooltip
    assert cells[("n3", "n2")].attrs["href"].startswith("#fail-")  # n3's row: its failed check
    assert "href" not in cells[("n2", "n3")].attrs  # n2's check passed: nothing to link to
    assert ">= 1 Gb/s" in section.find("div", "stats").text()
    assert "link n1-n4" in root.find("div", "attribution").text()
    bad = {tr.find("th").text(): tr.find("td", "bad").text() for tr in section.find("tbody").find_all("tr")}
    assert bad == {"n1": "2/3", "n2": "1/3", "n3": "2/3", "n4": "1/3"}
    stats = section.find("div", "stats").text()  # each pair counted once, though in two nodes' checks
    assert "3 within" in stats and "1 low vs median" in stats and "1 outside the band" in stats


def test_one_heatmap_per_rail_and_skipped_pair_tools_are_one_line():
    nodes = ["n1", "n2", "n3"]
    pairs = [("n1", "n2"), ("n1", "n3"), ("n2", "n3")]
    checks = [entry for rail in (0, 1) for entry in link_checks(
        nodes, {pair: (390.0 - rail, "ok") for pair in pairs}, name="ib_write_bw", floor=380.0, rail=rail)]
    checks += link_checks(nodes, {}, name="ib_write_lat", rail=0, outcomes=dict.fromkeys(nodes, "skipped"),
                          messages={n: f"no RDMA device: ib_write_lat on {n} says so" for n in nodes})
    root = parse(render_html(results(nodes, checks)))
    titles = [s.find("h3").text() for s in root.find_all("section", "heatmap")]
    assert [t.split(" ·")[0:2] for t in titles] == [["ib_write_bw", " rail 0"], ["ib_write_bw", " rail 1"]]
    section = root.by_id("pairs").parent.text()
    assert "ib_write_lat rail 0: skipped on all 3 node(s) — no RDMA device: ib_write_lat on n1 says so" in section
    assert "other reason" not in section


def test_a_pair_tool_skipped_where_it_could_run_and_failed_where_nodes_were_lost_is_one_line():
    """ib_write_bw on nodes without HCAs, two of them lost: no pair anywhere, so no empty heatmap."""
    nodes = ["n1", "n2", "n3", "n4"]
    checks = link_checks(nodes, {("n1", "n2"): (9.0, "ok")})
    checks += link_checks(nodes, {}, name="ib_write_bw", rail=0,
                          outcomes={"n1": "skipped", "n2": "skipped", "n3": "failed", "n4": "failed"},
                          messages={"n1": "no RDMA device on n1", "n2": "no RDMA device on n2",
                                    "n3": "n3 unreachable: no answer", "n4": "n4 unreachable: no answer"})
    root = parse(render_html(results(nodes, checks, status="NOT CERTIFIED")))
    assert [s.find("h3").text().split(" ·")[0] for s in root.find_all("section", "heatmap")] == ["iperf3"]
    section = root.by_id("pairs").parent.text()
    assert ("ib_write_bw rail 0: failed on 2 node(s) — n3 unreachable: no answer; "
            "skipped on 2 node(s) — no RDMA device on n1") in section
    assert "other reason" not in section


def test_pair_heatmap_escapes_node_names_and_messages():
    evil = SCRIPT + ATTRIBUTE_BREAK
    checks = link_checks([evil, "n2", "n3"], {(evil, "n2"): (5.0, "ok"), (evil, "n3"): (None, "failed"),
                                             ("n2", "n3"): (5.0, "ok")},
                         outcomes={evil: "failed"}, messages={evil: evil})
    output = render_html(results([evil, "n2", "n3"], checks, status="NOT CERTIFIED"))
    assert SCRIPT not in output and "<img" not in output.lower()
    root = parse(output)
    cells = heat_cells(root.find("section", "heatmap"))
    assert (evil, "n2") in cells and evil in cells[("n3", evil)].attrs["title"]


def test_sixty_four_node_heatmap_is_compact():
    nodes = [f"gpu{i:03d}" for i in range(1, 65)]
    links = {(a, b): (2.0, "low") if "gpu017" in (a, b) else (9.0, "ok")
             for i, a in enumerate(nodes) for b in nodes[i + 1:]}
    document = results(nodes, link_checks(nodes, links, median=9.0))
    output = render_html(document)
    root = parse(output)
    table = root.find("section", "heatmap").find("table", "heat")
    assert "compact" in table.classes() and len(table.find("tbody").find_all("tr")) == 64
    suspects = [th.text() for th in table.find("tbody").find_all("th", "suspect")]
    assert suspects == ["gpu017"]
    assert len(output.encode()) < 5_000_000


def test_a_fleet_lists_the_nodes_with_bad_pairs_instead_of_a_matrix():
    """512 nodes with eight partners each (the full depth's sample): no 512 x 512 table, but the
    slow node and its partners, each with its bad pairs; the report grows with the pairs."""
    nodes = [f"gpu{i:04d}" for i in range(1, 513)]
    slow = "gpu0100"
    links = {pair: (2.0, "low") if slow in pair else (9.0, "ok") for pair in sample_pairs(nodes, 8)}
    output = render_html(results(nodes, link_checks(nodes, links, median=9.0)))
    section = parse(output).find("section", "heatmap")
    table = section.find("table", "heat")
    assert "fleet" in table.classes()
    rows = {tr.find("th").text(): tr for tr in table.find("tbody").find_all("tr")}
    partners = {b if a == slow else a for a, b in links if slow in (a, b)}
    assert set(rows) == {slow} | partners and len(partners) == 8
    assert rows[slow].find("td", "bad").text() == "8/8" and "suspect" in rows[slow].find("th").classes()
    assert {e.text() for e in rows[slow].iter() if "hc-low" in e.classes()} == partners
    assert len(output.encode()) < 2_000_000
    assert "measured no pair" not in section.text()


def test_a_healthy_fleets_pair_list_says_no_node_has_a_bad_pair():
    """1,200 nodes in a ring, every pair within its band: a sentence, counted with thousands
    separators, and no empty table of bad nodes."""
    nodes = [f"gpu{i:04d}" for i in range(1, 1201)]
    ring = {(nodes[i], nodes[(i + 1) % len(nodes)]): (9.0, "ok") for i in range(len(nodes))}
    section = parse(render_html(results(nodes, link_checks(nodes, ring, median=9.0)))).find("section", "heatmap")
    assert "1,200 within" in section.find("div", "stats").text()
    assert "1,200 nodes: too many for a node × node matrix; no node has a failed or low pair." in section.text()
    assert not section.find_all("table", "heat")


def test_a_fleets_pair_section_names_the_nodes_that_measured_no_pair():
    """100 nodes in a ring, three of them lost before they measured: the fleet's pair list
    names them by hostlist (their peers' pairs with them failed and are listed as bad)."""
    nodes = [f"gpu{i:03d}" for i in range(1, 101)]
    lost = {"gpu010", "gpu011", "gpu050"}
    ring = [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]
    links = {pair: (None, "fail") if lost & set(pair) else (9.0, "ok") for pair in ring}
    entries = link_checks(nodes, links, median=9.0, outcomes={node: "failed" for node in lost})
    for entry in entries:
        if entry["node"] in lost:
            entry.update(kind="unreachable", message=f"{entry['node']} unreachable", pairs=[], metrics=[])
    section = parse(render_html(results(nodes, entries, status="NOT CERTIFIED"))).find("section", "heatmap")
    assert "3 node(s) measured no pair of their own (gpu[010-011,050])" in section.text()


@pytest.mark.parametrize("fraction", [None, 0.25, 0.75])
def test_heatmap_amber_is_the_suites_low_state_and_the_legend_names_the_runs_fraction(fraction):
    """Amber where the suite judged a pair low (runners.pairs' rule, tested in test_pairs.py);
    the legend names the profile's pair_low_fraction when results.json's run carries one."""
    nodes = ["n1", "n2", "n3"]
    checks = link_checks(nodes, {("n1", "n2"): (9.0, "ok"), ("n1", "n3"): (3.0, "low"),
                                 ("n2", "n3"): (9.5, "ok")}, median=9.0)
    run = {} if fraction is None else {"pair_low_fraction": fraction}
    document = render_html(results(nodes, checks, **run))
    cells = heat_cells(parse(document).by_id("pairs").parent.find("section", "heatmap"))
    assert {key for key, cell in cells.items() if "hc-low" in cell.classes() and key[0] < key[1]} == {("n1", "n3")}
    if fraction is None:
        assert "low vs median</span>" in document and "far from the median" in document
    else:
        percent = f"{fraction * 100:g}%"
        assert f"low vs median (over {percent} off)" in document and f"more than {percent} from the median" in document


def test_a_fleet_shares_rows_among_alike_nodes_and_summarises_each_metric():
    """100 nodes, one failed and one slow: each has its row, first; the 98 others, passed and
    alike, are one row named by their hostlist; a governor skipped everywhere is one skipped row;
    each metric is a histogram, its table the failure, the outlier and the worst others; every
    node's figures are in the node search's data."""
    nodes = [f"gpu{i:03d}" for i in range(1, 101)]
    values = {node: 20.0 + (i % 5) * 0.1 for i, node in enumerate(nodes)}
    values["gpu040"], values["gpu070"] = 3.0, 14.0  # below the floor; within it, far from the median
    checks = [check(node, "memory", "failed" if values[node] < 4 else "passed",
                    metrics=(metric("memory_total", values[node], floor=4.0),)) for node in nodes]
    checks += [check(node, "governor", "skipped", kind="not-applicable",
                     message=f"{node}: profile asks for no governor") for node in nodes]
    document = results(nodes, checks, status="NOT CERTIFIED")
    output = render_html(document)
    root = parse(output)
    rows = root.find("table", "matrix").find("tbody").find_all("tr")
    labels = [tr.find("th").text().strip() for tr in rows]
    assert labels[:2] == ["gpu040", "gpu070"] and len(rows) == 3
    assert labels[2].startswith("98 nodes alike") and "gpu[001-039,041-069,071-100]" in labels[2]
    assert [td.text().strip() for td in rows[2].find_all("td") if "status" not in td.classes()] == ["✓", "–"]

    skip_table = next(t for t in root.find_all("table", "data") if "Why" in t.find("thead").text())
    skipped = skip_table.find("tbody").find_all("tr")
    assert len(skipped) == 1 and "gpu[001-100]" in skipped[0].text() and "(100)" in skipped[0].text()
    section = root.find("section", "metric")
    assert section.find("svg", "chart").find("title").text().startswith("memory · memory_total: nodes per value")
    table = metric_table(root, "memory_total")
    assert [row[0] for row in table[:2]] == ["gpu040", "gpu070"] and len(table) == 2 + 10
    assert "88 more node(s)" in section.text()

    data = json.loads(root.by_id("node-data").text())
    figures = {node[0]: node[5][0][5][0][1] for node in data["nodes"]}
    assert figures == values


def test_a_fleets_alike_failures_share_a_block_and_every_link_finds_its_block():
    """100 nodes: ten lost together (each reason names its own address and second) fail two
    checks alike, two fail memory with figures of their own, one fails it as an error: the ten
    are one block per check naming their hostlist, the first node's details and the node search,
    and one matrix row and one attention row; each other failure keeps its block (and, with its
    outlier, its row); every link in
    the page finds its block."""
    nodes = [f"gpu{i:03d}" for i in range(1, 101)]
    lost = nodes[10:20]
    checks = []
    for number, node in enumerate(nodes):
        if node in lost:
            reason = f"{node} unreachable: lost at 10:00:{number:02d} (port 22 on 10.0.3.{number} refused)"
            checks += [check(node, name, "failed", kind="unreachable", message=reason) for name in ("memory", "cpu")]
            continue
        value = {"gpu050": 3.0, "gpu060": 2.5}.get(node, 20.0)
        checks += [check(node, "memory", "failed" if value < 4 else "passed",
                         kind="performance" if value < 4 else None, message=f"memory {value} GiB",
                         metrics=(metric("memory_total", value, floor=4.0),)),
                   check(node, "cpu", "error" if node == "gpu070" else "passed", message="lscpu crashed")]
    document = results(nodes, checks, status="NOT CERTIFIED")
    for entry in document["nodes"]:
        if entry["name"] in lost:
            entry["reasons"] = [c["message"] for c in checks if c["node"] == entry["name"]]
    root = parse(render_html(document))

    blocks = root.find_all("article", "failure")
    headings = [block.find("h3").text() for block in blocks]
    assert headings == ["gpu[011-020] (10 nodes) · memory", "gpu[011-020] (10 nodes) · cpu",
                        "gpu050 · memory", "gpu060 · memory", "gpu070 · cpu"]
    assert root.by_id("failures").text() == "Failures (23)"
    memory = blocks[0]
    assert "gpu011 unreachable: lost at 10:00:10 (port 22 on 10.0.3.10 refused)" in memory.text()
    assert "details of gpu011, the first" in memory.text()
    assert [a.attrs["href"] for a in memory.find_all("a") if "node=" in a.attrs["href"]] == \
        ["#node=gpu011", "#node=gpu%5B011-020%5D"]
    assert "memory 3.0 GiB" in blocks[2].text() and "memory 2.5 GiB" in blocks[3].text()

    rows = matrix_rows(root)
    assert [label for label, _ in rows if "gpu[011-020]" in label] == ["10 nodes alikegpu[011-020]"]
    lost_row = next(tr for tr in root.find("table", "matrix").find("tbody").find_all("tr")
                    if "gpu[011-020]" in tr.find("th").text())
    assert [a.attrs["href"] for a in lost_row.find_all("a", "sq-failed")] == \
        [f"#{blocks[0].attrs['id']}", f"#{blocks[1].attrs['id']}"]
    attention = [tr.text() for tr in root.find("table", "attention-table").find("tbody").find_all("tr")]
    assert len(attention) == 4 and "gpu[011-020] (10 nodes)" in attention[0]  # gpu050, gpu060 are outliers too

    ids = {element.attrs["id"] for element in root.iter() if "id" in element.attrs}
    targets = {element.attrs["href"][1:] for element in root.iter()
               if element.tag == "a" and element.attrs.get("href", "").startswith("#")
               and not element.attrs["href"].startswith("#node=")}
    assert targets - ids == set()


def test_a_small_clusters_failures_keep_a_block_each():
    """Four nodes lost alike: each its own block, its own matrix row and its own words."""
    nodes = ["node1", "node2", "node3", "node4"]
    checks = [check(node, "memory", "failed", kind="unreachable", message=f"{node} unreachable at 10.0.0.{i}")
              for i, node in enumerate(nodes)]
    root = parse(render_html(results(nodes, checks, status="NOT CERTIFIED")))
    assert [block.find("h3").text() for block in root.find_all("article", "failure")] == \
        [f"{node} · memory" for node in nodes]
    assert [label for label, _ in matrix_rows(root)] == nodes
    assert "details of" not in root.find("article", "failure").text()


def test_the_nodes_by_rack_are_a_row_of_squares_each(tmp_path):
    """An inventory placing four of six nodes in two racks (`rack:` on their groups): the run's
    ledger and results.json give each node its rack (null for the two it places nowhere), and the
    report draws each rack as a row of squares of its nodes' statuses, a lost rack red, each
    square leading to its node's results. Without racks or leaves there is no such picture."""
    from handover.session import run_header
    from inventory.loader import load_inventory
    from reports.ledger import Ledger, now_iso, read_ledger
    from reports.results import build_results

    path = tmp_path / "pod.yaml"
    path.write_text("cluster: pod\nprofile: cpu-only\nnodes: ['n[1-6]']\ngroups:\n"
                    "  a: {nodes: 'n[1-2]', rack: r01, leaf: leaf01}\n  b: {nodes: 'n[3-4]', rack: r02}\n")
    cluster = load_inventory(path)
    ledger = Ledger.create(tmp_path, cluster.name, run_header(cluster, list(cluster.nodes)))
    lost = {"n3", "n4"}
    checks = [check(node, "reachable", "failed" if node in lost else "passed",
                    kind="unreachable" if node in lost else None) for node in (n.name for n in cluster.nodes)]
    ledger.append({"type": "selection", "nodes": [n.name for n in cluster.nodes],
                   "tests": [c["test_id"] for c in checks]})
    for entry in checks:
        ledger.append({"type": "check", "depth": ["quick"], **entry})
    ledger.append({"type": "end", "finished": now_iso(), "exitstatus": 1, "interrupted": False})
    document = build_results(read_ledger(ledger.run_dir))[0]
    assert [(n["name"], n["rack"], n["leaf"]) for n in document["nodes"]] == [
        ("n1", "r01", "leaf01"), ("n2", "r01", "leaf01"), ("n3", "r02", None), ("n4", "r02", None),
        ("n5", None, None), ("n6", None, None)]

    root = parse(render_html(document))
    assert root.by_id("places").text() == "By rack"
    status = {n["name"]: n["status"] for n in document["nodes"]}  # incomplete: cpu-only's other mandatory checks
    assert status["n3"] == "failed" and status["n1"] != "failed"
    rows = root.find("table", "places").find("tbody").find_all("tr")
    assert [tr.find("td").text() for tr in rows] == ["r01", "r02", "not placed"]
    squares = [[(a.attrs["class"], a.attrs["href"], a.attrs["title"]) for a in tr.find_all("a")] for tr in rows]
    assert squares == [[(f"pl-{status[n]}", f"#node={n}", f"{n}: {status[n]}") for n in nodes]
                       for nodes in (["n1", "n2"], ["n3", "n4"], ["n5", "n6"])]
    assert [td.text() for td in rows[1].find_all("td")][1:4] == ["2", "0", "2"]
    assert "By rack" not in render_html(results(["n1", "n2"], [check("n1", "memory"), check("n2", "memory")]))
