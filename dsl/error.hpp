// The typed errors of Tessera's public API. Every user mistake surfaces as one of these,
// with a message that names the tensor, axis, mesh dimension or rank at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
struct ShapeError : Error { using Error::Error; };
struct LayoutError : Error { using Error::Error; };
struct MeshError : Error { using Error::Error; };
struct DTypeError : Error { using Error::Error; };
struct CommError : Error { using Error::Error; };
struct CompileError : Error { using Error::Error; };
struct IOError : Error { using Error::Error; };
// A device (GPU) is missing or one of its calls failed: the message names the call and the
// driver's error.
struct DeviceError : Error { using Error::Error; };

// Internal invariant violated: a Tessera bug, not a user error.
struct InternalError : Error { using Error::Error; };

}  // namespace tessera
