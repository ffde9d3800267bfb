/* The parameter server end to end over HTTP: ps_server_start on a free
 * loopback port (memory only, or a temporary data directory), driven with raw
 * libcurl (and raw sockets for requests curl will not send). Covers every
 * route and encoding of doc/http-api.md, partial writes, compare-and-set,
 * sync accumulation, queue disjointness, auth, and a catalogue of bad
 * requests that must leave the server healthy and the data unchanged. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/codec.h"
#include "dg/gpu.h"
#include "dg/kernels.h"
#include "dg/tensor.h"
#include "routes.h"
#include "server.h"

/* ------------------------------------------------------------ fixture */

static struct ps_server *srv;
static int port;
static CURL *curl;
static char data_dir[64];
static bool tolerate_send_error;        /* see req_on */

static void start_server(const struct ps_server_config *cfg)
{
	struct dg_err err = { 0 };

	srv = ps_server_start(cfg, &err);
	cr_assert_not_null(srv, "ps_server_start: %s", err.msg);
	port = ps_server_port(srv);
	cr_assert_gt(port, 0);
}

static void stop_server(void)
{
	ps_server_stop(srv);
	srv = NULL;
}

/* The devices as `dg server` describes them (cli/cmd_server.c): ps/ links no
 * kernels, so the server program hands it this description. */
static struct ps_gpu kernel_gpus[16];
static struct ps_devices kernel_devices;

static const struct ps_devices *devices_from_kernels(void)
{
	int n = dg_gpu_count();

	kernel_devices = (struct ps_devices){ .blas = dg_blas_describe(),
					      .gpu = dg_gpu_describe(),
					      .cuda_built = dg_gpu_built(), .gpus = kernel_gpus };
	for (int i = 0; i < n && i < 16; i++) {
		struct dg_gpu_info g;
		struct dg_err err = { 0 };

		cr_assert_eq(dg_gpu_get_info(i, &g, &err), DG_OK, "%s", err.msg);
		kernel_gpus[i] = (struct ps_gpu){ .index = g.index, .mem_bytes = g.mem_bytes,
						  .cc_major = g.cc_major, .cc_minor = g.cc_minor };
		snprintf(kernel_gpus[i].name, sizeof kernel_gpus[i].name, "%s", g.name);
		kernel_devices.n_gpus++;
	}
	return &kernel_devices;
}

static void setup(void)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .devices = devices_from_kernels() };

	curl_global_init(CURL_GLOBAL_DEFAULT);
	curl = curl_easy_init();
	start_server(&cfg);
}

static void teardown(void)
{
	char cmd[128];

	curl_easy_cleanup(curl);
	stop_server();
	curl_global_cleanup();
	if (data_dir[0]) {
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
		cr_assert_eq(system(cmd), 0);
	}
}

TestSuite(routes, .init = setup, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------ HTTP helpers */

struct resp {
	long status;
	struct dg_buf body;
	struct dg_buf head;             /* the raw header lines */
};

static void resp_free(struct resp *r)
{
	dg_buf_deinit(&r->body);
	dg_buf_deinit(&r->head);
	memset(r, 0, sizeof *r);
}

static size_t on_data(char *p, size_t sz, size_t n, void *ud)
{
	return dg_buf_append(ud, p, sz * n, NULL) == DG_OK ? sz * n : 0;
}

/* One request on handle c (NULL: the test's handle, kept alive). headers is
 * NULL-terminated ("Name: value"); body NULL sends none. Returns the status. */
static long req_on(CURL *c, const char *method, const char *path, const char *const *headers,
		   const void *body, size_t len, struct resp *r)
{
	struct curl_slist *hl = curl_slist_append(NULL, "Expect:");
	char url[1024];
	CURLcode rc;

	memset(r, 0, sizeof *r);
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
	for (int i = 0; headers && headers[i]; i++)
		hl = curl_slist_append(hl, headers[i]);
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &r->head);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	if (!strcmp(method, "HEAD"))
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	}
	rc = curl_easy_perform(c);
	curl_slist_free_all(hl);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	/* A server that refuses an upload early answers and closes: curl may then
	 * fail to send the rest, with or without having read the answer. */
	cr_assert(rc == CURLE_OK || (tolerate_send_error && rc == CURLE_SEND_ERROR),
		  "%s %s: %s", method, path, curl_easy_strerror(rc));
	return r->status;
}

static long req(const char *method, const char *path, const char *const *headers,
		const void *body, size_t len, struct resp *r)
{
	return req_on(curl, method, path, headers, body, len, r);
}

/* The value of response header name ("" when absent), copied to out. */
static const char *hdr(const struct resp *r, const char *name, char *out, size_t n)
{
	size_t nl = strlen(name);

	out[0] = '\0';
	for (const char *p = r->head.data; p && *p;
	     p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (!strncasecmp(p, name, nl) && p[nl] == ':') {
			const char *v = p + nl + 1;
			size_t k;
			v += strspn(v, " ");
			k = strcspn(v, "\r\n");
			if (k >= n)
				k = n - 1;
			memcpy(out, v, k);
			out[k] = '\0';
			return out;
		}
	}
	return out;
}

static uint64_t hdr_u64(const struct resp *r, const char *name)
{
	char buf[64];

	return strtoull(hdr(r, name, buf, sizeof buf), NULL, 10);
}

/* The body as JSON (owned). */
static json_t *body_json(const struct resp *r)
{
	json_error_t e;
	json_t *j = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &e);

	cr_assert_not_null(j, "body is not JSON (%s): %.*s", e.text, (int)r->body.len,
			   r->body.data ? r->body.data : "");
	return j;
}

static int64_t json_int_at(const json_t *j, const char *key)
{
	json_t *v = json_object_get(j, key);

	cr_assert(json_is_integer(v), "key %s is not an integer", key);
	return json_integer_value(v);
}

/* Assert status and a dg JSON error with the given code name. */
static void expect_error(struct resp *r, long status, const char *code)
{
	json_t *j;
	const char *got;

	cr_assert_eq(r->status, status, "status %ld, wanted %ld: %.*s", r->status, status,
		     (int)r->body.len, r->body.data ? r->body.data : "");
	j = body_json(r);
	got = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
	cr_assert_not_null(got, "no error.code in %.*s", (int)r->body.len, r->body.data);
	if (code)
		cr_assert_str_eq(got, code);
	cr_assert(json_is_string(json_object_get(json_object_get(j, "error"), "message")));
	json_decref(j);
	resp_free(r);
}

static const float W0[6] = { 1, 2, 3, 4, 5, 6 };

/* PUT a float32 variable from raw bytes with explicit headers. */
static long put_f32(const char *name, const float *v, size_t n, const char *shape,
		    struct resp *r)
{
	char path[300], sh[200];
	const char *h[] = { "Dg-Dtype: float32", sh, "Content-Type: application/octet-stream",
			    NULL };

	snprintf(path, sizeof path, "/v1/vars/%s", name);
	/* curl drops a header with an empty value; "Name;" sends it empty. */
	snprintf(sh, sizeof sh, shape[0] ? "Dg-Shape: %s" : "Dg-Shape;", shape);
	return req("PUT", path, h, v, n * sizeof *v, r);
}

/* Create w = W0 as float32 [2,3]; returns its version. */
static uint64_t put_w(void)
{
	struct resp r;
	json_t *j;
	uint64_t v;

	cr_assert_eq(put_f32("w", W0, 6, "2,3", &r), 201);
	j = body_json(&r);
	v = (uint64_t)json_int_at(j, "version");
	cr_assert_gt(v, 0);
	json_decref(j);
	resp_free(&r);
	return v;
}

/* GET raw floats of name into out[n]; asserts 200 and the byte count. */
static uint64_t get_f32(const char *name, float *out, size_t n)
{
	char path[300];
	struct resp r;
	uint64_t v;

	snprintf(path, sizeof path, "/v1/vars/%s", name);
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &r), 200, "GET %s: %ld", name, r.status);
	cr_assert_eq(r.body.len, n * sizeof(float), "GET %s: %zu bytes", name, r.body.len);
	memcpy(out, r.body.data, n * sizeof(float));
	v = hdr_u64(&r, "Dg-Version");
	resp_free(&r);
	return v;
}

/* The server is healthy and w still holds want at version ver. */
static void expect_unchanged(const float *want, uint64_t ver)
{
	struct resp r;
	float got[6];

	cr_assert_eq(req("GET", "/v1/health", NULL, NULL, 0, &r), 200);
	resp_free(&r);
	cr_assert_eq(get_f32("w", got, 6), ver);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(got[i], want[i], 0, "w[%d] = %g, want %g", i, got[i], want[i]);
}

/* A raw request over a new socket; reads until the server closes or 3 s pass.
 * shut_wr half-closes after sending (a body that ends early). Returns the
 * first response's status, 0 when there was none. */
static int raw_exchange(const char *req_text, size_t n, bool shut_wr, struct dg_buf *out)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = 0;
	char buf[4096];

	cr_assert_geq(fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	for (size_t off = 0; off < n;) {
		ssize_t k = send(fd, req_text + off, n - off, MSG_NOSIGNAL);
		if (k <= 0)
			break;
		off += (size_t)k;
	}
	if (shut_wr)
		shutdown(fd, SHUT_WR);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;
		if (poll(&p, 1, 3000) <= 0)
			break;
		if ((k = recv(fd, buf, sizeof buf, 0)) <= 0)
			break;
		dg_buf_append(out, buf, (size_t)k, NULL);
	}
	close(fd);
	if (out->data)
		sscanf(out->data, "HTTP/1.%*d %d", &status);
	return status;
}

/* The JSON body of a raw response (after the blank line), as a resp. */
static void raw_to_resp(const struct dg_buf *raw, int status, struct resp *r)
{
	const char *b = raw->data ? strstr(raw->data, "\r\n\r\n") : NULL;

	memset(r, 0, sizeof *r);
	r->status = status;
	cr_assert_not_null(b, "no complete response: %s", raw->data ? raw->data : "(none)");
	dg_buf_append(&r->body, b + 4, strlen(b + 4), NULL);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ variables */

Test(routes, health_reports_job_epoch_and_counts)
{
	struct resp r;
	json_t *j;

	put_w();
	cr_assert_eq(req("GET", "/v1/health", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
	cr_assert_str_eq(json_string_value(json_object_get(j, "job")), "ps");
	cr_assert_eq(json_int_at(j, "task"), 0);
	cr_assert_eq(json_int_at(j, "epoch"), 1);
	cr_assert_eq(json_int_at(j, "vars"), 1);
	cr_assert_eq(json_int_at(j, "bytes"), 24);
	cr_assert_eq(json_int_at(j, "queues"), 0);
	cr_assert(json_is_number(json_object_get(j, "uptime_s")));
	cr_assert(json_is_string(json_object_get(j, "blas")));
	cr_assert(json_is_string(json_object_get(j, "gpu")));
	cr_assert_eq(hdr_u64(&r, "Dg-Epoch"), 1);
	json_decref(j);
	resp_free(&r);
}

Test(routes, put_raw_then_get_returns_the_bytes_and_tensor_headers)
{
	struct resp r;
	char buf[128];
	uint64_t v = put_w();

	cr_assert_eq(req("GET", "/v1/vars/w", NULL, NULL, 0, &r), 200);
	cr_assert_eq(r.body.len, sizeof W0);
	cr_assert_eq(memcmp(r.body.data, W0, sizeof W0), 0);
	cr_assert_str_eq(hdr(&r, "Dg-Dtype", buf, sizeof buf), "float32");
	cr_assert_str_eq(hdr(&r, "Dg-Shape", buf, sizeof buf), "2,3");
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v);
	snprintf(buf, sizeof buf, "\"%llu\"", (unsigned long long)v);
	{
		char etag[64];
		cr_assert_str_eq(hdr(&r, "ETag", etag, sizeof etag), buf);
	}
	cr_assert(strstr(hdr(&r, "Last-Modified", buf, sizeof buf), " GMT") != NULL);
	cr_assert_str_eq(hdr(&r, "Content-Type", buf, sizeof buf), "application/octet-stream");
	resp_free(&r);
}

Test(routes, put_of_an_existing_variable_answers_200_with_a_higher_version)
{
	static const float w1[6] = { 6, 5, 4, 3, 2, 1 };
	struct resp r;
	json_t *j;
	float got[6];
	uint64_t v0 = put_w(), v1;

	cr_assert_eq(put_f32("w", w1, 6, "2,3", &r), 200);
	j = body_json(&r);
	v1 = (uint64_t)json_int_at(j, "version");
	cr_assert_gt(v1, v0);
	cr_assert_str_eq(json_string_value(json_object_get(j, "name")), "w");
	cr_assert_str_eq(json_string_value(json_object_get(j, "dtype")), "float32");
	cr_assert_eq(json_int_at(j, "bytes"), 24);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(j, "shape"), 1)), 3);
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v1);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(get_f32("w", got, 6), v1);
	cr_assert_eq(memcmp(got, w1, sizeof w1), 0);
}

Test(routes, get_in_npy_decodes_to_the_same_tensor)
{
	const char *acc[] = { "Accept: application/x-npy", NULL };
	const char *paths[] = { "/v1/vars/w", "/v1/vars/w?format=npy" };
	struct dg_err err = { 0 };
	char buf[64];

	put_w();
	for (int k = 0; k < 2; k++) {
		struct resp r;
		struct dg_tensor *t;
		cr_assert_eq(req("GET", paths[k], k ? NULL : acc, NULL, 0, &r), 200);
		cr_assert_str_eq(hdr(&r, "Content-Type", buf, sizeof buf), "application/x-npy");
		t = dg_npy_decode(r.body.data, r.body.len, &err);
		cr_assert_not_null(t, "%s", err.msg);
		cr_assert_eq(t->dtype, DG_F32);
		cr_assert_eq(t->shape.ndim, 2);
		cr_assert_eq(t->shape.dim[0], 2);
		cr_assert_eq(t->shape.dim[1], 3);
		cr_assert_eq(memcmp(t->data, W0, sizeof W0), 0);
		dg_tensor_free(t);
		resp_free(&r);
	}
}

Test(routes, get_in_text_has_a_header_line_and_one_row_per_line)
{
	const char *acc[] = { "Accept: text/plain", NULL };
	struct resp r;

	put_w();
	cr_assert_eq(req("GET", "/v1/vars/w", acc, NULL, 0, &r), 200);
	cr_assert_eq(r.body.len, strlen("# float32 [2,3]\n1 2 3\n4 5 6\n"));
	cr_assert_eq(memcmp(r.body.data, "# float32 [2,3]\n1 2 3\n4 5 6\n", r.body.len), 0,
		     "%s", r.body.data);
	resp_free(&r);
}

Test(routes, accept_lists_pick_the_first_known_type_and_default_to_raw)
{
	const char *h1[] = { "Accept: application/json, text/plain;q=0.9, */*", NULL };
	const char *h2[] = { "Accept: application/json", NULL };
	struct resp r;

	put_w();
	cr_assert_eq(req("GET", "/v1/vars/w", h1, NULL, 0, &r), 200);
	cr_assert_eq(strncmp(r.body.data, "# float32", 9), 0);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/w", h2, NULL, 0, &r), 200);
	cr_assert_eq(r.body.len, sizeof W0);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/w?format=xml", NULL, NULL, 0, &r), 400);
	expect_error(&r, 400, "invalid_argument");
}

Test(routes, put_accepts_npy_and_text_bodies)
{
	const char *npy_h[] = { "Content-Type: application/x-npy", NULL };
	const char *txt_h[] = { "Content-Type: text/plain; charset=utf-8", NULL };
	const char text[] = "# float64 [2]\n1.5 -2\n";
	struct dg_err err = { 0 };
	struct dg_buf npy = { 0 };
	struct dg_shape s = { .ndim = 1, .dim = { 3 } };
	int64_t iv[3] = { -7, 0, 1LL << 40 };
	struct dg_tensor *t = dg_tensor_from_data(DG_I64, &s, iv, &err);
	struct resp r;
	char buf[64];

	cr_assert_not_null(t);
	cr_assert_eq(dg_npy_encode(t, &npy, &err), DG_OK);
	cr_assert_eq(req("PUT", "/v1/vars/ints", npy_h, npy.data, npy.len, &r), 201);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/ints", NULL, NULL, 0, &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Dtype", buf, sizeof buf), "int64");
	cr_assert_str_eq(hdr(&r, "Dg-Shape", buf, sizeof buf), "3");
	cr_assert_eq(r.body.len, sizeof iv);
	cr_assert_eq(memcmp(r.body.data, iv, sizeof iv), 0);
	resp_free(&r);
	cr_assert_eq(req("PUT", "/v1/vars/d", txt_h, text, strlen(text), &r), 201);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/d", NULL, NULL, 0, &r), 200);
	cr_assert_eq(r.body.len, 16);
	cr_assert_float_eq(((double *)(void *)r.body.data)[0], 1.5, 0);
	cr_assert_float_eq(((double *)(void *)r.body.data)[1], -2.0, 0);
	resp_free(&r);
	dg_buf_deinit(&npy);
	dg_tensor_free(t);
}

Test(routes, text_and_raw_puts_without_headers_take_the_variables_type)
{
	const char *txt_h[] = { "Content-Type: text/plain", NULL };
	const char text[] = "9 8 7\n6 5 4\n";
	static const float w2[6] = { 0.5f, 1, 2, 3, 4, 5 };
	struct resp r;
	float got[6];

	put_w();
	cr_assert_eq(req("PUT", "/v1/vars/w", txt_h, text, strlen(text), &r), 200);
	resp_free(&r);
	get_f32("w", got, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(got[i], (float)(9 - i), 0);
	cr_assert_eq(req("PUT", "/v1/vars/w", NULL, w2, sizeof w2, &r), 200);
	resp_free(&r);
	get_f32("w", got, 6);
	cr_assert_eq(memcmp(got, w2, sizeof w2), 0);
}

Test(routes, raw_put_of_a_new_variable_needs_dtype_and_shape)
{
	struct resp r;

	req("PUT", "/v1/vars/fresh", NULL, W0, sizeof W0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/vars/fresh", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
}

Test(routes, put_with_another_shape_is_refused_unless_replace)
{
	struct resp r;
	float got[3];
	char buf[32];
	uint64_t v = put_w();

	put_f32("w", W0, 3, "3", &r);
	expect_error(&r, 400, "shape_mismatch");
	expect_unchanged(W0, v);
	cr_assert_eq(req("PUT", "/v1/vars/w?replace=1", (const char *[]){ "Dg-Dtype: float32",
		     "Dg-Shape: 3", NULL }, W0, 3 * sizeof(float), &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Shape", buf, sizeof buf), "3");
	resp_free(&r);
	get_f32("w", got, 3);
	cr_assert_eq(memcmp(got, W0, sizeof got), 0);
}

Test(routes, head_returns_the_headers_and_the_length_of_the_encoding)
{
	const char *npy_h[] = { "Accept: application/x-npy", NULL };
	struct resp r;
	char buf[32];
	struct dg_shape s = { .ndim = 2, .dim = { 2, 3 } };

	put_w();
	cr_assert_eq(req("HEAD", "/v1/vars/w", NULL, NULL, 0, &r), 200);
	cr_assert_eq(r.body.len, 0);
	cr_assert_str_eq(hdr(&r, "Content-Length", buf, sizeof buf), "24");
	cr_assert_str_eq(hdr(&r, "Dg-Shape", buf, sizeof buf), "2,3");
	resp_free(&r);
	cr_assert_eq(req("HEAD", "/v1/vars/w", npy_h, NULL, 0, &r), 200);
	cr_assert_eq(hdr_u64(&r, "Content-Length"), dg_npy_header_size(DG_F32, &s) + 24);
	resp_free(&r);
	cr_assert_eq(req("HEAD", "/v1/vars/nothing", NULL, NULL, 0, &r), 404);
	resp_free(&r);
}

Test(routes, list_gives_every_field_sorted_and_filters_by_prefix)
{
	struct resp r;
	json_t *j, *vars, *e;

	cr_assert_eq(put_f32("b/z", W0, 1, "", &r), 201);
	resp_free(&r);
	cr_assert_eq(put_f32("a/y", W0, 2, "2", &r), 201);
	resp_free(&r);
	cr_assert_eq(put_f32("a/x", W0, 6, "3,2", &r), 201);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars?prefix=a/", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	vars = json_object_get(j, "vars");
	cr_assert_eq(json_array_size(vars), 2);
	e = json_array_get(vars, 0);
	cr_assert_str_eq(json_string_value(json_object_get(e, "name")), "a/x");
	cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "float32");
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(e, "shape"), 0)), 3);
	cr_assert_eq(json_int_at(e, "bytes"), 24);
	cr_assert_gt(json_int_at(e, "version"), 0);
	cr_assert_gt(json_number_value(json_object_get(e, "mtime")), 1.6e9);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(vars, 1), "name")),
			 "a/y");
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_array_size(json_object_get(j, "vars")), 3);
	cr_assert_eq(json_array_size(json_object_get(json_array_get(json_object_get(j, "vars"), 2),
						     "shape")), 0);
	json_decref(j);
	resp_free(&r);
}

Test(routes, range_reads_answer_206_with_the_part_and_416_outside)
{
	static const struct { const char *range, *cr; size_t off, len; } ok[] = {
		{ "Range: bytes=4-11", "bytes 4-11/24", 4, 8 },
		{ "Range: bytes=20-", "bytes 20-23/24", 20, 4 },
		{ "Range: bytes=-8", "bytes 16-23/24", 16, 8 },
		{ "Range: bytes=16-1000", "bytes 16-23/24", 16, 8 },
	};
	struct resp r;
	char buf[64];

	put_w();
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		const char *h[] = { ok[i].range, NULL };
		cr_assert_eq(req("GET", "/v1/vars/w", h, NULL, 0, &r), 206, "%s", ok[i].range);
		cr_assert_str_eq(hdr(&r, "Content-Range", buf, sizeof buf), ok[i].cr);
		cr_assert_eq(r.body.len, ok[i].len);
		cr_assert_eq(memcmp(r.body.data, (const char *)W0 + ok[i].off, ok[i].len), 0);
		resp_free(&r);
	}
	req("GET", "/v1/vars/w", (const char *[]){ "Range: bytes=24-30", NULL }, NULL, 0, &r);
	cr_assert_str_eq(hdr(&r, "Content-Range", buf, sizeof buf), "bytes */24");
	expect_error(&r, 416, "invalid_argument");
	req("GET", "/v1/vars/w", (const char *[]){ "Range: bytes=5-2", NULL }, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/vars/w", (const char *[]){ "Range: bytes=0-1,4-5", NULL }, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/vars/w?format=npy", (const char *[]){ "Range: bytes=0-3", NULL }, NULL, 0,
	    &r);
	expect_error(&r, 400, "invalid_argument");
}

Test(routes, patch_writes_an_element_aligned_part_and_bumps_the_version)
{
	static const float nine = 9, pair[2] = { -1, -2 };
	float want[6] = { 1, 9, 3, 4, -1, -2 };
	struct resp r;
	json_t *j;
	uint64_t v0 = put_w(), v1, v2;

	cr_assert_eq(req("PATCH", "/v1/vars/w", (const char *[]){
		     "Content-Range: bytes 4-7/24", NULL }, &nine, 4, &r), 200);
	j = body_json(&r);
	v1 = (uint64_t)json_int_at(j, "version");
	cr_assert_gt(v1, v0);
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v1);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("PATCH", "/v1/vars/w", (const char *[]){
		     "Content-Range: bytes 16-23/*", NULL }, pair, 8, &r), 200);
	resp_free(&r);
	v2 = v1 + 1;
	cr_assert_geq(get_f32("w", (float[6]){ 0 }, 6), v2);
	expect_unchanged(want, get_f32("w", (float[6]){ 0 }, 6));
}

Test(routes, bad_patches_are_refused_and_write_nothing)
{
	static const char *bad[] = {
		"Content-Range: bytes 2-5/24",          /* not element-aligned */
		"Content-Range: bytes 20-27/24",        /* past the end */
		"Content-Range: bytes 0-3/28",          /* wrong total */
		"Content-Range: bytes 0-7/24",          /* body is 4 bytes, range 8 */
		"Content-Range: bytes 7-4/24",          /* reversed */
		"Content-Range: items 0-3/24",
		"Content-Range: bytes 0-3",
		"Content-Range: bytes 99999999999999999999999-3/24",
		NULL,                                   /* missing */
	};
	static const float x = 42;
	struct resp r;
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *h[] = { bad[i], NULL };
		long st = req("PATCH", "/v1/vars/w", h, &x, 4, &r);
		cr_assert(st == 400, "%s: %ld", bad[i] ? bad[i] : "(none)", st);
		expect_error(&r, 400, NULL);
	}
	req("PATCH", "/v1/vars/w", (const char *[]){ "Content-Range: bytes 0-3/24",
	    "Content-Type: text/plain", NULL }, &x, 4, &r);
	expect_error(&r, 400, "invalid_argument");
	req("PATCH", "/v1/vars/nothing", (const char *[]){ "Content-Range: bytes 0-3/*", NULL },
	    &x, 4, &r);
	expect_error(&r, 404, "not_found");
	expect_unchanged(W0, v);
}

Test(routes, if_match_makes_writes_compare_and_set)
{
	static const float w1[6] = { 0 };
	static const float one = 1;
	char good[64], stale[64];
	struct resp r;
	uint64_t v = put_w();

	snprintf(good, sizeof good, "If-Match: \"%llu\"", (unsigned long long)v);
	snprintf(stale, sizeof stale, "If-Match: %llu", (unsigned long long)v + 7);
	req("PUT", "/v1/vars/w", (const char *[]){ stale, NULL }, w1, sizeof w1, &r);
	expect_error(&r, 412, "conflict");
	req("PATCH", "/v1/vars/w", (const char *[]){ stale, "Content-Range: bytes 0-3/24", NULL },
	    &one, 4, &r);
	expect_error(&r, 412, "conflict");
	req("DELETE", "/v1/vars/w", (const char *[]){ stale, NULL }, NULL, 0, &r);
	expect_error(&r, 412, "conflict");
	req("PUT", "/v1/vars/w", (const char *[]){ "If-Match: \"0\"", NULL }, w1, sizeof w1, &r);
	expect_error(&r, 412, "conflict");
	req("PUT", "/v1/vars/w", (const char *[]){ "If-Match: \"v7\"", NULL }, w1, sizeof w1, &r);
	expect_error(&r, 400, "invalid_argument");
	req("PUT", "/v1/vars/w", (const char *[]){ "If-Match: 99999999999999999999999", NULL },
	    w1, sizeof w1, &r);
	expect_error(&r, 400, "invalid_argument");
	req("PUT", "/v1/vars/w", (const char *[]){ "If-None-Match: *", NULL }, w1, sizeof w1, &r);
	expect_error(&r, 412, "conflict");
	req("PUT", "/v1/vars/w", (const char *[]){ "If-None-Match: \"3\"", NULL }, w1, sizeof w1,
	    &r);
	expect_error(&r, 400, "invalid_argument");
	expect_unchanged(W0, v);
	cr_assert_eq(req("PUT", "/v1/vars/w", (const char *[]){ good, NULL }, w1, sizeof w1, &r),
		     200);
	resp_free(&r);
	expect_unchanged(w1, v + 1);
	cr_assert_eq(put_f32("new", W0, 1, "", &r), 201);
	resp_free(&r);
	cr_assert_eq(req("PUT", "/v1/vars/created", (const char *[]){ "If-None-Match: *",
		     "Dg-Dtype: float32", "Dg-Shape;", NULL }, &one, 4, &r), 201);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/created", NULL, NULL, 0, &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Shape", good, sizeof good), "[]");    /* a scalar */
	cr_assert_eq(r.body.len, 4);
	resp_free(&r);
	cr_assert_eq(req("PUT", "/v1/vars/created", (const char *[]){ "Dg-Shape: []", NULL },
		     &one, 4, &r), 200);
	resp_free(&r);
}

Test(routes, delete_removes_the_variable_and_its_slots)
{
	static const float g[6] = { 1, 1, 1, 1, 1, 1 };
	struct resp r;
	json_t *j;

	put_w();
	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=momentum&lr=0.1&momentum=0.9", NULL, g,
			 sizeof g, &r), 200);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/w.momentum", NULL, NULL, 0, &r), 200);
	resp_free(&r);
	cr_assert_eq(req("DELETE", "/v1/vars/w", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert(json_is_true(json_object_get(j, "deleted")));
	json_decref(j);
	resp_free(&r);
	req("GET", "/v1/vars/w", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
	req("GET", "/v1/vars/w.momentum", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
	req("DELETE", "/v1/vars/w", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
}

struct delayed_put {
	int delay_ms;
	float value;
};

/* Send six float32 copies of value (w's shape) with method to path on c, the
 * connection of a helper thread; returns the HTTP status. */
static long send_fill(CURL *c, const char *method, const char *path, float value)
{
	float v[6];
	struct resp r;
	long st;

	for (int i = 0; i < 6; i++)
		v[i] = value;
	st = req_on(c, method, path, NULL, v, sizeof v, &r);
	resp_free(&r);
	return st;
}

static void *put_later(void *arg)
{
	struct delayed_put *d = arg;
	CURL *c = curl_easy_init();

	usleep((useconds_t)d->delay_ms * 1000);
	send_fill(c, "PUT", "/v1/vars/w", d->value);
	curl_easy_cleanup(c);
	return NULL;
}

Test(routes, min_version_waits_for_the_update_or_answers_304)
{
	struct delayed_put d = { 300, 7 };
	struct resp r;
	char path[128];
	pthread_t th;
	double t0;
	uint64_t v = put_w();

	snprintf(path, sizeof path, "/v1/vars/w?min_version=%llu&timeout_ms=10000",
		 (unsigned long long)v + 1);
	cr_assert_eq(pthread_create(&th, NULL, put_later, &d), 0);
	t0 = now_s();
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &r), 200);
	cr_assert_geq(now_s() - t0, 0.2);
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v + 1);
	cr_assert_float_eq(((float *)(void *)r.body.data)[5], 7.0f, 0);
	resp_free(&r);
	pthread_join(th, NULL);
	snprintf(path, sizeof path, "/v1/vars/w?min_version=%llu&timeout_ms=300",
		 (unsigned long long)v + 5);
	t0 = now_s();
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &r), 304);
	cr_assert_geq(now_s() - t0, 0.25);
	cr_assert_eq(r.body.len, 0);
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v + 1);
	resp_free(&r);
	req("GET", "/v1/vars/w?min_version=-1", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/vars/w?min_version=1&timeout_ms=300001", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
}

/* ------------------------------------------------------------ apply */

/* POST an apply of a float32 gradient to w; returns the status, JSON in *j. */
static long apply(const char *query, const float *g, json_t **j)
{
	char path[300];
	struct resp r;
	long st;

	snprintf(path, sizeof path, "/v1/vars/w/apply?%s", query);
	st = req("POST", path, NULL, g, 6 * sizeof *g, &r);
	*j = body_json(&r);
	resp_free(&r);
	return st;
}

static void expect_w(const float *want, double eps)
{
	float got[6];

	get_f32("w", got, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(got[i], want[i], eps, "w[%d] = %.9g, want %.9g", i, got[i],
				   want[i]);
}

Test(routes, apply_rules_compute_their_updates_and_bump_the_version_once)
{
	static const float g[6] = { 1, -2, 0.5f, 4, -1, 2 };
	float want[6];
	json_t *j;
	uint64_t v = put_w();

	cr_assert_eq(apply("rule=assign_add", g, &j), 200);
	cr_assert(json_is_true(json_object_get(j, "applied")));
	cr_assert_eq(json_int_at(j, "version"), (int64_t)v + 1);
	json_decref(j);
	for (int i = 0; i < 6; i++)
		want[i] = W0[i] + g[i];
	expect_w(want, 0);
	cr_assert_eq(apply("rule=sgd&lr=0.5", g, &j), 200);
	cr_assert_eq(json_int_at(j, "version"), (int64_t)v + 2);
	json_decref(j);
	for (int i = 0; i < 6; i++)
		want[i] -= 0.5f * g[i];
	expect_w(want, 1e-6);
	cr_assert_eq(apply("rule=assign", W0, &j), 200);
	json_decref(j);
	expect_w(W0, 0);
}

Test(routes, momentum_and_nesterov_follow_the_documented_formulas)
{
	static const float g[6] = { 1, -2, 0.5f, 4, -1, 2 };
	float want[6], m[6] = { 0 };
	json_t *j;

	put_w();
	memcpy(want, W0, sizeof want);
	for (int step = 0; step < 2; step++) {
		cr_assert_eq(apply("rule=momentum&lr=0.1&momentum=0.9", g, &j), 200);
		json_decref(j);
		for (int i = 0; i < 6; i++) {
			m[i] = 0.9f * m[i] + g[i];
			want[i] -= 0.1f * m[i];
		}
		expect_w(want, 1e-5);
	}
	cr_assert_eq(apply("rule=momentum&lr=0.1&momentum=0.9&nesterov=1", g, &j), 200);
	json_decref(j);
	for (int i = 0; i < 6; i++) {
		m[i] = 0.9f * m[i] + g[i];
		want[i] -= 0.1f * (g[i] + 0.9f * m[i]);
	}
	expect_w(want, 1e-5);
}

Test(routes, adam_first_step_moves_each_weight_by_lr_against_the_gradient_sign)
{
	static const float g[6] = { 1, -2, 0.5f, 4, -1, 2 };
	float want[6];
	struct resp r;
	json_t *j, *vars;

	put_w();
	cr_assert_eq(apply("rule=adam&lr=0.01", g, &j), 200);
	json_decref(j);
	/* t = 1: m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps). */
	for (int i = 0; i < 6; i++)
		want[i] = W0[i] - 0.01f * (g[i] > 0 ? 1.0f : -1.0f);
	expect_w(want, 1e-5);
	cr_assert_eq(req("GET", "/v1/vars?prefix=w.", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	vars = json_object_get(j, "vars");
	cr_assert_eq(json_array_size(vars), 3);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(vars, 0), "name")),
			 "w.adam_m");
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(vars, 1), "name")),
			 "w.adam_t");
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(vars, 2), "name")),
			 "w.adam_v");
	json_decref(j);
	resp_free(&r);
}

Test(routes, apply_refuses_bad_rules_parameters_and_gradients)
{
	static const char *bad[] = {
		"rule=bogus", "", "rule=sgd", "rule=sgd&lr=abc", "rule=sgd&lr=nan",
		"rule=sgd&lr=inf", "rule=momentum&lr=0.1", "rule=adam&beta1=1",
		"rule=adam&eps=0", "rule=sgd&lr=0.1&nesterov=2", "rule=sgd&lr=0.1&replicas=2",
		"rule=sgd&lr=0.1&step=0", "rule=sgd&lr=0.1&step=0&replicas=2&backup=2",
		"rule=sgd&lr=0.1&step=-2&replicas=1", "rule=sgd&lr=1e999",
	};
	static const float g[6] = { 1, 1, 1, 1, 1, 1 };
	struct resp r;
	char path[256];
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(path, sizeof path, "/v1/vars/w/apply?%s", bad[i]);
		req("POST", path, NULL, g, sizeof g, &r);
		cr_assert_eq(r.status, 400, "%s: %ld", bad[i], r.status);
		expect_error(&r, 400, NULL);
	}
	req("POST", "/v1/vars/w/apply?rule=sgd&lr=0.1", (const char *[]){ "Dg-Shape: 3", NULL },
	    g, 12, &r);
	expect_error(&r, 400, "shape_mismatch");
	req("POST", "/v1/vars/w/apply?rule=sgd&lr=0.1", NULL, g, 12, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/vars/nothing/apply?rule=sgd&lr=0.1", NULL, g, sizeof g, &r);
	expect_error(&r, 404, "not_found");
	expect_unchanged(W0, v);
}

Test(routes, rows_are_read_by_list_or_body_and_applied_in_both_forms)
{
	struct resp r;
	char sh[64];
	float got[6];
	uint64_t v = put_w();     /* [[1 2 3] [4 5 6]] */

	cr_assert_eq(req("GET", "/v1/vars/w?rows=1,0,1", (const char *[]){ "Accept: text/plain",
								       NULL }, NULL, 0, &r), 200);
	cr_assert_not_null(strstr(r.body.data, "# float32 [3,3]\n4 5 6\n1 2 3\n4 5 6"), "%.*s",
			   (int)r.body.len, r.body.data);
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v);
	cr_assert_str_eq(hdr(&r, "Dg-Shape", sh, sizeof sh), "3,3");
	resp_free(&r);
	/* POST /rows: int64 indices of shape [1,2] -> [1,2,3] */
	const int64_t idx[2] = { 1, 1 };
	cr_assert_eq(req("POST", "/v1/vars/w/rows", (const char *[]){ "Dg-Dtype: int64",
		     "Dg-Shape: 1,2", "Content-Type: application/octet-stream", NULL }, idx,
		     sizeof idx, &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Shape", sh, sizeof sh), "1,2,3");
	cr_assert_eq(r.body.len, 24);
	cr_assert_eq(((float *)r.body.data)[5], 6);
	resp_free(&r);
	/* ?rows= with a text body: sgd on row 1 given twice (summed) */
	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=sgd&lr=1&rows=1,1",
			 (const char *[]){ "Content-Type: text/plain", NULL }, "1 1 1 2 2 2", 11,
			 &r), 200);
	resp_free(&r);
	/* row_count=1 with a raw body: the index, then the row */
	struct { int64_t row; float val[3]; } __attribute__((packed)) body = { 0, { 1, 1, 1 } };
	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=assign&row_count=1", NULL, &body,
			 sizeof body, &r), 200);
	resp_free(&r);
	get_f32("w", got, 6);
	const float want[6] = { 1, 1, 1, 1, 2, 3 };
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(got[i], want[i], 1e-6, "w[%d] = %g", i, got[i]);
}

Test(routes, bad_rows_are_400_naming_what_is_wrong_and_change_nothing)
{
	static const struct { const char *path, *msg; } bad[] = {
		{ "/v1/vars/w?rows=2", "row 2 of 'w' is out of range: it has 2 rows" },
		{ "/v1/vars/w?rows=", "is not a list of rows" },
		{ "/v1/vars/w?rows=1-0", "is not a list of rows" },
		{ "/v1/vars/w?rows=a", "is not a list of rows" },
		{ "/v1/vars/w?rows=0,,1", "is not a list of rows" },
		{ "/v1/vars/w?rows=0-99999999", "names more than" },
		{ "/v1/vars/w/apply?rule=sgd&lr=1&rows=2", "row 2 is out of range" },
		{ "/v1/vars/w/apply?rule=sgd&lr=1&rows=0&row_count=1", "not both" },
		{ "/v1/vars/w/apply?rule=sgd&lr=1&row_count=5", "needs 40 bytes" },
		{ "/v1/vars/w/apply?rule=sgd&lr=1&row_count=1", "bytes of values after 1 row" },
		{ "/v1/vars/w/apply?rule=assign&rows=0,0", "row 0 is given twice" },
		{ "/v1/vars/w/apply?rule=adagrad&rows=0", "needs the query parameter lr" },
		{ "/v1/vars/w/apply?rule=adagrad&lr=1&init=0&rows=0", "init=0" },
		{ "/v1/vars/w/apply?rule=rmsprop&lr=1&rho=1&rows=0", "rho=1" },
	};
	static const float g[6] = { 1, 1, 1, 1, 1, 1 };
	struct resp r;
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		bool get = !strstr(bad[i].path, "apply");
		req(get ? "GET" : "POST", bad[i].path, NULL, get ? NULL : g,
		    get ? 0 : (strstr(bad[i].path, "rows=0,0") ? 24 : 12), &r);
		cr_assert_eq(r.status, 400, "%s: %ld", bad[i].path, r.status);
		cr_assert_not_null(strstr(r.body.data, bad[i].msg), "%s: %.*s", bad[i].path,
				   (int)r.body.len, r.body.data);
		resp_free(&r);
	}
	req("GET", "/v1/vars/w?rows=0", (const char *[]){ "Range: bytes=0-3", NULL }, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/vars/w/rows", (const char *[]){ "Dg-Dtype: float32", "Dg-Shape: 1",
	    "Content-Type: application/octet-stream", NULL }, g, 4, &r);
	expect_error(&r, 400, "dtype_mismatch");
	cr_assert_eq(put_f32("s", g, 1, "", &r), 201);
	resp_free(&r);
	req("GET", "/v1/vars/s?rows=0", NULL, NULL, 0, &r);
	expect_error(&r, 400, "shape_mismatch");
	expect_unchanged(W0, v);
}

Test(routes, sync_apply_accumulates_three_replicas_and_applies_the_mean_once)
{
	static const float g1[6] = { 1, 1, 1, 1, 1, 1 }, g2[6] = { 2, 2, 2, 2, 2, 2 },
			   g3[6] = { 6, 6, 6, 6, 6, 6 };
	float want[6];
	json_t *j;
	uint64_t v = put_w();

	cr_assert_eq(apply("rule=sgd&lr=0.5&step=0&replicas=3&replica=0", g1, &j), 202);
	cr_assert(json_is_false(json_object_get(j, "applied")));
	cr_assert_eq(json_int_at(j, "pending"), 1);
	cr_assert_eq(json_int_at(j, "step"), 0);
	json_decref(j);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=0&replicas=3&replica=0", g1, &j), 409);
	json_decref(j);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=0&replicas=3&replica=1", g2, &j), 202);
	cr_assert_eq(json_int_at(j, "pending"), 2);
	json_decref(j);
	expect_unchanged(W0, v);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=0&replicas=3&replica=2", g3, &j), 200);
	cr_assert(json_is_true(json_object_get(j, "applied")));
	cr_assert_eq(json_int_at(j, "version"), (int64_t)v + 1);
	cr_assert_eq(json_int_at(j, "step"), 1);
	json_decref(j);
	for (int i = 0; i < 6; i++)
		want[i] = W0[i] - 0.5f * 3.0f;          /* mean of 1, 2, 6 */
	expect_w(want, 1e-6);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=0&replicas=3&replica=0", g1, &j), 409);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
			 "stale");
	json_decref(j);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=5&replicas=3", g1, &j), 409);
	json_decref(j);
	expect_w(want, 1e-6);
}

struct replica_arg {
	int replica;
	float g;
	long status;
};

static void *replica_push(void *arg)
{
	struct replica_arg *a = arg;
	CURL *c = curl_easy_init();
	char path[200];

	snprintf(path, sizeof path, "/v1/vars/w/apply?rule=sgd&lr=1&step=0&replicas=3&backup=1"
		 "&replica=%d", a->replica);
	a->status = send_fill(c, "POST", path, a->g);
	curl_easy_cleanup(c);
	return NULL;
}

Test(routes, a_backup_worker_applies_after_two_of_three_and_drops_the_third)
{
	struct replica_arg a[3] = { { 0, 1, 0 }, { 1, 2, 0 }, { 2, 4, 0 } };
	pthread_t th[3];
	int n200 = 0, n202 = 0, n409 = 0;
	float used = 0, want[6];
	uint64_t v = put_w();

	for (int i = 0; i < 3; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, replica_push, &a[i]), 0);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 3; i++) {
		n200 += a[i].status == 200;
		n202 += a[i].status == 202;
		n409 += a[i].status == 409;
		if (a[i].status != 409)
			used += a[i].g;
	}
	cr_assert(n200 == 1 && n202 == 1 && n409 == 1, "statuses %ld %ld %ld", a[0].status,
		  a[1].status, a[2].status);
	/* The two accepted gradients (distinct powers of two) are averaged once. */
	for (int i = 0; i < 6; i++)
		want[i] = W0[i] - used / 2;
	expect_w(want, 1e-6);
	cr_assert_eq(get_f32("w", want, 6), v + 1);
}

/* ------------------------------------------------------------ queues */

static const char QSPEC[] = "{\"capacity\":10,\"components\":[{\"dtype\":\"int32\",\"shape\":[2]},"
			    "{\"dtype\":\"float32\",\"shape\":[]}]}";

Test(routes, queue_routes_create_enqueue_dequeue_close_and_delete)
{
	/* 3 examples: ints [3,2] then floats [3]. */
	struct { int32_t i[6]; float f[3]; } batch = { { 1, 2, 3, 4, 5, 6 }, { 0.5f, 1.5f, 2.5f } };
	static const char other[] = "{\"capacity\":11,\"components\":[{\"dtype\":\"int32\","
				    "\"shape\":[]}]}";
	struct resp r;
	json_t *j;

	cr_assert_eq(req("POST", "/v1/queues/q", NULL, QSPEC, strlen(QSPEC), &r), 201);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "capacity"), 10);
	cr_assert_eq(json_int_at(j, "size"), 0);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("POST", "/v1/queues/q", NULL, QSPEC, strlen(QSPEC), &r), 200);
	resp_free(&r);
	req("POST", "/v1/queues/q", NULL, other, strlen(other), &r);
	expect_error(&r, 409, "exists");
	cr_assert_eq(req("POST", "/v1/queues/q/enqueue?n=3", NULL, &batch, sizeof batch, &r), 200);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/queues/q", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "size"), 3);
	cr_assert(json_is_false(json_object_get(j, "closed")));
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("POST", "/v1/queues/q/dequeue?n=2", NULL, NULL, 0, &r), 200);
	cr_assert_eq(hdr_u64(&r, "Dg-Count"), 2);
	cr_assert_eq(r.body.len, 2 * 8 + 2 * 4);
	cr_assert_eq(memcmp(r.body.data, batch.i, 16), 0);     /* FIFO without shuffle */
	cr_assert_eq(memcmp(r.body.data + 16, batch.f, 8), 0);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/queues", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_array_size(json_object_get(j, "queues")), 1);
	cr_assert_eq(json_int_at(json_array_get(json_object_get(j, "queues"), 0), "size"), 1);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("POST", "/v1/queues/q/close", NULL, NULL, 0, &r), 200);
	resp_free(&r);
	req("POST", "/v1/queues/q/enqueue", NULL, &batch, 12, &r);
	expect_error(&r, 410, "closed");
	req("POST", "/v1/queues/q/dequeue?n=2", NULL, NULL, 0, &r);
	expect_error(&r, 410, "closed");
	cr_assert_eq(req("POST", "/v1/queues/q/dequeue?n=2&allow_smaller=1", NULL, NULL, 0, &r),
		     200);
	cr_assert_eq(hdr_u64(&r, "Dg-Count"), 1);
	cr_assert_eq(memcmp(r.body.data, batch.i + 4, 8), 0);
	cr_assert_eq(memcmp(r.body.data + 8, batch.f + 2, 4), 0);
	resp_free(&r);
	cr_assert_eq(req("DELETE", "/v1/queues/q", NULL, NULL, 0, &r), 200);
	resp_free(&r);
	req("GET", "/v1/queues/q", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
}

Test(routes, queue_waits_time_out_with_504_and_bad_arguments_are_400)
{
	struct resp r;
	double t0;

	cr_assert_eq(req("POST", "/v1/queues/q", NULL, QSPEC, strlen(QSPEC), &r), 201);
	resp_free(&r);
	t0 = now_s();
	req("POST", "/v1/queues/q/dequeue?timeout_ms=250", NULL, NULL, 0, &r);
	cr_assert_geq(now_s() - t0, 0.2);
	expect_error(&r, 504, "timeout");
	req("POST", "/v1/queues/q/dequeue?n=0", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q/enqueue?n=1", NULL, "short", 5, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/bad", NULL, "{\"capacity\":", 12, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/bad", NULL, "{\"capacity\":0,\"components\":[]}",
	    strlen("{\"capacity\":0,\"components\":[]}"), &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/nothing/dequeue", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
}

Test(routes, leased_dequeues_ack_release_peek_and_ids)
{
	static const char spec[] = "{\"capacity\":10,\"components\":[{\"dtype\":\"float32\","
				   "\"shape\":[]},{\"dtype\":\"int64\",\"shape\":[]}],\"ids\":1}";
	struct { float f[4]; int64_t id[4]; } batch = { { 1, 2, 3, 4 }, { 7, 8, 9, 10 } };
	char path[128];
	struct resp r;
	json_t *j;
	uint64_t lease;

	cr_assert_eq(req("POST", "/v1/queues/q", NULL, spec, strlen(spec), &r), 201);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "ids"), 1);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("POST", "/v1/queues/q/enqueue?n=4", NULL, &batch, sizeof batch, &r), 200);
	resp_free(&r);
	cr_assert_eq(req("POST", "/v1/queues/q/dequeue?n=2&lease_ms=60000&holder=j1/r0", NULL,
			 NULL, 0, &r), 200);
	lease = hdr_u64(&r, "Dg-Lease");
	cr_assert_gt(lease, 0);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/queues/q/peek?n=5", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_array_size(json_object_get(j, "ids")), 2);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(j, "ids"), 0)), 9);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(
		json_object_get(j, "leases"), 0), "holder")), "j1/r0");
	json_decref(j);
	resp_free(&r);
	snprintf(path, sizeof path, "/v1/queues/q/ack?lease=%llu", (unsigned long long)lease);
	cr_assert_eq(req("POST", path, NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "acked"), 2);
	json_decref(j);
	resp_free(&r);
	req("POST", path, NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
	/* a second lease, released by its holder: back at the front */
	cr_assert_eq(req("POST", "/v1/queues/q/dequeue?n=1&lease_ms=60000&holder=j1/r1", NULL,
			 NULL, 0, &r), 200);
	resp_free(&r);
	cr_assert_eq(req("POST", "/v1/queues/q/release?holder=j1/r1", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "leases"), 1);
	cr_assert_eq(json_int_at(j, "requeued"), 1);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/queues/q/ids", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_array_size(json_object_get(j, "enqueued")), 11);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(j, "acked"), 7)), 1);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(j, "acked"), 9)), 0);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/queues/q", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "acked"), 2);
	cr_assert_eq(json_int_at(j, "requeued"), 1);
	cr_assert_eq(json_int_at(j, "ids_complete"), 2);
	cr_assert_eq(json_int_at(j, "ids_short"), 2);
	json_decref(j);
	resp_free(&r);
	/* the requeue log: j1/r1's lease, with its id (the front one, 9) */
	cr_assert_eq(req("GET", "/v1/queues/q/requeues?prefix=j1/r", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	json_t *e = json_array_get(json_object_get(j, "requeues"), 0);
	cr_assert_eq(json_array_size(json_object_get(j, "requeues")), 1);
	cr_assert_str_eq(json_string_value(json_object_get(e, "holder")), "j1/r1");
	cr_assert_str_eq(json_string_value(json_object_get(e, "reason")), "holder_released");
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(e, "ids"), 0)), 9);
	cr_assert_eq(json_int_at(j, "last_seq"), 1);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/queues/q/requeues?after=1", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_array_size(json_object_get(j, "requeues")), 0);
	json_decref(j);
	resp_free(&r);
	req("GET", "/v1/queues/q/requeues?after=-1", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/queues/q/requeues?n=0", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	snprintf(path, sizeof path, "/v1/queues/q/requeues?prefix=%.*s", 64,
		 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
	req("GET", path, NULL, NULL, 0, &r);      /* longer than any holder */
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/queues/none/requeues", NULL, NULL, 0, &r);
	expect_error(&r, 404, "not_found");
	/* bad input: 4xx, nothing taken */
	req("POST", "/v1/queues/q/dequeue?n=1&holder=x", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q/dequeue?n=1&lease_ms=10&holder=a%20b", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q/ack", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q/release", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q/dequeue?n=11&lease_ms=10", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/bad", NULL, "{\"capacity\":4,\"components\":[{\"dtype\":"
	    "\"float32\",\"shape\":[]}],\"ids\":0}", 69, &r);
	expect_error(&r, 400, "invalid_argument");
	cr_assert_eq(req("GET", "/v1/queues/q", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "size"), 2);
	json_decref(j);
	resp_free(&r);
}

#define N_EXAMPLES 400
#define N_CONSUMERS 4

struct consumer {
	int64_t got[N_EXAMPLES];
	int n;
	long last_status;
};

static void *consume(void *arg)
{
	struct consumer *c = arg;
	CURL *h = curl_easy_init();
	struct resp r;

	for (;;) {
		req_on(h, "POST", "/v1/queues/q/dequeue?n=8&allow_smaller=1&timeout_ms=20000", NULL,
		       NULL, 0, &r);
		c->last_status = r.status;
		if (r.status != 200) {
			resp_free(&r);
			break;
		}
		for (size_t i = 0; i + 8 <= r.body.len && c->n < N_EXAMPLES; i += 8)
			memcpy(&c->got[c->n++], r.body.data + i, 8);
		resp_free(&r);
	}
	curl_easy_cleanup(h);
	return NULL;
}

Test(routes, four_concurrent_consumers_receive_disjoint_examples)
{
	static const char spec[] = "{\"capacity\":64,\"shuffle\":true,"
		"\"min_after_dequeue\":8,\"seed\":7,"
		"\"components\":[{\"dtype\":\"int64\",\"shape\":[]}]}";
	static struct consumer cons[N_CONSUMERS];
	static int seen[N_EXAMPLES];
	pthread_t th[N_CONSUMERS];
	struct resp r;
	int total = 0;

	cr_assert_eq(req("POST", "/v1/queues/q", NULL, spec, strlen(spec), &r), 201);
	resp_free(&r);
	for (int i = 0; i < N_CONSUMERS; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, consume, &cons[i]), 0);
	for (int64_t b = 0; b < N_EXAMPLES; b += 20) {
		int64_t v[20];
		for (int i = 0; i < 20; i++)
			v[i] = b + i;
		cr_assert_eq(req("POST", "/v1/queues/q/enqueue?n=20", NULL, v, sizeof v, &r), 200);
		resp_free(&r);
	}
	cr_assert_eq(req("POST", "/v1/queues/q/close", NULL, NULL, 0, &r), 200);
	resp_free(&r);
	for (int i = 0; i < N_CONSUMERS; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(cons[i].last_status, 410, "consumer %d ended with %ld", i,
			     cons[i].last_status);
		for (int k = 0; k < cons[i].n; k++) {
			cr_assert(cons[i].got[k] >= 0 && cons[i].got[k] < N_EXAMPLES);
			seen[cons[i].got[k]]++;
		}
		total += cons[i].n;
	}
	cr_assert_eq(total, N_EXAMPLES);
	for (int i = 0; i < N_EXAMPLES; i++)
		cr_assert_eq(seen[i], 1, "example %d dequeued %d times", i, seen[i]);
}

/* ------------------------------------------------------------ server-wide */

Test(routes, a_token_is_required_when_configured)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .token = "s3cret" };
	struct resp r;

	stop_server();
	start_server(&cfg);
	req("GET", "/v1/health", NULL, NULL, 0, &r);
	expect_error(&r, 401, "unauthorized");
	req("GET", "/v1/vars", (const char *[]){ "Authorization: Bearer wrong", NULL }, NULL, 0,
	    &r);
	expect_error(&r, 401, "unauthorized");
	req("PUT", "/v1/vars/w", (const char *[]){ "Dg-Dtype: float32", "Dg-Shape: 6", NULL }, W0,
	    sizeof W0, &r);
	expect_error(&r, 401, "unauthorized");
	cr_assert_eq(req("GET", "/v1/vars", (const char *[]){ "Authorization: Bearer s3cret",
		     NULL }, NULL, 0, &r), 200);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/w", (const char *[]){ "Authorization: Bearer s3cret",
		     NULL }, NULL, 0, &r), 404);
	resp_free(&r);
}

Test(routes, metrics_are_prometheus_text_with_http_store_and_queue_lines)
{
	struct resp r;
	char buf[128];

	put_w();
	cr_assert_eq(req("POST", "/v1/queues/q", NULL, QSPEC, strlen(QSPEC), &r), 201);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/metrics", NULL, NULL, 0, &r), 200);
	cr_assert(strncmp(hdr(&r, "Content-Type", buf, sizeof buf), "text/plain", 10) == 0);
	cr_assert(strstr(r.body.data, "dg_http_requests_total") != NULL);
	cr_assert(strstr(r.body.data, "dg_ps_vars 1") != NULL, "%s", r.body.data);
	cr_assert(strstr(r.body.data, "dg_ps_bytes 24") != NULL);
	cr_assert(strstr(r.body.data, "dg_queue_capacity{queue=\"q\"} 10") != NULL);
	resp_free(&r);
}

/* Without a GPU (the usual test machine) "gpus" is [] and dg_gpus is 0; with one, each
 * entry must match what dg_gpu_get_info reports. */
Test(routes, health_and_metrics_report_the_gpus_and_whether_cuda_is_built)
{
	int n = dg_gpu_count();
	struct resp r;
	json_t *j, *gpus;
	char line[256];

	cr_assert_eq(req("GET", "/v1/health", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	gpus = json_object_get(j, "gpus");
	cr_assert(json_is_array(gpus), "%s", r.body.data);
	cr_assert_eq(json_array_size(gpus), (size_t)n);
	cr_assert(json_is_boolean(json_object_get(j, "cuda_built")));
	cr_assert_eq(json_is_true(json_object_get(j, "cuda_built")), dg_gpu_built());
	cr_assert_str_eq(json_string_value(json_object_get(j, "gpu")), dg_gpu_describe());
	for (int i = 0; i < n; i++) {
		json_t *g = json_array_get(gpus, (size_t)i);
		struct dg_gpu_info info;
		struct dg_err err = { 0 };

		cr_assert_eq(dg_gpu_get_info(i, &info, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(json_int_at(g, "index"), i);
		cr_assert_str_eq(json_string_value(json_object_get(g, "name")), info.name);
		cr_assert_eq(json_int_at(g, "memory_bytes"), (json_int_t)info.mem_bytes);
		snprintf(line, sizeof line, "%d.%d", info.cc_major, info.cc_minor);
		cr_assert_str_eq(json_string_value(json_object_get(g, "compute_capability")), line);
	}
	json_decref(j);
	resp_free(&r);

	cr_assert_eq(req("GET", "/v1/metrics", NULL, NULL, 0, &r), 200);
	cr_assert(strstr(r.body.data, "# TYPE dg_gpus gauge\n") != NULL, "%s", r.body.data);
	cr_assert(strstr(r.body.data, "# HELP dg_gpu_memory_bytes ") != NULL);
	cr_assert(strstr(r.body.data, "# TYPE dg_gpu_memory_bytes gauge\n") != NULL);
	snprintf(line, sizeof line, "\ndg_gpus %d\n", n);
	cr_assert(strstr(r.body.data, line) != NULL, "%s", r.body.data);
	cr_assert_eq(strstr(r.body.data, "dg_gpu_memory_bytes{gpu=\"") != NULL, n > 0);
	for (int i = 0; i < n; i++) {
		struct dg_gpu_info info;
		struct dg_err err = { 0 };

		cr_assert_eq(dg_gpu_get_info(i, &info, &err), DG_OK, "%s", err.msg);
		snprintf(line, sizeof line, "dg_gpu_memory_bytes{gpu=\"%d\",name=\"", i);
		cr_assert(strstr(r.body.data, line) != NULL, "%s", r.body.data);
		snprintf(line, sizeof line, "\"} %zu\n", info.mem_bytes);
		cr_assert(strstr(r.body.data, line) != NULL, "%s", r.body.data);
	}
	resp_free(&r);
}

/* ps/ shows exactly the devices it was given: every field, and a name with a
 * quote and a backslash escaped as Prometheus label values need. */
Test(routes, health_and_metrics_show_the_devices_the_server_program_describes)
{
	const struct ps_gpu gpus[2] = {
		{ .index = 0, .name = "Fake \"X\" GPU", .mem_bytes = 1000, .cc_major = 9, .cc_minor = 0 },
		{ .index = 1, .name = "back\\slash", .mem_bytes = 2000, .cc_major = 8, .cc_minor = 6 },
	};
	const struct ps_devices d = { .blas = "a BLAS", .gpu = "2 fake GPUs", .cuda_built = true,
				      .n_gpus = 2, .gpus = gpus };
	struct ps_server_config cfg = { .job = "ps", .task = 0, .devices = &d };
	struct resp r;
	json_t *j, *g;

	stop_server();
	start_server(&cfg);
	cr_assert_eq(req("GET", "/v1/health", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(j, "blas")), "a BLAS");
	cr_assert_str_eq(json_string_value(json_object_get(j, "gpu")), "2 fake GPUs");
	cr_assert(json_is_true(json_object_get(j, "cuda_built")), "%s", r.body.data);
	cr_assert_eq(json_array_size(json_object_get(j, "gpus")), 2);
	g = json_array_get(json_object_get(j, "gpus"), 1);
	cr_assert_eq(json_int_at(g, "index"), 1);
	cr_assert_str_eq(json_string_value(json_object_get(g, "name")), "back\\slash");
	cr_assert_eq(json_int_at(g, "memory_bytes"), 2000);
	cr_assert_str_eq(json_string_value(json_object_get(g, "compute_capability")), "8.6");
	json_decref(j);
	resp_free(&r);

	cr_assert_eq(req("GET", "/v1/metrics", NULL, NULL, 0, &r), 200);
	cr_assert(strstr(r.body.data, "\ndg_gpus 2\n") != NULL, "%s", r.body.data);
	cr_assert(strstr(r.body.data, "dg_gpu_memory_bytes{gpu=\"0\",name=\"Fake \\\"X\\\" GPU\"} 1000\n"),
		  "%s", r.body.data);
	cr_assert(strstr(r.body.data, "dg_gpu_memory_bytes{gpu=\"1\",name=\"back\\\\slash\"} 2000\n"),
		  "%s", r.body.data);
	resp_free(&r);
}

/* A server started without a description (a library user, a test) claims no
 * BLAS, no CUDA build and no GPU it could use. */
Test(routes, health_without_a_device_description_claims_none)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0 };
	struct resp r;
	json_t *j;

	stop_server();
	start_server(&cfg);
	cr_assert_eq(req("GET", "/v1/health", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
	cr_assert_null(json_object_get(j, "blas"), "%s", r.body.data);
	cr_assert_null(json_object_get(j, "gpu"));
	cr_assert_null(json_object_get(j, "cuda_built"));
	cr_assert(json_is_array(json_object_get(j, "gpus")));
	cr_assert_eq(json_array_size(json_object_get(j, "gpus")), 0);
	json_decref(j);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/metrics", NULL, NULL, 0, &r), 200);
	cr_assert(strstr(r.body.data, "\ndg_gpus 0\n") != NULL, "%s", r.body.data);
	resp_free(&r);
}

Test(routes, a_restart_on_the_data_dir_keeps_values_and_raises_the_epoch)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .data_dir = data_dir };
	static const float w1[6] = { 9, 9, 9, 9, 9, 9 };
	struct resp r;
	float got[6];
	uint64_t v;

	snprintf(data_dir, sizeof data_dir, "/tmp/dg-test-routes-XXXXXX");
	cr_assert_not_null(mkdtemp(data_dir));
	stop_server();
	start_server(&cfg);
	put_w();
	cr_assert_eq(put_f32("w", w1, 6, "2,3", &r), 200);
	v = hdr_u64(&r, "Dg-Version");
	cr_assert_eq(hdr_u64(&r, "Dg-Epoch"), 1);
	resp_free(&r);
	stop_server();
	start_server(&cfg);
	/* The value is kept; its version moved above every one handed out before
	 * (doc/persistence.md: versions never go back). */
	uint64_t v2 = get_f32("w", got, 6);
	cr_assert_gt(v2, v);
	cr_assert_eq(memcmp(got, w1, sizeof w1), 0);
	cr_assert_eq(req("GET", "/v1/health", NULL, NULL, 0, &r), 200);
	cr_assert_eq(hdr_u64(&r, "Dg-Epoch"), 2);
	resp_free(&r);
	cr_assert_eq(put_f32("w", W0, 6, "2,3", &r), 200);
	cr_assert_gt(hdr_u64(&r, "Dg-Version"), v2);
	resp_free(&r);
}

/* A long poll of w (arg: the query, e.g. "min_version=99"). */
static void *long_poll(void *arg)
{
	CURL *c = curl_easy_init();
	struct resp r;

	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	/* Answered 503 or cut off by the stop: either way it returns. */
	{
		char url[160];
		snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/vars/w?%s&timeout_ms=60000",
			 port, (const char *)arg);
		memset(&r, 0, sizeof r);
		curl_easy_setopt(c, CURLOPT_URL, url);
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
		curl_easy_setopt(c, CURLOPT_TIMEOUT, 90L);
		curl_easy_perform(c);
	}
	resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

/* A GET ?query that waits, then a stop: it must not wait for the poll. */
static void stop_during_poll(const char *query)
{
	pthread_t th;
	double t0;

	put_w();
	cr_assert_eq(pthread_create(&th, NULL, long_poll, (void *)query), 0);
	usleep(300 * 1000);
	t0 = now_s();
	stop_server();
	cr_assert_lt(now_s() - t0, 3.0, "stop took %.2f s", now_s() - t0);
	pthread_join(th, NULL);
}

Test(routes, stopping_does_not_wait_for_long_polls)
{
	stop_during_poll("min_version=99");
}

Test(routes, stopping_does_not_wait_for_polls_of_a_sync_step)
{
	stop_during_poll("min_step=5");
}

Test(routes, prefer_return_minimal_answers_an_async_apply_with_204_and_its_version)
{
	static const float g[6] = { 1, 1, 1, 1, 1, 1 };
	const char *h[] = { "Dg-Dtype: float32", "Dg-Shape: 2,3", "Prefer: respond-async, "
			    "return=minimal", NULL };
	float want[6];
	struct resp r;
	json_t *j;
	uint64_t v = put_w();

	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=sgd&lr=0.5", h, g, sizeof g, &r), 204);
	cr_assert_eq(r.body.len, 0);
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v + 1);
	resp_free(&r);
	for (int i = 0; i < 6; i++)
		want[i] = W0[i] - 0.5f;
	expect_w(want, 0);
	/* a sync apply still answers with its JSON (pending, step) */
	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=sgd&lr=0.5&step=0&replicas=2", h, g,
			 sizeof g, &r), 202);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "pending"), 1);
	json_decref(j);
	resp_free(&r);
	/* without the preference: 200 and the JSON of the documented reply */
	cr_assert_eq(apply("rule=sgd&lr=0.5", g, &j), 200);
	cr_assert(json_is_true(json_object_get(j, "applied")));
	cr_assert_eq(json_int_at(j, "version"), (int64_t)v + 2);
	json_decref(j);
}

/* ------------------------------------------------------------ sync steps */

/* Two replicas complete step `step` of w after delay_ms: sgd lr 1 with
 * gradients g and 3g (mean 2g). */
struct step_push {
	int delay_ms;
	int step;
	float g;
};

static void *complete_step_later(void *arg)
{
	struct step_push *p = arg;
	CURL *c = curl_easy_init();
	char path[200];

	usleep((useconds_t)p->delay_ms * 1000);
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof path, "/v1/vars/w/apply?rule=sgd&lr=1&step=%d&replicas=2"
			 "&replica=%d", p->step, k);
		send_fill(c, "POST", path, p->g * (k ? 3.0f : 1.0f));
	}
	curl_easy_cleanup(c);
	return NULL;
}

Test(routes, get_and_head_report_the_sync_step_in_dg_step)
{
	struct resp r;
	json_t *j;
	char buf[32];

	put_w();
	cr_assert_eq(req("HEAD", "/v1/vars/w", NULL, NULL, 0, &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Step", buf, sizeof buf), "0");
	resp_free(&r);
	cr_assert_eq(apply("rule=sgd&lr=1&step=0&replicas=1", W0, &j), 200);
	cr_assert_eq(json_int_at(j, "step"), 1);
	json_decref(j);
	cr_assert_eq(apply("rule=sgd&lr=1&step=1&replicas=1", W0, &j), 200);
	json_decref(j);
	/* an async apply and a PUT keep the step */
	cr_assert_eq(apply("rule=sgd&lr=1", W0, &j), 200);
	json_decref(j);
	cr_assert_eq(put_f32("w", W0, 6, "2,3", &r), 200);
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars/w", NULL, NULL, 0, &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Step", buf, sizeof buf), "2");
	resp_free(&r);
	cr_assert_eq(req("GET", "/v1/vars", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(json_array_get(json_object_get(j, "vars"), 0), "step"), 2);
	json_decref(j);
	resp_free(&r);
}

Test(routes, min_step_waits_until_a_sync_step_completes_or_answers_304)
{
	struct step_push p = { 300, 0, 0.5f };
	struct resp r;
	pthread_t th;
	char buf[32];
	double t0;
	uint64_t v = put_w();

	cr_assert_eq(pthread_create(&th, NULL, complete_step_later, &p), 0);
	t0 = now_s();
	cr_assert_eq(req("GET", "/v1/vars/w?min_step=1&timeout_ms=10000", NULL, NULL, 0, &r),
		     200);
	cr_assert_geq(now_s() - t0, 0.25);
	cr_assert_lt(now_s() - t0, 5.0);
	cr_assert_str_eq(hdr(&r, "Dg-Step", buf, sizeof buf), "1");
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v + 1);
	cr_assert_eq(r.body.len, sizeof W0);
	for (int i = 0; i < 6; i++)     /* w - 1 * mean(0.5, 1.5) */
		cr_assert_float_eq(((float *)(void *)r.body.data)[i], W0[i] - 1.0f, 0);
	resp_free(&r);
	pthread_join(th, NULL);
	/* already there: answered at once */
	cr_assert_eq(req("GET", "/v1/vars/w?min_step=1&timeout_ms=0", NULL, NULL, 0, &r), 200);
	resp_free(&r);
	t0 = now_s();
	cr_assert_eq(req("GET", "/v1/vars/w?min_step=2&timeout_ms=300", NULL, NULL, 0, &r), 304);
	cr_assert_geq(now_s() - t0, 0.25);
	cr_assert_eq(r.body.len, 0);
	cr_assert_str_eq(hdr(&r, "Dg-Step", buf, sizeof buf), "1");
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v + 1);
	resp_free(&r);
	/* both conditions: the version is there, the step is not */
	snprintf(buf, sizeof buf, "%llu", (unsigned long long)v + 1);
	char path[160];
	snprintf(path, sizeof path, "/v1/vars/w?min_version=%s&min_step=2&timeout_ms=200", buf);
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &r), 304);
	resp_free(&r);
	snprintf(path, sizeof path, "/v1/vars/w?min_version=%s&min_step=1&timeout_ms=200", buf);
	cr_assert_eq(req("GET", path, NULL, NULL, 0, &r), 200);
	resp_free(&r);
	req("GET", "/v1/vars/w?min_step=-1", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("GET", "/v1/vars/w?min_step=x", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
}

/* ------------------------------------------------------------ checkpoints */

Test(routes, checkpoint_without_a_data_dir_is_501_and_says_how_to_get_one)
{
	struct resp r;
	json_t *j;
	uint64_t v = put_w();

	cr_assert_eq(req("POST", "/v1/checkpoint", NULL, NULL, 0, &r), 501);
	j = body_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
			 "unsupported");
	cr_assert_not_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"),
								    "hint")), "--data-dir"));
	json_decref(j);
	resp_free(&r);
	expect_unchanged(W0, v);
}

Test(routes, checkpoint_reports_the_snapshot_and_a_restart_keeps_values_and_steps)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .data_dir = data_dir };
	struct resp r;
	struct stat sb;
	char path[128], buf[32];
	float want[6];
	json_t *j;

	snprintf(data_dir, sizeof data_dir, "/tmp/dg-test-routes-XXXXXX");
	cr_assert_not_null(mkdtemp(data_dir));
	stop_server();
	start_server(&cfg);
	put_w();
	for (int s = 0; s < 3; s++) {   /* three sync steps of w -= 1 * W0... */
		snprintf(path, sizeof path, "rule=sgd&lr=0.5&step=%d&replicas=1", s);
		cr_assert_eq(apply(path, W0, &j), 200);
		json_decref(j);
	}
	for (int i = 0; i < 6; i++)
		want[i] = W0[i] - 3 * 0.5f * W0[i];
	cr_assert_eq(req("POST", "/v1/checkpoint", NULL, NULL, 0, &r), 200);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "epoch"), 1);
	cr_assert_eq(json_int_at(j, "vars"), 1);
	snprintf(path, sizeof path, "%s/snapshot.dgs", data_dir);
	cr_assert_eq(stat(path, &sb), 0);
	cr_assert_eq(json_int_at(j, "bytes"), (int64_t)sb.st_size);
	cr_assert_gt(sb.st_size, (off_t)sizeof W0);
	cr_assert(json_number_value(json_object_get(j, "ms")) >= 0);
	json_decref(j);
	resp_free(&r);
	stop_server();
	start_server(&cfg);
	expect_w(want, 0);
	cr_assert_eq(req("HEAD", "/v1/vars/w", NULL, NULL, 0, &r), 200);
	cr_assert_str_eq(hdr(&r, "Dg-Step", buf, sizeof buf), "3");
	cr_assert_eq(hdr_u64(&r, "Dg-Epoch"), 2);
	resp_free(&r);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=2&replicas=1", W0, &j), 409);
	json_decref(j);
	cr_assert_eq(apply("rule=sgd&lr=0.5&step=3&replicas=1", W0, &j), 200);
	cr_assert_eq(json_int_at(j, "step"), 4);
	json_decref(j);
}

/* ------------------------------------------------------------ bad requests */

Test(routes, bad_names_and_path_traversal_are_refused)
{
	static const char *paths[] = {
		"/v1/vars/../x", "/v1/vars/%2e%2e/x", "/v1/vars//x", "/v1/vars/a/./b",
		"/v1/vars/a%00b", "/v1/vars/a%20b", "/v1/vars/x/..", "/v1/vars/%2E%2E",
	};
	struct dg_buf raw = { 0 };
	char text[512];
	struct resp r;
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		int st, n = snprintf(text, sizeof text, "GET %s HTTP/1.1\r\nHost: x\r\n"
				     "Connection: close\r\n\r\n", paths[i]);
		st = raw_exchange(text, (size_t)n, false, &raw);
		cr_assert(st >= 400 && st < 500, "%s: %d", paths[i], st);
		raw_to_resp(&raw, st, &r);
		expect_error(&r, st, NULL);
		dg_buf_deinit(&raw);
		n = snprintf(text, sizeof text, "PUT %s HTTP/1.1\r\nHost: x\r\n"
			     "Dg-Dtype: float32\r\nDg-Shape: 1\r\nContent-Length: 4\r\n"
			     "Connection: close\r\n\r\nabcd", paths[i]);
		st = raw_exchange(text, (size_t)n, false, &raw);
		cr_assert(st >= 400 && st < 500, "PUT %s: %d", paths[i], st);
		dg_buf_deinit(&raw);
	}
	memset(text, 'a', 300);
	memcpy(text, "/v1/vars/", 9);
	text[300] = '\0';
	req("GET", text, NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	cr_assert_eq(req("GET", "/v1/vars", NULL, NULL, 0, &r), 200);
	{
		json_t *j = body_json(&r);
		cr_assert_eq(json_array_size(json_object_get(j, "vars")), 1, "%s", r.body.data);
		json_decref(j);
	}
	resp_free(&r);
	expect_unchanged(W0, v);
}

/* The error's message, which must quote what was sent with bad bytes escaped. */
static void expect_message_has(struct resp *r, long status, const char *code, const char *sub)
{
	json_t *j = body_json(r);
	const char *m = json_string_value(json_object_get(json_object_get(j, "error"),
							   "message"));

	cr_assert(m && strstr(m, sub), "wanted '%s' in %.*s", sub, (int)r->body.len,
		  r->body.data);
	json_decref(j);
	expect_error(r, status, code);
}

Test(routes, bytes_that_are_not_utf8_get_400_quoting_them_escaped)
{
	static const char *bad_headers[] = {
		"Dg-Dtype: \xff\xfe", "Dg-Shape: 2,\xff", "Content-Type: text/\xff",
		"If-Match: \"\xff\"", "If-None-Match: \xc3",
	};
	char name[400], path[1300];
	struct resp r;
	uint64_t v = put_w();

	req("PUT", "/v1/vars/%ff%fe", (const char *[]){ "Dg-Dtype: float32", "Dg-Shape: 1",
	    NULL }, W0, 4, &r);
	expect_message_has(&r, 400, "invalid_argument", "\\xff\\xfe");
	req("GET", "/v1/vars/a%ffb", NULL, NULL, 0, &r);
	expect_message_has(&r, 400, "invalid_argument", "a\\xffb");
	req("DELETE", "/v1/vars/%c3", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/vars/%fe/apply?rule=sgd&lr=1", NULL, W0, sizeof W0, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q%ff", (const char *[]){ "Content-Type: application/json", NULL },
	    "{}", 2, &r);
	expect_error(&r, 400, "invalid_argument");
	req("POST", "/v1/queues/q%ff/dequeue", NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
		req("PUT", "/v1/vars/w", (const char *[]){ bad_headers[i], NULL }, W0, sizeof W0,
		    &r);
		cr_assert_eq(r.status, 400, "%s: %ld %.*s", bad_headers[i], r.status,
			     (int)r.body.len, r.body.data);
		expect_error(&r, 400, NULL);
	}
	req("GET", "/v1/vars/w?format=%ff", NULL, NULL, 0, &r);
	expect_message_has(&r, 400, "invalid_argument", "\\xff");
	req("POST", "/v1/vars/w/apply?rule=%ff%ff", NULL, W0, sizeof W0, &r);
	expect_error(&r, 400, "invalid_argument");
	/* valid UTF-8 cut in the middle of a character by the message's limits */
	strcpy(name, "a");
	for (int i = 0; i < 150; i++)
		strcat(name, "\xc3\xa9");
	strcpy(path, "/v1/vars/");
	for (const char *p = name; *p; p++)
		snprintf(path + strlen(path), 4, (unsigned char)*p < 128 ? "%c" : "%%%02x",
			 (unsigned char)*p);
	req("PUT", path, (const char *[]){ "Dg-Dtype: float32", "Dg-Shape: 1", NULL }, W0, 4,
	    &r);
	expect_error(&r, 400, "invalid_argument");
	expect_unchanged(W0, v);
}

Test(routes, a_name_segment_over_251_bytes_is_refused_everywhere)
{
	char seg[256], path[290];
	struct resp r;

	memset(seg, 'a', 252);
	seg[252] = '\0';
	snprintf(path, sizeof path, "/v1/vars/m/%s", seg);
	put_f32(path + 9, W0, 1, "1", &r);
	expect_message_has(&r, 400, "invalid_argument", "segment of 252 bytes");
	req("GET", path, NULL, NULL, 0, &r);
	expect_error(&r, 400, "invalid_argument");
	snprintf(path, sizeof path, "/v1/queues/%s", seg);
	req("POST", path, (const char *[]){ "Content-Type: application/json", NULL },
	    "{\"components\": [{\"dtype\": \"float32\", \"shape\": []}]}", 52, &r);
	expect_error(&r, 400, "invalid_argument");
	seg[251] = '\0';       /* 251 bytes: NAME.npy is 255 */
	snprintf(path, sizeof path, "m/%s", seg);
	cr_assert_eq(put_f32(path, W0, 1, "1", &r), 201);
	resp_free(&r);
}

Test(routes, http_1_1_without_host_is_400_and_http_1_0_is_served)
{
	struct dg_buf raw = { 0 };
	struct resp r;
	static const char no_host[] = "GET /v1/health HTTP/1.1\r\nConnection: close\r\n\r\n";
	static const char put_no_host[] = "PUT /v1/vars/w HTTP/1.1\r\nDg-Dtype: float32\r\n"
					  "Dg-Shape: 1\r\nContent-Length: 4\r\n"
					  "Connection: close\r\n\r\nabcd";
	static const char old[] = "GET /v1/health HTTP/1.0\r\n\r\n";
	int st = raw_exchange(no_host, sizeof no_host - 1, false, &raw);

	cr_assert_eq(st, 400);
	raw_to_resp(&raw, st, &r);
	expect_message_has(&r, 400, "invalid_argument", "Host");
	dg_buf_deinit(&raw);
	st = raw_exchange(put_no_host, sizeof put_no_host - 1, false, &raw);
	cr_assert_eq(st, 400);
	dg_buf_deinit(&raw);
	cr_assert_eq(req("HEAD", "/v1/vars/w", NULL, NULL, 0, &r), 404, "nothing was written");
	resp_free(&r);
	st = raw_exchange(old, sizeof old - 1, false, &raw);
	cr_assert_eq(st, 200);
	dg_buf_deinit(&raw);
}

Test(routes, bodies_that_disagree_with_their_headers_are_refused)
{
	static const struct { const char *dt, *shape; size_t len; const char *code; } bad[] = {
		{ "float32", "2,3", 20, "invalid_argument" },   /* too short */
		{ "float32", "2,3", 28, "invalid_argument" },   /* too long */
		{ "float64", "2,3", 24, "invalid_argument" },   /* 48 bytes needed */
		{ "complex64", "2,3", 24, "dtype_mismatch" },
		{ "float32", "4611686018427387904", 24, NULL },  /* 2^62 elements */
		{ "float32", "2147483648,2147483648", 24, NULL },
		{ "float32", "-1,6", 24, NULL },
		{ "float32", "1,1,1,1,1,1,1,1,6", 24, NULL },   /* 9 dims */
		{ "float32", "two", 24, NULL },
	};
	static const char cut_npy[] = "\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'";   /* truncated */
	char body[32] = { 0 }, dt[64], sh[64];
	struct resp r;
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *h[] = { dt, sh, NULL };
		snprintf(dt, sizeof dt, "Dg-Dtype: %s", bad[i].dt);
		snprintf(sh, sizeof sh, "Dg-Shape: %s", bad[i].shape);
		req("PUT", "/v1/vars/w?replace=1", h, body, bad[i].len, &r);
		cr_assert(r.status >= 400 && r.status < 500, "%s %s: %ld", bad[i].dt, bad[i].shape,
			  r.status);
		expect_error(&r, r.status, bad[i].code);
	}
	req("PUT", "/v1/vars/w", (const char *[]){ "Content-Type: application/x-npy", NULL },
	    cut_npy, sizeof cut_npy - 1, &r);
	expect_error(&r, 400, NULL);
	req("PUT", "/v1/vars/w", (const char *[]){ "Content-Type: text/plain", NULL },
	    "1 2 x\n4 5 6\n", 12, &r);
	expect_error(&r, 400, NULL);
	req("PUT", "/v1/vars/w", (const char *[]){ "Content-Type: text/plain", NULL },
	    "1 2 3\n", 6, &r);
	expect_error(&r, 400, NULL);
	req("PUT", "/v1/vars/w", (const char *[]){ "Content-Type: image/png", NULL }, body, 24, &r);
	expect_error(&r, 400, "invalid_argument");
	expect_unchanged(W0, v);
}

Test(routes, truncated_bodies_and_content_length_lies_change_nothing)
{
	static const char trunc[] = "PUT /v1/vars/w HTTP/1.1\r\nHost: x\r\nDg-Dtype: float32\r\n"
				    "Dg-Shape: 2,3\r\nContent-Length: 24\r\n\r\n0123456789";
	static const char lie[] = "PUT /v1/vars/w HTTP/1.1\r\nHost: x\r\nDg-Dtype: float32\r\n"
				  "Dg-Shape: 2,3\r\nContent-Length: 8\r\nConnection: close\r\n\r\n"
				  "0123456789abcdef01234567";
	static const char neg[] = "PUT /v1/vars/w HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n"
				  "Connection: close\r\n\r\n";
	static const char huge[] = "PUT /v1/vars/w HTTP/1.1\r\nHost: x\r\nContent-Length: "
				   "99999999999999999999999\r\nConnection: close\r\n\r\n";
	struct dg_buf raw = { 0 };
	struct resp r;
	int st;
	uint64_t v = put_w();

	st = raw_exchange(trunc, sizeof trunc - 1, true, &raw);
	cr_assert(st == 0 || (st >= 400 && st < 500), "truncated body: %d", st);
	dg_buf_deinit(&raw);
	expect_unchanged(W0, v);
	st = raw_exchange(lie, sizeof lie - 1, false, &raw);
	cr_assert_eq(st, 400, "Content-Length lie: %d", st);
	raw_to_resp(&raw, st, &r);
	expect_error(&r, 400, "invalid_argument");
	dg_buf_deinit(&raw);
	st = raw_exchange(neg, sizeof neg - 1, false, &raw);
	cr_assert(st >= 400 && st < 500, "negative Content-Length: %d", st);
	dg_buf_deinit(&raw);
	st = raw_exchange(huge, sizeof huge - 1, false, &raw);
	cr_assert(st >= 400 && st < 500, "huge Content-Length: %d", st);
	dg_buf_deinit(&raw);
	expect_unchanged(W0, v);
}

Test(routes, bodies_over_the_limit_and_oversized_headers_get_4xx)
{
	struct ps_server_config cfg = { .job = "ps", .task = 0, .max_body = 1 << 20 };
	static char big[(1 << 20) + 64];
	char *hdr_line = malloc(40000);
	struct dg_buf raw = { 0 };
	struct resp r;
	int st, n;
	uint64_t v;

	stop_server();
	start_server(&cfg);
	v = put_w();
	tolerate_send_error = true;
	req("PUT", "/v1/vars/big", (const char *[]){ "Dg-Dtype: uint8", "Dg-Shape: 1048640",
	    NULL }, big, sizeof big, &r);
	tolerate_send_error = false;
	if (r.status)
		expect_error(&r, 413, "too_large");
	resp_free(&r);
	n = snprintf(big, sizeof big, "PUT /v1/vars/big HTTP/1.1\r\nHost: x\r\nDg-Dtype: uint8\r\n"
		     "Dg-Shape: 2000000\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n");
	st = raw_exchange(big, (size_t)n, false, &raw);
	cr_assert_eq(st, 413, "declared 2 MB body: %d", st);
	raw_to_resp(&raw, st, &r);
	expect_error(&r, 413, "too_large");
	dg_buf_deinit(&raw);
	cr_assert_not_null(hdr_line);
	memcpy(hdr_line, "X-Big: ", 7);
	memset(hdr_line + 7, 'a', 39000);
	hdr_line[39007] = '\0';
	req("GET", "/v1/vars/w", (const char *[]){ hdr_line, NULL }, NULL, 0, &r);
	cr_assert(r.status >= 400 && r.status < 500, "40 KB header: %ld", r.status);
	resp_free(&r);
	free(hdr_line);
	expect_unchanged(W0, v);
}

Test(routes, wrong_methods_get_405_and_unknown_paths_404)
{
	static const struct { const char *method, *path; long status; } bad[] = {
		{ "DELETE", "/v1/health", 405 }, { "POST", "/v1/vars/w", 405 },
		{ "PUT", "/v1/queues", 405 }, { "GET", "/v1/vars/w/apply", 404 },
		{ "GET", "/v1/nothing", 404 }, { "GET", "/v2/vars", 404 },
		{ "PATCH", "/v1/queues/q", 405 },
	};
	struct resp r;
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		req(bad[i].method, bad[i].path, NULL, NULL, 0, &r);
		cr_assert_eq(r.status, bad[i].status, "%s %s: %ld", bad[i].method, bad[i].path,
			     r.status);
		expect_error(&r, bad[i].status, NULL);
	}
	expect_unchanged(W0, v);
}

Test(routes, bad_query_numbers_are_400)
{
	static const char *paths[] = {
		"/v1/vars/w?min_version=abc", "/v1/vars/w?min_version=1&timeout_ms=-5",
		"/v1/vars/w?min_version=1&timeout_ms=1e3", "/v1/vars/w?replace=2",
		"/v1/vars/w?min_version=99999999999999999999999",
	};
	struct resp r;
	uint64_t v = put_w();

	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		const char *m = strstr(paths[i], "replace") ? "PUT" : "GET";
		req(m, paths[i], NULL, W0, sizeof W0, &r);
		cr_assert_eq(r.status, 400, "%s: %ld", paths[i], r.status);
		expect_error(&r, 400, "invalid_argument");
	}
	expect_unchanged(W0, v);
}

/* doc/http-api.md is the contract: every route of the table is in it as a
 * row "| METHOD | `PATH" with {name...} written NAME. */
Test(routes, every_route_is_documented_in_the_http_api_page)
{
	const char *src = getenv("DG_SOURCE_DIR");
	struct dg_buf doc = { 0 };
	struct dg_err err = { 0 };
	char path[512], row[300];

	if (src)
		snprintf(path, sizeof path, "%s/doc/http-api.md", src);
	else    /* run by hand: from the build directory __FILE__ is ../test/ps/... */
		snprintf(path, sizeof path, "%.*sdoc/http-api.md",
			 (int)(strlen(__FILE__) - strlen("test/ps/test_routes.c")), __FILE__);
	if (!src && access(path, R_OK) != 0)
		snprintf(path, sizeof path, "doc/http-api.md");        /* from the source root */
	cr_assert_eq(dg_buf_read_file(&doc, path, 1 << 20, &err), DG_OK, "%s", err.msg);
	for (int i = 0; i < ps_n_routes; i++) {
		const char *p = ps_routes[i].pattern, *brace = strstr(p, "{name...}");
		int n = snprintf(row, sizeof row, "| %s | `", ps_routes[i].method);
		if (brace)
			snprintf(row + n, sizeof row - (size_t)n, "%.*sNAME%s", (int)(brace - p), p,
				 brace + 9);
		else
			snprintf(row + n, sizeof row - (size_t)n, "%s", p);
		cr_assert(strstr(doc.data, row) != NULL, "doc/http-api.md lacks '%s'", row);
	}
	dg_buf_deinit(&doc);
}

Test(routes, prefer_return_representation_answers_an_async_apply_with_the_new_value)
{
	static const float g[6] = { 1, 2, 3, 4, 5, 6 };
	const char *h[] = { "Dg-Dtype: float32", "Dg-Shape: 2,3",
			    "Prefer: return=representation", NULL };
	char buf[64];
	float got[6];
	struct resp r;
	json_t *j;
	uint64_t v = put_w();

	/* sgd lr 0.5: w - 0.5 g = W0 / 2, the raw body with the GET's headers */
	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=sgd&lr=0.5", h, g, sizeof g, &r), 200);
	cr_assert_eq(r.body.len, sizeof got);
	memcpy(got, r.body.data, sizeof got);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(got[i], W0[i] / 2, 0, "element %d: %g", i, got[i]);
	cr_assert_str_eq(hdr(&r, "Content-Type", buf, sizeof buf), "application/octet-stream");
	cr_assert_str_eq(hdr(&r, "Dg-Dtype", buf, sizeof buf), "float32");
	cr_assert_str_eq(hdr(&r, "Dg-Shape", buf, sizeof buf), "2,3");
	cr_assert_eq(hdr_u64(&r, "Dg-Version"), v + 1);
	cr_assert_str_eq(hdr(&r, "Dg-Step", buf, sizeof buf), "0");
	resp_free(&r);
	expect_w((const float[]){ 0.5f, 1, 1.5f, 2, 2.5f, 3 }, 0);
	/* a sync apply ignores the preference: its JSON (pending, step) */
	cr_assert_eq(req("POST", "/v1/vars/w/apply?rule=sgd&lr=0.5&step=0&replicas=2", h, g,
			 sizeof g, &r), 202);
	j = body_json(&r);
	cr_assert_eq(json_int_at(j, "pending"), 1);
	json_decref(j);
	resp_free(&r);
	/* a refused apply is an error, not a value, and changes nothing */
	req("POST", "/v1/vars/w/apply?rule=sgd", h, g, sizeof g, &r);
	expect_error(&r, 400, "invalid_argument");
	cr_assert_eq(get_f32("w", got, 6), v + 1);
}

Test(routes, the_client_apply_value_returns_the_value_and_keeps_apply_minimal)
{
	struct dg_err err = { 0 };
	struct dg_client *c;
	struct dg_tensor *g, *val = NULL;
	struct dg_apply a = { .rule = "assign_add", .step = -1, .replica = -1 };
	struct dg_apply_result res = { 0 };
	struct dg_var_info info = { 0 };
	char address[64];
	uint64_t v = put_w();

	snprintf(address, sizeof address, "127.0.0.1:%d", port);
	cr_assert_not_null(c = dg_client_new(address, NULL, &err), "%s", err.msg);
	cr_assert_not_null(g = dg_tensor_new(DG_F32, &(struct dg_shape){ 2, { 2, 3 } }, &err));
	for (int i = 0; i < 6; i++)
		dg_tensor_set_f64(g, i, 10 * i);
	cr_assert_eq(dg_var_apply_value(c, "w", &a, g, &res, &val, &info, &err), DG_OK, "%s",
		     err.msg);
	cr_assert(res.applied);
	cr_assert_eq(res.version, v + 1);
	cr_assert_eq(info.version, v + 1);
	cr_assert_eq(info.dtype, DG_F32);
	cr_assert_not_null(val);
	cr_assert_eq(val->shape.ndim, 2);
	cr_assert_eq(val->shape.dim[1], 3);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(dg_tensor_get_f64(val, i), W0[i] + 10 * i, 0);
	dg_tensor_free(val);
	/* the plain apply still answers with the version alone */
	cr_assert_eq(dg_var_apply(c, "w", &a, g, &res, &err), DG_OK, "%s", err.msg);
	cr_assert(res.applied);
	cr_assert_eq(res.version, v + 2);
	/* sync: no value (the reply is the JSON), as dg_var_apply */
	a = (struct dg_apply){ .rule = "assign_add", .step = 0, .replicas = 2, .replica = 0 };
	cr_assert_eq(dg_var_apply_value(c, "w", &a, g, &res, &val, NULL, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_null(val);
	cr_assert(!res.applied);
	cr_assert_eq(res.pending, 1);
	/* a missing variable: the error, no value */
	a = (struct dg_apply){ .rule = "assign_add", .step = -1, .replica = -1 };
	cr_assert_eq(dg_var_apply_value(c, "nothing", &a, g, &res, &val, NULL, &err),
		     DG_ENOTFOUND);
	cr_assert_null(val);
	dg_tensor_free(g);
	dg_client_free(c);
}
