#!/usr/bin/env bash
# Run a benchmark against a private, throwaway PostgreSQL + Redis on
# loopback (started and removed here, like tests/run.sh does), after
# installing the bench dependencies (`pip install -e '.[bench]'`).
# The first argument may name the benchmark (throughput, live, scale, latency, cpu,
# chaos; default throughput); the rest go to bench/<name>.py, e.g.
#   bash bench/run.sh --runs 100 --workers 2 --threads 4 --langgraph-processes 1 2
#   bash bench/run.sh live --clients 100
#   bash bench/run.sh latency --runs 200 --latency 1.0 --langgraph-processes 1 2
#   bash bench/run.sh chaos --runs 500 --kills 20 --restart-redis --restart-postgres
# The benchmark is told where the servers live (BENCH_PG_BIN, BENCH_PG_DATA,
# BENCH_PG_LOG, BENCH_PG_OS_USER, BENCH_REDIS_DIR), so that the chaos run can
# stop and start them again.
# Needs the PostgreSQL server binaries and redis-server (tests/run.sh
# installs them).  PostgreSQL keeps its defaults for durability (fsync and
# synchronous commit on), and loads pg_stat_statements so queries can be
# counted.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'bench/run.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

BENCH=throughput
case ${1:-} in
    throughput|live|scale|latency|chaos|cpu) BENCH=$1; shift ;;
esac

source tests/services.sh
[[ -n $(find_pg_bin) ]] || die "no PostgreSQL server binaries found (bash tests/run.sh installs them)"
command -v redis-server >/dev/null || die "redis-server not found (bash tests/run.sh installs it)"

if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv"
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q -e '.[bench]'

BENCH_PID=
cleanup() {
    local rc=$?
    set +e
    trap - INT TERM HUP
    if [[ -n $BENCH_PID ]]; then
        kill -TERM "$BENCH_PID" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$BENCH_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$BENCH_PID" 2>/dev/null
        wait "$BENCH_PID" 2>/dev/null
    fi
    stop_private_services
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

SERVICES_PREFIX=tollgate-bench
PG_EXTRA_CONF="shared_preload_libraries = 'pg_stat_statements'
max_connections = 200"
start_private_services
log "PostgreSQL on 127.0.0.1:$PG_PORT (pid $PG_PID) and Redis on 127.0.0.1:$REDIS_PORT ready"

# The benchmark runs in the background so that a signal reaches the traps.
rc=0
env DATABASE_URL="postgres://$PG_ROLE@127.0.0.1:$PG_PORT/tollgate" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" \
    BENCH_POSTGRES_PID="$PG_PID" \
    BENCH_PG_BIN="$PG_BIN" BENCH_PG_DATA="$SERVICES_TMP/pgdata" BENCH_PG_LOG="$SERVICES_TMP/postgres.log" \
    BENCH_PG_OS_USER="$PG_OS_USER" BENCH_REDIS_DIR="$SERVICES_TMP/redis" \
    .venv/bin/python "bench/$BENCH.py" "$@" </dev/null &
BENCH_PID=$!
wait "$BENCH_PID" || rc=$?
BENCH_PID=
exit "$rc"
