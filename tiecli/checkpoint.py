# Used by `tiecli train` (saving, resuming) and `tiecli eval` (reloading a run's model).
"""Checkpoints: written atomically, read with weights_only=True, corrupt files reported in one line."""

import io
from pathlib import Path

import torch

from tiecli import rundir
from tiecli.errors import TiecliError
from tiecli.model import GPT, GPTConfig


def save(path: Path, state: dict) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    rundir.atomic_write(path, buffer.getvalue())


def load(path: Path) -> dict:
    if not path.is_file():
        raise TiecliError(f"no checkpoint at {str(path)!r}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TiecliError(f"checkpoint {str(path)!r} is corrupt or unreadable ({reason})") from None


def load_model(run_dir: Path, config: GPTConfig) -> tuple[GPT, dict]:
    """A run's model (on CPU) with the weights of its last checkpoint, and the whole checkpoint."""
    ckpt = load(run_dir / rundir.CHECKPOINT)
    model = GPT(config)
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise TiecliError(f"checkpoint of {str(run_dir)!r} does not match its config.yaml ({str(e).splitlines()[0]})") from None
    return model, ckpt
