// The walkthrough of TensorFlow's "DTensor concepts" guide, in C++: meshes, layouts,
// my_first_dtensor, pack/unpack, the fully sharded / fully replicated / hybrid 3x2 examples with
// their per-device components, the .numpy() error, and PyTorch-style redistribute.
#include <fmt/core.h>

#include <tessera/tessera.hpp>

#include "../common/report_errors.hpp"

using namespace tessera;

// dtensor_from_array of the guide: replicate the array to the mesh, then shard the copy.
static Tensor dtensor_from_array(const Array& array, const Layout& layout) {
  Tensor replicated = copy_to_mesh(array, Layout::replicated(layout.mesh(), layout.rank()));
  return relayout(replicated, layout);
}

static void print_components(const Tensor& t) {
  for (const Array& component : unpack(t))
    fmt::print("Device: {}, {} shape={}\n", component.device(), component, component.shape().size() == 2
                   ? fmt::format("({}, {})", component.shape()[0], component.shape()[1])
                   : fmt::format("({},)", component.shape()[0]));
}

static int run_sample(int argc, char** argv) {
  init(argc, argv);
  std::vector<std::string> devices = cpu_devices(6);

  fmt::print("== Mesh ==\n");
  Mesh mesh_1d = create_mesh({{"x", 6}}, devices);
  fmt::print("{}\n", mesh_1d);
  Mesh mesh_2d = create_mesh({{"x", 3}, {"y", 2}}, devices);
  fmt::print("{}\n", mesh_2d);

  fmt::print("\n== Layout ==\n");
  fmt::print("{}\n", Layout({UNSHARDED, UNSHARDED}, mesh_1d));
  fmt::print("{}\n", Layout({UNSHARDED, "x"}, mesh_1d));
  fmt::print("{}\n", Layout({"y", "x"}, mesh_2d));
  fmt::print("{}\n", Layout({"x", UNSHARDED}, mesh_2d));

  fmt::print("\n== my_first_dtensor ==\n");
  Layout layout({UNSHARDED}, mesh_1d);
  Tensor my_first_dtensor = dtensor_from_array(Array{0, 1}, layout);
  fmt::print("{}\n", my_first_dtensor);
  fmt::print("global shape: ({},)  dtype: {}\n", my_first_dtensor.shape()[0], my_first_dtensor.dtype());
  fmt::print("{}\n", fetch_layout(my_first_dtensor));
  print_components(my_first_dtensor);

  fmt::print("\n== pack ==\n");
  std::vector<Array> parts(6, Array{0, 1});
  fmt::print("{}\n", pack(parts, layout));

  Array range6 = Array::from<int32_t>({0, 1, 2, 3, 4, 5}, {3, 2});
  fmt::print("\n== fully sharded rank-2 tensor on the 3x2 mesh ==\n");
  Tensor fully_sharded = dtensor_from_array(range6, Layout({"x", "y"}, mesh_2d));
  print_components(fully_sharded);
  fmt::print("{}", visualize_sharding(fully_sharded));

  fmt::print("\n== fully replicated ==\n");
  Tensor fully_replicated = dtensor_from_array(range6, Layout::replicated(mesh_2d, 2));
  print_components(fully_replicated);

  fmt::print("\n== hybrid: ['x', unsharded] ==\n");
  Tensor hybrid = dtensor_from_array(range6, Layout({"x", UNSHARDED}, mesh_2d));
  print_components(hybrid);
  fmt::print("{}", visualize_sharding(hybrid));

  fmt::print("\n== to_array (.numpy()) ==\n");
  fmt::print("{}\n", to_array(fully_replicated));
  for (const auto& [name, t] : {std::pair{"fully_sharded", fully_sharded}, std::pair{"hybrid", hybrid}}) {
    try {
      to_array(t);
    } catch (const LayoutError& e) {
      fmt::print("got an error as expected for {}: {}\n", name, e.what());
    }
  }

  fmt::print("\n== ones with a layout ==\n");
  fmt::print("{}\n", ones({6, 4}, Layout({"x", "y"}, mesh_2d)));

  fmt::print("\n== matmul: the overview's three layouts ==\n");
  Array ma{{1, 2, 3}, {4, 5, 6}}, mb{{6, 5}, {4, 3}, {2, 1}};
  Mesh mesh_x6 = create_mesh({{"x", 6}}, devices);
  struct Case { const char* what; Layout a, b; };
  for (const Case& c : {Case{"fully replicated", Layout::replicated(mesh_x6, 2), Layout::replicated(mesh_x6, 2)},
                        Case{"contraction sharded on x", Layout({UNSHARDED, "x"}, mesh_2d), Layout({"x", UNSHARDED}, mesh_2d)},
                        Case{"plus rows of a on y", Layout({"y", "x"}, mesh_2d), Layout({"x", UNSHARDED}, mesh_2d)}}) {
    Tensor c_ = matmul(dtensor_from_array(ma, c.a), dtensor_from_array(mb, c.b));
    PlanSummary plan = plan_summary(c_);
    fmt::print("{}: sharding spec [{}], {} multiplications across devices, collectives [{}]\n", c.what,
               fmt::join(fetch_layout(c_).sharding_specs(), ", "), plan.multiplies, fmt::join(plan.collectives, ", "));
    for (const Array& component : unpack(c_)) fmt::print("  {} {}\n", component.device(), component);
  }
  fmt::print("\nexplain() of the last one:\n{}", explain(matmul(dtensor_from_array(ma, Layout({"y", "x"}, mesh_2d)),
                                                                dtensor_from_array(mb, Layout({"x", UNSHARDED}, mesh_2d)))));

  fmt::print("\n== stateless random numbers: the same global tensor under every layout ==\n");
  Tensor sharded_normal = random_normal({6, 4}, 1, Layout({"x", "y"}, mesh_2d));
  fmt::print("{}\n", sharded_normal);
  bool same = fmt::format("{}", sharded_normal.full_tensor()) ==
              fmt::format("{}", random_normal({6, 4}, 1, Layout::replicated(mesh_1d, 2)).full_tensor());
  fmt::print("equal to the replicated draw on the 1-D mesh: {}\n", same ? "yes" : "no");

  fmt::print("\n== PyTorch-style redistribute, uneven shards ==\n");
  Mesh mesh_4 = create_mesh({{"dp", 4}});
  Tensor rows = distribute_tensor(Array::from<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2}), mesh_4, {Shard{0}});
  fmt::print("Shard(0) of a 5x2 tensor over 4 devices (torch.chunk sizes 2, 2, 1, 0):\n{}", visualize_sharding(rows));
  {
    CommDebugMode comm;
    Tensor cols = rows.redistribute({Shard{1}});
    fmt::print("Shard(0) -> Shard(1): {}\n{}", fmt::format("{} all_to_all", comm.counts()["all_to_all"]),
               visualize_sharding(cols));
    fmt::print("full_tensor: {}\n", cols.full_tensor());
  }
  Tensor partial = from_local(Array::from<float>({1, 2}, {2}), mesh_4, {Partial{ReduceOp::Sum}});
  fmt::print("Partial(sum) of [1 2] on 4 devices -> Replicate: {}\n",
             to_array(partial.redistribute({Replicate{}})));
  return 0;
}

int main(int argc, char** argv) { return samples::report_errors([&] { return run_sample(argc, argv); }); }
