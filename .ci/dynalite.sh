#!/usr/bin/env bash
# Starts dynalite (DynamoDB's API served in memory by a Node program, from
# npm) on 127.0.0.1:8000 for the tests of kvstore/dynamostore, which find it
# through RATEKIT_DYNAMODB_ENDPOINT (default http://127.0.0.1:8000).
#
# Idempotent: installs dynalite under $DYNALITE_DIR when it is missing,
# starts it when nothing listens on the port, and waits until it answers a
# DynamoDB request. Needs Node 20 or later and npm (installed with apt-get
# when missing; Debian 12's own nodejs is 18, too old).
set -euo pipefail

PORT="${DYNALITE_PORT:-8000}"
DIR="${DYNALITE_DIR:-/opt/dynalite}"
VERSION=4.0.0

listening() { (exec 3<>"/dev/tcp/127.0.0.1/${PORT}") 2>/dev/null; }

# answers reports whether a DynamoDB API answers on the port: ListTables
# with any credentials returns a JSON body naming TableNames.
answers() {
	curl -s -m 2 -X POST "http://127.0.0.1:${PORT}/" \
		-H 'Content-Type: application/x-amz-json-1.0' \
		-H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
		-H 'X-Amz-Date: 20260101T000000Z' \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
		-d '{}' 2>/dev/null | grep -q TableNames
}

if listening; then
	if answers; then
		echo "dynalite.sh: a DynamoDB API already answers on 127.0.0.1:${PORT}"
		exit 0
	fi
	echo "dynalite.sh: something that is not DynamoDB listens on 127.0.0.1:${PORT}" >&2
	exit 1
fi

if ! command -v npm >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
	echo "dynalite.sh: installing nodejs, npm and curl"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends nodejs npm curl ca-certificates >/dev/null
fi

major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 20 ]; then
	echo "dynalite.sh: dynalite ${VERSION} needs Node 20 or later; node is $(node --version 2>/dev/null || echo missing)" >&2
	exit 1
fi

if [ ! -x "$DIR/node_modules/.bin/dynalite" ]; then
	echo "dynalite.sh: installing dynalite@${VERSION} into $DIR"
	mkdir -p "$DIR"
	npm install --prefix "$DIR" --no-audit --no-fund "dynalite@${VERSION}" >/dev/null
fi

# dynalite throws from a request's 'error' handler, so a client that resets
# its connection in the middle of a request (a test whose deadline expired
# while the body was being sent, as happens on a loaded machine) stops the
# whole server for every test after it ("Error: aborted", ECONNRESET). The
# DynamoDB service drops such a request and goes on; so does dynalite with
# this handler, which any other uncaught error still stops.
cat >"$DIR/keep-serving.js" <<'JS'
process.on('uncaughtException', (err) => {
  if (err && err.code === 'ECONNRESET') {
    console.error(new Date().toISOString() + ' dynalite: a client reset its connection mid-request: ' + err.message)
    return
  }
  console.error(err)
  process.exit(1)
})
JS

echo "dynalite.sh: starting dynalite on 127.0.0.1:${PORT}"
nohup node --require "$DIR/keep-serving.js" "$DIR/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$PORT" >>"$DIR/dynalite.log" 2>&1 &

for _ in $(seq 1 100); do
	if answers; then
		echo "dynalite.sh: dynalite answers on 127.0.0.1:${PORT} (log $DIR/dynalite.log)"
		exit 0
	fi
	sleep 0.1
done
echo "dynalite.sh: dynalite did not start; log follows" >&2
cat "$DIR/dynalite.log" >&2 || true
exit 1
