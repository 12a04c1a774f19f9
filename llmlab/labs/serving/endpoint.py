"""Parts 1 and 4 of the serving lab against a running OpenAI-compatible server (client-side metrics)."""

from __future__ import annotations

from llmlab.core.errors import UsageError
from llmlab.labs.serving.config import Config


def part_endpoint(res, cfg: Config, vocab: int, rng) -> None:
    """Parts 1 and 4 against an OpenAI-compatible server (client-side metrics, vLLM's definitions)."""
    import asyncio

    from llmlab.loadgen.client import calculate_metrics, run_load

    url = cfg.endpoint.rstrip("/") + "/v1/completions"
    words = "the of and to in is that for it as with was on be by this are or".split()

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    rows = []
    for c in cfg.levels():
        n = max(8, c * cfg.requests_per_level)
        payloads = [dict(model=cfg.model, prompt=text(cfg.prompt_len), max_tokens=cfg.output_len, stream=True,
                         ignore_eos=True, stream_options={"include_usage": True}) for _ in range(n)]
        run = asyncio.run(run_load(url, payloads, concurrency=c, warmup=1))
        m = calculate_metrics(run.records, run.duration_s)
        if m.completed == 0:
            raise UsageError(f"--endpoint {cfg.endpoint}: every request failed ({run.records[-1].error})")
        rows.append(dict(concurrency=c, requests=n, output_tokens_per_s=m.output_throughput,
                         requests_per_s=m.request_throughput,
                         p50_ttft_ms=m.p50_ttft_ms, p99_ttft_ms=m.p99_ttft_ms, p50_itl_ms=m.p50_itl_ms,
                         p99_itl_ms=m.p99_itl_ms,
                         p50_tpot_ms=m.p50_tpot_ms, error_rate=m.error_rate))
    res.add_table("concurrency", rows)
    res.skip("step_time", "the server's steps are not visible from a client")
    res.skip("prefix", "a server's prefix cache cannot be switched off from outside: `llmlab ttft --endpoint URL` "
                       "runs the prefix probe (one long prefix twice, checked against cache_n or the prefix counters)")
