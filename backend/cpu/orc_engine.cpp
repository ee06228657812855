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
#include <thread>
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
    std::vector<Part> parts;
    for (const auto& [begin, end] : split_for_cores(kernels)) {
      Part part;
      part.kernels.assign(kernels.begin() + int64_t(begin), kernels.begin() + int64_t(end));
      part.key = CompileCache::key_of(compiler_, part.kernels);
      for (size_t i = 0; i < part.kernels.size(); ++i) part.names.push_back(fmt::format("tessera_{}_{}", part.key, i));
      parts.push_back(std::move(part));
    }
    std::lock_guard lock(mutex_);
    // The parts not loaded yet, from the disk cache or compiled, each on a thread of its own.
    std::vector<Part*> missing;
    for (Part& part : parts)
      if (loaded_.count(part.key)) ++stats_.memory_hits;
      else missing.push_back(&part);
    std::vector<std::exception_ptr> errors(missing.size());
    auto fetch = [&](size_t i) {
      try {
        Part& part = *missing[i];
        part.object = cache_.get(part.key, [&] { return compiler_.compile(part.kernels, part.names, part.key); });
      } catch (...) {
        errors[i] = std::current_exception();
      }
    };
    std::vector<std::thread> helpers;
    for (size_t i = 1; i < missing.size(); ++i) helpers.emplace_back(fetch, i);
    if (!missing.empty()) fetch(0);
    for (std::thread& t : helpers) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    for (Part* part : missing) {
      if (part->object.compiled) {
        ++stats_.compiled_modules;
        stats_.compile_ms += part->object.compile_ms;
      } else {
        ++stats_.disk_hits;
      }
      auto buffer = llvm::MemoryBuffer::getMemBufferCopy(part->object.bytes, part->key);
      if (auto err = jit_->addObjectFile(std::move(buffer))) throw CompileError("adding kernels to the JIT: " + error_text(std::move(err)));
      loaded_.insert(part->key);
    }
    std::vector<KernelFunction> out;
    for (const Part& part : parts)
      for (KernelFunction fn : lookup(part.names)) out.push_back(fn);
    return out;
  }

  CompileStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  // A module of consecutive kernels: compiled, cached and loaded as one.
  struct Part {
    std::vector<kir::Kernel> kernels;
    std::string key;
    std::vector<std::string> names;
    CachedArtifact object;
  };

  // The kernels in consecutive ranges of about equal IR text, one per core, each at least
  // kMinPartText: LLVM compiles a module on one thread, and a program's kernels (a training
  // step's seventy-odd) would otherwise take the cold first step on one core. Small programs
  // stay one module (many small modules compile slower).
  static std::vector<std::pair<size_t, size_t>> split_for_cores(const std::vector<kir::Kernel>& kernels) {
    constexpr size_t kMinPartText = 16384;
    std::vector<size_t> text;
    size_t total = 0;
    for (const kir::Kernel& k : kernels) total += text.emplace_back(k.to_string().size());
    const size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
    const size_t count = std::clamp<size_t>(total / kMinPartText, 1, std::min(cores, kernels.size()));
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t begin = 0, done = 0;
    for (size_t i = 0; i < kernels.size(); ++i) {
      done += text[i];
      const bool last_part = ranges.size() + 1 == count;
      if (!last_part && done * count >= total * (ranges.size() + 1)) {
        ranges.emplace_back(begin, i + 1);
        begin = i + 1;
      }
    }
    if (begin < kernels.size()) ranges.emplace_back(begin, kernels.size());
    return ranges;
  }

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
