"""The paths that once grew with node pairs, timed at 256, 1,024 and 4,096 nodes on synthetic names.

    .venv/bin/python bench/scale_paths.py [--sizes 256 1024 4096] [--repeat 3]

Pair attribution (sample_pairs, a quarter of the nodes bad, their second pass), the link action
of every node (30 % of the pairs flaky), isolation rounds where no run clears a node, a fan-out's
progress lines (a line after each node's event), and --nodes naming every node as a hostlist.
Each figure is the best of --repeat runs, in ms; the last column is the 4,096-node figure over
the 1,024-node one: about 4 for work that grows with the nodes, 16 for work that grows with their
pairs (these paths were 11-19 before stop 35).
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from handover.session import select_nodes  # noqa: E402
from inventory.loader import load_inventory  # noqa: E402
from runners import fanout, isolation, pairs  # noqa: E402


def names(count: int) -> list[str]:
    return [f"gpu{index:05d}" for index in range(count)]


def attribution(count: int) -> Callable[[], object]:
    rng = random.Random(count)
    nodes = names(count)
    bad = set(rng.sample(nodes, count // 4))
    verdicts = pairs.PairVerdicts({pair: pairs.PairOutcome(False) if set(pair) & bad else
                                   pairs.PairOutcome(True, 100.0 + rng.random()) for pair in pairs.sample_pairs(nodes)})
    verdicts.second = {pair: pairs.PairOutcome(False) if set(pair) & bad else pairs.PairOutcome(True, 100.0)
                       for pair in verdicts.second_pass_pairs(nodes)}
    return verdicts.attribution


def link_actions(count: int) -> Callable[[], object]:
    rng = random.Random(count + 1)
    blame = pairs.attribute({pair: rng.random() >= 0.3 for pair in pairs.sample_pairs(names(count))})
    return lambda: [pairs.link_action(blame, node, 0, "ib_write_bw") for node in names(count)]


def isolation_rounds(count: int) -> Callable[[], object]:
    def run() -> object:
        plan = isolation.Isolation(names(count), 1.0, budget_s=1e9)
        return isolation.run_rounds(plan, lambda groups, _round, _timeout: {g: isolation.Outcome(0.5) for g in groups},
                                    clock=lambda: 0.0)
    return run


def progress_lines(count: int) -> Callable[[], object]:
    def run() -> object:
        order = names(count)
        random.Random(count + 2).shuffle(order)
        progress = fanout.Progress(step="hostname", total=count)
        for node in names(count):
            progress.start(node)
        lines = []
        for index, node in enumerate(order):
            progress.finish(node, "ok" if index % 10 else "unreachable")
            lines.append(progress.line())
        return lines
    return run


def nodes_option(count: int, folder: Path) -> Callable[[], object]:
    inventory = folder / f"c{count}.yaml"
    inventory.write_text(f"cluster: c\nprofile: cpu-only\nnodes: [\"gpu[00000-{count - 1:05d}]\"]\n")
    cluster = load_inventory(inventory)
    return lambda: select_nodes(cluster, f"gpu[00000-{count - 1:05d}]")


PATHS = {"pair attribution": attribution, "link actions": link_actions, "isolation rounds": isolation_rounds,
         "progress lines": progress_lines}


def best_ms(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="handover-bench-") as folder:
        for count in args.sizes:
            for path, make in PATHS.items():
                figures.setdefault(path, {})[count] = best_ms(make(count), args.repeat)
            figures.setdefault("--nodes of every node", {})[count] = best_ms(nodes_option(count, Path(folder)),
                                                                             args.repeat)
    print(f"best of {args.repeat} runs, ms; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| path | " + " | ".join(f"{count:,} nodes" for count in args.sizes) + " | last / previous |")
    print("| --- |" + " ---: |" * (len(args.sizes) + 1))
    for path, by_size in figures.items():
        sizes = sorted(by_size)
        growth = by_size[sizes[-1]] / by_size[sizes[-2]] if len(sizes) > 1 and by_size[sizes[-2]] else float("nan")
        print(f"| {path} | " + " | ".join(f"{by_size[count]:.1f}" for count in args.sizes) + f" | {growth:.1f} |")


if __name__ == "__main__":
    main()
