// Renders kernel IR to LLVM IR (one function per kernel, all kernels of a program in one module).
// Floating-point ops carry fast-math flags that allow contraction (FMA) and reassociation (so
// reductions vectorise), but not no-NaN/no-inf: inf and NaN keep their meaning.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"

namespace llvm {
class LLVMContext;
class Module;
class TargetMachine;
}  // namespace llvm

namespace tessera {

// `names[i]` is the symbol of kernels[i]. The module takes the target's triple and data layout;
// functions get the host CPU, its features and, on AVX-512 hosts, prefer-vector-width=512.
std::unique_ptr<llvm::Module> render_llvm(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                                          llvm::LLVMContext& context, const llvm::TargetMachine& target);

}  // namespace tessera
