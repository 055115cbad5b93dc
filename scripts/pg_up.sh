#!/usr/bin/env bash
# PostgreSQL on 127.0.0.1:5432 for the storage and API tests, with a test role of its own.
#
#   scripts/pg_up.sh          install (apt-get, root, only if missing), start the server, create
#                             the role (login, CREATEDB, password) unless it exists
#   scripts/pg_up.sh env      print the `export DSE_TEST_PG=...` line for a shell
#
# The tests log in as that role with its password over TCP (tests/conftest.py PG_SERVER), so
# they run on a stock Debian server (scram-sha-256 on 127.0.0.1) as on one that trusts every
# local login; they never log in as `postgres`. Role and password: DSE_TEST_PG_ROLE and
# DSE_TEST_PG_PASSWORD (default dse_test / dse_test: a throwaway role for test databases); the
# port: DSE_TEST_PG_PORT (default 5432).
# Idempotent: a second call finds the server answering and the role there.
set -euo pipefail
ROLE=${DSE_TEST_PG_ROLE:-dse_test}
PASSWORD=${DSE_TEST_PG_PASSWORD:-dse_test}
HOST=127.0.0.1
PORT=${DSE_TEST_PG_PORT:-5432}

case "$ROLE$PASSWORD" in
  *[!A-Za-z0-9_]*) echo "pg_up.sh: role and password must be letters, digits or _" >&2; exit 2 ;;
esac
case "$PORT" in
  ''|*[!0-9]*) echo "pg_up.sh: DSE_TEST_PG_PORT must be a port number (got '$PORT')" >&2; exit 2 ;;
esac

case "${1:-up}" in
  env) echo "export DSE_TEST_PG=postgresql+psycopg://$ROLE:$PASSWORD@$HOST:$PORT"; exit 0 ;;
  up) ;;
  *) echo "usage: $0 [up|env]" >&2; exit 2 ;;
esac

if ! command -v pg_ctlcluster >/dev/null || ! command -v psql >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "pg_up.sh: PostgreSQL is not installed (installing it needs root and apt-get)" >&2
    exit 1
  fi
  apt-get update -qq
  # the package's set-up creates the cluster `main`; it is started below (no systemd here)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

if ! pg_isready -q -h "$HOST" -p "$PORT"; then
  if [ "$(id -u)" != 0 ]; then
    echo "pg_up.sh: nothing answers on $HOST:$PORT and starting the server needs root" >&2
    exit 1
  fi
  version=$(ls /etc/postgresql | sort -V | tail -1)
  [ -n "$version" ] || { echo "pg_up.sh: no cluster under /etc/postgresql" >&2; exit 1; }
  [ -d "/etc/postgresql/$version/main" ] || pg_createcluster "$version" main >/dev/null
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 60); do
    pg_isready -q -h "$HOST" -p "$PORT" && break
    sleep 0.5
  done
  pg_isready -q -h "$HOST" -p "$PORT" || { echo "pg_up.sh: the server did not start" >&2; exit 1; }
fi

# The role, created through the local socket as the server's administrator (peer login of
# the `postgres` system user, Debian's default); the tests then use the role alone.
sql="DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
  ELSE
    ALTER ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
  END IF;
END \$\$;"
if [ "$(id -u)" = 0 ]; then
  (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres -c "$sql")
elif [ "$(id -un)" = postgres ]; then
  psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres -c "$sql"
elif ! PGPASSWORD=$PASSWORD psql -X -q -h "$HOST" -p "$PORT" -U "$ROLE" -d postgres -c "SELECT 1" >/dev/null 2>&1; then
  echo "pg_up.sh: role $ROLE cannot log in and creating it needs root" >&2
  exit 1
fi
PGPASSWORD=$PASSWORD psql -X -q -h "$HOST" -p "$PORT" -U "$ROLE" -d postgres -c "SELECT 1" >/dev/null
