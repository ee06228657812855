// One call of a library kernel (ir/library_op.hpp) on one device's blocks, and the kernels that
// take it. Each backend fills a table of LibraryKernel by LibraryOp (Backend::library,
// jit/backend_registry.hpp); the executor looks the op up for its device's kind and hands it
// the device (jit/device_run.cpp). A Device itself offers memory, copies, kernel launches and
// a sync point only, so a new primitive is a table entry, not a method on every device.
#pragma once

#include <cstdint>
#include <functional>
#include <typeinfo>
#include <vector>

#include "dsl/array.hpp"
#include "dsl/attention_parts.hpp"
#include "dsl/op_kind.hpp"
#include "ir/library_op.hpp"
#include "jit/device.hpp"

namespace tessera {

struct LibraryCall {
  LibraryOp op = LibraryOp::Gemm;
  // Gemm, OrderedGemm: a, b. Attention parts: q, k, v, then for the gradients the forward's
  // output and d_out.
  std::vector<const Array*> inputs;
  Array* out = nullptr;  // allocated by the executor in the device's memory
  // Gemm, OrderedGemm: out[b] = op(a[b]) x op(b[b]), op transposing where set.
  bool trans_a = false, trans_b = false;
  // Attention parts: the node's attributes, and the global position of q's first row (the
  // causal mask needs it).
  AttentionAttrs attention;
  int64_t q_offset = 0;
  // Grouped GEMMs (x, w or dy, ends): the global position of x's first row (the group bounds in
  // ends are global rows), and whether each sum runs in source order (deterministic targets).
  int64_t row_offset = 0;
  bool ordered = false;
};

// Runs `call` on `device`, which is of the kind whose table holds the kernel.
using LibraryKernel = std::function<void(Device& device, const LibraryCall& call)>;

// The extents of a row-major batched GEMM out[b] = op(a[b]) x op(b[b]), for each form of Dot
// (dsl/dot_form.hpp): a Rows or ContractRows product is one GEMM over all of a's rows.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;
};
GemmShape gemm_shape(const Array& a, bool trans_a, const Array& b, const Array& out);

// The library op that computes a grouped primitive (GroupedDot, GroupedWeightGrad).
LibraryOp grouped_library_op(OpKind op);

// The library op that computes an attention part.
LibraryOp library_op_of(AttentionPart part);

[[noreturn]] void throw_wrong_device(const Device& device, const char* wanted);

// The device a backend's kernel was handed, as the backend's own Device type; InternalError
// when the table sent it another kind's device.
template <class BackendDevice>
BackendDevice& device_as(Device& device) {
  auto* d = dynamic_cast<BackendDevice*>(&device);
  if (!d) throw_wrong_device(device, typeid(BackendDevice).name());
  return *d;
}

}  // namespace tessera
