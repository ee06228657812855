#include "jit/checkpoint.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <algorithm>
#include <set>

#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/redistribute_executor.hpp"
#include "jit/runtime.hpp"
#include "jit/tensor_api.hpp"

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

// Writes `bytes` to `path` durably: temporary file, fsync, rename.
void write_durably(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw IOError("cannot write checkpoint file '" + tmp.string() + "': " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw IOError("writing checkpoint file '" + tmp.string() + "' failed: " + std::strerror(errno));
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw IOError("syncing checkpoint file '" + tmp.string() + "' failed");
  fs::rename(tmp, path);
}

void sync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_file(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IOError("checkpoint " + what + ": cannot read '" + path.string() + "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
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
  int64_t size = int64_t(text.size());
  MPI_Bcast(&size, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  text.resize(size_t(size));
  MPI_Bcast(text.data(), int(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  return text;
}

// Every client's `text`, at rank 0 (empty elsewhere; {text} with one client).
std::vector<std::string> gather_at_rank0(const std::string& text) {
  if (!multi_client()) return {text};
  const int n = num_clients();
  int size = int(text.size());
  std::vector<int> sizes(static_cast<size_t>(n)), displs(static_cast<size_t>(n), 0);
  MPI_Gather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  for (int r = 1; r < n; ++r) displs[r] = displs[r - 1] + sizes[r - 1];
  std::string all(size_t(displs[n - 1] + sizes[n - 1]), '\0');
  MPI_Gatherv(text.data(), size, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (client_id() != 0) return {};
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(all.substr(size_t(displs[r]), size_t(sizes[r])));
  return out;
}

}  // namespace

void save(const std::string& dir, const std::map<std::string, Variable>& vars) {
  fs::create_directories(dir);
  // Fresh data-file names per save (agreed by every client), so the previous index keeps
  // pointing at intact files.
  const std::string save_id = agree_on(
      fmt::format("{:x}", std::chrono::system_clock::now().time_since_epoch().count() ^ std::random_device{}()));
  std::map<std::string, SafetensorsWriter> files;
  json index = {{"format", "tessera-checkpoint"}, {"version", 1}, {"variables", json::object()}};
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
      const std::string file = "shard-" + save_id + "-" + std::to_string(d) + ".safetensors";
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
  for (const auto& [file, writer] : files) write_durably(fs::path(dir) / file, writer.bytes());
  sync_directory(dir);
  // Rank 0 collects every client's checksums and commits the index last, once all data is durable.
  std::vector<std::string> gathered = gather_at_rank0(checksums.dump());
  if (client_id() == 0) {
    json all = json::object();
    for (const std::string& part : gathered) all.update(json::parse(part));
    std::set<std::string> referenced;
    for (auto& [name, entry] : index["variables"].items())
      for (auto& chunk : entry["chunks"]) {
        chunk["xxh64"] = all.at(chunk["tensor"].get<std::string>());
        referenced.insert(chunk["file"].get<std::string>());
      }
    write_durably(fs::path(dir) / "index.json", index.dump(2));  // the commit point
    sync_directory(dir);
    // Data files no index refers to any more (older saves) can go now.
    for (const auto& f : fs::directory_iterator(dir)) {
      const std::string n = f.path().filename().string();
      if (n.rfind("shard-", 0) == 0 && !referenced.count(n)) fs::remove(f.path());
    }
  }
  wait_for_all_clients("finishing a checkpoint");
}

void load(const std::string& dir, std::map<std::string, Variable>& vars) {
  const fs::path index_path = fs::path(dir) / "index.json";
  json index;
  try {
    index = json::parse(read_file(index_path, "index"));
  } catch (const json::exception& e) {
    throw IOError("checkpoint index '" + index_path.string() + "' is corrupt: " + e.what());
  }
  std::map<std::string, std::string> file_cache;
  auto file_bytes = [&](const std::string& file, const std::string& var) -> const std::string& {
    auto it = file_cache.find(file);
    if (it == file_cache.end()) it = file_cache.emplace(file, read_file(fs::path(dir) / file, "variable '" + var + "'")).first;
    return it->second;
  };
  for (auto& [name, var] : vars) {
    if (!index["variables"].contains(name)) throw IOError("checkpoint '" + dir + "' has no variable '" + name + "'");
    const json& entry = index["variables"][name];
    const auto shape = entry["shape"].get<std::vector<int64_t>>();
    if (shape != var.shape())
      throw IOError("checkpoint variable '" + name + "' has shape " + shape_string(shape) + ", the variable " + shape_string(var.shape()));
    if (entry["dtype"].get<std::string>() != dtype_name(var.dtype()))
      throw IOError("checkpoint variable '" + name + "' holds " + entry["dtype"].get<std::string>() + ", the variable " +
                    std::string(dtype_name(var.dtype())));
    // Read and verify every chunk once.
    struct Chunk { std::vector<int64_t> offset, shape; Array data; };
    std::vector<Chunk> chunks;
    for (const json& c : entry["chunks"]) {
      const std::string file = c["file"], tensor = c["tensor"];
      const std::string& bytes = file_bytes(file, name);
      if (bytes.size() < 8) throw IOError("checkpoint variable '" + name + "': '" + file + "' is truncated");
      uint64_t header_size;
      std::memcpy(&header_size, bytes.data(), 8);
      json header;
      try {
        if (8 + header_size > bytes.size()) throw IOError("truncated header");
        header = json::parse(bytes.substr(8, header_size));
      } catch (const std::exception& e) {
        throw IOError("checkpoint variable '" + name + "': '" + file + "' has a corrupt header");
      }
      if (!header.contains(tensor)) throw IOError("checkpoint variable '" + name + "': '" + file + "' lacks tensor " + tensor);
      auto range = header[tensor]["data_offsets"].get<std::vector<uint64_t>>();
      Chunk chunk{c["offset"].get<std::vector<int64_t>>(), c["shape"].get<std::vector<int64_t>>(), Array()};
      chunk.data = Array::uninitialized(chunk.shape, var.dtype());
      const uint64_t begin = 8 + header_size + range[0], size = range[1] - range[0];
      if (size != uint64_t(chunk.data.nbytes()) || begin + size > bytes.size())
        throw IOError("checkpoint variable '" + name + "': chunk " + tensor + " in '" + file + "' is truncated or mis-sized");
      std::memcpy(chunk.data.mutable_bytes(), bytes.data() + begin, size);
      if (XXH64(chunk.data.bytes(), size, 0) != c["xxh64"].get<uint64_t>())
        throw IOError("checkpoint variable '" + name + "': chunk " + tensor + " in '" + file + "' fails its checksum (corrupt data)");
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
        std::vector<int64_t> lo, extent;
        bool empty = false;
        for (size_t a = 0; a < shape.size(); ++a) {
          int64_t l = std::max(box.global_offset[a], chunk.offset[a]);
          int64_t h = std::min(box.global_offset[a] + box.local_shape[a], chunk.offset[a] + chunk.shape[a]);
          lo.push_back(l);
          extent.push_back(std::max<int64_t>(h - l, 0));
          empty |= h <= l;
        }
        if (!empty || shape.empty()) copy_region(chunk.data, chunk.offset, local, box.global_offset, lo, extent);
      }
      components.push_back(local);
    }
    Tensor loaded = pack(components, values);
    if (layout.has_partial()) loaded = relayout(loaded, layout);
    var.assign(loaded);
  }
}

}  // namespace tessera
