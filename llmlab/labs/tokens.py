"""Lab: tokens — what a model reads (ids, not letters), what an id means (its embedding), what the vocabulary costs.

Parts, in the order of the series' first article:
1. tokenization: how each model's tokenizer splits English prose, numbers, Python code and the
   same sentence in ten languages; tokens per word and per character, and the premium each
   language pays over English for the same sentence. Why letter counting is hard: the pieces of
   "strawberry"-like words, and the model asked "how many r in strawberry?" (its accuracy is
   measured only where it answers with a number at all).
2. embeddings: an id is an index, its meaning sits in its row of the input-embedding matrix. For
   the corpus's most frequent word tokens, the k nearest rows by cosine against the k nearest ids,
   both drawn from the same word tokens; a pair is "related" by a rule independent of the
   embedding (same word up to case and the leading space, a shared stem, or co-occurrence in the
   held-out corpus above chance). Paired sign-flip permutation test on the per-word difference.
3. vocabulary size: a Llama shape (transformers.LlamaConfig, random weights) at V = 4k .. 256k:
   embedding + LM-head bytes and logits bytes per token against the formulas (d x V x bytes each,
   V x bytes), and the LM head's share of a timed decode step against the weights' share
   d V / (d V + body matmul parameters) (each weight does 2 FLOPs and is read once per token).

References:
- Sennrich et al. 2016 (arXiv 1508.07909): byte-pair encoding for subwords.
- Petrov et al. 2023 (arXiv 2305.15425): the same sentence costs different token counts per language.
- Mikolov et al. 2013 (arXiv 1301.3781): nearest neighbours by cosine in an embedding space.
- Good, "Permutation, Parametric and Bootstrap Tests of Hypotheses" (2005): the paired sign-flip test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from llmlab.core.device import Device, threads_for, torch_threads
from llmlab.core.render import track
from llmlab.core.results import Claim, Col, LabResult, View, empty_table
from llmlab.core.stats import summary
from llmlab.core.timing import interleaved

LAB = "tokens"
VERSION = 1
JUDGE_VERSION = 1
MULTI_LETTER_SHARE = 0.5  # "most test words": more than half are split into multi-letter pieces
ANSWERED_MIN = 0.5  # a model "answers at all" when at least half of the prompts get a number back
COUNT_ACCURACY_MAX = 0.9  # "letter counting is unreliable": below 90% correct on the answered prompts
RELATED_RATIO_MIN = 2.0  # "far more often": at least twice the related share of id neighbours
P_MAX = 0.01  # the permutation test's significance level
SHARE_BAND = 0.25  # at the largest V, the measured LM-head share within 0.25 (absolute) of the weights' share
DELTA_BAND = (0.75, 1.33)  # what a bigger V adds to a step / what it adds to the head alone: 1 within a third
RHO_MIN = 0.9  # "the share grows with V": Spearman rank correlation over the sweep

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
    ("same sentence", "Hindi", "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है।"),
    ("same sentence", "Chinese", "人人生而自由，在尊严和权利上一律平等。"),
    ("same sentence", "Japanese", "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。"),
)
NO_SPACES = {"Chinese", "Japanese"}  # scripts that do not separate words with spaces
WORD_TOKEN = re.compile(r"^ ?[A-Za-z]{3,}$")  # a word token: 3+ letters, with or without the leading space
NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}


@dataclass(frozen=True)
class Config:
    models: tuple[str, ...] = ("tiny", "tiny-draft")  # the built-in pair (one tokenizer, two embeddings); any HF id
    count_words: tuple[str, ...] = ("strawberry:r", "raspberry:r", "blueberry:r", "mississippi:s", "bookkeeper:e",
                                    "committee:t", "balloon:l", "banana:a", "parallel:l", "assessment:s",
                                    "occurrence:c", "embarrass:r")  # word:letter, repeated letters (the classic)
    answer_tokens: int = 8  # greedy tokens of each counting answer: room for "3" or "three."
    probes: int = 150  # most frequent word tokens of the corpus whose neighbours are compared
    k: int = 5  # neighbours per probe, by cosine and by id
    window: int = 5  # co-occurrence: within 5 tokens either side (a short clause)
    cooc_ratio: float = 2.0  # related by co-occurrence: at least 2x the count independence predicts
    cooc_min: int = 3  # ... and seen together at least 3 times (one chance meeting is not a relation)
    corpus_chars: int = 400_000  # held-out corpus text read: more than its ~300 k characters, so all of it
    permutations: int = 10_000  # sign flips of the permutation test (p resolves down to 1e-4)
    shape: str = "arch:llama-3.2-1b"  # the Llama shape whose vocabulary is swept (d = 2048), untied, random weights
    vocab_sizes: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536, 131072, 262144)  # 4k .. 256k (Gemma's)
    layers: int = 2  # decoder layers of the swept shape; on CUDA more, until the body is 4x the L2
    llc_multiple: float = 4.0  # CUDA: the body's weights at least 4x the device's L2, so a step streams from HBM
    context: int = 16  # tokens in the cache during the timed decode step (attention stays negligible)
    repeats: int = 7  # interleaved timing rounds per vocabulary size (median)
    threads: int = 0  # torch CPU threads; 0 keeps torch's default (1 when the CPU is oversubscribed)
    seed: int = 0

    def __post_init__(self):
        if not self.models:
            raise ValueError("--model needs at least one model")
        if any(m.startswith("arch:") for m in self.models):
            raise ValueError("--model must have a trained tokenizer (tiny, tiny-draft or a Hugging Face model), not arch:")
        if self.probes < 2 or self.k < 1 or self.window < 1 or self.permutations < 100:
            raise ValueError("probes must be >= 2, k and window >= 1, permutations >= 100")
        if not self.vocab_sizes or min(self.vocab_sizes) < 256:
            raise ValueError(f"--vocab-sizes must be >= 256 each, got {self.vocab_sizes}")
        if self.layers < 1 or self.repeats < 1 or self.context < 1 or self.answer_tokens < 1:
            raise ValueError("layers, repeats, context and answer tokens must be >= 1")
        for item in self.count_words:
            word, _, letter = item.partition(":")
            if len(letter) != 1 or letter not in word:
                raise ValueError(f"count word {item!r}: give word:letter with the letter in the word")

    @classmethod
    def quick(cls) -> Config:
        return cls(models=("tiny",), probes=80, permutations=2000, shape="tiny",
                   vocab_sizes=(4096, 16384, 65536, 262144), layers=8, repeats=5)


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


# ---------------------------------------------------------------- part 2: embeddings


def corpus_ids(tok, chars: int) -> np.ndarray:
    """The held-out documents of the built-in corpus (never trained on), first `chars` characters, as ids."""
    from llmlab.tiny.corpus import build_corpus

    text = build_corpus(heldout_only=True).heldout_text()[:chars]
    backend = getattr(tok, "backend_tokenizer", None)  # the Rust tokenizer: no max-length warning
    ids = backend.encode(text, add_special_tokens=False).ids if backend is not None else encode(tok, text)
    return np.asarray(ids, dtype=np.int64)


def word_tokens(tok, vocab_size: int) -> dict[int, str]:
    """id -> text of every word token (3+ ASCII letters, optional leading space) below vocab_size."""
    out = {}
    for i in range(vocab_size):
        s = tok.decode([i])
        if WORD_TOKEN.match(s):
            out[i] = s
    return out


def unit_rows(emb: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """The pool's embedding rows scaled to length 1 (P, d): a dot product of two is their cosine."""
    return torch.nn.functional.normalize(emb[pool].float(), dim=1)


def cosine_neighbours(units: torch.Tensor, pool: torch.Tensor, probe: int, k: int) -> list[int]:
    """The k ids of `pool` whose rows are nearest to the probe's row by cosine (the probe itself left out)."""
    at = pool == probe
    sims = units @ units[at.nonzero()[0, 0]]  # (P,)
    sims[at] = -2.0
    return pool[sims.topk(k).indices].tolist()


def id_neighbours(probe: int, pool: np.ndarray, k: int) -> list[int]:
    """The k ids of `pool` nearest to the probe's id (the probe itself left out; ties: the lower id first)."""
    others = pool[pool != probe]
    order = np.lexsort((others, np.abs(others - probe)))
    return others[order[:k]].tolist()


def same_word(a: str, b: str) -> bool:
    """Case variants and a shared stem: " list" ~ "List" ~ " lists" (the shorter, 4+ letters, begins the longer)."""
    a, b = a.strip().lower(), b.strip().lower()
    short, long_ = sorted((a, b), key=len)
    return short == long_ or (len(short) >= 4 and long_.startswith(short))


class Cooccurrence:
    """How often token b falls within +-window tokens of an occurrence of token a, against independence."""

    def __init__(self, ids: np.ndarray, window: int):
        self.ids, self.window, self.n = ids, window, len(ids)
        self.positions: dict[int, np.ndarray] = {}
        order = np.argsort(ids, kind="stable")
        bounds = np.flatnonzero(np.diff(ids[order])) + 1
        for chunk in np.split(order, bounds):
            if len(chunk):
                self.positions[int(ids[chunk[0]])] = chunk

    def count(self, t: int) -> int:
        return len(self.positions.get(t, ()))

    def near(self, a: int) -> np.ndarray:
        """A mask of the positions within +-window of some occurrence of a (a's own positions left out)."""
        mask = np.zeros(self.n, dtype=bool)
        pos = self.positions.get(a, np.empty(0, dtype=np.int64))
        for off in range(-self.window, self.window + 1):
            if off:
                p = pos + off
                mask[p[(p >= 0) & (p < self.n)]] = True
        mask[pos] = False
        return mask

    def observed_expected(self, near_a: np.ndarray, b: int) -> tuple[int, float]:
        """(occurrences of b near a, what independence predicts: count(b) x the share of positions near a)."""
        pos = self.positions.get(b, np.empty(0, dtype=np.int64))
        return int(near_a[pos].sum()), len(pos) * near_a.mean()


def sign_flip_pvalue(diffs: np.ndarray, permutations: int, seed: int) -> float:
    """One-sided paired permutation test of mean(diffs) > 0: flip each difference's sign at random.

    p = (1 + #{flipped means >= the observed mean}) / (1 + permutations), never 0 (Phipson & Smyth 2010).
    """
    diffs = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(permutations, len(diffs)))
    flipped = (signs * diffs).mean(axis=1)
    return float((1 + np.sum(flipped >= diffs.mean() - 1e-12)) / (1 + permutations))


def neighbour_rows(emb: torch.Tensor, tok, label: str, ids: np.ndarray, cfg: Config, progress=None) -> list[dict]:
    """Per probe word: its k cosine and k id neighbours among the word tokens, and which are related."""
    words = word_tokens(tok, emb.shape[0])
    co = Cooccurrence(ids, cfg.window)
    counts = sorted(((co.count(t), t) for t in words if co.count(t) >= cfg.cooc_min), reverse=True)
    probes = [t for _, t in counts[:cfg.probes]]
    pool = np.asarray(sorted(words), dtype=np.int64)
    pool_t = torch.as_tensor(pool, device=emb.device)  # on the embedding's device: the masks and indices meet it there
    units = unit_rows(emb, pool_t)  # (P, d), once: a large vocabulary's rows are normalised a single time
    rows = []
    for p in track(progress, probes, f"embeddings: neighbours ({label})"):
        near = co.near(p)
        for kind, found in (("cosine", cosine_neighbours(units, pool_t, p, cfg.k)), ("id", id_neighbours(p, pool, cfg.k))):
            for rank, b in enumerate(found, 1):
                obs, exp = co.observed_expected(near, b)
                variant = same_word(words[p], words[b])
                cooc = obs >= cfg.cooc_min and obs >= cfg.cooc_ratio * exp
                rows.append(dict(model=label, probe=words[p], probe_id=p, kind=kind, rank=rank, neighbour=words[b],
                                 neighbour_id=b, id_distance=abs(b - p), cooc=obs, cooc_expected=exp,
                                 variant=variant, related=variant or cooc))
    return rows


def embedding_summary(nb: pd.DataFrame, cfg: Config) -> list[dict]:
    """Per model: the related share of each kind of neighbour, and the paired permutation test's p."""
    rows = []
    for label, df in nb.groupby("model", sort=False):
        per = df.groupby(["probe_id", "kind"]).related.mean().unstack("kind")  # (probes, {cosine, id})
        diffs = (per["cosine"] - per["id"]).to_numpy()
        p = sign_flip_pvalue(diffs, cfg.permutations, cfg.seed)
        for kind in ("cosine", "id"):
            sub = df[df.kind == kind]
            rows.append(dict(model=label, kind=kind, probes=len(per), pairs=len(sub), related_share=sub.related.mean(),
                             variant_share=sub.variant.mean(), median_id_distance=float(sub.id_distance.median()),
                             p_value=p, permutations=cfg.permutations))
    return rows


def example_rows(nb: pd.DataFrame, n: int = 8) -> list[dict]:
    """The first model's most frequent probes, neighbours side by side (related ones marked *)."""
    first = nb[nb.model == nb.model.iloc[0]]
    rows = []
    for pid in list(dict.fromkeys(first.probe_id))[:n]:
        sub = first[first.probe_id == pid]

        def names(kind, sub=sub):
            s = sub[sub.kind == kind]
            return ", ".join(_shown(w) + ("*" if r else "") for w, r in zip(s.neighbour, s.related, strict=True))

        rows.append(dict(model=sub.model.iloc[0], word=_shown(sub.probe.iloc[0]), word_id=int(pid),
                         cosine=names("cosine"), by_id=names("id")))
    return rows


# ---------------------------------------------------------------- part 3: vocabulary size


def shape_config(cfg: Config, vocab: int, layers: int):
    """A LlamaConfig of cfg.shape's layer shape at vocabulary `vocab`, `layers` layers, untied head."""
    from transformers import LlamaConfig

    from llmlab.core.models import load_config, shape

    s = shape(load_config(cfg.shape))
    return LlamaConfig(vocab_size=vocab, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                       num_hidden_layers=layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                       head_dim=s["head_dim"], tie_word_embeddings=False, max_position_embeddings=4096)


def layer_bytes(cfg: Config, dtype_bytes: int) -> int:
    """Weight bytes of one decoder layer of cfg.shape (attention + SwiGLU MLP; norms left out)."""
    from llmlab.core.models import load_config, shape

    s = shape(load_config(cfg.shape))
    h, hd = s["hidden"], s["head_dim"]
    return dtype_bytes * (2 * h * s["heads"] * hd + 2 * h * s["kv_heads"] * hd + 3 * h * s["intermediate"])


def sweep_layers(cfg: Config, device: Device, dtype_bytes: int) -> int:
    """cfg.layers; on CUDA at least enough layers that the body's weights are llc_multiple x the device's L2."""
    if not device.is_cuda:
        return cfg.layers
    from llmlab.core.device import last_level_cache_bytes

    return max(cfg.layers, math.ceil(cfg.llc_multiple * last_level_cache_bytes(device) / layer_bytes(cfg, dtype_bytes)))


def sweep_dtype(device: Device) -> torch.dtype:
    """BF16 on a GPU (what serving runs), FP32 on a CPU (no fast BF16 matmul on most)."""
    return torch.bfloat16 if device.is_cuda else torch.float32


def build(conf, device: Device, dtype: torch.dtype, seed: int):
    """LlamaForCausalLM at random weights (N(0, 0.02), norms 1), in eval mode on the device."""
    from transformers import LlamaForCausalLM
    from transformers.initialization import no_init_weights

    with torch.device(device.torch), no_init_weights():
        model = LlamaForCausalLM(conf).to(dtype)
    g = torch.Generator(device=device.torch).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() < 2:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device.torch, dtype=torch.float32).mul_(0.02))
    return model.eval()


def body_params(model) -> int:
    """Matmul parameters of the decoder layers: everything but the embedding, the LM head and the norms."""
    skip = {model.get_input_embeddings().weight.data_ptr(), model.get_output_embeddings().weight.data_ptr()}
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2 and p.data_ptr() not in skip)


def vocab_row(conf, cfg: Config, device: Device) -> dict:
    """Bytes counted from the tensors, and a decode step against the LM head alone, timed in turns."""
    from llmlab.inference import decode

    dtype = sweep_dtype(device)
    model = build(conf, device, dtype, cfg.seed)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    v, d, b = conf.vocab_size, conf.hidden_size, emb.element_size()
    g = torch.Generator(device=device.torch).manual_seed(cfg.seed)
    prompt = torch.randint(0, v, (1, cfg.context), generator=g, device=device.torch)  # (1, C)
    token = prompt[:, -1:]  # (1, 1)
    cache = decode.new_cache(model)
    h = torch.randn(1, 1, d, generator=g, device=device.torch).to(dtype)  # (1, 1, d): the last hidden state
    with torch.inference_mode():
        decode.forward(model, prompt, cache)
        logits = decode.forward(model, token, cache)  # (1, 1, V)
        fns = {"step": lambda: decode.forward(model, token, cache), "head": lambda: model.lm_head(h)}
        timing = interleaved(fns, cfg.repeats, device, setups={"step": lambda: decode.crop(cache, cfg.context)})
    step, head_s = summary(timing.seconds["step"]), summary(timing.seconds["head"])
    shares = [hh / s for hh, s in zip(timing.seconds["head"], timing.seconds["step"], strict=True)]
    body = body_params(model)
    row = dict(vocab=v, hidden=d, layers=conf.num_hidden_layers, dtype=str(dtype).removeprefix("torch."),
               bytes_per_value=b, embed_B=emb.untyped_storage().nbytes(),
               head_B=0 if head.data_ptr() == emb.data_ptr() else head.untyped_storage().nbytes(),
               formula_embed_B=v * d * b, formula_head_B=v * d * b,
               logits_B_per_token=logits[0, -1].numel() * logits.element_size(), formula_logits_B_per_token=v * b,
               body_params=body, head_flops=2 * d * v, step_flops=2 * (d * v + body),
               step_ms=1e3 * step.median, step_ms_p10=1e3 * step.p10, step_ms_p90=1e3 * step.p90,
               head_ms=1e3 * head_s.median, head_GBps=head.untyped_storage().nbytes() / head_s.median / 1e9,
               head_share=float(np.median(shares)),
               formula_share=d * v / (d * v + body))
    return row


def vocab_rows(cfg: Config, device: Device, layers: int, progress=None) -> Iterator[dict]:
    """One row per vocabulary size, as it is measured (a Ctrl-C keeps the sizes done)."""
    from llmlab.core.models import load_config, shape

    full = shape(load_config(cfg.shape))
    for v in track(progress, cfg.vocab_sizes, "vocabulary: bytes and a timed decode step"):
        row = vocab_row(shape_config(cfg, v, layers), cfg, device)
        per_layer = row["body_params"] // layers
        row["full_layers"] = full["layers"]
        row["formula_share_full"] = row["hidden"] * v / (row["hidden"] * v + full["layers"] * per_layer)
        yield row


# ---------------------------------------------------------------- run


def check(cfg: Config) -> None:
    """Every model must load a tokenizer (one line, exit 2, before anything is measured)."""
    from llmlab.core.models import classify

    for ref in cfg.models:
        classify(ref)
    classify(cfg.shape)


def _same_tokenizer(a, b) -> bool:
    return a.get_vocab() == b.get_vocab()


def run(cfg: Config, device: Device, progress=None) -> LabResult:
    """Measures. Fills tables; never prints, never judges."""
    from llmlab.core.models import load

    res = LabResult.new(LAB, VERSION, cfg)
    with torch_threads(None if device.is_cuda else threads_for(cfg.threads, res.note)), res.guard():
        res.env["torch_threads"] = torch.get_num_threads()
        tok_rows, count, nb, seen = [], [], [], []
        for ref in cfg.models:
            lm = load(ref, device)
            if not any(_same_tokenizer(lm.tokenizer, t) for t in seen):
                seen.append(lm.tokenizer)
                tok_rows += tokenization_rows(lm.tokenizer, ref)
                res.add_table("tokenization", tok_rows)
            count += counting_rows(lm.model, lm.tokenizer, ref, cfg, device)
            res.add_table("counting", count)
            ids = corpus_ids(lm.tokenizer, cfg.corpus_chars)
            emb = lm.model.get_input_embeddings().weight.detach()
            nb += neighbour_rows(emb, lm.tokenizer, ref, ids, cfg, progress)
            res.env.setdefault("corpus_tokens", {})[ref] = len(ids)
            del lm
            res.add_table("neighbours", nb)
            res.add_table("embedding_test", embedding_summary(res.tables["neighbours"], cfg))
            res.add_table("examples", example_rows(res.tables["neighbours"]))
        n = res.env["corpus_tokens"][cfg.models[0]]
        res.note(f"related = the same word up to case and leading space, a shared stem (4+ letters), or within "
                 f"+-{cfg.window} tokens >= {cfg.cooc_min} times and >= {cfg.cooc_ratio:g}x chance in {n:,} tokens of "
                 "held-out documents of the built-in corpus (tiny and tiny-draft never trained on them)")
        layers = res.env["vocab_layers"] = sweep_layers(cfg, device, sweep_dtype(device).itemsize)
        rows = []
        for row in vocab_rows(cfg, device, layers, progress):
            rows.append(row)
            res.add_table("vocab", rows)
        res.note(f"part 3 is {cfg.shape}'s layer shape cut to {layers} layers, untied head, random weights: a timing "
                 "and a byte count, not a quality claim")
    return res


# ---------------------------------------------------------------- judge


def judge(result: LabResult) -> list[Claim]:
    """Every verdict from the tables alone."""
    t = result.tables
    claims = []
    if not empty_table(t.get("tokenization")):
        claims += tokenization_claims(t["tokenization"])
    if not empty_table(t.get("counting")):
        claims += counting_claims(t["counting"])
    if not empty_table(t.get("embedding_test")) and set(t["embedding_test"].kind) >= {"cosine", "id"}:
        claims += [embedding_claim(t["embedding_test"], result.config)]
    if not empty_table(t.get("vocab")):
        claims += vocab_claims(t["vocab"])
    return claims


def tokenization_claims(df: pd.DataFrame) -> list[Claim]:
    bad = df[~df.roundtrip.astype(bool)]
    rt = Claim("tokens.roundtrip", "tokenization loses nothing: the ids decode back to the text",
               "decode(encode(text)) == text, every sample",
               f"{len(df) - len(bad)} of {len(df)} samples exact" + (f"; not: {', '.join(bad['sample'][:3])}" if len(bad) else ""),
               len(bad) == 0)
    same = df[(df.kind == "same sentence") & ~df["sample"].str.startswith("English")]
    if same.empty:  # a run cut before the translations
        return [rt]
    worst = same.loc[same.x_english.idxmin()]
    dearest = same.loc[same.x_english.idxmax()]
    premium = Claim("tokens.english_cheapest", "the same sentence costs more tokens in other languages",
                    "tokens / English's tokens > 1 for every translation of UDHR article 1",
                    f"lowest {worst.x_english:.2f}x ({worst['sample']}), highest {dearest.x_english:.2f}x "
                    f"({dearest['sample']}, {dearest.tokenizer})", bool((same.x_english > 1).all()))
    return [rt, premium]


def counting_claims(df: pd.DataFrame) -> list[Claim]:
    share = df.groupby("word").multi_letter.first().astype(bool).mean()
    strawberry = df.iloc[0]
    hidden = Claim("tokens.letters_not_in_tokens", "the letters are not in the tokens",
                   f"> {MULTI_LETTER_SHARE:.0%} of the test words split into pieces of 2+ letters",
                   f"{share:.0%} of {df.word.nunique()} words; {strawberry.word} = {strawberry.pieces}",
                   share > MULTI_LETTER_SHARE)
    answered = df.answered.astype(bool)
    first = df.model.iloc[0]
    if answered.mean() < ANSWERED_MIN:
        counted = Claim("tokens.letter_counting", "a model that reads tokens miscounts letters",
                        f"accuracy < {COUNT_ACCURACY_MAX:.0%}, where >= {ANSWERED_MIN:.0%} of prompts get a number back",
                        "-", None,
                        note=f"{int(answered.sum())} of {len(df)} prompts got a number back: {first} continues text "
                             "(trained on Python docs), it does not answer questions")
    else:
        acc = df[answered].correct.astype(bool).mean()
        counted = Claim("tokens.letter_counting", "a model that reads tokens miscounts letters",
                        f"accuracy < {COUNT_ACCURACY_MAX:.0%} on the answered 'how many <letter> in <word>?' prompts",
                        f"{acc:.0%} correct of {int(answered.sum())} answered ({len(df)} asked)", acc < COUNT_ACCURACY_MAX)
    return [hidden, counted]


def embedding_claim(df: pd.DataFrame, config: dict) -> Claim:
    parts, ok = [], True
    for label, sub in df.groupby("model", sort=False):
        if set(sub.kind) < {"cosine", "id"}:
            continue  # a model cut between its two rows
        s = sub.set_index("kind")
        cos, idn, p = s.loc["cosine", "related_share"], s.loc["id", "related_share"], s.loc["cosine", "p_value"]
        ratio = cos / idn if idn > 0 else math.inf
        ok = ok and ratio >= RELATED_RATIO_MIN and p < P_MAX
        parts.append(f"{label}: {cos:.0%} vs {idn:.0%} ({ratio:.1f}x), p = {p:.1g}")
    perms = int(df.permutations.iloc[0])
    return Claim("tokens.embedding_neighbours_related", "an id means nothing; its embedding sits next to related words",
                 f"related share by cosine >= {RELATED_RATIO_MIN:g}x by id; paired sign-flip p < {P_MAX:g} "
                 f"({perms:,} permutations, seed {config.get('seed', 0)})", "; ".join(parts), ok)


def vocab_claims(df: pd.DataFrame) -> list[Claim]:
    exact = ((df.embed_B == df.formula_embed_B) & (df.head_B == df.formula_head_B)
             & (df.logits_B_per_token == df.formula_logits_B_per_token))
    big = df.iloc[-1]
    claims = [Claim("tokens.vocab_bytes_formula", "the vocabulary's memory is d x V per matrix",
                    "embedding, head: d x V x b bytes each; logits: V x b per token (b = bytes a value); exact",
                    f"{int(exact.sum())} of {len(df)} sizes exact",
                    bool(exact.all()))]
    if len(df) >= 3:
        rho = df.vocab.rank().corr(df.head_share.rank())
        claims.append(Claim("tokens.head_share_grows", "a bigger V makes the LM head a bigger part of a step",
                            f"Spearman rho(share, V) >= {RHO_MIN:g} over {len(df)} sizes",
                            f"rho = {rho:.2f}; {df.head_share.iloc[0]:.0%} at {int(df.vocab.iloc[0]):,} -> "
                            f"{big.head_share:.0%} at {int(big.vocab):,}", rho >= RHO_MIN))
    gap = big.head_share - big.formula_share
    claims.append(Claim("tokens.head_share_formula", "at large V the head's share of a step is its weights' share",
                        f"|measured - d V / (d V + body params)| <= {SHARE_BAND:g} at the largest V",
                        f"{big.head_share:.0%} vs {big.formula_share:.0%} at V = {int(big.vocab):,}",
                        abs(gap) <= SHARE_BAND,
                        note="per-layer fixed costs (launches, Python) pull the measured share down"))
    if len(df) < 2:
        return claims  # one size: nothing was added
    d_step, d_head = big.step_ms - df.step_ms.iloc[0], big.head_ms - df.head_ms.iloc[0]
    r = d_step / d_head if d_head > 0 else math.inf
    lo, hi = DELTA_BAND
    claims.append(Claim("tokens.vocab_cost_is_the_head", "what a bigger V adds to a decode step is its LM head",
                        f"added step time / added head time, smallest to largest V, in {lo:g}-{hi:g}",
                        f"{r:.2f} ({d_step:.2f} vs {d_head:.2f} ms more)", lo <= r <= hi))
    return claims


def headline(result: LabResult, claims: list[Claim]) -> str:
    t = result.tables
    if any(empty_table(t.get(n)) for n in ("counting", "embedding_test", "vocab")):
        return ""
    c, e, v = t["counting"].iloc[0], t["embedding_test"], t["vocab"].iloc[-1]
    if set(e.kind) < {"cosine", "id"}:
        return ""
    cos = e[e.kind == "cosine"].iloc[0]
    idn = e[e.kind == "id"].iloc[0]
    return (f"{c.model} reads '{c.word}' as {c.pieces}: the letters are inside ids. Its nearest embeddings are related "
            f"words {cos.related_share:.0%} of the time against {idn.related_share:.0%} for the nearest ids; at "
            f"V = {int(v.vocab):,} the LM head took {v.head_share:.0%} of a decode step here.")


def views(result: LabResult) -> list[View]:
    k = result.config.get("k", 5)
    return [
        View("1. How text becomes tokens", "How many tokens does each kind of text cost? (x English: the same sentence)",
             "tokenization", (Col("tokenizer", "tokenizer", width=10), Col("sample", "sample", width=16),
                              Col("chars", "chars", "int"), Col("words", "words", "int"), Col("tokens", "tokens", "int"),
                              Col("tokens_per_word", "tok/word", ".2f"), Col("tokens_per_char", "tok/char", ".2f"),
                              Col("x_english", "x English", "x")), max_rows=26),
        View("   ... and why letters are hard to count", "What does the model see of a word, and can it count a letter?",
             "counting", (Col("word", "word", width=11), Col("pieces", "pieces (ids)", width=20),
                          Col("letter", "letter"), Col("count", "count", "int"), Col("answer", "model's answer", width=16)),
             rows=lambda df: df[df.model == df.model.iloc[0]], max_rows=5),
        View("2. What an id means: its embedding", f"The {k} nearest word tokens by cosine vs by id (* = related)",
             "examples", (Col("word", "word", width=10), Col("cosine", "nearest by cosine", width=32),
                          Col("by_id", "nearest by id", width=30)), max_rows=4),
        View("   ... related how often?", "Are embedding neighbours related words more often than id neighbours?",
             "embedding_test", (Col("model", "model", width=10), Col("kind", "neighbours"), Col("pairs", "pairs", "int"),
                                Col("related_share", "related", "%"), Col("variant_share", "same word", "%"),
                                Col("median_id_distance", "id distance", "int"), Col("p_value", "p", ".1g"))),
        View("3. Vocabulary size: memory and cost", "What do V rows cost in bytes, and in a decode step?",
             "vocab", (Col("vocab", "V", "int"), Col("embed_B", "emb+head MiB", ".0f"),
                       Col("logits_B_per_token", "logits KiB/tok", ".0f"), Col("head_ms", "head ms", ".3f"),
                       Col("step_ms", "step ms", ".2f"), Col("head_share", "head share", "%"),
                       Col("formula_share", "formula", "%"), Col("formula_share_full", "full model", "%")),
             rows=_vocab_units),
    ]


def _vocab_units(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["embed_B"] = (df.embed_B + df.head_B) / 2**20
    df["logits_B_per_token"] = df.logits_B_per_token / 1024
    return df


def figures(result: LabResult) -> list[tuple[str, object]]:
    """The HTML report's plot: the LM head's share of a decode step vs V, measured and by the weights' formula."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = result.tables.get("vocab")
    if empty_table(df):
        return []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(df.vocab, 100 * df.head_share, "o-", label="measured (head / step time)")
    ax.plot(df.vocab, 100 * df.formula_share, "s--", label="formula d V / (d V + body), layers run")
    ax.plot(df.vocab, 100 * df.formula_share_full, ":", label="formula, the full model's layers")
    ax.set(xlabel="vocabulary size V", ylabel="LM head share of a decode step (%)", ylim=(0, 100))
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return [("The LM head's share of a decode step grows with the vocabulary", fig)]
