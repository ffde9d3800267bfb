/* What store.c needs from apply.c (private to ps/): argument checks and the
 * in-place arithmetic of the update rules and of synchronous accumulation.
 * store.c owns locking, slots, versions and copy-on-write; the functions here
 * only compute on the buffers they are given. */
#ifndef PS_STORE_INTERNAL_H
#define PS_STORE_INTERNAL_H

#include <stdint.h>

#include "dg/tensor.h"
#include "store.h"

#define PS_RULE_COUNT 8
#define PS_MAX_SLOTS 3

/* "sgd" for PS_SGD ("invalid" out of range). */
const char *ps_rule_name(enum ps_rule r);

/* Check the hyper-parameters the rule uses (lr >= 0 and finite, momentum >= 0,
 * 0 <= beta < 1, eps > 0) and, when a->step >= 0, the sync arguments
 * (1 <= replicas, 0 <= backup < replicas, replica >= -1). DG_EINVAL naming the
 * parameter and the variable. */
enum dg_status ps_apply_check_args(const struct ps_apply_args *a, const char *name,
				   struct dg_err *err);
/* May the rule (in sync mode when a->step >= 0) update a variable of dt?
 * DG_EDTYPE naming both otherwise. */
enum dg_status ps_apply_check_dtype(const struct ps_apply_args *a, enum dg_dtype dt,
				    const char *name, struct dg_err *err);

/* The rule's slot variables: their name suffixes (".momentum", ".adam_m",
 * ...) in *suffix (static strings), returns how many. A slot has the
 * variable's dtype and shape, except a counter slot (adam_t: int64 scalar). */
int ps_rule_slots(enum ps_rule r, const char *const **suffix);
bool ps_rule_slot_is_counter(enum ps_rule r, int i);
/* The value slot i starts at (every element): adagrad's and rmsprop's first
 * slot start at a->init, the others at 0. */
double ps_rule_slot_init(const struct ps_apply_args *a, int i);

/* Run the rule in place on n elements of dt: w -= ..., slot buffers updated
 * (slots[i] as ps_rule_slots orders them; adam's counter is incremented
 * here). g holds n elements of dt and does not alias w or the slots.
 * Arguments were checked by the functions above. */
void ps_apply_rule(const struct ps_apply_args *a, enum dg_dtype dt, int64_t n, void *w,
		   const void *g, void *const *slots);
/* The same update written into a fresh block w (n elements) whose current
 * value is src (copy-on-write: a reader holds src). assign and sgd compute w
 * from src and g in one pass; the other rules copy src first. w, src and g do
 * not overlap. */
void ps_apply_rule_from(const struct ps_apply_args *a, enum dg_dtype dt, int64_t n, void *w,
			const void *src, const void *g, void *const *slots);

/* The rule on n_rows rows of w (row_len elements each): row rows[i] of w
 * and of the slots takes row i of g. rows are distinct and in range (the
 * caller coalesced them); adam's counter ticks once for the whole apply. */
void ps_apply_rule_rows(const struct ps_apply_args *a, enum dg_dtype dt, int64_t row_len,
			int64_t n_rows, const int64_t *rows, void *w, const void *g,
			void *const *slots);
/* w[n] += g[n] in dt (integers wrap): duplicate rows are summed with it. */
void ps_apply_add(enum dg_dtype dt, int64_t n, void *w, const void *g);

/* Synchronous accumulation. acc holds n 8-byte sums: double for float32 and
 * float64 variables, wrapping int64 for integer ones. */
void ps_acc_add(enum dg_dtype dt, int64_t n, void *acc, const void *g);
/* out (n elements of dt) = (acc + g) / count: the mean of count gradients of
 * which g is the last (not yet added); integer means truncate toward zero. */
void ps_acc_mean(enum dg_dtype dt, int64_t n, const void *acc, const void *g, int count,
		 void *out);

#endif
