/* Typed access to a node's JSON attrs, the attr-schema check, and JSON tensor
 * literals (Const values, small feeds and replies). Every accessor names the
 * attr and what it expected, so the caller only adds the node's name. */
#include "dg/op.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

const char *dg_json_kind(const json_t *v, bool article)
{
	const char *s;

	if (!v)
		return "nothing";
	switch (json_typeof(v)) {
	case JSON_OBJECT: s = "an object"; break;
	case JSON_ARRAY: s = "an array"; break;
	case JSON_STRING: s = "a string"; break;
	case JSON_INTEGER: s = "an integer"; break;
	case JSON_REAL: s = "a number"; break;
	case JSON_TRUE:
	case JSON_FALSE: s = "a bool"; break;
	default: return "null";
	}
	return article ? s : strchr(s, ' ') + 1;
}

/* The attr's value, or NULL when missing (attrs may be NULL). */
static const json_t *get(const json_t *attrs, const char *key)
{
	return attrs ? json_object_get(attrs, key) : NULL;
}

static enum dg_status missing(const char *key, struct dg_err *err)
{
	return dg_err_set(err, DG_EINVAL, "missing required attr '%s'", key);
}

static enum dg_status wrong(const char *key, const char *want, const json_t *v,
			    struct dg_err *err)
{
	return dg_err_set(err, DG_EINVAL, "attr '%s' must be %s, got %s", key, want,
			  dg_json_kind(v, false));
}

enum dg_status dg_attr_int(const json_t *attrs, const char *key, const int64_t *def,
			   int64_t *out, struct dg_err *err)
{
	const json_t *v = get(attrs, key);

	if (!v) {
		if (!def)
			return missing(key, err);
		*out = *def;
		return DG_OK;
	}
	if (!json_is_integer(v))
		return wrong(key, "an integer", v, err);
	*out = json_integer_value(v);
	return DG_OK;
}

enum dg_status dg_attr_float(const json_t *attrs, const char *key, const double *def,
			     double *out, struct dg_err *err)
{
	const json_t *v = get(attrs, key);

	if (!v) {
		if (!def)
			return missing(key, err);
		*out = *def;
		return DG_OK;
	}
	if (!json_is_number(v))
		return wrong(key, "a number", v, err);
	*out = json_number_value(v);
	return DG_OK;
}

enum dg_status dg_attr_bool(const json_t *attrs, const char *key, const bool *def, bool *out,
			    struct dg_err *err)
{
	const json_t *v = get(attrs, key);

	if (!v) {
		if (!def)
			return missing(key, err);
		*out = *def;
		return DG_OK;
	}
	if (!json_is_boolean(v))
		return wrong(key, "true or false", v, err);
	*out = json_is_true(v);
	return DG_OK;
}

enum dg_status dg_attr_string(const json_t *attrs, const char *key, const char *def,
			      const char **out, struct dg_err *err)
{
	const json_t *v = get(attrs, key);

	if (!v) {
		if (!def)
			return missing(key, err);
		*out = def;
		return DG_OK;
	}
	if (!json_is_string(v))
		return wrong(key, "a string", v, err);
	*out = json_string_value(v);
	return DG_OK;
}

enum dg_status dg_attr_ints(const json_t *attrs, const char *key, bool required, int64_t *out,
			    int max, int *n, struct dg_err *err)
{
	const json_t *v = get(attrs, key);
	size_t i;
	json_t *e;

	*n = 0;
	if (!v)
		return required ? missing(key, err) : DG_OK;
	if (!json_is_array(v))
		return wrong(key, "an array of integers", v, err);
	if (json_array_size(v) > (size_t)max) {
		return dg_err_set(err, DG_EINVAL, "attr '%s' has %zu entries; at most %d allowed",
				  key, json_array_size(v), max);
	}
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e))
			return dg_err_set(err, DG_EINVAL, "attr '%s'[%zu] must be an integer, got %s",
					  key, i, dg_json_kind(e, false));
		out[i] = json_integer_value(e);
	}
	*n = (int)json_array_size(v);
	return DG_OK;
}

enum dg_status dg_attr_dtype(const json_t *attrs, const char *key, const enum dg_dtype *def,
			     enum dg_dtype *out, struct dg_err *err)
{
	const json_t *v = get(attrs, key);
	enum dg_status st;

	if (!v) {
		if (!def)
			return missing(key, err);
		*out = *def;
		return DG_OK;
	}
	if (!json_is_string(v))
		return wrong(key, "a dtype name", v, err);
	st = dg_dtype_parse(json_string_value(v), out, err);
	if (st != DG_OK)
		dg_err_prefix(err, "attr '%s'", key);
	return st;
}

enum dg_status dg_attr_shape(const json_t *attrs, const char *key, bool required,
			     bool allow_unknown, struct dg_shape *out, struct dg_err *err)
{
	const json_t *v = get(attrs, key);
	int64_t dims[DG_MAX_DIMS + 1];
	int n;
	enum dg_status st;

	if (!v || json_is_null(v)) {
		if (!allow_unknown || (required && !v))
			return v ? wrong(key, "an array of sizes", v, err) : missing(key, err);
		out->ndim = -1;
		return DG_OK;
	}
	if (json_is_array(v) && json_array_size(v) > DG_MAX_DIMS) {
		return dg_err_set(err, DG_EINVAL, "attr '%s' has %zu dimensions; at most %d allowed",
				  key, json_array_size(v), DG_MAX_DIMS);
	}
	st = dg_attr_ints(attrs, key, true, dims, DG_MAX_DIMS, &n, err);
	if (st != DG_OK)
		return st;
	for (int i = 0; i < n; i++) {
		if (dims[i] < -1 || (dims[i] == -1 && !allow_unknown)) {
			return dg_err_set(err, DG_EINVAL, "attr '%s' has invalid size %lld at %d",
					  key, (long long)dims[i], i);
		}
	}
	*out = dg_shape_make(n, dims);
	if (allow_unknown && !dg_shape_is_known(out))
		return DG_OK;
	int64_t numel;
	st = dg_shape_numel(out, &numel, err);
	if (st != DG_OK)
		dg_err_prefix(err, "attr '%s'", key);
	return st;
}

/* --- JSON tensor literals ------------------------------------------------ */

struct lit {
	struct dg_shape shape;
	bool shape_set;
	bool any_real;       /* a fraction or exponent was seen: float32 by default */
	bool any_bool;
	bool any_num;
	bool big_int;        /* an integer outside int32 */
};

/* The strings JSON needs for IEEE specials ("nan", "inf", "-inf", also
 * "+inf", "infinity", any case). False for anything else. */
static bool special_value(const char *s, double *out)
{
	bool neg = s[0] == '-';
	const char *w = s[0] == '-' || s[0] == '+' ? s + 1 : s;

	if (strcasecmp(w, "nan") == 0 && !neg)
		*out = NAN;
	else if (strcasecmp(w, "inf") == 0 || strcasecmp(w, "infinity") == 0)
		*out = neg ? -INFINITY : INFINITY;
	else
		return false;
	return true;
}

/* Walk nested arrays, checking rectangularity against the first path seen. */
static enum dg_status scan(const json_t *v, int depth, struct lit *l, struct dg_err *err)
{
	if (json_is_array(v)) {
		if (depth >= DG_MAX_DIMS)
			return dg_err_set(err, DG_EINVAL, "tensor literal nests deeper than %d", DG_MAX_DIMS);
		int64_t n = (int64_t)json_array_size(v);
		if (!l->shape_set) {
			if (l->shape.ndim <= depth) {
				l->shape.ndim = depth + 1;
				l->shape.dim[depth] = n;
			}
		}
		if (l->shape.ndim <= depth || l->shape.dim[depth] != n)
			return dg_err_set(err, DG_ESHAPE, "tensor literal is not rectangular");
		if (n == 0 && !l->shape_set)
			l->shape_set = true;
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			enum dg_status st = scan(e, depth + 1, l, err);
			if (st != DG_OK)
				return st;
		}
		return DG_OK;
	}
	/* A leaf fixes the rank at this depth. */
	if (!l->shape_set) {
		l->shape.ndim = depth;
		l->shape_set = true;
	} else if (l->shape.ndim != depth) {
		return dg_err_set(err, DG_ESHAPE, "tensor literal is not rectangular");
	}
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);
		if (x < INT32_MIN || x > INT32_MAX)
			l->big_int = true;
		l->any_num = true;
	} else if (json_is_real(v)) {
		l->any_real = true;
		l->any_num = true;
	} else if (json_is_boolean(v)) {
		l->any_bool = true;
	} else if (json_is_string(v)) {
		double d;
		if (!special_value(json_string_value(v), &d)) {
			dg_err_set(err, DG_EINVAL,
				   "tensor literal has the string \"%.32s\" where a number belongs",
				   json_string_value(v));
			dg_err_hint(err, "only \"nan\", \"inf\" and \"-inf\" may be written as "
					 "strings");
			return DG_EINVAL;
		}
		l->any_real = true;
		l->any_num = true;
	} else {
		return dg_err_set(err, DG_EINVAL, "tensor literal has a JSON %s where a number "
						  "belongs", dg_json_kind(v, false));
	}
	return DG_OK;
}

/* Store leaf values in C order. Integers go through int64 to stay exact. */
static enum dg_status fill(const json_t *v, struct dg_tensor *t, int64_t *pos, struct dg_err *err)
{
	if (json_is_array(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			enum dg_status st = fill(e, t, pos, err);
			if (st != DG_OK)
				return st;
		}
		return DG_OK;
	}
	int64_t i = (*pos)++;
	if (i >= t->numel)
		return dg_err_set(err, DG_ESHAPE, "tensor literal has more values than its shape holds");
	double d = 0;
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);
		switch (t->dtype) {
		case DG_I64: ((int64_t *)t->data)[i] = x; return DG_OK;
		case DG_I32:
			if (x < INT32_MIN || x > INT32_MAX)
				return dg_err_set(err, DG_EINVAL, "value %lld does not fit int32", (long long)x);
			((int32_t *)t->data)[i] = (int32_t)x;
			return DG_OK;
		case DG_U8:
			if (x < 0 || x > 255)
				return dg_err_set(err, DG_EINVAL, "value %lld does not fit uint8", (long long)x);
			((uint8_t *)t->data)[i] = (uint8_t)x;
			return DG_OK;
		default: d = (double)x; break;
		}
	} else if (json_is_boolean(v)) {
		d = json_is_true(v);
	} else if (json_is_string(v)) {
		special_value(json_string_value(v), &d);   /* scan() accepted it */
	} else {
		d = json_real_value(v);
	}
	if (dg_dtype_is_int(t->dtype)) {
		if (!(d == floor(d)) || (t->dtype == DG_U8 && (d < 0 || d > 255)) ||
		    (t->dtype == DG_I32 && (d < INT32_MIN || d > INT32_MAX)) ||
		    (t->dtype == DG_I64 && (d < -9.2e18 || d > 9.2e18))) {
			return dg_err_set(err, DG_EINVAL, "value %g is not a valid %s", d,
					  dg_dtype_name(t->dtype));
		}
	}
	dg_tensor_set_f64(t, i, d);
	return DG_OK;
}

struct dg_tensor *dg_json_to_tensor(const json_t *v, const enum dg_dtype *dt, struct dg_err *err)
{
	struct lit l = { .shape = { .ndim = 0 } };
	const json_t *vals = v;
	enum dg_dtype want;
	struct dg_tensor *t = NULL;
	int64_t pos = 0;
	struct dg_shape declared;
	bool has_declared = false;

	if (json_is_object(v)) {
		json_t *jd = json_object_get(v, "dtype");
		const char *key;
		json_t *x;
		json_object_foreach((json_t *)v, key, x) {
			if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "value")) {
				dg_err_set(err, DG_EINVAL, "tensor object has unknown key '%.64s'",
					   key);
				dg_err_hint(err, "a tensor object has the keys \"dtype\", "
						 "\"shape\" and \"value\"");
				return NULL;
			}
		}
		vals = json_object_get(v, "value");
		if (!vals) {
			dg_err_set(err, DG_EINVAL, "tensor object needs a \"value\"");
			return NULL;
		}
		if (jd) {
			if (dg_attr_dtype(v, "dtype", NULL, &want, err) != DG_OK)
				return NULL;
			dt = &want;
		}
		if (json_object_get(v, "shape")) {
			if (dg_attr_shape(v, "shape", true, false, &declared, err) != DG_OK)
				return NULL;
			has_declared = true;
		}
	}
	if (scan(vals, 0, &l, err) != DG_OK)
		return NULL;
	if (dt) {
		want = *dt;
	} else if (l.any_real) {
		want = DG_F32;
	} else if (l.any_bool && !l.any_num) {
		want = DG_BOOL;
	} else {
		want = l.big_int ? DG_I64 : DG_I32;
	}
	if (l.any_bool && l.any_num) {
		dg_err_set(err, DG_EINVAL, "tensor literal mixes booleans and numbers");
		return NULL;
	}
	struct dg_shape shape = l.shape;
	if (has_declared) {
		int64_t want_n, have_n;
		if (dg_shape_numel(&declared, &want_n, err) != DG_OK ||
		    dg_shape_numel(&l.shape, &have_n, err) != DG_OK)
			return NULL;
		if (l.shape.ndim == 0) {
			have_n = want_n;   /* a scalar value fills the whole declared shape */
		} else if (want_n != have_n) {
			char a[128], b[128];
			dg_shape_format(&declared, a, sizeof a);
			dg_shape_format(&l.shape, b, sizeof b);
			dg_err_set(err, DG_ESHAPE, "tensor literal of shape %s holds %lld values, not the %lld of shape %s",
				   b, (long long)have_n, (long long)want_n, a);
			return NULL;
		}
		shape = declared;
	}
	t = dg_tensor_new(want, &shape, err);
	if (!t)
		return NULL;
	if (has_declared && l.shape.ndim == 0) {
		/* Broadcast one value over the declared shape. */
		struct dg_shape one = { .ndim = 0 };
		struct dg_tensor *s = dg_tensor_new(want, &one, err);
		if (!s || fill(vals, s, &pos, err) != DG_OK) {
			dg_tensor_free(s);
			dg_tensor_free(t);
			return NULL;
		}
		size_t es = dg_dtype_size(want);
		for (int64_t i = 0; i < t->numel; i++)
			memcpy((char *)t->data + (size_t)i * es, s->data, es);
		dg_tensor_free(s);
		return t;
	}
	if (fill(vals, t, &pos, err) != DG_OK) {
		dg_tensor_free(t);
		return NULL;
	}
	return t;
}

static json_t *to_json_rec(const struct dg_tensor *t, int d, int64_t *pos)
{
	if (d == t->shape.ndim) {
		int64_t i = (*pos)++;
		switch (t->dtype) {
		case DG_I32: return json_integer(((const int32_t *)t->data)[i]);
		case DG_I64: return json_integer(((const int64_t *)t->data)[i]);
		case DG_U8: return json_integer(((const uint8_t *)t->data)[i]);
		case DG_BOOL: return json_boolean(((const uint8_t *)t->data)[i]);
		default: {
			double x = dg_tensor_get_f64(t, i);
			if (isnan(x))
				return json_string("nan");
			if (isinf(x))
				return json_string(x > 0 ? "inf" : "-inf");
			return json_real(x);
		}
		}
	}
	json_t *a = json_array();
	for (int64_t k = 0; a && k < t->shape.dim[d]; k++)
		json_array_append_new(a, to_json_rec(t, d + 1, pos));
	return a;
}

json_t *dg_tensor_to_json(const struct dg_tensor *t)
{
	int64_t pos = 0;

	return to_json_rec(t, 0, &pos);
}

static bool kind_ok(enum dg_attr_kind k, const json_t *v)
{
	switch (k) {
	case DG_ATTR_INT: return json_is_integer(v);
	case DG_ATTR_FLOAT: return json_is_number(v);
	case DG_ATTR_BOOL: return json_is_boolean(v);
	case DG_ATTR_STRING:
	case DG_ATTR_DTYPE: return json_is_string(v);
	case DG_ATTR_INTS: return json_is_array(v);
	case DG_ATTR_SHAPE: return json_is_array(v) || json_is_null(v);
	case DG_ATTR_TENSOR: return true;
	case DG_ATTR_AXES: return json_is_integer(v) || json_is_array(v) || json_is_null(v);
	case DG_ATTR_JSON: return true;
	}
	return false;
}

static const char *kind_name(enum dg_attr_kind k)
{
	static const char *const names[] = {
		"an integer", "a number", "true or false", "a string", "an array of integers",
		"a dtype name", "an array of sizes", "a tensor literal",
		"an integer, an array of integers or null", "JSON",
	};
	return names[k];
}

enum dg_status dg_attr_validate(const struct dg_op_def *op, const json_t *attrs,
				struct dg_err *err)
{
	const char *key;
	json_t *v;

	if (attrs && !json_is_object(attrs))
		return dg_err_set(err, DG_EINVAL, "attrs must be a JSON object, got %s",
				  dg_json_kind(attrs, false));
	json_object_foreach((json_t *)attrs, key, v) {
		const struct dg_attr_spec *s = op->attrs;
		while (s && s->name && strcmp(s->name, key) != 0)
			s++;
		if (!s || !s->name) {
			dg_err_set(err, DG_EINVAL, "%s has no attr '%.64s'", op->name, key);
			if (op->attrs && op->attrs[0].name) {
				char list[140] = "";
				size_t len = 0;
				for (s = op->attrs; s->name && len < sizeof list - 1; s++)
					len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
								len ? ", " : "", s->name);
				dg_err_hint(err, "its attrs are: %s", list);
			} else {
				dg_err_hint(err, "%s takes no attrs", op->name);
			}
			return DG_EINVAL;
		}
		if (!kind_ok(s->kind, v))
			return wrong(key, kind_name(s->kind), v, err);
	}
	for (const struct dg_attr_spec *s = op->attrs; s && s->name; s++)
		if (s->required && !get(attrs, s->name))
			return missing(s->name, err);
	return DG_OK;
}

/* --- parsed attrs ---------------------------------------------------------- */

enum slot_tag { T_OTHER, T_INT, T_REAL, T_BOOL, T_STRING, T_INTS };

struct slot {
	const char *key;                /* borrowed from the object */
	enum slot_tag tag;
	bool is_dtype;                  /* a string naming a dtype: dt holds it */
	enum dg_dtype dt;
	union {
		int64_t i;
		double f;
		bool b;
		const char *s;
		struct {
			const int64_t *v;       /* into the table's block */
			int n;
		} ints;
	} u;
};

struct dg_attr_table {
	json_t *json;                   /* owned reference; NULL for no attrs */
	int n;
	struct slot slot[];             /* then the integers of the T_INTS slots */
};

/* Integers of an array whose elements are all JSON integers, or -1. */
static int int_array_len(const json_t *v)
{
	size_t i;
	json_t *e;

	if (!json_is_array(v) || json_array_size(v) > (size_t)DG_MAX_INPUTS)
		return -1;
	json_array_foreach(v, i, e)
		if (!json_is_integer(e))
			return -1;
	return (int)json_array_size(v);
}

static void fill_slot(struct slot *sl, const char *key, const json_t *v, int64_t **ints)
{
	int n;

	sl->key = key;
	if (json_is_integer(v)) {
		sl->tag = T_INT;
		sl->u.i = json_integer_value(v);
	} else if (json_is_real(v)) {
		sl->tag = T_REAL;
		sl->u.f = json_real_value(v);
	} else if (json_is_boolean(v)) {
		sl->tag = T_BOOL;
		sl->u.b = json_is_true(v);
	} else if (json_is_string(v)) {
		sl->tag = T_STRING;
		sl->u.s = json_string_value(v);
		sl->is_dtype = dg_dtype_parse(sl->u.s, &sl->dt, NULL) == DG_OK;
	} else if ((n = int_array_len(v)) >= 0) {
		sl->tag = T_INTS;
		sl->u.ints.v = *ints;
		sl->u.ints.n = n;
		for (int k = 0; k < n; k++)
			(*ints)[k] = json_integer_value(json_array_get(v, (size_t)k));
		*ints += n;
	} else {
		sl->tag = T_OTHER;      /* null, objects, mixed arrays: read as JSON */
	}
}

struct dg_attr_table *dg_attr_table_new(const json_t *attrs, struct dg_err *err)
{
	struct dg_attr_table *t;
	size_t n = 0, n_ints = 0;
	const char *key;
	json_t *v;
	int64_t *ints;

	if (attrs && !json_is_object(attrs)) {
		dg_err_set(err, DG_EINVAL, "attrs must be a JSON object, got %s",
			   dg_json_kind(attrs, false));
		return NULL;
	}
	if (attrs) {
		json_object_foreach((json_t *)attrs, key, v) {
			int k = int_array_len(v);
			n++;
			n_ints += k > 0 ? (size_t)k : 0;
		}
	}
	/* One block: header, slots, then the integers (int64_t is no more
	 * aligned than the slots' union). */
	t = calloc(1, sizeof *t + n * sizeof t->slot[0] + n_ints * sizeof(int64_t));
	if (!t) {
		dg_err_set(err, DG_ENOMEM, "no memory for %zu attrs", n);
		return NULL;
	}
	t->json = attrs ? json_incref((json_t *)attrs) : NULL;
	ints = (int64_t *)(t->slot + n);
	if (attrs) {
		json_object_foreach((json_t *)attrs, key, v)
			fill_slot(&t->slot[t->n++], key, v, &ints);
	}
	return t;
}

void dg_attr_table_free(struct dg_attr_table *t)
{
	if (!t)
		return;
	json_decref(t->json);
	free(t);
}

struct dg_attrs dg_attr_table_view(const struct dg_attr_table *t)
{
	struct dg_attrs a = { .tab = t, .json = t ? t->json : NULL };

	return a;
}

struct dg_attrs dg_attrs_of_json(const json_t *attrs)
{
	struct dg_attrs a = { .tab = NULL, .json = attrs };

	return a;
}

/* The slot of key; NULL when absent (or no table). Linear: a node has a few
 * attrs (VarApply, the most, has 17), and keys are short. */
static const struct slot *find(struct dg_attrs a, const char *key)
{
	for (int i = 0; a.tab && i < a.tab->n; i++)
		if (strcmp(a.tab->slot[i].key, key) == 0)
			return &a.tab->slot[i];
	return NULL;
}

/* Each accessor answers the common case (present with the expected kind, or
 * absent with a default) from the slot and hands every other case to the JSON
 * accessor, whose messages are the reference. */
enum dg_status dg_attrs_int(struct dg_attrs a, const char *key, const int64_t *def,
			    int64_t *out, struct dg_err *err)
{
	const struct slot *s = find(a, key);

	if (s && s->tag == T_INT) {
		*out = s->u.i;
		return DG_OK;
	}
	if (a.tab && !s && def) {
		*out = *def;
		return DG_OK;
	}
	return dg_attr_int(a.json, key, def, out, err);
}

enum dg_status dg_attrs_float(struct dg_attrs a, const char *key, const double *def,
			      double *out, struct dg_err *err)
{
	const struct slot *s = find(a, key);

	if (s && (s->tag == T_REAL || s->tag == T_INT)) {
		*out = s->tag == T_REAL ? s->u.f : (double)s->u.i;
		return DG_OK;
	}
	if (a.tab && !s && def) {
		*out = *def;
		return DG_OK;
	}
	return dg_attr_float(a.json, key, def, out, err);
}

enum dg_status dg_attrs_bool(struct dg_attrs a, const char *key, const bool *def, bool *out,
			     struct dg_err *err)
{
	const struct slot *s = find(a, key);

	if (s && s->tag == T_BOOL) {
		*out = s->u.b;
		return DG_OK;
	}
	if (a.tab && !s && def) {
		*out = *def;
		return DG_OK;
	}
	return dg_attr_bool(a.json, key, def, out, err);
}

enum dg_status dg_attrs_string(struct dg_attrs a, const char *key, const char *def,
			       const char **out, struct dg_err *err)
{
	const struct slot *s = find(a, key);

	if (s && s->tag == T_STRING) {
		*out = s->u.s;
		return DG_OK;
	}
	if (a.tab && !s && def) {
		*out = def;
		return DG_OK;
	}
	return dg_attr_string(a.json, key, def, out, err);
}

enum dg_status dg_attrs_ints(struct dg_attrs a, const char *key, bool required, int64_t *out,
			     int max, int *n, struct dg_err *err)
{
	const struct slot *s = find(a, key);

	if (s && s->tag == T_INTS && s->u.ints.n <= max) {
		memcpy(out, s->u.ints.v, (size_t)s->u.ints.n * sizeof *out);
		*n = s->u.ints.n;
		return DG_OK;
	}
	if (a.tab && !s && !required) {
		*n = 0;
		return DG_OK;
	}
	return dg_attr_ints(a.json, key, required, out, max, n, err);
}

enum dg_status dg_attrs_dtype(struct dg_attrs a, const char *key, const enum dg_dtype *def,
			      enum dg_dtype *out, struct dg_err *err)
{
	const struct slot *s = find(a, key);

	if (s && s->tag == T_STRING && s->is_dtype) {
		*out = s->dt;
		return DG_OK;
	}
	if (a.tab && !s && def) {
		*out = *def;
		return DG_OK;
	}
	return dg_attr_dtype(a.json, key, def, out, err);
}

enum dg_status dg_attrs_shape(struct dg_attrs a, const char *key, bool required,
			      bool allow_unknown, struct dg_shape *out, struct dg_err *err)
{
	const struct slot *s = find(a, key);
	bool plain = s && s->tag == T_INTS && s->u.ints.n <= DG_MAX_DIMS;
	int64_t numel;

	/* Fully known sizes are the common case; -1s, null and the errors go
	 * through the JSON accessor. */
	for (int i = 0; plain && i < s->u.ints.n; i++)
		plain = s->u.ints.v[i] >= 0;
	if (plain) {
		*out = dg_shape_make(s->u.ints.n, s->u.ints.v);
		if (dg_shape_numel(out, &numel, NULL) == DG_OK)
			return DG_OK;
	}
	return dg_attr_shape(a.json, key, required, allow_unknown, out, err);
}

const json_t *dg_attrs_get(struct dg_attrs a, const char *key)
{
	return get(a.json, key);
}
