"""Node-side collectives benchmark, one process per rank under torchrun; rank 0 prints one JSON line.

    torchrun ... --no-python python3 -c <this file> --sizes 1048576,67108864 --iters 5 ...
    python3 - --probe          (through stdin) what the node has: torch, its GPUs, nccl-tests

Definitions as nccl-tests (doc/PERFORMANCE.md): S is the collective's whole array in bytes
(all_gather: the gathered result; reduce_scatter: the input), t the slowest rank's mean time per
op, algbw = S / t in GB/s (1e9 B/s), busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n for
all_gather, reduce_scatter and all_to_all. One rank moves nothing between ranks: busbw is 0 by
definition and the output says so. The buffers are filled once, before the warm-up, so the timed
loop times the collective alone (a fill inside it would time a write of the whole message too);
as nccl-tests does, the inputs are filled again after the timed loop and one more run is checked
element by element against known values: wrong elements are counted, never ignored.
nccl backend on GPUs (one per local rank), gloo on CPUs; CUDA_DEVICE_ORDER=PCI_BUS_ID, so
local rank i runs on NVML's GPU i. The marker argument only makes the processes of one run
findable (pgrep -f) on the node.
"""
import argparse
import datetime
import json
import os
import socket
import sys
import time
import warnings

from .torch_import import import_torch

os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch initialises CUDA: indices = NVML's

FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}
FLOAT_BYTES = 4


def arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma-separated bytes per collective")
    parser.add_argument("--collectives", default="all_reduce")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--op-timeout", type=float, default=60.0)
    parser.add_argument("--marker", default="")
    return parser.parse_args()


def probe():
    """What this node can run: torch (and its GPUs) and nccl-tests; stdlib only until torch loads."""
    import shutil

    facts = {"hostname": socket.gethostname(), "python": sys.executable, "torch": None,
             "cuda_devices": 0, "nccl_tests": shutil.which("all_reduce_perf")}
    try:
        torch = import_torch()
    except ImportError as exc:
        facts["torch_error"] = str(exc)
    else:
        facts["torch"] = torch.__version__
        facts["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(json.dumps(facts), flush=True)


def main():
    if sys.argv[1:2] == ["--probe"]:
        return probe()
    args = arguments()
    # torch 2.13 renames all_gather_into_tensor/reduce_scatter_tensor; older GPU nodes lack the new names
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch = import_torch()
    dist = torch.distributed

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.op_timeout))
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())

    def sync():
        if gpu:
            torch.cuda.synchronize(device)

    results = {}
    for name in args.collectives.split(","):
        rows, unsupported = [], None
        for size in (int(s) for s in args.sizes.split(",")):
            try:
                rows.append(measure(torch, dist, name, size, rank, world, device, sync, args))
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                if rows or "not supported" not in str(exc).lower() and "unsupported" not in str(exc).lower():
                    raise
                unsupported = f"{backend}: {str(exc).splitlines()[0]}"
                break
        results[name] = {"rows": rows, "unsupported": unsupported}
    if rank == 0:
        report = {
            "collectives": results, "ranks": world, "hosts": hosts, "backend": backend,
            "torch": torch.__version__,
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
            "device": torch.cuda.get_device_name(device) if gpu else "cpu",
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith(("NCCL_", "GLOO_")) or k in ("MASTER_ADDR", "OMP_NUM_THREADS")},
            "note": "one rank: busbw is 0 by definition" if world == 1 else "",
        }
        print(json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def measure(torch, dist, name, size, rank, world, device, sync, args):
    """One collective at one size: timed loop, slowest rank's mean, then a data check."""
    elements = max(world, size // FLOAT_BYTES // world * world)  # divisible among the ranks
    op = build(torch, dist, name, elements, world, device)
    op.fill(rank)
    for _ in range(args.warmup):
        op.run()
    sync()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.iters):
        op.run()
    sync()
    elapsed = torch.tensor([(time.perf_counter() - started) / args.iters], dtype=torch.float64,
                           device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds = float(elapsed.item())
    wrong = torch.tensor([op.check(rank)], dtype=torch.int64, device=device)
    dist.all_reduce(wrong)
    nbytes = elements * FLOAT_BYTES
    algbw = nbytes / seconds / 1e9
    return {"size": nbytes, "time_us": seconds * 1e6, "algbw": algbw,
            "busbw": algbw * FACTORS[name](world), "wrong": int(wrong.item())}


def build(torch, dist, name, elements, world, device):
    """The collective's buffers and its fill/run/check: fill(rank) writes the known inputs,
    run() is the collective alone (what the loop times), check(rank) fills, runs once and counts
    the wrong elements (all_reduce works in place, so its timed runs leave sums of sums).

    Each collective has only the buffers it needs: all_reduce one, in place (at 8 GiB, a buffer
    of the gathered values beside it would be 8 GiB more, plus whatever building it takes).
    Where rank j's chunk of the output holds j + 1 (all_gather, all_to_all), the expected values
    are one column of `world` values that the check compares with the output seen as a row per
    rank's chunk; a sum (all_reduce, reduce_scatter) is one number."""
    chunk = elements // world  # the ranks' share; elements is a multiple of world (measure())

    def buffer(size):
        return torch.empty(size, dtype=torch.float32, device=device)

    def per_rank():
        return torch.arange(1, world + 1, dtype=torch.float32, device=device).unsqueeze(1)

    class Op:
        pass

    op = Op()
    op.rows = (-1,)  # how check() sees the output against op.expected
    if name == "all_reduce":
        op.inputs = op.outputs = buffer(elements)
        op.run, op.expected = (lambda: dist.all_reduce(op.inputs)), world * (world + 1) / 2
    elif name == "all_gather":
        op.inputs, op.outputs = buffer(chunk), buffer(elements)
        op.run, op.expected = (lambda: dist.all_gather_into_tensor(op.outputs, op.inputs)), per_rank()
        op.rows = (world, chunk)
    elif name == "reduce_scatter":
        op.inputs, op.outputs = buffer(elements), buffer(chunk)
        op.run = lambda: dist.reduce_scatter_tensor(op.outputs, op.inputs)
        op.expected = world * (world + 1) / 2
    elif name == "all_to_all":
        op.inputs, op.outputs = buffer(elements), buffer(elements)
        op.run, op.expected = (lambda: dist.all_to_all_single(op.outputs, op.inputs)), per_rank()
        op.rows = (world, chunk)
    else:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(FACTORS)}")

    def check(rank):
        op.fill(rank)
        op.run()
        return int((op.outputs.view(*op.rows) != op.expected).sum().item())

    op.fill = lambda rank: op.inputs.fill_(rank + 1)
    op.check = check
    return op


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # one line on stderr names the rank and the failure
        print(f"collectives payload rank {os.environ.get('RANK', '?')} on {socket.gethostname()}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
