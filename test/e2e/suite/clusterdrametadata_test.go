package suite

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"

	"github.com/nri-gpu/nri-gpu/test/simnode"
)

// draRequest is the request name of the DRA phase's claims.
const draRequest = "gpu"

// checkDeviceMetadata checks, in the claim pod v's container main, the
// device metadata file (KEP-5304) of each of its claims, at the path
// Kubernetes' library defines (resourceclaims/<claim> for a claim the
// pod names, resourceclaimtemplates/<pod claim name> for one made from a
// template): it is read-only, the library's decoder reads it and its
// validation passes, and it names the claim (name, namespace, UID, pod
// claim name), the request, and exactly the allocation's devices of
// nri-gpu's driver on the pod's node, each with the UUID of the node's
// GPU of that name.
func checkDeviceMetadata(k kc, v claimView) {
	k.t.Helper()
	p := v.pod
	n := k.c.Node(p.Spec.NodeName)
	for _, rc := range p.Spec.ResourceClaims {
		path, claimName := "", ""
		var podClaim *string
		if rc.ResourceClaimName != nil {
			claimName = *rc.ResourceClaimName
			path = metadata.ResourceClaimFilePath(draDriver, claimName, draRequest)
		} else {
			for _, st := range p.Status.ResourceClaimStatuses {
				if st.Name == rc.Name && st.ResourceClaimName != nil {
					claimName = *st.ResourceClaimName
				}
			}
			name := rc.Name
			podClaim = &name
			path = metadata.ResourceClaimTemplateFilePath(draDriver, rc.Name, draRequest)
		}
		var c resourceapi.ResourceClaim
		if err := k.c.GetJSON(k.ctx, &c, "resourceclaim", "-n", p.Namespace, claimName); err != nil {
			k.t.Fatal(err)
		}
		out, err := k.c.Exec(k.ctx, p.Namespace, p.Name, "main", "sh", "-c", fmt.Sprintf(`if (echo x >> %[1]s) 2>/dev/null; then echo WRITABLE; fi; cat %[1]s`, path))
		if err != nil {
			k.t.Errorf("pod %s: reading its device metadata %s: %v\n%s", p.Name, path, err, out)
			continue
		}
		if strings.HasPrefix(out, "WRITABLE") {
			k.t.Errorf("pod %s: its device metadata %s is writable", p.Name, path)
		}
		var got metadata.DeviceMetadata
		var verr error
		if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(strings.NewReader(out)), &got, devicemetadata.DecodeMetadataWithValidationResult(&verr)); err != nil || verr != nil {
			k.t.Errorf("pod %s: decoding its device metadata %s: %v, validation %v\n%s", p.Name, path, err, verr, out)
			continue
		}
		if got.Name != c.Name || got.Namespace != c.Namespace || got.UID != c.UID || fmt.Sprint(deref(got.PodClaimName)) != fmt.Sprint(deref(podClaim)) {
			k.t.Errorf("pod %s: device metadata names claim %s/%s (%s, pod claim %q), want %s/%s (%s, %q)", p.Name, got.Namespace, got.Name, got.UID,
				deref(got.PodClaimName), c.Namespace, c.Name, c.UID, deref(podClaim))
		}
		var want, have []string
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == draDriver && r.Request == draRequest {
				want = append(want, r.Pool+"/"+r.Device+"="+gpuUUID(n.GPU.GPUs, r.Device))
			}
		}
		if len(got.Requests) != 1 || got.Requests[0].Name != draRequest {
			k.t.Errorf("pod %s: device metadata requests %+v, want one, %s", p.Name, got.Requests, draRequest)
			continue
		}
		for _, d := range got.Requests[0].Devices {
			uuid := ""
			if a, ok := d.Attributes["gpu.nvidia.com/uuid"]; ok && a.StringValue != nil {
				uuid = *a.StringValue
			}
			if d.Driver != draDriver {
				k.t.Errorf("pod %s: device metadata device %s of driver %s", p.Name, d.Name, d.Driver)
			}
			have = append(have, d.Pool+"/"+d.Name+"="+uuid)
		}
		slices.Sort(want)
		slices.Sort(have)
		if !slices.Equal(want, have) || len(want) == 0 {
			k.t.Errorf("pod %s: device metadata devices %q, want the allocation's %q", p.Name, have, want)
		}
	}
}

// checkNoDeviceMetadata checks that the pod v's container main, which
// has no claim, has no device metadata directory.
func checkNoDeviceMetadata(k kc, v gpuPodView) {
	k.t.Helper()
	out, err := k.c.Exec(k.ctx, v.pod.Namespace, v.pod.Name, "main", "sh", "-c", "ls -R "+metadata.ContainerDir+" 2>/dev/null; true")
	if err != nil || strings.TrimSpace(out) != "" {
		k.t.Errorf("pod %s (no claim): device metadata %v\n%s", v.pod.Name, err, out)
	}
}

// gpuUUID is the UUID of the GPU of DRA device name gpu-<minor>.
func gpuUUID(gpus []simnode.GPU, device string) string {
	for _, g := range gpus {
		if device == fmt.Sprintf("gpu-%d", g.Minor) {
			return g.UUID
		}
	}
	return ""
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// checkDeviceMetadataAll checks the device metadata of every claim pod
// of views, and that the device plugin's pod dp has none.
func checkDeviceMetadataAll(k kc, views map[string]claimView, dp gpuPodView) {
	k.t.Helper()
	start := time.Now()
	names := slices.Sorted(maps.Keys(views))
	for _, name := range names {
		checkDeviceMetadata(k, views[name])
	}
	checkNoDeviceMetadata(k, dp)
	k.t.Logf("device metadata of %d claim pods checked in %s", len(names), time.Since(start).Round(10*time.Millisecond))
}
