"""The handover command's verbs and its usage errors: one line, exit 2, never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_verdict import check, header, node_checks, write_run

from reports.ledger import LEDGER_FILE, LEDGER_SCHEMA
from reports.verdict import REASONS_SHOWN

ROOT = Path(__file__).resolve().parent.parent


def handover(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handover.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_inventory_lists_the_nodes_in_hostlist_form():
    done = handover("inventory", ROOT / "inventory" / "local.yaml")
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == "cluster local: 1 node(s) localhost"
    assert "profile cpu-only" in done.stdout and "transport local" in done.stdout


def test_version_is_the_identity_a_run_records():
    from handover.session import harness_identity

    done = handover("--version")
    identity = harness_identity()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == f"handover {identity['version']} (commit {identity['commit']})\n"


def test_inventory_lists_nodes_reached_alike_in_one_line(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("cluster: fleet\nprofile: cpu-only\nssh: {user: ops}\n"
                    "nodes: ['gpu[0001-1024]', {name: gpu2000, address: 10.0.0.1}, {name: gpu2001, port: 2222}]\n")
    done = handover("inventory", path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[3:] == [
        "nodes gpu[0001-1024] (1,024 nodes): address its own name, user ops, port (ssh default); from yaml",
        "node gpu2000: address 10.0.0.1, user ops, port (ssh default); from yaml",
        "node gpu2001: address gpu2001, user ops, port 2222; from yaml"]


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """`handover inventory big.yaml --json | head`: no BrokenPipeError traceback, a shell's 141."""
    path = tmp_path / "fleet.yaml"
    nodes = ", ".join(f"{{name: n{index}, address: 10.0.{index // 250}.{index % 250 + 1}}}" for index in range(4000))
    path.write_text(f"cluster: fleet\nprofile: cpu-only\nnodes: [{nodes}]\n")
    listing = subprocess.Popen([sys.executable, "-m", "handover.cli", "inventory", str(path), "--json"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert listing.stdout is not None and listing.stderr is not None
    assert listing.stdout.readline() == "{\n"
    listing.stdout.close()
    assert listing.wait(timeout=120) == 141
    assert listing.stderr.read() == ""


def test_parse_an_unknown_tool_names_the_known_ones(tmp_path):
    sample = tmp_path / "out.txt"
    sample.write_text("hello\n")
    done = handover("parse", "no-such-tool", sample)
    assert done.returncode == 2
    assert done.stderr.startswith("handover: parse: unknown tool 'no-such-tool'; known:")
    assert "Traceback" not in done.stderr


def test_parse_a_missing_file_is_one_line(tmp_path):
    from handover.cli import tool_parsers

    for tool in sorted(tool_parsers())[:1]:
        done = handover("parse", tool, tmp_path / "missing.txt")
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "No such file" in done.stderr


def test_every_registered_parser_rejects_text_that_is_not_its_tools(tmp_path):
    from handover.cli import tool_parsers

    garbage = tmp_path / "garbage.txt"
    garbage.write_text("this is not the output of any tool\n")
    for tool in sorted(tool_parsers()):
        done = handover("parse", tool, garbage)
        assert done.returncode == 2, tool
        assert done.stderr.startswith(f"handover: {garbage}: not {tool} output:"), done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_report_and_verify_of_a_directory_that_is_not_a_run(tmp_path):
    home = tmp_path / "home"
    report = subprocess.run([sys.executable, "-m", "handover.cli", "report", str(tmp_path / "run")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "HANDOVER_HOME": str(home)})
    assert report.returncode == 2 and "no ledger here" in report.stderr
    assert not home.exists()  # no signing key made for a run that is not there
    verify = handover("verify", tmp_path / "missing")
    assert verify.returncode == 2 and "no such run directory" in verify.stderr


def test_report_of_a_ledger_torn_in_the_middle_is_one_line_naming_file_and_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    header = json.dumps({"type": "run", "schema": LEDGER_SCHEMA, "run_id": "x"})
    (run_dir / LEDGER_FILE).write_text(header + '\n{"type": "che\n{"type": "end"}\n')
    report = handover("report", run_dir)
    assert report.returncode == 2
    assert report.stderr.splitlines() == [f"handover: {run_dir / LEDGER_FILE}:2: not a JSON object"]


def test_report_of_an_edited_ledger_is_one_line(tmp_path, sign_key):
    """Entries no harness writes (a check without its test_id, an outcome results.json does not
    know): one line naming the ledger, exit 2, and no report written from them."""
    nodes = ["n01"]
    no_id = write_run(tmp_path / "a", [*node_checks(nodes[0])], head=header(nodes))
    lines = (no_id / LEDGER_FILE).read_text().splitlines()
    first = json.loads(lines[2])  # after the header and the selection
    del first["test_id"]
    (no_id / LEDGER_FILE).write_text("\n".join([*lines[:2], json.dumps(first), *lines[3:]]) + "\n")
    done = handover("report", no_id, "--sign-key", sign_key)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"handover: {no_id / LEDGER_FILE}:3: a check entry without a test_id"]

    unknown = write_run(tmp_path / "b", [check(nodes[0], "os", "xfailed")], head=header(nodes))
    done = handover("report", unknown, "--sign-key", sign_key)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"handover: {unknown / LEDGER_FILE} makes no valid results: results.json: checks[0].outcome: "
        "'xfailed' is not one of ['passed', 'failed', 'skipped', 'error']"]
    assert not (unknown / "report.html").exists()


def test_report_prints_the_verdict_as_pytest_does_the_first_reasons_then_a_count(tmp_path, sign_key):
    """22 unreachable nodes, each one reason naming five of its seven checks: the terminal shows
    the first REASONS_SHOWN reasons and counts the rest, which results.json has in full."""
    nodes = [f"n{number:02d}" for number in range(1, 24)]
    names = ["reachable", "memory", "cpu", "os", "kernel", "disk", "gpu"]
    entries = [check(node, name, "failed", kind="unreachable", message=f"{node} unreachable: no answer")
               for node in nodes[1:] for name in names]
    run_dir = write_run(tmp_path, [*node_checks(nodes[0]), *entries, check(None, "uniformity")],
                        head=header(nodes))
    done = handover("report", run_dir, "--sign-key", sign_key)
    assert done.returncode == 0, done.stderr
    reasons = json.loads((run_dir / "results.json").read_text())["verdict"]["reasons"]
    assert len(reasons) == 22
    assert reasons[0] == "n02: reachable, memory, cpu, os, kernel and 2 more checks failed (unreachable): " \
                         "n02 unreachable: no answer"
    lines = done.stdout.splitlines()
    assert lines[0] == "verdict: NOT CERTIFIED"
    assert lines[1:REASONS_SHOWN + 2] == [f"  - {reason}" for reason in reasons[:REASONS_SHOWN]] + [
        f"  ... and {22 - REASONS_SHOWN} more (see the report)"]
    assert lines[REASONS_SHOWN + 2] == f"report: {run_dir / 'report.html'}"


def test_usage_errors_exit_2():
    assert handover().returncode == 2
    assert handover("frobnicate").returncode == 2


def test_verify_reads_no_renderer():
    """A customer's `handover verify` loads the bundle's checks, not the report renderer and the
    pandas and jinja2 under it (they took it from 0.24 s to 0.81 s, and a verifier has no use for them)."""
    renderer = "{'pandas', 'jinja2', 'reports.html', 'reports.render'}"
    loaded = subprocess.run([sys.executable, "-c", "import sys, handover.cli, reports.verify; "
                             f"print(sorted({renderer} & set(sys.modules)))"],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
