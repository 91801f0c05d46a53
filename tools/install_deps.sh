#!/usr/bin/env bash
# Installs the Debian packages PagedWeight builds against. Idempotent: does nothing when all
# packages are present. Shared by `make run`, `make test` and `.ci/run`.
#   tools/install_deps.sh          what the build and the tests need
#   tools/install_deps.sh image    also what `make image` and the podman tests need (mmdebstrap
#                                  builds the root filesystem, podman imports and runs it with
#                                  runc; only `make image` and .ci/run ask for these)
#   tools/install_deps.sh sanitize also clang, its sanitizer runtimes and llvm-symbolizer, which
#                                  build the ASan+UBSan tree and name file:line in its reports
#                                  (make test-asan)
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config ccache
  libzmq3-dev cppzmq-dev
  capnproto libcapnp-dev
  libucx-dev ucx-utils
  libyaml-cpp-dev
  prometheus-cpp-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  nlohmann-json3-dev
  libboost-dev libboost-system-dev
  libcli11-dev libspdlog-dev libfmt-dev
  python3-venv curl
  iproute2 prometheus python3-matplotlib
  bible-kjv bible-kjv-text fortunes fortunes-min manpages manpages-dev
  libc6-dev linux-libc-dev libpython3.11-stdlib libpython3.11-minimal
)
if [ "${1:-}" = sanitize ]; then
  PKGS+=(clang libclang-rt-14-dev llvm)
fi
if [ "${1:-}" = image ]; then
  PKGS+=(mmdebstrap podman runc catatonit uidmap slirp4netns fuse-overlayfs containernetworking-plugins iptables)
fi
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
