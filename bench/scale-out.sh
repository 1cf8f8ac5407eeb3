#!/usr/bin/env bash
# Scale-out on the data path: does the cluster's CPU per 4 KiB write stay flat as hosts are
# added? Builds Cairn (release), then for 3 and for 6 OSD hosts (override: HOSTS="3 6"):
# makes the hosts as network namespaces joined by a bridge on a private /24 (no outside
# interface, no route out; needs root), runs the monitor and osd.0 on host 0 (`cairn dev up
# --bind`) and one OSD on every other host (`cairn osd run` inside its namespace), runs
# `cairn bench objects --only write-4k` against it from this machine's namespace (the same
# load at every size: same queue depths, working set and seconds), and removes everything.
#
# Prints JSON: {"runs": [{"hosts": 3, "workloads": [...bench objects entries...]}, ...],
#   "cpu_us_per_op_ratio": {"write-4k-qd1": largest/smallest, "write-4k-qd32": ...}}
# where cpu_us_per_op is the CPU time of the cluster's monitor and OSD processes per write
# (all on this machine; their pids are in the cluster's run/ directory), so the ratio is what
# a write costs the cluster at 6 hosts against 3 (target: within 1.10). Run it on an
# otherwise idle machine. ONLY=write-4k-qd32 runs one of the two workloads. Extra arguments
# go to the bench, e.g.
#   sudo ./bench/scale-out.sh --seconds 3 --objects 32
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "scale-out.sh: needs root (it creates network namespaces)" >&2
    exit 1
fi
# CAIRN=path/to/cairn uses that binary instead of building a release one (the test that
# checks this script runs it with its debug build).
if [ -z "${CAIRN:-}" ]; then
    cargo build --release -p cairn-cli >&2
    CAIRN=$PWD/target/release/cairn
fi
OSD_SIZE=${OSD_SIZE:-4G}
tag="cso$(($$ % 100000))"
subnet="10.232.$(($$ % 250))"
work=$(mktemp -d /tmp/cairn-bench-scale-out.XXXXXX)

teardown() {
    local n=$1 dir=$2
    "$CAIRN" dev down --dir "$dir" --purge >/dev/null 2>&1 || true
    for i in $(seq 0 $((n - 1))); do
        ip netns pids "${tag}h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        # Deleting the link first: a namespace outlives its name while its sockets sit in
        # TIME_WAIT, and keeps its end of the pair with it.
        ip link del "${tag}v$i" 2>/dev/null || true
        ip netns del "${tag}h$i" 2>/dev/null || true
    done
    ip link del "${tag}br" 2>/dev/null || true
}
trap 'for n in ${HOSTS:-3 6}; do teardown "$n" "$work/c$n"; done; rm -rf "$work"' EXIT

hosts_up() {
    local n=$1
    ip link add "${tag}br" type bridge
    ip addr add "$subnet.254/24" dev "${tag}br"
    ip link set "${tag}br" up
    for i in $(seq 0 $((n - 1))); do
        local ns="${tag}h$i"
        ip netns add "$ns"
        ip link add "${tag}v$i" type veth peer name eth0 netns "$ns"
        ip link set "${tag}v$i" master "${tag}br" up
        ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

osds_registered() {
    "$CAIRN" -c "$1/cairn.toml" status --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["osds"]["total"])'
}

run() {
    local n=$1 dir="$work/c$1"
    shift
    echo "== $n hosts" >&2
    hosts_up "$n"
    ip netns exec "${tag}h0" "$CAIRN" dev up --dir "$dir" --bind "$subnet.1" --host h0 \
        --osds 1 --osd-size "$OSD_SIZE" --no-pool --no-nbd --timeout 60 >&2
    local mon
    mon=$("$CAIRN" -c "$dir/cairn.toml" mon ls --json |
        python3 -c 'import json,sys; print(",".join(m["addr"] for m in json.load(sys.stdin)))')
    for i in $(seq 1 $((n - 1))); do
        mkdir -p "$dir/osd.$i"
        "$CAIRN" -c "$dir/cairn.toml" auth add "osd.$i" -o "$dir/osd.$i/keyring" >/dev/null
        ip netns exec "${tag}h$i" "$CAIRN" osd run --dir "$dir/osd.$i" \
            --keyring "$dir/osd.$i/keyring" --data-size "$OSD_SIZE" --mon "$mon" \
            --host "h$i" --listen "$subnet.$((i + 1)):0" >"$dir/osd.$i.log" 2>&1 &
        # `ip netns exec` execs the OSD in place: its pid, where the bench (and `dev down`)
        # find the cluster's processes.
        echo $! >"$dir/run/osd.$i.pid"
        # A new OSD takes the next id at its first boot, and its key is bound to that id:
        # one at a time.
        for _ in $(seq 1 120); do
            [ "$(osds_registered "$dir")" -gt "$i" ] && break
            sleep 0.5
        done
    done
    "$CAIRN" -c "$dir/cairn.toml" osd wait --up "$n" --timeout 60 >&2
    "$CAIRN" -c "$dir/cairn.toml" bench objects --json --only "${ONLY:-write-4k}" "$@" >"$work/run$n.json"
    teardown "$n" "$dir"
}

for n in ${HOSTS:-3 6}; do
    run "$n" "$@"
done
python3 - "$work" ${HOSTS:-3 6} <<'EOF'
import json, sys
work, sizes = sys.argv[1], [int(n) for n in sys.argv[2:]]
runs = []
for n in sizes:
    with open(f"{work}/run{n}.json") as f:
        runs.append({"hosts": n, "workloads": json.load(f)["workloads"]})
ratio = {}
for w in runs[0]["workloads"]:
    costs = [next(x["cpu_us_per_op"] for x in r["workloads"] if x["name"] == w["name"]) for r in runs]
    if min(costs) > 0:
        ratio[w["name"]] = round(max(costs) / min(costs), 3)
print(json.dumps({"runs": runs, "cpu_us_per_op_ratio": ratio}))
EOF
