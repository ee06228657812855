// Tensor-parallel MNIST: the mnist_dp model on a 2-D ("batch", "model") mesh with Megatron-style
// layouts: the first weight column-sharded [unsharded, model], the second row-sharded
// [model, unsharded] (its matmul leaves a partial sum over "model"), the last column-sharded
// again (a softmax over sharded classes). Batches are sharded over "batch". The losses match
// mnist_dp's with the same seed.
#include "../common/mnist_trainer.hpp"

int main(int argc, char** argv) {
  return mnist::run(argc, argv, "Tensor-parallel Fashion-MNIST with Tessera", [](int devices) {
    using namespace tessera;
    const int model = devices >= 2 ? 2 : 1;
    Mesh mesh = create_mesh({{"batch", std::max(1, devices / model)}, {"model", model}});
    return mnist::Placement{mesh, Layout({UNSHARDED, "model"}, mesh), Layout({"model", UNSHARDED}, mesh),
                            Layout({UNSHARDED, "model"}, mesh)};
  });
}
