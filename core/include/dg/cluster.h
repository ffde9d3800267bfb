/* The cluster spec: TensorFlow's {"job": ["host:port", ...]} JSON, or the
 * TF_CONFIG environment variable ({"cluster": {...}, "task": {"type", "index"}}),
 * and task addressing. Every client command and server reads it through here. */
#ifndef DG_CLUSTER_H
#define DG_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "dg/status.h"

struct dg_task_addr {
	char *job;        /* owned */
	int index;
	char *address;    /* owned, "host:port" */
};

struct dg_cluster {
	int n_tasks;
	struct dg_task_addr *tasks;   /* owned; grouped by job in file order, then index */
};

/* Parse a cluster spec document (JSON text). Jobs map to arrays of
 * "host:port" strings (TensorFlow also allows {"0": "host:port"} objects for
 * sparse indices; accepted). Errors name the job and entry. */
struct dg_cluster *dg_cluster_parse(const char *text, size_t len, struct dg_err *err);
/* Read a file (errors name the path). */
struct dg_cluster *dg_cluster_load(const char *path, struct dg_err *err);
/* Parse TF_CONFIG's text; *job and *index get the "task" (owned *job, free()),
 * or NULL/-1 when TF_CONFIG has no task. */
struct dg_cluster *dg_cluster_from_tf_config(const char *text, char **job, int *index,
					     struct dg_err *err);
void dg_cluster_free(struct dg_cluster *c);

/* The task job/index, or NULL (DG_ENOTFOUND naming the task and the jobs that
 * exist). Borrowed from c. */
const struct dg_task_addr *dg_cluster_task(const struct dg_cluster *c, const char *job,
					   int index, struct dg_err *err);
/* Replace task job/index's address (a spec's port 0, once the server bound
 * one): DG_ENOTFOUND as dg_cluster_task, DG_ENOMEM. */
enum dg_status dg_cluster_set_address(struct dg_cluster *c, const char *job, int index,
				      const char *address, struct dg_err *err);
/* Number of tasks of a job (0 if absent). */
int dg_cluster_job_size(const struct dg_cluster *c, const char *job);

/* Where a new variable goes, the one rule `dg var create`, the mount's create
 * and the master's placement of a Variable without a device share: the task
 * holding the fewest bytes, ties going to the first. bytes[i] is what task i
 * holds (its health's "bytes"); allowed may be NULL (every task may take it).
 * Returns an index < n, or -1 when no task is allowed. Pure; thread-safe. */
int dg_cluster_pick_fewest_bytes(const int64_t *bytes, const bool *allowed, int n);

/* Split "host:port" (IPv6 as "[::1]:port"); host is written to buf. */
enum dg_status dg_split_host_port(const char *address, char *host, size_t host_len, int *port,
				  struct dg_err *err);

#endif
