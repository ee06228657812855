// The multi-client backend for groups whose members are spread over clients that hold several
// of them (TESSERA_LOCAL_DEVICES > 1). A client's members meet in shared memory; one leader per
// client talks to the other clients' leaders (MPI, or shared memory when they share a node):
//   all_reduce       reduce locally, all_reduce among leaders, every member copies the result;
//   all_gather_v     concatenate locally, allgatherv among leaders, reorder into rank order;
//   reduce_scatter_v sum locally, reduce-scatter client-major blocks among leaders, take yours;
//   all_to_all_v     leaders pack per-destination-client bundles, alltoallv, unpack;
//   broadcast        the root's client's leader broadcasts to the leaders, then locally.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

// The local members' communicators of one group. `owner[r]` is the client holding group rank r;
// `local_ranks` are the group ranks this client holds (ascending); `leaders` connects the leaders
// of the participating clients, ordered by client (MPI, or shared memory on one node).
std::vector<std::shared_ptr<Communicator>> create_hierarchical_group(std::vector<int> owner, std::vector<int> local_ranks,
                                                                     std::shared_ptr<Communicator> leaders);

}  // namespace tessera
