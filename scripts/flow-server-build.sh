# flow-server-build.sh: the part that scripts/fetch-memcached.sh and
# scripts/fetch-apache.sh share (sourced, not run): options, paths, checks,
# the Debian source package, and two builds of one server, plain (clang-14)
# and with `bunkai flow cc`, each installed by a rename.
#
# The sourcing script sets
#   NAME      its name in messages ("fetch-apache")
#   PKG       the Debian source package, MARKER a file of its unpacked source
#   BIN       the server's executable: DEST/BIN-plain, DEST/BIN-flow
#   HELP      the line range of its header comment that --help prints
#   DEFAULT   the default DEST, under build/third_party
# and defines
#   check_deps            dies (with `die`) when a build dependency is missing
#   version_of SRC        prints the upstream version of the unpacked source
#   build_tree TREE CC    builds in the empty TREE from $SRC; the executable
#                         is TREE/$BIN; output goes to the log
# then calls flow_server_main "$@".
# Idempotent: a rerun rebuilds only what is missing, and BIN-flow when the
# join-point pass is newer than it. --force rebuilds both.

log() { echo "$NAME: $*"; }
die() { echo "$NAME: error: $*" >&2; exit 1; }

flow_server_main() {
    FORCE=0
    DEST=""
    for arg in "$@"; do
        case "$arg" in
            --force) FORCE=1 ;;
            -h|--help) sed -n "${HELP}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
            -*) echo "$NAME: unknown option $arg (see --help)" >&2; exit 2 ;;
            *) [ -z "$DEST" ] || { echo "$NAME: only one DEST allowed" >&2; exit 2; }
               DEST="$arg" ;;
        esac
    done
    ROOT="$(cd "$(dirname "$0")/.." && pwd)"
    DEST="${DEST:-$ROOT/build/third_party/$DEFAULT}"
    mkdir -p "$DEST"
    DEST="$(cd "$DEST" && pwd)"
    WORK="$DEST/work"
    LOG="$DEST/fetch.log"
    SRC="$WORK/src"
    BUNKAI="$ROOT/build/bin/bunkai"
    PASS="$ROOT/build/lib/bunkai/BunkaiFlow.so"

    [ -x "$BUNKAI" ] && [ -e "$PASS" ] || die "bunkai is not built ($BUNKAI, $PASS) (run make first)"
    command -v clang-14 >/dev/null || die "clang-14 not found (run scripts/install-deps.sh)"
    check_deps

    # Up to date? The flow build also goes stale when the join-point pass
    # changes. (Not the CLI: make reinstalls it on every build, and flow
    # cc's driver part rarely changes; --force covers that.)
    fresh() { [ "$FORCE" = 0 ] && [ -x "$DEST/$BIN-$1" ] && { [ "$1" = plain ] || [ "$DEST/$BIN-$1" -nt "$PASS" ]; }; }
    if fresh plain && fresh flow; then
        exit 0
    fi

    if [ ! -f "$SRC/$MARKER" ]; then
        log "apt-get source $PKG"
        : >"$LOG"
        bash "$ROOT/scripts/debian-source.sh" "$PKG" "$WORK" "$LOG" >"$DEST/DEBIAN_VERSION" || die "could not fetch the $PKG source package"
        version_of "$SRC" >"$DEST/VERSION"
    fi

    local variant cc tree
    for variant in plain flow; do
        fresh "$variant" && continue
        cc=clang-14
        [ "$variant" = flow ] && cc="$BUNKAI flow cc"
        tree="$WORK/build-$variant"
        log "building $BIN-$variant (CC=$cc)"
        rm -rf "$tree"
        (build_tree "$tree" "$cc") >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "building $BIN-$variant failed (see $LOG)"; }
        install -m 755 "$tree/$BIN" "$DEST/$BIN-$variant.tmp"
        mv "$DEST/$BIN-$variant.tmp" "$DEST/$BIN-$variant"
    done
    log "$PKG $(cat "$DEST/VERSION") (Debian $(cat "$DEST/DEBIAN_VERSION")): $DEST/$BIN-plain, $DEST/$BIN-flow"
}
