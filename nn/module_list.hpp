// PyTorch's nn.ModuleList: modules held in order, registered as "0", "1", ..., so their
// parameters are named "layers.0.attention.wq.weight" and parallelize plans and checkpoints
// address them by index. It has no forward of its own (calling it is an Error): the owner
// iterates over it, as in PyTorch.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "nn/module.hpp"

namespace tessera {

class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);

  void append(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t index) const;  // IndexError naming the index and the size
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;  // Error: iterate instead

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace tessera
