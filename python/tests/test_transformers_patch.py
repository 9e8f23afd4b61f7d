"""rotary.transformers against transformers itself, on tiny random-initialised models built from
configs (no downloads): patched logits equal transformers' at short positions, the rotation at
positions near 10^6 is far closer to a float64 exact-angle reference, gradients match, LongRoPE and
dynamic NTK follow transformers' per-forward rules, Gemma 3 rotates each layer type with its own
RoPE, every model type's convention (partial rotary, interleaved pairs, DeepSeek's rotated slice and
output order, M-RoPE streams) is transformers', unpatch restores transformers bit for bit, the
patched model compiles, bad input is refused."""
import contextlib
import copy
import io
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import rotary  # noqa: E402
import rotary.transformers as rt  # noqa: E402
from transformers import (  # noqa: E402
    AttentionInterface,
    CohereConfig,
    DeepseekV3Config,
    Gemma3TextConfig,
    GemmaConfig,
    Glm4Config,
    GlmConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PhiConfig,
    Qwen2_5_VLConfig,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen3Config,
    Qwen3VLConfig,
)
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402

VOCAB = 128
FAR = 1_000_000  # positions near 10^6: transformers' float32 rotation is off by ~1% of max |q| there
# float32 logits of the patched model against transformers' at short positions, relative to the
# largest logit: both rotate with float32 angles correct to an ulp or two; the rest of the model is
# the same arithmetic.
LOGITS_REL = 1e-5
# float32 rotation against the float64 reference, relative to max |q|: rotary's angles are within
# 1 ulp of exact and the kernel rounds once (a few 2^-24); the layer's own float32 projections
# (inputs differ from the float64 model's by ~1e-7) dominate.
PATCHED_REL_ERR = 1e-5
# float32 rotated q and k of the patched model against transformers' at positions below ~40,
# relative to max |q|: float32 angles there are within ~40 * 2^-24 of exact, a few roundings more;
# another pairing, stream or channel order moves values by about |q|.
ROTATED_REL = 1e-5

COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
              num_hidden_layers=2, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _phi3_longrope():
    # Phi-3-mini-128k-style LongRoPE with partial rotary (Phi-4-mini: 0.75): rotary_dim 8 of 16.
    return Phi3Config(**COMMON, max_position_embeddings=256, original_max_position_embeddings=32,
                      partial_rotary_factor=0.5,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [3.0, 5.0, 9.0, 17.0]})


def _gemma3():
    # Gemma 3: sliding layers at theta 10^4, full layers at theta 10^6 with linear factor 8.
    return Gemma3TextConfig(**COMMON, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"],
                            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                             "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                "rope_theta": 1000000.0}})


def _deepseek_v3(interleave):
    # DeepSeek-V3's MLA: RoPE on the qk_rope_head_dim slice (16 of 32 here), YaRN with factor 40
    # from 4096 and an attention factor mscale/mscale_all_dim (1.057 here; 1 in the released config,
    # whose two are equal). Every layer dense (first_k_dense_replace): no expert routing to flip
    # between the float32 and float64 runs.
    return DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                            moe_intermediate_size=32, num_hidden_layers=2, vocab_size=VOCAB, n_routed_experts=4,
                            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=2,
                            q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                            v_head_dim=16, max_position_embeddings=163840, rope_interleave=interleave,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                             "original_max_position_embeddings": 4096, "beta_fast": 32,
                                             "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8})


# Qwen VL text decoders (head_dim 16: 8 pairs) with a one-block vision tower; image/video/vision
# start token ids inside the tiny vocabulary.
VL_TOKENS = dict(image_token_id=120, video_token_id=121, vision_start_token_id=122)
VL_VISION = dict(depth=1, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=2)


def _qwen_vl(config_class, vision, **rope):
    return config_class(text_config=dict(**COMMON, head_dim=16, rope_parameters={"rope_type": "default",
                                                                                "rope_theta": 10000.0, **rope}),
                        vision_config={**VL_VISION, **vision}, **VL_TOKENS)


CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON),
    "mistral": lambda: MistralConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16),
    "gemma": lambda: GemmaConfig(**COMMON, head_dim=16),
    "phi3-longrope": _phi3_longrope,
    "gemma3": _gemma3,
    "llama-dynamic": lambda: LlamaConfig(**COMMON, max_position_embeddings=32,
                                         rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                          "rope_theta": 10000.0}),
    # Phi-2: half pairing on the leading partial_rotary_factor of the head (0.4 of 80 there, 0.5 of
    # 16 here); its attention hands apply_rotary_pos_emb only that slice.
    "phi": lambda: PhiConfig(**COMMON, partial_rotary_factor=0.5),
    # Pythia: rotary_pct 0.25, half pairing on the leading quarter (4 of 16 channels).
    "gpt_neox": lambda: GPTNeoXConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                      num_hidden_layers=2, vocab_size=VOCAB, rotary_pct=0.25, bos_token_id=1,
                                      eos_token_id=2),
    # Command-R / Aya: interleaved pairs (repeat_interleave cos/sin) over the whole head.
    "cohere": lambda: CohereConfig(**COMMON),
    # GLM-4: interleaved pairs on the leading half of the head (partial_rotary_factor 0.5).
    "glm": lambda: GlmConfig(**COMMON, head_dim=16),
    "glm4": lambda: Glm4Config(**COMMON, head_dim=16),
    "deepseek_v3": lambda: _deepseek_v3(interleave=True),
    "deepseek_v3-half": lambda: _deepseek_v3(interleave=False),
    # M-RoPE: pairs [0, 2) read the temporal stream, [2, 5) the height, [5, 8) the width.
    "qwen2_vl": lambda: _qwen_vl(Qwen2VLConfig, dict(embed_dim=32, hidden_size=64, mlp_ratio=2),
                                 mrope_section=[2, 3, 3]),
    "qwen2_5_vl": lambda: _qwen_vl(Qwen2_5_VLConfig, dict(hidden_size=32, out_hidden_size=64, intermediate_size=64,
                                                          fullatt_block_indexes=[0]),
                                   mrope_section=[2, 3, 3]),
    # Interleaved M-RoPE: pairs 1, 4 read the height stream, 2, 5 the width, 0, 3, 6, 7 the temporal.
    "qwen3_vl": lambda: _qwen_vl(Qwen3VLConfig, dict(hidden_size=32, out_hidden_size=64, intermediate_size=64,
                                                     num_position_embeddings=16, deepstack_visual_indexes=[]),
                                 mrope_section=[4, 2, 2], mrope_interleaved=True),
}
NEW_TYPES = ["phi", "gpt_neox", "cohere", "glm", "glm4", "deepseek_v3", "deepseek_v3-half", "qwen2_vl",
             "qwen2_5_vl", "qwen3_vl"]
VL_TYPES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


def make_model(name, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    config = CONFIGS[name]()
    config.initializer_range = 0.2  # sharper attention than 0.02, so that logits feel the rotation
    if hasattr(config, "text_config"):
        config.text_config.initializer_range = 0.2
    auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    return auto.from_config(config, attn_implementation="eager").to(dtype).eval()


def decoder(model):
    """The module holding the model's (text) rotary embedding: model.model, model.gpt_neox,
    model.model.language_model."""
    return next(m for m in model.modules() if "rotary_emb" in m._modules)


def tokens(batch=2, seq=12, seed=1):
    # The VL models' image and video tokens are text here: no pixel values are given.
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def positions(seq, start=0, batch=1):
    return (torch.arange(seq) + start).expand(batch, seq)


def mrope_positions(seq, start=0, batch=1):
    """[3, batch, seq] with a different row per stream (t, h, w), all near start: a pair reading
    the wrong stream turns by a different angle."""
    i = torch.arange(seq)
    rows = torch.stack([start + i, start + (3 * i) // 2 + 5, start + 2 * i.flip(0) + 1])
    return rows[:, None].expand(3, batch, seq)


def positions_for(name, seq, start=0, batch=1):
    """Explicit position_ids: M-RoPE's three streams for the VL models, else one row per batch."""
    return (mrope_positions if name in VL_TYPES else positions)(seq, start, batch)


# ---- Seeing the rotated q and k: transformers' own attention-function hook --------------------------

_captured = None


def _spy_attention(module, query, key, value, attention_mask, **kwargs):
    if _captured is not None:
        _captured.append((module.layer_idx, query.detach().clone(), key.detach().clone()))
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("rotary_test_spy", _spy_attention)


@contextlib.contextmanager
def capture(*models):
    """Records each attention layer's rotated (layer_idx, q, k) while the block runs."""
    global _captured
    saved = [m.config._attn_implementation for m in models]
    for m in models:
        m.set_attn_implementation("rotary_test_spy")
    _captured = []
    try:
        yield _captured
    finally:
        _captured = None
        for m, s in zip(models, saved):
            m.set_attn_implementation(s)


def rotated(model, ids, position_ids):
    """({layer_idx: (rotated q, rotated k)}, logits) of one forward."""
    with capture(model) as seen, torch.no_grad():
        logits = model(ids, position_ids=position_ids).logits
    return {layer: (q, k) for layer, q, k in seen}, logits


# ---- A float64 exact-angle reference, written from transformers' formulas here ----------------------

def exact_inv_freq(config, layer_type, seq_len):
    """(inv_freq, attention_factor) in float64 from the config, by the formulas of
    transformers' modeling_rope_utils.py (DESIGN.md §2)."""
    params = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    r = int(head_dim * params.get("partial_rotary_factor", 1.0))
    base, kind = params["rope_theta"], params["rope_type"]
    exponent = np.arange(0, r, 2, dtype=np.float64) / r
    if kind == "dynamic" and seq_len > config.max_position_embeddings:
        factor = params["factor"]
        base *= (factor * seq_len / config.max_position_embeddings - (factor - 1)) ** (r / (r - 2))
    inv_freq = base ** -exponent
    if kind == "linear":
        return inv_freq / params["factor"], 1.0
    if kind == "longrope":
        original = params["original_max_position_embeddings"]
        ext = params["long_factor"] if seq_len > original else params["short_factor"]
        scale = config.max_position_embeddings / original
        return inv_freq / np.asarray(ext, dtype=np.float64), math.sqrt(1 + math.log(scale) / math.log(original))
    if kind == "yarn":
        return yarn_inv_freq(params, r, base, inv_freq)
    return inv_freq, 1.0


def yarn_inv_freq(params, r, base, inv_freq):
    """YaRN (transformers' _compute_yarn_parameters, truncate=True): the pairs below the beta_fast
    correction dimension keep inv_freq, those above beta_slow's take inv_freq / factor, a linear
    ramp between; the attention factor from mscale and mscale_all_dim."""
    factor, original = params["factor"], params["original_max_position_embeddings"]

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    def correction_dim(rotations):
        return r * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
                 else get_mscale(factor))
    low = max(math.floor(correction_dim(params.get("beta_fast") or 32)), 0)
    high = min(math.ceil(correction_dim(params.get("beta_slow") or 1)), r - 1)
    ramp = np.clip((np.arange(r // 2, dtype=np.float64) - low) / max(high - low, 0.001), 0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp), attention


def pair_streams(config):
    """The M-RoPE position stream of each pair, from the formulas (DESIGN.md): contiguous
    mrope_section blocks, or Qwen3-VL's interleave (stream 1 where j % 3 == 1 and j < 3 * s[1],
    2 where j % 3 == 2 and j < 3 * s[2], else 0); None for one stream."""
    sections = config.rope_parameters.get("mrope_section")
    if sections is None:
        return None
    j = np.arange(sum(sections))
    if config.model_type == "qwen3_vl_text":
        return np.where((j % 3 == 1) & (j < 3 * sections[1]), 1, np.where((j % 3 == 2) & (j < 3 * sections[2]), 2, 0))
    return np.searchsorted(np.cumsum(sections), j, side="right")


class Float64Rope(torch.nn.Module):
    """transformers' rotary embedding with float64 positions and float64 frequencies, its cos/sin
    in the model's form: ``cat((a, a), -1)``, or each value twice (Cohere's repeat_interleave);
    M-RoPE pairs from their own stream of ``position_ids [3, batch, seq]``."""

    def __init__(self, config, seq_len):
        super().__init__()
        types = sorted(set(config.layer_types)) if isinstance(config, Gemma3TextConfig) else [None]
        self.freqs = {t: exact_inv_freq(config, t, seq_len) for t in types}
        self.repeated = config.model_type == "cohere"
        self.streams = pair_streams(config)

    def forward(self, x, position_ids, layer_type=None):
        inv_freq, attention_factor = self.freqs[layer_type]
        if self.streams is None:
            angle = position_ids.double()[..., None] * torch.from_numpy(inv_freq)
        else:  # [3, batch, seq] -> [batch, seq, pairs], pair j from its stream
            angle = position_ids.double()[torch.from_numpy(self.streams)].permute(1, 2, 0) * torch.from_numpy(inv_freq)
        emb = torch.repeat_interleave(angle, 2, dim=-1) if self.repeated else torch.cat((angle, angle), -1)
        return emb.cos() * attention_factor, emb.sin() * attention_factor


def float64_reference(model, seq_len):
    ref = copy.deepcopy(model).double()
    decoder(ref).rotary_emb = Float64Rope(ref.config.get_text_config(), seq_len)
    return ref


def assert_logits_close(got, want):
    torch.testing.assert_close(got, want, rtol=0, atol=LOGITS_REL * float(want.abs().max()))


def rel_err(got, want):
    return float((got.double() - want).abs().max() / want.abs().max())


# ---- Short positions: the patched model is transformers' model --------------------------------------

@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_unpatched_at_short_positions(name):
    # The rotated q and k themselves too: their channel order (DeepSeek's interleave output) does
    # not show in the logits. The VL models take explicit [3, batch, seq] positions, a different
    # row per stream: a pair reading the wrong stream would move both far beyond the tolerance.
    model = make_model(name)
    ids = tokens()
    pos = positions_for(name, 12, batch=2) if name in VL_TYPES else None
    want, want_logits = rotated(model, ids, pos)
    rt.patch(model)
    assert rt.is_patched(model) and isinstance(decoder(model).rotary_emb, rt.ExactRotaryEmbedding)
    got, got_logits = rotated(model, ids, pos)
    rt.unpatch(model)
    assert_logits_close(got_logits, want_logits)
    for layer, (q, k) in want.items():
        for which, a, b in (("q", got[layer][0], q), ("k", got[layer][1], k)):
            atol = ROTATED_REL * float(b.abs().max())
            torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=f"layer {layer} rotated {which}")


@pytest.mark.parametrize("name", ["llama", "phi3-longrope", "gemma3", "cohere", "deepseek_v3", "qwen2_vl"])
def test_training_step_gradients_match_unpatched(name):
    model = make_model(name).train()
    patched = rt.patch(copy.deepcopy(model))
    ids = tokens()
    pos = positions_for(name, 12, batch=2)
    for m in (model, patched):
        m(ids, labels=ids, position_ids=pos).loss.backward()
    grads = dict(model.named_parameters())
    for pname, p in patched.named_parameters():  # a VL model's vision tower gets none (no pixels)
        torch.testing.assert_close(p.grad, grads[pname].grad, rtol=1e-4, atol=1e-6, msg=pname)
    assert sum(p.grad.abs().sum() for p in patched.parameters() if p.grad is not None) > 0
    rt.unpatch(patched)


def test_generate_matches_unpatched():
    # Prefill then decode steps with the KV cache: position_ids [batch, 1] per step.
    model = make_model("qwen2")
    ids = tokens(batch=2, seq=6)
    want = model.generate(ids, max_new_tokens=6, do_sample=False)
    rt.patch(model)
    got = model.generate(ids, max_new_tokens=6, do_sample=False)
    rt.unpatch(model)
    assert torch.equal(got, want)


# ---- Positions near 10^6: exact angles ----------------------------------------------------------------

def far_errors(name, seq=8):
    """(per layer: (patched, unpatched) error of the rotated q and k, (patched, unpatched) error of
    the logits) of float32 models against the float64 exact-angle reference, at positions FAR ..
    FAR + seq - 1; errors relative to the reference's largest value."""
    model = make_model(name)
    ids, pos = tokens(batch=1, seq=seq), positions_for(name, seq, FAR)
    want, want_logits = rotated(float64_reference(model, FAR + seq), ids, pos)
    plain, plain_logits = rotated(model, ids, pos)
    got, got_logits = rotated(rt.patch(model), ids, pos)
    rt.unpatch(model)
    layers = {layer: (max(rel_err(got[layer][0], q), rel_err(got[layer][1], k)),
                      max(rel_err(plain[layer][0], q), rel_err(plain[layer][1], k)))
              for layer, (q, k) in want.items()}
    return layers, (rel_err(got_logits, want_logits), rel_err(plain_logits, want_logits))


@pytest.mark.parametrize("name", CONFIGS)
def test_far_positions_closer_to_float64_reference(name):
    layers, (patched_logits, unpatched_logits) = far_errors(name)
    patched, unpatched = layers[0]  # layer 0: the same inputs in both float32 runs
    print(f"{name}: at ~10^6, error / max of the float64 reference: rotated q/k patched {patched:.2e}, "
          f"transformers {unpatched:.2e}; logits patched {patched_logits:.2e}, transformers {unpatched_logits:.2e}")
    assert patched < PATCHED_REL_ERR
    assert patched < unpatched / 100
    for layer, (err, _) in layers.items():
        assert err < PATCHED_REL_ERR, (layer, err)
    assert patched_logits < unpatched_logits / 10


def test_gemma3_rotates_each_layer_type_with_its_rope():
    model = rt.patch(make_model("gemma3"))
    ropes = model.model.rotary_emb.ropes()
    assert set(ropes) == {"sliding_attention", "full_attention"}
    assert (ropes["sliding_attention"].base, ropes["sliding_attention"].schedule) == (10000.0, "default")
    assert (ropes["full_attention"].base, ropes["full_attention"].schedule) == (1e6, "linear")
    # Layer 0 is sliding, layer 1 full: each is checked against the float64 rotation of its own
    # type in test_far_positions_closer_to_float64_reference; the other type's angles are far off.
    ids, pos = tokens(batch=1, seq=4), positions(4, FAR)
    got, _ = rotated(model, ids, pos)
    rt.unpatch(model)
    ref = float64_reference(model, FAR + 4)
    want, _ = rotated(ref, ids, pos)
    swapped = Float64Rope(ref.config, FAR + 4)
    swapped.freqs = {"sliding_attention": swapped.freqs["full_attention"],
                     "full_attention": swapped.freqs["sliding_attention"]}
    ref.model.rotary_emb = swapped
    wrong, _ = rotated(ref, ids, pos)
    for layer in (0, 1):
        assert rel_err(got[layer][0], want[layer][0]) < PATCHED_REL_ERR
        assert rel_err(got[layer][0], wrong[layer][0]) > 0.1


def assert_rounded_once(got, x, cos, sin, pairing="half"):
    """got (bf16) is the rotation of x by cos/sin (float64, broadcast over x; halves, or each value
    repeated for interleaved pairs) computed exactly and rounded once: within half a bf16 ulp, plus
    the kernel's float32 arithmetic (2^-23 (|a| + |b|) per pair, DESIGN.md §3)."""
    x, half = x.double(), x.shape[-1] // 2
    if pairing == "half":
        rotated_half = torch.cat((-x[..., half:], x[..., :half]), -1)
        pair = x[..., :half].abs() + x[..., half:].abs()
        slack = torch.cat((pair, pair), -1)
    else:  # pairs (x[2i], x[2i+1]): Cohere's rotate_half
        rotated_half = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
        slack = torch.repeat_interleave(x[..., 0::2].abs() + x[..., 1::2].abs(), 2, dim=-1)
    exact = x * cos + rotated_half * sin
    ulp = torch.finfo(torch.bfloat16).eps * 2.0 ** torch.floor(torch.log2(exact.abs().clamp_min(1e-30)))
    assert got.dtype == torch.bfloat16
    assert torch.all((got.double() - exact).abs() <= 0.5 * ulp + 2.0 ** -23 * slack)


@pytest.mark.parametrize("name", ["llama", "cohere"])
def test_bf16_rotates_with_float32_angles_rounded_once(name):
    # transformers casts cos/sin to bf16 and rounds every product and sum in bf16 (Cohere: the
    # products and sums in float32, from bf16 cos/sin): most of its values miss the bound of
    # assert_rounded_once. Cohere's pairs are interleaved.
    model = make_model(name, dtype=torch.bfloat16)
    ids, pos = tokens(batch=1, seq=8), positions(8, 1000)
    with capture(model) as seen, torch.no_grad():
        rt.patch(model)(ids, position_ids=pos)
    rt.unpatch(model)
    inv_freq, _ = exact_inv_freq(model.config, None, 8)
    angle = pos.double()[0, :, None] * torch.from_numpy(inv_freq)
    if name == "cohere":
        cos, sin = torch.repeat_interleave(angle.cos(), 2, -1), torch.repeat_interleave(angle.sin(), 2, -1)
    else:
        cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    with torch.no_grad():
        layer0 = model.model.layers[0]
        x = layer0.input_layernorm(model.model.embed_tokens(ids))
        q = layer0.self_attn.q_proj(x).view(1, 8, -1, 16).transpose(1, 2)
    assert_rounded_once(seen[0][1], q, cos, sin, "interleaved" if name == "cohere" else "half")


# ---- transformers' per-forward schedules ----------------------------------------------------------

def test_phi3_longrope_switches_where_transformers_does():
    # seq_len = max(position_ids) + 1 picks the factors: short up to original_max_position_embeddings
    # (32), long beyond, decided afresh every forward, whatever the number of tokens.
    model = make_model("phi3-longrope")
    patched = rt.patch(copy.deepcopy(model))
    emb = patched.model.rotary_emb
    ids = tokens(batch=1, seq=4)
    logits = {}
    for last in (31, 32, 33, 20, 100, 31):  # seq_len 32: short; 33: long
        pos = positions(4, last - 3)
        with torch.no_grad():
            want, got = model(ids, position_ids=pos).logits, patched(ids, position_ids=pos).logits
        assert_logits_close(got, want)
        assert emb.ropes()[None] is (emb.schedules[None].long if last + 1 > 32 else emb.schedules[None].short)
        logits[last] = got
    # Positions 29..32 with the long factors differ from 28..31 with the short ones by more than
    # the shift: the same tokens at 30..33 are compared in both runs' overlap.
    with torch.no_grad():
        short = patched(ids, position_ids=positions(4, 29)).logits  # seq_len 33: long
        model_short = model(ids, position_ids=positions(4, 29)).logits
    assert_logits_close(short, model_short)
    assert not torch.allclose(logits[32], logits[31], atol=1e-3)
    rt.unpatch(patched)


def test_dynamic_ntk_follows_transformers_state():
    # max_position_embeddings 32: 40 grows, 36 keeps 40's frequencies (not 36's), 20 resets, 50
    # grows again; transformers' module and rotary's step in lockstep.
    model = make_model("llama-dynamic")
    patched = rt.patch(copy.deepcopy(model))
    fresh = rt.patch(copy.deepcopy(model))
    for seq in (40, 36, 20, 50, 33):
        ids = tokens(batch=1, seq=seq)
        with torch.no_grad():
            want, got = model(ids).logits, patched(ids).logits
        assert_logits_close(got, want)
        if seq == 36:  # the state matters: a model that never saw 40 rotates 36 differently
            with torch.no_grad():
                assert not torch.allclose(fresh(ids).logits, got, atol=1e-4)
    assert patched.model.rotary_emb.schedules[None].cached == 50 == model.model.rotary_emb.max_seq_len_cached
    rt.unpatch(patched)
    rt.unpatch(fresh)


# ---- patch / unpatch ----------------------------------------------------------------------------------

def _modeling(name):
    import importlib
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


APPLY_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")  # DeepSeek-V3 has both


@pytest.mark.parametrize("name", ["llama"] + NEW_TYPES)
def test_unpatch_restores_transformers_exactly(name):
    model = make_model(name)
    original_emb = decoder(model).rotary_emb
    modeling = sys.modules[type(original_emb).__module__]
    originals = {f: getattr(modeling, f) for f in APPLY_FUNCTIONS if hasattr(modeling, f)}
    # Near 5000 float32 angles are off by ~1e-4 rad: the patched logits differ from transformers'
    # (and rotary's table stays small: the first forward near 10^6 fills a million rows, ~1 s).
    ids, pos = tokens(), positions_for(name, 12, 5000, batch=2)
    with torch.no_grad():
        before = model(ids, position_ids=pos).logits
        rt.patch(model)
        assert all(getattr(modeling, f) is not fn for f, fn in originals.items())
        assert not torch.equal(model(ids, position_ids=pos).logits, before)
        rt.unpatch(model)
        after = model(ids, position_ids=pos).logits
    assert torch.equal(after, before)
    assert decoder(model).rotary_emb is original_emb and not rt.is_patched(model)
    assert all(getattr(modeling, f) is fn for f, fn in originals.items())


def test_swap_is_counted_and_leaves_unpatched_models_bit_identical():
    a, b, plain = make_model("mistral", seed=1), make_model("mistral", seed=2), make_model("mistral", seed=3)
    original_fn = _modeling("mistral").apply_rotary_pos_emb
    ids, pos = tokens(), positions(12, FAR)
    with torch.no_grad():
        plain_before = plain(ids, position_ids=pos).logits
        rt.patch(a)
        rt.patch(a)  # patching a patched model does nothing
        rt.patch(b)
        assert torch.equal(plain(ids, position_ids=pos).logits, plain_before)  # swapped, but not patched
        rt.unpatch(a)
        assert _modeling("mistral").apply_rotary_pos_emb is not original_fn  # b is still patched
        b_logits = b(ids, position_ids=pos).logits
        rt.unpatch(b)
        rt.unpatch(b)  # unpatching an unpatched model does nothing
        assert _modeling("mistral").apply_rotary_pos_emb is original_fn
        assert not torch.equal(b(ids, position_ids=pos).logits, b_logits)


def test_copies_of_a_patched_model_stay_patched():
    model = rt.patch(make_model("qwen3"))
    ids, pos = tokens(), positions(12, FAR)
    with torch.no_grad():
        want = model(ids, position_ids=pos).logits
        copied = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        rt.unpatch(model)  # the copies still count: the swap stays
        for other in (copied, loaded):
            assert rt.is_patched(other)
            assert torch.equal(other(ids, position_ids=pos).logits, want)
    rt.unpatch(copied)
    rt.unpatch(loaded)
    assert getattr(_modeling("qwen3").apply_rotary_pos_emb, "_rotary_original", None) is None


# DeepSeek-V3 with rope_interleave: YaRN on the q_pe/k_pe slice, the interleave function's
# output order (a torch.cat of strided slices after the operator).
@pytest.mark.parametrize("name", ["llama", "deepseek_v3"])
def test_compiled_patched_model_traces_rotary_operator_without_graph_break(name):
    model = rt.patch(make_model(name)).train()
    reference = rt.unpatch(copy.deepcopy(model))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g))(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    ids = tokens()
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    reference(ids, labels=ids).loss.backward()
    assert len(graphs) == 1
    assert any("rotary.rope" in str(node.target) for node in graphs[0].graph.nodes)
    torch.testing.assert_close(loss, reference(ids, labels=ids).loss, rtol=1e-5, atol=1e-6)
    for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=pname)
    rt.unpatch(model)
    torch._dynamo.reset()


def test_compiled_longrope_model_switches_without_graph_break():
    # Under torch.compile LongRoPE rotates with both factor sets and picks with torch.where, as
    # transformers picks its inv_freq: one graph serves short and long sequences.
    model = rt.patch(make_model("phi3-longrope"))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    ids = tokens(batch=1, seq=4)
    with torch.no_grad():
        for last in (31, 32, 40):  # seq_len 32: short, 33 and 41: long
            pos = positions(4, last - 3)
            assert torch.equal(compiled(ids, position_ids=pos).logits, model(ids, position_ids=pos).logits)
    assert len(graphs) == 1
    rt.unpatch(model)
    torch._dynamo.reset()


def test_compiled_mrope_model_takes_three_stream_positions_without_graph_break():
    # Qwen2-VL's [3, batch, seq] position_ids reach rotary's operator as one tensor: one graph for
    # any positions of that shape.
    model = rt.patch(make_model("qwen2_vl"))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    ids = tokens()
    with torch.no_grad():
        for start in (0, 5000):
            pos = mrope_positions(12, start, batch=2)
            assert torch.equal(compiled(ids, position_ids=pos).logits, model(ids, position_ids=pos).logits)
    assert len(graphs) == 1
    assert any("rotary.rope" in str(node.target) for node in graphs[0].graph.nodes)
    rt.unpatch(model)
    torch._dynamo.reset()


# ---- apply_rotary_pos_emb: transformers' signature ---------------------------------------------------

def _hf_apply(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' own formula, partial rotary included (Phi-3's function)."""
    fn = _modeling("phi3").apply_rotary_pos_emb
    return getattr(fn, "_rotary_original", fn)(q, k, cos, sin, unsqueeze_dim)


def _cos_sin(batch, seq, width, dtype, start=0):
    inv_freq = 10000.0 ** -(torch.arange(0, width, 2, dtype=torch.float64) / width)
    angle = (torch.arange(seq, dtype=torch.float64) + start)[:, None] * inv_freq
    emb = torch.cat((angle, angle), -1).expand(batch, seq, width)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("width", [16, 8])  # full and partial rotary (Phi-3's transformers formula)
def test_apply_rotary_pos_emb_is_transformers_formula(unsqueeze_dim, width):
    g = torch.Generator().manual_seed(5)
    shape_q, shape_k = ((2, 4, 6, 16), (2, 2, 6, 16)) if unsqueeze_dim == 1 else ((2, 6, 4, 16), (2, 6, 2, 16))
    q = torch.randn(shape_q, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(shape_k, dtype=torch.float64, generator=g, requires_grad=True)
    cos, sin = _cos_sin(1, 6, width, torch.float64, start=100)
    q0, k0 = q.detach().clone(), k.detach().clone()
    got = rt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    want = _hf_apply(q, k, cos, sin, unsqueeze_dim)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)
    assert torch.equal(q.detach(), q0) and torch.equal(k.detach(), k0)  # out of place
    weights = [torch.randn(t.shape, dtype=torch.float64, generator=g) for t in got]
    grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(got, weights)), (q, k))
    want_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(want, weights)), (q, k))
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)
    first = slice(0, 1)
    one_head = (first, first) if unsqueeze_dim == 1 else (first, slice(None), first)  # batch 0, head 0
    assert torch.autograd.gradcheck(lambda a, b: rt.apply_rotary_pos_emb(a, b, cos, sin, unsqueeze_dim),
                                    (q[one_head], k[one_head]))


def test_apply_rotary_pos_emb_compiles_without_graph_break():
    # A head_dim/rotary_dim pair seen for the first time inside the compiled function.
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 6, 4, 24, generator=g), torch.randn(2, 6, 2, 24, generator=g)
    cos, sin = _cos_sin(2, 6, 12, torch.float32, start=3)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: rt.apply_rotary_pos_emb(*a, unsqueeze_dim=2), backend="eager",
                             fullgraph=True)
    for a, b in zip(compiled(q, k, cos, sin), rt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)):
        assert torch.equal(a, b)
    torch._dynamo.reset()


def test_apply_rotary_pos_emb_bf16_with_float32_angles():
    # A bf16 q and k rotated by the caller's float32 cos/sin (one row per batch): float32
    # arithmetic, one rounding; transformers would first round cos/sin to q's dtype.
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 5, 16, generator=g).bfloat16()
    k = torch.randn(2, 2, 5, 16, generator=g).bfloat16()
    cos, sin = _cos_sin(2, 5, 16, torch.float32, start=70000)
    got_q, got_k = rt.apply_rotary_pos_emb(q, k, cos, sin)
    assert_rounded_once(got_q, q, cos.double()[:, None], sin.double()[:, None])
    assert_rounded_once(got_k, k, cos.double()[:, None], sin.double()[:, None])


# ---- Bad input ----------------------------------------------------------------------------------------

def test_patch_refuses_what_it_cannot_patch():
    with pytest.raises(TypeError, match="model must be a transformers model .* got int"):
        rt.patch(42)
    with pytest.raises(TypeError, match="model must be a transformers model .* got a Linear without one"):
        rt.patch(torch.nn.Linear(2, 2))
    gpt2_config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
    gpt2 = AutoModelForCausalLM.from_config(gpt2_config)
    with pytest.raises(ValueError, match="model_type='gpt2' is not supported .* supported: cohere, deepseek_v3, "
                                         "gemma, gemma3, gemma3_text, glm, glm4, gpt_neox, llama, mistral, phi, "
                                         "phi3, qwen2, qwen2_5_vl, qwen2_5_vl_text, qwen2_vl, qwen2_vl_text, qwen3, "
                                         "qwen3_vl, qwen3_vl_text$"):
        rt.patch(gpt2)
    with pytest.raises(TypeError, match="got NoneType"):
        rt.unpatch(None)


def test_patch_refuses_a_config_rotary_reads_differently_and_changes_nothing():
    model = make_model("llama")
    emb = model.model.rotary_emb
    emb.rope_type = "linear"  # transformers' module now disagrees with its config's default RoPE
    model.config.rope_parameters["factor"] = 4.0
    with pytest.raises(ValueError, match=r"model_type=llama: rotary's inv_freq differs from transformers'"):
        rt.patch(model)
    assert model.model.rotary_emb is emb and not rt.is_patched(model)
    assert getattr(_modeling("llama").apply_rotary_pos_emb, "_rotary_original", None) is None


# rotary reading a config with another convention than the model's code (the config edited
# before rotary reads it): the frequencies agree, the probe rotation does not.
MISREAD = {
    "cohere": (lambda c: c | {"model_type": "llama"}, r"pairing=half.* unlike transformers' apply_rotary_pos_emb"),
    "glm": (lambda c: c | {"model_type": "phi3"}, r"pairing=half.* unlike transformers' apply_rotary_pos_emb"),
    "deepseek_v3": (lambda c: c | {"rope_interleave": False},
                    r"pairing=half.* unlike transformers' apply_rotary_pos_emb_interleave"),
    "qwen2_vl": (lambda c: c | {"rope_parameters": c["rope_parameters"] | {"mrope_section": [3, 3, 2]}},
                 r"streams=3\) rotates a probe unlike"),
    "qwen3_vl": (lambda c: c | {"model_type": "qwen2_5_vl_text", "rope_parameters": {
        key: value for key, value in c["rope_parameters"].items() if key != "mrope_interleaved"}},
                 r"streams=3\) rotates a probe unlike"),  # contiguous sections [4, 2, 2]
}


@pytest.mark.parametrize("name", MISREAD)
def test_patch_refuses_a_convention_transformers_does_not_use(name, monkeypatch):
    edit, needle = MISREAD[name]
    resolve = rotary.Rope.from_hf_config.__func__
    monkeypatch.setattr(rotary.Rope, "from_hf_config",
                        classmethod(lambda cls, config, *args, **kwargs: resolve(cls, edit(config), *args, **kwargs)))
    model = make_model(name)
    emb = decoder(model).rotary_emb
    modeling = sys.modules[type(emb).__module__]
    with pytest.raises(ValueError, match=needle):
        rt.patch(model)
    assert decoder(model).rotary_emb is emb and not rt.is_patched(model)
    assert all(getattr(getattr(modeling, f), "_rotary_original", None) is None
               for f in APPLY_FUNCTIONS if hasattr(modeling, f))


@pytest.mark.parametrize("name", VL_TYPES)
def test_vl_text_model_patches_on_its_own(name):
    # The text decoder alone (model_type "qwen2_vl_text" ...), as a language model uses it.
    text = make_model(name).model.language_model
    assert text.config.model_type == f"{name}_text"
    emb, ids, pos = text.rotary_emb, tokens(), mrope_positions(12, 300, batch=2)
    with torch.no_grad():
        want = text(ids, position_ids=pos).last_hidden_state
        got = rt.patch(text)(ids, position_ids=pos).last_hidden_state
    assert isinstance(text.rotary_emb, rt.ExactRotaryEmbedding)
    rt.unpatch(text)
    assert text.rotary_emb is emb and not rt.is_patched(text)
    assert_logits_close(got, want)


def test_apply_rotary_pos_emb_refuses_bad_arguments():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    q0 = q.clone()
    cases = [
        (dict(unsqueeze_dim=3), ValueError, "unsqueeze_dim=3 must be 1"),
        (dict(unsqueeze_dim=1.0), TypeError, "unsqueeze_dim must be an int, got float"),
        (dict(q=q[0]), ValueError, r"q must have 4 dimensions, got shape \(2, 3, 8\)"),
        (dict(cos=cos[0], sin=sin[0]), ValueError, r"cos must have 3 dimensions"),
        (dict(cos=_cos_sin(1, 3, 10, torch.float32)[0], sin=_cos_sin(1, 3, 10, torch.float32)[1]), ValueError,
         "cos width=10 .* <= head_dim=8"),
        (dict(cos=cos.clone().requires_grad_()), ValueError, "cos requires grad"),
        (dict(sin=[0.0]), TypeError, "sin must be a torch.Tensor, got list"),
        # Each error names the argument and shows its shape as passed (the kernel's own words would
        # name "angles", and k in [batch, seq, heads, head_dim] order).
        (dict(cos=_cos_sin(1, 4, 8, torch.float32)[0], sin=_cos_sin(1, 4, 8, torch.float32)[1]), ValueError,
         r"cos shape \(1, 4, 8\) must be \[batch=1 or 1, seq=3, rotary_dim\] for q shape \(1, 2, 3, 8\)"),
        (dict(cos=_cos_sin(2, 3, 8, torch.float32)[0], sin=_cos_sin(2, 3, 8, torch.float32)[1]), ValueError,
         r"cos shape \(2, 3, 8\) must be \[batch=1 or 1, seq=3"),
        (dict(sin=_cos_sin(1, 4, 8, torch.float32)[1]), ValueError, r"sin shape \(1, 4, 8\) must equal cos shape"),
        (dict(sin=_cos_sin(1, 3, 6, torch.float32)[1]), ValueError, r"sin shape \(1, 3, 6\) must equal cos shape"),
        (dict(k=torch.randn(1, 2, 4, 8)), ValueError,
         r"k shape \(1, 2, 4, 8\) must match q shape \(1, 2, 3, 8\) in batch \(dim 0\), seq \(dim 2 with "
         r"unsqueeze_dim=1\)"),
        (dict(k=torch.randn(1, 2, 3, 6)), ValueError, r"k shape \(1, 2, 3, 6\) must match q shape .* head_dim"),
        (dict(q=torch.randn(1, 3, 2, 8), k=torch.randn(1, 4, 2, 8), unsqueeze_dim=2), ValueError,
         r"k shape \(1, 4, 2, 8\) must match q shape \(1, 3, 2, 8\) in batch \(dim 0\), seq \(dim 1 with "
         r"unsqueeze_dim=2\)"),
        (dict(q=torch.randn(1, 2, 3, 8), k=torch.randn(1, 2, 1, 8), unsqueeze_dim=2), ValueError,
         r"cos shape \(1, 3, 8\) must be \[batch=1 or 1, seq=2, rotary_dim\] for q shape \(1, 2, 3, 8\) with "
         r"unsqueeze_dim=2"),
        (dict(sin=sin.double()), TypeError, "cos and sin must have the same dtype"),
        (dict(cos=cos.int(), sin=sin.int()), TypeError, "cos dtype must be float32, float64, float16 or bfloat16"),
        (dict(k=k.double()), ValueError, "k.dtype=f64 differs from q.dtype=f32"),
    ]
    for change, kind, needle in cases:
        args = dict(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=1) | change
        with pytest.raises(kind, match=needle) as caught:
            rt.apply_rotary_pos_emb(**args)
        assert "angles" not in str(caught.value)
    assert torch.equal(q, q0)


def test_rotary_torch_exports_the_transformers_signature():
    # The issue names it rotary.torch.apply_rotary_pos_emb; it is the same function object.
    import rotary.torch
    import rotary.transformers

    assert rotary.torch.apply_rotary_pos_emb is rotary.transformers.apply_rotary_pos_emb
    assert "apply_rotary_pos_emb" in rotary.torch.__all__
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        rotary.torch.nonexistent  # noqa: B018
