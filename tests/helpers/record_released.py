"""Record what a released modelling file computes on a tiny checkpoint, for tests that run without it.

The released LLaDA2 code does not import under the transformers this project installs (it needs
``transformers.modeling_attn_mask_utils``, gone in 5.x), so its outputs are recorded once, in an
environment with the transformers it was released for, and stored as a fixture that
``tests/unit/models/test_llada2.py`` compares our class against::

    python -m venv /tmp/tf457 && /tmp/tf457/bin/pip install torch 'transformers==4.57.1' safetensors
    mkdir -p /tmp/code && git show <commit>:models/LLaDA2.0-mini/modeling_llada2_moe.py > /tmp/code/...
    /tmp/tf457/bin/python -m tests.helpers.record_released llada2 /tmp/code tests/fixtures/released_outputs/llada2.json

The checkpoint is :func:`~tests.helpers.released_layouts.write_checkpoint`'s (``real_ids=False``,
seed 0), rebuilt identically by the test; the inputs are fixed here and stored with the outputs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from tests.helpers.released_layouts import write_checkpoint

BLOCK = 8  # the block of the recorded mask: smaller than the release's 32 so that two blocks fit in 16 tokens


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (2, 16) and the released sampler's block-causal additive mask (2, 1, 16, 16)."""
    ids = torch.randint(0, 90, (2, 16), generator=torch.Generator().manual_seed(11))
    blk = torch.arange(16) // BLOCK
    allowed = (blk[None, :] <= blk[:, None])[None, None].expand(2, 1, 16, 16)
    return ids, torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


def record(arch: str, code: Path, out: Path) -> None:
    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(arch, Path(tmp) / arch, real_ids=False)
        for f in code.glob("*.py"):
            shutil.copy(f, folder / f.name)
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        config = get_class_from_dynamic_module(auto_map["AutoConfig"], str(folder)).from_pretrained(folder)
        config._attn_implementation = "sdpa"
        cls = get_class_from_dynamic_module(auto_map["AutoModelForCausalLM"], str(folder))
        model = cls.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
        routes: list[list] = []
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(lambda m, a, o: routes.append(o[0].view(2, 16, -1).tolist()))
        ids, mask = inputs()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(16)[None]).logits
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "about": f"logits and chosen experts of the released {arch} modelling code ({', '.join(sorted(p.name for p in code.glob('*.py')))}) "
                 f"under transformers {transformers.__version__}, torch {torch.__version__}, on write_checkpoint('{arch}', "
                 "real_ids=False) with the inputs of tests/helpers/record_released.py (block-causal mask, blocks of "
                 f"{BLOCK}); written by that script",
        "block": BLOCK, "ids": ids.tolist(), "experts": routes,
        "logits": [[[round(v, 7) for v in row] for row in seq] for seq in logits.float().tolist()],
    }))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arch")
    p.add_argument("code", type=Path, help="folder holding the released *.py files")
    p.add_argument("out", type=Path)
    a = p.parse_args()
    record(a.arch, a.code, a.out)
    print(f"wrote {a.out}", file=sys.stderr)
