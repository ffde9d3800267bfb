/* libFuzzer target: the graph-JSON decoder and validator (core/src/graph.c
 * with the op registry of kernels/): parsing, arity and attr checks, edges,
 * cycles, and every op's dtype and shape inference. A graph is accepted with
 * every node typed or refused with a message; nothing crashes or leaks. */
#include <stdint.h>
#include <stdlib.h>

#include "dg/graph.h"
#include "dg/kernels.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse((const char *)data, size, dg_op_find, &err);

	fuzz_check_err(g != NULL, &err);
	for (int i = 0; g && i < g->n_nodes; i++) {
		FUZZ_ASSERT(g->nodes[i].op && g->nodes[i].name);
		FUZZ_ASSERT(g->order[i] >= 0 && g->order[i] < g->n_nodes);
		for (int k = 0; k < g->nodes[i].n_in; k++)
			FUZZ_ASSERT(g->nodes[i].in[k].node >= 0 &&
				    g->nodes[i].in[k].node < g->n_nodes);
	}
	dg_graph_free(g);
	return 0;
}
