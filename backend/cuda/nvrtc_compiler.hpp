// CUDA C -> a GPU binary with NVRTC, the KernelCompiler for CUDA devices: kernel IR is rendered
// by codegen/cuda_renderer.hpp and compiled to a CUBIN for one architecture (sm_90 by default),
// or to PTX for the matching virtual architecture when this NVRTC cannot emit that CUBIN (the
// driver then finishes it at load time). NVRTC is loaded at run time (backend/cuda/nvrtc_library.hpp);
// compiling needs no GPU and no driver. The header carries no NVRTC types.
#pragma once

#include <string>
#include <vector>

#include "jit/kernel_compiler.hpp"

namespace tessera {

struct NvrtcOutput {
  std::string binary;  // a CUBIN (an ELF image) or NUL-free PTX text: cuModuleLoadData takes either
  bool is_cubin = false;
  std::string log;     // NVRTC's warnings (empty when there are none)
};

class NvrtcCompiler final : public KernelCompiler {
 public:
  // `deterministic`: the program's Target (ir/target.hpp) asks for no FMA contraction.
  NvrtcCompiler(int compute_capability, bool deterministic);

  std::string identity() const override;
  // render_cuda + compile_source; TESSERA_DUMP=dir also writes the source as dir/<key>.cu.
  std::string compile(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                      const std::string& key) override;

  // Compiles one CUDA C source (`program_name` names it in the log). A compile error is a
  // CompileError whose message carries NVRTC's log.
  NvrtcOutput compile_source(const std::string& source, const std::string& program_name) const;

  // NVRTC's version as "major.minor".
  static std::string nvrtc_version();

 private:
  int compute_capability_;
  bool deterministic_;
  std::vector<std::string> options() const;  // besides the architecture
  std::vector<std::string> options_;          // those of every compile
};

}  // namespace tessera
