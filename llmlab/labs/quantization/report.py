"""The quantization lab's report: the terminal views."""

from __future__ import annotations

from llmlab.core.results import Chart, Col, LabResult, View


def views(result: LabResult) -> list[View]:
    return [
        View("1. Weight formats: bytes and quality (tiny, FP32 compute)",
             "Bytes (= the formula, exactly) vs held-out loss, KL and greedy agreement?", "weights",
             (Col("format", "format", width=14), Col("bits_per_param", "bits / param", ".2f"),
              Col("x_bf16", "x BF16 bytes", ".3f"), Col("loss_delta", "loss delta nats", "+.4f"),
              Col("ppl_delta", "ppl delta", "+.2%"), Col("kl", "KL nats", ".2e"),
              Col("agreement", "greedy agree", "%")),
             chart=Chart("loss delta vs bits per parameter", "weights", "bits_per_param", "loss_delta", kind="scatter",
                         xlabel="bits / param", ylabel="nats")),
        View("2. Decode speed", "Tokens/s per format, batch 1 and 16: does the speed-up track the bytes?", "speed",
             (Col("model", "model", width=14), Col("format", "format", width=14), Col("batch", "B", "int"),
              Col("tokens_per_s", "tok / s", "int"), Col("speedup", "x FP32", "x"),
              Col("bytes_ratio", "bytes / FP32", "x"),
              Col("path", "path", width=28)), max_rows=30),
        View("3. KV cache formats: bytes and error", "Bytes per token of tiny's real cache, against the formula?",
             "kv_bytes", (Col("format", "format"), Col("bytes_per_token", "B / token", ".1f"),
                          Col("bytes_match", "= formula"), Col("x_fp8_bytes", "x FP8", ".3f"),
                          Col("rel_err_k", "K rel err", ".2e"), Col("rel_err_v", "V rel err", ".2e"))),
        View("   ... quality with the cache quantized in the decode loop",
             "Loss, KL and greedy agreement vs an FP32 cache?",
             "kv_quality", (Col("format", "format"), Col("loss_delta", "loss delta nats", "+.4f"),
                            Col("ppl_delta", "ppl delta", "+.2%"), Col("kl", "KL nats", ".2e"),
                            Col("agreement", "greedy agree", "%"))),
        View("   ... tokens that fit on an 80 GB GPU after the weights", "How many tokens of KV per format (formula)?",
             "kv_fit", (Col("model", "model", width=18), Col("weights", "weights"), Col("kv_format", "KV"),
                        Col("bytes_per_token", "B / token", "int"), Col("tokens", "tokens", "int"),
                        Col("x_fp8", "x FP8", "x")),
             rows=lambda df: df[df.kv_format != "fp32"]),
    ]
