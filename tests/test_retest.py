"""Re-tests on the record: `--retest RUN_DIR` runs again only what a run lacked, on the nodes it
concerns, as a signed addendum tied to the original's report ID.

Two real runs on this machine (transport local): a memory band the inventory makes impossible
fails the original; the band is corrected in the inventory and the re-test runs that check alone.
Two namespace nodes, one behind a dead link, check that only the failed node is re-tested. Both
select a few cheap checks with -k, under a profile that makes just those mandatory (CI time). The
verdict's rules and the bad inputs are tested on ledgers shaped like theirs.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from test_e2e import handover, results_of, run_dir_of, run_suites, ssh_keygen_verifies

from handover.session import AcceptanceSession, SessionError
from reports import bundle, signing
from reports.bundle import BUNDLE_SIGNED
from reports.html import render_html
from reports.ledger import RunRecord
from reports.retest import NOT_RUN, RETEST_OF, Original, addendum_view, build_addendum
from reports.schema import validate_ledger_entry, validate_results
from reports.verdict import CERTIFIED, INCOMPLETE, NOT_CERTIFIED
from reports.verify import verify_run

ROOT = Path(__file__).resolve().parent.parent
MEMORY = "suites/test_system.py::test_memory[localhost]"
# A few cheap checks; the profile below makes these, and only these, mandatory.
CHEAP = ("-m", "system", "-k", "test_reachable or test_memory or test_os")
# This machine is one node to every local run on it (other test runs too): wait for its lock.
WAIT = ("--busy-nodes", "wait")
IMPOSSIBLE = "  memory_total: {value: 100000, lower: -0.02, source: \"contract: 100 TB per node\"}\n"


def retest_run(inventory: Path, key: Path, original: Path, *extra) -> subprocess.CompletedProcess:
    """pytest --inventory FILE --retest RUN_DIR, without --out: the re-test goes beside the original."""
    return subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(inventory), "--sign-key", str(key),
                           "--retest", str(original), "-p", "no:cacheprovider", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def cheap_profile(directory: Path) -> Path:
    """cpu-only with only the CHEAP checks mandatory: a run of those alone can be certified."""
    import yaml

    profile = yaml.safe_load((ROOT / "inventory" / "profiles" / "cpu-only.yaml").read_text())
    profile.update(profile="retest-smoke", mandatory=["reachable", "os", "memory"])
    path = directory / "retest-smoke.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def local_inventory(directory: Path, references: str = "", cluster: str = "here") -> Path:
    path = directory / f"{cluster}.yaml"
    path.write_text(f"cluster: {cluster}\ncluster_id: ACME-{cluster.upper()}\nprofile: {cheap_profile(directory)}\n"
                    "transport: local\nnodes: [localhost]\n" + (f"references:\n{references}" if references else ""))
    return path


@pytest.fixture(scope="module")
def local_retest(sign_key, tmp_path_factory):
    """The original (memory fails: an impossible band), then the re-test once the inventory's
    band is corrected: (original run, re-test run, their run directories, the re-test's inventory)."""
    tmp = tmp_path_factory.mktemp("retest")
    inventory = local_inventory(tmp, IMPOSSIBLE)
    first = run_suites(inventory, tmp / "out", sign_key, *CHEAP, *WAIT)
    original = run_dir_of(tmp / "out", "here")
    local_inventory(tmp)  # the band corrected, the same file
    second = retest_run(inventory, sign_key, original, *CHEAP, *WAIT)
    return first, second, original, run_dir_of(tmp / "out", "here"), inventory


def test_the_original_fails_and_the_retest_runs_only_that_check(local_retest):
    first, second, original, retest, _ = local_retest
    assert first.returncode == 1, first.stdout + first.stderr
    assert results_of(original)["verdict"]["status"] == NOT_CERTIFIED
    assert second.returncode == 0, second.stdout + second.stderr
    assert retest != original and retest.parent == original.parent  # beside it, not under --out's default
    ledger = [json.loads(line) for line in (retest / "ledger.jsonl").read_text().splitlines()]
    for line in ledger:
        validate_ledger_entry(line)
    selection = next(line for line in ledger if line["type"] == "selection")
    assert selection == {"type": "selection", "nodes": ["localhost"], "tests": [MEMORY]}
    assert [line["test_id"] for line in ledger if line["type"] == "check"] == [MEMORY]
    assert "1 passed" in second.stdout and "deselected" in second.stdout


def test_the_addendum_is_tied_to_the_original_and_shows_both_outcomes(local_retest):
    _, second, original, retest, _ = local_retest
    before, after = results_of(original), results_of(retest)
    validate_results(after)
    tie = after["run"][RETEST_OF]
    assert tie["report_id"] == before["run"]["report_id"] == f"ACME-HERE-{original.name}"
    assert tie["run_id"] == original.name
    assert tie["results_sha256"] == hashlib.sha256((original / "results.json").read_bytes()).hexdigest()
    assert tie["inventory_sha256"] == before["run"]["inventory"]["sha256"] != after["run"]["inventory"]["sha256"]
    [row] = after["retest"]
    assert row["test_id"] == MEMORY and row["node"] == "localhost"
    assert row["original"]["outcome"] == "failed" and row["original"]["kind"] == "performance"
    assert "expected >= 98000 GiB" in row["original"]["message"]
    assert row["retest"]["outcome"] == "passed"
    assert after["verdict"]["status"] == CERTIFIED
    assert after["verdict"]["reasons"][0] == f"addendum to {tie['report_id']}: 1 of 1 outstanding check(s) now pass"
    assert "verdict: CERTIFIED" in second.stdout
    html = (retest / "report.html").read_text()
    assert f"Addendum to <span class=\"mono\">{tie['report_id']}</span>" in html
    failed, passed = '<span class="badge badge-failed">failed</span>', '<span class="badge badge-passed">passed'
    assert f"{failed}</td>\n      <td>{passed}" in html


def test_both_runs_stay_signed_and_the_history_stays_visible(local_retest):
    _, _, original, retest, _ = local_retest
    for run_dir in (original, retest):
        assert ssh_keygen_verifies(run_dir, "report.html") and ssh_keygen_verifies(run_dir, "results.json")
    assert results_of(original)["verdict"]["status"] == NOT_CERTIFIED  # never rewritten
    assert "Addendum" not in (original / "report.html").read_text()
    assert (original.parent / "latest").resolve() == retest
    check = verify_run(original)
    assert check.ok and not any("retest_of" in str(finding) for finding in check.findings)


def test_verify_checks_the_tie_when_the_original_is_beside_it(local_retest, tmp_path, trusted_signers):
    _, _, original, retest, _ = local_retest
    verified = handover("verify", retest, "--allowed-signers", trusted_signers)
    assert verified.returncode == 0, verified.stdout
    assert f"OK  retest_of ACME-HERE-{original.name}: the original {original.name} verifies" in verified.stdout

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copytree(retest, alone / retest.name)
    check = verify_run(alone / retest.name)
    assert check.ok
    assert f"-- retest_of ACME-HERE-{original.name}: the original run directory {original.name} is not " \
           "beside this one: the tie is not checked (put it there and verify again)" in map(str, check.findings)

    both = tmp_path / "both"
    both.mkdir()
    for run_dir in (original, retest):
        shutil.copytree(run_dir, both / run_dir.name)
    assert verify_run(both / retest.name).ok
    raw = next((both / original.name / "raw").rglob("*.stdout"))
    raw.write_bytes(raw.read_bytes() + b" ")
    [problem] = verify_run(both / retest.name).problems
    assert str(problem).startswith(f"BAD retest_of ACME-HERE-{original.name}: the original {original.name} "
                                   f"has 1 problem(s): BAD raw/")

    results = both / original.name / "results.json"
    results.write_bytes(results.read_bytes().replace(b"NOT CERTIFIED", b"CERTIFIED"))
    [problem] = verify_run(both / retest.name).problems
    assert str(problem).startswith(f"BAD retest_of ACME-HERE-{original.name}: {original.name}/results.json has SHA-256")

    # The original's ledger changed and its bundle re-signed and re-sealed by another key; its
    # results.json, which the re-test names by digest, left as it was.
    forged = tmp_path / "forged"
    forged.mkdir()
    for run_dir in (original, retest):
        shutil.copytree(run_dir, forged / run_dir.name)
    forger, _ = signing.ensure_default_key(tmp_path / "forger" / "signing_key")
    copy = forged / original.name
    (copy / "ledger.jsonl").write_bytes((copy / "ledger.jsonl").read_bytes() + b"\n")
    for name in ("results.json", "report.html"):
        signing.sign_file(copy / name, forger)
    signing.write_allowed_signers(copy / "allowed_signers", forger, "ops@example.com")
    bundle.seal(copy, original.name, forger, BUNDLE_SIGNED)
    [problem] = verify_run(forged / retest.name).problems
    operator = signing.verify_file(retest / "results.json").fingerprint
    assert str(problem) == (f"BAD retest_of ACME-HERE-{original.name}: the original {original.name} was signed by "
                            f"key {forger.fingerprint}, not by {operator}, which signed this re-test")
    assert not verify_run(forged / retest.name, trusted_signers).ok  # the customer's list refuses it too


def test_a_retest_with_nothing_outstanding_is_refused(local_retest, sign_key, tmp_path):
    """The re-test passed all it re-tested: re-testing it again finds nothing (what passed in the
    original is on the original's record), before a run directory is made."""
    _, _, _, retest, inventory = local_retest
    session = AcceptanceSession.open(inventory=str(inventory), out=None, nodes=None, resume=None,
                                     sign_key=str(sign_key), retest=str(retest), say=lambda line: None)
    with pytest.raises(SessionError) as caught:
        session.retest_selection([(MEMORY, "memory", "localhost"), (MEMORY.replace("memory", "os"), "os", "localhost")])
    assert str(caught.value) == f"--retest: {retest} has nothing to re-test: no check failed, errored or went " \
                                "without a result"
    assert session.ledger is None


def test_a_resumed_retest_keeps_to_what_it_set_out_to_retest(local_retest, sign_key):
    """--resume of a re-test cut short runs only its own outstanding checks that lack a result."""
    _, _, _, retest, inventory = local_retest
    session = AcceptanceSession.open(inventory=str(inventory), out=None, nodes=None, resume=str(retest),
                                     sign_key=str(sign_key), say=lambda line: None)
    assert session.retest_selection([(MEMORY, "memory", "localhost"),
                                     (MEMORY.replace("memory", "os"), "os", "localhost")]) == {MEMORY}
    assert session.already_done() == {MEMORY}


def test_bad_run_directories_are_one_line_and_a_non_zero_exit(local_retest, sign_key, tmp_path):
    _, _, original, _, inventory = local_retest
    done = run_suites(inventory, tmp_path / "out", sign_key, "--retest", tmp_path / "nosuchrun")
    assert done.returncode == 4
    assert [line for line in done.stderr.splitlines() if line.strip()] == \
        [f"ERROR: --retest: {tmp_path / 'nosuchrun'}: no such run directory"]

    def refusal(retest: Path, inventory: Path = inventory, resume: Optional[str] = None) -> str:
        with pytest.raises(SessionError) as caught:
            AcceptanceSession.open(inventory=str(inventory), out=str(tmp_path / "out"), nodes=None, resume=resume,
                                   sign_key=str(sign_key), retest=str(retest), say=lambda line: None)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert refusal(tmp_path) == f"--retest: {tmp_path}/ledger.jsonl: no ledger here; is {tmp_path} a handover " \
                                "run directory?"
    unrendered = tmp_path / "unrendered"
    shutil.copytree(original, unrendered)
    (unrendered / "results.json").unlink()
    assert refusal(unrendered) == f"--retest: {unrendered}: no results.json to tie the re-test to; render it " \
                                  f"first with `handover report {unrendered}`"
    other = local_inventory(tmp_path, cluster="there")
    assert refusal(original, other) == (
        f"--retest: {original} is a run of cluster here (ACME-HERE), not of there (ACME-THERE) as {other} says; "
        "re-test with that cluster's inventory")
    assert refusal(original, resume=str(original)).startswith("--retest and --resume: give one")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- two namespace nodes


def test_only_the_failed_node_is_retested(ns_cluster_factory, sign_key, tmp_path):
    """node2 behind a dead link fails every check as unreachable; its link mended, the re-test
    runs node2's checks alone (node1's passed: they stand on the original's record)."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml", profile=str(cheap_profile(tmp_path)))
    nodes.link_down("node2")
    first = run_suites(inventory, tmp_path / "out", sign_key, *CHEAP)
    assert first.returncode == 1, first.stdout + first.stderr
    original = run_dir_of(tmp_path / "out", "nscluster")
    failed = {c["test_id"] for c in results_of(original)["checks"] if c["outcome"] == "failed"}
    assert failed and all(test_id.endswith("[node2]") for test_id in failed)

    nodes.link_up("node2")
    second = retest_run(inventory, sign_key, original, *CHEAP)
    assert second.returncode == 0, second.stdout + second.stderr
    after = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    assert after["run"]["nodes"] == ["node2"]
    assert {c["test_id"] for c in after["checks"]} == failed
    assert {row["original"]["kind"] for row in after["retest"]} == {"unreachable"}
    assert all(row["retest"]["outcome"] == "passed" for row in after["retest"])
    assert after["verdict"]["status"] == CERTIFIED


def test_after_an_outage_the_retest_judges_cluster_wide_checks_and_certifies(ns_cluster_factory, sign_key, tmp_path):
    """node2 behind a dead link for the whole run: its checks fail as unreachable, and uniformity
    (cluster-wide) is judged without its facts. The link mended, the re-test runs node2's checks
    and uniformity on both nodes: node1, which takes part in uniformity only, is not an untested
    node of the addendum (it was, and the addendum came out INCOMPLETE though all passed)."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml", profile=str(cheap_profile(tmp_path)))
    checks = ("-m", "system", "-k", "test_reachable or test_memory or test_os or test_uniformity")
    nodes.link_down("node2")
    try:
        first = run_suites(inventory, tmp_path / "out", sign_key, *checks)
    finally:
        nodes.link_up("node2")
    assert first.returncode == 1, first.stdout + first.stderr
    original = run_dir_of(tmp_path / "out", "nscluster")

    second = retest_run(inventory, sign_key, original, *checks)
    after = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    retested = {(row["check"], row["node"]): row["retest"]["outcome"] for row in after["retest"]}
    assert retested == {("reachable", "node2"): "passed", ("memory", "node2"): "passed", ("os", "node2"): "passed",
                        ("uniformity", None): "passed"}
    assert after["run"]["nodes"] == ["node1", "node2"]
    assert after["verdict"]["status"] == CERTIFIED, after["verdict"]
    assert [node["name"] for node in after["nodes"]] == ["node2"]  # node1 is judged on the original's record


# ---------------------------------------------------------------- the verdict, on ledgers


SYSTEM = "suites/test_system.py"
PROFILE = {"name": "cpu-only", "description": "", "mandatory": ["memory", "os", "uniformity"], "expect": {},
           "references": {}}


def entry(check: str, node: Optional[str], outcome: str, message: str = "") -> dict:
    test_id = f"{SYSTEM}::test_{check}[{node}]" if node else f"{SYSTEM}::test_{check}"
    return {"type": "check", "test_id": test_id, "check": check, "area": "system", "depth": ["quick"],
            "node": node, "outcome": outcome, "kind": "sanity" if outcome == "failed" else None,
            "message": message, "log_excerpt": "", "duration_s": 0.1, "finished": "2026-12-01T10:00:00+00:00",
            "raw": [], "metrics": []}


def record(checks: list[dict], planned: list[str], run_id: str = "20261201T100000Z-0000000a",
           retest_of: Optional[dict] = None) -> RunRecord:
    header = {"type": "run", "schema": "handover.ledger/1", "run_id": run_id, "started": "2026-12-01T10:00:00+00:00",
              "cluster": "pod", "cluster_id": "POD", "profile": PROFILE,
              "inventory": {"path": "/i.yaml", "sha256": "1" * 64}, "harness": {"version": "0.1.0", "commit": None},
              "argv": [], "nodes": ["n1", "n2"]}
    if retest_of is not None:
        header[RETEST_OF] = retest_of
    return RunRecord(run_dir=Path("/nowhere"), header=header, checks=checks,
                     selection={"type": "selection", "nodes": ["n1", "n2"], "tests": planned},
                     end={"type": "end", "finished": "2026-12-01T10:05:00+00:00", "interrupted": False})


def collected(*pairs: tuple[str, Optional[str]]) -> list[tuple[str, str, Optional[str]]]:
    return [(f"{SYSTEM}::test_{check}[{node}]" if node else f"{SYSTEM}::test_{check}", check, node)
            for check, node in pairs]


@pytest.fixture
def original() -> Original:
    """n2's memory failed, n1's kernel errored, n2's kernel was planned but has no result, os was
    never run (mandatory), n1's optional ecc skipped; everything else passed."""
    checks = [entry("memory", "n1", "passed"), entry("memory", "n2", "failed", "memory_total = 1 GiB\nmore"),
              entry("kernel", "n1", "error", "TimeoutError"), entry("ecc", "n1", "skipped", "no GPU"),
              entry("uniformity", None, "passed")]
    planned = [c["test_id"] for c in checks] + [f"{SYSTEM}::test_kernel[n2]"]
    return Original(Path("/nowhere"), record(checks, planned), "POD-20261201T100000Z-0000000a", "2" * 64)


def test_the_outstanding_checks_are_failures_missing_results_and_unrun_mandatory_ones(original):
    found = original.outstanding(collected(("memory", "n1"), ("memory", "n2"), ("kernel", "n1"), ("kernel", "n2"),
                                           ("os", "n1"), ("os", "n2"), ("ecc", "n1"), ("uniformity", None)))
    assert [(row["check"], row["node"], row["outcome"]) for row in found] == [
        ("memory", "n2", "failed"), ("kernel", "n1", "error"), ("kernel", "n2", NOT_RUN),
        ("os", "n1", NOT_RUN), ("os", "n2", NOT_RUN),
        ("uniformity", None, "passed")]  # it passed without n2's memory: judged again beside n2's
    assert found[0]["message"] == "memory_total = 1 GiB"  # the first line, as the table shows it
    assert original.header(found)["report_id"] == "POD-20261201T100000Z-0000000a"


def addendum_of(original: Original, retested: list[dict], run_id: str = "20261202T100000Z-0000000b") -> dict:
    outstanding = original.outstanding(collected(("os", "n1")))
    retest = record(retested, [c["test_id"] for c in retested], run_id, original.header(outstanding))
    results, verdict = build_addendum(retest)
    validate_results(results)
    assert results["verdict"]["status"] == verdict.status
    return results


def test_every_outstanding_check_passing_certifies_the_addendum(original):
    results = addendum_of(original, [entry("memory", "n2", "passed"), entry("kernel", "n1", "passed"),
                                     entry("kernel", "n2", "passed"), entry("os", "n1", "passed")])
    assert results["verdict"]["status"] == CERTIFIED
    assert results["verdict"]["reasons"][0] == "addendum to POD-20261201T100000Z-0000000a: 4 of 4 outstanding " \
                                               "check(s) now pass"


def test_a_failure_not_retested_stays_on_the_original_record(original):
    results = addendum_of(original, [entry("kernel", "n1", "passed"), entry("kernel", "n2", "passed"),
                                     entry("os", "n1", "passed")])
    assert results["verdict"]["status"] == NOT_CERTIFIED
    assert "n2: memory was not re-tested; it stays failed on the record of POD-20261201T100000Z-0000000a" \
        in results["verdict"]["reasons"]
    assert next(row for row in results["retest"] if row["check"] == "memory")["retest"] is None


def test_a_missing_result_not_retested_or_a_mandatory_check_that_skips_is_incomplete(original):
    results = addendum_of(original, [entry("memory", "n2", "passed"), entry("kernel", "n1", "skipped", "no dmesg"),
                                     entry("os", "n1", "skipped", "no os-release")])
    assert results["verdict"]["status"] == INCOMPLETE
    reasons = results["verdict"]["reasons"]
    assert "n2: kernel was not re-tested; it stays not run on the record of POD-20261201T100000Z-0000000a" in reasons
    assert "n1: mandatory check 'os' skipped: no os-release" in reasons
    assert not any("kernel skipped" in reason for reason in reasons)  # optional: it may skip, as in any run


def test_a_retest_fails_where_a_check_fails_again(original):
    results = addendum_of(original, [entry("memory", "n2", "failed", "memory_total = 1 GiB"),
                                     entry("kernel", "n1", "passed"), entry("kernel", "n2", "passed"),
                                     entry("os", "n1", "passed")])
    assert results["verdict"]["status"] == NOT_CERTIFIED
    assert "n2: memory failed (sanity): memory_total = 1 GiB" in results["verdict"]["reasons"]


def test_a_retest_can_be_retested(original):
    """What a re-test still lacks is the original's outstanding checks with its outcomes laid over."""
    first = record([entry("memory", "n2", "failed"), entry("kernel", "n1", "passed")],
                   [f"{SYSTEM}::test_memory[n2]", f"{SYSTEM}::test_kernel[n1]"], "20261202T100000Z-0000000b",
                   original.header(original.outstanding([])))
    again = Original(Path("/nowhere"), first, "POD-20261202T100000Z-0000000b", "3" * 64).outstanding([])
    assert [(row["check"], row["node"], row["outcome"]) for row in again] == [
        ("memory", "n2", "failed"), ("kernel", "n2", NOT_RUN)]


def test_the_addendum_table_escapes_what_tools_printed(original):
    hostile = '<script>alert(1)</script>"><img onerror=alert(2)>'
    results = addendum_of(original, [entry("memory", "n2", "failed", hostile)])
    html = render_html(results)
    assert "<script>alert" not in html and "<img onerror" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img onerror=alert(2)&gt;" in html
    assert "Addendum to <span class=\"mono\">POD-20261201T100000Z-0000000a</span>" in html


def test_a_cluster_wide_pass_is_judged_again_only_beside_a_retested_node():
    """uniformity passed while n2's memory failed: re-testing n2 runs it again, and its new
    outcome is the addendum's; with only a cluster-wide failure outstanding, no other cluster
    check is re-run, and one no longer collected is not asked for."""
    checks = [entry("memory", "n1", "passed"), entry("memory", "n2", "failed"), entry("uniformity", None, "passed"),
              entry("os", "n1", "passed"), entry("os", "n2", "passed")]
    first = Original(Path("/nowhere"), record(checks, [c["test_id"] for c in checks]), "POD-1", "2" * 64)
    everything = collected(("memory", "n1"), ("memory", "n2"), ("uniformity", None), ("os", "n1"), ("os", "n2"))
    outstanding = first.outstanding(everything)
    assert [(row["check"], row["node"], row["outcome"]) for row in outstanding] == [
        ("memory", "n2", "failed"), ("uniformity", None, "passed")]
    assert [row["check"] for row in first.outstanding(everything[:2])] == ["memory"]  # uniformity not collected

    retested = [entry("memory", "n2", "passed"), entry("uniformity", None, "failed", "n2 has 4 GiB, n1 8 GiB")]
    retest = record(retested, [c["test_id"] for c in retested], "20261202T100000Z-0000000b", first.header(outstanding))
    results, verdict = build_addendum(retest)
    assert verdict.status == NOT_CERTIFIED
    assert {row["check"]: row["retest"]["outcome"] for row in results["retest"]} == {"memory": "passed",
                                                                                    "uniformity": "failed"}

    cluster_only = [entry("memory", "n1", "passed"), entry("uniformity", None, "failed"), entry("os", None, "passed")]
    only = Original(Path("/nowhere"), record(cluster_only, [c["test_id"] for c in cluster_only]), "POD-2", "2" * 64)
    assert [row["check"] for row in only.outstanding(collected(("uniformity", None), ("os", None)))] == ["uniformity"]


def test_a_fleets_addendum_rows_alike_share_one():
    """A re-test of 70 nodes lost in the original: 66 pass now, 4 fail alike but for their own
    address; in a fleet that is two rows naming their nodes, with the counts of checks."""
    nodes = [f"gpu{i:03d}" for i in range(1, 71)]
    rows = [{"check": "memory", "node": node,
             "original": {"outcome": "failed", "message": f"{node} unreachable at 10.0.0.{i}"},
             "retest": {"outcome": "failed", "message": f"{node}: memory_total = 1 GiB at 10.0.1.{i}"}
             if i % 20 == 7 else {"outcome": "passed", "message": ""}} for i, node in enumerate(nodes)]
    results = {"run": {RETEST_OF: {"report_id": "POD-1", "run_id": "1", "results_sha256": "2" * 64}}, "retest": rows}
    view = addendum_view(results, str, fleet=True)
    assert (view["checks"], view["passing"]) == (70, 66)
    assert [(row["where"], row["retest"], row["count"]) for row in view["rows"]] == [
        ("gpu[008,028,048,068] (4 nodes)", "failed", 4),
        ("gpu[001-007,009-027,029-047,049-067,069-070] (66 nodes)", "passed", 66)]
    assert view["rows"][0]["retest_message"] == "gpu008: memory_total = 1 GiB at 10.0.1.7"
    assert len(addendum_view(results, str)["rows"]) == 70
