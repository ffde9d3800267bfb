/* bench_fs: `dg mount` against baselines measured in the same run. dg side: a
 * child `dg ps` (memory only) and a child `dg mount -f`; a 256 MiB float32
 * variable is read (cold: just updated through HTTP; repeated: unchanged) and
 * written (O_TRUNC, commit at close) through the mount in 1 MiB read()/write()
 * calls. Baselines: the ps's own HTTP GET/PUT of that variable (dg_var_get/put),
 * the same loop on a tmpfs file (/dev/shm) and on bench_fs_minimal (an in-memory
 * FUSE file: FUSE's own cost), default and direct_io. Also stat and 4 KiB read
 * latencies. Prints medians and the ratios of the filesystem issue's targets. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dg/client.h"
#include "dg/tensor.h"

#define CHUNK (1u << 20)                /* bytes per read()/write() */
#define VAR "bench/w"                   /* the big variable */
#define SMALL "bench/small"             /* a 4 KiB variable for the latency cases */
#define SMALL_BYTES 4096
#define MAX_RUNS 64

struct opts {
	size_t bytes;                   /* size of the big variable */
	int runs;                       /* timed runs; the median is printed */
	int lat_n;                      /* samples per latency case */
	bool strict;                    /* exit 4 when a target is missed */
	bool no_minimal;
	const char *dg_path;
	const char *minimal_path;
};

static struct opts O = { .bytes = (size_t)256 << 20, .runs = 5, .lat_n = 2000 };

/* Everything the bench started, for cleanup (also from a signal handler). */
#define N_MOUNTS 3                      /* dg mount, minimal default, minimal direct_io */
static struct {
	char dir[64];                   /* mkdtemp: cluster.json, port, logs, mountpoints */
	char shm[64];                   /* the tmpfs file */
	pid_t ps_pid;
	pid_t mount_pid[N_MOUNTS];
	char mnt[N_MOUNTS][96];
	bool mounted[N_MOUNTS];
} S;

static int failures;                    /* verification failures: exit status 3 */

static void die(const char *what)
{
	fprintf(stderr, "bench_fs: %s\n", what);
	exit(2);
}

/* ------------------------------------------------------------- data pattern */

/* Element i of version k: exact in float32 (< 2^24), different for each k. */
static float pat(size_t i, uint32_t k)
{
	return (float)(((uint32_t)i + k * 1000003u) & 0xffffffu);
}

static void fill(float *p, size_t n, uint32_t k)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pat(i, k);
}

/* Check 4 samples of a chunk that starts at element first: cheap enough to run
 * inside every timed loop alike. */
static bool chunk_ok(const float *p, size_t n, size_t first, uint32_t k)
{
	size_t at[4] = { 0, n / 3, n / 2, n - 1 };

	for (int j = 0; j < 4; j++)
		if (n && p[at[j]] != pat(first + at[j], k))
			return false;
	return true;
}

static void verify_failed(const char *what, uint32_t k)
{
	failures++;
	fprintf(stderr, "WARNING: %s: the data read is not version %u of the pattern\n", what, k);
}

/* ----------------------------------------------------------- child processes */

/* fork + exec argv with stdout/stderr to logp; the child gets SIGTERM when the
 * bench dies (dg mount and dg ps stop cleanly on it). */
static pid_t spawn(char *const *argv, const char *logp)
{
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (pid < 0)
		die("fork failed");
	return pid;
}

static int run_wait(char *const *argv)
{
	int status;
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);

		if (fd >= 0)
			dup2(fd, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void unmount_at(int i)
{
	char *argv[] = { "fusermount3", "-u", S.mnt[i], NULL };
	char *lazy[] = { "fusermount3", "-u", "-z", S.mnt[i], NULL };

	if (S.mounted[i] && run_wait(argv) != 0)
		run_wait(lazy);
	S.mounted[i] = false;
	bench_stop_child(S.mount_pid[i], 10000);
	S.mount_pid[i] = 0;
	rmdir(S.mnt[i]);
}

/* Unmount, stop the children, remove what the bench wrote (file by file: never
 * a recursive removal that could walk into a mount). */
static void cleanup(void)
{
	static const char *const files[] = { "cluster.json", "port", "ps.log", "mount.log",
					     "minimal.log", "minimal_dio.log" };
	char p[160];

	for (int i = 0; i < N_MOUNTS; i++)
		if (S.mount_pid[i] || S.mounted[i])
			unmount_at(i);
	bench_stop_child(S.ps_pid, 10000);
	S.ps_pid = 0;
	if (S.shm[0])
		unlink(S.shm);
	if (S.dir[0]) {
		for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
			snprintf(p, sizeof p, "%s/%s", S.dir, files[i]);
			unlink(p);
		}
		rmdir(S.dir);
	}
}

static void on_signal(int sig)
{
	/* Best effort: the children also get SIGTERM from PR_SET_PDEATHSIG. */
	cleanup();
	_exit(128 + sig);
}

/* Is path the root of a mount (another device than its parent)? */
static bool is_mounted(const char *path)
{
	struct stat a, b;
	char parent[160];

	snprintf(parent, sizeof parent, "%s/..", path);
	return stat(path, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

/* Wait up to 30 s for mount i to appear; exit 2 with its log when it does not. */
static void wait_mounted(int i, const char *logp)
{
	int status;

	for (int t = 0; t < 3000; t++) {
		if (is_mounted(S.mnt[i])) {
			S.mounted[i] = true;
			return;
		}
		if (waitpid(S.mount_pid[i], &status, WNOHANG) == S.mount_pid[i]) {
			S.mount_pid[i] = 0;
			break;
		}
		usleep(10000);
	}
	fprintf(stderr, "bench_fs: %s did not mount; its log:\n", S.mnt[i]);
	bench_dump_file(logp);
	exit(2);
}

static int read_port(void)
{
	char p[128];
	int port = 0;
	FILE *f;

	snprintf(p, sizeof p, "%s/port", S.dir);
	f = fopen(p, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%d", &port) != 1 || port <= 0 || port > 65535)
		port = 0;
	fclose(f);
	return port;
}

/* dg ps on a free port, then dg mount of a cluster naming that port. */
static void start_dg(char *addr, size_t addr_len)
{
	char cluster[128], portp[128], logp[128], mlogp[128];
	char *ps_argv[] = { (char *)O.dg_path, "ps", "--cluster", cluster, "--port-file",
			    portp, NULL };
	char *m_argv[] = { (char *)O.dg_path, "mount", S.mnt[0], "--cluster", cluster, "-f",
			   "--timeout", "120", NULL };
	FILE *f;
	int port = 0, status;

	snprintf(cluster, sizeof cluster, "%s/cluster.json", S.dir);
	snprintf(portp, sizeof portp, "%s/port", S.dir);
	snprintf(logp, sizeof logp, "%s/ps.log", S.dir);
	snprintf(mlogp, sizeof mlogp, "%s/mount.log", S.dir);
	f = fopen(cluster, "w");
	if (!f || fprintf(f, "{\"ps\": [\"127.0.0.1:0\"]}\n") < 0 || fclose(f) != 0)
		die("cannot write cluster.json");
	S.ps_pid = spawn(ps_argv, logp);
	for (int t = 0; t < 3000 && !(port = read_port()); t++) {
		if (waitpid(S.ps_pid, &status, WNOHANG) == S.ps_pid) {
			S.ps_pid = 0;
			break;
		}
		usleep(10000);
	}
	if (!port) {
		fprintf(stderr, "bench_fs: `%s ps` did not start; its log:\n", O.dg_path);
		bench_dump_file(logp);
		exit(2);
	}
	snprintf(addr, addr_len, "127.0.0.1:%d", port);
	f = fopen(cluster, "w");
	if (!f || fprintf(f, "{\"ps\": [\"%s\"]}\n", addr) < 0 || fclose(f) != 0)
		die("cannot rewrite cluster.json");
	mkdir(S.mnt[0], 0755);
	S.mount_pid[0] = spawn(m_argv, mlogp);
	wait_mounted(0, mlogp);
}

static void start_minimal(int i, bool direct_io)
{
	char mib[32], logp[128];
	char *argv[] = { (char *)O.minimal_path, S.mnt[i], mib, "-f",
			 direct_io ? "--direct-io" : NULL, NULL };

	snprintf(mib, sizeof mib, "%zu", O.bytes >> 20);
	snprintf(logp, sizeof logp, "%s/%s.log", S.dir, direct_io ? "minimal_dio" : "minimal");
	mkdir(S.mnt[i], 0755);
	S.mount_pid[i] = spawn(argv, logp);
	wait_mounted(i, logp);
}

/* ------------------------------------------------------------ the I/O loops */

static char *iobuf;                     /* CHUNK bytes, page aligned */

/* Read path to its end in CHUNK reads, checking samples against version k.
 * Returns seconds from open to close. */
static double read_file(const char *path, uint32_t k, const char *what)
{
	double t0 = bench_now_s();
	int fd = open(path, O_RDONLY);
	size_t total = 0;
	bool good = true;

	if (fd < 0) {
		fprintf(stderr, "bench_fs: open %s: %s\n", path, strerror(errno));
		exit(2);
	}
	for (;;) {
		ssize_t n = read(fd, iobuf, CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fprintf(stderr, "bench_fs: read %s: %s\n", path, strerror(errno));
			exit(2);
		}
		if (n == 0)
			break;
		/* reads of a regular file return whole chunks except at the end */
		if (good && (total % 4 || n % 4 ||
			     !chunk_ok((const float *)iobuf, (size_t)n / 4, total / 4, k)))
			good = false;
		total += (size_t)n;
	}
	close(fd);
	t0 = bench_now_s() - t0;
	if (total != O.bytes) {
		fprintf(stderr, "bench_fs: %s: read %zu bytes, want %zu\n", what, total, O.bytes);
		exit(2);
	}
	if (!good)
		verify_failed(what, k);
	return t0;
}

/* Write src (O.bytes) to path with O_TRUNC in CHUNK writes; seconds from open
 * to the end of close (where dg mount commits). */
static double write_file(const char *path, const char *src, int extra_flags)
{
	double t0 = bench_now_s();
	int fd = open(path, O_WRONLY | O_TRUNC | extra_flags, 0644);

	if (fd < 0) {
		fprintf(stderr, "bench_fs: open %s for writing: %s\n", path, strerror(errno));
		exit(2);
	}
	for (size_t off = 0; off < O.bytes;) {
		ssize_t n = write(fd, src + off, O.bytes - off < CHUNK ? O.bytes - off : CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "bench_fs: write %s at %zu: %s\n", path, off,
				strerror(errno));
			exit(2);
		}
		off += (size_t)n;
	}
	if (close(fd) != 0) {
		fprintf(stderr, "bench_fs: close %s: %s\n", path, strerror(errno));
		exit(2);
	}
	return bench_now_s() - t0;
}

static void http_put(struct dg_client *c, const struct dg_tensor *t)
{
	struct dg_err err = { 0 };

	if (dg_var_put(c, VAR, t, NULL, NULL, &err) != DG_OK) {
		fprintf(stderr, "bench_fs: PUT %s: %s\n", VAR, err.msg);
		exit(2);
	}
}

static double http_get(struct dg_client *c, uint32_t k)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	double t0 = bench_now_s();
	bool good;

	if (dg_var_get(c, VAR, &t, NULL, &err) != DG_OK) {
		fprintf(stderr, "bench_fs: GET %s: %s\n", VAR, err.msg);
		exit(2);
	}
	t0 = bench_now_s() - t0;
	good = t->nbytes == O.bytes;
	for (size_t off = 0; good && off < O.bytes; off += CHUNK)
		good = chunk_ok((const float *)((const char *)t->data + off), CHUNK / 4, off / 4,
				k);
	if (!good)
		verify_failed("HTTP GET", k);
	dg_tensor_free(t);
	return t0;
}

/* --------------------------------------------------------------- latencies */

enum lat_kind { LAT_STAT, LAT_OPEN_READ, LAT_PREAD };

/* Median seconds of one operation on path: stat(); open + 4 KiB read + close;
 * or a 4 KiB pread at a random 4 KiB-aligned offset of an open file. */
static double latency(enum lat_kind kind, const char *path)
{
	double *v = malloc((size_t)O.lat_n * sizeof *v), m;
	int fd = kind == LAT_PREAD ? open(path, O_RDONLY) : -1;
	struct stat st;
	uint64_t r = 88172645463325252ull;

	if (!v || (kind == LAT_PREAD && fd < 0))
		die("latency setup failed");
	for (int i = 0; i < O.lat_n; i++) {
		double t0 = bench_now_s();
		bool ok = true;

		if (kind == LAT_STAT) {
			ok = stat(path, &st) == 0;
		} else if (kind == LAT_OPEN_READ) {
			int f = open(path, O_RDONLY);

			ok = f >= 0 && read(f, iobuf, 4096) > 0;
			if (f >= 0)
				close(f);
		} else {
			r ^= r << 13, r ^= r >> 7, r ^= r << 17;
			ok = pread(fd, iobuf, 4096, (off_t)(r % (O.bytes / 4096)) * 4096) == 4096;
		}
		v[i] = bench_now_s() - t0;
		if (!ok) {
			fprintf(stderr, "bench_fs: latency case on %s failed: %s\n", path,
				strerror(errno));
			exit(2);
		}
	}
	if (fd >= 0)
		close(fd);
	m = bench_median(v, O.lat_n);
	free(v);
	return m;
}

static double http_latency(struct dg_client *c, bool head)
{
	struct dg_err err = { 0 };
	int n = O.lat_n / 4 > 50 ? O.lat_n / 4 : 50;
	double *v = malloc((size_t)n * sizeof *v), m;

	if (!v)
		die("out of memory");
	for (int i = 0; i < n; i++) {
		struct dg_var_info info;
		struct dg_tensor *t = NULL;
		double t0 = bench_now_s();
		enum dg_status st = head ? dg_var_stat(c, SMALL, &info, &err)
					 : dg_var_get(c, SMALL, &t, NULL, &err);

		v[i] = bench_now_s() - t0;
		dg_tensor_free(t);
		if (st != DG_OK) {
			fprintf(stderr, "bench_fs: %s %s: %s\n", head ? "HEAD" : "GET", SMALL,
				err.msg);
			exit(2);
		}
	}
	m = bench_median(v, n);
	free(v);
	return m;
}

/* Median seconds of open + 4 KiB read + close of a variable the mount has
 * not read before (n 4 KiB variables, put over HTTP and looked up first:
 * only the open itself is timed). */
static double first_open_latency(struct dg_client *c, const struct dg_tensor *small)
{
	int n = O.lat_n / 4 > 50 ? O.lat_n / 4 : 50;
	double *v = malloc((size_t)n * sizeof *v), m;
	struct dg_err err = { 0 };
	char name[64], p[PATH_MAX];
	struct stat st;

	if (!v)
		die("out of memory");
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof name, "bench/first%05d", i);
		if (dg_var_put(c, name, small, NULL, NULL, &err) != DG_OK) {
			fprintf(stderr, "bench_fs: PUT %s: %s\n", name, err.msg);
			exit(2);
		}
	}
	/* the mount lists variables made elsewhere within --attr-timeout */
	for (int i = 0, tries = 0; i < n; i++) {
		snprintf(p, sizeof p, "%s/vars/bench/first%05d", S.mnt[0], i);
		while (stat(p, &st) != 0) {
			if (errno != ENOENT || ++tries > 100)
				die("stat of a new variable through the mount failed");
			usleep(50000);
		}
	}
	for (int i = 0; i < n; i++) {
		snprintf(p, sizeof p, "%s/vars/bench/first%05d", S.mnt[0], i);
		double t0 = bench_now_s();
		int f = open(p, O_RDONLY);
		bool ok = f >= 0 && read(f, iobuf, 4096) == 4096;

		if (f >= 0)
			close(f);
		v[i] = bench_now_s() - t0;
		if (!ok) {
			fprintf(stderr, "bench_fs: first open of %s failed: %s\n", p, strerror(errno));
			exit(2);
		}
	}
	m = bench_median(v, n);
	free(v);
	return m;
}

/* ---------------------------------------------------------------- main */

enum { C_GET, C_PUT, C_COLD, C_WARM, C_WRITE, C_TMPFS_R, C_TMPFS_W, C_MIN_R, C_MIN_W,
       C_DIO_R, C_DIO_W, N_CASES };
static const char *const case_names[N_CASES] = {
	"HTTP GET (dg_var_get)", "HTTP PUT (dg_var_put)", "mount read, cold (new version)",
	"mount read, repeated (unchanged)", "mount write (O_TRUNC, commit at close)",
	"tmpfs read (/dev/shm)", "tmpfs write", "FUSE minimal read (default)",
	"FUSE minimal write (default)", "FUSE minimal read (direct_io, max_read=1M)",
	"FUSE minimal write (direct_io)",
};

static void usage(void)
{
	printf("usage: bench_fs [--dg PATH] [--minimal PATH] [--size MIB] [--runs N]\n"
	       "                [--lat-n N] [--quick] [--no-minimal] [--strict]\n"
	       "Reads and writes a SIZE MiB (default 256) float32 variable through `dg mount`\n"
	       "and, in the same run, through HTTP, tmpfs and bench_fs_minimal; prints the\n"
	       "median of N runs (default 5) and the ratios of the filesystem targets.\n"
	       "--dg: the dg binary (default: BUILD/cli/dg next to this bench);\n"
	       "--minimal: bench_fs_minimal (default: next to this bench).\n"
	       "--quick: 64 MiB, 3 runs, 200 latency samples. Needs /dev/fuse and fusermount3.\n"
	       "Exit: 0, 2 setup failed, 3 data read back was wrong, 4 --strict and a target\n"
	       "missed.\n");
}

static void parse_args(int argc, char **argv)
{
	static char exe[PATH_MAX], dg[PATH_MAX + 16], mini[PATH_MAX + 32];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	char *slash;

	if (n > 0) {
		exe[n] = 0;
		if ((slash = strrchr(exe, '/')))
			*slash = 0;             /* BUILD/bench */
		snprintf(dg, sizeof dg, "%s/../cli/dg", exe);
		snprintf(mini, sizeof mini, "%s/bench_fs_minimal", exe);
		O.dg_path = dg;
		O.minimal_path = mini;
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_val = i + 1 < argc;

		if (!strcmp(a, "--dg") && has_val) {
			O.dg_path = argv[++i];
		} else if (!strcmp(a, "--minimal") && has_val) {
			O.minimal_path = argv[++i];
		} else if (!strcmp(a, "--size") && has_val) {
			long v = atol(argv[++i]);

			if (v < 4 || v > 4096)
				die("--size: MiB in 4..4096");
			O.bytes = (size_t)v << 20;
		} else if (!strcmp(a, "--runs") && has_val) {
			O.runs = atoi(argv[++i]);
			if (O.runs < 1 || O.runs > MAX_RUNS)
				die("--runs: 1..64");
		} else if (!strcmp(a, "--lat-n") && has_val) {
			O.lat_n = atoi(argv[++i]);
			if (O.lat_n < 10 || O.lat_n > 1000000)
				die("--lat-n: 10..1000000");
		} else if (!strcmp(a, "--quick")) {
			O.bytes = (size_t)64 << 20;
			O.runs = 3;
			O.lat_n = 200;
		} else if (!strcmp(a, "--no-minimal")) {
			O.no_minimal = true;
		} else if (!strcmp(a, "--strict")) {
			O.strict = true;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			exit(0);
		} else {
			fprintf(stderr, "bench_fs: unknown or incomplete option '%s'\n", a);
			usage();
			exit(1);
		}
	}
	if (!O.dg_path || access(O.dg_path, X_OK) != 0) {
		fprintf(stderr, "bench_fs: no dg binary at '%s'; give --dg PATH\n",
			O.dg_path ? O.dg_path : "");
		exit(2);
	}
	if (!O.no_minimal && (!O.minimal_path || access(O.minimal_path, X_OK) != 0)) {
		fprintf(stderr, "bench_fs: no bench_fs_minimal at '%s'; give --minimal PATH or "
			"--no-minimal\n", O.minimal_path ? O.minimal_path : "");
		exit(2);
	}
}

static double mbps(double s)
{
	return s > 0 ? (double)O.bytes / s / 1e6 : 0;
}

/* One ratio line against its target; returns true when the target is met. */
static bool ratio_line(const char *what, double dg_s, double base_s, double target)
{
	double r = dg_s > 0 ? base_s / dg_s : 0;

	printf("%-44s %6.3f  (target >= %.1f: %s)\n", what, r, target,
	       r >= target ? "met" : "MISSED");
	return r >= target;
}

int main(int argc, char **argv)
{
	static double t[N_CASES][MAX_RUNS];
	double med[N_CASES] = { 0 };
	char addr[32], path[160], min_path[2][160], small_path[160];
	struct dg_err err = { 0 };
	struct dg_client *c;
	struct dg_tensor *w, *small;
	int64_t numel;
	struct dg_shape shape;
	uint32_t k = 1;
	bool met = true;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse_args(argc, argv);
	if (access("/dev/fuse", R_OK | W_OK) != 0)
		die("/dev/fuse is not usable here");
	snprintf(S.dir, sizeof S.dir, "/tmp/dg-bench-fs.XXXXXX");
	if (!mkdtemp(S.dir))
		die("mkdtemp failed");
	for (int i = 0; i < N_MOUNTS; i++)
		snprintf(S.mnt[i], sizeof S.mnt[i], "%s/mnt%d", S.dir, i);
	snprintf(S.shm, sizeof S.shm, "/dev/shm/dg-bench-fs.%d", (int)getpid());
	atexit(cleanup);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	if (posix_memalign((void **)&iobuf, 4096, CHUNK) != 0)
		die("out of memory");

	start_dg(addr, sizeof addr);
	if (!O.no_minimal) {
		start_minimal(1, false);
		start_minimal(2, true);
	}
	c = dg_client_new(addr, NULL, &err);
	numel = (int64_t)(O.bytes / 4);
	shape = dg_shape_make(1, &numel);
	w = c ? dg_tensor_new_uninit(DG_F32, &shape, &err) : NULL;
	numel = SMALL_BYTES / 4;
	shape = dg_shape_make(1, &numel);
	small = w ? dg_tensor_new(DG_F32, &shape, &err) : NULL;
	if (!small || dg_var_put(c, SMALL, small, NULL, NULL, &err) != DG_OK) {
		fprintf(stderr, "bench_fs: setup: %s\n", err.msg);
		exit(2);
	}
	snprintf(path, sizeof path, "%s/vars/%s", S.mnt[0], VAR);
	snprintf(small_path, sizeof small_path, "%s/vars/%s", S.mnt[0], SMALL);
	for (int i = 0; i < 2; i++)
		snprintf(min_path[i], sizeof min_path[i], "%s/data", S.mnt[i + 1]);

	printf("bench_fs: %zu MiB float32 variable, %u KiB read()/write() calls, median of %d "
	       "runs (after one warm-up run)\n", O.bytes >> 20, CHUNK >> 10, O.runs);
	printf("dg: %s (ps in memory on %s; dg mount -f)\n", O.dg_path, addr);

	/* Run -1 warms every path up (allocator caches, first page faults) untimed.
	 * The cases alternate inside each run so drift hits them alike. */
	for (int r = -1; r < O.runs; r++) {
		int j = r < 0 ? 0 : r;
		double *row[N_CASES];

		for (int cs = 0; cs < N_CASES; cs++)
			row[cs] = &t[cs][j];
		fill(w->data, O.bytes / 4, ++k);
		*row[C_PUT] = bench_now_s();
		http_put(c, w);
		*row[C_PUT] = bench_now_s() - *row[C_PUT];
		*row[C_GET] = http_get(c, k);

		fill(w->data, O.bytes / 4, ++k);
		http_put(c, w);                 /* a new version: the mount's next read is cold */
		*row[C_COLD] = read_file(path, k, "mount read, cold");
		*row[C_WARM] = read_file(path, k, "mount read, repeated");

		fill(w->data, O.bytes / 4, ++k);
		*row[C_WRITE] = write_file(path, w->data, 0);
		http_get(c, k);                 /* untimed: the mount committed version k */

		fill(w->data, O.bytes / 4, ++k);
		*row[C_TMPFS_W] = write_file(S.shm, w->data, O_CREAT);
		*row[C_TMPFS_R] = read_file(S.shm, k, "tmpfs read");

		if (!O.no_minimal) {
			*row[C_MIN_W] = write_file(min_path[0], w->data, 0);
			*row[C_MIN_R] = read_file(min_path[0], k, "FUSE minimal read");
			*row[C_DIO_W] = write_file(min_path[1], w->data, 0);
			*row[C_DIO_R] = read_file(min_path[1], k, "FUSE minimal direct_io read");
		}
	}
	for (int cs = 0; cs < N_CASES; cs++)
		med[cs] = bench_median(t[cs], O.runs);

	printf("\n%-44s %9s %9s\n", "case", "MB/s", "ms");
	for (int cs = 0; cs < N_CASES; cs++) {
		if (O.no_minimal && cs >= C_MIN_R)
			continue;
		printf("%-44s %9.0f %9.1f\n", case_names[cs], mbps(med[cs]), med[cs] * 1e3);
	}

	printf("\nlatency, median of %d (us)       dg mount    tmpfs  minimal  HTTP\n", O.lat_n);
	{
		double m_stat = latency(LAT_STAT, path), s_stat = latency(LAT_STAT, S.shm);
		double m_or = latency(LAT_OPEN_READ, small_path);
		double s_or = latency(LAT_OPEN_READ, S.shm);
		double m_pr = latency(LAT_PREAD, path), s_pr = latency(LAT_PREAD, S.shm);
		double n_stat = 0, n_or = 0, n_pr = 0;
		double h_head = http_latency(c, true), h_get = http_latency(c, false);

		if (!O.no_minimal) {
			n_stat = latency(LAT_STAT, min_path[0]);
			n_or = latency(LAT_OPEN_READ, min_path[0]);
			n_pr = latency(LAT_PREAD, min_path[0]);
		}
		printf("%-34s %8.1f %8.1f %8.1f %8.1f (HEAD)\n", "stat", m_stat * 1e6, s_stat * 1e6,
		       n_stat * 1e6, h_head * 1e6);
		printf("%-34s %8.1f %8.1f %8.1f %8.1f (GET 4 KiB)\n", "open + 4 KiB read + close",
		       m_or * 1e6, s_or * 1e6, n_or * 1e6, h_get * 1e6);
		printf("%-34s %8.1f %8s %8s %8.1f (GET 4 KiB)\n", "  ... first open of the variable",
		       first_open_latency(c, small) * 1e6, "-", "-", h_get * 1e6);
		printf("%-34s %8.1f %8.1f %8.1f %8s\n", "4 KiB pread, open file, random",
		       m_pr * 1e6, s_pr * 1e6, n_pr * 1e6, "-");
	}

	printf("\nratios (throughput dg / baseline)\n");
	met &= ratio_line("cold read / HTTP GET", med[C_COLD], med[C_GET], 0.7);
	met &= ratio_line("repeated read / tmpfs read", med[C_WARM], med[C_TMPFS_R], 0.5);
	met &= ratio_line("write / HTTP PUT", med[C_WRITE], med[C_PUT], 0.6);
	if (!O.no_minimal) {
		printf("%-44s %6.3f  (FUSE's own cost, default options)\n",
		       "cold read / FUSE minimal read", med[C_MIN_R] / med[C_COLD]);
		printf("%-44s %6.3f\n", "cold read / FUSE minimal direct_io read",
		       med[C_DIO_R] / med[C_COLD]);
		printf("%-44s %6.3f\n", "write / FUSE minimal write", med[C_MIN_W] / med[C_WRITE]);
	}

	dg_tensor_free(w);
	dg_tensor_free(small);
	dg_client_free(c);
	free(iobuf);
	if (failures) {
		fprintf(stderr, "bench_fs: %d verification failure(s)\n", failures);
		return 3;
	}
	return O.strict && !met ? 4 : 0;
}
