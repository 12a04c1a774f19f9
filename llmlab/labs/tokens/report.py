"""The tokens lab's report: the terminal views and the HTML report's figure."""

from __future__ import annotations

import pandas as pd

from llmlab.core.results import Col, LabResult, View, empty_table


def views(result: LabResult) -> list[View]:
    k = result.config.get("k", 5)
    return [
        View("1. How text becomes tokens",
             "How many tokens does each kind of text cost? (x English: the same sentence)",
             "tokenization", (Col("tokenizer", "tokenizer", width=10), Col("sample", "sample", width=16),
                              Col("chars", "chars", "int"), Col("words", "words", "int"),
                              Col("tokens", "tokens", "int"),
                              Col("tokens_per_word", "tok/word", ".2f"), Col("tokens_per_char", "tok/char", ".2f"),
                              Col("x_english", "x English", "x")), max_rows=26),
        View("   ... and why letters are hard to count",
             "What does the model see of a word, and can it count a letter?",
             "counting", (Col("word", "word", width=11), Col("pieces", "pieces (ids)", width=20),
                          Col("letter", "letter"), Col("count", "count", "int"),
                          Col("answer", "model's answer", width=16)),
             rows=lambda df: df[df.model == df.model.iloc[0]], max_rows=5),
        View("2. What an id means: its embedding", f"The {k} nearest word tokens by cosine vs by id (* = related)",
             "examples", (Col("word", "word", width=10), Col("cosine", "nearest by cosine", width=32),
                          Col("by_id", "nearest by id", width=30)), max_rows=4),
        View("   ... related how often?", "Are embedding neighbours related words more often than id neighbours?",
             "embedding_test",
             (Col("model", "model", width=10), Col("kind", "neighbours"), Col("pairs", "pairs", "int"),
                                Col("related_share", "related", "%"), Col("variant_share", "same word", "%"),
                                Col("median_id_distance", "id distance", "int"), Col("p_value", "p", ".1g"))),
        View("3. Vocabulary size: memory and cost", "What do V rows cost in bytes, and in a decode step?",
             "vocab", (Col("vocab", "V", "int"), Col("embed_B", "emb+head MiB", ".0f"),
                       Col("logits_B_per_token", "logits KiB/tok", ".0f"), Col("head_ms", "head ms", ".3f"),
                       Col("step_ms", "step ms", ".2f"), Col("head_share", "head share", "%"),
                       Col("formula_share", "formula", "%"), Col("formula_share_full", "full model", "%")),
             rows=_vocab_units),
    ]


def _vocab_units(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["embed_B"] = (df.embed_B + df.head_B) / 2**20
    df["logits_B_per_token"] = df.logits_B_per_token / 1024
    return df


def figures(result: LabResult) -> list[tuple[str, object]]:
    """The HTML report's plot: the LM head's share of a decode step vs V, measured and by the weights' formula."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = result.tables.get("vocab")
    if empty_table(df):
        return []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(df.vocab, 100 * df.head_share, "o-", label="measured (head / step time)")
    ax.plot(df.vocab, 100 * df.formula_share, "s--", label="formula d V / (d V + body), layers run")
    ax.plot(df.vocab, 100 * df.formula_share_full, ":", label="formula, the full model's layers")
    ax.set(xlabel="vocabulary size V", ylabel="LM head share of a decode step (%)", ylim=(0, 100))
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return [("The LM head's share of a decode step grows with the vocabulary", fig)]
