"""The chat template the server and the ttft lab share: the tokenizer's own, or a plain-text stand-in."""

from __future__ import annotations

# The built-in tokenizer has no chat template: this plain-text one (ChatML-like markers, spelled
# out as ordinary text) stands in for it. A tokenizer that ships a template uses its own.
CHAT_TEMPLATE = "<|system|>\n{system}\n<|user|>\n{user}\n<|assistant|>\n"


def render_chat(tokenizer, system: str, user: str) -> tuple[str, str]:
    """(prompt text, which template): the tokenizer's own chat template when it has one."""
    if getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), "tokenizer"
    return CHAT_TEMPLATE.format(system=system, user=user), "llmlab plain-text"
