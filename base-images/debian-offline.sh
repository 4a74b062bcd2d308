#!/usr/bin/env bash
# Build a Debian bookworm + python3 root image with debootstrap and `docker import`, for Docker
# hosts that reach no registry (it needs only a Debian package mirror).
#
#   bash base-images/debian-offline.sh [IMAGE]      # default gpux-pack/debian-python:bookworm
#   ARCH=arm64 bash base-images/debian-offline.sh gpux-pack/debian-python:bookworm-arm64
#
# Env: DEBIAN_MIRROR (default http://deb.debian.org/debian), FORCE=1 rebuilds an existing image,
# ARCH=arm64 makes an arm64 image on an x86_64 host: debootstrap's second stage runs under
# qemu-user-static (binfmt_misc must be mounted and qemu-aarch64 enabled), and the root is
# imported with a `FROM scratch` + `ADD rootfs.tar /` build for linux/arm64 (`docker import
# --platform` keeps amd64 on Docker 20.10).
set -euo pipefail

image="${1:-gpux-pack/debian-python:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
arch="${ARCH:-}"

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image exists (FORCE=1 rebuilds it)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"

root="$(mktemp -d)"
trap '$sudo rm -rf "$root"' EXIT
echo "debootstrap $suite into $root from $mirror"
if [ -n "$arch" ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  echo "ARCH=$arch needs qemu-user-static and binfmt-support, binfmt_misc mounted and" \
       "'update-binfmts --enable qemu-aarch64'" >&2
  exit 1
fi
$sudo debootstrap --variant=minbase ${arch:+--arch="$arch"} --include=python3,python3-venv,ca-certificates \
  "$suite" "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"

# Slim it: no apt lists, caches, docs or man pages; a tidy /tmp.
$sudo rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
$sudo chmod 1777 "$root/tmp"

echo "importing as $image"
if [ -n "$arch" ]; then
  ctx="$(mktemp -d)"
  $sudo tar -C "$root" --numeric-owner -cf "$ctx/rootfs.tar" .
  printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    'CMD ["python3"]' >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q --platform "linux/$arch" -t "$image" "$ctx" >/dev/null 2>"$ctx/build.log" \
    || { cat "$ctx/build.log" >&2; rm -rf "$ctx"; exit 1; }
  rm -rf "$ctx"
  echo "built $image ($(docker image inspect -f '{{.Architecture}}, {{.Size}}' "$image" | awk '{printf "%s %.0f MB", $1, $2/1e6}'))"
  exit 0
fi
$sudo tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$image" >/dev/null
docker run --rm "$image" python3 -c 'import sys, venv; print("python", sys.version.split()[0])'
echo "built $image ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
