#include "nn/gpt_training_step.hpp"

namespace tessera {

GptTrainingStep::GptTrainingStep(const GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp, int64_t microbatches)
    : TransformerTrainingStep(std::make_unique<Gpt>(config, mesh), mesh, sequence_parallel, fsdp, microbatches) {}

}  // namespace tessera
