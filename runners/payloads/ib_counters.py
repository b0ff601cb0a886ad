"""Node side: every InfiniBand port's error counters from sysfs, printed as one JSON object.

Layout read (the kernel's names): <root>/<hca>/ports/<port>/counters/<counter>, one integer per
file, e.g. /sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error. The root is the first
argument (default /sys/class/infiniband), so the same code reads a tree a test builds.
Stdlib only.
"""
import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "/sys/class/infiniband"
document = {"root": root, "present": os.path.isdir(root), "ports": []}
if document["present"]:
    for hca in sorted(os.listdir(root)):
        ports_dir = os.path.join(root, hca, "ports")
        if not os.path.isdir(ports_dir):
            continue
        for port in sorted(os.listdir(ports_dir), key=lambda name: (len(name), name)):
            counters_dir = os.path.join(ports_dir, port, "counters")
            counters = {}
            if os.path.isdir(counters_dir):
                for name in sorted(os.listdir(counters_dir)):
                    try:
                        with open(os.path.join(counters_dir, name)) as handle:
                            counters[name] = int(handle.read().strip())
                    except (OSError, ValueError):
                        counters[name] = None  # unreadable or not a number: reported, not guessed
            document["ports"].append({"hca": hca, "port": port, "counters": counters})
print(json.dumps(document))
