/* The HTTP server of every dg process, and the only libmicrohttpd code in dg:
 * one daemon with a thread per connection, one access callback that checks the
 * limits and the token, matches the route table, collects the upload in one
 * aligned block, runs the handler and turns its status into a JSON error, and
 * the metrics of every request. Handlers (ps/routes.c, worker/) never see MHD.
 *
 * Routing. A request is matched against the table in order and the first route
 * whose pattern and method both match wins, so a table lists specific routes
 * before general ones: "/v1/vars/{name...}/apply" before "/v1/vars/{name...}".
 * A literal suffix after {name...} is matched from the right, so the apply
 * route takes POST /v1/vars/a/b/apply with name "a/b", while GET of the same
 * path falls through to the general route with name "a/b/apply". The path is
 * percent-decoded before matching (%2F is a '/'); %00 and malformed escapes
 * are refused with 400. HEAD uses a "HEAD" route when one matches, else the
 * "GET" route: the response then carries the body's Content-Length, no body.
 * A path that no pattern matches gets 404; one that matches only with other
 * methods gets 405 with an Allow header.
 *
 * Refusals. Before any handler runs, a request is checked for, in order: the
 * connection limit (429), the header size (431), a Host header in HTTP/1.1
 * (400), the token (401), the path (400), the route (404/405) and the declared
 * body size (413); each answer is
 * a JSON error naming what failed. A refused request that announces a body is
 * answered from its headers alone, without reading the body, and its
 * connection is closed; the others keep their connection.
 *
 * Slow clients. libmicrohttpd's timeout (request_timeout_s) is an idle time:
 * every byte received restarts it, so a client that trickles one header byte
 * a second holds its connection, and its thread, for as long as it likes.
 * libmicrohttpd has no total read time, so this file keeps one: a reaper
 * thread shuts down the socket of a connection whose request is not read in
 * time: headers within read_timeout of the connection's start (or of the
 * request line, on a kept-alive connection), a body within read_timeout plus
 * one second per BODY_MIN_RATE bytes it brings. A handler's own time and the
 * answer's are not limited (long polls); between requests the idle time
 * applies, counted from the last answer. A client address may hold at most
 * per_client connections, so one slow or greedy client cannot take every
 * connection: past it, a few more are accepted to be answered 429 in JSON,
 * and beyond those libmicrohttpd's accept policy refuses them at once.
 *
 * Shutdown. dg_http_server_free stops the daemon, which waits for every
 * connection thread, so a handler blocked in a long poll or a queue wait delays
 * it: the owner (ps/server.c) closes its store and queues first, which wakes
 * such handlers, and every wait has a bounded timeout besides. */
#include "dg/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"
#include "dg/log.h"
#include "dg/tensor.h"
#include "dg_config.h"

#define MAX_PARAMS 8                    /* {name} parameters per pattern */
#define MAX_PATTERN_SEGS 32
#define N_BUCKETS 10
#define LISTEN_BACKLOG 511
#define CHUNKED_INITIAL ((size_t)64 << 10)      /* bytes; first block of a chunked upload */
#define DEFAULT_MAX_BODY ((size_t)2 << 30)      /* bytes */
#define DEFAULT_MAX_HEADER ((size_t)16 << 10)   /* bytes */
#define DEFAULT_MAX_CONNECTIONS 256
#define DEFAULT_TIMEOUT_S 300u                  /* seconds a connection may sit idle */
#define SPARE_CONNECTIONS 16            /* accepted past the limit to be told so in JSON */
#define DEFAULT_PER_CLIENT 128          /* connections from one client address */
#define SPARE_PER_CLIENT 4              /* accepted past it to be told so in JSON */
#define DEFAULT_READ_TIMEOUT_S 20u      /* seconds to read a request's headers */
#define BODY_MIN_RATE ((uint64_t)64 << 10)      /* bytes/s a body earns time at */
#define REAPER_TICK_NS 1000000000LL     /* the reaper looks at least this often */
/* A connection's memory pool is the header limit plus POOL_ROOM (40 KiB at the
 * default limit). libmicrohttpd 0.9.75 zeroes the whole pool after every request
 * (MHD_pool_reset, for a kept-alive connection) and, once a request is read,
 * the unused part of its read buffer, which starts at half the pool
 * (MHD_pool_reallocate shrinking it): about 1.5 pools of memset per request,
 * whatever its size. The room covers the request line, the headers' records
 * (~64 bytes each: ~450 short headers fill the pool), the response headers,
 * and headers up to ~20 KiB past the limit, which begin() still refuses with a
 * JSON 431 (MHD answers larger ones itself, without JSON). A 2 * limit + 32 KiB
 * pool (64 KiB) zeroed 96 KiB per request. */
#define POOL_ROOM ((size_t)24 << 10)
/* MHD tries to grow the read buffer before a read when less than the
 * increment is free in it; growing takes 1/8 of the pool's free space while
 * more than 8 KiB is free. An increment of the whole pool makes every read
 * try, so an upload is read in recv()s of ~pool - 8 KiB (32 KiB at the
 * default) instead of half the pool (20 KiB: 60% more recv()s per byte). */
#define READ_INCREMENT(pool) (pool)

/* Upper bounds (seconds) of the latency histogram; +Inf follows. */
static const double bucket_le[N_BUCKETS] = {
	0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5,
};

/* One segment of a compiled pattern. */
struct seg {
	const char *s;          /* points into the route's pattern: literal text or param name */
	size_t len;
	enum { SEG_LIT, SEG_PARAM, SEG_REST } kind;
};

struct pattern {
	struct seg segs[MAX_PATTERN_SEGS];
	int n_segs;
	int rest;               /* index of the {name...} segment, -1 when none */
};

/* Requests answered with one status code, by method. */
struct code_count {
	char method[8];
	int code;
	uint64_t n;
};

/* Per route (and one extra slot for requests no route took). Guarded by mu. */
struct route_stats {
	uint64_t buckets[N_BUCKETS + 1];        /* not cumulative; the last is +Inf */
	double sum;                             /* seconds */
	uint64_t count;
	struct code_count *codes;
	int n_codes, cap_codes;
};

/* An open connection as the reaper sees it. Guarded by the server's conn_mu;
 * it is MHD's socket context of the connection. */
struct conn_track {
	struct conn_track *prev, *next;
	int fd;                         /* MHD's socket: shut down when the deadline passes */
	struct sockaddr_storage addr;   /* the client's address (the port is ignored) */
	int64_t deadline_ns;            /* the request must be read by then; 0: no deadline */
	int64_t body_t0;                /* a chunked body's start: its time grows with its bytes */
	uint64_t body_bytes;
	bool over_client;               /* accepted past the per-client limit: answered 429 */
	bool cut;                       /* shut down by the reaper */
};

struct dg_http_server {
	struct MHD_Daemon *mhd;
	int listen_fd;                  /* closed by MHD_stop_daemon */
	int listen_dup;                 /* a duplicate, held only while MHD starts */
	int port;
	bool v6;                        /* listening on an IPv6 address */
	bool tls;                       /* HTTPS (MHD_USE_TLS) */
	char addr[80];                  /* "127.0.0.1:2222" for messages */
	char name[64];                  /* log prefix, e.g. "ps/0" */
	struct dg_route *routes;        /* owned: every group's routes, in group order */
	void **route_ctx;               /* owned: n_routes entries, each route's group ctx */
	int n_routes;
	struct pattern *pats;           /* n_routes compiled patterns */
	char *auth;                     /* "Bearer TOKEN", or NULL when no token is set */
	size_t auth_len;
	size_t max_body, max_header;    /* bytes */
	unsigned max_conns;             /* open connections served; more get 429 */
	unsigned per_client;            /* open connections from one address; more get 429 */
	int64_t read_timeout_ns;        /* headers; a body's base time */
	int64_t idle_timeout_ns;        /* between requests of a kept-alive connection */
	char epoch[24];                 /* Dg-Epoch value */
	pthread_mutex_t mu;
	struct route_stats *stats;      /* n_routes + 1; the last: no route */
	atomic_uint_fast64_t bytes_in, bytes_out, connections, aborted;
	atomic_int open_conns;
	/* The reaper (see "Slow clients" above): every open connection and the
	 * time by which its request must be read, guarded by conn_mu. */
	pthread_mutex_t conn_mu;
	pthread_cond_t conn_cv;
	struct conn_track *conns;       /* list of open connections */
	pthread_t reaper;
	bool reaper_started, reaper_stop;
	uint64_t timed_out, refused_client;     /* guarded by conn_mu */
};

struct param {
	const char *name;               /* points into the pattern */
	size_t name_len;
	const char *value;              /* points into req->pbuf */
};

struct dg_http_req {
	struct dg_http_server *srv;
	struct MHD_Connection *conn;
	char *uri;                      /* raw request target, owned */
	char *path;                     /* decoded path, owned */
	const char *method;             /* MHD's, valid for the request */
	const char *version;            /* "HTTP/1.1", MHD's, valid for the request */
	int route;                      /* index into the table, -1 before routing */
	struct param params[MAX_PARAMS];
	int n_params;
	char *pbuf;                     /* storage of parameter values, owned */
	char *body;                     /* dg_alloc_aligned block, owned unless taken */
	size_t len, cap;                /* bytes received / allocated */
	bool sized;                     /* Content-Length known: cap is exactly that */
	bool started;                   /* the first access-handler call happened */
	bool queued;                    /* a response is queued */
	bool head;                      /* HEAD request: no body is sent */
	bool close;                     /* close the connection after the answer */
	/* A refusal decided by the server layer on the first call. */
	bool refused;
	int refuse_http;
	struct dg_err refuse;
	char allow[64];                 /* Allow header for 405 */
	size_t discarded;               /* body bytes dropped after a refusal mid-upload */
	int status;                     /* HTTP status queued */
	uint64_t sent;                  /* body bytes queued */
	int64_t t0;                     /* dg_mono_ns at the first call */
	struct conn_track *track;       /* the connection's, or NULL */
};

struct hdr {
	char *name, *value;
};

struct dg_http_resp {
	int status;
	struct hdr *hdrs;
	int n_hdrs, cap_hdrs;
	struct dg_buf buf;
	bool has_buf;
	char ctype[128];
	const void *ref;
	size_t ref_len;
	void (*release)(void *ud);
	void *ud;
	bool has_ref;
	enum dg_status fail;            /* a helper could not allocate: answer DG_ENOMEM */
};

/* ------------------------------------------------------------ request API */

const char *dg_http_method(const struct dg_http_req *r)
{
	return r->method;
}

const char *dg_http_path(const struct dg_http_req *r)
{
	return r->path;
}

const char *dg_http_header(const struct dg_http_req *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *dg_http_query(const struct dg_http_req *r, const char *key)
{
	const char *v = NULL;
	size_t vlen = 0;

	if (!key)
		return NULL;
	/* The _n variant tells "?flag" (found, no value) from a missing key. */
	if (MHD_lookup_connection_value_n(r->conn, MHD_GET_ARGUMENT_KIND, key, strlen(key), &v,
					  &vlen) != MHD_YES)
		return NULL;
	return v ? v : "";
}

const char *dg_http_param(const struct dg_http_req *r, const char *name)
{
	size_t n = strlen(name);

	for (int i = 0; i < r->n_params; i++)
		if (r->params[i].name_len == n && memcmp(r->params[i].name, name, n) == 0)
			return r->params[i].value;
	return NULL;
}

const void *dg_http_body(const struct dg_http_req *r, size_t *len)
{
	if (len)
		*len = r->body ? r->len : 0;
	return r->body && r->len ? r->body : NULL;
}

void *dg_http_body_take(struct dg_http_req *r, size_t *len)
{
	void *p = r->body;

	if (len)
		*len = p ? r->len : 0;
	r->body = NULL;
	r->len = r->cap = 0;
	return p;
}

enum dg_status dg_http_query_int(const struct dg_http_req *r, const char *key, int64_t def,
				 int64_t *out, struct dg_err *err)
{
	const char *v = dg_http_query(r, key);
	char *end;

	if (!v) {
		*out = def;
		return DG_OK;
	}
	/* strtoll alone accepts leading blanks, "+" and trailing junk: insist on
	 * [-]digits and nothing else. */
	const char *d = v[0] == '-' ? v + 1 : v;
	if (*d < '0' || *d > '9')
		goto bad;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (*end != '\0')
		goto bad;
	if (errno == ERANGE) {
		dg_err_set(err, DG_EINVAL, "query parameter '%s' is out of range: '%.64s'", key, v);
		dg_err_hint(err, "use an integer between %" PRId64 " and %" PRId64, INT64_MIN,
			    INT64_MAX);
		return DG_EINVAL;
	}
	*out = (int64_t)x;
	return DG_OK;
bad:
	dg_err_set(err, DG_EINVAL, "query parameter '%s' must be an integer, got '%.64s'", key, v);
	dg_err_hint(err, "write it as decimal digits, e.g. ?%s=%" PRId64, key, def);
	return DG_EINVAL;
}

enum dg_status dg_http_query_double(const struct dg_http_req *r, const char *key, double def,
				    double *out, struct dg_err *err)
{
	const char *v = dg_http_query(r, key);
	char *end;

	if (!v) {
		*out = def;
		return DG_OK;
	}
	/* strtod skips leading blanks and accepts "nan"/"inf": refuse both, and
	 * overflow, so a typo never becomes a learning rate of infinity. */
	const char *d = (v[0] == '-' || v[0] == '+') ? v + 1 : v;
	if (!((*d >= '0' && *d <= '9') || *d == '.'))
		goto bad;
	errno = 0;
	double x = strtod(v, &end);
	if (*end != '\0' || end == v)
		goto bad;
	if (errno == ERANGE && (x > 1.0 || x < -1.0)) {
		dg_err_set(err, DG_EINVAL, "query parameter '%s' is out of range: '%.64s'", key, v);
		dg_err_hint(err, "use a finite number");
		return DG_EINVAL;
	}
	*out = x;
	return DG_OK;
bad:
	dg_err_set(err, DG_EINVAL, "query parameter '%s' must be a number, got '%.64s'", key, v);
	dg_err_hint(err, "write it as a decimal number, e.g. ?%s=0.01", key);
	return DG_EINVAL;
}

/* ----------------------------------------------------------- response API */

/* Drop whatever body the response holds (the ref's release runs now). */
static void resp_drop_body(struct dg_http_resp *w)
{
	dg_buf_deinit(&w->buf);
	w->has_buf = false;
	if (w->has_ref && w->release)
		w->release(w->ud);
	w->has_ref = false;
	w->ref = NULL;
	w->ref_len = 0;
	w->release = NULL;
}

static void resp_deinit(struct dg_http_resp *w)
{
	resp_drop_body(w);
	for (int i = 0; i < w->n_hdrs; i++) {
		free(w->hdrs[i].name);
		free(w->hdrs[i].value);
	}
	free(w->hdrs);
	w->hdrs = NULL;
	w->n_hdrs = w->cap_hdrs = 0;
}

static void set_ctype(struct dg_http_resp *w, const char *content_type)
{
	snprintf(w->ctype, sizeof w->ctype, "%s", content_type ? content_type : "");
}

void dg_http_set_status(struct dg_http_resp *w, int status)
{
	w->status = status;
}

void dg_http_add_header(struct dg_http_resp *w, const char *name, const char *value)
{
	if (!name || !value)
		return;
	if (w->n_hdrs == w->cap_hdrs) {
		int cap = w->cap_hdrs ? 2 * w->cap_hdrs : 8;
		struct hdr *h = realloc(w->hdrs, (size_t)cap * sizeof *h);
		if (!h) {
			w->fail = DG_ENOMEM;
			return;
		}
		w->hdrs = h;
		w->cap_hdrs = cap;
	}
	char *n = strdup(name), *v = strdup(value);
	if (!n || !v) {
		free(n);
		free(v);
		w->fail = DG_ENOMEM;
		return;
	}
	w->hdrs[w->n_hdrs++] = (struct hdr){ n, v };
}

struct dg_buf *dg_http_body_buf(struct dg_http_resp *w, const char *content_type)
{
	if (w->has_ref)
		resp_drop_body(w);
	w->has_buf = true;
	set_ctype(w, content_type);
	return &w->buf;
}

void dg_http_set_body_ref(struct dg_http_resp *w, const char *content_type, const void *p,
			  size_t n, void (*release)(void *ud), void *ud)
{
	resp_drop_body(w);
	w->has_ref = true;
	w->ref = p;
	w->ref_len = n;
	w->release = release;
	w->ud = ud;
	set_ctype(w, content_type);
}

static int dump_to_buf(const char *p, size_t n, void *ud)
{
	return dg_buf_append(ud, p, n, NULL) == DG_OK ? 0 : -1;
}

void dg_http_set_json(struct dg_http_resp *w, int status, struct json_t *v)
{
	struct dg_buf *b = dg_http_body_buf(w, "application/json");

	w->status = status;
	b->len = 0;
	/* Serialise straight into the body: no intermediate string. */
	if (!v || json_dump_callback(v, dump_to_buf, b, JSON_COMPACT) != 0 ||
	    dg_buf_append(b, "\n", 1, NULL) != DG_OK)
		w->fail = DG_ENOMEM;
	json_decref(v);
}

/* ---------------------------------------------------------------- routing */

static enum dg_status compile_pattern(const struct dg_route *rt, struct pattern *p,
				      struct dg_err *err)
{
	const char *s = rt->pattern;

	p->n_segs = 0;
	p->rest = -1;
	if (!rt->method || !rt->fn || !s || s[0] != '/')
		return dg_err_set(err, DG_EINVAL, "route '%s %s': needs a method, a handler and "
				  "a pattern starting with '/'", rt->method ? rt->method : "?",
				  s ? s : "?");
	int n_params = 0;
	for (s++;; ) {
		const char *e = strchr(s, '/');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		if (p->n_segs == MAX_PATTERN_SEGS)
			return dg_err_set(err, DG_EINVAL, "route '%s': more than %d segments",
					  rt->pattern, MAX_PATTERN_SEGS);
		struct seg *g = &p->segs[p->n_segs];
		*g = (struct seg){ s, len, SEG_LIT };
		if (len >= 2 && s[0] == '{' && s[len - 1] == '}') {
			g->s = s + 1;
			g->len = len - 2;
			g->kind = SEG_PARAM;
			if (g->len > 3 && memcmp(g->s + g->len - 3, "...", 3) == 0) {
				g->len -= 3;
				g->kind = SEG_REST;
				if (p->rest >= 0)
					return dg_err_set(err, DG_EINVAL, "route '%s': more than "
							  "one {name...}", rt->pattern);
				p->rest = p->n_segs;
			}
			if (g->len == 0 || ++n_params > MAX_PARAMS)
				return dg_err_set(err, DG_EINVAL, "route '%s': empty parameter "
						  "name or more than %d parameters", rt->pattern,
						  MAX_PARAMS);
		}
		p->n_segs++;
		if (!e)
			break;
		s = e + 1;
	}
	return DG_OK;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decode %XX in the path part of a raw request target into a new string.
 * Returns NULL with *err set (DG_EINVAL) on a bad escape or %00. */
static char *decode_path(const char *uri, struct dg_err *err)
{
	size_t n = strcspn(uri, "?#");
	char *out;

	if (n == 0 || uri[0] != '/') {
		dg_err_set(err, DG_EINVAL, "request target '%.64s' must be a path starting "
			   "with '/'", uri);
		return NULL;
	}
	out = malloc(n + 1);
	if (!out) {
		dg_err_set(err, DG_ENOMEM, "out of memory decoding a %zu-byte path", n);
		return NULL;
	}
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		if (uri[i] != '%') {
			out[o++] = uri[i];
			continue;
		}
		int hi = i + 2 < n ? hexval(uri[i + 1]) : -1;
		int lo = i + 2 < n ? hexval(uri[i + 2]) : -1;
		if (hi < 0 || lo < 0 || (hi | lo) == 0) {
			dg_err_set(err, DG_EINVAL, hi == 0 && lo == 0 ? "path '%.64s' contains %%00"
				   : "path '%.64s' has a malformed %%-escape", uri);
			dg_err_hint(err, "escape bytes as %%XX with two hex digits (not %%00)");
			free(out);
			return NULL;
		}
		out[o++] = (char)(hi << 4 | lo);
		i += 2;
	}
	out[o] = '\0';
	return out;
}

/* Does pattern p match the decoded path (split into segments segs[n])? Fills
 * vals[k] with the text of the k-th parameter (offset, length into path). */
struct span {
	size_t off, len;
};

static bool seg_eq(const char *path, struct span sp, const struct seg *g)
{
	if (g->kind == SEG_PARAM)
		return sp.len > 0;
	return sp.len == g->len && memcmp(path + sp.off, g->s, sp.len) == 0;
}

static bool match_pattern(const struct pattern *p, const char *path, const struct span *segs,
			  int n, struct span *vals)
{
	int k = 0;

	if (p->rest < 0) {
		if (n != p->n_segs)
			return false;
		for (int i = 0; i < n; i++) {
			if (!seg_eq(path, segs[i], &p->segs[i]))
				return false;
			if (p->segs[i].kind == SEG_PARAM)
				vals[k++] = segs[i];
		}
		return true;
	}
	/* {name...} takes at least one segment: the prefix matches from the left,
	 * the suffix from the right, the rest is the middle. */
	int n_suffix = p->n_segs - p->rest - 1;
	if (n < p->n_segs)
		return false;
	for (int i = 0; i < p->rest; i++) {
		if (!seg_eq(path, segs[i], &p->segs[i]))
			return false;
		if (p->segs[i].kind == SEG_PARAM)
			vals[k++] = segs[i];
	}
	int last = n - n_suffix - 1;            /* last path segment of the middle */
	size_t from = segs[p->rest].off;
	struct span mid = { from, segs[last].off + segs[last].len - from };
	if (mid.len == 0)
		return false;
	vals[k++] = mid;
	for (int i = 0; i < n_suffix; i++) {
		const struct seg *g = &p->segs[p->rest + 1 + i];
		struct span sp = segs[last + 1 + i];
		if (!seg_eq(path, sp, g))
			return false;
		if (g->kind == SEG_PARAM)
			vals[k++] = sp;
	}
	return true;
}

static void allow_add(char *allow, size_t cap, const char *m)
{
	size_t ml = strlen(m);

	/* Comma-separated, each method once. */
	for (const char *s = allow; (s = strstr(s, m)) != NULL; s += ml)
		if ((s == allow || s[-1] == ' ') && (s[ml] == ',' || s[ml] == '\0'))
			return;
	size_t n = strlen(allow);
	snprintf(allow + n, cap - n, "%s%s", n ? ", " : "", m);
}

/* Find the route for r->method and r->path. DG_ENOTFOUND (no pattern matches)
 * or DG_EUNSUPPORTED (r->allow lists the methods that would) otherwise. */
static enum dg_status route_request(struct dg_http_server *s, struct dg_http_req *r,
				    struct dg_err *err)
{
	const char *path = r->path;
	int n = 1;
	enum dg_status st;

	for (const char *c = path + 1; *c; c++)
		n += *c == '/';
	struct span *segs = malloc((size_t)n * sizeof *segs);
	if (!segs)
		return dg_err_set(err, DG_ENOMEM, "out of memory routing '%.64s'", path);
	/* "/a/b" -> ["a", "b"]; "/" -> [""]; "/a/" -> ["a", ""]. */
	size_t off = 1;
	for (int i = 0; i < n; i++) {
		size_t len = strcspn(path + off, "/");
		segs[i] = (struct span){ off, len };
		off += len + 1;
	}
	struct span vals[MAX_PARAMS];
	int found = -1;
	const char *want[2] = { r->method, strcmp(r->method, "HEAD") == 0 ? "GET" : NULL };
	r->allow[0] = '\0';
	for (int pass = 0; pass < 2 && found < 0 && want[pass]; pass++) {
		for (int i = 0; i < s->n_routes; i++) {
			if (!match_pattern(&s->pats[i], path, segs, n, vals))
				continue;
			if (strcmp(s->routes[i].method, want[pass]) == 0) {
				found = i;
				break;
			}
			allow_add(r->allow, sizeof r->allow, s->routes[i].method);
			if (strcmp(s->routes[i].method, "GET") == 0)
				allow_add(r->allow, sizeof r->allow, "HEAD");
		}
	}
	if (found < 0) {
		free(segs);
		if (r->allow[0]) {
			st = dg_err_set(err, DG_EUNSUPPORTED, "method %s is not allowed on "
					"'%.128s'", r->method, path);
			dg_err_hint(err, "allowed: %s", r->allow);
			return st;
		}
		st = dg_err_set(err, DG_ENOTFOUND, "no route for %s '%.128s'", r->method, path);
		dg_err_hint(err, "see doc/http-api.md for the routes of API v1");
		return st;
	}
	/* Re-run the match of the chosen route (vals was overwritten by later tries)
	 * and copy the values, NUL-terminated, into one block. */
	const struct pattern *p = &s->pats[found];
	match_pattern(p, path, segs, n, vals);
	free(segs);
	r->pbuf = malloc(strlen(path) + MAX_PARAMS + 1);
	if (!r->pbuf)
		return dg_err_set(err, DG_ENOMEM, "out of memory routing '%.64s'", path);
	char *o = r->pbuf;
	r->n_params = 0;
	for (int i = 0; i < p->n_segs; i++) {
		if (p->segs[i].kind == SEG_LIT)
			continue;
		struct span v = vals[r->n_params];
		memcpy(o, path + v.off, v.len);
		o[v.len] = '\0';
		r->params[r->n_params++] = (struct param){ p->segs[i].s, p->segs[i].len, o };
		o += v.len + 1;
	}
	r->route = found;
	return DG_OK;
}

/* -------------------------------------------------------------- responses */

static void add_common_headers(struct dg_http_server *s, struct MHD_Response *mr)
{
	MHD_add_response_header(mr, "Dg-Epoch", s->epoch);
	MHD_add_response_header(mr, "Server", "dg/" DG_VERSION);
}

/* Queue mr with the common headers; the response is released by MHD once sent
 * (or once the connection dies). */
static enum MHD_Result queue(struct dg_http_req *r, int status, struct MHD_Response *mr,
			     uint64_t body_len)
{
	add_common_headers(r->srv, mr);
	enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, mr);
	MHD_destroy_response(mr);
	r->queued = true;
	r->status = status;
	r->sent = r->head ? 0 : body_len;
	return ret;
}

/* Send {"error": {"code", "message", "hint"}} with the given HTTP status. */
static enum MHD_Result queue_error(struct dg_http_req *r, int http, const struct dg_err *e)
{
	enum dg_status code = e->code == DG_OK ? DG_EINTERNAL : e->code;
	char msg[sizeof e->msg], hint[sizeof e->hint];

	/* dg_err_set keeps its text valid UTF-8; an err filled some other way
	 * must not turn a refusal into a failure to say why (jansson refuses
	 * invalid UTF-8, which would read as out of memory). */
	dg_utf8_escape(e->msg, strnlen(e->msg, sizeof e->msg - 1), msg, sizeof msg);
	dg_utf8_escape(e->hint, strnlen(e->hint, sizeof e->hint - 1), hint, sizeof hint);
	json_t *j = json_pack("{s:{s:s,s:s,s:s}}", "error", "code", dg_status_name(code),
			      "message", msg[0] ? msg : "request failed", "hint", hint);
	if (j && e->peer[0]) {
		char peer[sizeof e->peer];
		dg_utf8_escape(e->peer, strnlen(e->peer, sizeof e->peer - 1), peer, sizeof peer);
		json_object_set_new(json_object_get(j, "error"), "peer", json_string(peer));
	}
	char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
	size_t n = txt ? strlen(txt) : 0;
	char *body = txt ? realloc(txt, n + 2) : NULL;
	struct MHD_Response *mr;

	json_decref(j);
	if (!body) {
		free(txt);
		/* Out of memory: a static body still tells the client what happened. */
		static const char oom[] = "{\"error\":{\"code\":\"out_of_memory\",\"message\":"
					  "\"out of memory\",\"hint\":\"\"}}\n";
		mr = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom,
						     MHD_RESPMEM_PERSISTENT);
		http = 507;
		n = sizeof oom - 1;
	} else {
		body[n++] = '\n';
		body[n] = '\0';
		mr = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
		if (!mr)
			free(body);
	}
	if (!mr)
		return MHD_NO;
	MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	if (http == 405 && r->allow[0])
		MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, r->allow);
	if (r->close)
		MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
	return queue(r, http, mr, n);
}

static ssize_t never_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* Turn the handler's reply into an MHD response and queue it. */
static enum MHD_Result queue_reply(struct dg_http_req *r, struct dg_http_resp *w)
{
	struct MHD_Response *mr = NULL;
	uint64_t n = 0;
	int64_t head_len = -1;          /* a HEAD handler's own Content-Length */

	for (int i = 0; i < w->n_hdrs; i++)
		if (strcasecmp(w->hdrs[i].name, "Content-Length") == 0)
			head_len = strtoll(w->hdrs[i].value, NULL, 10);
	if (w->has_ref) {
		/* Sent straight from the caller's block; MHD calls release once when the
		 * response dies, whether it was sent or the client went away. */
		mr = MHD_create_response_from_buffer_with_free_callback_cls(
			w->ref_len, (void *)w->ref, w->release, w->ud);
		n = w->ref_len;
		if (mr)
			w->has_ref = false;     /* MHD owns the release now */
	} else if (w->has_buf && w->buf.len) {
		n = w->buf.len;
		char *data = dg_buf_steal(&w->buf, NULL);
		mr = MHD_create_response_from_buffer(n, data, MHD_RESPMEM_MUST_FREE);
		if (!mr)
			free(data);
	} else if (r->head && head_len >= 0) {
		/* HEAD answered without a body but with the length the GET would have:
		 * a callback response of that size whose reader HEAD never calls. */
		mr = MHD_create_response_from_callback((uint64_t)head_len, 4096, never_read, NULL,
						       NULL);
	} else {
		mr = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	}
	if (!mr) {
		struct dg_err e;
		dg_err_set(&e, DG_ENOMEM, "out of memory building the response to %s '%.128s'",
			   r->method, r->path);
		resp_drop_body(w);
		return queue_error(r, 507, &e);
	}
	if (w->ctype[0])
		MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, w->ctype);
	for (int i = 0; i < w->n_hdrs; i++) {
		if (strcasecmp(w->hdrs[i].name, "Content-Length") == 0)
			continue;
		if (MHD_add_response_header(mr, w->hdrs[i].name, w->hdrs[i].value) != MHD_YES)
			dg_log(DG_LOG_WARN, "http", "%s: %s %s: header '%s' refused", r->srv->name,
			       r->method, r->path, w->hdrs[i].name);
	}
	return queue(r, w->status, mr, n);
}

/* The last access-handler call: run the handler (or send the refusal decided
 * on the first call) and queue the response. */
static enum MHD_Result finish(struct dg_http_server *s, struct dg_http_req *r)
{
	struct dg_http_resp w = { .status = 200 };
	struct dg_err err = { 0 };
	enum MHD_Result ret;

	if (r->refused)
		return queue_error(r, r->refuse_http, &r->refuse);
	enum dg_status st = s->routes[r->route].fn(s->route_ctx[r->route], r, &w, &err);
	if (st == DG_OK && w.fail != DG_OK)
		st = dg_err_set(&err, w.fail, "out of memory building the response to %s '%.128s'",
				r->method, r->path);
	if (st == DG_OK && (w.status < 100 || w.status > 599))
		st = dg_err_set(&err, DG_EINTERNAL, "handler of %s '%.128s' set HTTP status %d",
				r->method, r->path, w.status);
	if (st != DG_OK) {
		if (err.code == DG_OK)
			err.code = st;
		resp_drop_body(&w);
		ret = queue_error(r, dg_status_to_http(st), &err);
	} else {
		ret = queue_reply(r, &w);
	}
	resp_deinit(&w);
	return ret;
}

/* --------------------------------------------------------- access handler */

struct hdr_sum {
	size_t bytes;
};

static enum MHD_Result sum_header(void *cls, enum MHD_ValueKind kind, const char *key,
				  const char *value)
{
	struct hdr_sum *h = cls;

	h->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;     /* ": " and CRLF */
	return MHD_YES;
}

static bool ct_equal(const char *a, size_t na, const char *b, size_t nb)
{
	volatile unsigned char d = (unsigned char)(na != nb);
	size_t n = na < nb ? na : nb;

	/* Time depends on the lengths only, not on where the bytes differ. */
	for (size_t i = 0; i < n; i++)
		d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

/* ------------------------------------------------------------ slow clients */

/* The client's address as text, without the port. */
static void addr_text(const struct sockaddr_storage *a, char *out, size_t cap)
{
	const void *p = a->ss_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr
						  : (const void *)&((const struct sockaddr_in *)a)->sin_addr;

	if (!inet_ntop(a->ss_family, p, out, (socklen_t)cap))
		snprintf(out, cap, "?");
}

/* Two client addresses of one host (the ports may differ). */
static bool same_host(const struct sockaddr *a, const struct sockaddr_storage *b)
{
	if (a->sa_family != b->ss_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
	return false;
}

/* Connections open from a's host. Called with conn_mu held. */
static unsigned host_conns(struct dg_http_server *s, const struct sockaddr *a)
{
	unsigned n = 0;

	for (struct conn_track *t = s->conns; t; t = t->next)
		n += same_host(a, &t->addr);
	return n;
}

static struct conn_track *conn_track_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* The time by which the connection's request must be read; 0 clears it. With
 * sooner, only a deadline earlier than the current one is set. */
static void conn_deadline(struct dg_http_server *s, struct conn_track *t, int64_t ns, bool sooner)
{
	if (!t)
		return;
	pthread_mutex_lock(&s->conn_mu);
	if (!sooner || t->deadline_ns == 0 || ns < t->deadline_ns)
		t->deadline_ns = ns;
	pthread_mutex_unlock(&s->conn_mu);
}

/* A chunked body earns read time as its bytes arrive. */
static void conn_body_bytes(struct dg_http_server *s, struct conn_track *t, size_t n)
{
	if (!t)
		return;
	pthread_mutex_lock(&s->conn_mu);
	t->body_bytes += n;
	t->deadline_ns = t->body_t0 + s->read_timeout_ns +
			 (int64_t)(t->body_bytes / BODY_MIN_RATE) * 1000000000LL;
	pthread_mutex_unlock(&s->conn_mu);
}

/* libmicrohttpd's accept policy: refuse a host's connections past its limit
 * and the spares that are answered 429. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *a, socklen_t len)
{
	struct dg_http_server *s = cls;
	bool ok;

	(void)len;
	pthread_mutex_lock(&s->conn_mu);
	ok = host_conns(s, a) < s->per_client + SPARE_PER_CLIENT;
	if (!ok)
		s->refused_client++;
	pthread_mutex_unlock(&s->conn_mu);
	return ok ? MHD_YES : MHD_NO;
}

/* Shut down the sockets whose request is late; libmicrohttpd then reads
 * end-of-file and closes the connection in its own thread. The socket is
 * still open: libmicrohttpd tells on_connection before it closes one, and
 * that removes it from the list under conn_mu. */
static void *reaper_main(void *arg)
{
	struct dg_http_server *s = arg;

	pthread_mutex_lock(&s->conn_mu);
	while (!s->reaper_stop) {
		int64_t now = dg_mono_ns(), next = now + REAPER_TICK_NS;
		int cut = 0;
		char host[INET6_ADDRSTRLEN] = "";
		for (struct conn_track *t = s->conns; t; t = t->next) {
			if (t->cut || t->deadline_ns == 0)
				continue;
			if (now >= t->deadline_ns) {
				if (!cut++)
					addr_text(&t->addr, host, sizeof host);
				shutdown(t->fd, SHUT_RDWR);
				t->cut = true;
				s->timed_out++;
			} else if (t->deadline_ns < next) {
				next = t->deadline_ns;
			}
		}
		if (cut) {      /* logged without the lock every accept takes */
			pthread_mutex_unlock(&s->conn_mu);
			dg_log(DG_LOG_DEBUG, "http", "%s: closed %d connection(s) (the first from "
			       "%s): their request was not read in time", s->name, cut, host);
			pthread_mutex_lock(&s->conn_mu);
			continue;
		}
		struct timespec ts = dg_deadline_timespec((struct dg_deadline){ next });
		pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &ts);
	}
	pthread_mutex_unlock(&s->conn_mu);
	return NULL;
}

static void refuse(struct dg_http_req *r, int http, const struct dg_err *e)
{
	r->refused = true;
	r->refuse_http = http;
	r->refuse = *e;
}

/* Parse Content-Length strictly; false when absent. */
static bool content_length(struct dg_http_req *r, uint64_t *out)
{
	const char *v = dg_http_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
	char *end;

	if (!v || *v < '0' || *v > '9')
		return false;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (*end != '\0' || errno == ERANGE)
		return false;
	*out = x;
	return true;
}

/* First access-handler call: headers are in. Checks, in order, the header
 * size, the token, the path, the route and the declared body size; a failure
 * becomes r->refused. Sets up the body block. */
static void begin(struct dg_http_server *s, struct dg_http_req *r)
{
	struct dg_err e = { 0 };
	struct hdr_sum hs = { strlen(r->uri) + strlen(r->method) + 12 };
	uint64_t cl = 0;

	if ((unsigned)atomic_load(&s->open_conns) > s->max_conns) {
		dg_err_set(&e, DG_EUNAVAILABLE, "too many connections to %s: the limit is %u",
			   s->addr, s->max_conns);
		dg_err_hint(&e, "retry later, reuse connections, or raise the server's "
			    "--max-connections");
		refuse(r, 429, &e);
		r->close = true;
		return;
	}
	if (r->track && r->track->over_client) {
		char host[INET6_ADDRSTRLEN] = "?";
		addr_text(&r->track->addr, host, sizeof host);
		dg_err_set(&e, DG_EUNAVAILABLE, "too many connections to %s from %s: the limit "
			   "is %u per client address", s->addr, host, s->per_client);
		dg_err_hint(&e, "retry later, reuse connections, or raise the server's "
			    "--max-connections-per-client");
		refuse(r, 429, &e);
		r->close = true;
		return;
	}
	MHD_get_connection_values(r->conn, MHD_HEADER_KIND, sum_header, &hs);
	if (hs.bytes > s->max_header) {
		dg_err_set(&e, DG_ETOOLARGE, "request headers of %zu bytes exceed the limit of %zu "
			   "bytes", hs.bytes, s->max_header);
		dg_err_hint(&e, "send fewer or shorter headers");
		refuse(r, 431, &e);
		return;
	}
	/* RFC 9112 section 3.2: an HTTP/1.1 request without Host is a 400. */
	if (r->version && strcmp(r->version, MHD_HTTP_VERSION_1_0) != 0 &&
	    !dg_http_header(r, MHD_HTTP_HEADER_HOST)) {
		dg_err_set(&e, DG_EINVAL, "%s request without a Host header", r->version);
		dg_err_hint(&e, "HTTP/1.1 requires 'Host: HOST:PORT' (RFC 9112, section 3.2)");
		refuse(r, 400, &e);
		return;
	}
	if (s->auth) {
		const char *a = dg_http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
		if (!a || !ct_equal(a, strlen(a), s->auth, s->auth_len)) {
			dg_err_set(&e, DG_EUNAUTHORIZED, a ? "wrong bearer token for %s"
				   : "missing bearer token for %s", s->addr);
			dg_err_hint(&e, "send 'Authorization: Bearer TOKEN' with the server's "
				    "token (dg: --token-file)");
			refuse(r, 401, &e);
			return;
		}
	}
	r->path = decode_path(r->uri, &e);
	if (!r->path) {
		refuse(r, e.code == DG_ENOMEM ? 507 : 400, &e);
		return;
	}
	enum dg_status st = route_request(s, r, &e);
	if (st != DG_OK) {
		refuse(r, st == DG_EUNSUPPORTED ? 405 : dg_status_to_http(st), &e);
		return;
	}
	if (content_length(r, &cl)) {
		if (cl > s->max_body) {
			dg_err_set(&e, DG_ETOOLARGE, "request body of %" PRIu64 " bytes exceeds "
				   "the limit of %zu bytes", cl, s->max_body);
			dg_err_hint(&e, "send less, or raise the server's --max-body");
			refuse(r, 413, &e);
			return;
		}
		r->sized = true;
		if (cl > 0) {
			r->body = dg_alloc_aligned((size_t)cl);
			if (!r->body) {
				dg_err_set(&e, DG_ENOMEM, "out of memory receiving a %" PRIu64
					   "-byte body", cl);
				refuse(r, 507, &e);
				return;
			}
			r->cap = (size_t)cl;
		}
	}
}

/* Does the request announce a body (that MHD would read next)? */
static bool has_body(struct dg_http_req *r)
{
	uint64_t cl;

	if (content_length(r, &cl))
		return cl > 0;
	return dg_http_header(r, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

/* The headers are read: the body, if any, must follow in its time (the
 * read time plus a second per BODY_MIN_RATE bytes); without one, the
 * handler runs next and the deadline goes. */
static void body_deadline(struct dg_http_server *s, struct dg_http_req *r)
{
	struct conn_track *t = r->track;
	int64_t now = dg_mono_ns();

	if (!t)
		return;
	pthread_mutex_lock(&s->conn_mu);
	if (!has_body(r))
		t->deadline_ns = 0;
	else if (r->sized)
		t->deadline_ns = now + s->read_timeout_ns +
				 (int64_t)(r->cap / BODY_MIN_RATE) * 1000000000LL;
	else
		t->deadline_ns = (t->body_t0 = now) + s->read_timeout_ns;
	t->body_bytes = 0;
	pthread_mutex_unlock(&s->conn_mu);
}

/* Append a chunk of the upload. A chunked upload grows its block geometrically
 * up to max_body. */
static enum dg_status append_body(struct dg_http_server *s, struct dg_http_req *r,
				  const char *p, size_t n, int *http, struct dg_err *e)
{
	if (n > s->max_body - r->len) {
		*http = 413;
		dg_err_set(e, DG_ETOOLARGE, "request body exceeds the limit of %zu bytes",
			   s->max_body);
		dg_err_hint(e, "send less, or raise the server's --max-body");
		return DG_ETOOLARGE;
	}
	if (n > r->cap - r->len) {
		if (r->sized) {
			/* MHD stops at Content-Length; this is a belt-and-braces check. */
			*http = 400;
			return dg_err_set(e, DG_EINVAL, "request body is longer than its "
					  "Content-Length of %zu bytes", r->cap);
		}
		size_t cap = r->cap ? r->cap : CHUNKED_INITIAL;
		while (cap - r->len < n)
			cap = cap > s->max_body / 2 ? s->max_body : cap * 2;
		char *nb = dg_alloc_aligned(cap);
		if (!nb) {
			*http = 507;
			return dg_err_set(e, DG_ENOMEM, "out of memory growing the request body "
					  "to %zu bytes", cap);
		}
		if (r->len)
			memcpy(nb, r->body, r->len);
		dg_free_aligned(r->body);
		r->body = nb;
		r->cap = cap;
	}
	memcpy(r->body + r->len, p, n);
	r->len += n;
	return DG_OK;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct dg_http_server *s = cls;
	struct dg_http_req *r = *con_cls;

	if (!r)
		return MHD_NO;  /* the URI callback could not allocate: drop the connection */
	if (!r->started) {
		r->started = true;
		r->conn = conn;
		r->method = method;
		r->version = version;
		r->head = strcmp(method, "HEAD") == 0;
		begin(s, r);
		/* A refused request with a body is answered now, so MHD never reads the
		 * body (no upload from a client without the token is buffered); MHD
		 * then closes the connection. Everything else answers on a later call:
		 * queueing on this first call would close a kept-alive connection. */
		if (r->refused && has_body(r)) {
			conn_deadline(s, r->track, 0, false);
			return queue_error(r, r->refuse_http, &r->refuse);
		}
		body_deadline(s, r);
		return MHD_YES;
	}
	if (r->queued) {
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (*upload_data_size) {
		struct dg_err e = { 0 };
		int http = 400;
		size_t n = *upload_data_size;

		*upload_data_size = 0;
		atomic_fetch_add(&s->bytes_in, n);
		if (!r->sized)
			conn_body_bytes(s, r->track, n);
		if (r->refused) {
			/* Past the limit mid-upload (chunked): libmicrohttpd 0.9.75 cannot
			 * queue a response while the body is being received, so the rest
			 * is read and dropped and the refusal goes out at the end; a
			 * client that keeps sending past twice the limit is cut off. */
			r->discarded += n;
			return r->discarded > s->max_body ? MHD_NO : MHD_YES;
		}
		if (append_body(s, r, upload_data, n, &http, &e) != DG_OK) {
			refuse(r, http, &e);
			dg_free_aligned(r->body);
			r->body = NULL;
			r->len = r->cap = 0;
		}
		return MHD_YES;
	}
	conn_deadline(s, r->track, 0, false);  /* read: the handler's time is its own */
	return finish(s, r);
}

/* Called by MHD with the raw request target before it parses it: creates the
 * request state (it becomes *con_cls), so the path can be decoded strictly. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	struct dg_http_req *r = calloc(1, sizeof *r);

	if (!r)
		return NULL;
	r->uri = strdup(uri);
	if (!r->uri) {
		free(r);
		return NULL;
	}
	r->srv = cls;
	r->route = -1;
	r->t0 = dg_mono_ns();
	/* The request line is in: the headers must follow within the read time
	 * (a kept-alive connection's deadline was its idle time until now). */
	r->track = conn_track_of(conn);
	conn_deadline(r->srv, r->track, r->t0 + r->srv->read_timeout_ns, true);
	return r;
}

static void count_code(struct route_stats *rs, const char *method, int code)
{
	for (int i = 0; i < rs->n_codes; i++) {
		if (rs->codes[i].code == code && strcmp(rs->codes[i].method, method) == 0) {
			rs->codes[i].n++;
			return;
		}
	}
	if (rs->n_codes == rs->cap_codes) {
		int cap = rs->cap_codes ? 2 * rs->cap_codes : 4;
		struct code_count *c = realloc(rs->codes, (size_t)cap * sizeof *c);
		if (!c)
			return;         /* a lost metric sample, not an error */
		rs->codes = c;
		rs->cap_codes = cap;
	}
	struct code_count *c = &rs->codes[rs->n_codes++];
	snprintf(c->method, sizeof c->method, "%s", method);
	c->code = code;
	c->n = 1;
}

/* Methods outside this set are counted as "OTHER" (bounded label values). */
static const char *method_label(const char *m)
{
	static const char *const known[] = { "GET", "HEAD", "PUT", "POST", "PATCH", "DELETE",
					     "OPTIONS" };

	for (size_t i = 0; m && i < sizeof known / sizeof known[0]; i++)
		if (strcmp(m, known[i]) == 0)
			return known[i];
	return "OTHER";
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct dg_http_server *s = cls;
	struct dg_http_req *r = *con_cls;

	if (!r)
		return;
	*con_cls = NULL;
	/* Kept alive, the connection may now sit idle until its next request. */
	conn_deadline(s, conn_track_of(conn), dg_mono_ns() + s->idle_timeout_ns, false);
	double secs = (double)(dg_mono_ns() - r->t0) * 1e-9;
	if (r->queued) {
		struct route_stats *rs = &s->stats[r->route >= 0 ? r->route : s->n_routes];
		int b = 0;
		while (b < N_BUCKETS && secs > bucket_le[b])
			b++;
		pthread_mutex_lock(&s->mu);
		count_code(rs, method_label(r->method), r->status);
		rs->buckets[b]++;
		rs->sum += secs;
		rs->count++;
		pthread_mutex_unlock(&s->mu);
		if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
			atomic_fetch_add(&s->bytes_out, r->sent);
		dg_log(DG_LOG_DEBUG, "http", "%s: %s %s %d %" PRIu64 " B %.3f ms%s", s->name,
		       r->method, r->path ? r->path : r->uri, r->status, r->sent, secs * 1e3,
		       toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (not completed)");
	} else {
		/* Closed before an answer: truncated body, header limit, timeout. */
		atomic_fetch_add(&s->aborted, 1);
		dg_log(DG_LOG_DEBUG, "http", "%s: %s %s aborted before a response (%d)", s->name,
		       r->method ? r->method : "-", r->uri, (int)toe);
	}
	if (r->body)
		dg_free_aligned(r->body);
	free(r->pbuf);
	free(r->path);
	free(r->uri);
	free(r);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct dg_http_server *s = cls;
	struct conn_track *t = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		atomic_fetch_add(&s->connections, 1);
		atomic_fetch_add(&s->open_conns, 1);
		const union MHD_ConnectionInfo *fd =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *ca =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		t = fd && ca ? calloc(1, sizeof *t) : NULL;
		if (!t) {
			/* Served, but without a read deadline or a per-client count. */
			dg_log(DG_LOG_WARN, "http", "%s: out of memory tracking a connection",
			       s->name);
			return;
		}
		t->fd = fd->connect_fd;
		size_t alen = ca->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
								     : sizeof(struct sockaddr_in);
		memcpy(&t->addr, ca->client_addr, alen);
		pthread_mutex_lock(&s->conn_mu);
		t->over_client = host_conns(s, ca->client_addr) >= s->per_client;
		t->deadline_ns = dg_mono_ns() + s->read_timeout_ns;
		t->next = s->conns;
		if (s->conns)
			s->conns->prev = t;
		s->conns = t;
		pthread_mutex_unlock(&s->conn_mu);
		*socket_context = t;
	} else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		atomic_fetch_sub(&s->open_conns, 1);
		if (!t)
			return;
		pthread_mutex_lock(&s->conn_mu);
		if (t->prev)
			t->prev->next = t->next;
		else
			s->conns = t->next;
		if (t->next)
			t->next->prev = t->prev;
		pthread_mutex_unlock(&s->conn_mu);
		free(t);
		*socket_context = NULL;
	}
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct dg_http_server *s = cls;
	char line[512];

	vsnprintf(line, sizeof line, fmt, ap);
	size_t n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
	/* MHD reports mostly peers that misbehave or go away: not our warnings. */
	dg_log(DG_LOG_INFO, "http", "%s: %s", s->name, line);
}

/* ------------------------------------------------------------- lifecycle */

static void stop_reaper(struct dg_http_server *s)
{
	if (!s->reaper_started)
		return;
	pthread_mutex_lock(&s->conn_mu);
	s->reaper_stop = true;
	pthread_cond_signal(&s->conn_cv);
	pthread_mutex_unlock(&s->conn_mu);
	pthread_join(s->reaper, NULL);
	s->reaper_started = false;
}

/* Resolve bind into a socket address: a numeric IPv4/IPv6 address (brackets
 * allowed) or a host name. */
static enum dg_status resolve_bind(const char *addr, int port, struct sockaddr_storage *ss,
				   socklen_t *sl, struct dg_err *err)
{
	char host[256];
	size_t n = strlen(addr);

	if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') {
		addr++;
		n -= 2;
	}
	if (n == 0 || n >= sizeof host)
		return dg_err_set(err, DG_EINVAL, "bind address '%s' is empty or too long", addr);
	memcpy(host, addr, n);
	host[n] = '\0';
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)port);
		*sl = sizeof *v4;
		return DG_OK;
	}
	if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)port);
		*sl = sizeof *v6;
		return DG_OK;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host, NULL, &hints, &ai);
	if (rc != 0 || !ai) {
		dg_err_set(err, DG_EINVAL, "cannot resolve bind address '%s': %s", host,
			   gai_strerror(rc));
		dg_err_hint(err, "use a numeric address such as 127.0.0.1, 0.0.0.0 or ::1");
		return DG_EINVAL;
	}
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*sl = ai->ai_addrlen;
	if (ss->ss_family == AF_INET)
		v4->sin_port = htons((uint16_t)port);
	else
		v6->sin6_port = htons((uint16_t)port);
	freeaddrinfo(ai);
	return DG_OK;
}

/* Open the listening socket ourselves (rather than letting MHD bind) so that
 * a taken port is reported with its errno and the address. */
static enum dg_status open_listener(struct dg_http_server *s, const char *addr, int port,
				    struct dg_err *err)
{
	struct sockaddr_storage ss;
	socklen_t sl = 0;
	char shown[300];
	int one = 1;

	if (port < 0 || port > 65535)
		return dg_err_set(err, DG_EINVAL, "port %d is out of range 0..65535", port);
	enum dg_status st = resolve_bind(addr, port, &ss, &sl, err);
	if (st != DG_OK)
		return st;
	bool v6 = ss.ss_family == AF_INET6;
	snprintf(shown, sizeof shown, v6 && !strchr(addr, '[') ? "[%s]:%d" : "%s:%d", addr, port);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return dg_err_set(err, DG_EIO, "cannot create a socket for %s: %s", shown,
				  strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
		int e = errno;
		close(fd);
		dg_err_set(err, DG_EIO, "cannot listen on %s: %s", shown, strerror(e));
		dg_err_hint(err, e == EADDRINUSE ? "another process holds the port (see ss -ltnp); "
			    "stop it or choose another port" : "check the bind address");
		return DG_EIO;
	}
	struct sockaddr_storage got;
	socklen_t gl = sizeof got;
	if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0)
		port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
			     : ((struct sockaddr_in *)&got)->sin_port);
	s->listen_dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (s->listen_dup < 0) {
		close(fd);
		return dg_err_set(err, DG_EIO, "cannot listen on %s: %s", shown, strerror(errno));
	}
	s->listen_fd = fd;
	s->port = port;
	s->v6 = v6;
	snprintf(s->addr, sizeof s->addr, v6 && !strchr(addr, '[') ? "[%s]:%d" : "%s:%d", addr,
		 port);
	return DG_OK;
}

struct dg_http_server *dg_http_server_new(const struct dg_http_config *cfg,
					  const struct dg_route *routes, int n_routes, void *ctx,
					  struct dg_err *err)
{
	struct dg_route_group g = { .routes = routes, .n_routes = n_routes, .ctx = ctx };

	return dg_http_server_new_groups(cfg, &g, 1, err);
}

/* Concatenate the groups' tables (group order decides ties between patterns)
 * with each route's ctx beside it. */
static enum dg_status merge_groups(struct dg_http_server *s, const struct dg_route_group *groups,
				   int n_groups, struct dg_err *err)
{
	int n = 0;

	for (int g = 0; g < n_groups; g++) {
		if (groups[g].n_routes < 0 || (!groups[g].routes && groups[g].n_routes > 0) ||
		    groups[g].n_routes > INT_MAX / 2 - n)
			return dg_err_set(err, DG_EINVAL, "dg_http_server_new: route group %d "
					  "is malformed", g);
		n += groups[g].n_routes;
	}
	s->routes = calloc((size_t)n + 1, sizeof *s->routes);
	s->route_ctx = calloc((size_t)n + 1, sizeof *s->route_ctx);
	if (!s->routes || !s->route_ctx)
		return dg_err_set(err, DG_ENOMEM, "out of memory creating an HTTP server");
	for (int g = 0; g < n_groups; g++) {
		for (int i = 0; i < groups[g].n_routes; i++) {
			s->routes[s->n_routes] = groups[g].routes[i];
			s->route_ctx[s->n_routes++] = groups[g].ctx;
		}
	}
	return DG_OK;
}

struct dg_http_server *dg_http_server_new_groups(const struct dg_http_config *cfg,
						 const struct dg_route_group *groups, int n_groups,
						 struct dg_err *err)
{
	struct dg_http_server *s;
	enum dg_status st;
	int n_routes;

	if (!cfg || (!groups && n_groups > 0) || n_groups < 0) {
		dg_err_set(err, DG_EINVAL, "dg_http_server_new: no config or no route table");
		return NULL;
	}
	s = calloc(1, sizeof *s);
	if (!s) {
		dg_err_set(err, DG_ENOMEM, "out of memory creating an HTTP server");
		return NULL;
	}
	s->listen_fd = -1;
	s->listen_dup = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->conn_mu, NULL);
	dg_cond_init_mono(&s->conn_cv);
	if (merge_groups(s, groups, n_groups, err) != DG_OK)
		goto fail;
	n_routes = s->n_routes;
	s->max_body = cfg->max_body ? cfg->max_body : DEFAULT_MAX_BODY;
	s->max_header = cfg->max_header ? cfg->max_header : DEFAULT_MAX_HEADER;
	s->max_conns = cfg->max_connections ? cfg->max_connections : DEFAULT_MAX_CONNECTIONS;
	s->per_client = cfg->max_connections_per_client ? cfg->max_connections_per_client
							 : DEFAULT_PER_CLIENT;
	if (s->per_client > s->max_conns)
		s->per_client = s->max_conns;
	unsigned timeout_s = cfg->request_timeout_s ? cfg->request_timeout_s : DEFAULT_TIMEOUT_S;
	s->idle_timeout_ns = (int64_t)timeout_s * 1000000000LL;
	s->read_timeout_ns = (int64_t)(cfg->read_timeout_s ? cfg->read_timeout_s
							    : DEFAULT_READ_TIMEOUT_S) * 1000000000LL;
	snprintf(s->name, sizeof s->name, "%s", cfg->server_name ? cfg->server_name : "http");
	snprintf(s->epoch, sizeof s->epoch, "%" PRIu64, cfg->epoch);
	s->pats = calloc((size_t)n_routes + 1, sizeof *s->pats);
	s->stats = calloc((size_t)n_routes + 1, sizeof *s->stats);
	if (!s->pats || !s->stats) {
		dg_err_set(err, DG_ENOMEM, "out of memory creating an HTTP server");
		goto fail;
	}
	for (int i = 0; i < n_routes; i++)
		if ((st = compile_pattern(&s->routes[i], &s->pats[i], err)) != DG_OK)
			goto fail;
	if (cfg->token) {
		size_t tl = strlen(cfg->token);
		s->auth = malloc(tl + 8);
		if (!s->auth) {
			dg_err_set(err, DG_ENOMEM, "out of memory creating an HTTP server");
			goto fail;
		}
		s->auth_len = (size_t)snprintf(s->auth, tl + 8, "Bearer %s", cfg->token);
	}
	st = open_listener(s, cfg->bind ? cfg->bind : "127.0.0.1", cfg->port, err);
	if (st != DG_OK)
		goto fail;
	/* Connections past max_conns are still accepted (up to a few spare) so
	 * that begin() can answer them 429 in JSON, naming the limit, instead of
	 * a silent close; beyond the spares libmicrohttpd closes them itself.
	 * The connection's memory pool holds the request line and headers, the
	 * upload read buffer and the response headers: see POOL_ROOM and
	 * READ_INCREMENT for its size and how the read buffer grows in it. */
	size_t pool = s->max_header + POOL_ROOM;
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
			 MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
	if (s->v6)
		flags |= MHD_USE_IPv6;
	/* MHD_OPTION_ARRAY: the TLS options only when asked for */
	struct MHD_OptionItem tls[3] = { { MHD_OPTION_END, 0, NULL } };
	if (cfg->tls_cert_pem || cfg->tls_key_pem) {
		if (!cfg->tls_cert_pem || !cfg->tls_key_pem) {
			dg_err_set(err, DG_EINVAL, "TLS needs both a certificate and its key");
			goto fail;
		}
		if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
			dg_err_set(err, DG_EUNSUPPORTED, "this libmicrohttpd was built without "
				   "TLS");
			dg_err_hint(err, "install a libmicrohttpd built with GnuTLS (Debian's is)");
			goto fail;
		}
		flags |= MHD_USE_TLS;
		tls[0] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_KEY, 0,
						  (void *)cfg->tls_key_pem };
		tls[1] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_CERT, 0,
						  (void *)cfg->tls_cert_pem };
		tls[2] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
		s->tls = true;
	}
	int rc = pthread_create(&s->reaper, NULL, reaper_main, s);
	if (rc != 0) {
		dg_err_set(err, DG_ENOMEM, "cannot start the HTTP server's reaper thread: %s",
			   strerror(rc));
		goto fail;
	}
	s->reaper_started = true;
	s->mhd = MHD_start_daemon(
		flags, 0, on_accept, s, on_request, s,
		MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,     /* first: it says so otherwise */
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->listen_fd,
		MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
		MHD_OPTION_CONNECTION_LIMIT, s->max_conns + SPARE_CONNECTIONS,
		MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
		MHD_OPTION_CONNECTION_MEMORY_INCREMENT, READ_INCREMENT(pool),
		MHD_OPTION_ARRAY, tls,
		MHD_OPTION_END);
	if (!s->mhd) {
		dg_err_set(err, DG_EIO, "cannot start the HTTP server on %s", s->addr);
		dg_err_hint(err, "see the log lines above for libmicrohttpd's reason");
		/* Depending on where it failed, libmicrohttpd may have closed the
		 * socket already, and the number may name another file by now: close
		 * it only if it is still the socket that the duplicate refers to. */
		struct stat a, b;
		if (fstat(s->listen_fd, &a) != 0 || fstat(s->listen_dup, &b) != 0 ||
		    a.st_ino != b.st_ino || a.st_dev != b.st_dev)
			s->listen_fd = -1;
		goto fail;
	}
	close(s->listen_dup);           /* MHD owns the socket now */
	dg_log(DG_LOG_DEBUG, "http", "%s: listening on %s://%s (%d routes)", s->name,
	       s->tls ? "https" : "http", s->addr, n_routes);
	return s;
fail:
	stop_reaper(s);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->listen_dup >= 0)
		close(s->listen_dup);
	free(s->auth);
	free(s->pats);
	free(s->stats);
	free(s->routes);
	free(s->route_ctx);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->conn_mu);
	pthread_cond_destroy(&s->conn_cv);
	free(s);
	return NULL;
}

int dg_http_server_port(const struct dg_http_server *s)
{
	return s->port;
}

/* Prometheus label values escape '\\', '"' and newlines. */
static enum dg_status put_label(struct dg_buf *out, const char *v, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (; *v && st == DG_OK; v++) {
		if (*v == '\\' || *v == '"')
			st = dg_buf_printf(out, err, "\\%c", *v);
		else if (*v == '\n')
			st = dg_buf_append(out, "\\n", 2, err);
		else
			st = dg_buf_append(out, v, 1, err);
	}
	return st;
}

/* route="PATTERN" and, with_method, the route's method (a table may list one
 * pattern under several methods); slot n_routes is route="none". */
static enum dg_status put_route_label(struct dg_http_server *s, int i, bool with_method,
				      struct dg_buf *out, struct dg_err *err)
{
	enum dg_status st = dg_buf_append(out, "route=\"", 7, err);

	if (st == DG_OK)
		st = put_label(out, i < s->n_routes ? s->routes[i].pattern : "none", err);
	if (st == DG_OK)
		st = dg_buf_append(out, "\"", 1, err);
	if (st == DG_OK && with_method && i < s->n_routes) {
		st = dg_buf_append(out, ",method=\"", 9, err);
		if (st == DG_OK)
			st = put_label(out, s->routes[i].method, err);
		if (st == DG_OK)
			st = dg_buf_append(out, "\"", 1, err);
	}
	return st;
}

enum dg_status dg_http_server_metrics(struct dg_http_server *s, struct dg_buf *out,
				      struct dg_err *err)
{
	enum dg_status st;

	st = dg_buf_printf(out, err,
		"# HELP dg_http_requests_total HTTP requests answered, by route, method and "
		"status.\n"
		"# TYPE dg_http_requests_total counter\n");
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i <= s->n_routes && st == DG_OK; i++) {
		const struct route_stats *rs = &s->stats[i];
		for (int k = 0; k < rs->n_codes && st == DG_OK; k++) {
			st = dg_buf_printf(out, err, "dg_http_requests_total{");
			if (st == DG_OK)
				st = put_route_label(s, i, false, out, err);
			if (st == DG_OK)
				st = dg_buf_printf(out, err, ",method=\"%s\",code=\"%d\"} %" PRIu64
						   "\n", rs->codes[k].method, rs->codes[k].code,
						   rs->codes[k].n);
		}
	}
	if (st == DG_OK)
		st = dg_buf_printf(out, err,
			"# HELP dg_http_request_seconds Time from request line to completed "
			"response, by route.\n"
			"# TYPE dg_http_request_seconds histogram\n");
	for (int i = 0; i <= s->n_routes && st == DG_OK; i++) {
		const struct route_stats *rs = &s->stats[i];
		uint64_t cum = 0;
		if (rs->count == 0)
			continue;
		for (int b = 0; b <= N_BUCKETS && st == DG_OK; b++) {
			char le[32];
			cum += rs->buckets[b];
			if (b < N_BUCKETS)
				snprintf(le, sizeof le, "%g", bucket_le[b]);
			else
				snprintf(le, sizeof le, "+Inf");
			st = dg_buf_printf(out, err, "dg_http_request_seconds_bucket{");
			if (st == DG_OK)
				st = put_route_label(s, i, true, out, err);
			if (st == DG_OK)
				st = dg_buf_printf(out, err, ",le=\"%s\"} %" PRIu64 "\n", le, cum);
		}
		if (st == DG_OK)
			st = dg_buf_printf(out, err, "dg_http_request_seconds_sum{");
		if (st == DG_OK)
			st = put_route_label(s, i, true, out, err);
		if (st == DG_OK)
			st = dg_buf_printf(out, err, "} %.9g\ndg_http_request_seconds_count{",
					   rs->sum);
		if (st == DG_OK)
			st = put_route_label(s, i, true, out, err);
		if (st == DG_OK)
			st = dg_buf_printf(out, err, "} %" PRIu64 "\n", rs->count);
	}
	pthread_mutex_unlock(&s->mu);
	if (st == DG_OK)
		st = dg_buf_printf(out, err,
			"# HELP dg_http_bytes_received_total Request body bytes received.\n"
			"# TYPE dg_http_bytes_received_total counter\n"
			"dg_http_bytes_received_total %" PRIu64 "\n"
			"# HELP dg_http_bytes_sent_total Response body bytes sent.\n"
			"# TYPE dg_http_bytes_sent_total counter\n"
			"dg_http_bytes_sent_total %" PRIu64 "\n"
			"# HELP dg_http_connections_total TCP connections accepted.\n"
			"# TYPE dg_http_connections_total counter\n"
			"dg_http_connections_total %" PRIu64 "\n"
			"# HELP dg_http_connections_open TCP connections open now.\n"
			"# TYPE dg_http_connections_open gauge\n"
			"dg_http_connections_open %d\n"
			"# HELP dg_http_requests_aborted_total Requests closed before a response "
			"(truncated body, timeout).\n"
			"# TYPE dg_http_requests_aborted_total counter\n"
			"dg_http_requests_aborted_total %" PRIu64 "\n",
			(uint64_t)atomic_load(&s->bytes_in), (uint64_t)atomic_load(&s->bytes_out),
			(uint64_t)atomic_load(&s->connections), atomic_load(&s->open_conns),
			(uint64_t)atomic_load(&s->aborted));
	pthread_mutex_lock(&s->conn_mu);
	uint64_t cut = s->timed_out, refused = s->refused_client;
	pthread_mutex_unlock(&s->conn_mu);
	if (st == DG_OK)
		st = dg_buf_printf(out, err,
			"# HELP dg_http_connections_cut_total Connections closed because their "
			"request was not read in time (slow clients).\n"
			"# TYPE dg_http_connections_cut_total counter\n"
			"dg_http_connections_cut_total %" PRIu64 "\n"
			"# HELP dg_http_connections_refused_total Connections refused at accept: "
			"their client address had too many open.\n"
			"# TYPE dg_http_connections_refused_total counter\n"
			"dg_http_connections_refused_total %" PRIu64 "\n", cut, refused);
	return st;
}

void dg_http_server_free(struct dg_http_server *s)
{
	if (!s)
		return;
	/* The reaper first: it must not shut down a socket that the daemon's stop
	 * has closed. Then join every connection thread: see "Shutdown" at the
	 * top of this file. */
	stop_reaper(s);
	MHD_stop_daemon(s->mhd);
	for (int i = 0; i <= s->n_routes; i++)
		free(s->stats[i].codes);
	free(s->stats);
	free(s->pats);
	free(s->auth);
	free(s->routes);
	free(s->route_ctx);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->conn_mu);
	pthread_cond_destroy(&s->conn_cv);
	free(s);
}
