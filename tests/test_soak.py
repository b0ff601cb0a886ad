"""The soak: its sample parsers and judgements on real sample files, and one real soak on four
namespace nodes, through every way a soak is interrupted.

The end-to-end soak (about 75 s of load, mostly sleeping: one stress-ng worker at 5 % duty and
iperf3 rounds at 2 Mbit/s per node): the harness is killed with SIGKILL in the middle and the same
command re-attaches; node2's sshd is stopped for about 20 s (its supervisor goes on, the harness
collects the samples when it is back); node4's link is cut for good (named as dropped out); then
--soak-stop, with node4's link back, ends what is left and no process of the soak stays in any
node's namespace. The GPU parts cannot run here: they are judged on the sample format, from
tests/data/soak/ (PROVENANCE.md says how each file was made).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import hostlist
import pytest
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from nodes import ns_inventory, wait_until
from test_e2e import ROOT, handover, results_of, run_dir_of

from handover.failures import SanityFailure
from handover.plugin import stop_lines
from inventory.loader import InventoryError, load_inventory, load_profile
from inventory.model import ScratchPath
from reports.html import TEMPLATE_DIR
from reports.soak_view import soak_section, soak_table
from runners import soak
from runners.node_lock import NodeLocks, Owner
from runners.parsing import ParseError
from runners.payloads import soak_supervisor
from runners.payloads.soak_supervisor import Supervisor
from runners.transport import make_transport
from suites.checks import Metrics
from suites.conftest import Evidence
from suites.test_soak import LOAD_PARTS, SoakOutcome, far_below, judge_parts

DATA = Path(__file__).parent / "data" / "soak"
MIX = "cpu_workers=1,cpu_load=5,vm_workers=0,net_rate=2M,io_size=8M,io_rate=1m,round_s=10,interval_s=2,gpu=0"
DURATION = "75s"
WAIT_S = 120  # a safety bound on waiting for the soak's first samples, not a speed measure


# -- the parsers and judgements, on samples the supervisor wrote here -------------------------------


def test_a_real_cpu_soak_parses_into_its_start_samples_rounds_and_end():
    log = soak.parse_soak((DATA / "local_cpu_soak_node1.jsonl").read_text())
    assert log.start is not None and log.start["kind"] == "start" and log.start["gpus"] == 0
    assert log.end is not None and log.end["reason"] == "end time"
    assert len(log.times) >= 10 and "load1" in log.last
    cpu = soak.drift(log.parts, "cpu")
    net = soak.drift(log.parts, "net")
    assert cpu is not None and cpu.unit == "bogo-ops/s" and cpu.rounds >= 4 and cpu.failed == 0
    assert net is not None and net.unit == "Gbit/s" and 0 < net.median < 0.01  # iperf3 -b 2M
    assert soak.heartbeat_gaps(log.times, soak.gap_allowed(2)) == []
    assert soak.dropped_out(log, log.end["t"], 2) is None


def test_a_part_with_one_round_is_named_as_too_few_for_drift():
    """The real CPU soak's rounds; its first round alone stands for a GPU burn round of
    gpu_round_s in a soak shorter than two (the later part lines left out here)."""
    log = soak.parse_soak((DATA / "local_cpu_soak_node1.jsonl").read_text())
    assert soak.lone_round(log.parts, "cpu") is None and soak.drift(log.parts, "cpu") is not None
    first = next(p for p in log.parts if p.part == "cpu")
    one = [p for p in log.parts if p.part != "cpu"] + [first]
    assert soak.lone_round(one, "cpu") == first and soak.drift(one, "cpu") is None
    assert soak.lone_round(one, "cpu", until=first.t1 - 1) is None and soak.lone_round(one, "gpu") is None


def test_a_node_cut_off_mid_soak_is_dropped_out_and_its_torn_last_line_left_out():
    text = (DATA / "local_cpu_soak_node4_cut.jsonl").read_text()
    log = soak.parse_soak(text + '{"kind":"sample","t":')  # the harness died while appending
    assert log.torn == 1 and log.end is None
    plan_end = log.start["end"]
    why = soak.dropped_out(log, plan_end, 2)
    assert why is not None and "no end line" in why
    assert soak.dropped_out(log, plan_end, 2, stopped=True) is None  # --soak-stop ended it early


def test_a_line_cut_short_on_the_node_is_named_and_a_whole_record_is_not():
    """A sample line the supervisor's write did not finish, followed by whole ones (its scratch was
    full a moment): the record is not whole, and the heartbeat check says so."""
    lines = (DATA / "local_cpu_soak_node4_cut.jsonl").read_text().splitlines(keepends=True)
    assert soak.unreadable(soak.parse_soak("".join(lines))) is None
    sample = next(i for i, line in enumerate(lines) if '"kind":"sample"' in line)
    cut = lines[:sample] + [lines[sample][:40] + "\n"] + lines[sample + 1:]
    why = soak.unreadable(soak.parse_soak("".join(cut)))
    assert why is not None and why.startswith("1 line(s) of its samples are not whole"), why


def test_a_silent_node_drops_out_a_grace_after_it_fell_silent_once_the_end_has_passed():
    """A node that went quiet just before the end has DROP_GRACE_S to come back with its last
    samples; one silent that long already is named at the end, not waited for again."""
    end, grace = 1000.0, soak.DROP_GRACE_S
    late = soak.NodeState("node1")
    for now in (end - 5, end + grace - 10):
        late.unanswered("node1 unreachable", now, end)
        assert late.done is None
    late.unanswered("node1 unreachable", end + grace - 4, end)
    assert late.done == "dropped out"
    early = soak.NodeState("node2")
    early.unanswered("node2 unreachable", end - grace - 8, end)
    early.unanswered("node2 unreachable", end - 1, end)
    assert early.done is None  # silent long enough, but the soak still runs: it may come back
    early.unanswered("node2 unreachable", end + 4, end)
    assert early.done == "dropped out"
    back = soak.NodeState("node3")
    back.unanswered("node3 unreachable", end - grace - 8, end)
    back.answered("alive")
    back.unanswered("node3 unreachable", end + 4, end)
    assert back.done is None


@pytest.mark.parametrize("ended_after_s", [0, 3600], ids=["at-once", "an-hour-late"])
def test_a_supervisor_that_ended_early_did_not_soak_to_the_end(ended_after_s):
    """DERIVED from the real CPU soak: its lines up to its fifth sample, then an end line as the
    supervisor writes it on SIGTERM (at once), or as one whose sampling hung in a GPU's NVML read
    and came back after the end writes it (an hour late). Either way its samples stop early."""
    lines = (DATA / "local_cpu_soak_node1.jsonl").read_text().splitlines()
    whole = soak.parse_soak("\n".join(lines))
    samples = [i for i, line in enumerate(lines) if '"kind":"sample"' in line.replace(" ", "")]
    kept = lines[:samples[4] + 1]
    last = json.loads(kept[-1])["t"]
    ended = json.dumps({"kind": "end", "t": last + ended_after_s, "reason": "stopped (SIGTERM)"})
    log = soak.parse_soak("\n".join([*kept, ended]))
    plan_end = whole.start["end"]

    why = soak.dropped_out(log, plan_end, 2)

    assert why is not None and f"{plan_end - last:.0f} s before the end" in why and "stopped (SIGTERM)" in why
    assert soak.dropped_out(log, plan_end, 2, stopped=True) is None  # --soak-stop ended it early
    assert soak.dropped_out(whole, plan_end, 2) is None


def test_gpu_samples_name_new_xids_ecc_remaps_and_slowdowns_and_quiet_ones_pass():
    healthy = soak.parse_soak((DATA / "derived_h200_burn_nvml_as_soak_samples.jsonl").read_text())
    assert healthy.start["gpus"] == 1 and soak.gpu_problems(healthy) == []
    assert soak.peak(healthy, "gpus.temp_c") is not None and soak.peak(healthy, "gpus.power_w") > 100
    assert len(soak.trend(healthy, "gpus.temp_c", healthy.start["t"], points=10)) <= 10
    failing = soak.parse_soak((DATA / "derived_h200_soak_xid_ecc_remap_thermal.jsonl").read_text())
    problems = " | ".join(soak.gpu_problems(failing))
    assert "Xid 79" in problems and "new uncorrected ECC" in problems
    assert "rows remapped" in problems and "HW thermal slowdown" in problems


def test_counters_that_rose_are_named_though_the_last_sample_could_not_read_them():
    """DERIVED from the failing H200 samples: the last sample's ECC counts unreadable (as the
    supervisor writes a failed NVML read: the value null, the error beside it). The errors that
    arrived mid-soak are still named, by the same counts."""
    lines = (DATA / "derived_h200_soak_xid_ecc_remap_thermal.jsonl").read_text().splitlines()
    whole = [p for p in soak.gpu_problems(soak.parse_soak("\n".join(lines))) if "ECC" in p or "remap" in p]
    at = max(i for i, line in enumerate(lines) if '"kind":"sample"' in line)
    last = json.loads(lines[at])
    for gpu in last["gpus"]:
        gpu.update(ecc_uncorrected=None, ecc_corrected=None, remap=None,
                   errors={"ecc_uncorrected": "Unknown Error", "remap": "Unknown Error"})
    lines[at] = json.dumps(last)
    blind = [p for p in soak.gpu_problems(soak.parse_soak("\n".join(lines))) if "ECC" in p or "remap" in p]
    assert blind == whole and any("new uncorrected ECC" in p for p in whole)


def test_link_counters_are_summed_across_a_reset_and_an_unreadable_last_sample():
    """DERIVED from the real CPU soak's lines, with InfiniBand counters added: symbol_error 40 at
    the start, 40, cleared to 0, then 25 (25 new); link_downed 0, then 1, then unreadable."""
    lines = (DATA / "local_cpu_soak_node1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    samples = [r for r in records if r.get("kind") == "sample"]
    baseline = {"symbol_error": 40, "link_downed": 0}
    records[0]["baseline"] = {**records[0].get("baseline", {}), "ib": {"mlx5_0/1": baseline}}
    readings = (baseline, {"symbol_error": 0, "link_downed": 1}, {"symbol_error": 25, "link_downed": 1}, {})
    for sample, counters in zip(samples, readings, strict=False):
        sample["ib"] = {"mlx5_0/1": counters}
    for sample in samples[4:]:
        sample["ib"] = {"mlx5_0/1": {}}
    log = soak.parse_soak("\n".join(json.dumps(r) for r in records))
    assert soak.link_problems(log) == ["mlx5_0/1: link_downed +1", "mlx5_0/1: symbol_error +25"]


def test_a_link_counter_at_its_ceiling_is_named_since_its_rises_cannot_be_seen():
    """DERIVED from the real CPU soak's lines, with InfiniBand counters added: symbol_error (16
    bits) at 65535 from the start, link_downed (8 bits) reaching 255. IB error counters stop at
    their ceiling: no rise shows there, however many errors the port has."""
    lines = (DATA / "local_cpu_soak_node1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    records[0]["baseline"] = {**records[0].get("baseline", {}), "ib": {"mlx5_0/1": {"symbol_error": 65535,
                                                                                    "link_downed": 250}}}
    for sample in (r for r in records if r.get("kind") == "sample"):
        sample["ib"] = {"mlx5_0/1": {"symbol_error": 65535, "link_downed": 255}}
    log = soak.parse_soak("\n".join(json.dumps(r) for r in records))
    assert soak.link_problems(log) == [
        "mlx5_0/1: link_downed +5",
        "mlx5_0/1: link_downed saturated at 255 (it counts no further: clear the port's counters, "
        "perfquery -x -R, and soak again)",
        "mlx5_0/1: symbol_error saturated at 65535 (it counts no further: clear the port's counters, "
        "perfquery -x -R, and soak again)"]


def test_a_gpu_nvml_lost_mid_soak_is_named_with_the_time_it_fell_off():
    """From the derived H200 samples: from the middle on, GPU 0's every read fails as the
    supervisor writes it when NVML raises NVMLError_GpuIsLost (its text from nvidia-ml-py itself)."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra (make test installs it)")
    lost = str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    lines = (DATA / "derived_h200_burn_nvml_as_soak_samples.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    samples = [r for r in records if r["kind"] == "sample"]
    fell = samples[len(samples) // 2]
    for record in samples[len(samples) // 2:]:
        record["gpus"] = [{"gpu": 0, "errors": dict.fromkeys(("temp_c", "power_w", "reasons"), lost)}]
    log = soak.parse_soak("\n".join(json.dumps(r) for r in records))
    assert log.lost == {"0": fell["t"]}
    assert soak.gpu_problems(log)[0] == (f"GPU 0: NVML lost it at {soak.clock_utc(fell['t'])} "
                                         "(GPU is lost): fallen off the bus")


def test_an_xid_event_is_given_to_the_gpu_whose_handle_it_names():
    """NVML's event data holds a new ctypes pointer to the device, never == to the handle kept:
    the supervisor matches the addresses (nvidia-ml-py's own structures, no driver needed)."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra (make test installs it)")
    devices = [pynvml.struct_c_nvmlDevice_t() for _ in range(3)]
    supervisor = Supervisor.__new__(Supervisor)
    supervisor.gpus = [ctypes.cast(ctypes.pointer(device), pynvml.c_nvmlDevice_t) for device in devices]
    event = pynvml.c_nvmlEventData_t()
    event.device, event.eventData = ctypes.cast(ctypes.pointer(devices[2]), pynvml.c_nvmlDevice_t), 79
    assert event.device != supervisor.gpus[2]  # why the addresses are compared
    assert supervisor.gpu_of(event.device) == 2 and supervisor.gpu_of(pynvml.c_nvmlDevice_t()) is None


def test_without_a_driver_the_telemetry_and_the_xid_watch_say_why_in_their_lines(tmp_path):
    """The supervisor's NVML reads on this machine (nvidia-ml-py, no libnvidia-ml): each field of a
    GPU's sample keeps NVML's error, and the Xid watch ends with one event line saying why."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra (make test installs it)")
    (tmp_path / "config.json").write_text(json.dumps({"mix": {}, "end": 0}))
    supervisor = Supervisor(str(tmp_path))
    supervisor.nvml, supervisor.gpus = pynvml, [pynvml.c_nvmlDevice_t()]
    sample = supervisor.gpu_sample(0, supervisor.gpus[0])
    assert set(sample["errors"]) == {"temp_c", "power_w", "sm_mhz", "mem_mhz", "reasons", "ecc_uncorrected",
                                     "ecc_corrected", "remap"} and set(sample["errors"].values()) == {"Uninitialized"}
    supervisor.watch_xids()
    supervisor.out.close()
    lines = [json.loads(line) for line in (tmp_path / soak_supervisor.SAMPLES).read_text().splitlines()]
    assert [line["event"] for line in lines] == ["no Xid events: Uninitialized"]


def burn_round(t0: float, document: dict) -> dict:
    """A `part` line as the supervisor writes it for one GPU burn round of `document`."""
    value, unit, error, more = Supervisor.gpu_figure(0, json.dumps(document), "")
    return {"kind": "part", "part": "gpu", "t0": t0, "t1": t0 + 60, "value": value, "unit": unit,
            "exit": 0, "error": error, **more}


def test_a_gpu_whose_result_digest_differs_during_the_soak_is_silent_data_corruption():
    """Rounds of the real CPU burn's JSON (one device, 31 checks of one digest) for GPUs 0-2; in
    one round GPU 2's digest is changed in two checks (derived here: no corrupting GPU recorded)."""
    burn = json.loads((DATA / "local_gpu_burn_device_cpu.json").read_text())
    start = json.loads((DATA / "derived_h200_burn_nvml_as_soak_samples.jsonl").read_text().splitlines()[0])
    three = dict(burn, gpus=[dict(burn["gpus"][0], index=index) for index in range(3)])
    corrupt = json.loads(json.dumps(three))
    for check in corrupt["gpus"][2]["digests"][5:7]:
        check["digest"] = "00000000deadbeef" * 2
    quiet = soak.parse_soak("\n".join(json.dumps(r) for r in (start, burn_round(1, three), burn_round(61, three))))
    assert quiet.digests["2"] == {"ffffffffffeef1aaffffffff751120b5": 62} and soak.digest_problems(quiet) == []
    log = soak.parse_soak("\n".join(json.dumps(r) for r in (start, burn_round(1, three), burn_round(61, corrupt))))
    assert soak.gpu_problems(log) == ["GPU 2: result differs bit for bit from the reference in 2 of 62 checks "
                                      "during the soak: silent data corruption"]


def test_a_gpu_that_corrupts_every_result_differently_holds_a_bounded_tally():
    """A GPU giving a new wrong digest each check for a day must not grow its node's log: past
    DIGESTS_KEPT distinct digests they are only counted, and all of them count as wrong."""
    good = "ffffffffffeef1aaffffffff751120b5"
    rounds = [{"kind": "part", "part": "gpu", "t0": i, "t1": i + 1, "value": 1.0, "unit": "TFLOP/s",
               "digests": {"0": {good: 10}, "1": {f"{i:032x}": 10}}} for i in range(200)]
    log = soak.SoakReader().feed(json.dumps(r) for r in rounds).log()
    assert len(log.digests["1"]) == soak.DIGESTS_KEPT + 1
    assert soak.digest_problems(log) == ["GPU 1: result differs bit for bit from the reference in 2000 of 2000 "
                                         "checks during the soak: silent data corruption"]


class ScriptedEvents:
    """A stand-in for the driver's event set, which no machine here has: nvidia-ml-py's own
    functions and errors, but nvmlEventSetWait answers from a script, then ends the watch."""

    def __init__(self, pynvml, script, supervisor):
        self.pynvml, self.script, self.supervisor = pynvml, list(script), supervisor

    def __getattr__(self, name):
        return getattr(self.pynvml, name)

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, handle, types, events):
        assert types == self.pynvml.nvmlEventTypeXidCriticalError and events == "events"

    def nvmlEventSetWait(self, events, timeout_ms):
        if not self.script:
            self.supervisor.stop("end time")
            raise self.pynvml.NVMLError(self.pynvml.NVML_ERROR_TIMEOUT)
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_xid_watch_waits_through_timeouts_and_names_a_failing_wait_once(tmp_path):
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra (make test installs it)")
    (tmp_path / "config.json").write_text(json.dumps({"mix": {}, "end": 0}))
    supervisor = Supervisor(str(tmp_path))
    device = pynvml.struct_c_nvmlDevice_t()
    supervisor.gpus = [pynvml.c_nvmlDevice_t(), ctypes.cast(ctypes.pointer(device), pynvml.c_nvmlDevice_t)]
    event = pynvml.c_nvmlEventData_t()
    event.device, event.eventData = ctypes.cast(ctypes.pointer(device), pynvml.c_nvmlDevice_t), 79
    timeout, lost = (pynvml.NVMLError(code) for code in (pynvml.NVML_ERROR_TIMEOUT, pynvml.NVML_ERROR_GPU_IS_LOST))
    supervisor.nvml = ScriptedEvents(pynvml, [timeout, timeout, lost, lost, event], supervisor)
    supervisor.watch_xids()
    supervisor.out.close()
    lines = [json.loads(line) for line in (tmp_path / soak_supervisor.SAMPLES).read_text().splitlines()]
    assert [(line["kind"], line.get("event") or line.get("xid")) for line in lines] == \
        [("event", "Xid wait: GPU is lost"), ("xid", 79)]
    assert lines[1]["gpu"] == 1


def day_of_eight_gpus(samples: int) -> list[str]:
    """The derived H200 sample (tests/data/soak/PROVENANCE.md) for eight GPUs, every 5 s, with
    GPU 3 hotter from the middle on: derived, for the log's size, not a recording."""
    lines = (DATA / "derived_h200_burn_nvml_as_soak_samples.jsonl").read_text().splitlines()
    start, sample = json.loads(lines[0]), json.loads(lines[2])
    start["end"] = start["t"] + 5 * samples
    out = [json.dumps(start)]
    for index in range(samples):
        gpus = [dict(sample["gpus"][0], gpu=g) for g in range(8)]
        gpus[3]["temp_c"] = 60 + (20 if index >= samples // 2 else 0)
        out.append(json.dumps(dict(sample, t=start["t"] + 5 * index, gpus=gpus)))
    return out


def test_a_day_of_samples_is_reduced_as_it_is_read_to_its_peaks_and_trend_buckets():
    """17,280 samples (a day every 5 s) of eight GPUs: every sample's time is kept, the trend in at
    most TREND_BUCKETS points, whose mean follows GPU 3's step; the peak is the hottest GPU's."""
    lines = day_of_eight_gpus(17280)
    log = soak.SoakReader().feed(lines).log()
    assert len(log.times) == 17280 and log.last["t"] == log.times[-1]
    series = log.series["gpus.temp_c"]
    assert len(series) <= soak.TREND_BUCKETS and log.peaks["gpus.temp_c"] == 80
    assert series[0][1] == 60 and series[-1][1] == 80
    assert soak.heartbeat_gaps(log.times, soak.gap_allowed(5)) == []
    assert len(soak.trend(log, "gpus.temp_c", log.start["t"])) <= 120


def test_handover_parse_soak_prints_the_samples_as_json():
    done = handover("parse", "soak", DATA / "local_cpu_soak_node1.jsonl")
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    assert parsed["end"]["reason"] == "end time" and {p["part"] for p in parsed["parts"]} == {"cpu", "net"}
    assert handover("parse", "soak", DATA / "PROVENANCE.md").returncode == 2


def test_the_rails_are_the_active_infiniband_ports_in_device_order(tmp_path):
    """A /sys/class/infiniband tree in the kernel's formats (drivers/infiniband/core/sysfs.c:
    state_show, rate_show, link_layer_show), written here: no HCA on this machine to read."""
    ports = {("mlx5_10", "1"): ("4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand"),
             ("mlx5_2", "1"): ("4: ACTIVE", "200 Gb/sec (4X HDR)", "InfiniBand"),
             ("mlx5_3", "1"): ("1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand"),
             ("mlx5_bond_0", "1"): ("4: ACTIVE", "100 Gb/sec (4X EDR)", "Ethernet")}
    for (device, port), values in ports.items():
        folder = tmp_path / device / "ports" / port
        folder.mkdir(parents=True)
        for name, value in zip(("state", "rate", "link_layer"), values, strict=True):
            (folder / name).write_text(value + "\n")
    assert soak_supervisor.infiniband_rails(str(tmp_path)) == [("mlx5_2", "1", 200.0), ("mlx5_10", "1", 400.0)]
    assert soak_supervisor.infiniband_rails(str(tmp_path / "none")) == []


def test_each_rails_server_and_client_agree_on_everything_but_the_peer(tmp_path):
    """perftest's two sides must run the same test: iterations sized for a round at the port's
    rate (60 s at 400 Gb/s of 8 MiB messages), each rail on its own TCP port."""
    (tmp_path / "config.json").write_text(json.dumps({"mix": {"round_s": 60}, "end": 0, "ib_port": 5400}))
    supervisor = Supervisor(str(tmp_path))
    supervisor.rails = [("mlx5_0", "1", 400.0), ("mlx5_1", "1", 400.0)]
    server, client = supervisor.ib_argv(1), supervisor.ib_argv(1, "10.0.0.2")
    assert client == server + ["10.0.0.2"]
    assert server == ["ib_write_bw", "--ib-dev", "mlx5_1", "--ib-port", "1", "--port", "5401", "--size", "8388608",
                      "--iters", str(int(60 * 400e9 / (8 * 8388608))), "--report_gbits"]
    supervisor.out.close()
    (tmp_path / "config.json").write_text(json.dumps({"mix": {"round_s": 60}, "end": 0, "ib_port": 5400,
                                                      "peer_address": "fd00:77::2"}))
    supervisor = Supervisor(str(tmp_path))  # a pair on IPv6 addresses: both sides say so (runners.perftest)
    supervisor.rails = [("mlx5_0", "1", 400.0)]
    server, client = supervisor.ib_argv(0), supervisor.ib_argv(0, "fd00:77::2")
    assert server[-1] == "--ipv6-addr" and client == server + ["fd00:77::2"]
    supervisor.out.close()


def test_the_supervisor_reads_its_rounds_figures_from_real_tool_outputs():
    """The supervisor's own readers of stress-ng's YAML, iperf3's and fio's JSON, ib_write_bw's
    table and the burn payload's JSON."""
    stress = DATA.parent / "stress-ng"
    brief = (stress / "local_stressng01506_cpu_vm_metrics_brief.yaml").read_text()
    rate, unit, error = Supervisor.stress_figure(0, brief, "")
    assert rate > 0 and unit == "bogo-ops/s" and error is None
    killed = stress / "local_stressng01506_error_worker_sigkilled"
    assert Supervisor.stress_figure(2, Path(f"{killed}.stdout.yaml").read_text(),
                                    Path(f"{killed}.stderr.txt").read_text())[2]
    iperf3 = DATA.parent / "iperf3"
    gbps, unit, error = Supervisor.iperf3_figure(0, (iperf3 / "local_iperf312_tcp_client_P2.json").read_text(), "")
    assert gbps > 0 and unit == "Gbit/s" and error is None
    refused = Supervisor.iperf3_figure(0, (iperf3 / "local_iperf312_error_connection_refused.json").read_text(), "")
    assert refused[0] is None and "refused" in refused[2]
    fio = DATA.parent / "fio"
    mbps, unit, error = Supervisor.io_figure(0, (fio / "local_fio333_seqwrite_1M.json").read_text(), "")
    assert round(mbps) == 1683 and unit == "MB/s" and error is None  # write.bw_bytes 1,682,915,265
    enotdir = fio / "local_fio333_error_enotdir"
    failed = Supervisor.io_figure(1, Path(f"{enotdir}.json").read_text(), Path(f"{enotdir}.stderr.txt").read_text())
    assert failed[0] is None and "Not a directory" in failed[2]
    perftest = DATA.parent / "perftest"
    gbps, unit, error = Supervisor.ib_figure(0, (perftest / "superbench_ib_loopback_8M_size.log").read_text(), "")
    assert round(gbps, 2) == 201.80 and unit == "Gbit/s" and error is None  # 24056.72 MB/sec (MiB/s)
    no_device = perftest / "local_perftest45_ib_write_bw_ERROR_no_rdma_device"
    missing = Supervisor.ib_figure(1, Path(f"{no_device}.stdout.txt").read_text(),
                                   Path(f"{no_device}.stderr.txt").read_text())
    assert missing[0] is None and "Unable to find the Infiniband/RoCE device" in missing[2]
    burn = (DATA / "local_gpu_burn_device_cpu.json").read_text()
    tflops, unit, error, more = Supervisor.gpu_figure(0, burn, "")
    assert tflops > 0 and unit == "TFLOP/s" and error is None
    assert more == {"digests": {"0": {"ffffffffffeef1aaffffffff751120b5": 31}}}  # 31 checks, one result
    broken = json.loads(burn)
    broken["gpus"][0]["error"] = "CUDA error: an illegal memory access was encountered"  # derived: one GPU failed
    assert "illegal memory access" in Supervisor.gpu_figure(1, json.dumps(broken), "")[2]


def test_link_error_counters_that_rose_are_named_by_port():
    """Constructed in the supervisor's sample format (no InfiniBand here): counters as the
    supervisor reads them from /sys/class/infiniband/<hca>/ports/<n>/counters."""
    start = {"kind": "start", "t": 0, "baseline": {"ib": {"mlx5_0/1": {"symbol_error": 0, "link_downed": 1}}}}
    last = {"kind": "sample", "t": 60, "ib": {"mlx5_0/1": {"symbol_error": 5, "link_downed": 1}}}
    log = soak.parse_soak("\n".join(json.dumps(r) for r in (start, last)))
    assert soak.link_problems(log) == ["mlx5_0/1: symbol_error +5"]


def test_trends_draw_the_worst_nodes_first_and_the_median_above_a_handful():
    lines = {f"node{i}": [(0.0, 40.0 + i), (1.0, 50.0 + i)] for i in range(1, 11)}
    hottest = soak.worst_first(lines, high_is_bad=True, shown_max=8, worst_shown=3)
    assert list(hottest) == ["node10", "node9", "node8", "median of all nodes"]
    assert hottest["median of all nodes"] == [(0.0, 45.5), (1.0, 55.5)]
    slowest = soak.worst_first(dict(list(lines.items())[:4]), high_is_bad=False, shown_max=8, worst_shown=3)
    assert list(slowest) == ["node1", "node2", "node3", "node4"]


def flat(line: list[tuple[float, float]]) -> list[float]:
    """A line's points as one list, which pytest.approx compares (it takes no nested tuples)."""
    return [value for point in line for value in point]


def test_the_median_of_lines_is_taken_by_time_and_racks_get_one_each():
    """Lines whose points fall at other moments and in other numbers (a node that dropped out
    has fewer) meet in time bins, not by index."""
    lines = {"a": [(0.0, 10.0), (1.0, 20.0), (2.0, 30.0)], "b": [(0.01, 12.0), (1.01, 22.0)],
             "c": [(0.0, 14.0), (2.0, 34.0)], "d": [(0.0, 99.0)]}
    assert flat(soak.median_line(lines.values(), points=3)) == pytest.approx(flat([(0.0025, 13.0), (1.005, 21.0),
                                                                                   (2.0, 32.0)]))
    racks = soak.group_lines(lines, {"a": "r1", "b": "r1", "c": "r2", "d": None})
    assert list(racks) == ["r1 (2 nodes)", "r2 (1 node)"]
    assert flat(racks["r1 (2 nodes)"]) == pytest.approx(flat([(0.005, 11.0), (1.005, 21.0), (2.0, 30.0)]))
    assert racks["r2 (1 node)"] == [(0.0, 14.0), (2.0, 34.0)]
    assert soak.group_lines(lines, {"a": "r1", "b": "r1"}) == {}  # one rack: nothing to compare
    many = {f"r{i:02d} (1 node)": [(0.0, float(i))] for i in range(10)}
    assert list(soak.worst_first(many, high_is_bad=True, shown_max=8, worst_shown=2, of="racks")) == \
        ["r09 (1 node)", "r08 (1 node)", "median of all racks"]


def test_text_that_is_not_soak_samples_is_a_parse_error():
    with pytest.raises(ParseError):
        soak.parse_soak("stress-ng: info: [1] dispatching hogs\n")
    with pytest.raises(ParseError):
        soak.parse_soak('{"tool": "fio"}\n')


@pytest.mark.parametrize("text", ["24", "1x", "-5m", "0s", "h", "99999999d", "721h"])
def test_a_bad_duration_is_one_line_naming_the_option(text):
    with pytest.raises(soak.SoakError, match="--soak-duration") as raised:
        soak.parse_duration(text)
    assert "\n" not in str(raised.value)


def test_durations_and_mixes():
    assert [soak.parse_duration(t) for t in ("90s", "30m", "24h", "1.5d", "30d")] == [90, 1800, 86400, 129600,
                                                                                    soak.MAX_DURATION_S]
    assert soak.parse_mix("cpu_load=10,net_rate=2M")["cpu_load"] == 10
    with pytest.raises(soak.SoakError, match="cpu_lod"):
        soak.parse_mix("cpu_lod=10")


@pytest.mark.parametrize("item, problem", [
    ("round_s=0", "round_s: expected a positive number of seconds, got 0"),
    ("round_s=nan", "round_s: expected a positive number of seconds, got nan"),
    ("gpu_round_s=inf", "gpu_round_s: expected a positive number of seconds, got inf"),
    ("interval_s=-1", "interval_s: expected a positive number of seconds, got -1"),
    ("cpu_workers=-3", "cpu_workers: expected 0 or more, got -3"),
    ("cpu_load=500", "cpu_load: expected 0 to 100 (% duty), got 500"),
    ("io_size=-1G", "io_size: expected a size such as 1G, got '-1G'"),
    ("vm_bytes=2T", "vm_bytes: expected a size such as 4G, or a share of memory such as 10%, got '2T'"),
    ("net_rate=fast", "net_rate: expected a rate such as 20M, or 0 for no limit, got 'fast'"),
])
def test_a_mix_value_no_round_could_run_with_is_refused_before_the_soak(item, problem):
    """round_s=0 would run no round for the whole soak, and a size a tool refuses would fail
    every round of it: both are one line at the start, as the profile's `soak:` is."""
    with pytest.raises(soak.SoakError) as raised:
        soak.parse_mix(item)
    assert str(raised.value) == f"--soak-mix {item!r}: {problem}"


def test_a_load_part_whose_rounds_stop_while_the_node_samples_on_is_named():
    """DERIVED from the real CPU soak: its lines, then its samples again ten minutes on (the
    supervisor sampling on), and no later round (the round threads died). Due until the soak's
    end or the node's last sample, whichever comes first, or until its peer dropped out."""
    lines = (DATA / "local_cpu_soak_node1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    later = [json.dumps(dict(r, t=r["t"] + 600)) for r in records if r["kind"] == "sample"]
    whole = soak.parse_soak("\n".join(lines))
    log = soak.parse_soak("\n".join([*lines[:-1], *later]))
    mix = soak.parse_mix(MIX)
    plan = soak.SoakPlan("s", "t", whole.start["t"], whole.start["end"] + 600, mix, {})
    last = max(p.t1 for p in log.parts if p.part == "cpu")

    why = soak.rounds_stop_early(plan, log, "cpu")

    assert why == (f"its rounds stop at {soak.clock_utc(last)}, {max(log.times) - last:.0f} s before they were "
                   f"due to ({soak.clock_utc(max(log.times))}): the load stopped, the node did not")
    assert soak.rounds_stop_early(plan, log, "net", until=last + 10) is None  # its peer dropped out then
    assert soak.rounds_stop_early(replace(plan, end=whole.start["end"]), log, "cpu") is None  # they reach the end
    assert soak.rounds_stop_early(plan, whole, "cpu") is None  # the node's samples stop with them
    assert soak.rounds_stop_early(plan, log, "gpu") is None  # no round at all is no_round's


def test_a_round_whose_output_no_reader_expected_is_a_failed_round_and_the_rounds_go_on(tmp_path):
    """A reader that raises (a tool's new output format) once ended the part's thread: its load
    stopped and nothing said so. Now the round fails, naming why, and the next one runs."""
    (tmp_path / "config.json").write_text(json.dumps({"mix": {"round_s": 2}, "end": time.time() + 3600}))
    supervisor = Supervisor(str(tmp_path))
    readings = iter([ValueError("could not convert string to float: 'n/a'")])

    def measure(seconds):
        reading = next(readings, None)
        if reading is not None:
            raise reading
        supervisor.stop("end time")  # the second round is the last
        return 0, 1.5, "bogo-ops/s", None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(soak_supervisor, "ERROR_HOLD_S", 0)
        supervisor.rounds("cpu", measure)
    supervisor.out.close()
    rounds = [json.loads(line) for line in (tmp_path / soak_supervisor.SAMPLES).read_text().splitlines()]
    assert [(r["value"], r["error"]) for r in rounds] == [
        (None, "ValueError: could not convert string to float: 'n/a'"), (1.5, None)]


def failed_cpu_rounds_without_stress_ng(folder: Path, rounds: int) -> list[dict]:
    """REAL: the supervisor's own CPU part (stress-ng rounds) run here with stress-ng hidden from
    its PATH, as on a GPU machine without it (tests/data/h200-1gpu/system.txt): its part lines."""
    (folder / "config.json").write_text(json.dumps({"mix": {"round_s": 2}, "end": time.time() + 3600}))
    supervisor = Supervisor(str(folder))
    stress = supervisor.tool(supervisor.stress_argv, supervisor.stress_figure)
    ran = []

    def measure(seconds):
        ran.append(seconds)
        if len(ran) > rounds:
            supervisor.stop("end time")
        return stress(seconds)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", str(folder))  # nothing there: stress-ng is nowhere on it
        patch.setattr(soak_supervisor, "ERROR_HOLD_S", 0)
        supervisor.rounds("cpu", measure)
    supervisor.out.close()
    return [json.loads(line) for line in (folder / soak_supervisor.SAMPLES).read_text().splitlines()]


def test_a_soak_load_whose_cpu_rounds_all_failed_still_records_and_judges_its_gpu_figures(tmp_path, request):
    """The device proof's soak where stress-ng is missing: every CPU round fails, and soak_load
    fails for it, with the same message as before; the GPU burn's figures (soak_gpu_retained,
    which the profile's band judges) are in the check's metrics all the same, judged. The GPU
    rounds and telemetry are the derived H200 samples (PROVENANCE.md); the failed CPU rounds are
    real (above), their times moved into that soak's minute, a round every 20 s."""
    h200 = (DATA / "derived_h200_burn_nvml_as_soak_samples.jsonl").read_text().splitlines()
    started = json.loads(h200[0])["t"]
    failed = failed_cpu_rounds_without_stress_ng(tmp_path, 3)
    assert [r["value"] for r in failed] == [None] * 3 and {r["error"] for r in failed} == {
        "[Errno 2] No such file or directory: 'stress-ng'"}
    moved = [json.dumps(dict(r, t0=started + 20 * i, t1=started + 20 * i + 0.01)) for i, r in enumerate(failed)]
    log = soak.parse_soak("\n".join([*h200[:-1], *moved, h200[-1]]))
    plan = soak.SoakPlan("proof", "tag", started, log.end["t"], soak.parse_mix("round_s=20,gpu_round_s=30"),
                         {"localhost": soak.NodePlan(dir=str(tmp_path))})
    profile = load_profile("h200-sxm-8gpu")
    outcome = SoakOutcome(plan, {"localhost": log}, {}, tmp_path, far_below({"localhost": log}, plan, profile))
    record = Evidence(request.node)

    with pytest.raises(SanityFailure) as raised:
        judge_parts(outcome, "localhost", LOAD_PARTS, record, Metrics("soak_load", profile, record.metrics),
                    required=("cpu", "gpu"))

    assert str(raised.value) == ("localhost: stress-ng CPU: 3 round(s) failed, last: "
                                 "[Errno 2] No such file or directory: 'stress-ng'")
    (rows,) = [value for key, value in request.node.user_properties if key == "handover_metrics"]
    measured = {row["name"]: row for row in rows}
    assert set(measured) == {"soak_gpu_tflops", "soak_gpu_retained"}
    assert measured["soak_gpu_retained"]["value"] == round(100 * 655.2 / 656.6, 1)
    assert measured["soak_gpu_retained"]["ok"] is True and measured["soak_gpu_retained"]["criterion"]
    assert measured["soak_gpu_tflops"]["value"] == round((656.6 + 655.2) / 2, 3)
    # DERIVED: the second burn round at 600 TFLOP/s, 91.4% of the first: its miss follows the failed rounds
    slower = soak.parse_soak("\n".join([*h200[:-1], *moved, h200[-1]]).replace('"value":655.2', '"value":600.0'))
    with pytest.raises(SanityFailure) as raised:
        judge_parts(replace(outcome, logs={"localhost": slower}), "localhost", LOAD_PARTS, record,
                    Metrics("soak_load", profile, record.metrics), required=("cpu", "gpu"))
    assert str(raised.value).startswith("localhost: stress-ng CPU: 3 round(s) failed, last: [Errno 2] No such file "
                                        "or directory: 'stress-ng'; soak_gpu_retained = 91.4 %, expected >= ")


def test_a_gpu_node_whose_burn_ran_no_round_says_why():
    """The derived H200 samples without their burn rounds: a soak shorter than half a GPU round
    never burns; one long enough that still has none says so plainly; a stopped soak is let be."""
    lines = (DATA / "derived_h200_burn_nvml_as_soak_samples.jsonl").read_text().splitlines()
    log = soak.parse_soak("\n".join(line for line in lines if '"kind":"part"' not in line.replace(" ", "")))
    assert log.start["gpus"] == 1 and not log.parts
    mix = soak.parse_mix("")
    short = soak.SoakPlan("s", "t", 0.0, 120.0, mix, {}, {})
    assert soak.no_round(short, log, "gpu") == \
        "no round ran: the soak's 120 s is shorter than half a round (gpu_round_s=300)"
    assert soak.no_round(replace(short, end=3600.0), log, "gpu") == "no round ran"
    assert soak.no_round(replace(short, stopped=True), log, "gpu") is None
    assert soak.no_round(short, soak.parse_soak("\n".join(lines)), "gpu") is None


def profile_with_soak(tmp_path: Path, soak_yaml: str) -> Path:
    """cpu-only.yaml as shipped, renamed, with a `soak:` key."""
    source = (ROOT / "inventory" / "profiles" / "cpu-only.yaml").read_text()
    path = tmp_path / "soak-test.yaml"
    path.write_text(source.replace("profile: cpu-only", "profile: soak-test") + "\n" + soak_yaml)
    return path


def test_a_profiles_soak_key_sets_the_mix_and_soak_mix_overrides_it_key_by_key(tmp_path):
    profile = load_profile(str(profile_with_soak(tmp_path, "soak: {cpu_load: 80, round_s: 30, io_size: 4G}\n")))
    assert profile.soak_mix == {"cpu_load": 80, "round_s": 30.0, "io_size": "4G"}
    mix = soak.parse_mix("cpu_load=10", profile.soak_mix)
    assert (mix["cpu_load"], mix["round_s"], mix["io_size"], mix["interval_s"]) == (10, 30.0, "4G", 5)
    assert load_profile("h100-sxm-8gpu").soak_mix == {}


@pytest.mark.parametrize("written, problem", [
    ("soak: {cpu_load: 120}", "soak.cpu_load: expected 0 to 100 (% duty), got 120"),
    ("soak: {round_s: 0}", "soak.round_s: expected a positive number of seconds, got 0"),
    ("soak: {round_s: .nan}", "soak.round_s: expected a finite number, got .nan"),
    ("soak: {io_size: -1G}", "soak.io_size: expected a size such as 1G, got '-1G'"),
    ("soak: {vm_workers: two}", "soak.vm_workers: expected an integer"),
    ("soak: {cpu_lod: 10}", "soak.cpu_lod: unknown key; did you mean 'cpu_load'?"),
], ids=["duty", "round", "nan", "size", "integer", "typo"])
def test_a_wrong_soak_key_is_one_line_naming_the_field(tmp_path, written, problem):
    path = profile_with_soak(tmp_path, written + "\n")
    with pytest.raises(InventoryError) as raised:
        load_profile(str(path))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}:") and problem in message, message


def test_where_the_nodes_have_gpus_a_soak_covers_two_gpu_burn_rounds_too():
    """A GPU profile judges soak_gpu_retained, the drift of the GPU burn's rounds (gpu_round_s=300
    by default): a 5-minute soak there would run one round and fail that band for want of a
    second, which is the soak's length, not the GPUs."""
    default = soak.parse_mix(None)
    assert soak.too_short(300, default) is None
    assert soak.too_short(300, default, gpus=True) == (
        "--soak-duration 300s is shorter than two GPU burn rounds (gpu_round_s=300), and a soak is judged by "
        "its first rounds against its last: give at least 600s, or a smaller gpu_round_s in --soak-mix")
    assert soak.too_short(600, default, gpus=True) is None
    assert soak.too_short(300, soak.parse_mix("gpu=0"), gpus=True) is None  # no GPU burn in the mix
    assert soak.too_short(180, soak.parse_mix("gpu_round_s=60"), gpus=True) is None  # the device proof's
    assert "two load rounds (round_s=60)" in soak.too_short(60, default, gpus=True)


@pytest.mark.parametrize("option, says", [
    (["--soak-duration", "24x"], "--soak-duration '24x'"),
    (["--soak-duration", "15s"], "--soak-duration 15s is shorter than two load rounds (round_s=60), and a soak is "
                                 "judged by its first rounds against its last: give at least 120s"),
    (["--soak-duration", "60s"], "--soak-duration 60s is shorter than two load rounds (round_s=60)"),
    (["--soak-attach", "."], "--soak-attach: soak.json: no such file"),
    (["--soak-stop", "."], "--soak-stop: soak.json: no such file"),
    (["--soak-stop", "README.md"], "--soak-stop: README.md/soak.json: no such file; README.md is not a soak's run")])
def test_bad_soak_options_are_one_line_and_a_usage_error(option, says, tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest", "--inventory", "inventory/local.yaml", "--out",
                           str(tmp_path), "-m", "soak", *option], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())



def test_under_slurm_the_soaks_batch_job_holds_its_nodes_whole_for_the_soak_and_an_hour_to_collect(tmp_path):
    """The inventory's partition, account and reservation; its time_limit bounds a run's
    allocation, not a soak's job, whose time is the soak's and SLURM_LINGER_S."""
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster: c\nprofile: cpu-only\ntransport: slurm\nscratch: [{path: /scratch, kind: local}]\n"
                    "launch: {partition: acceptance, account: ops, reservation: handover, time_limit: 30}\n"
                    "nodes: [{name: gpu001, address: 10.0.0.1}, {name: gpu002, address: 10.0.0.2}]\n")
    cluster = load_inventory(path)
    plan = soak.new_plan(list(cluster.nodes), cluster.scratch, 24 * 3600, soak.parse_mix("gpu=0"))
    argv = soak.sbatch_argv(plan, ["gpu001", "gpu002"], cluster.launch, "/tmp/job.sh")
    [minutes] = [int(a.removeprefix("--time=")) for a in argv if a.startswith("--time=")]
    assert 25 * 60 < minutes <= 25 * 60 + 3  # a day's soak, the hour its samples may wait, the rounds' slack
    assert argv == ["sbatch", "--parsable", f"--job-name=handover-soak-{plan.soak_id}", "--nodelist=gpu001,gpu002",
                    "--nodes=2", "--exclusive", "--no-requeue", "--output=/dev/null", "--error=/dev/null",
                    "--partition=acceptance", "--account=ops", "--reservation=handover", f"--time={minutes}",
                    "/tmp/job.sh"]
    script = soak.batch_script(plan, tmp_path, "/usr/bin/python3")
    command, heredoc, rest = script.partition(" <<'HANDOVER_SOAK_BATCH'\n")
    shebang, comment, command = command.split("\n", 2)
    srun = shlex.split(command.removeprefix("exec "))
    assert shebang == "#!/bin/sh" and comment.startswith(f"# handover soak {plan.soak_id}: ") and heredoc
    assert srun == ["srun", "--ntasks-per-node=1", "--input=all", "--kill-on-bad-exit=0", "--no-kill", "--quiet",
                    "/usr/bin/python3", "-c", soak.BOOT]
    line, end = rest.split("\n", 1)
    assert end == "HANDOVER_SOAK_BATCH\n"  # the batch is one line of the here-document
    batch = json.loads(line)
    assert sorted(batch["payloads"]) == ["soak_supervisor"]  # gpu=0: no GPU burn payload
    assert {name: (config["dir"], config["linger_s"], config["tag"]) for name, config in batch["configs"].items()} == {
        name: (plan.nodes[name].dir, soak.SLURM_LINGER_S, plan.tag) for name in ("gpu001", "gpu002")}


def test_a_supervisor_held_by_a_slurm_job_removes_its_folder_at_once_on_sigterm(tmp_path):
    """SIGTERM to a held supervisor is its job ending (a scancel, its time limit): Slurm kills what
    is left after KillWait, so it does not wait the hour for a collection; a detached one does."""
    folder = tmp_path / "soak"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"mix": {}, "end": time.time() + 3600, "linger_s": 3600}))
    detached = Supervisor(str(folder))
    detached.terminate()
    detached.out.close()
    assert detached.reason == "stopped (SIGTERM)" and detached.lingers
    held = Supervisor(str(folder), held=True)
    held.terminate()
    held.linger()  # lingering, it would wait an hour for DIR/collected
    assert held.reason == "stopped (SIGTERM)" and not folder.exists()

# -- one real soak on namespace nodes --------------------------------------------------------------


def namespace_processes(cluster, name: str) -> list[str]:
    """'PID comm' of every process in the node's network namespace but its sshd."""
    pids = subprocess.run(["ip", "netns", "pids", cluster.node(name).namespace], capture_output=True,
                          text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm != "sshd":
            found.append(f"{pid} {comm}")
    return found


def kill_sshd(cluster, name: str) -> None:
    """Stop every sshd of the node (the listener and any session), so nothing reaches it."""
    cluster.stop_sshd(name)
    for pid in subprocess.run(["ip", "netns", "pids", cluster.node(name).namespace], capture_output=True,
                              text=True).stdout.split():
        try:  # a session may end between the listing and the look (the killed harness's, here)
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                os.kill(int(pid), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            continue


def samples_of(path: Path) -> int:
    return path.read_text().count('"kind":"sample"') if path.exists() else 0


@pytest.fixture(scope="module")
def soaked(module_ns_cluster_factory, sign_key, tmp_path_factory):
    cluster = module_ns_cluster_factory(4)
    tmp = tmp_path_factory.mktemp("soak")
    scratch, shared = tmp / "scratch", tmp / "shared"  # the nodes share this machine's filesystem
    scratch.mkdir()
    shared.mkdir()
    racks = {"node1": "r1", "node2": "r1", "node3": "r2", "node4": "r2"}
    inventory = cluster.write_inventory(tmp / "cluster.yaml", extra={"scratch": [
        {"path": str(scratch), "kind": "local"}, {"path": str(shared), "kind": "shared"}],
        "nodes": [{"name": n.name, "address": n.address, "rack": racks[n.name]} for n in cluster.nodes]})
    out = tmp / "out"
    command = [sys.executable, "-m", "pytest", "--inventory", str(inventory), "--out", str(out), "--sign-key",
               str(sign_key), "-p", "no:cacheprovider", "-m", "soak", "--soak-duration", DURATION, "--soak-mix", MIX]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    raw = out / "nscluster" / "latest" / "raw" / "soak"
    deadline = time.monotonic() + WAIT_S
    while min(samples_of(raw / f"node{i}.jsonl") for i in range(1, 5)) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    first.kill()  # SIGKILL: the harness gets no chance to say anything to the nodes
    killed_output = first.communicate()[0]
    alive_after_kill = {name: namespace_processes(cluster, name) for name in cluster.node_names()}
    kill_sshd(cluster, "node2")
    cluster.link_down("node4")
    second = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(20)
    cluster.start_sshd("node2")
    attached_output = second.communicate(timeout=600)[0]
    run_dir = run_dir_of(out, "nscluster")
    cluster.link_up("node4")  # node4's supervisor ended at the end time; it waits to be collected
    # A second soak while the first's supervisor still holds node4, stopped mid-run while its
    # harness follows it.
    third = subprocess.Popen(command[:-4] + ["--soak-duration", "10m", "--soak-mix", MIX], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and (run_dir_of(out, "nscluster") == run_dir or min(
            samples_of(run_dir_of(out, "nscluster") / "raw" / "soak" / f"node{i}.jsonl") for i in (1, 2, 3)) < 2):
        time.sleep(0.5)
    second_run = run_dir_of(out, "nscluster")
    stop = [sys.executable, "-m", "pytest", "--inventory", str(inventory), "--soak-stop"]
    stopped_mid_run = subprocess.run(stop + [str(second_run)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    third_output = third.communicate(timeout=300)[0]
    stopped = subprocess.run(stop + [str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return {"cluster": cluster, "run_dir": run_dir, "scratch": scratch, "shared": shared, "killed": killed_output,
            "alive_after_kill": alive_after_kill, "attached": attached_output, "second": second.returncode,
            "second_run": second_run, "stopped_mid_run": stopped_mid_run, "third": third_output, "stopped": stopped}


def entry(results: dict, check: str, node: str) -> dict:
    return next(c for c in results["checks"] if c["check"] == check and c["node"] == node)


def test_the_supervisors_outlive_the_killed_harness(soaked):
    for name, processes in soaked["alive_after_kill"].items():
        assert any("python" in p for p in processes), (name, processes, soaked["killed"])


def test_the_same_command_reattaches_and_the_run_has_samples_of_the_whole_period(soaked):
    assert "attaching to the soak in" in soaked["attached"], soaked["attached"]
    assert "[handover] soak: " in soaked["attached"] and " nodes alive" in soaked["attached"]
    run_dir = soaked["run_dir"]
    plan = soak.SoakPlan.load(run_dir)
    results = results_of(run_dir)
    for name in ("node1", "node2", "node3"):
        log = soak.parse_soak((run_dir / "raw" / "soak" / f"{name}.jsonl").read_text())
        assert log.end is not None and log.end["reason"] == "end time", name
        assert min(log.times) - plan.started < 10 and plan.end - max(log.times) < 10, name
        assert soak.heartbeat_gaps(log.times, soak.gap_allowed(plan.interval_s)) == [], name
        heartbeat = entry(results, "soak_heartbeat", name)
        assert heartbeat["outcome"] == "passed", heartbeat
        load = entry(results, "soak_load", name)
        measured = {m["name"] for m in load["metrics"]}
        # node3 sent to node4, whose link was cut at the start of the re-attached run
        assert measured >= ({"soak_cpu_rate"} if name == "node3" else {"soak_cpu_rate", "soak_net_gbps"}), load
        io = entry(results, "soak_io", name)
        io_rate = {m["name"]: m["value"] for m in io["metrics"]}
        assert io["outcome"] == "passed" and 0 < io_rate["soak_io_mbps"] <= 2.5, io  # fio --rate=1m: 1 MB/s each way
        assert io_rate["soak_io_retained"] >= 50, io
        rails = entry(results, "soak_ib", name)
        assert rails["outcome"] == "skipped" and rails["message"] == f"no active InfiniBand port on {name}", rails
        kernel = entry(results, "soak_kernel_log", name)  # this VM's own kernel log, read over SSH as root
        assert kernel["outcome"] == "passed" and kernel["message"].endswith("during the soak: no event"), kernel


def test_the_loads_tools_and_their_versions_are_in_the_provenance(soaked):
    tools = {(t["node"], t["tool"]): t["version"] for t in results_of(soaked["run_dir"])["run"]["tools"]}
    stress = subprocess.run(["stress-ng", "--version"], capture_output=True, text=True).stdout
    assert tools[("node1", "stress-ng")] in stress and {("node1", "iperf3"), ("node1", "fio")} <= set(tools), tools


def test_a_node_whose_sshd_stopped_has_its_samples_collected_when_it_is_back(soaked):
    """node2 answered nothing for about 20 s; its supervisor went on and nothing is missing."""
    log = soak.parse_soak((soaked["run_dir"] / "raw" / "soak" / "node2.jsonl").read_text())
    plan = soak.SoakPlan.load(soaked["run_dir"])
    assert len(log.times) >= (plan.duration_s / plan.interval_s) * 0.8


def test_a_node_whose_link_is_cut_is_named_as_dropped_out(soaked):
    results = results_of(soaked["run_dir"])
    heartbeat = entry(results, "soak_heartbeat", "node4")
    assert heartbeat["outcome"] == "failed" and heartbeat["kind"] == "unreachable"
    assert "node4 dropped out of the soak" in heartbeat["message"]
    assert entry(results, "soak_kernel_log", "node4")["kind"] == "unreachable"
    assert soaked["second"] == 1  # the gate fails on it
    assert "peer node4 dropped out" in entry(results, "soak_load", "node3")["message"]
    trends = next(c for c in results["checks"] if c["check"] == "soak_trends")
    assert any(s["name"].startswith("soak throughput") for s in trends["series"])
    by_rack = next(s for s in trends["series"] if s["name"] == "soak throughput by rack: stress-ng CPU rate")
    # node4's link was cut before its first round ended: rack r2's line is node3's alone
    assert sorted(line["label"] for line in by_rack["lines"]) == ["r1 (2 nodes)", "r2 (1 node)"], by_rack
    worst = results["soak"]["nodes"][0]
    assert worst["node"] == "node4" and "soak_heartbeat" in worst["failed"]
    assert results["soak"]["trends"] == [s["name"] for s in trends["series"]]


def test_the_report_draws_the_soaked_nodes_worst_first(soaked):
    html = (soaked["run_dir"] / "report.html").read_text()
    assert '<a href="#soak">Soak</a>' in html
    rows = re.findall(r"<tr(?: class=\"bad\")?>\s*<td>(node\d)</td>", html[html.index('id="soak-nodes"'):])
    assert rows[0] == "node4" and sorted(rows[:4]) == ["node1", "node2", "node3", "node4"], html
    environment = Environment(loader=FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True, undefined=StrictUndefined)
    assert environment.get_template("soak.html.j2").render(soak=None).strip() == ""


def test_a_fleets_soak_table_lists_the_failed_nodes_then_a_few_more():
    failed = [{"node": f"gpu{i:04d}", "status": "failed", "failed": ["soak_heartbeat"], "reasons": ["gap"]}
              for i in (3, 7)]
    passed = [{"node": f"gpu{i:04d}", "status": "passed", "failed": [], "reasons": []}
              for i in range(1, 101) if i not in (3, 7)]
    section = {"soak": {"nodes": failed + passed, "trends": []}}  # worst first, as results.json has it
    table = soak_table(section, shown=5)
    assert [row.node for row in table.rows] == ["gpu0003", "gpu0007", "gpu0001", "gpu0002", "gpu0004",
                                                "gpu0005", "gpu0006"]
    assert table.left_out == 93
    assert len(soak_table(section).rows) == 100 and soak_table(section).left_out == 0
    assert table.columns == []  # no node has a figure: no GPU, rail or shared scratch column either
    passed[0].update(cpu_retained_pct=97.5, samples=10)
    assert soak_table(section).columns == ["CPU kept", "samples"]
    assert soak_table(section).rows[2].figures == ["97.5 %", "10"]


def test_a_node_whose_soak_checks_were_all_skipped_reads_skipped_not_passed():
    """The soak did not run on node2 (every check skipped); on node1 one ran and the others were
    skipped for want of what they load (no InfiniBand): node1 passed, node2 skipped."""
    def check(name: str, node: str, outcome: str) -> dict:
        return {"check": name, "node": node, "outcome": outcome, "message": "", "metrics": []}

    section = soak_section([check("soak_load", "node1", "passed"), check("soak_ib", "node1", "skipped"),
                            check("soak_load", "node2", "skipped"), check("soak_ib", "node2", "skipped")])
    assert section is not None
    assert {row["node"]: row["status"] for row in section["nodes"]} == {"node1": "passed", "node2": "skipped"}


def stopped_on(stdout: str) -> dict[str, str]:
    """--soak-stop's lines: node -> what happened there."""
    outcome = {}
    for match in re.finditer(r"^handover: soak \S+ on (\S+)(?: \([\d,]+ nodes\))?: (.*)$", stdout, re.MULTILINE):
        outcome.update(dict.fromkeys(hostlist.expand_hostlist(match[1]), match[2]))
    return outcome


def test_soak_stop_says_what_happened_in_a_line_per_outcome_not_per_node():
    outcome = {f"gpu{i:04d}": "stopped; its samples are in raw/" for i in range(1, 1025)}
    outcome["gpu0007"] = "not reached: gpu0007 unreachable: lost at 10:00:00"
    assert stop_lines("s1", outcome) == [
        "handover: soak s1 on gpu[0001-0006,0008-1024] (1,023 nodes): stopped; its samples are in raw/",
        "handover: soak s1 on gpu0007: not reached: gpu0007 unreachable: lost at 10:00:00"]
    assert stopped_on("\n".join(stop_lines("s1", outcome)))["gpu1024"] == "stopped; its samples are in raw/"


def test_a_second_soak_is_refused_where_one_runs_and_stopping_it_mid_run_is_judged_as_far_as_it_got(
        soaked, trusted_signers):
    stopped = soaked["stopped_mid_run"]
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped_on(stopped.stdout)["node1"] == "stopped; the harness following it has its samples", stopped.stdout
    results = results_of(soaked["second_run"])
    refused = entry(results, "soak_heartbeat", "node4")
    assert refused["outcome"] == "failed" and "another soak runs there" in refused["message"], refused
    assert soaked["run_dir"].name in refused["message"]  # the holder names the first soak's run
    for name in ("node1", "node2", "node3"):
        assert entry(results, "soak_heartbeat", name)["outcome"] == "passed", soaked["third"]
        log = soak.parse_soak((soaked["second_run"] / "raw" / "soak" / f"{name}.jsonl").read_text())
        assert log.end["reason"] == "stopped by the harness"
    assert soak.SoakPlan.load(soaked["second_run"]).stopped
    verified = handover("verify", soaked["second_run"], "--allowed-signers", trusted_signers)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_soak_stop_leaves_nothing_running_and_nothing_in_scratch(soaked, trusted_signers):
    stopped = soaked["stopped"]
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # node4's supervisor, cut off from the harness, had ended its load at the end time by itself
    # and waited to be collected; told so, it removed its folder and ended
    assert stopped_on(stopped.stdout)["node4"].startswith("stopped; the run was already signed"), stopped.stdout
    for name in soaked["cluster"].node_names():
        assert namespace_processes(soaked["cluster"], name) == [], name
    assert list(soaked["scratch"].iterdir()) == [] and list(soaked["shared"].iterdir()) == [], stopped.stdout
    verified = handover("verify", soaked["run_dir"], "--allowed-signers", trusted_signers)
    assert verified.returncode == 0, verified.stdout + verified.stderr  # the signed run is left as it was


# -- a soak's hold on its node, and its bound, on one namespace node -------------------------------

ACCEPTANCE = Owner(run_id="20260101T000000Z-0badcafe", started="2026-01-01T00:00:00+00:00",
                   host="bastion.example", token="feedfacefeedface")


def supervisors(cluster) -> list[str]:
    """The soak supervisors on node1 (the test's open connection has processes there too)."""
    return [process for process in namespace_processes(cluster, "node1") if "python" in process]


def gone_within(seconds: float, scratch: Path, cluster) -> bool:
    """Whether node1's supervisor has ended and left scratch empty within the time."""
    deadline = time.monotonic() + seconds
    while (list(scratch.iterdir()) or supervisors(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return list(scratch.iterdir()) == [] and supervisors(cluster) == []


def lock_state(transport, soak_id: str = "") -> tuple[str, str]:
    """An acceptance run's try at the node's lock (released at once): its state and why."""
    locks = NodeLocks(ACCEPTANCE, {"node1": transport})
    taken = locks.take(soak_id=soak_id)["node1"]
    locks.release()
    return taken.state, taken.describe()


def test_a_soaks_load_holds_its_node_and_an_uncollected_soak_removes_itself_at_its_bound(
        ns_cluster_factory, tmp_path):
    """While the load runs, an acceptance run finds the node busy with the soak (its own
    re-attaching harness does not); past the end the soak only keeps its samples and the node is
    free; never collected, the supervisor removes its folder and ends at end + linger_s."""
    cluster = ns_cluster_factory(1)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    node = ns_inventory(cluster, tmp_path / "cluster.yaml").nodes[0]
    # 20 s of load: the supervisor's start and two lock tries must fit before its end on a busy machine
    plan = soak.new_plan([node], [ScratchPath(str(scratch))], 20, soak.parse_mix("cpu=0,gpu=0,interval_s=1"))
    transport = make_transport(node)
    try:
        assert soak.start(transport, plan, tmp_path, linger_s=4).ok
        state, why = lock_state(transport)
        assert state == "busy" and f"node1 is in use by soak {plan.soak_id} of {tmp_path}, until " in why, why
        assert lock_state(transport, soak_id=plan.soak_id)[0] == "held"
        while time.time() < plan.end + 1:
            time.sleep(0.5)
        assert lock_state(transport)[0] == "held"  # the load has ended: the samples wait, not the node
        second = soak.new_plan([node], [ScratchPath(str(scratch))], 6, plan.mix)
        refused = soak.start(transport, second, tmp_path)
        assert refused.exit_code == 75 and plan.soak_id in soak.holder(refused.stdout)
        assert gone_within(60, scratch, cluster)  # a safety bound on the wait, not a speed measure
        assert soak.start(transport, second, tmp_path, linger_s=0).ok  # the lock went with its supervisor
        assert soak.tell(transport, second.nodes["node1"].dir, "stop").ok
        assert gone_within(60, scratch, cluster)
    finally:
        transport.close()


def test_a_supervisor_that_died_has_its_tools_ended_and_its_folders_removed(ns_cluster_factory, tmp_path):
    """A supervisor SIGKILLed mid-soak (as the OOM killer or a crash ends it) cannot clean up: its
    fio round runs on and its folders stay (the shared one holds fio's file, 1 GiB by default).
    The harness collects its samples, then ends its tools and removes both folders."""
    cluster = ns_cluster_factory(1)
    local, shared, run_dir = tmp_path / "scratch", tmp_path / "shared", tmp_path / "run"
    for folder in (local, shared, run_dir):
        folder.mkdir()
    node = ns_inventory(cluster, tmp_path / "cluster.yaml").nodes[0]
    plan = soak.new_plan([node], [ScratchPath(str(local)), ScratchPath(str(shared), kind="shared")], 60,
                         soak.parse_mix("cpu=0,gpu=0,interval_s=1,round_s=20,io_size=1M,io_rate=1m"))
    run = soak.SoakRun(plan, run_dir, {"node1": node})
    try:
        assert run.start_all()["node1"].ok
        folder = Path(plan.nodes["node1"].dir)
        samples, fio_files = folder / soak_supervisor.SAMPLES, Path(plan.nodes["node1"].io_dir)
        assert wait_until(lambda: samples.exists() and '"kind":"sample"' in samples.read_text()
                          and any(fio_files.glob("*")), WAIT_S)
        os.kill(int((folder / "pid").read_text()), signal.SIGKILL)
        run.follow()
    finally:
        run.close()
    assert run.states["node1"].done == "gone"
    assert soak.parse_soak(run.raw_path("node1").read_text()).times  # its samples came first
    assert list(local.iterdir()) == [] and list(shared.iterdir()) == []
    assert namespace_processes(cluster, "node1") == []


def test_a_start_the_harness_gave_up_on_leaves_no_supervisor_running(ns_cluster_factory, tmp_path, monkeypatch):
    """A start whose answer never came (its timeout, on a slow node) may have started the
    supervisor all the same; the node is refused, so neither followed nor stopped: what it left
    is ended at once. The lost answer is made here; the supervisor it stands for is real."""
    cluster = ns_cluster_factory(1)
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    scratch.mkdir()
    run_dir.mkdir()
    node = ns_inventory(cluster, tmp_path / "cluster.yaml").nodes[0]
    plan = soak.new_plan([node], [ScratchPath(str(scratch))], 60, soak.parse_mix("cpu=0,gpu=0,interval_s=1"))
    real_start = soak.start

    def answer_lost(transport, plan, run_dir, linger_s=soak.LINGER_S):
        started = real_start(transport, plan, run_dir, linger_s)
        assert started.ok, started.explain()
        return replace(started, exit_code=None, timed_out=True)

    monkeypatch.setattr(soak, "start", answer_lost)
    run = soak.SoakRun(plan, run_dir, {"node1": node})
    try:
        run.start_all()
    finally:
        run.close()
    assert plan.refused["node1"].startswith("the supervisor did not start: ")
    assert gone_within(60, scratch, cluster)  # a safety bound on the wait, not a speed measure


HUNG_MAIN_LOOP = """
import sys, threading
from runners.payloads import soak_supervisor
soak_supervisor.HUNG_AFTER_S = 1
supervisor = soak_supervisor.Supervisor(sys.argv[1])
samples, read = [], supervisor.sample
def sample():  # the third never returns, as an NVML read of a GPU fallen off the bus
    samples.append(1)
    if len(samples) > 2:
        threading.Event().wait()
    return read()
supervisor.sample = sample
supervisor.main()
"""


def test_a_supervisor_whose_main_loop_hangs_ends_its_load_by_its_bound(tmp_path):
    """Its main loop stuck in a sample, a supervisor never reached its end line, and its load
    and servers ran on until the node rebooted: its bound ends them and the process after the
    end, with an event line saying so (the harness then finds it gone and removes its folder)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "soak_id": "hung", "node": "localhost", "end": time.time() + 2, "interval_s": 0.5, "linger_s": 5,
        "mix": {"cpu": 0, "gpu": 0, "ib": 0, "io": 0}}))
    done = subprocess.run([sys.executable, "-c", HUNG_MAIN_LOOP, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # a bound if the bound fails
    assert done.returncode == soak_supervisor.EXIT_HUNG, done.stderr
    lines = [json.loads(line) for line in (tmp_path / soak_supervisor.SAMPLES).read_text().splitlines()]
    assert lines[-1]["kind"] == "event" and lines[-1]["event"] == (
        "the load did not end within 1 s of end time: ended by the supervisor's bound")
    assert not [line for line in lines if line["kind"] == "end"]
