// Process-wide runtime set-up: environment (TESSERA_LOG), and the client identity used by
// multi-client runs (single client until the MPI backend lands).
#pragma once

namespace tessera {

// Optional. Reads TESSERA_* settings; later detects an mpirun launch.
void init(int& argc, char**& argv);
int num_clients();  // 1 in a single process
int client_id();    // 0 in a single process

}  // namespace tessera
