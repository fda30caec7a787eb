# Makefile -- builds libdlock (static + shared), the dlock CLI, the tests
# and the benchmarks. Plain GNU make, no configure step: each backend is
# built when pkg-config (or its header) finds its client library, or only
# those named in BACKENDS=, and `make check` refuses to run when a backend
# was left out, so CI can never skip one quietly.
#
#   make                 library + CLI into build/ (every backend whose client
#                        library is installed; the set is printed at the end)
#   make BACKENDS="file redis"   only those (an error if one cannot be built)
#   make DEV=1           warnings are errors (CI and development; WERROR=1 too)
#   make check           every test (tests/run-tests.sh prints the summary)
#   make check SAN=1     the same under ASan + UBSan (into build-san/)
#   make check TSAN=1    the same under ThreadSanitizer (into build-tsan/); a
#                        report fails the test (see CHECK_ENV below)
#   make check-tsan-ci   the part of it CI runs (the whole takes ~27 min)
#   make check-san-ci    make check SAN=1 but for the Redis fixtures and
#                        the fault harness that the plain pass covers
#                        (SAN_CI_SKIP below)
#   make check-long      the long schedules `make check` runs short or not
#                        at all (DLOCK_LONG=1; tests/lib/testutil.h)
#   make check VALGRIND=1  the same under valgrind
#   make bench           the benchmarks in bench/
#   make chaos SEED=1 DURATION=300   the fault harness (tests/chaos/), long
#                        schedules by hand, as root; docs/safety.md
#   make fuzz FUZZ_SECONDS=60  the libFuzzer targets of tests/fuzz/ (clang)
#   make install PREFIX=/usr/local DESTDIR=   (and make uninstall): the
#                        library, header, dlock(1), dlock.pc, man3 pages,
#                        bash and zsh completion (cli/completion/)
#   make check-symbols   libdlock.a defines no global outside dlock_/dlock__

VERSION_PART = $(shell sed -n 's/^\#define DLOCK_VERSION_$(1) \([0-9]*\).*/\1/p' include/dlock.h)
MAJOR := $(call VERSION_PART,MAJOR)
VERSION := $(MAJOR).$(call VERSION_PART,MINOR).$(call VERSION_PART,PATCH)

PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions

CC ?= cc
CFLAGS ?= -O2 -g
WARNINGS = -Wall -Wextra -Wshadow -Wstrict-prototypes \
           -Wmissing-prototypes -Wformat=2 -Wvla -Wpointer-arith
# Warnings stop the build only where someone can fix them (CI, development):
# a distribution's newer compiler must not fail a release build on a new one.
ifneq ($(filter 1,$(DEV) $(WERROR)),)
WARNINGS += -Werror
endif
CPPFLAGS += -D_GNU_SOURCE -Iinclude -Isrc
ALL_CFLAGS = -std=c11 $(WARNINGS) $(CFLAGS) -fPIC -fvisibility=hidden -pthread

BUILD = build
ifeq ($(TSAN),1)
BUILD = build-tsan
# gcc's flow analysis sees uninitialised reads under -fsanitize=thread
# that the plain build does not (redis/scripts.c): a warning, not an error
ALL_CFLAGS += -fsanitize=thread -fno-omit-frame-pointer -Wno-error=maybe-uninitialized
LDFLAGS += -fsanitize=thread
endif
ifeq ($(SAN),1)
BUILD = build-san
ALL_CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

# ------------------------------------------------------------ backends
# A backend is a folder src/backends/NAME/ with one file per concern;
# src/backends/registry.c, the table of them all, is built with the core.
have = $(shell pkg-config --exists $(1) 2>/dev/null && echo y)
ALL_BACKENDS := $(sort $(patsubst src/backends/%/,%,$(dir $(wildcard src/backends/*/*.c))))

# What this machine can build: every backend whose client library is found.
AVAILABLE_BACKENDS = file
# Redis: hiredis 0.14 formats and parses, OpenSSL does rediss://.
ifeq ($(call have,hiredis)$(call have,openssl),yy)
AVAILABLE_BACKENDS += redis
endif
ifeq ($(call have,libcurl)$(call have,jansson),yy)
AVAILABLE_BACKENDS += etcd
endif
ifneq ($(wildcard /usr/include/zookeeper/zookeeper.h),)
AVAILABLE_BACKENDS += zk
endif
ifeq ($(call have,libpq),y)
AVAILABLE_BACKENDS += postgres
endif
ifeq ($(call have,libmariadb),y)
AVAILABLE_BACKENDS += mysql
endif
AVAILABLE_BACKENDS := $(filter $(ALL_BACKENDS),$(AVAILABLE_BACKENDS))

# BACKENDS="file redis" builds only those; by default every available one.
ifeq ($(origin BACKENDS),undefined)
BUILT_BACKENDS := $(AVAILABLE_BACKENDS)
else
BUILT_BACKENDS := $(sort $(BACKENDS))
ifneq ($(filter-out $(ALL_BACKENDS),$(BUILT_BACKENDS)),)
$(error BACKENDS: no backend named $(filter-out $(ALL_BACKENDS),$(BUILT_BACKENDS)) (there are: $(ALL_BACKENDS)))
endif
ifneq ($(filter-out $(AVAILABLE_BACKENDS),$(BUILT_BACKENDS)),)
$(error BACKENDS: $(filter-out $(AVAILABLE_BACKENDS),$(BUILT_BACKENDS)) cannot be built here: client library not found (scripts/install-deps.sh installs it))
endif
endif
ifneq ($(filter redis,$(BUILT_BACKENDS)),)
# OpenSSL is dlopen()ed on the first rediss:// or redlock:// client
# (src/backends/redis/openssl.h): its headers only, as libcurl's below.
DEP_CFLAGS += $(shell pkg-config --cflags hiredis openssl)
DEP_LIBS += $(shell pkg-config --libs hiredis)
endif
ifneq ($(filter etcd,$(BUILT_BACKENDS)),)
# libcurl is dlopen()ed by the etcd backend on first use (src/backends/etcd/etcd.h):
# its headers are needed here, its thirty libraries at start-up are not.
DEP_CFLAGS += $(shell pkg-config --cflags libcurl jansson)
DEP_LIBS += $(shell pkg-config --libs jansson)
endif
ifneq ($(filter postgres,$(BUILT_BACKENDS)),)
# libpq is dlopen()ed by the postgres backend on first use
# (src/backends/postgres/pg.h): its headers only.
DEP_CFLAGS += $(shell pkg-config --cflags libpq)
endif
ifneq ($(filter mysql,$(BUILT_BACKENDS)),)
# libmariadb is dlopen()ed by the mysql backend on first use
# (src/backends/mysql/mysql.h): its headers only, as libcurl's.
DEP_CFLAGS += $(shell pkg-config --cflags libmariadb)
endif
ifneq ($(filter zk,$(BUILT_BACKENDS)),)
DEP_CFLAGS += -I/usr/include/zookeeper
DEP_LIBS += -lzookeeper_mt
endif
MISSING_BACKENDS := $(filter-out $(BUILT_BACKENDS),$(ALL_BACKENDS))
BACKEND_DEFS = $(foreach b,$(BUILT_BACKENDS),-DDLOCK_HAVE_$(shell echo $(b) | tr a-z A-Z))

# ------------------------------------------------------------- sources
CORE_SRC := $(wildcard src/*.c) src/backends/registry.c
LIB_SRC := $(CORE_SRC) $(foreach b,$(BUILT_BACKENDS),$(wildcard src/backends/$(b)/*.c))
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC))
CLI_SRC := $(wildcard cli/*.c)
CLI_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(CLI_SRC))
TESTLIB_SRC := $(wildcard tests/lib/*.c)
TESTLIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(TESTLIB_SRC))
# A test binary per tests/check_*.c; backend tests (check_BACKEND*.c) only when built.
TEST_SRC := $(foreach t,$(wildcard tests/check_*.c),$(if $(filter $(MISSING_BACKENDS),$(firstword $(subst _, ,$(patsubst tests/check_%.c,%,$(t))))),,$(t)))
# The contract (blocking and asynchronous), semaphore, election and multi-lock suites run
# against every backend, and the
# PostgreSQL fencing recipe needs Redis: built only when all backends are
# (make check refuses a build that lacks one anyway).
ifneq ($(MISSING_BACKENDS),)
TEST_SRC := $(filter-out tests/check_contract.c tests/check_contract_async.c tests/check_semaphore.c tests/check_election.c tests/check_multi.c tests/check_fair.c tests/check_fencing_pg.c,$(TEST_SRC))
endif
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
EXAMPLE_BIN := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
# examples/fence_pg.c (the fencing token with PostgreSQL) needs libpq: built
# when it is installed; tests/check_fencing_pg.c includes it, so needs it too.
ifneq ($(call have,libpq),y)
EXAMPLE_BIN := $(filter-out %/fence_pg,$(EXAMPLE_BIN))
endif
# examples/async_uv.c (the asynchronous calls on a libuv loop) needs
# libuv1-dev; tests/check_async.c runs its loops on libuv and libevent
# when they are installed.
ifneq ($(call have,libuv),y)
EXAMPLE_BIN := $(filter-out %/async_uv,$(EXAMPLE_BIN))
endif
# examples/async_event.c, the same program on libevent, needs libevent-dev.
ifneq ($(call have,libevent),y)
EXAMPLE_BIN := $(filter-out %/async_event,$(EXAMPLE_BIN))
endif
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

STATIC = $(BUILD)/libdlock.a
SONAME = libdlock.so.$(MAJOR)
SHARED = $(BUILD)/$(SONAME)
CLI = $(BUILD)/dlock
LIBS = $(DEP_LIBS) -pthread

.PHONY: all check check-tsan-ci check-san-ci check-long bench chaos fuzz install uninstall clean demo backends check-symbols check-man3 format format-check
.SECONDARY:
all: $(STATIC) $(SHARED) $(CLI) $(EXAMPLE_BIN)
	@echo "dlock: backends built: $(BUILT_BACKENDS)$(if $(MISSING_BACKENDS), -- left out: $(MISSING_BACKENDS))"

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h src/backends/*/*.h cli/*.h tests/lib/*.h) Makefile
	@mkdir -p $(dir $@)
	@echo CC $<; $(CC) $(CPPFLAGS) $(BACKEND_DEFS) $(DEP_CFLAGS) $(ALL_CFLAGS) -c -o $@ $<

# The Redis backend embeds its Lua scripts (.incbin in scripts.c) with
# their EVALSHA digests, computed here: redis_script_digests.h defines
# REDIS_SHA_<name> for each scripts/<name>.lua, the SHA-1 of what
# scripts.c embeds (lib_acquire.lua in front of those it names with
# EMBED_ACQUIRE_SCRIPT). Test: script_digests_match_the_server.
REDIS_LUA = $(sort $(wildcard src/backends/redis/scripts/*.lua))
REDIS_DIGESTS = $(BUILD)/gen/redis_script_digests.h
$(REDIS_DIGESTS): $(REDIS_LUA) src/backends/redis/scripts.c Makefile
	@mkdir -p $(dir $@)
	@echo GEN $@; \
	acquire=" $$(sed -n 's/^EMBED_ACQUIRE_SCRIPT(\([a-z_]*\)).*/\1/p' src/backends/redis/scripts.c | tr '\n' ' ')"; \
	for f in $(REDIS_LUA); do \
	    n=$$(basename $$f .lua); lib=; \
	    case "$$acquire" in *" $$n "*) lib=src/backends/redis/scripts/lib_acquire.lua;; esac; \
	    sha=$$(cat $$lib $$f | sha1sum | cut -c1-40) || exit 1; \
	    printf '#define REDIS_SHA_%s "%s"\n' $$n $$sha; \
	done > $@.tmp && mv $@.tmp $@
$(BUILD)/src/backends/redis/scripts.o: $(REDIS_LUA) $(REDIS_DIGESTS)
$(BUILD)/src/backends/redis/scripts.o: CPPFLAGS += -I$(BUILD)/gen

# Every object is compiled with -DDLOCK_HAVE_<backend> for the set of
# built backends (the backend table, the CLI's benchmarks, the tests): a
# stamp that changes only with that set rebuilds them all, so
# `make BACKENDS=...` never links objects made for another set.
BACKENDS_STAMP = $(BUILD)/backends.stamp
$(BACKENDS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(BUILT_BACKENDS)' | cmp -s - $@ || echo '$(BUILT_BACKENDS)' > $@
.PHONY: FORCE

$(STATIC): $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) $(LDFLAGS) -o $@ $^ $(LIBS)
	ln -sf $(SONAME) $(BUILD)/libdlock.so

$(CLI): $(CLI_OBJ) $(STATIC)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(STATIC) $(LIBS)

$(BUILD)/tests/%: tests/%.c $(TESTLIB_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	@echo CC $<; $(CC) $(CPPFLAGS) $(BACKEND_DEFS) $(DEP_CFLAGS) -Itests/lib $(ALL_CFLAGS) $(shell pkg-config --cflags check) \
	  $(LDFLAGS) -o $@ $< $(TESTLIB_OBJ) $(STATIC) $(shell pkg-config --libs check) $(LIBS)

# The Redis suite's binaries share tests/redis_suite.h.
$(filter %/check_redis %/check_redis_%,$(TEST_BIN)): tests/redis_suite.h

# check_cli preloads this into `dlock run` to make its threads fail to
# start (tests/preload/no_threads.c): plain, no sanitizer runtime.
NO_THREADS_SO := $(BUILD)/tests/no_threads.so
$(NO_THREADS_SO): tests/preload/no_threads.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O2 -Wall -o $@ $<
$(BUILD)/tests/check_cli: $(NO_THREADS_SO)
$(BUILD)/tests/check_cli: CPPFLAGS += -DCLI_NO_THREADS_SO='"$(CURDIR)/$(NO_THREADS_SO)"'

# The fault harness (tests/chaos/, issue 13): its short fixed-seed run is
# a test binary of `make check`, `make chaos` runs long schedules by hand.
# It drives every backend, so it is built only when all are.
CHAOS_OBJ := $(patsubst %.c,$(BUILD)/%.o,tests/chaos/harness.c tests/chaos/store.c tests/chaos/worker.c tests/chaos/relay.c)
CHAOS_BIN := $(BUILD)/tests/chaos/chaos
CHAOS_CLOCKSHIFT := $(BUILD)/tests/chaos/clockshift.so
$(CHAOS_OBJ) $(BUILD)/tests/chaos/chaos.o: CPPFLAGS += -Itests/lib $(BACKEND_DEFS) \
  -DCHAOS_CLOCKSHIFT='"$(CURDIR)/$(CHAOS_CLOCKSHIFT)"'
$(CHAOS_OBJ) $(BUILD)/tests/chaos/chaos.o: tests/chaos/chaos.h
# preloaded into workers and redis-server: plain, no sanitizer runtime
$(CHAOS_CLOCKSHIFT): tests/chaos/clockshift.c
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -O2 -Wall -o $@ $<
ifeq ($(MISSING_BACKENDS),)
TEST_BIN += $(BUILD)/tests/check_chaos
endif
$(BUILD)/tests/check_chaos: tests/chaos/check_chaos.c tests/chaos/chaos.h $(CHAOS_OBJ) $(TESTLIB_OBJ) $(STATIC) $(CHAOS_CLOCKSHIFT)
	@mkdir -p $(dir $@)
	@echo CC $<; $(CC) $(CPPFLAGS) $(BACKEND_DEFS) $(DEP_CFLAGS) -Itests/lib $(ALL_CFLAGS) $(shell pkg-config --cflags check) \
	  $(LDFLAGS) -o $@ $< $(CHAOS_OBJ) $(TESTLIB_OBJ) $(STATIC) $(shell pkg-config --libs check) $(LIBS)
$(CHAOS_BIN): $(BUILD)/tests/chaos/chaos.o $(CHAOS_OBJ) $(TESTLIB_OBJ) $(STATIC) | $(CHAOS_CLOCKSHIFT)
	$(CC) $(LDFLAGS) -o $@ $^ $(shell pkg-config --libs check) $(LIBS)

SEED ?= 1
DURATION ?= 300
CHAOS_BACKENDS ?= file file-election redis redis-simple redis-fair redis-sem sentinel sentinel-sync sentinel-sync2 redlock etcd zk $(filter postgres mysql,$(BUILT_BACKENDS))
chaos: all $(CHAOS_BIN)
	$(CHAOS_BIN) -s $(SEED) -d $(DURATION) -j $(BUILD)/chaos.json $(CHAOS_BACKENDS)

# libFuzzer targets (tests/fuzz/fuzz_*.c, issue 13), built with clang,
# ASan and UBSan -- the library too -- into build-fuzz/. `make fuzz` runs
# each for FUZZ_SECONDS; `make check` runs each for a fixed number of
# inputs from a fixed seed (tests/fuzz/run-fuzz.sh).
FUZZ_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_SECONDS ?= 60
# The library's warnings are gcc's to enforce (make): what clang finds
# besides is shown, not fatal, so the fuzz build never breaks make check
FUZZ_CLANG_QUIET = -Wno-error
FUZZ_BIN := $(patsubst tests/fuzz/%.c,build-fuzz/tests/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
ifneq ($(BUILD),build-fuzz)
build-fuzz/libdlock.a: FORCE
	@$(MAKE) --no-print-directory BUILD=build-fuzz CC=clang CFLAGS='$(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(FUZZ_CLANG_QUIET)' build-fuzz/libdlock.a
build-fuzz/tests/fuzz/%: tests/fuzz/%.c build-fuzz/libdlock.a
	@mkdir -p $(dir $@)
	@echo CLANG $<; clang $(CPPFLAGS) $(BACKEND_DEFS) $(DEP_CFLAGS) -std=c11 $(WARNINGS) $(FUZZ_FLAGS) -fsanitize=fuzzer \
	  -o $@ $< build-fuzz/libdlock.a $(LIBS)
fuzz: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run-fuzz.sh $$f || exit 1; done
ifeq ($(SAN)$(TSAN),)
TEST_BIN += $(FUZZ_BIN)
endif
endif

$(BUILD)/examples/%: examples/%.c $(SHARED)
	@mkdir -p $(dir $@)
	$(CC) -Iinclude $(ALL_CFLAGS) $(EXAMPLE_CFLAGS) $(LDFLAGS) -o $@ $< -L$(BUILD) -ldlock -Wl,-rpath,'$$ORIGIN/..' $(EXAMPLE_LIBS) -lpthread
$(BUILD)/examples/fence_pg: private EXAMPLE_CFLAGS = $(shell pkg-config --cflags libpq)
$(BUILD)/examples/fence_pg: private EXAMPLE_LIBS = $(shell pkg-config --libs libpq)
$(BUILD)/examples/async_uv: private EXAMPLE_LIBS = $(shell pkg-config --libs libuv)
$(BUILD)/examples/async_event: private EXAMPLE_CFLAGS = $(shell pkg-config --cflags libevent)
$(BUILD)/examples/async_event: private EXAMPLE_LIBS = $(shell pkg-config --libs libevent)
ifeq ($(call have,libuv),y)
$(BUILD)/tests/check_async: private DEP_CFLAGS += -DDLOCK_HAVE_LIBUV $(shell pkg-config --cflags libuv)
$(BUILD)/tests/check_async: private LIBS += $(shell pkg-config --libs libuv)
endif
ifeq ($(call have,libevent),y)
$(BUILD)/tests/check_async: private DEP_CFLAGS += -DDLOCK_HAVE_LIBEVENT $(shell pkg-config --cflags libevent)
$(BUILD)/tests/check_async: private LIBS += $(shell pkg-config --libs libevent)
endif
$(BUILD)/tests/check_async: $(wildcard include/dlock/adapters/*.h)
# check_contract_async runs the example programs (those this machine builds).
$(BUILD)/tests/check_contract_async: $(filter %/async_uv %/async_event,$(EXAMPLE_BIN))
ifeq ($(call have,libuv),y)
$(BUILD)/tests/check_contract_async: private DEP_CFLAGS += -DDLOCK_HAVE_LIBUV
endif
ifeq ($(call have,libevent),y)
$(BUILD)/tests/check_contract_async: private DEP_CFLAGS += -DDLOCK_HAVE_LIBEVENT
endif
$(BUILD)/tests/check_fencing_pg: private DEP_CFLAGS += $(shell pkg-config --cflags libpq) -Iexamples
$(BUILD)/tests/check_fencing_pg: private LIBS += $(shell pkg-config --libs libpq)
$(BUILD)/tests/check_fencing_pg: examples/fence_pg.c

$(BUILD)/bench/%: bench/%.c $(STATIC)
	@mkdir -p $(dir $@)
	@echo CC $<; $(CC) $(CPPFLAGS) $(DEP_CFLAGS) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(STATIC) $(LIBS)

backends:
	@echo "backends with sources: $(ALL_BACKENDS)"
	@echo "backends built:        $(BUILT_BACKENDS)"

# Every global symbol of the static library is dlock_ (API) or dlock__
# (internal): an application linking libdlock.a may define any other name.
# (The sanitizers' own globals, __odr_asan.* under SAN=1, are not ours.)
check-symbols: $(STATIC)
	@bad=$$(nm -g --defined-only $(STATIC) | awk 'NF == 3 && $$3 !~ /^dlock_/ && $$3 !~ /^__(odr_)?asan/ { print $$3 }' | sort -u); \
	if [ -n "$$bad" ]; then echo "libdlock.a defines globals without the dlock__ prefix:" $$bad >&2; exit 1; fi

# The C sources clang-format checks (.clang-format: 4 spaces, 100
# columns, the layout the code already has). FORMAT_PENDING: files whose
# hand layout clang-format would still rewrite (arguments packed to
# another column, a message string broken before rather than after its
# first argument, hand-aligned tables); a file leaves the list once
# `make format FORMAT_FILES=file` has been applied and reread. Every
# other file, new ones included, must be as clang-format writes it.
FORMAT_PENDING = \
	cli/bench.c cli/bench_redis.c cli/cli.h \
	cli/help.c cli/job.c cli/main.c cli/run.c include/dlock.h \
	src/admin.c src/backend.h src/backends/etcd/etcd.h src/backends/etcd/http.c \
	src/backends/etcd/lease.c \
	src/backends/etcd/mutex.c src/backends/etcd/reply.c src/backends/etcd/semaphore.c \
	src/backends/etcd/watch.c src/backends/file/election.c src/backends/file/file.h \
	src/backends/file/mutex.c src/backends/file/semaphore.c src/backends/redis/backend.c \
	src/backends/redis/cancel.c src/backends/redis/cluster.c src/backends/redis/conn.c \
	src/backends/redis/fair.c src/backends/redis/hub.c \
	src/backends/redis/mutex.c src/backends/redis/net.c \
	src/backends/redis/openssl.h src/backends/redis/redis.h src/backends/redis/redlock.c \
	src/backends/redis/redlock_hold.c \
	src/backends/redis/scripts.c src/backends/redis/semaphore.c \
	src/backends/registry.c \
	src/backends/zk/mutex.c src/backends/zk/semaphore.c src/backends/zk/session.c \
	src/backends/zk/zk.h src/cancel.c src/client.c src/election.c src/errors.c \
	src/internal.h src/lock.c src/semaphore.c src/toolbox.h \
	tests/chaos/chaos.h tests/chaos/harness.c tests/chaos/store.c \
	tests/check_api.c tests/check_cli.c tests/check_cluster.c tests/check_contract.c \
	tests/check_core.c tests/check_etcd.c tests/check_fair.c tests/check_fencing_pg.c \
	tests/check_file.c tests/check_redis.c tests/check_redis_cli.c \
	tests/check_redis_hostile.c \
	tests/check_semaphore.c tests/check_zk.c \
	tests/fuzz/fuzz_redis_replies.c tests/lib/contract.c tests/lib/contract.h \
	tests/lib/fixture_etcd.c tests/lib/fixture_etcd.h tests/lib/fixture_redis.c \
	tests/lib/fixture_redis.h tests/lib/fixture_zk.h \
	tests/lib/relay.h tests/lib/testutil.h
FORMAT_FILES := $(filter-out $(FORMAT_PENDING),$(sort $(wildcard $(addsuffix /*.[ch],include src src/backends src/backends/* cli tests tests/* examples bench))))
CLANG_FORMAT ?= clang-format

# Prints each file clang-format would change, with the start of the
# change, and fails if there is one; `make format` rewrites them in place.
format-check:
	@command -v $(CLANG_FORMAT) > /dev/null || { echo "format-check: no $(CLANG_FORMAT) (scripts/install-deps.sh installs it)" >&2; exit 1; }; \
	bad=0; for f in $(FORMAT_FILES); do \
	    out=$$($(CLANG_FORMAT) --style=file "$$f" | diff -u "$$f" -) && continue; \
	    bad=$$((bad + 1)); echo "$$f: not as clang-format writes it:"; printf '%s\n' "$$out" | sed -n '3,12p'; \
	done; \
	if [ $$bad -gt 0 ]; then echo "format-check: $$bad file(s) differ; \`make format\` rewrites them" >&2; exit 1; fi
format:
	$(CLANG_FORMAT) --style=file -i $(FORMAT_FILES)

# (after every object list above)
$(LIB_OBJ) $(CLI_OBJ) $(TESTLIB_OBJ) $(CHAOS_OBJ) $(BUILD)/tests/chaos/chaos.o $(TEST_BIN): $(BACKENDS_STAMP)

# Under TSAN=1 a report fails the test that made it: the process (a
# test's child, or a dlock CLI it ran) exits 66 at the first one
# (halt_on_error), which Check counts as an error. TSAN_OPTIONS from the
# environment are appended (log_path=..., history_size=...).
# ignore_noninstrumented_modules: what the client libraries (not built
# with TSan: libzookeeper_mt, libcurl, hiredis, jansson, OpenSSL) touch
# inside intercepted calls is theirs, not checked; their locks still
# count. Needed for the ZooKeeper C client 3.8, whose I/O threads
# sprintf() into one static buffer (format_endpoint_info(), its log
# lines); a suppression cannot say less than "anything with a frame in
# libzookeeper_mt" (it is stripped), which would hide our own watcher
# and completion code, run on its threads. dlock's own code stays
# checked everywhere. die_after_fork=0: tests fork children that open
# clients of their own (threads) while the parent's clients run threads,
# which a library must allow; TSan would kill those children.
ifeq ($(TSAN),1)
CHECK_ENV = TSAN_OPTIONS='ignore_noninstrumented_modules=1 die_after_fork=0 halt_on_error=1 exitcode=66 $(TSAN_OPTIONS)'
endif

# The part of `make check SAN=1` CI runs (.ci/run), after the plain
# `make check`: every test binary, but the suites run over every backend
# (check_contract, check_election, check_semaphore, check_multi) leave
# out the fixtures that put the Redis backend behind TLS, Sentinel, a
# cluster or Redlock, and check_chaos its Sentinel and Redlock runs
# (DLOCK_SKIP_FIXTURES, tests/lib/testutil.h), and check_chaos is left
# out whole. Those run in full in the plain pass, and their own code
# (tls.c, sentinel.c, cluster.c, redlock*.c) runs under the sanitizers in
# check_redis*, check_cluster and check_redlock; the fault harness drives
# the same library calls the suites do. The fixtures are 5 of the SAN
# pass's 22 minutes, check_chaos 2.
# check_redis_sentinel's three Sentinel failovers (85 s under SAN) are left out
# too: the rest of its Sentinel tests run sentinel.c under SAN.
SAN_CI_SKIP = rediss redis-sentinel rediss-sentinel redis-cluster rediss-cluster redlock
SAN_CI_SKIP_TESTS = redis/sentinel_failover_* redis/sentinel_status_names_the_new_master
SAN_CI_BIN = $(filter-out %/check_chaos,$(TEST_BIN))

# make check runs CHECK_JOBS test binaries at a time (tests/run-tests.sh:
# DLOCK_JOBS), the longest first so the last to end is a short one;
# under valgrind one at a time.
ifeq ($(VALGRIND),1)
CHECK_JOBS ?= 1
else
CHECK_JOBS ?= 2
endif
LONGEST_FIRST = check_contract check_chaos check_redis_sentinel check_etcd check_semaphore check_cli \
  check_cluster check_multi check_fair check_zk check_election
longest_first = $(foreach n,$(LONGEST_FIRST),$(filter %/$(n),$(1))) \
  $(filter-out $(addprefix %/,$(LONGEST_FIRST)),$(1))

ifeq ($(MISSING_BACKENDS),)
check: all check-symbols $(TEST_BIN)
	$(CHECK_ENV) DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_VALGRIND=$(VALGRIND) DLOCK_JOBS=$(CHECK_JOBS) \
	  tests/run-tests.sh $(call longest_first,$(TEST_BIN))
ifeq ($(SAN),1)
check-san-ci: all check-symbols $(SAN_CI_BIN)
	DLOCK_SKIP_FIXTURES='$(SAN_CI_SKIP)' DLOCK_SKIP_TESTS='$(SAN_CI_SKIP_TESTS)' \
	  DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_JOBS=$(CHECK_JOBS) tests/run-tests.sh $(call longest_first,$(SAN_CI_BIN))
else
check-san-ci:
	$(MAKE) SAN=1 check-san-ci
endif
# The part of `make check TSAN=1` CI runs (.ci/run): the core, the API,
# the asynchronous calls (42 s under load: their pool, parking on Redis,
# ZooKeeper and etcd, exactly-once delivery), the multi-lock suite, the
# contract on the file and redis fixtures, and
# the cluster test whose keeper renews each master's holds in a thread of
# its own (14 s under load; check_cluster whole is 90 s).
# The whole suite under TSan takes about 27 minutes on the CI machine,
# more than CI can give it: run `make check TSAN=1` by hand for a change
# to threads.
ifeq ($(TSAN),1)
TSAN_CI_BIN = $(addprefix $(BUILD)/tests/,check_core check_api check_async check_multi check_contract check_cluster)
check-tsan-ci: all check-symbols $(TSAN_CI_BIN)
	$(CHECK_ENV) DLOCK_BIN=$(CURDIR)/$(CLI) tests/run-tests.sh $(filter-out %/check_contract %/check_cluster,$(TSAN_CI_BIN))
	$(CHECK_ENV) DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_TEST='cluster/renewals_go_on_with_a_master_paused' tests/run-tests.sh $(BUILD)/tests/check_cluster
	$(CHECK_ENV) DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_TEST='file/*' tests/run-tests.sh $(BUILD)/tests/check_contract
	$(CHECK_ENV) DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_TEST='redis/*' tests/run-tests.sh $(BUILD)/tests/check_contract
else
check-tsan-ci:
	$(MAKE) TSAN=1 check-tsan-ci
endif
# The long schedules, by hand (about 3 minutes): the measured Sentinel
# runs of the fault harness and the CLI's 1,600-section counter.
check-long: all $(BUILD)/tests/check_chaos $(BUILD)/tests/check_cli
	DLOCK_LONG=1 DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_TEST='*measured' tests/run-tests.sh $(BUILD)/tests/check_chaos
	DLOCK_LONG=1 DLOCK_BIN=$(CURDIR)/$(CLI) DLOCK_TEST='counter_8_workers' tests/run-tests.sh $(BUILD)/tests/check_cli
else
check check-tsan-ci check-san-ci check-long:
	@echo "make check: backend(s) left out of this build: $(MISSING_BACKENDS) (install their client libraries)" >&2; exit 1
endif

bench: all $(BENCH_BIN)
	DLOCK_BIN=$(CURDIR)/$(CLI) BUILD=$(BUILD) bench/run-bench.sh

demo: all
	$(BUILD)/examples/demo

# man3: one page per group of functions (docs/man3/*.3); every other name
# on a page's NAME line gets a ".so" page pointing at it.
MAN3 := $(wildcard docs/man3/*.3)
man3_names = $(shell sed -n '/^\.SH NAME/{n;s/ *\\-.*//;s/,/ /g;p;q}' $(1))

install: all
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3
	install -m 644 include/dlock.h $(DESTDIR)$(INCLUDEDIR)/
	install -d $(DESTDIR)$(INCLUDEDIR)/dlock/adapters
	install -m 644 include/dlock/adapters/*.h $(DESTDIR)$(INCLUDEDIR)/dlock/adapters/
	install -m 644 $(STATIC) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(SHARED) $(DESTDIR)$(LIBDIR)/
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libdlock.so
	install -m 755 $(CLI) $(DESTDIR)$(BINDIR)/
	install -m 644 docs/dlock.1 $(DESTDIR)$(MANDIR)/man1/
	install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	install -m 644 cli/completion/dlock.bash $(DESTDIR)$(BASHCOMPDIR)/dlock
	install -m 644 cli/completion/_dlock $(DESTDIR)$(ZSHCOMPDIR)/_dlock
	install -m 644 $(MAN3) $(DESTDIR)$(MANDIR)/man3/
	@$(foreach p,$(MAN3),$(foreach n,$(filter-out $(basename $(notdir $(p))),$(call man3_names,$(p))),\
	  echo '.so man3/$(notdir $(p))' > $(DESTDIR)$(MANDIR)/man3/$(n).3;))
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS@|$(LIBS)|' dlock.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/dlock.pc
	@echo "dlock: installed under $(DESTDIR)$(PREFIX); run ldconfig (as root) if $(LIBDIR) is a system library directory"

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/dlock.h $(DESTDIR)$(LIBDIR)/libdlock.a $(DESTDIR)$(LIBDIR)/$(SONAME) \
	      $(DESTDIR)$(LIBDIR)/libdlock.so $(DESTDIR)$(LIBDIR)/pkgconfig/dlock.pc $(DESTDIR)$(BINDIR)/dlock \
	      $(DESTDIR)$(MANDIR)/man1/dlock.1 $(DESTDIR)$(BASHCOMPDIR)/dlock $(DESTDIR)$(ZSHCOMPDIR)/_dlock
	rm -f $(foreach p,$(MAN3),$(foreach n,$(call man3_names,$(p)),$(DESTDIR)$(MANDIR)/man3/$(n).3))

clean:
	rm -rf build build-san build-tsan build-fuzz
