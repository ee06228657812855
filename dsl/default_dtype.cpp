#include "dsl/default_dtype.hpp"

#include <atomic>
#include <string>

#include "dsl/error.hpp"

namespace tessera {
namespace {

std::atomic<DType> the_default_dtype{DType::f32};

}  // namespace

DType default_dtype() { return the_default_dtype.load(std::memory_order_relaxed); }

void set_default_dtype(DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError("set_default_dtype: " + std::string(dtype_name(dtype)) +
                     " is not a floating dtype (float32, float64, bfloat16 or float16)");
  the_default_dtype.store(dtype, std::memory_order_relaxed);
}

}  // namespace tessera
