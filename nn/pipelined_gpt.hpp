// The GPT of nn/gpt.hpp split into pipeline stages over a mesh's `pp` dim: the
// PipelinedTransformer (nn/pipelined_transformer.hpp) of the GPT's TransformerConfig, made
// from a GptConfig, with the same initial weights as Gpt.
#pragma once

#include <cstdint>
#include <string>

#include "nn/gpt.hpp"
#include "nn/pipelined_transformer.hpp"

namespace tessera {

class PipelinedGpt : public PipelinedTransformer {
 public:
  // ShapeError for a config checked_gpt_config refuses.
  PipelinedGpt(const GptConfig& config, const Mesh& mesh, int64_t virtual_stages = 1, std::string mesh_dim = "pp");
  const GptConfig& config() const { return gpt_config_; }

 private:
  GptConfig gpt_config_;
};

// distribute_pipelined_transformer: fully_shard over dp if asked, the config's mixed precision,
// Megatron's sequence parallelism on tp if asked.
void distribute_pipelined_gpt(PipelinedGpt& model, const Mesh& mesh, bool fsdp, bool sequence_parallel = false);

}  // namespace tessera
