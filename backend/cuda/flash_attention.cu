// Fused (flash) attention on CUDA devices: the attention primitive's three parts
// (dsl/attention_parts.hpp) in FlashAttention-2's tiling (Dao, 2023). A thread block owns a tile
// of rows (queries for the forward and dq, keys for dk and dv) and walks the other sequence in
// tiles through shared memory; the forward keeps a running maximum and sum per query (online
// softmax) and writes each query's logsumexp beside its output, and the gradients recompute the
// probabilities from it, so no [lq, lk] matrix exists in memory. Sums are f32 (f64 for f64
// data), and so are the results, the forward's output the gradients read and its adjoint (the
// primitive's contract, dsl/attention.hpp); q, k and v may be bf16 or f16, read through the
// kernel prelude's conversions (codegen/cuda_prelude.cpp).
//
// One source, two compilers: NVRTC compiles it for the GPU (backend/cuda/cuda_flash_attention.cpp
// prepends the prelude and storage_types.cu and appends one `extern "C"` entry per
// instantiation), and a C++ compiler
// compiles it after test/cuda_emulation.hpp, which runs every thread of a block as a host thread
// with real barriers, so test_cuda_attention checks this very code against the CPU's kernel
// (backend/cuda/cuda_flash_attention.hpp says which instantiation a call takes).
//
// Threads: 256 per block, as a 16 x 16 grid: tx = threadIdx.x % 16 runs along a tile's columns
// (column tx + 16 c), ty along its rows (rows ty * MR to ty * MR + MR - 1). The 16 threads of one
// row group are one half of a warp, so a row's maximum and sum are shuffles over lane masks 1-8.
// Shared-memory tiles of head-dim width have rows 16 * C + 1 elements apart (C = columns per
// thread): reading a column across 16 threads then hits 16 banks, and a thread's last column
// stays inside its row. Those padding elements are never initialised; what they feed is never
// stored (the emulation fills shared memory with NaN to keep that true).


namespace tsr_attention {

constexpr int kThreads = 256;
constexpr int kSide = 16;

// The kernel's one argument, by value. Its layout is FlashAttentionParams's
// (backend/cuda/cuda_flash_attention.hpp); test_cuda_attention compares the two.
struct Params {
  const void* q;        // [batch, lq, e]
  const void* k;        // [batch, lk, e]
  const void* v;        // [batch, lk, ev]
  const void* forward;  // gradients: the forward's output [batch, lq, ev + 1] (logsumexp last), in SumType
  const void* d_out;    // gradients: its adjoint [batch, lq, ev + 1], in SumType
  void* out;            // forward [batch, lq, ev + 1]; dq [batch, lq, e]; dkv [batch, lk, e + ev]: SumType
  long long batch, lq, lk, e, ev;
  long long q_offset;   // the global position of query 0 among the keys (the causal mask's)
  double scale;
  int causal;
};

// Element types and their conversions: storage_types.cu, which comes before this file.
using tsr_storage::Bf16;
using tsr_storage::F16;
using tsr_storage::SumType;
using tsr_storage::widen;
using tsr_storage::store;

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float minus_infinity(float) { return __int_as_float(int(0xff800000u)); }
__device__ __forceinline__ double minus_infinity(double) { return __longlong_as_double((long long)0xfff0000000000000ull); }
template <class A> __device__ __forceinline__ A larger(A a, A b) { return a > b ? a : b; }
__device__ __forceinline__ long long clamp_to(long long x, long long lo, long long hi) { return x < lo ? lo : x > hi ? hi : x; }
__device__ __forceinline__ long long smaller(long long a, long long b) { return a < b ? a : b; }

// The maximum and the sum over a row's 16 threads (one half of a warp); every one gets it.
template <class A> __device__ __forceinline__ A row_max(A x) {
  for (int mask = 1; mask < kSide; mask <<= 1) x = larger(x, __shfl_xor_sync(0xffffffffu, x, mask));
  return x;
}
template <class A> __device__ __forceinline__ A row_sum(A x) {
  for (int mask = 1; mask < kSide; mask <<= 1) x += __shfl_xor_sync(0xffffffffu, x, mask);
  return x;
}

// Rows [0, rows) of a matrix of `width` columns whose rows lie `stride` elements apart, widened
// into the tile (rows `ld` apart); the tile's rows past `rows` are zero.
template <class T, class A>
__device__ __forceinline__ void load_tile(A* tile, int ld, int tile_rows, const T* from, long long rows, long long width,
                                          long long stride) {
  const long long count = tile_rows * width;
  for (long long i = threadIdx.x; i < count; i += kThreads) {
    const long long r = i / width, c = i - r * width;
    tile[r * ld + c] = r < rows ? A(widen(from[r * stride + c])) : A(0);
  }
}

// acc[r][c] += sum over d < depth of a[row r][d] * b[column c][d]: a tile times another's
// transpose, both rows of head-dim width (scores, and the gradient's d_out v^T).
template <class A, int MR, int MC>
__device__ __forceinline__ void rows_times_rows(A (&acc)[MR][MC], const A* a, int lda, const A* b, int ldb, int depth) {
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  for (int d = 0; d < depth; ++d) {
    A x[MR], y[MC];
TSR_UNROLL
    for (int r = 0; r < MR; ++r) x[r] = a[(ty * MR + r) * lda + d];
TSR_UNROLL
    for (int c = 0; c < MC; ++c) y[c] = b[(tx + kSide * c) * ldb + d];
TSR_UNROLL
    for (int r = 0; r < MR; ++r)
TSR_UNROLL
      for (int c = 0; c < MC; ++c) acc[r][c] += x[r] * y[c];
  }
}

// acc[r][c] += sum over j < depth of p[row r][j] * b[j][column c]: probabilities (or their
// gradient) times a tile of head-dim rows.
template <class A, int MR, int C>
__device__ __forceinline__ void rows_times_tile(A (&acc)[MR][C], const A* p, int ldp, const A* b, int ldb, int depth) {
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  for (int j = 0; j < depth; ++j) {
    A x[MR], y[C];
TSR_UNROLL
    for (int r = 0; r < MR; ++r) x[r] = p[(ty * MR + r) * ldp + j];
TSR_UNROLL
    for (int c = 0; c < C; ++c) y[c] = b[j * ldb + tx + kSide * c];
TSR_UNROLL
    for (int r = 0; r < MR; ++r)
TSR_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] += x[r] * y[c];
  }
}

// Each query's logsumexp and delta = d_out . out - d_logsumexp (the softmax gradient's row
// term) for queries [0, rows); zero past them. The rows go to the block's warps in turn and a
// row's columns to a warp's lanes, so each read of a row is one coalesced access and its sum a
// warp's shuffle reduction (dk and dv's kernel computes these for every tile of queries it
// meets: a thread per row, reading along its row, made those reads one transaction per element
// and took most of the gradients' time).
template <class A>
__device__ __forceinline__ void row_terms(A* lse, A* delta, int tile_rows, const A* forward, const A* d_out, long long rows,
                                          long long ev) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int r = threadIdx.x / 32; r < tile_rows; r += warps) {  // uniform in a warp, as the shuffles need
    const A* o = forward + r * (ev + 1);
    const A* g = d_out + r * (ev + 1);
    A d = 0;
    if (r < rows)
      for (long long c = lane; c < ev; c += 32) d += g[c] * o[c];
    for (int mask = 1; mask < 32; mask <<= 1) d += __shfl_xor_sync(0xffffffffu, d, mask);
    if (lane == 0) {
      lse[r] = r < rows ? o[ev] : A(0);
      delta[r] = r < rows ? d - g[ev] : A(0);
    }
  }
}

// The rows a block owns: its leading (batch) index, its first row and how many it has (the last
// tile of a sequence may be short).
struct Rows {
  long long b, first, count;
};
template <int TILE>
__device__ __forceinline__ Rows block_rows(long long length) {
  const long long tiles = (length + TILE - 1) / TILE;
  Rows r;
  r.b = blockIdx.x / tiles;
  r.first = blockIdx.x % tiles * TILE;
  r.count = smaller(TILE, length - r.first);
  return r;
}
// The keys [0, end) some query of rows [first, first + count) sees.
__device__ __forceinline__ long long keys_seen(const Params& p, long long first, long long count) {
  return p.causal ? clamp_to(p.q_offset + first + count, 0, p.lk) : p.lk;
}

// Forward: block (b, query tile). Shared: q [TILE][16 CE + 1], k [TILE][16 CE + 1],
// v [TILE][16 CV + 1], p [TILE][TILE].
template <class T, int TILE, int CE, int CV>
__device__ void forward(const Params& p) {
  typedef typename SumType<T>::type A;
  constexpr int MR = TILE / kSide, MC = TILE / kSide, SE = kSide * CE + 1, SV = kSide * CV + 1;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const Rows rows = block_rows<TILE>(p.lq);
  const long long b = rows.b, i0 = rows.first, n = rows.count, keys = keys_seen(p, i0, n);
  A* qs = reinterpret_cast<A*>(tsr_shared_memory());
  A* ks = qs + TILE * SE;
  A* vs = ks + TILE * SE;
  A* ps = vs + TILE * SV;
  const A none = minus_infinity(A()), scale = A(p.scale);
  load_tile(qs, SE, TILE, static_cast<const T*>(p.q) + (b * p.lq + i0) * p.e, n, p.e, p.e);
  A m[MR], l[MR], o[MR][CV];
TSR_UNROLL
  for (int r = 0; r < MR; ++r) {
    m[r] = none;
    l[r] = 0;
TSR_UNROLL
    for (int c = 0; c < CV; ++c) o[r][c] = 0;
  }
  for (long long j0 = 0; j0 < keys; j0 += TILE) {
    const long long cols = smaller(TILE, keys - j0);
    load_tile(ks, SE, TILE, static_cast<const T*>(p.k) + (b * p.lk + j0) * p.e, cols, p.e, p.e);
    load_tile(vs, SV, TILE, static_cast<const T*>(p.v) + (b * p.lk + j0) * p.ev, cols, p.ev, p.ev);
    __syncthreads();
    A s[MR][MC];
TSR_UNROLL
    for (int r = 0; r < MR; ++r)
TSR_UNROLL
      for (int c = 0; c < MC; ++c) s[r][c] = 0;
    rows_times_rows(s, qs, SE, ks, SE, int(p.e));
TSR_UNROLL
    for (int r = 0; r < MR; ++r) {
      const long long last = p.q_offset + i0 + ty * MR + r;  // the last key this query sees (causal)
      A top = none;
TSR_UNROLL
      for (int c = 0; c < MC; ++c) {
        const long long col = tx + kSide * c;
        const bool masked = col >= cols || (p.causal && j0 + col > last);
        s[r][c] = masked ? none : s[r][c] * scale;
        top = larger(top, s[r][c]);
      }
      top = row_max(top);
      const A m_new = larger(m[r], top);
      const A reference = m_new == none ? A(0) : m_new;  // a query that has seen no key yet
      const A alpha = exp_of(m[r] - reference);
      A sum = 0;
TSR_UNROLL
      for (int c = 0; c < MC; ++c) {
        s[r][c] = exp_of(s[r][c] - reference);
        sum += s[r][c];
        ps[(ty * MR + r) * TILE + tx + kSide * c] = s[r][c];
      }
      l[r] = l[r] * alpha + row_sum(sum);
      m[r] = m_new;
TSR_UNROLL
      for (int c = 0; c < CV; ++c) o[r][c] *= alpha;
    }
    __syncthreads();
    rows_times_tile(o, ps, TILE, vs, SV, int(cols));
    __syncthreads();
  }
TSR_UNROLL
  for (int r = 0; r < MR; ++r) {
    const long long row = ty * MR + r;
    if (row >= n) continue;
    A* out = static_cast<A*>(p.out) + (b * p.lq + i0 + row) * (p.ev + 1);
    const bool seen = l[r] != A(0);  // else a shifted mask hid every key: output 0, logsumexp -inf
TSR_UNROLL
    for (int c = 0; c < CV; ++c)
      if (tx + kSide * c < p.ev) store(out + tx + kSide * c, seen ? o[r][c] / l[r] : A(0));
    if (tx == 0) store(out + p.ev, seen ? m[r] + log_of(l[r]) : none);
  }
}

// dq: block (b, query tile). Shared: q [TILE][SE], d_out [TILE][SV], k [TILE][SE], v [TILE][SV],
// dS [TILE][TILE], logsumexp [TILE], delta [TILE].
template <class T, int TILE, int CE, int CV>
__device__ void grad_q(const Params& p) {
  typedef typename SumType<T>::type A;
  constexpr int MR = TILE / kSide, MC = TILE / kSide, SE = kSide * CE + 1, SV = kSide * CV + 1;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const Rows rows = block_rows<TILE>(p.lq);
  const long long b = rows.b, i0 = rows.first, n = rows.count, keys = keys_seen(p, i0, n);
  A* qs = reinterpret_cast<A*>(tsr_shared_memory());
  A* gs = qs + TILE * SE;
  A* ks = gs + TILE * SV;
  A* vs = ks + TILE * SE;
  A* dss = vs + TILE * SV;
  A* lse = dss + TILE * TILE;
  A* delta = lse + TILE;
  const A scale = A(p.scale);
  const long long row0 = b * p.lq + i0;
  load_tile(qs, SE, TILE, static_cast<const T*>(p.q) + row0 * p.e, n, p.e, p.e);
  load_tile(gs, SV, TILE, static_cast<const A*>(p.d_out) + row0 * (p.ev + 1), n, p.ev, p.ev + 1);
  row_terms(lse, delta, TILE, static_cast<const A*>(p.forward) + row0 * (p.ev + 1),
            static_cast<const A*>(p.d_out) + row0 * (p.ev + 1), n, p.ev);
  A dq[MR][CE];
TSR_UNROLL
  for (int r = 0; r < MR; ++r)
TSR_UNROLL
    for (int c = 0; c < CE; ++c) dq[r][c] = 0;
  for (long long j0 = 0; j0 < keys; j0 += TILE) {
    const long long cols = smaller(TILE, keys - j0);
    load_tile(ks, SE, TILE, static_cast<const T*>(p.k) + (b * p.lk + j0) * p.e, cols, p.e, p.e);
    load_tile(vs, SV, TILE, static_cast<const T*>(p.v) + (b * p.lk + j0) * p.ev, cols, p.ev, p.ev);
    __syncthreads();
    A s[MR][MC], dp[MR][MC];
TSR_UNROLL
    for (int r = 0; r < MR; ++r)
TSR_UNROLL
      for (int c = 0; c < MC; ++c) s[r][c] = dp[r][c] = 0;
    rows_times_rows(s, qs, SE, ks, SE, int(p.e));
    rows_times_rows(dp, gs, SV, vs, SV, int(p.ev));
TSR_UNROLL
    for (int r = 0; r < MR; ++r) {
      const long long row = ty * MR + r, last = p.q_offset + i0 + row;
TSR_UNROLL
      for (int c = 0; c < MC; ++c) {
        const long long col = tx + kSide * c;
        const bool masked = col >= cols || (p.causal && j0 + col > last);
        const A prob = masked ? A(0) : exp_of(s[r][c] * scale - lse[row]);
        dss[row * TILE + col] = prob * (dp[r][c] - delta[row]);
      }
    }
    __syncthreads();
    rows_times_tile(dq, dss, TILE, ks, SE, int(cols));
    __syncthreads();
  }
TSR_UNROLL
  for (int r = 0; r < MR; ++r) {
    const long long row = ty * MR + r;
    if (row >= n) continue;
    A* out = static_cast<A*>(p.out) + (row0 + row) * p.e;
TSR_UNROLL
    for (int c = 0; c < CE; ++c)
      if (tx + kSide * c < p.e) store(out + tx + kSide * c, dq[r][c] * scale);
  }
}

// dk and dv: block (b, key tile). Shared: k [TILE][SE], v [TILE][SV], q [TILE][SE],
// d_out [TILE][SV], P^T [TILE][TILE], dS^T [TILE][TILE], logsumexp [TILE], delta [TILE].
template <class T, int TILE, int CE, int CV>
__device__ void grad_kv(const Params& p) {
  typedef typename SumType<T>::type A;
  constexpr int MR = TILE / kSide, MC = TILE / kSide, SE = kSide * CE + 1, SV = kSide * CV + 1;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const Rows own = block_rows<TILE>(p.lk);
  const long long b = own.b, j0 = own.first, n = own.count;
  // Queries before `first` see none of these keys under a causal mask.
  const long long first = p.causal ? clamp_to(j0 - p.q_offset, 0, p.lq) : 0;
  A* ks = reinterpret_cast<A*>(tsr_shared_memory());
  A* vs = ks + TILE * SE;
  A* qs = vs + TILE * SV;
  A* gs = qs + TILE * SE;
  A* pts = gs + TILE * SV;
  A* dsts = pts + TILE * TILE;
  A* lse = dsts + TILE * TILE;
  A* delta = lse + TILE;
  const A scale = A(p.scale);
  load_tile(ks, SE, TILE, static_cast<const T*>(p.k) + (b * p.lk + j0) * p.e, n, p.e, p.e);
  load_tile(vs, SV, TILE, static_cast<const T*>(p.v) + (b * p.lk + j0) * p.ev, n, p.ev, p.ev);
  A dk[MR][CE], dv[MR][CV];
TSR_UNROLL
  for (int r = 0; r < MR; ++r) {
TSR_UNROLL
    for (int c = 0; c < CE; ++c) dk[r][c] = 0;
TSR_UNROLL
    for (int c = 0; c < CV; ++c) dv[r][c] = 0;
  }
  for (long long i0 = first; i0 < p.lq; i0 += TILE) {
    const long long rows = smaller(TILE, p.lq - i0), row0 = b * p.lq + i0;
    load_tile(qs, SE, TILE, static_cast<const T*>(p.q) + row0 * p.e, rows, p.e, p.e);
    load_tile(gs, SV, TILE, static_cast<const A*>(p.d_out) + row0 * (p.ev + 1), rows, p.ev, p.ev + 1);
    row_terms(lse, delta, TILE, static_cast<const A*>(p.forward) + row0 * (p.ev + 1),
              static_cast<const A*>(p.d_out) + row0 * (p.ev + 1), rows, p.ev);
    __syncthreads();
    A st[MR][MC], dpt[MR][MC];
TSR_UNROLL
    for (int r = 0; r < MR; ++r)
TSR_UNROLL
      for (int c = 0; c < MC; ++c) st[r][c] = dpt[r][c] = 0;
    rows_times_rows(st, ks, SE, qs, SE, int(p.e));
    rows_times_rows(dpt, vs, SV, gs, SV, int(p.ev));
TSR_UNROLL
    for (int r = 0; r < MR; ++r) {
      const long long key = ty * MR + r;
TSR_UNROLL
      for (int c = 0; c < MC; ++c) {
        const long long query = tx + kSide * c;
        const bool masked = query >= rows || (p.causal && j0 + key > p.q_offset + i0 + query);
        const A prob = masked ? A(0) : exp_of(st[r][c] * scale - lse[query]);
        pts[key * TILE + query] = prob;
        dsts[key * TILE + query] = prob * (dpt[r][c] - delta[query]);
      }
    }
    __syncthreads();
    rows_times_tile(dv, pts, TILE, gs, SV, int(rows));
    rows_times_tile(dk, dsts, TILE, qs, SE, int(rows));
    __syncthreads();
  }
TSR_UNROLL
  for (int r = 0; r < MR; ++r) {
    const long long key = ty * MR + r;
    if (key >= n) continue;
    A* out = static_cast<A*>(p.out) + (b * p.lk + j0 + key) * (p.e + p.ev);
TSR_UNROLL
    for (int c = 0; c < CE; ++c)
      if (tx + kSide * c < p.e) store(out + tx + kSide * c, dk[r][c] * scale);
TSR_UNROLL
    for (int c = 0; c < CV; ++c)
      if (tx + kSide * c < p.ev) store(out + p.e + tx + kSide * c, dv[r][c]);
  }
}

}  // namespace tsr_attention
