"""Token ids -> text pieces for a client, with stop strings matched on the decoded text (as vLLM does).

Rules:
- The text is the decode of every output token so far (special tokens skipped); a stop string is
  found in that text, wherever the token boundaries fall, and the output ends exactly before it.
- While streaming, the longest tail of the text that could still grow into a stop string is held
  back (and an incomplete UTF-8 character, decoded as U+FFFD, too): what was sent never has to be
  taken back. At the end everything not yet sent goes out.
- `n_tokens` counts the tokens the client's text came from: the one that completed a stop string
  is the last (the engine may have made more before it heard of the stop; they are not the client's).
"""

from __future__ import annotations


def held_back(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class TextStream:
    def __init__(self, tokenizer, stops: list[str], end_ids: set[int]):
        self.tokenizer, self.end_ids = tokenizer, end_ids  # EOS and stop token ids: not text
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []
        self.n_tokens = 0
        self.text = ""
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False

    def push(self, tok: int) -> str:
        """The next piece that is safe to send (maybe empty); sets `stopped` when a stop string is complete."""
        self.n_tokens += 1
        if tok not in self.end_ids:
            self.ids.append(tok)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = self._find_stop()
        if cut >= 0:
            self.stopped = True
            return self._take(cut)
        safe = len(self.text.rstrip("\ufffd"))
        if self.stops:
            safe = min(safe, len(self.text) - held_back(self.text, self.stops))
        return self._take(safe)

    def flush(self) -> str:
        """What is left once the sequence ended on its own (EOS, length)."""
        return self._take(len(self.text))

    def _find_stop(self) -> int:
        start = max(0, self.sent - self.longest)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits, default=-1)

    def _take(self, end: int) -> str:
        end = max(end, self.sent)
        piece, self.sent = self.text[self.sent : end], end
        return piece
