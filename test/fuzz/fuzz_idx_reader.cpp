// libFuzzer target: the IDX reader (nn/dataset.cpp, Fashion-MNIST's format, plain or gzip) is
// untrusted input. Every input must either load or raise a tessera::Error; any other exception,
// a crash or a sanitizer report is a finding (scripts/libfuzz.sh).
//
// The first byte picks what the rest of the input is:
//   bit 0: the file is written as the rest (plain IDX, or gzip data the fuzzer corrupts) or the
//          rest gzip-compressed (so the fuzzer's changes reach the IDX parser through gzip);
//   bit 1: read_idx on one file, or load_fashion_mnist on an images and a labels file (the rest
//          split after a 2-byte little-endian length), which checks that they match.
// An empty corpus directory named on the command line is filled with seeds before libFuzzer
// reads it.
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>

#include <tessera/tessera.hpp>

#include "fuzz_support.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

fs::path dir;

void write_file(const fs::path& p, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(p.c_str(), "wb");
    if (f && (bytes.empty() || gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size())) && gzclose(f) == Z_OK)
      return;
  } else {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (out) return;
  }
  std::fprintf(stderr, "fuzz_idx_reader: cannot write %s\n", p.c_str());
  std::abort();
}

// An IDX file of unsigned bytes: magic 0 0 8 ndims, big-endian extents, the values.
std::string idx(const std::vector<uint32_t>& shape) {
  std::string out = {0, 0, 8, char(shape.size())};
  size_t n = 1;
  for (uint32_t e : shape) {
    out += {char(e >> 24), char(e >> 16), char(e >> 8), char(e)};
    n *= e;
  }
  for (size_t i = 0; i < n; ++i) out += char(i * 37 % 251);
  return out;
}

void seed(const fs::path& corpus) {
  int k = 0;
  auto add = [&](int mode, const std::string& rest) {
    std::ofstream(corpus / ("seed-" + std::to_string(k++)), std::ios::binary) << char(mode) << rest;
  };
  for (int gz = 0; gz < 2; ++gz) {
    add(gz, idx({4}));
    add(gz, idx({2, 3, 3}));
    add(gz, idx({2, 2, 2, 2}));
    add(gz, idx({0, 5}));
    auto pair = [&](const std::string& images, const std::string& labels) {
      add(2 + gz, std::string{char(images.size() & 0xff), char(images.size() >> 8)} + images + labels);
    };
    pair(idx({3, 2, 2}), idx({3}));
    pair(idx({0, 2, 2}), idx({0}));  // empty: any image size is allowed
  }
  // Gzip data as it is on disk, for the fuzzer to corrupt (mode 0 writes it unchanged); zlib has
  // no coverage feedback, so a copy already corrupt (a data byte flipped) keeps such inputs in
  // the corpus.
  const fs::path tmp = dir / "seed.gz";
  write_file(tmp, idx({2, 3, 3}), true);
  std::ifstream in(tmp, std::ios::binary);
  std::string gz(std::istreambuf_iterator<char>(in), {});
  add(0, gz);
  gz[gz.size() / 2] = char(gz[gz.size() / 2] ^ 0x55);
  add(0, gz);
}


}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  dir = tessera::fuzzing::scratch_directory() / ("tessera_fuzz_idx_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::atexit([] { fs::remove_all(dir); });
  tessera::fuzzing::seed_empty_corpora(*argc, *argv, seed);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool gzip = data[0] & 1, dataset = data[0] & 2;
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  tessera::fuzzing::loads_or_typed_error(dataset ? "load_fashion_mnist" : "read_idx", [&] {
    if (!dataset) {
      write_file(dir / "file", rest, gzip);
      const Array a = read_idx((dir / "file").string());
      // What it read must be what the header says, in one u8 array.
      if (a.dtype() != DType::u8 || a.rank() < 1 || a.rank() > 4 || a.nbytes() != a.numel())
        tessera::fuzzing::finding("read_idx returned an inconsistent array", nullptr);
    } else {
      if (rest.size() < 2) return;
      const size_t n = std::min(rest.size() - 2, size_t(uint8_t(rest[0])) | size_t(uint8_t(rest[1])) << 8);
      write_file(dir / "train-images-idx3-ubyte.gz", rest.substr(2, n), gzip);
      write_file(dir / "train-labels-idx1-ubyte.gz", rest.substr(2 + n), gzip);
      const Dataset d = load_fashion_mnist(true, -1, dir.string());
      if (d.images.rank() != 2 || d.labels.rank() != 1 || d.images.shape()[0] != d.size())
        tessera::fuzzing::finding("load_fashion_mnist returned an inconsistent dataset", nullptr);
    }
  });
  return 0;
}
