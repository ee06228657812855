#include "nn/module.hpp"

#include "dsl/user_frame.hpp"

#include "dsl/comm_debug_mode.hpp"
#include "dsl/comm_module_scope.hpp"

#include <algorithm>
#include <functional>
#include <set>

#include "dsl/dtype.hpp"
#include "dsl/error.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

std::string dotted(const std::string& prefix, const std::string& name) { return prefix.empty() ? name : prefix + "." + name; }

// "fc1.weight" -> {"fc1", "weight"}; "weight" -> {"", "weight"}.
std::pair<std::string, std::string> split_last(const std::string& path) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

std::string quoted_or_root(const std::string& path) { return path.empty() ? "the module" : "'" + path + "'"; }

template <class Named>
std::string names_of(const std::vector<Named>& items, const char* none) {
  if (items.empty()) return none;
  return join(items, ", ", [](const Named& item) { return item.first; });
}

// Every module under `module` (itself first), depth first, with its dotted path. `each_once`
// skips a module met before under another path (a shared child), as PyTorch's named_modules does.
void walk(const Module& module, const std::string& path, bool each_once, std::set<const Module*>& seen,
          const std::function<void(const std::string&, const Module&)>& visit) {
  if (each_once && !seen.insert(&module).second) return;
  visit(path, module);
  for (const auto& [name, child] : module.named_children()) walk(*child, dotted(path, name), each_once, seen, visit);
}

void walk(const Module& module, bool each_once, const std::function<void(const std::string&, const Module&)>& visit) {
  std::set<const Module*> seen;
  walk(module, "", each_once, seen, visit);
}

}  // namespace

std::vector<Tensor> Module::operator()(const std::vector<Tensor>& inputs, SourceLocation where) {
  const UserCallScope caller(where);
  // Copies: a hook that registers another hook must not invalidate the one running.
  const std::vector<ForwardPreHook> pre_hooks = forward_pre_hooks_;
  const std::vector<ForwardHook> hooks = forward_hooks_;
  // CommDebugMode reports the collectives of the ops built here under this module's path.
  CommModuleScope scope(scope_name_);
  if (comm_debug_mode_active()) {
    std::vector<std::pair<std::string, Tensor>> values;
    for (const auto& [name, variable] : named_parameters()) values.emplace_back(name, variable.value());
    record_module_parameters(CommModuleScope::current(), values);
  }
  std::vector<Tensor> args = inputs;
  for (const ForwardPreHook& hook : pre_hooks) args = hook(*this, std::move(args));
  std::vector<Tensor> outputs = forward(args);
  for (const ForwardHook& hook : hooks) outputs = hook(*this, args, std::move(outputs));
  return outputs;
}

Tensor Module::parameter_value(const std::string& path) const {
  const auto [owner_path, name] = split_last(path);
  const Module& owner = descend(owner_path, "parameter '" + path + "'");
  const Tensor value = owner.parameters_[owner.parameter_index(name, path)].second.value();
  return owner.parameter_view_ ? owner.parameter_view_(value) : value;
}

Tensor Module::operator()(const Tensor& input, SourceLocation where) {
  std::vector<Tensor> outputs = (*this)(std::vector<Tensor>{input}, where);
  if (outputs.size() != 1)
    throw Error("Module: forward returned " + std::to_string(outputs.size()) +
                " outputs; call the module with a vector of inputs to get them all");
  return outputs.front();
}

void Module::check_new_name(const std::string& name, const char* what) const {
  const std::string who = std::string("Module::register_") + what + ": ";
  if (name.empty()) throw Error(who + "a name may not be empty");
  if (name.find('.') != std::string::npos)
    throw Error(who + "'" + name + "' contains '.', which separates the components of a path");
  auto has = [&name](const auto& items) {
    return std::any_of(items.begin(), items.end(), [&name](const auto& item) { return item.first == name; });
  };
  if (has(parameters_)) throw Error(who + "'" + name + "' is already a parameter of this module");
  if (has(children_)) throw Error(who + "'" + name + "' is already a child module of this module");
}

void Module::register_parameter(const std::string& name, Variable parameter) {
  check_new_name(name, "parameter");
  parameters_.emplace_back(name, std::move(parameter));
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "module");
  if (!module) throw Error("Module::register_module: '" + name + "' is a null module");
  // A module inside its own subtree would make every walk endless.
  walk(*module, true, [&](const std::string& path, const Module& m) {
    if (&m == this)
      throw Error("Module::register_module: '" + name + "' contains this module" +
                  (path.empty() ? std::string() : " (as '" + path + "')") + "; modules form a tree");
  });
  if (module->scope_name_.empty()) module->scope_name_ = name;  // a shared child keeps its first name
  children_.emplace_back(name, std::move(module));
}

const Module& Module::descend(const std::string& path, const std::string& wanted) const {
  const Module* module = this;
  std::string walked;
  if (path.empty()) return *this;
  for (const std::string& name : split(path, '.')) {
    auto it = std::find_if(module->children_.begin(), module->children_.end(),
                           [&name](const auto& child) { return child.first == name; });
    if (it == module->children_.end())
      throw Error("Module: no " + wanted + ": " + quoted_or_root(walked) + " has no child '" + name +
                  "' (its children: " + names_of(module->children_, "none") + ")");
    module = it->second.get();
    walked = dotted(walked, name);
  }
  return *module;
}

const Module& Module::get_submodule(const std::string& path) const { return descend(path, "module '" + path + "'"); }

Module& Module::get_submodule(const std::string& path) {
  return const_cast<Module&>(std::as_const(*this).get_submodule(path));
}

size_t Module::parameter_index(const std::string& name, const std::string& path) const {
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (parameters_[i].first == name) return i;
  throw Error("Module: no parameter '" + path + "': " + quoted_or_root(split_last(path).first) + " has no parameter '" +
              name + "' (its parameters: " + names_of(parameters_, "none") + ")");
}

Variable Module::get_parameter(const std::string& path) const {
  const auto [owner_path, name] = split_last(path);
  const Module& owner = descend(owner_path, "parameter '" + path + "'");
  return owner.parameters_[owner.parameter_index(name, path)].second;
}

void Module::set_parameter(const std::string& path, Variable parameter) {
  const auto [owner_path, name] = split_last(path);
  // The owner is non-const: this module or a child held as shared_ptr<Module>.
  Module& owner = const_cast<Module&>(descend(owner_path, "parameter '" + path + "'"));
  Variable& slot = owner.parameters_[owner.parameter_index(name, path)].second;
  if (parameter.shape() != slot.shape())
    throw ShapeError("Module::set_parameter: '" + path + "' has shape " + shape_string(slot.shape()) + ", the new value " +
                     shape_string(parameter.shape()));
  if (parameter.dtype() != slot.dtype())
    throw DTypeError("Module::set_parameter: '" + path + "' holds " + std::string(dtype_name(slot.dtype())) +
                     ", the new value " + std::string(dtype_name(parameter.dtype())));
  slot = std::move(parameter);
}

std::vector<std::pair<std::string, Variable>> Module::named_parameters(bool recurse) const {
  if (!recurse) return parameters_;
  std::vector<std::pair<std::string, Variable>> out;
  std::set<const Variable::State*> seen;
  walk(*this, true, [&](const std::string& path, const Module& module) {
    for (const auto& [name, parameter] : module.parameters_)
      if (seen.insert(parameter.state().get()).second) out.emplace_back(dotted(path, name), parameter);
  });
  return out;
}

std::vector<Variable> Module::parameters(bool recurse) const {
  std::vector<Variable> out;
  for (auto& [name, parameter] : named_parameters(recurse)) out.push_back(std::move(parameter));
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  // Every module reached is non-const: this one, and children held as shared_ptr<Module>.
  walk(*this, true, [&](const std::string& path, const Module& module) { out.emplace_back(path, const_cast<Module*>(&module)); });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::map<std::string, Variable> Module::state_dict() const {
  std::map<std::string, Variable> out;
  walk(*this, false, [&](const std::string& path, const Module& module) {
    for (const auto& [name, parameter] : module.parameters_) out.emplace(dotted(path, name), parameter);
  });
  return out;
}

void Module::register_forward_pre_hook(ForwardPreHook hook) {
  if (!hook) throw Error("Module::register_forward_pre_hook: the hook is empty");
  forward_pre_hooks_.push_back(std::move(hook));
}

void Module::register_forward_hook(ForwardHook hook) {
  if (!hook) throw Error("Module::register_forward_hook: the hook is empty");
  forward_hooks_.push_back(std::move(hook));
}

}  // namespace tessera
