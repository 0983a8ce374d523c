# Used by `tiecli train` under torchrun (`torchrun --nproc_per_node N -m tiecli train ...`, or `tiecli train --nproc N`).
"""Data-parallel training: the process group, which rank does what, and what the ranks agree on.

torchrun starts N copies of `tiecli train` and tells each its RANK, LOCAL_RANK and WORLD_SIZE.
Each copy trains the same model under DistributedDataParallel (gloo on CPU, NCCL for CUDA tensors),
one device per local rank. Without torchrun there is no process group, and every helper here is
the identity: rank 0 of a world of 1.

The global batch is the config's: train.batch_size x train.grad_accum sequences per optimizer step,
whatever the number of processes. Every rank draws those windows from the same sampler, in the
same order a single process would, and reads its own 1/N slice of them (data.StepBatches): the ranks
see different data, and a run on N processes trains on exactly the batches of the run on one,
so both reach the same losses up to floating-point noise.

Rank 0 alone plans the run, writes the run directory and evaluates; the others train in step.
Starting the ranks (`--nproc`) and turning a signal into one clean stop is launcher.py's.
"""

import contextlib
import datetime
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from tiecli.config.schema import TrainConfig
from tiecli.errors import ConfigError, TiecliError
from tiecli.model.gpt import Embeddings
from tiecli.runtime.launcher import launched, stop_with_launcher

# How long a rank waits in a collective before giving up: long enough for rank 0's final
# evaluation of a whole split while the others wait; a rank that dies is noticed at once anyway
# (its sockets close). TIECLI_DIST_TIMEOUT (seconds) changes it.
TIMEOUT_S = 1800
PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "gloo", "NCCL", "Timed out")
# Of those, the words that say a peer went away; any other NCCL error (a bad GPU, an illegal memory access,
# a misconfigured network) is reported as what it is, not as a lost rank.
LOST_PEER = ("closed by peer", "reset by peer", "Timed out", "timed out", "Timeout", "remote process exited")


class PeerLost(TiecliError):
    """A collective failed: another rank died, or stayed away past the timeout."""


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_rank0() -> bool:
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """The process group of a torchrun launch, for the duration of a command; nothing without torchrun.

    Tensors on the CPU go through gloo, CUDA tensors through NCCL. A collective that fails (another
    rank died, or stayed away past the timeout) becomes one line naming this rank, exit code 1.
    """
    if not launched() or dist.is_initialized():
        yield
        return
    stop_with_launcher()
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available() and local_rank() < torch.cuda.device_count():  # more ranks than GPUs: device() refuses
        torch.cuda.set_device(local_rank())
    timeout = datetime.timedelta(seconds=float(os.environ.get("TIECLI_DIST_TIMEOUT", TIMEOUT_S)))
    try:
        dist.init_process_group(backend, timeout=timeout)
    except (RuntimeError, ValueError) as e:
        raise TiecliError(f"cannot join the process group ({first_line(e)}); start tiecli with torchrun") from None
    try:
        yield
    except RuntimeError as e:  # gloo reports a lost peer as a plain RuntimeError; NCCL as a DistError
        if not isinstance(e, dist.DistError) and not any(w in str(e) for w in PEER_ERRORS):
            raise
        raise collective_error(e) from None
    finally:
        dist.destroy_process_group()


def collective_error(e: BaseException) -> PeerLost:
    """A failed collective as one line: a lost peer (gloo's closed sockets, a timeout) as such, any other
    NCCL error as the failure it is, with its first line."""
    lost = "NCCL" not in str(e) or any(w in str(e) for w in LOST_PEER)
    what = "another rank stopped or cannot be reached" if lost else "a collective operation failed"
    return PeerLost(f"rank {rank()} of {world_size()}: {what} ({first_line(e)}); the run's last checkpoint is kept")


def first_line(e: BaseException) -> str:
    """An error's first line without gloo's source location ("[.../pair.cc:537] ")."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", line)[:200]


@contextlib.contextmanager
def quiet_others() -> Iterator[None]:
    """On ranks other than 0, an error all ranks share (a bad config, an interrupt) exits with its
    code but without its line: rank 0 says it once. Errors of the rank itself (a lost peer) still speak."""
    try:
        yield
    except TiecliError as e:
        if is_rank0() or isinstance(e, PeerLost):
            raise
        raise SystemExit(e.exit_code) from None


def from_rank0(plan: Callable[[], Any]) -> Any:
    """plan() on rank 0, its result (or its TiecliError) handed to every rank.

    Planning reads and may tidy the run directory (an unstarted run is removed), so only rank 0 does
    it; the others would race it, or find the run it has just created.
    """
    if world_size() == 1:
        return plan()
    box: list[Any] = [None]
    if is_rank0():
        try:
            box[0] = ("ok", plan())
        except TiecliError as e:
            box[0] = ("error", e)
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def local_first(build: Callable[[], Any]) -> Any:
    """build() on each machine's local rank 0, then on the other ranks: the first fills the data and
    tokenizer cache, the others read it, rather than N processes tokenizing the corpus at once.
    A failure there (a missing file) stops every rank; the rank that failed says why."""
    if world_size() == 1:
        return build()
    first, error, result = local_rank() == 0, None, None
    if first:
        try:
            result = build()
        except TiecliError as e:
            error = e
    if any_rank(error is not None):  # also the barrier: the other ranks wait here for the first ones
        raise error or TiecliError("the data could not be prepared; the first rank of a machine says why")
    return result if first else build()


def device(picked: torch.device) -> torch.device:
    """One CUDA device per local rank: `cuda` becomes cuda:LOCAL_RANK under torchrun.

    ConfigError, before anything touches the GPU, for what would end in "invalid device ordinal" or
    put every rank on one GPU: cuda:N past the last GPU, cuda:N under torchrun with several ranks,
    and more ranks on this machine than it has GPUs."""
    if picked.type != "cuda":
        return picked
    gpus = torch.cuda.device_count()
    if picked.index is not None and picked.index >= gpus:
        raise ConfigError(
            f"device={picked} but this machine has {gpus} GPU(s) (cuda:0 to cuda:{gpus - 1}); use device=cuda"
        )
    if not dist.is_initialized():
        return picked
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world_size()))
    if picked.index is not None and ranks_here > 1:
        raise ConfigError(
            f"device={picked} under torchrun would put all {ranks_here} ranks on GPU {picked.index}; "
            "use device=cuda (each rank takes cuda:LOCAL_RANK), and CUDA_VISIBLE_DEVICES to choose the GPUs"
        )
    if ranks_here > gpus:
        raise ConfigError(
            f"--nproc {ranks_here} but this machine has {gpus} GPU(s); use at most --nproc {gpus}, "
            "one rank per GPU (or device=cpu)"
        )
    return picked if picked.index is not None else torch.device("cuda", local_rank())


def wrap(model: torch.nn.Module, dev: torch.device, idle_parameters: bool = False) -> torch.nn.Module:
    """The module the training step calls: the model under DDP in a process group, else the model itself.

    idle_parameters: some parameter gets no gradient in some steps (tied_then_untied's lm_head before its
    switch), which DDP must look for after each backward pass, else it waits for that gradient forever."""
    if not dist.is_initialized():
        return model
    ids = [dev.index] if dev.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=idle_parameters)


def sync_grads(module: object, now: bool) -> None:
    """DDP all-reduces gradients on the last micro-batch of a step only (the others accumulate locally)."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        module.require_backward_grad_sync = now


def rank_shape(t: TrainConfig, world: int) -> tuple[int, int]:
    """(micro-batch, micro-batches) of one rank: its batch_size x grad_accum / world sequences per step,
    in equal micro-batches of at most train.batch_size. ConfigError when the world size does not divide them."""
    total = t.batch_size * t.grad_accum
    if total % world:
        raise ConfigError(
            f"world size {world} does not divide the global batch train.batch_size x train.grad_accum = "
            f"{t.batch_size} x {t.grad_accum} = {total} sequences; use a number of processes that divides {total}, "
            "or change train.batch_size / train.grad_accum"
        )
    per_rank = total // world
    micro = max(d for d in range(1, min(per_rank, t.batch_size) + 1) if per_rank % d == 0)
    return micro, per_rank // micro


def batch_info(t: TrainConfig, block_size: int) -> dict:
    """How the global batch is made: summary.json's `batch`, and the line before the progress bar."""
    world = world_size()
    micro, steps = rank_shape(t, world)
    return {
        "global": t.batch_size * t.grad_accum,
        "micro_batch": micro,
        "grad_accum": steps,
        "world_size": world,
        "tokens": t.batch_size * t.grad_accum * block_size,
    }


def mean_(tensor: torch.Tensor) -> torch.Tensor:
    """Average a tensor over the ranks in place (as DDP averages gradients); returns it."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= world_size()
    return tensor


def any_(mask: torch.Tensor) -> torch.Tensor:
    """Elementwise OR of a bool tensor over the ranks."""
    if not dist.is_initialized():
        return mask
    counts = mask.to(torch.int32)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return counts > 0


def across_ranks(
    emb: Embeddings, g_in: torch.Tensor, g_out: torch.Tensor, present: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """diagnostics.gradient_paths and the input tokens of the global batch, from each rank's own (the identity in one process).

    Under DDP a shared matrix's split holds each rank's own micro-batches' gradients: they are
    averaged over the ranks in place, as DDP averages W.grad, and present is OR-ed, so the statistics
    are those of one process on the whole batch. An untied model's wte.grad and lm_head.grad are
    W.grad itself, which DDP has already averaged.
    """
    if emb.shared:
        g_in, g_out = mean_(g_in), mean_(g_out)
    return g_in, g_out, any_(present)


def any_rank(flag: bool) -> bool:
    """Whether `flag` is set on any rank: how a signal to one rank stops all after the same step.

    A CPU tensor, so under NCCL it goes through gloo and never waits for the GPU."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather(obj: Any) -> list[Any] | None:
    """Every rank's obj, in rank order, on rank 0 (None elsewhere): the per-rank RNG states of a checkpoint."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] | None = [None] * world_size() if is_rank0() else None
    dist.gather_object(obj, out, dst=0)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def checkpoint_world_size(ckpt: dict) -> int:
    """The number of processes that wrote a checkpoint: 1 + its ranks' own RNG states (none for one process)."""
    return 1 + len(ckpt.get("rank_rng", []))


def check_world_size(ckpt: dict, run: str) -> None:
    """A run continues with the world size it was trained with: its data slices and RNG streams are per rank."""
    refuse_world_size(run, checkpoint_world_size(ckpt), world_size())


def refuse_world_size(run: str, saved: int, now: int) -> None:
    """ConfigError, naming both sizes, when a run trained by `saved` processes would resume on `now`."""
    if saved != now:
        raise ConfigError(
            f"run {run} was trained with world size {saved} and cannot resume with world size {now}; "
            f"resume it with {saved} process{'es' if saved > 1 else ''} (tiecli train --nproc {saved} --resume ...)"
        )


def rng_of_rank(ckpt: dict) -> dict:
    """This rank's RNG states in a checkpoint: rank 0's under "rng", the others' under "rank_rng"."""
    return ckpt["rng"] if is_rank0() else ckpt["rank_rng"][rank() - 1]


def batch_line(t: TrainConfig, block_size: int) -> str:
    """The global batch as the progress bar's first line states it: how it is made only when it is more than one micro-batch.

    Under 80 columns for one process, so a log or a narrow terminal keeps it on one line.
    """
    b = batch_info(t, block_size)
    line = f"batch {b['global']} sequences ({b['tokens']:,} tokens) a step"
    if b["world_size"] > 1:
        return f"global {line} = {b['micro_batch']} x {b['grad_accum']} micro-steps x {b['world_size']} processes"
    return line if b["grad_accum"] == 1 else f"{line} = {b['micro_batch']} x {b['grad_accum']} micro-steps"


MIN_GPU_BATCH_TOKENS = 16384  # below this a rank's micro-batch leaves a GPU waiting on the host's kernel launches


def small_batch_warning(device: torch.device, t: TrainConfig, block_size: int) -> str | None:
    """One line when a rank's micro-batch on CUDA is under MIN_GPU_BATCH_TOKENS tokens, else None."""
    micro, _ = rank_shape(t, world_size())
    if device.type != "cuda" or micro * block_size >= MIN_GPU_BATCH_TOKENS:
        return None
    return (
        f"warning: a micro-batch of {micro} x {block_size} = {micro * block_size:,} tokens a rank keeps a GPU "
        f"waiting (under {MIN_GPU_BATCH_TOKENS:,}); raise train.batch_size (hardware=gpu: 16 x 1024)"
    )
