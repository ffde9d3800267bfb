/* The training transformation (train.h) and its placement (place.h), as pure
 * functions: the "training" section's parser, the replica graphs of an MLP on
 * Fashion-MNIST for 1 ps + 2 workers, their partition into VarRead/VarApply
 * fragments, existing variables, and the gradients the replica graph computes
 * (evaluated in-process with dg_exec_run) against the analytic ones. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dg/cluster.h"
#include "dg/codec.h"
#include "dg/exec.h"
#include "dg/executor.h"
#include "dg/graph.h"
#include "dg/place.h"
#include "dg/train.h"
#include "master_test_util.h"

/* ------------------------------------------------------------ helpers */

static json_t *js(const char *text)
{
	char *s = dq(text);
	json_error_t je;
	json_t *j = json_loads(s, 0, &je);

	cr_assert_not_null(j, "json: %s in %s", je.text, s);
	free(s);
	return j;
}

static struct dg_graph *gr_doc(json_t *doc)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_from_json(doc, master_op_find, &err);

	cr_assert_not_null(g, "graph: %s (%s)", err.msg, err.hint);
	return g;
}

static void spec(const char *text, struct train_spec *s)
{
	struct dg_err err = { 0 };
	json_t *j = js(text);
	enum dg_status st = train_spec_parse(j, s, &err);

	json_decref(j);
	cr_assert_eq(st, DG_OK, "spec: %s", err.msg);
}

/* The node called name in doc's "nodes" (borrowed), or NULL. */
static json_t *node_in(const json_t *doc, const char *name)
{
	size_t i;
	json_t *n;

	json_array_foreach(json_object_get(doc, "nodes"), i, n)
		if (strcmp(json_string_value(json_object_get(n, "name")), name) == 0)
			return n;
	return NULL;
}

static int64_t attr_int(const json_t *n, const char *key)
{
	json_t *v = json_object_get(json_object_get(n, "attrs"), key);

	cr_assert(json_is_integer(v), "attr %s of %s", key,
		  json_string_value(json_object_get(n, "name")));
	return json_integer_value(v);
}

static int count_op(const json_t *doc, const char *op)
{
	size_t i;
	json_t *n;
	int k = 0;

	json_array_foreach(json_object_get(doc, "nodes"), i, n)
		k += strcmp(json_string_value(json_object_get(n, "op")), op) == 0;
	return k;
}

#define FMNIST "/usr/share/datasets/fashion-mnist"

static bool have_fmnist(void)
{
	if (access(FMNIST "/train-labels-idx1-ubyte.gz", R_OK) == 0 &&
	    access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) == 0 &&
	    access(FMNIST "/t10k-labels-idx1-ubyte.gz", R_OK) == 0 &&
	    access(FMNIST "/t10k-images-idx3-ubyte.gz", R_OK) == 0)
		return true;
	cr_log_warn("skipped: %s is absent (install dataset-fashion-mnist)", FMNIST);
	return false;
}

/* A 784-32-10 MLP on Fashion-MNIST with a training accuracy and a test accuracy. */
static const char mlp[] =
	"{'version': 1, 'nodes': ["
	"{'name':'train_x','op':'IdxReader','attrs':{'path':'" FMNIST
	"/train-images-idx3-ubyte.gz','scale':true,'flatten':true}},"
	"{'name':'train_y','op':'IdxReader','attrs':{'path':'" FMNIST
	"/train-labels-idx1-ubyte.gz'}},"
	"{'name':'batch','op':'ShardBatch','inputs':['train_x','train_y'],"
	" 'attrs':{'batch':32,'seed':42}},"
	"{'name':'w1','op':'Variable','attrs':{'shape':[784,32],'init':'glorot','seed':1}},"
	"{'name':'b1','op':'Variable','attrs':{'shape':[32]}},"
	"{'name':'w2','op':'Variable','attrs':{'shape':[32,10],'init':'glorot','seed':2}},"
	"{'name':'b2','op':'Variable','attrs':{'shape':[10],'var':'model/b2'}},"
	"{'name':'h_mm','op':'MatMul','inputs':['batch:0','w1'],'device':'/job:worker'},"
	"{'name':'h_pre','op':'Add','inputs':['h_mm','b1']},"
	"{'name':'h','op':'Relu','inputs':['h_pre']},"
	"{'name':'l_mm','op':'MatMul','inputs':['h','w2'],'device':'/job:worker/task:0/gpu:0'},"
	"{'name':'logits','op':'Add','inputs':['l_mm','b2']},"
	"{'name':'xent','op':'SparseSoftmaxCrossEntropyWithLogits','inputs':['logits','batch:1']},"
	"{'name':'loss','op':'Mean','inputs':['xent']},"
	"{'name':'pred','op':'ArgMax','inputs':['logits'],"
	" 'attrs':{'axis':1,'output_type':'int32'}},"
	"{'name':'correct','op':'Equal','inputs':['pred','batch:1']},"
	"{'name':'correct_f','op':'Cast','inputs':['correct'],'attrs':{'dtype':'float32'}},"
	"{'name':'accuracy','op':'Mean','inputs':['correct_f']},"
	"{'name':'test_x','op':'IdxReader','attrs':{'path':'" FMNIST
	"/t10k-images-idx3-ubyte.gz','scale':true,'flatten':true}},"
	"{'name':'test_y','op':'IdxReader','attrs':{'path':'" FMNIST
	"/t10k-labels-idx1-ubyte.gz'}},"
	"{'name':'t_mm','op':'MatMul','inputs':['test_x','w1']},"
	"{'name':'t_pre','op':'Add','inputs':['t_mm','b1']},"
	"{'name':'t_h','op':'Relu','inputs':['t_pre']},"
	"{'name':'t_lmm','op':'MatMul','inputs':['t_h','w2']},"
	"{'name':'t_logits','op':'Add','inputs':['t_lmm','b2']},"
	"{'name':'t_pred','op':'ArgMax','inputs':['t_logits'],"
	" 'attrs':{'axis':1,'output_type':'int32'}},"
	"{'name':'t_correct','op':'Equal','inputs':['t_pred','test_y']},"
	"{'name':'t_correct_f','op':'Cast','inputs':['t_correct'],'attrs':{'dtype':'float32'}},"
	"{'name':'test_accuracy','op':'Mean','inputs':['t_correct_f']}"
	"], 'fetch': ['test_accuracy']}";

static const char cluster_1ps2w[] =
	"{'ps': ['127.0.0.1:7000'], 'worker': ['127.0.0.1:7010', '127.0.0.1:7011']}";

static const char mlp_training[] =
	"{'loss': 'loss', 'metrics': ['accuracy'], 'optimizer': {'rule': 'sgd', 'lr': 0.1},"
	" 'epochs': 3, 'batch': 64, 'mode': 'async',"
	" 'eval': {'fetch': ['test_accuracy'], 'every_epochs': 1}}";

/* ------------------------------------------------------------ spec parsing */

Test(train, spec_parse_reads_every_documented_key)
{
	struct train_spec s;

	spec("{'loss': 'loss:0', 'metrics': ['acc', 'n'],"
	     " 'optimizer': {'rule': 'momentum', 'lr': 0.05, 'momentum': 0.9, 'nesterov': true},"
	     " 'lr_schedule': {'kind': 'step', 'every': 100, 'factor': 0.5},"
	     " 'steps': 1000, 'batch': 128, 'replicas': 3, 'mode': 'sync', 'backup': 1,"
	     " 'checkpoint_secs': 30, 'eval': {'fetch': ['test_acc'], 'every_steps': 200,"
	     " 'barrier': true},"
	     " 'reinit': true}", &s);
	cr_assert_str_eq(s.loss, "loss:0");
	cr_assert_eq(s.n_metrics, 2);
	cr_assert_str_eq(s.metrics[1], "n");
	cr_assert_str_eq(s.rule, "momentum");
	cr_assert_float_eq(s.lr, 0.05, 1e-12);
	cr_assert_float_eq(s.momentum, 0.9, 1e-12);
	cr_assert(s.nesterov);
	cr_assert_str_eq(s.schedule, "step");
	cr_assert_eq(s.every, 100);
	cr_assert_float_eq(s.factor, 0.5, 1e-12);
	cr_assert_eq(s.epochs, 0);
	cr_assert_eq(s.steps, 1000);
	cr_assert_eq(s.batch, 128);
	cr_assert_eq(s.replicas, 3);
	cr_assert(s.sync);
	cr_assert_eq(s.backup, 1);
	cr_assert_float_eq(s.checkpoint_secs, 30, 1e-12);
	cr_assert_eq(s.n_eval_fetch, 1);
	cr_assert_str_eq(s.eval_fetch[0], "test_acc");
	cr_assert_eq(s.eval_every_steps, 200);
	cr_assert_eq(s.eval_every_epochs, 0);
	cr_assert(s.eval_barrier);
	cr_assert(s.reinit);
	train_spec_deinit(&s);
	cr_assert_null(s.loss);
}

Test(train, spec_parse_fills_adam_defaults_and_a_constant_async_schedule)
{
	struct train_spec s;

	spec("{'loss': 'l', 'optimizer': {'rule': 'adam'}, 'epochs': 2}", &s);
	cr_assert_str_eq(s.rule, "adam");
	cr_assert_float_eq(s.lr, 0.001, 1e-15);
	cr_assert_float_eq(s.beta1, 0.9, 1e-15);
	cr_assert_float_eq(s.beta2, 0.999, 1e-15);
	cr_assert_float_eq(s.eps, 1e-8, 1e-20);
	cr_assert_str_eq(s.schedule, "constant");
	cr_assert_eq(s.epochs, 2);
	cr_assert_not(s.sync);
	cr_assert_eq(s.replicas, 0);
	cr_assert_eq(s.n_metrics, 0);
	cr_assert_eq(s.n_eval_fetch, 0);
	cr_assert_not(s.reinit);
	train_spec_deinit(&s);
}

Test(train, spec_parse_refuses_each_bad_key_or_value_naming_it)
{
	static const struct {
		const char *doc, *says;
	} bad[] = {
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'lossy':1}",
		  "training has unknown key 'lossy'" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1,'lr2':1},'steps':1}",
		  "training.optimizer has unknown key 'lr2'" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'lr_schedule':{'kind':'step','every':2,'factor':0.5,'x':1}}",
		  "training.lr_schedule has unknown key 'x'" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'eval':{'fetch':['a'],'every':1}}", "training.eval has unknown key 'every'" },
		{ "{'optimizer':{'rule':'sgd','lr':0.1},'steps':1}", "training.loss is missing" },
		{ "{'loss':3,'optimizer':{'rule':'sgd','lr':0.1},'steps':1}", "training.loss" },
		{ "{'loss':'l','steps':1}", "training.optimizer is missing" },
		{ "{'loss':'l','optimizer':{'rule':'adadelta','lr':0.1},'steps':1}",
		  "training.optimizer.rule is 'adadelta'" },
		{ "{'loss':'l','optimizer':{'rule':'adagrad','lr':0.1,'rho':0.9},'steps':1}",
		  "training.optimizer.rho applies to rule rmsprop, not adagrad" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1,'eps':0.1},'steps':1}",
		  "training.optimizer.eps applies to rule adam and rmsprop, not sgd" },
		{ "{'loss':'l','optimizer':{'rule':'rmsprop','lr':0.1,'rho':1},'steps':1}",
		  "training.optimizer.rho is 1; it must be in (0, 1)" },
		{ "{'loss':'l','optimizer':{'rule':'rmsprop','lr':0.1,'rho':0},'steps':1}",
		  "training.optimizer.rho is 0; it must be in (0, 1)" },
		{ "{'loss':'l','optimizer':{'rule':'adagrad','lr':0.1,'init':0},'steps':1}",
		  "training.optimizer.init is 0; it must be > 0" },
		{ "{'loss':'l','optimizer':{'rule':'sgd'},'steps':1}",
		  "training.optimizer.lr is missing" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':-1},'steps':1}",
		  "training.optimizer.lr is -1; it must be > 0" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':'0.1'},'steps':1}",
		  "training.optimizer.lr must be a number" },
		{ "{'loss':'l','optimizer':{'rule':'momentum','lr':0.1},'steps':1}",
		  "training.optimizer.momentum is missing" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1,'momentum':0.9},'steps':1}",
		  "training.optimizer.momentum applies to rule momentum" },
		{ "{'loss':'l','optimizer':{'rule':'adam','beta1':1.5},'steps':1}",
		  "training.optimizer.beta1 is 1.5; it must be in [0, 1)" },
		{ "{'loss':'l','optimizer':{'rule':'momentum','lr':0.1,'momentum':1},'steps':1}",
		  "training.optimizer.momentum is 1; it must be in [0, 1)" },
		{ "{'loss':'l','optimizer':{'rule':'adam','eps':0},'steps':1}",
		  "training.optimizer.eps is 0; it must be > 0" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'lr_schedule':{'kind':'cosine'}}", "training.lr_schedule.kind is 'cosine'" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'lr_schedule':{'kind':'step','factor':0.5}}",
		  "training.lr_schedule.every is missing" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'lr_schedule':{'kind':'exponential','every':0,'factor':0.5}}",
		  "training.lr_schedule.every is 0" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1}}", "needs epochs or steps" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'epochs':1}",
		  "both epochs and steps" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'epochs':0}",
		  "training.epochs is 0" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':2.5}",
		  "training.steps must be an integer" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'batch':0}",
		  "training.batch is 0" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'replicas':-1}",
		  "training.replicas is -1" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'mode':'semi'}",
		  "training.mode is 'semi'" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'backup':1}",
		  "training.backup is 1 but mode is async" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'mode':'sync',"
		  "'replicas':2,'backup':2}", "training.backup is 2" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'checkpoint_secs':-5}",
		  "training.checkpoint_secs is -5" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'eval':{}}",
		  "training.eval.fetch is missing" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'eval':{'fetch':['a'],'every_epochs':1,'every_steps':5}}",
		  "both every_epochs and every_steps" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'eval':{'fetch':['a'],'barrier':1}}", "training.eval.barrier" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'metrics':['a',7]}",
		  "training.metrics[1]" },
		{ "{'loss':'l','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'reinit':'yes'}",
		  "training.reinit must be true or false" },
		{ "[1]", "training must be an object" },
	};

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct dg_err err = { 0 };
		struct train_spec s;
		json_t *j = js(bad[i].doc);
		enum dg_status st = train_spec_parse(j, &s, &err);
		json_decref(j);
		train_spec_deinit(&s);
		cr_assert_eq(st, DG_EINVAL, "accepted: %s", bad[i].doc);
		cr_assert(strstr(err.msg, bad[i].says), "for %s\n said: %s\n want: %s", bad[i].doc,
			  err.msg, bad[i].says);
	}
}

Test(train, learning_rate_schedules_follow_their_formulas)
{
	struct train_spec s;

	spec("{'loss':'l','optimizer':{'rule':'sgd','lr':0.8},'steps':1,"
	     "'lr_schedule':{'kind':'step','every':10,'factor':0.5}}", &s);
	cr_assert_float_eq(train_lr_at(&s, 0), 0.8, 1e-12);
	cr_assert_float_eq(train_lr_at(&s, 9), 0.8, 1e-12);
	cr_assert_float_eq(train_lr_at(&s, 10), 0.4, 1e-12);
	cr_assert_float_eq(train_lr_at(&s, 25), 0.2, 1e-12);
	snprintf(s.schedule, sizeof s.schedule, "exponential");
	cr_assert_float_eq(train_lr_at(&s, 5), 0.8 * sqrt(0.5), 1e-12);
	cr_assert_float_eq(train_lr_at(&s, 20), 0.2, 1e-12);
	snprintf(s.schedule, sizeof s.schedule, "constant");
	cr_assert_float_eq(train_lr_at(&s, 1000), 0.8, 1e-12);
	train_spec_deinit(&s);
}

/* ------------------------------------------------------------ the MLP plan */

Test(train, mlp_plan_has_two_sharded_replicas_on_the_worker_tasks)
{
	struct dg_cluster *c = cl(cluster_1ps2w);
	struct train_spec s;
	struct train_plan p;
	struct dg_err err = { 0 };
	static const char *const vars[] = { "w1", "b1", "w2", "b2" };

	if (!have_fmnist()) {
		dg_cluster_free(c);
		return;
	}
	struct dg_graph *g = gr(mlp);
	spec(mlp_training, &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s (%s)", err.msg, err.hint);
	cr_assert_eq(p.n_replicas, 2);
	cr_assert_eq(p.replica_task[0], 1);
	cr_assert_eq(p.replica_task[1], 2);
	/* 60000 examples over 2 shards: 30000 each, batches of 64 */
	cr_assert_eq(p.steps_per_epoch, 30000 / 64);
	cr_assert_eq(p.steps, 3 * (30000 / 64));
	cr_assert_eq(p.examples_per_step, 64);
	cr_assert_eq(p.n_vars, 4);
	for (int i = 0; i < 4; i++)
		cr_assert_str_eq(p.var_nodes[i], vars[i]);
	for (int r = 0; r < 2; r++) {
		const json_t *d = p.rep[r].doc;
		const json_t *b = node_in(d, "batch");
		char dev[64];
		snprintf(dev, sizeof dev, "/job:worker/task:%d", r);
		cr_assert_null(json_object_get(d, "training"));
		cr_assert_eq(attr_int(b, "shard"), r);
		cr_assert_eq(attr_int(b, "num_shards"), 2);
		cr_assert_eq(attr_int(b, "batch"), 64);
		cr_assert_eq(attr_int(b, "seed"), 42);
		cr_assert_str_eq(json_string_value(json_object_get(b, "device")), dev);
		/* a job alone gets the replica's task; task 0 of the layout moves with
		 * the replica (a group of one task) and keeps its GPU; Variables stay free */
		cr_assert_str_eq(json_string_value(json_object_get(node_in(d, "h_mm"), "device")),
				 dev);
		char gdev[80];
		snprintf(gdev, sizeof gdev, "%s/gpu:0", dev);
		cr_assert_str_eq(json_string_value(json_object_get(node_in(d, "l_mm"), "device")),
				 gdev);
		cr_assert_null(json_object_get(node_in(d, "w1"), "device"));
		cr_assert_eq(count_op(d, "ApplyGradient"), 4);
		cr_assert_eq(p.rep[r].n_targets, 4);
		for (int i = 0; i < 4; i++) {
			char name[64];
			snprintf(name, sizeof name, "_train/apply/%s", vars[i]);
			cr_assert_str_eq(p.rep[r].targets[i], name);
			json_t *a = node_in(d, name), *at = json_object_get(a, "attrs");
			cr_assert_not_null(a);
			cr_assert_str_eq(json_string_value(json_object_get(at, "variable")),
					 vars[i]);
			cr_assert_str_eq(json_string_value(json_object_get(at, "rule")), "sgd");
			cr_assert_float_eq(json_number_value(json_object_get(at, "lr")), 0.1,
					   1e-12);
			cr_assert_eq(attr_int(a, "replica"), r);
			cr_assert_eq(attr_int(a, "replicas"), 2);
			cr_assert(json_is_false(json_object_get(at, "sync")));
			/* placed with its gradient, wherever that is computed */
			cr_assert_null(json_object_get(a, "device"));
		}
		cr_assert_eq(p.rep[r].n_fetch, 2);
		cr_assert_str_eq(p.rep[r].fetch[0], "loss");
		cr_assert_str_eq(p.rep[r].fetch[1], "accuracy");
		cr_assert_str_eq(json_string_value(json_array_get(json_object_get(d, "fetch"), 1)),
				 "accuracy");
	}
	cr_assert_not_null(p.eval_doc);
	cr_assert_eq(count_op(p.eval_doc, "ApplyGradient"), 0);
	cr_assert_str_eq(json_string_value(json_array_get(json_object_get(p.eval_doc, "fetch"),
							  0)), "test_accuracy");
	cr_assert_str_eq(json_string_value(json_object_get(node_in(p.eval_doc, "t_mm"),
							   "device")), "/job:worker/task:0");
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

/* Partition replica r's doc as the master does for a training job. */
static void partition_replica(const struct train_plan *p, int r, const struct dg_cluster *c,
			      const json_t *existing, struct dg_graph **g_out,
			      struct placement *pl, struct partition *part)
{
	/* both test clusters have 3 tasks; the MLP asks for a GPU on the workers */
	static const bool gpu[3] = { false, true, true };
	struct place_opts po = { .existing = existing, .task_gpu = gpu };
	struct dg_err err = { 0 };
	struct partition_opts o = {
		.master_task = 1,
		.fetch = (const char *const *)p->rep[r].fetch, .n_fetch = p->rep[r].n_fetch,
		.targets = (const char *const *)p->rep[r].targets,
		.n_targets = p->rep[r].n_targets, .fetch_local = true,
	};

	*g_out = gr_doc(p->rep[r].doc);
	cr_assert_eq(place_graph(*g_out, c, &po, pl, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(place_partition_ex(*g_out, c, pl, &o, part, &err), DG_OK, "%s (%s)",
		     err.msg, err.hint);
}

Test(train, replica_partition_is_one_worker_fragment_pushing_to_the_ps)
{
	struct dg_cluster *c = cl(cluster_1ps2w);
	struct train_spec s;
	struct train_plan p;
	struct dg_err err = { 0 };
	struct dg_graph *rg;
	struct placement pl;
	struct partition part;

	if (!have_fmnist()) {
		dg_cluster_free(c);
		return;
	}
	struct dg_graph *g = gr(mlp);
	spec(mlp_training, &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
	partition_replica(&p, 1, c, NULL, &rg, &pl, &part);
	cr_assert_eq(part.n_frags, 1);
	const struct place_fragment *f = &part.frags[0];
	cr_assert_eq(f->task, 2, "the fragment runs on replica 1's task, worker 1");
	cr_assert_eq(count_op(f->doc, "VarRead"), 4);
	cr_assert_eq(count_op(f->doc, "VarApply"), 4);
	cr_assert_eq(count_op(f->doc, "_Recv"), 0, "nothing crosses workers");
	cr_assert_eq(count_op(f->doc, "_Send"), 2, "only the two fetches");
	json_t *ap = node_in(f->doc, "_train/apply/b2"), *a = json_object_get(ap, "attrs");
	cr_assert_str_eq(json_string_value(json_object_get(ap, "op")), "VarApply");
	cr_assert_str_eq(json_string_value(json_object_get(a, "var")), "model/b2");
	cr_assert_str_eq(json_string_value(json_object_get(a, "ps")), "127.0.0.1:7000");
	cr_assert_str_eq(json_string_value(json_object_get(a, "rule")), "sgd");
	cr_assert_float_eq(json_number_value(json_object_get(a, "lr")), 0.1, 1e-12);
	cr_assert_eq(attr_int(ap, "replica"), 1);
	cr_assert_eq(attr_int(ap, "replicas"), 2);
	cr_assert_null(json_object_get(a, "variable"));
	/* its gradient comes from this fragment */
	const char *gin = json_string_value(json_array_get(json_object_get(ap, "inputs"), 0));
	cr_assert_not_null(node_in(f->doc, gin), "gradient %s computed here", gin);
	json_t *rd = node_in(f->doc, "_read/w1");
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(rd, "attrs"), "ps")),
			 "127.0.0.1:7000");
	/* fetches are sent to the worker's own address */
	cr_assert_eq(part.n_fetch, 2);
	cr_assert_str_eq(part.fetch_keys[0], "fetch:loss");
	cr_assert_str_eq(part.fetch_keys[1], "fetch:accuracy");
	size_t i;
	json_t *n;
	int sends = 0;
	json_array_foreach(json_object_get(f->doc, "nodes"), i, n) {
		if (strcmp(json_string_value(json_object_get(n, "op")), "_Send") != 0)
			continue;
		json_t *sa = json_object_get(n, "attrs");
		cr_assert_str_eq(json_string_value(json_object_get(sa, "to")), "127.0.0.1:7011");
		cr_assert_str_eq(json_string_value(json_object_get(sa, "key")),
				 part.fetch_keys[sends++]);
	}
	/* the ps gets the four VarInits; the eval graph is not in this partition */
	cr_assert_eq(part.n_init, 1);
	cr_assert_eq(part.init[0].task, 0);
	cr_assert_eq(count_op(part.init[0].doc, "VarInit"), 4);
	cr_assert_null(node_in(f->doc, "t_mm"));
	/* the worker accepts both fragments as they are */
	for (int k = 0; k < 2; k++) {
		json_t *doc = k ? part.init[0].doc : f->doc;
		struct dg_graph *wg = dg_graph_from_json(doc, worker_op_find, &err);
		cr_assert_not_null(wg, "worker refuses the %s fragment: %s", k ? "init" : "step",
				   err.msg);
		dg_graph_free(wg);
	}
	partition_deinit(&part);
	placement_deinit(&pl);
	dg_graph_free(rg);
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

/* ------------------------------------------------ small graphs, no dataset */

/* y = x w + b with a mean squared error; 4 examples of 2 features. */
static const char linreg[] =
	"{'nodes': ["
	"{'name':'x','op':'Const','attrs':{'value':[[1,2],[3,-1],[0.5,4],[-2,1]]}},"
	"{'name':'y','op':'Const','attrs':{'value':[[1.0],[0.0],[2.0],[-1.0]]}},"
	"{'name':'w','op':'Variable','attrs':{'shape':[2,1]}},"
	"{'name':'b','op':'Variable','attrs':{'shape':[1],'var':'lin/b'}},"
	"{'name':'k','op':'Variable','attrs':{'shape':[1],'dtype':'int32'}},"
	"{'name':'unused','op':'Variable','attrs':{'shape':[3]}},"
	"{'name':'xw','op':'MatMul','inputs':['x','w']},"
	"{'name':'pred','op':'Add','inputs':['xw','b']},"
	"{'name':'err','op':'Sub','inputs':['pred','y']},"
	"{'name':'sq','op':'Square','inputs':['err']},"
	"{'name':'loss','op':'Mean','inputs':['sq']},"
	"{'name':'kf','op':'Cast','inputs':['k'],'attrs':{'dtype':'float32'}},"
	"{'name':'mae','op':'Mean','inputs':['err']}"
	"], 'fetch': ['loss']}";

static const char cluster_2ps1w[] =
	"{'ps': ['127.0.0.1:7000', '127.0.0.1:7001'], 'worker': ['127.0.0.1:7010']}";

/* An embedding table read only through Gather (twice) and one also read
 * densely: the first is read with VarGather and updated row-wise (the two
 * lookups' rows and values concatenated), the second as before. */
static const char embed[] =
	"{'nodes': ["
	"{'name':'ids','op':'Const','attrs':{'value':[[1,3],[3,0]],'dtype':'int32'}},"
	"{'name':'ids2','op':'Const','attrs':{'value':[2],'dtype':'int64'}},"
	"{'name':'emb','op':'Variable','attrs':{'shape':[5,2]}},"
	"{'name':'d','op':'Variable','attrs':{'shape':[5,2]}},"
	"{'name':'e','op':'Gather','inputs':['emb','ids']},"
	"{'name':'e2','op':'Gather','inputs':['emb','ids2']},"
	"{'name':'f','op':'Gather','inputs':['d','ids']},"
	"{'name':'s1','op':'Sum','inputs':['e']},"
	"{'name':'s2','op':'Sum','inputs':['e2']},"
	"{'name':'s3','op':'Sum','inputs':['f']},"
	"{'name':'s4','op':'Sum','inputs':['d']},"
	"{'name':'l1','op':'Add','inputs':['s1','s2']},"
	"{'name':'l2','op':'Add','inputs':['s3','s4']},"
	"{'name':'loss','op':'Add','inputs':['l1','l2']}"
	"], 'fetch': ['loss']}";

Test(train, a_table_read_only_through_gather_is_pulled_and_updated_by_rows)
{
	struct dg_cluster *c = cl(cluster_1ps2w);
	struct dg_graph *g = gr(embed), *rg;
	struct train_spec s;
	struct train_plan p;
	struct placement pl;
	struct partition part;
	struct dg_err err = { 0 };

	spec("{'loss':'loss','optimizer':{'rule':'adagrad','lr':0.5},'steps':3}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s (%s)", err.msg, err.hint);
	partition_replica(&p, 0, c, NULL, &rg, &pl, &part);
	cr_assert_eq(part.n_frags, 1);
	const struct place_fragment *f = &part.frags[0];
	cr_assert_eq(count_op(f->doc, "VarGather"), 3, "e, e2 and f read rows");
	cr_assert_eq(count_op(f->doc, "VarRead"), 1, "d is also read whole, emb never");
	json_t *ge = node_in(f->doc, "e");
	cr_assert_str_eq(json_string_value(json_object_get(ge, "op")), "VarGather");
	cr_assert_str_eq(json_string_value(json_array_get(json_object_get(ge, "inputs"), 0)), "ids");
	cr_assert_eq(json_array_size(json_object_get(ge, "inputs")), 1);
	json_t *ae = node_in(f->doc, "_train/apply/emb"), *ad = node_in(f->doc, "_train/apply/d");
	cr_assert_eq(json_array_size(json_object_get(ae, "inputs")), 2, "emb: values and rows");
	cr_assert_eq(json_array_size(json_object_get(ad, "inputs")), 1, "d: a dense gradient");
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ae, "attrs"), "rule")),
			 "adagrad");
	cr_assert_float_eq(json_number_value(json_object_get(json_object_get(ae, "attrs"),
							     "init")), 0.1, 1e-12);
	/* two lookups: the rows are concatenated as int64 */
	const char *rows = json_string_value(json_array_get(json_object_get(ae, "inputs"), 1));
	json_t *rn = node_in(f->doc, rows);
	cr_assert_str_eq(json_string_value(json_object_get(rn, "op")), "Concat", "%s", rows);
	struct dg_graph *wg = dg_graph_from_json(f->doc, worker_op_find, &err);
	cr_assert_not_null(wg, "the worker refuses the fragment: %s", err.msg);
	const struct dg_node *an = &wg->nodes[dg_graph_find(wg, "_train/apply/emb")];
	const struct dg_ttype *vt = &wg->nodes[an->in[0].node].out[an->in[0].index];
	const struct dg_ttype *it = &wg->nodes[an->in[1].node].out[an->in[1].index];
	cr_assert_eq(vt->shape.ndim, 2);
	cr_assert_eq(vt->shape.dim[0], 5, "4 + 1 looked-up rows");
	cr_assert_eq(vt->shape.dim[1], 2);
	cr_assert_eq(it->dtype, DG_I64);
	cr_assert_eq(it->shape.dim[0], 5);
	dg_graph_free(wg);
	partition_deinit(&part);
	placement_deinit(&pl);
	dg_graph_free(rg);
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

/* Batch norm: the moving averages are updated each step (targets), by a
 * VarApply of rule moving_average, and are not trained. */
Test(train, moving_averages_are_targets_applied_on_the_ps_and_not_trained)
{
	struct dg_cluster *c = cl(cluster_1ps2w);
	struct dg_graph *g = gr("{'nodes': ["
		"{'name':'x','op':'Const','attrs':{'value':[[1.5,2],[3,5],[0,1]]}},"
		"{'name':'gamma','op':'Variable','attrs':{'shape':[2],'init':'ones'}},"
		"{'name':'beta','op':'Variable','attrs':{'shape':[2]}},"
		"{'name':'mean','op':'Variable','attrs':{'shape':[2]}},"
		"{'name':'bn','op':'FusedBatchNorm','inputs':['x','gamma','beta']},"
		"{'name':'up','op':'AssignMovingAverage','inputs':['bn:1'],"
		" 'attrs':{'variable':'mean','decay':0.9}},"
		"{'name':'sq','op':'Square','inputs':['bn']},"
		"{'name':'loss','op':'Sum','inputs':['sq']}]}"), *rg;
	struct train_spec s;
	struct train_plan p;
	struct placement pl;
	struct partition part;
	struct dg_err err = { 0 };

	spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':2}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s (%s)", err.msg, err.hint);
	cr_assert_eq(p.n_vars, 2, "gamma and beta are trained, mean is not");
	bool target = false;
	for (int i = 0; i < p.rep[1].n_targets; i++)
		target |= strcmp(p.rep[1].targets[i], "up") == 0;
	cr_assert(target, "the moving average is a target of every replica");
	partition_replica(&p, 1, c, NULL, &rg, &pl, &part);
	json_t *up = node_in(part.frags[0].doc, "up"), *a = json_object_get(up, "attrs");
	cr_assert_str_eq(json_string_value(json_object_get(up, "op")), "VarApply");
	cr_assert_str_eq(json_string_value(json_object_get(a, "rule")), "moving_average");
	cr_assert_str_eq(json_string_value(json_object_get(a, "var")), "mean");
	cr_assert_float_eq(json_number_value(json_object_get(a, "decay")), 0.9, 1e-12);
	cr_assert_null(json_object_get(a, "variable"));
	struct dg_graph *wg = dg_graph_from_json(part.frags[0].doc, worker_op_find, &err);
	cr_assert_not_null(wg, "the worker refuses the fragment: %s", err.msg);
	dg_graph_free(wg);
	partition_deinit(&part);
	placement_deinit(&pl);
	dg_graph_free(rg);
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	/* a moving average of another shape, or of a node that is no Variable */
	static const char *const bad[][2] = {
		{ "{'nodes':[{'name':'m','op':'Variable','attrs':{'shape':[3]}},"
		  "{'name':'v','op':'Const','attrs':{'value':[1.5,2]}},"
		  "{'name':'u','op':'AssignMovingAverage','inputs':['v'],"
		  " 'attrs':{'variable':'m'}}]}", "the input's shape does not match variable 'm'" },
		{ "{'nodes':[{'name':'v','op':'Const','attrs':{'value':[1.5,2]}},"
		  "{'name':'u','op':'AssignMovingAverage','inputs':['v'],"
		  " 'attrs':{'variable':'v'}}]}", "(AssignMovingAverage): attr 'variable' 'v' is not "
		  "a Variable" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		g = gr(bad[i][0]);
		cr_assert_neq(place_graph(g, c, NULL, &pl, &err), DG_OK);
		cr_assert(strstr(err.msg, bad[i][1]), "%s", err.msg);
		dg_graph_free(g);
	}
	char *j = dq("{'nodes':[{'name':'m','op':'Variable','attrs':{'shape':[2]}},"
		     "{'name':'v','op':'Const','attrs':{'value':[1.5,2]}},"
		     "{'name':'u','op':'AssignMovingAverage','inputs':['v'],"
		     " 'attrs':{'variable':'m','decay':1.5}}]}");
	cr_assert_null(dg_graph_parse(j, strlen(j), master_op_find, &err));
	cr_assert(strstr(err.msg, "attr 'decay' is 1.5; it must be in [0, 1]"), "%s", err.msg);
	free(j);
	dg_cluster_free(c);
}

Test(train, replica_graph_gradients_match_the_analytic_ones)
{
	struct dg_cluster *c = cl(cluster_2ps1w);
	struct dg_graph *g = gr(linreg);
	struct train_spec s;
	struct train_plan p;
	struct dg_err err = { 0 };
	static const float xv[4][2] = { { 1, 2 }, { 3, -1 }, { 0.5f, 4 }, { -2, 1 } };
	static const float yv[4] = { 1, 0, 2, -1 };
	const float wv[2] = { 0.3f, -0.7f }, bv = 0.25f;

	spec("{'loss':'loss','metrics':['mae'],'optimizer':{'rule':'adam'},'steps':10,"
	     "'mode':'sync'}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(p.n_replicas, 1);
	cr_assert_eq(p.replica_task[0], 2);
	cr_assert_eq(p.steps, 10);
	cr_assert_eq(p.steps_per_epoch, 0);
	cr_assert_eq(p.examples_per_step, 0);
	cr_assert_null(p.eval_doc);
	/* the int Variable k and the unused one are not trained */
	cr_assert_eq(p.n_vars, 2);
	cr_assert_str_eq(p.var_nodes[0], "w");
	cr_assert_str_eq(p.var_nodes[1], "b");
	json_t *ap = node_in(p.rep[0].doc, "_train/apply/w"), *a = json_object_get(ap, "attrs");
	cr_assert_str_eq(json_string_value(json_object_get(a, "rule")), "adam");
	cr_assert_float_eq(json_number_value(json_object_get(a, "beta2")), 0.999, 1e-12);
	cr_assert(json_is_true(json_object_get(a, "sync")));

	/* evaluate the gradients the ApplyGradient nodes consume, Variables fed */
	struct dg_graph *rg = gr_doc(p.rep[0].doc);
	struct dg_shape ws = { 2, { 2, 1 } }, bs = { 1, { 1 } };
	struct dg_tensor *w = dg_tensor_from_data(DG_F32, &ws, wv, NULL);
	struct dg_tensor *b = dg_tensor_from_data(DG_F32, &bs, &bv, NULL);
	struct dg_feed feeds[] = { { "w", w }, { "b", b } };
	const char *fetch[2] = {
		json_string_value(json_array_get(json_object_get(ap, "inputs"), 0)),
		json_string_value(json_array_get(json_object_get(node_in(p.rep[0].doc,
					"_train/apply/b"), "inputs"), 0)),
	};
	struct dg_tensor *out[2] = { NULL, NULL };
	cr_assert_eq(dg_exec_run(rg, feeds, 2, fetch, 2, out, NULL, &err), DG_OK, "%s", err.msg);
	/* d/dw mean((xw + b - y)^2) = 2/N x^T e; d/db = 2/N sum(e) */
	double gw[2] = { 0, 0 }, gb = 0;
	for (int i = 0; i < 4; i++) {
		double e = xv[i][0] * wv[0] + xv[i][1] * wv[1] + bv - yv[i];
		gw[0] += 2.0 / 4 * xv[i][0] * e;
		gw[1] += 2.0 / 4 * xv[i][1] * e;
		gb += 2.0 / 4 * e;
	}
	cr_assert_eq(out[0]->shape.ndim, 2);
	cr_assert_eq(out[0]->shape.dim[0], 2);
	cr_assert_eq(out[1]->shape.ndim, 1);
	cr_assert_float_eq(((float *)out[0]->data)[0], gw[0], 1e-5);
	cr_assert_float_eq(((float *)out[0]->data)[1], gw[1], 1e-5);
	cr_assert_float_eq(((float *)out[1]->data)[0], gb, 1e-5);
	for (int i = 0; i < 2; i++)
		dg_tensor_free(out[i]);
	dg_tensor_free(w);
	dg_tensor_free(b);
	dg_graph_free(rg);
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

Test(train, an_existing_variable_is_placed_on_the_ps_that_holds_it)
{
	struct dg_cluster *c = cl(cluster_2ps1w);
	struct dg_graph *g = gr(linreg), *rg;
	struct train_spec s;
	struct train_plan p;
	struct dg_err err = { 0 };
	struct placement pl;
	struct partition part;
	json_t *existing = js("{'lin/b': 1, 'w': 1}");

	spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.5},'steps':3}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
	partition_replica(&p, 0, c, existing, &rg, &pl, &part);
	int w = dg_graph_find(rg, "w"), b = dg_graph_find(rg, "b");
	cr_assert_eq(pl.task[w], 1);
	cr_assert_eq(pl.task[b], 1);
	cr_assert_str_eq(pl.why[b], "existing");
	json_t *ap = node_in(part.frags[0].doc, "_train/apply/b");
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ap, "attrs"), "ps")),
			 "127.0.0.1:7001");
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ap, "attrs"), "var")),
			 "lin/b");
	partition_deinit(&part);
	placement_deinit(&pl);
	dg_graph_free(rg);

	/* without the probe, the bytes rule spreads them over both ps tasks */
	json_decref(existing);
	existing = js("{'other': 0}");
	partition_replica(&p, 0, c, existing, &rg, &pl, &part);
	w = dg_graph_find(rg, "w");
	b = dg_graph_find(rg, "b");
	cr_assert_neq(pl.task[w], pl.task[b]);
	cr_assert_str_eq(pl.why[w], "variable");
	partition_deinit(&part);
	placement_deinit(&pl);
	dg_graph_free(rg);
	json_decref(existing);
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

Test(train, plan_refuses_what_the_cluster_or_graph_cannot_train)
{
	static const struct {
		const char *spec, *says;
	} bad[] = {
		{ "{'loss':'nope','optimizer':{'rule':'sgd','lr':0.1},'steps':1}",
		  "training.loss" },
		{ "{'loss':'loss','metrics':['nope'],'optimizer':{'rule':'sgd','lr':0.1},"
		  "'steps':1}",
		  "training.metrics[0]" },
		{ "{'loss':'loss','metrics':['err'],'optimizer':{'rule':'sgd','lr':0.1},'steps':1}",
		  "metrics must be scalars" },
		{ "{'loss':'kf','optimizer':{'rule':'sgd','lr':0.1},'steps':1}",
		  "depends on no float Variable" },
		{ "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':1,"
		  "'eval':{'fetch':['zz']}}", "training.eval.fetch[0]" },
		{ "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'replicas':2}",
		  "training.replicas is 2 but the cluster has 1 compute task" },
		{ "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'epochs':1}",
		  "training.epochs needs a ShardBatch" },
		{ "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'batch':8}",
		  "training.batch is given" },
		{ "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':1,'mode':'sync',"
		  "'backup':1}", "training.backup is 1" },
	};
	struct dg_cluster *c = cl(cluster_2ps1w);
	struct dg_graph *g = gr(linreg);

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct train_spec s;
		struct train_plan p;
		struct dg_err err = { 0 };
		spec(bad[i].spec, &s);
		enum dg_status st = train_plan_build(g, &s, c, &p, &err);
		cr_assert_neq(st, DG_OK, "accepted: %s", bad[i].spec);
		cr_assert(strstr(err.msg, bad[i].says), "for %s\n said: %s\n want: %s",
			  bad[i].spec, err.msg, bad[i].says);
		cr_assert_null(p.rep);
		train_spec_deinit(&s);
	}
	dg_graph_free(g);
	dg_cluster_free(c);
}

/* A dataset of 101 examples in a .npy file: shard 0 of 2 holds 51, shard 1 50. */
Test(train, steps_per_epoch_count_replica_zeros_shard_of_an_npy_dataset)
{
	char path[] = "/tmp/dg-test-train-XXXXXX.npy";
	int fd = mkstemps(path, 4);
	struct dg_shape shape = { 2, { 101, 3 } };
	struct dg_tensor *t = dg_tensor_new(DG_F32, &shape, NULL);
	struct dg_err err = { 0 };
	struct dg_cluster *c = cl("{'ps':['h:1'],'worker':['h:2','h:3'],'chief':['h:4']}");
	char text[2048];
	struct train_spec s;
	struct train_plan p;

	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(dg_npy_write_file(path, t, &err), DG_OK, "%s", err.msg);
	snprintf(text, sizeof text,
		 "{'nodes': ["
		 "{'name':'data','op':'NpyReader','attrs':{'path':'%s'}},"
		 "{'name':'sb','op':'ShardBatch','inputs':['data','data'],'attrs':{'batch':4}},"
		 "{'name':'v','op':'Variable','attrs':{'shape':[3]}},"
		 "{'name':'m','op':'Mul','inputs':['sb:0','v']},"
		 "{'name':'loss','op':'Sum','inputs':['m']}]}", path);
	struct dg_graph *g = gr(text);

	spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'epochs':2,'batch':10,"
	     "'replicas':2}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(p.n_replicas, 2, "the first 2 of 3 compute tasks");
	cr_assert_eq(p.replica_task[0], 1);
	cr_assert_eq(p.replica_task[1], 2);
	cr_assert_eq(p.steps_per_epoch, 51 / 10);
	cr_assert_eq(p.steps, 2 * 5);
	cr_assert_eq(p.examples_per_step, 10);
	cr_assert_eq(attr_int(node_in(p.rep[1].doc, "sb"), "batch"), 10);
	train_plan_deinit(&p);
	train_spec_deinit(&s);

	/* a batch larger than the smaller shard (50) is refused */
	spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'epochs':1,'batch':51,"
	     "'replicas':2}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "training.batch"), "%s", err.msg);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
	dg_tensor_free(t);
	unlink(path);
}

Test(train, apply_gradient_is_placed_with_its_gradient_and_checked_against_its_variable)
{
	struct dg_cluster *c = cl("{'ps':['h:1'],'worker':['h:2','h:3']}");
	struct dg_err err = { 0 };
	struct placement pl;
	struct dg_graph *g = gr(
		"{'nodes': ["
		"{'name':'v','op':'Variable','attrs':{'shape':[2]}},"
		"{'name':'g','op':'Const','attrs':{'value':[1.5,2]},'device':'/job:worker/task:1'},"
		"{'name':'gg','op':'Neg','inputs':['g'],'device':'/job:worker/task:1'},"
		"{'name':'ap','op':'ApplyGradient','inputs':['gg'],"
		" 'attrs':{'variable':'v','rule':'momentum','momentum':0.9,'lr':0.1}}]}");

	cr_assert_eq(place_graph(g, c, NULL, &pl, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(pl.task[dg_graph_find(g, "ap")], 2);
	cr_assert_str_eq(pl.why[dg_graph_find(g, "ap")], "colocated");
	cr_assert_eq(g->nodes[dg_graph_find(g, "ap")].out[0].dtype, DG_I64);
	cr_assert_eq(g->nodes[dg_graph_find(g, "ap")].out[0].shape.ndim, 0);
	placement_deinit(&pl);
	dg_graph_free(g);

	/* a gradient of the wrong shape, a variable that is no Variable, a bad rule */
	static const char *const bad[][2] = {
		{ "{'nodes':[{'name':'v','op':'Variable','attrs':{'shape':[3]}},"
		  "{'name':'g','op':'Const','attrs':{'value':[1.5,2]}},"
		  "{'name':'ap','op':'ApplyGradient','inputs':['g'],"
		  " 'attrs':{'variable':'v','rule':'sgd','lr':0.1}}]}", "does not match" },
		{ "{'nodes':[{'name':'v','op':'Const','attrs':{'value':[1.5,2]}},"
		  "{'name':'ap','op':'ApplyGradient','inputs':['v'],"
		  " 'attrs':{'variable':'v','rule':'sgd','lr':0.1}}]}", "is not a Variable" },
	};
	for (int i = 0; i < 2; i++) {
		g = gr(bad[i][0]);
		cr_assert_neq(place_graph(g, c, NULL, &pl, &err), DG_OK);
		cr_assert(strstr(err.msg, bad[i][1]), "%s", err.msg);
		dg_graph_free(g);
	}
	char *j = dq("{'nodes':[{'name':'v','op':'Variable','attrs':{'shape':[2]}},"
		     "{'name':'g','op':'Const','attrs':{'value':[1.5,2]}},"
		     "{'name':'ap','op':'ApplyGradient','inputs':['g'],"
		     " 'attrs':{'variable':'v','rule':'adadelta','lr':0.1}}]}");
	cr_assert_null(dg_graph_parse(j, strlen(j), master_op_find, &err));
	cr_assert(strstr(err.msg, "adadelta"), "%s", err.msg);
	free(j);
	dg_cluster_free(c);
}

Test(train, targets_alone_run_their_inputs_and_fetches_go_to_the_master_unless_local)
{
	struct dg_cluster *c = cl("{'ps':['h:1'],'worker':['h:2','h:3']}");
	struct dg_err err = { 0 };
	struct placement pl;
	struct partition part;
	struct dg_graph *g = gr(
		"{'nodes': ["
		"{'name':'v','op':'Variable','attrs':{'shape':[2]}},"
		"{'name':'x','op':'Const','attrs':{'value':[1.5,2]},'device':'/job:worker/task:1'},"
		"{'name':'g','op':'Mul','inputs':['x','v'],'device':'/job:worker/task:1'},"
		"{'name':'s','op':'Sum','inputs':['g'],'device':'/job:worker/task:1'},"
		"{'name':'other','op':'Neg','inputs':['x'],'device':'/job:worker/task:0'},"
		"{'name':'ap','op':'ApplyGradient','inputs':['g'],"
		" 'attrs':{'variable':'v','rule':'sgd','lr':0.1}}], 'fetch': ['other']}");
	const char *targets[] = { "ap" }, *fetch[] = { "s" };
	struct partition_opts o = { .master_task = 1, .targets = targets, .n_targets = 1 };

	cr_assert_eq(place_graph(g, c, NULL, &pl, &err), DG_OK, "%s", err.msg);
	/* targets only: the graph's own fetch list is not used, nothing is sent */
	cr_assert_eq(place_partition_ex(g, c, &pl, &o, &part, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(part.n_fetch, 0);
	cr_assert_eq(part.n_frags, 1);
	cr_assert_eq(part.frags[0].task, 2);
	cr_assert_eq(count_op(part.frags[0].doc, "_Send"), 0);
	cr_assert_eq(count_op(part.frags[0].doc, "VarApply"), 1);
	cr_assert_null(node_in(part.frags[0].doc, "other"));
	cr_assert_eq(count_op(part.init[0].doc, "VarInit"), 1);
	partition_deinit(&part);
	/* a fetch beside the target goes to the master (task 1) unless local */
	for (int local = 0; local < 2; local++) {
		o.fetch = fetch;
		o.n_fetch = 1;
		o.fetch_local = local;
		cr_assert_eq(place_partition_ex(g, c, &pl, &o, &part, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(part.n_fetch, 1);
		cr_assert_str_eq(part.fetch_keys[0], "fetch:s");
		json_t *snd = node_in(part.frags[0].doc, "_fetch/0");
		cr_assert_str_eq(json_string_value(json_object_get(json_object_get(snd, "attrs"),
								   "to")), local ? "h:3" : "h:2");
		partition_deinit(&part);
	}
	/* an unknown target is named */
	targets[0] = "nope";
	cr_assert_eq(place_partition_ex(g, c, &pl, &o, &part, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "target 'nope'"), "%s", err.msg);
	placement_deinit(&pl);
	dg_graph_free(g);
	dg_cluster_free(c);
}

/* ------------------------------------------------------------ queue-fed input */

/* Linear regression fed from a queue: 10 examples [x0, x1] -> y, a feeder
 * (pinned to the ps), a dequeue of 2 and the loss. */
static const char queue_graph[] =
	"{'version': 1, 'nodes': ["
	"{'name':'q','op':'Queue','attrs':{'capacity':16,'components':["
	" {'dtype':'float32','shape':[2]},{'dtype':'float32','shape':[]},"
	" {'dtype':'int64','shape':[]}],'ids':2}},"
	"{'name':'x','op':'Const','attrs':{'value':{'dtype':'float32','shape':[10,2],'value':1}}},"
	"{'name':'y','op':'Const','attrs':{'value':{'dtype':'float32','shape':[10],'value':3}}},"
	"{'name':'feed','op':'QueueEnqueueMany','inputs':['x','y'],'device':'/job:ps/task:0',"
	" 'attrs':{'queue':'q','epochs':1}},"
	"{'name':'b','op':'QueueDequeueMany','attrs':{'queue':'q','batch':2}},"
	"{'name':'w','op':'Variable','attrs':{'shape':[2,1]}},"
	"{'name':'p','op':'MatMul','inputs':['b:0','w']},"
	"{'name':'p1','op':'Reshape','inputs':['p'],'attrs':{'shape':[-1]}},"
	"{'name':'d','op':'Sub','inputs':['p1','b:1']},"
	"{'name':'sq','op':'Square','inputs':['d']},"
	"{'name':'loss','op':'Mean','inputs':['sq']}"
	"]}";

/* The graph text with the queue ops expanded (as the master does), parsed. */
static struct dg_graph *queue_gr(const char *text, struct dg_err *err)
{
	char *s = dq(text);
	json_error_t je;
	json_t *doc = json_loads(s, 0, &je);
	struct dg_graph *g = NULL;

	free(s);
	cr_assert_not_null(doc, "json: %s", je.text);
	if (master_queue_expand(doc, err) == DG_OK)
		g = dg_graph_from_json(doc, master_op_find, err);
	json_decref(doc);
	return g;
}

Test(train, a_queue_fed_plan_leases_each_replicas_batch_and_acks_after_its_applies)
{
	struct dg_cluster *c = cl(cluster_1ps2w);
	struct dg_err err = { 0 };
	struct dg_graph *g = queue_gr(queue_graph, &err);
	struct train_spec s;
	struct train_plan p;

	cr_assert_not_null(g, "%s", err.msg);
	spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'epochs':3,'batch':4}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(p.queue, "q");
	cr_assert_str_eq(p.dequeue, "b");
	cr_assert_str_eq(p.feeder, "feed");
	cr_assert_not_null(p.feed_doc);
	cr_assert_eq(p.examples_per_epoch, 10);
	cr_assert_eq(p.examples_per_step, 4);
	cr_assert_eq(p.steps_per_epoch, 2);     /* ceil(10 / (4 x 2 replicas)) */
	cr_assert_eq(p.n_extra, 3);
	cr_assert_eq(attr_int(node_in(p.feed_doc, "feed"), "epochs"), 3);
	for (int r = 0; r < 2; r++) {
		const json_t *doc = p.rep[r].doc, *b = node_in(doc, "b");
		const json_t *ack = node_in(doc, "_train/queue_ack");
		char holder[8];
		snprintf(holder, sizeof holder, "r%d", r);
		cr_assert_eq(attr_int(b, "batch"), 4);
		cr_assert_gt(attr_int(b, "lease_ms"), 0);
		cr_assert_str_eq(json_string_value(json_object_get(json_object_get(b, "attrs"),
								   "holder")), holder);
		cr_assert_not_null(ack);
		cr_assert_str_eq(json_string_value(json_array_get(json_object_get(ack, "inputs"),
								  0)), "b:3");
		cr_assert_str_eq(json_string_value(json_array_get(json_object_get(ack, "inputs"),
								  1)), "_train/apply/w");
		cr_assert_str_eq(json_string_value(json_object_get(ack, "device")),
				 json_string_value(json_object_get(b, "device")));
		cr_assert_eq(p.rep[r].n_fetch, 4);
		cr_assert_str_eq(p.rep[r].fetch[1], "_train/queue_ack:0");
		cr_assert_str_eq(p.rep[r].fetch[2], "_train/queue_ack:1");
		cr_assert_str_eq(p.rep[r].fetch[3], "_train/queue_ack:2");
		cr_assert_null(json_object_get(node_in(doc, "q"), "device"));
	}
	/* Placed and cut: the Queue on the ps (why "queue"), the dequeue and
	 * the ack lowered with its address. */
	struct dg_graph *rg = gr_doc(p.rep[0].doc);
	struct placement pl;
	struct partition part;
	struct partition_opts po = { .targets = (const char *const *)p.rep[0].targets,
				     .n_targets = p.rep[0].n_targets,
				     .fetch = (const char *const *)p.rep[0].fetch,
				     .n_fetch = p.rep[0].n_fetch, .fetch_local = true };
	cr_assert_eq(place_graph(rg, c, NULL, &pl, &err), DG_OK, "%s", err.msg);
	int qn = dg_graph_find(rg, "q");
	cr_assert_eq(pl.task[qn], 0);
	cr_assert_str_eq(pl.why[qn], "queue");
	cr_assert_eq(place_partition_ex(rg, c, &pl, &po, &part, &err), DG_OK, "%s", err.msg);
	int lowered = 0;
	for (int f = 0; f < part.n_frags; f++) {
		const json_t *b = node_in(part.frags[f].doc, "b");
		const json_t *ack = node_in(part.frags[f].doc, "_train/queue_ack");
		for (int k = 0; k < 2; k++) {
			const json_t *n = k ? ack : b;
			if (!n)
				continue;
			cr_assert_str_eq(json_string_value(json_object_get(
				json_object_get(n, "attrs"), "ps")), "127.0.0.1:7000");
			lowered++;
		}
		cr_assert_null(node_in(part.frags[f].doc, "q"));
	}
	cr_assert_eq(lowered, 2);
	partition_deinit(&part);
	placement_deinit(&pl);
	dg_graph_free(rg);
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

Test(train, queue_inputs_the_plan_cannot_train_are_refused_naming_what)
{
	static const struct {
		const char *graph_edit, *spec, *says;
	} bad[] = {
		/* a second dequeue on the loss's path */
		{ "{'name':'b2','op':'QueueDequeueMany','attrs':{'queue':'q','batch':2}},"
		  "{'name':'loss2','op':'Add','inputs':['loss','b2:1']}",
		  "{'loss':'loss2','optimizer':{'rule':'sgd','lr':0.1},'steps':2}",
		  "reads two queues" },
		/* a ShardBatch beside it */
		{ "{'name':'sb','op':'ShardBatch','inputs':['x','y'],'attrs':{'batch':2}},"
		  "{'name':'loss2','op':'Add','inputs':['loss','sb:1']}",
		  "{'loss':'loss2','optimizer':{'rule':'sgd','lr':0.1},'steps':2}",
		  "both ShardBatch 'sb' and QueueDequeueMany 'b'" },
		/* a second feeder */
		{ "{'name':'feed2','op':'QueueEnqueueMany','inputs':['x','y'],"
		  "'attrs':{'queue':'q'}}",
		  "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':2}",
		  "two feeders" },
		{ NULL, "{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':2,'towers':2}",
		  "towers with a queue-fed input ('b') is not supported" },
	};
	struct dg_cluster *c = cl(cluster_1ps2w);

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		char text[4096];
		struct dg_err err = { 0 };
		struct train_spec s;
		struct train_plan p;
		size_t n = strlen(queue_graph);
		/* the edit goes before the closing "]}" */
		snprintf(text, sizeof text, "%.*s%s%s]}", (int)(n - 2), queue_graph,
			 bad[i].graph_edit ? "," : "", bad[i].graph_edit ? bad[i].graph_edit : "");
		struct dg_graph *g = queue_gr(text, &err);
		cr_assert_not_null(g, "%s", err.msg);
		spec(bad[i].spec, &s);
		cr_assert_neq(train_plan_build(g, &s, c, &p, &err), DG_OK, "accepted case %zu", i);
		cr_assert(strstr(err.msg, bad[i].says), "case %zu said: %s\n want: %s", i, err.msg,
			  bad[i].says);
		train_spec_deinit(&s);
		dg_graph_free(g);
	}
	/* epochs without a feeder: the queue is fed from outside */
	{
		struct dg_err err = { 0 };
		struct train_spec s;
		struct train_plan p;
		char text[4096];
		snprintf(text, sizeof text, "%s", queue_graph);
		char *f = strstr(text, "{'name':'feed'");
		char *e = strstr(f, "}},") + 3;
		memmove(f, e, strlen(e) + 1);
		struct dg_graph *g = queue_gr(text, &err);
		cr_assert_not_null(g, "%s", err.msg);
		spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'epochs':1}", &s);
		cr_assert_neq(train_plan_build(g, &s, c, &p, &err), DG_OK);
		cr_assert(strstr(err.msg, "no QueueEnqueueMany"), "%s", err.msg);
		train_spec_deinit(&s);
		/* with steps it trains from whatever dg feed put there */
		spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'steps':5}", &s);
		cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
		cr_assert_null(p.feeder);
		cr_assert_eq(p.steps, 5);
		train_plan_deinit(&p);
		train_spec_deinit(&s);
		dg_graph_free(g);
	}
	/* a queue op naming no Queue, and a feeder input of the wrong shape */
	{
		struct dg_err err = { 0 };
		char text[4096];
		snprintf(text, sizeof text, "%s", queue_graph);
		char *q = strstr(text, "'queue':'q','batch'");
		memcpy(q, "'queue':'x'", 11);
		cr_assert_null(queue_gr(text, &err));
		cr_assert(strstr(err.msg, "node 'b' (QueueDequeueMany): attr 'queue' is 'x', which "
				 "is not a Queue node"), "%s", err.msg);
		snprintf(text, sizeof text, "%s", queue_graph);
		char *sh = strstr(text, "'shape':[10,2]");
		memcpy(sh, "'shape':[10,3]", 14);
		dg_err_clear(&err);
		cr_assert_null(queue_gr(text, &err));
		cr_assert(strstr(err.msg, "feed") && strstr(err.msg, "a batch of queue component 0"),
			  "%s", err.msg);
	}
	dg_cluster_free(c);
}

/* A feeder pinned to a worker runs once there: it does not make the replicas
 * span that worker (their group stays 1 task: 2 replicas on 2 workers). */
Test(train, a_feeders_device_does_not_widen_the_replica_group)
{
	struct dg_cluster *c = cl(cluster_1ps2w);
	struct dg_err err = { 0 };
	char text[4096];
	struct train_spec s;
	struct train_plan p;

	snprintf(text, sizeof text, "%s", queue_graph);
	char *d = strstr(text, "'device':'/job:ps/task:0'");
	memmove(d + 29, d + 25, strlen(d + 25) + 1);
	memcpy(d, "'device':'/job:worker/task:1'", 29);
	struct dg_graph *g = queue_gr(text, &err);
	cr_assert_not_null(g, "%s", err.msg);
	spec("{'loss':'loss','optimizer':{'rule':'sgd','lr':0.1},'epochs':1}", &s);
	cr_assert_eq(train_plan_build(g, &s, c, &p, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(p.n_replicas, 2);
	cr_assert_eq(p.group, 1);
	cr_assert_str_eq(json_string_value(json_object_get(node_in(p.feed_doc, "feed"), "device")),
			 "/job:worker/task:1");
	train_plan_deinit(&p);
	train_spec_deinit(&s);
	dg_graph_free(g);
	dg_cluster_free(c);
}

/* ---- the step ledger (master/train_feed.c), without a cluster ---- */
#include "../../master/internal.h"

Test(train, a_chunk_back_after_the_final_read_takes_its_stepless_row)
{
	struct train tr;
	double vals[2][4] = { { 0.5, 64, 0, 5 }, { 0.4, 0, 64, 7 } };
	struct dg_task_run_result c = { .steps_done = 2, .values = &vals[0][0] };
	int64_t *ids = malloc(64 * sizeof *ids);

	memset(&tr, 0, sizeof tr);
	tr.plan.queue = "q";
	tr.n_collect = 4;               /* loss, then applied, requeued, lease */
	/* The final read made lease 7 (a dropped step's batch, put back) a row
	 * without a step: its chunk had not come back within the wait. */
	cr_assert_not_null(ids);
	for (int i = 0; i < 64; i++)
		ids[i] = 1000 + i;
	tr.rows = calloc(8, sizeof *tr.rows);
	tr.cap_rows = 8;
	tr.rows[0] = (struct ledger_row){ .step = -1, .replica = 1, .requeued = 64, .ms = NAN,
					  .lease = 7, .reason = "released", .ids = ids,
					  .n_ids = 64 };
	tr.n_rows = 1;
	tr.requeued = 64;
	/* Its chunk comes back: steps 10 (lease 5, applied) and 11 (lease 7). */
	train_feed_account_locked(&tr, 1, 10, &c, 2.0);
	cr_assert_eq(tr.n_rows, 2, "the stepless row of lease 7 stays beside its step's");
	cr_assert_eq(tr.rows[1].step, 11);
	cr_assert_eq(tr.rows[1].lease, 7u);
	cr_assert_eq(tr.rows[1].n_ids, 64);
	cr_assert_eq(tr.rows[1].ids[0], 1000);
	cr_assert_str_eq(tr.rows[1].reason, "released");
	cr_assert(!tr.rows[1].counted);
	cr_assert_eq(tr.requeued, 64, "lease 7's 64 examples counted %lld times / 64",
		     (long long)tr.requeued);
	cr_assert_eq(tr.applied, 64);
	train_feed_free(&tr);
}
