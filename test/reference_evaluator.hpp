// The tests' reference evaluator: evaluates the GLOBAL graph of a tensor naively, in double
// precision, on whole arrays. It shares no code with the partitioner or codegen (its own
// Philox, its own index arithmetic); each op's result is rounded to the op's dtype, so integer
// and bool semantics are exact and floats differ from Tessera only by rounding.
#pragma once

#include <map>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::testing {

struct RefArray {
  std::vector<int64_t> shape;
  DType dtype;
  std::vector<double> data;
  int64_t numel() const { return int64_t(data.size()); }
};

RefArray ref_from_array(const Array& a);

// Evaluates `t`'s graph. Leaves (values already computed) are read from `leaves` when listed,
// otherwise gathered with full_tensor().
RefArray reference_eval(const Tensor& t, const std::map<const Node*, Array>& leaves = {});

// Compares Tessera's gathered result with the reference; returns "" or a description of the
// first mismatch. Tolerance by dtype: exact for integers and bools, relative for floats.
std::string compare_with_reference(const Array& got, const RefArray& want, double float_tolerance = 1e-4);

// Philox-4x32-10, written from the paper (Salmon et al., SC'11), for the reference random ops.
std::array<uint32_t, 4> reference_philox(uint64_t counter, uint64_t key);

}  // namespace tessera::testing
