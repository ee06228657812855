// The kernel-IR interpreter (the renderers' oracle) against the LLVM-compiled kernels on the
// same programs, and against the reference evaluator on random programs.
#include <doctest/doctest.h>

#include <functional>
#include <tuple>

#include <tessera/tessera.hpp>

#include "codegen/kernel_mutator.hpp"
#include "codegen/kernel_verify.hpp"
#include "codegen/philox.hpp"
#include "codegen/split_loops.hpp"
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

namespace {

// A column reduction of a [B, T, H, E] block over B and T into [H * E], the inner loop reading
// through the head-merging index (v / E, v % E): what a bias gradient of attention's heads is.
kir::Kernel head_merging_column_sum(int64_t B, int64_t T, int64_t H, int64_t E, int64_t inner_trip) {
  using namespace kir;
  const Expr b = var(0), t = var(1), c = var(2);
  const Expr e = int_const(E);
  const Expr source = binary(Op::Add, binary(Op::Add, binary(Op::Rem, c, e), binary(Op::Mul, binary(Op::Div, c, e), int_const(T * E))),
                             binary(Op::Add, binary(Op::Mul, t, e), binary(Op::Mul, b, int_const(H * T * E))));
  Kernel k;
  k.name = "column_sum";
  k.buffers = {{Type::F32, true}, {Type::F32, false}};
  k.num_vars = 4;
  k.outer_extent = int_const(1);
  StmtPtr init = for_loop(2, int_const(0), int_const(inner_trip), {store(0, c, float_const(0, Type::F32))});
  StmtPtr accumulate =
      for_loop(0, int_const(0), int_const(B),
               {for_loop(1, int_const(0), int_const(T),
                         {for_loop(2, int_const(0), int_const(inner_trip),
                                   {store(0, c, binary(Op::Add, load(0, Type::F32, c), load(1, Type::F32, source)))})})});
  k.body = block({for_loop(3, int_const(0), int_const(1), {init, accumulate}, LoopKind::Ordered)});
  return k;
}

std::vector<float> run_interpreted(const kir::Kernel& k, const std::vector<float>& input, size_t outputs) {
  std::vector<float> in = input, out(outputs, -1.0f);
  void* buffers[] = {out.data(), in.data()};
  interpret_kernel(k, buffers, nullptr, 0, 1);
  return out;
}

}  // namespace

TEST_CASE("loops reading through v / c and v % c split into two loops (v = vo * c + vi) with the same bits") {
  const int64_t B = 3, T = 5, H = 4, E = 6;
  std::vector<float> input(size_t(B * T * H * E));
  for (size_t i = 0; i < input.size(); ++i) input[i] = float(i % 13) * 0.37f - 1.1f + 1e-7f * float(i);
  const kir::Kernel original = head_merging_column_sum(B, T, H, E, H * E);
  kir::Kernel split = original;
  kir::split_loops_at_divisors(split);
  const std::string text = split.to_string();
  CAPTURE(text);
  CHECK(text.find("div") == std::string::npos);  // v / 6 and v % 6 are loop variables now
  CHECK(text.find("rem") == std::string::npos);
  CHECK(text.find("in [0:i64, 4:i64)") != std::string::npos);
  CHECK(text.find("in [0:i64, 6:i64)") != std::string::npos);
  CHECK(split.num_vars == original.num_vars + 2);  // the accumulating loop split; the zeroing loop had nothing to split
  const std::vector<float> want = run_interpreted(original, input, size_t(H * E));
  CHECK(run_interpreted(split, input, size_t(H * E)) == want);

  // A trip count the divisor does not divide stays as it is.
  kir::Kernel uneven = head_merging_column_sum(B, T, H, E, H * E - 1);
  const std::string before = uneven.to_string();
  kir::split_loops_at_divisors(uneven);
  CHECK(uneven.to_string() == before);

  // So does a range loop (its bounds are the ABI's [begin, end)), even one reading v / c, v % c.
  using namespace kir;
  Kernel copy;
  copy.name = "copy";
  copy.buffers = {{Type::F32, true}, {Type::F32, false}};
  copy.num_vars = 1;
  copy.outer_extent = int_const(24);
  const Expr v = var(0);
  copy.body = block({for_loop(0, int_const(0), int_const(24),
                              {store(0, v, load(1, Type::F32, binary(Op::Add, binary(Op::Rem, v, int_const(6)),
                                                                     binary(Op::Mul, binary(Op::Div, v, int_const(6)), int_const(8)))))},
                              LoopKind::Parallel)});
  const std::string range_before = copy.to_string();
  kir::split_loops_at_divisors(copy);
  CHECK(copy.to_string() == range_before);
}

TEST_CASE("kir::philox gives the reference Philox's words, for counters past 2^32 and 64-bit keys too, keys constant or run-time") {
  using namespace kir;
  // Buffer 1 holds counters; buffer 0 gets each one's four words.
  const std::vector<uint64_t> counters = {0, 1, 7, 0xffffffffull, 0x100000000ull, 0x123456789abcdefull, (uint64_t(1) << 63) - 1};
  for (const uint64_t key : {uint64_t(0), uint64_t(42), uint64_t(0xfedcba9876543210ull), uint64_t(0xffffffffffffffffull)}) {
    for (const bool runtime_key : {false, true}) {
      CAPTURE(key);
      CAPTURE(runtime_key);
      Kernel k;
      k.name = "philox";
      k.buffers = {{Type::I64, true}, {Type::I64, false}};
      k.num_vars = 1;
      k.outer_extent = int_const(int64_t(counters.size()));
      // A run-time key is parameter slot 0 (a random op's seed_param).
      const std::array<Expr, 4> words = runtime_key ? philox(load(1, Type::I64, var(0)), param(0)) : philox(load(1, Type::I64, var(0)), key);
      const int64_t params[] = {int64_t(key)};
      std::vector<StmtPtr> stores;
      for (int w = 0; w < 4; ++w) stores.push_back(store(0, binary(Op::Add, binary(Op::Mul, var(0), int_const(4)), int_const(w)), words[size_t(w)]));
      k.body = block({for_loop(0, int_const(0), k.outer_extent, std::move(stores), LoopKind::Parallel)});
      verify(k);
      std::vector<int64_t> out(counters.size() * 4);
      void* buffers[] = {out.data(), const_cast<uint64_t*>(counters.data())};
      interpret_kernel(k, buffers, params, 0, int64_t(counters.size()));
      for (size_t i = 0; i < counters.size(); ++i) {
        CAPTURE(counters[i]);
        const std::array<uint32_t, 4> expected = reference_philox(counters[i], key);
        for (size_t w = 0; w < 4; ++w) CHECK(out[4 * i + w] == int64_t(expected[w]));
      }
      if (key == 0)  // Salmon et al.'s known answer for a zero counter and key
        CHECK(std::vector<int64_t>(out.begin(), out.begin() + 4) == std::vector<int64_t>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
    }
  }
}

TEST_CASE("kir::Mutator rewrites each shared subexpression once and returns unchanged trees as they are") {
  using namespace kir;
  // Replaces v0 by v1, counting the nodes it is asked to rewrite.
  struct Rename final : Mutator {
    int visits = 0;
    using Mutator::visit;
    Expr visit(const Expr& e) override {
      ++visits;
      if (e->op == Op::Var && e->id == 0) return var(1);
      return mutate_operands(e);
    }
  };
  const Expr v0 = var(0), v2 = var(2);
  const Expr shared = binary(Op::Mul, v0, v0);  // one node read by both operands below
  const Expr sum = binary(Op::Add, shared, shared);
  const Expr untouched = binary(Op::Add, v2, int_const(3));
  const StmtPtr body = block({store(0, v2, sum), store(1, v2, untouched)});

  Rename rename;
  const StmtPtr out = rename.mutate(body);
  const Expr& new_sum = out->body[0]->b;
  REQUIRE(new_sum->op == Op::Add);
  CHECK(new_sum->args[0] == new_sum->args[1]);  // still one node: rewritten once, shared
  CHECK(new_sum->args[0]->args[0]->id == 1);
  CHECK(out->body[1]->b == untouched);          // nothing in it changed: the same node
  CHECK(out != body);                           // statements are copies
  CHECK(body->body[0]->b == sum);               // the input is left as it was
  // Six distinct nodes (v2, sum, shared, v0, untouched, 3), however often each is read.
  CHECK(rename.visits == 6);
}

TEST_CASE("kir::verify accepts lowered and split kernels and names each broken rule") {
  using namespace kir;
  const Kernel good = head_merging_column_sum(2, 3, 2, 4, 8);
  CHECK_NOTHROW(verify(good));
  Kernel split = good;
  split_loops_at_divisors(split);
  CHECK_NOTHROW(verify(split));
  CHECK_NOTHROW(verify(for_target(good, LoopTarget::Cuda)));

  // A small kernel with one statement in its range loop, for each broken rule.
  auto with = [](std::vector<StmtPtr> body, LoopKind range = LoopKind::Parallel) {
    Kernel k;
    k.name = "bad";
    k.buffers = {{Type::F32, true}, {Type::F32, false}};
    k.num_vars = 4;
    k.outer_extent = param(0);
    k.body = block({for_loop(0, int_const(0), param(0), std::move(body), range)});
    return k;
  };
  auto rejects = [](const Kernel& k, const char* why) {
    CAPTURE(k.to_string());
    CHECK_THROWS_WITH_AS(verify(k), doctest::Contains(why), InternalError);
  };
  const Expr x = load(1, Type::F32, var(0));
  CHECK_NOTHROW(verify(with({store(0, var(0), x)})));
  rejects(with({store(1, var(0), x)}), "store to input buffer 1");
  rejects(with({store(0, var(0), var(1, Type::F32))}), "reads v1 before it is declared");
  rejects(with({declare(1, Type::F32, x), store(0, var(0), var(1, Type::F64))}), "reads v1 as f64, declared f32");
  rejects(with({assign(2, x)}), "v2 assigned before it is declared");
  rejects(with({declare(2, Type::F32, x), assign(2, cast(x, Type::F64))}), "v2 of type f32 assigned a f64 value");
  rejects(with({declare(2, Type::F32, x), declare(2, Type::F32, x)}), "v2 declared twice");
  rejects(with({store(0, var(0), select(x, x, x))}), "select takes an i1");
  rejects(with({store(0, var(0), cast(x, Type::F64))}), "a f64 value stored to buffer 0 of f32");
  rejects(with({store(0, var(0), load(7, Type::F32, var(0)))}), "load of buffer 7 of 2");
  rejects(with({store(0, var(9), x)}), "variable v9 outside [0, 4)");
  rejects(with({for_loop(1, int_const(0), int_const(2), {store(0, var(1), x)}, LoopKind::Ordered)}), "nested in another loop");
  Kernel two = with({store(0, var(0), x)});
  two.body = block({two.body, for_loop(3, int_const(0), param(0), {store(0, var(3), load(1, Type::F32, var(3)))}, LoopKind::Parallel)});
  rejects(two, "2 range loops");
  Kernel none = with({store(0, var(0), x)}, LoopKind::Serial);
  rejects(none, "0 range loops");
  Kernel trip = with({store(0, var(0), x)});
  trip.outer_extent = var(0);
  rejects(trip, "trip count reads a variable");
}
