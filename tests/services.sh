# Private, throwaway PostgreSQL + Redis on loopback, for tests/run.sh and
# bench/run.sh.  Source this file (bash); it defines functions only:
#
#   find_pg_bin             highest installed PostgreSQL server bin dir, or nothing
#   start_private_services  initdb + start PostgreSQL, start Redis; sets
#                           SERVICES_TMP, PG_BIN, PG_PORT, PG_ROLE, PG_OS_USER,
#                           PG_PID, REDIS_PORT, REDIS_PID
#   stop_private_services   stop both and remove SERVICES_TMP (safe to call twice)
#
# Before start_private_services, .venv/bin/python must exist (it picks the
# ports).  PG_EXTRA_CONF (optional) is appended to postgresql.conf;
# SERVICES_PREFIX (default tollgate-tests) names the temporary folder.  The
# caller defines log() and die() and installs the packages.

find_pg_bin() {
    local d
    # Highest installed major version first, then whatever is on PATH.
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [[ -x $d/initdb && -x $d/pg_ctl && -x $d/postgres ]] && { echo "$d"; return; }
    done
    if command -v initdb >/dev/null; then
        d=$(dirname "$(readlink -f "$(command -v initdb)")")
        [[ -x $d/pg_ctl && -x $d/postgres ]] && { echo "$d"; return; }
    fi
    return 0
}

SERVICES_TMP=
REDIS_PID=
PG_STARTED=

stop_private_services() {
    if [[ -n $PG_STARTED ]]; then
        as_pg "$PG_BIN/pg_ctl" -D "$SERVICES_TMP/pgdata" -m immediate -w stop >/dev/null 2>&1
        PG_STARTED=
    fi
    if [[ -n $REDIS_PID ]]; then
        kill "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        REDIS_PID=
        # A Redis started again on the same port by someone else (bench/chaos.py's restart) goes too.
        redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    fi
    [[ -n $SERVICES_TMP ]] && rm -rf "$SERVICES_TMP"
    SERVICES_TMP=
    return 0
}

start_private_services() {
    PG_BIN=$(find_pg_bin)
    [[ -n $PG_BIN ]] || die "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found"

    # PostgreSQL refuses to run as root: use the postgres system user
    # (created by the postgresql package; created here if only the binaries
    # exist).
    if [[ $EUID -eq 0 ]]; then
        PG_OS_USER=postgres
        if ! id -u "$PG_OS_USER" >/dev/null 2>&1; then
            useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_OS_USER"
        fi
        as_pg() { (cd / && runuser -u "$PG_OS_USER" -- "$@"); }
    else
        PG_OS_USER=$(id -un)
        as_pg() { (cd / && "$@"); }
    fi

    SERVICES_TMP=$(mktemp -d "/tmp/${SERVICES_PREFIX:-tollgate-tests}.XXXXXX")
    local tmp=$SERVICES_TMP

    # Two distinct free loopback ports (both held open while picking).
    read -r PG_PORT REDIS_PORT < <(.venv/bin/python -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')

    PG_ROLE=tollgate
    mkdir -p "$tmp/pgdata" "$tmp/pgsock" "$tmp/redis"
    chmod 700 "$tmp/pgdata"
    if [[ $EUID -eq 0 ]]; then
        chown -R "$PG_OS_USER" "$tmp"
        chmod 755 "$tmp"
    fi

    # Bootstrap superuser "tollgate", trust auth (loopback only, see below).
    as_pg "$PG_BIN/initdb" -D "$tmp/pgdata" -U "$PG_ROLE" --auth=trust \
        --encoding=UTF8 --no-locale --no-sync >"$tmp/initdb.log" 2>&1 \
        || { cat "$tmp/initdb.log" >&2; die "initdb failed"; }
    cat >>"$tmp/pgdata/postgresql.conf" <<EOF

# private, throwaway
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$tmp/pgsock'
max_parallel_workers_per_gather = 0
${PG_EXTRA_CONF:-}
EOF
    if ! as_pg "$PG_BIN/pg_ctl" -D "$tmp/pgdata" -l "$tmp/postgres.log" -w -t 60 start >/dev/null; then
        cat "$tmp/postgres.log" >&2 || true
        die "PostgreSQL did not start"
    fi
    PG_STARTED=1
    PG_PID=$(head -n 1 "$tmp/pgdata/postmaster.pid")
    for _ in $(seq 100); do
        "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
        sleep 0.1
    done
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || die "PostgreSQL not accepting connections"
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_ROLE" -O "$PG_ROLE" tollgate

    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --daemonize no --dir "$tmp/redis" --logfile "$tmp/redis.log" </dev/null &
    REDIS_PID=$!
    for _ in $(seq 100); do
        [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]] && break
        kill -0 "$REDIS_PID" 2>/dev/null || { cat "$tmp/redis.log" >&2; die "redis-server exited"; }
        sleep 0.1
    done
    [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]] || die "redis-server not answering"
}
