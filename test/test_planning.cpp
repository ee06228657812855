// Planning a job before running it: the hardware profiles its times are predicted with.
#include <doctest/doctest.h>

#include <cstdlib>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <tessera/tessera.hpp>

using namespace tessera;

TEST_CASE("the published hardware profiles carry the datasheets' figures") {
  const Hardware h100 = hardware_profile("h100-sxm");
  CHECK(h100.device == DeviceKind::GPU);
  CHECK(h100.gemm_rate(DType::bf16) == doctest::Approx(989.4e12));
  CHECK(h100.gemm_rate(DType::f32) == doctest::Approx(494.7e12));  // TF32 tensor cores
  CHECK(h100.vector_rate(DType::f32) == doctest::Approx(67e12));
  CHECK(h100.memory_bytes == int64_t(81559) << 20);
  CHECK(h100.memory_bytes_per_second == doctest::Approx(3.35e12));
  CHECK(h100.intra_node.bytes_per_second == doctest::Approx(450e9));  // NVLink, one direction
  CHECK(h100.inter_node.bytes_per_second == doctest::Approx(50e9));   // NDR InfiniBand, one direction
  const Hardware h200 = hardware_profile("h200");
  CHECK(h200.gemm_rate(DType::bf16) == h100.gemm_rate(DType::bf16));
  CHECK(h200.memory_bytes == int64_t(143771) << 20);
  CHECK(h200.memory_bytes_per_second == doctest::Approx(4.8e12));
  CHECK(h100.gemm_rate(DType::i32) == 0);  // no figure: no rate, never a made-up one
  CHECK_THROWS_WITH_AS(hardware_profile("a100"), doctest::Contains("\"h100-sxm\", \"h200\", \"this-machine\""), Error);
}

TEST_CASE("a profile is plain data: JSON round trip, and typed errors naming the field") {
  Hardware custom = hardware_profile("h100-sxm");
  custom.name = "my-gpu";
  custom.gemm_flops[DType::f64] = 1.5e13;
  custom.inter_node.latency_seconds = 1e-5;
  CHECK(hardware_from_json(hardware_to_json(custom)) == custom);
  CHECK_THROWS_WITH_AS(hardware_from_json("{"), doctest::Contains("not JSON"), Error);
  std::string no_memory = hardware_to_json(custom);
  no_memory.replace(no_memory.find("\"memory_bytes\""), 14, "\"memory_bites\"");
  CHECK_THROWS_WITH_AS(hardware_from_json(no_memory), doctest::Contains("field 'memory_bytes'"), Error);
  std::string bad_dtype = hardware_to_json(custom);
  bad_dtype.replace(bad_dtype.find("\"bfloat16\""), 10, "\"bfloat17\"");
  CHECK_THROWS_AS(hardware_from_json(bad_dtype), DTypeError);
}

TEST_CASE("this machine's profile is measured once and kept beside the compile cache") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tessera_hw_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  const Hardware here = hardware_profile("this-machine");
  CHECK(here.device == DeviceKind::CPU);
  CHECK(here.name == "this-machine");
  for (DType d : {DType::f32, DType::f64}) {
    CHECK(here.gemm_rate(d) > 1e8);
    CHECK(here.vector_rate(d) > 1e7);
  }
  CHECK(here.memory_bytes > (int64_t(1) << 28));
  CHECK(here.memory_bytes_per_second > 1e8);
  CHECK(here.launch_seconds > 0);
  CHECK(here.intra_node.latency_seconds > 0);
  CHECK(here.intra_node.bytes_per_second > 1e7);
  CHECK(hardware_profile("this-machine") == here);  // the same process: measured once
  int json_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ++json_files;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(bytes.find("\"this-machine\"") != std::string::npos);  // the stored profile
  }
  CHECK(json_files == 1);
  unsetenv("TESSERA_CACHE_DIR");
  std::filesystem::remove_all(dir);
}
