"""A character-level tokenizer behind the ``transformers`` tokenizer API.

The embedded model reads one token per character, so Sudoku grids, Countdown expressions and short
answers need no learned vocabulary. Exposing it as a ``PreTrainedTokenizer`` lets the rest of the
code (prompt encoding, decoding, padding, ``save_pretrained``) treat it like any Hugging Face
tokenizer.
"""

from __future__ import annotations

import json
import os
import string

from transformers import PreTrainedTokenizer

PAD, MASK, EOS, BOS, UNK = "<|pad|>", "<|mdm_mask|>", "<|eos|>", "<|bos|>", "<|unk|>"
SPECIALS = [PAD, MASK, EOS, BOS, UNK]
# printable ASCII minus the vertical tab / form feed, plus newline and tab: every task's text fits
CHARS = [c for c in string.printable if c not in "\x0b\x0c\r"]
VOCAB_FILE = "char_vocab.json"


class CharTokenizer(PreTrainedTokenizer):
    """One id per character; unknown characters map to ``<|unk|>``."""

    vocab_files_names = {"vocab_file": VOCAB_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str | None = None, **kwargs):
        if vocab_file is not None:
            with open(vocab_file, encoding="utf-8") as f:
                tokens = json.load(f)
        else:
            tokens = SPECIALS + CHARS
        self._tok2id = {t: i for i, t in enumerate(tokens)}
        self._id2tok = dict(enumerate(tokens))
        kwargs.setdefault("pad_token", PAD)
        kwargs.setdefault("mask_token", MASK)
        kwargs.setdefault("eos_token", EOS)
        kwargs.setdefault("bos_token", BOS)
        kwargs.setdefault("unk_token", UNK)
        kwargs.setdefault("padding_side", "left")  # prompts are left-padded so completions align
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._tok2id)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tok2id)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self._tok2id.get(token, self._tok2id[UNK])

    def _convert_id_to_token(self, index: int) -> str:
        return self._id2tok.get(int(index), UNK)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILE
        path = os.path.join(save_directory, name)
        tokens = [self._id2tok[i] for i in range(len(self._id2tok))]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tokens, f)
        return (path,)
