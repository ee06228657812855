// A compiler from kernel IR to a loadable artifact (an object file for the CPU's LLJIT, a CUBIN
// for a CUDA device). The compile cache (jit/compile_cache.hpp) sits in front of any of them:
// its key covers the kernels' text and the compiler's identity.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"

namespace tessera {

class KernelCompiler {
 public:
  virtual ~KernelCompiler() = default;
  // What besides the kernels decides the artifact: compiler version, target, options.
  virtual std::string identity() const = 0;
  // The artifact of `kernels`, whose entry points are named `names` (in order); `key` names it
  // in dumps.
  virtual std::string compile(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                              const std::string& key) = 0;
};

}  // namespace tessera
