// Command-line fuzzer: fuzz_programs --cases N --seed S
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "program_fuzzer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Random Tessera programs against the reference evaluator"};
  uint64_t cases = 100, seed = 1;
  app.add_option("--cases", cases, "how many programs");
  app.add_option("--seed", seed, "seed of the first program");
  CLI11_PARSE(app, argc, argv);
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
