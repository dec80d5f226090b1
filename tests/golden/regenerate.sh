#!/usr/bin/env bash
# Rewrites the golden files from the code as it is now: golden.bin with the release build,
# golden-sanitize.bin with the ASan+UBSan build, under the environment ctest pins. Only when an
# output change is intended: say which outputs change and why in the commit (README.md).
# Usage: tests/golden/regenerate.sh [BUILD_DIR [ASAN_BUILD_DIR]]   (default build, build-asan)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
asan=${2:-$root/build-asan}
export OPENBLAS_CORETYPE=Haswell TRILL_GEN_ISA=avx2 OPENBLAS_NUM_THREADS=1 GOMP_SPINCOUNT=10000
export ASAN_OPTIONS=exitcode=86 UBSAN_OPTIONS=exitcode=87:print_stacktrace=1
for pair in "$build:golden.bin" "$asan:golden-sanitize.bin"; do
  dir=${pair%%:*} file=$root/tests/golden/${pair##*:}
  cmake --build "$dir" --target golden_tool -- --no-print-directory >/dev/null
  "$dir/tests/golden_tool" write "$file"
  "$dir/tests/golden_tool" check "$file" | tail -1
done
