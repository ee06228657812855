// The suites' main. Under TESSERA_DEVICE_TYPE=GPU every mesh made without a device list is a
// GPU mesh (dsl/mesh.hpp), so the differential suites run again on GPUs; where the process has
// none they report skipped (exit code 77, meson's SKIP) instead of passing on CPUs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <tessera/tessera.hpp>

int main(int argc, char** argv) {
  if (tessera::default_device_type() == "GPU" && tessera::gpu_devices().empty()) {
    std::puts("skipped: TESSERA_DEVICE_TYPE=GPU, and this process has no GPU");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
