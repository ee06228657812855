// What the libtorch peers of the model benchmarks share: Tessera's parameters copied into torch
// tensors by name, so both frameworks start from the same weights, and Tessera's host arrays as
// torch tensors. Only with libtorch (TESSERA_BENCH_TORCH).
#pragma once

#if TESSERA_BENCH_TORCH
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <tessera/tessera.hpp>

namespace tessera::bench {

// A copy of a Tessera module's parameters as leaf tensors that require grad; both keep [in, out].
struct TorchParameters {
  std::map<std::string, torch::Tensor> by_name;
  std::vector<torch::Tensor> ordered;  // Tessera's order: what the optimizer and clipping take

  explicit TorchParameters(const Module& model) {
    for (const auto& [name, variable] : model.named_parameters()) {
      const Array value = to_array(variable.value());
      torch::Tensor t = torch::from_blob(const_cast<float*>(value.data<float>()), value.shape(), torch::kFloat32).clone();
      by_name[name] = t.set_requires_grad(true);
      ordered.push_back(by_name[name]);
    }
  }
  const torch::Tensor& operator[](const std::string& name) const { return by_name.at(name); }
};

// A copy of an f32 array.
inline torch::Tensor torch_floats(const Array& a) {
  return torch::from_blob(const_cast<float*>(a.data<float>()), a.shape(), torch::kFloat32).clone();
}

// Token ids (int32) as the int64 indices torch's embedding and loss take.
inline torch::Tensor torch_indices(const Array& a) {
  return torch::from_blob(const_cast<int32_t*>(a.data<int32_t>()), a.shape(), torch::kInt32).to(torch::kLong);
}

}  // namespace tessera::bench
#endif
