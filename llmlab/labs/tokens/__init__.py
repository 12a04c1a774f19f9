"""Lab: tokens: what a model reads (ids, not letters), what an id means (its embedding), what the vocabulary costs.

Parts, in the order of the series' first article:
1. tokenization: how each model's tokenizer splits English prose, numbers, Python code and the
   same sentence in ten languages; tokens per word and per character, and the premium each
   language pays over English for the same sentence. Why letter counting is hard: the pieces of
   "strawberry"-like words, and the model asked "how many r in strawberry?" (its accuracy is
   measured only where it answers with a number at all).
2. embeddings: an id is an index, its meaning sits in its row of the input-embedding matrix. For
   the corpus's most frequent word tokens, the k nearest rows by cosine against the k nearest ids,
   both drawn from the same word tokens; a pair is "related" by a rule independent of the
   embedding (same word up to case and the leading space, a shared stem, or co-occurrence in the
   held-out corpus above chance). Paired sign-flip permutation test on the per-word difference.
3. vocabulary size: a Llama shape (transformers.LlamaConfig, random weights) at V = 4k .. 256k:
   embedding + LM-head bytes and logits bytes per token against the formulas (d x V x bytes each,
   V x bytes), and the LM head's share of a timed decode step against the weights' share
   d V / (d V + body matmul parameters) (each weight does 2 FLOPs and is read once per token).

References:
- Sennrich et al. 2016 (arXiv 1508.07909): byte-pair encoding for subwords.
- Petrov et al. 2023 (arXiv 2305.15425): the same sentence costs different token counts per language.
- Mikolov et al. 2013 (arXiv 1301.3781): nearest neighbours by cosine in an embedding space.
- Good, "Permutation, Parametric and Bootstrap Tests of Hypotheses" (2005): the paired sign-flip test.

Layout: `config` (the Config), `tokenization`, `embeddings` and `vocab` (parts 1-3), `lab` (run),
`verdicts` (judge, headline), `report` (views, figures).
"""

from llmlab.core.lazy import lazy
from llmlab.labs.tokens.config import JUDGE_VERSION, LAB, VERSION, Config

_PARTS = {  # name -> the submodule that defines it; imported on first use (the parts load torch)
    **dict.fromkeys(("check", "run"), "lab"),
    **dict.fromkeys(("headline", "judge"), "verdicts"),
    **dict.fromkeys(("figures", "views"), "report"),
    **dict.fromkeys(("NO_SPACES", "SAMPLES", "UDHR", "count_prompt", "encode", "multi_letter", "parse_count",
                     "tokenization_rows"), "tokenization"),
    **dict.fromkeys(("Cooccurrence", "cosine_neighbours", "embedding_summary", "example_rows", "id_neighbours",
                     "same_word", "sign_flip_pvalue", "unit_rows"), "embeddings"),
    **dict.fromkeys(("layer_bytes", "shape_config", "sweep_layers", "vocab_row"), "vocab"),
}
__getattr__ = lazy(__name__, _PARTS)
__all__ = ["JUDGE_VERSION", "LAB", "VERSION", "Config", *_PARTS]
