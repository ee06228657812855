// Fused (flash) attention on tensor cores: flash_attention.cu's three parts for bf16 and f16
// data on GPUs of compute capability 8.0 and later, their products on the warps' mma.sync
// (warp_mma.cu: 16 x 16 by 16 x 8, f32 sums), in FlashAttention-2's shape (Dao, 2023): a block of
// four warps owns 64 rows (queries for the forward and dq, keys for dk and dv), 16 per warp, and
// walks the other sequence in tiles of 64 through shared memory. A warp's scores stay in its
// registers as the products left them, and become the next product's A operand where they are
// (an m16n8 result's two 8-column halves are the fragment of a 16-column slice): no score tile
// goes through shared memory, and the softmax's row maximum and sum are shuffles among the four
// lanes that hold a row. Probabilities, their gradients and the forward's adjoint enter the
// products rounded to the data's 16 bits, as FlashAttention-2's do; sums, the running maximum,
// the results and logsumexp are f32.
//
// Follows flash_attention.cu and warp_fragments.cu in one source (their Params, Rows, masks, row
// terms and fragments), and is checked as that file is: test_cuda_attention runs it through test/cuda_emulation.hpp, whose
// tensor-core product takes the same fragments. backend/cuda/cuda_flash_attention.hpp says when a
// call takes these kernels.
//
// Shared memory holds tiles of 16-bit patterns, rows D + 8 elements apart for a head of D (a
// multiple of 16): a warp reading 32-bit word t of rows g (lane 4 g + t, the fragments' pattern)
// then touches 32 banks. Columns from the head's width to D are zero, as they enter the products;
// the 8 padding elements are never read (the emulation's NaN in shared memory would show it).

namespace tsr_attention {

using tsr_mma::a_fragment;
using tsr_mma::b_fragment_of_columns;
using tsr_mma::b_fragment_of_rows;
using tsr_mma::mma;
using tsr_mma::pack;

constexpr int kMmaThreads = 128;  // four warps
constexpr int kMmaTile = 64;      // rows a block owns, and the other sequence's tile

// An element of the tile: the data's own bits, or an f32 (the forward's adjoint) rounded to them.
__device__ __forceinline__ uint16_t bits_of(Bf16 x, Bf16) { return x.bits; }
__device__ __forceinline__ uint16_t bits_of(F16 x, F16) { return x.bits; }
__device__ __forceinline__ uint16_t bits_of(float x, Bf16) { return tsr_f32_to_bf16(x); }
__device__ __forceinline__ uint16_t bits_of(float x, F16) { return tsr_f32_to_f16(x); }

// Eight 16-bit elements: one 16-byte load or store.
struct alignas(16) Eight {
  uint32_t words[4];
};

// Rows [0, rows) and columns [0, width) of a matrix of S (T, or f32 rounded to T) whose rows lie
// `stride` elements apart, into a tile of T's bits, kMmaTile rows `ld` apart and `columns` wide
// (a multiple of 16); zero elsewhere. Eight elements at a time where T's rows and the matrix
// start on 16 bytes.
template <class T, class S>
__device__ __forceinline__ void load_bits(uint16_t* tile, int ld, int columns, const S* from, long long rows, long long width,
                                          long long stride) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(from);
  if (sizeof(S) == 2 && width % 8 == 0 && stride % 8 == 0 && reinterpret_cast<unsigned long long>(bits) % 16 == 0) {
    const int chunks = columns / 8;
    for (int i = threadIdx.x; i < kMmaTile * chunks; i += kMmaThreads) {
      const int r = i / chunks, c = (i - r * chunks) * 8;
      Eight value = {{0, 0, 0, 0}};
      if (r < rows && c < width) value = *reinterpret_cast<const Eight*>(bits + r * stride + c);
      *reinterpret_cast<Eight*>(tile + r * ld + c) = value;
    }
    return;
  }
  for (int i = threadIdx.x; i < kMmaTile * columns; i += kMmaThreads) {
    const int r = i / columns, c = i - r * columns;
    tile[r * ld + c] = r < rows && c < width ? bits_of(from[r * stride + c], T()) : uint16_t(0);
  }
}

// acc (16 rows of a warp by N columns, N / 8 fragments) += tile_a rows [row0, row0 + 16) times
// tile_b's rows [0, N) transposed, over a depth of D (a multiple of 16): scores and d_out v^T.
template <class T, int N, int D>
__device__ __forceinline__ void rows_times_rows_mma(float (&acc)[N / 8][4], const uint16_t* tile_a, int lda, int row0,
                                                    const uint16_t* tile_b, int ldb) {
TSR_UNROLL
  for (int k0 = 0; k0 < D; k0 += 16) {
    uint32_t a[4];
    a_fragment(a, tile_a, lda, row0, k0);
TSR_UNROLL
    for (int n = 0; n < N / 8; ++n) {
      uint32_t b[2];
      b_fragment_of_rows(b, tile_b, ldb, 8 * n, k0);
      mma(acc[n], a, b, T());
    }
  }
}

// acc (16 rows by N columns) += p (the warp's 16 x kMmaTile probabilities or their gradient, in
// the registers a product left them) times the tile's rows [0, kMmaTile), columns [0, N).
template <class T, int N>
__device__ __forceinline__ void scores_times_tile_mma(float (&acc)[N / 8][4], const float (&p)[kMmaTile / 8][4], const uint16_t* tile,
                                                      int ld) {
TSR_UNROLL
  for (int k = 0; k < kMmaTile / 16; ++k) {
    const uint32_t a[4] = {pack(p[2 * k][0], p[2 * k][1], T()), pack(p[2 * k][2], p[2 * k][3], T()),
                           pack(p[2 * k + 1][0], p[2 * k + 1][1], T()), pack(p[2 * k + 1][2], p[2 * k + 1][3], T())};
TSR_UNROLL
    for (int n = 0; n < N / 8; ++n) {
      uint32_t b[2];
      b_fragment_of_columns(b, tile, ld, 16 * k, 8 * n);
      mma(acc[n], a, b, T());
    }
  }
}

// The largest and the sum among the four lanes that hold a row (lane bits 0 and 1).
__device__ __forceinline__ float quad_max(float x) {
  x = larger(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return larger(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
TSR_UNROLL
  for (int n = 0; n < N; ++n)
TSR_UNROLL
    for (int i = 0; i < 4; ++i) acc[n][i] = 0;
}

// Forward: block (b, query tile). Shared: q [64][DE + 8], k [64][DE + 8], v [64][DV + 8].
template <class T, int DE, int DV>
__device__ void forward_mma(const Params& p) {
  constexpr int LE = DE + 8, LV = DV + 8, NK = kMmaTile / 8;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r0 = threadIdx.x / 32 * 16;
  const Rows rows = block_rows<kMmaTile>(p.lq);
  const long long b = rows.b, i0 = rows.first, n = rows.count, keys = keys_seen(p, i0, n);
  uint16_t* qs = reinterpret_cast<uint16_t*>(tsr_shared_memory());
  uint16_t* ks = qs + kMmaTile * LE;
  uint16_t* vs = ks + kMmaTile * LE;
  const float none = minus_infinity(0.0f), scale = float(p.scale);
  load_bits<T>(qs, LE, DE, static_cast<const T*>(p.q) + (b * p.lq + i0) * p.e, n, p.e, p.e);
  // Row half h of a thread's registers is row r0 + g + 8 h: elements [2 h] and [2 h + 1].
  float m[2] = {none, none}, l[2] = {0, 0}, o[DV / 8][4];
  zero(o);
  for (long long j0 = 0; j0 < keys; j0 += kMmaTile) {
    const long long cols = smaller(kMmaTile, keys - j0);
    __syncthreads();  // every warp is done with the last tiles (and q is stored, the first time)
    load_bits<T>(ks, LE, DE, static_cast<const T*>(p.k) + (b * p.lk + j0) * p.e, cols, p.e, p.e);
    load_bits<T>(vs, LV, DV, static_cast<const T*>(p.v) + (b * p.lk + j0) * p.ev, cols, p.ev, p.ev);
    __syncthreads();
    float s[NK][4];
    zero(s);
    rows_times_rows_mma<T, kMmaTile, DE>(s, qs, LE, r0, ks, LE);
TSR_UNROLL
    for (int h = 0; h < 2; ++h) {
      const long long last = p.q_offset + i0 + r0 + g + 8 * h;  // the last key this query sees (causal)
      float top = none;
TSR_UNROLL
      for (int c = 0; c < NK; ++c)
TSR_UNROLL
        for (int e = 0; e < 2; ++e) {
          const long long col = 8 * c + 2 * t + e;
          const bool masked = col >= cols || (p.causal && j0 + col > last);
          float& x = s[c][2 * h + e];
          x = masked ? none : x * scale;
          top = larger(top, x);
        }
      top = quad_max(top);
      const float m_new = larger(m[h], top);
      const float reference = m_new == none ? 0.0f : m_new;  // a query that has seen no key yet
      const float alpha = exp_of(m[h] - reference);
      float sum = 0;
TSR_UNROLL
      for (int c = 0; c < NK; ++c)
TSR_UNROLL
        for (int e = 0; e < 2; ++e) {
          float& x = s[c][2 * h + e];
          x = exp_of(x - reference);
          sum += x;
        }
      l[h] = l[h] * alpha + quad_sum(sum);
      m[h] = m_new;
TSR_UNROLL
      for (int c = 0; c < DV / 8; ++c) {
        o[c][2 * h] *= alpha;
        o[c][2 * h + 1] *= alpha;
      }
    }
    scores_times_tile_mma<T, DV>(o, s, vs, LV);
  }
TSR_UNROLL
  for (int h = 0; h < 2; ++h) {
    const long long row = r0 + g + 8 * h;
    if (row >= n) continue;
    float* out = static_cast<float*>(p.out) + (b * p.lq + i0 + row) * (p.ev + 1);
    const bool seen = l[h] != 0.0f;  // else a shifted mask hid every key: output 0, logsumexp -inf
TSR_UNROLL
    for (int c = 0; c < DV / 8; ++c)
TSR_UNROLL
      for (int e = 0; e < 2; ++e)
        if (8 * c + 2 * t + e < p.ev) store(out + 8 * c + 2 * t + e, seen ? o[c][2 * h + e] / l[h] : 0.0f);
    if (t == 0) store(out + p.ev, seen ? m[h] + log_of(l[h]) : none);
  }
}

// dq: block (b, query tile). Shared: q [64][DE + 8], d_out [64][DV + 8], k [64][DE + 8],
// v [64][DV + 8], logsumexp [64], delta [64] (f32).
template <class T, int DE, int DV>
__device__ void grad_q_mma(const Params& p) {
  constexpr int LE = DE + 8, LV = DV + 8, NK = kMmaTile / 8;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r0 = threadIdx.x / 32 * 16;
  const Rows rows = block_rows<kMmaTile>(p.lq);
  const long long b = rows.b, i0 = rows.first, n = rows.count, keys = keys_seen(p, i0, n);
  uint16_t* qs = reinterpret_cast<uint16_t*>(tsr_shared_memory());
  uint16_t* gs = qs + kMmaTile * LE;
  uint16_t* ks = gs + kMmaTile * LV;
  uint16_t* vs = ks + kMmaTile * LE;
  float* lse = reinterpret_cast<float*>(vs + kMmaTile * LV);
  float* delta = lse + kMmaTile;
  const float scale = float(p.scale);
  const long long row0 = b * p.lq + i0;
  load_bits<T>(qs, LE, DE, static_cast<const T*>(p.q) + row0 * p.e, n, p.e, p.e);
  load_bits<T>(gs, LV, DV, static_cast<const float*>(p.d_out) + row0 * (p.ev + 1), n, p.ev, p.ev + 1);
  row_terms(lse, delta, kMmaTile, static_cast<const float*>(p.forward) + row0 * (p.ev + 1),
            static_cast<const float*>(p.d_out) + row0 * (p.ev + 1), n, p.ev);
  float dq[DE / 8][4];
  zero(dq);
  for (long long j0 = 0; j0 < keys; j0 += kMmaTile) {
    const long long cols = smaller(kMmaTile, keys - j0);
    __syncthreads();
    load_bits<T>(ks, LE, DE, static_cast<const T*>(p.k) + (b * p.lk + j0) * p.e, cols, p.e, p.e);
    load_bits<T>(vs, LV, DV, static_cast<const T*>(p.v) + (b * p.lk + j0) * p.ev, cols, p.ev, p.ev);
    __syncthreads();
    float s[NK][4], dp[NK][4];
    zero(s);
    zero(dp);
    rows_times_rows_mma<T, kMmaTile, DE>(s, qs, LE, r0, ks, LE);
    rows_times_rows_mma<T, kMmaTile, DV>(dp, gs, LV, r0, vs, LV);
    // s becomes dS = P (dP - delta).
TSR_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + g + 8 * h;
      const long long last = p.q_offset + i0 + row;
TSR_UNROLL
      for (int c = 0; c < NK; ++c)
TSR_UNROLL
        for (int e = 0; e < 2; ++e) {
          const long long col = 8 * c + 2 * t + e;
          const bool masked = col >= cols || (p.causal && j0 + col > last);
          const float prob = masked ? 0.0f : exp_of(s[c][2 * h + e] * scale - lse[row]);
          s[c][2 * h + e] = prob * (dp[c][2 * h + e] - delta[row]);
        }
    }
    scores_times_tile_mma<T, DE>(dq, s, ks, LE);
  }
TSR_UNROLL
  for (int h = 0; h < 2; ++h) {
    const long long row = r0 + g + 8 * h;
    if (row >= n) continue;
    float* out = static_cast<float*>(p.out) + (row0 + row) * p.e;
TSR_UNROLL
    for (int c = 0; c < DE / 8; ++c)
TSR_UNROLL
      for (int e = 0; e < 2; ++e)
        if (8 * c + 2 * t + e < p.e) store(out + 8 * c + 2 * t + e, dq[c][2 * h + e] * scale);
  }
}

// dk and dv: block (b, key tile); a warp's registers hold P^T and dS^T, keys by queries. Shared:
// k [64][DE + 8], v [64][DV + 8], q [64][DE + 8], d_out [64][DV + 8], logsumexp [64], delta [64].
template <class T, int DE, int DV>
__device__ void grad_kv_mma(const Params& p) {
  constexpr int LE = DE + 8, LV = DV + 8, NK = kMmaTile / 8;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r0 = threadIdx.x / 32 * 16;
  const Rows own = block_rows<kMmaTile>(p.lk);
  const long long b = own.b, j0 = own.first, n = own.count;
  // Queries before `first` see none of these keys under a causal mask.
  const long long first = p.causal ? clamp_to(j0 - p.q_offset, 0, p.lq) : 0;
  uint16_t* ks = reinterpret_cast<uint16_t*>(tsr_shared_memory());
  uint16_t* vs = ks + kMmaTile * LE;
  uint16_t* qs = vs + kMmaTile * LV;
  uint16_t* gs = qs + kMmaTile * LE;
  float* lse = reinterpret_cast<float*>(gs + kMmaTile * LV);
  float* delta = lse + kMmaTile;
  const float scale = float(p.scale);
  load_bits<T>(ks, LE, DE, static_cast<const T*>(p.k) + (b * p.lk + j0) * p.e, n, p.e, p.e);
  load_bits<T>(vs, LV, DV, static_cast<const T*>(p.v) + (b * p.lk + j0) * p.ev, n, p.ev, p.ev);
  float dk[DE / 8][4], dv[DV / 8][4];
  zero(dk);
  zero(dv);
  for (long long i0 = first; i0 < p.lq; i0 += kMmaTile) {
    const long long rows = smaller(kMmaTile, p.lq - i0), row0 = b * p.lq + i0;
    __syncthreads();
    load_bits<T>(qs, LE, DE, static_cast<const T*>(p.q) + row0 * p.e, rows, p.e, p.e);
    load_bits<T>(gs, LV, DV, static_cast<const float*>(p.d_out) + row0 * (p.ev + 1), rows, p.ev, p.ev + 1);
    row_terms(lse, delta, kMmaTile, static_cast<const float*>(p.forward) + row0 * (p.ev + 1),
              static_cast<const float*>(p.d_out) + row0 * (p.ev + 1), rows, p.ev);
    __syncthreads();
    float pt[NK][4];
    zero(pt);
    rows_times_rows_mma<T, kMmaTile, DE>(pt, ks, LE, r0, qs, LE);
TSR_UNROLL
    for (int h = 0; h < 2; ++h) {
      const long long key = r0 + g + 8 * h;
TSR_UNROLL
      for (int c = 0; c < NK; ++c)
TSR_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int query = 8 * c + 2 * t + e;
          const bool masked = query >= rows || (p.causal && j0 + key > p.q_offset + i0 + query);
          pt[c][2 * h + e] = masked ? 0.0f : exp_of(pt[c][2 * h + e] * scale - lse[query]);
        }
    }
    scores_times_tile_mma<T, DV>(dv, pt, gs, LV);
    float dst[NK][4];
    zero(dst);
    rows_times_rows_mma<T, kMmaTile, DV>(dst, vs, LV, r0, gs, LV);
TSR_UNROLL
    for (int c = 0; c < NK; ++c)
TSR_UNROLL
      for (int i = 0; i < 4; ++i) dst[c][i] = pt[c][i] * (dst[c][i] - delta[8 * c + 2 * t + i % 2]);
    scores_times_tile_mma<T, DE>(dk, dst, qs, LE);
  }
TSR_UNROLL
  for (int h = 0; h < 2; ++h) {
    const long long key = r0 + g + 8 * h;
    if (key >= n) continue;
    float* out = static_cast<float*>(p.out) + (b * p.lk + j0 + key) * (p.e + p.ev);
TSR_UNROLL
    for (int c = 0; c < DE / 8; ++c)
TSR_UNROLL
      for (int e = 0; e < 2; ++e)
        if (8 * c + 2 * t + e < p.e) store(out + 8 * c + 2 * t + e, dk[c][2 * h + e] * scale);
TSR_UNROLL
    for (int c = 0; c < DV / 8; ++c)
TSR_UNROLL
      for (int e = 0; e < 2; ++e)
        if (8 * c + 2 * t + e < p.ev) store(out + p.e + 8 * c + 2 * t + e, dv[c][2 * h + e]);
  }
}

}  // namespace tsr_attention
