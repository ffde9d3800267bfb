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
 * touched. This runs once, before other threads start (dg_blas_init). */
#include "blas.h"

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
static char line[320];          /* dg_blas_describe's text */
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
#else
static const char *pick_coretype(const char **why, int *level)
{
	(void)why;
	(void)level;
	return NULL;
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
	else if (chosen)
		snprintf(line, sizeof line, "%s core %s (OpenBLAS detected %.40s; "
			 "OPENBLAS_CORETYPE=%s chosen by dg: %s)", ver, core, detected, chosen, why);
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

static void load(void)
{
	const char *lib, *chosen = NULL, *why = "";
	char detected[48] = "";
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
	if (!preloaded && !user_set && pick_coretype(&why, &cpu_level)) {
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
