// Whether a kernel may write one of its outputs over one of its inputs: the question a program
// asks before it lets a variable's new value take the buffer of its old one (buffer donation,
// jit/memory_plan.hpp), as an optimizer's update writes each parameter in place.
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

// True when writing buffer `out` into buffer `in`'s memory computes what the kernel computes
// with them apart: every store to `out` writes one index expression, every load of `in` reads
// that same index (so an iteration reads only the element it writes, and threads splitting the
// range loop touch disjoint elements), no load of `in` follows the first store to `out` in
// program order (so none reads an element already written), and the index uses no variable the
// kernel reassigns (a loop's, a parameter or a constant, equal in the load and the store).
// False when `out` is never stored or `in` never loaded.
bool writes_in_place(const Kernel& kernel, int out, int in);

}  // namespace tessera::kir
