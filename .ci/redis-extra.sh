#!/usr/bin/env bash
# Makes sure the binaries of ratekit's throwaway Redis servers are installed:
# redis-server (which also runs Sentinel, with --sentinel) and redis-cli
# (which creates a Redis Cluster, --cluster create). internal/redistest (in the root module) starts
# them on free loopback ports for the failover and cluster tests; the shared
# server on 6379 may come from elsewhere, so services.sh alone does not
# guarantee them. Idempotent; needs root to install.
set -euo pipefail

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
	echo "redis-extra.sh: installing redis-server and redis-tools"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
fi
echo "redis-extra.sh: $(redis-server --version | cut -d' ' -f1-3), $(redis-cli --version)"
