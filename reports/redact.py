"""Secrets out of stored tool output: the run directory goes to the customer, and tools embed
their environment in what they print (nccl-tests' `-J` JSON has `"env": ["K=V", ...]`, the
payloads print `"env": {"NCCL_...": "..."}`, a command line carries `env K=V` or `mpirun -x K=V`).

`redact(text)` replaces the value of every variable whose name looks like it holds a secret, in
the shapes tools print:

    NAME=value            a line of `env` (the value runs to the end of the line)
    ... NAME=value ...    a word of a command line (the value runs to a space, quote or ; & |)
    "NAME=value"          a JSON string or quoted shell word (the value runs to the quote)
    "NAME": "value"       a JSON member (or 'NAME': 'value', Python's repr of a dict)
    ...,NAME=value,...    a list of variables, as srun's --export=ALL,NAME=value
    NAME: value           a YAML line or an HTTP header (the value runs to the end or a quote)
    --name value          an option and its value, as a command line gives them
    sshpass -p value      sshpass's password, whatever the option's name
    scheme://user:pw@     a password inside a URL, whatever the variable
    -----BEGIN ... PRIVATE KEY-----   the key's lines, whatever surrounds them

A name holds a secret when one of its words (split at _ - .) ends in token, secret(s),
password, passwd, passphrase, apikey, credential(s), privatekey or authorization; or, in a name
of several words, is key, pass, pw or pwd (API_KEY, MYSQL_PWD; not PWD, nor a bare key=value),
or is auth as the last (NPM_CONFIG__AUTH, not SSH_AUTH_SOCK); unless its last word is path, file,
dir or directory: it holds where a secret is, not the secret (perftest's --credentials_path,
PASSWORD_FILE, as a tool's usage lists them). So TOKENIZERS_PARALLELISM,
tokens_per_s and iperf3's "cookie" stay, and so do a host key and a public key (host-key, the
kind of a check that failed at SSH's host key check, and public_key: what they hold is public).

Pure text in, text out: lines, quotes and JSON validity are kept, a redacted value becomes
[REDACTED], and redacting twice changes nothing more.
"""
from __future__ import annotations

import re
from functools import lru_cache

REDACTED = "[REDACTED]"

_SECRET_ENDINGS = ("token", "secret", "secrets", "password", "passwd", "passphrase", "apikey",
                   "credential", "credentials", "privatekey", "authorization")
_SECRET_WORDS = frozenset({"key", "pass", "pw", "pwd"})  # only as one word of several
_PUBLIC_KEY_KINDS = frozenset({"host", "public", "pub"})  # a key after one of these is public: host-key
_LOCATION_WORDS = frozenset({"path", "file", "dir", "directory"})  # a name ending so holds where a secret is
_WORD_SPLIT = re.compile(r"[_.-]+")

# Every shape below lies within one line, and every secret name holds one of these stems: only
# the lines that hold one (or a URL) go through the patterns, so a long log costs one scan.
_STEMS = re.compile("token|secret|pass|pw|key|credential|auth|://")
_NAME = r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*"
# "NAME": "value" or 'NAME': 'value': a JSON member or a Python dict's repr.
_MEMBER = re.compile(
    rf"""(?P<q>["'])(?P<name>{_NAME})(?P=q)(?P<sep>[ \t]*:[ \t]*)"""
    r"""(?P<vq>["'])(?P<value>(?:\\.|(?!(?P=vq))[^\\\n])*)(?P=vq)""")
# "NAME=value" inside quotes: a JSON string (nccl-tests' env list) or a quoted shell word.
_QUOTED = re.compile(
    rf"""(?P<q>["'])(?P<name>{_NAME})=(?P<value>(?:\\.|(?!(?P=q))[^\\\n])*)(?=(?P=q))""")
# NAME=value as a whole line, as `env` prints it (optionally `export NAME=value`).
_LINE = re.compile(rf"^(?P<lead>[ \t]*(?:export[ \t]+)?)(?P<name>{_NAME})=(?P<value>[^\r\n]*)",
                   re.MULTILINE)
# NAME=value as a word among others: a command line, a log line, `[1,0]<stdout>:NAME=value`.
_WORD = re.compile(rf"(?<![A-Za-z0-9_.=-])(?P<name>{_NAME})=(?P<value>[^\s\"'&;|<>()]*)")
# NAME=value after a comma: a list of variables, as srun's --export=ALL,NAME=value.
_LISTED = re.compile(rf"(?<=,)(?P<name>{_NAME})=(?P<value>[^\s\"',&;|<>()]*)")
# NAME: value unquoted: a YAML line, an HTTP header (`Authorization: Bearer ...`).
_COLON = re.compile(rf"""(?<![\w.-])(?P<name>{_NAME})[ \t]*:[ \t]*(?P<value>[^\s\"'][^\r\n\"']*)""")
# --name value: an option of a secret name and the word after it (not another option).
_OPTION = re.compile(r"""(?<![\w.-])(?P<name>--?[A-Za-z][\w.-]*)[ \t]+"""
                     r"""(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s\"'&;|<>()-][^\s\"'&;|<>()]*)""")
# sshpass -p password (also -ppassword): the option is named p, the value a password all the same.
_SSHPASS = re.compile(r"(?P<lead>\bsshpass\b[^\n]*?[ \t]-p[ \t]*)(?P<value>[^\s\"'&;|<>()]+)")
# scheme://user:password@host
_URL = re.compile(r"(?P<lead>://[^\s/@:\"']*:)(?P<value>[^\s/@\"']+)(?=@)")
# A private key, PEM-armoured: every line between its markers (a JSON string's \n-joined one too).
_PRIVATE_KEY = re.compile(r"(?P<begin>-----BEGIN (?P<kind>[A-Z0-9 ]*)PRIVATE KEY-----)(?P<body>.*?)"
                          r"(?P<end>-----END (?P=kind)PRIVATE KEY-----)", re.DOTALL)
_BODY_LINE = re.compile(r"[^\r\n]+")


@lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """Whether a variable (or option, or JSON key) of this name holds a secret, by its words."""
    words = [word for word in _WORD_SPLIT.split(name.lower()) if word]
    if len(words) > 1 and words[-1] in _LOCATION_WORDS:
        return False
    for position, word in enumerate(words):
        if word.endswith(_SECRET_ENDINGS):
            return True
        if word == "key" and position and words[position - 1] in _PUBLIC_KEY_KINDS:
            continue
        if len(words) > 1 and (word in _SECRET_WORDS or (word == "auth" and position == len(words) - 1)):
            return True
    return False


def redact(text: str) -> str:
    """text with the value of every secret-named variable, and every URL password, replaced."""
    if "PRIVATE KEY-----" in text:
        text = _PRIVATE_KEY.sub(_key_hidden, text)
    lowered = text.lower()
    if len(lowered) != len(text):  # a character whose lower case is longer: no positions to share
        return _redact_lines(text)
    parts = []
    done = 0
    for found in _STEMS.finditer(lowered):
        if found.start() < done:
            continue  # in a line already redacted
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.end())
        end = len(text) if end < 0 else end + 1
        parts += [text[done:start], _redact_lines(text[start:end])]
        done = end
    return "".join(parts) + text[done:] if parts else text


def _redact_lines(text: str) -> str:
    """Every pattern over text, whole lines of it."""
    text = _MEMBER.sub(_by_name, text)
    text = _QUOTED.sub(_by_name, text)
    text = _LINE.sub(_by_name, text)
    text = _WORD.sub(_by_name, text)
    text = _LISTED.sub(_by_name, text)
    text = _COLON.sub(_by_name, text)
    text = _OPTION.sub(_by_name, text)
    text = _SSHPASS.sub(_after_lead, text)
    return _URL.sub(_after_lead, text)


def _after_lead(found: re.Match) -> str:
    return found.group("lead") + _hidden(found.group("value"))


def _key_hidden(found: re.Match) -> str:
    body = _BODY_LINE.sub(REDACTED, found.group("body"))
    return found.group("begin") + body + found.group("end")


def _by_name(found: re.Match) -> str:
    """The match with its value group redacted when its name group names a secret."""
    if not secret_name(found.group("name")):
        return found.group(0)
    value = found.group("value")
    start, end = found.start("value") - found.start(), found.end("value") - found.start()
    whole = found.group(0)
    return whole[:start] + _hidden(value) + whole[end:]


def _hidden(value: str) -> str:
    """REDACTED for a value; an empty one stays empty (nothing to hide, and it says so)."""
    return REDACTED if value else value
