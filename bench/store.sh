#!/usr/bin/env bash
# Runs the cairn-store benchmark (issue 2): the WAL on /dev/shm (standing for an NVDIMM), the
# data devices in ./target/cairn-bench (local disk). Prints one JSON object on stdout and a
# progress line per workload on stderr. Extra arguments go to `cairn bench store`, e.g.
#   ./bench/store.sh --seconds 3
#   ./bench/store.sh --only mix70-4k-qd32-separated,mix70-4k-qd32-unseparated
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    wal_dir=/dev/shm/cairn-bench
else
    wal_dir="${TMPDIR:-/tmp}/cairn-bench-wal"
    echo "bench/store.sh: /dev/shm is not available; the WAL goes to $wal_dir" >&2
fi
data_dir=./target/cairn-bench

exec cargo run --quiet --release -p cairn-cli -- \
    bench store --json --wal-dir "$wal_dir" --data-dir "$data_dir" "$@"
