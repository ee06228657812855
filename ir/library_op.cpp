#include "ir/library_op.hpp"

namespace tessera {

std::string_view library_op_name(LibraryOp op) {
  switch (op) {
#define TESSERA_LIBRARY_OP_NAME(name, text) \
  case LibraryOp::name: return text;
    TESSERA_LIBRARY_OPS(TESSERA_LIBRARY_OP_NAME)
#undef TESSERA_LIBRARY_OP_NAME
  }
  return "?";
}

}  // namespace tessera
