"""System: is every node reachable, are its OS, kernel, CPU and memory what the profile says, and
is its clock synchronized?"""
from __future__ import annotations

import re

import pytest

from handover.failures import ExpectationFailure
from runners import system
from runners.parsing import ParseError
from suites.checks import odd_ones_out, parsed

pytestmark = [pytest.mark.system, pytest.mark.quick]

STEP = "system_facts"


def facts_of(on_node) -> system.SystemFacts:
    """This node's facts, from one concurrent probe of every selected node.

    Called in the test body, not a fixture, so an unreachable node is a failed check rather
    than a setup error.
    """
    return parsed(system.parse_system_facts, on_node(STEP, system.probe))


def test_reachable(on_node, acceptance, node, record):
    result = on_node(STEP, system.probe)
    found = parsed(system.parse_system_facts, result)
    acceptance.record_tool(node, "python", found.python)
    record.note(f"answered as {found.hostname} in {result.duration_s:.2f} s")


def test_os(on_node, profile, record):
    facts = facts_of(on_node)
    allowed = profile.expect.os_ids
    record.note(facts.os_pretty)
    if allowed and facts.os_id not in allowed:
        raise ExpectationFailure(f"OS {facts.os_pretty!r} (ID {facts.os_id!r}) is not one the "
                                 f"profile {profile.name} allows: {', '.join(allowed)}")


def test_kernel(on_node, profile, record):
    facts = facts_of(on_node)
    minimum = profile.expect.kernel_min
    record.note(f"{facts.kernel} ({facts.arch})")
    if minimum and version_tuple(facts.kernel) < version_tuple(minimum):
        raise ExpectationFailure(f"kernel {facts.kernel} is older than {minimum}, "
                                 f"the minimum of profile {profile.name}")


def test_cpu(on_node, profile, metrics, record):
    facts = facts_of(on_node)
    pattern = profile.expect.cpu_model
    record.note(f"{facts.cpu_model}, {facts.logical_cpus} logical CPUs")
    if pattern and not re.search(pattern, facts.cpu_model):
        raise ExpectationFailure(f"CPU {facts.cpu_model!r} does not match {pattern!r} "
                                 f"(profile {profile.name})")
    metrics.judge(cpu_cores=(facts.logical_cpus, "cores"))


def test_memory(on_node, metrics, record):
    facts = facts_of(on_node)
    record.note(f"{facts.memory_total_gib:.1f} GiB")
    metrics.judge(memory_total=(round(facts.memory_total_gib, 2), "GiB"))


def test_clock(on_node, profile, node, record):
    """The kernel's clock is synchronized (chrony, ntpd or PTP set it so; timedatectl's "System
    clock synchronized" reads the same adjtimex state): a cluster's logs, NCCL's and Slurm's, and
    a soak's samples are compared across nodes by time, and munge refuses credentials from a node
    whose clock is five minutes off."""
    clock = facts_of(on_node).clock
    if clock is None or clock.synced is None:
        pytest.skip(f"{node}'s clock state cannot be read: {clock.unknown if clock else 'the probe did not say'}")
    record.note(f"{'synchronized' if clock.synced else 'not synchronized'}, "
                f"the kernel's maximum error {clock.max_error_ms:g} ms")
    if not clock.synced and profile.expect.clock_synced:
        raise ExpectationFailure(f"{node}'s clock is not synchronized (adjtimex says so), and profile "
                                 f"{profile.name} asks for it: start chronyd (or ntpd, ptp4l) against the site's "
                                 "time source and wait until `chronyc tracking` says it is")


UNIFORM_FACTS = {"OS": "os_pretty", "kernel": "kernel", "CPU model": "cpu_model",
                 "logical CPUs": "logical_cpus"}


@pytest.mark.cluster
def test_uniformity(cluster_run, record):
    """Same OS, kernel and CPU on every node that answered; odd ones out are named."""
    answers = cluster_run.gather(STEP, system.probe)
    facts = {}
    for node, result in answers.items():
        if result.ok:
            try:
                facts[node] = system.parse_system_facts(result.stdout)
            except ParseError:
                pass
    if not facts:
        pytest.skip("no node answered the system probe")
    differences = [odd_ones_out(label, {n: getattr(f, attribute) for n, f in facts.items()})
                   for label, attribute in UNIFORM_FACTS.items()]
    differences = [d for d in differences if d]
    silent = sorted(set(answers) - set(facts))
    record.note(f"{len(facts)} node(s) compared" + (f"; no facts from {', '.join(silent)}" if silent else ""))
    if differences:
        raise ExpectationFailure("; ".join(differences))


def version_tuple(text: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()
