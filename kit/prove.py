#!/usr/bin/env python3
"""Prove handover on this GPU machine, from the unpacked device proof kit, with no registry.

Run it with the Python that has the machine's CUDA torch (python3 prove.py --out DIR): it makes
a venv from the wheels the kit carries only (pip --no-index), seeing that interpreter's packages
for torch and its CUDA libraries; writes a one-node inventory for this machine under the profile
of the GPU nvidia-smi names (an H100 is judged as an H100, an H200 as an H200; --profile chooses
another), with the expectations one GPU cannot meet overridden, each with its reason; runs the
acceptance suites with the signed run directory under DIR; and prints the verdict and the
headline figures beside those recorded on an H200 (perf.json).

All of it keeps within a time budget (--budget, 480 s by default: the device tool kills a command
at 600 s, and what comes after prove.py, the tar of the run, must still run): set-up and pytest
until the budget's last TERM_GRACE_S + AFTER_S seconds; then pytest gets SIGTERM (the harness
ends the run as interrupted, its report rendered and signed), TERM_GRACE_S to end, SIGKILL after
that; what the run directory holds is summed up all the same.

Standard library only: it runs before the venv exists.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

KIT = Path(__file__).resolve().parent
CLUSTER = "device-proof"
# The profile of the GPU nvidia-smi names: (what its name holds, profile). The first that matches.
PROFILES = (("H200", "h200-sxm-8gpu"), ("H100", "h100-sxm-8gpu"), ("A100", "a100-sxm-8gpu"))
RECORDED_PROFILE = "h200-sxm-8gpu"  # perf.json's GPU; also the rehearsal's profile where no GPU is named
DEPTHS = {"quick": "quick", "full": "full", "all": None}  # the -m marker of each depth; all: none

# What one GPU on its own cannot be, against an eight-GPU HGX profile: (fact, value, reason).
ONE_GPU = (
    ("gpu_count", 1, "a single-GPU machine, not an eight-GPU HGX board"),
    ("nvlink_links", None, "one GPU has no NVLink peer (nvidia-smi nvlink -s prints nothing on the recorded H200)"),
    ("nvswitch", False, "no NVSwitch: one GPU has no NVLink fabric for Fabric Manager to manage"),
    ("gpu_numa_nodes", [0], "one GPU, on NUMA node 0 (nvidia-smi topo -m on the recorded H200)"),
    ("gpudirect_rdma", False, "no InfiniBand HCA, so nothing for nvidia_peermem to serve"),
    ("ib_hcas", None, "no InfiniBand HCA on this machine (ibstat not found on the recorded H200)"),
)
# A rehearsal on a machine without a GPU: the GPU checks skip, with their reasons, instead of failing.
NO_GPU = (
    ("gpu_count", None, "rehearsal on a machine without a GPU: the GPU checks skip"),
    ("gpu_numa_nodes", None, "rehearsal on a machine without a GPU: no GPU to place"),
)

# The headline figures: (label, checks that measure it, metric, perf.json key or None).
HEADLINE = (
    ("burn bf16 TFLOP/s (vs bf16 matmul ceiling)", ("gpu_burn", "gpu_burn_full"), "gpu_burn_tflops",
     "gemm_bfloat16_tflops"),
    ("burn / matmul in the same run, %", ("gpu_burn", "gpu_burn_full"), "gpu_burn_vs_matmul", None),
    ("HBM copy TB/s (read+write)", ("hbm_bandwidth",), "hbm_copy_bandwidth", "hbm_copy_tbps_rw"),
    ("PCIe H2D GB/s (pinned)", ("pcie_bandwidth",), "h2d_bandwidth", "h2d_pinned_gbps"),
    ("PCIe D2H GB/s (pinned)", ("pcie_bandwidth",), "d2h_bandwidth", "d2h_pinned_gbps"),
    ("GEMM bf16 TFLOP/s", ("gemm_bf16",), "gemm_bf16_tflops", "gemm_bfloat16_tflops"),
    ("GEMM fp16 TFLOP/s", ("gemm_fp16",), "gemm_fp16_tflops", "gemm_float16_tflops"),
    ("GEMM tf32 TFLOP/s", ("gemm_tf32",), "gemm_tf32_tflops", "gemm_float32_tf32_tflops"),
    ("GEMM fp32 TFLOP/s", ("gemm_fp32",), "gemm_fp32_tflops", "gemm_float32_tflops"),
    ("GEMM fp64 TFLOP/s", ("gemm_fp64",), "gemm_fp64_tflops", "gemm_float64_tflops"),
    ("FFT c64 GFLOP/s", ("fft",), "fft_c64_gflops", "fft2_c64_gflops"),
    ("training tokens/s per rank", ("training", "training_sustained"), "tokens_per_s_per_rank",
     "train_tokens_per_s"),
)


PROOF_SOAK_MIX = "gpu_round_s=60"
NO_CPU_LOAD = "cpu=0"  # the soak's mix where stress-ng is not installed (the recorded H200 has none)

# The time budget (seconds from prove.py's start). The last TERM_GRACE_S + AFTER_S of it are not
# pytest's: TERM_GRACE_S for pytest to end the run after SIGTERM (kill the work on the node,
# render and sign the report), AFTER_S to stop a soak the run left on the machine, render a run
# pytest could not, and print the summary.
BUDGET_S = 480.0
TERM_GRACE_S = 30.0
AFTER_S = 40.0
KILL_WAIT_S = 10.0  # after SIGKILL, how long pytest's end is waited for
SOAK_STOP_S = 45.0  # `pytest --soak-stop`: its supervisor gets 30 s (runners.soak.STOP_WAIT_S)
PROBE_S = 120.0  # the torch probe: importing torch and CUDA's libraries takes seconds, not minutes
NVIDIA_SMI_S = 60.0
SUMMARY_S = 3.0  # what the summary keeps for itself at the end of the budget


class ProofError(Exception):
    """A step of the proof that cannot go on; str() is one line."""


class Budget:
    """prove.py's time from its start: set-up and pytest until `pytest_by`, then pytest's ending
    after SIGTERM, a soak's stop, a rendering and the summary until `end` (monotonic clock)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started = time.monotonic()
        self.end = self.started + seconds
        self.pytest_by = self.end - TERM_GRACE_S - AFTER_S

    def left(self, until: Optional[float] = None) -> float:
        """Seconds left until `until` (the budget's end by default), never below 0."""
        return max(0.0, (self.end if until is None else until) - time.monotonic())

    def spent(self) -> float:
        return time.monotonic() - self.started

    def ran_out(self, during: str) -> ProofError:
        return ProofError(f"the --budget of {self.seconds:g} s ran out {during} (after {self.spent():.0f} s)")


def budget_seconds(text: str) -> float:
    """--budget: seconds, more than what prove.py keeps for after pytest."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    reserved = TERM_GRACE_S + AFTER_S
    if not reserved < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"more than {reserved:g} s ({TERM_GRACE_S:g} s for pytest to end after "
                                         f"SIGTERM, {AFTER_S:g} s to stop a soak and sum up), got {text}")
    return seconds


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Arguments after -- go to pytest, e.g. -- -k gpu_burn")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="directory for the venv, the inventory and the run directory")
    parser.add_argument("--depth", choices=sorted(DEPTHS), default="quick",
                        help="quick (default), full, or all: both")
    parser.add_argument("--profile", choices=[profile for _, profile in PROFILES],
                        help="judge this machine under this profile instead of the one its GPU's name gives")
    parser.add_argument("--no-gpu", action="store_true",
                        help="rehearsal on a machine without a GPU: the GPU checks skip instead of failing")
    parser.add_argument("--soak", metavar="DURATION",
                        help="also soak the machine this long (2m, 3m, 1h; at least two load rounds of 60 s): "
                             "the GPU burn on every GPU, stress-ng on the CPUs (where it is installed), telemetry "
                             "throughout; its trends "
                             "go into the report")
    parser.add_argument("--budget", type=budget_seconds, default=BUDGET_S, metavar="SECONDS",
                        help=f"all of prove.py within this many seconds (default {BUDGET_S:g}); pytest, still running "
                             f"{TERM_GRACE_S + AFTER_S:g} s before its end, is stopped (SIGTERM: the run is written as "
                             "interrupted) and the summary printed from what the run holds")
    parser.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budget = Budget(args.budget)
    try:
        return prove(args.out.resolve(), args.depth, args.no_gpu, args.profile, args.soak, args.pytest_args, budget)
    except ProofError as error:
        print(f"prove.py: {error}", file=sys.stderr)
        return 2


def selection(depth: str, soak: Optional[str], cpu_load: bool = True) -> list[str]:
    """pytest's options for a depth, with the soak beside it when one is asked for (a soak alone
    would leave the mandatory checks without results: INCOMPLETE). A proof's soak lasts minutes:
    GPU burn rounds of a minute (not the 5 of a delivery's) give its trend and drift their points;
    without `cpu_load` (no stress-ng here) its mix has no CPU load, whose every round would fail;
    a --soak-mix after -- overrides it."""
    marker = DEPTHS[depth]
    if soak is None:
        return ["-m", marker] if marker else []
    mix = PROOF_SOAK_MIX if cpu_load else f"{PROOF_SOAK_MIX},{NO_CPU_LOAD}"
    return (["-m", f"{marker} or soak"] if marker else []) + ["--soak-duration", soak, "--soak-mix", mix]


def prove(out: Path, depth: str, no_gpu: bool, asked: Optional[str], soak: Optional[str], more_args: list[str],
          budget: Budget) -> int:
    kit = json.loads((KIT / "kit.json").read_text(encoding="utf-8"))
    check_python(kit["python"])
    profile, why = choose_profile(asked, gpu_names(budget))
    print(f"prove.py: profile {profile} ({why})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    venv = out / "venv"
    python = make_venv(venv, kit, budget)
    say_torch(python, budget)
    overrides = ONE_GPU + NO_GPU if no_gpu else ONE_GPU
    inventory = out / f"{CLUSTER}.yaml"
    inventory.write_text(inventory_text(python, out / "scratch", profile, overrides, kit), encoding="utf-8")
    (out / "scratch").mkdir(exist_ok=True)
    cpu_load = shutil.which("stress-ng") is not None  # the node's supervisor sees this PATH, the venv's before it
    if soak is not None and not cpu_load:
        print(f"prove.py: stress-ng is not on PATH: the soak's CPU load is off ({NO_CPU_LOAD} in its mix); "
              "its GPU burn and telemetry run", flush=True)
    if budget.left(budget.pytest_by) <= 0:
        raise budget.ran_out("before pytest started")
    print(f"prove.py: inventory {inventory}; running the {depth} suites, for at most "
          f"{budget.left(budget.pytest_by):.0f} s (--budget {budget.seconds:g} s)", flush=True)
    # The payloads find the venv's python first; of pytest's plugins only handover's is loaded, not
    # those the machine's own environment holds (xdist, cov, timeout ...), written for its pytest.
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    pytest = [str(python), "-m", "pytest", "-p", "handover.plugin", "--inventory", str(inventory)]
    command = [*pytest, "--out", str(out), "-p", "no:cacheprovider", *selection(depth, soak, cpu_load), *more_args]
    began = time.time()
    status = run_pytest(command, out, env, budget)
    run_dir = this_run(out / CLUSTER, began)
    if run_dir is None:
        print(f"prove.py: pytest wrote no run directory under {out / CLUSTER} (pytest exit status {status})",
              file=sys.stderr)
        return status or 2
    stop_soak(pytest, run_dir, out, env, budget)
    if not (run_dir / "results.json").is_file():
        render(python, run_dir, out, env, budget)
    results = run_dir / "results.json"
    if not results.is_file():
        print(f"prove.py: no {results} (pytest exit status {status})", file=sys.stderr)
        return status or 2
    perf = json.loads((KIT / "reference" / "perf.json").read_text(encoding="utf-8"))
    print(summary(json.loads(results.read_text(encoding="utf-8")), perf, results.parent.resolve()), flush=True)
    return status


def run_pytest(command: list[str], cwd: Path, env: dict, budget: Budget) -> int:
    """pytest's exit status (128 + the signal that ended it). Still running at the budget's
    `pytest_by`, it gets SIGTERM, which the harness treats as Ctrl-C: it kills the work on the
    node and writes the run as interrupted, its report rendered and signed; TERM_GRACE_S later,
    SIGKILL, to its process group (the harness's leases end what it started on the node, as
    they do when a harness is killed). It runs in a session of its own, so prove.py relays the
    signals it gets itself (a Ctrl-C at the terminal) to it."""
    child = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)

    def relay(signum: int, frame: object) -> None:
        child.send_signal(signum)

    relayed = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, relay) for signum in relayed
                if signal.getsignal(signum) != signal.SIG_IGN}  # nohup's SIGHUP stays ignored
    try:
        try:
            status = child.wait(timeout=budget.left(budget.pytest_by))
        except subprocess.TimeoutExpired:
            print(f"prove.py: the --budget of {budget.seconds:g} s ran out: pytest stopped after "
                  f"{budget.spent():.0f} s (SIGTERM; {TERM_GRACE_S:g} s to write the run as interrupted, then "
                  "SIGKILL); the summary is of what the run holds", flush=True)
            child.send_signal(signal.SIGTERM)
            try:
                status = child.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                print(f"prove.py: pytest did not end within {TERM_GRACE_S:g} s of SIGTERM: killed with everything "
                      "it started (SIGKILL)", flush=True)
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    status = child.wait(timeout=KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    status = -signal.SIGKILL
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - status if status < 0 else status


def this_run(cluster_dir: Path, began: float) -> Optional[Path]:
    """The run directory pytest wrote to (`latest`, its ledger written since `began`), or None."""
    run_dir = (cluster_dir / "latest").resolve()
    try:
        written = (run_dir / "ledger.jsonl").stat().st_mtime
    except OSError:
        return None
    return run_dir if written >= began - 1 else None


def stop_soak(pytest: list[str], run_dir: Path, out: Path, env: dict, budget: Budget) -> None:
    """End a soak the run left going on this machine (its harness stopped before the end: a soak
    outlives its harness by design), with `pytest --soak-stop`, within the budget."""
    try:
        plan = json.loads((run_dir / "soak.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if plan.get("collected") or plan.get("stopped"):
        return
    timeout = min(SOAK_STOP_S, budget.left() - SUMMARY_S)
    if timeout < 1:
        print("prove.py: the soak goes on on this machine, and the budget has no time left to stop it: its "
              "supervisor ends it at its end time", flush=True)
        return
    print(f"prove.py: the soak goes on on this machine; stopping it (pytest --soak-stop, at most {timeout:.0f} s)",
          flush=True)
    try:
        subprocess.run([*pytest, "-p", "no:cacheprovider", "--soak-stop", str(run_dir)], cwd=out, env=env,
                       timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"prove.py: the soak's stop did not end within {timeout:.0f} s: its supervisor ends it at its end time",
              flush=True)


def render(python: Path, run_dir: Path, out: Path, env: dict, budget: Budget) -> None:
    """Render and sign a run whose pytest ended before it could (SIGKILL): `handover report`."""
    timeout = budget.left() - SUMMARY_S
    if timeout <= 1 or not (run_dir / "ledger.jsonl").is_file():
        return
    print(f"prove.py: rendering {run_dir} from its ledger (handover report, at most {timeout:.0f} s)", flush=True)
    try:
        subprocess.run([str(python), "-m", "handover.cli", "report", str(run_dir)], cwd=out, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"prove.py: handover report did not end within {timeout:.0f} s", flush=True)


def gpu_names(budget: Budget) -> list[str]:
    """The GPUs' names as nvidia-smi gives them ('NVIDIA H100 80GB HBM3'); none without it."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True,
                                timeout=max(1.0, min(NVIDIA_SMI_S, budget.left(budget.pytest_by))))
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []


def choose_profile(asked: Optional[str], names: list[str]) -> tuple[str, str]:
    """(profile, why): the one asked for, else the one every GPU's name gives (an H100 judged
    against H200 bands would fail its memory and bandwidth for being what it is), else, with
    no GPU named, the recorded H200's (a rehearsal)."""
    if asked:
        return asked, "as asked with --profile"
    if not names:
        return RECORDED_PROFILE, "nvidia-smi names no GPU here"
    found = {next((profile for model, profile in PROFILES if model in name), None) for name in names}
    if len(found) != 1 or None in found:
        raise ProofError(f"no one profile for the GPU(s) {', '.join(sorted(set(names)))}: name one with --profile "
                         f"({', '.join(profile for _, profile in PROFILES)})")
    return found.pop(), f"for the {names[0]} nvidia-smi names"


def check_python(wanted: str) -> None:
    """The carried wheels are for one Python version (numpy, pandas and cryptography are binary)."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if here != wanted:
        raise ProofError(f"this kit carries wheels for Python {wanted}, and {sys.executable} is {here}: "
                         f"run it with a Python {wanted} that has torch, or rebuild the kit with "
                         f"make device-proof KIT_PYTHON={here}")


def make_venv(venv: Path, kit: dict, budget: Budget) -> Path:
    """A fresh venv holding the carried wheels at the versions the kit was tested with (installed
    over whatever this interpreter has), and seeing this interpreter's packages for torch."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", "--clear", str(venv)],
        "make the venv", budget)
    python = venv / "bin" / "python"
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       "ask the venv where its packages go", budget).strip())
    if sys.prefix != sys.base_prefix:
        # This interpreter is itself a venv (torch often lives in one): --system-site-packages
        # only reaches its base, so its own site-packages come in through a .pth, after the venv's.
        lines = [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
        (purelib / "device-proof-base.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")
    wheels = KIT / "wheels"
    pip = wheels / kit["pip_wheel"] / "pip"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, find-links or constraints from this machine's pip config
    run([str(python), str(pip), "install", "--no-index", "--find-links", str(wheels), "--ignore-installed",
         "--no-cache-dir", "--no-compile", "--disable-pip-version-check", "--quiet", *kit["install"]],
        "install the carried wheels", budget, env)
    print(f"prove.py: venv {venv} with {', '.join(kit['install'])} from {wheels} (no index)", flush=True)
    return python


def say_torch(python: Path, budget: Budget) -> None:
    """Which torch the payloads will find, and the GPUs it sees: the machine's, not the kit's."""
    probe = ("import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), "
             "torch.cuda.get_device_name(0) if torch.cuda.device_count() else '-')")
    timeout = min(PROBE_S, budget.left(budget.pytest_by))
    try:
        result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        print(f"prove.py: the torch probe did not answer within {timeout:.0f} s: the torch checks will say why",
              flush=True)
        return
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["no output"]
        print(f"prove.py: torch is not importable from the venv ({lines[-1]}): the torch checks will say why")
        return
    version, cuda, count, name = result.stdout.split(maxsplit=3)
    print(f"prove.py: torch {version} (CUDA {cuda}), {count} GPU(s) visible: {name.strip()}", flush=True)


def inventory_text(python: Path, scratch: Path, profile: str, overrides: tuple, kit: dict) -> str:
    """This machine as a one-node cluster under `profile`, each expectation it cannot meet
    overridden with the reason (a later entry for a fact replaces an earlier one)."""
    chosen = {fact: (value, reason) for fact, value, reason in overrides}
    lines = [
        f"# Written by the handover device proof kit's prove.py (kit built from {kit['commit']}).",
        f"cluster: {CLUSTER}",
        f"profile: {profile}",
        "transport: local",
        f"python: {json.dumps(str(python))}",
        "nodes: [localhost]",
        "scratch:",
        f"  - {{path: {json.dumps(str(scratch))}, kind: local}}",
        "expect:",
    ]
    for fact, (value, reason) in chosen.items():
        lines.append(f"  {fact}: {{value: {json.dumps(value)}, reason: {json.dumps(reason)}}}")
    return "\n".join(lines) + "\n"


def summary(results: dict, perf: dict, run_dir: Path) -> str:
    """The verdict, then each headline figure beside the recorded H200's, or why it is missing."""
    verdict = results.get("verdict") or {}
    lines = ["", f"device proof: verdict {verdict.get('status')}  ({run_dir})"]
    lines += [f"  - {reason}" for reason in (verdict.get("reasons") or [])[:8]]
    lines += ["", f"headline figures (this machine, then the recorded H200 of perf.json, {perf.get('device')}, "
              f"torch {perf.get('torch')}):"]
    profile = (results.get("run") or {}).get("profile")
    if profile and profile != RECORDED_PROFILE:
        lines.append(f"  (judged under {profile}: the recorded H200 is a guide here, not this GPU's ceiling)")
    width = max(len(label) for label, *_ in HEADLINE)
    for label, checks, metric, perf_key in HEADLINE:
        lines.append(f"  {label:<{width}}  {figure(results, checks, metric, perf.get(perf_key) if perf_key else None)}")
    soaked = [entry for entry in results.get("checks") or []  # the per-node soak checks (soak_trends is the cluster's)
              if str(entry.get("check")).startswith("soak_") and entry.get("node")]
    if soaked:
        lines += ["", "soak:"]
        lines += [f"  {entry['check']}: {entry.get('outcome')}: {first_line(entry)}" for entry in soaked]
        lines += [f"  trend: {name}" for name in (results.get("soak") or {}).get("trends") or []]
    return "\n".join(lines)


def first_line(entry: dict) -> str:
    lines = (entry.get("message") or "").strip().splitlines()
    return lines[0] if lines else ""


def figure(results: dict, checks: tuple, metric: str, recorded: Optional[float]) -> str:
    """'656.2 TFLOP/s | 778.7 | 84%' for a measured metric; else the check's outcome and message."""
    entries = [entry for entry in results.get("checks") or [] if entry.get("check") in checks]
    for entry in entries:
        for measured in entry.get("metrics") or []:
            value = measured.get("value")
            if measured.get("name") != metric or not isinstance(value, (int, float)):
                continue
            shown = f"{value:g} {measured.get('unit') or ''}".rstrip()
            if not recorded:
                return shown
            return f"{shown} | recorded {recorded:g} | {100 * value / recorded:.0f}%"
    if not entries:
        return f"not run (no {' or '.join(checks)} check in this run)"
    entry = entries[0]
    message = first_line(entry)
    return f"not measured: {entry.get('check')} {entry.get('outcome')}" + (f": {message}" if message else "")


def run(command: list[str], what: str, budget: Budget, env: Optional[dict] = None) -> str:
    """The command's output; it must end with status 0 within the budget's time for pytest."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env,
                                timeout=max(1.0, budget.left(budget.pytest_by)))
    except subprocess.TimeoutExpired:
        raise budget.ran_out(f"trying to {what}") from None
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise ProofError(f"cannot {what} ({' '.join(command[:3])} ...: exit {result.returncode}): {tail}")
    return result.stdout


if __name__ == "__main__":
    sys.exit(main())
