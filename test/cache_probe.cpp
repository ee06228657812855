// Helper of test_compiler: builds and runs one fixed program, then prints how its kernels were
// obtained ("compiled=N disk=M"). Run twice with the same TESSERA_CACHE_DIR, the second process
// must load everything from the disk cache.
#include <cstdio>

#include <tessera/tessera.hpp>

#include "backend/cpu/orc_engine.hpp"

using namespace tessera;

int main() {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(Array::from<float>({1, 2, 3, 4, 5, 6}, {2, 3}), Layout({"x", UNSHARDED}, mesh));
  Tensor y = softmax(relu(x * 2.0 - 1.0) + 0.25);
  Array out = y.full_tensor();
  CompileStats s = compile_stats();
  std::printf("compiled=%lld disk=%lld value=%.6f\n", (long long)s.compiled_modules, (long long)s.disk_hits,
              double(out.to_vector<float>()[5]));
  return 0;
}
