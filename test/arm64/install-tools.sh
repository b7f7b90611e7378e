#!/usr/bin/env bash
# install-tools.sh DIR: what this amd64 Debian machine needs to run arm64
# programs, for make test-arm64 (the unit tests of the arm64 build) and the
# tests of arm64 simulated nodes and of the arm64 image in make unit. Root;
# each step is skipped when done:
#   - Debian's qemu-user, registered with binfmt_misc for aarch64 ELF files
#     (the kernel then runs any arm64 program, a test binary or what it
#     starts, with qemu-aarch64);
#   - Debian's libc6:arm64 installed beside the machine's own (multiarch:
#     glibc's loader at /lib/ld-linux-aarch64.so.1, which dynamically linked
#     arm64 programs name; dpkg adds the architecture first);
#   - Debian's aarch64 cross gcc, which builds arm64 simulated nodes' driver
#     libraries and tools (test/simnode);
#   - libc-bin:arm64 unpacked into DIR: its aarch64 ldconfig builds those
#     nodes' ld.so.cache (the machine's x86-64 ldconfig skips aarch64
#     libraries); test/simnode finds it through NRI_GPU_SIMNODE_LDCONFIG.
set -euo pipefail
dir=${1:?usage: $0 DIR (where libc-bin:arm64 is unpacked)}
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
	echo "$0: needs root (apt-get, binfmt_misc)" >&2
	exit 1
fi
if [ "$(dpkg --print-architecture)" != amd64 ]; then
	echo "$0: for amd64 machines; this one is $(dpkg --print-architecture): nothing done" >&2
	exit 0
fi

need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
dpkg -s libc6-dev-arm64-cross >/dev/null 2>&1 || need+=(libc6-dev-arm64-cross)
dpkg -s libc6:arm64 >/dev/null 2>&1 || need+=(libc6:arm64)
if [ "${#need[@]}" -gt 0 ]; then
	if ! dpkg --print-foreign-architectures | grep -qx arm64; then
		dpkg --add-architecture arm64
	fi
	echo "$0: apt-get install ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Without binfmt_misc (a container that may not mount it) make image still
# builds and checks the arm64 image (it runs qemu-aarch64 itself), but the
# tests of arm64 nodes skip, saying why, and make test-arm64 cannot run.
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ] && ! mount -t binfmt_misc binfmt_misc "$binfmt"; then
	echo "$0: warning: cannot mount binfmt_misc: arm64 programs do not run here" >&2
elif [ ! -e "$binfmt/qemu-aarch64" ]; then
	# qemu's own magic and mask for aarch64 ELF executables
	# (scripts/qemu-binfmt-conf.sh); F: the kernel opens the emulator now,
	# so that it runs in other mount namespaces too.
	if printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$(command -v qemu-aarch64)"':F' >"$binfmt/register"; then
		echo "$0: qemu-aarch64 registered with binfmt_misc"
	else
		echo "$0: warning: cannot register qemu-aarch64 with binfmt_misc: arm64 programs do not run here" >&2
	fi
fi

deploy/image/debian-package.sh arm64 libc-bin "$dir"
