#!/usr/bin/env bash
# Starts PgBouncer in transaction pooling mode on 127.0.0.1:6432 in front of
# the test PostgreSQL server at 127.0.0.1:5432 (database "test", user
# "postgres", trust authentication), for ratekit's pgstore/durable tests.
#
# Idempotent: when something already listens on the port it does nothing.
# Installs Debian's pgbouncer with apt-get when it is missing. PgBouncer
# refuses to run as root, so it runs as the postgres user from a directory
# that user owns.
set -euo pipefail

LISTEN_HOST=127.0.0.1
LISTEN_PORT="${PGBOUNCER_PORT:-6432}"
PG_HOST=127.0.0.1
PG_PORT="${PG_PORT:-5432}"
RUN_USER=postgres
DIR="${PGBOUNCER_DIR:-/tmp/ratekit-pgbouncer}"

listening() {
	(exec 3<>"/dev/tcp/${LISTEN_HOST}/${LISTEN_PORT}") 2>/dev/null
}

if listening; then
	echo "pgbouncer.sh: ${LISTEN_HOST}:${LISTEN_PORT} already accepts connections"
	exit 0
fi

if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
	echo "pgbouncer.sh: installing pgbouncer"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
	# Debian's package starts a system instance on port 6432 from
	# /etc/pgbouncer; stop it so that ours (with known settings) owns the port.
	if command -v service >/dev/null 2>&1; then
		service pgbouncer stop >/dev/null 2>&1 || true
	fi
	if listening; then
		echo "pgbouncer.sh: a pgbouncer started by the package listens on ${LISTEN_PORT}; stop it first" >&2
		exit 1
	fi
fi
PGBOUNCER_BIN="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"

mkdir -p "$DIR"
cat >"$DIR/pgbouncer.ini" <<INI
[databases]
test = host=${PG_HOST} port=${PG_PORT} dbname=test
* = host=${PG_HOST} port=${PG_PORT}

[pgbouncer]
listen_addr = ${LISTEN_HOST}
listen_port = ${LISTEN_PORT}
unix_socket_dir =
auth_type = trust
auth_file = ${DIR}/userlist.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits,search_path
logfile = ${DIR}/pgbouncer.log
pidfile = ${DIR}/pgbouncer.pid
INI
printf '"%s" ""\n' "$RUN_USER" >"$DIR/userlist.txt"
chown -R "$RUN_USER:$RUN_USER" "$DIR"
chmod 700 "$DIR"

# A stale pid file from a killed instance makes pgbouncer -d refuse to start.
if [ -f "$DIR/pgbouncer.pid" ] && ! kill -0 "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null; then
	rm -f "$DIR/pgbouncer.pid"
fi

su "$RUN_USER" -s /bin/sh -c "'$PGBOUNCER_BIN' -d '$DIR/pgbouncer.ini'"

for _ in $(seq 1 100); do
	if listening; then
		echo "pgbouncer.sh: pgbouncer listens on ${LISTEN_HOST}:${LISTEN_PORT} (transaction mode, log ${DIR}/pgbouncer.log)"
		exit 0
	fi
	sleep 0.1
done
echo "pgbouncer.sh: pgbouncer did not start; log follows" >&2
cat "$DIR/pgbouncer.log" >&2 || true
exit 1
