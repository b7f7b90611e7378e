package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-gpu/nri-gpu/adjust"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/policy"
	"github.com/nri-gpu/nri-gpu/internal/nodestate/sharing"
	"github.com/nri-gpu/nri-gpu/internal/requestpath/alloc"
)

// NVIDIA's k8s-device-plugin as partner: containers shaped exactly as
// each of its DEVICE_LIST_STRATEGY outputs reaches NRI CreateContainer,
// after the kubelet turned its Allocate answer into the CRI container
// config and containerd built the spec (internal/plugin/server.go,
// getAllocateResponse):
//
//   - envvar: Envs NVIDIA_VISIBLE_DEVICES=<IDs> (DEVICE_ID_STRATEGY=uuid:
//     UUIDs), which replaces the image's value.
//   - volume-mounts: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices
//     and one mount of /dev/null at /var/run/nvidia-container-devices/<ID>
//     per GPU.
//   - PASS_DEVICE_SPECS=true (with envvar or volume-mounts): DeviceSpecs
//     of the GPUs' nodes and of the control nodes that exist
//     (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools,
//     /dev/nvidia-modeset), which the runtime puts in the container's
//     device list with their numbers.
//   - cdi-annotations: the container annotation
//     cdi.k8s.io/nvidia-device-plugin_<response UUID> =
//     k8s.device-plugin.nvidia.com/gpu=<ID>,...; the runtime resolves the
//     devices from the plugin's CDI spec: device nodes, the driver's
//     files, NVIDIA_VISIBLE_DEVICES=void. No env from the plugin, no
//     DeviceSpecs (PASS_DEVICE_SPECS does not apply to CDI strategies).
//   - cdi-cri: the same devices as the CRI CDIDevices field, which NRI
//     lists as the container's CDI devices.

// nvidiaPluginCDIKind is the vendor/class of NVIDIA's device plugin's CDI
// devices (cdi.WithVendor("k8s.device-plugin.nvidia.com"), class gpu).
const nvidiaPluginCDIKind = "k8s.device-plugin.nvidia.com/gpu"

// nvidiaPluginContainer is a container of a pod given GPUs gpus by
// NVIDIA's device plugin with the strategy, as NRI receives it. The image
// is nvidia/cuda's: NVIDIA_VISIBLE_DEVICES=all,
// NVIDIA_DRIVER_CAPABILITIES=compute,utility.
func nvidiaPluginContainer(id, strategy string, passSpecs bool, gpus ...int) *api.Container {
	prep := adjust.Prepare(benchSnapshot(), layout)
	ctl := prep.Snapshot().Control
	c := &api.Container{Id: id, PodSandboxId: "p-" + id, Name: "main", Annotations: map[string]string{"io.kubernetes.cri.container-type": "container"}}
	visible := "all"
	ids := make([]string, 0, len(gpus))
	for _, g := range gpus {
		ids = append(ids, uuid(g))
	}
	runtimeNodes := func() {
		c.Linux = pluginLinux(gpus...)
		for _, n := range []int{0, 1, 2, 3} {
			d := [...]*struct {
				path         string
				major, minor int64
			}{{ctl.Ctl.Path, ctl.Ctl.Major, ctl.Ctl.Minor}, {ctl.UVM.Path, ctl.UVM.Major, ctl.UVM.Minor},
				{ctl.UVMTools.Path, ctl.UVMTools.Major, ctl.UVMTools.Minor}, {ctl.Modeset.Path, ctl.Modeset.Major, ctl.Modeset.Minor}}[n]
			c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: d.path, Type: "c", Major: d.major, Minor: d.minor})
		}
	}
	switch strategy {
	case "envvar":
		visible = strings.Join(ids, ",")
	case "volume-mounts":
		visible = "/var/run/nvidia-container-devices"
		for _, id := range ids {
			c.Mounts = append(c.Mounts, &api.Mount{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/" + id, Type: "bind",
				Options: []string{"rbind", "rprivate", "rw"}})
		}
	case "cdi-annotations", "cdi-cri":
		names := make([]string, 0, len(ids))
		for _, id := range ids {
			names = append(names, nvidiaPluginCDIKind+"="+id)
		}
		if strategy == "cdi-annotations" {
			c.Annotations["cdi.k8s.io/nvidia-device-plugin_0b7a4bba-5f7e-4e4b-9d3f-4c1d5e0f2a11"] = strings.Join(names, ",")
		} else {
			for _, n := range names {
				c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: n})
			}
		}
		// What the runtime resolved from the plugin's CDI spec.
		runtimeNodes()
		c.Mounts = append(c.Mounts,
			&api.Mount{Source: "/usr/lib64/libcuda.so.580.126.09", Destination: "/usr/lib64/libcuda.so.580.126.09", Type: "bind", Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}},
			&api.Mount{Source: "/usr/bin/nvidia-smi", Destination: "/usr/bin/nvidia-smi", Type: "bind", Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}})
		c.Env = append(c.Env, "NVIDIA_VISIBLE_DEVICES=void")
	default:
		panic(strategy)
	}
	if passSpecs && !strings.HasPrefix(strategy, "cdi") {
		runtimeNodes()
	}
	c.Env = append([]string{"PATH=/usr/local/nvidia/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=" + visible, "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}, c.Env...)
	if strings.HasPrefix(strategy, "cdi") {
		// The image's value stays; the CDI spec's void comes after it.
		c.Env[1] = "NVIDIA_VISIBLE_DEVICES=all"
	}
	return c
}

// TestNVIDIADevicePluginStrategies: each DEVICE_LIST_STRATEGY of NVIDIA's
// device plugin, with and without PASS_DEVICE_SPECS, under the shipped
// closed policy (policy.default: deny) and an open one. What the runtime
// gave (device nodes; CDI devices it resolved) is the kubelet's
// allocation: booked as the runtime's choice (never re-picked, never
// handed to a count request), never injected a second time. Env, /dev/null
// mounts and annotations alone are what a pod author can write too: the
// policy governs them as any request.
func TestNVIDIADevicePluginStrategies(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	closed := policy.Policy{Default: policy.DefaultDeny}
	closed.SetDefaults()
	open := policy.Policy{}
	open.SetDefaults()
	const (
		booked    = "booked, driver files once" // the runtime's GPUs, nri-gpu adds the driver's files and no node
		runtimes  = "booked, nothing injected"  // the runtime's CDI did it all
		voided    = "voided"                    // env ignored: NVIDIA_VISIBLE_DEVICES=void, nothing else
		refused   = "refused"                   // the container is refused
		requested = "served as a request"       // nri-gpu injects GPUs 1 and 3 as for any request
	)
	for _, tc := range []struct {
		strategy   string
		passSpecs  bool
		closed, op string
	}{
		{"envvar", false, voided, requested},
		{"envvar", true, booked, booked},
		{"volume-mounts", false, refused, requested},
		{"volume-mounts", true, booked, booked},
		{"cdi-annotations", false, runtimes, runtimes},
		{"cdi-cri", false, runtimes, runtimes},
	} {
		for _, pc := range []struct {
			name string
			pol  policy.Policy
			want string
		}{{"closed", closed, tc.closed}, {"open", open, tc.op}} {
			name := fmt.Sprintf("%s/PASS_DEVICE_SPECS=%v/%s", tc.strategy, tc.passSpecs, pc.name)
			t.Run(name, func(t *testing.T) {
				table := tableFor(prep.Snapshot())
				ctr := nvidiaPluginContainer("c", tc.strategy, tc.passSpecs, 1, 3)
				pod := &api.PodSandbox{Id: "p-c", Name: "train", Namespace: "tenant-a"}
				adj, _, err := handleWithPolicy(prep, table, sharing.Shared, pc.pol, pod, ctr)
				if pc.want == refused {
					if err == nil || !strings.Contains(err.Error(), "PASS_DEVICE_SPECS=true") {
						t.Errorf("err %v, want a refusal that names PASS_DEVICE_SPECS=true", err)
					}
					if len(table.Holdings()) != 0 {
						t.Errorf("holdings %+v", table.Holdings())
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				var gpuNodes, ctlNodes []string
				for _, p := range devicePaths(adj) {
					if strings.HasPrefix(p, "/dev/nvidia") && p[len("/dev/nvidia")] >= '0' && p[len("/dev/nvidia")] <= '9' {
						gpuNodes = append(gpuNodes, p)
					} else {
						ctlNodes = append(ctlNodes, p)
					}
				}
				hs := table.Holdings()
				switch pc.want {
				case booked, runtimes:
					if len(hs) != 1 || !slices.Equal(hs[0].GPUs, []int{1, 3}) || !hs[0].Runtime || hs[0].Holder.ID != "c" {
						t.Errorf("holdings %+v, want GPUs 1 and 3 booked as the runtime's", hs)
					}
					// Synchronize (an nri-gpu, kubelet or containerd
					// restart) rebuilds the same holding from the
					// container's device nodes (and CDI devices).
					ctr.State = api.ContainerState_CONTAINER_RUNNING
					ctr.Annotations = mergeAnn(ctr.Annotations, adj.GetAnnotations())
					rebuilt, warnings := holdings(prep, sharing.Shared, []*api.PodSandbox{pod}, []*api.Container{ctr})
					if len(warnings) != 0 || len(rebuilt) != 1 || !slices.Equal(rebuilt[0].GPUs, []int{1, 3}) || !rebuilt[0].Runtime {
						t.Errorf("rebuilt %+v, %q; want GPUs 1 and 3 as the runtime's", rebuilt, warnings)
					}
					if len(gpuNodes) != 0 || (tc.passSpecs || pc.want == runtimes) && len(ctlNodes) != 0 {
						t.Errorf("device nodes added %q: the runtime gave them", devicePaths(adj))
					}
					if pc.want == runtimes {
						if len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0 {
							t.Errorf("injected %v: the runtime's CDI already did", adj)
						}
						return
					}
					if len(adj.GetMounts()) == 0 {
						t.Error("no driver files injected")
					}
					if got, want := envOf(adj)["NVIDIA_VISIBLE_DEVICES"], uuid(1)+","+uuid(3); got != want {
						t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", got, want)
					}
				case voided:
					if len(hs) != 0 || len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0 || envOf(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" {
						t.Errorf("adjustment %v, holdings %+v: want NVIDIA_VISIBLE_DEVICES=void and nothing else", adj, hs)
					}
				case requested:
					if len(hs) != 1 || !slices.Equal(hs[0].GPUs, []int{1, 3}) || hs[0].Runtime {
						t.Errorf("holdings %+v, want GPUs 1 and 3 booked by nri-gpu", hs)
					}
					if !slices.Equal(gpuNodes, []string{"/dev/nvidia1", "/dev/nvidia3"}) || len(adj.GetMounts()) == 0 {
						t.Errorf("adjustment %v: want GPUs 1 and 3 and the driver's files", adj)
					}
				}
			})
		}
	}
}

// mergeAnn returns a with b's entries added (what the runtime keeps of an
// adjustment's annotations).
func mergeAnn(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// TestDevicePluginCDIDevicesHold: CDI devices of NVIDIA's device plugin
// (k8s.device-plugin.nvidia.com/gpu=<UUID or index>) that the runtime
// lists are GPUs the runtime gave: held at CreateContainer and at
// Synchronize without a device node, and nothing is injected on top of
// them. (Before, only nvidia.com/gpu names counted: nri-gpu injected the
// driver a second time and a count request could take the GPU.)
func TestDevicePluginCDIDevicesHold(t *testing.T) {
	prep := adjust.Prepare(benchSnapshot(), layout)
	table := tableFor(prep.Snapshot())
	pod := &api.PodSandbox{Id: "p", Name: "p", Namespace: "ml"}
	ctr := &api.Container{Id: "c", PodSandboxId: "p", Name: "c", Env: []string{"NVIDIA_VISIBLE_DEVICES=all"},
		CDIDevices: []*api.CDIDevice{{Name: DevicePluginCDIKind + "=" + uuid(2)}, {Name: DevicePluginCDIKind + "=5"}}}
	adj, _, err := handle(prep, table, sharing.Exclusive, pod, ctr)
	if err != nil || len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0 {
		t.Fatalf("%v, %v: want nothing injected", adj, err)
	}
	if got, want := alloc.Summary(table.State()), "0=free 1=free 2=exclusive[ml/p/c] 3=free 4=free 5=exclusive[ml/p/c] 6=free 7=free"; got != want {
		t.Errorf("table %s\nwant %s", got, want)
	}
	ctr.State = api.ContainerState_CONTAINER_RUNNING
	hs, warnings := holdings(prep, sharing.Exclusive, []*api.PodSandbox{pod}, []*api.Container{ctr})
	if len(warnings) != 0 || len(hs) != 1 || !slices.Equal(hs[0].GPUs, []int{2, 5}) || !hs[0].Runtime {
		t.Errorf("rebuilt %+v, %q", hs, warnings)
	}
}
