/* Node attributes (core/src/attr.c): every typed accessor (present, default,
 * missing, wrong kind), JSON tensor literals in all their forms and their
 * refusals, the tensor -> JSON inverse, and checking attrs against an op's
 * schema. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dg/op.h"

/* Parse a JSON text the test wrote; it must be valid. */
static json_t *J(const char *text)
{
	json_error_t e;
	json_t *v = json_loads(text, JSON_DECODE_ANY, &e);

	cr_assert_not_null(v, "bad test JSON '%s': %s", text, e.text);
	return v;
}

static void assert_err(enum dg_status st, enum dg_status code, const struct dg_err *err,
		       const char *want)
{
	cr_assert_eq(st, code, "status %s (%s), wanted %s", dg_status_name(st), err->msg,
		     dg_status_name(code));
	cr_assert_not_null(strstr(err->msg, want), "message '%s' lacks '%s'", err->msg, want);
}

/* --- accessors ------------------------------------------------------------------- */

Test(attr, int_reads_value_default_missing_and_wrong_kind)
{
	json_t *a = J("{\"axis\": -2, \"name\": \"x\", \"big\": 9007199254740993}");
	struct dg_err err = { 0 };
	int64_t v = 0, def = 7;

	cr_assert_eq(dg_attr_int(a, "axis", NULL, &v, &err), DG_OK);
	cr_assert_eq(v, -2);
	cr_assert_eq(dg_attr_int(a, "big", NULL, &v, &err), DG_OK);
	cr_assert_eq(v, 9007199254740993LL, "integers stay exact past 2^53");
	cr_assert_eq(dg_attr_int(a, "keep_dims", &def, &v, &err), DG_OK);
	cr_assert_eq(v, 7);
	cr_assert_eq(dg_attr_int(NULL, "keep_dims", &def, &v, &err), DG_OK);
	assert_err(dg_attr_int(a, "depth", NULL, &v, &err), DG_EINVAL, &err,
		   "missing required attr 'depth'");
	assert_err(dg_attr_int(a, "name", NULL, &v, &err), DG_EINVAL, &err,
		   "attr 'name' must be an integer, got string");
	json_t *f = J("{\"axis\": 1.0}");
	assert_err(dg_attr_int(f, "axis", &def, &v, &err), DG_EINVAL, &err,
		   "must be an integer, got number");
	json_decref(f);
	json_decref(a);
}

Test(attr, float_accepts_integers_and_refuses_other_kinds)
{
	json_t *a = J("{\"alpha\": 0.25, \"beta\": 3, \"s\": \"x\", \"t\": true}");
	struct dg_err err = { 0 };
	double v = 0, def = -1.5;

	cr_assert_eq(dg_attr_float(a, "alpha", NULL, &v, &err), DG_OK);
	cr_assert_float_eq(v, 0.25, 0);
	cr_assert_eq(dg_attr_float(a, "beta", NULL, &v, &err), DG_OK);
	cr_assert_float_eq(v, 3.0, 0);
	cr_assert_eq(dg_attr_float(a, "gamma", &def, &v, &err), DG_OK);
	cr_assert_float_eq(v, -1.5, 0);
	assert_err(dg_attr_float(a, "gamma", NULL, &v, &err), DG_EINVAL, &err,
		   "missing required attr 'gamma'");
	assert_err(dg_attr_float(a, "s", NULL, &v, &err), DG_EINVAL, &err,
		   "attr 's' must be a number, got string");
	assert_err(dg_attr_float(a, "t", NULL, &v, &err), DG_EINVAL, &err, "got bool");
	json_decref(a);
}

Test(attr, bool_reads_true_false_and_refuses_numbers)
{
	json_t *a = J("{\"on\": true, \"off\": false, \"one\": 1}");
	struct dg_err err = { 0 };
	bool v = false, def = true;

	cr_assert_eq(dg_attr_bool(a, "on", NULL, &v, &err), DG_OK);
	cr_assert(v);
	cr_assert_eq(dg_attr_bool(a, "off", NULL, &v, &err), DG_OK);
	cr_assert_not(v);
	cr_assert_eq(dg_attr_bool(a, "missing", &def, &v, &err), DG_OK);
	cr_assert(v);
	assert_err(dg_attr_bool(a, "missing", NULL, &v, &err), DG_EINVAL, &err,
		   "missing required attr 'missing'");
	assert_err(dg_attr_bool(a, "one", NULL, &v, &err), DG_EINVAL, &err,
		   "attr 'one' must be true or false, got integer");
	json_decref(a);
}

Test(attr, string_is_borrowed_from_the_attrs)
{
	json_t *a = J("{\"padding\": \"SAME\", \"n\": null}");
	struct dg_err err = { 0 };
	const char *v = NULL;

	cr_assert_eq(dg_attr_string(a, "padding", NULL, &v, &err), DG_OK);
	cr_assert_str_eq(v, "SAME");
	cr_assert_eq(v, json_string_value(json_object_get(a, "padding")));
	cr_assert_eq(dg_attr_string(a, "data_format", "NHWC", &v, &err), DG_OK);
	cr_assert_str_eq(v, "NHWC");
	assert_err(dg_attr_string(a, "data_format", NULL, &v, &err), DG_EINVAL, &err,
		   "missing required attr 'data_format'");
	assert_err(dg_attr_string(a, "n", NULL, &v, &err), DG_EINVAL, &err,
		   "attr 'n' must be a string, got null");
	json_decref(a);
}

Test(attr, ints_reads_arrays_up_to_a_maximum)
{
	json_t *a = J("{\"perm\": [1, 0, 2], \"bad\": [1, \"x\"], \"long\": [1,2,3,4,5], "
		      "\"scalar\": 3}");
	struct dg_err err = { 0 };
	int64_t v[4] = { 0 };
	int n = -1;

	cr_assert_eq(dg_attr_ints(a, "perm", true, v, 4, &n, &err), DG_OK);
	cr_assert_eq(n, 3);
	cr_assert(v[0] == 1 && v[1] == 0 && v[2] == 2);
	cr_assert_eq(dg_attr_ints(a, "axes", false, v, 4, &n, &err), DG_OK);
	cr_assert_eq(n, 0);
	assert_err(dg_attr_ints(a, "axes", true, v, 4, &n, &err), DG_EINVAL, &err,
		   "missing required attr 'axes'");
	assert_err(dg_attr_ints(a, "bad", true, v, 4, &n, &err), DG_EINVAL, &err,
		   "attr 'bad'[1] must be an integer, got string");
	assert_err(dg_attr_ints(a, "long", true, v, 4, &n, &err), DG_EINVAL, &err,
		   "has 5 entries; at most 4 allowed");
	assert_err(dg_attr_ints(a, "scalar", true, v, 4, &n, &err), DG_EINVAL, &err,
		   "must be an array of integers, got integer");
	json_decref(a);
}

Test(attr, dtype_parses_names_and_names_the_attr_on_failure)
{
	json_t *a = J("{\"T\": \"float64\", \"S\": \"i8\", \"U\": \"float8\", \"V\": 1}");
	struct dg_err err = { 0 };
	enum dg_dtype v, def = DG_BOOL;

	cr_assert_eq(dg_attr_dtype(a, "T", NULL, &v, &err), DG_OK);
	cr_assert_eq(v, DG_F64);
	cr_assert_eq(dg_attr_dtype(a, "S", NULL, &v, &err), DG_OK);
	cr_assert_eq(v, DG_I64);
	cr_assert_eq(dg_attr_dtype(a, "W", &def, &v, &err), DG_OK);
	cr_assert_eq(v, DG_BOOL);
	assert_err(dg_attr_dtype(a, "U", NULL, &v, &err), DG_EDTYPE, &err,
		   "attr 'U': unknown dtype 'float8'");
	cr_assert_not_null(strstr(err.hint, "float32"), "%s", err.hint);
	assert_err(dg_attr_dtype(a, "V", NULL, &v, &err), DG_EINVAL, &err,
		   "attr 'V' must be a dtype name, got integer");
	assert_err(dg_attr_dtype(a, "W", NULL, &v, &err), DG_EINVAL, &err,
		   "missing required attr 'W'");
	json_decref(a);
}

Test(attr, shape_reads_known_partial_and_unknown_shapes)
{
	json_t *a = J("{\"s\": [2, 3], \"p\": [-1, 3], \"u\": null, \"e\": []}");
	struct dg_err err = { 0 };
	struct dg_shape s;

	cr_assert_eq(dg_attr_shape(a, "s", true, false, &s, &err), DG_OK);
	cr_assert(s.ndim == 2 && s.dim[0] == 2 && s.dim[1] == 3);
	cr_assert_eq(dg_attr_shape(a, "e", true, false, &s, &err), DG_OK);
	cr_assert_eq(s.ndim, 0);
	cr_assert_eq(dg_attr_shape(a, "p", true, true, &s, &err), DG_OK);
	cr_assert(s.ndim == 2 && s.dim[0] == -1 && s.dim[1] == 3);
	cr_assert_eq(dg_attr_shape(a, "u", true, true, &s, &err), DG_OK);
	cr_assert_eq(s.ndim, -1);
	cr_assert_eq(dg_attr_shape(a, "missing", false, true, &s, &err), DG_OK);
	cr_assert_eq(s.ndim, -1);
	json_decref(a);
}

Test(attr, shape_refuses_what_it_cannot_hold)
{
	json_t *a = J("{\"p\": [-1, 3], \"m\": [2, -2], \"u\": null, \"n\": [1,1,1,1,1,1,1,1,1],"
		      " \"big\": [2147483648, 2147483648, 2147483648], \"x\": [2, \"3\"]}");
	struct dg_err err = { 0 };
	struct dg_shape s;

	assert_err(dg_attr_shape(a, "p", true, false, &s, &err), DG_EINVAL, &err,
		   "attr 'p' has invalid size -1 at 0");
	assert_err(dg_attr_shape(a, "m", true, true, &s, &err), DG_EINVAL, &err,
		   "invalid size -2 at 1");
	assert_err(dg_attr_shape(a, "u", true, false, &s, &err), DG_EINVAL, &err,
		   "attr 'u' must be an array of sizes, got null");
	assert_err(dg_attr_shape(a, "n", true, false, &s, &err), DG_EINVAL, &err,
		   "has 9 dimensions; at most 8 allowed");
	assert_err(dg_attr_shape(a, "big", true, false, &s, &err), DG_ETOOLARGE, &err,
		   "attr 'big': shape [2147483648,");
	assert_err(dg_attr_shape(a, "x", true, false, &s, &err), DG_EINVAL, &err,
		   "attr 'x'[1] must be an integer");
	assert_err(dg_attr_shape(a, "missing", true, true, &s, &err), DG_EINVAL, &err,
		   "missing required attr 'missing'");
	assert_err(dg_attr_shape(a, "missing", false, false, &s, &err), DG_EINVAL, &err,
		   "missing required attr 'missing'");
	json_decref(a);
}

/* --- JSON tensor literals ----------------------------------------------------------- */

/* Decode a literal (dt may be NULL); NULL result leaves the error in err. */
static struct dg_tensor *lit(const char *text, const enum dg_dtype *dt, struct dg_err *err)
{
	json_t *v = J(text);
	struct dg_tensor *t;

	dg_err_clear(err);
	t = dg_json_to_tensor(v, dt, err);
	json_decref(v);
	return t;
}

static void assert_lit_refused(const char *text, const enum dg_dtype *dt, enum dg_status code,
			       const char *want)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = lit(text, dt, &err);

	cr_assert_null(t, "accepted %s", text);
	assert_err(err.code, code, &err, want);
}

Test(attr, literal_scalars_pick_their_dtype)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t;

	t = lit("5", NULL, &err);
	cr_assert(t && t->dtype == DG_I32 && t->shape.ndim == 0 && ((int32_t *)t->data)[0] == 5);
	dg_tensor_free(t);
	t = lit("3.5", NULL, &err);
	cr_assert(t && t->dtype == DG_F32 && ((float *)t->data)[0] == 3.5f);
	dg_tensor_free(t);
	t = lit("1e2", NULL, &err);
	cr_assert(t && t->dtype == DG_F32 && ((float *)t->data)[0] == 100.0f);
	dg_tensor_free(t);
	t = lit("true", NULL, &err);
	cr_assert(t && t->dtype == DG_BOOL && ((uint8_t *)t->data)[0] == 1);
	dg_tensor_free(t);
	t = lit("-9223372036854775808", NULL, &err);
	cr_assert(t && t->dtype == DG_I64 && ((int64_t *)t->data)[0] == INT64_MIN);
	dg_tensor_free(t);
	enum dg_dtype f64 = DG_F64;
	t = lit("7", &f64, &err);
	cr_assert(t && t->dtype == DG_F64 && ((double *)t->data)[0] == 7.0);
	dg_tensor_free(t);
}

Test(attr, literal_nested_arrays_give_their_shape)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = lit("[[1, 2, 3], [4, 5, 6]]", NULL, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_I32);
	cr_assert(t->shape.ndim == 2 && t->shape.dim[0] == 2 && t->shape.dim[1] == 3);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(((int32_t *)t->data)[i], i + 1);
	dg_tensor_free(t);
	t = lit("[[1.5], [2]]", NULL, &err);
	cr_assert(t && t->dtype == DG_F32 && t->shape.dim[0] == 2 && t->shape.dim[1] == 1);
	cr_assert_float_eq(((float *)t->data)[1], 2.0f, 0);
	dg_tensor_free(t);
	t = lit("[[[[[[[[1]]]]]]]]", NULL, &err);
	cr_assert(t && t->shape.ndim == 8);
	dg_tensor_free(t);
	t = lit("[]", NULL, &err);
	cr_assert(t && t->shape.ndim == 1 && t->shape.dim[0] == 0 && t->numel == 0);
	dg_tensor_free(t);
	t = lit("[[], []]", NULL, &err);
	cr_assert(t && t->shape.ndim == 2 && t->shape.dim[0] == 2 && t->shape.dim[1] == 0);
	dg_tensor_free(t);
	t = lit("[true, false]", NULL, &err);
	cr_assert(t && t->dtype == DG_BOOL && ((uint8_t *)t->data)[1] == 0);
	dg_tensor_free(t);
	t = lit("[1, 3000000000]", NULL, &err);
	cr_assert(t && t->dtype == DG_I64 && ((int64_t *)t->data)[1] == 3000000000LL);
	dg_tensor_free(t);
}

Test(attr, ragged_and_mixed_literals_are_refused)
{
	assert_lit_refused("[[1, 2], [3]]", NULL, DG_ESHAPE, "not rectangular");
	assert_lit_refused("[[1], 2]", NULL, DG_ESHAPE, "not rectangular");
	assert_lit_refused("[1, [2]]", NULL, DG_ESHAPE, "not rectangular");
	assert_lit_refused("[[], [1]]", NULL, DG_ESHAPE, "not rectangular");
	assert_lit_refused("[[1], []]", NULL, DG_ESHAPE, "not rectangular");
	assert_lit_refused("[[[[[[[[[1]]]]]]]]]", NULL, DG_EINVAL, "deeper than 8");
	assert_lit_refused("[true, 1]", NULL, DG_EINVAL, "mixes booleans and numbers");
	assert_lit_refused("[1, null]", NULL, DG_EINVAL, "a JSON null where a number belongs");
	assert_lit_refused("[1, {\"a\": 1}]", NULL, DG_EINVAL, "a JSON object where");
	assert_lit_refused("[\"hello\"]", NULL, DG_EINVAL, "the string \"hello\"");
}

Test(attr, literal_strings_spell_nan_and_infinities)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = lit("[\"nan\", \"inf\", \"-inf\", \"+inf\", \"NaN\", \"Infinity\", "
				  "\"-Infinity\", 1]", NULL, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_F32);
	const float *f = t->data;
	cr_assert(isnan(f[0]) && isnan(f[4]));
	cr_assert(f[1] == INFINITY && f[3] == INFINITY && f[5] == INFINITY);
	cr_assert(f[2] == -INFINITY && f[6] == -INFINITY);
	cr_assert_eq(f[7], 1.0f);
	dg_tensor_free(t);
	enum dg_dtype i32 = DG_I32;
	assert_lit_refused("[\"nan\"]", &i32, DG_EINVAL, "is not a valid int32");
	assert_lit_refused("[\"inf\"]", &i32, DG_EINVAL, "is not a valid int32");
	assert_lit_refused("\"-nan\"", NULL, DG_EINVAL, "the string");
}

Test(attr, literal_ints_out_of_range_for_the_dtype_are_refused)
{
	enum dg_dtype i32 = DG_I32, u8 = DG_U8, i64 = DG_I64;

	assert_lit_refused("[1, 3000000000]", &i32, DG_EINVAL,
			   "value 3000000000 does not fit int32");
	assert_lit_refused("[256]", &u8, DG_EINVAL, "value 256 does not fit uint8");
	assert_lit_refused("-1", &u8, DG_EINVAL, "value -1 does not fit uint8");
	assert_lit_refused("[2.5]", &i32, DG_EINVAL, "value 2.5 is not a valid int32");
	assert_lit_refused("1e300", &i64, DG_EINVAL, "is not a valid int64");
	assert_lit_refused("{\"dtype\": \"uint8\", \"value\": [1, 300]}", NULL, DG_EINVAL,
			   "value 300 does not fit uint8");

	struct dg_err err = { 0 };
	struct dg_tensor *t = lit("[0, 255, 4.0]", &u8, &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert(((uint8_t *)t->data)[1] == 255 && ((uint8_t *)t->data)[2] == 4);
	dg_tensor_free(t);
}

Test(attr, literal_objects_declare_dtype_and_shape)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = lit("{\"dtype\": \"float64\", \"shape\": [2, 2], "
				  "\"value\": [1, 2, 3, 4]}", NULL, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_F64);
	cr_assert(t->shape.ndim == 2 && t->shape.dim[1] == 2);
	cr_assert_float_eq(((double *)t->data)[3], 4.0, 0);
	dg_tensor_free(t);
	t = lit("{\"shape\": [3, 1], \"value\": [[1], [2], [3]]}", NULL, &err);
	cr_assert(t && t->dtype == DG_I32 && t->shape.dim[0] == 3);
	dg_tensor_free(t);
	t = lit("{\"dtype\": \"bool\", \"value\": [1, 0]}", NULL, &err);
	cr_assert(t && t->dtype == DG_BOOL && ((uint8_t *)t->data)[0] == 1);
	dg_tensor_free(t);
	assert_lit_refused("{\"shape\": [2, 2], \"value\": [1, 2, 3]}", NULL, DG_ESHAPE,
			   "holds 3 values, not the 4 of shape [2,2]");
	assert_lit_refused("{\"dtype\": \"float32\"}", NULL, DG_EINVAL, "needs a \"value\"");
	assert_lit_refused("{\"dtype\": \"complex\", \"value\": 1}", NULL, DG_EDTYPE,
			   "attr 'dtype': unknown dtype 'complex'");
	assert_lit_refused("{\"shape\": [-1], \"value\": 1}", NULL, DG_EINVAL, "invalid size -1");
	assert_lit_refused("{\"dtype\": \"int32\", \"valu\": 1}", NULL, DG_EINVAL,
			   "unknown key 'valu'");
}

Test(attr, literal_scalar_value_fills_the_declared_shape)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = lit("{\"dtype\": \"float32\", \"shape\": [2, 3], \"value\": 0.5}",
				  NULL, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->numel, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(((float *)t->data)[i], 0.5f, 0);
	dg_tensor_free(t);
	t = lit("{\"shape\": [0, 4], \"value\": 7}", NULL, &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert(t->numel == 0 && t->shape.dim[1] == 4);
	dg_tensor_free(t);
	assert_lit_refused("{\"dtype\": \"uint8\", \"shape\": [2], \"value\": -3}", NULL, DG_EINVAL,
			   "does not fit uint8");
}

Test(attr, tensors_become_nested_json_and_come_back_identical)
{
	int64_t d[] = { 2, 3 };
	struct dg_shape s = dg_shape_make(2, d);
	float f[6] = { 0.1f, -2.5f, NAN, INFINITY, -INFINITY, FLT_MAX };
	struct dg_tensor *t = dg_tensor_from_data(DG_F32, &s, f, NULL);
	json_t *j = dg_tensor_to_json(t);
	char *text = json_dumps(j, JSON_COMPACT);

	cr_assert_not_null(strstr(text, "-2.5,\"nan\"]"), "%s", text);
	cr_assert_not_null(strstr(text, "[\"inf\",\"-inf\","), "%s", text);
	cr_assert_eq(text[0], '[');
	cr_assert_eq(text[1], '[');
	enum dg_dtype f32 = DG_F32;
	struct dg_err err = { 0 };
	struct dg_tensor *r = dg_json_to_tensor(j, &f32, &err);
	cr_assert_not_null(r, "%s", err.msg);
	cr_assert(dg_shape_eq(&r->shape, &t->shape));
	const float *g = r->data;
	cr_assert(g[0] == 0.1f && g[1] == -2.5f && isnan(g[2]) && g[3] == INFINITY);
	cr_assert(g[4] == -INFINITY && g[5] == f[5]);
	free(text);
	json_decref(j);
	dg_tensor_free(r);
	dg_tensor_free(t);
}

Test(attr, integer_and_bool_tensors_become_exact_json)
{
	int64_t d[] = { 3 };
	struct dg_shape s = dg_shape_make(1, d);
	int64_t l[3] = { INT64_MIN, INT64_MAX, 0 };
	uint8_t b[3] = { 1, 0, 1 };
	double x = 0.1;
	struct dg_shape scalar = { .ndim = 0 };
	struct dg_tensor *tl = dg_tensor_from_data(DG_I64, &s, l, NULL);
	struct dg_tensor *tb = dg_tensor_from_data(DG_BOOL, &s, b, NULL);
	struct dg_tensor *tx = dg_tensor_from_data(DG_F64, &scalar, &x, NULL);
	json_t *jl = dg_tensor_to_json(tl), *jb = dg_tensor_to_json(tb),
	       *jx = dg_tensor_to_json(tx);
	char *sl = json_dumps(jl, JSON_COMPACT), *sb = json_dumps(jb, JSON_COMPACT);
	char *sx = json_dumps(jx, JSON_COMPACT | JSON_ENCODE_ANY);

	cr_assert_str_eq(sl, "[-9223372036854775808,9223372036854775807,0]");
	cr_assert_str_eq(sb, "[true,false,true]");
	cr_assert_eq(strtod(sx, NULL), 0.1, "%s", sx);
	struct dg_tensor *r = dg_json_to_tensor(jl, NULL, NULL);
	cr_assert(r && r->dtype == DG_I64 && memcmp(r->data, l, sizeof l) == 0);
	dg_tensor_free(r);
	r = dg_json_to_tensor(jb, NULL, NULL);
	cr_assert(r && r->dtype == DG_BOOL && memcmp(r->data, b, sizeof b) == 0);
	dg_tensor_free(r);
	free(sl);
	free(sb);
	free(sx);
	json_decref(jl);
	json_decref(jb);
	json_decref(jx);
	dg_tensor_free(tl);
	dg_tensor_free(tb);
	dg_tensor_free(tx);
}

/* --- validation against an op's schema ---------------------------------------------- */

static const struct dg_attr_spec fake_attrs[] = {
	{ "axis", DG_ATTR_INT, true, "the axis" },
	{ "alpha", DG_ATTR_FLOAT, false, "a scale" },
	{ "keep_dims", DG_ATTR_BOOL, false, "keep reduced dims" },
	{ "T", DG_ATTR_DTYPE, false, "the dtype" },
	{ "shape", DG_ATTR_SHAPE, false, "a shape" },
	{ "perm", DG_ATTR_INTS, false, "a permutation" },
	{ "value", DG_ATTR_TENSOR, false, "a literal" },
	{ "name", DG_ATTR_STRING, false, "a name" },
	{ NULL, DG_ATTR_INT, false, NULL },
};
static const struct dg_op_def fake_op = { .name = "Fake", .attrs = fake_attrs };
static const struct dg_attr_spec no_attrs[] = { { NULL, DG_ATTR_INT, false, NULL } };
static const struct dg_op_def bare_op = { .name = "Bare", .attrs = no_attrs };

static enum dg_status validate(const struct dg_op_def *op, const char *text, struct dg_err *err)
{
	json_t *a = text ? J(text) : NULL;
	enum dg_status st;

	dg_err_clear(err);
	st = dg_attr_validate(op, a, err);
	json_decref(a);
	return st;
}

Test(attr, validate_accepts_every_kind_when_right)
{
	struct dg_err err = { 0 };

	cr_assert_eq(validate(&fake_op,
			      "{\"axis\": 1, \"alpha\": 2, \"keep_dims\": true, "
			      "\"T\": \"int32\", \"shape\": null, \"perm\": [1, 0], "
			      "\"value\": [[1]], \"name\": \"n\"}",
			      &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(validate(&fake_op, "{\"axis\": 0, \"shape\": [2, -1], \"alpha\": 0.5}", &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(validate(&bare_op, NULL, &err), DG_OK);
	cr_assert_eq(validate(&bare_op, "{}", &err), DG_OK);
}

Test(attr, validate_refuses_unknown_attrs_and_lists_the_known_ones)
{
	struct dg_err err = { 0 };

	assert_err(validate(&fake_op, "{\"axis\": 1, \"axes\": 2}", &err), DG_EINVAL, &err,
		   "Fake has no attr 'axes'");
	cr_assert_not_null(strstr(err.hint, "its attrs are: axis, alpha, keep_dims"), "%s",
			   err.hint);
	assert_err(validate(&bare_op, "{\"x\": 1}", &err), DG_EINVAL, &err, "Bare has no attr 'x'");
	cr_assert_str_eq(err.hint, "Bare takes no attrs");
}

Test(attr, validate_refuses_wrong_kinds_missing_required_and_non_objects)
{
	struct dg_err err = { 0 };

	assert_err(validate(&fake_op, "{\"axis\": \"0\"}", &err), DG_EINVAL, &err,
		   "attr 'axis' must be an integer, got string");
	assert_err(validate(&fake_op, "{\"axis\": 0, \"alpha\": \"x\"}", &err), DG_EINVAL, &err,
		   "attr 'alpha' must be a number");
	assert_err(validate(&fake_op, "{\"axis\": 0, \"keep_dims\": 1}", &err), DG_EINVAL, &err,
		   "attr 'keep_dims' must be true or false, got integer");
	assert_err(validate(&fake_op, "{\"axis\": 0, \"T\": 5}", &err), DG_EINVAL, &err,
		   "attr 'T' must be a dtype name");
	assert_err(validate(&fake_op, "{\"axis\": 0, \"shape\": 5}", &err), DG_EINVAL, &err,
		   "attr 'shape' must be an array of sizes");
	assert_err(validate(&fake_op, "{\"axis\": 0, \"perm\": {}}", &err), DG_EINVAL, &err,
		   "attr 'perm' must be an array of integers, got object");
	assert_err(validate(&fake_op, "{\"axis\": 0, \"name\": []}", &err), DG_EINVAL, &err,
		   "attr 'name' must be a string, got array");
	assert_err(validate(&fake_op, "{\"alpha\": 1.0}", &err), DG_EINVAL, &err,
		   "missing required attr 'axis'");
	assert_err(validate(&fake_op, NULL, &err), DG_EINVAL, &err, "missing required attr 'axis'");
	assert_err(validate(&fake_op, "[1]", &err), DG_EINVAL, &err,
		   "attrs must be a JSON object, got array");
}

/* The table parsed once per node answers every accessor as the JSON does:
 * values, defaults, and the same messages for a wrong kind. */
Test(attr, table_view_reads_like_the_json)
{
	json_t *j = json_pack("{s:i, s:f, s:b, s:s, s:s, s:[i,i,i], s:[i,i], s:n, s:[i,s]}",
			      "i", 7, "f", 2.5, "b", 1, "s", "hello", "dt", "int64",
			      "shape", 2, 3, 4, "ints", -1, 5, "nul", "mixed", 1, "x");
	struct dg_err e1 = { 0 }, e2 = { 0 };
	struct dg_attr_table *t = dg_attr_table_new(j, &e1);
	struct dg_attrs a = dg_attr_table_view(t), jv = dg_attrs_of_json(j);
	int64_t i = 0, def = 9, ints[4];
	double f = 0;
	bool b = false;
	const char *s = NULL;
	enum dg_dtype dt;
	struct dg_shape sh;
	int n = 0;

	cr_assert_not_null(t, "%s", e1.msg);
	cr_assert_eq(dg_attrs_int(a, "i", NULL, &i, &e1), DG_OK);
	cr_assert_eq(i, 7);
	cr_assert_eq(dg_attrs_int(a, "absent", &def, &i, &e1), DG_OK);
	cr_assert_eq(i, 9);
	cr_assert_eq(dg_attrs_float(a, "i", NULL, &f, &e1), DG_OK);
	cr_assert_float_eq(f, 7.0, 0);
	cr_assert_eq(dg_attrs_float(a, "f", NULL, &f, &e1), DG_OK);
	cr_assert_float_eq(f, 2.5, 0);
	cr_assert_eq(dg_attrs_bool(a, "b", NULL, &b, &e1), DG_OK);
	cr_assert(b);
	cr_assert_eq(dg_attrs_string(a, "s", NULL, &s, &e1), DG_OK);
	cr_assert_str_eq(s, "hello");
	cr_assert_eq(dg_attrs_dtype(a, "dt", NULL, &dt, &e1), DG_OK);
	cr_assert_eq(dt, DG_I64);
	cr_assert_eq(dg_attrs_shape(a, "shape", true, false, &sh, &e1), DG_OK);
	cr_assert_eq(sh.ndim, 3);
	cr_assert_eq(sh.dim[2], 4);
	cr_assert_eq(dg_attrs_ints(a, "ints", true, ints, 4, &n, &e1), DG_OK);
	cr_assert_eq(n, 2);
	cr_assert_eq(ints[0], -1);
	cr_assert_eq(dg_attrs_get(a, "nul"), json_object_get(j, "nul"));
	/* Errors: the same status and message from the table and the JSON. */
	const char *keys[] = { "s", "mixed", "nul", "absent", "ints" };
	for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
		dg_err_clear(&e1);
		dg_err_clear(&e2);
		cr_assert_eq(dg_attrs_int(a, keys[k], NULL, &i, &e1),
			     dg_attrs_int(jv, keys[k], NULL, &i, &e2));
		cr_assert_str_eq(e1.msg, e2.msg);
		cr_assert_eq(dg_attrs_dtype(a, keys[k], NULL, &dt, &e1),
			     dg_attrs_dtype(jv, keys[k], NULL, &dt, &e2));
		cr_assert_str_eq(e1.msg, e2.msg);
		cr_assert_eq(dg_attrs_shape(a, keys[k], true, false, &sh, &e1),
			     dg_attrs_shape(jv, keys[k], true, false, &sh, &e2));
		cr_assert_str_eq(e1.msg, e2.msg);
		cr_assert_eq(dg_attrs_ints(a, keys[k], true, ints, 1, &n, &e1),
			     dg_attrs_ints(jv, keys[k], true, ints, 1, &n, &e2));
		cr_assert_str_eq(e1.msg, e2.msg);
	}
	dg_attr_table_free(t);
	json_decref(j);
	json_t *not_object = json_integer(1);
	struct dg_attr_table *bad = dg_attr_table_new(not_object, &e1);
	dg_attr_table_free(bad);
	json_decref(not_object);
	cr_assert_null(bad ? (void *)1 : NULL);
}

Test(attr, an_empty_table_gives_defaults_and_names_missing_attrs)
{
	struct dg_err err = { 0 };
	struct dg_attr_table *t = dg_attr_table_new(NULL, &err);
	int64_t i, def = 3;

	cr_assert_not_null(t);
	cr_assert_eq(dg_attrs_int(dg_attr_table_view(t), "k", &def, &i, &err), DG_OK);
	cr_assert_eq(i, 3);
	cr_assert_eq(dg_attrs_int(dg_attr_table_view(t), "k", NULL, &i, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "'k'"), "%s", err.msg);
	dg_attr_table_free(t);
	dg_attr_table_free(NULL);
}
