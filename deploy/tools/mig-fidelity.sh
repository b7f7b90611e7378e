#!/bin/sh
# mig-fidelity.sh: on a real MIG node, compare what nri-gpu discovers
# (`nri-gpu inventory`) with what the driver's own tool says
# (`nvidia-smi -L`, `nvidia-smi mig -lgi`, `nvidia-smi mig -lci`):
# every MIG device with the same UUID, parent GPU, MIG index and profile,
# every compute instance (GPU, GI, CI) once on each side, and each MIG
# device's capability minors equal to the driver's
# /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<I>[/ci<C>]/access.
# Exit 0 and "OK" when they agree; 1 and one line per difference when not.
#
#   deploy/tools/mig-fidelity.sh [--config /etc/nri-gpu/config.yaml]
#
# Environment: NRI_GPU (default nri-gpu), NVIDIA_SMI (default nvidia-smi),
# PROC (default /proc: where the capability files are read). Needs only
# POSIX sh and awk (no jq, no Python), as on a minimal node image.
set -eu

NRI_GPU=${NRI_GPU:-nri-gpu}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
PROC=${PROC:-/proc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$NRI_GPU" inventory "$@" > "$tmp/inventory"
"$NVIDIA_SMI" -L > "$tmp/smi-L"
"$NVIDIA_SMI" mig -lci > "$tmp/smi-lci"

# nri-gpu: "<uuid> <gpu>:<mig> <profile>" and "<gpu> <gi> <ci>" from the
# MIG table of `nri-gpu inventory`; the GPU minors from its GPU table.
awk '
	/^GPUs:/ { sect = "gpu"; next }
	/^MIG devices:/ { sect = "mig"; next }
	/^$/ { sect = "" }
	sect == "gpu" && $1 ~ /^[0-9]+$/ { print "minor", $1, $2 }
	sect == "mig" && $1 ~ /^[0-9]+:[0-9]+$/ {
		print "dev", $2, $1, $3
		print "ci", $4, $5, $6
		n = split($7, a, "nvidia-cap"); gim = a[n]
		n = split($9, b, "nvidia-cap"); cim = b[n]
		print "cap", $4, $5, $6, gim, cim
	}
' "$tmp/inventory" > "$tmp/nri"

# nvidia-smi -L: "GPU 0: ... (UUID: GPU-...)" then "  MIG 1g.10gb  Device  0: (UUID: MIG-...)".
awk '
	/^GPU [0-9]+:/ { gpu = $2; sub(":", "", gpu) }
	/^[ \t]+MIG / {
		uuid = $0; sub(/.*UUID: /, "", uuid); sub(/\).*/, "", uuid)
		idx = $0; sub(/.*Device +/, "", idx); sub(/:.*/, "", idx)
		print "dev", uuid, gpu ":" idx, $2
	}
' "$tmp/smi-L" > "$tmp/smi"
# nvidia-smi mig -lci: table rows "|  0  7  MIG 1g.10gb  0  0  0:1  |":
# GPU, GPU instance, name (two words), profile id, compute instance.
awk '
	/^\|[ \t]+[0-9]+[ \t]+[0-9]+[ \t]+MIG / { print "ci", $2, $3, $7 }
' "$tmp/smi-lci" >> "$tmp/smi"

status=0
sort "$tmp/nri" | grep -E '^(dev|ci) ' > "$tmp/a" || true
sort "$tmp/smi" > "$tmp/b"
if [ ! -s "$tmp/b" ]; then
	echo "nvidia-smi lists no MIG device: nothing to compare (is MIG enabled and configured?)"
	exit 1
fi
comm -23 "$tmp/a" "$tmp/b" | sed 's/^/only nri-gpu: /'
comm -13 "$tmp/a" "$tmp/b" | sed 's/^/only nvidia-smi: /'
if [ -n "$(comm -3 "$tmp/a" "$tmp/b")" ]; then
	status=1
fi

# Capability minors against the driver's files (gpu<minor> in their paths).
while read -r kind gpu gi ci gim cim; do
	[ "$kind" = cap ] || continue
	minor=$(awk -v g="$gpu" '$1 == "minor" && $2 == g { print $3 }' "$tmp/nri")
	dir="$PROC/driver/nvidia/capabilities/gpu$minor/mig/gi$gi"
	for f in "$dir/access:$gim" "$dir/ci$ci/access:$cim"; do
		file=${f%:*}
		want=${f##*:}
		got=$(awk -F': *' '$1 == "DeviceFileMinor" { print $2 }' "$file" 2>/dev/null || true)
		if [ "$got" != "$want" ]; then
			echo "capability minor: $file says ${got:-nothing}, nri-gpu uses $want"
			status=1
		fi
	done
done < "$tmp/nri"

if [ "$status" = 0 ]; then
	echo "OK: $(grep -c '^dev ' "$tmp/a") MIG devices agree with nvidia-smi and the driver's capability files"
fi
exit "$status"
