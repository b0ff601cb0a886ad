"""Node side: which of the named programs are on the PATH, and whether the user is root.

    python3 - NAME...

Prints one JSON object: {"programs": {name: path or null}, "root": bool}.
"""
import json
import os
import shutil
import sys

print(json.dumps({"programs": {name: shutil.which(name) for name in sys.argv[1:]},
                  "root": os.geteuid() == 0}))
