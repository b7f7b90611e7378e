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
	int err; /* every query fails with this code (0: none) */
	unsigned int gi, ci, gi_slices, ci_slices;
	int nmig;
	struct sim_dev *mig[SIM_MAX_MIG];
};

static struct sim_dev gpus[SIM_MAX_GPUS];
static struct sim_dev migs[SIM_MAX_GPUS * SIM_MAX_MIG];
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

/* load reads the state file; without one, GPUs are counted from /dev. */
static void load(void)
{
	char p[4096];
	memset(gpus, 0, sizeof gpus);
	memset(migs, 0, sizeof migs);
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

static int is_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_SEQ_CST); }

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
	}
	return "Unknown Error";
}

int nvmlInit_v2(void)
{
	load();
	for (int waited = 0; waited < init_delay_ms; waited += 10)
		usleep(10000);
	__atomic_store_n(&initialized, 1, __ATOMIC_SEQ_CST);
	return NVML_SUCCESS;
}

int nvmlShutdown(void)
{
	if (__atomic_load_n(&waiting, __ATOMIC_SEQ_CST) > 0)
		violation("nvmlShutdown while nvmlEventSetWait_v2 waits");
	__atomic_store_n(&initialized, 0, __ATOMIC_SEQ_CST);
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

int nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
	if (d == NULL || a == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(a, 0, sizeof *a);
	a->multiprocessorCount = d->is_mig ? 16 * d->ci_slices : 132;
	a->gpuInstanceSliceCount = d->is_mig ? d->gi_slices : 0;
	a->computeInstanceSliceCount = d->is_mig ? d->ci_slices : 0;
	a->memorySizeMB = d->mem;
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
	if (!initialized)
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
