#!/usr/bin/env bash
# Runs Cairn's tests: installs the missing Debian packages they need (scripts/deps.sh), then
# `cargo test --workspace` with the named failpoints compiled in (the failpoint tests need them;
# release builds never have them). Extra arguments go to cargo test, e.g. ./test.sh -p cairn-nbd.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh build test
exec cargo test --workspace --features cairn-cli/failpoints "$@"
