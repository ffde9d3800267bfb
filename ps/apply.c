/* Update rules of the parameter server (assign, assign_add, sgd, momentum,
 * adam, adagrad, rmsprop), dense and row-wise, and the arithmetic of synchronous accumulation, computed in place on
 * buffers that store.c hands over with the variable's lock held. One plain
 * loop per (rule, dtype) so the compiler vectorises it; no dtype switch per
 * element. Formulas: doc/http-api.md (POST /apply). */
#include "store_internal.h"

#include <math.h>
#include <string.h>

/* sqrt in a loop vectorises only when it need not set errno (v >= 0 here). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_ERRNO __attribute__((optimize("no-math-errno")))
#else
#define NO_ERRNO
#endif

static const char *const rule_names[PS_RULE_COUNT] = {
	[PS_ASSIGN] = "assign", [PS_ASSIGN_ADD] = "assign_add", [PS_SGD] = "sgd",
	[PS_MOMENTUM] = "momentum", [PS_ADAM] = "adam", [PS_ADAGRAD] = "adagrad",
	[PS_RMSPROP] = "rmsprop", [PS_MOVING_AVERAGE] = "moving_average",
};

#define RULE_LIST "assign, assign_add, sgd, momentum, adam, adagrad, rmsprop, moving_average"

const char *ps_rule_name(enum ps_rule r)
{
	return (unsigned)r < PS_RULE_COUNT ? rule_names[r] : "invalid";
}

static const char *const durability_names[] = {
	[PS_DURABILITY_SNAPSHOT] = "snapshot", [PS_DURABILITY_STRICT] = "strict",
};

enum dg_status ps_durability_parse(const char *s, enum ps_durability *out, struct dg_err *err)
{
	for (int i = 0; s && i < 2; i++) {
		if (strcmp(s, durability_names[i]) == 0) {
			*out = (enum ps_durability)i;
			return DG_OK;
		}
	}
	dg_err_set(err, DG_EINVAL, "unknown durability '%.64s'", s ? s : "(null)");
	dg_err_hint(err, "use snapshot (applies survive in the next snapshot) or strict "
		    "(every acknowledged apply is logged and synced)");
	return DG_EINVAL;
}

const char *ps_durability_name(enum ps_durability d)
{
	return (unsigned)d < 2 ? durability_names[d] : "?";
}

enum dg_status ps_rule_parse(const char *s, enum ps_rule *out, struct dg_err *err)
{
	for (int i = 0; s && i < PS_RULE_COUNT; i++) {
		if (strcmp(s, rule_names[i]) == 0) {
			*out = (enum ps_rule)i;
			return DG_OK;
		}
	}
	dg_err_set(err, DG_EINVAL, "unknown update rule '%.64s'", s ? s : "(null)");
	dg_err_hint(err, "use one of " RULE_LIST);
	return DG_EINVAL;
}

static const char *const momentum_slots[] = { ".momentum" };
static const char *const adam_slots[] = { ".adam_m", ".adam_v", ".adam_t" };
static const char *const adagrad_slots[] = { ".accum" };
static const char *const rmsprop_slots[] = { ".rms", ".rms_momentum" };

int ps_rule_slots(enum ps_rule r, const char *const **suffix)
{
	switch (r) {
	case PS_MOMENTUM: *suffix = momentum_slots; return 1;
	case PS_ADAM: *suffix = adam_slots; return 3;
	case PS_ADAGRAD: *suffix = adagrad_slots; return 1;
	case PS_RMSPROP: *suffix = rmsprop_slots; return 2;
	default: *suffix = NULL; return 0;
	}
}

double ps_rule_slot_init(const struct ps_apply_args *a, int i)
{
	/* TensorFlow 1.x: Adagrad's accumulator starts at
	 * initial_accumulator_value, RMSProp's mean square at ones */
	return (a->rule == PS_ADAGRAD || a->rule == PS_RMSPROP) && i == 0 ? a->init : 0.0;
}

bool ps_rule_slot_is_counter(enum ps_rule r, int i)
{
	return r == PS_ADAM && i == 2;
}

/* --- argument checks ---------------------------------------------------------- */

static enum dg_status bad_param(struct dg_err *err, const char *rule, const char *param,
				double v, const char *name, const char *want)
{
	dg_err_set(err, DG_EINVAL, "%s of '%s': %s=%g is invalid", rule, name, param, v);
	dg_err_hint(err, "%s must be %s", param, want);
	return DG_EINVAL;
}

enum dg_status ps_apply_check_args(const struct ps_apply_args *a, const char *name,
				   struct dg_err *err)
{
	const char *rule = ps_rule_name(a->rule);

	if ((unsigned)a->rule >= PS_RULE_COUNT) {
		dg_err_set(err, DG_EINVAL, "unknown update rule %d for '%s'", (int)a->rule, name);
		dg_err_hint(err, "use one of " RULE_LIST);
		return DG_EINVAL;
	}
	if (a->rule >= PS_SGD && a->rule <= PS_RMSPROP) {
		if (!(a->lr >= 0) || !isfinite(a->lr))
			return bad_param(err, rule, "lr", a->lr, name, "finite and >= 0");
	}
	if ((a->rule == PS_MOMENTUM || a->rule == PS_RMSPROP) &&
	    (!(a->momentum >= 0) || !isfinite(a->momentum)))
		return bad_param(err, rule, "momentum", a->momentum, name, "finite and >= 0");
	if ((a->rule == PS_ADAGRAD || a->rule == PS_RMSPROP) && (!(a->init > 0) || !isfinite(a->init)))
		return bad_param(err, rule, "init", a->init, name, "finite and > 0");
	if (a->rule == PS_RMSPROP) {
		if (!(a->rho >= 0 && a->rho < 1))
			return bad_param(err, rule, "rho", a->rho, name, "in [0, 1)");
		if (!(a->eps > 0) || !isfinite(a->eps))
			return bad_param(err, rule, "eps", a->eps, name, "finite and > 0");
	}
	if (a->rule == PS_MOVING_AVERAGE && !(a->rho >= 0 && a->rho <= 1))
		return bad_param(err, rule, "decay", a->rho, name, "in [0, 1]");
	if (a->rows && a->n_rows < 0)
		return bad_param(err, rule, "rows", (double)a->n_rows, name, ">= 0");
	if (a->rule == PS_ADAM) {
		if (!(a->beta1 >= 0 && a->beta1 < 1))
			return bad_param(err, rule, "beta1", a->beta1, name, "in [0, 1)");
		if (!(a->beta2 >= 0 && a->beta2 < 1))
			return bad_param(err, rule, "beta2", a->beta2, name, "in [0, 1)");
		if (!(a->eps > 0) || !isfinite(a->eps))
			return bad_param(err, rule, "eps", a->eps, name, "finite and > 0");
	}
	if (a->step < 0)
		return DG_OK;
	if (a->replicas < 1) {
		dg_err_set(err, DG_EINVAL, "sync %s of '%s': replicas=%d is invalid", rule, name,
			   a->replicas);
		dg_err_hint(err, "replicas (the number of workers per step) must be >= 1");
		return DG_EINVAL;
	}
	if (a->backup < 0 || a->backup >= a->replicas) {
		dg_err_set(err, DG_EINVAL, "sync %s of '%s': backup=%d with replicas=%d is invalid",
			   rule, name, a->backup, a->replicas);
		dg_err_hint(err, "backup (workers whose gradient is not waited for) must be in "
			    "[0, replicas)");
		return DG_EINVAL;
	}
	if (a->replica < -1) {
		dg_err_set(err, DG_EINVAL, "sync %s of '%s': replica=%lld is invalid", rule, name,
			   (long long)a->replica);
		dg_err_hint(err, "replica is the worker's index (>= 0), or -1 for anonymous");
		return DG_EINVAL;
	}
	return DG_OK;
}

enum dg_status ps_apply_check_dtype(const struct ps_apply_args *a, enum dg_dtype dt,
				    const char *name, struct dg_err *err)
{
	const char *rule = ps_rule_name(a->rule);
	bool ok;

	switch (a->rule) {
	case PS_ASSIGN: ok = a->step < 0 || dt != DG_BOOL; break;
	case PS_ASSIGN_ADD: ok = dt != DG_BOOL; break;
	/* float16/bfloat16: sgd in float32 math; momentum and adam would keep
	 * their slots in the variable's 16 bits, which loses the small updates. */
	case PS_SGD: ok = dg_dtype_is_float(dt) || dg_dtype_is_half(dt); break;
	default: ok = dg_dtype_is_float(dt); break;
	}
	if (ok)
		return DG_OK;
	dg_err_set(err, DG_EDTYPE, "%s%s cannot update '%s': it is %s", a->step >= 0 ? "sync " : "",
		   rule, name, dg_dtype_name(dt));
	if (a->rule == PS_ASSIGN)
		dg_err_hint(err, "a bool variable takes plain (not synchronous) assign only");
	else if (a->rule == PS_ASSIGN_ADD)
		dg_err_hint(err, "assign_add takes float32, float64, float16, bfloat16, int32, "
			    "int64 and uint8");
	else if (dg_dtype_is_half(dt))
		dg_err_hint(err, "%s updates float32 and float64 variables: keep a float32 "
			    "master copy and Cast it to %s, or use sgd", rule, dg_dtype_name(dt));
	else
		dg_err_hint(err, "%s updates float32 and float64 variables", rule);
	return DG_EDTYPE;
}

/* --- rules, one loop per dtype ------------------------------------------------------- */

/* w[n] -= lr * g[n] */
#define DEF_SGD(NAME, T)                                                                     \
	static void NAME(int64_t n, T *restrict w, const T *restrict g, T lr)                \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			w[i] -= lr * g[i];                                                   \
	}
DEF_SGD(sgd_f32, float)
DEF_SGD(sgd_f64, double)

/* w[n] = src[n] - lr * g[n]: sgd into a fresh block (copy-on-write) in one
 * pass, instead of copying src and updating the copy. */
#define DEF_SGD_FROM(NAME, T)                                                                \
	static void NAME(int64_t n, T *restrict w, const T *restrict src, const T *restrict g,  \
			 T lr)                                                               \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			w[i] = src[i] - lr * g[i];                                           \
	}
DEF_SGD_FROM(sgd_from_f32, float)
DEF_SGD_FROM(sgd_from_f64, double)

/* m = mu*m + g; w -= lr * (nesterov ? g + mu*m : m), all [n] */
#define DEF_MOMENTUM(NAME, T)                                                                \
	static void NAME(int64_t n, T *restrict w, const T *restrict g, T *restrict m, T lr,  \
			 T mu, bool nesterov)                                                \
	{                                                                                    \
		if (nesterov) {                                                              \
			for (int64_t i = 0; i < n; i++) {                                    \
				T mi = mu * m[i] + g[i];                                     \
				m[i] = mi;                                                   \
				w[i] -= lr * (g[i] + mu * mi);                               \
			}                                                                    \
		} else {                                                                     \
			for (int64_t i = 0; i < n; i++) {                                    \
				T mi = mu * m[i] + g[i];                                     \
				m[i] = mi;                                                   \
				w[i] -= lr * mi;                                             \
			}                                                                    \
		}                                                                            \
	}
DEF_MOMENTUM(momentum_f32, float)
DEF_MOMENTUM(momentum_f64, double)

/* m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; w -= lr_t * m / (sqrt(v) + eps), all [n];
 * lr_t carries the bias correction (TensorFlow's form). */
#define DEF_ADAM(NAME, T, SQRT)                                                              \
	NO_ERRNO static void NAME(int64_t n, T *restrict w, const T *restrict g,              \
				  T *restrict m, T *restrict v, T lr_t, T b1, T b2, T eps)   \
	{                                                                                    \
		const T c1 = (T)1 - b1, c2 = (T)1 - b2;                                      \
		for (int64_t i = 0; i < n; i++) {                                            \
			T gi = g[i];                                                         \
			T mi = b1 * m[i] + c1 * gi;                                          \
			T vi = b2 * v[i] + c2 * gi * gi;                                     \
			m[i] = mi;                                                           \
			v[i] = vi;                                                           \
			w[i] -= lr_t * mi / (SQRT(vi) + eps);                                \
		}                                                                            \
	}
DEF_ADAM(adam_f32, float, sqrtf)
DEF_ADAM(adam_f64, double, sqrt)

/* TensorFlow 1.x's Adagrad (no epsilon; the accumulator starts > 0):
 * acc += g^2; w -= lr * g / sqrt(acc), all [n] */
#define DEF_ADAGRAD(NAME, T, SQRT)                                                           \
	NO_ERRNO static void NAME(int64_t n, T *restrict w, const T *restrict g,              \
				  T *restrict acc, T lr)                                     \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++) {                                            \
			T gi = g[i], ai = acc[i] + gi * gi;                                  \
			acc[i] = ai;                                                         \
			w[i] -= lr * gi / SQRT(ai);                                          \
		}                                                                            \
	}
DEF_ADAGRAD(adagrad_f32, float, sqrtf)
DEF_ADAGRAD(adagrad_f64, double, sqrt)

/* TensorFlow 1.x's RMSProp (epsilon inside the root, not centered):
 * ms = rho*ms + (1-rho)*g^2; mom = mu*mom + lr*g/sqrt(ms + eps); w -= mom, all [n] */
#define DEF_RMSPROP(NAME, T, SQRT)                                                           \
	NO_ERRNO static void NAME(int64_t n, T *restrict w, const T *restrict g,              \
				  T *restrict ms, T *restrict mom, T lr, T rho, T mu, T eps) \
	{                                                                                    \
		const T c = (T)1 - rho;                                                      \
		for (int64_t i = 0; i < n; i++) {                                            \
			T gi = g[i];                                                         \
			T si = rho * ms[i] + c * gi * gi;                                    \
			T mi = mu * mom[i] + lr * gi / SQRT(si + eps);                       \
			ms[i] = si;                                                          \
			mom[i] = mi;                                                         \
			w[i] -= mi;                                                          \
		}                                                                            \
	}
DEF_RMSPROP(rmsprop_f32, float, sqrtf)
DEF_RMSPROP(rmsprop_f64, double, sqrt)

/* An exponential moving average of the values g (batch norm's statistics):
 * w = decay * w + (1 - decay) * g, as w -= (1 - decay) * (w - g) in
 * Keras' BatchNormalization (TensorFlow's assign_moving_average without
 * zero_debias), all [n] */
#define DEF_EMA(NAME, T)                                                                     \
	static void NAME(int64_t n, T *restrict w, const T *restrict g, T decay)             \
	{                                                                                    \
		const T c = (T)1 - decay;                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			w[i] -= c * (w[i] - g[i]);                                           \
	}
DEF_EMA(ema_f32, float)
DEF_EMA(ema_f64, double)

/* w[n] += g[n]; integers wrap around (added as unsigned, as TensorFlow does) */
#define DEF_ADD(NAME, T, U)                                                                  \
	static void NAME(int64_t n, T *restrict w, const T *restrict g)                      \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			w[i] = (T)((U)w[i] + (U)g[i]);                                       \
	}
DEF_ADD(add_f32, float, float)
DEF_ADD(add_f64, double, double)
DEF_ADD(add_i32, int32_t, uint32_t)
DEF_ADD(add_i64, int64_t, uint64_t)
DEF_ADD(add_u8, uint8_t, uint8_t)

/* The 16-bit floats: float32 math on the widened values, one rounding back.
 * w[n] = src[n] + k * g[n] (assign_add: k = 1; sgd: k = -lr); src may be w. */
static void axpy_half(enum dg_dtype dt, int64_t n, uint16_t *w, const uint16_t *src,
		      const uint16_t *g, float k)
{
	if (dt == DG_F16) {
		for (int64_t i = 0; i < n; i++)
			w[i] = dg_f32_to_f16(dg_f16_to_f32(src[i]) + k * dg_f16_to_f32(g[i]));
	} else {
		for (int64_t i = 0; i < n; i++)
			w[i] = dg_f32_to_bf16(dg_bf16_to_f32(src[i]) + k * dg_bf16_to_f32(g[i]));
	}
}

static void assign_add(enum dg_dtype dt, int64_t n, void *w, const void *g)
{
	switch (dt) {
	case DG_F32: add_f32(n, w, g); break;
	case DG_F64: add_f64(n, w, g); break;
	case DG_I32: add_i32(n, w, g); break;
	case DG_I64: add_i64(n, w, g); break;
	case DG_U8: add_u8(n, w, g); break;
	case DG_F16:
	case DG_BF16: axpy_half(dt, n, w, w, g, 1.0f); break;
	default: break;   /* refused by ps_apply_check_dtype */
	}
}

/* Adam's step counter += 1; the bias-corrected learning rate of that step. */
static double adam_tick(const struct ps_apply_args *a, int64_t *tp)
{
	/* the step count wraps like any int64 (after 2^63 steps) */
	int64_t t = (int64_t)((uint64_t)*tp + 1u);
	double tt = t > 0 ? (double)t : 1.0;

	*tp = t;
	/* 1 - b1^t > 0 for t >= 1 because b1 < 1 */
	return a->lr * sqrt(1.0 - pow(a->beta2, tt)) / (1.0 - pow(a->beta1, tt));
}

static void adam_run(const struct ps_apply_args *a, enum dg_dtype dt, int64_t n, void *w,
		     const void *g, void *m, void *v, double lr_t)
{
	if (dt == DG_F32)
		adam_f32(n, w, g, m, v, (float)lr_t, (float)a->beta1, (float)a->beta2,
			 (float)a->eps);
	else
		adam_f64(n, w, g, m, v, lr_t, a->beta1, a->beta2, a->eps);
}

static void adam(const struct ps_apply_args *a, enum dg_dtype dt, int64_t n, void *w,
		 const void *g, void *const *slots)
{
	adam_run(a, dt, n, w, g, slots[0], slots[1], adam_tick(a, slots[2]));
}

void ps_apply_rule(const struct ps_apply_args *a, enum dg_dtype dt, int64_t n, void *w,
		   const void *g, void *const *slots)
{
	bool f32 = dt == DG_F32;

	switch (a->rule) {
	case PS_ASSIGN:
		if (n)
			memcpy(w, g, (size_t)n * dg_dtype_size(dt));
		break;
	case PS_ASSIGN_ADD: assign_add(dt, n, w, g); break;
	case PS_SGD:
		if (dg_dtype_is_half(dt))
			axpy_half(dt, n, w, w, g, -(float)a->lr);
		else if (f32)
			sgd_f32(n, w, g, (float)a->lr);
		else
			sgd_f64(n, w, g, a->lr);
		break;
	case PS_MOMENTUM:
		if (f32)
			momentum_f32(n, w, g, slots[0], (float)a->lr, (float)a->momentum,
				     a->nesterov);
		else
			momentum_f64(n, w, g, slots[0], a->lr, a->momentum, a->nesterov);
		break;
	case PS_ADAM: adam(a, dt, n, w, g, slots); break;
	case PS_ADAGRAD:
		if (f32)
			adagrad_f32(n, w, g, slots[0], (float)a->lr);
		else
			adagrad_f64(n, w, g, slots[0], a->lr);
		break;
	case PS_RMSPROP:
		if (f32)
			rmsprop_f32(n, w, g, slots[0], slots[1], (float)a->lr, (float)a->rho,
				    (float)a->momentum, (float)a->eps);
		else
			rmsprop_f64(n, w, g, slots[0], slots[1], a->lr, a->rho, a->momentum,
				    a->eps);
		break;
	case PS_MOVING_AVERAGE:
		if (f32)
			ema_f32(n, w, g, (float)a->rho);
		else
			ema_f64(n, w, g, a->rho);
		break;
	}
}

void ps_apply_rule_rows(const struct ps_apply_args *a, enum dg_dtype dt, int64_t row_len,
			int64_t n_rows, const int64_t *rows, void *w, const void *g,
			void *const *slots)
{
	size_t rb = (size_t)row_len * dg_dtype_size(dt);
	const char *const *suffix;
	int n_slots = ps_rule_slots(a->rule, &suffix);
	double lr_t = a->rule == PS_ADAM ? adam_tick(a, slots[2]) : 0;

	for (int64_t i = 0; i < n_rows; i++) {
		size_t off = (size_t)rows[i] * rb;
		void *rs[PS_MAX_SLOTS] = { 0 };
		for (int k = 0; k < n_slots; k++)
			rs[k] = ps_rule_slot_is_counter(a->rule, k) ? slots[k]
								    : (char *)slots[k] + off;
		if (a->rule == PS_ADAM)   /* one tick per apply, not per row */
			adam_run(a, dt, row_len, (char *)w + off, (const char *)g + (size_t)i * rb,
				 rs[0], rs[1], lr_t);
		else
			ps_apply_rule(a, dt, row_len, (char *)w + off,
				      (const char *)g + (size_t)i * rb, rs);
	}
}

void ps_apply_add(enum dg_dtype dt, int64_t n, void *w, const void *g)
{
	assign_add(dt, n, w, g);
}

void ps_apply_rule_from(const struct ps_apply_args *a, enum dg_dtype dt, int64_t n, void *w,
			const void *src, const void *g, void *const *slots)
{
	size_t nb = (size_t)n * dg_dtype_size(dt);

	if (a->rule == PS_ASSIGN) {
		if (nb)
			memcpy(w, g, nb);       /* the old value is not read at all */
	} else if (a->rule == PS_SGD && dg_dtype_is_half(dt)) {
		axpy_half(dt, n, w, src, g, -(float)a->lr);
	} else if (a->rule == PS_SGD && dt == DG_F32) {
		sgd_from_f32(n, w, src, g, (float)a->lr);
	} else if (a->rule == PS_SGD) {
		sgd_from_f64(n, w, src, g, a->lr);
	} else {
		if (nb)
			memcpy(w, src, nb);
		ps_apply_rule(a, dt, n, w, g, slots);
	}
}

/* --- synchronous accumulation ------------------------------------------------------------ */

/* acc[n] (double) += g[n] */
#define DEF_ACC_F(NAME, T)                                                                   \
	static void NAME(int64_t n, double *restrict acc, const T *restrict g)               \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			acc[i] += (double)g[i];                                              \
	}
DEF_ACC_F(acc_f32, float)
DEF_ACC_F(acc_f64, double)

/* 16-bit gradients accumulate in double like float32 ones. */
static void acc_half(enum dg_dtype dt, int64_t n, double *restrict acc, const uint16_t *g)
{
	for (int64_t i = 0; i < n; i++)
		acc[i] += dt == DG_F16 ? dg_f16_to_f32(g[i]) : dg_bf16_to_f32(g[i]);
}

/* acc[n] (int64, wrapping) += g[n] */
#define DEF_ACC_I(NAME, T)                                                                   \
	static void NAME(int64_t n, int64_t *restrict acc, const T *restrict g)              \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)(int64_t)g[i]);      \
	}
DEF_ACC_I(acc_i32, int32_t)
DEF_ACC_I(acc_i64, int64_t)
DEF_ACC_I(acc_u8, uint8_t)

void ps_acc_add(enum dg_dtype dt, int64_t n, void *acc, const void *g)
{
	switch (dt) {
	case DG_F32: acc_f32(n, acc, g); break;
	case DG_F64: acc_f64(n, acc, g); break;
	case DG_I32: acc_i32(n, acc, g); break;
	case DG_I64: acc_i64(n, acc, g); break;
	case DG_U8: acc_u8(n, acc, g); break;
	case DG_F16:
	case DG_BF16: acc_half(dt, n, acc, g); break;
	default: break;   /* bool never accumulates (ps_apply_check_dtype) */
	}
}

/* out[n] = (acc[n] + g[n]) / count, in double, rounded once to T */
#define DEF_MEAN_F(NAME, T)                                                                  \
	static void NAME(int64_t n, const double *restrict acc, const T *restrict g,          \
			 double count, T *restrict out)                                      \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++)                                              \
			out[i] = (T)((acc[i] + (double)g[i]) / count);                        \
	}
DEF_MEAN_F(mean_f32, float)
DEF_MEAN_F(mean_f64, double)

static void mean_half(enum dg_dtype dt, int64_t n, const double *restrict acc,
		      const uint16_t *restrict g, double count, uint16_t *restrict out)
{
	for (int64_t i = 0; i < n; i++) {
		double gi = dt == DG_F16 ? dg_f16_to_f32(g[i]) : dg_bf16_to_f32(g[i]);
		double m = (acc[i] + gi) / count;
		out[i] = dt == DG_F16 ? dg_f64_to_f16(m) : dg_f64_to_bf16(m);
	}
}

/* out[n] = (acc[n] + g[n]) / count in int64 (truncating), converted modulo 2^bits
 * to T (the sum wraps; count >= 1 so the division cannot overflow) */
#define DEF_MEAN_I(NAME, T, U)                                                               \
	static void NAME(int64_t n, const int64_t *restrict acc, const T *restrict g,         \
			 int64_t count, T *restrict out)                                     \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++) {                                            \
			int64_t s = (int64_t)((uint64_t)acc[i] + (uint64_t)(int64_t)g[i]);   \
			out[i] = (T)(U)(uint64_t)(s / count);                                \
		}                                                                            \
	}
DEF_MEAN_I(mean_i32, int32_t, uint32_t)
DEF_MEAN_I(mean_i64, int64_t, uint64_t)
DEF_MEAN_I(mean_u8, uint8_t, uint8_t)

void ps_acc_mean(enum dg_dtype dt, int64_t n, const void *acc, const void *g, int count,
		 void *out)
{
	switch (dt) {
	case DG_F32: mean_f32(n, acc, g, count, out); break;
	case DG_F64: mean_f64(n, acc, g, count, out); break;
	case DG_I32: mean_i32(n, acc, g, count, out); break;
	case DG_I64: mean_i64(n, acc, g, count, out); break;
	case DG_U8: mean_u8(n, acc, g, count, out); break;
	case DG_F16:
	case DG_BF16: mean_half(dt, n, acc, g, count, out); break;
	default: break;
	}
}
