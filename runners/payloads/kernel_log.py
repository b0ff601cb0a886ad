"""Node-side: this boot's kernel log, from dmesg or else `journalctl -k`, as one JSON object.

    python3 - [--run-started-ago SECONDS] [--dmesg dmesg] [--journalctl journalctl] < kernel_log.py

dmesg needs root or CAP_SYSLOG where kernel.dmesg_restrict is 1; a user in the systemd-journal
or adm group can still read `journalctl -k`. Both print seconds since boot in brackets (dmesg by
default, journalctl with `-o short-monotonic`), so the lines of this acceptance run are told from
earlier ones without trusting the node's wall clock: the harness says how many seconds ago the
run started, and the run's window begins at `uptime - that`. Prints
{"source": "dmesg"|"journalctl"|null, "text": ..., "uptime_s": ..., "window_start_uptime_s": ...,
"attempts": [{"command": ..., "exit": ..., "error": ...}]} and exits 0; `source` null means
neither command could read the log, and `attempts` says why.
"""
import argparse
import json
import subprocess

COMMAND_TIMEOUT_S = 20


def arguments():
    parser = argparse.ArgumentParser(prog="kernel_log")
    parser.add_argument("--run-started-ago", type=float, default=None,
                        help="seconds since the acceptance run started, by the harness's clock")
    parser.add_argument("--dmesg", default="dmesg", help="the dmesg program")
    parser.add_argument("--journalctl", default="journalctl", help="the journalctl program")
    return parser.parse_args()


def uptime():
    with open("/proc/uptime") as handle:
        return float(handle.read().split()[0])


def attempt(argv):
    """(stdout, record of the attempt); stdout is None when the command gave no kernel log."""
    record = {"command": " ".join(argv), "exit": None, "error": ""}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError as exc:
        record["error"] = f"not installed: {exc}"
        return None, record
    except (OSError, subprocess.TimeoutExpired) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        return None, record
    record["exit"] = proc.returncode
    last_error = (proc.stderr.strip().splitlines() or [""])[-1]
    # journalctl exits 0 with "-- No entries --" when there is no journal, or none for this boot
    kernel_lines = [line for line in proc.stdout.splitlines() if line and not line.startswith("-- ")]
    if proc.returncode != 0:
        record["error"] = last_error or f"exit {proc.returncode}"
        return None, record
    if not kernel_lines:
        record["error"] = "no kernel messages" + (f": {last_error}" if last_error else "")
        return None, record
    return proc.stdout, record


def main():
    args = arguments()
    now = uptime()
    attempts, text, source = [], "", None
    for name, argv in (("dmesg", [args.dmesg]),
                       ("journalctl", [args.journalctl, "-k", "-b", "-o", "short-monotonic",
                                       "--no-pager"])):
        output, record = attempt(argv)
        attempts.append(record)
        if output is not None:
            text, source = output, name
            break
    window_start = None if args.run_started_ago is None else max(0.0, now - args.run_started_ago)
    print(json.dumps({"source": source, "text": text, "uptime_s": now,
                      "window_start_uptime_s": window_start, "attempts": attempts}))


main()
