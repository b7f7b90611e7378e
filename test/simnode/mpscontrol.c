//go:build ignore

// (The line above keeps the go command from treating this C file as a cgo
// source of package simnode, which only embeds it.)

/*
 * nvidia-cuda-mps-control of test/simnode: a stand-in for NVIDIA's MPS
 * control daemon with its command line and the control-pipe behaviour of
 * the commands nri-gpu uses. It is not NVIDIA's program and starts no MPS
 * server.
 *
 *   nvidia-cuda-mps-control -d   start the daemon in the background: it
 *                                binds $CUDA_MPS_PIPE_DIRECTORY/control,
 *                                writes nvidia-cuda-mps-control.pid there,
 *                                and returns once it accepts commands
 *   nvidia-cuda-mps-control -f   the same in the foreground
 *   nvidia-cuda-mps-control -v   print the driver's version
 *   nvidia-cuda-mps-control      a client: sends each line of stdin to the
 *                                daemon and prints its answers; exit 1
 *                                when no daemon answers
 *
 * The daemon logs to $CUDA_MPS_LOG_DIRECTORY/control.log as the real one
 * does ("Starting control daemon using socket ...", "Cmd:<command>" for
 * each command), plus one line the real one does not write, its
 * CUDA_VISIBLE_DEVICES, which tests read. Commands: get/set of the default
 * active thread percentage and of a device's default pinned memory limit,
 * get_server_list (no servers: none is started), the per-server setters
 * (which find no server), and quit.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 64

static char pipe_dir[4096], log_dir[4096], sock_path[4200], pid_path[4200];
static double thread_percentage = 100.0;
static char pinned[MAX_DEVICES][32];
static FILE *logfile;

static void env_dir(char *out, size_t n, const char *var, const char *def)
{
	const char *v = getenv(var);
	snprintf(out, n, "%s", v != NULL && *v != '\0' ? v : def);
}

static void logline(const char *fmt, ...)
{
	if (logfile == NULL)
		return;
	struct timeval tv;
	gettimeofday(&tv, NULL);
	struct tm tm;
	localtime_r(&tv.tv_sec, &tm);
	char when[64];
	strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
	fprintf(logfile, "[%s.%03ld Control %d] ", when, (long)(tv.tv_usec / 1000), (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	vfprintf(logfile, fmt, ap);
	va_end(ap);
	fputc('\n', logfile);
	fflush(logfile);
}

/* limit_ok checks a pinned memory limit: digits then M or G. */
static int limit_ok(const char *v)
{
	size_t n = strlen(v);
	if (n < 2 || n > 20 || (v[n - 1] != 'M' && v[n - 1] != 'G'))
		return 0;
	for (size_t i = 0; i + 1 < n; i++)
		if (!isdigit((unsigned char)v[i]))
			return 0;
	return 1;
}

/* device_index reads a device argument: an ordinal (the daemon sees its
 * GPUs through CUDA_VISIBLE_DEVICES, the first as 0). */
static int device_index(const char *v)
{
	char *end;
	long d = strtol(v, &end, 10);
	if (*v == '\0' || *end != '\0' || d < 0 || d >= MAX_DEVICES)
		return -1;
	return (int)d;
}

/* command runs one command and writes its answer to out; it returns 1
 * when the daemon is to quit. */
static int command(char *line, FILE *out)
{
	logline("Cmd:%s", line);
	char *argv[8];
	int argc = 0;
	for (char *tok = strtok(line, " \t"); tok != NULL && argc < 8; tok = strtok(NULL, " \t"))
		argv[argc++] = tok;
	if (argc == 0)
		return 0;
	const char *c = argv[0];
	if (strcmp(c, "quit") == 0 && argc == 1)
		return 1;
	if (strcmp(c, "get_default_active_thread_percentage") == 0 && argc == 1) {
		fprintf(out, "%.1f\n", thread_percentage);
	} else if (strcmp(c, "set_default_active_thread_percentage") == 0 && argc == 2) {
		char *end;
		double v = strtod(argv[1], &end);
		if (*end != '\0' || v <= 0 || v > 100)
			fprintf(out, "Invalid active thread percentage %s\n", argv[1]);
		else
			fprintf(out, "%.1f\n", thread_percentage = v);
	} else if (strcmp(c, "get_default_device_pinned_mem_limit") == 0 && argc == 2) {
		int d = device_index(argv[1]);
		if (d < 0)
			fprintf(out, "Invalid device %s\n", argv[1]);
		else
			fprintf(out, "%s\n", pinned[d][0] != '\0' ? pinned[d] : "0");
	} else if (strcmp(c, "set_default_device_pinned_mem_limit") == 0 && argc == 3) {
		int d = device_index(argv[1]);
		if (d < 0 || !limit_ok(argv[2]))
			fprintf(out, "Invalid device or limit %s %s\n", argv[1], argv[2]);
		else
			snprintf(pinned[d], sizeof pinned[d], "%s", argv[2]);
	} else if (strcmp(c, "get_server_list") == 0 && argc == 1) {
		/* No server: the stand-in starts none. */
	} else if ((strcmp(c, "set_active_thread_percentage") == 0 && argc == 3) ||
		   (strcmp(c, "set_device_pinned_mem_limit") == 0 && argc == 4) ||
		   (strcmp(c, "get_client_list") == 0 && argc == 2)) {
		fprintf(out, "Server with PID %s not found\n", argv[1]);
	} else {
		fprintf(out, "Invalid command %s\n", c);
	}
	return 0;
}

/* serve answers one connection: lines of commands, each answer ended by a
 * NUL byte. It returns 1 after quit. */
static int serve(int fd)
{
	FILE *in = fdopen(fd, "r");
	FILE *out = fdopen(dup(fd), "w");
	if (in == NULL || out == NULL)
		return 0;
	char line[1024];
	int quit = 0;
	while (!quit && fgets(line, sizeof line, in) != NULL) {
		line[strcspn(line, "\r\n")] = '\0';
		quit = command(line, out);
		fputc('\0', out);
		fflush(out);
	}
	fclose(in);
	fclose(out);
	return quit;
}

static void cleanup(void)
{
	unlink(sock_path);
	unlink(pid_path);
}

static void on_term(int sig)
{
	(void)sig;
	cleanup();
	_exit(0);
}

/* daemon_main binds the control socket, then (background: after telling
 * the parent through ready) serves until quit. */
static int daemon_main(int background)
{
	if (mkdir(pipe_dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "cannot create the pipe directory %s: %s\n", pipe_dir, strerror(errno));
		return 1;
	}
	mkdir(log_dir, 0755);
	FILE *pf = fopen(pid_path, "r");
	int old = 0;
	if (pf != NULL) {
		if (fscanf(pf, "%d", &old) != 1)
			old = 0;
		fclose(pf);
	}
	if (old > 0 && kill(old, 0) == 0) {
		char stat[64], buf[512];
		snprintf(stat, sizeof stat, "/proc/%d/stat", old);
		FILE *sf = fopen(stat, "r");
		char state = 'Z';
		if (sf != NULL && fgets(buf, sizeof buf, sf) != NULL) {
			char *p = strrchr(buf, ')');
			if (p != NULL && p[1] == ' ')
				state = p[2];
		}
		if (sf != NULL)
			fclose(sf);
		if (state != 'Z') {
			fprintf(stderr, "An instance of this daemon is already running\n");
			return 1;
		}
	}
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (strlen(sock_path) >= sizeof addr.sun_path) {
		fprintf(stderr, "control socket path too long: %s\n", sock_path);
		return 1;
	}
	strcpy(addr.sun_path, sock_path);
	unlink(sock_path);
	if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 16) != 0) {
		fprintf(stderr, "cannot serve %s: %s\n", sock_path, strerror(errno));
		return 1;
	}
	int ready[2] = {-1, -1};
	if (background) {
		if (pipe(ready) != 0)
			return 1;
		pid_t child = fork();
		if (child < 0)
			return 1;
		if (child > 0) {
			close(ready[1]);
			char b;
			return read(ready[0], &b, 1) == 1 ? 0 : 1;
		}
		close(ready[0]);
		setsid();
		int null = open("/dev/null", O_RDWR);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
	}
	char logpath[4200];
	snprintf(logpath, sizeof logpath, "%s/control.log", log_dir);
	logfile = fopen(logpath, "a");
	pf = fopen(pid_path, "w");
	if (pf != NULL) {
		fprintf(pf, "%d\n", (int)getpid());
		fclose(pf);
	}
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	signal(SIGPIPE, SIG_IGN);
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	logline("Starting control daemon using socket %s", sock_path);
	logline("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=%s", pipe_dir);
	logline("CUDA_VISIBLE_DEVICES=%s", vis != NULL ? vis : "");
	if (background) {
		if (write(ready[1], "r", 1) != 1)
			return 1;
		close(ready[1]);
	}
	for (;;) {
		int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		logline("Accepting connection...");
		if (serve(c)) {
			logline("Exit");
			break;
		}
	}
	cleanup();
	return 0;
}

/* client_main sends stdin's lines to the daemon and prints the answers. */
static int client_main(void)
{
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (strlen(sock_path) >= sizeof addr.sun_path) {
		fprintf(stderr, "control socket path too long: %s\n", sock_path);
		return 1;
	}
	memcpy(addr.sun_path, sock_path, strlen(sock_path) + 1);
	if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
		fprintf(stderr, "Cannot find MPS control daemon process\n");
		return 1;
	}
	char line[1024];
	while (fgets(line, sizeof line, stdin) != NULL) {
		size_t n = strcspn(line, "\r\n");
		line[n] = '\n';
		if (write(s, line, n + 1) != (ssize_t)(n + 1))
			return 1;
		char c;
		ssize_t r;
		while ((r = read(s, &c, 1)) == 1 && c != '\0')
			putchar(c);
		if (r != 1) {
			/* The daemon went away (quit). */
			break;
		}
	}
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	env_dir(pipe_dir, sizeof pipe_dir, "CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
	env_dir(log_dir, sizeof log_dir, "CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps");
	snprintf(sock_path, sizeof sock_path, "%s/control", pipe_dir);
	snprintf(pid_path, sizeof pid_path, "%s/nvidia-cuda-mps-control.pid", pipe_dir);
	if (argc == 2 && strcmp(argv[1], "-d") == 0)
		return daemon_main(1);
	if (argc == 2 && strcmp(argv[1], "-f") == 0)
		return daemon_main(0);
	if (argc == 2 && strcmp(argv[1], "-v") == 0) {
		printf("nvidia-cuda-mps-control %s\n", NRI_GPU_SIM_DRIVER_VERSION);
		return 0;
	}
	if (argc == 1)
		return client_main();
	fprintf(stderr, "usage: nvidia-cuda-mps-control [-d | -f]\n");
	return 1;
}
