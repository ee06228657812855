#include "comm/client_group.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "comm/mpi_client_group.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

// A run of one client: every collective is the identity.
class SingleClientGroup final : public ClientGroup {
 public:
  int size() const override { return 1; }
  int rank() const override { return 0; }
  int members_on_this_node() const override { return 1; }
  void barrier() override {}
  void broadcast(std::vector<std::byte>&, int) override {}
  std::vector<std::vector<std::byte>> gather(const std::vector<std::byte>& data, int) override { return {data}; }
  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override { return values; }
  void all_reduce_sum(std::vector<int64_t>&) override {}
  std::vector<std::vector<std::byte>> exchange(const std::vector<std::vector<std::byte>>& outgoing,
                                               const std::vector<int64_t>&) override {
    return outgoing;
  }
  std::shared_ptr<ClientGroup> subgroup(const std::vector<int>& members, int) override {
    if (members != std::vector<int>{0}) throw InternalError("subgroup: a run of one client has only client 0");
    return std::make_shared<SingleClientGroup>();
  }
  std::shared_ptr<Communicator> communicator(int64_t) override {
    throw InternalError("a group of one client has no client communicator (its devices meet in process)");
  }
};

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}

// Said once, when a process of a larger mpirun job first asks for its clients without having
// started them: each process would silently become its own one-client job.
void warn_if_started_alone() {
  if (launcher_world_size() > 1)
    std::fprintf(stderr,
                 "tessera: warning: this process is one of %d started by mpirun, but tessera::init(argc, argv) was not "
                 "called first: it runs as its own single-client job and sees none of the others. Call init before "
                 "creating meshes.\n",
                 launcher_world_size());
}

std::unique_ptr<ClientGroup>& world_slot() {
  static auto* slot = new std::unique_ptr<ClientGroup>();  // never destroyed: used during exit
  return *slot;
}

}  // namespace

int launcher_world_size() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size && *size ? std::max(1, std::atoi(size)) : 1;
}

ClientGroup& world_clients() {
  auto& slot = world_slot();
  if (!slot) {
    warn_if_started_alone();
    slot = std::make_unique<SingleClientGroup>();
  }
  return *slot;
}

void start_clients(int& argc, char**& argv, std::function<void()> before_shutdown) {
  if (!launched_by_mpirun()) return;
  auto& slot = world_slot();
  if (slot && !dynamic_cast<SingleClientGroup*>(slot.get())) return;  // started already
  slot = start_mpi_clients(argc, argv, std::move(before_shutdown));
}

std::shared_ptr<ClientGroup> cached_client_group(const std::vector<int>& clients) {
  ClientGroup& world = world_clients();
  if (int(clients.size()) == world.size()) return std::shared_ptr<ClientGroup>(&world, [](ClientGroup*) {});
  static std::mutex mutex;
  static auto* groups = new std::map<std::vector<int>, std::shared_ptr<ClientGroup>>();
  std::lock_guard lock(mutex);
  auto& slot = (*groups)[clients];
  if (!slot) slot = world.subgroup(clients, 32767);
  return slot;
}

}  // namespace tessera
