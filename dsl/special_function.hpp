// The special functions a kernel evaluates (exp, log, tanh, pow). On CPUs they are computed in
// software, each at its own rate (tanh about half exp's on this project's machine), so plans
// count and charge them one by one (Hardware::special_functions_per_second).
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "dsl/op_kind.hpp"

namespace tessera {

enum class SpecialFunction { exp, log, tanh, pow };
inline constexpr std::array<SpecialFunction, 4> kSpecialFunctions = {SpecialFunction::exp, SpecialFunction::log,
                                                                      SpecialFunction::tanh, SpecialFunction::pow};

std::string_view special_function_name(SpecialFunction f);
std::optional<SpecialFunction> special_function_from_name(std::string_view name);
// The special function an op evaluates, if it is one.
std::optional<SpecialFunction> special_function_of(OpKind op);

}  // namespace tessera
