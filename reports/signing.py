"""Ed25519 signatures in OpenSSH's SSHSIG format, so a customer can check a run with ssh-keygen.

A run directory ships report.html.sig and results.json.sig beside the files they cover; whoever
holds the allowed_signers line can check them with

    ssh-keygen -Y verify -f allowed_signers -I <identity> -n handover \
        -s report.html.sig < report.html

The format (OpenSSH PROTOCOL.sshsig) is implemented on `cryptography` rather than by calling
ssh-keygen, so signing works on hosts without OpenSSH and verification gives a reason, not an
exit code.
"""
from __future__ import annotations

import base64
import binascii
import datetime
import getpass
import hashlib
import os
import re
import socket
import struct
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional, Union

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.utils import CryptographyDeprecationWarning

from reports.files import open_regular, read_regular, write_atomically

NAMESPACE = "handover"
SIGNATURE_SUFFIX = ".sig"

_ED25519 = "ssh-ed25519"
_SIGN_HASH = "sha512"
_HASHES = {"sha512": hashlib.sha512, "sha256": hashlib.sha256}

_SIG_MAGIC = b"SSHSIG"
_SIG_VERSION = 1
_SIG_BEGIN = "-----BEGIN SSH SIGNATURE-----"
_SIG_END = "-----END SSH SIGNATURE-----"

_KEY_MAGIC = b"openssh-key-v1\x00"
_KEY_BEGIN = "-----BEGIN OPENSSH PRIVATE KEY-----"
_KEY_END = "-----END OPENSSH PRIVATE KEY-----"
_KEY_BLOCK_SIZE = 8  # cipher block size OpenSSH pads unencrypted private sections to

_ARMOR_WIDTH = 70  # ssh-keygen wraps armored base64 at 70 columns
_READ_CHUNK = 1 << 20

StrPath = Union[str, "os.PathLike[str]"]


class SigningError(Exception):
    """A signing key or file could not be used; str() is one line naming the file and problem."""


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 key ready to sign, with what a customer needs to trust it."""

    private_key: Ed25519PrivateKey = field(repr=False)
    public_line: str  # "ssh-ed25519 AAAA... comment" as in a .pub file
    fingerprint: str  # "SHA256:..." as `ssh-keygen -l` prints it
    comment: str
    path: Path


@dataclass(frozen=True)
class Verification:
    """The outcome of checking one signed file; returned, never raised, so every failure shows."""

    ok: bool
    file: Path
    fingerprint: Optional[str]  # of the key inside the signature, when it could be read
    identity: Optional[str]  # allowed_signers principals that matched, when a trust list was given
    reason: str


# --- SSH wire encoding -------------------------------------------------------------------------


class _Malformed(ValueError):
    """Bytes that do not follow the expected SSH wire layout; the message says what is wrong."""


def _string(data: Union[bytes, str]) -> bytes:
    """SSH `string`: uint32 length, then the bytes."""
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


class _Reader:
    """Reads SSH wire fields from a blob, raising _Malformed instead of running off its end."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._offset = 0

    def take(self, count: int) -> bytes:
        end = self._offset + count
        if end > len(self._data):
            raise _Malformed("truncated")
        chunk = self._data[self._offset:end]
        self._offset = end
        return chunk

    def uint32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def string(self) -> bytes:
        return self.take(self.uint32())

    def text(self) -> str:
        try:
            return self.string().decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed("a text field is not UTF-8") from None

    def expect_end(self, what: str) -> None:
        if self._offset != len(self._data):
            raise _Malformed(f"trailing bytes after the {what}")


def _armor(blob: bytes, begin: str, end: str) -> str:
    encoded = base64.b64encode(blob).decode("ascii")
    lines = [encoded[i:i + _ARMOR_WIDTH] for i in range(0, len(encoded), _ARMOR_WIDTH)]
    return "\n".join([begin, *lines, end]) + "\n"


def _dearmor(text: str, begin: str, end: str) -> bytes:
    body = text.strip()
    if not body.startswith(begin):
        raise _Malformed(f"missing {begin} header")
    end_at = body.find(end, len(begin))
    if end_at < 0:
        raise _Malformed(f"missing {end} footer")
    if body[end_at + len(end):].strip():
        raise _Malformed(f"text after the {end} footer")  # nothing may ride along with a signature
    try:
        return base64.b64decode("".join(body[len(begin):end_at].split()), validate=True)
    except (binascii.Error, ValueError):
        raise _Malformed("invalid base64 between the armor lines") from None


def _key_type_of(public_blob: bytes) -> str:
    return _Reader(public_blob).text()


def _ed25519_public_blob(public_key: Ed25519PublicKey) -> bytes:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _string(_ED25519) + _string(raw)


def _fingerprint(public_blob: bytes) -> str:
    digest = base64.b64encode(hashlib.sha256(public_blob).digest()).decode("ascii")
    return "SHA256:" + digest.rstrip("=")


def _key_type_label(key_type: str) -> str:
    """How an error names a key type: RSA, ECDSA, DSA, or the SSH name for anything rarer."""
    if key_type.startswith("sk-"):
        return f"a FIDO security key ({key_type})"
    if key_type.startswith("ssh-rsa"):
        return "RSA"
    if key_type.startswith("ecdsa-"):
        return "ECDSA"
    if key_type.startswith("ssh-dss"):
        return "DSA"
    return key_type


# --- Keys ---------------------------------------------------------------------------------------


class _OpenSSHKeyFile(NamedTuple):
    key_type: str
    encrypted: bool
    comment: str  # only readable from unencrypted Ed25519 keys; "" otherwise


def _parse_openssh_key_file(blob: bytes) -> _OpenSSHKeyFile:
    """Read the openssh-key-v1 envelope: the key type, whether it is encrypted, the comment."""
    reader = _Reader(blob)
    if reader.take(len(_KEY_MAGIC)) != _KEY_MAGIC:
        raise _Malformed("no openssh-key-v1 magic")
    cipher = reader.text()
    reader.string()  # kdf name
    reader.string()  # kdf options
    if reader.uint32() != 1:
        raise _Malformed("holds other than one key")
    key_type = _key_type_of(reader.string())
    private_section = reader.string()
    encrypted = cipher != "none"
    comment = ""
    if not encrypted and key_type == _ED25519:
        section = _Reader(private_section)
        section.uint32()  # check integers
        section.uint32()
        section.text()  # key type
        section.string()  # public key
        section.string()  # private key
        comment = section.string().decode("utf-8", errors="replace")
    return _OpenSSHKeyFile(key_type, encrypted, comment)


def _openssh_private_key_bytes(private_key: Ed25519PrivateKey, comment: str) -> bytes:
    """An unencrypted openssh-key-v1 file with the comment inside, as `ssh-keygen -N ''` writes."""
    seed = private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    public = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    check = os.urandom(4)
    section = (
        check
        + check
        + _string(_ED25519)
        + _string(public)
        + _string(seed + public)
        + _string(comment)
    )
    section += bytes(range(1, 1 + (-len(section)) % _KEY_BLOCK_SIZE))
    blob = (
        _KEY_MAGIC
        + _string("none")
        + _string("none")
        + _string(b"")
        + struct.pack(">I", 1)
        + _string(_ed25519_public_blob(private_key.public_key()))
        + _string(section)
    )
    return _armor(blob, _KEY_BEGIN, _KEY_END).encode("ascii")


def _passphrase_error(path: Path) -> SigningError:
    return SigningError(
        f"{path} is passphrase-protected; handover signs unattended, so use a key without a "
        f"passphrase (remove it with `ssh-keygen -p -f {path}`) or let handover create its own"
    )


def _not_ed25519_error(path: Path, label: str) -> SigningError:
    return SigningError(f"only Ed25519 keys are supported: {path} is {label}")


def _load_openssh_key(path: Path, data: bytes) -> tuple[Ed25519PrivateKey, str]:
    try:
        envelope = _parse_openssh_key_file(_dearmor(data.decode("ascii"), _KEY_BEGIN, _KEY_END))
    except (_Malformed, UnicodeDecodeError):
        raise SigningError(f"{path} is not an OpenSSH private key: the file is damaged") from None
    if envelope.key_type != _ED25519:
        raise _not_ed25519_error(path, _key_type_label(envelope.key_type))
    if envelope.encrypted:
        raise _passphrase_error(path)
    try:
        private_key = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"{path} is not a usable OpenSSH private key: {exc}") from None
    if not isinstance(private_key, Ed25519PrivateKey):
        raise _not_ed25519_error(path, type(private_key).__name__)
    return private_key, envelope.comment


def _load_pem_key(path: Path, data: bytes) -> Ed25519PrivateKey:
    """PEM/PKCS#8 keys (`ssh-keygen -m PEM`): accepted when Ed25519, named precisely when not."""
    # A DSA key is refused like any other, without cryptography's warning that DSA is deprecated
    # (raised when one is loaded or its type is named) reaching the operator's terminal.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        try:
            private_key = serialization.load_pem_private_key(data, password=None)
        except TypeError:
            raise _passphrase_error(path) from None
        except (ValueError, UnsupportedAlgorithm):
            raise SigningError(f"{path} is not an OpenSSH private key") from None
        if isinstance(private_key, Ed25519PrivateKey):
            return private_key
        labels = {rsa.RSAPrivateKey: "RSA", ec.EllipticCurvePrivateKey: "ECDSA",
                  dsa.DSAPrivateKey: "DSA", ed448.Ed448PrivateKey: "Ed448"}
        label = next((name for kind, name in labels.items() if isinstance(private_key, kind)),
                     type(private_key).__name__)
    raise _not_ed25519_error(path, label)


def _pub_path(path: Path) -> Path:
    return path.with_name(path.name + ".pub")


def _pub_file_comment(path: Path, public_blob: bytes) -> str:
    """The comment of the .pub beside a key, if that file holds the same key and has one."""
    try:
        fields = _pub_path(path).read_text(encoding="utf-8", errors="replace").split(None, 2)
        matches = len(fields) >= 2 and base64.b64decode(fields[1], validate=True) == public_blob
    except (OSError, binascii.Error, ValueError):
        return ""
    return fields[2].strip() if matches and len(fields) == 3 else ""


def _user_at_host() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _signing_key(private_key: Ed25519PrivateKey, comment: str, path: Path) -> SigningKey:
    public_blob = _ed25519_public_blob(private_key.public_key())
    public_line = f"{_ED25519} {base64.b64encode(public_blob).decode('ascii')}"
    return SigningKey(
        private_key=private_key,
        public_line=f"{public_line} {comment}" if comment else public_line,
        fingerprint=_fingerprint(public_blob),
        comment=comment,
        path=path,
    )


def load_signing_key(path: StrPath) -> SigningKey:
    """Load an unencrypted Ed25519 OpenSSH private key, or fail with a line a person can act on."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SigningError(f"signing key {path} not found") from None
    except IsADirectoryError:
        raise SigningError(f"signing key {path} is a directory, not a key file") from None
    except OSError as exc:
        raise SigningError(f"cannot read signing key {path}: {exc.strerror or exc}") from None

    head = data.lstrip()
    file_comment = ""
    if head.startswith(_KEY_BEGIN.encode()):
        private_key, file_comment = _load_openssh_key(path, data)
    elif head.startswith(b"-----BEGIN ") and b"PRIVATE KEY-----" in head[:64]:
        private_key = _load_pem_key(path, data)
    elif re.match(rb"(ssh-|ecdsa-|sk-)\S+ AAAA", head):
        raise SigningError(f"{path} is a public key; give the private key file (without .pub)")
    else:
        raise SigningError(f"{path} is not an OpenSSH private key")

    public_blob = _ed25519_public_blob(private_key.public_key())
    comment = _pub_file_comment(path, public_blob) or file_comment or _user_at_host()
    return _signing_key(private_key, comment, path)


def default_key_path() -> Path:
    """Where handover keeps its own key, so every run on a host signs with the same one."""
    home = os.environ.get("HANDOVER_HOME")
    if home:
        return Path(home).expanduser() / "signing_key"
    return Path.home() / ".config" / "handover" / "signing_key"


def _create_exclusively(path: Path, data: bytes) -> bool:
    """Write a complete 0600 file at path unless one exists; False when another process won."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)


def ensure_default_key(path: Optional[Path] = None) -> tuple[SigningKey, bool]:
    """Load handover's key, creating it on first use so every run can be signed: (key, created)."""
    path = Path(path).expanduser() if path is not None else default_key_path()
    if path.exists():
        return load_signing_key(path), False
    private_key = Ed25519PrivateKey.generate()
    key = _signing_key(private_key, f"handover@{socket.gethostname()}", path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = _create_exclusively(path, _openssh_private_key_bytes(private_key, key.comment))
        if created:
            write_atomically(_pub_path(path), key.public_line + "\n")
    except OSError as exc:
        raise SigningError(f"cannot create signing key {path}: {exc.strerror or exc}") from None
    if not created:
        return load_signing_key(path), False
    return key, True


# --- Signing ------------------------------------------------------------------------------------


def _digest_file(path: Path, algorithm: str) -> bytes:
    digest = _HASHES[algorithm]()
    with open_regular(path) as stream:
        for chunk in iter(lambda: stream.read(_READ_CHUNK), b""):
            digest.update(chunk)
    return digest.digest()


def _signed_data(namespace: str, hash_algorithm: str, message_digest: bytes) -> bytes:
    """What the key actually signs (PROTOCOL.sshsig): the namespace is bound into the signature."""
    return (
        _SIG_MAGIC
        + _string(namespace)
        + _string(b"")  # reserved
        + _string(hash_algorithm)
        + _string(message_digest)
    )


def signature_path(path: StrPath) -> Path:
    """Where the signature of path lives: the same name with .sig appended."""
    path = Path(path)
    return path.with_name(path.name + SIGNATURE_SUFFIX)


def sign_file(path: StrPath, key: SigningKey) -> Path:
    """Write <path>.sig, an armored SSHSIG that `ssh-keygen -Y verify -n handover` accepts."""
    path = Path(path)
    try:
        message_digest = _digest_file(path, _SIGN_HASH)
    except FileNotFoundError:
        raise SigningError(f"cannot sign {path}: file not found") from None
    except OSError as exc:
        raise SigningError(f"cannot sign {path}: {exc.strerror or exc}") from None
    raw_signature = key.private_key.sign(_signed_data(NAMESPACE, _SIGN_HASH, message_digest))
    blob = (
        _SIG_MAGIC
        + struct.pack(">I", _SIG_VERSION)
        + _string(_ed25519_public_blob(key.private_key.public_key()))
        + _string(NAMESPACE)
        + _string(b"")  # reserved
        + _string(_SIGN_HASH)
        + _string(_string(_ED25519) + _string(raw_signature))
    )
    return write_atomically(signature_path(path), _armor(blob, _SIG_BEGIN, _SIG_END))


def write_allowed_signers(path: StrPath, key: SigningKey, identity: str) -> Path:
    """Write the one-line trust list a customer passes to `ssh-keygen -Y verify -f`.

    An identity with spaces (a key comment such as "Jo Bloggs <jo@example.com>") is quoted, as
    ssh-keygen allows; double quotes and line breaks cannot be expressed, so they are refused.
    """
    path = Path(path)
    if not identity.strip() or re.search(r'["\r\n]', identity):
        raise SigningError(
            f"cannot write {path}: identity {identity!r} must be non-empty, on one line, "
            "and without double quotes"
        )
    needs_quotes = re.search(r"\s", identity) or identity.startswith("#")
    principals = f'"{identity}"' if needs_quotes else identity
    key_type, key_base64 = key.public_line.split()[:2]
    return write_atomically(path, f'{principals} namespaces="{NAMESPACE}" {key_type} {key_base64}\n')


# --- Verification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ParsedSignature:
    public_blob: bytes
    key_type: str
    namespace: str
    hash_algorithm: str
    public_key: Optional[Ed25519PublicKey]  # None for other key types, which are refused anyway
    signature: bytes  # raw Ed25519 signature; empty for other key types


def _parse_signature(armored: bytes) -> _ParsedSignature:
    try:
        text = armored.decode("ascii")
    except UnicodeDecodeError:
        raise _Malformed("not ASCII text, so not an armored SSH signature") from None
    reader = _Reader(_dearmor(text, _SIG_BEGIN, _SIG_END))
    if reader.take(len(_SIG_MAGIC)) != _SIG_MAGIC:
        raise _Malformed("the SSHSIG magic is missing")
    version = reader.uint32()
    if version != _SIG_VERSION:
        raise _Malformed(f"SSHSIG version {version} is not supported (expected {_SIG_VERSION})")
    public_blob = reader.string()
    namespace = reader.text()
    reader.string()  # reserved
    hash_algorithm = reader.text()
    signature_blob = reader.string()
    reader.expect_end("signature")

    key_type = _key_type_of(public_blob)
    public_key = None
    raw_signature = b""
    if key_type == _ED25519:
        key_reader = _Reader(public_blob)
        key_reader.string()
        try:
            public_key = Ed25519PublicKey.from_public_bytes(key_reader.string())
        except ValueError:
            raise _Malformed("the Ed25519 public key is not 32 bytes") from None
        key_reader.expect_end("public key")
        signature_reader = _Reader(signature_blob)
        if signature_reader.text() != _ED25519:
            raise _Malformed("the signature type does not match the ssh-ed25519 key")
        raw_signature = signature_reader.string()
        if len(raw_signature) != 64:
            raise _Malformed("the Ed25519 signature is not 64 bytes")
        signature_reader.expect_end("Ed25519 signature")
    return _ParsedSignature(
        public_blob, key_type, namespace, hash_algorithm, public_key, raw_signature
    )


def _signature_matches(signature: _ParsedSignature, message_digest: bytes) -> bool:
    if signature.public_key is None:
        return False
    try:
        signature.public_key.verify(
            signature.signature,
            _signed_data(signature.namespace, signature.hash_algorithm, message_digest),
        )
    except InvalidSignature:
        return False
    return True


# --- allowed_signers (ssh-keygen(1) ALLOWED SIGNERS) ----------------------------------------------


_VALUED_OPTIONS = ("namespaces", "valid-after", "valid-before")


@dataclass(frozen=True)
class _AllowedSigner:
    principals: str
    public_blob: bytes
    cert_authority: bool = False
    namespaces: Optional[str] = None
    valid_after: Optional[float] = None
    valid_before: Optional[float] = None


def _matches_pattern(value: str, pattern: str) -> bool:
    """OpenSSH match_pattern: * and ? wildcards, case-sensitive."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


def _matches_pattern_list(value: str, patterns: str) -> bool:
    """OpenSSH match_pattern_list: comma-separated patterns, where a matching !pattern vetoes."""
    matched = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if _matches_pattern(value, pattern[1:] if negated else pattern):
            if negated:
                return False
            matched = True
    return matched


def _split_unquoted(text: str, separators: str) -> tuple[str, str]:
    """Split at the first separator outside double quotes (\\" escapes a quote inside them)."""
    quoted = False
    index = 0
    while index < len(text):
        char = text[index]
        if quoted and char == "\\" and text[index + 1:index + 2] == '"':
            index += 2
            continue
        if char == '"':
            quoted = not quoted
        elif not quoted and char in separators:
            return text[:index], text[index + 1:]
        index += 1
    if quoted:
        raise _Malformed("unterminated quote")
    return text, ""


def _dequote(value: str, option: str) -> str:
    if len(value) < 2 or not (value.startswith('"') and value.endswith('"')):
        raise _Malformed(f"{option} needs a double-quoted value")
    return value[1:-1].replace('\\"', '"')


def _parse_ssh_time(value: str) -> float:
    """ssh-keygen's YYYYMMDD[HHMM[SS]][Z] time: UTC with Z, local time without."""
    found = re.fullmatch(r"(\d{8}(?:\d{4}(?:\d{2})?)?)([Zz]?)", value)
    if found is None:
        raise _Malformed(f"invalid time {value!r}")
    digits, utc = found.groups()
    layout = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}[len(digits)]
    try:
        moment = datetime.datetime.strptime(digits, layout)
    except ValueError:
        raise _Malformed(f"invalid time {value!r}") from None
    if utc:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    try:
        return moment.timestamp()
    except (ValueError, OverflowError, OSError):  # year 1 in local time falls before year 1
        raise _Malformed(f"invalid time {value!r}") from None


def _read_public_key(text: str) -> Optional[bytes]:
    """The key blob of "type base64 [comment]", or None when text does not start with a key."""
    fields = text.split(None, 2)
    if len(fields) < 2:
        return None
    try:
        blob = base64.b64decode(fields[1], validate=True)
        return blob if _key_type_of(blob) == fields[0] else None
    except (binascii.Error, ValueError):
        return None


LINES_NAMED = 5  # of an allowed_signers file's lines skipped, the first this many are named


def _parse_allowed_signer(line: str) -> _AllowedSigner:
    """One non-comment line: principals [options] keytype base64 [comment]."""
    if line.startswith('"'):
        principals, separator, rest = line[1:].partition('"')
        if not separator:
            raise _Malformed("unterminated quote in principals")
    else:
        principals, rest = (re.split(r"[ \t]+", line, maxsplit=1) + [""])[:2]
    rest = rest.strip()
    if not principals or not rest:
        raise _Malformed("missing key")
    public_blob = _read_public_key(rest)
    options = ""
    if public_blob is None:
        options, rest = _split_unquoted(rest, " \t")
        public_blob = _read_public_key(rest.strip())
        if public_blob is None:
            raise _Malformed("invalid key")

    values: dict[str, str] = {}  # option name -> dequoted value, "" for the cert-authority flag
    while options:
        option, options = _split_unquoted(options, ",")
        name, has_value, value = option.partition("=")
        name = name.lower()
        known = name in _VALUED_OPTIONS if has_value else name == "cert-authority"
        if not known:
            raise _Malformed(f"unknown option {option!r}")
        if name in values:
            raise _Malformed(f"{name} given twice")
        values[name] = _dequote(value, name) if has_value else ""
    return _AllowedSigner(
        principals=principals,
        public_blob=public_blob,
        cert_authority="cert-authority" in values,
        namespaces=values.get("namespaces"),
        valid_after=_parse_ssh_time(values["valid-after"]) if "valid-after" in values else None,
        valid_before=_parse_ssh_time(values["valid-before"]) if "valid-before" in values else None,
    )


def _format_time(timestamp: float) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _allowed_identity(
    allowed_signers: Path, public_blob: bytes, fingerprint: str
) -> tuple[Optional[str], str]:
    """(principals, "") for the first line trusting this key for handover now, else (None, why).

    Follows ssh-keygen: blank and # lines are ignored, unparseable lines are skipped, cert-authority
    lines never match a plain key, and namespaces=/valid-after=/valid-before= restrict a line.
    """
    try:
        text = read_regular(allowed_signers).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None, f"allowed signers file {allowed_signers} not found"
    except OSError as exc:
        return None, f"cannot read allowed signers file {allowed_signers}: {exc.strerror or exc}"

    now = time.time()
    refusals: list[str] = []
    skipped: list[str] = []
    bare_keys: list[str] = []  # lines that are a public key alone, as a .pub file holds one
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = _parse_allowed_signer(line)
        except _Malformed:
            (bare_keys if _read_public_key(line) is not None else skipped).append(str(number))
            continue
        if entry.cert_authority or entry.public_blob != public_blob:
            continue
        if entry.namespaces is not None and not _matches_pattern_list(NAMESPACE, entry.namespaces):
            refusals.append(f'line {number} allows it only for namespaces "{entry.namespaces}"')
        elif entry.valid_after is not None and now < entry.valid_after:
            starts = _format_time(entry.valid_after)
            refusals.append(f"line {number} makes it valid only after {starts}")
        elif entry.valid_before is not None and now > entry.valid_before:
            refusals.append(f"line {number} says it expired at {_format_time(entry.valid_before)}")
        else:
            return entry.principals, ""

    if refusals:
        return None, f"key {fingerprint} is not allowed by {allowed_signers}: {'; '.join(refusals)}"
    reason = f"key {fingerprint} is not listed in {allowed_signers}"
    if bare_keys:
        named = ", ".join(bare_keys[:LINES_NAMED])
        lines = f"line {named} holds" if len(bare_keys) == 1 else f"lines {named} hold"
        reason += (f" ({lines} a public key alone, as a .pub file does; an allowed_signers line names the "
                   'signer first: ops@example.com namespaces="handover" ssh-ed25519 AAAA...)')
    if skipped:
        more = f" and {len(skipped) - LINES_NAMED} more" if len(skipped) > LINES_NAMED else ""
        reason += f" (unparseable lines skipped: {', '.join(skipped[:LINES_NAMED])}{more})"
    return None, reason


def verify_file(
    path: StrPath, sig_path: Optional[StrPath] = None, allowed_signers: Optional[Path] = None
) -> Verification:
    """Check <path>.sig (or sig_path) as ssh-keygen -Y verify -n handover would; never raises."""
    path = Path(path)
    sig_path = Path(sig_path) if sig_path is not None else signature_path(path)

    def failed(reason: str, fingerprint: Optional[str] = None) -> Verification:
        return Verification(
            ok=False, file=path, fingerprint=fingerprint, identity=None, reason=reason
        )

    try:
        armored = read_regular(sig_path)
    except FileNotFoundError:
        return failed(f"no signature: {sig_path} not found")
    except OSError as exc:
        return failed(f"cannot read {sig_path}: {exc.strerror or exc}")
    try:
        signature = _parse_signature(armored)
    except _Malformed as exc:
        return failed(f"{sig_path} is malformed: {exc}")

    fingerprint = _fingerprint(signature.public_blob)
    if signature.namespace != NAMESPACE:
        return failed(
            f'{sig_path} was signed for namespace "{signature.namespace}", not "{NAMESPACE}"',
            fingerprint,
        )
    if signature.hash_algorithm not in _HASHES:
        return failed(
            f'{sig_path} uses hash algorithm "{signature.hash_algorithm}"; '
            f"only {' and '.join(sorted(_HASHES))} are accepted",
            fingerprint,
        )
    if signature.key_type != _ED25519:
        return failed(
            f"{sig_path} was made with a {signature.key_type} key; "
            f"only Ed25519 ({_ED25519}) signatures are accepted",
            fingerprint,
        )
    try:
        message_digest = _digest_file(path, signature.hash_algorithm)
    except FileNotFoundError:
        return failed(f"{path} not found", fingerprint)
    except OSError as exc:
        return failed(f"cannot read {path}: {exc.strerror or exc}", fingerprint)
    if not _signature_matches(signature, message_digest):
        return failed(
            f"signature mismatch: {path} is not the file {sig_path} was made for "
            "(changed after signing?)",
            fingerprint,
        )

    if allowed_signers is None:
        return Verification(
            ok=True,
            file=path,
            fingerprint=fingerprint,
            identity=None,
            reason=f"good signature by {fingerprint}; signer not checked against a trust list "
            "(no allowed_signers given)",
        )
    identity, refusal = _allowed_identity(Path(allowed_signers), signature.public_blob, fingerprint)
    if identity is None:
        return failed(refusal, fingerprint)
    return Verification(
        ok=True, file=path, fingerprint=fingerprint, identity=identity,
        reason=f"good signature by {identity}",
    )


def named_signer(sig_path: StrPath, allowed_signers: StrPath) -> tuple[Optional[str], str]:
    """(principals, "") that allowed_signers gives the key inside sig_path, else (None, why).

    For naming who signed from a bundle's own allowed_signers, which proves nothing by itself:
    whether the signature is good is verify_file's question, whether the key is trusted the
    customer's (their own --allowed-signers)."""
    sig_path = Path(sig_path)
    try:
        signature = _parse_signature(read_regular(sig_path))
    except OSError as exc:
        return None, f"cannot read {sig_path}: {exc.strerror or exc}"
    except _Malformed as exc:
        return None, f"{sig_path} is malformed: {exc}"
    return _allowed_identity(Path(allowed_signers), signature.public_blob,
                             _fingerprint(signature.public_blob))
