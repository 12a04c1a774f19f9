"""Part 1 of the tokens lab: how each tokenizer splits text, and why letters are hard to count."""

from __future__ import annotations

import re

import torch

from llmlab.core.device import Device
from llmlab.labs.tokens.config import Config

# The same sentence in eleven languages: Universal Declaration of Human Rights, Article 1, first
# sentence, in the United Nations' published translations (OHCHR). The other samples were written
# for this lab. Words are whitespace-separated; Chinese and Japanese write none (words: n/a).
UDHR = "All human beings are born free and equal in dignity and rights."
SAMPLES: tuple[tuple[str, str, str], ...] = (
    ("English prose", "English", "The cat sat on the table. A list is a mutable sequence, and a tuple cannot be "
                                 "changed once it is made. Read the file, then close it."),
    ("numbers", "numbers", "In 2026 the price rose from 1,299.99 to 3,141.59 (+141.7%); call 555-0134 before 12:45, "
                           "or write 0x7FFF = 32767."),
    ("code", "Python", 'def mean(xs):\n    return sum(xs) / len(xs)\n\nfor i, x in enumerate(items):\n'
                       '    print(f"{i}: {x!r}")\n'),
    ("same sentence", "English (UDHR 1)", UDHR),
    ("same sentence", "French", "Tous les êtres humains naissent libres et égaux en dignité et en droits."),
    ("same sentence", "German", "Alle Menschen sind frei und gleich an Würde und Rechten geboren."),
    ("same sentence", "Spanish", "Todos los seres humanos nacen libres e iguales en dignidad y derechos."),
    ("same sentence", "Russian", "Все люди рождаются свободными и равными в своем достоинстве и правах."),
    ("same sentence", "Greek", "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια και τα δικαιώματα."),
    ("same sentence", "Arabic", "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق."),
    ("same sentence", "Hindi",
     "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है।"),
    ("same sentence", "Chinese", "人人生而自由，在尊严和权利上一律平等。"),
    ("same sentence", "Japanese",
     "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。"),
)
NO_SPACES = {"Chinese", "Japanese"}  # scripts that do not separate words with spaces
WORD_TOKEN = re.compile(r"^ ?[A-Za-z]{3,}$")  # a word token: 3+ letters, with or without the leading space
NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}


# ---------------------------------------------------------------- part 1: tokenization


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _shown(text: str) -> str:
    """A token's text as the report shows it: a space as "_", a newline as "\\n"."""
    return text.replace(" ", "_").replace("\n", "\\n")


def pieces(tok, ids: list[int]) -> list[str]:
    """Each id decoded alone: what one token stands for."""
    return [_shown(tok.decode([i])) for i in ids]


def tokenization_rows(tok, label: str) -> list[dict]:
    """One row per sample: characters, words, tokens, and the round trip decode(encode(text)) == text."""
    rows = []
    english = len(encode(tok, UDHR))
    for kind, name, text in SAMPLES:
        ids = encode(tok, text)
        words = None if name in NO_SPACES else len(text.split())
        rows.append(dict(tokenizer=label, kind=kind, sample=name, chars=len(text), utf8_bytes=len(text.encode()),
                         words=words, tokens=len(ids), tokens_per_word=len(ids) / words if words else None,
                         tokens_per_char=len(ids) / len(text),
                         x_english=len(ids) / english if kind == "same sentence" else None,
                         roundtrip=tok.decode(ids) == text))
    return rows


def multi_letter(piece_list: list[str]) -> bool:
    """True when some piece holds two or more letters: the word's letters are not one token each."""
    return any(sum(ch.isalpha() for ch in p) >= 2 for p in piece_list)


def parse_count(text: str) -> int | None:
    """The first number in an answer, in digits or as an English word (zero .. ten); None if there is none."""
    m = re.search(r"\d+|\b(" + "|".join(NUMBER_WORDS) + r")\b", text.lower())
    if m is None:
        return None
    return int(m.group()) if m.group().isdigit() else NUMBER_WORDS[m.group()]


def count_prompt(tok, word: str, letter: str) -> str:
    q = f'How many times does the letter "{letter}" appear in the word "{word}"?'
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
    return f"Q: {q}\nA:"


def counting_rows(model, tok, label: str, cfg: Config, device: Device) -> list[dict]:
    """Each word's pieces, and the model's greedy answer to "how many <letter> in <word>?"."""
    from llmlab.inference import decode

    rows = []
    for item in cfg.count_words:
        word, _, letter = item.partition(":")
        ids = encode(tok, " " + word)  # as the word appears inside a sentence
        parts = pieces(tok, ids)
        prompt = torch.tensor([encode(tok, count_prompt(tok, word, letter))], device=device.torch)  # (1, S)
        out = decode.generate(model, prompt, cfg.answer_tokens).tokens[0].tolist()
        answer = tok.decode(out)
        got = parse_count(answer)
        rows.append(dict(model=label, word=word, letter=letter, count=word.count(letter), tokens=len(ids),
                         pieces="|".join(parts), multi_letter=multi_letter(parts),
                         answer=answer.strip().replace("\n", " ")[:40], answered=got is not None,
                         parsed=got, correct=got == word.count(letter)))
    return rows
