# Used by `tiecli train` (saving, resuming), `tiecli eval` and `tiecli geometry` (reloading a run's weights).
"""Checkpoints: serialised here, written by the run's RunWriter, read with weights_only=True and
checked for shape, so a corrupt or foreign file is one line naming the run, never a traceback."""

import io
from pathlib import Path

import torch

from tiecli.errors import TiecliError
from tiecli.model.gpt import GPT, Embeddings, GPTConfig
from tiecli.run.layout import CHECKPOINT

# What a training checkpoint (last.pt) holds besides nothing else; init.pt and snapshots hold "emb".
TRAIN_KEYS = ("model", "optimizer", "rng", "state")


def to_bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def device_rng(device: torch.device) -> dict:
    """The CUDA RNG state of the run's device (cuda:1 is not the current device unless set), for a checkpoint's rng."""
    return {"cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {}


def restore_device_rng(rng: dict, device: torch.device) -> None:
    """device_rng's state back onto the run's device."""
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def load_last(run_dir: Path) -> dict:
    """A run's last checkpoint (checkpoints/last.pt), checked as `load` checks one."""
    return load(run_dir / CHECKPOINT, run_dir.name)


def load(path: Path, run: str, keys: tuple[str, ...] = TRAIN_KEYS) -> dict:
    """A checkpoint of run `run` holding `keys`; TiecliError in one line otherwise."""
    if not path.is_file():
        raise TiecliError(f"run {run}: no checkpoint at {str(path)!r}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise TiecliError(f"run {run}: checkpoint {path.name} is corrupt or unreadable ({unreadable(e)})") from None
    missing = [k for k in keys if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise TiecliError(f"run {run}: checkpoint {path.name} is not a tiecli checkpoint (no {missing[0]!r} entry)")
    if "state" in keys and not (isinstance(ckpt["state"], dict) and type(ckpt["state"].get("step")) is int):
        raise TiecliError(
            f"run {run}: checkpoint {path.name} is not a tiecli checkpoint (its 'state' has no step number)"
        )
    return ckpt


def unreadable(e: Exception) -> str:
    """Why torch.load could not read a file, without torch's advice: loading with weights_only=False
    would run whatever code a damaged or foreign file holds."""
    text = " ".join(str(e).split())
    if "WeightsUnpickler error:" in text:  # bytes that are no pickle of tensors (random bytes, another format)
        return "not a file of tensors: " + text.split("WeightsUnpickler error:", 1)[1].split(" Check the ")[0].strip()
    first = text.split(". ")[0].rstrip(".")  # a cut zip: "PytorchStreamReader failed reading zip archive: ..."
    return first[:200] or type(e).__name__


def check_step(ckpt: dict, step: str, kept: list[int], run: str) -> None:
    """--step STEP against the checkpoint loaded for it (RunReader.full_checkpoint): `latest`, or a
    step that run `run` has full weights at, last.pt's or a kept one's; TiecliError listing them otherwise."""
    saved = ckpt["state"]["step"]
    if step == "latest" or (step.isascii() and step.isdigit() and int(step) == saved):
        return
    steps = sorted({*kept, saved})
    if len(steps) == 1:
        raise TiecliError(
            f"--step {step!r}: run {run} has full weights only at step {saved}; choose latest or {saved} "
            "(train.keep_checkpoints=N keeps N more)"
        )
    raise TiecliError(
        f"--step {step!r}: run {run} has full weights at steps {', '.join(map(str, steps))}; "
        "choose latest or one of them"
    )


def load_weights(module: torch.nn.Module, state, run: str, what: str) -> None:
    """load_state_dict with every mismatch (missing, unexpected, wrong shape) as one line."""
    check_weights(module.state_dict(), state, run, what)
    module.load_state_dict(state)


def check_weights(own: dict, state, run: str, what: str) -> None:
    """TiecliError naming the first key of `state` that is missing, unexpected or of another shape than in `own`."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TiecliError(f"run {run}: {what} in its checkpoint are not a set of tensors")
    for key, tensor in own.items():
        if key not in state:
            raise TiecliError(
                f"run {run}: {what} in its checkpoint lack {key!r}: the checkpoint does not match config.yaml"
            )
        if state[key].shape != tensor.shape:
            raise TiecliError(
                f"run {run}: {key} is {tuple(state[key].shape)} in its checkpoint but {tuple(tensor.shape)} "
                "by config.yaml: the checkpoint does not match the config"
            )
    extra = sorted(state.keys() - own.keys())
    if extra:
        raise TiecliError(f"run {run}: {what} in its checkpoint have {extra[0]!r}, which config.yaml's model lacks")


def load_model(path: Path, config: GPTConfig, run: str) -> tuple[GPT, dict]:
    """A run's model (on CPU) with the weights of its last checkpoint, and the whole checkpoint."""
    ckpt = load(path, run)
    model = GPT(config)
    load_weights(model, ckpt["model"], run, "the model weights")
    return model, ckpt


def load_embeddings(path: Path, config: GPTConfig, run: str) -> Embeddings:
    """The token matrices saved in init.pt or a snapshot. Built on the meta device, so they draw no
    random numbers: during training that would shift the dropout RNG and break exact resume."""
    state = load(path, run, keys=("emb",))["emb"]
    with torch.device("meta"):
        emb = Embeddings(config)
    if not isinstance(state, dict) or state.keys() != emb.state_dict().keys():
        raise TiecliError(f"run {run}: the token matrices in {path.name} do not match config.yaml's tying mode")
    for key, tensor in emb.state_dict().items():
        if state[key].shape != tensor.shape:
            raise TiecliError(
                f"run {run}: {key} is {tuple(state[key].shape)} in {path.name} but {tuple(tensor.shape)} by config.yaml"
            )
    emb.load_state_dict(state, assign=True)
    return emb


def embeddings_of(ckpt: dict, config: GPTConfig, run: str) -> Embeddings:
    """The token matrices inside a training checkpoint's model weights (all of which must fit config.yaml's model)."""
    with torch.device("meta"):  # shapes only: no memory, no random numbers
        shapes = GPT(config).state_dict()
        emb = Embeddings(config)
    check_weights(shapes, ckpt["model"], run, "the model weights")
    state = {k.removeprefix("emb."): v for k, v in ckpt["model"].items() if k.startswith("emb.")}
    emb.load_state_dict(state, assign=True)
    return emb
