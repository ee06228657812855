// The samples' last line of defence: a tessera::Error (a corrupt checkpoint, a missing dataset)
// or any other exception is printed and the program exits non-zero, instead of aborting.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include <tessera/tessera.hpp>

namespace samples {

template <class Body>
int report_errors(Body&& body) {
  try {
    return body();
  } catch (const tessera::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
  } catch (const std::exception& e) {
    fmt::print(stderr, "unexpected error: {}\n", e.what());
  }
  return 1;
}

}  // namespace samples
