/* Loads OpenBLAS at run time and makes sure it runs the kernels this CPU can
 * (dg_blas_get for matmul.c and bench/, dg_blas_init/describe/set_threads for
 * the rest of dg). Why dg does not simply link -lopenblas: Debian 12's OpenBLAS
 * 0.3.21 is built with DYNAMIC_ARCH and picks its kernels from CPUID in a
 * library constructor. On CPUs it does not know it falls back to old SSE3
 * kernels, ~5x slower than the AVX-512 ones. Only OPENBLAS_CORETYPE overrides
 * that, and it is read by the constructor, which for a linked library runs
 * before main(). So dg dlopen()s the library itself: first as OpenBLAS would
 * load anyway; if the core it picked is weaker than what CPUID (and the OS's
 * XCR0) allow, dg unloads it, sets OPENBLAS_CORETYPE (SkylakeX for AVX-512,
 * Haswell for AVX2+FMA) and loads it again. A value the user set is never
 * touched. This runs once, before other threads start (dg_blas_init).
 *
 * CPUID does not always tell the fastest core: on AMD CPUs with AVX2 OpenBLAS
 * picks its ZEN kernels, and Haswell's ran sgemm 1024 at 83.5 GFLOP/s against
 * 70.0 on one thread (an EPYC guest). So on CPUs that are not Intel's (or with
 * DG_BLAS_PROBE=1) dg times a 512^3 sgemm on one thread under each core the CPU
 * can run, loading the library once per core, keeps the fastest (OpenBLAS's own
 * pick unless another is 5% faster), and writes the answer to a cache file of
 * the user's, so the probe (~0.1 s) runs once per machine and every process
 * then uses the same core (the same kernels give the same bits). */
#include "blas.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dg/kernels.h"
#include "dg/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#define LIB_NAME "libopenblas.so.0"
#define LIB_FALLBACK "libopenblas.so"
#define INSTALL_HINT "install libopenblas0 (apt-get install libopenblas0-pthread)"

/* Everything below is written once, inside pthread_once, and read-only after. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct dg_blas blas;
static bool loaded;             /* blas is complete and usable */
static struct dg_err load_err;  /* why not, when !loaded */
static char line[640];          /* dg_blas_describe's text */
static char probe_note[320];    /* what timing the cores found, for the line */
static int default_threads;     /* OpenBLAS's thread count before anyone changed it */

#if defined(__x86_64__) || defined(__i386__)
/* XCR0: which register state the OS saves on context switch. Only meaningful
 * when CPUID.1:ECX.OSXSAVE is set (otherwise xgetbv faults). */
static uint64_t read_xcr0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((uint64_t)hi << 32) | lo;
}

/* The OPENBLAS_CORETYPE value this CPU should use, or NULL to let OpenBLAS
 * decide. *why gets a short reason for the log line. A CPU flag alone is not
 * enough: the OS must also save the wider registers (XCR0), or the kernels
 * would fault (or be silently corrupted) on a context switch. */
static const char *pick_coretype(const char **why, int *level)
{
	unsigned a, b, c, d;
	uint64_t xcr0;
	bool fma, avx, ymm_os, zmm_os, avx2, avx512;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return NULL;
	fma = c & bit_FMA;
	avx = c & bit_AVX;
	if (!(c & bit_OSXSAVE) || !avx)
		return NULL;
	xcr0 = read_xcr0();
	ymm_os = (xcr0 & 0x6) == 0x6;                   /* bits 1,2: SSE + AVX state */
	zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0;       /* bits 5,6,7: opmask, ZMM hi */
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return NULL;                            /* leaf 7 absent: pre-Haswell */
	avx2 = b & bit_AVX2;
	avx512 = (b & bit_AVX512F) && (b & bit_AVX512DQ) && (b & bit_AVX512CD) &&
		 (b & bit_AVX512BW) && (b & bit_AVX512VL);
	if (avx512 && zmm_os) {
		*why = "CPU has AVX-512";
		*level = 3;
		return "SkylakeX";
	}
	if (avx2 && fma && ymm_os) {
		*why = "CPU has AVX2 and FMA";
		*level = 2;
		return "Haswell";
	}
	return NULL;
}

int dg_blas_core_candidates(const char **out, int max, bool *measure)
{
	unsigned a, b, c, d, vendor[3] = { 0, 0, 0 };
	int n = 0, level = 1;
	const char *why;
	bool bf16 = false, intel;

	pick_coretype(&why, &level);
	__get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]);   /* "Genu" "ineI" "ntel" */
	intel = memcmp(vendor, "GenuineIntel", 12) == 0;
	if (level == 3 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
		bf16 = a & bit_AVX512BF16;
	if (level == 3 && n < max)
		out[n++] = "SkylakeX";
	if (bf16 && n < max)
		out[n++] = "Cooperlake";
	if (level >= 2 && n < max)
		out[n++] = "Haswell";
	if (level >= 2 && memcmp(vendor, "AuthenticAMD", 12) == 0 && n < max)
		out[n++] = "Zen";
	/* OpenBLAS knows Intel's cores (and dg's upgrade rule covers the new
	 * ones): CPUID is conclusive there. Elsewhere the candidates are timed. */
	*measure = n >= 1 && !intel;
	return n;
}
#else
static const char *pick_coretype(const char **why, int *level)
{
	(void)why;
	(void)level;
	return NULL;
}

int dg_blas_core_candidates(const char **out, int max, bool *measure)
{
	(void)out;
	(void)max;
	*measure = false;
	return 0;
}
#endif

int dg_blas_core_level(const char *core)
{
	static const char *const avx512[] = { "skylakex", "cooperlake", "sapphirerapids" };
	static const char *const avx2[] = { "haswell", "zen", "skylake" };

	for (size_t i = 0; core && i < sizeof avx512 / sizeof avx512[0]; i++)
		if (strcasecmp(core, avx512[i]) == 0)
			return 3;
	for (size_t i = 0; core && i < sizeof avx2 / sizeof avx2[0]; i++)
		if (strcasecmp(core, avx2[i]) == 0)
			return 2;
	return 1;
}

/* Resolve one symbol into *slot (a function pointer stored through void *: the
 * POSIX dlsym idiom). */
static bool resolve(void *h, const char *lib, const char *sym, void *slot)
{
	void *p = dlsym(h, sym);

	if (!p) {
		dg_err_set(&load_err, DG_EDEVICE, "%s lacks the symbol %s", lib, sym);
		dg_err_hint(&load_err, INSTALL_HINT);
		return false;
	}
	memcpy(slot, &p, sizeof p);
	return true;
}

/* "OpenBLAS 0.3.21" from openblas_get_config() ("OpenBLAS 0.3.21 NO_LAPACKE
 * DYNAMIC_ARCH ..."): the first two words. */
static void version_of(const char *config, char *out, size_t n)
{
	const char *p = config ? config : "OpenBLAS";
	const char *sp = strchr(p, ' ');

	if (sp)
		sp = strchr(sp + 1, ' ');
	snprintf(out, n, "%.*s", sp ? (int)(sp - p) : (int)strlen(p), p);
}

/* Compose the describe line: version, the core OpenBLAS runs, and who chose it. */
static void describe_loaded(const char *chosen, const char *why, const char *detected,
			    bool user_set, bool preloaded)
{
	char ver[64], core[48];
	const char *cn = blas.get_corename();
	const char *env = getenv("OPENBLAS_CORETYPE");
	size_t i;

	version_of(blas.get_config(), ver, sizeof ver);
	for (i = 0; cn && cn[i] && i + 1 < sizeof core; i++)
		core[i] = (char)toupper((unsigned char)cn[i]);
	core[i] = '\0';
	if (preloaded)
		snprintf(line, sizeof line, "%s core %s (already loaded before dg could choose "
			 "a core; OPENBLAS_CORETYPE=%s)", ver, core, env ? env : "unset");
	else if (user_set)
		snprintf(line, sizeof line, "%s core %s (OPENBLAS_CORETYPE=%s set by user)", ver,
			 core, env);
	else if (chosen && probe_note[0])
		snprintf(line, sizeof line, "%s core %s (OpenBLAS detected %.40s; "
			 "OPENBLAS_CORETYPE=%s chosen by dg: %s, %s)", ver, core, detected, chosen,
			 why, probe_note);
	else if (chosen)
		snprintf(line, sizeof line, "%s core %s (OpenBLAS detected %.40s; "
			 "OPENBLAS_CORETYPE=%s chosen by dg: %s)", ver, core, detected, chosen, why);
	else if (probe_note[0])
		snprintf(line, sizeof line, "%s core %s (detected by OpenBLAS; kept by dg as the "
			 "fastest, %s)", ver, core, probe_note);
	else
		snprintf(line, sizeof line, "%s core %s (detected by OpenBLAS)", ver, core);
}

/* dlopen OpenBLAS under either name; NULL with load_err set when neither loads. */
static void *open_lib(const char **lib)
{
	void *h;

	*lib = LIB_NAME;
	h = dlopen(LIB_NAME, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		*lib = LIB_FALLBACK;
		h = dlopen(LIB_FALLBACK, RTLD_NOW | RTLD_LOCAL);
	}
	if (!h) {
		dg_err_set(&load_err, DG_EDEVICE, "cannot load OpenBLAS (%s or %s): %s", LIB_NAME,
			   LIB_FALLBACK, dlerror());
		dg_err_hint(&load_err, INSTALL_HINT);
	}
	return h;
}

/* --- choosing the core by measurement ------------------------------------- */

#define PROBE_N 512             /* sgemm side: 1.4-3 ms a product on one thread */
#define PROBE_REPS 7            /* the best of these counts */
#define PROBE_MARGIN 1.05       /* another core must beat OpenBLAS's own pick by 5% */
#define MAX_CANDIDATES 4


static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GFLOP/s of a PROBE_N^3 sgemm on one thread with OpenBLAS loaded under core
 * (NULL: OpenBLAS's own pick), the best of PROBE_REPS, and the core's name as
 * OpenBLAS reports it; 0 when it cannot be loaded. Loads and unloads the
 * library, so only while nothing else holds it. */
static double probe(const char *core, char *name, size_t n)
{
	const size_t m = (size_t)PROBE_N * PROBE_N;
	struct dg_blas p = { 0 };
	double best = INFINITY;
	const char *lib;
	float *x;
	void *h;

	name[0] = '\0';
	if (core)
		setenv("OPENBLAS_CORETYPE", core, 1);
	else
		unsetenv("OPENBLAS_CORETYPE");
	h = open_lib(&lib);
	if (!h)
		return 0;
	x = malloc(3 * m * sizeof *x);
	if (!x || !resolve(h, lib, "cblas_sgemm", &p.sgemm) ||
	    !resolve(h, lib, "openblas_set_num_threads", &p.set_num_threads) ||
	    !resolve(h, lib, "openblas_get_corename", &p.get_corename)) {
		free(x);
		dlclose(h);
		return 0;
	}
	snprintf(name, n, "%s", p.get_corename());
	p.set_num_threads(1);
	for (size_t i = 0; i < 2 * m; i++)
		x[i] = (float)(i % 17) * 0.0625f - 0.5f;
	for (int r = -1; r < PROBE_REPS; r++) {   /* r = -1: warm-up */
		double t0 = now_s();
		p.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, PROBE_N, PROBE_N, PROBE_N, 1.0f,
			x, PROBE_N, x + m, PROBE_N, 0.0f, x + 2 * m, PROBE_N);
		double t = now_s() - t0;
		if (r >= 0 && t < best)
			best = t;
	}
	free(x);
	dlclose(h);
	return 2.0 * PROBE_N * PROBE_N * PROBE_N / best * 1e-9;
}

/* The cache of the probe's answer: $DG_BLAS_CACHE, else /var/tmp/dg-blas-core-UID
 * (one per user and machine whatever HOME is, so every process of a local
 * cluster runs the same core); "" turns it off. Opened (created 0600) only if
 * it is the user's own regular file that nobody else can write; -1 otherwise. */
static int cache_open(char *path, size_t n)
{
	const char *e = getenv("DG_BLAS_CACHE");
	struct stat st;
	int fd;

	if (e)
		snprintf(path, n, "%s", e);
	else
		snprintf(path, n, "/var/tmp/dg-blas-core-%u", (unsigned)getuid());
	if (!path[0])
		return -1;
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	/* one link only: not another of the user's files hard-linked here */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
	    (st.st_mode & 022) || st.st_nlink != 1) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The CPU's brand string (CPUID 0x80000002-4), for the cache's key. */
static void cpu_brand(char *out, size_t n)
{
	unsigned r[12] = { 0 };

	snprintf(out, n, "unknown CPU");
#if defined(__x86_64__) || defined(__i386__)
	for (unsigned i = 0; i < 3; i++)
		if (!__get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2],
				 &r[4 * i + 3]))
			return;
	snprintf(out, n, "%.48s", (const char *)r);
#endif
}

/* Decides the core by measurement (or from the cache) with the library h
 * loaded under OpenBLAS's own pick; returns the handle to keep (h, or the
 * library reloaded under the chosen core) and sets *chosen (NULL: OpenBLAS's
 * pick). NULL when the library cannot be loaded again. */
static void *measured(void *h, const char **lib, const char *const *cand, int n_cand,
		      const char **chosen)
{
	char *(*corename)(void) = NULL, *(*config)(void) = NULL;
	char key[400], path[256], brand[64], line_in[600], own[48] = "", nm[48];
	char figs[160] = "", *end, *tab;
	double g0, best_g = 0;
	int fd, best = -1, k;
	ssize_t got;

	*chosen = NULL;
	if (!resolve(h, *lib, "openblas_get_corename", &corename) ||
	    !resolve(h, *lib, "openblas_get_config", &config))
		return h;
	snprintf(own, sizeof own, "%s", corename());
	cpu_brand(brand, sizeof brand);
	k = snprintf(key, sizeof key, "%s|%s|%s", brand, config(), own);
	for (int i = 0; i < n_cand && k > 0 && (size_t)k < sizeof key; i++)
		k += snprintf(key + k, sizeof key - (size_t)k, ",%s", cand[i]);
	fd = cache_open(path, sizeof path);
	if (fd >= 0 && flock(fd, LOCK_EX) == 0 &&
	    (got = pread(fd, line_in, sizeof line_in - 1, 0)) > 0) {
		/* "dg-blas-core 1\tKEY\tCORE\tFIGURES\n"; CORE "-" = OpenBLAS's own */
		line_in[got] = '\0';
		size_t kl = strlen(key);
		if (strncmp(line_in, "dg-blas-core 1\t", 15) == 0 &&
		    strncmp(line_in + 15, key, kl) == 0 && line_in[15 + kl] == '\t') {
			char *core = line_in + 16 + kl;
			if ((tab = strchr(core, '\t')) && (end = strchr(tab, '\n'))) {
				*tab = *end = '\0';
				for (int i = 0; i < n_cand; i++)
					if (strcmp(core, cand[i]) == 0)
						*chosen = cand[i];
				if (*chosen || strcmp(core, "-") == 0) {
					snprintf(probe_note, sizeof probe_note,
						 "measured %.100s, cached in %.80s", tab + 1, path);
					close(fd);   /* drops the lock */
					goto load;
				}
			}
		}
	}
	/* Nothing cached for this CPU and library: time each core, OpenBLAS's own
	 * first. Other processes that start now wait on the lock and read it. */
	dlclose(h);
	h = NULL;
	g0 = probe(NULL, nm, sizeof nm);
	k = snprintf(figs, sizeof figs, "%s %.1f", nm, g0);
	for (int i = 0; i < n_cand; i++) {
		if (strcasecmp(cand[i], own) == 0)
			continue;   /* timed above as OpenBLAS's own */
		double g = probe(cand[i], nm, sizeof nm);
		/* An OpenBLAS without that core runs another: not a candidate. */
		if (strcasecmp(nm, cand[i]) != 0)
			g = 0;
		if (k > 0 && (size_t)k < sizeof figs)
			k += snprintf(figs + k, sizeof figs - (size_t)k, ", %s %.1f", cand[i], g);
		if (g > best_g) {
			best_g = g;
			best = i;
		}
	}
	if (best >= 0 && best_g > g0 * PROBE_MARGIN)
		*chosen = cand[best];
	if (g0 <= 0) {
		/* A failed timing is not an answer to keep: OpenBLAS's pick stays. */
		*chosen = NULL;
		snprintf(probe_note, sizeof probe_note, "timing failed, not cached");
		if (fd >= 0)
			close(fd);
	} else if (fd >= 0) {
		char out[600];
		int len = snprintf(out, sizeof out, "dg-blas-core 1\t%s\t%s\t%s GFLOP/s\n", key,
				   *chosen ? *chosen : "-", figs);
		if (len > 0 && (size_t)len < sizeof out && ftruncate(fd, 0) == 0 &&
		    pwrite(fd, out, (size_t)len, 0) == len)
			snprintf(probe_note, sizeof probe_note, "measured %.100s GFLOP/s, "
				 "cached in %.80s", figs, path);
		else
			snprintf(probe_note, sizeof probe_note, "measured %.100s GFLOP/s, "
				 "not cached (%.40s)", figs, strerror(errno));
		close(fd);
	} else {
		snprintf(probe_note, sizeof probe_note, "measured %.100s GFLOP/s, not cached",
			 figs);
	}
load:
	if (h && !*chosen)
		return h;   /* a cache hit for OpenBLAS's own pick: keep it loaded */
	if (h)
		dlclose(h);
	if (*chosen) {
		setenv("OPENBLAS_CORETYPE", *chosen, 1);
		/* Children (dg up's tasks) inherit it: mark it as dg's, not the user's. */
		setenv("DG_BLAS_CORE_BY_DG", *chosen, 1);
	} else
		unsetenv("OPENBLAS_CORETYPE");
	return open_lib(lib);
}

static void load(void)
{
	const char *lib, *chosen = NULL, *why = "";
	char detected[48] = "";
	const char *by_dg = getenv("DG_BLAS_CORE_BY_DG"), *env = getenv("OPENBLAS_CORETYPE");
	if (by_dg && env && strcmp(by_dg, env) == 0)
		unsetenv("OPENBLAS_CORETYPE");   /* inherited from a dg that chose it: choose again */
	bool user_set = getenv("OPENBLAS_CORETYPE") != NULL;
	bool preloaded;
	int cpu_level = 1;
	void *h;

	/* Already in the process (linked by someone else): its constructor has run and
	 * the core is fixed; say so rather than claim a choice that had no effect. */
	h = dlopen(LIB_NAME, RTLD_NOW | RTLD_NOLOAD);
	preloaded = h != NULL;
	if (!h)
		h = open_lib(&lib);
	else
		lib = LIB_NAME;
	if (!h)
		goto fail;
	const char *cand[MAX_CANDIDATES];
	bool measure = false;
	int n_cand = preloaded || user_set ? 0 :
		     dg_blas_core_candidates(cand, MAX_CANDIDATES, &measure);
	const char *force = getenv("DG_BLAS_PROBE");
	if (force && n_cand > 0)
		measure = strcmp(force, "0") != 0;
	if (measure) {
		char *(*corename)(void) = NULL;
		if (resolve(h, lib, "openblas_get_corename", &corename))
			snprintf(detected, sizeof detected, "%s", corename());
		h = measured(h, &lib, cand, n_cand, &chosen);
		why = "fastest";
		if (!h)
			goto fail;
	} else if (!preloaded && !user_set && pick_coretype(&why, &cpu_level)) {
		/* OpenBLAS chose in its constructor; keep its choice unless it is weaker
		 * than the CPU allows, then reload with the core named. Nothing else
		 * holds the library yet, so dlclose really unloads it (its destructor
		 * stops its thread pool) and the second dlopen runs the constructor again. */
		char *(*corename)(void) = NULL;
		if (resolve(h, lib, "openblas_get_corename", &corename))
			snprintf(detected, sizeof detected, "%s", corename());
		if (corename && dg_blas_core_level(detected) < cpu_level) {
			chosen = pick_coretype(&why, &cpu_level);
			dlclose(h);
			setenv("OPENBLAS_CORETYPE", chosen, 0);
			setenv("DG_BLAS_CORE_BY_DG", chosen, 1);
			h = open_lib(&lib);
			if (!h)
				goto fail;
		}
	}
	/* The handle stays open for the life of the process: kernels keep pointers. */
	if (!resolve(h, lib, "cblas_sgemm", &blas.sgemm) ||
	    !resolve(h, lib, "cblas_dgemm", &blas.dgemm) ||
	    !resolve(h, lib, "openblas_set_num_threads", &blas.set_num_threads) ||
	    !resolve(h, lib, "openblas_get_num_threads", &blas.get_num_threads) ||
	    !resolve(h, lib, "openblas_get_corename", &blas.get_corename) ||
	    !resolve(h, lib, "openblas_get_config", &blas.get_config))
		goto fail;
	default_threads = blas.get_num_threads();
	describe_loaded(chosen, why, detected, user_set, preloaded);
	loaded = true;
	dg_log(chosen ? DG_LOG_INFO : DG_LOG_DEBUG, "blas", "%s", line);
	return;
fail:
	/* Keep the library mapped even when a symbol is missing: unloading a library
	 * whose constructor started threads is not safe. */
	snprintf(line, sizeof line, "OpenBLAS not available: %s", load_err.msg);
	dg_log(DG_LOG_WARN, "blas", "%s", line);
}

const struct dg_blas *dg_blas_get(struct dg_err *err)
{
	pthread_once(&once, load);
	if (loaded)
		return &blas;
	if (err)
		*err = load_err;
	return NULL;
}

enum dg_status dg_blas_init(struct dg_err *err)
{
	return dg_blas_get(err) ? DG_OK : load_err.code;
}

const char *dg_blas_describe(void)
{
	pthread_once(&once, load);
	return line;
}

void dg_blas_set_threads(int n)
{
	const struct dg_blas *b = dg_blas_get(NULL);

	/* openblas_set_num_threads(0) keeps the current count, so "default" restores
	 * the count OpenBLAS started with (OPENBLAS_NUM_THREADS or the CPU count). */
	if (b)
		b->set_num_threads(n > 0 ? n : default_threads);
}
