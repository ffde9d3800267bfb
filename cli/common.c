/* Helpers shared by the `dg` subcommands that talk to a cluster: where the
 * cluster spec comes from (cli_cluster_load) and the bearer token file
 * (cli_token_load). Declared in cli.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/cluster.h"

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
struct dg_cluster *cli_cluster_load(const char *flag_path, struct dg_err *err)
{
	const char *env = getenv("DG_CLUSTER"), *run = getenv("XDG_RUNTIME_DIR");
	const char *home = getenv("HOME");
	char run_path[4096] = "", home_path[4096] = "";
	struct dg_cluster *c;

	if (flag_path)
		return dg_cluster_load(flag_path, err);
	if (env && env[0]) {
		size_t skip = strspn(env, " \t\r\n");
		if (env[skip] == '{') {
			if (!(c = dg_cluster_parse(env, strlen(env), err)))
				dg_err_prefix(err, "$DG_CLUSTER");
			return c;
		}
		return dg_cluster_load(env, err);
	}
	if (run && run[0]) {
		snprintf(run_path, sizeof run_path, "%s/dg/cluster.json", run);
		if (file_exists(run_path))
			return dg_cluster_load(run_path, err);
	}
	if (home && home[0]) {
		snprintf(home_path, sizeof home_path, "%s/.dg/cluster.json", home);
		if (file_exists(home_path))
			return dg_cluster_load(home_path, err);
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
 * printable ASCII without spaces (it travels in a header). */
char *cli_token_load(const char *path, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	char *tok, *end;

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
