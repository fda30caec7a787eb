#!/usr/bin/env bash
# install-deps.sh -- installs, from Debian's packages, what building and
# testing dlock needs and this machine lacks. Runs apt-get only when
# something is missing. Needs root (or sudo) on a Debian-like system.
#
#   scripts/install-deps.sh           build + test: every backend's client
#                                     library and server (Redis, etcd, ZooKeeper
#                                     and its Java), valgrind, clang,
#                                     clang-format, ...
#   scripts/install-deps.sh --build   build only: a compiler and the client
#                                     libraries (what `make` and `make demo` need)
set -euo pipefail
build=(
  build-essential pkg-config                          # compiler
  libhiredis-dev libssl-dev                           # Redis backend (rediss://)
  libcurl4-openssl-dev libjansson-dev                 # etcd backend
  libzookeeper-mt-dev                                 # ZooKeeper backend
  libpq-dev                                           # the postgres:// backend (headers; libpq5 dlopen()ed) and examples/fence_pg.c
  libmariadb-dev                                      # MySQL/MariaDB backend (headers; libmariadb3 dlopen()ed)
  libuv1-dev libevent-dev                             # the event-loop adapters: examples/async_*.c, check_async
)
test=(
  check libsubunit-dev                                # test framework
  redis-server openssl                                # Redis server, test certificates
  etcd-server etcd-client                             # etcd
  zookeeper default-jre-headless                      # ZooKeeper
  util-linux hyperfine valgrind                       # flock(1), benchmarks, valgrind
  bash zsh man-db groff-base                         # completions, dlock(1) rendered (check_cli)
  systemd                                             # docs/recipes.md units verified (check_cli)
  iproute2 clang                                      # fault harness (ip, tc), fuzzing
  clang-format                                        # make format-check (.clang-format)
  nftables                                            # fault harness: packet loss and reorder
  postgresql                                          # the postgres:// tests (check_postgres, the contract suites) and check_fencing_pg
  mariadb-server                                      # the mysql:// tests (check_mysql, the contract suites)
  galera-4                                            # check_mysql galera_node_refused (a one-node Galera)
)
case "${1:-}" in
  --build) packages=("${build[@]}") ;;
  "") packages=("${build[@]}" "${test[@]}") ;;
  *) echo "usage: $0 [--build]" >&2; exit 2 ;;
esac
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
