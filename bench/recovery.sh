#!/usr/bin/env bash
# Builds Cairn (release) and runs `cairn bench recovery --json`, which starts a throw-away
# local cluster of its own (4 OSDs, WALs on /dev/shm), writes 2 GiB, kills an OSD with
# kill -9 in three scenarios (down a while then back under load; lost and backfilled, idle
# and under load) and removes the cluster. Extra arguments go to the bench, e.g.
# ./bench/recovery.sh --data 512M --down-secs 10. About 4 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p cairn-cli
./target/release/cairn bench recovery --json "$@"
