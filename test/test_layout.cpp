#include <doctest/doctest.h>

#include <unordered_set>

#include <tessera/tessera.hpp>

using namespace tessera;

namespace {
Mesh mesh_3x2() { return create_mesh({{"x", 3}, {"y", 2}}); }
}  // namespace

TEST_CASE("sharding specs and placements are two views of one layout") {
  Mesh mesh = mesh_3x2();
  Layout l({"y", "x"}, mesh);
  CHECK(l.rank() == 2);
  CHECK(l.sharding_specs() == std::vector<std::string>{"y", "x"});
  CHECK(l.placements() == std::vector<Placement>{Shard{1}, Shard{0}});
  CHECK(Layout::from_placements(mesh, {Shard{1}, Shard{0}}, 2) == l);

  Layout hybrid({"x", UNSHARDED}, mesh);
  CHECK(hybrid.placements() == std::vector<Placement>{Shard{0}, Replicate{}});
  CHECK_FALSE(hybrid.is_fully_replicated());
  CHECK(Layout::replicated(mesh, 2).is_fully_replicated());
  CHECK(Layout::replicated(mesh, 2).placements() == std::vector<Placement>{Replicate{}, Replicate{}});

  Layout partial = Layout::from_placements(mesh, {Partial{ReduceOp::Max}, Shard{-1}}, 2);
  CHECK(partial.sharding_specs() == std::vector<std::string>{UNSHARDED, "y"});
  CHECK(partial.placements() == std::vector<Placement>{Partial{ReduceOp::Max}, Shard{1}});
  CHECK(partial.has_partial());
  CHECK_FALSE(partial.is_fully_replicated());
}

TEST_CASE("several mesh dims on one axis keep their order") {
  Mesh mesh = mesh_3x2();
  Layout xy({"x+y", UNSHARDED}, mesh), yx({"y+x", UNSHARDED}, mesh);
  CHECK(xy != yx);
  CHECK(xy.axis_mesh_dims()[0] == std::vector<int64_t>{0, 1});
  CHECK(yx.axis_mesh_dims()[0] == std::vector<int64_t>{1, 0});
  CHECK(xy.num_shards(0) == 6);
  // Placements lose the order; from_placements orders by mesh dim (PyTorch's convention).
  CHECK(yx.placements() == std::vector<Placement>{Shard{0}, Shard{0}});
  CHECK(Layout::from_placements(mesh, {Shard{0}, Shard{0}}, 2) == xy);
  // x+y: x splits 7 rows as 3,3,1; y then splits each x-chunk: device (0,1) holds rows 2..2.
  CHECK(xy.local_shape({7, 4}, 1) == std::vector<int64_t>{1, 4});
  CHECK(xy.local_shape({7, 4}, 4) == std::vector<int64_t>{1, 4});
  CHECK(xy.local_shape({7, 4}, 5) == std::vector<int64_t>{0, 4});
  // y+x: y splits 7 rows as 4,3; x then splits those: device (0,0) holds 2 rows.
  CHECK(yx.local_shape({7, 4}, 0) == std::vector<int64_t>{2, 4});
  CHECK(yx.local_shape({7, 4}, 5) == std::vector<int64_t>{1, 4});
}

TEST_CASE("factory layouts, delete_axes, num_shards and local_shape") {
  Mesh mesh = mesh_3x2();
  CHECK(Layout::batch_sharded(mesh, "x", 3).sharding_specs() == std::vector<std::string>{"x", UNSHARDED, UNSHARDED});
  CHECK(Layout::batch_sharded(mesh, "y", 3, 1).sharding_specs() == std::vector<std::string>{UNSHARDED, "y", UNSHARDED});
  CHECK(Layout::inner_sharded(mesh, "y", 2).sharding_specs() == std::vector<std::string>{UNSHARDED, "y"});
  Layout l({"x", UNSHARDED, "y"}, mesh);
  CHECK(l.delete_axes({0}).sharding_specs() == std::vector<std::string>{UNSHARDED, "y"});
  CHECK(l.delete_axes({0, 2}).sharding_specs() == std::vector<std::string>{UNSHARDED});
  CHECK(l.num_shards(0) == 3);
  CHECK(l.num_shards(1) == 1);
  CHECK(l.num_shards(2) == 2);
  // torch.chunk: 7 rows over 3 -> 3, 3, 1; 5 columns over 2 -> 3, 2.
  CHECK(l.local_shape({7, 2, 5}, 0) == std::vector<int64_t>{3, 2, 3});
  CHECK(l.local_shape({7, 2, 5}, 3) == std::vector<int64_t>{3, 2, 2});
  CHECK(l.local_shape({7, 2, 5}, 4) == std::vector<int64_t>{1, 2, 3});
  // 4 rows over 3 -> 2, 2, 0: the last shard is empty.
  CHECK(l.local_shape({4, 1, 1}, 5) == std::vector<int64_t>{0, 1, 0});
}

TEST_CASE("equal layouts hash alike: built apart, from another mesh handle, or by placements") {
  Mesh mesh = mesh_3x2();
  const Layout a({"x", UNSHARDED}, mesh);
  const Layout b = Layout::from_placements(create_mesh({{"x", 3}, {"y", 2}}), {Shard{0}, Replicate{}}, 2);
  REQUIRE(a == b);
  CHECK(a.hash() == b.hash());
  CHECK(std::hash<Layout>{}(a) == hash_value(b));
  const Layout partial = a.with_placement(1, Partial{ReduceOp::Sum});
  const std::unordered_set<Layout> set = {a, b, partial, Layout({UNSHARDED, "x"}, mesh), Layout({"x", UNSHARDED}, mesh)};
  CHECK(set.size() == 3);
  CHECK(set.count(partial.without_partial().with_placement(1, Partial{ReduceOp::Sum})) == 1);
}

TEST_CASE("Layout string form round trips, TF's and the extended one") {
  Mesh mesh = mesh_3x2();
  Layout l({"x", UNSHARDED}, mesh);
  CHECK(l.to_string() == "sharding_specs:x,unsharded, mesh:" + mesh.to_string());
  CHECK(Layout::from_string(l.to_string()) == l);
  std::string tf = "sharding_specs:unsharded, mesh:|x=6|0,1,2,3,4,5|0,1,2,3,4,5|/job:localhost/replica:0/task:0/device:CPU:0,"
                   "/job:localhost/replica:0/task:0/device:CPU:1,/job:localhost/replica:0/task:0/device:CPU:2,"
                   "/job:localhost/replica:0/task:0/device:CPU:3,/job:localhost/replica:0/task:0/device:CPU:4,"
                   "/job:localhost/replica:0/task:0/device:CPU:5";
  CHECK(Layout::from_string(tf) == Layout({UNSHARDED}, create_mesh({{"x", 6}})));
  Layout fancy = Layout::from_placements(create_mesh({{"x", 2}, {"y", 2}, {"z", 2}}),
                                         {Shard{1}, Partial{ReduceOp::Avg}, Shard{1}}, 2);
  CHECK(fancy.to_string().starts_with("sharding_specs:unsharded,x+z, partial:y=avg, mesh:|x=2,y=2,z=2|"));
  CHECK(Layout::from_string(fancy.to_string()) == fancy);
  Layout scalar = Layout::replicated(mesh, 0);
  CHECK(Layout::from_string(scalar.to_string()) == scalar);
  CHECK(fmt::format("{}", l) == "Layout.from_string(" + l.to_string() + ")");
}

TEST_CASE("Layout errors name what is wrong") {
  Mesh mesh = mesh_3x2();
  CHECK_THROWS_WITH_AS(Layout({"z"}, mesh), doctest::Contains("mesh dimension 'z'"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout({"x", "x"}, mesh), doctest::Contains("'x' is used twice"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout({"x+x"}, mesh), doctest::Contains("'x' is used twice"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout({""}, mesh), doctest::Contains("empty sharding spec"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_placements(mesh, {Shard{2}, Replicate{}}, 2),
                       doctest::Contains("Shard(2) on mesh dimension 'x' is out of range for a rank-2"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_placements(mesh, {Replicate{}}, 2), doctest::Contains("1 placements for a 2-D mesh"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(Layout::batch_sharded(mesh, "q", 2), doctest::Contains("'q'"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::batch_sharded(mesh, "x", 2, 5), doctest::Contains("axis 5 is out of range"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout({"x"}, mesh).local_shape({4, 4}, 0), doctest::Contains("rank 2"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout({"x"}, mesh).num_shards(1), doctest::Contains("axis 1 is out of range"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout({"x"}, mesh).delete_axes({3}), doctest::Contains("axis 3"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_string("specs:x, mesh:|x=3|0,1,2|0,1,2|CPU:0,CPU:1,CPU:2"),
                       doctest::Contains("does not start with 'sharding_specs:'"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_string("sharding_specs:x"), doctest::Contains("no 'mesh:' part"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_string("sharding_specs:x, mesh:|x=3|0,1|0,1,2|CPU:0,CPU:1,CPU:2"),
                       doctest::Contains("malformed layout string"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_string("sharding_specs:x, partial:x=sum, mesh:|x=3|0,1,2|0,1,2|CPU:0,CPU:1,CPU:2"),
                       doctest::Contains("both shard a tensor axis and hold Partial"), LayoutError);
  CHECK_THROWS_WITH_AS(Layout::from_string("sharding_specs:unsharded, partial:x=mean, mesh:|x=3|0,1,2|0,1,2|CPU:0,CPU:1,CPU:2"),
                       doctest::Contains("unknown reduce op 'mean'"), LayoutError);
  CHECK_THROWS_AS(Layout({"x"}, Mesh()), LayoutError);
}

TEST_CASE("TF Layout API: offset_to_shard and offset_tuple_to_global_index") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  Layout layout({"y", "x"}, mesh);
  // Device id (x, y) holds shard (y, x).
  std::vector<std::vector<int64_t>> want = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}};
  CHECK(layout.offset_to_shard() == want);
  CHECK(layout.offset_tuple_to_global_index({1, 2}) == 5);  // row-major over 2 x 3 shards
  CHECK(layout.offset_tuple_to_global_index({0, 1}) == 1);
  Layout nested({"x+y", UNSHARDED}, mesh);  // x major, y minor: 6 shards on axis 0
  CHECK(nested.offset_to_shard()[3] == std::vector<int64_t>{3, 0});
  CHECK(nested.offset_to_shard()[4] == std::vector<int64_t>{4, 0});
  CHECK(Layout::replicated(mesh, 2).offset_to_shard() == std::vector<std::vector<int64_t>>(6, {0, 0}));
  CHECK_THROWS_WITH_AS(layout.offset_tuple_to_global_index({0}), doctest::Contains("a tuple of 1 offsets"), LayoutError);
  CHECK_THROWS_WITH_AS(layout.offset_tuple_to_global_index({2, 0}), doctest::Contains("outside its 2 shards"), LayoutError);
}

TEST_CASE("placement helpers: is_shard, is_replicate, is_partial") {
  CHECK(is_shard(Shard{1}));
  CHECK(is_shard(Shard{1}, 1));
  CHECK(!is_shard(Shard{1}, 0));
  CHECK(!is_shard(Replicate{}));
  CHECK(is_replicate(Replicate{}));
  CHECK(!is_replicate(Partial{}));
  CHECK(is_partial(Partial{ReduceOp::Max}));
  CHECK(!is_partial(Shard{0}));
}

TEST_CASE("Layout strings with TF's full device names round-trip unchanged") {
  const std::string device = "/job:localhost/replica:0/task:0/device:CPU:";
  const std::string mesh_2 = "|x=2|0,1|0,1|" + device + "0," + device + "1";
  const std::string mesh_2x2 = "|x=2,y=2|0,1,2,3|0,1,2,3|" + device + "0," + device + "1," + device + "2," + device + "3";
  // Equal layouts on the same devices in the short spelling, made first: a layout string must
  // not come back in their spelling (or with their mesh's name).
  const Layout short_2 = Layout({"x"}, create_mesh({{"x", 2}})), short_2x2 = Layout({"y", "x"}, create_mesh({{"x", 2}, {"y", 2}}));
  const Layout named = Layout({"y", "x"}, Mesh::from_string("other" + mesh_2x2));
  for (const std::string& text : {"sharding_specs:x, mesh:" + mesh_2, "sharding_specs:unsharded, mesh:" + mesh_2,
                                 "sharding_specs:y,x, mesh:" + mesh_2x2, "sharding_specs:x+y,unsharded, mesh:" + mesh_2x2,
                                 "sharding_specs:x, partial:y=sum, mesh:" + mesh_2x2, "sharding_specs:y,x, mesh:tf" + mesh_2x2}) {
    CAPTURE(text);
    const Layout layout = Layout::from_string(text);
    CHECK(layout.to_string() == text);
    CHECK(Layout::from_string(layout.to_string()).to_string() == text);
  }
  CHECK(Layout::from_string("sharding_specs:x, mesh:" + mesh_2) == short_2);  // equal all the same
  CHECK(Layout::from_string("sharding_specs:y,x, mesh:" + mesh_2x2) == short_2x2);
  CHECK(short_2x2.to_string() == "sharding_specs:y,x, mesh:|x=2,y=2|0,1,2,3|0,1,2,3|CPU:0,CPU:1,CPU:2,CPU:3");
  CHECK(named.to_string() == "sharding_specs:y,x, mesh:other" + mesh_2x2);
}
