#!/usr/bin/env bash
# Fetch Debian bookworm's zlib source package and configure it as
# debian/rules does (zlib's own configure, Debian's CFLAGS and LDFLAGS from
# dpkg-buildflags), with CC=clang-14, for bunkai scatter's drop-in --lib
# test: the library is scattered with exactly the flags zlib's Makefile
# links libz.so.1 with.
#
# Usage: scripts/fetch-zlib.sh [--force] [DEST]   (default: build/third_party/zlib)
#
# Result in DEST:
#   src/          the unpacked, configured source (zlib.map is there)
#   sources.txt   the library's C sources, one absolute path a line (the
#                 objects of zlib's Makefile target libz.so)
#   cflags.txt    one line: zlib's compile flags for the shared library (SFLAGS)
#   ldflags.txt   one line: its link flags (LDSHARED without the compiler
#                 and -shared, the version script made absolute, then -lc
#                 and Debian's LDFLAGS, e.g. -Wl,-z,relro)
#   VERSION, DEBIAN_VERSION, fetch.log
#
# Idempotent: a rerun with everything in place exits at once; --force
# fetches and configures again.
# Needs: apt (root, for deb-src setup), dpkg-dev, make, clang-14.
set -euo pipefail

FORCE=0
DEST=""
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fetch-zlib: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) [ -z "$DEST" ] || { echo "fetch-zlib: only one DEST allowed" >&2; exit 2; }
           DEST="$arg" ;;
    esac
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${DEST:-$ROOT/build/third_party/zlib}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
LOG="$DEST/fetch.log"
SRC="$DEST/src"

log() { echo "fetch-zlib: $*"; }
die() { echo "fetch-zlib: error: $*" >&2; exit 1; }

if [ "$FORCE" = 0 ] && [ -f "$DEST/.complete" ]; then
    exit 0
fi
command -v clang-14 >/dev/null || die "clang-14 not found (run scripts/install-deps.sh)"
command -v dpkg-source >/dev/null || die "dpkg-source not found (apt-get install dpkg-dev)"
command -v make >/dev/null || die "make not found (apt-get install make)"
rm -f "$DEST/.complete" "$DEST"/*.txt
: >"$LOG"

WORK="$DEST/work"
log "apt-get source zlib"
bash "$ROOT/scripts/debian-source.sh" zlib "$WORK" "$LOG" >"$DEST/DEBIAN_VERSION.tmp" \
    || die "could not fetch the zlib source package"
mv "$DEST/DEBIAN_VERSION.tmp" "$DEST/DEBIAN_VERSION"
rm -rf "$SRC"
mv "$WORK/src" "$SRC"

# debian/rules: CFLAGS = dpkg-buildflags' CFLAGS and CPPFLAGS -Wall
# -D_REENTRANT -O3 -DUNALIGNED_OK, LDFLAGS = dpkg-buildflags' LDFLAGS,
# uname=GNU ./configure --shared.
DEB_CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS) -Wall -D_REENTRANT -O3 -DUNALIGNED_OK"
DEB_LDFLAGS="$(dpkg-buildflags --get LDFLAGS)"
log "configuring as debian/rules does (CC=clang-14)"
(cd "$SRC" && CC=clang-14 CFLAGS="$DEB_CFLAGS" LDFLAGS="$DEB_LDFLAGS" uname=GNU ./configure --shared) >>"$LOG" 2>&1 \
    || { tail -n 30 "$LOG" >&2; die "zlib's configure failed (see $LOG)"; }

# The configured Makefile's own variables: make prints them, so what we use
# is what `make libz.so` would use.
var() { make -s -C "$SRC" -f Makefile -f - print-"$1" <<<"print-%: ; @echo \$(\$*)" 2>>"$LOG"; }
SFLAGS="$(var SFLAGS)"
LDSHARED="$(var LDSHARED)"
LDSHAREDLIBC="$(var LDSHAREDLIBC)"
LDFLAGS="$(var LDFLAGS)"
PIC_OBJS="$(var PIC_OBJS)"
VER="$(var SHAREDLIBV)"
VER="${VER#libz.so.}"
[ -n "$SFLAGS" ] && [ -n "$LDSHARED" ] && [ -n "$PIC_OBJS" ] && [ -n "$VER" ] \
    || die "cannot read SFLAGS, LDSHARED, PIC_OBJS and SHAREDLIBV from $SRC/Makefile (see $LOG)"

# LDSHARED is "clang-14 -shared -Wl,-soname,libz.so.1,--version-script,zlib.map":
# the compiler and -shared are bunkai scatter --lib's to give.
LD=""
for w in $LDSHARED; do
    case "$w" in
        clang-14|-shared) ;;
        *) LD="$LD ${w//zlib.map/$SRC/zlib.map}" ;;
    esac
done
[[ "$LD" == *"--version-script,$SRC/zlib.map"* ]] || die "zlib's link line has no version script: $LDSHARED"

: >"$DEST/sources.txt.tmp"
for o in $PIC_OBJS; do
    c="$SRC/${o%.lo}.c"
    [ -f "$c" ] || die "no source for $o ($c)"
    echo "$c" >>"$DEST/sources.txt.tmp"
done
mv "$DEST/sources.txt.tmp" "$DEST/sources.txt"
echo "$SFLAGS" >"$DEST/cflags.txt"
echo "${LD# } $LDSHAREDLIBC $LDFLAGS" >"$DEST/ldflags.txt"
echo "$VER" >"$DEST/VERSION"
touch "$DEST/.complete"
log "zlib $VER (Debian $(cat "$DEST/DEBIAN_VERSION")): $(wc -l <"$DEST/sources.txt") sources in $SRC"
log "  cflags: $SFLAGS"
log "  ldflags: $(cat "$DEST/ldflags.txt")"
