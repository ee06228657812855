#include <doctest/doctest.h>

#include <tessera/tessera.hpp>

#include "reference_sharding.hpp"

using namespace tessera;
using tessera::testing::same_array;

namespace {

Array range6() { return Array::from<int32_t>({0, 1, 2, 3, 4, 5}, {3, 2}); }

// dtensor_from_array of the overview: replicate, then relayout.
Tensor from_array(const Array& a, const Layout& layout) {
  return relayout(copy_to_mesh(a, Layout::replicated(layout.mesh(), layout.rank())), layout);
}

std::vector<std::string> component_texts(const Tensor& t) {
  std::vector<std::string> out;
  for (const Array& a : unpack(t)) out.push_back(a.device() + " " + fmt::format("{}", a));
  return out;
}

}  // namespace

TEST_CASE("overview: my_first_dtensor, pack and unpack") {
  Mesh mesh = create_mesh({{"x", 6}}, cpu_devices(6));
  Layout layout({UNSHARDED}, mesh);
  Tensor t = from_array(Array{0, 1}, layout);
  CHECK(fetch_layout(t) == layout);
  CHECK(t.shape() == std::vector<int64_t>{2});
  CHECK(t.dtype() == DType::i32);
  CHECK(fmt::format("{}", t) == "Tensor([0 1], layout=\"sharding_specs:unsharded, mesh:|x=6|0,1,2,3,4,5|0,1,2,3,4,5|"
                                "CPU:0,CPU:1,CPU:2,CPU:3,CPU:4,CPU:5\", shape=(2,), dtype=int32)");
  auto components = unpack(t);
  REQUIRE(components.size() == 6);
  for (int i = 0; i < 6; ++i) {
    CHECK(components[i].device() == "CPU:" + std::to_string(i));
    CHECK(fmt::format("{}", components[i]) == "[0 1]");
  }
  Tensor packed = pack(std::vector<Array>(6, Array{0, 1}), layout);
  CHECK(fmt::format("{}", packed) == fmt::format("{}", t));
}

TEST_CASE("overview: the 3x2 examples have the document's components") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  CHECK(component_texts(from_array(range6(), Layout({"x", "y"}, mesh))) ==
        std::vector<std::string>{"CPU:0 [[0]]", "CPU:1 [[1]]", "CPU:2 [[2]]", "CPU:3 [[3]]", "CPU:4 [[4]]", "CPU:5 [[5]]"});
  for (const auto& text : component_texts(from_array(range6(), Layout::replicated(mesh, 2))))
    CHECK(text.substr(6) == "[[0 1] [2 3] [4 5]]");
  // Also the Layout API page's ["x", unsharded] table.
  CHECK(component_texts(from_array(range6(), Layout({"x", UNSHARDED}, mesh))) ==
        std::vector<std::string>{"CPU:0 [[0 1]]", "CPU:1 [[0 1]]", "CPU:2 [[2 3]]", "CPU:3 [[2 3]]", "CPU:4 [[4 5]]",
                                 "CPU:5 [[4 5]]"});
}

TEST_CASE("overview: .numpy() of sharded tensors raises") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  CHECK(same_array(to_array(from_array(range6(), Layout::replicated(mesh, 2))), range6()));
  CHECK_THROWS_WITH_AS(to_array(from_array(range6(), Layout({"x", "y"}, mesh))), doctest::Contains("[x, y] is sharded"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(to_array(from_array(range6(), Layout({"x", UNSHARDED}, mesh))),
                       doctest::Contains("[x, unsharded] is sharded"), LayoutError);
  // Partial terms are summed (TensorFlow has no Partial a user sees): three terms of [1 2].
  Tensor partial = from_local(Array{1, 2}, mesh, {Partial{}, Replicate{}});
  CHECK(same_array(to_array(partial), Array{3, 6}));
}

TEST_CASE("overview: ones with a layout prints per device") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  std::string text = fmt::format("{}", ones({6, 4}, Layout({"x", "y"}, mesh)));
  CHECK(text == "Tensor({\"CPU:0\": [[1 1] [1 1]], \"CPU:1\": [[1 1] [1 1]], \"CPU:2\": [[1 1] [1 1]], "
                "\"CPU:3\": [[1 1] [1 1]], \"CPU:4\": [[1 1] [1 1]], \"CPU:5\": [[1 1] [1 1]]}, "
                "layout=\"sharding_specs:x,y, mesh:|x=3,y=2|0,1,2,3,4,5|0,1,2,3,4,5|CPU:0,CPU:1,CPU:2,CPU:3,CPU:4,CPU:5\", "
                "shape=(6, 4), dtype=float32)");
}

TEST_CASE("factories on uneven layouts never depend on the layout") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  for (const Layout& layout : {Layout({"x", "y"}, mesh), Layout({"y+x", UNSHARDED}, mesh), Layout::replicated(mesh, 2),
                               Layout::from_placements(mesh, {Partial{ReduceOp::Sum}, Shard{1}}, 2),
                               Layout::from_placements(mesh, {Partial{ReduceOp::Product}, Partial{ReduceOp::Max}}, 2)}) {
    CAPTURE(layout.to_string());
    Array expected = Array::from<double>(std::vector<double>(7 * 5, 2.5), {7, 5});
    CHECK(same_array(full({7, 5}, 2.5, layout, DType::f64).full_tensor(), expected));
    CHECK(same_array(zeros({7, 5}, layout, DType::i64).full_tensor(), Array({7, 5}, DType::i64)));
    Array one = ones({7, 5}, layout, DType::bf16).full_tensor();
    for (int64_t i = 0; i < one.numel(); ++i) CHECK(one.element_as_double(i) == 1.0);
    Tensor e = empty({7, 5}, layout, DType::f32);
    CHECK(e.shape() == std::vector<int64_t>{7, 5});
    auto coords = testing::coords_of(mesh);
    for (size_t i = 0; i < coords.size(); ++i)
      CHECK(e.components()[i].shape() == layout.local_shape({7, 5}, int64_t(i)));
  }
  CHECK_THROWS_WITH_AS(zeros({2}, Layout({"x", "y"}, mesh)), doctest::Contains("rank 1"), LayoutError);
  CHECK_THROWS_WITH_AS(zeros({2, -1}, Layout({"x", "y"}, mesh)), doctest::Contains("negative extent"), ShapeError);
}

TEST_CASE("pack infers uneven global shapes and checks every component") {
  Mesh mesh = create_mesh({{"x", 3}});
  Layout layout({"x", UNSHARDED}, mesh);
  Tensor t = pack({Array{{1, 2}, {3, 4}}, Array{{5, 6}, {7, 8}}, Array{{9, 10}}}, layout);
  CHECK(t.shape() == std::vector<int64_t>{5, 2});
  CHECK(same_array(t.full_tensor(), Array::from<int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {5, 2})));
  CHECK_THROWS_WITH_AS(pack({Array{{1, 2}}, Array{{5, 6}}}, layout), doctest::Contains("2 components for a mesh with 3"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(pack({Array{1, 2}, Array{1, 2}, Array{1, 2}}, layout), doctest::Contains("rank 1"), LayoutError);
  CHECK_THROWS_WITH_AS(pack({Array{{1, 2}}, Array{{1.0f, 2.0f}}, Array{{1, 2}}}, layout), doctest::Contains("float32"),
                       DTypeError);
  // torch.chunk would give 2, 2, 1 for 5 rows: 1, 3, 1 is not a valid sharding.
  CHECK_THROWS_WITH_AS(pack({Array{{1, 2}}, Array{{1, 2}, {3, 4}, {5, 6}}, Array{{1, 2}}}, layout),
                       doctest::Contains("component 0 (device CPU:0) has shape (1, 2)"), ShapeError);
  CHECK_THROWS_WITH_AS(pack({Array{{1, 2}}, Array{{1, 2, 3}}, Array{{1, 2}}}, layout),
                       doctest::Contains("device CPU:1"), ShapeError);
  // pack copies: writing to the caller's array afterwards leaves the tensor alone.
  Array mine{{1, 2}};
  Tensor replicated = pack({mine, mine, mine}, Layout::replicated(mesh, 2));
  mine.mutable_data<int32_t>()[0] = 9;
  CHECK(to_array(replicated).to_vector<int32_t>()[0] == 1);
}

TEST_CASE("PyTorch entry points: distribute_tensor, from_local, to_local, full_tensor, redistribute") {
  Mesh mesh = create_mesh({{"dp", 2}, {"tp", 2}});
  Array global = Array::from<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor t = distribute_tensor(global, mesh, {Shard{0}, Shard{1}});
  CHECK(t.layout().sharding_specs() == std::vector<std::string>{"dp", "tp"});
  CHECK(same_array(t.to_local(), Array::from<float>({0, 1, 4, 5}, {2, 2})));
  CHECK(same_array(t.full_tensor(), global));
  CHECK(same_array(t.redistribute({Replicate{}, Replicate{}}).to_local(), global));

  Tensor local = from_local(Array{{1.0f, 2.0f}}, mesh, {Shard{0}, Replicate{}});
  CHECK(local.shape() == std::vector<int64_t>{2, 2});
  CHECK(same_array(local.full_tensor(), Array{{1.0f, 2.0f}, {1.0f, 2.0f}}));
  Tensor summed = from_local(Array{1.0f, -2.0f}, mesh, {Partial{ReduceOp::Sum}, Partial{ReduceOp::Max}});
  CHECK(same_array(summed.full_tensor(), Array{2.0f, -4.0f}));
  Tensor uneven = from_local({Array{1, 2}, Array{1, 2}, Array{3}, Array{3}}, mesh, {Shard{0}, Replicate{}});
  CHECK(same_array(uneven.full_tensor(), Array{1, 2, 3}));
  Tensor given = from_local(Array{5, 6}, mesh, {Shard{0}, Replicate{}}, std::vector<int64_t>{4});
  CHECK(same_array(given.full_tensor(), Array{5, 6, 5, 6}));
  CHECK_THROWS_WITH_AS(from_local(Array{5, 6}, mesh, {Shard{0}, Replicate{}}, std::vector<int64_t>{3}),
                       doctest::Contains("device CPU:2"), ShapeError);
  CHECK_THROWS_WITH_AS(t.redistribute({Shard{0}}), doctest::Contains("1 placements for a 2-D mesh"), LayoutError);
  CHECK_THROWS_WITH_AS(t.redistribute({Shard{2}, Replicate{}}), doctest::Contains("Shard(2)"), LayoutError);
}

TEST_CASE("relayout moves across meshes (test_mesh_transfer.cpp); with_layout and wrong ranks are refused") {
  Mesh a = create_mesh({{"x", 2}}), b = create_mesh({{"x", 2}}, {"CPU:2", "CPU:3"});
  Tensor t = copy_to_mesh(Array{1, 2}, Layout({"x"}, a));
  CHECK(relayout(t, Layout({"x"}, b)).device_mesh() == b);
  CHECK_THROWS_WITH_AS(with_layout(t, Layout({"x"}, b)), doctest::Contains("mismatched meshes"), LayoutError);
  CHECK_THROWS_WITH_AS(relayout(t, Layout({"x", UNSHARDED}, a)), doctest::Contains("rank-2 layout"), LayoutError);
  CHECK_THROWS_WITH_AS(copy_to_mesh(Array{{1, 2}}, Layout({"x"}, a)), doctest::Contains("shape (1, 2)"), LayoutError);
  CHECK_THROWS_AS(Tensor().shape(), Error);
}

TEST_CASE("make_tensor_from_callback builds each shard from its region, on 1-D and 2-D meshes, even and uneven") {
  Array global = Array::from<float>([] {
    std::vector<float> v;
    for (int i = 0; i < 5 * 7; ++i) v.push_back(float(i));
    return v;
  }(), {5, 7});
  Mesh line = create_mesh({{"x", 3}}), grid = create_mesh({{"x", 2}, {"y", 2}});
  for (const Layout& layout : {Layout({"x", UNSHARDED}, line), Layout({UNSHARDED, "x"}, line), Layout({"x", "y"}, grid),
                               Layout({"y", UNSHARDED}, grid), Layout::replicated(grid, 2)}) {
    CAPTURE(layout.to_string());
    Tensor built = make_tensor_from_callback({5, 7}, layout, [&](const ShardBox& box) {
      Array local = Array::uninitialized(box.local_shape, DType::f32);
      copy_region(global, {0, 0}, local, box.global_offset, box.global_offset, box.local_shape);
      return local;
    });
    CHECK(built.layout() == layout);
    CHECK(same_array(built.full_tensor(), global));
    std::vector<Array> expected = unpack(copy_to_mesh(global, layout)), got = unpack(built);
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(same_array(got[i], expected[i]));
  }
  CHECK_THROWS_WITH_AS(make_tensor_from_callback({5, 7}, Layout({"x", UNSHARDED}, line),
                                                 [](const ShardBox&) { return Array::uninitialized({1, 7}, DType::f32); }),
                       doctest::Contains("returned shape (1, 7) for the region of shape (2, 7)"), ShapeError);
  CHECK_THROWS_WITH_AS(make_tensor_from_callback({5}, Layout({"x", UNSHARDED}, line),
                                                 [](const ShardBox& box) { return Array::uninitialized(box.local_shape, DType::f32); }),
                       doctest::Contains("rank-2 layout"), LayoutError);
}

TEST_CASE("visualize_sharding draws which device holds which block") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  Tensor t = ones({5, 4}, Layout({"x", "y"}, mesh));
  std::string expected =
      "+---------+---------+---------+\n"
      "|         | Col 0-1 | Col 2-3 |\n"
      "+---------+---------+---------+\n"
      "| Row 0-1 | CPU:0   | CPU:1   |\n"
      "| Row 2-3 | CPU:2   | CPU:3   |\n"
      "| Row 4-4 | CPU:4   | CPU:5   |\n"
      "+---------+---------+---------+\n";
  CHECK(visualize_sharding(t) == expected);
  std::string row = visualize_sharding(ones({4}, Layout({"y"}, mesh)), "v");
  CHECK(row.starts_with("v\n"));
  CHECK(row.find("| CPU:0, CPU:2, CPU:4 | CPU:1, CPU:3, CPU:5 |") != std::string::npos);
  CHECK(visualize_sharding(ones({4}, Layout::from_placements(mesh, {Partial{}, Shard{0}}, 1))).starts_with(
      "pending reductions: x: Partial(sum)"));
  CHECK_THROWS_WITH_AS(visualize_sharding(ones({1, 1, 1}, Layout::replicated(mesh, 3))), doctest::Contains("(1, 1, 1)"),
                       ShapeError);
  // An empty tensor says so, and still shows where its (empty) blocks live.
  const std::string empty = visualize_sharding(zeros({0, 4}, Layout({"x", "y"}, mesh)));
  CHECK(empty.starts_with("empty: shape (0, 4) has no elements"));
  CHECK(empty.find("| Row empty | CPU:0, CPU:2, CPU:4 | CPU:1, CPU:3, CPU:5 |") != std::string::npos);
  CHECK(visualize_sharding(zeros({0}, Layout({"x"}, mesh))).find("Col empty") != std::string::npos);
}

TEST_CASE("the raw Tensor constructor checks its components; factories name themselves in errors") {
  Mesh mesh = create_mesh({{"x", 2}});
  Layout rows({"x", UNSHARDED}, mesh);
  auto storage = [](std::vector<Array> components) { return std::make_shared<ShardedStorage>(ShardedStorage{std::move(components)}); };
  // 3 rows over 2 devices: blocks of 2 and 1 rows.
  Tensor ok({3, 2}, DType::i32, rows, storage({Array{{1, 2}, {3, 4}}, Array{{5, 6}}}));
  CHECK(same_array(ok.full_tensor(), Array{{1, 2}, {3, 4}, {5, 6}}));
  CHECK_THROWS_WITH_AS(Tensor({3, 2}, DType::i32, rows, storage({Array{{1, 2}, {3, 4}}, Array{{5, 6}, {7, 8}}})),
                       doctest::Contains("component 1 (device CPU:1) has shape (2, 2) but the layout gives it (1, 2)"), ShapeError);
  CHECK_THROWS_WITH_AS(Tensor({3, 2}, DType::i32, rows, storage({Array{{1, 2}, {3, 4}}})), doctest::Contains("1 components"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(Tensor({3, 2}, DType::f32, rows, storage({Array{{1, 2}, {3, 4}}, Array{{5, 6}}})),
                       doctest::Contains("component 0 (device CPU:0) is int32"), DTypeError);
  CHECK_THROWS_WITH_AS(Tensor({3}, DType::i32, rows, storage({Array{1, 2}, Array{3}})), doctest::Contains("rank-2 layout"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(Tensor({3, 2}, DType::i32, rows, nullptr), doctest::Contains("no storage"), Error);
  for (auto [name, make] : std::vector<std::pair<std::string, std::function<Tensor()>>>{
           {"ones:", [&] { return ones({3}, rows); }},
           {"zeros:", [&] { return zeros({3}, rows); }},
           {"empty:", [&] { return empty({3}, rows); }},
           {"full:", [&] { return full({3}, 2.0, rows); }}}) {
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(make(), doctest::Contains(name.c_str()), LayoutError);
  }
  CHECK_THROWS_WITH_AS(ones({3, -1}, rows), doctest::Contains("ones: shape (3, -1) has a negative extent"), ShapeError);
}

TEST_CASE("introspection of computed and empty tensors: explain, plan_summary, visualize_sharding, CommDebugMode") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(Array::from<float>({1, 2, 3, 4}, {4}), Layout({"x"}, mesh));
  Tensor y = reduce_sum(relu(x) * 2.0f);
  const std::string before = explain(y);
  CHECK(before.find("all_reduce") == std::string::npos);  // Partial(sum) until it is asked for
  CHECK(y.placements() == std::vector<Placement>{Partial{}});
  CommDebugMode comm;
  CHECK(y.full_tensor().to_vector<float>() == std::vector<float>{20});
  CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
  CHECK(comm.get_total_counts() == 1);
  // Once computed, the tensor is still explained by the program that computed it.
  CHECK(explain(y) == before);
  CHECK(plan_summary(y).collectives.empty());
  CHECK(plan_summary(relayout(y, Layout::replicated(mesh, 0))).collectives == std::vector<std::string>{"all_reduce(x)"});
  auto step = jit([](const Tensor& t) { return reduce_sum(t * t).redistribute(); });
  Tensor z = step(x);
  CHECK(explain(z).find("all_reduce") != std::string::npos);
  // An empty tensor still draws its (empty) blocks.
  const std::string drawn = visualize_sharding(zeros({0, 3}, Layout({"x", UNSHARDED}, mesh)));
  CHECK(drawn.find("CPU:0") != std::string::npos);
}

TEST_CASE("call_with_layout: the overview's ones and stateless_normal, made in the layout directly") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  Layout layout({"x", "y"}, mesh);
  auto ones_of = [&](std::vector<int64_t> shape) { return ones(shape, Layout::replicated(mesh, 2)); };
  Tensor t = call_with_layout(ones_of, layout, std::vector<int64_t>{6, 4});
  CHECK(t.layout() == layout);
  CHECK(plan_summary(t).collectives.empty());  // no device makes more than its own block
  for (const Array& c : unpack(t)) CHECK(same_array(c, Array{{1.0f, 1.0f}, {1.0f, 1.0f}}));
  auto normal = [&](std::vector<int64_t> shape, uint64_t seed) { return random_normal(shape, seed, Layout::replicated(mesh, 2)) * 2.0f; };
  Tensor r = call_with_layout(normal, layout, std::vector<int64_t>{6, 4}, uint64_t(1));
  CHECK(plan_summary(r).collectives.empty());
  CHECK(same_array(r.full_tensor(), normal({6, 4}, 1).full_tensor()));
}

TEST_CASE("PyTorch's factories: a mesh and placements (default Replicate); rand / randn follow manual_seed") {
  Mesh mesh = create_mesh({{"dp", 2}, {"tp", 2}});
  Tensor z = zeros({4, 6}, mesh, {Shard{0}, Shard{1}});
  CHECK(z.placements() == std::vector<Placement>{Shard{0}, Shard{1}});
  CHECK(z.full_tensor().to_vector<float>() == std::vector<float>(24, 0.0f));
  CHECK(ones({3}, mesh).placements() == std::vector<Placement>{Replicate{}, Replicate{}});
  CHECK(full({2, 2}, 2.5, mesh, {Replicate{}, Shard{0}}, DType::f64).full_tensor().to_vector<double>() ==
        std::vector<double>(4, 2.5));
  CHECK(empty({5}, mesh, {Shard{0}, Replicate{}}).shape() == std::vector<int64_t>{5});
  manual_seed(42);
  const std::vector<float> first = rand({5, 3}, mesh, {Shard{0}, Replicate{}}).full_tensor().to_vector<float>();
  const std::vector<float> second = rand({5, 3}, mesh).full_tensor().to_vector<float>();
  CHECK(first != second);  // successive draws differ
  for (float v : first) CHECK((v >= 0.0f && v < 1.0f));
  manual_seed(42);  // the same sequence again, whatever the placements
  CHECK(rand({5, 3}, mesh, {Replicate{}, Shard{1}}).full_tensor().to_vector<float>() == first);
  CHECK(rand({5, 3}, mesh, {Shard{1}, Shard{0}}).full_tensor().to_vector<float>() == second);
  const std::vector<float> normal = randn({1000}, mesh, {Shard{0}, Shard{0}}).full_tensor().to_vector<float>();
  double mean = 0;
  for (float v : normal) mean += v / 1000.0;
  CHECK(std::abs(mean) < 0.15);
  CHECK_THROWS_AS(zeros({4}, mesh, {Shard{0}}), LayoutError);  // one placement for a 2-dim mesh
}

TEST_CASE("TensorFlow's calls see no Partial: bias_add's gradient over a sharded batch is [unsharded], equal to Layout::replicated") {
  for (const Mesh& mesh : {create_mesh({{"batch", 2}}), create_mesh({{"batch", 3}, {"model", 2}})}) {
    CAPTURE(mesh.to_string());
    Tensor x = copy_to_mesh(Array::from<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3}), Layout({"batch", UNSHARDED}, mesh));
    Tensor bias = copy_to_mesh(Array::from<float>({0.5f, -1, 2}, {3}), Layout::replicated(mesh, 1));
    // tf.nn.bias_add(x, b), summed: db is the column count of rows, summed over the sharded batch.
    Tensor db = gradients(reduce_sum(x + bias), {bias})[0];
    CHECK(fetch_layout(db) == Layout::replicated(mesh, 1));
    CHECK(fetch_layout(db).sharding_specs() == std::vector<std::string>{UNSHARDED});
    CHECK(fetch_layout(db).to_string() == Layout::replicated(mesh, 1).to_string());
    CHECK(fmt::format("{}", to_array(db)) == "[4 4 4]");
    for (const Array& component : unpack(db)) CHECK(fmt::format("{}", component) == "[4 4 4]");
    CHECK(fmt::format("{}", db).find("partial") == std::string::npos);
    // A batch sum left Partial where PyTorch leaves it: TF's calls reduce it, PyTorch's do not.
    Tensor column_sums = reduce_sum(x, {0});
    CHECK(column_sums.placements()[0] == Placement{Partial{}});
    CHECK(fetch_layout(column_sums) == Layout::replicated(mesh, 1));
    CHECK(fmt::format("{}", to_array(column_sums)) == "[22 26 30]");
    for (const Array& component : unpack(column_sums)) CHECK(fmt::format("{}", component) == "[22 26 30]");
    CHECK(column_sums.placements()[0] == Placement{Partial{}});  // looking through TF's calls changed nothing
    CHECK(fmt::format("{}", column_sums.to_local()) == "[5 7 9]");  // device 0 holds rows 0 and 1 (torch.chunk)
  }
}
