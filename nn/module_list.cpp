#include "nn/module_list.hpp"

#include <string>

#include "dsl/error.hpp"
#include "dsl/index_check.hpp"

namespace tessera {

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) append(std::move(m));
}

void ModuleList::append(std::shared_ptr<Module> module) {
  if (!module) throw Error("ModuleList: append of a null module (index " + std::to_string(modules_.size()) + ")");
  modules_.push_back(register_module(std::to_string(modules_.size()), std::move(module)));
}

Module& ModuleList::operator[](size_t index) const {
  if (index >= modules_.size())
    throw IndexError("ModuleList: index " + std::to_string(index) + " is out of range for " + std::to_string(modules_.size()) +
                     " modules");
  return *modules_[index];
}

std::vector<Tensor> ModuleList::forward(const std::vector<Tensor>&) {
  throw Error("ModuleList has no forward (as in PyTorch): call its modules in turn");
}

}  // namespace tessera
