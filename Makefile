# bunkai: top-level build.
#   make        build everything into build/ (CLI: build/bin/bunkai,
#               plugins/runtimes/helpers: build/lib/bunkai/)
#   make demo   install dependencies, build, show each subsystem at work
#               (scripts/demo.sh, under a minute after the build)
#   make test   build and run the whole test suite
#   make bench  the papers' evaluations, all five (hours); results go to
#               bench/results/; one subsystem's: make bench-scatter,
#               bench-trace, bench-trace-system, bench-share, bench-flow, bench-mod
#   make install  install under $(PREFIX) (default /usr/local; DESTDIR honoured)
#   make deb    a Debian package in build/ (apt install ./build/bunkai_*.deb)
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

BUILD   := $(CURDIR)/build
CARGO   ?= cargo
JOBS    ?= $(shell nproc)

PREFIX  ?= /usr/local
DESTDIR ?=

.PHONY: guest fetch-qemu-plugin-header bench-trace-system all native cli deps demo test unit e2e bench bench-scatter bench-trace bench-share bench-flow bench-mod bench-cli stress-share clean fetch-sqlite fetch-zlib fetch-memcached fetch-apache install uninstall deb

all: native cli

native: fetch-qemu-plugin-header
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

# trace's QEMU plugin: the plugin API header from Debian's qemu source.
fetch-qemu-plugin-header:
	@bash scripts/fetch-qemu-plugin-header.sh $(BUILD)/third_party/qemu-plugin

fetch-sqlite:
	@bash scripts/fetch-sqlite.sh $(BUILD)/third_party/sqlite

# scatter's drop-in --lib test: Debian's zlib, configured as debian/rules does.
fetch-zlib:
	@bash scripts/fetch-zlib.sh $(BUILD)/third_party/zlib

# flow's real-server case study: Debian's memcached, plain and with flow cc.
fetch-memcached: all
	@bash scripts/fetch-memcached.sh $(BUILD)/third_party/memcached

# flow's Table 3 on the paper's own server: Debian's apache2, plain and with
# flow cc (benchmarks only).
fetch-apache: all
	@bash scripts/fetch-apache.sh $(BUILD)/third_party/apache2

# Each subsystem at work on a small bundled program, loopback and the
# demo's own network namespaces only; output in a directory outside the
# repository ($$BUNKAI_DEMO_DIR, or a new /tmp/bunkai-demo.*).
demo: deps all
	@bash scripts/demo.sh

unit: all
	@$(CARGO) test --release --workspace --exclude bunkai-e2e

e2e: all fetch-sqlite fetch-zlib fetch-memcached fetch-apache
	@BUNKAI=$(BUILD)/bin/bunkai BUNKAI_ROOT=$(CURDIR) $(CARGO) test --release -p bunkai-e2e -- --test-threads=2

test: all fetch-sqlite fetch-zlib fetch-memcached fetch-apache
	@BUNKAI=$(BUILD)/bin/bunkai BUNKAI_ROOT=$(CURDIR) $(CARGO) test --release --workspace -- --test-threads=2

# The papers' evaluations. Each target says first how long it takes, from
# the durations recorded in bench/results/ and the scripts' own notes.
bench: bench-scatter bench-mod bench-trace bench-trace-system bench-share bench-flow bench-cli

bench-scatter: all fetch-sqlite
	@echo "make bench-scatter: over 100 minutes: Tables 3-7 with Vim (bench/scatter/run.sh; not timed in full, its --quick run took 43 minutes), every exit over HTTP (9 minutes, bench/results/scatter-exits.md), Table 8 over a narrow network (about 50 minutes, docs/scatter.md), how long a scatter takes (about 3 minutes at load average 3.5, bench/results/scatter-speed.md)"
	@bash bench/scatter/run.sh
	@python3 bench/scatter/exits.py
	@bash bench/scatter/net.sh
	@python3 bench/scatter/speed.py

bench-mod: all
	@echo "make bench-mod: about 100 minutes: Table 1 (12 s) and the registry's cost (3 s), timed on 2 shared cores at load average 9-19, then 100,000 module mutants (96 minutes, bench/results/mod-mutants.md)"
	@bash bench/mod/run.sh
	@bash bench/mod/acquire.sh
	@bash bench/mod/mutants.sh

bench-trace: all
	@echo "make bench-trace: about 10 minutes: the Apache case study (12 s) and recording speed against lackey (601 s), timed on 2 shared cores at load average 9-19"
	@bash bench/trace/run.sh

bench-trace-system: all guest
	@echo "make bench-trace-system: about 12 minutes: the Apache case study in full-system mode (ten boots of the guest under QEMU's TCG: each request recorded, and counted only for the baseline), timed on 2 shared cores at load average 6-8"
	@python3 bench/trace/system.py

bench-share: all
	@echo "make bench-share: 100-120 minutes: the evaluation (about 10 minutes, bench/share/run.sh), then 976 checked runs across three hosts (90-107 minutes under load, bench/results/share-stress.md)"
	@bash bench/share/run.sh
	@bash bench/share/stress.sh

bench-flow: all fetch-memcached fetch-apache
	@echo "make bench-flow: over 20 minutes: Table 1 and weaving speed (43 s), the split driver (12 s) and its Table 3 (18 minutes), timed on 2 shared cores at load average 9-19; memcached and Apache, and building them, not timed yet"
	@bash bench/flow/run.sh

bench-cli: all
	@echo "make bench-cli: about 10 seconds: the CLI's start-up beside /bin/true (bench/cli/startup.py)"
	@python3 bench/cli/startup.py

# bunkai share under repetition: hundreds of runs, every one checked
# (90-107 minutes on these machines; results in bench/results/share-stress.md).
stress-share: all
	@bash bench/share/stress.sh

# trace's full-system guest (Debian's kernel, an initramfs with Apache):
# build/guest/{vmlinuz,System.map,initrd.gz}; see docs/trace.md.
guest:
	@bash trace/guest/build.sh $(BUILD)/guest

install: all
	@bash scripts/install.sh "$(PREFIX)" "$(DESTDIR)"

uninstall:
	@bash scripts/install.sh --uninstall "$(PREFIX)" "$(DESTDIR)"

deb: all
	@bash scripts/make-deb.sh

clean:
	rm -rf $(BUILD) target
