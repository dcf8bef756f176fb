#!/usr/bin/env bash
# Prove README's first command on a clean clone: it installs, loads the demo
# and serves; after logging in, /inbox/ answers 200 and lists demo data,
# and a path escaping the static folder is a 404.
# Usage: bash tests/readme_quickstart.sh   (run from anywhere in the repo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The first ```sh block after "## Run it" in README.md.
cmd=$(awk '/^## Run it/{f=1} f&&/^```sh/{getline; print; exit}' README.md)
[[ -n $cmd ]] || { echo "readme_quickstart: no command found in README.md" >&2; exit 1; }

clone=$(mktemp -d /tmp/tollgate-quickstart.XXXXXX)
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill -- -"$server_pid" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$clone"
}
trap cleanup EXIT
git clone -q . "$clone"
cd "$clone"
echo "readme_quickstart: running in a clean clone: $cmd"
env -u DATABASE_URL -u REDIS_URL setsid bash -c "$cmd" >"$clone/serve.log" 2>&1 &
server_pid=$!

for _ in $(seq 600); do
    curl -fs -o /dev/null http://127.0.0.1:8000/accounts/login/ && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$clone/serve.log" >&2; echo "readme_quickstart: server exited" >&2; exit 1; }
    sleep 0.5
done

jar=$clone/cookies
curl -fs -c "$jar" -o "$clone/login.html" http://127.0.0.1:8000/accounts/login/
token=$(grep -o 'name="csrfmiddlewaretoken" value="[^"]*"' "$clone/login.html" | head -1 | sed 's/.*value="//; s/"$//')
curl -fs -b "$jar" -c "$jar" -o /dev/null -e http://127.0.0.1:8000/accounts/login/ \
    --data-urlencode "csrfmiddlewaretoken=$token" --data-urlencode "username=approver" \
    --data-urlencode "password=approver-demo" http://127.0.0.1:8000/accounts/login/
status=$(curl -s -b "$jar" -o "$clone/inbox.html" -w '%{http_code}' http://127.0.0.1:8000/inbox/)
grep -q "approver" "$clone/inbox.html" || { echo "readme_quickstart: /inbox/ is not the approver's inbox" >&2; exit 1; }
[[ $status == 200 ]] || { echo "readme_quickstart: /inbox/ answered $status" >&2; exit 1; }
escape=$(curl -s --path-as-is -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/static/../config/settings.py)
[[ $escape == 404 ]] || { echo "readme_quickstart: /static/../config/settings.py answered $escape" >&2; exit 1; }
echo "readme_quickstart: OK (/inbox/ answered 200 after login as approver)"
