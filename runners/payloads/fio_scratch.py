"""Node side of the storage suite: guard a scratch path, run fio in a file of our own, remove it.

    python3 - SPEC_JSON        (SPEC: action "run" or "mount"; see runners/fio.py)

"run" refuses (exit 3, a `handover-refused:` line on stderr) a path that is missing, a raw block
device not marked destructive, anything but a directory or block device, and a directory whose
free space is short of the job's need. Otherwise it creates handover-fio-<node>-<pid>-<random>, runs
fio on it with fio's own stdout and stderr passed through, and removes the file in a finally,
also when the run timeout or the harness's kill sends SIGTERM. Files left by a SIGKILLed earlier
run (same node, same prefix) are swept away first.

"mount" prints one JSON object: whether the path exists, and its mount point and filesystem type.
"""
import json
import os
import secrets
import stat
import subprocess
import sys

from .scratch_guard import end_on_signals, missing, refuse, sweep

PREFIX = "handover-fio-"


def say(text):
    print(f"handover-fio: {text}", file=sys.stderr)


def device_size(path):
    with open(path, "rb") as device:
        return device.seek(0, os.SEEK_END)


def run_fio(argv, filename):
    """fio's exit code; its output passes through untouched, so raw/ holds fio's own JSON.

    The file goes in as a global option, before the first --name: placed after it, it would
    name only the last job's file, and the others would write wherever fio was started.
    """
    if any(arg.startswith(("--filename", "--directory", "--opendir")) for arg in argv):
        refuse("the fio job names its own files; only the harness's file may be written")
    jobs = [index for index, arg in enumerate(argv) if arg.startswith("--name=")]
    first_job = jobs[0] if jobs else len(argv)
    command = [*argv[:first_job], f"--filename={filename}", *argv[first_job:]]
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace")
    except FileNotFoundError:
        return missing(argv[0])
    try:
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(1)
            except subprocess.TimeoutExpired:  # in uninterruptible disk I/O: its file goes all the same
                pass
    sys.stdout.write(out)
    sys.stderr.write(err)
    return proc.returncode


def run(spec):
    path, needed = spec["path"], spec["needed_bytes"]
    if ":" in path:
        refuse(f"{path} contains ':', which fio reads as a list of files")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        refuse(f"{path} does not exist on this node")
    except OSError as error:
        refuse(f"{path}: {error.strerror}")
    if stat.S_ISBLK(mode):
        if not spec["destructive"]:
            refuse(f"{path} is a raw block device and fio would overwrite it; "
                   "mark its scratch entry destructive: true to allow that")
        size = device_size(path)
        if size < needed:
            refuse(f"{path} holds {size / 2**20:.0f} MiB, the job needs {needed / 2**20:.0f} MiB")
        return run_fio(spec["fio"], path)
    if not stat.S_ISDIR(mode):
        refuse(f"{path} is neither a directory nor a block device")
    prefix = f"{PREFIX}{spec['node']}-"
    sweep(path, prefix, say)
    fs = os.statvfs(path)
    free = fs.f_bavail * fs.f_frsize
    if free < needed:
        refuse(f"{path} has {free / 2**20:.0f} MiB free, the job needs {needed / 2**20:.0f} MiB")
    filename = os.path.join(path, f"{prefix}{os.getpid()}-{secrets.token_hex(6)}")
    os.close(os.open(filename, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        return run_fio(spec["fio"], filename)
    finally:
        os.unlink(filename)
        say(f"removed {filename}")


def unescape(field):
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount(spec):
    path = spec["path"]
    if not os.path.isdir(path):
        print(json.dumps({"path": path, "exists": False}))
        return 0
    resolved = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            tail = fields[fields.index("-") + 1:]
            point = unescape(fields[4])
            inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
            if inside and (found is None or len(point) >= len(found[0])):
                found = (point, tail[0], unescape(tail[1]))
    point, fstype, source = found
    print(json.dumps({"path": path, "exists": True, "resolved": resolved, "mount_point": point,
                      "fstype": fstype, "source": source}))
    return 0


def main():
    end_on_signals()
    spec = json.loads(sys.argv[1])
    return mount(spec) if spec["action"] == "mount" else run(spec)


sys.exit(main())
