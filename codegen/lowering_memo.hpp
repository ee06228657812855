// Lowering, remembered. A program lowers the same group of nodes again and again (a model's
// blocks, a ring's steps, the forward recomputed in a backward), and a plan search lowers the
// programs of hundreds of candidates whose kernels are mostly the same: the GPT-3 175B search
// lowered 80,000 groups into 5,000 distinct kernels. The memo keys a group by everything
// lower_group reads of it, each node numbered by where the walk from the roots first meets it
// (so the same group at other node ids, in another program, has the same key), and hands back
// the kernel lowered the first time, already verified, with its canonical text.
//
// The key (group_key) holds, for the roots and every node reachable from them through nodes
// computed inline: kind, op, dtype, global and local shape, local offset, seed slot, the
// attributes lowering reads, a redistribute's step, and for inline nodes their inputs; of a
// materialised node (a load) no inputs; the target's text and loop target. Where
// TESSERA_VERIFY_CACHE_KEYS=1 (the test suites) every hit is lowered again and compared: a field
// lowering reads that the key misses is an InternalError naming the group, never a wrong kernel.
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "codegen/kernel_ir.hpp"
#include "codegen/lower_kernel.hpp"
#include "ir/local_program.hpp"

namespace tessera {

// A kernel as lowering made it, verified (kir::verify), with its canonical text
// (Kernel::to_string: the compile cache's key and the schedule's).
struct LoweredKernel {
  kir::Kernel kernel;
  std::string text;
};

// The group's key, and the program node at each of its canonical positions.
struct GroupKey {
  std::string text;
  std::vector<int> nodes;
};
GroupKey group_key(const LocalProgram& p, const std::vector<int>& roots, const std::vector<bool>& materialised,
                   kir::LoopTarget target);

// lower_group, from the memo where an equal group was lowered before. buffer_nodes receives the
// program node bound to each kernel buffer, as lower_group's.
std::variant<std::shared_ptr<const LoweredKernel>, FusionRefusal> lower_group_memoised(const LocalProgram& p, const std::vector<int>& roots,
                                                                                      const std::vector<bool>& materialised,
                                                                                      std::vector<int>& buffer_nodes,
                                                                                      kir::LoopTarget target);

struct LoweringMemoStats {
  int64_t lowered = 0;  // groups lowered afresh
  int64_t reused = 0;   // groups taken from the memo
};
LoweringMemoStats lowering_memo_stats();

}  // namespace tessera
