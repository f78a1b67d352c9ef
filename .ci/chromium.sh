#!/usr/bin/env bash
# Makes sure Debian's Chromium is installed, for the contact form's browser
# test (examples/contactform, which runs $CHROMIUM, default chromium on PATH).
# Installs it from Debian's packages when it is missing; does nothing
# otherwise. Needs root.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
	echo "chromium.sh: $(chromium --version 2>/dev/null || echo chromium) ready"
	exit 0
fi
echo "chromium.sh: installing Chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
echo "chromium.sh: $(chromium --version) ready"
