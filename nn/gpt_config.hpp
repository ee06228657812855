// A GPT's shape (vocabulary, context, depth, width, heads) and its training options, and the
// check every GPT built from one runs first: a shape no model has (no heads, no width, a
// negative depth) is a ShapeError naming the field and its value, not a division by zero.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dsl/checkpoint.hpp"
#include "nn/mixed_precision_policy.hpp"

namespace tessera {

struct GptConfig {
  int64_t vocab = 96, context = 128, layers = 4, width = 128, heads = 4;
  uint64_t seed = 1;
  // Activation checkpointing of every block (dsl/checkpoint.hpp); none when empty.
  std::optional<CheckpointPolicy> activation_checkpointing;
  // Mixed precision (nn/mixed_precision.hpp), installed by distribute_gpt; f32 throughout when empty.
  std::optional<MixedPrecisionPolicy> mixed_precision;
};

// `config` itself when vocab, context, layers, width and heads are each at least 1 and heads
// divides width; otherwise a ShapeError naming `who`, the field and its value.
const GptConfig& checked_gpt_config(const GptConfig& config, const std::string& who);

}  // namespace tessera
