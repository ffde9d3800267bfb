/* Placement (place.h): device strings, and the rules that pick a task per
 * node (explicit, partial, variables on ps tasks, a cost model with
 * colocation for the rest, compute-heavy nodes and their neighbours on a
 * task's GPU when it has one). Pure: no I/O. Neighbours: ops.c (the
 * master's ops), partition.c (the cut that follows). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/kernels.h"
#include "dg/log.h"
#include "dg/place.h"
#include "internal.h"

/* ------------------------------------------------------------ device specs */

struct dev_spec {
	const char *job;     /* points into a copy owned by the caller, NULL = any */
	int task;            /* -1 = any */
	bool gpu;
	int gpu_index;
	bool cpu;            /* a cpu segment: the node stays off the GPUs */
};

static bool parse_index(const char *s, int *out)
{
	char *end;
	long v;

	if (!*s)
		return false;
	v = strtol(s, &end, 10);
	if (*end || v < 0 || v > 1 << 20)
		return false;
	*out = (int)v;
	return true;
}

/* Parse TensorFlow's device string in buf (modified in place). */
static bool parse_device(char *buf, struct dev_spec *d)
{
	char *save = NULL;

	d->job = NULL;
	d->task = -1;
	d->gpu = false;
	d->gpu_index = 0;
	d->cpu = false;
	if (buf[0] != '/' && buf[0] != '\0')
		return false;
	for (char *seg = strtok_r(buf, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
		int ix;
		if (strncmp(seg, "job:", 4) == 0 && seg[4])
			d->job = seg + 4;
		else if (strncmp(seg, "task:", 5) == 0 && parse_index(seg + 5, &ix))
			d->task = ix;
		else if (strncmp(seg, "replica:", 8) == 0 && parse_index(seg + 8, &ix))
			continue;
		else if ((strncmp(seg, "cpu:", 4) == 0 && parse_index(seg + 4, &ix)) ||
			 (strncmp(seg, "device:CPU:", 11) == 0 && parse_index(seg + 11, &ix)))
			d->gpu = false, d->cpu = true;
		else if (strncmp(seg, "gpu:", 4) == 0 && parse_index(seg + 4, &ix))
			d->gpu = true, d->cpu = false, d->gpu_index = ix;
		else if (strncmp(seg, "device:GPU:", 11) == 0 && parse_index(seg + 11, &ix))
			d->gpu = true, d->cpu = false, d->gpu_index = ix;
		else
			return false;
	}
	return true;
}

bool place_device_task(const char *dev, char *buf, size_t n, const char **job, int *task)
{
	struct dev_spec d;

	if (snprintf(buf, n, "%s", dev ? dev : "") >= (int)n || !parse_device(buf, &d))
		return false;
	*job = d.job;
	*task = d.task;
	return true;
}

/* "ps, worker" */
static void job_list(const struct dg_cluster *c, char *buf, size_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < c->n_tasks && off + 1 < n; i++) {
		if (i > 0 && strcmp(c->tasks[i - 1].job, c->tasks[i].job) == 0)
			continue;
		int w = snprintf(buf + off, n - off, "%s%s", off ? ", " : "", c->tasks[i].job);
		off += w > 0 ? (size_t)w : 0;
	}
}

void place_device_name(const struct dg_cluster *c, int t, char *buf, size_t n)
{
	snprintf(buf, n, "/job:%s/task:%d", c->tasks[t].job, c->tasks[t].index);
}

void place_node_device(const struct dg_cluster *c, const struct placement *p, int n,
		       char *buf, size_t len)
{
	if (p->gpu && p->gpu[n] >= 0)
		snprintf(buf, len, "/job:%s/task:%d/gpu:%d", c->tasks[p->task[n]].job,
			 c->tasks[p->task[n]].index, p->gpu[n]);
	else
		place_device_name(c, p->task[n], buf, len);
}

/* ------------------------------------------------------------- placement */

struct placer {
	const struct dg_graph *g;
	const struct dg_cluster *c;
	const struct place_opts *o;
	struct placement *p;
	struct dev_spec *spec;       /* per node */
	char **spec_buf;             /* per node: owned copy of the device string, parsed */
	double *load;                /* per task: estimated work placed so far (element ops) */
	double *gpu_load;            /* per task: the same for its GPU, divided by GPU_SPEEDUP */
	int64_t *bytes;              /* per task: bytes of variables held */
	bool *ok;                    /* per task: scratch, may take the node */
	bool *deferred;              /* per node: a source that follows its first consumer */
	int n_ps;                    /* tasks of job "ps" */
	int rr;                      /* round-robin counter for variables */
};

static bool task_has_gpu(const struct placer *pl, int t)
{
	return pl->o && pl->o->task_gpu && pl->o->task_gpu[t];
}

static double numel_est(const struct dg_shape *s)
{
	double n = 1;

	for (int i = 0; i < s->ndim; i++)
		n *= s->dim[i] < 0 ? 1 : (double)s->dim[i];
	return n;
}

static double edge_bytes(const struct dg_graph *g, struct dg_edge e)
{
	const struct dg_ttype *t = &g->nodes[e.node].out[e.index];

	return numel_est(&t->shape) * (double)dg_dtype_size(t->dtype);
}

/* Estimated work of a node in element operations: its outputs' elements, times
 * the inner dimension for matrix products. Crude, but it only has to spread
 * independent work and let transfers dominate when tensors are large. */
static double work_est(const struct dg_graph *g, int n)
{
	const struct dg_node *nd = &g->nodes[n];
	double w = 0;

	for (int k = 0; k < nd->n_out; k++)
		w += numel_est(&nd->out[k].shape);
	if (strstr(nd->op->name, "MatMul") && nd->n_in > 0) {
		const struct dg_shape *a = &g->nodes[nd->in[0].node].out[nd->in[0].index].shape;
		if (a->ndim >= 1 && a->dim[a->ndim - 1] > 0)
			w *= (double)a->dim[a->ndim - 1];
	}
	return w + 1;
}

/* How much faster a GPU is taken to be than a task's CPU for work the cost
 * model sends there: it only has to make a GPU task's queue look short. */
#define GPU_SPEEDUP 16.0

static const struct dg_shape *in_shape(const struct dg_graph *g, int n, int i)
{
	struct dg_edge e = g->nodes[n].in[i];

	return &g->nodes[e.node].out[e.index].shape;
}

/* Work of node n for the GPU decision (compare PLACE_GPU_MIN_WORK): elements
 * read or written, whichever is more (a reduction reads much more than it
 * writes); for MatMul/BatchMatMul the output's elements times the inner
 * dimension, for Conv2D times the filter's kh * kw * cin (HWIO). */
static double gpu_work(const struct dg_graph *g, int n)
{
	const struct dg_node *nd = &g->nodes[n];
	double out = 0, in = 0;
	bool no = false, ta = false;

	for (int k = 0; k < nd->n_out; k++)
		out += numel_est(&nd->out[k].shape);
	for (int i = 0; i < nd->n_in; i++)
		in += numel_est(in_shape(g, n, i));
	if (strstr(nd->op->name, "MatMul") && nd->n_in >= 2) {
		const struct dg_shape *a = in_shape(g, n, 0);
		dg_attr_bool(nd->attrs, strcmp(nd->op->name, "MatMul") == 0 ? "transpose_a" :
			     "adj_x", &no, &ta, NULL);
		int k = a->ndim >= 2 && ta ? a->ndim - 2 : a->ndim - 1;
		if (k >= 0 && a->dim[k] > 0)
			return out * (double)a->dim[k];
	}
	if (strcmp(nd->op->name, "Conv2D") == 0 && nd->n_in >= 2) {
		const struct dg_shape *f = in_shape(g, n, 1);
		if (f->ndim == 4)
			return out * numel_est(f) / (f->dim[3] > 0 ? (double)f->dim[3] : 1);
	}
	return in > out ? in : out;
}

/* A node held by a ps task: a Variable or a Queue. */
static bool on_ps(const struct dg_node *nd)
{
	return master_is_variable(nd) || master_is_queue(nd);
}

/* The bytes node n keeps on its ps: its value, or its queue when full. */
static int64_t ps_bytes(const struct dg_graph *g, int n)
{
	if (master_is_queue(&g->nodes[n]))
		return master_queue_bytes(&g->nodes[n]);
	return (int64_t)edge_bytes(g, (struct dg_edge){ n, 0 });
}

/* May the cost model choose the device of node n (CPU or GPU)? Not when its
 * device names one (or soft placement moved it), and not for what only a
 * CPU runs: sources (they follow their consumer and are computed once per
 * fragment when constant), stateful ops (readers, ShardBatch, random ops),
 * Variables and ApplyGradient (requests to a ps). An op without a CUDA kernel
 * that still lands on a GPU runs on its task's CPU (worker/exec.c). */
static bool device_free(const struct placer *pl, int n)
{
	const struct dg_node *nd = &pl->g->nodes[n];

	return !pl->spec[n].cpu && !pl->spec[n].gpu && !pl->p->soft[n] && nd->n_in > 0 &&
	       !(nd->op->flags & (DG_OPF_SOURCE | DG_OPF_STATEFUL | DG_OPF_FEED)) &&
	       !on_ps(nd) && !master_is_apply(nd);
}

/* May node n run on task t? Its spec's job/task/gpu must match; without a job,
 * variables go to the ps tasks (when the job exists) and computation to the
 * other tasks (when there are any). */
static bool allowed(const struct placer *pl, int n, int t)
{
	const struct dev_spec *d = &pl->spec[n];
	const struct dg_task_addr *a = &pl->c->tasks[t];
	bool is_ps = strcmp(a->job, "ps") == 0;

	if (d->job && strcmp(d->job, a->job) != 0)
		return false;
	if (d->task >= 0 && d->task != a->index)
		return false;
	if (!d->job && on_ps(&pl->g->nodes[n]) && pl->n_ps > 0 && !is_ps)
		return false;
	if (!d->job && !on_ps(&pl->g->nodes[n]) && is_ps && pl->n_ps < pl->c->n_tasks)
		return false;
	if (d->gpu && !pl->p->soft[n] && !task_has_gpu(pl, t))
		return false;
	return true;
}

static int least_loaded(const struct placer *pl, int n)
{
	int best = -1;

	for (int t = 0; t < pl->c->n_tasks; t++)
		if (allowed(pl, n, t) && (best < 0 || pl->load[t] < pl->load[best]))
			best = t;
	return best;
}

/* Check the node's spec against the cluster: unknown job or task is DG_EINVAL,
 * a GPU that no matching task has is DG_EUNSUPPORTED unless soft placement. */
static enum dg_status check_spec(struct placer *pl, int n, struct dg_err *err)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	struct dev_spec *d = &pl->spec[n];
	char jobs[160];

	job_list(pl->c, jobs, sizeof jobs);
	if (d->job && dg_cluster_job_size(pl->c, d->job) == 0) {
		dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, but the cluster has no job "
			   "'%.64s' (jobs: %s)", nd->name, nd->device, d->job, jobs);
		const char *eg = pl->c->tasks[0].job;
		for (int t = 0; t < pl->c->n_tasks; t++)
			if (strcmp(pl->c->tasks[t].job, "ps") != 0) {
				eg = pl->c->tasks[t].job;
				break;
			}
		dg_err_hint(err, "use a job of the cluster (e.g. /job:%s/task:0) or leave the "
			    "device out to let the master place the node", eg);
		return DG_EINVAL;
	}
	if (d->task >= 0) {
		const char *job = d->job ? d->job : NULL;
		int size = job ? dg_cluster_job_size(pl->c, job) : 0;
		bool found = false;
		for (int t = 0; t < pl->c->n_tasks; t++)
			found |= (!job || strcmp(job, pl->c->tasks[t].job) == 0) &&
				 pl->c->tasks[t].index == d->task;
		if (!found) {
			if (job)
				dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, but job "
					   "'%s' has %d task%s (0..%d)", nd->name, nd->device,
					   job, size, size == 1 ? "" : "s", size - 1);
			else
				dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, but no "
					   "job of the cluster (%s) has that task", nd->name,
					   nd->device, jobs);
			dg_err_hint(err, "the cluster spec lists the tasks of each job");
			return DG_EINVAL;
		}
	}
	if (!d->gpu)
		return DG_OK;
	for (int t = 0; t < pl->c->n_tasks; t++)
		if (allowed(pl, n, t))
			return DG_OK;
	if (pl->o && pl->o->soft_placement) {
		pl->p->soft[n] = true;
		dg_log(DG_LOG_WARN, "master", "node '%s' is placed on %s, but there is no GPU "
		       "there: running it on the CPU (soft placement)", nd->name, nd->device);
		return DG_OK;
	}
	if (d->job && d->task >= 0)
		dg_err_set(err, DG_EUNSUPPORTED, "node '%s' is placed on %s, but that task has "
			   "no GPU", nd->name, nd->device);
	else
		dg_err_set(err, DG_EUNSUPPORTED, "node '%s' is placed on %s, but no task of the "
			   "cluster that fits has a GPU", nd->name, nd->device);
	dg_err_hint(err, "use /cpu:0, or run with --soft-placement to fall back to the CPU");
	return DG_EUNSUPPORTED;
}

/* The task that already holds node n's variable (place_opts.existing), or -1.
 * A queue is listed there as "queue:NAME". */
static int existing_task(const struct placer *pl, int n)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	const char *var = json_string_value(json_object_get(nd->attrs, "var"));
	char key[DG_GRAPH_MAX_NAME + 8];
	json_t *v;

	if (!pl->o || !json_is_object(pl->o->existing))
		return -1;
	if (master_is_queue(nd))
		snprintf(key, sizeof key, "queue:%s", master_queue_ps_name(nd));
	v = json_object_get(pl->o->existing, master_is_queue(nd) ? key : var ? var : nd->name);
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) >= pl->c->n_tasks)
		return -1;
	return (int)json_integer_value(v);
}

static void place_variable(struct placer *pl, int n)
{
	int best = -1, count = 0, pick;
	int have = existing_task(pl, n);

	if (have >= 0) {
		/* Its value lives there: placing it elsewhere would start a second copy. */
		pl->p->task[n] = have;
		pl->bytes[have] += ps_bytes(pl->g, n);
		pl->p->why[n] = "existing";
		return;
	}

	for (int t = 0; t < pl->c->n_tasks; t++)
		count += pl->ok[t] = allowed(pl, n, t);
	best = dg_cluster_pick_fewest_bytes(pl->bytes, pl->ok, pl->c->n_tasks);
	if (pl->o && pl->o->vars == PLACE_VARS_ROUND_ROBIN && count > 1) {
		pick = pl->rr++ % count;
		for (int t = 0; t < pl->c->n_tasks; t++)
			if (allowed(pl, n, t) && pick-- == 0) {
				best = t;
				break;
			}
	}
	pl->p->task[n] = best;
	pl->bytes[best] += ps_bytes(pl->g, n);
	pl->p->why[n] = count == 1 && pl->spec[n].job ? "explicit" :
			master_is_queue(&pl->g->nodes[n]) ? "queue" : "variable";
}

/* Bytes that must cross into task t for node n's inputs (each distinct value
 * counted once; sources not yet placed will follow their consumer: free). */
static double transfer_cost(const struct placer *pl, int n, int t)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	double b = 0;

	for (int i = 0; i < nd->n_in; i++) {
		struct dg_edge e = nd->in[i];
		bool seen = false;
		for (int j = 0; j < i && !seen; j++)
			seen = nd->in[j].node == e.node && nd->in[j].index == e.index;
		if (seen || pl->p->task[e.node] < 0 || pl->p->task[e.node] == t)
			continue;
		b += edge_bytes(pl->g, e);
	}
	return b;
}

/* Node n (device free, on a task with a GPU) follows its inputs onto that GPU
 * when more of their bytes are there than in host memory: it then saves the
 * download, and its GPU readers the upload. Ties stay on the CPU. */
static void follow_to_gpu(struct placer *pl, int n, double w)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	int t = pl->p->task[n], k = -1;
	double on_gpu = 0, on_host = 0;

	if (!task_has_gpu(pl, t) || !device_free(pl, n))
		return;
	for (int i = 0; i < nd->n_in; i++) {
		struct dg_edge e = nd->in[i];
		bool seen = false;
		for (int j = 0; j < i && !seen; j++)
			seen = nd->in[j].node == e.node && nd->in[j].index == e.index;
		if (seen)
			continue;
		if (pl->p->task[e.node] == t && pl->p->gpu[e.node] >= 0) {
			on_gpu += edge_bytes(pl->g, e);
			if (k < 0)
				k = pl->p->gpu[e.node];
		} else {
			on_host += edge_bytes(pl->g, e);
		}
	}
	if (k < 0 || !(on_gpu > on_host))
		return;
	pl->p->gpu[n] = k;
	pl->p->why[n] = "gpu-colocated";
	pl->load[t] -= w;
	pl->gpu_load[t] += w / GPU_SPEEDUP;
}

static void place_compute(struct placer *pl, int n)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	double w = work_est(pl->g, n), best_cost = 0;
	int best = -1, count = 0;
	bool to_gpu = false;

	/* A compute-heavy node goes to a GPU whenever a task it may run on has one:
	 * only such tasks compete, by their GPU's queue and the transfers. */
	if (device_free(pl, n) && gpu_work(pl->g, n) >= PLACE_GPU_MIN_WORK)
		for (int t = 0; t < pl->c->n_tasks && !to_gpu; t++)
			to_gpu = allowed(pl, n, t) && task_has_gpu(pl, t);
	for (int t = 0; t < pl->c->n_tasks; t++) {
		if (!allowed(pl, n, t) || (to_gpu && !task_has_gpu(pl, t)))
			continue;
		double cost = (to_gpu ? pl->gpu_load[t] + w / GPU_SPEEDUP : pl->load[t] + w) +
			      transfer_cost(pl, n, t);
		count++;
		if (best < 0 || cost < best_cost)
			best = t, best_cost = cost;
	}
	pl->p->task[n] = best;
	if (to_gpu) {
		pl->gpu_load[best] += w / GPU_SPEEDUP;
		pl->p->gpu[n] = 0;
		pl->p->why[n] = "gpu";
	} else {
		pl->load[best] += w;
		pl->p->why[n] = count == 1 && pl->spec[n].job && pl->spec[n].task >= 0 ?
				"explicit" :
				transfer_cost(pl, n, best) <
				transfer_cost(pl, n, least_loaded(pl, n)) ? "colocated" : "cost";
		follow_to_gpu(pl, n, w);
	}
	/* Unplaced sources feeding n follow it, so their values need no transfer. */
	for (int i = 0; i < nd->n_in; i++) {
		int s = nd->in[i].node;
		if (!pl->deferred[s] || pl->p->task[s] >= 0)
			continue;
		pl->p->task[s] = allowed(pl, s, best) ? best : least_loaded(pl, s);
		pl->p->why[s] = pl->p->task[s] == best ? "colocated" : "cost";
		pl->load[pl->p->task[s]] += work_est(pl->g, s);
	}
}

/* An ApplyGradient runs where its gradient is computed: the gradient then
 * travels once, straight to the ps, instead of to another worker first. */
static void place_with_gradient(struct placer *pl, int n)
{
	int t = pl->p->task[pl->g->nodes[n].in[0].node];

	if (!allowed(pl, n, t)) {
		place_compute(pl, n);
		return;
	}
	pl->p->task[n] = t;
	pl->p->why[n] = "colocated";
	pl->load[t] += 1;
}

/* The task of the node n is to be colocated with (place_opts.colocate), when
 * that node is placed and n's own device names no task; else -1. */
static int colocate_task(const struct placer *pl, int n)
{
	const char *with;
	int w;

	if (!pl->o || !pl->o->colocate || pl->spec[n].task >= 0)
		return -1;
	with = json_string_value(json_object_get(pl->o->colocate, pl->g->nodes[n].name));
	w = with ? dg_graph_find(pl->g, with) : -1;
	if (w < 0 || pl->p->task[w] < 0)
		return -1;
	if (pl->spec[n].job && strcmp(pl->spec[n].job, pl->c->tasks[pl->p->task[w]].job) != 0)
		return -1;
	return pl->p->task[w];
}

/* Why a node whose device the training plan filled in is where it is
 * (place_opts.reasons), instead of "explicit". */
static void plan_reasons(const struct placer *pl)
{
	static const char *const known[] = { "replica default", "colocated" };

	for (int n = 0; pl->o && pl->o->reasons && n < pl->g->n_nodes; n++) {
		const char *r = json_string_value(json_object_get(pl->o->reasons,
								  pl->g->nodes[n].name));
		if (!r || !pl->p->why[n] || strcmp(pl->p->why[n], "explicit") != 0)
			continue;
		for (size_t k = 0; k < sizeof known / sizeof *known; k++)
			if (strcmp(r, known[k]) == 0)
				pl->p->why[n] = known[k];
	}
}

static enum dg_status placer_init(struct placer *pl, struct dg_err *err)
{
	const struct dg_graph *g = pl->g;
	int nt = pl->c->n_tasks;

	pl->p->n_nodes = g->n_nodes;
	pl->p->task = malloc(((size_t)g->n_nodes + 1) * sizeof *pl->p->task);
	pl->p->why = calloc((size_t)g->n_nodes + 1, sizeof *pl->p->why);
	pl->p->soft = calloc((size_t)g->n_nodes + 1, sizeof *pl->p->soft);
	pl->p->gpu = malloc(((size_t)g->n_nodes + 1) * sizeof *pl->p->gpu);
	pl->spec = calloc((size_t)g->n_nodes + 1, sizeof *pl->spec);
	pl->spec_buf = calloc((size_t)g->n_nodes + 1, sizeof *pl->spec_buf);
	pl->deferred = calloc((size_t)g->n_nodes + 1, sizeof *pl->deferred);
	pl->load = calloc((size_t)nt + 1, sizeof *pl->load);
	pl->gpu_load = calloc((size_t)nt + 1, sizeof *pl->gpu_load);
	pl->bytes = calloc((size_t)nt + 1, sizeof *pl->bytes);
	pl->ok = calloc((size_t)nt + 1, sizeof *pl->ok);
	if (!pl->p->task || !pl->p->why || !pl->p->soft || !pl->p->gpu || !pl->spec ||
	    !pl->spec_buf || !pl->deferred || !pl->load || !pl->gpu_load || !pl->bytes || !pl->ok)
		return dg_err_set(err, DG_ENOMEM, "out of memory placing %d nodes", g->n_nodes);
	for (int n = 0; n < g->n_nodes; n++)
		pl->p->task[n] = pl->p->gpu[n] = -1;
	for (int t = 0; t < nt; t++)
		pl->bytes[t] = pl->o && pl->o->task_bytes ? pl->o->task_bytes[t] : 0;
	pl->n_ps = dg_cluster_job_size(pl->c, "ps");
	for (int n = 0; n < g->n_nodes; n++) {
		const struct dg_node *nd = &g->nodes[n];
		pl->spec[n].task = -1;
		if (!nd->device || !nd->device[0])
			continue;
		pl->spec_buf[n] = strdup(nd->device);
		if (!pl->spec_buf[n])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		if (!parse_device(pl->spec_buf[n], &pl->spec[n])) {
			dg_err_set(err, DG_EINVAL, "node '%s': device '%.128s' is not a device "
				   "name", nd->name, nd->device);
			dg_err_hint(err, "write /job:NAME/task:I, optionally followed by /cpu:0 or "
				    "/gpu:K (or /device:GPU:K)");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

static void placer_deinit(struct placer *pl)
{
	for (int n = 0; pl->spec_buf && n < pl->g->n_nodes; n++)
		free(pl->spec_buf[n]);
	free(pl->spec_buf);
	free(pl->spec);
	free(pl->deferred);
	free(pl->load);
	free(pl->gpu_load);
	free(pl->bytes);
	free(pl->ok);
}

enum dg_status place_graph(const struct dg_graph *g, const struct dg_cluster *c,
			   const struct place_opts *opts, struct placement *out,
			   struct dg_err *err)
{
	struct placer pl = { .g = g, .c = c, .o = opts, .p = out };
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if (c->n_tasks == 0)
		return dg_err_set(err, DG_EINVAL, "the cluster has no tasks to place the graph on");
	st = placer_init(&pl, err);
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		st = check_spec(&pl, n, err);
	/* An explicit GPU holds (its task has one, or soft placement moved it). */
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		if (pl.spec[n].gpu && !out->soft[n])
			out->gpu[n] = pl.spec[n].gpu_index;
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		if (master_is_apply(&g->nodes[n]))
			st = master_check_apply(g, n, err);
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		if (on_ps(&g->nodes[n]))
			place_variable(&pl, n);
	/* Computation in topological order, so every input's task is known (or
	 * deferred) when its consumer is placed. */
	for (int i = 0; st == DG_OK && i < g->n_nodes; i++) {
		int n = g->order[i];
		const struct dev_spec *d = &pl.spec[n];
		int with;
		if (on_ps(&g->nodes[n]))
			continue;
		if ((with = colocate_task(&pl, n)) >= 0) {
			out->task[n] = with;
			out->why[n] = "colocated";
			pl.load[with] += work_est(g, n);
		} else if (g->nodes[n].n_in == 0 && !(d->job && d->task >= 0))
			pl.deferred[n] = true;
		else if (master_is_apply(&g->nodes[n]) && !(d->job && d->task >= 0) &&
			 out->task[g->nodes[n].in[0].node] >= 0)
			place_with_gradient(&pl, n);
		else
			place_compute(&pl, n);
	}
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++) {
		if (out->task[n] >= 0 || on_ps(&g->nodes[n]))
			continue;
		out->task[n] = least_loaded(&pl, n);
		out->why[n] = "cost";
		pl.load[out->task[n]] += work_est(g, n);
	}
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++) {
		if (out->task[n] < 0) {
			st = dg_err_set(err, DG_EINVAL, "node '%s': no task of the cluster "
					"fits its device '%s'", g->nodes[n].name,
					g->nodes[n].device ? g->nodes[n].device : "");
		}
	}
	if (st == DG_OK)
		plan_reasons(&pl);
	placer_deinit(&pl);
	if (st != DG_OK)
		placement_deinit(out);
	return st;
}

void placement_deinit(struct placement *p)
{
	if (!p)
		return;
	free(p->task);
	free(p->why);
	free(p->soft);
	free(p->gpu);
	memset(p, 0, sizeof *p);
}

