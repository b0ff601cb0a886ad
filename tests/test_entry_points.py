"""`pytest --inventory FILE` as operators type it: inventories and --out kept outside the checkout,
either option form, from the checkout and from any other directory; the plugin inert without it."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from handover import plugin

pytest_plugins = ["pytester"]  # pytester.parseconfig: the command line as pytest itself reads it

ROOT = Path(__file__).resolve().parent.parent
LOCAL_INVENTORY = ROOT / "inventory" / "local.yaml"
FORMS = {"space": lambda option, value: [option, str(value)],
         "equals": lambda option, value: [f"{option}={value}"]}


def options(form: str, **values) -> list[str]:
    """--inventory X --out Y ... in the form asked for."""
    words = []
    for name, value in values.items():
        words += FORMS[form](f"--{name.replace('_', '-')}", value)
    return words


def pytest_in(cwd: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def operator_tree(tmp_path) -> dict[str, Path]:
    """Where an operator keeps things: /etc/handover-like config, an existing output folder."""
    config = tmp_path / "etc" / "handover"
    config.mkdir(parents=True)
    inventory = config / "prod.yaml"
    inventory.write_text(LOCAL_INVENTORY.read_text())
    out = tmp_path / "srv" / "acceptance"
    out.mkdir(parents=True)
    elsewhere = tmp_path / "home" / "operator"
    elsewhere.mkdir(parents=True)
    return {"inventory": inventory, "out": out, "elsewhere": elsewhere, "top": tmp_path}


def results_of(out: Path) -> dict:
    return json.loads((out / "local" / "latest" / "results.json").read_text())


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
@pytest.mark.parametrize("form", FORMS)
def test_the_readme_command_with_paths_outside_the_checkout(operator_tree, sign_key, form, where):
    cwd = ROOT if where == "checkout" else operator_tree["elsewhere"]
    done = pytest_in(cwd, *options(form, inventory=operator_tree["inventory"], out=operator_tree["out"],
                                   sign_key=sign_key), "-m", "system", "-k", "memory or reachable", "-v")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: INCOMPLETE" in done.stdout  # the profile's other mandatory checks did not run
    # Each test's line names its suite's file as it is from here (the inventory's folder, where
    # pytest would root the run, has none), so the line can be copied to test the node again.
    [line] = [line for line in done.stdout.splitlines() if "::test_memory[localhost] PASSED" in line]
    assert (cwd / line.split("::")[0]).resolve() == ROOT / "suites" / "test_system.py", line
    results = results_of(operator_tree["out"])
    # The same ids whichever directory pytest ran from: --resume and JUnit depend on it.
    assert sorted(c["test_id"] for c in results["checks"]) == [
        "suites/test_system.py::test_memory[localhost]", "suites/test_system.py::test_reachable[localhost]"]
    assert results["run"]["inventory"]["path"] == str(operator_tree["inventory"])
    assert not list(operator_tree["top"].rglob(".pytest_cache")), "an acceptance run keeps no cache"


def test_resume_from_another_directory_finds_the_same_checks(operator_tree, sign_key):
    first = pytest_in(ROOT, *options("space", inventory=operator_tree["inventory"], out=operator_tree["out"],
                                     sign_key=sign_key), "-k", "test_memory or test_os")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = (operator_tree["out"] / "local" / "latest").resolve()
    again = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], resume=run_dir, sign_key=sign_key),
        "-k", "test_memory or test_os or (test_kernel and not log)")
    assert again.returncode == 0, again.stdout + again.stderr
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert [e["already_done"] for e in ledger if e["type"] == "resume"] == [2]
    checks = results_of(operator_tree["out"])["checks"]
    assert sorted(c["check"] for c in checks) == ["kernel", "memory", "os"]


def test_without_a_test_path_it_runs_the_installed_suites(operator_tree, sign_key):
    done = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key),
        "--collect-only", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    areas = {line.split("::")[0] for line in collected}  # ids from the suites' folder, pytest's rootdir here
    assert {"suites/test_system.py", "suites/test_hardware.py", "suites/test_network.py", "suites/test_storage.py",
            "suites/test_hpc.py", "suites/test_training.py"} <= areas
    assert not any("tests/" in line for line in collected)
    assert "suites/test_soak.py" not in areas  # the soak runs only when asked for
    soak = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key),
        "--collect-only", "-q", "--soak-duration", "1h")
    assert {line.split("::")[0] for line in soak.stdout.splitlines() if "::" in line} == areas | {"suites/test_soak.py"}


def test_markers_mean_the_same_from_any_directory(operator_tree, sign_key):
    strict = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key),
        "--strict-markers", "-m", "quick and system and not cluster", "--collect-only", "-q")
    assert strict.returncode == 0, strict.stdout + strict.stderr
    listed = [line for line in strict.stdout.splitlines() if "::" in line]
    assert listed and all(line.startswith(("suites/test_system.py", "suites/test_gpu_config.py")) for line in listed)
    described = pytest_in(operator_tree["elsewhere"], "--markers")
    for marker in ("system", "hardware", "network", "storage", "hpc", "training", "quick", "full", "cluster"):
        assert f"@pytest.mark.{marker}:" in described.stdout


def test_without_an_inventory_the_plugin_is_inert(tmp_path):
    """Another project's tests, with fixtures named like ours, run as if handover were absent;
    our markers are known, so --strict-markers accepts them."""
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def cluster():\n"
        "    return 'theirs'\n\n"
        "@pytest.mark.network\n"
        "def test_their_cluster(cluster):\n"
        "    assert cluster == 'theirs'\n")
    done = pytest_in(tmp_path, "--strict-markers", "-q", "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert not (tmp_path / "out").exists()


def test_pytests_help_markers_and_fixtures_in_the_checkout_need_no_inventory():
    """What a newcomer types first in the checkout: the suites' conftest asks for --inventory
    only where something is collected."""
    helped = pytest_in(ROOT, "--help", "-p", "no:cacheprovider")
    assert helped.returncode == 0 and "--inventory=FILE" in helped.stdout, helped.stdout + helped.stderr
    markers = pytest_in(ROOT, "--markers", "-p", "no:cacheprovider")
    assert markers.returncode == 0 and "@pytest.mark.soak:" in markers.stdout, markers.stdout + markers.stderr
    fixtures = pytest_in(ROOT, "--fixtures", "-p", "no:cacheprovider")
    assert fixtures.returncode == 0 and "cluster_run [session scope]" in fixtures.stdout, fixtures.stdout
    assert "ERROR" not in fixtures.stdout + fixtures.stderr
    collecting = pytest_in(ROOT, "-p", "no:cacheprovider")
    assert collecting.returncode != 0 and "need --inventory FILE" in collecting.stdout + collecting.stderr


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("option, value, message", [
    ("nodes", "nosuch[1-2]", "--nodes: nosuch1, nosuch2 match no node of"),
    ("nodes", "gpu[01-", "--nodes 'gpu[01-'"),
    ("nodes", "", "--nodes '' names no node; leave the option out to test every node"),
    ("resume", "/nonexistent/run", "--resume: /nonexistent/run/ledger.jsonl: no ledger here"),
    ("numprocesses", "2", "-n/--numprocesses 2: an acceptance run already runs every node's checks at once"),
])
def test_bad_options_are_one_line_in_either_form(operator_tree, sign_key, form, option, value, message):
    done = pytest_in(operator_tree["elsewhere"], *options(
        form, inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key,
        **{option: value}))
    assert done.returncode == 4, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("given, said", [
    (["--lf"], "--lf/--last-failed: an acceptance run keeps no pytest cache; its run directory is its record; "
               "--retest RUN_DIR runs again"),
    (["--ff"], "--ff/--failed-first: an acceptance run keeps no pytest cache"),
    (["--sw"], "--sw/--stepwise: an acceptance run keeps no pytest cache; -x stops at the first failure, "
               "--resume RUN_DIR goes on from there"),
    (["--cache-show"], "--cache-show: an acceptance run keeps no pytest cache"),
    (["--setup-only"], "--setup-only: the suites' fixtures are the checks' steps"),
    (["--setup-plan"], "--setup-plan: it would start a run that runs none of its checks; --collect-only lists"),
    (["--dist", "load"], "--dist: pytest-xdist's workers would be runs that refuse each other's nodes"),
    (["--tx", "popen"], "--tx: pytest-xdist's workers would be runs that refuse each other's nodes"),
    (["-f"], "-f/--looponfail: each loop would be a run of its own"),
], ids=lambda value: value[0] if isinstance(value, list) else "")
def test_pytest_options_a_run_cannot_honour_are_one_line_not_ignored(operator_tree, sign_key, given, said):
    """The cache's options parsed and were dropped once the run turned the cache off (--lf ran
    every check again); --setup-plan and --setup-only made a signed run that ran nothing and
    locked the nodes; xdist without -n, or its loop, started runs that refused each other."""
    done = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key), *given)
    assert done.returncode == 4, done.stdout + done.stderr
    assert said in done.stderr and "Traceback" not in done.stdout + done.stderr
    assert list(operator_tree["out"].iterdir()) == []


@pytest.mark.parametrize("asked", ["--help", "--markers"])
def test_pytests_help_needs_no_good_inventory(tmp_path, asked):
    done = pytest_in(tmp_path, "--inventory", str(tmp_path / "nosuch.yaml"), asked, "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("--inventory=FILE" if asked == "--help" else "@pytest.mark.soak:") in done.stdout


def test_an_ini_file_beside_the_inventory_is_not_taken_for_this_runs(operator_tree, sign_key):
    """pytest looks for its ini file from the paths on the command line, the inventory's and
    --out's too: the operator's own pytest.ini above one (for their own tests) set this run's
    python_files and addopts. It is said, unless pytest runs in that tree or -c names it;
    --inventory=FILE does not make it a path."""
    ini = operator_tree["top"] / "etc" / "pytest.ini"
    ini.write_text("[pytest]\naddopts = -x\npython_files = check_*.py\n")
    values = {"inventory": operator_tree["inventory"], "out": operator_tree["out"], "sign_key": sign_key}
    refused = pytest_in(operator_tree["elsewhere"], *options("space", **values), "--collect-only", "-q")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert (f"pytest read its configuration from {ini}, found from a path on the command line (the "
            "inventory's, --out's) rather than where you run it") in refused.stderr
    assert "write those options with = (--inventory=FILE, --out=DIR)" in refused.stderr
    taken = pytest_in(operator_tree["elsewhere"], *options("equals", **values), "--collect-only", "-q", "-m", "system")
    assert taken.returncode == 0 and "tests collected" in taken.stdout, taken.stdout + taken.stderr
    theirs = pytest_in(ini.parent, *options("space", **values), "--collect-only", "-q")
    assert theirs.returncode == 5 and "no tests collected" in theirs.stdout, theirs.stdout + theirs.stderr
    named = pytest_in(operator_tree["elsewhere"], *options("space", **values), "-c", str(ini), "--collect-only", "-q")
    assert named.returncode == 5 and "no tests collected" in named.stdout, named.stdout + named.stderr
    out_there = {**values, "inventory": operator_tree["top"] / "prod.yaml", "out": ini.parent / "runs"}
    out_there["inventory"].write_text(operator_tree["inventory"].read_text())
    out_there["out"].mkdir()
    by_out = pytest_in(operator_tree["elsewhere"], *options("space", **out_there), "--collect-only", "-q")
    assert by_out.returncode == 4 and f"pytest read its configuration from {ini}" in by_out.stderr, by_out.stderr


def test_a_test_path_as_the_readme_writes_it_names_the_suites_from_anywhere(operator_tree, sign_key):
    done = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key),
        "suites/test_system.py::test_os", "--collect-only", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_os[localhost]" in done.stdout and "1 test collected" in done.stdout


@pytest.mark.parametrize("below", [False, True], ids=["the-file", "below-it"])
def test_an_out_that_is_a_file_is_one_line(operator_tree, sign_key, below):
    out = operator_tree["inventory"] / "runs" if below else operator_tree["inventory"]
    done = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=out, sign_key=sign_key), "-m", "system")
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"--out {out}: {operator_tree['inventory']} is not a directory" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr and len(done.stderr.splitlines()) <= 2


@pytest.mark.parametrize("selection", [["-k", "nosuchcheck"], ["--collect-only"], ["--fixtures"],
                                       ["--fixtures-per-test"]],
                         ids=["nothing-selected", "collect-only", "fixtures", "fixtures-per-test"])
def test_nothing_to_run_leaves_no_run_behind(operator_tree, sign_key, selection):
    done = pytest_in(operator_tree["elsewhere"], *options(
        "space", inventory=operator_tree["inventory"], out=operator_tree["out"], sign_key=sign_key), *selection)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: pytest's "no tests ran"
    assert list(operator_tree["out"].iterdir()) == []
    assert "verdict:" not in done.stdout


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_a_misspelt_marker_is_a_usage_error_not_an_empty_run(operator_tree, sign_key, where):
    cwd = ROOT if where == "checkout" else operator_tree["elsewhere"]
    done = pytest_in(cwd, *options("space", inventory=operator_tree["inventory"], out=operator_tree["out"],
                                   sign_key=sign_key), "-m", "quik and system")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "quik" in done.stderr and "Traceback" not in done.stdout + done.stderr
    assert list(operator_tree["out"].iterdir()) == []


def test_a_big_cluster_raises_the_open_file_limit_or_names_it(tmp_path, sign_key):
    """1,024 SSH nodes keep 1,024 connections open: the soft limit on open files (often 1,024)
    is raised toward the hard one; a hard limit too low is one line before anything starts."""
    inventory = tmp_path / "big.yaml"
    inventory.write_text("cluster: big\nprofile: cpu-only\nssh: {host_keys: accept-new}\nnodes: ['gpu[0001-1024]']\n")

    def limited(soft: int, hard: int) -> Callable[[], None]:
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    low = subprocess.run([sys.executable, "-m", "pytest", "--inventory", str(inventory), "--sign-key", str(sign_key),
                          "--collect-only", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         preexec_fn=limited(1024, 1024))
    assert low.returncode == 4 and "Traceback" not in low.stdout + low.stderr, low.stdout + low.stderr
    assert ("1024 nodes need about 3328 open files, but the hard limit (ulimit -Hn) is 1024: raise it, "
            "or test part of the nodes at a time with --nodes") in low.stderr
    raised = subprocess.run([sys.executable, "-c", "import resource; from handover.session import raise_open_files; "
                             "raise_open_files(1024); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
                            capture_output=True, text=True, timeout=60, preexec_fn=limited(1024, 8192))
    assert raised.stdout.strip() == "3328", raised.stderr


@pytest.mark.parametrize("args, addopts, ini, asked", [
    ((), "", "", False),
    (("-rs",), "", "", True),
    (("-vrs",), "", "", True),
    (("-r", "fE"), "", "", True),  # the default's value, asked for: only the option tells
    (("--report-chars=fE",), "", "", True),
    (("-pno:cacheprovider", "-Werror", "-kerror or rail"), "", "", False),  # an r, but not -r
    ((), "-rf", "", True),
    ((), "", "-ra", True),
    ((), "-q -x", "--strict-markers", False),
])
def test_only_a_report_chars_option_asks_for_the_short_summarys_failed_lines(pytester, monkeypatch, args, addopts,
                                                                               ini, asked):
    """Past FAILURES_SECTION_MAX failed checks the FAILED lines are left out unless -r asked for
    them, on the command line, in PYTEST_ADDOPTS or in the ini file's addopts."""
    monkeypatch.setenv("PYTEST_ADDOPTS", addopts)
    if ini:
        pytester.makeini(f"[pytest]\naddopts = {ini}\n")
    assert plugin._asked_for_report_chars(pytester.parseconfig(*args)) is asked
