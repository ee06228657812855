#include "dsl/concrete_value.hpp"

#include <string>

#include "dsl/variable.hpp"

namespace tessera {

void require_concrete(const NodeRef& node, std::string_view call) {
  if (node->traced) {
    const std::string where = "the tensor made at " + node->location();
    if (jit_tracing())
      throw ConcretizationError(std::string(call) + ": " + where +
                                " depends on an argument of the function jit is tracing; its value exists only when the "
                                "compiled function runs, and reading it now would bake this call's value into every later "
                                "call. Return it from the function (or compute it outside jit) instead");
    throw ConcretizationError(std::string(call) + ": " + where +
                              " was built from the arguments of a function jit traced and escaped the trace (kept in a "
                              "capture or a global); it has no value. Return it from the function instead");
  }
  if (node->local)
    throw ConcretizationError(std::string(call) + ": the tensor made at " + node->location() +
                              " is one device's block inside a function local_map runs; it exists only while the program "
                              "runs. Return it from the function (its out_placements make it global) and read the result");
}

}  // namespace tessera
