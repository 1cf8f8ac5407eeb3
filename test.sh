#!/usr/bin/env bash
# Runs Cairn's tests: installs the missing Debian packages they need (scripts/deps.sh), then
# `cargo test --workspace`. Extra arguments go to cargo test, e.g. ./test.sh -p cairn-nbd.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh build test
exec cargo test --workspace "$@"
