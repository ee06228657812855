// Tensor's printed form (declared in dsl/format.hpp).
#include "dsl/concrete_value.hpp"
#include "dsl/format.hpp"
#include "dsl/string_util.hpp"
#include "jit/api/tensor_api.hpp"

namespace tessera {

std::string tensor_to_string(const Tensor& t) {
  require_concrete(t.node(), "printing a Tensor");
  std::string value;
  const NodeValue computed = tensorflow_view(t);  // TF's form: no Partial
  const Layout& layout = computed.layout;
  const auto& components = computed.storage->components;
  if (layout.is_fully_replicated()) {
    value = array_to_string(components.front());
  } else {
    const std::vector<std::string> names = layout.mesh().local_devices();
    std::vector<std::string> items;
    for (size_t i = 0; i < names.size(); ++i)
      items.push_back("\"" + names[i] + "\": " + array_to_string(components[i]));
    value = "{" + join(items, ", ") + "}";
  }
  return "Tensor(" + value + ", layout=\"" + layout.to_string() + "\", shape=" + shape_string(t.shape()) +
         ", dtype=" + std::string(dtype_name(t.dtype())) + ")";
}

}  // namespace tessera
