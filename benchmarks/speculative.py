"""Benchmark: our speculative decoding against our plain loop, HF generate and HF assisted generation.

Issue 9's performance goal, on the built-in pair on a CPU, greedy, same prompts and lengths, in the
same run: ours speculative >= 1.3x our plain decoding and >= 1.25x HF assisted generation in tokens/s;
our plain loop >= HF generate. `make bench-speculative` (= `python -m benchmarks.speculative`).

Fair to the peer (issue 12 item 10): each side gets its OWN best gamma. A pre-sweep (interleaved,
`--sweep-rounds` rounds) times ours and HF assisted (constant schedule, confidence stop off) at every
gamma of `--gammas`; each side's best is then re-measured in fresh interleaved rounds (no winner's
curse), beside HF's own dynamic settings: its defaults (20 tokens, adaptive confidence stop from 0.4)
and the "heuristic" schedule (+2 after a fully accepted round, -1 otherwise). Both comparisons are
printed: ours vs HF at HF's best constant gamma, and ours vs HF's best dynamic setting.

Napkin: with acceptance alpha and cost ratio c, a round of gamma drafts + one verify yields
(1 - alpha^(gamma+1)) / (1 - alpha) tokens for gamma c + 1 target-step costs (Leviathan et al.):
alpha 0.7, c 0.2, gamma 4 -> 1.54x. HF assisted does the same forwards plus generate's per-round
bookkeeping (logits processors, stopping criteria, candidate generator), which on models this small
costs a sizeable share of a forward.

Every output is first checked token for token against plain greedy (llm.c style: "All results match.
Starting benchmarks."). Rounds interleave the methods (core.timing.interleaved, order alternating);
ratios are medians of per-round ratios.

Options: --gammas, --new-tokens, --prompts, --rounds, --sweep-rounds, --threads (0 = torch's default), --device.
"""

from __future__ import annotations

import argparse

import torch

from llmlab.core import stats as st
from llmlab.core.device import resolve_device, torch_threads
from llmlab.core.timing import interleaved
from llmlab.inference import decode
from llmlab.inference import speculative as S
from llmlab.labs import speculative as lab

GOALS = {"ours / plain (ours)": lab.GOAL_VS_PLAIN, "ours / HF assisted (best constant)": lab.GOAL_VS_HF_ASSISTED,
         "ours / HF assisted (best dynamic)": lab.GOAL_VS_HF_ASSISTED, "plain (ours) / HF generate": 1.0}
DYNAMIC = {"HF defaults (20, adaptive confidence)": dict(gamma=None, schedule=None, confidence=None),
           "HF heuristic +2/-1 (from 4)": dict(gamma=4, schedule="heuristic", confidence=0.0)}


def best_gammas(ratios: dict[str, dict[int, float]]) -> dict[str, int]:
    """Each side's own best gamma: side -> {gamma: median speed-up over plain} -> side -> gamma."""
    return {side: max(r, key=r.get) for side, r in ratios.items()}


def median_ratio(seconds: dict[str, list[float]], base: str, name: str) -> float:
    return st.summary(b / s for b, s in zip(seconds[base], seconds[name], strict=True)).median


def _methods(pair, n: int, gammas) -> dict:
    ours = {f"ours g={g}": (lambda g=g: pair.run(lambda ids: S.speculative_generate(pair.target, pair.draft, ids, n, gamma=g).tokens))
            for g in gammas}
    hf = {f"HF g={g}": (lambda g=g: pair.run(lambda ids: S.hf_assisted_generate(pair.target, pair.draft, ids, n, g)))
          for g in gammas}
    return ours | hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gammas", default="1,2,3,4,5,6,8")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sweep-rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=lab.Config.threads)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = resolve_device(args.device, None)
    gammas = [int(g) for g in args.gammas.split(",")]
    cfg = lab.Config(new_tokens=args.new_tokens, prompts=args.prompts)
    lab.check_pair(cfg)
    with torch_threads(None if device.is_cuda or not args.threads else args.threads):
        pair = lab.load_pair(cfg, device)
        n = args.new_tokens
        plain = {"plain (ours)": lambda: pair.run(lambda ids: decode.generate(pair.target, ids, n).tokens)}
        sweep = interleaved(plain | _methods(pair, n, gammas), args.sweep_rounds, device)
        ratios = {side: {g: median_ratio(sweep.seconds, "plain (ours)", f"{side} g={g}") for g in gammas}
                  for side in ("ours", "HF")}
        best = best_gammas(ratios)
        for side in ("ours", "HF"):
            print(f"pre-sweep {side:4s} (x plain): " + ", ".join(f"g{g} {r:.2f}" for g, r in ratios[side].items())
                  + f" -> best gamma {best[side]}")
        fns = plain | {
            "HF generate": lambda: pair.run(lambda ids: decode.hf_generate(pair.target, ids, n)),
            f"ours (gamma {best['ours']})": lambda: pair.run(
                lambda ids: S.speculative_generate(pair.target, pair.draft, ids, n, gamma=best["ours"]).tokens),
            f"HF assisted (gamma {best['HF']})": lambda: pair.run(
                lambda ids: S.hf_assisted_generate(pair.target, pair.draft, ids, n, best["HF"])),
        } | {k: (lambda kw=kw: pair.run(lambda ids: S.hf_assisted_generate(pair.target, pair.draft, ids, n, **kw)))
             for k, kw in DYNAMIC.items()}
        out = interleaved(fns, args.rounds, device)
    refs = out.outputs["plain (ours)"]
    for k, outs in out.outputs.items():
        rows = lab.identity_rows(k, outs, refs, eos=None if k.startswith("ours") else pair.eos)
        if not all(r["identical"] for r in rows):
            raise SystemExit(f"{k}: output differs from plain greedy: {rows}")
    print(f"All {len(fns) - 1} methods match plain greedy token for token. Benchmark results:")
    print(f"built-in pair {cfg.model} / {cfg.draft}, greedy, {len(pair.prompts)} prompts x {n} tokens, "
          f"{args.rounds} interleaved rounds, torch threads {args.threads or torch.get_num_threads()}, device {device.spec}")
    tokens = n * len(pair.prompts)
    for k in fns:
        tps = st.summary(tokens / s for s in out.seconds[k])
        print(f"  {k:40s} {tps.median:7.1f} tokens/s (p10 {tps.p10:.1f}, p90 {tps.p90:.1f})")
    ours, hf_c = f"ours (gamma {best['ours']})", f"HF assisted (gamma {best['HF']})"
    hf_d = max(DYNAMIC, key=lambda k: median_ratio(out.seconds, "plain (ours)", k))
    pairs = {"ours / plain (ours)": ("plain (ours)", ours), "ours / HF assisted (best constant)": (hf_c, ours),
             "ours / HF assisted (best dynamic)": (hf_d, ours), "plain (ours) / HF generate": ("HF generate", "plain (ours)")}
    for k, (base, name) in pairs.items():
        r = st.summary(b / s for b, s in zip(out.seconds[base], out.seconds[name], strict=True))
        ok = "meets" if r.median >= GOALS[k] else "misses"
        print(f"  {k:36s} {r.median:.2f}x (p10 {r.p10:.2f}, p90 {r.p90:.2f})  goal >= {GOALS[k]}x: {ok}"
              + (f"  [{hf_d}]" if "dynamic" in k else ""))


if __name__ == "__main__":
    main()
