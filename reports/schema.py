"""JSON Schemas of results.json and of ledger.jsonl's lines, shipped in the package and checked here.

The schema files are for consumers too: a customer validates results.json with any JSON Schema
(draft 2020-12) validator, without handover. Within a schema version keys are only added, so the
schemas admit keys they do not list.

Two validators, one schema: jsonschema-rs (compiled) says whether a document is valid, in well
under a millisecond for a thousand-node run where the pure-Python jsonschema takes seconds; only
a document it rejects goes through jsonschema, whose errors name the offending path best.
"""
from __future__ import annotations

import json
import reprlib
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, cast

import jsonschema_rs

if TYPE_CHECKING:  # imported when a document is rejected: a tenth of the `handover report` start
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
RESULTS_SCHEMA_FILE = "results.schema.json"
LEDGER_ENTRY_SCHEMA_FILE = "ledger-entry.schema.json"

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxdict, _SHORT.maxlist = 60, 60, 4, 6


class SchemaError(ValueError):
    """A document that does not match its schema; the message is one line: source, path, problem."""


def validate_results(document: dict, *, source: str = "results.json") -> None:
    """Raise SchemaError unless `document` is a valid handover.results/1 document."""
    _validate(RESULTS_SCHEMA_FILE, document, source)


def validate_ledger_entry(entry: dict, *, source: str = "ledger.jsonl") -> None:
    """Raise SchemaError unless `entry` is a valid line of a handover.ledger/1 ledger;
    `source` names it in the message, e.g. 'out/x/ledger.jsonl:7'."""
    _validate(LEDGER_ENTRY_SCHEMA_FILE, entry, source)


@cache
def _schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


@cache
def _fast_validator(name: str) -> jsonschema_rs.Draft202012Validator:
    return jsonschema_rs.Draft202012Validator(_schema(name))


@cache
def _validator(name: str) -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_schema(name))


def _validate(name: str, document: object, source: str) -> None:
    if _fast_validator(name).is_valid(document):
        return
    from jsonschema.exceptions import best_match

    errors = list(_validator(name).iter_errors(document))
    if errors:
        error = best_match(_discriminated(errors) or errors)
        raise SchemaError(f"{source}: {_describe(error)}")


def _discriminated(errors: list[ValidationError]) -> list[ValidationError]:
    """A oneOf told apart by `type` (ledger entries) fails in every branch: report only the
    branch whose type matched, or, when none did, the error on `type` itself."""
    chosen = []
    for error in errors:
        if error.validator != "oneOf" or not error.context:
            chosen.append(error)
            continue
        branches: dict[str | int, list[ValidationError]] = defaultdict(list)
        for inner in error.context:
            branches[inner.relative_schema_path[0]].append(inner)
        matching = [inner for inner in branches.values() if not any(map(_wrong_type, inner))]
        if len(matching) == 1:
            chosen.extend(matching[0])
        elif matching:
            chosen.append(error)
    return chosen


def _wrong_type(error: ValidationError) -> bool:
    return error.validator == "const" and list(error.relative_path) == ["type"]


def _describe(error: ValidationError) -> str:
    """'checks[3].outcome: 'passd' is not one of [...]', all on one line."""
    path = list(error.absolute_path)
    if error.validator == "required":
        required, instance = cast(list, error.validator_value), cast(dict, error.instance)
        missing = next(key for key in required if key not in instance)
        return f"{_path(path + [missing])}: required, but missing"
    if error.validator == "const":
        message = f"{_SHORT.repr(error.instance)}, expected {error.validator_value!r}"
    else:
        message = error.message.replace(repr(error.instance), _SHORT.repr(error.instance))
    return f"{_path(path) or '(top level)'}: {' '.join(message.splitlines())}"


def _path(parts: list) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
