"""One acceptance session: the inventory, the nodes under test, the cluster run and the ledger.

The plugin opens it when pytest is given --inventory; the suites reach it through fixtures, the
recorder writes check outcomes into its ledger, and at the end it renders and signs the run.
The run directory is made once collection has found something to run, so --collect-only and a
selection that matches nothing leave no run behind and `latest` where it was.
Every option problem is a SessionError: one line naming the option, the file or the field.
A file that cannot be written (a full or failing disk) stops the run: `stopped` holds the
WriteError, nothing more is written, and what the ledger holds renders later with `handover report`.
Before any check runs, every node under test is locked (runners.node_lock); --busy-nodes says what
happens to a node another run (or a soak's load) holds: refuse (its checks fail as `busy`), wait,
or ignore.
--retest RUN_DIR starts a new run, beside RUN_DIR's, of only what RUN_DIR lacked (reports.retest).
"""
from __future__ import annotations

import fnmatch
import json
import os
import resource
import secrets
import socket
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

import hostlist

from handover.failures import HostKeyRefused, NodeBusy, NodeUnreachable
from inventory.loader import InventoryError, load_inventory
from inventory.model import Cluster, Node
from reports import signing
from reports.files import WriteError
from reports.hostlists import hostlist_of
from reports.ledger import Ledger, LedgerError, RunDirectoryBusy, RunRecord, iso_at, now_iso, read_ledger
from reports.render import RenderedRun, render_run
from reports.results import RESULTS_FILE
from reports.retest import RETEST_OF, Original, RetestError, load_original
from runners.cluster import ClusterRun
from runners.fanout import Progress
from runners.neighbours import neighbour_table_warning
from runners.node_lock import BUSY_WAIT_S, NodeLock, NodeLocks, Owner
from runners.soak import SOAK_FILE, SoakError, SoakPlan
from runners.transport import Result

BUSY_NODES = ("refuse", "wait", "ignore")
DEFAULT_OUT = "out"
# The failures of a check that never reached its node, or lost it under the command: resumed, it runs again.
MEASURED_NOTHING = (NodeBusy.kind, NodeUnreachable.kind, HostKeyRefused.kind)


class SessionError(Exception):
    """An option or file the session cannot start with; str() is the one line to show."""


def missed(entry: dict, nodes: set[str]) -> bool:
    """Whether a check passed, or skipped (the storage spread, with one node left to compare),
    without the facts of any of `nodes`: a cluster-wide check whose `unreached` names one, or
    whose ledger is older than `unreached` and does not say."""
    if entry.get("node") is not None or entry["outcome"] not in ("passed", "skipped"):
        return False
    unreached = entry.get("unreached")
    return unreached is None or not nodes.isdisjoint(unreached)


class AcceptanceSession:
    """What one `pytest --inventory FILE` run works on, from its start to its signed report."""

    def __init__(self, cluster: Cluster, nodes: list[Node], key: signing.SigningKey, out: Path,
                 resumed: Optional[tuple[Ledger, RunRecord]] = None,
                 on_progress: Optional[Callable[[Progress], None]] = None, busy_nodes: str = "refuse",
                 original: Optional[Original] = None, soak: bool = False):
        self.cluster = cluster
        self.original = original  # the run --retest completes
        self.retested: list[dict] = []  # its outstanding checks, as collection found them
        self.busy_nodes = busy_nodes
        self.locks: Optional[NodeLocks] = None
        self.lock_notes: dict[str, str] = {}  # node -> why it is not locked for this run, in words
        self.refused: dict[str, str] = {}  # node -> why its checks may not run
        self.key = key
        self.out = out
        self.ledger: Optional[Ledger] = resumed[0] if resumed else None
        self.resumed = resumed[1] if resumed else None
        self.header = run_header(cluster, nodes)
        self.cluster_run = ClusterRun(cluster, nodes, self.save_result, on_progress, allocate=not soak)
        # Under Slurm a soak's nodes are its batch job's, whole: that job is their lock (a lock's
        # holder would be a job of its own, which the soak's job would wait behind).
        self.slurm_soak = soak and cluster.transport == "slurm"
        self.rendered: Optional[RenderedRun] = None
        self.stopped: Optional[WriteError] = None  # the write that failed; the run stops there

    @classmethod
    def open(cls, *, inventory: str, out: Optional[str], nodes: Optional[str], resume: Optional[str],
             sign_key: Optional[str], on_progress: Optional[Callable[[Progress], None]] = None,
             say: Callable[[str], None] = print, busy_nodes: str = "refuse",
             retest: Optional[str] = None, soak: bool = False) -> "AcceptanceSession":
        """Load and check everything the options name, then start (or reopen) the run's ledger.
        Without --out, runs go to out/, and a re-test beside the run it re-tests. soak: a soak
        is asked for (--soak-duration), or resumed: under Slurm the run takes no allocation."""
        try:
            cluster = load_inventory(inventory)
        except InventoryError as error:
            raise SessionError(str(error)) from None
        if retest and resume:
            raise SessionError("--retest and --resume: give one (--resume continues a run, "
                               "--retest starts a new one of what a run lacked)")
        selected = select_nodes(cluster, nodes)
        original = retest_original(Path(retest), cluster) if retest else None
        if original is not None:
            selected = [node for node in selected if node.name in original.nodes]
            if not selected:
                raise SessionError(f"--nodes {nodes!r}: none of the nodes of {retest} ({', '.join(original.nodes)})")
            out = out or str(original.run_dir.parent.parent)
        out = out or DEFAULT_OUT
        if cluster.transport == "ssh":
            raise_open_files(len(selected))
        crowded = neighbour_table_warning(selected)
        if crowded:
            say(crowded)
        if not resume:
            check_out(Path(out))
        key = signing_key(sign_key, say)
        if resume:
            check_same_signer(Path(resume), key)
        resumed = resumed_ledger(Path(resume), cluster, say) if resume else None
        soak = soak or bool(resume and (Path(resume) / SOAK_FILE).is_file())
        return cls(cluster, selected, key, Path(out), resumed, on_progress, busy_nodes, original, soak)

    @property
    def run_dir(self) -> Path:
        return self.recording.run_dir

    @property
    def recording(self) -> Ledger:
        """The run's ledger; checks only run once it exists."""
        if self.ledger is None:
            raise RuntimeError("the run directory is made when collection has found checks to run")
        return self.ledger

    @property
    def started(self) -> datetime:
        """When the run started: a resumed run keeps its first start."""
        started = self.resumed.header["started"] if self.resumed else self.recording.started
        return datetime.fromisoformat(str(started))

    def append(self, entry: dict) -> None:
        """Add an entry to the ledger; after a failed write, nothing (the run is stopping)."""
        if self.stopped is not None:
            return
        try:
            self.recording.append(entry)
        except WriteError as error:
            self.stopped = error

    @property
    def nodes(self) -> list[Node]:
        """The nodes under test: the --nodes selection, narrowed to what -k/-m left tests for."""
        return self.cluster_run.nodes

    def record_tool(self, node: str, tool: str, version: str) -> None:
        """Which version of a tool produced a node's figures, for the report's provenance."""
        self.append({"type": "tool", "node": node, "tool": tool, "version": version})

    def save_raw(self, step: str, node: str, stdout: str, stderr: str, command: str = "") -> list[str]:
        """Keep a tool's raw output in the run directory; the paths, relative to it (none once a
        write failed: the check's entry will not be kept either, so --resume runs it again)."""
        if self.stopped is not None:
            return []
        try:
            return self.recording.save_raw(step, node, stdout, stderr, command)
        except WriteError as error:
            self.stopped = error
            return []

    def save_result(self, step: str, result: Result) -> list[str]:
        """save_raw of one command's Result, with its whole command line."""
        return self.save_raw(step, result.node, result.stdout, result.stderr, result.full_command)

    def already_done(self) -> set[str]:
        """Test ids the resumed run has a result for (none for a fresh run). A check that measured
        nothing is run again: refused as busy (another run held its node, as its message says), or
        failed because its node was not reached or was lost under it (a link that has come back
        since, the harness's own network that dropped). Where a node's check runs again, so does
        every cluster-wide check that passed or skipped without that node's facts (`missed`):
        uniformity that compared the nodes left runs again; the storage spread taken before the
        node was lost had its facts, and is not run again on every node. A cluster-wide failure
        stays, as any failure does: a re-test runs it again (reports.retest)."""
        if not self.resumed:
            return set()
        again = {entry["node"] for entry in self.resumed.checks
                 if entry.get("node") and entry.get("kind") in MEASURED_NOTHING}
        return {entry["test_id"] for entry in self.resumed.checks
                if entry.get("kind") not in MEASURED_NOTHING and not (again and missed(entry, again))}

    def retest_selection(self, collected: list[tuple[str, str, Optional[str]]]) -> Optional[set[str]]:
        """For --retest, the test ids to run again among everything collected (test_id, check,
        node), before -k/-m narrow it; None for any other run. Nothing outstanding is an error.
        A re-test resumed after an interruption keeps to the checks it set out to run."""
        if self.resumed is not None and RETEST_OF in self.resumed.header:
            return {entry["test_id"] for entry in self.resumed.header[RETEST_OF]["checks"]}
        if self.original is None:
            return None
        self.retested = self.original.outstanding(collected)
        if not self.retested:
            raise SessionError(f"--retest: {self.original.run_dir} has nothing to re-test: no check failed, "
                               "errored or went without a result")
        return {entry["test_id"] for entry in self.retested}

    def plan(self, test_ids: list[str], per_node: set[str], cluster_wide: bool,
             skipped_as_done: int) -> None:
        """Start the run directory (or reopen the resumed one) and record what this run will do:
        its tests and the nodes they concern. Nothing to run: no run directory.

        Cluster-wide checks need every node, so any of them keeps the whole --nodes selection.
        A resumed run's record keeps the nodes and tests of the run it continues.
        """
        if not test_ids:
            return
        if self.original is not None:
            self.header[RETEST_OF] = self.original.header(self.retested)
        if self.ledger is None:
            try:
                self.ledger = Ledger.create(self.out, self.cluster.name, self.header, hold=True)
            except WriteError as error:
                self.stopped = error
                return
        if not cluster_wide:
            self.cluster_run.nodes = [n for n in self.cluster_run.nodes if n.name in per_node]
        nodes = [n.name for n in self.nodes]
        if self.resumed is not None:
            self.append({"type": "resume", "at": now_iso(), "already_done": skipped_as_done})
            test_ids = list(dict.fromkeys(self.resumed.planned + test_ids))
            nodes = list(dict.fromkeys(self.resumed.nodes + nodes))
        self.append({"type": "selection", "nodes": nodes, "tests": test_ids})
        if self.stopped is None and not self.slurm_soak:
            self._lock_nodes()

    def _lock_nodes(self) -> None:
        """Lock every node under test before a check runs there; a node another run holds is
        refused, waited for, or used anyway, as --busy-nodes says. The ledger keeps what happened."""
        owner = Owner(run_id=self.run_dir.name, started=self.started.isoformat(),
                      host=socket.gethostname(), token=secrets.token_hex(8))
        self.locks = NodeLocks(owner, {n.name: self.cluster_run.transport(n.name) for n in self.nodes})
        taken = self.locks.take(BUSY_WAIT_S if self.busy_nodes == "wait" else 0, soak_id=self._soak_attached())
        not_held = {node: lock.describe() for node, lock in taken.items() if lock.state != "held"}
        busy = [node for node, lock in taken.items() if lock.state == "busy"]
        if self.busy_nodes == "ignore":
            self.lock_notes = {node: f"{not_held[node]}; checked anyway (--busy-nodes ignore)" for node in busy}
        else:
            self.refused = {node: f"{not_held[node]}; its figures now would measure both runs "
                                  f"({_after_busy(taken[node])})" for node in busy}
            self.cluster_run.nodes = [n for n in self.cluster_run.nodes if n.name not in self.refused]
        self.lock_notes.update((node, why) for node, why in not_held.items() if node not in busy)
        self.append({"type": "locks", "busy_nodes": self.busy_nodes,
                     "held": [node for node, lock in taken.items() if lock.state == "held"],
                     "not_held": not_held, "refused": list(self.refused),
                     "not_reached": [node for node, lock in taken.items() if lock.not_reached]})

    def _soak_attached(self) -> str:
        """The soak of the run directory this session resumes ('' for none): its load does not
        make the nodes busy for the harness that follows it."""
        if self.resumed is None or not (self.run_dir / SOAK_FILE).is_file():
            return ""
        try:
            return SoakPlan.load(self.run_dir).soak_id
        except SoakError:
            return ""

    def refusal(self, params: dict) -> Optional[str]:
        """Why a check with these parameters may not run: a node it tests is another run's (a
        cluster-wide check runs on the nodes left, unless none is)."""
        nodes = [params["node"]] if "node" in params else []
        if not nodes and self.refused and not self.cluster_run.nodes:
            nodes = list(self.refused)
        return next((self.refused[node] for node in nodes if node in self.refused), None)

    def finish(self, exitstatus: int, interrupted: bool) -> Optional[RenderedRun]:
        """Close the connections, end the ledger, and render and sign the run (if one started
        and every write so far worked). The nodes' locks go first."""
        if self.locks is not None:
            self.locks.release()
        self.cluster_run.close()
        if self.ledger is None:
            return None
        dropped = self.cluster_run.dropped()
        if dropped:
            self.append({"type": "dropped", "nodes": [
                {"node": node, "lost_at": iso_at(loss.at), "back_at": iso_at(back), "reason": loss.reason}
                for node, loss, back in dropped]})
        self.append({"type": "end", "finished": now_iso(), "exitstatus": int(exitstatus),
                     "interrupted": interrupted})
        if self.stopped is None:
            try:
                self.recording.sync()
            except WriteError as error:
                self.stopped = error
        if self.stopped is not None:
            return None
        try:
            self.rendered = render_run(self.run_dir, self.key)
        except WriteError as error:
            self.stopped = error
        return self.rendered


def _after_busy(lock: NodeLock) -> str:
    """What to do about a node another run holds: a soak's end is known, so it is not waited for."""
    if lock.soak is not None:
        return "run again after its end, or end it early with --soak-stop and its run directory"
    return "run again once it has ended, or use --busy-nodes wait"


FILES_BASE = 256  # the interpreter, pytest, the ledger
FILES_PER_NODE = 3  # a node's SSH connection, its jump host's, a raw output being written


def raise_open_files(nodes: int) -> None:
    """A session keeps one SSH connection per node open, and the soft limit on open files is
    often 1,024: raise it toward the hard limit, or say at once that the hard one is too low
    (rather than 'Too many open files' from the thousandth node)."""
    needed = FILES_BASE + FILES_PER_NODE * nodes
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SessionError(f"{nodes} nodes need about {needed} open files, but the hard limit "
                           f"(ulimit -Hn) is {hard}: raise it, or test part of the nodes at a time "
                           "with --nodes")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


GLOB_CHARACTERS = frozenset("*?[")  # what makes an fnmatch pattern more than a name


def select_nodes(cluster: Cluster, pattern: Optional[str]) -> list[Node]:
    """The inventory's nodes that --nodes names, in inventory order; an empty match is an error,
    and so is an empty --nodes (a script's unset $NODES), which is not every node."""
    if pattern is None:
        return list(cluster.nodes)
    if not pattern.strip():
        raise SessionError(f"--nodes {pattern!r} names no node; leave the option out to test every node")
    try:
        wanted = list(hostlist.expand_hostlist(pattern))
    except hostlist.BadHostlist as error:
        raise SessionError(f"--nodes {pattern!r}: {error}") from None
    names = {n.name for n in cluster.nodes}
    # A word without glob characters names one node, found through the set: matching every word
    # against every node grew with nodes x words (4,096 nodes written as a hostlist took 11 s).
    globbed = {w: {n.name for n in cluster.nodes if fnmatch.fnmatchcase(n.name, w)}
               for w in wanted if GLOB_CHARACTERS.intersection(w)}
    chosen_names = (set(wanted) - globbed.keys()).union(*globbed.values())
    chosen = [n for n in cluster.nodes if n.name in chosen_names]
    unmatched = [w for w in wanted if not (globbed[w] if w in globbed else w in names)]
    if unmatched:
        known = hostlist_of(n.name for n in cluster.nodes)
        raise SessionError(f"--nodes: {', '.join(unmatched)} match no node of "
                           f"{cluster.source_path} (it has {known})")
    return chosen


def signing_key(path: Optional[str], say: Callable[[str], None]) -> signing.SigningKey:
    """--sign-key's key, or this machine's handover key (created, and said so, on first use)."""
    try:
        if path:
            return signing.load_signing_key(Path(path).expanduser())
        key, created = signing.ensure_default_key()
    except signing.SigningError as error:
        raise SessionError(f"--sign-key: {error}") from None
    if created:
        say(f"handover: created signing key {key.path} ({key.fingerprint}); "
            "give customers its public key to verify reports")
    return key


def check_same_signer(run_dir: Path, key: signing.SigningKey) -> None:
    """A resumed run that was signed (rendered when it was cut short) goes on with the key that
    signed it: another key would re-sign the whole bundle without a word, and the customer's
    list of allowed signers would no longer verify it. Re-signing is `handover report`'s, asked."""
    try:
        signer = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8")).get("signer")
    except (OSError, ValueError, AttributeError):
        return  # not rendered, or not readable: the ledger's checks say what is wrong
    fingerprint = signer.get("fingerprint") if isinstance(signer, dict) else None
    if fingerprint and fingerprint != key.fingerprint:
        raise SessionError(f"--resume: {run_dir} was signed by key {fingerprint}, not by {key.fingerprint} "
                           f"({key.path}): resume with --sign-key naming the key that signed it, or re-sign "
                           f"it on purpose with `handover report {run_dir} --sign-key {key.path}`")


def check_out(out: Path) -> None:
    """--out must be a folder that exists or can be made, and be writable; checked up front, so a
    mistyped --out is one line and not a traceback once the checks have run."""
    existing = out.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SessionError(f"--out {out}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SessionError(f"--out {out}: {existing} is not writable")


def retest_original(run_dir: Path, cluster: Cluster) -> Original:
    """The run --retest names: rendered, and a run of this cluster (the inventory itself may have
    changed: a node repaired, a band corrected), its nodes all still in the inventory."""
    try:
        original = load_original(run_dir)
    except RetestError as error:
        raise SessionError(f"--retest: {error}") from None
    if (original.cluster, original.cluster_id) != (cluster.name, cluster.identity):
        raise SessionError(f"--retest: {run_dir} is a run of cluster {original.cluster} ({original.cluster_id}), "
                           f"not of {cluster.name} ({cluster.identity}) as {cluster.source_path} says; "
                           "re-test with that cluster's inventory")
    listed = {node.name for node in cluster.nodes}
    gone = [name for name in original.nodes if name not in listed]
    if gone:
        raise SessionError(f"--retest: {cluster.source_path} no longer lists {', '.join(gone)}, "
                           f"which {run_dir} tested")
    return original


def resumed_ledger(run_dir: Path, cluster: Cluster,
                   say: Callable[[str], None]) -> tuple[Ledger, RunRecord]:
    """The ledger of an earlier run of the same inventory, and what it holds; a torn last line
    (the run died mid-write) is cut off first, and said so, so nothing is appended onto it."""
    try:  # before reading: the run, or another resume of it, may still be appending
        ledger = Ledger.held(run_dir.resolve())
    except RunDirectoryBusy as error:
        raise SessionError(f"--resume: {error}") from None
    try:
        record = read_ledger(run_dir)
    except LedgerError as error:
        raise SessionError(f"--resume: {error}") from None
    if record.header.get("inventory", {}).get("sha256") != cluster.digest:
        path = record.header.get("inventory", {}).get("path")
        if path == cluster.source_path:
            raise SessionError(f"--resume: {path} has changed since {run_dir} was run with it; resume with "
                               "the file as it was then (or start a new run)")
        raise SessionError(
            f"--resume: {run_dir} was run with a different inventory ({path}); resume with the same file")
    try:
        repaired = ledger.repair(record)
    except WriteError as error:
        raise SessionError(f"--resume: {error}") from None
    if repaired:
        say(f"handover: {repaired}")
    return ledger, record


def run_header(cluster: Cluster, nodes: list[Node]) -> dict:
    """The ledger's first entry: what was tested, against which profile, by which harness."""
    profile = cluster.profile
    return {
        "cluster": cluster.name,
        "profile": {
            "name": profile.name, "description": profile.description,
            "mandatory": list(profile.mandatory), "expect": profile.expect.declared(),
            "references": {name: {"check": r.check, "value": r.value, "lower": r.lower,
                                  "upper": r.upper, "unit": r.unit, "source": r.source}
                           for name, r in profile.references.items()},
            "outliers": profile.outliers.as_dict(),
        },
        "inventory": {"path": cluster.source_path, "sha256": cluster.digest},
        "harness": harness_identity(),
        "argv": sys.argv,
        "nodes": [node.name for node in nodes],
        "node_sources": {node.name: node.source for node in nodes},  # results.json nodes[].source
        # where the inventory places each node that it places: results.json nodes[].rack and .leaf
        "node_places": {node.name: {"rack": node.rack, "leaf": node.leaf} for node in nodes if node.rack or node.leaf},
        # The facts of profile.expect the inventory changed, with the profile's value and why.
        "expect_overrides": [override.as_dict() for override in cluster.expect_overrides],
        **cluster.delivery(),  # cluster_id, waivers, sign_off: the delivery's record
    }


def harness_identity() -> dict:
    """The installed version and, from a checkout, the git commit the harness ran from."""
    try:
        version = metadata.version("handover")
    except metadata.PackageNotFoundError:
        version = "unknown"
    source = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(source), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version, "commit": commit}
