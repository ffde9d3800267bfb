/* The worker face end to end: two in-process servers (ps_server_start with
 * the worker route group, on free loopback ports) run the two fragments of
 * the seed program with a Send/Recv pair between them; variable ops against
 * a ps; errors naming task and node; aborts; malformed and hostile fragments
 * answered 4xx; concurrent steps kept apart. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/executor.h"
#include "dg/http.h"
#include "server.h"

#define N_TASKS 2

static struct worker *wk[N_TASKS];
static struct ps_server *srv[N_TASKS];
static char addr[N_TASKS][64];

static void setup(void)
{
	for (int i = 0; i < N_TASKS; i++) {
		struct worker_config wc = { .job = "worker", .task = i };
		struct dg_err err = { 0 };
		wk[i] = worker_new(&wc, &err);
		cr_assert_not_null(wk[i], "%s", err.msg);
		struct ps_server_config cfg = { .job = "worker", .task = i,
						.extra_groups = worker_route_group(wk[i]),
						.n_extra_groups = 1,
						.extra_metrics = worker_metrics,
						.extra_metrics_ud = wk[i] };
		srv[i] = ps_server_start(&cfg, &err);
		cr_assert_not_null(srv[i], "%s", err.msg);
		snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", ps_server_port(srv[i]));
		worker_set_address(wk[i], addr[i]);
	}
}

static void teardown(void)
{
	for (int i = 0; i < N_TASKS; i++) {
		worker_stop(wk[i]);
		ps_server_stop(srv[i]);
		worker_free(wk[i]);
	}
}

TestSuite(executor, .init = setup, .fini = teardown, .timeout = 120);

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One request to task i; *res is the caller's (deinit it). */
static enum dg_status req(int i, const char *method, const char *path, const char *body,
			  struct dg_http_result *res, struct dg_err *err)
{
	struct dg_http_client *c = dg_http_client_new(addr[i], NULL, 60000, err);
	enum dg_status st;

	cr_assert_not_null(c, "%s", err->msg);
	dg_http_result_init(res);
	st = dg_http_request(c, method, path, NULL, 0, body, body ? strlen(body) : 0, res, err);
	dg_http_client_free(c);
	return st;
}

/* POST a fragment to task i; returns its id (static buffer per call site). */
static void add_fragment(int i, const char *json, char *id, size_t n)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(req(i, "POST", "/v1/fragments", json, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 201);
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	cr_assert_not_null(j);
	snprintf(id, n, "%s", json_string_value(json_object_get(j, "id")));
	cr_assert_eq(id[0], 'f');
	json_decref(j);
	dg_http_result_deinit(&res);
}

/* The status of POSTing a fragment that must be refused; err gets the text. */
static int refused_status(const char *json, struct dg_err *err)
{
	struct dg_http_result res;
	enum dg_status st = req(0, "POST", "/v1/fragments", json, &res, err);
	int status = res.status;

	cr_assert_neq(st, DG_OK, "fragment was accepted: %.200s", json);
	dg_http_result_deinit(&res);
	return status;
}

struct http_run {
	int task;
	char id[24];
	uint64_t step;
	int64_t timeout_ms;
	enum dg_status st;
	struct dg_err err;
	int nodes_run;
	double took;
};

static void *run_over_http(void *arg)
{
	struct http_run *r = arg;
	struct dg_http_result res;
	char path[96], body[96];
	double t0 = now_s();

	snprintf(path, sizeof path, "/v1/fragments/%s/run", r->id);
	snprintf(body, sizeof body, "{\"step\": %" PRIu64 ", \"timeout_ms\": %" PRId64 "}",
		 r->step, r->timeout_ms);
	r->st = req(r->task, "POST", path, body, &res, &r->err);
	if (r->st == DG_OK) {
		json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
		r->nodes_run = (int)json_integer_value(json_object_get(j, "nodes_run"));
		if ((uint64_t)json_integer_value(json_object_get(j, "step")) != r->step)
			r->nodes_run = -1;
		json_decref(j);
	}
	dg_http_result_deinit(&res);
	r->took = now_s() - t0;
	return NULL;
}

/* Task 0: x, y1 = x + 300, y = y1 + y2 (y2 from task 1); y goes to task 0's
 * own rendezvous ("y:0", in-process) and to task 1's ("y:0/copy", over HTTP). */
static void seed_fragments(char *a, size_t na, char *b, size_t nb)
{
	snprintf(a, na, "{\"nodes\": ["
		 "{\"name\": \"x\", \"op\": \"Const\", \"attrs\": {\"value\": 2}},"
		 "{\"name\": \"c300\", \"op\": \"Const\", \"attrs\": {\"value\": 300}},"
		 "{\"name\": \"y1\", \"op\": \"Add\", \"inputs\": [\"x\", \"c300\"]},"
		 "{\"name\": \"sx\", \"op\": \"_Send\", \"inputs\": [\"x\"],"
		 " \"attrs\": {\"key\": \"x:0->worker/1\", \"to\": \"%s\"}},"
		 "{\"name\": \"ry2\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"y2:0->worker/0\","
		 " \"dtype\": \"int32\", \"shape\": []}},"
		 "{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"y1\", \"ry2\"]},"
		 "{\"name\": \"out\", \"op\": \"_Send\", \"inputs\": [\"y\"],"
		 " \"attrs\": {\"key\": \"y:0\", \"to\": \"%s\"}},"
		 "{\"name\": \"copy\", \"op\": \"_Send\", \"inputs\": [\"y\"],"
		 " \"attrs\": {\"key\": \"y:0/copy\", \"to\": \"%s\"}}]}",
		 addr[1], addr[0], addr[1]);
	/* Task 1: y2 = x - 66. */
	snprintf(b, nb, "{\"nodes\": ["
		 "{\"name\": \"rx\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"x:0->worker/1\","
		 " \"dtype\": \"int32\"}},"
		 "{\"name\": \"c66\", \"op\": \"Const\", \"attrs\": {\"value\": 66}},"
		 "{\"name\": \"y2\", \"op\": \"Sub\", \"inputs\": [\"rx\", \"c66\"]},"
		 "{\"name\": \"sy2\", \"op\": \"_Send\", \"inputs\": [\"y2\"],"
		 " \"attrs\": {\"key\": \"y2:0->worker/0\", \"to\": \"%s\"}}]}", addr[0]);
}

Test(executor, seed_program_on_two_tasks_gives_238)
{
	char a[2048], b[1024], id_a[24];
	struct http_run rb = { .task = 1, .timeout_ms = 20000 };
	struct dg_err err = { 0 };
	struct dg_tensor *y = NULL;
	struct dg_http_result res;
	pthread_t th;
	int n = 0;

	seed_fragments(a, sizeof a, b, sizeof b);
	add_fragment(0, a, id_a, sizeof id_a);
	add_fragment(1, b, rb.id, sizeof rb.id);
	for (uint64_t step = 17; step < 20; step++) {      /* the fragments are reusable */
		rb.step = step;
		pthread_create(&th, NULL, run_over_http, &rb);
		enum dg_status st = worker_run_fragment(wk[0], id_a, step, 20000, &n, &err);
		pthread_join(th, NULL);
		cr_assert_eq(st, DG_OK, "%s", err.msg);
		cr_assert_eq(n, 8);
		cr_assert_eq(rb.st, DG_OK, "%s", rb.err.msg);
		cr_assert_eq(rb.nodes_run, 4);
		cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), step, "y:0", 0, &y, &err),
			     DG_OK, "%s", err.msg);
		cr_assert_eq(y->dtype, DG_I32);
		cr_assert_eq(y->shape.ndim, 0);
		cr_assert_eq(*(int32_t *)y->data, 238);
		dg_tensor_free(y);
		/* The copy waits on task 1; GET takes it (raw + tensor headers). */
		char path[96];
		snprintf(path, sizeof path,
			 "/v1/steps/%" PRIu64 "/tensors/y:0/copy?timeout_ms=1000", step);
		cr_assert_eq(req(1, "GET", path, NULL, &res, &err), DG_OK, "%s", err.msg);
		cr_assert_str_eq(res.dg_dtype, "int32");
		cr_assert_str_eq(res.dg_shape, "[]");
		cr_assert_eq(res.body.len, 4);
		cr_assert_eq(*(int32_t *)res.body.data, 238);
		dg_http_result_deinit(&res);
		/* Taken: a second GET times out, naming key and step. */
		cr_assert_eq(req(1, "GET", path, NULL, &res, &err), DG_ETIMEOUT);
		cr_assert(strstr(err.msg, "y:0/copy") && strstr(err.msg, "step"), "%s", err.msg);
		dg_http_result_deinit(&res);
	}
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[1])), 0);
	/* Each task's metrics show its half: 3 steps, task 1 got x and the copy
	 * over HTTP and sent y2 over HTTP; task 0 delivered y in-process. */
	static const char *const want[][2] = {
		{ "dg_worker_steps_total{result=\"ok\"} 3\n",
		  "dg_worker_steps_total{result=\"ok\"} 3\n" },
		{ "dg_worker_nodes_run_total 24\n", "dg_worker_nodes_run_total 12\n" },
		{ "dg_worker_tensors_sent_total{path=\"local\"} 3\n",
		  "dg_worker_tensors_received_total 6\n" },
		{ "dg_worker_tensors_sent_total{path=\"http\"} 6\n",
		  "dg_worker_tensors_sent_total{path=\"http\"} 3\n" },
		{ "dg_worker_fragments 1\n", "dg_worker_bytes_received_total 24\n" },
	};
	for (int task = 0; task < 2; task++) {
		cr_assert_eq(req(task, "GET", "/v1/metrics", NULL, &res, &err), DG_OK, "%s",
			     err.msg);
		for (size_t k = 0; k < sizeof want / sizeof *want; k++)
			cr_assert(strstr(res.body.data, want[k][task]), "task %d lacks %s", task,
				  want[k][task]);
		dg_http_result_deinit(&res);
	}
}

Test(executor, health_names_both_faces)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(req(1, "GET", "/v1/health", NULL, &res, &err), DG_OK, "%s", err.msg);
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	json_t *f = json_object_get(j, "faces");
	cr_assert_eq(json_array_size(f), 2);
	cr_assert_str_eq(json_string_value(json_array_get(f, 0)), "ps");
	cr_assert_str_eq(json_string_value(json_array_get(f, 1)), "worker");
	json_decref(j);
	dg_http_result_deinit(&res);
}

static struct dg_tensor *read_var(int task, const char *name)
{
	struct dg_err err = { 0 };
	struct dg_client *c = dg_client_new(addr[task], NULL, &err);
	struct dg_tensor *t = NULL;

	cr_assert_not_null(c);
	cr_assert_eq(dg_var_get(c, name, &t, NULL, &err), DG_OK, "%s", err.msg);
	dg_client_free(c);
	return t;
}

Test(executor, var_init_read_apply_against_a_ps)
{
	char f[2048], id[24];
	struct dg_err err = { 0 };
	struct dg_tensor *t;

	/* Task 0 computes; task 1 is the ps. */
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"init\", \"op\": \"VarInit\", \"attrs\": {\"var\": \"model/w\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [2,3], \"init\": \"ones\"}},"
		 "{\"name\": \"u\", \"op\": \"VarInit\", \"attrs\": {\"var\": \"model/u\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [50,50],"
		 " \"init\": \"glorot\","
		 " \"seed\": 7}},"
		 "{\"name\": \"g\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [2,3], \"value\": 0.5}}},"
		 "{\"name\": \"apply\", \"op\": \"VarApply\", \"inputs\": [\"g\"],"
		 " \"attrs\": {\"var\": \"model/w\", \"ps\": \"%s\", \"rule\": \"assign_add\"}},"
		 "{\"name\": \"si\", \"op\": \"_Send\", \"inputs\": [\"init\"],"
		 " \"attrs\": {\"key\": \"inited\", \"to\": \"%s\"}},"
		 "{\"name\": \"sa\", \"op\": \"_Send\", \"inputs\": [\"apply\"],"
		 " \"attrs\": {\"key\": \"applied\", \"to\": \"%s\"}}]}",
		 addr[1], addr[1], addr[1], addr[0], addr[0]);
	add_fragment(0, f, id, sizeof id);
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 1, 10000, &err), DG_OK, "%s", err.msg);
	t = read_var(1, "model/w");
	cr_assert_eq(t->numel, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(dg_tensor_get_f64(t, i), 1.5, 1e-6);
	dg_tensor_free(t);
	t = read_var(1, "model/u");
	double limit = sqrt(6.0 / 100.0), sum = 0;
	for (int i = 0; i < 2500; i++) {
		double v = dg_tensor_get_f64(t, i);
		cr_assert(v >= -limit && v <= limit, "glorot value %g outside +-%g", v, limit);
		sum += v;
	}
	cr_assert_lt(fabs(sum / 2500), 0.05);
	dg_tensor_free(t);
	/* A second run: the existing variable is left alone (init keeps its
	 * version), apply adds another 0.5. */
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 2, 10000, &err), DG_OK, "%s", err.msg);
	t = read_var(1, "model/w");
	cr_assert_float_eq(dg_tensor_get_f64(t, 5), 2.0, 1e-6);
	dg_tensor_free(t);
	struct dg_tensor *i1, *a1, *i2, *a2;
	struct dg_rendezvous *rv = worker_rendezvous(wk[0]);
	struct dg_client *c = dg_client_new(addr[1], NULL, &err);
	struct dg_var_info info;
	cr_assert_eq(dg_rendezvous_take(rv, 1, "inited", 0, &i1, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_take(rv, 1, "applied", 0, &a1, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_take(rv, 2, "inited", 0, &i2, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_take(rv, 2, "applied", 0, &a2, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(a1->dtype, DG_I64);
	cr_assert_eq(a1->shape.ndim, 0);
	int64_t vi1 = *(int64_t *)i1->data, va1 = *(int64_t *)a1->data;
	int64_t vi2 = *(int64_t *)i2->data, va2 = *(int64_t *)a2->data;
	cr_assert(vi1 > 0 && va1 > vi1, "init %lld, apply %lld", (long long)vi1, (long long)va1);
	cr_assert_eq(vi2, va1, "the second init outputs the existing version");
	cr_assert_gt(va2, va1);
	cr_assert_eq(dg_var_stat(c, "model/w", &info, &err), DG_OK, "%s", err.msg);
	cr_assert_eq((int64_t)info.version, va2);
	dg_client_free(c);
	dg_tensor_free(i1);
	dg_tensor_free(a1);
	dg_tensor_free(i2);
	dg_tensor_free(a2);

	/* VarRead on task 1 of the variable on task 1 itself, sent to task 0. */
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"r\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"model/w\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [2,-1]}},"
		 "{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"r\"]},"
		 "{\"name\": \"ss\", \"op\": \"_Send\", \"inputs\": [\"s\"],"
		 " \"attrs\": {\"key\": \"sum\", \"to\": \"%s\"}}]}", addr[1], addr[0]);
	add_fragment(1, f, id, sizeof id);
	cr_assert_eq(worker_run_fragment_local(wk[1], id, 3, 10000, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_take(rv, 3, "sum", 1000, &t, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(t, 0), 12.0, 1e-5);
	dg_tensor_free(t);
}

Test(executor, failing_node_names_task_and_node_and_aborts_the_step)
{
	char f[1024], id[24];
	struct http_run r = { .task = 1, .step = 5, .timeout_ms = 5000 };
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new(DG_F32, &(struct dg_shape){ 1, { 4 } }, NULL);

	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"in\","
		 " \"dtype\": \"float32\", \"shape\": [-1]}},"
		 "{\"name\": \"y1\", \"op\": \"Reshape\", \"inputs\": [\"in\"],"
		 " \"attrs\": {\"shape\": [3]}},"
		 "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"y1\"],"
		 " \"attrs\": {\"key\": \"out\", \"to\": \"%s\"}}]}", addr[0]);
	add_fragment(1, f, r.id, sizeof r.id);
	cr_assert_eq(dg_rendezvous_put(worker_rendezvous(wk[1]), 5, "in", t, &err), DG_OK);
	run_over_http(&r);
	cr_assert_eq(r.st, DG_ESHAPE, "%d: %s", r.st, r.err.msg);
	cr_assert(strncmp(r.err.msg, "task worker/1: node 'y1' (Reshape): ", 36) == 0, "%s",
		  r.err.msg);
	cr_assert(dg_rendezvous_is_aborted(worker_rendezvous(wk[1]), 5));

	/* A worker op's failure: a variable that does not exist. */
	snprintf(f, sizeof f, "{\"nodes\": [{\"name\": \"r\", \"op\": \"VarRead\", \"attrs\": "
		 "{\"var\": \"nope\", \"ps\": \"%s\", \"dtype\": \"float32\"}}]}", addr[1]);
	add_fragment(0, f, id, sizeof id);
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 6, 5000, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "task worker/0: node 'r' (VarRead): ") == err.msg, "%s",
		  err.msg);
	cr_assert(strstr(err.msg, "nope"), "%s", err.msg);

	/* An unreachable peer: the error names the address. */
	snprintf(f, sizeof f, "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
		 "{\"value\": 1}}, {\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"c\"], "
		 "\"attrs\": {\"key\": \"k\", \"to\": \"127.0.0.1:1\"}}]}");
	add_fragment(0, f, id, sizeof id);
	cr_assert_neq(worker_run_fragment_local(wk[0], id, 7, 5000, &err), DG_OK);
	cr_assert(strstr(err.msg, "node 's' (_Send)") && strstr(err.msg, "127.0.0.1:1"), "%s",
		  err.msg);
}

Test(executor, abort_releases_a_recv_waiter_quickly)
{
	char f[512];
	struct http_run r = { .task = 0, .step = 99, .timeout_ms = 60000 };
	struct dg_http_result res;
	struct dg_err err = { 0 };
	pthread_t th;

	snprintf(f, sizeof f, "{\"nodes\": [{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": "
		 "{\"key\": \"never\", \"dtype\": \"float32\"}}]}");
	add_fragment(0, f, r.id, sizeof r.id);
	pthread_create(&th, NULL, run_over_http, &r);
	usleep(200000);
	cr_assert_eq(req(0, "DELETE", "/v1/steps/99?reason=worker%2F1%20died", NULL, &res, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 204);
	dg_http_result_deinit(&res);
	pthread_join(th, NULL);
	cr_assert_eq(r.st, DG_ECANCELED, "%d: %s", r.st, r.err.msg);
	cr_assert(strstr(r.err.msg, "step 99 was aborted: worker/1 died"), "%s", r.err.msg);
	cr_assert(strstr(r.err.msg, "node 'in' (_Recv)"), "%s", r.err.msg);
	cr_assert_lt(r.took, 3.0);
	/* Later puts for the step are refused; the run of an aborted step too. */
	cr_assert_eq(req(0, "PUT", "/v1/steps/99/tensors/never", NULL, &res, &err), DG_ECANCELED);
	dg_http_result_deinit(&res);
	run_over_http(&r);
	cr_assert_eq(r.st, DG_ECANCELED);
}

Test(executor, recv_timeout_is_reported_in_time)
{
	char f[512];
	struct http_run r = { .task = 0, .step = 3, .timeout_ms = 300 };

	snprintf(f, sizeof f, "{\"nodes\": [{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": "
		 "{\"key\": \"late\", \"dtype\": \"float32\"}}]}");
	add_fragment(0, f, r.id, sizeof r.id);
	run_over_http(&r);
	cr_assert_eq(r.st, DG_ETIMEOUT, "%s", r.err.msg);
	cr_assert(strstr(r.err.msg, "'late'") && strstr(r.err.msg, "step 3"), "%s", r.err.msg);
	cr_assert_lt(r.took, 3.0);
	cr_assert_geq(r.took, 0.25);
}

/* 8 steps at once through one fragment on task 1: in -> in * 2 -> task 0. */
Test(executor, concurrent_steps_do_not_mix)
{
	char f[1024];
	struct http_run r[8];
	pthread_t th[8];
	struct dg_err err = { 0 };
	char id[24];

	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"in\","
		 " \"dtype\": \"float64\", \"shape\": [16]}},"
		 "{\"name\": \"two\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float64\", \"shape\": [], \"value\": 2}}},"
		 "{\"name\": \"y\", \"op\": \"Mul\", \"inputs\": [\"in\", \"two\"]},"
		 "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"y\"],"
		 " \"attrs\": {\"key\": \"out\", \"to\": \"%s\"}}]}", addr[0]);
	add_fragment(1, f, id, sizeof id);
	for (int i = 0; i < 8; i++) {
		r[i] = (struct http_run){ .task = 1, .step = 1000 + (uint64_t)i,
					  .timeout_ms = 20000 };
		memcpy(r[i].id, id, sizeof id);
		pthread_create(&th[i], NULL, run_over_http, &r[i]);
	}
	/* Feed them in reverse order, after they started waiting. */
	usleep(100000);
	for (int i = 7; i >= 0; i--) {
		struct dg_tensor *t = dg_tensor_new(DG_F64, &(struct dg_shape){ 1, { 16 } }, NULL);
		for (int k = 0; k < 16; k++)
			dg_tensor_set_f64(t, k, i * 100 + k);
		cr_assert_eq(dg_rendezvous_put(worker_rendezvous(wk[1]), 1000 + (uint64_t)i, "in",
					       t, &err), DG_OK, "%s", err.msg);
	}
	for (int i = 0; i < 8; i++) {
		struct dg_tensor *t = NULL;
		pthread_join(th[i], NULL);
		cr_assert_eq(r[i].st, DG_OK, "%s", r[i].err.msg);
		cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), 1000 + (uint64_t)i, "out",
						1000, &t, &err), DG_OK, "%s", err.msg);
		for (int k = 0; k < 16; k++)
			cr_assert_float_eq(dg_tensor_get_f64(t, k), 2.0 * (i * 100 + k), 1e-9);
		dg_tensor_free(t);
	}
}

Test(executor, delete_fragment_then_run_is_not_found)
{
	char id[24], path[64];
	struct dg_http_result res;
	struct dg_err err = { 0 };

	add_fragment(0, "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
		     "{\"value\": 1}}]}", id, sizeof id);
	snprintf(path, sizeof path, "/v1/fragments/%s", id);
	cr_assert_eq(req(0, "DELETE", path, NULL, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 204);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "DELETE", path, NULL, &res, &err), DG_ENOTFOUND);
	cr_assert_eq(res.status, 404);
	dg_http_result_deinit(&res);
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 1, 1000, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, id), "%s", err.msg);
}

Test(executor, malformed_fragments_are_400_naming_the_node)
{
	static const char *const bad[][2] = {
		{ "{\"nodes\": [{\"name\": \"n\", \"op\": \"NoSuchOp\"}]}", "NoSuchOp" },
		{ "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		  "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"c\"],"
		  " \"attrs\": {\"key\": \"k\"}}]}", "'s'" },
		{ "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		  "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"c\"],"
		  " \"attrs\": {\"key\": \"bad key\", \"to\": \"h:1\"}}]}", "'s'" },
		{ "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		  "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"c\"],"
		  " \"attrs\": {\"key\": \"k\", \"to\": \"nohostport\"}}]}", "'s'" },
		{ "{\"nodes\": [{\"name\": \"v\", \"op\": \"VarInit\", \"attrs\": {\"var\": \"w\","
		  " \"ps\": \"h:1\", \"dtype\": \"float32\", \"shape\": [-1]}}]}", "'v'" },
		{ "{\"nodes\": [{\"name\": \"v\", \"op\": \"VarInit\", \"attrs\": "
		  "{\"var\": \"../w\","
		  " \"ps\": \"h:1\", \"dtype\": \"float32\", \"shape\": [1]}}]}", "'v'" },
		{ "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		  "{\"name\": \"a\", \"op\": \"VarApply\", \"inputs\": [\"c\"], \"attrs\": "
		  "{\"var\": \"w\", \"ps\": \"h:1\", \"rule\": \"magic\"}}]}", "magic" },
		{ "{\"nodes\": [{\"name\": \"r\", \"op\": \"_Recv\","
		  " \"attrs\": {\"key\": \"k\"}}]}",
		  "'r'" },
		{ "{\"nodes\": [{\"name\": \"p\", \"op\": \"Placeholder\", \"attrs\": "
		  "{\"dtype\": \"float32\"}}]}", "'p'" },
		{ "{\"nodes\": [{\"name\": \"a\", \"op\": \"Neg\", \"inputs\": [\"b\"]},"
		  "{\"name\": \"b\", \"op\": \"Neg\", \"inputs\": [\"a\"]}]}", "cycle" },
		{ "{\"nodes\": [", NULL },
		{ "", NULL },
	};
	struct dg_err err = { 0 };

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		int status = refused_status(bad[i][0], &err);
		cr_assert_eq(status, 400, "case %zu: %d %s", i, status, err.msg);
		if (bad[i][1])
			cr_assert(strstr(err.msg, bad[i][1]), "case %zu: %s", i, err.msg);
	}
}

Test(executor, hostile_fragments_are_refused_within_limits)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };
	int status;

	/* Deep nesting in attrs. */
	dg_buf_printf(&b, NULL, "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
		      "{\"value\": ");
	for (int i = 0; i < 100000; i++)
		dg_buf_append(&b, "[", 1, NULL);
	for (int i = 0; i < 100000; i++)
		dg_buf_append(&b, "]", 1, NULL);
	dg_buf_printf(&b, NULL, "}}]}");
	status = refused_status(b.data, &err);
	cr_assert(status == 400 || status == 413, "deep nesting: %d %s", status, err.msg);
	dg_buf_deinit(&b);

	/* A huge attr: a 4 MiB key. */
	dg_buf_printf(&b, NULL, "{\"nodes\": [{\"name\": \"r\", \"op\": \"_Recv\", \"attrs\": "
		      "{\"dtype\": \"float32\", \"key\": \"");
	for (int i = 0; i < 4 << 20; i += 64)
		dg_buf_append(&b, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
			      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 64, NULL);
	dg_buf_printf(&b, NULL, "\"}}]}");
	status = refused_status(b.data, &err);
	cr_assert_eq(status, 400, "huge attr: %d %s", status, err.msg);
	cr_assert(strstr(err.msg, "'r'"), "%s", err.msg);
	dg_buf_deinit(&b);

	/* One node past DG_GRAPH_MAX_NODES, as compact as JSON allows. */
	dg_buf_printf(&b, NULL, "{\"nodes\": [");
	for (int i = 0; i <= 1000000; i++)
		dg_buf_printf(&b, NULL, "%s{\"name\":\"n%d\",\"op\":\"Const\"}", i ? "," : "", i);
	dg_buf_printf(&b, NULL, "]}");
	status = refused_status(b.data, &err);
	cr_assert_eq(status, 413, "10^6+1 nodes: %d %s", status, err.msg);
	dg_buf_deinit(&b);

	/* The server is still fine. */
	char id[24];
	add_fragment(0, "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
		     "{\"value\": 1}}]}", id, sizeof id);
}

Test(executor, step_tensor_routes_check_their_input)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(req(0, "PUT", "/v1/steps/abc/tensors/k", "x", &res, &err), DG_EINVAL);
	cr_assert_eq(res.status, 400);
	dg_http_result_deinit(&res);
	/* Raw without headers. */
	cr_assert_eq(req(0, "PUT", "/v1/steps/1/tensors/k", "abcd", &res, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "Dg-Dtype"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "GET", "/v1/steps/1/tensors/k?timeout_ms=-5", NULL, &res, &err),
		     DG_EINVAL);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "GET", "/v1/steps/18446744073709551616/tensors/k", NULL, &res, &err),
		     DG_EINVAL);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "POST", "/v1/fragments/f1/run", "{\"step\": -1}", &res, &err),
		     DG_EINVAL);
	dg_http_result_deinit(&res);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
}
