"""The README's serving-engine block, run as written: its names (engines' arguments, the Rope, q, k
and v) bound here, then the caches checked against what the block's comments promise."""
from __future__ import annotations

import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

import rotary  # noqa: E402

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def serving_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "rope_store(rope, q, k, v, k_cache, v_cache, slots" in b]
    assert len(found) == 1, "the README's serving-engine block"
    return found[0]


def test_the_readme_serving_engine_block_runs_and_writes_what_it_says():
    rope = rotary.Rope.from_preset("llama-3.1-8b")
    g = torch.Generator().manual_seed(3)
    tokens, head_size = 3, 128
    inv_freq = torch.tensor(rope.inv_freq, dtype=torch.float64)
    angles = torch.arange(8192, dtype=torch.float64)[:, None] * inv_freq[None, :]
    names = {
        "torch": torch, "rope": rope, "head_size": head_size, "is_neox": True,
        "positions": torch.tensor([17, 4095, 3]),
        "mrope_positions": torch.tensor([[17, 4095, 3]] * 3),
        "query": torch.randn(tokens, 32 * head_size, generator=g).bfloat16(),
        "key": torch.randn(tokens, 8 * head_size, generator=g).bfloat16(),
        "cos_sin_cache": torch.cat((angles.cos(), angles.sin()), -1).float(),  # vLLM's [max_pos, rot_dim]
        "q": torch.randn(tokens, 32, head_size, generator=g).bfloat16(),
        "k": torch.randn(tokens, 8, head_size, generator=g).bfloat16(),
        "v": torch.randn(tokens, 8, head_size, generator=g).bfloat16(),
    }
    q_before = names["q"].clone()
    exec(compile(serving_block(), "README.md", "exec"), names)  # noqa: S102 - the project's own README
    k_cache, v_cache = names["k_cache"], names["v_cache"]
    written = [s for s in range(1024 * 16) if bool(k_cache.view(1024 * 16, -1)[s].view(torch.uint8).any())]
    assert written == [5 * 16 + 1, 9 * 16 + 15]  # the padding token's slot -1: nothing
    v_rows = v_cache.view(1024 * 16, 8, head_size)
    want_v = (names["v"][:2].float() / 0.05).to(torch.float8_e4m3fn)  # v / scale, one rounding
    assert torch.equal(v_rows[[81, 159]].view(torch.uint8), want_v.view(torch.uint8))
    assert not torch.equal(names["q"], q_before)  # q rotated in place, padding token's too
