#!/usr/bin/env bash
# bunkai workload "SQLite3-init": create a new database file.
#
# Usage: workload-init.sh SQLITE_BIN DBFILE
#
# Runs the sqlite3 shell SQLITE_BIN once to create the database file DBFILE
# holding one table, then prints (from the same shell run) the schema and the
# file's page count, so stdout is deterministic:
#
#   records|CREATE TABLE records (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category INTEGER NOT NULL, value INTEGER NOT NULL, tag TEXT NOT NULL)
#   2
#
# (the same table as workload-query.sql).  A DBFILE that already exists is
# removed first only if it is empty or an SQLite database; anything else is
# refused.  Exit status is the shell's; stderr should be empty.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 SQLITE_BIN DBFILE" >&2
    exit 2
fi
SQLITE_BIN="$1"
DB="$2"

if [ -e "$DB" ]; then
    if [ ! -f "$DB" ]; then
        echo "$0: $DB exists and is not a regular file" >&2
        exit 1
    fi
    if [ -s "$DB" ] && [ "$(head -c 15 "$DB")" != "SQLite format 3" ]; then
        echo "$0: $DB exists and is not an SQLite database; refusing to remove it" >&2
        exit 1
    fi
fi
rm -f -- "$DB" "$DB-journal" "$DB-wal" "$DB-shm"

"$SQLITE_BIN" "$DB" <<'EOF'
CREATE TABLE records (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category INTEGER NOT NULL, value INTEGER NOT NULL, tag TEXT NOT NULL);
SELECT name, sql FROM sqlite_schema ORDER BY name;
PRAGMA page_count;
EOF
