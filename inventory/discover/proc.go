package discover

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/nri-gpu/nri-gpu/inventory"
)

// GPUInfo is what /proc/driver/nvidia/gpus/<bus>/information says of a GPU.
type GPUInfo struct {
	Model    string
	UUID     string
	BusID    string
	Minor    int
	Excluded bool
}

// maxProcLine bounds the lines read from procfs files: real ones are short.
const maxProcLine = 4096

// ParseGPUInformation parses the information file of one GPU: one
// "Key: value" per line, split on the first colon. It fails when the UUID,
// bus location or device minor is missing or malformed.
func ParseGPUInformation(data []byte) (GPUInfo, error) {
	var info GPUInfo
	var haveMinor bool
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 256), maxProcLine)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "Model":
			info.Model = val
		case "GPU UUID":
			info.UUID = val
		case "Bus Location":
			info.BusID = val
		case "Device Minor":
			m, err := strconv.Atoi(val)
			if err != nil || m < 0 || m > 254 {
				return GPUInfo{}, fmt.Errorf("bad Device Minor %q", val)
			}
			info.Minor, haveMinor = m, true
		case "GPU Excluded":
			info.Excluded = strings.EqualFold(val, "yes")
		}
	}
	if err := sc.Err(); err != nil {
		return GPUInfo{}, err
	}
	if !haveMinor {
		return GPUInfo{}, fmt.Errorf("no Device Minor")
	}
	if !validUUID(info.UUID) {
		return GPUInfo{}, fmt.Errorf("bad GPU UUID %q", info.UUID)
	}
	if info.BusID != "" {
		b, err := inventory.NormalizeBusID(info.BusID)
		if err != nil {
			return GPUInfo{}, err
		}
		info.BusID = b
	}
	return info, nil
}

// validUUID reports whether s is a GPU UUID: "GPU-" and 32 hex digits in
// groups 8-4-4-4-12.
func validUUID(s string) bool {
	if len(s) != 40 || !strings.EqualFold(s[:4], "GPU-") {
		return false
	}
	for i, c := range s[4:] {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !isHex(byte(c)) {
				return false
			}
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// ParseProcDevices returns the character device majors of /proc/devices by
// driver name.
func ParseProcDevices(data []byte) (map[string]int64, error) {
	majors := make(map[string]int64)
	inChar := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 256), maxProcLine)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case strings.HasSuffix(line, "devices:"):
			inChar = line == "Character devices:"
			continue
		case !inChar:
			continue
		}
		num, name, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("/proc/devices: malformed line %q", line)
		}
		major, err := strconv.ParseInt(num, 10, 32)
		if err != nil || major < 0 || major > 4095 {
			return nil, fmt.Errorf("/proc/devices: bad major in line %q", line)
		}
		majors[strings.TrimSpace(name)] = major
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/proc/devices: %w", err)
	}
	return majors, nil
}

// ParseDriverVersion returns the kernel module's version from
// /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
// Module  580.126.09  Release Build ...") or /sys/module/nvidia/version
// ("580.126.09").
func ParseDriverVersion(data []byte) (string, error) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) == 1 && validVersion(fields[0]) {
		return fields[0], nil
	}
	for i, f := range fields {
		if f == "Module" && i+1 < len(fields) && validVersion(fields[i+1]) {
			return fields[i+1], nil
		}
	}
	for _, f := range fields {
		if validVersion(f) && strings.Contains(f, ".") {
			return f, nil
		}
	}
	return "", fmt.Errorf("no driver version in %q", truncate(string(line), 120))
}

// validVersion reports whether s looks like a driver version: digits and
// dots, starting and ending with a digit.
func validVersion(s string) bool {
	if s == "" || len(s) > 32 || s[0] == '.' || s[len(s)-1] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// FirmwareFromInitNamespace reports whether a kernel of the given release
// (the content of /proc/sys/kernel/osrelease, "6.8.0-49-generic") reads
// the firmware a driver requests from the mount namespace of init, that
// is from the host's /lib/firmware whichever process opened the device:
// Linux 5.7 and later ("firmware_loader: load files from the mount
// namespace of init"). Older kernels read it from the root of the process
// that triggered the load, which may be a container opening a GPU first.
func FirmwareFromInitNamespace(release string) (bool, error) {
	major, minor, ok := kernelVersion(release)
	if !ok {
		return false, fmt.Errorf("kernel release %q does not start with <major>.<minor>", release)
	}
	return major > 5 || major == 5 && minor >= 7, nil
}

// kernelVersion parses the major and minor numbers of a kernel release.
func kernelVersion(release string) (major, minor int, ok bool) {
	rest := strings.TrimSpace(release)
	num := func() (int, bool) {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || i > 4 {
			return 0, false
		}
		n, _ := strconv.Atoi(rest[:i])
		rest = rest[i:]
		return n, true
	}
	if major, ok = num(); !ok || !strings.HasPrefix(rest, ".") {
		return 0, 0, false
	}
	rest = rest[1:]
	if minor, ok = num(); !ok {
		return 0, 0, false
	}
	return major, minor, true
}
