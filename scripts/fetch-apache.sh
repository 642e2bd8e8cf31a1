#!/usr/bin/env bash
# Fetch Debian bookworm's apache2 source package and build httpd twice, for
# bunkai flow's Table 3 on the paper's own server (issue 7, seed 003 §5.2:
# Apache under ApacheBench):
#   httpd-plain   clang-14 -O2 -g -gdwarf-4           (the baseline)
#   httpd-flow    bunkai flow cc -O2 -g -gdwarf-4     (join points + sleds)
# One executable each: the event MPM and Apache's "few" modules linked in
# (--enable-mods-static=few --disable-so), because weaving patches the main
# executable. APR, APR-util and PCRE2 are Debian's shared libraries.
#
# Usage: scripts/fetch-apache.sh [DEST]    (default: build/third_party/apache2)
#
# Result in DEST: httpd-plain, httpd-flow, VERSION (upstream),
# DEBIAN_VERSION, fetch.log, and work/ (the unpacked source and both build
# trees). Debian's reproducible-builds patch wants BUILD_DATETIME; it is
# the changelog's date here, as Debian's rules do.
#
# Idempotent: a rerun rebuilds only what is missing, and httpd-flow when the
# join-point pass is newer. --force rebuilds both.
# Needs: apt (root, for deb-src setup), dpkg-dev, make, libapr1-dev,
# libaprutil1-dev, libpcre2-dev, clang-14, and bunkai built (make).
set -euo pipefail

NAME=fetch-apache PKG=apache2 MARKER=server/main.c BIN=httpd HELP=2,21 DEFAULT=apache2
check_deps() {
    command -v apr-1-config >/dev/null && command -v apu-1-config >/dev/null && command -v pcre2-config >/dev/null \
        || die "libapr1-dev, libaprutil1-dev or libpcre2-dev is missing (run scripts/install-deps.sh)"
}
version_of() {
    awk '/define AP_SERVER_MAJORVERSION_NUMBER/{a=$3} /define AP_SERVER_MINORVERSION_NUMBER/{b=$3}
         /define AP_SERVER_PATCHLEVEL_NUMBER/{c=$3} END{print a"."b"."c}' "$1/include/ap_release.h"
}
# Out of tree.
build_tree() {
    local stamp
    stamp="$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Date 2>/dev/null | xargs -I{} date -u -d {} +%Y-%m-%dT%H:%M:%S || echo 2023-01-01T00:00:00)"
    mkdir -p "$1" && cd "$1"
    "$SRC/configure" CC="$2" CFLAGS="-O2 -g -gdwarf-4" --prefix="$1/root" \
        --with-apr="$(command -v apr-1-config)" --with-apr-util="$(command -v apu-1-config)" \
        --with-pcre="$(command -v pcre2-config)" --enable-mods-static=few --with-mpm=event --disable-so
    make -j"$(nproc)" EXTRA_CPPFLAGS="-DBUILD_DATETIME=\\\"$stamp\\\""
}
source "$(dirname "$0")/flow-server-build.sh"
flow_server_main "$@"
