#!/usr/bin/env bash
# Run Tollgate's whole test suite, then the README quickstart:
#   1. "unit": tests/unit alone, with no database, broker or demo app
#      (DATABASE_URL names a closed port: a test that touched it would fail);
#   2. "production shape": a private PostgreSQL + Redis started just for
#      this run (DATABASE_URL / REDIS_URL set), every other test incl. the
#      browser ones and the short chaos run;
#   3. "embedded default", side by side with 2 (each pass is one process;
#      the machine has two cores): nothing set (SQLite + Dramatiq
#      StubBroker), everything except the unit and browser tests, in two
#      parts: the core suite under tests/settings_nodemo.py (no demo app),
#      then the tests marked "demo" (tests/conftest.py) with the demo in;
#      each pass's output is shown once it ends;
#   4. README's first command on a clean clone answers /inbox/ after login.
# Extra arguments are passed to every pytest run, e.g.
#   bash tests/run.sh -k refund -x
# (a path reaches the unit pass too, and a -m replaces the passes' own).
# Meant for a fresh Debian 12 machine, run as root: missing system packages
# are installed with apt-get.  Nothing is left running afterwards.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'tests/run.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

if [[ $EUID -eq 0 ]]; then SUDO=(); elif command -v sudo >/dev/null; then SUDO=(sudo); else SUDO=(); fi

# --- System packages -------------------------------------------------------

source tests/services.sh

missing=()
[[ -n $(find_pg_bin) ]] || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v curl >/dev/null || missing+=(curl)
command -v git >/dev/null || missing+=(git)
command -v pkill >/dev/null || missing+=(procps)
# GNU gettext (xgettext, msgfmt, msgcmp): tests/web/test_i18n.py and tests/unit/test_compiled_catalogue.py check the translation catalogue.
command -v msgcmp >/dev/null || missing+=(gettext)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [[ ! -x .venv/bin/python ]]; then
    command -v python3 >/dev/null || missing+=(python3)
    python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
fi

if ((${#missing[@]})); then
    log "installing missing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    no_main_cluster=/etc/postgresql-common/createcluster.d/tollgate-tests-no-main-cluster.conf
    if [[ " ${missing[*]} " == *" postgresql "* ]]; then
        # Debian's postgresql package creates (and may start) a "main"
        # cluster on port 5432; the tests don't want it.
        "${SUDO[@]}" mkdir -p "$(dirname "$no_main_cluster")"
        echo 'create_main_cluster = false' | "${SUDO[@]}" tee "$no_main_cluster" >/dev/null
    fi
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" </dev/null
    "${SUDO[@]}" rm -f "$no_main_cluster"
fi

PG_BIN=$(find_pg_bin)
[[ -n $PG_BIN ]] || die "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found"
[[ -x /usr/bin/chromium ]] || die "/usr/bin/chromium missing"

# --- Python environment ----------------------------------------------------

if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv"
    rm -rf .venv
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q -e '.[test]'

# --- Private PostgreSQL and Redis ------------------------------------------

PYTEST_PIDS=()
PASS_LOGS=$(mktemp -d)
export PASS_LOGS
cleanup() {
    local rc=$? pid log_file
    set +e
    trap - INT TERM HUP
    if ((${#PYTEST_PIDS[@]})); then
        # Interrupted mid-run: let pytest tear down (browser, worker), then
        # make sure it is gone before its database disappears.
        # A pass may be a shell running pytest: its children are signalled too.
        [[ -n $FORWARD_INT ]] && for pid in "${PYTEST_PIDS[@]}"; do pkill -INT -P "$pid"; kill -INT "$pid"; done 2>/dev/null
        for _ in $(seq 100); do kill -0 "${PYTEST_PIDS[@]}" 2>/dev/null || break; sleep 0.1; done
        for pid in "${PYTEST_PIDS[@]}"; do pkill -KILL -P "$pid"; kill -KILL "$pid"; done 2>/dev/null
        for pid in "${PYTEST_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    fi
    for log_file in "$PASS_LOGS"/*.log; do  # what a pass cut short had logged so far
        [[ -f $log_file ]] && { echo; echo "---- $(basename "$log_file" .log) (cut short) ----"; tail -n 300 "$log_file"; }
    done
    stop_private_services
    rm -rf "$PASS_LOGS"
    exit "$rc"
}
FORWARD_INT=
trap cleanup EXIT
# Ctrl-C already reached pytest (same process group); TERM/HUP may have
# been sent to this script alone (e.g. `timeout`), so pass it on as INT.
trap 'exit 130' INT
trap 'FORWARD_INT=1; exit 143' TERM HUP

t0=$(now)
PG_EXTRA_CONF="# tests/run.sh: fast, nothing here needs to survive a crash
fsync = off
synchronous_commit = off
full_page_writes = off"
start_private_services
log "PostgreSQL on 127.0.0.1:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT ready in $(elapsed "$t0")s"

# --- Tests -----------------------------------------------------------------

export TOLLGATE_CHROMIUM=/usr/bin/chromium
# DEBUG stays off in the tests; tests/settings.py (the pytest settings
# module) makes a random SECRET_KEY per run, which the servers and workers
# the tests start inherit. The quickstart below makes its own key.

# pytest runs in the background so that signals reach the traps above at
# once instead of after pytest finishes.  (Background commands start with
# SIGINT ignored; the subshell undoes that so Ctrl-C still stops pytest.)
# start_pytest NAME live|logged CMD...: start a pass; a logged one's output goes to a file of its own,
# shown by wait_pytest (or by cleanup, if the run is cut short).
start_pytest() {
    local name=$1 mode=$2; shift 2
    if [[ $mode == live ]]; then
        (trap - INT QUIT; exec "$@") </dev/null &
    else
        (trap - INT QUIT; exec "$@") </dev/null >"$PASS_LOGS/$name.log" 2>&1 &
    fi
    PYTEST_PIDS+=($!)
    eval "${name}_pid=$!"
}
# wait_pytest NAME: wait for the pass, show its output if logged; its exit code.
wait_pytest() {
    local name=$1 pid rc=0
    pid=${name}_pid
    wait "${!pid}" || rc=$?
    local left=() other
    for other in "${PYTEST_PIDS[@]}"; do [[ $other == "${!pid}" ]] || left+=("$other"); done
    PYTEST_PIDS=("${left[@]}")
    if [[ -f $PASS_LOGS/$name.log ]]; then
        cat "$PASS_LOGS/$name.log"
        rm -f "$PASS_LOGS/$name.log"
    fi
    return "$rc"
}
run_pytest() {
    local rc=0
    (trap - INT QUIT; exec "$@") </dev/null &
    PYTEST_PIDS=($!)
    wait "$!" || rc=$?
    PYTEST_PIDS=()
    return "$rc"
}

result() { case $1 in 0) echo OK ;; 5) echo "FAILED (no tests collected)" ;; *) echo "FAILED (exit $1)" ;; esac; }

# With extra arguments (-k, -m) a pass may select no test (pytest's exit code 5): fine then, not otherwise.
no_tests_ok() { [[ $1 -eq 5 && $EXTRA_ARGS -gt 0 ]] && echo 0 || echo "$1"; }
EXTRA_ARGS=$#

echo
echo "================ tests/run.sh: unit (no database, no broker, no demo app) ================"
unit_rc=0
run_pytest env -u REDIS_URL DATABASE_URL="postgres://nobody@127.0.0.1:9/unreachable" \
    .venv/bin/python -m pytest tests/unit --ds tests.settings_nodemo "$@" || unit_rc=$?
unit_rc=$(no_tests_ok $unit_rc)

if [[ -f .env ]] && grep -Eq '^[[:space:]]*(export[[:space:]]+)?(DATABASE_URL|REDIS_URL)=' .env; then
    log "warning: .env sets DATABASE_URL/REDIS_URL; settings read it, so the embedded runs below are not embedded"
fi
t_both=$(now)
echo
echo "================ tests/run.sh: production shape (PostgreSQL + Redis), all but unit ================"
PG_ENV=(DATABASE_URL="postgres://$PG_ROLE@127.0.0.1:$PG_PORT/tollgate" REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0")
start_pytest pg live env "${PG_ENV[@]}" \
    .venv/bin/python -m pytest -o cache_dir="$PASS_LOGS/cache-pg" --ignore=tests/unit --durations=25 "$@"
# The two embedded passes one after the other (each has its own SQLite test database, named by its pid).
start_pytest sqlite logged bash -c '
    trap "exit 130" INT TERM  # cut short: no demo pass after an interrupted core pass
    core_rc=0 demo_rc=0
    echo "================ tests/run.sh: embedded default (SQLite + stub broker), core suite without the demo app ================"
    env -u DATABASE_URL -u REDIS_URL .venv/bin/python -m pytest -o cache_dir="$PASS_LOGS/cache-core" \
        --ignore=tests/unit --ignore=tests/demo --ds tests.settings_nodemo -m "not browser and not demo" "$@" \
        || core_rc=$?
    echo
    echo "================ tests/run.sh: embedded default (SQLite + stub broker), tests of and through the demo ================"
    env -u DATABASE_URL -u REDIS_URL .venv/bin/python -m pytest -o cache_dir="$PASS_LOGS/cache-demo" \
        --ignore=tests/unit -m "demo and not browser" "$@" || demo_rc=$?
    echo "$core_rc $demo_rc" > "$PASS_LOGS/sqlite.rc"' sqlite "$@"
log "production-shape and embedded passes started side by side (the embedded one's output follows when both end)"

pg_rc=0
wait_pytest pg || pg_rc=$?
pg_rc=$(no_tests_ok "$pg_rc")
echo
sqlite_rc=0
wait_pytest sqlite || sqlite_rc=$?
core_rc=$sqlite_rc demo_rc=$sqlite_rc
[[ -f $PASS_LOGS/sqlite.rc ]] && read -r core_rc demo_rc < "$PASS_LOGS/sqlite.rc"
core_rc=$(no_tests_ok "$core_rc")
demo_rc=$(no_tests_ok "$demo_rc")
PYTEST_PIDS=()
log "production-shape and embedded passes done in $(elapsed "$t_both")s"

# Side by side, two passes share two cores: a test that failed (pytest's exit code 1) is run once
# more, alone, and the summary says so; the first run's failures stay in the output above.
pg_note="" core_note="" demo_note=""
rerun_failed() {  # NAME CACHE ENV... -- PYTEST ARGS...: exit code of the rerun of the pass's failed tests
    local name=$1 cache=$2; shift 2
    echo
    echo "================ tests/run.sh: $name: the failed tests once more, alone ================"
    run_pytest "$@" -o cache_dir="$PASS_LOGS/$cache" --last-failed --last-failed-no-failures none
}
if [[ $pg_rc -eq 1 ]]; then
    rerun_failed "production shape" cache-pg env "${PG_ENV[@]}" .venv/bin/python -m pytest --ignore=tests/unit "$@" \
        && { pg_rc=0; pg_note=" (failed side by side, passed alone)"; }
fi
if [[ $core_rc -eq 1 ]]; then
    rerun_failed "sqlite core" cache-core env -u DATABASE_URL -u REDIS_URL .venv/bin/python -m pytest --ignore=tests/unit \
        --ignore=tests/demo --ds tests.settings_nodemo -m "not browser and not demo" "$@" \
        && { core_rc=0; core_note=" (failed side by side, passed alone)"; }
fi
if [[ $demo_rc -eq 1 ]]; then
    rerun_failed "sqlite demo" cache-demo env -u DATABASE_URL -u REDIS_URL .venv/bin/python -m pytest --ignore=tests/unit \
        -m "demo and not browser" "$@" && { demo_rc=0; demo_note=" (failed side by side, passed alone)"; }
fi

echo
echo "================ tests/run.sh: README quickstart on a clean clone ================"
quickstart_rc=0
bash tests/readme_quickstart.sh || quickstart_rc=$?

echo
echo "tests/run.sh: unit: $(result $unit_rc), postgres+redis: $(result $pg_rc)$pg_note," \
     "sqlite core (no demo): $(result $core_rc)$core_note, sqlite demo: $(result $demo_rc)$demo_note," \
     "quickstart: $(result $quickstart_rc)"
[[ $unit_rc -eq 0 && $pg_rc -eq 0 && $core_rc -eq 0 && $demo_rc -eq 0 && $quickstart_rc -eq 0 ]]
