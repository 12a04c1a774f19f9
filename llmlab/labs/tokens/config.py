"""The tokens lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "tokens"
VERSION = 1
JUDGE_VERSION = 1


@dataclass(frozen=True)
class Config:
    """Tokens: a model reads ids, not letters; an id means nothing until its embedding; the vocabulary has a price.

    This lab shows how each tokenizer splits English, numbers, code and the same sentence in ten languages (tokens
    per word and per character, the premium over English), why counting the r's in "strawberry" is hard (the
    pieces, and the model asked, where it answers at all), the nearest neighbours of words in the input-embedding
    matrix against their neighbours by id (related words by a rule that does not use the embedding, with a
    permutation test), and what V = 4k .. 256k costs: embedding and LM-head bytes, logits per token, and the LM
    head's share of a timed decode step against the formula.
    """

    models: tuple[str, ...] = opt(
        ("tiny", "tiny-draft"), flag="--model", short="-m",
        help="Models with a trained tokenizer, comma-separated or repeated: tiny, tiny-draft, a Hugging Face id or "
             "local path.")  # the built-in pair (one tokenizer, two embeddings); any HF id
    count_words: tuple[str, ...] = opt(
        ("strawberry:r", "raspberry:r", "blueberry:r", "mississippi:s", "bookkeeper:e", "committee:t", "balloon:l",
         "banana:a", "parallel:l", "assessment:s", "occurrence:c", "embarrass:r"),
        help="Words whose letter the model is asked to count, as word:letter, comma-separated (the letter in the "
             "word).")  # repeated letters (the classic)
    answer_tokens: int = opt(8, help="Greedy tokens of each counting answer (>= 1).")  # room for "3" or "three."
    probes: int = opt(150, help="Most frequent word tokens of the corpus whose neighbours are compared (>= 2).")
    k: int = opt(5, help="Neighbours per probe, by cosine and by id (>= 1).")
    window: int = opt(5, help="Co-occurrence window: tokens either side that count as together (>= 1).")  # a clause
    cooc_ratio: float = opt(2.0, help="Related by co-occurrence: at least this many times the count independence "
                                      "predicts.")
    cooc_min: int = opt(3, help="Related by co-occurrence: seen together at least this many times.")  # not one chance
    corpus_chars: int = opt(400_000, help="Characters of the held-out corpus read.")  # more than its ~300 k: all of it
    permutations: int = opt(10_000, help="Sign flips of part 2's permutation test (>= 100).")  # p resolves to 1e-4
    shape: str = opt("arch:llama-3.2-1b", help="The layer shape whose vocabulary part 3 sweeps (tiny or arch:NAME; "
                                               "random weights).")  # d = 2048, untied
    vocab_sizes: tuple[int, ...] = opt((4096, 8192, 16384, 32768, 65536, 131072, 262144),
                                       help="Vocabulary sizes V of part 3, comma-separated (>= 256).")  # to Gemma's
    layers: int = opt(2, help="Decoder layers of part 3's swept shape (>= 1; on CUDA more, until the body is "
                              "--llc-multiple x the L2).")
    llc_multiple: float = opt(4.0, help="CUDA: the swept body's weights at least this many times the device's L2, so "
                                        "a step streams from HBM.")
    context: int = opt(16, help="Tokens in the cache during part 3's timed decode step (>= 1).")  # attention negligible
    repeats: int = opt(7, help="Interleaved timing rounds per vocabulary size, the median kept (>= 1).")
    threads: int = opt(0, help="torch CPU threads (0: torch's, or 1 when the CPU is oversubscribed).")
    seed: int = 0

    def __post_init__(self):
        if not self.models:
            raise ValueError("--model needs at least one model")
        if any(m.startswith("arch:") for m in self.models):
            raise ValueError("--model must have a trained tokenizer (tiny, tiny-draft or a Hugging Face model), "
                             "not arch:")
        if self.probes < 2 or self.k < 1 or self.window < 1 or self.permutations < 100:
            raise ValueError("probes must be >= 2, k and window >= 1, permutations >= 100")
        if not self.vocab_sizes or min(self.vocab_sizes) < 256:
            raise ValueError(f"--vocab-sizes must be >= 256 each, got {self.vocab_sizes}")
        if self.layers < 1 or self.repeats < 1 or self.context < 1 or self.answer_tokens < 1:
            raise ValueError("layers, repeats, context and answer tokens must be >= 1")
        for item in self.count_words:
            word, _, letter = item.partition(":")
            if len(letter) != 1 or letter not in word:
                raise ValueError(f"count word {item!r}: give word:letter with the letter in the word")

    @classmethod
    def quick(cls) -> Config:
        return cls(models=("tiny",), probes=80, permutations=2000, shape="tiny",
                   vocab_sizes=(4096, 16384, 65536, 262144), layers=8, repeats=5)
