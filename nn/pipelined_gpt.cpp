#include "nn/pipelined_gpt.hpp"

#include <utility>

namespace tessera {

PipelinedGpt::PipelinedGpt(const GptConfig& config, const Mesh& mesh, int64_t virtual_stages, std::string mesh_dim)
    : PipelinedTransformer(gpt_transformer_config(checked_gpt_config(config, "PipelinedGpt")), mesh, virtual_stages, std::move(mesh_dim),
                           "PipelinedGpt"),
      gpt_config_(config) {}

void distribute_pipelined_gpt(PipelinedGpt& model, const Mesh& mesh, bool fsdp, bool sequence_parallel) {
  distribute_pipelined_transformer(model, mesh, fsdp, sequence_parallel);
}

}  // namespace tessera
