"""The kinds of check failure: what the suites raise and the recorder files in the ledger.

A kind is a word the report shows beside the message (unreachable, timeout, sanity, performance,
expectation), so an operator tells a dead node from a slow one without reading a traceback.
"""
from __future__ import annotations

LOG_EXCERPT_LINES = 40


class CheckFailure(AssertionError):
    """A check failed for a reason the report should name; `log` is the evidence to show."""

    kind = "error"

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class NodeUnreachable(CheckFailure):
    kind = "unreachable"


class CommandTimedOut(CheckFailure):
    kind = "timeout"


class SanityFailure(CheckFailure):
    """The tool did not run correctly, whatever its exit code says."""

    kind = "sanity"


class PerformanceFailure(CheckFailure):
    """Metrics outside their reference bands, or referenced metrics that were not measured."""

    kind = "performance"


class ExpectationFailure(CheckFailure):
    """A fact of the node differs from what the profile expects."""

    kind = "expectation"


def excerpt(text: str, lines: int = LOG_EXCERPT_LINES) -> str:
    """The last lines of a tool's output: where tools print why they failed."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class NodeBusy(CheckFailure):
    """Another acceptance run holds the node: figures taken now would measure both runs."""

    kind = "busy"
