#include "ir/redistribute_step.hpp"

#include "dsl/error.hpp"

namespace tessera {

std::string_view redistribute_kind_name(RedistributeKind kind) {
  switch (kind) {
#define TESSERA_REDISTRIBUTE_KIND_NAME(name, text, ...) case RedistributeKind::name: return text;
    TESSERA_COLLECTIVES(TESSERA_REDISTRIBUTE_KIND_NAME, _)
#undef TESSERA_REDISTRIBUTE_KIND_NAME
    case RedistributeKind::LocalPartial: return "local_partial";
  }
  throw InternalError("redistribute_kind_name: bad kind");
}

RedistributeKind redistribute_kind_of(OpKind op) {
  switch (op) {
#define TESSERA_REDISTRIBUTE_KIND_OF(name, text, ...) case OpKind::name: return RedistributeKind::name;
    TESSERA_COLLECTIVES(TESSERA_REDISTRIBUTE_KIND_OF, _)
#undef TESSERA_REDISTRIBUTE_KIND_OF
    default: throw InternalError(std::string("redistribute_kind_of: ") + std::string(op_name(op)) + " is no collective");
  }
}

bool is_collective(RedistributeKind kind) {
  return kind != RedistributeKind::LocalChunk && kind != RedistributeKind::LocalPartial;
}

}  // namespace tessera
