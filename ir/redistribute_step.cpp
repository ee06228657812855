#include "ir/redistribute_step.hpp"

#include "dsl/error.hpp"

namespace tessera {

std::string_view redistribute_kind_name(RedistributeKind kind) {
  switch (kind) {
    case RedistributeKind::AllGather: return "all_gather";
    case RedistributeKind::AllToAll: return "all_to_all";
    case RedistributeKind::AllReduce: return "all_reduce";
    case RedistributeKind::ReduceScatter: return "reduce_scatter";
    case RedistributeKind::LocalChunk: return "local_chunk";
    case RedistributeKind::LocalPartial: return "local_partial";
    case RedistributeKind::Shift: return "shift";
  }
  throw InternalError("redistribute_kind_name: bad kind");
}

bool is_collective(RedistributeKind kind) {
  return kind != RedistributeKind::LocalChunk && kind != RedistributeKind::LocalPartial;
}

}  // namespace tessera
