// libFuzzer target: checkpoint loading (jit/api/checkpoint.cpp) is untrusted input. Every input must
// either load or raise a tessera::Error; any other exception, a crash or a sanitizer report is a
// finding (scripts/libfuzz.sh).
//
// A small real checkpoint is saved once at start-up; each input replaces one of its files, so
// everything the input does not touch is valid and the loader gets as far as the input allows.
// The first byte picks what the rest of the input is (mode = byte % 4) and the layouts the
// variables are loaded into (byte / 4 % 4, resharding differently each time):
//   0: index.json, verbatim (the JSON parser, then mostly the index's own checksum);
//   1: index.json with its "xxh64" recomputed when it parses as an object, so byte-level changes
//      get past the checksum into the field-by-field validation and the chunk tiling checks;
//   2: a whole safetensors shard file (the one holding chunk 0 of "w");
//   3: that shard's JSON header only: its 8-byte length prefix and its data are kept valid, so
//      changes reach the data_offsets bounds checks.
// An empty corpus directory named on the command line is filled with seeds (each mode, each
// layout) before libFuzzer reads it.
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include <tessera/tessera.hpp>

#include "fuzz_support.hpp"

using namespace tessera;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Fixture {
  fs::path dir;
  Mesh mesh;
  std::string index;        // index.json as saved
  std::string shard_name;   // the file holding chunk 0 of "w"
  std::string shard;        // its bytes
};

Fixture* fixture = nullptr;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const char* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data, std::streamsize(size));
  if (!out) {
    std::fprintf(stderr, "fuzz_checkpoint_index: cannot write %s\n", p.c_str());
    std::abort();
  }
}
void write_bytes(const fs::path& p, const std::string& s) { write_bytes(p, s.data(), s.size()); }

// The layouts "w" (5x3) and "b" (3,) are loaded into: resharding from the saved ("x", "y") and
// replicated layouts, a partial one included.
std::map<std::string, Variable> targets(int which) {
  const Mesh& m = fixture->mesh;
  Layout w = Layout({"y", "x"}, m), b = Layout::replicated(m, 1);
  switch (which) {
    case 0: break;
    case 1: w = Layout({"x", "y"}, m); b = Layout({"x"}, m); break;
    case 2: w = Layout::replicated(m, 2); b = Layout({"y"}, m); break;
    default: w = Layout::from_placements(m, {Partial{}, Shard{0}}, 2); break;
  }
  return {{"w", Variable(zeros({5, 3}, w))}, {"b", Variable(zeros({3}, b, DType::i32))}};
}

// The checksum load() verifies: xxh64 of the compact text without the "xxh64" field.
std::string with_checksum(const std::string& text) {
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception&) {
    return text;  // the loader must reject it the same way
  }
  if (!index.is_object()) return text;
  index.erase("xxh64");
  const std::string compact = index.dump();
  index["xxh64"] = XXH64(compact.data(), compact.size(), 0);
  return index.dump();
}


void seed(const fs::path& corpus) {
  const std::string shard_header = fixture->shard.substr(8, [&] {
    uint64_t n;
    std::memcpy(&n, fixture->shard.data(), 8);
    return size_t(n);
  }());
  const std::string payloads[4] = {fixture->index, fixture->index, fixture->shard, shard_header};
  for (int mode = 0; mode < 4; ++mode)
    for (int layouts = 0; layouts < 4; ++layouts) {
      std::string input(1, char(mode + 4 * layouts));
      input += payloads[mode];
      write_bytes(corpus / ("seed-" + std::to_string(mode) + "-" + std::to_string(layouts)), input);
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fixture = new Fixture{tessera::fuzzing::scratch_directory() / ("tessera_fuzz_checkpoint_" + std::to_string(::getpid())),
                        create_mesh({{"x", 2}, {"y", 2}}), {}, {}, {}};
  fs::remove_all(fixture->dir);
  std::map<std::string, Variable> saved = {
      {"w", Variable(random_normal({5, 3}, 1, Layout({"x", "y"}, fixture->mesh)))},
      {"b", Variable(copy_to_mesh(Array::from<int32_t>({7, -8, 9}, {3}), Layout::replicated(fixture->mesh, 1)))}};
  save(fixture->dir.string(), saved);
  fixture->index = read_bytes(fixture->dir / "index.json");
  fixture->shard_name = json::parse(fixture->index)["variables"]["w"]["chunks"][0]["file"].get<std::string>();
  fixture->shard = read_bytes(fixture->dir / fixture->shard_name);
  std::atexit([] { fs::remove_all(fixture->dir); });
  tessera::fuzzing::seed_empty_corpora(*argc, *argv, seed);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& f = *fixture;
  const int mode = data[0] % 4, layouts = data[0] / 4 % 4;
  const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool index_changed = mode <= 1;
  const fs::path changed = f.dir / (index_changed ? "index.json" : f.shard_name);
  switch (mode) {
    case 0: write_bytes(changed, payload); break;
    case 1: write_bytes(changed, with_checksum(payload)); break;
    case 2: write_bytes(changed, payload); break;
    case 3: {
      uint64_t old_size;
      std::memcpy(&old_size, f.shard.data(), 8);
      const uint64_t n = payload.size();
      std::string bytes(reinterpret_cast<const char*>(&n), 8);
      write_bytes(changed, bytes + payload + f.shard.substr(8 + size_t(old_size)));
      break;
    }
  }
  std::optional<std::map<std::string, Variable>> vars;
  try {
    vars = targets(layouts);
  } catch (const std::exception& e) {
    tessera::fuzzing::finding("building the target variables failed", &e);
  }
  // An accepted checkpoint must give usable variables: read every value back.
  if (tessera::fuzzing::loads_or_typed_error("load()", [&] { load(f.dir.string(), *vars); })) {
    try {
      for (auto& [name, v] : *vars) (void)v.value().full_tensor();
    } catch (const std::exception& e) {
      tessera::fuzzing::finding("reading a loaded variable failed", &e);
    }
  }
  write_bytes(changed, index_changed ? f.index : f.shard);
  return 0;
}
