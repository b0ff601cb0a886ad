"""What every pure parser raises when the text is not the tool's output, and the one way to read
a payload's JSON object."""
from __future__ import annotations

import json


class ParseError(ValueError):
    """The text is not what the tool (or payload) prints; the message says what was expected."""


def json_object(text: str, what: str) -> dict:
    """The JSON object `text` holds, or a ParseError naming `what` was expected."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{what}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ParseError(f"{what}: not a JSON object")
    return data
