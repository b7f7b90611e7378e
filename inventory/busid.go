package inventory

import (
	"fmt"
	"strings"
)

// NormalizeBusID returns a PCI bus id in the 4-digit-domain, lower-case form
// that /proc uses ("0000:38:00.0"). It accepts NVML's 8-digit domain
// ("00000000:38:00.0"), whose upper digits must be zero.
func NormalizeBusID(s string) (string, error) {
	s = strings.ToLower(s)
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(rest) != 7 || rest[2] != ':' || rest[5] != '.' {
		return "", fmt.Errorf("bad PCI bus id %q", s)
	}
	switch len(dom) {
	case 4:
	case 8:
		if dom[:4] != "0000" {
			return "", fmt.Errorf("bad PCI bus id %q", s)
		}
		dom = dom[4:]
	default:
		return "", fmt.Errorf("bad PCI bus id %q", s)
	}
	for _, p := range []string{dom, rest[0:2], rest[3:5]} {
		for i := 0; i < len(p); i++ {
			if !isHex(p[i]) {
				return "", fmt.Errorf("bad PCI bus id %q", s)
			}
		}
	}
	if f := rest[6]; f < '0' || f > '7' {
		return "", fmt.Errorf("bad PCI bus id %q", s)
	}
	return dom + ":" + rest, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
