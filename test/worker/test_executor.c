/* The worker face end to end: two in-process servers (ps_server_start with
 * the worker route group, on free loopback ports) run the two fragments of
 * the seed program with a Send/Recv pair between them; variable ops against
 * a ps; errors naming task and node; aborts; malformed and hostile fragments
 * answered 4xx; concurrent steps kept apart; a failed step ends without waiting
 * out its ps requests, and its queued applies do not reach the ps. */
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
#include "dg/codec.h"
#include "dg/executor.h"
#include "dg/http.h"
#include "dg/kernels.h"
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

Test(executor, worker_ops_are_the_worker_layer_of_the_one_registry)
{
	static const char *const names[] = { "_Send", "_Recv", "VarRead", "VarApply", "VarInit" };

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		const struct dg_op_def *op = worker_op_find(names[i]);
		cr_assert_not_null(op, "%s", names[i]);
		cr_assert_eq(dg_op_layer_of(op), DG_OPL_WORKER, "%s", names[i]);
		cr_assert_eq(dg_op_find_in(names[i], DG_OPL_ALL), op, "%s", names[i]);
		cr_assert_null(dg_op_find(names[i]), "%s is not a kernel op", names[i]);
		cr_assert_null(op->cpu, "%s", names[i]);
	}
	cr_assert_eq(worker_op_find("MatMul"), dg_op_find("MatMul"));
	cr_assert_null(worker_op_find("Variable"));   /* the master's: lowered before fragments */
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
		/* x, c300, y1 = x + c300 and c66 are step-invariant: computed by the
		 * first step only and kept with the fragment. */
		cr_assert_eq(st, DG_OK, "%s", err.msg);
		cr_assert_eq(n, step == 17 ? 8 : 5);
		cr_assert_eq(rb.st, DG_OK, "%s", rb.err.msg);
		cr_assert_eq(rb.nodes_run, step == 17 ? 4 : 3);
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
		{ "dg_worker_nodes_run_total 18\n", "dg_worker_nodes_run_total 10\n" },
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

Test(executor, var_gather_reads_rows_and_a_row_wise_apply_sums_repeated_rows)
{
	char f[2048], id[24];
	struct dg_err err = { 0 };
	struct dg_tensor *t;
	struct dg_rendezvous *rv = worker_rendezvous(wk[0]);

	/* emb [4,2] = ones on task 1; task 0 gathers rows [[3,0],[3,3]] and
	 * applies assign_add of 1 to the rows [3,0,3,3] (row 3 three times). */
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"init\", \"op\": \"VarInit\", \"attrs\": {\"var\": \"emb\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [4,2], \"init\": \"ones\"}},"
		 "{\"name\": \"ids\", \"op\": \"Const\", \"attrs\": {\"value\": [[3,0],[3,3]],"
		 " \"dtype\": \"int64\"}},"
		 "{\"name\": \"g\", \"op\": \"VarGather\", \"inputs\": [\"ids\"], \"attrs\":"
		 " {\"var\": \"emb\", \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [4,2]}},"
		 "{\"name\": \"rows\", \"op\": \"Const\", \"attrs\": {\"value\": [3,0,3,3],"
		 " \"dtype\": \"int32\"}},"
		 "{\"name\": \"v\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [4,2], \"value\": 1}}},"
		 "{\"name\": \"apply\", \"op\": \"VarApply\", \"inputs\": [\"v\", \"rows\"],"
		 " \"attrs\": {\"var\": \"emb\", \"ps\": \"%s\", \"rule\": \"assign_add\"}},"
		 "{\"name\": \"sg\", \"op\": \"_Send\", \"inputs\": [\"g\"],"
		 " \"attrs\": {\"key\": \"rows\", \"to\": \"%s\"}}]}",
		 addr[1], addr[1], addr[1], addr[0]);
	add_fragment(0, f, id, sizeof id);
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 41, 10000, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_take(rv, 41, "rows", 1000, &t, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(t->shape.ndim, 3);
	cr_assert_eq(t->shape.dim[0], 2);
	cr_assert_eq(t->shape.dim[2], 2);
	dg_tensor_free(t);
	t = read_var(1, "emb");
	const double want[8] = { 2, 2, 1, 1, 1, 1, 4, 4 };
	for (int i = 0; i < 8; i++)
		cr_assert_float_eq(dg_tensor_get_f64(t, i), want[i], 1e-6, "emb[%d]", i);
	dg_tensor_free(t);
	/* a second run reads the updated rows */
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 42, 10000, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_take(rv, 42, "rows", 1000, &t, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(t, 0), 4, 1e-6, "row 3 after the first apply");
	cr_assert_float_eq(dg_tensor_get_f64(t, 2), 2, 1e-6, "row 0 after the first apply");
	dg_tensor_free(t);
	/* a row out of range fails the step naming it */
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"ids\", \"op\": \"Const\", \"attrs\": {\"value\": [9],"
		 " \"dtype\": \"int32\"}},"
		 "{\"name\": \"g\", \"op\": \"VarGather\", \"inputs\": [\"ids\"], \"attrs\":"
		 " {\"var\": \"emb\", \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [4,2]}},"
		 "{\"name\": \"sg\", \"op\": \"_Send\", \"inputs\": [\"g\"],"
		 " \"attrs\": {\"key\": \"rows\", \"to\": \"%s\"}}]}", addr[1], addr[0]);
	add_fragment(0, f, id, sizeof id);
	cr_assert_neq(worker_run_fragment_local(wk[0], id, 43, 10000, &err), DG_OK);
	cr_assert_not_null(strstr(err.msg, "row 9 of 'emb' is out of range"), "%s", err.msg);
	cr_assert_eq(refused_status("{\"nodes\": [{\"name\": \"ids\", \"op\": \"Const\","
				    " \"attrs\": {\"value\": [1.5]}}, {\"name\": \"g\", \"op\":"
				    " \"VarGather\", \"inputs\": [\"ids\"], \"attrs\": {\"var\":"
				    " \"emb\", \"ps\": \"h:1\", \"dtype\": \"float32\", \"shape\":"
				    " [4,2]}}]}", &err), 400);
	cr_assert_not_null(strstr(err.msg, "not int32 or int64"), "%s", err.msg);
	/* the worker sums repeated rows in float32 or float64 only */
	cr_assert_eq(refused_status("{\"nodes\": [{\"name\": \"r\", \"op\": \"Const\","
				    " \"attrs\": {\"value\": [0, 0], \"dtype\": \"int32\"}},"
				    " {\"name\": \"v\", \"op\": \"Const\", \"attrs\": {\"value\":"
				    " [[1], [2]], \"dtype\": \"int32\"}}, {\"name\": \"a\", \"op\":"
				    " \"VarApply\", \"inputs\": [\"v\", \"r\"], \"attrs\": {\"var\":"
				    " \"emb\", \"ps\": \"h:1\", \"rule\": \"assign_add\"}}]}", &err),
		     400);
	cr_assert_not_null(strstr(err.msg, "the values (input 0) are int32"), "%s", err.msg);
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

/* ------------------------------------------------ training runs (several steps) */

/* A ps client of task i (free with dg_client_free). */
static struct dg_client *ps_client(int i)
{
	struct dg_err err = { 0 };
	struct dg_client *c = dg_client_new(addr[i], NULL, &err);

	cr_assert_not_null(c, "%s", err.msg);
	return c;
}

/* Create (or replace) the float32 variable name = vals[0..n) on task 1. */
static void put_f32(const char *name, const float *vals, int n)
{
	struct dg_err err = { 0 };
	struct dg_client *c = ps_client(1);
	struct dg_tensor *t = dg_tensor_new(DG_F32, &(struct dg_shape){ 1, { n } }, &err);
	struct dg_put_opts po = { .replace = true };

	cr_assert_not_null(t);
	memcpy(t->data, vals, (size_t)n * sizeof *vals);
	cr_assert_eq(dg_var_put(c, name, t, &po, NULL, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(t);
	dg_client_free(c);
}

static double var_elem(const char *name, int64_t i)
{
	struct dg_tensor *t = read_var(1, name);
	double v = dg_tensor_get_f64(t, i);

	dg_tensor_free(t);
	return v;
}

/* The sync step of variable name on task 1 (from the listing). */
static int64_t var_step(const char *name)
{
	struct dg_err err = { 0 };
	struct dg_client *c = ps_client(1);
	struct dg_var_info *vs = NULL;
	int n = 0;
	int64_t step = -2;

	cr_assert_eq(dg_var_list(c, name, &vs, &n, &err), DG_OK, "%s", err.msg);
	for (int i = 0; i < n; i++)
		if (strcmp(vs[i].name, name) == 0)
			step = vs[i].step;
	free(vs);
	dg_client_free(c);
	cr_assert_geq(step, 0, "variable %s has no sync step", name);
	return step;
}

/* Write x = [0, 1, ..., n-1] (float32) as a .npy file at path. */
static void write_npy(const char *path, int n)
{
	struct dg_tensor *t = dg_tensor_new(DG_F32, &(struct dg_shape){ 1, { n } }, NULL);
	struct dg_buf b = { 0 };
	FILE *fp = fopen(path, "wb");

	cr_assert_not_null(fp);
	for (int i = 0; i < n; i++)
		dg_tensor_set_f64(t, i, i);
	cr_assert_eq(dg_npy_encode(t, &b, NULL), DG_OK);
	cr_assert_eq(fwrite(b.data, 1, b.len, fp), b.len);
	fclose(fp);
	dg_buf_deinit(&b);
	dg_tensor_free(t);
}

/* The value of metric name (a plain "name value" line) on task i. */
static double metric(int i, const char *name)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char want[128];
	double v = -1;

	cr_assert_eq(req(i, "GET", "/v1/metrics", NULL, &res, &err), DG_OK, "%s", err.msg);
	snprintf(want, sizeof want, "\n%s ", name);
	const char *p = strstr(res.body.data, want);
	cr_assert_not_null(p, "no metric %s", name);
	v = strtod(p + strlen(want), NULL);
	dg_http_result_deinit(&res);
	return v;
}

/* x = NpyReader [6] = 0..5, batches of 2 in file order: training step t reads
 * examples 2(t%3), 2(t%3)+1, so "fetch:b" = sum of the batch = 4(t%3) + 1 and
 * "fetch:c" = Sum(x) = 15 (step-invariant). */
static void batch_fragment(char *f, size_t n, const char *npy)
{
	snprintf(f, n, "{\"nodes\": ["
		 "{\"name\": \"x\", \"op\": \"NpyReader\", \"attrs\": {\"path\": \"%s\"}},"
		 "{\"name\": \"sb\", \"op\": \"ShardBatch\", \"inputs\": [\"x\", \"x\"],"
		 " \"attrs\": {\"batch\": 2, \"shuffle\": false}},"
		 "{\"name\": \"b\", \"op\": \"Sum\", \"inputs\": [\"sb:0\"]},"
		 "{\"name\": \"c\", \"op\": \"Sum\", \"inputs\": [\"x\"]},"
		 "{\"name\": \"sendb\", \"op\": \"_Send\", \"inputs\": [\"b\"],"
		 " \"attrs\": {\"key\": \"fetch:b\", \"to\": \"%s\"}},"
		 "{\"name\": \"sendc\", \"op\": \"_Send\", \"inputs\": [\"c\"],"
		 " \"attrs\": {\"key\": \"fetch:c\", \"to\": \"%s\"}}]}", npy, addr[0], addr[0]);
}

/* Write 6 examples to a new temporary .npy (npy: a mkstemp template, gets the
 * path) and register batch_fragment over it on worker 0 as id. */
static void add_batch_fragment(char *npy, char *id, size_t id_len)
{
	char f[2048];
	int fd = mkstemp(npy);

	cr_assert_geq(fd, 0);
	close(fd);
	write_npy(npy, 6);
	batch_fragment(f, sizeof f, npy);
	add_fragment(0, f, id, id_len);
}

Test(executor, multi_step_run_collects_each_training_step_and_reads_the_file_once)
{
	char npy[] = "/tmp/dg_test_exec_XXXXXX", id[24];
	const char *keys[] = { "fetch:b", "fetch:c" };
	struct worker_run_opts o = { .step = 500, .steps = 5, .train_step = 1,
				     .timeout_ms = 10000, .collect = keys, .n_collect = 2 };
	struct worker_run_result res;
	struct dg_err err = { 0 };

	add_batch_fragment(npy, id, sizeof id);
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.steps_done, 5);
	for (int i = 0; i < 5; i++) {
		int64_t t = 1 + i;
		cr_assert_eq(res.r[i].step, 500 + (uint64_t)i);
		cr_assert_eq(res.r[i].train_step, t);
		cr_assert_float_eq(res.r[i].values[0], 4.0 * (double)(t % 3) + 1, 1e-9,
				   "step %d: %g", i, res.r[i].values[0]);
		cr_assert_float_eq(res.r[i].values[1], 15.0, 1e-9);
		cr_assert_eq(res.r[i].stale, 0);
		cr_assert_geq(res.r[i].ms, 0);
	}
	/* x and c ran once (step 500); sb, b and the two sends ran every step. */
	cr_assert_eq(res.nodes_run, 2 + 5 * 4, "%d", res.nodes_run);
	cr_assert_eq(metric(0, "dg_worker_cached_bytes"), 6 * 4 + 4);   /* x and c */
	worker_run_result_deinit(&res);
	cr_assert_null(res.r);
	/* The reader's value is kept: with the file gone the fragment still runs. */
	unlink(npy);
	o.step = 600;
	o.train_step = 0;
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(res.r[0].values[0], 1.0, 1e-9);
	cr_assert_eq(res.nodes_run, 5 * 4);
	worker_run_result_deinit(&res);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
	/* Removing the fragment frees the cache. */
	char path[64];
	struct dg_http_result hr;
	snprintf(path, sizeof path, "/v1/fragments/%s", id);
	cr_assert_eq(req(0, "DELETE", path, NULL, &hr, &err), DG_OK, "%s", err.msg);
	dg_http_result_deinit(&hr);
	cr_assert_eq(metric(0, "dg_worker_cached_bytes"), 0);
}

Test(executor, multi_step_run_over_http_replies_with_results)
{
	char npy[] = "/tmp/dg_test_exec_XXXXXX", f[2048], id[24], path[96];
	struct dg_http_result res;
	struct dg_err err = { 0 };

	add_batch_fragment(npy, id, sizeof id);
	snprintf(path, sizeof path, "/v1/fragments/%s/run", id);
	cr_assert_eq(req(0, "POST", path, "{\"step\": 70, \"steps\": 4, \"train_step\": 2, "
			 "\"timeout_ms\": 10000, \"collect\": [\"fetch:b\"]}", &res, &err), DG_OK,
		     "%s", err.msg);
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	dg_http_result_deinit(&res);
	cr_assert_not_null(j);
	cr_assert_eq(json_integer_value(json_object_get(j, "step")), 70);
	cr_assert_eq(json_integer_value(json_object_get(j, "steps")), 4);
	cr_assert_eq(json_integer_value(json_object_get(j, "nodes_run")), 2 + 4 * 4);
	cr_assert(json_is_number(json_object_get(j, "ms")));
	json_t *rs = json_object_get(j, "results");
	cr_assert_eq(json_array_size(rs), 4);
	for (int i = 0; i < 4; i++) {
		json_t *e = json_array_get(rs, (size_t)i);
		cr_assert_eq(json_integer_value(json_object_get(e, "step")), 70 + i);
		cr_assert_eq(json_integer_value(json_object_get(e, "train_step")), 2 + i);
		cr_assert_eq(json_integer_value(json_object_get(e, "stale")), 0);
		json_t *v = json_object_get(json_object_get(e, "values"), "fetch:b");
		cr_assert_float_eq(json_number_value(v), 4.0 * ((2 + i) % 3) + 1, 1e-9);
	}
	json_decref(j);
	/* fetch:c was sent but not collected: it waits in the rendezvous. */
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 4);
	for (uint64_t s = 70; s < 74; s++)
		dg_rendezvous_finish(worker_rendezvous(wk[0]), s);
	/* A key the fragment does not send, a bad count, a bad key: 4xx naming them. */
	cr_assert_eq(req(0, "POST", path, "{\"step\": 80, \"steps\": 2, \"train_step\": 0, "
			 "\"collect\": [\"fetch:nope\"]}", &res, &err), DG_ENOTFOUND);
	cr_assert_eq(res.status, 404);
	cr_assert(strstr(err.msg, "fetch:nope") && strstr(err.msg, "step 80"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert(dg_rendezvous_is_aborted(worker_rendezvous(wk[0]), 80));
	cr_assert_eq(req(0, "POST", path, "{\"step\": 90, \"steps\": 5000}", &res, &err),
		     DG_EINVAL);
	cr_assert(strstr(err.msg, "\"steps\""), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "POST", path, "{\"step\": 90, \"collect\": [\"bad key\"]}", &res,
			 &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "bad key"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "POST", path, "{\"step\": 90, \"collect\": [\"fetch:b\", 3]}", &res,
			 &err), DG_EINVAL);
	dg_http_result_deinit(&res);
	/* A collected value must be a scalar. */
	snprintf(f, sizeof f, "{\"nodes\": [{\"name\": \"v\", \"op\": \"Const\", \"attrs\": "
		 "{\"value\": [1, 2]}}, {\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"v\"],"
		 " \"attrs\": {\"key\": \"fetch:v\", \"to\": \"%s\"}}]}", addr[0]);
	add_fragment(0, f, id, sizeof id);
	const char *keys[] = { "fetch:v" };
	struct worker_run_opts o = { .step = 95, .steps = 3, .collect = keys, .n_collect = 1 };
	struct worker_run_result rr;
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &rr, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "fetch:v") && strstr(err.msg, "2 elements"), "%s", err.msg);
	cr_assert_eq(rr.steps_done, 0);
	worker_run_result_deinit(&rr);
	unlink(npy);
}

struct http_multi {
	int task;
	const char *body;
	char path[96];
	enum dg_status st;
	struct dg_err err;
	double took;
};

static void *post_run(void *arg)
{
	struct http_multi *m = arg;
	struct dg_http_result res;
	double t0 = now_s();

	m->st = req(m->task, "POST", m->path, m->body, &res, &m->err);
	dg_http_result_deinit(&res);
	m->took = now_s() - t0;
	return NULL;
}

Test(executor, abort_with_count_ends_a_multi_step_run_without_recv_promptly)
{
	char f[1024], id[24];
	float zero = 0;
	struct http_multi m = { .task = 0, .body = "{\"step\": 3000, \"steps\": 4096, "
				"\"train_step\": 0, \"timeout_ms\": 60000}" };
	struct dg_http_result res;
	struct dg_err err = { 0 };
	pthread_t th;

	/* Each step adds 1 to "ticks" on task 1's ps: no _Recv anywhere. The
	 * MatMul makes a step take ~1 ms, so that the 4096 steps cannot all be
	 * done before the abort comes (an apply alone takes ~70 us). */
	put_f32("ticks", &zero, 1);
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"r\", \"op\": \"RandomNormal\", \"attrs\": "
		 "{\"shape\": [200, 200]}}, {\"name\": \"m\", \"op\": \"MatMul\", "
		 "\"inputs\": [\"r\", \"r\"]},"
		 "{\"name\": \"one\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [1], \"value\": 1}}},"
		 "{\"name\": \"a\", \"op\": \"VarApply\", \"inputs\": [\"one\"],"
		 " \"attrs\": {\"var\": \"ticks\", \"ps\": \"%s\", \"rule\": \"assign_add\"}}]}",
		 addr[1]);
	add_fragment(0, f, id, sizeof id);
	snprintf(m.path, sizeof m.path, "/v1/fragments/%s/run", id);
	pthread_create(&th, NULL, post_run, &m);
	usleep(300000);
	double t0 = now_s();
	cr_assert_eq(req(0, "DELETE", "/v1/steps/3000?count=4096&reason=job%20cancelled", NULL,
			 &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 204);
	dg_http_result_deinit(&res);
	pthread_join(th, NULL);
	cr_assert_eq(m.st, DG_ECANCELED, "%d: %s", m.st, m.err.msg);
	cr_assert(strstr(m.err.msg, "was aborted: job cancelled"), "%s", m.err.msg);
	cr_assert_lt(now_s() - t0, 1.0);
	double ticks = var_elem("ticks", 0);
	cr_assert(ticks >= 1 && ticks < 4096, "ticks %g", ticks);
	/* Every step of the range is aborted; one past it is not. */
	cr_assert(dg_rendezvous_is_aborted(worker_rendezvous(wk[0]), 3000 + 4095));
	cr_assert_not(dg_rendezvous_is_aborted(worker_rendezvous(wk[0]), 3000 + 4096));
	cr_assert_eq(req(0, "DELETE", "/v1/steps/1?count=0", NULL, &res, &err), DG_EINVAL);
	dg_http_result_deinit(&res);
	cr_assert_eq(req(0, "DELETE", "/v1/steps/1?count=4097", NULL, &res, &err), DG_EINVAL);
	dg_http_result_deinit(&res);

	/* A pure compute fragment is aborted before its next step too. */
	add_fragment(0, "{\"nodes\": [{\"name\": \"r\", \"op\": \"RandomNormal\", \"attrs\": "
		     "{\"shape\": [200, 200]}}, {\"name\": \"m\", \"op\": \"MatMul\", "
		     "\"inputs\": [\"r\", \"r\"]}]}", id, sizeof id);
	snprintf(m.path, sizeof m.path, "/v1/fragments/%s/run", id);
	m.body = "{\"step\": 9000, \"steps\": 4096, \"train_step\": 0}";
	pthread_create(&th, NULL, post_run, &m);
	usleep(300000);
	t0 = now_s();
	dg_rendezvous_abort_range(worker_rendezvous(wk[0]), 9000, 4096, "stop now");
	pthread_join(th, NULL);
	cr_assert_eq(m.st, DG_ECANCELED, "%d: %s", m.st, m.err.msg);
	cr_assert(strstr(m.err.msg, "stop now"), "%s", m.err.msg);
	cr_assert_lt(now_s() - t0, 1.0);
}

/* Replica r of a sync step: read w (waiting for the previous step), send its
 * sum as "fetch:w", apply the gradient g_r (made to depend on the read). */
static void sync_fragment(char *f, size_t n, int r, double g, int backup, int64_t base)
{
	snprintf(f, n, "{\"nodes\": ["
		 "{\"name\": \"rd\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"sw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [2],"
		 " \"min_step_base\": %" PRId64 "}},"
		 "{\"name\": \"z\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [], \"value\": 0}}},"
		 "{\"name\": \"gc\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [2], \"value\": %g}}},"
		 "{\"name\": \"rz\", \"op\": \"Mul\", \"inputs\": [\"rd\", \"z\"]},"
		 "{\"name\": \"g\", \"op\": \"Add\", \"inputs\": [\"rz\", \"gc\"]},"
		 "{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"rd\"]},"
		 "{\"name\": \"send\", \"op\": \"_Send\", \"inputs\": [\"s\"],"
		 " \"attrs\": {\"key\": \"fetch:w\", \"to\": \"%s\"}},"
		 "{\"name\": \"ap\", \"op\": \"VarApply\", \"inputs\": [\"g\"],"
		 " \"attrs\": {\"var\": \"sw\", \"ps\": \"%s\", \"rule\": \"sgd\", \"lr\": 0.5,"
		 " \"sync\": true, \"replicas\": 2, \"backup\": %d, \"replica\": %d,"
		 " \"step_base\": %" PRId64 "}}]}",
		 addr[1], base, g, addr[r], addr[1], backup, r, base);
}

struct replica_run {
	int task;
	char id[24];
	struct worker_run_opts o;
	struct worker_run_result res;
	enum dg_status st;
	struct dg_err err;
};

static void *replica_main(void *arg)
{
	struct replica_run *rr = arg;

	rr->st = worker_run_steps(wk[rr->task], rr->id, &rr->o, &rr->res, &rr->err);
	return NULL;
}

Test(executor, sync_replicas_step_together_against_a_real_ps)
{
	static const char *const keys[] = { "fetch:w" };
	float zero[2] = { 0, 0 };
	struct replica_run rr[2];
	struct dg_err err = { 0 };
	struct dg_client *c = ps_client(1);
	pthread_t th[2];
	char f[4096];

	put_f32("sw", zero, 2);
	int64_t base = var_step("sw");
	/* Replica 0 (task 0) sends 1, replica 1 (task 1) 3: the mean 2 at lr 0.5
	 * moves w by -1 a step, and each replica's read of step t sees -t. */
	for (int r = 0; r < 2; r++) {
		sync_fragment(f, sizeof f, r, r ? 3.0 : 1.0, 0, base);
		rr[r] = (struct replica_run){ .task = r };
		add_fragment(r, f, rr[r].id, sizeof rr[r].id);
		rr[r].o = (struct worker_run_opts){ .step = 7000 + 100 * (uint64_t)r, .steps = 6,
						    .train_step = 0, .timeout_ms = 20000,
						    .collect = keys, .n_collect = 1 };
		pthread_create(&th[r], NULL, replica_main, &rr[r]);
	}
	for (int r = 0; r < 2; r++) {
		pthread_join(th[r], NULL);
		cr_assert_eq(rr[r].st, DG_OK, "replica %d: %s", r, rr[r].err.msg);
		cr_assert_eq(rr[r].res.steps_done, 6);
		for (int t = 0; t < 6; t++) {
			cr_assert_float_eq(rr[r].res.r[t].values[0], -2.0 * t, 1e-6,
					   "replica %d step %d: %g", r, t,
					   rr[r].res.r[t].values[0]);
			cr_assert_eq(rr[r].res.r[t].stale, 0);
		}
		worker_run_result_deinit(&rr[r].res);
	}
	cr_assert_float_eq(var_elem("sw", 1), -6.0, 1e-6);
	cr_assert_eq(var_step("sw"), base + 6);

	/* backup 1: replica 0 alone moves the variable (lr 0.5 * 1 a step); a late
	 * replica 1 then sends a gradient for an applied step: stale, counted. */
	base += 6;
	sync_fragment(f, sizeof f, 0, 1.0, 1, base);
	add_fragment(0, f, rr[0].id, sizeof rr[0].id);
	rr[0].o.step = 7500;
	rr[0].o.steps = 3;
	cr_assert_eq(worker_run_steps(wk[0], rr[0].id, &rr[0].o, &rr[0].res, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_float_eq(rr[0].res.r[2].values[0], -12.0 - 2.0, 1e-6);
	worker_run_result_deinit(&rr[0].res);
	cr_assert_float_eq(var_elem("sw", 0), -3.0 - 1.5 * 3, 1e-6);
	sync_fragment(f, sizeof f, 1, 3.0, 1, base);
	add_fragment(1, f, rr[1].id, sizeof rr[1].id);
	rr[1].o.step = 7600;
	rr[1].o.steps = 2;
	cr_assert_eq(worker_run_steps(wk[1], rr[1].id, &rr[1].o, &rr[1].res, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(rr[1].res.r[0].stale, 1);
	cr_assert_eq(rr[1].res.r[1].stale, 1);
	worker_run_result_deinit(&rr[1].res);
	cr_assert_float_eq(var_elem("sw", 0), -7.5, 1e-6, "stale gradients are dropped");
	dg_client_free(c);
}

Test(executor, a_sync_read_waits_for_its_step_within_the_timeout)
{
	static const char *const keys[] = { "fetch:w" };
	float zero[2] = { 0, 0 };
	struct dg_err err = { 0 };
	struct dg_client *c = ps_client(1);
	struct worker_run_result res;
	char f[4096], id[24];

	put_f32("sw", zero, 2);
	/* Training step 1 needs step 0 applied by both replicas; none comes. */
	sync_fragment(f, sizeof f, 0, 1.0, 0, var_step("sw"));
	add_fragment(0, f, id, sizeof id);
	struct worker_run_opts o = { .step = 7700, .steps = 1, .train_step = 1,
				     .timeout_ms = 700, .collect = keys, .n_collect = 1 };
	double t0 = now_s();
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_ETIMEOUT, "%s", err.msg);
	cr_assert(strstr(err.msg, "node 'rd' (VarRead)") && strstr(err.msg, "sync step"), "%s",
		  err.msg);
	cr_assert(now_s() - t0 >= 0.6 && now_s() - t0 < 3.0, "%g s", now_s() - t0);
	worker_run_result_deinit(&res);
	dg_client_free(c);
}

/* u -= lr_t * 1 at each step; "fetch:u" is u before the step's apply. */
static void schedule_fragment(char *f, size_t n, const char *var, const char *sched)
{
	snprintf(f, n, "{\"nodes\": ["
		 "{\"name\": \"rd\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"%s\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [1]}},"
		 "{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"rd\"]},"
		 "{\"name\": \"send\", \"op\": \"_Send\", \"inputs\": [\"s\"],"
		 " \"attrs\": {\"key\": \"fetch:u\", \"to\": \"%s\"}},"
		 "{\"name\": \"g\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [1], \"value\": 1}}},"
		 "{\"name\": \"ap\", \"op\": \"VarApply\", \"inputs\": [\"g\"],"
		 " \"attrs\": {\"var\": \"%s\", \"ps\": \"%s\", \"rule\": \"sgd\","
		 " \"lr\": 0.1, %s}}]}", var, addr[1], addr[0], var, addr[1], sched);
}

Test(executor, lr_schedules_scale_each_update_by_lr_at_the_training_step)
{
	static const char *const keys[] = { "fetch:u" };
	static const struct {
		const char *sched;
		int64_t t0;
		double lr[4];
	} cases[] = {
		{ "\"schedule\": \"constant\"", 5, { 0.1, 0.1, 0.1, 0.1 } },
		{ "\"schedule\": \"step\", \"every\": 2, \"factor\": 0.5", 0,
		  { 0.1, 0.1, 0.05, 0.05 } },
		{ "\"schedule\": \"step\", \"every\": 2, \"factor\": 0.5", 3,
		  { 0.05, 0.025, 0.025, 0.0125 } },
		{ "\"schedule\": \"exponential\", \"every\": 2, \"factor\": 0.25", 2,
		  { 0.025, 0.0125, 0.00625, 0.003125 } },
	};
	struct dg_err err = { 0 };
	char f[2048], id[24], var[32];
	float zero = 0;

	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		struct worker_run_result res;
		snprintf(var, sizeof var, "sched%zu", k);
		put_f32(var, &zero, 1);
		schedule_fragment(f, sizeof f, var, cases[k].sched);
		add_fragment(0, f, id, sizeof id);
		struct worker_run_opts o = { .step = 8000 + 10 * k, .steps = 4,
					     .train_step = cases[k].t0, .collect = keys,
					     .n_collect = 1 };
		cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
		double u = 0;
		for (int i = 0; i < 4; i++) {
			cr_assert_float_eq(res.r[i].values[0], u, 1e-6, "case %zu step %d", k, i);
			u -= cases[k].lr[i];
		}
		cr_assert_float_eq(var_elem(var, 0), u, 1e-6, "case %zu", k);
		worker_run_result_deinit(&res);
	}
	/* Bad schedule attrs are refused at registration, naming the attr. */
	static const char *const bad[][2] = {
		{ "\"schedule\": \"cosine\"", "cosine" },
		{ "\"schedule\": \"step\", \"every\": 0", "every" },
		{ "\"factor\": -1", "factor" },
		{ "\"sync\": true, \"replicas\": 2, \"backup\": 2", "backup" },
		{ "\"sync\": true, \"replicas\": 2, \"replica\": 2", "replica" },
		{ "\"step_base\": -3", "step_base" },
	};
	for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
		schedule_fragment(f, sizeof f, "sched0", bad[k][0]);
		int status = refused_status(f, &err);
		cr_assert_eq(status, 400, "case %zu: %d %s", k, status, err.msg);
		cr_assert(strstr(err.msg, bad[k][1]) && strstr(err.msg, "'ap'"), "case %zu: %s",
			  k, err.msg);
	}
}

Test(executor, var_init_reset_replaces_an_existing_variable)
{
	float vals[3] = { 7, 8, 9 };
	char f[1024], id[24];
	struct dg_err err = { 0 };

	put_f32("rv", vals, 3);
	for (int reset = 0; reset < 2; reset++) {
		snprintf(f, sizeof f, "{\"nodes\": [{\"name\": \"i\", \"op\": \"VarInit\", "
			 "\"attrs\": {\"var\": \"rv\", \"ps\": \"%s\", \"dtype\": \"float32\", "
			 "\"shape\": [3], \"init\": \"ones\", \"reset\": %s}}]}", addr[1],
			 reset ? "true" : "false");
		add_fragment(0, f, id, sizeof id);
		cr_assert_eq(worker_run_fragment_local(wk[0], id, 8100 + (uint64_t)reset, 5000,
						       &err), DG_OK, "%s", err.msg);
		cr_assert_float_eq(var_elem("rv", 2), reset ? 1.0 : 9.0, 1e-6, "reset %d", reset);
	}
}

/* 4 variables pulled, a little compute, 4 applies, and each variable's value
 * sent back: the same results with and without the I/O pool. */
static void four_vars_fragment(char *f, size_t n, const char *pre, const char *to)
{
	struct dg_buf b = { 0 };

	dg_buf_printf(&b, NULL, "{\"nodes\": [");
	for (int k = 0; k < 4; k++) {
		char var[32];
		snprintf(var, sizeof var, "%s%d", pre, k);
		dg_buf_printf(&b, NULL, "%s{\"name\": \"i%d\", \"op\": \"VarInit\", \"attrs\": "
			      "{\"var\": \"%s\", \"ps\": \"%s\", \"dtype\": \"float32\", "
			      "\"shape\": [64], \"init\": \"ones\"}},", k ? "," : "", k, var,
			      addr[1]);
		dg_buf_printf(&b, NULL, "{\"name\": \"r%d\", \"op\": \"VarRead\", \"attrs\": "
			      "{\"var\": \"%s\", \"ps\": \"%s\", \"dtype\": \"float32\", "
			      "\"shape\": [64]}},", k, var, addr[1]);
		dg_buf_printf(&b, NULL, "{\"name\": \"g%d\", \"op\": \"Mul\", \"inputs\": "
			      "[\"r%d\", \"r%d\"]},", k, k, k);
		dg_buf_printf(&b, NULL, "{\"name\": \"a%d\", \"op\": \"VarApply\", \"inputs\": "
			      "[\"g%d\"], \"attrs\": {\"var\": \"%s\", \"ps\": \"%s\", "
			      "\"rule\": \"sgd\", \"lr\": %g}},", k, k, var, addr[1],
			      0.1 * (k + 1));
		dg_buf_printf(&b, NULL, "{\"name\": \"s%d\", \"op\": \"Sum\", \"inputs\": "
			      "[\"r%d\"]},", k, k);
		dg_buf_printf(&b, NULL, "{\"name\": \"x%d\", \"op\": \"_Send\", \"inputs\": "
			      "[\"s%d\"], \"attrs\": {\"key\": \"fetch:v%d\", \"to\": \"%s\"}}",
			      k, k, k, to);
	}
	dg_buf_printf(&b, NULL, "]}");
	cr_assert_lt(b.len, n);
	memcpy(f, b.data, b.len + 1);
	dg_buf_deinit(&b);
}

Test(executor, io_pool_gives_the_results_of_the_sequential_run)
{
	static const char *const keys[] = { "fetch:v0", "fetch:v1", "fetch:v2", "fetch:v3" };
	struct worker_config wc = { .job = "worker", .task = 2, .io_threads = -1,
				    .address = "127.0.0.1:9" };
	struct dg_err err = { 0 };
	struct worker *seq = worker_new(&wc, &err);
	char f[8192], id[24], id2[24];
	struct worker_run_result res[2];

	cr_assert_not_null(seq, "%s", err.msg);
	/* The same fragment with a fresh set of variables on each worker. */
	four_vars_fragment(f, sizeof f, "pool", addr[0]);
	add_fragment(0, f, id, sizeof id);
	four_vars_fragment(f, sizeof f, "seq", "127.0.0.1:9");
	cr_assert_eq(worker_fragment_add(seq, f, strlen(f), id2, sizeof id2, NULL, NULL, &err), DG_OK,
		     "%s", err.msg);
	struct worker_run_opts o = { .step = 8200, .steps = 3, .train_step = 0,
				     .collect = keys, .n_collect = 4 };
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res[0], &err), DG_OK, "%s", err.msg);
	cr_assert_eq(worker_run_steps(seq, id2, &o, &res[1], &err), DG_OK, "%s", err.msg);
	/* v_k starts at 1 (VarInit before VarRead of the same variable, always) and
	 * loses lr_k * v^2 a step. */
	for (int k = 0; k < 4; k++) {
		double v = 1, lr = 0.1 * (k + 1);
		for (int t = 0; t < 3; t++) {
			cr_assert_float_eq(res[0].r[t].values[k], 64 * v, 1e-3, "k %d t %d", k, t);
			cr_assert_float_eq(res[1].r[t].values[k], res[0].r[t].values[k], 1e-9);
			v -= lr * v * v;
		}
	}
	/* 4 VarInits + 4 VarReads were in flight together on task 0's pool. */
	cr_assert_geq(metric(0, "dg_worker_io_threads"), 2);
	worker_run_result_deinit(&res[0]);
	worker_run_result_deinit(&res[1]);
	worker_free(seq);
}

/* Many fragments, each VarInit of a new variable and a VarRead of it listed
 * after it with no edge between them: the read never runs first. */
Test(executor, ops_on_one_variable_keep_their_order_on_the_io_pool)
{
	struct dg_err err = { 0 };
	char f[1024], id[24];

	for (int i = 0; i < 20; i++) {
		struct dg_tensor *t = NULL;
		snprintf(f, sizeof f, "{\"nodes\": ["
			 "{\"name\": \"i\", \"op\": \"VarInit\", \"attrs\": {\"var\": \"ord%d\","
			 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [3],"
			 " \"init\": \"ones\"}},"
			 "{\"name\": \"r\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"ord%d\","
			 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [3]}},"
			 "{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"r\"]},"
			 "{\"name\": \"x\", \"op\": \"_Send\", \"inputs\": [\"s\"],"
			 " \"attrs\": {\"key\": \"sum\", \"to\": \"%s\"}}]}", i, addr[1], i,
			 addr[1], addr[0]);
		add_fragment(0, f, id, sizeof id);
		cr_assert_eq(worker_run_fragment_local(wk[0], id, 8300 + (uint64_t)i, 5000, &err),
			     DG_OK, "%s", err.msg);
		cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), 8300 + (uint64_t)i,
						"sum", 0, &t, &err), DG_OK, "%s", err.msg);
		cr_assert_float_eq(dg_tensor_get_f64(t, 0), 3.0, 1e-6);
		dg_tensor_free(t);
	}
}

struct late_put {
	uint64_t step;
	double value;
};

static void *put_later(void *arg)
{
	struct late_put *lp = arg;
	struct dg_tensor *t = dg_tensor_new(DG_F32, &(struct dg_shape){ 1, { 3 } }, NULL);

	usleep(200000);
	for (int i = 0; i < 3; i++)
		dg_tensor_set_f64(t, i, lp->value);
	dg_rendezvous_put(worker_rendezvous(wk[0]), lp->step, "in", t, NULL);
	return NULL;
}

/* A _Recv and ps requests pending at once: the run takes whichever ends first;
 * a failing request among others in flight reports its own node. */
Test(executor, recv_and_io_in_flight_together_and_io_errors_name_their_node)
{
	float w[3] = { 1, 2, 3 };
	struct late_put lp = { .step = 8400, .value = 10 };
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	char f[2048], id[24];
	pthread_t th;

	put_f32("rw", w, 3);
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"in\","
		 " \"dtype\": \"float32\", \"shape\": [3]}},"
		 "{\"name\": \"rd\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"rw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [3]}},"
		 "{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"in\", \"rd\"]},"
		 "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"y\"],"
		 " \"attrs\": {\"key\": \"out\", \"to\": \"%s\"}}]}", addr[1], addr[0]);
	add_fragment(0, f, id, sizeof id);
	pthread_create(&th, NULL, put_later, &lp);
	cr_assert_eq(worker_run_fragment_local(wk[0], id, lp.step, 5000, &err), DG_OK, "%s",
		     err.msg);
	pthread_join(th, NULL);
	cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), lp.step, "out", 0, &t, &err),
		     DG_OK, "%s", err.msg);
	for (int i = 0; i < 3; i++)
		cr_assert_float_eq(dg_tensor_get_f64(t, i), 10.0 + w[i], 1e-6);
	dg_tensor_free(t);

	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"a\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"rw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\"}},"
		 "{\"name\": \"missing\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"no/such\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\"}},"
		 "{\"name\": \"b\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"rw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\"}}]}", addr[1], addr[1], addr[1]);
	add_fragment(0, f, id, sizeof id);
	cr_assert_eq(worker_run_fragment_local(wk[0], id, 8401, 5000, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "task worker/0: node 'missing' (VarRead): ") == err.msg &&
		  strstr(err.msg, "no/such"), "%s", err.msg);
	cr_assert(dg_rendezvous_is_aborted(worker_rendezvous(wk[0]), 8401));
}

/* A kernel fails while a sync VarRead of the step waits on the ps (its step
 * never comes): the step is aborted at once, so the read stops at its next
 * poll and the error comes well before the step's deadline, naming the node. */
Test(executor, a_failing_node_ends_the_step_without_waiting_out_a_sync_read)
{
	float zero[2] = { 0, 0 };
	struct dg_tensor *t = dg_tensor_new(DG_F32, &(struct dg_shape){ 1, { 4 } }, NULL);
	struct dg_err err = { 0 };
	struct worker_run_result res;
	char f[2048], id[24];

	cr_assert_not_null(t);
	put_f32("fw", zero, 2);
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"rd\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"fw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [2],"
		 " \"min_step_base\": %" PRId64 "}},"
		 "{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"in\","
		 " \"dtype\": \"float32\", \"shape\": [-1]}},"
		 "{\"name\": \"y1\", \"op\": \"Reshape\", \"inputs\": [\"in\"],"
		 " \"attrs\": {\"shape\": [3]}},"
		 "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"y1\"],"
		 " \"attrs\": {\"key\": \"out\", \"to\": \"%s\"}},"
		 "{\"name\": \"s2\", \"op\": \"_Send\", \"inputs\": [\"rd\"],"
		 " \"attrs\": {\"key\": \"out2\", \"to\": \"%s\"}}]}",
		 addr[1], var_step("fw") + 100, addr[0], addr[0]);
	add_fragment(0, f, id, sizeof id);
	cr_assert_eq(dg_rendezvous_put(worker_rendezvous(wk[0]), 8500, "in", t, &err), DG_OK);
	struct worker_run_opts o = { .step = 8500, .steps = 1, .train_step = 1,
				     .timeout_ms = 8000 };
	double t0 = now_s();
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_ESHAPE, "%s", err.msg);
	double took = now_s() - t0;
	cr_assert(strstr(err.msg, "node 'y1' (Reshape)"), "%s", err.msg);
	cr_assert_lt(took, 3.0, "the failed step took %g s of its 8 s deadline", took);
	cr_assert_eq(res.steps_done, 0);
	cr_assert(dg_rendezvous_is_aborted(worker_rendezvous(wk[0]), 8500));
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
	worker_run_result_deinit(&res);
}

/* With one I/O thread, busy with a sync VarRead that waits, a VarApply of the
 * same step is queued; a kernel then fails: the queued apply must not reach
 * the ps (no update from a failed step), and the step ends promptly. */
Test(executor, a_queued_apply_of_a_failed_step_does_not_reach_the_ps)
{
	struct worker_config wc = { .job = "worker", .task = 9, .io_threads = 1 };
	float zero[2] = { 0, 0 };
	struct dg_tensor *t = dg_tensor_new(DG_F32, &(struct dg_shape){ 1, { 4 } }, NULL);
	struct dg_err err = { 0 };
	struct worker_run_result res;
	struct worker *w1 = worker_new(&wc, &err);
	char f[2048], id[24];

	cr_assert_not_null(w1, "%s", err.msg);
	cr_assert_not_null(t);
	put_f32("qw", zero, 2);
	put_f32("qa", zero, 1);
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"rd\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"qw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [2],"
		 " \"min_step_base\": %" PRId64 "}},"
		 "{\"name\": \"one\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [1], \"value\": 1}}},"
		 "{\"name\": \"ap\", \"op\": \"VarApply\", \"inputs\": [\"one\"],"
		 " \"attrs\": {\"var\": \"qa\", \"ps\": \"%s\", \"rule\": \"assign_add\"}},"
		 "{\"name\": \"in\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"in\","
		 " \"dtype\": \"float32\", \"shape\": [-1]}},"
		 "{\"name\": \"y1\", \"op\": \"Reshape\", \"inputs\": [\"in\"],"
		 " \"attrs\": {\"shape\": [3]}}]}", addr[1], var_step("qw") + 100, addr[1]);
	cr_assert_eq(worker_fragment_add(w1, f, strlen(f), id, sizeof id, NULL, NULL, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(worker_rendezvous(w1), 8600, "in", t, &err), DG_OK);
	struct worker_run_opts o = { .step = 8600, .steps = 1, .train_step = 1,
				     .timeout_ms = 8000 };
	double t0 = now_s();
	cr_assert_eq(worker_run_steps(w1, id, &o, &res, &err), DG_ESHAPE, "%s", err.msg);
	cr_assert_lt(now_s() - t0, 3.0);
	cr_assert(strstr(err.msg, "task worker/9: node 'y1' (Reshape)") == err.msg, "%s",
		  err.msg);
	worker_run_result_deinit(&res);
	cr_assert_float_eq(var_elem("qa", 0), 0.0, 1e-9, "the failed step's apply reached the ps");
	worker_free(w1);
}

/* dg_http_requests_total on task i for route and method, with code (NULL:
 * every code summed); 0 when there is no such line yet. */
static double route_count(int i, const char *method, const char *route, const char *code)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char want[256];
	double n = 0;

	cr_assert_eq(req(i, "GET", "/v1/metrics", NULL, &res, &err), DG_OK, "%s", err.msg);
	snprintf(want, sizeof want, "\ndg_http_requests_total{route=\"%s\",method=\"%s\",code=\"",
		 route, method);
	for (const char *p = strstr(res.body.data, want); p; p = strstr(p + 1, want)) {
		const char *c = p + strlen(want), *sp = strchr(c, ' ');
		if (sp && (!code || !strncmp(c, code, strlen(code))))
			n += strtod(sp + 1, NULL);
	}
	dg_http_result_deinit(&res);
	return n;
}

#define VAR_ROUTE "/v1/vars/{name...}"
#define APPLY_ROUTE "/v1/vars/{name...}/apply"

/* Read aw, send its sum as "fetch:s", then apply sgd lr 0.5 with g = 1
 * (async; the read comes first: same variable, file order). */
static void async_fragment(char *f, size_t n)
{
	snprintf(f, n, "{\"nodes\": ["
		 "{\"name\": \"rd\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"aw\","
		 " \"ps\": \"%s\", \"dtype\": \"float32\", \"shape\": [3]}},"
		 "{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"rd\"]},"
		 "{\"name\": \"send\", \"op\": \"_Send\", \"inputs\": [\"s\"],"
		 " \"attrs\": {\"key\": \"fetch:s\", \"to\": \"%s\"}},"
		 "{\"name\": \"g\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "{\"dtype\": \"float32\", \"shape\": [3], \"value\": 1}}},"
		 "{\"name\": \"ap\", \"op\": \"VarApply\", \"inputs\": [\"g\"],"
		 " \"attrs\": {\"var\": \"aw\", \"ps\": \"%s\", \"rule\": \"sgd\", \"lr\": 0.5}}]}",
		 addr[1], addr[0], addr[1]);
}

Test(executor, an_async_multi_step_run_reads_the_value_its_apply_returned_without_a_get)
{
	static const char *const keys[] = { "fetch:s" };
	static const float w0[3] = { 1, 2, 3 };
	struct worker_run_opts o = { .step = 9000, .steps = 3, .train_step = 0,
				     .timeout_ms = 10000, .collect = keys, .n_collect = 1 };
	struct worker_run_result res;
	struct dg_err err = { 0 };
	char f[4096], id[24];

	put_f32("aw", w0, 3);
	async_fragment(f, sizeof f);
	add_fragment(0, f, id, sizeof id);
	double gets = route_count(1, "GET", VAR_ROUTE, NULL);
	double with_value = route_count(1, "POST", APPLY_ROUTE, "200");
	double minimal = route_count(1, "POST", APPLY_ROUTE, "204");
	/* Sum(w) before each step's apply: 6, then 1.5 less a step. */
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.steps_done, 3);
	for (int t = 0; t < 3; t++)
		cr_assert_float_eq(res.r[t].values[0], 6.0 - 1.5 * t, 1e-6, "step %d: %g", t,
				   res.r[t].values[0]);
	worker_run_result_deinit(&res);
	/* One GET (step 0); steps 0 and 1 ask for the value, the last does not. */
	cr_assert_eq(route_count(1, "GET", VAR_ROUTE, NULL) - gets, 1);
	cr_assert_eq(route_count(1, "POST", APPLY_ROUTE, "200") - with_value, 2);
	cr_assert_eq(route_count(1, "POST", APPLY_ROUTE, "204") - minimal, 1);
	cr_assert_float_eq(var_elem("aw", 2), 3 - 1.5, 1e-6);

	/* A single-step run does as before: one GET, one minimal apply; a new run
	 * starts with a GET (the value changed in between: a PUT of w0). */
	put_f32("aw", w0, 3);
	gets = route_count(1, "GET", VAR_ROUTE, NULL);
	minimal = route_count(1, "POST", APPLY_ROUTE, "204");
	o.step = 9100;
	o.steps = 1;
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(res.r[0].values[0], 6.0, 1e-6);
	worker_run_result_deinit(&res);
	cr_assert_eq(route_count(1, "GET", VAR_ROUTE, NULL) - gets, 1);
	cr_assert_eq(route_count(1, "POST", APPLY_ROUTE, "204") - minimal, 1);
	o.step = 9200;
	o.steps = 2;
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(res.r[0].values[0], 4.5, 1e-6);
	cr_assert_float_eq(res.r[1].values[0], 3.0, 1e-6);
	worker_run_result_deinit(&res);
	cr_assert_eq(route_count(1, "GET", VAR_ROUTE, NULL) - gets, 2);
}

Test(executor, a_failed_run_keeps_nothing_and_the_next_run_starts_with_a_get)
{
	static const char *const keys[] = { "fetch:s" };
	static const float w0[3] = { 1, 2, 3 };
	struct worker_run_opts o = { .step = 9300, .steps = 3, .train_step = 0,
				     .timeout_ms = 10000, .collect = keys, .n_collect = 1 };
	struct worker_run_result res;
	struct dg_err err = { 0 };
	char f[4096], id[24];

	/* The variable is gone: step 0's read fails, the run stops there. */
	async_fragment(f, sizeof f);
	add_fragment(0, f, id, sizeof id);
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_ENOTFOUND, "%s", err.msg);
	cr_assert_eq(res.steps_done, 0);
	worker_run_result_deinit(&res);
	/* Then a run that works reads the new value with a GET first. */
	put_f32("aw", w0, 3);
	double gets = route_count(1, "GET", VAR_ROUTE, NULL);
	o.step = 9400;
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	for (int t = 0; t < 3; t++)
		cr_assert_float_eq(res.r[t].values[0], 6.0 - 1.5 * t, 1e-6);
	worker_run_result_deinit(&res);
	cr_assert_eq(route_count(1, "GET", VAR_ROUTE, NULL) - gets, 1);
}

Test(executor, sync_runs_still_get_the_variable_every_step)
{
	static const char *const keys[] = { "fetch:w" };
	float zero[2] = { 0, 0 };
	struct worker_run_result res;
	struct dg_err err = { 0 };
	char f[4096], id[24];

	put_f32("sw", zero, 2);
	/* backup 1 of 2 replicas: replica 0 alone applies each step (w -= 0.5). */
	sync_fragment(f, sizeof f, 0, 1.0, 1, var_step("sw"));
	add_fragment(0, f, id, sizeof id);
	struct worker_run_opts o = { .step = 9500, .steps = 3, .train_step = 0,
				     .timeout_ms = 10000, .collect = keys, .n_collect = 1 };
	double gets = route_count(1, "GET", VAR_ROUTE, NULL);
	double values = route_count(1, "POST", APPLY_ROUTE, "200");
	cr_assert_eq(worker_run_steps(wk[0], id, &o, &res, &err), DG_OK, "%s", err.msg);
	for (int t = 0; t < 3; t++)
		cr_assert_float_eq(res.r[t].values[0], -1.0 * t, 1e-6);
	worker_run_result_deinit(&res);
	cr_assert_eq(route_count(1, "GET", VAR_ROUTE, NULL) - gets, 3);
	/* each sync apply answered its JSON (200 applied), no value asked */
	cr_assert_eq(route_count(1, "POST", APPLY_ROUTE, "200") - values, 3);
	cr_assert_float_eq(var_elem("sw", 0), -1.5, 1e-6);
}

/* ------------------------------------------- tensors carried in the run reply */

/* Task 1's half of the seed program (y2 = x - 66, sent to task 0): its _Send
 * is its last work, so a run that names task 0 as its requester may carry it. */
static void carry_fragment(char *f, size_t n)
{
	snprintf(f, n, "{\"nodes\": ["
		 "{\"name\": \"rx\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"x:0->worker/1\","
		 " \"dtype\": \"int32\"}},"
		 "{\"name\": \"c66\", \"op\": \"Const\", \"attrs\": {\"value\": 66}},"
		 "{\"name\": \"y2\", \"op\": \"Sub\", \"inputs\": [\"rx\", \"c66\"]},"
		 "{\"name\": \"sy2\", \"op\": \"_Send\", \"inputs\": [\"y2\"],"
		 " \"attrs\": {\"key\": \"y2:0->worker/0\", \"to\": \"%s\"}}]}", addr[0]);
}

static void put_i32(int task, uint64_t step, const char *key, int32_t v)
{
	struct dg_tensor *t = dg_tensor_new(DG_I32, &(struct dg_shape){ 0 }, NULL);
	struct dg_err err = { 0 };

	cr_assert_not_null(t);
	*(int32_t *)t->data = v;
	cr_assert_eq(dg_rendezvous_put(worker_rendezvous(wk[task]), step, key, t, &err), DG_OK,
		     "%s", err.msg);
}

Test(executor, a_run_naming_its_requester_carries_the_last_send_in_its_reply)
{
	char f[1024], id[24], path[96], body[256];
	struct dg_http_result res;
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	carry_fragment(f, sizeof f);
	add_fragment(1, f, id, sizeof id);
	snprintf(path, sizeof path, "/v1/fragments/%s/run", id);
	/* The raw reply: the JSON on one line, then the tensor's 4 bytes. */
	put_i32(1, 500, "x:0->worker/1", 2);
	snprintf(body, sizeof body, "{\"step\": 500, \"timeout_ms\": 5000, \"from\": \"%s\"}",
		 addr[0]);
	cr_assert_eq(req(1, "POST", path, body, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(res.content_type, "application/x-dg-run");
	const char *nl = memchr(res.body.data, '\n', res.body.len);
	cr_assert_not_null(nl);
	cr_assert_eq(res.body.len - (size_t)(nl + 1 - res.body.data), 4);
	int32_t carried;
	memcpy(&carried, nl + 1, sizeof carried);       /* the bytes follow the JSON line */
	cr_assert_eq(carried, 2 - 66);
	json_t *j = json_loadb(res.body.data, (size_t)(nl - res.body.data), 0, NULL);
	cr_assert_not_null(j);
	cr_assert_eq(json_integer_value(json_object_get(j, "nodes_run")), 4);
	json_t *e = json_array_get(json_object_get(j, "tensors"), 0);
	cr_assert_str_eq(json_string_value(json_object_get(e, "key")), "y2:0->worker/0");
	cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "int32");
	cr_assert_str_eq(json_string_value(json_object_get(e, "shape")), "[]");
	cr_assert_eq(json_integer_value(json_object_get(e, "bytes")), 4);
	json_decref(j);
	dg_http_result_deinit(&res);
	/* Nothing was PUT to task 0. */
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);

	/* The typed client reads it back as the tensor. */
	struct dg_http_client *c = dg_http_client_new(addr[1], NULL, 10000, &err);
	struct dg_task_run run = { .step = 501, .steps = 1, .train_step = -1, .timeout_ms = 5000,
				   .from = addr[0] };
	struct dg_task_carried *cv = NULL;
	int nc = 0;
	cr_assert_not_null(c, "%s", err.msg);
	put_i32(1, 501, "x:0->worker/1", 100);
	cr_assert_eq(dg_task_run(c, id, &run, NULL, &cv, &nc, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(nc, 1);
	cr_assert_str_eq(cv[0].key, "y2:0->worker/0");
	cr_assert_eq(cv[0].t->dtype, DG_I32);
	cr_assert_eq(cv[0].t->shape.ndim, 0);
	cr_assert_eq(*(int32_t *)cv[0].t->data, 34);
	dg_task_carried_free(cv, nc);

	/* Without "from" (an older master), and in a run of several steps, the
	 * _Send is a PUT as before, and the reply is plain JSON. */
	put_i32(1, 502, "x:0->worker/1", 3);
	run.step = 502;
	run.from = NULL;
	cr_assert_eq(dg_task_run(c, id, &run, NULL, &cv, &nc, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(nc, 0);
	cr_assert_null(cv);
	put_i32(1, 503, "x:0->worker/1", 4);
	put_i32(1, 504, "x:0->worker/1", 5);
	run = (struct dg_task_run){ .step = 503, .steps = 2, .train_step = 0, .timeout_ms = 5000,
				    .from = addr[0] };
	struct dg_task_run_result rr;
	cr_assert_eq(dg_task_run(c, id, &run, &rr, &cv, &nc, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(rr.steps_done, 2);
	cr_assert_eq(nc, 0);
	dg_task_run_result_deinit(&rr);
	dg_http_client_free(c);
	for (uint64_t s = 502; s <= 504; s++) {
		cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), s, "y2:0->worker/0", 0,
						&t, &err), DG_OK, "step %" PRIu64 ": %s", s, err.msg);
		cr_assert_eq(*(int32_t *)t->data, (int32_t)(s - 499) - 66);
		dg_tensor_free(t);
	}
	cr_assert_eq(metric(1, "dg_worker_tensors_sent_total{path=\"carried\"}"), 2);
	cr_assert_eq(metric(1, "dg_worker_bytes_sent_total{path=\"carried\"}"), 8);
	cr_assert_eq(metric(1, "dg_worker_tensors_sent_total{path=\"http\"}"), 3);

	/* "from" must be a string. */
	cr_assert_eq(req(1, "POST", path, "{\"step\": 510, \"from\": 7}", &res, &err), DG_EINVAL);
	cr_assert_eq(res.status, 400);
	cr_assert(strstr(err.msg, "\"from\""), "%s", err.msg);
	dg_http_result_deinit(&res);
}

struct carry_run {
	char id[24];
	uint64_t step;
	enum dg_status st;
	struct dg_err err;
	int n_carried;
	int32_t carried;
};

static void *carry_run_main(void *arg)
{
	struct carry_run *cr = arg;
	struct dg_http_client *c = dg_http_client_new(addr[1], NULL, 30000, &cr->err);
	struct dg_task_run run = { .step = cr->step, .steps = 1, .train_step = -1,
				   .timeout_ms = 10000, .from = addr[0] };
	struct dg_task_carried *cv = NULL;

	if (!c) {
		cr->st = cr->err.code;
		return NULL;
	}
	cr->st = dg_task_run(c, cr->id, &run, NULL, &cv, &cr->n_carried, NULL, &cr->err);
	if (cr->st == DG_OK && cr->n_carried == 1)
		cr->carried = *(int32_t *)cv[0].t->data;
	dg_task_carried_free(cv, cr->n_carried);
	dg_http_client_free(c);
	return NULL;
}

/* Task 1 sends a to task 0 and waits for b, which task 0 computes from a:
 * carrying a would wait for the run's end, which waits for b. So a goes as
 * a PUT while the run goes on; the fetch of c = -b, after the _Recv, is still
 * carried. */
Test(executor, a_send_that_a_recv_does_not_precede_is_not_carried)
{
	struct carry_run cr = { .step = 600 };
	struct dg_err err = { 0 };
	struct dg_tensor *a = NULL;
	char f[2048];
	pthread_t th;

	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"a\", \"op\": \"Const\", \"attrs\": {\"value\": 9}},"
		 "{\"name\": \"sa\", \"op\": \"_Send\", \"inputs\": [\"a\"],"
		 " \"attrs\": {\"key\": \"a:0->worker/0\", \"to\": \"%s\"}},"
		 "{\"name\": \"rb\", \"op\": \"_Recv\", \"attrs\": {\"key\": \"b:0->worker/1\","
		 " \"dtype\": \"int32\"}},"
		 "{\"name\": \"c\", \"op\": \"Neg\", \"inputs\": [\"rb\"]},"
		 "{\"name\": \"sc\", \"op\": \"_Send\", \"inputs\": [\"c\"],"
		 " \"attrs\": {\"key\": \"fetch:c\", \"to\": \"%s\"}}]}", addr[0], addr[0]);
	add_fragment(1, f, cr.id, sizeof cr.id);
	cr_assert_eq(pthread_create(&th, NULL, carry_run_main, &cr), 0);
	/* a arrives while task 1's run waits (well before its 10 s deadline). */
	cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), 600, "a:0->worker/0", 5000, &a,
					&err), DG_OK, "%s", err.msg);
	put_i32(1, 600, "b:0->worker/1", -*(int32_t *)a->data);
	dg_tensor_free(a);
	pthread_join(th, NULL);
	cr_assert_eq(cr.st, DG_OK, "%s", cr.err.msg);
	cr_assert_eq(cr.n_carried, 1);
	cr_assert_eq(cr.carried, 9);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
	cr_assert_eq(metric(1, "dg_worker_tensors_sent_total{path=\"http\"}"), 1);
	cr_assert_eq(metric(1, "dg_worker_tensors_sent_total{path=\"carried\"}"), 1);
}

/* A failing run carries nothing back, and a value too large to carry goes
 * as a PUT. */
Test(executor, a_failed_run_carries_nothing_and_large_values_are_put)
{
	char f[2048], id[24];
	struct dg_http_client *c = NULL;
	struct dg_err err = { 0 };
	struct dg_task_carried *cv = NULL;
	struct dg_tensor *t = NULL;
	int nc = -1;

	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"a\", \"op\": \"Const\", \"attrs\": {\"value\": 7}},"
		 "{\"name\": \"z\", \"op\": \"Const\", \"attrs\": {\"value\": 0}},"
		 "{\"name\": \"q\", \"op\": \"Div\", \"inputs\": [\"a\", \"z\"]},"
		 "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"q\"],"
		 " \"attrs\": {\"key\": \"q:0->worker/0\", \"to\": \"%s\"}}]}", addr[0]);
	add_fragment(1, f, id, sizeof id);
	c = dg_http_client_new(addr[1], NULL, 10000, &err);
	cr_assert_not_null(c, "%s", err.msg);
	struct dg_task_run run = { .step = 700, .steps = 1, .train_step = -1, .timeout_ms = 5000,
				   .from = addr[0] };
	cr_assert_neq(dg_task_run(c, id, &run, NULL, &cv, &nc, NULL, &err), DG_OK);
	cr_assert(strstr(err.msg, "node 'q' (Div)"), "%s", err.msg);
	cr_assert_eq(nc, 0);
	cr_assert_null(cv);

	/* 32768 float32 = 128 KiB, past WORKER_MAX_CARRY_BYTES. */
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"big\", \"op\": \"Fill\", \"attrs\": {\"shape\": [32768],"
		 " \"value\": 1.5, \"dtype\": \"float32\"}},"
		 "{\"name\": \"s\", \"op\": \"_Send\", \"inputs\": [\"big\"],"
		 " \"attrs\": {\"key\": \"big:0->worker/0\", \"to\": \"%s\"}}]}", addr[0]);
	add_fragment(1, f, id, sizeof id);
	run.step = 701;
	cr_assert_eq(dg_task_run(c, id, &run, NULL, &cv, &nc, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(nc, 0);
	cr_assert_eq(dg_rendezvous_take(worker_rendezvous(wk[0]), 701, "big:0->worker/0", 0, &t,
					&err), DG_OK, "%s", err.msg);
	cr_assert_eq(t->numel, 32768);
	cr_assert_float_eq(dg_tensor_get_f64(t, 32767), 1.5, 1e-9);
	dg_tensor_free(t);
	dg_http_client_free(c);
}

struct feed_run {
	struct worker_run_opts o;
	struct worker_run_result res;
	enum dg_status st;
	struct dg_err err;
	const char *id;
};

static void *run_feed_thread(void *arg)
{
	struct feed_run *fr = arg;

	fr->st = worker_run_steps(wk[0], fr->id, &fr->o, &fr->res, &fr->err);
	return NULL;
}

/* The queue ops against task 1's queue: a feeder fragment enqueues 10
 * examples (value v, id v) twice; a training fragment dequeues leased batches
 * of 3, sums them and acks; its run ends cleanly at the queue's end. */
Test(executor, a_queue_fed_run_applies_every_example_once_per_epoch_and_ends_cleanly)
{
	static const char comps[] = "[{\"dtype\": \"float32\", \"shape\": []},"
				    " {\"dtype\": \"int64\", \"shape\": []}]";
	char f[4096], feed_id[24], train_id[24];
	const char *keys[] = { "fetch:s", "fetch:applied" };
	struct worker_run_opts o = { .step = 900, .steps = 50, .train_step = 0,
				     .timeout_ms = 10000, .collect = keys, .n_collect = 2 };
	struct worker_run_opts fo = { .step = 800, .steps = 1, .train_step = 0,
				      .timeout_ms = 10000 };
	struct worker_run_result res;
	struct dg_err err = { 0 };
	struct dg_client *c = dg_client_new(addr[1], NULL, &err);
	struct dg_queue_spec spec = { .capacity = 8, .n_components = 2, .has_ids = true,
				      .ids = 1 };
	json_t *state = NULL;

	spec.dtype[0] = DG_F32;
	spec.dtype[1] = DG_I64;
	cr_assert_eq(dg_queue_create(c, "q", &spec, &err), DG_OK, "%s", err.msg);
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"x\", \"op\": \"Const\", \"attrs\": {\"value\": "
		 "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], \"dtype\": \"float32\"}},"
		 "{\"name\": \"feed\", \"op\": \"QueueEnqueueMany\", \"inputs\": [\"x\"],"
		 " \"attrs\": {\"queue\": \"q\", \"ps\": \"%s\", \"components\": %s, \"ids\": 1,"
		 " \"epochs\": 2, \"chunk\": 4, \"threads\": 2, \"shuffle\": false}}]}",
		 addr[1], comps);
	add_fragment(0, f, feed_id, sizeof feed_id);
	snprintf(f, sizeof f, "{\"nodes\": ["
		 "{\"name\": \"b\", \"op\": \"QueueDequeueMany\", \"attrs\": {\"queue\": \"q\","
		 " \"ps\": \"%s\", \"components\": %s, \"batch\": 3, \"lease_ms\": 60000,"
		 " \"holder\": \"test/r0\"}},"
		 "{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"b:0\"]},"
		 "{\"name\": \"ack\", \"op\": \"QueueAck\", \"inputs\": [\"b:2\"],"
		 " \"attrs\": {\"queue\": \"q\", \"ps\": \"%s\"}},"
		 "{\"name\": \"sends\", \"op\": \"_Send\", \"inputs\": [\"s\"],"
		 " \"attrs\": {\"key\": \"fetch:s\", \"to\": \"%s\"}},"
		 "{\"name\": \"senda\", \"op\": \"_Send\", \"inputs\": [\"ack:0\"],"
		 " \"attrs\": {\"key\": \"fetch:applied\", \"to\": \"%s\"}}]}",
		 addr[1], comps, addr[1], addr[0], addr[0]);
	add_fragment(0, f, train_id, sizeof train_id);

	/* The feeder blocks on the full queue (capacity 8 < 20): run it beside. */
	struct feed_run ft = { .o = fo, .id = feed_id };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, run_feed_thread, &ft), 0);
	cr_assert_eq(worker_run_steps(wk[0], train_id, &o, &res, &err), DG_OK, "%s", err.msg);
	pthread_join(th, NULL);
	cr_assert_eq(ft.st, DG_OK, "%s", ft.err.msg);
	worker_run_result_deinit(&ft.res);
	/* 20 examples in batches of 3: 6 full, a short one of 2, then the end. */
	cr_assert(res.input_end);
	cr_assert_eq(res.steps_done, 7);
	double sum = 0, applied = 0;
	for (int i = 0; i < res.steps_done; i++) {
		sum += res.r[i].values[0];
		applied += res.r[i].values[1];
	}
	cr_assert_float_eq(sum, 2 * 45.0, 1e-9);
	cr_assert_float_eq(applied, 20.0, 1e-9);
	worker_run_result_deinit(&res);
	cr_assert_eq(dg_queue_state(c, "q", &state, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(json_integer_value(json_object_get(state, "acked")), 20);
	cr_assert_eq(json_integer_value(json_object_get(state, "ids_complete")), 10);
	cr_assert_eq(json_integer_value(json_object_get(state, "leased")), 0);
	cr_assert(json_is_true(json_object_get(state, "closed")));
	json_decref(state);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
	dg_client_free(c);
}
