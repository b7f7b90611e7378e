package dra

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-gpu/nri-gpu/internal/requestpath/claims"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// CDIKind is the CDI kind of the devices of prepared claims under a
// driver name: k8s.<driver>/claim, as NVIDIA's k8s.gpu.nvidia.com/claim.
func CDIKind(driver string) string { return "k8s." + driver + "/claim" }

// cdiName is the CDI device name of a claim's device: the claim's UID
// and the device's name, never reused (runtimes cache CDI specs).
func cdiName(claimUID, device string) string { return claimUID + "-" + device }

// specFile is the file name of a claim's CDI spec in the CDI directory:
// the kind with '/' as '-', then the claim's UID.
func specFile(driver, claimUID string) string {
	return strings.ReplaceAll(CDIKind(driver), "/", "-") + "_" + claimUID + ".json"
}

// identity returns the device nodes a claim device's CDI device gives a
// container and the one that identifies it: a GPU's /dev/nvidia<minor>;
// a MIG device's parent node and its GPU and compute instance capability
// nodes, identified by the compute instance's. The driver's node-wide
// nodes (nvidiactl, nvidia-uvm) and every driver file are not here: the
// NRI side adds them at CreateContainer from the live inventory.
func identity(u unit) (id inventory.DeviceNode, nodes []inventory.DeviceNode) {
	if m := u.gpu.MIG; m != nil {
		return m.CINode, []inventory.DeviceNode{u.parent.Node, m.GINode, m.CINode}
	}
	return u.gpu.Node, []inventory.DeviceNode{u.gpu.Node}
}

// claimSpec returns the CDI spec of one prepared claim: a device per
// claim device with its device nodes (hostPath under devRoot where the
// host's device directory is not /dev) and the environment entry that
// names its claim for the NRI side (claims.EnvKey). No hooks, no mounts,
// no driver path: nothing in it goes stale when the driver is upgraded.
func claimSpec(driver, devRoot, claimUID string, devs []claims.Device, nodes map[string]inventory.DeviceNode) (*specs.Spec, error) {
	spec := &specs.Spec{Kind: CDIKind(driver)}
	for _, d := range devs {
		edits := specs.ContainerEdits{Env: []string{claims.EnvKey(d.Name) + "=" + claimUID}}
		for _, p := range d.Nodes {
			n, ok := nodes[p]
			if !ok {
				return nil, fmt.Errorf("build CDI spec: device %s: no device node %s on the node", d.Name, p)
			}
			edits.DeviceNodes = append(edits.DeviceNodes, cdiNode(n, devRoot))
		}
		spec.Devices = append(spec.Devices, specs.Device{Name: cdiName(claimUID, d.Name), ContainerEdits: edits})
	}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("build CDI spec: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// cdiNode is a device node of a CDI spec, with its numbers, so that the
// runtime need not find it on the host to create it.
func cdiNode(n inventory.DeviceNode, devRoot string) *specs.DeviceNode {
	major, minor := n.Major, n.Minor
	d := &specs.DeviceNode{Path: n.Path, Type: "c", Major: major, Minor: minor, Permissions: "rw"}
	if devRoot != "" && devRoot != "/dev" {
		d.HostPath = filepath.Join(devRoot, strings.TrimPrefix(n.Path, "/dev/"))
	}
	if n.Mode != 0 {
		m := os.FileMode(n.Mode)
		d.FileMode = &m
	}
	if n.GID != 0 {
		g := n.GID
		d.GID = &g
	}
	return d
}

// writeSpec writes a claim's spec into dir atomically (a temporary file
// that the runtime's CDI cache ignores, then a rename), so that a runtime
// reading the directory sees the whole spec or none.
func writeSpec(dir, driver, claimUID string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	return writeAtomic(filepath.Join(dir, specFile(driver, claimUID)), data, 0o644)
}

// removeSpec removes a claim's spec; a spec that is not there is no error.
func removeSpec(dir, driver, claimUID string) error {
	err := os.Remove(filepath.Join(dir, specFile(driver, claimUID)))
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove CDI spec: %w", err)
	}
	return nil
}

// ownSpecs returns the claim UIDs whose specs of this driver are in dir.
func ownSpecs(dir, driver string) ([]string, error) {
	prefix := strings.ReplaceAll(CDIKind(driver), "/", "-") + "_"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read CDI directory: %w", err)
	}
	var uids []string
	for _, e := range ents {
		if uid, ok := strings.CutPrefix(e.Name(), prefix); ok && strings.HasSuffix(uid, ".json") && e.Type().IsRegular() {
			uids = append(uids, strings.TrimSuffix(uid, ".json"))
		}
	}
	return uids, nil
}

// writeAtomic writes data to path through a temporary file in the same
// directory, synced, then renamed over path, and syncs the directory.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
