"""The kinds of check failure: what the suites raise and the recorder files in the ledger.

A kind is a word the report shows beside the message (unreachable, host-key, timeout, sanity,
performance, expectation, busy), so an operator tells a dead node from a slow one without reading a
traceback. transport_failure() is the one place a transport's outcome word becomes a kind.

Every failure also says what to do next (`action`): the kind's default (ACTIONS), or the
check's own where it knows better (replace the GPU it names, the cable between two nodes on a
rail); the recorder keeps it in the failure's ledger entry, and the report shows it beside it.
"""
from __future__ import annotations

from typing import Optional

LOG_EXCERPT_LINES = 40


# What to do next, by kind: what an operator does first when a check fails that way.
ACTIONS = {
    "unreachable": "check the node's power, BMC and network link (ping, the console), then re-run its checks",
    "host-key": "compare the node's host key with its console (ssh-keyscan); if it was reinstalled, "
                "update known_hosts, then re-run",
    "timeout": "re-run the check; if it times out again, look at the node's load and the raw output",
    "sanity": "read the raw output: the tool did not run correctly; fix the cause (driver, package, "
              "configuration), then re-run",
    "performance": "re-run the check; if the figure stays outside its band, investigate the node "
                   "(clocks, throttling, firmware, cabling)",
    "expectation": "bring the node to the profile's configuration (or correct the profile, if it is "
                   "wrong), then re-run",
    "busy": "re-run once the other acceptance run has ended",
    "error": "read the log excerpt: the check broke; fix the cause, then re-run",
}


class CheckFailure(AssertionError):
    """A check failed for a reason the report should name; `log` is the evidence to show,
    `action` what to do next where the check knows better than its kind (ACTIONS)."""

    kind = "error"

    def __init__(self, message: str, log: str = "", action: str = ""):
        super().__init__(message)
        self.log = log
        self.action = action or action_for(self.kind)


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


def action_for(kind: str) -> str:
    """What to do next about a failure of this kind (an exception that is no CheckFailure: error)."""
    return ACTIONS.get(kind, ACTIONS["error"])


def excerpt(text: str, lines: int = LOG_EXCERPT_LINES) -> str:
    """The last lines of a tool's output: where tools print why they failed."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class NodeBusy(CheckFailure):
    """Another acceptance run holds the node: figures taken now would measure both runs."""

    kind = "busy"
