"""GPU node configuration: the settings NVIDIA's validation checks before any benchmark.

One node-side probe gathers the facts; each check judges one setting against the profile.
A setting the profile does not ask for is skipped with that reason; one it asks for that is
wrong or unreadable fails, naming the node, the expected and the found value.
"""
from __future__ import annotations

import pytest

from handover.failures import ExpectationFailure
from runners import gpu_config
from suites.checks import parsed

pytestmark = [pytest.mark.system, pytest.mark.quick]

STEP = "gpu_config"


def judge(on_node, profile, node, record, evaluate) -> None:
    facts = parsed(gpu_config.parse_config_facts, on_node(STEP, gpu_config.probe))
    finding = evaluate(facts, profile.expect, profile.name)
    if finding.skip:
        pytest.skip(finding.skip)
    if finding.note:
        record.note(finding.note)
    if finding.problems:
        raise ExpectationFailure(f"{node}: " + "; ".join(finding.problems))


def test_fabric_manager(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.fabric_manager)


def test_peermem(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.peermem)


def test_pcie_acs(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.pcie_acs)


def test_iommu(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.iommu)


def test_cpu_governor(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.cpu_governor)


def test_numa_balancing(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.numa_balancing)


def test_device_numa(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.device_numa)


def test_versions(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.versions)


def test_container_toolkit(on_node, profile, node, record):
    judge(on_node, profile, node, record, gpu_config.container_toolkit)
