"""The quantization lab's Config: every field is a command-line option (llmlab.core.config.opt)."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.core.config import opt

LAB = "quantization"
VERSION = 2  # 2: kernel paths per device (probed), synchronised steps, a device-sized model on a GPU, KV bytes measured
JUDGE_VERSION = 2
# Every weight format of llmlab.inference.quant (its WEIGHT_FORMATS, which a test holds equal) and the KV formats
# after the FP32 reference: named here so that the Config is checked without importing torch for them.
WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "int8", "int4-g32", "int4-g128", "int4-g32-asym", "int4-g128-asym",
                  "fp8-tensor", "fp8-channel")
KV_FORMATS = ("bf16", "fp8", "int8", "nvfp4")

# --quick: tiny only, fewer formats, tokens and rounds
QUICK = dict(weights=("fp32", "bf16", "int8", "int4-g128", "fp8-channel"), arch="", decode_tokens=8, prompt_len=16,
             repeats=2, eval_tokens=2048, kl_tokens=1024, agree_prompts=8, agree_tokens=16, kv_tokens=128)


@dataclass(frozen=True)
class Config:
    """Quantization: precision traded for memory and speed, in the weights and in the KV cache.

    Applies FP32, BF16, FP16, INT8 per-channel, INT4 group-wise (sym/asym) and FP8 E4M3 to the built-in tiny model's
    weights and measures the three sides of the trade: bytes (counted from the packed tensors, against bits x params
    + scales), quality (held-out loss and perplexity delta, KL and greedy agreement against FP32) and decode tokens/s
    at batch 1 and 16, each row naming its path (a real kernel, or dequantize-on-the-fly where this device has
    none). Then the KV cache: BF16, FP8, INT8 and NVFP4 (E2M1 values, an E4M3 scale per 16, an FP32 scale per
    tensor, emulated exactly): bytes per token against the formula, tokens that fit on an 80 GB GPU for Llama 3 8B
    and 3.1 70B, and tiny's quality with its cache quantized in the decode loop.
    """

    weights: tuple[str, ...] = opt(WEIGHT_FORMATS, help="Weight formats, comma-separated (FP32 always runs as the "
                                                        "reference; int4-gG takes any even G).")  # every one
    kv: tuple[str, ...] = opt(KV_FORMATS, help="KV cache formats, comma-separated: fp32, bf16, fp8, int8, "
                                               "nvfp4.")  # the FP32 cache is the reference
    arch: str = opt("arch:qwen2.5-0.5b", help="An arch:NAME shape (random weights, --arch-layers layers) added to the "
                                              "speed part, or '' for none.")  # a real shape's layer and LM head
    arch_layers: int = opt(2, help="Layers kept of --arch (>= 1): the shape of a layer and the LM head, timing only.")
    arch_weights: tuple[str, ...] = opt(("fp32", "bf16", "int8"), help="Weight formats timed on --arch, "
                                        "comma-separated.")  # real kernels only: emulated INT4/FP8 take ~10 s a step
    arch_decode_tokens: int = opt(8, help="Tokens decoded per timed call on --arch (>= 2).")  # ~0.5 s a step here
    arch_repeats: int = opt(3, help="Interleaved timing rounds on --arch, the median kept (>= 1).")
    gpu_arch: str = opt("arch:llama-3-8b", help="On a GPU the speed part's arch:NAME shape instead of tiny, its "
                                                "layers from the free memory.")  # tiny sits in the L2
    batches: tuple[int, ...] = opt((1, 16), help="Decode batches of the speed part, comma-separated (>= 1).")
    decode_tokens: int = opt(32, help="Tokens decoded per timed call (>= 2).")
    prompt_len: int = opt(32, help="Prompt tokens of the timed decode.")
    repeats: int = opt(5, help="Interleaved timing rounds, the median kept (>= 1).")
    eval_tokens: int = opt(32_768, help="Held-out tokens for the loss (>= 512).")  # the model card's amount
    kl_tokens: int = opt(8_192, help="Held-out tokens for the KL (>= 256; a forward of FP32 and of each format).")
    agree_prompts: int = opt(32, help="Prompts of the greedy agreement (>= 1).")  # x 32 tokens = 1,024 positions
    agree_tokens: int = opt(32, help="Greedy tokens per agreement prompt (>= 2).")
    kv_tokens: int = opt(256, help="Length of the prefill whose cache is measured for bytes and error (>= 16).")
    gpu_gb: float = opt(80.0, help="GPU memory in GB of the fit table (> 0).")  # A100/H100 80 GB
    threads: int = opt(0, help="torch CPU threads (0: torch's, or 1 when the CPU is oversubscribed).")
    seed: int = 0

    def __post_init__(self):
        unknown = [w for w in self.weights + self.arch_weights if w not in WEIGHT_FORMATS] + \
            [k for k in self.kv if k not in KV_FORMATS + ("fp32",)]
        if unknown:  # only a name outside the tables loads torch, for quant's own checks and messages
            from llmlab.inference import quant

            for w in self.weights + self.arch_weights:
                quant.check_weight_format(w)
            for k in self.kv:
                quant.check_kv_format(k)
        if not self.weights or not self.kv:
            raise ValueError("--weights and --kv need at least one format each")
        if min(self.batches, default=0) < 1 or min(self.decode_tokens, self.arch_decode_tokens) < 2 or \
                min(self.repeats, self.arch_repeats) < 1:
            raise ValueError("batches must be >= 1, decode tokens >= 2, repeats >= 1")
        if self.eval_tokens < 512 or self.kl_tokens < 256 or self.agree_prompts < 1 or self.agree_tokens < 2:
            raise ValueError("--eval-tokens must be >= 512 (two 256-token windows); agreement needs >= 1 prompt")
        if self.kv_tokens < 16 or self.gpu_gb <= 0 or self.arch_layers < 1 or self.threads < 0:
            raise ValueError("kv tokens >= 16, GPU GB > 0, arch layers >= 1, threads >= 0")
        for a in (self.arch, self.gpu_arch):
            if a and not a.startswith("arch:"):
                raise ValueError(f"--arch {a!r}: give an arch:NAME shape (random weights) or ''")

    @classmethod
    def quick(cls) -> Config:
        return cls(**QUICK)
