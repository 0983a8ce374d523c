# Used by `tiecli train` and `tiecli eval`: where the model runs, in which precision, compiled or not.
"""Device, precision and compilation choices, resolved once per command.

The `auto` choices follow measurements, listed in docs/performance.md and repeatable with
benchmarks/throughput.py:
  dtype    bf16 autocast on CUDA where the GPU has native bf16 (else fp16 with a gradient scaler, or
           fp32 before Volta) and on CPUs with native bf16 instructions (AVX512-BF16 or AMX), where
           bf16 matmuls run at about twice the fp32 rate; fp32 elsewhere.
  compile  on CUDA when the run has at least COMPILE_MIN_STEPS_CUDA steps, on CPU at least
           COMPILE_MIN_STEPS_CPU: the points where the compiled step's saving repays the cold
           compile; never on MPS.
  threads  on CPU, one torch thread per core that other processes leave free (pick_threads);
           OMP_NUM_THREADS, when set, wins. benchmarks/threads.py measures why.
"""

import contextlib
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from tiecli.data.corpus import cache_dir
from tiecli.errors import TiecliError

# Compiling repays itself after (compile time) / (time saved a step). On the idle 2-core CPU of
# docs/performance.md (tiecli 0.2, whole step compiled, bf16), the default model's step
# took 119 ms compiled against 167 ms eager, 48 ms saved, and a cold compile (empty inductor
# cache) cost 17-23 s: repaid after 365-490 steps, so 500. With a warm cache the compile costs
# 2-5 s and repays within 150 steps. `benchmarks/throughput.py --defaults` measures it on any machine.
COMPILE_MIN_STEPS_CPU = 500
# On CUDA the same arithmetic with public figures (no GPU has run tiecli yet: docs/performance.md):
# nanoGPT's GPT-2 small step fell from about 250 to 135 ms on an A100 with torch.compile, about
# 115 ms saved, and a cold compile of that model costs about a minute: repaid after ~500 steps.
# A run of a few hundred steps (seconds to a minute of training) is faster eager.
COMPILE_MIN_STEPS_CUDA = 500
FP16_TENSOR_CORES = (7, 0)  # compute capability of the first GPUs with fp16 tensor cores (Volta)
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


# /proc/stat is sampled over this long before training starts: long enough to average a busy
# process's scheduling ticks (10 ms each) over 20 of them, short enough not to be noticed.
BUSY_SAMPLE_S = 0.2


@dataclass
class Threads:
    """The torch (intra-op) threads a command uses, and what they were chosen from."""

    n: int
    cpus: int  # CPUs this process may run on (its affinity)
    busy: float | None  # cores of those busy with other processes when measured; None: not measurable here
    source: str  # "OMP_NUM_THREADS", "auto" (from the free cores) or "run" (a resumed run's own count)

    def free(self) -> float | None:
        return None if self.busy is None else max(0.0, self.cpus - self.busy)

    def warning(self) -> str | None:
        """One line when the machine is oversubscribed or the threads were cut to the free cores; None otherwise."""
        free = self.free()
        if free is None:
            return None
        load = f"{self.busy:.1f} of {self.cpus} cores are busy with other processes"
        plural = "s" if self.n > 1 else ""
        if self.source != "auto" and self.n > max(1, math.floor(free + 0.5)):
            given = "OMP_NUM_THREADS sets" if self.source == "OMP_NUM_THREADS" else "the resumed run keeps"
            return f"warning: {load}, and {given} {self.n} thread{plural}; fewer may be faster"
        if self.source == "auto" and free < 0.5:
            return f"warning: the machine is oversubscribed ({load}); running on 1 thread, slowly"
        if self.source == "auto" and self.n < self.cpus:
            return f"note: {load}; running on {self.n} thread{plural} (OMP_NUM_THREADS=N chooses)"
        return None


def read_proc_stat() -> str:
    with open("/proc/stat") as f:
        return f.read()


def cpu_ticks(stat: str, cpus: set[int]) -> tuple[int, int]:
    """(busy, total) scheduler ticks of these CPUs since boot, from /proc/stat's per-CPU lines."""
    busy = total = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def busy_cores(
    cpus: set[int],
    read: Callable[[], str] = read_proc_stat,
    sleep: Callable[[float], None] = time.sleep,
    seconds: float = BUSY_SAMPLE_S,
) -> float | None:
    """How many of these CPUs other processes kept busy over `seconds` (this one sleeps meanwhile).

    From /proc/stat (Linux); elsewhere the 1-minute load average, which lags by about a minute;
    None where neither exists."""
    try:
        busy0, total0 = cpu_ticks(read(), cpus)
        sleep(seconds)
        busy1, total1 = cpu_ticks(read(), cpus)
    except OSError:
        try:
            return min(float(len(cpus)), os.getloadavg()[0])
        except (OSError, AttributeError):
            return None
    if total1 <= total0:
        return None
    return len(cpus) * (busy1 - busy0) / (total1 - total0)


def pick_threads(cpus: int, busy: float | None, default: int) -> int:
    """One thread per free core (a core counts as free when at least half of it is): at least 1, at most
    torch's default. An OpenMP thread on a core another process holds stalls every other thread at each
    barrier, so a thread too many costs far more than a thread too few (benchmarks/threads.py)."""
    if busy is None:
        return default
    return max(1, min(default, math.floor(cpus - busy + 0.5)))


def affinity() -> set[int]:
    """The CPUs this process may run on (taskset, cgroups' cpusets, SLURM's --cpus-per-task)."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


_chosen: dict[str, Threads] = {}  # one choice per process, so two runs in one process compute alike


def use_threads(device: torch.device, keep: int | None = None) -> Threads:
    """Set torch's threads for this process, once: OMP_NUM_THREADS when set; else `keep` (a resumed
    run's own count, so it computes as before); else on CPU one per free core. Elsewhere torch's default."""
    if "threads" in _chosen and keep is None and not os.environ.get("OMP_NUM_THREADS"):
        # set again: code between two runs of one process (a test, a benchmark) may have changed torch's count,
        # and a run must train on the count it records
        torch.set_num_threads(_chosen["threads"].n)
        return _chosen["threads"]
    cpus = affinity()
    default = _chosen["default"].n if "default" in _chosen else torch.get_num_threads()
    _chosen["default"] = Threads(default, len(cpus), None, "torch")
    busy = busy_cores(cpus) if device.type == "cpu" else None
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp:  # read here, not only at torch's start: it may have been set after torch was imported
        threads = Threads(
            int(omp) if omp.isdigit() and int(omp) > 0 else torch.get_num_threads(), len(cpus), busy, "OMP_NUM_THREADS"
        )
    elif keep is not None:
        threads = Threads(keep, len(cpus), busy, "run")
    elif device.type == "cpu":
        threads = Threads(pick_threads(len(cpus), busy, default), len(cpus), busy, "auto")
    else:
        threads = Threads(default, len(cpus), None, "torch")
    torch.set_num_threads(threads.n)
    _chosen["threads"] = threads
    return threads


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
    without native bf16, fp16 (with a gradient scaler: train/loop.py) where it has fp16 tensor cores (compute
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


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """float32 matmuls in full precision inside: training turns TF32 on for CUDA (prepare.py), which
    rounds fp32 inputs to 10 mantissa bits; measurements written as float32 (the geometry) must not be.
    Through the same (legacy) flag prepare.py sets: torch refuses to read the precision once both APIs are used."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def grad_scaler(device: torch.device, dtype: str) -> torch.amp.GradScaler | None:
    """fp16's loss scaling (its gradients underflow without it); None for bf16 and fp32, which need none."""
    return torch.amp.GradScaler(device.type) if dtype == "fp16" else None


def synchronize(device: torch.device) -> None:
    """Wait until the device has done the work queued so far (only log steps call it: it stalls the queue)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> dict:
    """summary.json's peak_memory: the most the device held during this session of the run.

    CUDA: torch.cuda.max_memory_allocated (tensors; the caching allocator reserves somewhat more);
    elsewhere the process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS), which
    counts the model, the data pages read and Python itself."""
    if device.type == "cuda":
        return {"bytes": torch.cuda.max_memory_allocated(device), "of": "cuda max_memory_allocated"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"bytes": rss if sys.platform == "darwin" else rss * 1024, "of": "process peak RSS"}
