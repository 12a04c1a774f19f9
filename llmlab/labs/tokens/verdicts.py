"""The tokens lab's verdicts and headline, from the tables alone."""

from __future__ import annotations

import math

import pandas as pd

from llmlab.core.results import Claim, LabResult, empty_table

MULTI_LETTER_SHARE = 0.5  # "most test words": more than half are split into multi-letter pieces
ANSWERED_MIN = 0.5  # a model "answers at all" when at least half of the prompts get a number back
COUNT_ACCURACY_MAX = 0.9  # "letter counting is unreliable": below 90% correct on the answered prompts
RELATED_RATIO_MIN = 2.0  # "far more often": at least twice the related share of id neighbours
P_MAX = 0.01  # the permutation test's significance level
SHARE_BAND = 0.25  # at the largest V, the measured LM-head share within 0.25 (absolute) of the weights' share
DELTA_BAND = (0.75, 1.33)  # what a bigger V adds to a step / what it adds to the head alone: 1 within a third
RHO_MIN = 0.9  # "the share grows with V": Spearman rank correlation over the sweep


# ---------------------------------------------------------------- judge


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    t = result.tables
    claims = []
    if not empty_table(t.get("tokenization")):
        claims += tokenization_claims(t["tokenization"])
    if not empty_table(t.get("counting")):
        claims += counting_claims(t["counting"])
    if not empty_table(t.get("embedding_test")) and set(t["embedding_test"].kind) >= {"cosine", "id"}:
        claims += [embedding_claim(t["embedding_test"], result.config)]
    if not empty_table(t.get("vocab")):
        claims += vocab_claims(t["vocab"])
    return claims


def tokenization_claims(df: pd.DataFrame) -> list[Claim]:
    bad = df[~df.roundtrip.astype(bool)]
    rt = Claim("tokens.roundtrip", "tokenization loses nothing: the ids decode back to the text",
               "decode(encode(text)) == text, every sample",
               f"{len(df) - len(bad)} of {len(df)} samples exact" +
               (f"; not: {', '.join(bad['sample'][:3])}" if len(bad) else ""),
               len(bad) == 0)
    same = df[(df.kind == "same sentence") & ~df["sample"].str.startswith("English")]
    if same.empty:  # a run cut before the translations
        return [rt]
    worst = same.loc[same.x_english.idxmin()]
    dearest = same.loc[same.x_english.idxmax()]
    premium = Claim("tokens.english_cheapest", "the same sentence costs more tokens in other languages",
                    "tokens / English's tokens > 1 for every translation of UDHR article 1",
                    f"lowest {worst.x_english:.2f}x ({worst['sample']}), highest {dearest.x_english:.2f}x "
                    f"({dearest['sample']}, {dearest.tokenizer})", bool((same.x_english > 1).all()))
    return [rt, premium]


def counting_claims(df: pd.DataFrame) -> list[Claim]:
    share = df.groupby("word").multi_letter.first().astype(bool).mean()
    strawberry = df.iloc[0]
    hidden = Claim("tokens.letters_not_in_tokens", "the letters are not in the tokens",
                   f"> {MULTI_LETTER_SHARE:.0%} of the test words split into pieces of 2+ letters",
                   f"{share:.0%} of {df.word.nunique()} words; {strawberry.word} = {strawberry.pieces}",
                   share > MULTI_LETTER_SHARE)
    answered = df.answered.astype(bool)
    first = df.model.iloc[0]
    if answered.mean() < ANSWERED_MIN:
        counted = Claim("tokens.letter_counting", "a model that reads tokens miscounts letters",
                        f"accuracy < {COUNT_ACCURACY_MAX:.0%}, where >= {ANSWERED_MIN:.0%} of prompts get a number "
                        "back",
                        "-", None,
                        note=f"{int(answered.sum())} of {len(df)} prompts got a number back: {first} continues text "
                             "(trained on Python docs), it does not answer questions")
    else:
        acc = df[answered].correct.astype(bool).mean()
        counted = Claim("tokens.letter_counting", "a model that reads tokens miscounts letters",
                        f"accuracy < {COUNT_ACCURACY_MAX:.0%} on the answered 'how many <letter> in <word>?' prompts",
                        f"{acc:.0%} correct of {int(answered.sum())} answered ({len(df)} asked)",
                        acc < COUNT_ACCURACY_MAX)
    return [hidden, counted]


def embedding_claim(df: pd.DataFrame, config: dict) -> Claim:
    parts, ok = [], True
    for label, sub in df.groupby("model", sort=False):
        if set(sub.kind) < {"cosine", "id"}:
            continue  # a model cut between its two rows
        s = sub.set_index("kind")
        cos, idn, p = s.loc["cosine", "related_share"], s.loc["id", "related_share"], s.loc["cosine", "p_value"]
        ratio = cos / idn if idn > 0 else math.inf
        ok = ok and ratio >= RELATED_RATIO_MIN and p < P_MAX
        parts.append(f"{label}: {cos:.0%} vs {idn:.0%} ({ratio:.1f}x), p = {p:.1g}")
    perms = int(df.permutations.iloc[0])
    return Claim("tokens.embedding_neighbours_related", "an id means nothing; its embedding sits next to related words",
                 f"related share by cosine >= {RELATED_RATIO_MIN:g}x by id; paired sign-flip p < {P_MAX:g} "
                 f"({perms:,} permutations, seed {config.get('seed', 0)})", "; ".join(parts), ok)


def vocab_claims(df: pd.DataFrame) -> list[Claim]:
    exact = ((df.embed_B == df.formula_embed_B) & (df.head_B == df.formula_head_B)
             & (df.logits_B_per_token == df.formula_logits_B_per_token))
    big = df.iloc[-1]
    claims = [Claim("tokens.vocab_bytes_formula", "the vocabulary's memory is d x V per matrix",
                    "embedding, head: d x V x b bytes each; logits: V x b per token (b = bytes a value); exact",
                    f"{int(exact.sum())} of {len(df)} sizes exact",
                    bool(exact.all()))]
    if len(df) >= 3:
        rho = df.vocab.rank().corr(df.head_share.rank())
        claims.append(Claim("tokens.head_share_grows", "a bigger V makes the LM head a bigger part of a step",
                            f"Spearman rho(share, V) >= {RHO_MIN:g} over {len(df)} sizes",
                            f"rho = {rho:.2f}; {df.head_share.iloc[0]:.0%} at {int(df.vocab.iloc[0]):,} -> "
                            f"{big.head_share:.0%} at {int(big.vocab):,}", rho >= RHO_MIN))
    gap = big.head_share - big.formula_share
    claims.append(Claim("tokens.head_share_formula", "at large V the head's share of a step is its weights' share",
                        f"|measured - d V / (d V + body params)| <= {SHARE_BAND:g} at the largest V",
                        f"{big.head_share:.0%} vs {big.formula_share:.0%} at V = {int(big.vocab):,}",
                        abs(gap) <= SHARE_BAND,
                        note="per-layer fixed costs (launches, Python) pull the measured share down"))
    if len(df) < 2:
        return claims  # one size: nothing was added
    d_step, d_head = big.step_ms - df.step_ms.iloc[0], big.head_ms - df.head_ms.iloc[0]
    r = d_step / d_head if d_head > 0 else math.inf
    lo, hi = DELTA_BAND
    claims.append(Claim("tokens.vocab_cost_is_the_head", "what a bigger V adds to a decode step is its LM head",
                        f"added step time / added head time, smallest to largest V, in {lo:g}-{hi:g}",
                        f"{r:.2f} ({d_step:.2f} vs {d_head:.2f} ms more)", lo <= r <= hi))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    t = result.tables
    if any(empty_table(t.get(n)) for n in ("counting", "embedding_test", "vocab")):
        return ""
    c, e, v = t["counting"].iloc[0], t["embedding_test"], t["vocab"].iloc[-1]
    if set(e.kind) < {"cosine", "id"}:
        return ""
    cos = e[e.kind == "cosine"].iloc[0]
    idn = e[e.kind == "id"].iloc[0]
    return (f"{c.model} reads '{c.word}' as {c.pieces}: the letters are inside ids. Its nearest embeddings are related "
            f"words {cos.related_share:.0%} of the time against {idn.related_share:.0%} for the nearest ids; at "
            f"V = {int(v.vocab):,} the LM head took {v.head_share:.0%} of a decode step here.")
