#include "jit/orc_engine.hpp"

#include <fmt/format.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <unistd.h>

#include "codegen/llvm_renderer.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

constexpr int kCacheSchemaVersion = 1;
constexpr char kCacheMagic[8] = {'T', 'S', 'R', 'O', 'B', 'J', '0', '1'};

std::string error_text(llvm::Error error) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << error;
  return os.str();
}

template <class T>
T unwrap(llvm::Expected<T> value, const char* what) {
  if (!value) throw CompileError(std::string(what) + ": " + error_text(value.takeError()));
  return std::move(*value);
}

class Engine {
 public:
  Engine() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
    jit_ = unwrap(llvm::orc::LLJITBuilder().create(), "creating the LLJIT");
    // Kernels call libm / libmvec (expf, tanhf, _ZGV..._expf): resolve them from this process.
    auto generator = unwrap(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
                                jit_->getDataLayout().getGlobalPrefix()),
                            "process symbols");
    jit_->getMainJITDylib().addGenerator(std::move(generator));
    cpu_ = llvm::sys::getHostCPUName().str();
    std::vector<std::string> features;
    for (const auto& f : llvm::sys::getHostCPUFeatures()) features.push_back((f.second ? "+" : "-") + f.first().str());
    std::sort(features.begin(), features.end());
    for (const auto& f : features) features_ += (features_.empty() ? "" : ",") + f;
    triple_ = llvm::sys::getProcessTriple();
    identity_ = fmt::format("schema={} llvm={} triple={} cpu={} features={} opt=O3 fast-math=contract,reassoc,nsz,afn",
                            kCacheSchemaVersion, LLVM_VERSION_STRING, triple_, cpu_, features_);
  }

  std::vector<KernelFunction> load(const std::vector<kir::Kernel>& kernels) {
    std::string text = identity_ + "\n";
    for (const auto& k : kernels) text += k.to_string() + "\n";
    const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
    const std::string key = fmt::format("{:016x}{:016x}", h.high64, h.low64);
    std::vector<std::string> names;
    for (size_t i = 0; i < kernels.size(); ++i) names.push_back(fmt::format("tessera_{}_{}", key, i));

    std::lock_guard lock(mutex_);
    if (loaded_.count(key)) {
      ++stats_.memory_hits;
      return lookup(names);
    }
    const std::string path = cache_dir() + "/" + key + ".o";
    std::unique_ptr<llvm::MemoryBuffer> object = read_cached(path);
    if (object) {
      ++stats_.disk_hits;
    } else {
      auto start = std::chrono::steady_clock::now();
      object = compile(kernels, names, key);
      stats_.compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      ++stats_.compiled_modules;
      write_cached(path, *object);
    }
    if (auto err = jit_->addObjectFile(std::move(object))) throw CompileError("adding kernels to the JIT: " + error_text(std::move(err)));
    loaded_.insert(key);
    return lookup(names);
  }

  CompileStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  std::vector<KernelFunction> lookup(const std::vector<std::string>& names) {
    std::vector<KernelFunction> out;
    for (const auto& name : names) {
      auto address = unwrap(jit_->lookup(name), "looking up a kernel");
      out.push_back(address.toPtr<KernelFunction>());
    }
    return out;
  }

  std::unique_ptr<llvm::MemoryBuffer> compile(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                                              const std::string& key) {
    auto builder = unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host");
    builder.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    std::unique_ptr<llvm::TargetMachine> target = unwrap(builder.createTargetMachine(), "creating a target machine");
    // A fresh context per module, owned with it by a ThreadSafeModule; all work on the module
    // goes through withModuleDo (never getContext, which LLVM 21 removes).
    auto context = std::make_unique<llvm::LLVMContext>();
    std::unique_ptr<llvm::Module> rendered = render_llvm(kernels, names, *context, *target);
    llvm::orc::ThreadSafeModule module(std::move(rendered), std::move(context));
    llvm::SmallVector<char, 0> object;
    module.withModuleDo([&](llvm::Module& m) {
      optimise(m, *target);
      dump(m, key);
      llvm::raw_svector_ostream os(object);
      llvm::legacy::PassManager emit;
      if (target->addPassesToEmitFile(emit, os, nullptr, llvm::CodeGenFileType::ObjectFile))
        throw CompileError("the target cannot emit object files");
      emit.run(m);
    });
    return llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), key);
  }

  void optimise(llvm::Module& module, llvm::TargetMachine& target) {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PipelineTuningOptions options;
    options.LoopVectorization = true;
    options.SLPVectorization = true;
    llvm::PassBuilder passes(&target, options);
    // No vector math library on purpose: f32 transcendentals are inline polynomials
    // (codegen/math_functions.hpp), and a libmvec call in the vector body but a libm call in the
    // scalar remainder would make results depend on an element's position (and so the layout).
    passes.registerModuleAnalyses(mam);
    passes.registerCGSCCAnalyses(cgam);
    passes.registerFunctionAnalyses(fam);
    passes.registerLoopAnalyses(lam);
    passes.crossRegisterProxies(lam, fam, cgam, mam);
    passes.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(module, mam);
  }

  void dump(llvm::Module& module, const std::string& key) {
    const char* dir = std::getenv("TESSERA_DUMP");
    if (!dir || !*dir) return;
    std::filesystem::create_directories(dir);
    std::error_code ec;
    llvm::raw_fd_ostream out(std::string(dir) + "/" + key + ".ll", ec);
    if (!ec) module.print(out, nullptr);
  }

  static std::string cache_dir() { return compile_cache_dir(); }

  // [magic 8][xxh64 of the object 8][size 8][object]
  std::unique_ptr<llvm::MemoryBuffer> read_cached(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return nullptr;
    char magic[8];
    uint64_t checksum = 0, size = 0;
    in.read(magic, 8);
    in.read(reinterpret_cast<char*>(&checksum), 8);
    in.read(reinterpret_cast<char*>(&size), 8);
    if (!in || std::memcmp(magic, kCacheMagic, 8) != 0 || size > (uint64_t(1) << 32)) return corrupt(path);
    std::string data(size, '\0');
    in.read(data.data(), std::streamsize(size));
    if (!in || XXH3_64bits(data.data(), data.size()) != checksum) return corrupt(path);
    return llvm::MemoryBuffer::getMemBufferCopy(data, path);
  }

  std::unique_ptr<llvm::MemoryBuffer> corrupt(const std::string& path) {
    component_logger("jit").warn("compile cache entry {} is corrupt; recompiling", path);
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return nullptr;
  }

  void write_cached(const std::string& path, const llvm::MemoryBuffer& object) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    if (ec) return;  // an unwritable cache only costs recompilation
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      uint64_t checksum = XXH3_64bits(object.getBufferStart(), object.getBufferSize());
      uint64_t size = object.getBufferSize();
      out.write(kCacheMagic, 8);
      out.write(reinterpret_cast<const char*>(&checksum), 8);
      out.write(reinterpret_cast<const char*>(&size), 8);
      out.write(object.getBufferStart(), std::streamsize(size));
      if (!out) {
        std::filesystem::remove(tmp, ec);
        return;
      }
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  }

  std::mutex mutex_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::string cpu_, features_, triple_, identity_;
  std::set<std::string> loaded_;
  CompileStats stats_;
};

Engine& engine() {
  static Engine* instance = new Engine();  // lives until exit: kernels may run during static destruction
  return *instance;
}

}  // namespace

std::vector<KernelFunction> load_kernels(const std::vector<kir::Kernel>& kernels) {
  if (kernels.empty()) return {};
  return engine().load(kernels);
}

CompileStats compile_stats() { return engine().stats(); }

std::string compile_cache_dir() {
  if (const char* dir = std::getenv("TESSERA_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/tessera";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/tessera";
  return "/tmp/tessera-cache";
}

}  // namespace tessera
