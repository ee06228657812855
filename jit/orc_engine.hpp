// The process's one LLJIT, and the compile cache in front of it.
//
// A program's kernels are compiled together (one module: many small modules compile slower).
// Each compile gets a fresh LLVMContext (through ThreadSafeContext) and its own TargetMachine
// (they are not thread-safe), runs the O3 pipeline for the host CPU, and emits an object file.
// Objects are cached on disk under $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else
// ~/.cache/tessera, keyed by an xxh3-128 hash of the kernels' IR text, the cache schema
// version, LLVM's version, the target triple, CPU name, sorted CPU features and the options.
// Files are written to a temporary name and renamed, carry a checksum, and are recompiled on
// any load failure. A cache hit adds the object to the JIT without running LLVM's optimiser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"

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
std::string compile_cache_dir();

}  // namespace tessera
