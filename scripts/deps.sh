#!/usr/bin/env bash
# Installs the Debian packages Cairn needs that are missing, and nothing else.
#   scripts/deps.sh build   # to build: a C compiler, OpenSSL's headers (NBD TLS) and pkg-config
#   scripts/deps.sh test    # to run the tests: the real NBD clients, fio, nftables, ...
# Both may be given. Uses apt-get (as root, or through sudo); without either it says what to
# install and fails.
set -euo pipefail

need=()
want_build() {
    # A C compiler: Rust links with it, and the erasure code's SIMD kernels are C
    # (reed-solomon-erasure's simd-accel, crates/ec).
    command -v cc >/dev/null 2>&1 || need+=(gcc)
    command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
    if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; }; then
        need+=(libssl-dev)
    fi
}
want_test() {
    # The real NBD clients the tests drive (crates/nbd/tests, crates/cli/tests/nbd.rs),
    # nftables for the network partition tests (crates/cli/tests/partition.rs, hosts.rs), and
    # iproute2 for the multi-host tests' network namespaces (crates/cli/tests/hosts.rs),
    # openssl(1) to make the X.509 certificates of the NBD TLS tests, faketime for the
    # fencing test's server with a clock ahead (crates/cli/tests/nbd.rs), and Chromium with
    # its WebDriver for the dashboard's browser test (crates/cli/tests/dashboard.rs).
    local pair
    for pair in fio:fio nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdsh:libnbd-bin nbdkit:nbdkit \
        nbdfuse:nbdfuse qemu-img:qemu-utils mkfs.ext4:e2fsprogs fusermount3:fuse3 nft:nftables \
        ip:iproute2 openssl:openssl faketime:faketime chromium:chromium \
        chromedriver:chromium-driver; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
    done
    # nbdsh needs libnbd's Python bindings.
    /usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || need+=(python3-libnbd)
    # Prometheus's own linter checks the daemons' metrics pages, and a Prometheus server
    # scrapes a dev cluster (crates/cli/tests/metrics.rs).
    command -v promtool >/dev/null 2>&1 || want_promtool=1
    command -v prometheus >/dev/null 2>&1 || want_promtool=1
}
want_promtool=0

# promtool and the prometheus binary, taken out of Debian's `prometheus` package: installing
# the package would also start a Prometheus server listening on every interface.
install_promtool() {
    local tmp
    tmp=$(mktemp -d)
    chmod 755 "$tmp"
    echo "::: installing promtool and prometheus (binaries of Debian's prometheus package)"
    (cd "$tmp" && $sudo_cmd apt-get download -qq prometheus 2>/dev/null) || {
        $sudo_cmd apt-get update -qq
        (cd "$tmp" && $sudo_cmd apt-get download -qq prometheus)
    }
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
    $sudo_cmd install -m 755 "$tmp/x/usr/bin/promtool" "$tmp/x/usr/bin/prometheus" /usr/local/bin/
    rm -rf "$tmp"
}

for what in "$@"; do
    case "$what" in
        build) want_build ;;
        test) want_test ;;
        *) echo "usage: $0 build|test..." >&2; exit 2 ;;
    esac
done
[ ${#need[@]} -eq 0 ] && [ "$want_promtool" -eq 0 ] && exit 0

pkgs=$(printf '%s\n' "${need[@]}" | sort -u | tr '\n' ' ')
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "missing Debian packages: $pkgs(and promtool) - install them as root" >&2
        exit 1
    fi
    sudo_cmd="sudo"
fi
if [ "$want_promtool" -eq 1 ]; then
    install_promtool
fi
[ ${#need[@]} -eq 0 ] && exit 0
echo "::: installing $pkgs"
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get update -qq
# shellcheck disable=SC2086 # one word per package
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $pkgs
