// The small GPT the GPT and pipeline suites train (test_gpt, test_pipeline), and its batches.
#pragma once

#include <cstdint>
#include <random>

#include <tessera/tessera.hpp>

namespace tessera::testing {

// Vocabulary 13, context 8, width 16, 4 heads, seed 7.
inline GptConfig tiny_gpt_config(int64_t layers = 2) {
  GptConfig c;
  c.vocab = 13;
  c.context = 8;
  c.layers = layers;
  c.width = 16;
  c.heads = 4;
  c.seed = 7;
  return c;
}

// [batch, time] int32 ids below the tiny vocabulary, from `seed`.
inline Array tiny_gpt_tokens(int64_t batch, int64_t time, uint32_t seed) {
  std::mt19937 rng(seed);
  Array a({batch, time}, DType::i32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<int32_t>()[i] = int32_t(rng() % 13);
  return a;
}

}  // namespace tessera::testing
