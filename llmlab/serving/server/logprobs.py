"""Log-probabilities in OpenAI's two shapes, token by token as a choice's chunks go out.

Rules:
- An entry is (token id, its log-probability, [(id, log-probability)] of the k most likely), as the
  engine records it: the model's own distribution (raw logits), whatever the sampling settings.
- Completions (the legacy shape): `tokens`, `token_logprobs`, `top_logprobs` (a dict per token of the
  k most likely and the sampled one, so up to k + 1 entries, as OpenAI documents), `text_offset` (each
  token's first character in the choice's text, echo included; offsets run on by each token's text).
- Chat: `content`, a list of {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}] (k)}.
- A token's text is its own decode (special tokens spelled out); a token that is part of a UTF-8
  character decodes as U+FFFD, as in vLLM. With vLLM's `return_tokens_as_token_ids` each token is
  named "token_id:<id>" instead (offsets still count the decoded text). -inf is sent as -9999.0 (JSON
  has no infinity), as vLLM does.
"""

from __future__ import annotations

Entry = tuple[int, float, list[tuple[int, float]]]


def finite(lp: float) -> float:
    return max(lp, -9999.0)


class LogprobsFormatter:
    """One choice's logprobs: `format(entries)` for the tokens of one chunk (or of the whole answer)."""

    def __init__(self, tokenizer, chat: bool, offset: int = 0, as_ids: bool = False):
        self.tokenizer, self.chat, self.offset, self.as_ids = tokenizer, chat, offset, as_ids

    def decode(self, tok: int) -> str:
        return self.tokenizer.decode([tok])

    def text(self, tok: int) -> str:
        return f"token_id:{tok}" if self.as_ids else self.decode(tok)

    def format(self, entries: list[Entry]) -> dict | None:
        if not entries:
            return None
        return self._chat(entries) if self.chat else self._completion(entries)

    def _chat(self, entries: list[Entry]) -> dict:
        def one(tok: int, lp: float) -> dict:
            t = self.text(tok)
            return {"token": t, "logprob": finite(lp), "bytes": list(t.encode("utf-8"))}

        return {"content": [{**one(tok, lp), "top_logprobs": [one(i, v) for i, v in top]} for tok, lp, top in entries]}

    def _completion(self, entries: list[Entry]) -> dict:
        tokens, offsets = [], []
        for tok, _, _ in entries:
            tokens.append(self.text(tok))
            offsets.append(self.offset)
            self.offset += len(self.decode(tok))
        tops = []
        for tok, lp, top in entries:
            d = {self.text(i): finite(v) for i, v in top}
            d.setdefault(self.text(tok), finite(lp))
            tops.append(d)
        return {"tokens": tokens, "token_logprobs": [finite(lp) for _, lp, _ in entries], "top_logprobs": tops,
                "text_offset": offsets}
