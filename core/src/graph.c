/* The graph IR: a JSON graph document (doc/graph-format.md) parsed with jansson
 * into nodes with resolved input edges, then validated before anything runs:
 * names, ops, arity, attrs, edges, cycles (Kahn's algorithm, iterative) and
 * dtype/shape inference in topological order. Every error names the node.
 * Ops come from a lookup function (the registry in kernels/), so core/ does not
 * depend on kernels/. worker/exec.c and the master consume the result. */
#include "dg/graph.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"

#define GRAPH_MAX_BYTES ((size_t)1 << 30)      /* graph file size accepted by dg_graph_load */
#define GRAPH_MAX_ATTR_VALUES ((int64_t)1 << 24) /* JSON values in one node's attrs */
#define SUGGEST_MAX_LEN 64                      /* longest unknown op name we try to correct */

/* Name -> node index: open addressing with linear probing; capacity is a power
 * of two at least twice the node count, so probes stay short. slot[i] holds
 * index + 1, 0 meaning empty. */
struct name_table {
	size_t mask;
	int *slot;
};

/* What dg_graph_parse allocates: the public struct first, so dg_graph_free
 * and dg_graph_find can recover the private index from a struct dg_graph *.
 * Graphs therefore only come from this file's constructors. */
struct graph_impl {
	struct dg_graph g;
	struct name_table names;
};

static const char *const top_keys[] = { "nodes", "fetch", "version", "doc", "training", NULL };
static const char *const node_keys[] = { "name", "op", "inputs", "attrs", "device", "doc", NULL };

static bool key_allowed(const char *const *keys, const char *k)
{
	for (; *keys; keys++)
		if (strcmp(*keys, k) == 0)
			return true;
	return false;
}

/* --- name table ---------------------------------------------------------- */

/* FNV-1a over n bytes: names are short, and this needs no NUL terminator. */
static uint64_t hash_name(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

static int table_init(struct name_table *t, int n)
{
	size_t cap = 16;

	while (cap < (size_t)n * 2)
		cap *= 2;
	t->slot = calloc(cap, sizeof *t->slot);
	t->mask = cap - 1;
	return t->slot ? 0 : -1;
}

/* Index of the node whose name is s[0..n), or -1. */
static int table_find(const struct name_table *t, const struct dg_node *nodes, const char *s,
		      size_t n)
{
	if (!t->slot)
		return -1;
	for (size_t i = hash_name(s, n) & t->mask;; i = (i + 1) & t->mask) {
		int v = t->slot[i];
		if (v == 0)
			return -1;
		const char *name = nodes[v - 1].name;
		if (strncmp(name, s, n) == 0 && name[n] == '\0')
			return v - 1;
	}
}

/* Insert node idx (its name must be set). Returns -1, or the index of an
 * earlier node with the same name (nothing inserted then). */
static int table_insert(struct name_table *t, const struct dg_node *nodes, int idx)
{
	const char *name = nodes[idx].name;

	for (size_t i = hash_name(name, strlen(name)) & t->mask;; i = (i + 1) & t->mask) {
		int v = t->slot[i];
		if (v == 0) {
			t->slot[i] = idx + 1;
			return -1;
		}
		if (strcmp(nodes[v - 1].name, name) == 0)
			return v - 1;
	}
}

/* --- small checks -------------------------------------------------------- */

static bool name_char_ok(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == '/' || c == '-';
}

/* Split "node" or "node:k" into the name length and the output index. The
 * index is decimal digits only (no sign), at most INT_MAX. Returns false on a
 * malformed index; the name part is checked by the lookup that follows. */
static bool split_ref(const char *ref, size_t *name_len, int *index)
{
	const char *colon = strchr(ref, ':');
	long long k = 0;

	*index = 0;
	if (!colon) {
		*name_len = strlen(ref);
		return true;
	}
	*name_len = (size_t)(colon - ref);
	const char *p = colon + 1;
	if (*p == '\0')
		return false;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return false;
		k = k * 10 + (*p - '0');
		if (k > INT_MAX)
			return false;
	}
	*index = (int)k;
	return true;
}

/* Measure an attrs value: nesting depth and number of JSON values. Recursion
 * stops at DG_GRAPH_MAX_DEPTH, so the C stack stays bounded whatever the input. */
static bool attr_size_ok(const json_t *v, int depth, int64_t *count)
{
	size_t i;
	const char *k;
	json_t *e;

	if (depth > DG_GRAPH_MAX_DEPTH || ++*count > GRAPH_MAX_ATTR_VALUES)
		return false;
	if (json_is_array(v)) {
		json_array_foreach(v, i, e)
			if (!attr_size_ok(e, depth + 1, count))
				return false;
	} else if (json_is_object(v)) {
		json_object_foreach((json_t *)v, k, e)
			if (!attr_size_ok(e, depth + 1, count))
				return false;
	}
	return true;
}

/* --- unknown-op suggestions ---------------------------------------------
 * The lookup function is all core/ knows of the registry, so instead of
 * scanning every op name we generate the names within edit distance 1 of the
 * unknown one (and every upper/lower-case variant of it) and ask the lookup.
 * That finds the usual mistakes: "add", "Matmul", "Sofmax", "Sbu". */

static const char *try_case_variants(const char *name, dg_op_lookup_fn lookup)
{
	char buf[SUGGEST_MAX_LEN + 1];
	int pos[14], n_letters = 0;
	size_t len = strlen(name);

	memcpy(buf, name, len + 1);
	for (size_t i = 0; i < len; i++) {
		if ((buf[i] >= 'a' && buf[i] <= 'z') || (buf[i] >= 'A' && buf[i] <= 'Z')) {
			if (n_letters == 14)
				return NULL;   /* 2^14 variants at most */
			pos[n_letters++] = (int)i;
		}
	}
	for (unsigned mask = 0; mask < (1u << n_letters); mask++) {
		for (int b = 0; b < n_letters; b++) {
			char c = buf[pos[b]];
			c = (char)(c | 0x20);  /* lower */
			buf[pos[b]] = (mask >> b) & 1 ? (char)(c & ~0x20) : c;
		}
		const struct dg_op_def *op = lookup(buf);
		if (op)
			return op->name;
	}
	return NULL;
}

static const char *try_edits(const char *name, dg_op_lookup_fn lookup)
{
	static const char alpha[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_";
	char buf[SUGGEST_MAX_LEN + 2];
	size_t len = strlen(name);
	const struct dg_op_def *op;

	for (size_t i = 0; i < len; i++) {              /* deletion */
		memcpy(buf, name, i);
		memcpy(buf + i, name + i + 1, len - i);
		if ((op = lookup(buf)))
			return op->name;
	}
	for (size_t i = 0; i + 1 < len; i++) {          /* transposition */
		memcpy(buf, name, len + 1);
		buf[i] = name[i + 1];
		buf[i + 1] = name[i];
		if ((op = lookup(buf)))
			return op->name;
	}
	for (size_t i = 0; i <= len; i++) {             /* substitution, insertion */
		for (const char *a = alpha; *a; a++) {
			if (i < len) {
				memcpy(buf, name, len + 1);
				buf[i] = *a;
				if ((op = lookup(buf)))
					return op->name;
			}
			memcpy(buf, name, i);
			buf[i] = *a;
			memcpy(buf + i + 1, name + i, len - i + 1);
			if ((op = lookup(buf)))
				return op->name;
		}
	}
	return NULL;
}

static const char *suggest_op(const char *name, dg_op_lookup_fn lookup)
{
	const char *s;

	if (strlen(name) == 0 || strlen(name) > SUGGEST_MAX_LEN)
		return NULL;
	s = try_case_variants(name, lookup);
	return s ? s : try_edits(name, lookup);
}

/* --- pass 1: one node's own fields --------------------------------------- */

static enum dg_status parse_name(struct graph_impl *gi, int i, const json_t *jn,
				 struct dg_err *err)
{
	struct dg_node *n = &gi->g.nodes[i];
	const json_t *jname = json_object_get(jn, "name");
	const char *s;
	size_t len;

	if (!jname) {
		dg_err_set(err, DG_EINVAL, "nodes[%d] has no \"name\"", i);
		dg_err_hint(err, "give every node a unique \"name\"");
		return DG_EINVAL;
	}
	if (!json_is_string(jname))
		return dg_err_set(err, DG_EINVAL, "nodes[%d] \"name\" must be a string, got %s", i,
				  dg_json_kind(jname, true));
	s = json_string_value(jname);
	len = json_string_length(jname);
	if (len == 0)
		return dg_err_set(err, DG_EINVAL, "nodes[%d] has an empty name", i);
	if (len > DG_GRAPH_MAX_NAME) {
		dg_err_set(err, DG_ETOOLARGE, "nodes[%d] name '%.32s...' is %zu bytes; at most %d "
			   "allowed", i, s, len, DG_GRAPH_MAX_NAME);
		dg_err_hint(err, "use a shorter name");
		return DG_ETOOLARGE;
	}
	for (size_t k = 0; k < len; k++) {
		unsigned char c = (unsigned char)s[k];
		if (name_char_ok(c))
			continue;
		if (c > 0x20 && c < 0x7f)
			dg_err_set(err, DG_EINVAL, "nodes[%d] name '%.64s' has invalid character "
				   "'%c'", i, s, c);
		else
			dg_err_set(err, DG_EINVAL, "nodes[%d] name has invalid byte 0x%02x at %zu",
				   i, c, k);
		dg_err_hint(err, "names use letters, digits and _ . / - (':' separates an output "
			    "index, as in node:1)");
		return DG_EINVAL;
	}
	n->name = strdup(s);
	if (!n->name)
		return dg_err_set(err, DG_ENOMEM, "out of memory copying node names");
	int prev = table_insert(&gi->names, gi->g.nodes, i);
	if (prev >= 0) {
		dg_err_set(err, DG_EINVAL, "node '%s' is defined twice (nodes[%d] and nodes[%d])",
			   s, prev, i);
		dg_err_hint(err, "node names must be unique; rename one of them");
		return DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status parse_op(struct dg_node *n, const json_t *jn, dg_op_lookup_fn lookup,
			       struct dg_err *err)
{
	const json_t *jop = json_object_get(jn, "op");
	const char *s, *guess;

	if (!jop) {
		dg_err_set(err, DG_EINVAL, "node '%s' has no \"op\"", n->name);
		dg_err_hint(err, "add \"op\": \"NAME\"; 'dg ops' lists the ops");
		return DG_EINVAL;
	}
	if (!json_is_string(jop))
		return dg_err_set(err, DG_EINVAL, "node '%s': \"op\" must be a string, got %s",
				  n->name, dg_json_kind(jop, true));
	s = json_string_value(jop);
	n->op = lookup(s);
	if (n->op)
		return DG_OK;
	dg_err_set(err, DG_EINVAL, "node '%s': unknown op '%.64s'", n->name, s);
	guess = suggest_op(s, lookup);
	if (guess)
		dg_err_hint(err, "did you mean '%s'? 'dg ops' lists the ops", guess);
	else
		dg_err_hint(err, "'dg ops' lists the ops (names are case-sensitive)");
	return DG_EINVAL;
}

static enum dg_status parse_attrs(struct dg_node *n, const json_t *jn, json_t *empty,
				  struct dg_err *err)
{
	json_t *ja = json_object_get(jn, "attrs");
	int64_t count = 0;
	int n_out;
	enum dg_status st;

	if (ja && !json_is_null(ja)) {
		if (!json_is_object(ja))
			return dg_err_set(err, DG_EINVAL, "node '%s' (%s): \"attrs\" must be an "
					  "object, got %s", n->name, n->op->name,
					  dg_json_kind(ja, true));
		if (!attr_size_ok(ja, 1, &count)) {
			dg_err_set(err, DG_ETOOLARGE, "node '%s' (%s): attrs nest deeper than %d "
				   "or hold more than %lld values", n->name, n->op->name,
				   DG_GRAPH_MAX_DEPTH, (long long)GRAPH_MAX_ATTR_VALUES);
			dg_err_hint(err, "feed large tensors through a Placeholder instead of "
				    "inlining them");
			return DG_ETOOLARGE;
		}
		n->attrs = json_incref(ja);
	} else {
		/* One shared empty object: attrs are read-only references into the doc. */
		n->attrs = json_incref(empty);
	}
	st = dg_attr_validate(n->op, n->attrs, err);
	if (st != DG_OK)
		goto fail;
	n_out = n->op->n_outputs;
	if (n->op->num_outputs) {
		n_out = n->op->num_outputs(n->attrs, err);
		if (n_out < 0) {
			st = err->code != DG_OK ? err->code : DG_EINVAL;
			goto fail;
		}
	}
	if (n_out < 0 || n_out > DG_MAX_OUTPUTS) {
		st = dg_err_set(err, DG_ETOOLARGE, "%d outputs; at most %d allowed", n_out,
				DG_MAX_OUTPUTS);
		goto fail;
	}
	n->n_out = n_out;
	if (n_out > 0) {
		n->out = calloc((size_t)n_out, sizeof *n->out);
		if (!n->out)
			return dg_err_set(err, DG_ENOMEM, "out of memory for node '%s'", n->name);
	}
	return DG_OK;
fail:
	dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
	return st;
}

/* Check the "inputs" list's form and the op's arity; edges are resolved in
 * pass 2, when every name is known. */
static enum dg_status parse_inputs(struct dg_node *n, const json_t *jn, struct dg_err *err)
{
	const json_t *ji = json_object_get(jn, "inputs");
	const struct dg_op_def *op = n->op;
	int max = op->max_inputs < 0 ? DG_MAX_INPUTS : op->max_inputs;
	size_t count = 0, i;
	json_t *e;

	if (ji && !json_is_null(ji)) {
		if (!json_is_array(ji))
			return dg_err_set(err, DG_EINVAL, "node '%s' (%s): \"inputs\" must be "
					  "an array of names, got %s", n->name, op->name,
					  dg_json_kind(ji, true));
		count = json_array_size(ji);
		json_array_foreach(ji, i, e) {
			if (json_is_string(e))
				continue;
			return dg_err_set(err, DG_EINVAL, "node '%s' (%s): input %zu must be a "
					  "string \"node\" or \"node:k\", got %s", n->name,
					  op->name, i, dg_json_kind(e, true));
		}
	}
	if (count < (size_t)op->min_inputs || count > (size_t)max) {
		if (op->min_inputs == max)
			dg_err_set(err, DG_EINVAL, "node '%s' (%s): takes %d input%s, got %zu",
				   n->name, op->name, max, max == 1 ? "" : "s", count);
		else if (op->max_inputs < 0)
			dg_err_set(err, DG_EINVAL, "node '%s' (%s): takes at least %d input%s, "
				   "got %zu", n->name, op->name, op->min_inputs,
				   op->min_inputs == 1 ? "" : "s", count);
		else
			dg_err_set(err, DG_EINVAL, "node '%s' (%s): takes %d to %d inputs, got %zu",
				   n->name, op->name, op->min_inputs, max, count);
		dg_err_hint(err, "fix the node's \"inputs\" list; 'dg ops %s' describes the op",
			    op->name);
		return DG_EINVAL;
	}
	n->n_in = (int)count;
	if (count > 0) {
		n->in = calloc(count, sizeof *n->in);
		if (!n->in)
			return dg_err_set(err, DG_ENOMEM, "out of memory for node '%s'", n->name);
	}
	return DG_OK;
}

static enum dg_status parse_node(struct graph_impl *gi, int i, const json_t *jn,
				 dg_op_lookup_fn lookup, json_t *empty, struct dg_err *err)
{
	struct dg_node *n = &gi->g.nodes[i];
	const json_t *jd;
	const char *k;
	json_t *v;
	enum dg_status st;

	if (!json_is_object(jn)) {
		dg_err_set(err, DG_EINVAL, "nodes[%d] must be an object, got %s", i,
			   dg_json_kind(jn, true));
		dg_err_hint(err, "write each node as {\"name\": ..., \"op\": ..., "
			    "\"inputs\": [...]}");
		return DG_EINVAL;
	}
	st = parse_name(gi, i, jn, err);
	if (st != DG_OK)
		return st;
	json_object_foreach((json_t *)jn, k, v) {
		if (!key_allowed(node_keys, k)) {
			dg_err_set(err, DG_EINVAL, "node '%s' has unknown key '%.64s'", n->name, k);
			dg_err_hint(err, "node keys are: name, op, inputs, attrs, device, doc");
			return DG_EINVAL;
		}
	}
	st = parse_op(n, jn, lookup, err);
	if (st != DG_OK)
		return st;
	jd = json_object_get(jn, "doc");
	if (jd && !json_is_string(jd))
		return dg_err_set(err, DG_EINVAL, "node '%s' (%s): \"doc\" must be a string, "
				  "got %s", n->name, n->op->name, dg_json_kind(jd, true));
	jd = json_object_get(jn, "device");
	if (jd && !json_is_null(jd)) {
		if (!json_is_string(jd) || json_string_length(jd) > DG_GRAPH_MAX_NAME)
			return dg_err_set(err, DG_EINVAL, "node '%s' (%s): \"device\" must be a "
					  "device string such as \"/job:worker/task:0\"", n->name,
					  n->op->name);
		n->device = strdup(json_string_value(jd));
		if (!n->device)
			return dg_err_set(err, DG_ENOMEM, "out of memory for node '%s'", n->name);
	}
	st = parse_attrs(n, jn, empty, err);
	if (st != DG_OK)
		return st;
	return parse_inputs(n, jn, err);
}

/* --- pass 2: edges ------------------------------------------------------- */

/* Resolve ref against the graph's names. DG_ENOTFOUND for an unknown node,
 * DG_EINVAL for a bad index; the message does not name the consumer. */
static enum dg_status resolve(const struct graph_impl *gi, const char *ref, struct dg_edge *out,
			      struct dg_err *err)
{
	size_t len;
	int index, node;

	if (!split_ref(ref, &len, &index)) {
		dg_err_set(err, DG_EINVAL, "'%.64s' has an invalid output index", ref);
		dg_err_hint(err, "write \"node\" or \"node:k\" with k a non-negative integer");
		return DG_EINVAL;
	}
	node = table_find(&gi->names, gi->g.nodes, ref, len);
	if (node < 0) {
		dg_err_set(err, DG_ENOTFOUND, "'%.64s' names no node in the graph", ref);
		dg_err_hint(err, "node names are case-sensitive; check the spelling");
		return DG_ENOTFOUND;
	}
	const struct dg_node *p = &gi->g.nodes[node];
	if (index >= p->n_out) {
		dg_err_set(err, DG_EINVAL, "'%.64s' refers to output %d, but '%s' (%s) has %d "
			   "output%s", ref, index, p->name, p->op->name, p->n_out,
			   p->n_out == 1 ? "" : "s");
		dg_err_hint(err, "outputs are numbered from 0");
		return DG_EINVAL;
	}
	out->node = node;
	out->index = index;
	return DG_OK;
}

static enum dg_status resolve_inputs(struct graph_impl *gi, const json_t *jnodes,
				     struct dg_err *err)
{
	for (int i = 0; i < gi->g.n_nodes; i++) {
		struct dg_node *n = &gi->g.nodes[i];
		const json_t *ji = json_object_get(json_array_get(jnodes, (size_t)i), "inputs");
		for (int k = 0; k < n->n_in; k++) {
			const char *ref = json_string_value(json_array_get(ji, (size_t)k));
			enum dg_status st = resolve(gi, ref, &n->in[k], err);
			if (st != DG_OK) {
				/* A dangling input is a fault of this document: invalid. */
				dg_err_prefix(err, "node '%s' (%s): input %d", n->name, n->op->name,
					      k);
				err->code = DG_EINVAL;
				return DG_EINVAL;
			}
		}
	}
	return DG_OK;
}

/* --- topological order --------------------------------------------------- */

/* Every node left unsorted by Kahn's algorithm has an input from another
 * unsorted node, so walking such inputs backwards must revisit a node: that
 * walk is the cycle. Reported producer-first: "a -> b -> a". */
static enum dg_status report_cycle(const struct dg_graph *g, const int *indeg, struct dg_err *err)
{
	int n = g->n_nodes, cur = -1, len = 0;
	int *seen = malloc((size_t)n * sizeof *seen);
	int *path = malloc((size_t)n * sizeof *path);
	char text[200];
	size_t used = 0;

	if (!seen || !path) {
		free(seen);
		free(path);
		return dg_err_set(err, DG_EINVAL, "graph has a cycle");
	}
	for (int i = 0; i < n; i++) {
		seen[i] = -1;
		if (cur < 0 && indeg[i] > 0)
			cur = i;
	}
	while (seen[cur] < 0) {
		const struct dg_node *nd = &g->nodes[cur];
		seen[cur] = len;
		path[len++] = cur;
		for (int k = 0; k < nd->n_in; k++) {
			if (indeg[nd->in[k].node] > 0) {
				cur = nd->in[k].node;
				break;
			}
		}
	}
	/* path[seen[cur]..len) runs consumer -> producer and path[seen[cur]] is cur,
	 * so producer-first it reads cur -> path[len-1] -> ... -> path[seen[cur]]. */
	used = (size_t)snprintf(text, sizeof text, "%s", g->nodes[cur].name);
	for (int k = len - 1; k >= seen[cur] && used < sizeof text; k--) {
		const char *name = g->nodes[path[k]].name;
		if (used + strlen(name) + 12 > sizeof text) {
			snprintf(text + used, sizeof text - used, " -> ...");
			break;
		}
		used += (size_t)snprintf(text + used, sizeof text - used, " -> %s", name);
	}
	dg_err_set(err, DG_EINVAL, "graph has a cycle: %s", text);
	dg_err_hint(err, "a node cannot depend on its own output; remove one edge of the cycle");
	free(seen);
	free(path);
	return DG_EINVAL;
}

/* The ready nodes of topo_sort: a binary min-heap of node indices. */
static void heap_push(int *h, int *n, int v)
{
	int i = (*n)++;

	while (i > 0 && h[(i - 1) / 2] > v) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = v;
}

static int heap_pop(int *h, int *n)
{
	int top = h[0], last = h[--*n], i = 0;

	for (;;) {
		int c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && h[c + 1] < h[c])
			c++;
		if (h[c] >= last)
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n > 0)
		h[i] = last;
	return top;
}

/* Kahn's algorithm over a CSR list of consumers. The ready node earliest in
 * the file goes first, so a graph written in an order its edges allow keeps
 * it (the executor runs ready nodes in this order: a model copied micro-batch
 * by micro-batch stays so, and its stages pipeline). O((nodes + edges) log
 * nodes), no recursion. */
static enum dg_status topo_sort(struct dg_graph *g, struct dg_err *err)
{
	int n = g->n_nodes, tail = 0, n_ready = 0;
	size_t n_edges = 0;
	enum dg_status st = DG_OK;
	int *indeg = calloc((size_t)n + 1, sizeof *indeg);
	int *ready = malloc(((size_t)n + 1) * sizeof *ready);
	size_t *start = calloc((size_t)n + 2, sizeof *start);
	int *adj = NULL;

	g->order = malloc(((size_t)n + 1) * sizeof *g->order);
	for (int v = 0; v < n; v++)
		n_edges += (size_t)g->nodes[v].n_in;
	adj = malloc((n_edges + 1) * sizeof *adj);
	if (!indeg || !ready || !start || !g->order || !adj) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory sorting %d nodes", n);
		goto out;
	}
	/* start[u+1] counts u's consumers; after the prefix sum start[u] is where
	 * u's consumers begin in adj. Filling advances start[u] to its end, so the
	 * array is shifted back by one afterwards. */
	for (int v = 0; v < n; v++) {
		for (int k = 0; k < g->nodes[v].n_in; k++)
			start[g->nodes[v].in[k].node + 1]++;
		indeg[v] = g->nodes[v].n_in;
	}
	for (int u = 0; u < n; u++)
		start[u + 1] += start[u];
	for (int v = 0; v < n; v++)
		for (int k = 0; k < g->nodes[v].n_in; k++)
			adj[start[g->nodes[v].in[k].node]++] = v;
	for (int u = n; u > 0; u--)
		start[u] = start[u - 1];
	start[0] = 0;

	for (int v = 0; v < n; v++)
		if (indeg[v] == 0)
			heap_push(ready, &n_ready, v);
	while (n_ready > 0) {
		int u = heap_pop(ready, &n_ready);
		g->order[tail++] = u;
		for (size_t e = start[u]; e < start[u + 1]; e++)
			if (--indeg[adj[e]] == 0)
				heap_push(ready, &n_ready, adj[e]);
	}
	if (tail < n)
		st = report_cycle(g, indeg, err);
out:
	free(indeg);
	free(ready);
	free(start);
	free(adj);
	return st;
}

/* --- inference ----------------------------------------------------------- */

static bool ttype_sane(const struct dg_ttype *t)
{
	if ((unsigned)t->dtype >= DG_DTYPE_COUNT || t->shape.ndim < -1 ||
	    t->shape.ndim > DG_MAX_DIMS)
		return false;
	for (int i = 0; i < t->shape.ndim; i++)
		if (t->shape.dim[i] < -1)
			return false;
	return true;
}

/* DG_ETOOLARGE when the known sizes of an inferred shape multiply past
 * DG_MAX_NUMEL (zeros and unknowns left out, as dg_shape_numel does). Checked
 * after every node, so each infer sees inputs whose dims and products are
 * bounded and can add or multiply them without overflowing int64. */
static enum dg_status ttype_bounded(const struct dg_ttype *t, int o, struct dg_err *err)
{
	int64_t n = 1;
	char buf[200];

	for (int i = 0; i < t->shape.ndim; i++) {
		int64_t d = t->shape.dim[i];
		if (d <= 0)
			continue;
		if (d > DG_MAX_NUMEL / n) {
			dg_shape_format(&t->shape, buf, sizeof buf);
			dg_err_set(err, DG_ETOOLARGE, "output %d would have shape %s, more than "
				   "2^48 elements", o, buf);
			dg_err_hint(err, "check the sizes in the shape attrs feeding this node");
			return DG_ETOOLARGE;
		}
		n *= d;
	}
	return DG_OK;
}

/* Run every op's infer in topological order: each node sees its producers'
 * inferred types. Errors are prefixed "node 'y1' (Add): ". */
static enum dg_status infer_all(struct dg_graph *g, struct dg_err *err)
{
	int max_in = 1;
	struct dg_ttype *in;
	enum dg_status st = DG_OK;

	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].n_in > max_in)
			max_in = g->nodes[i].n_in;
	in = malloc((size_t)max_in * sizeof *in);
	if (!in)
		return dg_err_set(err, DG_ENOMEM, "out of memory inferring types");
	for (int k = 0; k < g->n_nodes && st == DG_OK; k++) {
		struct dg_node *n = &g->nodes[g->order[k]];
		for (int i = 0; i < n->n_in; i++)
			in[i] = g->nodes[n->in[i].node].out[n->in[i].index];
		for (int o = 0; o < n->n_out; o++) {
			n->out[o].dtype = DG_F32;
			n->out[o].shape.ndim = -1;
		}
		if (!n->op->infer) {
			st = dg_err_set(err, DG_EINTERNAL, "op has no shape inference");
		} else {
			struct dg_infer_ctx c = {
				.attrs = n->attrs, .n_in = n->n_in, .in = in,
				.n_out = n->n_out, .out = n->out, .err = err,
			};
			st = n->op->infer(&c);
			if (st != DG_OK && err->code == DG_OK)
				dg_err_set(err, st, "inference failed");
		}
		for (int o = 0; st == DG_OK && o < n->n_out; o++) {
			if (!ttype_sane(&n->out[o]))
				st = dg_err_set(err, DG_EINTERNAL, "inference produced an invalid "
						"type for output %d (a bug in the op)", o);
			else
				st = ttype_bounded(&n->out[o], o, err);
		}
		if (st != DG_OK)
			dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
	}
	free(in);
	return st;
}

/* --- document level ------------------------------------------------------ */

static enum dg_status check_top(const json_t *doc, struct dg_err *err)
{
	const char *k;
	json_t *v;

	if (!json_is_object(doc)) {
		dg_err_set(err, DG_EINVAL, "a graph must be a JSON object with a \"nodes\" array, "
			   "got %s", dg_json_kind(doc, true));
		dg_err_hint(err, "see doc/graph-format.md");
		return DG_EINVAL;
	}
	json_object_foreach((json_t *)doc, k, v) {
		if (!key_allowed(top_keys, k)) {
			dg_err_set(err, DG_EINVAL, "graph has unknown top-level key '%.64s'", k);
			dg_err_hint(err, "top-level keys are: nodes, fetch, version, doc, training");
			return DG_EINVAL;
		}
	}
	v = json_object_get(doc, "version");
	if (v && !json_is_integer(v))
		return dg_err_set(err, DG_EINVAL, "graph \"version\" must be an integer, got %s",
				  dg_json_kind(v, true));
	if (v && json_integer_value(v) != 1) {
		dg_err_set(err, DG_EUNSUPPORTED, "graph version %lld is not supported",
			   (long long)json_integer_value(v));
		dg_err_hint(err, "this dg reads graph format version 1");
		return DG_EUNSUPPORTED;
	}
	v = json_object_get(doc, "doc");
	if (v && !json_is_string(v))
		return dg_err_set(err, DG_EINVAL, "graph \"doc\" must be a string, got %s",
				  dg_json_kind(v, true));
	v = json_object_get(doc, "nodes");
	if (!v) {
		dg_err_set(err, DG_EINVAL, "graph has no \"nodes\" array");
		dg_err_hint(err, "see doc/graph-format.md");
		return DG_EINVAL;
	}
	if (!json_is_array(v))
		return dg_err_set(err, DG_EINVAL, "graph \"nodes\" must be an array, got %s",
				  dg_json_kind(v, true));
	if (json_array_size(v) > DG_GRAPH_MAX_NODES) {
		dg_err_set(err, DG_ETOOLARGE, "graph has %zu nodes; at most %d are allowed",
			   json_array_size(v), DG_GRAPH_MAX_NODES);
		dg_err_hint(err, "split the work into several graphs");
		return DG_ETOOLARGE;
	}
	return DG_OK;
}

static enum dg_status parse_fetch(struct graph_impl *gi, const json_t *doc, struct dg_err *err)
{
	const json_t *jf = json_object_get(doc, "fetch");
	struct dg_graph *g = &gi->g;
	size_t i;
	json_t *e;

	if (!jf || json_is_null(jf))
		return DG_OK;
	if (!json_is_array(jf)) {
		dg_err_set(err, DG_EINVAL, "graph \"fetch\" must be an array of names, got %s",
			   dg_json_kind(jf, true));
		dg_err_hint(err, "write e.g. \"fetch\": [\"y\"]");
		return DG_EINVAL;
	}
	if (json_array_size(jf) > DG_GRAPH_MAX_NODES)
		return dg_err_set(err, DG_ETOOLARGE, "graph \"fetch\" lists too many names");
	g->fetch = calloc(json_array_size(jf) + 1, sizeof *g->fetch);
	if (!g->fetch)
		return dg_err_set(err, DG_ENOMEM, "out of memory for the fetch list");
	json_array_foreach(jf, i, e) {
		if (!json_is_string(e))
			return dg_err_set(err, DG_EINVAL, "graph \"fetch\"[%zu] must be a string, "
					  "got %s", i, dg_json_kind(e, true));
		if (resolve(gi, json_string_value(e), &g->fetch[i], err) != DG_OK) {
			dg_err_prefix(err, "graph \"fetch\"[%zu]", i);
			err->code = DG_EINVAL;
			return DG_EINVAL;
		}
		g->n_fetch++;
	}
	return DG_OK;
}

struct dg_graph *dg_graph_from_json(json_t *doc, dg_op_lookup_fn lookup, struct dg_err *err)
{
	struct dg_err local = { 0 };
	struct graph_impl *gi;
	const json_t *jnodes;
	json_t *empty = NULL;
	enum dg_status st;
	int n;

	if (!err)
		err = &local;
	dg_err_clear(err);
	if (!doc || !lookup) {
		dg_err_set(err, DG_EINVAL, "no graph document or op lookup given");
		return NULL;
	}
	if (check_top(doc, err) != DG_OK)
		return NULL;
	jnodes = json_object_get(doc, "nodes");
	n = (int)json_array_size(jnodes);
	gi = calloc(1, sizeof *gi);
	if (!gi) {
		dg_err_set(err, DG_ENOMEM, "out of memory for a graph of %d nodes", n);
		return NULL;
	}
	gi->g.doc = json_incref(doc);
	gi->g.nodes = calloc((size_t)n + 1, sizeof *gi->g.nodes);
	empty = json_object();
	if (!gi->g.nodes || !empty || table_init(&gi->names, n) != 0) {
		dg_err_set(err, DG_ENOMEM, "out of memory for a graph of %d nodes", n);
		goto fail;
	}
	gi->g.n_nodes = n;
	for (int i = 0; i < n; i++) {
		st = parse_node(gi, i, json_array_get(jnodes, (size_t)i), lookup, empty, err);
		if (st != DG_OK)
			goto fail;
	}
	if (resolve_inputs(gi, jnodes, err) != DG_OK || topo_sort(&gi->g, err) != DG_OK ||
	    infer_all(&gi->g, err) != DG_OK || parse_fetch(gi, doc, err) != DG_OK)
		goto fail;
	json_decref(empty);
	return &gi->g;
fail:
	json_decref(empty);
	dg_graph_free(&gi->g);
	return NULL;
}

struct dg_graph *dg_graph_parse(const char *text, size_t len, dg_op_lookup_fn lookup,
				struct dg_err *err)
{
	json_error_t je;
	json_t *doc;
	struct dg_graph *g;

	if (!text) {
		dg_err_set(err, DG_EINVAL, "no graph text given");
		return NULL;
	}
	if (len > GRAPH_MAX_BYTES) {
		dg_err_set(err, DG_ETOOLARGE, "graph text is %zu bytes; at most %zu allowed", len,
			   GRAPH_MAX_BYTES);
		return NULL;
	}
	/* DECODE_ANY: a top-level number or string gets our clearer "must be an
	 * object" message. jansson bounds nesting (JSON_PARSER_MAX_DEPTH) itself,
	 * so a hostile [[[[... fails here instead of overflowing the stack. */
	doc = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
	if (!doc) {
		enum json_error_code jc = json_error_code(&je);
		enum dg_status code = jc == json_error_out_of_memory ? DG_ENOMEM :
				      jc == json_error_stack_overflow ? DG_ETOOLARGE : DG_EINVAL;
		dg_err_set(err, code, "graph is not valid JSON: %s (line %d, column %d)", je.text,
			   je.line, je.column);
		if (code == DG_ETOOLARGE)
			dg_err_hint(err, "JSON nests deeper than %d levels", JSON_PARSER_MAX_DEPTH);
		else
			dg_err_hint(err, "check the file with: python3 -m json.tool FILE");
		return NULL;
	}
	g = dg_graph_from_json(doc, lookup, err);
	json_decref(doc);
	return g;
}

struct dg_graph *dg_graph_load(const char *path, dg_op_lookup_fn lookup, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	struct dg_graph *g = NULL;

	if (dg_buf_read_file(&b, path, GRAPH_MAX_BYTES, err) == DG_OK) {
		g = dg_graph_parse(b.data ? b.data : "", b.len, lookup, err);
		if (!g)
			dg_err_prefix(err, "%s", path);
	} else if (err && err->code == DG_ENOTFOUND) {
		dg_err_hint(err, "check the path of the graph file");
	}
	dg_buf_deinit(&b);
	return g;
}

void dg_graph_free(struct dg_graph *g)
{
	struct graph_impl *gi = (struct graph_impl *)g;

	if (!g)
		return;
	for (int i = 0; g->nodes && i < g->n_nodes; i++) {
		struct dg_node *n = &g->nodes[i];
		free(n->name);
		json_decref(n->attrs);
		free(n->device);
		free(n->in);
		free(n->out);
	}
	free(g->nodes);
	free(g->order);
	free(g->fetch);
	json_decref(g->doc);
	free(gi->names.slot);
	free(gi);
}

int dg_graph_find(const struct dg_graph *g, const char *name)
{
	const struct graph_impl *gi = (const struct graph_impl *)g;

	if (!g || !name)
		return -1;
	return table_find(&gi->names, g->nodes, name, strlen(name));
}

enum dg_status dg_graph_ref(const struct dg_graph *g, const char *ref, struct dg_edge *out,
			    struct dg_err *err)
{
	if (!g || !ref || !*ref) {
		dg_err_set(err, DG_EINVAL, "empty node reference");
		dg_err_hint(err, "write \"node\" or \"node:k\"");
		return DG_EINVAL;
	}
	return resolve((const struct graph_impl *)g, ref, out, err);
}
