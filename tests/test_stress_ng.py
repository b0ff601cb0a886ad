"""stress-ng: the parser on real logs and YAML (0.15.06), and real runs here and on namespace nodes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nodes import cluster_run_of, ns_inventory

from inventory.model import Node
from runners import stress_ng
from runners.parsing import ParseError
from runners.transport import LocalTransport

DATA = Path(__file__).resolve().parent / "data" / "stress-ng"
ROOT = Path(__file__).resolve().parent.parent
SHORT = stress_ng.StressPlan(seconds=2, vm_bytes="32M")


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_log_table_with_full_metrics_columns():
    run = stress_ng.parse_stress_ng(text("local_stressng01506_cpu_matrix_metrics_verify.stderr.txt"))
    assert [(s.name, s.bogo_ops, s.bogo_ops_per_s, s.bogo_ops_per_s_cpu) for s in run.stressors] == [
        ("cpu", 6667, 1332.33, 1117.01), ("matrix", 14152, 2830.31, 4858.61)]
    assert run.completed is True and run.failures == [] and run.ok


def test_yaml_keeps_unquoted_dates_as_text_and_gives_precise_rates():
    run = stress_ng.parse_stress_ng(text("local_stressng01506_cpu_vm_metrics_brief.yaml"))
    assert run.version == "0.15.06"
    assert [(s.name, s.bogo_ops_per_s) for s in run.stressors] == [("cpu", 1261.415824),
                                                                   ("vm", 8560.532018)]
    assert run.ok and run.completed is None


def test_log_and_yaml_interleaved_take_rates_from_yaml_and_state_from_log():
    combined = (text("local_stressng01506_cpu_vm_metrics_brief.stderr.txt")
                + text("local_stressng01506_cpu_vm_metrics_brief.yaml"))
    run = stress_ng.parse_stress_ng(combined)
    assert run.stressors[1].bogo_ops_per_s == 8560.532018 and run.completed is True and run.ok


@pytest.mark.parametrize("stem", ["local_stressng01506_error_hdd_temp_path_not_a_directory",
                                  "local_stressng01506_error_worker_sigkilled"])
def test_failed_stressors_are_not_ok_in_the_log_and_in_the_yaml(stem):
    assert text(f"{stem}.rc.txt").strip() == "exit code: 2"
    from_log = stress_ng.parse_stress_ng(text(f"{stem}.stderr.txt"))
    assert not from_log.ok and from_log.completed is False
    assert any(f.startswith("fail:") for f in from_log.failures)
    from_yaml = stress_ng.parse_stress_ng(text(f"{stem}.stdout.yaml"))
    assert not from_yaml.ok  # zero rates: nothing was measured


def test_hdd_failure_names_the_cause():
    run = stress_ng.parse_stress_ng(text("local_stressng01506_error_hdd_temp_path_not_a_directory.stderr.txt"))
    assert "errno=20 (Not a directory)" in run.failures[0]


def test_bad_option_output_is_not_stress_ng_metrics():
    with pytest.raises(ParseError, match="no stress-ng log lines"):
        stress_ng.parse_stress_ng(text("local_stressng01506_error_bad_option.stderr.txt"))


def test_exit_codes_have_their_documented_meanings():
    assert set(stress_ng.EXIT_MEANINGS) == set(range(8))
    assert "failed" in stress_ng.exit_meaning(2)
    assert "untrustworthy" in stress_ng.exit_meaning(7)
    assert stress_ng.exit_meaning(42).startswith("not an exit status")


def test_argv_asks_for_verify_metrics_and_yaml_on_stdout():
    argv = stress_ng.stress_argv(stress_ng.StressPlan(seconds=5, cpu_workers=0))
    assert argv[:3] == ["stress-ng", "--cpu", "0"]
    assert {"--verify", "--metrics"} <= set(argv)
    assert argv[argv.index("--yaml") + 1] == "/dev/stdout"
    assert argv[argv.index("--timeout") + 1] == "5s"


def test_real_run_here_writes_nothing_and_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = stress_ng.stress(LocalTransport(Node("here", "here", "local")), SHORT)
    assert result.exit_code == 0, result.stderr
    run = stress_ng.parse_stress_ng(result.stderr + result.stdout)
    assert run.ok and [s.name for s in run.stressors] == ["cpu", "matrix", "vm"]
    assert run.version and all(s.bogo_ops_per_s > 0 for s in run.stressors)
    assert list(tmp_path.iterdir()) == []  # --yaml went to stdout, not to a file


def test_real_run_on_namespace_nodes(ns_cluster, tmp_path):
    cluster = ns_inventory(ns_cluster, tmp_path / "inv.yaml", nodes=["node1", "node2"])
    run = cluster_run_of(cluster)
    try:
        results = run.gather("stress", lambda transport: stress_ng.stress(transport, SHORT))
    finally:
        run.close()
    for node, result in results.items():
        assert result.exit_code == 0, f"{node}: {result.stderr}"
        assert stress_ng.parse_stress_ng(result.stderr + result.stdout).ok


def test_cli_parses_a_saved_log_and_refuses_other_files():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "stress-ng",
                           str(DATA / "local_stressng01506_cpu_matrix_metrics_verify.yaml")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and '"bogo_ops_per_s": 2830.312411' in done.stdout
    assert '"ok": true' in done.stdout
    bad = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "stress-ng",
                          str(DATA / "local_stressng01506_error_bad_option.stderr.txt")],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_log_written_with_timestamp():
    """Real: `stress-ng --cpu 1 --cpu-method matrixprod --timeout 2s --metrics --verify --timestamp`
    here (0.15.06): a time of day after "stress-ng: " on every line."""
    stem = "local_stressng01506_timestamp_cpu_matrixprod_metrics_verify"
    assert text(f"{stem}.rc.txt").strip() == "exit code: 0"
    run = stress_ng.parse_stress_ng(text(f"{stem}.stderr.txt"))
    assert [(s.name, s.bogo_ops, s.bogo_ops_per_s, s.bogo_ops_per_s_cpu) for s in run.stressors] == [
        ("cpu", 281, 139.35, 2035.35)]
    assert run.completed is True and run.failures == [] and run.ok


def test_failure_in_a_timestamped_log_and_its_yaml():
    """Real: the hdd stressor with a --temp-path that is a file, `--timestamp --yaml /dev/stdout`."""
    stem = "local_stressng01506_timestamp_error_hdd_temp_path_not_a_directory"
    assert text(f"{stem}.rc.txt").strip() == "exit code: 2"
    run = stress_ng.parse_stress_ng(text(f"{stem}.stderr.txt") + text(f"{stem}.stdout.yaml"))
    assert not run.ok and run.completed is False and run.version == "0.15.06"
    assert run.failures[0].startswith("fail: hdd: mkdir") and "errno=20 (Not a directory)" in run.failures[0]
    assert run.failures[1].startswith("error: process [")


def test_timestamped_lines_of_a_newer_release_are_log_lines():
    """Real lines quoted in ColinIanKing/stress-ng#580 (`--timestamp`, a newer release): log
    lines without a metrics table, so no rate and not ok, but stress-ng's output all the same."""
    run = stress_ng.parse_stress_ng(text("stressng-issue580_timestamp_info_lines.txt"))
    assert run.stressors == [] and run.failures == [] and not run.ok
