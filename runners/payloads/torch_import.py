"""How the harness's node-side Python imports torch: with the cyclic garbage collector paused.

torch leaves about 170,000 objects as it loads; the collector walks them again and again during
the import and once more as the process exits. Paused while torch loads, then freezing what is
there (gc.freeze: out of every later collection), a process that imports torch spends about a
third less CPU and starts about 0.5 s sooner (bench/torch_import.py). A torchrun launch has two
such processes per node and rank (its agent and the rank), an isolation dozens of launches.

The training payload imports torch the usual way: its time to the first step is a user's job's.
A node receives one script: runners.payloads.load writes this text where a payload imports it.
"""
import gc


def import_torch():
    """torch (and torch.distributed), or the exception its import raised, unchanged."""
    gc.disable()
    try:
        import torch
        import torch.distributed  # noqa: F401  (loaded with torch on most builds; here for the rest)
    finally:
        gc.freeze()
        gc.enable()
    return torch
