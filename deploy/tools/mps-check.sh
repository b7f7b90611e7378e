#!/bin/sh
# mps-check.sh: on a GPU node where nri-gpu mps runs, check each MPS GPU it
# reports ready against the driver itself: the GPU's compute mode
# (nvidia-smi) is Exclusive_Process; the daemon answers on its control
# pipe; its default active thread percentage and device pinned memory
# limit (nvidia-cuda-mps-control get_default_active_thread_percentage,
# get_default_device_pinned_mem_limit 0) are those the ready file says; the
# ready file was touched within the last 5 seconds.
# Exit 0 and "OK" when all agree; 1 and one line per difference when not.
#
#   deploy/tools/mps-check.sh [--mps-root DIR]     (default /run/nri-gpu/mps: devicePlugin.mpsRoot)
#
# Environment: NVIDIA_SMI (default nvidia-smi), MPS_CONTROL (default
# nvidia-cuda-mps-control). Needs only POSIX sh, sed and stat (no jq), as on
# a minimal node image; run it as root (the daemons' pipes are root's).
set -eu

root=/run/nri-gpu/mps
while [ $# -gt 0 ]; do
	case $1 in
	--mps-root) root=$2; shift 2 ;;
	*) echo "usage: $0 [--mps-root DIR]" >&2; exit 2 ;;
	esac
done
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
MPS_CONTROL=${MPS_CONTROL:-nvidia-cuda-mps-control}

# field FILE KEY: the value of "KEY" in the one-line JSON of FILE.
field() {
	sed -n 's/.*"'"$2"'":"\{0,1\}\([^",}]*\)"\{0,1\}[,}].*/\1/p' "$1"
}

modes=$("$NVIDIA_SMI" --query-gpu=uuid,compute_mode --format=csv,noheader)
status=0
checked=0
for ready in "$root"/*/ready; do
	[ -f "$ready" ] || continue
	dir=${ready%/ready}
	uuid=$(field "$ready" uuid)
	threads=$(field "$ready" activeThreadPercentage)
	mib=$(field "$ready" pinnedMemoryMiB)
	checked=$((checked + 1))
	mode=$(printf '%s\n' "$modes" | sed -n "s/^$uuid, *//p")
	if [ "$mode" != Exclusive_Process ]; then
		echo "$uuid: compute mode ${mode:-unknown to nvidia-smi}, want Exclusive_Process"
		status=1
	fi
	age=$(($(date +%s) - $(stat -c %Y "$ready")))
	if [ "$age" -gt 5 ]; then
		echo "$uuid: the ready file was last touched ${age}s ago: is nri-gpu mps running?"
		status=1
	fi
	if ! got=$(echo get_default_active_thread_percentage | CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" "$MPS_CONTROL" 2>&1); then
		echo "$uuid: the MPS control daemon in $dir/pipe does not answer: $got"
		status=1
		continue
	fi
	got=$(printf '%s\n' "$got" | sed -n 's/^\([0-9][0-9]*\)\(\.0*\)\{0,1\}$/\1/p')
	if [ "$got" != "$threads" ]; then
		echo "$uuid: default active thread percentage ${got:-unreadable}, the ready file says $threads"
		status=1
	fi
	if [ "${mib:-0}" != 0 ]; then
		got=$(echo get_default_device_pinned_mem_limit 0 | CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" "$MPS_CONTROL" 2>&1 || true)
		if [ "$got" != "${mib}M" ]; then
			echo "$uuid: default pinned memory limit of device 0 ${got:-unreadable}, the ready file says ${mib}M"
			status=1
		fi
	fi
done
if [ "$checked" = 0 ]; then
	echo "no MPS GPU is reported ready in $root (is nri-gpu mps running, with devicePlugin.sharing.mps?)"
	exit 1
fi
if [ "$status" = 0 ]; then
	echo "OK: $checked MPS GPUs: Exclusive_Process, their daemons answer with the limits nri-gpu set"
fi
exit "$status"
