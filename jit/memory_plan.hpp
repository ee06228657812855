// The memory plan of an executable: every intermediate a kernel or GEMM writes gets an offset in
// one arena per device, reused across runs. Offsets come from liveness: two values share memory
// only when their lifetimes (producing step .. last reading step) do not overlap, so a kernel
// never writes where it reads. Program outputs are not planned: they are handed to the user.
// A value that is all_gathered is written straight into its own block of the gather's output
// (the gather then copies only the other devices' blocks, or none when they share the output).
// Values outside the arena (collectives' results, gathered outputs) are dropped after their last
// reader (release_after), so a step holds only what is still to be read: FSDP's gathered
// parameters and tensor parallelism's reduced activations live no longer than arena values do.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/schedule.hpp"
#include "ir/local_program.hpp"

namespace tessera {

struct MemoryPlan {
  std::vector<int64_t> offset;  // per local node: byte offset in the arena, -1 when not planned
  std::vector<int64_t> size;    // per local node: bytes reserved (0 when not planned)
  int64_t arena_bytes = 0;
  // Per local node: the all_gather whose output holds this value in place (allocated when this
  // value is produced), or -1.
  std::vector<int> in_gather;
  // Per local node: the all_to_all_v whose input this is, when the input is produced by a step and
  // has one static extent on every device, or -1. Where the group's communicator reads senders'
  // rows straight from group buffers (Communicator::exchanges_from_group_buffers) the executor
  // writes it into one; its arena slot stays planned (and unused there), so planned peaks hold.
  std::vector<int> in_exchange;
  // Per schedule step: the values the executor drops after it (the step is their last reader,
  // or their producer when nothing reads them). Never program inputs or outputs.
  std::vector<std::vector<int>> release_after;
  // Per local node: the program inputs whose buffer it may be written into (buffer donation,
  // JAX's donated arguments), in input order. Only program outputs a generated kernel writes
  // have any: an input of the same dtype and local shape, not itself an output, that nothing
  // reads after that kernel, which reads it only at the element it writes
  // (kir::writes_in_place). Whether a run does so is the caller's (assign_donors).
  std::vector<std::vector<int>> donors;
};

MemoryPlan plan_memory(const LocalProgram& program, const Schedule& schedule);

// Which input buffer each output of a run is written into: per local node, the Input node whose
// buffer it takes, or -1. `donated[k]`: program input k may be overwritten (a variable the call
// reads and assigns, whose old value nothing else holds: jit/jit_function.cpp). Outputs in
// program order each take the first of their donors that is donated and not yet taken, so the
// executor and the planner, both asking here, agree on every buffer.
std::vector<int> assign_donors(const LocalProgram& program, const MemoryPlan& memory, const std::vector<bool>& donated);

// Marks the kernel buffers of every (output, donor) pair of `memory` may_alias
// (kir::Buffer), before the kernels are compiled: a run may pass them the same memory.
void mark_donor_buffers(Schedule& schedule, const MemoryPlan& memory);

}  // namespace tessera
