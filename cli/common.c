/* Helpers shared by the `dg` subcommands: the one way diagnostics are printed
 * (cli_fail, cli_usage), where the cluster spec comes from (cli_cluster_load),
 * the bearer token file (cli_token_load) and the list of servers a command
 * asks (cli_targets_open). Declared in cli.h; calls nothing in main.c or the
 * cmd_*.c files. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/cluster.h"

int cli_fail(const struct dg_err *err)
{
	fprintf(stderr, "dg: %s\n", err->msg[0] ? err->msg : dg_status_name(err->code));
	if (err->hint[0])
		fprintf(stderr, "dg: hint: %s\n", err->hint);
	return dg_status_to_exit(err->code);
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fputs("dg: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\ntry 'dg %s --help'\n", cmd);
	return 1;
}

#define TOKEN_FILE_MAX 4096     /* bytes: a token file is one short line */

static bool file_exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0;
}

/* Where the cluster spec comes from, first found wins:
 *  1. flag_path (--cluster FILE);
 *  2. $DG_CLUSTER: a file name, or the JSON itself when it starts with '{';
 *  3. $XDG_RUNTIME_DIR/dg/cluster.json, then ~/.dg/cluster.json: where `dg up`
 *     writes the spec of the cluster it started.
 * Errors name the file that failed, or every place looked at when none exists. */
/* Where the spec comes from, in the order of cli_cluster_load: the flag,
 * $DG_CLUSTER (a path, or the spec's text: *text), the last dg up's link.
 * out gets the path ("" for $DG_CLUSTER's text); false when there is none,
 * with run_path/home_path the places looked at. */
static bool cluster_source(const char *flag_path, char *out, size_t cap, bool *text,
			   char *run_path, char *home_path)
{
	const char *env = getenv("DG_CLUSTER"), *run = getenv("XDG_RUNTIME_DIR");
	const char *home = getenv("HOME");

	*text = false;
	if (flag_path) {
		snprintf(out, cap, "%s", flag_path);
		return true;
	}
	if (env && env[0]) {
		*text = env[strspn(env, " \t\r\n")] == '{';
		snprintf(out, cap, "%s", *text ? "" : env);
		return true;
	}
	if (run && run[0]) {
		snprintf(run_path, 4096, "%s/dg/cluster.json", run);
		if (file_exists(run_path)) {
			snprintf(out, cap, "%s", run_path);
			return true;
		}
	}
	if (home && home[0]) {
		snprintf(home_path, 4096, "%s/.dg/cluster.json", home);
		if (file_exists(home_path)) {
			snprintf(out, cap, "%s", home_path);
			return true;
		}
	}
	return false;
}

bool cli_cluster_file(const char *flag_path, char *out, size_t cap)
{
	char run_path[4096] = "", home_path[4096] = "";
	bool text;

	return cluster_source(flag_path, out, cap, &text, run_path, home_path) && !text;
}

struct dg_cluster *cli_cluster_load(const char *flag_path, struct dg_err *err)
{
	char run_path[4096] = "", home_path[4096] = "", path[4096];
	const char *env = getenv("DG_CLUSTER");
	struct dg_cluster *c;
	bool text;

	if (cluster_source(flag_path, path, sizeof path, &text, run_path, home_path)) {
		if (!text)
			return dg_cluster_load(path, err);
		if (!(c = dg_cluster_parse(env, strlen(env), err)))
			dg_err_prefix(err, "$DG_CLUSTER");
		return c;
	}
	dg_err_set(err, DG_ENOTFOUND, "no cluster spec: no --cluster, $DG_CLUSTER is unset, "
		   "and no file at %s%s%s%s", run_path[0] ? run_path : "",
		   run_path[0] && home_path[0] ? " or " : "", home_path[0] ? home_path : "",
		   !run_path[0] && !home_path[0] ? "($XDG_RUNTIME_DIR and $HOME are unset)" : "");
	dg_err_hint(err, "pass --cluster FILE (e.g. {\"ps\": [\"localhost:2222\"]}), or start a "
		    "local cluster with 'dg up'");
	return NULL;
}

/* The token is the file's first line without surrounding blanks; it must be
 * printable ASCII without spaces (it travels in a header). A file that its
 * group or others may read is refused, as ssh refuses such a private key: the
 * token is the only secret between a client and the cluster. */
char *cli_pem_load(const char *path, bool private_key, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	struct stat sb;

	if (private_key && stat(path, &sb) == 0 && (sb.st_mode & 077)) {
		dg_err_set(err, DG_EINVAL, "TLS key file %s may be read by others (mode %04o); "
			   "it must be private to its owner", path, (unsigned)(sb.st_mode & 07777));
		dg_err_hint(err, "chmod 600 %s", path);
		return NULL;
	}
	if (dg_buf_read_file(&b, path, 1 << 20, err) != DG_OK) {
		dg_err_prefix(err, "TLS %s file", private_key ? "key" : "certificate");
		return NULL;
	}
	if (dg_buf_append(&b, "", 1, err) != DG_OK) {
		dg_buf_deinit(&b);
		return NULL;
	}
	if (!strstr(b.data, "-----BEGIN ")) {
		dg_err_set(err, DG_EINVAL, "TLS %s file %s is not PEM", private_key ? "key" :
			   "certificate", path);
		dg_err_hint(err, "give a PEM file (-----BEGIN ...), e.g. made by: openssl req "
			    "-x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ...");
		dg_buf_deinit(&b);
		return NULL;
	}
	return b.data;          /* the buffer's block, NUL-terminated: owned by the caller */
}

char *cli_token_load(const char *path, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	struct stat sb;
	char *tok, *end;

	if (stat(path, &sb) == 0 && (sb.st_mode & 077)) {
		dg_err_set(err, DG_EINVAL, "token file %s may be read by others (mode %04o); "
			   "it must be private to its owner", path, (unsigned)(sb.st_mode & 07777));
		dg_err_hint(err, "chmod 600 %s", path);
		return NULL;
	}
	if (dg_buf_read_file(&b, path, TOKEN_FILE_MAX, err) != DG_OK) {
		dg_err_prefix(err, "token file");
		return NULL;
	}
	if (dg_buf_append(&b, "", 1, err) != DG_OK)   /* an empty file has no block yet */
		goto fail;
	tok = b.data + strspn(b.data, " \t\r\n");
	end = tok + strcspn(tok, "\r\n");
	while (end > tok && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	*end = '\0';
	for (const char *p = tok; *p; p++) {
		if (*p <= ' ' || *p > '~') {
			dg_err_set(err, DG_EINVAL, "token file %s: the token has a space or a "
				   "non-printable character", path);
			goto fail;
		}
	}
	if (!tok[0]) {
		dg_err_set(err, DG_EINVAL, "token file %s is empty", path);
		dg_err_hint(err, "write one line, e.g. head -c 24 /dev/urandom | base64 > %s",
			    path);
		goto fail;
	}
	if ((tok = strdup(tok)))
		goto out;
	dg_err_set(err, DG_ENOMEM, "out of memory reading token file %s", path);
fail:
	tok = NULL;
out:
	dg_buf_deinit(&b);
	return tok;
}

bool cli_ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

bool cli_task_parse(const char *s, char *job, size_t job_len, int *index)
{
	const char *slash = strrchr(s, '/');
	char *end;
	long v;

	if (!slash || slash == s || (size_t)(slash - s) >= job_len || !slash[1])
		return false;
	v = strtol(slash + 1, &end, 10);
	if (*end || v < 0 || v > 1000000)
		return false;
	memcpy(job, s, (size_t)(slash - s));
	job[slash - s] = '\0';
	*index = (int)v;
	return true;
}

void cli_targets_close(struct cli_targets *ts)
{
	for (int i = 0; i < ts->n; i++) {
		if (ts->ops)
			ts->ops->close(ts->t[i].client);
		free(ts->t[i].address);
	}
	free(ts->t);
	free(ts->token);
	ts->t = NULL;
	ts->n = 0;
	ts->token = NULL;
}

/* Append a target; the client is made from address itself (not the copy). */
static enum dg_status target_add(struct cli_targets *ts, const char *label, const char *address,
				 struct dg_err *err)
{
	struct cli_target *t = &ts->t[ts->n];

	snprintf(t->label, sizeof t->label, "%s", label);
	if (!(t->address = strdup(address)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (ts->ops && !(t->client = ts->ops->open(address, ts->token, err))) {
		free(t->address);
		t->address = NULL;
		return err->code;
	}
	ts->n++;
	return DG_OK;
}

/* The targets of a cluster (cl borrowed) when no server was given. */
static enum dg_status targets_of_cluster(const struct cli_target_query *q,
					 const struct dg_cluster *cl, struct cli_targets *ts,
					 struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (q->task) {
		const struct dg_task_addr *ta;
		char job[64];
		int index = 0;
		if (!cli_task_parse(q->task, job, sizeof job, &index))
			return dg_err_set(err, DG_EINVAL, "--task '%s' is not JOB/INDEX", q->task);
		if (!(ta = dg_cluster_task(cl, job, index, err)))
			return err->code;
		return target_add(ts, q->task, ta->address, err);
	}
	bool has_job = q->job && dg_cluster_job_size(cl, q->job) > 0;
	for (int i = 0; st == DG_OK && i < cl->n_tasks; i++) {
		const struct dg_task_addr *ta = &cl->tasks[i];
		char label[64];
		if (has_job && strcmp(ta->job, q->job) != 0)
			continue;
		snprintf(label, sizeof label, "%s/%d", ta->job, ta->index);
		st = target_add(ts, label, ta->address, err);
	}
	/* dg_cluster_parse refuses empty specs and jobs: kept for a spec built otherwise. */
	if (st == DG_OK && ts->n == 0)
		st = dg_err_set(err, DG_EINVAL, "the cluster has no tasks");
	return st;
}

enum dg_status cli_targets_open(const struct cli_target_query *q,
				const struct cli_client_ops *ops, struct cli_targets *ts,
				struct dg_err *err)
{
	struct dg_cluster *cl = NULL;
	enum dg_status st;

	*ts = (struct cli_targets){ .ops = ops };
	if (q->token_file && !(ts->token = cli_token_load(q->token_file, err)))
		return err->code;
	if (!q->server && !(cl = cli_cluster_load(q->cluster, err))) {
		cli_targets_close(ts);
		return err->code;
	}
	int cap = q->server ? 1 : cl->n_tasks;
	ts->t = calloc((size_t)(cap > 0 ? cap : 1), sizeof *ts->t);
	if (!ts->t)
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	else if (q->server)
		st = target_add(ts, q->server, q->server, err);
	else
		st = targets_of_cluster(q, cl, ts, err);
	if (st != DG_OK)
		cli_targets_close(ts);
	dg_cluster_free(cl);
	return st;
}

/* JSON has no NaN or infinity: rewrite the bare words nan, inf and infinity
 * (any case, optional sign) outside strings as the "nan", "inf", "-inf" strings
 * that dg_json_to_tensor accepts. Returns a malloc'd copy or NULL (no memory). */
char *cli_quote_nonfinite(const char *s)
{
	size_t n = strlen(s);
	char *out = malloc(2 * n + 8), *o = out;
	bool in_str = false;

	if (!out)
		return NULL;
	for (const char *p = s; *p;) {
		if (in_str) {
			if (*p == '\\' && p[1])
				*o++ = *p++;
			else if (*p == '"')
				in_str = false;
			*o++ = *p++;
			continue;
		}
		if (*p == '"') {
			in_str = true;
			*o++ = *p++;
			continue;
		}
		const char *w = p;
		bool neg = false;
		if ((*w == '-' || *w == '+') && isalpha((unsigned char)w[1])) {
			neg = *w == '-';
			w++;
		}
		if (!isalpha((unsigned char)*w)) {
			*o++ = *p++;
			continue;
		}
		const char *e = w;
		while (isalpha((unsigned char)*e))
			e++;
		size_t len = (size_t)(e - w);
		const char *word = NULL;
		if (len == 3 && strncasecmp(w, "nan", 3) == 0)
			word = "\"nan\"";
		else if ((len == 3 && strncasecmp(w, "inf", 3) == 0) ||
			 (len == 8 && strncasecmp(w, "infinity", 8) == 0))
			word = neg ? "\"-inf\"" : "\"inf\"";
		if (word) {
			size_t wl = strlen(word);
			memcpy(o, word, wl);
			o += wl;
		} else {
			memcpy(o, p, (size_t)(e - p));   /* left for the JSON parser to refuse */
			o += e - p;
		}
		p = e;
	}
	*o = '\0';
	return out;
}
