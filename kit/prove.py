#!/usr/bin/env python3
"""Prove handover on this GPU machine, from the unpacked device proof kit, with no registry.

Run it with the Python that has the machine's CUDA torch (python3 prove.py --out DIR): it makes
a venv from the wheels the kit carries only (pip --no-index), seeing that interpreter's packages
for torch and its CUDA libraries; writes a one-node inventory for this machine under the profile
of the GPU nvidia-smi names (an H100 is judged as an H100, an H200 as an H200; --profile chooses
another), with the expectations one GPU cannot meet overridden, each with its reason; runs the
acceptance suites with the signed run directory under DIR; and prints the verdict and the
headline figures beside those recorded on an H200 (perf.json).

Standard library only: it runs before the venv exists.
"""
from __future__ import annotations

import argparse
import json
import os
import site
import subprocess
import sys
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


class ProofError(Exception):
    """A step of the proof that cannot go on; str() is one line."""


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
                             "the GPU burn on every GPU, stress-ng on the CPUs, telemetry throughout; its trends "
                             "go into the report")
    parser.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return prove(args.out.resolve(), args.depth, args.no_gpu, args.profile,
                     selection(args.depth, args.soak) + args.pytest_args)
    except ProofError as error:
        print(f"prove.py: {error}", file=sys.stderr)
        return 2


def selection(depth: str, soak: Optional[str]) -> list[str]:
    """pytest's options for a depth, with the soak beside it when one is asked for (a soak alone
    would leave the mandatory checks without results: INCOMPLETE). A proof's soak lasts minutes:
    GPU burn rounds of a minute (not the 5 of a delivery's) give its trend and drift their points;
    a --soak-mix after -- overrides it."""
    marker = DEPTHS[depth]
    if soak is None:
        return ["-m", marker] if marker else []
    return (["-m", f"{marker} or soak"] if marker else []) + ["--soak-duration", soak,
                                                              "--soak-mix", PROOF_SOAK_MIX]


def prove(out: Path, depth: str, no_gpu: bool, asked: Optional[str], pytest_args: list[str]) -> int:
    kit = json.loads((KIT / "kit.json").read_text(encoding="utf-8"))
    check_python(kit["python"])
    profile, why = choose_profile(asked, gpu_names())
    print(f"prove.py: profile {profile} ({why})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    venv = out / "venv"
    python = make_venv(venv, kit)
    say_torch(python)
    overrides = ONE_GPU + NO_GPU if no_gpu else ONE_GPU
    inventory = out / f"{CLUSTER}.yaml"
    inventory.write_text(inventory_text(python, out / "scratch", profile, overrides, kit), encoding="utf-8")
    (out / "scratch").mkdir(exist_ok=True)
    print(f"prove.py: inventory {inventory}; running the {depth} suites", flush=True)
    # The payloads find the venv's python first; of pytest's plugins only handover's is loaded, not
    # those the machine's own environment holds (xdist, cov, timeout ...), written for its pytest.
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [str(python), "-m", "pytest", "-p", "handover.plugin", "--inventory", str(inventory),
               "--out", str(out), "-p", "no:cacheprovider", *pytest_args]
    status = subprocess.run(command, cwd=out, env=env).returncode
    results = out / CLUSTER / "latest" / "results.json"
    if not results.is_file():
        print(f"prove.py: no {results} (pytest exit status {status})", file=sys.stderr)
        return status or 2
    perf = json.loads((KIT / "reference" / "perf.json").read_text(encoding="utf-8"))
    print(summary(json.loads(results.read_text(encoding="utf-8")), perf, results.parent.resolve()))
    return status


def gpu_names() -> list[str]:
    """The GPUs' names as nvidia-smi gives them ('NVIDIA H100 80GB HBM3'); none without it."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60)
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


def make_venv(venv: Path, kit: dict) -> Path:
    """A fresh venv holding the carried wheels at the versions the kit was tested with (installed
    over whatever this interpreter has), and seeing this interpreter's packages for torch."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", "--clear", str(venv)],
        "make the venv")
    python = venv / "bin" / "python"
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       "ask the venv where its packages go").strip())
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
        "install the carried wheels", env)
    print(f"prove.py: venv {venv} with {', '.join(kit['install'])} from {wheels} (no index)", flush=True)
    return python


def say_torch(python: Path) -> None:
    """Which torch the payloads will find, and the GPUs it sees: the machine's, not the kit's."""
    probe = ("import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), "
             "torch.cuda.get_device_name(0) if torch.cuda.device_count() else '-')")
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
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


def run(command: list[str], what: str, env: Optional[dict] = None) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise ProofError(f"cannot {what} ({' '.join(command[:3])} ...: exit {result.returncode}): {tail}")
    return result.stdout


if __name__ == "__main__":
    sys.exit(main())
