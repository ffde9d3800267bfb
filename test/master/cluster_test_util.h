/* In-process clusters for the job suites (test_master.c, test_model.c): one
 * server per task (worker, master and ps routes in one, as dg server) on
 * loopback ports, and the requests the tests make of them. Static state:
 * one cluster per suite at a time (Criterion runs each test in its own
 * process). */
#ifndef DG_CLUSTER_TEST_UTIL_H
#define DG_CLUSTER_TEST_UTIL_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/cluster.h"
#include "dg/codec.h"
#include "dg/http.h"
#include "dg/master.h"
#include "server.h"
#include "master_test_util.h"

#define TC_MAX 4

static struct dg_cluster *jc;
static struct worker *wk[TC_MAX];
static struct master *ms[TC_MAX];
static struct ps_server *srv[TC_MAX];
static int n_srv;
static struct dg_http_client *cli;

/* Start a server (worker, master and ps in one, as dg server) for every task
 * of the cluster spec text (written with ') but those of job "down" (never
 * started: a task that is lost), at most TC_MAX; cli talks to the first
 * started one. Ports are known only once bound: the spec is completed
 * afterwards (the master reads addresses at submit time). */
static inline void cluster_start(const char *spec)
{
	struct dg_err err = { 0 };
	char addr[64], first[64] = "";

	jc = cl(spec);
	n_srv = 0;
	for (int t = 0; t < jc->n_tasks; t++) {
		const char *job = jc->tasks[t].job;
		int i = n_srv, index = jc->tasks[t].index;
		if (strcmp(job, "down") == 0)
			continue;
		cr_assert_lt(i, TC_MAX);
		struct worker_config wc = { .cluster = jc, .job = job, .task = index };
		struct master_config mc = { .cluster = jc, .job = job, .task = index };
		wk[i] = worker_new(&wc, &err);
		cr_assert_not_null(wk[i], "worker_new: %s", err.msg);
		ms[i] = master_new(&mc, wk[i], &err);
		cr_assert_not_null(ms[i], "master_new: %s", err.msg);
		struct dg_route_group groups[2] = { *worker_route_group(wk[i]),
						    *master_route_group(ms[i]) };
		struct ps_server_config cfg = { .job = job, .task = index, .port = 0,
						.extra_groups = groups, .n_extra_groups = 2 };
		srv[i] = ps_server_start(&cfg, &err);
		cr_assert_not_null(srv[i], "ps_server_start: %s", err.msg);
		snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_server_port(srv[i]));
		free(jc->tasks[t].address);
		jc->tasks[t].address = strdup(addr);
		worker_set_address(wk[i], addr);
		if (n_srv++ == 0)
			snprintf(first, sizeof first, "%s", addr);
	}
	cr_assert_gt(n_srv, 0);
	cli = dg_http_client_new(first, NULL, 60000, &err);
	cr_assert_not_null(cli, "%s", err.msg);
}

static inline void cluster_stop(void)
{
	dg_http_client_free(cli);
	for (int i = 0; i < n_srv; i++) {
		master_cancel_all(ms[i]);
		worker_stop(wk[i]);
		ps_server_stop(srv[i]);
		master_free(ms[i]);
		worker_free(wk[i]);
	}
	n_srv = 0;
	dg_cluster_free(jc);
}

/* One request; the reply body parsed as JSON when it is JSON. */
static inline enum dg_status req(const char *method, const char *path, const char *body,
			  const struct dg_http_header *h, int nh, struct dg_http_result *res,
			  struct dg_err *err)
{
	char *json = body ? dq(body) : NULL;
	enum dg_status st;

	dg_http_result_init(res);
	st = dg_http_request(cli, method, path, h, nh, json, json ? strlen(json) : 0, res, err);
	free(json);
	return st;
}

static inline json_t *body_json(const struct dg_http_result *res)
{
	json_t *j = json_loadb(res->body.data ? res->body.data : "", res->body.len, 0, NULL);

	cr_assert_not_null(j, "not JSON: %.*s", (int)res->body.len, res->body.data);
	return j;
}

/* Submit body; returns the job id (static buffer) after waiting for the end. */
static inline const char *run_job(const char *body, json_t **status)
{
	static char id[32];
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char path[128];
	int64_t from = 0;
	bool over = false;

	cr_assert_eq(req("POST", "/v1/jobs", body, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 201);
	json_t *j = body_json(&res);
	snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
	json_decref(j);
	dg_http_result_deinit(&res);
	for (int i = 0; i < 100 && !over; i++) {
		snprintf(path, sizeof path, "/v1/jobs/%s/events?from=%lld&timeout_ms=5000", id,
			 (long long)from);
		cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
		from = res.dg_count;
		over = strstr(res.body.data ? res.body.data : "", "\"event\":\"done\"") ||
		       strstr(res.body.data ? res.body.data : "", "\"event\":\"failed\"") ||
		       strstr(res.body.data ? res.body.data : "", "\"event\":\"canceled\"");
		dg_http_result_deinit(&res);
	}
	cr_assert(over, "job %s did not finish", id);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	*status = body_json(&res);
	dg_http_result_deinit(&res);
	return id;
}

static inline double result_value(const char *id, const char *name)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	struct dg_http_header acc = { "Accept", "application/x-npy" };
	char path[128];

	snprintf(path, sizeof path, "/v1/jobs/%s/results/%s", id, name);
	cr_assert_eq(req("GET", path, NULL, &acc, 1, &res, &err), DG_OK, "%s", err.msg);
	struct dg_tensor *t = dg_npy_decode(res.body.data, res.body.len, &err);
	cr_assert_not_null(t, "%s", err.msg);
	double v = dg_tensor_get_f64(t, 0);
	dg_tensor_free(t);
	dg_http_result_deinit(&res);
	return v;
}

#endif
