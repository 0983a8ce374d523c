# Used by `tiecli train`: everything the training loop works with, built before the run directory exists.
"""Data, model, optimizer, batches and the compiled step: checked before a file of the run is written."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tiecli.config.schema import Config
from tiecli.data.batches import StepBatches, get_batch
from tiecli.data.pairs import form_pairs
from tiecli.data.tokens import Corpus, load_corpus
from tiecli.errors import TiecliError
from tiecli.model.gpt import GPT
from tiecli.runtime import distributed
from tiecli.runtime.device import autocast_for, compile_step, grad_scaler, pick_compile, pick_device, pick_dtype
from tiecli.train.optim import make_optimizer


@dataclass
class Setup:
    """What the loop works with, built before the run directory exists (so a bad input leaves nothing)."""

    config: Config
    device: torch.device
    dtype: str
    autocast: Callable
    corpus: Corpus
    buckets: np.ndarray
    model: GPT
    optimizer: torch.optim.AdamW
    sampler: torch.Generator
    pairs: list
    pairs_info: dict
    compiled: bool  # whether `forward` is torch.compile'd (compile: auto resolved)
    forward: Callable  # model(x, y) -> loss for the training step: the model itself, or its compiled graph
    batches: StepBatches  # this rank's micro-batches, drawn from `sampler`
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaling; None under bf16 and fp32


def set_up(config: Config) -> Setup:
    """Data, model and optimizer; checks the data fits the model before any file is written."""
    device = distributed.device(pick_device(config.device))
    dtype = pick_dtype(config.dtype, device)
    distributed.rank_shape(config.train, distributed.world_size())  # the world size must divide the global batch
    compiled = pick_compile(config.compile, device, config.max_steps)
    if device.type == "cuda":
        if device.index is not None:  # cuda:N becomes the current device: what uses that one lands on N too
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    corpus = distributed.local_first(lambda: load_corpus(config.data, config.tokenizer))  # one rank builds the cache
    for split, tokens in corpus.tokens.items():
        if len(tokens) < config.model.block_size + 1:
            raise TiecliError(
                f"the {split} split has {len(tokens)} tokens, fewer than model.block_size + 1 = "
                f"{config.model.block_size + 1}; use a smaller model.block_size or more data"
            )
    model = GPT(config.model, seed=config.seed).to(device)
    # dropout's RNG, from the start of training: the weights have their own generators; each rank its own stream
    torch.manual_seed(config.seed + distributed.rank())
    # The whole forward, fused head and loss included, as one graph, whose backward AOTAutograd
    # compiles too. The gradient split is part of that graph (head.py: Fork), so diagnostics
    # neither break it nor recompile it. Evaluation stays eager: its shapes vary.
    idle = config.model.tying == "tied_then_untied"  # lm_head gets no gradient before the switch
    forward = distributed.wrap(compile_step(model) if compiled else model, device, idle)  # DDP under torchrun
    wants_pairs = config.diag.geometry or config.diag.every > 0  # R3's geometry and R4's pair gradients
    pairs, pairs_info = form_pairs(corpus.encoding, config.diag.pairs) if wants_pairs else ([], {})
    t, world, sampler = config.train, distributed.world_size(), torch.Generator().manual_seed(config.seed)
    micro, _ = distributed.rank_shape(t, world)
    batches = StepBatches(
        corpus.tokens["train"], t.batch_size, t.grad_accum, config.model.block_size, micro, distributed.rank(), world,
        sampler, device, draw=lambda *args: get_batch(*args),
    )  # fmt: skip
    return Setup(
        config=config,
        device=device,
        dtype=dtype,
        autocast=autocast_for(device, dtype),
        corpus=corpus,
        buckets=corpus.buckets(config.eval.buckets),
        model=model,
        optimizer=make_optimizer(model, config.train, device),
        sampler=sampler,
        pairs=pairs,
        pairs_info=pairs_info,
        compiled=compiled,
        forward=forward,
        batches=batches,
        scaler=grad_scaler(device, dtype),
    )
