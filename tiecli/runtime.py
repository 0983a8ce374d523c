# Used by `tiecli train` and `tiecli eval`: where the model runs, in which precision, compiled or not.
"""Device, precision and compilation choices, resolved once per command.

The `auto` choices follow measurements, listed in README's Performance section and repeatable with
benchmarks/throughput.py:
  dtype    bf16 autocast on CUDA where the GPU has native bf16 (else fp16 with a gradient scaler, or
           fp32 before Volta) and on CPUs with native bf16 instructions (AVX512-BF16 or AMX), where
           bf16 matmuls run at about twice the fp32 rate; fp32 elsewhere.
  compile  on CUDA when the run has at least COMPILE_MIN_STEPS_CUDA steps, on CPU at least
           COMPILE_MIN_STEPS_CPU: the points where the compiled step's saving repays the cold
           compile; never on MPS.
"""

import contextlib
import os

import torch

from tiecli.data import cache_dir
from tiecli.errors import TiecliError

# Compiling repays itself after (compile time) / (time saved a step). On the idle 2-core CPU of
# README's Performance section (tiecli 0.2, whole step compiled, bf16), the default model's step
# took 119 ms compiled against 167 ms eager, 48 ms saved, and a cold compile (empty inductor
# cache) cost 17-23 s: repaid after 365-490 steps, so 500. With a warm cache the compile costs
# 2-5 s and repays within 150 steps. `benchmarks/throughput.py --defaults` measures it on any machine.
COMPILE_MIN_STEPS_CPU = 500
# On CUDA the same arithmetic with public figures (no GPU has run tiecli yet: docs/performance-gpu.md):
# nanoGPT's GPT-2 small step fell from about 250 to 135 ms on an A100 with torch.compile, about
# 115 ms saved, and a cold compile of that model costs about a minute: repaid after ~500 steps.
# A run of a few hundred steps (seconds to a minute of training) is faster eager.
COMPILE_MIN_STEPS_CUDA = 500
FP16_TENSOR_CORES = (7, 0)  # compute capability of the first GPUs with fp16 tensor cores (Volta)
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


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


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matmul instructions (oneDNN then runs bf16 at about twice fp32)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def cuda_has_bf16() -> bool:
    """Whether the current GPU (a rank's own under torchrun) runs bf16 natively: Ampere and later.
    is_bf16_supported() alone also counts the slow emulation of V100 and T4; torch before 2.5 has no
    including_emulation, and no emulation either."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:
        return torch.cuda.is_bf16_supported()


def pick_dtype(name: str, device: torch.device) -> str:
    """auto: bf16 autocast where the hardware has fast bf16 (CUDA, CPUs with bf16 instructions); on a GPU
    without native bf16, fp16 (with a gradient scaler: train.py) where it has fp16 tensor cores (compute
    capability 7.0: V100, T4), else fp32; fp32 elsewhere. summary.json's dtype says which."""
    if name != "auto":
        return name
    if device.type == "cuda":
        if cuda_has_bf16():
            return "bf16"
        return "fp16" if torch.cuda.get_device_capability(device) >= FP16_TENSOR_CORES else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_bf16() else "fp32"


def pick_compile(name: str, device: torch.device, max_steps: int) -> bool:
    """compile: true / false as given; auto: on CUDA and CPU for runs long enough to repay compiling, MPS no."""
    if name != "auto":
        return name == "true"
    if device.type == "cuda":
        return max_steps >= COMPILE_MIN_STEPS_CUDA
    return device.type == "cpu" and max_steps >= COMPILE_MIN_STEPS_CPU


def use_compile_cache() -> None:
    """Keep inductor's caches (compiled kernels, FX and AOTAutograd graphs) under tiecli's cache dir,
    so a second run of the same model starts from them; TORCHINDUCTOR_CACHE_DIR, when set, wins."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))


def compile_step(model: torch.nn.Module):
    """model(x, y) -> loss compiled as one graph (forward, fused head, loss; AOTAutograd the backward)."""
    use_compile_cache()
    return torch.compile(model, fullgraph=True, dynamic=False)


def autocast_for(device: torch.device, dtype: str):
    if dtype in AUTOCAST:
        return lambda: torch.autocast(device_type=device.type, dtype=AUTOCAST[dtype])
    return contextlib.nullcontext


def grad_scaler(device: torch.device, dtype: str) -> torch.amp.GradScaler | None:
    """fp16's loss scaling (its gradients underflow without it); None for bf16 and fp32, which need none."""
    return torch.amp.GradScaler(device.type) if dtype == "fp16" else None
