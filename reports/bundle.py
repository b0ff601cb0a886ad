"""The run directory as a bundle a customer can check file by file, with handover or without it.

    manifest.json     {"schema": "handover.manifest/1", "run_id": ..., "files": [{"path", "sha256", "bytes"}]}
    manifest.sha256   the same digests in sha256sum's format, for `sha256sum -c manifest.sha256`
    <signed>.sig      SSHSIG (namespace handover) of results.json, report.html and the manifest's
                      two files, all by one key, each for `ssh-keygen -Y verify`

The manifest lists every regular file under the run directory (ledger, raw tool output,
renderings, allowed_signers, TensorBoard events) by its path relative to the run directory, with
/ between folders, sorted. It leaves out only itself, manifest.sha256 and the signatures of the
signed files, which check themselves; any other file, .sig or not, is listed or is an addition.
`verify` checks every signature, that one key made them all and who it is, then every digest,
and names each file that changed, went missing or was added, one line each.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from reports import signing
from reports.files import WriteError, open_regular, read_regular, write_atomically
from reports.results import RESULTS_FILE

if TYPE_CHECKING:  # imported by `handover verify`, which reads the manifest, not by every rendering
    from jsonschema import Draft202012Validator

MANIFEST_SCHEMA = "handover.manifest/1"
MANIFEST_FILE = "manifest.json"
CHECKSUMS_FILE = "manifest.sha256"
MANIFEST_FILES = (MANIFEST_FILE, CHECKSUMS_FILE)
REPORT_FILE = "report.html"
SIGNED_FILES = (RESULTS_FILE, REPORT_FILE)  # signed as they are rendered
BUNDLE_SIGNED = SIGNED_FILES + MANIFEST_FILES  # every signature of a run directory
ALLOWED_SIGNERS_FILE = "allowed_signers"
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "manifest.schema.json"

_READ_CHUNK = 1 << 20
# A name sha256sum would have to escape, or that is not text: never written by handover.
_UNLISTABLE = re.compile(r"[\x00-\x1f\x7f\\]")
_MESSAGE_WIDTH = 160  # a schema error quotes the value it rejects; keep the line short


@dataclass(frozen=True)
class Finding:
    """One line of verify's answer: a file of the bundle and what was found about it."""

    ok: bool
    file: str  # relative to the run directory
    reason: str
    checked: bool = True  # False: a check that could not be made here (not a problem, nor a pass)

    def __str__(self) -> str:
        label = "BAD" if not self.ok else "OK " if self.checked else "--"
        return printable(f"{label} {self.file}: {self.reason}")


def printable(line: str) -> str:
    """One line of verify's answer as a terminal should show it: control characters (a file
    named with a newline would forge an OK line, an escape sequence erase one), backslashes,
    bytes that are not UTF-8 and other unprintable characters (U+202E) are escaped, Python's
    way (\\n, \\x1b, \\\\, \\udcff)."""
    if line.isprintable() and "\\" not in line:  # a surrogate (a byte not UTF-8) is not printable
        return line
    return "".join(character if character.isprintable() and character != "\\"
                   else character.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for character in line)


@dataclass
class BundleCheck:
    """What verify found: a line per signature and per problem, and who signed."""

    findings: list[Finding] = field(default_factory=list)
    signer: str = ""  # "signed by ...", one line; empty when no signature was good
    subject: str = ""  # what the signed results.json says the run was, one line; empty if not as signed
    fingerprint: Optional[str] = None  # the key that signed the bundle (the most of its signatures)
    trusted: bool = False  # its signer was checked against a trust list from outside the run

    @property
    def ok(self) -> bool:
        return all(finding.ok for finding in self.findings)

    @property
    def problems(self) -> list[Finding]:
        return [finding for finding in self.findings if not finding.ok]


def unlisted(signed: Sequence[str]) -> frozenset[str]:
    """The run directory's top-level names the manifest leaves out: itself and the signatures."""
    return frozenset(MANIFEST_FILES) | {name + signing.SIGNATURE_SUFFIX for name in signed}


# --- Writing ------------------------------------------------------------------------------------


def build_manifest(run_dir: Path, run_id: str, signed: Sequence[str]) -> dict:
    """The manifest of run_dir as it is now; a file that cannot be read or named is a WriteError
    of manifest.json (the one error the reporting path turns into a line)."""
    run_dir = Path(run_dir)
    target = run_dir / MANIFEST_FILE
    regular, _odd, unreadable = _walk(run_dir)
    if unreadable:
        where, error = unreadable[0]
        raise WriteError(error.errno or errno.EIO, f"{error.strerror or error} reading {where}", str(target))
    skipped = unlisted(signed)
    files = []
    for relative, path in regular.items():
        if relative in skipped:
            continue
        if _UNLISTABLE.search(relative) or not _is_text(relative):
            raise WriteError(errno.EINVAL, f"{relative!r} has a name a checksum list cannot hold "
                             "(a control character, a backslash or bytes that are not UTF-8)", str(target))
        try:
            digest, size = sha256_of(path)
        except OSError as error:
            raise WriteError(error.errno or errno.EIO, f"{error.strerror or error} reading {relative}",
                             str(target)) from None
        files.append({"path": relative, "sha256": digest, "bytes": size})
    return {"schema": MANIFEST_SCHEMA, "run_id": run_id, "files": files}


def manifest_text(manifest: dict) -> str:
    """manifest.json's text: one file per line, so it reads, greps and diffs line by line."""
    entries = ",\n    ".join(json.dumps(entry, ensure_ascii=False) for entry in manifest["files"])
    files = f"[\n    {entries}\n  ]" if entries else "[]"
    return (f'{{\n  "schema": {json.dumps(manifest["schema"])},\n'
            f'  "run_id": {json.dumps(manifest["run_id"], ensure_ascii=False)},\n'
            f'  "files": {files}\n}}\n')


def checksums_text(manifest: dict) -> str:
    """manifest.sha256: `<sha256>  <path>` per file, the format `sha256sum -c` reads."""
    return "".join(f"{entry['sha256']}  {entry['path']}\n" for entry in manifest["files"])


def seal(run_dir: Path, run_id: str, key: Optional[signing.SigningKey], signed: Sequence[str]) -> dict:
    """Write manifest.json and manifest.sha256 for run_dir as it is now, and sign both with key;
    call it last, once every other file of the run is written and signed."""
    run_dir = Path(run_dir)
    manifest = build_manifest(run_dir, run_id, signed)
    write_atomically(run_dir / MANIFEST_FILE, manifest_text(manifest))
    write_atomically(run_dir / CHECKSUMS_FILE, checksums_text(manifest))
    if key is not None:
        for name in MANIFEST_FILES:
            signing.sign_file(run_dir / name, key)
    return manifest


# --- Checking -----------------------------------------------------------------------------------


def verify(run_dir: Path, signed: Sequence[str], allowed_signers: Optional[Path] = None) -> BundleCheck:
    """Check every signature in `signed`, that one key made them, who it is, and every digest of
    the manifest against the run directory; never raises for what it finds."""
    run_dir = Path(run_dir)
    check = BundleCheck()
    if allowed_signers is not None and _inside(Path(allowed_signers), run_dir):
        check.findings.append(Finding(True, str(allowed_signers), OWN_LIST, checked=False))
        allowed_signers = None
    signatures = {name: signing.verify_file(run_dir / name, allowed_signers=allowed_signers)
                  for name in signed}
    check.findings += [Finding(v.ok, name, v.reason) for name, v in signatures.items()]
    check.fingerprint, different = _one_key(signatures)
    check.findings += different
    manifest, problem = read_manifest(run_dir / MANIFEST_FILE)
    if manifest is None:
        check.findings.append(Finding(False, MANIFEST_FILE, problem))
    else:
        check.findings += _checksums_agree(run_dir, manifest)
        check.findings += compare(run_dir, manifest, unlisted(signed))
    check.signer, naming = _signer(run_dir, signatures, allowed_signers, check.fingerprint)
    check.findings += naming
    check.trusted = allowed_signers is not None and check.ok
    return check


OWN_LIST = ("is inside the run directory: a list that came with the files names whatever key signed "
            "them, so the signer is not checked against keys you trust")


def _inside(path: Path, run_dir: Path) -> bool:
    """Whether path is the run directory's own (its allowed_signers, say), links resolved."""
    try:
        return path.resolve().is_relative_to(run_dir.resolve())
    except (OSError, RuntimeError):  # a link loop: not a list anyone can use
        return False


def read_manifest(path: Path) -> tuple[Optional[dict], str]:
    """(manifest, "") when path holds a valid handover.manifest/1 document, else (None, why)."""
    try:
        text = read_regular(path).decode("utf-8")
    except FileNotFoundError:
        return None, "not found, so no file of the run can be checked against its digest"
    except (OSError, UnicodeDecodeError) as error:
        return None, f"cannot read: {getattr(error, 'strerror', None) or error}"
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        return None, f"not JSON: {error}"
    errors = list(_validator().iter_errors(document))
    if errors:
        from jsonschema.exceptions import best_match

        worst = best_match(errors)
        where = "/".join(str(part) for part in worst.absolute_path) or "the document"
        message = worst.message if len(worst.message) <= _MESSAGE_WIDTH else worst.message[:_MESSAGE_WIDTH] + "..."
        return None, f"does not match {SCHEMA_PATH.name} at {where}: {message}"
    seen: set[str] = set()
    for entry in document["files"]:
        if entry["path"] in seen:
            return None, f"lists {entry['path']} twice"
        seen.add(entry["path"])
    return document, ""


def compare(run_dir: Path, manifest: dict, skipped: frozenset[str]) -> list[Finding]:
    """A finding per listed file that changed or is missing, per file the manifest does not
    list, per entry that is not a regular file; one OK finding when there is none."""
    regular, odd, unreadable = _walk(Path(run_dir))
    listed = {entry["path"]: entry for entry in manifest["files"]}
    found = [Finding(False, where, f"cannot read: {error.strerror or error}") for where, error in unreadable]
    for relative, entry in sorted(listed.items()):
        if relative in odd:
            found.append(Finding(False, relative, f"is {odd[relative]}, not the regular file {MANIFEST_FILE} lists"))
            continue
        if relative not in regular:
            found.append(Finding(False, relative, f"missing: {MANIFEST_FILE} lists it"))
            continue
        try:
            digest, size = sha256_of(regular[relative])
        except OSError as error:
            found.append(Finding(False, relative, f"cannot read: {error.strerror or error}"))
            continue
        if digest != entry["sha256"]:
            found.append(Finding(False, relative, f"SHA-256 is not the one {MANIFEST_FILE} lists ({size} "
                                 f"bytes now, {entry['bytes']} listed): changed after signing"))
    for relative in sorted(set(regular) - set(listed) - skipped):
        found.append(Finding(False, relative, f"not in {MANIFEST_FILE}: added after signing"))
    for relative in sorted(set(odd) - set(listed)):
        found.append(Finding(False, relative, f"is {odd[relative]}, which a run directory never holds"))
    if not found:
        found.append(Finding(True, MANIFEST_FILE, f"run {manifest['run_id']}: {len(listed)} files, each "
                             "with the SHA-256 it lists, none missing, none added"))
    return found


def sha256_of(path: Path) -> tuple[str, int]:
    """(hex SHA-256, size in bytes) of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open_regular(path) as stream:
        for chunk in iter(lambda: stream.read(_READ_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _checksums_agree(run_dir: Path, manifest: dict) -> list[Finding]:
    try:
        text = read_regular(run_dir / CHECKSUMS_FILE)
    except FileNotFoundError:
        return [Finding(False, CHECKSUMS_FILE, "not found")]
    except OSError as error:
        return [Finding(False, CHECKSUMS_FILE, f"cannot read: {error.strerror or error}")]
    if text != checksums_text(manifest).encode("utf-8"):
        return [Finding(False, CHECKSUMS_FILE, f"does not list the digests {MANIFEST_FILE} lists")]
    return []


def _one_key(signatures: dict[str, signing.Verification]) -> tuple[Optional[str], list[Finding]]:
    """The key that made the most signatures (the first of those tied), and a finding per
    signature another key made: one forged signature is blamed, not the genuine others."""
    made = [(name, v.fingerprint) for name, v in signatures.items() if v.fingerprint]
    if not made:
        return None, []
    keys = [key for _, key in made]
    main = max(dict.fromkeys(keys), key=keys.count)
    count = keys.count(main)
    return main, [Finding(False, name + signing.SIGNATURE_SUFFIX,
                          f"made by key {key}, not by {main}, which made {count} of the {len(made)} signatures")
                  for name, key in made if key != main]


def _signer(run_dir: Path, signatures: dict[str, signing.Verification],
            allowed_signers: Optional[Path], key: Optional[str]) -> tuple[str, list[Finding]]:
    """Who signed (key: the bundle's signing key, _one_key's), in one line, and a finding when
    the bundle's own allowed_signers does not name the key (without a trust list of the
    customer's, that file is all that names it)."""
    good = [(name, v) for name, v in signatures.items() if v.ok and v.fingerprint == key]
    if not good:
        return "", []
    name, first = good[0]
    if allowed_signers is not None:
        return f"signed by {first.identity} ({first.fingerprint}), a key {allowed_signers} trusts", []
    own = run_dir / ALLOWED_SIGNERS_FILE
    identity, why = signing.named_signer(signing.signature_path(run_dir / name), own)
    untrusted = ("not checked against keys you trust: compare the fingerprint with the operator's, "
                 "or pass --allowed-signers")
    if identity is None:
        return f"signed by {first.fingerprint}; {untrusted}", [Finding(False, ALLOWED_SIGNERS_FILE, why)]
    return (f"signed by {identity} ({first.fingerprint}), as the run's own {ALLOWED_SIGNERS_FILE} names the key; "
            f"{untrusted}"), []


def _walk(run_dir: Path) -> tuple[dict[str, Path], dict[str, str], list[tuple[str, OSError]]]:
    """(regular files, other entries with what they are, what could not be read) under run_dir,
    by relative path with /, sorted; links are never followed."""
    regular: dict[str, Path] = {}
    odd: dict[str, str] = {}
    unreadable: list[tuple[str, OSError]] = []

    def relative_of(path: str) -> str:
        return Path(os.path.relpath(path, run_dir)).as_posix()

    def failed(error: OSError) -> None:
        unreadable.append((relative_of(error.filename), error))

    for folder, folders, names in os.walk(run_dir, onerror=failed, followlinks=False):
        for name in folders:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                odd[relative_of(path)] = "a symbolic link"
        for name in names:
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError as error:
                unreadable.append((relative_of(path), error))
                continue
            if stat.S_ISREG(mode):
                regular[relative_of(path)] = Path(path)
            else:
                odd[relative_of(path)] = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
    return dict(sorted(regular.items())), dict(sorted(odd.items())), unreadable


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@cache
def _validator() -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
