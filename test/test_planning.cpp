// Planning a job before running it: the hardware profiles its times are predicted with.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <tessera/tessera.hpp>

#include "plan/cache_residency.hpp"
#include "plan/call_sequence_plan.hpp"
#include "jit/device_workers.hpp"
#include "jit/step_profiler.hpp"
#include "dsl/buffer_pool.hpp"
#include "dsl/memory_counter.hpp"
#include "plan_checks.hpp"
#include "spinning_processes.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST_CASE("the published hardware profiles carry the datasheets' figures") {
  const Hardware h100 = hardware_profile("h100-sxm");
  CHECK(h100.device == DeviceKind::GPU);
  CHECK(h100.gemm_rate(DType::bf16) == doctest::Approx(989.4e12));
  CHECK(h100.gemm_rate(DType::f32) == doctest::Approx(494.7e12));  // TF32 tensor cores
  CHECK(h100.vector_rate(DType::f32) == doctest::Approx(67e12));
  CHECK(h100.memory_bytes == int64_t(81559) << 20);
  CHECK(h100.memory_bytes_per_second == doctest::Approx(3.35e12));
  CHECK(h100.intra_node.bytes_per_second == doctest::Approx(370e9));  // NVLink's 450 one way, less NCCL's protocol (nccl-tests#212)
  CHECK(h100.inter_node.bytes_per_second == doctest::Approx(50e9));   // NDR InfiniBand, one direction
  const Hardware h200 = hardware_profile("h200");
  CHECK(h200.gemm_rate(DType::bf16) == h100.gemm_rate(DType::bf16));
  CHECK(h200.memory_bytes == int64_t(143771) << 20);
  CHECK(h200.memory_bytes_per_second == doctest::Approx(4.8e12));
  CHECK(h100.gemm_rate(DType::i32) == 0);  // no figure: no rate, never a made-up one
  const Hardware a100 = hardware_profile("a100-sxm4-80gb"), a100_40 = hardware_profile("a100-sxm4-40gb");
  CHECK(a100.gemm_rate(DType::bf16) == doctest::Approx(312e12));
  CHECK(a100.gemm_rate(DType::f32) == doctest::Approx(156e12));  // TF32
  CHECK(a100.vector_rate(DType::f32) == doctest::Approx(19.5e12));
  CHECK(a100.memory_bytes == int64_t(81920) << 20);
  CHECK(a100.memory_bytes_per_second == doctest::Approx(2.039e12));
  CHECK(a100.intra_node.bytes_per_second == doctest::Approx(300e9 * 370 / 450));  // NVLink 3, one way, as NCCL moves it
  CHECK(a100.inter_node.bytes_per_second == doctest::Approx(25e9));   // HDR InfiniBand
  CHECK(a100_40.gemm_rate(DType::bf16) == a100.gemm_rate(DType::bf16));
  CHECK(a100_40.memory_bytes == int64_t(40960) << 20);
  CHECK(a100_40.memory_bytes_per_second == doctest::Approx(1.555e12));
  const Hardware mi300x = hardware_profile("mi300x");
  CHECK(mi300x.gemm_rate(DType::bf16) == doctest::Approx(1307.4e12));
  CHECK(mi300x.memory_bytes == int64_t(192) << 30);
  CHECK(mi300x.memory_bytes_per_second == doctest::Approx(5.3e12));
  const Hardware b200 = hardware_profile("b200");
  CHECK(b200.gemm_rate(DType::bf16) == doctest::Approx(2250e12));
  CHECK(b200.memory_bytes_per_second == doctest::Approx(8e12));
  CHECK(b200.intra_node.bytes_per_second == doctest::Approx(900e9 * 370 / 450));  // NVLink 5, one way, as NCCL moves it
  CHECK(mi300x.intra_node.bytes_per_second == doctest::Approx(448e9));  // no published NCCL figure: the line rate
  for (const std::string& name : published_hardware_names()) {
    CAPTURE(name);
    const Hardware h = hardware_profile(name);
    CHECK(h.name == name);
    CHECK_NOTHROW(check_hardware(h, name));
    CHECK(hardware_from_json(hardware_to_json(h)) == h);
  }
  CHECK_THROWS_WITH_AS(hardware_profile("a100"),
                       doctest::Contains("\"h100-sxm\", \"h200\", \"a100-sxm4-80gb\", \"a100-sxm4-40gb\", \"mi300x\", \"b200\", \"this-machine\""),
                       Error);
}

TEST_CASE("a chosen plan, evaluated: exactly its step's plan, pipelined, accumulating or neither, and refused by name where it cannot run") {
  const Hardware h100 = hardware_profile("h100-sxm");
  CHECK(parse_plan_mesh("pp=8,dp=16,tp=8") == std::vector<std::pair<std::string, int64_t>>{{"pp", 8}, {"dp", 16}, {"tp", 8}});
  CHECK(parse_plan_mesh("tp=2,dp=4,sp=1") == std::vector<std::pair<std::string, int64_t>>{{"dp", 4}, {"tp", 2}});  // mesh order, size 1 left out
  CHECK(parse_plan_mesh("dp=1") == std::vector<std::pair<std::string, int64_t>>{{"dp", 1}});
  CHECK_THROWS_WITH_AS(parse_plan_mesh("xp=2"), doctest::Contains("unknown mesh dim 'xp'"), Error);
  CHECK_THROWS_WITH_AS(parse_plan_mesh("dp=2,dp=4"), doctest::Contains("'dp' is named twice"), Error);
  CHECK_THROWS_WITH_AS(parse_plan_mesh("dp=two"), doctest::Contains("dp's size 'two' is not a whole number"), Error);
  CHECK_THROWS_WITH_AS(parse_plan_mesh("dp=0"), doctest::Contains("dp's size '0'"), Error);
  CHECK_THROWS_WITH_AS(parse_plan_mesh("dp"), doctest::Contains("'dp' is not dim=size"), Error);
  const TransformerConfig config = transformer_preset("llama-tiny");  // 2 layers, 4 heads, 2 kv heads
  const int64_t budget = int64_t(80) << 30;
  auto chosen = [](std::string mesh, int64_t microbatches = 1) {
    ParallelCandidate c;
    c.mesh = parse_plan_mesh(mesh);
    c.microbatches = microbatches;
    return c;
  };
  // Unpipelined, one pass: the Transformer's own step.
  const ParallelCandidate plain = evaluate_plan(config, chosen("dp=2,tp=2"), h100, budget, 8);
  const PlanReport own = plan_transformer_training_step(config, abstract_mesh({{"dp", 2}, {"tp", 2}}, h100, 8), false, false, 8);
  CHECK(plain.exact);
  CHECK(plain.fits);
  CHECK(plain.report.peak_bytes == own.peak_bytes);
  CHECK(plain.report.flops == own.flops);
  CHECK(plain.report.predicted_seconds == own.predicted_seconds);
  // Pipelined (1F1B) and gradient accumulation without pp: the pipelined step's plans.
  const ParallelCandidate piped = evaluate_plan(config, chosen("pp=2,dp=2", 4), h100, budget, 8);
  CHECK(piped.name() == "pp=2,dp=2 +1f1b x4");
  CHECK(piped.report.peak_bytes ==
        plan_pipelined_transformer_training_step(config, abstract_mesh({{"pp", 2}, {"dp", 2}}, h100, 8), false, false, 8, 4).peak_bytes);
  const ParallelCandidate accumulating = evaluate_plan(config, chosen("dp=2", 4), h100, budget, 8);
  CHECK(accumulating.name() == "dp=2 +accumulate x4");
  CHECK(accumulating.report.peak_bytes == plan_transformer_training_step(config, abstract_mesh({{"dp", 2}}, h100, 8), false, false, 8, 4).peak_bytes);
  // Four microbatches of one sequence hold less than one pass over all four of a replica's.
  CHECK(accumulating.report.peak_bytes < evaluate_plan(config, chosen("dp=2"), h100, budget, 8).report.peak_bytes);
  // Options and the budget.
  ParallelCandidate options = chosen("dp=2,tp=2");
  options.fsdp = options.sequence_parallel = true;
  options.activation_checkpointing = CheckpointPolicy::Full;
  options.mixed_precision = kBf16MixedPrecision;
  const ParallelCandidate with_options = evaluate_plan(config, options, h100, budget, 8);
  TransformerConfig recomputed = config;
  recomputed.activation_checkpointing = CheckpointPolicy::Full;
  recomputed.mixed_precision = kBf16MixedPrecision;
  CHECK(with_options.report.peak_bytes ==
        plan_transformer_training_step(recomputed, abstract_mesh({{"dp", 2}, {"tp", 2}}, h100, 8), true, true, 8).peak_bytes);
  CHECK_FALSE(evaluate_plan(config, chosen("dp=2,tp=2"), h100, 1024, 8).fits);
  // What cannot run is named.
  CHECK_THROWS_WITH_AS(evaluate_plan(config, chosen("pp=4"), h100, budget, 8), doctest::Contains("pp=4 does not divide the model's 2 layers"), Error);
  CHECK_THROWS_WITH_AS(evaluate_plan(config, chosen("tp=4"), h100, budget, 8), doctest::Contains("tp=4 does not divide the 4 heads and 2 kv heads"),
                       Error);
  CHECK_THROWS_WITH_AS(evaluate_plan(config, chosen("ep=2"), h100, budget, 8), doctest::Contains("ep needs a model with MoE layers"), Error);
  CHECK_THROWS_WITH_AS(evaluate_plan(config, chosen("dp=3"), h100, budget, 8), doctest::Contains("does not split over dp x ep = 3"), Error);
  CHECK_THROWS_WITH_AS(evaluate_plan(config, chosen("dp=2", 3), h100, budget, 8), doctest::Contains("do not split into 3 microbatches"), Error);
  ParallelCandidate fsdp_alone = chosen("tp=2");
  fsdp_alone.fsdp = true;
  CHECK_THROWS_WITH_AS(evaluate_plan(config, fsdp_alone, h100, budget, 8), doctest::Contains("fsdp shards over dp"), Error);
  CHECK_THROWS_WITH_AS(evaluate_plan(transformer_preset("moe-tiny"), chosen("ep=3"), h100, budget, 6), doctest::Contains("does not divide the"),
                       Error);
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
  // The optional parts of a CPU's profile: cores, special functions, small GEMMs' efficiency.
  custom.cores = 4;
  custom.special_functions_per_second = {{DType::f32, {{SpecialFunction::exp, 2e9}, {SpecialFunction::tanh, 1e9}}}};
  custom.gemm_efficiency = {{10, 0.5}, {100, 1.0}};
  CHECK(hardware_from_json(hardware_to_json(custom)) == custom);
  {
    // One number for a dtype: every special function at that rate. A name that is none is an error.
    nlohmann::json j = nlohmann::json::parse(hardware_to_json(custom));
    j["special_functions_per_second"] = {{"float32", 3e9}};
    const Hardware one_rate = hardware_from_json(j.dump());
    for (SpecialFunction f : kSpecialFunctions) CHECK(one_rate.special_function_rate(DType::f32, f) == 3e9);
    CHECK(one_rate.special_function_rate(DType::f64, SpecialFunction::exp) == 0);
    j["special_functions_per_second"] = {{"float32", {{"exp", 2e9}, {"sinh", 1e9}}}};
    CHECK_THROWS_WITH_AS(hardware_from_json(j.dump()), doctest::Contains("'special_functions_per_second.float32' names 'sinh'"), Error);
  }
  custom.gemm_efficiency_by_dtype[DType::bf16] = {{10, 0.25}, {100, 1.0}};
  CHECK(hardware_from_json(hardware_to_json(custom)) == custom);
  custom.cache_bytes = int64_t(1) << 21;
  custom.cache_bytes_per_second = 2e11;
  CHECK(hardware_from_json(hardware_to_json(custom)) == custom);
  std::string no_cache_rate = hardware_to_json(custom);
  no_cache_rate.replace(no_cache_rate.find("\"cache_bytes_per_second\""), 24, "\"cache_bites_per_second\"");
  CHECK_THROWS_WITH_AS(hardware_from_json(no_cache_rate), doctest::Contains("field 'cache_bytes_per_second'"), Error);
  custom.shared_cache_bytes = int64_t(1) << 25;
  custom.shared_cache_bytes_per_second = 6e10;
  CHECK(hardware_from_json(hardware_to_json(custom)) == custom);
  std::string no_shared_rate = hardware_to_json(custom);
  no_shared_rate.erase(no_shared_rate.find("\"shared_cache_bytes_per_second\""), 47);
  CHECK_THROWS_WITH_AS(hardware_from_json(no_shared_rate), doctest::Contains("field 'shared_cache_bytes_per_second'"), Error);
  std::swap(custom.gemm_efficiency_by_dtype[DType::bf16][0], custom.gemm_efficiency_by_dtype[DType::bf16][1]);
  CHECK_THROWS_WITH_AS(hardware_from_json(hardware_to_json(custom)),
                       doctest::Contains("'gemm_efficiency_by_dtype.bfloat16' is not sorted"), Error);
  custom.gemm_efficiency_by_dtype.clear();
  std::swap(custom.gemm_efficiency[0], custom.gemm_efficiency[1]);
  CHECK_THROWS_WITH_AS(hardware_from_json(hardware_to_json(custom)), doctest::Contains("'gemm_efficiency' is not sorted"), Error);
}

TEST_CASE("a small GEMM runs at the fraction of the peak its intensity reaches") {
  Hardware h = hardware_profile("a100-sxm4-80gb");
  const double peak = h.gemm_rate(DType::f32);
  CHECK(h.gemm_rate(DType::f32, 3.0) == peak);  // no curve: the peak
  h.gemm_efficiency = {{10, 0.5}, {100, 1.0}};
  CHECK(h.gemm_rate(DType::f32, 10) == doctest::Approx(0.5 * peak));
  CHECK(h.gemm_rate(DType::f32, 5) == doctest::Approx(0.25 * peak));             // below: in proportion
  CHECK(h.gemm_rate(DType::f32, std::sqrt(1000.0)) == doctest::Approx(0.75 * peak));  // halfway on a log scale
  CHECK(h.gemm_rate(DType::f32, 1e4) == doctest::Approx(peak));
  // A dtype with its own curve follows it; the others follow gemm_efficiency.
  h.gemm_efficiency_by_dtype[DType::bf16] = {{10, 0.25}, {100, 1.0}};
  CHECK(h.gemm_rate(DType::bf16, 10) == doctest::Approx(0.25 * h.gemm_rate(DType::bf16)));
  CHECK(h.gemm_rate(DType::f16, 10) == doctest::Approx(0.5 * h.gemm_rate(DType::f16)));
}

TEST_CASE("a GEMM split over a device's cores is charged its bytes after its arithmetic, one on a single core beside it") {
  Hardware h = hardware_profile("a100-sxm4-80gb");
  h.device = DeviceKind::CPU;
  h.gemm_efficiency.clear();
  h.gemm_efficiency_by_dtype.clear();
  h.gemm_flops[DType::f32] = 1e12;
  h.memory_bytes_per_second = 1e10;  // 768 KiB of operands and product: 78.6 us, the arithmetic 33.6 us
  h.cache_bytes = h.shared_cache_bytes = 0;
  h.launch_seconds = 1e-6;
  auto product = jit([](const Tensor& a, const Tensor& b) { return matmul(a, b); });
  auto gemm_step = [&](int64_t cores) {
    h.cores = cores;
    const Mesh one = abstract_mesh({{"x", 1}}, h, 8);
    const PlanReport r = product.plan(zeros({256, 256}, Layout::replicated(one, 2), DType::f32),
                                      zeros({256, 256}, Layout::replicated(one, 2), DType::f32));
    REQUIRE(r.steps.size() == 1);
    REQUIRE(r.steps[0].name == "gemm");
    return r.steps[0];
  };
  const double flops = 2.0 * 256 * 256 * 256, bytes = 3.0 * 256 * 256 * 4;
  const PlanReport::Part one_core = gemm_step(1), two_cores = gemm_step(2);
  CHECK(one_core.flops == flops);
  CHECK(double(one_core.bytes) == bytes);
  CHECK(one_core.seconds == doctest::Approx(1e-6 + std::max(flops / 1e12, bytes / 1e10)));
  CHECK(two_cores.seconds == doctest::Approx(1e-6 + flops / 1e12 + bytes / 1e10));
}

TEST_CASE("Hopper profiles run GEMMs at the efficiency XLA's sm_90 table measured for their shape") {
  // dsl/published_gpu_efficiency.cpp: medians of OpenXLA's measured H100 GEMMs by intensity.
  for (const std::string& name : {std::string("h100-sxm"), std::string("h200")}) {
    CAPTURE(name);
    const Hardware h = hardware_profile(name);
    const auto intensity = [](double m, double n, double k) { return m * n * k / (m * n + n * k + m * k); };
    // A 4096^3 bf16 GEMM: about 80% of the 989.4 TFLOP/s peak; a square 512: about a fifth.
    CHECK(h.gemm_rate(DType::bf16, intensity(4096, 4096, 4096)) == doctest::Approx(0.79 * 989.4e12).epsilon(0.02));
    CHECK(h.gemm_rate(DType::bf16, intensity(512, 512, 512)) == doctest::Approx(0.20 * 989.4e12).epsilon(0.1));
    CHECK(h.gemm_rate(DType::f16, 1000) == h.gemm_rate(DType::bf16, 1000));
    // f32 operands run on the TF32 units, at their own curve: 70% of 494.7 at the largest.
    CHECK(h.gemm_rate(DType::f32, 2000) == doctest::Approx(0.701 * 494.7e12));
    // The efficiency never falls as the intensity grows.
    for (double i = 4; i < 4000; i *= 1.3) CHECK(h.gemm_rate(DType::bf16, i * 1.3) >= h.gemm_rate(DType::bf16, i));
  }
  // Attention runs on Tessera's CUDA kernels: f32 on the CUDA cores, 6.5 TFLOP/s measured on an
  // H200; bf16 and f16 on the tensor cores, 19.2 TFLOP/s there.
  CHECK(hardware_profile("h100-sxm").attention_rate(DType::f32) == doctest::Approx(6.5e12));
  CHECK(hardware_profile("h100-sxm").attention_rate(DType::bf16) == doctest::Approx(19.2e12));
  CHECK(hardware_profile("h100-sxm").attention_rate(DType::f16) == doctest::Approx(19.2e12));
  CHECK(hardware_profile("a100-sxm4-80gb").attention_rate(DType::f32) == doctest::Approx(19.5e12 * 6.5 / 67));
  // Families without a published table keep the peak.
  CHECK(hardware_profile("a100-sxm4-80gb").gemm_rate(DType::bf16, 1000) == doctest::Approx(312e12));
}

TEST_CASE("fused attention is costed at the profile's attention rate where it has one, else as GEMMs of its shape") {
  const Mesh mesh = create_mesh({{"x", 2}});
  auto step = jit([](const Tensor& q, const Tensor& k, const Tensor& v) { return scaled_dot_product_attention(q, k, v, true); });
  const Layout heads = Layout::from_placements(mesh, {Shard{0}}, 3);
  const Tensor q = full({2, 2048, 128}, 0.1, heads), k = full({2, 2048, 128}, 0.2, heads), v = full({2, 2048, 128}, 0.3, heads);
  auto attention_part = [](const PlanReport& r) {
    for (const PlanReport::Part& part : r.by_op_kind)
      if (part.name == "attention") return part;
    FAIL("no attention step in the plan");
    return PlanReport::Part{};
  };
  Hardware h = hardware_profile("h100-sxm");
  const PlanReport::Part fused = attention_part(step.plan(h, q, k, v));
  CHECK(fused.flops > 0);
  CHECK(fused.seconds == doctest::Approx(fused.flops / 6.5e12 + double(fused.steps) * h.launch_seconds));
  h.attention_flops.clear();  // a profile without one: the tensor units' GEMM rate at the scores' intensity
  const PlanReport::Part as_gemms = attention_part(step.plan(h, q, k, v));
  CHECK(as_gemms.flops == fused.flops);
  CHECK(as_gemms.seconds < fused.seconds / 2);
  h.attention_flops[DType::f32] = -1;
  CHECK_THROWS_WITH_AS(check_hardware(h, "mine"), doctest::Contains("'attention_flops.float32' is -1"), Error);
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
  CHECK(here.cores == sysconf(_SC_NPROCESSORS_ONLN));
  for (DType d : {DType::f32, DType::f64})
    for (SpecialFunction f : kSpecialFunctions) CHECK(here.special_function_rate(d, f) > 1e6);
  // The cores' L2s, where the kernel reports them: never slower than the memory behind them.
  CHECK((here.cache_bytes == 0 || here.cache_bytes_per_second >= here.memory_bytes_per_second));
  REQUIRE(!here.gemm_efficiency.empty());  // small GEMMs below the peak, the largest at it
  CHECK(std::is_sorted(here.gemm_efficiency.begin(), here.gemm_efficiency.end()));
  CHECK(here.gemm_efficiency.back().second <= 1.0);
  // bf16 GEMMs have their own curve; bf16 and f16 kernels their own rates (each op rounded).
  REQUIRE(here.gemm_efficiency_by_dtype.count(DType::bf16));
  CHECK(here.gemm_efficiency_by_dtype.at(DType::bf16).back().second <= 1.0);
  for (DType d : {DType::bf16, DType::f16}) CHECK(here.vector_rate(d) > 1e7);
  CHECK(hardware_profile("this-machine") == here);  // the same process: measured once
  int json_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ++json_files;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(bytes.find("\"this-machine\"") != std::string::npos);  // the stored profile
  }
  CHECK(json_files <= 1);  // stored where the machine was quiet (the next case takes one under load)
  // Measured again on request: the process then plans with the new calibration, devices sharing
  // the machine with its new one-core figures.
  const Hardware again = recalibrate_this_machine();
  CHECK(again.gemm_rate(DType::f32) > 1e8);
  CHECK(hardware_profile("this-machine") == again);
  CHECK(this_machine_device(1) == again);
  unsetenv("TESSERA_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

TEST_CASE("a calibration taken while other processes hold the cores is kept, marked noisy, until one is asked for") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tessera_hw_busy_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  {
    const SpinningProcesses others;  // as a build or a test run beside it would
    const Hardware loaded = recalibrate_this_machine();
    CHECK(loaded.gemm_rate(DType::f32) > 1e8);
    CHECK(hardware_profile("this-machine") == loaded);  // this process plans with what it measured
    // Stored for later processes, marked as taken under load, so none blocks to measure again.
    int noisy = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() != ".json") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      noisy += bytes.find("\"quiet\": false") != std::string::npos;
      const std::string share_key = "\"others_share\":";
      const size_t share = bytes.find(share_key);
      REQUIRE(share != std::string::npos);
      CHECK(std::stod(bytes.substr(share + share_key.size())) > 0.2);  // about half the cores' time went to the spinners
    }
    CHECK(noisy == 2);  // the whole machine and one core
  }
  (void)recalibrate_this_machine();  // the rest of this process plans with the quiet machine
  unsetenv("TESSERA_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

TEST_CASE("plan() given a Hardware measures nothing; calibration programs stay out of TESSERA_PROFILE's table") {
  const Mesh mesh = create_mesh({{"x", 2}});
  auto step = jit([](const Tensor& a, const Tensor& b) { return matmul(a, b); });
  const Tensor a = distribute_tensor(Array({256, 256}, DType::f32), mesh, {Shard{0}});
  const Tensor b = distribute_tensor(Array({256, 256}, DType::f32), mesh);
  const int64_t before = calibrations_taken();
  const PlanReport report = step.plan(hardware_profile("h100-sxm"), a, b);
  CHECK(calibrations_taken() == before);
  CHECK(report.hardware == "h100-sxm");
  CHECK(report.flops == doctest::Approx(2.0 * 128 * 256 * 256));
  CHECK(report.predicted_seconds > 0);
  // The same plan predicted with this machine's own profile has the same FLOPs and bytes.
  const PlanReport here = step.plan(a, b);
  CHECK(here.flops == report.flops);
  CHECK(here.peak_bytes == report.peak_bytes);
  // A calibration's programs are not the user's: the profile table lists only the user's.
  set_profiling(true);
  reset_profiles();
  (void)calibrate_this_machine(1);
  CHECK(profile_report().find("program") == std::string::npos);
  (void)step(a, b).full_tensor();
  CHECK(profile_report().find("program") != std::string::npos);
  set_profiling(false);
}

TEST_CASE("devices sharing this machine each get their share of it") {
  const Hardware whole = hardware_profile("this-machine");
  CHECK(this_machine_device(1) == whole);  // one device owns every core
  const int64_t cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (int64_t devices : {int64_t(2), 4 * cores}) {
    CAPTURE(devices);
    const Hardware h = this_machine_device(devices);
    CHECK(h.device == DeviceKind::CPU);
    CHECK(h.cores == std::max<int64_t>(1, cores / devices));
    CHECK(h.memory_bytes == whole.memory_bytes / devices);
    CHECK(h.memory_bytes_per_second <= whole.memory_bytes_per_second / double(devices) * 1.0000001);
    CHECK(h.name.find(std::to_string(devices) + " devices") != std::string::npos);
  }
  // Twice as many devices to a core: half the rates each, and a collective's hops wait twice as long.
  const Hardware crowded = this_machine_device(4 * cores), half = this_machine_device(2 * cores);
  CHECK(crowded.gemm_rate(DType::f32) == doctest::Approx(half.gemm_rate(DType::f32) / 2));
  CHECK(crowded.intra_node.latency_seconds == doctest::Approx(half.intra_node.latency_seconds * 2));
  // One device held to one core (set_cores_per_device, TESSERA_CORES_PER_DEVICE) plans at one
  // core's rates, as each of as many devices as cores does; it was planned as the whole machine.
  if (cores > 1) {
    set_cores_per_device(1);
    const Hardware one_core = this_machine_device(1), one_each = this_machine_device(cores);
    set_cores_per_device(0);
    CHECK(one_core.cores == 1);
    CHECK(one_core.gemm_rate(DType::f32) == one_each.gemm_rate(DType::f32));
    CHECK(one_core.vector_rate(DType::f32) == one_each.vector_rate(DType::f32));
    CHECK(one_core.memory_bytes == whole.memory_bytes);  // alone, it has the memory
  }
}

namespace {

// A small MLP step on `mesh`: x (batch sharded on the first dim) through two dense layers with
// the hidden dim sharded on the last mesh dim (tensor parallel on a 2-D mesh), a loss, and the
// gradients of both weights.
struct MlpStep {
  Mesh mesh;
  Tensor x, w1, w2;
  MlpStep(const Mesh& m, int64_t batch, int64_t width, int64_t hidden) : mesh(m) {
    const std::string data = m.dim_names().front(), model = m.dim_names().back();
    const bool two_d = m.ndim() > 1;
    x = random_normal({batch, width}, 1, Layout({data, "unsharded"}, m));
    w1 = random_normal({width, hidden}, 2, Layout({"unsharded", two_d ? model : "unsharded"}, m));
    w2 = random_normal({hidden, width}, 3, Layout({two_d ? model : "unsharded", "unsharded"}, m));
  }
  static auto function() {
    return jit([](const Tensor& x, const Tensor& w1, const Tensor& w2) {
      const Tensor loss = reduce_sum(relu(matmul(relu(matmul(x, w1)), w2)) * 0.5, {0, 1});
      std::vector<Tensor> out = gradients(loss, {w1, w2});
      out.insert(out.begin(), loss);
      return out;
    });
  }
};

}  // namespace

TEST_CASE("abstract meshes: devices that do not exist here, with their nodes and links") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const Mesh mesh = abstract_mesh({{"dp", 128}, {"tp", 8}}, h100, 8);
  CHECK(mesh.is_abstract());
  CHECK(mesh.size() == 1024);
  CHECK(mesh.num_local_devices() == 0);
  CHECK(mesh.device_kind() == DeviceKind::GPU);
  CHECK(mesh.hardware() == h100);
  CHECK(mesh.devices_per_node() == 8);
  CHECK(mesh.dim_within_node(1));   // tp: eight consecutive devices, one node
  CHECK(!mesh.dim_within_node(0));  // dp: across nodes
  const Mesh tp = mesh["tp"], dp = mesh["dp"];
  CHECK(tp.is_abstract());
  CHECK(tp.dim_within_node(0));
  CHECK(!dp.dim_within_node(0));
  // Two tp groups of 4 fit a node of 8; a group of 16 does not, nor one of 3 aligned to no node.
  CHECK(abstract_mesh({{"dp", 4}, {"tp", 4}}, h100, 8).dim_within_node(1));
  CHECK(!abstract_mesh({{"dp", 4}, {"tp", 4}}, h100, 8).dim_within_node(0));
  CHECK(!abstract_mesh({{"tp", 16}}, h100, 8).dim_within_node(0));
  CHECK(!abstract_mesh({{"dp", 2}, {"tp", 3}}, h100, 8).dim_within_node(1));
  CHECK(!(mesh == abstract_mesh({{"dp", 128}, {"tp", 8}}, h100, 4)));
  CHECK(mesh == abstract_mesh({{"dp", 128}, {"tp", 8}}, h100, 8));
  CHECK_THROWS_WITH_AS(abstract_mesh({{"x", 8}}, h100, 0), doctest::Contains("devices_per_node is 0"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 1}}, cpu_devices(1)).hardware(), doctest::Contains("only an abstract_mesh"), MeshError);
}

TEST_CASE("values on an abstract mesh are planned, never computed, and allocate nothing") {
  const Mesh mesh = abstract_mesh({{"dp", 64}, {"tp", 8}}, hardware_profile("h100-sxm"), 8);
  const int64_t allocated = buffer_pool_stats().allocated;
  const Tensor w = random_normal({1 << 16, 1 << 16}, 7, Layout({"unsharded", "tp"}, mesh));  // 16 GiB
  Variable v(w);
  v.assign(v.value() * 2.0);
  CHECK(v.layout() == Layout({"unsharded", "tp"}, mesh));
  CHECK(buffer_pool_stats().allocated == allocated);
  CHECK_THROWS_WITH_AS(w.full_tensor(), doctest::Contains("abstract mesh (dp=64,tp=8 of h100-sxm)"), MeshError);
  CHECK_THROWS_AS(v.value().to_local(), MeshError);
  auto step = jit([](const Tensor& a) { return a + 1.0; });
  CHECK_THROWS_WITH_AS(step(w), doctest::Contains("cannot run"), MeshError);
  const PlanReport report = step.plan(w);  // but planning it is what the mesh is for
  CHECK(report.devices == 512);
  CHECK(report.hardware == "h100-sxm");
  CHECK(report.input_bytes == (int64_t(1) << 32) / 8 * 4);
  CHECK(buffer_pool_stats().allocated == allocated);
}

TEST_CASE("a plan's collective bytes and FLOPs are what running the step does") {
  for (const auto& [dims, devices] : {std::pair{std::vector<std::pair<std::string, int64_t>>{{"x", 1}}, 1},
                                      std::pair{std::vector<std::pair<std::string, int64_t>>{{"x", 2}}, 2},
                                      std::pair{std::vector<std::pair<std::string, int64_t>>{{"x", 3}}, 3},
                                      std::pair{std::vector<std::pair<std::string, int64_t>>{{"dp", 2}, {"tp", 2}}, 4}}) {
    CAPTURE(devices);
    const Mesh mesh = create_mesh(dims, cpu_devices(devices));
    const MlpStep s(mesh, 10, 12, 14);  // uneven on 3 and on 2 x 2 (hidden 14 over 2, batch 10 over 3)
    auto step = MlpStep::function();
    const PlanReport plan = step.plan(s.x, s.w1, s.w2);
    int64_t planned = 0;
    for (int64_t b : plan.device_collective_bytes) planned += b;
    CommDebugMode comm;
    (void)step(s.x, s.w1, s.w2);
    CHECK(planned == comm.total_bytes());
    CHECK(collective_calls(plan) == comm.total_count());
    CHECK(int64_t(plan.device_ids.size()) == devices);
    CHECK(plan.devices == devices);
    // Forward and backward GEMMs: 2 * (x w1, h w2, dh, dw2, dw1) multiply-adds, on the device with the most rows.
    CHECK(plan.flops >= 2.0 * 5 * 4 * 12 * 14 / devices);
    CHECK(plan.peak_bytes >= plan.input_bytes + plan.output_bytes);
    CHECK(plan.predicted_seconds > 0);
  }
}

TEST_CASE("a kernel's FLOPs count every op it evaluates; ops rounded to bf16 are charged their rounding") {
  const Mesh mesh = create_mesh({{"x", 2}}, cpu_devices(2));
  const Layout rows = Layout::from_placements(mesh, {Shard{0}}, 2);
  auto chain = jit([](const Tensor& x, const Tensor& y) {
    // Four ops in one kernel (mul, mul, add; sub), the same op twice in a row, and two outputs.
    const Tensor u = x * y * y + x;
    return std::vector<Tensor>{u, u - y};
  });
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = full({10, 6}, 0.5, rows, dtype), y = full({10, 6}, 0.25, rows, dtype);
    const PlanReport plan = chain.plan(x, y);
    CHECK(plan.flops == 4.0 * 5 * 6);  // four ops on each of the 30 elements of the device's 5 x 6 block
    // The same program's time with the bf16 rate lowered: only its rounded ops pay.
    auto planned_on = [&](const Hardware& hw) {
      const Layout abstract_rows = Layout::from_placements(abstract_mesh({{"x", 2}}, hw, 8), {Shard{0}}, 2);
      return chain.plan(zeros({10, 6}, abstract_rows, dtype), zeros({10, 6}, abstract_rows, dtype));
    };
    Hardware same = hardware_profile("h100-sxm"), slow = same;
    same.vector_flops[DType::bf16] = same.vector_rate(DType::f32);
    slow.vector_flops[DType::bf16] = same.vector_rate(DType::f32) / 100;
    const PlanReport on_slow = planned_on(slow), on_same = planned_on(same);
    if (dtype == DType::bf16) CHECK(on_slow.predicted_seconds > on_same.predicted_seconds);
    else CHECK(on_slow.predicted_seconds == on_same.predicted_seconds);
  }
}

TEST_CASE("each special function a kernel evaluates is charged at its own rate") {
  Hardware hw = hardware_profile("h100-sxm");
  hw.vector_flops[DType::f32] = 1e18;  // the other ops and the bytes cost nothing here
  hw.memory_bytes_per_second = 1e18;
  hw.special_functions_per_second[DType::f32] = {
      {SpecialFunction::exp, 1e9}, {SpecialFunction::log, 5e8}, {SpecialFunction::tanh, 2.5e8}, {SpecialFunction::pow, 1e8}};
  const Layout rows = Layout::from_placements(abstract_mesh({{"x", 2}}, hw, 8), {Shard{0}}, 2);
  auto f = jit([](const Tensor& x) { return tanh(exp(x)) + exp(x * 2.0); });
  const PlanReport plan = f.plan(zeros({1000, 100}, rows));
  REQUIRE(plan.by_op_kind.size() == 1);
  // One kernel: on each device's 500 x 100 elements two exps and a tanh.
  const double n = 500.0 * 100;
  CHECK(plan.predicted_seconds == doctest::Approx(hw.launch_seconds + 2 * n / 1e9 + n / 2.5e8).epsilon(1e-9));
}

TEST_CASE("a kernel's ops inside a reduction count once per element read, the ops after it once per element out") {
  const Mesh mesh = create_mesh({{"x", 2}}, cpu_devices(2));
  const Layout rows = Layout::from_placements(mesh, {Shard{0}}, 2);
  // A row's sum of squares, then scaled, shifted and exponentiated: one kernel.
  auto norm = jit([](const Tensor& x) { return exp(reduce_sum(x * x, {1}) * 0.5 + 1.0); });
  const Tensor x = full({10, 6}, 0.5, rows);
  const PlanReport plan = norm.plan(x);
  REQUIRE(plan.by_op_kind.size() == 1);
  CHECK(plan.by_op_kind[0].steps == 1);
  // mul and reduce_sum on each of the device's 5 x 6 elements; mul, add and exp on its 5 sums
  // (each op counted on the 30 elements read would be 150).
  CHECK(plan.flops == 2.0 * 5 * 6 + 3.0 * 5);
  CHECK(norm(x).full_tensor().to_vector<float>()[0] == doctest::Approx(std::exp(6 * 0.25 * 0.5 + 1.0)));
}

TEST_CASE("a kernel's bytes still in the cache are charged the cache's bandwidth, the least recently touched leaving first") {
  CacheResidency cache(100);
  CHECK(cache.touch({{1, 40}}, {{2, 30}}) == 30);           // 1 comes from memory; 2 is written into the cache
  CHECK(cache.touch({{1, 40}, {2, 30}}, {{3, 20}}) == 90);  // both still there (90 of 100 bytes)
  CHECK(cache.touch({{4, 50}}, {}) == 0);                   // 1 (touched before 2 and 3) leaves for it
  CHECK(cache.touch({{1, 40}, {3, 20}}, {}) == 20);
  CHECK(cache.touch({}, {{5, 500}}) == 0);                  // larger than the cache: streams through
  CHECK(CacheResidency(0).touch({{1, 8}}, {{2, 8}}) == 0);  // no cache modelled
  // In a plan: a chain of kernels over values that fit the cache runs faster with it, a profile
  // without one plans as before.
  auto chain = jit([](const Tensor& x) {
    const Tensor a = reduce_sum(x * 2.0, {1}, true);  // a reduction ends a kernel: the next one reads its output
    return reduce_sum(x * a, {1});
  });
  Hardware cpu = hardware_profile("h100-sxm");
  cpu.device = DeviceKind::CPU;
  cpu.memory_bytes_per_second = 1e9;  // memory-bound kernels
  Hardware cached = cpu;
  cached.cache_bytes = int64_t(1) << 20;
  cached.cache_bytes_per_second = 1e11;
  auto planned_on = [&](const Hardware& hw) {
    return chain.plan(zeros({64, 256}, Layout::replicated(abstract_mesh({{"x", 1}}, hw, 8), 2), DType::f32));
  };
  CHECK(planned_on(cached).predicted_seconds < planned_on(cpu).predicted_seconds);
  Hardware none = cached;
  none.cache_bytes = 0;
  CHECK(planned_on(none).predicted_seconds == planned_on(cpu).predicted_seconds);
  // The shared cache behind it: y and the product (64 KiB each) do not fit an inner cache of
  // 32 KiB, and the last kernel finds them in the shared one, at that cache's slower rate.
  auto through_gemm = jit([](const Tensor& x, const Tensor& w) {
    const Tensor y = x * 2.0;
    return matmul(y, w) * 3.0 + y;
  });
  auto planned_through_gemm = [&](const Hardware& hw) {
    const Mesh one = abstract_mesh({{"x", 1}}, hw, 8);
    return through_gemm.plan(zeros({64, 256}, Layout::replicated(one, 2), DType::f32),
                             zeros({256, 256}, Layout::replicated(one, 2), DType::f32)).predicted_seconds;
  };
  Hardware small = cached;
  small.cache_bytes = int64_t(1) << 15;
  Hardware shared = small;
  shared.shared_cache_bytes = int64_t(1) << 20;
  shared.shared_cache_bytes_per_second = 1e10;
  const double inner_only = planned_through_gemm(small), with_shared = planned_through_gemm(shared);
  CHECK(with_shared < inner_only);
  CHECK(planned_through_gemm(cached) < with_shared);
  shared.shared_cache_bytes = 0;
  CHECK(planned_through_gemm(shared) == inner_only);
}

TEST_CASE("an abstract mesh plans its most loaded device exactly as a real mesh of the same shape does") {
  const Hardware here = hardware_profile("this-machine");
  for (const auto& dims : {std::vector<std::pair<std::string, int64_t>>{{"x", 3}},
                           std::vector<std::pair<std::string, int64_t>>{{"dp", 2}, {"tp", 2}},
                           std::vector<std::pair<std::string, int64_t>>{{"dp", 3}, {"tp", 3}}}) {
    const Mesh real = create_mesh(dims, cpu_devices(int(mesh_device_count(dims))));
    const Mesh abstract = abstract_mesh(dims, here, 8);
    CAPTURE(real.to_string());
    auto step = MlpStep::function();
    const MlpStep on_real(real, 10, 12, 14), on_abstract(abstract, 10, 12, 14);
    const PlanReport a = step.plan(on_real.x, on_real.w1, on_real.w2);
    const PlanReport b = step.plan(on_abstract.x, on_abstract.w1, on_abstract.w2);
    // Planned: the devices whose coordinates are all 0 or 1, whatever the mesh's size.
    CHECK(int64_t(b.device_ids.size()) == (int64_t(1) << real.ndim()));
    for (size_t i = 0; i < b.device_ids.size(); ++i) {
      const int64_t id = b.device_ids[i];
      CAPTURE(id);
      CHECK(b.device_peak_bytes[i] == a.device_peak_bytes[size_t(id)]);
      CHECK(b.device_collective_bytes[i] == a.device_collective_bytes[size_t(id)]);
    }
    CHECK(b.peak_bytes == a.peak_bytes);  // the most loaded device is among them
    CHECK(b.device == a.device);
    CHECK(b.flops == a.flops);
    CHECK(b.input_bytes == a.input_bytes);
    CHECK(b.output_bytes == a.output_bytes);
  }
}

TEST_CASE("a plan's peak bytes are the bytes each device really holds at its peak") {
  for (const auto& dims : {std::vector<std::pair<std::string, int64_t>>{{"x", 1}}, std::vector<std::pair<std::string, int64_t>>{{"x", 2}},
                           std::vector<std::pair<std::string, int64_t>>{{"x", 3}},
                           std::vector<std::pair<std::string, int64_t>>{{"dp", 2}, {"tp", 2}}}) {
    const int devices = int(mesh_device_count(dims));
    CAPTURE(devices);
    const Mesh mesh = create_mesh(dims, cpu_devices(devices));
    const MlpStep s(mesh, 10, 12, 14);
    auto step = MlpStep::function();
    (void)step(s.x, s.w1, s.w2);  // compiled, its arenas allocated; its outputs dropped
    const PlanReport plan = step.plan(s.x, s.w1, s.w2);
    reset_peak_memory_stats();
    std::vector<int64_t> held_before;
    for (int d = 0; d < devices; ++d) held_before.push_back(memory_counter("CPU:" + std::to_string(d)).current.load());
    CHECK(memory_stats(mesh).current_bytes == plan.input_bytes);  // the step's inputs, and nothing else
    {
      const std::vector<Tensor> out = step(s.x, s.w1, s.w2);
      for (size_t i = 0; i < plan.device_ids.size(); ++i) {
        const MemoryCounter& c = memory_counter("CPU:" + std::to_string(plan.device_ids[i]));
        CAPTURE(i);
        CHECK(c.peak.load() == plan.device_peak_bytes[i]);
        CHECK(c.current.load() - held_before[size_t(plan.device_ids[i])] == plan.output_bytes_per_device[i]);
      }
      CHECK(memory_stats(mesh).peak_bytes == plan.peak_bytes);
    }
    CHECK(memory_stats(mesh).current_bytes == plan.input_bytes);  // the outputs are given back
  }
}

namespace {

// Where each local device's block of `t` lives, to see whether a call wrote over it.
std::vector<const std::byte*> block_addresses(const Tensor& t) {
  std::vector<const std::byte*> out;
  for (const Array& block : force_value(t.node()).storage->components) out.push_back(block.device_bytes());
  return out;
}

}  // namespace

TEST_CASE("a step writes its variables' new values over the old ones where nothing else holds them, and no value someone holds changes") {
  for (const auto& dims : {std::vector<std::pair<std::string, int64_t>>{{"x", 1}}, std::vector<std::pair<std::string, int64_t>>{{"x", 2}},
                           std::vector<std::pair<std::string, int64_t>>{{"x", 3}},
                           std::vector<std::pair<std::string, int64_t>>{{"x", 2}, {"y", 2}}}) {
    const int devices = int(mesh_device_count(dims));
    const Mesh mesh = create_mesh(dims, cpu_devices(devices));
    CAPTURE(mesh.to_string());
    const Layout layout = Layout::from_placements(mesh, std::vector<Placement>(dims.size(), Shard{0}), 2);  // 10 rows: uneven over 3
    Tensor initial = random_normal({10, 6}, 1, layout);
    const Array initial_values = initial.full_tensor();
    Variable w(initial), m(zeros({10, 6}, layout));
    const Tensor g = random_normal({10, 6}, 2, layout);
    // Momentum SGD: m = 0.9 m + g, w = w - 0.5 m; the loss reads the new w.
    auto step = jit([&](const Tensor& grad) {
      m.assign(m.value() * 0.9 + grad);
      w.assign(w.value() - m.value() * 0.5);
      return reduce_sum(w.value());
    });
    std::vector<float> w_host = initial_values.to_vector<float>(), m_host(w_host.size(), 0.f);
    const std::vector<float> g_host = g.full_tensor().to_vector<float>();
    auto expect_next = [&] {
      for (size_t k = 0; k < w_host.size(); ++k) m_host[k] = m_host[k] * 0.9f + g_host[k], w_host[k] -= m_host[k] * 0.5f;
    };
    auto check_values = [&] {
      const std::vector<float> w_now = w.value().full_tensor().to_vector<float>(), m_now = m.value().full_tensor().to_vector<float>();
      for (size_t k = 0; k < w_host.size(); ++k) {
        CHECK(w_now[k] == doctest::Approx(w_host[k]).epsilon(1e-5));
        CHECK(m_now[k] == doctest::Approx(m_host[k]).epsilon(1e-5));
      }
    };
    // The first call: w's value is the user's `initial`, which must stay as it is.
    (void)step(g);
    expect_next();
    check_values();
    CHECK(initial.full_tensor().to_vector<float>() == initial_values.to_vector<float>());
    initial = Tensor();
    // Now the values are the call's own and nothing else holds them: written in place.
    std::vector<const std::byte*> w_at = block_addresses(w.value()), m_at = block_addresses(m.value());
    (void)step(g);
    expect_next();
    CHECK(block_addresses(w.value()) == w_at);
    CHECK(block_addresses(m.value()) == m_at);
    check_values();
    {  // A user holding the old value, or an op on it not yet computed: a new buffer, the old values kept.
      const Tensor held = w.value();
      const Tensor pending = m.value() * 2.0;
      const std::vector<float> held_values = held.full_tensor().to_vector<float>();
      std::vector<float> twice_m = m_host;
      for (float& x : twice_m) x *= 2;
      w_at = block_addresses(w.value()), m_at = block_addresses(m.value());
      (void)step(g);
      expect_next();
      CHECK(block_addresses(w.value()) != w_at);
      CHECK(block_addresses(m.value()) != m_at);
      CHECK(held.full_tensor().to_vector<float>() == held_values);
      const std::vector<float> pending_values = pending.full_tensor().to_vector<float>();
      for (size_t k = 0; k < twice_m.size(); ++k) CHECK(pending_values[k] == doctest::Approx(twice_m[k]).epsilon(1e-6));
      check_values();
    }
    // The plan counts the new values in the old ones' memory: the loss is the only output held
    // beside the inputs, and the peak is what a run holds.
    const PlanReport plan = step.plan(g);
    CHECK(plan.output_bytes < 10 * 6 * 4 / devices);
    check_plan_is_measured(mesh, [&] { return step.plan(g); }, [&] { (void)step(g); });
    expect_next(), expect_next();
    check_values();
  }
}

// What a step made of several calls holds is what its plan counts (plan/call_sequence_plan.hpp):
// a value moved from one variable to another is not copied (1F1B's host loop moves its kept
// stage inputs from slot to slot, nn/pipeline_tick_loop.cpp), and a constant that two jit
// functions build is held once, not once per function.
TEST_CASE("a variable assigned another's value shares its buffer, and two jit functions that build one constant hold one copy") {
  for (const auto& dims : {std::vector<std::pair<std::string, int64_t>>{{"x", 2}},
                           std::vector<std::pair<std::string, int64_t>>{{"x", 2}, {"y", 2}}}) {
    const Mesh mesh = create_mesh(dims, cpu_devices(int(mesh_device_count(dims))));
    CAPTURE(mesh.to_string());
    const Layout layout = Layout::from_placements(mesh, std::vector<Placement>(dims.size(), Shard{0}), 2);
    Variable a(random_normal({10, 6}, 1, layout)), b(zeros({10, 6}, layout));
    const int64_t before = memory_stats(mesh).current_bytes;
    b.assign(a.value());
    CHECK(block_addresses(b.value()) == block_addresses(a.value()));
    CHECK(memory_stats(mesh).current_bytes < before);  // b's zeros dropped, nothing new made
    // Shared, neither is written over in place: a step that doubles a leaves b as it was.
    const std::vector<float> b_values = b.value().full_tensor().to_vector<float>();
    auto double_a = jit([&] {
      a.assign(a.value() * 2.0);
      return std::vector<Tensor>{};
    });
    (void)double_a();
    CHECK(b.value().full_tensor().to_vector<float>() == b_values);
    CHECK(a.value().full_tensor().to_vector<float>() != b_values);

    // A constant both functions build (a loop invariant, computed once and captured): held once.
    const Tensor x = random_normal({64}, 3, Layout::replicated(mesh, 1));
    const Tensor index = zeros({}, Layout::replicated(mesh, 0), DType::i32) + 5;
    auto positions = [&] { return iota({64}, 0, Layout::replicated(mesh, 1)); };
    auto pick = jit([&](const Tensor& t, const Tensor& i) { return where(positions() == i, t, 0.0); });
    auto drop = jit([&](const Tensor& t, const Tensor& i) { return where(positions() == i, 0.0, t); });
    (void)x.full_tensor(), (void)index.full_tensor();  // computed: held from here on
    const int64_t held = memory_stats(mesh).current_bytes;
    (void)pick(x, index);
    const int64_t one_constant = memory_stats(mesh).current_bytes - held;
    CHECK(one_constant == 64 * 4);  // per device: the replicated i32 positions
    (void)drop(x, index);
    CHECK(memory_stats(mesh).current_bytes - held == one_constant);
    CHECK(pick(x, index).full_tensor().to_vector<float>()[5] == x.full_tensor().to_vector<float>()[5]);
    CHECK(drop(x, index).full_tensor().to_vector<float>()[5] == 0.0f);
  }
}

TEST_CASE("a collective's result is freed after its last reader, not held to the end of the step") {
  // Four all_gathers of 512 KiB blocks, each read once and then done with: at most two gathered
  // values are alive at once (one being reduced while the next arrives), never all four.
  for (const int devices : {2, 3}) {
    CAPTURE(devices);
    const Mesh mesh = create_mesh({{"x", devices}}, cpu_devices(devices));
    const Tensor a = random_normal({512, 256}, 3, Layout({"x", UNSHARDED}, mesh));
    const Tensor w = random_normal({256, 8}, 4, Layout::replicated(mesh, 2));
    auto step = jit([](const Tensor& x, const Tensor& v) {
      Tensor total;
      for (int i = 0; i < 4; ++i) {
        const Tensor whole = (x * double(i + 1)).redistribute({Replicate{}});
        const Tensor s = matmul(whole, v);  // a GEMM reads the gathered value, then nothing does
        total = i == 0 ? s : total + s;
      }
      return total;
    });
    const PlanReport plan = step.plan(a, w);
    const int64_t gathered = 512 * 256 * 4;
    CHECK(plan.peak_bytes < plan.input_bytes + 3 * gathered);
    CHECK(plan.peak_bytes >= plan.input_bytes + gathered);
    check_plan_is_measured(mesh, [&] { return step.plan(a, w); }, [&] { (void)step(a, w); });
  }
}

TEST_CASE("the GPT training step's predicted peak bytes are measured exactly, in every parallel style") {
  struct Case {
    std::vector<std::pair<std::string, int64_t>> dims;
    bool sequence_parallel = false, fsdp = false;
  };
  for (const Case& c : {Case{{{"dp", 1}}}, Case{{{"dp", 4}}}, Case{{{"tp", 2}}, true}, Case{{{"sp", 2}}},
                        Case{{{"dp", 2}}, false, true}, Case{{{"dp", 2}, {"tp", 2}}, true, true}, Case{{{"dp", 8}}},
                        Case{{{"dp", 2}, {"tp", 4}}, true, true}}) {
    const int devices = int(mesh_device_count(c.dims));
    const Mesh mesh = create_mesh(c.dims, cpu_devices(devices));
    CAPTURE(mesh.to_string());
    CAPTURE(c.sequence_parallel);
    CAPTURE(c.fsdp);
    GptConfig config;  // one block: every block is the same program
    config.vocab = 24, config.context = 12, config.layers = 1, config.width = 16, config.heads = 4;
    GptTrainingStep step(config, mesh, c.sequence_parallel, c.fsdp);
    const auto [ids, targets] = gpt_batch(mesh, config, 6);  // uneven over 4, empty shards over 8
    check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); });
  }
}

TEST_CASE("gradient accumulation in the GPT training step: one pass's loss and update, a microbatch's activations held") {
  GptConfig config;
  config.vocab = 24, config.context = 12, config.layers = 2, config.width = 16, config.heads = 4;
  for (const std::vector<std::pair<std::string, int64_t>>& dims :
       {std::vector<std::pair<std::string, int64_t>>{{"dp", 1}}, {{"dp", 2}}, {{"dp", 2}, {"tp", 2}}}) {
    const Mesh mesh = create_mesh(dims, cpu_devices(int(mesh_device_count(dims))));
    CAPTURE(mesh.to_string());
    const auto [ids, targets] = gpt_batch(mesh, config, 8);
    std::vector<float> losses;
    int64_t one_pass_peak = 0;
    // The gradients' reductions over dp: calls and bytes.
    auto dp_reductions = [](const PlanReport& r) {
      std::pair<int64_t, int64_t> out{0, 0};
      for (const PlanReport::Collective& c : r.collectives)
        if (c.mesh_dim == "dp") out.first += c.calls, out.second += c.bytes;
      return out;
    };
    std::pair<int64_t, int64_t> one_pass_reductions;
    {
      GptTrainingStep once(config, mesh);
      for (int step = 0; step < 2; ++step) losses.push_back(once(ids, targets).full_tensor().to_vector<float>()[0]);
      const PlanReport plan = once.plan(ids, targets);
      one_pass_peak = plan.peak_bytes;
      one_pass_reductions = dp_reductions(plan);
    }
    // The same loss (the microbatches' mean) and, after an update from the summed gradients,
    // the same loss again, to rounding.
    GptTrainingStep accumulating(config, mesh, false, false, 4);
    for (int step = 0; step < 2; ++step)
      CHECK(accumulating(ids, targets).full_tensor().to_vector<float>()[0] == doctest::Approx(losses[size_t(step)]).epsilon(1e-5));
    // Planned exactly, and holding less than one pass over the whole batch.
    check_plan_is_measured(mesh, [&] { return accumulating.plan(ids, targets); }, [&] { (void)accumulating(ids, targets); });
    CHECK(accumulating.plan(ids, targets).peak_bytes < one_pass_peak);
    // The microbatches' gradient terms are added up before they are reduced: once, as one pass
    // does (the same bytes, in as many collectives or fewer: the update program buckets them).
    const std::pair<int64_t, int64_t> reductions = dp_reductions(accumulating.plan(ids, targets));
    CHECK(reductions.second == one_pass_reductions.second);
    CHECK(reductions.first <= one_pass_reductions.first);
  }
  CHECK_THROWS_WITH_AS(GptTrainingStep(config, create_mesh({{"dp", 1}}), false, false, 0), doctest::Contains("microbatches must be at least 1"),
                       Error);
}

TEST_CASE("an accumulating step is planned from its two programs: the same work planned for 8 or 128 microbatches, the costs counted") {
  // One sequence a microbatch, so the microbatch program is the same whatever the count.
  const Hardware h100 = hardware_profile("h100-sxm");
  const TransformerConfig config = transformer_preset("llama-tiny");
  const Mesh mesh = abstract_mesh({{"dp", 2}, {"tp", 2}}, h100, 8);
  auto plan = [&](int64_t microbatches) { return plan_transformer_training_step(config, mesh, false, false, 2 * microbatches, microbatches); };
  const PlanReport eight = plan(8), sixteen = plan(16), many = plan(128);
  // What was planned: each call's scheduled steps once (the microbatch program's and the
  // update's), the same for every count; a plan of one program over every microbatch would
  // hold 16 times the steps at 128.
  CHECK(many.steps.size() == eight.steps.size());
  CHECK(many.steps.front().steps == 128);  // the microbatch program's steps, run 128 times
  CHECK(many.steps.back().steps == 1);     // the update's, once
  // What it costs grows by the microbatch program's cost per microbatch: 120 more are 15 times 8
  // more (to 1%: choosing a microbatch masks the whole batch of ids, a few operations a token).
  CHECK(many.flops - eight.flops == doctest::Approx(15 * (sixteen.flops - eight.flops)).epsilon(0.01));
  CHECK(many.predicted_seconds - eight.predicted_seconds == doctest::Approx(15 * (sixteen.predicted_seconds - eight.predicted_seconds)));
  CHECK(many.collective_bytes - eight.collective_bytes == 15 * (sixteen.collective_bytes - eight.collective_bytes));
  // The peak holds one microbatch's activations whatever the count: it grows only by the batch
  // of token ids and targets the step holds (2 x 2 x 120 more sequences of i32, split over dp).
  CHECK(many.peak_bytes - eight.peak_bytes == 2 * 120 * config.max_seq * 4);

  // Refused by name: no calls, a call that never runs, a plan not made for a jit call.
  CHECK_THROWS_WITH_AS(plan_call_sequence({}, h100), doctest::Contains("no calls to plan"), Error);
  const Tensor x = zeros({4, 4}, Layout::replicated(mesh, 2));
  const auto twice = jit([](const Tensor& t) { return t * 2.0; });
  CHECK_THROWS_WITH_AS(plan_call_sequence({{twice.program_plan(x), 0}}, h100), doctest::Contains("counted 0 times"), Error);
  CHECK_THROWS_WITH_AS(plan_call_sequence({{plan_program({(x * 2.0).node()}), 1}}, h100),
                       doctest::Contains("does not say what holds its inputs"), Error);
  CHECK_THROWS_WITH_AS(plan_call_sequence({{twice.program_plan(x), 1}, {twice.program_plan(zeros({4, 4}, Layout::replicated(abstract_mesh({{"dp", 2}}, h100, 8), 2))), 1}}, h100),
                       doctest::Contains("different meshes"), MeshError);
  // A value two calls read is held once: twice(x) twice holds x and two outputs at most.
  const PlanReport one = plan_call_sequence({{twice.program_plan(x), 1}}, h100), two = plan_call_sequence({{twice.program_plan(x), 2}}, h100);
  CHECK(two.peak_bytes == one.peak_bytes);
  CHECK(two.input_bytes == one.input_bytes);
  CHECK(two.predicted_seconds == doctest::Approx(2 * one.predicted_seconds));
}

TEST_CASE("a 1F1B step is planned from its tick programs: the same work planned for 8 or 128 microbatches, the costs counted") {
  // One sequence a microbatch on pp=4 x dp=2 x tp=2: the warm-up, steady and cool-down tick
  // programs and the update, each planned once whatever the count.
  const Hardware h100 = hardware_profile("h100-sxm");
  TransformerConfig config = transformer_preset("llama-tiny");
  config.layers = 4;
  const Mesh mesh = abstract_mesh({{"pp", 4}, {"dp", 2}, {"tp", 2}}, h100, 8);
  auto plan = [&](int64_t microbatches) {
    return plan_pipelined_transformer_training_step(config, mesh, false, false, 2 * microbatches, microbatches);
  };
  const PlanReport eight = plan(8), sixteen = plan(16), many = plan(128);
  // Each program's scheduled steps once, counted: P - 1 warm-up calls, M steady ones, P - 1
  // cool-down ones and one update. One program over every tick would hold 16 times the steps.
  CHECK(many.steps.size() == eight.steps.size());
  std::map<int64_t, int64_t> counts;  // how many times, over how many scheduled steps
  for (const PlanReport::Part& step : many.steps) ++counts[step.steps];
  CHECK(counts.size() == 3);
  CHECK(counts.count(3) == 1);    // warm-up and cool-down
  CHECK(counts.count(128) == 1);  // steady
  CHECK(counts.at(1) >= 1);       // the update
  // Costs grow by the steady program's per microbatch (to 1%: choosing a microbatch masks the
  // whole batch of ids).
  CHECK(many.flops - eight.flops == doctest::Approx(15 * (sixteen.flops - eight.flops)).epsilon(0.01));
  CHECK(many.predicted_seconds - eight.predicted_seconds == doctest::Approx(15 * (sixteen.predicted_seconds - eight.predicted_seconds)));
  CHECK(many.collective_bytes - eight.collective_bytes == 15 * (sixteen.collective_bytes - eight.collective_bytes));
  // A device keeps 2P - 2 stage inputs whatever the count: the peak grows only by the batch of
  // token ids and targets the step holds (2 x 2 x 120 more sequences of i32, split over dp) and
  // by the microbatches' i32 indices that microbatch() compares the counter with.
  CHECK(many.peak_bytes - eight.peak_bytes == 2 * 120 * config.max_seq * 4 + 120 * 4);
}

TEST_CASE("the GPT training step moves each tensor once: FSDP gradients reduced once, Megatron's sequence-parallel collectives") {
  const Hardware h100 = hardware_profile("h100-sxm");
  for (bool sequence_parallel : {false, true}) {
    CAPTURE(sequence_parallel);
    const Mesh mesh = abstract_mesh({{"dp", 2}, {"tp", 2}}, h100, 8);
    GptConfig config;
    config.vocab = 96, config.context = 32, config.layers = 2, config.width = 64, config.heads = 4;
    GptTrainingStep step(config, mesh, sequence_parallel, /*fsdp=*/true);
    const Layout batch = GptTrainingStep::batch_layout(mesh);
    const PlanReport report = step.plan(zeros({8, config.context}, batch, DType::i32), zeros({8, config.context}, batch, DType::i32));
    auto collective = [&](const std::string& kind, const std::string& dim) {
      for (const PlanReport::Collective& c : report.collectives)
        if (c.kind == kind && c.mesh_dim == dim) return c;
      return PlanReport::Collective{kind, dim};
    };
    // FSDP shards every parameter over dp inside its tensor-parallel shard ("tp+dp"), so each is
    // gathered once and its gradient, clipped and then applied, reduced once into the shard: no
    // gather over tp to re-shard it, and no second reduction for the clipping's scaling. The one
    // other dp sum is the loss's.
    int64_t parameters = 0;
    for (const Tensor p : step.model().parameters()) parameters += p.rank() > 0;
    CHECK(collective("all_gather", "dp").calls == parameters);
    CHECK(collective("reduce_scatter", "dp").calls + collective("all_reduce", "dp").calls == parameters + 1);
    if (!sequence_parallel) {
      CHECK(collective("all_gather", "tp").calls == 0);
      continue;
    }
    // Megatron's sequence parallelism: per block, two all_gathers and two reduce_scatters forward
    // and the same backward, plus the final norm's pair, all moving the same activation bytes. The
    // norms' backward runs on sequence shards: their gradients are reduce_scattered first.
    const PlanReport::Collective gathers = collective("all_gather", "tp"), scatters = collective("reduce_scatter", "tp");
    CHECK(gathers.calls == 4 * config.layers + 2);
    CHECK(scatters.calls == 4 * config.layers + 2);
    CHECK(gathers.bytes == scatters.bytes);
  }
}

namespace {

// The small GPT the auto_parallelize tests plan: vocabulary 64, width 64, 4 heads.
GptConfig small_gpt(int64_t layers, int64_t context) {
  GptConfig config;
  config.vocab = 64, config.context = context, config.layers = layers, config.width = 64, config.heads = 4;
  return config;
}

}  // namespace

TEST_CASE("of plans predicted within 1% of the fastest, the one with the fewest collective calls is chosen") {
  auto candidate = [](const std::string& dim, double seconds, int64_t calls, bool exact) {
    ParallelCandidate c;
    c.mesh = {{dim, 2}};
    c.fits = true;
    c.exact = exact;
    c.report.predicted_seconds = seconds;
    c.report.collectives = {{"all_reduce", dim, 2, true, calls - calls / 2, 1024, 0.0}, {"all_gather", dim, 2, true, calls / 2, 1024, 0.0}};
    return c;
  };
  // dp: the fastest, 10 calls; sp 0.5% slower with 4; tp 0.9% slower with 2 but screened (not at
  // full depth); x 2% slower with 1, no tie.
  const std::vector<ParallelCandidate> sorted = {candidate("dp", 1.0, 10, true), candidate("sp", 1.005, 4, true),
                                                 candidate("tp", 1.009, 2, false), candidate("x", 1.02, 1, true)};
  CHECK(collective_calls(sorted[0].report) == 10);
  std::vector<ParallelCandidate> chosen = sorted;
  const std::optional<ParallelCandidate> passed_over = prefer_fewer_collective_calls(chosen);
  REQUIRE(passed_over);
  CHECK(passed_over->name() == "dp=2");
  std::vector<std::string> order;
  for (const ParallelCandidate& c : chosen) order.push_back(c.name());
  CHECK(order == std::vector<std::string>{"sp=2", "dp=2", "tp=2", "x=2"});
  // No tie (the runner-up 2% slower), or a fastest plan only screened: the order stands.
  std::vector<ParallelCandidate> apart = {sorted[0], sorted[3]};
  CHECK(!prefer_fewer_collective_calls(apart));
  CHECK(apart.front().name() == "dp=2");
  std::vector<ParallelCandidate> screened = {sorted[2], sorted[1]};
  CHECK(!prefer_fewer_collective_calls(screened));
  CHECK(screened.front().name() == "tp=2");
}

// The searches below keep the model's f32 unless precision is what they test: a search with
// bf16 plans every candidate twice, and test_planning runs under ASan in CI.
TEST_CASE("auto_parallelize tries rings of context parallelism up to 16 devices, no longer") {
  // 64 positions over 32 devices split into 2 chunks a device; the search stops at cp=16, the
  // longest ring of published runs (plan/auto_parallelize.cpp, kMostContextParallel).
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(1, 64);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 32, h100, int64_t(1) << 30, 32, 8, false);
  int64_t longest = 0;
  for (const ParallelCandidate& c : search.candidates)
    for (const auto& [dim, size] : c.mesh)
      if (dim == "cp") longest = std::max(longest, size);
  CHECK(longest == 16);
}

TEST_CASE("auto_parallelize plans no candidate whose parameters, gradients and AdamW moments alone exceed the budget; that bound is below every planned peak") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(2, 32);
  const TransformerConfig transformer = gpt_transformer_config(config);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  // A roomy budget plans every candidate: the bound never exceeds a plan's peak (dp, tp, sp, cp,
  // pp, FSDP or not, f32 and bf16 mixed precision).
  const ParallelPlanSearch roomy = auto_parallelize(model, 4, h100, int64_t(1) << 30, 16, 8, true);
  CHECK(roomy.over_memory.empty());
  int64_t most = 0;
  for (const ParallelCandidate& c : roomy.candidates) {
    CAPTURE(c.name());
    const int64_t least = least_training_bytes(transformer, c);
    CHECK(least > 0);
    CHECK(least <= c.report.peak_bytes);
    most = std::max(most, least);
  }
  // A budget below the largest bound: those candidates are not planned, and they are named.
  const int64_t budget = most - 1;
  const ParallelPlanSearch tight = auto_parallelize(model, 4, h100, budget, 16, 8, false);
  REQUIRE(!tight.over_memory.empty());
  CHECK(tight.why.find("were not planned: their parameters, gradients and optimizer state") != std::string::npos);
  for (const ParallelCandidate& c : tight.candidates) CHECK(least_training_bytes(transformer, c) <= budget);
  for (const ParallelCandidate& c : roomy.candidates) {
    if (c.mixed_precision) continue;  // the tight search keeps the model's f32
    const bool over = least_training_bytes(transformer, c) > budget;
    const bool named = std::find(tight.over_memory.begin(), tight.over_memory.end(), c.name()) != tight.over_memory.end();
    CHECK(over == named);
  }
  // Where every candidate is over, all are planned, so the report names the smallest peak.
  const ParallelPlanSearch hopeless = auto_parallelize(model, 4, h100, 1024, 16, 8, false);
  CHECK(hopeless.over_memory.empty());
  CHECK(!hopeless.best.fits);
  CHECK(hopeless.candidates.size() > 10);
}

TEST_CASE("auto_parallelize picks the fastest plan that fits, planned at full depth") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(3, 32);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 8, h100, int64_t(1) << 30, 16, 8, false);
  REQUIRE(search.best.fits);
  CHECK(search.best.exact);
  CHECK(search.candidates.size() > 10);
  // The winner is the fastest of the candidates planned whole that fit, and it is what a plan of
  // the full model on its mesh says.
  // (Plans within 1% of the fastest tie: of those, the one with the fewest collective calls.)
  for (const ParallelCandidate& c : search.candidates) {
    if (!c.exact || !c.fits) continue;
    CAPTURE(c.name());
    CHECK(search.best.report.predicted_seconds <= c.report.predicted_seconds * (1 + kPlanTie));
    if (c.report.predicted_seconds < search.best.report.predicted_seconds)
      CHECK(collective_calls(c.report) > collective_calls(search.best.report));
  }
  // Screened candidates' peaks, drawn from one- and two-block plans, are at least the two-block
  // plan's (a peak is a maximum: the line through two may fall, below zero at GPT-3's depth).
  GptConfig two_blocks = config;
  two_blocks.layers = 2;
  for (const ParallelCandidate& c : search.candidates) {
    if (c.exact || c.pipelined() || c.slower) continue;
    CAPTURE(c.name());
    GptConfig planned = two_blocks;
    planned.activation_checkpointing = c.activation_checkpointing;
    planned.mixed_precision = c.mixed_precision;
    const PlanReport two = plan_gpt_training_step(planned, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16);
    CHECK(c.report.peak_bytes >= two.peak_bytes);
    CHECK(c.report.arena_bytes >= two.arena_bytes);
  }
  // Every block adds the same collectives and FLOPs: drawn from one and two blocks, a screened
  // report's details are the whole model's, calls and bytes of each collective exactly.
  int compared = 0;
  for (const ParallelCandidate& c : search.candidates) {
    if (c.exact || c.pipelined() || c.lower_bound || c.slower) continue;
    if (compared++ == 4) break;
    CAPTURE(c.name());
    GptConfig planned = config;
    planned.activation_checkpointing = c.activation_checkpointing;
    planned.mixed_precision = c.mixed_precision;
    const PlanReport whole = plan_gpt_training_step(planned, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16);
    CHECK(c.report.collective_bytes == whole.collective_bytes);
    CHECK(c.report.flops == doctest::Approx(whole.flops));
    REQUIRE(c.report.collectives.size() == whole.collectives.size());
    for (size_t i = 0; i < whole.collectives.size(); ++i) {
      CAPTURE(whole.collectives[i].kind);
      CHECK(c.report.collectives[i].kind == whole.collectives[i].kind);
      CHECK(c.report.collectives[i].calls == whole.collectives[i].calls);
      CHECK(c.report.collectives[i].bytes == whole.collectives[i].bytes);
    }
    CHECK(c.report.device_collective_bytes == whole.device_collective_bytes);
    CHECK(c.report.steps.empty());  // no program of the model's depth was planned
  }
  CHECK(compared > 0);
  GptConfig chosen = config;
  chosen.mixed_precision = search.best.mixed_precision;
  const PlanReport again = plan_gpt_training_step(chosen, abstract_mesh(search.best.mesh, h100, 8), search.best.sequence_parallel,
                                                  search.best.fsdp, 16);
  CHECK(again.peak_bytes == search.best.report.peak_bytes);
  CHECK(again.predicted_seconds == search.best.report.predicted_seconds);
  CHECK(search.why.find(search.best.name()) == 0);
  CHECK(search.to_json().find("\"best\"") != std::string::npos);
  // A budget nothing fits: the smallest plan, said so.
  const ParallelPlanSearch tight = auto_parallelize(model, 8, h100, 1024, 16, 8, false);
  CHECK(!tight.best.fits);
  CHECK(tight.why.find("no plan fits") != std::string::npos);
  CHECK(tight.best.name() == tight.candidates.front().name());
  Dense not_a_transformer(4, 4, Layout::replicated(abstract_mesh({{"dp", 1}}, h100, 8), 2), 1);
  CHECK_THROWS_WITH_AS(auto_parallelize(not_a_transformer, 8, h100, int64_t(1) << 30), doctest::Contains("is not a Transformer"), Error);
}

TEST_CASE("auto_parallelize leaves a candidate at its one-block plan where its blocks alone already make it no faster than a plan that fits") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(6, 64);
  const TransformerConfig transformer = gpt_transformer_config(config);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 8, h100, int64_t(1) << 30, 16, 8, true);
  REQUIRE(search.best.fits);
  int64_t slower = 0, bounded = 0;
  for (const ParallelCandidate& c : search.candidates) {
    CAPTURE(c.name());
    if (c.pipelined()) CHECK(c.least_seconds == 0);  // a pipeline's ticks are not blocks: no bound
    if (c.least_seconds == 0) continue;
    if (!c.slower) {
      // Screened from one and two blocks: the bound is below the step drawn from them.
      ++bounded;
      CHECK(c.least_seconds <= c.report.predicted_seconds);
      continue;
    }
    // Left at one block: planned whole, it is no faster than the bound, and the bound no faster
    // than the winner, so leaving it lost nothing.
    ++slower;
    CHECK(!c.fits);
    CHECK(!c.exact);
    CHECK(c.report.predicted_seconds == c.least_seconds);
    CHECK(c.least_seconds >= search.best.report.predicted_seconds);
    const ParallelCandidate whole = evaluate_plan(transformer, c, h100, int64_t(1) << 30, 16, 8);
    CHECK(whole.report.predicted_seconds >= c.least_seconds);
    CHECK(whole.report.predicted_seconds >= search.best.report.predicted_seconds);
  }
  MESSAGE(slower, " of ", search.candidates.size(), " candidates left at one block; ", bounded, " screened with a bound below them");
  CHECK(slower > 0);
  CHECK(bounded > 0);
  CHECK(search.left_slower == slower);
  CHECK(search.why.find(std::to_string(slower) + " were left at a first plan (one block)") != std::string::npos);
  CHECK(search.to_string().find("slower (at least: one block)") != std::string::npos);
  CHECK(nlohmann::json::parse(search.to_json())["left_slower"] == slower);
}

TEST_CASE("auto_parallelize recomputes activations only when no plan fits without") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(2, 64);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch roomy = auto_parallelize(model, 2, h100, int64_t(1) << 30, 16, 8, false);
  REQUIRE(roomy.best.fits);
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const ParallelCandidate& c : roomy.candidates) {
    CHECK_FALSE(c.activation_checkpointing);  // everything fits: nothing is recomputed
    smallest = std::min(smallest, c.report.peak_bytes);
  }
  // One byte below the smallest peak without recomputation: only recomputing plans can fit.
  const ParallelPlanSearch tight = auto_parallelize(model, 2, h100, smallest - 1, 16, 8, false);
  REQUIRE(tight.best.fits);
  REQUIRE(tight.best.activation_checkpointing);
  CHECK(tight.best.exact);
  CHECK(tight.best.report.peak_bytes < smallest);
  CHECK(tight.why.find("recomputes activations") != std::string::npos);
  CHECK(tight.best.name().find("+recompute-") != std::string::npos);
  CHECK(tight.to_json().find("\"activation_checkpointing\"") != std::string::npos);
  // The winner is what a plan of the full model with its recomputation says.
  GptConfig planned = config;
  planned.activation_checkpointing = tight.best.activation_checkpointing;
  planned.mixed_precision = tight.best.mixed_precision;
  const PlanReport again = plan_gpt_training_step(planned, abstract_mesh(tight.best.mesh, h100, 8), tight.best.sequence_parallel,
                                                  tight.best.fsdp, 16);
  CHECK(again.peak_bytes == tight.best.report.peak_bytes);
  // Recomputing costs time: the same mesh and styles without it were predicted faster.
  for (const ParallelCandidate& c : tight.candidates)
    if (!c.activation_checkpointing && c.mesh == tight.best.mesh && c.fsdp == tight.best.fsdp &&
        c.sequence_parallel == tight.best.sequence_parallel && c.mixed_precision == tight.best.mixed_precision) {
      GptConfig plain = config;
      plain.mixed_precision = c.mixed_precision;
      const PlanReport without = plan_gpt_training_step(plain, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16);
      CHECK(without.predicted_seconds < tight.best.report.predicted_seconds);
      CHECK(without.peak_bytes > tight.best.report.peak_bytes);
    }
}

TEST_CASE("auto_parallelize accumulates gradients where memory asks, planned as the accumulating step plans") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(2, 64);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch roomy = auto_parallelize(model, 2, h100, int64_t(1) << 30, 16, 8, false);
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const ParallelCandidate& c : roomy.candidates) {
    CHECK(c.microbatches == 1);  // everything fits: nothing accumulates
    smallest = std::min(smallest, c.report.peak_bytes);
  }
  // One byte below the smallest peak of one pass: accumulating (or recomputing) plans only.
  const ParallelPlanSearch tight = auto_parallelize(model, 2, h100, smallest - 1, 16, 8, false);
  REQUIRE(tight.best.fits);
  int64_t accumulating = 0;
  for (const ParallelCandidate& c : tight.candidates) {
    if (c.pipelined() || c.microbatches == 1) continue;
    ++accumulating;
    CAPTURE(c.name());
    CHECK(c.name().find(" +accumulate x" + std::to_string(c.microbatches)) != std::string::npos);
    CHECK((8 / c.size("dp")) % c.microbatches == 0);
    // Two blocks: screened exactly; the figures are the accumulating step's own.
    ParallelCandidate again = c;
    const ParallelCandidate evaluated = evaluate_plan(gpt_transformer_config(config), again, h100, smallest - 1, 16);
    CHECK(c.report.peak_bytes == evaluated.report.peak_bytes);
    CHECK(c.report.predicted_seconds == evaluated.report.predicted_seconds);
  }
  CHECK(accumulating > 0);
  // Accumulating over twice the microbatches holds less: each holds half the sequences.
  ParallelCandidate two, four;
  two.mesh = four.mesh = {{"dp", 2}};
  two.microbatches = 2, four.microbatches = 4;
  CHECK(evaluate_plan(gpt_transformer_config(config), four, h100, smallest, 16).report.peak_bytes <
        evaluate_plan(gpt_transformer_config(config), two, h100, smallest, 16).report.peak_bytes);
  if (tight.best.microbatches > 1) CHECK(tight.why.find("accumulates gradients over") != std::string::npos);
}

TEST_CASE("auto_parallelize searches pipelines: 1F1B stages over pp, planned as the pipelined step plans") {
  const Hardware h100 = hardware_profile("h100-sxm");
  GptConfig config = small_gpt(4, 32);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 4, h100, int64_t(1) << 30, 16, 8, /*search_precision=*/false);
  std::vector<const ParallelCandidate*> pipelines;
  for (const ParallelCandidate& c : search.candidates)
    if (c.pipelined()) pipelines.push_back(&c);
  // pp=2 (two blocks a stage) with tp=2, and pp=4 would leave one block a stage: not searched.
  // Its bubble could not hide a plan faster than dp=4's: not planned again with more microbatches.
  REQUIRE(pipelines.size() == 1);
  const ParallelCandidate& c = *pipelines.front();
  CHECK(c.name() == "pp=2,tp=2 +seq-parallel +1f1b x4");  // 16 sequences in 4 microbatches: 2P, the pipeline filled twice
  CHECK(c.exact);                           // four blocks are two a stage: the screening plan is the model
  const PlanReport whole =
      plan_pipelined_gpt_training_step(config, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16, c.microbatches);
  CHECK(whole.peak_bytes == c.report.peak_bytes);
  CHECK(whole.collective_bytes == c.report.collective_bytes);
  CHECK(whole.predicted_seconds == doctest::Approx(c.report.predicted_seconds));
  CHECK(search.to_json().find("\"microbatches\": 4") != std::string::npos);
  // Deeper models are screened from one and two blocks a stage, at least the two-block peak.
  config.layers = 8;
  Gpt deeper(config, abstract_mesh({{"dp", 1}}, h100, 8));
  for (const ParallelCandidate& d : auto_parallelize(deeper, 4, h100, int64_t(1) << 30, 16, 8, false).candidates) {
    if (!d.pipelined()) continue;
    CAPTURE(d.name());
    GptConfig two_a_stage = config;
    two_a_stage.layers = 2 * d.mesh.front().second;
    CHECK(d.report.peak_bytes >=
          plan_pipelined_gpt_training_step(two_a_stage, abstract_mesh(d.mesh, h100, 8), d.sequence_parallel, d.fsdp, 16, d.microbatches)
              .peak_bytes);
  }
}

TEST_CASE("auto_parallelize pipelines Llama-family and MoE models too: tp keeps whole kv heads, planned as the pipelined step plans") {
  const Hardware h100 = hardware_profile("h100-sxm");
  TransformerConfig config = transformer_preset("llama-tiny");
  config.layers = 4, config.heads = 4, config.kv_heads = 2, config.dim = 64, config.hidden = 128, config.max_seq = 32;
  Transformer model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 8, h100, int64_t(1) << 30, 16, 8, false);
  std::vector<const ParallelCandidate*> pipelines;
  for (const ParallelCandidate& c : search.candidates)
    if (c.pipelined()) pipelines.push_back(&c);
  // pp=2 and pp=4 would leave one block a stage at pp=4: only pp=2, with tp=2 (the widest that
  // keeps whole kv heads, 2 of them) and dp=2.
  REQUIRE(pipelines.size() == 1);
  const ParallelCandidate& c = *pipelines.front();
  CHECK(c.name() == "pp=2,dp=2,tp=2 +seq-parallel +1f1b x4");
  const PlanReport whole =
      plan_pipelined_transformer_training_step(config, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16, c.microbatches);
  CHECK(whole.peak_bytes == c.report.peak_bytes);
  CHECK(whole.collective_bytes == c.report.collective_bytes);
  // A model with MoE layers is pipelined too, with and without ep borrowing its dp ranks.
  TransformerConfig moe = config;
  moe.moe = MoEConfig{.num_experts = 4, .top_k = 2, .expert_hidden = 64};
  Transformer moe_model(moe, abstract_mesh({{"dp", 1}}, h100, 8));
  std::vector<std::string> moe_pipelines;
  for (const ParallelCandidate& d : auto_parallelize(moe_model, 8, h100, int64_t(1) << 30, 16, 8, false).candidates)
    if (d.pipelined()) moe_pipelines.push_back(d.name());
  std::sort(moe_pipelines.begin(), moe_pipelines.end());
  CHECK(moe_pipelines == std::vector<std::string>{"pp=2,dp=2,tp=2 +seq-parallel +1f1b x4", "pp=2,ep=2,tp=2 +seq-parallel +1f1b x4"});
}

TEST_CASE("auto_parallelize plans a pipeline again with more microbatches where its bubble may hide a faster plan") {
  // Links so slow that dp's gradient all_reduce costs more than a pipeline's bubble, and one
  // device a node (no tp): the pipelines win, so their bubbles are worth shrinking.
  Hardware slow = hardware_profile("h100-sxm");
  slow.name = "h100 with 100 MB/s links";
  slow.intra_node.bytes_per_second = slow.inter_node.bytes_per_second = 1e8;
  const GptConfig config = small_gpt(8, 32);
  Gpt model(config, abstract_mesh({{"dp", 1}}, slow, 1));
  const ParallelPlanSearch search = auto_parallelize(model, 4, slow, int64_t(1) << 30, 16, 1, false);
  REQUIRE(search.best.pipelined());
  std::map<std::string, const ParallelCandidate*> by_name;
  for (const ParallelCandidate& c : search.candidates) by_name[c.name()] = &c;
  // pp=4 (16 sequences, dp=1): 8 microbatches fill it twice; 16, every sequence its own
  // microbatch, is the most searched.
  REQUIRE(by_name.count("pp=4 +1f1b x8"));
  REQUIRE(by_name.count("pp=4 +1f1b x16"));
  REQUIRE(by_name.count("pp=2,dp=2 +1f1b x8"));  // 8 sequences a replica: 4, then 8
  // The fastest that fits before any pipeline was planned again (each filled twice here).
  double fastest_before = std::numeric_limits<double>::infinity();
  for (const ParallelCandidate& c : search.candidates)
    if (c.fits && !(c.pipelined() && c.microbatches > 2 * c.mesh.front().second))
      fastest_before = std::min(fastest_before, c.report.predicted_seconds);
  for (const ParallelCandidate& c : search.candidates) {
    if (!c.pipelined()) continue;
    CAPTURE(c.name());
    const int64_t stages = c.mesh.front().second;
    CHECK(c.microbatches <= std::max<int64_t>(4 * stages, 128));
    if (c.microbatches <= 2 * stages) continue;
    // Planned again only where the 2P plan without any bubble would beat the fastest that fits.
    ParallelCandidate first = c;
    first.microbatches = 2 * stages;
    REQUIRE(by_name.count(first.name()));
    const ParallelCandidate& twice = *by_name[first.name()];
    CHECK(twice.report.predicted_seconds * double(2 * stages) / double(3 * stages - 1) < fastest_before);
    // Screened as the pipelined step with that many microbatches plans (two blocks a stage for pp=4: exact).
    if (!c.exact) continue;
    const PlanReport whole =
        plan_pipelined_gpt_training_step(config, abstract_mesh(c.mesh, slow, 1), c.sequence_parallel, c.fsdp, 16, c.microbatches);
    CHECK(whole.peak_bytes == c.report.peak_bytes);
    CHECK(whole.collective_bytes == c.report.collective_bytes);
    CHECK(whole.predicted_seconds == doctest::Approx(c.report.predicted_seconds));
  }
  // Smaller microbatches hold less in flight.
  CHECK(by_name["pp=4 +1f1b x16"]->report.peak_bytes < by_name["pp=4 +1f1b x8"]->report.peak_bytes);
  // Past 4P: a 1F1B plan costs the same whatever its microbatch count (its tick programs are
  // planned once, nn/pipeline_tick_loop.hpp), so two stages are searched with all 16 sequences
  // as microbatches, not only 4P = 8, and the bubble shrinks from 1/9 to 1/17.
  const ParallelPlanSearch two = auto_parallelize(model, 2, slow, int64_t(1) << 30, 16, 1, false);
  std::set<std::string> names;
  for (const ParallelCandidate& c : two.candidates) names.insert(c.name());
  CHECK(names.count("pp=2 +1f1b x4"));
  CHECK(names.count("pp=2 +1f1b x16"));
}

TEST_CASE("auto_parallelize recomputes a pipeline's activations where it does not fit, planned as the pipelined step plans") {
  const Hardware h100 = hardware_profile("h100-sxm");
  GptConfig config = small_gpt(4, 32);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  // Nothing fits 1 KiB: every candidate is planned again recomputing, pipelines too, each from
  // one block a stage (already over the budget: a lower bound).
  const ParallelPlanSearch search = auto_parallelize(model, 4, h100, 1024, 16, 8, false);
  std::map<std::optional<CheckpointPolicy>, int64_t> pipelined_peaks;
  for (const ParallelCandidate& c : search.candidates) {
    if (!c.pipelined()) continue;
    CAPTURE(c.name());
    CHECK(c.lower_bound);
    GptConfig one_a_stage = config;
    one_a_stage.layers = c.mesh.front().second;
    one_a_stage.activation_checkpointing = c.activation_checkpointing;
    const PlanReport planned =
        plan_pipelined_gpt_training_step(one_a_stage, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16, c.microbatches);
    CHECK(planned.peak_bytes == c.report.peak_bytes);
    pipelined_peaks[c.activation_checkpointing] = c.report.peak_bytes;
  }
  REQUIRE(pipelined_peaks.size() == 3);  // none, selective, full
  CHECK(pipelined_peaks[CheckpointPolicy::Selective] < pipelined_peaks[std::nullopt]);
}

TEST_CASE("auto_parallelize searches bf16 mixed precision beside the model's f32") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(2, 32);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 4, h100, int64_t(1) << 30, 16);
  // Every shape twice: f32 and FSDP2's bf16 policy, each what planning the step with it says.
  int64_t f32 = 0, bf16 = 0;
  for (const ParallelCandidate& c : search.candidates) {
    CAPTURE(c.name());
    CHECK(c.exact);  // two blocks: the screening plans are the model's
    if (!c.mixed_precision) {
      ++f32;
      continue;
    }
    ++bf16;
    CHECK(*c.mixed_precision == kBf16MixedPrecision);
    CHECK(c.name().find(" +bf16") != std::string::npos);
    if (c.pipelined()) continue;
    GptConfig planned = config;
    planned.mixed_precision = c.mixed_precision;
    const PlanReport again = plan_gpt_training_step(planned, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16);
    CHECK(again.peak_bytes == c.report.peak_bytes);
    CHECK(again.collective_bytes == c.report.collective_bytes);
  }
  CHECK(f32 == bf16);
  CHECK(search.to_json().find("\"precision\": \"bf16\"") != std::string::npos);
  // Kept to the model's precision when asked, and a bf16 model is searched in bf16 only.
  for (const ParallelCandidate& c : auto_parallelize(model, 4, h100, int64_t(1) << 30, 16, 8, false).candidates)
    CHECK_FALSE(c.mixed_precision);
  GptConfig mixed = config;
  mixed.mixed_precision = kBf16MixedPrecision;
  Gpt bf16_model(mixed, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch in_bf16 = auto_parallelize(bf16_model, 4, h100, int64_t(1) << 30, 16);
  CHECK(in_bf16.candidates.size() == size_t(bf16));
  for (const ParallelCandidate& c : in_bf16.candidates) CHECK(c.mixed_precision == std::optional{kBf16MixedPrecision});
}

TEST_CASE("auto_parallelize's pruned recomputation and accumulation lose nothing: every such plan that fits is slower than its winner") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const GptConfig config = small_gpt(2, 64);
  Gpt model(config, abstract_mesh({{"dp", 1}}, h100, 8));
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const ParallelCandidate& c : auto_parallelize(model, 4, h100, int64_t(1) << 30, 16, 8, false).candidates)
    smallest = std::min(smallest, c.report.peak_bytes);
  // Between the smallest peak without recomputation and the peaks of most plans: some fit as
  // they are, others only recomputing, and some of those need not be planned.
  const int64_t budget = smallest + smallest / 8;
  const ParallelPlanSearch search = auto_parallelize(model, 4, h100, budget, 16, 8, false);
  REQUIRE(search.best.fits);
  CHECK(search.pruned > 0);
  // Every shape and precision with every recomputation, planned: none that fits beats the winner.
  int64_t planned = 0;
  for (const ParallelCandidate& c : search.candidates) {
    if (c.activation_checkpointing || c.pipelined() || c.microbatches > 1) continue;
    // Gradient accumulation over every count the search could try (a replica's sequences split
    // into 2 to 16 microbatches).
    for (int64_t m = 2; m <= 16; ++m) {
      if ((16 / (c.size("dp") * c.size("ep"))) % m != 0) continue;
      ParallelCandidate accumulating = c;
      accumulating.microbatches = m;
      const ParallelCandidate r = evaluate_plan(gpt_transformer_config(config), accumulating, h100, budget, 16);
      ++planned;
      if (r.fits) {
        CAPTURE(r.name());
        CHECK(r.report.predicted_seconds >= search.best.report.predicted_seconds);
      }
    }
    for (const CheckpointPolicy policy : {CheckpointPolicy::Selective, CheckpointPolicy::Full}) {
      GptConfig recomputing = config;
      recomputing.activation_checkpointing = policy;
      recomputing.mixed_precision = c.mixed_precision;
      const PlanReport r = plan_gpt_training_step(recomputing, abstract_mesh(c.mesh, h100, 8), c.sequence_parallel, c.fsdp, 16);
      ++planned;
      if (r.peak_bytes <= budget) {
        CAPTURE(c.name());
        CHECK(r.predicted_seconds >= search.best.report.predicted_seconds);
      }
    }
  }
  CHECK(planned > search.pruned);
}

TEST_CASE("auto_parallelize plans on several threads what it plans on one") {
  const Hardware h100 = hardware_profile("h100-sxm");
  Gpt model(small_gpt(4, 32), abstract_mesh({{"dp", 1}}, h100, 8));
  auto search_on = [&](const char* threads) {
    setenv("TESSERA_PLAN_THREADS", threads, 1);
    const ParallelPlanSearch search = auto_parallelize(model, 4, h100, int64_t(1) << 30, 16, 8, false);
    unsetenv("TESSERA_PLAN_THREADS");
    return search;
  };
  const ParallelPlanSearch one = search_on("1"), three = search_on("3");
  REQUIRE(one.candidates.size() == three.candidates.size());
  CHECK(one.best.name() == three.best.name());
  for (size_t i = 0; i < one.candidates.size(); ++i) {
    const ParallelCandidate &a = one.candidates[i], &b = three.candidates[i];
    CAPTURE(a.name());
    CHECK(a.name() == b.name());
    CHECK(a.report.peak_bytes == b.report.peak_bytes);
    CHECK(a.report.collective_bytes == b.report.collective_bytes);
    CHECK(a.report.predicted_seconds == b.report.predicted_seconds);
  }
  setenv("TESSERA_PLAN_THREADS", "many", 1);
  CHECK_THROWS_WITH_AS(auto_parallelize(model, 4, h100, int64_t(1) << 30, 16), doctest::Contains("TESSERA_PLAN_THREADS"), Error);
  unsetenv("TESSERA_PLAN_THREADS");
}

TEST_CASE("the MNIST training step's predicted peak bytes are measured exactly, data and tensor parallel") {
  for (const auto& [devices, tensor_parallel] : {std::pair{1, false}, std::pair{2, false}, std::pair{3, false}, std::pair{8, false},
                                                 std::pair{4, true}}) {
    CAPTURE(devices);
    CAPTURE(tensor_parallel);
    const Mesh mesh = create_mesh({{tensor_parallel ? "model" : "batch", devices}}, cpu_devices(devices));
    MnistTrainingStep step(mesh, tensor_parallel);
    check_plan_is_measured(mesh, [&] { return step.plan(); }, [&] { step.run(); });
  }
}
