/* Criterion suite for the seeded initialisers of kernels/cpu/random.c: the
 * Philox4x32-10 known-answer vectors of the Random123 distribution, values
 * pinned for known seeds, determinism in (seed, step, index), statistics on
 * 10^6 draws, and refusal of invalid attrs. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dg/graph.h"
#include "dg/kernels.h"

#include "cpu.h"

#define N_STAT 1000000

static enum dg_status draw(const char *op, const char *attrs, uint64_t step,
			   struct dg_tensor **out, struct dg_err *err)
{
	const struct dg_op_def *d = dg_op_find(op);
	json_error_t je;
	json_t *a = json_loads(attrs, 0, &je);
	enum dg_status st;

	cr_assert_not_null(d, "op %s is not registered", op);
	cr_assert_not_null(a, "bad test JSON %s: %s", attrs, je.text);
	st = dg_op_run(d, a, NULL, 0, out, 1, step, err);
	json_decref(a);
	return st;
}

static struct dg_tensor *draw_ok(const char *op, const char *attrs, uint64_t step)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	cr_assert_eq(draw(op, attrs, step, &t, &err), DG_OK, "%s %s: %s", op, attrs, err.msg);
	return t;
}

static void draw_fails(const char *op, const char *attrs, enum dg_status code,
		       const char *needle)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	enum dg_status st = draw(op, attrs, 0, &t, &err);

	cr_assert_eq(st, code, "%s %s: want %d, got %d (%s)", op, attrs, code, st, err.msg);
	cr_assert_null(t);
	cr_assert_not_null(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
}

struct moments {
	double mean, var, min, max;
};

static struct moments moments_of(const struct dg_tensor *t)
{
	struct moments m = { 0, 0, INFINITY, -INFINITY };
	double s = 0, s2 = 0;

	for (int64_t i = 0; i < t->numel; i++) {
		double v = dg_tensor_get_f64(t, i);
		s += v;
		s2 += v * v;
		m.min = v < m.min ? v : m.min;
		m.max = v > m.max ? v : m.max;
	}
	m.mean = s / (double)t->numel;
	m.var = s2 / (double)t->numel - m.mean * m.mean;
	return m;
}

static bool same_bytes(const struct dg_tensor *a, const struct dg_tensor *b)
{
	return a->dtype == b->dtype && a->nbytes == b->nbytes &&
	       memcmp(a->data, b->data, a->nbytes) == 0;
}

Test(random, philox_matches_the_random123_known_answer_vectors)
{
	static const struct {
		uint32_t ctr[4], key[2], want[4];
	} kat[] = {
		{ { 0, 0, 0, 0 }, { 0, 0 }, { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
		{ { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff }, { 0xffffffff, 0xffffffff },
		  { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
		{ { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 }, { 0xa4093822, 0x299f31d0 },
		  { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
	};

	for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
		uint32_t out[4];
		cpu_philox4x32_10(kat[k].ctr, kat[k].key, out);
		for (int j = 0; j < 4; j++)
			cr_assert_eq(out[j], kat[k].want[j], "vector %zu word %d: %08x, want %08x",
				     k, j, out[j], kat[k].want[j]);
	}
}

Test(random, first_values_of_seed_0_step_0_are_the_philox_words)
{
	/* Counter (0,0,0,0), key (0,0) gives 0x6627e8d5 0xe169c58d 0xbc57ac4c
	 * 0x9b00dbd8. float32 uniforms take the top 24 bits of each word. */
	struct dg_tensor *f = draw_ok("RandomUniform", "{\"shape\":[4]}", 0);
	const float *fv = f->data;

	cr_assert_eq(fv[0], (float)(0x6627e8d5u >> 8) / 16777216.0f);
	cr_assert_eq(fv[1], (float)(0xe169c58du >> 8) / 16777216.0f);
	cr_assert_eq(fv[2], (float)(0xbc57ac4cu >> 8) / 16777216.0f);
	cr_assert_eq(fv[3], (float)(0x9b00dbd8u >> 8) / 16777216.0f);
	cr_assert_float_eq(fv[0], 0.39904642f, 1e-7);
	dg_tensor_free(f);

	/* int64 over the full range: minval + bits mod (2^64 - 1), with bits
	 * the two words high first; adding INT64_MIN flips the top bit. */
	struct dg_tensor *i = draw_ok("RandomUniform", "{\"shape\":[2],\"dtype\":\"int64\","
				      "\"minval\":-9223372036854775808,"
				      "\"maxval\":9223372036854775807}", 0);
	const int64_t *iv = i->data;
	cr_assert_eq((uint64_t)iv[0], 0x6627e8d5e169c58dull ^ 0x8000000000000000ull);
	cr_assert_eq((uint64_t)iv[1], 0xbc57ac4c9b00dbd8ull ^ 0x8000000000000000ull);
	dg_tensor_free(i);

	/* float64 uniforms take the top 53 of the 64 bits. */
	struct dg_tensor *d = draw_ok("RandomUniform", "{\"shape\":[1],\"dtype\":\"float64\"}", 0);
	cr_assert_eq(((double *)d->data)[0], (double)(0x6627e8d5e169c58dull >> 11) * 0x1p-53);
	dg_tensor_free(d);
}

Test(random, first_values_of_seed_42_step_7_are_pinned)
{
	/* Computed once with this implementation and checked against an
	 * independent Python model of the same counter layout (key = seed,
	 * counter = (block, 0, step, 0)); a change here changes every initialised
	 * model, so it must be deliberate. */
	static const float uni[4] = { 0.405981958f, 0.895813942f, 0.423809648f,
					  0.333795071f };
	static const double nrm[2] = { -0.90589952572481314, 0.47014599528037843 };
	static const int32_t ints[4] = { -16, 7, -70, -19 };
	struct dg_tensor *u = draw_ok("RandomUniform", "{\"shape\":[4],\"seed\":42}", 7);
	struct dg_tensor *n = draw_ok("RandomNormal", "{\"shape\":[2],\"seed\":42,"
				      "\"dtype\":\"float64\"}", 7);
	struct dg_tensor *i = draw_ok("RandomUniform", "{\"shape\":[4],\"seed\":42,"
				      "\"dtype\":\"int32\",\"minval\":-100,\"maxval\":100}", 7);

	for (int k = 0; k < 4; k++) {
		cr_assert_eq(((float *)u->data)[k], uni[k], "uniform %d: %.9g", k,
			     ((float *)u->data)[k]);
		cr_assert_eq(((int32_t *)i->data)[k], ints[k], "int %d: %d", k,
			     ((int32_t *)i->data)[k]);
	}
	for (int k = 0; k < 2; k++)
		cr_assert_float_eq(((double *)n->data)[k], nrm[k], 1e-15, "normal %d: %.17g", k,
				   ((double *)n->data)[k]);
	dg_tensor_free(u);
	dg_tensor_free(n);
	dg_tensor_free(i);
}

Test(random, same_seed_and_step_give_identical_values_for_every_op)
{
	static const char *const ops[][2] = {
		{ "RandomUniform", "{\"shape\":[3,5],\"seed\":9}" },
		{ "RandomUniform", "{\"shape\":[7],\"seed\":9,\"dtype\":\"float64\"}" },
		{ "RandomUniform", "{\"shape\":[7],\"seed\":9,\"dtype\":\"int32\",\"minval\":0,"
		  "\"maxval\":1000}" },
		{ "RandomNormal", "{\"shape\":[2,3,3],\"seed\":9}" },
		{ "RandomNormal", "{\"shape\":[5],\"seed\":9,\"dtype\":\"float64\"}" },
		{ "TruncatedNormal", "{\"shape\":[64],\"seed\":9}" },
		{ "TruncatedNormal", "{\"shape\":[64],\"seed\":9,\"dtype\":\"float64\"}" },
		{ "GlorotUniform", "{\"shape\":[4,6],\"seed\":9}" },
	};

	for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
		struct dg_tensor *a = draw_ok(ops[k][0], ops[k][1], 3);
		struct dg_tensor *b = draw_ok(ops[k][0], ops[k][1], 3);
		struct dg_tensor *c = draw_ok(ops[k][0], ops[k][1], 4);
		cr_assert(same_bytes(a, b), "%s %s not reproducible", ops[k][0], ops[k][1]);
		cr_assert_not(same_bytes(a, c), "%s %s ignores the step", ops[k][0], ops[k][1]);
		dg_tensor_free(a);
		dg_tensor_free(b);
		dg_tensor_free(c);
	}
}

Test(random, different_seeds_give_different_values)
{
	struct dg_tensor *a = draw_ok("RandomNormal", "{\"shape\":[16],\"seed\":1}", 0);
	struct dg_tensor *b = draw_ok("RandomNormal", "{\"shape\":[16],\"seed\":2}", 0);
	struct dg_tensor *c = draw_ok("RandomNormal", "{\"shape\":[16],\"seed\":4294967297}", 0);
	int equal_ab = 0, equal_ac = 0;

	/* seed 2^32 + 1 differs from 1 only in the key's high word */
	for (int i = 0; i < 16; i++) {
		equal_ab += ((float *)a->data)[i] == ((float *)b->data)[i];
		equal_ac += ((float *)a->data)[i] == ((float *)c->data)[i];
	}
	cr_assert_eq(equal_ab, 0);
	cr_assert_eq(equal_ac, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
}

Test(random, value_i_depends_only_on_seed_step_and_index)
{
	static const char *const ops[] = { "RandomUniform", "RandomNormal", "TruncatedNormal" };
	static const char *const dts[] = { "float32", "float64" };

	for (size_t k = 0; k < 3; k++) {
		for (size_t j = 0; j < 2; j++) {
			char small[128], big[128];
			snprintf(small, sizeof small,
				 "{\"shape\":[3,3],\"seed\":5,\"dtype\":\"%s\"}", dts[j]);
			snprintf(big, sizeof big, "{\"shape\":[1001],\"seed\":5,\"dtype\":\"%s\"}",
				 dts[j]);
			struct dg_tensor *a = draw_ok(ops[k], small, 11);
			struct dg_tensor *b = draw_ok(ops[k], big, 11);
			/* the 9 values of a [3,3] are the first 9 of a [1001] */
			cr_assert_eq(memcmp(a->data, b->data, a->nbytes), 0, "%s %s", ops[k],
				     dts[j]);
			dg_tensor_free(a);
			dg_tensor_free(b);
		}
	}
}

Test(random, uniform_float32_has_the_moments_of_u01)
{
	struct dg_tensor *t = draw_ok("RandomUniform", "{\"shape\":[1000,1000],\"seed\":123}", 0);
	struct moments m = moments_of(t);
	/* standard errors: mean sqrt(1/12/n); variance sqrt((1/80 - 1/144)/n) */
	double se_mean = sqrt(1.0 / 12 / N_STAT), se_var = sqrt((1.0 / 80 - 1.0 / 144) / N_STAT);

	cr_assert_eq(t->dtype, DG_F32);
	cr_assert(m.min >= 0.0 && m.max < 1.0, "range [%g, %g]", m.min, m.max);
	cr_assert(fabs(m.mean - 0.5) < 5 * se_mean, "mean %g", m.mean);
	cr_assert(fabs(m.var - 1.0 / 12) < 5 * se_var, "variance %g", m.var);
	dg_tensor_free(t);
}

Test(random, uniform_float64_respects_minval_and_maxval)
{
	struct dg_tensor *t = draw_ok("RandomUniform", "{\"shape\":[1000000],\"seed\":7,"
				      "\"dtype\":\"float64\",\"minval\":-3,\"maxval\":5}", 1);
	struct moments m = moments_of(t);
	double se_mean = 8 * sqrt(1.0 / 12 / N_STAT);

	cr_assert(m.min >= -3.0 && m.max < 5.0, "range [%g, %g]", m.min, m.max);
	cr_assert(m.min < -2.99 && m.max > 4.99, "range [%g, %g] does not fill [-3, 5)", m.min,
		  m.max);
	cr_assert(fabs(m.mean - 1.0) < 5 * se_mean, "mean %g", m.mean);
	cr_assert(fabs(m.var - 64.0 / 12) < 0.05, "variance %g", m.var);
	dg_tensor_free(t);
}

Test(random, uniform_integers_cover_the_half_open_range_evenly)
{
	struct dg_tensor *t = draw_ok("RandomUniform", "{\"shape\":[1000000],\"seed\":3,"
				      "\"dtype\":\"int32\",\"minval\":-5,\"maxval\":5}", 0);
	int64_t count[10] = { 0 };
	/* each bucket: n/10 +- 5 sqrt(n * 0.1 * 0.9) */
	double tol = 5 * sqrt(N_STAT * 0.1 * 0.9);

	for (int64_t i = 0; i < t->numel; i++) {
		int32_t v = ((int32_t *)t->data)[i];
		cr_assert(v >= -5 && v < 5, "value %d at %lld", v, (long long)i);
		count[v + 5]++;
	}
	for (int k = 0; k < 10; k++)
		cr_assert(fabs((double)count[k] - N_STAT / 10.0) < tol, "value %d drawn %lld times",
			  k - 5, (long long)count[k]);
	dg_tensor_free(t);

	t = draw_ok("RandomUniform", "{\"shape\":[1000],\"seed\":3,\"dtype\":\"int64\","
		    "\"minval\":10000000000,\"maxval\":10000000003}", 0);
	bool seen[3] = { false };
	for (int64_t i = 0; i < t->numel; i++) {
		int64_t v = ((int64_t *)t->data)[i];
		cr_assert(v >= 10000000000LL && v < 10000000003LL, "value %lld", (long long)v);
		seen[v - 10000000000LL] = true;
	}
	cr_assert(seen[0] && seen[1] && seen[2]);
	dg_tensor_free(t);
}

Test(random, normal_draws_have_the_requested_mean_and_stddev)
{
	struct dg_tensor *t = draw_ok("RandomNormal", "{\"shape\":[1000000],\"seed\":99}", 0);
	struct moments m = moments_of(t);
	/* standard errors: mean 1/sqrt(n); stddev about 1/sqrt(2n) */
	double se_mean = 1.0 / sqrt(N_STAT), se_sd = 1.0 / sqrt(2.0 * N_STAT);

	cr_assert(fabs(m.mean) < 5 * se_mean, "mean %g", m.mean);
	cr_assert(fabs(sqrt(m.var) - 1.0) < 5 * se_sd, "stddev %g", sqrt(m.var));
	cr_assert(m.max > 4.0 && m.min < -4.0, "tails [%g, %g] too short", m.min, m.max);
	dg_tensor_free(t);

	t = draw_ok("RandomNormal", "{\"shape\":[1000000],\"seed\":98,\"dtype\":\"float64\","
		    "\"mean\":3,\"stddev\":2}", 5);
	m = moments_of(t);
	cr_assert(fabs(m.mean - 3.0) < 5 * 2 * se_mean, "mean %g", m.mean);
	cr_assert(fabs(sqrt(m.var) - 2.0) < 5 * 2 * se_sd, "stddev %g", sqrt(m.var));
	dg_tensor_free(t);
}

Test(random, truncated_normal_never_strays_beyond_two_stddev)
{
	/* N(0,1) cut at +-2: variance 1 - 4 phi(2) / (2 Phi(2) - 1) = 0.77372 */
	static const double trunc_sd = 0.879613;
	static const char *const dts[] = { "float32", "float64" };

	for (int j = 0; j < 2; j++) {
		char attrs[128];
		snprintf(attrs, sizeof attrs, "{\"shape\":[1000000],\"seed\":17,\"mean\":1,"
			 "\"stddev\":0.5,\"dtype\":\"%s\"}", dts[j]);
		struct dg_tensor *t = draw_ok("TruncatedNormal", attrs, 2);
		struct moments m = moments_of(t);
		cr_assert(m.min >= 0.0 && m.max <= 2.0, "%s range [%g, %g]", dts[j], m.min, m.max);
		cr_assert(m.min < 0.01 && m.max > 1.99, "%s range [%g, %g] not filled", dts[j],
			  m.min, m.max);
		cr_assert(fabs(m.mean - 1.0) < 5 * 0.5 * trunc_sd / sqrt(N_STAT), "mean %g",
			  m.mean);
		cr_assert(fabs(sqrt(m.var) - 0.5 * trunc_sd) < 0.002, "%s stddev %g", dts[j],
			  sqrt(m.var));
		dg_tensor_free(t);
	}
}

Test(random, glorot_uniform_stays_within_its_limit_for_every_rank)
{
	static const struct {
		const char *shape;
		double fan_sum;
	} cases[] = {
		{ "[1000,1000]", 2000 },                /* dense: fan_in + fan_out */
		{ "[5,5,20,40]", 25 * 20 + 25 * 40 },   /* conv: receptive 25 */
		{ "[1000000]", 2e6 },                   /* rank 1: both fans = shape[0] */
		{ "[]", 2 },                            /* rank 0: both fans = 1 */
	};

	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		char attrs[128];
		snprintf(attrs, sizeof attrs, "{\"shape\":%s,\"seed\":21,\"dtype\":\"%s\"}",
			 cases[k].shape, k % 2 ? "float64" : "float32");
		struct dg_tensor *t = draw_ok("GlorotUniform", attrs, 0);
		struct moments m = moments_of(t);
		double limit = sqrt(6.0 / cases[k].fan_sum);
		cr_assert(m.min >= -limit && m.max < limit, "%s: [%g, %g] outside +-%g",
			  cases[k].shape, m.min, m.max, limit);
		if (t->numel >= 1000) {
			cr_assert(m.max > 0.99 * limit && m.min < -0.99 * limit,
				  "%s: [%g, %g] does not reach +-%g", cases[k].shape, m.min, m.max,
				  limit);
			/* variance of U(-l, l) is l^2 / 3 */
			cr_assert(fabs(m.var / (limit * limit / 3) - 1) < 0.05, "%s: variance %g",
				  cases[k].shape, m.var);
		}
		dg_tensor_free(t);
	}
}

Test(random, invalid_attrs_are_refused)
{
	draw_fails("RandomUniform", "{}", DG_EINVAL, "missing required attr 'shape'");
	draw_fails("RandomUniform", "{\"shape\":[-1]}", DG_EINVAL, "invalid size -1");
	draw_fails("RandomUniform", "{\"shape\":[2],\"seed2\":1}", DG_EINVAL, "no attr 'seed2'");
	draw_fails("RandomUniform", "{\"shape\":[2],\"dtype\":\"bool\"}", DG_EDTYPE,
		   "cannot draw bool values");
	draw_fails("RandomUniform", "{\"shape\":[2],\"minval\":1,\"maxval\":1}", DG_EINVAL,
		   "maxval 1 must be greater than minval 1");
	draw_fails("RandomUniform", "{\"shape\":[2],\"minval\":-1e308,\"maxval\":1e308,"
		   "\"dtype\":\"float64\"}", DG_EINVAL, "too wide for float64");
	draw_fails("RandomUniform", "{\"shape\":[2],\"minval\":1e39,\"maxval\":2e39}", DG_EINVAL,
		   "too wide for float32");
	draw_fails("RandomUniform", "{\"shape\":[2],\"minval\":1,\"maxval\":1.00000001}",
		   DG_EINVAL, "empty in float32");
	draw_fails("RandomUniform", "{\"shape\":[2],\"dtype\":\"int32\"}", DG_EINVAL,
		   "missing attr 'minval'");
	draw_fails("RandomUniform", "{\"shape\":[2],\"dtype\":\"int64\",\"minval\":0}",
		   DG_EINVAL, "missing attr 'maxval'");
	draw_fails("RandomUniform", "{\"shape\":[2],\"dtype\":\"int32\",\"minval\":0.5,"
		   "\"maxval\":3}", DG_EINVAL, "'minval' must be an integer");
	draw_fails("RandomUniform", "{\"shape\":[2],\"dtype\":\"int32\",\"minval\":0,"
		   "\"maxval\":3000000000}", DG_EINVAL, "'maxval' = 3000000000 does not fit int32");
	draw_fails("RandomUniform", "{\"shape\":[2],\"dtype\":\"int64\",\"minval\":5,"
		   "\"maxval\":-5}", DG_EINVAL, "maxval -5 must be greater than minval 5");
	draw_fails("RandomNormal", "{\"shape\":[2],\"dtype\":\"int32\"}", DG_EDTYPE,
		   "cannot draw int32 values");
	draw_fails("RandomNormal", "{\"shape\":[2],\"stddev\":-1}", DG_EINVAL,
		   "stddev -1 is negative");
	draw_fails("RandomNormal", "{\"shape\":[2],\"minval\":0}", DG_EINVAL, "no attr 'minval'");
	draw_fails("TruncatedNormal", "{\"shape\":[2],\"mean\":\"zero\"}", DG_EINVAL,
		   "'mean' must be a number");
	draw_fails("TruncatedNormal", "{\"shape\":[2],\"mean\":1e39}", DG_EINVAL,
		   "does not fit float32");
	draw_fails("GlorotUniform", "{\"shape\":[2,2],\"dtype\":\"uint8\"}", DG_EDTYPE,
		   "cannot draw uint8 values");
	draw_fails("GlorotUniform", "{\"shape\":[2,2],\"stddev\":1}", DG_EINVAL,
		   "no attr 'stddev'");
	draw_fails("GlorotUniform", "{\"shape\":[2,2],\"seed\":1.5}", DG_EINVAL,
		   "'seed' must be an integer");
}

Test(random, ops_are_stateful_sources_and_infer_their_outputs)
{
	static const char *const ops[] = { "RandomUniform", "RandomNormal", "TruncatedNormal",
					   "GlorotUniform" };

	for (size_t k = 0; k < 4; k++) {
		const struct dg_op_def *d = dg_op_find(ops[k]);
		struct dg_ttype out;
		struct dg_err err = { 0 };
		json_t *a = json_loads("{\"shape\":[3,4],\"dtype\":\"float64\"}", 0, NULL);
		struct dg_infer_ctx c = { .attrs = a, .n_out = 1, .out = &out, .err = &err };

		cr_assert_not_null(d, "%s", ops[k]);
		cr_assert_eq(d->flags, DG_OPF_SOURCE | DG_OPF_STATEFUL, "%s", ops[k]);
		cr_assert_eq(d->min_inputs, 0);
		cr_assert_eq(d->max_inputs, 0);
		cr_assert_eq(d->infer(&c), DG_OK, "%s: %s", ops[k], err.msg);
		cr_assert_eq(out.dtype, DG_F64);
		cr_assert_eq(out.shape.ndim, 2);
		cr_assert_eq(out.shape.dim[0], 3);
		cr_assert_eq(out.shape.dim[1], 4);
		json_decref(a);
	}
}

/* ---- Dropout ---- */

static struct dg_tensor *dropout(const char *attrs, const struct dg_tensor *x, uint64_t step)
{
	json_t *a = json_loads(attrs, 0, NULL);
	const struct dg_tensor *in[1] = { x };
	struct dg_tensor *y = NULL;
	struct dg_err err = { 0 };

	cr_assert_not_null(a);
	cr_assert_eq(dg_op_run(dg_op_find("Dropout"), a, in, 1, &y, 1, step, &err), DG_OK, "%s",
		     err.msg);
	json_decref(a);
	return y;
}

Test(random, dropout_zeroes_rate_of_the_elements_and_scales_the_rest)
{
	struct dg_shape s = { .ndim = 1, .dim = { N_STAT } };
	struct dg_tensor *x = dg_tensor_new(DG_F32, &s, NULL);
	int64_t zeros = 0;

	cr_assert_not_null(x);
	for (int64_t i = 0; i < N_STAT; i++)
		((float *)x->data)[i] = 1.0f + (float)(i % 7);
	struct dg_tensor *y = dropout("{\"rate\": 0.3, \"seed\": 5}", x, 11);
	for (int64_t i = 0; i < N_STAT; i++) {
		float v = ((float *)y->data)[i], want = ((float *)x->data)[i] / 0.7f;
		if (v == 0)
			zeros++;
		else
			cr_assert_float_eq(v, want, 1e-5, "element %lld: %g, want %g", (long long)i,
					   v, want);
	}
	/* 10^6 Bernoulli(0.3): sd 458; 5 sd */
	cr_assert(llabs(zeros - 300000) < 2300, "%lld of 10^6 zeroed", (long long)zeros);
	/* the same (seed, step): the same mask; another step: another one */
	struct dg_tensor *again = dropout("{\"rate\": 0.3, \"seed\": 5}", x, 11);
	struct dg_tensor *next = dropout("{\"rate\": 0.3, \"seed\": 5}", x, 12);
	cr_assert(same_bytes(y, again));
	cr_assert(!same_bytes(y, next));
	/* rate 0 is the identity */
	struct dg_tensor *id = dropout("{\"rate\": 0, \"seed\": 1}", x, 3);
	cr_assert(same_bytes(id, x));
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(again);
	dg_tensor_free(next);
	dg_tensor_free(id);
}

Test(random, dropout_refuses_a_rate_outside_0_to_1_and_integers)
{
	struct dg_shape s = { .ndim = 1, .dim = { 4 } };
	struct dg_tensor *x = dg_tensor_new(DG_F32, &s, NULL), *i = dg_tensor_new(DG_I32, &s, NULL);
	const struct dg_tensor *in[1] = { x };
	struct dg_tensor *y = NULL;
	struct dg_err err = { 0 };
	json_t *a = json_loads("{\"rate\": 1, \"seed\": 1}", 0, NULL);

	cr_assert_eq(dg_op_run(dg_op_find("Dropout"), a, in, 1, &y, 1, 0, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "[0, 1)"), "%s", err.msg);
	json_decref(a);
	a = json_loads("{\"rate\": 0.5, \"seed\": 1}", 0, NULL);
	in[0] = i;
	cr_assert_eq(dg_op_run(dg_op_find("Dropout"), a, in, 1, &y, 1, 0, &err), DG_EDTYPE);
	json_decref(a);
	/* no seed: refused, two Dropouts would silently share their masks */
	const char *text = "{\"nodes\": [{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": "
		"{\"dtype\": \"float32\", \"shape\": [4]}}, {\"name\": \"y\", \"op\": "
		"\"Dropout\", \"inputs\": [\"x\"], \"attrs\": {\"rate\": 0.5}}]}";
	cr_assert_null(dg_graph_parse(text, strlen(text), dg_op_find, &err));
	cr_assert(strstr(err.msg, "seed"), "%s", err.msg);
	dg_tensor_free(x);
	dg_tensor_free(i);
}
