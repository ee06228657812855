// The user's frame: where the user's code called into the library. An op built inside a
// library module's forward or an optimizer's update defaults its source location to a line of
// the library (nn/layers.cpp, nn/adam_update.cpp); errors, CommDebugMode records, explain() and
// profiles should name the user's line that led there, as PyTorch's CommDebugMode names the
// user's line beside the module. Library entry points (Module's call, the optimizers' apply,
// clip_grad_norm) open a UserCallScope with their caller's location; a location in a library
// file is then reported as the innermost scope's location that is the user's.
#pragma once

#include <string_view>

#include "dsl/source_location.hpp"

namespace tessera {

// Whether `file` (a SourceLocation's file_name) is one of the library's own sources or
// installed headers: under the library's source folders (dsl/, comm/, ir/, partitioner/,
// codegen/, jit/, backend/, nn/, plan/) as this build names them, or under an installed
// include/tessera/.
bool is_library_file(std::string_view file);

// `where` if it is the user's; else the innermost open UserCallScope's location that is the
// user's; else `where` (no user frame: a library's own call).
SourceLocation user_frame(const SourceLocation& where);

// Opened by a library entry point for its call (scopes nest per thread; a scope whose
// location is the library's, one library function calling another, is passed over).
class UserCallScope {
 public:
  explicit UserCallScope(const SourceLocation& caller);
  ~UserCallScope();
  UserCallScope(const UserCallScope&) = delete;
  UserCallScope& operator=(const UserCallScope&) = delete;
};

}  // namespace tessera
