#include "nn/gpt_config.hpp"

#include <utility>

#include "dsl/error.hpp"

namespace tessera {

const GptConfig& checked_gpt_config(const GptConfig& c, const std::string& who) {
  for (const auto& [field, value] : {std::pair{"vocab", c.vocab}, std::pair{"context", c.context}, std::pair{"layers", c.layers},
                                     std::pair{"width", c.width}, std::pair{"heads", c.heads}})
    if (value < 1)
      throw ShapeError(who + ": GptConfig's " + field + " is " + std::to_string(value) + "; it must be at least 1");
  // Checked here, before any layer divides the width by the heads.
  if (c.width % c.heads != 0)
    throw ShapeError(who + ": GptConfig's width " + std::to_string(c.width) + " is not a multiple of its heads " + std::to_string(c.heads));
  return c;
}

}  // namespace tessera
