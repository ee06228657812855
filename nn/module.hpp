// Module: PyTorch's nn.Module for Tessera. A model is a tree of modules; each holds named
// parameters (Variables) and named child modules, both in registration order. Names are
// dotted paths from the module they are asked of ("fc1.weight"), the form state_dict() and the
// checkpoint functions use.
//
// Children are owned through shared_ptr (register_module takes one and hands it back), so a
// child outlives every module holding it and a parent never points into memory that moves.
// Modules are movable but not copyable: a copy would silently share its children.
#pragma once

#include <concepts>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsl/source_location.hpp"
#include "dsl/variable.hpp"
#include "nn/mixed_precision_policy.hpp"

namespace tessera {

class Module {
 public:
  // A forward pre-hook sees the inputs and returns the ones forward() gets; a forward hook sees
  // the inputs and the outputs and returns the outputs the caller gets (PyTorch's hooks, which
  // always return here).
  using ForwardPreHook = std::function<std::vector<Tensor>(Module& module, std::vector<Tensor> inputs)>;
  using ForwardHook =
      std::function<std::vector<Tensor>(Module& module, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs)>;

  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;

  // The computation; call the module (operator()) instead, which runs the hooks around it.
  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs) = 0;
  // Pre-hooks, forward, hooks, in registration order. The ops built inside are reported at
  // `where`, the caller's line, when they are the library's own (dsl/user_frame.hpp).
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs, SourceLocation where = SourceLocation::current());
  // One input, one output (Error if forward returns another number of outputs).
  Tensor operator()(const Tensor& input, SourceLocation where = SourceLocation::current());

  // Names are non-empty, contain no '.', and are unique among this module's parameters and
  // children (Error otherwise, naming it).
  void register_parameter(const std::string& name, Variable parameter);
  template <class M>
    requires std::derived_from<M, Module>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // PyTorch's get_parameter / get_submodule: a dotted path from this module ("" is the module
  // itself); Error naming the path and what is there for an unknown one.
  Variable get_parameter(const std::string& path) const;
  Module& get_submodule(const std::string& path);
  const Module& get_submodule(const std::string& path) const;
  // Replaces a parameter (as partition_fn does to shard it): the new Variable may have any
  // layout, but ShapeError / DTypeError name the parameter unless shape and dtype stay.
  // Optimizers built before hold the old Variable; build them afterwards.
  void set_parameter(const std::string& path, Variable parameter);
  // What forward() computes with: the parameter at `path` ("w1", or a child's "experts.w1"),
  // seen through the view fully_shard installed on its module (its value gathered over the
  // data-parallel dim before use, ZeRO-3), or its plain value.
  Tensor parameter_value(const std::string& path) const;
  using ParameterView = std::function<Tensor(const Tensor& value)>;
  // fully_sharded: the view is fully_shard's (a gather over dp), not apply_mixed_precision's cast
  // alone; apply_mixed_precision tells the two apart in what it refuses.
  void set_parameter_view(ParameterView view, bool fully_sharded = false) {
    parameter_view_ = std::move(view);
    fully_sharded_ = fully_sharded;
  }
  bool has_parameter_view() const { return bool(parameter_view_); }
  bool is_fully_sharded() const { return fully_sharded_; }
  // The mixed precision policy installed on this module (nn/mixed_precision.hpp); the parallel
  // styles' hooks read its reduce_dtype for the tensor-parallel reductions they place.
  void set_mixed_precision(MixedPrecisionPolicy policy) { mixed_precision_ = policy; }
  const std::optional<MixedPrecisionPolicy>& mixed_precision() const { return mixed_precision_; }

  // This module's parameters, then each child's (depth first), with dotted names. A Variable
  // reachable under two names (tied weights) is listed once, under the first, unless `recurse`
  // is false, which lists this module's own parameters only.
  std::vector<std::pair<std::string, Variable>> named_parameters(bool recurse = true) const;
  std::vector<Variable> parameters(bool recurse = true) const;
  // This module (named "") and every descendant, depth first, each once.
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // Every parameter under every dotted name (tied ones under each), for save() and load():
  // load() assigns into these Variables, so it restores the module's own parameters.
  std::map<std::string, Variable> state_dict() const;

  void register_forward_pre_hook(ForwardPreHook hook);
  void register_forward_hook(ForwardHook hook);

 private:
  friend class ModuleDistribution;  // distribute_module's record that it ran (nn/distribute_module.cpp)

  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  // The submodule at `path`; Error saying that `wanted` is missing and which step failed.
  const Module& descend(const std::string& path, const std::string& wanted) const;
  // The index in parameters_ of this module's own parameter `name`; Error naming `path` if none.
  size_t parameter_index(const std::string& name, const std::string& path) const;

  std::vector<std::pair<std::string, Variable>> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ForwardPreHook> forward_pre_hooks_;
  std::vector<ForwardHook> forward_hooks_;
  ParameterView parameter_view_;
  bool fully_sharded_ = false;
  std::optional<MixedPrecisionPolicy> mixed_precision_;
  bool distributed_ = false;  // PyTorch allows one distribute_module per module
  std::string scope_name_;    // the name it was first registered under: its CommModuleScope
};

}  // namespace tessera
