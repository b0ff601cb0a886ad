"""Node-side payload, one process per rank under torchrun: train a GPT-style decoder with DDP.

Synthetic tokens generated here (nothing downloaded); one fixed batch, the same on every rank,
so a healthy run's loss must fall far within a few dozen steps at any scale. bf16 autocast and NCCL on GPUs, fp32 and
Gloo on CPUs. Every rank times its steps; rank 0 gathers everything and prints one JSON line.
CUDA_DEVICE_ORDER=PCI_BUS_ID, so a rank's CUDA device and the NVML sampler's index are one GPU.

With --checkpoint-dir (a scratch path the inventory declares), rank 0 writes the model and
optimizer state there, every rank on every node reads it back and compares bytes and tensors,
and rank 0 removes it: the round trip customers' first jobs make through the shared filesystem.
"""
import argparse
import hashlib
import json
import math
import os
import socket
import sys
import threading
import time
from datetime import timedelta

STARTED = time.monotonic()
os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # before torch initialises CUDA: local rank i is NVML's GPU i

import torch  # noqa: E402  (the start time includes torch's import, as a user's job would)
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

NVML_PERIOD_S = 0.5


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, vocab, width, layers, heads, seq):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)  # untied, as LLaMA-style models are
        self.apply(self._initialise)

    @staticmethod
    def _initialise(module):
        """GPT-2's initialisation: the first loss is near ln(vocab), as in any real run."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--op-timeout", type=int, required=True)
    parser.add_argument("--marker", required=True)  # names the run's processes on every node
    parser.add_argument("--checkpoint-dir", default="")
    return parser.parse_args()


class GpuSampler:
    """NVML utilisation and memory of this node's GPUs while training runs (local rank 0 only)."""

    def __init__(self, devices):
        self.samples = {}
        self.error = ""
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = {index: pynvml.nvmlDeviceGetHandleByIndex(index) for index in devices}
        except Exception as exc:  # no NVML: utilisation unknown, said in the output
            self.error = f"NVML unavailable: {exc}"
            return
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(NVML_PERIOD_S):
            for index, handle in self._handles.items():
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                used = self._nvml.nvmlDeviceGetMemoryInfo(handle).used
                self.samples.setdefault(index, []).append((util, used))

    def summary(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
        return {str(index): {"util_mean": sum(u for u, _ in rows) / len(rows),
                             "memory_max_gib": max(m for _, m in rows) / 2**30, "samples": len(rows)}
                for index, rows in self.samples.items() if rows}


def digest(path):
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            sha.update(chunk)
    return sha.hexdigest()


def checkpoint_round_trip(model, optimizer, directory, marker, rank, device):
    """Rank 0 writes, every rank reads back and compares; rank 0 removes the file."""
    path = os.path.join(directory, f"handover-checkpoint-{marker}.pt")
    result = {"path": path, "bytes": 0, "write_s": None, "read_s": None, "sha256": None,
              "matches": None, "error": ""}
    made = False  # rank 0 made the file: it, and nothing it did not make, is removed at the end
    if rank == 0:
        if not os.path.isdir(directory):
            result["error"] = f"{directory} is not a directory"
        else:
            try:
                begin = time.monotonic()
                with open(path, "xb") as handle:  # never overwrite anything
                    made = True
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                result["write_s"] = time.monotonic() - begin
                result["bytes"] = os.path.getsize(path)
                result["sha256"] = digest(path)
            except Exception as exc:  # OSError, and torch's RuntimeError when the disk fills mid-write
                result["error"] = f"writing {path}: {exc}"
    written = [result if rank == 0 else None]
    dist.broadcast_object_list(written, src=0)
    written = written[0]
    try:
        if not written["error"]:
            begin = time.monotonic()
            found = digest(path)
            state = torch.load(path, map_location=device, weights_only=True)
            result["read_s"] = time.monotonic() - begin
            same = all(torch.equal(state["model"][name], tensor)
                       for name, tensor in model.state_dict().items())
            result.update(bytes=written["bytes"], write_s=written["write_s"], sha256=found,
                          matches=bool(same and found == written["sha256"]))
        else:
            result["error"] = written["error"]
    except Exception as exc:  # a rank that cannot read it reports why; the check fails on it
        result["error"] = f"reading {path}: {exc}"
    finally:
        dist.barrier()
        if made and os.path.exists(path):
            os.remove(path)
    return result


def main():
    args = arguments()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # CPU ranks share the node's cores; one thread each
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=args.op_timeout),
                            **({"device_id": device} if cuda else {}))
    initialised = time.monotonic()
    sampler = GpuSampler(range(torch.cuda.device_count())) if cuda and local_rank == 0 else None

    torch.manual_seed(0)
    model = Decoder(args.vocab, args.width, args.layers, args.heads, args.seq).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.0)
    # The same batch on every rank: memorising it takes the same few dozen steps on one GPU or
    # on hundreds, so "the loss fell far" means the same at every scale (random tokens have
    # nothing to learn but the batch itself).
    generator = torch.Generator().manual_seed(1000)
    batch = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
    inputs, targets = batch[:, :-1], batch[:, 1:]

    losses, step_times, forward_times, first_step_s = [], [], [], None
    for _ in range(args.steps):
        begin = time.monotonic()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = ddp(inputs)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1))
        if cuda:
            torch.cuda.synchronize()
        forward_times.append(time.monotonic() - begin)  # this rank's own work: no collective yet
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # also synchronises the step across ranks
        if cuda:
            torch.cuda.synchronize()
        step_times.append(time.monotonic() - begin)
        losses.append(mean_loss.item() / world)
        if first_step_s is None:
            first_step_s = time.monotonic() - STARTED

    measured = step_times[1:] or step_times  # the first step pays for allocation and warm-up
    tokens_per_step = args.batch * args.seq
    mine = {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(),
            "step_times": [round(t, 6) for t in step_times],
            "forward_times": [round(t, 6) for t in forward_times],
            "tokens_per_s": tokens_per_step * len(measured) / sum(measured),
            "init_s": initialised - STARTED, "first_step_s": first_step_s,
            "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            "gpus": sampler.summary() if sampler else None,
            "nvml_error": sampler.error if sampler else ""}
    if args.checkpoint_dir:
        mine["checkpoint"] = checkpoint_round_trip(model, optimizer, args.checkpoint_dir,
                                                   args.marker, rank, device)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        wall = sum(measured)
        print(json.dumps({
            "training": True, "ranks": world, "backend": backend,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "parameters": parameters,
            "config": {k: getattr(args, k)
                       for k in ("vocab", "width", "layers", "heads", "seq", "batch", "steps", "lr")},
            "tokens_per_step": tokens_per_step * world,
            "tokens_per_s": tokens_per_step * world * len(measured) / wall if wall > 0 else None,
            "losses": [round(value, 5) if math.isfinite(value) else None for value in losses],
            "per_rank": everyone,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_"))},
        }), flush=True)
    dist.barrier()  # no rank tears its connections down while another still uses them
    del ddp, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: Gloo's worker threads can still hold tensors then, and
    # freeing them without the interpreter aborts the process (SIGABRT, "terminate called
    # without an active exception"; pytorch/pytorch#179291) after a run that succeeded.
    os._exit(0)
