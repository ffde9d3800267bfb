/* The zero-copy GET path: dg_tensor_adopt, and dg_http_request with
 * aligned_body against a real parameter server on a loopback port (the body
 * lands in one dg_alloc_aligned block, reused across requests, which
 * dg_var_get then adopts as the tensor's data). Error replies still go to
 * the result's body. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dg/client.h"
#include "dg/http.h"
#include "dg/tensor.h"
#include "server.h"

static struct ps_server *srv;
static struct dg_client *cli;
static struct dg_http_client *http;

static void setup(void)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .port = 0 };
	struct dg_err err = { 0 };
	char a[64];

	srv = ps_server_start(&cfg, &err);
	cr_assert_not_null(srv, "ps_server_start: %s", err.msg);
	snprintf(a, sizeof a, "127.0.0.1:%d", ps_server_port(srv));
	cli = dg_client_new(a, NULL, &err);
	cr_assert_not_null(cli, "dg_client_new: %s", err.msg);
	http = dg_http_client_new(a, NULL, 0, &err);
	cr_assert_not_null(http, "dg_http_client_new: %s", err.msg);
}

static void teardown(void)
{
	dg_http_client_free(http);
	dg_client_free(cli);
	ps_server_stop(srv);
	http = NULL;
	cli = NULL;
	srv = NULL;
}

TestSuite(zerocopy, .init = setup, .fini = teardown, .timeout = 60);

/* A float32 [n] variable whose element i is i * 0.5 - 7. */
static void put_ramp(const char *name, int64_t n)
{
	struct dg_shape s = dg_shape_make(1, &n);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new_uninit(DG_F32, &s, &err);
	uint64_t v = 0;

	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < n; i++)
		((float *)t->data)[i] = (float)i * 0.5f - 7.0f;
	cr_assert_eq(dg_var_put(cli, name, t, NULL, &v, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(t);
}

Test(zerocopy, adopt_takes_the_block_and_checks_its_length)
{
	int64_t d[2] = { 3, 5 };
	struct dg_shape s = dg_shape_make(2, d);
	struct dg_err err = { 0 };
	float *p = dg_alloc_aligned(15 * sizeof(float));

	cr_assert_not_null(p);
	for (int i = 0; i < 15; i++)
		p[i] = (float)i + 0.25f;
	/* wrong length: refused, naming both sizes; the block stays ours */
	cr_assert_null(dg_tensor_adopt(DG_F32, &s, p, 14 * sizeof(float), &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert(strstr(err.msg, "56 bytes") && strstr(err.msg, "60 bytes"), "%s", err.msg);
	struct dg_tensor *t = dg_tensor_adopt(DG_F32, &s, p, 15 * sizeof(float), &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->data, (void *)p, "adopt must not copy");
	cr_assert_eq(t->numel, 15);
	cr_assert_eq(t->nbytes, 60);
	cr_assert_float_eq(((float *)t->data)[14], 14.25f, 0);
	dg_tensor_free(t);          /* frees p */

	/* an empty tensor from no block still gets data of its own */
	int64_t z = 0;
	struct dg_shape e = dg_shape_make(1, &z);
	t = dg_tensor_adopt(DG_I64, &e, NULL, 0, &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_not_null(t->data);
	cr_assert_eq(t->nbytes, 0);
	dg_tensor_free(t);
	cr_assert_null(dg_tensor_adopt(DG_I64, &e, NULL, 8, &err));
	cr_assert_eq(err.code, DG_EINVAL);
}

Test(zerocopy, an_aligned_body_is_sized_once_and_reused)
{
	const int64_t n = 3 << 18;              /* 3 MiB of float32 */
	const struct dg_http_header h = { "Accept", "application/octet-stream" };
	struct dg_http_result res;
	struct dg_err err = { 0 };

	put_ramp("big", n);
	dg_http_result_init(&res);
	res.aligned_body = true;
	cr_assert_eq(dg_http_request(http, "GET", "/v1/vars/big", &h, 1, NULL, 0, &res, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(res.body.len, 0, "a 2xx body must not go to body");
	cr_assert_eq(res.aligned_len, (size_t)n * 4);
	cr_assert_eq(res.aligned_cap, (size_t)n * 4, "sized once from Content-Length");
	cr_assert_eq((uintptr_t)res.aligned % 64, 0);
	const float *f = res.aligned;
	cr_assert_float_eq(f[0], -7.0f, 0);
	cr_assert_float_eq(f[n - 1], (float)(n - 1) * 0.5f - 7.0f, 0);
	void *first = res.aligned;

	/* the same result again: the block is reused, not reallocated */
	cr_assert_eq(dg_http_request(http, "GET", "/v1/vars/big", &h, 1, NULL, 0, &res, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(res.aligned, first);
	cr_assert_eq(res.aligned_len, (size_t)n * 4);

	/* an error reply goes to body, with the server's message */
	cr_assert_eq(dg_http_request(http, "GET", "/v1/vars/ghost", &h, 1, NULL, 0, &res, &err),
		     DG_ENOTFOUND);
	cr_assert_eq(res.status, 404);
	cr_assert_eq(res.aligned_len, 0);
	cr_assert_gt(res.body.len, 0);
	cr_assert(strstr(err.msg, "ghost"), "%s", err.msg);

	size_t len = 1;
	void *p = dg_http_result_take_aligned(&res, &len);
	cr_assert_eq(p, first);
	cr_assert_eq(len, 0, "the last body was the error's");
	cr_assert_null(res.aligned);
	dg_free_aligned(p);
	dg_http_result_deinit(&res);
}

Test(zerocopy, get_and_wait_return_the_stored_values)
{
	const int64_t n = 1 << 20;              /* 4 MiB */
	struct dg_tensor *t = NULL;
	struct dg_var_info info;
	struct dg_err err = { 0 };

	put_ramp("w", n);
	for (int round = 0; round < 3; round++) {
		cr_assert_eq(dg_var_get(cli, "w", &t, &info, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(t->nbytes, (size_t)n * 4);
		cr_assert_eq((uintptr_t)t->data % 64, 0);
		cr_assert_float_eq(((float *)t->data)[12345], 12345 * 0.5f - 7.0f, 0);
		cr_assert_float_eq(((float *)t->data)[n - 1], (float)(n - 1) * 0.5f - 7.0f, 0);
		dg_tensor_free(t);
		t = NULL;
	}
	cr_assert_eq(dg_var_wait(cli, "w", info.version, 1000, &t, NULL, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(t->nbytes, (size_t)n * 4);
	cr_assert_float_eq(((float *)t->data)[7], 7 * 0.5f - 7.0f, 0);
	dg_tensor_free(t);
	t = NULL;
	/* after an error reply the client still decodes the next GET */
	cr_assert_eq(dg_var_get(cli, "nope", &t, NULL, &err), DG_ENOTFOUND);
	cr_assert_null(t);
	cr_assert_eq(dg_var_get(cli, "w", &t, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(((float *)t->data)[1], -6.5f, 0);
	dg_tensor_free(t);
}
