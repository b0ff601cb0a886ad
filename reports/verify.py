"""`handover verify`: every signature and digest of a rendered run directory, and which run it is.

It reads no more of the package than that needs (not the renderer, nor pandas or jinja2 under
it), so a customer's check starts at once.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from reports import bundle, retest
from reports.bundle import BUNDLE_SIGNED
from reports.files import read_regular
from reports.results import RESULTS_FILE


def verify_run(run_dir: Path, allowed_signers: Optional[Path] = None) -> bundle.BundleCheck:
    """Every signature and every digest of a rendered run directory (`handover verify`); for a
    re-test, also its tie to the original run when that lies beside it."""
    check = bundle.verify(Path(run_dir), BUNDLE_SIGNED, allowed_signers)
    try:
        results = json.loads(read_regular(Path(run_dir) / RESULTS_FILE).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return check  # already a finding of its own: a signature or a digest that fails
    if not isinstance(results, dict):
        return check
    if not any(finding.file == RESULTS_FILE for finding in check.problems):
        check.subject = subject_of(results)
    # the original is checked against the list this run was, if any
    check.findings += retest.tie_findings(Path(run_dir), results, BUNDLE_SIGNED,
                                          allowed_signers if check.trusted else None, check.fingerprint)
    return check


def subject_of(results: dict) -> str:
    """What a verified run is, from its signed results.json: a customer checks it is the run
    they were promised (another run's bundle, renamed, verifies as well as this one)."""
    run, verdict = (part if isinstance(part := results.get(key), dict) else {} for key in ("run", "verdict"))
    return (f"the run: report {run.get('report_id')} of cluster {run.get('cluster')}, {len(run.get('nodes') or [])} "
            f"node(s), finished {run.get('finished')}, verdict {verdict.get('status')}")
