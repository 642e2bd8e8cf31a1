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

FORCE=0
DEST=""
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fetch-apache: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) [ -z "$DEST" ] || { echo "fetch-apache: only one DEST allowed" >&2; exit 2; }
           DEST="$arg" ;;
    esac
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${DEST:-$ROOT/build/third_party/apache2}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
WORK="$DEST/work"
LOG="$DEST/fetch.log"
BUNKAI="$ROOT/build/bin/bunkai"
PASS="$ROOT/build/lib/bunkai/BunkaiFlow.so"

log() { echo "fetch-apache: $*"; }
die() { echo "fetch-apache: error: $*" >&2; exit 1; }

[ -x "$BUNKAI" ] && [ -e "$PASS" ] || die "bunkai is not built ($BUNKAI, $PASS) (run make first)"
command -v clang-14 >/dev/null || die "clang-14 not found (run scripts/install-deps.sh)"
command -v apr-1-config >/dev/null && command -v apu-1-config >/dev/null && command -v pcre2-config >/dev/null \
    || die "libapr1-dev, libaprutil1-dev or libpcre2-dev is missing (run scripts/install-deps.sh)"

fresh_plain() { [ "$FORCE" = 0 ] && [ -x "$DEST/httpd-plain" ]; }
fresh_flow() { [ "$FORCE" = 0 ] && [ -x "$DEST/httpd-flow" ] && [ "$DEST/httpd-flow" -nt "$PASS" ]; }
if fresh_plain && fresh_flow; then
    exit 0
fi

# --- 1. the source package ------------------------------------------------
SRC="$WORK/src"
if [ ! -f "$SRC/server/main.c" ]; then
    log "apt-get source apache2"
    : >"$LOG"
    bash "$ROOT/scripts/debian-source.sh" apache2 "$WORK" "$LOG" >"$DEST/DEBIAN_VERSION" || die "could not fetch the apache2 source package"
    (cd "$SRC" && awk '/define AP_SERVER_MAJORVERSION_NUMBER/{a=$3} /define AP_SERVER_MINORVERSION_NUMBER/{b=$3} /define AP_SERVER_PATCHLEVEL_NUMBER/{c=$3} END{print a"."b"."c}' include/ap_release.h) >"$DEST/VERSION"
fi

# --- 2. two builds (out of tree) --------------------------------------------
STAMP="$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Date 2>/dev/null | xargs -I{} date -u -d {} +%Y-%m-%dT%H:%M:%S || echo 2023-01-01T00:00:00)"
build() { # NAME CC
    local name="$1" cc="$2" tree="$WORK/build-$1"
    log "building httpd-$name (CC=$cc)"
    rm -rf "$tree" && mkdir -p "$tree"
    (
        cd "$tree"
        "$SRC/configure" CC="$cc" CFLAGS="-O2 -g -gdwarf-4" --prefix="$tree/root" \
            --with-apr="$(command -v apr-1-config)" --with-apr-util="$(command -v apu-1-config)" \
            --with-pcre="$(command -v pcre2-config)" --enable-mods-static=few --with-mpm=event --disable-so >>"$LOG" 2>&1
        make -j"$(nproc)" EXTRA_CPPFLAGS="-DBUILD_DATETIME=\\\"$STAMP\\\"" >>"$LOG" 2>&1
    ) || { tail -n 30 "$LOG" >&2; die "building httpd-$name failed (see $LOG)"; }
    install -m 755 "$tree/httpd" "$DEST/httpd-$name.tmp"
    mv "$DEST/httpd-$name.tmp" "$DEST/httpd-$name"
}
fresh_plain || build plain clang-14
fresh_flow || build flow "$BUNKAI flow cc"
log "apache2 $(cat "$DEST/VERSION") (Debian $(cat "$DEST/DEBIAN_VERSION")): $DEST/httpd-plain, $DEST/httpd-flow"
