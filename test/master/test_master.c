/* The master: placement rules and partitioning as pure functions (place.h),
 * then a whole job end to end on two in-process servers (ps_server_start with
 * the worker and master route groups on loopback port 0) driven through the
 * jobs API (master.h): the seed program prints 238 with its halves on two
 * different tasks. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <unistd.h>

#include "dg/cluster.h"
#include "dg/codec.h"
#include "dg/executor.h"
#include "dg/graph.h"
#include "dg/http.h"
#include "dg/master.h"
#include "dg/place.h"
#include "server.h"
#include "master_test_util.h"
#include "cluster_test_util.h"

/* ------------------------------------------------------------ helpers */

static const char cluster2[] =
	"{'ps': ['127.0.0.1:7000', '127.0.0.1:7001'],"
	" 'worker': ['127.0.0.1:7010', '127.0.0.1:7011']}";

/* "/job:worker/task:1": the task (never the GPU) of node name. */
static const char *dev_of(const struct placed *x, const char *name)
{
	static char buf[128];
	int n = dg_graph_find(x->g, name);

	cr_assert_geq(n, 0, "no node %s", name);
	place_device_name(x->c, x->p.task[n], buf, sizeof buf);
	return buf;
}

static const char seed_sum[] =
	"{'nodes': ["
	"{'name':'x','op':'Const','attrs':{'value':2},'device':'/job:worker/task:0'},"
	"{'name':'c300','op':'Const','attrs':{'value':300},'device':'/job:worker/task:0'},"
	"{'name':'y1','op':'Add','inputs':['x','c300'],'device':'/job:worker/task:0'},"
	"{'name':'c66','op':'Const','attrs':{'value':66},'device':'/job:worker/task:1'},"
	"{'name':'y2','op':'Sub','inputs':['x','c66'],'device':'/job:worker/task:1'},"
	"{'name':'y','op':'Add','inputs':['y1','y2'],'device':'/job:worker/task:0'}"
	"], 'fetch': ['y']}";

/* ---------------------------------------------------------- placement */

Test(place, explicit_devices_are_kept_in_every_spelling)
{
	struct placed x;

	placed_init(&x, cluster2, "{'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':1},'device':'/job:worker/task:1'},"
		"{'name':'b','op':'Const','attrs':{'value':1},'device':'/job:worker/task:0/cpu:0'},"
		"{'name':'d','op':'Const','attrs':{'value':1},"
		"'device':'/job:worker/replica:0/task:1/device:CPU:0'},"
		"{'name':'e','op':'Add','inputs':['a','b'],'device':'/job:ps/task:1'}]}", NULL);
	cr_assert_str_eq(dev_of(&x, "a"), "/job:worker/task:1");
	cr_assert_str_eq(dev_of(&x, "b"), "/job:worker/task:0");
	cr_assert_str_eq(dev_of(&x, "d"), "/job:worker/task:1");
	cr_assert_str_eq(dev_of(&x, "e"), "/job:ps/task:1");
	cr_assert_str_eq(x.p.why[dg_graph_find(x.g, "e")], "explicit");
	placed_deinit(&x);
}

Test(place, partial_specs_are_filled_in_on_worker_tasks)
{
	struct placed x;

	placed_init(&x, cluster2, "{'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':1},'device':'/job:worker'},"
		"{'name':'b','op':'Const','attrs':{'value':1},'device':'/cpu:0'},"
		"{'name':'s','op':'Add','inputs':['a','b']},"
		"{'name':'t','op':'Neg','inputs':['s'],'device':'/job:ps'}]}", NULL);
	/* Nothing without a job lands on a ps task; /job:ps keeps t on a ps task. */
	cr_assert_eq(strncmp(dev_of(&x, "a"), "/job:worker/", 12), 0);
	cr_assert_eq(strncmp(dev_of(&x, "b"), "/job:worker/", 12), 0);
	cr_assert_eq(strncmp(dev_of(&x, "s"), "/job:worker/", 12), 0);
	cr_assert_eq(strncmp(dev_of(&x, "t"), "/job:ps/", 8), 0);
	/* Sources follow their consumer: no transfer needed for s. */
	cr_assert_eq(x.p.task[dg_graph_find(x.g, "a")], x.p.task[dg_graph_find(x.g, "s")]);
	cr_assert_eq(x.p.task[dg_graph_find(x.g, "b")], x.p.task[dg_graph_find(x.g, "s")]);
	placed_deinit(&x);
}

Test(place, unknown_job_or_task_is_invalid_and_names_node_device_and_jobs)
{
	struct dg_cluster *c = cl(cluster2);
	struct dg_graph *g = gr("{'nodes': [{'name':'y1','op':'Const','attrs':{'value':1},"
				"'device':'/job:local/task:1'}]}");
	struct dg_graph *g2 = gr("{'nodes': [{'name':'y2','op':'Const','attrs':{'value':1},"
				 "'device':'/job:worker/task:2'}]}");
	struct dg_graph *g3 = gr("{'nodes': [{'name':'y3','op':'Const','attrs':{'value':1},"
				 "'device':'/jobworker'}]}");
	struct placement p;
	struct dg_err err = { 0 };

	cr_assert_eq(place_graph(g, c, NULL, &p, &err), DG_EINVAL);
	cr_assert_str_eq(err.msg, "node 'y1' is placed on /job:local/task:1, but the cluster has "
			 "no job 'local' (jobs: ps, worker)");
	cr_assert_null(p.task);
	cr_assert_eq(place_graph(g2, c, NULL, &p, &err), DG_EINVAL);
	cr_assert_str_eq(err.msg, "node 'y2' is placed on /job:worker/task:2, but job 'worker' "
			 "has 2 tasks (0..1)");
	cr_assert_eq(place_graph(g3, c, NULL, &p, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "node 'y3': device '/jobworker' is not a device name"), "%s",
		  err.msg);
	dg_graph_free(g);
	dg_graph_free(g2);
	dg_graph_free(g3);
	dg_cluster_free(c);
}

Test(place, gpu_without_gpu_fails_unless_soft_placement)
{
	/* Not placed_init: the first placement must fail. */
	struct placed x = {
		.c = cl(cluster2),
		.g = gr("{'nodes': [{'name':'y1','op':'Const','attrs':{'value':1},"
			"'device':'/job:worker/task:0/gpu:0'},"
			"{'name':'y2','op':'Const','attrs':{'value':1},"
			"'device':'/device:GPU:0'}]}"),
	};
	struct place_opts soft = { .soft_placement = true };
	bool gpus[4] = { false, false, false, true };
	struct place_opts has = { .task_gpu = gpus };
	struct dg_err err = { 0 };

	cr_assert_eq(place_graph(x.g, x.c, NULL, &x.p, &err), DG_EUNSUPPORTED);
	cr_assert_str_eq(err.msg, "node 'y1' is placed on /job:worker/task:0/gpu:0, but that task "
			 "has no GPU");
	cr_assert_eq(place_graph(x.g, x.c, &soft, &x.p, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(dev_of(&x, "y1"), "/job:worker/task:0");
	cr_assert(x.p.soft[0] && x.p.soft[1]);
	char *ex = place_explain(x.g, x.c, &x.p, NULL);
	cr_assert(strstr(ex, "soft placement: asked for /job:worker/task:0/gpu:0"), "%s", ex);
	free(ex);
	placement_deinit(&x.p);
	/* A partial "/gpu:0" goes to the worker task that has one. */
	cr_assert_eq(place_graph(x.g, x.c, &has, &x.p, &err), DG_EUNSUPPORTED);
	placement_deinit(&x.p);
	dg_graph_free(x.g);
	x.g = gr("{'nodes': [{'name':'y2','op':'Const','attrs':{'value':1},"
		 "'device':'/gpu:0'}]}");
	cr_assert_eq(place_graph(x.g, x.c, &has, &x.p, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(dev_of(&x, "y2"), "/job:worker/task:1");
	cr_assert_not(x.p.soft[0]);
	placed_deinit(&x);
}

static const char four_vars[] = "{'nodes': ["
	"{'name':'w1','op':'Variable','attrs':{'shape':[1000]}},"
	"{'name':'w2','op':'Variable','attrs':{'shape':[10]}},"
	"{'name':'w3','op':'Variable','attrs':{'shape':[10]}},"
	"{'name':'w4','op':'Variable','attrs':{'shape':[10]}}]}";

Test(place, variables_go_to_ps_tasks_round_robin)
{
	struct place_opts rr = { .vars = PLACE_VARS_ROUND_ROBIN };
	struct placed x;

	placed_init(&x, cluster2, four_vars, &rr);
	cr_assert_str_eq(dev_of(&x, "w1"), "/job:ps/task:0");
	cr_assert_str_eq(dev_of(&x, "w2"), "/job:ps/task:1");
	cr_assert_str_eq(dev_of(&x, "w3"), "/job:ps/task:0");
	cr_assert_str_eq(dev_of(&x, "w4"), "/job:ps/task:1");
	cr_assert_str_eq(x.p.why[0], "variable");
	placed_deinit(&x);
}

Test(place, variables_by_bytes_fill_the_emptiest_ps_first)
{
	int64_t held[4] = { 0, 100, 0, 0 };   /* ps/1 already holds 100 bytes */
	struct place_opts by = { .task_bytes = held };
	struct placed x;

	placed_init(&x, cluster2, four_vars, &by);
	/* w1 (4000 bytes) on the empty ps/0; then w2..w4 (40 each) all on ps/1
	 * (100, 140, 180 < 4000). */
	cr_assert_str_eq(dev_of(&x, "w1"), "/job:ps/task:0");
	cr_assert_str_eq(dev_of(&x, "w2"), "/job:ps/task:1");
	cr_assert_str_eq(dev_of(&x, "w3"), "/job:ps/task:1");
	cr_assert_str_eq(dev_of(&x, "w4"), "/job:ps/task:1");
	placed_deinit(&x);
}

Test(place, consumer_is_colocated_with_its_large_input)
{
	struct placed x;

	/* big (1 MiB) lives on worker/1; small work already loads worker/1 more,
	 * yet Sum(big) goes there: moving 1 MiB costs more than the imbalance. */
	placed_init(&x, cluster2, "{'nodes': ["
		"{'name':'big','op':'Const','attrs':{'value':{'dtype':'float32',"
		"'shape':[262144],'value':1}},'device':'/job:worker/task:1'},"
		"{'name':'sq','op':'Square','inputs':['big'],'device':'/job:worker/task:1'},"
		"{'name':'s','op':'Sum','inputs':['sq']}]}", NULL);
	cr_assert_str_eq(dev_of(&x, "s"), "/job:worker/task:1");
	cr_assert_str_eq(x.p.why[dg_graph_find(x.g, "s")], "colocated");
	placed_deinit(&x);
}

Test(place, variable_op_validates_its_attrs)
{
	struct dg_err err = { 0 };
	char *bad = dq("{'nodes': [{'name':'w','op':'Variable','attrs':"
		       "{'shape':[2],'init':'random'}}]}");
	char *unknown = dq("{'nodes': [{'name':'w','op':'Variable','attrs':{'shape':[-1]}}]}");

	cr_assert_null(dg_graph_parse(bad, strlen(bad), master_op_find, &err));
	cr_assert(strstr(err.msg, "attr 'init' is 'random'"), "%s", err.msg);
	cr_assert_null(dg_graph_parse(unknown, strlen(unknown), master_op_find, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	free(bad);
	free(unknown);
}

/* ------------------------------------------------------- partitioning */

/* The node called name in fragment f, or NULL. */
static json_t *frag_node(const struct place_fragment *f, const char *name)
{
	size_t i;
	json_t *n;

	json_array_foreach(json_object_get(f->doc, "nodes"), i, n)
		if (strcmp(json_string_value(json_object_get(n, "name")), name) == 0)
			return n;
	return NULL;
}

static int count_op(const struct place_fragment *f, const char *op)
{
	size_t i;
	json_t *n;
	int k = 0;

	json_array_foreach(json_object_get(f->doc, "nodes"), i, n)
		k += strcmp(json_string_value(json_object_get(n, "op")), op) == 0;
	return k;
}

static const char *attr_s(json_t *n, const char *key)
{
	return json_string_value(json_object_get(json_object_get(n, "attrs"), key));
}

Test(partition, seed_program_has_one_transfer_per_tensor_per_task)
{
	struct placed x;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster2, seed_sum, NULL);
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 2, NULL, 0, NULL, 0, &part, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(part.n_frags, 2);
	cr_assert_eq(part.n_init, 0);
	const struct place_fragment *w0 = &part.frags[0], *w1 = &part.frags[1];
	cr_assert_eq(w0->task, 2);
	cr_assert_eq(w1->task, 3);
	/* x crosses to worker/1, y2 comes back, y is fetched to the master (w0). */
	json_t *sx = frag_node(w0, "_send/x/0/worker/1");
	cr_assert_not_null(sx);
	cr_assert_str_eq(attr_s(sx, "key"), "x:0->worker/1");
	cr_assert_str_eq(attr_s(sx, "to"), "127.0.0.1:7011");
	json_t *rx = frag_node(w1, "_recv/x/0");
	cr_assert_not_null(rx);
	cr_assert_str_eq(attr_s(rx, "key"), "x:0->worker/1");
	cr_assert_str_eq(attr_s(rx, "dtype"), "int32");
	json_t *y2 = frag_node(w1, "y2");
	cr_assert_str_eq(json_string_value(json_array_get(json_object_get(y2, "inputs"), 0)),
			 "_recv/x/0");
	cr_assert_not_null(frag_node(w0, "_recv/y2/0"));
	json_t *fs = frag_node(w0, "_fetch/0");
	cr_assert_str_eq(attr_s(fs, "key"), "fetch:y");
	cr_assert_str_eq(attr_s(fs, "to"), "127.0.0.1:7010");
	cr_assert_eq(count_op(w0, "_Send"), 2);
	cr_assert_eq(count_op(w0, "_Recv"), 1);
	cr_assert_eq(count_op(w1, "_Send"), 1);
	cr_assert_eq(count_op(w1, "_Recv"), 1);
	cr_assert_eq(part.n_fetch, 1);
	cr_assert_str_eq(part.fetch_keys[0], "fetch:y");
	char *ex = place_explain(x.g, x.c, &x.p, &part);
	cr_assert(strstr(ex, "y1    /job:worker/task:0"), "%s", ex);
	cr_assert(strstr(ex, "y2    /job:worker/task:1"), "%s", ex);
	cr_assert(strstr(ex, "send  x -> 127.0.0.1:7011  key x:0->worker/1"), "%s", ex);
	free(ex);
	partition_deinit(&part);
	placed_deinit(&x);
}

Test(partition, two_consumers_on_one_task_share_one_transfer)
{
	struct placed x;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster2, "{'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':[1,2]},'device':'/job:worker/task:0'},"
		"{'name':'u','op':'Neg','inputs':['a'],'device':'/job:worker/task:1'},"
		"{'name':'v','op':'Add','inputs':['a','a'],'device':'/job:worker/task:1'},"
		"{'name':'w','op':'Add','inputs':['u','v'],'device':'/job:worker/task:1'}],"
		"'fetch': ['w', 'u']}", NULL);
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 2, NULL, 0, NULL, 0, &part, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(part.n_frags, 2);
	cr_assert_eq(count_op(&part.frags[0], "_Send"), 1);      /* a -> worker/1, once */
	cr_assert_eq(count_op(&part.frags[1], "_Recv"), 1);
	cr_assert_eq(count_op(&part.frags[1], "_Send"), 2);      /* fetches w and u */
	cr_assert_eq(count_op(&part.frags[0], "_Recv"), 0);
	json_t *v = frag_node(&part.frags[1], "v");
	cr_assert_str_eq(json_string_value(json_array_get(json_object_get(v, "inputs"), 1)),
			 "_recv/a/0");
	partition_deinit(&part);
	placed_deinit(&x);
}

Test(partition, feeds_fetches_and_variables)
{
	const char *feeds[] = { "x" }, *fetch[] = { "q", "w" };
	struct placed x;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster2, "{'nodes': ["
		"{'name':'x','op':'Placeholder','attrs':{'dtype':'float32','shape':[3]},"
		"'device':'/job:worker/task:1'},"
		"{'name':'w','op':'Variable','attrs':{'shape':[3],'init':'ones'}},"
		"{'name':'p','op':'Mul','inputs':['x','w'],'device':'/job:worker/task:1'},"
		"{'name':'q','op':'Add','inputs':['p','w'],'device':'/job:worker/task:0'},"
		"{'name':'unused','op':'Placeholder'}],"
		"'fetch': ['q']}", NULL);
	cr_assert_str_eq(dev_of(&x, "w"), "/job:ps/task:0");
	/* Without the feed: the needed placeholder must be fed. */
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 2, NULL, 0, NULL, 0, &part, &err),
		     DG_EINVAL);
	cr_assert_str_eq(err.msg, "placeholder 'x' must be fed");
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 2, feeds, 1, fetch, 2, &part, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(part.n_feeds, 1);
	cr_assert_eq(part.feeds[0].task, 3);
	cr_assert_str_eq(part.feeds[0].key, "feed:x");
	cr_assert_eq(part.n_init, 1);
	cr_assert_eq(part.init[0].task, 0);
	json_t *vi = frag_node(&part.init[0], "w");
	cr_assert_str_eq(json_string_value(json_object_get(vi, "op")), "VarInit");
	cr_assert_str_eq(attr_s(vi, "ps"), "127.0.0.1:7000");
	cr_assert_str_eq(attr_s(vi, "init"), "ones");
	cr_assert_str_eq(attr_s(vi, "var"), "w");
	/* Each task reading w gets its own VarRead; the master task reads it once
	 * for q and the fetch of w. */
	const struct place_fragment *w0 = &part.frags[0], *w1 = &part.frags[1];
	cr_assert_eq(count_op(w0, "VarRead"), 1);
	cr_assert_eq(count_op(w1, "VarRead"), 1);
	json_t *rx = frag_node(w1, "x");
	cr_assert_str_eq(json_string_value(json_object_get(rx, "op")), "_Recv");
	cr_assert_str_eq(attr_s(rx, "key"), "feed:x");
	cr_assert_eq(part.n_fetch, 2);
	cr_assert_str_eq(part.fetch_keys[1], "fetch:w");
	cr_assert_null(frag_node(w0, "unused"));
	cr_assert_null(frag_node(w1, "unused"));
	partition_deinit(&part);
	placed_deinit(&x);
}

/* ------------------------------------------------- jobs on two servers */

/* Task 2 (job "down") is never started. */
static void jobs_setup(void)
{
	cluster_start("{'worker': ['127.0.0.1:3', '127.0.0.1:2'], 'down': ['127.0.0.1:1']}");
}

static void jobs_teardown(void)
{
	cluster_stop();
}

TestSuite(jobs, .init = jobs_setup, .fini = jobs_teardown, .timeout = 60);

Test(jobs, seed_program_prints_238_with_halves_on_two_tasks)
{
	char *body = malloc(strlen(seed_sum) + 64);
	json_t *st;

	sprintf(body, "{'graph': %s, 'steps': 3}", seed_sum);
	const char *id = run_job(body, &st);
	free(body);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done",
			 "%s", json_dumps(st, 0));
	cr_assert_eq(json_integer_value(json_object_get(st, "steps_done")), 3);
	json_t *pl = json_object_get(st, "placement");
	cr_assert_str_eq(json_string_value(json_object_get(pl, "y1")), "/job:worker/task:0");
	cr_assert_str_eq(json_string_value(json_object_get(pl, "y2")), "/job:worker/task:1");
	cr_assert(strstr(json_string_value(json_object_get(st, "explain")), "key x:0->worker/1"));
	cr_assert_eq(json_array_size(json_object_get(st, "tasks")), 2);
	cr_assert_float_eq(result_value(id, "y"), 238.0, 1e-9);
	json_decref(st);
}

Test(jobs, uploaded_feed_reaches_its_task)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	const char *body = "{'graph': {'nodes': ["
		"{'name':'x','op':'Placeholder','attrs':{'dtype':'float32','shape':[4]},"
		"'device':'/job:worker/task:1'},"
		"{'name':'s','op':'Sum','inputs':['x'],'device':'/job:worker/task:1'},"
		"{'name':'k','op':'Const','attrs':{'value':0.5},'device':'/job:worker/task:0'},"
		"{'name':'m','op':'Mul','inputs':['s','k'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['m', 's'], 'upload': ['x'], 'start': false}";
	float x[4] = { 1, 2, 3, 4.5f };
	struct dg_http_header h[] = { { "Dg-Dtype", "float32" }, { "Dg-Shape", "4" } };
	char path[128], id[32];

	cr_assert_eq(req("POST", "/v1/jobs", body, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	json_t *j = body_json(&res);
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "created");
	snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
	json_decref(j);
	dg_http_result_deinit(&res);
	/* Starting before the upload is refused. */
	snprintf(path, sizeof path, "/v1/jobs/%s/start", id);
	cr_assert_eq(req("POST", path, NULL, NULL, 0, &res, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "feed 'x' was not uploaded"), "%s", err.msg);
	dg_http_result_deinit(&res);
	snprintf(path, sizeof path, "/v1/jobs/%s/feeds/x", id);
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(cli, "PUT", path, h, 2, x, sizeof x, &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(res.status, 204);
	dg_http_result_deinit(&res);
	snprintf(path, sizeof path, "/v1/jobs/%s/start", id);
	cr_assert_eq(req("POST", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	dg_http_result_deinit(&res);
	for (int i = 0; i < 200; i++) {
		json_t *st;
		snprintf(path, sizeof path, "/v1/jobs/%s", id);
		cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
		st = body_json(&res);
		dg_http_result_deinit(&res);
		bool done = strcmp(json_string_value(json_object_get(st, "state")), "running") != 0;
		if (done)
			cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done");
		json_decref(st);
		if (done)
			break;
		usleep(10000);
	}
	cr_assert_float_eq(result_value(id, "m"), 5.25, 1e-6);
	cr_assert_float_eq(result_value(id, "s"), 10.5, 1e-6);
}

Test(jobs, failing_node_fails_the_job_naming_task_and_node)
{
	json_t *st;
	const char *body = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':7},'device':'/job:worker/task:0'},"
		"{'name':'z','op':'Const','attrs':{'value':0},'device':'/job:worker/task:1'},"
		"{'name':'q','op':'Div','inputs':['a','z'],'device':'/job:worker/task:1'},"
		"{'name':'r','op':'Neg','inputs':['q'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['r'], 'timeout_ms': 20000}";

	run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "failed");
	const char *msg = json_string_value(json_object_get(json_object_get(st, "error"),
							    "message"));
	cr_assert(strstr(msg, "worker/1") && strstr(msg, "node 'q' (Div)"), "%s", msg);
	/* Task 0's _Recv was released by the abort, not by its 20 s deadline. */
	cr_assert_lt(json_real_value(json_object_get(json_object_get(st, "ms"), "total")), 10000.0);
	json_decref(st);
}

Test(jobs, bad_submissions_are_4xx_and_name_the_problem)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': [{'name':'y','op':"
			 "'Const','attrs':{'value':1},'device':'/job:local/task:1'}]}}",
			 NULL, 0, &res, &err), DG_EINVAL);
	cr_assert_eq(res.status, 400);
	cr_assert(strstr(err.msg, "no job 'local' (jobs: worker, down)"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': [{'name':'y','op':"
			 "'Const','attrs':{'value':1},'device':'/job:down/task:0'}]}, "
			 "'fetch': ['y']}", NULL, 0, &res, &err), DG_EUNAVAILABLE);
	cr_assert(strstr(err.msg, "task /job:down/task:0 (127.0.0.1:1) does not answer"), "%s",
		  err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': []}, 'stepz': 2}", NULL, 0,
			 &res, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "unknown job key 'stepz'"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': [{'name':'y','op':'Ad'}]}}",
			 NULL, 0, &res, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "unknown op 'Ad'"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("GET", "/v1/jobs/j999", NULL, NULL, 0, &res, &err), DG_ENOTFOUND);
	cr_assert_eq(res.status, 404);
	dg_http_result_deinit(&res);
}

Test(jobs, variables_are_initialised_once_and_read_where_used)
{
	json_t *st;
	const char *body = "{'graph': {'nodes': ["
		"{'name':'w','op':'Variable','attrs':{'shape':[3],'init':'ones',"
		"'var':'test/w'}},"
		"{'name':'s','op':'Sum','inputs':['w'],'device':'/job:worker/task:1'},"
		"{'name':'t','op':'Mul','inputs':['s','w'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['t', 'w'], 'steps': 2}";

	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	const char *ex = json_string_value(json_object_get(st, "explain"));
	cr_assert(strstr(ex, "init fragment"), "%s", ex);
	cr_assert(strstr(ex, "VarRead("), "%s", ex);
	cr_assert_float_eq(result_value(id, "t"), 3.0, 1e-6);
	cr_assert_float_eq(result_value(id, "w"), 1.0, 1e-6);
	json_decref(st);
}

/* Run the job g (a format with one %s for the fetch) fetching name; its value. */
static double fetch_value(const char *g, const char *name)
{
	char body[1024];
	json_t *st;

	snprintf(body, sizeof body, g, name);
	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	json_decref(st);
	return result_value(id, name);
}

/* Assign and AssignAdd write a Variable on its ps (TensorFlow's tf.assign, what
 * Python's initialisers run): the value replaces it, or adds to it; an int64
 * counter counts; a value of another dtype than the Variable's is refused. */
Test(jobs, assign_and_assign_add_write_the_variable_on_its_ps)
{
#define W0 "'/job:worker/task:0'"
#define W1 "'/job:worker/task:1'"
	struct dg_http_result res;
	struct dg_err err = { 0 };
	const char *g = "{'graph': {'nodes': ["
		"{'name':'w','op':'Variable','attrs':{'shape':[2],'init':'ones','var':'test/aw'},"
		"'device':" W0 "},"
		"{'name':'n','op':'Variable','attrs':{'shape':[],'dtype':'int64','var':'test/an'},"
		"'device':" W1 "},"
		"{'name':'v','op':'Const','attrs':{'value':[5.0, 2.0]},'device':" W0 "},"
		"{'name':'one','op':'Const','attrs':{'value':1,'dtype':'int64'},'device':" W1 "},"
		"{'name':'a','op':'Assign','inputs':['v'],'attrs':{'variable':'w'},'device':" W0 "},"
		"{'name':'b','op':'AssignAdd','inputs':['v'],'attrs':{'variable':'w'},'device':" W0 "},"
		"{'name':'c','op':'AssignAdd','inputs':['one'],'attrs':{'variable':'n'},'device':" W1 "},"
		"{'name':'s','op':'Sum','inputs':['w'],'device':" W1 "}]}, 'fetch': ['%s']}";

	cr_assert_float_eq(fetch_value(g, "s"), 2.0, 1e-6);     /* created: ones */
	fetch_value(g, "a");
	cr_assert_float_eq(fetch_value(g, "s"), 7.0, 1e-6);
	fetch_value(g, "b");
	cr_assert_float_eq(fetch_value(g, "s"), 14.0, 1e-6);
	fetch_value(g, "c");
	fetch_value(g, "c");
	cr_assert_float_eq(fetch_value(g, "n"), 2.0, 1e-6);

	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': ["
			 "{'name':'w','op':'Variable','attrs':{'shape':[2],'var':'test/aw'},'device':"
			 W0 "},"
			 "{'name':'one','op':'Const','attrs':{'value':1,'dtype':'int64'},'device':" W0 "},"
			 "{'name':'a','op':'Assign','inputs':['one'],'attrs':{'variable':'w'},'device':" W0 "}]},"
			 "'fetch': ['a']}", NULL, 0, &res, &err), DG_EDTYPE);
#undef W0
#undef W1
	cr_assert_eq(res.status, 400);
	cr_assert(strstr(err.msg, "node 'a' (Assign): the input is int64 but variable 'w' is "
			 "float32"), "%s", err.msg);
	dg_http_result_deinit(&res);
}

/* A Variable placed by the master (no device) stays on the task that holds
 * it: a later job reads what an earlier one wrote, although the bytes on
 * the tasks would now send a new variable to the other one. */
Test(jobs, a_variable_is_found_where_an_earlier_job_put_it)
{
	const char *g = "{'graph': {'nodes': ["
		"{'name':'w','op':'Variable','attrs':{'shape':[1000],'init':'zeros',"
		"'var':'test/placed'}},"
		"{'name':'five','op':'Fill','attrs':{'shape':[1000],'value':5.0}},"
		"{'name':'a','op':'Assign','inputs':['five'],'attrs':{'variable':'w'}},"
		"{'name':'s','op':'Sum','inputs':['w']}]}, 'fetch': ['%s']}";

	fetch_value(g, "a");
	for (int i = 0; i < 3; i++) {
		double got = fetch_value(g, "s");
		cr_assert_float_eq(got, 5000.0, 1e-6, "read %d: %g", i, got);
	}
}

/* A Queue in plain jobs (Python's FIFOQueue in sess.run): the first job that
 * names it creates it on its task, later ones find what the earlier ones
 * enqueued (also under another node name with attr shared_name); QueueSize
 * and QueueClose need only its name; the same name with other settings is
 * refused before anything runs. */
Test(jobs, a_queue_outlives_the_plain_job_that_made_it)
{
#define W0 "'/job:worker/task:0'"
#define Q "{'name':'pq','op':'Queue','attrs':{'capacity':%d,'components':" \
	"[{'dtype':'float32','shape':[2]}]},'device':" W0 "},"
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char g[1024], body[1024];
	const char *nodes = "{'graph': {'nodes': [" Q
		"{'name':'v','op':'Const','attrs':{'value':[[1.0,2],[3,4],[5,6]]},'device':" W0 "},"
		"{'name':'enq','op':'QueueEnqueueMany','inputs':['v'],'attrs':{'queue':'pq',"
		"'epochs':1,'shuffle':false,'close':false},'device':" W0 "},"
		"{'name':'size','op':'QueueSize','attrs':{'queue':'pq'},'device':" W0 "},"
		"{'name':'close','op':'QueueClose','attrs':{'queue':'pq'},'device':" W0 "},"
		"{'name':'d','op':'QueueDequeueMany','attrs':{'queue':'pq','batch':2},'device':" W0 "},"
		"{'name':'s','op':'Sum','inputs':['d'],'device':" W0 "}]}, 'fetch': ['%%s']}";

	/* Each fetch once: cr_assert_float_eq would run its job twice. */
	const char *order[] = { "enq", "size", "s", "size", "close" };
	const double want[] = { 3, 3, 10 /* 1 + 2 + 3 + 4: FIFO */, 1, 1 };
	snprintf(g, sizeof g, nodes, 10);
	for (int i = 0; i < 5; i++) {
		double got = fetch_value(g, order[i]);
		cr_assert_float_eq(got, want[i], 1e-6, "%s: %g", order[i], got);
	}

	/* another node naming the same queue by its shared_name */
	const char *shared = "{'graph': {'nodes': ["
		"{'name':'mine','op':'Queue','attrs':{'capacity':10,'shared_name':'pq',"
		"'components':[{'dtype':'float32','shape':[2]}]},'device':" W0 "},"
		"{'name':'n','op':'QueueSize','attrs':{'queue':'mine'},'device':" W0 "}]},"
		"'fetch': ['%s']}";
	double left = fetch_value(shared, "n");
	cr_assert_float_eq(left, 1.0, 1e-9, "%g", left);

	snprintf(g, sizeof g, nodes, 20);
	snprintf(body, sizeof body, g, "size");
	cr_assert_eq(req("POST", "/v1/jobs", body, NULL, 0, &res, &err), DG_EEXIST, "%s",
		     err.msg);
	cr_assert_eq(res.status, 409);
	cr_assert(strstr(err.msg, "queue 'pq' exists with capacity 10, not 20"), "%s", err.msg);
	dg_http_result_deinit(&res);
#undef Q
#undef W0
}

/* Minimize (Python's optimizer.minimize) in a plain job: each step fetched runs
 * the loss's gradient and the sgd apply with the step's feeds; w -> 3 fits
 * y = 3x. Its errors name the node. */
Test(jobs, minimize_trains_with_fed_values_in_plain_steps)
{
#define W0 "'/job:worker/task:0'"
	struct dg_http_result res;
	struct dg_err err = { 0 };
	const char *g = "{'graph': {'nodes': ["
		"{'name':'w','op':'Variable','attrs':{'shape':[1],'var':'test/mw'},'device':" W0 "},"
		"{'name':'x','op':'Placeholder','attrs':{'shape':[4]},'device':" W0 "},"
		"{'name':'y','op':'Placeholder','attrs':{'shape':[4]},'device':" W0 "},"
		"{'name':'p','op':'Mul','inputs':['x','w'],'device':" W0 "},"
		"{'name':'d','op':'Sub','inputs':['p','y'],'device':" W0 "},"
		"{'name':'sq','op':'Square','inputs':['d'],'device':" W0 "},"
		"{'name':'loss','op':'Mean','inputs':['sq'],'device':" W0 "},"
		"{'name':'w1','op':'Sum','inputs':['w'],'device':" W0 "},"
		"{'name':'train','op':'Minimize','inputs':['loss'],"
		"'attrs':{'rule':'sgd','lr':0.05},'device':" W0 "}]}, "
		"'feeds': {'x': [1.0, 2, 3, 4], 'y': [3.0, 6, 9, 12]}, 'fetch': ['%s']}";

	for (int i = 0; i < 30; i++)
		fetch_value(g, "train");
	cr_assert_float_eq(fetch_value(g, "w1"), 3.0, 1e-3);
	cr_assert_float_eq(fetch_value(g, "loss"), 0.0, 1e-4);

	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': ["
			 "{'name':'c','op':'Const','attrs':{'value':1.5},'device':" W0 "},"
			 "{'name':'t','op':'Minimize','inputs':['c'],'attrs':{'rule':'sgd'},"
			 "'device':" W0 "}]}, 'fetch': ['t']}", NULL, 0, &res, &err), DG_EINVAL);
	cr_assert_eq(res.status, 400);
	cr_assert(strstr(err.msg, "node 't' (Minimize): the loss depends on no float Variable"),
		  "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': ["
			 "{'name':'c','op':'Const','attrs':{'value':1.5},'device':" W0 "},"
			 "{'name':'t','op':'Minimize','inputs':['c'],'attrs':{'rule':'sgd',"
			 "'variables':['c']},'device':" W0 "}]}, 'fetch': ['t']}", NULL, 0, &res,
			 &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "attr 'variables' names 'c', which is not a float Variable"),
		  "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': ["
			 "{'name':'c','op':'Const','attrs':{'value':1.5},'device':" W0 "},"
			 "{'name':'t','op':'Minimize','inputs':['c'],'attrs':{'rule':'sgdd'},"
			 "'device':" W0 "}]}, 'fetch': ['t']}", NULL, 0, &res, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "attr 'rule' is 'sgdd'"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': ["
			 "{'name':'w','op':'Variable','attrs':{'shape':[1],'var':'test/mw'}},"
			 "{'name':'loss','op':'Sum','inputs':['w']},"
			 "{'name':'t','op':'Minimize','inputs':['loss'],'attrs':{'rule':'sgd'}}],"
			 "'training': {'loss': 'loss', 'steps': 1, 'optimizer': {'rule': 'sgd', "
			 "'lr': 0.1}}}}", NULL, 0, &res, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "a training job's graph has a Minimize node"), "%s", err.msg);
	dg_http_result_deinit(&res);
#undef W0
}

/* Async training where every step subtracts exactly 0.5 from w (loss = sum(w * 1), sgd lr
 * 0.5), 2 replicas, an eval of w every 3 steps: an eval that sees exactly b steps of each
 * replica reads w = -0.5 * 2b = -b, at mean replica step b. Without eval.barrier the
 * eval runs when replica 0 gets there, wherever the other replica is (mean step 1 or 7 at
 * the first eval, w not -3). */
Test(jobs, async_evals_with_a_barrier_see_exactly_the_steps_of_every_replica)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char path[128];
	json_t *st;
	int n_eval = 0;
	const char *body = "{'graph': {'nodes': ["
		"{'name':'w','op':'Variable','attrs':{'shape':[1],'init':'zeros',"
		"'var':'test/evalw'}},"
		"{'name':'one','op':'Const','attrs':{'value':1.0}},"
		"{'name':'prod','op':'Mul','inputs':['w','one']},"
		"{'name':'loss','op':'Sum','inputs':['prod']},"
		"{'name':'wv','op':'Identity','inputs':['w']}],"
		"'training': {'loss':'loss','optimizer':{'rule':'sgd','lr':0.5},'steps':12,"
		"'replicas':2,'mode':'async','reinit':true,"
		"'eval':{'fetch':['wv'],'every_steps':3,'barrier':true}}}}";

	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	json_decref(st);
	snprintf(path, sizeof path, "/v1/jobs/%s/events?from=0", id);
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	/* One event per line; the evals after steps 3, 6 and 9, then the final one. */
	for (char *line = res.body.data, *nl; line && *line; line = nl ? nl + 1 : NULL) {
		nl = strchr(line, '\n');
		json_t *ev = json_loadb(line, nl ? (size_t)(nl - line) : strlen(line), 0, NULL);
		cr_assert_not_null(ev, "event line: %.80s", line);
		if (strcmp(json_string_value(json_object_get(ev, "event")), "eval") == 0) {
			json_t *v = json_object_get(json_object_get(ev, "values"), "wv");
			int64_t step = json_integer_value(json_object_get(ev, "step"));
			n_eval++;
			cr_assert_eq(step, 3 * n_eval, "eval %d at mean step %lld", n_eval,
				     (long long)step);
			cr_assert_float_eq(json_number_value(v), -3.0 * n_eval, 1e-9,
					   "eval %d: w = %g", n_eval, json_number_value(v));
		}
		json_decref(ev);
	}
	dg_http_result_deinit(&res);
	cr_assert_eq(n_eval, 4);
}

Test(jobs, cancel_aborts_a_running_job_and_concurrent_jobs_do_not_mix)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char *long_body = malloc(strlen(seed_sum) + 64);
	char path[128], id[32];
	json_t *st;

	sprintf(long_body, "{'graph': %s, 'steps': 100000000}", seed_sum);
	cr_assert_eq(req("POST", "/v1/jobs", long_body, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	free(long_body);
	json_t *j = body_json(&res);
	snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
	json_decref(j);
	dg_http_result_deinit(&res);
	/* Another job runs to completion while the first one is going. */
	const char *body2 = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':40},'device':'/job:worker/task:1'},"
		"{'name':'b','op':'Add','inputs':['a','a'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['b'], 'steps': 20}";
	const char *id2 = run_job(body2, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	cr_assert_float_eq(result_value(id2, "b"), 80.0, 1e-9);
	json_decref(st);
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	/* Cancel once the long job has completed a step (it may lag on a busy machine). */
	for (int i = 0; i < 500; i++) {
		cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
		st = body_json(&res);
		dg_http_result_deinit(&res);
		json_int_t done = json_integer_value(json_object_get(st, "steps_done"));
		json_decref(st);
		if (done > 0)
			break;
		usleep(10000);
	}
	cr_assert_eq(req("DELETE", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	dg_http_result_deinit(&res);
	for (int i = 0; i < 500; i++) {
		cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
		st = body_json(&res);
		dg_http_result_deinit(&res);
		const char *state = json_string_value(json_object_get(st, "state"));
		json_int_t done = json_integer_value(json_object_get(st, "steps_done"));
		bool running = strcmp(state, "running") == 0;
		if (!running) {
			cr_assert_str_eq(state, "canceled");
			cr_assert_gt(done, 0);
			cr_assert_lt(done, 100000000);
		}
		json_decref(st);
		if (!running)
			break;
		cr_assert_lt(i, 499, "job %s still running 5 s after DELETE", id);
		usleep(10000);
	}
	/* The fetched value of the canceled job's last complete step is still there. */
	cr_assert_float_eq(result_value(id, "y"), 238.0, 1e-9);
}

/* ------------------------------------- _Sends to the master carried in run replies */

static char *job_events(const char *id);

/* Metric line name (with its labels) of worker i, in-process. */
static double worker_metric(int i, const char *name)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };
	char want[160];

	cr_assert_eq(worker_metrics(wk[i], &b, &err), DG_OK, "%s", err.msg);
	snprintf(want, sizeof want, "\n%s ", name);
	const char *p = strstr(b.data, want);
	cr_assert_not_null(p, "no metric %s", name);
	double v = strtod(p + strlen(want), NULL);
	dg_buf_deinit(&b);
	return v;
}

#define SENT_HTTP "dg_worker_tensors_sent_total{path=\"http\"}"
#define SENT_CARRIED "dg_worker_tensors_sent_total{path=\"carried\"}"

/* The step of bench_graph: a on task 1, y = a + c on the master's task. Task
 * 1's fragment ends in the _Send of a, which its run reply carries: the same
 * y at every step, and no PUT. The seed program's y2 comes back the same way. */
Test(jobs, a_remote_fragment_ending_in_a_send_to_the_master_carries_it_in_the_reply)
{
	const char *body = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':1.5,'dtype':'float32'},"
		"'device':'/job:worker/task:1'},"
		"{'name':'c','op':'Const','attrs':{'value':2.0,'dtype':'float32'},"
		"'device':'/job:worker/task:0'},"
		"{'name':'y','op':'Add','inputs':['a','c'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['y'], 'steps': 20}";
	json_t *st;

	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	cr_assert_eq(json_integer_value(json_object_get(st, "steps_done")), 20);
	cr_assert_float_eq(result_value(id, "y"), 3.5, 1e-9);
	json_decref(st);
	cr_assert_eq(worker_metric(1, SENT_CARRIED), 20);
	cr_assert_eq(worker_metric(1, SENT_HTTP), 0);

	char *seed = malloc(strlen(seed_sum) + 64);
	sprintf(seed, "{'graph': %s, 'steps': 3}", seed_sum);
	id = run_job(seed, &st);
	free(seed);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done");
	cr_assert_float_eq(result_value(id, "y"), 238.0, 1e-9);
	json_decref(st);
	cr_assert_eq(worker_metric(1, SENT_CARRIED), 23);
	cr_assert_eq(worker_metric(1, SENT_HTTP), 0);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
}

/* Task 1 sends a to the master's task and then waits for b = -a from it:
 * that _Send is a PUT (carrying it would wait for the run's end, which waits
 * for b); only the fetch of c, after the _Recv, is carried. The job ends
 * well before the _Recv deadline. */
Test(jobs, a_remote_send_that_a_recv_does_not_precede_is_not_carried)
{
	const char *body = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':9},'device':'/job:worker/task:1'},"
		"{'name':'b','op':'Neg','inputs':['a'],'device':'/job:worker/task:0'},"
		"{'name':'c','op':'Neg','inputs':['b'],'device':'/job:worker/task:1'}]},"
		"'fetch': ['c'], 'steps': 5, 'timeout_ms': 20000}";
	json_t *st;

	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	cr_assert_lt(json_real_value(json_object_get(json_object_get(st, "ms"), "total")), 10000.0);
	cr_assert_float_eq(result_value(id, "c"), 9.0, 1e-9);
	json_decref(st);
	cr_assert_eq(worker_metric(1, SENT_HTTP), 5);
	cr_assert_eq(worker_metric(1, SENT_CARRIED), 5);
}

/* The master's own fragment fails while task 1 carries a back: the job fails
 * with the master's node, and no carried tensor is left in its rendezvous. */
Test(jobs, a_failed_step_leaves_no_carried_tensor_behind)
{
	const char *body = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':5},'device':'/job:worker/task:1'},"
		"{'name':'k','op':'Const','attrs':{'value':7},'device':'/job:worker/task:0'},"
		"{'name':'z','op':'Const','attrs':{'value':0},'device':'/job:worker/task:0'},"
		"{'name':'q','op':'Div','inputs':['k','z'],'device':'/job:worker/task:0'},"
		"{'name':'y','op':'Add','inputs':['a','q'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['y'], 'retry_ms': 60000}";
	json_t *st;

	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "failed");
	const char *msg = json_string_value(json_object_get(json_object_get(st, "error"),
							    "message"));
	cr_assert(strstr(msg, "worker/0") && strstr(msg, "node 'q' (Div)"), "%s", msg);
	char *ev = job_events(id);
	cr_assert_null(strstr(ev, "\"retry\""), "%s", ev);
	free(ev);
	json_decref(st);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
}

/* ------------------------------------------------- a task that loses its fragments */

/* A fake task: it answers health and registrations, but has always lost the
 * fragment it is asked to run (404 "fragment ... not found", what a restarted
 * task answers). Counts what it was asked. */
static atomic_int fake_registered, fake_removed;
static bool fake_gpu;                  /* health lists a GPU */
static atomic_int fake_gpu_nodes;      /* registered nodes with "device": "/gpu:0" */

static enum dg_status fake_health(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	(void)ctx, (void)r, (void)err;
	if (fake_gpu)
		dg_http_set_json(w, 200, json_pack("{s:s, s:[{s:i, s:s}]}", "status", "ok", "gpus",
						   "index", 0, "name", "Fake GPU"));
	else
		dg_http_set_json(w, 200, json_pack("{s:s, s:[]}", "status", "ok", "gpus"));
	return DG_OK;
}

static enum dg_status fake_register(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				    struct dg_err *err)
{
	int n = atomic_fetch_add(&fake_registered, 1) + 1;
	size_t len = 0;
	const char *body = dg_http_body(r, &len);
	json_t *doc = json_loadb(body ? body : "", len, 0, NULL), *node;
	size_t i;
	char id[16];

	(void)ctx, (void)err;
	json_array_foreach(json_object_get(doc, "nodes"), i, node)
		if (json_string_value(json_object_get(node, "device")) &&
		    strcmp(json_string_value(json_object_get(node, "device")), "/gpu:0") == 0)
			atomic_fetch_add(&fake_gpu_nodes, 1);
	json_decref(doc);
	snprintf(id, sizeof id, "f%d", n);
	dg_http_set_json(w, 201, json_pack("{s:s}", "id", id));
	return DG_OK;
}

/* What the fake's run answers: the lost fragment, or a reply that carries
 * lost_graph's a back (as -5, the fake's own value) to a run that names the
 * master's task as its requester, its bytes whole or cut short. */
static enum { FAKE_LOST, FAKE_CARRY, FAKE_CARRY_SHORT } fake_run_mode;

static enum dg_status fake_run(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	size_t len = 0;
	const char *body = dg_http_body(r, &len);
	json_t *j = json_loadb(body ? body : "", len, 0, NULL);
	const char *from = json_string_value(json_object_get(j, "from"));
	bool asked = from && strcmp(from, jc->tasks[0].address) == 0;
	int32_t a = -5;

	(void)ctx;
	if (fake_run_mode == FAKE_LOST) {
		json_decref(j);
		return dg_err_set(err, DG_ENOTFOUND, "fragment '%s' not found on task down/0",
				  dg_http_param(r, "id"));
	}
	struct dg_buf *out = dg_http_body_buf(w, "application/x-dg-run");
	enum dg_status st = dg_buf_printf(out, err, "{\"step\":%lld,\"steps\":1,"
					  "\"nodes_run\":2,\"ms\":0.1,\"results\":[],"
					  "\"tensors\":[{\"key\":\"a:0->worker/0\","
					  "\"dtype\":\"int32\",\"shape\":\"[]\",\"bytes\":4}]}\n",
					  (long long)json_integer_value(json_object_get(j, "step")));
	json_decref(j);
	if (!asked)
		return dg_err_set(err, DG_EINVAL, "the run request does not name %s as \"from\"",
				  jc->tasks[0].address);
	return st == DG_OK ? dg_buf_append(out, &a, fake_run_mode == FAKE_CARRY ? 4 : 2, err) : st;
}

static enum dg_status fake_remove(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	(void)ctx, (void)r, (void)err;
	atomic_fetch_add(&fake_removed, 1);
	dg_http_set_status(w, 204);
	return DG_OK;
}

static enum dg_status fake_abort(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				 struct dg_err *err)
{
	(void)ctx, (void)r, (void)err;
	dg_http_set_status(w, 204);
	return DG_OK;
}

static const struct dg_route fake_routes[] = {
	{ "GET", "/v1/health", fake_health, "health" },
	{ "POST", "/v1/fragments", fake_register, "register" },
	{ "POST", "/v1/fragments/{id}/run", fake_run, "run: lost, or a reply carrying a" },
	{ "DELETE", "/v1/fragments/{id}", fake_remove, "remove" },
	{ "DELETE", "/v1/steps/{step}", fake_abort, "abort" },
};

/* Start the fake task and point the cluster's task /job:down/task:0 at it. */
static struct dg_http_server *fake_task_start(void)
{
	struct dg_http_config hc = { .port = 0, .server_name = "fake" };
	struct dg_err err = { 0 };
	struct dg_http_server *s = dg_http_server_new(&hc, fake_routes,
						      (int)(sizeof fake_routes /
							    sizeof fake_routes[0]), NULL, &err);
	char addr[64];

	cr_assert_not_null(s, "%s", err.msg);
	snprintf(addr, sizeof addr, "127.0.0.1:%d", dg_http_server_port(s));
	for (int t = 0; t < jc->n_tasks; t++)
		if (strcmp(jc->tasks[t].job, "down") == 0) {
			free(jc->tasks[t].address);
			jc->tasks[t].address = strdup(addr);
		}
	return s;
}

/* The events of job id as one string (owned). */
static char *job_events(const char *id)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char path[128], *s;

	snprintf(path, sizeof path, "/v1/jobs/%s/events?timeout_ms=0", id);
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	s = strndup(res.body.data ? res.body.data : "", res.body.len);
	dg_http_result_deinit(&res);
	return s;
}

static const char lost_graph[] = "{'graph': {'nodes': ["
	"{'name':'a','op':'Const','attrs':{'value':5},'device':'/job:down/task:0'},"
	"{'name':'b','op':'Neg','inputs':['a'],'device':'/job:worker/task:0'}]},"
	"'fetch': ['b'], 'steps': 3, 'retry_ms': %d}";

/* Run lost_graph with retry_ms against the fake task; it must fail. Returns
 * the error message (owned), *events the job's events (owned). */
static char *run_lost_job(int retry_ms, char **events)
{
	char body[sizeof lost_graph + 16], *msg;
	json_t *st;

	snprintf(body, sizeof body, lost_graph, retry_ms);
	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "failed");
	cr_assert_eq(json_integer_value(json_object_get(st, "steps_done")), 0);
	msg = strdup(json_string_value(json_object_get(json_object_get(st, "error"),
						       "message")));
	cr_assert(strstr(msg, "task /job:down/task:0 (127.0.0.1:"), "%s", msg);
	*events = job_events(id);
	json_decref(st);
	return msg;
}

Test(jobs, a_task_that_keeps_losing_its_fragment_fails_after_three_retries)
{
	struct dg_http_server *fake = fake_task_start();
	char *ev, *msg = run_lost_job(5000, &ev);

	cr_assert(strstr(msg, "kept failing: step 1 failed 4 times; the last time: ") &&
		  strstr(msg, "not found on task down/0"), "%s", msg);
	/* Registered once, then again before each of the 3 re-runs; each old one
	 * removed first, and the last one when the job ended. */
	cr_assert_eq(atomic_load(&fake_registered), 4);
	cr_assert_eq(atomic_load(&fake_removed), 4);
	for (int a = 1; a <= 3; a++) {
		char want[96];
		snprintf(want, sizeof want, "{\"event\":\"retry\",\"task\":\"/job:down/task:0\","
			 "\"step\":1,\"attempt\":%d,", a);
		cr_assert(strstr(ev, want), "no %s in %s", want, ev);
	}
	cr_assert_null(strstr(ev, "\"attempt\":4"), "%s", ev);
	free(ev);
	free(msg);
	dg_http_server_free(fake);
}

/* A replica split over two tasks (model parallelism) whose second task keeps
 * losing its fragment: the chunk on worker 0 is aborted each time, only the
 * lost task's fragment is registered again, and after 3 re-runs the job fails
 * naming it, with every fragment removed. */
Test(jobs, a_split_replica_retries_only_the_lost_task_and_fails_cleanly)
{
	struct dg_http_server *fake = fake_task_start();
	json_t *st;
	const char *id = run_job("{'graph': {'nodes': ["
		"{'name':'w','op':'Variable','attrs':{'shape':[2],'init':'ones',"
		"'var':'test/split_lost'}},"
		"{'name':'x','op':'Const','attrs':{'value':[1.5,2]},'device':'/job:down/task:0'},"
		"{'name':'p','op':'Mul','inputs':['x','w'],'device':'/job:worker/task:0'},"
		"{'name':'loss','op':'Sum','inputs':['p'],'device':'/job:worker/task:0'}],"
		"'training': {'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':4,"
		"'replicas':1,'reinit':true}}, 'retry_ms': 5000}", &st);
	const char *msg = json_string_value(json_object_get(json_object_get(st, "error"),
							    "message"));
	char *ev = job_events(id);

	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "failed");
	cr_assert(strstr(msg, "task /job:down/task:0 (127.0.0.1:") &&
		  strstr(msg, "kept failing"), "%s", msg);
	cr_assert_eq(json_array_size(json_object_get(st, "tasks")), 2, "two fragments");
	cr_assert_eq(atomic_load(&fake_registered), 4);
	/* a training job removes its fragments just after it is reported over */
	for (int i = 0; i < 500 && atomic_load(&fake_removed) < 4; i++)
		usleep(10000);
	cr_assert_eq(atomic_load(&fake_removed), 4);
	cr_assert(strstr(ev, "\"event\":\"retry\",\"task\":\"/job:down/task:0\""), "%s", ev);
	cr_assert_null(strstr(ev, "\"task\":\"/job:worker/task:0\",\"step\""), "%s", ev);
	free(ev);
	json_decref(st);
	dg_http_server_free(fake);
}

Test(jobs, retry_ms_0_fails_at_once_when_a_task_is_lost)
{
	struct dg_http_server *fake = fake_task_start();
	char *ev, *msg = run_lost_job(0, &ev);

	cr_assert(strstr(msg, "fragment 'f1' not found on task down/0"), "%s", msg);
	cr_assert_null(strstr(msg, "kept failing"), "%s", msg);
	cr_assert_eq(atomic_load(&fake_registered), 1);
	cr_assert_null(strstr(ev, "\"retry\""), "%s", ev);
	free(ev);
	free(msg);
	dg_http_server_free(fake);
}

Test(jobs, retry_ms_must_be_an_integer_from_0)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(req("POST", "/v1/jobs", "{'graph': {'nodes': []}, 'retry_ms': -1}", NULL, 0,
			 &res, &err), DG_EINVAL);
	cr_assert_eq(res.status, 400);
	cr_assert(strstr(err.msg, "job \"retry_ms\" must be an integer from 0 (no retry) to "
			 "3600000"), "%s", err.msg);
	dg_http_result_deinit(&res);
}

/* A node's own error is never retried, even with retries on. */
Test(jobs, a_kernel_error_is_not_retried)
{
	json_t *st;
	const char *body = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':7},'device':'/job:worker/task:0'},"
		"{'name':'z','op':'Const','attrs':{'value':0},'device':'/job:worker/task:1'},"
		"{'name':'q','op':'Div','inputs':['a','z'],'device':'/job:worker/task:1'}]},"
		"'fetch': ['q'], 'retry_ms': 60000}";

	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "failed");
	char *ev = job_events(id);
	cr_assert_null(strstr(ev, "\"retry\""), "%s", ev);
	free(ev);
	json_decref(st);
}

/* A remote run that carries a back: the master puts it where the _Recv of
 * its own fragment takes it (b = -a). A reply whose tensor bytes are cut
 * short fails the step naming the carried tensor; that is no lost task. */
Test(jobs, the_master_delivers_what_a_run_reply_carries_and_refuses_a_short_one)
{
	struct dg_http_server *fake = fake_task_start();
	char body[sizeof lost_graph + 16];
	json_t *st;

	fake_run_mode = FAKE_CARRY;
	snprintf(body, sizeof body, lost_graph, 60000);
	const char *id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	cr_assert_eq(json_integer_value(json_object_get(st, "steps_done")), 3);
	cr_assert_float_eq(result_value(id, "b"), 5.0, 1e-9);
	json_decref(st);

	fake_run_mode = FAKE_CARRY_SHORT;
	id = run_job(body, &st);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "failed");
	const char *msg = json_string_value(json_object_get(json_object_get(st, "error"),
							    "message"));
	cr_assert(strstr(msg, "task /job:down/task:0") && strstr(msg, "carried") &&
		  strstr(msg, "bytes"), "%s", msg);
	char *ev = job_events(id);
	cr_assert_null(strstr(ev, "\"retry\""), "%s", ev);
	free(ev);
	json_decref(st);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(wk[0])), 0);
	dg_http_server_free(fake);
}

/* The master learns which tasks have a GPU from their health: a node placed
 * on /gpu:0 of a task whose health lists one is placed there (and registered),
 * of one that lists none fails placement (the message doc/graph-execution.md
 * gives). */
Test(jobs, gpu_placement_follows_the_gpus_in_each_tasks_health)
{
	struct dg_http_server *fake = fake_task_start();
	struct dg_http_result res;
	struct dg_err err = { 0 };
	const char *body = "{'graph': {'nodes': ["
		"{'name':'a','op':'Const','attrs':{'value':5},'device':'/job:down/task:0/gpu:0'},"
		"{'name':'b','op':'Neg','inputs':['a'],'device':'/job:worker/task:0'}]},"
		"'fetch': ['b'], 'retry_ms': 0}";
	json_t *st;

	enum dg_status rc = req("POST", "/v1/jobs", body, NULL, 0, &res, &err);
	cr_assert_eq(rc, DG_EUNSUPPORTED, "%s: %s", dg_status_name(rc), err.msg);
	cr_assert(strstr(err.msg, "but that task has no GPU"), "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(atomic_load(&fake_registered), 0);
	fake_gpu = true;
	run_job(body, &st);
	json_t *pl = json_object_get(st, "placement");
	/* The status names the GPU a node runs on. */
	cr_assert_str_eq(json_string_value(json_object_get(pl, "a")), "/job:down/task:0/gpu:0");
	cr_assert_eq(json_array_size(json_object_get(st, "soft")), 0);
	/* Its fragment was registered there with node a on GPU 0 (then the fake
	 * task loses it, which fails the job: retry_ms is 0). */
	cr_assert_eq(atomic_load(&fake_registered), 1);
	cr_assert_eq(atomic_load(&fake_gpu_nodes), 1);
	cr_assert(strstr(json_string_value(json_object_get(json_object_get(st, "error"),
							   "message")), "not found on task down/0"));
	json_decref(st);
	dg_http_server_free(fake);
}
