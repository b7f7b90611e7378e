#!/usr/bin/env bash
# debian-package.sh ARCH PACKAGE DIR: Debian's PACKAGE for the architecture
# ARCH (dpkg's name: arm64), downloaded with apt-get download and unpacked
# with dpkg-deb -x into DIR, unless DIR holds it already (DIR/.package says
# which version). make image takes a platform's glibc from libc6:<arch>
# when <arch> is not the build machine's; make test-arm64 takes its aarch64
# ldconfig from libc-bin:arm64.
#
# The version is the one installed for the build machine's own
# architecture when the mirror has it (so that every platform of the image
# carries one glibc), else the mirror's. When dpkg does not know ARCH yet,
# or apt has no list of its packages, it adds the architecture and runs
# apt-get update: as root; otherwise it says what to run.
set -euo pipefail
if [ $# -ne 3 ]; then
	echo "usage: $0 ARCH PACKAGE DIR" >&2
	exit 2
fi
arch=$1 pkg=$2 dir=$3
if [ -e "$dir/.package" ]; then
	exit 0
fi
as_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "$0: $pkg:$arch: $* needs root; run it as root, or as root: dpkg --add-architecture $arch && apt-get update" >&2
		exit 1
	fi
	echo "$0: $*"
	"$@"
}
if ! dpkg --print-foreign-architectures | grep -qx "$arch" && [ "$(dpkg --print-architecture)" != "$arch" ]; then
	as_root dpkg --add-architecture "$arch"
	as_root apt-get update -qq
elif ! apt-cache show "$pkg:$arch" >/dev/null 2>&1; then
	as_root apt-get update -qq
fi
want="$pkg:$arch"
host=$(dpkg-query -W -f '${Version}' "$pkg:$(dpkg --print-architecture)" 2>/dev/null || true)
if [ -n "$host" ] && apt-cache show "$want=$host" >/dev/null 2>&1; then
	want="$want=$host"
else
	echo "$0: $pkg $host (this machine's) is not on the mirror for $arch: taking the mirror's $pkg:$arch" >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt downloads as its own user when it can write the directory.
if [ "$(id -u)" = 0 ] && id _apt >/dev/null 2>&1; then
	chown _apt "$tmp"
fi
(cd "$tmp" && apt-get download -q "$want" >/dev/null)
deb=$(echo "$tmp"/*.deb)
mkdir -p "$tmp/root"
dpkg-deb -x "$deb" "$tmp/root"
dpkg-deb -f "$deb" Package Architecture Version > "$tmp/root/.package"
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$tmp/root" "$dir"
echo "$0: $(basename "$deb") unpacked into $dir"
