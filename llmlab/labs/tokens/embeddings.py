"""Part 2 of the tokens lab: an id's meaning is its embedding row; cosine neighbours against id neighbours."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from llmlab.core.render import track
from llmlab.labs.tokens.config import Config
from llmlab.labs.tokens.tokenization import WORD_TOKEN, _shown, encode

# ---------------------------------------------------------------- part 2: embeddings


def corpus_ids(tok, chars: int) -> np.ndarray:
    """The held-out documents of the built-in corpus (never trained on), first `chars` characters, as ids."""
    from llmlab.tiny.corpus import build_corpus

    text = build_corpus(heldout_only=True).heldout_text()[:chars]
    backend = getattr(tok, "backend_tokenizer", None)  # the Rust tokenizer: no max-length warning
    ids = backend.encode(text, add_special_tokens=False).ids if backend is not None else encode(tok, text)
    return np.asarray(ids, dtype=np.int64)


def word_tokens(tok, vocab_size: int) -> dict[int, str]:
    """id -> text of every word token (3+ ASCII letters, optional leading space) below vocab_size."""
    out = {}
    for i in range(vocab_size):
        s = tok.decode([i])
        if WORD_TOKEN.match(s):
            out[i] = s
    return out


def unit_rows(emb: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """The pool's embedding rows scaled to length 1 (P, d): a dot product of two is their cosine."""
    return torch.nn.functional.normalize(emb[pool].float(), dim=1)


def cosine_neighbours(units: torch.Tensor, pool: torch.Tensor, probe: int, k: int) -> list[int]:
    """The k ids of `pool` whose rows are nearest to the probe's row by cosine (the probe itself left out)."""
    at = pool == probe
    sims = units @ units[at.nonzero()[0, 0]]  # (P,)
    sims[at] = -2.0
    return pool[sims.topk(k).indices].tolist()


def id_neighbours(probe: int, pool: np.ndarray, k: int) -> list[int]:
    """The k ids of `pool` nearest to the probe's id (the probe itself left out; ties: the lower id first)."""
    others = pool[pool != probe]
    order = np.lexsort((others, np.abs(others - probe)))
    return others[order[:k]].tolist()


def same_word(a: str, b: str) -> bool:
    """Case variants and a shared stem: " list" ~ "List" ~ " lists" (the shorter, 4+ letters, begins the longer)."""
    a, b = a.strip().lower(), b.strip().lower()
    short, long_ = sorted((a, b), key=len)
    return short == long_ or (len(short) >= 4 and long_.startswith(short))


class Cooccurrence:
    """How often token b falls within +-window tokens of an occurrence of token a, against independence."""

    def __init__(self, ids: np.ndarray, window: int):
        self.ids, self.window, self.n = ids, window, len(ids)
        self.positions: dict[int, np.ndarray] = {}
        order = np.argsort(ids, kind="stable")
        bounds = np.flatnonzero(np.diff(ids[order])) + 1
        for chunk in np.split(order, bounds):
            if len(chunk):
                self.positions[int(ids[chunk[0]])] = chunk

    def count(self, t: int) -> int:
        return len(self.positions.get(t, ()))

    def near(self, a: int) -> np.ndarray:
        """A mask of the positions within +-window of some occurrence of a (a's own positions left out)."""
        mask = np.zeros(self.n, dtype=bool)
        pos = self.positions.get(a, np.empty(0, dtype=np.int64))
        for off in range(-self.window, self.window + 1):
            if off:
                p = pos + off
                mask[p[(p >= 0) & (p < self.n)]] = True
        mask[pos] = False
        return mask

    def observed_expected(self, near_a: np.ndarray, b: int) -> tuple[int, float]:
        """(occurrences of b near a, what independence predicts: count(b) x the share of positions near a)."""
        pos = self.positions.get(b, np.empty(0, dtype=np.int64))
        return int(near_a[pos].sum()), len(pos) * near_a.mean()


def sign_flip_pvalue(diffs: np.ndarray, permutations: int, seed: int) -> float:
    """One-sided paired permutation test of mean(diffs) > 0: flip each difference's sign at random.

    p = (1 + #{flipped means >= the observed mean}) / (1 + permutations), never 0 (Phipson & Smyth 2010).
    """
    diffs = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(permutations, len(diffs)))
    flipped = (signs * diffs).mean(axis=1)
    return float((1 + np.sum(flipped >= diffs.mean() - 1e-12)) / (1 + permutations))


def neighbour_rows(emb: torch.Tensor, tok, label: str, ids: np.ndarray, cfg: Config, progress=None) -> list[dict]:
    """Per probe word: its k cosine and k id neighbours among the word tokens, and which are related."""
    words = word_tokens(tok, emb.shape[0])
    co = Cooccurrence(ids, cfg.window)
    counts = sorted(((co.count(t), t) for t in words if co.count(t) >= cfg.cooc_min), reverse=True)
    probes = [t for _, t in counts[:cfg.probes]]
    pool = np.asarray(sorted(words), dtype=np.int64)
    pool_t = torch.as_tensor(pool, device=emb.device)  # on the embedding's device: the masks and indices meet it there
    units = unit_rows(emb, pool_t)  # (P, d), once: a large vocabulary's rows are normalised a single time
    rows = []
    for p in track(progress, probes, f"embeddings: neighbours ({label})"):
        near = co.near(p)
        for kind, found in (("cosine", cosine_neighbours(units, pool_t, p, cfg.k)),
                            ("id", id_neighbours(p, pool, cfg.k))):
            for rank, b in enumerate(found, 1):
                obs, exp = co.observed_expected(near, b)
                variant = same_word(words[p], words[b])
                cooc = obs >= cfg.cooc_min and obs >= cfg.cooc_ratio * exp
                rows.append(dict(model=label, probe=words[p], probe_id=p, kind=kind, rank=rank, neighbour=words[b],
                                 neighbour_id=b, id_distance=abs(b - p), cooc=obs, cooc_expected=exp,
                                 variant=variant, related=variant or cooc))
    return rows


def embedding_summary(nb: pd.DataFrame, cfg: Config) -> list[dict]:
    """Per model: the related share of each kind of neighbour, and the paired permutation test's p."""
    rows = []
    for label, df in nb.groupby("model", sort=False):
        per = df.groupby(["probe_id", "kind"]).related.mean().unstack("kind")  # (probes, {cosine, id})
        diffs = (per["cosine"] - per["id"]).to_numpy()
        p = sign_flip_pvalue(diffs, cfg.permutations, cfg.seed)
        for kind in ("cosine", "id"):
            sub = df[df.kind == kind]
            rows.append(dict(model=label, kind=kind, probes=len(per), pairs=len(sub), related_share=sub.related.mean(),
                             variant_share=sub.variant.mean(), median_id_distance=float(sub.id_distance.median()),
                             p_value=p, permutations=cfg.permutations))
    return rows


def example_rows(nb: pd.DataFrame, n: int = 8) -> list[dict]:
    """The first model's most frequent probes, neighbours side by side (related ones marked *)."""
    first = nb[nb.model == nb.model.iloc[0]]
    rows = []
    for pid in list(dict.fromkeys(first.probe_id))[:n]:
        sub = first[first.probe_id == pid]

        def names(kind, sub=sub):
            s = sub[sub.kind == kind]
            return ", ".join(_shown(w) + ("*" if r else "") for w, r in zip(s.neighbour, s.related, strict=True))

        rows.append(dict(model=sub.model.iloc[0], word=_shown(sub.probe.iloc[0]), word_id=int(pid),
                         cosine=names("cosine"), by_id=names("id")))
    return rows
