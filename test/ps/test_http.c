/* The HTTP layer (core/src/http_server.c, core/src/http_client.c): a server on
 * a loopback port with a route table of test handlers, driven by the client
 * and by raw sockets for what a well-behaved client never sends (truncated
 * bodies, lying Content-Length, oversized headers, early disconnects). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"
#include "dg/http.h"
#include "dg/log.h"
#include "dg/tensor.h"

#define REF_BYTES ((size_t)32 << 20)

/* ------------------------------------------------------------ test state */

static struct dg_http_server *srv;              /* the suite's server */
static int port;
static char addr[64];
static struct dg_http_server *extra_srv[4];     /* servers a test starts itself */
static int n_extra;
static struct dg_http_client *clients[16];
static int n_clients;

static unsigned char *ref_block;                /* served by GET /v1/ref without a copy */
static atomic_int ref_releases;
static pthread_mutex_t blob_mu = PTHREAD_MUTEX_INITIALIZER;
static void *blob;                              /* last PUT /blob body (taken, aligned) */
static size_t blob_len;
static atomic_int blob_releases;
static atomic_int count_calls;                  /* POST /v1/count handler runs */
static atomic_size_t count_len;
static char count_head[32];

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
	struct timespec t = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&t, NULL);
}

/* ------------------------------------------------------------- handlers */

static enum dg_status reply_json(struct dg_http_resp *w, json_t *j)
{
	dg_http_set_json(w, 200, j);
	return DG_OK;
}

/* Each route names itself through its own handler, so a test sees which won. */
#define NAMED(fn, label)                                                                   \
	static enum dg_status fn(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,  \
				 struct dg_err *err)                                       \
	{                                                                                  \
		const char *name = dg_http_param(r, "name"), *id = dg_http_param(r, "id");  \
		return reply_json(w, json_pack("{s:s,s:s,s:s,s:s}", "route", label, "method", \
					       dg_http_method(r), "path", dg_http_path(r),  \
					       "param", name ? name : id ? id : ""));       \
	}
NAMED(h_apply, "apply")
NAMED(h_var_get, "var_get")
NAMED(h_var_delete, "var_delete")
NAMED(h_job, "job")
NAMED(h_events, "events")
NAMED(h_step, "step")

static enum dg_status h_health(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	return dg_buf_append(dg_http_body_buf(w, "text/plain"), "ok\n", 3, err);
}

static enum dg_status h_query(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			      struct dg_err *err)
{
	int64_t n;
	double lr;
	enum dg_status st = dg_http_query_int(r, "n", 7, &n, err);

	if (st == DG_OK)
		st = dg_http_query_double(r, "lr", 0.5, &lr, err);
	if (st != DG_OK)
		return st;
	const char *f = dg_http_query(r, "f");
	return reply_json(w, json_pack("{s:I,s:f,s:s?}", "n", (json_int_t)n, "lr", lr, "f", f));
}

static enum dg_status h_fail(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			     struct dg_err *err)
{
	/* A body started before the failure must be dropped, not sent. */
	dg_buf_append(dg_http_body_buf(w, "text/plain"), "partial", 7, NULL);
	dg_err_set(err, DG_ESHAPE, "variable 'w1' has shape [2,3], the update has [4]");
	dg_err_hint(err, "send a tensor of shape [2,3]");
	return DG_ESHAPE;
}

/* A server that asks another one (?port=P on loopback) and fails with its
 * error: what a worker's apply to a ps that is down does. */
static enum dg_status h_relay(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			      struct dg_err *err)
{
	int64_t to = 0;
	char a[64];
	struct dg_http_result res;
	enum dg_status st = dg_http_query_int(r, "port", 0, &to, err);

	if (st != DG_OK)
		return st;
	snprintf(a, sizeof a, "127.0.0.1:%d", (int)to);
	struct dg_http_client *c = dg_http_client_new(a, NULL, 2000, err);
	if (!c)
		return err->code;
	dg_http_result_init(&res);
	st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, err);
	dg_http_result_deinit(&res);
	dg_http_client_free(c);
	if (st == DG_OK)
		dg_http_set_json(w, 200, json_pack("{s:b}", "ok", 1));
	else
		dg_err_prefix(err, "relay");
	return st;
}

static enum dg_status h_sleep(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			      struct dg_err *err)
{
	int64_t ms;
	enum dg_status st = dg_http_query_int(r, "ms", 200, &ms, err);

	if (st != DG_OK)
		return st;
	sleep_ms((int)ms);
	return dg_buf_append(dg_http_body_buf(w, "text/plain"), "slept", 5, err);
}

static void count_release(void *ud)
{
	atomic_fetch_add((atomic_int *)ud, 1);
}

static enum dg_status h_ref(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			    struct dg_err *err)
{
	dg_http_set_body_ref(w, "application/octet-stream", ref_block, REF_BYTES, count_release,
			     &ref_releases);
	dg_http_add_header(w, "Dg-Dtype", "uint8");
	dg_http_add_header(w, "Dg-Shape", "33554432");
	dg_http_add_header(w, "Dg-Version", "42");
	dg_http_add_header(w, "Dg-Count", "3");
	dg_http_add_header(w, "Content-Range", "bytes 0-33554431/33554432");
	return DG_OK;
}

static enum dg_status h_blob_put(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				 struct dg_err *err)
{
	size_t n;
	const void *peek = dg_http_body(r, &n);
	void *p = dg_http_body_take(r, &n);

	if (peek != p || ((uintptr_t)p & 63) != 0)
		return dg_err_set(err, DG_EINTERNAL, "body block %p / %p not aligned or not the "
				  "one taken", peek, p);
	if (dg_http_body(r, NULL) != NULL)
		return dg_err_set(err, DG_EINTERNAL, "body still visible after take");
	pthread_mutex_lock(&blob_mu);
	dg_free_aligned(blob);
	blob = p;
	blob_len = n;
	pthread_mutex_unlock(&blob_mu);
	dg_http_set_json(w, 201, json_pack("{s:I}", "bytes", (json_int_t)n));
	return DG_OK;
}

static enum dg_status h_blob_get(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				 struct dg_err *err)
{
	pthread_mutex_lock(&blob_mu);
	void *p = blob;
	size_t n = blob_len;
	pthread_mutex_unlock(&blob_mu);
	if (!p)
		return dg_err_set(err, DG_ENOTFOUND, "no blob stored");
	dg_http_set_body_ref(w, "application/octet-stream", p, n, count_release, &blob_releases);
	return DG_OK;
}

static enum dg_status h_count(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			      struct dg_err *err)
{
	size_t n;
	const char *b = dg_http_body(r, &n);

	atomic_fetch_add(&count_calls, 1);
	atomic_store(&count_len, n);
	snprintf(count_head, sizeof count_head, "%.*s", (int)(n < 31 ? n : 31), b ? b : "");
	return reply_json(w, json_pack("{s:I}", "len", (json_int_t)n));
}

static enum dg_status h_head_only(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	dg_http_add_header(w, "Content-Length", "1234");
	dg_http_add_header(w, "Dg-Version", "5");
	return DG_OK;
}

static const struct dg_route routes[] = {
	{ "GET", "/v1/health", h_health, "health" },
	{ "POST", "/v1/vars/{name...}/apply", h_apply, "apply" },
	{ "GET", "/v1/vars/{name...}", h_var_get, "read" },
	{ "DELETE", "/v1/vars/{name...}", h_var_delete, "delete" },
	{ "GET", "/v1/jobs/{id}/events", h_events, "events" },
	{ "GET", "/v1/jobs/{id}", h_job, "job" },
	{ "PUT", "/v1/steps/{id}/tensors/{name...}", h_step, "rendezvous" },
	{ "GET", "/v1/query", h_query, "query helpers" },
	{ "GET", "/v1/fail", h_fail, "always fails" },
	{ "GET", "/v1/relay", h_relay, "asks another server" },
	{ "GET", "/v1/sleep", h_sleep, "sleeps ?ms=" },
	{ "GET", "/v1/ref", h_ref, "32 MiB by reference" },
	{ "PUT", "/blob", h_blob_put, "store a body" },
	{ "GET", "/blob", h_blob_get, "the stored body" },
	{ "POST", "/v1/count", h_count, "count bodies" },
	{ "HEAD", "/v1/head-only", h_head_only, "HEAD without a body" },
	{ "GET", "/v1/head-only", h_health, "GET of it" },
};
#define N_ROUTES ((int)(sizeof routes / sizeof routes[0]))

/* --------------------------------------------------------------- fixture */

/* Server logs go nowhere unless DG_TEST_LOG is set (then to stderr). */
static void quiet_sink(enum dg_log_level level, const char *component, const char *line,
		       void *ud)
{
	if (getenv("DG_TEST_LOG"))
		fprintf(stderr, "%s: %s\n", component, line);
}

static void setup(void)
{
	struct dg_err err = { 0 };
	struct dg_http_config cfg = {
		.max_body = (size_t)64 << 20, .request_timeout_s = 30, .server_name = "test",
		.epoch = 7,
	};

	dg_log_set_sink(quiet_sink, NULL);
	if (getenv("DG_TEST_LOG"))
		dg_log_set_level(DG_LOG_DEBUG);
	ref_block = malloc(REF_BYTES);
	cr_assert_not_null(ref_block);
	for (size_t i = 0; i < REF_BYTES; i++)
		ref_block[i] = (unsigned char)(i * 131 + (i >> 12));
	srv = dg_http_server_new(&cfg, routes, N_ROUTES, NULL, &err);
	cr_assert_not_null(srv, "%s", err.msg);
	port = dg_http_server_port(srv);
	cr_assert_gt(port, 0);
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
}

static void teardown(void)
{
	for (int i = 0; i < n_clients; i++)
		dg_http_client_free(clients[i]);
	n_clients = 0;
	dg_http_server_free(srv);
	srv = NULL;
	for (int i = 0; i < n_extra; i++)
		dg_http_server_free(extra_srv[i]);
	n_extra = 0;
	dg_free_aligned(blob);
	blob = NULL;
	free(ref_block);
	ref_block = NULL;
	dg_log_set_sink(NULL, NULL);
}

TestSuite(http, .init = setup, .fini = teardown);

static struct dg_http_client *client_for(const char *address, const char *token, long timeout)
{
	struct dg_err err = { 0 };
	struct dg_http_client *c = dg_http_client_new(address, token, timeout, &err);

	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_lt(n_clients, 16);
	clients[n_clients++] = c;
	return c;
}

static struct dg_http_client *client(void)
{
	return client_for(addr, NULL, 10000);
}

static struct dg_http_server *start_extra(const struct dg_http_config *cfg)
{
	struct dg_err err = { 0 };
	struct dg_http_server *s = dg_http_server_new(cfg, routes, N_ROUTES, NULL, &err);

	cr_assert_not_null(s, "%s", err.msg);
	extra_srv[n_extra++] = s;
	return s;
}

/* A request whose JSON answer is returned (owned); asserts DG_OK. */
static json_t *get_json(struct dg_http_client *c, const char *method, const char *path)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, method, path, NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, DG_OK, "%s %s: %s", method, path, err.msg);
	cr_assert_eq(res.status, 200, "%s %s: %d", method, path, res.status);
	cr_assert_str_eq(res.content_type, "application/json");
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	cr_assert_not_null(j, "%s %s: body '%s'", method, path, res.body.data);
	dg_http_result_deinit(&res);
	return j;
}

static void expect_route(struct dg_http_client *c, const char *method, const char *path,
			 const char *route, const char *param)
{
	json_t *j = get_json(c, method, path);

	cr_assert_str_eq(json_string_value(json_object_get(j, "route")), route, "%s %s", method,
			 path);
	cr_assert_str_eq(json_string_value(json_object_get(j, "param")), param, "%s %s", method,
			 path);
	cr_assert_str_eq(json_string_value(json_object_get(j, "method")), method);
	json_decref(j);
}

/* A request expected to fail with code; returns the HTTP status. */
static int expect_error(struct dg_http_client *c, const char *method, const char *path,
			enum dg_status code, const char *msg_part)
{
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, method, path, NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, code, "%s %s: got %s (%s)", method, path, dg_status_name(st), err.msg);
	cr_assert_eq(err.code, code);
	if (msg_part)
		cr_assert(strstr(err.msg, msg_part), "%s %s: '%s' lacks '%s'", method, path,
			  err.msg, msg_part);
	cr_assert_eq(res.dg_epoch, 7, "errors carry Dg-Epoch too");
	int status = res.status;
	dg_http_result_deinit(&res);
	return status;
}

/* ---------------------------------------------------------- raw sockets */

static int raw_connect_from(int p, const char *src);

static int raw_connect(int p)
{
	return raw_connect_from(p, "127.0.0.1");
}

static void raw_send(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w <= 0)
			return;         /* the server may have answered and closed: fine */
		c += w;
		n -= (size_t)w;
	}
}

/* Read until the peer closes (or 5 s pass); NUL-terminated, returns length. */
static size_t raw_read_all(int fd, char *out, size_t cap)
{
	size_t n = 0;

	while (n + 1 < cap) {
		ssize_t r = recv(fd, out + n, cap - 1 - n, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	out[n] = '\0';
	return n;
}

/* One request on a fresh connection; the whole answer until close. */
static size_t raw_exchange(int p, const char *req, size_t n, char *out, size_t cap)
{
	int fd = raw_connect(p);

	raw_send(fd, req, n);
	size_t got = raw_read_all(fd, out, cap);
	close(fd);
	return got;
}

static bool server_healthy(const char *address)
{
	struct dg_http_client *c = client_for(address, NULL, 5000);
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err);
	bool ok = st == DG_OK && res.status == 200 && res.body.len == 3 &&
		  memcmp(res.body.data, "ok\n", 3) == 0;
	dg_http_result_deinit(&res);
	return ok;
}

static uint64_t metric(struct dg_http_server *s, const char *line_prefix)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_http_server_metrics(s, &b, &err), DG_OK, "%s", err.msg);
	/* At the start of a line: "# HELP name ..." must not match. */
	char *pat = malloc(strlen(line_prefix) + 2);
	cr_assert_not_null(pat);
	sprintf(pat, "\n%s", line_prefix);
	const char *p = strstr(b.data, pat);
	uint64_t v = p ? strtoull(p + strlen(pat), NULL, 10) : UINT64_MAX;
	free(pat);
	dg_buf_deinit(&b);
	return v;
}

static bool wait_for(atomic_int *v, int want, int ms)
{
	for (int i = 0; i < ms / 10 && atomic_load(v) != want; i++)
		sleep_ms(10);
	return atomic_load(v) == want;
}

/* ------------------------------------------------------------------ tests */

Test(http, every_route_kind_matches_and_the_first_matching_route_wins)
{
	struct dg_http_client *c = client();

	expect_route(c, "GET", "/v1/jobs/42", "job", "42");
	expect_route(c, "GET", "/v1/jobs/42/events", "events", "42");
	expect_route(c, "GET", "/v1/vars/w", "var_get", "w");
	expect_route(c, "GET", "/v1/vars/model/layer1/w", "var_get", "model/layer1/w");
	/* The suffix route is listed first and takes POST .../apply ... */
	expect_route(c, "POST", "/v1/vars/a/b/apply", "apply", "a/b");
	expect_route(c, "POST", "/v1/vars/w/apply", "apply", "w");
	/* ... while a GET of the same path falls through to the general route. */
	expect_route(c, "GET", "/v1/vars/a/b/apply", "var_get", "a/b/apply");
	expect_route(c, "DELETE", "/v1/vars/a/b", "var_delete", "a/b");
	/* {name...} needs at least one segment before the suffix. */
	expect_error(c, "POST", "/v1/vars/apply", DG_EUNSUPPORTED, "not allowed");
	expect_error(c, "GET", "/v1/vars", DG_ENOTFOUND, "no route");
	expect_error(c, "GET", "/v1/jobs/", DG_ENOTFOUND, NULL);        /* {id} is not empty */
}

Test(http, two_parameters_in_one_pattern_are_both_captured)
{
	struct dg_http_client *c = client();
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "PUT", "/v1/steps/17/tensors/x/y:0", NULL, 0, "ab", 2,
				     &res, &err), DG_OK, "%s", err.msg);
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	cr_assert_str_eq(json_string_value(json_object_get(j, "route")), "step");
	/* param prefers "name": the rest of the path after tensors/. */
	cr_assert_str_eq(json_string_value(json_object_get(j, "param")), "x/y:0");
	json_decref(j);
	dg_http_result_deinit(&res);
}

Test(http, the_path_is_percent_decoded_before_matching_and_bad_escapes_are_400)
{
	struct dg_http_client *c = client();

	expect_route(c, "GET", "/v1/vars/a%2Fb%20c", "var_get", "a/b c");
	expect_route(c, "GET", "/v1/jobs/x%41%7e", "job", "xA~");
	expect_route(c, "POST", "/v1/vars/a%2fb/apply", "apply", "a/b");
	/* Escaped literal segments match too: "%76%31" is "v1". */
	expect_route(c, "GET", "/%76%31/jobs/%35", "job", "5");
}

Test(http, percent_escapes_that_are_malformed_or_nul_are_refused_with_400)
{
	struct dg_http_client *c = client();
	const char *bad[] = { "/v1/vars/%00", "/v1/vars/a%4", "/v1/vars/%zz", "/v1/vars/%",
			      "/v1/vars/a%0" };

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(expect_error(c, "GET", bad[i], DG_EINVAL, "path"), 400, "%s", bad[i]);
	/* The connection and the server survive. */
	expect_route(c, "GET", "/v1/vars/ok", "var_get", "ok");
}

Test(http, unknown_paths_are_404_and_wrong_methods_405_with_an_allow_header)
{
	struct dg_http_client *c = client();
	char out[4096];

	cr_assert_eq(expect_error(c, "GET", "/nope", DG_ENOTFOUND, "'/nope'"), 404);
	cr_assert_eq(expect_error(c, "DELETE", "/v1/health", DG_EUNSUPPORTED, "DELETE"), 405);
	cr_assert_eq(expect_error(c, "PATCH", "/v1/vars/w", DG_EUNSUPPORTED, NULL), 405);
	static const char req[] = "DELETE /v1/jobs/3 HTTP/1.1\r\nHost: x\r\n"
				  "Connection: close\r\n\r\n";
	raw_exchange(port, req, sizeof req - 1, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 405", 12) == 0, "%s", out);
	cr_assert(strstr(out, "\r\nAllow: GET, HEAD\r\n"), "%s", out);
	cr_assert(strstr(out, "\r\nContent-Type: application/json\r\n"), "%s", out);
	cr_assert(strstr(out, "\"code\":\"unsupported\""), "%s", out);
	cr_assert(strstr(out, "\r\nDg-Epoch: 7\r\n"), "%s", out);
	cr_assert(strstr(out, "\r\nServer: dg/"), "%s", out);
	static const char req2[] = "PUT /v1/vars/w HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
				   "Content-Length: 0\r\n\r\n";
	raw_exchange(port, req2, sizeof req2 - 1, out, sizeof out);
	cr_assert(strstr(out, "\r\nAllow: GET, HEAD, DELETE\r\n"), "%s", out);
}

Test(http, query_helpers_parse_strictly_and_name_the_parameter)
{
	struct dg_http_client *c = client();
	json_t *j = get_json(c, "GET", "/v1/query?n=-12&lr=2.5e-3&f");

	cr_assert_eq(json_integer_value(json_object_get(j, "n")), -12);
	cr_assert_float_eq(json_real_value(json_object_get(j, "lr")), 2.5e-3, 1e-15);
	cr_assert_str_eq(json_string_value(json_object_get(j, "f")), "");
	json_decref(j);
	j = get_json(c, "GET", "/v1/query");
	cr_assert_eq(json_integer_value(json_object_get(j, "n")), 7);
	cr_assert_float_eq(json_real_value(json_object_get(j, "lr")), 0.5, 1e-15);
	cr_assert(json_is_null(json_object_get(j, "f")));
	json_decref(j);
	j = get_json(c, "GET", "/v1/query?n=9223372036854775807&lr=%2B1.5");
	cr_assert_eq(json_integer_value(json_object_get(j, "n")), INT64_MAX);
	cr_assert_float_eq(json_real_value(json_object_get(j, "lr")), 1.5, 1e-15);
	json_decref(j);
	const char *bad[][2] = {
		{ "/v1/query?n=12x", "'n' must be an integer, got '12x'" },
		{ "/v1/query?n=", "'n' must be an integer" },
		{ "/v1/query?n", "'n' must be an integer" },
		{ "/v1/query?n=%2012", "'n' must be an integer" },
		{ "/v1/query?n=1.5", "'n' must be an integer" },
		{ "/v1/query?n=9223372036854775808", "'n' is out of range" },
		{ "/v1/query?lr=abc", "'lr' must be a number, got 'abc'" },
		{ "/v1/query?lr=nan", "'lr' must be a number" },
		{ "/v1/query?lr=inf", "'lr' must be a number" },
		{ "/v1/query?lr=1e999", "'lr' is out of range" },
		{ "/v1/query?lr=0.1.2", "'lr' must be a number" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(expect_error(c, "GET", bad[i][0], DG_EINVAL, bad[i][1]), 400);
}

Test(http, head_uses_the_get_route_and_sends_its_length_without_a_body)
{
	struct dg_http_client *c = client();
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char out[4096];

	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "HEAD", "/v1/ref", NULL, 0, NULL, 0, &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(res.body.len, 0);
	cr_assert_eq(res.dg_version, 42);
	cr_assert_str_eq(res.dg_dtype, "uint8");
	dg_http_result_deinit(&res);
	cr_assert(wait_for(&ref_releases, 1, 2000), "release ran %d times",
		  atomic_load(&ref_releases));
	static const char req[] = "HEAD /v1/ref HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
	size_t n = raw_exchange(port, req, sizeof req - 1, out, sizeof out);
	cr_assert(strstr(out, "\r\nContent-Length: 33554432\r\n"), "%s", out);
	const char *end = strstr(out, "\r\n\r\n");
	cr_assert_not_null(end);
	cr_assert_eq((size_t)(end + 4 - out), n, "no body after the headers");
	/* A route of its own for HEAD wins over GET, and may state the length. */
	static const char req2[] = "HEAD /v1/head-only HTTP/1.1\r\nHost: x\r\nConnection: close"
				   "\r\n\r\n";
	n = raw_exchange(port, req2, sizeof req2 - 1, out, sizeof out);
	cr_assert(strstr(out, "\r\nContent-Length: 1234\r\n"), "%s", out);
	cr_assert(strstr(out, "\r\nDg-Version: 5\r\n"), "%s", out);
	cr_assert_eq((size_t)(strstr(out, "\r\n\r\n") + 4 - out), n);
	cr_assert(wait_for(&ref_releases, 2, 2000));
}

Test(http, a_32_mib_upload_and_download_round_trip_is_byte_exact)
{
	struct dg_http_client *c = client();
	struct dg_http_result res;
	struct dg_err err = { 0 };
	size_t n = (size_t)32 << 20;
	unsigned char *data = malloc(n);

	cr_assert_not_null(data);
	for (size_t i = 0; i < n; i++)
		data[i] = (unsigned char)((i * 2654435761u) >> 13);
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "PUT", "/blob", NULL, 0, data, n, &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(res.status, 201);
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	cr_assert_eq(json_integer_value(json_object_get(j, "bytes")), (json_int_t)n);
	json_decref(j);
	cr_assert_eq(dg_http_request(c, "GET", "/blob", NULL, 0, NULL, 0, &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(res.body.len, n);
	cr_assert_eq(memcmp(res.body.data, data, n), 0);
	cr_assert_str_eq(res.content_type, "application/octet-stream");
	cr_assert(wait_for(&blob_releases, 1, 2000));
	/* The GET by reference made no copy: the bytes served were the block. */
	cr_assert_eq(dg_http_request(c, "GET", "/v1/ref", NULL, 0, NULL, 0, &res, &err), DG_OK);
	cr_assert_eq(res.body.len, REF_BYTES);
	cr_assert_eq(memcmp(res.body.data, ref_block, REF_BYTES), 0);
	cr_assert_eq(res.dg_count, 3);
	cr_assert_str_eq(res.dg_shape, "33554432");
	cr_assert_str_eq(res.content_range, "bytes 0-33554431/33554432");
	dg_http_result_deinit(&res);
	free(data);
	cr_assert(wait_for(&ref_releases, 1, 2000));
	cr_assert_geq(metric(srv, "dg_http_bytes_received_total "), n);
	cr_assert_geq(metric(srv, "dg_http_bytes_sent_total "), n + REF_BYTES);
}

Test(http, body_ref_release_runs_once_when_the_client_disconnects_mid_response)
{
	static const char req[] = "GET /v1/ref HTTP/1.1\r\nHost: x\r\n\r\n";
	char buf[1000];
	int fd = raw_connect(port);

	raw_send(fd, req, sizeof req - 1);
	ssize_t got = recv(fd, buf, sizeof buf, MSG_WAITALL);
	cr_assert_eq(got, (ssize_t)sizeof buf);
	cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0);
	struct linger lg = { 1, 0 };   /* close with RST: the server's sends fail at once */
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(fd);
	cr_assert(wait_for(&ref_releases, 1, 5000), "release ran %d times",
		  atomic_load(&ref_releases));
	sleep_ms(100);
	cr_assert_eq(atomic_load(&ref_releases), 1, "exactly once");
	cr_assert(server_healthy(addr));
}

Test(http, a_handler_error_drops_its_body_and_the_client_gets_code_message_and_hint)
{
	struct dg_http_client *c = client();
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, "GET", "/v1/fail", NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, DG_ESHAPE);
	cr_assert_eq(res.status, 400);
	cr_assert_str_eq(err.msg, "variable 'w1' has shape [2,3], the update has [4]");
	cr_assert_str_eq(err.hint, "send a tensor of shape [2,3]");
	cr_assert_str_eq(res.content_type, "application/json");
	cr_assert_null(strstr(res.body.data, "partial"));
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
			 "shape_mismatch");
	json_decref(j);
	dg_http_result_deinit(&res);
}

Test(http, a_token_server_refuses_missing_and_wrong_tokens_before_reading_the_body)
{
	struct dg_http_config cfg = { .token = "s3cret-token", .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	char a[64], out[4096];

	snprintf(a, sizeof a, "127.0.0.1:%d", dg_http_server_port(s));
	struct dg_http_client *none = client_for(a, NULL, 5000);
	struct dg_http_client *wrong = client_for(a, "s3cret-tokeX", 5000);
	struct dg_http_client *right = client_for(a, "s3cret-token", 5000);
	cr_assert_eq(expect_error(none, "GET", "/v1/health", DG_EUNAUTHORIZED, "missing"), 401);
	cr_assert_eq(expect_error(wrong, "GET", "/v1/health", DG_EUNAUTHORIZED, "wrong"), 401);
	cr_assert_eq(expect_error(none, "GET", "/nope", DG_EUNAUTHORIZED, NULL), 401,
		     "no route information before auth");
	expect_route(right, "GET", "/v1/vars/w", "var_get", "w");
	/* An unauthenticated upload is answered from its headers: the 401 arrives
	 * although the announced megabyte is never sent. */
	static const char req[] = "POST /v1/count HTTP/1.1\r\nHost: x\r\n"
				  "Content-Length: 1048576\r\n\r\n";
	raw_exchange(dg_http_server_port(s), req, sizeof req - 1, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 401", 12) == 0, "%s", out);
	cr_assert(strstr(out, "\"code\":\"unauthorized\""), "%s", out);
	cr_assert_eq(atomic_load(&count_calls), 0);
	/* "Bearer" with a prefix of the token, or the token in another scheme. */
	struct dg_http_header h = { "Authorization", "Basic s3cret-token" };
	struct dg_http_result res;
	struct dg_err err = { 0 };
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(none, "GET", "/v1/health", &h, 1, NULL, 0, &res, &err),
		     DG_EUNAUTHORIZED);
	h.value = "Bearer s3cret";
	cr_assert_eq(dg_http_request(none, "GET", "/v1/health", &h, 1, NULL, 0, &res, &err),
		     DG_EUNAUTHORIZED);
	dg_http_result_deinit(&res);
}

Test(http, a_body_over_the_limit_is_413_from_its_headers_and_the_server_stays_healthy)
{
	struct dg_http_config cfg = { .max_body = 1024, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	char a[64], out[4096];
	int p = dg_http_server_port(s);

	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	/* 1 GB announced, nothing sent: the answer comes without reading a byte. */
	static const char req[] = "POST /v1/count HTTP/1.1\r\nHost: x\r\n"
				  "Content-Length: 1000000000\r\n\r\n";
	raw_exchange(p, req, sizeof req - 1, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 413", 12) == 0, "%s", out);
	cr_assert(strstr(out, "\"code\":\"too_large\""), "%s", out);
	cr_assert(strstr(out, "limit of 1024 bytes"), "%s", out);
	cr_assert_eq(atomic_load(&count_calls), 0);
	/* Through the client, with the body on its way. */
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char body[4096] = { 0 };
	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, "POST", "/v1/count", NULL, 0, body, sizeof body,
					    &res, &err);
	cr_assert_eq(st, DG_ETOOLARGE, "%s: %s", dg_status_name(st), err.msg);
	cr_assert_eq(res.status, 413);
	/* 8 MiB on its way while the server answers and closes: still a 413. */
	size_t big_n = (size_t)8 << 20;
	char *big = calloc(1, big_n);
	cr_assert_not_null(big);
	st = dg_http_request(c, "PUT", "/blob", NULL, 0, big, big_n, &res, &err);
	free(big);
	cr_assert_eq(st, DG_ETOOLARGE, "%s: %s", dg_status_name(st), err.msg);
	cr_assert(strstr(err.msg, "8388608 bytes exceeds the limit of 1024"), "%s", err.msg);
	/* At the limit is fine, on the same client. */
	st = dg_http_request(c, "POST", "/v1/count", NULL, 0, body, 1024, &res, &err);
	cr_assert_eq(st, DG_OK, "%s", err.msg);
	cr_assert_eq(atomic_load(&count_len), 1024);
	dg_http_result_deinit(&res);
	cr_assert(server_healthy(a));
}

Test(http, a_chunked_upload_is_collected_and_bounded_by_the_limit)
{
	struct dg_http_config cfg = { .max_body = 100, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	char out[4096];
	int p = dg_http_server_port(s);
	static const char req[] = "POST /v1/count HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
				  "Transfer-Encoding: chunked\r\n\r\n"
				  "5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n";

	raw_exchange(p, req, sizeof req - 1, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 200", 12) == 0, "%s", out);
	cr_assert(strstr(out, "{\"len\":11}"), "%s", out);
	cr_assert_str_eq(count_head, "hello world");
	/* 60 + 60 bytes pass 100 in the second chunk. */
	char big[512];
	int n = snprintf(big, sizeof big, "POST /v1/count HTTP/1.1\r\nHost: x\r\n"
			 "Transfer-Encoding: chunked\r\n\r\n"
			 "3c\r\n%060d\r\n3c\r\n%060d\r\n0\r\n\r\n",
			 0, 0);
	raw_exchange(p, big, (size_t)n, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 413", 12) == 0, "[%s]", out);
	cr_assert_eq(atomic_load(&count_calls), 1);
	char a[64];
	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	cr_assert(server_healthy(a));
}

Test(http, oversized_headers_are_refused_and_the_server_stays_healthy)
{
	char *req = malloc(70000);
	char out[4096];

	cr_assert_not_null(req);
	/* 64 KiB: beyond the connection's memory, libmicrohttpd refuses it. */
	int n = sprintf(req, "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: ");
	memset(req + n, 'a', 65536);
	n += 65536;
	n += sprintf(req + n, "\r\nConnection: close\r\n\r\n");
	raw_exchange(port, req, (size_t)n, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 431", 12) == 0 || strncmp(out, "HTTP/1.1 413", 12) == 0,
		  "%.200s", out);
	/* 20 KiB: fits in memory but is over the 16 KiB limit: our JSON refusal. */
	n = sprintf(req, "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: ");
	memset(req + n, 'b', 20000);
	n += 20000;
	n += sprintf(req + n, "\r\nConnection: close\r\n\r\n");
	raw_exchange(port, req, (size_t)n, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 431", 12) == 0, "%.200s", out);
	cr_assert(strstr(out, "\"code\":\"too_large\""), "%s", out);
	free(req);
	cr_assert(server_healthy(addr));
}

Test(http, a_truncated_body_never_reaches_the_handler)
{
	static const char req[] = "POST /v1/count HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
				  "\r\n0123456789";
	int fd = raw_connect(port);

	raw_send(fd, req, sizeof req - 1);
	sleep_ms(100);
	close(fd);
	for (int i = 0; i < 100 && metric(srv, "dg_http_requests_aborted_total ") == 0; i++)
		sleep_ms(10);
	cr_assert_eq(metric(srv, "dg_http_requests_aborted_total "), 1);
	cr_assert_eq(atomic_load(&count_calls), 0);
	cr_assert(server_healthy(addr));
}

Test(http, a_content_length_shorter_than_the_body_delivers_exactly_that_many_bytes)
{
	static const char req[] = "POST /v1/count HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
				  "\r\n0123456789ABCDEFGHIJ\r\n\r\n";
	char out[4096];

	raw_exchange(port, req, sizeof req - 1, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 200", 12) == 0, "%s", out);
	cr_assert(strstr(out, "{\"len\":10}"), "%s", out);
	cr_assert_eq(atomic_load(&count_calls), 1);
	cr_assert_eq(atomic_load(&count_len), 10);
	cr_assert_str_eq(count_head, "0123456789");
	/* The surplus is read as a next request, which is malformed: no handler,
	 * no second answer. */
	cr_assert_null(strstr(out + 12, "HTTP/1.1 200"), "%s", out);
	static const char bad[] = "POST /v1/count HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n"
				  "\r\n0123456789";
	raw_exchange(port, bad, sizeof bad - 1, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 400", 12) == 0, "%s", out);
	cr_assert_eq(atomic_load(&count_calls), 1);
	cr_assert(server_healthy(addr));
}

Test(http, keep_alive_serves_100_sequential_gets_on_one_connection)
{
	struct dg_http_client *c = client();
	struct dg_http_result res;
	struct dg_err err = { 0 };
	uint64_t before = metric(srv, "dg_http_connections_total ");

	dg_http_result_init(&res);
	for (int i = 0; i < 100; i++) {
		char path[64];
		snprintf(path, sizeof path, "/v1/jobs/%d", i);
		cr_assert_eq(dg_http_request(c, "GET", path, NULL, 0, NULL, 0, &res, &err), DG_OK);
		cr_assert_eq(res.status, 200);
	}
	/* PUTs and errors keep the connection as well. */
	for (int i = 0; i < 10; i++) {
		cr_assert_eq(dg_http_request(c, "POST", "/v1/count", NULL, 0, "abc", 3, &res, &err),
			     DG_OK);
		cr_assert_eq(dg_http_request(c, "GET", "/v1/fail", NULL, 0, NULL, 0, &res, &err),
			     DG_ESHAPE);
		cr_assert_eq(dg_http_request(c, "GET", "/nope", NULL, 0, NULL, 0, &res, &err),
			     DG_ENOTFOUND);
	}
	dg_http_result_deinit(&res);
	cr_assert_eq(metric(srv, "dg_http_connections_total ") - before, 1);
}

struct worker_arg {
	int id;
	int ok;
};

static void *worker(void *p)
{
	struct worker_arg *a = p;
	struct dg_err err = { 0 };
	struct dg_http_client *c = dg_http_client_new(addr, NULL, 10000, &err);
	struct dg_http_result res;

	if (!c)
		return NULL;
	dg_http_result_init(&res);
	for (int i = 0; i < 50; i++) {
		char path[64], want[80];
		snprintf(path, sizeof path, "/v1/jobs/t%d-%d", a->id, i);
		snprintf(want, sizeof want, "\"param\":\"t%d-%d\"", a->id, i);
		if (dg_http_request(c, "GET", path, NULL, 0, NULL, 0, &res, &err) == DG_OK &&
		    res.status == 200 && strstr(res.body.data, want))
			a->ok++;
	}
	dg_http_result_deinit(&res);
	dg_http_client_free(c);
	return NULL;
}

Test(http, eight_concurrent_clients_each_get_their_own_answers)
{
	pthread_t t[8];
	struct worker_arg a[8];
	uint64_t before = metric(srv, "dg_http_connections_total ");

	for (int i = 0; i < 8; i++) {
		a[i] = (struct worker_arg){ i, 0 };
		cr_assert_eq(pthread_create(&t[i], NULL, worker, &a[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(a[i].ok, 50, "thread %d: %d of 50", i, a[i].ok);
	}
	cr_assert_eq(metric(srv, "dg_http_connections_total ") - before, 8);
	/* A request is counted once its reply is queued: the last reply can reach
	 * its client a moment before its count lands. Wait for it (2 s at most). */
	const char *req = "dg_http_requests_total{route=\"/v1/jobs/{id}\",method=\"GET\","
			  "code=\"200\"} ";
	for (int i = 0; i < 200 && metric(srv, req) < 400; i++)
		usleep(10000);
	cr_assert_eq(metric(srv, req), 400);
}

static void *slow_get(void *p)
{
	struct dg_err err = { 0 };
	struct dg_http_client *c = dg_http_client_new(addr, NULL, 10000, &err);
	struct dg_http_result res;
	double *took = p;
	double t0 = now_s();

	if (!c)
		return NULL;
	dg_http_result_init(&res);
	if (dg_http_request(c, "GET", "/v1/sleep?ms=300", NULL, 0, NULL, 0, &res, &err) == DG_OK &&
	    res.body.len == 5)
		*took = now_s() - t0;
	dg_http_result_deinit(&res);
	dg_http_client_free(c);
	return NULL;
}

Test(http, a_blocking_handler_does_not_hold_up_other_connections)
{
	pthread_t t;
	double took = -1;
	struct dg_http_client *c = client();
	struct dg_http_result res;
	struct dg_err err = { 0 };

	cr_assert_eq(pthread_create(&t, NULL, slow_get, &took), 0);
	sleep_ms(50);
	dg_http_result_init(&res);
	double t0 = now_s();
	for (int i = 0; i < 10; i++)
		cr_assert_eq(dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err),
			     DG_OK);
	double quick = now_s() - t0;
	dg_http_result_deinit(&res);
	pthread_join(t, NULL);
	cr_assert_geq(took, 0.3, "the slow request took %.3f s", took);
	cr_assert_lt(quick, 0.2, "10 quick requests took %.3f s beside the slow one", quick);
}

Test(http, a_closed_port_is_unavailable_and_names_the_url)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof sa;
	char a[64], want[96];

	/* Bind an ephemeral port, learn it, close it: nobody listens there now. */
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	getsockname(fd, (struct sockaddr *)&sa, &sl);
	close(fd);
	snprintf(a, sizeof a, "http://127.0.0.1:%d/", ntohs(sa.sin_port));
	snprintf(want, sizeof want, "cannot reach http://127.0.0.1:%d: Connection refused",
		 ntohs(sa.sin_port));
	struct dg_http_client *c = client_for(a, NULL, 2000);
	struct dg_http_result res;
	struct dg_err err = { 0 };
	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, DG_EUNAVAILABLE);
	cr_assert_str_eq(err.msg, want);
	cr_assert_gt(strlen(err.hint), 0);
	a[strlen(a) - 1] = '\0';      /* the trailing '/' is dropped */
	cr_assert_str_eq(dg_http_client_url(c), a);
	dg_http_result_deinit(&res);
}

Test(http, a_request_past_the_client_timeout_is_a_timeout_naming_the_limit)
{
	struct dg_http_client *c = client_for(addr, NULL, 300);
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	double t0 = now_s();
	enum dg_status st = dg_http_request(c, "GET", "/v1/sleep?ms=1000", NULL, 0, NULL, 0, &res,
					    &err);
	double took = now_s() - t0;
	cr_assert_eq(st, DG_ETIMEOUT, "%s: %s", dg_status_name(st), err.msg);
	cr_assert(strstr(err.msg, "300 ms"), "%s", err.msg);
	cr_assert(strstr(err.msg, "/v1/sleep?ms=1000"), "%s", err.msg);
	cr_assert_lt(took, 0.9);
	/* The same client works afterwards (on a new connection). */
	st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, DG_OK, "%s", err.msg);
	dg_http_result_deinit(&res);
}

/* A one-shot server that answers any request with a canned response. */
struct canned {
	int fd;
	const char *answer;
};

static void *canned_serve(void *p)
{
	struct canned *cn = p;
	char buf[4096];
	int c = accept(cn->fd, NULL, NULL);

	if (c < 0)
		return NULL;
	recv(c, buf, sizeof buf, 0);
	send(c, cn->answer, strlen(cn->answer), MSG_NOSIGNAL);
	close(c);
	return NULL;
}

static enum dg_status canned_request(const char *answer, struct dg_err *err, int *status)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof sa;
	struct canned cn = { socket(AF_INET, SOCK_STREAM, 0), answer };
	pthread_t t;
	char a[64];

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(bind(cn.fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(listen(cn.fd, 1), 0);
	getsockname(cn.fd, (struct sockaddr *)&sa, &sl);
	snprintf(a, sizeof a, "127.0.0.1:%d", ntohs(sa.sin_port));
	pthread_create(&t, NULL, canned_serve, &cn);
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, "GET", "/x", NULL, 0, NULL, 0, &res, err);
	*status = res.status;
	dg_http_result_deinit(&res);
	pthread_join(t, NULL);
	close(cn.fd);
	return st;
}

Test(http, non_json_error_bodies_map_the_http_status_and_quote_the_first_line)
{
	struct dg_err err = { 0 };
	int status;

	enum dg_status st = canned_request("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 15"
					   "\r\nConnection: close\r\n\r\nbusy reloading\n", &err,
					   &status);
	cr_assert_eq(st, DG_EUNAVAILABLE);
	cr_assert_eq(status, 503);
	cr_assert(strstr(err.msg, "HTTP 503: busy reloading"), "%s", err.msg);
	st = canned_request("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
			    "Connection: close\r\n\r\n", &err, &status);
	cr_assert_eq(st, DG_ENOTFOUND);
	st = canned_request("HTTP/1.1 418 Teapot\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
			    "{}", &err, &status);
	cr_assert_eq(st, DG_EINTERNAL, "%s: %s", dg_status_name(st), err.msg);
	/* A JSON error with a code this version does not know reads as internal. */
	static const char unknown[] = "{\"error\":{\"code\":\"brand_new\",\"message\":\"m\","
				      "\"hint\":\"h\"}}";
	char answer[256];
	snprintf(answer, sizeof answer, "HTTP/1.1 409 Conflict\r\nContent-Length: %zu\r\n"
		 "Connection: close\r\n\r\n%s", sizeof unknown - 1, unknown);
	st = canned_request(answer, &err, &status);
	cr_assert_eq(st, DG_EINTERNAL, "%s: %s", dg_status_name(st), err.msg);
	cr_assert_str_eq(err.msg, "m");
	/* Below 400 is not an error: the caller reads the status. */
	st = canned_request("HTTP/1.1 304 Not Modified\r\nDg-Version: 9\r\n"
			    "Connection: close\r\n\r\n", &err, &status);
	cr_assert_eq(st, DG_OK);
	cr_assert_eq(status, 304);
}

Test(http, metrics_count_requests_by_route_method_and_code_with_latency_histograms)
{
	struct dg_http_client *c = client();
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	expect_route(c, "GET", "/v1/jobs/1", "job", "1");
	expect_route(c, "GET", "/v1/jobs/2", "job", "2");
	expect_error(c, "GET", "/v1/fail", DG_ESHAPE, NULL);
	expect_error(c, "GET", "/nowhere", DG_ENOTFOUND, NULL);
	/* A request is counted when its response has completed, which the server
	 * learns just after the client has read it: wait for the last one. */
	for (int i = 0; i < 200; i++) {
		dg_buf_deinit(&b);
		cr_assert_eq(dg_http_server_metrics(srv, &b, &err), DG_OK);
		if (strstr(b.data, "route=\"none\",method=\"GET\",code=\"404\"} 1\n"))
			break;
		usleep(10000);
	}
	const char *want[] = {
		"# TYPE dg_http_requests_total counter\n",
		"dg_http_requests_total{route=\"/v1/jobs/{id}\",method=\"GET\",code=\"200\"} 2\n",
		"dg_http_requests_total{route=\"/v1/fail\",method=\"GET\",code=\"400\"} 1\n",
		"dg_http_requests_total{route=\"none\",method=\"GET\",code=\"404\"} 1\n",
		"# TYPE dg_http_request_seconds histogram\n",
		("dg_http_request_seconds_bucket{route=\"/v1/jobs/{id}\",method=\"GET\","
		 "le=\"+Inf\"} 2\n"),
		"dg_http_request_seconds_count{route=\"/v1/jobs/{id}\",method=\"GET\"} 2\n",
		"dg_http_request_seconds_bucket{route=\"/v1/fail\",method=\"GET\",le=\"5\"} 1\n",
		"# TYPE dg_http_bytes_received_total counter\n",
		"# TYPE dg_http_bytes_sent_total counter\n",
		"dg_http_connections_total 1\n",
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		cr_assert(strstr(b.data, want[i]), "missing '%s' in:\n%s", want[i], b.data);
	/* Buckets are cumulative: le=5 holds everything le=0.0001 holds. */
	const char *p = strstr(b.data, "dg_http_request_seconds_bucket{route=\"/v1/jobs/{id}\","
			       "method=\"GET\",le=\"0.0001\"} ");
	cr_assert_not_null(p);
	cr_assert_leq(strtoull(strchr(p, '}') + 2, NULL, 10), 2);
	dg_buf_deinit(&b);
}

Test(http, escape_path_keeps_unreserved_and_slash_and_encodes_the_rest)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_http_escape_path("model/w-1_a.b~c", &b, &err), DG_OK);
	cr_assert_str_eq(b.data, "model/w-1_a.b~c");
	b.len = 0;
	cr_assert_eq(dg_http_escape_path("a b%?#\xc3\xbc:+", &b, &err), DG_OK);
	cr_assert_str_eq(b.data, "a%20b%25%3F%23%C3%BC%3A%2B");
	cr_assert_eq(dg_http_escape_path(NULL, &b, &err), DG_EINVAL);
	dg_buf_deinit(&b);
	/* What the client escapes, the server decodes back. */
	struct dg_http_client *c = client();
	struct dg_buf path = { 0 };
	dg_buf_printf(&path, &err, "/v1/vars/");
	dg_http_escape_path("x y/%z", &path, &err);
	expect_route(c, "GET", path.data, "var_get", "x y/%z");
	dg_buf_deinit(&path);
}

Test(http, server_creation_reports_taken_ports_and_bad_route_tables)
{
	struct dg_http_config cfg = { .port = port };
	struct dg_err err = { 0 };

	cr_assert_null(dg_http_server_new(&cfg, routes, N_ROUTES, NULL, &err));
	cr_assert_eq(err.code, DG_EIO);
	char want[80];
	snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%d: Address already in use", port);
	cr_assert_str_eq(err.msg, want);
	static const struct dg_route two_rest[] = {
		{ "GET", "/a/{x...}/{y...}", h_health, "" },
	};
	cfg.port = 0;
	cr_assert_null(dg_http_server_new(&cfg, two_rest, 1, NULL, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	static const struct dg_route no_slash[] = { { "GET", "v1/x", h_health, "" } };
	cr_assert_null(dg_http_server_new(&cfg, no_slash, 1, NULL, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cfg.bind = "no.such.host.invalid";
	cr_assert_null(dg_http_server_new(&cfg, routes, N_ROUTES, NULL, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert_null(dg_http_client_new("ftp://x:1", NULL, 0, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert_null(dg_http_client_new("", NULL, 0, &err));
	cr_assert_eq(err.code, DG_EINVAL);
}

Test(http, an_ipv6_loopback_server_answers_a_bracketed_address)
{
	int probe = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };

	if (probe < 0 || bind(probe, (struct sockaddr *)&sa, sizeof sa) != 0) {
		if (probe >= 0)
			close(probe);
		cr_skip_test("no IPv6 loopback here");
	}
	close(probe);
	struct dg_http_config cfg = { .bind = "::1", .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	char a[64];
	snprintf(a, sizeof a, "[::1]:%d", dg_http_server_port(s));
	cr_assert(server_healthy(a));
}

Test(http, a_kept_alive_connection_closed_by_the_server_is_replaced_transparently)
{
	struct dg_http_config cfg = { .request_timeout_s = 1, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	char a[64];
	snprintf(a, sizeof a, "127.0.0.1:%d", dg_http_server_port(s));
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "PUT", "/v1/steps/1/tensors/k", NULL, 0, "x", 1, &res,
				     &err), DG_OK, "%s", err.msg);
	sleep_ms(2200);        /* past the server's idle timeout: it closed the connection */
	cr_assert_eq(dg_http_request(c, "PUT", "/v1/steps/2/tensors/k", NULL, 0, "x", 1, &res,
				     &err), DG_OK, "%s", err.msg);
	cr_assert(strstr(res.body.data, "\"param\":\"k\""), "%s", res.body.data);
	cr_assert_eq(metric(s, "dg_http_connections_total "), 2);
	dg_http_result_deinit(&res);
}

Test(http, request_headers_with_line_breaks_are_refused_by_the_client)
{
	struct dg_http_client *c = client();
	struct dg_http_header h = { "X-A", "v\r\nInjected: 1" };
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "GET", "/v1/health", &h, 1, NULL, 0, &res, &err),
		     DG_EINVAL);
	cr_assert_eq(dg_http_request(c, "GET", "no-slash", NULL, 0, NULL, 0, &res, &err),
		     DG_EINVAL);
	dg_http_result_deinit(&res);
}

Test(http, a_handler_that_blocks_past_the_idle_timeout_still_gets_its_answer_out)
{
	struct dg_http_config cfg = { .request_timeout_s = 1, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	char a[64];
	snprintf(a, sizeof a, "127.0.0.1:%d", dg_http_server_port(s));
	struct dg_http_client *c = client_for(a, NULL, 10000);
	struct dg_http_result res;
	struct dg_err err = { 0 };

	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "GET", "/v1/sleep?ms=2500", NULL, 0, NULL, 0, &res, &err),
		     DG_OK, "%s", err.msg);
	cr_assert_eq(res.body.len, 5);
	dg_http_result_deinit(&res);
}

Test(http, connections_past_the_limit_get_429_naming_the_limit)
{
	struct dg_http_config cfg = { .max_connections = 2, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	static const char req[] = "GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n";
	char a[64], buf[512];
	int p = dg_http_server_port(s), fd[2];

	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	/* Two kept-alive connections, each answered once so the server holds them. */
	for (int i = 0; i < 2; i++) {
		fd[i] = raw_connect(p);
		raw_send(fd[i], req, sizeof req - 1);
		cr_assert_gt(recv(fd[i], buf, sizeof buf, 0), 12);
		cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0);
	}
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	struct dg_err err = { 0 };
	dg_http_result_init(&res);
	enum dg_status st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, DG_EUNAVAILABLE, "%s: %s", dg_status_name(st), err.msg);
	cr_assert_eq(res.status, 429);
	cr_assert(strstr(err.msg, "the limit is 2"), "%s", err.msg);
	close(fd[0]);
	close(fd[1]);
	for (int i = 0; i < 100 && metric(s, "dg_http_connections_open ") != 0; i++)
		sleep_ms(10);
	st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err);
	cr_assert_eq(st, DG_OK, "%s", err.msg);
	dg_http_result_deinit(&res);
}

/* A connection from source address src (any 127.x.y.z is loopback). */
static int raw_connect_from(int p, const char *src)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p) };
	struct sockaddr_in me = { .sin_family = AF_INET };
	struct timeval tv = { 5, 0 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	inet_pton(AF_INET, src, &me.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&me, sizeof me), 0, "%s", strerror(errno));
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "%s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

/* Has the server closed fd? (end of file or a reset; false after 100 ms
 * without either). */
static bool peer_closed(int fd)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&pf, 1, 100) <= 0)
		return false;
	return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

/* A loopback port nothing listens on (bound, then closed). */
static int dead_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

Test(http, an_unreachable_server_is_named_as_the_peer_also_through_another)
{
	int p = dead_port();
	char a[64], path[64], want[64];
	struct dg_http_result res;
	struct dg_err err = { 0 };

	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	snprintf(want, sizeof want, "127.0.0.1:%d", p);
	struct dg_http_client *dead = client_for(a, NULL, 2000);
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(dead, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err),
		     DG_EUNAVAILABLE);
	cr_assert_str_eq(err.peer, want);
	/* Through our server: its JSON error carries the peer, the client reads it. */
	snprintf(path, sizeof path, "/v1/relay?port=%d", p);
	memset(&err, 0, sizeof err);
	cr_assert_eq(dg_http_request(client(), "GET", path, NULL, 0, NULL, 0, &res, &err),
		     DG_EUNAVAILABLE);
	cr_assert_eq(res.status, 503);
	cr_assert_str_eq(err.peer, want, "peer '%s'", err.peer);
	cr_assert(strstr(err.msg, "relay: cannot reach"), "%s", err.msg);
	cr_assert(strstr(res.body.data, "\"peer\":\""), "%s", res.body.data);
	/* A later error of another kind does not keep it. */
	cr_assert_eq(dg_http_request(client(), "GET", "/v1/fail", NULL, 0, NULL, 0, &res, &err),
		     DG_ESHAPE);
	cr_assert_str_eq(err.peer, "");
	dg_http_result_deinit(&res);
}

Test(http, a_request_trickled_a_byte_at_a_time_is_cut_at_the_read_timeout)
{
	struct dg_http_config cfg = { .read_timeout_s = 1, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	static const char req[] = "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaa";
	int fd = raw_connect(dg_http_server_port(s));
	int64_t t0 = dg_mono_ms();
	bool closed = false;

	/* A byte every 100 ms keeps libmicrohttpd's idle timer (300 s) fresh; the
	 * total read time of 1 s (checked every second) ends it anyway. */
	for (size_t i = 0; i < sizeof req - 1 && !closed; i++) {
		raw_send(fd, req + i, 1);
		closed = peer_closed(fd);
	}
	while (!closed && dg_mono_ms() - t0 < 5000)
		closed = peer_closed(fd);
	int64_t took = dg_mono_ms() - t0;
	close(fd);
	cr_assert(closed, "a trickled request was not cut");
	cr_assert_geq(took, 900, "cut after %" PRId64 " ms, before the read timeout", took);
	cr_assert_lt(took, 3500, "cut after %" PRId64 " ms", took);
	cr_assert_eq(metric(s, "dg_http_connections_cut_total "), 1);
}

Test(http, a_body_must_arrive_at_the_minimum_rate_but_a_handler_may_take_its_time)
{
	struct dg_http_config cfg = { .read_timeout_s = 1, .request_timeout_s = 30, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	static const char head[] = "PUT /blob HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
	int p = dg_http_server_port(s);
	int fd = raw_connect(p);
	bool closed = false;

	raw_send(fd, head, sizeof head - 1);
	/* 100 bytes earn no time past the base second: 10 bytes a second is cut. */
	for (int i = 0; i < 30 && !closed; i++) {
		raw_send(fd, "0123456789", 1);
		closed = peer_closed(fd);
	}
	close(fd);
	cr_assert(closed, "a trickled body was not cut");
	/* A handler slower than the read timeout is not cut: its time is its own. */
	char a[64];
	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	struct dg_http_client *c = client_for(a, NULL, 10000);
	struct dg_http_result res;
	struct dg_err err = { 0 };
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "GET", "/v1/sleep?ms=2500", NULL, 0, NULL, 0, &res, &err),
		     DG_OK, "%s", err.msg);
	/* And the kept-alive connection serves the next request after it. */
	cr_assert_eq(dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err),
		     DG_OK, "%s", err.msg);
	dg_http_result_deinit(&res);
	cr_assert_eq(metric(s, "dg_http_connections_cut_total "), 1);
}

Test(http, a_client_past_its_connection_limit_gets_429_naming_the_limit)
{
	struct dg_http_config cfg = { .max_connections_per_client = 2, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	static const char req[] = "GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n";
	char buf[1024];
	int p = dg_http_server_port(s), fd[3];

	for (int i = 0; i < 2; i++)
		fd[i] = raw_connect_from(p, "127.0.0.2");
	/* The third from that address is answered 429 in JSON... */
	fd[2] = raw_connect_from(p, "127.0.0.2");
	raw_send(fd[2], req, sizeof req - 1);
	ssize_t n = recv(fd[2], buf, sizeof buf - 1, 0);
	cr_assert_gt(n, 12);
	buf[n] = '\0';
	cr_assert(strncmp(buf, "HTTP/1.1 429", 12) == 0, "%s", buf);
	cr_assert(strstr(buf, "the limit is 2 per client address"), "%s", buf);
	cr_assert(strstr(buf, "from 127.0.0.2"), "%s", buf);
	/* ...while another address is served as usual. */
	char a[64];
	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	cr_assert(server_healthy(a));
	for (int i = 0; i < 3; i++)
		close(fd[i]);
}

Test(http, three_hundred_trickling_connections_do_not_lock_out_a_normal_client)
{
	enum { N_SLOW = 300 };
	struct dg_http_config cfg = { .read_timeout_s = 2, .max_body = 1 << 20, .epoch = 7 };
	struct dg_http_server *s = start_extra(&cfg);
	int p = dg_http_server_port(s), fd[N_SLOW];
	char a[64];

	snprintf(a, sizeof a, "127.0.0.1:%d", p);
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	struct dg_err err = { 0 };
	char *four_k = malloc(4096);
	cr_assert_not_null(four_k);
	memset(four_k, 'v', 4096);
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "PUT", "/blob", NULL, 0, four_k, 4096, &res, &err), DG_OK,
		     "%s", err.msg);
	/* 300 connections from another address, each with a request line begun. */
	for (int i = 0; i < N_SLOW; i++) {
		fd[i] = raw_connect_from(p, "127.0.0.3");
		raw_send(fd[i], "GET /v1/heal", 12);
	}
	sleep_ms(300);
	/* A new client (a new connection) from 127.0.0.1 gets its 4 KiB within a
	 * second. */
	c = client_for(a, NULL, 5000);
	int64_t t0 = dg_mono_ms();
	cr_assert_eq(dg_http_request(c, "GET", "/blob", NULL, 0, NULL, 0, &res, &err), DG_OK,
		     "%s", err.msg);
	int64_t took = dg_mono_ms() - t0;
	cr_assert_eq(res.status, 200);
	cr_assert_eq(res.body.len, 4096);
	cr_assert_eq(memcmp(res.body.data, four_k, 4096), 0);
	cr_assert_lt(took, 1000, "the GET took %" PRId64 " ms", took);
	/* The slow address holds at most its limit (128) and the 4 spares; the
	 * rest were refused at accept, and the reaper cuts the ones it held. */
	cr_assert_geq(metric(s, "dg_http_connections_refused_total "), N_SLOW - 132);
	for (int i = 0; i < 100 && metric(s, "dg_http_connections_cut_total ") < 132; i++)
		sleep_ms(50);
	cr_assert_eq(metric(s, "dg_http_connections_cut_total "), 132);
	for (int i = 0; i < N_SLOW; i++)
		close(fd[i]);
	free(four_k);
	dg_http_result_deinit(&res);
}

Test(http, freeing_a_server_closes_idle_kept_alive_connections_promptly)
{
	struct dg_http_config cfg = { .epoch = 7 };
	struct dg_err err = { 0 };
	struct dg_http_server *s = dg_http_server_new(&cfg, routes, N_ROUTES, NULL, &err);
	char a[64];

	cr_assert_not_null(s, "%s", err.msg);
	snprintf(a, sizeof a, "127.0.0.1:%d", dg_http_server_port(s));
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err), DG_OK);
	int raw = raw_connect(dg_http_server_port(s));  /* connected, never sends a byte */
	double t0 = now_s();
	dg_http_server_free(s);
	cr_assert_lt(now_s() - t0, 1.0, "free took %.3f s", now_s() - t0);
	/* The client notices on its next request: the server is gone. */
	cr_assert_eq(dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, &err),
		     DG_EUNAVAILABLE);
	char b;
	cr_assert_leq(recv(raw, &b, 1, 0), 0, "the raw connection was closed");
	close(raw);
	dg_http_result_deinit(&res);
	/* The listening socket was closed too: the port can be bound again. */
	cfg.port = atoi(strrchr(a, ':') + 1);
	s = start_extra(&cfg);
	cr_assert_eq(dg_http_server_port(s), cfg.port);
	cr_assert(server_healthy(a));
}

/* A server that answers the first request of its first connection, then closes
 * that connection when the second request arrives, and answers on a new one. */
static void *dropping_serve(void *p)
{
	int lfd = *(int *)p;
	char buf[4096];
	static const char ok1[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst";
	static const char ok2[] = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond";
	int c = accept(lfd, NULL, NULL);

	if (c < 0)
		return NULL;
	recv(c, buf, sizeof buf, 0);
	send(c, ok1, sizeof ok1 - 1, MSG_NOSIGNAL);
	recv(c, buf, sizeof buf, 0);            /* the second request: dropped */
	struct linger lg = { 1, 0 };
	setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(c);
	c = accept(lfd, NULL, NULL);
	if (c < 0)
		return NULL;
	recv(c, buf, sizeof buf, 0);
	send(c, ok2, sizeof ok2 - 1, MSG_NOSIGNAL);
	close(c);
	return NULL;
}

Test(http, a_get_on_a_kept_alive_connection_the_server_drops_is_retried_on_a_new_one)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof sa;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	pthread_t t;
	char a[64];

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(listen(lfd, 2), 0);
	getsockname(lfd, (struct sockaddr *)&sa, &sl);
	snprintf(a, sizeof a, "127.0.0.1:%d", ntohs(sa.sin_port));
	pthread_create(&t, NULL, dropping_serve, &lfd);
	struct dg_http_client *c = client_for(a, NULL, 5000);
	struct dg_http_result res;
	struct dg_err err = { 0 };
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "GET", "/a", NULL, 0, NULL, 0, &res, &err), DG_OK);
	cr_assert_str_eq(res.body.data, "first");
	cr_assert_eq(dg_http_request(c, "GET", "/b", NULL, 0, NULL, 0, &res, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_str_eq(res.body.data, "second");
	dg_http_result_deinit(&res);
	pthread_join(t, NULL);
	close(lfd);
}

/* Read one response from a kept-alive connection: the headers, then as many
 * body bytes as Content-Length says. NUL-terminated; returns the length. */
static size_t raw_read_response(int fd, char *out, size_t cap)
{
	size_t n = 0, want = 0;
	char *end = NULL;

	while (n + 1 < cap && (!end || n < want)) {
		ssize_t r = recv(fd, out + n, cap - 1 - n, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
		out[n] = '\0';
		if (!end && (end = strstr(out, "\r\n\r\n"))) {
			const char *cl = strstr(out, "Content-Length: ");
			want = (size_t)(end + 4 - out) + (cl ? strtoul(cl + 16, NULL, 10) : 0);
		}
	}
	out[n] = '\0';
	return n;
}

/* The connection's memory pool (see POOL_ROOM in http_server.c) must hold
 * headers up to the 16 KiB limit, request after request on one kept-alive
 * connection (the pool is reset between them), and read an upload whole
 * afterwards. */
Test(http, headers_just_under_the_limit_are_served_again_and_again_on_one_connection)
{
	const size_t body_len = (size_t)1 << 20;
	char *req = malloc(16384), *body = malloc(body_len);
	char out[4096];
	int fd = raw_connect(port);

	cr_assert(req && body);
	for (size_t i = 0; i < body_len; i++)
		body[i] = (char)('a' + i % 26);
	for (int round = 0; round < 3; round++) {
		/* 25 + 9 + 16009 bytes by begin()'s count: just under 16384. */
		int n = sprintf(req, "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: ");
		memset(req + n, 'a' + round, 16000);
		n += 16000;
		n += sprintf(req + n, "\r\n\r\n");
		raw_send(fd, req, (size_t)n);
		raw_read_response(fd, out, sizeof out);
		cr_assert(strncmp(out, "HTTP/1.1 200", 12) == 0, "round %d: %.200s", round, out);
		cr_assert(strstr(out, "\r\n\r\nok\n"), "%s", out);
		n = sprintf(req, "POST /v1/count HTTP/1.1\r\nHost: x\r\nX-Big: ");
		memset(req + n, 'A' + round, 16000);
		n += 16000;
		n += sprintf(req + n, "\r\nContent-Length: %zu\r\n\r\n", body_len);
		raw_send(fd, req, (size_t)n);
		raw_send(fd, body, body_len);
		raw_read_response(fd, out, sizeof out);
		cr_assert(strstr(out, "{\"len\":1048576}"), "round %d: %s", round, out);
		cr_assert_str_eq(count_head, "abcdefghijklmnopqrstuvwxyzabcde");
	}
	close(fd);
	cr_assert_eq(atomic_load(&count_calls), 3);
	cr_assert_eq(metric(srv, "dg_http_connections_total "), 1, "one kept-alive connection");
	free(req);
	free(body);
}

Test(http, two_hundred_headers_under_the_limit_are_served)
{
	char *req = malloc(16384);
	char out[4096];
	int n;

	cr_assert_not_null(req);
	n = sprintf(req, "GET /v1/health HTTP/1.1\r\nHost: x\r\n");
	/* 200 x 52 bytes: 10.4 KB of headers, each with its record in the pool. */
	for (int i = 0; i < 200; i++)
		n += sprintf(req + n, "X-H%03d: %040d\r\n", i, i);
	n += sprintf(req + n, "Connection: close\r\n\r\n");
	raw_exchange(port, req, (size_t)n, out, sizeof out);
	cr_assert(strncmp(out, "HTTP/1.1 200", 12) == 0, "%.200s", out);
	cr_assert(strstr(out, "\r\n\r\nok\n"), "%s", out);
	free(req);
}
