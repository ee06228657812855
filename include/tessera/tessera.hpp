// Tessera's public header: everything a user program needs (API.md).
#pragma once

#include "comm/comm_debug_mode.hpp"
#include "dsl/array.hpp"
#include "dsl/dtype.hpp"
#include "dsl/error.hpp"
#include "dsl/format.hpp"
#include "dsl/layout.hpp"
#include "dsl/mesh.hpp"
#include "dsl/placement.hpp"
#include "dsl/tensor.hpp"
#include "jit/runtime.hpp"
#include "jit/tensor_api.hpp"
#include "jit/visualize_sharding.hpp"
#include "dsl/ops.hpp"
#include "jit/explain.hpp"
#include "jit/jit_function.hpp"
