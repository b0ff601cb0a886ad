"""The kinds of check failure: what the suites raise and the recorder files in the ledger.

A kind is a word the report shows beside the message (unreachable, host-key, timeout, sanity,
performance, expectation, busy), so an operator tells a dead node from a slow one without reading a
traceback. transport_failure() is the one place a transport's outcome word becomes a kind.
"""
from __future__ import annotations

from typing import Optional

LOG_EXCERPT_LINES = 40


class CheckFailure(AssertionError):
    """A check failed for a reason the report should name; `log` is the evidence to show."""

    kind = "error"

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class NodeUnreachable(CheckFailure):
    kind = "unreachable"


class HostKeyRefused(CheckFailure):
    """The node's host key is unknown or not the one known_hosts has: nothing was run there."""

    kind = "host-key"


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


# runners.transport.Result.failure -> what a check files it as; 'error' is the transport's own trouble.
_TRANSPORT_FAILURES: dict[str, type[CheckFailure]] = {
    "unreachable": NodeUnreachable, "auth": NodeUnreachable, "host-key": HostKeyRefused,
    "error": CheckFailure,
}


def transport_failure(failure: Optional[str]) -> Optional[type[CheckFailure]]:
    """The failure a check raises for a transport-level outcome; None when the command ran."""
    return _TRANSPORT_FAILURES.get(failure) if failure else None


def excerpt(text: str, lines: int = LOG_EXCERPT_LINES) -> str:
    """The last lines of a tool's output: where tools print why they failed."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class NodeBusy(CheckFailure):
    """Another acceptance run holds the node: figures taken now would measure both runs."""

    kind = "busy"
