#include "jit/mesh_agreement.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/client_group.hpp"
#include "dsl/error.hpp"
#include "dsl/node.hpp"  // hash_text
#include "dsl/string_util.hpp"
#include "jit/runtime.hpp"

namespace tessera {
namespace {

// What every client of a mesh must list alike: its dims and its global devices, in order.
struct MeshListing {
  std::string dims;
  std::vector<std::string> devices;  // full names: two spellings of one device agree

  std::string text() const { return dims + "|" + join(devices, ","); }
};

MeshListing listing_of(const Mesh& mesh) {
  MeshListing out{mesh.dims_string(), {}};
  for (const DeviceName& d : mesh.global_device_names()) out.devices.push_back(d.full_string());
  return out;
}

MeshListing parse_listing(const std::string& text) {
  const size_t bar = text.find('|');
  MeshListing out{text.substr(0, bar), {}};
  if (bar + 1 < text.size()) out.devices = split(text.substr(bar + 1), ',');
  return out;
}

// Every member's text, in the group's rank order: lengths first, then the texts padded to the
// longest (all_gather takes the same count from every member).
std::vector<std::string> gather_texts(ClientGroup& group, const std::string& text) {
  const std::vector<int64_t> lengths = group.all_gather({int64_t(text.size())});
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const size_t words = size_t((longest + 7) / 8);
  std::vector<int64_t> mine(words, 0);
  std::memcpy(mine.data(), text.data(), text.size());
  const std::vector<int64_t> all = group.all_gather(mine);
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data() + r * words), size_t(lengths[r]));
  return out;
}

std::string device_list(const std::vector<std::string>& devices) {
  return join(devices, ",");
}

// The clients' listings differ: this client's and the first other one's, named.
[[noreturn]] void throw_listings_differ(const std::vector<int>& clients, const std::vector<std::string>& texts, size_t me) {
  size_t other = 0;
  while (texts[other] == texts[me]) ++other;
  const MeshListing mine = parse_listing(texts[me]), theirs = parse_listing(texts[other]);
  const std::string here = "this client (" + std::to_string(clients[me]) + "): ", there = "; client " + std::to_string(clients[other]) + ": ";
  if (mine.dims != theirs.dims)
    throw MeshError("clients disagree on the dims of a mesh spanning them: " + here + mine.dims + there + theirs.dims);
  std::vector<std::string> sorted_mine = mine.devices, sorted_theirs = theirs.devices;
  std::sort(sorted_mine.begin(), sorted_mine.end());
  std::sort(sorted_theirs.begin(), sorted_theirs.end());
  const std::string what = sorted_mine == sorted_theirs ? "list the mesh's global devices in different orders"
                                                        : "list different global devices for the mesh";
  throw MeshError("clients " + what + " (every client must pass the same list, in the same order): " + here +
                  device_list(mine.devices) + there + device_list(theirs.devices));
}

// This client's local device ids as a bitmap over the mesh's ids, 64 to a word.
std::vector<int64_t> claimed_bits(const Mesh& mesh) {
  std::vector<int64_t> bits(size_t((mesh.size() + 63) / 64), 0);
  for (int64_t id : mesh.local_device_ids()) bits[size_t(id / 64)] |= int64_t(uint64_t(1) << (id % 64));
  return bits;
}

// Each device local to exactly one client, the client of its task. `claims`: every member's
// claimed_bits, in the order of `clients`.
void check_claims(const Mesh& mesh, const std::vector<int>& clients, const std::vector<int64_t>& claims) {
  const size_t words = size_t((mesh.size() + 63) / 64);
  const auto& global = mesh.global_device_names();
  auto device = [&](int64_t id) { return "mesh device id " + std::to_string(id) + " (" + global[size_t(id)].to_string() + ")"; };
  std::vector<std::vector<int>> claimers(size_t(mesh.size()));
  for (size_t c = 0; c < clients.size(); ++c)
    for (int64_t id = 0; id < mesh.size(); ++id)
      if (uint64_t(claims[c * words + size_t(id / 64)]) >> (id % 64) & 1) claimers[size_t(id)].push_back(clients[c]);
  auto names = [](const std::vector<int>& cs) { return join(cs, ", ", [](int c) { return std::to_string(c); }); };
  for (int64_t id = 0; id < mesh.size(); ++id)
    if (claimers[size_t(id)].size() > 1)
      throw MeshError(device(id) + " is local to clients " + names(claimers[size_t(id)]) +
                      ": their local_device_ids overlap, and each device is local to one client");
  for (int64_t id = 0; id < mesh.size(); ++id)
    if (claimers[size_t(id)].empty())
      throw MeshError(device(id) + " is local to no client: client " + std::to_string(global[size_t(id)].task) +
                      " (its task) does not list it in its local_device_ids, and together they must cover every id");
  for (int64_t id = 0; id < mesh.size(); ++id)
    if (claimers[size_t(id)].front() != int(global[size_t(id)].task))
      throw MeshError("client " + std::to_string(claimers[size_t(id)].front()) + " lists " + device(id) +
                      " as local, but its global device name places it on task " + std::to_string(global[size_t(id)].task));
}

// The meshes (made objects: Mesh::instance) whose clients agreed on them. Not by text: a client
// whose mesh reads like one agreed earlier would skip a check its peers, holding other meshes,
// wait in. Every client makes and uses the same meshes in the same order, so they check alike.
class AgreedMeshes {
 public:
  bool contains(const Mesh& mesh) const { return meshes_.count(mesh.instance()) > 0; }
  void add(const Mesh& mesh) {
    if (meshes_.size() >= 2 * live_after_last_sweep_ + 64) forget_dropped();
    meshes_.insert(mesh.instance());
  }

 private:
  void forget_dropped() {
    std::erase_if(meshes_, [](const std::weak_ptr<const void>& m) { return m.expired(); });
    live_after_last_sweep_ = meshes_.size();
  }
  std::set<std::weak_ptr<const void>, std::owner_less<>> meshes_;
  size_t live_after_last_sweep_ = 0;
};

}  // namespace

void check_clients_agree_on_mesh(const Mesh& mesh) {
  if (!multi_client() || mesh.global_device_names().empty()) return;
  // Checked once per mesh: later calls, at every op on it, only look it up.
  static std::mutex mutex;
  static auto* agreed = new AgreedMeshes();
  std::lock_guard lock(mutex);
  if (agreed->contains(mesh)) return;
  const auto& global = mesh.global_device_names();
  std::set<int> owners;
  for (size_t id = 0; id < global.size(); ++id) {
    if (global[id].task >= num_clients())
      throw MeshError("mesh device id " + std::to_string(id) + " (" + global[id].to_string() + ") is on task " +
                      std::to_string(global[id].task) + ", but the job has " + std::to_string(num_clients()) + " clients (tasks 0.." +
                      std::to_string(num_clients() - 1) + "): no client owns it");
    owners.insert(int(global[id].task));
  }
  const std::vector<int> clients(owners.begin(), owners.end());
  const auto me = std::find(clients.begin(), clients.end(), client_id());
  if (me == clients.end()) {
    // Not one of the mesh's clients, so in none of its collectives: a device claimed here would
    // be computed on by no one else.
    if (mesh.num_local_devices() > 0)
      throw MeshError("this client (" + std::to_string(client_id()) + ") lists " + mesh.local_devices().front() +
                      " as local, but the mesh's global devices place none on its task");
    agreed->add(mesh);
    return;
  }
  std::shared_ptr<ClientGroup> group = cached_client_group(clients);
  group->barrier();  // honours TESSERA_COMM_TIMEOUT: a client that never makes the mesh is reported
  const std::string text = listing_of(mesh).text();
  const std::vector<int64_t> hashes = group->all_gather({int64_t(hash_text(0, text))});
  if (std::any_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h != hashes.front(); }))
    throw_listings_differ(clients, gather_texts(*group, text), size_t(me - clients.begin()));
  check_claims(mesh, clients, group->all_gather(claimed_bits(mesh)));
  agreed->add(mesh);
}

}  // namespace tessera
