#include "dsl/program_order_scope.hpp"

#include <string>

#include "dsl/error.hpp"

namespace tessera {
namespace {

// Per thread, as module paths are: each thread that builds ops has its own order.
thread_local int64_t current_position = ProgramOrderScope::none;

}  // namespace

ProgramOrderScope::ProgramOrderScope(int64_t position) : previous_(current_position) {
  if (position < none) throw Error("ProgramOrderScope: position " + std::to_string(position) + " is negative");
  current_position = position;
}

ProgramOrderScope::~ProgramOrderScope() { current_position = previous_; }

int64_t ProgramOrderScope::current() { return current_position; }

}  // namespace tessera
