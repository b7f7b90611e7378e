//go:build ignore

// (The line above keeps the go command from treating this C file as a cgo source
// of package images, which only embeds it.)

/*
 * gpucheck: shows what the dynamic loader inside a container really resolves.
 *
 * usage: gpucheck [step...]   steps: cuda, cuda-dev, nvml, app (default: cuda nvml)
 *
 * cuda: dlopen("libcuda.so.1"), cuInit(0), cuDriverGetVersion, cuDeviceGetCount
 * cuda-dev: the same through dlopen("libcuda.so"), the unversioned name that
 *       -lcuda (JIT linkers such as Triton's) searches the library path for
 * nvml: dlopen("libnvidia-ml.so.1"), nvmlInit_v2(), nvmlSystemGetDriverVersion
 * app:  dlopen("libapp.so.1") (an image's own library, found through the image's
 *       LD_LIBRARY_PATH), app_hello()
 *
 * One line per step on stdout:
 *   libcuda.so.1: ok cuInit=0 cuda=13000 devices=2
 *   libnvidia-ml.so.1: ok driver=580.126.09
 *   libapp.so.1: ok app_hello=42
 * or "<lib>: FAIL <reason>"; exit status 1 if any step failed, 2 on bad usage.
 * Every step runs even after a failure, so one run reports everything.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_int_fn)(int *);
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_version_fn)(char *, unsigned int);
typedef int (*nvml_count_fn)(unsigned int *);
typedef int (*app_hello_fn)(void);

static void *sym(void *h, const char *lib, const char *name) {
	void *p;
	dlerror();
	p = dlsym(h, name);
	if (p == NULL) {
		const char *e = dlerror();
		printf("%s: FAIL dlsym %s: %s\n", lib, name, e ? e : "null symbol");
	}
	return p;
}

static int check_cuda(const char *lib) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		printf("%s: FAIL %s\n", lib, dlerror());
		return 1;
	}
	cu_init_fn cu_init = (cu_init_fn)sym(h, lib, "cuInit");
	cu_int_fn cu_version = (cu_int_fn)sym(h, lib, "cuDriverGetVersion");
	cu_int_fn cu_count = (cu_int_fn)sym(h, lib, "cuDeviceGetCount");
	if (!cu_init || !cu_version || !cu_count)
		return 1;
	int rc = cu_init(0);
	if (rc != 0) {
		printf("%s: FAIL cuInit=%d\n", lib, rc);
		return 1;
	}
	int v = 0, n = 0;
	if ((rc = cu_version(&v)) != 0) {
		printf("%s: FAIL cuDriverGetVersion=%d\n", lib, rc);
		return 1;
	}
	if ((rc = cu_count(&n)) != 0) {
		printf("%s: FAIL cuDeviceGetCount=%d\n", lib, rc);
		return 1;
	}
	printf("%s: ok cuInit=0 cuda=%d devices=%d\n", lib, v, n);
	return 0;
}

static int check_nvml(void) {
	const char *lib = "libnvidia-ml.so.1";
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		printf("%s: FAIL %s\n", lib, dlerror());
		return 1;
	}
	nvml_init_fn init = (nvml_init_fn)sym(h, lib, "nvmlInit_v2");
	nvml_version_fn version = (nvml_version_fn)sym(h, lib, "nvmlSystemGetDriverVersion");
	if (!init || !version)
		return 1;
	int rc = init();
	if (rc != 0) {
		printf("%s: FAIL nvmlInit_v2=%d\n", lib, rc);
		return 1;
	}
	char buf[80];
	memset(buf, 0, sizeof buf);
	if ((rc = version(buf, sizeof buf)) != 0) {
		printf("%s: FAIL nvmlSystemGetDriverVersion=%d\n", lib, rc);
		return 1;
	}
	buf[sizeof buf - 1] = 0;
	/* optional: the device count, when the library has it */
	nvml_count_fn count = (nvml_count_fn)dlsym(h, "nvmlDeviceGetCount_v2");
	unsigned int n = 0;
	if (count != NULL && count(&n) == 0)
		printf("%s: ok driver=%s devices=%u\n", lib, buf, n);
	else
		printf("%s: ok driver=%s\n", lib, buf);
	return 0;
}

static int check_app(void) {
	const char *lib = "libapp.so.1";
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		printf("%s: FAIL %s\n", lib, dlerror());
		return 1;
	}
	app_hello_fn hello = (app_hello_fn)sym(h, lib, "app_hello");
	if (!hello)
		return 1;
	printf("%s: ok app_hello=%d\n", lib, hello());
	return 0;
}

int main(int argc, char **argv) {
	static char *defaults[] = {"cuda", "nvml"};
	char **steps = argv + 1;
	int n = argc - 1, failed = 0;
	if (n == 0) {
		steps = defaults;
		n = 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 0; i < n; i++) {
		if (strcmp(steps[i], "cuda") == 0)
			failed |= check_cuda("libcuda.so.1");
		else if (strcmp(steps[i], "cuda-dev") == 0)
			failed |= check_cuda("libcuda.so");
		else if (strcmp(steps[i], "nvml") == 0)
			failed |= check_nvml();
		else if (strcmp(steps[i], "app") == 0)
			failed |= check_app();
		else {
			fprintf(stderr, "usage: gpucheck [cuda|cuda-dev|nvml|app]...\n");
			return 2;
		}
	}
	return failed ? 1 : 0;
}
