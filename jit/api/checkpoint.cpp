#include "jit/api/checkpoint.hpp"

#include "comm/client_group.hpp"
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <algorithm>
#include <set>

#include "dsl/element_count.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"
#include "jit/api/checkpoint_files.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/redistribute_executor.hpp"
#include "jit/runtime.hpp"
#include "jit/api/tensor_api.hpp"

namespace tessera {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* safetensors_dtype(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "BOOL";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

// A safetensors file: 8-byte little-endian header size, JSON header, raw data.
struct SafetensorsWriter {
  json header = json::object();
  std::string data;
  void add(const std::string& name, const Array& a) {
    header[name] = {{"dtype", safetensors_dtype(a.dtype())}, {"shape", a.shape()},
                    {"data_offsets", {data.size(), data.size() + size_t(a.nbytes())}}};
    data.append(reinterpret_cast<const char*>(a.bytes()), size_t(a.nbytes()));
  }
  std::string bytes() const {
    std::string h = header.dump();
    uint64_t size = h.size();
    std::string out(reinterpret_cast<const char*>(&size), 8);
    return out + h + data;
  }
};

}  // namespace

namespace {

// Rank 0's text, on every client (the identity with one client).
std::string agree_on(std::string text) {
  if (!multi_client()) return text;
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                               reinterpret_cast<const std::byte*>(text.data()) + text.size());
  world_clients().broadcast(bytes, 0);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Every client's `text`, at rank 0 (empty elsewhere; {text} with one client).
std::vector<std::string> gather_at_rank0(const std::string& text) {
  if (!multi_client()) return {text};
  const std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                                     reinterpret_cast<const std::byte*>(text.data()) + text.size());
  std::vector<std::string> out;
  for (const auto& b : world_clients().gather(bytes, 0))
    out.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  return out;
}

}  // namespace

namespace {

// The index's own checksum: over its compact text without the "xxh64" field (an object's keys
// are sorted, so the text is the same after parsing).
uint64_t index_checksum(json index) {
  index.erase("xxh64");
  const std::string text = index.dump();
  return XXH64(text.data(), text.size(), 0);
}

// The index is untrusted input: every field is checked before use, and each failure is an
// IOError naming the file, the variable and the field.
struct IndexReader {
  fs::path path;

  [[noreturn]] void bad(const std::string& where, const std::string& why) const {
    throw IOError("checkpoint index '" + path.string() + "': " + where + ": " + why);
  }
  const json& field(const json& j, const char* key, const std::string& where) const {
    if (!j.is_object() || !j.contains(key)) bad(where, std::string("missing field '") + key + "'");
    return j[key];
  }
  std::string text(const json& j, const char* key, const std::string& where) const {
    const json& v = field(j, key, where);
    if (!v.is_string()) bad(where, std::string("field '") + key + "' is not a string");
    return v.get<std::string>();
  }
  uint64_t number(const json& j, const char* key, const std::string& where) const {
    const json& v = field(j, key, where);
    if (!v.is_number_unsigned()) bad(where, std::string("field '") + key + "' is not a non-negative integer");
    return v.get<uint64_t>();
  }
  std::vector<int64_t> extents(const json& j, const char* key, const std::string& where) const {
    const json& v = field(j, key, where);
    if (!v.is_array()) bad(where, std::string("field '") + key + "' is not a list");
    std::vector<int64_t> out;
    for (const json& e : v) {
      if (!e.is_number_unsigned() || e.get<uint64_t>() > uint64_t(kMaxElements))
        bad(where, std::string("field '") + key + "' holds " + e.dump() + ", not an extent");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
};

// Chunks must tile the tensor: each inside it, no two overlapping, all elements covered.
void check_chunk_cover(const IndexReader& r, const std::string& where, const std::vector<int64_t>& shape,
                       const std::vector<ShardBox>& boxes) {
  const int64_t total = checked_element_count(shape, "checkpoint variable");
  int64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const ShardBox& box = boxes[i];
    if (box.global_offset.size() != shape.size() || box.local_shape.size() != shape.size())
      r.bad(where, "chunk " + std::to_string(i) + " has the wrong rank");
    for (size_t a = 0; a < shape.size(); ++a)
      if (box.global_offset[a] > shape[a] || box.local_shape[a] > shape[a] - box.global_offset[a])
        r.bad(where, "chunk " + std::to_string(i) + " reaches outside the tensor " + shape_string(shape));
    covered += box.num_elements();
    for (size_t j = 0; j < i; ++j)
      if (intersect(box, boxes[j]).num_elements() > 0)
        r.bad(where, "chunks " + std::to_string(j) + " and " + std::to_string(i) + " overlap");
  }
  if (covered != total)
    r.bad(where, "the chunks cover " + std::to_string(covered) + " of " + std::to_string(total) + " elements");
}

// The data file that device `d` of `mesh` writes: named by the client holding the device and
// its index there, so variables on meshes of their own (pipeline stages on different clients)
// never give two clients one file to write, while one client's devices of several meshes share.
std::string data_file_name(const std::string& save_id, const Mesh& mesh, const std::vector<int64_t>& local_ids, int64_t d) {
  const std::vector<DeviceName>& global = mesh.global_device_names();
  DeviceName device;
  if (!global.empty()) {
    device = global[size_t(d)];
  } else {  // a mesh of this client's devices alone lists no global names
    const auto local = std::find(local_ids.begin(), local_ids.end(), d);
    if (local == local_ids.end()) throw InternalError("checkpoint: device " + std::to_string(d) + " of a mesh of local devices is not local");
    device = mesh.local_device_names()[size_t(local - local_ids.begin())];
    device.task = client_id();
  }
  return fmt::format("shard-{}-{}-{}.safetensors", save_id, device.task, device.index);
}

}  // namespace

void save(const std::string& dir, const std::map<std::string, Variable>& vars) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw IOError("cannot create checkpoint directory '" + dir + "': " + error.message());
  // Temporaries of saves that were killed midway: nothing refers to them.
  if (client_id() == 0)
    for (const auto& f : fs::directory_iterator(dir, error))
      if (f.path().extension() == ".tmp") fs::remove(f.path(), error);
  // Fresh data-file names per save (agreed by every client), so the previous index keeps
  // pointing at intact files.
  const std::string save_id = agree_on(
      fmt::format("{:x}", std::chrono::system_clock::now().time_since_epoch().count() ^ std::random_device{}()));
  std::map<std::string, SafetensorsWriter> files;
  json index = {{"format", "tessera-checkpoint"}, {"version", 2}, {"variables", json::object()}};
  json checksums = json::object();  // "variable/chunk" -> xxh64, for the chunks this client wrote
  for (const auto& [name, var] : vars) {
    NodeValue value = force_value(var.value().node());
    if (value.layout.has_partial())  // store values, not pending partial terms
      value = execute_redistribute(value, var.shape(), var.dtype(), value.layout.without_partial());
    const Mesh& mesh = value.layout.mesh();
    const std::vector<int64_t> local_ids = mesh.local_device_ids();
    json entry = {{"shape", var.shape()}, {"dtype", dtype_name(var.dtype())}, {"layout", value.layout.global_text()},
                  {"chunks", json::array()}};
    // Every unique block once, written by the lowest device holding it (whichever client that is).
    std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, int64_t> owner;
    for (int64_t d = 0; d < mesh.size(); ++d) {
      ShardBox box = shard_geometry(var.shape(), value.layout, mesh.coords(d));
      if (box.num_elements() == 0 || owner.count({box.global_offset, box.local_shape})) continue;
      owner[{box.global_offset, box.local_shape}] = d;
      const std::string file = data_file_name(save_id, mesh, local_ids, d);
      const std::string tensor = name + "/" + std::to_string(entry["chunks"].size());
      entry["chunks"].push_back({{"file", file}, {"tensor", tensor}, {"device", d}, {"offset", box.global_offset},
                                 {"shape", box.local_shape}});
      auto local = std::find(local_ids.begin(), local_ids.end(), d);
      if (local == local_ids.end()) continue;  // another client writes it
      const Array& chunk = value.storage->components[size_t(local - local_ids.begin())];
      files[file].add(tensor, chunk);
      checksums[tensor] = XXH64(chunk.bytes(), size_t(chunk.nbytes()), 0);
    }
    index["variables"][name] = entry;
  }
  // Each client writes its data files. A failure on any client (a full disk, a file in the way)
  // is agreed on below, and then every client removes the files it wrote: the folder keeps the
  // previous checkpoint and nothing of this one.
  CheckpointFilesWritten written(dir);
  std::string failure;
  try {
    for (const auto& [file, writer] : files) written.write(file, writer.bytes());
    sync_directory(dir);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Rank 0 collects every client's checksums (or failure) and commits the index last, once all
  // data is durable. A path in a message need not be UTF-8: replaced, not a JSON exception.
  const json report = failure.empty() ? json{{"checksums", checksums}} : json{{"failure", failure}};
  const std::vector<std::string> gathered = gather_at_rank0(report.dump(-1, ' ', false, json::error_handler_t::replace));
  std::string outcome;  // rank 0's: empty once the index is in place, else why the save failed
  if (client_id() == 0) {
    json all = json::object();
    for (size_t r = 0; r < gathered.size() && outcome.empty(); ++r) {
      const json part = json::parse(gathered[r]);
      if (part.contains("failure"))
        outcome = (multi_client() ? fmt::format("client {}: ", r) : std::string()) + part["failure"].get<std::string>();
      else
        all.update(part["checksums"]);
    }
    std::set<std::string> referenced;
    if (outcome.empty()) {
      for (auto& [name, entry] : index["variables"].items())
        for (auto& chunk : entry["chunks"]) {
          chunk["xxh64"] = all.at(chunk["tensor"].get<std::string>());
          referenced.insert(chunk["file"].get<std::string>());
        }
      index["xxh64"] = index_checksum(index);
      try {
        write_checkpoint_file(fs::path(dir) / "index.json", index.dump(2));  // the commit point
      } catch (const IOError& e) {
        outcome = e.what();
      }
    }
    if (outcome.empty()) {
      written.keep();
      sync_directory(dir);
      // Data files no index refers to any more (older saves) can go now; the save has
      // succeeded, so a file that will not go is left for the next one.
      std::error_code listing, removing;
      for (fs::directory_iterator f(dir, listing), end; !listing && f != end; f.increment(listing)) {
        const std::string n = f->path().filename().string();
        if (n.rfind("shard-", 0) == 0 && !referenced.count(n)) fs::remove(f->path(), removing);
      }
    }
  }
  outcome = agree_on(outcome);
  if (!outcome.empty()) throw IOError(outcome);  // `written` removes this client's files
  written.keep();
  wait_for_all_clients("finishing a checkpoint");
}

void load(const std::string& dir, std::map<std::string, Variable>& vars) {
  const fs::path index_path = fs::path(dir) / "index.json";
  const IndexReader r{index_path};
  json index;
  try {
    index = json::parse(read_checkpoint_file(index_path, "index"));
  } catch (const json::exception& e) {
    throw IOError("checkpoint index '" + index_path.string() + "' is corrupt: " + e.what());
  }
  if (r.text(index, "format", "the index") != "tessera-checkpoint") r.bad("the index", "not a Tessera checkpoint");
  const uint64_t version = r.number(index, "version", "the index");
  // Version 1 indexes carry no checksum of their own: accepting one would let any edit of a
  // current index pass unchecked by rewriting its version.
  if (version == 1)
    r.bad("the index", "version 1 (written before indexes carried their own checksum) is no longer supported");
  if (version != 2) r.bad("the index", "unknown version " + std::to_string(version) + " (this Tessera reads version 2)");
  if (!index.contains("xxh64")) r.bad("the index", "version 2 index has no checksum (missing field 'xxh64')");
  if (r.number(index, "xxh64", "the index") != index_checksum(index)) r.bad("the index", "fails its checksum (corrupt)");
  const json& variables = r.field(index, "variables", "the index");
  std::map<std::string, std::string> file_cache;
  auto file_bytes = [&](const std::string& file, const std::string& var) -> const std::string& {
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      r.bad("variable '" + var + "'", "chunk file '" + file + "' is not a file name in the checkpoint");
    auto it = file_cache.find(file);
    if (it == file_cache.end()) it = file_cache.emplace(file, read_checkpoint_file(fs::path(dir) / file, "variable '" + var + "'")).first;
    return it->second;
  };
  for (auto& item : vars) {
    // (not a structured binding: clang before 16 cannot capture one in the lambdas below)
    const std::string& name = item.first;
    Variable& var = item.second;
    if (!variables.is_object() || !variables.contains(name)) throw IOError("checkpoint '" + dir + "' has no variable '" + name + "'");
    const std::string where = "variable '" + name + "'";
    const json& entry = variables[name];
    const auto shape = r.extents(entry, "shape", where);
    if (shape != var.shape())
      throw IOError("checkpoint variable '" + name + "' has shape " + shape_string(shape) + ", the variable " + shape_string(var.shape()));
    const std::string dtype = r.text(entry, "dtype", where);
    if (dtype != dtype_name(var.dtype()))
      throw IOError("checkpoint variable '" + name + "' holds " + dtype + ", the variable " + std::string(dtype_name(var.dtype())));
    const json& chunk_list = r.field(entry, "chunks", where);
    if (!chunk_list.is_array()) r.bad(where, "field 'chunks' is not a list");
    std::vector<ShardBox> boxes;
    for (const json& c : chunk_list) boxes.push_back(ShardBox{r.extents(c, "shape", where), r.extents(c, "offset", where)});
    check_chunk_cover(r, where, shape, boxes);
    // Read and verify every chunk once.
    struct Chunk { ShardBox box; Array data; };
    std::vector<Chunk> chunks;
    for (size_t k = 0; k < chunk_list.size(); ++k) {
      const json& c = chunk_list[k];
      const std::string file = r.text(c, "file", where), tensor = r.text(c, "tensor", where);
      const uint64_t checksum = r.number(c, "xxh64", where);
      const std::string& bytes = file_bytes(file, name);
      auto corrupt = [&](const std::string& why) {
        return IOError("checkpoint variable '" + name + "': '" + (fs::path(dir) / file).string() + "' " + why);
      };
      if (bytes.size() < 8) throw corrupt("is truncated");
      uint64_t header_size;
      std::memcpy(&header_size, bytes.data(), 8);
      if (header_size > bytes.size() - 8) throw corrupt("has a truncated header");
      json header;
      try {
        header = json::parse(bytes.substr(8, header_size));
      } catch (const std::exception&) {
        throw corrupt("has a corrupt header");
      }
      if (!header.is_object() || !header.contains(tensor)) throw corrupt("lacks tensor " + tensor);
      const json& offsets = header[tensor].is_object() && header[tensor].contains("data_offsets") ? header[tensor]["data_offsets"] : json();
      if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
        throw corrupt("has no valid data_offsets for " + tensor);
      const uint64_t lo = offsets[0].get<uint64_t>(), hi = offsets[1].get<uint64_t>();
      Chunk chunk{boxes[k], Array::uninitialized(boxes[k].local_shape, var.dtype())};
      const uint64_t data_start = 8 + header_size, size = uint64_t(chunk.data.nbytes());
      if (hi < lo || hi - lo != size || lo > bytes.size() - data_start || size > bytes.size() - data_start - lo)
        throw corrupt("holds chunk " + tensor + " truncated or mis-sized");
      std::memcpy(chunk.data.mutable_bytes(), bytes.data() + data_start + lo, size);
      if (XXH64(chunk.data.bytes(), size, 0) != checksum) throw corrupt("fails the checksum of chunk " + tensor + " (corrupt data)");
      chunks.push_back(std::move(chunk));
    }
    // Each device takes the parts of the saved chunks that fall in its block.
    const Layout layout = var.layout();
    const Layout values = layout.without_partial();
    const auto coords = local_device_coords(layout.mesh());
    std::vector<Array> components;
    for (const auto& c : coords) {
      ShardBox box = shard_geometry(shape, values, c);
      Array local(box.local_shape, var.dtype());
      for (const Chunk& chunk : chunks) {
        const ShardBox part = intersect(box, chunk.box);
        if (part.num_elements() > 0)
          copy_region(chunk.data, chunk.box.global_offset, local, box.global_offset, part.global_offset, part.local_shape);
      }
      components.push_back(local);
    }
    Tensor loaded = pack(components, values);
    if (layout.has_partial()) loaded = relayout(loaded, layout);
    var.assign(loaded);
  }
}

}  // namespace tessera
