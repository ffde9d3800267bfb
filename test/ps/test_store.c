/* The variable store (ps/store.c) in memory: put/get and the replace rules,
 * create-only and If-Match conflicts, partial writes and their refusals,
 * delete with slots, sorted listing, long-poll waits, copy-on-write of held
 * values, and readers that never see a torn value under concurrent puts. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store.h"

/* Seconds on the monotonic clock: the timing checks of the wait tests. */
static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static struct ps_store *open_mem(void)
{
	struct dg_err err = { 0 };
	struct ps_store *s = ps_store_open(&(struct ps_store_config){ 0 }, &err);

	cr_assert_not_null(s, "open: %s", err.msg);
	return s;
}

/* A float32 tensor of shape [n] (or [r, c] when c > 0) with every element v. */
static struct dg_tensor *filled(int64_t r, int64_t c, float v)
{
	int64_t d[2] = { r, c };
	struct dg_shape sh = dg_shape_make(c > 0 ? 2 : 1, d);
	struct dg_tensor *t = dg_tensor_new(DG_F32, &sh, NULL);

	cr_assert_not_null(t);
	for (int64_t i = 0; i < t->numel; i++)
		((float *)t->data)[i] = v;
	return t;
}

static struct dg_tensor *iota_f32(int64_t n)
{
	struct dg_tensor *t = filled(n, 0, 0);

	for (int64_t i = 0; i < n; i++)
		((float *)t->data)[i] = (float)i;
	return t;
}

static uint64_t put(struct ps_store *s, const char *name, struct dg_tensor *t)
{
	struct dg_err err = { 0 };
	uint64_t ver = 0;
	enum dg_status st = ps_store_put(s, name, t, NULL, &ver, NULL, &err);

	cr_assert_eq(st, DG_OK, "put %s: %s", name, err.msg);
	return ver;
}

static const float *get_f32(struct ps_store *s, const char *name, struct ps_value **v)
{
	struct dg_err err = { 0 };

	cr_assert_eq(ps_store_get(s, name, v, &err), DG_OK, "get %s: %s", name, err.msg);
	cr_assert_eq((*v)->dtype, DG_F32);
	return (*v)->data;
}

static void assert_err(enum dg_status st, enum dg_status want, const struct dg_err *err,
		       const char *text)
{
	cr_assert_eq(st, want, "status %s (%s), wanted %s", dg_status_name(st), err->msg,
		     dg_status_name(want));
	cr_assert_not_null(strstr(err->msg, text), "message '%s' lacks '%s'", err->msg, text);
}

/* --- put / get -------------------------------------------------------------------------------- */

Test(store, put_then_get_returns_the_same_bytes_and_version)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t ver = 0;
	bool created = false;

	cr_assert_eq(ps_store_put(s, "model/w1", iota_f32(6), NULL, &ver, &created, &err), DG_OK);
	cr_assert(created);
	cr_assert_gt(ver, 0);
	const float *d = get_f32(s, "model/w1", &v);
	cr_assert_eq(v->nbytes, 24);
	cr_assert_eq(v->shape.ndim, 1);
	cr_assert_eq(v->shape.dim[0], 6);
	cr_assert_eq(v->version, ver);
	cr_assert_gt(v->mtime, 1.6e9);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(d[i], (float)i, 0);
	ps_value_release(v);

	uint64_t ver2 = 0;
	cr_assert_eq(ps_store_put(s, "model/w1", filled(6, 0, 7), NULL, &ver2, &created, &err),
		     DG_OK);
	cr_assert_not(created);
	cr_assert_gt(ver2, ver);
	d = get_f32(s, "model/w1", &v);
	cr_assert_float_eq(d[5], 7.0f, 0);
	ps_value_release(v);
	ps_store_close(s);
}

Test(store, get_of_a_missing_variable_is_not_found_with_a_hint)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v = (struct ps_value *)1;

	assert_err(ps_store_get(s, "nope", &v, &err), DG_ENOTFOUND, &err, "'nope'");
	cr_assert_null(v);
	cr_assert_neq(err.hint[0], '\0');
	ps_store_close(s);
}

Test(store, invalid_names_are_refused_and_the_tensor_is_freed)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };

	cr_assert_eq(ps_store_put(s, "../etc/passwd", filled(2, 0, 1), NULL, NULL, NULL, &err),
		     DG_EINVAL);
	cr_assert_eq(ps_store_put(s, "a//b", filled(2, 0, 1), NULL, NULL, NULL, &err), DG_EINVAL);
	cr_assert_eq(ps_store_put(s, "", filled(2, 0, 1), NULL, NULL, NULL, &err), DG_EINVAL);
	int64_t n, bytes;
	ps_store_stats(s, &n, &bytes);
	cr_assert_eq(n, 0);
	ps_store_close(s);
}

Test(store, another_shape_or_dtype_is_refused_unless_replace)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	struct dg_shape sh6 = dg_shape_make(1, (int64_t[]){ 6 });

	put(s, "w", filled(2, 3, 1));
	assert_err(ps_store_put(s, "w", filled(6, 0, 2), NULL, NULL, NULL, &err), DG_ESHAPE, &err,
		   "[2,3]");
	cr_assert_not_null(strstr(err.msg, "[6]"), "%s", err.msg);
	cr_assert_not_null(strstr(err.hint, "replace"));
	struct dg_tensor *i32 = dg_tensor_new(DG_I32, &(struct dg_shape){ 2, { 2, 3 } }, NULL);
	assert_err(ps_store_put(s, "w", i32, NULL, NULL, NULL, &err), DG_EDTYPE, &err, "int32");
	cr_assert_not_null(strstr(err.msg, "float32"), "%s", err.msg);

	/* refused puts left the value alone */
	const float *d = get_f32(s, "w", &v);
	cr_assert_eq(v->shape.ndim, 2);
	cr_assert_float_eq(d[0], 1.0f, 0);
	ps_value_release(v);

	struct ps_put_opts rep = { .replace = true };
	cr_assert_eq(ps_store_put(s, "w", filled(6, 0, 2), &rep, NULL, NULL, &err), DG_OK, "%s",
		     err.msg);
	d = get_f32(s, "w", &v);
	cr_assert(dg_shape_eq(&v->shape, &sh6));
	cr_assert_float_eq(d[5], 2.0f, 0);
	ps_value_release(v);
	ps_store_close(s);
}

Test(store, create_only_conflicts_when_the_variable_exists)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_put_opts co = { .create_only = true };
	struct ps_value *v;

	cr_assert_eq(ps_store_put(s, "c", filled(2, 0, 1), &co, NULL, NULL, &err), DG_OK);
	assert_err(ps_store_put(s, "c", filled(2, 0, 5), &co, NULL, NULL, &err), DG_ECONFLICT,
		   &err, "exists");
	const float *d = get_f32(s, "c", &v);
	cr_assert_float_eq(d[1], 1.0f, 0);
	ps_value_release(v);
	ps_store_close(s);
}

Test(store, if_match_conflicts_on_a_stale_version_and_succeeds_on_the_current)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t v1 = put(s, "x", filled(4, 0, 1));
	uint64_t v2 = put(s, "x", filled(4, 0, 2));
	struct ps_put_opts stale = { .if_match = v1 }, cur = { .if_match = v2 };
	float three = 3;

	assert_err(ps_store_put(s, "x", filled(4, 0, 9), &stale, NULL, NULL, &err), DG_ECONFLICT,
		   &err, "not");
	assert_err(ps_store_patch(s, "x", 0, &three, 4, v1, NULL, &err), DG_ECONFLICT, &err,
		   "If-Match");
	assert_err(ps_store_delete(s, "x", v1, &err), DG_ECONFLICT, &err, "If-Match");
	/* If-Match on a variable that does not exist: nothing to match */
	assert_err(ps_store_put(s, "y", filled(4, 0, 9), &cur, NULL, NULL, &err), DG_ECONFLICT,
		   &err, "does not exist");

	uint64_t v3 = 0, v4 = 0;
	cr_assert_eq(ps_store_put(s, "x", filled(4, 0, 5), &cur, &v3, NULL, &err), DG_OK);
	cr_assert_eq(ps_store_patch(s, "x", 4, &three, 4, v3, &v4, &err), DG_OK, "%s", err.msg);
	cr_assert_gt(v4, v3);
	const float *d = get_f32(s, "x", &v);
	cr_assert_float_eq(d[0], 5.0f, 0);
	cr_assert_float_eq(d[1], 3.0f, 0);
	cr_assert_eq(v->version, v4);
	ps_value_release(v);
	cr_assert_eq(ps_store_delete(s, "x", v4, &err), DG_OK);
	ps_store_close(s);
}

Test(store, versions_are_unique_and_increase_across_variables)
{
	struct ps_store *s = open_mem();
	uint64_t last = 0;

	for (int i = 0; i < 50; i++) {
		char name[16];
		snprintf(name, sizeof name, "v%d", i % 7);
		uint64_t ver = put(s, name, filled(3, 0, (float)i));
		cr_assert_gt(ver, last);
		last = ver;
	}
	ps_store_close(s);
}

/* --- patch ----------------------------------------------------------------------------------- */

Test(store, patch_writes_whole_elements_at_an_offset)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	float vals[2] = { -1.5f, 42.0f };

	put(s, "p", iota_f32(8));
	cr_assert_eq(ps_store_patch(s, "p", 12, vals, 8, 0, NULL, &err), DG_OK, "%s", err.msg);
	const float *d = get_f32(s, "p", &v);
	const float want[8] = { 0, 1, 2, -1.5f, 42, 5, 6, 7 };
	for (int i = 0; i < 8; i++)
		cr_assert_float_eq(d[i], want[i], 0, "element %d", i);
	ps_value_release(v);
	/* the last element exactly */
	cr_assert_eq(ps_store_patch(s, "p", 28, vals, 4, 0, NULL, &err), DG_OK);
	d = get_f32(s, "p", &v);
	cr_assert_float_eq(d[7], -1.5f, 0);
	ps_value_release(v);
	ps_store_close(s);
}

Test(store, patch_refuses_misaligned_or_outside_writes_and_changes_nothing)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	unsigned char junk[64];
	uint64_t ver = put(s, "p", iota_f32(4));

	memset(junk, 0xff, sizeof junk);
	assert_err(ps_store_patch(s, "p", 2, junk, 4, 0, NULL, &err), DG_EINVAL, &err, "16 bytes");
	assert_err(ps_store_patch(s, "p", 0, junk, 6, 0, NULL, &err), DG_EINVAL, &err, "'p'");
	assert_err(ps_store_patch(s, "p", 12, junk, 8, 0, NULL, &err), DG_EINVAL, &err, "[12, 20)");
	assert_err(ps_store_patch(s, "p", 16, junk, 4, 0, NULL, &err), DG_EINVAL, &err, "'p'");
	assert_err(ps_store_patch(s, "p", UINT64_MAX - 3, junk, 8, 0, NULL, &err), DG_EINVAL, &err,
		   "'p'");
	assert_err(ps_store_patch(s, "p", 0, junk, 0, 0, NULL, &err), DG_EINVAL, &err, "'p'");
	assert_err(ps_store_patch(s, "q", 0, junk, 4, 0, NULL, &err), DG_ENOTFOUND, &err, "'q'");
	const float *d = get_f32(s, "p", &v);
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(d[i], (float)i, 0);
	cr_assert_eq(v->version, ver);
	ps_value_release(v);
	ps_store_close(s);
}

/* --- delete and list ------------------------------------------------------------------------- */

static void apply_rule(struct ps_store *s, const char *name, enum ps_rule rule, float g)
{
	struct dg_err err = { 0 };
	struct ps_apply_args a = { .rule = rule, .lr = 0.1, .momentum = 0.9, .beta1 = 0.9,
				   .beta2 = 0.999, .eps = 1e-8, .step = -1, .replica = -1 };
	struct dg_tensor *t = filled(4, 0, g);

	cr_assert_eq(ps_store_apply(s, name, &a, t, NULL, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(t);
}

static int list_names(struct ps_store *s, const char *prefix, char out[][DG_VAR_NAME_MAX + 1],
		      int max)
{
	struct dg_var_info *info;
	struct dg_err err = { 0 };
	int n;

	cr_assert_eq(ps_store_list(s, prefix, &info, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_leq(n, max);
	for (int i = 0; i < n; i++)
		snprintf(out[i], DG_VAR_NAME_MAX + 1, "%s", info[i].name);
	free(info);
	return n;
}

Test(store, delete_removes_the_variable_and_its_slots_only)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	char names[16][DG_VAR_NAME_MAX + 1];

	put(s, "w", filled(4, 0, 1));
	put(s, "wx", filled(4, 0, 1));
	apply_rule(s, "w", PS_MOMENTUM, 1);
	apply_rule(s, "w", PS_ADAM, 1);
	apply_rule(s, "wx", PS_MOMENTUM, 1);
	int n = list_names(s, NULL, names, 16);
	cr_assert_eq(n, 7);
	cr_assert_eq(ps_store_delete(s, "w", 0, &err), DG_OK, "%s", err.msg);
	n = list_names(s, NULL, names, 16);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(names[0], "wx");
	cr_assert_str_eq(names[1], "wx.momentum");
	assert_err(ps_store_delete(s, "w", 0, &err), DG_ENOTFOUND, &err, "'w'");
	/* a deleted name can be created again, from scratch */
	put(s, "w", filled(2, 0, 3));
	struct ps_value *v;
	const float *d = get_f32(s, "w", &v);
	cr_assert_eq(v->nbytes, 8);
	cr_assert_float_eq(d[1], 3.0f, 0);
	ps_value_release(v);
	int64_t nv, bytes;
	ps_store_stats(s, &nv, &bytes);
	cr_assert_eq(nv, 3);
	cr_assert_eq(bytes, 16 + 16 + 8);
	ps_store_close(s);
}

Test(store, list_is_sorted_by_name_and_filters_by_prefix)
{
	struct ps_store *s = open_mem();
	const char *names[] = { "b/2", "a", "b/10", "c", "b/1", "ab" };
	struct dg_var_info *info;
	struct dg_err err = { 0 };
	int n;

	for (int i = 0; i < 6; i++)
		put(s, names[i], filled(i + 1, 0, 0));
	cr_assert_eq(ps_store_list(s, NULL, &info, &n, &err), DG_OK);
	cr_assert_eq(n, 6);
	const char *want[] = { "a", "ab", "b/1", "b/10", "b/2", "c" };
	for (int i = 0; i < 6; i++)
		cr_assert_str_eq(info[i].name, want[i]);
	cr_assert_eq(info[0].bytes, 8);     /* "a": 2 floats */
	cr_assert_eq(info[0].dtype, DG_F32);
	cr_assert_eq(info[0].shape.dim[0], 2);
	cr_assert_gt(info[0].version, 0);
	free(info);
	cr_assert_eq(ps_store_list(s, "b/", &info, &n, &err), DG_OK);
	cr_assert_eq(n, 3);
	cr_assert_str_eq(info[0].name, "b/1");
	cr_assert_str_eq(info[2].name, "b/2");
	free(info);
	cr_assert_eq(ps_store_list(s, "zz", &info, &n, &err), DG_OK);
	cr_assert_eq(n, 0);
	free(info);
	ps_store_close(s);
}

Test(store, listing_100k_variables_is_sorted_and_fast, .timeout = 120)
{
	struct ps_store *s = open_mem();
	struct dg_var_info *info;
	struct dg_err err = { 0 };
	double t0, sec;
	int n;

	/* inserted in a scrambled order: 37 is coprime with 100000 */
	for (int i = 0; i < 100000; i++) {
		char name[32];
		snprintf(name, sizeof name, "layer%d/w", (int)((int64_t)i * 37 % 100000));
		put(s, name, filled(1, 0, (float)i));
	}
	t0 = now_s();
	cr_assert_eq(ps_store_list(s, NULL, &info, &n, &err), DG_OK);
	sec = now_s() - t0;
	cr_assert_eq(n, 100000);
	for (int i = 1; i < n; i++)
		cr_assert_lt(strcmp(info[i - 1].name, info[i].name), 0, "at %d", i);
	free(info);
	/* about 0.05 s in a release build; generous for sanitizer builds */
	cr_assert_lt(sec, 2.0, "listing took %.3f s", sec);
	cr_assert_eq(ps_store_list(s, "layer99999/", &info, &n, &err), DG_OK);
	cr_assert_eq(n, 1);
	free(info);
	ps_store_close(s);
}

/* --- waits ----------------------------------------------------------------------------------- */

struct later {
	struct ps_store *s;
	const char *name;
	int delay_ms;
	bool del;
};

static void *later_main(void *arg)
{
	struct later *l = arg;
	struct dg_err err = { 0 };

	usleep((useconds_t)l->delay_ms * 1000);
	if (l->del)
		ps_store_delete(l->s, l->name, 0, &err);
	else
		ps_store_put(l->s, l->name, filled(3, 0, 9), NULL, NULL, NULL, &err);
	return NULL;
}

Test(store, wait_is_woken_by_a_put_from_another_thread)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t ver = put(s, "w", filled(3, 0, 1));
	struct later l = { s, "w", 100, false };
	double t0, sec;
	pthread_t th;

	/* a version already reached returns at once */
	cr_assert_eq(ps_store_wait(s, "w", ver, 5000, &v, &err), DG_OK);
	ps_value_release(v);
	pthread_create(&th, NULL, later_main, &l);
	t0 = now_s();
	cr_assert_eq(ps_store_wait(s, "w", ver + 1, 10000, &v, &err), DG_OK, "%s", err.msg);
	sec = now_s() - t0;
	pthread_join(th, NULL);
	cr_assert_gt(v->version, ver);
	cr_assert_float_eq(((const float *)v->data)[2], 9.0f, 0);
	ps_value_release(v);
	cr_assert_lt(sec, 5.0, "woken after %.3f s", sec);
	ps_store_close(s);
}

Test(store, wait_times_out_with_the_current_value)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t ver = put(s, "w", filled(3, 0, 1));
	double t0, sec;

	t0 = now_s();
	assert_err(ps_store_wait(s, "w", ver + 10, 200, &v, &err), DG_ETIMEOUT, &err, "version");
	sec = now_s() - t0;
	cr_assert_geq(sec, 0.19, "returned after %.3f s", sec);
	cr_assert_not_null(v);
	cr_assert_eq(v->version, ver);
	ps_value_release(v);
	assert_err(ps_store_wait(s, "none", 1, 10, &v, &err), DG_ENOTFOUND, &err, "'none'");
	ps_store_close(s);
}

Test(store, wait_on_a_variable_deleted_meanwhile_is_not_found)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t ver = put(s, "w", filled(3, 0, 1));
	struct later l = { s, "w", 100, true };
	pthread_t th;

	pthread_create(&th, NULL, later_main, &l);
	assert_err(ps_store_wait(s, "w", ver + 1, 10000, &v, &err), DG_ENOTFOUND, &err, "deleted");
	cr_assert_null(v);
	pthread_join(th, NULL);
	ps_store_close(s);
}

Test(store, every_rule_gives_the_same_bits_whether_or_not_a_reader_holds_the_value)
{
	static const enum ps_rule rules[] = { PS_ASSIGN, PS_ASSIGN_ADD, PS_SGD, PS_MOMENTUM,
					      PS_ADAM };
	struct ps_store *s = open_mem();

	for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++) {
		struct ps_value *held, *a, *b;
		struct dg_tensor *x = iota_f32(4), *y = iota_f32(4);

		put(s, "plain", x);
		put(s, "held", y);
		get_f32(s, "held", &held);      /* the rule must write a fresh block */
		for (int k = 0; k < 3; k++) {   /* twice with momentum/adam slots in use */
			apply_rule(s, "plain", rules[r], 1.5f + (float)k);
			apply_rule(s, "held", rules[r], 1.5f + (float)k);
		}
		get_f32(s, "plain", &a);
		get_f32(s, "held", &b);
		cr_assert_eq(memcmp(a->data, b->data, 16), 0, "rule %d: copy-on-write differs",
			     (int)rules[r]);
		for (int i = 0; i < 4; i++)     /* and the held value did not move */
			cr_assert_float_eq(((const float *)held->data)[i], (float)i, 0);
		if (rules[r] == PS_SGD)         /* i - 0.1 * (1.5 + 2.5 + 3.5) */
			cr_assert_float_eq(((const float *)b->data)[2], 2.0f - 0.75f, 1e-6);
		ps_value_release(held);
		ps_value_release(a);
		ps_value_release(b);
		cr_assert_eq(ps_store_delete(s, "plain", 0, NULL), DG_OK);
		cr_assert_eq(ps_store_delete(s, "held", 0, NULL), DG_OK);
	}
	ps_store_close(s);
}

/* --- sync steps ------------------------------------------------------------------------------- */

/* Replica r's sgd gradient (lr 1, two replicas) of every element g for step. */
static enum dg_status sync_push(struct ps_store *s, int64_t step, int64_t replica, float g,
				struct dg_err *err)
{
	struct ps_apply_args a = { .rule = PS_SGD, .lr = 1, .step = step, .replicas = 2,
				   .replica = replica };
	struct dg_tensor *t = filled(3, 0, g);
	enum dg_status st = ps_store_apply(s, "w", &a, t, NULL, err);

	dg_tensor_free(t);
	return st;
}

struct step_later {
	struct ps_store *s;
	int delay_ms;
};

/* Completes step 0 of w after delay_ms: replica 0 at once, replica 1 later. */
static void *step_later_main(void *p)
{
	struct step_later *l = p;
	struct dg_err err = { 0 };

	cr_assert_eq(sync_push(l->s, 0, 0, 1, &err), DG_OK, "%s", err.msg);
	usleep((useconds_t)l->delay_ms * 1000);
	cr_assert_eq(sync_push(l->s, 0, 1, 3, &err), DG_OK, "%s", err.msg);
	return NULL;
}

Test(store, wait_step_wakes_when_the_last_replica_completes_the_step)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t ver = put(s, "w", filled(3, 0, 10));
	struct step_later l = { s, 200 };
	double t0, sec;
	pthread_t th;

	cr_assert_eq(ps_store_wait_step(s, "w", 0, 0, 100, &v, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(v->step, 0);
	ps_value_release(v);
	pthread_create(&th, NULL, step_later_main, &l);
	t0 = now_s();
	cr_assert_eq(ps_store_wait_step(s, "w", 0, 1, 10000, &v, &err), DG_OK, "%s", err.msg);
	sec = now_s() - t0;
	pthread_join(th, NULL);
	cr_assert_geq(sec, 0.15, "returned after %.3f s, before the step completed", sec);
	cr_assert_lt(sec, 5.0);
	cr_assert_eq(v->step, 1);
	cr_assert_eq(v->version, ver + 1);
	for (int i = 0; i < 3; i++)     /* 10 - 1 * mean(1, 3) */
		cr_assert_float_eq(((const float *)v->data)[i], 8.0f, 0);
	ps_value_release(v);
	ps_store_close(s);
}

Test(store, wait_step_times_out_with_the_current_value_and_its_step)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *v;
	uint64_t ver = put(s, "w", filled(3, 0, 10));

	cr_assert_eq(sync_push(s, 0, 0, 1, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(sync_push(s, 0, 1, 1, &err), DG_OK, "%s", err.msg);
	/* one arrival of step 1 does not complete it */
	cr_assert_eq(sync_push(s, 1, 0, 1, &err), DG_OK, "%s", err.msg);
	assert_err(ps_store_wait_step(s, "w", 0, 2, 150, &v, &err), DG_ETIMEOUT, &err, "step 1");
	cr_assert_not_null(v);
	cr_assert_eq(v->step, 1);
	cr_assert_eq(v->version, ver + 1);
	ps_value_release(v);
	/* the version condition holds, the step one does not: still a timeout */
	assert_err(ps_store_wait_step(s, "w", ver, 2, 50, &v, &err), DG_ETIMEOUT, &err, "step");
	ps_value_release(v);
	cr_assert_eq(ps_store_wait_step(s, "w", ver + 1, 1, 50, &v, &err), DG_OK, "%s", err.msg);
	ps_value_release(v);
	ps_store_close(s);
}

Test(store, values_and_the_list_carry_the_sync_step_across_puts_and_async_applies)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = { .rule = PS_SGD, .lr = 1, .step = -1, .replica = -1 };
	struct dg_var_info *info = NULL;
	struct ps_value *v;
	struct dg_tensor *g;
	int n = 0;

	put(s, "w", filled(3, 0, 10));
	put(s, "x", filled(2, 0, 1));
	for (int64_t k = 0; k < 2; k++) {
		cr_assert_eq(sync_push(s, k, 0, 1, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(sync_push(s, k, 1, 1, &err), DG_OK, "%s", err.msg);
	}
	g = filled(3, 0, 1);
	cr_assert_eq(ps_store_apply(s, "w", &a, g, NULL, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(g);
	put(s, "w", filled(3, 0, 5));
	get_f32(s, "w", &v);
	cr_assert_eq(v->step, 2);
	ps_value_release(v);
	cr_assert_eq(ps_store_list(s, NULL, &info, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(info[0].name, "w");
	cr_assert_eq(info[0].step, 2);
	cr_assert_eq(info[1].step, 0);
	free(info);
	ps_store_close(s);
}

Test(store, checkpoint_now_of_a_memory_store_is_unsupported)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_ckpt_info info = { .vars = -7 };

	put(s, "w", filled(3, 0, 10));
	assert_err(ps_store_checkpoint_now(s, &info, &err), DG_EUNSUPPORTED, &err, "memory");
	cr_assert_not_null(strstr(err.hint, "--data-dir"), "hint: %s", err.hint);
	cr_assert_eq(info.vars, -7, "info is left alone on failure");
	ps_store_close(s);
}

/* --- copy-on-write --------------------------------------------------------------------------- */

Test(store, a_held_value_stays_intact_while_put_patch_and_apply_change_the_variable)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_value *held, *now;
	float nine = 9;

	uint64_t ver = put(s, "w", filled(4, 0, 1));
	get_f32(s, "w", &held);
	apply_rule(s, "w", PS_SGD, 10);          /* w = 1 - 0.1*10 = 0 */
	cr_assert_eq(ps_store_patch(s, "w", 0, &nine, 4, 0, NULL, &err), DG_OK);
	const float *d = get_f32(s, "w", &now);
	cr_assert_float_eq(d[0], 9.0f, 0);
	cr_assert_float_eq(d[1], 0.0f, 1e-7);
	cr_assert_gt(now->version, ver);
	ps_value_release(now);
	put(s, "w", filled(4, 0, 5));
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(((const float *)held->data)[i], 1.0f, 0);
	cr_assert_eq(held->version, ver);
	ps_value_release(held);
	d = get_f32(s, "w", &now);
	cr_assert_float_eq(d[3], 5.0f, 0);
	ps_value_release(now);
	ps_store_close(s);
}

Test(store, an_unheld_value_is_updated_in_place_and_a_held_one_is_copied)
{
	struct ps_store *s = open_mem();
	struct ps_value *v, *held;

	put(s, "w", filled(1024, 0, 1));
	get_f32(s, "w", &v);
	const void *before = v->data;
	ps_value_release(v);
	{
		struct dg_err err = { 0 };
		struct ps_apply_args a = { .rule = PS_SGD, .lr = 1, .step = -1, .replica = -1 };
		struct dg_tensor *g = filled(1024, 0, 0.5f);
		cr_assert_eq(ps_store_apply(s, "w", &a, g, NULL, &err), DG_OK);
		get_f32(s, "w", &v);
		cr_assert_eq(v->data, before, "an unshared block is updated in place");
		cr_assert_float_eq(((const float *)v->data)[7], 0.5f, 0);
		held = v;
		cr_assert_eq(ps_store_apply(s, "w", &a, g, NULL, &err), DG_OK);
		get_f32(s, "w", &v);
		cr_assert_neq(v->data, held->data, "a held block is copied");
		cr_assert_float_eq(((const float *)v->data)[7], 0.0f, 0);
		cr_assert_float_eq(((const float *)held->data)[7], 0.5f, 0);
		ps_value_release(v);
		ps_value_release(held);
		dg_tensor_free(g);
	}
	ps_store_close(s);
}

/* --- concurrency ----------------------------------------------------------------------------- */

#define HAMMER_THREADS 16
#define HAMMER_N 4096                   /* floats per value: 16 KiB, many cache lines */

struct hammer {
	struct ps_store *s;
	int id;
	int torn;
	int reads;
};

static void *hammer_main(void *arg)
{
	struct hammer *h = arg;
	struct dg_err err = { 0 };
	char name[8];

	for (int i = 0; i < 300; i++) {
		snprintf(name, sizeof name, "h%d", (h->id + i) % 3);
		if (h->id % 2 == 0) {
			/* every element equals one number: a torn read would mix two */
			struct dg_tensor *t = filled(HAMMER_N, 0, (float)(h->id * 1000 + i));
			ps_store_put(h->s, name, t, NULL, NULL, NULL, &err);
		} else {
			struct ps_value *v;
			if (ps_store_get(h->s, name, &v, &err) != DG_OK)
				continue;
			const float *d = v->data;
			for (int k = 1; k < HAMMER_N; k++)
				if (d[k] != d[0]) {
					h->torn++;
					break;
				}
			h->reads++;
			ps_value_release(v);
		}
		if (i % 50 == 0) {
			struct ps_apply_args a = { .rule = PS_ASSIGN, .step = -1, .replica = -1 };
			struct dg_tensor *g = filled(HAMMER_N, 0, (float)-h->id);
			ps_store_apply(h->s, name, &a, g, NULL, &err);
			dg_tensor_free(g);
		}
	}
	return NULL;
}

Test(store, sixteen_threads_of_puts_and_gets_never_see_a_torn_value, .timeout = 120)
{
	struct ps_store *s = open_mem();
	struct hammer h[HAMMER_THREADS];
	pthread_t th[HAMMER_THREADS];
	int torn = 0, reads = 0;

	for (int i = 0; i < 3; i++) {
		char name[8];
		snprintf(name, sizeof name, "h%d", i);
		put(s, name, filled(HAMMER_N, 0, 0));
	}
	for (int i = 0; i < HAMMER_THREADS; i++) {
		h[i] = (struct hammer){ .s = s, .id = i };
		pthread_create(&th[i], NULL, hammer_main, &h[i]);
	}
	for (int i = 0; i < HAMMER_THREADS; i++) {
		pthread_join(th[i], NULL);
		torn += h[i].torn;
		reads += h[i].reads;
	}
	cr_assert_eq(torn, 0, "%d of %d reads saw a torn value", torn, reads);
	cr_assert_eq(reads, 8 * 300);
	ps_store_close(s);
}

/* --- stats and metrics ----------------------------------------------------------------------- */

Test(store, stats_and_metrics_count_variables_bytes_and_applies)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	int64_t n, bytes;

	put(s, "a", filled(4, 0, 1));
	put(s, "b", filled(2, 2, 1));
	apply_rule(s, "a", PS_SGD, 1);
	apply_rule(s, "a", PS_SGD, 1);
	apply_rule(s, "a", PS_MOMENTUM, 1);
	ps_store_stats(s, &n, &bytes);
	cr_assert_eq(n, 3);                 /* a, a.momentum, b */
	cr_assert_eq(bytes, 48);
	cr_assert_eq(ps_store_metrics(s, &b, &err), DG_OK);
	cr_assert_not_null(strstr(b.data, "\ndg_ps_vars 3\n"), "%s", b.data);
	cr_assert_not_null(strstr(b.data, "\ndg_ps_bytes 48\n"));
	cr_assert_not_null(strstr(b.data, "dg_ps_applies_total{var=\"a\",rule=\"sgd\"} 2\n"));
	cr_assert_not_null(strstr(b.data, "dg_ps_applies_total{var=\"a\",rule=\"momentum\"} 1\n"));
	cr_assert_not_null(strstr(b.data, "\ndg_ps_epoch 1\n"));
	cr_assert_not_null(strstr(b.data, "\ndg_ps_checkpoints_total 0\n"));
	cr_assert_not_null(strstr(b.data, "\ndg_ps_wal_fsyncs_total 0\n"));
	cr_assert_eq(ps_store_epoch(s), 1);
	cr_assert_eq(ps_store_checkpoint(s, &err), DG_OK);   /* memory only: nothing to do */
	dg_buf_deinit(&b);
	ps_store_close(s);
}
