#!/usr/bin/env bash
# Every symbol the libraries export starts with trill_ (ARCHITECTURE.md): internal interfaces
# between files too (trill_rl_*, trill_eng_*, ...), so an embedder linking trill_core meets no
# unprefixed name. The client library (libtrill_client.a) uses trillc_; the compilers add
# .gomp_critical_* (OpenMP) and, in the ASan build, __odr_asan.* beside each global.
# Usage: exports.sh BUILD_DIR
set -euo pipefail
B=$1
bad=$(for lib in "$B"/libtrill_*.a; do
  case "$(basename "$lib")" in libtrill_client.a) prefix='^trillc_' ;; *) prefix='^trill_' ;; esac
  nm -g --defined-only "$lib" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBRC]/ { print $3 }' |
    grep -vE "$prefix|^\.gomp_critical_|^__odr_asan\." | sed "s|^|$(basename "$lib"): |" || true
done)
[ -z "$bad" ] || { echo "exported symbols without the trill_ prefix:"; echo "$bad"; exit 1; }
n=$(for lib in "$B"/libtrill_*.a; do nm -g --defined-only "$lib" | awk 'NF == 3 && $2 ~ /[TDBRC]/' ; done | wc -l)
echo "exports: $n exported symbols, every one prefixed"
