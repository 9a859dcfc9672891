"""Hugging Face backend, LoRA, the old policy's modes and strategies, on tiny models and CPUs. Whole runs
(RL steps, the cached old policy against a copy, DDP): tests/e2e/test_hf.py.

A tiny randomly initialised Llama (made bidirectional by the wrapper's 4D mask) and a character
tokenizer with a mask token are saved to a temporary folder and loaded through ``model=hf
model.path=...``: the code path a real checkpoint takes. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig
from tests.helpers.common import compose_cfg
from tests.helpers.tiny_hf import HAS_PEFT, SMALL, needs_peft


# ---- loading -----------------------------------------------------------------------------------
def test_hf_bundle_is_bidirectional_with_ids_from_the_tokenizer(hf_path):
    b = build_policy(ModelConfig(name="hf", path=str(hf_path)))
    tok = b.tokenizer
    assert (b.mask_token_id, b.eos_token_id, b.pad_token_id) == (
        tok.mask_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    other = ids.clone()
    other[0, -1] = 10
    with torch.no_grad():
        a, c = b.net(input_ids=ids).logits, b.net(input_ids=other).logits
    assert not torch.allclose(a[0, 0], c[0, 0])  # the first position sees the last: no causal mask
    padded = torch.tensor([[0, 0, 5, 6, 7]])
    with torch.no_grad():  # left padding changes nothing for the real tokens (positions skip it)
        p = b.net(input_ids=padded, attention_mask=torch.tensor([[0, 0, 1, 1, 1]])).logits
        q = b.net(input_ids=padded[:, 2:]).logits
    torch.testing.assert_close(p[:, 2:], q, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["missing", "no_config", "file", "hub_offline", "none"])
def test_bad_model_path_fails_in_one_line_naming_it(tmp_path, case):
    path = {
        "missing": str(tmp_path / "nowhere"),
        "no_config": str(tmp_path),
        "file": str(tmp_path / "f.bin"),
        "hub_offline": "no-such-org/no-such-model-xyz",
        "none": None,
    }[case]
    (tmp_path / "f.bin").write_bytes(b"0")
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=path))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("model.path=")
    assert str(path) in msg and "expected" in msg


def test_folder_without_tokenizer_or_weights_fails_in_one_line(tmp_path, hf_path):
    (tmp_path / "config.json").write_text((hf_path / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(tmp_path)))
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_remote_code_is_never_run_unless_configured(tmp_path):
    marker = tmp_path / "ran.txt"
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "evil_dlm",
                "auto_map": {
                    "AutoConfig": "configuration_evil.EvilConfig",
                    "AutoModel": "modeling_evil.EvilModel",
                },
            }
        )
    )
    (tmp_path / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil_dlm'\n"
    )
    assert ModelConfig().trust_remote_code is False
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(tmp_path)))
    assert str(err.value).startswith("model.trust_remote_code=False") and "\n" not in str(err.value)
    assert not marker.exists()
    cfg = compose_cfg(["model=hf", f"model.path={tmp_path}"], tmp_path, tiny=False)
    assert cfg.model.trust_remote_code is False  # the generic config never turns it on


TOY_CONFIG = """from transformers import PretrainedConfig


class ToyConfig(PretrainedConfig):
    model_type = "toy_dlm"

    def __init__(self, vocab_size=8, hidden=4, mask_token_id=1, **kwargs):
        self.vocab_size, self.hidden, self.mask_token_id = vocab_size, hidden, mask_token_id
        super().__init__(**kwargs)
"""
TOY_MODEL = """from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from .configuration_toy import ToyConfig


class ToyModel(PreTrainedModel):  # written for transformers 4.x: no post_init(), tie_weights(self)
    config_class = ToyConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = nn.Embedding(config.vocab_size, config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def tie_weights(self):
        pass

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return MaskedLMOutput(logits=self.head(self.emb(input_ids)))
"""


def test_remote_code_without_post_init_loads_through_a_logged_shim(tmp_path, hf_path, caplog):
    import logging

    from safetensors.torch import save_file

    folder = tmp_path / "toy"
    folder.mkdir()
    for f in hf_path.glob("*token*"):
        (folder / f.name).write_bytes(f.read_bytes())
    vocab = json.loads((hf_path / "config.json").read_text())["vocab_size"]
    (folder / "config.json").write_text(json.dumps({
        "model_type": "toy_dlm", "vocab_size": vocab, "hidden": 4, "mask_token_id": 1,
        "auto_map": {"AutoConfig": "configuration_toy.ToyConfig", "AutoModel": "modeling_toy.ToyModel"}}))
    (folder / "configuration_toy.py").write_text(TOY_CONFIG)
    (folder / "modeling_toy.py").write_text(TOY_MODEL)
    g = torch.Generator().manual_seed(0)
    weights = {"emb.weight": torch.randn(vocab, 4, generator=g), "head.weight": torch.randn(vocab, 4, generator=g)}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="diffusion_rl.models.hf"):
        b = build_policy(ModelConfig(name="hf", path=str(folder), impl="remote", trust_remote_code=True,
                                     attention="native"))
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(b.net(input_ids=ids).logits, weights["emb.weight"][ids] @ weights["head.weight"].T)
    from transformers import AutoModel

    try:
        AutoModel.from_pretrained(folder, trust_remote_code=True)
        needed = False
    except AttributeError:
        needed = True
    shimmed = any("post_init" in r.getMessage() for r in caplog.records)
    assert shimmed == needed  # applied, and said so, exactly when this transformers needs it
    with pytest.raises(ConfigError) as err:  # never without consent
        build_policy(ModelConfig(name="hf", path=str(folder), impl="remote"))
    assert str(err.value).startswith("model.trust_remote_code=False")


def test_four_bit_without_bitsandbytes_or_cuda_fails_in_one_line(hf_path):
    if importlib.util.find_spec("bitsandbytes") and torch.cuda.is_available():
        pytest.skip("bitsandbytes and CUDA are both here: 4-bit loading is allowed")
    with pytest.raises(ConfigError) as err:
        build_policy(ModelConfig(name="hf", path=str(hf_path), lora_r=8, load_in_4bit=True))
    assert str(err.value).startswith("model.load_in_4bit=True")
    with pytest.raises(ConfigError):  # 4-bit weights cannot be fully fine-tuned
        ModelConfig(name="hf", path=str(hf_path), load_in_4bit=True).validate()


def test_named_model_configs_validate(tmp_path):
    from diffusion_rl.core.config import from_dict

    for name in ("llada_8b_instruct", "llada_1_5", "dream_7b_instruct", "sdar_8b_chat", "sdar_4b_chat",
                 "sdar_1_7b_chat", "diffucoder_7b_instruct", "trado_8b_instruct", "trado_4b_instruct"):
        cfg = compose_cfg([f"model={name}"], tmp_path, tiny=False)
        m = from_dict(ModelConfig, cfg.model, "model")
        m.validate()
        # our own classes, no checkpoint code; special ids from the checkpoint; SDAR's block size from the
        # preset (its released config.json names none)
        assert m.name == "hf" and m.impl == "native" and not m.trust_remote_code
        assert m.mask_token_id is None and m.block_size == (4 if name.startswith(("sdar", "trado")) else 0)
        assert (m.lora_r, m.lora_alpha, m.lora_dropout, m.dtype) == (128, 64, 0.05, "bfloat16")
    llada = from_dict(
        ModelConfig, compose_cfg(["model=llada_8b_instruct"], tmp_path, tiny=False).model, "model"
    )
    import re

    pattern = re.compile(llada.lora_targets)  # peft full-matches a string target
    assert pattern.fullmatch("model.model.transformer.blocks.3.ff_out")
    assert not pattern.fullmatch("model.model.transformer.ff_out")  # the output head stays frozen


# ---- LoRA's reference ------------------------------------------------------------------------------


@needs_peft
def test_lora_reference_is_the_base_model_without_a_copy(tmp_path, hf_path):
    cfg = compose_cfg(
        ["model=hf", f"model.path={hf_path}", "model.lora_r=8", "objective.beta=0.04"] + SMALL,
        tmp_path,
        tiny=False,
    )
    c = build(cfg)
    from diffusion_rl.models.adapters import reference_logits_fn
    from diffusion_rl.training.module import DiffusionRLModule

    m = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0, old_policy="precomputed")
    assert m.ref_policy is None and m.old_policy is None  # one model in memory
    for name, p in m.policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # adapters that change the output
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = build_policy(ModelConfig(name="hf", path=str(hf_path))).net  # the checkpoint alone
    with torch.no_grad():
        ref = reference_logits_fn(m.policy)(ids, None)
        base = plain(input_ids=ids).logits
        pol = m.policy(input_ids=ids).logits
    torch.testing.assert_close(ref, base)
    assert not torch.allclose(ref, pol)


@needs_peft
def test_reference_forward_leaves_dropout_off_for_the_checkpointed_backward(tmp_path, hf_path):
    """An update runs the policy's forward, the reference's (adapters off) and the backward, all with
    dropout off; the backward recomputes the checkpointed layers, which must see the forward's modes."""
    from diffusion_rl.models.adapters import reference_logits_fn
    from diffusion_rl.models.policy import dropout_disabled, logits_fn

    cfg = ModelConfig(name="hf", path=str(hf_path), lora_r=4, lora_dropout=0.5, gradient_checkpointing=True)
    net = build_policy(cfg).net.train()
    modes = {name: m.training for name, m in net.named_modules()}
    assert sum(isinstance(m, torch.nn.Dropout) and m.training for m in net.modules()) > 0  # LoRA's dropout
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])

    def gradient(with_reference: bool) -> dict[str, torch.Tensor]:
        net.zero_grad()
        with dropout_disabled(net):
            logits = logits_fn(net)(ids, None)
            if with_reference:
                with torch.no_grad():
                    reference_logits_fn(net)(ids, None)
                # no module changed mode, dropout included
                assert {name: m.training for name, m in net.named_modules()} == {
                    name: m.training and not isinstance(m, torch.nn.Dropout) for name, m in net.named_modules()
                }
            (logits.log_softmax(-1)[..., 3].sum()).backward()
        return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}

    alone, beside = gradient(False), gradient(True)
    assert alone.keys() == beside.keys() and any("lora" in n for n in alone)
    for name in alone:
        torch.testing.assert_close(beside[name], alone[name], msg=name)  # dropout off in both passes
    assert {name: m.training for name, m in net.named_modules()} == modes  # back on after the update


# ---- old_policy=copy vs cached -------------------------------------------------------------------


def test_old_policy_value_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="old_policy='frozen'"):
        build(compose_cfg(["old_policy=frozen"], tmp_path))
    c = build(compose_cfg([], tmp_path))
    from diffusion_rl.training.module import DiffusionRLModule

    with pytest.raises(ConfigError, match="old_policy='frozen'"):
        DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, 0, old_policy="frozen")


# ---- strategies ----------------------------------------------------------------------------------
def test_trainer_configs_and_fsdp_shards_decoder_layers(tmp_path, hf_path):
    """The trainer presets validate; FSDP2 units are the decoder layers (tests/e2e/test_fsdp.py trains through them)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from diffusion_rl.app.train import TrainerConfig
    from diffusion_rl.core.config import from_dict
    from diffusion_rl.models.tiny import Block
    from diffusion_rl.training.strategy import FSDP2Strategy, decoder_layer_classes, make_strategy

    for name in ("gpu", "ddp", "fsdp"):
        from_dict(TrainerConfig, compose_cfg([f"trainer={name}"], tmp_path).trainer, "trainer")
    fsdp = from_dict(TrainerConfig, compose_cfg(["trainer=fsdp"], tmp_path).trainer, "trainer")
    s = make_strategy(fsdp.strategy, fsdp.strategy_kwargs)
    assert isinstance(s, FSDP2Strategy) and s.options.param_dtype == "bfloat16" and s.options.reduce_dtype == "float32"
    hf = build_policy(ModelConfig(name="hf", path=str(hf_path), lora_r=4 if HAS_PEFT else 0))
    assert decoder_layer_classes(hf.net) == {LlamaDecoderLayer}
    assert decoder_layer_classes(build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2)).net) == {Block}
    assert make_strategy("ddp", {}) == "ddp"
    with pytest.raises(ConfigError, match="trainer.strategy_kwargs.param_dtype='fp8' is invalid"):
        make_strategy("fsdp", {"param_dtype": "fp8"})


def test_rollout_batch_size_and_processes_change_no_sample(tmp_path):
    """Each row's noise is keyed by its global row: calls of 1, 3 or all 8 rows, and two processes of 4
    rows each, sample the same completions (temperature 1)."""
    from dataclasses import replace

    from diffusion_rl.training.module import DiffusionRLModule

    ids = torch.randint(10, 20, (8, 5), generator=torch.Generator().manual_seed(0))

    def gen(m, x, offset):
        return m.rollouts._generate(m.policy, x, torch.ones_like(x), offset, 0, None)[0]

    c = build(compose_cfg(["sampler.temperature=1.0"], tmp_path))
    outs = {}
    for size in (0, 1, 3):
        sampler = replace(c.sampler, rollout_batch_size=size)
        m = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, sampler, c.optim, 0)
        outs[size] = gen(m, ids, 0)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[3])
    assert torch.equal(outs[0], torch.cat([gen(m, ids[:4], 0), gen(m, ids[4:], 4)]))  # a second process's rows
    assert not torch.equal(outs[0], gen(m, ids, 1))  # the global row keys the noise
