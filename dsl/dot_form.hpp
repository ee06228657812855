// The three products a Dot node computes, told apart by its operands' and output's ranks.
//
//  Batched       a [..., m, k] x b [..., k, n] -> [..., m, n]  (equal ranks: a batch of GEMMs)
//  Rows          a [..., k]    x b [k, n]      -> [..., n]     (a's leading axes are all rows)
//  ContractRows  a [..., k]    x b [..., n]    -> [k, n]       (a^T b summed over every row)
//
// Rows and ContractRows are torch.matmul's [B, T, k] x [k, n] and its weight gradient without
// folding B and T into one axis: a device's block of rows is contiguous whichever leading axis
// is sharded (batch, sequence, unevenly or not at all), so each is one local GEMM over it, where
// a reshape to [B*T, k] could describe a sharded T or an uneven B only by gathering them.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

enum class DotForm { Batched, Rows, ContractRows };

// InternalError for ranks no Dot has.
DotForm dot_form(int64_t a_rank, int64_t b_rank, int64_t out_rank);

// The extents of the GEMM a Dot computes, out[batch] = op(A[batch]) (m x k) * op(B[batch]) (k x n),
// from its operands' and output's shapes; `a_transposed`: a batched product's a is stored as
// its transpose (read through the GEMM's flag). m and n come from the output, so b's storage
// does not matter.
struct DotExtents {
  int64_t m = 0, n = 0, k = 0, batch = 1;
};
DotExtents dot_extents(const std::vector<int64_t>& a, const std::vector<int64_t>& b, const std::vector<int64_t>& out,
                       bool a_transposed = false);

}  // namespace tessera
