"""The network suite end to end: pytest against real namespace nodes, then results.json read back.

Ring (quick) and all pairs (full) of iperf3, judged per node with the node's pairs as evidence:
a node whose link is down named as the suspect while its partners pass, a node slowed by a
token bucket whose pairs are low or failed, port health that skips without an HCA on cpu-only
and fails on a profile expecting HCAs; every node's pairs (peer, state, figure, pass) and the
median they were judged against, as the suite judged them once.
"""
from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from test_e2e import results_of, run_dir_of, run_suites

from suites.checks import depth_of_selection

ROOT = Path(__file__).resolve().parent.parent
SUITE = str(ROOT / "suites" / "test_network.py")



def checks(results: dict, name: str) -> dict:
    """{node (or node-railR) id, or the function name for a cluster-wide check: check}."""
    return {c["test_id"].split("::")[-1].split("[")[-1].rstrip("]"): c
            for c in results["checks"] if c["check"] == name}


def peers(check: dict, state: str | None = None, second: bool = False) -> set[str]:
    """The peers of a node's pairs (of one state), first pass or second."""
    return {link["peer"] for link in check["pairs"]
            if (state is None or link["state"] == state) and link["pass"] == (2 if second else 1)}


@pytest.mark.parametrize("markexpr, depth", [
    ("", "full"), ("quick", "quick"), ("full", "full"), ("network", "full"), ("network and quick", "quick"),
    ("not full", "quick"), ("full and not quick", "full"), ("system or full", "full"), ("not quick", "full"),
])
def test_the_pair_schedule_follows_the_depth_minus_m_selects(markexpr, depth):
    """Pair checks are marked quick and full; -m decides whether a full-only check would run."""
    assert depth_of_selection(markexpr, "network") == depth


def test_quick_runs_the_ring_and_passes_on_four_nodes(ns_cluster, sign_key, tmp_path):
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml")
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-m", "quick")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    nodes = checks(results, "iperf3")
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]  # one check per node, not per pair
    for check in nodes.values():
        assert check["outcome"] == "passed" and check["node"] in nodes, check
        bandwidth = next(m for m in check["metrics"] if m["name"] == "iperf3_bandwidth")
        assert bandwidth["unit"] == "Gb/s" and bandwidth["value"] > 0 and bandwidth["ok"]
        assert all(link["state"] == "ok" and link["figure"] > 0 for link in check["pairs"]), check
        assert "2 pair(s) (quick): best" in check["message"]
    assert peers(nodes["node1"]) == {"node2", "node4"} and peers(nodes["node3"]) == {"node2", "node4"}
    assert (run_dir / "raw" / "iperf3_node1-node2" / "node2.stdout").is_file()
    assert "raw/iperf3_node1-node2/node2.stdout" in nodes["node1"]["raw"]
    assert not any("node3-node4" in path for path in nodes["node1"]["raw"])  # only its own pairs
    medians = {c["pair_median"] for c in nodes.values()}  # one median of the ring, 4 figures
    assert len(medians) == 1 and next(iter(medians)) > 0
    ports = checks(results, "ib_ports")
    assert {c["outcome"] for c in ports.values()} == {"skipped"}
    assert "no InfiniBand/RoCE device" in next(iter(ports.values()))["message"]
    assert checks(results, "network_attribution")["test_network_attribution"]["outcome"] == "passed"
    counters = checks(results, "ib_counters")
    assert {c["outcome"] for c in counters.values()} == {"skipped"} and len(counters) == 4
    assert "/sys/class/infiniband does not exist" in counters["node1"]["message"]
    for tool in ("ib_write_bw", "ib_write_lat"):
        rails = checks(results, tool)
        assert sorted(rails) == [f"{node}-rail0" for node in sorted(nodes)]
        for check in rails.values():
            # the real no-device path: perftest ran on the nodes and exited 1
            assert check["outcome"] == "skipped" and check["rail"] == 0, check
            assert "Unable to find the Infiniband/RoCE device" in check["message"]
    assert (run_dir / "raw" / "ib_write_bw_node1-node2-rail0" / "node2.stderr").is_file()
    # cpu-only's pair_low_fraction reaches the report: heatmap and attribution share the threshold
    assert results["run"]["pair_low_fraction"] == 0.75
    assert "low vs median (over 75% off)" in (run_dir / "report.html").read_text()


def test_full_with_a_dead_link_names_the_node_and_spares_its_partners(ns_cluster_factory, sign_key, tmp_path):
    nodes = ns_cluster_factory(4)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    nodes.link_down("node4")
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-m", "full", "-k", "iperf3 or attribution")
    assert done.returncode == 1, done.stdout[-3000:]
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    found = checks(results, "iperf3")
    assert {node: c["outcome"] for node, c in found.items()} == {
        "node1": "passed", "node2": "passed", "node3": "passed", "node4": "failed"}
    assert found["node4"]["kind"] == "unreachable", found["node4"]
    assert found["node4"]["action"].startswith("check the node's power, BMC and network link")
    for node in ("node1", "node2", "node3"):  # every pair at full depth; the one with node4 failed
        assert peers(found[node]) == {"node1", "node2", "node3", "node4"} - {node}
        assert peers(found[node], "failed") == {"node4"}, found[node]["pairs"]
        assert "low or failed: node4 failed" in found[node]["message"]
    assert peers(found["node4"], "failed") == {"node1", "node2", "node3"}  # recorded before raising
    assert {c["pair_median"] for c in found.values()} != {None}  # 3 figures: a median
    summary = checks(results, "network_attribution")["test_network_attribution"]
    assert summary["outcome"] == "failed" and "node node4" in summary["message"]
    assert "link" not in summary["message"].replace("all 3", "")
    report = (run_dir_of(tmp_path / "out", "nscluster") / "report.html").read_text()
    assert 'id="pairs"' in report and report.count('class="hc hc-broken" ') == 6  # 3 pairs, both halves
    assert report.count('class="hc hc-broken" href') == 3  # node4's row links to its failed check
    assert '<th scope="row" title="node4" class="suspect">node4</th>' in report


def test_profile_expecting_hcas_fails_where_there_are_none(ns_cluster, sign_key, tmp_path):
    """Port health, counters and every rail of ib_write_bw/ib_write_lat fail: no RDMA device."""
    profile = tmp_path / "ib-test.yaml"
    profile.write_text((ROOT / "inventory" / "profiles" / "cpu-only.yaml").read_text()
                       .replace("profile: cpu-only", "profile: ib-test")
                       .replace('kernel_min: "4.18"', 'kernel_min: "4.18"\n  ib_hcas: 2\n  ib_rate: 400'))
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", profile=str(profile),
                                           nodes=["node1", "node2"])
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE,
                      "-k", "ib_ports or ib_counters or ib_write")
    assert done.returncode == 1, done.stdout[-3000:]
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    check = checks(results, "ib_ports")["node1"]
    assert check["outcome"] == "failed" and check["kind"] == "expectation"
    assert "expects 2 HCA(s)" in check["message"]
    assert checks(results, "ib_counters")["node2"]["outcome"] == "failed"
    for tool in ("ib_write_bw", "ib_write_lat"):
        rails = checks(results, tool)
        assert sorted(rails) == ["node1-rail0", "node1-rail1", "node2-rail0", "node2-rail1"]
        for rail in rails.values():
            assert rail["outcome"] == "failed" and rail["kind"] == "expectation", rail
            assert "Unable to find the Infiniband/RoCE device" in rail["message"]
            assert "expects 2 HCA(s)" in rail["message"]


def test_iperf3_uses_the_data_address_the_inventory_names(ns_cluster, sign_key, tmp_path):
    """data_address 'node1' (the node's name, which its generated /etc/hosts resolves) instead
    of the SSH address: the client's own JSON says where it connected."""
    inventory = ns_cluster.write_inventory(tmp_path / "cluster.yaml", nodes=["node1", "node2"])
    text = inventory.read_text().replace("- name: node1\n", "- name: node1\n  data_address: node1\n")
    assert "data_address: node1" in text
    inventory.write_text(text)
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-k", "iperf3 or ib_ports")
    assert done.returncode == 0, done.stdout[-3000:]
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    assert {c["outcome"] for c in checks(results_of(run_dir), "iperf3").values()} == {"passed"}
    client = (run_dir / "raw" / "iperf3_node1-node2" / "node2.stdout").read_text()
    assert '"host":\t"node1"' in client or '"host": "node1"' in client, client[:600]


def test_quick_second_pass_clears_the_node_between_two_dead_ones(ns_cluster_factory, sign_key, tmp_path):
    """Six real nodes in a ring, node3 and node5 cut off: node4's both ring pairs fail through no
    fault of its own. The second pass (real iperf3, rounds of disjoint pairs on their own ports)
    re-pairs the failing nodes with node1, the one node all of whose pairs passed: node4 passes
    and is cleared; node3 and node5 fail again and are the suspects."""
    nodes = ns_cluster_factory(6)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    nodes.link_down("node3")
    nodes.link_down("node5")
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-m", "quick", "-k", "iperf3 or attribution")
    assert done.returncode == 1, done.stdout[-3000:]
    run_dir = run_dir_of(tmp_path / "out", "nscluster")
    results = results_of(run_dir)
    found = checks(results, "iperf3")
    assert {node for node, c in found.items() if c["outcome"] == "failed"} == {"node3", "node5"}
    assert peers(found["node4"], "failed") == {"node3", "node5"}  # both its ring pairs failed...
    assert peers(found["node4"], "ok", second=True) == {"node1"}  # ...and it passed with node1
    assert peers(found["node2"], "failed") == {"node3"} and peers(found["node2"], "ok") == {"node1"}
    summary = checks(results, "network_attribution")["test_network_attribution"]
    message = summary["message"]
    assert summary["outcome"] == "failed" and "node node3: not reached during its pairs: unreachable: lost at " \
        in message, message
    assert "node node5: not reached during its pairs" in message and "node node4" not in message
    assert "failed again with node1 in the second pass" in message
    assert "cleared node4: failed with node3, node5, passed with node1 in the second pass" in message
    second = run_dir / "raw" / "iperf3_second_pass_node1-node4"
    assert (second / "node4.stdout").is_file() and (second / "node1.stdout").is_file()
    assert not (run_dir / "raw" / "iperf3_second_pass_node1-node2").exists()  # measured in the first pass
    assert "raw/iperf3_second_pass_node1-node4/node4.stdout" in summary["raw"]
    assert "raw/iperf3_second_pass_node1-node4/node4.stdout" in found["node4"]["raw"]


def test_quick_a_slow_node_makes_its_pairs_low_or_failed_and_the_others_ok(ns_cluster_factory, sign_key, tmp_path):
    """Five real nodes in a ring, node5 sending through a 200 Mbit/s token bucket on its eth0:
    node5 is the iperf3 client (the sender) of both its ring pairs, so they measure a fraction
    of the others. The median of the ring's five figures is then one of the three unshaped
    pairs, so theirs are ok whatever the machine's speed; node5's are low (within the smoke
    floor, far below the median) or failed (below the floor). node5's check fails, its partners'
    pass on their other pair; every node carries the one median its pairs were judged against,
    and attribution, judging by the same rule, names node5."""
    nodes = ns_cluster_factory(5)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    shaped = nodes.node_exec("node5", ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "200mbit",
                                       "burst", "64kb", "latency", "100ms"], timeout=10)
    assert shaped.returncode == 0, shaped.stderr
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-m", "quick", "-k", "iperf3 or attribution")
    assert done.returncode == 1, done.stdout[-3000:]
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    found = checks(results, "iperf3")
    assert {node: c["outcome"] for node, c in found.items()} == {
        "node1": "passed", "node2": "passed", "node3": "passed", "node4": "passed", "node5": "failed"}
    assert found["node5"]["kind"] == "performance" and "suspect node" in found["node5"]["message"]
    assert found["node5"]["action"].startswith("check node5's data-network port (NIC, cable, switch port)")
    assert {link["state"] for link in found["node5"]["pairs"]} <= {"low", "failed"}, found["node5"]
    assert peers(found["node1"], "ok") == {"node2"} and peers(found["node4"], "ok") == {"node3"}
    assert peers(found["node3"], "ok") == {"node2", "node4"}  # the first pass; a second may run slower
    medians = {c["pair_median"] for c in found.values()}
    assert len(medians) == 1 and next(iter(medians)) > 0, medians
    summary = checks(results, "network_attribution")["test_network_attribution"]
    assert summary["outcome"] == "failed" and "node node5" in summary["message"], summary["message"]


def test_a_partner_that_was_not_reached_is_named_not_taken_for_a_measurement(ns_cluster_factory, sign_key, tmp_path):
    """Two nodes, node2 cut off: node1's only pair measured nothing. Its check names node2 as not
    reached (kind unreachable: a resume runs it again), where it read as iperf3's refused or
    timed-out connect, a sanity failure of node1's; the attribution blames node2, not the link."""
    nodes = ns_cluster_factory(2)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    nodes.link_down("node2")
    done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-m", "quick", "-k", "iperf3 or attribution")
    assert done.returncode == 1, done.stdout[-3000:]
    results = results_of(run_dir_of(tmp_path / "out", "nscluster"))
    found = checks(results, "iperf3")
    assert (found["node2"]["kind"], found["node1"]["kind"]) == ("unreachable", "unreachable"), found
    assert "its partner node2 unreachable: " in found["node1"]["message"], found["node1"]["message"]
    summary = checks(results, "network_attribution")["test_network_attribution"]
    assert "node node2: not reached during its pairs" in summary["message"] and "link " not in summary["message"]


def test_a_node_lost_between_its_pairs_fails_them_as_unreachable_and_its_partners_pass(
        ns_cluster_factory, sign_key, tmp_path):
    """node2's link cut once its first ring pair has run: that pair measured well, its second
    measured nothing. Its check is unreachable (a resume measures its links again), where it
    failed as performance on attribution's words; node3, its partner after the cut, passes."""
    from test_faults import processes_named, when

    nodes = ns_cluster_factory(4)
    inventory = nodes.write_inventory(tmp_path / "cluster.yaml")
    namespace = nodes.node("node2").namespace
    cut = threading.Event()
    first_pair: set[int] = set()  # node2's iperf3 processes as first seen

    def first_pair_done() -> bool:
        """Its first pair's processes have ended, whether or not its second pair's have started:
        the gap between the two can be shorter than a look at /proc on a busy machine."""
        running = set(processes_named("iperf3", namespace))
        if not first_pair:
            first_pair.update(running)
            return False
        return not first_pair & running

    def cut_link():
        nodes.link_down("node2")
        cut.set()

    cutter = when(first_pair_done, cut_link, within_s=240)
    try:
        done = run_suites(inventory, tmp_path / "out", sign_key, SUITE, "-m", "quick", "-k", "iperf3 or attribution")
    finally:
        cutter.join(1)
        nodes.link_up("node2")
    assert cut.is_set() and done.returncode == 1, done.stdout[-3000:]
    found = checks(results_of(run_dir_of(tmp_path / "out", "nscluster")), "iperf3")
    assert found["node2"]["kind"] == "unreachable", found["node2"]
    # The cut falls between node2's pairs (attribution's words), or, on a busy machine, just after
    # its second pair's command started (the transport's): either way it measured nothing.
    assert re.search(r"not reached during its pairs|^node2 unreachable: no answer to SSH keepalives",
                     found["node2"]["message"]), found["node2"]
    assert peers(found["node2"], "ok") and found["node3"]["outcome"] == "passed", found
