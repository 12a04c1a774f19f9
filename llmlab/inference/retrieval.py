"""BM25 retrieval over the built-in corpus: the "R" of a RAG chatbot, small enough to read.

Okapi BM25 (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond",
2009), with Lucene's non-negative idf:

    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(q, d) = sum over query terms t of  idf(t) * tf(t,d) * (k1 + 1)
                                            / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

k1 = 1.5 and b = 0.75 are the usual defaults (rank-bm25 and Lucene use the same).

Why hand-written and not `rank-bm25` / `bm25s`: the corpus here is ~1,000 passages, so an
inverted index of Python dicts answers a query in about a millisecond; a new dependency would buy
speed we do not need and hide the formula the lab wants to show. `bm25s` (sparse matrices) is
the better choice for millions of passages.

References:
- https://en.wikipedia.org/wiki/Okapi_BM25
- https://github.com/dorianbrown/rank_bm25 (BM25Okapi), https://github.com/xhluca/bm25s
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

_WORD = re.compile(r"[a-z0-9_]+")


def words(text: str) -> list[str]:
    """Lower-case word tokens (letters, digits, underscore): what BM25 counts, not the LM's BPE."""
    return _WORD.findall(text.lower())


def passages(documents: list[str], max_chars: int = 1200) -> list[str]:
    """Split documents at blank lines into passages of at most ~max_chars (paragraphs stay whole)."""
    out: list[str] = []
    for doc in documents:
        buf = ""
        for para in re.split(r"\n\s*\n", doc):
            para = para.strip()
            if not para:
                continue
            if buf and len(buf) + len(para) + 2 > max_chars:
                out.append(buf)
                buf = ""
            buf = f"{buf}\n\n{para}" if buf else para[: 4 * max_chars]
        if buf:
            out.append(buf)
    return out


@dataclass
class BM25:
    """An inverted index over `docs`; `search(query, k)` returns the top-k (index, score) pairs."""

    docs: list[str]
    k1: float = 1.5  # term-frequency saturation (Lucene / rank-bm25 default)
    b: float = 0.75  # length normalisation (Lucene / rank-bm25 default)
    postings: dict[str, list[tuple[int, int]]] = field(init=False, repr=False)  # term -> [(doc, tf)]
    lengths: list[int] = field(init=False, repr=False)
    avgdl: float = field(init=False)

    def __post_init__(self) -> None:
        if not self.docs:
            raise ValueError("BM25 needs at least one document")
        self.postings, self.lengths = {}, []
        for i, doc in enumerate(self.docs):
            tf = Counter(words(doc))
            self.lengths.append(sum(tf.values()))
            for term, n in tf.items():
                self.postings.setdefault(term, []).append((i, n))
        self.avgdl = sum(self.lengths) / len(self.lengths) or 1.0

    def idf(self, term: str) -> float:
        n, df = len(self.docs), len(self.postings.get(term, ()))
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every document that shares a term with the query."""
        out: dict[int, float] = {}
        for term in set(words(query)):
            idf = self.idf(term)
            for i, tf in self.postings.get(term, ()):
                norm = self.k1 * (1.0 - self.b + self.b * self.lengths[i] / self.avgdl)
                out[i] = out.get(i, 0.0) + idf * tf * (self.k1 + 1.0) / (tf + norm)
        return out

    def search(self, query: str, k: int = 4) -> list[tuple[int, float]]:
        ranked = sorted(self.scores(query).items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:k]


def builtin_passages(max_chars: int = 1200) -> list[str]:
    """Passages of the built-in corpus's English help topics (`pydoc_data.topics`, ~0.46 MB).

    The topics are the part of llmlab.tiny.corpus that reads fastest (one import, no parsing of
    the standard library, which takes ~20 s); they are the language reference a Python help bot
    would retrieve from.
    """
    from llmlab.tiny.corpus import topic_documents

    return passages([text for _, text in topic_documents()], max_chars)
