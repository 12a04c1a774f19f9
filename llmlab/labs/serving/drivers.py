"""How the serving lab drives the engine: closed-loop clients, open-loop arrivals, the device's busy reading."""

from __future__ import annotations

import math
import random
import time

import numpy as np

from llmlab.core.device import Device

# ---------------------------------------------------------------- drivers


def make_engine(model, **kw):
    from llmlab.serving.engine.llm_engine import Engine, EngineConfig

    return Engine(model, EngineConfig(**kw))


def reply_params(n: int):
    from llmlab.serving.engine.scheduler import RequestParams

    return RequestParams(max_tokens=n, ignore_eos=True)


def random_prompts(n: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(4, vocab) for _ in range(length)] for _ in range(n)]


def records(seqs) -> list:
    """Engine sequences as the HTTP client's RequestRecords: one metric definition for both."""
    from llmlab.loadgen.client import RequestRecord

    return [RequestRecord(index=i, send_ns=s.arrival_ns, chunk_ns=list(s.token_ns), prompt_tokens=len(s.prompt_ids),
                          output_tokens=len(s.output_ids), output_tokens_source="engine", status=200) for i,
                          s in enumerate(seqs)]


def closed_loop(engine, prompts: list[list[int]], concurrency: int, out_len: int):
    """N clients: each sends its next prompt when its last reply ends. Returns (sequences, wall seconds)."""
    todo, done = list(prompts), []
    for _ in range(min(concurrency, len(todo))):
        engine.add_request(todo.pop(0), reply_params(out_len))
    t0 = time.perf_counter()
    while engine.has_work():
        out = engine.step()
        for seq in out.finished if out else []:
            done.append(seq)
            if todo:
                engine.add_request(todo.pop(0), reply_params(out_len))
    return done, time.perf_counter() - t0


def busy_reading(device: Device, fn):
    """(fn(), busy share, source): the device's own reading of how busy it was while fn ran. GPU: NVML's
    utilisation (share of time a kernel ran), median over the run. CPU: CPU time over wall time, of the
    calling thread when torch runs on one thread (other threads of the process are not the engine's), else
    of the process over threads x wall."""
    import torch

    from llmlab.core.telemetry import Telemetry

    if device.is_cuda:
        with Telemetry(device) as tel:
            out = fn()
        util = tel.summary().get("gpu_util_pct")
        return out, (util["median"] / 100 if util else math.nan), "NVML GPU utilisation"
    n = torch.get_num_threads()
    clock = time.thread_time if n == 1 else time.process_time
    c0, t0 = clock(), time.perf_counter()
    out = fn()
    return out, (clock() - c0) / (n * (time.perf_counter() - t0)), "CPU time / wall time"


def open_loop(engine, prompts, outs: list[int], gaps_s: list[float], static_batch: int = 0, max_wait_s: float = 0.0):
    """Poisson arrivals in real time. static_batch B > 0: when the engine is idle it admits up to B queued
    requests once B are queued, the oldest has waited max_wait_s, or no more will arrive (max wait 0 = dynamic
    fill: whatever is queued), and admits nothing more until that batch is done. Returns (sequences, wall s,
    wasted slots counted per step (batch size - rows still running), the batches' reply lengths)."""
    t0 = time.perf_counter_ns()
    arrive = np.cumsum(gaps_s) * 1e9 + t0
    queue, i, done, wasted, batches, size = [], 0, [], 0, [], 0
    while i < len(prompts) or queue or engine.has_work():
        now = time.perf_counter_ns()
        while i < len(prompts) and arrive[i] <= now:
            queue.append(i)
            i += 1
        if not static_batch:
            admit, queue = queue, []
        elif not engine.has_work() and queue and (len(queue) >= static_batch or i == len(prompts)
                                                  or now - arrive[queue[0]] >= max_wait_s * 1e9):
            admit, queue = queue[:static_batch], queue[static_batch:]
            batches.append([outs[j] for j in admit])
            size = len(admit)
        else:
            admit = []
        done += [engine.add_request(prompts[j], reply_params(outs[j]), arrival_ns=int(arrive[j])) for j in admit]
        if engine.has_work():
            rec = engine.step().record
            wasted += size - rec.num_seqs if static_batch else 0
        elif i < len(prompts) or queue:
            wakes = ([arrive[i]] if i < len(prompts) else []) + ([arrive[queue[0]] + max_wait_s * 1e9] if queue else [])
            time.sleep(max(0.0, (min(wakes) - time.perf_counter_ns()) / 1e9))
    return done, (time.perf_counter_ns() - t0) / 1e9, wasted, batches
