"""llmlab.tiny: the corpus, the tokenizer, training (a micro run), and the shipped pair's quality."""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmlab.core.models import builtin_path
from llmlab.tiny import card, copying, corpus, evaluate, train


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(builtin_path("tiny")).eval()
    draft = AutoModelForCausalLM.from_pretrained(builtin_path("tiny-draft")).eval()
    tok = AutoTokenizer.from_pretrained(builtin_path("tiny"))
    return target, draft, tok


@pytest.fixture(scope="module")
def heldout(pair):
    return card.heldout_ids(pair[2])


def test_split_is_deterministic_and_by_name():
    assert corpus.heldout_of("doc:os.py", 0.05) == corpus.heldout_of("doc:os.py", 0.05)
    names = [f"doc:m{i}.py" for i in range(2000)]
    share = sum(corpus.heldout_of(n, 0.05) for n in names) / len(names)
    assert 0.03 < share < 0.07
    topics = corpus.topic_documents()
    assert [n for n, _ in topics] == sorted(n for n, _ in topics)


def test_tokenizer_round_trips(pair):
    tok = pair[2]
    text = "def f(x):\n    return x ** 2  # héllo, 世界\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tok.convert_tokens_to_ids(corpus.EOT) == 0 == tok.eos_token_id
    assert len(tok) == 4096


def test_lr_schedule_warms_up_then_decays():
    cfg = train.TrainConfig()
    w, n = cfg.warmup_steps, 1000
    lrs = [train.lr_at(s, n, 1.0, cfg) for s in range(n)]
    assert lrs[0] < lrs[w - 1] == pytest.approx(1.0)
    start = train.decay_start(n, cfg)
    assert start == 800 and set(lrs[w:start]) == {1.0}  # WSD: constant between warm-up and decay
    assert all(a >= b for a, b in zip(lrs[start:], lrs[start + 1:], strict=False)) and lrs[start + 1] < 1.0
    assert lrs[-1] == pytest.approx(cfg.min_lr_frac, abs=0.01)
    # before the decay, the LR does not depend on the total: what lets a --minutes run re-size it
    assert [train.lr_at(s, 3 * n, 1.0, cfg) for s in range(start)] == lrs[:start]


def test_budget_resizes_to_what_fits():
    cfg = train.TrainConfig()
    # 400 steps took 800 s, lately 4 s a step: the 2,200 s left of a 3,000 s budget hold 550 more
    assert train.resized_total(400, 800.0, 4.0, 3000.0, cfg) == 950
    # a budget already spent still keeps a full warm-up and the decay ahead of the steps taken
    spent = train.resized_total(400, 800.0, 4.0, 800.0, cfg)
    assert 400 < train.decay_start(spent, cfg) <= 410
    assert train.resized_total(60, 800.0, 4.0, 800.0, cfg) == 5 * cfg.warmup_steps


def test_minutes_run_resizes_and_reproduces_by_steps(tmp_path):
    cfg = dataclasses.replace(train.TrainConfig.micro(), draft_steps=3, target_steps=1)
    data = train.build_data(cfg)
    copying: dict = {}
    _, timed = train.train_target(cfg, data, budget_s=2.0, copying=copying)
    fixed_cfg = dataclasses.replace(cfg, target_steps=len(timed), copy_steps=copying["steps"])
    _, fixed = train.train_target(fixed_cfg, data)
    assert len(timed) >= 5 * cfg.warmup_steps and fixed == timed


def test_micro_training_loss_falls(tmp_path):
    cfg = train.TrainConfig.micro()
    seen = []
    report, _ = train.train_pair(cfg, tmp_path, on_step=lambda *a: seen.append(a))
    first, last = report.target_losses[:5], report.target_losses[-5:]
    assert sum(last) / 5 < sum(first) / 5 - 0.2
    assert report.draft_losses[-1] < report.draft_losses[0]
    assert len(seen) == report.copying["steps"] + cfg.target_steps + cfg.draft_steps
    assert [a[0] for a in seen[:report.copying["steps"]]] == ["copy"] * report.copying["steps"]
    assert (tmp_path / "tiny" / "model.safetensors").is_file() and (
        tmp_path / "tiny-draft" / "tokenizer.json"
    ).is_file()


def test_micro_training_is_reproducible(tmp_path):
    cfg = train.TrainConfig.micro()
    a, _ = train.train_pair(cfg, tmp_path / "a")
    b, _ = train.train_pair(cfg, tmp_path / "b")
    assert a.target_losses == b.target_losses


def test_copy_probe_is_logged_and_changes_no_step():
    cfg = dataclasses.replace(train.TrainConfig.micro(), target_steps=12)
    data = train.build_data(cfg)
    probes, seen = [], []
    _, probed = train.train_target(dataclasses.replace(cfg, probe_every=5), data,
                                   on_step=lambda *a: seen.append(a), probes=probes)
    _, plain = train.train_target(dataclasses.replace(cfg, probe_every=0), data, probes=[])
    assert probed == plain  # the probe reads no training data and draws from its own generator
    assert [step for step, _ in probes] == [5, 10, 12]  # every 5 steps and after the last
    assert all(0.0 <= share <= 1.0 for _, share in probes)
    assert [a[4] for a in seen if a[0] == "target" and a[4] is not None] == [share for _, share in probes]


def test_pair_windows_repeat_each_span_and_mask_its_second_reading():
    import torch

    g = torch.Generator().manual_seed(0)
    for window in (32, 256):
        x, mask = copying.pair_windows(window, 1024, 512, g)
        assert x.shape == mask.shape == (1024 // window, window + 1)
        assert int(x.min()) >= 1 and int(x.max()) < 512  # random ids, never end-of-text
        for row, keep in zip(x, mask, strict=True):
            runs, start = [], None
            for i, on in enumerate(keep.tolist() + [False]):
                if on and start is None:
                    start = i
                elif not on and start is not None:
                    runs.append((start, i - 1))
                    start = None
            assert runs  # every window holds at least one pair
            for a, b in runs:  # masked a..b: the second reading but its first token, a - 1 .. b
                n = b - a + 2
                assert 4 <= n <= copying.span_max(window)
                assert torch.equal(row[a - 1:b + 1], row[a - 1 - n:b + 1 - n])


def test_copy_phase_unlocks_levels_and_stops_at_its_goal():
    import torch

    cfg = dataclasses.replace(train.TrainConfig.micro(), copy_max_steps=40)

    def run(share, **kw):
        c = dataclasses.replace(cfg, **kw)
        model = train.new_model(c.target, c.vocab_size, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return copying.copy_phase(model, c, opt, probe=lambda m, v, span: share)

    passing = run(1.0)  # promoted at the first probe, done at the second
    assert passing["steps"] == 8 and [p[1] for p in passing["probes"]] == [16, 32] and passing["level"] == 32
    failing = run(0.0)  # never promoted: the cap ends it
    assert failing["steps"] == 40 and {p[1] for p in failing["probes"]} == {16}
    fixed = run(1.0, copy_steps=12)  # a reproduction runs exactly its count
    assert fixed["steps"] == 12 and len(fixed["losses"]) == 12
    assert run(1.0, copy_steps=0)["steps"] == 0


def test_text_phase_keeps_every_nth_batch_for_pairs():
    cfg = train.TrainConfig.micro()
    got = list(zip(range(12), copying.with_pairs(iter(range(100)), cfg), strict=False))
    kinds = [isinstance(b, tuple) for _, b in got]
    assert kinds == [(i + 1) % cfg.copy_maintain_every == 0 for i in range(12)]


def test_target_beats_draft_on_heldout(pair, heldout):
    target, draft, _ = pair
    lt = evaluate.heldout_loss(target, heldout, max_tokens=4096)
    ld = evaluate.heldout_loss(draft, heldout, max_tokens=4096)
    assert lt < ld


def test_greedy_agreement_at_least_055(pair, heldout):
    target, draft, _ = pair
    prompts = evaluate.heldout_prompts(heldout, n=8)
    result = evaluate.greedy_agreement(target, draft, prompts, new_tokens=32)
    assert result["positions"] == 8 * 32
    assert result["target_self_consistency"] > 0.95
    assert result["agreement"] >= 0.55


def test_model_card_numbers_hold():
    m = json.loads((card.WEIGHTS / "metrics.json").read_text())["metrics"]
    assert m["loss_target"] < m["loss_draft"] < m["loss_unigram"]
    assert m["agreement"]["agreement"] >= 0.55
    assert m["c_ratio"] == pytest.approx(m["decode_draft"]["median_ms"] / m["decode_target"]["median_ms"])
    text = (card.WEIGHTS / "MODEL_CARD.md").read_text()
    assert f"{m['agreement']['agreement']:.3f}" in text and f"{m['loss_target']:.3f}" in text
    for row in evaluate.goal_rows(m):  # every goal is in the card's table with its verdict, held or not
        value = f"{row['value']:.3f}" if isinstance(row["value"], float) else row["value"]
        assert f"| {row['metric']} | {value} | {row['goal']} | {'held' if row['held'] else '**missed**'} |" in text


def test_decode_timing_is_one_forward_per_token_of_each_model():
    import torch

    cfg = train.TrainConfig.micro()
    models = {"a": train.new_model(cfg.target, cfg.vocab_size, 0), "b": train.new_model(cfg.draft, cfg.vocab_size, 1)}
    calls = {name: 0 for name in models}
    for name, model in models.items():
        model.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    timing = evaluate.decode_ms_per_token(models, torch.tensor([[1, 2, 3]]), new_tokens=5, repeats=3)
    assert calls == {"a": 9 + 3 * 6, "b": 9 + 3 * 6}  # warm-up: prefill + 8 steps; each repeat: prefill + 5 steps
    for t in timing.values():
        assert 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"] and (t["new_tokens"], t["repeats"]) == (5, 3)


def _has_repeat(window, length: int) -> bool:
    """Whether some length-token span occurs twice, at non-overlapping positions."""
    w = window.tolist()
    seen = {}
    for i in range(len(w) - length + 1):
        key = tuple(w[i:i + length])
        if key in seen and i - seen[key] >= length:
            return True
        seen.setdefault(key, i)
    return False


def test_repeat_span_writes_the_span_twice():
    import torch

    g = torch.Generator().manual_seed(0)
    for vocab in (None, 512):
        window = torch.arange(1000, 1513)
        first, second, n = train.repeat_span(window, g, 32, 128, vocab)
        assert 32 <= n <= 128 and second >= first + n and second + n <= len(window)
        assert torch.equal(window[first:first + n], window[second:second + n])
        if vocab is None:  # the window's own text: untouched before the second copy
            assert torch.equal(window[:second], torch.arange(1000, 1000 + second))
        else:  # random ids, never EOT (0)
            assert int(window[first:first + n].min()) >= 1 and int(window[first:first + n].max()) < vocab


def test_curriculum_shares_and_windows_are_as_configured():
    import torch

    cfg = train.TrainConfig.micro()
    ids = torch.arange(1, 20_001)  # a stream without repeats: any repeat is the curriculum's
    it = train.curriculum_batches(ids, cfg, seed=0)
    kinds = []
    for _ in range(250):
        batch, k = next(it)
        assert batch.shape == (cfg.batch_size, cfg.seq_len + 1)
        for window, kind in zip(batch, k.tolist(), strict=True):
            assert _has_repeat(window, cfg.repeat_min) == (kind != train.PLAIN)
            if kind == train.PLAIN:
                assert torch.equal(window, torch.arange(int(window[0]), int(window[0]) + cfg.seq_len + 1))
        kinds += k.tolist()
    n = len(kinds)  # 2,000 windows: a share is within 4 binomial standard deviations of its setting
    for kind, share in ((train.SPAN, cfg.span_share), (train.RANDOM, cfg.random_share)):
        assert abs(kinds.count(kind) / n - share) < 4 * (share * (1 - share) / n) ** 0.5


def _cli(*args):
    from typer.testing import CliRunner

    from llmlab.main import app

    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r


def test_generate_samples_by_default_and_greedy_at_temperature_0():
    from llmlab.core import models
    from llmlab.inference.decode import SamplingParams, stream_text

    lm = models.load("tiny")

    def text(params=SamplingParams(), seed=0):
        return "".join(stream_text(lm.model, lm.tokenizer, "The list method", 16, params, seed))

    greedy = text()
    # a nucleus of p -> 0 keeps only the most likely token: sampling from it is greedy decoding
    assert text(SamplingParams(temperature=1.0, top_p=1e-9)) == greedy
    sampled = {text(SamplingParams(temperature=0.8, top_p=0.95), seed=s) for s in range(4)}
    assert len(sampled) > 1  # four seeds of a sampler over a 4,096-token vocabulary: not one fixed text

    r = _cli("generate", "-n", "16", "--device", "cpu", "The list method")
    assert "temperature 0.8, top-p 0.95" in r.stderr
    r = _cli("generate", "-n", "16", "--device", "cpu", "--temperature", "0", "The list method")
    assert "greedy" in r.stderr and r.stdout == "The list method" + greedy + "\n"


def test_loop_period_finds_short_loops_only():
    assert evaluate.loop_period([5, 6, 7] * 8) == 3
    assert evaluate.loop_period([9] * 16) == 1 and evaluate.loop_period([9] * 15) is None  # 16 tokens make a loop
    assert evaluate.loop_period(list(range(64))) is None
    assert evaluate.loop_period(list(range(9)) * 7) is None  # period 9: past the check's 8
    # two readings are not a loop
    assert evaluate.loop_period([1, 2, 3, 4, 5, 6, 7, 8] * 2 + list(range(10, 58))) is None


class _Copier:
    """A stand-in model that predicts the token one passage-length back (a perfect induction head),
    and token 0 where it has not read that far."""

    def __init__(self, n: int, vocab: int):
        self.n, self.vocab = n, vocab

    def __call__(self, input_ids):
        import torch

        back = torch.zeros_like(input_ids)
        back[:, self.n - 1:] = input_ids[:, : input_ids.shape[1] - self.n + 1]
        return type("Out", (), {"logits": torch.nn.functional.one_hot(back, self.vocab).float()})()


def test_repeat_accuracy_scores_the_second_reading():
    passages = evaluate.random_passages(512, n=4, length=64)
    assert int(passages.min()) >= 1  # never end-of-text
    r = evaluate.repeat_accuracy(_Copier(64, 512), passages)
    assert r["second_read"] == 1.0 and r["first_read"] < 0.05 and r["tokens"] == 64


def test_goal_rows_judge_nested_metrics():
    rows = {r["metric"]: r for r in evaluate.goal_rows({"loss_target": 4.9, "agreement": {"agreement": 0.8}})}
    assert rows["loss_target"]["held"] is False and rows["agreement.agreement"]["held"] is True
    assert set(rows) == {"loss_target", "agreement.agreement"}  # goals not measured are left out


def test_tiny_train_cli_states_the_copying_phase_in_the_card(tmp_path):
    _cli("tiny", "train", "--micro", "--out", str(tmp_path), "--threads", "1")
    text = (tmp_path / "MODEL_CARD.md").read_text()
    report = json.loads((tmp_path / "metrics.json").read_text())["report"]
    steps = report["copying"]["steps"]
    assert 0 < steps <= train.TrainConfig.micro().copy_max_steps
    assert "Copying phase first" in text and f"--copy-steps {steps} --target-steps 30" in text
