/* The variable store of a parameter server: named tensors with versions,
 * update rules applied atomically, synchronous-replica accumulation, and
 * durability (write-ahead log + snapshots in the data directory). The HTTP
 * routes (routes.c) are a thin layer over these functions. Thread-safe:
 * every function may be called from any request thread. */
#ifndef PS_STORE_H
#define PS_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/tensor.h"

struct ps_store;

/* What an acknowledged gradient apply survives (doc/persistence.md). */
enum ps_durability {
	PS_DURABILITY_SNAPSHOT,         /* in the next snapshot (checkpoint_secs) */
	PS_DURABILITY_STRICT,           /* logged and fsync'ed (group commit) before the reply */
};
/* "snapshot" / "strict" -> the value; DG_EINVAL naming both otherwise. */
enum dg_status ps_durability_parse(const char *s, enum ps_durability *out, struct dg_err *err);
const char *ps_durability_name(enum ps_durability d);

struct ps_store_config {
	const char *data_dir;           /* NULL: memory only (nothing survives a restart) */
	unsigned checkpoint_secs;       /* snapshot period for applies; 0 = 5 */
	enum ps_durability durability;  /* strict needs data_dir */
};

/* Open the store: create data_dir if missing, recover snapshot + log, bump
 * and persist the epoch, start the checkpoint thread. Returns owned or NULL
 * with *err set (DG_EIO naming the file; a corrupt snapshot is DG_EIO with
 * the offset: dg never silently starts empty over existing data). */
struct ps_store *ps_store_open(const struct ps_store_config *cfg, struct dg_err *err);
/* Final checkpoint, stop threads, free. NULL is fine. */
void ps_store_close(struct ps_store *s);
/* The same, returning the final checkpoint's failure (logged too): a server
 * stopped on SIGTERM then exits non-zero. The store is freed either way. */
enum dg_status ps_store_close_final(struct ps_store *s, struct dg_err *err);
/* Restart counter: 1 on first start of a data dir, +1 each open (memory-only: 1). */
uint64_t ps_store_epoch(const struct ps_store *s);
/* The wall time (seconds since the Unix epoch) of the cut of the snapshot the
 * store recovered at open: applies after it were lost if the last run ended
 * without a final snapshot. 0: no snapshot (or one written before dg kept
 * its time). */
double ps_store_snapshot_at(const struct ps_store *s);
/* true when the store cannot promise what it should: its log failed (an
 * fdatasync error: restart needed), its disk was full at the last write, or
 * its last snapshot failed; why (n bytes) says which, for /v1/health. */
bool ps_store_degraded(struct ps_store *s, char *why, size_t n);
/* The durability of applies: PS_DURABILITY_SNAPSHOT for a memory-only store. */
enum ps_durability ps_store_durability(const struct ps_store *s);
/* Write a snapshot now and truncate the log (also run by the checkpoint
 * thread and on close). Memory only: does nothing, DG_OK. */
enum dg_status ps_store_checkpoint(struct ps_store *s, struct dg_err *err);

/* What one snapshot wrote (POST /v1/checkpoint). */
struct ps_ckpt_info {
	uint64_t epoch;                 /* the store's restart counter */
	int64_t vars;                   /* variables in the snapshot, slots included */
	uint64_t bytes;                 /* size of the snapshot file */
	double ms;                      /* wall time of the whole checkpoint */
};
/* Write a snapshot now, whether or not anything changed, and report it.
 * DG_EUNSUPPORTED for a memory-only store (nothing could be written). */
enum dg_status ps_store_checkpoint_now(struct ps_store *s, struct ps_ckpt_info *info,
				       struct dg_err *err);

/* An immutable view of one variable at one version. Holding it keeps the
 * bytes alive (reference-counted), so a large GET is sent without a copy
 * while updates go on; an update of a variable whose value is held writes a
 * new block instead of changing this one. */
struct ps_value {
	enum dg_dtype dtype;
	struct dg_shape shape;
	size_t nbytes;
	const void *data;
	uint64_t version;
	double mtime;                   /* seconds since the Unix epoch */
	int64_t step;                   /* the variable's sync step while this value
					 * is current (Dg-Step): what the next sync
					 * apply must carry */
};
/* Take a reference to the current value (DG_ENOTFOUND naming the variable). */
enum dg_status ps_store_get(struct ps_store *s, const char *name, struct ps_value **out,
			    struct dg_err *err);
/* Wait until version >= min_version or timeout_ms passes. On timeout returns
 * DG_ETIMEOUT with *out set to the current value (the caller answers 304 with
 * its headers and releases it). A variable deleted while waiting: DG_ENOTFOUND. */
enum dg_status ps_store_wait(struct ps_store *s, const char *name, uint64_t min_version,
			     int64_t timeout_ms, struct ps_value **out, struct dg_err *err);
/* ps_store_wait with a second condition: the variable's sync step >= min_step
 * as well (min_step <= 0: none). A synchronous replica's pull for step S waits
 * with min_step S: the value after step S-1 was applied. */
enum dg_status ps_store_wait_step(struct ps_store *s, const char *name, uint64_t min_version,
				  int64_t min_step, int64_t timeout_ms, struct ps_value **out,
				  struct dg_err *err);
void ps_value_release(struct ps_value *v);   /* NULL is fine */

/* The store's change log (watch.h): every put, patch, apply and delete. */
struct ps_watch *ps_store_watch(struct ps_store *s);

/* All variables whose name starts with prefix (NULL/"" = all), sorted by
 * name; *out owned (free()). */
enum dg_status ps_store_list(struct ps_store *s, const char *prefix, struct dg_var_info **out,
			     int *n, struct dg_err *err);

struct ps_put_opts {
	bool replace;                   /* allow another dtype/shape */
	bool create_only;               /* fail with DG_ECONFLICT if it exists */
	uint64_t if_match;              /* 0 = unconditional; else DG_ECONFLICT on mismatch */
};
/* Create or replace. Takes ownership of t (freed on every path). Durable
 * (logged + fsync'ed, group commit) before it returns DG_OK. *version gets
 * the new version, *created whether it did not exist. Another dtype/shape
 * without replace: DG_EDTYPE / DG_ESHAPE naming both. */
enum dg_status ps_store_put(struct ps_store *s, const char *name, struct dg_tensor *t,
			    const struct ps_put_opts *opts, uint64_t *version, bool *created,
			    struct dg_err *err);
/* Write n raw bytes at byte offset (element-aligned, inside the tensor:
 * DG_EINVAL otherwise, nothing written). Durable before return. */
enum dg_status ps_store_patch(struct ps_store *s, const char *name, uint64_t offset,
			      const void *p, size_t n, uint64_t if_match, uint64_t *version,
			      struct dg_err *err);
/* Delete a variable and its slots (NAME.momentum, NAME.adam_m, ...). Durable. */
enum dg_status ps_store_delete(struct ps_store *s, const char *name, uint64_t if_match,
			       struct dg_err *err);

/* The rules from PS_SGD to PS_RMSPROP take lr. */
enum ps_rule { PS_ASSIGN, PS_ASSIGN_ADD, PS_SGD, PS_MOMENTUM, PS_ADAM, PS_ADAGRAD, PS_RMSPROP,
	       PS_MOVING_AVERAGE };
/* "sgd" -> PS_SGD; DG_EINVAL listing the rules otherwise. */
enum dg_status ps_rule_parse(const char *s, enum ps_rule *out, struct dg_err *err);

struct ps_apply_args {
	enum ps_rule rule;
	double lr;                      /* sgd, momentum, adam, adagrad, rmsprop */
	double momentum;                /* momentum, rmsprop */
	bool nesterov;
	double beta1, beta2, eps;       /* adam (defaults 0.9, 0.999, 1e-8 filled by caller);
					 * eps also rmsprop (1e-10) */
	double rho;                     /* rmsprop: decay of the mean square (0.9);
					 * moving_average: its decay (0.99) */
	double init;                    /* adagrad: the accumulator's start (0.1);
					 * rmsprop: the mean square's (1.0) */
	/* Row-wise: g holds n_rows rows (g's shape [n_rows] + the variable's
	 * shape[1:]) for rows rows[i] of dim 0; duplicates are summed first.
	 * NULL: a dense update of the whole variable. Borrowed. */
	const int64_t *rows;
	int64_t n_rows;
	int64_t step;                   /* sync mode when >= 0 */
	int replicas;                   /* sync: N */
	int backup;                     /* sync: K (apply after N-K arrivals) */
	int64_t replica;                /* sync: replica id, -1 = anonymous */
};
struct ps_apply_result {
	bool applied;
	uint64_t version;
	int pending;                    /* sync: arrivals so far for the step */
	int64_t step;                   /* sync: the variable's step after this call */
};
/* Apply a rule with g (borrowed; must match the variable's dtype and shape,
 * or with a->rows the rows' shape: a row-wise update touches those rows of
 * the variable and of its slots only; adam's step counts applies).
 * Atomic; bumps the version once when applied. Sync mode: DG_ESTALE for a
 * step other than the variable's current one or a replica that already
 * reported. assign is durable like a put; the others are checkpointed, or
 * logged and synced before the return with PS_DURABILITY_STRICT. */
enum dg_status ps_store_apply(struct ps_store *s, const char *name,
			      const struct ps_apply_args *a, const struct dg_tensor *g,
			      struct ps_apply_result *res, struct dg_err *err);

/* The most bytes one read of rows may give (repeats allowed). */
#define PS_MAX_ROWS_BYTES ((uint64_t)1 << 30)
/* Rows rows[0..n) of dim 0 of value v (of variable name, for messages), in
 * that order (repeats allowed), as a new tensor [n] + shape[1:] (owned, in
 * *out). DG_EINVAL naming the first row out of range, or for more than
 * PS_MAX_ROWS_BYTES; DG_ESHAPE for a scalar. */
enum dg_status ps_value_rows(const struct ps_value *v, const char *name, const int64_t *rows,
			     int64_t n, struct dg_tensor **out, struct dg_err *err);
/* Rows rows[0..n) of dim 0 of a variable of rank >= 1, in that order
 * (repeats allowed), as a new tensor [n] + shape[1:] (owned, in *out);
 * *version gets the version they were read at. DG_EINVAL naming the first
 * row out of range; DG_ESHAPE for a scalar. */
enum dg_status ps_store_get_rows(struct ps_store *s, const char *name, const int64_t *rows,
				 int64_t n, struct dg_tensor **out, uint64_t *version,
				 struct dg_err *err);

/* Number of variables and their total bytes (slots included). */
void ps_store_stats(struct ps_store *s, int64_t *n_vars, int64_t *bytes);
/* Append Prometheus lines: dg_ps_vars, dg_ps_bytes, dg_ps_applies_total{var,rule},
 * dg_ps_checkpoints_total, dg_ps_epoch, dg_ps_wal_fsyncs_total,
 * dg_ps_checkpoint_failures_total, dg_ps_disk_full. */
enum dg_status ps_store_metrics(struct ps_store *s, struct dg_buf *out, struct dg_err *err);

#endif
