#!/usr/bin/env bash
# A local PostgreSQL server for dpsynth: the one `make up` runs (scripts/platform.sh) and the one the tests start
# (tests/pg_fixtures.py).
#   scripts/postgres.sh bin                       the directory holding initdb and pg_ctl; exit 1 (and why) if none
#   scripts/postgres.sh start DIR PORT [DB...]    initdb DIR/db on first use, start the server, create the DBs
#   scripts/postgres.sh stop DIR                  stop it (fast shutdown; nothing to do when it is not running)
#   scripts/postgres.sh status DIR                exit 0 while it runs
#   scripts/postgres.sh url DIR PORT DB           the SQLAlchemy URL of DB (Unix socket, superuser dpsynth)
# SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; dpsynth ships psycopg2 (requirements/stage.lock), hence +psycopg2.
# The binaries: $PG_BIN, else initdb/pg_ctl on PATH, else the newest /usr/lib/postgresql/*/bin (Debian, Ubuntu).
# The server listens on a Unix socket in DIR, whose mode is 0700 (only DIR's owner and root can connect; `trust`
# authentication for that socket). With PG_PASSWORD set when DIR/db is first made, it also listens on
# 127.0.0.1:PORT with scram-sha-256 password authentication (the user is PG_USER, default dpsynth).
# PostgreSQL refuses to run as root: as root, DIR is given to the `postgres` system user and the server runs as it.
set -euo pipefail

PG_USER="${PG_USER:-dpsynth}"

pg_bin() {
  if [[ -n "${PG_BIN:-}" ]]; then
    [[ -x "$PG_BIN/initdb" && -x "$PG_BIN/pg_ctl" ]] || { echo "PG_BIN=$PG_BIN has no initdb/pg_ctl" >&2; return 1; }
    echo "$PG_BIN"; return
  fi
  local ctl
  if ctl="$(command -v pg_ctl)" && command -v initdb > /dev/null; then
    dirname "$(readlink -f "$ctl")"; return
  fi
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then echo "$d"; return; fi
  echo "no PostgreSQL server binaries (initdb, pg_ctl): not on PATH, not in /usr/lib/postgresql/*/bin, no PG_BIN" >&2
  return 1
}

as_owner() {  # run a server command as the user that owns the data directory (postgres, when we are root)
  if [[ "$(id -u)" == 0 ]]; then
    id postgres > /dev/null 2>&1 || { echo "running as root and there is no 'postgres' user to run PostgreSQL as" >&2; return 1; }
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start() {
  local dir="$1" port="$2"; shift 2
  local bin; bin="$(pg_bin)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  chmod 700 "$dir"
  if [[ "$(id -u)" == 0 ]]; then
    chown postgres "$dir"
    runuser -u postgres -- test -w "$dir" || { echo "the postgres user cannot reach $dir (a parent directory" \
      "is not searchable by it): choose a data directory it can reach (platform.sh: PG_DIR)" >&2; return 1; }
  fi
  if [[ ! -f "$dir/db/PG_VERSION" ]]; then
    if [[ -n "${PG_PASSWORD:-}" ]]; then
      (umask 077 && printf '%s\n' "$PG_PASSWORD" > "$dir/pwfile")
      [[ "$(id -u)" == 0 ]] && chown postgres "$dir/pwfile"
      as_owner "$bin/initdb" -D "$dir/db" -U "$PG_USER" --auth-local=trust --auth-host=scram-sha-256 \
        --pwfile="$dir/pwfile" > "$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
      rm -f "$dir/pwfile"
      echo "listen_addresses = '127.0.0.1'" > "$dir/db/dpsynth-listen.conf"
    else
      as_owner "$bin/initdb" -D "$dir/db" -U "$PG_USER" --auth-local=trust --auth-host=reject \
        > "$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
      echo "listen_addresses = ''" > "$dir/db/dpsynth-listen.conf"
    fi
    printf "include_if_exists = 'dpsynth-listen.conf'\ninclude_if_exists = 'dpsynth.conf'\n" >> "$dir/db/postgresql.conf"
  fi
  # where it listens: rewritten at every start (the port may change between starts)
  printf "port = %d\nunix_socket_directories = '%s'\nunix_socket_permissions = 0700\n" "$port" "$dir" \
    > "$dir/db/dpsynth.conf"
  [[ "$(id -u)" == 0 ]] && chown postgres "$dir/db/dpsynth.conf"
  if ! as_owner "$bin/pg_ctl" -D "$dir/db" status > /dev/null 2>&1; then
    as_owner "$bin/pg_ctl" -D "$dir/db" -l "$dir/server.log" -w -t 60 start > /dev/null ||
      { tail -20 "$dir/server.log" >&2; return 1; }
  fi
  local db
  for db in "$@"; do
    if [[ -z "$("$bin/psql" -h "$dir" -p "$port" -U "$PG_USER" -d postgres -tAc \
                "SELECT 1 FROM pg_database WHERE datname = '$db'")" ]]; then
      "$bin/createdb" -h "$dir" -p "$port" -U "$PG_USER" "$db"
    fi
  done
}

stop() {
  local dir="$1" bin
  [[ -f "$dir/db/PG_VERSION" ]] || return 0
  bin="$(pg_bin)"
  if as_owner "$bin/pg_ctl" -D "$dir/db" status > /dev/null 2>&1; then
    as_owner "$bin/pg_ctl" -D "$dir/db" -m fast -w -t 60 stop > /dev/null
  fi
}

status() {
  local dir="$1" bin
  [[ -f "$dir/db/PG_VERSION" ]] || return 1
  bin="$(pg_bin)"
  as_owner "$bin/pg_ctl" -D "$dir/db" status > /dev/null 2>&1
}

url() {  # postgresql+psycopg2://USER@/DB?host=DIR&port=PORT, DIR percent-encoded where it must be
  local dir; dir="$(cd "$1" && pwd)"
  local enc="" c i
  for ((i = 0; i < ${#dir}; i++)); do
    c="${dir:i:1}"
    case "$c" in
      [A-Za-z0-9/._~-]) enc+="$c" ;;
      *) enc+="$(printf '%s' "$c" | od -An -tx1 -v | tr -d ' \n' | sed 's/../%&/g')" ;;
    esac
  done
  echo "postgresql+psycopg2://$PG_USER@/$3?host=$enc&port=$2"
}

case "${1:-}" in
  bin) pg_bin ;;
  start) [[ $# -ge 3 ]] || { echo "usage: $0 start DIR PORT [DB...]" >&2; exit 2; }; shift; start "$@" ;;
  stop) [[ $# -eq 2 ]] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  status) [[ $# -eq 2 ]] || { echo "usage: $0 status DIR" >&2; exit 2; }; status "$2" ;;
  url) [[ $# -eq 4 ]] || { echo "usage: $0 url DIR PORT DB" >&2; exit 2; }; url "$2" "$3" "$4" ;;
  *) echo "usage: $0 bin|start|stop|status|url ..." >&2; exit 2 ;;
esac
