// A character-level text corpus for language models: the bytes of some text files, a vocabulary
// of the bytes that occur, a held-out split, and batches of (input, next-token target) windows.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsl/array.hpp"

namespace tessera {

class TextCorpus {
 public:
  // `path` is a text file, or a directory whose regular files with no '.' in their name are read
  // in name order (Debian's fortunes: the plain files, not their .dat indices or .u8 links).
  // IOError naming the path when it is missing, unreadable, or holds no text.
  static TextCorpus from_path(const std::string& path, double validation_fraction = 0.1);
  // Error unless 0 <= validation_fraction < 1 and the text is non-empty.
  static TextCorpus from_text(std::string text, double validation_fraction = 0.1);

  int64_t vocab_size() const { return int64_t(alphabet_.size()); }
  int64_t size() const { return int64_t(text_.size()); }
  // Token ids of `text`; Error naming the first character the corpus never contains.
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // Error on an id outside the vocabulary

  // The text cut into blocks of kBlockBytes; a validation_fraction of them, spread evenly through
  // the text, are held out, so both splits sample every part of it (not only its last files).
  const std::vector<int32_t>& train_tokens() const { return train_; }
  const std::vector<int32_t>& validation_tokens() const { return validation_; }
  static constexpr int64_t kBlockBytes = 4096;

 private:
  std::string text_;
  std::string alphabet_;         // id -> byte, in byte order
  std::vector<int32_t> id_of_;   // byte -> id, -1 when absent
  std::vector<int32_t> train_, validation_;
};

// Windows of `tokens` at each start: ids [starts, context] and the same shifted by one, the next
// token to predict, both int32. ShapeError when a window would run past the end.
std::pair<Array, Array> text_windows(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts, int64_t context);

// `count` window starts drawn uniformly from `tokens` by `rng`. ShapeError when `tokens` holds no
// window of context + 1 tokens.
std::vector<int64_t> random_window_starts(const std::vector<int32_t>& tokens, int64_t count, int64_t context, std::mt19937_64& rng);

}  // namespace tessera
