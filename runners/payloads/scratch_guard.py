"""What the node-side scratch guards (fio_scratch, hpl_scratch) share: how they refuse, how a
signal ends them through their finally, and how they sweep an interrupted run's leftovers
without touching a live run's. The harness's side of these exits is runners/scratch.py.

A node receives one script: runners.payloads.load writes this text where a payload imports it.
"""
import os
import re
import shutil
import signal
import sys

REFUSED_EXIT = 3
MISSING_EXIT = 127


def refuse(reason):
    print(f"handover-refused: {reason}", file=sys.stderr)
    sys.exit(REFUSED_EXIT)


def missing(program):
    """The exit of a run whose program is not installed, said the way runners/scratch.py reads it."""
    print(f"handover-missing: {program} is not installed", file=sys.stderr)
    return MISSING_EXIT


def end_on_signals():
    """The run timeout and the harness's kill (TERM), a lost link (HUP) and Ctrl-C (INT) end the
    payload through SystemExit, so the finally that removes its file or directory runs."""
    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, on_signal)


# What follows the node's prefix in a name a run makes: its PID, '-', and a random part without
# '-' (secrets.token_hex, tempfile's). Node gpu's prefix also begins the names of node gpu-a's
# files on a shared scratch path ("a-1234-9f8e..."): those are not this node's to remove.
RUN_PART = re.compile(r"[0-9]+-[a-z0-9_]+")


def sweep(directory, prefix, say):
    """Remove our own leftovers: files and directories this node's runs made whose run has ended."""
    for entry in os.scandir(directory):
        if not entry.name.startswith(prefix) or not RUN_PART.fullmatch(entry.name[len(prefix):]) \
                or owner_alive(entry.name, prefix):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
        else:
            continue
        say(f"removed {entry.path}, left by an interrupted earlier run")


def owner_alive(name, prefix):
    """Whether the run that made this entry still runs: its name carries that run's PID.

    Two harness runs on one node (two operators, a run and its rerun) must not delete each
    other's files; an entry whose PID is gone is a leftover.
    """
    pid = name[len(prefix):].split("-", 1)[0]
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True
