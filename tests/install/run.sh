#!/usr/bin/env bash
# The install as users get it (README "C and C++"): `cmake --install` into a
# prefix, then a downstream program built against that prefix four ways, each
# run, each checked for what it links (readelf's NEEDED entries):
#   find_package(npyload), npyload::npyload          -> needs libnpyload.so (rpath from CMake)
#   find_package(npyload), npyload::npyload_static   -> no libnpyload.so
#   pkg-config --cflags --libs npyload (+ -Wl,-rpath) -> needs libnpyload.so
#   pkg-config --static --cflags --libs npyload-static -> no libnpyload.so
#   the same, the consumer compiled as C++ (the header's extern "C")
#
#   bash tests/install/run.sh BUILD_DIR     (a configured and built tree)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:?usage: $0 BUILD_DIR}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
I="$PWD/$B/_install"
C="$B/_consumer"
rm -rf "$I" "$C"
cmake --install "$B" --prefix "$I" >/dev/null
export PKG_CONFIG_PATH="$I/lib/pkgconfig"
cmake -S tests/install -B "$C" "${GEN[@]}" -DCMAKE_PREFIX_PATH="$I" >/dev/null
cmake --build "$C" >/dev/null
cc tests/install/consumer.c $(pkg-config --cflags --libs npyload) \
   -Wl,-rpath,"$(pkg-config --variable=libdir npyload)" -o "$C/consumer_pc"
cc tests/install/consumer.c $(pkg-config --static --cflags --libs npyload-static) \
   -o "$C/consumer_pc_static"
c++ -x c++ -std=c++17 -Wall -Wextra -Werror tests/install/consumer.c -x none \
   $(pkg-config --static --cflags --libs npyload-static) -o "$C/consumer_cxx_static"

G=tests/golden/dt_f4_le.npy
fail=0
check() {   # check PROGRAM shared|static
  local exe=$C/$1 want=$2 needed out
  needed=$(readelf -d "$exe" | grep NEEDED || true)
  if grep -q 'libnpyload\.so' <<<"$needed"; then got=shared; else got=static; fi
  if [[ $got != "$want" ]]; then
    echo "install: $1 links npyload $got, $want expected; its NEEDED entries:" >&2
    echo "$needed" >&2
    fail=1
    return
  fi
  # No LD_LIBRARY_PATH: the shared ones find the library through their rpath.
  if ! out=$(env -u LD_LIBRARY_PATH "$exe" "$G"); then
    echo "install: $1 failed to run" >&2
    fail=1
    return
  fi
  if [[ $out != *"<f4 ndim="* ]]; then
    echo "install: $1 printed '$out', the header of $G expected" >&2
    fail=1
    return
  fi
  echo "install: $1 ($got npyload): $out"
}
check consumer_shared shared
check consumer_static static
check consumer_pc shared
check consumer_pc_static static
check consumer_cxx_static static
exit $fail
