#include "jit/backend_registry.hpp"

#include <map>
#include <mutex>

#include "dsl/error.hpp"
#include "dsl/mesh.hpp"

namespace tessera {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<DeviceKind, Backend> backends;
  // Each backend's Target but for the mode (its arch and library ops), made once: the driver
  // asks for it on every force.
  std::map<DeviceKind, Target> described;
};

Registry& registry_without_builtins() {
  static Registry* instance = new Registry;  // lives until exit: devices made from it do too
  return *instance;
}

Registry& registry() {
  static std::once_flag once;
  std::call_once(once, register_builtin_backends);
  return registry_without_builtins();
}

}  // namespace

void register_backend(Backend backend) {
  Registry& r = registry_without_builtins();
  std::lock_guard lock(r.mutex);
  r.described.erase(backend.kind);  // described again from the new backend
  r.backends.insert_or_assign(backend.kind, std::move(backend));
}

bool has_backend(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.backends.count(kind) != 0;
}

const Backend& backend_for(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.backends.find(kind);
  if (it == r.backends.end())
    throw DeviceError("this build of Tessera has no " + std::string(device_kind_name(kind)) +
                      " backend (configured with -Dcuda=disabled?)");
  return it->second;  // std::map nodes stay put; backends are replaced only by tests, between runs
}

Target target_for(DeviceKind kind, bool deterministic) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  auto it = r.described.find(kind);
  if (it == r.described.end()) {
    lock.unlock();  // a GPU's arch asks its driver: not under the table's lock
    const Backend& backend = backend_for(kind);
    Target described;
    described.device = kind;
    for (const auto& [op, kernel] : backend.library) described.library.insert(op);
    described.arch = backend.arch ? backend.arch() : std::string();
    lock.lock();
    it = r.described.emplace(kind, std::move(described)).first;
  }
  Target target = it->second;
  target.deterministic = deterministic;
  return target;
}

kir::LoopTarget lowering_target_for(DeviceKind kind) {
  if (has_backend(kind)) return backend_for(kind).lowering_target;
  return kind == DeviceKind::GPU ? kir::LoopTarget::Cuda : kir::LoopTarget::Cpu;
}

Target abstract_target(DeviceKind kind, std::string arch, bool deterministic) {
  Target target{kind, deterministic, std::move(arch), {}};
  if (has_backend(kind))
    for (const auto& [op, kernel] : backend_for(kind).library) target.library.insert(op);
  return target;
}

const LibraryKernel& library_kernel(DeviceKind kind, LibraryOp op) {
  const Backend& backend = backend_for(kind);
  auto it = backend.library.find(op);
  if (it == backend.library.end())
    throw DeviceError("the " + std::string(device_kind_name(kind)) + " backend has no " + std::string(library_op_name(op)) +
                      " kernel");
  return it->second;
}

std::unique_ptr<Device> make_device(const std::string& name, const DevicePlacement& placement, const Target& target) {
  const DeviceName parsed = DeviceName::parse(name);
  return backend_for(parsed.kind()).make_device(parsed, placement, target);
}

// dsl/mesh.hpp's device lists: any number of CPU devices, the GPU backend's devices.
std::vector<std::string> gpu_devices(int n) {
  if (n < 0) throw DeviceError("gpu_devices(" + std::to_string(n) + "): the count cannot be negative");
  if (n == 0 && !has_backend(DeviceKind::GPU)) return {};
  const int64_t count = backend_for(DeviceKind::GPU).device_count(n);
  std::vector<std::string> out;
  for (int64_t i = 0; i < (n > 0 ? n : count); ++i) out.push_back(std::string(device_kind_name(DeviceKind::GPU)) + ":" + std::to_string(i));
  return out;
}

}  // namespace tessera
