// Short builders for kernel IR written by hand (math_functions.cpp, storage_rounding.cpp).
// Defined once here, inline: a unity build that puts both files in one unit sees one definition.
#pragma once

#include <cstdint>
#include <utility>

#include "codegen/kernel_ir.hpp"

namespace tessera::kir::shorthand {

inline Expr f32(double v) { return float_const(v, Type::F32); }
inline Expr i32(int64_t v) { return int_const(v, Type::I32); }
inline Expr add(Expr a, Expr b) { return binary(Op::Add, std::move(a), std::move(b)); }
inline Expr sub(Expr a, Expr b) { return binary(Op::Sub, std::move(a), std::move(b)); }
inline Expr mul(Expr a, Expr b) { return binary(Op::Mul, std::move(a), std::move(b)); }
inline Expr band(Expr a, Expr b) { return binary(Op::BitAnd, std::move(a), std::move(b)); }
inline Expr bor(Expr a, Expr b) { return binary(Op::BitOr, std::move(a), std::move(b)); }
inline Expr shr(Expr a, Expr b) { return binary(Op::AShr, std::move(a), std::move(b)); }  // of non-negative values only
inline Expr lt(Expr a, Expr b) { return binary(Op::Lt, std::move(a), std::move(b)); }

}  // namespace tessera::kir::shorthand
