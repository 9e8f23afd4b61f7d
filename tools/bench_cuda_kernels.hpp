// The kernels (tools/bench_cuda_kernels.cu) `rotary-dev bench --device cuda` runs beside a plain
// rotary call for the fused operations' unfused composition. Each queues on `stream` and returns
// the launch's cudaError_t (0: queued).
#pragma once

#include <cstdint>

struct CUstream_st;

namespace rotary::cli {

enum class BenchElement { f32, bf16, f16 };

/// vLLM's reshape_and_cache for an NHD cache whose slot rows are contiguous: token t's k and v rows
/// (row_bytes each, a multiple of 16, tokens' rows contiguous) to row slots[t] of k_cache and
/// v_cache; slots (int64, device memory) < 0 skip.
int bench_scatter_rows(const void* k, const void* v, void* k_cache, void* v_cache, const int64_t* slots,
                       int64_t tokens, int64_t row_bytes, CUstream_st* stream);

/// transformers' LlamaRMSNorm over `rows` contiguous rows of `dim` values in place: float32 mean of
/// squares, rsqrt(mean + eps), the product rounded to the element type, times weight[d] (dim values
/// of the element type), rounded again. One warp per row, 16-byte loads and stores where the rows
/// and weight allow (vLLM's vectorised RMSNorm), else element by element.
int bench_rms_norm(void* x, BenchElement element, const void* weight, int64_t rows, int64_t dim, float eps,
                   CUstream_st* stream);

}  // namespace rotary::cli
