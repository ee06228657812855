#include "nn/layers.hpp"

#include "dsl/error.hpp"
#include "dsl/indexing.hpp"
#include "dsl/normalization.hpp"

namespace tessera {
namespace {

const Tensor& only_input(const std::vector<Tensor>& inputs, const char* who) {
  if (inputs.size() != 1) throw Error(std::string(who) + ": forward takes one input, got " + std::to_string(inputs.size()));
  return inputs.front();
}

}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t dim, const Mesh& mesh, uint64_t seed) {
  register_parameter("weight", Variable(random_normal({num_embeddings, dim}, seed, Layout::replicated(mesh, 2), 0.0, 0.02)));
}

std::vector<Tensor> Embedding::forward(const std::vector<Tensor>& inputs) {
  return {embedding(only_input(inputs, "Embedding"), parameter_value("weight"))};
}

RMSNorm::RMSNorm(int64_t dim, const Mesh& mesh, double eps) : eps_(eps) {
  register_parameter("weight", Variable(ones({dim}, Layout::replicated(mesh, 1))));
}

std::vector<Tensor> RMSNorm::forward(const std::vector<Tensor>& inputs) {
  return {rms_norm(only_input(inputs, "RMSNorm"), parameter_value("weight"), eps_)};
}

LayerNorm::LayerNorm(int64_t dim, const Mesh& mesh, double eps) : eps_(eps) {
  register_parameter("weight", Variable(ones({dim}, Layout::replicated(mesh, 1))));
  register_parameter("bias", Variable(zeros({dim}, Layout::replicated(mesh, 1))));
}

std::vector<Tensor> LayerNorm::forward(const std::vector<Tensor>& inputs) {
  return {layer_norm(only_input(inputs, "LayerNorm"), parameter_value("weight"), parameter_value("bias"), eps_)};
}

}  // namespace tessera
