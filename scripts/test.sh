#!/usr/bin/env bash
# Runs every test, as README.md says: go test -race over the whole module,
# with the PostgreSQL tests against the local server.
#
# VIGIL_TEST_POSTGRES_URL defaults to the local trust-auth server at
# 127.0.0.1:5432 (database "test"); if PostgreSQL is installed but not
# running, it is started. Extra arguments go to `go test` (e.g. -run X, -v).
set -euo pipefail
cd "$(dirname "$0")/.."

: "${VIGIL_TEST_POSTGRES_URL:=postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export VIGIL_TEST_POSTGRES_URL

if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "== starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  fi
fi

go test -race -count=1 -timeout 15m "$@" ./...
