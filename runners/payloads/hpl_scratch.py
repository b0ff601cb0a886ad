"""Node side of the HPL suite: run an HPL program in a directory of our own.

    python3 - SPEC_JSON        (SPEC: node, path, files, output, argv; see runners/hpl.py)

It refuses (exit 3, a `handover-refused:` line on stderr) a scratch path that is missing or
not a directory. Otherwise it creates handover-hpl-<node>-<pid>-<random>/ in it, writes the input
files there, runs the argv with that directory as its working directory, and prints the output
file (hpcc's hpccoutf.txt) on stdout, or the program's own stdout when there is none. The
directory is removed in a finally, also when the run timeout or the harness's kill sends
SIGTERM; directories left by a SIGKILLed earlier run (same node, same prefix) are swept first.
A missing program exits 127 with a `handover-missing:` line.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from .scratch_guard import end_on_signals, missing, refuse, sweep

PREFIX = "handover-hpl-"
# TERM to KILL for the HPL program: under the KILL that follows our own TERM (the node-side
# timeout's -k, the watchdog's grace: runners.transport.KILL_GRACE_S, 5 s), so the directory
# is removed after it.
STOP_GRACE_S = 3


def say(text):
    print(f"handover-hpl: {text}", file=sys.stderr)


def stop(proc):
    """TERM first, so mpirun takes its daemons and ranks down with it; KILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(1)
        except subprocess.TimeoutExpired:  # stuck in the kernel: the directory goes all the same
            pass


def execute(argv, workdir, output):
    try:
        proc = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
    except FileNotFoundError:
        return missing(argv[0])
    try:
        out, err = proc.communicate()
    finally:
        stop(proc)
    sys.stderr.write(err)
    if output is None:
        sys.stdout.write(out)
        return proc.returncode
    sys.stderr.write(out)
    path = os.path.join(workdir, output)
    if not os.path.isfile(path):
        say(f"{argv[-1]} wrote no {output}")
        return proc.returncode or 1
    with open(path, errors="replace") as written:
        sys.stdout.write(written.read())
    return proc.returncode


def run(spec):
    path = spec["path"]
    if not os.path.isdir(path):
        refuse(f"{path} does not exist on this node or is not a directory")
    prefix = f"{PREFIX}{spec['node']}-"
    sweep(path, prefix, say)
    workdir = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=path)
    try:
        for name, text in spec["files"].items():
            with open(os.path.join(workdir, os.path.basename(name)), "w") as handle:
                handle.write(text)
        return execute(spec["argv"], workdir, spec["output"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        say(f"removed {workdir}")


def main():
    end_on_signals()
    return run(json.loads(sys.argv[1]))


sys.exit(main())
