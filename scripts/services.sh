#!/usr/bin/env bash
# Real Elasticsearch and Redis for tests and local production-path runs, on loopback and
# non-default ports, installed on first use and stopped by PID.
#   scripts/services.sh up     install (first time) and start both; prints `export` lines
#   scripts/services.sh down   stop both
#   scripts/services.sh env    print the `export` lines only
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CHARTCITE_SERVICES_CACHE:-/var/cache/chartcite-services}   # outside the clone: kept between runs
STATE=${CHARTCITE_SERVICES_STATE:-$ROOT/.services}
ES_VERSION=8.19.5                     # the Python client is pinned to the same major (setup.cfg)
ES_PORT=${CHARTCITE_ES_PORT:-9250}
REDIS_PORT=${CHARTCITE_REDIS_PORT:-6390}
ES_HOME=$CACHE/elasticsearch-$ES_VERSION

say() { echo "services: $*" >&2; }

install_es() {
  [ -x "$ES_HOME/bin/elasticsearch" ] && return
  command -v java >/dev/null || { say "installing a JDK (Debian's openjdk-17-jre-headless)"; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
  command -v mvn >/dev/null || { say "installing maven"; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null; }
  mkdir -p "$CACHE"
  say "fetching Elasticsearch $ES_VERSION (integ-test-zip) from Maven Central"
  mvn -q dependency:copy -Dartifact=org.elasticsearch.distribution.integ-test-zip:elasticsearch:$ES_VERSION:zip \
      -DoutputDirectory="$CACHE" >&2
  (cd "$CACHE" && unzip -q -o "elasticsearch-$ES_VERSION.zip")
}

install_redis() {
  command -v redis-server >/dev/null && return
  say "installing Debian's redis-server"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  # The package starts a system instance on 6379; ours is separate, so stop that one.
  service redis-server stop >/dev/null 2>&1 || true
}

# Elasticsearch refuses to run as root; as root we run it as a system user of its own.
ES_USER=chartcite-es
as_es_user() {
  if [ "$(id -u)" = 0 ]; then
    id -u "$ES_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$ES_USER"
    chown -R "$ES_USER" "$STATE/es-config" "$STATE/es-data" "$STATE/es-logs"
    runuser -u "$ES_USER" -- "$@"
  else
    "$@"
  fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_es() {
  alive "$STATE/es.pid" && return
  rm -rf "$STATE/es-config" && mkdir -p "$STATE/es-data" "$STATE/es-logs"
  cp -r "$ES_HOME/config" "$STATE/es-config"
  cat > "$STATE/es-config/elasticsearch.yml" <<YML
cluster.name: chartcite-test
node.name: chartcite-test-node
path.data: $STATE/es-data
path.logs: $STATE/es-logs
network.host: 127.0.0.1
http.port: $ES_PORT
transport.port: $((ES_PORT + 100))
discovery.type: single-node
action.destructive_requires_name: false
xpack.security.enabled: false
# Free-space watermarks instead of the default percentages: this throwaway node shares a large
# disk with other work, and at 90% used (still gigabytes free) the default refuses to place a new
# index's shard, so every search on it fails with "all shards failed".
cluster.routing.allocation.disk.watermark.low: 2gb
cluster.routing.allocation.disk.watermark.high: 1gb
cluster.routing.allocation.disk.watermark.flood_stage: 512mb
YML
  say "starting Elasticsearch on 127.0.0.1:$ES_PORT"
  local java_home=${ES_JAVA_HOME:-${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")}}
  as_es_user env ES_PATH_CONF="$STATE/es-config" ES_JAVA_OPTS="-Xms512m -Xmx512m" ES_JAVA_HOME="$java_home" \
    "$ES_HOME/bin/elasticsearch" -d -p "$STATE/es-data/es.pid" >"$STATE/es-console.log" 2>&1 || {
      say "Elasticsearch failed to start:"; tail -5 "$STATE/es-console.log" >&2; exit 1; }
  cp "$STATE/es-data/es.pid" "$STATE/es.pid"
  for _ in $(seq 1 120); do
    curl -fsS "http://127.0.0.1:$ES_PORT/_cluster/health?wait_for_status=yellow&timeout=1s" >/dev/null 2>&1 && return
    sleep 1
  done
  say "Elasticsearch did not become healthy; see $STATE/es-logs"; exit 1
}

start_redis() {
  alive "$STATE/redis.pid" && return
  say "starting Redis on 127.0.0.1:$REDIS_PORT"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --pidfile "$STATE/redis.pid" --logfile "$STATE/redis.log" --dir "$STATE"
  for _ in $(seq 1 30); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return; sleep 0.5; done
  say "Redis did not start; see $STATE/redis.log"; exit 1
}

stop() {
  local pidfile=$1
  if alive "$pidfile"; then
    kill "$(cat "$pidfile")"
    for _ in $(seq 1 60); do alive "$pidfile" || break; sleep 0.5; done
  fi
  rm -f "$pidfile"
}

print_env() {
  echo "export CHARTCITE_BACKEND=elasticsearch"
  echo "export CHARTCITE_ES_URL=http://127.0.0.1:$ES_PORT"
  echo "export CHARTCITE_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
  # Where the Elasticsearch distribution is, for tests that start a cluster of their own.
  echo "export CHARTCITE_TEST_ES_HOME=$ES_HOME"
}

case "${1:-}" in
  up) mkdir -p "$STATE"; install_es; install_redis; start_es; start_redis; print_env ;;
  down) stop "$STATE/es.pid"; stop "$STATE/redis.pid"; say "stopped" ;;
  env) print_env ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
