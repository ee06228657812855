// Philox-4x32-10 (Salmon et al. 2011), the counter-based generator of random ops, written once in
// kernel IR: its ten rounds are ordinary integer ops on I64 values holding 32-bit words, so each
// renderer draws the same bits with no generator of its own. The test reference
// (test/reference_evaluator.cpp) keeps an independent Philox to check it against.
#pragma once

#include <array>
#include <cstdint>

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

// The four 32-bit words of Philox-4x32-10 of the 64-bit `counter` (I64) under `key`, each an
// I64 in [0, 2^32). They share one expression DAG, so the renderers' per-statement memo
// computes the rounds once however many words a kernel reads.
std::array<Expr, 4> philox(const Expr& counter, uint64_t key);
// The same under a key computed at run time (an I64: a parameter slot), so kernels that differ
// only in their seed are one kernel.
std::array<Expr, 4> philox(const Expr& counter, const Expr& key);

}  // namespace tessera::kir
