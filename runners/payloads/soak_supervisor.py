"""Node side: the soak supervisor, a burn-in that outlives the harness on purpose.

    sh -c 'cat > DIR/soak_supervisor.py && exec PYTHON DIR/soak_supervisor.py start CONFIG_JSON'

`start` takes the node's soak lock (flock on a file in /dev/shm, named by the network namespace as
runners.node_lock names its own), refuses with exit 75 and the holder's JSON when another soak has
it, writes CONFIG_JSON to DIR/config.json, and re-executes itself detached (`setsid`, a fresh
environment without the connection's lease and with the soak's own tag), so the watchdog of the
harness's connection does not end it. The lock's open file goes with it, so the lock lives as long
as the supervisor. It prints {"started": true, "pid": PID} and exits.

`hold` does what `start` does, then runs the supervisor in its own process instead of a detached
one: under Slurm, each node's task of the soak's batch job (runners.soak.batch_script), which
Slurm keeps running without the harness and ends with the job; SIGTERM (the job ending) then
skips the lingering and removes DIR at once.

`run` (the detached process) runs the load mix until the end time: stress-ng rounds on the CPUs
and memory, an iperf3 server and rate-limited client rounds to the peer the harness named, fio
rounds in the node's own folder of the shared scratch path where the harness named one (removed
when the load ends), the GPU burn payload in rounds where GPUs are. Every interval it appends a
sample to DIR/samples.jsonl (load, memory, CPU temperature where readable, NVML telemetry per
GPU, InfiniBand error counters) and rewrites DIR/heartbeat; each finished round is a `part` line
with its figure, each NVML Xid event an `xid` line. At the end time, on SIGTERM, or when DIR/stop
appears, it ends its load and writes an `end` line. It then waits for DIR/collected (the harness
has copied everything), or the hard bound `linger_s` after the end, removes DIR and exits.
Standard library only; pynvml is used where the node's Python has it.
"""
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

LOCK_DIR = "/dev/shm"
EXIT_BUSY = 75
SAMPLES = "samples.jsonl"
KILL_GRACE_S = 5
# After the end (or a stop), how long the main loop may take to end the load before the bound ends
# it: a sample that never returns (an NVML read of a GPU fallen off the bus) holds it for good.
HUNG_AFTER_S = 300
EXIT_HUNG = 70
ROUND_GRACE_S = 20  # a round that runs this much past its time hangs (a dead link): it is ended
# The peer's server is not (yet) there to take the round: iperf3's still closes the last one,
# ib_write_bw's restarts after each test. Tried again each second, for a minute at most.
RETRY = ("the server is busy", "Couldn't connect to")
RETRY_FOR_S = 60
IB_MESSAGE = 8388608  # 8 MiB, where HDR/NDR ports reach line rate (runners.perftest's size)
IB_UNKNOWN_RATE_GBPS = 200  # a port whose sysfs rate cannot be read
IB_STRETCH = 2  # an ib round sized for round_s at the port's rate may take this much longer
NET_PAUSE_S = 1.0  # between iperf3 rounds: the peer's server resets itself after each test
ERROR_HOLD_S = 5.0  # a failed round is kept only if the soak does not end this soon after it
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors")
STRIPPED = ("HANDOVER_LEASE", "HANDOVER_TAG")  # the connection's: the soak carries its own tag
# The load's tools and how each says its version (stress-ng, version 0.15.06 (...); iperf 3.12
# (cJSON ...); fio-3.33; Version: 6.06), for the report's provenance.
TOOL_VERSIONS = {"stress-ng": ["stress-ng", "--version"], "iperf3": ["iperf3", "--version"],
                 "fio": ["fio", "--version"], "ib_write_bw": ["ib_write_bw", "--version"]}
VERSION = re.compile(r"\d+(?:\.\d+)+")
STRESS_RATE = re.compile(r"^\s*bogo-ops-per-second-real-time:\s*([0-9.eE+-]+)", re.M)
STRESS_NAME = re.compile(r"^\s*-\s*stressor:\s*(\S+)", re.M)


def lock_path():
    try:
        namespace = "".join(ch for ch in os.readlink("/proc/self/ns/net") if ch.isdigit())
    except OSError:
        namespace = ""
    return os.path.join(LOCK_DIR, "handover-soak-%s.lock" % namespace)


def claim(config_text):
    """The node's soak lock and the soak's config.json: (config, the lock's descriptor). Another
    soak holds the node: its holder's JSON on stdout, the folder removed, exit 75."""
    config = json.loads(config_text)
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        print(json.dumps({"started": False, "busy": holder}))
        shutil.rmtree(config["dir"], ignore_errors=True)
        sys.exit(EXIT_BUSY)
    with open(os.path.join(config["dir"], "config.json"), "w") as out:
        out.write(config_text)
    return config, fd


def record_holder(fd, config, pid):
    """The lock file says which soak holds the node (runners.node_lock reads it); DIR/pid, which."""
    holder = {"soak_id": config["soak_id"], "node": config["node"], "dir": config["dir"], "pid": pid,
              "end": config["end"], "run_dir": config.get("run_dir")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    with open(os.path.join(config["dir"], "pid"), "w") as out:
        out.write("%d\n" % pid)


def soak_environment(config):
    env = {key: value for key, value in os.environ.items() if key not in STRIPPED}
    env.update(HANDOVER_TAG=config["tag"], HANDOVER_SOAK=config["soak_id"])
    return env


def start(config_text):
    config, fd = claim(config_text)
    directory = config["dir"]
    os.set_inheritable(fd, True)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(directory, "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "run", directory],
                  soak_environment(config))
    record_holder(fd, config, pid)
    print(json.dumps({"started": True, "pid": pid}))


def hold(config_text):
    """The supervisor in this process, for as long as the soak: under Slurm it is the task of the
    soak's batch job (runners.soak.batch_script), which is what outlives the harness there, and
    Slurm ends it with the job. The lock lives with this process."""
    config = json.loads(config_text)
    if os.environ.get("HANDOVER_TAG") != config["tag"]:  # the tag in its own environ too: --soak-stop's kill
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "hold", config_text],
                  soak_environment(config))
    config, fd = claim(config_text)
    record_holder(fd, config, os.getpid())
    Supervisor(config["dir"], held=True).main()


class Supervisor:
    def __init__(self, directory, held=False):
        self.dir = directory
        self.held = held  # a Slurm job's task (hold): SIGTERM means the job ends, with its nodes
        with open(os.path.join(directory, "config.json")) as config:
            self.config = json.load(config)
        self.lingers = True  # after the load, it waits for the harness to collect (linger_s)
        self.mix = self.config["mix"]
        self.end = float(self.config["end"])
        self.stopping = threading.Event()
        self.reason = "end time"
        self.stopped_at = None  # when stop() came (a stop before the end counts from then)
        self.children = set()
        self.children_lock = threading.Lock()
        self.out = open(os.path.join(directory, SAMPLES), "a")
        self.out_lock = threading.Lock()
        self.nvml = None
        self.gpus = []
        self.load_ended = threading.Event()  # the main loop has ended the load: the bound stands down
        self.rails = []  # (device, port, rate Gb/s) of each active InfiniBand port: one ib_write_bw rail

    def write(self, record):
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self.out_lock:
            self.out.write(line)
            self.out.flush()

    def stop(self, reason):
        if not self.stopping.is_set():
            self.reason = reason
            self.stopped_at = time.time()
            self.stopping.set()

    def terminate(self):
        """SIGTERM: stop. Held by a Slurm job, the job is ending (a scancel, its time limit) and
        Slurm kills what is left after its KillWait: no lingering, the folder goes at once."""
        if self.held:
            self.lingers = False
        self.stop("stopped (SIGTERM)")

    def remaining(self):
        return self.end - time.time()

    # -- the load parts: rounds of a tool, each a `part` line -----------------------------------

    def run_round(self, argv, seconds, timeout=None):
        """One tool round, bounded (by default its seconds and ROUND_GRACE_S); (exit code, stdout,
        stderr), exit None when it was cut short."""
        timeout = seconds + ROUND_GRACE_S if timeout is None else timeout
        try:
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        except OSError as exc:
            return 127, "", str(exc)
        with self.children_lock:
            self.children.add(child)
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
            return None, stdout, "%s did not finish within %d s" % (argv[0], timeout)
        finally:
            with self.children_lock:
                self.children.discard(child)
        return (None if self.stopping.is_set() and child.returncode != 0 else child.returncode), stdout, stderr

    def rounds(self, part, measure, pause_s=0.0, round_key="round_s"):
        """Rounds of measure(seconds) -> (exit, value, unit, error[, more]) until the end, each a
        `part` line (with `more`'s keys: the GPU burn's result digests)."""
        round_s = float(self.mix.get(round_key, 60))
        retrying_since = None
        while not self.stopping.wait(pause_s):
            seconds = min(round_s, self.remaining())
            if seconds < max(1.0, round_s / 2):
                return  # a short last round would not compare with the others
            began = time.time()
            try:
                code, value, unit, error, *more = measure(int(seconds))
            except Exception as exc:  # a tool's output no reader expected: a failed round, the load goes on
                code, value, unit, error, more = None, None, "", "%s: %s" % (type(exc).__name__, exc), []
            if code is None and self.stopping.is_set():
                return  # cut short by the end: not a round
            ended = time.time()
            if error and any(marker in error for marker in RETRY):
                retrying_since = retrying_since or began
                if ended - retrying_since < RETRY_FOR_S:
                    self.stopping.wait(1)
                    continue
            retrying_since = None
            if error and self.stopping.wait(ERROR_HOLD_S):
                return  # it failed as the soak ended: the peer's side had already stopped
            line = {"kind": "part", "part": part, "t0": round(began, 3), "t1": round(ended, 3),
                    "value": value, "unit": unit, "exit": code, "error": error}
            self.write(dict(line, **(more[0] if more else {})))

    def part(self, name, measure, round_key="round_s"):
        return threading.Thread(target=self.rounds, args=(name, measure), kwargs={"round_key": round_key})

    def tool(self, argv_of, figure_of):
        """measure() of a part that is one command a round, read by figure_of(exit, stdout, stderr)."""
        def measure(seconds):
            code, stdout, stderr = self.run_round(argv_of(seconds), seconds)
            return (code,) + tuple(figure_of(code, stdout, stderr))
        return measure

    def stress_argv(self, seconds):
        argv = ["stress-ng", "--cpu", str(self.mix.get("cpu_workers", 0)),
                "--cpu-load", str(self.mix.get("cpu_load", 100))]
        if int(self.mix.get("vm_workers", 0)):
            argv += ["--vm", str(self.mix["vm_workers"]), "--vm-bytes", str(self.mix.get("vm_bytes", "10%"))]
        return argv + ["--metrics-brief", "--timeout", "%ds" % seconds, "--yaml", "/dev/stdout"]

    @staticmethod
    def stress_figure(code, stdout, stderr):
        rates = dict(zip(STRESS_NAME.findall(stdout), (float(r) for r in STRESS_RATE.findall(stdout))))
        if code != 0 or "cpu" not in rates:
            return None, "bogo-ops/s", last_line(stderr or stdout) or "stress-ng exited %s" % code
        return rates["cpu"], "bogo-ops/s", None

    def iperf3_argv(self, seconds):
        return ["iperf3", "-c", self.config["peer_address"], "-p", str(self.config["port"]), "-t", str(seconds),
                "-b", str(self.mix.get("net_rate", "0")), "-i", "0", "-J", "--connect-timeout", "3000"]

    @staticmethod
    def iperf3_figure(code, stdout, stderr):
        document = json_document(stdout)
        if document is None:
            return None, "Gbit/s", last_line(stderr or stdout) or "iperf3 exited %s" % code
        if document.get("error"):
            return None, "Gbit/s", str(document["error"])
        received = ((document.get("end") or {}).get("sum_received") or {}).get("bits_per_second")
        if not isinstance(received, (int, float)):
            return None, "Gbit/s", "iperf3 reported no received rate"
        return received / 1e9, "Gbit/s", None

    def serve_iperf3(self):
        """The peer's client connects here; a server that dies is started again."""
        while not self.stopping.is_set():
            code, _, stderr = self.run_round(["iperf3", "-s", "-p", str(self.config["port"])], self.remaining())
            if self.stopping.is_set():
                return
            self.write({"kind": "event", "t": round(time.time(), 3), "event": "iperf3 server exited %s: %s"
                        % (code, last_line(stderr))})
            self.stopping.wait(5)

    def io_rounds(self):
        """fio rounds on the node's own folder of the shared scratch path, made here and removed
        when the load ends (the samples stay in the node's local folder)."""
        try:
            os.makedirs(self.config["io_dir"], exist_ok=True)
        except OSError as exc:
            now = round(time.time(), 3)
            self.write({"kind": "part", "part": "io", "t0": now, "t1": now, "value": None, "unit": "MB/s",
                        "exit": None, "error": "cannot make %s: %s" % (self.config["io_dir"], exc)})
            return
        self.rounds("io", self.tool(self.io_argv, self.io_figure))

    def io_argv(self, seconds):
        argv = ["fio", "--name=soak", "--directory=%s" % self.config["io_dir"], "--rw=rw", "--bs=1M",
                "--size=%s" % self.mix.get("io_size", "1G"), "--ioengine=libaio", "--direct=1", "--iodepth=8",
                "--time_based", "--runtime=%d" % seconds, "--output-format=json"]
        rate = str(self.mix.get("io_rate", "0"))
        return argv + (["--rate=%s" % rate] if rate not in ("", "0") else [])

    @staticmethod
    def io_figure(code, stdout, stderr):
        """Read plus write bytes per second of the round, in MB/s."""
        document = json_document(stdout)
        if document is None:
            return None, "MB/s", last_line(stderr or stdout) or "fio exited %s" % code
        jobs = [job for job in document.get("jobs") or [] if isinstance(job, dict)]
        failed = [job for job in jobs if job.get("error")]
        if code != 0 or not jobs or failed:
            why = "job error %s" % failed[0]["error"] if failed else "exit %s" % code
            return None, "MB/s", last_line(stderr) or "fio: %s" % why
        moved = sum((job.get(way) or {}).get("bw_bytes", 0) for job in jobs for way in ("read", "write"))
        return moved / 1e6, "MB/s", None

    def ib_argv(self, index, peer=None):
        """ib_write_bw on rail `index` (its own TCP port), the same on both sides but the peer's
        address: iterations sized for round_s at the port's rate, so both sides agree on them."""
        device, port, rate_gbps = self.rails[index]
        iterations = max(5, int(float(self.mix.get("round_s", 60)) * rate_gbps * 1e9 / (8 * IB_MESSAGE)))
        argv = ["ib_write_bw", "--ib-dev", device, "--ib-port", port, "--port", str(self.config["ib_port"] + index),
                "--size", str(IB_MESSAGE), "--iters", str(iterations), "--report_gbits"]
        if ":" in (self.config.get("peer_address") or ""):  # IPv6 pairs exchange parameters over IPv6
            argv.append("--ipv6-addr")  # on both sides (runners.perftest.IPV6_FLAG)
        return argv + ([peer] if peer else [])

    def serve_ib(self, index):
        """The peer's client of this rail connects here; the server ends after each test and
        starts again at once."""
        round_s = float(self.mix.get("round_s", 60))
        while not self.stopping.is_set():
            code, _, stderr = self.run_round(self.ib_argv(index), round_s,
                                             timeout=max(self.remaining(), 0) + ROUND_GRACE_S)
            if self.stopping.is_set():
                return
            if code != 0:
                self.write({"kind": "event", "t": round(time.time(), 3), "event": "ib_write_bw server on %s "
                            "exited %s: %s" % (self.rails[index][0], code, last_line(stderr))})
                self.stopping.wait(5)

    def ib_measure(self, _seconds):
        """One round on every rail at once, each to the same rail of the peer: the slowest rail's
        Gbit/s, or every rail's error. Always a whole round_s: the servers expect its iterations."""
        round_s = float(self.mix.get("round_s", 60))
        outcomes = [None] * len(self.rails)

        def one(index):
            outcomes[index] = self.run_round(self.ib_argv(index, self.config["peer_address"]), round_s,
                                             timeout=IB_STRETCH * round_s + ROUND_GRACE_S)

        clients = [threading.Thread(target=one, args=(index,)) for index in range(len(self.rails))]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        figures = [self.ib_figure(*outcome) for outcome in outcomes]
        codes = [outcome[0] for outcome in outcomes]
        errors = ["%s: %s" % (rail[0], error) for rail, (_, _, error) in zip(self.rails, figures) if error]
        code = None if None in codes else max(codes)
        if errors:
            return code, None, "Gbit/s", "; ".join(errors)
        return code, min(value for value, _, _ in figures), "Gbit/s", None

    @staticmethod
    def ib_figure(code, stdout, stderr):
        """BW average of ib_write_bw's table, found by its header's column names (Gb/sec with
        --report_gbits; MB/sec is 2^20 bytes/s in perftest)."""
        lines = stdout.splitlines()
        at = next((i for i, line in enumerate(lines) if "#bytes" in line and "BW average[" in line), None)
        if code != 0 or at is None:
            return None, "Gbit/s", last_line(stderr or stdout) or "ib_write_bw exited %s" % code
        columns = re.split(r"\s{2,}|\t+", lines[at].strip())
        column = next(i for i, name in enumerate(columns) if name.startswith("BW average["))
        unit = columns[column][len("BW average["):-1]
        for line in lines[at + 1:]:
            fields = line.split()
            if len(fields) == len(columns) and fields[0].isdigit():
                value = float(fields[column])
                return (value if unit == "Gb/sec" else value * 2**20 * 8 / 1e9), "Gbit/s", None
        return None, "Gbit/s", "ib_write_bw printed its table's header and no row"

    def remove_io(self):
        if self.config.get("io_dir"):
            shutil.rmtree(self.config["io_dir"], ignore_errors=True)

    def gpu_argv(self, seconds):
        return [sys.executable, os.path.join(self.dir, "gpu_burn.py"), "--seconds", str(max(10, seconds - 15)),
                "--matmul-seconds", "5", "--sample-interval", "5"]

    @staticmethod
    def gpu_figure(code, stdout, stderr):
        """The slowest GPU's median window, and each GPU's result digests counted ({"digests":
        {gpu: {digest: times}}}, a few bytes a round) for the harness's silent-corruption check."""
        document = json_document(stdout)
        if document is None:
            return None, "TFLOP/s", last_line(stderr or stdout) or "gpu burn exited %s" % code
        if document.get("available") is False:
            return None, "TFLOP/s", document.get("reason") or "no GPU"
        gpus = [gpu for gpu in document.get("gpus") or [] if isinstance(gpu, dict)]
        digests = {}
        for gpu in gpus:
            tally = digests.setdefault(str(gpu.get("index")), {})
            for check in gpu.get("digests") or []:
                if isinstance(check, dict) and isinstance(check.get("digest"), str):
                    tally[check["digest"]] = tally.get(check["digest"], 0) + 1
        more = {"digests": digests}
        failed = ["GPU %s: %s" % (gpu.get("index"), gpu["error"]) for gpu in gpus if gpu.get("error")]
        windows = [gpu.get("gemm_tflops_windows") or [] for gpu in gpus]
        rates = [sorted(w)[len(w) // 2] for w in windows if w]
        if code != 0 or failed or not rates:
            return None, "TFLOP/s", "; ".join(failed) or last_line(stderr) or "gpu burn gave no windows", more
        return min(rates), "TFLOP/s", None, more

    # -- telemetry ------------------------------------------------------------------------------

    def open_nvml(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            self.gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception as exc:  # no pynvml, no driver, no GPU: CPU telemetry only
            return "%s: %s" % (type(exc).__name__, exc)
        return None

    def gpu_sample(self, index, handle):
        nvml = self.nvml
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        sample = {"gpu": index}
        readers = {
            "temp_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "mem_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "reasons": lambda: reasons(handle),
            "ecc_uncorrected": lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC),
            "ecc_corrected": lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_AGGREGATE_ECC),
            "remap": lambda: list(nvml.nvmlDeviceGetRemappedRows(handle)),
        }
        for key, read in readers.items():
            try:
                sample[key] = read()
            except Exception as exc:  # not supported on this GPU, or the GPU is lost
                sample.setdefault("errors", {})[key] = str(exc)
        return sample

    def watch_xids(self):
        """NVML's critical Xid events, each an `xid` line as it happens. A wait that fails other
        than by its timeout (the GPU is lost) is an `event` line once, then tried each second."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in self.gpus:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except Exception as exc:
            self.write({"kind": "event", "t": round(time.time(), 3), "event": "no Xid events: %s" % exc})
            return
        failed = None
        while not self.stopping.is_set():
            try:
                data = nvml.nvmlEventSetWait(events, 1000)
            except nvml.NVMLError_Timeout:
                continue
            except Exception as exc:
                if str(exc) != failed:
                    failed = str(exc)
                    self.write({"kind": "event", "t": round(time.time(), 3), "event": "Xid wait: %s" % exc})
                self.stopping.wait(1)
                continue
            self.write({"kind": "xid", "t": round(time.time(), 3), "xid": int(data.eventData),
                        "gpu": self.gpu_of(data.device)})

    def gpu_of(self, device):
        """The index of the GPU an event names. NVML hands back a new ctypes pointer to the
        device, which never equals (==) the handle kept: the addresses are compared."""
        address = ctypes.cast(device, ctypes.c_void_p).value
        return next((i for i, handle in enumerate(self.gpus)
                     if address is not None and ctypes.cast(handle, ctypes.c_void_p).value == address), None)

    def sample(self):
        record = {"kind": "sample", "t": round(time.time(), 3), "load1": load1(),
                  "mem_available_kib": meminfo("MemAvailable"), "cpu_temp_c": cpu_temperature()}
        if self.nvml is not None:
            record["gpus"] = [self.gpu_sample(i, handle) for i, handle in enumerate(self.gpus)]
        links = infiniband_counters()
        if links:
            record["ib"] = links
        return record

    # -- the life of a soak ---------------------------------------------------------------------

    def main(self):
        signal.signal(signal.SIGTERM, lambda *_: self.terminate())
        signal.signal(signal.SIGINT, lambda *_: self.stop("stopped (SIGINT)"))
        nvml_missing = self.open_nvml()
        if self.config.get("ib_port") and int(self.mix.get("ib", 1)):
            self.rails = infiniband_rails()
        self.write({"kind": "start", "t": round(time.time(), 3), "soak_id": self.config["soak_id"],
                    "node": self.config["node"], "end": self.end, "pid": os.getpid(), "mix": self.mix,
                    "peer": self.config.get("peer"), "boot_id": read("/proc/sys/kernel/random/boot_id"),
                    "cpus": os.cpu_count(), "gpus": len(self.gpus), "nvml": nvml_missing,
                    "rails": ["%s/%s" % (device, port) for device, port, _ in self.rails],
                    "tools": tool_versions(),
                    "baseline": self.sample()})
        threads = []
        if int(self.mix.get("cpu", 1)):
            threads.append(self.part("cpu", self.tool(self.stress_argv, self.stress_figure)))
        if self.config.get("port"):
            threads.append(threading.Thread(target=self.serve_iperf3))
        if self.config.get("peer_address"):
            threads.append(threading.Thread(target=self.delayed_client))
        if self.config.get("io_dir") and int(self.mix.get("io", 1)):
            threads.append(threading.Thread(target=self.io_rounds))
        for index in range(len(self.rails)):
            threads.append(threading.Thread(target=self.serve_ib, args=(index,)))
        if self.rails and self.config.get("peer_address"):
            threads.append(threading.Thread(target=self.delayed_ib_client))
        if self.gpus and int(self.mix.get("gpu", 1)) and os.path.exists(os.path.join(self.dir, "gpu_burn.py")):
            threads.append(self.part("gpu", self.tool(self.gpu_argv, self.gpu_figure), round_key="gpu_round_s"))
            threads.append(threading.Thread(target=self.watch_xids))
        threads.append(threading.Thread(target=self.bound))
        for thread in threads:
            thread.daemon = True
            thread.start()
        interval = float(self.config["interval_s"])
        while not self.stopping.is_set():
            if self.remaining() <= 0:
                self.stop("end time")
                break
            if os.path.exists(os.path.join(self.dir, "stop")):
                self.stop("stopped by the harness")
                break
            self.write(self.sample())
            write_atomically(os.path.join(self.dir, "heartbeat"), "%.3f\n" % time.time())
            self.stopping.wait(min(interval, max(0.0, self.remaining())))
        self.end_children()
        for thread in threads:
            thread.join(KILL_GRACE_S + 2)
        self.end_children()  # a round that started as the soak was ending
        self.remove_io()
        self.load_ended.set()
        self.write({"kind": "end", "t": round(time.time(), 3), "reason": self.reason})
        self.linger()

    def bound(self):
        """The load ends by the end time (or a stop) plus HUNG_AFTER_S even where the main loop
        hangs: its tools end, the fio folder goes, and the process exits without an end line
        (the harness sees it gone, collects its samples and removes its folder). Else the load,
        the iperf3 and ib_write_bw servers with it, would run until the node reboots."""
        while not self.load_ended.wait(5):
            ended_at = min(self.end, self.stopped_at or self.end)
            if time.time() > ended_at + HUNG_AFTER_S:
                break
        else:
            return
        self.write({"kind": "event", "t": round(time.time(), 3),
                    "event": "the load did not end within %d s of %s: ended by the supervisor's bound"
                    % (HUNG_AFTER_S, self.reason)})
        self.stopping.set()
        self.end_children()
        self.remove_io()
        os._exit(EXIT_HUNG)

    def delayed_client(self):
        """The peer's server starts at about the same time: the first round waits a moment."""
        self.stopping.wait(3)
        self.rounds("net", self.tool(self.iperf3_argv, self.iperf3_figure), pause_s=NET_PAUSE_S)

    def delayed_ib_client(self):
        self.stopping.wait(3)
        self.rounds("ib", self.ib_measure)

    def end_children(self):
        with self.children_lock:
            children = list(self.children)
        for child in children:
            try:
                child.terminate()
            except OSError:
                pass
        deadline = time.time() + KILL_GRACE_S
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                child.kill()

    def linger(self):
        """Keep the samples until the harness has them, or until the hard bound; then remove them."""
        bound = time.time() + (float(self.config["linger_s"]) if self.lingers else 0.0)
        collected = os.path.join(self.dir, "collected")
        while not os.path.exists(collected) and time.time() < bound:
            time.sleep(2)
        self.out.close()
        self.remove_io()
        shutil.rmtree(self.dir, ignore_errors=True)


def tool_versions():
    """{tool: version} of the load's tools this node has ('unknown' when it says none)."""
    found = {}
    for tool, argv in TOOL_VERSIONS.items():
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = VERSION.search(done.stdout + done.stderr)
        found[tool] = match.group(0) if match else "unknown"
    return found


def json_document(text):
    """The JSON object a tool printed (after any log lines before it); None for none."""
    try:
        document = json.loads(text[text.find("{"):])
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def load1():
    text = read("/proc/loadavg")
    return float(text.split()[0]) if text else None


def meminfo(key):
    for line in (read("/proc/meminfo") or "").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def cpu_temperature():
    """The hottest CPU sensor in degrees C (thermal zones, then hwmon), None where none is readable."""
    readings = []
    for base, pattern in (("/sys/class/thermal", "thermal_zone"), ("/sys/class/hwmon", "hwmon")):
        try:
            entries = [e for e in os.listdir(base) if e.startswith(pattern)]
        except OSError:
            continue
        for entry in entries:
            folder = os.path.join(base, entry)
            names = ["temp"] if pattern == "thermal_zone" else [
                n for n in sorted(os.listdir(folder)) if n.startswith("temp") and n.endswith("_input")]
            for name in names:
                value = read(os.path.join(folder, name))
                if value and value.lstrip("-").isdigit():
                    readings.append(int(value) / 1000.0)
    return max(readings) if readings else None


def infiniband_rails(base="/sys/class/infiniband"):
    """[(device, port, rate Gb/s)] of every ACTIVE InfiniBand port, in natural device order (the
    kernel writes state as '4: ACTIVE', rate as '400 Gb/sec (4X NDR)')."""
    try:
        devices = sorted(os.listdir(base), key=lambda name: [int(p) if p.isdigit() else p
                                                              for p in re.split(r"(\d+)", name)])
    except OSError:
        return []
    rails = []
    for device in devices:
        ports = os.path.join(base, device, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            folder = os.path.join(ports, port)
            if read(os.path.join(folder, "link_layer")) != "InfiniBand" or "ACTIVE" not in (
                    read(os.path.join(folder, "state")) or ""):
                continue
            rate = re.match(r"\s*([0-9.]+)", read(os.path.join(folder, "rate")) or "")
            rails.append((device, port, float(rate.group(1)) if rate else IB_UNKNOWN_RATE_GBPS))
    return rails


def infiniband_counters():
    """{"mlx5_0/1": {counter: value}} for every HCA port, where /sys/class/infiniband exists."""
    base = "/sys/class/infiniband"
    found = {}
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return found
    for device in devices:
        ports = os.path.join(base, device, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            counters = {}
            for name in IB_COUNTERS:
                value = read(os.path.join(ports, port, "counters", name))
                if value and value.isdigit():
                    counters[name] = int(value)
            found["%s/%s" % (device, port)] = counters
    return found


def write_atomically(path, text):
    temporary = path + ".tmp"
    with open(temporary, "w") as out:
        out.write(text)
    os.replace(temporary, path)


if __name__ == "__main__":
    if sys.argv[1] == "start":
        start(sys.argv[2])
    elif sys.argv[1] == "hold":
        hold(sys.argv[2])
    else:
        Supervisor(sys.argv[2]).main()
