"""`llmlab serve`: load, check exact against HF, size the KV pool, run uvicorn.

Rules:
- dtype `auto` is BF16 on a GPU (FP16 where the GPU has no BF16), FP32 on the CPU; the exactness
  check's tolerance follows the dtype (`engine.exact_atol`: a half-precision forward differs from
  HF's by rounding).
- The KV pool: `--kv-blocks` when given; else on CUDA what `engine.num_blocks_for_memory` leaves
  after the weights and one step's reserve within gpu_memory_utilization of the card (as vLLM
  sizes it); on the CPU 1,024 blocks (the machine's RAM is shared with everything else).
- All torch work runs on one thread (see async_engine.py), the model load included.
- The API key is never printed or logged: the start line says only whether one is required.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from llmlab.core.errors import UsageError

# torch, the engine and uvicorn are imported inside the functions that need them: the port and
# option checks answer in milliseconds, before seconds of imports.

CPU_KV_BLOCKS = 1024  # 16 K tokens: for tiny 96 MiB in FP32, plenty for 2-core CPU loads
DTYPES = ("float32", "bfloat16", "float16")


def resolve_dtype(dtype: str, device_type: str) -> str:
    dtype = dtype.lower()
    if dtype not in ("auto", *DTYPES):
        raise UsageError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
    if dtype != "auto":
        return dtype
    if device_type != "cuda":
        return "float32"
    import torch

    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def size_pool(model, dev, kv_blocks: int | None, block_size: int, utilization: float, max_num_seqs: int,
              max_num_batched_tokens: int) -> int:
    """--kv-blocks, else 1,024 on the CPU, else what the GPU's free memory holds (UsageError when not a block)."""
    if kv_blocks is not None:
        return kv_blocks
    if dev.kind != "cuda":
        return CPU_KV_BLOCKS
    import torch

    from llmlab.serving.engine.llm_engine import num_blocks_for_memory

    torch.cuda.empty_cache()  # the exactness check's buffers are not the server's
    try:
        return num_blocks_for_memory(model, dev, block_size, utilization, max_num_seqs, max_num_batched_tokens)
    except ValueError as exc:
        raise UsageError(f"{dev.spec}: {exc} (--gpu-memory-utilization {utilization})") from None


def build(model: str, dev, dtype: str, kv_blocks: int | None, max_num_seqs: int, max_num_batched_tokens: int,
          prefix_cache: bool, utilization: float):
    """(loaded model, engine, exactness report); runs on the torch thread."""
    import torch

    from llmlab.core.models import load
    from llmlab.serving.engine.llm_engine import Engine, EngineConfig, check_exact

    lm = load(model, dev, dtype)
    if lm.tokenizer is None:
        raise UsageError(f"{model} has no tokenizer (arch: models have random weights): serve needs a trained model")
    g = torch.Generator().manual_seed(0)
    probe = [torch.randint(1, lm.config.vocab_size, (n,), generator=g).tolist() for n in (7, 21)]
    exact = check_exact(
        Engine(lm.model, EngineConfig(num_blocks=8, max_num_batched_tokens=16, dtype=dtype)), probe, max_new_tokens=4
    )
    blocks = size_pool(
        lm.model, dev, kv_blocks, EngineConfig.block_size, utilization, max_num_seqs, max_num_batched_tokens
    )
    try:
        cfg = EngineConfig(num_blocks=blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           enable_prefix_cache=prefix_cache, dtype=dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return lm, Engine(lm.model, cfg, lm.tokenizer.eos_token_id), exact


def check_port(host: str, port: int) -> None:
    """Fail fast, with one line, before loading anything."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(model: str = "tiny", host: str = "127.0.0.1", port: int = 8000, device: str = "auto", max_num_seqs: int = 64,
          kv_blocks: int | None = None, prefix_cache: bool = True, max_num_batched_tokens: int = 512, log=print, *,
          gpu: int | None = None, dtype: str = "auto", gpu_memory_utilization: float = 0.9,
          api_key: str | None = None) -> None:
    """Load the model, check the engine exact against HF, then serve until Ctrl-C."""
    check_port(host, port)
    import uvicorn

    from llmlab.core.device import resolve_device
    from llmlab.serving.server.app import create_app

    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    dev = resolve_device(device, gpu)
    dt = resolve_dtype(dtype, dev.kind)
    torch_thread = ThreadPoolExecutor(1, thread_name_prefix="llmlab-torch")
    lm, engine, exact = torch_thread.submit(build, model, dev, dt, kv_blocks, max_num_seqs, max_num_batched_tokens,
                                            prefix_cache, gpu_memory_utilization).result()
    cfg = engine.cfg
    log(
        f"llmlab serve: {model} on {dev.spec} in {dt}, {cfg.num_blocks} KV blocks x {cfg.block_size} tokens, max "
        f"{cfg.max_num_seqs} "
        f"seqs, prefix cache {'on' if prefix_cache else 'off'}, context {engine.max_model_len}; exact vs HF (max "
        f"|logit diff| "
        f"{exact['max_abs_logit_diff']:.1e}, tolerance {exact['atol']:g}); API key {'required' if api_key else 'off'}; "
        f"http://{host}:{port}/v1"
    )
    app = create_app(engine, lm.tokenizer, model, executor=torch_thread, host=host, api_key=api_key)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        torch_thread.shutdown(wait=False)
