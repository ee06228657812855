// Helper of test_training: saves a checkpoint of value 2.0 into argv[1] forever (until killed).
#include <tessera/tessera.hpp>

using namespace tessera;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  Mesh mesh = create_mesh({{"x", 2}});
  std::map<std::string, Variable> vars = {{"w", Variable(full({300, 200}, 2.0, Layout({"x", UNSHARDED}, mesh)))}};
  while (true) save(argv[1], vars);
}
