/* `dg var ls|get|put|create|rm|watch` (watch: var_watch.c): the cluster's
 * variables from the shell, on top of the typed client (core/src/client.c).
 * Variables live on the tasks of job "ps" (every task when there is no such
 * job); a name is looked up on each of them, and a new variable goes to the task holding the fewest bytes (the
 * placement rule of DESIGN.md). --server HOST:PORT talks to one server. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "dg/client.h"
#include "dg/cluster.h"
#include "dg/codec.h"
#include "dg/kernels.h"

#define FILE_LIMIT ((size_t)1 << 34)    /* bytes of an input file: the server refuses less */

/* --- options ------------------------------------------------------------------ */

enum {
	OPT_CLUSTER = 1 << 0, OPT_SERVER = 1 << 1, OPT_TOKEN = 1 << 2, OPT_LONG = 1 << 3,
	OPT_FORMAT = 1 << 4, OPT_OUT = 1 << 5, OPT_DTYPE = 1 << 6, OPT_SHAPE = 1 << 7,
	OPT_VALUE = 1 << 8, OPT_REPLACE = 1 << 9, OPT_IF_VERSION = 1 << 10, OPT_INIT = 1 << 11,
	OPT_SEED = 1 << 12, OPT_SCALE = 1 << 13, OPT_PREFIX = 1 << 14, OPT_COUNT = 1 << 15,
	OPT_TIMEOUT = 1 << 16,
};
#define OPT_CONN (OPT_CLUSTER | OPT_SERVER | OPT_TOKEN)

enum init_kind { INIT_ZEROS, INIT_ONES, INIT_UNIFORM, INIT_NORMAL, INIT_GLOROT };

struct var_args {
	const char *sub;                /* "ls", "get", ... */
	unsigned given;                 /* OPT_* seen */
	const char *cluster, *server, *token_file, *out, *value;
	enum dg_encoding format;
	bool long_list, replace;
	bool has_dtype, has_shape;
	enum dg_dtype dtype;
	struct dg_shape shape;
	uint64_t if_version;
	enum init_kind init;
	int64_t seed;
	double scale;
	const char *prefix;             /* watch --prefix */
	int64_t count, timeout_ms;      /* watch --count, --timeout */
	char **pos;                     /* positional arguments, borrowed from argv */
	int n_pos;
};

static const struct option long_opts[] = {
	{ "cluster", required_argument, NULL, 'C' },
	{ "server", required_argument, NULL, 'S' },
	{ "token-file", required_argument, NULL, 'T' },
	{ "long", no_argument, NULL, 'l' },
	{ "format", required_argument, NULL, 'f' },
	{ "out", required_argument, NULL, 'o' },
	{ "dtype", required_argument, NULL, 'd' },
	{ "shape", required_argument, NULL, 's' },
	{ "value", required_argument, NULL, 'v' },
	{ "replace", no_argument, NULL, 'r' },
	{ "if-version", required_argument, NULL, 'V' },
	{ "init", required_argument, NULL, 'i' },
	{ "seed", required_argument, NULL, 'e' },
	{ "scale", required_argument, NULL, 'x' },
	{ "prefix", required_argument, NULL, 'p' },
	{ "count", required_argument, NULL, 'n' },
	{ "timeout", required_argument, NULL, 't' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static const char conn_help[] =
	"  --cluster FILE     the cluster spec (default: $DG_CLUSTER, then the last\n"
	"                     'dg up'); variables live on the tasks of job \"ps\"\n"
	"  --server HOST:PORT talk to this one server instead of a cluster\n"
	"  --token-file F     send the bearer token in F (first line)\n"
	"  -h, --help         show this help\n";

static const char var_help[] =
	"usage: dg var ls|get|put|create|rm|watch ... [--cluster FILE |\n"
	"                                               --server HOST:PORT]\n"
	"\n"
	"List, read, write, create and delete the variables of a cluster's parameter\n"
	"servers (the tasks of job \"ps\"; every task when the cluster has no such job).\n"
	"\n"
	"  ls [PREFIX] [--long]            list variables (merged over the ps tasks)\n"
	"  get NAME [--format F] [-o FILE] read one (text by default)\n"
	"  put NAME FILE|--value V [...]   write one from .npy, text, raw or a literal\n"
	"  create NAME --shape S [...]     create one, initialised here\n"
	"  rm NAME...                      delete variables (and their slots)\n"
	"  watch [NAME...] [--prefix P]    a line per change, as it happens\n"
	"\n"
	"'dg var SUBCOMMAND --help' describes each. Common options:\n";

static const char ls_help[] =
	"usage: dg var ls [PREFIX] [--long]\n"
	"\n"
	"List the variables whose names start with PREFIX, one name per line, merged\n"
	"over the ps tasks and sorted by name. Slot variables of optimizers\n"
	"(NAME.momentum, NAME.adam_m, ...) are listed too.\n"
	"\n"
	"  -l, --long         columns NAME DTYPE SHAPE BYTES VERSION MTIME TASK\n";

static const char watch_help[] =
	"usage: dg var watch [NAME...] [--prefix P] [--count N] [--timeout S]\n"
	"\n"
	"Print a line for each change of the named variables (every variable without\n"
	"a NAME or --prefix), as the ps tasks report it, from now on:\n"
	"  TIME TASK NAME VERSION EVENT\n"
	"TIME is ISO 8601 UTC with milliseconds, EVENT put (a write, a patch or a\n"
	"creation), apply (a gradient or assign) or delete. Slots of optimizers\n"
	"(NAME.momentum, ...) are variables too. A task that cannot be reached is\n"
	"retried; a task that restarted is said on stderr (changes may have been\n"
	"missed there). 'dg var watch w1 --count 1 && ...' acts when w1 changes.\n"
	"\n"
	"  --prefix P         also every variable whose name starts with P\n"
	"  -n, --count N      stop after N lines (exit 0)\n"
	"  --timeout S        stop after S seconds: exit 0 without --count, else\n"
	"                     exit 14 (timeout) when fewer than N lines came\n";

static const char get_help[] =
	"usage: dg var get NAME [--format raw|npy|text] [-o FILE]\n"
	"\n"
	"Read a variable from the ps task that holds it. text (the default) is a\n"
	"\"# dtype [shape]\" line, then one row of the last dimension per line; npy\n"
	"is NumPy's format; raw is the bare little-endian elements.\n"
	"\n"
	"  --format F         raw, npy or text (default text)\n"
	"  -o, --out FILE     write FILE (atomically) instead of standard output;\n"
	"                     raw and npy are not written to a terminal\n";

static const char put_help[] =
	"usage: dg var put NAME (FILE.npy | FILE.txt | FILE --dtype D --shape S |\n"
	"                        --value JSON) [--replace] [--if-version V]\n"
	"\n"
	"Write a variable: on the task that holds it, or, for a new one, on the ps\n"
	"task holding the fewest bytes. FILE.npy carries its dtype and shape; FILE.txt\n"
	"is dg's text encoding (its header line, or --dtype/--shape, or the existing\n"
	"variable's, else a 1-d float32 of its numbers); any other FILE is raw bytes\n"
	"(--dtype and --shape, or the existing variable's). --value takes a JSON\n"
	"literal such as 0.5, [1,2,3] or [[1,2],[3,4]] (nan, inf allowed), typed as\n"
	"--dtype, the existing variable's dtype, or JSON's (integers int32, else\n"
	"float32).\n"
	"\n"
	"  --dtype D          element type: float32 float64 int32 int64 uint8 bool\n"
	"  --shape S          dimensions, e.g. 2,3 ('' or [] for a scalar)\n"
	"  --value JSON       the value itself instead of a file\n"
	"  --replace          allow another dtype or shape than the variable has\n"
	"  --if-version V     write only if the variable is at version V\n";

static const char create_help[] =
	"usage: dg var create NAME --shape S [--dtype D] [--init I] [--seed N] [--scale X]\n"
	"\n"
	"Create a variable on the ps task holding the fewest bytes; refused when the\n"
	"name exists anywhere. The value is computed here with the op registry's\n"
	"seeded random ops and sent once.\n"
	"\n"
	"  --shape S          dimensions, e.g. 784,256 (required)\n"
	"  --dtype D          element type (default float32)\n"
	"  --init I           zeros (default); ones: every element X (default 1);\n"
	"                     uniform: in [-X, X) (default 0.05); normal: mean 0,\n"
	"                     stddev X (default 0.05); glorot: uniform in\n"
	"                     +-X*sqrt(6/(fan_in+fan_out)) (default X 1)\n"
	"  --seed N           seed of the random inits (default: from the clock;\n"
	"                     printed, so the value can be made again)\n"
	"  --scale X          the X above\n";

static const char rm_help[] =
	"usage: dg var rm NAME...\n"
	"\n"
	"Delete variables (with their optimizer slots) from the ps task holding each.\n"
	"Every name is tried; the exit status is that of the first failure.\n";

struct sub {
	const char *name;
	int (*fn)(struct var_args *a);
	unsigned allowed;               /* OPT_* accepted besides OPT_CONN */
	int min_pos, max_pos;           /* -1: no maximum */
	const char *help;
};

static enum dg_status parse_u64(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	if (!s[0] || s[0] == '-')
		return DG_EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end)
		return DG_EINVAL;
	*out = v;
	return DG_OK;
}

static int parse_format(const char *s, enum dg_encoding *out)
{
	if (strcmp(s, "raw") == 0)
		*out = DG_ENC_RAW;
	else if (strcmp(s, "npy") == 0)
		*out = DG_ENC_NPY;
	else if (strcmp(s, "text") == 0 || strcmp(s, "txt") == 0)
		*out = DG_ENC_TEXT;
	else
		return -1;
	return 0;
}

static int parse_init(const char *s, enum init_kind *out)
{
	static const char *const names[] = { "zeros", "ones", "uniform", "normal", "glorot" };

	for (int i = 0; i < 5; i++) {
		if (strcmp(s, names[i]) == 0) {
			*out = (enum init_kind)i;
			return 0;
		}
	}
	return -1;
}

/* One option into a; returns -1 to go on, else the exit code. */
static int parse_opt(int c, const char *arg, char **argv, struct var_args *a)
{
	char cmd[32];
	struct dg_err err = { 0 };
	char *end;

	snprintf(cmd, sizeof cmd, "var %s", a->sub);
	switch (c) {
	case 'C': a->given |= OPT_CLUSTER; a->cluster = arg; break;
	case 'S': a->given |= OPT_SERVER; a->server = arg; break;
	case 'T': a->given |= OPT_TOKEN; a->token_file = arg; break;
	case 'l': a->given |= OPT_LONG; a->long_list = true; break;
	case 'o': a->given |= OPT_OUT; a->out = arg; break;
	case 'v': a->given |= OPT_VALUE; a->value = arg; break;
	case 'r': a->given |= OPT_REPLACE; a->replace = true; break;
	case 'f':
		a->given |= OPT_FORMAT;
		if (parse_format(arg, &a->format) != 0)
			return cli_usage(cmd, "--format '%s': use raw, npy or text", arg);
		break;
	case 'd':
		a->given |= OPT_DTYPE;
		a->has_dtype = true;
		if (dg_dtype_parse(arg, &a->dtype, &err) != DG_OK)
			return cli_usage(cmd, "--dtype: %s (%s)", err.msg, err.hint);
		break;
	case 's':
		a->given |= OPT_SHAPE;
		a->has_shape = true;
		if (dg_shape_parse(arg, &a->shape, &err) != DG_OK)
			return cli_usage(cmd, "--shape: %s", err.msg);
		break;
	case 'V':
		a->given |= OPT_IF_VERSION;
		if (parse_u64(arg, &a->if_version) != DG_OK || a->if_version == 0)
			return cli_usage(cmd, "--if-version '%s' is not a version (1, 2, ...)",
					 arg);
		break;
	case 'i':
		a->given |= OPT_INIT;
		if (parse_init(arg, &a->init) != 0)
			return cli_usage(cmd, "--init '%s': use zeros, ones, uniform, normal or "
					 "glorot", arg);
		break;
	case 'e':
		a->given |= OPT_SEED;
		errno = 0;
		a->seed = strtoll(arg, &end, 10);
		if (errno || !arg[0] || *end)
			return cli_usage(cmd, "--seed '%s' is not a 64-bit integer", arg);
		break;
	case 'x':
		a->given |= OPT_SCALE;
		errno = 0;
		a->scale = strtod(arg, &end);
		if (errno || !arg[0] || *end || !isfinite(a->scale) || a->scale < 0)
			return cli_usage(cmd, "--scale '%s' is not a finite number >= 0", arg);
		break;
	case 'p':
		a->given |= OPT_PREFIX;
		if (!arg[0])
			return cli_usage(cmd, "--prefix needs a non-empty value");
		a->prefix = arg;
		break;
	case 'n':
		a->given |= OPT_COUNT;
		errno = 0;
		a->count = strtoll(arg, &end, 10);
		if (errno || !arg[0] || *end || a->count < 1)
			return cli_usage(cmd, "--count '%s' is not a positive integer", arg);
		break;
	case 't': {
		a->given |= OPT_TIMEOUT;
		errno = 0;
		double t = strtod(arg, &end);
		if (errno || !arg[0] || *end || !isfinite(t) || t <= 0 || t > 1e9)
			return cli_usage(cmd, "--timeout '%s' is not a number of seconds > 0", arg);
		a->timeout_ms = (int64_t)(t * 1000.0 + 0.5);
		if (a->timeout_ms < 1)
			a->timeout_ms = 1;
		break;
	}
	case ':': return cli_usage(cmd, "option '%s' needs a value", argv[optind - 1]);
	default: return cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
	}
	return -1;
}

/* The flag spelled for bit b, for "does not apply" messages. */
static const char *opt_name(unsigned b)
{
	static const char *const names[] = { "--cluster", "--server", "--token-file", "--long",
					     "--format", "--out", "--dtype", "--shape", "--value",
					     "--replace", "--if-version", "--init", "--seed",
					     "--scale", "--prefix", "--count", "--timeout" };
	for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
		if (b == 1u << i)
			return names[i];
	return "?";
}

/* Returns -1 to go on, else the exit code (help printed or usage error). */
static int parse_args(const struct sub *s, int argc, char **argv, struct var_args *a)
{
	char cmd[32];
	int c, rc;

	snprintf(cmd, sizeof cmd, "var %s", s->name);
	a->sub = s->name;
	optind = 0;      /* glibc: full re-initialisation, argv[0] is the subcommand */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hlo:n:", long_opts, NULL)) != -1) {
		if (c == 'h') {
			fputs(s->help, stdout);
			fputs("\n", stdout);
			fputs(conn_help, stdout);
			return 0;
		}
		if ((rc = parse_opt(c, optarg, argv, a)) >= 0)
			return rc;
	}
	unsigned bad = a->given & ~(s->allowed | OPT_CONN);
	if (bad)
		return cli_usage(cmd, "option %s does not apply to 'dg var %s'",
				 opt_name(bad & -bad), s->name);
	if ((a->given & OPT_CLUSTER) && (a->given & OPT_SERVER))
		return cli_usage(cmd, "give --cluster or --server, not both");
	a->pos = argv + optind;
	a->n_pos = argc - optind;
	if (a->n_pos < s->min_pos)
		return cli_usage(cmd, "missing NAME");
	if (s->max_pos >= 0 && a->n_pos > s->max_pos)
		return cli_usage(cmd, "unexpected argument '%s'", a->pos[s->max_pos]);
	return -1;
}

/* --- the servers -------------------------------------------------------------- */

static void *client_open(const char *address, const char *token, struct dg_err *err)
{
	return dg_client_new(address, token, err);
}

static void client_close(void *c)
{
	dg_client_free(c);
}

static const struct cli_client_ops client_ops = { client_open, client_close };

/* The servers holding variables: --server, else the tasks of job "ps" of the
 * cluster (every task when it has no "ps" job). */
static enum dg_status targets_open(const struct var_args *a, struct cli_targets *ts,
				   struct dg_err *err)
{
	const struct cli_target_query q = {
		.cluster = a->cluster, .server = a->server, .job = "ps",
		.token_file = a->token_file,
	};

	return cli_targets_open(&q, &client_ops, ts, err);
}

/* Folds the per-task outcomes of a name lookup: not found on every task is
 * DG_ENOTFOUND; a task that could not answer makes the lookup fail with its
 * error (the name might be there). */
struct lookup {
	bool failed;
	struct dg_err first;            /* the first error other than not found */
	const char *failed_label;
};

static void lookup_note(struct lookup *lk, const struct cli_target *t, const struct dg_err *e)
{
	if (e->code == DG_ENOTFOUND || lk->failed)
		return;
	lk->failed = true;
	lk->first = *e;
	lk->failed_label = t->label;
}

static enum dg_status lookup_end(struct lookup *lk, const struct cli_targets *ts, const char *name,
				 struct dg_err *err)
{
	if (lk->failed) {
		*err = lk->first;
		if (ts->n > 1)
			dg_err_prefix(err, "%s", lk->failed_label);
		return err->code;
	}
	if (ts->n == 1)
		dg_err_set(err, DG_ENOTFOUND, "variable '%s' not found on %s", name,
			   ts->t[0].label);
	else
		dg_err_set(err, DG_ENOTFOUND, "variable '%s' not found on any of the %d ps tasks",
			   name, ts->n);
	dg_err_hint(err, "list variables with: dg var ls");
	return DG_ENOTFOUND;
}

/* The task holding name: *idx and *info, or DG_ENOTFOUND. */
static enum dg_status locate(const struct cli_targets *ts, const char *name, int *idx,
			     struct dg_var_info *info, struct dg_err *err)
{
	struct lookup lk = { 0 };
	enum dg_status st;

	if ((st = dg_var_name_check(name, err)) != DG_OK)
		return st;
	for (int i = 0; i < ts->n; i++) {
		struct dg_err e = { 0 };
		if (dg_var_stat(ts->t[i].client, name, info, &e) == DG_OK) {
			*idx = i;
			return DG_OK;
		}
		lookup_note(&lk, &ts->t[i], &e);
	}
	return lookup_end(&lk, ts, name, err);
}

/* Where a new variable goes: each task says what it holds (its health), and
 * core's rule picks (dg_cluster_pick_fewest_bytes). One task: nothing asked. */
static enum dg_status place_new(const struct cli_targets *ts, int *idx, struct dg_err *err)
{
	enum dg_status st = DG_OK;
	int64_t *bytes;

	*idx = 0;
	if (ts->n <= 1)
		return DG_OK;
	if (!(bytes = calloc((size_t)ts->n, sizeof *bytes)))
		return dg_err_set(err, DG_ENOMEM, "out of memory placing a new variable");
	for (int i = 0; i < ts->n && st == DG_OK; i++) {
		json_t *h;
		if ((st = dg_client_health(ts->t[i].client, &h, err)) != DG_OK) {
			dg_err_prefix(err, "%s", ts->t[i].label);
			break;
		}
		bytes[i] = json_integer_value(json_object_get(h, "bytes"));
		json_decref(h);
	}
	if (st == DG_OK)
		*idx = dg_cluster_pick_fewest_bytes(bytes, NULL, ts->n);
	free(bytes);
	return st;
}

/* --- ls ----------------------------------------------------------------------- */

struct listed {
	struct dg_var_info v;
	int task;
};

static int listed_cmp(const void *pa, const void *pb)
{
	const struct listed *a = pa, *b = pb;
	int c = strcmp(a->v.name, b->v.name);

	return c ? c : a->task - b->task;
}

static void format_mtime(double t, char *buf, size_t n)
{
	time_t s = (time_t)t;
	struct tm tm;

	if (t <= 0 || !gmtime_r(&s, &tm) || strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(buf, n, "-");
}

static void print_long(const struct listed *l, int n, const struct cli_targets *ts)
{
	int wn = 4, ws = 5;
	char sh[160], mt[32];

	for (int i = 0; i < n; i++) {
		int len = (int)strlen(l[i].v.name);
		wn = len > wn ? len : wn;
		len = dg_shape_format(&l[i].v.shape, sh, sizeof sh);
		ws = len > ws ? len : ws;
	}
	printf("%-*s  %-7s  %-*s  %12s  %8s  %-20s  %s\n", wn, "NAME", "DTYPE", ws, "SHAPE",
	       "BYTES", "VERSION", "MTIME", "TASK");
	for (int i = 0; i < n; i++) {
		dg_shape_format(&l[i].v.shape, sh, sizeof sh);
		format_mtime(l[i].v.mtime, mt, sizeof mt);
		printf("%-*s  %-7s  %-*s  %12" PRIu64 "  %8" PRIu64 "  %-20s  %s\n", wn,
		       l[i].v.name, dg_dtype_name(l[i].v.dtype), ws, sh, l[i].v.bytes,
		       l[i].v.version, mt, ts->t[l[i].task].label);
	}
}

static int cmd_ls(struct var_args *a)
{
	struct dg_err err = { 0 };
	struct cli_targets ts;
	struct listed *all = NULL;
	int n_all = 0, rc = 0;

	if (targets_open(a, &ts, &err) != DG_OK)
		return cli_fail(&err);
	for (int i = 0; i < ts.n; i++) {
		struct dg_var_info *v;
		int n;
		if (dg_var_list(ts.t[i].client, a->n_pos ? a->pos[0] : NULL, &v, &n, &err) !=
		    DG_OK) {
			/* Say which task is missing from the list, go on with the rest. */
			if (ts.n > 1)
				dg_err_prefix(&err, "%s", ts.t[i].label);
			int r = cli_fail(&err);
			rc = rc ? rc : r;
			continue;
		}
		struct listed *grown = n ? realloc(all, (size_t)(n_all + n) * sizeof *all) : all;
		if (n && !grown) {
			free(v);
			dg_err_set(&err, DG_ENOMEM, "out of memory listing variables");
			rc = cli_fail(&err);
			break;
		}
		all = grown;
		for (int k = 0; k < n; k++)
			all[n_all++] = (struct listed){ .v = v[k], .task = i };
		free(v);
	}
	if (n_all)
		qsort(all, (size_t)n_all, sizeof *all, listed_cmp);
	if (a->long_list)
		print_long(all, n_all, &ts);
	else
		for (int i = 0; i < n_all; i++)
			printf("%s\n", all[i].v.name);
	free(all);
	cli_targets_close(&ts);
	return rc;
}

/* --- get ---------------------------------------------------------------------- */

static enum dg_status write_out(const char *path, const struct dg_buf *b, struct dg_err *err)
{
	if (path)
		return dg_write_file_atomic(path, b->data ? b->data : "", b->len, err);
	if (b->len && fwrite(b->data, 1, b->len, stdout) != b->len)
		return dg_err_set(err, DG_EIO, "writing to standard output failed");
	return DG_OK;
}

static int cmd_get(struct var_args *a)
{
	struct dg_err err = { 0 };
	struct cli_targets ts;
	struct dg_buf b = { 0 };
	struct lookup lk = { 0 };
	const char *name = a->pos[0];
	enum dg_encoding enc = (a->given & OPT_FORMAT) ? a->format : DG_ENC_TEXT;
	enum dg_status st = DG_ENOTFOUND;

	if (enc != DG_ENC_TEXT && !a->out && isatty(STDOUT_FILENO)) {
		dg_err_set(&err, DG_EINVAL, "not writing %s bytes of variable '%s' to a terminal",
			   dg_encoding_name(enc), name);
		dg_err_hint(&err, "give -o FILE or redirect standard output");
		return cli_fail(&err);
	}
	if ((st = dg_var_name_check(name, &err)) != DG_OK ||
	    (st = targets_open(a, &ts, &err)) != DG_OK)
		return cli_fail(&err);
	/* One GET per task until one has it: a single round trip in the common
	 * case of one ps. */
	for (int i = 0; i < ts.n; i++) {
		struct dg_err e = { 0 };
		st = dg_var_get_encoded(ts.t[i].client, name, enc, &b, NULL, &e);
		if (st == DG_OK)
			break;
		lookup_note(&lk, &ts.t[i], &e);
	}
	if (st != DG_OK)
		st = lookup_end(&lk, &ts, name, &err);
	if (st == DG_OK)
		st = write_out(a->out, &b, &err);
	dg_buf_deinit(&b);
	cli_targets_close(&ts);
	return st == DG_OK ? 0 : cli_fail(&err);
}

/* --- put ---------------------------------------------------------------------- */

static struct dg_tensor *parse_value(const char *text, const enum dg_dtype *dt,
				     struct dg_err *err)
{
	char *fixed = cli_quote_nonfinite(text);
	json_error_t je;
	json_t *v;
	struct dg_tensor *t;

	if (!fixed) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	v = json_loads(fixed, JSON_DECODE_ANY, &je);
	free(fixed);
	if (!v) {
		dg_err_set(err, DG_EINVAL, "--value '%.60s' is not a JSON literal (%s)", text,
			   je.text);
		dg_err_hint(err, "e.g. --value 0.5, --value [1,2,3], --value [[1,2],[3,4]]");
		return NULL;
	}
	t = dg_json_to_tensor(v, dt, err);
	json_decref(v);
	if (!t)
		dg_err_prefix(err, "--value");
	return t;
}

/* Give t the shape want when the element counts agree (a flat literal for a
 * [2,2] variable); DG_ESHAPE naming both otherwise. */
static enum dg_status reshape(struct dg_tensor *t, const struct dg_shape *want,
			      struct dg_err *err)
{
	int64_t n;
	char a[128], b[128];

	if (dg_shape_numel(want, &n, err) != DG_OK)
		return err->code;
	if (n != t->numel) {
		dg_shape_format(&t->shape, a, sizeof a);
		dg_shape_format(want, b, sizeof b);
		dg_err_set(err, DG_ESHAPE, "the value has shape %s (%" PRId64 " elements), not %s",
			   a, t->numel, b);
		dg_err_hint(err, "give --shape, or --replace to change the variable's shape");
		return DG_ESHAPE;
	}
	t->shape = *want;
	return DG_OK;
}

/* The tensor a put sends. existing (NULL for a new variable) supplies the
 * dtype and shape the input leaves open: flags first, then the variable as it
 * is (its shape only without --replace), then the encoding's own. */
static struct dg_tensor *put_input(const struct var_args *a, const struct dg_var_info *existing,
				   struct dg_err *err)
{
	const char *file = a->n_pos > 1 ? a->pos[1] : NULL;
	const enum dg_dtype *dt = a->has_dtype ? &a->dtype : existing ? &existing->dtype : NULL;
	const struct dg_shape *shape = a->has_shape ? &a->shape
				       : existing && !a->replace ? &existing->shape : NULL;
	struct dg_buf b = { 0 };
	struct dg_tensor *t = NULL;
	static const enum dg_dtype f32 = DG_F32;

	if (!file) {
		t = parse_value(a->value, dt, err);
	} else if (cli_ends_with(file, ".npy")) {
		t = dg_npy_read_file(file, err);
	} else if (dg_buf_read_file(&b, file, FILE_LIMIT, err) == DG_OK) {
		if (cli_ends_with(file, ".txt") || cli_ends_with(file, ".text"))
			t = dg_text_decode(b.data ? b.data : "", b.len, dt ? dt : &f32, shape, err);
		else if (!dt || !shape)
			dg_err_set(err, DG_EINVAL, "'%s' is raw bytes: give --dtype and --shape",
				   file);
		else
			t = dg_raw_decode(b.data, b.len, *dt, shape, err);
		if (!t)
			dg_err_prefix(err, "%s", file);
	}
	dg_buf_deinit(&b);
	if (t && !file && shape && reshape(t, shape, err) != DG_OK) {
		dg_tensor_free(t);
		t = NULL;
	}
	return t;
}

static int cmd_put(struct var_args *a)
{
	struct dg_err err = { 0 };
	struct cli_targets ts;
	struct dg_var_info info;
	struct dg_tensor *t = NULL;
	struct dg_put_opts opts = { .replace = a->replace, .if_match = a->if_version };
	const char *name = a->pos[0];
	const char *file = a->n_pos > 1 ? a->pos[1] : NULL;
	uint64_t version = 0;
	char sh[128];
	int idx;
	enum dg_status st;

	if (!file == !a->value)
		return cli_usage("var put", file ? "give FILE or --value, not both"
					       : "missing FILE or --value");
	if (file && cli_ends_with(file, ".npy") && (a->has_dtype || a->has_shape))
		return cli_usage("var put", "a .npy file carries its own dtype and shape; "
				 "drop --dtype/--shape");
	if ((st = dg_var_name_check(name, &err)) != DG_OK ||
	    (st = targets_open(a, &ts, &err)) != DG_OK)
		return cli_fail(&err);
	st = locate(&ts, name, &idx, &info, &err);
	bool exists = st == DG_OK;
	if (st == DG_ENOTFOUND)
		st = place_new(&ts, &idx, &err);
	if (st == DG_OK && !(t = put_input(a, exists ? &info : NULL, &err)))
		st = err.code;
	if (st == DG_OK)
		st = dg_var_put(ts.t[idx].client, name, t, &opts, &version, &err);
	if (st == DG_OK) {
		dg_shape_format(&t->shape, sh, sizeof sh);
		printf("%s %s: %s %s, version %" PRIu64 " on %s\n", exists ? "wrote" : "created",
		       name, dg_dtype_name(t->dtype), sh, version, ts.t[idx].label);
	}
	dg_tensor_free(t);
	cli_targets_close(&ts);
	return st == DG_OK ? 0 : cli_fail(&err);
}

/* --- create ------------------------------------------------------------------- */

/* A random init through the registry's op (RandomUniform, RandomNormal,
 * GlorotUniform): the same seeded stream a graph would draw. */
static struct dg_tensor *random_init(const struct var_args *a, const char *op, json_t *attrs,
				     struct dg_err *err)
{
	json_t *shape = json_array();
	struct dg_tensor *out = NULL;

	for (int i = 0; shape && i < a->shape.ndim; i++)
		json_array_append_new(shape, json_integer(a->shape.dim[i]));
	json_object_set_new(attrs, "shape", shape);
	json_object_set_new(attrs, "dtype", json_string(dg_dtype_name(a->dtype)));
	json_object_set_new(attrs, "seed", json_integer(a->seed));
	if (!dg_op_find(op))
		dg_err_set(err, DG_EINTERNAL, "op %s is not in the registry", op);
	else if (dg_op_run(dg_op_find(op), attrs, NULL, 0, &out, 1, 0, err) != DG_OK)
		out = NULL;
	json_decref(attrs);
	return out;
}

static struct dg_tensor *make_init(const struct var_args *a, struct dg_err *err)
{
	bool scaled = a->given & OPT_SCALE;
	struct dg_tensor *t = NULL;

	if (a->init > INIT_ONES && !dg_dtype_is_float(a->dtype)) {
		dg_err_set(err, DG_EDTYPE, "--init %s draws float32 or float64 values, not %s",
			   a->init == INIT_UNIFORM ? "uniform" : a->init == INIT_NORMAL ? "normal"
			   : "glorot", dg_dtype_name(a->dtype));
		dg_err_hint(err, "use --dtype float32 or float64 (Cast to float16/bfloat16 "
			    "afterwards), or --init zeros|ones");
		return NULL;
	}
	switch (a->init) {
	case INIT_ZEROS:
	case INIT_ONES:
		t = dg_tensor_new(a->dtype, &a->shape, err);
		for (int64_t i = 0; t && a->init == INIT_ONES && i < t->numel; i++)
			dg_tensor_set_f64(t, i, scaled ? a->scale : 1.0);
		return t;
	case INIT_UNIFORM: {
		double x = scaled ? a->scale : 0.05;
		return random_init(a, "RandomUniform", json_pack("{s:f, s:f}", "minval", -x,
								 "maxval", x), err);
	}
	case INIT_NORMAL:
		return random_init(a, "RandomNormal", json_pack("{s:f, s:f}", "mean", 0.0, "stddev",
								scaled ? a->scale : 0.05), err);
	case INIT_GLOROT:
		t = random_init(a, "GlorotUniform", json_object(), err);
		for (int64_t i = 0; t && scaled && i < t->numel; i++)
			dg_tensor_set_f64(t, i, dg_tensor_get_f64(t, i) * a->scale);
		return t;
	}
	return NULL;
}

static int cmd_create(struct var_args *a)
{
	struct dg_err err = { 0 };
	struct cli_targets ts;
	struct dg_var_info info;
	struct dg_tensor *t = NULL;
	struct dg_put_opts opts = { .create_only = true };
	const char *name = a->pos[0];
	static const char *const inits[] = { "zeros", "ones", "uniform", "normal", "glorot" };
	uint64_t version = 0;
	char sh[128], seed[48] = "";
	int idx;
	enum dg_status st;

	if (!a->has_shape)
		return cli_usage("var create", "missing --shape (e.g. --shape 784,256)");
	if (a->init == INIT_UNIFORM && (a->given & OPT_SCALE) && a->scale == 0)
		return cli_usage("var create", "--init uniform needs --scale above 0");
	if (!a->has_dtype)
		a->dtype = DG_F32;
	if (!(a->given & OPT_SEED))
		a->seed = (int64_t)(((uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid()) &
				    0x7fffffff);
	if (a->init > INIT_ONES)
		snprintf(seed, sizeof seed, ", seed %" PRId64, a->seed);
	if ((st = dg_var_name_check(name, &err)) != DG_OK ||
	    (st = targets_open(a, &ts, &err)) != DG_OK)
		return cli_fail(&err);
	st = locate(&ts, name, &idx, &info, &err);
	if (st == DG_OK) {
		dg_shape_format(&info.shape, sh, sizeof sh);
		st = dg_err_set(&err, DG_EEXIST, "variable '%s' already exists on %s (%s %s, "
				"version %" PRIu64 ")", name, ts.t[idx].label,
				dg_dtype_name(info.dtype), sh, info.version);
		dg_err_hint(&err, "overwrite it with 'dg var put %s ... --replace', or remove it "
			    "with 'dg var rm %s'", name, name);
	} else if (st == DG_ENOTFOUND) {
		st = place_new(&ts, &idx, &err);
		if (st == DG_OK && !(t = make_init(a, &err)))
			st = err.code;
		if (st == DG_OK)
			st = dg_var_put(ts.t[idx].client, name, t, &opts, &version, &err);
		if (st == DG_ECONFLICT) {
			/* If-None-Match lost: someone created it since the lookup. */
			st = dg_err_set(&err, DG_EEXIST, "variable '%s' was created on %s "
					"meanwhile", name, ts.t[idx].label);
		}
	}
	if (st == DG_OK) {
		dg_shape_format(&t->shape, sh, sizeof sh);
		printf("created %s: %s %s, init %s%s, version %" PRIu64 " on %s\n", name,
		       dg_dtype_name(t->dtype), sh, inits[a->init], seed, version,
		       ts.t[idx].label);
	}
	dg_tensor_free(t);
	cli_targets_close(&ts);
	return st == DG_OK ? 0 : cli_fail(&err);
}

/* --- rm ----------------------------------------------------------------------- */

static int cmd_rm(struct var_args *a)
{
	struct dg_err err = { 0 };
	struct cli_targets ts;
	int rc = 0;

	if (targets_open(a, &ts, &err) != DG_OK)
		return cli_fail(&err);
	for (int k = 0; k < a->n_pos; k++) {
		const char *name = a->pos[k];
		struct lookup lk = { 0 };
		enum dg_status st = dg_var_name_check(name, &err);
		int i;
		for (i = 0; st == DG_OK && i < ts.n; i++) {
			struct dg_err e = { 0 };
			if (dg_var_delete(ts.t[i].client, name, 0, &e) == DG_OK)
				break;
			lookup_note(&lk, &ts.t[i], &e);
		}
		if (st == DG_OK && i < ts.n) {
			printf("removed %s from %s\n", name, ts.t[i].label);
			continue;
		}
		if (st == DG_OK)
			lookup_end(&lk, &ts, name, &err);
		int r = cli_fail(&err);
		rc = rc ? rc : r;
	}
	cli_targets_close(&ts);
	return rc;
}

static int cmd_watch(struct var_args *a)
{
	struct dg_err err = { 0 };
	struct cli_targets ts;
	int rc;

	for (int i = 0; i < a->n_pos; i++)
		if (dg_var_name_check(a->pos[i], &err) != DG_OK)
			return cli_fail(&err);
	if (targets_open(a, &ts, &err) != DG_OK)
		return cli_fail(&err);
	struct var_watch_args w = { .names = a->pos, .n_names = a->n_pos, .prefix = a->prefix,
				    .count = a->count, .timeout_ms = a->timeout_ms };
	rc = var_watch_run(&ts, &w);
	cli_targets_close(&ts);
	return rc;
}

/* --- dispatch ----------------------------------------------------------------- */

static const struct sub subs[] = {
	{ "ls", cmd_ls, OPT_LONG, 0, 1, ls_help },
	{ "get", cmd_get, OPT_FORMAT | OPT_OUT, 1, 1, get_help },
	{ "put", cmd_put, OPT_DTYPE | OPT_SHAPE | OPT_VALUE | OPT_REPLACE | OPT_IF_VERSION, 1, 2,
	  put_help },
	{ "create", cmd_create, OPT_DTYPE | OPT_SHAPE | OPT_INIT | OPT_SEED | OPT_SCALE, 1, 1,
	  create_help },
	{ "rm", cmd_rm, 0, 1, -1, rm_help },
	{ "watch", cmd_watch, OPT_PREFIX | OPT_COUNT | OPT_TIMEOUT, 0, -1, watch_help },
};

int cmd_var(int argc, char **argv)
{
	struct var_args a = { 0 };
	int rc;

	if (argc < 2)
		return cli_usage("var", "missing subcommand: ls, get, put, create, rm or watch");
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		fputs(var_help, stdout);
		fputs(conn_help, stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
		if (strcmp(argv[1], subs[i].name) != 0)
			continue;
		if ((rc = parse_args(&subs[i], argc - 1, argv + 1, &a)) >= 0)
			return rc;
		return subs[i].fn(&a);
	}
	if (argv[1][0] == '-')
		return cli_usage("var", "'%s' before the subcommand: options go after it, e.g. "
				 "'dg var ls --cluster FILE'", argv[1]);
	return cli_usage("var", "unknown subcommand '%s' (ls, get, put, create, rm, watch)",
			 argv[1]);
}
