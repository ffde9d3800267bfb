/* The variable store: a hash map of named variables, each holding a
 * reference-counted immutable value block, with store-wide versions, slots
 * for the update rules, synchronous accumulation, long-poll waits, and the
 * logging/checkpointing decisions of durability. HTTP routes (routes.c) call
 * it; apply.c computes the rules; persist.c owns the files. */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"
#include "dg/log.h"
#include "persist.h"
#include "store_internal.h"
#include "watch.h"

/* Versions are reserved in blocks of this size by a logged, fsync'ed
 * RESERVE record: one fsync per million changes keeps versions above every
 * one handed out before a crash, applies included (they are not logged). */
#define VERSION_BLOCK ((uint64_t)1 << 20)
#define MAX_LOCKED (1 + PS_MAX_SLOTS)
/* Changes the change log keeps for watchers that resume (watch.h): a few
 * seconds of a fast training job's applies; ~1.3 MiB. */
#define PS_WATCH_EVENTS 16384

/* --- value blocks ------------------------------------------------------------------- */

/* The public view first, so a struct ps_value * is a struct block *. The
 * bytes never change while anyone but the store holds a reference: the store
 * updates in place only when refs == 1, under the variable's lock (where
 * new references are taken), and writes a new block otherwise. */
struct block {
	struct ps_value v;
	atomic_int refs;
	void *mem;                      /* dg_alloc_aligned; v.data == mem */
};

/* A block of dt/shape: adopts mem when given (a dg_alloc_aligned block of
 * nbytes), else allocates one (zeroed when zero). NULL when out of memory
 * (mem is then freed: ownership passes in every case). */
static struct block *block_new(enum dg_dtype dt, const struct dg_shape *shape, size_t nbytes,
			       void *mem, bool zero)
{
	struct block *b = malloc(sizeof *b);

	if (!mem) {
		mem = dg_alloc_aligned(nbytes);
		if (mem && zero)
			memset(mem, 0, nbytes);
	}
	if (!b || !mem) {
		free(b);
		dg_free_aligned(mem);
		return NULL;
	}
	b->v = (struct ps_value){ .dtype = dt, .shape = *shape, .nbytes = nbytes, .data = mem };
	atomic_init(&b->refs, 1);
	b->mem = mem;
	return b;
}

/* Every element of a float block = x (slots that do not start at zero). */
static void block_fill(struct block *b, double x)
{
	int64_t n = (int64_t)(b->v.nbytes / dg_dtype_size(b->v.dtype));

	if (b->v.dtype == DG_F32)
		for (int64_t i = 0; i < n; i++)
			((float *)b->mem)[i] = (float)x;
	else if (b->v.dtype == DG_F64)
		for (int64_t i = 0; i < n; i++)
			((double *)b->mem)[i] = x;
}

static struct block *block_copy(const struct block *src)
{
	struct block *b = block_new(src->v.dtype, &src->v.shape, src->v.nbytes, NULL, false);

	if (b && src->v.nbytes)
		memcpy(b->mem, src->mem, src->v.nbytes);
	return b;
}

static struct block *block_ref(struct block *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void ps_value_release(struct ps_value *v)
{
	struct block *b = (struct block *)v;

	if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
		return;
	dg_free_aligned(b->mem);
	free(b);
}

static void block_release(struct block *b)
{
	ps_value_release(b ? &b->v : NULL);
}

/* Only the store holds it: it may change in place. Caller holds the var lock. */
static bool block_is_private(struct block *b)
{
	return atomic_load_explicit(&b->refs, memory_order_acquire) == 1;
}

/* --- variables ------------------------------------------------------------------------ */

/* Pending gradients of a variable's current sync step. */
struct sync_acc {
	int count;                      /* arrivals so far; 0: empty */
	int replicas, backup;           /* fixed by the first arrival of the step */
	int64_t *seen;                  /* replica ids that reported (count of them <= count) */
	int n_seen, cap_seen;
	void *sum;                      /* numel 8-byte sums (ps_acc_add), NULL until needed */
	/* A step of row-wise gradients: the rows and their values (as double)
	 * of every arrival so far, concatenated; summed at the last arrival. */
	bool rows;
	int64_t *r_rows;
	double *r_vals;
	int64_t r_n, r_cap;
};

struct var {
	struct var *next;               /* hash chain */
	uint64_t hash;
	atomic_int refs;                /* the map's one + waiters' and checkpoint's */
	pthread_mutex_t mu;             /* guards everything below */
	pthread_cond_t cv;              /* version moved or variable deleted */
	struct block *val;              /* current value; NULL once deleted */
	bool deleted;
	int64_t sync_step;
	struct sync_acc acc;
	atomic_uint_fast64_t applies[PS_RULE_COUNT];
	char name[];
};

struct ps_store {
	char *dir;                      /* NULL: memory only */
	unsigned ckpt_secs;
	bool strict;                    /* PS_DURABILITY_STRICT: applies are logged */
	int lock_fd;
	uint64_t epoch;
	pthread_condattr_t cattr;       /* CLOCK_MONOTONIC for every wait */

	/* The map, and the gate of consistency for snapshots: every change to
	 * a variable happens with this held for reading (or writing, to add or
	 * remove names); a checkpoint takes it for writing to cut. */
	pthread_rwlock_t map;
	struct var **buckets;
	size_t n_buckets, n_vars;

	atomic_int_fast64_t stat_vars, stat_bytes;
	double snapshot_at;             /* the cut time of the snapshot recovered at open */
	atomic_uint_fast64_t next_version;
	atomic_uint_fast64_t ceiling;   /* versions <= ceiling may be handed out */
	pthread_mutex_t ver_mu;         /* raising the ceiling */
	struct ps_wal *wal;             /* NULL: memory only */

	pthread_mutex_t ckpt_mu;        /* one checkpoint at a time */
	atomic_uint_fast64_t changes;   /* bumped by every change */
	atomic_uint_fast64_t ckpt_changes;   /* value of changes at the last snapshot's cut */
	atomic_uint_fast64_t checkpoints;
	atomic_uint_fast64_t ckpt_failures;
	char ckpt_error[256];   /* the last checkpoint's failure; "" after a success
					     * (under err_mu, not ckpt_mu: health must not
					     * wait for a snapshot being written) */
	pthread_mutex_t err_mu;
	atomic_bool disk_full;
	struct ps_watch *watch;         /* the change log; NULL while recovering */          /* the last write to the data dir found it full */

	pthread_mutex_t thr_mu;
	pthread_cond_t thr_cv;
	bool stopping;
	bool thr_started;
	pthread_t thr;
};

static uint64_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;   /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static struct var *var_new(struct ps_store *s, const char *name)
{
	size_t n = strlen(name);
	struct var *v = calloc(1, sizeof *v + n + 1);

	if (!v)
		return NULL;
	memcpy(v->name, name, n + 1);
	v->hash = hash_name(name);
	atomic_init(&v->refs, 1);
	pthread_mutex_init(&v->mu, NULL);
	pthread_cond_init(&v->cv, &s->cattr);
	return v;
}

static void acc_reset(struct sync_acc *a)
{
	free(a->seen);
	dg_free_aligned(a->sum);
	free(a->r_rows);
	free(a->r_vals);
	*a = (struct sync_acc){ 0 };
}

static void var_unref(struct var *v)
{
	if (atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) != 1)
		return;
	block_release(v->val);
	acc_reset(&v->acc);
	pthread_cond_destroy(&v->cv);
	pthread_mutex_destroy(&v->mu);
	free(v);
}

/* Caller holds the map lock (either mode). */
static struct var *map_find(struct ps_store *s, const char *name)
{
	uint64_t h = hash_name(name);

	for (struct var *v = s->buckets[h & (s->n_buckets - 1)]; v; v = v->next)
		if (v->hash == h && strcmp(v->name, name) == 0)
			return v;
	return NULL;
}

/* Caller holds the map lock for writing. Keeps the load factor below 1. */
static enum dg_status map_insert(struct ps_store *s, struct var *v, struct dg_err *err)
{
	if (s->n_vars + 1 > s->n_buckets) {
		size_t nb = s->n_buckets * 2;
		struct var **b = calloc(nb, sizeof *b);
		if (!b)
			return dg_err_set(err, DG_ENOMEM, "out of memory adding variable '%s'",
					  v->name);
		for (size_t i = 0; i < s->n_buckets; i++) {
			for (struct var *x = s->buckets[i], *nx; x; x = nx) {
				nx = x->next;
				x->next = b[x->hash & (nb - 1)];
				b[x->hash & (nb - 1)] = x;
			}
		}
		free(s->buckets);
		s->buckets = b;
		s->n_buckets = nb;
	}
	struct var **head = &s->buckets[v->hash & (s->n_buckets - 1)];
	v->next = *head;
	*head = v;
	s->n_vars++;
	return DG_OK;
}

/* Caller holds the map lock for writing. The map's reference passes to the caller. */
static void map_remove(struct ps_store *s, struct var *v)
{
	for (struct var **p = &s->buckets[v->hash & (s->n_buckets - 1)]; *p; p = &(*p)->next) {
		if (*p == v) {
			*p = v->next;
			v->next = NULL;
			s->n_vars--;
			return;
		}
	}
}

static void stat_add(struct ps_store *s, int64_t vars, int64_t bytes)
{
	atomic_fetch_add(&s->stat_vars, vars);
	atomic_fetch_add(&s->stat_bytes, bytes);
}

/* Replace v's value with b (caller holds v->mu), keeping the byte count,
 * and note the change in the change log (none while recovering: the log is
 * made after). Invariant kept here and in the sync apply:
 * v->val->v.step == v->sync_step. */
static void var_set_value(struct ps_store *s, struct var *v, struct block *b,
			  enum ps_watch_kind kind)
{
	int64_t old = v->val ? (int64_t)v->val->v.nbytes : 0;

	b->v.step = v->sync_step;
	if (v->val != b) {
		block_release(v->val);
		v->val = b;
	}
	stat_add(s, 0, (int64_t)b->v.nbytes - old);
	pthread_cond_broadcast(&v->cv);
	ps_watch_note(s->watch, v->name, b->v.version, kind);
}

/* --- versions ------------------------------------------------------------------------------ */

/* A write to the data dir ended with st: a full disk is noted (health says
 * degraded) until a later write or snapshot succeeds. */
static enum dg_status note_write(struct ps_store *s, enum dg_status st)
{
	if (st == DG_ENOSPC)
		atomic_store(&s->disk_full, true);
	else if (st == DG_OK && atomic_load(&s->disk_full))
		atomic_store(&s->disk_full, false);
	return st;
}

/* Append to the log, noting a full disk (or its end). */
static enum dg_status store_append(struct ps_store *s, const struct ps_wal_rec *r, uint64_t *lsn,
				   struct dg_err *err)
{
	return note_write(s, ps_wal_append(s->wal, r, lsn, err));
}

/* Raise the ceiling above x with a durable RESERVE record. */
static enum dg_status version_reserve(struct ps_store *s, uint64_t x, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	pthread_mutex_lock(&s->ver_mu);
	while (st == DG_OK && atomic_load(&s->ceiling) < x) {
		uint64_t c = atomic_load(&s->ceiling) + VERSION_BLOCK;
		if (c < x)
			c = x + VERSION_BLOCK - 1;
		struct ps_wal_rec r = { .type = PS_WAL_RESERVE, .ceiling = c, .mtime = dg_wall_s() };
		uint64_t lsn;
		st = store_append(s, &r, &lsn, err);
		if (st == DG_OK)
			st = ps_wal_sync(s->wal, lsn, err);
		if (st == DG_OK)
			atomic_store(&s->ceiling, c);
	}
	pthread_mutex_unlock(&s->ver_mu);
	return st;
}

/* The next store-wide version. Caller holds the map lock and the lock of the
 * variable it is for, so a variable's versions increase in the order of its
 * changes (its log records carry them in that order). */
static enum dg_status version_next(struct ps_store *s, uint64_t *out, struct dg_err *err)
{
	uint64_t x = atomic_fetch_add(&s->next_version, 1);

	if (x > atomic_load(&s->ceiling)) {
		enum dg_status st = version_reserve(s, x, err);
		if (st != DG_OK)
			return st;
	}
	*out = x;
	return DG_OK;
}

/* --- open / close ----------------------------------------------------------------------------- */

static void *ckpt_main(void *arg);
#define LOG_SNAPSHOT_MIN ((uint64_t)256 << 20)   /* log bytes that never force a snapshot */
static void slot_name_make(char *dst, const char *name, const char *suffix);

/* Recovery callbacks: single-threaded (no request runs yet), so no locks. */
/* --- rows ------------------------------------------------------------------------------- */

/* Elements per row of dim 0 of a value of rank >= 1 (0 for an empty one). */
static int64_t row_len_of(const struct ps_value *w)
{
	int64_t n = 1;

	for (int i = 1; i < w->shape.ndim; i++)
		n *= w->shape.dim[i];
	return n;
}

/* Do n rows of shape gs (dim 0 = n) fit value w: same trailing dims, every
 * row in range? */
static bool rows_fit(const struct ps_value *w, const struct dg_shape *gs, const int64_t *rows,
		     int64_t n)
{
	if (w->shape.ndim < 1 || gs->ndim != w->shape.ndim || gs->dim[0] != n)
		return false;
	for (int i = 1; i < gs->ndim; i++)
		if (gs->dim[i] != w->shape.dim[i])
			return false;
	for (int64_t i = 0; i < n; i++)
		if (rows[i] < 0 || rows[i] >= w->shape.dim[0])
			return false;
	return true;
}

struct recover_ctx {
	struct ps_store *s;
	uint64_t max_version;
};

static enum dg_status rc_add(struct recover_ctx *c, const char *name, struct block *b,
			     int64_t sync_step, struct dg_err *err)
{
	struct var *v = var_new(c->s, name);

	if (!v) {
		block_release(b);
		return dg_err_set(err, DG_ENOMEM, "out of memory loading '%s'", name);
	}
	v->val = b;
	v->sync_step = sync_step;
	b->v.step = sync_step;
	enum dg_status st = map_insert(c->s, v, err);
	if (st != DG_OK) {
		var_unref(v);
		return st;
	}
	stat_add(c->s, 1, (int64_t)b->v.nbytes);
	return DG_OK;
}

static enum dg_status rc_var(void *ud, const struct ps_snap_var *sv, void *data,
			     struct dg_err *err)
{
	struct recover_ctx *c = ud;
	struct block *b;

	if (map_find(c->s, sv->name)) {
		dg_free_aligned(data);
		return dg_err_set(err, DG_EIO, "variable '%s' appears twice", sv->name);
	}
	b = block_new(sv->dtype, &sv->shape, sv->nbytes, data, false);
	if (!b)
		return dg_err_set(err, DG_ENOMEM, "out of memory loading '%s'", sv->name);
	b->v.version = sv->version;
	b->v.mtime = sv->mtime;
	if (sv->version > c->max_version)
		c->max_version = sv->version;
	return rc_add(c, sv->name, b, sv->sync_step, err);
}

/* Replay a logged apply (--durability strict) onto the recovered value and
 * its slots, with the rule the live apply ran: the result is the same bytes.
 * Its slots exist: the live apply logged CREATE for any slot it made. */
static enum dg_status rc_apply(struct recover_ctx *c, struct var *v, const struct ps_wal_rec *r,
			       struct dg_err *err)
{
	const char *const *suffix;
	int n_slots = ps_rule_slots(r->args->rule, &suffix);
	void *slots[PS_MAX_SLOTS] = { 0 };
	struct var *sv[PS_MAX_SLOTS] = { 0 };

	const struct ps_value *val = v ? &v->val->v : NULL;
	bool rows = r->type == PS_WAL_APPLY_ROWS;

	if (!v || val->dtype != r->dtype ||
	    (rows ? !rows_fit(val, &r->shape, r->rows, r->shape.dim[0])
		  : !dg_shape_eq(&val->shape, &r->shape)))
		return dg_err_set(err, DG_EIO, "the log applies %s to '%s', which %s",
				  ps_rule_name(r->args->rule), r->name,
				  v ? "has another dtype or shape" : "does not exist");
	for (int i = 0; i < n_slots; i++) {
		char sname[DG_VAR_NAME_MAX + 16];
		const struct ps_value *x;

		slot_name_make(sname, r->name, suffix[i]);
		sv[i] = map_find(c->s, sname);
		x = sv[i] ? &sv[i]->val->v : NULL;
		if (!x || (ps_rule_slot_is_counter(r->args->rule, i)
			   ? x->dtype != DG_I64 || x->shape.ndim != 0
			   : x->dtype != r->dtype || !dg_shape_eq(&x->shape, &val->shape)))
			return dg_err_set(err, DG_EIO, "the log applies %s to '%s', whose slot "
					  "'%s' %s", ps_rule_name(r->args->rule), r->name, sname,
					  x ? "does not fit" : "does not exist");
		slots[i] = sv[i]->val->mem;
	}
	if (rows)
		ps_apply_rule_rows(r->args, r->dtype, row_len_of(val), r->shape.dim[0], r->rows,
				   v->val->mem, r->data, slots);
	else
		ps_apply_rule(r->args, r->dtype, (int64_t)(val->nbytes / dg_dtype_size(r->dtype)),
			      v->val->mem, r->data, slots);
	for (int i = 0; i <= n_slots; i++) {
		struct block *b = i ? sv[i - 1]->val : v->val;
		b->v.version = r->version;
		b->v.mtime = r->mtime;
	}
	if (r->step >= 0) {
		v->sync_step = r->step;
		v->val->v.step = r->step;
	}
	return DG_OK;
}

static enum dg_status rc_rec(void *ud, const struct ps_wal_rec *r, void *data, struct dg_err *err)
{
	struct recover_ctx *c = ud;
	struct var *v = map_find(c->s, r->name);
	struct block *b = NULL;

	if (r->version > c->max_version)
		c->max_version = r->version;
	if (r->type == PS_WAL_PUT || r->type == PS_WAL_ASSIGN || r->type == PS_WAL_CREATE) {
		if (r->type == PS_WAL_ASSIGN &&
		    (!v || v->val->v.dtype != r->dtype ||
		     !dg_shape_eq(&v->val->v.shape, &r->shape))) {
			dg_free_aligned(data);
			return dg_err_set(err, DG_EIO, "the log assigns '%s', which %s", r->name,
					  v ? "has another dtype or shape" : "does not exist");
		}
		/* CREATE: data is NULL and a zeroed (or filled) block is made */
		b = block_new(r->dtype, &r->shape, r->nbytes, data, r->type == PS_WAL_CREATE);
		if (!b)
			return dg_err_set(err, DG_ENOMEM, "out of memory loading '%s'", r->name);
		if (r->type == PS_WAL_CREATE && r->fill != 0)
			block_fill(b, r->fill);
		b->v.version = r->version;
		b->v.mtime = r->mtime;
		if (!v)
			return rc_add(c, r->name, b, 0, err);
		var_set_value(c->s, v, b, PS_WATCH_APPLY);
		if (r->type == PS_WAL_ASSIGN && r->step >= 0) {   /* a sync assign's step */
			v->sync_step = r->step;
			v->val->v.step = r->step;
		}
		return DG_OK;
	}
	if (r->type == PS_WAL_APPLY || r->type == PS_WAL_APPLY_ROWS)
		return rc_apply(c, v, r, err);
	if (r->type == PS_WAL_PATCH) {
		if (!v || r->offset > v->val->v.nbytes || r->nbytes > v->val->v.nbytes - r->offset)
			return dg_err_set(err, DG_EIO, "the log patches bytes %" PRIu64
					  "+%zu of '%s', which %s", r->offset, r->nbytes, r->name,
					  v ? "is smaller" : "does not exist");
		memcpy((char *)v->val->mem + r->offset, r->data, r->nbytes);
		v->val->v.version = r->version;
		v->val->v.mtime = r->mtime;
		return DG_OK;
	}
	if (r->type == PS_WAL_DELETE && v) {
		map_remove(c->s, v);
		stat_add(c->s, -1, -(int64_t)v->val->v.nbytes);
		var_unref(v);
	}
	return DG_OK;
}

static void store_free(struct ps_store *s)
{
	for (size_t i = 0; s->buckets && i < s->n_buckets; i++) {
		for (struct var *v = s->buckets[i], *nx; v; v = nx) {
			nx = v->next;
			var_unref(v);
		}
	}
	free(s->buckets);
	ps_watch_free(s->watch);
	ps_wal_close(s->wal);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	pthread_rwlock_destroy(&s->map);
	pthread_mutex_destroy(&s->ver_mu);
	pthread_mutex_destroy(&s->ckpt_mu);
	pthread_mutex_destroy(&s->err_mu);
	pthread_mutex_destroy(&s->thr_mu);
	pthread_cond_destroy(&s->thr_cv);
	pthread_condattr_destroy(&s->cattr);
	free(s->dir);
	free(s);
}

static struct ps_store *store_alloc(const struct ps_store_config *cfg, struct dg_err *err)
{
	struct ps_store *s = calloc(1, sizeof *s);
	pthread_rwlockattr_t ra;

	if (!s) {
		dg_err_set(err, DG_ENOMEM, "out of memory opening the store");
		return NULL;
	}
	s->lock_fd = -1;
	s->ckpt_secs = cfg && cfg->checkpoint_secs ? cfg->checkpoint_secs : 5;
	s->strict = cfg && cfg->durability == PS_DURABILITY_STRICT;
	pthread_condattr_init(&s->cattr);
	pthread_condattr_setclock(&s->cattr, CLOCK_MONOTONIC);
	/* Writer preference: a checkpoint's cut is not starved by a stream of
	 * updates (no thread ever takes the read lock twice). */
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&s->map, &ra);
	pthread_rwlockattr_destroy(&ra);
	pthread_mutex_init(&s->ver_mu, NULL);
	pthread_mutex_init(&s->ckpt_mu, NULL);
	pthread_mutex_init(&s->err_mu, NULL);
	pthread_mutex_init(&s->thr_mu, NULL);
	pthread_cond_init(&s->thr_cv, &s->cattr);
	s->n_buckets = 1024;
	s->buckets = calloc(s->n_buckets, sizeof *s->buckets);
	if (cfg && cfg->data_dir)
		s->dir = strdup(cfg->data_dir);
	if (!s->buckets || (cfg && cfg->data_dir && !s->dir)) {
		dg_err_set(err, DG_ENOMEM, "out of memory opening the store");
		store_free(s);
		return NULL;
	}
	return s;
}

/* Recover the data directory and start logging into a new segment. */
static enum dg_status store_recover(struct ps_store *s, struct dg_err *err)
{
	struct recover_ctx c = { .s = s };
	struct ps_recover_ops ops = { .ud = &c, .var = rc_var, .rec = rc_rec };
	struct ps_recover_info info;
	enum dg_status st;

	st = ps_dir_lock(s->dir, &s->lock_fd, err);
	if (st == DG_OK)
		st = ps_persist_recover(s->dir, &ops, &info, err);
	if (st == DG_OK)
		st = ps_epoch_bump(s->dir, &s->epoch, err);
	if (st != DG_OK)
		return st;
	s->wal = ps_wal_open(s->dir, info.next_seq, err);
	if (!s->wal)
		return err ? err->code : DG_EIO;
	/* Continue above every version that can have been handed out: those
	 * below the highest reserved ceiling (applies included). */
	uint64_t base = info.ceiling > c.max_version ? info.ceiling : c.max_version;
	atomic_store(&s->ceiling, base);
	atomic_store(&s->next_version, base + 1);
	st = version_reserve(s, base + 1, err);
	/* A recovered value may be older than one served before a crash (applies
	 * since the snapshot are not logged), so its old version could name a
	 * value that readers saw replaced: every variable takes a new version,
	 * above every one handed out before, and versions never go back. */
	for (size_t i = 0; i < s->n_buckets && st == DG_OK; i++)
		for (struct var *v = s->buckets[i]; v && st == DG_OK; v = v->next)
			st = version_next(s, &v->val->v.version, err);
	if (st != DG_OK)
		return st;
	s->snapshot_at = info.snapshot_at;
	/* A log to fold into a snapshot, or no snapshot yet: checkpoint soon. */
	atomic_store(&s->changes, info.n_records || !info.had_snapshot ? 1 : 0);
	if (info.torn_bytes)
		dg_log(DG_LOG_WARN, "ps", "cut %" PRIu64 " bytes of unacknowledged log tail "
		       "in '%s'", info.torn_bytes, s->dir);
	dg_log(DG_LOG_INFO, "ps", "recovered %" PRId64 " variables from '%s' (%" PRIu64
	       " log records), epoch %" PRIu64, (int64_t)atomic_load(&s->stat_vars), s->dir,
	       info.n_records, s->epoch);
	return DG_OK;
}

struct ps_store *ps_store_open(const struct ps_store_config *cfg, struct dg_err *err)
{
	struct ps_store *s = store_alloc(cfg, err);

	if (!s)
		return NULL;
	if (s->strict && !s->dir) {
		dg_err_set(err, DG_EINVAL, "durability strict needs a data directory: a "
			   "memory-only store keeps nothing across a restart");
		dg_err_hint(err, "give --data-dir DIR, or leave --durability at snapshot");
		store_free(s);
		return NULL;
	}
	if (!s->dir) {
		s->epoch = 1;
		atomic_store(&s->next_version, 1);
		atomic_store(&s->ceiling, UINT64_MAX);
	} else if (store_recover(s, err) != DG_OK) {
		store_free(s);
		return NULL;
	}
	if (!(s->watch = ps_watch_new(PS_WATCH_EVENTS))) {
		dg_err_set(err, DG_ENOMEM, "out of memory opening the store");
		store_free(s);
		return NULL;
	}
	if (!s->dir)
		return s;
	if (pthread_create(&s->thr, NULL, ckpt_main, s) != 0) {
		dg_err_set(err, DG_ENOMEM, "cannot start the checkpoint thread of '%s'", s->dir);
		store_free(s);
		return NULL;
	}
	s->thr_started = true;
	return s;
}

void ps_store_close(struct ps_store *s)
{
	ps_store_close_final(s, NULL);
}

enum dg_status ps_store_close_final(struct ps_store *s, struct dg_err *out)
{
	struct dg_err err = { 0 };
	enum dg_status st = DG_OK;

	if (!s)
		return DG_OK;
	if (s->thr_started) {
		pthread_mutex_lock(&s->thr_mu);
		s->stopping = true;
		pthread_cond_broadcast(&s->thr_cv);
		pthread_mutex_unlock(&s->thr_mu);
		pthread_join(s->thr, NULL);
	}
	if (s->wal && atomic_load(&s->changes) != atomic_load(&s->ckpt_changes) &&
	    (st = ps_store_checkpoint(s, &err)) != DG_OK) {
		dg_log(DG_LOG_ERROR, "ps", "final checkpoint failed: %s (the log still holds "
		       "acknowledged writes; %s)", err.msg, s->strict ? "strict durability: "
		       "nothing acknowledged is lost" : "applies since the last snapshot are lost");
		if (out)
			*out = err;
	}
	store_free(s);
	return st;
}

struct ps_watch *ps_store_watch(struct ps_store *s)
{
	return s->watch;
}

uint64_t ps_store_epoch(const struct ps_store *s)
{
	return s->epoch;
}

double ps_store_snapshot_at(const struct ps_store *s)
{
	return s->snapshot_at;
}

bool ps_store_degraded(struct ps_store *s, char *why, size_t n)
{
	char wal[200] = "";
	bool failed = s->wal && ps_wal_failed(s->wal, wal, sizeof wal);
	bool full = atomic_load(&s->disk_full);
	char ckpt[256];

	pthread_mutex_lock(&s->err_mu);
	snprintf(ckpt, sizeof ckpt, "%s", s->ckpt_error);
	pthread_mutex_unlock(&s->err_mu);
	snprintf(why, n, "%s%s%s%s%s%s%s", failed ? wal : "",
		 failed && (full || ckpt[0]) ? "; " : "",
		 full ? "the disk of the data directory is full: writes are refused until "
		 "there is room" : "", full && ckpt[0] ? "; " : "",
		 ckpt[0] ? "the last snapshot failed: " : "", ckpt, "");
	return failed || full || ckpt[0];
}

enum ps_durability ps_store_durability(const struct ps_store *s)
{
	return s->strict ? PS_DURABILITY_STRICT : PS_DURABILITY_SNAPSHOT;
}

/* --- checkpoints ------------------------------------------------------------------------------ */

static int cmp_item(const void *a, const void *b)
{
	const struct ps_snap_item *x = a, *y = b;

	return strcmp(x->name, y->name);
}

/* Under the map's write lock: no change is in progress, so the references
 * taken here and the log position form one consistent cut. */
static enum dg_status ckpt_cut(struct ps_store *s, int fd, uint64_t seq,
			       struct ps_snap_item **items_out, struct var ***vars_out,
			       size_t *n_out, uint64_t *ceiling, uint64_t *mark, struct dg_err *err)
{
	size_t n = 0, cap = s->n_vars;
	struct ps_snap_item *items = calloc(cap ? cap : 1, sizeof *items);
	struct var **vars = calloc(cap ? cap : 1, sizeof *vars);

	if (!items || !vars) {
		free(items);
		free(vars);
		close(fd);
		ps_wal_segment_discard(s->dir, seq);
		return dg_err_set(err, DG_ENOMEM, "out of memory for a checkpoint of %zu variables",
				  cap);
	}
	for (size_t i = 0; i < s->n_buckets; i++) {
		for (struct var *v = s->buckets[i]; v; v = v->next) {
			atomic_fetch_add(&v->refs, 1);
			pthread_mutex_lock(&v->mu);
			items[n] = (struct ps_snap_item){ .name = v->name,
							  .value = &block_ref(v->val)->v,
							  .sync_step = v->sync_step };
			pthread_mutex_unlock(&v->mu);
			vars[n++] = v;
		}
	}
	*mark = atomic_load(&s->changes);
	*ceiling = atomic_load(&s->ceiling);
	*items_out = items;
	*vars_out = vars;
	*n_out = n;
	return ps_wal_switch(s->wal, fd, seq, err);
}

/* One snapshot (caller checked that the store has a data directory);
 * *n_vars and *bytes (may be NULL) get what it wrote. */
static enum dg_status checkpoint_run(struct ps_store *s, int64_t *n_vars, uint64_t *bytes,
				     struct dg_err *err)
{
	struct ps_snap_item *items = NULL;
	struct var **vars = NULL;
	uint64_t seq, ceiling = 0, mark = 0;
	size_t n = 0;
	enum dg_status st;
	int fd;

	pthread_mutex_lock(&s->ckpt_mu);
	seq = ps_wal_seq(s->wal) + 1;
	/* the slow part of starting a segment happens before the cut */
	st = ps_wal_segment_create(s->dir, seq, &fd, err);
	double cut_at = 0;
	if (st == DG_OK) {
		pthread_rwlock_wrlock(&s->map);
		cut_at = dg_wall_s();
		st = ckpt_cut(s, fd, seq, &items, &vars, &n, &ceiling, &mark, err);
		pthread_rwlock_unlock(&s->map);
	}
	if (st == DG_OK) {
		qsort(items, n, sizeof *items, cmp_item);
		st = ps_snapshot_write(s->dir, seq, ceiling, cut_at, items, n, bytes, err);
	}
	if (st == DG_OK) {
		if (n_vars)
			*n_vars = (int64_t)n;
		ps_wal_remove_before(s->dir, seq);
		atomic_store(&s->ckpt_changes, mark);
		atomic_fetch_add(&s->checkpoints, 1);
	}
	for (size_t i = 0; i < n; i++)
		ps_value_release((struct ps_value *)items[i].value);
	for (size_t i = 0; vars && i < n; i++)
		var_unref(vars[i]);
	free(items);
	free(vars);
	pthread_mutex_lock(&s->err_mu);
	if (st != DG_OK) {
		dg_err_prefix(err, "checkpoint of '%s'", s->dir);
		atomic_fetch_add(&s->ckpt_failures, 1);
		snprintf(s->ckpt_error, sizeof s->ckpt_error, "%s", err ? err->msg : "failed");
	} else {
		s->ckpt_error[0] = '\0';
	}
	pthread_mutex_unlock(&s->err_mu);
	note_write(s, st);
	pthread_mutex_unlock(&s->ckpt_mu);
	return st;
}

enum dg_status ps_store_checkpoint(struct ps_store *s, struct dg_err *err)
{
	if (!s->wal)
		return DG_OK;   /* memory only: nothing to write */
	return checkpoint_run(s, NULL, NULL, err);
}

enum dg_status ps_store_checkpoint_now(struct ps_store *s, struct ps_ckpt_info *info,
				       struct dg_err *err)
{
	struct ps_ckpt_info got = { .epoch = s->epoch };
	double t0 = dg_mono_s();
	enum dg_status st;

	if (!s->wal) {
		dg_err_set(err, DG_EUNSUPPORTED, "this server keeps its variables in memory only: "
			   "there is no data directory to write a checkpoint to");
		dg_err_hint(err, "start the server with --data-dir DIR to make checkpoints");
		return DG_EUNSUPPORTED;
	}
	st = checkpoint_run(s, &got.vars, &got.bytes, err);
	got.ms = (dg_mono_s() - t0) * 1e3;
	if (st == DG_OK && info)
		*info = got;
	return st;
}

/* Every ckpt_secs: a snapshot when anything changed since the last one. */
static void *ckpt_main(void *arg)
{
	struct ps_store *s = arg;

	pthread_mutex_lock(&s->thr_mu);
	while (!s->stopping) {
		double due = dg_mono_s() + s->ckpt_secs;
		/* Every checkpoint_secs, or sooner once the log outgrows a fresh
		 * snapshot: past twice the store's bytes (and 256 MiB), writing a
		 * snapshot costs less disk than keeping the log (strict durability
		 * logs every gradient). Checked four times a second. */
		for (;;) {
			struct timespec dl = dg_deadline_timespec(dg_deadline_in_ms(250));
			while (!s->stopping &&
			       pthread_cond_timedwait(&s->thr_cv, &s->thr_mu, &dl) != ETIMEDOUT)
				;
			uint64_t limit = 2 * (uint64_t)atomic_load(&s->stat_bytes);
			if (limit < LOG_SNAPSHOT_MIN)
				limit = LOG_SNAPSHOT_MIN;
			if (s->stopping || dg_mono_s() >= due || ps_wal_bytes(s->wal) > limit)
				break;
		}
		if (s->stopping)
			break;
		pthread_mutex_unlock(&s->thr_mu);
		if (atomic_load(&s->changes) != atomic_load(&s->ckpt_changes)) {
			struct dg_err err = { 0 };
			if (ps_store_checkpoint(s, &err) != DG_OK)
				dg_log(DG_LOG_ERROR, "ps", "%s", err.msg);
		}
		pthread_mutex_lock(&s->thr_mu);
	}
	pthread_mutex_unlock(&s->thr_mu);
	return NULL;
}

/* --- reads ---------------------------------------------------------------------------------- */

static enum dg_status not_found(struct dg_err *err, const char *name)
{
	dg_err_set(err, DG_ENOTFOUND, "variable '%.200s' not found", name);
	dg_err_hint(err, "list variables with: dg var ls");
	return DG_ENOTFOUND;
}

enum dg_status ps_store_get(struct ps_store *s, const char *name, struct ps_value **out,
			    struct dg_err *err)
{
	enum dg_status st = DG_OK;
	struct var *v;

	*out = NULL;
	if (!name)
		return not_found(err, "(null)");
	pthread_rwlock_rdlock(&s->map);
	v = map_find(s, name);
	if (v) {
		pthread_mutex_lock(&v->mu);
		*out = &block_ref(v->val)->v;
		pthread_mutex_unlock(&v->mu);
	} else {
		st = not_found(err, name);
	}
	pthread_rwlock_unlock(&s->map);
	return st;
}

enum dg_status ps_value_rows(const struct ps_value *v, const char *name, const int64_t *rows,
			     int64_t n, struct dg_tensor **out, struct dg_err *err)
{
	struct dg_shape shape;
	struct dg_tensor *t;
	size_t rb;

	*out = NULL;
	if (v->shape.ndim < 1) {
		dg_err_set(err, DG_ESHAPE, "'%s' is a scalar: it has no rows", name);
		dg_err_hint(err, "read it without rows");
		return DG_ESHAPE;
	}
	for (int64_t i = 0; i < n; i++) {
		if (rows[i] < 0 || rows[i] >= v->shape.dim[0]) {
			dg_err_set(err, DG_EINVAL, "row %lld of '%s' is out of range: it has %lld rows",
				   (long long)rows[i], name, (long long)v->shape.dim[0]);
			dg_err_hint(err, "rows index dim 0, from 0 to %lld",
				    (long long)v->shape.dim[0] - 1);
			return DG_EINVAL;
		}
	}
	shape = v->shape;
	shape.dim[0] = n;
	/* a value is immutable while held: the rows are copied without a lock */
	rb = v->shape.dim[0] ? v->nbytes / (size_t)v->shape.dim[0] : 0;
	/* repeats may ask for more bytes than the variable has: bounded */
	if (rb && (uint64_t)n > PS_MAX_ROWS_BYTES / rb) {
		dg_err_set(err, DG_EINVAL, "%lld rows of '%s' would be %.1f GiB; at most %d GiB a "
			   "read", (long long)n, name, (double)n * (double)rb / (1 << 30),
			   (int)(PS_MAX_ROWS_BYTES >> 30));
		dg_err_hint(err, "ask for each row once, or in parts");
		return DG_EINVAL;
	}
	if (!(t = dg_tensor_new_uninit(v->dtype, &shape, err)))
		return err && err->code != DG_OK ? err->code : DG_ENOMEM;
	for (int64_t i = 0; i < n && rb; i++)
		memcpy((char *)t->data + (size_t)i * rb, (const char *)v->data + (size_t)rows[i] * rb,
		       rb);
	*out = t;
	return DG_OK;
}

enum dg_status ps_store_get_rows(struct ps_store *s, const char *name, const int64_t *rows,
				 int64_t n, struct dg_tensor **out, uint64_t *version,
				 struct dg_err *err)
{
	struct ps_value *v = NULL;
	enum dg_status st = ps_store_get(s, name, &v, err);

	*out = NULL;
	if (st == DG_OK)
		st = ps_value_rows(v, name, rows, n, out, err);
	if (st == DG_OK && version)
		*version = v->version;
	ps_value_release(v);
	return st;
}

enum dg_status ps_store_wait(struct ps_store *s, const char *name, uint64_t min_version,
			     int64_t timeout_ms, struct ps_value **out, struct dg_err *err)
{
	return ps_store_wait_step(s, name, min_version, 0, timeout_ms, out, err);
}

/* Has v (caller holds v->mu, not deleted) reached both conditions? */
static bool wait_done(const struct var *v, uint64_t min_version, int64_t min_step)
{
	return v->val->v.version >= min_version && v->sync_step >= min_step;
}

enum dg_status ps_store_wait_step(struct ps_store *s, const char *name, uint64_t min_version,
				  int64_t min_step, int64_t timeout_ms, struct ps_value **out,
				  struct dg_err *err)
{
	struct timespec dl;
	enum dg_status st = DG_OK;
	struct var *v;

	*out = NULL;
	if (!name)
		return not_found(err, "(null)");
	pthread_rwlock_rdlock(&s->map);
	v = map_find(s, name);
	if (v)
		atomic_fetch_add(&v->refs, 1);   /* outlives the map lock while waiting */
	pthread_rwlock_unlock(&s->map);
	if (!v)
		return not_found(err, name);
	if (timeout_ms < 0)
		timeout_ms = 0;
	dl = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms));
	/* Every change of the value or of the sync step broadcasts v->cv (a sync
	 * step moves only with a new value, in var_set_value's critical section). */
	pthread_mutex_lock(&v->mu);
	while (!v->deleted && !wait_done(v, min_version, min_step)) {
		if (pthread_cond_timedwait(&v->cv, &v->mu, &dl) == ETIMEDOUT)
			break;
	}
	if (v->deleted) {
		st = dg_err_set(err, DG_ENOTFOUND, "variable '%.200s' was deleted while waiting "
				"for version %" PRIu64 " and step %" PRId64, name, min_version,
				min_step);
	} else {
		*out = &block_ref(v->val)->v;
		if (!wait_done(v, min_version, min_step)) {
			st = dg_err_set(err, DG_ETIMEOUT, "variable '%.200s' is at version %" PRIu64
					" step %" PRId64 ", not version %" PRIu64 " step %" PRId64
					" after %" PRId64 " ms", name, v->val->v.version,
					v->sync_step, min_version, min_step, timeout_ms);
			dg_err_hint(err, "wait longer, or check that the updates it waits for "
				    "are sent");
		}
	}
	pthread_mutex_unlock(&v->mu);
	var_unref(v);
	return st;
}

static int cmp_var(const void *a, const void *b)
{
	return strcmp((*(struct var *const *)a)->name, (*(struct var *const *)b)->name);
}

enum dg_status ps_store_list(struct ps_store *s, const char *prefix, struct dg_var_info **out,
			     int *n, struct dg_err *err)
{
	size_t plen = prefix ? strlen(prefix) : 0, cnt = 0, kept = 0;
	struct var **vs = NULL;
	struct dg_var_info *info = NULL;
	enum dg_status st = DG_OK;

	*out = NULL;
	*n = 0;
	/* Under the map lock only collect references (cheap), so a long listing
	 * does not hold up a checkpoint, which would hold up every update. */
	pthread_rwlock_rdlock(&s->map);
	vs = malloc((s->n_vars ? s->n_vars : 1) * sizeof *vs);
	for (size_t i = 0; vs && i < s->n_buckets; i++) {
		for (struct var *v = s->buckets[i]; v; v = v->next) {
			if (strncmp(v->name, prefix ? prefix : "", plen) == 0) {
				atomic_fetch_add(&v->refs, 1);
				vs[cnt++] = v;
			}
		}
	}
	pthread_rwlock_unlock(&s->map);
	if (!vs)
		return dg_err_set(err, DG_ENOMEM, "out of memory listing variables");
	if (cnt > INT32_MAX)
		st = dg_err_set(err, DG_ETOOLARGE, "%zu variables match '%s'", cnt, prefix);
	if (st == DG_OK && !(info = calloc(cnt ? cnt : 1, sizeof *info)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory listing %zu variables", cnt);
	if (st == DG_OK && cnt > 1)
		qsort(vs, cnt, sizeof *vs, cmp_var);
	for (size_t i = 0; st == DG_OK && i < cnt; i++) {
		struct var *v = vs[i];
		pthread_mutex_lock(&v->mu);
		if (!v->deleted) {   /* deleted since it was collected: not listed */
			struct dg_var_info *d = &info[kept++];
			size_t len = strlen(v->name);
			memcpy(d->name, v->name, len + 1);
			d->dtype = v->val->v.dtype;
			d->shape = v->val->v.shape;
			d->bytes = v->val->v.nbytes;
			d->version = v->val->v.version;
			d->mtime = v->val->v.mtime;
			d->step = v->sync_step;
		}
		pthread_mutex_unlock(&v->mu);
	}
	for (size_t i = 0; i < cnt; i++)
		var_unref(vs[i]);
	free(vs);
	if (st != DG_OK) {
		free(info);
		return st;
	}
	*out = info;
	*n = (int)kept;
	return DG_OK;
}

/* --- writes ---------------------------------------------------------------------------------- */

static enum dg_status if_match_check(const struct var *v, uint64_t if_match, struct dg_err *err)
{
	if (!if_match || v->val->v.version == if_match)
		return DG_OK;
	dg_err_set(err, DG_ECONFLICT, "variable '%s' is at version %" PRIu64 ", not %" PRIu64
		   " (If-Match)", v->name, v->val->v.version, if_match);
	dg_err_hint(err, "read it again and retry with its current version");
	return DG_ECONFLICT;
}

/* The checks of a put against the existing variable (caller holds v->mu). */
static enum dg_status put_check(const struct var *v, const struct block *nb,
				const struct ps_put_opts *o, struct dg_err *err)
{
	const struct ps_value *cur = &v->val->v;
	char a[160], b[160];

	if (o->create_only) {
		dg_err_set(err, DG_ECONFLICT, "variable '%s' exists (version %" PRIu64 ")", v->name,
			   cur->version);
		dg_err_hint(err, "drop create-only (If-None-Match: *) to replace it");
		return DG_ECONFLICT;
	}
	enum dg_status st = if_match_check(v, o->if_match, err);
	if (st != DG_OK || o->replace)
		return st;
	dg_shape_format(&cur->shape, a, sizeof a);
	dg_shape_format(&nb->v.shape, b, sizeof b);
	if (cur->dtype != nb->v.dtype) {
		dg_err_set(err, DG_EDTYPE, "variable '%s' is %s %s; the new value is %s %s",
			   v->name, dg_dtype_name(cur->dtype), a, dg_dtype_name(nb->v.dtype), b);
		dg_err_hint(err, "pass replace (?replace=1) to change its dtype or shape");
		return DG_EDTYPE;
	}
	if (!dg_shape_eq(&cur->shape, &nb->v.shape)) {
		dg_err_set(err, DG_ESHAPE, "variable '%s' has shape %s; the new value has %s",
			   v->name, a, b);
		dg_err_hint(err, "pass replace (?replace=1) to change its dtype or shape");
		return DG_ESHAPE;
	}
	return DG_OK;
}

/* Log that name now holds b's dtype/shape, every element fill (a slot made
 * or reset by an apply). Applies are not logged, but this change of
 * existence or shape is: acknowledged writes of the slot logged later must
 * replay onto it. No wait for durability: any later record that needs it is
 * synced after it. */
static enum dg_status log_create(struct ps_store *s, const char *name, const struct block *b,
				 double fill, struct dg_err *err)
{
	struct ps_wal_rec r = { .type = PS_WAL_CREATE, .name = name, .dtype = b->v.dtype,
				.shape = b->v.shape, .version = b->v.version, .mtime = b->v.mtime,
				.nbytes = b->v.nbytes, .fill = fill };
	uint64_t lsn;

	return s->wal ? store_append(s, &r, &lsn, err) : DG_OK;
}

/* Log a whole value (PUT or ASSIGN) of b under version/mtime. */
static enum dg_status log_value(struct ps_store *s, enum ps_wal_type type, const char *name,
				const struct block *b, uint32_t crc, uint64_t *lsn,
				struct dg_err *err)
{
	struct ps_wal_rec r = {
		.type = type, .name = name, .dtype = b->v.dtype, .shape = b->v.shape,
		.version = b->v.version, .mtime = b->v.mtime, .data = b->mem,
		.nbytes = b->v.nbytes, .data_crc = crc,
	};

	return s->wal ? store_append(s, &r, lsn, err) : DG_OK;
}

/* Put nb into the existing v (caller holds the map lock). */
static enum dg_status put_existing(struct ps_store *s, struct var *v, struct block *nb,
				   const struct ps_put_opts *o, uint32_t crc, uint64_t *lsn,
				   uint64_t *ver, struct dg_err *err)
{
	enum dg_status st;

	pthread_mutex_lock(&v->mu);
	st = put_check(v, nb, o, err);
	if (st == DG_OK)
		st = version_next(s, &nb->v.version, err);
	nb->v.mtime = dg_wall_s();
	if (st == DG_OK)
		st = log_value(s, PS_WAL_PUT, v->name, nb, crc, lsn, err);
	if (st == DG_OK) {
		/* pending sync gradients of another dtype/shape can never be applied */
		if (v->val->v.dtype != nb->v.dtype || !dg_shape_eq(&v->val->v.shape, &nb->v.shape))
			acc_reset(&v->acc);
		var_set_value(s, v, nb, PS_WATCH_PUT);
		atomic_fetch_add(&s->changes, 1);
		*ver = nb->v.version;   /* nb may change in place once v->mu is released */
	}
	pthread_mutex_unlock(&v->mu);
	return st;
}

/* Create name with nb (caller holds the map lock for writing). */
static enum dg_status put_new(struct ps_store *s, const char *name, struct block *nb,
			      const struct ps_put_opts *o, uint32_t crc, uint64_t *lsn,
			      uint64_t *ver, struct dg_err *err)
{
	struct var *v;
	enum dg_status st;

	if (o->if_match) {
		dg_err_set(err, DG_ECONFLICT, "variable '%s' does not exist (If-Match: %" PRIu64
			   ")", name, o->if_match);
		dg_err_hint(err, "drop If-Match to create it");
		return DG_ECONFLICT;
	}
	v = var_new(s, name);
	if (!v)
		return dg_err_set(err, DG_ENOMEM, "out of memory creating '%s'", name);
	pthread_mutex_lock(&v->mu);
	st = version_next(s, &nb->v.version, err);
	nb->v.mtime = dg_wall_s();
	if (st == DG_OK)
		st = log_value(s, PS_WAL_PUT, name, nb, crc, lsn, err);
	if (st == DG_OK)
		st = map_insert(s, v, err);
	if (st == DG_OK) {
		v->val = nb;
		stat_add(s, 1, (int64_t)nb->v.nbytes);
		atomic_fetch_add(&s->changes, 1);
		*ver = nb->v.version;
		ps_watch_note(s->watch, name, nb->v.version, PS_WATCH_PUT);
	}
	pthread_mutex_unlock(&v->mu);
	if (st != DG_OK)
		var_unref(v);
	return st;
}

/* Check a tensor handed to the store (it may come from any decoder). */
static enum dg_status tensor_check(const struct dg_tensor *t, const char *what, const char *name,
				   struct dg_err *err)
{
	int64_t numel;

	if (!t)
		return dg_err_set(err, DG_EINVAL, "no %s for '%s'", what, name);
	if ((unsigned)t->dtype >= DG_DTYPE_COUNT || t->shape.ndim < 0 ||
	    t->shape.ndim > DG_MAX_DIMS || !dg_shape_is_known(&t->shape) ||
	    dg_shape_numel(&t->shape, &numel, NULL) != DG_OK || numel != t->numel ||
	    (size_t)numel * dg_dtype_size(t->dtype) != t->nbytes || (t->nbytes && !t->data))
		return dg_err_set(err, DG_EINVAL, "malformed %s tensor for '%s'", what, name);
	return DG_OK;
}

enum dg_status ps_store_put(struct ps_store *s, const char *name, struct dg_tensor *t,
			    const struct ps_put_opts *opts, uint64_t *version, bool *created,
			    struct dg_err *err)
{
	static const struct ps_put_opts none = { 0 };
	const struct ps_put_opts *o = opts ? opts : &none;
	struct block *nb = NULL;
	uint64_t lsn = 0, ver = 0;
	uint32_t crc = 0;
	bool made = false;
	enum dg_status st;

	st = dg_var_name_check(name, err);
	if (st == DG_OK)
		st = tensor_check(t, "value", name, err);
	if (st != DG_OK) {
		dg_tensor_free(t);
		return st;
	}
	/* The tensor's bytes become the value block: no copy. */
	nb = block_new(t->dtype, &t->shape, t->nbytes, t->data, false);
	t->data = NULL;
	dg_tensor_free(t);
	if (!nb)
		return dg_err_set(err, DG_ENOMEM, "out of memory storing '%s'", name);
	if (s->wal)
		crc = ps_crc32(0, nb->mem, nb->v.nbytes);   /* outside every lock */
	pthread_rwlock_rdlock(&s->map);
	struct var *v = map_find(s, name);
	if (!v) {
		pthread_rwlock_unlock(&s->map);
		pthread_rwlock_wrlock(&s->map);
		v = map_find(s, name);
	}
	if (v) {
		st = put_existing(s, v, nb, o, crc, &lsn, &ver, err);
	} else {
		st = put_new(s, name, nb, o, crc, &lsn, &ver, err);
		made = st == DG_OK;
	}
	pthread_rwlock_unlock(&s->map);
	if (st != DG_OK) {
		block_release(nb);
		return st;
	}
	if (s->wal)
		st = ps_wal_sync(s->wal, lsn, err);
	if (st == DG_OK) {
		if (version)
			*version = ver;
		if (created)
			*created = made;
	}
	return st;
}

/* Check a patch of n bytes at offset against b. */
static enum dg_status patch_check(const struct var *v, uint64_t offset, size_t n,
				  struct dg_err *err)
{
	const struct ps_value *cur = &v->val->v;
	size_t esz = dg_dtype_size(cur->dtype);

	if (n == 0 || offset % esz || n % esz || offset > cur->nbytes ||
	    n > cur->nbytes - offset) {
		dg_err_set(err, DG_EINVAL, "cannot write bytes [%" PRIu64 ", %" PRIu64 ") of '%s': "
			   "it has %zu bytes of %s (%zu each)", offset, offset + (uint64_t)n,
			   v->name, cur->nbytes, dg_dtype_name(cur->dtype), esz);
		dg_err_hint(err, "a partial write covers whole elements inside the tensor");
		return DG_EINVAL;
	}
	return DG_OK;
}

enum dg_status ps_store_patch(struct ps_store *s, const char *name, uint64_t offset,
			      const void *p, size_t n, uint64_t if_match, uint64_t *version,
			      struct dg_err *err)
{
	uint32_t crc = 0;
	uint64_t lsn = 0, ver = 0;
	enum dg_status st;
	struct var *v;

	st = dg_var_name_check(name, err);
	if (st != DG_OK)
		return st;
	if (n && !p)
		return dg_err_set(err, DG_EINVAL, "no data to write into '%s'", name);
	if (s->wal && n)
		crc = ps_crc32(0, p, n);
	pthread_rwlock_rdlock(&s->map);
	v = map_find(s, name);
	if (!v) {
		pthread_rwlock_unlock(&s->map);
		return not_found(err, name);
	}
	pthread_mutex_lock(&v->mu);
	st = if_match_check(v, if_match, err);
	if (st == DG_OK)
		st = patch_check(v, offset, n, err);
	/* Someone holds the current bytes: write a new block (copy-on-write). */
	struct block *b = v->val;
	if (st == DG_OK && !block_is_private(b) && !(b = block_copy(v->val)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory writing into '%s'", name);
	if (st == DG_OK)
		st = version_next(s, &ver, err);
	double now = dg_wall_s();
	if (st == DG_OK && s->wal) {
		struct ps_wal_rec r = { .type = PS_WAL_PATCH, .name = name, .version = ver,
					.mtime = now, .offset = offset, .data = p, .nbytes = n,
					.data_crc = crc };
		st = store_append(s, &r, &lsn, err);
	}
	if (st == DG_OK) {
		memcpy((char *)b->mem + offset, p, n);
		b->v.version = ver;
		b->v.mtime = now;
		var_set_value(s, v, b, PS_WATCH_PUT);
		atomic_fetch_add(&s->changes, 1);
	} else if (b && b != v->val) {
		block_release(b);
	}
	pthread_mutex_unlock(&v->mu);
	pthread_rwlock_unlock(&s->map);
	if (st == DG_OK && s->wal)
		st = ps_wal_sync(s->wal, lsn, err);
	if (st == DG_OK && version)
		*version = ver;
	return st;
}

/* dst (DG_VAR_NAME_MAX + 16 bytes) = name + suffix; the caller checked the
 * length of name (<= DG_VAR_NAME_MAX) and suffixes are short. */
static void slot_name_make(char *dst, const char *name, const char *suffix)
{
	size_t a = strlen(name), b = strlen(suffix);

	if (a + b >= DG_VAR_NAME_MAX + 16)
		b = 0;   /* cannot happen with the static suffixes; keeps dst bounded */
	memcpy(dst, name, a);
	memcpy(dst + a, suffix, b);
	dst[a + b] = '\0';
}

/* Remove v from the map and log it (caller holds the map lock for writing). */
static enum dg_status delete_one(struct ps_store *s, struct var *v, uint64_t *lsn,
				 struct dg_err *err)
{
	enum dg_status st = DG_OK;

	struct ps_wal_rec r = { .type = PS_WAL_DELETE, .name = v->name, .mtime = dg_wall_s() };

	pthread_mutex_lock(&v->mu);
	st = version_next(s, &r.version, err);     /* the delete's version: its event's */
	if (st == DG_OK && s->wal)
		st = store_append(s, &r, lsn, err);
	if (st == DG_OK) {
		map_remove(s, v);
		stat_add(s, -1, -(int64_t)v->val->v.nbytes);
		v->deleted = true;
		block_release(v->val);
		v->val = NULL;
		acc_reset(&v->acc);
		pthread_cond_broadcast(&v->cv);
		atomic_fetch_add(&s->changes, 1);
		ps_watch_note(s->watch, v->name, r.version, PS_WATCH_DELETE);
	}
	pthread_mutex_unlock(&v->mu);
	if (st == DG_OK)
		var_unref(v);   /* the map's reference */
	return st;
}

enum dg_status ps_store_delete(struct ps_store *s, const char *name, uint64_t if_match,
			       struct dg_err *err)
{
	static const char *const slots[] = { ".momentum", ".adam_m", ".adam_v", ".adam_t" };
	char sname[DG_VAR_NAME_MAX + 16];
	uint64_t lsn = 0;
	enum dg_status st;
	struct var *v;

	st = dg_var_name_check(name, err);
	if (st != DG_OK)
		return st;
	pthread_rwlock_wrlock(&s->map);
	v = map_find(s, name);
	if (!v) {
		st = not_found(err, name);
		goto out;
	}
	pthread_mutex_lock(&v->mu);
	st = if_match_check(v, if_match, err);
	pthread_mutex_unlock(&v->mu);
	/* Slots first: a failure part-way leaves the variable (whose slots are
	 * recreated with zeros), never slots without their variable. */
	for (size_t i = 0; st == DG_OK && i < sizeof slots / sizeof slots[0]; i++) {
		slot_name_make(sname, name, slots[i]);
		struct var *sv = map_find(s, sname);
		if (sv)
			st = delete_one(s, sv, &lsn, err);
	}
	if (st == DG_OK)
		st = delete_one(s, v, &lsn, err);
out:
	pthread_rwlock_unlock(&s->map);
	if (st == DG_OK && s->wal && lsn)
		st = ps_wal_sync(s->wal, lsn, err);
	return st;
}

/* --- apply ----------------------------------------------------------------------------------- */

/* One apply's working set: the variable, its slots, and the blocks the
 * update writes (the current ones when private, copies otherwise). */
struct apply_ctx {
	const char *name;
	const struct ps_apply_args *a;
	const struct dg_tensor *g;
	int n_slots;
	char slot_name[PS_MAX_SLOTS][DG_VAR_NAME_MAX + 16];
	struct var *v, *slot[PS_MAX_SLOTS];
	struct block *out[1 + PS_MAX_SLOTS];     /* [0]: variable, [1+i]: slot i */
	bool reset;                              /* slots did not fit: out[1..] are zeros */
	const void *src;                         /* copy-on-write: out[0] is a fresh block
						  * the rule computes from these bytes */
	void *mean;                              /* sync: the mean gradient (var dtype) */
	uint32_t crc;                            /* assign, strict: CRC of the logged data */
	/* Row-wise: g holds n_rows rows of row_len elements for rows rows
	 * (distinct, ascending; NULL: dense). A sync step's mean has rows of its
	 * own (mean_rows, owned). */
	const int64_t *rows;
	int64_t n_rows, row_len;
	int64_t *mean_rows;
	int64_t n_mean_rows;
};

static void lock_sorted(struct var **vs, int n)
{
	/* by name: every multi-variable lock in the store follows this order */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && strcmp(vs[j - 1]->name, vs[j]->name) > 0; j--) {
			struct var *t = vs[j];
			vs[j] = vs[j - 1];
			vs[j - 1] = t;
		}
	for (int i = 0; i < n; i++)
		pthread_mutex_lock(&vs[i]->mu);
}

/* Does slot i hold what the rule expects next to a variable of value w? */
static bool slot_fits(const struct apply_ctx *c, int i, const struct ps_value *w)
{
	const struct ps_value *sv = &c->slot[i]->val->v;

	if (ps_rule_slot_is_counter(c->a->rule, i))
		return sv->dtype == DG_I64 && sv->shape.ndim == 0;
	return sv->dtype == w->dtype && dg_shape_eq(&sv->shape, &w->shape);
}

/* A new slot i: zeros, or the rule's start value (ps_rule_slot_init). */
static struct block *slot_zero(const struct apply_ctx *c, int i, const struct ps_value *w)
{
	static const struct dg_shape scalar = { 0 };
	struct block *b;
	double x = ps_rule_slot_init(c->a, i);

	if (ps_rule_slot_is_counter(c->a->rule, i))
		return block_new(DG_I64, &scalar, 8, NULL, true);
	/* block_fill writes float32 and float64; any other block is zeroed */
	bool fill = x != 0 && (w->dtype == DG_F32 || w->dtype == DG_F64);

	b = block_new(w->dtype, &w->shape, w->nbytes, NULL, !fill);
	if (b && fill)
		block_fill(b, x);
	return b;
}

/* Find the slots; create missing ones (zeros) when the map is held for
 * writing. *missing tells the caller to come back with the write lock. */
static enum dg_status find_slots(struct ps_store *s, struct apply_ctx *c, bool wr, bool *missing,
				 struct dg_err *err)
{
	*missing = false;
	for (int i = 0; i < c->n_slots; i++) {
		c->slot[i] = map_find(s, c->slot_name[i]);
		if (c->slot[i])
			continue;
		if (!wr) {
			*missing = true;
			return DG_OK;
		}
		struct var *sv = var_new(s, c->slot_name[i]);
		if (!sv)
			return dg_err_set(err, DG_ENOMEM, "out of memory creating '%s'",
					  c->slot_name[i]);
		pthread_mutex_lock(&c->v->mu);
		struct block *b = slot_zero(c, i, &c->v->val->v);
		sv->val = b;   /* var_unref(sv) releases it on failure */
		enum dg_status st = b ? version_next(s, &b->v.version, err)
				      : dg_err_set(err, DG_ENOMEM, "out of memory creating '%s'",
						   c->slot_name[i]);
		pthread_mutex_unlock(&c->v->mu);
		if (st == DG_OK) {
			b->v.mtime = dg_wall_s();
			st = log_create(s, sv->name, b, ps_rule_slot_init(c->a, i), err);
		}
		if (st == DG_OK)
			st = map_insert(s, sv, err);
		if (st != DG_OK) {
			var_unref(sv);
			return st;
		}
		stat_add(s, 1, (int64_t)b->v.nbytes);
		atomic_fetch_add(&s->changes, 1);
		c->slot[i] = sv;
	}
	return DG_OK;
}

/* A row-wise update against the variable: same dtype, the rows' trailing
 * dims, rows in range. */
static enum dg_status rows_check(const struct apply_ctx *c, struct dg_err *err)
{
	const struct ps_value *w = &c->v->val->v;
	const struct dg_tensor *g = c->g;
	const char *rule = ps_rule_name(c->a->rule);
	struct dg_shape row = w->shape;
	char a[160], b[160];

	if (g->dtype == w->dtype && rows_fit(w, &g->shape, c->rows, c->n_rows))
		return DG_OK;
	if (g->dtype != w->dtype) {
		dg_err_set(err, DG_EDTYPE, "row-wise %s of '%s': the rows are %s, the variable %s",
			   rule, c->name, dg_dtype_name(g->dtype), dg_dtype_name(w->dtype));
		dg_err_hint(err, "send the rows in the variable's dtype");
		return DG_EDTYPE;
	}
	if (w->shape.ndim < 1) {
		dg_err_set(err, DG_ESHAPE, "row-wise %s of '%s': it is a scalar, which has no rows",
			   rule, c->name);
		dg_err_hint(err, "update a scalar without rows");
		return DG_ESHAPE;
	}
	/* rows are ascending: the last is the largest */
	if (c->n_rows > 0 && c->rows[c->n_rows - 1] >= w->shape.dim[0]) {
		dg_err_set(err, DG_EINVAL, "row-wise %s of '%s': row %lld is out of range: it has "
			   "%lld rows", rule, c->name, (long long)c->rows[c->n_rows - 1],
			   (long long)w->shape.dim[0]);
		dg_err_hint(err, "rows index dim 0, from 0 to %lld", (long long)w->shape.dim[0] - 1);
		return DG_EINVAL;
	}
	row.dim[0] = g->shape.ndim > 0 ? g->shape.dim[0] : 0;
	dg_shape_format(&g->shape, a, sizeof a);
	dg_shape_format(&row, b, sizeof b);
	dg_err_set(err, DG_ESHAPE, "row-wise %s of '%s': the rows have shape %s, the variable's "
		   "would be %s", rule, c->name, a, b);
	dg_err_hint(err, "send [n] + the variable's shape without its first dim");
	return DG_ESHAPE;
}

/* Gradient against the variable: same dtype and shape. */
static enum dg_status grad_check(const struct apply_ctx *c, struct dg_err *err)
{
	const struct ps_value *w = &c->v->val->v;
	const struct dg_tensor *g = c->g;
	char a[160], b[160];

	if (c->rows)
		return rows_check(c, err);
	if (g->dtype == w->dtype && dg_shape_eq(&g->shape, &w->shape))
		return DG_OK;   /* the common case: no message to format */
	dg_shape_format(&g->shape, a, sizeof a);
	dg_shape_format(&w->shape, b, sizeof b);
	if (g->dtype != w->dtype) {
		dg_err_set(err, DG_EDTYPE, "%s of '%s': the gradient is %s %s, the variable %s %s",
			   ps_rule_name(c->a->rule), c->name, dg_dtype_name(g->dtype), a,
			   dg_dtype_name(w->dtype), b);
		dg_err_hint(err, "send the update in the variable's dtype");
		return DG_EDTYPE;
	}
	if (!dg_shape_eq(&g->shape, &w->shape)) {
		dg_err_set(err, DG_ESHAPE, "%s of '%s': the gradient has shape %s, the variable %s",
			   ps_rule_name(c->a->rule), c->name, a, b);
		dg_err_hint(err, "send an update of the variable's shape");
		return DG_ESHAPE;
	}
	return DG_OK;
}

/* One row of an update and where it came from: sorting these groups the
 * duplicates of a row and keeps them in arrival order. */
struct rowref {
	int64_t row, pos;
};

static int cmp_rowref(const void *a, const void *b)
{
	const struct rowref *x = a, *y = b;

	if (x->row != y->row)
		return x->row < y->row ? -1 : 1;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

/* rows[0..n) as rowrefs sorted by row (owned; NULL when out of memory). */
static struct rowref *rows_sorted(const int64_t *rows, int64_t n)
{
	struct rowref *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);

	if (!r)
		return NULL;
	for (int64_t i = 0; i < n; i++)
		r[i] = (struct rowref){ rows[i], i };
	qsort(r, (size_t)n, sizeof *r, cmp_rowref);
	return r;
}

static double elem_f64(enum dg_dtype dt, const void *p, int64_t i)
{
	return dt == DG_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* Sync, row-wise, not the last arrival: keep its rows and values. */
static enum dg_status rows_acc_add(struct sync_acc *acc, const struct apply_ctx *c,
				   struct dg_err *err)
{
	int64_t n = c->n_rows, len = c->row_len;

	if (acc->r_n + n > acc->r_cap) {
		int64_t cap = acc->r_cap * 2 > acc->r_n + n ? acc->r_cap * 2 : acc->r_n + n + 64;
		int64_t *nr = realloc(acc->r_rows, (size_t)cap * sizeof *nr);
		if (nr)
			acc->r_rows = nr;
		double *nv = nr ? realloc(acc->r_vals, (size_t)(cap * len + 1) * sizeof *nv) : NULL;
		if (!nv)
			return dg_err_set(err, DG_ENOMEM, "out of memory accumulating '%s'",
					  c->name);
		acc->r_vals = nv;
		acc->r_cap = cap;
	}
	if (n)
		memcpy(acc->r_rows + acc->r_n, c->rows, (size_t)n * sizeof *c->rows);
	for (int64_t i = 0; i < n * len; i++)
		acc->r_vals[acc->r_n * len + i] = elem_f64(c->g->dtype, c->g->data, i);
	acc->r_n += n;
	return DG_OK;
}

/* Sync, row-wise, the last arrival: the mean of count gradients over the
 * union of their rows (a row an arrival did not send is 0 in it, as in the
 * dense mean), into c->mean (the variable's dtype) and c->mean_rows. */
static enum dg_status rows_mean(struct apply_ctx *c, int count, struct dg_err *err)
{
	const struct sync_acc *acc = &c->v->acc;
	enum dg_dtype dt = c->g->dtype;
	int64_t na = acc->r_n, n = na + c->n_rows, len = c->row_len, nu = 0;
	size_t cells = (size_t)(n * len + 1);
	int64_t *all = malloc((size_t)(n + 1) * sizeof *all);
	struct rowref *ref = NULL;
	double *sum = calloc(cells, sizeof *sum);

	c->mean_rows = malloc((size_t)(n + 1) * sizeof *c->mean_rows);
	c->mean = dg_alloc_aligned(cells * dg_dtype_size(dt));
	if (all) {
		if (na)
			memcpy(all, acc->r_rows, (size_t)na * sizeof *all);
		if (c->n_rows)
			memcpy(all + na, c->rows, (size_t)c->n_rows * sizeof *all);
		ref = rows_sorted(all, n);
	}
	if (!all || !ref || !sum || !c->mean_rows || !c->mean) {
		free(all);
		free(ref);
		free(sum);
		return dg_err_set(err, DG_ENOMEM, "out of memory for the mean of '%s'", c->name);
	}
	for (int64_t i = 0; i < n; i++) {
		if (i == 0 || ref[i].row != ref[i - 1].row)
			c->mean_rows[nu++] = ref[i].row;
		double *d = sum + (nu - 1) * len;
		int64_t p = ref[i].pos;
		for (int64_t k = 0; k < len; k++)
			d[k] += p < na ? acc->r_vals[p * len + k]
				       : elem_f64(dt, c->g->data, (p - na) * len + k);
	}
	for (int64_t i = 0; i < nu * len; i++) {
		if (dt == DG_F32)
			((float *)c->mean)[i] = (float)(sum[i] / count);
		else
			((double *)c->mean)[i] = sum[i] / count;
	}
	c->n_mean_rows = nu;
	free(all);
	free(ref);
	free(sum);
	return DG_OK;
}

/* Sync mode: check the step and the replica, then either accumulate (*apply
 * false) or compute the mean into c->mean (*apply true). Caller holds the locks. */
static enum dg_status sync_arrive(struct apply_ctx *c, struct ps_apply_result *res, bool *apply,
				  struct dg_err *err)
{
	const struct ps_apply_args *a = c->a;
	struct var *v = c->v;
	struct sync_acc *acc = &v->acc;
	int64_t numel = c->g->numel;

	*apply = false;
	if (a->step != v->sync_step) {
		bool past = a->step < v->sync_step;
		dg_err_set(err, DG_ESTALE, past ? "gradient for step %lld of '%s' is stale: the "
			   "variable is at step %lld; dropped" : "gradient for step %lld of '%s' "
			   "is ahead of the variable, which is at step %lld; dropped",
			   (long long)a->step, c->name, (long long)v->sync_step);
		dg_err_hint(err, past ? "read the variable again and compute the next step"
				      : "wait for the variable's step (GET with ?min_step=S)");
		return DG_ESTALE;
	}
	if (acc->count && (acc->replicas != a->replicas || acc->backup != a->backup)) {
		dg_err_set(err, DG_EINVAL, "step %lld of '%s' collects replicas=%d backup=%d; this "
			   "gradient says replicas=%d backup=%d", (long long)a->step, c->name,
			   acc->replicas, acc->backup, a->replicas, a->backup);
		dg_err_hint(err, "every replica of a step must send the same replicas and backup");
		return DG_EINVAL;
	}
	if (acc->count && acc->rows != (c->rows != NULL)) {
		dg_err_set(err, DG_EINVAL, "step %lld of '%s' collects %s gradients; this one is %s",
			   (long long)a->step, c->name, acc->rows ? "row-wise" : "dense",
			   c->rows ? "row-wise" : "dense");
		dg_err_hint(err, "every replica of a step must send the same kind of update");
		return DG_EINVAL;
	}
	for (int i = 0; a->replica >= 0 && i < acc->n_seen; i++) {
		if (acc->seen[i] == a->replica) {
			dg_err_set(err, DG_ESTALE, "replica %lld already sent a gradient for step "
				   "%lld of '%s'; dropped", (long long)a->replica,
				   (long long)a->step, c->name);
			dg_err_hint(err, "each replica sends one gradient per step");
			return DG_ESTALE;
		}
	}
	if (acc->count + 1 >= a->replicas - a->backup && c->rows) {
		enum dg_status st = rows_mean(c, acc->count + 1, err);
		*apply = st == DG_OK;
		return st;
	}
	if (acc->count + 1 >= a->replicas - a->backup) {
		/* the last arrival: mean of the sum so far and this gradient,
		 * leaving the accumulator untouched until the apply succeeds */
		size_t nb = c->g->nbytes;
		c->mean = dg_alloc_aligned(nb);
		if (!c->mean)
			return dg_err_set(err, DG_ENOMEM, "out of memory for the mean of '%s'",
					  c->name);
		if (acc->count)
			ps_acc_mean(c->g->dtype, numel, acc->sum, c->g->data, acc->count + 1,
				    c->mean);
		else if (nb)
			memcpy(c->mean, c->g->data, nb);
		*apply = true;
		return DG_OK;
	}
	if (!acc->sum && !c->rows) {
		acc->sum = dg_alloc_aligned((size_t)numel * 8);
		if (!acc->sum)
			return dg_err_set(err, DG_ENOMEM, "out of memory accumulating '%s'",
					  c->name);
		memset(acc->sum, 0, (size_t)numel * 8);
	}
	if (a->replica >= 0 && acc->n_seen == acc->cap_seen) {
		int nc = acc->cap_seen ? 2 * acc->cap_seen : 4;
		int64_t *ns = realloc(acc->seen, (size_t)nc * sizeof *ns);
		if (!ns)
			return dg_err_set(err, DG_ENOMEM, "out of memory accumulating '%s'",
					  c->name);
		acc->seen = ns;
		acc->cap_seen = nc;
	}
	if (c->rows) {
		enum dg_status st = rows_acc_add(acc, c, err);
		if (st != DG_OK)
			return st;
	} else {
		ps_acc_add(c->g->dtype, numel, acc->sum, c->g->data);
	}
	acc->rows = c->rows != NULL;
	if (a->replica >= 0)
		acc->seen[acc->n_seen++] = a->replica;
	acc->count++;
	acc->replicas = a->replicas;
	acc->backup = a->backup;
	res->pending = acc->count;
	return DG_OK;
}

/* Blocks to write: the current ones when private, copies (or zeros for a
 * slot that does not fit) otherwise. */
static enum dg_status apply_prepare(struct apply_ctx *c, struct dg_err *err)
{
	const struct ps_value *w = &c->v->val->v;
	bool reset = false;

	for (int i = 0; i < c->n_slots; i++)
		reset = reset || !slot_fits(c, i, w);
	c->reset = reset;
	for (int i = 0; i <= c->n_slots; i++) {
		struct block *cur = i ? c->slot[i - 1]->val : c->v->val;
		bool priv = block_is_private(cur);
		if (i && reset)
			c->out[i] = slot_zero(c, i - 1, w);
		else if (i || priv || c->rows)   /* rows: copy all, update some */
			c->out[i] = priv ? cur : block_copy(cur);
		else    /* a reader holds the value: the rule writes a fresh block from it */
			c->out[i] = block_new(cur->v.dtype, &cur->v.shape, cur->v.nbytes, NULL,
					      false);
		if (!i && !priv && !c->rows && c->out[i])
			c->src = cur->mem;
		if (!c->out[i])
			return dg_err_set(err, DG_ENOMEM, "out of memory updating '%s'", c->name);
	}
	if (reset)
		dg_log(DG_LOG_INFO, "ps", "slots of '%s' did not fit its dtype/shape: reset to "
		       "zeros", c->name);
	return DG_OK;
}

static void apply_abort(struct apply_ctx *c)
{
	for (int i = 0; i <= c->n_slots; i++) {
		struct block *cur = !c->out[i] ? NULL : i ? c->slot[i - 1]->val : c->v->val;
		if (c->out[i] && c->out[i] != cur)
			block_release(c->out[i]);
		c->out[i] = NULL;
	}
}

/* Versions, log (assign), compute, commit. Caller holds the locks. */
static enum dg_status apply_commit(struct ps_store *s, struct apply_ctx *c, uint64_t *lsn,
				   struct dg_err *err)
{
	const void *g = c->mean ? c->mean : c->g->data;
	const int64_t *rows = c->mean_rows ? c->mean_rows : c->rows;
	int64_t n_rows = c->mean_rows ? c->n_mean_rows : c->n_rows;
	void *slots[PS_MAX_SLOTS] = { 0 };
	uint64_t ver[1 + PS_MAX_SLOTS];
	double now = dg_wall_s();
	enum dg_status st = DG_OK;

	for (int i = 0; i <= c->n_slots && st == DG_OK; i++)
		st = version_next(s, &ver[i], err);
	for (int i = 1; c->reset && i <= c->n_slots && st == DG_OK; i++) {
		c->out[i]->v.version = ver[i];
		c->out[i]->v.mtime = now;
		st = log_create(s, c->slot[i - 1]->name, c->out[i],
				ps_rule_slot_init(c->a, i - 1), err);
	}
	if (st == DG_OK && s->wal && rows && (c->a->rule == PS_ASSIGN || s->strict)) {
		struct ps_wal_rec r = {
			.type = PS_WAL_APPLY_ROWS, .name = c->name, .dtype = c->g->dtype,
			.shape = c->g->shape, .version = ver[0], .mtime = now, .data = g,
			.nbytes = (size_t)(n_rows * c->row_len) * dg_dtype_size(c->g->dtype),
			.args = c->a, .rows = rows,
			.step = c->a->step >= 0 ? c->v->sync_step + 1 : -1,
		};
		r.shape.dim[0] = n_rows;
		r.data_crc = ps_wal_rows_crc(c->a, rows, n_rows, g, r.nbytes);
		st = store_append(s, &r, lsn, err);
	} else if (st == DG_OK && s->wal && (c->a->rule == PS_ASSIGN || s->strict)) {
		bool assign = c->a->rule == PS_ASSIGN;
		struct ps_wal_rec r = {
			.type = assign ? PS_WAL_ASSIGN : PS_WAL_APPLY, .name = c->name,
			.dtype = c->g->dtype, .shape = c->g->shape, .version = ver[0],
			.mtime = now, .data = g, .nbytes = c->g->nbytes, .args = c->a,
			/* the sync step this apply completes */
			.step = c->a->step >= 0 ? c->v->sync_step + 1 : -1,
			.data_crc = !c->mean ? c->crc
				    : assign ? ps_crc32(0, g, c->g->nbytes)
				    : ps_wal_apply_crc(c->a, g, c->g->nbytes),
		};
		st = store_append(s, &r, lsn, err);
	}
	if (st != DG_OK)
		return st;
	for (int i = 0; i < c->n_slots; i++)
		slots[i] = c->out[1 + i]->mem;
	if (rows)
		ps_apply_rule_rows(c->a, c->g->dtype, c->row_len, n_rows, rows, c->out[0]->mem, g,
				   slots);
	else if (c->src)
		ps_apply_rule_from(c->a, c->g->dtype, c->g->numel, c->out[0]->mem, c->src, g,
				   slots);
	else
		ps_apply_rule(c->a, c->g->dtype, c->g->numel, c->out[0]->mem, g, slots);
	for (int i = 0; i <= c->n_slots; i++) {
		c->out[i]->v.version = ver[i];
		c->out[i]->v.mtime = now;
		var_set_value(s, i ? c->slot[i - 1] : c->v, c->out[i], PS_WATCH_APPLY);
	}
	atomic_fetch_add(&s->changes, 1);
	atomic_fetch_add(&c->v->applies[c->a->rule], 1);
	return DG_OK;
}

/* The apply proper, with the map lock held and the working set locked. */
static enum dg_status apply_locked(struct ps_store *s, struct apply_ctx *c,
				   struct ps_apply_result *res, uint64_t *lsn, struct dg_err *err)
{
	bool apply = true;
	enum dg_status st = grad_check(c, err);

	if (st == DG_OK)
		st = ps_apply_check_dtype(c->a, c->v->val->v.dtype, c->name, err);
	if (st == DG_OK && c->rows && c->a->step >= 0 && !dg_dtype_is_float(c->g->dtype)) {
		dg_err_set(err, DG_EDTYPE, "sync row-wise %s of '%s': it is %s",
			   ps_rule_name(c->a->rule), c->name, dg_dtype_name(c->g->dtype));
		dg_err_hint(err, "synchronous row-wise updates take float32 and float64 variables");
		st = DG_EDTYPE;
	}
	if (st == DG_OK && c->a->step >= 0)
		st = sync_arrive(c, res, &apply, err);
	if (st == DG_OK && apply) {
		st = apply_prepare(c, err);
		if (st == DG_OK)
			st = apply_commit(s, c, lsn, err);
		if (st != DG_OK) {
			apply_abort(c);
		} else if (c->a->step >= 0) {
			acc_reset(&c->v->acc);
			c->v->sync_step++;
			/* no reference to the new value was taken yet (we hold v->mu) */
			c->v->val->v.step = c->v->sync_step;
		}
	}
	res->applied = st == DG_OK && apply;
	res->version = c->v->val->v.version;
	res->step = c->v->sync_step;
	return st;
}

/* The rows of a row-wise update distinct and ascending, into c: a->rows
 * and g as they are when they already are, else sorted copies with the
 * values of a row's duplicates summed (*own_rows, *own_vals: owned). gv is
 * the view of the values c->g points to then. */
static enum dg_status rows_coalesce(struct apply_ctx *c, const struct dg_tensor *g,
				    struct dg_tensor *gv, int64_t **own_rows, void **own_vals,
				    struct dg_err *err)
{
	const struct ps_apply_args *a = c->a;
	const char *rule = ps_rule_name(a->rule);
	size_t es = dg_dtype_size(g->dtype);
	int64_t n = a->n_rows, len = 1, nu = 0;
	bool sorted = true;
	struct rowref *ref;

	if (g->shape.ndim < 1 || g->shape.dim[0] != n) {
		char b[160];
		dg_shape_format(&g->shape, b, sizeof b);
		dg_err_set(err, DG_ESHAPE, "row-wise %s of '%s': %lld rows but the update has shape "
			   "%s", rule, c->name, (long long)n, b);
		dg_err_hint(err, "send one row of values per row index: shape [n, ...]");
		return DG_ESHAPE;
	}
	for (int i = 1; i < g->shape.ndim; i++)
		len *= g->shape.dim[i];
	for (int64_t i = 0; i < n; i++) {
		if (a->rows[i] < 0) {
			dg_err_set(err, DG_EINVAL, "row-wise %s of '%s': row %lld (index %lld) is "
				   "negative", rule, c->name, (long long)a->rows[i], (long long)i);
			dg_err_hint(err, "rows index dim 0 from 0");
			return DG_EINVAL;
		}
		sorted = sorted && (i == 0 || a->rows[i] > a->rows[i - 1]);
	}
	c->row_len = len;
	*gv = *g;
	c->g = gv;
	c->rows = a->rows;
	c->n_rows = n;
	if (sorted)
		return DG_OK;
	if (!(ref = rows_sorted(a->rows, n)))
		return dg_err_set(err, DG_ENOMEM, "out of memory sorting the rows of '%s'", c->name);
	*own_rows = malloc((size_t)n * sizeof **own_rows);
	*own_vals = dg_alloc_aligned(g->nbytes ? g->nbytes : 1);
	if (!*own_rows || !*own_vals) {
		free(ref);
		return dg_err_set(err, DG_ENOMEM, "out of memory sorting the rows of '%s'", c->name);
	}
	for (int64_t i = 0; i < n; i++) {
		const char *src = (const char *)g->data + (size_t)(ref[i].pos * len) * es;
		if (i && ref[i].row == ref[i - 1].row) {
			if (a->rule == PS_ASSIGN) {
				dg_err_set(err, DG_EINVAL, "row-wise assign of '%s': row %lld is "
					   "given twice", c->name, (long long)ref[i].row);
				dg_err_hint(err, "assign each row once (other rules sum duplicates)");
				free(ref);
				return DG_EINVAL;
			}
			ps_apply_add(g->dtype, len, (char *)*own_vals + (size_t)((nu - 1) * len) * es,
				     src);
			continue;
		}
		(*own_rows)[nu] = ref[i].row;
		if (len)
			memcpy((char *)*own_vals + (size_t)(nu * len) * es, src, (size_t)len * es);
		nu++;
	}
	free(ref);
	gv->data = *own_vals;
	gv->shape.dim[0] = nu;
	gv->numel = nu * len;
	gv->nbytes = (size_t)(nu * len) * es;
	c->rows = *own_rows;
	c->n_rows = nu;
	return DG_OK;
}

enum dg_status ps_store_apply(struct ps_store *s, const char *name,
			      const struct ps_apply_args *a, const struct dg_tensor *g,
			      struct ps_apply_result *res, struct dg_err *err)
{
	struct apply_ctx c = { .name = name, .a = a, .g = g };
	struct dg_tensor gv;
	int64_t *own_rows = NULL;
	void *own_vals = NULL;
	struct ps_apply_result dummy;
	const char *const *suffix;
	struct var *locked[MAX_LOCKED];
	enum dg_status st;
	uint64_t lsn = 0;
	bool wr = false, missing;

	if (!res)
		res = &dummy;
	*res = (struct ps_apply_result){ 0 };
	if (!a)
		return dg_err_set(err, DG_EINVAL, "no update rule for '%s'", name ? name : "");
	st = dg_var_name_check(name, err);
	if (st == DG_OK)
		st = ps_apply_check_args(a, name, err);
	if (st == DG_OK)
		st = tensor_check(g, "update", name, err);
	if (st == DG_OK && a->rows)
		st = rows_coalesce(&c, g, &gv, &own_rows, &own_vals, err);
	if (st != DG_OK) {
		free(own_rows);
		dg_free_aligned(own_vals);
		return st;
	}
	c.n_slots = ps_rule_slots(a->rule, &suffix);
	for (int i = 0; i < c.n_slots; i++) {
		if (strlen(name) + strlen(suffix[i]) > DG_VAR_NAME_MAX) {
			dg_err_set(err, DG_EINVAL, "%s of '%.80s...': the slot name would "
				   "exceed %d bytes", ps_rule_name(a->rule), name, DG_VAR_NAME_MAX);
			dg_err_hint(err, "use a shorter variable name");
			free(own_rows);
			dg_free_aligned(own_vals);
			return DG_EINVAL;
		}
		slot_name_make(c.slot_name[i], name, suffix[i]);
	}
	/* outside every lock (a row-wise record's CRC is computed when logged) */
	if (!c.rows && s->wal && a->rule == PS_ASSIGN && a->step < 0)
		c.crc = ps_crc32(0, g->data, g->nbytes);
	else if (!c.rows && s->strict && a->step < 0)
		c.crc = ps_wal_apply_crc(a, g->data, g->nbytes);
	pthread_rwlock_rdlock(&s->map);
	for (;;) {
		c.v = map_find(s, name);
		if (!c.v) {
			st = not_found(err, name);
			break;
		}
		st = find_slots(s, &c, wr, &missing, err);
		if (st != DG_OK || !missing)
			break;
		/* an apply that will be refused must not leave new slots behind */
		pthread_mutex_lock(&c.v->mu);
		st = grad_check(&c, err);
		if (st == DG_OK)
			st = ps_apply_check_dtype(a, c.v->val->v.dtype, name, err);
		pthread_mutex_unlock(&c.v->mu);
		if (st != DG_OK)
			break;
		/* first use of the slots: come back with the write lock to add them */
		pthread_rwlock_unlock(&s->map);
		pthread_rwlock_wrlock(&s->map);
		wr = true;
	}
	if (st == DG_OK) {
		locked[0] = c.v;
		for (int i = 0; i < c.n_slots; i++)
			locked[1 + i] = c.slot[i];
		lock_sorted(locked, 1 + c.n_slots);
		st = apply_locked(s, &c, res, &lsn, err);
		for (int i = c.n_slots; i >= 0; i--)
			pthread_mutex_unlock(&locked[i]->mu);
	}
	pthread_rwlock_unlock(&s->map);
	dg_free_aligned(c.mean);
	free(c.mean_rows);
	free(own_rows);
	dg_free_aligned(own_vals);
	if (st == DG_OK && lsn)
		st = ps_wal_sync(s->wal, lsn, err);
	return st;
}

/* --- stats and metrics ----------------------------------------------------------------------- */

void ps_store_stats(struct ps_store *s, int64_t *n_vars, int64_t *bytes)
{
	if (n_vars)
		*n_vars = atomic_load(&s->stat_vars);
	if (bytes)
		*bytes = atomic_load(&s->stat_bytes);
}

static enum dg_status metrics_applies(struct ps_store *s, struct dg_buf *out, struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(out, err, "# HELP dg_ps_applies_total Update rules "
					  "applied to a variable (sync: once per step).\n"
					  "# TYPE dg_ps_applies_total counter\n");

	pthread_rwlock_rdlock(&s->map);
	for (size_t i = 0; st == DG_OK && i < s->n_buckets; i++) {
		for (struct var *v = s->buckets[i]; st == DG_OK && v; v = v->next) {
			for (int r = 0; st == DG_OK && r < PS_RULE_COUNT; r++) {
				uint64_t n = atomic_load(&v->applies[r]);
				if (!n)
					continue;
				st = dg_buf_printf(out, err, "dg_ps_applies_total{var=\"%s\","
						   "rule=\"%s\"} %" PRIu64 "\n", v->name,
						   ps_rule_name((enum ps_rule)r), n);
			}
		}
	}
	pthread_rwlock_unlock(&s->map);
	return st;
}

enum dg_status ps_store_metrics(struct ps_store *s, struct dg_buf *out, struct dg_err *err)
{
	int64_t n, bytes;
	enum dg_status st;

	ps_store_stats(s, &n, &bytes);
	st = dg_buf_printf(out, err,
			   "# HELP dg_ps_vars Variables held, slots included.\n"
			   "# TYPE dg_ps_vars gauge\ndg_ps_vars %" PRId64 "\n"
			   "# HELP dg_ps_bytes Bytes of variable values held.\n"
			   "# TYPE dg_ps_bytes gauge\ndg_ps_bytes %" PRId64 "\n"
			   "# HELP dg_ps_checkpoints_total Snapshots written.\n"
			   "# TYPE dg_ps_checkpoints_total counter\n"
			   "dg_ps_checkpoints_total %" PRIu64 "\n"
			   "# HELP dg_ps_epoch Restart counter of the data directory.\n"
			   "# TYPE dg_ps_epoch gauge\ndg_ps_epoch %" PRIu64 "\n"
			   "# HELP dg_ps_wal_fsyncs_total fdatasync calls on the write-ahead log.\n"
			   "# TYPE dg_ps_wal_fsyncs_total counter\ndg_ps_wal_fsyncs_total %" PRIu64
			   "\n# HELP dg_ps_checkpoint_failures_total Snapshots that failed (the "
			   "previous snapshot and the log still hold the data).\n"
			   "# TYPE dg_ps_checkpoint_failures_total counter\n"
			   "dg_ps_checkpoint_failures_total %" PRIu64 "\n"
			   "# HELP dg_ps_disk_full 1 while the last write to the data directory found "
			   "its disk full.\n# TYPE dg_ps_disk_full gauge\ndg_ps_disk_full %d\n",
			   n, bytes, (uint64_t)atomic_load(&s->checkpoints), s->epoch,
			   s->wal ? ps_wal_fsyncs(s->wal) : 0,
			   (uint64_t)atomic_load(&s->ckpt_failures), (int)atomic_load(&s->disk_full));
	if (st == DG_OK)
		st = metrics_applies(s, out, err);
	return st;
}
