"""The device proof kit, rehearsed here without a GPU.

Built for this machine's Python from this checkout and this machine's package index, it stays
within 64 MiB and carries the project's wheel, a wheel of every runtime dependency, NVML's and
pip's, the recorded H200's figures and prove.py, and no torch. Unpacked in a fresh directory and
run with no network (a network namespace of its own) and no index, it installs, runs the
hardware suite with this machine as the one node under the h200 profile (no GPU names another),
and the GPU checks skip with their reasons; the venv sees this interpreter's torch, as it will
the GPU machine's. Run again past its --budget, in a soak with stress-ng hidden from PATH (as on
the recorded H200), it stops pytest, whose run is written as interrupted, stops the soak and sums
up what the run holds, leaving nothing running.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from nodes import wait_until

from inventory.loader import load_inventory
from runners import soak

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = "handover-device-proof"
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
GPU_CHECKS = ("gpu_inventory", "gpu_ecc", "gpu_pcie", "gpu_nvlink", "gpu_modes", "gpu_burn", "hbm_bandwidth",
              "pcie_bandwidth")
PERF = json.loads((ROOT / "tests" / "data" / "h200-1gpu" / "perf.json").read_text())


def load_prove():
    """kit/prove.py as the module it is when run on the GPU machine: a script, no package."""
    spec = importlib.util.spec_from_file_location("prove", ROOT / "kit" / "prove.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prove = load_prove()


def distribution(requirement: str) -> str:
    """The normalized project name (PEP 503) of a requirement such as 'PyYAML>=6.0'."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()


def carried(wheel: str) -> str:
    """The normalized project name of a wheel's file name (its first field)."""
    return distribution(wheel.split("-")[0])


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    archive = tmp_path_factory.mktemp("kit") / "device-proof.tar.gz"
    built = subprocess.run([sys.executable, "kit/build.py", "--python-version", PYTHON, "--out", str(archive)],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    assert f"device-proof: {archive} (" in built.stdout
    return archive


def test_the_kit_carries_the_project_its_dependencies_and_the_reference_within_64_mib(kit):
    assert kit.stat().st_size <= 64 * 2**20
    with tarfile.open(kit) as archive:
        names = archive.getnames()
        kit_json = json.load(archive.extractfile(f"{BUNDLE}/kit.json"))
        perf = archive.extractfile(f"{BUNDLE}/reference/perf.json").read()
    assert all(name == BUNDLE or name.startswith(f"{BUNDLE}/") for name in names)
    assert {f"{BUNDLE}/prove.py", f"{BUNDLE}/kit.json", f"{BUNDLE}/reference/PROVENANCE.md"} <= set(names)
    assert perf == (ROOT / "tests" / "data" / "h200-1gpu" / "perf.json").read_bytes()
    wheels = [Path(name).name for name in names if name.startswith(f"{BUNDLE}/wheels/")]
    assert sorted(wheels) == kit_json["wheels"] and all(wheel.endswith(".whl") for wheel in wheels)
    projects = {carried(wheel) for wheel in wheels}
    dependencies = re.search(r"^dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    required = {distribution(item) for item in re.findall(r'"([^"]+)"', dependencies.group(1))}
    assert required | {"handover", "nvidia-ml-py", "pip", "paramiko", "invoke", "numpy"} <= projects
    assert len(projects) == len(wheels)  # one version of each: two would stop the install
    assert not {name for name in projects if name.startswith(("torch", "nvidia-cu", "triton"))}
    tag = f"cp{PYTHON.replace('.', '')}"
    binary = [wheel for wheel in wheels if not wheel.endswith("-none-any.whl")]
    assert binary and all(f"-{tag}-" in wheel or "-abi3-" in wheel for wheel in binary)
    assert all("manylinux" in wheel and wheel.endswith("_x86_64.whl") for wheel in binary)
    (project,) = [wheel for wheel in wheels if wheel.startswith("handover-")]
    assert project.startswith("handover-0.1.0+g") and kit_json["install"][0] == f"handover=={project.split('-')[1]}"
    assert kit_json["python"] == PYTHON and kit_json["pip_wheel"].startswith("pip-")


def test_the_kit_refuses_another_python_in_one_line(kit, tmp_path):
    with tarfile.open(kit) as archive:
        archive.extractall(tmp_path, filter="data")
    kit_json = tmp_path / BUNDLE / "kit.json"
    kit_json.write_text(json.dumps({**json.loads(kit_json.read_text()), "python": "3.99"}))
    ran = subprocess.run([sys.executable, str(tmp_path / BUNDLE / "prove.py"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert ran.returncode == 2
    assert ran.stderr == (f"prove.py: this kit carries wheels for Python 3.99, and {sys.executable} is {PYTHON}: "
                          f"run it with a Python 3.99 that has torch, or rebuild the kit with "
                          f"make device-proof KIT_PYTHON={PYTHON}\n")
    assert not (tmp_path / "out").exists()


def without_network(command: list[str]) -> list[str]:
    """The command in a network namespace of its own (only loopback), where this machine allows it."""
    wrapped = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    probe = subprocess.run(wrapped + ["true"], capture_output=True)
    return wrapped + command if probe.returncode == 0 else command


def test_the_kit_installs_without_network_runs_and_the_gpu_checks_skip_with_their_reasons(kit, tmp_path):
    with tarfile.open(kit) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    bundle, out = tmp_path / "unpacked" / BUNDLE, tmp_path / "out"
    command = [sys.executable, str(bundle / "prove.py"), "--out", str(out), "--no-gpu",
               "--", "-m", "quick and hardware", "--busy-nodes", "wait"]
    env = {**os.environ, "HANDOVER_HOME": str(tmp_path / "home")}
    ran = subprocess.run(without_network(command), capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert "prove.py: profile h200-sxm-8gpu (nvidia-smi names no GPU here)" in ran.stdout
    assert f"prove.py: venv {out / 'venv'} with handover==" in ran.stdout and "(no index)" in ran.stdout
    assert re.search(r"prove\.py: torch \S+ \(CUDA None\), 0 GPU\(s\) visible", ran.stdout)  # this venv's torch
    results = json.loads((out / "device-proof" / "latest" / "results.json").read_text())
    kit_json = json.loads((bundle / "kit.json").read_text())
    assert results["run"]["harness"]["version"] == kit_json["install"][0].split("==")[1]  # the kit's, not ours
    assert results["run"]["profile"] == "h200-sxm-8gpu"
    overrides = {o["key"]: o for o in results["run"]["expect_overrides"]}
    assert set(overrides) == {fact for fact, _, _ in prove.ONE_GPU + prove.NO_GPU}
    assert overrides["gpu_count"] == {"key": "gpu_count", "value": None, "profile_value": 8,
                                      "reason": "rehearsal on a machine without a GPU: the GPU checks skip"}
    checks = {entry["check"]: entry for entry in results["checks"] if entry["node"] == "localhost"}
    for name in GPU_CHECKS:
        assert checks[name]["outcome"] == "skipped" and "NVML" in checks[name]["message"], checks[name]
    assert checks["kernel_log"]["outcome"] == "passed"
    assert f"device proof: verdict {results['verdict']['status']}" in ran.stdout
    burn = f"not measured: gpu_burn skipped: {checks['gpu_burn']['message'].splitlines()[0]}"
    assert re.search(r"^  burn bf16 TFLOP/s \(vs bf16 matmul ceiling\) +" + re.escape(burn) + "$", ran.stdout, re.M)
    assert "not run (no training or training_sustained check in this run)" in ran.stdout
    (run_dir,) = [path for path in (out / "device-proof").iterdir() if not path.is_symlink()]
    assert (run_dir / "report.html.sig").is_file() and "Expectations overridden by the inventory" in (
        run_dir / "report.html").read_text()


def path_without(tool: str, folder: Path) -> str:
    """This PATH, with each of its folders that holds `tool` replaced by one of links to the rest."""
    folders = []
    for index, directory in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if not directory or not os.path.exists(os.path.join(directory, tool)):
            folders.append(directory)
            continue
        links = folder / str(index)
        links.mkdir(parents=True)
        for entry in os.scandir(directory):
            if entry.name != tool:
                (links / entry.name).symlink_to(entry.path)
        folders.append(str(links))
    return os.pathsep.join(folders)


def processes_naming(path: Path) -> list[str]:
    """'PID command line' of every process whose command line names something under `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if entry.name.isdigit() and str(path) in command:
            found.append(f"{entry.name} {command}")
    return found


# pytest's share: 90 s, where the set-up takes about 10 here (beside another test, under load, more):
# the soak has started long before its stop, and still has minutes to go
BUDGET = prove.TERM_GRACE_S + prove.AFTER_S + 90


def test_a_run_past_its_budget_is_stopped_written_as_interrupted_summed_up_and_leaves_nothing_running(
        kit, tmp_path):
    """The device tool kills a command at 600 s, and the tar of the run that follows prove.py must
    still run: a soak of 10 minutes, past prove.py's --budget, is stopped with SIGTERM; the harness
    writes the run as interrupted, rendered and signed, prove.py ends the soak the run left on the
    machine and prints the summary. stress-ng is hidden from PATH, as on the recorded H200: the
    soak's CPU load is off, and prove.py says so."""
    with tarfile.open(kit) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    bundle, out = tmp_path / "unpacked" / BUNDLE, tmp_path / "out"
    command = [sys.executable, str(bundle / "prove.py"), "--out", str(out), "--no-gpu", "--soak", "10m",
               "--budget", f"{BUDGET:g}", "--", "-m", "soak", "--busy-nodes", "wait"]
    env = {**os.environ, "HANDOVER_HOME": str(tmp_path / "home"), "PATH": path_without("stress-ng", tmp_path / "bin")}
    # timeout: a bound should prove.py's own fail, not a measure of it
    ran = subprocess.run(without_network(command), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    said = ran.stdout + ran.stderr
    assert ran.returncode == 2, said[-4000:]  # pytest's, interrupted
    assert ("prove.py: stress-ng is not on PATH: the soak's CPU load is off (cpu=0 in its mix); its GPU burn and "
            "telemetry run") in ran.stdout
    assert len(re.findall(rf"^prove\.py: the --budget of {BUDGET:g} s ran out: pytest stopped after \d+ s \(SIGTERM",
                          ran.stdout, re.M)) == 1, said[-4000:]
    assert "prove.py: pytest did not end within" not in ran.stdout  # SIGTERM was enough
    (run_dir,) = [path for path in (out / "device-proof").iterdir() if not path.is_symlink()]
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["type"] == "end" and ledger[-1]["interrupted"] is True, ledger[-1]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["run"]["interrupted"] is True and (run_dir / "report.html.sig").is_file()
    assert "the run was interrupted before it finished" in results["verdict"]["reasons"]
    assert soak.SoakPlan.load(run_dir).mix["cpu"] == 0
    assert "prove.py: the soak goes on on this machine; stopping it" in ran.stdout
    assert re.search(r"^handover: soak \S+ on localhost: stopped", ran.stdout, re.M), said[-4000:]
    assert f"device proof: verdict {results['verdict']['status']}  ({run_dir})" in ran.stdout
    assert "headline figures" in ran.stdout
    assert processes_naming(tmp_path) == []
    assert list((out / "scratch").iterdir()) == []
    # Had pytest been killed before it rendered the run, prove.py renders it from its ledger
    rendered = [path.name for path in run_dir.iterdir() if path.name.startswith(("results.", "report."))]
    for name in rendered:
        (run_dir / name).unlink()
    prove.render(out / "venv" / "bin" / "python", run_dir, out, env, prove.Budget(prove.BUDGET_S))
    assert json.loads((run_dir / "results.json").read_text())["run"]["interrupted"] is True
    assert sorted(path.name for path in run_dir.iterdir() if path.name in rendered) == sorted(rendered)


SIGTERM_IGNORED = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])  # in its session
time.sleep(600)
"""


def test_a_pytest_that_ignores_sigterm_is_killed_with_what_it_started_in_its_session(tmp_path, monkeypatch, capsys):
    """A run that does not end within the grace after SIGTERM is killed, and everything it started
    in its session with it. This stand-in for pytest ignores SIGTERM from its start (the ignored
    disposition outlives exec), so the grace always runs out; its grace is a second here."""
    monkeypatch.setattr(prove, "TERM_GRACE_S", 1.0)
    budget = prove.Budget(prove.BUDGET_S)
    budget.pytest_by = budget.started  # already past: SIGTERM at once
    marker = tmp_path / "started-by-the-run"
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        status = prove.run_pytest([sys.executable, "-c", SIGTERM_IGNORED, str(marker)], tmp_path, dict(os.environ),
                                  budget)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == 128 + signal.SIGKILL
    said = capsys.readouterr().out
    assert f"prove.py: the --budget of {prove.BUDGET_S:g} s ran out: pytest stopped after" in said
    assert "prove.py: pytest did not end within 1 s of SIGTERM: killed with everything it started (SIGKILL)" in said
    assert wait_until(lambda: processes_naming(marker) == [], 10), processes_naming(marker)  # bound, not measure


def test_the_inventory_prove_writes_loads_with_one_reason_per_override(tmp_path):
    path = tmp_path / "device-proof.yaml"
    path.write_text(prove.inventory_text(Path("/opt/kit/venv/bin/python"), tmp_path / "scratch", "h200-sxm-8gpu",
                                         prove.ONE_GPU, {"commit": "abc1234"}))
    cluster = load_inventory(path)
    assert cluster.profile.name == "h200-sxm-8gpu" and cluster.transport == "local"
    assert cluster.nodes[0].python == "/opt/kit/venv/bin/python"
    assert [(o.key, o.value, o.reason) for o in cluster.expect_overrides] == [
        (fact, tuple(value) if isinstance(value, list) else value, reason) for fact, value, reason in prove.ONE_GPU]
    assert cluster.profile.expect.gpu_count == 1 and cluster.profile.expect.gpu_model == "^NVIDIA H200"


@pytest.mark.parametrize("names, profile", [
    (["NVIDIA H100 80GB HBM3"], "h100-sxm-8gpu"),  # the device tool's nvidia-h100-x1 (its KINDS.md reading)
    (["NVIDIA H200"], "h200-sxm-8gpu"),  # the recorded H200 (tests/data/h200-1gpu/system.txt)
    (["NVIDIA A100-SXM4-80GB"] * 8, "a100-sxm-8gpu"),
])
def test_the_profile_is_the_one_the_gpus_name_gives(names, profile, tmp_path):
    chosen, why = prove.choose_profile(None, names)
    assert chosen == profile and why == f"for the {names[0]} nvidia-smi names"
    path = tmp_path / "device-proof.yaml"  # every one-GPU override is valid under that profile too
    path.write_text(prove.inventory_text(Path("/opt/kit/venv/bin/python"), tmp_path / "scratch", chosen,
                                         prove.ONE_GPU, {"commit": "abc1234"}))
    cluster = load_inventory(path)
    assert cluster.profile.name == profile and re.search(cluster.profile.expect.gpu_model, names[0])
    assert [o.key for o in cluster.expect_overrides] == [fact for fact, _, _ in prove.ONE_GPU]


def test_the_profile_asked_for_wins_and_no_gpu_or_no_known_gpu_says_so():
    assert prove.choose_profile("h100-sxm-8gpu", ["NVIDIA H200"]) == ("h100-sxm-8gpu", "as asked with --profile")
    assert prove.choose_profile(None, []) == ("h200-sxm-8gpu", "nvidia-smi names no GPU here")
    for names in (["Tesla T4"], ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]):
        with pytest.raises(prove.ProofError, match=r"^no one profile for the GPU\(s\) .*: name one with --profile "
                                                   r"\(h200-sxm-8gpu, h100-sxm-8gpu, a100-sxm-8gpu\)$"):
            prove.choose_profile(None, names)


def test_headline_figures_under_another_profile_say_the_recorded_h200_is_a_guide():
    results = {"verdict": {"status": "CERTIFIED"}, "run": {"profile": "h100-sxm-8gpu"}, "checks": []}
    text = prove.summary(results, PERF, Path("/runs/x"))
    assert "  (judged under h100-sxm-8gpu: the recorded H200 is a guide here, not this GPU's ceiling)" in text
    assert "guide" not in prove.summary({**results, "run": {"profile": "h200-sxm-8gpu"}}, PERF, Path("/runs/x"))


def test_headline_figures_beside_the_recorded_h200():
    results = {"verdict": {"status": "NOT CERTIFIED", "reasons": ["localhost: gpu_pcie failed"]}, "checks": [
        {"check": "gpu_burn", "outcome": "passed", "node": "localhost", "metrics": [
            {"name": "gpu_burn_tflops", "value": 656.0, "unit": "TFLOP/s"},
            {"name": "gpu_burn_vs_matmul", "value": 97.5, "unit": "%"}]},
        {"check": "hbm_bandwidth", "outcome": "failed", "node": "localhost", "message": "hbm_copy_bandwidth = ?\nmore",
         "metrics": []}]}
    lines = prove.summary(results, PERF, Path("/runs/x")).splitlines()
    assert lines[1:3] == ["device proof: verdict NOT CERTIFIED  (/runs/x)", "  - localhost: gpu_pcie failed"]
    figures = dict(re.fullmatch(r"  (.+?)  +(.+)", line).groups() for line in lines[5:])
    assert figures["burn bf16 TFLOP/s (vs bf16 matmul ceiling)"] == "656 TFLOP/s | recorded 778.7 | 84%"
    assert figures["burn / matmul in the same run, %"] == "97.5 %"
    assert figures["HBM copy TB/s (read+write)"] == "not measured: hbm_bandwidth failed: hbm_copy_bandwidth = ?"
    assert figures["GEMM fp64 TFLOP/s"] == "not run (no gemm_fp64 check in this run)"
    assert len(figures) == len(prove.HEADLINE)


def test_a_soak_beside_a_depth_selects_both_and_sets_its_duration():
    assert prove.selection("quick", None) == ["-m", "quick"] and prove.selection("all", None) == []
    mix = ["--soak-mix", "gpu_round_s=60"]  # a proof's soak of minutes: rounds of a minute
    assert prove.selection("full", "3m") == ["-m", "full or soak", "--soak-duration", "3m", *mix]
    assert prove.selection("all", "2m") == ["--soak-duration", "2m", *mix]


def test_without_stress_ng_the_proofs_soak_has_no_cpu_load_and_three_minutes_still_judge_it():
    """Every CPU round of a soak would fail where stress-ng is not installed (the recorded H200):
    the mix turns the CPU load off, and a 3-minute soak is long enough for its GPU rounds."""
    options = prove.selection("quick", "3m", cpu_load=False)
    assert options == ["-m", "quick or soak", "--soak-duration", "3m", "--soak-mix", "gpu_round_s=60,cpu=0"]
    mix = soak.parse_mix(options[-1])
    assert mix["cpu"] == 0 and mix["gpu_round_s"] == 60
    assert soak.too_short(soak.parse_duration("3m"), mix, gpus=True) is None


def test_the_summary_lists_the_soaks_checks_and_trends():
    results = {"verdict": {"status": "CERTIFIED"}, "checks": [
        {"check": "soak_gpu", "node": "localhost", "outcome": "passed", "message": "GPU 0: no Xid\nmore"}],
        "soak": {"trends": ["soak temperature (C)"]}}
    text = prove.summary(results, PERF, Path("/tmp/run"))
    assert "soak:\n  soak_gpu: passed: GPU 0: no Xid\n  trend: soak temperature (C)" in text
