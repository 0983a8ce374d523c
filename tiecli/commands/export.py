# Used by `tiecli export RUN --to hf|safetensors OUT_DIR`.
"""A run's last checkpoint for other tools: a Hugging Face GPT2LMHeadModel folder, or plain safetensors.

tiecli's model is GPT-2's architecture, so the body maps name for name onto transformers'
GPT2LMHeadModel; its Conv1D layers store Linear weights transposed. The token matrices go by mode:
  tied                  wte, tie_word_embeddings=True (transformers stores it once and re-ties it on load)
  scaled                tied too: wte = W * input_scale, and the remaining factor logit_scale / input_scale
                        folded into the final LayerNorm's gain and bias, which feed nothing but the logits
  untied, untied_init,  wte = the effective input matrix, lm_head = the effective output matrix
  partial, hybrid       (Embeddings.input_matrix() / output_matrix(): partial's concatenations, hybrid's
                        wte + u v), tie_word_embeddings=False
  tied_then_untied      as tied before the switch (untie_at), as untied after it: the matrices it uses at that step
  tied_bias             refused: GPT-2's lm_head has no bias, and dropping lm_bias would change every logit
model.embedding_norm=true is refused too: GPT-2 has no norm after its embeddings.
The tokenizer becomes tokenizer.json (a byte-level BPE with tiktoken's ids and split pattern: GPT-2's
BPE for tokenizer=gpt2, the trained one for bpe, 256 byte tokens for bytes).

The export is built in a temporary folder beside OUT_DIR, reloaded with transformers and checked
against tiecli's own logits; only then is it renamed to OUT_DIR, so a failure leaves nothing behind.
"""

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from tiecli.config.schema import Config
from tiecli.data import tokenizer
from tiecli.errors import TiecliError
from tiecli.model import checkpoint
from tiecli.model.gpt import GPT, GPTConfig
from tiecli.run.layout import CHECKPOINT
from tiecli.run.reader import RunReader

TARGETS = ("hf", "safetensors")
# tiecli's nn.Linear layers that transformers' GPT-2 keeps as Conv1D (weight (in, out), the transpose)
CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")
MAX_LOGIT_DIFF = 1e-4  # fp32 exports match to ~1e-6; anything above this is a wrong mapping, not rounding
CHECK_SEED = 1234


def _needs(package: str, extra: str):
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise TiecliError(f"tiecli export needs {package}: pip install 'tiecli[{extra}]'") from None


# ---------------------------------------------------------------------------------------------
# weights


def check_gpt2(config: GPTConfig) -> None:
    if config.tying == "tied_bias":
        raise TiecliError(
            "tying mode tied_bias cannot be exported to GPT2LMHeadModel: its lm_head has no bias, so the "
            "per-token output bias would be lost and every logit would change; use --to safetensors"
        )
    if config.embedding_norm:
        raise TiecliError(
            "model.embedding_norm=true cannot be exported to GPT2LMHeadModel: GPT-2 has no norm after its "
            "embeddings, so every logit would change; use --to safetensors"
        )


@torch.no_grad()
def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's weights from a tiecli model (every mode but tied_bias); scales folded in."""
    emb = model.emb
    check_gpt2(model.config)
    state = {
        "transformer." + k: (v.T if CONV1D.fullmatch(k) else v).float().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("emb.")
    }
    w_in = emb.input_matrix().float() * emb.input_scale  # (V, C)
    state["transformer.wte.weight"] = w_in.contiguous()
    if emb.one_matrix:
        # tied and scaled: one matrix both ways. logits = LN(x) W^T s_out = (LN(x) s_out / s_in) (W s_in)^T,
        # and ln_f's output feeds only the logits, so s_out / s_in folds into its gain and bias.
        fold = emb.logit_scale / emb.input_scale
        for part in ("weight", "bias"):
            key = f"transformer.ln_f.{part}"
            if key in state:
                state[key] = state[key] * fold
    else:
        state["lm_head.weight"] = (emb.output_matrix().float() * emb.logit_scale).contiguous()
    return state


def gpt2_config(model: GPT, enc):
    """transformers' GPT2Config for this model: gelu_new is the tanh GELU tiecli uses, eps LayerNorm's 1e-5."""
    from transformers import GPT2Config

    c = model.config
    eot = enc._special_tokens.get(tokenizer.GPT2_EOT)  # only GPT-2's vocabulary has an end-of-text token
    return GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        activation_function="gelu_new",
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=model.emb.one_matrix,
        bos_token_id=eot,
        eos_token_id=eot,
    )


def hf_model(model: GPT, enc):
    """A GPT2LMHeadModel holding the model's weights; absent biases (model.bias=false) stay zero."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(gpt2_config(model, enc))
    state = gpt2_state_dict(model)
    with torch.no_grad():
        for name, p in hf.state_dict().items():
            if name in state:
                p.copy_(state.pop(name))
            elif name.endswith(".bias"):
                p.zero_()
            elif name != "lm_head.weight":  # tied: lm_head is wte
                raise AssertionError(f"no tiecli weight for {name}")
    if state:
        raise AssertionError(f"tiecli weights without a GPT-2 place: {sorted(state)}")
    return hf.eval()


# ---------------------------------------------------------------------------------------------
# tokenizer


def hf_tokenizer(enc):
    """The tiktoken Encoding as a transformers fast tokenizer with the same ids: a byte-level BPE whose
    merges are read off the ranks (as transformers' TikTokenConverter does), the same split pattern,
    and ignore_merges, since tiktoken takes a whole piece that is in the vocabulary as one token."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    ranks = enc._mergeable_ranks
    char = tokenizer._bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(char[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []  # (left, right, rank of left + right)
    for token, rank in ranks.items():
        splits = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges += [(left, right, rank) for left, right in sorted(splits, key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))]
    merges.sort(key=lambda m: m[2])
    tok = Tokenizer(BPE(vocab, [(text(a), text(b)) for a, b, _ in merges], fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(enc._pat_str), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = sorted(enc._special_tokens.items(), key=lambda kv: kv[1])
    if specials:
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s, _ in specials])
    eot = tokenizer.GPT2_EOT if tokenizer.GPT2_EOT in enc._special_tokens else None
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=eot, eos_token=eot, model_max_length=None, clean_up_tokenization_spaces=False
    )


def run_encoding(run_dir: Path, config: Config):
    """The run's tokenizer: gpt2 and bytes are fixed; bpe is the one trained on the run's training split (cached)."""
    if config.tokenizer.name != "bpe":
        return tokenizer.build(config.tokenizer.name, config.tokenizer.vocab_size, None, None)
    from tiecli.data.tokens import load_corpus

    corpus = load_corpus(config.data, config.tokenizer)
    RunReader(run_dir).check_corpus(corpus.key)
    return corpus.encoding


# ---------------------------------------------------------------------------------------------
# writing


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise TiecliError(f"OUT_DIR {str(out)!r} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise TiecliError(
            f"OUT_DIR {str(out)!r} exists and is not empty; choose a new folder, or add --force to replace it"
        )


@torch.no_grad()
def max_logit_diff(model: GPT, folder: Path) -> float:
    """Largest |logit difference| between tiecli's model and the export reloaded by transformers, on one block."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    c = model.config
    idx = torch.randint(c.vocab_size, (2, c.block_size), generator=torch.Generator().manual_seed(CHECK_SEED))
    return (hf(idx).logits - model(idx)).abs().max().item()


def write_hf(model: GPT, enc, folder: Path) -> dict:
    transformers = _needs("transformers", "hf")
    transformers.logging.set_verbosity_error()  # its progress bars and notes would bury the one line we print
    transformers.logging.disable_progress_bar()
    hf_model(model, enc).save_pretrained(folder)
    hf_tokenizer(enc).save_pretrained(folder)
    diff = max_logit_diff(model, folder)
    if not diff <= MAX_LOGIT_DIFF:
        raise TiecliError(
            f"the exported model's logits differ from tiecli's by {diff:.3g} (> {MAX_LOGIT_DIFF}); nothing written"
        )
    return {"max_logit_diff": diff}


def write_safetensors(model: GPT, run_config: dict, step: int, folder: Path) -> dict:
    """model.safetensors: tiecli's own state dict, with the run's config.yaml (as JSON) and step as metadata."""
    _needs("safetensors", "hf")
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": "tiecli", "tying": model.emb.mode, "step": str(step), "config": json.dumps(run_config)}
    save_file(state, folder / "model.safetensors", metadata=metadata)
    return {"tensors": len(state)}


def export_run(run_dir: Path, config: Config, to: str, out: Path, force: bool = False) -> dict:
    """Export the run's last checkpoint to `out`, built in a temporary folder and renamed into place."""
    check_out(out, force)
    if to == "hf":
        check_gpt2(config.model)
    model, ckpt = checkpoint.load_model(run_dir / CHECKPOINT, config.model, run_dir.name)
    model.eval()
    if to == "hf":
        enc = run_encoding(run_dir, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        if to == "hf":
            result = write_hf(model, enc, tmp)
        else:
            result = write_safetensors(model, RunReader(run_dir).config(), ckpt["state"]["step"], tmp)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700, safetensors 0600: give them the usual permissions
        for file in tmp.iterdir():
            file.chmod(0o666 & ~umask)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except Exception as e:
        if type(e).__name__ != "SafetensorError":  # safetensors' writer (also under save_pretrained): no OSError
            raise
        why = re.search(r"I/O error: (.*?) \(os error", str(e))
        reason = why.group(1) if why else (str(e).splitlines() or [""])[0][:160]
        raise TiecliError(f"cannot write {out}: {reason}; nothing was written") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    files = sorted(p.name for p in out.iterdir())
    return {
        "out": str(out),
        "to": to,
        "step": ckpt["state"]["step"],
        "tying": config.model.tying,
        "files": files,
        **result,
    }
