"""perftest: the text parser on real outputs, and the real no-device failure of ib_write_bw here."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inventory.model import Node
from runners.parsing import ParseError
from runners.perftest import MIB_PER_S_IN_GBPS, PerftestMode, client_argv, no_rdma_device, parse_perftest
from runners.transport import LocalTransport

DATA = Path(__file__).parent / "data" / "perftest"
ROOT = Path(__file__).resolve().parent.parent


def test_8m_loopback_in_mb_per_sec_is_converted_to_gbps():
    report = parse_perftest((DATA / "superbench_ib_loopback_8M_size.log").read_text())
    assert report.test == "RDMA_Write BW Test" and report.kind == "bw" and report.ok
    # server and client print the same row: kept once
    assert report.rows == [{"bytes": 8388608, "iterations": 20000, "bw_peak_gbps": 201.8026,
                            "bw_avg_gbps": 201.8024, "msg_rate_mpps": 0.003007}]
    assert report.peak_bw_gbps == pytest.approx(24056.72 * MIB_PER_S_IN_GBPS, abs=1e-3)


def test_all_sizes_with_interleaved_headers_and_a_repeated_last_row():
    report = parse_perftest((DATA / "superbench_ib_loopback_all_sizes.log").read_text())
    assert [row["bytes"] for row in report.rows] == [2 ** i for i in range(1, 24)]
    assert report.rows[-1]["bw_avg_gbps"] == pytest.approx(23240.68 * MIB_PER_S_IN_GBPS, abs=1e-3)
    assert report.peak_bw_gbps == pytest.approx(23277.91 * MIB_PER_S_IN_GBPS, abs=1e-3)  # at 4 MiB


def test_gbits_form_and_interleaved_warnings_are_read_by_column_name():
    """DERIVED from the real 8M log: its unit label and numbers rewritten to the --report_gbits
    form, a real-world warning line (tool-formats.md section 3) inserted. Not a real output."""
    text = (DATA / "superbench_ib_loopback_8M_size.log").read_text()
    text = text.replace("[MB/sec]", "[Gb/sec]").replace("24056.74", "201.80").replace("24056.72", "201.80")
    text = text.replace(" 8388608    20000", " Conflicting CPU frequency values detected: 2200.000000 != "
                        "1040.353000. CPU Frequency is not max.\n 8388608    20000", 1)
    report = parse_perftest(text)
    assert report.peak_bw_gbps == 201.80 and len(report.rows) == 1 and report.ok


def test_latency_columns_in_microseconds():
    """CONSTRUCTED: the ib_write_lat header documented in tool-formats.md section 3 and one row
    of its shape; no real latency output was available."""
    text = ("                    RDMA_Write Latency Test\n"
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
            "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]\n"
            " 2       1000          1.76           6.12         1.79                1.80             "
            "0.06            1.88                    6.12\n")
    report = parse_perftest(text)
    assert report.kind == "lat" and report.peak_bw_gbps is None and report.ok
    assert report.rows == [{"bytes": 2, "iterations": 1000, "t_min_us": 1.76, "t_max_us": 6.12,
                            "t_typical_us": 1.79, "t_avg_us": 1.8, "t_stdev_us": 0.06,
                            "p99_us": 1.88, "p999_us": 6.12}]


def test_text_that_is_not_perftest_is_a_parse_error():
    with pytest.raises(ParseError, match="no perftest title"):
        parse_perftest((DATA / "local_perftest45_ib_write_bw_ERROR_no_rdma_device.stderr.txt").read_text())
    with pytest.raises(ParseError):
        parse_perftest("")


def test_completion_error_makes_the_report_not_ok():
    """DERIVED from the real 8M log: a documented failure line appended (tool-formats.md s3)."""
    text = (DATA / "superbench_ib_loopback_8M_size.log").read_text() + " Completion with error at client\n"
    report = parse_perftest(text)
    assert not report.ok and report.errors == ["Completion with error at client"]


@pytest.mark.skipif(shutil.which("ib_write_bw") is None, reason="perftest is not installed")
def test_ib_write_bw_without_an_rdma_device_is_recognised_for_real():
    transport = LocalTransport(Node("localhost", "localhost", "local"))
    result = transport.run(client_argv(PerftestMode(), "mlx5_0", 18515, "127.0.0.1"), timeout=20)
    assert result.exit_code == 1 and "Unable to find the Infiniband/RoCE device" in result.stderr
    assert no_rdma_device(result)
    with pytest.raises(ParseError):
        parse_perftest(result.stdout)


def test_handover_parse_perftest_cli():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "perftest",
                           str(DATA / "superbench_ib_loopback_8M_size.log")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and '"peak_bw_gbps": 201.8024' in done.stdout and '"ok": true' in done.stdout
    bad = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "perftest",
                          str(DATA / "PROVENANCE.md")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "not perftest output" in bad.stderr


def test_rail_argv_for_bandwidth_latency_bidirectional_and_gpudirect():
    from runners.perftest import PerftestMode, client_argv, server_argv

    bw = PerftestMode()
    assert server_argv(bw, "mlx5_3", 18600) == ["ib_write_bw", "--port", "18600", "--size", "8388608",
                                                "--ib-dev", "mlx5_3", "--report_gbits"]
    assert client_argv(PerftestMode(bidirectional=True, use_cuda=True), "mlx5_3", 18600, "10.0.0.1", gpu=3) == [
        "ib_write_bw", "--port", "18600", "--size", "8388608", "--ib-dev", "mlx5_3", "--report_gbits",
        "--bidirectional", "--use_cuda=3", "10.0.0.1"]
    assert server_argv(PerftestMode(tool="ib_write_lat", size=2), None, 19515) == [
        "ib_write_lat", "--port", "19515", "--size", "2"]


def test_a_pair_on_ipv6_addresses_exchanges_its_parameters_over_ipv6_on_both_sides():
    """perftest takes IPv4 for its parameter exchange unless both sides say --ipv6-addr."""
    from runners.perftest import PerftestMode, client_argv, server_argv

    assert client_argv(PerftestMode(), "mlx5_0", 18600, "fd00:77::2") == [
        "ib_write_bw", "--port", "18600", "--size", "8388608", "--ipv6-addr", "--ib-dev", "mlx5_0",
        "--report_gbits", "fd00:77::2"]
    assert "--ipv6-addr" in server_argv(PerftestMode(), "mlx5_0", 18600, ipv6=True)
    assert "--ipv6-addr" not in client_argv(PerftestMode(), "mlx5_0", 18600, "gpu017")


def test_a_perftest_without_the_ipv6_flag_is_named_for_what_it_lacks():
    """The real refusal of Debian's perftest 4.5 (tests/data/perftest/PROVENANCE.md), on either side."""
    from runners.pairs import PairRun
    from runners.perftest import judge
    from runners.transport import Result

    stem = "local_perftest45_ib_write_bw_ERROR_ipv6_addr_unrecognized"
    refused = Result("n2", "ib_write_bw ...", int((DATA / f"{stem}.rc.txt").read_text()),
                     (DATA / f"{stem}.stdout.txt").read_text(), (DATA / f"{stem}.stderr.txt").read_text(), 0.01)
    waited = Result("n2", "ib_write_bw ...", 1, "", " Couldn't connect to fd00:77::1:18515\n", 60.0)
    lacks = ("predates --ipv6-addr (perftest 23.07), which a pair on IPv6 addresses needs: update perftest "
             "there, or give the nodes IPv4 addresses")
    assert judge(PairRun("n1", "n2", 18515, refused, None)) == (
        None, f"n2 -> n1:18515: the perftest on n2 {lacks}")
    assert judge(PairRun("n1", "n2", 18515, waited, refused)) == (
        None, f"n2 -> n1:18515: the perftest on n1 {lacks}")


@pytest.mark.skipif(shutil.which("ib_write_bw") is None, reason="perftest is not installed")
def test_a_pair_on_ipv6_addresses_with_an_old_perftest_ends_at_once_naming_it():
    """Both sides refuse --ipv6-addr at once, for real, and nothing is left running."""
    from nodes import wait_for_no_leftovers

    from runners.perftest import PerftestMode, judge, run_pair

    usage = subprocess.run(["ib_write_bw", "--help"], capture_output=True, text=True, timeout=20).stdout
    if "--ipv6-addr" in usage:
        pytest.skip("this perftest knows --ipv6-addr (23.07 or later)")
    transport = LocalTransport(Node("localhost", "localhost", "local"))
    run = run_pair(transport, transport, "fd00:77::2", 18779, PerftestMode(), None, None)
    report, why = judge(run)
    assert report is None and why.startswith("localhost -> localhost:18779: the perftest on localhost predates")
    assert not wait_for_no_leftovers("--port 18779")


@pytest.mark.skipif(shutil.which("ib_write_bw") is None, reason="perftest is not installed")
def test_pair_without_an_rdma_device_ends_at_once_and_leaves_no_server():
    """The real no-device path through the pair runner: both sides exit 1 at once."""
    from nodes import wait_for_no_leftovers

    from runners.perftest import PerftestMode, judge, run_pair

    transport = LocalTransport(Node("localhost", "localhost", "local"))
    run = run_pair(transport, transport, "127.0.0.1", 18777, PerftestMode(), None, None)
    assert no_rdma_device(run.client_result) and no_rdma_device(run.server_result)
    report, why = judge(run)
    assert report is None and "Unable to find the Infiniband/RoCE device" in why
    assert not wait_for_no_leftovers("--port 18777")


def test_judge_puts_error_lines_before_figures():
    """DERIVED from the real 8M log (a documented failure line appended): the table alone
    does not pass a run that printed an error."""
    from runners.pairs import PairRun
    from runners.perftest import judge
    from runners.transport import Result

    text = (DATA / "superbench_ib_loopback_8M_size.log").read_text()
    good = Result("n2", "ib_write_bw ...", 0, text, "", 1.0)
    assert judge(PairRun("n1", "n2", 18515, good, None)) == (parse_perftest(text), "")
    bad = Result("n2", "ib_write_bw ...", 0, text + " Completion with error at client\n", "", 1.0)
    report, why = judge(PairRun("n1", "n2", 18515, bad, None))
    assert report.peak_bw_gbps > 200 and why == "n2 -> n1:18515: Completion with error at client"


def test_a_rails_outcome_for_attribution_is_its_figure_against_the_profiles_bands():
    """The real HDR200 loopback log judged as one rail of a pair (runners.perftest's PerftestTool,
    which only needs the profile for this): below the NDR floor on H100, within band on A100;
    the real no-device run and a rail without an HCA say nothing about the link."""
    from inventory.loader import load_profile
    from runners.pairs import PairOutcome, PairRun
    from runners.perftest import PerftestTool
    from runners.transport import Result

    text = (DATA / "superbench_ib_loopback_8M_size.log").read_text()
    measured = PairRun("n1", "n2", 18515, Result("n2", "ib_write_bw ...", 0, text, "", 1.0), None)
    for profile, passed in (("h100-sxm-8gpu", False), ("a100-sxm-8gpu", True)):
        rail = PerftestTool(load_profile(profile), "ib_write_bw")
        assert rail.outcome(measured) == PairOutcome(passed, 201.8024)
    h100 = PerftestTool(load_profile("h100-sxm-8gpu"), "ib_write_bw")
    broken = Result("n2", "ib_write_bw ...", 0, text + " Completion with error at client\n", "", 1.0)
    assert h100.outcome(PairRun("n1", "n2", 18515, broken, None)) == PairOutcome(False)
    stderr = (DATA / "local_perftest45_ib_write_bw_ERROR_no_rdma_device.stderr.txt").read_text()
    absent = Result("n2", "ib_write_bw ...", 1, "", stderr, 0.1)
    assert h100.outcome(PairRun("n1", "n2", 18515, absent, None)) is None
    assert h100.outcome("n2 has 4 HCA(s) (mlx5_0, mlx5_1, mlx5_2, mlx5_3): no HCA for rail 4") is None
    latency = PerftestTool(load_profile("h100-sxm-8gpu"), "ib_write_lat")
    assert not latency.higher_is_better and set(latency.references) == {"ib_write_lat_typical", "ib_write_lat_p99"}
