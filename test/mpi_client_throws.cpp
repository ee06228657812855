// Helper of the multi-client tests: client 1 throws while the others wait in a collective. The
// job must end quickly with a non-zero status and client 1's message (a should_fail test).
#include <stdexcept>

#include <tessera/tessera.hpp>

using namespace tessera;

int main(int argc, char** argv) {
  init(argc, argv);
  Mesh mesh = create_distributed_mesh({{"x", num_clients()}});
  Tensor t = ones({8}, Layout({"x"}, mesh));
  if (client_id() == 1) throw std::runtime_error("client 1 gives up on purpose");
  Array gathered = t.full_tensor();  // the others wait here for client 1
  return gathered.numel() == 8 ? 0 : 2;
}
