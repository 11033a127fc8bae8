#!/bin/sh
# The files docker-compose.yml's validators share, written once into DIR (the `consortium` volume):
# genesis.json (organizations a, b and c's validators seal; their nodes are funded), each
# validator's sealing and devp2p keys, and each one's bootnodes (the other two, at their fixed
# addresses on the `validators` network). Keys come from the environment (.env):
# ORG_<X>_VALIDATOR_KEY, ORG_<X>_P2P_KEY, ORG_<X>_NODE_KEY. A genesis already there is kept: a new
# one would be another chain.
set -eu
dir=${1:?usage: consortium-files.sh DIR}
python -m devnet.clique genesis --out "$dir/genesis.json" \
    --validator-key-env ORG_A_VALIDATOR_KEY --validator-key-env ORG_B_VALIDATOR_KEY \
    --validator-key-env ORG_C_VALIDATOR_KEY \
    --fund-key-env ORG_A_NODE_KEY --fund-key-env ORG_B_NODE_KEY --fund-key-env ORG_C_NODE_KEY
umask 077
for org in a b c; do
    upper=$(echo "$org" | tr a-z A-Z)
    printenv "ORG_${upper}_VALIDATOR_KEY" | sed 's/^0x//' > "$dir/validator-$org.key"
    printenv "ORG_${upper}_P2P_KEY" | sed 's/^0x//' > "$dir/p2p-$org.key"
done
# One process for the three enodes (each python start costs seconds on a loaded host).
python -m devnet.clique enode \
    --p2p-key-file "$dir/p2p-a.key" --host 172.29.38.11 \
    --p2p-key-file "$dir/p2p-b.key" --host 172.29.38.12 \
    --p2p-key-file "$dir/p2p-c.key" --host 172.29.38.13 > "$dir/enodes"
sed -n 2,3p "$dir/enodes" > "$dir/bootnodes-a.txt"
sed -n '1p;3p' "$dir/enodes" > "$dir/bootnodes-b.txt"
sed -n 1,2p "$dir/enodes" > "$dir/bootnodes-c.txt"
