"""The table of recorded metrics (inventory/metrics.py) against the suites that record them: the
names the loader admits in references and outlier rules are the names the checks record."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from inventory.loader import known_checks, known_profiles, load_profile
from inventory.metrics import RECORDED, checks_recording, known_metrics, unrecorded
from suites.checks import Metrics

METRIC_FORM = re.compile(r"[a-z0-9_]+")
SUITES = Path(__file__).resolve().parent.parent / "suites"


def written_metric_names(source: str) -> set[str]:
    """Metric names written out in a suite: keywords of a `.judge(...)` call, and string keys of
    a dict display whose values are (figure, "unit") pairs (the figures a check gathers first), in
    a metric's form: lower case, digits and underscores."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "judge":
            names |= {keyword.arg for keyword in node.keywords if keyword.arg is not None}
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple) \
                        and len(value.elts) == 2 and isinstance(value.elts[1], ast.Constant) \
                        and isinstance(value.elts[1].value, str) and METRIC_FORM.fullmatch(key.value):
                    names.add(key.value)
    return names


@pytest.mark.parametrize("module", sorted(path.name for path in SUITES.glob("test_*.py")))
def test_every_metric_a_suite_writes_out_is_in_the_table(module):
    unknown = {name for name in written_metric_names((SUITES / module).read_text()) if not checks_recording(name)}
    assert not unknown, f"{module} records {sorted(unknown)}, which inventory/metrics.py does not list"


def test_the_table_finds_suites_names_written_out():
    """The scan above sees the suites' names at all (a scan that found none would pass anything)."""
    found = set().union(*(written_metric_names(path.read_text()) for path in SUITES.glob("test_*.py")))
    assert {"memory_total", "gpu_burn_tflops", "training_tokens_per_s", "soak_gpu_temp_max",
            "iperf3_retransmits", "checkpoint_read_time"} <= found


def test_the_table_names_checks_the_suites_have():
    assert set(RECORDED) <= set(known_checks())


@pytest.mark.parametrize("name", known_profiles())
def test_every_shipped_reference_names_its_check_and_unit_as_the_table_does(name):
    for metric, reference in load_profile(name).references.items():
        assert unrecorded(reference.check, metric, reference.unit) is None


def test_a_family_admits_its_members_and_a_name_no_check_records_is_unknown():
    assert checks_recording("stress_matrix") == {"stress_ng": "bogo-ops/s"}
    assert checks_recording("stress_") == {}
    assert checks_recording("allreduce_busbw_rack_min") == {"allreduce_scales": "GB/s"}
    assert set(checks_recording("isolation_time")) == {"allreduce_cluster", "training_scaling"}
    assert checks_recording("cpu_threads") == {}
    assert "stress_<stressor>" in known_metrics() and len(known_metrics()) == len(set(known_metrics()))
    assert set(RECORDED["training"]) == set(RECORDED["training_cluster_sustained"])


def test_a_check_recording_a_name_the_table_lacks_is_the_harness_s_own_error():
    """Metrics records nothing the profiles could not name: a new figure goes into the table first."""
    rows: list[dict] = []
    metrics = Metrics("cpu", load_profile("cpu-only"), rows.extend)
    with pytest.raises(LookupError, match=r"check 'cpu' records no metric 'cpu_threads' \(inventory/metrics.py\)"):
        metrics.judge(cpu_cores=(2, "cores"), cpu_threads=(4, "threads"))
    with pytest.raises(LookupError, match="check 'cpu' records 'cpu_cores' in cores, not threads"):
        metrics.judge(cpu_cores=(2, "threads"))
    assert rows == []
    metrics.judge(cpu_cores=(2, "cores"))
    assert [row["name"] for row in rows] == ["cpu_cores"]
