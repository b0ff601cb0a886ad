"""TensorBoard event files of training runs, in the run directory: operators already watch
training that way (`tensorboard --logdir out/<cluster>/latest/tensorboard`).

Written only where the tensorboard package is installed; without it the results say so and
nothing else changes. The JSON results stay the source of truth; these are a rendering.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

TENSORBOARD_DIR = "tensorboard"


def available() -> bool:
    try:
        import tensorboard.summary  # noqa: F401
    except ImportError:
        return False
    return True


def write_scalars(run_dir: Path, run_name: str, scalars: Mapping[str, Sequence[tuple[int, float]]],
                  ) -> Path | None:
    """One TensorBoard run (a directory) with a scalar series per tag; None without tensorboard."""
    if not available():
        return None
    from tensorboard.summary import DirectoryOutput, Writer

    directory = Path(run_dir) / TENSORBOARD_DIR / run_name
    directory.mkdir(parents=True, exist_ok=True)
    writer = Writer(DirectoryOutput(str(directory)))
    try:
        for tag, points in scalars.items():
            for step, value in points:
                writer.add_scalar(tag, float(value), int(step))
    finally:
        writer.close()
    return directory
