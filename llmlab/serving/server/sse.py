"""A streamed answer: one SSE chunk per token, ending in `data: [DONE]`.

A token goes out as soon as it arrives, unless more is already queued behind it: then it waits for
that, so the last token's chunk carries finish_reason (the engine sends a sequence's last token and
its end together). Holding every token back one step would add a decode step to TTFT. A request
that fails in the engine mid-stream gets an `error` event in OpenAI's shape, then [DONE]; a client
that goes away aborts its sequence.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from fastapi.responses import StreamingResponse

from llmlab.serving.server.protocol import APIError

if TYPE_CHECKING:
    from llmlab.serving.server.app import Call


def chunk(call: Call, piece: str | None, reason, first=False, index=0, logprobs=None, **extra) -> str:
    if piece is None:
        choices = []
    elif call.chat:
        delta = {"role": "assistant", "content": piece} if first else {"content": piece}
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]
    else:
        choices = [{"index": index, "text": piece, "logprobs": logprobs, "finish_reason": reason}]
    body = {"id": call.rid, "object": call.obj + (".chunk" if call.chat else ""), "created": call.created,
            "model": call.srv.model_name, "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


async def one_choice(call: Call, include_usage: bool):
    """n = 1: a chunk per token (with that token's logprobs), the last token's chunk carrying finish_reason."""
    c = call.choices[0]
    pending, first = ((call.echo, []) if call.echo else None), True  # (text, logprobs entries) not yet sent
    async for piece, fin, entry in call.srv.pieces(c.h, c.stream):
        mine = [entry] if entry is not None else []
        if fin is not None:
            c.reason = fin
            text, before = pending or ("", [])
            yield chunk(call, text + piece, fin, first, logprobs=c.logprobs(before + mine),
                        **({} if include_usage else {"timings": call.timings()}))
            return
        if pending is not None:
            yield chunk(call, pending[0], None, first, logprobs=c.logprobs(pending[1]))
            first, pending = False, None
        if c.h.events.empty():
            yield chunk(call, piece, None, first, logprobs=c.logprobs(mine))
            first = False
        else:
            pending = (piece, mine)


async def many_choices(call: Call, include_usage: bool):
    """n > 1: the sequences' chunks interleaved as they come, each naming its choice's index; each ends with a
    chunk of its own carrying finish_reason."""
    merged: asyncio.Queue = asyncio.Queue()

    async def feed(c):
        try:
            async for piece, fin, entry in call.srv.pieces(c.h, c.stream):
                await merged.put((c, piece, fin, entry, None))
        except APIError as exc:
            await merged.put((c, "", None, None, exc))

    tasks = [asyncio.ensure_future(feed(c)) for c in call.choices]
    started, left = set(), len(call.choices)
    try:
        if call.echo:
            for c in call.choices:
                started.add(c.index)
                yield chunk(call, call.echo, None, True, c.index)
        while left:
            c, piece, fin, entry, exc = await merged.get()
            if exc is not None:
                raise exc
            c.reason = fin or c.reason
            left -= fin is not None
            extra = {"timings": call.timings()} if fin is not None and not left and not include_usage else {}
            lp = c.logprobs([entry] if entry is not None else [])
            yield chunk(call, piece, fin, c.index not in started, c.index, logprobs=lp, **extra)
            started.add(c.index)
    finally:
        for t in tasks:
            t.cancel()


async def events(call: Call):
    include_usage = bool(call.req.stream_options and call.req.stream_options.include_usage)
    try:
        async for event in (one_choice if len(call.choices) == 1 else many_choices)(call, include_usage):
            yield event
        if include_usage:
            yield chunk(call, None, None, usage=call.usage(), timings=call.timings())
    except APIError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n"
    finally:
        call.close()  # finished, failed or the client went away: free the blocks, record once
    yield "data: [DONE]\n\n"


def sse_response(call: Call) -> StreamingResponse:
    return StreamingResponse(events(call), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
