// The tests' kernel-IR interpreter: runs any kernel of codegen/kernel_ir.hpp on host buffers,
// one scalar at a time, with the kernel ABI of the compiled ones. It is the oracle that every
// renderer (LLVM, CUDA) is checked against: it shares no code with them (its own casts and
// arithmetic), only the IR (Philox included: codegen/philox.hpp, itself checked against
// test/reference_evaluator.cpp's) and dsl's bf16/f16 conversions.
#pragma once

#include <cstdint>

#include "codegen/kernel_ir.hpp"

namespace tessera::testing {

void interpret_kernel(const kir::Kernel& kernel, void** buffers, const int64_t* params, int64_t begin, int64_t end);

}  // namespace tessera::testing
