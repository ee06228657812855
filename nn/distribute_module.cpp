#include "nn/distribute_module.hpp"

#include <map>
#include <utility>

#include "dsl/error.hpp"
#include "jit/api/tensor_api.hpp"

namespace tessera {

// The one piece of Module state distribute_module keeps: whether it ran on the module.
class ModuleDistribution {
 public:
  static bool& distributed(Module& module) { return module.distributed_; }
};

namespace {

// A Tessera tensor always has a mesh; one of a single device plays PyTorch's plain tensor.
bool undistributed(const Variable& parameter, const Mesh& mesh) {
  const Mesh on = parameter.layout().mesh();
  return on.size() == 1 && on != mesh;
}

// Old parameter state -> its replica on the mesh. The old Variable is kept so that its state's
// address cannot be reused by another parameter while the map lives.
using Replicas = std::map<const Variable::State*, std::pair<Variable, Variable>>;

// PyTorch's replicate_module_params_buffers: the module's own parameters that partition_fn left
// undistributed become Replicate on every mesh dim. A Variable shared by several modules gets
// one replica, so tied weights stay tied.
void replicate_undistributed(Module& module, const Mesh& mesh, Replicas& replicas) {
  for (const auto& [name, parameter] : module.named_parameters(false)) {
    if (!undistributed(parameter, mesh)) continue;
    auto it = replicas.find(parameter.state().get());
    if (it == replicas.end()) {
      Variable replica(distribute_tensor(parameter.value().full_tensor(), mesh));
      it = replicas.emplace(parameter.state().get(), std::make_pair(parameter, replica)).first;
    }
    module.set_parameter(name, it->second.second);
  }
}

}  // namespace

void distribute_module(Module& module, Mesh mesh, PartitionFn partition_fn, InputFn input_fn, OutputFn output_fn) {
  if (!mesh.is_valid()) throw MeshError("distribute_module: the mesh is empty");
  if (ModuleDistribution::distributed(module))
    throw Error("distribute_module: the module is distributed already (one call per module, as in PyTorch)");
  Replicas replicas;
  // Taken before partition_fn runs: it replaces parameters, not modules.
  for (const auto& [name, submodule] : module.named_modules()) {
    if (partition_fn) partition_fn(name, *submodule, mesh);
    replicate_undistributed(*submodule, mesh, replicas);
  }
  for (const auto& [name, parameter] : module.named_parameters())
    if (parameter.layout().mesh() != mesh)
      throw MeshError("distribute_module: parameter '" + name + "' is on mesh " + parameter.layout().mesh().to_string() +
                      ", not on " + mesh.to_string() +
                      "; only parameters of one-device meshes are replicated by default, partition_fn must place the others");
  if (input_fn)
    module.register_forward_pre_hook([input_fn, mesh](Module& m, std::vector<Tensor> inputs) {
      return input_fn(m, std::move(inputs), mesh);
    });
  if (output_fn)
    module.register_forward_hook([output_fn, mesh](Module& m, const std::vector<Tensor>&, std::vector<Tensor> outputs) {
      return output_fn(m, std::move(outputs), mesh);
    });
  ModuleDistribution::distributed(module) = true;
}

}  // namespace tessera
