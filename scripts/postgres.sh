#!/usr/bin/env bash
# A private PostgreSQL server for the store tests (Debian 12, as root): installs Debian's
# `postgresql` if it is missing, makes a cluster of its own under /var/tmp/lizard-pg (never
# the system's), starts it on 127.0.0.1 only, and prints the URL of a `lizard` role that may
# CREATE DATABASE (each PostgreSQL store test makes a fresh database of its own).
#
# Idempotent: a second run finds the cluster made (and running) and only prints the URL.
# Tuned for tests, not for data: fsync off (a crash of this cluster loses test databases,
# nothing else).
#
#   scripts/postgres.sh            # prints postgres://lizard@127.0.0.1:54329/lizard
#   scripts/postgres.sh stop       # stops it (the files stay for the next run)
#
# Environment: LIZARD_PG_DIR (default /var/tmp/lizard-pg), LIZARD_PG_PORT (default 54329).
set -euo pipefail
dir="${LIZARD_PG_DIR:-/var/tmp/lizard-pg}"
port="${LIZARD_PG_PORT:-54329}"
log() { printf '%s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "scripts/postgres.sh runs as root (it runs the server as the postgres user)"; exit 1; }

pg_bin() { find /usr/lib/postgresql -maxdepth 3 -name initdb -path '*/bin/*' 2>/dev/null | sort -V | tail -1 | xargs -r dirname; }
bin="$(pg_bin)"
if [ -z "$bin" ]; then
  log "==> installing PostgreSQL (Debian's postgresql package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  # Progress on the terminal: the download is the slow part on a fresh machine.
  apt-get install -y --no-install-recommends postgresql
  bin="$(pg_bin)"
  [ -n "$bin" ] || { log "postgresql installed but no initdb found under /usr/lib/postgresql"; exit 1; }
fi
# From / : the postgres user may not enter the directory this script runs in.
as_pg() { (cd / && runuser -u postgres -- "$@"); }

data="$dir/data"
if [ ! -s "$data/PG_VERSION" ]; then
  log "==> a private test cluster in $data"
  mkdir -p "$dir"
  chown postgres:postgres "$dir"
  chmod 0700 "$dir"
  # The postgres superuser over the cluster's own socket only; the lizard role over
  # loopback TCP only; nothing else is let in.
  as_pg "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=reject -E UTF8 --locale=C.UTF-8 >/dev/null
  {
    echo "local all postgres trust"
    echo "host all lizard 127.0.0.1/32 trust"
  } >"$data/pg_hba.conf"
  cat >>"$data/postgresql.conf" <<EOF
# Set by scripts/postgres.sh: a test cluster on loopback.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
fi

if [ "${1:-}" = stop ]; then
  as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1 && as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >&2
  exit 0
fi

if ! as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
  log "==> starting the test cluster on 127.0.0.1:$port"
  as_pg "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 start >/dev/null
fi

psql_admin() { as_pg "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -tAq "$@"; }
if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = 'lizard'")" != 1 ]; then
  psql_admin -c "CREATE ROLE lizard LOGIN CREATEDB"
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = 'lizard'")" != 1 ]; then
  psql_admin -c "CREATE DATABASE lizard OWNER lizard"
fi
# Databases that failed tests left behind (a passing test drops its own); one still in use
# by a running test is left alone.
for db in $(psql_admin -c "SELECT datname FROM pg_database WHERE datname LIKE 'lizard\_test\_%'"); do
  psql_admin -c "DROP DATABASE \"$db\"" 2>/dev/null || true
done
echo "postgres://lizard@127.0.0.1:$port/lizard"
