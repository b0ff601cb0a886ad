"""Build the device proof kit: one .tar.gz that proves handover on a GPU machine with no registry.

The target (tests/data/h200-1gpu: one H200, torch 2.11+cu130, no package index) lends torch and
its CUDA libraries; everything else the harness needs travels: the project's own wheel, built
from this checkout's files, and wheels of its dependencies for the target's Python and
platform, at the versions installed here (what the tests ran with), resolved from this
machine's package index; sdist-only ones (python-hostlist) are built into pure wheels here
first. Beside them prove.py, which installs them with pip --no-index and runs the suites, and
the recorded H200's perf.json that it prints the figures against.

    python kit/build.py [--python-version 3.12] [--glibc 2.28] [--out out/device-proof.tar.gz]
"""
from __future__ import annotations

import argparse
import email.parser
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
BUNDLE = "handover-device-proof"  # the directory the archive unpacks into
LIMIT_BYTES = 64 * 2**20
# Carried beside the project's own requirements: NVML for the GPU payloads, pip to install from.
EXTRA_REQUIREMENTS = ("nvidia-ml-py", "pip")
# The recorded H200 the figures are printed against, with where it came from.
REFERENCE_FILES = ("perf.json", "README.md", "PROVENANCE.md")
REFERENCE_DIR = REPO / "tests" / "data" / "h200-1gpu"


class BuildError(Exception):
    """A step of the build that failed; str() is one line."""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", default="3.12",
                        help="the target's Python, major.minor (default 3.12: the H200 machine's torch)")
    parser.add_argument("--glibc", default="2.28",
                        help="the oldest glibc the binary wheels may need, e.g. 2.28 (manylinux_2_28)")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "device-proof.tar.gz")
    args = parser.parse_args(argv)
    try:
        archive, contents = build(args.python_version, args.glibc, args.out)
    except BuildError as error:
        print(f"device-proof: {error}", file=sys.stderr)
        return 1
    size = archive.stat().st_size
    print(f"device-proof: {archive} ({size / 2**20:.1f} MiB of {LIMIT_BYTES / 2**20:.0f}), "
          f"Python {args.python_version}, {len(contents['wheels'])} wheels, commit {contents['commit']}")
    print(f"  on the GPU machine: tar xzf {archive.name} && python3 {BUNDLE}/prove.py --out DIR")
    return 0


def build(python_version: str, glibc: str, out: Path) -> tuple[Path, dict]:
    """The archive at `out` and what kit.json says of it; refused above LIMIT_BYTES."""
    with tempfile.TemporaryDirectory(prefix="device-proof-") as work:
        stage = Path(work) / BUNDLE
        wheels = stage / "wheels"
        wheels.mkdir(parents=True)
        project = project_wheel(Path(work) / "source", wheels)
        requirements = runtime_requirements(project) + list(EXTRA_REQUIREMENTS)
        versions = installed_versions()
        constraints = Path(work) / "constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in versions.items()))
        download(requirements, constraints, python_version, glibc, wheels, Path(work) / "native")
        names = sorted(path.name for path in wheels.glob("*.whl"))
        if any(name.startswith("torch-") for name in names):
            raise BuildError("a torch wheel was resolved: the target's CUDA torch must be the one used")
        contents = {
            "python": python_version,
            "platforms": platform_options(glibc)[1::2],
            "commit": commit(),
            # What prove.py installs: the project and NVML, with the dependencies they pull in.
            "install": [f"{project_name(project)}=={project_version(project)}", "nvidia-ml-py"],
            "pip_wheel": next(name for name in names if name.startswith("pip-")),
            "wheels": names,
        }
        (stage / "kit.json").write_text(json.dumps(contents, indent=1) + "\n", encoding="utf-8")
        shutil.copy2(REPO / "kit" / "prove.py", stage / "prove.py")
        (stage / "reference").mkdir()
        for name in REFERENCE_FILES:
            shutil.copy2(REFERENCE_DIR / name, stage / "reference" / name)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:gz") as archive:
            archive.add(stage, arcname=BUNDLE)
        size = partial.stat().st_size
        if size > LIMIT_BYTES:
            biggest = sorted(wheels.glob("*.whl"), key=lambda p: -p.stat().st_size)[:3]
            partial.unlink()
            raise BuildError(f"the kit is {size / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB; largest: "
                             + ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in biggest))
        partial.replace(out)
    return out, contents


def project_wheel(source: Path, wheels: Path) -> Path:
    """The project's wheel, built from a copy of this checkout's files (tracked and new, as they
    are now), so nothing left in build/ from an older tree can slip into it."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    pyproject = source / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)
    if version is None:
        raise BuildError("no version = \"...\" line in pyproject.toml")
    # The commit as the version's local label, so the run's harness.version names what ran there.
    label = re.sub(r"[^a-z0-9]+", ".", commit().lower()).strip(".")
    pyproject.write_text(text.replace(version.group(0), f'version = "{version.group(1)}+g{label}"', 1),
                         encoding="utf-8")
    pip(["wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source)])
    built = sorted(wheels.glob("handover-*.whl"))
    if len(built) != 1:
        raise BuildError(f"expected one handover wheel, got {[p.name for p in built]}")
    return built[0]


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))


def project_name(wheel: Path) -> str:
    return wheel_metadata(wheel)["Name"]


def project_version(wheel: Path) -> str:
    return wheel_metadata(wheel)["Version"]


def runtime_requirements(wheel: Path) -> list[str]:
    """Requires-Dist of the project's wheel, without the extras (the test tools stay here)."""
    return [requirement for requirement in wheel_metadata(wheel).get_all("Requires-Dist") or []
            if "extra ==" not in requirement]


def installed_versions() -> dict[str, str]:
    """Every distribution of the Python running this build (the project's venv) but the project."""
    versions = {}
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name and name.lower() != "handover" and "+" not in distribution.version:
            versions[name.lower()] = distribution.version
    return dict(sorted(versions.items()))


def download(requirements: list[str], constraints: Path, python_version: str, glibc: str,
             wheels: Path, native: Path) -> None:
    """Wheels of the requirements and everything they need, for the target, into `wheels`.

    pip resolves for another Python and platform among wheels only; a dependency that
    publishes none (an sdist only, like python-hostlist) is found by resolving for this machine
    first, and built here into a pure wheel (py3-none-any), which serves any target."""
    native.mkdir(parents=True)
    report = native / "resolution.json"
    pip(["install", "--dry-run", "--ignore-installed", "--report", str(report), "--constraint", str(constraints),
         *requirements])
    resolved = json.loads(report.read_text(encoding="utf-8"))["install"]
    sdists = [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in resolved
              if not item["download_info"]["url"].endswith(".whl")]
    pure = native / "pure"
    if sdists:
        pip(["wheel", "--no-deps", "--wheel-dir", str(pure), *sdists])
        binary = [wheel.name for wheel in pure.glob("*.whl") if not wheel.name.endswith("-none-any.whl")]
        if binary:
            raise BuildError(f"{', '.join(binary)}: built from an sdist for this machine only; the target "
                             f"(Python {python_version}, manylinux x86_64) needs a published wheel")
    pip(["download", "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
         *platform_options(glibc), "--find-links", str(pure), "--constraint", str(constraints),
         "--dest", str(wheels), *requirements])


def platform_options(glibc: str) -> list[str]:
    """--platform for every manylinux x86_64 tag a machine with that glibc accepts (pip matches
    tags exactly): the legacy names and manylinux_2_5 up to manylinux_2_<minor>."""
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or minor < 17:
        raise BuildError(f"--glibc {glibc}: give 2.17 or newer")
    tags = (["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
            + [f"manylinux_2_{n}_x86_64" for n in range(5, minor + 1)])
    return [option for tag in tags for option in ("--platform", tag)]


def commit() -> str:
    described = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                               capture_output=True, text=True)
    return described.stdout.strip() or "unknown"


def pip(arguments: list[str]) -> None:
    """pip of the Python running the build, with this machine's pip configuration (its index)."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *arguments]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
        raise BuildError(f"pip {arguments[0]} failed (exit {result.returncode}): "
                         + ("; ".join(errors) or (result.stderr.strip().splitlines() or ["no output"])[-1]))


if __name__ == "__main__":
    sys.exit(main())
