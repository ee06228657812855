#include "comm/machine_cores.hpp"

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace tessera {

int machine_cores() {
  static const int cores = std::max(1, int(std::thread::hardware_concurrency()));  // reads /sys each call: once is enough
  return cores;
}

int clients_on_this_machine() {
  static const int clients = [] {
    const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    return v && *v ? std::max(1, std::atoi(v)) : 1;
  }();
  return clients;
}

}  // namespace tessera
