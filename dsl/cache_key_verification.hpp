// Whether every cache hit is checked against the work it saves (equal keys must mean equal
// results; an InternalError names both otherwise): the executable cache's partitioned programs
// (jit/driver.cpp) and the lowering memo's kernels (codegen/lowering_memo.cpp). Always in debug
// builds, and where TESSERA_VERIFY_CACHE_KEYS=1 (the test suites set it). Read once.
#pragma once

namespace tessera {

bool verify_cache_keys();

}  // namespace tessera
