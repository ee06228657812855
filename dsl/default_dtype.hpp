// PyTorch's torch.set_default_dtype / torch.get_default_dtype: the dtype of floating tensors made
// without one (the factories, random tensors, a layer's parameters, an op on two scalars).
// Process-wide, as in PyTorch; float32 at start. jit keys its traces on it, so a function traced
// before a change is traced again after it.
#pragma once

#include "dsl/dtype.hpp"

namespace tessera {

DType default_dtype();
// DTypeError for a dtype that is not floating (PyTorch accepts floating types only).
void set_default_dtype(DType dtype);

}  // namespace tessera
