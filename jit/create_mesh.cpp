// create_mesh (dsl/mesh.hpp) is the runtime's: a GPU name is checked against the GPUs this
// process has, and the clients of a multi-client device list agree on the mesh as it is made.
#include <cstdlib>
#include <string>
#include <vector>

#include "dsl/error.hpp"
#include "dsl/mesh.hpp"
#include "jit/mesh_agreement.hpp"

namespace tessera {

Mesh create_mesh(std::vector<std::pair<std::string, int64_t>> dims, std::vector<std::string> devices) {
  const int64_t product = mesh_device_count(dims);
  if (devices.empty() && product <= 4096) devices = default_devices(int(product));
  std::vector<DeviceName> names;
  for (const auto& d : devices) names.push_back(DeviceName::parse(d));
  detail::check_one_device_type(names, {});  // a mix is the fault, whether or not its GPUs exist
  for (const DeviceName& name : names)
    if (name.kind() == DeviceKind::GPU && name.index >= int64_t(gpu_devices().size()))
      throw MeshError("unknown device '" + name.to_string() + "': this process has " +
                      std::to_string(gpu_devices().size()) + " GPU(s)");
  std::vector<int64_t> ids(names.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i);
  // A global device list naming tasks (multi-client): this client's devices are the local subset,
  // as TensorFlow requires; the task index comes from the launcher (mpirun).
  bool multi_task = false;
  for (const auto& n : names) multi_task |= n.task != 0 || n.job != "localhost";
  if (!multi_task) return Mesh(std::move(dims), ids, ids, std::move(names));
  int64_t task = 0;
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(var); v && *v) task = std::atoll(v);
  std::vector<int64_t> local_ids;
  std::vector<DeviceName> local;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].task == task) {
      local_ids.push_back(int64_t(i));
      local.push_back(names[i]);
    }
  Mesh mesh(std::move(dims), ids, local_ids, local, "", names);
  // Made by every client from its own list: they agree on it now, or all raise here.
  check_clients_agree_on_mesh(mesh);
  return mesh;
}

}  // namespace tessera
