"""A tiny Hugging Face checkpoint for the ``model=hf`` tests (unit and whole-run), and what they share:
the LoRA skip mark and the overrides of a run that only takes RL steps. The checkpoint's folder is the
``hf_path`` fixture (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

HAS_PEFT = importlib.util.find_spec("peft") is not None
needs_peft = pytest.mark.skipif(not HAS_PEFT, reason="LoRA needs peft (the [hf] extra)")


def save_tiny_hf(path: Path) -> Path:
    """A 2-layer Llama (d=32) and a character tokenizer with pad / mask / EOS tokens, in ``path``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from diffusion_rl.models.tokenizer import BOS, CHARS, EOS, MASK, PAD, SPECIALS, UNK

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # one token per character, newlines included
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token=PAD,
        mask_token=MASK,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
    )
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=vocab[PAD],
        eos_token_id=vocab[EOS],
        bos_token_id=vocab[BOS],
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


# two prompts x 4 samples, no warm start or evaluation: only the RL steps
SMALL = [
    "task.num_train=64",
    "task.num_test=8",
    "task.prompts_per_batch=2",
    "task.group_size=4",
    "warmstart.enabled=false",
    "eval.before=false",
    "eval.after=false",
    "sampler.steps=4",
    "trainer.enable_progress_bar=false",
    "trainer.checkpoint_every_n_steps=0",
    "diagnostics.samples_every_n_steps=0",
]
