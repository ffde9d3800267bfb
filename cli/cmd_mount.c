/* `dg mount MOUNTPOINT`: the cluster's variables as files (doc/filesystem.md).
 * Parses the options, loads the cluster spec and the token, warns about ps
 * tasks it cannot reach, and hands over to fs/ (dgfs_run), which mounts,
 * detaches unless --foreground, and serves until unmounted. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/client.h"
#include "dg/cluster.h"
#include "fs.h"

static const char mount_help[] =
	"usage: dg mount MOUNTPOINT [--cluster FILE | --server HOST:PORT] [options]\n"
	"\n"
	"Show every variable of the cluster's parameter servers as a file:\n"
	"MOUNTPOINT/vars/NAME (raw bytes), text/NAME, npy/NAME.npy, queues/NAME,\n"
	"cluster, jobs/, rows/NAME/LIST (rows of a variable as text: rows/emb/0-9).\n"
	"Reads see one version per open; writes are committed as one\n"
	"update when the file is closed. See doc/filesystem.md. Unmount with\n"
	"'fusermount3 -u MOUNTPOINT' or SIGTERM.\n"
	"\n"
	"  --cluster FILE       the cluster spec (default: $DG_CLUSTER, then the last\n"
	"                       'dg up'); variables live on the tasks of job \"ps\"\n"
	"  --server HOST:PORT   mount the variables of this one server\n"
	"  --token-file F       send the bearer token in F (first line)\n"
	"  --timeout S          deadline of each request, seconds (default 10): a lost\n"
	"                       server gives EIO after it, never a hang\n"
	"  --attr-timeout S     cache time of attributes and the variable list (default 1)\n"
	"  --entry-timeout S    cache time of name lookups (default 1)\n"
	"  -f, --foreground     do not detach (log to stderr)\n"
	"  -o OPT[,OPT...]      ro (read-only), overwrite (commit without the version\n"
	"                       check: no ESTALE); other options go to FUSE\n"
	"  -d, --debug          FUSE's debug log (implies --foreground)\n"
	"  -h, --help           show this help\n";

static const struct option long_opts[] = {
	{ "cluster", required_argument, NULL, 'C' },
	{ "server", required_argument, NULL, 'S' },
	{ "token-file", required_argument, NULL, 'T' },
	{ "timeout", required_argument, NULL, 't' },
	{ "attr-timeout", required_argument, NULL, 'a' },
	{ "entry-timeout", required_argument, NULL, 'e' },
	{ "foreground", no_argument, NULL, 'f' },
	{ "debug", no_argument, NULL, 'd' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static int parse_seconds(const char *flag, const char *s, double min, double *out)
{
	char *end;

	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < min || v > 86400)
		return cli_usage("mount", "%s '%s': give seconds, e.g. 10 or 0.5", flag, s);
	*out = v;
	return -1;
}

/* Split -o: ro and overwrite are ours, the rest goes to FUSE (appended to
 * extra, comma-separated). */
static int parse_o(const char *arg, struct dgfs_config *cfg, char *extra, size_t cap)
{
	char *copy = strdup(arg), *save = NULL;

	if (!copy)
		return cli_usage("mount", "out of memory");
	for (char *o = strtok_r(copy, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		if (strcmp(o, "ro") == 0) {
			cfg->read_only = true;
		} else if (strcmp(o, "rw") == 0) {
			cfg->read_only = false;
		} else if (strcmp(o, "overwrite") == 0) {
			cfg->overwrite = true;
		} else {
			size_t l = strlen(extra);
			if (l + strlen(o) + 2 > cap) {
				free(copy);
				return cli_usage("mount", "-o: too many options");
			}
			snprintf(extra + l, cap - l, "%s%s", l ? "," : "", o);
		}
	}
	free(copy);
	return -1;
}

/* Say which ps tasks do not answer now; the mount starts anyway. */
static void warn_unreachable(const struct dg_cluster *cl, const char *server, const char *token)
{
	bool has_ps = cl && dg_cluster_job_size(cl, "ps") > 0;
	int n = cl ? cl->n_tasks : 1;

	for (int i = 0; i < n; i++) {
		const char *addr = cl ? cl->tasks[i].address : server;
		struct dg_err err = { 0 };
		json_t *h = NULL;
		if (cl && has_ps && strcmp(cl->tasks[i].job, "ps") != 0)
			continue;
		struct dg_client *c = dg_client_new(addr, token, &err);
		if (c) {
			dg_client_set_timeout(c, 5000);
			dg_client_health(c, &h, &err);
		}
		dg_client_free(c);
		if (!h)
			fprintf(stderr, "dg: warning: %s is not reachable now (%s); the mount "
				"retries on each request\n", addr, err.msg);
		json_decref(h);
	}
}

int cmd_mount(int argc, char **argv)
{
	struct dgfs_config cfg = { .timeout_s = 10, .attr_timeout_s = 1, .entry_timeout_s = 1 };
	const char *cluster_path = NULL, *token_file = NULL;
	char extra[512] = "", mp[PATH_MAX];
	struct dg_err err = { 0 };
	struct dg_cluster *cl = NULL;
	char *token = NULL;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "fo:dh", long_opts, NULL)) != -1) {
		rc = -1;
		switch (c) {
		case 'C': cluster_path = optarg; break;
		case 'S': cfg.server = optarg; break;
		case 'T': token_file = optarg; break;
		case 't': rc = parse_seconds("--timeout", optarg, 0.1, &cfg.timeout_s); break;
		case 'a':
			rc = parse_seconds("--attr-timeout", optarg, 0, &cfg.attr_timeout_s);
			break;
		case 'e':
			rc = parse_seconds("--entry-timeout", optarg, 0, &cfg.entry_timeout_s);
			break;
		case 'f': cfg.foreground = true; break;
		case 'd': cfg.debug = cfg.foreground = true; break;
		case 'o': rc = parse_o(optarg, &cfg, extra, sizeof extra); break;
		case 'h': fputs(mount_help, stdout); return 0;
		default: return cli_usage("mount", "unknown option");
		}
		if (rc >= 0)
			return rc;
	}
	if (optind != argc - 1)
		return cli_usage("mount", "give one MOUNTPOINT");
	if (cluster_path && cfg.server)
		return cli_usage("mount", "give --cluster or --server, not both");
	if (!realpath(argv[optind], mp)) {
		fprintf(stderr, "dg: mount point %s: %s\n", argv[optind], strerror(errno));
		fprintf(stderr, "dg: hint: create it first (mkdir -p %s)\n", argv[optind]);
		return 2;
	}
	cfg.mountpoint = mp;
	cfg.fuse_opts = extra[0] ? extra : NULL;
	if (token_file && !(token = cli_token_load(token_file, &err)))
		return cli_fail(&err);
	if (!cfg.server && !(cl = cli_cluster_load(cluster_path, &err))) {
		free(token);
		return cli_fail(&err);
	}
	cfg.cluster = cl;
	cfg.token = token;
	warn_unreachable(cl, cfg.server, token);
	fflush(stdout);
	fflush(stderr);
	rc = dgfs_run(&cfg, &err) == 0 ? 0 : cli_fail(&err);
	dg_cluster_free(cl);
	free(token);
	return rc;
}
