"""Speculative decoding: nothing changes but the speed.

- greedy: speculative output == plain greedy of the target, token for token (FP32), chain, policies, tree;
- sampled: the exact output law of `speculative_generate` and `tree_generate` themselves, enumerated
  by a random source that walks every branch, equals the target's (a trigram table LM with a KV cache:
  cheap enough to enumerate); B = 1 runs over many seeds pass a chi-square test of the JOINT law of
  their first tokens, and they did take multi-token accepts, residual draws at positions 2-3 and bonus
  tokens; batched samples pass a chi-square test too;
- edge cases: p == q, disjoint supports, a one-hot draft, EOS inside a draft, the length limit;
- the tree forward (4D mask, depth positions) equals sequential forwards of each path.

Chi-square tests use significance 0.001 (a correct sampler fails with probability 0.1%; the seeds are
fixed, so a run is reproducible) and sample counts that detect Cohen's w >= 0.1 with power > 0.8.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from llmlab.core import stats as st
from llmlab.inference import decode
from llmlab.inference import speculative as S
from llmlab.inference.decode import SamplingParams
from llmlab.inference.speculative import acceptance
from llmlab.inference.speculative import lookup as ngram_lookup

SIGNIFICANCE = st.SIGNIFICANCE
V = 5  # toy vocabulary: small enough to enumerate every sequence


def _toy(seed: int, vocab: int = V, layers: int = 2, scale: float = 25.0):
    """A random Llama with peaked next-token distributions (scaled LM head), FP32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These tests check behaviour, not speed: one thread avoids OpenMP stalls on a shared CPU."""
    from llmlab.core.device import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def toy_pair():
    return _toy(1), _toy(2, layers=1)


@pytest.fixture(scope="module")
def tiny_pair():
    from llmlab.core.models import load

    return load("tiny", "cpu").model, load("tiny-draft", "cpu").model, load("tiny", "cpu").tokenizer


def _first_divergence(a: torch.Tensor, b: torch.Tensor) -> str:
    a, b = a.flatten().tolist(), b.flatten().tolist()
    if len(a) != len(b):
        return f"lengths differ: {len(a)} vs {len(b)}"
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    return "identical" if i is None else f"first divergence at new token {i}: {a[i]} vs {b[i]}"


def _chisquare(counts: dict, law: dict, n: int) -> float:
    return st.chisquare_pvalue(counts, law, n)[0]


def _power_n(cells: int) -> int:
    """Samples that detect Cohen's w = 0.1 with power 0.8 at SIGNIFICANCE."""
    return st.samples_for_effect(cells, w=0.1, significance=SIGNIFICANCE)


# ---------------------------------------------------------------- verify on its own


def _random_dists(g: int, vocab: int, seed: int, peaked: float = 3.0):
    gen = torch.Generator().manual_seed(seed)
    p = (torch.randn(g + 1, vocab, generator=gen) * peaked).softmax(-1)
    q = (torch.randn(g, vocab, generator=gen) * peaked).softmax(-1)
    return p, q


def _first_token_law(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Exact law of the first emitted token with a 1-token draft x ~ q[0]: sum_x q(x) [acc x + (1-acc) residual]."""
    law = torch.zeros(p.shape[-1], dtype=torch.float64)
    for x in range(p.shape[-1]):
        if q[0, x] == 0:
            continue
        acc, nd = S.rejection_plan(torch.tensor([[x]]), q[None, :1], p[None, :2])
        law += float(q[0, x]) * (float(acc[0, 0]) * torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).double()
                                 + (1 - float(acc[0, 0])) * nd[0, 0].double())
    return law


@pytest.mark.parametrize("case", ["random", "p_equals_q", "disjoint", "one_hot_draft"])
def test_first_token_law_is_p_exactly(case):
    p, q = _random_dists(1, 7, seed=3)
    if case == "p_equals_q":
        q = p[:1].clone()
    elif case == "disjoint":
        p[0, :3], q[0, 3:] = 0, 0
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    elif case == "one_hot_draft":
        q = torch.nn.functional.one_hot(q.argmax(-1), 7).float()
    assert torch.allclose(_first_token_law(q, p), p[0].double(), atol=1e-6)


def test_p_equals_q_accepts_everything_and_disjoint_rejects_at_once():
    p, _ = _random_dists(4, 9, seed=5)
    gen = torch.Generator().manual_seed(0)
    B = 2000
    x = torch.multinomial(p[:4], B, replacement=True, generator=gen).T  # (B, 4) drawn from q = p[:4]
    n, _ = S.verify_rows(x, p[None, :4].expand(B, -1, -1), p[None].expand(B, -1, -1), gen)
    assert (n == 4).all()
    pd = p.clone()
    pd[:, :4] = 0
    pd = pd / pd.sum(-1, keepdim=True)
    qd = torch.zeros(4, 9)
    qd[:, :4] = 0.25
    x = torch.multinomial(qd, B, replacement=True, generator=gen).T
    n, nxt = S.verify_rows(x, qd[None].expand(B, -1, -1), pd[None].expand(B, -1, -1), gen)
    assert (n == 0).all()
    counts = torch.bincount(nxt[:, 0], minlength=9)
    assert counts[:4].sum() == 0  # the residual is p itself: never a draft-only token
    law = {i: float(pd[0, i]) for i in range(9)}
    assert _chisquare({i: int(c) for i, c in enumerate(counts)}, law, B) > SIGNIFICANCE


def test_verify_counts_match_the_plan_chi_square():
    """verify's sampled (n_accepted, next) pairs follow rejection_plan's exact law."""
    g, vocab = 3, 6
    p, q = _random_dists(g, vocab, seed=11, peaked=1.5)
    x = torch.tensor([int(q[i].argmax()) for i in range(g)])  # a likely draft
    acc, nd = S.rejection_plan(x[None], q[None], p[None])
    acc, nd = acc[0].double(), nd[0].double()
    law = {}
    for n in range(g + 1):
        pn = float(acc[:n].prod() * ((1 - acc[n]) if n < g else 1))
        for t in range(vocab):
            law[(n, t)] = pn * float(nd[n, t])
    N = _power_n(sum(1 for v in law.values() if v > 0))
    gen = torch.Generator().manual_seed(7)
    n, nxt = S.verify_rows(x[None].expand(N, -1), q[None].expand(N, -1, -1), p[None].expand(N, -1, -1), gen)
    counts: dict = {}
    for key in zip(n.tolist(), nxt[:, 0].tolist(), strict=True):
        counts[key] = counts.get(key, 0) + 1
    assert _chisquare(counts, law, N) > SIGNIFICANCE
    for seed in range(5):  # the 1-D function is the batched one on one row: same draws, same answer
        one = S.verify(x, q, p, torch.Generator().manual_seed(seed))
        n1, nxt1 = S.verify_rows(x[None], q[None], p[None], torch.Generator().manual_seed(seed))
        assert one == (int(n1[0]), int(nxt1[0, 0]))


def test_greedy_verify():
    logits = torch.tensor([[0.0, 5, 0], [9, 0, 0], [0, 0, 3]])  # target argmax: 1, 0, 2
    assert S.verify_greedy(torch.tensor([1, 0]), logits) == (2, 2)
    assert S.verify_greedy(torch.tensor([1, 2]), logits) == (1, 0)
    assert S.verify_greedy(torch.tensor([0, 0]), logits) == (0, 1)


@pytest.mark.parametrize("children", ["topk", "sample"])
def test_multi_candidate_verify_is_p(children):
    p, q = _random_dists(1, 6, seed=2, peaked=1.0)
    p, q = p[0], q[0]
    N = _power_n(6)
    gen = torch.Generator().manual_seed(3)
    counts: dict = {}
    for _ in range(N):
        if children == "topk":  # EAGLE: the draft's top-3, one-hot proposals
            _, tok = S.multi_candidate_verify(p, q.topk(3).indices.tolist(), gen)
        else:  # SpecInfer: 3 candidates drawn i.i.d. from q, proposal q
            drawn = torch.multinomial(q, 3, replacement=True, generator=gen).tolist()
            _, tok = S.multi_candidate_verify(p, drawn, gen, q)
        counts[tok] = counts.get(tok, 0) + 1
    assert _chisquare(counts, {i: float(p[i]) for i in range(6)}, N) > SIGNIFICANCE


# ---------------------------------------------------------------- device discipline


@pytest.mark.parametrize("method", ["chain", "tree sample", "tree topk", "tree greedy", "lookup"])
def test_every_tensor_is_made_on_the_device_of_its_data(toy_pair, method):
    """Every tensor of a loop is made on the device of the data it meets (a CUDA generator drew on a CPU
    acceptance tensor: every sampled tree walk crashed on CUDA). With the default device set to `meta`, a
    tensor made without naming its device lands on meta, and reading it or mixing it with the CPU data
    raises: on a GPU that same tensor would have landed on the CPU."""
    target, draft = toy_pair
    ids, gen, p = torch.tensor([[1, 2, 3]]), torch.Generator().manual_seed(0), SamplingParams(temperature=1.0)
    run = {"chain": lambda: S.speculative_generate(target, draft, ids, 10, gamma=3, params=p, generator=gen),
           "tree sample": lambda: S.tree_generate(target, draft, ids, 10, params=p, generator=gen),
           "tree topk": lambda: S.tree_generate(target, draft, ids, 10, params=p, generator=gen, children="topk"),
           "tree greedy": lambda: S.tree_generate(target, draft, ids, 10),
           "lookup": lambda: S.lookup_generate(target, ids, 10, params=p, generator=gen)}[method]
    with torch.device("meta"):
        out = run()
    assert out.tokens.device == ids.device and out.n_new == 10
    with torch.device("meta"):  # the walk's own step, on its own: accept/reject at one tree node
        i, tok = S.multi_candidate_verify(torch.tensor([0.5, 0.5], device="cpu"), [1], gen)
    assert tok in (0, 1) and i in (-1, 0)


# ---------------------------------------------------------------- exact enumeration on a toy model


class _Exact:
    """Next-token laws of a model from full forwards (no cache), memoised by prefix."""

    def __init__(self, model, params: SamplingParams):
        self.model, self.params, self.memo = model, params, {}

    @torch.no_grad()
    def __call__(self, seq: tuple[int, ...]) -> torch.Tensor:
        if seq not in self.memo:
            logits = self.model(input_ids=torch.tensor([seq])).logits[:, -1].float()
            pr = S.probs(logits, self.params)[0].double()
            self.memo[seq] = pr / pr.sum()  # exactly normalised in float64, so the laws compare to 1e-12
        return self.memo[seq]


def _target_law(p: _Exact, prompt: tuple, L: int) -> dict:
    law = {}
    for ys in itertools.product(range(V), repeat=L):
        pr, seq = 1.0, prompt
        for y in ys:
            pr *= float(p(seq)[y])
            seq += (y,)
        if pr > 0:
            law[ys] = pr
    return law


def _table_law(model, prompt: tuple, L: int, params: SamplingParams) -> dict:
    """The target's exact law of L tokens after `prompt`, from full forwards of every context."""
    p, vocab = _Exact(model, params), model.config.vocab_size
    law = {}
    for ys in itertools.product(range(vocab), repeat=L):
        pr, seq = 1.0, prompt
        for y in ys:
            pr *= float(p(seq)[y])
            seq += (y,)
        if pr > 0:
            law[ys] = pr
    return law


class _TableLM(torch.nn.Module):
    """A trigram LM over a KV cache, as cheap as a table lookup: next-token logits = table[a, b], where
    b is the token itself and a the one before it in the query's context.

    It stores (token, position) pairs as its cache "keys", so cropping and tree compaction act on it
    as on a transformer's cache, and it honours a 4D tree attention mask: a query's context is the
    keys it may attend to, in position order. A cache or mask bug changes `a` and so the law.
    """

    def __init__(self, table: torch.Tensor):
        from transformers import LlamaConfig

        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)  # (V + 1, V, V): row V = "no token before"
        v = table.shape[-1]
        self.config = LlamaConfig(vocab_size=v, num_hidden_layers=1, hidden_size=8, num_attention_heads=1,
                                  num_key_value_heads=1, head_dim=2, eos_token_id=None, bos_token_id=None,
                                  pad_token_id=None)

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0, attention_mask=None,
                position_ids=None, **kw):
        from types import SimpleNamespace

        B, T = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T).expand(B, -1)
        kv = torch.stack([input_ids.float(), position_ids.float()], -1)[:, None]  # (B, 1, T, 2)
        if past_key_values is not None:
            kv, _ = past_key_values.update(kv, kv, 0)  # (B, 1, past + T, 2)
        tok, pos = kv[:, 0, :, 0].long(), kv[:, 0, :, 1].long()  # (B, K)
        K = tok.shape[1]
        if attention_mask is not None and attention_mask.dim() == 4:
            allowed = attention_mask[0, 0] == 0  # (T, K)
        else:
            allowed = torch.arange(K)[None, :] <= (K - T + torch.arange(T))[:, None]  # causal
        v = self.table.shape[-1]
        logits = torch.empty(B, T, v)
        for b in range(B):
            for i in range(T):
                keys = allowed[i].nonzero().flatten().tolist()
                keys.sort(key=lambda j: int(pos[b, j]))
                ctx = [int(tok[b, j]) for j in keys]
                a = ctx[-2] if len(ctx) > 1 else v
                logits[b, i] = self.table[a, ctx[-1]]
        keep = logits_to_keep or T
        return SimpleNamespace(logits=logits[:, -keep:])


def _table_pair(vocab: int = 4, seed: int = 0, noise: float = 1.0):
    """A target trigram table and a draft that agrees with it only partly (the target's logits plus noise)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(vocab + 1, vocab, vocab, generator=gen) * 1.5
    d = t + noise * torch.randn(t.shape, generator=gen)
    return _TableLM(t), _TableLM(d)


class _Enumerate:
    """A random source for speculative_generate / tree_generate that walks every branch (depth first).

    Each call of the loop follows one path: choices already on the path are replayed, a new choice
    point takes its first outcome and leaves the others for later runs. `prob` is the path's exact
    probability (float64), so summing outputs over all paths gives the loop's exact output law.
    """

    def __init__(self):
        self.todo: list[list[int]] = [[]]
        self.path: list[int] = []
        self.at = 0
        self.prob = 1.0

    def next_path(self) -> bool:
        if not self.todo:
            return False
        self.path, self.at, self.prob = self.todo.pop(), 0, 1.0
        return True

    def _choose(self, outcomes: list[tuple[object, float]]):
        if self.at == len(self.path):
            self.todo += [self.path + [i] for i in range(1, len(outcomes))]
            self.path = self.path + [0]
        value, pr = outcomes[self.path[self.at]]
        self.at += 1
        self.prob *= pr
        return value

    def categorical(self, p: torch.Tensor, k: int) -> torch.Tensor:
        rows = []
        for row in p.double():
            row = row / row.sum()
            support = [(i, float(row[i])) for i in row.nonzero().flatten().tolist()]
            rows.append([self._choose(support) for _ in range(k)])
        return torch.tensor(rows, dtype=torch.long, device=p.device)

    def bernoulli(self, p: torch.Tensor) -> torch.Tensor:
        out = []
        for x in p.double().flatten().tolist():
            x = min(1.0, max(0.0, x))
            out.append(self._choose([o for o in ((True, x), (False, 1 - x)) if o[1] > 0]))
        return torch.tensor(out, dtype=torch.bool, device=p.device).reshape(p.shape)


def _enumerated_law(fn) -> dict:
    """The exact law of fn(generator) -> tokens (1, L), by running fn once per random path."""
    src, law, runs = _Enumerate(), {}, 0
    while src.next_path():
        out = tuple(fn(src).tokens[0].tolist())
        law[out] = law.get(out, 0.0) + src.prob
        runs += 1
    return law


ENUM_CASES = {  # (what, output length): every case covers a multi-token accept, a residual and a bonus token
    # (gamma 3 is enumerable too, 20x the paths: the B = 1 chi-square test below covers it)
    "chain gamma=2": (lambda t, d, ids, L, pr, g: S.speculative_generate(t, d, ids, L, gamma=2, params=pr,
                                                                         generator=g), 3),
    "tree sampled": (lambda t, d, ids, L, pr, g: S.tree_generate(t, d, ids, L, branching=(2, 1), params=pr,
                                                                 generator=g), 3),
    "tree top-k": (lambda t, d, ids, L, pr, g: S.tree_generate(t, d, ids, L, branching=(2, 1), params=pr, generator=g,
                                                              children="topk"), 3),
}


@pytest.mark.parametrize("case", list(ENUM_CASES))
def test_exact_enumeration_equals_target(case):
    """speculative_generate / tree_generate themselves, every random branch walked with its probability:
    the output law equals the target's to float32 rounding (a lossy residual or bonus would be off by ~0.01)."""
    fn, L = ENUM_CASES[case]
    target, draft = _table_pair()
    params = SamplingParams(temperature=1.0, top_k=2)
    prompt = (1, 3)
    got = _enumerated_law(lambda src: fn(target, draft, torch.tensor([prompt]), L, params, src))
    want = _table_law(target, prompt, L, params)
    assert abs(sum(got.values()) - 1) < 1e-6
    tv = 0.5 * sum(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want))
    assert tv < 1e-6, f"total variation {tv}"


def test_enumeration_catches_a_lossy_verifier(monkeypatch):
    """The enumeration can fail: a verifier that forgets the residual (draws from p at a rejection) is caught."""
    target, draft = _table_pair()
    params = SamplingParams(temperature=1.0, top_k=2)

    def lossy(draft_tokens, draft_probs, target_probs):
        accept, _ = real(draft_tokens, draft_probs, target_probs)
        return accept, target_probs  # p instead of norm(max(0, p - q))

    real = acceptance.rejection_plan
    monkeypatch.setattr(acceptance, "rejection_plan", lossy)  # verify_rows looks it up in its own module
    got = _enumerated_law(lambda src: S.speculative_generate(target, draft, torch.tensor([[1, 3]]), 3, gamma=2,
                                                              params=params, generator=src))
    want = _table_law(target, (1, 3), 3, params)
    assert 0.5 * sum(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want)) > 1e-3


B1_RUNS = 600  # B = 1 runs per method: a departure of Cohen's w ~0.26 (on ~25 cells) is found with power 0.8


@pytest.mark.parametrize("method", ["chain gamma=3", "tree sampled"])
def test_b1_joint_law_of_first_tokens_chi_square(method):
    """B = 1 runs over many seeds, the JOINT law of the first 3 tokens and of all 4 against
    the target's, chi-square; the runs did accept several drafts, draw residuals at 2-3 and bonus tokens."""
    from llmlab.labs.speculative.correctness import coverage

    target, draft = _table_pair(vocab=4, seed=1)
    params = SamplingParams(temperature=1.0, top_k=3)
    prompt, L = (2, 1), 4
    law = _table_law(target, prompt, L, params)
    ids, gen = torch.tensor([prompt]), torch.Generator()
    outs, cov = [], {"multi_accept_rounds": 0, "residual_draws": 0, "bonus_tokens": 0}
    for seed in range(B1_RUNS):
        gen.manual_seed(seed)
        if method == "chain gamma=3":
            out = S.speculative_generate(target, draft, ids, L, gamma=3, params=params, generator=gen)
        else:
            out = S.tree_generate(target, draft, ids, L, branching=(2, 2, 1), params=params, generator=gen,
                                  children="sample" if method == "tree sampled" else "topk")
        outs.append(tuple(out.tokens[0].tolist()))
        for k, v in coverage(out.stats, L).items():
            cov[k] += v
    assert cov["multi_accept_rounds"] > 50 and cov["residual_draws"] > 50 and cov["bonus_tokens"] > 50, cov
    first3: dict = {}
    for k, v in law.items():
        first3[k[:3]] = first3.get(k[:3], 0.0) + v
    for keep, exact in ((3, first3), (4, law)):
        counts: dict = {}
        for o in outs:
            counts[o[:keep]] = counts.get(o[:keep], 0) + 1
        p, cells = st.chisquare_pvalue(counts, exact, B1_RUNS)
        assert cells >= 15 and st.detectable_effect(cells, B1_RUNS) < 0.3  # the test has power, not just a pass
        assert p > SIGNIFICANCE, f"{method}, first {keep} tokens: p = {p:.2e}"


def test_b1_chi_square_catches_a_lossy_bonus(monkeypatch):
    """The B = 1 test can fail: a bonus token drawn from the draft's q instead of p is rejected."""
    target, draft = _table_pair(vocab=4, seed=1)
    params = SamplingParams(temperature=1.0, top_k=3)
    real = acceptance.rejection_plan

    def lossy(draft_tokens, draft_probs, target_probs):
        accept, nd = real(draft_tokens, draft_probs, target_probs)
        return accept, torch.cat([nd[:, :-1], draft_probs[:, -1:]], 1)  # the bonus from q at the last draft

    monkeypatch.setattr(acceptance, "rejection_plan", lossy)
    law = _table_law(target, (2, 1), 4, params)
    gen, counts = torch.Generator(), {}
    for seed in range(B1_RUNS):
        gen.manual_seed(seed)
        o = tuple(S.speculative_generate(target, draft, torch.tensor([[2, 1]]), 4, gamma=3, params=params,
                                         generator=gen).tokens[0].tolist())
        counts[o] = counts.get(o, 0) + 1
    assert st.chisquare_pvalue(counts, law, B1_RUNS)[0] < SIGNIFICANCE


# ---------------------------------------------------------------- the sampler, end to end, chi-square


def _counts(tokens: torch.Tensor) -> dict:
    counts: dict = {}
    for row in tokens.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts


@pytest.mark.parametrize("mode", ["chain", "tree-sample", "tree-topk"])
def test_sampled_output_has_the_target_distribution(toy_pair, mode):
    target, draft = toy_pair
    params = SamplingParams(temperature=1.0)
    p = _Exact(target, params)
    prompt = (2, 4)
    L = 2
    law = _target_law(p, prompt, L)
    lib = S.exact_law(target, torch.tensor([prompt]), L, params)  # the lab's exact law agrees with enumeration
    assert set(lib) == set(law) and all(abs(lib[k] - law[k]) < 1e-6 for k in law)
    N = _power_n(sum(1 for v in law.values() if v * 8000 >= 5) + 1)
    ids = torch.tensor([prompt]).expand(N, -1)
    gen = torch.Generator().manual_seed(5)
    if mode == "chain":
        out = S.speculative_generate(target, draft, ids, L, gamma=3, params=params, generator=gen)
    else:
        out = S.tree_generate(target, draft, ids, L, branching=(2, 2), params=params, generator=gen,
                              children=mode.split("-")[1])
    assert out.tokens.shape == (N, L)
    assert _chisquare(_counts(out.tokens), law, N) > SIGNIFICANCE
    # per position: the marginal of the first new token alone
    first = {(y,): sum(v for k, v in law.items() if k[0] == y) for y in range(V)}
    assert _chisquare(_counts(out.tokens[:, :1]), first, N) > SIGNIFICANCE


def test_exact_enumeration_prompt_lookup_equals_target():
    """The prompt-lookup draft (a one-hot q) through the same verification: the loop's exact output law
    equals the target's, and the walk took multi-token accepts, residual draws and a full accept."""
    target, _ = _table_pair()
    params = SamplingParams(temperature=1.0, top_k=2)
    prompt, L = (2, 3, 0, 2, 3), 4  # "2 3" occurred before: the first round drafts "0 2 3"
    seen = {"multi": 0, "residual": 0, "full": 0}

    def run(src):
        out = S.speculative_generate(target, S.PromptLookup(max_ngram=2, num_draft=3), torch.tensor([prompt]), L,
                                     params=params, generator=src)
        for g, (n,) in zip(out.stats.drafted, out.stats.accepted, strict=True):
            seen["multi"] += g > 0 and n >= 2
            seen["residual"] += 0 < g and n < g
            seen["full"] += 0 < g == n
        return out

    got = _enumerated_law(run)
    want = _table_law(target, prompt, L, params)
    tv = 0.5 * sum(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want))
    assert abs(sum(got.values()) - 1) < 1e-6 and tv < 1e-6, f"total variation {tv}"
    assert all(seen.values()), seen


def test_enumeration_catches_a_lossy_lookup_verifier(monkeypatch):
    """The same enumeration fails when a rejected lookup token is drawn again (residual p, not p - onehot)."""
    target, _ = _table_pair()
    params = SamplingParams(temperature=1.0, top_k=2)
    monkeypatch.setattr(ngram_lookup, "one_hot_q", lambda drafts, vocab: torch.zeros(*drafts.shape, vocab))
    prompt = (2, 3, 0, 2, 3)
    got = _enumerated_law(lambda src: S.speculative_generate(target, S.PromptLookup(max_ngram=2, num_draft=3),
                                                             torch.tensor([prompt]), 4, params=params, generator=src))
    want = _table_law(target, prompt, 4, params)
    assert 0.5 * sum(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want)) > 1e-3


def test_ngram_index_finds_the_latest_longest_match():
    ix = S.PromptLookup(max_ngram=3, min_ngram=1, num_draft=3).index([5, 6, 7, 8, 9, 6, 7, 1, 2, 5, 6, 7])
    assert ix.propose(3) == [8, 9, 6]  # "5 6 7" (n = 3) beats the later "6 7" (n = 2)
    ix.extend([4])
    assert ix.propose(3) == []  # nothing ever followed "... 4"
    ix = S.PromptLookup(max_ngram=2, min_ngram=1, num_draft=2).index([1, 2, 3, 1, 2, 4, 2])
    assert ix.propose(2) == [4, 2]  # "4 2" never occurred before; "2" did, last followed by "4 2"
    assert S.PromptLookup(min_ngram=2, max_ngram=2).index([1, 2, 1]).propose(5) == []  # "2 1" is new
    with pytest.raises(ValueError):
        S.PromptLookup(max_ngram=1, min_ngram=2)


# ---------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_identity_on_the_builtin_pair(tiny_pair, gamma):
    target, draft, tok = tiny_pair
    for text in ("def __init__(self, name, value=None):\n", "The for statement is used to"):
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        ref = decode.generate(target, ids, 40).tokens
        out = S.speculative_generate(target, draft, ids, 40, gamma=gamma).tokens
        assert torch.equal(out, ref), _first_divergence(out, ref)


def test_greedy_identity_policies_and_tree(tiny_pair):
    target, draft, tok = tiny_pair
    ids = tok("import os\nimport sys\n\n\ndef main():\n", return_tensors="pt", add_special_tokens=False)["input_ids"]
    ref = decode.generate(target, ids, 40).tokens
    runs = S.oracle_run_lengths(draft, ids, ref)
    for policy in (S.HeuristicGamma(2), S.ConfidenceGamma(0.5), S.OracleGamma(runs)):
        out = S.speculative_generate(target, draft, ids, 40, policy=policy)
        assert torch.equal(out.tokens, ref), f"{policy.name}: {_first_divergence(out.tokens, ref)}"
    oracle = S.speculative_generate(target, draft, ids, 40, policy=S.OracleGamma(runs))
    assert S.acceptance_metrics(oracle.stats)["alpha"] > 0.99  # the oracle never drafts a wrong token
    for branching in ((1, 1, 1), (3, 2, 1)):
        out = S.tree_generate(target, draft, ids, 40, branching=branching)
        assert torch.equal(out.tokens, ref), f"tree {branching}: {_first_divergence(out.tokens, ref)}"


def test_greedy_identity_batched_min_rule(toy_pair):
    target, draft = toy_pair
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (6, 4), generator=gen)
    ref = decode.generate(target, ids, 12).tokens
    assert torch.equal(S.speculative_generate(target, draft, ids, 12, gamma=3).tokens, ref)
    assert torch.equal(S.tree_generate(target, draft, ids, 12, branching=(2, 1, 1)).tokens, ref)


def _workload_prompts(tok) -> dict:
    from llmlab.inference import workloads as W

    enc = lambda t: tok(t, return_tensors="pt", add_special_tokens=False)["input_ids"]  # noqa: E731
    return {"quote": enc(W.prompts("quote", 1)[0]), "edit": enc(W.prompts("edit", 1)[0]),
            "open": enc("The for statement is used to iterate over the elements of")}


@pytest.mark.parametrize("lookup", [S.PromptLookup(), S.PromptLookup(max_ngram=4, min_ngram=2, num_draft=4)])
def test_greedy_identity_prompt_lookup_on_every_workload(tiny_pair, lookup):
    target, _, tok = tiny_pair
    for name, ids in _workload_prompts(tok).items():
        ref = decode.generate(target, ids, 40).tokens
        out = S.speculative_generate(target, lookup, ids, 40)
        assert torch.equal(out.tokens, ref), f"{name}: {_first_divergence(out.tokens, ref)}"
        assert sum(out.stats.emitted) == 40 and out.stats.target_forwards <= 41


def test_greedy_identity_prompt_lookup_batched_and_eos(toy_pair):
    target, _ = toy_pair
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (6, 8), generator=gen)
    ref = decode.generate(target, ids, 12).tokens
    assert torch.equal(S.lookup_generate(target, ids, 12, S.PromptLookup(num_draft=4)).tokens, ref)
    ref = decode.generate(target, ids[:1], 12, eos_token_id=0).tokens
    out = S.lookup_generate(target, ids[:1], 12, S.PromptLookup(num_draft=4), eos_token_id=0).tokens
    assert torch.equal(out, ref), _first_divergence(out, ref)


def test_hf_prompt_lookup_matches_plain_greedy(tiny_pair):
    target, _, tok = tiny_pair
    ids = _workload_prompts(tok)["quote"]
    ref = decode.generate(target, ids, 24).tokens
    hf = decode.hf_generate(target, ids, 24, prompt_lookup_num_tokens=4)
    assert torch.equal(hf, ref)


def test_hf_assisted_matches_plain_greedy(tiny_pair):
    target, draft, tok = tiny_pair
    ids = tok("Return the number of", return_tensors="pt", add_special_tokens=False)["input_ids"]
    ref = decode.generate(target, ids, 24).tokens
    before = draft.generation_config.to_dict()
    hf = S.hf_assisted_generate(target, draft, ids, 24, gamma=4)
    assert draft.generation_config.to_dict() == before  # the assistant's settings are restored
    assert torch.equal(hf, ref)  # the whole output: no EOS handling on either side
    for kw in (dict(gamma=None, schedule=None, confidence=None), dict(gamma=2, schedule="heuristic", confidence=0.0)):
        hf = S.hf_assisted_generate(target, draft, ids, 24, **kw)  # HF's own dynamic settings (the benchmark's peer)
        assert torch.equal(hf, ref) and draft.generation_config.to_dict() == before, kw


def test_hf_generate_runs_with_our_settings(monkeypatch):
    """The peer and our loop run alike: inference mode, and no per-token EOS handling, so HF emits and
    runs past EOS exactly as `decode.generate` with eos_token_id None does (min_new_tokens masked EOS
    at every step, and its output differed from ours wherever the target chose EOS)."""
    target, draft = _toy(2), _toy(102, layers=1)
    ids = torch.tensor([[1, 1]])
    ref = decode.generate(target, ids, 12).tokens
    assert (ref == target.config.eos_token_id).any()  # this toy target emits EOS mid-way
    assert torch.equal(decode.hf_generate(target, ids, 12), ref)
    assert torch.equal(S.hf_assisted_generate(target, draft, ids, 12, gamma=3), ref)
    seen = {}
    real = type(target).generate

    def spy(self, *a, **kw):
        seen.update(inference=torch.is_inference_mode_enabled(), kw=kw)
        return real(self, *a, **kw)

    monkeypatch.setattr(type(target), "generate", spy)
    decode.hf_generate(target, ids, 4)
    assert seen["inference"] and seen["kw"]["eos_token_id"] is None and "min_new_tokens" not in seen["kw"]


# ---------------------------------------------------------------- edge cases in the loop


@pytest.mark.parametrize("gamma", [1, 2, 5])
def test_eos_inside_a_draft(toy_pair, gamma):
    target, draft = toy_pair
    ids = torch.tensor([[1, 2, 3]])
    free = decode.generate(target, ids, 10).tokens[0].tolist()
    eos = free[4]  # a token the target emits mid-way: it lands inside some draft window
    ref = decode.generate(target, ids, 10, eos_token_id=eos).tokens
    assert ref[0, -1] == eos and ref.shape[1] <= 5
    out = S.speculative_generate(target, draft, ids, 10, gamma=gamma, eos_token_id=eos).tokens
    assert torch.equal(out, ref), _first_divergence(out, ref)
    out = S.tree_generate(target, draft, ids, 10, branching=(2,) * gamma, eos_token_id=eos).tokens
    assert torch.equal(out, ref), _first_divergence(out, ref)
    batch = torch.tensor([[1, 2, 3], [3, 1, 4], [4, 4, 1]])
    ref_b = decode.generate(target, batch, 10, eos_token_id=eos).tokens
    out_b = S.speculative_generate(target, draft, batch, 10, gamma=gamma, eos_token_id=eos).tokens
    assert torch.equal(out_b, ref_b)


def test_length_limit(toy_pair):
    target, draft = toy_pair
    ids = torch.tensor([[2, 1]])
    ref = decode.generate(target, ids, 9).tokens
    for n in (1, 2, 3, 5, 9):
        for gamma in (1, 3, 8):
            out = S.speculative_generate(target, draft, ids, n, gamma=gamma)
            assert out.n_new == n and torch.equal(out.tokens, ref[:, :n])
            assert max(out.stats.drafted) <= max(0, n - 1)
        out = S.tree_generate(target, draft, ids, n, branching=(2, 2, 2))
        assert torch.equal(out.tokens, ref[:, :n])
    one = S.speculative_generate(target, draft, ids[:, :1], 3, gamma=2)  # a one-token prompt: nothing to prefill
    assert torch.equal(one.tokens, decode.generate(target, ids[:, :1], 3).tokens)


def test_draft_with_another_vocabulary_is_refused(toy_pair):
    from llmlab.core.errors import UsageError

    target, _ = toy_pair
    with pytest.raises(UsageError, match=r"\(7 tokens\).*\(5 tokens\)"):
        S.speculative_generate(target, _toy(3, vocab=7), torch.tensor([[1, 2]]), 4)


# ---------------------------------------------------------------- tree attention


def test_tree_forward_equals_sequential_paths():
    model = _toy(4, vocab=50, scale=1.0)
    shape = S.tree_shape((3, 2, 1))
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 50, (1, 6), generator=gen)
    nodes = torch.randint(0, 50, (1, shape.size), generator=gen)
    cache = decode.new_cache(model)
    with torch.inference_mode():
        decode.forward(model, prefix[:, :-1], cache)
        rows = torch.zeros(1 + shape.size, 1 + shape.size, dtype=torch.bool)
        rows[:, 0] = True
        rows[1:, 1:] = shape.ancestors()
        t = prefix.shape[1] - 1
        pos = torch.tensor([t] + [t + d for d in shape.depth])
        tree = S.tree_forward(model, torch.cat([prefix[:, -1:], nodes], 1), cache, rows, pos)  # (1, 1 + N, V)
        for j in range(shape.size):
            path, k = [], j
            while k >= 0:
                path.insert(0, int(nodes[0, k]))
                k = shape.parent[k]
            seq = torch.cat([prefix, torch.tensor([path])], 1)
            want = model(input_ids=seq).logits[0, -1]
            assert torch.allclose(tree[0, 1 + j], want, atol=1e-4), f"node {j}: {(tree[0, 1 + j] - want).abs().max()}"


def test_metrics_and_formulas():
    st = S.SpecStats(drafted=[3, 3, 3], accepted=[[3], [0], [1]], emitted=[4, 1, 2])
    m = S.acceptance_metrics(st)
    assert m["alpha"] == pytest.approx(4 / 6)  # examined 3 + 1 + 2, accepted 3 + 0 + 1
    assert m["tau"] == pytest.approx(7 / 3)
    assert m["per_position"] == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert m["histogram"] == {0: 1, 1: 1, 3: 1}
    assert S.expected_tau(0.0, 4) == 1 and S.expected_tau(1.0, 4) == 5
    assert S.predicted_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert S.predicted_speedup(0.8, 4, 0.25) == pytest.approx((1 - 0.8**5) / (0.2 * 2))
