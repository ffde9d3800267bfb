/* A streaming PUT for the mount's replacing writers (doc/filesystem.md,
 * "Writing"): the request starts at the first write at offset 0 and its body
 * is sent from the handle's staging block as the writes fill it, so the
 * transfer overlaps the writer instead of starting at close. The body has a
 * Content-Length of the tensor's nbytes: the ps replaces the value only once
 * that whole body arrived (an aborted upload changes nothing). dg/http.h has
 * no upload from a growing buffer, and libcurl's read callback would copy
 * every byte once more, so the request is written on a plain socket: send(2)
 * straight from the staging block (one HTTP/1.1 request per connection). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"
#include "dg/http.h"
#include "dg/log.h"
#include "dg/tensor.h"
#include "dg/wire.h"
#include "fs.h"

#define ERR_BODY_MAX ((size_t)64 << 10)  /* bytes of an error reply kept */
#define HEAD_MAX ((size_t)16 << 10)      /* bytes of the reply's status line and headers */
#define SEND_MAX ((uint64_t)4 << 20)     /* bytes per send(2) */

struct dgfs_upload {
	pthread_mutex_t lock;
	pthread_cond_t cond;            /* avail grew, or the transfer ended */
	pthread_t th;
	int fd;                         /* the connection, or -1; closed by the thread */
	struct dgfs_peer peer;          /* owned: where the ps listens */
	char *url;                      /* owned: for messages */
	struct dg_buf head;             /* the request line and headers */
	const char *data;               /* borrowed: the writer's staging block */
	uint64_t nbytes;
	uint64_t avail;                 /* bytes [0, avail) of data are final */
	uint64_t sent;                  /* bytes of the body sent */
	bool aborted;                   /* the writer gave up: abort the transfer */
	bool done;                      /* the thread finished */
	bool started;                   /* the thread was created */
	bool stalled;                   /* the writer paused too long */
	long low_speed_s;               /* no byte moved for this long: give up */
	/* the outcome */
	int sys_errno;                  /* a transport failure (0: none) */
	const char *sys_what;           /* ... in which step */
	long http;                      /* the reply's status; 0: no reply */
	uint64_t version;               /* Dg-Version of the reply */
	struct dg_buf body;             /* the reply's body (error details) */
};

static void set_failure(struct dgfs_upload *u, const char *what, int e)
{
	if (!u->sys_errno) {
		u->sys_errno = e ? e : EIO;
		u->sys_what = what;
	}
}

/* Connect to the ps (fs/peer.c); an abort stops the wait. */
static bool upload_aborted(void *ud)
{
	struct dgfs_upload *u = ud;

	pthread_mutex_lock(&u->lock);
	bool stop = u->aborted;
	pthread_mutex_unlock(&u->lock);
	return stop;
}

static int connect_ps(struct dgfs_upload *u)
{
	const char *what = NULL;
	int e = 0;
	int fd = dgfs_peer_connect(&u->peer, u->low_speed_s, upload_aborted, u, &what, &e);

	if (fd < 0)
		set_failure(u, what, e);
	return fd;
}

/* Send n bytes at p; false with the failure set (or after an abort). */
static bool send_all(struct dgfs_upload *u, const char *p, size_t n, const char *what)
{
	while (n > 0) {
		ssize_t k = send(u->fd, p, n, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			set_failure(u, what, k < 0 ? (errno == EAGAIN ? ETIMEDOUT : errno) : EPIPE);
			return false;
		}
		p += k;
		n -= (size_t)k;
	}
	return true;
}

/* The body, as the writer makes it final: waits while it has not, but for
 * low_speed_s at most; a writer that pauses that long ends the stream (the
 * commit then sends the staged bytes in one PUT) instead of holding the ps's
 * connection until the ps drops it, which could fail the commit. */
static bool send_body(struct dgfs_upload *u)
{
	for (;;) {
		struct timespec deadline =
			dg_deadline_timespec(dg_deadline_in_ms((int64_t)u->low_speed_s * 1000));
		pthread_mutex_lock(&u->lock);
		while (!u->aborted && u->avail <= u->sent && u->sent < u->nbytes) {
			if (pthread_cond_timedwait(&u->cond, &u->lock, &deadline) == ETIMEDOUT &&
			    u->avail <= u->sent) {
				u->stalled = true;
				u->aborted = true;
			}
		}
		uint64_t from = u->sent, n = u->avail - u->sent;
		bool stop = u->aborted, all = u->sent == u->nbytes;
		pthread_mutex_unlock(&u->lock);
		if (stop) {
			set_failure(u, "send the body", ECANCELED);
			return false;
		}
		if (all)
			return true;
		/* bytes below avail are never written again while the upload
		 * lives (the writer aborts it first): sent without a lock */
		if (n > SEND_MAX)
			n = SEND_MAX;
		if (!send_all(u, u->data + from, (size_t)n, "send the body"))
			return false;
		pthread_mutex_lock(&u->lock);
		u->sent = from + n;
		pthread_mutex_unlock(&u->lock);
	}
}

/* Read the reply (the request asked for Connection: close): the status,
 * Dg-Version, and up to ERR_BODY_MAX bytes of the body. */
static void read_reply(struct dgfs_upload *u)
{
	char *buf = malloc(HEAD_MAX + 1);
	size_t len = 0;
	char *end = NULL;

	if (!buf) {
		set_failure(u, "read the reply", ENOMEM);
		return;
	}
	while (!end && len < HEAD_MAX) {
		ssize_t k = recv(u->fd, buf + len, HEAD_MAX - len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			set_failure(u, "read the reply", k < 0 ? (errno == EAGAIN ? ETIMEDOUT
									: errno) : ECONNRESET);
			free(buf);
			return;
		}
		len += (size_t)k;
		buf[len] = '\0';
		end = strstr(buf, "\r\n\r\n");
	}
	int code = 0;
	if (!end || sscanf(buf, "HTTP/%*d.%*d %d", &code) != 1 || code < 100) {
		set_failure(u, "read the reply", EPROTO);
		free(buf);
		return;
	}
	*end = '\0';
	uint64_t clen = UINT64_MAX;
	for (char *line = strstr(buf, "\r\n"); line; line = strstr(line, "\r\n")) {
		line += 2;
		size_t n = strcspn(line, "\r");
		if (strncasecmp(line, "dg-version:", 11) == 0)
			dg_wire_u64_parse(line + 11, n - 11, &u->version);
		else if (strncasecmp(line, "content-length:", 15) == 0)
			dg_wire_u64_parse(line + 15, n - 15, &clen);
	}
	/* the body: what came with the headers, then up to the limit */
	size_t have = len - (size_t)(end + 4 - buf);
	dg_buf_append(&u->body, end + 4, have, NULL);
	char chunk[4096];
	while (u->body.len < ERR_BODY_MAX && u->body.len < clen) {
		ssize_t k = recv(u->fd, chunk, sizeof chunk, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		dg_buf_append(&u->body, chunk, (size_t)k, NULL);
	}
	u->http = code;
	free(buf);
}

static void *upload_main(void *arg)
{
	struct dgfs_upload *u = arg;
	int fd = connect_ps(u);

	pthread_mutex_lock(&u->lock);
	u->fd = fd;
	bool go = fd >= 0 && !u->aborted;
	pthread_mutex_unlock(&u->lock);
	if (go && send_all(u, u->head.data, u->head.len, "send the request") && send_body(u))
		read_reply(u);
	else if (go && (u->sys_errno == EPIPE || u->sys_errno == ECONNRESET))
		read_reply(u);  /* a ps that answered early (and closed) says why */
	pthread_mutex_lock(&u->lock);
	if (u->fd >= 0)
		close(u->fd);
	u->fd = -1;
	u->done = true;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	return NULL;
}

/* The request line and headers: those of dg_var_put (core/src/client.c)
 * plus the token. */
static enum dg_status build_head(struct dgfs_upload *u, const char *path, const char *token,
				 enum dg_dtype dt, const struct dg_shape *shape, uint64_t if_match,
				 struct dg_err *err)
{
	struct dg_wire_scratch ws;
	struct dg_http_header h[3];
	char tag[DG_WIRE_VERSION_LEN];
	int nh = dg_wire_request_headers(dt, shape, &ws, h);
	enum dg_status st = dg_buf_printf(&u->head, err,
		"PUT %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"
		"Content-Length: %" PRIu64 "\r\n", path, u->peer.authority, u->nbytes);

	for (int i = 0; st == DG_OK && i < nh; i++)
		st = dg_buf_printf(&u->head, err, "%s: %s\r\n", h[i].name, h[i].value);
	dg_wire_etag_format(if_match, tag);
	if (st == DG_OK && if_match)
		st = dg_buf_printf(&u->head, err, "If-Match: %s\r\n", tag);
	if (st == DG_OK && token)
		st = dg_buf_printf(&u->head, err, "Authorization: Bearer %s\r\n", token);
	if (st == DG_OK)
		st = dg_buf_printf(&u->head, err, "\r\n");
	return st;
}

struct dgfs_upload *dgfs_upload_start(struct dgfs *fs, int task, const char *name,
				      enum dg_dtype dt, const struct dg_shape *shape,
				      const char *data, uint64_t nbytes, uint64_t if_match,
				      struct dg_err *err)
{
	struct dgfs_upload *u = calloc(1, sizeof *u);
	struct dg_buf path = { 0 };
	enum dg_status st;

	if (!u) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&u->lock, NULL);
	dg_cond_init_mono(&u->cond);            /* send_body's deadline is monotonic */
	u->fd = -1;
	u->data = data;
	u->nbytes = nbytes;
	u->low_speed_s = fs->timeout_ms > 1000 ? fs->timeout_ms / 1000 : 1;
	st = dgfs_peer_parse(&u->peer, fs->tasks[task].address, err);
	if (st == DG_OK)
		st = dg_var_path(name, &path, err);
	if (st == DG_OK)
		st = build_head(u, path.data, fs->cfg.token, dt, shape, if_match, err);
	if (st == DG_OK)
		st = dg_buf_printf(&u->body, err, "http://%s%s", u->peer.authority, path.data);
	if (st == DG_OK && !(u->url = dg_buf_steal(&u->body, NULL)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	dg_buf_deinit(&path);
	if (st != DG_OK) {
		dgfs_upload_abort(u);
		return NULL;
	}
	if (pthread_create(&u->th, NULL, upload_main, u) != 0) {
		dg_err_set(err, DG_ENOMEM, "cannot start a thread to upload vars/%s", name);
		dgfs_upload_abort(u);
		return NULL;
	}
	u->started = true;
	return u;
}

/* Let the body go up to avail. */
static void set_avail(struct dgfs_upload *u, uint64_t avail)
{
	pthread_mutex_lock(&u->lock);
	if (avail > u->avail && avail <= u->nbytes) {
		u->avail = avail;
		pthread_cond_broadcast(&u->cond);
	}
	pthread_mutex_unlock(&u->lock);
}

void dgfs_upload_avail(struct dgfs_upload *u, uint64_t avail)
{
	/* The last byte goes only at finish: a complete body would make the ps
	 * apply the value before the writer's close (and a rewrite after that
	 * would make a second version). */
	set_avail(u, avail < u->nbytes ? avail : u->nbytes - 1);
}

bool dgfs_upload_covers(struct dgfs_upload *u, uint64_t off)
{
	pthread_mutex_lock(&u->lock);
	bool fed = off < u->avail;
	pthread_mutex_unlock(&u->lock);
	return fed;
}

/* Stop the thread (if it runs) and free everything. */
static void upload_free(struct dgfs_upload *u, bool started)
{
	if (started)
		pthread_join(u->th, NULL);
	dgfs_peer_free(&u->peer);
	free(u->url);
	dg_buf_deinit(&u->head);
	dg_buf_deinit(&u->body);
	pthread_cond_destroy(&u->cond);
	pthread_mutex_destroy(&u->lock);
	free(u);
}

void dgfs_upload_abort(struct dgfs_upload *u)
{
	if (!u)
		return;
	pthread_mutex_lock(&u->lock);
	u->aborted = true;
	/* wake a send(2) or recv(2) that waits on the ps: the ps sees a body
	 * cut short and changes nothing */
	if (u->fd >= 0)
		shutdown(u->fd, SHUT_RDWR);
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	upload_free(u, u->started);
}

/* An HTTP error reply as a dg error (the ps's JSON error when it is one). */
static enum dg_status reply_error(const struct dgfs_upload *u, struct dg_err *err)
{
	json_t *j = json_loadb(u->body.data ? u->body.data : "", u->body.len, 0, NULL);
	const char *code = NULL, *msg = NULL, *hint = NULL;
	enum dg_status st = DG_EINTERNAL;

	if (j && json_unpack(json_object_get(j, "error"), "{s:s,s?s,s?s}", "code", &code,
			     "message", &msg, "hint", &hint) == 0)
		st = dg_status_from_name(code);
	if (st == DG_OK || !code)
		st = u->http == 409 || u->http == 412 ? DG_ECONFLICT
		   : u->http == 404 ? DG_ENOTFOUND
		   : u->http == 413 ? DG_ETOOLARGE
		   : u->http == 401 || u->http == 403 ? DG_EUNAUTHORIZED
		   : u->http >= 400 && u->http < 500 ? DG_EINVAL : DG_EIO;
	dg_err_set(err, st, "PUT %s: %s", u->url, msg && *msg ? msg : code ? code : "HTTP error");
	if (hint && *hint)
		dg_err_hint(err, "%s", hint);
	json_decref(j);
	return st;
}

enum dg_status dgfs_upload_finish(struct dgfs_upload *u, uint64_t *version, bool *retry,
				  struct dg_err *err)
{
	enum dg_status st;

	*retry = false;
	set_avail(u, u->nbytes);
	pthread_mutex_lock(&u->lock);
	while (!u->done)
		pthread_cond_wait(&u->cond, &u->lock);
	bool all_sent = u->sent == u->nbytes;
	pthread_mutex_unlock(&u->lock);
	if (u->http >= 200 && u->http < 300 && all_sent) {
		*version = u->version;
		if (!*version) {        /* as dg_var_put: else the JSON "version" */
			json_t *j = json_loadb(u->body.data ? u->body.data : "", u->body.len, 0,
					       NULL);
			*version = (uint64_t)json_integer_value(json_object_get(j, "version"));
			json_decref(j);
		}
		st = DG_OK;
	} else if (u->http >= 300) {
		st = reply_error(u, err);       /* the ps's answer (to the body, or early) */
	} else if (!all_sent) {
		/* the stream broke before the body was complete: the ps changed
		 * nothing; the caller sends the staged bytes again in one PUT */
		*retry = true;
		st = dg_err_set(err, DG_EUNAVAILABLE, "PUT %s: cannot %s: %s", u->url,
				u->sys_what ? u->sys_what : "send the body",
				strerror(u->sys_errno ? u->sys_errno : EIO));
	} else {
		st = dg_err_set(err, u->sys_errno == ETIMEDOUT ? DG_ETIMEOUT : DG_EUNAVAILABLE,
				"PUT %s: no reply: cannot %s: %s", u->url,
				u->sys_what ? u->sys_what : "read the reply",
				strerror(u->sys_errno ? u->sys_errno : EIO));
	}
	upload_free(u, true);
	return st;
}
