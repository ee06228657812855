#include "jit/runtime.hpp"

#include "dsl/logging.hpp"

namespace tessera {

void init(int& argc, char**& argv) {
  (void)argc;
  (void)argv;
  // Loggers read TESSERA_LOG when first used; touching the main ones here reports a bad setting early.
  component_logger("jit").debug("tessera initialised: 1 client");
}

int num_clients() { return 1; }
int client_id() { return 0; }

}  // namespace tessera
