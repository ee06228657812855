// What the fuzz targets share: where they write per-input files, and seeding an empty corpus.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <typeinfo>

#include "dsl/error.hpp"

namespace tessera::fuzzing {

// Files written for every input go to memory (tmpfs) where there is one: ext4 flushes a file
// replaced by truncation on close, which would cost more than the code under test.
inline std::filesystem::path scratch_directory() {
  std::error_code error;
  return std::filesystem::is_directory("/dev/shm", error) ? std::filesystem::path("/dev/shm")
                                                          : std::filesystem::temp_directory_path();
}

// Calls `seed` for each empty corpus directory among libFuzzer's command-line arguments, so a
// first run starts from valid files (none are committed).
inline void seed_empty_corpora(int argc, char** argv, const std::function<void(const std::filesystem::path&)>& seed) {
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p = argv[i];
    std::error_code error;
    if (argv[i][0] != '-' && std::filesystem::is_directory(p, error) && std::filesystem::is_empty(p, error)) seed(p);
  }
}

// TESSERA_FUZZ_VERBOSE=1: print each input's outcome (what a corpus exercises: run it with -runs=0).
inline bool verbose() {
  static const bool on = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  return on;
}

// Anything but a typed tessera::Error (or a load) is a finding: say what, then abort for libFuzzer.
[[noreturn]] inline void finding(const char* what, const std::exception* e) {
  if (e)
    std::fprintf(stderr, "FINDING: %s: %s: %s\n", what, typeid(*e).name(), e->what());
  else
    std::fprintf(stderr, "FINDING: %s\n", what);
  std::abort();
}

// Runs `load` on one input: true when it loaded, false when it raised a tessera::Error (the
// expected outcome of bad input); any other exception is a finding named by `what`.
template <class Load>
bool loads_or_typed_error(const char* what, Load&& load) {
  try {
    load();
    if (verbose()) std::fprintf(stderr, "OUTCOME: loaded\n");
    return true;
  } catch (const tessera::Error& e) {
    if (verbose()) std::fprintf(stderr, "OUTCOME: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: ", what);
    finding("an exception that is not a tessera::Error", &e);
  } catch (...) {
    std::fprintf(stderr, "%s: ", what);
    finding("a non-std::exception", nullptr);
  }
  return false;
}

}  // namespace tessera::fuzzing
