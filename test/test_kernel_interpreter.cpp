// The kernel-IR interpreter (the renderers' oracle) against the LLVM-compiled kernels on the
// same programs, and against the reference evaluator on random programs.
#include <doctest/doctest.h>

#include <functional>
#include <tuple>

#include <tessera/tessera.hpp>

#include "jit/kernel_runner.hpp"
#include "kernel_interpreter.hpp"
#include "program_fuzzer.hpp"
#include "reference_evaluator.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// `program` on a fresh copy of `input`, run by the compiled kernels or by the interpreter.
Array run(const std::function<Tensor(const Tensor&)>& program, const Array& input, const Layout& layout, bool interpreted) {
  Tensor x = copy_to_mesh(input, layout);  // a new leaf: nothing cached from the other run
  if (!interpreted) return program(x).full_tensor();
  KernelRunnerScope scope(interpret_kernel);
  return program(x).full_tensor();
}

}  // namespace

TEST_CASE("the interpreter and the compiled kernels agree: elementwise, reductions, random bits, bf16 and casts") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Array a(std::vector<int64_t>{7, 9}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i % 11) * 0.37f - 1.7f;
  const Layout layout({"x", "y"}, mesh);
  // Tolerance 0: bitwise. LLVM may contract a*b+c into an FMA and reassociate reductions, so
  // arithmetic agrees to an ulp or two; random bits, conversions and data movement exactly.
  const std::vector<std::tuple<std::string, double, std::function<Tensor(const Tensor&)>>> programs = {
      {"exp_log_tanh", 2e-6, [](const Tensor& x) { return exp(x) + log(abs(x) + 1.0f) * tanh(x); }},
      {"softmax", 2e-6, [](const Tensor& x) { return softmax(x, 1); }},
      {"reductions", 2e-6, [](const Tensor& x) { return reduce_sum(square(x), {0}) - reduce_max(x, {0}) + reduce_min(x, {0}); }},
      {"argmax_compare", 0, [](const Tensor& x) { return reshape(cast(argmax(x, 1), DType::f32), {7, 1}) + cast(x > 0.5f, DType::f32); }},
      {"random", 2e-6, [&](const Tensor& x) {
         return x * random_normal(x.shape(), 7, layout) + random_uniform(x.shape(), 9, layout);
       }},
      {"bf16_f16_i32", 0, [](const Tensor& x) {
         return cast(cast(x, DType::bf16), DType::f32) + cast(cast(x * 3.0f, DType::f16), DType::f32) +
                cast(cast(x * 10.0f, DType::i32), DType::f32);
       }},
      {"movement", 0, [](const Tensor& x) {
         return transpose(concat({pad(x, {{1, 0}, {0, 2}}, 0.5), slice(pad(x, {{1, 0}, {0, 2}}, 0.5), {0, 0}, {8, 11})}, 0));
       }},
  };
  for (const auto& [name, tolerance, program] : programs) {
    CAPTURE(name);
    const Array compiled = run(program, a, layout, false), interpreted = run(program, a, layout, true);
    CHECK(compare_with_reference(interpreted, ref_from_array(compiled), tolerance) == "");
  }
}

TEST_CASE("random programs run by the interpreter match the reference evaluator") {
  KernelRunnerScope scope(interpret_kernel);
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    CAPTURE(seed);
    const std::string failure = fuzz_one_program(seed);
    CHECK_MESSAGE(failure.empty(), failure);
  }
}
