// Data-parallel MNIST, TensorFlow's DTensor tutorial in C++: an MLP 784-700-500-10 with ReLU,
// Adam 1e-3, global batch 128, on a ("batch", N) mesh of virtual CPU devices. Weights are
// replicated and batches sharded, so the gradient reduction comes out of sharding propagation.
#include "../common/mnist_trainer.hpp"

int main(int argc, char** argv) {
  return mnist::run(argc, argv, "Data-parallel Fashion-MNIST with Tessera", [](int devices) {
    using namespace tessera;
    // Under mpirun each process is one client with one device; in one process, virtual devices.
    Mesh mesh = multi_client() ? create_distributed_mesh({{"batch", num_clients()}}) : create_mesh({{"batch", devices}});
    Layout replicated = Layout::replicated(mesh, 2);
    return mnist::Placement{mesh, replicated, replicated, replicated};
  });
}
