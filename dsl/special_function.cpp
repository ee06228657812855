#include "dsl/special_function.hpp"

namespace tessera {

std::string_view special_function_name(SpecialFunction f) {
  switch (f) {
    case SpecialFunction::exp: return "exp";
    case SpecialFunction::log: return "log";
    case SpecialFunction::tanh: return "tanh";
    case SpecialFunction::pow: return "pow";
  }
  return "?";
}

std::optional<SpecialFunction> special_function_from_name(std::string_view name) {
  for (SpecialFunction f : kSpecialFunctions)
    if (special_function_name(f) == name) return f;
  return std::nullopt;
}

std::optional<SpecialFunction> special_function_of(OpKind op) {
  switch (op) {
    case OpKind::Exp: return SpecialFunction::exp;
    case OpKind::Log: return SpecialFunction::log;
    case OpKind::Tanh: return SpecialFunction::tanh;
    case OpKind::Pow: return SpecialFunction::pow;
    default: return std::nullopt;
  }
}

}  // namespace tessera
