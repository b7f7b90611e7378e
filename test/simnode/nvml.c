//go:build ignore

// (The line above keeps the go command from treating this C file as a cgo
// source of package simnode, which only embeds it.)

/*
 * The simulated libnvidia-ml.so.1 of test/simnode: the functions nri-gpu
 * calls, with the names, signatures and struct layouts of NVIDIA's nvml.h.
 * Embedded by nvml.go, which defines NRI_GPU_SIM_NVML_STATE_ENV and
 * NRI_GPU_SIM_NVML_STATE_PATH (NVMLStateEnv and NVMLStatePath) before it.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

/* Failure modes of the state file (simnode.NVMLState): a GPU whose every
 * query fails with a code (NVML_ERROR_GPU_IS_LOST for a lost GPU), an
 * enumeration that fails (nvmlDeviceGetCount_v2), an nvmlInit_v2 that takes
 * a while. Misuse of the library by its caller (a shutdown while an event
 * wait runs, an event set used after the shutdown) is what the real library
 * does not survive: it is recorded, one line each, in the state file's
 * path + ".violations" (simnode.Node.NVMLViolations). */

typedef struct nvmlPciInfo_st {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlDeviceAttributes_st {
	unsigned int multiprocessorCount;
	unsigned int sharedCopyEngineCount;
	unsigned int sharedDecoderCount;
	unsigned int sharedEncoderCount;
	unsigned int sharedJpegCount;
	unsigned int sharedOfaCount;
	unsigned int gpuInstanceSliceCount;
	unsigned int computeInstanceSliceCount;
	unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

struct sim_dev;
typedef struct sim_dev *nvmlDevice_t;
typedef struct sim_set *nvmlEventSet_t;

typedef struct nvmlEventData_st {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlEventData_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68 && offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40 && offsetof(nvmlDeviceAttributes_t, memorySizeMB) == 32, "nvmlDeviceAttributes_t");
_Static_assert(sizeof(nvmlEventData_t) == 32 && offsetof(nvmlEventData_t, gpuInstanceId) == 24, "nvmlEventData_t");

#define nvmlEventTypeXidCriticalError 0x8ULL
#define SIM_MAX_GPUS 64
#define SIM_MAX_MIG 16
#define SIM_MAX_EVENTS 256

struct sim_dev {
	int used;
	int is_mig;
	int index;
	struct sim_dev *parent;
	char uuid[96];
	char bus[32];
	char name[96];
	unsigned long long mem;
	int mig_mode;
	int minor; /* the GPU's device minor; -1: not known */
	int err; /* every query fails with this code (0: none) */
	unsigned int gi, ci, gi_slices, ci_slices;
	int nmig;
	struct sim_dev *mig[SIM_MAX_MIG];
};

static struct sim_dev gpus[SIM_MAX_GPUS];
static struct sim_dev migs[SIM_MAX_GPUS * SIM_MAX_MIG];
/* initialized counts the nvmlInit* calls not yet shut down. */
static int ngpus, nmigs, from_state, initialized;
/* fail_count: the code nvmlDeviceGetCount_v2 fails with; init_delay_ms:
 * how long nvmlInit_v2 takes; waiting: event waits in progress. */
static int fail_count, init_delay_ms, waiting;

struct sim_set {
	int used;
	unsigned long long registered[SIM_MAX_GPUS];
	unsigned long long seen; /* events with seq <= seen are delivered */
};
static struct sim_set sets[8];

static int state_path(char *out, size_t n)
{
	const char *env = getenv(NRI_GPU_SIM_NVML_STATE_ENV);
	if (env != NULL && *env != '\0') {
		snprintf(out, n, "%s", env);
		return access(out, R_OK) == 0;
	}
	Dl_info info;
	if (dladdr((void *)&state_path, &info) == 0 || info.dli_fname == NULL)
		return 0;
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", info.dli_fname);
	for (int up = 0; up < 6; up++) {
		char *slash = strrchr(dir, '/');
		if (slash == NULL)
			return 0;
		*slash = '\0';
		snprintf(out, n, "%s" NRI_GPU_SIM_NVML_STATE_PATH, dir);
		if (access(out, R_OK) == 0)
			return 1;
	}
	return 0;
}

static void props_reset(void);
static int props_line(const char *line);
/* MIG made on demand (nvml_migcreate.c). */
static void mig_dyn_load(void);
struct sim_gi;
static int mig_dyn_gi_by_id(const struct sim_dev *d, unsigned int id, struct sim_gi **gi);

/* load reads the state file; without one, GPUs are counted from /dev. */
static void load(void)
{
	char p[4096];
	memset(gpus, 0, sizeof gpus);
	memset(migs, 0, sizeof migs);
	props_reset();
	ngpus = nmigs = 0;
	from_state = 0;
	fail_count = init_delay_ms = 0;
	if (!state_path(p, sizeof p))
		return;
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return;
	from_state = 1;
	char line[512];
	while (fgets(line, sizeof line, f) != NULL) {
		line[strcspn(line, "\n")] = '\0';
		if (props_line(line))
			continue;
		int idx, mig, err, n;
		unsigned long long mem;
		char uuid[96], bus[32];
		if (sscanf(line, "fail count %d", &err) == 1) {
			fail_count = err;
			continue;
		}
		if (sscanf(line, "init delay %d", &n) == 1) {
			init_delay_ms = n;
			continue;
		}
		if (sscanf(line, "gpu %d %95s %31s %llu %d %d %n", &idx, uuid, bus, &mem, &mig, &err, &n) == 6) {
			if (ngpus == SIM_MAX_GPUS)
				continue;
			struct sim_dev *g = &gpus[ngpus++];
			g->used = 1;
			g->index = idx;
			snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
			snprintf(g->bus, sizeof g->bus, "%s", bus);
			snprintf(g->name, sizeof g->name, "%s", line + n);
			g->mem = mem;
			g->mig_mode = mig;
			g->minor = -1;
			g->err = err;
			continue;
		}
		int gpu;
		unsigned int gi, ci, gs, cs;
		if (sscanf(line, "mig %d %u %u %u %u %llu %95s", &gpu, &gi, &ci, &gs, &cs, &mem, uuid) == 7) {
			if (gpu < 0 || gpu >= ngpus || gpus[gpu].nmig == SIM_MAX_MIG)
				continue;
			struct sim_dev *m = &migs[nmigs++];
			m->used = 1;
			m->is_mig = 1;
			m->parent = &gpus[gpu];
			m->index = gpus[gpu].nmig;
			m->gi = gi;
			m->ci = ci;
			m->gi_slices = gs;
			m->ci_slices = cs;
			m->mem = mem;
			snprintf(m->uuid, sizeof m->uuid, "%s", uuid);
			gpus[gpu].mig[gpus[gpu].nmig++] = m;
		}
	}
	fclose(f);
	mig_dyn_load();
}

/* violation records a misuse of the library (see the top). */
static void violation(const char *what)
{
	char p[4096];
	if (!state_path(p, sizeof p))
		return;
	strncat(p, ".violations", sizeof p - strlen(p) - 1);
	FILE *f = fopen(p, "a");
	if (f == NULL)
		return;
	fprintf(f, "%s\n", what);
	fclose(f);
}

static int is_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_SEQ_CST) > 0; }

/* next_event finds the first XID event after seq for a device registered
 * in s, reading the state file again. */
static int next_event(struct sim_set *s, nvmlEventData_t *data)
{
	char p[4096];
	if (!state_path(p, sizeof p))
		return 0;
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return 0;
	char line[512];
	int found = 0;
	while (!found && fgets(line, sizeof line, f) != NULL) {
		unsigned long long seq, xid;
		int gpu;
		unsigned int gi, ci;
		if (sscanf(line, "xid %llu %d %llu %u %u", &seq, &gpu, &xid, &gi, &ci) != 5)
			continue;
		if (seq <= s->seen)
			continue;
		s->seen = seq;
		if (gpu < 0 || gpu >= ngpus || !(s->registered[gpu] & nvmlEventTypeXidCriticalError))
			continue;
		data->device = &gpus[gpu];
		data->eventType = nvmlEventTypeXidCriticalError;
		data->eventData = xid;
		data->gpuInstanceId = gi;
		data->computeInstanceId = ci;
		found = 1;
	}
	fclose(f);
	return found;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case 4: return "Insufficient Permissions"; /* NVML_ERROR_NO_PERMISSION */
	case 16: return "Reset Required"; /* NVML_ERROR_RESET_REQUIRED */
	case 19: return "In use by another client"; /* NVML_ERROR_IN_USE */
	case 23: return "Insufficient Resources"; /* NVML_ERROR_INSUFFICIENT_RESOURCES */
	}
	return "Unknown Error";
}

/* nvmlInit_v2 reads the state again and counts a reference, as the real
 * library does: each nvmlInit* needs its nvmlShutdown, and only the last
 * shutdown uninitializes (NVIDIA's DRA driver nests them). */
int nvmlInit_v2(void)
{
	load();
	for (int waited = 0; waited < init_delay_ms; waited += 10)
		usleep(10000);
	__atomic_add_fetch(&initialized, 1, __ATOMIC_SEQ_CST);
	return NVML_SUCCESS;
}

/* nvmlInitWithFlags is nvmlInit_v2; its flags (NVML_INIT_FLAG_NO_GPUS,
 * NO_ATTACH) change nothing on a node whose GPUs all answer. */
int nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	return nvmlInit_v2();
}

/* nvmlInit is the first version of nvmlInit_v2, which the real library
 * still exports. */
int nvmlInit(void)
{
	return nvmlInit_v2();
}

int nvmlShutdown(void)
{
	int n = __atomic_load_n(&initialized, __ATOMIC_SEQ_CST);
	do {
		if (n == 0)
			return NVML_ERROR_UNINITIALIZED;
	} while (!__atomic_compare_exchange_n(&initialized, &n, n - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
	if (n == 1 && __atomic_load_n(&waiting, __ATOMIC_SEQ_CST) > 0)
		violation("nvmlShutdown while nvmlEventSetWait_v2 waits");
	return NVML_SUCCESS;
}

int nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	const char *v = nri_gpu_sim_driver_version();
	if (version == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (length < strlen(v) + 4)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(version, "12.");
	strcat(version, v);
	return NVML_SUCCESS;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	const char *v = nri_gpu_sim_driver_version();
	if (version == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (length < strlen(v) + 1)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(version, v);
	return NVML_SUCCESS;
}

/* nvmlDeviceGetCount_v2 reads the state again: each enumeration sees the
 * node as it is now (a MIG layout changed, a GPU lost or back). */
int nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (is_initialized())
		load();
	if (fail_count != 0)
		return fail_count;
	*count = from_state ? (unsigned int)ngpus : (unsigned int)nri_gpu_sim_count_gpus();
	return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (device == NULL || !from_state || index >= (unsigned int)ngpus)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &gpus[index];
	return NVML_SUCCESS;
}

static int str_out(const struct sim_dev *d, const char *s, char *out, unsigned int length)
{
	if (d == NULL || out == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_dev *g = d->is_mig ? d->parent : d;
	if (g->err)
		return g->err;
	if (length < strlen(s) + 1)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(out, s);
	return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
	return str_out(d, d ? d->uuid : "", uuid, length);
}

int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
	if (d != NULL && d->is_mig) {
		char buf[192];
		snprintf(buf, sizeof buf, "%s MIG", d->parent->name);
		return str_out(d, buf, name, length);
	}
	return str_out(d, d ? d->name : "", name, length);
}

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
	if (d == NULL || pci == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_dev *g = d->is_mig ? d->parent : d;
	if (g->err)
		return g->err;
	memset(pci, 0, sizeof *pci);
	snprintf(pci->busId, sizeof pci->busId, "%s", g->bus);
	snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->bus + 4);
	unsigned int dom = 0, bus = 0, dev = 0;
	sscanf(g->bus, "%x:%x:%x", &dom, &bus, &dev);
	pci->domain = dom;
	pci->bus = bus;
	pci->device = dev;
	pci->pciDeviceId = 0x233010de;
	return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	if (d == NULL || m == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((d->is_mig ? d->parent : d)->err)
		return (d->is_mig ? d->parent : d)->err;
	m->total = d->mem << 20;
	m->free = m->total;
	m->used = 0;
	return NVML_SUCCESS;
}

int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
	if (d == NULL || current == NULL || pending == NULL || d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->err)
		return d->err;
	if (d->mig_mode < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*current = *pending = (unsigned int)d->mig_mode;
	return NVML_SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
	if (d == NULL || count == NULL || d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->mig_mode < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*count = d->nmig > 7 ? (unsigned int)d->nmig : 7;
	return NVML_SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig)
{
	if (d == NULL || mig == NULL || d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->err)
		return d->err;
	if (index >= (unsigned int)d->nmig)
		return NVML_ERROR_NOT_FOUND;
	*mig = d->mig[index];
	return NVML_SUCCESS;
}

int nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
	if (d == NULL || id == NULL || !d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	*id = d->gi;
	return NVML_SUCCESS;
}

int nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
	if (d == NULL || id == NULL || !d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	*id = d->ci;
	return NVML_SUCCESS;
}

static void mig_attributes(const struct sim_dev *d, nvmlDeviceAttributes_t *a);

int nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
	if (d == NULL || a == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(a, 0, sizeof *a);
	a->multiprocessorCount = d->is_mig ? 16 * d->ci_slices : 132;
	a->gpuInstanceSliceCount = d->is_mig ? d->gi_slices : 0;
	a->computeInstanceSliceCount = d->is_mig ? d->ci_slices : 0;
	a->memorySizeMB = d->mem;
	if (d->is_mig)
		mig_attributes(d, a);
	return NVML_SUCCESS;
}

int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
	if (d == NULL || types == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*types = nvmlEventTypeXidCriticalError | 0x1ULL | 0x2ULL;
	return NVML_SUCCESS;
}

int nvmlEventSetCreate(nvmlEventSet_t *set)
{
	if (set == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
		if (!sets[i].used) {
			memset(&sets[i], 0, sizeof sets[i]);
			sets[i].used = 1;
			/* Only events written after the set exists are delivered. */
			nvmlEventData_t ignored;
			while (next_event(&sets[i], &ignored))
				;
			*set = &sets[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_UNKNOWN;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
	if (d == NULL || set == NULL || d->is_mig || d < gpus || d >= gpus + SIM_MAX_GPUS)
		return NVML_ERROR_INVALID_ARGUMENT;
	set->registered[d - gpus] |= types;
	return NVML_SUCCESS;
}

int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	if (set == NULL || data == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!is_initialized()) {
		violation("nvmlEventSetWait_v2 after nvmlShutdown");
		return NVML_ERROR_UNINITIALIZED;
	}
	__atomic_add_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
	int r = NVML_ERROR_TIMEOUT;
	for (unsigned int waited = 0;; waited += 10) {
		if (next_event(set, data)) {
			r = NVML_SUCCESS;
			break;
		}
		if (waited >= timeoutms)
			break;
		usleep(10000);
	}
	__atomic_sub_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
	return r;
}

int nvmlEventSetFree(nvmlEventSet_t set)
{
	if (set == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!is_initialized())
		violation("nvmlEventSetFree after nvmlShutdown");
	set->used = 0;
	return NVML_SUCCESS;
}

/*
 * Compute modes (nvmlDeviceGetComputeMode, nvmlDeviceSetComputeMode,
 * nvmlDeviceGetHandleByUUID), kept apart from the rest: a GPU's mode lives
 * in the file ComputeModePath names beside the state file ("<uuid> <mode>"
 * lines), so that it persists across processes as the driver's does until
 * the module is reloaded. Setting one needs root, as with NVIDIA's NVML.
 */
#include <stdlib.h>
#include <strings.h>

#define NVML_ERROR_NO_PERMISSION 4
#define SIM_COMPUTE_MODES 4 /* DEFAULT, EXCLUSIVE_THREAD, PROHIBITED, EXCLUSIVE_PROCESS */

/* compute_path gives the compute-mode file: the state file's path with its
 * last component replaced by NRI_GPU_SIM_COMPUTE_MODE_FILE. */
static int compute_path(char *out, size_t n)
{
	char state[4096];
	if (!state_path(state, sizeof state))
		return 0;
	char *slash = strrchr(state, '/');
	if (slash == NULL)
		return 0;
	*slash = '\0';
	snprintf(out, n, "%s/%s", state, NRI_GPU_SIM_COMPUTE_MODE_FILE);
	return 1;
}

/* compute_mode_of returns the recorded mode of uuid, DEFAULT (0) if none. */
static unsigned int compute_mode_of(const char *uuid)
{
	char p[4096], line[256], u[96];
	unsigned int mode = 0, m;
	if (!compute_path(p, sizeof p))
		return 0;
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof line, f) != NULL)
		if (sscanf(line, "%95s %u", u, &m) == 2 && strcmp(u, uuid) == 0)
			mode = m;
	fclose(f);
	return mode;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (uuid == NULL || device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!from_state)
		return NVML_ERROR_NOT_FOUND;
	for (int i = 0; i < ngpus; i++) {
		if (strcasecmp(gpus[i].uuid, uuid) == 0) {
			*device = &gpus[i];
			return NVML_SUCCESS;
		}
	}
	/* A MIG device's UUID gives its handle, as with the real library. */
	for (int i = 0; i < nmigs; i++) {
		if (strcasecmp(migs[i].uuid, uuid) == 0) {
			*device = &migs[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

int nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode)
{
	if (d == NULL || mode == NULL || d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->err)
		return d->err;
	*mode = compute_mode_of(d->uuid);
	return NVML_SUCCESS;
}

int nvmlDeviceSetComputeMode(nvmlDevice_t d, unsigned int mode)
{
	if (d == NULL || d->is_mig || mode >= SIM_COMPUTE_MODES)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->err)
		return d->err;
	if (geteuid() != 0)
		return NVML_ERROR_NO_PERMISSION;
	char p[4096], tmp[4200], line[256], u[96];
	unsigned int m;
	if (!compute_path(p, sizeof p))
		return NVML_ERROR_UNKNOWN;
	snprintf(tmp, sizeof tmp, "%s.%d", p, (int)getpid());
	FILE *out = fopen(tmp, "w");
	if (out == NULL)
		return NVML_ERROR_UNKNOWN;
	FILE *in = fopen(p, "r");
	if (in != NULL) {
		while (fgets(line, sizeof line, in) != NULL)
			if (sscanf(line, "%95s %u", u, &m) == 2 && strcmp(u, d->uuid) != 0)
				fprintf(out, "%s %u\n", u, m);
		fclose(in);
	}
	fprintf(out, "%s %u\n", d->uuid, mode);
	if (fclose(out) != 0 || rename(tmp, p) != 0) {
		unlink(tmp);
		return NVML_ERROR_UNKNOWN;
	}
	return NVML_SUCCESS;
}

/*
 * GPU properties and GPU instances, kept apart from the rest:
 * nvmlDeviceGetBrand, nvmlDeviceGetArchitecture,
 * nvmlDeviceGetCudaComputeCapability, nvmlDeviceGetAddressingMode,
 * nvmlSystemGetCudaDriverVersion(_v2), nvmlDeviceGetGpuInstanceProfileInfo,
 * nvmlDeviceGetGpuInstanceById and nvmlGpuInstanceGetInfo. What they
 * answer comes from the state file, written by simnode.WriteNVMLState:
 *
 *   props <gpu> <brand> <arch> <cc major> <cc minor> <addressing mode> <gi error>
 *   gip <gpu> <profile index> <id> <slices> <instances> <SMs> <CEs> <DECs> <ENCs> <JPEGs> <OFAs> <MiB>
 *   migp <gpu> <k> <profile index> <placement start> <placement size> <SMs>
 *
 * props: -1 where the GPU does not support the query (NOT_SUPPORTED);
 * <gi error> is the code nvmlDeviceGetGpuInstanceById fails with (0:
 * none). gip: one of the GPU instance profiles the GPU supports, by its
 * NVML_GPU_INSTANCE_PROFILE_* index. migp: the GPU instance of the k-th MIG
 * device of the GPU (the mig line before it). With NRI_GPU_SIM_NVML_NO_PROPS
 * defined the library has none of these functions, as a library from
 * before them.
 */
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define SIM_GI_PROFILES 0x12 /* NVML_GPU_INSTANCE_PROFILE_COUNT */

typedef struct nvmlGpuInstancePlacement_st {
	unsigned int start;
	unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct nvmlGpuInstanceProfileInfo_st {
	unsigned int id;
	unsigned int isP2pSupported;
	unsigned int sliceCount;
	unsigned int instanceCount;
	unsigned int multiprocessorCount;
	unsigned int copyEngineCount;
	unsigned int decoderCount;
	unsigned int encoderCount;
	unsigned int jpegCount;
	unsigned int ofaCount;
	unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct sim_gi *nvmlGpuInstance_t;

typedef struct nvmlGpuInstanceInfo_st {
	nvmlDevice_t device;
	unsigned int id;
	unsigned int profileId;
	nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
	unsigned int version;
	unsigned int value;
} nvmlDeviceAddressingMode_t;

#define nvmlDeviceAddressingMode_v1 ((unsigned int)(sizeof(nvmlDeviceAddressingMode_t) | (1 << 24)))

_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_t) == 48 && offsetof(nvmlGpuInstanceProfileInfo_t, memorySizeMB) == 40, "nvmlGpuInstanceProfileInfo_t");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24 && offsetof(nvmlGpuInstanceInfo_t, placement) == 16, "nvmlGpuInstanceInfo_t");
_Static_assert(sizeof(nvmlDeviceAddressingMode_t) == 8, "nvmlDeviceAddressingMode_t");

struct sim_props {
	int brand, arch, cc_major, cc_minor, addressing, gi_error;
};
struct sim_gip {
	int used;
	unsigned int id, slices, instances, sm, ce, dec, enc, jpeg, ofa;
	unsigned long long mem;
};
struct sim_gi {
	int used;
	struct sim_dev *parent;
	unsigned int id, start, size, sm;
	int profile;
};
#define SIM_CI_PROFILES 0x9 /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define SIM_MAX_PLACEMENTS 8 /* memory slices of a GPU */

/* A GPU instance profile's placements: where its instances can lie. */
struct sim_gipp {
	int n;
	unsigned int start[SIM_MAX_PLACEMENTS], size[SIM_MAX_PLACEMENTS];
};
/* A compute instance profile of a GPU instance profile; its engines are
 * the GPU instance's, shared. */
struct sim_cip {
	int used;
	unsigned int id, slices, instances, sm;
};
/* A compute instance: the one of a MIG device. */
struct sim_ci {
	int used;
	struct sim_gi *gi;
	unsigned int id, start, size;
	int profile;
};
static struct sim_props props[SIM_MAX_GPUS];
static struct sim_gip gips[SIM_MAX_GPUS][SIM_GI_PROFILES];
static struct sim_gipp gipps[SIM_MAX_GPUS][SIM_GI_PROFILES];
static struct sim_cip cips[SIM_MAX_GPUS][SIM_GI_PROFILES][SIM_CI_PROFILES];
/* gis[i] and cis[i] are the GPU and compute instance of migs[i]. */
static struct sim_gi gis[SIM_MAX_GPUS * SIM_MAX_MIG];
static struct sim_ci cis[SIM_MAX_GPUS * SIM_MAX_MIG];

static void props_reset(void)
{
	memset(gips, 0, sizeof gips);
	memset(gipps, 0, sizeof gipps);
	memset(cips, 0, sizeof cips);
	memset(gis, 0, sizeof gis);
	memset(cis, 0, sizeof cis);
	for (int i = 0; i < SIM_MAX_GPUS; i++)
		props[i] = (struct sim_props){-1, -1, -1, -1, -1, 0};
}

/* props_line takes a minor, props, gip, gipp, cip, migp or migc line of
 * the state file. */
static int props_line(const char *line)
{
	int g, idx, k, c, a[6];
	unsigned int u[10];
	unsigned long long mem;
	if (sscanf(line, "minor %d %d", &g, &a[0]) == 2) {
		if (g >= 0 && g < ngpus)
			gpus[g].minor = a[0];
		return 1;
	}
	if (sscanf(line, "gipp %d %d %u %u", &g, &idx, &u[0], &u[1]) == 4) {
		if (g >= 0 && g < SIM_MAX_GPUS && idx >= 0 && idx < SIM_GI_PROFILES && gipps[g][idx].n < SIM_MAX_PLACEMENTS) {
			struct sim_gipp *p = &gipps[g][idx];
			p->start[p->n] = u[0];
			p->size[p->n] = u[1];
			p->n++;
		}
		return 1;
	}
	if (sscanf(line, "cip %d %d %d %u %u %u %u", &g, &idx, &c, &u[0], &u[1], &u[2], &u[3]) == 7) {
		if (g >= 0 && g < SIM_MAX_GPUS && idx >= 0 && idx < SIM_GI_PROFILES && c >= 0 && c < SIM_CI_PROFILES)
			cips[g][idx][c] = (struct sim_cip){1, u[0], u[1], u[2], u[3]};
		return 1;
	}
	if (sscanf(line, "migc %d %d %d %u %u", &g, &k, &c, &u[0], &u[1]) == 5) {
		if (g < 0 || g >= ngpus || k < 0 || k >= gpus[g].nmig || c < 0 || c >= SIM_CI_PROFILES)
			return 1;
		struct sim_dev *m = gpus[g].mig[k];
		cis[m - migs] = (struct sim_ci){1, &gis[m - migs], m->ci, u[0], u[1], c};
		return 1;
	}
	if (sscanf(line, "props %d %d %d %d %d %d %d", &g, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5]) == 7) {
		if (g >= 0 && g < SIM_MAX_GPUS)
			props[g] = (struct sim_props){a[0], a[1], a[2], a[3], a[4], a[5]};
		return 1;
	}
	if (sscanf(line, "gip %d %d %u %u %u %u %u %u %u %u %u %llu", &g, &idx, &u[0], &u[1], &u[2], &u[3], &u[4], &u[5], &u[6], &u[7], &u[8], &mem) == 12) {
		if (g >= 0 && g < SIM_MAX_GPUS && idx >= 0 && idx < SIM_GI_PROFILES)
			gips[g][idx] = (struct sim_gip){1, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], mem};
		return 1;
	}
	if (sscanf(line, "migp %d %d %d %u %u %u", &g, &k, &idx, &u[0], &u[1], &u[2]) == 6) {
		if (g < 0 || g >= ngpus || k < 0 || k >= gpus[g].nmig || idx < 0 || idx >= SIM_GI_PROFILES)
			return 1;
		struct sim_dev *m = gpus[g].mig[k];
		gis[m - migs] = (struct sim_gi){1, &gpus[g], m->gi, u[0], u[1], u[2], idx};
		return 1;
	}
	return 0;
}

/* gpu_of returns the index of d's GPU (its parent's for a MIG device), or
 * -1 for a handle that is none of the library's. */
static int gpu_of(const struct sim_dev *d)
{
	if (d == NULL)
		return -1;
	if (d->is_mig)
		d = d->parent;
	if (d < gpus || d >= gpus + SIM_MAX_GPUS)
		return -1;
	return (int)(d - gpus);
}

/* mig_attributes gives a MIG device of a known GPU instance its
 * instance's multiprocessors and its profile's engines. */
static void mig_attributes(const struct sim_dev *d, nvmlDeviceAttributes_t *a)
{
	const struct sim_gi *gi = &gis[d - migs];
	if (!gi->used)
		return;
	const struct sim_gip *p = &gips[gpu_of(d)][gi->profile];
	a->multiprocessorCount = gi->sm;
	a->sharedCopyEngineCount = p->ce;
	a->sharedDecoderCount = p->dec;
	a->sharedEncoderCount = p->enc;
	a->sharedJpegCount = p->jpeg;
	a->sharedOfaCount = p->ofa;
}

#ifndef NRI_GPU_SIM_NVML_NO_PROPS
/* prop_of checks d and returns its GPU's properties, or sets *r. */
static const struct sim_props *prop_of(const struct sim_dev *d, const void *out, int *r)
{
	int g = gpu_of(d);
	*r = NVML_SUCCESS;
	if (!is_initialized())
		*r = NVML_ERROR_UNINITIALIZED;
	else if (g < 0 || out == NULL)
		*r = NVML_ERROR_INVALID_ARGUMENT;
	else if (gpus[g].err)
		*r = gpus[g].err;
	return *r == NVML_SUCCESS ? &props[g] : NULL;
}

int nvmlDeviceGetBrand(nvmlDevice_t d, int *type)
{
	int r;
	const struct sim_props *p = prop_of(d, type, &r);
	if (p == NULL)
		return r;
	if (p->brand < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*type = p->brand;
	return NVML_SUCCESS;
}

int nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
	int r;
	const struct sim_props *p = prop_of(d, arch, &r);
	if (p == NULL)
		return r;
	if (p->arch < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*arch = (unsigned int)p->arch;
	return NVML_SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
	int r;
	const struct sim_props *p = prop_of(d, minor, &r);
	if (p == NULL)
		return r;
	if (major == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (p->cc_major < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*major = p->cc_major;
	*minor = p->cc_minor;
	return NVML_SUCCESS;
}

int nvmlDeviceGetAddressingMode(nvmlDevice_t d, nvmlDeviceAddressingMode_t *mode)
{
	int r;
	const struct sim_props *p = prop_of(d, mode, &r);
	if (p == NULL)
		return r;
	if (mode->version != nvmlDeviceAddressingMode_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	if (p->addressing < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	mode->value = (unsigned int)p->addressing;
	return NVML_SUCCESS;
}

int nvmlSystemGetCudaDriverVersion(int *version)
{
	if (version == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*version = NRI_GPU_SIM_CUDA_VERSION;
	return NVML_SUCCESS;
}

int nvmlSystemGetCudaDriverVersion_v2(int *version)
{
	return nvmlSystemGetCudaDriverVersion(version);
}

int nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info)
{
	int r;
	if (d != NULL && d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (prop_of(d, info, &r) == NULL)
		return r;
	if (profile >= SIM_GI_PROFILES)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_gip *p = &gips[gpu_of(d)][profile];
	if (d->mig_mode < 0 || !p->used)
		return NVML_ERROR_NOT_SUPPORTED;
	*info = (nvmlGpuInstanceProfileInfo_t){p->id, 0, p->slices, p->instances, p->sm, p->ce, p->dec, p->enc, p->jpeg, p->ofa, p->mem};
	return NVML_SUCCESS;
}

int nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi)
{
	int r;
	if (d != NULL && d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_props *p = prop_of(d, gi, &r);
	if (p == NULL)
		return r;
	if (p->gi_error)
		return p->gi_error;
	if (d->mig_mode != 1)
		return NVML_ERROR_NOT_SUPPORTED;
	for (int k = 0; k < d->nmig; k++) {
		struct sim_gi *g = &gis[d->mig[k] - migs];
		if (g->used && g->id == id) {
			*gi = g;
			return NVML_SUCCESS;
		}
	}
	return mig_dyn_gi_by_id(d, id, gi);
}

int nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (gi == NULL || info == NULL || gi < gis || gi >= gis + sizeof gis / sizeof gis[0] || !gi->used)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (gi->parent->err)
		return gi->parent->err;
	info->device = gi->parent;
	info->id = gi->id;
	info->profileId = gips[gi->parent - gpus][gi->profile].id;
	info->placement.start = gi->start;
	info->placement.size = gi->size;
	return NVML_SUCCESS;
}

/*
 * MIG placements and compute instances, as NVIDIA's DRA driver walks them:
 * nvmlDeviceGetGpuInstancePossiblePlacements_v2 (every placement of a
 * profile, whether taken or not, as the real library answers),
 * nvmlGpuInstanceGetComputeInstanceProfileInfo,
 * nvmlGpuInstanceGetComputeInstanceById and nvmlComputeInstanceGetInfo_v2.
 * The profiles' placements and compute instance profiles are the state
 * file's, from simnode's tables (nvmlprops.go):
 *
 *   gipp <gpu> <profile index> <placement start> <placement size>
 *   cip <gpu> <gi profile index> <ci profile index> <id> <slices> <instances> <SMs>
 *   migc <gpu> <k> <ci profile index> <placement start> <placement size>
 *
 * migc: the compute instance of the k-th MIG device of the GPU.
 */
typedef struct sim_ci *nvmlComputeInstance_t;

typedef struct nvmlComputeInstanceProfileInfo_st {
	unsigned int id;
	unsigned int sliceCount;
	unsigned int instanceCount;
	unsigned int multiprocessorCount;
	unsigned int sharedCopyEngineCount;
	unsigned int sharedDecoderCount;
	unsigned int sharedEncoderCount;
	unsigned int sharedJpegCount;
	unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct nvmlComputeInstancePlacement_st {
	unsigned int start;
	unsigned int size;
} nvmlComputeInstancePlacement_t;

typedef struct nvmlComputeInstanceInfo_st {
	nvmlDevice_t device;
	nvmlGpuInstance_t gpuInstance;
	unsigned int id;
	unsigned int profileId;
	nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_t) == 36, "nvmlComputeInstanceProfileInfo_t");
_Static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32 && offsetof(nvmlComputeInstanceInfo_t, placement) == 24, "nvmlComputeInstanceInfo_t");

/* gi_ok checks a GPU instance handle: 0 when it is none of the library's. */
static int gi_ok(const struct sim_gi *gi)
{
	return gi != NULL && gi >= gis && gi < gis + sizeof gis / sizeof gis[0] && gi->used;
}

int nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int profileId, nvmlGpuInstancePlacement_t *placements, unsigned int *count)
{
	int r;
	if (d != NULL && d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (prop_of(d, count, &r) == NULL)
		return r;
	if (d->mig_mode < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	int g = gpu_of(d);
	for (int i = 0; i < SIM_GI_PROFILES; i++) {
		if (!gips[g][i].used || gips[g][i].id != profileId)
			continue;
		const struct sim_gipp *p = &gipps[g][i];
		if (placements == NULL) {
			*count = (unsigned int)p->n;
			return NVML_SUCCESS;
		}
		if (*count < (unsigned int)p->n) {
			*count = (unsigned int)p->n;
			return NVML_ERROR_INSUFFICIENT_SIZE;
		}
		for (int k = 0; k < p->n; k++)
			placements[k] = (nvmlGpuInstancePlacement_t){p->start[k], p->size[k]};
		*count = (unsigned int)p->n;
		return NVML_SUCCESS;
	}
	return NVML_ERROR_INVALID_ARGUMENT;
}

int nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int profile, unsigned int engProfile, nvmlComputeInstanceProfileInfo_t *info)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!gi_ok(gi) || info == NULL || profile >= SIM_CI_PROFILES || engProfile >= 1)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (gi->parent->err)
		return gi->parent->err;
	int g = (int)(gi->parent - gpus);
	const struct sim_cip *c = &cips[g][gi->profile][profile];
	if (!c->used)
		return NVML_ERROR_NOT_SUPPORTED;
	const struct sim_gip *p = &gips[g][gi->profile];
	*info = (nvmlComputeInstanceProfileInfo_t){c->id, c->slices, c->instances, c->sm, p->ce, p->dec, p->enc, p->jpeg, p->ofa};
	return NVML_SUCCESS;
}

int nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id, nvmlComputeInstance_t *ci)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!gi_ok(gi) || ci == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (gi->parent->err)
		return gi->parent->err;
	/* Any MIG device of the GPU instance's id whose compute instance has
	 * this id: the GPU instance handle is the first of its devices'. */
	const struct sim_dev *parent = gi->parent;
	for (int k = 0; k < parent->nmig; k++) {
		int i = (int)(parent->mig[k] - migs);
		if (gis[i].used && gis[i].id == gi->id && cis[i].used && cis[i].id == id) {
			*ci = &cis[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

int nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (ci == NULL || info == NULL || ci < cis || ci >= cis + sizeof cis / sizeof cis[0] || !ci->used)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (ci->gi->parent->err)
		return ci->gi->parent->err;
	int g = (int)(ci->gi->parent - gpus);
	info->device = &migs[ci - cis];
	info->gpuInstance = ci->gi;
	info->id = ci->id;
	info->profileId = cips[g][ci->gi->profile][ci->profile].id;
	info->placement.start = ci->start;
	info->placement.size = ci->size;
	return NVML_SUCCESS;
}
#endif

/*
 * What a device is: its minor, its index, whether it is a MIG device.
 */
int nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (gpu_of(d) < 0 || minor == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->is_mig)
		return NVML_ERROR_NOT_SUPPORTED;
	if (d->err)
		return d->err;
	if (d->minor < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*minor = (unsigned int)d->minor;
	return NVML_SUCCESS;
}

int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (gpu_of(d) < 0 || index == NULL || d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->err)
		return d->err;
	*index = (unsigned int)d->index;
	return NVML_SUCCESS;
}

int nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *isMig)
{
	if (gpu_of(d) < 0 || isMig == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*isMig = (unsigned int)d->is_mig;
	return NVML_SUCCESS;
}

/* NVML_SIM_STUBS, which nvml.go defines, lists as SIM_STUB(name) every
 * other function of NVML (nvml_symbols.txt): each is exported and answers
 * NVML_ERROR_NOT_SUPPORTED, as the real library does for what a GPU does
 * not have, where a missing symbol would kill its caller. */
#define SIM_STUB(name) \
	int name(void) { return NVML_ERROR_NOT_SUPPORTED; }
NVML_SIM_STUBS
