/* The cluster spec (dg/cluster.h): TensorFlow's {"job": ["host:port", ...]}
 * JSON (and its sparse {"job": {"1": "host:port"}} form), TF_CONFIG, task
 * lookup and host:port splitting. Parsed with jansson, which keeps object
 * keys in document order (since 2.8), so jobs come out in file order. The
 * CLI and the servers read every cluster through here; the rule for which ps
 * task gets a new variable lives here too. */
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dg/buf.h"
#include "dg/cluster.h"

#define CLUSTER_FILE_MAX ((size_t)16 << 20)   /* bytes: a spec is a few lines */
#define HOST_MAX 253                          /* bytes: the longest DNS name */
#define JOB_NAME_MAX 64                       /* bytes */
#define TASK_INDEX_MAX 1000000                /* sparse indices beyond are typos */

static bool job_char(char ch)
{
	return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
	       ch == '_' || ch == '-';
}

static bool host_char(char ch)
{
	return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '-' || ch == '_';
}

/* The inside of "[...]": hex digits, ':' and '.' (IPv4-mapped), at least one
 * ':', optionally "%zone" (an interface name) at the end. */
static bool ipv6_ok(const char *h, size_t n)
{
	bool colon = false;
	size_t i;

	for (i = 0; i < n && h[i] != '%'; i++) {
		if (h[i] == ':')
			colon = true;
		else if (!isxdigit((unsigned char)h[i]) && h[i] != '.')
			return false;
	}
	if (i < n) {            /* zone: at least one interface-name character */
		if (i + 1 == n)
			return false;
		for (i++; i < n; i++)
			if (!host_char(h[i]))
				return false;
	}
	return colon;
}

/* Decimal port 0..65535: digits only (no sign, no spaces), at most 5 of them. */
static bool parse_port(const char *s, int *port)
{
	size_t n = strlen(s);
	long v = 0;

	if (n < 1 || n > 5)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	if (v > 65535)
		return false;
	*port = (int)v;
	return true;
}

enum dg_status dg_split_host_port(const char *address, char *host, size_t host_len, int *port,
				  struct dg_err *err)
{
	const char *h, *colon;
	size_t n;

	if (!address || !*address)
		return dg_err_set(err, DG_EINVAL, "empty address; expected \"host:port\"");
	if (strstr(address, "://")) {
		dg_err_set(err, DG_EINVAL, "address '%.200s' has a URL scheme; expected "
			   "\"host:port\"", address);
		dg_err_hint(err, "drop the scheme, e.g. localhost:2222 instead of "
			    "grpc://localhost:2222");
		return DG_EINVAL;
	}
	if (address[0] == '[') {
		const char *close = strchr(address, ']');
		if (!close || close[1] != ':') {
			dg_err_set(err, DG_EINVAL, "address '%.200s' is not \"[ipv6]:port\"",
				   address);
			dg_err_hint(err, "write IPv6 addresses in brackets with a port, e.g. "
				    "[::1]:2222");
			return DG_EINVAL;
		}
		h = address + 1;
		n = (size_t)(close - h);
		colon = close + 1;
		if (!ipv6_ok(h, n)) {
			dg_err_set(err, DG_EINVAL, "address '%.200s': '%.*s' is not an IPv6 "
				   "address", address, (int)(n > 100 ? 100 : n), h);
			return DG_EINVAL;
		}
	} else {
		colon = strrchr(address, ':');
		if (!colon) {
			dg_err_set(err, DG_EINVAL, "address '%.200s' has no port; expected "
				   "\"host:port\"", address);
			dg_err_hint(err, "e.g. localhost:2222 (port 0 picks a free port)");
			return DG_EINVAL;
		}
		h = address;
		n = (size_t)(colon - h);
		if (memchr(h, ':', n)) {
			dg_err_set(err, DG_EINVAL, "address '%.200s' has more than one ':'",
				   address);
			dg_err_hint(err, "write IPv6 addresses in brackets, e.g. [::1]:2222");
			return DG_EINVAL;
		}
		for (size_t i = 0; i < n; i++) {
			if (!host_char(h[i])) {
				dg_err_set(err, DG_EINVAL, "address '%.200s': host has the "
					   "character '%c' (0x%02x)", address,
					   isprint((unsigned char)h[i]) ? h[i] : '?',
					   (unsigned char)h[i]);
				dg_err_hint(err, "hosts are names or addresses of [A-Za-z0-9._-]");
				return DG_EINVAL;
			}
		}
	}
	if (n == 0)
		return dg_err_set(err, DG_EINVAL, "address '%.200s' has an empty host", address);
	if (n > HOST_MAX)
		return dg_err_set(err, DG_EINVAL, "address '%.60s...': host is %zu bytes; "
				  "at most %d", address, n, HOST_MAX);
	if (n >= host_len)
		return dg_err_set(err, DG_ETOOLARGE, "address '%.200s': host of %zu bytes does not "
				  "fit a buffer of %zu", address, n, host_len);
	if (!parse_port(colon + 1, port)) {
		dg_err_set(err, DG_EINVAL, "address '%.200s': port '%.20s' is not a number from 0 "
			   "to 65535", address, colon + 1);
		return DG_EINVAL;
	}
	memcpy(host, h, n);
	host[n] = '\0';
	return DG_OK;
}

void dg_cluster_free(struct dg_cluster *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->n_tasks; i++) {
		free(c->tasks[i].job);
		free(c->tasks[i].address);
	}
	free(c->tasks);
	free(c);
}

/* Append one task (the cluster owns the copies). */
static enum dg_status add_task(struct dg_cluster *c, int *cap, const char *job, int index,
			       const char *address, struct dg_err *err)
{
	struct dg_task_addr *t;

	if (c->n_tasks == *cap) {
		int ncap = *cap ? *cap * 2 : 8;
		struct dg_task_addr *nt = realloc(c->tasks, (size_t)ncap * sizeof *nt);
		if (!nt)
			return dg_err_set(err, DG_ENOMEM, "out of memory reading the cluster spec");
		c->tasks = nt;
		*cap = ncap;
	}
	t = &c->tasks[c->n_tasks];
	t->job = strdup(job);
	t->address = strdup(address);
	t->index = index;
	if (!t->job || !t->address) {
		free(t->job);
		free(t->address);
		return dg_err_set(err, DG_ENOMEM, "out of memory reading the cluster spec");
	}
	c->n_tasks++;
	return DG_OK;
}

/* One task's address: a valid "host:port" string, not used by an earlier
 * task (port 0 means "any free port", so several tasks may say host:0). */
static enum dg_status check_address(const struct dg_cluster *c, const char *job, int index,
				    const json_t *v, struct dg_err *err)
{
	char host[HOST_MAX + 1];
	int port;
	const char *a;

	if (!json_is_string(v)) {
		dg_err_set(err, DG_EINVAL, "cluster spec: job '%s' task %d: the address must be a "
			   "\"host:port\" string", job, index);
		return DG_EINVAL;
	}
	a = json_string_value(v);
	if (dg_split_host_port(a, host, sizeof host, &port, err) != DG_OK) {
		dg_err_prefix(err, "cluster spec: job '%s' task %d", job, index);
		return DG_EINVAL;
	}
	for (int i = 0; port != 0 && i < c->n_tasks; i++) {
		if (strcasecmp(c->tasks[i].address, a) == 0) {
			dg_err_set(err, DG_EINVAL, "cluster spec: job '%s' task %d has the address "
				   "%s of job '%s' task %d", job, index, a, c->tasks[i].job,
				   c->tasks[i].index);
			dg_err_hint(err, "give every task its own port (or port 0 for a free one)");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

/* A sparse index key: a decimal number without sign or leading zeros (so "1"
 * and "01" cannot both name task 1). -1 when it is not one. */
static int parse_index(const char *s)
{
	long v = 0;
	size_t n = strlen(s);

	if (n == 0 || n > 7 || (n > 1 && s[0] == '0'))
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v > TASK_INDEX_MAX ? -1 : (int)v;
}

/* The sparse form {"1": "host:port", "0": ...}: tasks are added in index
 * order whatever the key order of the document. */
static enum dg_status add_sparse_job(struct dg_cluster *c, int *cap, const char *job,
				     json_t *tasks, struct dg_err *err)
{
	size_t n = json_object_size(tasks), k = 0;
	struct { int index; json_t *v; } *order = calloc(n ? n : 1, sizeof *order);
	enum dg_status st = DG_OK;
	const char *key;
	json_t *v;

	if (!order)
		return dg_err_set(err, DG_ENOMEM, "out of memory reading the cluster spec");
	json_object_foreach(tasks, key, v) {
		int idx = parse_index(key);
		if (idx < 0) {
			st = dg_err_set(err, DG_EINVAL, "cluster spec: job '%s': task index "
					"'%.40s' is not a number from 0 to %d", job, key,
					TASK_INDEX_MAX);
			dg_err_hint(err, "the sparse form maps task indices to addresses, e.g. "
				    "{\"worker\": {\"1\": \"host:2223\"}}");
			goto out;
		}
		/* Insertion sort: specs have a handful of tasks per job. */
		size_t j = k++;
		while (j > 0 && order[j - 1].index > idx) {
			order[j] = order[j - 1];
			j--;
		}
		order[j].index = idx;
		order[j].v = v;
	}
	for (size_t i = 0; i < k; i++) {
		if ((st = check_address(c, job, order[i].index, order[i].v, err)) != DG_OK ||
		    (st = add_task(c, cap, job, order[i].index, json_string_value(order[i].v),
				   err)) != DG_OK)
			goto out;
	}
out:
	free(order);
	return st;
}

static enum dg_status add_job(struct dg_cluster *c, int *cap, const char *job, json_t *tasks,
			      struct dg_err *err)
{
	size_t len = strlen(job), i;
	enum dg_status st;
	json_t *v;

	if (len == 0 || len > JOB_NAME_MAX) {
		return dg_err_set(err, DG_EINVAL, "cluster spec: job name '%.80s' must be 1 to %d "
				  "characters", job, JOB_NAME_MAX);
	}
	for (i = 0; i < len; i++) {
		if (!job_char(job[i])) {
			char ch = isprint((unsigned char)job[i]) ? job[i] : '?';
			dg_err_set(err, DG_EINVAL, "cluster spec: job name '%.80s' has the "
				   "character '%c' (0x%02x)", job, ch, (unsigned char)job[i]);
			dg_err_hint(err, "job names are [A-Za-z0-9_-]+, e.g. ps, worker, chief");
			return DG_EINVAL;
		}
	}
	if ((json_is_array(tasks) && json_array_size(tasks) == 0) ||
	    (json_is_object(tasks) && json_object_size(tasks) == 0)) {
		dg_err_set(err, DG_EINVAL, "cluster spec: job '%s' has no tasks", job);
		dg_err_hint(err, "list at least one \"host:port\", or leave the job out");
		return DG_EINVAL;
	}
	if (json_is_object(tasks))
		return add_sparse_job(c, cap, job, tasks, err);
	if (!json_is_array(tasks)) {
		dg_err_set(err, DG_EINVAL, "cluster spec: job '%s' must map to a list of "
			   "\"host:port\" strings (or an {\"index\": \"host:port\"} object)", job);
		return DG_EINVAL;
	}
	json_array_foreach(tasks, i, v) {
		if ((st = check_address(c, job, (int)i, v, err)) != DG_OK ||
		    (st = add_task(c, cap, job, (int)i, json_string_value(v), err)) != DG_OK)
			return st;
	}
	return DG_OK;
}

/* The cluster of an already decoded spec object (borrowed). */
static struct dg_cluster *cluster_from_json(json_t *spec, struct dg_err *err)
{
	struct dg_cluster *c;
	const char *job;
	json_t *tasks;
	int cap = 0;

	if (!json_is_object(spec)) {
		dg_err_set(err, DG_EINVAL, "cluster spec must be a JSON object from job name to "
			   "addresses");
		dg_err_hint(err, "e.g. {\"ps\": [\"localhost:2222\"], \"worker\": "
			    "[\"localhost:2223\"]}");
		return NULL;
	}
	if (json_object_size(spec) == 0) {
		dg_err_set(err, DG_EINVAL, "cluster spec has no jobs");
		dg_err_hint(err, "e.g. {\"ps\": [\"localhost:2222\"], \"worker\": "
			    "[\"localhost:2223\"]}");
		return NULL;
	}
	c = calloc(1, sizeof *c);
	if (!c) {
		dg_err_set(err, DG_ENOMEM, "out of memory reading the cluster spec");
		return NULL;
	}
	/* jansson iterates an object in document order: jobs stay in file order. */
	json_object_foreach(spec, job, tasks) {
		if (add_job(c, &cap, job, tasks, err) != DG_OK) {
			dg_cluster_free(c);
			return NULL;
		}
	}
	return c;
}

/* Decode JSON text; duplicate keys (two jobs of one name) are errors. Any
 * value decodes, so that a string or array at the top gets the message that
 * says what the top must be rather than a parser's. */
static json_t *decode(const char *what, const char *text, size_t len, struct dg_err *err)
{
	json_error_t jerr;
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
			       &jerr);

	if (!j)
		dg_err_set(err, DG_EINVAL, "%s is not valid JSON: line %d column %d: %s", what,
			   jerr.line, jerr.column, jerr.text);
	return j;
}

struct dg_cluster *dg_cluster_parse(const char *text, size_t len, struct dg_err *err)
{
	json_t *j = decode("cluster spec", text, len, err);
	struct dg_cluster *c;

	if (!j)
		return NULL;
	c = cluster_from_json(j, err);
	json_decref(j);
	return c;
}

struct dg_cluster *dg_cluster_load(const char *path, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	struct dg_cluster *c;

	if (dg_buf_read_file(&b, path, CLUSTER_FILE_MAX, err) != DG_OK) {
		dg_err_hint(err, "pass the cluster spec with --cluster FILE, a JSON object like "
			    "{\"ps\": [\"localhost:2222\"]}");
		return NULL;
	}
	c = dg_cluster_parse(b.data ? b.data : "", b.len, err);
	if (!c)
		dg_err_prefix(err, "%s", path);
	dg_buf_deinit(&b);
	return c;
}

/* TF_CONFIG's "task": {"type": JOB, "index": I} naming a task of c. */
static enum dg_status parse_task(const struct dg_cluster *c, json_t *task, char **job,
				 int *index, struct dg_err *err)
{
	const char *key, *type;
	json_t *v, *jt, *ji;
	json_int_t idx = 0;

	if (!json_is_object(task))
		return dg_err_set(err, DG_EINVAL, "TF_CONFIG: \"task\" must be an object like "
				  "{\"type\": \"worker\", \"index\": 0}");
	json_object_foreach(task, key, v) {
		/* "trial" is set by TensorFlow's tuner: tolerated, unused. */
		if (strcmp(key, "type") && strcmp(key, "index") && strcmp(key, "trial")) {
			dg_err_set(err, DG_EINVAL, "TF_CONFIG: unknown key '%.64s' in \"task\"",
				   key);
			dg_err_hint(err, "a task is {\"type\": \"worker\", \"index\": 0}");
			return DG_EINVAL;
		}
	}
	jt = json_object_get(task, "type");
	ji = json_object_get(task, "index");
	if (!json_is_string(jt))
		return dg_err_set(err, DG_EINVAL, "TF_CONFIG: \"task\" needs a \"type\" string "
				  "naming its job");
	type = json_string_value(jt);
	/* TensorFlow reads a missing index as 0. */
	if (ji && (!json_is_integer(ji) || (idx = json_integer_value(ji)) < 0 || idx > INT_MAX))
		return dg_err_set(err, DG_EINVAL, "TF_CONFIG: task \"index\" of job '%.64s' "
				  "must be an integer >= 0", type);
	if (!dg_cluster_task(c, type, (int)idx, err)) {
		dg_err_prefix(err, "TF_CONFIG");
		return DG_ENOTFOUND;
	}
	*job = strdup(type);
	if (!*job)
		return dg_err_set(err, DG_ENOMEM, "out of memory reading TF_CONFIG");
	*index = (int)idx;
	return DG_OK;
}

struct dg_cluster *dg_cluster_from_tf_config(const char *text, char **job, int *index,
					     struct dg_err *err)
{
	json_t *j, *task;
	struct dg_cluster *c = NULL;
	const char *key;
	json_t *v;

	*job = NULL;
	*index = -1;
	j = decode("TF_CONFIG", text, strlen(text), err);
	if (!j)
		return NULL;
	if (!json_is_object(j)) {
		dg_err_set(err, DG_EINVAL, "TF_CONFIG must be a JSON object with \"cluster\" and "
			   "\"task\"");
		goto out;
	}
	json_object_foreach(j, key, v) {
		if (strcmp(key, "cluster") && strcmp(key, "task") && strcmp(key, "environment") &&
		    strcmp(key, "rpc_layer")) {
			dg_err_set(err, DG_EINVAL, "TF_CONFIG: unknown key '%.64s'", key);
			dg_err_hint(err, "TF_CONFIG has \"cluster\", \"task\" and optionally "
				    "\"environment\" and \"rpc_layer\"");
			goto out;
		}
	}
	if (!json_object_get(j, "cluster")) {
		dg_err_set(err, DG_EINVAL, "TF_CONFIG has no \"cluster\"");
		dg_err_hint(err, "e.g. {\"cluster\": {\"worker\": [\"host:2223\"]}, \"task\": "
			    "{\"type\": \"worker\", \"index\": 0}}");
		goto out;
	}
	c = cluster_from_json(json_object_get(j, "cluster"), err);
	if (!c) {
		dg_err_prefix(err, "TF_CONFIG");
		goto out;
	}
	task = json_object_get(j, "task");
	if (task && parse_task(c, task, job, index, err) != DG_OK) {
		dg_cluster_free(c);
		c = NULL;
	}
out:
	json_decref(j);
	return c;
}

const struct dg_task_addr *dg_cluster_task(const struct dg_cluster *c, const char *job,
					   int index, struct dg_err *err)
{
	char jobs[200];
	size_t off = 0;

	for (int i = 0; i < c->n_tasks; i++)
		if (c->tasks[i].index == index && strcmp(c->tasks[i].job, job) == 0)
			return &c->tasks[i];
	/* List the jobs with their task counts: "ps (1 task), worker (2 tasks)". */
	jobs[0] = '\0';
	for (int i = 0; i < c->n_tasks && off < sizeof jobs; i++) {
		if (i > 0 && strcmp(c->tasks[i - 1].job, c->tasks[i].job) == 0)
			continue;
		int n = dg_cluster_job_size(c, c->tasks[i].job);
		int w = snprintf(jobs + off, sizeof jobs - off, "%s%s (%d task%s)", off ? ", " : "",
				 c->tasks[i].job, n, n == 1 ? "" : "s");
		off += w > 0 ? (size_t)w : 0;
	}
	dg_err_set(err, DG_ENOTFOUND, "task /job:%.64s/task:%d is not in the cluster; jobs: %s",
		   job, index, c->n_tasks ? jobs : "none");
	dg_err_hint(err, "pick a job and task index from the cluster spec");
	return NULL;
}

enum dg_status dg_cluster_set_address(struct dg_cluster *c, const char *job, int index,
				      const char *address, struct dg_err *err)
{
	char *a;

	if (!dg_cluster_task(c, job, index, err))
		return err ? err->code : DG_ENOTFOUND;
	if (!(a = strdup(address)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < c->n_tasks; i++)
		if (c->tasks[i].index == index && strcmp(c->tasks[i].job, job) == 0) {
			free(c->tasks[i].address);
			c->tasks[i].address = a;
		}
	return DG_OK;
}

int dg_cluster_job_size(const struct dg_cluster *c, const char *job)
{
	int n = 0;

	for (int i = 0; i < c->n_tasks; i++)
		n += strcmp(c->tasks[i].job, job) == 0;
	return n;
}

int dg_cluster_pick_fewest_bytes(const int64_t *bytes, const bool *allowed, int n)
{
	int best = -1;

	for (int i = 0; i < n; i++)
		if ((!allowed || allowed[i]) && (best < 0 || bytes[i] < bytes[best]))
			best = i;
	return best;
}
