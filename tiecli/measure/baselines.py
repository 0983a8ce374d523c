# Used by `tiecli train` (summary.json corpus.baselines) and read back by `tiecli report` (the Context table).
"""Count-model baselines of a corpus: how well the validation split is predicted without a network.

A run whose validation perplexity sits near the unigram's has learnt token frequencies and little
else; one below the bigram's has learnt more than which token follows which. The report prints these
next to the runs so a reader sees how far past them training got.

  unigram  p(t) = (c(t) + 1) / (N + V)                    add-one smoothed counts of the training split
  bigram   p(t | s) = (c(s, t) + k) / (c(s) + k V)        add-k smoothed pair counts of the training split

Both are scored on every validation token after the first (each predicted from the one before), in
nats, perplexity and bits per UTF-8 byte, as tiecli's own evaluation scores a model. The bigram's k is
the best of K_GRID on the validation split itself: tuning on the scored split can only flatter the
baseline, so "the runs beat the bigram" stays a conservative statement.
"""

import json
import math

import numpy as np

from tiecli.data.corpus import cache_dir
from tiecli.data.tokens import Corpus
from tiecli.run.files import atomic_write

K_GRID = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)
# Counting more tokens than this gains nothing for a baseline and costs memory on corpora of gigabytes:
# beyond it, the counts come from the first MAX_TOKENS tokens of the training split.
MAX_TOKENS = 2**25


def _scores(nll: np.ndarray, n_bytes: int) -> dict:
    loss = float(nll.mean())
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": float(nll.sum()) / math.log(2) / max(1, n_bytes),
    }


def bigram_nll(train: np.ndarray, val: np.ndarray, vocab_size: int, grid: tuple[float, ...]) -> dict[float, np.ndarray]:
    """-log p(val[i] | val[i-1]) for i >= 1 under add-k smoothed pair counts of `train`, for each k of `grid`."""
    V = vocab_size
    pairs, counts = np.unique(train[:-1].astype(np.int64) * V + train[1:], return_counts=True)  # sorted pair keys
    prev_counts = np.bincount(train[:-1], minlength=V).astype(np.float64)[val[:-1]]  # c(s): s followed by anything
    query = val[:-1].astype(np.int64) * V + val[1:]
    at = np.minimum(np.searchsorted(pairs, query), len(pairs) - 1)
    seen = np.where(pairs[at] == query, counts[at], 0).astype(np.float64)
    return {k: -np.log((seen + k) / (prev_counts + k * V)) for k in grid}


def of_corpus(corpus: Corpus) -> dict:
    """Unigram and bigram scores of the validation split, with what they were estimated on; cached
    under the corpus's key, which changes with the text and the tokenizer."""
    path = cache_dir() / "baselines" / f"{corpus.key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    scores = score_corpus(corpus)
    atomic_write(path, json.dumps(scores, indent=1))
    return scores


def score_corpus(corpus: Corpus) -> dict:
    V = corpus.encoding.n_vocab
    train, val = corpus.tokens["train"][:MAX_TOKENS], corpus.tokens["val"]
    n_bytes = int(corpus.token_bytes[val[1:]].sum())
    unigram_p = (np.bincount(train, minlength=V) + 1.0) / (len(train) + V)
    by_k = bigram_nll(train, val, V, K_GRID)
    k = min(by_k, key=lambda key: float(by_k[key].mean()))
    return {
        "split": "val",
        "tokens": int(len(val) - 1),
        "counted_train_tokens": int(len(train)),
        "unigram": _scores(-np.log(unigram_p[val[1:]]), n_bytes),
        "bigram": {**_scores(by_k[k], n_bytes), "k": k},
    }
