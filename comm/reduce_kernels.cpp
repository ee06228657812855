#include "comm/reduce_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "dsl/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

// Large outputs are written with non-temporal stores: they will not be read from cache again, and
// a normal store would first read every destination line (a third more memory traffic).
constexpr int64_t kStreamingBytes = 1 << 20;

template <class T>
void store_block(T* out, const T* acc, int64_t len, bool streaming) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (streaming) {
      constexpr int64_t kLanes = 16 / int64_t(sizeof(T));
      int64_t i = 0;
      for (; i < len && (reinterpret_cast<uintptr_t>(out + i) & 15); ++i) out[i] = acc[i];
      for (; i + kLanes <= len; i += kLanes) {
        if constexpr (std::is_same_v<T, float>) _mm_stream_ps(out + i, _mm_loadu_ps(acc + i));
        else _mm_stream_pd(out + i, _mm_loadu_pd(acc + i));
      }
      for (; i < len; ++i) out[i] = acc[i];
      return;
    }
  }
#endif
  (void)streaming;
  std::copy(acc, acc + len, out);
}

template <class T, class Acc, class Load, class Store>
void reduce_typed(void* const* outs_raw, int n_outs, const void* const* inputs_raw, int n, int64_t count, ReduceOp op,
                  Load load, Store store) {
  // Blocks keep the accumulator in cache while streaming every input once.
  constexpr int64_t kBlock = 2048;
  Acc acc[kBlock];
  const bool streaming = count * int64_t(sizeof(T)) >= kStreamingBytes;
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    const T* first = static_cast<const T*>(inputs_raw[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = load(first[i]);
    for (int r = 1; r < n; ++r) {
      const T* in = static_cast<const T*>(inputs_raw[r]) + base;
      switch (op) {
        case ReduceOp::Sum: case ReduceOp::Avg:
          for (int64_t i = 0; i < len; ++i) acc[i] += load(in[i]);
          break;
        case ReduceOp::Product:
          for (int64_t i = 0; i < len; ++i) acc[i] *= load(in[i]);
          break;
        // NaN propagates (as numpy's and the kernels' max / min): v != v only for a NaN.
        case ReduceOp::Max:
          for (int64_t i = 0; i < len; ++i) {
            const Acc v = Acc(load(in[i]));
            acc[i] = acc[i] != acc[i] ? acc[i] : v != v ? v : std::max(acc[i], v);
          }
          break;
        case ReduceOp::Min:
          for (int64_t i = 0; i < len; ++i) {
            const Acc v = Acc(load(in[i]));
            acc[i] = acc[i] != acc[i] ? acc[i] : v != v ? v : std::min(acc[i], v);
          }
          break;
      }
    }
    if (op == ReduceOp::Avg)
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / Acc(n);
    for (int o = 0; o < n_outs; ++o) {
      T* out = static_cast<T*>(outs_raw[o]) + base;
      if constexpr (std::is_same_v<T, Acc>) {
        store_block(out, acc, len, streaming);
      } else {
        for (int64_t i = 0; i < len; ++i) out[i] = store(acc[i]);
      }
    }
  }
#if defined(__x86_64__)
  if (streaming) _mm_sfence();  // order the streaming stores before the barrier that publishes them
#endif
}

template <class T>
void reduce_native(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, ReduceOp op) {
  reduce_typed<T, T>(outs, n_outs, inputs, n, count, op, [](T v) { return v; }, [](T v) { return v; });
}

}  // namespace

void reduce_many(void* out, const void* const* inputs, int n, int64_t count, DType dtype, ReduceOp op) {
  reduce_many_to(&out, 1, inputs, n, count, dtype, op);
}

void reduce_many_to(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, DType dtype,
                    ReduceOp op) {
  if (n <= 0 || count <= 0) return;
  switch (dtype) {
    case DType::f32: return reduce_native<float>(outs, n_outs, inputs, n, count, op);
    case DType::f64: return reduce_native<double>(outs, n_outs, inputs, n, count, op);
    case DType::i32: return reduce_native<int32_t>(outs, n_outs, inputs, n, count, op);
    case DType::i64: return reduce_native<int64_t>(outs, n_outs, inputs, n, count, op);
    case DType::u8:  // bools: sum / max behave as logical or, product / min as logical and
      return reduce_typed<uint8_t, int32_t>(outs, n_outs, inputs, n, count, op, [](uint8_t v) { return int32_t(v); },
                                            [](int32_t v) { return uint8_t(v != 0); });
    case DType::bf16:
      return reduce_typed<uint16_t, float>(outs, n_outs, inputs, n, count, op, bf16_to_float, float_to_bf16);
    case DType::f16:
      return reduce_typed<uint16_t, float>(outs, n_outs, inputs, n, count, op, f16_to_float, float_to_f16);
  }
  throw InternalError("reduce_many: bad dtype");
}

double reduce_identity(ReduceOp op) { return op == ReduceOp::Product ? 1.0 : 0.0; }

}  // namespace tessera
