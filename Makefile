# ECS - one entry point: make, make deps, make test, make run, make bench.
#
# Layout: every folder under common/, kernels/cpu/ and coordinator/* is a
# module compiled into a static library; every folder under tools/ is one
# program; every tests/unit/test_*.c is one Criterion binary. New files are
# picked up by the wildcards below, so adding a source needs no edit here.
# SIMD files are chosen by suffix: *_avx2.c and *_avx512.c get their ISA's
# flags; nothing else is built with -m flags, so one binary runs on any
# x86-64 and picks its kernels at run time.

CC      ?= gcc
BUILD   ?= build
PYTHON  ?= /usr/bin/python3
SAN     ?=
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -pthread -I. \
              -fno-strict-aliasing
ifeq ($(SAN),1)
CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN = -fsanitize=address,undefined
endif
CFLAGS  = $(CFLAGS_BASE) $(EXTRA_CFLAGS)
LDLIBS  = -lpcre2-8 -lm -lpthread -ldl
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16

COMMON_SRC  = $(wildcard common/*.c)
KERNELS_SRC = $(wildcard kernels/cpu/*.c kernels/gpu/*.c kernels/tier/*.c)
COORD_SRC   = $(filter-out coordinator/main.c,$(wildcard coordinator/*/*.c))
TOOLS       = $(notdir $(wildcard tools/ecs-*))
UNIT_SRC    = $(wildcard tests/unit/test_*.c)
BENCH_SRC   = $(wildcard tests/bench/bench_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_COMMON  = $(BUILD)/lib/libecs_common.a
LIB_KERNELS = $(BUILD)/lib/libecs_kernels.a
LIB_COORD   = $(BUILD)/lib/libecs_coord.a
LIBS        = $(LIB_COORD) $(LIB_KERNELS) $(LIB_COMMON)
BINS        = $(addprefix $(BUILD)/bin/,$(TOOLS))
UNIT_BINS   = $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
BENCH_BINS  = $(patsubst tests/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

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

.PHONY: all deps test unit asan fuzz integration bench run clean
all: $(BINS) $(UNIT_BINS) $(BENCH_BINS) $(LIB_CUDA)

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_KERNELS): $(call obj,$(KERNELS_SRC))
$(LIB_COORD): $(call obj,$(COORD_SRC))
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

.SECONDEXPANSION:
$(BUILD)/bin/%: $$(call obj,$$(wildcard tools/%/*.c)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $(call obj,$(wildcard tools/$*/*.c)) $(LIBS) $(LDLIBS)
$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $< $(LIBS) $(LDLIBS) -lcriterion
$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/%.o $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $< $(LIBS) $(LDLIBS)

# ---- installing what the project needs (Debian, as root; idempotent) ----
DEB_PKGS = gcc make libcriterion-dev libpcre2-dev clang libclang-rt-14-dev python3-numpy
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
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
build/fuzz/%: tests/fuzz/%.c $(COMMON_SRC) $(wildcard common/*.h)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined -o $@ $< $(COMMON_SRC) -lm -lpthread
fuzz: $(FUZZ_BINS)
	tests/run_fuzz.sh $(FUZZ_BINS)

integration: $(BINS)
	tests/run_integration.sh $(BUILD)

test: deps
	$(MAKE) all
	tests/run_all.sh

bench: deps all
	tests/bench/run.sh $(BUILD)

# ---- running the demo model ----
MODEL ?= models/demo-tiny.gguf
PROMPT ?= The capital of France is
models/demo-tiny.gguf: | $(BUILD)/bin/ecs-mkmodel
	@mkdir -p models
	$(BUILD)/bin/ecs-mkmodel --arch deepseek2 --preset tiny --types q8_0 --seed 1 -o $@
run: deps
	$(MAKE) $(BUILD)/bin/ecs-run $(BUILD)/bin/ecs-mkmodel
	@if [ "$(MODEL)" = "models/demo-tiny.gguf" ]; then $(MAKE) models/demo-tiny.gguf; fi
	$(BUILD)/bin/ecs-run -m $(MODEL) -p "$(PROMPT)" -n 32

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
