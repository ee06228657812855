#include "comm/reduce_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "dsl/error.hpp"

namespace tessera {
namespace {

template <class T, class Acc, class Load, class Store>
void reduce_typed(void* out_raw, const void* const* inputs_raw, int n, int64_t count, ReduceOp op,
                  Load load, Store store) {
  auto* out = static_cast<T*>(out_raw);
  // Blocks keep the accumulator in cache while streaming every input once.
  constexpr int64_t kBlock = 2048;
  Acc acc[kBlock];
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
        case ReduceOp::Max:
          for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], Acc(load(in[i])));
          break;
        case ReduceOp::Min:
          for (int64_t i = 0; i < len; ++i) acc[i] = std::min(acc[i], Acc(load(in[i])));
          break;
      }
    }
    if (op == ReduceOp::Avg)
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / Acc(n);
    for (int64_t i = 0; i < len; ++i) out[base + i] = store(acc[i]);
  }
}

template <class T>
void reduce_native(void* out, const void* const* inputs, int n, int64_t count, ReduceOp op) {
  reduce_typed<T, T>(out, inputs, n, count, op, [](T v) { return v; }, [](T v) { return v; });
}

}  // namespace

void reduce_many(void* out, const void* const* inputs, int n, int64_t count, DType dtype, ReduceOp op) {
  if (n <= 0 || count <= 0) return;
  if (n == 1) {
    if (out != inputs[0]) std::memmove(out, inputs[0], size_t(count * dtype_size(dtype)));
    return;
  }
  switch (dtype) {
    case DType::f32: return reduce_native<float>(out, inputs, n, count, op);
    case DType::f64: return reduce_native<double>(out, inputs, n, count, op);
    case DType::i32: return reduce_native<int32_t>(out, inputs, n, count, op);
    case DType::i64: return reduce_native<int64_t>(out, inputs, n, count, op);
    case DType::u8:  // bools: sum / max behave as logical or, product / min as logical and
      return reduce_typed<uint8_t, int32_t>(out, inputs, n, count, op, [](uint8_t v) { return int32_t(v); },
                                            [](int32_t v) { return uint8_t(v != 0); });
    case DType::bf16:
      return reduce_typed<uint16_t, float>(out, inputs, n, count, op, bf16_to_float, float_to_bf16);
    case DType::f16:
      return reduce_typed<uint16_t, float>(out, inputs, n, count, op, f16_to_float, float_to_f16);
  }
  throw InternalError("reduce_many: bad dtype");
}

double reduce_identity(ReduceOp op) { return op == ReduceOp::Product ? 1.0 : 0.0; }

}  // namespace tessera
