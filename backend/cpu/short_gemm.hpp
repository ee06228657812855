#pragma once
// Row-major f32 GEMM through LIBXSMM's JIT kernels, tiled into blocks of at most 128 rows and 48
// columns that read the weight where it lies. OpenBLAS packs the whole weight on every call (with
// 64 or 128 rows that copy costs 15-25% of the product), and Debian's OpenBLAS 0.3.21 runs AVX2
// kernels on AVX-512 machines such as AMD Zen 4: a [2048, 128] x [128, 512] product ran at half
// the speed of the same rows as sixteen 128-row LIBXSMM blocks.
#include <cstdint>
#include <functional>

namespace tessera {

// Runs part(0..parts-1) (on a device's cores) and waits; empty: one after another on this thread.
using PartRunner = std::function<void(int parts, const std::function<void(int)>& part)>;

// out[i] = op(a[i])[m, k] x op(b[i])[k, n] for i < batch (contiguous batches), op = transpose when
// the flag is set (the buffer then holds the operand's transpose). A transposed b is first copied
// into [k, n] rows, which costs k*n, little beside the product once there are kPackedWeightMinRows
// rows. The tiles are shared among `parts` parts run by `run`. Returns false, doing nothing, when
// it cannot do better than BLAS (a transposed b with fewer rows, LIBXSMM absent from the build).
// Deterministic programs never call it: host_gemm takes its ordered path first, since a
// device's row count must not pick the summation order.
bool short_sgemm(int64_t batch, int64_t m, int64_t n, int64_t k, const float* a, bool trans_a, const float* b,
                 bool trans_b, float* out, int parts = 1, const PartRunner& run = {});

// The same for bf16 operands on CPUs with AVX512-BF16 (LIBXSMM's VDPBF16PS kernels): sums in f32,
// each output rounded once to bf16. op(b) is packed into LIBXSMM's VNNI layout (pairs of rows
// interleaved), and op(a) into rows when it is stored transposed or k is odd (k is padded to
// even with zeros). Returns false, doing nothing, when the CPU lacks AVX512-BF16 or LIBXSMM is
// absent: host_gemm then widens the operands to f32.
bool short_bf16_gemm(int64_t batch, int64_t m, int64_t n, int64_t k, const uint16_t* a, bool trans_a, const uint16_t* b,
                     bool trans_b, uint16_t* out, int parts = 1, const PartRunner& run = {});

// Whether f32 GEMMs should take short_sgemm: on AVX-512 machines, whose Debian OpenBLAS may run
// AVX2 kernels; on AVX2 machines OpenBLAS is as fast on every shape measured. TESSERA_SHORT_GEMM=0
// or 1 decides instead (for comparisons).
bool short_gemm_preferred();

inline constexpr int64_t kShortGemmRowBlock = 128;
inline constexpr int64_t kPackedWeightMinRows = 32;

}  // namespace tessera
