/* Helpers shared by the worker test suites (test_train.c, test_master.c,
 * test_place.c): JSON written with ' for " in C strings, the cluster and graph
 * built from such text with a Criterion assert on failure, and a placed graph.
 * static inline so a suite that uses only some of them compiles without
 * unused-function warnings. */
#ifndef DG_MASTER_TEST_UTIL_H
#define DG_MASTER_TEST_UTIL_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dg/cluster.h"
#include "dg/graph.h"
#include "dg/place.h"

/* text with every ' turned into " (readable JSON in C strings); owned copy. */
static inline char *dq(const char *text)
{
	char *s = strdup(text);

	cr_assert_not_null(s);
	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	return s;
}

/* The cluster spec text (written with '); owned, asserts it parses. */
static inline struct dg_cluster *cl(const char *text)
{
	struct dg_err err = { 0 };
	char *json = dq(text);
	struct dg_cluster *c = dg_cluster_parse(json, strlen(json), &err);

	free(json);
	cr_assert_not_null(c, "cluster: %s", err.msg);
	return c;
}

/* The graph text (written with ') parsed with the master's op table
 * (master_op_find); owned, asserts it parses. */
static inline struct dg_graph *gr(const char *text)
{
	struct dg_err err = { 0 };
	char *json = dq(text);
	struct dg_graph *g = dg_graph_parse(json, strlen(json), master_op_find, &err);

	free(json);
	cr_assert_not_null(g, "graph: %s", err.msg);
	return g;
}

/* A cluster and a graph placed on it: the scaffolding of the placement tests. */
struct placed {
	struct dg_cluster *c;
	struct dg_graph *g;
	struct placement p;
};

/* Parse cluster and graph (written with ') and place the graph with opts
 * (may be NULL); asserts that place_graph succeeds. Release with placed_deinit. */
static inline void placed_init(struct placed *x, const char *cluster, const char *graph,
			       const struct place_opts *opts)
{
	struct dg_err err = { 0 };

	x->c = cl(cluster);
	x->g = gr(graph);
	cr_assert_eq(place_graph(x->g, x->c, opts, &x->p, &err), DG_OK, "%s", err.msg);
}

/* Free what placed_init made (a placement already released is fine). */
static inline void placed_deinit(struct placed *x)
{
	placement_deinit(&x->p);
	dg_graph_free(x->g);
	dg_cluster_free(x->c);
}

#endif
