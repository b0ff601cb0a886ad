"""HPL parser on real outputs of xhpl, HPL-NVIDIA and hpcc (tests/data/hpl/PROVENANCE.md), input
generation against Debian's own hpccinf.txt, and real hpcc runs in a scratch directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from handover.failures import CommandTimedOut
from inventory.model import Node, ScratchPath
from runners import hpl, system
from runners.launchers import MpirunLauncher
from runners.parsing import ParseError
from runners.scratch import ScratchRefused, missing_tool, refusal
from runners.transport import LocalTransport, Result
from suites.checks import require_scratch_run

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "hpl"


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8", errors="replace")


def test_hpcc_passed_output():
    run = hpl.parse_hpl(text("local_hpcc150_hpccoutf_PASSED.txt"))
    assert run.ok and run.problems == []
    assert (run.flavour, run.version, run.success, run.hpl_tflops) == ("hpcc", "1.5.0", True, 0.00739996)
    assert run.threshold == 16.0
    [result] = run.results
    assert (result.tv, result.n, result.nb, result.p, result.q) == ("WR11C2R4", 4000, 128, 1, 2)
    assert (result.time, result.gflops, result.residual, result.passed) == (5.77, 7.4, 0.0048169, True)
    assert run.best_gflops == pytest.approx(run.hpl_tflops * 1000, rel=0.01)  # Tflops, not Gflops


def test_hpcc_failed_residual_exits_zero_but_is_not_ok():
    """A real run with threshold 1e-6: mpirun exited 0, the residual FAILED, Success=0."""
    run = hpl.parse_hpl(text("local_hpcc150_hpccoutf_FAILED_threshold1e-6.txt"))
    assert not run.ok and run.success is False
    assert run.threshold == 0.0  # HPL prints the threshold with one decimal: 1e-6 shows as 0.0
    [result] = run.results
    assert not result.passed and result.residual == 0.0048169
    assert "WR11C2R4 N=4000 NB=128 1x2: scaled residual 0.0048169 FAILED" in run.problems
    assert any("Success=0" in problem for problem in run.problems)


def test_hpcc_success_zero_alone_fails():
    """Derived from the real PASSED output: HPL passed but another hpcc test failed."""
    run = hpl.parse_hpl(text("local_hpcc150_hpccoutf_PASSED.txt").replace("Success=1", "Success=0"))
    assert run.results[0].passed and not run.ok
    assert run.problems == ["hpcc summary says Success=0: a test of the suite failed"]


def test_hpcc_cut_off_mid_solve_has_no_result():
    """Derived from the real PASSED output, cut where a killed run would stop writing."""
    whole = text("local_hpcc150_hpccoutf_PASSED.txt")
    run = hpl.parse_hpl(whole[:whole.index("WR11C2R4        4000")])
    assert run.results == [] and not run.ok
    assert run.problems[0].startswith("no HPL result")


def test_xhpl_with_progress_and_timing_lines():
    run = hpl.parse_hpl(text("superbench_hpl_results.log"))
    assert run.ok and (run.flavour, run.version, run.success) == ("xhpl", "2.3", None)
    [result] = run.results
    assert (result.tv, result.n, result.nb, result.gflops) == ("WR0XR8C48", 384000, 384, 8126.1)
    assert result.residual == pytest.approx(4.12139792e-03)


def test_mpirun_tag_output_prefixes_are_ignored():
    """Derived from the real xhpl log: every line as `mpirun --tag-output` prints it."""
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in text("superbench_hpl_results.log").splitlines())
    run = hpl.parse_hpl(tagged)
    assert run.ok and run.results[0].gflops == 8126.1


def test_hpl_nvidia_with_ansi_colour_progress():
    raw = text("anuhpc_hpl-nvidia-25.4_4xA100-40GB_PASSED.out")
    assert "\x1b[0;31m" in raw
    run = hpl.parse_hpl(raw)
    assert run.ok and (run.flavour, run.version) == ("hpl-nvidia", "25.4.0")
    [result] = run.results  # N and NB as HPL-NVIDIA changed them, not as asked
    assert (result.tv, result.n, result.nb, result.p, result.q) == ("WC0", 46784, 1088, 2, 2)
    assert (result.gflops, result.gflops_per_gpu, result.passed) == (33980.0, 8496.0, True)


def test_hpl_nvidia_aborted_on_nccl_bootstrap_has_no_result():
    run = hpl.parse_hpl(text("anuhpc_hpl-nvidia-25.4_ERROR_nccl_bootstrap.out"))
    assert run.flavour == "hpl-nvidia" and run.results == [] and not run.ok
    assert "no HPL result" in run.problems[0]


@pytest.mark.parametrize("name", ["anuhpc_hpl-nvidia-25.4_ERROR_nccl_bootstrap.err",
                                  "local_hpcc150_hpccinf_PASSED.input.txt"])
def test_text_that_is_not_hpl_output_is_refused(name):
    with pytest.raises(ParseError, match="no HPLinpack banner"):
        hpl.parse_hpl(text(name))


def test_handover_parse_hpl_prints_the_issue_keys():
    done = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "hpl",
                           str(DATA / "local_hpcc150_hpccoutf_FAILED_threshold1e-6.txt")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert parsed["ok"] is False
    assert set(parsed["results"][0]) >= {"tv", "n", "nb", "p", "q", "time", "gflops", "residual", "passed"}
    refused = subprocess.run([sys.executable, "-m", "handover.cli", "parse", "hpl",
                              str(DATA / "anuhpc_hpl-nvidia-25.4_ERROR_nccl_bootstrap.err")],
                             cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- input generation


@pytest.mark.parametrize("ranks, expected", [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (6, (2, 3)),
                                             (7, (1, 7)), (16, (4, 4)), (32, (4, 8))])
def test_grid_is_near_square(ranks, expected):
    assert hpl.grid(ranks) == expected


def test_problem_size_fills_the_fraction_in_multiples_of_nb():
    n = hpl.problem_size(64 * 2**30, 0.8, 192)
    assert n % 192 == 0 and n * n * 8 <= 0.8 * 64 * 2**30 < (n + 192) ** 2 * 8


def test_quick_uses_a_small_n_full_a_fraction_of_memory():
    assert hpl.plan_input(hpl.QUICK, 24 * 2**30, 2, 192) == hpl.HplInput(1920, 192, 1, 2)
    assert hpl.plan_input(hpl.QUICK, 2**20, 2, 192).n == 192  # tiny memory: never below NB
    full = hpl.plan_input(hpl.FULL, 4 * 512 * 2**30, 4 * 64, 192)
    assert (full.p, full.q) == (16, 16) and full.n > 100_000


def test_timeouts_follow_the_estimate_up_to_each_depths_cap():
    quick = hpl.plan_input(hpl.QUICK, 24 * 2**30, 2, 192)
    assert hpl.timeout_for(hpl.QUICK, quick) == hpl.estimated_timeout(hpl.QUICK, quick) < hpl.QUICK_TIMEOUT_CAP_S
    assert hpl.timeout_cap_note(hpl.QUICK, quick) == ""
    big = hpl.plan_input(hpl.FULL, 2 * 2**40, 224, 192)  # 2 TiB, 224 CPU ranks: days estimated
    assert hpl.estimated_timeout(hpl.FULL, big) > 24 * 3600
    assert hpl.timeout_for(hpl.FULL, big) == hpl.FULL_TIMEOUT_CAP_S == 4 * 3600
    assert hpl.timeout_cap_note(hpl.FULL, big).startswith(
        "the full depth caps HPL at 4 h (estimate for N=370560 on 224 rank(s): 84.4 h)")


def test_a_timeout_set_by_the_cap_says_so():
    """A Result as the transport returns it when the node-side timeout fired (exit 124), judged
    as the HPL suite's first sanity step does, with the cap's note for that run and without one."""
    timed_out = Result("gpu001", "mpirun ... hpcc", 124, "", "", 14400.2, timed_out=True)
    note = hpl.timeout_cap_note(hpl.FULL, hpl.plan_input(hpl.FULL, 2 * 2**40, 224, 192))
    with pytest.raises(CommandTimedOut, match=r"timed out after 14400 s: the full depth caps HPL at 4 h"):
        require_scratch_run(timed_out, "refused to run HPL", timeout_note=note)
    with pytest.raises(CommandTimedOut, match=r"timed out after 14400 s$"):
        require_scratch_run(timed_out, "refused to run HPL")


def test_hpccinf_matches_debians_sample_line_for_line():
    generated = hpl.hpccinf(hpl.HplInput(4000, 128, 1, 2))
    sample = text("local_hpcc150_hpccinf_PASSED.input.txt")
    assert [line.split()[0] for line in generated.splitlines()] == \
           [line.split()[0] for line in sample.splitlines()]
    assert hpl.hpl_dat(hpl.HplInput(4000, 128, 1, 2)).splitlines()[3].startswith("6 ")


def test_commands_per_flavour():
    launcher = MpirunLauncher(as_root=True)
    assert hpl.command("hpcc", launcher, ["localhost"], 2)[-1] == "hpcc"
    assert hpl.command("xhpl", launcher, ["a", "b"], 4)[-1] == "xhpl"
    assert hpl.command("hpl-nvidia", launcher, ["a", "b"], 8)[-3:] == ["hpl.sh", "--dat", "HPL.dat"]


# ---------------------------------------------------------------- real runs


@pytest.fixture
def local():
    return LocalTransport(Node(name="localhost", address="localhost", transport="local"))


def quick_hpcc(local, scratch_dir, scratch=None, argv=None, timeout=120):
    hpl_input = hpl.HplInput(960, 192, 1, 2)
    argv = argv or hpl.command("hpcc", MpirunLauncher(as_root=True), ["localhost"], 2)
    return hpl.run_on_scratch(local, str(scratch_dir), scratch or (ScratchPath(str(scratch_dir)),),
                              "hpcc", hpl_input, argv, timeout)


def test_detect_finds_hpcc_and_mpirun(local):
    detected = system.parse_programs(hpl.detect(local).stdout)
    assert detected.has("hpcc") and detected.has("mpirun") and not detected.has("xhpl")


def test_hpcc_runs_in_a_directory_of_its_own_and_removes_it(local, tmp_path):
    result = quick_hpcc(local, tmp_path)
    assert result.ok, result.stderr
    run = hpl.parse_hpl(result.stdout)
    assert run.ok and run.results[0].n == 960 and run.results[0].gflops > 0
    assert f"removed {tmp_path}/handover-hpl-localhost-" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_program_that_ignores_term_at_the_timeout_still_leaves_no_directory(local, tmp_path):
    """The node-side timeout sends TERM, then KILL 5 s later: the payload stops the program
    (which ignores TERM here) and removes its directory within those 5 s (it waited 10 before)."""
    result = quick_hpcc(local, tmp_path, argv=["sh", "-c", "trap '' TERM; exec sleep 60"], timeout=2)
    assert result.timed_out, result.explain()
    assert list(tmp_path.iterdir()) == []


def test_an_undeclared_or_missing_scratch_path_is_refused(local, tmp_path):
    with pytest.raises(ScratchRefused, match="not a scratch path"):
        quick_hpcc(local, tmp_path, scratch=(ScratchPath("/scratch"),))
    missing = tmp_path / "gone"
    result = quick_hpcc(local, missing, scratch=(ScratchPath(str(missing)),))
    assert refusal(result) == f"{missing} does not exist on this node or is not a directory"


def test_a_missing_program_is_named_and_leftovers_are_swept(local, tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    running = f"handover-hpl-localhost-{os.getpid()}-abc"  # a run still going: this test
    kept = [f"handover-hpl-otherhost-{ended.pid}-old", f"handover-hpl-localhost-a-{ended.pid}-old", running]
    for name in (f"handover-hpl-localhost-{ended.pid}-old", *kept):
        (tmp_path / name).mkdir()
    result = quick_hpcc(local, tmp_path, argv=["/nonexistent/xhpl"])
    assert missing_tool(result) == "/nonexistent/xhpl is not installed"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_the_scratch_guards_ship_as_one_script_each_with_the_code_they_share():
    """A node gets one file: the shared guard's text stands where the payload imports it."""
    from runners import payloads

    shared = (ROOT / "runners/payloads/scratch_guard.py").read_text()
    for name in ("hpl_scratch", "fio_scratch"):
        source = payloads.load(name)
        assert "from ." not in source and source.count(shared) == 1, name
        done = subprocess.run([sys.executable, "-I", "-", "{not json"], input=source, text=True,
                              capture_output=True, cwd="/")
        assert "JSONDecodeError" in done.stderr and "ImportError" not in done.stderr, done.stderr
