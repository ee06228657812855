// Values several statements of one loop body compute, computed once: each is bound to a
// variable declared before the first statement that uses it, and every statement of that body
// reads the variable. The renderers evaluate an expression DAG once per statement, so without
// this a multi-output kernel (an optimizer's update writing a parameter and its moments) loads
// and computes its shared values again for each output it stores. With it an input is read
// before the first output is written, which is what lets an output take that input's buffer
// (codegen/in_place.hpp). Values reading a variable the kernel reassigns (an accumulator) stay
// as they are: they may differ between statements.
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

void bind_shared_values(Kernel& kernel);

}  // namespace tessera::kir
