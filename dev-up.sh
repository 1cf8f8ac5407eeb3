#!/usr/bin/env bash
# Builds Cairn (release) and starts a local cluster: 1 monitor and 3 OSDs as separate
# processes in ./cairn-dev, WALs on /dev/shm, a pool named `default`; prints what to do next.
# Extra arguments go to `cairn dev up` (see `--help`), e.g. ./dev-up.sh --mons 3 --osds 4.
# Stop it with: ./target/release/cairn dev down   (add --purge to delete its data)
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh build
cargo build --release -p cairn-cli
exec ./target/release/cairn dev up "$@"
