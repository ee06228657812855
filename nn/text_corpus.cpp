#include "nn/text_corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsl/error.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IOError("TextCorpus: cannot read '" + path.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string read_path(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw IOError("TextCorpus: no such file or directory '" + path + "'");
  if (!fs::is_directory(status)) return read_file(path);
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, ec))
    if (entry.is_regular_file() && !entry.is_symlink() && entry.path().filename().string().find('.') == std::string::npos)
      files.push_back(entry.path());
  if (ec) throw IOError("TextCorpus: cannot list '" + path + "': " + ec.message());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& file : files) text += read_file(file);
  return text;
}

}  // namespace

TextCorpus TextCorpus::from_path(const std::string& path, double validation_fraction) {
  std::string text = read_path(path);
  if (text.empty()) throw IOError("TextCorpus: '" + path + "' holds no text (a directory's files with no '.' in their name are read)");
  return from_text(std::move(text), validation_fraction);
}

TextCorpus TextCorpus::from_text(std::string text, double validation_fraction) {
  if (!(validation_fraction >= 0 && validation_fraction < 1))
    throw Error("TextCorpus: validation_fraction must be in [0, 1), got " + std::to_string(validation_fraction));
  if (text.empty()) throw Error("TextCorpus: the text is empty");
  TextCorpus corpus;
  corpus.text_ = std::move(text);
  std::vector<bool> present(256, false);
  for (char c : corpus.text_) present[static_cast<unsigned char>(c)] = true;
  corpus.id_of_.assign(256, -1);
  for (int byte = 0; byte < 256; ++byte)
    if (present[size_t(byte)]) {
      corpus.id_of_[size_t(byte)] = int32_t(corpus.alphabet_.size());
      corpus.alphabet_.push_back(char(byte));
    }
  // Block b is held out when the running count of held-out blocks, b * fraction, steps up: an
  // even spread that holds out `fraction` of the blocks.
  const int64_t blocks = (corpus.size() + kBlockBytes - 1) / kBlockBytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const bool held_out = int64_t(double(b + 1) * validation_fraction) > int64_t(double(b) * validation_fraction);
    std::vector<int32_t>& split = held_out ? corpus.validation_ : corpus.train_;
    const int64_t end = std::min(corpus.size(), (b + 1) * kBlockBytes);
    for (int64_t i = b * kBlockBytes; i < end; ++i) split.push_back(corpus.id_of_[static_cast<unsigned char>(corpus.text_[size_t(i)])]);
  }
  return corpus;
}

std::vector<int32_t> TextCorpus::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) {
    const int32_t id = id_of_[static_cast<unsigned char>(c)];
    if (id < 0) throw Error("TextCorpus::encode: the character " + std::to_string(int(static_cast<unsigned char>(c))) + " ('" +
                            std::string(1, c) + "') never occurs in the corpus");
    ids.push_back(id);
  }
  return ids;
}

std::string TextCorpus::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error("TextCorpus::decode: id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_size()));
    text.push_back(alphabet_[size_t(id)]);
  }
  return text;
}

std::pair<Array, Array> text_windows(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts, int64_t context) {
  if (context < 1) throw ShapeError("text_windows: context must be positive, got " + std::to_string(context));
  const int64_t rows = int64_t(starts.size());
  Array ids({rows, context}, DType::i32), targets({rows, context}, DType::i32);
  int32_t* in = ids.mutable_data<int32_t>();
  int32_t* next = targets.mutable_data<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = starts[size_t(r)];
    if (start < 0 || start + context + 1 > int64_t(tokens.size()))
      throw ShapeError("text_windows: a window of " + std::to_string(context + 1) + " tokens at " + std::to_string(start) +
                       " runs past the " + std::to_string(tokens.size()) + " tokens");
    std::copy_n(tokens.begin() + start, context, in + r * context);
    std::copy_n(tokens.begin() + start + 1, context, next + r * context);
  }
  return {std::move(ids), std::move(targets)};
}

std::vector<int64_t> random_window_starts(const std::vector<int32_t>& tokens, int64_t count, int64_t context, std::mt19937_64& rng) {
  const int64_t last = int64_t(tokens.size()) - context - 1;
  if (last < 0)
    throw ShapeError("random_window_starts: " + std::to_string(tokens.size()) + " tokens hold no window of " + std::to_string(context + 1));
  std::uniform_int_distribution<int64_t> pick(0, last);
  std::vector<int64_t> starts(size_t(std::max<int64_t>(count, 0)));
  for (int64_t& s : starts) s = pick(rng);
  return starts;
}

}  // namespace tessera
