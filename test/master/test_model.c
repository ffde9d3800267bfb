/* Model parallelism on a running cluster (doc/training.md, "Devices and
 * replica groups"): a replica whose layers sit on two worker tasks trains
 * exactly as the same replica on one task, its devices survive into the
 * placement, and bad layouts are refused before anything is registered.
 * One ps and two workers, each a whole server on a loopback port. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/codec.h"
#include "dg/executor.h"
#include "dg/http.h"
#include "cluster_test_util.h"

static void setup(void)
{
	cluster_start("{'ps': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2', '127.0.0.1:3']}");
}

static void teardown(void)
{
	cluster_stop();
}

TestSuite(model, .init = setup, .fini = teardown, .timeout = 120);

/* A 6-5-3 MLP job whose data nodes are data (text ending in ','), read as x
 * and y; variables under prefix/; layer 1 on dev1 and layer 2 + the loss on
 * dev2 ("" = no device); training options extra. Owned body text. */
static char *model_job(const char *data, const char *x, const char *y, const char *prefix,
		       const char *dev1, const char *dev2, int steps, const char *extra)
{
	char d1[80] = "", d2[80] = "", *body = malloc(8192);

	if (dev1[0])
		snprintf(d1, sizeof d1, ",'device':'%s'", dev1);
	if (dev2[0])
		snprintf(d2, sizeof d2, ",'device':'%s'", dev2);
	cr_assert_not_null(body);
	snprintf(body, 8192, "{'graph': {'nodes': [%s"
		 "{'name':'w1','op':'Variable','attrs':{'shape':[6,5],'init':'glorot','seed':1,"
		 "'var':'%s/w1'}},"
		 "{'name':'b1','op':'Variable','attrs':{'shape':[5],'var':'%s/b1'}},"
		 "{'name':'w2','op':'Variable','attrs':{'shape':[5,3],'init':'glorot','seed':2,"
		 "'var':'%s/w2'}},"
		 "{'name':'b2','op':'Variable','attrs':{'shape':[3],'var':'%s/b2'}},"
		 "{'name':'h_mm','op':'MatMul','inputs':['%s','w1']%s},"
		 "{'name':'h_pre','op':'Add','inputs':['h_mm','b1']%s},"
		 "{'name':'h','op':'Tanh','inputs':['h_pre']%s},"
		 "{'name':'l_mm','op':'MatMul','inputs':['h','w2']%s},"
		 "{'name':'logits','op':'Add','inputs':['l_mm','b2']%s},"
		 "{'name':'xent','op':'SparseSoftmaxCrossEntropyWithLogits',"
		 "'inputs':['logits','%s']%s},"
		 "{'name':'loss','op':'Mean','inputs':['xent']%s}]},"
		 "'training': {'loss':'loss','optimizer':{'rule':'sgd','lr':0.5},'steps':%d,"
		 "'reinit':true%s}}", data, prefix, prefix, prefix, prefix, x, d1, d1, d1, d2, d2, y,
		 d2, d2, steps, extra);
	return body;
}

/* The MLP on 4 fixed examples, every step the same batch. */
static char *mlp_job(const char *prefix, const char *dev1, const char *dev2, int steps,
		     const char *extra)
{
	return model_job("{'name':'x','op':'Const','attrs':{'value':[[0.1,0.2,-0.3,0.4,0.5,-0.6],"
			 "[0.7,-0.8,0.9,1.0,-1.1,1.2],[-0.2,0.4,0.6,-0.8,1.0,0.3],"
			 "[0.5,0.5,-0.5,-0.5,0.25,0.75]]}},"
			 "{'name':'y','op':'Const','attrs':{'value':[0,2,1,2],'dtype':'int32'}},",
			 "x", "y", prefix, dev1, dev2, steps, extra);
}

/* The MLP on 8 examples in batches of 2 (ShardBatch, so replicas and towers
 * read disjoint shards). */
static char *sharded_job(const char *prefix, const char *dev1, const char *dev2, int steps,
			 const char *extra)
{
	return model_job("{'name':'data','op':'Const','attrs':{'value':[[0.1,0.2,-0.3,0.4,0.5,"
			 "-0.6],[0.7,-0.8,0.9,1.0,-1.1,1.2],[-0.2,0.4,0.6,-0.8,1.0,0.3],"
			 "[0.5,0.5,-0.5,-0.5,0.25,0.75],[1.0,-1.0,0.5,0.0,0.2,-0.4],"
			 "[-0.6,0.3,0.8,-0.1,0.9,0.4],[0.2,0.9,-0.7,0.6,-0.3,0.1],"
			 "[0.0,-0.5,0.3,0.7,-0.9,0.8]]}},"
			 "{'name':'labels','op':'Const','attrs':{'value':[0,2,1,2,1,0,2,1],"
			 "'dtype':'int32'}},"
			 "{'name':'batch','op':'ShardBatch','inputs':['data','labels'],"
			 "'attrs':{'batch':2,'seed':7}},",
			 "batch:0", "batch:1", prefix, dev1, dev2, steps, extra);
}

/* Variable name's value from the ps (task 0 of the cluster). Owned. */
static struct dg_tensor *var_value(const char *name)
{
	struct dg_err err = { 0 };
	struct dg_http_client *ps = dg_http_client_new(jc->tasks[0].address, NULL, 10000, &err);
	struct dg_http_header acc = { "Accept", "application/x-npy" };
	struct dg_http_result res;
	char path[160];

	cr_assert_not_null(ps, "%s", err.msg);
	snprintf(path, sizeof path, "/v1/vars/%s", name);
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(ps, "GET", path, &acc, 1, NULL, 0, &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(res.status, 200, "%s: %.*s", path, (int)res.body.len, res.body.data);
	struct dg_tensor *t = dg_npy_decode(res.body.data, res.body.len, &err);
	cr_assert_not_null(t, "%s", err.msg);
	dg_http_result_deinit(&res);
	dg_http_client_free(ps);
	return t;
}

/* Run body (owned, freed) to its end; it must be done. The status (owned). */
static json_t *train_done(char *body)
{
	json_t *st;

	run_job(body, &st);
	free(body);
	cr_assert_str_eq(json_string_value(json_object_get(st, "state")), "done", "%s",
			 json_dumps(json_object_get(st, "error"), 0));
	return st;
}

static double status_loss(const json_t *st)
{
	return json_number_value(json_object_get(json_object_get(st, "training"), "loss"));
}

static const char *placed(const json_t *st, const char *node)
{
	return json_string_value(json_object_get(json_object_get(st, "placement"), node));
}

/* Every element of the variables of run a equals run b's within tol. */
static void same_vars(const char *a, const char *b, double tol)
{
	static const char *const vars[] = { "w1", "b1", "w2", "b2" };

	for (int v = 0; v < 4; v++) {
		char na[64], nb[64];
		snprintf(na, sizeof na, "%s/%s", a, vars[v]);
		snprintf(nb, sizeof nb, "%s/%s", b, vars[v]);
		struct dg_tensor *x = var_value(na), *y = var_value(nb);
		cr_assert_eq(x->numel, y->numel);
		for (int64_t i = 0; i < x->numel; i++)
			cr_assert(fabs(dg_tensor_get_f64(x, i) - dg_tensor_get_f64(y, i)) <= tol,
				  "%s[%lld]: %.9g on one task, %.9g split", vars[v], (long long)i,
				  dg_tensor_get_f64(x, i), dg_tensor_get_f64(y, i));
		dg_tensor_free(x);
		dg_tensor_free(y);
	}
}

Test(model, a_step_split_over_two_tasks_equals_the_step_on_one)
{
	json_t *one = train_done(mlp_job("mp1/one", "", "", 1, ",'replicas':1"));
	json_t *two = train_done(mlp_job("mp1/two", "/job:worker/task:0", "/job:worker/task:1",
					 1, ""));

	cr_assert(isfinite(status_loss(one)) && status_loss(one) > 0.5);
	cr_assert_float_eq(status_loss(two), status_loss(one), 1e-6, "split %.9g, one task %.9g",
			   status_loss(two), status_loss(one));
	same_vars("mp1/one", "mp1/two", 1e-6);
	/* the devices say where it ran: layer 1 on worker 0, layer 2 on worker 1, and
	 * each gradient op with its forward op */
	cr_assert_str_eq(placed(two, "h_mm"), "/job:worker/task:0");
	cr_assert_str_eq(placed(two, "l_mm"), "/job:worker/task:1");
	cr_assert_str_eq(placed(one, "l_mm"), "/job:worker/task:0");
	const char *ex = json_string_value(json_object_get(two, "explain"));
	cr_assert(strstr(ex, "1 replica(s) of 2 task(s)"), "%s", ex);
	cr_assert(strstr(ex, "replica default"), "x and y have no device: %s", ex);
	cr_assert(strstr(ex, "colocated"), "%s", ex);
	json_t *tasks = json_object_get(two, "tasks");
	cr_assert_eq(json_array_size(tasks), 2, "one fragment per worker");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(two, "training"),
							"replica_group")), 2);
	json_decref(one);
	json_decref(two);
}

Test(model, five_split_steps_equal_five_steps_on_one_task)
{
	json_t *one = train_done(mlp_job("mp5/one", "", "", 5, ",'replicas':1"));
	json_t *two = train_done(mlp_job("mp5/two", "/job:worker/task:0", "/job:worker/task:1",
					 5, ""));

	same_vars("mp5/one", "mp5/two", 1e-6);
	json_t *done = json_object_get(json_object_get(two, "training"), "replica_steps");
	cr_assert_eq(json_array_size(done), 1);
	cr_assert_eq(json_integer_value(json_array_get(done, 0)), 5);
	json_decref(one);
	json_decref(two);
}

Test(model, two_towers_equal_two_sync_replicas_on_the_same_batches)
{
	json_t *between = train_done(sharded_job("tw/between", "", "", 8, ",'mode':'sync'"));
	json_t *in = train_done(sharded_job("tw/in", "", "", 8, ",'towers':2"));
	json_t *tr = json_object_get(in, "training");

	same_vars("tw/between", "tw/in", 1e-6);
	/* one replica of two towers: 8 steps x 2 towers x batch 2 examples */
	cr_assert_eq(json_integer_value(json_object_get(tr, "replicas")), 1);
	cr_assert_eq(json_integer_value(json_object_get(tr, "towers")), 2);
	cr_assert_eq(json_integer_value(json_object_get(tr, "examples")), 32);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(between, "training"),
							"examples")), 32);
	/* tower k on worker k; each Variable's gradient summed on its ps */
	cr_assert_str_eq(placed(in, "tower_0/h_mm"), "/job:worker/task:0");
	cr_assert_str_eq(placed(in, "tower_1/h_mm"), "/job:worker/task:1");
	const char *ex = json_string_value(json_object_get(in, "explain"));
	json_t *pl = json_object_get(in, "placement");
	const char *k;
	json_t *v;
	int sums = 0;
	json_object_foreach(pl, k, v)
		if (strncmp(k, "grad/w1/", 8) == 0) {
			cr_assert_str_eq(json_string_value(v), "/job:ps/task:0", "%s", k);
			sums++;
		}
	cr_assert_eq(sums, 1, "one Add of the two towers' parts: %s", ex);
	cr_assert_str_eq(placed(in, "_train/apply/w1"), "/job:ps/task:0");
	json_decref(between);
	json_decref(in);
}

Test(model, micro_batches_of_a_split_model_equal_one_big_batch)
{
	static const char *const d0 = "/job:worker/task:0", *const d1 = "/job:worker/task:1";
	json_t *big = train_done(sharded_job("mb/big", d0, d1, 6, ",'batch':4"));
	json_t *micro = train_done(sharded_job("mb/micro", d0, d1, 6,
					       ",'batch':4,'microbatches':2"));
	json_t *four = train_done(sharded_job("mb/four", "", "", 6,
					      ",'batch':4,'microbatches':4,'replicas':1"));

	same_vars("mb/big", "mb/micro", 1e-6);
	same_vars("mb/big", "mb/four", 1e-6);
	/* the copies keep the stages' devices; one data pipeline feeds them */
	cr_assert_str_eq(placed(micro, "micro_1/h_mm"), d0);
	cr_assert_str_eq(placed(micro, "micro_1/l_mm"), d1);
	cr_assert_not_null(placed(micro, "batch"));
	cr_assert_null(placed(micro, "micro_0/batch"));
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(micro, "training"),
							"examples")), 24);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(micro, "training"),
							"microbatches")), 2);
	json_decref(big);
	json_decref(micro);
	json_decref(four);
}

/* The fragments server i holds (its dg_worker_fragments gauge). */
static int fragments_held(int i)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };
	const char *at;
	int n = -1;

	cr_assert_eq(worker_metrics(wk[i], &b, &err), DG_OK, "%s", err.msg);
	at = strstr(b.data, "\ndg_worker_fragments ");
	cr_assert_not_null(at);
	sscanf(at, "\ndg_worker_fragments %d", &n);
	dg_buf_deinit(&b);
	return n;
}

/* A bad layout is a 400 naming the problem, and nothing is left registered. */
static void refused(char *body, const char *what)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(req("POST", "/v1/jobs", body, NULL, 0, &res, &err), DG_EINVAL, "%s",
		     err.msg);
	free(body);
	cr_assert_eq(res.status, 400, "status %d: %s", res.status, err.msg);
	cr_assert(strstr(err.msg, what), "%s", err.msg);
	dg_http_result_deinit(&res);
	for (int i = 0; i < n_srv; i++)
		cr_assert_eq(fragments_held(i), 0, "server %d keeps fragments", i);
}

Test(model, bad_layouts_are_refused_before_anything_runs)
{
	/* a task the cluster lacks */
	refused(mlp_job("bad1", "/job:worker/task:0", "/job:worker/task:2", 1, ""),
		"job 'worker' has 2 tasks");
	/* a job the cluster lacks */
	refused(mlp_job("bad2", "/job:trainer/task:0", "", 1, ""), "no job 'trainer'");
	/* a group larger than the compute tasks */
	refused(mlp_job("bad3", "", "", 1, ",'replica_group':3"),
		"replica_group is 3 but the cluster has 2 compute tasks");
	/* a node outside its group */
	refused(mlp_job("bad4", "/job:worker/task:0", "/job:worker/task:1", 1,
			",'replica_group':1"), "node 'l_mm' is placed on /job:worker/task:1");
	/* micro-batches that do not divide the batch, towers past the workers */
	refused(sharded_job("bad6", "", "", 1, ",'batch':4,'microbatches':3"),
		"training.microbatches is 3 but ShardBatch 'batch' makes batches of 4");
	refused(sharded_job("bad7", "", "", 1, ",'towers':3"),
		"training.towers is 3 (of 1 task each) but the cluster has 2 compute tasks");
	/* a cycle is refused with the graph */
	refused(strdup("{'graph': {'nodes': [{'name':'w','op':'Variable','attrs':{'shape':[1]}},"
		       "{'name':'a','op':'Add','inputs':['w','b'],'device':'/job:worker/task:0'},"
		       "{'name':'b','op':'Neg','inputs':['a'],'device':'/job:worker/task:1'},"
		       "{'name':'loss','op':'Sum','inputs':['b']}]},"
		       "'training': {'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},"
		       "'steps':1}}"), "cycle");
	/* more replicas than groups */
	refused(mlp_job("bad5", "/job:worker/task:0", "/job:worker/task:1", 1, ",'replicas':2"),
		"needs 4 compute tasks");
}
