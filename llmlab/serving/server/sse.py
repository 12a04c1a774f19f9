"""A streamed answer: one SSE chunk per token, ending in `data: [DONE]`.

A token goes out as soon as it arrives, unless more is already queued behind it: then it waits for
that, so the last token's chunk carries finish_reason (the engine sends a sequence's last token and
its end together). Holding every token back one step would add a decode step to TTFT. A request
that fails in the engine mid-stream gets an `error` event in OpenAI's shape, then [DONE]; a client
that goes away aborts its sequence.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fastapi.responses import StreamingResponse

from llmlab.serving.server.protocol import APIError

if TYPE_CHECKING:
    from llmlab.serving.server.app import Call


def chunk(call: Call, piece: str | None, reason, first=False, **extra) -> str:
    if piece is None:
        choices = []
    elif call.chat:
        delta = {"role": "assistant", "content": piece} if first else {"content": piece}
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
    else:
        choices = [{"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}]
    body = {"id": call.rid, "object": call.obj + (".chunk" if call.chat else ""), "created": call.created,
            "model": call.srv.model_name, "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


async def events(call: Call):
    include_usage = bool(call.req.stream_options and call.req.stream_options.include_usage)
    h = call.h
    try:
        pending, first = call.echo or None, True
        async for piece, fin in call.srv.pieces(h, call.stream):
            if fin is not None:
                call.reason = fin
                yield chunk(call, (pending or "") + piece, fin, first, **({} if include_usage else {"timings": call.timings()}))
                break
            if pending is not None:
                yield chunk(call, pending, None, first)
                first, pending = False, None
            if h.events.empty():
                yield chunk(call, piece, None, first)
                first = False
            else:
                pending = piece
        if include_usage:
            yield chunk(call, None, None, usage=call.usage(), timings=call.timings())
    except APIError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n"
    finally:
        call.close()  # finished, failed or the client went away: free the blocks, record once
    yield "data: [DONE]\n\n"


def sse_response(call: Call) -> StreamingResponse:
    return StreamingResponse(events(call), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
