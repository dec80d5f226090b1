#!/bin/sh
# The C client (clients/c) against a real trill serve on a free loopback port: every call and the
# errors' codes (tests/service/c_client_check.c). The server stops by itself after 150 s at most.
# Usage: test_c_client.sh TRILL C_CLIENT_CHECK
set -e
trill=$1 check=$2
d=$(mktemp -d)
pid=
trap 'if [ -n "$pid" ]; then kill $pid 2>/dev/null; wait $pid || true; fi; rm -rf "$d"' EXIT
cd "$d"
"$trill" init --out tiny --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 --set head_dim=16 --seed 3 >/dev/null 2>&1
key=$("$trill" serve keys add me --state st)
"$trill" serve --models tiny --state st --listen 127.0.0.1:0 --port-file port --max-seconds 150 2>serve.log &
pid=$!
i=0
while [ ! -s port ]; do
    i=$((i + 1))
    if [ $i -ge 600 ] || ! kill -0 $pid 2>/dev/null; then cat serve.log; exit 1; fi
    sleep 0.1
done
"$check" "http://127.0.0.1:$(cat port)" "$key"
if grep -nE "Sanitizer|runtime error:" serve.log; then exit 1; fi
