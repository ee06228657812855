#include "dsl/mesh.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>

#include "dsl/error.hpp"
#include "dsl/hardware.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

// What an abstract mesh's devices are.
struct AbstractDevices {
  std::shared_ptr<const Hardware> hardware;
  int64_t devices_per_node = 1;
  std::vector<int64_t> id_strides;  // per dim: its stride in the abstract_mesh whose ids these are
};

struct Mesh::Impl {
  std::string text;  // to_string(), computed once
  std::string ids_text;  // global ids, comma-separated, computed once
  uint64_t ids_hash = 0;
  std::string name;
  std::vector<std::string> dim_names;
  std::vector<int64_t> dim_sizes;
  std::vector<int64_t> global_ids;
  std::vector<int64_t> local_ids;
  std::vector<DeviceName> local_devices;
  std::vector<DeviceName> global_devices;
  std::shared_ptr<const AbstractDevices> abstract;  // set on abstract meshes only
};

namespace {

std::string join_ints(const std::vector<int64_t>& values) {
  return join(values, ",", [](int64_t v) { return std::to_string(v); });
}

// splitmix64's finaliser over the running hash and the next id.
uint64_t mix_id(uint64_t h, uint64_t id) {
  uint64_t z = h ^ (id + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string describe_dims(const std::vector<std::pair<std::string, int64_t>>& dims) {
  return "[" + join(dims, ", ", [](const auto& d) { return "('" + d.first + "', " + std::to_string(d.second) + ")"; }) + "]";
}

// TF: "Values in this array should increment sequentially from 0". A mesh places its devices by
// the order of local_device_ids / global_devices, not by permuting the ids.
void check_sequential_ids(const std::vector<int64_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != int64_t(i))
      throw MeshError("mesh global device ids must increment sequentially from 0: position " + std::to_string(i) + " holds " +
                      std::to_string(ids[i]) + ", expected " + std::to_string(i) + " (ids " + join_ints(ids) + ")");
}

}  // namespace

void detail::check_one_device_type(const std::vector<DeviceName>& local, const std::vector<DeviceName>& global) {
  const DeviceName* first = nullptr;
  for (const auto* devices : {&local, &global})
    for (const DeviceName& device : *devices) {
      if (!first) first = &device;
      if (device.type != first->type)
        throw MeshError("mesh mixes device types: " + first->to_string() + " is a " + first->type + " device, " + device.to_string() +
                        " a " + device.type + " device; a mesh has one device type");
    }
}

namespace {

// Every global device once, and each local device the global device of its id.
void check_global_devices(const std::vector<DeviceName>& global, const std::vector<int64_t>& local_ids,
                          const std::vector<DeviceName>& local) {
  std::map<std::string, size_t> first_id;
  for (size_t id = 0; id < global.size(); ++id) {
    auto [at, fresh] = first_id.emplace(global[id].full_string(), id);
    if (!fresh)
      throw MeshError("global device " + global[id].to_string() + " appears twice (ids " + std::to_string(at->second) + " and " +
                      std::to_string(id) + "); every device of a mesh is one position in it");
  }
  if (global.empty()) return;
  for (size_t i = 0; i < local_ids.size(); ++i)
    if (!(local[i] == global[size_t(local_ids[i])]))
      throw MeshError("local device id " + std::to_string(local_ids[i]) + " is " + local[i].to_string() + " but the global devices list " +
                      global[size_t(local_ids[i])].to_string() + " as id " + std::to_string(local_ids[i]));
}

}  // namespace

Mesh::Mesh(std::vector<std::pair<std::string, int64_t>> dims, std::vector<int64_t> global_ids,
           std::vector<int64_t> local_ids, std::vector<DeviceName> local_devices, std::string name,
           std::vector<DeviceName> global_devices) {
  auto impl = std::make_shared<Impl>();
  if (dims.empty()) throw MeshError("a mesh needs at least one dimension");
  std::set<std::string> seen;
  for (const auto& [dim, size] : dims) {
    if (dim.empty()) throw MeshError("mesh " + describe_dims(dims) + " has an empty dimension name");
    if (dim == "unsharded")
      throw MeshError("mesh dimension name 'unsharded' is reserved (it means an unsharded axis)");
    if (dim.find_first_of("|,=:+ ") != std::string::npos)
      throw MeshError("mesh dimension name '" + dim + "' contains one of the reserved characters |,=:+ or space");
    if (!seen.insert(dim).second)
      throw MeshError("mesh " + describe_dims(dims) + " names dimension '" + dim + "' twice");
    impl->dim_names.push_back(dim);
    impl->dim_sizes.push_back(size);
  }
  const int64_t product = mesh_device_count(dims);
  if (int64_t(global_ids.size()) != product)
    throw MeshError("mesh " + describe_dims(dims) + " needs " + std::to_string(product) +
                    " devices (the product of its dims) but got " + std::to_string(global_ids.size()));
  check_sequential_ids(global_ids);
  if (local_ids.size() != local_devices.size())
    throw MeshError("mesh has " + std::to_string(local_ids.size()) + " local device ids but " +
                    std::to_string(local_devices.size()) + " local devices");
  std::set<int64_t> local_seen;
  for (int64_t id : local_ids) {
    if (id < 0 || id >= product)
      throw MeshError("local device id " + std::to_string(id) + " is not a global device id of the mesh");
    if (!local_seen.insert(id).second)
      throw MeshError("local device id " + std::to_string(id) + " appears twice");
  }
  detail::check_one_device_type(local_devices, global_devices);
  std::set<std::string> device_seen;
  for (const auto& device : local_devices)
    if (!device_seen.insert(device.full_string()).second)
      throw MeshError("device " + device.to_string() + " appears twice in the mesh");
  if (!global_devices.empty() && int64_t(global_devices.size()) != product)
    throw MeshError("mesh lists " + std::to_string(global_devices.size()) + " global devices for " +
                    std::to_string(product) + " device ids");
  check_global_devices(global_devices, local_ids, local_devices);
  impl->name = std::move(name);
  impl->global_ids = std::move(global_ids);
  impl->local_ids = std::move(local_ids);
  impl->local_devices = std::move(local_devices);
  impl->global_devices = std::move(global_devices);
  impl->ids_text = join_ints(impl->global_ids);
  for (int64_t id : impl->global_ids) impl->ids_hash = mix_id(impl->ids_hash, uint64_t(id));
  impl_ = std::move(impl);
  const_cast<Impl&>(*impl_).text = render();
}

Mesh::Mesh(std::vector<std::string> devices, std::vector<std::pair<std::string, int64_t>> dims)
    : Mesh(create_mesh(std::move(dims), std::move(devices))) {}

const Mesh::Impl& Mesh::impl() const {
  if (!impl_) throw MeshError("use of an empty Mesh handle (default-constructed)");
  return *impl_;
}

Mesh Mesh::from_string(std::string_view text) {
  auto bad = [&](const std::string& why) -> MeshError {
    return MeshError("malformed mesh string '" + std::string(text) + "': " + why +
                     " (expected '|x=3,y=2|0,...,5|0,...,5|CPU:0,...,CPU:5')");
  };
  std::vector<std::string> fields = split(text, '|');
  if (fields.size() != 5 && fields.size() != 6) throw bad("expected 5 or 6 '|'-separated fields, got " + std::to_string(fields.size()));
  std::vector<std::pair<std::string, int64_t>> dims;
  for (const auto& item : split(fields[1], ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) throw bad("dimension '" + item + "' is not name=size");
    int64_t size;
    if (!parse_int64(std::string_view(item).substr(eq + 1), size)) throw bad("dimension '" + item + "' has a bad size");
    dims.emplace_back(item.substr(0, eq), size);
  }
  auto parse_ids = [&](const std::string& field, const char* what) {
    std::vector<int64_t> ids;
    if (field.empty()) return ids;
    for (const auto& item : split(field, ',')) {
      int64_t id;
      if (!parse_int64(item, id)) throw bad(std::string("bad ") + what + " '" + item + "'");
      ids.push_back(id);
    }
    return ids;
  };
  std::vector<int64_t> global_ids = parse_ids(fields[2], "global device id");
  std::vector<int64_t> local_ids = parse_ids(fields[3], "local device id");
  std::vector<DeviceName> local_devices, global_devices;
  if (!fields[4].empty())
    for (const auto& item : split(fields[4], ',')) local_devices.push_back(DeviceName::parse(item));
  if (fields.size() == 6 && !fields[5].empty())
    for (const auto& item : split(fields[5], ',')) global_devices.push_back(DeviceName::parse(item));
  return Mesh(std::move(dims), std::move(global_ids), std::move(local_ids), std::move(local_devices),
              fields[0], std::move(global_devices));
}

std::string Mesh::to_string() const { return impl().text; }

std::string Mesh::render() const {
  const Impl& m = impl();
  std::string out = m.name + "|";
  out += dims_string();
  out += "|" + m.ids_text + "|" + join_ints(m.local_ids) + "|";
  out += join(m.local_devices, ",", [](const DeviceName& d) { return d.to_string(); });
  if (!m.global_devices.empty())
    out += "|" + join(m.global_devices, ",", [](const DeviceName& d) { return d.to_string(); });
  return out;
}

const std::vector<std::string>& Mesh::dim_names() const { return impl().dim_names; }

std::string Mesh::dims_string() const {
  const Impl& m = impl();
  std::string out;
  for (size_t i = 0; i < m.dim_names.size(); ++i) out += (i ? "," : "") + m.dim_names[i] + "=" + std::to_string(m.dim_sizes[i]);
  return out;
}
const std::vector<int64_t>& Mesh::shape() const { return impl().dim_sizes; }

int64_t Mesh::dim_index(std::string_view name) const {
  const auto& names = impl().dim_names;
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end())
    throw MeshError("mesh has no dimension '" + std::string(name) + "' (its dims are " +
                    join(names, ", ", [](const std::string& s) { return "'" + s + "'"; }) + ")");
  return it - names.begin();
}

int64_t Mesh::dim_size(std::string_view name) const { return impl().dim_sizes[dim_index(name)]; }

int64_t Mesh::size() const {
  int64_t product = 1;
  for (int64_t s : impl().dim_sizes) product *= s;
  return product;
}

int64_t Mesh::ndim() const { return int64_t(impl().dim_sizes.size()); }

bool Mesh::contains_dim(std::string_view name) const {
  const auto& names = impl().dim_names;
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::vector<int64_t> Mesh::strides() const {
  const auto& sizes = impl().dim_sizes;
  std::vector<int64_t> out(sizes.size(), 1);
  for (int64_t i = int64_t(sizes.size()) - 2; i >= 0; --i) out[i] = out[i + 1] * sizes[i + 1];
  return out;
}

std::vector<int64_t> Mesh::coords(int64_t device_id) const {
  if (device_id < 0 || device_id >= size())
    throw MeshError("device id " + std::to_string(device_id) + " is outside the mesh of " +
                    std::to_string(size()) + " devices");
  std::vector<int64_t> out, st = strides();
  for (size_t i = 0; i < st.size(); ++i) out.push_back((device_id / st[i]) % impl().dim_sizes[i]);
  return out;
}

std::map<std::string, int64_t> Mesh::device_location(int64_t device_id) const {
  std::map<std::string, int64_t> out;
  std::vector<int64_t> c = coords(device_id);
  for (size_t i = 0; i < c.size(); ++i) out[impl().dim_names[i]] = c[i];
  return out;
}

std::map<int64_t, std::map<std::string, int64_t>> Mesh::unravel_index() const {
  std::map<int64_t, std::map<std::string, int64_t>> out;
  for (int64_t id = 0; id < size(); ++id) out[id] = device_location(id);
  return out;
}

std::vector<std::map<std::string, int64_t>> Mesh::local_device_locations() const {
  std::vector<std::map<std::string, int64_t>> out;
  for (int64_t id : impl().local_ids) out.push_back(device_location(id));
  return out;
}

int64_t Mesh::min_global_device_id() const {
  return *std::min_element(impl().global_ids.begin(), impl().global_ids.end());
}

bool Mesh::is_remote() const { return impl().local_ids.empty(); }

Mesh Mesh::host_mesh() const {
  if (device_kind() == DeviceKind::CPU) return *this;
  const Impl& m = impl();
  auto to_cpu = [](std::vector<DeviceName> devices) {
    for (auto& d : devices) d.type = std::string(device_kind_name(DeviceKind::CPU));
    return devices;
  };
  std::vector<std::pair<std::string, int64_t>> dims;
  for (size_t i = 0; i < m.dim_names.size(); ++i) dims.emplace_back(m.dim_names[i], m.dim_sizes[i]);
  return Mesh(dims, m.global_ids, m.local_ids, to_cpu(m.local_devices), m.name.empty() ? "" : m.name + "_host",
              to_cpu(m.global_devices));
}

Mesh Mesh::operator[](std::string_view dim) const { return (*this)[std::vector<std::string>{std::string(dim)}]; }

Mesh Mesh::operator[](const std::vector<std::string>& dims) const {
  const Impl& m = impl();
  if (dims.empty()) throw MeshError("mesh[...]: name at least one mesh dimension");
  std::vector<int64_t> picked;
  for (const std::string& d : dims) {
    const int64_t index = dim_index(d);
    if (!picked.empty() && index <= picked.back())
      throw MeshError("mesh[...]: dims must be distinct and in the mesh's order (" +
                      join(m.dim_names, ", ") + "), got " +
                      join(dims, ", "));
    picked.push_back(index);
  }
  const std::vector<int64_t> anchor = coords(m.local_ids.empty() ? 0 : m.local_ids.front()), st = strides();
  std::vector<std::pair<std::string, int64_t>> sub_dims;
  int64_t count = 1;
  for (int64_t d : picked) {
    sub_dims.emplace_back(m.dim_names[d], m.dim_sizes[d]);
    count *= m.dim_sizes[d];
  }
  std::vector<int64_t> sub_ids, local_ids;
  std::vector<DeviceName> local_devices, global_devices;
  for (int64_t sub = 0; sub < count; ++sub) {
    // The parent device at the anchor's coordinates with the picked dims set from `sub`.
    std::vector<int64_t> c = anchor;
    for (int64_t k = int64_t(picked.size()) - 1, rest = sub; k >= 0; --k) {
      c[picked[k]] = rest % m.dim_sizes[picked[k]];
      rest /= m.dim_sizes[picked[k]];
    }
    int64_t parent = 0;
    for (size_t i = 0; i < c.size(); ++i) parent += c[i] * st[i];
    sub_ids.push_back(sub);
    if (!m.global_devices.empty()) global_devices.push_back(m.global_devices[parent]);
    auto local = std::find(m.local_ids.begin(), m.local_ids.end(), parent);
    if (local != m.local_ids.end()) {
      local_ids.push_back(sub);
      local_devices.push_back(m.local_devices[local - m.local_ids.begin()]);
    }
  }
  Mesh sub(std::move(sub_dims), sub_ids, std::move(local_ids), std::move(local_devices), "", std::move(global_devices));
  if (m.abstract) {
    auto abstract = std::make_shared<AbstractDevices>(*m.abstract);
    abstract->id_strides.clear();
    for (int64_t d : picked) abstract->id_strides.push_back(m.abstract->id_strides[size_t(d)]);
    sub.impl_ = sub.with_abstract(std::move(abstract));
  }
  return sub;
}

std::vector<int64_t> Mesh::global_device_ids() const { return impl().global_ids; }
const std::string& Mesh::global_device_ids_text() const { return impl().ids_text; }
uint64_t Mesh::global_device_ids_hash() const { return impl().ids_hash; }
std::vector<int64_t> Mesh::local_device_ids() const { return impl().local_ids; }

std::vector<std::string> Mesh::local_devices() const {
  std::vector<std::string> out;
  for (const auto& d : impl().local_devices) out.push_back(d.to_string());
  return out;
}

const std::vector<DeviceName>& Mesh::local_device_names() const { return impl().local_devices; }
const std::vector<DeviceName>& Mesh::global_device_names() const { return impl().global_devices; }
int64_t Mesh::num_local_devices() const { return int64_t(impl().local_ids.size()); }

std::string Mesh::device_type() const { return std::string(device_kind_name(device_kind())); }

DeviceKind Mesh::device_kind() const {
  const Impl& m = impl();
  if (m.abstract) return m.abstract->hardware->device;
  const std::vector<DeviceName>& devices = m.local_devices.empty() ? m.global_devices : m.local_devices;
  return devices.empty() ? DeviceKind::CPU : devices.front().kind();
}


const std::string& Mesh::name() const { return impl().name; }

bool Mesh::operator==(const Mesh& other) const {
  if (impl_ == other.impl_) return true;
  if (!impl_ || !other.impl_) return false;
  const Impl &a = *impl_, &b = *other.impl_;
  return a.dim_names == b.dim_names && a.dim_sizes == b.dim_sizes && a.global_ids == b.global_ids &&
         a.local_ids == b.local_ids && a.local_devices == b.local_devices && a.global_devices == b.global_devices &&
         (a.abstract == b.abstract ||
          (a.abstract && b.abstract && *a.abstract->hardware == *b.abstract->hardware &&
           a.abstract->devices_per_node == b.abstract->devices_per_node && a.abstract->id_strides == b.abstract->id_strides));
}

std::weak_ptr<const void> Mesh::instance() const { return impl_; }

bool Mesh::is_abstract() const { return impl().abstract != nullptr; }

const Hardware& Mesh::hardware() const {
  if (!impl().abstract) throw MeshError("mesh " + to_string() + " is a mesh of real devices: only an abstract_mesh has a hardware profile");
  return *impl().abstract->hardware;
}

int64_t Mesh::devices_per_node() const {
  if (!impl().abstract) throw MeshError("mesh " + to_string() + " is a mesh of real devices: only an abstract_mesh has devices_per_node");
  return impl().abstract->devices_per_node;
}

bool Mesh::dim_within_node(int64_t dim) const {
  const Impl& m = impl();
  if (dim < 0 || dim >= ndim()) throw MeshError("mesh dim " + std::to_string(dim) + " is outside the mesh's " + std::to_string(ndim()) + " dims");
  if (!m.abstract) return true;
  // A group along `dim` covers id_strides[dim] * size consecutive ids starting at a multiple of
  // that span: inside one node exactly when the span divides the node's device count.
  const int64_t span = m.abstract->id_strides[size_t(dim)] * m.dim_sizes[size_t(dim)];
  return span <= m.abstract->devices_per_node && m.abstract->devices_per_node % span == 0;
}

std::shared_ptr<const Mesh::Impl> Mesh::with_abstract(std::shared_ptr<const AbstractDevices> abstract) const {
  auto copy = std::make_shared<Impl>(impl());
  copy->abstract = std::move(abstract);
  return copy;
}

Mesh abstract_mesh(std::vector<std::pair<std::string, int64_t>> dims, Hardware hardware, int64_t devices_per_node) {
  if (devices_per_node < 1)
    throw MeshError("abstract_mesh: devices_per_node is " + std::to_string(devices_per_node) + "; a node has at least one device");
  const int64_t count = mesh_device_count(dims);
  if (count > kMaxAbstractMeshDevices)
    throw MeshError("abstract_mesh " + describe_dims(dims) + ": " + std::to_string(count) + " devices is more than the limit of 2^20 = " +
                    std::to_string(kMaxAbstractMeshDevices) + " devices of an abstract mesh");
  check_hardware(hardware, "abstract_mesh: hardware '" + hardware.name + "'");
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ids[size_t(i)] = i;
  Mesh mesh(std::move(dims), std::move(ids), std::vector<int64_t>{}, std::vector<DeviceName>{}, "abstract");
  auto abstract = std::make_shared<AbstractDevices>();
  abstract->hardware = std::make_shared<const Hardware>(std::move(hardware));
  abstract->devices_per_node = devices_per_node;
  abstract->id_strides = mesh.strides();
  mesh.impl_ = mesh.with_abstract(std::move(abstract));
  return mesh;
}

int64_t mesh_device_count(const std::vector<std::pair<std::string, int64_t>>& dims) {
  int64_t product = 1;
  for (const auto& [dim, size] : dims) {
    if (size < 1)
      throw MeshError("mesh dimension '" + dim + "' has size " + std::to_string(size) + "; sizes must be >= 1");
    // Checked before multiplying: a product wrapped past int64 (or past int, the type of device
    // counts) would name a device count the user never asked for.
    if (size > kMaxMeshDevices / product)
      throw MeshError("mesh " + describe_dims(dims) + ": the product of its dims exceeds the limit of 2^31 - 1 devices");
    product *= size;
  }
  return product;
}

std::vector<std::string> cpu_devices(int n) {
  if (n < 1) throw MeshError("cpu_devices(" + std::to_string(n) + "): need at least one device");
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(std::string(device_kind_name(DeviceKind::CPU)) + ":" + std::to_string(i));
  return out;
}

DeviceKind default_device_kind() {
  const char* v = std::getenv("TESSERA_DEVICE_TYPE");
  if (!v || !*v) return DeviceKind::CPU;
  if (auto kind = device_kind_from_name(v)) return *kind;
  throw MeshError("TESSERA_DEVICE_TYPE='" + std::string(v) + "': the device type of default meshes is CPU or GPU");
}

std::string default_device_type() { return std::string(device_kind_name(default_device_kind())); }

std::vector<std::string> default_devices(int n) {
  return default_device_kind() == DeviceKind::GPU ? gpu_devices(n) : cpu_devices(n);
}

}  // namespace tessera
