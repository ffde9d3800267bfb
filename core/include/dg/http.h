/* HTTP for dg: the server side (one libmicrohttpd callback, a route table,
 * auth, limits, JSON errors, metrics of every request) and the client side
 * (libcurl, one kept-alive connection per client object). Handlers and
 * callers never see MHD or curl types. */
#ifndef DG_HTTP_H
#define DG_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dg/buf.h"
#include "dg/status.h"

/* ------------------------------------------------------------------ server */

/* A request as a handler sees it. All pointers are borrowed for the duration
 * of the handler call. */
struct dg_http_req;

const char *dg_http_method(const struct dg_http_req *r);     /* "GET" */
const char *dg_http_path(const struct dg_http_req *r);       /* decoded, no query */
/* A header (case-insensitive name) or NULL. */
const char *dg_http_header(const struct dg_http_req *r, const char *name);
/* A query argument (decoded) or NULL; "" for "?flag" without a value. */
const char *dg_http_query(const struct dg_http_req *r, const char *key);
/* A route parameter: the text matched by {name} or {name...} in the pattern. */
const char *dg_http_param(const struct dg_http_req *r, const char *name);
/* The uploaded body (complete; its length was checked against the limits).
 * The block is 64-byte aligned, so a raw tensor body can be adopted. */
const void *dg_http_body(const struct dg_http_req *r, size_t *len);
/* Take ownership of the body block (free with dg_free_aligned); afterwards
 * dg_http_body returns NULL. Lets a PUT of a raw tensor avoid a copy. */
void *dg_http_body_take(struct dg_http_req *r, size_t *len);

/* Typed query helpers: missing -> *out = def, DG_OK; malformed -> DG_EINVAL
 * naming the parameter. */
enum dg_status dg_http_query_int(const struct dg_http_req *r, const char *key, int64_t def,
				 int64_t *out, struct dg_err *err);
enum dg_status dg_http_query_double(const struct dg_http_req *r, const char *key, double def,
				    double *out, struct dg_err *err);

/* The reply a handler builds. Status defaults to 200. The body is either an
 * owned dg_buf (body), or an external block with a release callback (e.g. a
 * reference-counted tensor snapshot: sent without a copy). */
struct dg_http_resp;

void dg_http_set_status(struct dg_http_resp *w, int status);
/* Add a header (copied). */
void dg_http_add_header(struct dg_http_resp *w, const char *name, const char *value);
/* The owned body buffer to append to; content_type is copied. */
struct dg_buf *dg_http_body_buf(struct dg_http_resp *w, const char *content_type);
/* Send n bytes at p; release(ud) is called once the server no longer needs
 * them (also on error paths). No copy is made. */
void dg_http_set_body_ref(struct dg_http_resp *w, const char *content_type, const void *p,
			  size_t n, void (*release)(void *ud), void *ud);
/* Convenience: a JSON body (takes ownership of the jansson value). */
struct json_t;
void dg_http_set_json(struct dg_http_resp *w, int status, struct json_t *v);

/* A handler: parse the request, call the store, build the reply. Returning
 * an error status with err set makes the server send the JSON error with the
 * status's HTTP code (any body the handler started is dropped). ctx is the
 * pointer given to dg_http_server_new. Handlers may block (long polls, queue
 * waits): each connection has its own thread. */
typedef enum dg_status (*dg_http_handler)(void *ctx, struct dg_http_req *r,
					  struct dg_http_resp *w, struct dg_err *err);

/* A route: method, pattern, handler, one line of documentation. Patterns are
 * literal segments and {name} (one segment) or {name...} (one or more
 * segments, for variable names with '/'); a literal suffix after {name...}
 * such as "/v1/vars/{name...}/apply" is matched from the right. */
struct dg_route {
	const char *method;
	const char *pattern;
	dg_http_handler fn;
	const char *doc;
};

struct dg_http_config {
	const char *bind;               /* address to listen on; NULL = 127.0.0.1 */
	int port;                       /* 0 = pick a free port (see dg_http_server_port) */
	const char *token;              /* bearer token; NULL = no auth */
	size_t max_body;                /* bytes; 0 = 2 GiB */
	size_t max_header;              /* bytes; 0 = 16 KiB */
	unsigned max_connections;       /* 0 = 256 */
	unsigned request_timeout_s;     /* idle time of a connection; 0 = 300 */
	unsigned read_timeout_s;        /* total time to read headers (a body: + 1 s per
					 * 64 KiB); a trickle cannot extend it; 0 = 20 */
	unsigned max_connections_per_client;    /* from one address; 0 = 128 (at most
						 * max_connections) */
	const char *server_name;        /* for logs, e.g. "ps/0" */
	uint64_t epoch;                 /* sent as Dg-Epoch on every response */
	/* TLS (libmicrohttpd's HTTPS, GnuTLS): the PEM texts of the server's
	 * certificate (chain) and private key, both or neither; NULL: plain HTTP. */
	const char *tls_cert_pem, *tls_key_pem;
};

struct dg_http_server;

/* Start listening and serving (threads of its own). routes must outlive the
 * server. Returns an owned server or NULL with *err set (DG_EIO naming the
 * address when the port is taken). */
struct dg_http_server *dg_http_server_new(const struct dg_http_config *cfg,
					  const struct dg_route *routes, int n_routes, void *ctx,
					  struct dg_err *err);
/* A route table served with its own ctx: one server can serve several faces
 * (the ps routes and the worker routes of `dg server`). */
struct dg_route_group {
	const struct dg_route *routes;
	int n_routes;
	void *ctx;
};

/* Like dg_http_server_new with several tables: each handler gets its group's
 * ctx. Routes are tried in group order, then table order. The tables (not the
 * groups array) must outlive the server. Owned or NULL with *err set. */
struct dg_http_server *dg_http_server_new_groups(const struct dg_http_config *cfg,
						 const struct dg_route_group *groups, int n_groups,
						 struct dg_err *err);
/* The port actually bound. */
int dg_http_server_port(const struct dg_http_server *s);
/* Append the server's request metrics in Prometheus text format. */
enum dg_status dg_http_server_metrics(struct dg_http_server *s, struct dg_buf *out,
				      struct dg_err *err);
/* Stop accepting, wait for handlers to finish, free. NULL is fine. */
void dg_http_server_free(struct dg_http_server *s);

/* ------------------------------------------------------------------ client */

struct dg_http_client;

/* TLS for every client this process makes from now on: an address given as
 * host:port is reached over https and the server's certificate verified
 * against the PEM file ca_file (and its host against the certificate's
 * names). Called once at a command's start, before any client exists: a
 * cluster is served over TLS or not as a whole. DG_ENOTFOUND / DG_EIO when
 * the file cannot be read, DG_EINVAL when it is not PEM. */
enum dg_status dg_http_tls_ca(const char *ca_file, struct dg_err *err);
/* Whether dg_http_tls_ca was called. */
bool dg_http_tls_enabled(void);

/* A client for one server, "host:port", "http://host:port" (plain, whatever
 * dg_http_tls_ca said) or "https://host:port" (TLS: verified against
 * dg_http_tls_ca's file, else the system's CAs). token may be NULL. One
 * kept-alive connection, reused across requests; a client object is used by
 * one thread at a time. timeout_ms bounds each request (0 = 300 s). */
struct dg_http_client *dg_http_client_new(const char *address, const char *token,
					  long timeout_ms, struct dg_err *err);
void dg_http_client_free(struct dg_http_client *c);
/* "http://127.0.0.1:2222" (for messages). */
const char *dg_http_client_url(const struct dg_http_client *c);
/* Bound each later request to timeout_ms (0 = 300 s); the connect timeout
 * stays 5 s. Same threading rule as the client itself. */
void dg_http_client_set_timeout(struct dg_http_client *c, long timeout_ms);

struct dg_http_header {
	const char *name;
	const char *value;
};

struct dg_http_result {
	int status;                     /* HTTP status */
	struct dg_buf body;             /* owned by the result */
	char content_type[128];
	char dg_dtype[32];              /* Dg-Dtype, "" when absent */
	char dg_shape[160];             /* Dg-Shape */
	uint64_t dg_version;            /* Dg-Version, 0 when absent */
	uint64_t dg_epoch;              /* Dg-Epoch, 0 when absent */
	char content_range[96];
	int64_t dg_count;               /* Dg-Count, -1 when absent */
	int64_t dg_step;                /* Dg-Step (a variable's sync step), -1 when absent */
	uint64_t dg_lease;              /* Dg-Lease (a leased dequeue), 0 when absent */
	/* When sink is set, a 2xx body goes to sink(sink_ud, offset, p, n) as it
	 * arrives instead of into body (offset restarts at 0 when the request is
	 * retried); sink returns false to abort the transfer. Error bodies still
	 * go to body. */
	bool (*sink)(void *ud, uint64_t offset, const void *p, size_t n);
	void *sink_ud;
	uint64_t sink_off;              /* bytes given to sink in this attempt */
	/* When aligned_body is set (and sink is not), a 2xx body goes into
	 * aligned instead of body: a dg_alloc_aligned block sized once from
	 * Content-Length (grown with a copy only when the length is unknown), so
	 * a raw tensor can adopt it without a copy. The block is owned by the
	 * result (freed by deinit) until dg_http_result_take_aligned; a later
	 * request on the same result reuses it when it is large enough. */
	bool aligned_body;
	void *aligned;
	size_t aligned_len;
	size_t aligned_cap;
};
void dg_http_result_init(struct dg_http_result *r);
void dg_http_result_deinit(struct dg_http_result *r);
/* Take the aligned body block (free with dg_free_aligned); *len gets its
 * length. NULL (and *len 0) when there is none, e.g. an empty body. The
 * result no longer refers to it. */
void *dg_http_result_take_aligned(struct dg_http_result *r, size_t *len);

/* One request. path is "/v1/..." with the query (the caller percent-encodes
 * names with dg_http_escape_path). body may be NULL. On a transport failure:
 * DG_EUNAVAILABLE (connection refused, naming the URL) or DG_ETIMEOUT. Every
 * HTTP status >= 400 is returned as an error with res->status set: a dg JSON
 * error body gives its code, message and hint; other bodies a code mapped from
 * the status and the body's first line. Statuses below 400 (200, 201, 202,
 * 206, 304) return DG_OK and the caller reads res. Retries once on a dropped
 * kept-alive connection for idempotent methods (libcurl itself may resend any
 * request once when a reused connection died before any byte of the answer). */
enum dg_status dg_http_request(struct dg_http_client *c, const char *method, const char *path,
			       const struct dg_http_header *headers, int n_headers,
			       const void *body, size_t body_len, struct dg_http_result *res,
			       struct dg_err *err);

/* GET path on a connection of its own (HTTP/1.1, Connection: close) with the
 * body of a 2xx reply received straight into the caller's memory: recv(2)
 * into the block into->begin returns, without libcurl's buffer to copy out
 * of (the mount's cold reads). The reply's headers are read into res as
 * dg_http_request reads them, then:
 *  - a 2xx with Content-Length (no Transfer-Encoding): begin(ud, res, len)
 *    gives a block of at least len bytes (NULL gives up: DG_ECANCELED) and
 *    *delivered becomes true; progress(ud, got) after each receive (false
 *    gives up: DG_ECANCELED);
 *  - a status >= 400: the error as dg_http_request gives it (res->status set);
 *  - any other reply (chunked, no length, other statuses): DG_EUNSUPPORTED,
 *    nothing delivered, for the caller to use dg_http_request instead.
 * stop(ud), when set, is polled while connecting. Transport failures are
 * DG_EIO, DG_ETIMEOUT or DG_ECANCELED naming the step and the URL. The
 * client's kept-alive connection is not used; same threading rule. */
struct dg_http_into {
	void *(*begin)(void *ud, const struct dg_http_result *res, uint64_t len);
	bool (*progress)(void *ud, uint64_t got);
	bool (*stop)(void *ud);
};
enum dg_status dg_http_get_into(struct dg_http_client *c, const char *path,
				const struct dg_http_header *headers, int n_headers,
				const struct dg_http_into *into, void *ud,
				struct dg_http_result *res, bool *delivered, struct dg_err *err);

/* PUT path on a connection of its own (HTTP/1.1, Connection: close) with a
 * body of len bytes sent with send(2) straight from body as the caller
 * declares its bytes final: no copy into libcurl's buffer, and the transfer
 * can start before the body is complete (the mount's streaming writes). The
 * request has Content-Length: len, the caller's headers and the token.
 *  - more(ud, sent): every final byte, [0, sent), went out; return n: bytes
 *    [0, n) are final (sent < n; more than len reads as len). It may block
 *    while the caller makes more bytes final: the transfer pauses. Returning
 *    sent or less gives up (DG_ECANCELED): the server gets a body cut short
 *    and, as HTTP requires, applies nothing. Not called once all is sent.
 *  - stop(ud), when set, is polled while connecting.
 *  - stop_fd: -1, or a descriptor the caller makes readable (an eventfd, a
 *    pipe) to end a send or a receive that waits on the server at once
 *    (DG_ECANCELED), from another thread.
 * A wait on the server longer than the client's timeout is DG_ETIMEOUT. The
 * reply is read into res as dg_http_request reads it (headers, a small
 * body); a status >= 400 is the error dg_http_request gives, also when the
 * server answered before the body was complete (and closed). Other failures
 * are DG_EUNAVAILABLE, DG_ETIMEOUT or DG_ECANCELED naming the step and the
 * URL, with res->status 0. *sent: the bytes of the body that went out. Same
 * threading rule as the client; its kept-alive connection is not used. */
struct dg_http_from {
	uint64_t (*more)(void *ud, uint64_t sent);
	bool (*stop)(void *ud);
	int stop_fd;
};
enum dg_status dg_http_put_from(struct dg_http_client *c, const char *path,
				const struct dg_http_header *headers, int n_headers,
				const void *body, uint64_t len, const struct dg_http_from *from,
				void *ud, struct dg_http_result *res, uint64_t *sent,
				struct dg_err *err);

/* --------------------------------------------------------- plain sockets */

/* A server address as dg_http_client_new takes it ("HOST:PORT", "[V6]:PORT",
 * an optional http:// in any case, trailing slashes, no port for 80). */
struct dg_http_addr {
	char *host, *port;              /* owned: for getaddrinfo */
	char *authority;                /* owned: "host:port" as given: Host: and messages */
};
enum dg_status dg_http_addr_parse(const char *addr, struct dg_http_addr *out,
				  struct dg_err *err);
void dg_http_addr_free(struct dg_http_addr *a);
/* A blocking TCP connection to a (within 5 s; stop(ud), polled every 100 ms,
 * gives up early), with send/recv timeouts of io_timeout_s and TCP_NODELAY.
 * The fd, or -1 with *what (the step that failed) and *e (an errno). For the
 * requests http_client.c writes itself (dg_http_get_into, dg_http_put_from). */
int dg_http_connect(const struct dg_http_addr *a, long io_timeout_s, bool (*stop)(void *),
		    void *ud, const char **what, int *e);
/* One send(2) or recv(2) of up to n bytes: the bytes moved, or -1 with *e
 * (ETIMEDOUT for the socket's timeout, EPIPE or ECONNRESET when the peer
 * closed). stop_fd -1: a blocking call. stop_fd >= 0: the call does not
 * block; it waits in poll(2) for the socket, timeout_ms at most (ETIMEDOUT),
 * or for stop_fd to become readable (ECANCELED): another thread ends a
 * transfer at once by making it so. */
ssize_t dg_http_send_some(int fd, const void *p, size_t n, int stop_fd, long timeout_ms, int *e);
ssize_t dg_http_recv_some(int fd, void *p, size_t n, int stop_fd, long timeout_ms, int *e);
/* Send all n bytes (dg_http_send_some until done); false with *e. */
bool dg_http_send_all(int fd, const void *p, size_t n, int stop_fd, long timeout_ms, int *e);

/* Percent-encode a variable name for a URL path (keeps '/' and unreserved
 * characters). Appends to out. */
enum dg_status dg_http_escape_path(const char *name, struct dg_buf *out, struct dg_err *err);

#endif
