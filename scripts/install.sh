#!/usr/bin/env bash
# Installs a built tree (make all) under $DESTDIR$PREFIX:
#   bin/bunkai                     the CLI
#   lib/bunkai/                    its helpers, runtimes, LLVM passes, the
#                                  Valgrind tool (the CLI finds them beside
#                                  itself, as ../lib/bunkai)
#   share/man/man1/                man pages (from the CLI's own definitions)
#   share/bash-completion/completions/bunkai, share/zsh/vendor-completions/_bunkai,
#   share/fish/vendor_completions.d/bunkai.fish
#   share/doc/bunkai/              README, LICENSE, CHANGELOG, docs/
#   scripts/install.sh PREFIX [DESTDIR]      (make install PREFIX=... DESTDIR=...)
#   scripts/install.sh --uninstall PREFIX [DESTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
uninstall=0
if [ "${1:-}" = --uninstall ]; then uninstall=1; shift; fi
prefix=${1:?usage: scripts/install.sh [--uninstall] PREFIX [DESTDIR]}
dest=${2:-}
root="$dest$prefix"
case "$prefix" in /*) ;; *) echo "install: PREFIX must be an absolute path, not '$prefix'" >&2; exit 2 ;; esac

files=(bin/bunkai lib/bunkai share/man/man1 share/bash-completion/completions/bunkai
       share/zsh/vendor-completions/_bunkai share/fish/vendor_completions.d/bunkai.fish share/doc/bunkai)
if [ "$uninstall" = 1 ]; then
  rm -f "$root/bin/bunkai" "$root/share/bash-completion/completions/bunkai" \
        "$root/share/zsh/vendor-completions/_bunkai" "$root/share/fish/vendor_completions.d/bunkai.fish"
  rm -f "$root"/share/man/man1/bunkai.1 "$root"/share/man/man1/bunkai-*.1
  rm -rf "$root/lib/bunkai" "$root/share/doc/bunkai"
  echo "install: removed bunkai from $root"
  exit 0
fi

[ -x build/bin/bunkai ] || { echo "install: build/bin/bunkai is missing (run make first)" >&2; exit 1; }
[ -d build/lib/bunkai ] || { echo "install: build/lib/bunkai is missing (run make first)" >&2; exit 1; }

install -d "$root/bin" "$root/lib" "$root/share/man/man1" "$root/share/bash-completion/completions" \
           "$root/share/zsh/vendor-completions" "$root/share/fish/vendor_completions.d" "$root/share/doc/bunkai"
install -m 755 build/bin/bunkai "$root/bin/bunkai"
rm -rf "$root/lib/bunkai"
cp -a build/lib/bunkai "$root/lib/bunkai"
# man pages and completions come from the CLI's own clap definitions
build/bin/bunkai generate man "$root/share/man/man1"
build/bin/bunkai generate complete-bash > "$root/share/bash-completion/completions/bunkai"
build/bin/bunkai generate complete-zsh > "$root/share/zsh/vendor-completions/_bunkai"
build/bin/bunkai generate complete-fish > "$root/share/fish/vendor_completions.d/bunkai.fish"
install -m 644 README.md LICENSE CHANGELOG.md "$root/share/doc/bunkai/"
cp -r docs "$root/share/doc/bunkai/docs"
echo "install: bunkai in $root (run $prefix/bin/bunkai)"
