"""Byte-level BPE for the built-in pair, trained with the `tokenizers` library, saved as a HF tokenizer.

Byte-level (GPT-2 style): any string round-trips, no unknown token. One special token,
`<|endoftext|>`, separates documents and is the model's bos/eos/pad.

References:
- https://huggingface.co/docs/tokenizers/api/models#tokenizers.models.BPE
- https://huggingface.co/docs/tokenizers/api/pre-tokenizers#tokenizers.pre_tokenizers.ByteLevel
- https://huggingface.co/docs/transformers/main_classes/tokenizer#transformers.PreTrainedTokenizerFast
"""

from __future__ import annotations

from pathlib import Path

from llmlab.tiny.corpus import EOT

VOCAB_SIZE = 4096  # small: the embedding stays ~1 M of a ~5 M model, and 0.5 M-token corpora fill it


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """Train a byte-level BPE on documents; returns a `transformers.PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a merge seen once is noise
        special_tokens=[EOT],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=None,
        model_max_length=8192, clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer, out: Path) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))


def encode_documents(tokenizer, docs: list[str]) -> list[int]:
    """All documents as one id stream, each followed by the end-of-text id."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    ids: list[int] = []
    # the Rust tokenizer directly: fast, and no "longer than model_max_length" warning for whole documents
    for enc in tokenizer.backend_tokenizer.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return ids
