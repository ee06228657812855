// The process's one LLJIT, with the compile cache (jit/compile_cache.hpp) in front of it.
//
// Kernels are keyed one by one: a kernel's key covers its IR text, the cache schema version,
// LLVM's version, the target triple, CPU name, sorted CPU features and the options, and names its
// entry point. A kernel already loaded in this process is not compiled again, whichever program
// it came in (a pipeline's schedules and a model's training and evaluation steps share most of
// theirs). The rest are compiled in as many modules ("parts") as there are cores, each of
// consecutive kernels and at least 16 KB of kernel IR (many small modules compile slower), on a
// thread each, by the LLVM KernelCompiler: a fresh LLVMContext and TargetMachine per compile
// (they are not thread-safe), the O3 pipeline for the host CPU, an object file. Each part's
// object goes to the disk cache under the part's key, and each of its kernels to a disk index
// (kernel key -> part key), so another process finds a kernel whatever part it was compiled in.
// Each part is loaded into a JITDylib of its own: two parts may hold the same kernel.
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
  int64_t compiled_kernels = 0;  // in those modules
  int64_t disk_hits = 0;         // modules loaded from the disk cache
  int64_t memory_hits = 0;       // kernels already loaded in this process
  double compile_ms = 0;         // time spent compiling (LLVM)
};

// Compiles (or loads) the kernels and returns their entry points, in order.
std::vector<KernelFunction> load_kernels(const std::vector<kir::Kernel>& kernels);

CompileStats compile_stats();

}  // namespace tessera
