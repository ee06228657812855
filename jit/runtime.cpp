#include "jit/runtime.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

namespace tessera {

void init(int& argc, char**& argv) {
  (void)argc;
  (void)argv;
  // TESSERA_LOG=debug|info|warn|... sets the log level of every component.
  if (const char* level = std::getenv("TESSERA_LOG")) spdlog::set_level(spdlog::level::from_str(level));
}

int num_clients() { return 1; }
int client_id() { return 0; }

}  // namespace tessera
