#!/usr/bin/env bash
# Enables deb-src for Debian bookworm (so `apt-get source` works), unless some
# deb-src entry is already configured. Idempotent. Prints "added" when it
# wrote the file (the caller then runs apt-get update), nothing otherwise.
set -euo pipefail
SRCFILE=/etc/apt/sources.list.d/bunkai-deb-src.sources
if grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  exit 0
fi
tmp="$(mktemp)"
cat >"$tmp" <<'SRCEOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRCEOF
install -m 0644 "$tmp" "$SRCFILE"
rm -f "$tmp"
echo added
