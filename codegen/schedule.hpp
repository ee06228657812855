// Fusion and scheduling of one device's local program: which values are materialised, and the
// flat list of steps that computes them (kernels, GEMM, grouped-GEMM and fused-attention library
// calls, redistribute steps).
//
// Fusion rules (NOTES.md): elementwise and movement ops are inlined into their consumers (movement
// is index arithmetic, never a kernel); elementwise producers run inside reduce loops; a reduce
// whose result is indexed by a prefix of its consumer's loops (softmax, mean, normalisation) is
// computed inside the consumer's kernel, once per outer iteration; a value with several consumers
// is recomputed in each only when it is cheap (no exp, log, div, pow, reduce, random, dot, and
// at most one read of a buffer its size); barriers at dot, collectives and program outputs.
// Identical kernels (a transformer's blocks, which differ only in the buffers bound at launch)
// are one kernel, compiled once.
#pragma once

#include <vector>

#include "codegen/kernel_ir.hpp"
#include "ir/local_program.hpp"

namespace tessera {

struct ScheduledStep {
  enum class Kind { Kernel, Gemm, GroupedGemm, Attention, Redistribute } kind;
  int node = -1;                  // the (first) local node this step produces
  std::vector<int> outputs;       // every local node it produces (a kernel may have several; a
                                  // bucket of small all_reduces has one per member)
  int kernel = -1;                // Kernel: index into Schedule::kernels
  std::vector<int> buffer_nodes;  // Kernel: the node bound to each buffer; outputs come first
  // Gemm: the buffers read, and whether each is read transposed (a transpose of the last two
  // axes feeding a GEMM is a BLAS flag, not a copy).
  int gemm_a = -1, gemm_b = -1;
  bool trans_a = false, trans_b = false;
};

// The local nodes a step reads.
std::vector<int> step_reads(const LocalProgram& program, const ScheduledStep& step);

struct Schedule {
  std::vector<kir::Kernel> kernels;  // each distinct kernel once: steps may share one
  std::vector<ScheduledStep> steps;
  std::vector<bool> materialised;  // per local node
};

// `target`: the loop structures lowering picks (lower_group in codegen/lower_kernel.hpp).
Schedule schedule_program(const LocalProgram& program, kir::LoopTarget target);

}  // namespace tessera
