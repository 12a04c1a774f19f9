"""The tensor-parallel lab's formulas in the parent process: comm predicted from the sweep, what fits on GPUs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmlab.labs.tensor_parallel.config import Config

if TYPE_CHECKING:
    import pandas as pd

# ---------------------------------------------------------------- formulas (parent process)


def in_scope(coll: pd.DataFrame, scope: str) -> pd.DataFrame:
    """The sweep's rows of one scope ("world", "intra-node", "inter-node"); a run without scopes is all "world"."""
    return coll[coll.scope == scope] if "scope" in coll else (coll if scope == "world" else coll.iloc[0:0])


def predicted_comm_ms(coll: pd.DataFrame, msg_bytes: float, calls: int) -> float:
    """calls x the all-reduce time at msg_bytes, interpolated log-log in part 2's sweep."""
    import numpy as np

    ar = in_scope(coll, "world")
    ar = ar[ar.op == "all_reduce"].dropna(subset=["time_us"]).sort_values("size_bytes")
    if ar.empty:
        return math.nan
    t = np.exp(np.interp(np.log(msg_bytes), np.log(ar.size_bytes), np.log(ar.time_us)))
    return calls * float(t) / 1e3


def fits_rows(cfg: Config) -> list[dict]:
    from llmlab.core.flops import kv_bytes_per_token, param_count, shape
    from llmlab.core.models import load_config

    c = load_config(cfg.fit_model)
    s = shape(c)
    weights, kv_tok = param_count(c) * 2, kv_bytes_per_token(c, 2)  # BF16
    usable = cfg.usable * cfg.gpu_GB * 1e9
    need_kv = kv_tok * cfg.fit_context * cfg.fit_batch
    rows = []
    for tp in (1, 2, 4, 8):
        w, kv = weights / tp, kv_tok / tp  # everything split by TP (vLLM also splits the vocab)
        left = max(0.0, usable - w)
        rows.append(dict(model=cfg.fit_model, tp=tp, weights_GB_per_gpu=w / 1e9, kv_KiB_per_token_per_gpu=kv / 1024,
                         kv_needed_GB_per_gpu=need_kv / tp / 1e9, kv_tokens_left_per_gpu=int(left // kv),
                         kv_heads_divide=s["kv_heads"] % tp == 0, fits=w + need_kv / tp <= usable))
    return rows
