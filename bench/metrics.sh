#!/usr/bin/env bash
# What metrics cost (issue 18): 4 KiB writes at QD32 (`cairn bench objects --only
# write-4k-qd32`, a 2 GiB working set filled first) on one cluster whose daemons serve
# Prometheus metrics, and on the same cluster restarted without them (`dev up --no-metrics`),
# in alternating rounds. Prints one JSON object: every run, and the median IOPS with metrics
# over the median without (the target: at least 0.98). Environment: ROUNDS (3), SECS (20),
# OBJECTS (2048 objects of 1 MiB), OSD_SIZE (8G).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
secs=${SECS:-20}
objects=${OBJECTS:-2048}
osd_size=${OSD_SIZE:-8G}
cargo build --quiet --release -p cairn-cli
cairn=$PWD/target/release/cairn
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-bench-metrics.XXXXXX")
cluster=$work/cluster
trap '"$cairn" dev down --dir "$cluster" --purge >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
export CAIRN_CONF=$cluster/cairn.toml
for round in $(seq "$rounds"); do
    for mode in on off; do
        "$cairn" dev down --dir "$cluster" >/dev/null 2>&1 || true
        flags=()
        if [ "$mode" = off ]; then flags=(--no-metrics); fi
        "$cairn" dev up --dir "$cluster" --osds 3 --osd-size "$osd_size" --no-nbd "${flags[@]}" \
            >/dev/null 2>"$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
        echo "bench/metrics.sh: round $round, metrics $mode" >&2
        scraper=""
        if [ "$mode" = on ]; then
            # Scraped every 5 s meanwhile, as a Prometheus would.
            addrs=$(awk '/^\[metrics\]/ { m = 1; next } /^\[/ { m = 0 }
                m && /= "/ { gsub(/.*= "|"/, ""); print }' "$cluster/dev.toml")
            ( while sleep 5; do
                for a in $addrs; do curl -s -o /dev/null "http://$a/metrics" || true; done
            done ) &
            scraper=$!
        fi
        "$cairn" bench objects --json --only write-4k-qd32 --seconds "$secs" \
            --objects "$objects" >"$work/$mode-$round.json"
        if [ -n "$scraper" ]; then kill "$scraper"; fi
    done
done
python3 - "$work" "$rounds" "$objects" <<'PY'
import json, statistics, sys
work, rounds, objects = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {"on": [], "off": []}
for r in range(1, rounds + 1):
    for mode in runs:
        w = json.load(open(f"{work}/{mode}-{r}.json"))["workloads"][0]
        runs[mode].append({"round": r, "iops": w["iops"], "lat_us": w["lat_us"],
                           "cpu_us_per_op": w.get("cpu_us_per_op"),
                           "baseline_iops": w.get("baseline_iops")})
med = {m: statistics.median(x["iops"] for x in v) for m, v in runs.items()}
print(json.dumps({
    "workload": "write-4k-qd32",
    "working_set_mib": objects,
    "runs_with_metrics": runs["on"],
    "runs_without_metrics": runs["off"],
    "median_iops_with_metrics": med["on"],
    "median_iops_without_metrics": med["off"],
    "ratio_with_to_without": med["on"] / med["off"] if med["off"] else None,
    "target_ratio_at_least": 0.98,
}, indent=2))
PY
