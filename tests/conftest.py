"""Fixtures for the harness's own tests: real sshd nodes in network namespaces (see netns.py)."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from netns import NamespaceCluster, netns_available

# Started where SIGINT is ignored (a background job of a script without job control), the tests
# would hand that on to every harness they start, and Python installs no KeyboardInterrupt in a
# process that inherits it: the tests that stop a harness with Ctrl-C need SIGINT back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _require_netns() -> None:
    """Skip where namespaces are impossible, but fail on CI: it runs as root and must run these."""
    available, reason = netns_available()
    if available:
        return
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI is set but namespace nodes are unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def ns_cluster(tmp_path_factory):
    """Four started nodes shared by the session; tests must leave them working."""
    _require_netns()
    with NamespaceCluster(tmp_path_factory.mktemp("ns_cluster"), 4) as cluster:
        yield cluster


def _clusters(workdir):
    """make(count, prefix="node") -> a fresh started cluster under workdir; all stopped at the end."""
    _require_netns()
    clusters: list[NamespaceCluster] = []

    def make(count: int, prefix: str = "node") -> NamespaceCluster:
        cluster = NamespaceCluster(workdir / f"cluster{len(clusters)}", count, prefix)
        clusters.append(cluster)
        return cluster.start()

    yield make
    errors = []
    for cluster in clusters:
        try:
            cluster.stop()
        except RuntimeError as error:
            errors.append(str(error))
    if errors:
        pytest.fail("; ".join(errors))


@pytest.fixture
def ns_cluster_factory(tmp_path):
    """make(count, prefix="node") -> a fresh started cluster, stopped at the end of the test."""
    yield from _clusters(tmp_path)


@pytest.fixture(scope="module")
def module_ns_cluster_factory(tmp_path_factory):
    """ns_cluster_factory for a module's tests that read one run together."""
    yield from _clusters(tmp_path_factory.mktemp("module_clusters"))


@pytest.fixture(scope="session")
def sign_key(tmp_path_factory):
    """An operator's Ed25519 signing key (ops@example.com), as `--sign-key` takes it."""
    key = tmp_path_factory.mktemp("key") / "operator"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops@example.com",
                    "-f", str(key)], check=True)
    return key


@pytest.fixture(scope="session")
def trusted_signers(sign_key, tmp_path_factory):
    """A customer's allowed_signers naming the operator's key, kept apart from any run directory."""
    path = tmp_path_factory.mktemp("customer") / "allowed_signers"
    path.write_text(f'ops@example.com namespaces="handover" {Path(f"{sign_key}.pub").read_text()}')
    return path



# `make test` runs three tests at a time (pytest-xdist). The modules of a group run one after another
# on one worker, never beside each other:
# - this-machine: they run the suites (or a tool on a fixed port) on this machine itself; a run
#   takes the machine's one node lock and scratch path, so two at once refuse each other;
# - performance: they judge timed figures on namespace nodes (a slow node named among healthy
#   ones); two at once on two cores would slow healthy nodes into the figures too. The group is
#   the run's longest unit of work: about 11.5 minutes. test_slurm_cluster (5 minutes more since
#   the soak under Slurm joined it) is a unit of its own: in the group, it made the group the
#   run's critical path, and the run took 22.5 minutes.
SERIAL_GROUPS = {
    "this-machine": ["test_bundle", "test_disk_faults", "test_e2e", "test_entry_points", "test_gemm_fft",
                     "test_hardware_suite", "test_hpc_suite", "test_retest", "test_schema", "test_waivers",
                     "test_iperf3", "test_perftest", "test_system_suite"],
    "performance": ["test_collectives", "test_training_suite", "test_outliers", "test_network_suite"],
}
GROUP_OF_MODULE = {module: group for group, modules in SERIAL_GROUPS.items() for module in modules}
# Units that start first, in this order, whatever their number of tests (xdist otherwise starts
# the units with the most tests first): the longest first (their minutes in clean-clone runs of
# stops 48 and 49: 11.5, 10.8, 5.9, 5.3, 4.8, 3.4, 2.5), so that none is left for the end beside
# idle workers. The failed-run isolations spend most of theirs waiting on failed rendezvous.
START_FIRST = ("performance", "this-machine", "tests/test_faults.py", "tests/test_slurm_cluster.py",
               "tests/test_failed_run_isolation.py", "tests/test_soak.py", "tests/test_device_proof.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Each group one unit of work, every other module one unit (its module fixtures set up once);
    the units of START_FIRST first.

    xdist's own `--dist loadgroup` marks do not reach its scheduler under pytest 9: it renames
    `item._nodeid`, which pytest 9 no longer reads.
    """
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rpartition("/")[2].removesuffix(".py")
            return GROUP_OF_MODULE.get(module, nodeid.split("::", 1)[0])

        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            self._ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the queue is whole before its first unit is handed out
                for scope in reversed(START_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self._ordered = True
            super()._assign_work_unit(node)

    return SerialGroups(config, log)


class TinyDisk:
    """A tmpfs mounted for one test: filled to leave a few KiB, freed, or made read-only."""

    FILLER = "filler"

    def __init__(self, path: Path):
        self.path = path

    def fill(self, leave_kib: int = 0) -> None:
        free_kib = os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize // 1024
        with open(self.path / self.FILLER, "ab") as filler:
            filler.write(b"\0" * max(0, free_kib - leave_kib) * 1024)

    def free(self) -> None:
        (self.path / self.FILLER).unlink()

    def remount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True)


@pytest.fixture
def tiny_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield TinyDisk(path)
    finally:
        subprocess.run(["umount", str(path)], check=True)
