# kvtier — GNU Make build. `make demo` and `make test` do all the set-up (scripts/deps.sh).
#   make                 library (static + shared), CLI, kvtier.pc
#   make test            build and run every test suite
#   make demo            build and run the demo
#   make SANITIZE=address,undefined test    sanitizer build in build/san-address-undefined
#   make SANITIZE=thread test-threads       ThreadSanitizer build of the threaded suites
#   make fuzz            libFuzzer targets (clang);  make fuzz-replay  corpus replay
#   make install PREFIX=/usr/local       (make install-llama: the llama.cpp integration too)

.DEFAULT_GOAL := all
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
CC ?= cc
SANITIZE ?=
OPT ?= -O2

ifeq ($(SANITIZE),)
BUILD ?= build/default
SAN_FLAGS :=
else
BUILD ?= build/san-$(subst $(comma),-,$(SANITIZE))
SAN_FLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
comma := ,
# ThreadSanitizer cannot see the kernel's side of io_uring's shared rings (it reports the
# reuse of one ring's mapping by the next as a race), so its build uses the thread engine.
NO_URING ?= $(if $(findstring thread,$(SANITIZE)),1,0)

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla -Werror
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) -fPIC -fvisibility=hidden \
               -Iinclude -Isrc $(SAN_FLAGS)
VERSION := 0.1.0

# Detected libraries, written once per build dir after the dependency script has run.
CONFIG := $(BUILD)/config.mk
-include $(CONFIG)
$(CONFIG): scripts/deps.sh scripts/configure.sh
	@mkdir -p $(@D)
	@scripts/deps.sh
	@KVT_NO_URING=$(NO_URING) scripts/configure.sh > $@.tmp && mv $@.tmp $@

CFLAGS_ALL = $(BASE_CFLAGS) $(EXTRA_INC) $(DEP_CFLAGS) $(URING_CFLAGS) $(CFLAGS)
LIBS_ALL = $(DEP_LIBS) $(URING_LIBS) $(SAN_FLAGS) $(LDFLAGS)

LIB_SRC := $(sort $(wildcard src/*/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/obj/%.o)
# The benchmark harness (bench/harness/): its own small library, linked by `kvtier bench`, the
# bench/ programs and kvtier-llama's bench; the CLI's command only parses the options.
BENCH_LIB_SRC := $(sort $(wildcard bench/harness/*.c))
BENCH_LIB_OBJ := $(BENCH_LIB_SRC:%.c=$(BUILD)/obj/%.o)
BENCH_LIB := $(BUILD)/libkvtier-bench.a
$(TOOL_OBJ) $(BENCH_LIB_OBJ): EXTRA_INC := -Ibench/harness
SUPPORT_SRC := $(sort $(wildcard tests/support/*.c))
SUPPORT_OBJ := $(SUPPORT_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
PROG_SRC := $(sort $(wildcard tests/progs/*.c))
PROG_BIN := $(PROG_SRC:tests/progs/%.c=$(BUILD)/tests/progs/%)
EXAMPLE_SRC := $(sort $(wildcard examples/*.c))
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))

# The llama.cpp integration: its own library, tools and tests, linked against llama.cpp's
# prebuilt libraries that scripts/llama-fetch.sh puts in build/llama (the core never links them).
LLAMA_DIR := build/llama
LLAMA_STAMP := $(LLAMA_DIR)/.fetched-3.22.1
LLAMA_LIBDIR := $(abspath $(LLAMA_DIR)/lib)
LLAMA_CFLAGS := -I$(LLAMA_DIR)/include -Iintegrations/llama -Iintegrations/llama/tools \
                -Iintegrations/llama/serve -Ibench/harness \
                -DKVT_LLAMA_LIB_DIR=\"$(LLAMA_LIBDIR)\"
LLAMA_LIBS := -L$(LLAMA_LIBDIR) -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so \
              -Wl,-rpath,$(LLAMA_LIBDIR)
LLAMA_SRC := $(sort $(wildcard integrations/llama/*.c))
LLAMA_OBJ := $(LLAMA_SRC:%.c=$(BUILD)/obj/%.o)
# kvtier-llama's commands, `serve` among them (its HTTP from libmicrohttpd)
LLAMA_TOOL_SRC := $(sort $(wildcard integrations/llama/tools/*.c integrations/llama/serve/*.c))
LLAMA_TOOL_OBJ := $(LLAMA_TOOL_SRC:%.c=$(BUILD)/obj/%.o)
LLAMA_GEN_OBJ := $(BUILD)/obj/integrations/llama/tools/model_gen.o
LLAMA_STATIC := $(BUILD)/libkvtier-llama.a
LLAMA_SHARED := $(BUILD)/libkvtier-llama.so.$(VERSION)
LLAMA_CLI := $(BUILD)/kvtier-llama
LLAMA_TEST_BIN := $(BUILD)/tests/test_llama
LLAMA_WORKER := $(BUILD)/tests/progs/llama_worker
LLAMA_OTHER_VERSION := $(BUILD)/tests/progs/other_version.so
LLAMA_EXAMPLE := $(BUILD)/examples/llama_chat
# kvtier-llama serve's suites: Node.js (apt's v20) with the official OpenAI SDK, pinned, which
# scripts/openai-fetch.sh installs once into build/node.
NODE_DIR := build/node
NODE_STAMP := $(NODE_DIR)/.openai-6.30.1
SERVE_TESTS := $(sort $(wildcard integrations/llama/tests/serve/test_*.mjs))

STATIC := $(BUILD)/libkvtier.a
SHARED := $(BUILD)/libkvtier.so.$(VERSION)
CLI := $(BUILD)/kvtier

.PHONY: all lib cli tests progs benches test test-threads demo fuzz fuzz-replay install \
        install-llama clean format
.PHONY: python test-python
all: lib cli $(BUILD)/kvtier.pc

lib: $(STATIC) $(SHARED)
cli: $(CLI)

$(BUILD)/obj/%.o: %.c $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libkvtier.so.0 -o $@ $^ $(LIBS_ALL)
	ln -sf libkvtier.so.$(VERSION) $(BUILD)/libkvtier.so.0
	ln -sf libkvtier.so.$(VERSION) $(BUILD)/libkvtier.so

$(BENCH_LIB): $(BENCH_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(CLI): $(TOOL_OBJ) $(BENCH_LIB) $(STATIC)
	$(CC) -o $@ $(TOOL_OBJ) $(BENCH_LIB) $(STATIC) $(LIBS_ALL) -lm

$(BUILD)/kvtier.pc: kvtier.pc.in
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCDIR@|$(INCDIR)|; s|@VERSION@|$(VERSION)|' $< > $@

# Tests link the static library (internal symbols visible) and the shared test support.
TEST_CFLAGS = -DKVT_TEST_DIR=\"$(abspath tests)\" -DKVT_BUILD_DIR=\"$(abspath $(BUILD))\"
$(BUILD)/obj/tests/%.o: tests/%.c $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(CMOCKA_CFLAGS) $(TEST_CFLAGS) -Itests -MMD -MP -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SUPPORT_OBJ) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $< $(SUPPORT_OBJ) $(STATIC) $(CMOCKA_LIBS) $(LIBS_ALL) -lm

# The bench programs share the harness (clock, medians, raw I/O baselines, entries).
$(BUILD)/bench/%: bench/%.c $(BENCH_LIB) $(STATIC) $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -Ibench/harness -MMD -MP -o $@ $< $(BENCH_LIB) $(STATIC) $(LIBS_ALL) -lm

# Examples build against the public header only, as an embedding program would.
$(BUILD)/examples/%: examples/%.c $(STATIC) $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(STATIC) $(LIBS_ALL) -lm

tests: $(TEST_BIN) $(PROG_BIN) $(CLI) $(EXAMPLE_BIN) $(LLAMA_TEST_BIN) $(LLAMA_WORKER) \
       $(LLAMA_OTHER_VERSION) llama $(NODE_STAMP)
progs: $(PROG_BIN)
benches: $(BENCH_BIN)

# The tree's checks: every check ID the code can emit and every spec section a file cites is
# defined in docs/spec/; every path README.md and docs/ name exists; every C file is
# clang-format clean.
DOC_TESTS := tests/docs/check_spec_refs.sh tests/docs/check_doc_paths.sh tests/docs/check_format.sh
# The normal build also runs the Python package's pytest suite (sanitizer builds: C only).
test: tests $(if $(SANITIZE),,python)
	@scripts/run-tests.sh $(BUILD) $(TEST_BIN) $(LLAMA_TEST_BIN) $(DOC_TESTS); c=$$?; \
	 scripts/run-node-tests.sh $(BUILD) $(SERVE_TESTS); n=$$?; \
	 $(if $(SANITIZE),[ $$c = 0 ] && [ $$n = 0 ],scripts/run-pytest.sh $(PYTHON) $(PY_OUT); p=$$?; \
	 [ $$c = 0 ] && [ $$n = 0 ] && [ $$p = 0 ])

# The Python package (python/), built against this build's static library into $(PY_OUT).
PYTHON ?= /usr/bin/python3
PY_OUT := $(BUILD)/python
python: $(STATIC)
	@cd python && KVTIER_BUILD=$(abspath $(BUILD)) $(PYTHON) setup.py -q build \
	    --build-base $(abspath $(BUILD))/python-build --build-lib $(abspath $(PY_OUT))
	@echo "python: kvtier package in $(PY_OUT) (PYTHONPATH=$(PY_OUT))"

test-python: python
	@scripts/run-pytest.sh $(PYTHON) $(PY_OUT)

# The ThreadSanitizer build (SANITIZE=thread) runs every suite whose processes start threads
# (the library's I/O, helper and tier threads, the suites' own, the CLI and programs they run),
# which is every suite but these:
#  - test_cache test_format_header test_hash test_header_tokens test_io_fault test_store_index
#    start no thread;
#  - test_crash: its kill -9 loop kills each writer within 60 ms of its start, before an
#    instrumented writer has opened its store, so under TSan it would check nothing (and its
#    two-writer round fails for want of a single acknowledged put). The writer's threads run
#    under TSan in test_store_mp (the store_stress processes) and test_ioerr.
THREAD_FREE := test_cache test_format_header test_hash test_header_tokens test_io_fault \
               test_store_index test_crash
# The llama.cpp suite runs too: llama.cpp's prebuilt libraries are not instrumented, so TSan
# sees none of their accesses (nor their synchronisation), only kvtier's and the suite's.
THREAD_TESTS ?= $(filter-out $(THREAD_FREE:%=$(BUILD)/tests/%),$(TEST_BIN)) $(LLAMA_TEST_BIN)
test-threads: tests
	@scripts/run-tests.sh $(BUILD) $(THREAD_TESTS)

# Fuzzing. `make fuzz` builds the libFuzzer targets with clang into $(FUZZ_BUILD)/fuzz/
# (library and targets instrumented for coverage, ASan and UBSan); fuzz/run.sh runs them.
# `make fuzz-replay` links each target with fuzz/replay.c (gcc, address,undefined build) and
# replays its corpus fuzz/corpus/<name>/ (fuzz/fuzz_<name>.c), failing on any report.
FUZZ_BUILD := build/libfuzzer
FUZZ_NAMES := $(FUZZ_SRC:fuzz/fuzz_%.c=%)
FUZZ_COMMON_OBJ = $(BUILD)/obj/fuzz/memfile.o
.PHONY: fuzz-targets
.SECONDARY: $(FUZZ_SRC:%.c=$(BUILD)/obj/%.o) $(FUZZ_COMMON_OBJ) $(BUILD)/obj/fuzz/replay.o
ifeq ($(SANITIZE),)
fuzz-replay:
	@$(MAKE) --no-print-directory SANITIZE=address,undefined fuzz-replay
else
fuzz-replay: $(FUZZ_NAMES:%=$(BUILD)/fuzz/replay_%)
	@set -e; for n in $(FUZZ_NAMES); do $(BUILD)/fuzz/replay_$$n fuzz/corpus/$$n; done
endif
fuzz:
	@$(MAKE) --no-print-directory CC=clang SANITIZE=address,undefined BUILD=$(FUZZ_BUILD) \
	    CFLAGS=-fsanitize=fuzzer-no-link fuzz-targets
fuzz-targets: $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)

# the llama.cpp state mapping's target takes its object from the integration
LLAMA_STATE_OBJ = $(BUILD)/obj/integrations/llama/llama_state.o
$(BUILD)/fuzz/fuzz_llama_state: $(BUILD)/obj/fuzz/fuzz_llama_state.o $(LLAMA_STATE_OBJ) \
                                $(FUZZ_COMMON_OBJ) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -fsanitize=fuzzer -o $@ $^ $(LIBS_ALL) -lm
$(BUILD)/fuzz/replay_llama_state: $(BUILD)/obj/fuzz/replay.o $(BUILD)/obj/fuzz/fuzz_llama_state.o \
                                  $(LLAMA_STATE_OBJ) $(FUZZ_COMMON_OBJ) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LIBS_ALL) -lm

# the RESP reader's target caps each read() of its connection (fuzz/fuzz_resp.c)
$(BUILD)/fuzz/fuzz_resp $(BUILD)/fuzz/replay_resp: FUZZ_LDFLAGS = -Wl,--wrap=read

$(BUILD)/fuzz/fuzz_%: $(BUILD)/obj/fuzz/fuzz_%.o $(FUZZ_COMMON_OBJ) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -fsanitize=fuzzer $(FUZZ_LDFLAGS) -o $@ $^ $(LIBS_ALL) -lm

$(BUILD)/fuzz/replay_%: $(BUILD)/obj/fuzz/replay.o $(BUILD)/obj/fuzz/fuzz_%.o $(FUZZ_COMMON_OBJ) \
                        $(STATIC)
	@mkdir -p $(@D)
	$(CC) $(FUZZ_LDFLAGS) -o $@ $^ $(LIBS_ALL) -lm

.PHONY: llama
llama: $(LLAMA_STATIC) $(LLAMA_SHARED) $(LLAMA_CLI) $(LLAMA_EXAMPLE) $(BUILD)/kvtier-llama.pc

$(LLAMA_STAMP): scripts/llama-fetch.sh
	@scripts/llama-fetch.sh $(LLAMA_DIR)

$(BUILD)/obj/integrations/%.o: integrations/%.c $(CONFIG) $(LLAMA_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(LLAMA_CFLAGS) $(CMOCKA_CFLAGS) $(TEST_CFLAGS) -Itests -MMD -MP \
	    -c $< -o $@

$(LLAMA_STATIC): $(LLAMA_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LLAMA_SHARED): $(LLAMA_OBJ) $(SHARED)
	$(CC) -shared -Wl,-soname,libkvtier-llama.so.0 -o $@ $(LLAMA_OBJ) -L$(BUILD) -lkvtier \
	    $(LLAMA_LIBS) $(LIBS_ALL)
	ln -sf libkvtier-llama.so.$(VERSION) $(BUILD)/libkvtier-llama.so.0
	ln -sf libkvtier-llama.so.$(VERSION) $(BUILD)/libkvtier-llama.so

$(BUILD)/kvtier-llama.pc: kvtier-llama.pc.in
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCDIR@|$(INCDIR)|; s|@VERSION@|$(VERSION)|' $< > $@

# the benchmark's limits are the raw I/O baselines of `kvtier bench` (the harness)
$(LLAMA_CLI): $(LLAMA_TOOL_OBJ) $(BENCH_LIB) $(LLAMA_STATIC) $(STATIC)
	$(CC) -o $@ $(LLAMA_TOOL_OBJ) $(BENCH_LIB) $(LLAMA_STATIC) $(STATIC) $(LLAMA_LIBS) $(LIBS_ALL) \
	    -lmicrohttpd -lm

$(LLAMA_TEST_BIN): $(BUILD)/obj/integrations/llama/tests/test_llama.o $(LLAMA_GEN_OBJ) \
                   $(SUPPORT_OBJ) $(LLAMA_STATIC) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(CMOCKA_LIBS) $(LLAMA_LIBS) $(LIBS_ALL) -lm

$(LLAMA_WORKER): $(BUILD)/obj/integrations/llama/tests/llama_worker.o $(LLAMA_STATIC) $(STATIC)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(LLAMA_LIBS) $(LIBS_ALL) -lm

$(NODE_STAMP): scripts/openai-fetch.sh
	@scripts/openai-fetch.sh $(NODE_DIR)

.PHONY: test-serve
test-serve: llama $(NODE_STAMP)
	@scripts/run-node-tests.sh $(BUILD) $(SERVE_TESTS)

$(LLAMA_OTHER_VERSION): integrations/llama/tests/other_version.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -shared -o $@ $<

$(LLAMA_EXAMPLE): examples/llama/llama_chat.c $(LLAMA_STATIC) $(STATIC) $(LLAMA_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -I$(LLAMA_DIR)/include -o $@ $< \
	    $(LLAMA_STATIC) $(STATIC) $(LLAMA_LIBS) $(LIBS_ALL) -lm

# `make demo`: a real llama.cpp conversation, persisted, the process restarted, the prefix
# restored; the model is generated once into build/llama.
demo: $(LLAMA_CLI)
	$(LLAMA_CLI) demo --dir $(BUILD)/demo-store --model $(LLAMA_DIR)/demo.gguf

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 include/kvtier.h $(DESTDIR)$(INCDIR)/
	install -m 644 $(STATIC) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(SHARED) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvtier.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvtier.so.0
	ln -sf libkvtier.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvtier.so
	install -m 755 $(CLI) $(DESTDIR)$(BINDIR)/
	install -m 644 $(BUILD)/kvtier.pc $(DESTDIR)$(LIBDIR)/pkgconfig/

# The llama.cpp integration's library, header and pkg-config file (llama.cpp itself is the
# user's: link it as well).
install-llama: llama install
	install -m 644 include/kvtier-llama.h $(DESTDIR)$(INCDIR)/
	install -m 644 $(LLAMA_STATIC) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LLAMA_SHARED) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvtier-llama.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvtier-llama.so.0
	ln -sf libkvtier-llama.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvtier-llama.so
	install -m 644 $(BUILD)/kvtier-llama.pc $(DESTDIR)$(LIBDIR)/pkgconfig/

format:
	clang-format -i include/*.h src/*/*.[ch] tools/*.[ch] tests/*.c tests/*/*.[ch] bench/*.c \
	    bench/harness/*.[ch] fuzz/*.c

clean:
	rm -rf build

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(BENCH_LIB_OBJ:.o=.d) $(SUPPORT_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/obj/tests/%.d)
-include $(wildcard $(BUILD)/obj/fuzz/*.d) $(wildcard $(BUILD)/obj/integrations/*/*.d \
                   $(BUILD)/obj/integrations/*/*/*.d)
