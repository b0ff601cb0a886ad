"""nccl-tests parser on real outputs (tests/data/nccl-tests, tests/data/h200-1gpu) and on copies
derived from them in these tests (each says what it changes); exit 7 and `handover parse`, whose
busbw is the figure the suite judges; the across-node launch: mpirun's argv (pure), the
judgement of the real 2 x 8 H200 output, and a real mpirun across two namespace nodes (where
nccl-tests is not installed)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nodes import cluster_run_of, ns_inventory, wait_for_no_leftovers

from handover.failures import SanityFailure
from inventory.model import Node, SshSettings
from runners import collectives, nccl_tests, system
from runners.launchers import LaunchError, MpirunLauncher
from runners.parsing import ParseError
from runners.ssh import SshTransport
from runners.transport import LocalTransport, Result
from suites.checks import parsed, series_entry

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
NCCL = DATA / "nccl-tests"
H200 = DATA / "h200-1gpu"


def text_of(path: Path) -> str:
    return path.read_text()


def parse(path: Path) -> nccl_tests.NcclTestsReport:
    return nccl_tests.parse_nccl_tests(text_of(path))


def test_two_node_h200_all_reduce_peak_is_busbw_at_large_sizes_not_the_average():
    report = parse(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt")
    assert report.ok and report.wrong == 0 and report.ranks == 16
    assert report.peak_busbw == 486.49
    assert report.avg_busbw == 476.572  # recorded, never judged
    assert report.nccl_version == "2.27.5+cuda12.8"  # the line printed between devices and table
    assert [row.size for row in report.rows][-1] == 17179869184
    assert report.rows[-1].busbw == 486.49 and report.rows[-1].busbw_inplace == 486.40


def test_old_format_error_column_with_validation_off_gives_null_wrong():
    """Old (2.10-era) table: `error` columns with N/A, no root column, an NCCL INFO line inside."""
    report = parse(NCCL / "superbench_nccl_allreduce.log")
    assert report.wrong is None and all(row.wrong is None for row in report.rows)
    assert len(report.rows) == 34  # the interleaved "NCCL INFO Launch mode Parallel" is no row
    assert report.peak_busbw == 235.26 and report.avg_busbw == 68.4048
    assert report.ranks == 8 and report.collective is None
    judged = nccl_tests.judge(_result(0), report)
    assert "validation was off" in judged


def test_empty_redop_in_alltoall_rows_does_not_shift_columns():
    report = parse(NCCL / "superbench_nccl_alltoall.log")
    last = report.rows[-1]
    assert (last.size, last.algbw, last.busbw, last.busbw_inplace) == (8589934592, 256.36, 224.31, 226.16)
    assert report.peak_busbw == 226.16


@pytest.mark.parametrize("name, peak", [("superbench_nccl_allgather.log", 230.07),
                                        ("superbench_nccl_reducescatter.log", 231.52)])
def test_all_gather_without_redop_and_reduce_scatter(name, peak):
    report = parse(NCCL / name)
    assert report.peak_busbw == peak and len(report.rows) == 34


def test_mpi_tag_output_prefixes_are_stripped():
    """Derived: Open MPI's --tag-output prefix `[1,0]<stdout>:` added to every line of a real file."""
    real = text_of(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt")
    prefixed = "".join(f"[1,0]<stdout>:{line}\n" for line in real.splitlines())
    assert nccl_tests.parse_nccl_tests(prefixed) == nccl_tests.parse_nccl_tests(real)


def test_h200_one_gpu_text_and_json_say_busbw_is_zero_and_pass():
    """One rank moves nothing between ranks: busbw 0 by definition is a pass, not a failure."""
    text = parse(H200 / "all_reduce_perf_h200_g1.txt")
    document = parse(H200 / "all_reduce_perf_h200_g1.json")
    for report in (text, document):
        assert report.ok and report.wrong == 0 and report.ranks == 1
        assert report.peak_busbw == 0.0 and report.collective == "all_reduce_perf"
        assert report.nccl_version == "2.28.9"  # nccl-library=22809 / "nccl_version": 22809
    assert text.rows[-1].algbw == 2145.5 and text.rows[9].busbw_inplace == 0.0
    assert document.rows[-1].size == 536870912 and round(document.rows[-1].algbw, 2) == 2093.69
    assert document.out_of_bounds_ok is True and document.min_bw_ok is None


def test_json_with_wrong_elements_and_validation_off():
    """Derived from the real H200 -J file: nwrong set to 5 in one row; then null (validation off)."""
    data = json.loads(text_of(H200 / "all_reduce_perf_h200_g1.json"))
    data["results"][2]["out_of_place"]["nwrong"] = 5.0
    report = nccl_tests.parse_nccl_tests(json.dumps(data))
    assert report.wrong == 5 and not report.ok
    for entry in data["results"]:
        entry["out_of_place"]["nwrong"] = entry["in_place"]["nwrong"] = None
    assert nccl_tests.parse_nccl_tests(json.dumps(data)).wrong is None


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


def test_wrong_count_out_of_bounds_and_min_bw_fail():
    """Derived from the real two-node H200 file: one #wrong set, bounds FAILED, MIN_BW FAILED."""
    real = text_of(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt")
    wrong = _replace_once(real, "471.56      0", "471.56  237858")
    report = nccl_tests.parse_nccl_tests(wrong)
    assert report.wrong == 237858 and not report.ok
    assert "237858 wrong element(s)" in nccl_tests.judge(_result(7), report)
    bounds = nccl_tests.parse_nccl_tests(_replace_once(real, "values : 0 OK", "values : 3 FAILED"))
    assert bounds.out_of_bounds_ok is False and not bounds.ok
    slow = nccl_tests.parse_nccl_tests(_replace_once(real, "476.572 ", "476.572 FAILED"))
    assert slow.min_bw_ok is False and not slow.ok
    assert "NCCL_TESTS_MIN_BW" in nccl_tests.judge(_result(7), slow)


def test_exit_7_fails_even_when_the_table_looks_clean():
    report = parse(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt")
    assert "exited 7" in nccl_tests.judge(_result(7), report)
    assert nccl_tests.judge(_result(0), report) == ""


def test_error_lines_fail_and_a_truncated_row_is_skipped():
    """Derived: a `Test NCCL failure` line appended; the last row cut in half (a killed run)."""
    real = text_of(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt")
    failed = real + "GPU-6550: Test NCCL failure common.cu:1279 'unhandled system error'\n"
    report = nccl_tests.parse_nccl_tests(failed)
    assert not report.ok and "Test NCCL failure" in report.errors[0]
    lines = real.splitlines()
    cut = next(i for i, line in enumerate(lines) if line.lstrip().startswith("17179869184"))
    truncated = "\n".join(lines[:cut] + [lines[cut][:40]])
    assert len(nccl_tests.parse_nccl_tests(truncated).rows) == 4


@pytest.mark.parametrize("text", ["", "hello\n", "# size count\n", '{"results": 1}',
                                  "#  size count type time algbw busbw error\n"])
def test_not_nccl_tests_output_is_a_parse_error(text):
    with pytest.raises(ParseError):
        nccl_tests.parse_nccl_tests(text)


def test_argv_turns_data_checking_on_and_uses_large_sizes():
    assert nccl_tests.argv("all_reduce", 8) == ["all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2",
                                                "-g", "8", "-c", "1"]
    assert nccl_tests.argv("all_to_all", 4)[0] == "alltoall_perf"


def test_run_records_the_nccl_environment_and_says_when_the_tool_is_missing():
    """Real run here: nccl-tests is not installed, so the node says so (exit 127), with NCCL_* listed."""
    node = Node(name="localhost", address="localhost", transport="local")
    transport = LocalTransport(node)
    assert nccl_tests.present(transport) is False
    result = nccl_tests.run(transport, "all_reduce", 1, timeout=30)
    assert result.exit_code == 127 and "NCCL_DEBUG=VERSION" in result.stderr


def test_handover_parse_nccl_tests_prints_the_issue_keys():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "nccl-tests",
                           str(H200 / "all_reduce_perf_h200_g1.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {"collective", "ranks", "rows", "peak_busbw", "wrong", "ok"} <= data.keys()
    assert set(data["rows"][0]) == {"size", "algbw", "busbw", "busbw_inplace", "wrong"}
    bad = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "nccl-tests",
                          str(DATA / "nccl-tests" / "PROVENANCE.md")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not nccl-tests output" in bad.stderr


def _result(exit_code: int) -> Result:
    return Result("gpu001", "all_reduce_perf -b 1G -e 8G", exit_code, "", "", 1.0)


# ---------------------------------------------------------------- across nodes (mpirun)

SSH = SshSettings(user="root", port=2222, identity_file="/keys/id_ed25519", connect_timeout=5)


def test_across_nodes_mpirun_starts_one_rank_per_gpu_each_driving_one_gpu():
    launcher = MpirunLauncher(ssh=SSH, as_root=True, export_env=("NCCL_DEBUG",))
    argv = nccl_tests.across_argv(launcher, ["10.0.0.1", "10.0.0.2"], 8)
    assert argv[:7] == ["mpirun", "-np", "16", "--host", "10.0.0.1:8,10.0.0.2:8", "--map-by", "ppr:8:node"]
    assert "--allow-run-as-root" in argv and argv[argv.index("-x") + 1] == "NCCL_DEBUG"
    assert argv[argv.index("plm_rsh_args") + 1].startswith("-l root -p 2222 -i /keys/id_ed25519")
    assert argv[-11:] == ["all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "1", "-c", "1"]


def test_across_nodes_needs_a_launcher_that_starts_from_the_first_host():
    from runners.torchrun import TorchrunLauncher

    with pytest.raises(LaunchError, match="torchrun starts on every"):
        nccl_tests.across_argv(TorchrunLauncher(), ["a", "b"], 8)


def test_the_two_node_run_is_judged_on_all_sixteen_ranks_with_every_row_as_a_curve():
    """The real 2 x 8 H200 output, as the first node's Result of an mpirun launch."""
    output = text_of(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt")
    result = Result("gpu001", "mpirun ... all_reduce_perf", 0, output, "NCCL_IB_HCA=mlx5\n", 60.0)
    report = nccl_tests.parse_nccl_tests(output)
    assert nccl_tests.judge(result, report) == ""
    figure, why = collectives.nccl_tests_figure(result, report, 16)
    assert why == "" and figure.busbw == 486.49 and figure.size == 17179869184 and figure.ranks == 16
    assert figure.env == {"NCCL_IB_HCA": "mlx5"}
    rows = parse(NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt").rows
    assert figure.lines["nccl-tests out-of-place"] == [(row.size, row.busbw) for row in rows]
    assert figure.lines["nccl-tests in-place"][-1] == (17179869184, 486.40)
    curve = series_entry("allreduce busbw", x=("message size", "B"), y=("busbw", "GB/s"),
                         lines=figure.lines, x_scale="log2")
    assert [line["label"] for line in curve["lines"]] == ["nccl-tests out-of-place", "nccl-tests in-place"]
    figure, why = collectives.nccl_tests_figure(result, report, 8)
    assert figure is None and why == "gpu001: 16 rank(s) reported, expected 8"


@pytest.mark.parametrize("path", [NCCL / "oci_2node_16xH200_all_reduce_perf_1G-16G.txt",
                                  NCCL / "superbench_nccl_alltoall.log",
                                  H200 / "all_reduce_perf_h200_g1.json"])
def test_handover_parse_prints_the_busbw_the_suite_judges(path):
    """One definition: `handover parse nccl-tests FILE`'s peak_busbw is the figure's busbw, the
    better placement at the largest size (the in-place one in the all-to-all file)."""
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "nccl-tests", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    report = parse(path)
    result = Result("gpu001", "all_reduce_perf", 0, text_of(path), "", 1.0)
    figure, why = collectives.nccl_tests_figure(result, report, report.ranks)
    assert why == "" and figure.busbw == printed["peak_busbw"] == report.peak_busbw
    largest = max(printed["rows"], key=lambda row: row["size"])
    assert figure.size == largest["size"]
    assert printed["peak_busbw"] == max(v for v in (largest["busbw"], largest["busbw_inplace"]) if v is not None)


def test_old_format_without_in_place_busbw_gives_one_line():
    """superbench's old table (A100, 8 ranks, validation off): both placements print busbw."""
    lines = nccl_tests.busbw_lines(parse(NCCL / "superbench_nccl_allreduce.log").rows)
    assert set(lines) == {"nccl-tests out-of-place", "nccl-tests in-place"}
    assert nccl_tests.busbw_lines([nccl_tests.NcclRow(1024, 1.0, 2.0, None, 0)]) == {
        "nccl-tests out-of-place": [(1024, 2.0)]}


def test_detect_launch_finds_mpirun_but_no_nccl_tests_here():
    detected = system.parse_programs(nccl_tests.detect_launch(LocalTransport(
        Node(name="localhost", address="localhost", transport="local"))).stdout)
    assert detected.has("mpirun") and not detected.has("all_reduce_perf") and detected.root


def test_across_two_namespace_nodes_a_missing_all_reduce_perf_fails_and_leaves_nothing(ns_cluster, tmp_path):
    """Real mpirun from node1 to node1 and node2: nccl-tests is not installed here, so mpirun
    says so and exits non-zero; the check fails as a sanity failure, no daemon is left."""
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    first = cluster.node("node1")
    transport = SshTransport(first)
    try:
        result = nccl_tests.run_across(transport, MpirunLauncher(ssh=first.ssh, as_root=True,
                                                                 export_env=("NCCL_DEBUG",)),
                                       [node.address for node in cluster.nodes], 1, timeout=60)
    finally:
        transport.close()
    assert not result.timed_out and result.exit_code not in (0, None)
    assert "NCCL_DEBUG=VERSION" in result.stderr and "all_reduce_perf" in result.stdout + result.stderr
    with pytest.raises(SanityFailure):  # the suite's first step on the launch's Result
        parsed(nccl_tests.parse_nccl_tests, result)
    assert wait_for_no_leftovers("orted", on=ns_cluster) == []


def test_without_nccl_tests_on_every_node_the_cluster_check_does_not_choose_mpirun(ns_cluster, tmp_path):
    """Real detection on two namespace nodes: mpirun is there, all_reduce_perf is not."""
    cluster = ns_inventory(ns_cluster, tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    run = cluster_run_of(cluster)
    try:
        assert nccl_tests.mpirun_everywhere(run, ["node1", "node2"]) is None
        detections = run.gather(nccl_tests.LAUNCH_DETECT_STEP, nccl_tests.detect_launch)
    finally:
        run.close()
    for result in detections.values():
        detected = system.parse_programs(result.stdout)
        assert detected.has("mpirun") and not detected.has("all_reduce_perf")
