"""The config's shape: one dataclass per section, as OmegaConf checks the composed config against them.

The dataclasses carry no defaults: conf/ holds every default value (docs/configuration.md, "Where
defaults live"); here each key only gets its type. `Composed` is the composed config's shape,
`Config` what the rest of tiecli gets, `GPTConfig` the model's part of it (whose stand-ins for the
settings of other tying modes are its only defaults), `LauncherConfig` one conf/launcher/*.yaml.
"""

from dataclasses import dataclass

GROUPS = ("model", "tying", "data", "tokenizer", "logger")
LIST_GROUPS = ("logger",)  # groups of which one picks several files at once (logger=[tensorboard,wandb]), or none


@dataclass
class TrainConfig:
    max_steps: int
    max_tokens: int | None
    batch_size: int
    grad_accum: int
    lr: float
    lr_embedding: float | None
    lr_output: float | None
    min_lr: float
    warmup_steps: int
    warmup_fraction: float | None
    weight_decay: float
    decay_embeddings: bool
    beta1: float
    beta2: float
    grad_clip: float
    eval_interval: int
    evals: int | None
    eval_batches: int
    log_interval: int
    checkpoint_interval: int
    checkpoints: int | None
    keep_checkpoints: int
    sample_tokens: int


@dataclass
class DataConfig:
    name: str
    path: str | None
    split: str
    val_fraction: float
    test_fraction: float
    split_seed: int
    n_blocks: int
    num_proc: int | None
    files: str | None  # data=hf only, like text_field, hub and hf_split
    text_field: str | None
    hub: str | None
    hf_split: str | None


@dataclass
class TokenizerConfig:
    name: str
    vocab_size: int
    train_bytes: int | None  # tokenizer=bpe only; None: the whole training split


@dataclass
class EvalConfig:
    buckets: list[float]
    test: bool
    max_tokens: int | None
    max_seconds: float | None  # the final evaluation's time budget at the step-0 evaluation's pace


@dataclass
class DiagConfig:
    every: int
    geometry: bool
    snapshots: bool
    max_snapshots: int
    pairs: str | None
    seed: int


@dataclass
class TensorBoardLogger:
    projector: bool
    projector_tokens: int | None


@dataclass
class WandbLogger:
    project: str
    entity: str | None
    mode: str


@dataclass
class LoggerSettings:
    """The trackers logger=[...] picked (conf/logger/*.yaml); None: that tracker is off."""

    tensorboard: TensorBoardLogger | None = None
    wandb: WandbLogger | None = None


@dataclass
class Settings:
    """Everything but the model: the same in the composed config and in `Config`."""

    train: TrainConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    eval: EvalConfig
    diag: DiagConfig
    logger: LoggerSettings
    seed: int
    device: str
    dtype: str
    compile: str  # auto, true or false (a bool given on the command line arrives as "True"/"False")


@dataclass
class ModelShape:
    """conf/config.yaml's model: keys plus one conf/model/*.yaml."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    dropout: float
    bias: bool
    embedding_norm: bool


@dataclass
class TyingSettings:
    """One conf/tying/*.yaml: the mode, and the settings that only some modes have (None: not this mode's).

    compose() already refuses a key the chosen mode's file lacks, so every mode can share this one shape.
    """

    mode: str
    scale_logits: bool | None = None
    scale_inputs: bool | None = None
    shared_fraction: float | None = None
    rank: int | None = None
    untie_at: float | None = None
    embedding_std: float | None = None  # a null in the file keeps GPT-2's init, as absent does
    output_std: float | None = None


@dataclass
class Composed(Settings):
    """The composed config's shape (conf/config.yaml and one file per group), which OmegaConf checks."""

    model: ModelShape
    tying: TyingSettings


TYING_MODES = ("untied", "tied", "tied_bias", "scaled", "partial", "hybrid", "untied_init", "tied_then_untied")


@dataclass
class GPTConfig:
    """The model's shape and tying mode.

    The sizes have no defaults: conf/ holds them, and tiecli/config/checks.py fills every field from there;
    tiecli/model/gpt.py builds the GPT from it.
    The rest default to nanoGPT's choices (no dropout, biases, tied) and, for the settings that only
    some modes have, to stand-ins for the other modes (conf/ gives each mode only its own settings).
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2
    tying: str = "tied"  # one of TYING_MODES
    scale_logits: bool = False  # scaled: logits * n_embd**-0.5 (T5)
    scale_inputs: bool = False  # scaled: input embeddings * n_embd**0.5 (Gemma)
    shared_fraction: float = 0.5  # partial: fraction of the n_embd dimensions both sides share
    rank: int = 16  # hybrid: rank of the output matrix's independent part
    untie_at: float = 2 / 3  # tied_then_untied: the fraction of the steps after which the one matrix becomes two
    embedding_std: float | None = None  # untied, tied_then_untied: the input embedding's init std (None: GPT-2's)
    output_std: float | None = None  # untied: the output matrix's init std, 0 for zeros (None: GPT-2's)
    embedding_norm: bool = False  # RMS-normalise token + position embeddings before the first block

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):  # first: n_head=0 would divide by zero
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.tying not in TYING_MODES:
            raise ValueError(f"tying mode {self.tying!r} is not one of {', '.join(TYING_MODES)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} is not in [0, 1)")
        # Only the mode that uses a setting checks it: the stand-in rank=16 must not refuse a tied model 8 wide.
        if self.tying == "partial" and not 0.0 <= self.shared_fraction <= 1.0:
            raise ValueError(f"shared_fraction={self.shared_fraction} is not in [0, 1]")
        if self.tying == "hybrid" and not 1 <= self.rank <= self.n_embd:
            raise ValueError(f"rank={self.rank} is not in [1, n_embd={self.n_embd}]")
        if self.tying == "tied_then_untied" and not 0.0 <= self.untie_at <= 1.0:
            raise ValueError(f"untie_at={self.untie_at} is not in [0, 1] (a fraction of the steps)")
        for name in ("embedding_std", "output_std"):
            if getattr(self, name) is not None and not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0: zeros; null: GPT-2's 0.02)")

    @property
    def n_shared(self) -> int:
        """partial: how many embedding dimensions input and output share."""
        return round(self.shared_fraction * self.n_embd)


@dataclass
class Config(Settings):
    """What the rest of tiecli gets: the settings, and the model and tying groups with the vocabulary size."""

    model: GPTConfig

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.model.block_size

    @property
    def max_steps(self) -> int:
        """Optimizer steps to train: from the token budget when one is set."""
        if self.train.max_tokens is None:
            return self.train.max_steps
        return -(-self.train.max_tokens // self.tokens_per_step)

    @property
    def warmup(self) -> int:
        """Linear warmup steps: train.warmup_fraction of max_steps (rounded) when set, else train.warmup_steps."""
        t = self.train
        return t.warmup_steps if t.warmup_fraction is None else round(t.warmup_fraction * self.max_steps)

    @property
    def n_evals(self) -> int:
        """In-training evaluations after the one at step 0; the last is at max_steps.

        train.evals (at most one a step), else one every train.eval_interval steps and one at the end.
        """
        if self.train.evals is None:
            return -(-self.max_steps // self.train.eval_interval)
        return min(self.train.evals, self.max_steps)

    @property
    def eval_every(self) -> int:
        """Steps between evaluations: train.eval_interval, or with train.evals the nearest whole number
        to max_steps / n_evals (the steps are then ceil(i * max_steps / n_evals): gaps differ by one at most)."""
        if self.train.evals is None:
            return self.train.eval_interval
        return round(self.max_steps / self.n_evals)

    def evals_by(self, step: int) -> int:
        """How many in-training evaluations steps 1..step hold: `step` evaluates when this grows."""
        if step >= self.max_steps:
            return self.n_evals
        if self.train.evals is None:
            return step // self.train.eval_interval
        return step * self.n_evals // self.max_steps  # spread evenly, whatever max_steps / evals leaves over

    def is_eval_step(self, step: int) -> bool:
        return step >= 1 and self.evals_by(step) > self.evals_by(step - 1)

    def is_checkpoint_step(self, step: int) -> bool:
        """Whether last.pt is saved after `step`: train.checkpoints times spread evenly (as train.evals
        spreads evaluations), else every train.checkpoint_interval steps; always at max_steps."""
        if step >= self.max_steps:
            return True
        n = self.train.checkpoints
        if n is None:
            return step % self.train.checkpoint_interval == 0
        n = min(n, self.max_steps)
        return step >= 1 and step * n // self.max_steps > (step - 1) * n // self.max_steps


# --- `tiecli sweep --launcher NAME`: conf/launcher/NAME.yaml and the command line's launcher.* overrides ---


@dataclass
class LocalLauncher:
    """conf/launcher/{basic,submitit_local}.yaml's local: keys (timeout_min and signal_delay_s: submitit_local's only)."""

    threads_per_job: int | None
    timeout_min: float | None = None
    signal_delay_s: int | None = None


@dataclass
class SlurmLauncher:
    """conf/launcher/submitit_slurm.yaml's slurm: keys, each an sbatch option."""

    partition: str | None
    time: int
    gpus_per_node: int
    cpus_per_task: int | None
    mem: str | None
    array_parallelism: int
    account: str | None
    qos: str | None
    signal_delay_s: int
    extra: list[str]
    setup: list[str]
    nodes: int  # --nodes: one job across this many nodes, one torchrun each, rendezvous on the first


@dataclass
class LauncherConfig:
    """One conf/launcher/*.yaml: a launcher has the local: keys or the slurm: keys.

    kind: which of tiecli's launchers runs the jobs (basic, submitit_local or submitit_slurm), told by the keys
    the file has, so that a file of one's own in --config-dir/launcher/ is a launcher too (compose_launcher).
    """

    kind: str
    local: LocalLauncher | None = None
    slurm: SlurmLauncher | None = None
