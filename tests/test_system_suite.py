"""The system suite's clock check: the kernel's clock state as the node-side probe reads it with
adjtimex(2), on this machine (whose clock may or may not be synchronized: each test reads it
first and expects what that state means), and as a profile that asks for a synchronized clock
judges it."""
from __future__ import annotations

import json
import sys

import pytest
from nodes import local_inventory_without_scratch
from test_e2e import results_of, run_dir_of, run_suites

from inventory.model import Node
from runners import system
from runners.parsing import ParseError
from runners.transport import LocalTransport

UNSYNCED_MAX_ERROR_US = 16_000_000  # the kernel's NTP_PHASE_LIMIT: maxerror grows to it unsynchronized


def this_machines_clock() -> system.Clock:
    transport = LocalTransport(Node("localhost", "localhost", "local", python=sys.executable))
    try:
        result = system.probe(transport)
    finally:
        transport.close()
    assert result.ok, result.explain()
    clock = system.parse_system_facts(result.stdout).clock
    assert clock is not None
    return clock


def test_the_probe_reads_the_kernels_clock_state():
    clock = this_machines_clock()
    assert isinstance(clock.synced, bool) and clock.unknown == "", clock
    assert isinstance(clock.max_error_us, int) and 0 <= clock.max_error_us <= UNSYNCED_MAX_ERROR_US
    if not clock.synced:
        assert clock.max_error_us == UNSYNCED_MAX_ERROR_US


def test_facts_without_a_clock_read_as_unknown_and_a_malformed_clock_is_refused():
    facts = {name: "x" for name in system.REQUIRED_FACTS} | {"logical_cpus": 2, "memory_total_kib": 1024,
                                                              "cpu_sockets": None}
    assert system.parse_system_facts(json.dumps(facts)).clock is None  # a payload from before the clock
    with pytest.raises(ParseError, match="clock is not"):
        system.parse_system_facts(json.dumps(facts | {"clock": {"synced": "yes", "max_error_us": 1}}))


def test_a_profile_that_asks_for_a_synchronized_clock_judges_this_machines(sign_key, tmp_path):  # noqa: F811
    clock = this_machines_clock()
    inventory = local_inventory_without_scratch(tmp_path)
    inventory.write_text(inventory.read_text() + "expect:\n  clock_synced: {value: true, reason: \"the GPU "
                         "profiles' rule, on this machine\"}\n")
    run_suites(inventory, tmp_path / "out", sign_key, "-m", "system", "-k", "test_clock", timeout=120)
    [check] = [c for c in results_of(run_dir_of(tmp_path / "out", "local"))["checks"] if c["check"] == "clock"]
    if clock.synced:
        assert check["outcome"] == "passed" and check["message"].startswith("synchronized, "), check
    else:
        assert (check["outcome"], check["kind"]) == ("failed", "expectation"), check
        assert check["message"].startswith("localhost's clock is not synchronized (adjtimex says so), and "
                                           "profile cpu-only asks for it: start chronyd"), check["message"]
