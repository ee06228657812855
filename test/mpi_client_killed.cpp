// Helper of the fault tests: client 1 is killed (SIGKILL, no cleanup of its own) in the middle
// of a loop of collectives while the others wait in one. test/client_killed.sh checks
// that the job ends within 10 s and leaves no shared-memory segment behind.
#include <signal.h>

#include <tessera/tessera.hpp>

using namespace tessera;

int main(int argc, char** argv) {
  init(argc, argv);
  Mesh mesh = create_distributed_mesh({{"x", num_clients()}});
  Tensor t = ones({1 << 16}, Layout({"x"}, mesh));
  for (int step = 0; step < 1000; ++step) {
    if (step == 5 && client_id() == 1) raise(SIGKILL);
    t = relayout(t * 1.0f, Layout::replicated(mesh, 1));  // an all_gather every step
    (void)t.components();
    t = relayout(t, Layout({"x"}, mesh));
  }
  return 0;
}
