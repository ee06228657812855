#include "dsl/comm_module_scope.hpp"

namespace tessera {
namespace {

// Per thread: each thread that builds ops has its own modules.
thread_local ModulePath current_path;

}  // namespace

CommModuleScope::CommModuleScope(std::string_view name) : previous_(current_path) {
  if (name.empty()) return;
  current_path = std::make_shared<const std::string>(previous_ ? *previous_ + "." + std::string(name) : std::string(name));
}

CommModuleScope::CommModuleScope(ModulePath path) : previous_(current_path) { current_path = std::move(path); }

CommModuleScope::~CommModuleScope() { current_path = std::move(previous_); }

std::string CommModuleScope::current() { return current_path ? *current_path : std::string(); }

ModulePath current_module_path() { return current_path; }

}  // namespace tessera
