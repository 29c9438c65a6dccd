# ECS - one entry point: make, make deps, make test, make run, make bench.
#
# Layout: one static library per top-level folder (libecs_common,
# libecs_kernels, libecs_proto, libecs_coord, libecs_worker; proto/ and
# worker/ as soon as they hold sources); every folder under tools/ is one
# program; every tests/unit/test_*.c is one Criterion binary. New files are
# picked up by the wildcards below, so adding a source needs no edit here.
# Libraries follow the dependency direction (coordinator, worker -> proto ->
# common <- kernels): tools/ecs-worker links worker, proto, kernels and
# common only, and tests/integration/test_deps.sh checks with nm that it
# (and build/deps/moe_only, kernels + common) holds no coordinator symbol.
# SIMD files are chosen by suffix: *_avx2.c, *_avx512.c and *_amx.c get their ISA's
# flags; nothing else is built with -m flags, so one binary runs on any
# x86-64 and picks its kernels at run time.

CC      ?= gcc
BUILD   ?= build
PYTHON  ?= /usr/bin/python3
SAN     ?=
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -pthread -I. -I$(BUILD)/gen \
              -fno-strict-aliasing
ifeq ($(SAN),1)
CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN = -fsanitize=address,undefined
endif
CFLAGS  = $(CFLAGS_BASE) $(EXTRA_CFLAGS)
LDLIBS  = -lpcre2-8 -lev -lhttp_parser -ljansson -lprotobuf-c -lzmq -lm -lpthread -ldl
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16
AMX_FLAGS    = $(AVX512_FLAGS) -mamx-tile -mamx-bf16

COMMON_SRC  = $(wildcard common/*.c)
# kernels/cuda/ holds .cu files only: built into libecs_cuda.so below
KERNELS_SRC = $(wildcard kernels/*/*.c)
# proto/ecs.proto is compiled by protoc-c into $(BUILD)/gen/proto/ (never
# committed); proto/*.c include it as "proto/ecs.pb-c.h".
PROTO_GEN_C = $(BUILD)/gen/proto/ecs.pb-c.c
PROTO_GEN_H = $(BUILD)/gen/proto/ecs.pb-c.h
PROTO_SRC   = $(wildcard proto/*.c proto/*/*.c) $(PROTO_GEN_C)
COORD_SRC   = $(filter-out coordinator/main.c,$(wildcard coordinator/*/*.c))
WORKER_SRC  = $(wildcard worker/*.c worker/*/*.c)
TOOLS       = $(notdir $(wildcard tools/ecs-* tools/ecsctl))
UNIT_SRC    = $(wildcard tests/unit/test_*.c)
BENCH_SRC   = $(wildcard tests/bench/bench_*.c)
DEPS_SRC    = $(wildcard tests/deps/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_COMMON  = $(BUILD)/lib/libecs_common.a
LIB_KERNELS = $(BUILD)/lib/libecs_kernels.a
LIB_PROTO   = $(BUILD)/lib/libecs_proto.a
LIB_COORD   = $(BUILD)/lib/libecs_coord.a
LIB_WORKER  = $(BUILD)/lib/libecs_worker.a
# what a program links, in dependency order: the coordinator side (every
# tool but the worker), the worker side (never the coordinator: test_deps.sh
# and test_workers.sh check with nm), and all (tests)
LIBS_COORD  = $(LIB_COORD) $(LIB_PROTO) $(LIB_KERNELS) $(LIB_COMMON)
LIBS_WORKER = $(LIB_WORKER) $(LIB_PROTO) $(LIB_KERNELS) $(LIB_COMMON)
LIBS        = $(LIB_COORD) $(LIB_WORKER) $(LIB_PROTO) $(LIB_KERNELS) $(LIB_COMMON)
# ecsctl talks to the admin endpoint: proto and common only
tool_libs   = $(if $(filter ecs-worker,$(1)),$(LIBS_WORKER),$(if $(filter ecsctl,$(1)),$(LIB_PROTO) $(LIB_COMMON),$(LIBS_COORD)))
BINS        = $(addprefix $(BUILD)/bin/,$(TOOLS))
UNIT_BINS   = $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
BENCH_BINS  = $(patsubst tests/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
DEPS_BINS   = $(patsubst tests/deps/%.c,$(BUILD)/deps/%,$(DEPS_SRC))

.DEFAULT_GOAL := all

# ---- the CUDA backend: a shared object loaded with dlopen (kernels/gpu), built
# only where nvcc exists, so no other binary links libcudart ----
ifndef NVCC
NVCC := $(shell command -v nvcc 2>/dev/null || \
          { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
endif
CUDA_ARCHS ?= 80 86 89 90
CUDA_SRC = $(wildcard kernels/cuda/*.cu)
ifneq ($(NVCC),)
CUDA_LIBDIR = $(abspath $(dir $(NVCC))/../lib64)
LIB_CUDA = $(BUILD)/lib/libecs_cuda.so
NVCC_FLAGS = -std=c++17 -O2 -I. -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror \
             $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_90,code=compute_90
$(LIB_CUDA): $(CUDA_SRC) kernels/gpu/gpu.h kernels/gpu/deq.h common/quant.h common/err.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -shared -cudart shared -Xlinker -rpath,$(CUDA_LIBDIR) -o $@ $(CUDA_SRC)
endif

.PHONY: all deps test unit asan fuzz integration bench soak run clean
all: $(BINS) $(UNIT_BINS) $(BENCH_BINS) $(DEPS_BINS) $(LIB_CUDA)

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_amx.o: %_amx.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AMX_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_KERNELS): $(call obj,$(KERNELS_SRC))
$(LIB_COORD): $(call obj,$(COORD_SRC))
$(LIB_PROTO): $(call obj,$(PROTO_SRC))
$(LIB_WORKER): $(call obj,$(WORKER_SRC))

$(PROTO_GEN_H): $(PROTO_GEN_C)
$(PROTO_GEN_C): proto/ecs.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen $<
# whatever may include the generated header waits for it
$(call obj,$(wildcard proto/*.c) $(WORKER_SRC) $(COORD_SRC) $(wildcard tools/*/*.c) \
    $(wildcard tests/unit/test_*.c) $(wildcard tests/bench/*.c)): | $(PROTO_GEN_H)
# the console page (coordinator/api/console.html) as a byte array, made with
# od (coreutils) so that the page is served from the binary
CONSOLE_H = $(BUILD)/gen/coordinator/api/console_html.h
$(CONSOLE_H): coordinator/api/console.html
	@mkdir -p $(dir $@)
	{ echo 'static const unsigned char api_console_html[] = {'; \
	  od -An -v -tx1 $< | sed 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g'; echo '};'; } >$@.tmp && mv $@.tmp $@
$(BUILD)/obj/coordinator/api/console.o: $(CONSOLE_H)
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

.SECONDEXPANSION:
$(BUILD)/bin/%: $$(call obj,$$(wildcard tools/%/*.c)) $$(call tool_libs,%)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $(call obj,$(wildcard tools/$*/*.c)) $(call tool_libs,$*) $(LDLIBS)
$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $< $(LIBS) $(LDLIBS) -lcriterion
$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $< $(LIBS) $(LDLIBS)
# programs that must not depend on the coordinator: kernels and common only
# (a coordinator symbol would not link; test_deps.sh checks with nm too)
$(BUILD)/deps/%: $(BUILD)/obj/tests/deps/%.o $(LIB_KERNELS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $< $(LIB_KERNELS) $(LIB_COMMON) -lm -lpthread

# ---- installing what the project needs (Debian, as root; idempotent) ----
DEB_PKGS = gcc make libcriterion-dev libpcre2-dev clang libclang-rt-14-dev python3-numpy \
           protobuf-c-compiler libprotobuf-c-dev libzmq3-dev python3-zmq \
           libev-dev libhttp-parser-dev libjansson-dev nodejs curl haproxy prometheus chromium
# the RDMA data plane (proto/dplane/rdma.c) compiles its verbs code where the
# header is, and loads libibverbs with dlopen: nothing links it
DEB_PKGS += libibverbs-dev
# fincore: the benchmarks check the decode copies are in the page cache
DEB_PKGS += util-linux-extra
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# ---- tests ----
unit: $(UNIT_BINS)
	tests/run_unit.sh $(BUILD) $(UNIT_BINS)

asan:
	$(MAKE) BUILD=build/asan SAN=1 OPT=-O1 unit

FUZZ_SRC = $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS = $(patsubst tests/fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
# A fuzz target links common/ and proto/ (with the generated protobuf-c code)
# built from source with the fuzzer's instrumentation.
FUZZ_LIB_SRC = $(COMMON_SRC) $(wildcard proto/*.c) proto/dplane/shm.c build/gen/proto/ecs.pb-c.c
build/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB_SRC) $(wildcard common/*.h proto/*.h proto/dplane/*.h)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -Ibuild/gen -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_LIB_SRC) -lprotobuf-c -lzmq -ljansson -lm -lpthread
ifneq ($(BUILD),build)
build/gen/proto/ecs.pb-c.c: proto/ecs.proto
	@mkdir -p build/gen
	protoc-c --c_out=build/gen $<
endif
# the request parser of ecs-coordinator: HTTP framing and JSON into api_req_t
FUZZ_API_SRC = coordinator/api/hparse.c coordinator/api/req.c coordinator/api/tools.c \
  coordinator/api/tools_v3.c \
  coordinator/api/reasoning.c coordinator/api/buf.c $(wildcard coordinator/sampler/*.c)
build/fuzz/fuzz_api_req: tests/fuzz/fuzz_api_req.c $(FUZZ_API_SRC) $(COMMON_SRC) $(wildcard coordinator/api/*.h)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined -o $@ $< \
	  $(FUZZ_API_SRC) $(COMMON_SRC) -ljansson -lhttp_parser -lm -lpthread
# JSON mode's recogniser against jansson
build/fuzz/fuzz_json_mode: tests/fuzz/fuzz_json_mode.c coordinator/sampler/json.c coordinator/sampler/json_schema.c coordinator/sampler/sampler.h coordinator/sampler/json_int.h
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined -o $@ $< \
	  coordinator/sampler/json.c coordinator/sampler/json_schema.c $(COMMON_SRC) -ljansson -lm -lpthread
# the reader of the prefix cache's file (--prefix-cache-dir): the format
# alone, no model
FUZZ_KVB_SRC = coordinator/sched/kvfile.c coordinator/kvcache/kvcache.c
build/fuzz/fuzz_kvblocks: tests/fuzz/fuzz_kvblocks.c $(FUZZ_KVB_SRC) $(COMMON_SRC) coordinator/sched/sched_int.h
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined -o $@ $< \
	  $(FUZZ_KVB_SRC) $(COMMON_SRC) -ljansson -lm -lpthread
# the tokenizer (user text into ids, ids into text) and its reading of a
# model file's tokenizer.* keys
FUZZ_TOK_SRC = $(wildcard coordinator/tokenizer/*.c)
build/fuzz/fuzz_tokenizer build/fuzz/fuzz_tok_load: build/fuzz/%: tests/fuzz/%.c $(FUZZ_TOK_SRC) $(COMMON_SRC) coordinator/tokenizer/tokenizer.h tests/unit/utf8_check.h
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined -o $@ $< \
	  $(FUZZ_TOK_SRC) $(COMMON_SRC) -lpcre2-8 -lm -lpthread
# placement files (--placement FILE)
build/fuzz/fuzz_placement: tests/fuzz/fuzz_placement.c coordinator/dispatch/placement.c $(COMMON_SRC) coordinator/dispatch/dispatch.h
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -Ibuild/gen -fsanitize=fuzzer,address,undefined -o $@ $< \
	  coordinator/dispatch/placement.c $(COMMON_SRC) -lm -lpthread
fuzz: $(FUZZ_BINS)
	tests/run_fuzz.sh $(FUZZ_BINS)

integration: $(BINS) $(DEPS_BINS)
	tests/run_integration.sh $(BUILD)

test: deps
	$(MAKE) -j$(shell nproc) all
	tests/run_all.sh

bench: deps all
	tests/bench/run.sh $(BUILD)

# make soak (minutes, not in make test): agent-like clients against spawned
# workers while a chaos loop kills one every 30 s; SOAK_SECONDS=300 per run
soak: $(BUILD)/bin/ecs-coordinator $(BUILD)/bin/ecs-worker
	/usr/bin/python3 tests/integration/soak.py $(CURDIR) $(BUILD)

# ---- running the demo model ----
# make run: ecs-coordinator on MODEL at HTTP until Ctrl-C (it prints a curl
# line to try); ecs-run -m MODEL -p TEXT generates from the command line.
MODEL ?= models/demo-tiny.gguf
HTTP ?= 127.0.0.1:8080
models/demo-tiny.gguf: | $(BUILD)/bin/ecs-mkmodel
	@mkdir -p models
	$(BUILD)/bin/ecs-mkmodel --arch deepseek2 --preset tiny --types q8_0 --seed 1 -o $@
WORKERS ?= 2
run: deps
	$(MAKE) $(BUILD)/bin/ecs-coordinator $(BUILD)/bin/ecs-worker $(BUILD)/bin/ecs-run $(BUILD)/bin/ecs-mkmodel
	@if [ "$(MODEL)" = "models/demo-tiny.gguf" ]; then $(MAKE) models/demo-tiny.gguf; fi
	@exec $(BUILD)/bin/ecs-coordinator -m $(MODEL) --http $(HTTP) --spawn-workers $(WORKERS)

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
