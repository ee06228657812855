// Reading a value where it does not exist yet. Inside a function jit traces, a tensor built
// from the function's arguments has no value of its own: the trace runs once, with the first
// call's arguments, and later calls run the compiled program. Reading it there (full_tensor,
// to_local, unpack, to_array, printing) would bake the first call's value into every later call,
// so it is a ConcretizationError naming the call, as JAX raises one. The same holds for a local
// value of local_map (one device's block): it exists only while the program runs.
#pragma once

#include <string_view>

#include "dsl/error.hpp"
#include "dsl/node.hpp"

namespace tessera {

struct ConcretizationError : Error { using Error::Error; };

// ConcretizationError unless `node`'s value can be read now; `call` names the reader ("full_tensor()").
void require_concrete(const NodeRef& node, std::string_view call);

}  // namespace tessera
