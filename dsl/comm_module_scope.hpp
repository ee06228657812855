// CommModuleScope: names the module whose forward is building ops, so CommDebugMode can report
// each collective under the module that issued it (PyTorch attributes collectives to the
// module whose forward ran them). Scopes nest into dotted paths: CommModuleScope a("model");
// CommModuleScope b("fc1"); builds ops in "model.fc1". Tessera is lazy, so the path is captured
// when an op's node is built (on the user's thread) and travels with the node; collectives run
// later, at force time, often outside every module, on device worker threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace tessera {

// A dotted module path; null outside every module. Shared, so nodes hold it for the cost of a
// pointer.
using ModulePath = std::shared_ptr<const std::string>;

class CommModuleScope {
 public:
  explicit CommModuleScope(std::string_view name);  // nested under the current path; "" adds nothing
  ~CommModuleScope();
  CommModuleScope(const CommModuleScope&) = delete;
  CommModuleScope& operator=(const CommModuleScope&) = delete;

  // This thread's current path ("" outside every module).
  static std::string current();
  // Exactly `path` until the scope ends (autodiff builds an op's gradient in the op's module).
  static CommModuleScope replacing(ModulePath path) { return CommModuleScope(std::move(path)); }

 private:
  explicit CommModuleScope(ModulePath path);
  ModulePath previous_;
};

// This thread's current path, as nodes store it.
ModulePath current_module_path();

}  // namespace tessera
