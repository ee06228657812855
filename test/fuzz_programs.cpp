// Command-line fuzzer: fuzz_programs --cases N --seed S [--interpreted]
// With --digests it prints "seed digest" per program instead of checking it against the
// reference: test_cache_keys runs it in several cache states and orders and compares the bits.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>

#include "jit/driver.hpp"
#include "jit/kernel_runner.hpp"
#include "kernel_interpreter.hpp"
#include "program_fuzzer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Random Tessera programs against the reference evaluator"};
  uint64_t cases = 100, seed = 1, order_seed = 0;
  int passes = 1;
  bool interpreted = false, digests = false, cold = false;
  app.add_option("--cases", cases, "how many programs");
  app.add_option("--seed", seed, "seed of the first program");
  app.add_flag("--interpreted", interpreted, "run every kernel through the kernel-IR interpreter instead of LLVM");
  app.add_flag("--digests", digests, "print each program's result digest instead of checking it");
  app.add_option("--order-seed", order_seed, "--digests: shuffle the programs with this seed (0: in order)");
  app.add_option("--passes", passes, "--digests: run them this many times, each pass in a new order");
  app.add_flag("--cold", cold, "--digests: forget every executable before each program");
  CLI11_PARSE(app, argc, argv);
  std::unique_ptr<tessera::KernelRunnerScope> interpreter;
  if (interpreted) interpreter = std::make_unique<tessera::KernelRunnerScope>(tessera::testing::interpret_kernel);
  if (digests) {
    std::vector<uint64_t> order(cases);
    std::iota(order.begin(), order.end(), seed);
    std::mt19937_64 rng(order_seed);
    for (int pass = 0; pass < passes; ++pass) {
      if (order_seed) std::shuffle(order.begin(), order.end(), rng);
      for (uint64_t s : order) {
        if (cold) tessera::clear_executable_cache();
        fmt::print("{} {}\n", s, tessera::testing::fuzz_program_digest(s));
      }
    }
    return 0;
  }
  uint64_t failures = 0;
  for (uint64_t s = seed; s < seed + cases; ++s) {
    std::string failure = tessera::testing::fuzz_one_program(s);
    if (!failure.empty()) {
      ++failures;
      fmt::print("seed {} FAILED\n{}\n", s, failure);
    }
  }
  fmt::print("{} passed, {} failed\n", cases - failures, failures);
  return failures ? 1 : 0;
}
