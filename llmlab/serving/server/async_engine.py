"""The engine stepped by one background thread; requests go in through a queue, tokens come back to
each request's asyncio.Queue.

Rules:
- Everything the engine thread does is guarded: a request the engine refuses fails alone (its
  client gets the error); a step that raises fails the requests of that step's batch with a clean
  error, is counted (`engine_faults`, /health) and the engine goes on with the rest. /health says
  "error" only when the thread itself is gone.
- Every torch call of the server runs on that one thread (load, the exactness check, the steps:
  `serve` hands it an executor). OpenMP keeps a thread team per calling thread: steps on a second
  thread after the main thread had run torch ops took 7.2 ms instead of 2.1 ms on 2 cores.
- A request's n sequences share the prompt's blocks: choices 1..n-1 follow choice 0 and are added
  once its prompt is computed (its first token), so their full prompt blocks are prefix-cache hits;
  if choice 0 fails or ends first, they are added (or failed) then, never left waiting.
- Each request ends with exactly one `close` from the HTTP side (its reason and the tokens its
  client got), and one record in the metrics: at the engine's own finish when the client's text
  cannot end earlier, else at `close`. The gauges are set after every pass of the loop, idle or not.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmlab.serving.engine.llm_engine import Engine
    from llmlab.serving.engine.scheduler import RequestParams, Sequence
    from llmlab.serving.server.metrics import Metrics

now_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Fault:
    """An event: this request failed in the engine."""

    message: str


@dataclass(eq=False)
class Handle:
    """One request as the HTTP side sees it."""

    prompt_ids: list[int]
    params: RequestParams
    arrival_ns: int
    tokenized_ns: int
    loop: asyncio.AbstractEventLoop
    count_at_close: bool = False  # stop strings: only the HTTP side knows how many tokens are the client's
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # token ids, then None (finished) or a Fault
    seq: Sequence | None = None
    recorded: bool = False
    followers: list[Handle] = field(default_factory=list)  # added once this one's prompt is computed

    def send(self, *items: Any) -> None:
        self.loop.call_soon_threadsafe(lambda: [self.events.put_nowait(x) for x in items])


class AsyncEngine:
    def __init__(self, engine: Engine, metrics: Metrics, executor: Executor | None = None):
        self.engine, self.metrics, self.executor = engine, metrics, executor
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.handles: dict[int, Handle] = {}
        self.recent_steps: deque = deque(maxlen=512)
        self.max_seqs_in_step = 0
        self.num_faults = 0
        self.last_fault: str | None = None
        self.dead: str | None = None  # why the loop ended, if it ended on its own
        self._done = threading.Event()
        self._marks = (0, 0, 0)  # prefix queries, hits, preemptions already counted

    # ---------------------------------------------------------------- the HTTP side

    def start(self) -> None:
        if self.executor is not None:
            self.executor.submit(self._run)
        else:
            threading.Thread(target=self._run, name="llmlab-engine", daemon=True).start()

    def shutdown(self) -> None:
        self.stop.set()
        self.wake.set()
        self._done.wait(timeout=10)

    @property
    def alive(self) -> bool:
        return not self._done.is_set()

    def submit(self, h: Handle) -> None:
        self.inbox.put(("add", h, None, None))
        self.wake.set()

    def close(self, h: Handle, reason: str, n_tokens: int | None = None) -> None:
        """The request is over for its client (finished, stop string, gone, failed): free it, record it once."""
        self.inbox.put(("close", h, reason, n_tokens))
        self.wake.set()

    # ---------------------------------------------------------------- the engine thread

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self._iterate()
                except Exception as exc:  # noqa: BLE001 - a fault fails its batch, never the server
                    self._fault(exc)
        except BaseException as exc:  # the thread is going away: say why on /health
            self.dead = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.metrics.running.set(0)
            self._done.set()

    def _iterate(self) -> None:
        self._drain()
        if not self.engine.has_work():
            self._gauges()
            self.wake.wait(0.05)
            self.wake.clear()
            return
        out = self.engine.step()
        if out is not None:
            self._deliver(out)
        self._gauges()

    def _drain(self) -> None:
        while True:
            try:
                op, h, reason, n_tokens = self.inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                self._add(h)
            else:
                self._close(h, reason, n_tokens)

    def _add(self, h: Handle) -> None:
        try:
            h.seq = self.engine.add_request(h.prompt_ids, h.params, h.arrival_ns, h.tokenized_ns)
        except Exception as exc:  # noqa: BLE001 - this request fails alone
            h.send(Fault(f"{type(exc).__name__}: {exc}"))
            self._release(h)
            return
        self.handles[h.seq.seq_id] = h

    def _release(self, h: Handle, fault: Fault | None = None) -> None:
        """Add (or, with a fault, fail) the sequences that were waiting for h's prompt."""
        followers, h.followers = h.followers, []
        for f in followers:
            if fault is None:
                self._add(f)
            else:
                f.send(fault)

    def _close(self, h: Handle, reason: str, n_tokens: int | None) -> None:
        if h.seq is None:
            return
        if self.handles.pop(h.seq.seq_id, None) is not None:
            self.engine.abort(h.seq)
        self._record(h, reason, n_tokens)

    def _record(self, h: Handle, reason: str, n_tokens: int | None) -> None:
        if h.recorded:
            return
        h.recorded = True
        self.metrics.finished(h.seq, reason)
        if h.count_at_close:
            self.metrics.generation_tokens.inc(len(h.seq.output_ids) if n_tokens is None else n_tokens)

    def _deliver(self, out) -> None:
        m = self.metrics
        self.recent_steps.append(asdict(out.record))
        self.max_seqs_in_step = max(self.max_seqs_in_step, out.record.num_seqs)
        sends: dict[Handle, list] = {}
        counted = 0
        for seq, tok in out.tokens:
            h = self.handles.get(seq.seq_id)
            if h is None:
                continue
            if len(seq.token_ns) > 1:
                m.itl.observe((seq.token_ns[-1] - seq.token_ns[-2]) / 1e9)
            counted += not h.count_at_close
            sends.setdefault(h, []).append(tok)
            if h.followers:  # its prompt's blocks are computed and in the prefix cache now
                self._release(h)
        m.generation_tokens.inc(counted)
        for seq in out.finished:
            h = self.handles.pop(seq.seq_id, None)
            if h is not None:
                sends.setdefault(h, []).append(None)
                if not h.count_at_close:
                    self._record(h, seq.finish_reason or "abort", None)
        if sends:
            loop = next(iter(sends)).loop
            loop.call_soon_threadsafe(lambda s=sends: [h.events.put_nowait(x) for h, xs in s.items() for x in xs])

    def _fault(self, exc: Exception) -> None:
        """A step raised: fail the requests that were in its batch (the running ones), keep the waiting ones."""
        self.num_faults += 1
        self.last_fault = f"{type(exc).__name__}: {exc}"
        self.metrics.engine_faults.inc()
        for seq in list(self.engine.scheduler.running):
            h = self.handles.pop(seq.seq_id, None)
            try:
                self.engine.abort(seq)
            except Exception:  # noqa: BLE001, S110 - its blocks may already be gone; the request still fails
                pass
            if h is not None:
                fault = Fault(f"engine error: {self.last_fault}")
                h.send(fault)
                self._release(h, fault)

    def _gauges(self) -> None:
        m, sc, blocks = self.metrics, self.engine.scheduler, self.engine.blocks
        q0, h0, p0 = self._marks
        m.prefix_queries.inc(sc.prefix_queries - q0)
        m.prefix_hits.inc(sc.prefix_hits - h0)
        m.preemptions.inc(sc.num_preemptions - p0)
        self._marks = (sc.prefix_queries, sc.prefix_hits, sc.num_preemptions)
        m.running.set(len(sc.running))
        m.waiting.set(len(sc.waiting))
        m.kv_usage.set(blocks.num_used / blocks.num_blocks)

    def stats(self) -> dict:
        e, sc = self.engine, self.engine.scheduler
        for _ in range(3):
            try:
                steps = list(self.recent_steps)
                break
            except RuntimeError:  # appended to while copied
                steps = []
        return {
            "num_steps": e.num_steps, "num_blocks": e.blocks.num_blocks, "block_size": e.cfg.block_size,
            "blocks_in_use": e.blocks.num_used, "running": len(sc.running), "waiting": len(sc.waiting),
            "num_preemptions": sc.num_preemptions, "prefix_cache_queries": sc.prefix_queries,
            "prefix_cache_hits": sc.prefix_hits, "max_seqs_in_a_step": self.max_seqs_in_step,
            "max_model_len": e.max_model_len, "engine_faults": self.num_faults, "last_fault": self.last_fault,
            "error": self.dead, "recent_steps": steps,
        }
