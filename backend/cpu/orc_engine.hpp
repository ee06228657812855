// The process's one LLJIT, with the compile cache (jit/compile_cache.hpp) in front of it.
//
// A program's kernels are compiled in as many modules as there are cores, each of consecutive
// kernels and at least 16 KB of kernel IR (many small modules compile slower), on a thread each,
// by the LLVM KernelCompiler: a fresh LLVMContext and TargetMachine per compile (they are not
// thread-safe), the O3 pipeline for the host CPU, an object file. The cache key covers the
// kernels' IR text, the cache schema version, LLVM's version, the target triple, CPU name,
// sorted CPU features and the options. A cache hit adds the object to the JIT without running
// LLVM's optimiser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"
#include "jit/compile_cache.hpp"  // compile_cache_dir()

namespace tessera {

using KernelFunction = void (*)(void** buffers, const int64_t* params, int64_t begin, int64_t end);

struct CompileStats {
  int64_t compiled_modules = 0;  // went through LLVM
  int64_t disk_hits = 0;         // loaded from the disk cache
  int64_t memory_hits = 0;       // already loaded in this process
  double compile_ms = 0;         // time spent compiling (LLVM)
};

// Compiles (or loads) the kernels and returns their entry points, in order.
std::vector<KernelFunction> load_kernels(const std::vector<kir::Kernel>& kernels);

CompileStats compile_stats();

}  // namespace tessera
