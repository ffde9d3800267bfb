/* Update rules of the store (ps/apply.c through ps_store_apply): each rule
 * against hand-computed values and a double-precision reference computed
 * here, for float32 and float64, over several steps; slots; argument, dtype
 * and shape refusals; synchronous accumulation with replicas, backup
 * workers, duplicates and steps out of turn; concurrent applies. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "store_internal.h"

#define N 5

static struct ps_store *open_mem(void)
{
	struct dg_err err = { 0 };
	struct ps_store *s = ps_store_open(&(struct ps_store_config){ 0 }, &err);

	cr_assert_not_null(s, "open: %s", err.msg);
	return s;
}

static struct dg_tensor *vec(enum dg_dtype dt, int n, const double *vals)
{
	struct dg_shape sh = dg_shape_make(1, (int64_t[]){ n });
	struct dg_tensor *t = dg_tensor_new(dt, &sh, NULL);

	cr_assert_not_null(t);
	for (int i = 0; i < n; i++)
		dg_tensor_set_f64(t, i, vals[i]);
	return t;
}

static struct dg_tensor *fill(enum dg_dtype dt, int n, double v)
{
	double vals[64];

	for (int i = 0; i < n; i++)
		vals[i] = v;
	return vec(dt, n, vals);
}

static void put(struct ps_store *s, const char *name, struct dg_tensor *t)
{
	struct dg_err err = { 0 };

	cr_assert_eq(ps_store_put(s, name, t, NULL, NULL, NULL, &err), DG_OK, "%s", err.msg);
}

static double at(struct ps_store *s, const char *name, int i)
{
	struct dg_err err = { 0 };
	struct ps_value *v;
	struct dg_tensor t;

	cr_assert_eq(ps_store_get(s, name, &v, &err), DG_OK, "get %s: %s", name, err.msg);
	t = (struct dg_tensor){ .dtype = v->dtype, .data = (void *)v->data };
	double x = dg_tensor_get_f64(&t, i);
	ps_value_release(v);
	return x;
}

static uint64_t version_of(struct ps_store *s, const char *name)
{
	struct dg_err err = { 0 };
	struct ps_value *v;

	cr_assert_eq(ps_store_get(s, name, &v, &err), DG_OK, "%s", err.msg);
	uint64_t ver = v->version;
	ps_value_release(v);
	return ver;
}

static enum dg_status apply(struct ps_store *s, const char *name, const struct ps_apply_args *a,
			    struct dg_tensor *g, struct ps_apply_result *res, struct dg_err *err)
{
	enum dg_status st = ps_store_apply(s, name, a, g, res, err);

	dg_tensor_free(g);
	return st;
}

static struct ps_apply_args args(enum ps_rule r)
{
	return (struct ps_apply_args){ .rule = r, .lr = 0.1, .momentum = 0.9, .beta1 = 0.9,
				       .beta2 = 0.999, .eps = r == PS_RMSPROP ? 1e-10 : 1e-8,
				       .rho = 0.9, .init = r == PS_ADAGRAD ? 0.1 : 1.0,
				       .step = -1, .replica = -1 };
}

static void assert_err(enum dg_status st, enum dg_status want, const struct dg_err *err,
		       const char *text)
{
	cr_assert_eq(st, want, "status %s (%s), wanted %s", dg_status_name(st), err->msg,
		     dg_status_name(want));
	cr_assert_not_null(strstr(err->msg, text), "message '%s' lacks '%s'", err->msg, text);
}

/* Gradient of step k (k = 0, 1, ...) for element i: signs and sizes vary. */
static double grad(int k, int i)
{
	return (i % 2 ? -1.0 : 1.0) * (0.5 + 0.25 * i) * (1.0 + 0.3 * k) + (k == 2 ? 0.7 : 0.0);
}

static const double w0[N] = { 1.0, -2.0, 0.5, 3.0, 0.0 };

/* Run `steps` applies of rule a on a fresh variable of dt and compare with
 * the reference ref(k, i, state) computed here in double. */
struct refstate {
	double w[N], m[N], v[N];
	int64_t t;
};

static void ref_step(const struct ps_apply_args *a, int k, struct refstate *r)
{
	r->t++;
	for (int i = 0; i < N; i++) {
		double g = grad(k, i);
		switch (a->rule) {
		case PS_SGD: r->w[i] -= a->lr * g; break;
		case PS_MOMENTUM:
			r->m[i] = a->momentum * r->m[i] + g;
			r->w[i] -= a->lr * (a->nesterov ? g + a->momentum * r->m[i] : r->m[i]);
			break;
		case PS_ADAM: {
			double lr_t = a->lr * sqrt(1 - pow(a->beta2, (double)r->t)) /
				      (1 - pow(a->beta1, (double)r->t));
			r->m[i] = a->beta1 * r->m[i] + (1 - a->beta1) * g;
			r->v[i] = a->beta2 * r->v[i] + (1 - a->beta2) * g * g;
			r->w[i] -= lr_t * r->m[i] / (sqrt(r->v[i]) + a->eps);
			break;
		}
		case PS_ADAGRAD:
			if (r->t == 1)
				r->m[i] = a->init;
			r->m[i] += g * g;
			r->w[i] -= a->lr * g / sqrt(r->m[i]);
			break;
		case PS_RMSPROP:
			if (r->t == 1)
				r->m[i] = a->init;
			r->m[i] = a->rho * r->m[i] + (1 - a->rho) * g * g;
			r->v[i] = a->momentum * r->v[i] + a->lr * g / sqrt(r->m[i] + a->eps);
			r->w[i] -= r->v[i];
			break;
		case PS_MOVING_AVERAGE: r->w[i] = a->rho * r->w[i] + (1 - a->rho) * g; break;
		case PS_ASSIGN_ADD: r->w[i] += g; break;
		case PS_ASSIGN: r->w[i] = g; break;
		}
	}
}

static void check_against_reference(enum dg_dtype dt, const struct ps_apply_args *a, int steps)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct refstate r = { 0 };
	double tol = dt == DG_F32 ? 2e-5 : 1e-12;

	memcpy(r.w, w0, sizeof w0);
	put(s, "w", vec(dt, N, w0));
	for (int k = 0; k < steps; k++) {
		double g[N];
		for (int i = 0; i < N; i++)
			g[i] = grad(k, i);
		struct ps_apply_result res;
		cr_assert_eq(apply(s, "w", a, vec(dt, N, g), &res, &err), DG_OK, "%s", err.msg);
		cr_assert(res.applied);
		cr_assert_eq(res.version, version_of(s, "w"));
		ref_step(a, k, &r);
		for (int i = 0; i < N; i++) {
			double got = at(s, "w", i);
			cr_assert_float_eq(got, r.w[i], tol, "%s %s step %d w[%d]: %.9g vs %.9g",
					   dg_dtype_name(dt), a->nesterov ? "nesterov" : "", k, i,
					   got, r.w[i]);
			if (a->rule == PS_MOMENTUM)
				cr_assert_float_eq(at(s, "w.momentum", i), r.m[i], tol);
			if (a->rule == PS_ADAM) {
				cr_assert_float_eq(at(s, "w.adam_m", i), r.m[i], tol);
				cr_assert_float_eq(at(s, "w.adam_v", i), r.v[i], tol);
			}
			if (a->rule == PS_ADAGRAD)
				cr_assert_float_eq(at(s, "w.accum", i), r.m[i], tol);
			if (a->rule == PS_RMSPROP) {
				cr_assert_float_eq(at(s, "w.rms", i), r.m[i], tol);
				cr_assert_float_eq(at(s, "w.rms_momentum", i), r.v[i], tol);
			}
		}
		if (a->rule == PS_ADAM)
			cr_assert_eq(at(s, "w.adam_t", 0), (double)(k + 1));
	}
	ps_store_close(s);
}

/* --- each rule: hand-computed values, then a reference over several steps ------------------- */

Test(apply, sgd_subtracts_lr_times_the_gradient)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_SGD);

	put(s, "w", fill(DG_F32, 3, 1.0));
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 3, 0.5), NULL, &err), DG_OK);
	cr_assert_float_eq(at(s, "w", 2), 0.95, 1e-7);
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 3, 0.5), NULL, &err), DG_OK);
	cr_assert_float_eq(at(s, "w", 0), 0.90, 1e-7);
	ps_store_close(s);
	check_against_reference(DG_F32, &a, 4);
	check_against_reference(DG_F64, &a, 4);
}

Test(apply, momentum_accumulates_velocity_by_hand)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_MOMENTUM);

	put(s, "w", fill(DG_F64, 2, 1.0));
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 1.0), NULL, &err), DG_OK);
	cr_assert_float_eq(at(s, "w", 0), 0.9, 1e-15);          /* m = 1 */
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 1.0), NULL, &err), DG_OK);
	cr_assert_float_eq(at(s, "w.momentum", 1), 1.9, 1e-15);  /* m = 0.9 + 1 */
	cr_assert_float_eq(at(s, "w", 1), 0.71, 1e-15);          /* 0.9 - 0.1*1.9 */
	ps_store_close(s);
}

Test(apply, momentum_matches_the_reference_for_float32_and_float64)
{
	struct ps_apply_args a = args(PS_MOMENTUM);

	check_against_reference(DG_F32, &a, 5);
	check_against_reference(DG_F64, &a, 5);
}

Test(apply, nesterov_momentum_looks_ahead_by_hand_and_against_the_reference)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_MOMENTUM);

	a.nesterov = true;
	put(s, "w", fill(DG_F64, 2, 1.0));
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 1.0), NULL, &err), DG_OK);
	cr_assert_float_eq(at(s, "w", 0), 0.81, 1e-15);    /* 1 - 0.1*(1 + 0.9*1) */
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 1.0), NULL, &err), DG_OK);
	cr_assert_float_eq(at(s, "w", 0), 0.539, 1e-15);   /* 0.81 - 0.1*(1 + 0.9*1.9) */
	ps_store_close(s);
	check_against_reference(DG_F32, &a, 5);
	check_against_reference(DG_F64, &a, 5);
}

Test(apply, adam_with_a_constant_gradient_moves_lr_per_step_thanks_to_bias_correction)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_ADAM);

	/* with bias correction m_hat/sqrt(v_hat) = 1 for a constant gradient,
	 * so each step moves w by lr (less a hair for eps) */
	put(s, "w", fill(DG_F64, 2, 1.0));
	for (int k = 1; k <= 3; k++) {
		cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 1.0), NULL, &err), DG_OK);
		cr_assert_float_eq(at(s, "w", 1), 1.0 - 0.1 * k, 1e-6, "step %d", k);
		cr_assert_eq(at(s, "w.adam_t", 0), (double)k);
	}
	cr_assert_float_eq(at(s, "w.adam_m", 0), 1 - 0.9 * 0.9 * 0.9, 1e-15);
	cr_assert_float_eq(at(s, "w.adam_v", 0), 1 - 0.999 * 0.999 * 0.999, 1e-15);
	ps_store_close(s);
}

Test(apply, adam_matches_the_reference_for_float32_and_float64)
{
	struct ps_apply_args a = args(PS_ADAM);

	check_against_reference(DG_F32, &a, 6);
	check_against_reference(DG_F64, &a, 6);
	a.beta1 = 0.5;
	a.beta2 = 0.0;
	a.lr = 0.01;
	check_against_reference(DG_F64, &a, 4);
}

Test(apply, assign_and_assign_add_work_on_every_numeric_dtype)
{
	const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8 };
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args as = args(PS_ASSIGN), add = args(PS_ASSIGN_ADD);

	for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
		double start[3] = { 1, 2, 3 }, delta[3] = { 10, 20, 30 }, set[3] = { 7, 8, 9 };
		put(s, "x", vec(dts[d], 3, start));
		cr_assert_eq(apply(s, "x", &add, vec(dts[d], 3, delta), NULL, &err), DG_OK,
			     "%s: %s", dg_dtype_name(dts[d]), err.msg);
		for (int i = 0; i < 3; i++)
			cr_assert_eq(at(s, "x", i), start[i] + delta[i], "%s",
				     dg_dtype_name(dts[d]));
		cr_assert_eq(apply(s, "x", &as, vec(dts[d], 3, set), NULL, &err), DG_OK);
		for (int i = 0; i < 3; i++)
			cr_assert_eq(at(s, "x", i), set[i]);
		cr_assert_eq(ps_store_delete(s, "x", 0, &err), DG_OK);
	}
	ps_store_close(s);
}

Test(apply, integer_assign_add_wraps_around_like_tensorflow)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args add = args(PS_ASSIGN_ADD);
	struct dg_tensor *t = fill(DG_I32, 2, 0), *u = fill(DG_U8, 2, 250);

	((int32_t *)t->data)[0] = INT32_MAX;
	((int32_t *)t->data)[1] = INT32_MIN;
	put(s, "i", t);
	struct dg_tensor *g = fill(DG_I32, 2, 0);
	((int32_t *)g->data)[0] = 1;
	((int32_t *)g->data)[1] = -1;
	cr_assert_eq(apply(s, "i", &add, g, NULL, &err), DG_OK);
	cr_assert_eq(at(s, "i", 0), (double)INT32_MIN);
	cr_assert_eq(at(s, "i", 1), (double)INT32_MAX);
	put(s, "u", u);
	cr_assert_eq(apply(s, "u", &add, fill(DG_U8, 2, 10), NULL, &err), DG_OK);
	cr_assert_eq(at(s, "u", 0), 4.0);   /* 260 mod 256 */
	ps_store_close(s);
}

Test(apply, bool_takes_assign_only_and_the_optimizers_take_floats_only)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args as = args(PS_ASSIGN), add = args(PS_ASSIGN_ADD), sgd = args(PS_SGD);
	double ones[2] = { 1, 0 };

	put(s, "b", fill(DG_BOOL, 2, 0));
	cr_assert_eq(apply(s, "b", &as, vec(DG_BOOL, 2, ones), NULL, &err), DG_OK);
	cr_assert_eq(at(s, "b", 0), 1.0);
	assert_err(apply(s, "b", &add, vec(DG_BOOL, 2, ones), NULL, &err), DG_EDTYPE, &err, "bool");
	put(s, "i", fill(DG_I64, 2, 5));
	assert_err(apply(s, "i", &sgd, fill(DG_I64, 2, 1), NULL, &err), DG_EDTYPE, &err, "int64");
	cr_assert_not_null(strstr(err.hint, "float32"), "%s", err.hint);
	cr_assert_eq(at(s, "i", 1), 5.0);
	struct ps_apply_args mom = args(PS_MOMENTUM);
	assert_err(apply(s, "i", &mom, fill(DG_I64, 2, 1), NULL, &err), DG_EDTYPE, &err,
		   "momentum");
	/* a refused rule leaves no slots behind */
	struct ps_value *v;
	cr_assert_eq(ps_store_get(s, "i.momentum", &v, &err), DG_ENOTFOUND);
	struct ps_apply_args adam = args(PS_ADAM);
	put(s, "f", fill(DG_F32, 2, 1));
	cr_assert_eq(apply(s, "f", &adam, fill(DG_F32, 3, 1), NULL, &err), DG_ESHAPE);
	int64_t n_vars;
	ps_store_stats(s, &n_vars, NULL);
	cr_assert_eq(n_vars, 3);   /* b, i, f */
	ps_store_close(s);
}

Test(apply, slots_are_created_with_zeros_and_are_listed)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args adam = args(PS_ADAM);
	struct dg_var_info *info;
	int n;

	put(s, "m/w", fill(DG_F32, 4, 1));
	adam.lr = 0;   /* leave w alone: the slots show the first step only */
	cr_assert_eq(apply(s, "m/w", &adam, fill(DG_F32, 4, 2.0), NULL, &err), DG_OK);
	cr_assert_eq(ps_store_list(s, "m/", &info, &n, &err), DG_OK);
	cr_assert_eq(n, 4);
	cr_assert_str_eq(info[0].name, "m/w");
	cr_assert_str_eq(info[1].name, "m/w.adam_m");
	cr_assert_str_eq(info[2].name, "m/w.adam_t");
	cr_assert_str_eq(info[3].name, "m/w.adam_v");
	cr_assert_eq(info[1].dtype, DG_F32);
	cr_assert_eq(info[1].shape.dim[0], 4);
	cr_assert_eq(info[2].dtype, DG_I64);
	cr_assert_eq(info[2].shape.ndim, 0);
	free(info);
	/* zeros at first use, then one step: m = 0.1*g, v = 0.001*g^2 */
	cr_assert_float_eq(at(s, "m/w.adam_m", 3), 0.2, 1e-7);
	/* float32 rounding of 1 - 0.999 alone is 1.3e-8 relative */
	cr_assert_float_eq(at(s, "m/w.adam_v", 0), 0.004, 1e-7);
	cr_assert_float_eq(at(s, "m/w", 0), 1.0, 0);
	ps_store_close(s);
}

Test(apply, slots_that_no_longer_fit_a_replaced_variable_restart_from_zero)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args mom = args(PS_MOMENTUM);
	struct ps_put_opts rep = { .replace = true };

	put(s, "w", fill(DG_F32, 4, 1));
	cr_assert_eq(apply(s, "w", &mom, fill(DG_F32, 4, 1), NULL, &err), DG_OK);
	cr_assert_eq(ps_store_put(s, "w", fill(DG_F32, 2, 1), &rep, NULL, NULL, &err), DG_OK);
	cr_assert_eq(apply(s, "w", &mom, fill(DG_F32, 2, 1), NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(at(s, "w.momentum", 1), 1.0, 0);   /* not 0.9*1 + 1 */
	cr_assert_float_eq(at(s, "w", 1), 0.9, 1e-7);
	ps_store_close(s);
}

Test(apply, bad_hyper_parameters_are_refused_naming_the_parameter)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	const struct {
		enum ps_rule rule;
		const char *param;
		double lr, momentum, beta1, beta2, eps;
	} bad[] = {
		{ PS_SGD, "lr", -0.1, 0, 0, 0, 0 },
		{ PS_SGD, "lr", NAN, 0, 0, 0, 0 },
		{ PS_SGD, "lr", INFINITY, 0, 0, 0, 0 },
		{ PS_MOMENTUM, "momentum", 0.1, -0.5, 0, 0, 0 },
		{ PS_ADAM, "beta1", 0.1, 0, 1.0, 0.999, 1e-8 },
		{ PS_ADAM, "beta2", 0.1, 0, 0.9, -0.1, 1e-8 },
		{ PS_ADAM, "eps", 0.1, 0, 0.9, 0.999, 0 },
	};

	put(s, "w", fill(DG_F32, 2, 1));
	uint64_t ver = version_of(s, "w");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ps_apply_args a = args(bad[i].rule);
		a.lr = bad[i].lr;
		a.momentum = bad[i].momentum;
		a.beta1 = bad[i].beta1;
		a.beta2 = bad[i].beta2;
		a.eps = bad[i].eps;
		assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), NULL, &err), DG_EINVAL, &err,
			   bad[i].param);
		cr_assert_not_null(strstr(err.msg, "'w'"), "%s", err.msg);
	}
	cr_assert_eq(version_of(s, "w"), ver);
	cr_assert_float_eq(at(s, "w", 0), 1.0, 0);
	ps_store_close(s);
}

Test(apply, a_gradient_of_another_dtype_or_shape_is_refused_naming_both)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_SGD);

	put(s, "w", fill(DG_F32, 3, 1));
	assert_err(apply(s, "w", &a, fill(DG_F64, 3, 1), NULL, &err), DG_EDTYPE, &err, "float64");
	cr_assert_not_null(strstr(err.msg, "float32"), "%s", err.msg);
	assert_err(apply(s, "w", &a, fill(DG_F32, 4, 1), NULL, &err), DG_ESHAPE, &err, "[4]");
	cr_assert_not_null(strstr(err.msg, "[3]"), "%s", err.msg);
	assert_err(apply(s, "nope", &a, fill(DG_F32, 3, 1), NULL, &err), DG_ENOTFOUND, &err,
		   "'nope'");
	cr_assert_float_eq(at(s, "w", 0), 1.0, 0);
	ps_store_close(s);
}

Test(apply, rule_names_parse_and_unknown_ones_list_the_rules)
{
	struct dg_err err = { 0 };
	enum ps_rule r;

	cr_assert_eq(ps_rule_parse("sgd", &r, &err), DG_OK);
	cr_assert_eq(r, PS_SGD);
	cr_assert_eq(ps_rule_parse("assign_add", &r, &err), DG_OK);
	cr_assert_eq(r, PS_ASSIGN_ADD);
	cr_assert_eq(ps_rule_parse("adam", &r, &err), DG_OK);
	cr_assert_eq(r, PS_ADAM);
	cr_assert_eq(ps_rule_parse("adagrad", &r, &err), DG_OK);
	cr_assert_eq(r, PS_ADAGRAD);
	cr_assert_eq(ps_rule_parse("rmsprop", &r, &err), DG_OK);
	cr_assert_eq(r, PS_RMSPROP);
	assert_err(ps_rule_parse("adadelta", &r, &err), DG_EINVAL, &err, "adadelta");
	cr_assert_not_null(strstr(err.hint, "rmsprop"));
}

/* --- synchronous mode ------------------------------------------------------------------------ */

static struct ps_apply_args sync_args(enum ps_rule r, int64_t step, int replicas, int backup,
				      int64_t replica)
{
	struct ps_apply_args a = args(r);

	a.lr = 1.0;
	a.step = step;
	a.replicas = replicas;
	a.backup = backup;
	a.replica = replica;
	return a;
}

Test(apply, three_replicas_are_averaged_and_applied_once)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;

	put(s, "w", fill(DG_F32, 4, 10));
	uint64_t v0 = version_of(s, "w");
	for (int r = 0; r < 2; r++) {
		struct ps_apply_args a = sync_args(PS_SGD, 0, 3, 0, r);
		cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 4, r + 1), &res, &err), DG_OK);
		cr_assert_not(res.applied);
		cr_assert_eq(res.pending, r + 1);
		cr_assert_eq(res.step, 0);
		cr_assert_eq(version_of(s, "w"), v0, "no version bump before the step completes");
		cr_assert_float_eq(at(s, "w", 0), 10.0, 0);
	}
	struct ps_apply_args a = sync_args(PS_SGD, 0, 3, 0, 2);
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 4, 3), &res, &err), DG_OK);
	cr_assert(res.applied);
	cr_assert_eq(res.step, 1);
	cr_assert_gt(res.version, v0);
	cr_assert_eq(res.version, version_of(s, "w"));
	cr_assert_float_eq(at(s, "w", 3), 10.0 - 2.0, 1e-6);   /* mean of 1, 2, 3 */
	/* the next step starts from an empty accumulator */
	for (int r = 0; r < 3; r++) {
		a = sync_args(PS_SGD, 1, 3, 0, r);
		cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 4, 6), &res, &err), DG_OK, "%s",
			     err.msg);
	}
	cr_assert(res.applied);
	cr_assert_eq(res.step, 2);
	cr_assert_float_eq(at(s, "w", 0), 8.0 - 6.0, 1e-6);
	ps_store_close(s);
}

Test(apply, backup_workers_apply_after_n_minus_k_and_the_straggler_is_stale)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;
	struct ps_apply_args a;

	put(s, "w", fill(DG_F64, 2, 0));
	a = sync_args(PS_SGD, 0, 3, 1, 0);
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 1), &res, &err), DG_OK);
	cr_assert_not(res.applied);
	a = sync_args(PS_SGD, 0, 3, 1, 2);
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 2, 4), &res, &err), DG_OK);
	cr_assert(res.applied);
	cr_assert_eq(res.step, 1);
	cr_assert_float_eq(at(s, "w", 0), -2.5, 1e-15);
	uint64_t ver = version_of(s, "w");
	a = sync_args(PS_SGD, 0, 3, 1, 1);
	assert_err(apply(s, "w", &a, fill(DG_F64, 2, 100), &res, &err), DG_ESTALE, &err,
		   "gradient for step 0 of 'w' is stale: the variable is at step 1; dropped");
	cr_assert_float_eq(at(s, "w", 0), -2.5, 1e-15);
	cr_assert_eq(version_of(s, "w"), ver);
	ps_store_close(s);
}

Test(apply, a_replica_reporting_twice_for_a_step_is_stale)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;
	struct ps_apply_args a = sync_args(PS_SGD, 0, 2, 0, 1);

	put(s, "w", fill(DG_F32, 2, 0));
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 2, 1), &res, &err), DG_OK);
	assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), &res, &err), DG_ESTALE, &err,
		   "replica 1 already");
	a.replica = 0;
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 2, 3), &res, &err), DG_OK);
	cr_assert(res.applied);
	cr_assert_float_eq(at(s, "w", 1), -2.0, 1e-6);
	ps_store_close(s);
}

Test(apply, a_step_ahead_of_the_variable_is_stale_naming_both_steps)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;
	struct ps_apply_args a = sync_args(PS_SGD, 3, 2, 0, 0);

	put(s, "w", fill(DG_F32, 2, 0));
	assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), &res, &err), DG_ESTALE, &err, "step 3");
	cr_assert_not_null(strstr(err.msg, "step 0"), "%s", err.msg);
	cr_assert_eq(res.step, 0);
	ps_store_close(s);
}

Test(apply, replicas_and_backup_must_agree_within_a_step_and_be_valid)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = sync_args(PS_SGD, 0, 3, 0, 0);

	put(s, "w", fill(DG_F32, 2, 0));
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 2, 1), NULL, &err), DG_OK);
	a = sync_args(PS_SGD, 0, 4, 0, 1);
	assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), NULL, &err), DG_EINVAL, &err,
		   "replicas=3");
	a = sync_args(PS_SGD, 0, 0, 0, 1);
	assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), NULL, &err), DG_EINVAL, &err,
		   "replicas=0");
	a = sync_args(PS_SGD, 0, 3, 3, 1);
	assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), NULL, &err), DG_EINVAL, &err, "backup=3");
	a = sync_args(PS_SGD, 0, 3, 0, -7);
	assert_err(apply(s, "w", &a, fill(DG_F32, 2, 1), NULL, &err), DG_EINVAL, &err,
		   "replica=-7");
	ps_store_close(s);
}

Test(apply, anonymous_replicas_count_arrivals)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;
	struct ps_apply_args a = sync_args(PS_ASSIGN_ADD, 0, 2, 0, -1);

	put(s, "w", fill(DG_F64, 1, 0));
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 1, 1), &res, &err), DG_OK);
	cr_assert_eq(apply(s, "w", &a, fill(DG_F64, 1, 2), &res, &err), DG_OK);
	cr_assert(res.applied);
	cr_assert_float_eq(at(s, "w", 0), 1.5, 0);
	ps_store_close(s);
}

Test(apply, a_sync_integer_counter_advances_once_per_step)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;

	put(s, "global_step", fill(DG_I64, 1, 0));
	for (int step = 0; step < 4; step++) {
		for (int r = 0; r < 3; r++) {
			struct ps_apply_args a = sync_args(PS_ASSIGN_ADD, step, 3, 0, r);
			cr_assert_eq(apply(s, "global_step", &a, fill(DG_I64, 1, 1), &res, &err),
				     DG_OK, "%s", err.msg);
		}
		cr_assert(res.applied);
	}
	cr_assert_eq(at(s, "global_step", 0), 4.0);
	/* integer means truncate toward zero: (1 + 2) / 2 = 1 */
	struct ps_apply_args a = sync_args(PS_ASSIGN, 0, 2, 0, 0);
	put(s, "k", fill(DG_I32, 1, 0));
	cr_assert_eq(apply(s, "k", &a, fill(DG_I32, 1, 1), &res, &err), DG_OK);
	a.replica = 1;
	cr_assert_eq(apply(s, "k", &a, fill(DG_I32, 1, 2), &res, &err), DG_OK);
	cr_assert_eq(at(s, "k", 0), 1.0);
	ps_store_close(s);
}

Test(apply, sync_momentum_applies_the_mean_with_its_slot)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;

	put(s, "w", fill(DG_F32, 3, 1));
	for (int r = 0; r < 2; r++) {
		struct ps_apply_args a = sync_args(PS_MOMENTUM, 0, 2, 0, r);
		a.lr = 0.1;
		cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 3, r ? 3 : 1), &res, &err), DG_OK);
	}
	cr_assert(res.applied);
	cr_assert_float_eq(at(s, "w.momentum", 0), 2.0, 1e-6);
	cr_assert_float_eq(at(s, "w", 0), 0.8, 1e-6);
	ps_store_close(s);
}

/* --- concurrency ------------------------------------------------------------------------------ */

struct adder {
	struct ps_store *s;
	int fails;
};

static void *adder_main(void *arg)
{
	struct adder *ad = arg;
	struct dg_err err = { 0 };
	struct ps_apply_args add = args(PS_ASSIGN_ADD), mom = args(PS_MOMENTUM);

	mom.momentum = 1.0;
	mom.lr = 0;
	for (int i = 0; i < 500; i++) {
		struct dg_tensor *g = fill(DG_F64, 8, 1.0);
		ad->fails += ps_store_apply(ad->s, "sum", &add, g, NULL, &err) != DG_OK;
		/* momentum 1, lr 0: the slot counts the applies */
		ad->fails += ps_store_apply(ad->s, "sum2", &mom, g, NULL, &err) != DG_OK;
		dg_tensor_free(g);
	}
	return NULL;
}

Test(apply, concurrent_applies_from_eight_threads_are_each_applied_once)
{
	struct ps_store *s = open_mem();
	struct adder ad[8];
	pthread_t th[8];

	put(s, "sum", fill(DG_F64, 8, 0));
	put(s, "sum2", fill(DG_F64, 8, 0));
	for (int i = 0; i < 8; i++) {
		ad[i] = (struct adder){ .s = s };
		pthread_create(&th[i], NULL, adder_main, &ad[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(ad[i].fails, 0);
	}
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(at(s, "sum", i), 4000.0);
		cr_assert_eq(at(s, "sum2.momentum", i), 4000.0);
	}
	ps_store_close(s);
}

/* --- float16 and bfloat16 variables ---------------------------------------------- */

/* assign_add and sgd compute in float32 and round once to the variable's
 * dtype: 1 + 2^-11 is a float16 tie (stays 1), 1 + 2^-10 is not. */
Test(apply, half_variables_take_assign_add_and_sgd_in_float32_math)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_ASSIGN_ADD);

	put(s, "h", vec(DG_F16, 3, (double[]){ 1, 1, 65504 }));
	cr_assert_eq(apply(s, "h", &a, vec(DG_F16, 3, (double[]){ 0x1p-11, 0x1p-10, 16 }), NULL,
			   &err), DG_OK, "%s", err.msg);
	cr_assert_eq(at(s, "h", 0), 1.0);
	cr_assert_eq(at(s, "h", 1), 1 + 0x1p-10);
	cr_assert(isinf(at(s, "h", 2)), "65504 + 16 rounds to inf");
	a = args(PS_SGD);   /* lr 0.1 */
	put(s, "b", vec(DG_BF16, 2, (double[]){ 1, -2 }));
	cr_assert_eq(apply(s, "b", &a, vec(DG_BF16, 2, (double[]){ 5, -10 }), NULL, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(at(s, "b", 0), 0.5);
	cr_assert_eq(at(s, "b", 1), -1.0);
	a = args(PS_ASSIGN);
	cr_assert_eq(apply(s, "b", &a, vec(DG_BF16, 2, (double[]){ 3, 4 }), NULL, &err), DG_OK);
	cr_assert_eq(at(s, "b", 1), 4.0);
	ps_store_close(s);
}

Test(apply, half_variables_refuse_momentum_and_adam_with_a_hint)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	enum ps_rule rules[] = { PS_MOMENTUM, PS_ADAM };

	put(s, "h", vec(DG_F16, 2, (double[]){ 1, 2 }));
	for (int k = 0; k < 2; k++) {
		struct ps_apply_args a = args(rules[k]);
		assert_err(apply(s, "h", &a, vec(DG_F16, 2, (double[]){ 1, 1 }), NULL, &err),
			   DG_EDTYPE, &err, "cannot update 'h': it is float16");
		cr_assert_not_null(strstr(err.hint, "float32 master copy"), "%s", err.hint);
	}
	cr_assert_eq(at(s, "h", 1), 2.0, "nothing changed");
	ps_store_close(s);
}

/* Sync sgd over float16 replicas: the mean of 1, 2 and 4 (7/3) is formed in
 * double and rounded once to 2.333984375 (1195 * 2^-9); 10 minus that is
 * 7.666015625, a float16 tie between 1962 and 1963 * 2^-8: even, 7.6640625. */
Test(apply, sync_sgd_averages_half_gradients_in_double)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_result res;
	const double g[3] = { 1, 2, 4 };

	put(s, "w", fill(DG_F16, 4, 10));
	for (int r = 0; r < 3; r++) {
		struct ps_apply_args a = sync_args(PS_SGD, 0, 3, 0, r);
		cr_assert_eq(apply(s, "w", &a, fill(DG_F16, 4, g[r]), &res, &err), DG_OK, "%s",
			     err.msg);
	}
	cr_assert(res.applied);
	cr_assert_eq(at(s, "w", 3), 7.6640625, "got %.9g", at(s, "w", 3));
	ps_store_close(s);
}

/* --- adagrad and rmsprop ------------------------------------------------------------------- */

Test(apply, adagrad_starts_its_accumulator_at_init_by_hand_and_against_the_reference)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_ADAGRAD);

	put(s, "w", fill(DG_F32, 3, 1.0));
	/* acc = 0.1 + 0.3^2 = 0.19; w = 1 - 0.1 * 0.3 / sqrt(0.19) */
	cr_assert_eq(apply(s, "w", &a, fill(DG_F32, 3, 0.3), NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(at(s, "w.accum", 1), 0.19, 1e-7);
	cr_assert_float_eq(at(s, "w", 1), 1 - 0.03 / sqrt(0.19), 1e-6);
	ps_store_close(s);
	check_against_reference(DG_F32, &a, 5);
	check_against_reference(DG_F64, &a, 5);
}

Test(apply, rmsprop_keeps_mean_square_and_momentum_against_the_reference)
{
	struct ps_apply_args a = args(PS_RMSPROP);

	check_against_reference(DG_F32, &a, 5);
	check_against_reference(DG_F64, &a, 5);
	a.momentum = 0;
	check_against_reference(DG_F64, &a, 3);
}

Test(apply, moving_average_moves_decay_of_the_way_to_the_value)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_MOVING_AVERAGE);

	a.rho = 0.75;
	put(s, "m", fill(DG_F32, 3, 4.0));
	/* 0.75 * 4 + 0.25 * 8 = 5, then 0.75 * 5 + 0.25 * 8 = 5.75 */
	cr_assert_eq(apply(s, "m", &a, fill(DG_F32, 3, 8), NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(at(s, "m", 2), 5.0, 1e-6);
	cr_assert_eq(apply(s, "m", &a, fill(DG_F32, 3, 8), NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(at(s, "m", 0), 5.75, 1e-6);
	a.rho = 1.5;
	assert_err(apply(s, "m", &a, fill(DG_F32, 3, 8), NULL, &err), DG_EINVAL, &err,
		   "decay=1.5");
	ps_store_close(s);
	a.rho = 0.9;
	check_against_reference(DG_F32, &a, 4);
	check_against_reference(DG_F64, &a, 4);
}

Test(apply, adagrad_and_rmsprop_refuse_bad_parameters_naming_them)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_ADAGRAD);

	put(s, "w", fill(DG_F32, 3, 1.0));
	a.init = 0;
	assert_err(apply(s, "w", &a, fill(DG_F32, 3, 1), NULL, &err), DG_EINVAL, &err, "init=0");
	a = args(PS_RMSPROP);
	a.rho = 1;
	assert_err(apply(s, "w", &a, fill(DG_F32, 3, 1), NULL, &err), DG_EINVAL, &err, "rho=1");
	a = args(PS_RMSPROP);
	a.eps = 0;
	assert_err(apply(s, "w", &a, fill(DG_F32, 3, 1), NULL, &err), DG_EINVAL, &err, "eps=0");
	a = args(PS_ADAGRAD);
	put(s, "i", vec(DG_I32, 2, (double[]){ 1, 2 }));
	assert_err(apply(s, "i", &a, vec(DG_I32, 2, (double[]){ 1, 2 }), NULL, &err), DG_EDTYPE,
		   &err, "adagrad");
	cr_assert_eq(ps_store_get(s, "w.accum", &(struct ps_value *){ 0 }, &err), DG_ENOTFOUND,
		     "a refused apply leaves no slot");
	ps_store_close(s);
}

/* --- row-wise ------------------------------------------------------------------------------- */

/* A [rows, cols] float tensor with element (r, c) = base + 10 r + c. */
static struct dg_tensor *table(enum dg_dtype dt, int rows, int cols, double base)
{
	struct dg_shape sh = dg_shape_make(2, (int64_t[]){ rows, cols });
	struct dg_tensor *t = dg_tensor_new(dt, &sh, NULL);

	cr_assert_not_null(t);
	for (int r = 0; r < rows; r++)
		for (int c = 0; c < cols; c++)
			dg_tensor_set_f64(t, r * cols + c, base + 10 * r + c);
	return t;
}

/* A [n, 1] tensor of vals. */
static struct dg_tensor *vec2(enum dg_dtype dt, int n, const double *vals)
{
	struct dg_tensor *t = vec(dt, n, vals);

	t->shape = dg_shape_make(2, (int64_t[]){ n, 1 });
	return t;
}

/* The rule applied to rows (in any order, repeats summed) of an [R, C]
 * variable gives, on the rows it touches, what the dense rule gives on a
 * variable of those rows alone with the summed gradient; the other rows of
 * the variable and of its slots do not move (TensorFlow's sparse applies). */
static void rows_match_dense(enum ps_rule rule, enum dg_dtype dt)
{
	enum { R = 6, C = 3, NR = 4 };
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	const int64_t rows[NR] = { 4, 1, 4, 2 }, touched[3] = { 1, 2, 4 };
	struct ps_apply_args a = args(rule), d = args(rule);
	const char *const *suffix;
	double tol = dt == DG_F32 ? 1e-5 : 1e-12;
	struct dg_tensor *part = table(dt, 3, C, 0);

	put(s, "sparse", table(dt, R, C, 0.5));
	for (int i = 0; i < 3; i++)
		for (int c = 0; c < C; c++)
			dg_tensor_set_f64(part, i * C + c, 0.5 + 10 * (double)touched[i] + c);
	put(s, "part", part);
	a.rows = rows;
	a.n_rows = NR;
	for (int k = 0; k < 3; k++) {
		struct dg_tensor *g = table(dt, NR, C, 0.25 * (k + 1) - 3);
		struct dg_tensor *sum = table(dt, 3, C, 0);
		for (int i = 0; i < 3 * C; i++)
			dg_tensor_set_f64(sum, i, 0);
		for (int i = 0; i < NR; i++) {
			int j = rows[i] == 1 ? 0 : rows[i] == 2 ? 1 : 2;
			for (int c = 0; c < C; c++)
				dg_tensor_set_f64(sum, j * C + c, dg_tensor_get_f64(sum, j * C + c) +
						  dg_tensor_get_f64(g, i * C + c));
		}
		cr_assert_eq(apply(s, "sparse", &a, g, NULL, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(apply(s, "part", &d, sum, NULL, &err), DG_OK, "%s", err.msg);
	}
	for (int r = 0; r < R; r++) {
		int j = r == 1 ? 0 : r == 2 ? 1 : r == 4 ? 2 : -1;
		for (int c = 0; c < C; c++) {
			double x = at(s, "sparse", r * C + c);
			double y = j >= 0 ? at(s, "part", j * C + c) : 0.5 + 10 * r + c;
			cr_assert_float_eq(x, y, tol, "rule %d %s row %d col %d: %.9g vs %.9g",
					   (int)rule, dg_dtype_name(dt), r, c, x, y);
		}
	}
	int n_slots = ps_rule_slots(rule, &suffix);
	for (int k = 0; k < n_slots; k++) {
		char sn[64], pn[64];
		snprintf(sn, sizeof sn, "sparse%s", suffix[k]);
		snprintf(pn, sizeof pn, "part%s", suffix[k]);
		if (rule == PS_ADAM && k == 2) {
			cr_assert_eq(at(s, sn, 0), 3.0, "adam's counter ticks once per apply");
			continue;
		}
		for (int r = 0; r < R; r++) {
			int j = r == 1 ? 0 : r == 2 ? 1 : r == 4 ? 2 : -1;
			for (int c = 0; c < C; c++) {
				double x = at(s, sn, r * C + c);
				double y = j >= 0 ? at(s, pn, j * C + c) : at(s, sn, 0 * C + c);
				cr_assert_float_eq(x, y, tol, "%s row %d col %d: %.9g vs %.9g", sn, r,
						   c, x, y);
			}
		}
	}
	ps_store_close(s);
}

Test(apply, every_rule_row_wise_equals_the_dense_rule_on_the_rows_it_touches)
{
	for (int r = PS_ASSIGN_ADD; r <= PS_MOVING_AVERAGE; r++) {
		rows_match_dense((enum ps_rule)r, DG_F32);
		rows_match_dense((enum ps_rule)r, DG_F64);
	}
}

Test(apply, row_wise_assign_writes_rows_and_refuses_a_row_given_twice)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_ASSIGN);

	put(s, "e", table(DG_I32, 4, 2, 0));
	a.rows = (const int64_t[]){ 3, 0 };
	a.n_rows = 2;
	cr_assert_eq(apply(s, "e", &a, table(DG_I32, 2, 2, 100), NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(at(s, "e", 6), 100);       /* row 3 = row 0 of the update */
	cr_assert_eq(at(s, "e", 7), 101);
	cr_assert_eq(at(s, "e", 0), 110);       /* row 0 = row 1 */
	cr_assert_eq(at(s, "e", 2), 10);        /* row 1 untouched */
	a.rows = (const int64_t[]){ 1, 1 };
	assert_err(apply(s, "e", &a, table(DG_I32, 2, 2, 0), NULL, &err), DG_EINVAL, &err,
		   "row 1 is given twice");
	ps_store_close(s);
}

Test(apply, row_wise_updates_refuse_bad_rows_and_shapes_naming_them)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_SGD);

	put(s, "e", table(DG_F32, 4, 2, 0));
	put(s, "scalar", dg_tensor_scalar(DG_F32, 1.0, NULL));
	a.rows = (const int64_t[]){ 0, 4 };
	a.n_rows = 2;
	assert_err(apply(s, "e", &a, table(DG_F32, 2, 2, 0), NULL, &err), DG_EINVAL, &err,
		   "row 4 is out of range: it has 4 rows");
	a.rows = (const int64_t[]){ 0, -1 };
	assert_err(apply(s, "e", &a, table(DG_F32, 2, 2, 0), NULL, &err), DG_EINVAL, &err,
		   "row -1 (index 1) is negative");
	a.rows = (const int64_t[]){ 0, 1 };
	assert_err(apply(s, "e", &a, table(DG_F32, 2, 3, 0), NULL, &err), DG_ESHAPE, &err,
		   "the rows have shape [2,3], the variable's would be [2,2]");
	assert_err(apply(s, "e", &a, table(DG_F32, 3, 2, 0), NULL, &err), DG_ESHAPE, &err,
		   "2 rows but the update has shape [3,2]");
	assert_err(apply(s, "e", &a, table(DG_F64, 2, 2, 0), NULL, &err), DG_EDTYPE, &err,
		   "the rows are float64, the variable float32");
	a.n_rows = 1;
	assert_err(apply(s, "scalar", &a, table(DG_F32, 1, 1, 0), NULL, &err), DG_ESHAPE, &err,
		   "scalar");
	/* nothing moved */
	for (int i = 0; i < 8; i++)
		cr_assert_eq(at(s, "e", i), 10 * (i / 2) + i % 2);
	ps_store_close(s);
}

Test(apply, zero_rows_is_an_apply_that_changes_nothing_but_the_version)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_SGD);
	struct dg_shape sh = dg_shape_make(2, (int64_t[]){ 0, 2 });
	struct ps_apply_result res;
	uint64_t v0;

	put(s, "e", table(DG_F32, 4, 2, 0));
	v0 = version_of(s, "e");
	a.rows = (const int64_t[]){ 0 };
	a.n_rows = 0;
	cr_assert_eq(apply(s, "e", &a, dg_tensor_new(DG_F32, &sh, NULL), &res, &err), DG_OK, "%s",
		     err.msg);
	cr_assert(res.applied);
	cr_assert_gt(res.version, v0);
	cr_assert_eq(at(s, "e", 3), 11);
	ps_store_close(s);
}

Test(apply, a_held_value_is_not_changed_by_a_row_wise_apply)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_SGD);
	struct ps_value *held;

	put(s, "e", table(DG_F32, 4, 2, 1));
	cr_assert_eq(ps_store_get(s, "e", &held, &err), DG_OK);
	a.rows = (const int64_t[]){ 2 };
	a.n_rows = 1;
	cr_assert_eq(apply(s, "e", &a, table(DG_F32, 1, 2, 10), NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(((const float *)held->data)[4], 21.0f, "the reader's copy kept its bytes");
	cr_assert_float_eq(at(s, "e", 4), 21 - 0.1 * 10, 1e-5);
	cr_assert_float_eq(at(s, "e", 0), 1, 1e-6);
	ps_value_release(held);
	ps_store_close(s);
}

Test(apply, rows_read_back_in_the_order_asked_with_repeats)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct dg_tensor *t;
	uint64_t ver;

	put(s, "e", table(DG_F64, 5, 3, 0));
	cr_assert_eq(ps_store_get_rows(s, "e", (const int64_t[]){ 4, 0, 4 }, 3, &t, &ver, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(t->shape.ndim, 2);
	cr_assert_eq(t->shape.dim[0], 3);
	cr_assert_eq(t->shape.dim[1], 3);
	cr_assert_eq(ver, version_of(s, "e"));
	cr_assert_eq(dg_tensor_get_f64(t, 0), 40);
	cr_assert_eq(dg_tensor_get_f64(t, 5), 2);
	cr_assert_eq(dg_tensor_get_f64(t, 8), 42);
	dg_tensor_free(t);
	assert_err(ps_store_get_rows(s, "e", (const int64_t[]){ 5 }, 1, &t, &ver, &err), DG_EINVAL,
		   &err, "row 5 of 'e' is out of range: it has 5 rows");
	cr_assert_null(t);
	assert_err(ps_store_get_rows(s, "nope", (const int64_t[]){ 0 }, 1, &t, &ver, &err),
		   DG_ENOTFOUND, &err, "nope");
	/* repeats may not make a read larger than PS_MAX_ROWS_BYTES: 300 rows of 4 MiB */
	struct dg_shape big = dg_shape_make(2, (int64_t[]){ 2, 1 << 20 });
	int64_t *rep = calloc(300, sizeof *rep);
	put(s, "big", dg_tensor_new(DG_F32, &big, NULL));
	assert_err(ps_store_get_rows(s, "big", rep, 300, &t, &ver, &err), DG_EINVAL, &err,
		   "300 rows of 'big' would be 1.2 GiB; at most 1 GiB a read");
	cr_assert_null(t);
	free(rep);
	ps_store_close(s);
}

Test(apply, sync_row_wise_applies_the_mean_over_the_union_of_the_rows)
{
	struct ps_store *s = open_mem();
	struct dg_err err = { 0 };
	struct ps_apply_args a = args(PS_SGD);
	struct ps_apply_result res;

	a.lr = 1;
	a.step = 0;
	a.replicas = 2;
	put(s, "e", table(DG_F32, 4, 1, 0));    /* rows 0, 10, 20, 30 */
	a.replica = 0;
	a.rows = (const int64_t[]){ 1, 3, 1 };
	a.n_rows = 3;
	cr_assert_eq(apply(s, "e", &a, vec2(DG_F32, 3, (double[]){ 2, 4, 6 }), &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_not(res.applied);
	a.replica = 1;
	a.rows = (const int64_t[]){ 2, 1 };
	a.n_rows = 2;
	struct dg_tensor *dense = fill(DG_F32, 4, 1);
	assert_err(apply(s, "e", &(struct ps_apply_args){ .rule = PS_SGD, .lr = 1, .step = 0,
							 .replicas = 2, .replica = 1 },
			 table(DG_F32, 4, 1, 0), &res, &err), DG_EINVAL, &err,
		   "collects row-wise gradients; this one is dense");
	dg_tensor_free(dense);
	cr_assert_eq(apply(s, "e", &a, vec2(DG_F32, 2, (double[]){ 8, 10 }), &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert(res.applied);
	/* row 1: (2 + 6 + 10) / 2 = 9; row 2: 8 / 2 = 4; row 3: 4 / 2 = 2 */
	cr_assert_float_eq(at(s, "e", 0), 0, 1e-6);
	cr_assert_float_eq(at(s, "e", 1), 10 - 9, 1e-6);
	cr_assert_float_eq(at(s, "e", 2), 20 - 4, 1e-6);
	cr_assert_float_eq(at(s, "e", 3), 30 - 2, 1e-6);
	ps_store_close(s);
}
