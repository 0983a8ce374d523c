# Used by `tiecli train` and `tiecli eval`: where the model runs and in which precision.
"""Device and precision choices, resolved once per command."""

import contextlib

import torch

from tiecli.errors import TiecliError


def pick_device(name: str) -> torch.device:
    if name != "auto":
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise TiecliError(f"device={name!r} but CUDA is not available here; use device=auto or device=cpu")
        if name == "mps" and not torch.backends.mps.is_available():
            raise TiecliError("device='mps' but MPS is not available here; use device=auto or device=cpu")
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(name: str, device: torch.device) -> str:
    """auto: bf16 autocast where the hardware has fast bf16 (CUDA), fp32 elsewhere."""
    if name != "auto":
        return name
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def autocast_for(device: torch.device, dtype: str):
    if dtype == "bf16":
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext
