#!/usr/bin/env bash
# Makes sure the servers ratekit's integration tests need are running on this
# machine: PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth, database
# "test"), Redis on 127.0.0.1:6379 and PgBouncer (transaction mode) on
# 127.0.0.1:6432. Installs them from Debian's packages when they are missing,
# starts them when they are stopped, and does nothing when they already run.
# Needs root (apt-get, and starting the servers as their own users).
set -euo pipefail
cd "$(dirname "$0")/.."

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

apt_updated=""
apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# PostgreSQL
if ! listening 5432; then
	if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
		echo "services.sh: installing PostgreSQL"
		apt_install postgresql postgresql-contrib
		hba=$(ls /etc/postgresql/*/main/pg_hba.conf | head -n 1)
		# Tests connect as postgres over TCP without a password.
		sed -i -E 's/^(host|local)(\s+\S+\s+\S+.*\s)(scram-sha-256|md5|peer)\s*$/\1\2trust/' "$hba"
	fi
	version=$(ls /etc/postgresql | sort -n | tail -n 1)
	echo "services.sh: starting PostgreSQL $version"
	pg_ctlcluster --skip-systemctl-redirect "$version" main start || pg_ctlcluster "$version" main start
	for _ in $(seq 1 60); do listening 5432 && break; sleep 0.5; done
fi
if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_database where datname = 'test'" | grep -q 1; then
	psql -h 127.0.0.1 -U postgres -d postgres -qc "create database test"
fi
# The test packages of several modules run at once, each with pools of its
# own (the exactness tests open 4 pools of 16): Debian's 100 connections are
# too few for that on a developer's machine running other work beside it.
if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -tAc 'show max_connections')" -lt 400 ]; then
	echo "services.sh: raising PostgreSQL's max_connections to 400 (restart)"
	psql -h 127.0.0.1 -U postgres -d postgres -qc "alter system set max_connections = 400"
	version=$(ls /etc/postgresql | sort -n | tail -n 1)
	pg_ctlcluster --skip-systemctl-redirect "$version" main restart || pg_ctlcluster "$version" main restart
	for _ in $(seq 1 60); do listening 5432 && break; sleep 0.5; done
fi
echo "services.sh: PostgreSQL ready: $(psql -h 127.0.0.1 -U postgres -d test -tAc 'show server_version')"

# Redis
if ! listening 6379; then
	if ! command -v redis-server >/dev/null 2>&1; then
		echo "services.sh: installing Redis"
		apt_install redis-server
		# The package may start its own instance; use it if it listens.
	fi
	if ! listening 6379; then
		mkdir -p /var/lib/redis /var/log/redis
		redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
			--dir /var/lib/redis --logfile /var/log/redis/ci.log
		for _ in $(seq 1 60); do listening 6379 && break; sleep 0.5; done
	fi
fi
echo "services.sh: Redis ready: $(redis-cli -h 127.0.0.1 -p 6379 ping)"

# PgBouncer in transaction pooling mode.
bash .ci/pgbouncer.sh

# redis-server and redis-cli for throwaway Sentinel and Cluster tests.
bash .ci/redis-extra.sh

# Chromium for the contact form's browser test.
bash .ci/chromium.sh

# dynalite (DynamoDB API in memory) for kvstore/dynamostore.
bash .ci/dynalite.sh
