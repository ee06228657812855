// Random programs against the reference. TESSERA_FUZZ_CASES and TESSERA_FUZZ_SEED choose how
// many and from which seed (test/fuzz_programs does the same from the command line).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "program_fuzzer.hpp"

TEST_CASE("random programs match the reference on random meshes and layouts") {
  const char* cases = std::getenv("TESSERA_FUZZ_CASES");
  const char* seed = std::getenv("TESSERA_FUZZ_SEED");
  const uint64_t n = cases ? std::stoull(cases) : 300, first = seed ? std::stoull(seed) : 1;
  for (uint64_t s = first; s < first + n; ++s) {
    std::string failure = tessera::testing::fuzz_one_program(s);
    CAPTURE(s);
    CHECK_MESSAGE(failure.empty(), failure);
  }
}
