// Clients agreeing on a mesh that spans them. TensorFlow asks the same of a multi-client mesh:
// its global devices are "the same for every DTensor client", and the clients' local_device_ids
// are distinct and together "cover every element in global_device_ids". A client that breaks this
// would otherwise wait in a collective its peers never join, or compute on another's device.
#pragma once

#include "dsl/mesh.hpp"

namespace tessera {

// Checks, with the clients owning `mesh`'s devices (its global devices' tasks), that they all
// list the same global devices in the same order and that every device is local to exactly the
// client of its task. A collective among those clients, run once per made mesh (Mesh::instance:
// later calls, with it or its copies, return at once), where it is made (create_mesh,
// create_distributed_mesh) or first used (whatever runs on it asks for its workers, its clients
// or its graph's key first); nothing for one client, a mesh without global devices, or a client
// owning none of its devices. On a fault every one of those clients raises a MeshError: this
// client's device list and another's when the lists differ, the device id and the clients
// claiming it otherwise. A device of a task the job does not have is a MeshError before any
// collective (every client with that list finds it alike).
void check_clients_agree_on_mesh(const Mesh& mesh);

}  // namespace tessera
