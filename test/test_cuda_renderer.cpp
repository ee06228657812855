// The CUDA renderer on a machine without a GPU: every kernel the compiler produces for a slice
// of the suite's programs (every dtype, reductions, random numbers, matmuls, softmax, a training
// step, random fuzz programs) is rendered to CUDA C and compiled by NVRTC for sm_90, then run by
// the kernel-IR interpreter so the programs' results are still checked. What runs on a GPU is
// checked where there is one; here, that every kernel is valid CUDA for the target.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string_view>

#include <tessera/tessera.hpp>

#include "codegen/cuda_renderer.hpp"
#include "codegen/loop_capabilities.hpp"
#include "codegen/reduction_strategy.hpp"
#include "codegen/math_functions.hpp"
#include "codegen/philox.hpp"
#include "codegen/storage_rounding.hpp"
#include "jit/compile_cache.hpp"
#include "jit/kernel_runner.hpp"
#include "kernel_interpreter.hpp"
#include "program_fuzzer.hpp"
#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/nvrtc_library.hpp"
#include "nvrtc_available.hpp"
#include "training_fixture.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Where no NVRTC library loads, the compiling test cases are reported as skipped; the README's
// test command (scripts/test.sh) installs Debian's and sets TESSERA_REQUIRE_NVRTC=1, so there a
// missing NVRTC fails instead.
const bool kNoNvrtc = NvrtcLibrary::get() == nullptr;
constexpr int kComputeCapability = 90;

struct Compiled {
  bool is_cubin = false;
  std::string binary;
};

// Contraction on or off changes the code, not whether it compiles: the runner's batches mix
// kernels of deterministic and other programs.
Compiled compile_cuda(const std::string& source) {
  static const NvrtcCompiler compiler(kComputeCapability, /*deterministic=*/false);
  NvrtcOutput out = compiler.compile_source(source, "kernel.cu");
  return {out.is_cubin, std::move(out.binary)};
}

// The KernelCompiler interface as the compile cache drives it: (identity, artifact).
std::pair<std::string, std::string> compile_as_kernel_compiler(const std::vector<kir::Kernel>& kernels) {
  NvrtcCompiler compiler(kComputeCapability, !kernels.empty() && kernels.front().ordered_reductions);
  const std::string key = CompileCache::key_of(compiler, kernels);
  std::vector<std::string> names;
  for (size_t i = 0; i < kernels.size(); ++i) names.push_back(fmt::format("tessera_{}_{}", key, i));
  return {compiler.identity(), compiler.compile(kernels, names, key)};
}

bool is_elf(const std::string& binary) { return binary.size() > 4 && binary.compare(0, 4, "\x7f" "ELF") == 0; }

// The kernel runner of these tests: every call is run by the interpreter, and each distinct
// kernel (by its IR text) is kept for NVRTC. Kernels run on the device threads, hence the lock.
// Process-wide, so a kernel shared by several test cases compiles once.
class CompileThenInterpret {
 public:
  struct Counts {
    int64_t kernels_compiled = 0, kernel_runs = 0;
    double compile_ms = 0;
    std::vector<std::string> failures;
  };

  void operator()(const kir::Kernel& kernel, void** buffers, const int64_t* params, int64_t begin, int64_t end) {
    std::string text = kernel.to_string();
    {
      std::lock_guard lock(mutex_);
      ++counts_.kernel_runs;
      if (seen_.insert(std::move(text)).second) pending_.push_back(kir::for_target(kernel, kir::LoopTarget::Cuda));
    }
    interpret_kernel(kernel, buffers, params, begin, end);
  }

  // Compiles the kernels kept since the last call, many to an NVRTC program (as a program's
  // kernels are compiled together): NVRTC's fixed cost per program (~20 ms) would otherwise
  // double the time. A failing program is compiled again kernel by kernel to name the culprit.
  void compile_pending() {
    std::lock_guard lock(mutex_);
    constexpr size_t kPerProgram = 64;
    for (size_t first = 0; first < pending_.size(); first += kPerProgram) {
      const std::vector<kir::Kernel> batch(pending_.begin() + ptrdiff_t(first),
                                           pending_.begin() + ptrdiff_t(std::min(pending_.size(), first + kPerProgram)));
      std::vector<std::string> names;
      for (size_t i = 0; i < batch.size(); ++i) names.push_back(fmt::format("tessera_kernel_{}", counts_.kernels_compiled + int64_t(i)));
      const auto start = std::chrono::steady_clock::now();
      const std::string failure = compile(render_cuda(batch, names), names);
      counts_.compile_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      counts_.kernels_compiled += int64_t(batch.size());
      if (failure.empty()) continue;
      for (size_t i = 0; i < batch.size(); ++i) {
        const std::string source = render_cuda({batch[i]}, {names[i]});
        const std::string alone = compile(source, {names[i]});
        if (!alone.empty()) counts_.failures.push_back(alone + "\nsource:\n" + source);
      }
      if (counts_.failures.empty()) counts_.failures.push_back(failure);  // fails only together
    }
    pending_.clear();
  }

  Counts counts() {
    std::lock_guard lock(mutex_);
    return counts_;
  }

 private:
  // "" when `source` compiles to an sm_90 CUBIN holding every entry point in `names`.
  static std::string compile(const std::string& source, const std::vector<std::string>& names) {
    try {
      const Compiled c = compile_cuda(source);
      if (!c.is_cubin || !is_elf(c.binary)) return "NVRTC gave no sm_90 CUBIN";
      for (const auto& name : names)
        if (c.binary.find(name + '\0') == std::string::npos) return "the CUBIN lacks the entry point " + name;
      return "";
    } catch (const CompileError& e) {
      return e.what();
    }
  }

  std::mutex mutex_;
  std::set<std::string> seen_;
  std::vector<kir::Kernel> pending_;
  Counts counts_;
};

CompileThenInterpret& runner() {
  static CompileThenInterpret instance;
  return instance;
}

// Runs `body` with every kernel lowered as for a GPU and interpreted, then compiles its new
// kernels for CUDA, checks that each compiled and reports how many there were.
void with_cuda_compiled_kernels(const std::string& what, const std::function<void()>& body) {
  const auto before = runner().counts();
  {
    KernelRunnerScope scope(
        [](const kir::Kernel& k, void** b, const int64_t* p, int64_t begin, int64_t end) { runner()(k, b, p, begin, end); },
        kir::LoopTarget::Cuda);
    body();
  }
  runner().compile_pending();
  const auto after = runner().counts();
  const int64_t compiled = after.kernels_compiled - before.kernels_compiled;
  const double ms = after.compile_ms - before.compile_ms;
  MESSAGE(fmt::format("{}: {} kernel runs, {} new distinct kernels compiled by NVRTC for sm_{} in {:.0f} ms ({:.1f} ms each); "
                      "{} distinct kernels in this process so far, {:.0f} ms",
                      what, after.kernel_runs - before.kernel_runs, compiled, kComputeCapability, ms,
                      compiled ? ms / double(compiled) : 0.0, after.kernels_compiled, after.compile_ms));
  CHECK(compiled > 0);
  for (size_t i = before.failures.size(); i < after.failures.size(); ++i) FAIL_CHECK(after.failures[i]);
}

// Runs `body` with every kernel lowered for `target` and run by the interpreter; `observe` sees
// each kernel run (kernel and parameters), one at a time.
using KernelObserver = std::function<void(const kir::Kernel& kernel, const int64_t* params)>;
template <class Body>
auto interpreted_as(kir::LoopTarget target, const KernelObserver& observe, Body body) {
  std::mutex mutex;
  KernelRunnerScope scope(
      [&](const kir::Kernel& k, void** b, const int64_t* p, int64_t begin, int64_t end) {
        {
          std::lock_guard lock(mutex);
          observe(k, p);
        }
        interpret_kernel(k, b, p, begin, end);
      },
      target);
  return body();
}

enum class Values { Any, Positive, Int };

struct InputSpec {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  Values values = Values::Any;
};

struct Program {
  std::string name;
  std::vector<InputSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

Array make_input(const InputSpec& spec, std::mt19937& rng) {
  Array a(spec.shape, spec.dtype);
  std::uniform_real_distribution<double> any(-3, 3), positive(0.1, 4);
  std::uniform_int_distribution<int> integer(-9, 9);  // includes 0 and -1: integer division's edge cases
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double v = spec.values == Values::Positive                            ? positive(rng)
                     : spec.values == Values::Int || !is_floating(spec.dtype) ? double(integer(rng))
                                                                                : any(rng);
    store_from_double(a.mutable_bytes(), spec.dtype, i, v);
  }
  return a;
}

// Each program on a 2x2 mesh under two random layouts, checked against the reference.
void run_programs(const std::vector<Program>& programs) {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  std::mt19937 rng(17);
  for (const Program& p : programs) {
    for (int trial = 0; trial < 2; ++trial) {
      std::vector<Tensor> inputs;
      std::map<const Node*, Array> leaves;
      for (const InputSpec& spec : p.inputs) {
        Array a = make_input(spec, rng);
        Tensor t = copy_to_mesh(a, random_layout(mesh, int64_t(spec.shape.size()), rng));
        leaves[t.node().get()] = a;
        inputs.push_back(t);
      }
      CAPTURE(p.name);
      CAPTURE(trial);
      Tensor out = p.fn(inputs);
      const std::string mismatch = compare_with_reference(out.full_tensor(), reference_eval(out, leaves), 1e-4);
      CHECK_MESSAGE(mismatch.empty(), mismatch);
    }
  }
}

// ---- hand-built kernels for the renderer's text ----

kir::Kernel flat_kernel(std::vector<kir::Buffer> buffers, kir::Expr value, kir::LoopKind range = kir::LoopKind::GpuThread) {
  kir::Kernel k;
  k.name = "test";
  k.buffers = std::move(buffers);
  k.num_vars = 1;
  k.outer_extent = kir::param(0);
  k.body = kir::block({kir::for_loop(0, kir::int_const(0), k.outer_extent, {kir::store(0, kir::var(0), std::move(value))}, range)});
  return k;
}

// One kernel with a store per op and type: every kir::Op on every type it applies to, and a
// buffer of every storage type (bf16/f16 through their conversions).
kir::Kernel every_op_kernel() {
  using namespace kir;
  const std::vector<Type> storage = {Type::F32, Type::F64, Type::I32, Type::I64, Type::U8, Type::BF16, Type::F16};
  Kernel k;
  k.name = "every_op";
  for (Type t : storage) k.buffers.push_back({t, true});  // outputs 0-6
  for (Type t : storage) k.buffers.push_back({t, false});  // inputs 7-13
  const int i = 0, acc = 1, inner = 2;
  k.num_vars = 3;
  k.outer_extent = param(0);
  std::vector<StmtPtr> body;
  // Stores `v` into the output of storage type `to` (the store converts, as every store does).
  auto out = [&](Type to, Expr v) {
    const auto b = std::find(storage.begin(), storage.end(), to) - storage.begin();
    body.push_back(store(int(b), var(i), std::move(v)));
  };
  auto in = [&](size_t b) { return load(int(storage.size() + b), storage[b], var(i)); };
  std::vector<Expr> values;
  for (size_t b = 0; b < storage.size(); ++b) values.push_back(in(b));  // bf16 and f16 load as f32
  for (size_t b = 0; b < 5; ++b) {
    const Type t = storage[b];
    const Expr x = values[b], y = in(b);
    for (Op op : {Op::Neg, Op::Abs}) out(t, unary(op, x));
    for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Max, Op::Min}) out(t, binary(op, x, y));
    for (Op op : {Op::Eq, Op::Ne, Op::Lt, Op::Le}) out(Type::U8, binary(op, x, y));
    out(t, select(binary(Op::And, binary(Op::Lt, x, y), binary(Op::Or, binary(Op::Eq, x, x), binary(Op::Ne, y, y))), x, y));
    for (Type to : {Type::I1, Type::I32, Type::I64, Type::U8, Type::F32, Type::F64}) out(Type::F64, cast(x, to));
    if (is_float(t)) {
      for (Op op : {Op::Exp, Op::Log, Op::Sqrt, Op::Tanh, Op::Cos, Op::Sin, Op::Floor}) out(t, unary(op, x));
      out(t, binary(Op::Pow, x, y));
      out(t, t == Type::F32 ? bitcast(bitcast(x, Type::I32), Type::F32) : bitcast(bitcast(x, Type::I64), Type::F64));
    } else {
      out(t, binary(Op::Rem, x, y));
      for (Op op : {Op::Shl, Op::AShr, Op::BitAnd, Op::BitOr, Op::BitXor}) out(t, binary(op, x, int_const(3, t)));
    }
  }
  // bf16 in, f32 math, bf16 out (rounded before the store, as lowering does).
  out(Type::BF16, round_to_storage(exp_f32(values[5]), Type::BF16));
  out(Type::F16, round_to_storage(binary(Op::Mul, log_f32(values[6]), cos_f32(tanh_f32(values[6]))), Type::F16));
  const std::array<Expr, 4> words = philox(var(i), 0x123456789abcdefull);
  out(Type::I64, binary(Op::Add, words[0], words[3]));
  out(Type::I64, binary(Op::MulWide, values[2], in(2)));  // i32 x i32 -> i64
  out(Type::F64, float_const(std::numeric_limits<double>::infinity(), Type::F64));
  out(Type::F32, float_const(std::numeric_limits<double>::quiet_NaN(), Type::F32));
  out(Type::I32, int_const(INT32_MIN, Type::I32));
  out(Type::I64, int_const(INT64_MIN, Type::I64));
  // A serial inner loop with a mutable accumulator.
  body.push_back(declare(acc, Type::F32, float_const(0, Type::F32)));
  body.push_back(for_loop(inner, int_const(0), param(1),
                          {assign(acc, binary(Op::Add, var(acc, Type::F32), load(7, Type::F32, var(inner))))}));
  body.push_back(store(0, var(i), var(acc, Type::F32)));
  k.body = block({for_loop(i, int_const(0), k.outer_extent, std::move(body), LoopKind::GpuThread)});
  return k;
}

}  // namespace

TEST_CASE("NVRTC loads wherever the test command installed it, and names its version") {
  if (!nvrtc_available()) return;
  const std::string version = NvrtcCompiler::nvrtc_version();
  MESSAGE("NVRTC ", version);
  const std::string identity = NvrtcCompiler(kComputeCapability, false).identity();
  CHECK(identity.find("nvrtc=" + version) != std::string::npos);
  // A deterministic target's kernels are compiled without contraction, under another cache key.
  CHECK(identity.find("--fmad=true") != std::string::npos);
  CHECK(NvrtcCompiler(kComputeCapability, true).identity().find("--fmad=false") != std::string::npos);
}

TEST_CASE("the CUDA renderer: extern \"C\" __global__ kernels taking the CPU's ABI by value, a grid-stride outer loop") {
  using namespace kir;
  const Kernel k = flat_kernel({{Type::BF16, true}, {Type::F32, false}},
                               round_to_storage(binary(Op::Add, load(1, Type::F32, var(0)), float_const(0.5, Type::F32)), Type::BF16));
  const std::string cuda = render_cuda({k}, {"add_half"});
  CHECK(cuda.find("typedef long long int64_t;") != std::string::npos);
  CHECK(cuda.find("struct add_half_args { void* buffers[2]; int64_t params[1]; int64_t begin, end; };") != std::string::npos);
  CHECK(cuda.find("extern \"C\" __global__ void add_half(const add_half_args args)") != std::string::npos);
  CHECK(cuda_kernel_abi(k).buffer_words == 2);
  CHECK(cuda_kernel_abi(k).param_words == 1);  // none read: one word, C++ has no empty arrays
  CHECK(cuda.find("for (v0 = begin + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v0 < end; v0 += (int64_t)gridDim.x * blockDim.x)") !=
        std::string::npos);
  CHECK(cuda.find("uint16_t* __restrict__ b0 = (uint16_t*)buffers[0];") != std::string::npos);  // written
  CHECK(cuda.find("const float* __restrict__ b1 = (const float*)buffers[1];") != std::string::npos);  // only read
  CHECK(cuda.find("const float t0 = b1[v0];") != std::string::npos);
  CHECK(cuda.find("const float t1 = t0 + (0.5f);") != std::string::npos);
  CHECK(cuda.find("b0[v0] = tsr_bf16_bits(t") != std::string::npos);  // rounded in IR: the store narrows

  // Dependent iterations (a column reduction) run in order on one thread.
  const std::string serial = render_cuda({flat_kernel({{Type::F32, true}}, float_const(1, Type::F32), LoopKind::Ordered)}, {"serial"});
  CHECK(serial.find("if (blockIdx.x == 0 && threadIdx.x == 0) {") != std::string::npos);
  CHECK(serial.find("for (v0 = begin; v0 < end; ++v0) {") != std::string::npos);

  // Lowering marks the range loop Parallel (a CPU's threads split it); for_target maps it to
  // the GPU's grid-stride loop, and the renderer takes only kernels mapped for it.
  const Kernel cpu = flat_kernel({{Type::F32, true}}, float_const(1, Type::F32), LoopKind::Parallel);
  CHECK_THROWS_AS(render_cuda({cpu}, {"cpu"}), InternalError);
  CHECK(for_target(cpu, LoopTarget::Cuda).range_loop() == LoopKind::GpuThread);
  CHECK(cpu.range_loop() == LoopKind::Parallel);  // the CPU kernel itself is left as it is
  CHECK(for_target(for_target(cpu, LoopTarget::Cuda), LoopTarget::Cpu).range_loop() == LoopKind::Parallel);

  // Philox is IR: its rounds are temporaries computed once however many words are read, one
  // widening multiply per product (19: the first round's other product is of a zero word);
  // constants keep their exact bits.
  const Expr counter = binary(Op::Mul, var(0), int_const(3));
  const std::array<Expr, 4> words = philox(counter, 7);
  const Expr all_words = binary(Op::BitOr, binary(Op::BitOr, words[0], words[1]), binary(Op::BitOr, words[2], words[3]));
  const std::string random = render_cuda({flat_kernel({{Type::I64, true}}, all_words)}, {"r"});
  size_t multiplies = 0;
  for (size_t at = random.find("__umulhi("); at != std::string::npos; at = random.find("__umulhi(", at + 1)) ++multiplies;
  CHECK(multiplies == 19);
  CHECK(random.find(" ^ ") != std::string::npos);
  const Expr mask = int_const(0x807fffff, Type::I32);  // kept as an i32: wraps to a negative literal
  const std::string consts = render_cuda({flat_kernel({{Type::I32, true}}, binary(Op::BitAnd, load(0, Type::I32, var(0)), mask))}, {"c"});
  CHECK(consts.find("t0 & (-2139095041)") != std::string::npos);
  const std::string nan = render_cuda({flat_kernel({{Type::F32, true}}, float_const(std::nan(""), Type::F32))}, {"n"});
  CHECK(nan.find("__uint_as_float(0x7fc00000u)") != std::string::npos);

  CHECK_THROWS_AS(render_cuda({k}, {"not an identifier"}), InternalError);
  CHECK_THROWS_AS(render_cuda({flat_kernel({{Type::F32, true}}, var(5, Type::F32))}, {"undeclared"}), InternalError);
}

TEST_CASE("column reductions lowered for CUDA run one thread per output element and give the CPU's bits") {
  // Lowered for the CPU, a column reduction streams its input through one running output row in
  // one ordered range loop (one GPU thread); for CUDA it is a parallel loop over the outputs,
  // each adding its column in the same order. Both run here through the interpreter.
  struct Case {
    std::string name;
    DType dtype;
    std::function<Tensor(const Tensor&)> fn;
    bool stays_ordered = false;  // narrow outputs keep streaming (they round each partial sum)
  };
  const std::vector<Case> cases = {
      {"sum axis 0", DType::f32, [](const Tensor& x) { return reduce_sum(x, {0}); }},
      {"sum axes 0 and 1", DType::f32, [](const Tensor& x) { return reduce_sum(x, {0, 1}); }},
      {"mean axis 1", DType::f32, [](const Tensor& x) { return reduce_mean(x, {1}); }},
      {"max and min axis 0", DType::f32, [](const Tensor& x) { return reduce_max(x, {0}) - reduce_min(x, {0}); }},
      {"prod axis 0, f64", DType::f64, [](const Tensor& x) { return reduce_prod(x * 0.5, {0}); }},
      {"sum axis 0, i32", DType::i32, [](const Tensor& x) { return reduce_sum(x, {0}); }},
      {"sum axis 0, bf16", DType::bf16, [](const Tensor& x) { return reduce_sum(x, {0}); }, true},
  };
  const std::vector<Mesh> meshes = {create_mesh({{"x", 4}}), create_mesh({{"x", 2}, {"y", 2}})};
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    for (const Mesh& mesh : meshes) {
      CAPTURE(c.name);
      CAPTURE(mesh.to_string());
      // 7 rows over 4 devices: uneven shards, and the reduced axis sharded (an all_reduce after).
      const Array a = make_input(InputSpec{{7, 5, 3}, c.dtype}, rng);
      const Layout layout = mesh.ndim() == 1 ? Layout({"x", UNSHARDED, UNSHARDED}, mesh) : Layout({"x", "y", UNSHARDED}, mesh);
      std::vector<kir::LoopKind> loops;
      auto run_as = [&](kir::LoopTarget target) {
        const auto observe = [&](const kir::Kernel& k, const int64_t*) {
          if (target == kir::LoopTarget::Cuda) loops.push_back(k.range_loop());
        };
        return interpreted_as(target, observe,
                              [&] { return c.fn(copy_to_mesh(a, layout)).full_tensor(); });
      };
      const Array cpu = run_as(kir::LoopTarget::Cpu), cuda = run_as(kir::LoopTarget::Cuda);
      REQUIRE(cpu.nbytes() == cuda.nbytes());
      CHECK(std::memcmp(cpu.bytes(), cuda.bytes(), size_t(cpu.nbytes())) == 0);
      const bool any_ordered = std::count(loops.begin(), loops.end(), kir::LoopKind::Ordered) > 0;
      CHECK(!loops.empty());
      CHECK(any_ordered == c.stays_ordered);
    }
  }
}

TEST_CASE("lowered for CUDA, long reductions run a warp per output element; deterministic mode keeps a thread each") {
  std::mt19937 rng(8);
  const Array a = make_input(InputSpec{{3, 200}}, rng);
  const Mesh mesh = create_mesh({{"x", 1}});
  for (const bool deterministic : {false, true}) {
    CAPTURE(deterministic);
    if (deterministic) setenv("TESSERA_DETERMINISTIC", "1", 1);
    std::vector<kir::Kernel> kernels;
    interpreted_as(kir::LoopTarget::Cuda, [&](const kir::Kernel& k, const int64_t*) { kernels.push_back(k); }, [&] {
      Tensor x = copy_to_mesh(a, Layout::replicated(mesh, 2));
      const Array rows = reduce_sum(x, {1}).full_tensor();
      std::map<const Node*, Array> leaves = {{x.node().get(), a}};
      CHECK(compare_with_reference(rows, reference_eval(reduce_sum(x, {1}), leaves), 1e-5).empty());
    });
    unsetenv("TESSERA_DETERMINISTIC");
    REQUIRE(kernels.size() == 1);
    // Lowering for CUDA gives the range loop as the GPU runs it.
    CHECK(kernels[0].range_loop() == (deterministic ? kir::LoopKind::GpuThread : kir::LoopKind::GpuWarp));
    const std::string cuda = render_cuda({kernels[0]}, {"rows"});
    CHECK((cuda.find("__shfl_xor_sync(0xffffffffu, ") != std::string::npos) == !deterministic);
    CHECK((cuda.find("+= 32) {") != std::string::npos) == !deterministic);
    // On a CPU the lanes are one thread's serial loop.
    CHECK(kir::for_target(kernels[0], kir::LoopTarget::Cpu).range_loop() == kir::LoopKind::Parallel);
  }
}

TEST_CASE("lowered for CUDA, few outputs over many elements run a block per output; deterministic mode a warp folding in order, or a thread each") {
  // A whole-array sum, a scalar over a prelude (a scalar reduce inside: the loss's shape), a
  // bias gradient (column sums of few columns), integer and max reductions; on 1 device and on
  // 4 with the reduced axis sharded unevenly (each device reduces its block, then an all_reduce).
  struct Case {
    std::string name;
    InputSpec input;
    std::function<Tensor(const Tensor&)> fn;
  };
  const std::vector<Case> cases = {
      {"whole sum", {{300, 41}}, [](const Tensor& x) { return reduce_sum(x, {0, 1}); }},
      // Rows longer than a cascade block: each thread's rows still add in blocked partial sums.
      {"whole sum, long rows", {{260, 600}}, [](const Tensor& x) { return reduce_sum(x, {0, 1}); }},
      {"scalar over a scalar prelude", {{2500, 3}}, [](const Tensor& x) {
         return reduce_sum(exp(x - reduce_max(x, {0, 1})), {0, 1});
       }},
      {"column sums", {{4099, 7}}, [](const Tensor& x) { return reduce_sum(x, {0}); }},
      {"max, f64", {{2049, 2}, DType::f64}, [](const Tensor& x) { return reduce_max(x, {0}); }},
      {"sum, i64", {{3001}, DType::i64}, [](const Tensor& x) { return reduce_sum(x, {0}); }},
  };
  std::mt19937 rng(21);
  for (const Case& c : cases) {
    const Array a = make_input(c.input, rng);
    for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 4}})}) {
      for (const bool deterministic : {false, true}) {
        CAPTURE(c.name);
        CAPTURE(mesh.to_string());
        CAPTURE(deterministic);
        if (deterministic) setenv("TESSERA_DETERMINISTIC", "1", 1);
        std::vector<kir::Kernel> kernels;
        const auto observe = [&](const kir::Kernel& k, const int64_t*) { kernels.push_back(k); };
        const Layout layout = Layout::batch_sharded(mesh, "x", int64_t(c.input.shape.size()));
        const Array cuda = interpreted_as(kir::LoopTarget::Cuda, observe, [&] {
          Tensor x = copy_to_mesh(a, layout);
          const Array got = c.fn(x).full_tensor();
          std::map<const Node*, Array> leaves = {{x.node().get(), a}};
          CHECK(compare_with_reference(got, reference_eval(c.fn(x), leaves), 1e-5).empty());
          return got;
        });
        if (deterministic) {  // the CPU's order: its bits
          const Array cpu = interpreted_as(kir::LoopTarget::Cpu, [](const kir::Kernel&, const int64_t*) {},
                                           [&] { return c.fn(copy_to_mesh(a, layout)).full_tensor(); });
          CHECK(same_array(cpu, cuda));
        }
        unsetenv("TESSERA_DETERMINISTIC");
        const bool any_block = std::any_of(kernels.begin(), kernels.end(), [](const kir::Kernel& k) {
          return k.range_loop() == kir::LoopKind::GpuBlock;
        });
        CHECK(any_block == !deterministic);
        // Deterministic float sums in a cascade: a warp per output, its lanes folded in order.
        const bool any_in_order = std::any_of(kernels.begin(), kernels.end(), [](const kir::Kernel& k) {
          return k.to_string().find("lanes_in_order") != std::string::npos;
        });
        CHECK(any_in_order == (deterministic && (c.name != "column sums" && c.name != "max, f64" && c.name != "sum, i64")));
        for (const kir::Kernel& k : kernels)
          if (k.to_string().find("lanes_in_order") != std::string::npos) {
            CHECK(k.range_loop() == kir::LoopKind::GpuWarp);
            CHECK(render_cuda({k}, {"in_order"}).find("tsr_f = tsr_f + __shfl_sync(0xffffffffu, ") != std::string::npos);
          }
        for (const kir::Kernel& k : kernels) {
          if (k.range_loop() != kir::LoopKind::GpuBlock) continue;
          // The block's threads split the reduced loop and meet in shared memory.
          const std::string cuda = render_cuda({k}, {"block_reduce"});
          CHECK(cuda.find("+= (int64_t)blockDim.x) {") != std::string::npos);
          CHECK(cuda.find("__shared__") != std::string::npos);
          CHECK(cuda.find("__syncthreads();") != std::string::npos);
          CHECK(kir::for_target(k, kir::LoopTarget::Cpu).range_loop() == kir::LoopKind::Parallel);
          if (c.name == "whole sum, long rows") CHECK(k.to_string().find("min.i64(") != std::string::npos);  // blocked_sum's block ends
        }
      }
    }
  }
}

TEST_CASE("lowered for CUDA, a reduction whose outer reduced axes are short splits their product over the block's threads or the warp's lanes") {
  // A sum of a [2, 8, 64, 16] array (its outermost axis, 2, once split over 256 threads), and
  // column sums over [4, 32, 1100]'s two leading axes (a warp per output, 4 rows for 32 lanes);
  // on 1 device and on 2 with the leading axis sharded.
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<int64_t> axes;
    kir::LoopKind range;
    int64_t lanes_extent;  // on one device
  };
  const std::vector<Case> cases = {{"whole sum", {2, 8, 64, 16}, {0, 1, 2, 3}, kir::LoopKind::GpuBlock, 2 * 8 * 64},
                                   {"leading columns", {4, 32, 1100}, {0, 1}, kir::LoopKind::GpuWarp, 4 * 32}};
  std::mt19937 rng(5);
  for (const Case& c : cases)
    for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}})}) {
      CAPTURE(c.name);
      CAPTURE(mesh.to_string());
      const Array a = random_array(c.shape, DType::f32, rng);
      std::vector<int64_t> lanes_extents;
      const auto observe = [&](const kir::Kernel& k, const int64_t* params) {
        if (k.range_loop() != c.range) return;
        std::function<void(const kir::StmtPtr&)> walk = [&](const kir::StmtPtr& st) {
          if (st->kind == kir::Stmt::Kind::For && st->loop == kir::LoopKind::Lanes) lanes_extents.push_back(kir::evaluate(st->b, params));
          for (const kir::StmtPtr& child : st->body) walk(child);
        };
        walk(k.body);
      };
      const Layout layout = Layout::batch_sharded(mesh, "x", int64_t(c.shape.size()));
      interpreted_as(kir::LoopTarget::Cuda, observe, [&] {
        Tensor x = copy_to_mesh(a, layout);
        const Tensor sum = reduce_sum(x, c.axes);
        std::map<const Node*, Array> leaves = {{x.node().get(), a}};
        const std::string mismatch = compare_with_reference(sum.full_tensor(), reference_eval(sum, leaves), 1e-5);
        CHECK_MESSAGE(mismatch.empty(), mismatch);
        return 0;
      });
      // Each device's lanes split the merged leading axes of its block (half the first axis on 2).
      REQUIRE(!lanes_extents.empty());
      for (int64_t e : lanes_extents) CHECK(e == c.lanes_extent / mesh.size());
    }
}

TEST_CASE("reduction strategies follow the target's capabilities, not its name") {
  const LoopCapabilities cpu = loop_capabilities(kir::LoopTarget::Cpu), cuda = loop_capabilities(kir::LoopTarget::Cuda);
  const LoopCapabilities threads_only{.thread_per_iteration = true, .lanes = false};
  // A loss: one output summing 4096 x 10 floats over rows.
  ReductionFacts loss;
  loss.reduced_elements = 40960;
  loss.output_elements = 1;
  loss.reduced_extents = {4096, 10};
  loss.reduces_innermost_axis = true;
  // A bias gradient: 2000 outputs (too many for a block each), each a column of 4096 rows.
  ReductionFacts column = loss;
  column.reduced_elements = 4096;
  column.reduced_extents = {4096};
  column.output_elements = 2000;
  column.reduces_innermost_axis = false;
  auto threads = [](const ReductionFacts& f, const LoopCapabilities& c) { return reduction_strategy(f, c).threads; };
  CHECK(threads(loss, cpu) == ReductionThreads::One);
  CHECK(threads(loss, cuda) == ReductionThreads::Block);
  CHECK(threads(loss, threads_only) == ReductionThreads::One);  // no lanes: no warps, no blocks
  ReductionFacts ordered_loss = loss;
  ordered_loss.ordered = true;
  CHECK(threads(ordered_loss, cuda) == ReductionThreads::OrderedWarp);
  CHECK(threads(ordered_loss, cpu) == ReductionThreads::One);
  // A column streams on the CPU; where iterations are threads it is a row reduction per output.
  CHECK_FALSE(reduction_strategy(column, cpu).per_output);
  CHECK(reduction_strategy(column, threads_only).per_output);
  CHECK(threads(column, threads_only) == ReductionThreads::One);
  CHECK(threads(column, cuda) == ReductionThreads::Warp);
  ReductionFacts column_with_prelude = column;
  column_with_prelude.has_preludes = true;  // every lane would repeat the per-row work
  CHECK(threads(column_with_prelude, cuda) == ReductionThreads::One);
  // bf16 outputs keep streaming (a register would not round the partial sums as storage does).
  ReductionFacts bf16_column = column;
  bf16_column.storage = kir::Type::BF16;
  CHECK_FALSE(reduction_strategy(bf16_column, cuda).per_output);
  // A long reduce read by other ops runs as a kernel of its own only where iterations are threads.
  // Short leading axes: merged until every thread of the block (lane of the warp) has work.
  CHECK(reduction_strategy(loss, cuda).merged_loops == 1);
  ReductionFacts short_outer = loss;
  short_outer.reduced_extents = {2, 8, 8192, 128};
  short_outer.reduced_elements = 2 * 8 * 8192 * 128;
  CHECK(threads(short_outer, cuda) == ReductionThreads::Block);
  CHECK(reduction_strategy(short_outer, cuda).merged_loops == 3);  // 2, 16, then 131,072 >= 256
  CHECK(merged_extent(short_outer, 3) == 131072);
  ReductionFacts short_column = column;
  short_column.reduced_extents = {4, 16, 64};
  CHECK(threads(short_column, cuda) == ReductionThreads::Warp);
  CHECK(reduction_strategy(short_column, cuda).merged_loops == 2);  // 4, then 64 >= 32 lanes
  CHECK(reduction_strategy(short_outer, cpu).merged_loops == 1);   // no lanes: the loops as they are
  ReductionFacts ordered_short = short_outer;
  ordered_short.ordered = true;
  CHECK(reduction_strategy(ordered_short, cuda).merged_loops == 1);  // deterministic: the CPU's order
  CHECK(reduce_runs_alone(loss, cuda));
  CHECK(reduce_runs_alone(loss, threads_only));
  CHECK_FALSE(reduce_runs_alone(loss, cpu));
}

TEST_CASE("check_index lowered for CUDA runs in one block and reports the first index out of range, as the CPU does") {
  // 3000 labels, a few out of range: the first in index order is named on both targets, and
  // labels in range give the same loss.
  std::mt19937 rng(4);
  const Array logits = make_input(InputSpec{{3000, 10}}, rng);
  Array labels({3000}, DType::i64);
  for (int64_t i = 0; i < 3000; ++i) labels.mutable_data<int64_t>()[i] = i % 10;
  const Mesh mesh = create_mesh({{"x", 1}});
  auto loss = [&](const Array& ids) {
    Tensor y = copy_to_mesh(ids, Layout::replicated(mesh, 1)), x = copy_to_mesh(logits, Layout::replicated(mesh, 2));
    return reduce_mean(sparse_softmax_cross_entropy_with_logits(y, x)).full_tensor();
  };
  auto message_as = [&](kir::LoopTarget target, const Array& ids) -> std::string {
    try {
      interpreted_as(target, [](const kir::Kernel&, const int64_t*) {}, [&] { return loss(ids); });
    } catch (const IndexError& e) {
      return e.what();
    }
    return "";
  };
  std::vector<kir::LoopKind> loops;
  const Array cpu = interpreted_as(kir::LoopTarget::Cpu, [](const kir::Kernel&, const int64_t*) {}, [&] { return loss(labels); });
  const Array cuda = interpreted_as(kir::LoopTarget::Cuda, [&](const kir::Kernel& k, const int64_t*) {
    if (k.status_buffer >= 0) loops.push_back(k.range_loop());
  }, [&] { return loss(labels); });
  CHECK(cpu.to_vector<float>()[0] == doctest::Approx(cuda.to_vector<float>()[0]).epsilon(1e-6));
  REQUIRE(loops.size() == 1);
  CHECK(loops[0] == kir::LoopKind::GpuBlock);
  Array bad = labels.clone();
  bad.mutable_data<int64_t>()[2100] = 10;
  bad.mutable_data<int64_t>()[1717] = -3;  // the first in index order
  bad.mutable_data<int64_t>()[2999] = 99;
  const std::string on_cpu = message_as(kir::LoopTarget::Cpu, bad), on_cuda = message_as(kir::LoopTarget::Cuda, bad);
  CHECK(on_cpu.find("-3") != std::string::npos);
  CHECK(on_cuda == on_cpu);
}

TEST_CASE("scatter_add_rows lowered for CUDA runs in parallel and gives the CPU's bits, few rows and many") {
  // The embedding gradient: rows of g added where their ids point, repeated ids included. On a
  // CPU one ordered loop; for CUDA a thread per output element (few rows) or per column.
  for (const auto& [rows, lookups] : {std::pair{int64_t(7), int64_t(19)}, std::pair{int64_t(2048), int64_t(1100)}}) {
    CAPTURE(rows);
    std::mt19937 rng{uint32_t(rows)};
    const Array table = make_input(InputSpec{{rows, 4}}, rng), weights = make_input(InputSpec{{lookups, 4}}, rng);
    Array ids({lookups}, DType::i64);
    std::uniform_int_distribution<int64_t> pick(0, std::min<int64_t>(rows, 5) - 1);  // repeats
    for (int64_t i = 0; i < lookups; ++i) ids.mutable_data<int64_t>()[i] = i % 3 == 0 ? pick(rng) : (i * 7) % rows;
    for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 4}})}) {
      CAPTURE(mesh.to_string());
      std::vector<kir::LoopKind> loops;
      auto run_as = [&](kir::LoopTarget target) {
        const auto observe = [&](const kir::Kernel& k, const int64_t*) {
          if (target == kir::LoopTarget::Cuda) loops.push_back(k.range_loop());
        };
        return interpreted_as(target, observe, [&] {
          // The table's rows sharded (uneven), so each device scatters into its block.
          Tensor t = copy_to_mesh(table, Layout::batch_sharded(mesh, "x", 2));
          Tensor i = copy_to_mesh(ids, Layout::replicated(mesh, 1)), w = copy_to_mesh(weights, Layout::replicated(mesh, 2));
          return gradients(reduce_sum(embedding(i, t) * w), {t})[0].full_tensor();
        });
      };
      const Array cpu = run_as(kir::LoopTarget::Cpu), cuda = run_as(kir::LoopTarget::Cuda);
      CHECK(same_array(cpu, cuda));
      // Nothing runs in one thread: check_index runs in a block on each device.
      CHECK(std::count(loops.begin(), loops.end(), kir::LoopKind::Ordered) == 0);
      CHECK(std::count(loops.begin(), loops.end(), kir::LoopKind::GpuBlock) >= mesh.size());
      // The gradient of a row is the sum of the weights of the lookups naming it.
      for (int64_t r = 0; r < std::min<int64_t>(rows, 8); ++r) {
        double expected = 0;
        for (int64_t l = 0; l < lookups; ++l)
          if (ids.data<int64_t>()[l] == r) expected += weights.data<float>()[l * 4 + 1];
        CHECK(cuda.data<float>()[r * 4 + 1] == doctest::Approx(expected).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("lowered for CUDA, a loop nest's leading axes are one flat range loop: a thread per element, not per row") {
  // A scalar broadcast keeps the kernel from being one flat elementwise loop: on a CPU its range
  // loop is the rows (threads split them, the row loop vectorises); on CUDA it is every element.
  // Softmax's row reductions stay once per row: only the axes above them flatten.
  std::mt19937 rng(3);
  const Array a = make_input(InputSpec{{6, 10, 3}}, rng);
  const Mesh mesh = create_mesh({{"x", 1}});
  for (const auto& [target, elementwise_extent] : {std::pair{kir::LoopTarget::Cpu, int64_t(6)}, std::pair{kir::LoopTarget::Cuda, int64_t(180)}}) {
    std::vector<int64_t> extents;
    const auto observe = [&](const kir::Kernel& k, const int64_t* p) { extents.push_back(kir::evaluate(k.outer_extent, p)); };
    interpreted_as(target, observe, [&] {
      Tensor x = copy_to_mesh(a, Layout::replicated(mesh, 3));
      Tensor scale = reduce_max(x);  // a scalar of its own kernel
      const Array scaled = (x * scale + 1.0).full_tensor();
      CHECK(extents.back() == elementwise_extent);
      const Array rows = softmax(x).full_tensor();  // the row reductions hoisted per [6, 10] row
      CHECK(extents.back() == (target == kir::LoopTarget::Cuda ? 60 : 6));
      std::map<const Node*, Array> leaves = {{x.node().get(), a}};
      CHECK(compare_with_reference(rows, reference_eval(softmax(x), leaves), 1e-5).empty());
      CHECK(compare_with_reference(scaled, reference_eval(x * scale + 1.0, leaves), 1e-5).empty());
    });
  }
}

TEST_CASE("NVRTC compiles a kernel of every op and type to an sm_90 CUBIN; its errors are CompileErrors with the log" *
          doctest::skip(kNoNvrtc)) {
  const std::string source = render_cuda({every_op_kernel()}, {"every_op"});
  Compiled c;
  REQUIRE_NOTHROW(c = compile_cuda(source));
  CHECK(c.is_cubin);
  CHECK(is_elf(c.binary));
  CHECK(c.binary.find(std::string("every_op") + '\0') != std::string::npos);  // the entry point's symbol

  const auto [identity, artifact] = compile_as_kernel_compiler({every_op_kernel(), every_op_kernel()});
  CHECK(identity.find("nvrtc=") != std::string::npos);
  CHECK(identity.find("arch=sm_90") != std::string::npos);
  CHECK(is_elf(artifact));

  try {
    compile_cuda(std::string(render_cuda({}, {})) + "extern \"C\" __global__ void broken() { undefined_name = 1; }\n");
    FAIL("a broken source compiled");
  } catch (const CompileError& e) {
    CHECK(std::string(e.what()).find("undefined_name") != std::string::npos);  // NVRTC's log
  }
}

TEST_CASE("every kernel of elementwise programs of every dtype, reductions, random numbers, matmuls and softmax compiles for CUDA" *
          doctest::skip(kNoNvrtc)) {
  const InputSpec a{{5, 7}}, b{{5, 7}}, ints{{4, 6}, DType::i32}, longs{{4, 6}, DType::i64};
  const std::vector<Program> programs = {
      {"f32_unary", {a}, [](auto& x) {
         return exp(x[0]) + log(abs(x[0]) + 1.0) * tanh(x[0]) - sqrt(abs(x[0])) + sigmoid(x[0]) + relu(x[0]);
       }},
      {"f32_binary", {a, b}, [](auto& x) { return maximum(x[0], x[1]) - minimum(x[0], x[1]) * (x[0] / (abs(x[1]) + 1.0)); }},
      {"pow", {{{5, 7}, DType::f32, Values::Positive}, b}, [](auto& x) { return pow(x[0], x[1] * 0.3); }},
      {"compare_where", {a, b}, [](auto& x) {
         return where(x[0] > x[1], x[0], x[1] * 2.0) + cast(x[0] == x[1], DType::f32) + cast(x[0] <= 0.0, DType::f32);
       }},
      {"bf16", {{{5, 7}, DType::bf16}, {{5, 7}, DType::bf16}}, [](auto& x) { return x[0] * x[1] + x[0]; }},
      {"f16", {{{5, 7}, DType::f16}, {{5, 7}, DType::f16}}, [](auto& x) { return x[0] * x[1] - x[1]; }},
      {"f32_to_f16", {a}, [](auto& x) { return cast(x[0] * 3.0, DType::f16); }},
      {"f32_to_bf16", {a}, [](auto& x) { return cast(exp(x[0]), DType::bf16); }},
      {"f16_to_f64", {{{5, 7}, DType::f16}}, [](auto& x) { return cast(x[0], DType::f64) * 2.0; }},
      {"f64", {{{5, 7}, DType::f64}, {{5, 7}, DType::f64}}, [](auto& x) { return exp(x[0]) * x[1] - log(abs(x[1]) + 1.0) + tanh(x[0]); }},
      {"i32_div", {ints, ints}, [](auto& x) { return x[0] / x[1] + abs(x[1]) - (-x[0]); }},
      {"i64_arith", {longs, longs}, [](auto& x) { return x[0] * x[1] + x[0] / x[1] - 3; }},
      {"int_pow", {ints, {{4, 6}, DType::i32, Values::Positive}}, [](auto& x) { return pow(x[0], abs(x[1])); }},
      {"u8_casts", {a}, [](auto& x) { return cast(cast(x[0], DType::u8), DType::i32) + cast(x[0], DType::i32); }},
      {"reductions", {a}, [](auto& x) {
         return reduce_sum(square(x[0]), {1}) - reduce_max(x[0], {1}) + reduce_min(x[0], {1}) + reduce_mean(x[0], {1});
       }},
      {"column_reductions", {{{3, 4, 5}}}, [](auto& x) { return reduce_sum(x[0], {0}) + reduce_max(x[0], {0}) * reduce_prod(x[0], {0}); }},
      // Long enough for a warp per output element on CUDA (rows and columns, every lanes op).
      {"warp_reductions", {{{3, 200}}, {{200, 3}, DType::f64}}, [](auto& x) {
         return reduce_sum(x[0], {1}) - reduce_max(x[0], {1}) + reduce_min(x[0], {1}) * reduce_prod(abs(x[0]) * 0.0 + 1.0, {1}) +
                cast(reduce_sum(x[1], {0}), DType::f32);
       }},
      {"warp_int_reductions", {{{4, 100}, DType::i64}}, [](auto& x) { return reduce_sum(x[0], {1}) + reduce_max(x[0], {1}); }},
      // Long enough for a block per output element (few outputs), a scalar over a prelude too.
      {"block_reductions", {{{2100, 3}}, {{2048, 2}, DType::i32}}, [](auto& x) {
         return reduce_sum(x[0], {0}) * reduce_max(x[0], {0}) + reduce_sum(exp(x[0] - reduce_max(x[0], {0, 1})), {0, 1}) +
                cast(cast(reduce_min(x[1], {0, 1}), DType::i64) + reduce_sum(x[1], {0, 1}), DType::f32);  // int sums are i64
       }},
      {"argmax", {a}, [](auto& x) { return reshape(cast(argmax(x[0], 1), DType::f32), {5, 1}) + cast(argmax(x[0], 0), DType::f32); }},
      {"int_reduce", {{{6, 5}, DType::i32}}, [](auto& x) { return cast(reduce_max(x[0], {1}) - reduce_min(x[0], {1}), DType::i64) + reduce_sum(x[0], {1}); }},
      {"random", {a}, [](auto& x) {
         const Layout& l = x[0].layout();
         return x[0] * random_normal({5, 7}, 7, l) + random_uniform({5, 7}, 9, l, -2, 3);
       }},
      {"random_f64", {{{5, 7}, DType::f64}}, [](auto& x) {
         const Layout& l = x[0].layout();
         return x[0] + random_normal({5, 7}, 3, l, 1, 0.5, DType::f64) + random_uniform({5, 7}, 4, l, 0, 1, DType::f64);
       }},
      {"softmax", {a}, [](auto& x) { return softmax(x[0]) + log_softmax(x[0], 0); }},
      {"cross_entropy", {{{6}, DType::i64, Values::Int}, {{6, 10}}},
       [](auto& x) { return reduce_mean(sparse_softmax_cross_entropy_with_logits(abs(x[0]), x[1])); }},
      {"matmul_epilogue", {{{6, 5}}, {{5, 3}}, {{3}}}, [](auto& x) { return relu(matmul(x[0], x[1]) + x[2]); }},
      {"int_matmul", {{{4, 5}, DType::i32}, {{5, 3}, DType::i32}}, [](auto& x) { return matmul(x[0], x[1]); }},
      {"bf16_matmul", {{{4, 5}, DType::bf16}, {{5, 3}, DType::bf16}}, [](auto& x) { return matmul(x[0], x[1]); }},
      {"movement", {{{4, 6}}}, [](auto& x) {
         return transpose(concat({pad(x[0], {{1, 0}, {0, 2}}, 0.5), slice(pad(x[0], {{1, 0}, {0, 2}}, 0.5), {0, 0}, {5, 8})}, 0));
       }},
  };
  with_cuda_compiled_kernels("op programs", [&] { run_programs(programs); });
}

TEST_CASE("deterministic reductions' kernels (lanes folded in order) compile for CUDA" * doctest::skip(kNoNvrtc)) {
  std::mt19937 rng(17);
  const Array a = make_input(InputSpec{{3000, 5}}, rng), b = make_input(InputSpec{{700, 2}, DType::f64}, rng);
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  with_cuda_compiled_kernels("deterministic reductions", [&] {
    const Mesh mesh = create_mesh({{"x", 2}});
    Tensor x = copy_to_mesh(a, Layout::batch_sharded(mesh, "x", 2)), y = copy_to_mesh(b, Layout::replicated(mesh, 2));
    (void)(reduce_mean(x, {0, 1}) + cast(reduce_sum(y, {0}), DType::f32)).full_tensor();
  });
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("every kernel of a training step compiles for CUDA" * doctest::skip(kNoNvrtc)) {
  Mesh mesh = create_mesh({{"batch", 2}});
  const Layout w = Layout::replicated(mesh, 2);
  const std::vector<float> compiled = train_losses(mesh, w, w, "batch", 3);
  std::vector<float> interpreted;
  with_cuda_compiled_kernels("training step", [&] { interpreted = train_losses(mesh, w, w, "batch", 3); });
  REQUIRE(interpreted.size() == compiled.size());
  for (size_t s = 0; s < compiled.size(); ++s) CHECK(interpreted[s] == doctest::Approx(compiled[s]).epsilon(1e-5));
}

TEST_CASE("every kernel of random programs compiles for CUDA" * doctest::skip(kNoNvrtc)) {
  with_cuda_compiled_kernels("random programs", [] {
    for (uint64_t seed = 1; seed <= 200; ++seed) {
      CAPTURE(seed);
      const std::string failure = fuzz_one_program(seed);
      CHECK_MESSAGE(failure.empty(), failure);
    }
  });
}
