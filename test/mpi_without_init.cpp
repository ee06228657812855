// Helper of the multi-client tests: a program launched by mpirun that never calls init(). Each
// process would silently be its own one-client job; instead create_distributed_mesh raises a
// MeshError saying init was not called (and world_clients() warned on stderr). Exits 0 when so.
#include <cstdio>
#include <string>

#include <tessera/tessera.hpp>

using namespace tessera;

int main() {
  if (num_clients() != 1) return 3;  // without init, each process is alone
  try {
    (void)create_distributed_mesh({{"x", 2}});
  } catch (const MeshError& e) {
    const bool names_init = std::string(e.what()).find("init(argc, argv) was not called") != std::string::npos;
    std::printf("refused: %s\n", e.what());
    return names_init ? 0 : 2;
  }
  return 1;
}
