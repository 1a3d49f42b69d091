#!/usr/bin/env bash
# Refresh the lock files from setup.cfg and requirements/build.in: the newest versions that satisfy
# them, with hashes. Run on purpose, commit the result on its own, then run `make test`.
#   scripts/lock.sh                 newest allowed versions
#   scripts/lock.sh --upgrade-package torch   only move one package
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
tool=${UV_TOOL_DIR:-.lock-tool}
test -x "$tool/bin/uv" || { python3 -m venv "$tool" && "$tool/bin/pip" install --quiet "uv==$UV_VERSION"; }
compile() {
  "$tool/bin/uv" pip compile --quiet --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
    --generate-hashes --no-header --annotation-style line "$@"
}
# The test lock is solved first; the app lock is held to the same versions, so the app the tests
# check is the app the demo and the Docker image install.
compile "$@" setup.cfg --extra test -o requirements/test.lock
compile "$@" setup.cfg -c requirements/test.lock -o requirements/app.lock
compile "$@" requirements/build.in -o requirements/build.lock
python3 scripts/runtime_lock.py
echo "locked: $(grep -c '==' requirements/app.lock) app, $(grep -c '==' requirements/test.lock) test, $(grep -c '==' requirements/build.lock) build packages"
