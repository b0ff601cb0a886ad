"""Node-side payloads: stdlib-only Python scripts shipped through stdin, printing JSON.

A node receives one script, so a payload shares code with another through a sibling module it
imports relatively (`from .scratch_guard import refuse`): `load` writes that module's text where
the import stands. The shared module itself imports no sibling.
"""
import re
from importlib.resources import files

# A whole line importing from a sibling payload module: where that module's text goes.
_SIBLING_IMPORT = re.compile(r"^from \.(\w+) import [^\n]+$", re.MULTILINE)


class Payload(str):
    """A payload's source text that knows its name, so messages can name it instead of showing it."""

    name: str


def load(name: str) -> Payload:
    """The source text of payload `name` (a module in this package), ready to ship."""
    text = _SIBLING_IMPORT.sub(lambda match: _source(match.group(1)), _source(name))
    payload = Payload(text)
    payload.name = name
    return payload


def _source(name: str) -> str:
    return files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
