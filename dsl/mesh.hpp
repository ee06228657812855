// Mesh: a named Cartesian grid of devices (TF's dtensor.Mesh / PyTorch's DeviceMesh).
// A cheap handle: copies refer to the same immutable description.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsl/device_kind.hpp"
#include "dsl/device_name.hpp"

namespace tessera {

struct Hardware;
struct AbstractDevices;  // dsl/mesh.cpp

class Mesh {
 public:
  Mesh() = default;  // an empty handle; only assignable
  // Validates everything (MeshError): dims, device count, ids and device names.
  Mesh(std::vector<std::pair<std::string, int64_t>> dims, std::vector<int64_t> global_device_ids,
       std::vector<int64_t> local_device_ids, std::vector<DeviceName> local_devices,
       std::string name = "", std::vector<DeviceName> global_devices = {});
  // TF's Mesh(devices, dims), as its Layout docs write it: Mesh({"CPU:0", ..., "CPU:5"}, {{"x", 6}}).
  // The same mesh as create_mesh(dims, devices): ids 0..n-1 in the list's order, all local.
  // (Two arguments, the other constructor at least four: brace-initialised calls stay unambiguous.)
  Mesh(std::vector<std::string> devices, std::vector<std::pair<std::string, int64_t>> dims);

  // TF form: "[name]|x=3,y=2|0,...,5|0,...,5|CPU:0,...,CPU:5[|global devices]"
  static Mesh from_string(std::string_view text);
  std::string to_string() const;

  const std::vector<std::string>& dim_names() const;
  std::string dims_string() const;  // "dp=64,tp=8": the dims field of to_string()
  const std::vector<int64_t>& shape() const;
  int64_t dim_size(std::string_view name) const;  // MeshError for an unknown dim
  int64_t dim_index(std::string_view name) const; // position of a dim; MeshError if unknown
  int64_t size() const;
  int64_t ndim() const;
  bool contains_dim(std::string_view name) const;
  std::vector<int64_t> strides() const;
  std::vector<int64_t> coords(int64_t device_id) const;
  std::map<std::string, int64_t> device_location(int64_t device_id) const;
  // TF's unravel_index: device id -> {dim name: index} for every device.
  std::map<int64_t, std::map<std::string, int64_t>> unravel_index() const;
  std::vector<std::map<std::string, int64_t>> local_device_locations() const;
  int64_t min_global_device_id() const;
  bool is_remote() const;   // no device of the mesh is local to this client
  Mesh host_mesh() const;   // the 1-1 mapped CPU mesh (the mesh itself for a CPU mesh)
  std::vector<int64_t> global_device_ids() const;
  // The global ids, comma-separated, and a hash of them: made once per mesh, so keys and hashes
  // of layouts on meshes of thousands of devices do not walk the ids each time.
  const std::string& global_device_ids_text() const;
  uint64_t global_device_ids_hash() const;
  std::vector<int64_t> local_device_ids() const;
  std::vector<std::string> local_devices() const;
  const std::vector<DeviceName>& local_device_names() const;
  const std::vector<DeviceName>& global_device_names() const;  // empty unless the mesh lists them
  int64_t num_local_devices() const;
  std::string device_type() const;  // "CPU" / "GPU": device_kind_name(device_kind())
  DeviceKind device_kind() const;
  const std::string& name() const;
  bool is_valid() const { return impl_ != nullptr; }
  // PyTorch's mesh["dp"] / mesh[{"dp", "tp"}]: the sub-mesh of those dims (in the mesh's order)
  // through this client's first local device (device 0 for a mesh with no local device): the
  // devices that share its coordinates on every other dim. Usable anywhere a Mesh is.
  Mesh operator[](std::string_view dim) const;
  Mesh operator[](const std::vector<std::string>& dims) const;
  Mesh operator[](std::initializer_list<std::string> dims) const { return (*this)[std::vector<std::string>(dims)]; }

  // An abstract mesh (abstract_mesh): devices that do not exist in this process, described by a
  // hardware profile. Programs on it compile and are planned as on a real mesh; running one is
  // a MeshError. Its device ids are laid out row-major, devices_per_node consecutive ids a node.
  bool is_abstract() const;
  const Hardware& hardware() const;   // MeshError for a real mesh
  int64_t devices_per_node() const;   // MeshError for a real mesh
  // Whether every group of devices along mesh dim `dim` lies inside one node, so its
  // collectives use the intra-node link. A real mesh is one machine's devices: always true.
  bool dim_within_node(int64_t dim) const;

  // The same devices in the same grid; the name and how device names are spelled do not count.
  bool operator==(const Mesh& other) const;
  bool operator!=(const Mesh& other) const { return !(*this == other); }
  // The mesh as one made object: its copies share it; a mesh made again, even an equal one, has
  // its own. For state kept per made mesh (jit/mesh_agreement.hpp), and for caches that must not
  // hand back another mesh in place of this one (it may be spelled otherwise, or not yet agreed).
  std::weak_ptr<const void> instance() const;
  bool same_instance(const Mesh& other) const { return impl_ == other.impl_; }

 private:
  friend Mesh abstract_mesh(std::vector<std::pair<std::string, int64_t>>, Hardware, int64_t);
  struct Impl;
  const Impl& impl() const;
  std::shared_ptr<const Impl> with_abstract(std::shared_ptr<const AbstractDevices> abstract) const;
  std::string render() const;
  std::shared_ptr<const Impl> impl_;
};

// The most devices a mesh may have: device counts are ints (cpu_devices(n)); a mesh lists its
// device ids one by one, so real meshes are far below this.
constexpr int64_t kMaxMeshDevices = (int64_t(1) << 31) - 1;
// The number of devices of a mesh with these dims (their product); MeshError naming the dims
// for a size below 1 or a product over kMaxMeshDevices.
int64_t mesh_device_count(const std::vector<std::pair<std::string, int64_t>>& dims);

std::vector<std::string> cpu_devices(int n);  // {"CPU:0", ..., "CPU:n-1"}
// The process's GPU devices, {"GPU:0", ...}: one per physical GPU, or with n > 0 the first n of
// at least n virtual ones placed round-robin on the physical GPUs (TensorFlow's logical
// devices), so 2- and 2x2-device meshes run on one GPU. DeviceError for n > 0 without a GPU.
std::vector<std::string> gpu_devices(int n = 0);

// The device type of meshes made without a device list: $TESSERA_DEVICE_TYPE ("CPU" or "GPU";
// CPU when unset), so a program, or the whole test suite, runs on GPUs unchanged.
std::string default_device_type();
DeviceKind default_device_kind();
// cpu_devices(n) or gpu_devices(n), by default_device_type().
std::vector<std::string> default_devices(int n);

// The most devices an abstract mesh may have: 2^20, more than any job is planned for. A mesh
// lists its device ids one by one (several copies of some tens of bytes each per device), so
// 2^30 devices asked for tens of GiB and ended in std::bad_alloc.
constexpr int64_t kMaxAbstractMeshDevices = int64_t(1) << 20;

// A mesh of `dims` whose devices are `hardware`, devices_per_node to a node (the last node may
// be partly filled), none of them in this process: for planning jobs larger than this machine
// (jit functions' plan()). MeshError for bad dims, more than kMaxAbstractMeshDevices devices or
// devices_per_node < 1; Error naming the field for a hardware figure check_hardware refuses.
Mesh abstract_mesh(std::vector<std::pair<std::string, int64_t>> dims, Hardware hardware, int64_t devices_per_node);

// Single-client mesh; devices default to default_devices(product of the dims). Defined in the
// runtime (jit/create_mesh.cpp): it checks GPU names against this process's GPUs and has the
// clients of a multi-client device list agree on it.
Mesh create_mesh(std::vector<std::pair<std::string, int64_t>> dims,
                 std::vector<std::string> devices = {});

namespace detail {
// MeshError unless the devices are of one type, across local and global (TF's mesh has one
// device_type); create_mesh checks it before asking whether its GPUs exist.
void check_one_device_type(const std::vector<DeviceName>& local, const std::vector<DeviceName>& global);
}  // namespace detail

}  // namespace tessera
