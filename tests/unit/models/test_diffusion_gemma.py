"""DiffusionGemma behind the policy interface (models/diffusion_gemma.py): the released config.json loads
through transformers' own class; the tiny model differs from it only in sizes; the network's one call
gives transformers' own logits, its self-conditioning injection equals transformers' computation from
logits, and its head-only-where-asked path equals log-softmax of the full logits; routers and the vision
tower stay frozen; LoRA adapters are shared by the encoder and decoder as their weights are."""

from __future__ import annotations

import json

import pytest
import torch

from diffusion_rl.core.config import from_dict
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.diffusion_gemma import RELEASED_TEXT, TINY_VISION, tiny_text
from diffusion_rl.models.policy import NO_MASK, ModelConfig, encode_prompts, logits_fn
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.sampling.entropy_bound import EntropyBoundConfig
from tests.helpers.common import compose_cfg
from tests.helpers.gemma import sharp_gemma
from tests.helpers.released_layouts import (
    DIFFUSION_GEMMA,
    DIFFUSION_GEMMA_TINY,
    FIXTURES,
    write_diffusion_gemma,
)
from tests.helpers.tiny_hf import needs_peft

RELEASED = json.loads((FIXTURES / DIFFUSION_GEMMA / "config.json").read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_diffusion_gemma(tmp_path_factory.mktemp("diffusion_gemma"))


def test_the_released_config_loads_with_transformers_class():
    """The fixture is the released layout transformers reads: 30 layers (5 sliding : 1 full), 128 experts
    of which 8 route each token, full layers with 2 key/value heads of 512 and keys as values, 256-token canvases."""
    from transformers import DiffusionGemmaConfig

    cfg = DiffusionGemmaConfig.from_dict(RELEASED)
    text = cfg.text_config
    assert (cfg.canvas_length, text.num_hidden_layers, text.hidden_size, text.vocab_size) == (256, 30, 2816, 262144)
    assert (text.num_experts, text.top_k_experts, text.moe_intermediate_size) == (128, 8, 704)
    assert text.layer_types.count("full_attention") == 5 and text.layer_types[-1] == "full_attention"
    full = text.per_layer_config[5]
    assert (full.head_dim, full.num_key_value_heads) == (512, 2)


def test_the_tiny_models_are_the_released_config_but_for_sizes(folder):
    """Both tiny configurations (the in-process preset and the test checkpoint) keep every released field
    that is not a size, a vocabulary id or a layer count; the checkpoint's config.json keeps every key."""
    size_keys = set(tiny_text(32, 2, 4)) | {"vocab_size", "pad_token_id", "eos_token_id", "bos_token_id"}
    released = RELEASED["text_config"]
    for key, value in RELEASED_TEXT.items():
        assert released[key] == value, key
    assert set(released) - size_keys - set(RELEASED_TEXT) <= {"dtype", "initializer_range", "model_type"}
    written = json.loads((folder / "config.json").read_text())
    assert set(written) == set(RELEASED) and set(written["text_config"]) == set(released)
    changed = {k for k in released if written["text_config"][k] != released[k]}
    assert changed <= set(DIFFUSION_GEMMA_TINY["text_config"]) | {"vocab_size"}
    assert {k for k in RELEASED if k not in ("text_config", "vision_config") and written[k] != RELEASED[k]} == {"canvas_length"}
    assert set(TINY_VISION) <= set(RELEASED["vision_config"])


def test_the_preset_loads_the_released_layout_and_rolls_out(folder, tmp_path):
    """``model=diffusion_gemma model.path=<folder>``: transformers' class, the uniform-noise bundle, a rollout."""
    cfg = compose_cfg(["model=diffusion_gemma", f"model.path={folder}", "model.dtype=float32", "model.lora_r=0",
                       "model.eos_token_id=null", "model.gradient_checkpointing=false"], tmp_path, tiny=False)
    b = build_policy(from_dict(ModelConfig, cfg.model, "model"))
    assert type(b.net.model).__name__ == "DiffusionGemmaForBlockDiffusion"
    assert (b.noise, b.mask_token_id, b.eos_token_id, b.pad_token_id, b.block_size) == ("uniform", NO_MASK, 1, 0, 0)
    ids, mask = encode_prompts(b.tokenizer, ["12+3=", "7*6="])
    out = sample(b, ids, mask, SamplerConfig(gen_length=32, uniform=EntropyBoundConfig(steps=3)), RowNoise([1, 2]))
    assert out.completion.shape == (2, 32) and out.steps >= 2


@pytest.mark.parametrize("key, value, what", [("attention", "block_causal", "own attention"),
                                              ("block_size", 4, "canvas_length=16")])
def test_a_model_option_it_cannot_take_fails_in_one_line(folder, key, value, what):
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(folder), **{"block_size": 16, key: value}))
    assert "\n" not in str(err.value) and f"model.{key}" in str(err.value) and what in str(err.value)


def test_the_call_gives_transformers_logits_and_its_self_conditioning():
    """Our call's logits are transformers' forward's; a self-conditioning signal injected as our soft embedding
    gives what transformers computes from ``self_conditioning_logits``; ``targets`` gives log-softmax of the
    full logits at the temperature, only at ``select``."""
    b = sharp_gemma(scale=10.0)
    net, hf = b.net, b.net.model
    g = torch.Generator().manual_seed(0)
    ctx, canvas = torch.randint(4, 100, (2, 5), generator=g), torch.randint(0, 100, (2, 8), generator=g)
    prev = 3 * torch.randn(2, 8, net.vocab_size, generator=g)
    with torch.no_grad():
        ref = hf(input_ids=ctx, decoder_input_ids=canvas, self_conditioning_logits=prev / 0.7).logits
        ours = net(input_ids=ctx, canvas=canvas, self_conditioning=net.soft_embedding(prev, 0.7))
        bare = net(input_ids=ctx, canvas=canvas)
        assert torch.allclose(ours.logits, ref, atol=1e-5) and not torch.allclose(bare.logits, ref, atol=1e-2)
        targets = torch.randint(0, 100, (2, 8), generator=g)
        select = torch.rand(2, 8, generator=g) < 0.5
        t = torch.tensor([0.5, 0.8])
        lp = net(input_ids=ctx, canvas=canvas, targets=targets, select=select, temperature=t).token_logps
    want = (bare.logits / t[:, None, None]).log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(lp, torch.where(select, want, torch.zeros_like(want)), atol=1e-5)


def test_routers_and_the_vision_tower_stay_frozen_unless_asked():
    b = build_policy(ModelConfig(name="diffusion_gemma_tiny", d_model=32, n_layers=2, block_size=8))
    frozen = {n for n, p in b.net.named_parameters() if not p.requires_grad}
    assert frozen and all(".router." in n or "vision" in n for n in frozen)
    assert any(".router.proj" in n for n in frozen) and any("vision_tower" in n for n in frozen)
    b = build_policy(ModelConfig(name="diffusion_gemma_tiny", d_model=32, n_layers=2, block_size=8, train_router=True))
    assert all(p.requires_grad for n, p in b.net.named_parameters() if ".router." in n)


@needs_peft
def test_lora_adapters_are_shared_by_the_encoder_and_the_decoder(tmp_path):
    """The preset's targets: attention and dense MLP of every layer (encoder and decoder get one adapter
    each module, tied as the weights are) and the self-conditioning MLP; experts, routers, vision: none."""
    cfg = compose_cfg(["model=diffusion_gemma"], tmp_path, tiny=False)
    targets = cfg.model.lora_targets
    b = build_policy(ModelConfig(name="diffusion_gemma_tiny", d_model=32, n_layers=2, block_size=8, lora_r=4,
                                 lora_targets=targets))
    named = dict(b.net.named_modules())
    enc = named["base_model.model.model.model.encoder.language_model.layers.0.self_attn.q_proj"]
    dec = named["base_model.model.model.model.decoder.layers.0.self_attn.q_proj"]
    assert enc.lora_A is dec.lora_A and enc.lora_B is dec.lora_B
    trained = [n for n, p in b.net.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert any("self_conditioning" in n for n in trained) and not any("expert" in n or "vision" in n for n in trained)
    adapted = [n for n, m in named.items() if ".decoder." in n and hasattr(m, "lora_A")]
    assert len(trained) == 2 * len(adapted)  # one A and one B per decoder module: the encoder adds none
    with torch.no_grad():
        for p in b.net.parameters():
            if p.requires_grad:
                p.add_(0.1)
    ctx, canvas = torch.randint(4, 100, (1, 4)), torch.randint(0, 100, (1, 8))
    fwd = logits_fn(b.net)
    with torch.no_grad():
        adapted = fwd.run(input_ids=ctx, canvas=canvas).logits
        with b.net.disable_adapter():
            base = fwd.run(input_ids=ctx, canvas=canvas).logits
    assert not torch.allclose(adapted, base, atol=1e-4)


def test_fsdp_shards_each_encoder_layer_with_its_decoder_twin():
    """A parameter is sharded by one FSDP2 unit: the encoder layer i and decoder layer i share every weight
    (experts and router included), so they are one unit; unrelated layers stay apart (the two-process
    runs: tests/e2e/test_diffusion_gemma_fsdp.py, slow tier)."""
    from diffusion_rl.training.strategy import decoder_layer_classes, sharing_groups

    b = build_policy(ModelConfig(name="diffusion_gemma_tiny", d_model=32, n_layers=3, block_size=8))
    layers = [m for m in b.net.modules() if type(m) in decoder_layer_classes(b.net)]
    groups = sharing_groups(layers)
    text = [g for g in groups if "TextLayer" in type(g[0]).__name__]
    assert [len(g) for g in text] == [2, 2, 2] and all(len(g) == 1 for g in groups if g not in text)  # vision: alone
    for enc, dec in text:
        assert type(enc).__name__.endswith("EncoderTextLayer") and type(dec).__name__.endswith("DecoderTextLayer")
        assert enc.experts.gate_up_proj is dec.experts.gate_up_proj
    assert [len(g) for g in sharing_groups([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])] == [1, 1]
