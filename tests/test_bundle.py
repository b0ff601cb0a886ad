"""A rendered run as the customer receives it: manifest.json, `handover verify RUN_DIR`, the
stock ssh-keygen and sha256sum commands of the README, and the report's Content-Security-Policy.

One real run (the system suite on this machine, seconds) is rendered once for the module;
every test that tampers works on its own copy.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from test_e2e import ROOT, handover, run_dir_of, run_suites

from reports import bundle, signing
from reports.bundle import BUNDLE_SIGNED
from reports.verify import verify_run

IDENTITY = "ops@example.com"  # the comment of conftest's sign_key
SIGNATURES = {f"{name}.sig" for name in BUNDLE_SIGNED}
# What the README tells a customer to type to list files the manifest does not know.
ADDED_FILES_COMMAND = ("find . -type f ! -regex '\\./\\(manifest\\.json\\|manifest\\.sha256\\|results\\.json\\.sig"
                       "\\|report\\.html\\.sig\\|manifest\\.json\\.sig\\|manifest\\.sha256\\.sig\\)' -printf '%P\\n' "
                       "| sort | comm -23 - <(cut -c67- manifest.sha256 | sort)")


@pytest.fixture(scope="module")
def rendered(sign_key, tmp_path_factory) -> Path:
    """The run directory of a real, signed run of the system suite on the local inventory."""
    out = tmp_path_factory.mktemp("bundle") / "out"
    done = run_suites(ROOT / "inventory" / "local.yaml", out, sign_key, "-m", "system")
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir_of(out, "local")


@pytest.fixture
def copy(rendered, tmp_path) -> Path:
    """A copy of the rendered run to tamper with."""
    target = tmp_path / "run"
    shutil.copytree(rendered, target, symlinks=True)
    return target


def files_under(run_dir: Path) -> set[str]:
    return {path.relative_to(run_dir).as_posix() for path in run_dir.rglob("*") if path.is_file()}


def raw_logs(run_dir: Path) -> list[str]:
    return sorted(name for name in files_under(run_dir) if name.startswith("raw/"))


def flip_byte(path: Path, index: int) -> None:
    data = bytearray(path.read_bytes())
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def problems(run_dir: Path, allowed_signers: Path | None = None) -> list[str]:
    return [str(finding) for finding in verify_run(run_dir, allowed_signers).problems]


def sha256sum_check(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sha256sum", "-c", "--strict", bundle.CHECKSUMS_FILE], cwd=run_dir,
                          capture_output=True, text=True)


def ssh_keygen_verify(run_dir: Path, name: str) -> subprocess.CompletedProcess[bytes]:
    with open(run_dir / name, "rb") as data:
        return subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(run_dir / "allowed_signers"),
                               "-I", IDENTITY, "-n", "handover", "-s", str(run_dir / f"{name}.sig")],
                              stdin=data, capture_output=True)


# --- The manifest --------------------------------------------------------------------------------


def test_manifest_lists_every_file_with_its_digest_and_matches_its_schema(rendered):
    manifest = json.loads((rendered / bundle.MANIFEST_FILE).read_text())
    schema = json.loads(bundle.SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    assert not list(Draft202012Validator(schema).iter_errors(manifest))

    assert manifest["schema"] == "handover.manifest/1"
    assert manifest["run_id"] == json.loads((rendered / "results.json").read_text())["run"]["run_id"]
    paths = [entry["path"] for entry in manifest["files"]]
    assert paths == sorted(paths)
    assert set(paths) == files_under(rendered) - SIGNATURES - set(bundle.MANIFEST_FILES)
    assert {"ledger.jsonl", "results.json", "report.html", "junit.xml", "metrics.csv",
            "allowed_signers", "raw/system_facts/localhost.stdout"} <= set(paths)
    for entry in manifest["files"]:
        data = (rendered / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), entry["path"]
        assert entry["bytes"] == len(data), entry["path"]
    assert (rendered / bundle.CHECKSUMS_FILE).read_text().splitlines() == [
        f"{entry['sha256']}  {entry['path']}" for entry in manifest["files"]]


def test_schema_refuses_paths_that_leave_the_run_directory():
    """Made-up manifests (not from a run): the schema is what keeps verify inside RUN_DIR."""
    entry = {"sha256": "0" * 64, "bytes": 0}
    validator = Draft202012Validator(json.loads(bundle.SCHEMA_PATH.read_text()))
    for bad in ("/etc/passwd", "../x", "raw/../../x", "raw//x", "raw/", ".", "a\\b", "a\nb"):
        document = {"schema": "handover.manifest/1", "run_id": "x", "files": [{"path": bad, **entry}]}
        assert list(validator.iter_errors(document)), bad
    good = {"schema": "handover.manifest/1", "run_id": "x", "files": [{"path": "raw/.hidden/a.sig", **entry}]}
    assert not list(validator.iter_errors(good))


# --- handover verify ------------------------------------------------------------------------------


def test_verify_passes_and_says_who_signed(rendered, trusted_signers):
    trusted = handover("verify", rendered, "--allowed-signers", trusted_signers)
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    lines = trusted.stdout.splitlines()
    for name in BUNDLE_SIGNED:
        assert f"OK  {name}: good signature by {IDENTITY}" in lines
    assert any(line.startswith("OK  manifest.json: run ") and "none missing, none added" in line for line in lines)
    fingerprint = signing.verify_file(rendered / "report.html").fingerprint
    assert lines[-1] == f"signed by {IDENTITY} ({fingerprint}), a key {trusted_signers} trusts"
    run = json.loads((rendered / "results.json").read_text())  # what was verified: the run it is
    assert lines[-2] == (f"the run: report {run['run']['report_id']} of cluster local, 1 node(s), finished "
                         f"{run['run']['finished']}, verdict {run['verdict']['status']}")

    untrusted = handover("verify", rendered)
    assert untrusted.returncode == 3, untrusted.stdout + untrusted.stderr
    assert untrusted.stdout.splitlines()[-1].startswith(
        f"signed by {IDENTITY} ({fingerprint}), as the run's own allowed_signers names the key; "
        "not checked against keys you trust")
    assert untrusted.stderr == (f"handover: {rendered}: every file is as signed, but the signer is not checked "
                                "against keys you trust: pass --allowed-signers with the operator's key, "
                                "obtained apart from the run\n")


def test_the_run_directorys_own_allowed_signers_vouches_for_nothing(rendered):
    """Whoever changed the files re-signs them and writes their own key into the run's
    allowed_signers: given as the trust list, it would vouch for them. It is taken for none."""
    own = handover("verify", rendered, "--allowed-signers", rendered / "allowed_signers")
    assert own.returncode == 3, own.stdout + own.stderr
    assert f"-- {rendered / 'allowed_signers'}: is inside the run directory: a list that came with the files " \
           "names whatever key signed them, so the signer is not checked against keys you trust" in own.stdout
    assert "as the run's own allowed_signers names the key; not checked" in own.stdout.splitlines()[-1]


def test_a_bundle_forged_with_another_key_fails_only_against_the_customers_list(copy, tmp_path, trusted_signers):
    """results.json changed, every signature remade and the bundle re-sealed by another key with
    the operator's name, which the run's own allowed_signers now gives it: the files agree with
    their signatures, so only the customer's list of keys tells the forgery apart."""
    forger, _ = signing.ensure_default_key(tmp_path / "forger" / "signing_key")
    results = json.loads((copy / "results.json").read_text())
    results["verdict"]["reasons"] = ["FORGED: 99 checks passed"]
    (copy / "results.json").write_text(json.dumps(results))
    for name in ("results.json", "report.html"):
        signing.sign_file(copy / name, forger)
    signing.write_allowed_signers(copy / "allowed_signers", forger, IDENTITY)
    bundle.seal(copy, results["run"]["run_id"], forger, BUNDLE_SIGNED)

    unchecked = handover("verify", copy)
    assert unchecked.returncode == 3, unchecked.stdout + unchecked.stderr
    assert f"({forger.fingerprint}), as the run's own allowed_signers names the key" in unchecked.stdout
    checked = handover("verify", copy, "--allowed-signers", trusted_signers)
    assert checked.returncode == 1, checked.stdout
    assert checked.stdout.count(f"key {forger.fingerprint} is not listed in {trusted_signers}") == 4


def test_one_changed_byte_of_any_raw_log_fails_verify_naming_that_file(copy):
    logs = raw_logs(copy)
    assert logs
    for name in logs:
        original = (copy / name).read_bytes()
        for index in (0, len(original) // 2, len(original) - 1):
            flip_byte(copy / name, index)
            assert problems(copy) == [f"BAD {name}: SHA-256 is not the one manifest.json lists "
                                      f"({len(original)} bytes now, {len(original)} listed): changed after signing"]
            (copy / name).write_bytes(original)
    assert problems(copy) == []

    flip_byte(copy / logs[0], 0)
    done = handover("verify", copy)
    assert done.returncode == 1
    assert f"BAD {logs[0]}: SHA-256 is not the one manifest.json lists" in done.stdout
    assert done.stderr == f"handover: {copy}: 1 problem(s); do not trust this run's files\n"


def test_changed_ledger_and_renderings_fail_too(copy):
    for name in ("ledger.jsonl", "junit.xml", "metrics.csv", "allowed_signers"):
        flip_byte(copy / name, 0)
    found = problems(copy)
    for name in ("ledger.jsonl", "junit.xml", "metrics.csv", "allowed_signers"):
        assert any(line.startswith(f"BAD {name}: SHA-256 is not the one") for line in found), name


def test_changed_report_fails_its_signature_and_its_digest(copy):
    flip_byte(copy / "report.html", 100)
    found = problems(copy)
    assert len(found) == 2
    assert found[0].startswith("BAD report.html: signature mismatch")
    assert found[1].startswith("BAD report.html: SHA-256 is not the one manifest.json lists")


def test_a_missing_file_is_named(copy):
    (copy / "raw" / "system_facts" / "localhost.stdout").unlink()
    assert problems(copy) == ["BAD raw/system_facts/localhost.stdout: missing: manifest.json lists it"]


def test_added_files_are_named_even_when_called_sig(copy):
    (copy / "raw" / "system_facts" / "node9.stdout").write_text("a log nobody signed\n")
    (copy / "raw" / "system_facts" / "localhost.stdout.sig").write_text("looks like a signature\n")
    (copy / "evil.sig").write_text("so does this\n")
    assert problems(copy) == [
        "BAD evil.sig: not in manifest.json: added after signing",
        "BAD raw/system_facts/localhost.stdout.sig: not in manifest.json: added after signing",
        "BAD raw/system_facts/node9.stdout: not in manifest.json: added after signing",
    ]


def test_a_link_in_the_run_directory_is_named_and_not_followed(copy, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_bytes((copy / "ledger.jsonl").read_bytes())
    (copy / "ledger.jsonl").unlink()
    (copy / "ledger.jsonl").symlink_to(outside)
    assert problems(copy) == ["BAD ledger.jsonl: is a symbolic link, not the regular file manifest.json lists"]


def test_a_changed_manifest_fails_its_signature_and_the_checksum_list(copy):
    manifest = json.loads((copy / bundle.MANIFEST_FILE).read_text())
    manifest["files"] = [e for e in manifest["files"] if e["path"] != "raw/system_facts/localhost.stdout"]
    (copy / bundle.MANIFEST_FILE).write_text(bundle.manifest_text(manifest))
    found = problems(copy)
    assert found[0].startswith("BAD manifest.json: signature mismatch")
    assert found[1] == "BAD manifest.sha256: does not list the digests manifest.json lists"
    assert found[2] == "BAD raw/system_facts/localhost.stdout: not in manifest.json: added after signing"


@pytest.mark.parametrize(("text", "expected"), [
    ("not json", "BAD manifest.json: not JSON: "),
    ('{"schema": "handover.manifest/1", "run_id": "x", "files": [{"path": "../../etc/passwd", '
     '"sha256": "' + "0" * 64 + '", "bytes": 1}]}', "BAD manifest.json: does not match manifest.schema.json "
     "at files/0/path: "),
    ('{"schema": "handover.manifest/2", "run_id": "x", "files": []}',
     "BAD manifest.json: does not match manifest.schema.json at schema: "),
], ids=["not-json", "path-escapes", "other-version"])
def test_a_manifest_that_is_not_one_is_one_line(copy, text, expected):
    """Made-up manifest texts, written over a real run's."""
    (copy / bundle.MANIFEST_FILE).write_text(text)
    lines = problems(copy)
    assert [line for line in lines if line.startswith(expected)], lines
    assert all("\n" not in line for line in lines)


def test_a_missing_manifest_fails_verify(copy):
    (copy / bundle.MANIFEST_FILE).unlink()
    found = problems(copy)
    assert found[0].startswith("BAD manifest.json: ") and "not found" in found[0]  # its signature
    assert "BAD manifest.json: not found, so no file of the run can be checked against its digest" in found


def test_a_signature_by_another_key_is_named(copy, tmp_path, trusted_signers):
    other, _ = signing.ensure_default_key(tmp_path / "other" / "signing_key")
    first = signing.verify_file(copy / "results.json").fingerprint
    signing.sign_file(copy / bundle.MANIFEST_FILE, other)

    assert problems(copy) == [f"BAD manifest.json.sig: made by key {other.fingerprint}, not by {first}, "
                              "which made 3 of the 4 signatures"]
    trusted = problems(copy, trusted_signers)
    assert any(line.startswith(f"BAD manifest.json: key {other.fingerprint} is not listed in ")
               for line in trusted), trusted


def test_an_allowed_signers_that_does_not_name_the_key_is_named(copy, tmp_path, sign_key):
    """A run whose own allowed_signers names another key, re-sealed so only that file is wrong."""
    other, _ = signing.ensure_default_key(tmp_path / "other" / "signing_key")
    signing.write_allowed_signers(copy / "allowed_signers", other, "mallory@example.com")
    operator = signing.load_signing_key(sign_key)
    bundle.seal(copy, json.loads((copy / "manifest.json").read_text())["run_id"], operator, BUNDLE_SIGNED)
    assert problems(copy) == [
        f"BAD allowed_signers: key {operator.fingerprint} is not listed in {copy / 'allowed_signers'}"]


def test_a_file_name_cannot_forge_or_erase_a_line_of_the_answer(copy):
    """An added file named with a newline and an OK line, one with a terminal's erase-line
    sequence, one whose name is not UTF-8: each is one escaped BAD line."""
    forged = "x\nOK  manifest.json: run 1: 40 files, none missing, none added"
    for name in (forged, "y\x1b[1A\x1b[2K", os.fsdecode(b"bad\xff.txt")):
        (copy / name).write_text("added\n")
    done = subprocess.run([sys.executable, "-m", "handover.cli", "verify", str(copy)], cwd=ROOT,
                          capture_output=True, env={**os.environ, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr
    lines = done.stdout.decode().splitlines()
    assert "BAD x\\nOK  manifest.json: run 1: 40 files, none missing, none added: not in manifest.json: " \
           "added after signing" in lines
    assert "BAD y\\x1b[1A\\x1b[2K: not in manifest.json: added after signing" in lines
    assert "BAD bad\\udcff.txt: not in manifest.json: added after signing" in lines
    assert not any(line.startswith("OK  manifest.json: run") for line in lines)


def test_a_fifo_where_a_signature_belongs_is_named_without_hanging(copy):
    """A plain open() of a FIFO waits for a writer for ever."""
    (copy / "report.html.sig").unlink()
    os.mkfifo(copy / "report.html.sig")
    done = handover("verify", copy)
    assert done.returncode == 1, done.stdout
    assert f"BAD report.html: cannot read {copy / 'report.html.sig'}: not a regular file" in done.stdout


def test_verify_says_in_one_line_what_it_cannot_read(copy, tmp_path):
    not_a_directory = handover("verify", copy / "results.json")
    assert not_a_directory.returncode == 2
    assert not_a_directory.stderr == f"handover: {copy / 'results.json'}: not a directory; give the run directory\n"
    os.mkfifo(tmp_path / "signers")
    fifo = handover("verify", copy, "--allowed-signers", tmp_path / "signers")
    assert (fifo.returncode, fifo.stderr) == (2, f"handover: {tmp_path / 'signers'}: cannot read: not a regular file\n")


def test_a_malformed_trust_list_line_or_results_document_is_a_finding_not_a_traceback(copy, tmp_path, sign_key):
    signers = tmp_path / "signers"
    signers.write_text(f'ops@example.com namespaces="handover",valid-before="00010101" '
                       f'{Path(f"{sign_key}.pub").read_text()}')
    done = handover("verify", copy, "--allowed-signers", signers)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "is not listed in" in done.stdout
    (copy / "results.json").write_text('{"run": [1]}')
    shaped = handover("verify", copy)
    assert shaped.returncode == 1 and "Traceback" not in shaped.stderr, shaped.stderr
    assert "BAD results.json: signature mismatch" in shaped.stdout


def test_a_killed_writers_temporary_file_is_not_sealed_into_the_bundle(copy, sign_key, trusted_signers):
    """A harness SIGKILLed between writing results.json's temporary copy and renaming it leaves
    `.results.json.XXXXXXXX` (a whole older results.json); rendering the run again sealed it in,
    signed. It is removed before the manifest is made (so is one under raw/)."""
    stale = [copy / ".results.json.r92doopu", copy / "raw" / "system_facts" / ".localhost.stdout.a1b2c3d4"]
    for path in stale:
        path.write_bytes((copy / "results.json").read_bytes())
    rendered = handover("report", copy, "--sign-key", sign_key)
    assert rendered.returncode == 0, rendered.stderr
    assert not any(path.exists() for path in stale)
    listed = [entry["path"] for entry in json.loads((copy / bundle.MANIFEST_FILE).read_text())["files"]]
    assert not [path for path in listed if path.rpartition("/")[2].startswith(".")]
    assert handover("verify", copy, "--allowed-signers", trusted_signers).returncode == 0


# --- Without handover: ssh-keygen and sha256sum -----------------------------------------------------


def test_stock_ssh_keygen_accepts_every_signature_of_the_bundle(rendered):
    for name in BUNDLE_SIGNED:
        done = ssh_keygen_verify(rendered, name)
        assert done.returncode == 0, (name, done.stderr.decode())
        assert f'Good "handover" signature for {IDENTITY}' in done.stdout.decode()


def test_stock_ssh_keygen_refuses_a_changed_manifest(copy):
    flip_byte(copy / bundle.CHECKSUMS_FILE, 0)
    assert ssh_keygen_verify(copy, bundle.CHECKSUMS_FILE).returncode != 0
    assert ssh_keygen_verify(copy, bundle.MANIFEST_FILE).returncode == 0


def test_sha256sum_passes_on_the_bundle_and_fails_on_one_changed_byte(rendered, copy):
    untouched = sha256sum_check(rendered)
    assert untouched.returncode == 0, untouched.stdout + untouched.stderr
    assert untouched.stdout.count(": OK\n") == len((rendered / bundle.CHECKSUMS_FILE).read_text().splitlines())

    log = raw_logs(copy)[0]
    flip_byte(copy / log, 0)
    changed = sha256sum_check(copy)
    assert changed.returncode == 1
    assert f"{log}: FAILED\n" in changed.stdout


def test_the_readme_command_lists_added_files_and_nothing_else(rendered, copy):
    def added(run_dir: Path) -> str:
        done = subprocess.run(["bash", "-c", ADDED_FILES_COMMAND], cwd=run_dir, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert added(rendered) == ""
    (copy / "raw" / "late.stdout").write_text("added\n")
    (copy / "raw" / "late.sig").write_text("added\n")
    (copy / "late.sig").write_text("added\n")
    assert added(copy) == "late.sig\nraw/late.sig\nraw/late.stdout\n"
    assert ADDED_FILES_COMMAND in (ROOT / "README.md").read_text()


# --- The report's Content-Security-Policy -------------------------------------------------------------


class _Page(HTMLParser):
    """The head's meta CSP, and every inline script and style, as a browser would see them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.csp: list[tuple[int, str]] = []  # (position among elements, content)
        self.elements: list[tuple[str, dict]] = []
        self.inline: dict[str, list[str]] = {"script": [], "style": []}
        self._open: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        self.elements.append((tag, attributes))
        if tag == "meta" and attributes.get("http-equiv", "").lower() == "content-security-policy":
            self.csp.append((len(self.elements) - 1, attributes.get("content", "")))
        if tag in self.inline:
            self._open, self._text = tag, []

    def handle_data(self, data):
        if self._open:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == self._open:
            self.inline[tag].append("".join(self._text))
            self._open = None


def policy(content: str) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for part in content.split(";"):
        words = part.split()
        if words:
            directives.setdefault(words[0].lower(), words[1:])
    return directives


def allows_inline(directives: dict[str, list[str]], kind: str, text: str) -> bool:
    """Whether the policy runs this inline <script> or <style> (CSP Level 3 fallbacks)."""
    sources = directives.get(f"{kind}-src-elem", directives.get(f"{kind}-src", directives.get("default-src", [])))
    if "'unsafe-inline'" in sources and not any(s.startswith(("'sha", "'nonce-")) for s in sources):
        return True
    digests = {f"'{name}-{base64.b64encode(hashlib.new(name, text.encode()).digest()).decode()}'"
               for name in ("sha256", "sha384", "sha512")}
    return bool(digests & set(sources))


@pytest.fixture(scope="module")
def page(rendered) -> tuple[str, _Page]:
    html = (rendered / "report.html").read_text()
    parsed = _Page()
    parsed.feed(html)
    return html, parsed


def test_report_csp_forbids_every_external_load(page):
    _, parsed = page
    assert len(parsed.csp) == 1
    position, content = parsed.csp[0]
    before = [tag for tag, _ in parsed.elements[:position]]
    assert set(before) <= {"html", "head", "meta"}, "the policy must come before anything that loads"
    directives = policy(content)
    assert directives["default-src"] == ["'none'"]
    assert directives["base-uri"] == ["'none'"] and directives["form-action"] == ["'none'"]
    keywords = {"'none'", "'unsafe-inline'"}
    for name, sources in directives.items():
        for source in sources:
            assert source in keywords or re.fullmatch(r"'sha(256|384|512)-[A-Za-z0-9+/]+=*'", source), \
                f"{name} allows {source}: a host, scheme or 'self' is a load from outside the page"


def test_report_own_inline_styles_and_scripts_run_under_its_csp(page):
    html, parsed = page
    directives = policy(parsed.csp[0][1])
    assert parsed.inline["style"], "the report carries its style inline"
    for kind in ("style", "script"):
        for text in parsed.inline[kind]:
            assert allows_inline(directives, kind, text), f"an inline <{kind}> the policy blocks"
    attribute_styles = [attrs["style"] for _, attrs in parsed.elements if "style" in attrs]
    if attribute_styles:
        sources = directives.get("style-src-attr", directives.get("style-src", []))
        assert "'unsafe-inline'" in sources, "style= attributes need 'unsafe-inline'"
    handlers = [name for _, attrs in parsed.elements for name in attrs if name.startswith("on")]
    assert not handlers, f"inline event handlers never run under this policy: {handlers}"
    fetching = [(tag, name) for tag, attrs in parsed.elements for name in attrs
                if name in ("src", "srcset", "data", "poster", "action", "formaction")]
    assert not fetching and "<link" not in html.lower()
