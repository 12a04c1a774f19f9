"""Tree speculation: the draft grows a token tree, the target scores every node in one forward.

The tree forward uses a 4D attention mask (each node sees the prefix, the root and its own
ancestors) and depth-based position ids; after the verification both caches are compacted to the
accepted path (SpecInfer, EAGLE-2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from llmlab.inference import decode
from llmlab.inference.decode import SamplingParams
from llmlab.inference.speculative.acceptance import draw, multi_candidate_verify, probs, verify_round
from llmlab.inference.speculative.rounds import Rounds, SpecGeneration, SpecStats, check_vocabulary, prefill


@dataclass(frozen=True)
class TreeShape:
    """A static token tree: `branching[d]` children per node at depth d (top-k of the draft there).

    Nodes are numbered breadth-first; the root (the last emitted token) is not a node.
    """

    branching: tuple[int, ...]
    parent: tuple[int, ...]  # parent node of each node, -1 for the root
    depth: tuple[int, ...]  # 1-based depth of each node

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def max_depth(self) -> int:
        return len(self.branching)

    def level(self, d: int) -> range:
        """Node indices at depth d (1-based), contiguous in BFS order."""
        start = sum(1 for x in self.depth if x < d)
        return range(start, start + sum(1 for x in self.depth if x == d))

    def children(self, node: int) -> list[int]:
        return [j for j, par in enumerate(self.parent) if par == node]

    @torch.inference_mode()
    def ancestors(self) -> torch.Tensor:
        """(N, N) bool: [j, k] is True when node k is node j or one of its ancestors."""
        n = self.size
        anc = torch.zeros(n, n, dtype=torch.bool, device="cpu")  # built on the host, element by element
        for j in range(n):
            k = j
            while k >= 0:
                anc[j, k] = True
                k = self.parent[k]
        return anc

    @torch.inference_mode()
    def with_root(self) -> torch.Tensor:
        """(1 + N, 1 + N) bool: the root (the last emitted token), then the nodes; each sees the root and
        its ancestors. The rows of the target's verify forward."""
        rows = torch.zeros(1 + self.size, 1 + self.size, dtype=torch.bool, device="cpu")
        rows[:, 0] = True
        rows[1:, 1:] = self.ancestors()
        return rows

    def positions(self, root: int, device) -> torch.Tensor:
        """Position ids (1 + N,) of the root at `root` and of each node at root + its depth."""
        return torch.tensor([root] + [root + d for d in self.depth], device=device)


@lru_cache(maxsize=64)
def tree_shape(branching: tuple[int, ...]) -> TreeShape:
    """The tree with `branching[d]` children per node at depth d + 1, its nodes numbered breadth-first."""
    if not branching or any(int(b) < 1 for b in branching):
        raise ValueError(f"tree branching must be positive integers per depth, got {branching}")
    parent, depth, frontier = [], [], [-1]
    for d, k in enumerate(branching, start=1):
        nxt = []
        for par in frontier:
            for _ in range(k):
                parent.append(par)
                depth.append(d)
                nxt.append(len(parent) - 1)
        frontier = nxt
    return TreeShape(tuple(branching), tuple(parent), tuple(depth))


def tree_attention_mask(anc_rows: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """A 4D additive mask (1, 1, Q, prefix_len + K): every query sees the whole prefix, then its tree ancestors.

    anc_rows (Q, K) bool: which of the K tree positions appended after the prefix each query may see.
    transformers passes a 4D mask through unchanged (masking_utils._preprocess_mask_arguments).
    """
    q, dev = anc_rows.shape[0], anc_rows.device
    allowed = torch.cat([torch.ones(q, prefix_len, dtype=torch.bool, device=dev), anc_rows], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def tree_forward(model, tokens: torch.Tensor, cache, anc_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Forward tree tokens (B, Q) appended to `cache` with ancestor-only attention; returns logits (B, Q, V)."""
    prefix = cache.get_seq_length() - (anc_rows.shape[1] - anc_rows.shape[0])
    mask = tree_attention_mask(anc_rows.to(tokens.device), prefix, next(model.parameters()).dtype)
    pos = positions.to(tokens.device).unsqueeze(0).expand(tokens.shape[0], -1)
    return decode.forward(model, tokens, cache, logits_to_keep=tokens.shape[1], attention_mask=mask,
                          position_ids=pos).float()


def compact_cache(cache, keep: torch.Tensor) -> None:
    """Keep only positions `keep` (B, L) of every layer (per row), in order: the accepted tree path."""
    for layer in cache.layers:
        if type(layer).__name__ != "DynamicLayer":
            raise ValueError(f"tree speculation needs a plain DynamicCache, got a {type(layer).__name__}")
        idx = keep[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
        layer.keys = layer.keys.gather(2, idx)
        layer.values = layer.values.gather(2, idx)


@torch.inference_mode()
def draft_tree(draft, cache, pending: torch.Tensor, shape: TreeShape, params: SamplingParams,
               children: str = "topk", generator: torch.Generator | None = None):
    """Grow the tree level by level: one draft forward per depth (all nodes of a level at once).

    children "topk": each node's children are the draft's top-k (greedy, EAGLE); "sample": drawn
    i.i.d. from q (SpecInfer). Returns node tokens (B, N) and, for "sample", q at the root and at
    every node of depth < max_depth (B, 1 + N_inner, V), else None. The draft's cache ends with the
    prefix, the root, and the nodes of depth < max_depth in BFS order (the deepest level is never fed).
    """
    B = pending.shape[0]
    qs = []
    logits = decode.forward(draft, pending, cache)[:, -1:].float()  # (B, 1, V) at the root
    root_pos = cache.get_seq_length() - 1
    anc = shape.ancestors()
    tokens = torch.empty(B, shape.size, dtype=torch.long, device=pending.device)
    for d in range(1, shape.max_depth + 1):
        k = shape.branching[d - 1]
        scores = logits if params.greedy else probs(logits, params)  # (B, n_parents, V)
        if children == "sample" and not params.greedy:
            qs.append(scores)
            flat = draw(scores.reshape(-1, scores.shape[-1]), generator, k)
            kids = flat.reshape(B, -1, k)
        else:
            kids = scores.topk(k, dim=-1).indices  # (B, n_parents, k), in the BFS order of their parents
        lvl = shape.level(d)
        tokens[:, lvl.start : lvl.stop] = kids.reshape(B, -1)
        if d == shape.max_depth:
            break
        rows = anc[lvl.start : lvl.stop, : lvl.stop]  # (Q, nodes so far)
        positions = torch.full((len(lvl),), root_pos + d, dtype=torch.long, device=pending.device)
        logits = tree_forward(draft, tokens[:, lvl.start : lvl.stop], cache, rows, positions)
    return tokens, (torch.cat(qs, dim=1) if qs else None)




def _walk_greedy(shape: TreeShape, tokens: list[int], best: list[int]) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree: (accepted path of node indices, next token)."""
    path, node = [], -1
    while True:
        want = best[node + 1]  # argmax at the root is row 0, at node j row j + 1
        child = next((c for c in shape.children(node) if tokens[c] == want), None)
        if child is None:
            return path, want
        path.append(child)
        node = child


def _walk_sampled(shape: TreeShape, tokens: list[int], p: torch.Tensor, generator,
                  q: torch.Tensor | None = None) -> tuple[list[int], int]:
    """Multi-candidate rejection down the tree: p (1 + N, V) are the target's rows; q (1 + N_inner, V) the
    draft's at the root and inner nodes when the children were sampled from it (None: top-k children)."""
    path, node = [], -1
    while True:
        kids = shape.children(node)
        if not kids:
            return path, int(draw(p[node + 1][None], generator)[0, 0])
        prop = None if q is None else q[node + 1]
        i, tok = multi_candidate_verify(p[node + 1], [tokens[c] for c in kids], generator, prop)
        if i < 0:
            return path, tok
        path.append(kids[i])
        node = kids[i]




@torch.inference_mode()
def tree_generate(
    target,
    draft,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    branching: Sequence[int] = (2, 2, 1, 1),
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    children: str = "sample",
) -> SpecGeneration:
    """Tree speculation: the draft grows a token tree, the target scores all of it in one forward.

    Greedy: top-k children, and the longest path on which every node is the target's argmax.
    Sampled: multi-candidate rejection at each node (lossless), with children drawn from q
    ("sample", SpecInfer) or the draft's top-k ("topk", EAGLE). Caches are compacted to the accepted path.
    """
    if children not in ("sample", "topk"):
        raise ValueError(f"children must be 'sample' or 'topk', got {children!r}")
    rounds = Rounds(input_ids, max_new_tokens, eos_token_id)
    check_vocabulary(target, draft)
    full = tree_shape(tuple(int(b) for b in branching))
    caches, last = prefill([target, draft], input_ids)
    pending = last  # tokens the draft has not seen, (B, k)
    while rounds.running():
        depth = min(full.max_depth, rounds.room)
        if depth == 0:  # one plain step at the length limit
            logits = decode.forward(target, last, caches[0]).float()
            rounds.stats.target_forwards += 1
            emitted = verify_round(last[:, :0], None, logits, params, generator)[1]
            accepted = [0] * input_ids.shape[0]
            pending = torch.cat([pending, emitted], dim=1)
        else:
            shape = tree_shape(full.branching[:depth])
            accepted, emitted, pending = _tree_round(target, draft, caches, last, pending, shape, params, children,
                                                     generator, rounds.stats)
        last = emitted[:, -1:]
        rounds.add(emitted, depth, accepted)
    return rounds.result()


def _tree_round(target, draft, caches, last: torch.Tensor, pending: torch.Tensor, shape: TreeShape,
                params: SamplingParams, children: str, generator, stats: SpecStats):
    """One round: draft the tree, verify all of it in one target forward, walk it, compact both caches.

    Returns (accepted nodes per row, emitted (B, m + 1), the tokens the draft has not seen). Rows advance
    by the shortest accepted path m (the min rule); a row whose path is longer emits its node at m.
    """
    t_cache, d_cache = caches
    batch, dev = last.shape[0], last.device
    t_len = t_cache.get_seq_length()  # the root `last` goes at position t_len
    tokens, q = draft_tree(draft, d_cache, pending, shape, params, children, generator)  # (B, N)
    stats.draft_forwards += shape.max_depth
    verify_in = torch.cat([last, tokens], dim=1)  # (B, 1 + N)
    logits = tree_forward(target, verify_in, t_cache, shape.with_root(), shape.positions(t_len, dev))  # (B, 1 + N, V)
    stats.target_forwards += 1
    tok_lists = tokens.tolist()
    if params.greedy:
        best = logits.argmax(-1).tolist()
        walks = [_walk_greedy(shape, tok_lists[b], best[b]) for b in range(batch)]
    else:
        p = probs(logits, params)
        walks = [_walk_sampled(shape, tok_lists[b], p[b], generator, None if q is None else q[b])
                 for b in range(batch)]
    paths = [w[0] for w in walks]
    m = min(len(pth) for pth in paths)
    nxt = torch.tensor([[w[1] if len(w[0]) == m else tok_lists[b][w[0][m]]] for b, w in enumerate(walks)],
                       dtype=torch.long, device=dev)
    compact_cache(t_cache, _kept_positions(t_len, [pth[:m] for pth in paths], dev))
    in_draft = [[j for j in pth[:m] if shape.depth[j] < shape.max_depth] for pth in paths]
    compact_cache(d_cache, _kept_positions(t_len, in_draft, dev))
    lag = m - len(in_draft[0])  # 1 when the path reached the deepest level (never fed to the draft)
    path_tokens = _path_tokens(tokens, paths, m)
    pending = torch.cat([path_tokens[:, m - lag :], nxt], dim=1)
    return [len(pth) for pth in paths], torch.cat([path_tokens, nxt], dim=1), pending


def _kept_positions(t_len: int, nodes: list[list[int]], device) -> torch.Tensor:
    """Cache positions to keep per row (B, t_len + 1 + m): the prefix, the root, then the accepted nodes."""
    return torch.tensor([list(range(t_len + 1)) + [t_len + 1 + j for j in kept] for kept in nodes], device=device)


def _path_tokens(tokens: torch.Tensor, paths: list[list[int]], m: int) -> torch.Tensor:
    """The first m accepted node tokens of each row: (B, m)."""
    if m == 0:
        return tokens[:, :0]
    idx = torch.tensor([pth[:m] for pth in paths], dtype=torch.long, device=tokens.device)
    return tokens.gather(1, idx)


