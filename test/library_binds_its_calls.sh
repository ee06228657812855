#!/usr/bin/env bash
# libtessera's calls to its own functions go to its own code (meson.build: -Bsymbolic-functions,
# -fvisibility-inlines-hidden). A call through the PLT to a function the library defines can be
# taken by a program's copy of it (symbol interposition): a program built at -O0, as a debug
# build or the test suites are, then ran the library's containers and shared pointers at -O0 and
# slowed its planner by a third.
#   test/library_binds_its_calls.sh LIBRARY
set -euo pipefail
library=$1
# PLT slots whose symbol the library defines (a value other than 0): interposable calls.
own=$(readelf -rW "$library" | awk '$3 ~ /_JUMP_SLOT$/ && $4 !~ /^0+$/ {print $5}')
if [[ -n $own ]]; then
  echo "$library calls $(wc -l <<< "$own") of its own functions through the PLT, for example:"
  head -5 <<< "$own" | c++filt
  exit 1
fi
# Its inline functions are its own too: not exported at all.
exports=$(nm -DC --defined-only "$library")
if grep -qF 'std::_Sp_counted_base<(__gnu_cxx::_Lock_policy)2>::_M_release()' <<< "$exports"; then
  echo "$library exports its copy of shared_ptr's inline _M_release"
  exit 1
fi
# The API is still exported (an empty export table would pass the checks above).
grep -qF 'tessera::create_mesh(' <<< "$exports" || { echo "$library exports no tessera::create_mesh"; exit 1; }
echo "$library: $(wc -l <<< "$exports") exported symbols; every call to its own functions binds within it"
