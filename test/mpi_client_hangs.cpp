// Helper of the multi-client tests: client 1 never reaches a collective. With
// TESSERA_COMM_TIMEOUT=2 the others must report the collective and the missing rank, then end
// the job (a should_fail test with a short time limit).
#include <chrono>
#include <thread>

#include <tessera/tessera.hpp>

using namespace tessera;

int main(int argc, char** argv) {
  init(argc, argv);
  Mesh mesh = create_distributed_mesh({{"x", num_clients()}});
  Tensor t = ones({8}, Layout({"x"}, mesh));
  if (client_id() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  return t.full_tensor().numel() == 8 ? 0 : 2;
}
