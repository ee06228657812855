// Random-program fuzzing: random DAGs of 5-30 ops over random shapes, meshes and layouts,
// gathered and compared with the reference evaluator.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::testing {

// Builds and checks program number `seed`. Returns "" when it matches the reference, otherwise
// the program's description and the mismatch.
std::string fuzz_one_program(uint64_t seed);

// Program number `seed`'s result, bit for bit, as a digest (or "threw: " and the message): equal
// digests from runs in other orders and cache states mean the same values.
std::string fuzz_program_digest(uint64_t seed);

}  // namespace tessera::testing
