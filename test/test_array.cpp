#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include <tessera/tessera.hpp>

using namespace tessera;

TEST_CASE("nested braces pick TF's dtypes and shapes") {
  Array a{{1, 2, 3}, {4, 5, 6}};
  CHECK(a.dtype() == DType::i32);
  CHECK(a.shape() == std::vector<int64_t>{2, 3});
  CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  Array f{1.5, 2.5};
  CHECK(f.dtype() == DType::f32);
  CHECK(f.to_vector<float>() == std::vector<float>{1.5f, 2.5f});
  Array b{true, false};
  CHECK(b.dtype() == DType::u8);
  Array cube{{{1, 2}}, {{3, 4}}};
  CHECK(cube.shape() == std::vector<int64_t>{2, 1, 2});
  CHECK_THROWS_WITH_AS((Array{{1, 2}, {3}}), doctest::Contains("ragged"), ShapeError);
}

TEST_CASE("every dtype stores and converts") {
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16}) {
    Array a({3}, d);
    CHECK(a.nbytes() == 3 * dtype_size(d));
    store_from_double(a.mutable_bytes(), d, 1, 1.0);
    CHECK(a.element_as_double(0) == 0.0);
    CHECK(a.element_as_double(1) == 1.0);
    CHECK(dtype_from_name(dtype_name(d)) == d);
  }
  CHECK_THROWS_WITH_AS(dtype_from_name("complex64"), doctest::Contains("'complex64'"), DTypeError);
  CHECK(Array::from<int64_t>({1, 2}, {2}).dtype() == DType::i64);
  CHECK(Array::from<double>({1, 2}, {2}).dtype() == DType::f64);
  CHECK(Array::from<bool>({true, false}, {2}).to_vector<bool>() == std::vector<bool>{true, false});
}

TEST_CASE("bf16 and f16 round to nearest even") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(3.140625f)) == 3.140625f);
  CHECK(bf16_to_float(float_to_bf16(1.00390625f)) == 1.0f);  // halfway: to even
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 5.9604645e-08f, 0.333251953125f})
    CHECK(f16_to_float(float_to_f16(v)) == v);
  CHECK(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  CHECK(f16_to_float(float_to_f16(1.00048828125f)) == 1.0f);  // halfway between 1 and 1+2^-10
  CHECK(f16_to_float(float_to_f16(2.98023224e-08f)) == 0.0f);  // half of the smallest subnormal: to even (0)
  CHECK(f16_to_float(float_to_f16(8.94069672e-08f)) == 1.1920929e-07f);  // 1.5 subnormal steps: to even (2)
}

TEST_CASE("copies share the buffer; clone copies") {
  Array a{1, 2, 3};
  Array shared = a;
  Array copy = a.clone();
  a.mutable_data<int32_t>()[0] = 42;
  CHECK(shared.to_vector<int32_t>()[0] == 42);
  CHECK(copy.to_vector<int32_t>()[0] == 1);
  CHECK(shared.shares_buffer_with(a));
  CHECK_FALSE(copy.shares_buffer_with(a));
}

TEST_CASE("numpy-style printing") {
  CHECK(fmt::format("{}", Array{{0, 1}, {2, 3}}) == "[[0 1] [2 3]]");
  CHECK(fmt::format("{}", Array{1.0f, 0.5f}) == "[1 0.5]");
  CHECK(fmt::format("{}", Array{true, false}) == "[True False]");
  CHECK(fmt::format("{}", Array::scalar<float>(0.0368092842f)) == "0.0368092842");
  CHECK(fmt::format("{}", Array::from<int32_t>({}, {0})) == "[]");
  std::vector<int32_t> many(2000);
  for (int i = 0; i < 2000; ++i) many[i] = i;
  CHECK(fmt::format("{}", Array::from(many, {2000})) == "[0 1 2 ... 1997 1998 1999]");
  std::vector<int32_t> grid(40 * 40, 7);
  CHECK(fmt::format("{}", Array::from(grid, {40, 40})).starts_with("[[7 7 7 ... 7 7 7] [7 7 7 ... 7 7 7] [7 7 7 ... 7 7 7] ... [7"));
}

TEST_CASE("Array errors") {
  CHECK_THROWS_WITH_AS(Array::from<float>({1, 2, 3}, {2, 2}), doctest::Contains("3 values do not fill"), ShapeError);
  CHECK_THROWS_WITH_AS((Array{1, 2}.to_vector<float>()), doctest::Contains("holds int32, not float32"), DTypeError);
  CHECK_THROWS_WITH_AS(Array({2, -1}, DType::f32), doctest::Contains("negative extent on axis 1"), ShapeError);
}

TEST_CASE("a device array is read on the host through its mirror, once, and never written there") {
  // Device memory stands in as a host buffer whose only way out is the download function: what a
  // Device gives Array (backend/cuda/cuda_device's copies a GPU's memory the same way).
  Array source = Array::from<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  std::shared_ptr<std::byte[]> memory(new std::byte[24]);
  std::memcpy(memory.get(), source.bytes(), 24);
  int downloads = 0;
  auto download = [&](const std::byte* device, std::byte* host, int64_t bytes) {
    ++downloads;
    std::memcpy(host, device, size_t(bytes));
  };
  Array device = Array::device_view(memory, memory.get(), {2, 3}, DType::f32, MemorySpace::Cuda, download);
  CHECK(device.memory_space() == MemorySpace::Cuda);
  CHECK(device.device_bytes() == memory.get());
  CHECK(downloads == 0);  // nothing moves until the host reads
  CHECK(device.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  Array copy = device;  // copies share the mirror
  CHECK(copy.element_as_double(5) == 6);
  CHECK(downloads == 1);
  // A subview is its own device array over the same memory.
  Array row = device.subview(12, {3});
  CHECK(row.memory_space() == MemorySpace::Cuda);
  CHECK(row.to_vector<float>() == std::vector<float>{4, 5, 6});
  CHECK(downloads == 2);
  // clone() is a host array; host writes to device memory are refused.
  Array host = device.clone();
  CHECK(host.memory_space() == MemorySpace::Host);
  host.mutable_data<float>()[0] = 9;
  CHECK(device.to_vector<float>()[0] == 1);
  CHECK_THROWS_WITH_AS(device.mutable_bytes(), doctest::Contains("cuda memory is written on the host"), InternalError);
}
