/* The graph IR: the JSON graph format of doc/graph-format.md parsed with
 * jansson into nodes with resolved input edges, checked before anything runs
 * (unknown op, arity, attrs, dangling input, duplicate name, cycle, dtype and
 * shape inference), each error naming the node. */
#ifndef DG_GRAPH_H
#define DG_GRAPH_H

#include <jansson.h>

#include "dg/op.h"

/* Limits that keep hostile graphs from exhausting memory or stack. */
#define DG_GRAPH_MAX_NODES 1000000
#define DG_GRAPH_MAX_NAME 256          /* bytes in a node name */
#define DG_GRAPH_MAX_DEPTH 64          /* JSON nesting accepted in attrs */

/* One produced value: output `index` of node `node` (an index into nodes). */
struct dg_edge {
	int node;
	int index;
};

struct dg_node {
	char *name;                       /* owned */
	const struct dg_op_def *op;       /* borrowed from the registry */
	json_t *attrs;                    /* owned reference; an object, possibly empty */
	char *device;                     /* owned; NULL when unplaced */
	int n_in;
	struct dg_edge *in;               /* owned */
	int n_out;
	struct dg_ttype *out;             /* owned; inferred types of the outputs */
};

struct dg_graph {
	int n_nodes;
	struct dg_node *nodes;            /* owned, in file order */
	int *order;                       /* owned; a topological order of all nodes */
	int n_fetch;
	struct dg_edge *fetch;            /* owned; the graph's default fetches */
	json_t *doc;                      /* owned reference to the whole document */
};

/* Parse and validate a graph document. lookup finds ops (the registry's
 * dg_op_find). Returns an owned graph (dg_graph_free) or NULL with *err set:
 * DG_EINVAL for malformed JSON (with line and column), unknown ops, bad
 * arity/attrs, dangling inputs, duplicate names, cycles; DG_ESHAPE/DG_EDTYPE
 * from inference; DG_ETOOLARGE past the limits above. */
struct dg_graph *dg_graph_parse(const char *text, size_t len, dg_op_lookup_fn lookup,
				struct dg_err *err);
/* Same from an already-decoded document (borrowed; the graph takes a reference). */
struct dg_graph *dg_graph_from_json(json_t *doc, dg_op_lookup_fn lookup, struct dg_err *err);
/* Read a file and parse it (errors name the path). */
struct dg_graph *dg_graph_load(const char *path, dg_op_lookup_fn lookup, struct dg_err *err);
void dg_graph_free(struct dg_graph *g);

/* Index of the node called name, or -1. */
int dg_graph_find(const struct dg_graph *g, const char *name);
/* Resolve "node" or "node:k" to an edge; DG_ENOTFOUND / DG_EINVAL naming ref. */
enum dg_status dg_graph_ref(const struct dg_graph *g, const char *ref, struct dg_edge *out,
			    struct dg_err *err);

#endif
