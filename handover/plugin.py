"""The handover pytest plugin, installed with the package (a pytest11 entry point).

    pytest --inventory CLUSTER.yaml [--out DIR] [--nodes PATTERN] [--resume RUN_DIR | --retest RUN_DIR]
                  [--sign-key KEY] [--busy-nodes refuse|wait|ignore]

Being installed rather than in a conftest.py, its options are known before pytest reads the
command line, so `--inventory /etc/handover/prod.yaml` works from any directory and in either
form (`--opt value`, `--opt=value`); without a test path it runs the installed suites. Without
--inventory it only registers its markers: the harness's own tests run untouched.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import stat
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Iterator, Optional, TextIO, cast

import pytest

from handover.failures import NodeBusy
from handover.recorder import SUITES_DIR, Recorder, node_of, params_of, test_id
from handover.session import BUSY_NODES, AcceptanceSession, SessionError
from inventory.loader import InventoryError, load_inventory
from reports.hostlists import counted
from reports.ledger import LedgerError, read_ledger
from reports.verdict import FLEET_NODES, REASONS_SHOWN, alike, terminal_summary
from runners import soak
from runners.fanout import Progress
from runners.soak import SOAK_FILE

PROGRESS_EVERY_S = 15  # without a terminal (CI logs), one progress line this often
STOPPED = "handover: the run stopped: a run file could not be written (see above)"
# Past this many failed checks pytest's listings of each are left out unless asked for: the
# FAILURES section (--tb), which pytest builds in time that grows with the square of the failures
# (pytest-dev/pytest#13360: 1,024 unreachable nodes' 14,336 failed checks spent minutes there),
# and the short summary's FAILED lines (-r), which would push the verdict 14,336 lines up. The
# verdict names them alike, the report and junit.xml each one.
FAILURES_SECTION_MAX = 200

MARKERS = {
    "system": "system configuration (OS, kernel, CPU, memory, drivers)",
    "hardware": "GPUs, HBM, CPUs, memory, NICs",
    "network": "InfiniBand and Ethernet",
    "storage": "local NVMe and shared filesystems",
    "hpc": "HPL and HPC kernels",
    "training": "collectives and distributed training",
    "quick": "short checks, minutes for a cluster",
    "full": "long checks, for the final acceptance run",
    "cluster": "runs once for the whole cluster rather than per node",
    "soak": "burn-in of hours on every node at once (--soak-duration); in neither quick nor full",
}

SESSION = pytest.StashKey[AcceptanceSession]()
PARSER = pytest.StashKey[pytest.Parser]()  # pytest's own, to tell an asked-for option from its default


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("handover", "handover acceptance runs")
    group.addoption("--inventory", metavar="FILE",
                    help="cluster inventory YAML (e.g. inventory/local.yaml); required for the suites")
    group.addoption("--out", metavar="DIR",
                    help="base directory for run directories (default: out/; for --retest, where "
                         "the re-tested run is)")
    group.addoption("--nodes", metavar="PATTERN",
                    help="only these nodes: comma-separated hostlist expressions or globs "
                         "(gpu[001-004],gpu01*)")
    group.addoption("--resume", metavar="RUN_DIR",
                    help="continue an interrupted run: run only the checks it has no result for, "
                         "appending to its ledger (e.g. out/<cluster>/latest)")
    group.addoption("--retest", metavar="RUN_DIR",
                    help="after repairs, run again only the checks RUN_DIR failed or has no result "
                         "for, on the nodes they concern: a new run, an addendum to RUN_DIR's report")
    group.addoption("--busy-nodes", choices=BUSY_NODES, default="refuse",
                    help="a node another acceptance run holds: refuse (its checks fail as busy; "
                         "the default), wait (up to five minutes, then refuse), or ignore (go on, "
                         "noted in the ledger)")
    group.addoption("--sign-key", metavar="KEY",
                    help="Ed25519 OpenSSH private key that signs the report "
                         "(default: a per-machine key, created on first use)")
    add_soak_options(group)


# --- soak (suites/test_soak.py, runners/soak.py) ------------------------------------------------


def add_soak_options(group) -> None:
    group.addoption("--soak-duration", metavar="DURATION",
                    help="with -m soak: run the soak this long on every node at once (30m, 24h, 2d; "
                         "at least two load rounds, 2m by default); "
                         "the same command again re-attaches to a soak still running")
    group.addoption("--soak-mix", metavar="KEY=VALUE,...",
                    help="the soak's load mix: cpu, cpu_workers (0: every CPU), cpu_load (%%), vm_workers, "
                         "vm_bytes, net_rate (iperf3 -b), ib, gpu, io, io_size, io_rate, round_s, gpu_round_s, "
                         "interval_s")
    group.addoption("--soak-attach", metavar="RUN_DIR",
                    help="re-attach to the soak RUN_DIR started: collect what the nodes recorded, follow it "
                         "to the end and judge it")
    group.addoption("--soak-stop", metavar="RUN_DIR",
                    help="end the soak RUN_DIR started on every node now, collect its samples, leave nothing "
                         "running, and exit")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> Optional[int]:
    """--soak-stop ends a soak and pytest with it; a soak to attach to becomes the run resumed.
    An acceptance run's output streams go quiet once their reader is gone (OutputGuard), set
    before pytest's terminal reporter takes sys.stdout (pytest_configure)."""
    option = config.option
    if option.inventory:
        sys.stdout, sys.stderr = OutputGuard.around(sys.stdout), OutputGuard.around(sys.stderr)
    if option.inventory and not option.help:
        refused = refused_option(option)
        if refused:
            raise pytest.UsageError(refused)
    try:
        mix = soak.parse_mix(option.soak_mix)
        if option.soak_duration:
            short = soak.too_short(soak.parse_duration(option.soak_duration), mix)
            if short:
                raise soak.SoakError(short)
        if option.soak_stop:
            return stop_soak(Path(option.soak_stop), option.inventory)
    except soak.SoakError as error:
        raise pytest.UsageError(str(error)) from None
    if option.resume or not option.inventory or not (option.soak_attach or option.soak_duration):
        return None
    if option.soak_attach:
        try:
            soak.SoakPlan.load(Path(option.soak_attach))
        except soak.SoakError as error:
            raise pytest.UsageError(f"--soak-attach: {error}") from None
    attach = Path(option.soak_attach) if option.soak_attach else running_soak(option.inventory, option.out)
    if attach is not None:
        print(f"handover: attaching to the soak in {attach}", flush=True)
        option.resume = str(attach)
    return None


# pytest's options that an acceptance run cannot honour: (option's dest, as typed, why, what instead).
# The cache's and stepwise's options still parse once the run has turned the cache off, and
# would be dropped in silence; the others would each start runs, or run the checks' steps.
NO_CACHE = "an acceptance run keeps no pytest cache"
NO_CACHE_RECORD = f"{NO_CACHE}; its run directory is its record"
WORKERS = "pytest-xdist's workers would be runs that refuse each other's nodes"
RETEST = "--retest RUN_DIR runs again what RUN_DIR failed or has no result for"
RESUME = "--resume RUN_DIR goes on where a run stopped"
COLLECT = "--collect-only lists the checks without touching a node"
REFUSED_OPTIONS = (
    ("numprocesses", "-n/--numprocesses", f"an acceptance run already runs every node's checks at once; {WORKERS}",
     "run without -n"),
    ("tx", "--tx", WORKERS, "run without it"),
    ("dist", "--dist", WORKERS, "run without it"),
    ("looponfail", "-f/--looponfail", "each loop would be a run of its own, on nodes the last one holds",
     "--retest RUN_DIR runs again what a run failed, once it is repaired"),
    ("lf", "--lf/--last-failed", NO_CACHE_RECORD, RETEST),
    ("failedfirst", "--ff/--failed-first", NO_CACHE_RECORD, RETEST),
    ("newfirst", "--nf/--new-first", NO_CACHE, "run without it"),
    ("stepwise", "--sw/--stepwise", NO_CACHE, "-x stops at the first failure, --resume RUN_DIR goes on from there"),
    ("stepwise_skip", "--sw-skip/--stepwise-skip", NO_CACHE, RESUME),
    ("stepwise_reset", "--sw-reset/--stepwise-reset", NO_CACHE, RESUME),
    ("cacheshow", "--cache-show", NO_CACHE_RECORD, "handover report RUN_DIR shows a run"),
    ("setuponly", "--setup-only", "the suites' fixtures are the checks' steps: they would run the tools on "
     "the nodes", COLLECT),
    ("setupplan", "--setup-plan", "it would start a run that runs none of its checks", COLLECT),
)


def refused_option(option: argparse.Namespace) -> Optional[str]:
    """The usage error for the first of REFUSED_OPTIONS given with --inventory, if any."""
    for dest, typed, why, instead in REFUSED_OPTIONS:
        value = getattr(option, dest, None)
        if value and value != "no":  # --dist's default is "no"
            shown = f"{typed} {value}" if dest == "numprocesses" else typed
            return f"{shown}: {why}; {instead}"
    return None


def running_soak(inventory: str, out: Optional[str]) -> Optional[Path]:
    """The run directory of a soak of this inventory still running (or never collected)."""
    try:
        cluster = load_inventory(inventory)
    except InventoryError:
        return None  # the session says what is wrong with it
    return soak.unfinished_soak(Path(out or "out"), cluster.name, cluster.digest)


def stop_soak(run_dir: Path, inventory: Optional[str]) -> int:
    """End the soak of run_dir on every node; 0 when every node was reached, else 1."""
    try:
        plan = soak.SoakPlan.load(run_dir)
    except soak.SoakError as error:
        raise soak.SoakError(f"--soak-stop: {error}") from None
    try:
        inventory = inventory or str(read_ledger(run_dir).header.get("inventory", {}).get("path"))
        cluster = load_inventory(inventory)
    except (InventoryError, LedgerError) as error:
        raise soak.SoakError(f"--soak-stop {run_dir}: {error}") from None
    try:
        specs = {name: cluster.node(name) for name in plan.nodes}
    except KeyError as missing:
        raise soak.SoakError(f"--soak-stop: {inventory} does not list {missing}, which {run_dir} soaks") from None
    run = soak.SoakRun(plan, run_dir, specs, launch=cluster.launch)
    try:
        outcome = run.stop()
    finally:
        run.close()
    for line in stop_lines(plan.soak_id, outcome):
        print(line)
    return 1 if any(what.startswith("not reached") for what in outcome.values()) else 0


def leave_out_failure_listings(config: pytest.Config) -> list[tuple[str, str]]:
    """Turn off pytest's listings of each failed check that the command line did not ask for
    (FAILURES_SECTION_MAX says why); (what was left out, the option that asks for it) for each."""
    left = []
    if config.option.tbstyle == "auto":
        config.option.tbstyle = "no"  # read by the terminal summary, which comes next
        left.append(("FAILURES section", "--tb=short"))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and "f" in reporter.reportchars and not _asked_for_report_chars(config):
        reporter.reportchars = reporter.reportchars.replace("f", "")
        left.append(("short summary's FAILED lines", "-rf"))
    return left


def _asked_for_report_chars(config: pytest.Config) -> bool:
    """Whether -r/--report-chars was given: on the command line, in PYTEST_ADDOPTS or in addopts
    (its value alone cannot tell the default from an explicit -rfE). pytest's own parser reads
    them, into a namespace whose reportchars is already set, where argparse leaves it unless the
    option is there: `-vrs` asks, `-pno:cacheprovider` and `-Werror` do not."""
    words = [*config.getini("addopts"), *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
             *config.invocation_params.args]
    unasked = object()
    parsed = config.stash[PARSER].parse_known_args(words, namespace=argparse.Namespace(reportchars=unasked))
    return parsed.reportchars is not unasked


def lock_lines(notes: dict[str, str], fleet: bool) -> list[str]:
    """A line per node not locked, the first REASONS_SHOWN and a count of the rest; in a fleet,
    nodes not locked alike but for their own words share one: 'd[0000-1023] (1,024 nodes): d0000
    not locked: d0000 unreachable: ...'."""
    said = alike(notes.items()) if fleet else [([node], note) for node, note in notes.items()]
    lines = [note if len(nodes) == 1 else f"{counted(nodes)}: {note}" for nodes, note in said[:REASONS_SHOWN]]
    if len(said) > REASONS_SHOWN:
        rest = sum(len(nodes) for nodes, _ in said[REASONS_SHOWN:])
        lines.append(f"... and {rest:,} more nodes not locked (the ledger's locks entry names each)")
    return lines


def stop_lines(soak_id: str, outcome: dict[str, str]) -> list[str]:
    """A line per outcome, naming its nodes by hostlist: 1,024 nodes stopped alike are one line."""
    by_outcome: dict[str, list[str]] = {}
    for node, what in outcome.items():
        by_outcome.setdefault(what, []).append(node)
    return [f"handover: soak {soak_id} on {counted(nodes)}: {what}" for what, nodes in by_outcome.items()]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak runs only when asked for (--soak-duration or --soak-attach), never within a run
    that only selects by area or depth."""
    if not config.getoption("--inventory"):
        return
    resumed = config.getoption("--resume")
    if config.getoption("--soak-duration") or config.getoption("--soak-attach") or \
            (resumed and (Path(resumed) / SOAK_FILE).exists()):
        return
    # 75,000 items at 1,024 nodes: each one's own markers, then its module's (or class's) once.
    parents: dict[object, bool] = {}

    def marked(item: pytest.Item) -> bool:
        if any(mark.name == "soak" for mark in item.own_markers):
            return True
        if item.parent not in parents:
            parents[item.parent] = item.parent is not None and item.parent.get_closest_marker("soak") is not None
        return parents[item.parent]

    kept: list[pytest.Item] = []
    soaking: list[pytest.Item] = []
    for item in items:
        (soaking if marked(item) else kept).append(item)
    if soaking:
        config.hook.pytest_deselected(items=soaking)
        items[:] = kept


# --- end of soak ---------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser) -> None:
    """An acceptance run keeps no pytest cache: the run directory is its record, and the
    rootdir pytest picks for an inventory kept elsewhere may be the operator's config tree.
    For the same reason its rootdir is the suites' (acceptance_root), unless --rootdir says.
    pytest's parser is kept for reading the command line again (_asked_for_report_chars)."""
    early_config.stash[PARSER] = parser
    namespace = early_config.known_args_namespace
    if namespace.inventory:
        early_config.pluginmanager.consider_pluginarg("no:cacheprovider")
        if not namespace.rootdir:
            early_config._rootpath = acceptance_root(namespace.file_or_dir, early_config.invocation_params.dir)


def acceptance_root(args: list[str], here: Path) -> Path:
    """The folder that holds the suites, or the one above it and every test path given.

    pytest picks its rootdir from the paths on its command line (an inventory's, written with a
    space, is one) or the directory it runs in, names each test by its path from there, and the
    terminal names each test's file through it. For suites outside that rootdir the names come
    out wrong: `FAILED ../../etc/handover/test_system.py::test_os[gpu017]`, a file that does not
    exist, in the very line an operator copies to test that node again."""
    paths = [SUITES_DIR.parent]
    for arg in args:
        path = here / suites_path(arg, here).partition("::")[0]
        if path.exists():
            paths.append(path.resolve())
    return Path(os.path.commonpath(paths))


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    inventory = config.getoption("--inventory")
    if not inventory or config.option.help or config.option.markers:  # pytest's help needs no session
        return
    foreign = foreign_configuration(config)
    if foreign:
        raise pytest.UsageError(foreign)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(SUITES_DIR)]
    else:
        config.args = [suites_path(arg, config.invocation_params.dir) for arg in config.args]
    progress = ProgressDisplay(config)
    try:
        session = AcceptanceSession.open(
            inventory=inventory, out=config.getoption("--out"), nodes=config.getoption("--nodes"),
            resume=config.getoption("--resume"), sign_key=config.getoption("--sign-key"),
            on_progress=progress.show, busy_nodes=config.getoption("--busy-nodes"),
            retest=config.getoption("--retest"), soak=bool(config.getoption("--soak-duration")))
    except SessionError as error:
        raise pytest.UsageError(str(error)) from None
    config.stash[SESSION] = session
    config.pluginmanager.register(Recorder(session.append, session.cluster.waivers, session.cluster_run), Recorder.name)
    interruption = Interruption()
    config.pluginmanager.register(SessionHooks(session, interruption), "handover-session")
    config.pluginmanager.register(interruption, Interruption.name)
    interruption.handle((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def foreign_configuration(config: pytest.Config) -> Optional[str]:
    """pytest looks for its configuration file from the paths on its command line, and the values
    of --inventory, --out or --sign-key written with a space are such paths: an ini file of the
    operator's tree that holds one of them (their own tests' pytest.ini) would set this run's
    addopts, python_files or testpaths, though pytest does not run there. Said, unless pytest runs
    in that tree, -c named the file, or it is a handover checkout's own."""
    ini = config.inipath
    if ini is None or config.option.inifilename or (ini.parent / "handover" / "plugin.py").is_file():
        return None
    tree, here = ini.parent, config.invocation_params.dir
    if here.is_relative_to(tree) or here.resolve().is_relative_to(tree.resolve()):
        return None
    return (f"pytest read its configuration from {ini}, found from a path on the command line (the "
            f"inventory's, --out's) rather than where you run it: its settings would change this acceptance "
            f"run. Run pytest in {tree} to mean them, or write those options with = (--inventory=FILE, "
            "--out=DIR), which pytest does not take for paths")


def suites_path(arg: str, here: Path) -> str:
    """A test path as the README writes it (suites/test_network.py::test_iperf3) names the
    installed suites when it names nothing here."""
    path, _, rest = arg.partition("::")
    named = os.path.normpath(path)
    if (named == SUITES_DIR.name or named.startswith(f"{SUITES_DIR.name}/")) and not (here / path).exists():
        installed = SUITES_DIR.parent / named
        if installed.exists():
            return str(installed) + (f"::{rest}" if rest else "")
    return arg


def acceptance_session(config: pytest.Config) -> AcceptanceSession:
    """The session this pytest run tests; a usage error when it was started without --inventory,
    but for `pytest --fixtures`, which collects the suites only to list their fixtures: there the
    checks, with no nodes to be given, are skipped."""
    if SESSION not in config.stash:
        if config.option.showfixtures:
            pytest.skip("pytest --fixtures without --inventory: no nodes to give the checks")
        raise pytest.UsageError("the acceptance suites need --inventory FILE "
                                "(e.g. pytest --inventory inventory/local.yaml)")
    return config.stash[SESSION]


class Interruption:
    """Ctrl-C, SIGTERM (a CI job cancelled, a `timeout` that fired) and SIGHUP (the operator's
    session to the head node dropped) treated as Ctrl-C, so the work on the nodes is killed and
    the run is written as interrupted, its report rendered, never silently dropped.

    A hung-up terminal answers every write with EIO, which would end the run's own ending with
    an error: on SIGHUP, what pointed at the terminal points at /dev/null (the run directory
    holds everything the terminal would have shown).

    Python runs the handler at the main thread's next step; when that step is in a finalizer (a
    `__del__`, a weakref callback, a garbage collection's), Python drops what the handler raised
    and hands it to sys.unraisablehook ("Exception ignored in ..."). Ours sends the signal again,
    to the main thread a moment later, once the finalizer has returned: the check is interrupted
    at once, also in a sleep. Should a later hook keep ours from seeing it, the signal is raised
    again as the check running then ends."""

    name = "handover-interruption"
    RETRY_S = 0.05

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.held = False  # the run's ending: a signal then is noted, not raised (see ending())
        self._next_hook = sys.unraisablehook
        self._terminals = terminal_devices()
        self._previous: dict[int, Any] = {}  # the handlers the run took over, given back at its end

    def handle(self, signals: tuple[signal.Signals, ...]) -> None:
        """Take these signals for the run; one ignored when it starts (nohup's SIGHUP, a
        background job's SIGINT) stays ignored. pytest_unconfigure gives them back."""
        for signum in signals:
            previous = signal.getsignal(signum)
            if previous != signal.SIG_IGN:
                self._previous[signum] = previous
                signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if signum == signal.SIGHUP:
            try:
                detach_from(self._terminals)
            except OSError:  # no descriptor left to open /dev/null with: the run ends all the same
                pass
        self.signum = signum
        if not self.held:
            raise KeyboardInterrupt(f"signal {signum}")

    @contextmanager
    def ending(self) -> Iterator[None]:
        """The run's ending (its node locks released, connections closed, ledger ended, report
        rendered and signed), which a Ctrl-C or SIGTERM must not cut short: it takes a second or
        two, and cut short it left a traceback, no report and an unsigned results.json. A signal
        meanwhile is noted: the run is written as interrupted."""
        self.held = True
        try:
            yield
        finally:
            self.held = False

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self) -> None:
        """Ours goes in once pytest's own hook is (its pytest_configure), in front of it: pytest's
        collects what it is given and hands nothing on."""
        self._next_hook, sys.unraisablehook = sys.unraisablehook, self._on_unraisable

    def pytest_unconfigure(self) -> None:
        if sys.unraisablehook == self._on_unraisable:
            sys.unraisablehook = self._next_hook
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _on_unraisable(self, unraisable: "sys.UnraisableHookArgs") -> None:
        if self.signum is None or not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._next_hook(unraisable)
            return
        main = threading.main_thread().ident
        threading.Timer(self.RETRY_S, signal.pthread_kill, (main, self.signum)).start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logfinish(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"signal {self.signum}")


def terminal_devices() -> set[int]:
    """The devices of the terminals standard input, output and error are, when the run starts."""
    devices = set()
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                devices.add(os.fstat(fd).st_rdev)
        except OSError:
            continue
    return devices


def detach_from(terminals: set[int]) -> None:
    """Point every descriptor of ours that is one of `terminals` at /dev/null: pytest's capture
    and terminal writer hold copies of the terminal beside descriptors 0 to 2."""
    if not terminals:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                status = os.fstat(fd)
            except OSError:
                continue
            if fd != null and stat.S_ISCHR(status.st_mode) and status.st_rdev in terminals:
                os.dup2(null, fd)
    finally:
        os.close(null)


class OutputGuard:
    """stdout or stderr as the run writes to it: once the reader of its pipe is gone (`| head`
    that has its lines, a `| tee` the hang-up killed), writes go nowhere instead of raising
    BrokenPipeError, which ended the run with exit 1 before its run directory was even made.
    The run directory holds everything the stream would have shown."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._gone = False

    @classmethod
    def around(cls, stream: TextIO) -> TextIO:
        return stream if isinstance(stream, cls) else cast(TextIO, cls(stream))

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        """From now on, nothing; the descriptor itself points at /dev/null, so what is still
        buffered (and Python's own flush at exit) finds somewhere to go."""
        self._gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError):
            return

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def listing_only(config: pytest.Config) -> bool:
    """pytest lists what it collected (--collect-only) or the fixtures (--fixtures,
    --fixtures-per-test) and runs nothing: no run directory is made, no node is locked."""
    option = config.option
    return bool(option.collectonly or option.showfixtures or getattr(option, "show_fixtures_per_test", False))


class SessionHooks:
    """The session's part in pytest's run: what to collect, what was planned, the end."""

    def __init__(self, session: AcceptanceSession, interruption: Interruption):
        self.session = session
        self.interruption = interruption
        self._skipped_as_done = 0  # checks a resumed run already has results for
        self._retest: Optional[set[str]] = None  # for --retest: the test ids to run again
        self._pytest_session: Optional[pytest.Session] = None
        self._selected = False  # every plugin has narrowed the items (-k, -m, --resume)
        self._left_out: list[tuple[str, str]] = []  # pytest's listings of each failed check left out
        self._failed_checks = 0

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """A misspelt marker in -m (`-m quik`) is a usage error, never a run that quietly
        selects nothing, whichever ini file pytest found (or none)."""
        self._pytest_session = session
        unknown = unknown_markers(session.config.option.markexpr, session.config)
        if unknown:
            raise pytest.UsageError(f"-m {session.config.option.markexpr!r}: unknown marker(s) "
                                    f"{', '.join(unknown)}; known: {', '.join(MARKERS)} "
                                    "(pytest --markers lists all)")

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]):
        """Once -k, -m and the rest have narrowed the items, leave out what a resumed run already
        has a result for, and note that the selection is final: pytest also ends a collection that
        was interrupted or failed. A re-test's outstanding checks are found among everything
        collected, before -k and -m narrow it (they may leave some out)."""
        try:
            self._retest = self.session.retest_selection([checked_item(item) for item in items])
        except SessionError as error:
            raise pytest.UsageError(str(error)) from None
        result = yield
        self._leave_out_done(config, items)
        self._keep_retested(config, items)
        self._selected = True
        return result

    def _leave_out_done(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """When resuming, leave out what the run already has a result for."""
        done = self.session.already_done()
        if not done:
            return
        deselected = [item for item in items if test_id(item) in done]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if test_id(item) not in done]
        self._skipped_as_done = len(deselected)

    def _keep_retested(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """When re-testing, leave out what the original run does not lack."""
        if self._retest is None:
            return
        deselected = [item for item in items if test_id(item) not in self._retest]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if test_id(item) in self._retest]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Narrow the run to the nodes that -k/-m left tests for, and note what is planned (not
        after a collection cut short by Ctrl-C or an error: its items are not the selection)."""
        if listing_only(session.config) or not self._selected:
            return
        params = [getattr(item, "callspec", None) for item in session.items]
        self.session.plan(
            [test_id(item) for item in session.items],
            per_node={p.params["node"] for p in params if p and "node" in p.params},
            cluster_wide=any(not (p and "node" in p.params) for p in params),
            skipped_as_done=self._skipped_as_done)
        if self.session.stopped is not None:
            raise session.Interrupted(STOPPED)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """A check of a node another run holds fails as busy, before it touches the node."""
        reason = self.session.refusal(params_of(item))
        if reason:
            raise NodeBusy(reason)

    def pytest_runtest_logfinish(self) -> None:
        """A run file that could not be written stops the run after the check that met it."""
        if self.session.stopped is not None and self._pytest_session is not None:
            self._pytest_session.shouldstop = STOPPED

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if listing_only(session.config):  # lists and runs nothing: a resumed run is left as it is
            self.session.cluster_run.close()
            return
        if session.testsfailed > FAILURES_SECTION_MAX:
            self._failed_checks = session.testsfailed
            self._left_out = leave_out_failure_listings(session.config)
        with self.interruption.ending():
            # A second Ctrl-C can end pytest's own handling of the first before it sets the
            # exit status: the signal noted says the run was interrupted all the same.
            interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or self.interruption.signum is not None
            rendered = self.session.finish(exitstatus, interrupted)
        if self.interruption.signum is not None:
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        if rendered and self._skipped_as_done and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK  # a resumed run with nothing left: its verdict says
        if rendered and rendered.verdict.gate_failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.session.stopped is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERRUPTED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self._left_out:
            listings = " and ".join(listing for listing, _ in self._left_out)
            options = " and ".join(option for _, option in self._left_out)
            are, ask = ("are", "ask for them") if len(self._left_out) > 1 else ("is", "asks for it")
            terminalreporter.write_line(
                f"handover: {self._failed_checks:,} checks failed (more than {FAILURES_SECTION_MAX}): pytest's "
                f"{listings} {are} left out ({options} {ask}); the verdict below names them, the report and "
                "junit.xml each one", yellow=True)
        for line in lock_lines(self.session.lock_notes, fleet=len(self.session.nodes) > FLEET_NODES):
            terminalreporter.write_line(f"handover: {line}", yellow=True)
        if self.session.stopped is not None:
            self._summarise_stop(terminalreporter)
        rendered = self.session.rendered
        if rendered is None:
            return
        verdict = rendered.verdict
        colour = {"CERTIFIED": {"green": True}, "NOT CERTIFIED": {"red": True}}.get(
            verdict.status, {"yellow": True})
        terminalreporter.section("handover", sep="=", bold=True)
        terminalreporter.write_line(f"verdict: {verdict.headline}", bold=True, **colour)
        for line in terminal_summary(verdict):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"report: {rendered.report}")
        terminalreporter.write_line(f"signed by {self.session.key.fingerprint}; check with: handover verify "
                                    f"{self.session.run_dir} --allowed-signers FILE (FILE naming this key, "
                                    "kept apart from the run)")

    def _summarise_stop(self, terminalreporter) -> None:
        """The failed write in one line, and how to finish once there is room."""
        terminalreporter.write_line(f"handover: {self.session.stopped}", red=True, bold=True)
        if self.session.ledger is not None:
            run_dir = self.session.run_dir
            terminalreporter.write_line(
                f"handover: the run stopped; once there is room, `handover report {run_dir}` renders "
                f"what its ledger holds and `--resume {run_dir}` runs the rest")


def checked_item(item: pytest.Item) -> tuple[str, str, Optional[str]]:
    """(test id, check, node) of a collected test, as the ledger will name them."""
    return test_id(item), getattr(item, "originalname", item.name).removeprefix("test_"), node_of(item)


def unknown_markers(expression: str, config: pytest.Config) -> list[str]:
    """The names in a -m expression that no plugin or ini file registered as a marker."""
    registered = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    names = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"\([^)]*\)", "", expression or "")))
    return sorted(names - registered - {"and", "or", "not"})


class ProgressDisplay:
    """A fan-out's progress: a live line on a terminal; a line every PROGRESS_EVERY_S in CI logs."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._printed_at: dict[str, float] = {}  # step -> seconds into it

    def show(self, progress: Progress) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or capture is None:
            return
        finished = len(progress.done) == progress.total
        elapsed = time.monotonic() - progress.started
        with capture.global_and_fixture_disabled():
            if reporter.isatty():
                reporter.write("\r\x1b[K" + ("" if finished else "[handover] " + progress.line()))
            elif elapsed - self._printed_at.get(progress.step, 0.0) >= PROGRESS_EVERY_S:
                self._printed_at[progress.step] = elapsed
                reporter.write_line("[handover] " + progress.line())
