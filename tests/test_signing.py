"""SSHSIG signing checked against the real ssh-keygen, both ways, since customers verify with it."""
from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest

from reports.signing import (
    NAMESPACE,
    SigningError,
    SigningKey,
    default_key_path,
    ensure_default_key,
    load_signing_key,
    sign_file,
    verify_file,
    write_allowed_signers,
)

SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
IDENTITY = "qa@vendor.example"

pytestmark = pytest.mark.skipif(
    not os.access(SSH_KEYGEN, os.X_OK), reason="OpenSSH ssh-keygen is needed for interop tests"
)


def ssh_keygen(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [SSH_KEYGEN, *args], input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        check=False, timeout=60,
    )


def make_keygen_key(path: Path, key_type: str = "ed25519", *, passphrase: str = "",
                    comment: str = "alice@example.com", options: Sequence[str] = ()) -> Path:
    result = ssh_keygen("-q", "-t", key_type, *options, "-N", passphrase, "-C", comment,
                        "-f", str(path))
    assert result.returncode == 0, result.stderr.decode()
    return path


def keygen_verify(data: Path, sig: Path, allowed: Path, identity: str = IDENTITY,
                  namespace: str = NAMESPACE) -> subprocess.CompletedProcess[bytes]:
    return ssh_keygen("-Y", "verify", "-f", str(allowed), "-I", identity, "-n", namespace,
                      "-s", str(sig), stdin=data.read_bytes())


def keygen_sign(data: Path, key_path: Path, namespace: str = NAMESPACE,
                options: Sequence[str] = ()) -> Path:
    result = ssh_keygen("-Y", "sign", "-n", namespace, "-f", str(key_path), *options, str(data))
    assert result.returncode == 0, result.stderr.decode()
    return data.with_name(data.name + ".sig")


@pytest.fixture
def report(tmp_path: Path) -> Path:
    path = tmp_path / "report.html"
    path.write_bytes(b"<html><body>" + b"all checks passed\n" * 200 + b"</body></html>\n")
    return path


@pytest.fixture
def our_key(tmp_path: Path) -> SigningKey:
    key, created = ensure_default_key(tmp_path / "keys" / "signing_key")
    assert created
    return key


@pytest.fixture
def alice_key_path(tmp_path: Path) -> Path:
    return make_keygen_key(tmp_path / "alice")


# --- Interoperability ----------------------------------------------------------------------------


def test_our_signature_verifies_with_ssh_keygen_and_verify_file(tmp_path, report, our_key):
    sig = sign_file(report, our_key)
    allowed = write_allowed_signers(tmp_path / "allowed_signers", our_key, IDENTITY)

    assert sig == tmp_path / "report.html.sig"
    result = keygen_verify(report, sig, allowed)
    assert result.returncode == 0, result.stderr.decode()
    assert f'Good "{NAMESPACE}" signature for {IDENTITY}' in result.stdout.decode()

    verification = verify_file(report, allowed_signers=allowed)
    assert verification.ok, verification.reason
    assert verification.identity == IDENTITY
    assert verification.fingerprint == our_key.fingerprint
    assert verification.file == report
    assert verification.reason == f"good signature by {IDENTITY}"


def test_signature_armor_matches_ssh_keygen_layout(report, our_key):
    lines = sign_file(report, our_key).read_text().splitlines()

    assert lines[0] == "-----BEGIN SSH SIGNATURE-----"
    assert lines[-1] == "-----END SSH SIGNATURE-----"
    assert all(len(line) == 70 for line in lines[1:-2])
    assert 0 < len(lines[-2]) <= 70
    assert base64.b64decode("".join(lines[1:-1])).startswith(b"SSHSIG\x00\x00\x00\x01")


def test_ssh_keygen_signature_verifies_with_verify_file(tmp_path, report, alice_key_path):
    alice = load_signing_key(alice_key_path)
    allowed = write_allowed_signers(tmp_path / "allowed_signers", alice, "alice@example.com")

    keygen_sign(report, alice_key_path)
    verification = verify_file(report, allowed_signers=allowed)

    assert verification.ok, verification.reason
    assert verification.identity == "alice@example.com"
    assert verification.fingerprint == alice.fingerprint


def test_sha256_signature_from_ssh_keygen_verifies(tmp_path, report, alice_key_path):
    keygen_sign(report, alice_key_path, options=["-O", "hashalg=sha256"])

    verification = verify_file(report)

    assert verification.ok, verification.reason


def test_ssh_keygen_reads_and_signs_with_the_key_we_create(tmp_path, report, our_key):
    derived = ssh_keygen("-y", "-f", str(our_key.path))
    assert derived.returncode == 0, derived.stderr.decode()
    assert derived.stdout.decode().strip() == our_key.public_line

    allowed = write_allowed_signers(tmp_path / "allowed_signers", our_key, IDENTITY)
    keygen_sign(report, our_key.path)
    assert verify_file(report, allowed_signers=allowed).ok


def test_signing_overwrites_a_previous_signature(tmp_path, report, our_key, alice_key_path):
    keygen_sign(report, alice_key_path)
    sign_file(report, our_key)

    assert verify_file(report).fingerprint == our_key.fingerprint


# --- Tampering and refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_changing_one_byte_fails_both_verifiers(tmp_path, report, our_key, position):
    sign_file(report, our_key)
    allowed = write_allowed_signers(tmp_path / "allowed_signers", our_key, IDENTITY)
    data = bytearray(report.read_bytes())
    index = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[position]
    data[index] ^= 0x01
    report.write_bytes(bytes(data))

    assert keygen_verify(report, tmp_path / "report.html.sig", allowed).returncode != 0
    verification = verify_file(report, allowed_signers=allowed)
    assert not verification.ok
    assert "signature mismatch" in verification.reason
    assert verification.identity is None


def test_signature_for_another_namespace_is_refused(report, alice_key_path):
    keygen_sign(report, alice_key_path, "other")

    verification = verify_file(report)

    assert not verification.ok
    assert 'namespace "other"' in verification.reason
    assert verification.fingerprint == load_signing_key(alice_key_path).fingerprint


def test_key_missing_from_allowed_signers_is_refused(tmp_path, report, our_key, alice_key_path):
    allowed = write_allowed_signers(tmp_path / "allowed_signers", load_signing_key(alice_key_path),
                                    "alice@example.com")
    sign_file(report, our_key)

    sig = tmp_path / "report.html.sig"
    assert keygen_verify(report, sig, allowed, "alice@example.com").returncode != 0
    verification = verify_file(report, allowed_signers=allowed)
    assert not verification.ok
    assert verification.identity is None
    assert verification.fingerprint == our_key.fingerprint
    assert f"key {our_key.fingerprint} is not listed in {allowed}" == verification.reason


def test_a_public_key_file_given_as_allowed_signers_is_named_as_such(tmp_path, report, our_key):
    """A customer handed the operator's .pub passes it as the trust list: ssh-keygen skips the
    line; the reason says what an allowed_signers line looks like. A binary file's skipped lines
    are counted past the first few."""
    sign_file(report, our_key)
    pub = tmp_path / "operator.pub"
    pub.write_text(our_key.public_line + "\n")
    assert keygen_verify(report, tmp_path / "report.html.sig", pub).returncode != 0
    assert verify_file(report, allowed_signers=pub).reason == (
        f"key {our_key.fingerprint} is not listed in {pub} (line 1 holds a public key alone, as a .pub file "
        'does; an allowed_signers line names the signer first: ops@example.com namespaces="handover" '
        "ssh-ed25519 AAAA...)")
    binary = tmp_path / "binary"
    binary.write_bytes(b"junk line\n" * 30)
    assert verify_file(report, allowed_signers=binary).reason.endswith(
        "(unparseable lines skipped: 1, 2, 3, 4, 5 and 25 more)")


def test_allowed_signers_with_comments_options_and_several_keys(tmp_path, report, our_key,
                                                               alice_key_path):
    alice_line = load_signing_key(alice_key_path).public_line
    ours = " ".join(our_key.public_line.split()[:2])
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(
        "# vendors we accept\n"
        "\n"
        f"alice@example.com {alice_line}\n"
        "this line is not an allowed signer\n"
        f'  qa@vendor.example,ops@vendor.example namespaces="git,handover",valid-after="20200101" '
        f"{ours} vendor key\n"
    )
    sign_file(report, our_key)

    verification = verify_file(report, allowed_signers=allowed)

    assert verification.ok, verification.reason
    assert verification.identity == "qa@vendor.example,ops@vendor.example"
    sig = tmp_path / "report.html.sig"
    assert keygen_verify(report, sig, allowed, "ops@vendor.example").returncode == 0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ('namespaces="git"', 'only for namespaces "git"'),
        ('valid-before="20200101Z"', "expired"),
        ('valid-after="29991231"', "valid only after"),
        ("cert-authority", "not listed"),
    ],
)
def test_allowed_signers_options_restrict_the_key(tmp_path, report, our_key, options, expected):
    ours = " ".join(our_key.public_line.split()[:2])
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"{IDENTITY} {options} {ours}\n")
    sign_file(report, our_key)

    verification = verify_file(report, allowed_signers=allowed)

    assert keygen_verify(report, tmp_path / "report.html.sig", allowed).returncode != 0
    assert not verification.ok
    assert expected in verification.reason


def test_without_allowed_signers_only_the_cryptography_is_checked(report, our_key):
    sign_file(report, our_key)

    verification = verify_file(report)

    assert verification.ok
    assert verification.identity is None
    assert verification.reason.startswith(f"good signature by {our_key.fingerprint}")
    assert "not checked against a trust list" in verification.reason


def test_signature_by_an_rsa_key_is_refused(tmp_path, report):
    rsa_key = make_keygen_key(tmp_path / "rsa", "rsa", options=["-b", "1024"])
    keygen_sign(report, rsa_key)

    verification = verify_file(report)

    assert not verification.ok
    assert "ssh-rsa" in verification.reason and "Ed25519" in verification.reason


def test_explicit_signature_path_is_used(tmp_path, report, our_key):
    moved = tmp_path / "elsewhere.sig"
    sign_file(report, our_key).rename(moved)

    assert not verify_file(report).ok
    assert verify_file(report, sig_path=moved).ok


def _armored(blob: bytes) -> str:
    encoded = base64.b64encode(blob).decode()
    return f"-----BEGIN SSH SIGNATURE-----\n{encoded}\n-----END SSH SIGNATURE-----\n"


def _truncated_signature(sig: Path) -> str:
    lines = sig.read_text().splitlines()
    return _armored(base64.b64decode("".join(lines[1:-1]))[:-10])


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda sig: sig.unlink(), "no signature"),
        (lambda sig: sig.write_text("hello\n"), "missing -----BEGIN SSH SIGNATURE----- header"),
        (lambda sig: sig.write_text(sig.read_text().replace("-----END SSH SIGNATURE-----", "")),
         "missing -----END SSH SIGNATURE----- footer"),
        (lambda sig: sig.write_text(sig.read_text().replace("U1NI", "U1N!", 1)), "invalid base64"),
        (lambda sig: sig.write_text(_armored(b"SSHSIG")), "truncated"),
        (lambda sig: sig.write_text(_truncated_signature(sig)), "truncated"),
        (lambda sig: sig.write_text(_armored(b"NOTSIG\x00\x00\x00\x01")), "magic"),
        (lambda sig: sig.write_bytes(b"\xff\xfe\x00binary"), "not ASCII"),
        (lambda sig: sig.write_text(sig.read_text() + "anything riding along\n"),
         "text after the -----END SSH SIGNATURE----- footer"),
    ],
    ids=["missing", "no-header", "no-footer", "bad-base64", "short-blob", "truncated", "bad-magic",
         "binary", "appended"],
)
def test_damaged_signature_is_reported_not_raised(report, our_key, damage, expected):
    sig = sign_file(report, our_key)
    damage(sig)

    verification = verify_file(report)

    assert not verification.ok
    assert expected in verification.reason
    assert "\n" not in verification.reason


def test_every_single_byte_change_to_the_signature_is_refused(report, our_key):
    sig = sign_file(report, our_key)
    lines = sig.read_text().splitlines()
    blob = base64.b64decode("".join(lines[1:-1]))

    for index in range(len(blob)):
        damaged = bytearray(blob)
        damaged[index] ^= 0x01
        sig.write_text(_armored(bytes(damaged)))
        verification = verify_file(report)
        assert not verification.ok, f"byte {index} changed and the signature still verified"


def test_missing_inputs_are_reported_not_raised(tmp_path, report, our_key):
    sign_file(report, our_key)

    missing_list = verify_file(report, allowed_signers=tmp_path / "absent")
    assert not missing_list.ok and "allowed signers file" in missing_list.reason

    report.unlink()
    missing_file = verify_file(report)
    assert not missing_file.ok and f"{report} not found" == missing_file.reason


# --- Keys ----------------------------------------------------------------------------------------


def test_fingerprint_matches_ssh_keygen(alice_key_path, our_key):
    for key in (load_signing_key(alice_key_path), our_key):
        listed = ssh_keygen("-l", "-f", str(key.path) + ".pub")
        assert listed.returncode == 0, listed.stderr.decode()
        assert listed.stdout.decode().split()[1] == key.fingerprint


def test_public_line_and_comment_come_from_the_pub_file(alice_key_path):
    key = load_signing_key(alice_key_path)

    assert key.public_line == alice_key_path.with_name("alice.pub").read_text().strip()
    assert key.comment == "alice@example.com"
    assert key.path == alice_key_path


def test_comment_falls_back_to_the_key_file(alice_key_path):
    alice_key_path.with_name("alice.pub").unlink()

    assert load_signing_key(alice_key_path).comment == "alice@example.com"


def test_comment_falls_back_to_user_at_host(tmp_path):
    key_path = make_keygen_key(tmp_path / "anonymous", comment="")

    assert "@" in load_signing_key(key_path).comment


def test_missing_key_file(tmp_path):
    with pytest.raises(SigningError, match="not found") as raised:
        load_signing_key(tmp_path / "absent")
    assert str(tmp_path / "absent") in str(raised.value)


@pytest.mark.parametrize("pem", [False, True], ids=["openssh", "pem"])
def test_rsa_key_is_refused(tmp_path, pem):
    path = make_keygen_key(tmp_path / "rsa", "rsa",
                           options=["-b", "1024", *(["-m", "PEM"] if pem else [])])

    with pytest.raises(SigningError) as raised:
        load_signing_key(path)
    assert str(raised.value) == f"only Ed25519 keys are supported: {path} is RSA"


@pytest.mark.parametrize("pem", [False, True], ids=["openssh", "pem"])
def test_dsa_key_is_refused_by_name_without_a_deprecation_warning(tmp_path, pem):
    path = make_keygen_key(tmp_path / "dsa", "dsa", options=["-m", "PEM"] if pem else [])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cryptography's DSA deprecation would reach the operator's terminal
        with pytest.raises(SigningError) as raised:
            load_signing_key(path)
    assert str(raised.value) == f"only Ed25519 keys are supported: {path} is DSA"


def test_passphrase_protected_key_is_refused(tmp_path):
    path = make_keygen_key(tmp_path / "locked", passphrase="secret")

    with pytest.raises(SigningError) as raised:
        load_signing_key(path)
    message = str(raised.value)
    assert message.startswith(f"{path} is passphrase-protected; ")
    assert "\n" not in message


@pytest.mark.parametrize(
    "content",
    [b"this is not a key\n", os.urandom(300),
     b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"],
    ids=["text", "random", "damaged-openssh"],
)
def test_garbage_file_is_refused(tmp_path, content):
    path = tmp_path / "garbage"
    path.write_bytes(content)

    with pytest.raises(SigningError, match="is not an OpenSSH private key") as raised:
        load_signing_key(path)
    assert str(path) in str(raised.value)


def test_public_key_given_instead_of_private(alice_key_path):
    with pytest.raises(SigningError, match="is a public key"):
        load_signing_key(alice_key_path.with_name("alice.pub"))


def test_signing_a_missing_file_names_it(tmp_path, our_key):
    with pytest.raises(SigningError, match="cannot sign .*absent.html"):
        sign_file(tmp_path / "absent.html", our_key)


def test_allowed_signers_line_format(tmp_path, our_key):
    path = write_allowed_signers(tmp_path / "allowed_signers", our_key, IDENTITY)

    key_type, key_base64 = our_key.public_line.split()[:2]
    assert path.read_text() == f'{IDENTITY} namespaces="handover" {key_type} {key_base64}\n'
    with pytest.raises(SigningError, match="identity"):
        write_allowed_signers(tmp_path / "bad", our_key, 'has "quotes"')


def test_identity_with_spaces_is_quoted_for_ssh_keygen(tmp_path, report, our_key):
    identity = "Jo Bloggs <jo@example.com>"
    allowed = write_allowed_signers(tmp_path / "allowed_signers", our_key, identity)
    sign_file(report, our_key)

    assert allowed.read_text().startswith(f'"{identity}" namespaces="handover" ')
    assert keygen_verify(report, tmp_path / "report.html.sig", allowed, identity).returncode == 0
    assert verify_file(report, allowed_signers=allowed).identity == identity


def test_default_key_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HANDOVER_HOME", str(tmp_path / "home"))
    assert default_key_path() == tmp_path / "home" / "signing_key"

    monkeypatch.delenv("HANDOVER_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_key_path() == tmp_path / ".config" / "handover" / "signing_key"


def test_ensure_default_key_creates_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HANDOVER_HOME", str(tmp_path / "handover"))

    first, created = ensure_default_key()
    assert created
    assert first.path == tmp_path / "handover" / "signing_key"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert first.comment.startswith("handover@")
    assert first.path.with_name("signing_key.pub").read_text() == first.public_line + "\n"

    second, created_again = ensure_default_key()
    assert not created_again
    assert second.fingerprint == first.fingerprint
    assert second.public_line == first.public_line
    assert sorted(p.name for p in first.path.parent.iterdir()) == ["signing_key", "signing_key.pub"]
