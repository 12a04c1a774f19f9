"""TEMPORARY: the hand-written lab commands, until every lab's Config carries its options (cli/labs.py)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer

from llmlab.cli.app import (
    ENDPOINT,
    LABS,
    Common,
    DeviceOpt,
    GpuOpt,
    JsonOpt,
    ModelOpt,
    NoSaveOpt,
    OutOpt,
    QuickOpt,
    SeedOpt,
    TablesOpt,
    app,
    run_lab,
)
from llmlab.core.errors import UsageError

# ---------------------------------------------------------------- labs


def _csv(values) -> str:
    return ",".join(map(str, values))


from llmlab.labs.tokens import Config as _TK  # noqa: E402  (light: torch loads inside the lab)

_TKD, _TKQ = _TK(), _TK.quick()


@app.command("tokens", rich_help_panel=LABS)
def tokens(
    model: Annotated[Optional[list[str]], typer.Option("--model", "-m", help=f"Models with a trained tokenizer (repeatable): tiny, tiny-draft, a Hugging Face id or local path. Default: {', '.join(_TKD.models)} ({', '.join(_TKQ.models)} with --quick).", show_default=False)] = None,
    vocab_sizes: Annotated[Optional[str], typer.Option("--vocab-sizes", help=f"Vocabulary sizes V of part 3, comma-separated (>= 256). Default {_csv(_TKD.vocab_sizes)} ({_csv(_TKQ.vocab_sizes)} with --quick).", show_default=False)] = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help=f"The layer shape whose vocabulary part 3 sweeps (tiny or arch:NAME; random weights). Default {_TKD.shape} ({_TKQ.shape} with --quick).", show_default=False)] = None,
    permutations: Annotated[Optional[int], typer.Option("--permutations", help=f"Sign flips of part 2's permutation test (>= 100). Default {_TKD.permutations:,} ({_TKQ.permutations:,} with --quick).", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads. Default: torch's, or 1 when the CPU is oversubscribed.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Tokens: a model reads ids, not letters; an id means nothing until its embedding; the vocabulary has a price.

    This lab shows how each tokenizer splits English, numbers, code and the same sentence in ten languages (tokens per word and per character, the premium over English), why counting the r's in "strawberry" is hard (the pieces, and the model asked, where it answers at all), the nearest neighbours of words in the input-embedding matrix against their neighbours by id (related words by a rule that does not use the embedding, with a permutation test), and what V = 4k .. 256k costs: embedding and LM-head bytes, logits per token, and the LM head's share of a timed decode step against the formula.
    """
    run_lab("tokens", Common(device, gpu, quick, json_, out, no_save, seed, tables), models=tuple(model) if model else None,
            vocab_sizes=_ints(vocab_sizes, "--vocab-sizes"), shape=shape, permutations=permutations, threads=threads)


@app.command("gpu-parallelism", rich_help_panel=LABS)
def gpu_parallelism(
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only these parts (repeatable): sizes, waves, tensor-cores, launch, alexnet, copies.", show_default=False)] = None,
    max_threads: Annotated[Optional[int], typer.Option(help="Top of the CPU thread sweep (default: every usable CPU).", show_default=False)] = None,
    conv_batch: Annotated[Optional[int], typer.Option(help="AlexNet conv1 batch size (default 128; 8 with --quick).", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """See parallelism: the same work as a Python loop, on 1..N CPU threads, and on the GPU.

    A CPU has a handful of strong cores; a GPU thousands of simple ones in SMs, plus tensor cores for matmuls. This lab times an FMA, a reduction and a matmul at growing sizes four ways and finds where the GPU starts to win (below it, launch and copy overhead dominate); it shows the CPU's thread scaling against ideal, the wave-quantization saw-tooth around the SM count, FP32 vs TF32/BF16/FP16 (and whether the CPU has AMX), B small matmuls vs one bmm, AlexNet's conv1 at batch 128, and host<->device copy bandwidth. Without a GPU the GPU parts say "not measured: no GPU".
    """
    run_lab("gpu-parallelism", Common(device, gpu, quick, json_, out, no_save, seed, tables),
            parts=tuple(only) if only else None, max_threads=max_threads, conv_batch=conv_batch)


@app.command("roofline", rich_help_panel=LABS)
def roofline(
    model: ModelOpt = "tiny",
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="Compute dtype of the intensity sweep and the model overlay: auto (float32 on a CPU, bfloat16 on a GPU) | float32 | bfloat16 | float16.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """The two speed limits, measured: memory bandwidth and matmul compute, and where LLM work sits between them.

    Every processor has two roofs: how many bytes per second it can move and how many FLOPs per second it can do. Arithmetic intensity (FLOPs per byte moved) decides which one binds: below the ridge point (peak FLOP/s / bandwidth) a kernel waits on memory, above it on the math units. This lab measures both roofs on your device (STREAM-style read/write/copy/triad over buffers 8x the last-level cache, with a size sweep that shows each cache level; matmul FLOP/s over a set of aligned shapes with the cache flushed), compares them with the spec sheet, then sweeps a GEMM from M=1 (a matrix-vector product: ~0.5 FLOP/byte in FP32) to M=4096 and watches it climb the roofline. Finally it places --model's per-layer matmuls of prefill and decode on that roofline and times the real decode step at growing batch: at batch 1 decode reads every weight to do 2 FLOPs with it, so it uses a few percent of peak compute, and batch size is the lever that moves it toward the ridge.
    """
    run_lab("roofline", Common(device, gpu, quick, json_, out, no_save, seed, tables), model=model, dtype=dtype)


@app.command("kvcache-growth", rich_help_panel=LABS)
def kvcache_growth(
    model: ModelOpt = "tiny",
    cache_dtype: Annotated[Optional[str], typer.Option("--cache-dtype", help="Cache dtype of the registry table: fp32 | fp16 | bf16 | fp8 | int4-g64 | int4-g32 (4-bit + one FP16 scale per 64 / 32 values). Default bf16.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Watch the KV cache grow: its bytes against the formula, GQA vs MHA, and the quadratic trap without it.

    Every token leaves a key and a value per layer and KV head in the cache: 2 x layers x kv_heads x head_dim x bytes per token (Llama-2-7B: 512 KiB in BF16; Llama-3-8B, with 4 query heads sharing each KV head: 128 KiB). This lab grows a real cache (batch x length), sums its tensors and checks them byte for byte against that formula (and the sliding window of Mistral); compares the registry models (GiB at 4k/32k/128k, tokens and requests that fit after the weights, as vLLM reports them); and generates with and without the cache, fitting total time vs n: without it every token recomputes the whole prefix, so the total grows as n^2.
    """
    run_lab("kvcache-growth", Common(device, gpu, quick, json_, out, no_save, seed, tables), model=model, cache_dtype=cache_dtype)


@app.command("samplers", rich_help_panel=LABS)
def samplers(
    model: ModelOpt = "tiny",
    prompt: Annotated[Optional[str], typer.Option(help="The prompt whose next-token distribution meets each strategy.", show_default=False)] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Temperature of the 'temperature' strategy (> 0; 0 is greedy, shown anyway). Default 0.8.", show_default=False)] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="k of top-k (>= 1). Default 40.", show_default=False)] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="p of top-p, the mass kept, in (0, 1]. Default 0.9.", show_default=False)] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="min-p: keep tokens with p >= min_p x p(top token), in [0, 1]. Default 0.1.", show_default=False)] = None,
    samples: Annotated[Optional[int], typer.Option(help="Continuations per strategy for the quality table. Default 8.", show_default=False)] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Tokens per continuation. Default 40.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """One distribution, four fates: greedy, temperature, top-k, top-p and min-p on a real next-token distribution, and what each costs.

    The model scores every token of its vocabulary (4,096 for tiny, 128,256 for Llama 3); a sampler turns the scores into one token. Greedy takes the argmax; temperature reshapes the softmax; top-k keeps a fixed number of tokens, top-p the smallest set holding p of the mass, min-p every token at least min_p times as likely as the best. The lab shows what each keeps of the model's real distribution (bar charts), how many tokens each keeps when the model is sure or unsure, what the text looks like (distinct-n, repetition, log-probability, entropy; a temperature sweep), and the latency of one sampling step, ours and Hugging Face's, at vocabularies up to 151,936 and batches up to 128: top-p sorts the vocabulary, greedy reads it once ("top-p costs 9x greedy": reproduce or refute). A sorting-free top-p (FlashInfer's dual-pivot rejection, in torch) is checked to sample the same distribution (chi-square) and timed against the sort.
    """
    run_lab("samplers", Common(device, gpu, quick, json_, out, no_save, seed, tables), model=model, prompt=prompt, temperature=temperature,
            top_k=top_k, top_p=top_p, min_p=min_p, samples=samples, max_new_tokens=max_new_tokens)


from llmlab.labs.ttft_breakdown import Config as _TTFT  # noqa: E402 (help defaults come from the lab's Config)

_TD, _TQ = _TTFT(), _TTFT.quick()


def ttft_breakdown(
    prompt_len: Annotated[Optional[int], typer.Option("--prompt-len", help="Longest prompt of the sweep, in tokens (> 0; the sweep runs 16..this; beyond the model's context it is clamped with a notice). Default 4096.", show_default=False)] = None,
    model: ModelOpt = "tiny",
    rate: Annotated[Optional[list[float]], typer.Option("--rate", help="Arrival rate in requests/s (repeatable, > 0): replaces the utilisation sweep.", show_default=False)] = None,
    utilization: Annotated[Optional[list[float]], typer.Option("--utilization", help="Target utilisation rho (repeatable, in (0, 2)): rate = rho / the measured service time. Default 0.3 0.5 0.7 0.8 0.9 0.95.", show_default=False)] = None,
    requests: Annotated[Optional[int], typer.Option(help="Requests per arrival rate (>= 2). Default 30 (16 with --quick).", show_default=False)] = None,
    burst: Annotated[Optional[int], typer.Option(help="Requests that arrive at the same instant (0 = skip). Default 12 (6 with --quick).", show_default=False)] = None,
    new_tokens: Annotated[Optional[int], typer.Option(help="Tokens streamed per request (>= 2). Default 16 (8 with --quick).", show_default=False)] = None,
    cold_starts: Annotated[Optional[int], typer.Option(help="Cold starts in fresh processes (0 = skip). Default 3 (1 with --quick).", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads. Default: torch's, or 1 when the CPU is oversubscribed (load average >= cores).", show_default=False)] = None,
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", help="Measure a running OpenAI-compatible server (http://host:port: vLLM, SGLang, TGI, llama.cpp, llmlab serve) instead of the in-process worker: its TTFT split into client + network, server queue, prefill and first decode where it reports them, its prefill rate, its prefix cache, and latency under load.", rich_help_panel=ENDPOINT, show_default=False)] = None,
    concurrency: Annotated[Optional[int], typer.Option(help=f"With --endpoint: requests in flight at most during the load part (>= 1). Default {_TD.concurrency} ({_TQ.concurrency} with --quick).", rich_help_panel=ENDPOINT, show_default=False)] = None,
    request_rate: Annotated[Optional[float], typer.Option("--request-rate", help="With --endpoint: arrivals per second of the load part (> 0). Default: no limit (concurrency alone).", rich_help_panel=ENDPOINT, show_default=False)] = None,
    burstiness: Annotated[Optional[float], typer.Option(help="With --request-rate: gamma shape of the gaps (> 0): 1 = Poisson, < 1 burstier, > 1 more even. Default 1.", rich_help_panel=ENDPOINT, show_default=False)] = None,
    num_requests: Annotated[Optional[int], typer.Option("--num-requests", help=f"With --endpoint: requests of the load part (0 = skip). Default {_TD.load_requests} ({_TQ.load_requests} with --quick).", rich_help_panel=ENDPOINT, show_default=False)] = None,
    request_timeout: Annotated[Optional[float], typer.Option("--request-timeout", help=f"With --endpoint: seconds before a request counts as failed (> 0). Default {_TD.request_timeout:g}.", rich_help_panel=ENDPOINT, show_default=False)] = None,
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="With --endpoint: the NAME of the environment variable holding the API key (the key itself is never written anywhere). Default OPENAI_API_KEY.", rich_help_panel=ENDPOINT, show_default=False)] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="With --endpoint: a tokenizer (tiny | a Hugging Face id or path) to count output tokens when the server sends no usage.", rich_help_panel=ENDPOINT, show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Where time to first token goes: queueing, cold start, prompt length (prefill), RAG. Also: llmlab ttft.

    Two chatbots can take the same 4 s per answer and one feels snappy: its first word arrives in 200 ms. TTFT hides four layers. This lab serves streaming requests with one real worker and stamps every phase (template + tokenize, queue wait, prefill forward, first sample + detokenize, then each decode step), checks that the phases add up to the TTFT the client measured and reports the harness's own remainder; starts the model in a fresh process (interpreter, imports, weights, device, first forward) against the same request warm; sweeps the prompt from 16 tokens to --prompt-len and fits a + bT + cT^2 (where attention's T^2 takes over); sends Poisson arrivals at rising utilisation and a burst to one first-come-first-served worker and sets the queue waits (p50/p90/p99) beside M/D/1; and adds a real BM25 retrieval over the built-in corpus (RAG) next to the plain chat. Metrics follow vLLM's benchmark (TTFT, TPOT = (E2E - TTFT)/(n - 1), ITL, E2E), with how GenAI-Perf, llmperf and guidellm define theirs; the diagnosis names the layer that dominates this run.

    With --endpoint URL the same questions go to a running server, from the outside: every streamed chunk is stamped (vLLM bench serve's definitions), prompts have an exact token count through the server's /tokenize (else calibrated from usage), and the server's own phases are joined per request from its `timings` (llmlab serve, llama.cpp) or from vLLM-style /metrics histograms. Parts: one request alone as a waterfall; a prompt-length sweep with TTFT = a + bT (the prefill rate); a prefix probe (one long prefix twice; the drop is the prefix cache, checked against cache_n or the prefix-cache counters); and a load run (--concurrency, --request-rate, --burstiness; warm-up excluded) with p50/p90/p99 TTFT, TPOT, ITL, E2EL. --model names the served model (default: the server's first). Failed requests are kept with their error; if every request fails the run exits 3. Example: llmlab serve & llmlab ttft --endpoint http://127.0.0.1:8000 --quick
    """
    run_lab("ttft-breakdown", Common(device, gpu, quick, json_, out, no_save, seed, tables), prompt_len=prompt_len, model=model,
            rates=tuple(rate) if rate else None, utilizations=tuple(utilization) if utilization else None,
            requests_per_rate=requests, burst=burst, new_tokens=new_tokens, cold_starts=cold_starts, threads=threads,
            endpoint=endpoint, concurrency=concurrency, request_rate=request_rate, burstiness=burstiness, load_requests=num_requests,
            request_timeout=request_timeout, api_key_env=api_key_env, tokenizer=tokenizer)


app.command("ttft-breakdown", rich_help_panel=LABS)(ttft_breakdown)
app.command("ttft", rich_help_panel=LABS, hidden=True)(ttft_breakdown)  # the short name: the same command


@app.command("speculative", rich_help_panel=LABS)
def speculative(
    model: ModelOpt = "tiny",
    draft: Annotated[str, typer.Option("--draft", help="The draft model (same tokenizer as --model): tiny-draft | a Hugging Face id or local path.")] = "tiny-draft",
    gamma: Annotated[Optional[int], typer.Option("--gamma", help="Tokens drafted per round (>= 1). Default 4.", show_default=False)] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature of the main comparison (>= 0; 0 = greedy, the default).", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Speculative decoding: a small draft guesses gamma tokens, the target checks them all in one forward, and the output stays exactly the target's.

    Decoding is one target forward per token. A draft ~5x cheaper proposes gamma tokens; the target scores all gamma + 1 positions at once, keeps the longest accepted prefix plus one token of its own, and the caches are cropped past the first rejection. Greedy: accept while the draft equals the target's argmax. Sampling: accept a token with probability min(1, p/q) and at the first rejection draw from norm(max(0, p - q)) (Leviathan et al., Chen et al.), which makes the output distributed exactly as the target's. This lab proves that (greedy token-for-token identity, a chi-square test against the target's exact law), then measures tokens/s of plain decoding (our loop, HF generate) and speculative decoding (ours, HF assisted generation with the same draft and gamma), the acceptance rate alpha, tokens per round tau, beta = sum min(p, q), the draft/target cost ratio c, and sets Leviathan's predicted speed-up (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) beside the measured one; then sweeps gamma 1..8 and temperature, compares draft-length policies (constant, +2/-1, confidence, oracle), a token tree verified in one forward with a tree attention mask, and batch sizes.
    """
    run_lab("speculative", Common(device, gpu, quick, json_, out, no_save, seed, tables), model=model, draft=draft, gamma=gamma,
            temperature=temperature)


@app.command("train-vs-infer", rich_help_panel=LABS)
def train_vs_infer(
    model: Annotated[Optional[list[str]], typer.Option("--model", "-m", help="Models to measure (repeatable): tiny | arch:NAME (cut to --arch-layers, random weights) | a Hugging Face id. Default: tiny and arch:qwen2.5-0.5b (tiny only with --quick).", show_default=False)] = None,
    batch: Annotated[Optional[int], typer.Option(help="Sequences per step (>= 1).", show_default=False)] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence (>= 8).", show_default=False)] = None,
    gen_tokens: Annotated[Optional[int], typer.Option("--gen-tokens", help="Tokens of conversation generated before checking that nothing changed (>= 16).", show_default=False)] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="AdamW learning rate of the one training step on that conversation (> 0).", show_default=False)] = None,
    arch_layers: Annotated[Optional[int], typer.Option("--arch-layers", help="Layers kept of an arch: model (>= 1).", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (0 = torch's default).", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Training does two things, inference one: a forward vs forward + backward + AdamW, their FLOPs and bytes, and why inference does not learn.

    Training runs a forward pass, then a backward pass (about twice the forward's FLOPs) and a weight update, and keeps gradients and Adam's two moments: 16 bytes per parameter before activations, against 2-4 for inference weights. It sees every position of a sequence at once (teacher forcing), while generation produces one token per forward. This lab times and counts (FlopCounterMode) the three regimes on the same batch, counts their bytes tensor by tensor (weights, grads, optimizer state, saved activations, KV cache), scales Llama 3 8B onto one 80 GB GPU by formula, races one forward over T tokens against T decode steps, and checks that generating 1,000 tokens leaves the weights' hash, .grad and the next answer unchanged, while one AdamW step on that conversation changes them.
    """
    run_lab("train-vs-infer", Common(device, gpu, quick, json_, out, no_save, seed, tables),
            models=tuple(model) if model else None, batch=batch, seq_len=seq_len, gen_tokens=gen_tokens, lr=lr,
            arch_layers=arch_layers, threads=threads)


@app.command("five-steps", rich_help_panel=LABS)
def five_steps(
    model: ModelOpt = "tiny",
    prompt: Annotated[Optional[str], typer.Option(help="The text whose next word is followed through the model.", show_default=False)] = None,
    big: Annotated[Optional[str], typer.Option("--big", help="A larger arch: model walked on the meta device (shapes only). Default arch:llama-3-8b.", show_default=False)] = None,
    size: Annotated[Optional[list[str]], typer.Option("--size", help="arch: models for the breakdown vs size (repeatable; timed on --size-layers layers, scaled). Default qwen2.5-0.5b and llama-3.2-1b; none with --quick.", show_default=False)] = None,
    size_layers: Annotated[Optional[int], typer.Option("--size-layers", help="Layers of each --size model actually run (>= 1).", show_default=False)] = None,
    prefill_tokens: Annotated[Optional[int], typer.Option("--prefill-tokens", help="Tokens of the timed prefill (>= 2).", show_default=False)] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="p of step 5 under top-p, in (0, 1].", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Watch a model produce one word: tokenize and embed, attention, MLP (once per layer), LM head, sample; shapes, candidates and where the time goes.

    The lab calls the model's own submodules in order by hand and records the real tensor shape after each step (on tiny, and on Llama 3 8B's full shape on the meta device), shows the top-5 words after the LM head and what greedy and top-p pick, checks the hand run gives the forward's logits (no secret sixth step), and stamps each step with forward hooks during a decode step and a prefill: time, FLOPs (shape formula vs FlopCounterMode) and weight bytes per step, and how the split moves with model size.
    """
    run_lab("five-steps", Common(device, gpu, quick, json_, out, no_save, seed, tables), model=model, prompt=prompt, big=big,
            sizes=tuple(size) if size else None, size_layers=size_layers, prefill_tokens=prefill_tokens, top_p=top_p)


def _ints(text: Optional[str], option: str) -> Optional[tuple[int, ...]]:
    """'16,64,256' -> (16, 64, 256); None stays None (the Config's default); '' is an empty tuple (Config refuses it)."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise UsageError(f"{option} {text!r}: give whole numbers separated by commas, e.g. 16,64,256") from None


from llmlab.labs.prefill_decode import Config as _PD  # noqa: E402  (light: torch loads inside the lab)

_PDD, _PDQ = _PD(), _PD.quick()


@app.command("prefill-decode", rich_help_panel=LABS)
def prefill_decode(
    model: Annotated[Optional[list[str]], typer.Option("--model", "-m", help=f"Models to time (repeatable); the first also gets parts 3-5. arch:NAME = random weights, timing only. Default: {', '.join(_PDD.models)} ({', '.join(_PDQ.models)} with --quick).", show_default=False)] = None,
    prompt_lens: Annotated[Optional[str], typer.Option("--prompt-lens", help=f"Prompt lengths T, comma-separated; lengths beyond a model's context are clamped away with a note. Default {_csv(_PDD.prompt_lens)} ({_csv(_PDQ.prompt_lens)} with --quick).", show_default=False)] = None,
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help=f"Decode batch sizes of the crossover sweep. Default {_csv(_PDD.batch_sizes)} ({_csv(_PDQ.batch_sizes)} with --quick).", show_default=False)] = None,
    output_lens: Annotated[Optional[str], typer.Option("--output-lens", help=f"Reply lengths n for E2E = TTFT + (n - 1) ITL. Default {_csv(_PDD.output_lens)} ({_csv(_PDQ.output_lens)} with --quick).", show_default=False)] = None,
    link_gbps: Annotated[Optional[float], typer.Option("--link-GBps", help="Link bandwidth (GB/s, one direction) that moves the KV in part 5. Default: the spec values of PCIe 4.0 x16 (32) and NVLink 4 (450).", show_default=False)] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help=f"auto (float32 on a CPU, bfloat16 on a GPU) | float32 | bfloat16 | float16. Default {_PDD.dtype}.", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads for roofs and model alike. Default: torch's, or 1 when the CPU is oversubscribed.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """One request, two personalities: prefill (reading the prompt, math-bound) vs decode (writing the reply, fetching data).

    A prefill pushes all T prompt tokens through each weight at once; a decode step pushes one token through every weight. This lab times both on your device (tokens/s and the ratio), counts their FLOPs and bytes from the model's shape (checked against torch's FlopCounterMode) and places them on the roofline measured with the roofline lab's kernels, finds the decode batch at which decode turns compute-bound, predicts E2E = TTFT + (n - 1) x ITL from the parts and times the whole, and prices disaggregated serving: the KV bytes a request moves from a prefill device to a decode device over PCIe or NVLink. On a CPU it also says what really bounds decode when the model sits in cache.
    """
    if link_gbps is not None and link_gbps <= 0:
        raise UsageError(f"--link-GBps {link_gbps}: give a positive bandwidth in GB/s")
    run_lab("prefill-decode", Common(device, gpu, quick, json_, out, no_save, seed, tables),
            models=tuple(model) if model else None, prompt_lens=_ints(prompt_lens, "--prompt-lens"),
            batch_sizes=_ints(batch_sizes, "--batch-sizes"), output_lens=_ints(output_lens, "--output-lens"),
            link_GBps=link_gbps, dtype=dtype, threads=threads)


from llmlab.labs.serving import Config as _SV  # noqa: E402  (light: torch loads inside the lab)

_SVD, _SVQ = _SV(), _SV.quick()


@app.command("serving", rich_help_panel=LABS)
def serving(
    model: ModelOpt = "tiny",
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", help="An OpenAI-compatible server (http://host:port): parts 1 and 4 measure it; the rest need the in-process engine.", show_default=False)] = None,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", help=f"Top of the concurrency sweep (>= 1). Default {_SVD.max_concurrency} ({_SVQ.max_concurrency} with --quick).", show_default=False)] = None,
    kv_blocks: Annotated[Optional[int], typer.Option("--kv-blocks", help=f"KV pool of part 3, in blocks of 16 tokens (at least one conversation). Default {_SVD.kv_blocks}.", show_default=False)] = None,
    price_per_hour: Annotated[Optional[float], typer.Option("--price-per-hour", help=f"Your machine's price in $/hour for the cost part (>= 0). Default {_SVD.price_per_hour:g}: an example, not a market price.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Serving: concurrency, static vs continuous batching, KV capacity, prefix reuse, chunked prefill, cost per token.

    One request at a time leaves a GPU mostly idle; batching is the lever, and the KV cache, not the weights, limits how many conversations fit. This lab measures each on llmlab's paged, continuously batching engine (checked exact against HF first): tokens/s and TTFT/ITL/TPOT (vLLM's definitions) vs concurrency with the step-time knee and the compute and bandwidth utilisation at 1 client; static vs continuous batching under Poisson arrivals with mixed reply lengths; peak concurrent conversations in a fixed KV pool against blocks / blocks per conversation; a shared system prompt with the prefix cache off and on; the ITL of running decodes while a long prompt is prefilled whole or in chunks; and $ per 1M tokens from the measured throughput. With --endpoint the client-side parts run against any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, llmlab serve).
    """
    if endpoint is not None:
        from llmlab.loadgen.probe import check_reachable

        check_reachable(endpoint)
    run_lab("serving", Common(device, gpu, quick, json_, out, no_save, seed, tables), model=model, endpoint=endpoint,
            max_concurrency=max_concurrency, kv_blocks=kv_blocks, price_per_hour=price_per_hour)


from llmlab.labs.quantization import QUICK as _QZQ  # noqa: E402  (light: torch loads inside the lab)
from llmlab.labs.quantization import Config as _QZ  # noqa: E402

_QZD = {f.name: f.default for f in dataclasses.fields(_QZ)}  # defaults without building a Config (that loads torch)


@app.command("quantization", rich_help_panel=LABS)
def quantization(
    weights: Annotated[Optional[str], typer.Option("--weights", help=f"Weight formats, comma-separated (FP32 always runs as the reference). Default {_csv(_QZD['weights'])} ({_csv(_QZQ['weights'])} with --quick).", show_default=False)] = None,
    kv: Annotated[Optional[str], typer.Option("--kv", help=f"KV cache formats, comma-separated: fp32, bf16, fp8, int8, nvfp4. Default {_csv(_QZD['kv'])}.", show_default=False)] = None,
    arch: Annotated[Optional[str], typer.Option("--arch", help=f"An arch:NAME shape (random weights, {_QZD['arch_layers']} layers) added to the speed part, or '' for none. Default {_QZD['arch']} (none with --quick).", show_default=False)] = None,
    repeats: Annotated[Optional[int], typer.Option("--repeats", help=f"Interleaved timing rounds. Default {_QZD['repeats']} ({_QZQ['repeats']} with --quick).", show_default=False)] = None,
    eval_tokens: Annotated[Optional[int], typer.Option("--eval-tokens", help=f"Held-out tokens for the loss. Default {_QZD['eval_tokens']} ({_QZQ['eval_tokens']} with --quick).", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads. Default: torch's, or 1 when the CPU is oversubscribed.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Quantization: precision traded for memory and speed, in the weights and in the KV cache.

    Applies FP32, BF16, FP16, INT8 per-channel, INT4 group-wise (sym/asym) and FP8 E4M3 to the built-in tiny model's weights and measures the three sides of the trade: bytes (counted from the packed tensors, against bits x params + scales), quality (held-out loss and perplexity delta, KL and greedy agreement against FP32) and decode tokens/s at batch 1 and 16, each row naming its path (a real kernel, or dequantize-on-the-fly where this device has none). Then the KV cache: BF16, FP8, INT8 and NVFP4 (E2M1 values, an E4M3 scale per 16, an FP32 scale per tensor, emulated exactly): bytes per token against the formula, tokens that fit on an 80 GB GPU for Llama 3 8B and 3.1 70B, and tiny's quality with its cache quantized in the decode loop.
    """
    split = lambda text: None if text is None else tuple(x for x in text.replace(" ", "").split(",") if x)  # noqa: E731
    run_lab("quantization", Common(device, gpu, quick, json_, out, no_save, seed, tables), weights=split(weights),
            kv=split(kv), arch=arch, repeats=repeats, eval_tokens=eval_tokens, threads=threads)


from llmlab.labs.tensor_parallel import Config as _TP  # noqa: E402  (light: torch loads inside the lab)

_TPD, _TPQ = _TP(), _TP.quick()


@app.command("tensor-parallel", rich_help_panel=LABS)
def tensor_parallel(
    nproc: Annotated[Optional[int], typer.Option("--nproc", help=f"Ranks = the TP degree (>= 2; one per GPU on CUDA, from --gpu N on; with fewer GPUs and --backend auto the ranks run on gloo over the CPU). Default {_TPD.nproc}.", show_default=False)] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", help="auto (nccl on CUDA, gloo on the CPU) | gloo | nccl.", show_default=False)] = None,
    timeout_s: Annotated[Optional[float], typer.Option("--timeout-s", help=f"Seconds before a rank still running is declared hung (exit 3). Default {_TPD.timeout_s:g} ({_TPQ.timeout_s:g} with --quick).", show_default=False)] = None,
    fit_context: Annotated[Optional[int], typer.Option("--fit-context", help=f"Part 4: tokens per sequence. Default {_TPD.fit_context}.", show_default=False)] = None,
    fit_batch: Annotated[Optional[int], typer.Option("--fit-batch", help=f"Part 4: sequences. Default {_TPD.fit_batch}.", show_default=False)] = None,
    device: DeviceOpt = "auto", gpu: GpuOpt = None, quick: QuickOpt = False, json_: JsonOpt = False,
    out: OutOpt = "results", no_save: NoSaveOpt = False, seed: SeedOpt = 0, tables: TablesOpt = "report",
) -> None:
    """Tensor parallelism: collectives and a sharded decode on torch.distributed (gloo on the CPU, NCCL on GPUs).

    When a model or its KV cache outgrows one GPU, engines split each layer across GPUs and pay two all-reduces per layer. This lab spawns --nproc ranks, splits the built-in tiny Megatron-style (heads and KV heads column-split, o_proj and down row-split) and checks its logits against one process within 1e-5 first; times all-reduce, all-gather and reduce-scatter from 8 B up with nccl-tests' algbw and busbw; splits a decode step at TP 1 and TP n into compute and all-reduce time; and says by formula how many 80 GB GPUs Llama-3.1-70B needs. Also runs under torchrun --nproc-per-node N -m llmlab tensor-parallel.
    """
    run_lab("tensor-parallel", Common(device, gpu, quick, json_, out, no_save, seed, tables), nproc=nproc, backend=backend,
            timeout_s=timeout_s, fit_context=fit_context, fit_batch=fit_batch)


