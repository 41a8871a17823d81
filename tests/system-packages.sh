#!/usr/bin/env bash
# What `make test` needs from the machine, checked before any test runs.
#
# The suite drives real components: a Docker-API engine for the sandbox (podman with runc,
# and busybox-static for its image), headless Chromium (Flower, the browser tools),
# bubblewrap (the confinement of host commands), espeak-ng and ffmpeg with its ffprobe
# (the tts tool), and Node.js with npm (the reference MCP server, server-everything, pinned
# in tests/mcp_servers/everything/package-lock.json); and it talks to Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432.
# As root on Debian or Ubuntu, missing packages are installed and stopped services started;
# otherwise this stops at once, naming what is missing. Nothing is ever skipped instead.
set -euo pipefail

declare -A PROVIDES=(
  [podman]=podman [runc]=runc [busybox]=busybox-static [chromium]=chromium [bwrap]=bubblewrap
  [espeak-ng]=espeak-ng [ffmpeg]=ffmpeg [node]=nodejs [npm]=npm
)
missing=()
for cmd in "${!PROVIDES[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${PROVIDES[$cmd]}")
done

if ((${#missing[@]})); then
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "installing the test suite's system packages: ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "make test needs these system packages: ${missing[*]}" >&2
    echo "  install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}), or run as root" >&2
    exit 1
  fi
fi

# podman's default crun fails on setrlimit in some containers (CI's): runc works everywhere
if [[ $EUID -eq 0 ]] && ! grep -qs 'runtime = "runc"' /etc/containers/containers.conf; then
  mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' \
    > /etc/containers/containers.conf
fi

# Redis and PostgreSQL: start the machine's own if they are installed but stopped
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if [[ $EUID -eq 0 ]] && command -v redis-server >/dev/null 2>&1; then
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /tmp --logfile /tmp/redis-tests.log
  else
    echo "make test needs Redis on 127.0.0.1:6379 (Debian: apt-get install redis-server)" >&2
    exit 1
  fi
fi
if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  if [[ $EUID -eq 0 ]] && command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    for _ in $(seq 30); do pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && break; sleep 1; done
  fi
  if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    echo "make test needs PostgreSQL on 127.0.0.1:5432 with trust auth and a database 'test'" >&2
    exit 1
  fi
fi
for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.2; done

# the reference MCP server the bridge's acceptance tests run, as its lock file pins it
everything="$(dirname "$0")/mcp_servers/everything"
if [[ ! -x "$everything/node_modules/.bin/mcp-server-everything" ]]; then
  npm ci --prefix "$everything" --no-audit --no-fund --loglevel=error >/dev/null
fi
