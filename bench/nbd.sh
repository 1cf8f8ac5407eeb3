#!/usr/bin/env bash
# Builds Cairn (release), starts a throw-away local cluster ($OSDS OSDs, default 3, of
# $OSD_SIZE, default 8G, sparse; WALs on /dev/shm; DIRECT_WRITE_MIN=128K sets the OSDs'
# --direct-write-min), runs
# `cairn bench nbd --json` against it (fio's nbd engine vs nbdkit memory, same run) and stops
# the cluster. Needs fio and nbdkit (apt-get install fio
# nbdkit). The volume is 4G (filled before the workloads run: a working set of GiBs, as users
# have) unless --volume-size is given, and each workload is measured for 20 s after a 5 s ramp
# (the issue's method) unless --seconds is given. --snapshots and --volumes add the volume
# features' measurements (snapshots; QoS beside a noisy neighbour, opening a 1 TiB volume);
# --snapshots copies the whole volume once, so give it OSD_SIZE=12G. After write-1m-qd8
# the data disk itself is measured beside the OSDs' data (a file of the volume's size per
# replica, removed afterwards: ~12 GiB free for the default; --no-device skips it).
# Extra arguments go to the bench, e.g.
#   ./bench/nbd.sh --seconds 3 --ramp 1 --only randwrite --volume-size 1G
# An EC 4+2 volume beside the replicated one in the same run, then with one OSD killed
# (degraded reads) and rebuilt:
#   OSDS=6 ./bench/nbd.sh --no-device --ec 4+2 --degraded
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p cairn-cli
dir=$(mktemp -d /tmp/cairn-bench-nbd.XXXXXX)
trap './target/release/cairn dev down --dir "$dir" --purge >/dev/null 2>&1 || true' EXIT
./target/release/cairn dev up --dir "$dir" --osds "${OSDS:-3}" --osd-size "${OSD_SIZE:-8G}" --no-nbd \
    ${DIRECT_WRITE_MIN:+--direct-write-min "$DIRECT_WRITE_MIN"} >&2
size=(--volume-size 4G)
seconds=(--seconds 20)
for a in "$@"; do
    case "$a" in
    --volume-size | --volume-size=*) size=() ;;
    --seconds | --seconds=*) seconds=() ;;
    esac
done
./target/release/cairn -c "$dir/cairn.toml" bench nbd "${size[@]}" "${seconds[@]}" "$@"
