/* The HTTP client of dg, and the only libcurl code in dg: one easy handle per
 * client object, reused so requests share one kept-alive connection; request
 * bodies go from the caller's memory, responses into a dg_buf sized once from
 * Content-Length (or, on request, a dg_alloc_aligned block a tensor can adopt
 * without a copy). Transport failures and dg's JSON errors come back as
 * dg_status codes with the URL in the message. Two transfers go around
 * libcurl, on a connection of their own (http_socket.c), so that no byte is
 * copied through its buffer: a GET received into the caller's memory and a
 * PUT sent from it as it becomes final. The typed client (client.c), the
 * CLI, the mount and workers are built on it. */
#include "dg/http.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dg/log.h"
#include "dg/tensor.h"
#include "dg/wire.h"

#define CONNECT_TIMEOUT_MS 5000L
#define DEFAULT_TIMEOUT_MS 300000L
#define RECV_BUFFER ((long)512 << 10)   /* bytes per recv of a response body */
#define SEND_BUFFER ((long)2 << 20)     /* bytes per send of a request body (curl's max) */
#define ALIGNED_MIN ((size_t)64 << 10)  /* first block of an aligned body of unknown length */

struct dg_http_client {
	CURL *h;
	char *base;                     /* "http[s]://host:port", no trailing '/' */
	bool tls;                       /* https: verified against tls_ca (or the system's) */
	char *auth;                     /* "Authorization: Bearer TOKEN" or NULL */
	long timeout_ms;
	bool reused;                    /* the last request succeeded: a connection is open */
	/* State of the request in flight, for the callbacks. */
	struct dg_http_result *res;
	bool head;
	int code;                       /* status of the response being received */
	bool oom;                       /* a callback could not grow the body */
	bool into;                      /* dg_http_get_into: the body has a place of its own */
	int64_t clen;                   /* Content-Length of the response, -1 when absent */
	bool chunked;                   /* the response has a Transfer-Encoding */
	char errbuf[CURL_ERROR_SIZE];
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

/* TLS of this process's clients (dg_http_tls_ca): set once, before any
 * client exists (a command's start), read by every dg_http_client_new. */
static char tls_ca[4096];
static atomic_bool tls_on;

enum dg_status dg_http_tls_ca(const char *ca_file, struct dg_err *err)
{
	FILE *f;
	char text[65536];
	size_t n;

	if (!ca_file || !*ca_file || strlen(ca_file) >= sizeof tls_ca)
		return dg_err_set(err, DG_EINVAL, "the CA file name '%s' is empty or too long",
				  ca_file ? ca_file : "");
	f = fopen(ca_file, "r");
	if (!f)
		return dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO,
				  "cannot read the CA file '%s': %s", ca_file, strerror(errno));
	n = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[n] = '\0';
	if (!strstr(text, "-----BEGIN CERTIFICATE-----")) {
		dg_err_set(err, DG_EINVAL, "'%s' is not a PEM file of certificates", ca_file);
		dg_err_hint(err, "give the certificate (PEM) that signed the servers' "
			    "certificates, or a self-signed server certificate itself");
		return DG_EINVAL;
	}
	snprintf(tls_ca, sizeof tls_ca, "%s", ca_file);
	atomic_store(&tls_on, true);
	return DG_OK;
}

bool dg_http_tls_enabled(void)
{
	return atomic_load(&tls_on);
}

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

void dg_http_result_init(struct dg_http_result *r)
{
	memset(r, 0, sizeof *r);
	dg_buf_init(&r->body);
	r->dg_count = -1;
	r->dg_step = -1;
}

void dg_http_result_deinit(struct dg_http_result *r)
{
	dg_buf_deinit(&r->body);
	dg_free_aligned(r->aligned);
	dg_http_result_init(r);
}

void *dg_http_result_take_aligned(struct dg_http_result *r, size_t *len)
{
	void *p = r->aligned;

	*len = p ? r->aligned_len : 0;
	r->aligned = NULL;
	r->aligned_len = 0;
	r->aligned_cap = 0;
	return p;
}

/* Forget the previous response's headers; keep the body's memory. */
static void result_reset(struct dg_http_result *r)
{
	r->status = 0;
	r->body.len = 0;
	if (r->body.data)
		r->body.data[0] = '\0';
	r->content_type[0] = '\0';
	r->dg_dtype[0] = '\0';
	r->dg_shape[0] = '\0';
	r->dg_version = 0;
	r->dg_epoch = 0;
	r->content_range[0] = '\0';
	r->dg_count = -1;
	r->dg_step = -1;
	r->dg_lease = 0;
	r->sink_off = 0;
	r->aligned_len = 0;             /* the block itself is kept for the next body */
}

/* Make the aligned block hold at least n bytes, keeping its first
 * aligned_len bytes. false when out of memory (the old block stays). */
static bool aligned_reserve(struct dg_http_result *r, size_t n)
{
	if (r->aligned && r->aligned_cap >= n)
		return true;
	void *p = dg_alloc_aligned(n);
	if (!p)
		return false;
	if (r->aligned_len)
		memcpy(p, r->aligned, r->aligned_len);
	dg_free_aligned(r->aligned);
	r->aligned = p;
	r->aligned_cap = n;
	return true;
}

/* ------------------------------------------------------------- callbacks */

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
	struct dg_http_client *c = ud;

	if (c->res->sink) {
		long code = 0;
		curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
		if (code >= 200 && code < 300) {
			if (!c->res->sink(c->res->sink_ud, c->res->sink_off, p, size * n))
				return 0;       /* curl stops with CURLE_WRITE_ERROR */
			c->res->sink_off += size * n;
			return size * n;
		}
	}

	struct dg_http_result *r = c->res;
	if (r->aligned_body && c->code >= 200 && c->code < 300) {
		size_t len = size * n;
		if (len > SIZE_MAX / 4 - r->aligned_len) {
			c->oom = true;
			return 0;
		}
		size_t need = r->aligned_len + len;
		if (need > r->aligned_cap) {
			/* No (or a too small) Content-Length: grow geometrically. */
			size_t cap = r->aligned_cap * 2;
			if (cap < need)
				cap = need;
			if (cap < ALIGNED_MIN)
				cap = ALIGNED_MIN;
			if (!aligned_reserve(r, cap)) {
				c->oom = true;
				return 0;
			}
		}
		memcpy((char *)r->aligned + r->aligned_len, p, len);
		r->aligned_len = need;
		return len;
	}
	if (dg_buf_append(&c->res->body, p, size * n, NULL) != DG_OK) {
		c->oom = true;
		return 0;       /* curl stops with CURLE_WRITE_ERROR */
	}
	return size * n;
}

static void copy_field(char *dst, size_t cap, const char *v, size_t n)
{
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, v, n);
	dst[n] = '\0';
}

/* One header line "Name: value\r\n" (not NUL-terminated), or a status line. */
static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
	struct dg_http_client *c = ud;
	struct dg_http_result *r = c->res;
	size_t len = size * n;
	uint64_t u;

	/* A new status line (after a 100 Continue, say) starts a new response. */
	if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) {
		result_reset(r);
		/* "HTTP/1.1 200 OK": the status decides where the body goes. */
		const char *sp = memchr(p, ' ', len);
		c->code = 0;
		c->clen = -1;
		c->chunked = false;
		size_t i = sp ? (size_t)(sp - p) + 1 : len;
		for (size_t k = 0; i < len && k < 3 && p[i] >= '0' && p[i] <= '9'; i++, k++)
			c->code = c->code * 10 + (p[i] - '0');
		return len;
	}
	const char *colon = memchr(p, ':', len);
	if (!colon)
		return len;
	size_t nl = (size_t)(colon - p);
	const char *v = colon + 1;
	const char *e = p + len;
	while (v < e && (*v == ' ' || *v == '\t'))
		v++;
	while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t'))
		e--;
	size_t vl = (size_t)(e - v);
#define IS(name) (nl == sizeof name - 1 && strncasecmp(p, name, nl) == 0)
	if (IS("Content-Type")) {
		copy_field(r->content_type, sizeof r->content_type, v, vl);
	} else if (IS("Dg-Dtype")) {
		copy_field(r->dg_dtype, sizeof r->dg_dtype, v, vl);
	} else if (IS("Dg-Shape")) {
		copy_field(r->dg_shape, sizeof r->dg_shape, v, vl);
	} else if (IS("Content-Range")) {
		copy_field(r->content_range, sizeof r->content_range, v, vl);
	} else if (IS("Dg-Version")) {
		if (dg_wire_u64_parse(v, vl, &u))
			r->dg_version = u;
	} else if (IS("Dg-Epoch")) {
		if (dg_wire_u64_parse(v, vl, &u))
			r->dg_epoch = u;
	} else if (IS("Dg-Count")) {
		if (dg_wire_u64_parse(v, vl, &u) && u <= INT64_MAX)
			r->dg_count = (int64_t)u;
	} else if (IS("Dg-Step")) {
		if (dg_wire_u64_parse(v, vl, &u) && u <= INT64_MAX)
			r->dg_step = (int64_t)u;
	} else if (IS("Dg-Lease")) {
		if (dg_wire_u64_parse(v, vl, &u))
			r->dg_lease = u;
	} else if (IS("Transfer-Encoding")) {
		c->chunked = true;
	} else if (IS("Content-Length") && dg_wire_u64_parse(v, vl, &u) && u <= INT64_MAX) {
		/* Size the body once. A failed reservation is not an error here: the
		 * body callback grows the buffer as data arrives (and reports OOM).
		 * dg_http_get_into's 2xx body goes to a block of the caller's. */
		bool ok = c->code >= 200 && c->code < 300;
		bool aligned = r->aligned_body && !r->sink && ok;
		c->clen = (int64_t)u;
		if (!c->head && !(c->into && ok) && u < SIZE_MAX / 4) {
			if (aligned && u > 0)
				(void)aligned_reserve(r, (size_t)u);
			else if (!aligned && dg_buf_reserve(&r->body, (size_t)u, NULL) == DG_OK)
				r->body.data[r->body.len] = '\0';     /* reserve leaves it unset */
		}
	}
#undef IS
	return len;
}

/* --------------------------------------------------------------- objects */

struct dg_http_client *dg_http_client_new(const char *address, const char *token,
					  long timeout_ms, struct dg_err *err)
{
	struct dg_http_client *c;

	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK) {
		dg_err_set(err, DG_EINTERNAL, "cannot initialise libcurl: %s",
			   curl_easy_strerror(global_rc));
		return NULL;
	}
	if (!address || !*address || strpbrk(address, " \t\r\n")) {
		dg_err_set(err, DG_EINVAL, "server address '%s' is empty or has blanks",
			   address ? address : "");
		dg_err_hint(err, "write it as host:port, e.g. 127.0.0.1:2222");
		return NULL;
	}
	const char *rest = address;
	const char *sep = strstr(address, "://");
	/* host:port: https when this process uses TLS (dg_http_tls_ca) */
	bool tls = atomic_load(&tls_on);
	if (sep) {
		size_t sl = (size_t)(sep - address);
		if (!((sl == 4 && strncasecmp(address, "http", 4) == 0) ||
		      (sl == 5 && strncasecmp(address, "https", 5) == 0))) {
			dg_err_set(err, DG_EINVAL, "server address '%s': only http:// and https:// "
				   "are supported", address);
			dg_err_hint(err, "write it as host:port, http://host:port or "
				    "https://host:port");
			return NULL;
		}
		tls = sl == 5;
		rest = sep + 3;
	}
	size_t n = strlen(rest);
	while (n && rest[n - 1] == '/')
		n--;
	if (n == 0) {
		dg_err_set(err, DG_EINVAL, "server address '%s' has no host", address);
		return NULL;
	}
	if (token && strpbrk(token, "\r\n")) {
		dg_err_set(err, DG_EINVAL, "the bearer token contains a line break");
		dg_err_hint(err, "the token file should hold the token on one line");
		return NULL;
	}
	c = calloc(1, sizeof *c);
	if (!c)
		goto oom;
	c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
	c->base = malloc(n + 9);
	if (!c->base)
		goto oom;
	snprintf(c->base, n + 9, "%s://%.*s", tls ? "https" : "http", (int)n, rest);
	c->tls = tls;
	if (token) {
		size_t tl = strlen(token) + 32;
		c->auth = malloc(tl);
		if (!c->auth)
			goto oom;
		snprintf(c->auth, tl, "Authorization: Bearer %s", token);
	}
	c->h = curl_easy_init();
	if (!c->h)
		goto oom;
	/* Options that hold for every request of this handle. */
	curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c->h, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(c->h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(c->h, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS);
	curl_easy_setopt(c->h, CURLOPT_BUFFERSIZE, RECV_BUFFER);
	curl_easy_setopt(c->h, CURLOPT_UPLOAD_BUFFERSIZE, SEND_BUFFER);
	curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, c->errbuf);
	curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
	curl_easy_setopt(c->h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c->h, CURLOPT_HEADERDATA, c);
	/* Send the path as given: a client testing "/v1/vars/../x" means it. */
	curl_easy_setopt(c->h, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(c->h, CURLOPT_PROTOCOLS_STR, tls ? "https" : "http");
	if (tls && atomic_load(&tls_on))
		curl_easy_setopt(c->h, CURLOPT_CAINFO, tls_ca);
	curl_easy_setopt(c->h, CURLOPT_FOLLOWLOCATION, 0L);
	return c;
oom:
	dg_http_client_free(c);
	dg_err_set(err, DG_ENOMEM, "out of memory creating an HTTP client for %s", address);
	return NULL;
}

void dg_http_client_free(struct dg_http_client *c)
{
	if (!c)
		return;
	if (c->h)
		curl_easy_cleanup(c->h);
	free(c->base);
	free(c->auth);
	free(c);
}

const char *dg_http_client_url(const struct dg_http_client *c)
{
	return c->base;
}

void dg_http_client_set_timeout(struct dg_http_client *c, long timeout_ms)
{
	c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
}

/* -------------------------------------------------------------- requests */

static bool is_idempotent(const char *m)
{
	return strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0 || strcmp(m, "PUT") == 0 ||
	       strcmp(m, "DELETE") == 0;
}

static bool bad_header_text(const char *s)
{
	return strpbrk(s, "\r\n") != NULL;
}

/* The header list of one request: ours, then the caller's. */
static enum dg_status build_headers(struct dg_http_client *c, const struct dg_http_header *hs,
				    int n, bool has_body, struct curl_slist **out,
				    struct dg_err *err)
{
	struct curl_slist *l = NULL, *t;
	bool has_ct = false;
	char line[1024];

	/* "Expect:" removes curl's Expect: 100-continue on large bodies: a round
	 * trip per PUT for nothing (the server answers refusals before reading). */
	l = curl_slist_append(l, "Expect:");
	if (l && c->auth)
		l = (t = curl_slist_append(l, c->auth)) ? t : (curl_slist_free_all(l), NULL);
	for (int i = 0; l && i < n; i++) {
		const char *name = hs[i].name, *v = hs[i].value;
		if (!name || !*name || bad_header_text(name) || strchr(name, ':') ||
		    (v && bad_header_text(v))) {
			curl_slist_free_all(l);
			return dg_err_set(err, DG_EINVAL, "request header '%s' is empty or has a "
					  "line break", name ? name : "");
		}
		has_ct |= strcasecmp(name, "Content-Type") == 0;
		/* "Name;" sends an empty header, "Name:" removes one of curl's. */
		if (!v)
			snprintf(line, sizeof line, "%s:", name);
		else if (!*v)
			snprintf(line, sizeof line, "%s;", name);
		else if ((size_t)snprintf(line, sizeof line, "%s: %s", name, v) >= sizeof line) {
			curl_slist_free_all(l);
			return dg_err_set(err, DG_EINVAL, "request header '%s' is longer than %zu "
					  "bytes", name, sizeof line);
		}
		t = curl_slist_append(l, line);
		if (!t)
			curl_slist_free_all(l);
		l = t;
	}
	/* curl would label a body application/x-www-form-urlencoded. */
	if (l && has_body && !has_ct) {
		t = curl_slist_append(l, "Content-Type: application/octet-stream");
		if (!t)
			curl_slist_free_all(l);
		l = t;
	}
	if (!l)
		return dg_err_set(err, DG_ENOMEM, "out of memory building request headers");
	*out = l;
	return DG_OK;
}

static void set_method(CURL *h, const char *method, const void *body, size_t len)
{
	bool head = strcmp(method, "HEAD") == 0;
	bool with_body = body || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
			 strcmp(method, "PATCH") == 0;

	if (head) {
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (with_body) {
		/* The body is sent from the caller's memory (POSTFIELDS does not copy);
		 * the size goes first so binary data is not measured with strlen. */
		curl_easy_setopt(h, CURLOPT_NOBODY, 0L);
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? len : 0));
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, strcmp(method, "POST") ? method : NULL);
	} else {
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
		curl_easy_setopt(h, CURLOPT_NOBODY, 0L);
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, strcmp(method, "GET") ? method : NULL);
	}
}

/* A transport failure as a dg error naming the URL (err->peer set by
 * transport_error). */
static enum dg_status transport_error_text(struct dg_http_client *c, CURLcode rc,
					   const char *method, const char *url, struct dg_err *err)
{
	const char *why = c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc);
	long os_errno = 0;
	curl_off_t connect_us = 0;
	enum dg_status st;

	curl_easy_getinfo(c->h, CURLINFO_OS_ERRNO, &os_errno);
	curl_easy_getinfo(c->h, CURLINFO_CONNECT_TIME_T, &connect_us);
	switch (rc) {
	case CURLE_COULDNT_CONNECT:
		st = dg_err_set(err, DG_EUNAVAILABLE, "cannot reach %s: %s", c->base,
				os_errno ? strerror((int)os_errno) : why);
		dg_err_hint(err, "is a dg server running at that address? check the cluster spec "
			    "and start it with: dg server");
		return st;
	case CURLE_COULDNT_RESOLVE_HOST:
		st = dg_err_set(err, DG_EUNAVAILABLE, "cannot reach %s: %s", c->base, why);
		dg_err_hint(err, "check the host name in the address or the cluster spec");
		return st;
	case CURLE_OPERATION_TIMEDOUT:
		if (connect_us == 0) {
			/* Still connecting: the host is down or a firewall drops packets. */
			st = dg_err_set(err, DG_EUNAVAILABLE, "cannot reach %s: no connection "
					"within %ld ms", c->base, CONNECT_TIMEOUT_MS);
			dg_err_hint(err, "is the host up and the port open?");
			return st;
		}
		st = dg_err_set(err, DG_ETIMEOUT, "%s %s: no complete answer within %ld ms",
				method, url, c->timeout_ms);
		dg_err_hint(err, "the server is busy or stuck; retry, or allow a longer timeout");
		return st;
	case CURLE_WRITE_ERROR:
		if (c->oom)
			return dg_err_set(err, DG_ENOMEM, "%s %s: out of memory receiving the "
					  "response", method, url);
		break;
	case CURLE_OUT_OF_MEMORY:
		return dg_err_set(err, DG_ENOMEM, "%s %s: out of memory in libcurl", method, url);
	case CURLE_URL_MALFORMAT:
		return dg_err_set(err, DG_EINVAL, "%s %s: malformed URL: %s", method, url, why);
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_CONNECT_ERROR:
		st = dg_err_set(err, DG_EUNAVAILABLE, "%s %s: TLS failed: %s", method, url, why);
		dg_err_hint(err, "--ca must hold the certificate that signed the server's, which "
			    "must name this host (subjectAltName); without --tls-cert a server "
			    "speaks plain HTTP");
		return st;
	case CURLE_GOT_NOTHING:
	case CURLE_RECV_ERROR:
	case CURLE_WEIRD_SERVER_REPLY:
	case CURLE_UNSUPPORTED_PROTOCOL:
		if (c->tls)
			break;
		st = dg_err_set(err, DG_EUNAVAILABLE, "%s %s: %s", method, url, why);
		dg_err_hint(err, "if the server uses TLS (dg server --tls-cert), give --ca FILE "
			    "(or set DG_CA) to reach it over https");
		return st;
	default:
		break;
	}
	st = dg_err_set(err, DG_EUNAVAILABLE, "%s %s: %s", method, url, why);
	dg_err_hint(err, "the connection to the server failed; retry, and check that the "
		    "server is up (dg status)");
	return st;
}

/* A transport failure: the error, and the server as its peer when there is
 * no answer from it (refused, reset, no connection in time): it is down. A
 * server that accepted the request and is slow to answer (DG_ETIMEOUT) is
 * not named: it may be busy, and a retry would run the request twice. */
static enum dg_status transport_error(struct dg_http_client *c, CURLcode rc, const char *method,
				      const char *url, struct dg_err *err)
{
	enum dg_status st = transport_error_text(c, rc, method, url, err);

	if (st == DG_EUNAVAILABLE)
		dg_err_peer(err, c->base);
	return st;
}

/* A status for an HTTP error whose body is not a dg JSON error. */
static enum dg_status status_from_http(long http)
{
	switch (http) {
	case 400:
	case 416:
		return DG_EINVAL;
	case 401:
	case 403:
		return DG_EUNAUTHORIZED;
	case 404:
		return DG_ENOTFOUND;
	case 405:
	case 501:
		return DG_EUNSUPPORTED;
	case 408:
	case 504:
		return DG_ETIMEOUT;
	case 409:
	case 412:
		return DG_ECONFLICT;
	case 410:
		return DG_ECLOSED;
	case 413:
	case 414:
	case 431:
		return DG_ETOOLARGE;
	case 429:
	case 502:
	case 503:
		return DG_EUNAVAILABLE;
	case 507:
		return DG_ENOMEM;
	default:
		return DG_EINTERNAL;
	}
}

/* Turn an HTTP error response into err: dg's JSON error when the body is one,
 * else a code from the HTTP status and the first line of the body. */
static enum dg_status http_error(struct dg_http_result *res, const char *method,
				 const char *url, struct dg_err *err)
{
	json_t *j = NULL;
	const char *code = NULL, *msg = NULL, *hint = NULL;
	enum dg_status st;

	if (res->body.len)
		j = json_loadb(res->body.data, res->body.len, 0, NULL);
	if (j && json_unpack(json_object_get(j, "error"), "{s:s,s?s,s?s}", "code", &code,
			     "message", &msg, "hint", &hint) == 0) {
		const char *peer = json_string_value(json_object_get(json_object_get(j, "error"),
								     "peer"));
		st = dg_status_from_name(code);
		if (st == DG_OK)
			st = status_from_http(res->status);
		/* The server's message already names the object: pass it on as is. */
		dg_err_set(err, st, "%s", msg && *msg ? msg : code);
		if (hint && *hint)
			dg_err_hint(err, "%s", hint);
		if (peer && *peer)
			dg_err_peer(err, peer);     /* a server behind the one we asked */
		json_decref(j);
		return st;
	}
	json_decref(j);
	st = status_from_http(res->status);
	const char *b = res->body.data ? res->body.data : "";
	int first = 0;
	while ((size_t)first < res->body.len && first < 160 && b[first] != '\r' &&
	       b[first] != '\n')
		first++;
	if (first)
		dg_err_set(err, st, "%s %s: HTTP %d: %.*s", method, url, res->status, first, b);
	else
		dg_err_set(err, st, "%s %s: HTTP %d", method, url, res->status);
	return st;
}

enum dg_status dg_http_request(struct dg_http_client *c, const char *method, const char *path,
			       const struct dg_http_header *headers, int n_headers,
			       const void *body, size_t body_len, struct dg_http_result *res,
			       struct dg_err *err)
{
	struct curl_slist *hl = NULL;
	enum dg_status st;
	CURLcode rc;
	char *url;

	if (!c || !res || !method || !*method || strpbrk(method, " \t\r\n") || !path ||
	    path[0] != '/' || strpbrk(path, " \t\r\n") || n_headers < 0 ||
	    (n_headers && !headers) || (body_len && !body))
		return dg_err_set(err, DG_EINVAL, "bad HTTP request '%s %s'", method ? method : "",
				  path ? path : "");
	size_t ul = strlen(c->base) + strlen(path) + 1;
	url = malloc(ul);
	if (!url)
		return dg_err_set(err, DG_ENOMEM, "out of memory building a URL");
	snprintf(url, ul, "%s%s", c->base, path);
	st = build_headers(c, headers, n_headers, body || strcmp(method, "POST") == 0 ||
			   strcmp(method, "PUT") == 0 || strcmp(method, "PATCH") == 0, &hl, err);
	if (st != DG_OK)
		goto out;
	curl_easy_setopt(c->h, CURLOPT_URL, url);
	curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
	set_method(c->h, method, body, body_len);
	c->res = res;
	c->head = strcmp(method, "HEAD") == 0;
	for (int attempt = 0;; attempt++) {
		result_reset(res);
		c->code = 0;
		c->oom = false;
		c->errbuf[0] = '\0';
		rc = curl_easy_perform(c->h);
		if (rc == CURLE_OK)
			break;
		/* The server may close a kept-alive connection just as we reuse it
		 * (idle timeout, restart): retry once, for methods safe to repeat.
		 * (libcurl itself already resends once, for any method, when a reused
		 * connection dies before any byte of the answer: then the server
		 * cannot have seen the request. This covers resets and failed sends.) */
		bool dropped = rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR ||
			       rc == CURLE_GOT_NOTHING;
		if (attempt == 0 && dropped && c->reused && is_idempotent(method)) {
			dg_log(DG_LOG_DEBUG, "http", "%s %s: %s; retrying on a new connection",
			       method, url, c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
			c->reused = false;
			continue;
		}
		c->reused = false;
		st = transport_error(c, rc, method, url, err);
		goto out;
	}
	c->reused = true;
	long http = 0;
	curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &http);
	res->status = (int)http;
	if (http >= 400)
		st = http_error(res, method, url, err);
out:
	/* The handle keeps pointers to these: clear them before freeing. */
	curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, NULL);
	curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, NULL);
	c->res = NULL;
	curl_slist_free_all(hl);
	free(url);
	return st;
}

/* ------------------------------------- requests on a connection of their own */

/* dg_http_get_into and dg_http_put_from write their requests and read the
 * replies' heads themselves (libcurl would copy each body byte once more);
 * the header lines of a reply go through on_header as libcurl's do. */

#define INTO_HEAD_MAX ((size_t)16 << 10)        /* bytes of a reply's status line and headers */
#define INTO_RECV_MAX ((size_t)4 << 20)         /* bytes per recv(2) of a body */
#define INTO_ERR_MAX ((size_t)64 << 10)         /* bytes of a small (error) body kept */
#define FROM_SEND_MAX ((uint64_t)4 << 20)       /* bytes per send(2) of a body */

/* A connection of such a request: the socket, the caller's stop descriptor
 * (-1: none) and the wait for one send or receive. */
struct conn {
	int fd, stop_fd;
	long timeout_ms;
};

/* The request line, Host, Connection: close, Content-Length (clen >= 0),
 * the caller's headers and the token. */
static enum dg_status own_request(struct dg_http_client *c, const struct dg_http_addr *a,
				  const char *method, const char *path, int64_t clen,
				  const struct dg_http_header *hs, int nh, struct dg_buf *req,
				  struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(req, err, "%s %s HTTP/1.1\r\nHost: %s\r\n"
					  "Connection: close\r\n", method, path, a->authority);

	if (st == DG_OK && clen >= 0)
		st = dg_buf_printf(req, err, "Content-Length: %" PRId64 "\r\n", clen);
	for (int i = 0; st == DG_OK && i < nh; i++) {
		if (!hs[i].name || !*hs[i].name || bad_header_text(hs[i].name) ||
		    strchr(hs[i].name, ':') || !hs[i].value || bad_header_text(hs[i].value))
			return dg_err_set(err, DG_EINVAL, "bad HTTP header '%s'",
					  hs[i].name ? hs[i].name : "");
		st = dg_buf_printf(req, err, "%s: %s\r\n", hs[i].name, hs[i].value);
	}
	if (st == DG_OK && c->auth)
		st = dg_buf_printf(req, err, "%s\r\n", c->auth);
	return st == DG_OK ? dg_buf_append(req, "\r\n", 2, err) : st;
}

/* The status line and headers, read into head (NUL-terminated) until the
 * blank line; *end points at its "\r\n\r\n". 0, or an errno (EMSGSIZE when
 * the head does not fit). */
static int read_head(const struct conn *k, char *head, size_t *len, char **end)
{
	int e = 0;

	*end = NULL;
	while (!*end) {
		if (*len >= INTO_HEAD_MAX)
			return EMSGSIZE;
		ssize_t n = dg_http_recv_some(k->fd, head + *len, INTO_HEAD_MAX - *len, k->stop_fd,
					      k->timeout_ms, &e);
		if (n < 0)
			return e;
		*len += (size_t)n;
		head[*len] = '\0';
		*end = strstr(head, "\r\n\r\n");
	}
	return 0;
}

/* The head's lines into res, as libcurl hands them to on_header: c->code,
 * c->clen and c->chunked describe the reply afterwards. */
static void parse_head(struct dg_http_client *c, struct dg_http_result *res, char *head,
		       const char *end)
{
	c->res = res;
	c->into = true;
	c->head = false;
	c->code = 0;
	c->clen = -1;
	c->chunked = false;
	result_reset(res);
	for (char *line = head; line < end + 2; line = strstr(line, "\r\n") + 2)
		on_header(line, 1, (size_t)(strstr(line, "\r\n") + 2 - line), c);
	c->into = false;
	c->res = NULL;
	res->status = c->code;
}

/* The body of a 2xx reply of clen bytes, have of which came with the head,
 * into the block into->begin gives. */
static enum dg_status into_body(const struct conn *k, const struct dg_http_into *into, void *ud,
				struct dg_http_result *res, uint64_t clen, const char *first,
				size_t have, bool *delivered, int *e, struct dg_err *err)
{
	char *dst = into->begin(ud, res, clen);

	*delivered = true;
	if (!dst)
		return dg_err_set(err, DG_ECANCELED, "the receiver went away");
	memcpy(dst, first, have);
	for (uint64_t got = have;;) {
		if (!into->progress(ud, got))
			return dg_err_set(err, DG_ECANCELED, "the receiver went away");
		if (got == clen)
			return DG_OK;
		size_t want = clen - got < INTO_RECV_MAX ? (size_t)(clen - got) : INTO_RECV_MAX;
		ssize_t n = dg_http_recv_some(k->fd, dst + got, want, k->stop_fd, k->timeout_ms, e);
		if (n < 0)
			return DG_EIO;          /* *e says why */
		got += (uint64_t)n;
	}
}

/* A small body (an error's, a PUT's JSON), up to INTO_ERR_MAX bytes, have of
 * which came with the head, into res->body. */
static void small_body(const struct conn *k, struct dg_http_result *res, int64_t clen,
		       const char *first, size_t have)
{
	char chunk[4096];
	int e;

	dg_buf_append(&res->body, first, have, NULL);
	while (res->body.len < INTO_ERR_MAX && (clen < 0 || res->body.len < (uint64_t)clen)) {
		ssize_t n = dg_http_recv_some(k->fd, chunk, sizeof chunk, k->stop_fd, k->timeout_ms,
					      &e);
		if (n < 0 || dg_buf_append(&res->body, chunk, (size_t)n, NULL) != DG_OK)
			break;
	}
}

/* The socket timeouts of a connection of its own: the client's timeout. */
static long io_timeout_s(const struct dg_http_client *c)
{
	return c->timeout_ms > 1000 ? c->timeout_ms / 1000 : 1;
}

enum dg_status dg_http_get_into(struct dg_http_client *c, const char *path,
				const struct dg_http_header *headers, int n_headers,
				const struct dg_http_into *into, void *ud,
				struct dg_http_result *res, bool *delivered, struct dg_err *err)
{
	struct dg_http_addr a = { 0 };
	struct dg_buf req = { 0 }, url = { 0 };
	const char *what = "send the request";
	char *head = NULL, *end = NULL;
	size_t len = 0;
	struct conn k = { .fd = -1, .stop_fd = -1 };
	int e = 0;
	enum dg_status st;

	*delivered = false;
	if (!c || !res || !into || !path || path[0] != '/' || strpbrk(path, " \t\r\n") ||
	    n_headers < 0 || (n_headers && !headers))
		return dg_err_set(err, DG_EINVAL, "bad HTTP request 'GET %s'", path ? path : "");
	if (c->tls)     /* the caller falls back to a GET through libcurl */
		return dg_err_set(err, DG_EUNSUPPORTED, "GET %s%s: a body is received in place "
				  "only over plain HTTP", c->base, path);
	st = dg_buf_printf(&url, err, "%s%s", c->base, path);
	if (st == DG_OK)
		st = dg_http_addr_parse(c->base, &a, err);
	if (st == DG_OK)
		st = own_request(c, &a, "GET", path, -1, headers, n_headers, &req, err);
	if (st == DG_OK && !(head = malloc(INTO_HEAD_MAX + 1)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory for the reply to GET %s", url.data);
	if (st != DG_OK)
		goto out;
	k.timeout_ms = c->timeout_ms;
	k.fd = dg_http_connect(&a, io_timeout_s(c), into->stop, ud, &what, &e);
	if (k.fd < 0 || !dg_http_send_all(k.fd, req.data, req.len, -1, 0, &e))
		goto fail;
	what = "read the reply";
	if ((e = read_head(&k, head, &len, &end)) == EMSGSIZE) {
		st = dg_err_set(err, DG_EUNSUPPORTED, "GET %s: reply headers over %zu bytes", url.data,
				INTO_HEAD_MAX);
		goto out;
	} else if (e) {
		goto fail;
	}
	parse_head(c, res, head, end);
	const char *first = end + 4;
	size_t have = len - (size_t)(first - head);
	if (c->code >= 200 && c->code < 300 && c->clen >= 0 && !c->chunked &&
	    have <= (uint64_t)c->clen) {
		st = into_body(&k, into, ud, res, (uint64_t)c->clen, first, have, delivered, &e, err);
		if (st == DG_EIO)
			goto fail;
	} else if (c->code >= 400 && !c->chunked) {
		small_body(&k, res, c->clen, first, have);
		st = http_error(res, "GET", url.data, err);
	} else {
		st = dg_err_set(err, DG_EUNSUPPORTED, "GET %s: HTTP %d%s is not received in place",
				url.data, c->code, c->chunked ? " (chunked)" : "");
	}
	goto out;
fail:
	st = dg_err_set(err, e == ETIMEDOUT ? DG_ETIMEOUT : e == ECANCELED ? DG_ECANCELED : DG_EIO,
			"cannot %s for GET %s: %s", what, url.data ? url.data : path, strerror(e));
out:
	if (k.fd >= 0)
		close(k.fd);
	free(head);
	dg_buf_deinit(&req);
	dg_buf_deinit(&url);
	dg_http_addr_free(&a);
	return st;
}

/* ------------------------------------------ PUT from the caller's memory */

/* The body of dg_http_put_from: send(2) straight from body as from->more
 * declares its bytes final. 0, or an errno (ECANCELED: the caller gave up). */
static int from_body(const struct conn *k, const char *body, uint64_t len,
		     const struct dg_http_from *from, void *ud, uint64_t *sent)
{
	uint64_t avail = 0;
	int e = 0;

	while (*sent < len) {
		if (*sent >= avail) {
			avail = from->more(ud, *sent);
			if (avail <= *sent)
				return ECANCELED;
			if (avail > len)
				avail = len;
		}
		uint64_t n = avail - *sent < FROM_SEND_MAX ? avail - *sent : FROM_SEND_MAX;
		ssize_t m = dg_http_send_some(k->fd, body + *sent, (size_t)n, k->stop_fd,
					      k->timeout_ms, &e);
		if (m < 0)
			return e;
		*sent += (uint64_t)m;
	}
	return 0;
}

/* The reply of dg_http_put_from: its head into res, then a small body. 0, or
 * an errno (EPROTO: not an HTTP reply). */
static int from_reply(struct dg_http_client *c, const struct conn *k, char *head,
		      struct dg_http_result *res)
{
	char *end = NULL;
	size_t len = 0;
	int e = read_head(k, head, &len, &end);

	if (e)
		return e;
	parse_head(c, res, head, end);
	if (c->code < 100)
		return EPROTO;
	const char *first = end + 4;
	small_body(k, res, c->chunked ? -1 : c->clen, first, len - (size_t)(first - head));
	return 0;
}

/* dg_http_put_from over TLS: libcurl sends the body from body as from->more
 * declares it final (its read callback), since the plain-socket path cannot
 * speak TLS. The same contract, one copy more (into libcurl's buffer). */
struct from_rd {
	const char *body;
	uint64_t len, *sent;
	const struct dg_http_from *from;
	void *ud;
	bool canceled;
};

static size_t from_read(char *buf, size_t size, size_t n, void *p)
{
	struct from_rd *r = p;
	uint64_t avail;
	size_t k;

	if (*r->sent >= r->len)
		return 0;
	avail = r->from->more(r->ud, *r->sent);
	if (avail > r->len)
		avail = r->len;
	if (avail <= *r->sent) {
		r->canceled = true;
		return CURL_READFUNC_ABORT;
	}
	k = avail - *r->sent < size * n ? (size_t)(avail - *r->sent) : size * n;
	memcpy(buf, r->body + *r->sent, k);
	*r->sent += k;
	return k;
}

/* libcurl's progress callback: the caller gave up (from->stop) */
static int from_progress(void *p, curl_off_t dlt, curl_off_t dln, curl_off_t ult, curl_off_t uln)
{
	struct from_rd *r = p;

	(void)dlt;
	(void)dln;
	(void)ult;
	(void)uln;
	if (r->from->stop && r->from->stop(r->ud)) {
		r->canceled = true;
		return 1;
	}
	return 0;
}

static enum dg_status put_from_tls(struct dg_http_client *c, const char *path,
				   const struct dg_http_header *headers, int n_headers,
				   const void *body, uint64_t len, const struct dg_http_from *from,
				   void *ud, struct dg_http_result *res, uint64_t *sent,
				   struct dg_err *err)
{
	struct from_rd r = { .body = body, .len = len, .sent = sent, .from = from, .ud = ud };
	struct curl_slist *hl = NULL;
	struct dg_buf url = { 0 };
	enum dg_status st = dg_buf_printf(&url, err, "%s%s", c->base, path);
	CURLcode rc;

	if (st == DG_OK)
		st = build_headers(c, headers, n_headers, true, &hl, err);
	if (st != DG_OK)
		goto out;
	curl_easy_setopt(c->h, CURLOPT_URL, url.data);
	curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, hl);
	/* the handle keeps the last request's method: a DELETE or PATCH before
	 * would turn this upload into one */
	curl_easy_setopt(c->h, CURLOPT_CUSTOMREQUEST, NULL);
	curl_easy_setopt(c->h, CURLOPT_NOBODY, 0L);
	curl_easy_setopt(c->h, CURLOPT_UPLOAD, 1L);
	curl_easy_setopt(c->h, CURLOPT_READFUNCTION, from_read);
	curl_easy_setopt(c->h, CURLOPT_READDATA, &r);
	curl_easy_setopt(c->h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
	curl_easy_setopt(c->h, CURLOPT_XFERINFOFUNCTION, from_progress);
	curl_easy_setopt(c->h, CURLOPT_XFERINFODATA, &r);
	curl_easy_setopt(c->h, CURLOPT_NOPROGRESS, 0L);
	/* a writer may take its time: bound stalls, not the whole upload */
	curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, 0L);
	curl_easy_setopt(c->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(c->h, CURLOPT_LOW_SPEED_TIME, io_timeout_s(c));
	c->res = res;
	c->head = false;
	c->code = 0;
	c->oom = false;
	c->errbuf[0] = '\0';
	rc = curl_easy_perform(c->h);
	c->reused = rc == CURLE_OK;
	if ((rc == CURLE_ABORTED_BY_CALLBACK || rc == CURLE_READ_ERROR) && r.canceled) {
		st = dg_err_set(err, DG_ECANCELED, "PUT %s: the writer gave up", url.data);
	} else if (rc != CURLE_OK) {
		st = transport_error(c, rc, "PUT", url.data, err);
	} else {
		long http = 0;
		curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &http);
		res->status = (int)http;
		if (http >= 400)
			st = http_error(res, "PUT", url.data, err);
	}
	curl_easy_setopt(c->h, CURLOPT_UPLOAD, 0L);
	curl_easy_setopt(c->h, CURLOPT_NOPROGRESS, 1L);
	curl_easy_setopt(c->h, CURLOPT_XFERINFOFUNCTION, NULL);
	curl_easy_setopt(c->h, CURLOPT_READFUNCTION, NULL);
	curl_easy_setopt(c->h, CURLOPT_READDATA, NULL);
	curl_easy_setopt(c->h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)-1);
	curl_easy_setopt(c->h, CURLOPT_LOW_SPEED_LIMIT, 0L);
	curl_easy_setopt(c->h, CURLOPT_LOW_SPEED_TIME, 0L);
	curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, NULL);
	c->res = NULL;
out:
	curl_slist_free_all(hl);
	dg_buf_deinit(&url);
	return st;
}

enum dg_status dg_http_put_from(struct dg_http_client *c, const char *path,
				const struct dg_http_header *headers, int n_headers,
				const void *body, uint64_t len, const struct dg_http_from *from,
				void *ud, struct dg_http_result *res, uint64_t *sent,
				struct dg_err *err)
{
	struct dg_http_addr a = { 0 };
	struct dg_buf req = { 0 }, url = { 0 };
	const char *what = "send the request";
	char *head = NULL;
	struct conn k = { .fd = -1, .stop_fd = from ? from->stop_fd : -1 };
	int e = 0;
	enum dg_status st;

	*sent = 0;
	if (!c || !res || !from || !from->more || !path || path[0] != '/' ||
	    strpbrk(path, " \t\r\n") || n_headers < 0 || (n_headers && !headers) ||
	    (len && !body) || len > INT64_MAX)
		return dg_err_set(err, DG_EINVAL, "bad HTTP request 'PUT %s'", path ? path : "");
	result_reset(res);
	if (c->tls)
		return put_from_tls(c, path, headers, n_headers, body, len, from, ud, res, sent,
				    err);
	st = dg_buf_printf(&url, err, "%s%s", c->base, path);
	if (st == DG_OK)
		st = dg_http_addr_parse(c->base, &a, err);
	if (st == DG_OK)
		st = own_request(c, &a, "PUT", path, (int64_t)len, headers, n_headers, &req, err);
	if (st == DG_OK && !(head = malloc(INTO_HEAD_MAX + 1)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory for the reply to PUT %s", url.data);
	if (st != DG_OK)
		goto out;
	k.timeout_ms = c->timeout_ms;
	k.fd = dg_http_connect(&a, io_timeout_s(c), from->stop, ud, &what, &e);
	if (k.fd < 0)
		goto fail;
	if (dg_http_send_all(k.fd, req.data, req.len, k.stop_fd, k.timeout_ms, &e)) {
		what = "send the body";
		e = from_body(&k, body, len, from, ud, sent);
	}
	if (e == EPIPE || e == ECONNRESET) {
		/* a server that answered early (and closed) says why */
		if (from_reply(c, &k, head, res) == 0 && res->status >= 400)
			st = http_error(res, "PUT", url.data, err);
		else
			res->status = 0;        /* no answer to this body */
		if (st != DG_OK)
			goto out;
	}
	if (e)
		goto fail;
	what = "read the reply";
	if ((e = from_reply(c, &k, head, res)) != 0) {
		res->status = 0;
		goto fail;
	}
	if (res->status >= 400)
		st = http_error(res, "PUT", url.data, err);
	goto out;
fail:
	st = dg_err_set(err, e == ETIMEDOUT ? DG_ETIMEOUT : e == ECANCELED ? DG_ECANCELED
			: DG_EUNAVAILABLE, "cannot %s for PUT %s: %s", what,
			url.data ? url.data : path, strerror(e));
out:
	if (k.fd >= 0)
		close(k.fd);
	free(head);
	dg_buf_deinit(&req);
	dg_buf_deinit(&url);
	dg_http_addr_free(&a);
	return st;
}

enum dg_status dg_http_escape_path(const char *name, struct dg_buf *out, struct dg_err *err)
{
	static const char hex[] = "0123456789ABCDEF";
	enum dg_status st = DG_OK;

	if (!name)
		return dg_err_set(err, DG_EINVAL, "no name to escape");
	for (const unsigned char *p = (const unsigned char *)name; *p && st == DG_OK; p++) {
		unsigned char ch = *p;
		bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
			    (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
			    ch == '~' || ch == '/';
		if (keep) {
			st = dg_buf_append(out, p, 1, err);
		} else {
			char e[3] = { '%', hex[ch >> 4], hex[ch & 15] };
			st = dg_buf_append(out, e, 3, err);
		}
	}
	return st;
}
