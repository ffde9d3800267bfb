/* The schema of an op, as the graph validator and the executor see it. The
 * registry that fills it (names, kernels, gradients) lives in kernels/; core/
 * only defines the contract so that arrows point one way (kernels -> core). */
#ifndef DG_OP_H
#define DG_OP_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "dg/tensor.h"

/* What inference knows about one value: dtype always, shape possibly partial
 * (shape.ndim == -1: unknown rank; dim[i] == -1: unknown size). */
struct dg_ttype {
	enum dg_dtype dtype;
	struct dg_shape shape;
};

/* Shape/dtype inference, run once per node at validation. The framework has
 * already checked arity and attr names/kinds; out[0..n_out) must be filled.
 * Errors are prefixed with the node's name and op by the caller, so messages
 * say only what is wrong ("inner dimensions differ: [2,3] x [4,5]"). */
struct dg_infer_ctx {
	const json_t *attrs;            /* borrowed JSON object, never NULL */
	int n_in;
	const struct dg_ttype *in;
	int n_out;
	struct dg_ttype *out;
	struct dg_err *err;
};
typedef enum dg_status (*dg_infer_fn)(struct dg_infer_ctx *c);

/* A node's attrs as kernels read them (dg_attrs_* below): a view of the
 * node's attr table, parsed once from its JSON when its graph or fragment is
 * registered (dg_attr_table_new), so a step reads typed values, not JSON. At
 * validation, before any table exists, the same helpers read a JSON view
 * (dg_attrs_of_json). Passed by value; borrows the table or object. */
struct dg_attr_table;
struct dg_attrs {
	const struct dg_attr_table *tab;   /* parsed once (kernels); NULL: read json */
	const json_t *json;                /* the attrs object (NULL: none) */
};

/* A kernel run: inputs borrowed, outputs created by the kernel (owned tensors
 * stored in out[i], e.g. with cpu_out). On error the kernel returns the status
 * with c->err set; the caller frees whatever the kernel stored in out[]. The
 * caller zeroes out[] before the call. Kernels check actual shapes themselves:
 * inference may have had unknown dims. */
struct dg_kernel_ctx {
	struct dg_attrs attrs;             /* the node's table: no JSON is read per run */
	int n_in;
	const struct dg_tensor *const *in;
	int n_out;
	struct dg_tensor **out;
	uint64_t step;                  /* step number, 0 for a single evaluation */
	struct dg_err *err;
};
typedef enum dg_status (*dg_kernel_fn)(struct dg_kernel_ctx *c);

/* Gradient construction (worker/autodiff.c drives it): a gradient function
 * ADDS NODES through c->add that compute d(loss)/d(input i) from the refs of
 * d(loss)/d(output k), and stores their refs in din[i] (NULL: no gradient).
 * Refs are "node" or "node:k" strings owned by the builder. A gradient for
 * input i must have the input's shape (reduce broadcasts back). */
struct dg_grad_ctx {
	const char *node;                 /* forward node's name, for messages */
	const json_t *attrs;              /* forward node's attrs (an object) */
	int n_in;
	const char *const *in;            /* refs of the forward inputs */
	const struct dg_ttype *in_type;   /* their inferred types */
	const bool *need;                 /* need[i]: a gradient for input i is wanted */
	int n_out;
	const char *const *out;           /* refs of the forward outputs */
	const struct dg_ttype *out_type;
	const char *const *dout;          /* d(loss)/d(output k); NULL: none reaches it */
	const char **din;                 /* filled by the gradient function */
	/* Append node op(in[0..n_in)) with attrs (ownership taken; NULL = {}) and
	 * return the ref of its output 0, or NULL with *err set. */
	const char *(*add)(struct dg_grad_ctx *c, const char *op, const char *const *in,
			   int n_in, json_t *attrs);
	void *builder;                    /* the builder's state */
	struct dg_err *err;
};
typedef enum dg_status (*dg_grad_fn)(struct dg_grad_ctx *c);

/* A CUDA kernel: the context (stream, device tensors, attrs) is defined by
 * kernels/cuda (cuda_internal.h); core/ only carries the pointer, so no header
 * above kernels/cuda sees a CUDA type. kernels/registry.c sets an op's slot at
 * start-up in CUDA builds (kernels/cuda/dispatch.c lists them). */
struct dg_cuda_ctx;
typedef enum dg_status (*dg_cuda_kernel_fn)(struct dg_cuda_ctx *c);

/* Number of outputs of a node whose count depends on attrs (Split). Returns
 * a count >= 1, or -1 with *err set. */
typedef int (*dg_num_outputs_fn)(const json_t *attrs, struct dg_err *err);

enum dg_attr_kind {
	DG_ATTR_INT,       /* JSON integer */
	DG_ATTR_FLOAT,     /* JSON number (integers accepted) */
	DG_ATTR_BOOL,      /* JSON true/false */
	DG_ATTR_STRING,
	DG_ATTR_INTS,      /* JSON array of integers */
	DG_ATTR_DTYPE,     /* JSON string naming a dtype */
	DG_ATTR_SHAPE,     /* JSON array of integers (-1 = unknown) or null (unknown rank) */
	DG_ATTR_TENSOR,    /* a number, nested arrays, or {"dtype","shape","value"} */
	DG_ATTR_AXES,      /* an integer, an array of integers, or null (all axes) */
	DG_ATTR_JSON,      /* any JSON value, checked by the op's inference (a queue's
			    * components: an array of {"dtype", "shape"}) */
};

struct dg_attr_spec {
	const char *name;
	enum dg_attr_kind kind;
	bool required;
	const char *doc;          /* one line for doc/graph-format.md */
};

#define DG_OPF_SOURCE 0x1       /* takes no inputs (Const, Placeholder, initialisers) */
#define DG_OPF_STATEFUL 0x2     /* result not a pure function of inputs and attrs */
#define DG_OPF_FEED 0x4         /* must be fed at run time (Placeholder) */

#define DG_MAX_INPUTS 4096      /* variadic ops (Concat) */
#define DG_MAX_OUTPUTS 4096     /* Split */

struct dg_op_def {
	const char *name;                 /* "MatMul": TensorFlow's spelling */
	int min_inputs;
	int max_inputs;                   /* -1: up to DG_MAX_INPUTS */
	int n_outputs;                    /* fixed count; 0 when num_outputs decides */
	dg_num_outputs_fn num_outputs;
	const struct dg_attr_spec *attrs; /* terminated by {NULL}; other attr names are refused */
	dg_infer_fn infer;
	dg_kernel_fn cpu;                 /* NULL: the executor runs it (worker ops) */
	dg_cuda_kernel_fn cuda;           /* NULL: no GPU kernel; set by the registry */
	dg_grad_fn grad;                  /* NULL: not differentiable */
	unsigned flags;                   /* DG_OPF_* */
	const char *doc;                  /* one line */
};

/* Which layer runs an op, as bits so that a lookup can accept several. Every
 * op a graph can name is in the one registry of kernels/registry.c with its
 * layer: kernel ops (a CPU kernel, maybe a CUDA one) are registered by
 * kernels/ itself; the layers above add their tables at start-up (the worker's
 * _Send/_Recv/Var* ops, run by its executor; the master's Variable and
 * ApplyGradient, which placement lowers before anything runs). */
enum dg_op_layer {
	DG_OPL_KERNEL = 0x1,
	DG_OPL_WORKER = 0x2,
	DG_OPL_MASTER = 0x4,
};
#define DG_OPL_ALL (DG_OPL_KERNEL | DG_OPL_WORKER | DG_OPL_MASTER)

/* Find an op by name; NULL when unknown. Each lookup is a view of the one
 * registry restricted to the layers its callers accept (dg_op_find: kernel
 * ops; worker_op_find: kernel and worker ops; master_op_find: kernel and
 * master ops), so graph validation resolves every name through it. */
typedef const struct dg_op_def *(*dg_op_lookup_fn)(const char *name);

/* --- attribute accessors: used by infer functions and kernels --------------
 * def == NULL means the attr is required. Errors name the attr and what was
 * expected ("attr 'axis' must be an integer, got string"). */
enum dg_status dg_attr_int(const json_t *attrs, const char *key, const int64_t *def,
			   int64_t *out, struct dg_err *err);
enum dg_status dg_attr_float(const json_t *attrs, const char *key, const double *def,
			     double *out, struct dg_err *err);
enum dg_status dg_attr_bool(const json_t *attrs, const char *key, const bool *def, bool *out,
			    struct dg_err *err);
/* *out is borrowed from attrs (or def). */
enum dg_status dg_attr_string(const json_t *attrs, const char *key, const char *def,
			      const char **out, struct dg_err *err);
/* Up to max integers into out, count in *n. Missing and !required: *n = 0. */
enum dg_status dg_attr_ints(const json_t *attrs, const char *key, bool required, int64_t *out,
			    int max, int *n, struct dg_err *err);
enum dg_status dg_attr_dtype(const json_t *attrs, const char *key, const enum dg_dtype *def,
			     enum dg_dtype *out, struct dg_err *err);
/* A shape; allow_unknown permits -1 dims and null (unknown rank). Missing and
 * !required: unknown rank when allow_unknown, else DG_EINVAL. */
enum dg_status dg_attr_shape(const json_t *attrs, const char *key, bool required,
			     bool allow_unknown, struct dg_shape *out, struct dg_err *err);
/* Decode a JSON tensor literal: a number or bool (0-d), nested arrays
 * (rectangular), or {"dtype": D, "shape": [..], "value": number | flat or nested
 * array}. dt, when not NULL, forces the dtype; otherwise integers give int32
 * (int64 when out of int32 range), any fraction or exponent gives float32,
 * true/false give bool. Returns an owned tensor or NULL with *err set. */
struct dg_tensor *dg_json_to_tensor(const json_t *v, const enum dg_dtype *dt, struct dg_err *err);
/* The inverse, for small tensors in JSON replies: nested arrays of numbers. */
json_t *dg_tensor_to_json(const struct dg_tensor *t);

/* What v is, for "must be X, got Y" messages about JSON input: "an object",
 * "an array", "a string", "an integer", "a number", "a bool" or "null" (v NULL:
 * "nothing"). article false drops the "a "/"an " ("object", "integer"). The
 * string is static. */
const char *dg_json_kind(const json_t *v, bool article);

/* --- parsed attrs: one table per node, read at every step ------------------
 * dg_attr_table_new decodes a (validated) attrs object once: every integer,
 * number, bool, string, dtype name and integer array into typed slots. It
 * keeps a reference to the object (strings and raw values are borrowed from
 * it). Returns an owned table (dg_attr_table_free; NULL is fine) or NULL with
 * *err set (DG_ENOMEM, or DG_EINVAL when attrs is not an object). attrs NULL:
 * an empty table. Read-only afterwards: any number of threads may read it. */
struct dg_attr_table *dg_attr_table_new(const json_t *attrs, struct dg_err *err);
void dg_attr_table_free(struct dg_attr_table *t);
/* The view kernels get (t may be NULL: no attrs). */
struct dg_attrs dg_attr_table_view(const struct dg_attr_table *t);
/* A view of a JSON object (NULL: no attrs), for inference and tests: the
 * dg_attrs_* accessors then read the JSON, as dg_attr_* do. */
struct dg_attrs dg_attrs_of_json(const json_t *attrs);

/* The accessors of dg_attr_int & co. on a view, with the same arguments,
 * defaults and messages. On a table the typed value is a slot lookup (no JSON
 * decoding, no dtype parsing); anything unusual (a wrong kind, a value out of
 * range) is answered by the JSON accessor, so both give the same result. */
enum dg_status dg_attrs_int(struct dg_attrs a, const char *key, const int64_t *def,
			    int64_t *out, struct dg_err *err);
enum dg_status dg_attrs_float(struct dg_attrs a, const char *key, const double *def,
			      double *out, struct dg_err *err);
enum dg_status dg_attrs_bool(struct dg_attrs a, const char *key, const bool *def, bool *out,
			     struct dg_err *err);
enum dg_status dg_attrs_string(struct dg_attrs a, const char *key, const char *def,
			       const char **out, struct dg_err *err);
enum dg_status dg_attrs_ints(struct dg_attrs a, const char *key, bool required, int64_t *out,
			     int max, int *n, struct dg_err *err);
enum dg_status dg_attrs_dtype(struct dg_attrs a, const char *key, const enum dg_dtype *def,
			      enum dg_dtype *out, struct dg_err *err);
enum dg_status dg_attrs_shape(struct dg_attrs a, const char *key, bool required,
			      bool allow_unknown, struct dg_shape *out, struct dg_err *err);
/* The raw JSON value of key (borrowed), or NULL when absent: for values the
 * typed slots do not cover (tensor literals, axes given as an int or a list). */
const json_t *dg_attrs_get(struct dg_attrs a, const char *key);

/* Check attrs against an op's spec: every name known, every kind right, every
 * required one present. Errors name the attr. */
enum dg_status dg_attr_validate(const struct dg_op_def *op, const json_t *attrs,
				struct dg_err *err);

#endif
