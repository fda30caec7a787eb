#!/usr/bin/env bash
# install-deps.sh -- installs, from Debian's packages, what building and
# testing dlock needs and this machine lacks. Runs apt-get only when
# something is missing. Needs root (or sudo) on a Debian-like system.
set -euo pipefail
packages=(
  build-essential pkg-config check libsubunit-dev   # compiler, tests
  libhiredis-dev libssl-dev redis-server openssl      # Redis backend (rediss://) + its tests
  libcurl4-openssl-dev libjansson-dev etcd-server etcd-client  # etcd
  libzookeeper-mt-dev zookeeper default-jre-headless  # ZooKeeper
  util-linux hyperfine valgrind                       # flock(1), benchmarks, valgrind
  iproute2 clang                                      # fault harness (ip, tc), fuzzing
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
