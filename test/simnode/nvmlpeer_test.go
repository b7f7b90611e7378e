package simnode

import (
	"debug/elf"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// definedFuncs returns the functions library p defines, from its ELF
// dynamic symbol table (what dlsym finds).
func definedFuncs(t *testing.T, p string) map[string]bool {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			out[s.Name] = true
		}
	}
	return out
}

// TestNVMLExportsEverySymbol reads the simulated libnvidia-ml.so.1's
// dynamic symbols: every function NVIDIA's go-nvml binds is there (a
// missing one kills NVIDIA's DRA driver with "symbol lookup error" when
// called), the library built without the property functions lacks those,
// as a library from before them, and nothing else.
func TestNVMLExportsEverySymbol(t *testing.T) {
	t.Parallel()
	syms := NVMLSymbols()
	if len(syms) < 400 {
		t.Fatalf("nvml_symbols.txt lists %d functions; go-nvml v0.13.3-1 binds 413", len(syms))
	}
	for _, f := range NVMLImplemented() {
		if !slices.Contains(syms, f) {
			t.Errorf("nvml.c implements %s, which go-nvml does not bind (a misspelt name?)", f)
		}
	}
	n, err := Generate(t.TempDir(), Options{NumGPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	got := definedFuncs(t, n.HostPath(filepath.Join(n.LibDir, "libnvidia-ml.so.1")))
	for _, s := range syms {
		if !got[s] {
			t.Errorf("libnvidia-ml.so.1 does not export %s", s)
		}
	}

	old, err := Generate(t.TempDir(), Options{NumGPUs: 1, NVMLWithoutProps: true})
	if err != nil {
		t.Fatal(err)
	}
	got = definedFuncs(t, old.HostPath(filepath.Join(old.LibDir, "libnvidia-ml.so.1")))
	for _, s := range []string{"nvmlDeviceGetBrand", "nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceById", "nvmlDeviceGetGpuInstancePossiblePlacements_v2"} {
		if got[s] {
			t.Errorf("the library without properties exports %s", s)
		}
	}
	for _, s := range []string{"nvmlInit_v2", "nvmlInitWithFlags", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetFanSpeed"} {
		if !got[s] {
			t.Errorf("the library without properties does not export %s", s)
		}
	}
}

// nvmlProbeC calls the simulated NVML as NVIDIA's DRA driver does
// (nested init and shutdown, the GPU and MIG walk, possible placements,
// compute instances) and prints what it answers, one fact a line.
const nvmlProbeC = `#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef struct { unsigned int start, size; } placement;
typedef struct { unsigned int id, p2p, slices, count, sm, ce, dec, enc, jpeg, ofa; unsigned long long mem; } gipinfo;
typedef struct { void *dev; unsigned int id, profileId; placement pl; } giinfo;
typedef struct { unsigned int id, slices, count, sm, ce, dec, enc, jpeg, ofa; } cipinfo;
typedef struct { void *dev, *gi; unsigned int id, profileId; placement pl; } ciinfo;
#define F(ret, name, args) ret (*name) args = (ret (*) args)dlsym(h, #name); if (!name) { printf("missing %s\n", #name); return 1; }
int main(void)
{
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (h == NULL) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	F(int, nvmlInit_v2, (void)) F(int, nvmlInitWithFlags, (unsigned int)) F(int, nvmlShutdown, (void))
	F(int, nvmlDeviceGetCount_v2, (unsigned int *)) F(int, nvmlDeviceGetHandleByIndex_v2, (unsigned int, void **))
	F(int, nvmlDeviceGetMinorNumber, (void *, unsigned int *)) F(int, nvmlDeviceGetIndex, (void *, unsigned int *))
	F(int, nvmlDeviceIsMigDeviceHandle, (void *, unsigned int *)) F(int, nvmlDeviceGetMigDeviceHandleByIndex, (void *, unsigned int, void **))
	F(int, nvmlDeviceGetMaxMigDeviceCount, (void *, unsigned int *))
	F(int, nvmlDeviceGetGpuInstanceProfileInfo, (void *, unsigned int, gipinfo *))
	F(int, nvmlDeviceGetGpuInstancePossiblePlacements_v2, (void *, unsigned int, placement *, unsigned int *))
	F(int, nvmlDeviceGetGpuInstanceId, (void *, unsigned int *)) F(int, nvmlDeviceGetComputeInstanceId, (void *, unsigned int *))
	F(int, nvmlDeviceGetGpuInstanceById, (void *, unsigned int, void **)) F(int, nvmlGpuInstanceGetInfo, (void *, giinfo *))
	F(int, nvmlGpuInstanceGetComputeInstanceById, (void *, unsigned int, void **))
	F(int, nvmlGpuInstanceGetComputeInstanceProfileInfo, (void *, unsigned int, unsigned int, cipinfo *))
	F(int, nvmlComputeInstanceGetInfo_v2, (void *, ciinfo *)) F(int, nvmlDeviceGetHandleByUUID, (const char *, void **))
	F(int, nvmlDeviceGetUUID, (void *, char *, unsigned int)) F(int, nvmlDeviceGetFanSpeed, (void *, unsigned int *))
	F(int, nvmlDeviceCreateGpuInstance, (void *, unsigned int, void **))

	unsigned int n = 0, v = 0;
	printf("shutdown-before-init %d\n", nvmlShutdown());
	printf("init %d %d\n", nvmlInit_v2(), nvmlInitWithFlags(1));
	printf("inner-shutdown %d\n", nvmlShutdown());
	int rc = nvmlDeviceGetCount_v2(&n);
	printf("count %d %u\n", rc, n);
	for (unsigned int i = 0; i < n; i++) {
		void *d, *m;
		unsigned int minor = 0, idx = 0, ismig = 9, max = 0;
		nvmlDeviceGetHandleByIndex_v2(i, &d);
		int r1 = nvmlDeviceGetMinorNumber(d, &minor), r2 = nvmlDeviceGetIndex(d, &idx);
		int r3 = nvmlDeviceIsMigDeviceHandle(d, &ismig), r4 = nvmlDeviceGetFanSpeed(d, &v);
		printf("gpu %u minor %d %u index %d %u mig-handle %d %u fan %d\n", i, r1, minor, r2, idx, r3, ismig, r4);
		for (unsigned int p = 0; p < 0x12; p++) {
			gipinfo info;
			if (nvmlDeviceGetGpuInstanceProfileInfo(d, p, &info) != 0)
				continue;
			unsigned int c = 0;
			int r = nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, info.id, NULL, &c);
			placement pl[8];
			unsigned int c2 = c;
			int r2 = nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, info.id, pl, &c2);
			printf("gpu %u profile %u id %u placements %d %d %u:", i, p, info.id, r, r2, c2);
			for (unsigned int k = 0; k < c2; k++)
				printf(" %u+%u", pl[k].start, pl[k].size);
			printf("\n");
		}
		if (nvmlDeviceGetMaxMigDeviceCount(d, &max) != 0)
			continue;
		for (unsigned int k = 0; k < max; k++) {
			if (nvmlDeviceGetMigDeviceHandleByIndex(d, k, &m) != 0)
				continue;
			unsigned int giid, ciid;
			void *gi, *ci, *byuuid = NULL;
			giinfo gii;
			ciinfo cii;
			char uuid[96];
			nvmlDeviceIsMigDeviceHandle(m, &ismig);
			nvmlDeviceGetUUID(m, uuid, sizeof uuid);
			nvmlDeviceGetHandleByUUID(uuid, &byuuid);
			if (nvmlDeviceGetGpuInstanceId(m, &giid) || nvmlDeviceGetGpuInstanceById(d, giid, &gi) || nvmlGpuInstanceGetInfo(gi, &gii) ||
			    nvmlDeviceGetComputeInstanceId(m, &ciid) || nvmlGpuInstanceGetComputeInstanceById(gi, ciid, &ci) ||
			    nvmlComputeInstanceGetInfo_v2(ci, &cii)) {
				printf("mig %u %u: walk failed\n", i, k);
				continue;
			}
			printf("mig %u %u mig-handle %u by-uuid %d gi %u profile %u at %u+%u ci %u profile %u at %u+%u ci-device %d ci-gi %d\n",
				i, k, ismig, byuuid == m, gii.id, gii.profileId, gii.pl.start, gii.pl.size, cii.id, cii.profileId, cii.pl.start, cii.pl.size,
				cii.dev == m, cii.gi == gi);
			for (unsigned int cp = 0; cp < 9; cp++) {
				cipinfo ci;
				int r = nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cp, 0, &ci);
				if (r == 0)
					printf("mig %u %u ciprofile %u id %u slices %u count %u sm %u ce %u\n", i, k, cp, ci.id, ci.slices, ci.count, ci.sm, ci.ce);
			}
			printf("mig %u %u ciprofile engines-1 %d\n", i, k, nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 1, NULL));
		}
	}
	void *gi;
	printf("create-gi %d\n", nvmlDeviceCreateGpuInstance(NULL, 0, &gi));
	printf("last-shutdown %d\n", nvmlShutdown());
	void *d;
	printf("after %d %d\n", nvmlDeviceGetHandleByIndex_v2(0, &d), nvmlShutdown());
	return 0;
}
`

// TestNVMLAsNVIDIAsDriverCallsIt runs nvmlProbeC against a node with
// MixedMIG's layout: a nested nvmlShutdown leaves the library initialized
// and the last one uninitializes it; every GPU has its minor and index;
// each GPU instance profile's possible placements are all its places
// (nvidia-smi mig -lgipp's); each MIG device's GPU and compute instance
// are found by id, with their profiles and placements; a function the
// library does not implement answers NOT_SUPPORTED.
func TestNVMLAsNVIDIAsDriverCallsIt(t *testing.T) {
	t.Parallel()
	n, err := Generate(t.TempDir(), Options{NumGPUs: 3, SwapMinors: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WriteNVMLState(MixedMIG()); err != nil {
		t.Fatal(err)
	}
	dir, err := cacheDir("")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := buildELF(dir, elfJob{name: "nvml-probe", source: nvmlProbeC})
	if err != nil {
		t.Fatal(err)
	}
	out := run(t, bin, []string{"LD_LIBRARY_PATH=" + n.HostPath(n.LibDir)})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"shutdown-before-init 1", // NVML_ERROR_UNINITIALIZED
		"init 0 0",
		"inner-shutdown 0",
		"count 0 3",
		"create-gi 3", // a stub: NVML_ERROR_NOT_SUPPORTED
		"last-shutdown 0",
		"after 1 1",
	}
	for i, g := range n.GPUs {
		want = append(want, fmt.Sprintf("gpu %d minor 0 %d index 0 %d mig-handle 0 0 fan 3", i, g.Minor, i))
		for _, p := range h100Profiles {
			pl := ""
			for _, s := range p.Placements {
				pl += fmt.Sprintf(" %d+%d", s, p.MemorySlices)
			}
			want = append(want, fmt.Sprintf("gpu %d profile %d id %d placements 0 0 %d:%s", i, p.Index, p.ID, len(p.Placements), pl))
		}
	}
	for i, ng := range MixedMIG().GPUs {
		for k, m := range ng.MIG {
			p, _ := ProfileOf(h100Profiles, m)
			want = append(want, fmt.Sprintf("mig %d %d mig-handle 1 by-uuid 1 gi %d profile %d at %d+%d ci 0 profile %d at 0+%d ci-device 1 ci-gi 1",
				i, k, m.GI, p.ID, MIGPlacementStart(m.GI), p.MemorySlices, ciProfileIndex[m.GISlices], m.GISlices))
			for _, c := range CIProfiles(h100Profiles, p) {
				want = append(want, fmt.Sprintf("mig %d %d ciprofile %d id %d slices %d count %d sm %d ce %d", i, k, c.Index, c.ID, c.Slices, c.Instances, c.SMs, p.CopyEngines))
			}
			want = append(want, fmt.Sprintf("mig %d %d ciprofile engines-1 2", i, k)) // INVALID_ARGUMENT
		}
	}
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("the probe did not print %q", w)
		}
	}
	if t.Failed() {
		t.Logf("the probe printed:\n%s", out)
	}
	// Facts of an H100 80GB, as nvidia-smi mig -lgipp and -lcip show them.
	for _, w := range []string{
		"gpu 0 profile 0 id 19 placements 0 0 7: 0+1 1+1 2+1 3+1 4+1 5+1 6+1",
		"gpu 0 profile 4 id 0 placements 0 0 1: 0+8",
		"gpu 0 profile 2 id 9 placements 0 0 2: 0+4 4+4",
		"mig 1 0 ciprofile 1 id 1 slices 2 count 1 sm 32 ce 2",
		"mig 1 0 ciprofile 0 id 0 slices 1 count 2 sm 16 ce 2",
	} {
		if !slices.Contains(lines, w) {
			t.Errorf("the probe did not print %q", w)
		}
	}
}

// TestCIProfiles checks the compute instance profiles of GPU instance
// profiles of the H100 80GB and the A100 40GB: the sizes are nvidia-smi
// mig -lcip's (a 7-slice instance offers 1, 2, 3, 4 and 7 slices, a
// 4-slice one 1, 2 and 4), the multiprocessors CIProfiles' rule.
func TestCIProfiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		model   string
		profile string
		want    string
	}{
		{DefaultModel, "7g.80gb", "0:1x7/16 1:2x3/32 2:3x2/60 3:4x1/64 4:7x1/132"},
		{DefaultModel, "4g.40gb", "0:1x4/16 1:2x2/32 3:4x1/64"},
		{DefaultModel, "1g.20gb", "0:1x1/26"},
		{A100Model, "7g.40gb", "0:1x7/14 1:2x3/28 2:3x2/42 3:4x1/56 4:7x1/98"},
		{A100Model, "3g.20gb", "0:1x3/14 1:2x1/28 2:3x1/42"},
	} {
		profiles := MIGProfiles(tc.model)
		p, ok := ProfileOf(profiles, MIG{Profile: tc.profile})
		if !ok {
			t.Fatalf("%s has no profile %s", tc.model, tc.profile)
		}
		var got []string
		for _, c := range CIProfiles(profiles, p) {
			got = append(got, fmt.Sprintf("%d:%dx%d/%d", c.Index, c.Slices, c.Instances, c.SMs))
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%s %s: compute instance profiles %s, want %s", tc.model, tc.profile, g, tc.want)
		}
	}
}

// TestA100HalfBalanced checks the quickstart's A100 layout against the
// A100 40GB's placements: each instance on one of its profile's
// placements, no two on the same memory slice.
func TestA100HalfBalanced(t *testing.T) {
	t.Parallel()
	used := map[int]string{}
	for _, m := range A100HalfBalanced() {
		p, ok := ProfileOf(a100Profiles, m)
		if !ok || m.MemoryMiB != p.MemoryMiB || m.GISlices != p.Slices {
			t.Fatalf("%+v: not an A100 40GB profile's", m)
		}
		start := MIGPlacementStart(m.GI)
		if !slices.Contains(p.Placements, start) {
			t.Errorf("%s on GPU instance %d starts at slice %d, not one of %v", p.Name, m.GI, start, p.Placements)
		}
		for s := start; s < start+p.MemorySlices; s++ {
			if other, ok := used[s]; ok {
				t.Errorf("%s and %s both on memory slice %d", p.Name, other, s)
			}
			used[s] = p.Name
		}
	}
	if len(used) != 8 {
		t.Errorf("the layout takes %d of the 8 memory slices", len(used))
	}
}
