#!/usr/bin/env bash
# Builds the PagedWeight container image from Debian packages only: `make image`.
#
#   deploy/image/build.sh BUILD_DIR [IMAGE]      (IMAGE default: localhost/pagedweight:<version>)
#
# The root filesystem is bookworm's Essential set (mmdebstrap --variant=essential: a shell,
# coreutils, dpkg; no apt, no compiler) plus the Debian runtime packages the binaries link
# against, found from the binaries themselves (each shared library ldd resolves, mapped to its
# package with dpkg -S), so the list follows the build instead of being kept by hand. UCX's
# transports are plugins of libucx0 (dlopen'd, not NEEDED): they come with the package. Into it
# go every serving binary (/usr/local/bin), the embedded model and its any-precision store
# (/opt/pagedweight/models), the node file for one container (/etc/pagedweight/local.yaml) and
# a non-root user `pw` (uid 10001). podman imports the tarball with the image config (PATH,
# user, working directory, labels), since an imported rootfs has none.
set -euo pipefail
BUILD=${1:?usage: build.sh BUILD_DIR [IMAGE]}
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=$(cd "$BUILD" && pwd)
VERSION=$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo unknown)
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE=${2:-localhost/pagedweight:${VERSION}}
SUITE=${PW_IMAGE_SUITE:-bookworm}
MIRROR=${PW_IMAGE_MIRROR:-http://deb.debian.org/debian}
BINARIES=(pw-router pw-prefill pw-decode pw-broker pw-cluster pw-ctl pw-quantize pw-loadgen)
STORE=$BUILD/tiny-moe.apw
UID_PW=10001

for b in "${BINARIES[@]}"; do
  [ -x "$BUILD/bin/$b" ] || { echo "build.sh: $BUILD/bin/$b is missing (build it first: make image does)" >&2; exit 1; }
done
[ -f "$STORE" ] || { echo "build.sh: $STORE is missing (target tiny_store)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "build.sh: mmdebstrap is missing (tools/install_deps.sh image)" >&2; exit 1; }
command -v podman >/dev/null || { echo "build.sh: podman is missing (tools/install_deps.sh image)" >&2; exit 1; }

# The runtime packages: every library a binary resolves to, by the package that ships it.
libs=$(for b in "${BINARIES[@]}"; do ldd "$BUILD/bin/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
missing=$(for b in "${BINARIES[@]}"; do ldd "$BUILD/bin/$b"; done | grep 'not found' || true)
[ -z "$missing" ] || { echo "build.sh: unresolved libraries: $missing" >&2; exit 1; }
pkgs=()
for lib in $libs; do
  real=$(readlink -f "$lib")
  pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null || dpkg -S "${lib#/usr}" 2>/dev/null || true)
  [ -n "$pkg" ] || { echo "build.sh: no Debian package ships $lib" >&2; exit 1; }
  pkgs+=("${pkg%%:*}")
done
PKGS=$(printf '%s\n' "${pkgs[@]}" | sort -u | paste -sd, -)
echo "build.sh: runtime packages: $PKGS"

WORK=$BUILD/image
rm -rf "$WORK" && mkdir -p "$WORK/stage/usr/local/bin" "$WORK/stage/opt/pagedweight/models" "$WORK/stage/etc/pagedweight"
for b in "${BINARIES[@]}"; do install -m 0755 -s "$BUILD/bin/$b" "$WORK/stage/usr/local/bin/$b"; done
cp -r models/tiny-moe "$WORK/stage/opt/pagedweight/models/tiny-moe"
install -m 0644 "$STORE" "$WORK/stage/opt/pagedweight/models/tiny-moe.apw"
install -m 0644 deploy/image/local.yaml "$WORK/stage/etc/pagedweight/local.yaml"

start=$(date +%s)
# Hooks run outside the chroot with $1 = its root. Documentation, locales and dpkg's package
# lists of what was installed stay out of the image (nothing installs in it afterwards).
mmdebstrap --quiet --variant=essential --include="$PKGS" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook="tar -C '$WORK/stage' -cf - . | tar -C \"\$1\" -xf -" \
  --customize-hook="echo 'pw:x:$UID_PW:$UID_PW:PagedWeight:/home/pw:/usr/sbin/nologin' >> \"\$1/etc/passwd\"" \
  --customize-hook="echo 'pw:x:$UID_PW:' >> \"\$1/etc/group\"" \
  --customize-hook="mkdir -p \"\$1/home/pw/run\" && chown -R $UID_PW:$UID_PW \"\$1/home/pw\"" \
  --customize-hook="rm -rf \"\$1/var/cache/apt\" \"\$1/var/lib/apt/lists\" \"\$1/var/log\"/*" \
  "$SUITE" "$WORK/rootfs.tar" "$MIRROR"

# No build tools may be inside: refuse the image if a compiler or linker slipped in.
if tar -tf "$WORK/rootfs.tar" | grep -E '^\./usr/bin/(gcc|g\+\+|cc|c\+\+|ld|as|make|cmake|ninja)(-[0-9.]+)?$'; then
  echo "build.sh: build tools in the root filesystem" >&2; exit 1
fi

podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
podman import --quiet \
  --change 'ENV=PATH=/usr/local/bin:/usr/bin:/bin' \
  --change "USER=$UID_PW:$UID_PW" \
  --change 'WORKDIR=/home/pw' \
  --change 'EXPOSE=8000' \
  --change "LABEL=org.opencontainers.image.version=$VERSION" \
  --change 'LABEL=org.opencontainers.image.title=pagedweight' \
  --change "LABEL=org.opencontainers.image.revision=$REVISION" \
  --change 'CMD=["pw-cluster","up","--config","/etc/pagedweight/local.yaml"]' \
  "$WORK/rootfs.tar" "$IMAGE" >/dev/null
end=$(date +%s)
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build.sh: $IMAGE built in $((end - start)) s; $((size / 1024 / 1024)) MiB ($size bytes)"
echo "$IMAGE" > "$BUILD/image.ref"
# podman settings for running it on hosts like the CI's (CONTAINERS_CONF=$BUILD/containers.conf):
# runc (crun refuses hybrid cgroup hierarchies) and file/process limits within a sandbox's hard
# limits (podman's default asks for more than such a sandbox may raise).
cat > "$BUILD/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=8192:8192"]
[engine]
runtime = "runc"
CONF
echo "build.sh: run it: CONTAINERS_CONF=$BUILD/containers.conf podman run --rm -p 8000:8000 $IMAGE"
