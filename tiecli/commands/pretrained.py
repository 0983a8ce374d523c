# Used by `tiecli geometry --model PATH`: the token matrices and vocabulary of a pretrained model.
"""Read only what the geometry needs from a pretrained model: its input embedding, its output matrix
(or the fact that it is tied), the constant scales its architecture applies to them, and the token strings.

Two formats:
- GGUF (llama.cpp), read with the `gguf` package: the file is memory-mapped, and only
  `token_embd.weight` and `output.weight` are dequantized to float32.
- A Hugging Face folder: `config.json` and `*.safetensors` (one file, or shards listed in
  `model.safetensors.index.json`), read with `safetensors.safe_open`, which loads one named tensor
  and leaves the others on disk; the vocabulary from `tokenizer.json` (else `vocab.json`).

Token strings are turned into text with the vocabulary's own word-boundary marker read as a space:
GPT-2's byte-level `Ġ` (every character stands for one byte) or SentencePiece's `▁`. Then the
suffix rules and pairs files of tiecli/data/pairs.py see " walk" / " walked" as they do for a run.

Token frequencies are not in these files, so every ordinary token counts once: the norm-frequency
correlation is n/a (None), and control, unknown and unused tokens (padding, <unused0>, ...) are left
out, as a run leaves out the tokens that never occur in its training split.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tiecli.data import tokenizer
from tiecli.data.pairs import pairs_file, read_pairs_file
from tiecli.errors import TiecliError
from tiecli.measure import geometry
from tiecli.report.reference import PRETRAINED_FILE, label
from tiecli.run.files import read_json, write_json

GGUF_MAGIC = b"GGUF"
GGUF_INPUT, GGUF_OUTPUT = "token_embd.weight", "output.weight"
GGUF_LEFT_OUT = (2, 3, 5)  # tokenizer.ggml.token_type: unknown, control, unused (1 normal, 4 user-defined, 6 byte)
# Architectures that multiply the input embedding by sqrt(n_embd) (llama.cpp's and transformers' Gemma code).
SQRT_INPUT_SCALE = ("gemma", "gemma2", "gemma3", "gemma3n", "gemma3_text", "gemma-embedding")
# Tensor names of the token matrices in Hugging Face checkpoints, by suffix: GPT-2, Llama/Gemma/Qwen/..., BLOOM, GPT-NeoX.
HF_INPUT = ("wte.weight", "embed_tokens.weight", "word_embeddings.weight", "embed_in.weight", "tok_embeddings.weight")
HF_OUTPUT = ("lm_head.weight", "embed_out.weight")
BYTE_LEVEL, SENTENCEPIECE = "Ġ", "▁"
FORMAT = 1


@dataclass
class Pretrained:
    """A pretrained model's token matrices, as geometry.measure() takes them."""

    name: str  # the file's or folder's name: "SmolLM2-135M-Instruct.Q4_1"
    path: str
    source: str  # "gguf" or "safetensors"
    architecture: str
    w_in: torch.Tensor  # (V, C) float32, scale excluded (as Embeddings.input_matrix())
    w_out: torch.Tensor  # (V, C) float32, the same object as w_in when tied
    input_scale: float  # inputs are w_in * input_scale
    logit_scale: float  # logits are h @ w_out.T * logit_scale
    tokens: list[str | None]  # (V,) each token's text with the word-boundary marker as a space; None when unknown
    left_out: np.ndarray  # (V,) bool: control / unknown / unused tokens and rows without a token
    marker: str | None  # BYTE_LEVEL, SENTENCEPIECE or None (no vocabulary, or neither marker)
    stored_as: str  # the token matrix's stored type: Q8_0, F16, BF16, ...

    @property
    def tied(self) -> bool:
        return self.w_in is self.w_out


def read(path: Path) -> Pretrained:
    """A GGUF file or a Hugging Face safetensors folder; TiecliError (one line) for anything else."""
    if path.is_dir():
        return read_hf(path)
    if not path.is_file():
        raise TiecliError(f"--model {str(path)!r} does not exist; give a .gguf file or a Hugging Face model folder")
    return read_gguf(path)


# ---------------------------------------------------------------------------------------------
# vocabulary text


def _marker(strings: list[str | None]) -> str | None:
    """The word-boundary marker most tokens start with: Ġ (byte-level BPE) or ▁ (SentencePiece)."""
    starts = {m: sum(1 for s in strings if s and s.startswith(m)) for m in (BYTE_LEVEL, SENTENCEPIECE)}
    best = max(starts, key=lambda m: starts[m])
    return best if starts[best] > 0.01 * len(strings) else None


def token_text(strings: list[str | None], marker: str | None) -> list[str | None]:
    """Vocabulary strings as text: byte-level strings decoded to UTF-8 (None when a token is part of
    a character), SentencePiece's ▁ read as a space."""
    if marker == SENTENCEPIECE:
        return [s.replace(SENTENCEPIECE, " ") if s is not None else None for s in strings]
    if marker != BYTE_LEVEL:
        return list(strings)
    byte_of = {c: b for b, c in tokenizer._bytes_to_unicode().items()}
    out: list[str | None] = []
    for s in strings:
        try:
            out.append(bytes(byte_of[c] for c in s).decode("utf-8") if s is not None else None)
        except (KeyError, UnicodeDecodeError):  # a special token's own characters, or part of a character
            out.append(None)
    return out


# ---------------------------------------------------------------------------------------------
# GGUF


def _gguf_module():
    try:
        import gguf
    except ImportError:
        raise TiecliError("reading GGUF files needs the gguf package: pip install 'tiecli[gguf]'") from None
    return gguf


def _open_gguf(path: Path):
    gguf = _gguf_module()
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise TiecliError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # gguf raises ValueError, IndexError, struct errors... for a cut or damaged file
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise TiecliError(f"{str(path)!r} is truncated or corrupt: gguf cannot parse it ({reason})") from None


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return field.contents() if field is not None else default


def _dequantize(path: Path, tensor) -> torch.Tensor:
    """A GGUF tensor as (rows, columns) float32; one line when the file is cut short or the type is unknown."""
    gguf = _gguf_module()
    if tensor.data.nbytes != tensor.n_bytes:  # GGUFReader already refuses most cut files; this is the last check
        raise TiecliError(f"{str(path)!r} is truncated: {tensor.name} is cut short")
    try:
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        known = ("F32", "F16", *sorted(t.name for t in gguf.quants._type_traits))
        raise TiecliError(
            f"{str(path)!r}: {tensor.name} is stored as {tensor.tensor_type.name}, which gguf "
            f"{_version('gguf')} cannot dequantize (it can: {', '.join(known)})"
        ) from None
    # a copy: F32 and F16 come back as views of the read-only memory map
    return torch.from_numpy(np.array(w, dtype=np.float32)).reshape(int(tensor.shape[1]), -1)  # (V, C)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def read_gguf(path: Path) -> Pretrained:
    reader = _open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    if GGUF_INPUT not in tensors:
        raise TiecliError(f"{str(path)!r} has no token embedding ({GGUF_INPUT}); it holds {len(tensors)} other tensors")
    arch = str(_field(reader, "general.architecture", "unknown"))
    w_in = _dequantize(path, tensors[GGUF_INPUT])
    w_out = _dequantize(path, tensors[GGUF_OUTPUT]) if GGUF_OUTPUT in tensors else w_in  # no output.weight: tied
    strings = list(_field(reader, "tokenizer.ggml.tokens", []))
    V = w_in.shape[0]
    left_out = np.zeros(V, dtype=bool)  # without a vocabulary every row counts
    if strings:  # with one, rows past its end have no token
        types = np.asarray(_field(reader, "tokenizer.ggml.token_type", [1] * len(strings)))[:V]
        left_out[:] = True
        left_out[: len(types)] = np.isin(types, GGUF_LEFT_OUT)
    marker = {"gpt2": BYTE_LEVEL, "llama": SENTENCEPIECE}.get(str(_field(reader, "tokenizer.ggml.model")))
    marker = marker or _marker(strings)
    texts = token_text(strings[:V], marker) + [None] * (V - len(strings))
    return Pretrained(
        name=path.name.removesuffix(".gguf"),
        path=str(path),
        source="gguf",
        architecture=arch,
        w_in=w_in,
        w_out=w_out,
        input_scale=math.sqrt(w_in.shape[1]) if arch in SQRT_INPUT_SCALE else 1.0,
        logit_scale=float(_field(reader, f"{arch}.logit_scale", 1.0)),
        tokens=texts,
        left_out=left_out,
        marker=marker,
        stored_as=tensors[GGUF_INPUT].tensor_type.name,
    )


# ---------------------------------------------------------------------------------------------
# Hugging Face safetensors folders


def _safetensors_index(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (from the shard index, else each file's header)."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise TiecliError("reading safetensors needs the safetensors package: pip install 'tiecli[hf]'") from None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, repr(str(folder)))
        if not isinstance(weight_map, dict) or not isinstance(weight_map.get("weight_map"), dict):
            raise TiecliError(f"{str(index)!r} has no weight_map")
        return {name: folder / file for name, file in weight_map["weight_map"].items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:6]) or "nothing"
        raise TiecliError(
            f"{str(folder)!r} holds no *.safetensors files (found: {found}); tiecli reads a GGUF file "
            "or a Hugging Face folder saved with safetensors"
        )
    names = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                names.update(dict.fromkeys(f.keys(), file))
        except Exception as e:  # SafetensorError for a cut or foreign file
            raise TiecliError(f"{str(file)!r} is truncated or not a safetensors file ({str(e)[:160]})") from None
    return names


def _tensor(names: dict[str, Path], name: str) -> tuple[torch.Tensor, str]:
    """One tensor as float32, read alone from its file, and its stored dtype."""
    from safetensors import safe_open

    try:
        with safe_open(names[name], framework="pt") as f:
            t = f.get_tensor(name)
    except Exception as e:
        raise TiecliError(f"cannot read {name} from {str(names[name])!r} ({str(e)[:160]})") from None
    return t.float(), str(t.dtype).removeprefix("torch.")


def _find(names: dict[str, Path], suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        for name in names:
            if name == suffix or name.endswith("." + suffix):
                return name
    return None


def _vocab_pieces(folder: Path) -> tuple[list[tuple[str, int]], list[int]]:
    """(token string, id) pairs and the special tokens' ids, from tokenizer.json (BPE or Unigram) or vocab.json."""
    if (folder / "tokenizer.json").is_file():
        tok = read_json(folder / "tokenizer.json", repr(str(folder)))
        tok = tok if isinstance(tok, dict) else {}
        vocab = tok.get("model", {}).get("vocab", {})
        pieces = list(vocab.items()) if isinstance(vocab, dict) else [(p[0], i) for i, p in enumerate(vocab)]
        added = tok.get("added_tokens", [])
        return pieces + [(a["content"], a["id"]) for a in added], [a["id"] for a in added if a.get("special")]
    if (folder / "vocab.json").is_file():
        vocab = read_json(folder / "vocab.json", repr(str(folder)))
        return (list(vocab.items()) if isinstance(vocab, dict) else []), []
    return [], []


def _hf_vocabulary(folder: Path, V: int) -> tuple[list[str | None], np.ndarray]:
    """(V,) token strings (all None without a vocabulary file) and (V,) bool special tokens."""
    pieces, specials = _vocab_pieces(folder)
    strings: list[str | None] = [None] * V
    for piece, i in pieces:
        if 0 <= i < V:
            strings[i] = piece
    special = np.zeros(V, dtype=bool)
    special[[i for i in specials if 0 <= i < V]] = True
    return strings, special


def _config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise TiecliError(
            f"{str(folder)!r} has no config.json; a Hugging Face model folder holds config.json and *.safetensors"
        )
    cfg = read_json(path, repr(str(folder)))
    if not isinstance(cfg, dict):
        raise TiecliError(f"{str(path)!r} is not a JSON object")
    return {**cfg, **cfg.get("text_config", {})}  # multimodal models (Gemma 3 4B+) nest the language model's


def read_hf(folder: Path) -> Pretrained:
    cfg = _config(folder)
    names = _safetensors_index(folder)
    name_in, name_out = _find(names, HF_INPUT), _find(names, HF_OUTPUT)
    if name_in is None:
        raise TiecliError(f"{str(folder)!r} has no token embedding (none of its tensors ends in {', '.join(HF_INPUT)})")
    w_in, stored_as = _tensor(names, name_in)
    # transformers ties when the config says so (and a tied save_pretrained stores no lm_head at all)
    tied = name_out is None or cfg.get("tie_word_embeddings") is True
    w_out = w_in if tied or name_out is None else _tensor(names, name_out)[0]
    V, C = w_in.shape
    strings, special = _hf_vocabulary(folder, V)
    marker = _marker(strings)
    arch = str(cfg.get("model_type", "unknown"))
    return Pretrained(
        name=folder.resolve().name,
        path=str(folder),
        source="safetensors",
        architecture=arch,
        w_in=w_in,
        w_out=w_out,
        input_scale=math.sqrt(C) if arch in SQRT_INPUT_SCALE else 1.0,
        logit_scale=float(cfg.get("logit_scale") or 1.0),
        tokens=token_text(strings, marker),
        left_out=special | np.array([s is None for s in strings]) if any(strings) else special,
        marker=marker,
        stored_as=stored_as,
    )


# ---------------------------------------------------------------------------------------------
# the geometry pass


def model_pairs(model: Pretrained, pairs_path: Path | None) -> tuple[list[tuple[int, int]], dict]:
    """Related-form pairs: from a pairs file (each word looked up as one vocabulary token), else the shipped
    English pairs, as a run's default diag.pairs=en; none without a vocabulary."""
    if not any(model.tokens):
        return [], {"source": "none: the model has no vocabulary file", "found": 0}
    index: dict[str, int] = {}
    for i, s in enumerate(model.tokens):
        if s is not None and not model.left_out[i]:
            index.setdefault(s, i)
    source = str(pairs_path) if pairs_path else "en"
    pairs, skipped = read_pairs_file(pairs_file(source), lambda s: [index[s]] if s in index else [])
    return pairs, {"source": source, "found": len(pairs), "skipped_lines": skipped}


def measure_model(model: Pretrained, pairs_path: Path | None = None, seed: int = 0) -> dict:
    """The geometry entry of a pretrained model: geometry.measure() over its ordinary tokens, each counted once."""
    counts = (~model.left_out).astype(np.int64)  # (V,) frequencies unknown: every ordinary token once
    pairs, pairs_info = model_pairs(model, pairs_path)
    start = time.perf_counter()
    measured = geometry.measure(model.w_in, model.w_out, counts, np.zeros_like(counts), pairs=pairs, seed=seed)
    V, C = model.w_in.shape
    info = {
        "name": model.name,
        "path": model.path,
        "source": model.source,
        "architecture": model.architecture,
        "vocab_size": V,
        "n_embd": C,
        "tied": model.tied,
        "input_scale": model.input_scale,
        "logit_scale": model.logit_scale,
        "stored_as": model.stored_as,
        "word_boundary": model.marker,
        "left_out_tokens": int(model.left_out.sum()),
        "frequencies": "n/a: the model files hold no token frequencies; every ordinary token counts once",
        "measure_s": round(time.perf_counter() - start, 2),
    }
    return {"model": info, **measured, "pairs": pairs_info}


def write(out: Path, entry: dict) -> Path:
    """DIR/pretrained.json, atomically; `tiecli report` shows it as a reference row."""
    path = out / PRETRAINED_FILE
    write_json(path, {"format": FORMAT, **entry})
    return path


def summary_lines(entry: dict) -> list[str]:
    model = entry["model"]
    scales = f"input x {model['input_scale']:.4g}, logits x {model['logit_scale']:.4g}"
    return [
        f"{label(entry)} ({model['source']}, {model['architecture']}, token matrix {model['stored_as']}); "
        f"vocab {model['vocab_size']:,} x {model['n_embd']}; scales: {scales}",
        f"measured {entry['n_tokens']:,} tokens ({model['left_out_tokens']:,} control/unused left out) "
        f"in {model['read_s']:.1f} s reading + {model['measure_s']:.1f} s measuring; word boundary {model['word_boundary']!r}",
        "norm vs log frequency: n/a (the files hold no token frequencies)",
    ]


def geometry_of_model(path: Path, pairs_path: Path | None, out: Path | None) -> dict:
    """`tiecli geometry --model PATH`: read, measure, and with out write DIR/pretrained.json."""
    # a bad pairs file or --out fails before the minute a large model takes to read
    if pairs_path is not None:
        if not pairs_file(str(pairs_path)).is_file():
            raise TiecliError(f"--pairs {str(pairs_path)!r} does not exist")
    if out is not None and out.exists() and not out.is_dir():
        raise TiecliError(f"--out {str(out)!r} is a file, not a folder")
    start = time.perf_counter()
    model = read(path)
    read_s = time.perf_counter() - start
    entry = measure_model(model, pairs_path)
    entry["model"]["read_s"] = round(read_s, 2)
    if out is not None:
        write(out, entry)
    return entry
