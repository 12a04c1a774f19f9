"""The verdicts: every claim from the saved tables (and env["lab"]) alone."""

from __future__ import annotations

import pandas as pd

from llmlab.core.results import Claim, LabResult
from llmlab.labs.gpu_parallelism.config import TILE, WORKS, cpu_way


def _ms(df: pd.DataFrame, **eq) -> float | None:
    sub = df
    for k, v in eq.items():
        sub = sub[sub[k] == v]
    return float(sub["median_ms"].iloc[0]) if len(sub) else None


def _top(result: LabResult) -> int:
    return int(max(result.env.get("lab", {}).get("thread_sweep") or [1]))


def judge(result: LabResult) -> list[Claim]:
    """Pure: every verdict from result.tables and result.env["lab"] alone."""
    t, out = result.tables, []
    if "throughput_elementwise" in t:
        out += [_python_claim(t["throughput_elementwise"])]
    if "thread_scaling" in t:
        out += _scaling_claims(t["thread_scaling"], _top(result))
    if all(f"throughput_{w}" in t for w in WORKS):
        out.append(_crossover_claim({w: t[f"throughput_{w}"] for w in WORKS}, _top(result)))
    if "wave_quantization" in t or "throughput_elementwise" in t:
        out.append(wave_claim(t.get("wave_quantization")))
    if "tensor_cores" in t:
        out += _tensor_claims(t["tensor_cores"], result.env.get("lab", {}).get("cpu_isa", {}))
    if "launch_overhead" in t:
        out += _launch_claims(t["launch_overhead"])
    if "alexnet_conv1" in t:
        out += _alexnet_claims(t["alexnet_conv1"])
    if "throughput_elementwise" in t:
        out.append(_copy_claim(t.get("copy_bandwidth")))
    return out


def _python_claim(el: pd.DataFrame) -> Claim:
    cid = "gpu_parallelism.python_loop_vs_vectorised"
    text = "a Python loop is >= 100x slower than one vectorised thread"
    py = el[el.way == "python loop"]
    if py.empty:
        return Claim(cid, text, ">= 100x", "-", None, "the loop was not run (python_max_ops)")
    size = int(py["size"].max())
    ratio = _ms(py, size=size) / _ms(el, way="cpu 1 thread", size=size)
    return Claim(cid, text, ">= 100x", f"{ratio:,.0f}x (FMA, {size:,} elements)", ratio >= 100)


def _scaling_claims(sc: pd.DataFrame, top: int) -> list[Claim]:
    ids = ("gpu_parallelism.matmul_thread_scaling", "gpu_parallelism.fma_scales_worse_than_matmul")
    texts = (f"matmul scales near-linearly over {top} CPU threads", "memory-bound FMA scales worse than matmul")
    if top == 1:
        return [Claim(i, x, ">= 75% of ideal", "-", None, "one usable CPU") for i, x in zip(ids, texts, strict=True)]
    at = {w: sc[(sc.work == w) & (sc.threads == top)].iloc[0] for w in WORKS}
    eff = {w: float(r["efficiency_pct"]) for w, r in at.items()}
    spd = {w: float(r["speedup"]) for w, r in at.items()}
    return [Claim(ids[0], texts[0], f">= 75% of ideal ({top}x)",
                  f"{spd['matmul']:.2f}x ({eff['matmul']:.0f}% of ideal)", eff["matmul"] >= 75),
            Claim(ids[1], texts[1], "FMA's % of ideal < matmul's",
                  f"FMA {spd['elementwise']:.2f}x, matmul {spd['matmul']:.2f}x",
                  eff["elementwise"] < eff["matmul"])]


def crossover(gpu_ms: dict[int, float], cpu_ms: dict[int, float]) -> int | None:
    """The smallest size from which the GPU is faster at that size and at every larger measured size."""
    sizes = sorted(set(gpu_ms) & set(cpu_ms))
    wins = [gpu_ms[s] < cpu_ms[s] for s in sizes]
    return next((s for i, s in enumerate(sizes) if all(wins[i:])), None)


def _crossover_claim(tbl: dict[str, pd.DataFrame], top: int) -> Claim:
    cid, text = "gpu_parallelism.gpu_crossover", f"the GPU beats {top} CPU threads only above a size (FMA, sum, n)"
    way = cpu_way(top)
    exp = {w: _size_for_flops(w, 5e-6 * float(t[t.way == way]["gflops"].max()) * 1e9) for w, t in tbl.items()}
    expected = "for each, a crossover > the smallest size (napkin ~" + ", ".join(_compact(exp[w]) for w in WORKS) + ")"
    if not any((t.way == "gpu").any() for t in tbl.values()):
        return Claim(cid, text, expected, "-", None, "no GPU")
    xs, smallest_ok = {}, True
    for w, t in tbl.items():
        cpu = dict(zip(t[t.way == way]["size"], t[t.way == way]["median_ms"], strict=True))
        g = t[t.way == "gpu"]
        xs[w] = crossover(dict(zip(g["size"], g["median_ms"], strict=True)), cpu)
        smallest_ok &= xs[w] is not None and xs[w] > min(cpu)
    meas = ", ".join(_compact(xs[w]) if xs[w] is not None else "never" for w in WORKS)
    return Claim(cid, text, expected, meas, smallest_ok)


def _size_for_flops(work: str, flops: float) -> int:
    n = {"elementwise": flops / 2, "reduction": flops, "matmul": (flops / 2) ** (1 / 3)}[work]
    return int(float(f"{max(n, 1):.1g}"))


def _compact(n: int) -> str:
    """10000 -> "1e4", 7000 -> "7e3", 256 -> "256"."""
    return f"{n:.0e}".replace("e+0", "e").replace("e+", "e") if n >= 1000 and n == float(f"{n:.0e}") else f"{n:,}"


def wave_claim(wq: pd.DataFrame | None, min_drop: float = 0.05) -> Claim:
    """The saw-tooth, as a test that can fail: drops > 5% must sit at the predicted wave boundaries (within one
    sweep step), and at least half of the boundaries must show one; a drop anywhere else refutes the saw-tooth."""
    cid = "gpu_parallelism.wave_quantization"
    text = f"matmul FLOP/s drops > {100 * min_drop:.0f}% just past each full wave"
    expected = f"drops only within a step of M = {TILE}w, at >= half of them"
    if wq is None or wq.empty:
        return Claim(cid, text, expected, "-", None, "no GPU")
    bidx = [i for i, b in enumerate(wq["boundary"]) if bool(b)]
    near = {j for i in bidx for j in (i - 1, i, i + 1)}
    drops = [i for i, d in enumerate(wq["drop"]) if float(d) > min_drop]
    hit = sum(any(j in drops for j in (i - 1, i, i + 1)) for i in bidx)
    stray = [int(wq["M"].iloc[i]) for i in drops if i not in near]
    holds = bool(bidx) and 2 * hit >= len(bidx) and not stray
    meas = f"{hit}/{len(bidx)} waves, {len(stray)} stray"
    return Claim(cid, text, expected, meas, holds)


def _tensor_claims(tc: pd.DataFrame, isa: dict) -> list[Claim]:
    cpu = tc[tc.device == "cpu"]
    r = float(cpu[cpu.dtype == "bf16"]["speedup_vs_fp32"].iloc[0])
    p32, pb = (cpu[cpu.dtype == d]["peak_gflops"].iloc[0] for d in ("fp32", "bf16"))
    unit = "AMX" if isa.get("amx_bf16") else ("AVX512_BF16" if isa.get("avx512_bf16") else "no BF16 unit")
    out = [Claim("gpu_parallelism.cpu_bf16_beats_fp32", f"BF16 matmul beats FP32 on this CPU ({unit})",
                 f"> 1.05x (spec peaks: {pb / p32:.0f}x)" if p32 and pb and not pd.isna(p32)
                 else "> 1.05x (only with BF16 hardware)",
                 f"{r:.2f}x (n = {int(cpu['n'].iloc[0])})", r > 1.05)]
    gpu = tc[tc.device != "cpu"]
    text = "tensor cores: BF16 >= 4x, TF32 >= 1.5x strict FP32"
    if gpu.empty:
        return out + [Claim("gpu_parallelism.tensor_cores", text, "BF16 >= 4x, TF32 >= 1.5x", "-", None, "no GPU")]
    sp = {d: float(gpu[gpu.dtype == d]["speedup_vs_fp32"].iloc[0]) for d in ("bf16", "tf32")}
    pk = {d: gpu[gpu.dtype == d]["peak_gflops"].iloc[0] for d in ("fp32", "tf32", "bf16")}
    known = all(v and not pd.isna(v) for v in pk.values())
    spec = f" (spec: {pk['bf16'] / pk['fp32']:.0f}x, {pk['tf32'] / pk['fp32']:.0f}x)" if known else ""
    exp = f"BF16 >= 4x, TF32 >= 1.5x{spec}"
    return out + [Claim("gpu_parallelism.tensor_cores", text, exp, f"BF16 {sp['bf16']:.1f}x, TF32 {sp['tf32']:.1f}x",
                        sp["bf16"] >= 4 and sp["tf32"] >= 1.5)]


def _launch_claims(lo: pd.DataFrame) -> list[Claim]:
    out = []
    for cid, where, sub in (("gpu_parallelism.batched_beats_loop_cpu", "CPU", lo[lo.device == "cpu"]),
                            ("gpu_parallelism.batched_beats_loop_gpu", "GPU", lo[lo.device != "cpu"])):
        n, count = (int(sub[c].iloc[0]) if len(sub) else 0 for c in ("n", "count"))
        text = f"one bmm is >= 2x faster than {count or 'B'} separate small matmuls ({where})"
        if sub.empty:
            out.append(Claim(cid, text, ">= 2x (the loop pays B launches of ~5 us)", "-", None, "no GPU"))
            continue
        parts, ok = [], True
        for threads, g in sub.groupby("threads", dropna=False, sort=False):
            ratio = _ms(g, way="loop of mm") / _ms(g, way="one bmm")
            ok &= ratio >= 2
            parts.append(f"{ratio:.2g}x" + ("" if pd.isna(threads) else f" at {int(threads)}t"))
        exp = (">= 2x at every thread count (the loop pays B dispatches of 1-5 us)" if where == "CPU"
               else ">= 2x (the loop pays B launches of ~5 us)")
        out.append(Claim(cid, text, exp, ", ".join(parts), ok))
    return out


def _alexnet_claims(ax: pd.DataFrame) -> list[Claim]:
    r = ax[ax.device == "cpu"].iloc[0]
    ratio = float(r["median_ms"]) / float(r["napkin_ms"])
    out = [Claim("gpu_parallelism.alexnet_conv1_is_matmul", "AlexNet conv1 takes its FLOPs / the matmul rate (CPU)",
                 f"within 0.5-2x of {float(r['napkin_ms']):.0f} ms",
                 f"{float(r['median_ms']):.0f} ms ({ratio:.2f}x napkin)", 0.5 <= ratio <= 2)]
    text = f"the GPU runs AlexNet conv1 >= 10x faster than the CPU (batch {int(r['batch'])})"
    g = ax[ax.device != "cpu"]
    if g.empty:
        return out + [Claim("gpu_parallelism.alexnet_gpu_10x", text, ">= 10x", "-", None, "no GPU")]
    sp = float(r["median_ms"]) / float(g["median_ms"].iloc[0])
    return out + [Claim("gpu_parallelism.alexnet_gpu_10x", text, ">= 10x",
                        f"{sp:.0f}x ({float(g['median_ms'].iloc[0]):.2f} ms)", sp >= 10)]


def _copy_claim(cb: pd.DataFrame | None) -> Claim:
    cid, text = "gpu_parallelism.pinned_beats_pageable", "pinned host memory copies >= 1.1x faster than pageable"
    if cb is None or cb.empty:
        return Claim(cid, text, "pinned > 1.1x pageable", "-", None, "no GPU")
    # the largest copy: bandwidth, not latency
    big = cb[(cb.direction == "host->device") & (cb["MiB"] == cb["MiB"].max())]
    best = big.groupby("memory")["GBps"].max()
    link = cb["link_GBps"].iloc[0]
    exp = "pinned > 1.1x pageable" + (f" (link {float(link):.0f} GB/s)" if link and not pd.isna(link) else "")
    return Claim(cid, text, exp, f"pinned {best['pinned']:.1f}, pageable {best['pageable']:.1f} GB/s",
                 best["pinned"] > 1.1 * best["pageable"])


