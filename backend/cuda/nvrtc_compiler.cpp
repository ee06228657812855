#include "backend/cuda/nvrtc_compiler.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/cuda/nvrtc_library.hpp"
#include "codegen/cuda_renderer.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

constexpr int kRendererVersion = 1;  // bump when render_cuda's output changes meaning

void check(nvrtcResult result, const char* what) {
  if (result != NVRTC_SUCCESS) throw CompileError(fmt::format("NVRTC: {} failed: {}", what, nvrtc().nvrtcGetErrorString(result)));
}

// Owns an nvrtcProgram.
class Program {
 public:
  Program(const std::string& source, const std::string& name) {
    check(nvrtc().nvrtcCreateProgram(&program_, source.c_str(), name.c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
  }
  ~Program() { nvrtc().nvrtcDestroyProgram(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcResult compile(const std::vector<std::string>& options) {
    std::vector<const char*> args;
    for (const auto& o : options) args.push_back(o.c_str());
    return nvrtc().nvrtcCompileProgram(program_, int(args.size()), args.data());
  }

  std::string log() const {
    size_t size = 0;
    check(nvrtc().nvrtcGetProgramLogSize(program_, &size), "nvrtcGetProgramLogSize");
    std::string text(size, '\0');
    check(nvrtc().nvrtcGetProgramLog(program_, text.data()), "nvrtcGetProgramLog");
    while (!text.empty() && (text.back() == '\0' || text.back() == '\n')) text.pop_back();
    return text;
  }

  std::string cubin() const {
    size_t size = 0;
    if (nvrtc().nvrtcGetCUBINSize(program_, &size) != NVRTC_SUCCESS || size == 0) return {};  // compiled for a virtual arch
    std::string bytes(size, '\0');
    check(nvrtc().nvrtcGetCUBIN(program_, bytes.data()), "nvrtcGetCUBIN");
    return bytes;
  }

  std::string ptx() const {
    size_t size = 0;
    check(nvrtc().nvrtcGetPTXSize(program_, &size), "nvrtcGetPTXSize");
    std::string text(size, '\0');
    check(nvrtc().nvrtcGetPTX(program_, text.data()), "nvrtcGetPTX");
    while (!text.empty() && text.back() == '\0') text.pop_back();
    return text;
  }

 private:
  nvrtcProgram program_ = nullptr;
};

bool emits_cubin_for(int compute_capability) {
  int count = 0;
  if (nvrtc().nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return false;
  std::vector<int> archs(size_t(count), 0);
  if (nvrtc().nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return false;
  return std::find(archs.begin(), archs.end(), compute_capability) != archs.end();
}

}  // namespace

NvrtcCompiler::NvrtcCompiler(int compute_capability, bool deterministic)
    : compute_capability_(compute_capability),
      deterministic_(deterministic),
      // IEEE division and square root, denormals kept: the CPU's results.
      options_{"--std=c++17", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"} {}

std::vector<std::string> NvrtcCompiler::options() const {
  // FMA contraction as on the CPU (both contract a*b+c), except for deterministic targets: which
  // products meet which sums in one kernel depends on the mesh's fusion.
  std::vector<std::string> options = options_;
  options.push_back(deterministic_ ? "--fmad=false" : "--fmad=true");
  return options;
}

std::string NvrtcCompiler::nvrtc_version() {
  int major = 0, minor = 0;
  check(nvrtc().nvrtcVersion(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

std::string NvrtcCompiler::identity() const {
  return fmt::format("cuda-renderer={} nvrtc={} arch=sm_{} options={}", kRendererVersion, nvrtc_version(), compute_capability_,
                     fmt::join(options(), " "));
}

NvrtcOutput NvrtcCompiler::compile_source(const std::string& source, const std::string& program_name) const {
  const std::string real = fmt::format("--gpu-architecture=sm_{}", compute_capability_);
  const std::string virtual_arch = fmt::format("--gpu-architecture=compute_{}", compute_capability_);
  auto attempt = [&](const std::string& arch, Program& program) {
    std::vector<std::string> options = this->options();
    options.push_back(arch);
    return program.compile(options);
  };
  bool real_arch = emits_cubin_for(compute_capability_);
  auto program = std::make_unique<Program>(source, program_name);
  nvrtcResult result = attempt(real_arch ? real : virtual_arch, *program);
  if (result == NVRTC_ERROR_INVALID_OPTION && real_arch) {  // listed but refused: PTX after all
    real_arch = false;
    program = std::make_unique<Program>(source, program_name);
    result = attempt(virtual_arch, *program);
  }
  NvrtcOutput out;
  out.log = program->log();
  if (result != NVRTC_SUCCESS)
    throw CompileError(fmt::format("NVRTC could not compile {} for sm_{} ({}):\n{}", program_name, compute_capability_,
                                   nvrtc().nvrtcGetErrorString(result), out.log));
  if (real_arch) out.binary = program->cubin();
  out.is_cubin = !out.binary.empty();
  if (!out.is_cubin) out.binary = program->ptx();
  return out;
}

std::string NvrtcCompiler::compile(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                                   const std::string& key) {
  const std::string source = render_cuda(kernels, names);
  if (const char* dir = std::getenv("TESSERA_DUMP"); dir && *dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream(std::string(dir) + "/" + key + ".cu") << source;
  }
  return compile_source(source, key + ".cu").binary;
}

}  // namespace tessera
