/* The typed client (core/src/client.c) against a real parameter server started
 * in this process on a loopback port (ps/server.h): every client function,
 * round trips of every dtype and encoding, compare-and-set, partial writes,
 * update rules with hand-computed numbers, synchronous replicas from threads,
 * queues with concurrent consumers, long polls, epochs and error mapping. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dg/client.h"
#include "dg/clock.h"
#include "dg/codec.h"
#include "server.h"

static struct ps_server *srv;
static struct dg_client *cli;
static char addr[64];

static struct ps_server *start_server(const char *token)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .port = 0, .token = token };
	struct dg_err err = { 0 };
	struct ps_server *s = ps_server_start(&cfg, &err);

	cr_assert_not_null(s, "ps_server_start: %s", err.msg);
	return s;
}

static struct dg_client *client_of(struct ps_server *s, const char *token)
{
	struct dg_err err = { 0 };
	char a[64];
	struct dg_client *c;

	snprintf(a, sizeof a, "127.0.0.1:%d", ps_server_port(s));
	c = dg_client_new(a, token, &err);
	cr_assert_not_null(c, "dg_client_new: %s", err.msg);
	return c;
}

static void setup(void)
{
	srv = start_server(NULL);
	snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_server_port(srv));
	cli = client_of(srv, NULL);
}

static void teardown(void)
{
	dg_client_free(cli);
	ps_server_stop(srv);
	cli = NULL;
	srv = NULL;
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 60);

/* A tensor of dt/shape whose element i is a dtype-appropriate pattern of i. */
static struct dg_tensor *pattern(enum dg_dtype dt, int ndim, const int64_t *dims)
{
	struct dg_shape s = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new(dt, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < t->numel; i++) {
		switch (dt) {
		case DG_F32: ((float *)t->data)[i] = ((float)i - 2.5f) / 3.0f; break;
		case DG_F64: ((double *)t->data)[i] = ((double)i - 2.5) / 3.0; break;
		case DG_I32: ((int32_t *)t->data)[i] = (int32_t)(i * 7 - 100); break;
		case DG_I64: ((int64_t *)t->data)[i] = i * 1000000007LL - 5; break;
		case DG_U8: ((uint8_t *)t->data)[i] = (uint8_t)(i * 37 % 256); break;
		case DG_BOOL: ((uint8_t *)t->data)[i] = (uint8_t)(i % 3 == 0); break;
		default: break;
		}
	}
	return t;
}

static struct dg_tensor *f32(int n, const float *v)
{
	int64_t d = n;
	struct dg_shape s = dg_shape_make(1, &d);
	struct dg_tensor *t = dg_tensor_from_data(DG_F32, &s, v, NULL);

	cr_assert_not_null(t);
	return t;
}

static void assert_same(const struct dg_tensor *a, const struct dg_tensor *b)
{
	cr_assert_eq(a->dtype, b->dtype, "dtype %d vs %d", a->dtype, b->dtype);
	cr_assert(dg_shape_eq(&a->shape, &b->shape), "shapes differ");
	cr_assert_eq(a->nbytes, b->nbytes);
	cr_assert(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0, "bytes differ");
}

static uint64_t put(struct dg_client *c, const char *name, const struct dg_tensor *t)
{
	struct dg_err err = { 0 };
	uint64_t v = 0;
	enum dg_status st = dg_var_put(c, name, t, NULL, &v, &err);

	cr_assert_eq(st, DG_OK, "put %s: %s", name, err.msg);
	cr_assert_gt(v, 0);
	return v;
}

static void put_f32(const char *name, int n, const float *v)
{
	struct dg_tensor *t = f32(n, v);

	put(cli, name, t);
	dg_tensor_free(t);
}

static struct dg_tensor *get(struct dg_client *c, const char *name)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	enum dg_status st = dg_var_get(c, name, &t, NULL, &err);

	cr_assert_eq(st, DG_OK, "get %s: %s", name, err.msg);
	return t;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --- health, epoch ---------------------------------------------------------- */

Test(client, health_counts_variables_and_bytes)
{
	struct dg_err err = { 0 };
	json_t *h = NULL;
	float v[6] = { 0 };

	cr_assert_eq(dg_client_health(cli, &h, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(json_string_value(json_object_get(h, "status")), "ok");
	cr_assert_eq(json_integer_value(json_object_get(h, "vars")), 0);
	json_decref(h);
	put_f32("w", 6, v);
	cr_assert_eq(dg_client_health(cli, &h, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(json_integer_value(json_object_get(h, "vars")), 1);
	cr_assert_eq(json_integer_value(json_object_get(h, "bytes")), 24);
	json_decref(h);
}

Test(client, epoch_is_zero_before_a_reply_and_the_servers_after)
{
	struct dg_err err = { 0 };
	json_t *h = NULL;

	cr_assert_eq(dg_client_epoch(cli), 0);
	cr_assert_eq(dg_client_health(cli, &h, &err), DG_OK, "%s", err.msg);
	cr_assert_geq(dg_client_epoch(cli), 1);
	cr_assert_eq(dg_client_epoch(cli),
		     (uint64_t)json_integer_value(json_object_get(h, "epoch")));
	json_decref(h);
}

/* --- variables -------------------------------------------------------------- */

Test(client, put_then_get_round_trips_every_dtype)
{
	static const int64_t dims[2] = { 3, 5 };

	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		struct dg_tensor *t = pattern((enum dg_dtype)dt, 2, dims), *back = NULL;
		struct dg_var_info info;
		struct dg_err err = { 0 };
		char name[32];

		snprintf(name, sizeof name, "v_%s", dg_dtype_name((enum dg_dtype)dt));
		uint64_t v = put(cli, name, t);
		cr_assert_eq(dg_var_get(cli, name, &back, &info, &err), DG_OK, "%s", err.msg);
		assert_same(t, back);
		cr_assert_str_eq(info.name, name);
		cr_assert_eq(info.dtype, (enum dg_dtype)dt);
		cr_assert_eq(info.shape.ndim, 2);
		cr_assert_eq(info.shape.dim[0], 3);
		cr_assert_eq(info.shape.dim[1], 5);
		cr_assert_eq(info.bytes, 15 * dg_dtype_size((enum dg_dtype)dt));
		cr_assert_eq(info.version, v);
		dg_tensor_free(t);
		dg_tensor_free(back);
	}
}

Test(client, scalars_and_empty_tensors_round_trip)
{
	struct dg_err err = { 0 };
	struct dg_tensor *s = dg_tensor_scalar(DG_F64, -0.125, &err), *back;
	int64_t zero = 0;
	struct dg_tensor *e = pattern(DG_I32, 1, &zero);

	put(cli, "s", s);
	back = get(cli, "s");
	cr_assert_eq(back->shape.ndim, 0);
	cr_assert_eq(((double *)back->data)[0], -0.125);
	dg_tensor_free(back);
	put(cli, "empty", e);
	back = get(cli, "empty");
	assert_same(e, back);
	dg_tensor_free(back);
	dg_tensor_free(s);
	dg_tensor_free(e);
}

Test(client, names_with_slashes_and_dots_round_trip)
{
	float v[2] = { 1.5f, -2.0f };
	struct dg_tensor *t;

	put_f32("model/layer-1/w_0.5", 2, v);
	t = get(cli, "model/layer-1/w_0.5");
	cr_assert_eq(((float *)t->data)[1], -2.0f);
	dg_tensor_free(t);
}

Test(client, a_name_segment_over_251_bytes_is_refused_before_any_request)
{
	char name[300];
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	float v = 1;

	memset(name, 'a', 252);
	name[252] = '\0';
	cr_assert_eq(dg_var_name_check(name, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "a segment of 252 bytes; at most 251"), "%s", err.msg);
	cr_assert_eq(dg_var_name_check_stored(name, NULL), DG_OK, "names of a data dir load");
	cr_assert_eq(dg_var_get(cli, name, &t, NULL, &err), DG_EINVAL);
	cr_assert_null(t);
	name[251] = '\0';
	cr_assert_eq(dg_var_name_check(name, NULL), DG_OK);
	put_f32(name, 1, &v);
	t = get(cli, name);
	dg_tensor_free(t);
	/* segments of 251 joined: the total limit (256) still holds */
	name[251] = '/';
	memset(name + 252, 'b', 4);
	name[256] = '\0';
	cr_assert_eq(dg_var_name_check(name, NULL), DG_OK);
	name[256] = 'b';
	name[257] = '\0';
	cr_assert_eq(dg_var_name_check(name, &err), DG_EINVAL);
	cr_assert_eq(dg_var_name_check_stored(name, NULL), DG_EINVAL);
}

Test(client, a_four_mib_variable_round_trips)
{
	int64_t n = 1 << 20;
	struct dg_tensor *t = pattern(DG_F32, 1, &n), *back;

	put(cli, "big", t);
	back = get(cli, "big");
	assert_same(t, back);
	dg_tensor_free(t);
	dg_tensor_free(back);
}

Test(client, get_encoded_npy_and_text_decode_to_the_same_tensor)
{
	static const int64_t dims[3] = { 2, 2, 3 };
	struct dg_tensor *t = pattern(DG_F64, 3, dims), *n = NULL, *x = NULL;
	struct dg_buf npy = { 0 }, text = { 0 }, raw = { 0 };
	struct dg_var_info info;
	struct dg_err err = { 0 };

	put(cli, "enc", t);
	cr_assert_eq(dg_var_get_encoded(cli, "enc", DG_ENC_NPY, &npy, &info, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(info.bytes, 96);
	cr_assert_eq(memcmp(npy.data, "\x93NUMPY", 6), 0);
	n = dg_npy_decode(npy.data, npy.len, &err);
	cr_assert_not_null(n, "%s", err.msg);
	assert_same(t, n);
	cr_assert_eq(dg_var_get_encoded(cli, "enc", DG_ENC_TEXT, &text, NULL, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(strncmp(text.data, "# float64", 9), 0, "text starts '%.20s'", text.data);
	x = dg_text_decode(text.data, text.len, NULL, NULL, &err);
	cr_assert_not_null(x, "%s", err.msg);
	assert_same(t, x);
	/* Appending to a buffer that already holds bytes keeps them. */
	dg_buf_append(&raw, "AB", 2, NULL);
	cr_assert_eq(dg_var_get_encoded(cli, "enc", DG_ENC_RAW, &raw, NULL, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(raw.len, 2 + 96);
	cr_assert_eq(memcmp(raw.data, "AB", 2), 0);
	cr_assert_eq(memcmp(raw.data + 2, t->data, 96), 0);
	dg_buf_deinit(&npy);
	dg_buf_deinit(&text);
	dg_buf_deinit(&raw);
	dg_tensor_free(t);
	dg_tensor_free(n);
	dg_tensor_free(x);
}

Test(client, put_encoded_npy_and_text_create_the_variables)
{
	static const int64_t dims[2] = { 2, 3 };
	struct dg_tensor *t = pattern(DG_I64, 2, dims), *back;
	struct dg_buf npy = { 0 }, text = { 0 };
	struct dg_err err = { 0 };
	uint64_t v = 0;

	cr_assert_eq(dg_npy_encode(t, &npy, &err), DG_OK);
	cr_assert_eq(dg_var_put_encoded(cli, "from_npy", DG_ENC_NPY, npy.data, npy.len, NULL, &v,
					&err), DG_OK, "%s", err.msg);
	cr_assert_gt(v, 0);
	back = get(cli, "from_npy");
	assert_same(t, back);
	dg_tensor_free(back);
	cr_assert_eq(dg_text_encode(t, &text, &err), DG_OK);
	cr_assert_eq(dg_var_put_encoded(cli, "from_text", DG_ENC_TEXT, text.data, text.len, NULL,
					NULL, &err), DG_OK, "%s", err.msg);
	back = get(cli, "from_text");
	assert_same(t, back);
	dg_tensor_free(back);
	cr_assert_eq(dg_var_put_encoded(cli, "r", DG_ENC_RAW, t->data, t->nbytes, NULL, NULL,
					&err), DG_EINVAL);
	dg_buf_deinit(&npy);
	dg_buf_deinit(&text);
	dg_tensor_free(t);
}

Test(client, stat_gives_the_headers_of_the_current_version)
{
	static const int64_t dims[2] = { 4, 2 };
	struct dg_tensor *t = pattern(DG_U8, 2, dims);
	struct dg_var_info info;
	struct dg_err err = { 0 };

	uint64_t v1 = put(cli, "st", t);
	uint64_t v2 = put(cli, "st", t);
	cr_assert_gt(v2, v1);
	cr_assert_eq(dg_var_stat(cli, "st", &info, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(info.name, "st");
	cr_assert_eq(info.dtype, DG_U8);
	cr_assert_eq(info.shape.ndim, 2);
	cr_assert_eq(info.shape.dim[0], 4);
	cr_assert_eq(info.bytes, 8);
	cr_assert_eq(info.version, v2);
	cr_assert_eq(dg_var_stat(cli, "nope", &info, &err), DG_ENOTFOUND);
	dg_tensor_free(t);
}

Test(client, list_filters_by_prefix_and_describes_each_variable)
{
	float v[3] = { 1, 2, 3 };
	struct dg_var_info *l = NULL;
	struct dg_err err = { 0 };
	int n = -1;

	put_f32("a/y", 3, v);
	put_f32("a/x", 2, v);
	put_f32("b/z", 1, v);
	cr_assert_eq(dg_var_list(cli, "a/", &l, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(l[0].name, "a/x");
	cr_assert_str_eq(l[1].name, "a/y");
	cr_assert_eq(l[0].dtype, DG_F32);
	cr_assert_eq(l[0].shape.ndim, 1);
	cr_assert_eq(l[0].shape.dim[0], 2);
	cr_assert_eq(l[1].bytes, 12);
	cr_assert_gt(l[1].version, 0);
	cr_assert_gt(l[1].mtime, 1.6e9, "mtime %f is seconds since 1970", l[1].mtime);
	free(l);
	cr_assert_eq(dg_var_list(cli, NULL, &l, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(n, 3);
	free(l);
	cr_assert_eq(dg_var_list(cli, "zzz", &l, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(n, 0);
	free(l);
}

Test(client, if_match_and_create_only_are_compare_and_set)
{
	float a[2] = { 1, 2 }, b[2] = { 3, 4 };
	struct dg_tensor *ta = f32(2, a), *tb = f32(2, b), *back;
	struct dg_err err = { 0 };
	uint64_t v = put(cli, "cas", ta), v2 = 0;

	struct dg_put_opts wrong = { .if_match = v + 5 }, right = { .if_match = v };
	cr_assert_eq(dg_var_put(cli, "cas", tb, &wrong, NULL, &err), DG_ECONFLICT, "%s", err.msg);
	back = get(cli, "cas");
	cr_assert_eq(((float *)back->data)[0], 1.0f, "a lost CAS changed nothing");
	dg_tensor_free(back);
	cr_assert_eq(dg_var_put(cli, "cas", tb, &right, &v2, &err), DG_OK, "%s", err.msg);
	cr_assert_gt(v2, v);
	back = get(cli, "cas");
	cr_assert_eq(((float *)back->data)[1], 4.0f);
	dg_tensor_free(back);

	struct dg_put_opts create = { .create_only = true };
	cr_assert_eq(dg_var_put(cli, "cas", ta, &create, NULL, &err), DG_ECONFLICT);
	cr_assert_eq(dg_var_put(cli, "fresh", ta, &create, &v2, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(ta);
	dg_tensor_free(tb);
}

Test(client, another_shape_or_dtype_needs_replace)
{
	float a[2] = { 1, 2 }, b[3] = { 3, 4, 5 };
	struct dg_tensor *ta = f32(2, a), *tb = f32(3, b), *back;
	struct dg_err err = { 0 };
	struct dg_put_opts rep = { .replace = true };
	int64_t two = 2;
	struct dg_tensor *ti = pattern(DG_I32, 1, &two);

	put(cli, "sh", ta);
	cr_assert_eq(dg_var_put(cli, "sh", tb, NULL, NULL, &err), DG_ESHAPE, "%s", err.msg);
	cr_assert_eq(dg_var_put(cli, "sh", ti, NULL, NULL, &err), DG_EDTYPE, "%s", err.msg);
	cr_assert_eq(dg_var_put(cli, "sh", tb, &rep, NULL, &err), DG_OK, "%s", err.msg);
	back = get(cli, "sh");
	assert_same(tb, back);
	dg_tensor_free(back);
	dg_tensor_free(ta);
	dg_tensor_free(tb);
	dg_tensor_free(ti);
}

Test(client, patch_writes_part_of_the_bytes)
{
	float a[4] = { 0, 1, 2, 3 }, p[2] = { 9, 8 };
	struct dg_err err = { 0 };
	struct dg_tensor *back;
	uint64_t v0, v = 0;

	put_f32("p", 4, a);
	v0 = 0;
	struct dg_var_info info;
	cr_assert_eq(dg_var_stat(cli, "p", &info, &err), DG_OK);
	v0 = info.version;
	cr_assert_eq(dg_var_patch(cli, "p", 4, p, sizeof p, 0, &v, &err), DG_OK, "%s", err.msg);
	cr_assert_gt(v, v0);
	back = get(cli, "p");
	cr_assert_eq(((float *)back->data)[0], 0.0f);
	cr_assert_eq(((float *)back->data)[1], 9.0f);
	cr_assert_eq(((float *)back->data)[2], 8.0f);
	cr_assert_eq(((float *)back->data)[3], 3.0f);
	dg_tensor_free(back);
	/* Misaligned, past the end, stale version, empty: refused, nothing written. */
	cr_assert_eq(dg_var_patch(cli, "p", 2, p, 4, 0, NULL, &err), DG_EINVAL, "%s", err.msg);
	cr_assert_eq(dg_var_patch(cli, "p", 12, p, 8, 0, NULL, &err), DG_EINVAL, "%s", err.msg);
	cr_assert_eq(dg_var_patch(cli, "p", 0, p, 4, v0, NULL, &err), DG_ECONFLICT, "%s",
		     err.msg);
	cr_assert_eq(dg_var_patch(cli, "p", 0, p, 0, 0, NULL, &err), DG_EINVAL);
	back = get(cli, "p");
	cr_assert_eq(((float *)back->data)[0], 0.0f);
	cr_assert_eq(((float *)back->data)[3], 3.0f);
	dg_tensor_free(back);
}

Test(client, delete_removes_and_honours_if_match)
{
	float a[1] = { 7 };
	struct dg_err err = { 0 };
	struct dg_var_info info;
	struct dg_tensor *t = NULL;

	put_f32("d", 1, a);
	cr_assert_eq(dg_var_stat(cli, "d", &info, &err), DG_OK);
	cr_assert_eq(dg_var_delete(cli, "d", info.version + 1, &err), DG_ECONFLICT);
	cr_assert_eq(dg_var_delete(cli, "d", info.version, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_var_get(cli, "d", &t, NULL, &err), DG_ENOTFOUND);
	cr_assert_null(t);
	cr_assert_eq(dg_var_delete(cli, "d", 0, &err), DG_ENOTFOUND);
}

/* --- update rules ----------------------------------------------------------- */

static struct dg_apply_result apply(const char *name, const struct dg_apply *a, int n,
				    const float *g)
{
	struct dg_tensor *t = f32(n, g);
	struct dg_apply_result r = { 0 };
	struct dg_err err = { 0 };
	enum dg_status st = dg_var_apply(cli, name, a, t, &r, &err);

	cr_assert_eq(st, DG_OK, "apply %s: %s", a->rule, err.msg);
	dg_tensor_free(t);
	return r;
}

Test(client, sgd_and_assign_add_compute_the_documented_numbers)
{
	float w[4] = { 1, 2, 3, 4 }, g[4] = { 0.5f, -1, 2, 0 };
	struct dg_var_info info;
	struct dg_err err = { 0 };
	struct dg_apply sgd = { .rule = "sgd", .lr = 0.1, .step = -1, .replica = -1 };
	struct dg_apply add = { .rule = "assign_add", .step = -1, .replica = -1 };
	struct dg_tensor *back;

	put_f32("w", 4, w);
	cr_assert_eq(dg_var_stat(cli, "w", &info, &err), DG_OK);
	struct dg_apply_result r = apply("w", &sgd, 4, g);
	cr_assert(r.applied);
	cr_assert_eq(r.version, info.version + 1, "one apply bumps the version once");
	back = get(cli, "w");
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(((float *)back->data)[i], w[i] - 0.1f * g[i], 1e-6,
				   "w[%d] = %g", i, ((float *)back->data)[i]);
	dg_tensor_free(back);
	r = apply("w", &add, 4, g);
	back = get(cli, "w");
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(((float *)back->data)[i], w[i] - 0.1f * g[i] + g[i], 1e-6);
	dg_tensor_free(back);
}

Test(client, momentum_keeps_a_slot_and_nesterov_looks_ahead)
{
	float w[2] = { 1, -1 }, g[2] = { 1, 2 };
	struct dg_apply mom = { .rule = "momentum", .lr = 0.5, .momentum = 0.9, .step = -1,
				.replica = -1 };
	struct dg_apply nes = mom;
	struct dg_tensor *back;

	nes.nesterov = true;
	put_f32("m", 2, w);
	put_f32("n", 2, w);
	apply("m", &mom, 2, g);
	apply("m", &mom, 2, g);
	apply("n", &nes, 2, g);
	/* m1 = g, w1 = w - lr*g; m2 = 0.9*g + g, w2 = w1 - lr*m2. */
	back = get(cli, "m");
	for (int i = 0; i < 2; i++)
		cr_assert_float_eq(((float *)back->data)[i],
				   w[i] - 0.5f * g[i] - 0.5f * 1.9f * g[i], 1e-5);
	dg_tensor_free(back);
	back = get(cli, "m.momentum");
	cr_assert_float_eq(((float *)back->data)[1], 1.9f * 2, 1e-5);
	dg_tensor_free(back);
	/* Nesterov, first step: m = g, w -= lr*(g + 0.9*m) = lr*1.9*g. */
	back = get(cli, "n");
	for (int i = 0; i < 2; i++)
		cr_assert_float_eq(((float *)back->data)[i], w[i] - 0.5f * 1.9f * g[i], 1e-5);
	dg_tensor_free(back);
}

Test(client, adam_first_step_moves_each_weight_by_lr_and_keeps_three_slots)
{
	float w[3] = { 1, 2, 3 }, g[3] = { 0.5f, -4, 2 };
	struct dg_apply adam = { .rule = "adam", .lr = 0.01, .step = -1, .replica = -1 };
	struct dg_var_info *l = NULL;
	struct dg_err err = { 0 };
	struct dg_tensor *back;
	int n;

	put_f32("a", 3, w);
	apply("a", &adam, 3, g);
	/* t = 1: m_hat = g, v_hat = g^2, so w -= lr * g / |g| (eps is negligible). */
	back = get(cli, "a");
	for (int i = 0; i < 3; i++)
		cr_assert_float_eq(((float *)back->data)[i], w[i] - 0.01f * (g[i] > 0 ? 1 : -1),
				   1e-5, "w[%d] = %.9g", i, ((float *)back->data)[i]);
	dg_tensor_free(back);
	back = get(cli, "a.adam_m");
	cr_assert_float_eq(((float *)back->data)[1], 0.1f * -4, 1e-6);
	dg_tensor_free(back);
	cr_assert_eq(dg_var_list(cli, "a.", &l, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(n, 3);
	cr_assert_str_eq(l[0].name, "a.adam_m");
	cr_assert_str_eq(l[1].name, "a.adam_t");
	cr_assert_str_eq(l[2].name, "a.adam_v");
	free(l);
}

Test(client, apply_refuses_unknown_rules_and_wrong_dtypes)
{
	float w[2] = { 1, 2 };
	struct dg_apply bad = { .rule = "sgd; rm", .step = -1, .replica = -1 };
	struct dg_apply sgd = { .rule = "sgd", .lr = 0.1, .step = -1, .replica = -1 };
	int64_t two = 2;
	struct dg_tensor *gi = pattern(DG_I32, 1, &two), *g = f32(2, w);
	struct dg_err err = { 0 };

	put_f32("w", 2, w);
	cr_assert_eq(dg_var_apply(cli, "w", &bad, g, NULL, &err), DG_EINVAL);
	cr_assert_eq(dg_var_apply(cli, "w", &sgd, gi, NULL, &err), DG_EDTYPE, "%s", err.msg);
	cr_assert_eq(dg_var_apply(cli, "missing", &sgd, g, NULL, &err), DG_ENOTFOUND, "%s",
		     err.msg);
	dg_tensor_free(gi);
	dg_tensor_free(g);
}

Test(client, row_wise_applies_and_row_reads_touch_only_their_rows)
{
	const int64_t dims[2] = { 5, 3 }, idims[2] = { 2, 2 };
	struct dg_tensor *t = pattern(DG_F32, 2, dims), *rows = NULL, *back;
	struct dg_shape is = dg_shape_make(2, idims), gs = dg_shape_make(2, (int64_t[]){ 3, 3 });
	const int64_t idx[4] = { 4, 0, 4, 4 };
	struct dg_tensor *ind = dg_tensor_from_data(DG_I64, &is, idx, NULL);
	struct dg_tensor *g = dg_tensor_new(DG_F32, &gs, NULL);
	struct dg_apply ada = { .rule = "adagrad", .lr = 0.5, .step = -1, .replica = -1,
				.rows = (const int64_t[]){ 3, 1, 3 }, .n_rows = 3 };
	struct dg_apply_result res = { 0 };
	struct dg_var_info info = { 0 };
	struct dg_err err = { 0 };

	put(cli, "emb", t);
	/* the rows of a [2,2] index tensor: [2,2,3], as Gather gives them */
	cr_assert_eq(dg_var_get_rows(cli, "emb", ind, 0, 0, &rows, &info, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(rows->shape.ndim, 3);
	cr_assert_eq(rows->shape.dim[2], 3);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(memcmp((float *)rows->data + 3 * i, (float *)t->data + 3 * idx[i], 12),
			     0, "row %d", i);
	cr_assert_gt(info.version, 0);
	dg_tensor_free(rows);
	for (int i = 0; i < 9; i++)
		((float *)g->data)[i] = 1;
	cr_assert_eq(dg_var_apply(cli, "emb", &ada, g, &res, &err), DG_OK, "%s", err.msg);
	cr_assert(res.applied);
	back = get(cli, "emb");
	for (int r = 0; r < 5; r++) {
		/* row 3 got two ones (g = 2: acc 0.1 + 4), row 1 one (acc 1.1) */
		double gsum = r == 3 ? 2 : r == 1 ? 1 : 0;
		double want = ((float *)t->data)[3 * r] -
			      (gsum ? 0.5 * gsum / sqrt(0.1 + gsum * gsum) : 0);
		cr_assert_float_eq(((float *)back->data)[3 * r], want, 1e-5, "row %d", r);
	}
	dg_tensor_free(back);
	ada.n_rows = 2;
	cr_assert_eq(dg_var_apply(cli, "emb", &ada, g, NULL, &err), DG_ESHAPE);
	cr_assert_not_null(strstr(err.msg, "2 rows"), "%s", err.msg);
	ada.n_rows = 3;
	ada.rows = (const int64_t[]){ 3, 1, 5 };
	cr_assert_eq(dg_var_apply(cli, "emb", &ada, g, NULL, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "row 5 is out of range"), "%s", err.msg);
	((int64_t *)ind->data)[1] = -1;
	cr_assert_eq(dg_var_get_rows(cli, "emb", ind, 0, 0, &rows, NULL, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "row -1"), "%s", err.msg);
	cr_assert_null(rows);
	dg_tensor_free(ind);
	dg_tensor_free(g);
	dg_tensor_free(t);
}

/* Synchronous replicas: each thread has its own client (one per thread). */
struct replica {
	int id;
	float grad;
	int64_t step;
	int replicas, backup;
	enum dg_status st;
	struct dg_apply_result r;
};

static void *replica_main(void *p)
{
	struct replica *rp = p;
	struct dg_client *c = client_of(srv, NULL);
	float g[2] = { rp->grad, rp->grad };
	struct dg_tensor *t = f32(2, g);
	struct dg_apply a = { .rule = "sgd", .lr = 1.0, .step = rp->step,
			      .replicas = rp->replicas, .backup = rp->backup, .replica = rp->id };
	struct dg_err err = { 0 };

	rp->st = dg_var_apply(c, "sync", &a, t, &rp->r, &err);
	dg_tensor_free(t);
	dg_client_free(c);
	return NULL;
}

Test(client, sync_apply_from_three_threads_applies_the_mean_once)
{
	float w[2] = { 0, 0 };
	struct replica rp[3];
	pthread_t th[3];
	struct dg_var_info info;
	struct dg_err err = { 0 };
	struct dg_tensor *back;
	int applied = 0;

	put_f32("sync", 2, w);
	cr_assert_eq(dg_var_stat(cli, "sync", &info, &err), DG_OK);
	for (int i = 0; i < 3; i++) {
		rp[i] = (struct replica){ .id = i, .grad = (float)(i + 1), .step = 0,
					  .replicas = 3 };
		pthread_create(&th[i], NULL, replica_main, &rp[i]);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(rp[i].st, DG_OK, "replica %d: %d", i, rp[i].st);
		if (rp[i].r.applied) {
			applied++;
			cr_assert_eq(rp[i].r.version, info.version + 1);
			cr_assert_eq(rp[i].r.step, 1);
		} else {
			cr_assert_eq(rp[i].r.step, 0);
			cr_assert_geq(rp[i].r.pending, 1);
		}
	}
	cr_assert_eq(applied, 1, "exactly one arrival completes the step");
	back = get(cli, "sync");
	cr_assert_float_eq(((float *)back->data)[0], -2.0f, 1e-6, "w = -lr * mean(1, 2, 3)");
	cr_assert_float_eq(((float *)back->data)[1], -2.0f, 1e-6);
	dg_tensor_free(back);

	/* A late gradient for step 0 is dropped with DG_ESTALE. */
	struct replica late = { .id = 0, .grad = 5, .step = 0, .replicas = 3 };
	replica_main(&late);
	cr_assert_eq(late.st, DG_ESTALE);
	back = get(cli, "sync");
	cr_assert_float_eq(((float *)back->data)[0], -2.0f, 1e-6, "a stale gradient changed w");
	dg_tensor_free(back);
}

Test(client, backup_workers_apply_after_n_minus_k_and_drop_the_rest)
{
	float w[2] = { 10, 10 };
	struct replica r0 = { .id = 0, .grad = 2, .step = 0, .replicas = 3, .backup = 1 };
	struct replica r1 = { .id = 1, .grad = 4, .step = 0, .replicas = 3, .backup = 1 };
	struct replica r2 = { .id = 2, .grad = 100, .step = 0, .replicas = 3, .backup = 1 };
	struct dg_tensor *back;

	put_f32("sync", 2, w);
	replica_main(&r0);
	cr_assert_eq(r0.st, DG_OK);
	cr_assert_not(r0.r.applied);
	replica_main(&r1);
	cr_assert_eq(r1.st, DG_OK);
	cr_assert(r1.r.applied, "the 2nd of 3 arrivals applies with 1 backup worker");
	replica_main(&r2);
	cr_assert_eq(r2.st, DG_ESTALE, "the slowest replica's gradient is dropped");
	back = get(cli, "sync");
	cr_assert_float_eq(((float *)back->data)[0], 10.0f - 3.0f, 1e-6);
	dg_tensor_free(back);
}

/* --- long polls ------------------------------------------------------------- */

Test(client, wait_times_out_with_the_current_version)
{
	float a[1] = { 1 };
	struct dg_var_info info = { 0 };
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };

	put_f32("wv", 1, a);
	struct dg_var_info now;
	cr_assert_eq(dg_var_stat(cli, "wv", &now, &err), DG_OK);
	double t0 = now_ms();
	enum dg_status st = dg_var_wait(cli, "wv", now.version + 1, 200, &t, &info, &err);
	double el = now_ms() - t0;
	cr_assert_eq(st, DG_ETIMEOUT, "%d: %s", st, err.msg);
	cr_assert_null(t);
	cr_assert_eq(info.version, now.version);
	cr_assert_geq(el, 150, "returned after %.0f ms", el);
	cr_assert_lt(el, 5000);
	/* A version already reached answers at once with the value. */
	cr_assert_eq(dg_var_wait(cli, "wv", now.version, 5000, &t, &info, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(((float *)t->data)[0], 1.0f);
	dg_tensor_free(t);
}

static void *late_put(void *p)
{
	struct dg_client *c = client_of(srv, NULL);
	float v[1] = { 42 };
	struct dg_tensor *t = f32(1, v);

	(void)p;
	usleep(150 * 1000);
	put(c, "wv", t);
	dg_tensor_free(t);
	dg_client_free(c);
	return NULL;
}

Test(client, wait_is_woken_by_a_put_from_another_client)
{
	float a[1] = { 1 };
	struct dg_var_info now, info;
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };
	pthread_t th;

	put_f32("wv", 1, a);
	cr_assert_eq(dg_var_stat(cli, "wv", &now, &err), DG_OK);
	pthread_create(&th, NULL, late_put, NULL);
	double t0 = now_ms();
	enum dg_status st = dg_var_wait(cli, "wv", now.version + 1, 10000, &t, &info, &err);
	double el = now_ms() - t0;
	pthread_join(th, NULL);
	cr_assert_eq(st, DG_OK, "%s", err.msg);
	cr_assert_eq(((float *)t->data)[0], 42.0f);
	cr_assert_geq(info.version, now.version + 1);
	cr_assert_lt(el, 5000, "woken after %.0f ms, not at the timeout", el);
	dg_tensor_free(t);
}

/* --- sync steps and checkpoints -------------------------------------------- */

/* The last replica of step 0 of "sync" (2 replicas, gradient 3), 150 ms late. */
static void *late_replica(void *p)
{
	struct replica r1 = { .id = 1, .grad = 3, .step = 0, .replicas = 2 };

	(void)p;
	usleep(150 * 1000);
	replica_main(&r1);
	cr_assert_eq(r1.st, DG_OK);
	cr_assert(r1.r.applied);
	return NULL;
}

Test(client, wait_step_returns_the_value_after_the_step_or_times_out)
{
	float w[2] = { 10, 20 };
	struct replica r0 = { .id = 0, .grad = 1, .step = 0, .replicas = 2 };
	struct dg_var_info info = { 0 }, *list = NULL;
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };
	pthread_t th;
	int n = 0;

	put_f32("sync", 2, w);
	replica_main(&r0);
	cr_assert_eq(r0.st, DG_OK);
	cr_assert_not(r0.r.applied);
	pthread_create(&th, NULL, late_replica, NULL);
	double t0 = now_ms();
	enum dg_status st = dg_var_wait_step(cli, "sync", 1, 10000, &t, &info, &err);
	double el = now_ms() - t0;
	pthread_join(th, NULL);
	cr_assert_eq(st, DG_OK, "%s", err.msg);
	cr_assert_geq(el, 100, "returned after %.0f ms, before the step", el);
	cr_assert_lt(el, 5000);
	cr_assert_float_eq(((float *)t->data)[0], 8.0f, 0, "10 - mean(1, 3)");
	cr_assert_float_eq(((float *)t->data)[1], 18.0f, 0);
	dg_tensor_free(t);
	t0 = now_ms();
	st = dg_var_wait_step(cli, "sync", 2, 200, &t, &info, &err);
	el = now_ms() - t0;
	cr_assert_eq(st, DG_ETIMEOUT, "%d: %s", st, err.msg);
	cr_assert_not_null(strstr(err.msg, "step 2"), "%s", err.msg);
	cr_assert_null(t);
	cr_assert_geq(el, 150);
	cr_assert_eq(dg_var_wait_step(cli, "sync", -1, 10, &t, &info, &err), DG_EINVAL);
	cr_assert_eq(dg_var_list(cli, "sync", &list, &n, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(n, 1);
	cr_assert_eq(list[0].step, 1);
	free(list);
}

Test(client, checkpoint_of_a_memory_server_is_unsupported)
{
	struct dg_err err = { 0 };
	json_t *reply = (json_t *)&err;         /* must be reset */

	cr_assert_eq(dg_ps_checkpoint(cli, &reply, &err), DG_EUNSUPPORTED, "%s", err.msg);
	cr_assert_null(reply);
	cr_assert_not_null(strstr(err.hint, "--data-dir"), "hint: %s", err.hint);
}

Test(client, checkpoint_of_a_durable_server_reports_the_snapshot)
{
	char dir[] = "/tmp/dg-test-client-XXXXXX", cmd[64];
	struct ps_server_config cfg = { .job = "ps", .task = 0, .data_dir = dir };
	struct dg_err err = { 0 };
	float w[3] = { 1, 2, 3 };
	struct dg_tensor *t = f32(3, w);
	json_t *reply = NULL;

	cr_assert_not_null(mkdtemp(dir));
	struct ps_server *s = ps_server_start(&cfg, &err);
	cr_assert_not_null(s, "%s", err.msg);
	struct dg_client *c = client_of(s, NULL);
	put(c, "a", t);
	put(c, "b", t);
	cr_assert_eq(dg_ps_checkpoint(c, &reply, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(json_integer_value(json_object_get(reply, "vars")), 2);
	cr_assert_eq(json_integer_value(json_object_get(reply, "epoch")), 1);
	/* two 12-byte values and their records */
	cr_assert_gt(json_integer_value(json_object_get(reply, "bytes")), 24);
	json_decref(reply);
	dg_tensor_free(t);
	dg_client_free(c);
	ps_server_stop(s);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

/* --- errors ----------------------------------------------------------------- */

Test(client, bad_names_are_refused_before_any_request)
{
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_var_get(cli, "../etc/passwd", &t, NULL, &err), DG_EINVAL);
	cr_assert_eq(dg_var_get(cli, "a//b", &t, NULL, &err), DG_EINVAL);
	cr_assert_eq(dg_var_get(cli, "sp ace", &t, NULL, &err), DG_EINVAL);
	cr_assert_eq(dg_var_get(cli, "", &t, NULL, &err), DG_EINVAL);
	cr_assert_eq(dg_client_epoch(cli), 0, "no request was sent");
}

Test(client, a_missing_variable_is_not_found_with_the_servers_message)
{
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_var_get(cli, "ghost", &t, NULL, &err), DG_ENOTFOUND);
	cr_assert_null(t);
	cr_assert_eq(err.code, DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "ghost"), "message names the variable: %s", err.msg);
}

Test(client, a_token_server_refuses_clients_without_the_token)
{
	struct ps_server *s = start_server("s3cret");
	struct dg_client *none = client_of(s, NULL), *wrong = client_of(s, "guess");
	struct dg_client *right = client_of(s, "s3cret");
	struct dg_err err = { 0 };
	json_t *h = NULL;

	cr_assert_eq(dg_client_health(none, &h, &err), DG_EUNAUTHORIZED, "%s", err.msg);
	cr_assert_null(h);
	cr_assert_eq(dg_client_health(wrong, &h, &err), DG_EUNAUTHORIZED, "%s", err.msg);
	cr_assert_eq(dg_client_health(right, &h, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(json_string_value(json_object_get(h, "status")), "ok");
	json_decref(h);
	dg_client_free(none);
	dg_client_free(wrong);
	dg_client_free(right);
	ps_server_stop(s);
}

Test(client, a_closed_port_is_unavailable)
{
	struct ps_server *s = start_server(NULL);
	int port = ps_server_port(s);
	struct dg_err err = { 0 };
	char a[64];
	json_t *h = NULL;

	ps_server_stop(s);
	snprintf(a, sizeof a, "127.0.0.1:%d", port);
	struct dg_client *c = dg_client_new(a, NULL, &err);
	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_eq(dg_client_health(c, &h, &err), DG_EUNAVAILABLE, "%d: %s", err.code,
		     err.msg);
	cr_assert(strstr(err.msg, a), "message names the address: %s", err.msg);
	dg_client_free(c);
	cr_assert_null(dg_client_new("", NULL, &err));
	cr_assert_eq(err.code, DG_EINVAL);
}

/* --- queues ----------------------------------------------------------------- */

static struct dg_queue_spec two_components(int64_t capacity, bool shuffle)
{
	struct dg_queue_spec s = { .capacity = capacity, .shuffle = shuffle, .seed = 7,
				   .n_components = 2 };
	int64_t three = 3;

	s.dtype[0] = DG_F32;
	s.shape[0] = dg_shape_make(1, &three);
	s.dtype[1] = DG_I64;
	s.shape[1] = dg_shape_make(0, NULL);
	return s;
}

/* Batch of n examples: x[i] = (i+base, i+base+0.5, i+base+0.25), y[i] = 10*(i+base). */
static void make_batch(int n, int base, struct dg_tensor **x, struct dg_tensor **y)
{
	int64_t dx[2] = { n, 3 }, dy = n;
	struct dg_shape sx = dg_shape_make(2, dx), sy = dg_shape_make(1, &dy);

	*x = dg_tensor_new(DG_F32, &sx, NULL);
	*y = dg_tensor_new(DG_I64, &sy, NULL);
	for (int i = 0; i < n; i++) {
		float *r = (float *)(*x)->data + 3 * i;
		r[0] = (float)(i + base);
		r[1] = (float)(i + base) + 0.5f;
		r[2] = (float)(i + base) + 0.25f;
		((int64_t *)(*y)->data)[i] = 10 * (i + base);
	}
}

Test(client, queue_enqueue_dequeue_keeps_components_together)
{
	struct dg_queue_spec spec = two_components(10, false);
	struct dg_tensor *x, *y, *out[2];
	struct dg_err err = { 0 };
	json_t *state = NULL;
	int64_t got = 0;

	cr_assert_eq(dg_queue_create(cli, "q", &spec, &err), DG_OK, "%s", err.msg);
	make_batch(4, 0, &x, &y);
	const struct dg_tensor *comps[2] = { x, y };
	cr_assert_eq(dg_queue_enqueue(cli, "q", 4, comps, 2, 1000, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_queue_state(cli, "q", &state, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(json_integer_value(json_object_get(state, "size")), 4);
	cr_assert_eq(json_integer_value(json_object_get(state, "capacity")), 10);
	json_decref(state);

	cr_assert_eq(dg_queue_dequeue(cli, "q", 3, 1000, false, out, 2, &got, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(got, 3);
	cr_assert_eq(out[0]->shape.ndim, 2);
	cr_assert_eq(out[0]->shape.dim[0], 3);
	cr_assert_eq(out[0]->shape.dim[1], 3);
	cr_assert_eq(out[1]->shape.ndim, 1);
	for (int i = 0; i < 3; i++) {
		int64_t k = ((int64_t *)out[1]->data)[i] / 10;
		float *r = (float *)out[0]->data + 3 * i;
		cr_assert_eq(((int64_t *)out[1]->data)[i], 10 * k);
		cr_assert_eq(r[0], (float)k, "example %d: x and y travel together", i);
		cr_assert_eq(r[1], (float)k + 0.5f);
		cr_assert_eq(r[2], (float)k + 0.25f);
	}
	dg_tensor_free(out[0]);
	dg_tensor_free(out[1]);

	/* Closed: enqueue refused; a batch larger than what is left needs
	 * allow_smaller; then nothing is left. */
	cr_assert_eq(dg_queue_close(cli, "q", &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_queue_enqueue(cli, "q", 4, comps, 2, 1000, &err), DG_ECLOSED);
	cr_assert_eq(dg_queue_dequeue(cli, "q", 2, 1000, false, out, 2, &got, &err), DG_ECLOSED);
	cr_assert_eq(dg_queue_dequeue(cli, "q", 2, 1000, true, out, 2, &got, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(got, 1);
	cr_assert_eq(out[0]->shape.dim[0], 1);
	dg_tensor_free(out[0]);
	dg_tensor_free(out[1]);
	cr_assert_eq(dg_queue_dequeue(cli, "q", 1, 1000, true, out, 2, &got, &err), DG_ECLOSED);
	cr_assert_null(out[0]);
	cr_assert_eq(dg_queue_delete(cli, "q", &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_queue_state(cli, "q", &state, &err), DG_ENOTFOUND);
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(client, queue_refuses_wrong_batches_and_times_out_when_empty)
{
	struct dg_queue_spec spec = two_components(10, false), other = two_components(99, false);
	struct dg_tensor *x, *y, *out[2] = { NULL, NULL };
	struct dg_err err = { 0 };
	int64_t got = -1;

	cr_assert_eq(dg_queue_create(cli, "q", &spec, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_queue_create(cli, "q", &spec, &err), DG_OK, "same settings: %s",
		     err.msg);
	cr_assert_eq(dg_queue_create(cli, "q", &other, &err), DG_EEXIST, "%s", err.msg);
	make_batch(2, 0, &x, &y);
	const struct dg_tensor *swapped[2] = { y, x };
	const struct dg_tensor *comps[2] = { x, y };
	cr_assert_eq(dg_queue_enqueue(cli, "q", 2, swapped, 2, 1000, &err), DG_EDTYPE);
	cr_assert_eq(dg_queue_enqueue(cli, "q", 3, comps, 2, 1000, &err), DG_ESHAPE);
	cr_assert_eq(dg_queue_enqueue(cli, "q", 2, comps, 1, 1000, &err), DG_EINVAL);
	cr_assert_eq(dg_queue_dequeue(cli, "q", 1, 1000, false, out, 1, &got, &err), DG_EINVAL);
	double t0 = now_ms();
	cr_assert_eq(dg_queue_dequeue(cli, "q", 1, 150, false, out, 2, &got, &err), DG_ETIMEOUT,
		     "%s", err.msg);
	cr_assert_geq(now_ms() - t0, 100);
	cr_assert_eq(got, 0);
	cr_assert_null(out[0]);
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(client, dequeue_reads_the_layout_of_a_queue_this_client_did_not_create)
{
	struct dg_queue_spec spec = two_components(10, false);
	struct dg_client *other = client_of(srv, NULL);
	struct dg_tensor *x, *y, *out[2];
	struct dg_err err = { 0 };
	int64_t got = 0;

	cr_assert_eq(dg_queue_create(other, "q", &spec, &err), DG_OK, "%s", err.msg);
	make_batch(2, 5, &x, &y);
	const struct dg_tensor *comps[2] = { x, y };
	cr_assert_eq(dg_queue_enqueue(other, "q", 2, comps, 2, 1000, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_queue_dequeue(cli, "q", 2, 1000, false, out, 2, &got, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(got, 2);
	cr_assert_eq(((int64_t *)out[1]->data)[0], 50);
	cr_assert_eq(((float *)out[0]->data)[4], 6.5f);
	dg_tensor_free(out[0]);
	dg_tensor_free(out[1]);
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_client_free(other);
}

#define N_EXAMPLES 400
#define N_CONSUMERS 4

struct consumer {
	int64_t seen[N_EXAMPLES];
	int n;
	enum dg_status last;
};

static void *consumer_main(void *p)
{
	struct consumer *cs = p;
	struct dg_client *c = client_of(srv, NULL);
	struct dg_err err = { 0 };

	for (;;) {
		struct dg_tensor *out[1];
		int64_t got = 0;
		cs->last = dg_queue_dequeue(c, "shared", 7, 10000, true, out, 1, &got, &err);
		if (cs->last != DG_OK)
			break;
		for (int64_t i = 0; i < got && cs->n < N_EXAMPLES; i++)
			cs->seen[cs->n++] = ((int64_t *)out[0]->data)[i];
		dg_tensor_free(out[0]);
	}
	dg_client_free(c);
	return NULL;
}

Test(client, four_consumers_receive_disjoint_examples)
{
	struct dg_queue_spec spec = { .capacity = 64, .shuffle = true, .min_after_dequeue = 8,
				      .seed = 3, .n_components = 1 };
	static struct consumer cs[N_CONSUMERS];
	pthread_t th[N_CONSUMERS];
	struct dg_err err = { 0 };
	int count[N_EXAMPLES] = { 0 }, total = 0;

	spec.dtype[0] = DG_I64;
	spec.shape[0] = dg_shape_make(0, NULL);
	cr_assert_eq(dg_queue_create(cli, "shared", &spec, &err), DG_OK, "%s", err.msg);
	for (int i = 0; i < N_CONSUMERS; i++)
		pthread_create(&th[i], NULL, consumer_main, &cs[i]);
	for (int b = 0; b < N_EXAMPLES; b += 20) {
		int64_t n = 20;
		struct dg_shape s = dg_shape_make(1, &n);
		struct dg_tensor *t = dg_tensor_new(DG_I64, &s, NULL);
		for (int i = 0; i < 20; i++)
			((int64_t *)t->data)[i] = b + i;
		const struct dg_tensor *comps[1] = { t };
		cr_assert_eq(dg_queue_enqueue(cli, "shared", 20, comps, 1, 10000, &err), DG_OK,
			     "%s", err.msg);
		dg_tensor_free(t);
	}
	cr_assert_eq(dg_queue_close(cli, "shared", &err), DG_OK, "%s", err.msg);
	for (int i = 0; i < N_CONSUMERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < N_CONSUMERS; i++) {
		cr_assert_eq(cs[i].last, DG_ECLOSED, "consumer %d ended with %d", i, cs[i].last);
		for (int k = 0; k < cs[i].n; k++) {
			cr_assert(cs[i].seen[k] >= 0 && cs[i].seen[k] < N_EXAMPLES);
			count[cs[i].seen[k]]++;
		}
		total += cs[i].n;
	}
	cr_assert_eq(total, N_EXAMPLES);
	for (int k = 0; k < N_EXAMPLES; k++)
		cr_assert_eq(count[k], 1, "example %d dequeued %d times", k, count[k]);
}

/* dg_var_get_into's receiver: a block of its own, the info and progress seen. */
struct into_rx {
	char *block;
	uint64_t len, got;
	int begins, progresses;
	struct dg_var_info info;
	bool refuse;
};

static void *rx_begin(void *ud, const struct dg_var_info *info, uint64_t len)
{
	struct into_rx *rx = ud;

	rx->begins++;
	rx->info = *info;
	rx->len = len;
	if (rx->refuse)
		return NULL;
	rx->block = malloc(len ? len : 1);
	return rx->block;
}

static bool rx_progress(void *ud, uint64_t got)
{
	struct into_rx *rx = ud;

	cr_assert_geq(got, rx->got, "progress only grows");
	rx->got = got;
	rx->progresses++;
	return true;
}

static const struct dg_var_into rx_into = { .begin = rx_begin, .progress = rx_progress };

Test(client, get_into_receives_the_body_into_the_callers_block)
{
	int64_t n = 3 << 20;            /* 12 MiB: several receives */
	struct dg_tensor *t = pattern(DG_F32, 1, &n);
	struct into_rx rx = { 0 };
	struct dg_err err = { 0 };
	struct dg_buf npy = { 0 };
	bool delivered = false;
	uint64_t v = put(cli, "into/w", t);

	cr_assert_eq(dg_var_get_into(cli, "into/w", DG_ENC_RAW, &rx_into, &rx, &delivered, &err),
		     DG_OK, "%s", err.msg);
	cr_assert(delivered);
	cr_assert_eq(rx.begins, 1);
	cr_assert_eq(rx.len, t->nbytes);
	cr_assert_eq(rx.got, t->nbytes);
	cr_assert_eq(rx.info.version, v);
	cr_assert_eq(rx.info.dtype, DG_F32);
	cr_assert(dg_shape_eq(&rx.info.shape, &t->shape));
	cr_assert_str_eq(rx.info.name, "into/w");
	cr_assert_eq(memcmp(rx.block, t->data, t->nbytes), 0);
	free(rx.block);
	/* another encoding: the bytes of a GET of it */
	rx = (struct into_rx){ 0 };
	cr_assert_eq(dg_var_get_into(cli, "into/w", DG_ENC_NPY, &rx_into, &rx, &delivered, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(dg_npy_encode(t, &npy, NULL), DG_OK);
	cr_assert_eq(rx.len, npy.len);
	cr_assert_eq(memcmp(rx.block, npy.data, npy.len), 0);
	free(rx.block);
	dg_buf_deinit(&npy);
	dg_tensor_free(t);
}

Test(client, get_into_reports_errors_before_anything_is_delivered)
{
	float v = 1;
	struct into_rx rx = { 0 };
	struct dg_err err = { 0 };
	bool delivered = true;

	cr_assert_eq(dg_var_get_into(cli, "nothere", DG_ENC_RAW, &rx_into, &rx, &delivered, &err),
		     DG_ENOTFOUND);
	cr_assert_not(delivered);
	cr_assert_eq(rx.begins, 0);
	cr_assert(strstr(err.msg, "nothere"), "%s", err.msg);
	put_f32("small", 1, &v);
	rx.refuse = true;
	cr_assert_eq(dg_var_get_into(cli, "small", DG_ENC_RAW, &rx_into, &rx, &delivered, &err),
		     DG_ECANCELED);
	cr_assert(delivered, "begin was called");
	cr_assert_eq(dg_var_get_into(cli, "bad/../name", DG_ENC_RAW, &rx_into, &rx, &delivered,
				     &err), DG_EINVAL);
}

Test(client, get_into_sends_the_token_and_reports_a_dead_server)
{
	struct ps_server *s = start_server("sekrit");
	struct dg_client *good = client_of(s, "sekrit"), *bad = client_of(s, "wrong");
	struct into_rx rx = { 0 };
	struct dg_err err = { 0 };
	float v = 2;
	bool delivered;
	struct dg_tensor *t = f32(1, &v);

	cr_assert_eq(dg_var_put(good, "t", t, NULL, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_var_get_into(good, "t", DG_ENC_RAW, &rx_into, &rx, &delivered, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(memcmp(rx.block, &v, 4), 0);
	free(rx.block);
	cr_assert_eq(dg_var_get_into(bad, "t", DG_ENC_RAW, &rx_into, &rx, &delivered, &err),
		     DG_EUNAUTHORIZED);
	dg_client_free(bad);
	ps_server_stop(s);
	cr_assert_eq(dg_var_get_into(good, "t", DG_ENC_RAW, &rx_into, &rx, &delivered, &err),
		     DG_EIO);
	cr_assert_not(delivered);
	cr_assert(strstr(err.msg, "connect"), "%s", err.msg);
	dg_client_free(good);
	dg_tensor_free(t);
}

/* dg_var_put_stream's source: the body handed over in pieces of step bytes
 * (the first one after a pause), or given up at stop_at. */
struct from_tx {
	uint64_t step, stop_at, nbytes;
	uint64_t last_sent;
	int calls;
};

static uint64_t tx_more(void *ud, uint64_t sent)
{
	struct from_tx *tx = ud;

	cr_assert_geq(sent, tx->last_sent, "sent only grows");
	cr_assert_lt(sent, tx->nbytes, "not asked once all is sent");
	tx->last_sent = sent;
	if (tx->calls++ == 0)
		usleep(50 * 1000);      /* the writer pauses: the transfer waits */
	if (tx->stop_at && sent >= tx->stop_at)
		return sent;            /* the writer gives up */
	return sent + tx->step;         /* past the end reads as the end */
}

static const struct dg_var_from tx_from = { .more = tx_more, .stop_fd = -1 };

static enum dg_status put_stream(struct dg_client *c, const char *name,
				 const struct dg_tensor *t, uint64_t if_match, struct from_tx *tx,
				 struct dg_var_put_end *end, struct dg_err *err)
{
	tx->nbytes = t->nbytes;
	return dg_var_put_stream(c, name, t->dtype, &t->shape, t->data, t->nbytes, if_match,
				 &tx_from, tx, end, err);
}

Test(client, put_stream_sends_the_body_in_the_pieces_given)
{
	int64_t n = 3 << 20;            /* 12 MiB */
	struct dg_tensor *t = pattern(DG_F32, 1, &n), *back;
	struct from_tx tx = { .step = (1 << 20) + 4093 };
	struct dg_var_put_end end;
	struct dg_err err = { 0 };
	struct dg_var_info info;

	cr_assert_eq(put_stream(cli, "stream/w", t, 0, &tx, &end, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(tx.calls, (int)(t->nbytes / tx.step) + 1, "one call per piece");
	cr_assert_eq(end.sent, t->nbytes);
	cr_assert(end.status >= 200 && end.status < 300, "HTTP %d", end.status);
	cr_assert_eq(dg_var_get(cli, "stream/w", &back, &info, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(info.version, end.version);
	assert_same(t, back);
	dg_tensor_free(back);
	/* the whole body at once, over the last value */
	tx = (struct from_tx){ .step = t->nbytes };
	cr_assert_eq(put_stream(cli, "stream/w", t, end.version, &tx, &end, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(tx.calls, 1);
	cr_assert_gt(end.version, info.version);
	dg_tensor_free(t);
}

Test(client, put_stream_given_up_changes_nothing)
{
	int64_t n = 3 << 20;
	struct dg_tensor *t = pattern(DG_F32, 1, &n), *back;
	struct from_tx tx = { .step = 1 << 20, .stop_at = 5 << 20 };
	struct dg_var_put_end end;
	struct dg_err err = { 0 };
	struct dg_var_info info;

	uint64_t v = put(cli, "stream/a", t);
	tx.stop_at = 5 << 20;
	struct dg_tensor *u = pattern(DG_F32, 1, &n);
	((float *)u->data)[0] = 99;
	cr_assert_eq(put_stream(cli, "stream/a", u, 0, &tx, &end, &err), DG_ECANCELED);
	cr_assert_eq(end.sent, 5 << 20);
	cr_assert_eq(end.status, 0, "no reply to a body cut short");
	cr_assert(strstr(err.msg, "send the body") && strstr(err.msg, "stream/a"), "%s", err.msg);
	cr_assert_eq(dg_var_get(cli, "stream/a", &back, &info, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(info.version, v, "the value is unchanged");
	assert_same(t, back);
	dg_tensor_free(back);
	dg_tensor_free(u);
	dg_tensor_free(t);
}

Test(client, put_stream_if_match_conflict_is_the_servers_error)
{
	int64_t n = 1 << 20;
	struct dg_tensor *t = pattern(DG_F32, 1, &n);
	struct from_tx tx = { .step = 1 << 20 };
	struct dg_var_put_end end;
	struct dg_err err = { 0 };
	uint64_t v = put(cli, "stream/c", t);

	cr_assert_eq(put_stream(cli, "stream/c", t, v + 7, &tx, &end, &err), DG_ECONFLICT);
	cr_assert(end.status == 409 || end.status == 412, "HTTP %d", end.status);
	cr_assert(strstr(err.msg, "stream/c"), "%s", err.msg);
	tx = (struct from_tx){ .step = 1 << 20 };
	cr_assert_eq(put_stream(cli, "stream/c", t, v, &tx, &end, &err), DG_OK, "%s", err.msg);
	cr_assert_gt(end.version, v);
	dg_tensor_free(t);
}

Test(client, put_stream_sends_the_token_and_reports_a_dead_server)
{
	struct ps_server *s = start_server("sekrit");
	struct dg_client *good = client_of(s, "sekrit"), *bad = client_of(s, "wrong");
	int64_t n = 1 << 20;
	struct dg_tensor *t = pattern(DG_F32, 1, &n);
	struct from_tx tx = { .step = 1 << 20 };
	struct dg_var_put_end end;
	struct dg_err err = { 0 };

	cr_assert_eq(put_stream(good, "t", t, 0, &tx, &end, &err), DG_OK, "%s", err.msg);
	tx = (struct from_tx){ .step = 1 << 20 };
	cr_assert_eq(put_stream(bad, "t", t, 0, &tx, &end, &err), DG_EUNAUTHORIZED, "%s",
		     err.msg);
	cr_assert_eq(end.status, 401);
	dg_client_free(bad);
	ps_server_stop(s);
	tx = (struct from_tx){ .step = 1 << 20 };
	cr_assert_eq(put_stream(good, "t", t, 0, &tx, &end, &err), DG_EUNAVAILABLE);
	cr_assert(strstr(err.msg, "connect"), "%s", err.msg);
	cr_assert_eq(end.sent, 0);
	dg_client_free(good);
	dg_tensor_free(t);
}

/* A server that accepts connections (the kernel's backlog) and reads
 * nothing: a large body's send waits on it. */
static int deaf_listener(int *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(listen(fd, 4), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	*port = ntohs(sa.sin_port);
	return fd;
}

static void *stop_later(void *p)
{
	usleep(200 * 1000);
	cr_assert_eq(eventfd_write(*(int *)p, 1), 0);
	return NULL;
}

Test(client, put_stream_a_stop_fd_ends_a_send_the_server_does_not_take)
{
	int port, lfd = deaf_listener(&port), efd = eventfd(0, EFD_CLOEXEC);
	int64_t n = 16 << 20;           /* 64 MiB: more than the sockets' buffers */
	struct dg_tensor *t = pattern(DG_F32, 1, &n);
	struct from_tx tx = { .step = t->nbytes };
	struct dg_var_from from = { .more = tx_more, .stop_fd = efd };
	struct dg_var_put_end end;
	struct dg_err err = { 0 };
	struct dg_client *c;
	char a[64];
	pthread_t th;

	snprintf(a, sizeof a, "127.0.0.1:%d", port);
	c = dg_client_new(a, NULL, &err);
	cr_assert_not_null(c, "%s", err.msg);
	tx.nbytes = t->nbytes;
	cr_assert_eq(pthread_create(&th, NULL, stop_later, &efd), 0);
	double t0 = dg_mono_s();
	cr_assert_eq(dg_var_put_stream(c, "deaf", t->dtype, &t->shape, t->data, t->nbytes, 0,
				       &from, &tx, &end, &err), DG_ECANCELED, "%s", err.msg);
	double took = dg_mono_s() - t0;
	pthread_join(th, NULL);
	cr_assert_lt(end.sent, t->nbytes);
	cr_assert_eq(end.status, 0);
	cr_assert_lt(took, 5.0, "the stop ends the wait at once (%.2f s)", took);
	/* without a stop, the client's timeout ends it */
	dg_client_set_timeout(c, 300);
	tx = (struct from_tx){ .step = t->nbytes, .nbytes = t->nbytes };
	from.stop_fd = -1;
	cr_assert_eq(dg_var_put_stream(c, "deaf", t->dtype, &t->shape, t->data, t->nbytes, 0,
				       &from, &tx, &end, &err), DG_ETIMEOUT, "%s", err.msg);
	dg_client_free(c);
	close(efd);
	close(lfd);
	dg_tensor_free(t);
}
