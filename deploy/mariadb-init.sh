#!/bin/bash
# One database and one user per organization, each user granted its own database only
# (docker-compose.yml mounts this into MariaDB's /docker-entrypoint-initdb.d; it runs once,
# on an empty data directory). A node that is broken into can read and write its own
# organization's tables, not another's; nothing runs as root.
#
# Env: DEFL_ORGS (ids, default "a b c"), ORG_<ID>_DB_PASSWORD for each, MARIADB_ROOT_PASSWORD;
# MARIADB_CLIENT overrides the client command (the tests point it at a test server).
set -euo pipefail

orgs=${DEFL_ORGS:-a b c}
client=${MARIADB_CLIENT:-mariadb --protocol=socket -uroot}
export MYSQL_PWD="${MARIADB_ROOT_PASSWORD:-}"

sql_literal() {  # a value as the inside of a '...' SQL string literal
    local value=${1//\\/\\\\}
    printf '%s' "${value//\'/\'\'}"
}

for org in $orgs; do
    if [[ ! $org =~ ^[a-z0-9_]{1,32}$ ]]; then
        echo "organization id '$org' must be 1-32 of a-z, 0-9, _" >&2
        exit 1
    fi
    variable="ORG_${org^^}_DB_PASSWORD"
    password=${!variable:-}
    if [[ -z $password ]]; then
        echo "$variable is not set: each organization's database user needs its own password" >&2
        exit 1
    fi
    $client <<SQL
CREATE DATABASE IF NOT EXISTS \`defl_${org}\` CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'defl_${org}'@'%' IDENTIFIED BY '$(sql_literal "$password")';
GRANT ALL PRIVILEGES ON \`defl_${org}\`.* TO 'defl_${org}'@'%';
SQL
done
