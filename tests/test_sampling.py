"""llmlab.inference.sampling: parity with transformers' warpers, and the samplers' distributions."""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from llmlab.inference import sampling as S

NEG_INF = float("-inf")


def _cases() -> dict[str, torch.Tensor]:
    """Random and adversarial (B, V) logits."""
    g = torch.Generator().manual_seed(0)
    V = 257
    rnd = torch.randn(6, V, generator=g) * 3
    ties = torch.randint(0, 4, (6, V), generator=g).float()  # a handful of values: ties at every cut
    equal = torch.zeros(3, V)
    with_inf = rnd.clone()
    with_inf[:, ::3] = NEG_INF
    peaked = rnd.clone()
    peaked[:, 0] = 40.0  # one token holds ~all the mass; the rest underflow to prob 0
    two_tied_top = torch.full((2, V), -5.0)
    two_tied_top[:, 10] = two_tied_top[:, 20] = 3.0
    return {
        "random": rnd,
        "ties": ties,
        "equal": equal,
        "with_inf": with_inf,
        "peaked": peaked,
        "two_tied_top": two_tied_top,
    }


CASES = _cases()


def _same_kept(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    kept = ours > NEG_INF
    assert torch.equal(kept, theirs > NEG_INF)
    assert torch.equal(ours[kept], theirs[kept])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("p", [0.0, 1e-9, 0.05, 0.5, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("keep", [1, 3])
def test_top_p_matches_hf(case, p, keep):
    x = CASES[case]
    _same_kept(S.top_p(x, p, keep), TopPLogitsWarper(p, min_tokens_to_keep=keep)(None, x))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("k", [1, 2, 5, 50, 256, 257, 10_000])
@pytest.mark.parametrize("keep", [1, 3])
def test_top_k_matches_hf(case, k, keep):
    x = CASES[case]
    _same_kept(S.top_k(x, k, keep), TopKLogitsWarper(k, min_tokens_to_keep=keep)(None, x))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("p", [0.0, 1e-9, 0.05, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("keep", [1, 3])
def test_min_p_matches_hf(case, p, keep):
    x = CASES[case]
    _same_kept(S.min_p(x, p, keep), MinPLogitsWarper(p, min_tokens_to_keep=keep)(None, x))


@pytest.mark.parametrize("t", [0.1, 0.7, 1.0, 2.5])
def test_temperature_matches_hf(t):
    x = CASES["random"]
    assert torch.equal(S.temperature(x, t), TemperatureLogitsWarper(t)(None, x))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    "t,k,p,mp", [(0.7, 50, 0.9, 0.0), (1.3, 0, 0.8, 0.05), (1.0, 10, 1.0, 0.1), (0.5, 3, 0.5, 0.2)]
)
def test_pipeline_matches_hf_order(case, t, k, p, mp):
    x = CASES[case]
    hf = [TemperatureLogitsWarper(t)]
    hf += [TopKLogitsWarper(k)] if k else []
    hf += [TopPLogitsWarper(p)] if p < 1 else []
    hf += [MinPLogitsWarper(mp)] if mp else []
    _same_kept(S.process_logits(x, temperature=t, top_k=k, top_p=p, min_p=mp), LogitsProcessorList(hf)(None, x))
    pr = S.probs(x, temperature=t, top_k=k, top_p=p, min_p=mp)
    assert pr.dtype == torch.float32 and torch.allclose(pr.sum(-1), torch.ones(len(x)))


def test_off_values_are_identity():
    x = CASES["with_inf"]
    assert torch.equal(S.process_logits(x), x)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"temperature": 0.0}, "greedy"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_tokens_to_keep": 0}, "min_tokens_to_keep"),
    ],
)
def test_bad_settings_raise_one_clear_error(kwargs, words):
    with pytest.raises(ValueError, match=words):
        S.process_logits(CASES["random"], **kwargs)


def test_direct_bad_arguments():
    x = CASES["random"]
    with pytest.raises(ValueError, match="top_k"):
        S.top_k(x, 0)
    with pytest.raises(ValueError, match="greedy"):
        S.temperature(x, 0.0)
    with pytest.raises(ValueError, match="top_p"):
        S.top_p(x, 1.5)


def test_greedy_is_argmax_first_on_ties():
    x = CASES["two_tied_top"]
    assert S.greedy(x).tolist() == [10, 10]
    assert torch.equal(S.sample(x, temperature=0), S.greedy(x))


# ----------------------------------------------------------------------------- samplers


def _counts(ids: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(ids, minlength=V).double()


def _chi2_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Chi-square goodness of fit over the tokens with non-zero expected probability."""
    support = expected_probs > 0
    assert counts[~support].sum() == 0, "a removed token was sampled"
    if support.sum() == 1:
        return 1.0  # one kept token: every sample is it, nothing to test further
    exp = expected_probs[support].double()
    exp = exp / exp.sum() * counts.sum()
    return float(stats.chisquare(counts[support].numpy(), exp.numpy()).pvalue)


N = 30_000  # samples per test: chi-square has power to see a 1-2% shift in a 30-token support
V_SMALL = 40


@pytest.fixture(scope="module")
def row() -> torch.Tensor:
    return torch.randn(1, V_SMALL, generator=torch.Generator().manual_seed(3)) * 1.5  # (1, V)


@pytest.mark.parametrize("p", [0.3, 0.7, 0.95])
def test_sorting_free_top_p_samples_the_sort_based_distribution(row, p):
    target = S.probs(row, top_p=p)[0]  # the sort-based (HF-parity) distribution
    batch = row.softmax(-1).expand(N, V_SMALL).contiguous()
    fast = S.top_p_sorting_free(batch, p, torch.Generator().manual_seed(1))
    ref = S.sample_multinomial(target.expand(N, V_SMALL), torch.Generator().manual_seed(2))
    assert _chi2_pvalue(_counts(fast, V_SMALL), target) > 1e-3
    # two-sample test: the sorting-free and the sort-based samplers draw the same distribution
    both = torch.stack([_counts(fast, V_SMALL), _counts(ref, V_SMALL)])
    both = both[:, both.sum(0) > 0]
    assert stats.chi2_contingency(both.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("method", ["window", "pivot"])
@pytest.mark.parametrize("k", [1, 4, 15])
def test_sorting_free_top_k_samples_the_sort_based_distribution(row, k, method):
    target = S.probs(row, top_k=k)[0]
    batch = row.softmax(-1).expand(N, V_SMALL).contiguous()
    fast = S.top_k_sorting_free(batch, k, torch.Generator().manual_seed(4), method=method)
    assert _chi2_pvalue(_counts(fast, V_SMALL), target) > 1e-3


def test_gumbel_and_multinomial_sample_softmax(row):
    target = row.softmax(-1)[0]
    g = torch.Generator().manual_seed(5)
    for ids in (
        S.sample_gumbel(row.expand(N, V_SMALL), g),  # from logits
        S.sample_gumbel(target.expand(N, V_SMALL), g),  # probabilities, detected on the device
        S.sample_gumbel(target.expand(N, V_SMALL), g, is_probs=True),
        S.sample_multinomial(target.expand(N, V_SMALL), g),
    ):
        assert _chi2_pvalue(_counts(ids, V_SMALL), target) > 1e-3


def test_sorting_free_respects_min_tokens_to_keep(row):
    batch = row.softmax(-1).expand(N // 10, V_SMALL).contiguous()
    ids = S.top_p_sorting_free(batch, 1e-6, torch.Generator().manual_seed(6), min_tokens_to_keep=3)
    kept = S.top_p(row, 1e-6, 3)[0] > NEG_INF
    assert kept.sum() == 3 and kept[ids].all() and ids.unique().numel() == 3


def test_sorting_free_on_ties_and_inf_stays_in_the_tie_inclusive_set():
    g = torch.Generator().manual_seed(7)
    for name in ("ties", "with_inf", "equal", "peaked"):
        pr = CASES[name].softmax(-1)
        for p in (0.2, 0.9):
            ids, rounds = S.top_p_sorting_free(pr, p, g, return_rounds=True)
            mass_above = torch.where(pr > pr.gather(-1, ids[:, None]), pr, 0.0).sum(-1)
            assert (mass_above < p).all() and rounds <= 64, name
        for k in (1, 7):
            for method in ("window", "pivot"):
                ids = S.top_k_sorting_free(pr, k, g, method=method)
                assert ((pr > pr.gather(-1, ids[:, None])).sum(-1) < k).all(), (name, method)


def test_sorting_free_large_vocab_rounds_are_few():
    g = torch.Generator().manual_seed(8)
    pr = (torch.randn(16, 32_000, generator=g) * 3).softmax(-1)
    ids, rounds = S.top_p_sorting_free(pr, 0.9, g, return_rounds=True)
    kept = S.top_p(pr.log(), 0.9) > NEG_INF
    assert kept.gather(-1, ids[:, None]).all()
    assert rounds <= 10


def test_seeded_generators_reproduce():
    pr = CASES["random"].softmax(-1)
    for fn in (S.sample_multinomial, S.sample_gumbel, lambda x, g: S.top_p_sorting_free(x, 0.9, g)):
        a = fn(pr, torch.Generator().manual_seed(11))
        b = fn(pr, torch.Generator().manual_seed(11))
        assert torch.equal(a, b)


def test_sample_never_picks_removed_tokens():
    x = CASES["with_inf"]
    g = torch.Generator().manual_seed(12)
    for method in ("multinomial", "gumbel"):
        ids = S.sample(x.repeat(50, 1), temperature=0.8, top_k=20, top_p=0.9, generator=g, method=method)
        kept = S.process_logits(x.repeat(50, 1), temperature=0.8, top_k=20, top_p=0.9) > NEG_INF
        assert kept.gather(-1, ids[:, None]).all()


# ----------------------------------------------------------------------------- a row with no token left


def _one_dead_row() -> torch.Tensor:
    """(3, V) logits whose row 1 has every token at -inf (all masked)."""
    x = CASES["random"][:3].clone()
    x[1] = NEG_INF
    return x


def _dead_probs() -> torch.Tensor:
    """The same batch as probabilities: row 1 is the softmax of an all -inf row (NaN)."""
    return _one_dead_row().softmax(-1)


G = torch.Generator().manual_seed(13)
LOGIT_ENTRY_POINTS = {
    "greedy": lambda x: S.greedy(x),
    "temperature": lambda x: S.temperature(x, 0.7),
    "top_k": lambda x: S.top_k(x, 5),
    "top_p": lambda x: S.top_p(x, 0.9),
    "min_p": lambda x: S.min_p(x, 0.1),
    "process_logits (all off)": lambda x: S.process_logits(x),
    "process_logits (top-p)": lambda x: S.process_logits(x, top_p=0.9),
    "probs": lambda x: S.probs(x, top_k=5),
    "sample multinomial": lambda x: S.sample(x, temperature=0.8, generator=G),
    "sample gumbel": lambda x: S.sample(x, top_p=0.9, method="gumbel", generator=G),
    "sample temperature 0": lambda x: S.sample(x, temperature=0),
    "sample_gumbel (logits)": lambda x: S.sample_gumbel(x, G, is_probs=False),
    "sample_gumbel (detect)": lambda x: S.sample_gumbel(x, G),
}
PROB_ENTRY_POINTS = {
    "sample_multinomial": lambda p: S.sample_multinomial(p, G),
    "sample_gumbel (probs)": lambda p: S.sample_gumbel(p, G, is_probs=True),
    "top_p_sorting_free": lambda p: S.top_p_sorting_free(p, 0.9, G),
    "top_k_sorting_free window": lambda p: S.top_k_sorting_free(p, 5, G),
    "top_k_sorting_free pivot": lambda p: S.top_k_sorting_free(p, 5, G, method="pivot"),
    "top_k_sorting_free k >= V": lambda p: S.top_k_sorting_free(p, 10_000, G),
}


@pytest.mark.parametrize("name", sorted(LOGIT_ENTRY_POINTS))
def test_all_neg_inf_logit_row_raises_one_clear_value_error(name):
    fn = LOGIT_ENTRY_POINTS[name]
    fn(CASES["random"][:3])  # a healthy batch goes through
    with pytest.raises(ValueError, match=r"^row 1 has no token to sample: every logit is -inf"):
        fn(_one_dead_row())


@pytest.mark.parametrize("name", sorted(PROB_ENTRY_POINTS))
@pytest.mark.parametrize("dead", ["nan (softmax of all -inf)", "all zero"])
def test_empty_probability_row_raises_one_clear_value_error(name, dead):
    fn = PROB_ENTRY_POINTS[name]
    fn(CASES["random"][:3].softmax(-1))  # a healthy batch goes through
    p = (
        _dead_probs()
        if dead.startswith("nan")
        else CASES["random"][:3].softmax(-1).index_fill(0, torch.tensor([1]), 0.0)
    )
    with pytest.raises(ValueError, match=r"^row 1 has no token to sample: .*as probabilities: all 0 or NaN"):
        fn(p)


def test_no_token_error_counts_every_dead_row():
    x = CASES["random"][:4].clone()
    x[[0, 2, 3]] = NEG_INF
    with pytest.raises(S.NoTokenError, match=r"^row 0 \(and 2 more\) has no token"):
        S.greedy(x)


def test_a_partly_masked_row_still_samples():
    x = torch.full((2, 8), NEG_INF)
    x[0, 3] = 0.0  # one token left in row 0
    x[1, 5:] = 1.0
    assert S.greedy(x).tolist() == [3, 5]
    assert S.sample(x, top_p=0.5, generator=G)[0].item() == 3
    assert S.top_p_sorting_free(x.softmax(-1), 0.9, G)[0].item() == 3
