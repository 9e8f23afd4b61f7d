#include "model_types.hpp"

#include <algorithm>
#include <array>

namespace rotary::detail {
namespace {

// Read from the modeling code of transformers 5.23.0 (and, for checkpoints whose code is not in
// transformers, the remote code named). What decides an entry is how the attention lays out cos
// and sin and which channels its rotate function pairs: see RopeFormula. Not listed, on purpose:
//  - attention without RoPE: ALiBi (bloom, mpt; falcon only when alibi=true, see its rope_switch),
//    learned, sinusoidal or relative positions (gpt2, t5, moshi_depth, ...), and models that define
//    apply_rotary_pos_emb but never call it (jamba, nemotron_h, parakeet, nemotron_asr_streaming);
//  - vision towers and other 2-D/3-D rotary embeddings over image, video or atom coordinates
//    (pixtral, qwen2_vl_vision, dinov3_vit, sam3, vjepa2, esmfold2, lightglue, ...);
//  - wrappers that build their language model with AutoModel from text_config (llava, mistral3,
//    glm46v, exaone4_5, kimi_k25, ...): the text_config's model_type decides;
//  - seamless_m4t (rotary only in its optional conformer speech encoder), musicflamingo (a rotary
//    time embedding added to audio features, not in attention) and qwen2_5_omni_dit (rotates only
//    its first head, query[:, :1], which a per-model pairing cannot say).
// Sorted by model_type (find_model_type searches it by bisection); each listed once.
constexpr std::array<ModelTypeRope, 255> kTable = {{
    {.model_type = "afmoe", .pairing = Pairing::half,
     .source = "models/afmoe/modeling_afmoe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "apertus", .pairing = Pairing::half,
     .source = "models/apertus/modeling_apertus.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "arcee", .pairing = Pairing::half,
     .source = "models/arcee/modeling_arcee.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "aria", .pairing = Pairing::half,
     .source = "models/aria/modeling_aria.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "aria_text", .pairing = Pairing::half,
     .source = "models/aria/modeling_aria.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "axk1", .pairing = Pairing::interleaved,
     .source = "models/axk1/modeling_axk1.py: if config.rope_interleave: apply_rotary_pos_emb_interleave rotates "
               "(x[..., 0::2], x[..., 1::2]) and writes cat(first, second), else rotate_half",
     .pairing_flag = "rope_interleave", .pairing_flag_default = true,
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "axk2", .pairing = Pairing::interleaved,
     .source = "models/axk2/modeling_axk2.py: apply_rotary_pos_emb_interleave rotates (x[..., 0::2], x[..., 1::2]) "
               "and writes cat(first, second) (the indexer uses rotate_half)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "bailing_hybrid", .pairing = Pairing::interleaved,
     .source = "models/bailing_hybrid/modeling_bailing_hybrid.py: apply_rotary_pos_emb_interleave rotates (x[..., "
               "0::2], x[..., 1::2]) and writes cat(first, second)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "bamba", .pairing = Pairing::half,
     .source = "models/bamba/modeling_bamba.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "beam", .pairing = Pairing::half,
     .source = "models/beam/modeling_beam.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "bitnet", .pairing = Pairing::half,
     .source = "models/bitnet/modeling_bitnet.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "blt", .pairing = Pairing::interleaved,
     .source = "models/blt/modeling_blt.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half stacks "
               "(-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "blt_global_transformer", .pairing = Pairing::interleaved,
     .source = "models/blt/modeling_blt.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half stacks "
               "(-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "blt_local_decoder", .pairing = Pairing::interleaved,
     .source = "models/blt/modeling_blt.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half stacks "
               "(-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "blt_local_encoder", .pairing = Pairing::interleaved,
     .source = "models/blt/modeling_blt.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half stacks "
               "(-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "blt_patcher", .pairing = Pairing::interleaved,
     .source = "models/blt/modeling_blt.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half stacks "
               "(-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "chameleon", .pairing = Pairing::half,
     .source = "models/chameleon/modeling_chameleon.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "clvp", .pairing = Pairing::half,
     .source = "models/clvp/modeling_clvp.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs);"
               " the attention rotates q, k and v[..., :rotary_emb_dim], rotary_emb_dim = max(projection_dim // "
               "(num_attention_heads * 2), 32)",
     .partial_rotary = true},
    {.model_type = "clvp_encoder", .pairing = Pairing::half,
     .source = "models/clvp/modeling_clvp.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs);"
               " the attention rotates q, k and v[..., :rotary_emb_dim], rotary_emb_dim = max(projection_dim // "
               "(num_attention_heads * 2), 32)",
     .partial_rotary = true, .rope_switch_key = "use_rotary_embedding",
     .rope_switch_value = "true", .rope_switch_default = "true"},
    {.model_type = "codegen", .pairing = Pairing::interleaved,
     .source = "models/codegen/modeling_codegen.py: rotate_every_two stacks (-x[..., 1::2], x[..., ::2]), sin/cos "
               "repeat_interleave(2) on x[..., :rotary_dim]",
     .formula = RopeFormula::rotate_every_two, .partial_rotary = true, .rotary_dim_key = "rotary_dim"},
    {.model_type = "cohere", .pairing = Pairing::interleaved,
     .source = "models/cohere/modeling_cohere.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half "
               "stacks (-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "cohere2", .pairing = Pairing::interleaved,
     .source = "models/cohere2/modeling_cohere2.py: the rotary embedding repeat_interleave(2)s freqs, rotate_half "
               "stacks (-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "cohere2_moe", .pairing = Pairing::interleaved,
     .source = "models/cohere2_moe/modeling_cohere2_moe.py: the rotary embedding repeat_interleave(2)s freqs, "
               "rotate_half stacks (-x[..., 1::2], x[..., ::2])",
     .formula = RopeFormula::cohere},
    {.model_type = "cohere_compass", .pairing = Pairing::half,
     .source = "models/cohere_compass/modeling_cohere_compass.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "cohere_compass_text", .pairing = Pairing::half,
     .source = "models/cohere_compass/modeling_cohere_compass.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "cosmos3_edge", .pairing = Pairing::half,
     .source = "models/cosmos3_edge/modeling_cosmos3_edge.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "cosmos3_edge_text", .pairing = Pairing::half,
     .source = "models/cosmos3_edge/modeling_cosmos3_edge.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "csm", .pairing = Pairing::half,
     .source = "models/csm/modeling_csm.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "csm_depth_decoder_model", .pairing = Pairing::half,
     .source = "models/csm/modeling_csm.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "cwm", .pairing = Pairing::half,
     .source = "models/cwm/modeling_cwm.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "dbrx", .pairing = Pairing::half,
     .source = "models/dbrx/modeling_dbrx.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "deepseek_ocr2", .pairing = Pairing::half,
     .source = "models/deepseek_ocr2/modeling_deepseek_ocr2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "deepseek_ocr2_text", .pairing = Pairing::half,
     .source = "models/deepseek_ocr2/modeling_deepseek_ocr2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "deepseek_v2", .pairing = Pairing::interleaved,
     .source = "models/deepseek_v2/modeling_deepseek_v2.py: apply_rotary_emb multiplies "
               "view_as_complex(x.reshape(..., -1, 2)) by polar(1, freqs)",
     .formula = RopeFormula::complex, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "deepseek_v3", .pairing = Pairing::interleaved,
     .source = "models/deepseek_v3/modeling_deepseek_v3.py: if config.rope_interleave: "
               "apply_rotary_pos_emb_interleave rotates (x[..., 0::2], x[..., 1::2]) and writes cat(first, second), "
               "else rotate_half",
     .pairing_flag = "rope_interleave", .pairing_flag_default = true,
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "deepseek_v32", .pairing = Pairing::interleaved,
     .source = "models/deepseek_v32/modeling_deepseek_v32.py: apply_rotary_pos_emb_interleave rotates (x[..., 0::2],"
               " x[..., 1::2]) and writes cat(first, second) (the indexer uses rotate_half)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "deepseek_v4", .pairing = Pairing::interleaved,
     .source = "models/deepseek_v4/modeling_deepseek_v4.py: apply_rotary_pos_emb repeat_interleave(2)s cos/sin, "
               "rotate_half stacks (-x[..., 1::2], x[..., 0::2]) on the last rope_dim channels x[..., -rope_dim:] "
               "(and turns the attention output back by -angle)",
     .formula = RopeFormula::rotate_every_two, .partial_rotary = true, .trailing_rotary = true},
    {.model_type = "dia", .pairing = Pairing::half,
     .source = "models/dia/modeling_dia.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "dia_decoder", .pairing = Pairing::half,
     .source = "models/dia/modeling_dia.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "dia_encoder", .pairing = Pairing::half,
     .source = "models/dia/modeling_dia.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "diffllama", .pairing = Pairing::half,
     .source = "models/diffllama/modeling_diffllama.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "diffusion_gemma", .pairing = Pairing::half,
     .source = "models/diffusion_gemma/modeling_diffusion_gemma.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "diffusion_gemma_text", .pairing = Pairing::half,
     .source = "models/diffusion_gemma/modeling_diffusion_gemma.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "doge", .pairing = Pairing::half,
     .source = "models/doge/modeling_doge.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "dots1", .pairing = Pairing::half,
     .source = "models/dots1/modeling_dots1.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "dots3_note", .pairing = Pairing::interleaved,
     .source = "models/dots3_note/modeling_dots3_note.py: apply_rotary_pos_emb_interleave rotates (x[..., 0::2], "
               "x[..., 1::2]) and writes cat(first, second)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "dots3_note_audio_encoder", .pairing = Pairing::half,
     .source = "models/dots3_note/modeling_dots3_note.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "dots3_note_text", .pairing = Pairing::interleaved,
     .source = "models/dots3_note/modeling_dots3_note.py: apply_rotary_pos_emb_interleave rotates (x[..., 0::2], "
               "x[..., 1::2]) and writes cat(first, second)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "embedding_gemma2", .pairing = Pairing::half,
     .source = "models/embedding_gemma2/modeling_embedding_gemma2.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "embedding_gemma2_text", .pairing = Pairing::half,
     .source = "models/embedding_gemma2/modeling_embedding_gemma2.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "emu3", .pairing = Pairing::half,
     .source = "models/emu3/modeling_emu3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "emu3_text_model", .pairing = Pairing::half,
     .source = "models/emu3/modeling_emu3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "ernie4_5", .pairing = Pairing::interleaved,
     .source = "models/ernie4_5/modeling_ernie4_5.py: apply_rotary_pos_emb repeat_interleave(2)s cos[..., :d // 2], "
               "rotate_half stacks (-x[..., 1::2], x[..., 0::2])",
     .formula = RopeFormula::glm},
    {.model_type = "ernie4_5_moe", .pairing = Pairing::interleaved,
     .source = "models/ernie4_5_moe/modeling_ernie4_5_moe.py: apply_rotary_pos_emb repeat_interleave(2)s cos[..., :d"
               " // 2], rotate_half stacks (-x[..., 1::2], x[..., 0::2])",
     .formula = RopeFormula::glm},
    {.model_type = "ernie4_5_vl_moe", .pairing = Pairing::interleaved,
     .source = "models/ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py: recomposition_frequencies repeat_interleave(2)s "
               "freqs, rotate_half_text stacks (-x[..., 1::2], x[..., 0::2]); M-RoPE: mrope_section [h, w, t], "
               "pairs j < h + w alternate h (even j) and w (odd j), the last t pairs take t",
     .multimodal_positions = true, .stream_layout = StreamLayout::alternating_sections, .formula = RopeFormula::cohere},
    {.model_type = "ernie4_5_vl_moe_text", .pairing = Pairing::interleaved,
     .source = "models/ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py: recomposition_frequencies repeat_interleave(2)s "
               "freqs, rotate_half_text stacks (-x[..., 1::2], x[..., 0::2]); M-RoPE: mrope_section [h, w, t], "
               "pairs j < h + w alternate h (even j) and w (odd j), the last t pairs take t",
     .multimodal_positions = true, .stream_layout = StreamLayout::alternating_sections, .formula = RopeFormula::cohere},
    {.model_type = "esm", .pairing = Pairing::half,
     .source = "models/esm/modeling_esm.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs) "
               "when position_embedding_type == \"rotary\"",
     .rope_switch_key = "position_embedding_type",
     .rope_switch_value = "\"rotary\"", .rope_switch_default = "\"absolute\""},
    {.model_type = "esmc", .pairing = Pairing::half,
     .source = "models/esmc/modeling_esmc.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "eurobert", .pairing = Pairing::half,
     .source = "models/eurobert/modeling_eurobert.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "evolla", .pairing = Pairing::half,
     .source = "models/evolla/modeling_evolla.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs) in the Llama decoder and the SaProt encoder"},
    {.model_type = "exaone4", .pairing = Pairing::half,
     .source = "models/exaone4/modeling_exaone4.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "exaone4_5_text", .pairing = Pairing::half,
     .source = "models/exaone4/modeling_exaone4.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs) (configuration_exaone4_5.py reads text_config model_type exaone4_5_text as exaone4)"},
    {.model_type = "exaone_moe", .pairing = Pairing::half,
     .source = "models/exaone_moe/modeling_exaone_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "falcon", .pairing = Pairing::half,
     .source = "models/falcon/modeling_falcon.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs) unless config.alibi",
     .rope_switch_key = "alibi", .rope_switch_value = "false", .rope_switch_default = "false"},
    {.model_type = "falcon_h1", .pairing = Pairing::half,
     .source = "models/falcon_h1/modeling_falcon_h1.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "flex_olmo", .pairing = Pairing::half,
     .source = "models/flex_olmo/modeling_flex_olmo.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "flint", .pairing = Pairing::half,
     .source = "models/flint/modeling_flint.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma", .pairing = Pairing::half,
     .source = "models/gemma/modeling_gemma.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma2", .pairing = Pairing::half,
     .source = "models/gemma2/modeling_gemma2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma3", .pairing = Pairing::half,
     .source = "models/gemma3/modeling_gemma3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma3_text", .pairing = Pairing::half,
     .source = "models/gemma3/modeling_gemma3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma3n", .pairing = Pairing::half,
     .source = "models/gemma3n/modeling_gemma3n.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma3n_text", .pairing = Pairing::half,
     .source = "models/gemma3n/modeling_gemma3n.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma4", .pairing = Pairing::half,
     .source = "models/gemma4/modeling_gemma4.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma4_text", .pairing = Pairing::half,
     .source = "models/gemma4/modeling_gemma4.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "gemma4_unified", .pairing = Pairing::half,
     .source = "models/gemma4_unified/modeling_gemma4_unified.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs)"},
    {.model_type = "gemma4_unified_text", .pairing = Pairing::half,
     .source = "models/gemma4_unified/modeling_gemma4_unified.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs)"},
    {.model_type = "glm", .pairing = Pairing::interleaved,
     .source = "models/glm/modeling_glm.py: apply_rotary_pos_emb repeat_interleave(2)s cos[..., :d // 2], "
               "rotate_half stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :rotary_dim]",
     .formula = RopeFormula::glm, .partial_rotary = true},
    {.model_type = "glm4", .pairing = Pairing::interleaved,
     .source = "models/glm4/modeling_glm4.py: apply_rotary_pos_emb repeat_interleave(2)s cos[..., :d // 2], "
               "rotate_half stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :rotary_dim]",
     .formula = RopeFormula::glm, .partial_rotary = true},
    {.model_type = "glm4_moe", .pairing = Pairing::half,
     .source = "models/glm4_moe/modeling_glm4_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "glm4_moe_lite", .pairing = Pairing::interleaved,
     .source = "models/glm4_moe_lite/modeling_glm4_moe_lite.py: if config.rope_interleave: "
               "apply_rotary_pos_emb_interleave rotates (x[..., 0::2], x[..., 1::2]) and writes cat(first, second), "
               "else rotate_half",
     .pairing_flag = "rope_interleave", .pairing_flag_default = true,
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "glm4v", .pairing = Pairing::interleaved,
     .source = "models/glm4v/modeling_glm4v.py: recomposition_frequencies repeat_interleave(2)s freqs, "
               "rotate_half_llm stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :cos.shape[-1]]; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .formula = RopeFormula::cohere, .partial_rotary = true},
    {.model_type = "glm4v_moe", .pairing = Pairing::half,
     .source = "models/glm4v_moe/modeling_glm4v_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "glm4v_moe_text", .pairing = Pairing::half,
     .source = "models/glm4v_moe/modeling_glm4v_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "glm4v_text", .pairing = Pairing::interleaved,
     .source = "models/glm4v/modeling_glm4v.py: recomposition_frequencies repeat_interleave(2)s freqs, "
               "rotate_half_llm stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :cos.shape[-1]]; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .formula = RopeFormula::cohere, .partial_rotary = true},
    {.model_type = "glm_image", .pairing = Pairing::half,
     .source = "models/glm_image/modeling_glm_image.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "glm_image_text", .pairing = Pairing::half,
     .source = "models/glm_image/modeling_glm_image.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "glm_moe_dsa", .pairing = Pairing::interleaved,
     .source = "models/glm_moe_dsa/modeling_glm_moe_dsa.py: apply_rotary_pos_emb_interleave rotates (x[..., 0::2], "
               "x[..., 1::2]) and writes cat(first, second)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "glm_ocr", .pairing = Pairing::interleaved,
     .source = "models/glm_ocr/modeling_glm_ocr.py: recomposition_frequencies repeat_interleave(2)s freqs, "
               "rotate_half_llm stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :cos.shape[-1]]; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .formula = RopeFormula::cohere, .partial_rotary = true},
    {.model_type = "glm_ocr_text", .pairing = Pairing::interleaved,
     .source = "models/glm_ocr/modeling_glm_ocr.py: recomposition_frequencies repeat_interleave(2)s freqs, "
               "rotate_half_llm stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :cos.shape[-1]]; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .formula = RopeFormula::cohere, .partial_rotary = true},
    {.model_type = "glmasr_encoder", .pairing = Pairing::half,
     .source = "models/glmasr/modeling_glmasr.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "gpt_neox", .pairing = Pairing::half,
     .source = "models/gpt_neox/modeling_gpt_neox.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "gpt_neox_japanese", .pairing = Pairing::half,
     .source = "models/gpt_neox_japanese/modeling_gpt_neox_japanese.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs); the attention rotates x[..., :rotary_ndims] and passes the rest",
     .partial_rotary = true},
    {.model_type = "gpt_oss", .pairing = Pairing::half,
     .source = "models/gpt_oss/modeling_gpt_oss.py: _apply_rotary_emb chunks x into halves: cat(x1 * cos - x2 * sin,"
               " x2 * cos + x1 * sin)",
     .formula = RopeFormula::half_chunks},
    {.model_type = "gptj", .pairing = Pairing::interleaved,
     .source = "models/gptj/modeling_gptj.py: rotate_every_two stacks (-x[..., 1::2], x[..., ::2]), sin/cos "
               "repeat_interleave(2) on x[..., :rotary_dim]",
     .formula = RopeFormula::rotate_every_two, .partial_rotary = true, .rotary_dim_key = "rotary_dim"},
    {.model_type = "gradium_phonon_tts", .pairing = Pairing::half,
     .source = "models/gradium_phonon_tts/modeling_gradium_phonon_tts.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "granite", .pairing = Pairing::half,
     .source = "models/granite/modeling_granite.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "granite4_vision", .pairing = Pairing::half,
     .source = "models/granite4_vision/modeling_granite4_vision.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "granite4_vision_text", .pairing = Pairing::half,
     .source = "models/granite4_vision/modeling_granite4_vision.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "granite_docling", .pairing = Pairing::half,
     .source = "models/granite_docling/modeling_granite_docling.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "granite_docling_text", .pairing = Pairing::half,
     .source = "models/granite_docling/modeling_granite_docling.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "granite_swa", .pairing = Pairing::half,
     .source = "models/granite_swa/modeling_granite_swa.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "granitemoe", .pairing = Pairing::half,
     .source = "models/granitemoe/modeling_granitemoe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "granitemoe_swa", .pairing = Pairing::half,
     .source = "models/granitemoe_swa/modeling_granitemoe_swa.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs)"},
    {.model_type = "granitemoehybrid", .pairing = Pairing::half,
     .source = "models/granitemoehybrid/modeling_granitemoehybrid.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs); rotary_emb only when position_embedding_type == \"rope\"",
     .rope_switch_key = "position_embedding_type", .rope_switch_value = "\"rope\"", .rope_switch_default = "null"},
    {.model_type = "granitemoeshared", .pairing = Pairing::half,
     .source = "models/granitemoeshared/modeling_granitemoeshared.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "gte", .pairing = Pairing::half,
     .source = "models/gte/modeling_gte.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "helium", .pairing = Pairing::interleaved,
     .source = "models/helium/modeling_helium.py: apply_rotary_pos_emb repeat_interleave(2)s cos[..., :d // 2], "
               "rotate_half stacks (-x[..., 1::2], x[..., 0::2])",
     .formula = RopeFormula::glm},
    {.model_type = "higgs_audio_v2", .pairing = Pairing::half,
     .source = "models/higgs_audio_v2/modeling_higgs_audio_v2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs)"},
    {.model_type = "hrm_text", .pairing = Pairing::half,
     .source = "models/hrm_text/modeling_hrm_text.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "hunyuan_v1_dense", .pairing = Pairing::half,
     .source = "models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "hunyuan_v1_moe", .pairing = Pairing::half,
     .source = "models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs)"},
    {.model_type = "hunyuan_vl", .pairing = Pairing::half,
     .source = "models/hunyuan_vl/modeling_hunyuan_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "hunyuan_vl_text", .pairing = Pairing::half,
     .source = "models/hunyuan_vl/modeling_hunyuan_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "hy_v3", .pairing = Pairing::half,
     .source = "models/hy_v3/modeling_hy_v3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "hy_v4", .pairing = Pairing::half,
     .source = "models/hy_v4/modeling_hy_v4.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)",
     .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "hyperclovax", .pairing = Pairing::half,
     .source = "models/hyperclovax/modeling_hyperclovax.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "idefics", .pairing = Pairing::half,
     .source = "models/idefics/modeling_idefics.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "internlm", .pairing = Pairing::half,
     .source = "github.com/InternLM/InternLM tools/transformers/internlm_model/modeling_internlm.py: rotate_half "
               "splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "internlm2", .pairing = Pairing::half,
     .source = "github.com/InternLM/InternLM-XComposer "
               "InternLM-XComposer-2.5-OmniLive/internlm-xcomposer2d5-ol-7b/base/modeling_internlm2.py: rotate_half "
               "splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs) (InternLM's copy of the internlm2 Hub "
               "code)"},
    {.model_type = "internlm3", .pairing = Pairing::half,
     .source = "models/llama/modeling_llama.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs) (auto/modeling_auto.py maps internlm3 to LlamaModel)"},
    {.model_type = "iquestcoder", .pairing = Pairing::half,
     .source = "models/llama/modeling_llama.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs) (auto/modeling_auto.py maps iquestcoder to LlamaModel)"},
    {.model_type = "jais2", .pairing = Pairing::half,
     .source = "models/jais2/modeling_jais2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "jetmoe", .pairing = Pairing::half,
     .source = "models/jetmoe/modeling_jetmoe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "jina_embeddings_v3", .pairing = Pairing::half,
     .source = "models/jina_embeddings_v3/modeling_jina_embeddings_v3.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "kimi_k2", .pairing = Pairing::interleaved,
     .source = "models/deepseek_v3/modeling_deepseek_v3.py: if config.rope_interleave: "
               "apply_rotary_pos_emb_interleave rotates (x[..., 0::2], x[..., 1::2]) and writes cat(first, second), "
               "else rotate_half (configuration_kimi_k25.py reads text_config model_type kimi_k2 as deepseek_v3)",
     .pairing_flag = "rope_interleave", .pairing_flag_default = true,
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "kolibri1", .pairing = Pairing::half,
     .source = "models/kolibri1/modeling_kolibri1.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "kyutai_speech_to_text", .pairing = Pairing::half,
     .source = "models/kyutai_speech_to_text/modeling_kyutai_speech_to_text.py: rotate_half splits x at x.shape[-1] "
               "// 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "laguna", .pairing = Pairing::half,
     .source = "models/laguna/modeling_laguna.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "lasr_encoder", .pairing = Pairing::half,
     .source = "models/lasr/modeling_lasr.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "lfm2", .pairing = Pairing::half,
     .source = "models/lfm2/modeling_lfm2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "lfm2_moe", .pairing = Pairing::half,
     .source = "models/lfm2_moe/modeling_lfm2_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "lfm3", .pairing = Pairing::half,
     .source = "models/lfm3/modeling_lfm3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "llama", .pairing = Pairing::half,
     .source = "models/llama/modeling_llama.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "llama4", .pairing = Pairing::interleaved,
     .source = "models/llama4/modeling_llama4.py: apply_rotary_emb multiplies view_as_complex(x.reshape(..., -1, 2))"
               " by polar(1, freqs)",
     .formula = RopeFormula::complex},
    {.model_type = "llama4_text", .pairing = Pairing::interleaved,
     .source = "models/llama4/modeling_llama4.py: apply_rotary_emb multiplies view_as_complex(x.reshape(..., -1, 2))"
               " by polar(1, freqs)",
     .formula = RopeFormula::complex},
    {.model_type = "longcat_flash", .pairing = Pairing::interleaved,
     .source = "models/longcat_flash/modeling_longcat_flash.py: apply_rotary_pos_emb_interleave rotates (x[..., "
               "0::2], x[..., 1::2]) and writes cat(first, second)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "mellum", .pairing = Pairing::half,
     .source = "models/mellum/modeling_mellum.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "mimi", .pairing = Pairing::half,
     .source = "models/mimi/modeling_mimi.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "mimi_decoder", .pairing = Pairing::half,
     .source = "models/mimi/modeling_mimi.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "mimi_encoder", .pairing = Pairing::half,
     .source = "models/mimi/modeling_mimi.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "mimo_v2_flash", .pairing = Pairing::half,
     .source = "models/mimo_v2_flash/modeling_mimo_v2_flash.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "minicpm", .pairing = Pairing::half,
     .source = "github.com/OpenBMB/MiniCPM model/modeling_minicpm.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "minicpm3", .pairing = Pairing::half,
     .source = "models/minicpm3/modeling_minicpm3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)",
     .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "minimax", .pairing = Pairing::half,
     .source = "models/minimax/modeling_minimax.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "minimax_m2", .pairing = Pairing::half,
     .source = "models/minimax_m2/modeling_minimax_m2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "minimax_m3_vl", .pairing = Pairing::half,
     .source = "models/minimax_m3_vl/modeling_minimax_m3_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "minimax_m3_vl_text", .pairing = Pairing::half,
     .source = "models/minimax_m3_vl/modeling_minimax_m3_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "ministral", .pairing = Pairing::half,
     .source = "models/ministral/modeling_ministral.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "ministral3", .pairing = Pairing::half,
     .source = "models/ministral3/modeling_ministral3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "mistral", .pairing = Pairing::half,
     .source = "models/mistral/modeling_mistral.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "mistral4", .pairing = Pairing::interleaved,
     .source = "models/mistral4/modeling_mistral4.py: if config.rope_interleave: apply_rotary_pos_emb_interleave "
               "rotates (x[..., 0::2], x[..., 1::2]) and writes cat(first, second), else rotate_half",
     .pairing_flag = "rope_interleave", .pairing_flag_default = true,
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "mistral_large4", .pairing = Pairing::interleaved,
     .source = "models/mistral_large4/modeling_mistral_large4.py: apply_rotary_pos_emb_interleave rotates (x[..., "
               "0::2], x[..., 1::2]) and writes cat(first, second); inv_freq scaled by exp(alpha)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "mistral_large4_text", .pairing = Pairing::interleaved,
     .source = "models/mistral_large4/modeling_mistral_large4.py: apply_rotary_pos_emb_interleave rotates (x[..., "
               "0::2], x[..., 1::2]) and writes cat(first, second); inv_freq scaled by exp(alpha)",
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "mixtral", .pairing = Pairing::half,
     .source = "models/mixtral/modeling_mixtral.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "mllama", .pairing = Pairing::half,
     .source = "models/mllama/modeling_mllama.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "mllama_text_model", .pairing = Pairing::half,
     .source = "models/mllama/modeling_mllama.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "modernbert", .pairing = Pairing::half,
     .source = "models/modernbert/modeling_modernbert.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "modernbert-decoder", .pairing = Pairing::half,
     .source = "models/modernbert_decoder/modeling_modernbert_decoder.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "molmo2", .pairing = Pairing::half,
     .source = "models/molmo2/modeling_molmo2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "molmo2_text", .pairing = Pairing::half,
     .source = "models/molmo2/modeling_molmo2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "moonshine", .pairing = Pairing::interleaved,
     .source = "models/moonshine/modeling_moonshine.py: apply_rotary_pos_emb repeat_interleave(2)s cos[..., :d // "
               "2], rotate_half stacks (-x[..., 1::2], x[..., 0::2]) on x[..., :rotary_dim]",
     .formula = RopeFormula::glm, .partial_rotary = true},
    {.model_type = "moonshine_streaming", .pairing = Pairing::interleaved,
     .source = "models/moonshine_streaming/modeling_moonshine_streaming.py: apply_rotary_pos_emb "
               "repeat_interleave(2)s cos[..., :d // 2], rotate_half stacks (-x[..., 1::2], x[..., 0::2]) on x[..., "
               ":rotary_dim]",
     .formula = RopeFormula::glm, .partial_rotary = true},
    {.model_type = "moshi", .pairing = Pairing::half,
     .source = "models/moshi/modeling_moshi.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "muse_glimmer", .pairing = Pairing::half,
     .source = "models/muse_glimmer/modeling_muse_glimmer.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "muse_glimmer_assistant", .pairing = Pairing::half,
     .source = "models/muse_glimmer_assistant/modeling_muse_glimmer_assistant.py: rotate_half splits x at "
               "x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "muse_glimmer_text", .pairing = Pairing::half,
     .source = "models/muse_glimmer/modeling_muse_glimmer.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "muse_spark", .pairing = Pairing::half,
     .source = "models/muse_spark/modeling_muse_spark.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "muse_spark_text", .pairing = Pairing::half,
     .source = "models/muse_spark/modeling_muse_spark.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "nanochat", .pairing = Pairing::half,
     .source = "models/nanochat/modeling_nanochat.py: rotate_half returns cat(x2, -x1): rotation by -angle",
     .formula = RopeFormula::rotate_half_negated},
    {.model_type = "nemotron", .pairing = Pairing::half,
     .source = "models/nemotron/modeling_nemotron.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "nemotron3_5_transcribe_asr_audio", .pairing = Pairing::half,
     .source = "models/nemotron3_5_transcribe/modeling_nemotron3_5_transcribe.py: rotate_half splits x at "
               "x.shape[-1] // 2, cos/sin = cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] "
               "and passes the rest",
     .partial_rotary = true},
    {.model_type = "nemotron3_5_transcribe_word_timestamp", .pairing = Pairing::half,
     .source = "models/nemotron3_5_transcribe/modeling_nemotron3_5_transcribe.py: rotate_half splits x at "
               "x.shape[-1] // 2, cos/sin = cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] "
               "and passes the rest",
     .partial_rotary = true},
    {.model_type = "nemotron3_diarization", .pairing = Pairing::half,
     .source = "models/nemotron3_diarization/modeling_nemotron3_diarization.py: rotate_half splits x at x.shape[-1] "
               "// 2, cos/sin = cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes "
               "the rest",
     .partial_rotary = true},
    {.model_type = "nemotron3_diarization_audio", .pairing = Pairing::half,
     .source = "models/nemotron3_diarization/modeling_nemotron3_diarization.py: rotate_half splits x at x.shape[-1] "
               "// 2, cos/sin = cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes "
               "the rest",
     .partial_rotary = true},
    {.model_type = "neomme", .pairing = Pairing::half,
     .source = "models/neomme/modeling_neomme.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; 2 streams: "
               "position_ids.expand(2, ...) (row, column)",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "neucodec", .pairing = Pairing::half,
     .source = "models/neucodec/modeling_neucodec.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "nomic_bert", .pairing = Pairing::half,
     .source = "models/nomic_bert/modeling_nomic_bert.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "olmo", .pairing = Pairing::half,
     .source = "models/olmo/modeling_olmo.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "olmo2", .pairing = Pairing::half,
     .source = "models/olmo2/modeling_olmo2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "olmo3", .pairing = Pairing::half,
     .source = "models/olmo3/modeling_olmo3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "olmo_hybrid", .pairing = Pairing::half,
     .source = "models/olmo_hybrid/modeling_olmo_hybrid.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "olmoe", .pairing = Pairing::half,
     .source = "models/olmoe/modeling_olmoe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "openai_privacy_filter", .pairing = Pairing::interleaved,
     .source = "models/openai_privacy_filter/modeling_openai_privacy_filter.py: _apply_rotary_emb rotates (x[..., "
               "::2], x[..., 1::2]) and stacks them back pairwise",
     .formula = RopeFormula::even_odd_chunks},
    {.model_type = "paddleocr_vl", .pairing = Pairing::half,
     .source = "models/paddleocr_vl/modeling_paddleocr_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "paddleocr_vl_text", .pairing = Pairing::half,
     .source = "models/paddleocr_vl/modeling_paddleocr_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "pe_audio_encoder", .pairing = Pairing::interleaved,
     .source = "models/pe_audio/modeling_pe_audio.py: apply_rotary_pos_emb multiplies x.reshape(..., -1, 1, 2) by "
               "stack_freqs [[cos, -sin], [sin, cos]]",
     .formula = RopeFormula::pair_matrix},
    {.model_type = "pe_audio_video_encoder", .pairing = Pairing::interleaved,
     .source = "models/pe_audio_video/modeling_pe_audio_video.py: apply_rotary_pos_emb multiplies x.reshape(..., -1,"
               " 1, 2) by stack_freqs [[cos, -sin], [sin, cos]]",
     .formula = RopeFormula::pair_matrix},
    {.model_type = "pe_video_encoder", .pairing = Pairing::interleaved,
     .source = "models/pe_video/modeling_pe_video.py: apply_rotary_pos_emb multiplies x.reshape(..., -1, 1, 2) by "
               "stack_freqs [[cos, -sin], [sin, cos]]",
     .formula = RopeFormula::pair_matrix},
    {.model_type = "persimmon", .pairing = Pairing::half,
     .source = "models/persimmon/modeling_persimmon.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); the attention rotates x[..., :rotary_ndims] and passes the rest",
     .partial_rotary = true},
    {.model_type = "phi", .pairing = Pairing::half,
     .source = "models/phi/modeling_phi.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs); "
               "the attention rotates x[..., :rotary_ndims] and passes the rest",
     .partial_rotary = true},
    {.model_type = "phi3", .pairing = Pairing::half,
     .source = "models/phi3/modeling_phi3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs);"
               " apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "phi4_multimodal", .pairing = Pairing::half,
     .source = "models/phi4_multimodal/modeling_phi4_multimodal.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "phimoe", .pairing = Pairing::half,
     .source = "models/phimoe/modeling_phimoe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "pocket_tts", .pairing = Pairing::half,
     .source = "models/pocket_tts/modeling_pocket_tts.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "pocket_tts_audio_tokenizer", .pairing = Pairing::half,
     .source = "models/pocket_tts_audio_tokenizer/modeling_pocket_tts_audio_tokenizer.py: rotate_half splits x at "
               "x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "pocket_tts_audio_tokenizer_decoder", .pairing = Pairing::half,
     .source = "models/pocket_tts_audio_tokenizer/modeling_pocket_tts_audio_tokenizer.py: rotate_half splits x at "
               "x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "pocket_tts_audio_tokenizer_encoder", .pairing = Pairing::half,
     .source = "models/pocket_tts_audio_tokenizer/modeling_pocket_tts_audio_tokenizer.py: rotate_half splits x at "
               "x.shape[-1] // 2, cos/sin = cat(freqs, freqs)"},
    {.model_type = "qwen2", .pairing = Pairing::half,
     .source = "models/qwen2/modeling_qwen2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "qwen2_5_omni", .pairing = Pairing::half,
     .source = "models/qwen2_5_omni/modeling_qwen2_5_omni.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_5_omni_talker", .pairing = Pairing::half,
     .source = "models/qwen2_5_omni/modeling_qwen2_5_omni.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_5_omni_text", .pairing = Pairing::half,
     .source = "models/qwen2_5_omni/modeling_qwen2_5_omni.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_5_omni_thinker", .pairing = Pairing::half,
     .source = "models/qwen2_5_omni/modeling_qwen2_5_omni.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_5_vl", .pairing = Pairing::half,
     .source = "models/qwen2_5_vl/modeling_qwen2_5_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_5_vl_text", .pairing = Pairing::half,
     .source = "models/qwen2_5_vl/modeling_qwen2_5_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_moe", .pairing = Pairing::half,
     .source = "models/qwen2_moe/modeling_qwen2_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "qwen2_vl", .pairing = Pairing::half,
     .source = "models/qwen2_vl/modeling_qwen2_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen2_vl_text", .pairing = Pairing::half,
     .source = "models/qwen2_vl/modeling_qwen2_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen3", .pairing = Pairing::half,
     .source = "models/qwen3/modeling_qwen3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "qwen3_5", .pairing = Pairing::half,
     .source = "models/qwen3_5/modeling_qwen3_5.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == 1, j < 3 * mrope_section[1] "
               "and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections, .partial_rotary = true},
    {.model_type = "qwen3_5_moe", .pairing = Pairing::half,
     .source = "models/qwen3_5_moe/modeling_qwen3_5_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == 1, j < 3 * mrope_section[1] "
               "and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections, .partial_rotary = true},
    {.model_type = "qwen3_5_moe_text", .pairing = Pairing::half,
     .source = "models/qwen3_5_moe/modeling_qwen3_5_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == 1, j < 3 * mrope_section[1] "
               "and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections, .partial_rotary = true},
    {.model_type = "qwen3_5_text", .pairing = Pairing::half,
     .source = "models/qwen3_5/modeling_qwen3_5.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == 1, j < 3 * mrope_section[1] "
               "and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections, .partial_rotary = true},
    {.model_type = "qwen3_moe", .pairing = Pairing::half,
     .source = "models/qwen3_moe/modeling_qwen3_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "qwen3_next", .pairing = Pairing::half,
     .source = "models/qwen3_next/modeling_qwen3_next.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "qwen3_omni_moe", .pairing = Pairing::half,
     .source = "models/qwen3_omni_moe/modeling_qwen3_omni_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen3_omni_moe_talker_code_predictor", .pairing = Pairing::half,
     .source = "models/qwen3_omni_moe/modeling_qwen3_omni_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs)"},
    {.model_type = "qwen3_omni_moe_talker_text", .pairing = Pairing::half,
     .source = "models/qwen3_omni_moe/modeling_qwen3_omni_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen3_omni_moe_text", .pairing = Pairing::half,
     .source = "models/qwen3_omni_moe/modeling_qwen3_omni_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen3_omni_moe_thinker", .pairing = Pairing::half,
     .source = "models/qwen3_omni_moe/modeling_qwen3_omni_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin "
               "= cat(freqs, freqs); M-RoPE: position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true},
    {.model_type = "qwen3_vl", .pairing = Pairing::half,
     .source = "models/qwen3_vl/modeling_qwen3_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == "
               "1, j < 3 * mrope_section[1] and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections},
    {.model_type = "qwen3_vl_moe", .pairing = Pairing::half,
     .source = "models/qwen3_vl_moe/modeling_qwen3_vl_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == "
               "1, j < 3 * mrope_section[1] and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections},
    {.model_type = "qwen3_vl_moe_text", .pairing = Pairing::half,
     .source = "models/qwen3_vl_moe/modeling_qwen3_vl_moe.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == "
               "1, j < 3 * mrope_section[1] and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections},
    {.model_type = "qwen3_vl_text", .pairing = Pairing::half,
     .source = "models/qwen3_vl/modeling_qwen3_vl.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); M-RoPE: apply_interleaved_mrope overwrites the t frequencies with h at j % 3 == "
               "1, j < 3 * mrope_section[1] and w at j % 3 == 2, j < 3 * mrope_section[2]",
     .multimodal_positions = true, .stream_layout = StreamLayout::interleaved_sections},
    {.model_type = "qwen4_exp", .pairing = Pairing::half,
     .source = "models/qwen4_exp/modeling_qwen4_exp.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "qwen4_exp_text", .pairing = Pairing::half,
     .source = "models/qwen4_exp/modeling_qwen4_exp.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest; M-RoPE: "
               "position_ids.expand(3, ...) split by mrope_section",
     .multimodal_positions = true, .partial_rotary = true},
    {.model_type = "recurrent_gemma", .pairing = Pairing::half,
     .source = "models/recurrent_gemma/modeling_recurrent_gemma.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "roformer", .pairing = Pairing::interleaved,
     .source = "models/roformer/modeling_roformer.py: apply_rotary_position_embeddings stacks (-x[..., 1::2], x[...,"
               " ::2]) with sin/cos stacked pairwise",
     .formula = RopeFormula::rotate_every_two},
    {.model_type = "seed_oss", .pairing = Pairing::half,
     .source = "models/seed_oss/modeling_seed_oss.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "smollm3", .pairing = Pairing::half,
     .source = "models/smollm3/modeling_smollm3.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "solar_open", .pairing = Pairing::half,
     .source = "models/solar_open/modeling_solar_open.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "stablelm", .pairing = Pairing::half,
     .source = "models/stablelm/modeling_stablelm.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs); the attention rotates x[..., :rotary_ndims] and passes the rest",
     .partial_rotary = true},
    {.model_type = "starcoder2", .pairing = Pairing::half,
     .source = "models/starcoder2/modeling_starcoder2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "step3p5", .pairing = Pairing::half,
     .source = "models/step3p7/modeling_step3p7.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "step3p7", .pairing = Pairing::half,
     .source = "models/step3p7/modeling_step3p7.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
    {.model_type = "t5_gemma_module", .pairing = Pairing::half,
     .source = "models/t5gemma/modeling_t5gemma.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "t5gemma", .pairing = Pairing::half,
     .source = "models/t5gemma/modeling_t5gemma.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "t5gemma2", .pairing = Pairing::half,
     .source = "models/t5gemma2/modeling_t5gemma2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "t5gemma2_decoder", .pairing = Pairing::half,
     .source = "models/t5gemma2/modeling_t5gemma2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "t5gemma2_encoder", .pairing = Pairing::half,
     .source = "models/t5gemma2/modeling_t5gemma2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "t5gemma2_text", .pairing = Pairing::half,
     .source = "models/t5gemma2/modeling_t5gemma2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs,"
               " freqs)"},
    {.model_type = "timesfm2_5", .pairing = Pairing::half,
     .source = "models/timesfm2_5/modeling_timesfm2_5.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "ultrabert", .pairing = Pairing::half,
     .source = "models/ultrabert/modeling_ultrabert.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "unlimited_ocr", .pairing = Pairing::half,
     .source = "models/unlimited_ocr/modeling_unlimited_ocr.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "unlimited_ocr_text", .pairing = Pairing::half,
     .source = "models/unlimited_ocr/modeling_unlimited_ocr.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "vaultgemma", .pairing = Pairing::half,
     .source = "models/vaultgemma/modeling_vaultgemma.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = "
               "cat(freqs, freqs)"},
    {.model_type = "voxtral_realtime", .pairing = Pairing::half,
     .source = "models/voxtral_realtime/modeling_voxtral_realtime.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "voxtral_realtime_encoder", .pairing = Pairing::half,
     .source = "models/voxtral_realtime/modeling_voxtral_realtime.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "voxtral_realtime_text", .pairing = Pairing::half,
     .source = "models/voxtral_realtime/modeling_voxtral_realtime.py: rotate_half splits x at x.shape[-1] // 2, "
               "cos/sin = cat(freqs, freqs)"},
    {.model_type = "wav2vec2-bert", .pairing = Pairing::half,
     .source = "models/wav2vec2_bert/modeling_wav2vec2_bert.py: _apply_rotary_embedding cats (-x[..., d // 2:], "
               "x[..., :d // 2]), cos/sin of cat(freqs, freqs), when position_embeddings_type == \"rotary\"",
     .rope_switch_key = "position_embeddings_type",
     .rope_switch_value = "\"rotary\"", .rope_switch_default = "\"relative_key\""},
    {.model_type = "wav2vec2-conformer", .pairing = Pairing::half,
     .source = "models/wav2vec2_conformer/modeling_wav2vec2_conformer.py: _apply_rotary_embedding cats (-x[..., d //"
               " 2:], x[..., :d // 2]), cos/sin of cat(freqs, freqs), when position_embeddings_type == \"rotary\"",
     .rope_switch_key = "position_embeddings_type",
     .rope_switch_value = "\"rotary\"", .rope_switch_default = "\"relative\""},
    {.model_type = "xcodec2", .pairing = Pairing::half,
     .source = "models/xcodec2/modeling_xcodec2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs)"},
    {.model_type = "youtu", .pairing = Pairing::interleaved,
     .source = "models/youtu/modeling_youtu.py: if config.rope_interleave: apply_rotary_pos_emb_interleave rotates "
               "(x[..., 0::2], x[..., 1::2]) and writes cat(first, second), else rotate_half",
     .pairing_flag = "rope_interleave", .pairing_flag_default = true,
     .formula = RopeFormula::interleave_to_half, .rotary_dim_key = "qk_rope_head_dim"},
    {.model_type = "zamba2", .pairing = Pairing::half,
     .source = "models/zamba2/modeling_zamba2.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, "
               "freqs); rotary_emb only when config.use_mem_rope",
     .rope_switch_key = "use_mem_rope", .rope_switch_value = "true", .rope_switch_default = "false"},
    {.model_type = "zaya", .pairing = Pairing::half,
     .source = "models/zaya/modeling_zaya.py: rotate_half splits x at x.shape[-1] // 2, cos/sin = cat(freqs, freqs);"
               " apply_rotary_pos_emb rotates x[..., :cos.shape[-1]] and passes the rest",
     .partial_rotary = true},
}};

}  // namespace

std::span<const ModelTypeRope> model_type_table() { return kTable; }

const ModelTypeRope* find_model_type(std::string_view model_type) {
  const auto it = std::lower_bound(kTable.begin(), kTable.end(), model_type,
                                   [](const ModelTypeRope& e, std::string_view t) { return e.model_type < t; });
  return it != kTable.end() && it->model_type == model_type ? &*it : nullptr;
}

}  // namespace rotary::detail
