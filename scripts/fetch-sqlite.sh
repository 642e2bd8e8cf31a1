#!/usr/bin/env bash
# Fetch Debian bookworm's sqlite3 source package and generate the SQLite
# amalgamation (sqlite3.c, sqlite3.h, sqlite3ext.h, shell.c) for bunkai's
# scatter tests and benchmarks.
#
# Usage: scripts/fetch-sqlite.sh [DEST]     (default: build/third_party/sqlite)
#
# Result in DEST:
#   sqlite3.c sqlite3.h sqlite3ext.h shell.c   the amalgamation
#   VERSION                                    upstream version, e.g. 3.40.1
#   DEBIAN_VERSION                             source package version
#   flags.txt                                  one line: clang compile flags
#                                              (Debian-like feature set) for both
#                                              the shell and the library, then
#                                              the link libs -lm -ldl -lpthread
#   cflags.txt, libs.txt                       the same line split in two, for
#                                              compile-only (-c) and link steps
#   fetch.log                                  configure/make output
#   work/                                      source package and build dir
#
# Build the shell with:
#   clang-14 $(cat DEST/flags.txt) -I DEST DEST/shell.c DEST/sqlite3.c -o sqlite3
#
# Idempotent: a rerun with everything in place only rewrites flags.txt,
# cflags.txt and libs.txt and exits.  Pass --force to regenerate the
# amalgamation, and --verify to also compile the shell with flags.txt and run
# a smoke query (slow: about a minute of CPU for sqlite3.c at -O2).
# Needs: apt (root, for deb-src setup), dpkg-dev, make, a C compiler for
# configure, tclsh.
set -euo pipefail

FORCE=0
VERIFY=0
DEST=""
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        --verify) VERIFY=1 ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fetch-sqlite: unknown option $arg" >&2; exit 2 ;;
        *) [ -z "$DEST" ] || { echo "fetch-sqlite: only one DEST allowed" >&2; exit 2; }
           DEST="$arg" ;;
    esac
done
DEST="${DEST:-build/third_party/sqlite}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
WORK="$DEST/work"
LOG="$DEST/fetch.log"
CC_FOR_VERIFY="${CC_FOR_VERIFY:-clang-14}"

log() { echo "fetch-sqlite: $*"; }
die() { echo "fetch-sqlite: error: $*" >&2; exit 1; }

# Compile-time options, modelled on Debian's sqlite3 build (debian/rules),
# restricted to what the amalgamation needs and valid for 3.40.
# JSON1 is built in since 3.38 (SQLITE_ENABLE_JSON1 is a no-op there) and
# DESERIALIZE is on by default since 3.36, so neither is listed.
# No HAVE_READLINE: the shell reads plain stdin.
FLAGS="-O2 -DSQLITE_ENABLE_FTS3 -DSQLITE_ENABLE_FTS3_PARENTHESIS -DSQLITE_ENABLE_FTS4 -DSQLITE_ENABLE_FTS5 -DSQLITE_ENABLE_RTREE -DSQLITE_ENABLE_GEOPOLY -DSQLITE_ENABLE_MATH_FUNCTIONS -DSQLITE_THREADSAFE=1 -DSQLITE_ENABLE_COLUMN_METADATA -DSQLITE_SECURE_DELETE -DSQLITE_ENABLE_UNLOCK_NOTIFY -DSQLITE_ENABLE_DBSTAT_VTAB -DSQLITE_MAX_SCHEMA_RETRY=25 -DSQLITE_ENABLE_PREUPDATE_HOOK -DSQLITE_ENABLE_SESSION -DSQLITE_ENABLE_STMTVTAB -DSQLITE_ENABLE_BYTECODE_VTAB -DSQLITE_DEFAULT_FOREIGN_KEYS=0 -DHAVE_USLEEP=1 -DHAVE_ISNAN=1"
LIBS="-lm -ldl -lpthread"

write_one() { printf '%s\n' "$2" > "$DEST/$1.tmp" && mv "$DEST/$1.tmp" "$DEST/$1"; }
write_flags() {
    write_one flags.txt "$FLAGS $LIBS"
    write_one cflags.txt "$FLAGS"
    write_one libs.txt "$LIBS"
}

verify() {
    command -v "$CC_FOR_VERIFY" >/dev/null || die "$CC_FOR_VERIFY not found (set CC_FOR_VERIFY)"
    local out="$WORK/sqlite3-verify"
    log "verifying flags: building the shell with $CC_FOR_VERIFY ..."
    # shellcheck disable=SC2086
    if ! "$CC_FOR_VERIFY" $(cat "$DEST/flags.txt") -I "$DEST" "$DEST/shell.c" "$DEST/sqlite3.c" \
            -o "$out" >>"$LOG" 2>&1; then
        tail -n 30 "$LOG" >&2
        die "compiling the shell with flags.txt failed (see $LOG)"
    fi
    local got
    got="$(echo 'select sqlite_version();' | "$out")"
    [ "$got" = "$(cat "$DEST/VERSION")" ] || die "smoke test printed '$got'"
    log "verified: $out reports sqlite_version() = $got"
}

amalgamation_done() {
    local f
    for f in sqlite3.c sqlite3.h sqlite3ext.h shell.c VERSION; do
        [ -s "$DEST/$f" ] || return 1
    done
    [ -f "$DEST/.complete" ]
}

if [ "$FORCE" = 0 ] && amalgamation_done; then
    write_flags
    log "already done: SQLite $(cat "$DEST/VERSION") amalgamation in $DEST"
    [ "$VERIFY" = 0 ] || verify
    exit 0
fi

command -v tclsh >/dev/null || die "tclsh not found (apt-get install tcl)"
command -v dpkg-source >/dev/null || die "dpkg-source not found (apt-get install dpkg-dev)"
command -v make >/dev/null || die "make not found"

mkdir -p "$WORK"
rm -f "$DEST/.complete"
: > "$LOG"

SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null && SUDO="sudo"
fi

# --- 1. make sure deb-src for bookworm is configured -------------------------
# `apt-get indextargets` lists the configured index targets whether or not
# their files were downloaded, so it tells us if deb-src lines exist.
src_suites() {
    apt-get indextargets --no-release-info --format '$(RELEASE)' 'Created-By: Sources' 2>/dev/null | sort -u
}
src_lists_missing() {
    # configured deb-src targets whose index was never downloaded
    local f
    while IFS= read -r f; do
        [ -n "$f" ] || continue
        compgen -G "$f*" >/dev/null || return 0
    done < <(apt-get indextargets --no-release-info --format '$(FILENAME)' 'Created-By: Sources' 2>/dev/null)
    return 1
}

ADDED=0
if ! src_suites | grep -qx 'bookworm'; then
    SRCFILE=/etc/apt/sources.list.d/bunkai-deb-src.sources
    log "no deb-src for bookworm configured; adding $SRCFILE"
    uses_security=0
    if apt-get indextargets --no-release-info --format '$(RELEASE)' 2>/dev/null | grep -qx 'bookworm-security'; then
        uses_security=1
    fi
    {
        printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        if [ "$uses_security" = 1 ]; then
            printf '\nTypes: deb-src\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        fi
    } | $SUDO tee "$SRCFILE.tmp" >/dev/null
    $SUDO mv "$SRCFILE.tmp" "$SRCFILE"
    ADDED=1
fi
if [ "$ADDED" = 1 ] || src_lists_missing; then
    log "apt-get update ..."
    $SUDO apt-get update -qq >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "apt-get update failed"; }
fi

# --- 2. download and unpack the source package -------------------------------
mkdir -p "$WORK"
log "downloading Debian source package sqlite3 ..."
(
    cd "$WORK"
    # As root apt warns that the download is unsandboxed (user _apt); harmless.
    apt-get source --download-only -qq sqlite3
) >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "apt-get source sqlite3 failed"; }

DSC="$(ls -t "$WORK"/sqlite3_*.dsc 2>/dev/null | head -n 1)"
[ -n "$DSC" ] || die "no sqlite3_*.dsc downloaded into $WORK"
DEBVER="$(sed -n 's/^Version: //p' "$DSC" | head -n 1)"
UPVER="${DEBVER%%-*}"
UPVER="${UPVER#*:}"
SRCDIR="$WORK/sqlite3-$UPVER"
log "unpacking $(basename "$DSC") (Debian version $DEBVER) ..."
rm -rf "$SRCDIR"
(cd "$WORK" && dpkg-source --no-check -x "$(basename "$DSC")" "$(basename "$SRCDIR")") >>"$LOG" 2>&1 \
    || { tail -n 30 "$LOG" >&2; die "dpkg-source -x failed"; }

# --- 3. generate the amalgamation --------------------------------------------
BLD="$WORK/bld"
rm -rf "$BLD"
mkdir -p "$BLD"
log "configuring and generating the amalgamation (log: $LOG) ..."
(
    cd "$BLD"
    "$SRCDIR/configure" --disable-tcl --disable-readline --disable-editline \
        --with-tcl=/nonexistent
    make -j"$(nproc 2>/dev/null || echo 2)" sqlite3.c shell.c
) >>"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; die "configure/make failed"; }

for f in sqlite3.c sqlite3.h sqlite3ext.h shell.c; do
    if [ -f "$BLD/$f" ]; then
        cp "$BLD/$f" "$DEST/$f"
    elif [ -f "$SRCDIR/src/$f" ]; then
        cp "$SRCDIR/src/$f" "$DEST/$f"      # sqlite3ext.h lives in src/
    else
        die "$f was not generated"
    fi
done
AMALVER="$(sed -n 's/^#define SQLITE_VERSION  *"\([^"]*\)".*/\1/p' "$DEST/sqlite3.h" | head -n 1)"
[ -n "$AMALVER" ] || die "cannot read SQLITE_VERSION from sqlite3.h"
printf '%s\n' "$AMALVER" > "$DEST/VERSION"
printf '%s\n' "$DEBVER" > "$DEST/DEBIAN_VERSION"
write_flags
touch "$DEST/.complete"

log "SQLite $AMALVER (Debian $DEBVER) amalgamation ready in $DEST:"
for f in sqlite3.c sqlite3.h sqlite3ext.h shell.c VERSION flags.txt cflags.txt libs.txt; do
    echo "  $DEST/$f"
done
[ "$VERIFY" = 0 ] || verify
