// TextCorpus: the character vocabulary, the held-out split, windows and their targets, reading
// a directory the way Debian's fortunes are laid out, and the typed errors of bad input.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <tessera/tessera.hpp>

using namespace tessera;

namespace {

std::string numbered_text(int64_t bytes) {
  std::string text;
  for (int64_t i = 0; i < bytes; ++i) text.push_back(char('a' + i % 7));
  return text;
}

}  // namespace

TEST_CASE("a text corpus's vocabulary is the bytes it holds, in byte order, and encode/decode round-trip") {
  const TextCorpus corpus = TextCorpus::from_text("hello, world\n", 0.0);
  CHECK(corpus.vocab_size() == 10);  // "\n ,dehlorw"
  CHECK(corpus.encode("\n") == std::vector<int32_t>{0});
  CHECK(corpus.encode("w") == std::vector<int32_t>{9});
  CHECK(corpus.decode(corpus.encode("low door")) == "low door");
  CHECK(corpus.train_tokens() == corpus.encode("hello, world\n"));
  CHECK(corpus.validation_tokens().empty());
  CHECK_THROWS_AS((void)corpus.encode("hex"), Error);
  CHECK_THROWS_WITH_AS((void)corpus.decode({10}), doctest::Contains("outside the vocabulary of 10"), Error);
}

TEST_CASE("the held-out split takes a fraction of the blocks, spread through the text") {
  const int64_t blocks = 40;
  const TextCorpus corpus = TextCorpus::from_text(numbered_text(blocks * TextCorpus::kBlockBytes - 100), 0.1);
  CHECK(corpus.validation_tokens().size() + corpus.train_tokens().size() == size_t(corpus.size()));
  // Four of forty blocks, the 10th, 20th, 30th and 40th (the last one 100 bytes short).
  CHECK(int64_t(corpus.validation_tokens().size()) == 4 * TextCorpus::kBlockBytes - 100);
  // Block 9 is held out: the validation split starts with the text at 9 * kBlockBytes.
  const std::vector<int32_t> all = TextCorpus::from_text(numbered_text(blocks * TextCorpus::kBlockBytes - 100), 0.0).train_tokens();
  CHECK(corpus.validation_tokens().front() == all[size_t(9 * TextCorpus::kBlockBytes)]);
  CHECK(corpus.train_tokens()[size_t(9 * TextCorpus::kBlockBytes)] == all[size_t(10 * TextCorpus::kBlockBytes)]);
  CHECK_THROWS_AS(TextCorpus::from_text("abc", 1.0), Error);
  CHECK_THROWS_AS(TextCorpus::from_text("abc", -0.5), Error);
  CHECK_THROWS_AS(TextCorpus::from_text("", 0.1), Error);
}

TEST_CASE("windows hold context tokens and their targets are the next tokens") {
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10};
  auto [ids, targets] = text_windows(tokens, {0, 2}, 3);
  CHECK(ids.shape() == std::vector<int64_t>{2, 3});
  CHECK(ids.dtype() == DType::i32);
  CHECK(ids.to_vector<int32_t>() == std::vector<int32_t>{5, 6, 7, 7, 8, 9});
  CHECK(targets.to_vector<int32_t>() == std::vector<int32_t>{6, 7, 8, 8, 9, 10});
  CHECK_THROWS_WITH_AS(text_windows(tokens, {3}, 3), doctest::Contains("runs past the 6 tokens"), ShapeError);
  CHECK_THROWS_AS(text_windows(tokens, {0}, 0), ShapeError);

  std::mt19937_64 rng(3), same(3);
  const std::vector<int64_t> starts = random_window_starts(tokens, 50, 3, rng);
  CHECK(starts == random_window_starts(tokens, 50, 3, same));  // a seed gives the same batches
  for (int64_t s : starts) CHECK((s >= 0 && s <= 2));
  CHECK_THROWS_AS(random_window_starts(tokens, 1, 6, rng), ShapeError);
}

TEST_CASE("a directory is read as its plain files in name order, skipping index files; bad paths are IOErrors") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tessera_corpus_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "b") << "world";
  std::ofstream(dir / "a") << "hello ";
  std::ofstream(dir / "a.dat") << "\x01\x02 index";
  const TextCorpus corpus = TextCorpus::from_path(dir.string(), 0.0);
  CHECK(corpus.decode(corpus.train_tokens()) == "hello world");
  CHECK(TextCorpus::from_path((dir / "b").string(), 0.0).size() == 5);
  CHECK_THROWS_WITH_AS(TextCorpus::from_path((dir / "missing").string()), doctest::Contains("missing"), IOError);
  fs::create_directories(dir / "empty");
  CHECK_THROWS_WITH_AS(TextCorpus::from_path((dir / "empty").string()), doctest::Contains("holds no text"), IOError);
  fs::remove_all(dir);
}
