"""Lab: one request, two personalities — prefill (reading the prompt) and decode (writing the reply).

The article's argument, each step turned into a measurement:
1. The two phases timed: a prefill of T tokens and a decode step at context T, on the built-in
   `tiny` (and `arch:` shapes with random weights: timings only). Tokens/s of each and their ratio.
2. Why: FLOPs and bytes of each phase from the model's shape (`llmlab.core.flops`, cross-checked
   with `torch.utils.flop_counter.FlopCounterMode`), FLOP/byte against this machine's ridge point
   measured with the roofline's own kernels (`llmlab.core.roofs`), and the achieved FLOP/s and
   GB/s as shares of the measured roofs. What bounds decode when it is not memory: per-op
   dispatch, estimated as (ops per step) x (the time of one tiny op).
3. The crossover: decode at batch B = 1 .. 256 against prefill at T: where decode's intensity
   reaches the ridge (the formula) and where its step time stops being flat (measured).
4. TTFT and ITL: TTFT = the prefill forward plus choosing the first token (the prefill's logits
   are the first token's), ITL = one decode step; E2E = TTFT + (n - 1) ITL predicted from the parts
   against generation timed end to end.
5. Disaggregation, napkin form (the `disagg` table, in the JSON): KV bytes per request, moved over
   a link (PCIe 4.0 x16, NVLink: spec values, or --link-GBps), against the prefill it replaces.
6. Decode's share of a whole generation at realistic reply lengths, from TTFT and ITL, timed.
7. Disaggregation, run (`disagg.py`): two torch.distributed ranks, each with llmlab's engine; one
   prefills and ships the KV blocks, the other decodes beside running replies; against the same
   engine colocated with chunked prefill under the same arrivals: bytes at the measured link rate,
   the running replies' ITL, the TTFT the hand-off costs.

How bytes are counted: see llmlab/core/flops.py (weights once per forward, KV read/written once,
matmul inputs and outputs once). A model that fits in the last-level cache is read from cache,
not DRAM: the DRAM roof is then an upper bound on time, and the report says so.

References:
- "AI Inference, Optimizations & Evals", part 3 (prefill vs decode); vLLM's benchmark metrics
  (TTFT, ITL, E2E = TTFT + (n - 1) TPOT).
- Zhong et al., "DistServe: Disaggregating Prefill and Decoding" (OSDI 2024); Patel et al.,
  "Splitwise" (ISCA 2024): KV transfer cost against phase interference.
- Williams, Waterman, Patterson, "Roofline" (CACM 2009); Chen, "Transformer Inference Arithmetic".
- PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes ~ 32 GB/s per direction; NVIDIA H100 NVLink 4:
  900 GB/s total, 450 GB/s per direction.
"""

from __future__ import annotations

from llmlab.core.device import Device
from llmlab.core.results import LabResult
from llmlab.labs.prefill_decode.config import E2E_TOL, LAB, VERSION, Config
from llmlab.labs.prefill_decode.report import figures, headline, views
from llmlab.labs.prefill_decode.verdicts import decode_bound, judge

JUDGE_VERSION = 3  # 2: the decode share of a whole generation at long replies; 3: the hand-off's claims, run


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables, env, notes, skipped. Never prints, never judges."""
    from llmlab.labs.prefill_decode import lab  # torch loads here: the CLI imports this package for its Config

    return lab.run(cfg, device, progress)


__all__ = ["E2E_TOL", "JUDGE_VERSION", "LAB", "VERSION", "Config", "decode_bound", "figures",
           "headline", "judge", "run", "views"]
