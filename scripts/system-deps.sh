#!/usr/bin/env bash
# Debian packages DeFL needs beyond Python and Node: headers for mysqlclient, Chromium for browser tests.
# Installs only what is missing; needs root (or sudo) the first time.
set -euo pipefail
missing=()
dpkg -s libmariadb-dev >/dev/null 2>&1 || missing+=(libmariadb-dev)
dpkg -s pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
