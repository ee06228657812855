#include "backend/cpu/transpose_16bit.hpp"

#include <algorithm>
#include <array>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

constexpr int64_t kTile = 32;

// Elsewhere: 32 x 32 tiles element by element, so each cache line read serves a tile's row.
void transpose_by_elements(const uint16_t* from, int64_t rows, int64_t cols, int64_t from_stride, uint16_t* to, int64_t to_stride) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) to[c * to_stride + r] = from[r * from_stride + c];
}

#if defined(__x86_64__)
bool cpu_has_avx512bw() {
  static const bool has = __builtin_cpu_supports("avx512bw");
  return has;
}

// For each round h = 16, 8, 4, 2, 1, the two-register permutes that swap the off-diagonal
// h x h blocks of every 2h x 2h block: rows i and i + h (bit h of i clear) become
// low: i's columns with bit h clear, then i + h's; high: i's columns with bit h set, then i + h's.
// (Indices 32..63 pick from the second register.)
struct SwapIndices {
  alignas(64) std::array<std::array<uint16_t, kTile>, 5> low{}, high{};
  constexpr SwapIndices() {
    for (int round = 0, h = 16; round < 5; ++round, h /= 2)
      for (int c = 0; c < kTile; ++c) {
        low[size_t(round)][size_t(c)] = uint16_t((c & h) ? kTile + c - h : c);
        high[size_t(round)][size_t(c)] = uint16_t((c & h) ? kTile + c : c + h);
      }
  }
};
constexpr SwapIndices kSwaps;

// One tile of up to 32 x 32 through the 32 vector registers. Each round swaps one bit of the row
// index with the same bit of the column index; after all five, element (r, c) sits at (c, r).
// Rows and columns past the matrix's edge are loaded as zeros and not stored.
__attribute__((target("avx512f,avx512bw")))
void transpose_tile(const uint16_t* from, int64_t rows, int64_t cols, int64_t from_stride, uint16_t* to, int64_t to_stride) {
  __m512i r[kTile];
  const __mmask32 columns = cols >= kTile ? ~__mmask32(0) : (__mmask32(1) << cols) - 1;
  for (int i = 0; i < kTile; ++i) r[i] = i < rows ? _mm512_maskz_loadu_epi16(columns, from + i * from_stride) : _mm512_setzero_si512();
  for (int round = 0, h = 16; round < 5; ++round, h /= 2) {
    const __m512i low = _mm512_loadu_si512(kSwaps.low[size_t(round)].data());
    const __m512i high = _mm512_loadu_si512(kSwaps.high[size_t(round)].data());
    for (int i = 0; i < kTile; ++i) {
      if (i & h) continue;
      const __m512i a = r[i], b = r[i + h];
      r[i] = _mm512_permutex2var_epi16(a, low, b);
      r[i + h] = _mm512_permutex2var_epi16(a, high, b);
    }
  }
  const __mmask32 stored_rows = rows >= kTile ? ~__mmask32(0) : (__mmask32(1) << rows) - 1;
  for (int64_t c = 0; c < cols; ++c) _mm512_mask_storeu_epi16(to + c * to_stride, stored_rows, r[c]);
}
#endif

}  // namespace

void transpose_16bit(const uint16_t* from, int64_t rows, int64_t cols, int64_t from_stride, uint16_t* to, int64_t to_stride) {
#if defined(__x86_64__)
  if (cpu_has_avx512bw()) {
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c0 = 0; c0 < cols; c0 += kTile)
        transpose_tile(from + r0 * from_stride + c0, std::min(kTile, rows - r0), std::min(kTile, cols - c0), from_stride,
                       to + c0 * to_stride + r0, to_stride);
    return;
  }
#endif
  transpose_by_elements(from, rows, cols, from_stride, to, to_stride);
}

}  // namespace tessera
