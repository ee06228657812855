// An application built against an installed Tessera, as a user's would be: by pkg-config and by
// CMake's find_package (test/install_consumers.sh). It sums a sharded tensor on four virtual
// devices and prints the sum.
#include <cstdio>

#include <tessera/tessera.hpp>

int main() {
  using namespace tessera;
  Mesh mesh = create_mesh({{"x", 4}});
  Tensor t = distribute_tensor(Array::from(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {8}), mesh, {Shard(0)});
  std::printf("sum %g\n", double(to_array(reduce_sum(t)).to_vector<float>()[0]));
  return 0;
}
