# bunkai: top-level build.
#   make        build everything into build/ (CLI: build/bin/bunkai,
#               plugins/runtimes/helpers: build/lib/bunkai/)
#   make demo   install dependencies, build, run the main job
#   make test   build and run the whole test suite
#   make bench  run the benchmarks; results go to bench/results/
#   make install  install under $(PREFIX) (default /usr/local; DESTDIR honoured)
#   make deb    a Debian package in build/ (apt install ./build/bunkai_*.deb)
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

BUILD   := $(CURDIR)/build
CARGO   ?= cargo
JOBS    ?= $(shell nproc)

PREFIX  ?= /usr/local
DESTDIR ?=

.PHONY: all native cli deps demo test unit e2e bench stress-share clean fetch-sqlite fetch-memcached fetch-apache install uninstall deb

all: native cli

native:
	@mkdir -p $(BUILD) && cmake -S . -B $(BUILD)/cmake -G Ninja -DCMAKE_C_COMPILER=clang-14 \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_ASM_COMPILER=clang-14 \
	  -DBUNKAI_OUT=$(BUILD) >$(BUILD)/cmake.log 2>&1 || { cat $(BUILD)/cmake.log; exit 1; }
	@ninja -C $(BUILD)/cmake

cli:
	@$(CARGO) build --release --workspace --bins
	@mkdir -p $(BUILD)/bin
	@install -m 755 target/release/bunkai $(BUILD)/bin/bunkai

deps:
	@bash scripts/install-deps.sh

fetch-sqlite:
	@bash scripts/fetch-sqlite.sh $(BUILD)/third_party/sqlite

# flow's real-server case study: Debian's memcached, plain and with flow cc.
fetch-memcached: all
	@bash scripts/fetch-memcached.sh $(BUILD)/third_party/memcached

# flow's Table 3 on the paper's own server: Debian's apache2, plain and with
# flow cc (benchmarks only).
fetch-apache: all
	@bash scripts/fetch-apache.sh $(BUILD)/third_party/apache2

# The main job: scatter SQLite (shell and library), demo1 and demo2, show
# the paper's Tables 3-5 beside ours.
demo: deps all
	@bash bench/scatter/run.sh --quick

unit: all
	@$(CARGO) test --release --workspace --exclude bunkai-e2e

e2e: all fetch-sqlite fetch-memcached fetch-apache
	@BUNKAI=$(BUILD)/bin/bunkai BUNKAI_ROOT=$(CURDIR) $(CARGO) test --release -p bunkai-e2e -- --test-threads=2

test: all fetch-sqlite fetch-memcached fetch-apache
	@BUNKAI=$(BUILD)/bin/bunkai BUNKAI_ROOT=$(CURDIR) $(CARGO) test --release --workspace -- --test-threads=2

bench: all fetch-sqlite fetch-memcached fetch-apache
	@bash bench/scatter/run.sh
	@python3 bench/scatter/exits.py
	@bash bench/mod/run.sh
	@bash bench/mod/acquire.sh
	@bash bench/mod/mutants.sh
	@bash bench/trace/run.sh
	@bash bench/share/run.sh
	@bash bench/share/stress.sh
	@bash bench/flow/run.sh
	@bash bench/scatter/net.sh

# bunkai share under repetition: hundreds of runs, every one checked
# (about 50 minutes; results in bench/results/share-stress.md).
stress-share: all
	@bash bench/share/stress.sh

install: all
	@bash scripts/install.sh "$(PREFIX)" "$(DESTDIR)"

uninstall:
	@bash scripts/install.sh --uninstall "$(PREFIX)" "$(DESTDIR)"

deb: all
	@bash scripts/make-deb.sh

clean:
	rm -rf $(BUILD) target
