// Command-line fuzzer: fuzz_programs --cases N --seed S [--interpreted]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <memory>

#include "jit/kernel_runner.hpp"
#include "kernel_interpreter.hpp"
#include "program_fuzzer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Random Tessera programs against the reference evaluator"};
  uint64_t cases = 100, seed = 1;
  app.add_option("--cases", cases, "how many programs");
  app.add_option("--seed", seed, "seed of the first program");
  bool interpreted = false;
  app.add_flag("--interpreted", interpreted, "run every kernel through the kernel-IR interpreter instead of LLVM");
  CLI11_PARSE(app, argc, argv);
  std::unique_ptr<tessera::KernelRunnerScope> interpreter;
  if (interpreted) interpreter = std::make_unique<tessera::KernelRunnerScope>(tessera::testing::interpret_kernel);
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
