#include "nn/metrics.hpp"

namespace tessera {

Tensor accuracy(const Tensor& logits, const Tensor& labels, Loc where) {
  Tensor predicted = argmax(logits, -1, where);
  Tensor hit = cast(predicted == Operand(cast(labels, DType::i64, where), where), DType::f32, where);
  return reduce_mean(hit, {}, false, where);
}

}  // namespace tessera
