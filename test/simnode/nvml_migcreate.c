//go:build ignore

// (The line above keeps the go command from treating this C file as a cgo
// source of package simnode, which only embeds it.)

/*
 * MIG made on demand: GPU and compute instances created and destroyed
 * through the simulated NVML, with the placement rules of the driver.
 * Appended to nvml.c by nvml.go (nvmlSource), so it sees nvml.c's
 * statics; nvml.c calls mig_dyn_load at the end of load() and
 * mig_dyn_gi_by_id from nvmlDeviceGetGpuInstanceById.
 *
 * What exists lives in the file NRI_GPU_SIM_MIG_INSTANCES_FILE beside the
 * state file (as the driver keeps instances across processes until the
 * GPU is reset), one line each:
 *
 *   dgi <gpu uuid> <gi id> <gi profile index> <placement start>
 *   dci <gpu uuid> <gi id> <ci id> <ci profile index> <ci start> <mig uuid>
 *
 * Placement rules (nvml.h, nvmlDeviceCreateGpuInstanceWithPlacement and
 * NVIDIA's MIG user guide): the GPU must be in MIG mode; the placement
 * must be one of the profile's (nvmlDeviceGetGpuInstancePossiblePlacements_v2);
 * its memory slices must not overlap an existing GPU instance's; the GPU
 * instances' compute slices add up to at most 7, and a profile's instances
 * to at most its instanceCount. A GPU instance with compute instances
 * cannot be destroyed (NVML_ERROR_IN_USE). Creating and destroying need
 * CAP_SYS_ADMIN, as with NVIDIA's driver (mig_dyn_admin). The kernel's
 * side is simulated too: the instances' capability files under /proc/driver/nvidia/capabilities of
 * the node tree, which nvidia-modprobe -f reads to make /dev/nvidia-caps.
 *
 * GPU instance ids follow simnode's MIGPlacementStart rule: 0 the whole
 * GPU, 1 and 2 the halves, 3 to 6 the quarters, 7 to 14 the eighths.
 *
 * MIG mode is switched as nvmlDeviceSetMigMode does (a line
 *
 *   dmode <gpu uuid> <0|1>
 *
 * over the state file's mode, for a GPU without MIG devices of the state
 * file): refused while the GPU has a GPU instance (NVML_ERROR_IN_USE,
 * what nvidia-smi -mig 0 says with instances); on Hopper and later the
 * mode changes at once, without a GPU reset; before Hopper (an A100) the
 * driver only sets a pending mode that a GPU reset makes current, which
 * the simulation reports as NVML_ERROR_RESET_REQUIRED in the activation
 * status and no change (NVIDIA's DRA driver never toggles there).
 */
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* mig_dyn_admin reports whether the caller may create and destroy
 * instances: as the driver's os_is_administrator, CAP_SYS_ADMIN in its
 * effective set (read with capget, as capable() reads it in the kernel),
 * not its uid. (The driver also lets a client holding the MIG config
 * capability's device node; that path is not simulated.) */
static int mig_dyn_admin(void)
{
	struct {
		unsigned int version;
		int pid;
	} hdr = {0x20080522, 0}; /* _LINUX_CAPABILITY_VERSION_3 */
	struct {
		unsigned int effective, permitted, inheritable;
	} data[2];
	memset(data, 0, sizeof data);
	if (syscall(SYS_capget, &hdr, data) != 0)
		return 0;
	return (data[0].effective >> 21) & 1; /* CAP_SYS_ADMIN */
}

#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_INSUFFICIENT_RESOURCES 23
#define SIM_COMPUTE_SLICES 7
#define SIM_DYN_LINES 512

/* mig_dyn_path gives the instances file: the state file's directory and
 * NRI_GPU_SIM_MIG_INSTANCES_FILE. */
static int mig_dyn_path(char *out, size_t n)
{
	char state[4096];
	if (!state_path(state, sizeof state))
		return 0;
	char *slash = strrchr(state, '/');
	if (slash == NULL)
		return 0;
	*slash = '\0';
	snprintf(out, n, "%s/%s", state, NRI_GPU_SIM_MIG_INSTANCES_FILE);
	return 1;
}

/* mig_dyn_gpu returns the index of the GPU with uuid, -1 if none. */
static int mig_dyn_gpu(const char *uuid)
{
	for (int i = 0; i < ngpus; i++)
		if (strcasecmp(gpus[i].uuid, uuid) == 0)
			return i;
	return -1;
}

/* mig_dyn_profile returns the GPU instance profile index of GPU g with id,
 * -1 if none. */
static int mig_dyn_profile(int g, unsigned int id)
{
	for (int i = 0; i < SIM_GI_PROFILES; i++)
		if (gips[g][i].used && gips[g][i].id == id)
			return i;
	return -1;
}

/* mig_dyn_size returns the placement size of profile idx of GPU g (its
 * placements all have one size), 0 if it has none. */
static unsigned int mig_dyn_size(int g, int idx)
{
	return gipps[g][idx].n > 0 ? gipps[g][idx].size[0] : 0;
}

/* mig_dyn_slot takes a free MIG device slot, NULL when full. */
static struct sim_dev *mig_dyn_slot(void)
{
	if (nmigs >= SIM_MAX_GPUS * SIM_MAX_MIG)
		return NULL;
	return &migs[nmigs++];
}

/* mig_dyn_load adds the instances of the instances file to what load()
 * read: each compute instance a MIG device of its GPU, and a GPU instance
 * without one a hidden slot that only its id finds. */
static void mig_dyn_load(void)
{
	char p[4096], line[512], uuid[96], mig[96];
	if (!mig_dyn_path(p, sizeof p))
		return;
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return;
	struct {
		int g, idx;
		unsigned int id, start, has_ci;
	} dgi[SIM_DYN_LINES];
	int ndgi = 0;
	/* MIG mode first: the GPU instances below need it on. */
	while (fgets(line, sizeof line, f) != NULL) {
		int mode, g;
		if (sscanf(line, "dmode %95s %d", uuid, &mode) == 2 && (g = mig_dyn_gpu(uuid)) >= 0 &&
		    gpus[g].mig_mode >= 0 && gpus[g].nmig == 0 && (mode == 0 || mode == 1))
			gpus[g].mig_mode = mode;
	}
	rewind(f);
	while (fgets(line, sizeof line, f) != NULL && ndgi < SIM_DYN_LINES) {
		unsigned int id, start;
		int idx;
		if (sscanf(line, "dgi %95s %u %d %u", uuid, &id, &idx, &start) != 4)
			continue;
		int g = mig_dyn_gpu(uuid);
		if (g < 0 || idx < 0 || idx >= SIM_GI_PROFILES || !gips[g][idx].used || gpus[g].mig_mode != 1)
			continue;
		dgi[ndgi].g = g;
		dgi[ndgi].idx = idx;
		dgi[ndgi].id = id;
		dgi[ndgi].start = start;
		dgi[ndgi].has_ci = 0;
		ndgi++;
	}
	rewind(f);
	while (fgets(line, sizeof line, f) != NULL) {
		unsigned int giid, ciid, start;
		int cidx;
		if (sscanf(line, "dci %95s %u %u %d %u %95s", uuid, &giid, &ciid, &cidx, &start, mig) != 6)
			continue;
		int g = mig_dyn_gpu(uuid);
		for (int i = 0; i < ndgi; i++) {
			if (dgi[i].g != g || dgi[i].id != giid || cidx < 0 || cidx >= SIM_CI_PROFILES)
				continue;
			const struct sim_cip *c = &cips[g][dgi[i].idx][cidx];
			const struct sim_gip *gp = &gips[g][dgi[i].idx];
			struct sim_dev *m;
			if (!c->used || gpus[g].nmig == SIM_MAX_MIG || (m = mig_dyn_slot()) == NULL)
				break;
			m->used = 1;
			m->is_mig = 1;
			m->minor = -1;
			m->parent = &gpus[g];
			m->index = gpus[g].nmig;
			m->gi = giid;
			m->ci = ciid;
			m->gi_slices = gp->slices;
			m->ci_slices = c->slices;
			m->mem = gp->mem;
			snprintf(m->uuid, sizeof m->uuid, "%s", mig);
			gpus[g].mig[gpus[g].nmig++] = m;
			gis[m - migs] = (struct sim_gi){1, &gpus[g], giid, dgi[i].start, mig_dyn_size(g, dgi[i].idx), c->sm, dgi[i].idx};
			cis[m - migs] = (struct sim_ci){1, &gis[m - migs], ciid, start, c->slices, cidx};
			dgi[i].has_ci = 1;
			break;
		}
	}
	fclose(f);
	for (int i = 0; i < ndgi; i++) {
		struct sim_dev *m;
		if (dgi[i].has_ci || (m = mig_dyn_slot()) == NULL)
			continue;
		/* Not one of the GPU's MIG devices: a GPU instance alone. */
		m->used = 1;
		m->is_mig = 1;
		m->minor = -1;
		m->parent = &gpus[dgi[i].g];
		m->gi = dgi[i].id;
		gis[m - migs] = (struct sim_gi){1, &gpus[dgi[i].g], dgi[i].id, dgi[i].start, mig_dyn_size(dgi[i].g, dgi[i].idx), gips[dgi[i].g][dgi[i].idx].sm, dgi[i].idx};
	}
}

/* mig_dyn_gi_by_id finds GPU instance id of d among all GPU instances,
 * those without a compute instance too. */
static int mig_dyn_gi_by_id(const struct sim_dev *d, unsigned int id, struct sim_gi **gi)
{
	for (int k = 0; k < nmigs; k++) {
		if (gis[k].used && gis[k].parent == d && gis[k].id == id) {
			*gi = &gis[k];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

#ifndef NRI_GPU_SIM_NVML_NO_PROPS
/* mig_dyn_edit rewrites the instances file under an exclusive lock:
 * without the lines that start with drop (none when NULL), with add
 * (none when NULL) appended. */
static int mig_dyn_edit(const char *drop, const char *add)
{
	char p[4096], tmp[4200], lock[4200], line[512];
	if (!mig_dyn_path(p, sizeof p))
		return NVML_ERROR_UNKNOWN;
	snprintf(lock, sizeof lock, "%s.lock", p);
	int lfd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
	if (lfd < 0)
		return NVML_ERROR_UNKNOWN;
	flock(lfd, LOCK_EX);
	snprintf(tmp, sizeof tmp, "%s.%d", p, (int)getpid());
	int r = NVML_ERROR_UNKNOWN;
	FILE *out = fopen(tmp, "w");
	if (out != NULL) {
		FILE *in = fopen(p, "r");
		if (in != NULL) {
			while (fgets(line, sizeof line, in) != NULL)
				if (drop == NULL || strncmp(line, drop, strlen(drop)) != 0)
					fputs(line, out);
			fclose(in);
		}
		if (add != NULL)
			fputs(add, out);
		if (fclose(out) == 0 && rename(tmp, p) == 0)
			r = NVML_SUCCESS;
		else
			unlink(tmp);
	}
	flock(lfd, LOCK_UN);
	close(lfd);
	return r;
}

/* mig_dyn_caps writes (or with remove, removes) the kernel's capability
 * file of GPU instance gi (ci < 0) or of its compute instance ci, under
 * the node tree the state file lies in; nothing when the state file is
 * elsewhere. Minors are numbered as simnode's GIMinor and CIMinor. */
static void mig_dyn_caps(const struct sim_dev *g, unsigned int gi, int ci, int remove)
{
	char state[4096], dir[4600], file[4700];
	if (g->minor < 0 || !state_path(state, sizeof state))
		return;
	size_t n = strlen(state), s = strlen(NRI_GPU_SIM_NVML_STATE_PATH);
	if (n < s || strcmp(state + n - s, NRI_GPU_SIM_NVML_STATE_PATH) != 0)
		return;
	state[n - s] = '\0';
	int minor = 3 + g->minor * 15 * 9 + (int)gi * 9;
	if (ci < 0)
		snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/capabilities/gpu%d/mig/gi%u", state, g->minor, gi);
	else {
		snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/capabilities/gpu%d/mig/gi%u/ci%d", state, g->minor, gi, ci);
		minor += 1 + ci;
	}
	snprintf(file, sizeof file, "%s/access", dir);
	if (remove) {
		unlink(file);
		rmdir(dir);
		return;
	}
	/* mkdir -p */
	for (char *q = dir + strlen(state) + 1; (q = strchr(q, '/')) != NULL; q++) {
		*q = '\0';
		mkdir(dir, 0755);
		*q = '/';
	}
	mkdir(dir, 0755);
	FILE *f = fopen(file, "w");
	if (f == NULL)
		return;
	fprintf(f, "DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor);
	fclose(f);
}

/* mig_dyn_uuid makes a MIG device's UUID from its GPU's and its ids. */
static void mig_dyn_uuid(const char *gpu, unsigned int gi, unsigned int ci, char *out, size_t n)
{
	unsigned long long h[2] = {1469598103934665603ULL, 1099511628211ULL};
	char key[160];
	snprintf(key, sizeof key, "%s/gi%u/ci%u", gpu, gi, ci);
	for (int k = 0; k < 2; k++)
		for (const char *c = key; *c; c++)
			h[k] = (h[k] ^ (unsigned char)*c) * 1099511628211ULL + (unsigned long long)k;
	snprintf(out, n, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", h[0] >> 32, (h[0] >> 16) & 0xffff, h[0] & 0xffff,
		 h[1] >> 48, h[1] & 0xffffffffffffULL);
}

/* mig_dyn_gi_id is the id a GPU instance at start of size gets. */
static unsigned int mig_dyn_gi_id(unsigned int start, unsigned int size)
{
	switch (size) {
	case 8: return 0;
	case 4: return start == 0 ? 1 : 2;
	case 2: return 3 + start / 2;
	}
	return 7 + start;
}

int nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement, nvmlGpuInstance_t *gi)
{
	int r;
	if (d != NULL && d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (prop_of(d, gi, &r) == NULL)
		return r;
	if (placement == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->mig_mode != 1)
		return NVML_ERROR_NOT_SUPPORTED;
	if (!mig_dyn_admin())
		return NVML_ERROR_NO_PERMISSION;
	load(); /* what exists now, other processes' instances too */
	int g = gpu_of(d), idx = mig_dyn_profile(g, profileId);
	if (idx < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_gipp *pp = &gipps[g][idx];
	int valid = 0;
	for (int k = 0; k < pp->n; k++)
		valid |= pp->start[k] == placement->start && pp->size[k] == placement->size;
	if (!valid)
		return NVML_ERROR_INVALID_ARGUMENT;
	/* Every GPU instance of the GPU once (a GPU instance with several
	 * compute instances has a slot for each). */
	unsigned int compute = gips[g][idx].slices, same = 1, seen[16] = {0};
	for (int k = 0; k < nmigs; k++) {
		const struct sim_gi *o = &gis[k];
		if (!o->used || o->parent != d || o->id >= 16 || seen[o->id]++)
			continue;
		if (o->start < placement->start + placement->size && placement->start < o->start + o->size)
			return NVML_ERROR_INSUFFICIENT_RESOURCES;
		compute += gips[g][o->profile].slices;
		same += o->profile == idx;
	}
	if (compute > SIM_COMPUTE_SLICES || same > gips[g][idx].instances)
		return NVML_ERROR_INSUFFICIENT_RESOURCES;
	unsigned int id = mig_dyn_gi_id(placement->start, placement->size);
	char add[256];
	snprintf(add, sizeof add, "dgi %s %u %d %u\n", d->uuid, id, idx, placement->start);
	if ((r = mig_dyn_edit(NULL, add)) != NVML_SUCCESS)
		return r;
	mig_dyn_caps(d, id, -1, 0);
	load();
	return mig_dyn_gi_by_id(d, id, gi);
}

int nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int profileId, nvmlGpuInstance_t *out, unsigned int *count)
{
	int r;
	if (d != NULL && d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (prop_of(d, count, &r) == NULL)
		return r;
	if (d->mig_mode != 1)
		return NVML_ERROR_NOT_SUPPORTED;
	load(); /* what exists now, other processes' instances too */
	int g = gpu_of(d), idx = mig_dyn_profile(g, profileId);
	if (idx < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = 0, seen[16] = {0};
	for (int k = 0; k < nmigs; k++) {
		if (!gis[k].used || gis[k].parent != d || gis[k].profile != idx || gis[k].id >= 16 || seen[gis[k].id]++)
			continue;
		if (out != NULL && n < *count)
			out[n] = &gis[k];
		n++;
	}
	if (out != NULL && n > *count) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = n;
	return NVML_SUCCESS;
}

/* mig_dyn_owned reports whether gi is one the instances file made. */
static int mig_dyn_owned(const struct sim_gi *gi)
{
	char p[4096], line[512], uuid[96];
	unsigned int id;
	if (!mig_dyn_path(p, sizeof p))
		return 0;
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return 0;
	int found = 0;
	while (!found && fgets(line, sizeof line, f) != NULL)
		found = sscanf(line, "dgi %95s %u", uuid, &id) == 2 && id == gi->id && strcasecmp(uuid, gi->parent->uuid) == 0;
	fclose(f);
	return found;
}

int nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profileId, nvmlComputeInstance_t *ci)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!gi_ok(gi) || ci == NULL || profileId >= SIM_CI_PROFILES)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (gi->parent->err)
		return gi->parent->err;
	if (!mig_dyn_admin())
		return NVML_ERROR_NO_PERMISSION;
	struct sim_dev *d = gi->parent;
	int g = gpu_of(d);
	const struct sim_cip *c = &cips[g][gi->profile][profileId];
	if (!c->used)
		return NVML_ERROR_NOT_SUPPORTED;
	if (!mig_dyn_owned(gi))
		return NVML_ERROR_NOT_SUPPORTED; /* the simulation's limit: state-file instances are fixed */
	/* Compute instances of one size lie side by side in the GPU
	 * instance's compute slices; the first free id and place. */
	unsigned int used = 0, ids = 0, giid = gi->id, gslices = gips[g][gi->profile].slices;
	for (int k = 0; k < nmigs; k++) {
		if (!cis[k].used || gis[k].parent != d || gis[k].id != giid)
			continue;
		ids |= 1u << cis[k].id;
		for (unsigned int s = cis[k].start; s < cis[k].start + cis[k].size && s < 32; s++)
			used |= 1u << s;
	}
	unsigned int id = 0, start = 0;
	while (id < 8 && ids & (1u << id))
		id++;
	for (; start + c->slices <= gslices; start += c->slices) {
		unsigned int want = ((1u << c->slices) - 1) << start;
		if (!(used & want))
			break;
	}
	if (id == 8 || start + c->slices > gslices)
		return NVML_ERROR_INSUFFICIENT_RESOURCES;
	char mig[96], add[320];
	mig_dyn_uuid(d->uuid, giid, id, mig, sizeof mig);
	snprintf(add, sizeof add, "dci %s %u %u %u %u %s\n", d->uuid, giid, id, profileId, start, mig);
	int r = mig_dyn_edit(NULL, add);
	if (r != NVML_SUCCESS)
		return r;
	mig_dyn_caps(d, giid, (int)id, 0);
	load();
	for (int k = 0; k < nmigs; k++) {
		if (cis[k].used && gis[k].parent == d && gis[k].id == giid && cis[k].id == id) {
			*ci = &cis[k];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_UNKNOWN;
}

int nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (ci == NULL || ci < cis || ci >= cis + sizeof cis / sizeof cis[0] || !ci->used)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!mig_dyn_admin())
		return NVML_ERROR_NO_PERMISSION;
	struct sim_dev *d = ci->gi->parent;
	if (!mig_dyn_owned(ci->gi))
		return NVML_ERROR_NOT_SUPPORTED;
	char drop[200];
	unsigned int giid = ci->gi->id, id = ci->id;
	snprintf(drop, sizeof drop, "dci %s %u %u ", d->uuid, giid, id);
	int r = mig_dyn_edit(drop, NULL);
	if (r != NVML_SUCCESS)
		return r;
	mig_dyn_caps(d, giid, (int)id, 1);
	load();
	return NVML_SUCCESS;
}

int nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi)
{
	if (!is_initialized())
		return NVML_ERROR_UNINITIALIZED;
	if (!gi_ok(gi))
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!mig_dyn_admin())
		return NVML_ERROR_NO_PERMISSION;
	struct sim_dev *d = gi->parent;
	if (!mig_dyn_owned(gi))
		return NVML_ERROR_NOT_SUPPORTED;
	unsigned int giid = gi->id;
	for (int k = 0; k < nmigs; k++)
		if (cis[k].used && gis[k].parent == d && gis[k].id == giid)
			return NVML_ERROR_IN_USE;
	char drop[200];
	snprintf(drop, sizeof drop, "dgi %s %u ", d->uuid, giid);
	int r = mig_dyn_edit(drop, NULL);
	if (r != NVML_SUCCESS)
		return r;
	mig_dyn_caps(d, giid, -1, 1);
	load();
	return NVML_SUCCESS;
}

#define NVML_ERROR_RESET_REQUIRED 16
#define SIM_ARCH_HOPPER 9

/* nvmlDeviceSetMigMode switches GPU d's MIG mode (see the top): root
 * only; refused with a GPU instance on the GPU; at once from Hopper on,
 * pending a GPU reset before. */
int nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activationStatus)
{
	int r;
	if (d != NULL && d->is_mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_props *p = prop_of(d, activationStatus, &r);
	if (p == NULL)
		return r;
	if (mode > 1)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (d->mig_mode < 0)
		return NVML_ERROR_NOT_SUPPORTED;
	if (!mig_dyn_admin())
		return NVML_ERROR_NO_PERMISSION;
	int arch = p->arch;
	load(); /* what exists now, other processes' instances too */
	*activationStatus = NVML_SUCCESS;
	if ((unsigned int)d->mig_mode == mode)
		return NVML_SUCCESS;
	for (int k = 0; k < nmigs; k++) {
		if (gis[k].used && gis[k].parent == d) {
			*activationStatus = NVML_ERROR_IN_USE;
			return NVML_ERROR_IN_USE;
		}
	}
	if (d->nmig > 0) {
		*activationStatus = NVML_ERROR_IN_USE;
		return NVML_ERROR_IN_USE;
	}
	if (arch < SIM_ARCH_HOPPER) {
		*activationStatus = NVML_ERROR_RESET_REQUIRED;
		return NVML_SUCCESS;
	}
	char drop[160], add[160];
	snprintf(drop, sizeof drop, "dmode %s ", d->uuid);
	snprintf(add, sizeof add, "dmode %s %u\n", d->uuid, mode);
	if ((r = mig_dyn_edit(drop, add)) != NVML_SUCCESS)
		return r;
	load();
	return NVML_SUCCESS;
}
#endif
