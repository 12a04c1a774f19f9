"""Model references: the built-in pair, any Hugging Face id or local path, and `arch:NAME`.

One way in for every lab: `load(ref, device, dtype)` returns a `LoadedModel` (model in eval mode on
the device, its tokenizer, and whether its outputs are timings only).

- `tiny`, `tiny-draft`: the trained pair shipped in `llmlab/tiny/weights/` (see its MODEL_CARD.md).
- `org/name` or a local folder with `config.json`: loaded with `from_pretrained`, safetensors
  preferred, `trust_remote_code` off unless asked.
- `arch:NAME`: a published architecture (registry below) with random weights, for timing and
  memory labs without downloads. Its memory is estimated from the config before anything is
  allocated, and it is refused when it will not fit.

References (the registry's values are the published `config.json` of each model):
- https://huggingface.co/meta-llama/Llama-2-7b-hf, .../Meta-Llama-3-8B, .../Llama-3.1-70B, .../Llama-3.2-1B
- https://huggingface.co/mistralai/Mistral-7B-v0.1
- https://huggingface.co/Qwen/Qwen2.5-0.5B, .../Qwen2.5-1.5B, .../Qwen2.5-7B
- KV cache size: 2 (K and V) x layers x kv_heads x head_dim x bytes per element, per token.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmlab.core.device import Device, resolve_device
from llmlab.core.errors import UsageError
from llmlab.core.flops import kv_bytes_per_token, param_count, shape

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from llmlab.core.device import Device

BUILTINS = ("tiny", "tiny-draft")
WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "tiny" / "weights"

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

# Published config.json values. head_dim is hidden / heads in all of them (given explicitly where
# the published config does); sliding_window only where the model uses it (Mistral-7B v0.1).
ARCHS: dict[str, dict] = {
    "llama-2-7b": dict(hf_id="meta-llama/Llama-2-7b-hf", model_type="llama", layers=32, hidden=4096,
                       heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=32000,
                       rope_theta=10000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
                       tie_word_embeddings=False),
    "llama-3-8b": dict(hf_id="meta-llama/Meta-Llama-3-8B", model_type="llama", layers=32, hidden=4096,
                       heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                       rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5,
                       tie_word_embeddings=False),
    "llama-3.1-70b": dict(hf_id="meta-llama/Llama-3.1-70B", model_type="llama", layers=80, hidden=8192,
                          heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256,
                          rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                          tie_word_embeddings=False, rope_scaling={**_LLAMA3_ROPE, "factor": 8.0}),
    "llama-3.2-1b": dict(hf_id="meta-llama/Llama-3.2-1B", model_type="llama", layers=16, hidden=2048,
                         heads=32, kv_heads=8, head_dim=64, intermediate=8192, vocab=128256,
                         rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, rope_scaling={**_LLAMA3_ROPE, "factor": 32.0}),
    "mistral-7b": dict(hf_id="mistralai/Mistral-7B-v0.1", model_type="mistral", layers=32, hidden=4096,
                       heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=32000,
                       rope_theta=10000.0, max_position_embeddings=32768, sliding_window=4096,
                       rms_norm_eps=1e-5, tie_word_embeddings=False),
    "qwen2.5-0.5b": dict(hf_id="Qwen/Qwen2.5-0.5B", model_type="qwen2", layers=24, hidden=896,
                         heads=14, kv_heads=2, head_dim=64, intermediate=4864, vocab=151936,
                         rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hf_id="Qwen/Qwen2.5-1.5B", model_type="qwen2", layers=28, hidden=1536,
                         heads=12, kv_heads=2, head_dim=128, intermediate=8960, vocab=151936,
                         rope_theta=1000000.0, max_position_embeddings=131072, rms_norm_eps=1e-6,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(hf_id="Qwen/Qwen2.5-7B", model_type="qwen2", layers=28, hidden=3584,
                       heads=28, kv_heads=4, head_dim=128, intermediate=18944, vocab=152064,
                       rope_theta=1000000.0, max_position_embeddings=131072, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
}

_DTYPES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2}


@dataclass
class LoadedModel:
    ref: str
    kind: str  # "builtin" | "hf" | "arch"
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # None for arch: (no trained tokenizer)
    timing_only: bool  # True for arch: random weights give timings, never a quality claim

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


# ---------------------------------------------------------------- resolving a reference


def builtin_path(name: str) -> Path:
    """The shipped HF folder of a built-in model."""
    if name not in BUILTINS:
        raise UsageError(f"'{name}' is not a built-in model: built-ins are {', '.join(BUILTINS)}")
    path = WEIGHTS_DIR / name
    if not (path / "config.json").is_file():
        raise UsageError(f"the built-in '{name}' is missing from {path}: reinstall llmlab or run `llmlab tiny train`")
    return path


def _refs_hint() -> str:
    return (f"built-ins: {', '.join(BUILTINS)}; arch: {', '.join('arch:' + a for a in ARCHS)}; "
            "or a Hugging Face id (org/name) or a local folder with config.json")


def _arch_name(ref: str) -> str:
    name = ref[len("arch:"):].strip().lower()
    if name not in ARCHS:
        raise UsageError(f"unknown architecture '{ref}': known are {', '.join('arch:' + a for a in ARCHS)}")
    return name


def classify(ref: str) -> tuple[str, str]:
    """(kind, location): kind is builtin | arch | path | hub. Raises UsageError for anything else."""
    ref = (ref or "").strip()
    if ref in BUILTINS:
        return "builtin", str(builtin_path(ref))
    if ref.startswith("arch:"):
        return "arch", _arch_name(ref)
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise UsageError(f"'{ref}' is not a model folder: it has no config.json")
        return "path", str(path)
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise UsageError(f"no such folder '{ref}'")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", ref):
        return "hub", ref
    raise UsageError(f"unknown model '{ref}': {_refs_hint()}")


def _check_remote_code(folder: Path, trust_remote_code: bool) -> None:
    """Refuse a local folder that ships its own modelling code, unless trusted."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {folder / 'config.json'}: {exc}") from None
    if cfg.get("auto_map") and not trust_remote_code:
        raise UsageError(f"'{folder}' needs remote code (its config.json has auto_map): "
                         "pass --trust-remote-code only if you trust that code")
    if cfg.get("model_type") not in CONFIG_MAPPING and not cfg.get("auto_map"):
        raise UsageError(f"'{folder}': model_type '{cfg.get('model_type')}' is unknown to this transformers")


def _hub_error(ref: str, exc: Exception) -> UsageError:
    text = f"{type(exc).__name__}: {exc}"
    if "trust_remote_code" in text:
        return UsageError(f"'{ref}' needs remote code: pass --trust-remote-code only if you trust that code")
    if "RepositoryNotFound" in text or "is not a valid model identifier" in text:
        return UsageError(f"'{ref}' was not found on the Hugging Face hub (or it is gated): {_refs_hint()}")
    return UsageError(f"the Hugging Face hub is unreachable (offline or HF_HUB_OFFLINE=1) and '{ref}' is not "
                      "in the local cache: use a local folder with config.json, or a built-in (tiny, tiny-draft)")


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 3.0) -> bool:
    """False under HF_HUB_OFFLINE or when the hub's host does not answer within timeout_s
    (instead of huggingface_hub's five retries with back-off, ~25 s, before the same failure)."""
    import huggingface_hub.constants as hc

    if hc.HF_HUB_OFFLINE:
        return False
    url = urllib.parse.urlparse(hc.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def arch_config(name: str) -> PretrainedConfig:
    """The HF config of a registry architecture (accepts `llama-3-8b` or `arch:llama-3-8b`)."""
    from transformers import AutoConfig

    a = ARCHS[_arch_name(name if name.startswith("arch:") else "arch:" + name)]
    kwargs = dict(
        num_hidden_layers=a["layers"], hidden_size=a["hidden"], num_attention_heads=a["heads"],
        num_key_value_heads=a["kv_heads"], head_dim=a["head_dim"], intermediate_size=a["intermediate"],
        vocab_size=a["vocab"], rope_theta=a["rope_theta"], max_position_embeddings=a["max_position_embeddings"],
        rms_norm_eps=a["rms_norm_eps"], tie_word_embeddings=a["tie_word_embeddings"],
    )
    if a.get("rope_scaling"):
        kwargs["rope_scaling"] = dict(a["rope_scaling"], rope_theta=a["rope_theta"])
    if a["model_type"] == "mistral":
        kwargs["sliding_window"] = a["sliding_window"]
    if a["model_type"] == "qwen2":
        kwargs["use_sliding_window"] = False  # Qwen2.5 ships it off
    config = AutoConfig.for_model(a["model_type"], **kwargs)
    config.name_or_path = "arch:" + name.removeprefix("arch:")
    return config


def load_config(ref: str, trust_remote_code: bool = False) -> PretrainedConfig:
    """The config of any reference, without weights."""
    kind, loc = classify(ref)
    if kind == "arch":
        return arch_config(loc)
    from transformers import AutoConfig

    if kind == "path":
        _check_remote_code(Path(loc), trust_remote_code)
    try:
        return AutoConfig.from_pretrained(loc, trust_remote_code=trust_remote_code, local_files_only=_local_only(kind))
    except (OSError, ValueError) as exc:
        if kind == "hub":
            raise _hub_error(ref, exc) from None
        raise UsageError(f"cannot read the config of '{ref}': {str(exc).splitlines()[0]}") from None


def _local_only(kind: str) -> bool:
    """Hub references read the local cache only when the hub is unreachable (fail fast, one line)."""
    return kind != "hub" or not hub_reachable()


def load_tokenizer(ref: str, trust_remote_code: bool = False):
    """The tokenizer of a reference; None for arch: (random weights have no trained tokenizer)."""
    kind, loc = classify(ref)
    if kind == "arch":
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            loc, trust_remote_code=trust_remote_code, local_files_only=_local_only(kind)
        )
    except (OSError, ValueError) as exc:
        if kind == "hub":
            raise _hub_error(ref, exc) from None
        raise UsageError(f"cannot load the tokenizer of '{ref}': {str(exc).splitlines()[0]}") from None


# ---------------------------------------------------------------- bytes of the weights


def dtype_bytes(dtype) -> int:
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise UsageError(f"unknown dtype '{dtype}': use one of float32, bfloat16, float16")
        return _DTYPES[dtype.lower()]
    return dtype.itemsize


def torch_dtype(dtype):
    import torch

    if not isinstance(dtype, str):
        return dtype
    dtype_bytes(dtype)  # validates
    key = dtype.lower()
    return {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
            "half": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}[key]


def estimate_bytes(config, dtype) -> int:
    """Bytes of the weights alone (no activations, no KV cache)."""
    return param_count(config) * dtype_bytes(dtype)


# ---------------------------------------------------------------- loading


def _as_device(device):
    return device if isinstance(device, Device) else resolve_device(device)


def fits(config, dtype, device, headroom: float = 0.9) -> tuple[bool, int, int]:
    """(fits, needed bytes, free bytes): weights must fit in `headroom` of the device's free memory."""
    need = estimate_bytes(config, dtype)
    free = _as_device(device).free_memory_bytes()
    return need <= headroom * free, need, free


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _fill_random(model, seed: int = 0, std: float = 0.02) -> None:
    """Random weights at memcpy speed: one 1 M-value normal block tiled into every matrix
    (RNG for billions of values takes minutes on a CPU); norm weights 1, biases 0.
    Timing-only weights: the values need to be finite and of a realistic scale, not independent."""
    import torch

    pool = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0 if "norm" in name else 0.0)
                continue
            key = (p.device, p.dtype)
            if key not in pool:
                g = torch.Generator(device=p.device).manual_seed(seed)
                pool[key] = (torch.randn(1 << 20, generator=g, device=p.device) * std).to(p.dtype)
            flat, block = p.view(-1), pool[key]
            for start in range(0, flat.numel(), block.numel()):
                n = min(block.numel(), flat.numel() - start)
                flat[start : start + n].copy_(block[:n])


def _load_arch(ref: str, name: str, device, dtype) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = arch_config(name)
    ok, need, free = fits(config, dtype, device)
    if not ok:
        raise UsageError(f"{ref} needs {_gib(need)} of weights in {dtype} but {device.spec} has {_gib(free)} free: "
                         "pick a smaller arch:, a smaller dtype, or another device")
    with torch.device(device.torch), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    _fill_random(model)
    model.tie_weights()
    return LoadedModel(ref, "arch", model.eval(), None, timing_only=True)


def load(ref: str, device: Device | str = "cpu", dtype="float32", trust_remote_code: bool = False) -> LoadedModel:
    """Resolve a reference and load it in eval mode on the device."""
    device = _as_device(device)
    kind, loc = classify(ref)
    if kind == "arch":
        return _load_arch(ref, loc, device, dtype)
    config = load_config(ref, trust_remote_code)  # validates remote code / offline before any weights
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    if kind != "hub":
        hf_logging.disable_progress_bar()  # a local load takes milliseconds: no "Loading weights" bar
    try:
        model = AutoModelForCausalLM.from_pretrained(
            # safetensors are preferred by default; a .bin checkpoint loads only when it is all there is
            loc, config=config, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code,
            local_files_only=_local_only(kind),
        )
    except (OSError, ValueError) as exc:
        if kind == "hub":
            raise _hub_error(ref, exc) from None
        raise UsageError(f"cannot load '{ref}': {str(exc).splitlines()[0]}") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    model = model.to(device.torch).eval()
    tokenizer = load_tokenizer(ref, trust_remote_code)
    return LoadedModel(ref, "builtin" if kind == "builtin" else "hf", model, tokenizer, timing_only=False)


# ---------------------------------------------------------------- what `llmlab models` and `generate` show


def model_rows(device: Device | str = "cpu", dtype="bfloat16") -> list[dict]:
    """One row per built-in and registry entry: params, KV bytes/token (BF16), weight bytes, fits."""
    device = _as_device(device)
    free = device.free_memory_bytes()
    rows = []
    for ref in [*BUILTINS, *("arch:" + a for a in ARCHS)]:
        config = load_config(ref)
        s = shape(config)
        need = estimate_bytes(config, dtype)
        rows.append(dict(
            ref=ref, kind="builtin" if ref in BUILTINS else "arch", model_type=config.model_type,
            source=ARCHS[ref[5:]]["hf_id"] if ref.startswith("arch:") else str(builtin_path(ref)),
            params=param_count(config), layers=s["layers"], hidden=s["hidden"], heads=s["heads"],
            kv_heads=s["kv_heads"], head_dim=s["head_dim"], vocab=s["vocab"],
            max_position_embeddings=config.max_position_embeddings,
            kv_bytes_per_token=kv_bytes_per_token(config, 2), weights_bytes=need, dtype=str(dtype),
            fits=need <= 0.9 * free, timing_only=ref.startswith("arch:"),
        ))
    return rows
