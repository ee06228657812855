#include "backend/cpu/orc_engine.hpp"

#include <fmt/format.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/Object/ObjectFile.h>
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
#include <unordered_map>
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

// 2: parallel range loops annotated (llvm.loop.parallel_accesses), so the code differs.
constexpr int kCacheSchemaVersion = 2;

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

// Kernel IR -> an object file for this host: LLVM IR, the O2 pipeline for the host CPU (the
// loop and SLP vectorizers included). O3 adds non-trivial loop unswitching, which copied loops
// with a branch inside once per branch: a 2-layer GPT sample's kernels came to 2.2x the IR, its
// training step compiled 2.6-3.7x slower (gpt_bench, 2.5-2.8 s against 0.8-1.0 s), and the steps
// ran no faster within this machine's noise (docs/PERFORMANCE_HISTORY.md, 2026-12-01).
class LlvmKernelCompiler final : public KernelCompiler {
 public:
  LlvmKernelCompiler() {
    const std::string cpu = llvm::sys::getHostCPUName().str();
    std::vector<std::string> features;
    for (const auto& f : llvm::sys::getHostCPUFeatures()) features.push_back((f.second ? "+" : "-") + f.first().str());
    std::sort(features.begin(), features.end());
    std::string feature_list;
    for (const auto& f : features) feature_list += (feature_list.empty() ? "" : ",") + f;
    identity_ = fmt::format("schema={} llvm={} triple={} cpu={} features={} opt=O2 fast-math=contract,reassoc,nsz,afn (neither contract nor reassoc when ordered)",
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
    passes.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(module, mam);
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
    // Each kernel's key: its text under this compiler. Programs share many kernels (a pipeline's
    // schedules, a model's forward in its training and evaluation steps): each is compiled once
    // per process, and once per machine through the disk cache.
    std::vector<std::string> keys, texts;
    for (const kir::Kernel& k : kernels) {
      texts.push_back(k.to_string());
      keys.push_back(CompileCache::key_of_text(compiler_, texts.back()));
    }
    std::lock_guard lock(mutex_);
    std::vector<size_t> missing;  // first occurrences of kernels not loaded yet
    std::set<std::string> seen;
    for (size_t i = 0; i < kernels.size(); ++i) {
      if (loaded_.count(keys[i])) ++stats_.memory_hits;
      else if (seen.insert(keys[i]).second) missing.push_back(i);
    }
    // Kernels another process compiled: the disk index names the part object that holds them.
    std::vector<size_t> to_compile;
    for (size_t i : missing) {
      if (loaded_.count(keys[i])) continue;  // in a part loaded for an earlier kernel of this call
      const std::string part_key = index_.find(keys[i]);
      std::string object = part_key.size() == 32 ? cache_.find(part_key) : std::string();
      if (object.empty()) {
        to_compile.push_back(i);
        continue;
      }
      ++stats_.disk_hits;
      add_part(part_key, object, {});
      if (!loaded_.count(keys[i])) to_compile.push_back(i);  // an index entry for another object: compile afresh
    }
    compile_parts(kernels, keys, texts, to_compile);
    std::vector<KernelFunction> out;
    for (const std::string& key : keys) out.push_back(loaded_.at(key));
    return out;
  }

  CompileStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  // A module of kernels compiled, cached and loaded as one, its entry points named by each
  // kernel's key.
  struct Part {
    std::vector<kir::Kernel> kernels;
    std::vector<std::string> kernel_keys, names;
    std::string key;
    CachedArtifact object;
  };

  static std::string entry_name(const std::string& kernel_key) { return "tessera_" + kernel_key; }

  // The kernels `chosen` compiled in parts of about equal IR text, one per core (split_for_cores),
  // each on a thread of its own, then loaded and entered in the disk index.
  void compile_parts(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& keys,
                     const std::vector<std::string>& texts, const std::vector<size_t>& chosen) {
    if (chosen.empty()) return;
    std::vector<size_t> sizes;
    for (size_t i : chosen) sizes.push_back(texts[i].size());
    std::vector<Part> parts;
    for (const auto& [begin, end] : split_for_cores(sizes)) {
      Part part;
      std::string joined;
      for (size_t j = begin; j < end; ++j) {
        const size_t i = chosen[j];
        part.kernels.push_back(kernels[i]);
        part.kernel_keys.push_back(keys[i]);
        part.names.push_back(entry_name(keys[i]));
        joined += keys[i] + "\n";
      }
      part.key = CompileCache::key_of_source(compiler_, joined);
      parts.push_back(std::move(part));
    }
    std::vector<std::exception_ptr> errors(parts.size());
    auto fetch = [&](size_t i) {
      try {
        Part& part = parts[i];
        part.object = cache_.get(part.key, [&] { return compiler_.compile(part.kernels, part.names, part.key); });
      } catch (...) {
        errors[i] = std::current_exception();
      }
    };
    std::vector<std::thread> helpers;
    for (size_t i = 1; i < parts.size(); ++i) helpers.emplace_back(fetch, i);
    fetch(0);
    for (std::thread& t : helpers) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    for (Part& part : parts) {
      if (part.object.compiled) {
        ++stats_.compiled_modules;
        stats_.compiled_kernels += int64_t(part.kernels.size());
        stats_.compile_ms += part.object.compile_ms;
      } else {
        ++stats_.disk_hits;
      }
      add_part(part.key, part.object.bytes, part.kernel_keys);
      for (const std::string& kernel_key : part.kernel_keys) index_.store(kernel_key, part.key);
    }
  }

  // Adds a part's object to a JITDylib of its own (a kernel may be in several parts, under one
  // name) and enters its kernels: `kernel_keys`, or, for an object read back through the
  // index, whichever of its entry points are not loaded yet.
  void add_part(const std::string& part_key, const std::string& object, const std::vector<std::string>& kernel_keys) {
    auto created = jit_->createJITDylib("tessera_part_" + part_key);
    if (!created) throw CompileError("creating a JITDylib: " + error_text(created.takeError()));
    llvm::orc::JITDylib& dylib = *created;
    dylib.addToLinkOrder(jit_->getMainJITDylib());  // libm and the process's symbols
    auto buffer = llvm::MemoryBuffer::getMemBufferCopy(object, part_key);
    std::vector<std::string> entered = kernel_keys.empty() ? entry_points(*buffer) : kernel_keys;
    if (auto err = jit_->addObjectFile(dylib, std::move(buffer))) throw CompileError("adding kernels to the JIT: " + error_text(std::move(err)));
    for (const std::string& kernel_key : entered) {
      if (loaded_.count(kernel_key)) continue;
      auto address = unwrap(jit_->lookup(dylib, entry_name(kernel_key)), "looking up a kernel");
      loaded_.emplace(kernel_key, address.toPtr<KernelFunction>());
    }
  }

  // The kernel keys of an object's entry points (its defined tessera_<key> functions).
  static std::vector<std::string> entry_points(const llvm::MemoryBuffer& buffer) {
    std::vector<std::string> keys;
    auto file = llvm::object::ObjectFile::createObjectFile(buffer.getMemBufferRef());
    if (!file) throw CompileError("reading a cached kernel object: " + error_text(file.takeError()));
    for (const llvm::object::SymbolRef& symbol : (*file)->symbols()) {
      auto flags = symbol.getFlags();
      auto name = symbol.getName();
      if (!flags || !name) {
        if (!flags) llvm::consumeError(flags.takeError());
        if (!name) llvm::consumeError(name.takeError());
        continue;
      }
      if (*flags & llvm::object::SymbolRef::SF_Undefined) continue;
      const llvm::StringRef text = *name;
      if (text.starts_with("tessera_") && text.size() == 8 + 32) keys.push_back(text.substr(8).str());
    }
    return keys;
  }

  // Consecutive ranges of about equal IR text (`sizes`, per kernel), one per core, each at
  // least kMinPartText: LLVM compiles a module on one thread, and a program's kernels (a
  // training step's seventy-odd) would otherwise take the cold first step on one core. Small
  // programs stay one module (many small modules compile slower).
  static std::vector<std::pair<size_t, size_t>> split_for_cores(const std::vector<size_t>& sizes) {
    constexpr size_t kMinPartText = 16384;
    size_t total = 0;
    for (size_t size : sizes) total += size;
    const size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
    const size_t count = std::clamp<size_t>(total / kMinPartText, 1, std::min(cores, sizes.size()));
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t begin = 0, done = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      done += sizes[i];
      const bool last_part = ranges.size() + 1 == count;
      if (!last_part && done * count >= total * (ranges.size() + 1)) {
        ranges.emplace_back(begin, i + 1);
        begin = i + 1;
      }
    }
    if (begin < sizes.size()) ranges.emplace_back(begin, sizes.size());
    return ranges;
  }

  std::mutex mutex_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  LlvmKernelCompiler compiler_;
  CompileCache cache_{".o"};
  CompileCache index_{".part"};  // kernel key -> the key of the part object that holds it
  std::unordered_map<std::string, KernelFunction> loaded_;  // by kernel key
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
