#!/usr/bin/env bash
# test_deps.sh - dependencies point one way (coordinator, worker -> proto ->
# common <- kernels):
# - programs that must not need the coordinator (build/deps/moe_only, a
#   worker's expert path from kernels + common; bin/ecs-worker once
#   tools/ecs-worker exists) define no symbol that libecs_coord.a defines
#   (nm), and moe_only's two expert holders give the one-process bits;
# - no source includes a header against the direction.
# usage: tests/integration/test_deps.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_deps.sh BUILD_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

coord_lib="$build/lib/libecs_coord.a"
[ -s "$coord_lib" ] || bad "no $coord_lib"
nm -g --defined-only "$coord_lib" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/coord.sym"
[ -s "$tmp/coord.sym" ] || bad "no symbols read from $coord_lib"
grep -qx model_load "$tmp/coord.sym" || bad "model_load not among the coordinator's symbols"

bins=("$build/deps/moe_only")
[ -d tools/ecs-worker ] && bins+=("$build/bin/ecs-worker")
for b in "${bins[@]}"; do
    [ -x "$b" ] || { bad "$b was not built"; continue; }
    nm --defined-only "$b" | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/bin.sym"
    comm -12 "$tmp/coord.sym" "$tmp/bin.sym" >"$tmp/both"
    [ -s "$tmp/both" ] && bad "$b holds coordinator symbols: $(head -5 "$tmp/both" | tr '\n' ' ')"
    grep -qx kmoe_prepare "$tmp/bin.sym" || bad "$b has no kmoe_prepare (is the check reading it?)"
    echo "ok   $(basename "$b"): $(wc -l <"$tmp/bin.sym") symbols, none of the coordinator's"
done

# ecsctl (the admin client) links proto and common only
if [ -d tools/ecsctl ]; then
    nm --defined-only "$build/bin/ecsctl" | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/ctl.sym"
    comm -12 "$tmp/coord.sym" "$tmp/ctl.sym" >"$tmp/both"
    if [ -s "$tmp/both" ]; then bad "ecsctl holds coordinator symbols: $(head -5 "$tmp/both" | tr '\n' ' ')"
    elif ! grep -qx admin_req_encode "$tmp/ctl.sym"; then bad "ecsctl has no admin_req_encode"
    elif grep -qx kmoe_prepare "$tmp/ctl.sym"; then bad "ecsctl holds the kernels"
    else echo "ok   ecsctl: proto and common only"; fi
fi

# moe_only works: a layer's experts split over two holders, one with the
# interleaved copy of just its experts, summed: the one-holder bits
model="$tmp/ds2.gguf"
"$build/bin/ecs-mkmodel" --arch deepseek2 --preset tiny --types q4_k_m --seed 5 -o "$model" \
    >/dev/null 2>&1 || bad "ecs-mkmodel"
before=$fail
out=$("$build/deps/moe_only" "$model" "$tmp/cache" 2>&1) || bad "moe_only failed: $out"
echo "$out" | grep -q "same bits" || bad "moe_only: $out"
echo "$out" | grep -q "([1-9][0-9]* matrices copied" || bad "moe_only copied nothing: $out"
ls "$tmp/cache"/moe_only.*.r16 >/dev/null 2>&1 || bad "moe_only made no copy file"
[ $fail = "$before" ] && echo "ok   $out"

# includes against the direction
check_inc() { # FOLDER PATTERN WHY
    local hits
    hits=$(grep -rlE "#include \"($2)" "$1" --include='*.[ch]' 2>/dev/null)
    [ -n "$hits" ] && bad "$1 includes $3: $hits"
}
check_inc common 'kernels/|coordinator/|proto/|worker/' "headers of a higher layer"
check_inc kernels 'coordinator/|proto/|worker/' "coordinator, proto or worker headers"
[ -d proto ] && check_inc proto 'coordinator/|worker/|kernels/' "coordinator, worker or kernels headers"
[ -d worker ] && check_inc worker 'coordinator/' "coordinator headers"
[ -d coordinator ] && check_inc coordinator 'worker/' "worker headers"
[ $fail -eq 0 ] && echo "test_deps: all passed"
exit $fail
