"""Every failure says what to do next: its kind's action, or the check's own where it knows the
part (the GPU, the port, the cable between two nodes on a rail); the report shows it beside the
failure, and its per-area summary lists the failures first."""
from __future__ import annotations

from pathlib import Path

import pytest

from handover import failures
from reports.html import build_view, render_html
from runners import kernel_log
from runners.ibstat import COUNTERS_ACTION, PORT_ACTION
from runners.kernel_log import kernel_action
from runners.nvml import ecc_action
from runners.pairs import Attribution, link_action
from tests.test_html import check, results


def test_every_kind_has_an_action_and_a_check_may_say_better():
    kinds = {cls.kind for cls in vars(failures).values()
             if isinstance(cls, type) and issubclass(cls, failures.CheckFailure)}
    assert kinds == set(failures.ACTIONS)
    assert failures.NodeUnreachable("gpu017 unreachable").action.startswith("check the node's power, BMC")
    assert failures.NodeBusy("held").action == "re-run once the other acceptance run has ended"
    own = failures.ExpectationFailure("GPU 3 missing", action="replace GPU 3 (RMA)")
    assert own.action == "replace GPU 3 (RMA)"
    assert failures.action_for("no-such-kind") == failures.ACTIONS["error"]


def test_a_suspect_link_names_the_cable_between_its_ends_on_its_rail():
    found = Attribution(suspect_links={("gpu001", "gpu002"): "failed while both nodes passed with other partners"})
    assert link_action(found, "gpu002", 3, "ib_write_bw") == (
        "reseat or replace the cable between gpu001 and gpu002 on rail 3 and check the switch ports at both "
        "ends, then re-run ib_write_bw")
    assert link_action(found, "gpu005", 3, "ib_write_bw") == ""
    assert link_action(None, "gpu002", 3, "ib_write_bw") == ""


def test_a_suspect_node_names_its_own_port_and_iperf3_the_data_network():
    found = Attribution(suspect_nodes={"gpu004": "all 2 of its pairs failed"},
                        suspect_links={("gpu004", "gpu009"): "failed; no other pair tells the nodes apart"})
    assert link_action(found, "gpu004", None, "iperf3") == (
        "check gpu004's data-network port (NIC, cable, switch port): reseat its cable, then replace the "
        "transceiver or the NIC; reseat or replace the data-network cabling between gpu004 and gpu009 and "
        "check the switch ports at both ends, then re-run iperf3")
    assert "HCA port on rail 0" in link_action(found, "gpu004", 0, "ib_write_lat")
    assert "cable" in PORT_ACTION and "perfquery -x" in COUNTERS_ACTION


@pytest.mark.parametrize("problems, start", [
    (["GPU 3 (00000000:1B:00.0): 2 uncorrectable ECC error(s) (volatile)"], "drain the node and replace the GPU"),
    (["GPU 1: row remapping failed (RMA candidate)"], "drain the node and replace the GPU"),
    (["GPU 0: a row remap is pending (reset the GPU to apply it)"], "reset the GPU(s) named"),
    (["GPU 0: ECC is disabled, expected enabled"], "enable ECC (nvidia-smi -e 1)"),
])
def test_gpu_memory_errors_call_for_an_rma_a_reset_or_a_setting(problems, start):
    assert ecc_action(problems).startswith(start)


def test_critical_kernel_events_carry_nvidias_recommended_action_once_each():
    """A real dmesg of a GPU that fell off the bus (tests/data/kernel-log, PROVENANCE.md there)."""
    data = Path(__file__).parent / "data" / "kernel-log" / "bumblebee-issue554_dmesg_gpu_at_fallen_off_bus.txt"
    events = [e for e in kernel_log.parse_kernel_log(data.read_text()).events if e.severity == kernel_log.CRITICAL]
    assert events
    assert {(e.kind, e.code) for e in events} == {("xid", 79)}
    assert kernel_action(events + events) == f"xid 79: {kernel_log.XID_CATALOG[79][2]}"


def failing(node: str, name: str, area: str, action: str, **extra) -> dict:
    return {**check(node, name, "failed", area=area, kind="performance", message=f"{name} low on {node}"),
            "action": action, **extra}


WAIVED = {"reason": "RMA 4711", "owner": "ops@example.com", "expires": None}


def varied() -> dict:
    nodes = ["gpu001", "gpu002", "gpu003"]
    checks = [check(n, "memory") for n in nodes]
    checks += [check(n, "stress_ng", area="hardware") for n in nodes[:1]]
    checks += [failing("gpu002", "stress_ng", "hardware", "re-run stress-ng", waived=WAIVED)]
    checks += [failing(n, "iperf3", "network", "reseat the cable") for n in ("gpu002", "gpu003")]
    checks += [failing("gpu001", "ib_ports", "network", "replace the HCA")]
    checks += [check("gpu003", "stress_ng", area="hardware")]
    return results(nodes, checks, status="NOT CERTIFIED")


def test_the_per_area_summary_lists_failures_first():
    areas = build_view(varied()).areas
    assert [(a.area, a.status) for a in areas] == [("network", "failed"), ("hardware", "waived"),
                                                  ("system", "passed")]
    network = areas[0]
    assert network.counts == {"failed": 3}
    assert [(f.check, f.where, f.count, f.action) for f in network.failures] == [
        ("iperf3", "gpu[002-003]", 2, "reseat the cable"), ("ib_ports", "gpu001", 1, "replace the HCA")]
    assert network.failures[0].message == "iperf3 low on gpu002"
    hardware = areas[1]
    assert hardware.counts == {"waived": 1, "passed": 2}
    assert [(f.check, f.waived) for f in hardware.failures] == [("stress_ng", True)]


def test_the_report_shows_what_to_do_next_beside_each_failure():
    html = render_html(varied())
    area_table = html[html.index('<h3 class="spaced" id="areas">'):html.index('<h2 id="matrix">')]
    assert area_table.index("network") < area_table.index("hardware") < area_table.index("system")
    assert "<b>Next:</b> reseat the cable" in area_table
    assert "re-run stress-ng" not in area_table  # a waived failure is listed, with no action to take
    assert html.count("<p><b>What to do next:</b> reseat the cable</p>") == 2
    assert "<p><b>What to do next:</b> replace the HCA</p>" in html
