"""tokens: tokenization accounting, the permutation test, co-occurrence, the vocabulary formulas, the judge.

The built-in pair may be retrained at any time: no test pins a token id or a model-dependent number.
"""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest
import torch

from llmlab.core.device import resolve_device, torch_threads
from llmlab.core.results import LabResult, find
from llmlab.labs import tokens as L

CPU = resolve_device("cpu")


class CharTokenizer:
    """A stand-in tokenizer with one token per character: every count is known by hand."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


# ---------------------------------------------------------------- part 1: tokenization accounting


def test_tokenization_rows_count_tokens_words_and_characters():
    rows = L.tokenization_rows(CharTokenizer(), "chars")
    assert len(rows) == len(L.SAMPLES)
    for r, (kind, name, text) in zip(rows, L.SAMPLES, strict=True):
        assert r["tokens"] == r["chars"] == len(text) and r["tokens_per_char"] == 1.0 and r["roundtrip"]
        assert r["utf8_bytes"] == len(text.encode("utf-8"))
        if name in L.NO_SPACES:
            assert r["words"] is None and r["tokens_per_word"] is None
        else:
            assert r["tokens_per_word"] == pytest.approx(len(text) / len(text.split()))
        expected = len(text) / len(L.UDHR) if kind == "same sentence" else None
        assert r["x_english"] == (pytest.approx(expected) if expected else None)


def test_builtin_tokenizer_pieces_rebuild_the_text():
    """Each id decoded alone, joined, gives the text back (for text the byte-level BPE splits on characters)."""
    from llmlab.core.models import load_tokenizer

    tok = load_tokenizer("tiny")
    for _, _, text in L.SAMPLES[:4]:  # ASCII samples: no character is split across two byte tokens
        ids = L.encode(tok, text)
        assert "".join(tok.decode([i]) for i in ids) == text
    rows = L.tokenization_rows(tok, "tiny")
    assert all(r["tokens"] == len(L.encode(tok, t)) for r, (_, _, t) in zip(rows, L.SAMPLES, strict=True))


@pytest.mark.parametrize("pieces, multi", [(["_st", "raw", "ber", "ry"], True), (["_s", "t", "r"], False),
                                           (["_", "a", "b"], False), (["ab"], True), (["1", "23"], False)])
def test_multi_letter_means_a_piece_of_two_letters_or_more(pieces, multi):
    assert L.multi_letter(pieces) is multi


@pytest.mark.parametrize("text, n",
                         [(" 3", 3), ("There are three r's.", 3), ("12 or 13", 12), ("Return the list", None),
                                     ("Someone", None), ("two.", 2)])
def test_parse_count_reads_the_first_number(text, n):
    assert L.parse_count(text) == n


def test_count_prompt_uses_the_chat_template_when_there_is_one():
    plain = L.count_prompt(CharTokenizer(), "strawberry", "r")
    assert plain.startswith("Q: ") and '"r"' in plain and plain.endswith("A:")
    chat = types.SimpleNamespace(chat_template="x", apply_chat_template=lambda msgs, **kw: "<u>" + msgs[0]["content"])
    assert L.count_prompt(chat, "strawberry", "r").startswith("<u>How many")


# ------------------------------------------------------------ part 2: neighbours, co-occurrence, the permutation test


def test_permutation_test_finds_a_planted_effect():
    rng = np.random.default_rng(1)
    diffs = 0.3 + rng.normal(0, 0.2, 60)  # cosine neighbours related 30 points more often than id neighbours
    p = L.sign_flip_pvalue(diffs, 2000, seed=0)
    assert p == pytest.approx(1 / 2001)  # no flipped mean reaches the observed one


def test_permutation_test_is_calibrated_on_noise():
    """Under the null (symmetric differences) p is uniform: about 5% of data sets fall below 0.05."""
    rng = np.random.default_rng(2)
    ps = [L.sign_flip_pvalue(rng.normal(0, 0.3, 40), 500, seed=s) for s in range(60)]
    assert 0 < min(ps) and max(ps) <= 1
    assert np.mean(np.array(ps) < 0.05) <= 0.15
    assert 0.3 <= np.median(ps) <= 0.7


def test_permutation_test_is_seeded():
    d = np.random.default_rng(3).normal(0.05, 0.3, 30)
    assert L.sign_flip_pvalue(d, 1000, 7) == L.sign_flip_pvalue(d, 1000, 7)


def test_cooccurrence_counts_a_planted_pair_against_independence():
    rng = np.random.default_rng(0)
    ids = rng.integers(10, 50, 5000)
    ids[::50] = 1  # token 1 every 50 positions ...
    ids[2::50] = 2  # ... and token 2 always two positions after it
    co = L.Cooccurrence(ids, window=3)
    near = co.near(1)
    obs, exp = co.observed_expected(near, 2)
    assert co.count(1) == 100 and obs == 100  # every 2 sits near a 1
    assert exp == pytest.approx(100 * near.mean())  # independence: count(2) x the share of positions near a 1
    assert near.sum() == 100 * 6 - 3  # +-3 around each 1 (the one at 0 has no left side), the 1s left out
    far, exp_far = co.observed_expected(near, 30)
    assert far <= 3 * exp_far + 10  # a random token is not planted


@pytest.mark.parametrize("a, b, same", [(" list", "List", True), (" list", " lists", True), ("list", " List", True),
                                        (" the", " then", False), (" file", " files", True),
                                        (" is", " isinstance", False),
                                        (" return", " raise", False)])
def test_same_word_is_case_space_and_stem(a, b, same):
    assert L.same_word(a, b) is same


def test_neighbours_by_id_and_by_cosine():
    pool = np.array([3, 10, 11, 13, 20])
    assert L.id_neighbours(11, pool, 2) == [10, 13]
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    emb[20] = 3 * emb[3] + 0.01  # same direction: cosine ~ 1
    units = L.unit_rows(emb, torch.as_tensor(pool))
    assert units.norm(dim=1).sub(1).abs().max() < 1e-6
    assert L.cosine_neighbours(units, torch.as_tensor(pool), 3, 1) == [20]
    assert 3 not in L.cosine_neighbours(units, torch.as_tensor(pool), 3, 4)


def _neighbours(cos_related: float, id_related: float, probes: int = 40, k: int = 5, seed: int = 0) -> pd.DataFrame:
    """Neighbour rows as neighbour_rows() writes them, with a planted share of related pairs per kind."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(probes):
        for kind, share in (("cosine", cos_related), ("id", id_related)):
            for rank in range(1, k + 1):
                rows.append(dict(model="m", probe=f" w{p}", probe_id=p, kind=kind, rank=rank, neighbour=" x",
                                 neighbour_id=1000 + rank, id_distance=rank if kind == "id" else 300, cooc=0,
                                 cooc_expected=0.0, variant=False, related=bool(rng.random() < share)))
    return pd.DataFrame(rows)


def test_embedding_summary_planted_and_random():
    cfg = L.Config.quick()
    planted = pd.DataFrame(L.embedding_summary(_neighbours(0.4, 0.05), cfg)).set_index("kind")
    assert planted.loc["cosine", "related_share"] > planted.loc["id", "related_share"]
    assert planted.loc["cosine", "p_value"] < 0.01
    same = pd.DataFrame(L.embedding_summary(_neighbours(0.2, 0.2, seed=4), cfg)).set_index("kind")
    assert same.loc["cosine", "p_value"] > 0.01


# ---------------------------------------------------------------- part 3: the vocabulary formulas


def test_vocab_row_bytes_equal_the_formula_and_body_is_counted_from_the_config():
    cfg = L.Config(shape="tiny", vocab_sizes=(512,), layers=1, repeats=1, context=4)
    conf = L.shape_config(cfg, 512, 1)
    with torch_threads(1):
        row = L.vocab_row(conf, cfg, CPU)
    d = conf.hidden_size
    assert row["embed_B"] == row["head_B"] == 512 * d * 4 and row["logits_B_per_token"] == 512 * 4
    assert row["body_params"] * 4 == L.layer_bytes(cfg, 4)  # tensors counted = the config's formula
    assert row["formula_share"] == pytest.approx(d * 512 / (d * 512 + row["body_params"]))
    assert row["step_flops"] == 2 * (d * 512 + row["body_params"]) and 0 < row["head_share"] < 1
    # the head's bytes / its time
    assert row["head_GBps"] == pytest.approx(row["head_B"] / (row["head_ms"] / 1e3) / 1e9)


def test_layers_on_cuda_come_from_the_device_l2(monkeypatch):
    import llmlab.core.device as dev

    cfg = L.Config(shape="tiny", layers=2)
    per_layer = L.layer_bytes(cfg, 2)
    monkeypatch.setattr(dev, "last_level_cache_bytes", lambda device: 50 * 2**20)  # an H100's 50 MiB
    gpu = types.SimpleNamespace(is_cuda=True)
    layers = L.sweep_layers(cfg, gpu, 2)
    assert layers * per_layer >= cfg.llc_multiple * 50 * 2**20 > (layers - 1) * per_layer
    assert L.sweep_layers(cfg, CPU, 4) == 2  # the CPU keeps the Config's layers


# ---------------------------------------------------------------- judge fixtures (tables as run() writes them)


def _vocab(shares=(0.02, 0.3, 0.6, 0.9), formula=(0.14, 0.4, 0.73, 0.91), exact=True,
           step_per_head=1.0) -> pd.DataFrame:
    rows = []
    for v, s, f in zip((4096, 16384, 65536, 262144), shares, formula, strict=True):
        b = v * 256 * 4
        rows.append(dict(vocab=v, embed_B=b, head_B=b if exact else b + 4, formula_embed_B=b, formula_head_B=b,
                         logits_B_per_token=4 * v, formula_logits_B_per_token=4 * v, head_share=s, formula_share=f,
                         formula_share_full=f, head_ms=40 * s, step_ms=10 + step_per_head * 40 * s))
    return pd.DataFrame(rows)


def _counting(answered=False, correct=False, split=True) -> pd.DataFrame:
    rows = []
    for item in L.Config().count_words:
        word, _, letter = item.partition(":")
        parts = ["_" + word[:3], word[3:]] if split else ["_", *word]
        n = word.count(letter)
        rows.append(dict(model="m", word=word, letter=letter, count=n, tokens=len(parts), pieces="|".join(parts),
                         multi_letter=L.multi_letter(parts),
                         answer=str(n if correct else n + 1) if answered else "Return",
                         answered=answered, parsed=(n if correct else n + 1) if answered else None,
                         correct=answered and correct))
    return pd.DataFrame(rows)


def _fixture(premium=True, roundtrip=True, split=True, answered=False, correct=False, cos=0.4, idn=0.05, **vocab):
    res = LabResult(lab=L.LAB, version=L.VERSION, config={"k": 5, "seed": 0})
    tok = pd.DataFrame(L.tokenization_rows(CharTokenizer(), "chars"))
    if not premium:
        tok.loc[tok["sample"] == "Chinese", "x_english"] = 0.8
    if not roundtrip:
        tok.loc[tok["sample"] == "Greek", "roundtrip"] = False
    res.add_table("tokenization", tok)
    res.add_table("counting", _counting(answered, correct, split))
    nb = _neighbours(cos, idn)
    res.add_table("neighbours", nb)
    res.add_table("embedding_test", L.embedding_summary(nb, L.Config.quick()))
    res.add_table("examples", L.example_rows(nb))
    res.add_table("vocab", _vocab(**vocab))
    return res


def test_char_tokenizer_pays_a_premium_per_language_by_length_only():
    """The stand-in's premium is the character ratio: Chinese (19 chars) is cheaper than English (63)."""
    claims = L.judge(_fixture())
    assert find(claims, "tokens.english_cheapest").holds is False  # the character tokenizer: CJK is short


@pytest.mark.parametrize("claim_id, good, bad", [
    ("tokens.roundtrip", {}, dict(roundtrip=False)),
    ("tokens.letters_not_in_tokens", {}, dict(split=False)),
    ("tokens.letter_counting", dict(answered=True, correct=False), dict(answered=True, correct=True)),
    ("tokens.embedding_neighbours_related", {}, dict(cos=0.06, idn=0.05)),
    ("tokens.vocab_bytes_formula", {}, dict(exact=False)),
    ("tokens.head_share_grows", {}, dict(shares=(0.9, 0.6, 0.3, 0.02))),
    ("tokens.head_share_formula", {}, dict(shares=(0.02, 0.3, 0.6, 0.5))),
    ("tokens.vocab_cost_is_the_head", {}, dict(step_per_head=2.0)),
])
def test_each_claim_can_hold_and_fail(claim_id, good, bad):
    assert find(L.judge(_fixture(**good)), claim_id).holds is True
    assert find(L.judge(_fixture(**bad)), claim_id).holds is False


def test_english_premium_holds_and_fails():
    res = _fixture()
    tok = res.tables["tokenization"]
    same = tok.kind == "same sentence"
    tok.loc[same & ~tok["sample"].str.startswith("English"), "x_english"] = 1.5
    assert find(L.judge(res), "tokens.english_cheapest").holds is True
    tok.loc[tok["sample"] == "Spanish", "x_english"] = 0.9
    assert find(L.judge(res), "tokens.english_cheapest").holds is False


def test_letter_counting_is_not_measured_when_the_model_gives_no_number():
    c = find(L.judge(_fixture(answered=False)), "tokens.letter_counting")
    assert c.holds is None and "0 of 12" in c.note


def test_judge_and_views_tolerate_missing_parts():
    res = _fixture()
    del res.tables["vocab"], res.tables["counting"]
    ids = {c.id for c in L.judge(res)}
    assert "tokens.roundtrip" in ids and not any(i.startswith("tokens.head_") for i in ids)
    assert L.headline(res, []) == ""
    assert {v.table for v in L.views(_fixture())} <= set(_fixture().tables)


@pytest.mark.parametrize("kw", [dict(models=()), dict(models=("arch:llama-3-8b",)), dict(vocab_sizes=(100,)),
                                dict(count_words=("strawberry:z",)), dict(permutations=10), dict(k=0)])
def test_bad_config_is_refused(kw):
    with pytest.raises(ValueError):
        L.Config(**kw)


# ---------------------------------------------------------------- end to end


def test_quick_run_end_to_end(quick_run):
    run = quick_run("tokens")
    d = run.data
    claims = {c["id"]: c for c in d["claims"]}
    assert set(claims) == {"tokens.roundtrip", "tokens.english_cheapest", "tokens.letters_not_in_tokens",
                           "tokens.letter_counting", "tokens.embedding_neighbours_related",
                           "tokens.vocab_bytes_formula",
                           "tokens.head_share_grows", "tokens.head_share_formula", "tokens.vocab_cost_is_the_head"}
    assert claims["tokens.vocab_bytes_formula"]["holds"] is True  # a formula: holds on any machine
    assert claims["tokens.roundtrip"]["holds"] is True  # byte-level BPE is lossless
    counting = claims["tokens.letter_counting"]
    assert counting["holds"] is not None or counting["note"]  # measured, or says why not
    vocab = pd.DataFrame(**{"data": d["tables"]["vocab"]["rows"], "columns": d["tables"]["vocab"]["columns"]})
    assert list(vocab.vocab) == list(L.Config.quick().vocab_sizes)
    assert "1. How text becomes tokens" in run.stdout and "3. Vocabulary size" in run.stdout


@pytest.mark.parametrize("rows", [1, 2])
def test_judge_and_headline_survive_tables_cut_mid_sweep(rows):
    res = _fixture()
    res.tables = {k: v.head(rows) for k, v in res.tables.items()}
    claims = L.judge(res)
    assert "tokens.roundtrip" in {c.id for c in claims} and "tokens.english_cheapest" not in {c.id for c in claims}
    assert ("tokens.vocab_cost_is_the_head" in {c.id for c in claims}) is (rows >= 2)
    L.headline(res, claims)


def test_figures_plot_the_vocabulary_sweep():
    figs = L.figures(_fixture())
    assert len(figs) == 1 and len(figs[0][1].axes[0].lines) == 3
    res = _fixture()
    del res.tables["vocab"]
    assert L.figures(res) == []
