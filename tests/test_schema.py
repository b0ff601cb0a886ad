"""The JSON Schemas of results.json and ledger.jsonl: real documents validate, broken ones fail
with one line naming the path, and the schemas keep the code's vocabulary.

Documents are made the way the harness makes them: ledgers written with the real Ledger and
run_header, metric rows from suites.checks.Metrics.judge, curves from series_entry, results from
build_results; and one real run of pytest against this machine (transport: local).
"""
from __future__ import annotations

import copy
import fnmatch
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from jsonschema import Draft202012Validator

from handover import failures
from handover.recorder import AREAS, DEPTHS
from handover.session import run_header
from inventory.loader import load_inventory
from reports.ledger import LEDGER_FILE, LEDGER_SCHEMA, Ledger, now_iso, read_ledger
from reports.results import RESULTS_SCHEMA, build_results
from reports.schema import (
    LEDGER_ENTRY_SCHEMA_FILE,
    RESULTS_SCHEMA_FILE,
    SCHEMA_DIR,
    SchemaError,
    validate_ledger_entry,
    validate_results,
)
from reports.verdict import CERTIFIED, INCOMPLETE, NOT_CERTIFIED
from suites.checks import X_SCALES, Metrics, series_entry

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILES = (RESULTS_SCHEMA_FILE, LEDGER_ENTRY_SCHEMA_FILE)
SHARED_DEFINITIONS = ("inventory", "harness", "check", "metric", "reference", "series")
SIGNER = {"fingerprint": "SHA256:Np0Oabc", "public_key": "ssh-ed25519 AAAAC3Nz ops@example.com"}


def schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def local_cluster():
    return load_inventory(ROOT / "inventory" / "local.yaml")


def judged(check: str, **measured) -> list[dict]:
    """The metric rows Metrics.judge records for `check` against the cpu-only profile."""
    rows: list[dict] = []
    try:
        Metrics(check, local_cluster().profile, rows.extend).judge(**measured)
    except failures.PerformanceFailure:
        pass
    return rows


def entry(test_id: str, check: str, outcome: str = "passed", *, node: Optional[str] = "localhost",
          kind: Optional[str] = None, message: str = "", metrics: Optional[list] = None,
          **extra) -> dict:
    """A check entry with the keys recorder.check_entry writes."""
    return {"type": "check", "test_id": test_id, "check": check, "area": "system",
            "depth": ["quick"], "node": node, "outcome": outcome, "kind": kind, "message": message,
            "log_excerpt": "", "duration_s": 0.125, "finished": now_iso(), "raw": [],
            "metrics": metrics or [], **extra}


def varied_entries() -> list[dict]:
    """One of each shape: judged metrics in and out of band and unmeasured, an unreferenced
    metric, a failure with its kind, a skip, a cluster-wide check with curves, a node's pairs on a rail."""
    busbw = series_entry("allreduce busbw", x=("message size", "B"), y=("busbw", "GB/s"),
                         lines={"localhost": [(1024, 0.5), (2048, float("nan")), (4096, 1.5)]},
                         x_scale="log2")
    loss = series_entry("training loss", x=("step", ""), y=("loss", ""), lines={"all": [(1, 2.5), (2, 2.1)]})
    return [
        entry("suites/test_system.py::test_memory[localhost]", "memory",
              metrics=judged("memory", memory_total=(23.5, "GiB"))),
        entry("suites/test_system.py::test_cpu[localhost]", "cpu", "failed", kind="performance",
              message="cpu_cores = 0 cores, expected >= 1 cores",
              metrics=judged("cpu", cpu_cores=(0, "cores"))),
        entry("suites/test_storage.py::test_scratch_throughput[s-quick-localhost]", "scratch_throughput",
              "failed", kind="performance",
              metrics=judged("scratch_throughput", scratch_seq_read=(1.2, "GB/s"))),
        entry("suites/test_system.py::test_reachable[localhost]", "reachable", "failed", kind="unreachable",
              message="localhost unreachable: connection refused"),
        entry("suites/test_hardware.py::test_gpu_inventory[localhost]", "gpu_inventory", "skipped",
              message="no NVIDIA GPU on localhost"),
        entry("suites/test_collectives.py::test_allreduce_cluster", "allreduce_cluster", node=None,
              series=[busbw, loss]),
        entry("suites/test_network.py::test_ib_write_bw[localhost-rail1]", "ib_write_bw", rail=1,
              pairs=[{"peer": "b", "state": "low", "figure": 180.5, "pass": 1},
                     {"peer": "c", "state": "failed", "figure": None, "pass": 2}], pair_median=390.0),
        entry("suites/test_network.py::test_iperf3[localhost]", "iperf3",
              metrics=judged("iperf3", iperf3_bandwidth=(20.0, "Gb/s"), iperf3_retransmits=(4, "count"))),
    ]


def write_run(tmp_path: Path, entries: list[dict], *, end: bool = True) -> Path:
    """A ledger as the recorder writes it: header, selection, tools and checks as they finish, end."""
    cluster = local_cluster()
    ledger = Ledger.create(tmp_path / "out", cluster.name, run_header(cluster, list(cluster.nodes)))
    ledger.append({"type": "selection", "nodes": ["localhost"], "tests": [e["test_id"] for e in entries]})
    ledger.append({"type": "tool", "node": "localhost", "tool": "python", "version": "3.11.2"})
    for item in entries:
        ledger.append(item)
    if end:
        ledger.append({"type": "end", "finished": now_iso(), "exitstatus": 1, "interrupted": False})
    return ledger.run_dir


def ledger_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text(encoding="utf-8").splitlines()]


def results_of(run_dir: Path, signer: Optional[dict] = SIGNER) -> dict:
    return build_results(read_ledger(run_dir), signer)[0]


def refusal(validate, document) -> str:
    with pytest.raises(SchemaError) as raised:
        validate(document)
    message = str(raised.value)
    assert "\n" not in message
    return message


# the schema files


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_the_schema_files_are_valid_draft_2020_12_schemas(name):
    document = schema(name)
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"].startswith("https://handover.example/schemas/")
    assert document["title"] and document["description"]


def documented(node: dict, definitions: dict) -> bool:
    target = definitions[node["$ref"].removeprefix("#/$defs/")] if "$ref" in node else node
    return bool(target.get("description"))


def properties_of(node) -> list[tuple[str, dict]]:
    """Every (name, subschema) under a `properties` in the schema, leaving out if/then/else:
    those only narrow properties defined beside them."""
    found = []
    if isinstance(node, dict):
        found += list((node.get("properties") or {}).items())
        for key, value in node.items():
            if key not in ("if", "then", "else"):
                found += properties_of(value)
    elif isinstance(node, list):
        for value in node:
            found += properties_of(value)
    return found


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_every_property_is_described(name):
    document = schema(name)
    found = properties_of(document)
    assert found
    undocumented = [key for key, sub in found if not documented(sub, document["$defs"])]
    assert undocumented == []
    assert all(definition.get("title") for definition in document["$defs"].values())


def test_both_schemas_share_their_definitions_of_checks_metrics_and_curves():
    """A ledger check entry is results.json's check plus its type: one definition, in both files
    (each file stands alone for consumers)."""
    results, ledger = schema(RESULTS_SCHEMA_FILE), schema(LEDGER_ENTRY_SCHEMA_FILE)
    for name in SHARED_DEFINITIONS:
        assert ledger["$defs"][name] == results["$defs"][name], name


def test_the_schema_files_are_package_data():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["reports"]
    assert SCHEMA_DIR == ROOT / "reports" / "schemas"
    for name in SCHEMA_FILES:
        assert any(fnmatch.fnmatch(f"schemas/{name}", pattern) for pattern in patterns), name
    assert any(requirement.startswith("jsonschema") for requirement in pyproject["project"]["dependencies"])


def test_the_schemas_enumerate_the_codes_vocabulary():
    """Outcomes, kinds, areas, depths, statuses and axis scales: what the code writes, no more."""
    results, ledger = schema(RESULTS_SCHEMA_FILE), schema(LEDGER_ENTRY_SCHEMA_FILE)
    check = results["$defs"]["check"]["properties"]
    kinds = {cls.kind for cls in vars(failures).values()
             if isinstance(cls, type) and issubclass(cls, failures.CheckFailure)}
    assert set(check["kind"]["enum"]) == kinds | {None}
    assert check["area"]["enum"] == [*AREAS, None]
    assert tuple(check["depth"]["items"]["enum"]) == DEPTHS
    assert set(check["outcome"]["enum"]) == {"passed", "failed", "skipped", "error"}
    assert set(results["properties"]["verdict"]["properties"]["status"]["enum"]) == {
        CERTIFIED, NOT_CERTIFIED, INCOMPLETE}
    assert tuple(results["$defs"]["series"]["properties"]["x_scale"]["enum"]) == X_SCALES
    assert results["properties"]["schema"]["const"] == RESULTS_SCHEMA
    assert ledger["$defs"]["run_entry"]["properties"]["schema"]["const"] == LEDGER_SCHEMA
    branches = {definition["$ref"] for definition in ledger["oneOf"]}
    assert {f"#/$defs/{kind}_entry" for kind in ledger["properties"]["type"]["enum"]} == branches


# documents the harness makes


def test_results_and_ledger_of_a_varied_run_validate(tmp_path):
    run_dir = write_run(tmp_path, varied_entries())
    results = results_of(run_dir)
    assert results["verdict"]["status"] == NOT_CERTIFIED
    metrics = {m["name"]: m for c in results["checks"] for m in c["metrics"]}
    assert metrics["memory_total"]["ok"] is True
    assert metrics["cpu_cores"]["ok"] is False and metrics["iperf3_retransmits"]["reference"] is None
    assert metrics["scratch_seq_write"]["value"] is None  # referenced but not measured
    validate_results(results)
    lines = ledger_lines(run_dir)
    assert {line["type"] for line in lines} == {"run", "selection", "tool", "check", "end"}
    for line in lines:
        validate_ledger_entry(line)


def test_an_interrupted_run_without_a_signer_validates(tmp_path):
    results = results_of(write_run(tmp_path, varied_entries()[:1], end=False), signer=None)
    assert results["run"]["finished"] is None and "signer" not in results
    assert results["verdict"]["status"] == INCOMPLETE
    validate_results(results)


def test_the_keys_being_added_in_version_1_validate(tmp_path):
    """band on metric rows, pairs/pair_median on a node's pair checks, outliers, verdict.cluster_checks."""
    run_dir = write_run(tmp_path, varied_entries())
    results = results_of(run_dir)
    memory = results["checks"][0]
    memory["metrics"][0]["band"] = [2.0, None]
    links = next(c for c in results["checks"] if c.get("pairs"))
    links.update(pair_median=None)
    results["verdict"]["cluster_checks"] = "passed"
    results["outliers"] = [{"check": "memory", "metric": "memory_total", "node": "localhost",
                            "value": 23.5, "unit": "GiB", "median": 47.0, "deviation": -0.5,
                            "rule": "more than 25% below the median of 4 nodes"}]
    validate_results(results)
    entry_line = next(line for line in ledger_lines(run_dir) if line.get("pairs"))
    validate_ledger_entry({**entry_line, "pair_median": 7.8})
    with pytest.raises(SchemaError, match=r"pairs\[0\]\.pass: 3 is not one of \[1, 2\]"):
        validate_ledger_entry({**entry_line, "pairs": [{**entry_line["pairs"][0], "pass": 3}]})


def test_keys_the_schema_does_not_know_yet_are_admitted(tmp_path):
    """Within a version keys are only added: an older schema must accept a newer document."""
    results = results_of(write_run(tmp_path, varied_entries()))
    results["added_later"] = {"anything": 1}
    results["run"]["added_later"] = []
    results["checks"][0]["added_later"] = None
    results["checks"][0]["metrics"][0]["added_later"] = "x"
    validate_results(results)


# documents that are wrong


@pytest.fixture
def valid_results(tmp_path) -> dict:
    return results_of(write_run(tmp_path, varied_entries()))


def broken(document: dict, change) -> dict:
    copied = copy.deepcopy(document)
    change(copied)
    return copied


@pytest.mark.parametrize("change,message", [
    (lambda d: d["checks"][3].update(outcome="passd"),
     "results.json: checks[3].outcome: 'passd' is not one of ['passed', 'failed', 'skipped', 'error']"),
    (lambda d: d.pop("verdict"), "results.json: verdict: required, but missing"),
    (lambda d: d.update(schema="handover.results/2"),
     "results.json: schema: 'handover.results/2', expected 'handover.results/1'"),
    (lambda d: d["checks"][0]["metrics"][0].update(value="23.5"),
     "results.json: checks[0].metrics[0].value: '23.5' is not of type 'number', 'null'"),
    (lambda d: d["verdict"].update(status="certified"),
     "results.json: verdict.status: 'certified' is not one of ['CERTIFIED', 'NOT CERTIFIED', 'INCOMPLETE']"),
    (lambda d: d["nodes"][0].update(status="ok"),
     "results.json: nodes[0].status: 'ok' is not one of ['passed', 'failed', 'incomplete', 'waived', 'untested']"),
    (lambda d: d["checks"][1]["metrics"][0].update(ok=None),
     "results.json: checks[1].metrics[0].ok: None is not of type 'boolean'"),
    (lambda d: d["checks"][5]["series"][0].update(x_scale="log10"),
     "results.json: checks[5].series[0].x_scale: 'log10' is not one of ['linear', 'log2']"),
    (lambda d: d["checks"][5]["series"][0]["lines"][0]["points"].append([1.0]),
     "results.json: checks[5].series[0].lines[0].points[2]: [1.0] is too short"),
    (lambda d: d["checks"][6]["pairs"][0].update(state="slow"),
     "results.json: checks[6].pairs[0].state: 'slow' is not one of ['ok', 'low', 'failed']"),
    (lambda d: d["checks"][6]["pairs"][1].pop("peer"),
     "results.json: checks[6].pairs[1].peer: required, but missing"),
    (lambda d: d.update(outliers=[{"check": "memory"}]),
     "results.json: outliers[0].metric: required, but missing"),
    (lambda d: d["run"].update(run_id="yesterday"),
     "results.json: run.run_id: 'yesterday' does not match '^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$'"),
], ids=["outcome", "no-verdict", "schema", "metric-value-string", "status", "node-status", "ok-null",
        "x-scale", "point", "pair-state", "pair-peer", "outlier", "run-id"])
def test_a_broken_results_document_fails_naming_the_path(valid_results, change, message):
    validate_results(valid_results)
    assert refusal(validate_results, broken(valid_results, change)) == message


def test_a_huge_wrong_value_is_shortened_in_the_message(valid_results):
    document = broken(valid_results, lambda d: d.update(checks={"a": "x" * 10_000, "b": list(range(1000))}))
    message = refusal(validate_results, document)
    assert message.startswith("results.json: checks: {'a': 'xxx")
    assert message.endswith("} is not of type 'array'")
    assert len(message) < 200


def test_the_message_names_the_source_it_is_given(valid_results):
    document = broken(valid_results, lambda d: d.pop("checks"))
    with pytest.raises(SchemaError, match=r"^out/x/results\.json: checks: required, but missing$"):
        validate_results(document, source="out/x/results.json")


def test_a_document_that_is_not_an_object_fails():
    assert refusal(validate_results, ["checks"]) == (
        "results.json: (top level): ['checks'] is not of type 'object'")


@pytest.fixture
def valid_lines(tmp_path) -> dict[str, dict]:
    """One ledger line of each type the run wrote, by type (the first check)."""
    by_type: dict[str, dict] = {}
    for line in ledger_lines(write_run(tmp_path, varied_entries())):
        by_type.setdefault(line["type"], line)
    return by_type


@pytest.mark.parametrize("kind,change,message", [
    ("check", lambda e: e.update(type="chek"),
     "ledger.jsonl: type: 'chek' is not one of "
     "['run', 'check', 'tool', 'selection', 'locks', 'dropped', 'resume', 'end']"),
    ("check", lambda e: e.pop("type"), "ledger.jsonl: type: required, but missing"),
    ("check", lambda e: e.pop("node"), "ledger.jsonl: node: required, but missing"),
    ("check", lambda e: e.update(outcome="passd"),
     "ledger.jsonl: outcome: 'passd' is not one of ['passed', 'failed', 'skipped', 'error']"),
    ("check", lambda e: e["metrics"][0].update(value="23.5"),
     "ledger.jsonl: metrics[0].value: '23.5' is not of type 'number', 'null'"),
    ("run", lambda e: e.update(schema="handover.ledger/2"),
     "ledger.jsonl: schema: 'handover.ledger/2', expected 'handover.ledger/1'"),
    ("run", lambda e: e["profile"]["references"]["memory_total"].pop("check"),
     "ledger.jsonl: profile.references.memory_total.check: required, but missing"),
    ("end", lambda e: e.update(exitstatus="0"), "ledger.jsonl: exitstatus: '0' is not of type 'integer'"),
    ("selection", lambda e: e.update(tests="all"), "ledger.jsonl: tests: 'all' is not of type 'array'"),
    ("tool", lambda e: e.update(version=None), "ledger.jsonl: version: None is not of type 'string'"),
], ids=["unknown-type", "no-type", "no-node", "outcome", "metric-value-string", "schema",
        "reference-without-check", "exitstatus", "tests", "tool-version"])
def test_a_broken_ledger_entry_fails_naming_the_path(valid_lines, kind, change, message):
    validate_ledger_entry(valid_lines[kind])
    assert refusal(validate_ledger_entry, broken(valid_lines[kind], change)) == message


# one real run


def run_suites(inventory: Path, *options: str) -> subprocess.CompletedProcess:
    """Paths outside the checkout go with '=': pytest takes a bare path for a test location."""
    return subprocess.run([sys.executable, "-m", "pytest", f"--inventory={inventory}",
                           "-p", "no:cacheprovider", *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_real_local_run_and_its_resumption_validate(tmp_path):
    """pytest against this machine, then --resume of the same run: results.json and every
    ledger line (header, selection, tool, check, end, resume) match the schemas.

    -k names test functions: a bare 'os' would match every test, as 'localhost' contains it."""
    key = tmp_path / "operator"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops@example.com",
                    "-f", str(key)], check=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    inventory = tmp_path / "local.yaml"
    inventory.write_text((ROOT / "inventory" / "local.yaml").read_text(encoding="utf-8")
                         .replace("/var/tmp/handover-scratch", str(scratch)), encoding="utf-8")
    first = run_suites(inventory, f"--out={tmp_path / 'out'}", f"--sign-key={key}",
                       "-k", "test_reachable or test_memory or test_os or test_gpu_inventory")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = (tmp_path / "out" / "local" / "latest").resolve()
    resumed = run_suites(inventory, f"--resume={run_dir}", f"--sign-key={key}",
                         "-k", "test_reachable or test_memory or test_os or test_kernel")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    validate_results(results)
    assert {c["check"] for c in results["checks"]} >= {"reachable", "memory", "os", "gpu_inventory", "kernel"}
    assert {c["outcome"] for c in results["checks"]} == {"passed", "skipped"}
    memory = next(c for c in results["checks"] if c["check"] == "memory")
    assert memory["metrics"][0]["reference"] is not None and memory["metrics"][0]["ok"] is True
    lines = ledger_lines(run_dir)
    assert [line["type"] for line in lines].count("end") == 2
    assert {line["type"] for line in lines} == {"run", "selection", "tool", "check", "end", "resume", "locks"}
    for number, line in enumerate(lines, 1):
        validate_ledger_entry(line, source=f"{LEDGER_FILE}:{number}")
