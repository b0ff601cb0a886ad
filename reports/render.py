"""Turn a run directory's ledger into its renderings and sign them: the one reporting path.

Used at the end of a pytest run and by `handover report RUN_DIR` for an interrupted one. The
last step seals the bundle: manifest.json and manifest.sha256 (reports/bundle.py) list the
digest of every file of the run directory, and are signed by the same key as the report.
A re-test's run (its header says `retest_of`) renders as an addendum to the report it completes
(reports/retest.py). Verifying a run directory is reports/verify.py's.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from reports import bundle, retest, signing
from reports.bundle import ALLOWED_SIGNERS_FILE, BUNDLE_SIGNED, REPORT_FILE, SIGNED_FILES
from reports.files import remove_stale_temporaries
from reports.html import write_html
from reports.junit import write_junit
from reports.ledger import RunRecord, read_ledger
from reports.results import build_results, write_metrics_csv, write_results
from reports.verdict import Verdict


@dataclass
class RenderedRun:
    run_dir: Path
    results: dict
    verdict: Verdict
    report: Path
    signer: Optional[signing.SigningKey]


def render_run(run_dir: Path, key: Optional[signing.SigningKey],
               record: Optional[RunRecord] = None) -> RenderedRun:
    """Write results.json, metrics.csv, junit.xml and report.html; sign the first and last; then
    write and sign the manifest of the whole run directory. record: the run directory's ledger
    when the caller has read it already (a thousand nodes' ledger takes a second to read). The
    caller holds the run directory (Ledger.hold): no other process writes there meanwhile."""
    run_dir = Path(run_dir)
    with cycles_collected_after():
        record = record if record is not None else read_ledger(run_dir)
        signer = {"fingerprint": key.fingerprint, "public_key": key.public_line} if key else None
        build = retest.build_addendum if retest.is_retest(record) else build_results
        results, verdict = build(record, signer)
        write_results(results, run_dir)
        write_metrics_csv(results, run_dir)
        write_junit(results, run_dir)
        report = write_html(results, run_dir / REPORT_FILE)
    if key is not None:
        for name in SIGNED_FILES:
            signing.sign_file(run_dir / name, key)
        signing.write_allowed_signers(run_dir / ALLOWED_SIGNERS_FILE, key, signer_identity(key))
    remove_stale_temporaries(run_dir)  # a killed run's: never sealed into the bundle
    bundle.seal(run_dir, results["run"]["run_id"], key, BUNDLE_SIGNED)
    return RenderedRun(run_dir, results, verdict, report, key)


@contextmanager
def cycles_collected_after() -> Iterator[None]:
    """Python's cycle collector paused while the renderings are built, then run once: a
    thousand-node run holds millions of live objects (ledger, results, views), and each full
    collection that the renderings' allocations set off walks them all (a third of the rendering
    time at 1,024 nodes). What they leave is freed by the one collection at the end."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            gc.collect()


def signer_identity(key: signing.SigningKey) -> str:
    """The principal named in allowed_signers: the key's comment, e.g. operator@example.com."""
    return key.comment or "handover"
