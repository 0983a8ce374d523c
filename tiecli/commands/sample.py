# Used by `tiecli sample RUN` and, with train.sample_tokens, by `tiecli train` to show what a model learned.
"""Text from a run's checkpoint: temperature, top-k and nucleus (top-p) sampling, reproducible by seed.

Each sample draws from its own random stream, seeded from --seed and the sample's index, one
uniform number per token (inverse-CDF sampling). So sample i gets the same random numbers whatever
--num-samples is, and so do two runs sampled with one seed (`--compare`): where their distributions
agree they pick the same tokens, and the texts differ only where the models do.

A key/value cache (model.KVCache) makes each new token one position through the model while the
context fits block_size. Past it the window slides and every position's embedding changes, so each
further token runs the model over the last block_size tokens, as training saw them. See docs/performance.md
("Sampling: the key/value cache") for what the cache saves at the shipped sizes.
"""

import codecs
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import tiktoken
import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tiecli.config.checks import SEED_LIMIT
from tiecli.config.schema import Config
from tiecli.data.tokens import load_corpus
from tiecli.errors import ConfigError, TiecliError
from tiecli.model import checkpoint
from tiecli.model.gpt import GPT, KVCache
from tiecli.run.layout import CHECKPOINT
from tiecli.run.reader import RunReader
from tiecli.runtime.device import pick_device, use_threads

DEFAULT_PROMPT = "\n"  # nanoGPT's start: every tokenizer here has it, and it begins a line of the text


@dataclass
class Options:
    prompt: str
    num_samples: int
    max_new_tokens: int
    temperature: float  # 0: greedy (always the most likely token)
    top_k: int  # keep the k most likely tokens (0: all)
    top_p: float  # keep the fewest most likely tokens whose probability reaches p (1: all)
    seed: int

    def check(self) -> None:
        """One line naming the bad value and what is allowed (exit 2)."""
        checks = (
            (self.num_samples >= 1, f"--num-samples {self.num_samples} must be at least 1"),
            (self.max_new_tokens >= 1, f"--max-new-tokens {self.max_new_tokens} must be at least 1"),
            (
                math.isfinite(self.temperature) and self.temperature >= 0,
                f"--temperature {self.temperature} must be a finite number >= 0 (0: always the most likely token)",
            ),
            (self.top_k >= 0, f"--top-k {self.top_k} must be >= 0 (0: every token)"),
            (0 < self.top_p <= 1, f"--top-p {self.top_p} must be in (0, 1] (1: every token)"),
            (0 <= self.seed < SEED_LIMIT, f"--seed {self.seed} must be an integer in [0, 2**63)"),
            (self.prompt != "", "the prompt is empty; give some text (the default is a newline)"),
        )
        bad = next((message for ok, message in checks if not ok), None)
        if bad:
            raise ConfigError(bad)


@dataclass
class Sample:
    text: str  # the generated text alone (the prompt not repeated)
    ids: list[int]  # the generated token ids
    logprobs: list[float]  # log-probability of each generated token under the model (before temperature, top-k, top-p)


@dataclass
class Samples:
    run: str
    step: int  # the checkpoint's training step
    prompt: str
    prompt_ids: list[int]
    options: dict
    samples: list[Sample]
    notes: list[str] = field(default_factory=list)  # options clamped to what the model has, said once each

    def to_dict(self) -> dict:
        return asdict(self)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """--prompt or --prompt-file (UTF-8), not both; the default is a newline."""
    if prompt is not None and prompt_file is not None:
        raise ConfigError("give --prompt or --prompt-file, not both")
    if prompt_file is None:
        return DEFAULT_PROMPT if prompt is None else prompt
    try:
        return Path(prompt_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TiecliError(f"--prompt-file {str(prompt_file)!r} does not exist") from None
    except UnicodeDecodeError as e:
        raise TiecliError(f"--prompt-file {str(prompt_file)!r} is not UTF-8 text (byte {e.start})") from None


def encode_prompt(encoding: tiktoken.Encoding, text: str, vocab_size: int) -> list[int]:
    """The prompt's token ids; one line naming the first character the tokenizer cannot encode.

    A byte-level tokenizer (bytes, bpe, gpt2) has a token for every byte, so it encodes any text;
    one without some byte would fail inside tiktoken, so the bytes are checked first.
    """
    single = {
        token[0] for token in encoding._mergeable_ranks if len(token) == 1
    }  # see tokenizer.py on _mergeable_ranks
    for i, char in enumerate(text):
        try:
            missing = set(char.encode("utf-8")) - single
        except UnicodeEncodeError:  # a lone surrogate: bytes of the command line that were not UTF-8
            raise TiecliError(f"the prompt's character {char!r} (position {i}) is not valid UTF-8 text") from None
        if missing:
            raise TiecliError(
                f"the prompt's character {char!r} (position {i}) is not in tokenizer {encoding.name}'s vocabulary "
                f"(no token for byte 0x{min(missing):02x}); remove it from the prompt"
            )
    ids = encoding.encode_ordinary(text)
    if ids and max(ids) >= vocab_size:
        raise TiecliError(f"the prompt encodes to token id {max(ids)}, beyond the model's vocabulary of {vocab_size}")
    return ids


def load(run_dir: Path, config: Config, step: str) -> tuple[GPT, tiktoken.Encoding, int]:
    """A run's model with the weights of its checkpoint at `step` (latest: last.pt), in eval mode, and the run's tokenizer."""
    reader = RunReader(run_dir)
    path = reader.full_checkpoint(step)
    if not path.is_file():
        raise TiecliError(
            f"run {run_dir.name} has no checkpoint ({CHECKPOINT}) to sample from: "
            "it stopped before saving one; train it further with --resume"
        )
    model, ckpt = checkpoint.load_model(path, config.model, run_dir.name)
    saved = ckpt["state"]["step"]
    # Only last.pt and the kept step_N.pt hold a whole model; checkpoints/emb/ keeps the token matrices alone.
    checkpoint.check_step(ckpt, step, reader.kept_steps(), run_dir.name)
    corpus = load_corpus(config.data, config.tokenizer)
    reader.check_corpus(corpus.key)  # another tokenizer's ids would not mean the same
    return model.eval(), corpus.encoding, saved


@torch.inference_mode()
def generate(
    model: GPT,
    prompt_ids: list[int],
    o: Options,
    device: torch.device,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, max_new_tokens) token ids and their log-probabilities under the model, N = o.num_samples.

    The context is the last block_size tokens, as in training; each sample's stream is its own.
    on_token gets each new (N,) token as soon as it is drawn (for streaming).
    """
    block_size = model.config.block_size
    root = torch.Generator().manual_seed(o.seed)
    streams = [
        torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=root))) for _ in range(o.num_samples)
    ]
    idx = torch.tensor([prompt_ids] * o.num_samples, dtype=torch.long, device=device)  # (N, T)
    cache = KVCache(model.config)
    logits = model(idx[:, -block_size:], cache=cache)[:, -1, :].float()  # (N, V)
    new_ids, new_logprobs = [], []
    for i in range(o.max_new_tokens):
        if i > 0:
            logits = next_logits(model, idx, cache)
        logprobs = torch.log_softmax(logits, dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in streams]).to(device)  # (N,)
        token = pick(logits, o, uniforms)  # (N,)
        new_ids.append(token)
        new_logprobs.append(logprobs.gather(1, token[:, None])[:, 0])
        if on_token is not None:
            on_token(token)
        idx = torch.cat([idx, token[:, None]], dim=1)
    return torch.stack(new_ids, dim=1).cpu(), torch.stack(new_logprobs, dim=1).cpu()


def next_logits(model: GPT, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """(N, V) logits after idx (N, T), whose last token is the only one the cache lacks."""
    if cache.length < model.config.block_size:
        return model(idx[:, -1:], cache=cache)[:, -1, :].float()
    return model(idx[:, -model.config.block_size :])[:, -1, :].float()  # the window slides: no cache can serve


def pick(logits: torch.Tensor, o: Options, uniforms: torch.Tensor) -> torch.Tensor:
    """The next token of each row: greedy at temperature 0, else the inverse CDF of the filtered distribution at u."""
    if o.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / o.temperature
    if 0 < o.top_k < logits.size(-1):
        kth = torch.topk(logits, o.top_k, dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float64)  # (N, V)
    if o.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the more likely ones already reach top_p; the most likely always stays.
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= o.top_p
        probs = probs.scatter(1, order, sorted_probs.masked_fill(drop, 0.0))
    cdf = probs.cumsum(dim=-1)  # (N, V)
    u = (uniforms * cdf[:, -1]).unsqueeze(1)  # (N, 1), in [0, total mass)
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=probs.size(-1) - 1)


def clamp(o: Options, vocab_size: int) -> tuple[Options, list[str]]:
    """Options beyond what the model has, cut to it, and a note saying so."""
    if o.top_k > vocab_size:
        note = f"note: --top-k {o.top_k} is more than the vocabulary's {vocab_size} tokens; every token is kept"
        return replace(o, top_k=vocab_size), [note]
    return o, []


def streamer(
    encoding: tiktoken.Encoding, write: Callable[[str], None]
) -> tuple[Callable[[torch.Tensor], None], Callable[[], None]]:
    """on_token for generate, writing sample 0's text as it grows, each character once its UTF-8 bytes
    are all there (a byte-level token may hold part of one); and the call that flushes what is left."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def on_token(token: torch.Tensor) -> None:
        text = decoder.decode(encoding.decode_single_token_bytes(int(token[0])))
        if text:
            write(text)

    def finish() -> None:
        text = decoder.decode(b"", final=True)
        if text:
            write(text)

    return on_token, finish


@dataclass
class Sampling:
    """A run's model loaded and the prompt encoded: what `draw` needs, and what to say before it draws."""

    model: GPT
    encoding: tiktoken.Encoding
    device: torch.device
    header: Samples  # run, step, prompt and options, with no samples yet


def load_sampling(run_dir: Path, config: Config, step: str, o: Options) -> Sampling:
    """Check the options, load the run's checkpoint and encode the prompt; options the model cannot
    honour are clamped, with a note in header.notes."""
    o.check()  # --step: the CLI checked it (arguments.check_step_option)
    o, notes = clamp(o, config.model.vocab_size)
    model, encoding, saved = load(run_dir, config, step)
    prompt_ids = encode_prompt(encoding, o.prompt, config.model.vocab_size)
    options = {k: v for k, v in asdict(o).items() if k != "prompt"}
    header = Samples(run_dir.name, saved, o.prompt, prompt_ids, options, [], notes)
    device = pick_device(config.device)
    use_threads(device)  # as training: the cores other processes leave free, or OMP_NUM_THREADS
    return Sampling(model.to(device), encoding, device, header)


def draw(s: Sampling, stream: Callable[[str], None] | None = None) -> Samples:
    """The samples; with `stream`, sample 0's text goes to it as it is drawn."""
    h = s.header
    o = Options(h.prompt, **h.options)
    on_token, finish = streamer(s.encoding, stream) if stream else (None, None)
    ids, logprobs = generate(s.model, h.prompt_ids, o, s.device, on_token)
    if finish:
        finish()
    samples = [
        Sample(s.encoding.decode(row.tolist(), errors="replace"), row.tolist(), [round(x, 6) for x in lp.tolist()])
        for row, lp in zip(ids, logprobs)
    ]
    return replace(h, samples=samples)


def sample_run(run_dir: Path, config: Config, step: str, o: Options) -> Samples:
    """`tiecli sample RUN`: o.num_samples continuations of o.prompt from the run's checkpoint."""
    return draw(load_sampling(run_dir, config, step, o))


PROMPT_SHOWN = 200  # a longer prompt is echoed before its continuation by its last this many characters


def shown_prompt(prompt: str) -> str:
    return prompt if len(prompt) <= PROMPT_SHOWN else "…" + prompt[-PROMPT_SHOWN:]


def show_header(samples, console: Console, err_console: Console) -> None:
    """The notes (clamped options) and one line naming the prompt (its start and length, when long) and options."""
    for note in samples.notes:
        err_console.print(note, highlight=False, markup=False, soft_wrap=True)
    o, prompt = samples.options, samples.prompt
    about = repr(prompt) if len(prompt) <= 60 else f"{prompt[:40]!r}... ({len(prompt):,} characters)"
    console.print(
        f"prompt {about}, seed {o['seed']}, temperature {o['temperature']}, top-k {o['top_k']}, top-p {o['top_p']}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def stream_sample(sampling, console: Console, err_console: Console) -> None:
    """One sample, its text printed token by token as it is drawn."""
    show_header(sampling.header, console, err_console)
    console.print(Text(shown_prompt(sampling.header.prompt)), end="", soft_wrap=True)
    draw(sampling, stream=lambda text: console.print(Text(text), end="", soft_wrap=True))
    console.print()
    console.print("-" * 40)


def show_samples(results, console: Console, err_console: Console) -> None:
    """Each run's samples (prompt and continuation), one column per run when there are two."""
    show_header(results[0], console, err_console)
    if len(results) == 1:
        for s in results[0].samples:
            console.print(Text(shown_prompt(results[0].prompt) + s.text), soft_wrap=True)
            console.print("-" * 40)
        return
    table = Table(*(f"{r.run} (step {r.step})" for r in results), show_lines=True)
    for row in zip(*(r.samples for r in results)):
        table.add_row(*(Text(shown_prompt(r.prompt) + s.text) for r, s in zip(results, row)))
    console.print(table)
