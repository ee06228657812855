// numpy / TensorFlow style text of an array: "[[0 1] [2 3]]", floats with up to 9 significant
// digits ("1", "0.0368092842"), bools as True/False; arrays over 1000 elements show 3 items at
// each edge of every axis with "..." between (numpy's summarisation).
#pragma once

#include <string>

#include "dsl/array.hpp"

namespace tessera {

std::string array_to_string(const Array& array);

}  // namespace tessera
