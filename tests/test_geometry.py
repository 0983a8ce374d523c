"""Known answers for tiecli.measure.geometry: hand-built matrices whose geometry is known in advance."""

import json
import math

import numpy as np
import pytest
import torch

from tiecli.data.pairs import english_form_pairs, read_pairs_file
from tiecli.errors import TiecliError
from tiecli.measure import geometry, rows

N, C = 2000, 32  # small enough that every test runs in milliseconds


def gaussian(seed, n=N, c=C, scale=1.0):
    return torch.randn(n, c, generator=torch.Generator().manual_seed(seed)) * scale


def ones(n=N):
    return np.ones(n, dtype=np.int64)


# -----------------------------------------------------------------------------
# anisotropy, isotropy, row norms


def test_isotropic_gaussian_reads_isotropic():
    W = gaussian(0, scale=0.02)  # the models' init scale
    # On unit rows log Z(c) ~ log n + c.mean_u + lambda_c / (2n), with |mean_u| ~ 1/sqrt(N) = 0.022
    # and lambda_c / n within (1 +- sqrt(C/N))^2 / C: 1 - I <~ 2 * 0.022 + 0.008 ~ 0.05.
    assert geometry.isotropy(W, ones())["isotropy"] > 0.95
    a = geometry.anisotropy(W, ones(), seed=0)
    # 10k pair cosines with sd 1/sqrt(C) = 0.18: standard error 0.002, so 0.01 is 5 sigma
    assert abs(a["anisotropy"]) < 0.01
    # each row is 1/N of the mean row: E cos ~ (C/N) / (sqrt(C) sqrt(C/N)) = sqrt(1/N) ~ 0.022
    assert abs(a["cosine_to_mean"]) < 0.05


def test_isotropy_does_not_depend_on_scale():
    # On raw rows this cloud read 0.998 at x0.02 and 0.0008 at x5: the scale, not the shape.
    W = gaussian(1)
    reference = geometry.isotropy(W, ones())["isotropy"]
    for scale in (0.02, 5.0, 1e4):  # 1e4: exp(c . w) would overflow float64 on raw rows
        assert geometry.isotropy(W * scale, ones())["isotropy"] == pytest.approx(reference, rel=1e-6)
    # rows of mixed norms: only directions count
    norms = torch.rand(N, 1, generator=torch.Generator().manual_seed(1)) * 100
    assert geometry.isotropy(W * norms, ones())["isotropy"] == pytest.approx(reference, rel=1e-6)


def test_common_vector_makes_a_narrow_cone():
    common = torch.zeros(C)
    common[3] = 100.0
    W = gaussian(2) + common  # (N, C) every row ~ the same direction
    a = geometry.anisotropy(W, ones(), seed=0)
    assert a["anisotropy"] > 0.99  # cos ~ 100^2 / (100^2 + C)
    assert a["cosine_to_mean"] > 0.99
    # unit rows ~ e_3: Z(e_3) ~ N e, Z(-e_3) ~ N / e, the floor e^-2 of unit-row isotropy
    assert geometry.isotropy(W, ones())["isotropy"] == pytest.approx(math.exp(-2), rel=0.01)


def test_rank_one_mixed_signs_has_one_principal_component():
    # Rows +-a_i v: random-pair cosines are +-1 half the time each and average to ~0, so
    # anisotropy misses it; all variance lies along v.
    g = torch.Generator().manual_seed(3)
    a = torch.randn(N, generator=g)
    W = torch.outer(a, torch.randn(C, generator=g))
    r = geometry.anisotropy(W, ones(), seed=0)
    assert abs(r["anisotropy"]) < 0.05
    assert r["top_pc_share"] == pytest.approx(1.0, abs=1e-6)
    # Z(v) = sum exp(+-1) = N (p e + (1 - p) / e) against Z(c) = N for c orthogonal to v
    p = (a > 0).double().mean().item()
    lower = min(p * math.e + (1 - p) / math.e, p / math.e + (1 - p) * math.e)
    upper = max(p * math.e + (1 - p) / math.e, p / math.e + (1 - p) * math.e)
    assert geometry.isotropy(W, ones())["isotropy"] == pytest.approx(min(lower, 1) / upper, rel=1e-4)


def test_top_pc_share_of_isotropic_cloud_is_about_one_over_c():
    share = geometry.anisotropy(gaussian(4, scale=0.02), ones())["top_pc_share"]
    # Marchenko-Pastur: the top eigenvalue is (1 + sqrt(C/N))^2 = 1.27 times the mean
    assert 1 / C < share < 1.5 / C


def test_rows_in_one_direction_have_no_principal_component():
    r = geometry.anisotropy(torch.ones(10, C) * torch.arange(1.0, 11.0)[:, None], ones(10))
    assert r["anisotropy"] == pytest.approx(1.0) and r["top_pc_share"] is None  # no variance to share
    assert geometry.isotropy(torch.zeros(10, C), ones(10))["isotropy"] is None


def test_spearman_hand_computed_with_ties():
    # ranks x = [1, 2.5, 2.5, 4], y = [1, 3, 2, 4]; centred x = [-1.5, 0, 0, 1.5],
    # y = [-1.5, .5, -.5, 1.5]: rho = 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    assert geometry.spearman([1, 2, 2, 3], [10, 30, 20, 40]) == pytest.approx(math.sqrt(0.9))
    assert geometry.spearman([3, 1, 2], [30, 10, 20]) == pytest.approx(1.0)
    assert geometry.spearman([1, 1, 1], [1, 2, 3]) is None  # constant side: undefined


def test_spearman_did_not_move_when_scipy_took_over():
    """Values of the hand-written average-rank Spearman that geometry.spearman was before it called
    scipy.stats.spearmanr, computed once with that code on these inputs (ties on both sides); scipy sums
    in another order, so the last digit may differ."""
    x, y = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4]
    assert geometry.spearman(x, y) == pytest.approx(0.1384567651467695, rel=1e-12, abs=0)
    assert geometry.spearman(np.array([0.5, 0.25, 0.125, 0.0625]), [7, 7, 3, 1]) == pytest.approx(
        0.9486832980505138, rel=1e-12, abs=0
    )
    assert geometry.spearman([2, 2], [1, 5]) is None and geometry.spearman([1, 5], [3, 3]) is None


def test_row_norms():
    W = torch.tensor([[3.0, 4.0], [0.0, 1.0], [2.0, 0.0], [0.0, 4.0]])  # norms 5, 1, 2, 4
    counts = np.array([9, 1, 1, 5])
    r = geometry.row_norms(W, counts)
    assert r["n_tokens"] == 4
    assert (r["norm_min"], r["norm_max"], r["norm_mean"]) == (1.0, 5.0, 3.0)
    assert r["norm_std"] == pytest.approx(math.sqrt(2.5))  # population std of 5, 1, 2, 4
    assert r["norm_freq_spearman"] == pytest.approx(geometry.spearman([5, 1, 2, 4], counts))


# -----------------------------------------------------------------------------
# spectrum


def test_rank_one_matrix():
    g = torch.Generator().manual_seed(4)
    W = torch.outer(torch.randn(N, generator=g), torch.randn(C, generator=g))  # (N, C) rank 1
    s = geometry.spectrum(W, ones())
    # float32 rounding of the outer product leaves singular values ~1e-7 s_1
    assert s["effective_rank"] == pytest.approx(1.0, abs=1e-4)
    assert s["stable_rank"] == pytest.approx(1.0, abs=1e-9)
    assert s["top_share"] == pytest.approx(1.0, abs=1e-5)
    assert s["singular_values"][0] == pytest.approx(torch.linalg.matrix_norm(W, 2).item(), rel=1e-6)


def test_orthogonal_matrix_has_full_effective_rank():
    Q, _ = torch.linalg.qr(gaussian(5, n=C))  # (C, C) orthogonal: every singular value is 1
    s = geometry.spectrum(Q * 3.0, ones(C))
    assert s["effective_rank"] == pytest.approx(C)
    assert s["stable_rank"] == pytest.approx(C)
    assert s["top_share"] == pytest.approx(1 / C)
    assert s["singular_values"] == pytest.approx([3.0] * C)


def test_singular_values_are_capped_and_descending():
    s = geometry.spectrum(gaussian(6), ones(), max_values=10)["singular_values"]
    assert len(s) == 10 and s == sorted(s, reverse=True)
    assert len(geometry.spectrum(gaussian(6, n=5), ones(5))["singular_values"]) == 5  # min(n, C)


def test_zero_matrix_has_no_spectrum_shape():
    s = geometry.spectrum(torch.zeros(10, C), ones(10))
    assert s["effective_rank"] is None and s["stable_rank"] is None and s["top_share"] is None


# -----------------------------------------------------------------------------
# drift


def test_drift():
    W0 = gaussian(7)
    buckets = np.zeros(N, dtype=np.int8)
    buckets[N // 2 :] = 2  # no mid rows
    same = geometry.drift(W0.clone(), W0, ones(), buckets)
    assert same["drift"] == 0.0 and same["drift_frequent"] == 0.0 and same["drift_rare"] == 0.0
    double = geometry.drift(2 * W0, W0, ones(), buckets)
    assert double["drift"] == pytest.approx(1.0)
    assert double["drift_frequent"] == pytest.approx(1.0)
    assert double["drift_rare"] == pytest.approx(1.0)
    assert double["drift_mid"] is None  # empty bucket


def test_drift_per_bucket_and_zero_init():
    W0 = torch.ones(4, 2)
    W = torch.tensor([[1.0, 1.0], [1.0, 1.0], [4.0, 1.0], [1.0, 1.0]])  # only row 2 moved, by 3
    r = geometry.drift(W, W0, ones(4), np.array([0, 1, 1, 2], dtype=np.int8))
    assert r["drift"] == pytest.approx(3 / math.sqrt(8))
    assert (r["drift_frequent"], r["drift_rare"]) == (0.0, 0.0)
    assert r["drift_mid"] == pytest.approx(3 / 2)
    zero_init = geometry.drift(W, torch.zeros(4, 2), ones(4), np.zeros(4, dtype=np.int8))
    assert zero_init["drift"] is None  # relative to nothing: undefined, not infinite


# -----------------------------------------------------------------------------
# agreement


def test_identical_spaces_agree_fully():
    W = gaussian(8)
    a = geometry.agreement(W, W.clone(), ones(), k=10, n_queries=300, seed=0)
    assert a["row_cosine"] == pytest.approx(1.0)
    assert a["knn_overlap"] == 1.0
    assert a["cka"] == pytest.approx(1.0)
    assert a["distance"] == 0.0
    assert (a["knn_k"], a["knn_queries"], a["n_tokens"]) == (10, 300, N)


def test_distance_between_the_spaces():
    W, counts = gaussian(8), ones()
    # |W - cW|_F / |W|_F = |1 - c|, whatever the rows
    assert geometry.agreement(W, 2 * W, counts)["distance"] == pytest.approx(1.0)
    assert geometry.agreement(W, -W, counts)["distance"] == pytest.approx(2.0)
    assert geometry.agreement(W, torch.zeros_like(W), counts)["distance"] == pytest.approx(1.0)
    # independent equal-scale matrices: |W_in - W_out|^2 ~ 2 |W_in|^2
    assert geometry.agreement(W, gaussian(9), counts)["distance"] == pytest.approx(math.sqrt(2), rel=0.02)
    W_out = W.clone()
    counts[:10], W_out[:10] = 0, 1e3  # never-seen rows do not count
    assert geometry.agreement(W, W_out, counts)["distance"] == 0.0
    assert geometry.agreement(torch.zeros_like(W), W, counts)["distance"] is None


def test_a_zero_matrix_agrees_in_nothing_but_distance():
    """The field's zero-initialised output matrix at step 0: cosines, neighbours and CKA (0/0) are undefined, so
    None, not NaN or a number a mean over seeds would take in; the distance to it is still |W_in|/|W_in| = 1."""
    W = gaussian(8)
    a = geometry.agreement(W, torch.zeros_like(W), ones(), k=10, n_queries=300, seed=0)
    assert a["distance"] == pytest.approx(1.0)
    assert [a[key] for key in ("row_cosine", "knn_overlap", "cka")] == [None, None, None]
    assert geometry.agreement(torch.zeros_like(W), W, ones())["cka"] is None


def test_cka_ignores_rotation_and_sees_independence():
    W = gaussian(9)
    Q, _ = torch.linalg.qr(gaussian(10, n=C))  # (C, C) orthogonal
    rotated = geometry.agreement(W, W @ Q, ones(), n_queries=100, seed=0)
    assert rotated["cka"] == pytest.approx(1.0, abs=1e-6)
    assert rotated["knn_overlap"] == pytest.approx(1.0, abs=0.01)  # cosines ignore rotation
    assert abs(rotated["row_cosine"]) < 0.5  # but the rows themselves moved
    independent = geometry.agreement(W, gaussian(11), ones(), n_queries=100, seed=0)
    assert independent["cka"] < 0.05  # E[CKA] ~ C / N = 0.016 for independent Gaussians
    assert independent["knn_overlap"] < 0.05  # chance: k / N


# -----------------------------------------------------------------------------
# related word forms


def pair_matrix():
    """Rows 0-5 hand-built (two pairs with cosine exactly 0.5), rows 6+ random."""
    W = gaussian(12, n=200, c=4)
    W[:6] = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.5, math.sqrt(3) / 2, 0.0, 0.0],  # cos(row 0, row 1) = 0.5
            [0.0, 0.0, 2.0, 0.0],
            [0.0, 0.0, 3.0, 3.0 * math.sqrt(3)],  # cos(row 2, row 3) = 0.5, other lengths
            [0.0, 0.0, 0.0, 1.0],
            [0.0, 1.0, 0.0, 0.0],
        ]
    )
    return W


def test_pair_contrast_known_cosines():
    W, counts = pair_matrix(), ones(200)
    counts[5] = 0
    pairs = [(0, 1), (2, 3), (4, 5), (0, 0), (0, 1)]
    r = geometry.pair_contrast(W, pairs, counts, n_random=5000, seed=3)
    # (4, 5) dropped: token 5 never occurs; (0, 0) says nothing; (0, 1) counts once
    assert r["forms_n_pairs"] == 2
    assert r["forms_cosine"] == pytest.approx(0.5)
    random = geometry.anisotropy(W, counts, n_pairs=5000, seed=3)["anisotropy"]
    assert r["forms_random_cosine"] == pytest.approx(random)  # same sampler, same seed
    assert r["forms_contrast"] == pytest.approx(0.5 - r["forms_matched_cosine"])


def frequency_classes(group_size):
    """(10 * group_size,) class of each token and its count: class g is seen 2^g times, so the
    deciles of log count are exactly the classes."""
    group = np.arange(10 * group_size) // group_size
    return group, 2**group


def lengths(n):
    return torch.rand(n, 1, generator=torch.Generator().manual_seed(0)) + 0.5  # (n, 1) in [0.5, 1.5)


def test_matched_baseline_draws_from_each_tokens_decile():
    group, counts = frequency_classes(20)
    W = torch.nn.functional.one_hot(torch.from_numpy(group), 10).float() * lengths(200)  # row i along e_group(i)
    # One pair inside a frequency class (cosine 1), one across two classes (cosine 0): a matched
    # baseline draws same-class tokens for the first (cosine 1) and two-class tokens for the second
    # (cosine 0), so it reads 0.5 like the pairs themselves, and the contrast is 0. Uniform random
    # pairs share a class 19 / 199 of the time: they read ~0.1 and would credit the pairs with 0.4.
    r = geometry.pair_contrast(W, [(0, 1), (20, 45)], counts, n_random=2000, seed=0)
    assert r["forms_cosine"] == pytest.approx(0.5)
    assert r["forms_matched_cosine"] == pytest.approx(0.5)
    assert r["forms_contrast"] == pytest.approx(0.0, abs=1e-6)
    assert r["forms_random_cosine"] == pytest.approx(19 / 199, abs=0.02)


def test_matched_baseline_never_pairs_a_token_with_itself():
    _, counts = frequency_classes(2)
    W = torch.eye(20) * lengths(20)  # every class holds 2 orthogonal tokens: a self-pair would read 1
    r = geometry.pair_contrast(W, [(0, 1), (4, 5)], counts, n_random=1000, seed=0)
    assert r["forms_matched_cosine"] == 0.0 and r["forms_contrast"] == 0.0


def test_frequency_alone_gives_no_contrast():
    # Frequent tokens share a direction (as output rows of frequent tokens do); the "related" pairs
    # are frequent tokens paired at random, so they are related only by being frequent.
    rng = np.random.default_rng(0)
    counts = np.r_[rng.integers(1000, 5000, N // 2), rng.integers(1, 10, N // 2)]
    W = gaussian(14)
    W[: N // 2, 0] += 1.5 * math.sqrt(C)  # cosine ~0.7 between two frequent rows, ~0 otherwise
    pairs = rng.permutation(N // 2).reshape(-1, 2)
    r = geometry.pair_contrast(W, pairs, counts, seed=1)
    assert r["forms_cosine"] > 0.6 and r["forms_random_cosine"] < 0.3
    assert abs(r["forms_contrast"]) < 0.02  # uniform random pairs would give ~0.5


def test_pair_contrast_without_pairs():
    for pairs in ([], [(0, 0)]):
        r = geometry.pair_contrast(pair_matrix(), pairs, ones(200))
        assert r["forms_n_pairs"] == 0
        assert r["forms_cosine"] is None and r["forms_random_cosine"] is None
        assert r["forms_matched_cosine"] is None and r["forms_contrast"] is None


def test_english_form_pairs():
    tokens = [
        " walk",
        " walked",
        " walking",
        " walks",  # 0-3
        " cat",
        " cats",
        " go",
        " going",
        " goes",  # 4-8: "go" is too short
        " make",
        " makes",
        " making",
        " try",
        " tried",
        " tries",  # 9-14
        " stop",
        " stopped",
        " stopping",
        "walk",
        "walks",  # 15-19: bare pieces are ignored
        " car",
        " care",
        " caring",
        " cared",  # 20-23: caring belongs to care, not car
        " th",
        " thing",
        "er",
        "ers",
        None,  # 24-28: no vowel, too short, unknown
        " box",
        " boxes",
        " Stop",
        " 123",
        " кот",
        " коты",  # 29-34
    ]
    expected = [
        (0, 1),
        (0, 2),
        (0, 3),
        (4, 5),
        (9, 10),
        (9, 11),
        (12, 13),
        (12, 14),
        (15, 16),
        (15, 17),
        (21, 22),
        (21, 23),
        (29, 30),
    ]
    assert english_form_pairs(tokens) == expected


def test_english_form_pairs_skip_word_pieces():
    # GPT-2 has all of these: short word-initial pieces the suffix rules would pair with unrelated words
    tokens = [
        " be",
        " bed",
        " being",
        " ke",
        " king",
        " wa",
        " was",
        " the",
        " thing",
        " re",
        " ring",
        " use",
        " used",
        " using",
    ]  # 11-13: e + d keeps "use", e-drop + ing would leave "us"
    assert english_form_pairs(tokens) == [(11, 12)]


def test_english_form_pairs_without_leading_spaces():
    tokens = ["walk", "walked", "cat", "cats", "er", "ers", "go", "goes", " 12", "ice", "iced"]
    assert english_form_pairs(tokens) == [(0, 1), (2, 3), (9, 10)]  # "go" is too short


def fake_encode(text):
    """One token for known words, one token per character otherwise."""
    vocab = {"кошка": 1, "кошки": 2, " кошка": 3, " кошки": 4, " идти": 5, " шел": 6, "cat": 7}
    return [vocab[text]] if text in vocab else [100 + ord(ch) for ch in text]


def test_read_pairs_file(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(
        "# related forms\n"
        "\n"
        "кошка\tкошки\n"  # single tokens both bare and spaced: two pairs
        "идти\tшел\n"  # single tokens only with a leading space
        "идти\tшагал\n"  # шагал is several tokens: skipped
        "  # indented comment\n"
        "кошка\tкошки\n"  # duplicate: kept once
        "cat\tcat\n",  # one token with itself says nothing: skipped
        encoding="utf-8",
    )
    pairs, skipped = read_pairs_file(path, fake_encode)
    assert pairs == [(1, 2), (3, 4), (5, 6)]
    assert skipped == 2


@pytest.mark.parametrize("bad", ["кошка кошки\n", "a\tb\tc\n", "a\t\n"])
def test_read_pairs_file_rejects_malformed_line(tmp_path, bad):
    path = tmp_path / "pairs.tsv"
    path.write_text("# ok\nкошка\tкошки\n" + bad, encoding="utf-8")
    with pytest.raises(TiecliError, match=r"pairs\.tsv:3: "):
        read_pairs_file(path, fake_encode)


def test_read_pairs_file_missing(tmp_path):
    with pytest.raises(TiecliError, match="pairs file"):
        read_pairs_file(tmp_path / "nope.tsv", fake_encode)


# -----------------------------------------------------------------------------
# measure()


def setup(seed=13, n=N):
    W_in, W_out = gaussian(seed, n=n), gaussian(seed + 1, n=n)
    counts = np.random.default_rng(seed).integers(0, 50, n)  # ~2% never occur
    buckets = np.random.default_rng(seed).integers(0, 3, n).astype(np.int8)
    return W_in, W_out, counts, buckets


SIDE_KEYS = {
    "norm_mean",
    "norm_std",
    "norm_min",
    "norm_max",
    "norm_freq_spearman",
    "anisotropy",
    "cosine_to_mean",
    "top_pc_share",
    "isotropy",
    "singular_values",
    "effective_rank",
    "stable_rank",
    "top_share",
    "forms_n_pairs",
    "forms_cosine",
    "forms_random_cosine",
    "forms_matched_cosine",
    "forms_contrast",
}
DRIFT_KEYS = {"drift", "drift_frequent", "drift_mid", "drift_rare", "drift_unit"}
AGREEMENT_KEYS = {"row_cosine", "distance", "knn_overlap", "knn_k", "knn_queries", "cka"}


def test_measure_untied_structure():
    W_in, W_out, counts, buckets = setup()
    r = geometry.measure(W_in, W_out, counts, buckets, W_in0=W_in * 0.5, pairs=[(0, 1), (2, 3)])
    assert set(r) == {"n_tokens", "tied", "input", "output", "agreement"}
    assert r["n_tokens"] == int((counts > 0).sum()) and r["tied"] is False
    assert set(r["input"]) == SIDE_KEYS | DRIFT_KEYS
    assert set(r["output"]) == SIDE_KEYS  # no W_out0: no drift
    assert r["input"]["forms_n_pairs"] == r["output"]["forms_n_pairs"] == 2
    assert set(r["agreement"]) == AGREEMENT_KEYS
    assert r["input"]["drift"] == pytest.approx(1.0)
    assert r["input"]["forms_random_cosine"] == r["input"]["anisotropy"]
    json.dumps(r, allow_nan=False)  # plain, finite, JSON-ready


def test_measure_tied():
    W, _, counts, buckets = setup()
    r = geometry.measure(W, W, counts, buckets, W_in0=W * 0.5, W_out0=W * 0.25)
    assert r["tied"] is True and r["agreement"] is None
    assert set(r["input"]) == set(r["output"]) == SIDE_KEYS | DRIFT_KEYS
    assert {k: r["input"][k] for k in SIDE_KEYS} == {k: r["output"][k] for k in SIDE_KEYS}
    assert r["input"]["forms_n_pairs"] == 0 and r["input"]["forms_contrast"] is None  # no pairs given
    assert r["input"]["drift"] == pytest.approx(1.0)
    assert r["output"]["drift"] == pytest.approx(3.0)  # each side keeps its own W0


def test_equal_but_separate_matrices_are_not_tied():
    W, _, counts, buckets = setup()
    r = geometry.measure(W, W.clone(), counts, buckets)
    assert r["tied"] is False
    assert r["agreement"]["row_cosine"] == pytest.approx(1) and r["agreement"]["cka"] == pytest.approx(1)


def test_unseen_tokens_do_not_count():
    W_in, W_out, counts, buckets = setup()
    unseen = torch.from_numpy(counts == 0)
    assert unseen.any()
    kwargs = dict(W_in0=W_in.clone(), W_out0=W_out.clone(), pairs=[(0, 1), (5, 9)], seed=1)
    before = geometry.measure(W_in, W_out, counts, buckets, **kwargs)
    W_in2, W_out2 = W_in.clone(), W_out.clone()
    W_in2[unseen], W_out2[unseen] = 1e3, -7.0
    assert geometry.measure(W_in2, W_out2, counts, buckets, **kwargs) == before


def test_measure_is_deterministic_and_leaves_rng_and_inputs_alone():
    W_in, W_out, counts, buckets = setup()
    W_in = torch.nn.Parameter(W_in.to(torch.bfloat16))  # a live training parameter, low precision
    copies = W_in.detach().clone(), W_out.clone()
    torch.manual_seed(123)
    state, np_state = torch.get_rng_state(), np.random.get_state()
    first = geometry.measure(W_in, W_out, counts, buckets, pairs=[(0, 1)], seed=5)
    second = geometry.measure(W_in, W_out, counts, buckets, pairs=[(0, 1)], seed=5)
    assert first == second
    assert torch.equal(torch.get_rng_state(), state)
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()
    assert torch.equal(W_in.detach(), copies[0]) and torch.equal(W_out, copies[1])
    assert W_in.grad is None
    other = geometry.measure(W_in, W_out, counts, buckets, pairs=[(0, 1)], seed=6)
    assert other["input"]["anisotropy"] != first["input"]["anisotropy"]


def test_too_few_tokens():
    with pytest.raises(ValueError, match="at least 2"):
        geometry.row_norms(gaussian(0, n=3), np.array([0, 4, 0]))


def _numbers(tree, path=""):
    """Every number of a measure() result, by its path."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _numbers(sub, f"{path}.{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in _numbers(sub, f"{path}[{i}]").items()}
    return {path: tree} if isinstance(tree, (int, float)) and not isinstance(tree, bool) else {}


def _pass_inputs(V=3000, C=48):
    g = torch.Generator().manual_seed(5)
    common = torch.randn(C, generator=g)  # a shared direction, as trained embeddings have
    W_in = torch.randn(V, C, generator=g) * 0.3 + common
    W_out = W_in + 0.5 * torch.randn(V, C, generator=g)
    counts = np.random.default_rng(0).zipf(1.3, V).astype(np.int64)
    counts[::7] = 0  # never seen: left out
    buckets = np.random.default_rng(1).integers(0, 3, V).astype(np.int8)
    pairs = [(i, i + 1) for i in range(0, V - 1, 5)]
    return W_in, W_out, counts, buckets, W_in * 0.9, W_out * 0.9, pairs


def test_the_float32_pass_agrees_with_a_float64_one(monkeypatch):
    """The pass computes in float32 with float64 Gram matrices and sums (so it can run on a GPU in its fast
    precision): every number agrees with the same pass kept in float64 throughout, to 1e-4 (the spectrum's
    smallest singular values, relative to the largest)."""
    inputs = _pass_inputs()
    fast = geometry.measure(*inputs[:4], *inputs[4:6], inputs[6], seed=0)
    monkeypatch.setattr(rows.Rows, "__init__", lambda self, W, idx: setattr(self, "x", W.double()[idx]))
    exact = geometry.measure(*(w.double() if torch.is_tensor(w) else w for w in inputs[:6]), inputs[6], seed=0)
    a, b = _numbers(fast), _numbers(exact)
    assert a.keys() == b.keys() and len(a) > 60
    scale = max(abs(v) for v in b.values())
    for key, value in b.items():
        assert a[key] == pytest.approx(value, rel=1e-4, abs=1e-6 * (scale if "singular" in key else 1)), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_pass_on_a_gpu_matches_the_cpu():
    inputs = _pass_inputs()
    cpu = geometry.measure(*inputs[:4], *inputs[4:6], inputs[6], seed=0)
    gpu = geometry.measure(*(w.cuda() if torch.is_tensor(w) else w for w in inputs[:6]), inputs[6], seed=0)
    a, b = _numbers(gpu), _numbers(cpu)
    assert a.keys() == b.keys()
    for key, value in b.items():
        assert a[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
