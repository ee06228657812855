#include "backend/cpu/orc_engine.hpp"

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
#include "jit/compile_cache.hpp"
#include "jit/kernel_compiler.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

constexpr int kCacheSchemaVersion = 1;

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

// Kernel IR -> an object file for this host: LLVM IR, the O3 pipeline for the host CPU.
class LlvmKernelCompiler final : public KernelCompiler {
 public:
  LlvmKernelCompiler() {
    const std::string cpu = llvm::sys::getHostCPUName().str();
    std::vector<std::string> features;
    for (const auto& f : llvm::sys::getHostCPUFeatures()) features.push_back((f.second ? "+" : "-") + f.first().str());
    std::sort(features.begin(), features.end());
    std::string feature_list;
    for (const auto& f : features) feature_list += (feature_list.empty() ? "" : ",") + f;
    identity_ = fmt::format("schema={} llvm={} triple={} cpu={} features={} opt=O3 fast-math=contract,reassoc,nsz,afn (neither contract nor reassoc when ordered)",
                            kCacheSchemaVersion, LLVM_VERSION_STRING, llvm::sys::getProcessTriple(), cpu, feature_list);
  }

  std::string identity() const override { return identity_; }

  std::string compile(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names,
                      const std::string& key) override {
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
    return std::string(object.data(), object.size());
  }

 private:
  static void optimise(llvm::Module& module, llvm::TargetMachine& target) {
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

  static void dump(llvm::Module& module, const std::string& key) {
    const char* dir = std::getenv("TESSERA_DUMP");
    if (!dir || !*dir) return;
    std::filesystem::create_directories(dir);
    std::error_code ec;
    llvm::raw_fd_ostream out(std::string(dir) + "/" + key + ".ll", ec);
    if (!ec) module.print(out, nullptr);
  }

  std::string identity_;
};

// The process's one LLJIT: object files from the compile cache (or the compiler) are added once
// and their kernels looked up by name.
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
  }

  std::vector<KernelFunction> load(const std::vector<kir::Kernel>& kernels) {
    const std::string key = CompileCache::key_of(compiler_, kernels);
    std::vector<std::string> names;
    for (size_t i = 0; i < kernels.size(); ++i) names.push_back(fmt::format("tessera_{}_{}", key, i));

    std::lock_guard lock(mutex_);
    if (loaded_.count(key)) {
      ++stats_.memory_hits;
      return lookup(names);
    }
    CachedArtifact object = cache_.get(key, [&] { return compiler_.compile(kernels, names, key); });
    if (object.compiled) {
      ++stats_.compiled_modules;
      stats_.compile_ms += object.compile_ms;
    } else {
      ++stats_.disk_hits;
    }
    auto buffer = llvm::MemoryBuffer::getMemBufferCopy(object.bytes, key);
    if (auto err = jit_->addObjectFile(std::move(buffer))) throw CompileError("adding kernels to the JIT: " + error_text(std::move(err)));
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

  std::mutex mutex_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  LlvmKernelCompiler compiler_;
  CompileCache cache_{".o"};
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


}  // namespace tessera
