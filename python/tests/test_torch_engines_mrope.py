"""M-RoPE through ``rotary.torch.rotary_embedding(..., mrope_section=..., mrope_interleaved=...)``
against vLLM's ``MRotaryEmbedding.forward_native`` (``vllm/model_executor/layers/rotary_embedding/
mrope.py``, with its ``apply_interleaved_rope``; the rotation of ``ApplyRotaryEmb.forward_native``),
written out here in plain torch (nothing is imported from vLLM):

- ``cos, sin = cos_sin_cache[positions].chunk(2, -1)``: ``[3, tokens, rotary_dim/2]`` each;
- chunked: ``torch.cat([m[i] for i, m in enumerate(cos.split(mrope_section, -1))], -1)``;
- interleaved: height where ``j % 3 == 1 and j < 3 * mrope_section[1]``, width where ``j % 3 == 2 and
  j < 3 * mrope_section[2]``, temporal elsewhere (``torch.where`` over the pair index j);
- then the 1-D rotation, in the data's dtype: ``x1 * cos - x2 * sin``, ``x2 * cos + x1 * sin`` with
  ``(x1, x2)`` the halves (``is_neox``) or the even/odd channels (not ``is_neox``).

Bits:
- exactly vLLM's formula, in every dtype, where no operation rounds (values of a few bits);
- exactly rotary's documented rounding (float32: the larger product fused, the smaller rounded first)
  on the per-token table, emulated by ``test_torch_engines.rotary_contract``;
- float32 against vLLM's formula (each product rounded, then the sum): not bit for bit (rotary fuses
  the larger product; about a third of the values differ), so compared within 4 units of 2^-24
  (|x1| + |x2|) (each is within 2 of the exact rotation; 1.97 measured), and within 1 ulp of the
  result wherever the result is not a cancellation (|result| >= (|x1| + |x2|) / 4); in a
  cancellation an ulp of the small result means nothing (some 10^5 of them measured).

And against transformers' Qwen2-VL and Qwen3-VL rotary embeddings (``recomposition_frequencies``
then ``apply_rotary_pos_emb``) when they import.
"""
import pytest
import torch

import rotary
from rotary import _rotary
from rotary.torch import rotary_embedding
from test_torch_engines import UNIT, _call_and_check_untouched, exact_case, rotary_contract, vllm_cos_sin_cache

OP = torch.ops.rotary.rotary_embedding.default
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
HAVE_GPU = torch.cuda.is_available() and _rotary.cuda
gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device and rotary built with CUDA kernels")
STREAMS = 3


# ---- vLLM's MRotaryEmbedding.forward_native, written out --------------------------------------------

def vllm_interleaved(x, mrope_section):
    """vLLM's ``apply_interleaved_rope``: ``x`` [3, tokens, rotary_dim/2] -> [tokens, rotary_dim/2]."""
    j = torch.arange(x.shape[-1])
    is_height = (j % 3 == 1) & (j < mrope_section[1] * 3)
    is_width = (j % 3 == 2) & (j < mrope_section[2] * 3)
    return torch.where(is_width, x[2], torch.where(is_height, x[1], x[0]))


def vllm_chunked(x, mrope_section):
    return torch.cat([m[i] for i, m in enumerate(x.split(list(mrope_section), dim=-1))], dim=-1)


def vllm_mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved):
    """``[tokens, rotary_dim/2]`` cos and sin as vLLM's ``forward_native`` selects them."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    if positions.ndim == 2:
        select = vllm_interleaved if interleaved else vllm_chunked
        cos, sin = select(cos, mrope_section), select(sin, mrope_section)
    return cos, sin


def vllm_rotate(x, cos, sin, is_neox):
    """``ApplyRotaryEmb.forward_native`` (``apply_rotary_emb_torch``): x [tokens, heads, rotary_dim]."""
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    if is_neox:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    return torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)


def vllm_mrope_forward_native(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                              interleaved):
    """vLLM's ``MRotaryEmbedding.forward_native``: out of place, the table cast to the data's dtype
    (``_match_cos_sin_cache_dtype``)."""
    cos_sin_cache = cos_sin_cache.to(query.dtype)
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = vllm_mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved)
    tokens = positions.shape[-1]
    out = []
    for x in (query, key):
        x3 = x.view(tokens, -1, head_size)
        rot = vllm_rotate(x3[..., :rotary_dim], cos, sin, is_neox)
        out.append(torch.cat((rot, x3[..., rotary_dim:]), dim=-1).reshape(x.shape))
    return out


def hand_built_table(positions, cos_sin_cache, mrope_section, interleaved):
    """The per-token ``[tokens, rotary_dim]`` cos/sin table, element by element from the rules (no
    torch indexing tricks): pair j of token t takes row positions[stream(j), t]."""
    t_sec, h_sec, w_sec = mrope_section
    half = cos_sin_cache.shape[1] // 2

    def stream(j):
        if interleaved:
            if j % 3 == 1 and j < 3 * h_sec:
                return 1
            if j % 3 == 2 and j < 3 * w_sec:
                return 2
            return 0
        return 0 if j < t_sec else 1 if j < t_sec + h_sec else 2

    table = torch.empty(positions.shape[1], 2 * half, dtype=cos_sin_cache.dtype)
    for t in range(positions.shape[1]):
        for j in range(half):
            row = int(positions[stream(j), t])
            table[t, j] = cos_sin_cache[row, j]
            table[t, half + j] = cos_sin_cache[row, half + j]
    return table


# ---- Cases -----------------------------------------------------------------------------------------

# (heads, kv_heads, head_size, rotary_dim, mrope_section), tagged with the models they stand for.
MODELS = {
    "qwen2-vl d128 [16,24,24]": (4, 2, 128, 128, (16, 24, 24)),        # Qwen2-VL / Qwen2.5-VL
    "qwen3-vl d128 [24,20,20]": (4, 2, 128, 128, (24, 20, 20)),        # Qwen3-VL (interleaved)
    "glm-4.1v d128 r64 [8,12,12]": (4, 1, 128, 64, (8, 12, 12)),       # GLM-4.1V: GPT-J pairs, half rotated
    "uneven d64 [5,0,27]": (2, 2, 64, 64, (5, 0, 27)),                 # an empty section, a long one
    "d80 r48 [4,8,12]": (3, 1, 80, 48, (4, 8, 12)),                    # partial rotary, an 80-wide head
}
LAYOUTS = {"chunked": False, "interleaved": True}
MAX_POSITION = 512


def mrope_positions(tokens, max_position, g, text=()):
    """[3, tokens] positions: random rows (vision tokens), equal rows for the tokens in ``text``."""
    positions = torch.randint(0, max_position, (STREAMS, tokens), generator=g)
    positions[:, -1] = max_position - 1  # the cache's last row
    for t in text:
        positions[:, t] = positions[0, t]
    return positions


def make_case(model, dtype, tokens=11, seed=0, positions_dtype=torch.int64):
    heads, kv_heads, head_size, rotary_dim, section = model
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(tokens, heads * head_size, generator=g).to(dtype)
    key = torch.randn(tokens, kv_heads * head_size, generator=g).to(dtype)
    cache = vllm_cos_sin_cache(MAX_POSITION, rotary_dim, dtype=torch.float32 if dtype != torch.float64 else dtype)
    positions = mrope_positions(tokens, MAX_POSITION, g, text=(0, 1))
    return positions.to(positions_dtype), query, key, head_size, cache, section


def run(positions, query, key, head_size, cache, is_neox, **kw):
    q, k = query.clone(), None if key is None else key.clone()
    rotary_embedding(positions, q, k, head_size, cache, is_neox, **kw)
    return q, k


def assert_equal_bits(got, want, what):
    if torch.equal(got, want):
        return
    diff = (got.double() - want.double()).abs()
    raise AssertionError(f"{what}: {int((diff != 0).sum())} values differ, worst by {float(diff.max()):g}")


def pair_scale(x, head_size, rotary_dim, is_neox):
    """|x1| + |x2| of each channel's pair, [tokens, heads, rotary_dim], float64."""
    x3 = x.reshape(x.shape[0], -1, head_size)[..., :rotary_dim].double()
    if is_neox:
        x1, x2 = x3.chunk(2, dim=-1)
        return (x1.abs() + x2.abs()).repeat(1, 1, 2)
    return (x3[..., 0::2].abs() + x3[..., 1::2].abs()).repeat_interleave(2, -1)


def ulps_apart(a, b):
    """|a - b| in float32 ulps (a, b float32 of one sign or zero; the ordered-integer distance)."""
    ia, ib = (t.view(torch.int32).long() for t in (a, b))
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return (ia - ib).abs()


# ---- Semantics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("model", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_equals_vllm_forward_native_bit_for_bit_where_nothing_rounds(dtype, model, is_neox, layout):
    heads, kv_heads, head_size, rotary_dim, section = model
    _, query, key, _, cache = exact_case((heads, kv_heads, head_size, rotary_dim), dtype, tokens=9)
    positions = mrope_positions(9, cache.shape[0], torch.Generator().manual_seed(5), text=(3,))
    want = vllm_mrope_forward_native(positions, query, key, head_size, cache, is_neox, section, layout)
    got = run(positions, query, key, head_size, cache, is_neox, mrope_section=section, mrope_interleaved=layout)
    for name, g, w in zip(("query", "key"), got, want):
        assert_equal_bits(g, w, name)
    assert not torch.equal(got[0], query)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("model", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_is_the_1d_rotation_of_the_hand_built_per_token_table(dtype, model, is_neox, layout):
    positions, query, key, head_size, cache, section = make_case(model, dtype, positions_dtype=torch.int32)
    table = hand_built_table(positions, cache, section, layout)
    # The table is vLLM's selection, value for value (gathers: the cache's bits).
    cos, sin = vllm_mrope_cos_sin(positions, cache, section, layout)
    assert torch.equal(table, torch.cat((cos, sin), dim=-1))
    want = run(torch.arange(positions.shape[1]), query, key, head_size, table, is_neox)
    got = run(positions, query, key, head_size, cache, is_neox, mrope_section=section, mrope_interleaved=layout)
    for name, g, w in zip(("query", "key"), got, want):
        assert_equal_bits(g, w, name)
    # ... and so exactly rotary's documented rounding of that table.
    contract = rotary_contract(torch.arange(positions.shape[1]), query, key, head_size, table, is_neox)
    for name, g, w in zip(("query", "key"), got, contract):
        assert_equal_bits(g, w, f"{name} (rotary's rounding)")


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("model", MODELS.values(), ids=MODELS.keys())
def test_float32_against_vllm_forward_native_differs_by_rounding_order_only(model, is_neox, layout):
    positions, query, key, head_size, cache, section = make_case(model, torch.float32, tokens=24, seed=7)
    rotary_dim = cache.shape[1]
    want = vllm_mrope_forward_native(positions, query, key, head_size, cache, is_neox, section, layout)
    got = run(positions, query, key, head_size, cache, is_neox, mrope_section=section, mrope_interleaved=layout)
    for name, x, g, w in zip(("query", "key"), (query, key), got, want):
        g3, w3 = (t.reshape(t.shape[0], -1, head_size) for t in (g, w))
        assert torch.equal(g3[..., rotary_dim:], w3[..., rotary_dim:])  # the tail untouched
        g3, w3 = g3[..., :rotary_dim], w3[..., :rotary_dim]
        scale = pair_scale(x, head_size, rotary_dim, is_neox)
        units = float(((g3.double() - w3.double()).abs() / (scale * UNIT[torch.float32])).max())
        # Each is within 2 units (one product's rounding, the result's) of the exact rotation; measured
        # here: 1.97 at most, about a third of the values differ.
        assert units <= 4.0, f"{name}: {units:.3f} units of 2^-24 (|x1| + |x2|)"
        away = g3.double().abs() >= scale / 4  # no cancellation: 1 ulp of the result
        assert int(ulps_apart(g3, w3)[away].max()) <= 1, name


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_text_tokens_are_plain_rope_bit_for_bit(dtype, is_neox, layout):
    positions, query, key, head_size, cache, section = make_case(MODELS["qwen2-vl d128 [16,24,24]"], dtype)
    text = positions[0].clone()
    same = text.expand(STREAMS, -1)  # every token text: the three streams equal
    want = run(text, query, key, head_size, cache, is_neox)
    got = run(same, query, key, head_size, cache, is_neox, mrope_section=section, mrope_interleaved=layout)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # Mixed: the text tokens (0 and 1 of make_case) of a multimodal call are plain RoPE's too.
    got = run(positions, query, key, head_size, cache, is_neox, mrope_section=section, mrope_interleaved=layout)
    for g, w in zip(got, want):
        assert torch.equal(g[:2], w[:2])
        assert not torch.equal(g[2:], w[2:])


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_1d_positions_with_a_section_are_plain_rope_as_in_vllm(layout):
    positions, query, key, head_size, cache, section = make_case(MODELS["glm-4.1v d128 r64 [8,12,12]"],
                                                                 torch.bfloat16)
    for is_neox in (True, False):
        want = run(positions[1], query, key, head_size, cache, is_neox)
        got = run(positions[1], query, key, head_size, cache, is_neox, mrope_section=section,
                  mrope_interleaved=layout)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_neox_and_gptj_pairings_both_take_the_mrope_table():
    # vLLM's Triton M-RoPE kernel was NeoX-only (vLLM issue 42016, GLM-OCR / GLM-4.1V): here both
    # pairings rotate the pairs they name by the sectioned angles.
    positions, query, key, head_size, cache, section = make_case(MODELS["glm-4.1v d128 r64 [8,12,12]"],
                                                                 torch.float64)
    neox = run(positions, query, key, head_size, cache, True, mrope_section=section)
    gptj = run(positions, query, key, head_size, cache, False, mrope_section=section)
    for got, is_neox in ((neox, True), (gptj, False)):
        want = vllm_mrope_forward_native(positions, query, key, head_size, cache, is_neox, section, False)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # float64: the formula itself
    assert not torch.equal(neox[0], gptj[0])


def test_chunked_and_interleaved_differ_and_sections_matter():
    positions, query, key, head_size, cache, _ = make_case(MODELS["qwen3-vl d128 [24,20,20]"], torch.float32)
    a = run(positions, query, key, head_size, cache, True, mrope_section=[24, 20, 20])[0]
    b = run(positions, query, key, head_size, cache, True, mrope_section=[24, 20, 20], mrope_interleaved=True)[0]
    c = run(positions, query, key, head_size, cache, True, mrope_section=[16, 24, 24])[0]
    assert not torch.equal(a, b) and not torch.equal(a, c)
    # Interleaved, vLLM's rule: [16, 24, 24] and [24, 20, 20] give different tables, but only the spatial
    # sections bound the cycle (T, H, W over the first 3 * 24 = 72 > 64 pairs: every pair cycles).
    d = run(positions, query, key, head_size, cache, True, mrope_section=[16, 24, 24], mrope_interleaved=True)[0]
    e = run(positions, query, key, head_size, cache, True, mrope_section=[0, 32, 32], mrope_interleaved=True)[0]
    assert not torch.equal(b, d) and torch.equal(d, e)


def test_strided_positions_and_3d_query_and_no_key():
    positions, query, key, head_size, cache, section = make_case(MODELS["qwen2-vl d128 [16,24,24]"],
                                                                 torch.bfloat16)
    want = run(positions, query, None, head_size, cache, False, mrope_section=section)[0]
    # vLLM's persistent [3, max_tokens] buffer, sliced to the batch's tokens: rows not contiguous.
    buffer = torch.zeros(STREAMS, 40, dtype=positions.dtype)
    buffer[:, :positions.shape[1]] = positions
    q3 = query.clone().view(positions.shape[1], -1, head_size)
    rotary_embedding(buffer[:, :positions.shape[1]], q3, None, head_size, cache, False, mrope_section=section)
    assert torch.equal(q3.reshape(query.shape), want)


def test_no_tokens_is_a_no_op():
    cache = vllm_cos_sin_cache(16, 64)
    q, k = torch.empty(0, 2 * 64), torch.empty(0, 64)
    rotary_embedding(torch.empty(STREAMS, 0, dtype=torch.int64), q, k, 64, cache, True, mrope_section=[8, 12, 12])


# ---- transformers' Qwen2-VL and Qwen3-VL --------------------------------------------------------------

def _transformers_rope(family, mrope_section, head_size, theta=10000.0):
    try:
        if family == "qwen2_vl":
            from transformers import Qwen2VLTextConfig as Config
            from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as Embedding
            from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb
        else:
            from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig as Config
            from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Embedding
            from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb
        config = Config(hidden_size=2 * head_size, num_attention_heads=2, num_key_value_heads=1, head_dim=head_size,
                        rope_parameters={"rope_type": "default", "rope_theta": theta,
                                         "mrope_section": list(mrope_section)})
        return Embedding(config), apply_rotary_pos_emb
    except ImportError as e:  # another transformers, without these modules (the pinned one has them)
        pytest.skip(f"transformers' {family} rotary embedding is not usable here: {type(e).__name__}: {e}")


@pytest.mark.parametrize("family,section,interleaved", [("qwen2_vl", (16, 24, 24), False),
                                                         ("qwen3_vl", (24, 20, 20), True)],
                         ids=["qwen2-vl chunked", "qwen3-vl interleaved"])
def test_against_transformers_qwen_vl(family, section, interleaved):
    head_size, tokens = 128, 13
    embedding, apply_rotary_pos_emb = _transformers_rope(family, section, head_size)
    g = torch.Generator().manual_seed(11)
    positions = mrope_positions(tokens, MAX_POSITION, g, text=(0, 5))
    q = torch.randn(1, 2, tokens, head_size, generator=g)  # transformers' [batch, heads, seq, head_dim]
    k = torch.randn(1, 1, tokens, head_size, generator=g)
    cos, sin = embedding(q, positions[:, None, :])  # [1, tokens, head_dim]: recomposed, then (freq, freq)
    cache = vllm_cos_sin_cache(MAX_POSITION, head_size)
    half = head_size // 2
    # Its cos/sin are the cache's rows, selected as vLLM selects them, bit for bit.
    want_cos, want_sin = vllm_mrope_cos_sin(positions, cache, section, interleaved)
    assert torch.equal(cos[0, :, :half], want_cos) and torch.equal(cos[0, :, half:], want_cos)
    assert torch.equal(sin[0, :, :half], want_sin) and torch.equal(sin[0, :, half:], want_sin)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    # Ours, on vLLM's flat layout [tokens, heads * head_size].
    q_flat, k_flat = (t[0].transpose(0, 1).reshape(tokens, -1) for t in (q, k))
    got = run(positions, q_flat, k_flat, head_size, cache, True, mrope_section=section, mrope_interleaved=interleaved)
    for name, x, g_, w in zip(("query", "key"), (q_flat, k_flat), got, (q_hf, k_hf)):
        w = w[0].transpose(0, 1).reshape(tokens, -1)
        # transformers rounds both products then the sum (x c + rotate_half(x) s), vLLM's order.
        vllm = vllm_mrope_forward_native(positions, q_flat, k_flat, head_size, cache, True, section, interleaved)
        assert torch.equal(w, vllm[0 if name == "query" else 1]), f"{name}: transformers is vLLM's formula"
        scale = pair_scale(x, head_size, head_size, True).reshape(tokens, -1)
        units = float(((g_.double() - w.double()).abs() / (scale * UNIT[torch.float32])).max())
        assert units <= 4.0, f"{name}: {units:.3f} units of 2^-24 (|x1| + |x2|) from transformers"


# ---- Bad input: named, nothing written -------------------------------------------------------------

def _args(**change):
    positions, query, key, head_size, cache, section = make_case(MODELS["qwen2-vl d128 [16,24,24]"],
                                                                 torch.float32, tokens=4)
    args = dict(positions=positions, query=query, key=key, head_size=head_size, cos_sin_cache=cache, is_neox=True,
                mrope_section=list(section))
    args.update(change)
    return args


BAD_VALUES = {
    "3 streams, no section": (dict(mrope_section=None),
                              r"^positions shape \(3, 4\) is M-RoPE's \[3, tokens\].*pass mrope_section"),
    "interleaved, no section": (dict(mrope_section=None, mrope_interleaved=True),
                                "^mrope_interleaved=True needs mrope_section"),
    "sum": (dict(mrope_section=[16, 24, 23]),
            r"^mrope_section=\[16, 24, 23\] sums to 63, but must sum to rotary_dim/2=64"),
    "sum, 1-D positions": (dict(mrope_section=[16, 24, 25], positions=torch.arange(4)),
                           r"^mrope_section=\[16, 24, 25\] sums to 65"),
    "negative": (dict(mrope_section=[-8, 48, 24]), r"^mrope_section\[0\]=-8 must be >= 0"),
    "two entries": (dict(mrope_section=[32, 32]), r"^mrope_section=\[32, 32\] must have 3 entries"),
    "four entries": (dict(mrope_section=[16, 16, 16, 16]), r"^mrope_section=\[16, 16, 16, 16\] must have 3 entries"),
    "2 streams": (dict(positions=torch.zeros(2, 4, dtype=torch.int64)),
                  r"^positions shape \(2, 4\) must be \[3, tokens\]"),
    "3-D positions": (dict(positions=torch.zeros(3, 1, 4, dtype=torch.int64)),
                      r"^positions shape \(3, 1, 4\) must be \[3, tokens\]"),
    "tokens": (dict(positions=torch.zeros(3, 5, dtype=torch.int64)),
               r"^query shape \(4, 512\) must be \[tokens=5, heads \* head_size\]"),
    "position beyond the cache": (dict(positions=torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3], [0, 512, 2, 3]])),
                                  r"^positions\[2, 1\]=512 \(width stream\) is outside \[0, 512\)"),
    "negative position": (dict(positions=torch.tensor([[0, 1, 2, 3], [0, -1, 2, 3], [0, 1, 2, 3]],
                                                      dtype=torch.int32)),
                          r"^positions\[1, 1\]=-1 \(height stream\)"),
    "key tokens": (dict(key=torch.zeros(5, 128)), r"key's tokens \(5,\) differ from query's \(4,\)"),
    "width not a multiple": (dict(head_size=160), "^query width=512 must be a multiple of head_size=160"),
    "cache odd width": (dict(cos_sin_cache=torch.zeros(16, 31)), "^cos_sin_cache width=31"),
    "cache too wide": (dict(cos_sin_cache=torch.zeros(16, 256), mrope_section=[32, 48, 48]),
                       "^cos_sin_cache width=256"),
    "meta positions": (dict(positions=torch.zeros(3, 4, dtype=torch.int64, device="meta")),
                       "^positions is on meta but query is on cpu"),
}

BAD_TYPES = {
    "section float": (dict(mrope_section=[16, 24, 24.0]), r"^mrope_section\[2\]=24.0 must be an int, got float"),
    "section bool": (dict(mrope_section=[True, 31, 32]), r"^mrope_section\[0\]=True must be an int, got bool"),
    "section int": (dict(mrope_section=64), "^mrope_section must be a sequence of 3 ints"),
    "section str": (dict(mrope_section="16,24,24"), "^mrope_section must be a sequence of 3 ints"),
    "interleaved int": (dict(mrope_interleaved=1), "^mrope_interleaved must be a bool, got int"),
    "positions float": (dict(positions=torch.zeros(3, 4)), "^positions must be an int64 or int32 tensor"),
    "head_size float": (dict(head_size=128.0), "^head_size must be an int, got float"),
    "is_neox int": (dict(is_neox=1), "^is_neox must be a bool, got int"),
}


@pytest.mark.parametrize("mode", [False, True], ids=["eager", "operator"])
@pytest.mark.parametrize("case", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_raise_value_error_naming_the_value(case, mode):
    change, message = case
    if mode and message.startswith(r"^positions\["):  # traced: the kernel refuses the token, as position -1
        message = r"positions\[1\]=-1"
    with pytest.raises(ValueError, match=message):
        _call_and_check_untouched(rotary_embedding, _args(**change), mode)


@pytest.mark.parametrize("case", BAD_TYPES.values(), ids=BAD_TYPES.keys())
def test_wrong_kinds_raise_type_error_naming_the_argument(case):
    change, message = case
    with pytest.raises(TypeError, match=message):
        _call_and_check_untouched(rotary_embedding, _args(**change))


def test_the_1d_and_batch_calls_are_as_before_without_a_section():
    # [batch=3, seq] positions with a [batch, seq, ...] query stay batch positions, not M-RoPE streams.
    positions, query, key, head_size, cache, _ = make_case(MODELS["d80 r48 [4,8,12]"], torch.float32, tokens=12)
    flat = positions[0]
    want = run(flat, query, key, head_size, cache, True)
    q, k = query.clone().view(3, 4, -1), key.clone().view(3, 4, -1)
    rotary_embedding(flat.view(3, 4), q, k, head_size, cache, True)
    assert torch.equal(q.reshape(12, -1), want[0]) and torch.equal(k.reshape(12, -1), want[1])


# ---- torch.compile ---------------------------------------------------------------------------------

def mrope_prologue(qkv, positions, cos_sin_cache, is_neox, interleaved):
    """A vLLM Qwen2-VL attention layer's prologue: split the fused QKV, rotate q and k in place by M-RoPE."""
    q, k, v = qkv.split([4 * 128, 2 * 128, 2 * 128], dim=-1)
    rotary_embedding(positions, q, k, 128, cos_sin_cache, is_neox, mrope_section=[16, 24, 24],
                     mrope_interleaved=interleaved)
    return q.sum(-1) + k.sum(-1), q, k, v


@pytest.mark.parametrize("interleaved", [False, True], ids=["chunked", "interleaved"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiles_with_fullgraph_and_no_graph_break_and_equals_eager(backend, interleaved):
    cache = vllm_cos_sin_cache(MAX_POSITION, 128)
    g = torch.Generator().manual_seed(2)
    qkv, positions = torch.randn(9, 8 * 128, generator=g), mrope_positions(9, MAX_POSITION, g, text=(0,))
    explained = torch._dynamo.explain(mrope_prologue)(qkv.clone(), positions, cache, False, interleaved)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert "torch.ops.rotary.rotary_embedding" in explained.graphs[0].code
    compiled = torch.compile(mrope_prologue, fullgraph=True, backend=backend)
    for is_neox in (True, False):
        a, b = qkv.clone(), qkv.clone()
        want, got = mrope_prologue(a, positions, cache, is_neox, interleaved), compiled(b, positions, cache, is_neox,
                                                                                       interleaved)
        assert torch.equal(a, b) and not torch.equal(a, qkv)  # the caller's qkv written through the views
        for w, g_ in zip(want[1:], got[1:]):
            assert torch.equal(w, g_)
        torch.testing.assert_close(got[0], want[0])


def test_compiled_bad_position_raises_and_leaves_tensors_untouched():
    cache = vllm_cos_sin_cache(64, 128)
    compiled = torch.compile(mrope_prologue, fullgraph=True, backend="aot_eager")
    qkv = torch.randn(3, 8 * 128)
    original = qkv.clone()
    with pytest.raises(ValueError, match="positions"):
        compiled(qkv, torch.tensor([[0, 1, 2], [0, 64, 2], [0, 1, 2]]), cache, True, False)
    assert torch.equal(qkv, original)


def test_opcheck_of_the_operator_on_a_per_token_table():
    positions, query, key, head_size, cache, section = make_case(MODELS["d80 r48 [4,8,12]"], torch.bfloat16)
    table = hand_built_table(positions, cache, section, True)
    torch.library.opcheck(OP, (torch.arange(positions.shape[1]), query, key, head_size, table, False))


def test_fake_tensors_give_shapes_only():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        positions, query, key = torch.zeros(3, 5, dtype=torch.int64), torch.empty(5, 256), torch.empty(5, 128)
        rotary_embedding(positions, query, key, 128, torch.empty(64, 64), True, mrope_section=[8, 12, 12])


# ---- CUDA ------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_cuda_gives_the_cpu_bits(is_neox, layout):
    for model in MODELS.values():
        positions, query, key, head_size, cache, section = make_case(model, torch.bfloat16)
        want = run(positions, query, key, head_size, cache, is_neox, mrope_section=section, mrope_interleaved=layout)
        got = run(positions.cuda(), query.cuda(), key.cuda(), head_size, cache.cuda(), is_neox, mrope_section=section,
                  mrope_interleaved=layout)
        torch.cuda.synchronize()
        rotary.torch.check_positions()
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@gpu
def test_cuda_graph_replays_the_mrope_rotation():
    positions, query, key, head_size, cache, section = (t.cuda() if isinstance(t, torch.Tensor) else t
                                                        for t in make_case(MODELS["qwen2-vl d128 [16,24,24]"],
                                                                           torch.bfloat16))
    q, k = query.clone(), key.clone()
    rotary_embedding(positions, q, k, head_size, cache, True, mrope_section=section)  # warm-up
    q.copy_(query), k.copy_(key)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rotary_embedding(positions, q, k, head_size, cache, True, mrope_section=section)
    q.copy_(query), k.copy_(key)
    graph.replay()
    torch.cuda.synchronize()
    want = run(positions.cpu(), query.cpu(), key.cpu(), head_size, cache.cpu(), True, mrope_section=section)
    assert torch.equal(q.cpu(), want[0]) and torch.equal(k.cpu(), want[1])


@gpu
def test_cuda_skips_and_reports_an_unusable_position():
    positions, query, key, head_size, cache, section = make_case(MODELS["qwen2-vl d128 [16,24,24]"], torch.float32)
    positions[1, 3] = MAX_POSITION
    q = query.cuda()
    rotary_embedding(positions.cuda(), q, None, head_size, cache.cuda(), True, mrope_section=section)
    with pytest.raises(ValueError):
        rotary.torch.check_positions()
    assert torch.equal(q[3].cpu(), query[3])  # the token left as it was
