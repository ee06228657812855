#include "nn/zero_sums.hpp"

#include "dsl/ops.hpp"

namespace tessera {

void zero_sums(const std::vector<Variable*>& sums) {
  for (size_t i = 0; i < sums.size(); ++i)
    sums[i]->assign(tagged_full(sums[i]->shape(), 0.0, sums[i]->layout(), int64_t(i) + 1, sums[i]->dtype()));
}

}  // namespace tessera
