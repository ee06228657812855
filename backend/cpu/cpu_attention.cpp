#include "backend/cpu/cpu_attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

// Built with -ffp-contract=fast (jit/meson.build): the tile products' multiply-adds become FMAs.
// Contraction is decided at compile time, so the bits still do not depend on the mesh.

namespace tessera {
namespace {

// One vector register of the machine the library is compiled for (-march=native by default):
// 64 bytes with AVX-512, 32 with AVX, else 16; and the integer vector of the same lanes that
// comparisons give. A wider GCC vector than the registers would be split into several, and the
// tiles' accumulators would no longer fit in registers (on an AVX2 machine 64-byte vectors made
// the fused attention 4x slower than the unfused ops).
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64, kVectorRegisters = 32;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32, kVectorRegisters = 16;
#else
constexpr int kVectorBytes = 16, kVectorRegisters = 16;
#endif
template <class T>
struct VectorOf;
template <>
struct VectorOf<float> {
  typedef float type __attribute__((vector_size(kVectorBytes)));
  typedef int32_t mask __attribute__((vector_size(kVectorBytes)));
  using lane = int32_t;
};
template <>
struct VectorOf<double> {
  typedef double type __attribute__((vector_size(kVectorBytes)));
  typedef int64_t mask __attribute__((vector_size(kVectorBytes)));
  using lane = int64_t;
};
template <class T>
using Vec = typename VectorOf<T>::type;
template <class T>
using Mask = typename VectorOf<T>::mask;
template <class T>
constexpr int64_t kLanes = int64_t(kVectorBytes / sizeof(T));

// Rows a unit of work owns (queries; keys in grad_kv), and the other sequence's tile width.
constexpr int64_t kRowBlock = 32;
constexpr int64_t kColumnBlock = 64;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

template <class T>
Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
Vec<T> splat(T x) {
  return Vec<T>{} + x;
}
// Every lane `value`, and lane numbers first, first + 1, ... (compared with it to mask columns).
template <class T>
Mask<T> splat_mask(int64_t value) {
  return Mask<T>{} + typename VectorOf<T>::lane(value);
}
template <class T>
Mask<T> lane_numbers() {
  Mask<T> out{};
  for (int64_t i = 0; i < kLanes<T>; ++i) out[i] = typename VectorOf<T>::lane(i);
  return out;
}
template <class T>
Mask<T> lanes_from(int64_t first) {
  return lane_numbers<T>() + splat_mask<T>(first);
}
template <class T>
T lane_sum(const Vec<T>& v) {
  T s = 0;
  for (int64_t i = 0; i < kLanes<T>; ++i) s += v[i];
  return s;
}
template <class T>
T lane_max(const Vec<T>& v) {
  T m = v[0];
  for (int64_t i = 1; i < kLanes<T>; ++i) m = std::max(m, v[i]);
  return m;
}

// e^x in lanes. f32: the polynomial of codegen/math_functions (Cephes' expf), branch-free so it
// stays in vector registers; x < -87.3 gives 0, so masked scores may pass through it.
Vec<float> exp_lanes(Vec<float> x) {
  using V = Vec<float>;
  using M = Mask<float>;
  const V lo = splat(-87.3365447f), hi = splat(88.7228391f);
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const V t = xc * 1.44269504088896341f + 0.5f;
  V n = __builtin_convertvector(__builtin_convertvector(t, M), V);  // truncated, then floored
  n = n > t ? n - 1.0f : n;
  const V r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  V p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const V e = p * r * r + r + 1.0f;
  const M bits = (__builtin_convertvector(n, M) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  V result = e * scale;
  result = x > hi ? splat(std::numeric_limits<float>::infinity()) : result;
  result = x < lo ? V{} : result;
  return x != x ? x : result;
}
// f64 (tests and f64 models): the library's exp lane by lane.
Vec<double> exp_lanes(Vec<double> x) {
  for (int64_t i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
  return x;
}

// A left operand read through strides: element (r, p) at a[r * row + p * step], so a tile and its
// transpose are both operands without a copy.
template <class T>
struct Strided {
  const T* a;
  int64_t row, step;
};

// c[r, :cols] (+)= sum over p < depth, in order, of a(r, p) * b[p, :cols] for R rows and V vectors
// of columns, held in registers. Every element is its own chain of multiply-adds in p order, so
// neither R nor V (nor which rows share a call) changes its bits.
template <class T, int R, int V>
void tile(int64_t depth, Strided<T> a, const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  constexpr int64_t L = kLanes<T>;
  Vec<T> acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < V; ++w) acc[r][w] = accumulate ? load(c + r * ldc + w * L) : Vec<T>{};
  for (int64_t p = 0; p < depth; ++p) {
    Vec<T> bv[V];
#pragma GCC unroll 4
    for (int w = 0; w < V; ++w) bv[w] = load(b + p * ldb + w * L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec<T> av = splat(a.a[r * a.row + p * a.step]);
#pragma GCC unroll 4
      for (int w = 0; w < V; ++w) acc[r][w] += av * bv[w];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int w = 0; w < V; ++w) store(c + r * ldc + w * L, acc[r][w]);
}

template <class T>
using TileFn = void (*)(int64_t, Strided<T>, const T*, int64_t, T*, int64_t, bool);
constexpr int kMaxTileRows = 8;
template <class T, int V, size_t... R>
constexpr std::array<TileFn<T>, sizeof...(R)> tiles_of_width(std::index_sequence<R...>) {
  return {{&tile<T, int(R) + 1, V>...}};
}
// The accumulators, the row of b and the broadcast a in registers: with 32 registers at most 16
// accumulators (4 rows of 3-4 vectors, 8 rows of 1-2); with 16, what the other 1 + V leave.
constexpr int64_t rows_per_tile(int vectors) {
  if (kVectorRegisters >= 32) return vectors >= 3 ? 4 : kMaxTileRows;
  return std::min<int64_t>(kMaxTileRows, (kVectorRegisters - 1 - vectors) / vectors);
}

// c[rows, cols] (+)= a[rows, depth] x b[depth, cols]; b and c row-major with leading dimensions,
// cols a whole number of vectors (callers pad b's rows and c with zero columns).
template <class T>
void multiply(int64_t rows, int64_t depth, int64_t cols, Strided<T> a, const T* b, int64_t ldb, T* c, int64_t ldc,
              bool accumulate) {
  static constexpr std::array<std::array<TileFn<T>, kMaxTileRows>, 4> tiles = {
      tiles_of_width<T, 1>(std::make_index_sequence<kMaxTileRows>()), tiles_of_width<T, 2>(std::make_index_sequence<kMaxTileRows>()),
      tiles_of_width<T, 3>(std::make_index_sequence<kMaxTileRows>()), tiles_of_width<T, 4>(std::make_index_sequence<kMaxTileRows>())};
  constexpr int64_t L = kLanes<T>;
  const int64_t vectors = cols / L;
  for (int64_t w0 = 0; w0 < vectors; w0 += 4) {
    const int width = int(std::min<int64_t>(4, vectors - w0));
    const int64_t step = rows_per_tile(width);
    for (int64_t r0 = 0; r0 < rows; r0 += step)
      tiles[size_t(width - 1)][size_t(std::min(step, rows - r0) - 1)](depth, {a.a + r0 * a.row, a.row, a.step}, b + w0 * L,
                                                                      ldb, c + r0 * ldc + w0 * L, ldc, accumulate);
  }
}

// Rows [0, rows) of a [*, cols] matrix (rows `stride` apart, cols by default) as [cols, ld]
// columns (ld >= rows, zero-padded).
template <class T>
void transpose_into(std::vector<T>& out, const T* m, int64_t rows, int64_t cols, int64_t ld, int64_t stride = 0) {
  if (stride == 0) stride = cols;
  out.resize(size_t(cols * ld));
  for (int64_t c = 0; c < cols; ++c) {  // contiguous writes (the strided reads vectorise as gathers)
    T* to = out.data() + c * ld;
    for (int64_t i = 0; i < rows; ++i) to[i] = m[i * stride + c];
    std::fill(to + rows, to + ld, T(0));
  }
}
// Rows [0, rows) of a [*, cols] matrix with rows padded to `ld` columns; the matrix itself when
// its rows already are whole vectors.
template <class T>
const T* padded_rows(std::vector<T>& out, const T* m, int64_t rows, int64_t cols, int64_t ld) {
  if (ld == cols) return m;
  out.assign(size_t(rows * ld), T(0));
  for (int64_t i = 0; i < rows; ++i) std::copy(m + i * cols, m + (i + 1) * cols, out.data() + i * ld);
  return out.data();
}

// Per-thread buffers, reused by every unit the thread runs.
template <class T>
struct Scratch {
  std::vector<T> own_t, own2_t, rows, rows2, tile, tile2, acc, acc2, m, l, alpha, lse, delta;
};
template <class T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

// Runs unit(0..units-1) in contiguous chunks over the parts.
template <class Unit>
void for_units(int64_t units, int parts, const PartRunner& run, const Unit& unit) {
  if (units <= 0) return;
  const int used = int(std::clamp<int64_t>(parts, 1, units));
  auto part = [&](int p) {
    for (int64_t u = units * p / used; u < units * (p + 1) / used; ++u) unit(u);
  };
  if (used > 1 && run) run(used, part);
  else
    for (int p = 0; p < used; ++p) part(p);
}

// The keys any of local queries [i0, i0 + n) may see: [0, key_end).
int64_t key_end(const AttentionExtents& x, int64_t i0, int64_t n) {
  return x.causal ? std::clamp<int64_t>(x.q_offset + i0 + n, 0, x.lk) : x.lk;
}

// Whether key j is masked for each lane's query, the lanes being local queries first, first + 1, ...
template <class T>
Mask<T> masked_for_queries(const AttentionExtents& x, int64_t j, int64_t first) {
  if (!x.causal) return Mask<T>{};
  return lanes_from<T>(x.q_offset + first) < splat_mask<T>(j);
}

// delta_i = sum_c dO[i, c] * O[i, c] - d(lse_i) for local queries [i0, i0 + n), in c order (the
// softmax gradient's row term; d_out is the adjoint of the forward's whole row, so a logsumexp
// that is used has its share), and lse_i from the forward's last column.
template <class T>
void row_terms(const AttentionExtents& x, const T* forward, const T* d_out, int64_t b, int64_t i0, int64_t n, T* lse, T* delta) {
  for (int64_t r = 0; r < n; ++r) {
    const T* o = forward + (b * x.lq + i0 + r) * (x.ev + 1);
    const T* g = d_out + (b * x.lq + i0 + r) * (x.ev + 1);
    T d = 0;
    for (int64_t c = 0; c < x.ev; ++c) d += g[c] * o[c];
    delta[r] = d - g[x.ev];
    lse[r] = o[x.ev];
  }
}

// The unit's own rows (queries here) are the tiles' columns: scores come as S^T [keys, queries],
// so the softmax statistics of a query (running max m, sum l, rescale alpha) sit in one lane and
// are updated a vector of queries at a time, and only the unit's small q block is transposed.
// Queries [i0, i0 + n) of batch entry b, an online softmax over key tiles.
template <class T>
void forward_unit(const AttentionExtents& x, const T* q, const T* k, const T* v, T* out, int64_t b, int64_t i0) {
  constexpr int64_t L = kLanes<T>;
  Scratch<T>& s = scratch<T>();
  const int64_t n = std::min(kRowBlock, x.lq - i0), keys = key_end(x, i0, n);
  const int64_t width = round_up(n, L), evp = round_up(x.ev, L);
  transpose_into(s.own_t, q + (b * x.lq + i0) * x.e, n, x.e, width);
  const T* k_rows = k + b * x.lk * x.e;
  const T* v_rows = padded_rows(s.rows, v + b * x.lk * x.ev, keys, x.ev, evp);
  const T minus_infinity = -std::numeric_limits<T>::infinity(), scale = T(x.scale);
  s.tile.resize(size_t(kColumnBlock * width));
  s.acc.assign(size_t(n * evp), T(0));
  s.m.assign(size_t(width), minus_infinity);
  s.l.assign(size_t(width), T(0));
  s.alpha.resize(size_t(width));
  for (int64_t j0 = 0; j0 < keys; j0 += kColumnBlock) {
    const int64_t cols = std::min(kColumnBlock, keys - j0);
    T* p_t = s.tile.data();  // S^T, then P^T
    multiply(cols, x.e, width, Strided<T>{k_rows + j0 * x.e, x.e, 1}, s.own_t.data(), width, p_t, width, false);
    for (int64_t c = 0; c < width; c += L) {
      Vec<T> top = splat(minus_infinity);
      for (int64_t j = 0; j < cols; ++j) {
        T* z = p_t + j * width + c;
        const Vec<T> scaled = masked_for_queries<T>(x, j0 + j, i0 + c) ? splat(minus_infinity) : load(z) * scale;
        store(z, scaled);
        top = scaled > top ? scaled : top;
      }
      const Vec<T> m = load(s.m.data() + c);
      const Vec<T> m_new = top > m ? top : m;
      // Masked scores (-inf) give exp = 0, and a query with nothing new here gets alpha =
      // exp(0) = 1 exactly. A query that has seen no key yet (a shifted mask) keeps m = -inf,
      // and its terms are measured from 0 so they stay 0 rather than exp(-inf + inf).
      const Vec<T> reference = x.causal && x.q_offset < 0 ? (m_new == splat(minus_infinity) ? Vec<T>{} : m_new) : m_new;
      const Vec<T> alpha = exp_lanes(m - reference);
      Vec<T> sum{};
      for (int64_t j = 0; j < cols; ++j) {
        T* z = p_t + j * width + c;
        const Vec<T> p = exp_lanes(load(z) - reference);
        store(z, p);
        sum += p;
      }
      store(s.l.data() + c, load(s.l.data() + c) * alpha + sum);
      store(s.m.data() + c, m_new);
      store(s.alpha.data() + c, alpha);
    }
    for (int64_t r = 0; r < n; ++r) {
      T* acc = s.acc.data() + r * evp;
      for (int64_t c = 0; c < evp; c += L) store(acc + c, load(acc + c) * s.alpha[size_t(r)]);
    }
    multiply(n, cols, evp, Strided<T>{p_t, 1, width}, v_rows + j0 * evp, evp, s.acc.data(), evp, true);
  }
  for (int64_t r = 0; r < n; ++r) {
    T* o = out + (b * x.lq + i0 + r) * (x.ev + 1);
    const T l = s.l[size_t(r)];
    if (l == T(0)) {  // a query that sees no key (a shifted mask): no output, logsumexp -inf
      std::fill(o, o + x.ev, T(0));
      o[x.ev] = minus_infinity;
      continue;
    }
    for (int64_t c = 0; c < x.ev; ++c) o[c] = s.acc[size_t(r * evp + c)] / l;
    o[x.ev] = s.m[size_t(r)] + std::log(l);
  }
}

// dq for queries [i0, i0 + n), tiles transposed as in the forward: P^T = exp(S^T * scale - lse)
// recomputed, dS^T = P^T (v dO^T - delta), dq = scale * dS k.
template <class T>
void grad_q_unit(const AttentionExtents& x, const T* q, const T* k, const T* v, const T* forward, const T* d_out, T* dq,
                 int64_t b, int64_t i0) {
  constexpr int64_t L = kLanes<T>;
  Scratch<T>& s = scratch<T>();
  const int64_t n = std::min(kRowBlock, x.lq - i0), keys = key_end(x, i0, n);
  const int64_t width = round_up(n, L), ep = round_up(x.e, L);
  transpose_into(s.own_t, q + (b * x.lq + i0) * x.e, n, x.e, width);
  transpose_into(s.own2_t, d_out + (b * x.lq + i0) * (x.ev + 1), n, x.ev, width, x.ev + 1);
  const T* k_rows = k + b * x.lk * x.e;
  const T* v_rows = v + b * x.lk * x.ev;
  const T* k_padded = padded_rows(s.rows, k_rows, keys, x.e, ep);
  s.lse.assign(size_t(width), T(0));  // the lanes past n stay 0
  s.delta.assign(size_t(width), T(0));
  row_terms(x, forward, d_out, b, i0, n, s.lse.data(), s.delta.data());
  const T scale = T(x.scale);
  s.tile.resize(size_t(kColumnBlock * width));
  s.tile2.resize(size_t(kColumnBlock * width));
  s.acc.assign(size_t(n * ep), T(0));
  for (int64_t j0 = 0; j0 < keys; j0 += kColumnBlock) {
    const int64_t cols = std::min(kColumnBlock, keys - j0);
    T *p_t = s.tile.data(), *dp_t = s.tile2.data();
    multiply(cols, x.e, width, Strided<T>{k_rows + j0 * x.e, x.e, 1}, s.own_t.data(), width, p_t, width, false);
    multiply(cols, x.ev, width, Strided<T>{v_rows + j0 * x.ev, x.ev, 1}, s.own2_t.data(), width, dp_t, width, false);
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t c = 0; c < width; c += L) {
        T *z = p_t + j * width + c, *dz = dp_t + j * width + c;
        Vec<T> p = exp_lanes(load(z) * scale - load(s.lse.data() + c));
        p = masked_for_queries<T>(x, j0 + j, i0 + c) ? Vec<T>{} : p;
        store(z, p * (load(dz) - load(s.delta.data() + c)));  // dS^T
      }
    multiply(n, cols, ep, Strided<T>{p_t, 1, width}, k_padded + j0 * ep, ep, s.acc.data(), ep, true);
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < x.e; ++c) dq[(b * x.lq + i0 + r) * x.e + c] = s.acc[size_t(r * ep + c)] * scale;
}

// dk and dv for keys [j0, j0 + n) (the unit's own rows, again the tiles' columns: S [queries,
// keys], so only the small k and v blocks are transposed), over the queries that see them:
// dv = P^T dO, dk = scale * dS^T q.
template <class T>
void grad_kv_unit(const AttentionExtents& x, const T* q, const T* k, const T* v, const T* lse_all, const T* delta_all,
                  const T* d_out, T* dkv, int64_t b, int64_t j0) {
  constexpr int64_t L = kLanes<T>;
  Scratch<T>& s = scratch<T>();
  const int64_t n = std::min(kRowBlock, x.lk - j0);
  // Local queries before `first` see none of these keys: their terms would all be zero.
  const int64_t first = x.causal ? std::clamp<int64_t>(j0 - x.q_offset, 0, x.lq) : 0, queries = x.lq - first;
  const int64_t width = round_up(n, L), ep = round_up(x.e, L), evp = round_up(x.ev, L);
  transpose_into(s.own_t, k + (b * x.lk + j0) * x.e, n, x.e, width);
  transpose_into(s.own2_t, v + (b * x.lk + j0) * x.ev, n, x.ev, width);
  const T* q_rows = q + (b * x.lq + first) * x.e;
  const T* g_rows = d_out + (b * x.lq + first) * x.ev;
  const T* q_padded = padded_rows(s.rows, q_rows, queries, x.e, ep);
  const T* g_padded = padded_rows(s.rows2, g_rows, queries, x.ev, evp);
  const T* lse_rows = lse_all + b * x.lq + first;
  const T* delta_rows = delta_all + b * x.lq + first;
  const T scale = T(x.scale);
  s.tile.resize(size_t(kColumnBlock * width));
  s.tile2.resize(size_t(kColumnBlock * width));
  s.acc.assign(size_t(n * ep), T(0));    // dk
  s.acc2.assign(size_t(n * evp), T(0));  // dv
  for (int64_t i0 = 0; i0 < queries; i0 += kColumnBlock) {
    const int64_t rows = std::min(kColumnBlock, queries - i0);
    T *p = s.tile.data(), *ds = s.tile2.data();
    multiply(rows, x.e, width, Strided<T>{q_rows + i0 * x.e, x.e, 1}, s.own_t.data(), width, p, width, false);
    multiply(rows, x.ev, width, Strided<T>{g_rows + i0 * x.ev, x.ev, 1}, s.own2_t.data(), width, ds, width, false);
    for (int64_t i = 0; i < rows; ++i) {
      const T lse = lse_rows[i0 + i], delta = delta_rows[i0 + i];
      // Key lanes j0 + c past the query (global q_offset + first + i0 + i) are masked.
      const Mask<T> last_seen = splat_mask<T>(x.q_offset + first + i0 + i - j0);
      for (int64_t c = 0; c < width; c += L) {
        T *z = p + i * width + c, *dz = ds + i * width + c;
        Vec<T> e = exp_lanes(load(z) * scale - lse);
        if (x.causal) e = lanes_from<T>(c) > last_seen ? Vec<T>{} : e;
        store(z, e);
        store(dz, e * (load(dz) - delta));
      }
    }
    multiply(n, rows, evp, Strided<T>{p, 1, width}, g_padded + i0 * evp, evp, s.acc2.data(), evp, true);
    multiply(n, rows, ep, Strided<T>{ds, 1, width}, q_padded + i0 * ep, ep, s.acc.data(), ep, true);
  }
  for (int64_t r = 0; r < n; ++r) {
    T* o = dkv + (b * x.lk + j0 + r) * (x.e + x.ev);
    for (int64_t c = 0; c < x.e; ++c) o[c] = s.acc[size_t(r * ep + c)] * scale;
    for (int64_t c = 0; c < x.ev; ++c) o[x.e + c] = s.acc2[size_t(r * evp + c)];
  }
}

int64_t blocks(int64_t n) { return (n + kRowBlock - 1) / kRowBlock; }

}  // namespace

template <class T>
void attention_forward(const AttentionExtents& x, const T* q, const T* k, const T* v, T* out, int parts, const PartRunner& run) {
  const int64_t per_batch = blocks(x.lq);
  for_units(x.batch * per_batch, parts, run,
            [&](int64_t u) { forward_unit(x, q, k, v, out, u / per_batch, u % per_batch * kRowBlock); });
}

template <class T>
void attention_grad_q(const AttentionExtents& x, const T* q, const T* k, const T* v, const T* forward, const T* d_out, T* dq,
                      int parts, const PartRunner& run) {
  const int64_t per_batch = blocks(x.lq);
  for_units(x.batch * per_batch, parts, run,
            [&](int64_t u) { grad_q_unit(x, q, k, v, forward, d_out, dq, u / per_batch, u % per_batch * kRowBlock); });
}

template <class T>
void attention_grad_kv(const AttentionExtents& x, const T* q, const T* k, const T* v, const T* forward, const T* d_out,
                       T* dkv, int parts, const PartRunner& run) {
  // Every key block reads every query's row terms and output adjoint: made once, beforehand
  // (the adjoint without its logsumexp column, rows ev apart).
  std::vector<T> lse(size_t(x.batch * x.lq)), delta(size_t(x.batch * x.lq)), d_rows(size_t(x.batch * x.lq * x.ev));
  for_units(x.batch, parts, run, [&](int64_t b) {
    row_terms(x, forward, d_out, b, 0, x.lq, lse.data() + b * x.lq, delta.data() + b * x.lq);
    for (int64_t i = b * x.lq; i < (b + 1) * x.lq; ++i)
      std::copy(d_out + i * (x.ev + 1), d_out + i * (x.ev + 1) + x.ev, d_rows.data() + i * x.ev);
  });
  const int64_t per_batch = blocks(x.lk);
  for_units(x.batch * per_batch, parts, run, [&](int64_t u) {
    grad_kv_unit(x, q, k, v, lse.data(), delta.data(), d_rows.data(), dkv, u / per_batch, u % per_batch * kRowBlock);
  });
}

#define TESSERA_ATTENTION_INSTANCES(T)                                                                                   \
  template void attention_forward<T>(const AttentionExtents&, const T*, const T*, const T*, T*, int, const PartRunner&); \
  template void attention_grad_q<T>(const AttentionExtents&, const T*, const T*, const T*, const T*, const T*, T*, int,   \
                                    const PartRunner&);                                                                  \
  template void attention_grad_kv<T>(const AttentionExtents&, const T*, const T*, const T*, const T*, const T*, T*, int,  \
                                     const PartRunner&);
TESSERA_ATTENTION_INSTANCES(float)
TESSERA_ATTENTION_INSTANCES(double)
#undef TESSERA_ATTENTION_INSTANCES

}  // namespace tessera
