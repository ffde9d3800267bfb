/* The mount's own HTTP/1.1 on a plain socket, for the two transfers where
 * libcurl's buffer costs a copy of every byte: the streaming PUT of large
 * writes (fs/upload.c) and the GET of a cold read, whose body is received
 * straight into the handle's buffer here (libcurl receives into its own
 * buffer and hands the bytes to a callback that must copy them). Only a plain
 * 200 with Content-Length is taken, and a 404 is reported as such; anything
 * else makes the caller use the libcurl path (dg/client.h), which reports
 * errors properly. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "dg/buf.h"
#include "dg/http.h"
#include "dg/wire.h"
#include "fs.h"

#define CONNECT_MS 5000
#define HEAD_MAX ((size_t)16 << 10)      /* bytes of a reply's status line and headers */
#define RECV_MAX ((size_t)4 << 20)       /* bytes per recv(2) of a body */

enum dg_status dgfs_peer_parse(struct dgfs_peer *p, const char *addr, struct dg_err *err)
{
	const char *sep = strstr(addr, "://");
	if (sep && sep - addr == 4 && strncasecmp(addr, "http", 4) == 0)
		addr = sep + 3;
	size_t n = strlen(addr);
	while (n && addr[n - 1] == '/')
		n--;
	const char *h = addr, *he = addr + n, *port = "80";
	size_t plen = 2;
	if (n && *h == '[') {
		const char *rb = memchr(h, ']', n);
		if (!rb)
			return dg_err_set(err, DG_EINVAL, "the ps address '%s' lacks a ']'", addr);
		if (rb + 1 < he && rb[1] == ':') {
			port = rb + 2;
			plen = (size_t)(he - port);
		}
		h++;
		he = rb;
	} else {
		const char *colon = n ? memrchr(h, ':', n) : NULL;
		/* one colon: host:port; more: a bare IPv6 address without a port */
		if (colon && !memchr(h, ':', (size_t)(colon - h))) {
			port = colon + 1;
			plen = (size_t)(he - port);
			he = colon;
		}
	}
	if (he == h || plen == 0)
		return dg_err_set(err, DG_EINVAL, "the ps address '%s' has no host or port", addr);
	p->authority = strndup(addr, n);
	p->host = strndup(h, (size_t)(he - h));
	p->port = strndup(port, plen);
	if (!p->authority || !p->host || !p->port) {
		dgfs_peer_free(p);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return DG_OK;
}

void dgfs_peer_free(struct dgfs_peer *p)
{
	free(p->host);
	free(p->port);
	free(p->authority);
	*p = (struct dgfs_peer){ 0 };
}

int dgfs_peer_connect(const struct dgfs_peer *p, long io_timeout_s, bool (*stop)(void *),
		      void *ud, const char **what, int *e)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai;
	int rc = getaddrinfo(p->host, p->port, &hints, &ai), fd = -1, err = ECONNREFUSED;

	if (rc != 0) {
		*what = "resolve the ps";
		*e = rc == EAI_SYSTEM ? errno : EHOSTUNREACH;
		return -1;
	}
	for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			    a->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		err = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
		if (err == EINPROGRESS) {
			/* in slices, so that a stop (an abort under the writer's
			 * handle lock, a reader's close) need not wait for a slow
			 * accept */
			struct pollfd pf = { .fd = fd, .events = POLLOUT };
			socklen_t len = sizeof err;
			int pr = 0;
			err = ETIMEDOUT;
			for (int waited = 0; waited < CONNECT_MS && pr == 0; waited += 100) {
				if (stop && stop(ud)) {
					err = ECANCELED;
					break;
				}
				pr = poll(&pf, 1, 100);
				if (pr < 0 && errno == EINTR)
					pr = 0;
			}
			if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
				err = errno;
			else if (pr < 0)
				err = errno;
		}
		if (err != 0) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd < 0) {
		*what = "connect to the ps";
		*e = err;
		return -1;
	}
	int one = 1, fl = fcntl(fd, F_GETFL);
	struct timeval tv = { .tv_sec = io_timeout_s };
	/* a request's last bytes go alone: no Nagle delay */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
		*what = "connect to the ps";
		*e = errno;
		close(fd);
		return -1;
	}
	return fd;
}

/* Send all n bytes; false on failure (errno set). */
static bool send_full(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (k == 0)
				errno = EPIPE;
			return false;
		}
		p += k;
		n -= (size_t)k;
	}
	return true;
}

/* The value of header name (with its colon, lower case) in the header block
 * [head, end), copied into out; false when absent or too long. */
static bool header(const char *head, const char *end, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name);

	for (const char *line = strstr(head, "\r\n"); line && line < end;
	     line = strstr(line, "\r\n")) {
		line += 2;
		if (strncasecmp(line, name, nl) != 0)
			continue;
		const char *v = line + nl, *ve = strstr(v, "\r\n");
		while (*v == ' ' || *v == '\t')
			v++;
		if (!ve || ve > end)
			ve = end;
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			ve--;
		if ((size_t)(ve - v) >= cap)
			return false;
		memcpy(out, v, (size_t)(ve - v));
		out[ve - v] = '\0';
		return true;
	}
	return false;
}

/* The reply's headers as a variable's info and the body's length: false when
 * it is not a plain 200 with Content-Length and the tensor headers. */
static bool plain_ok(const char *head, const char *end, const char *name,
		     struct dg_var_info *info, uint64_t *clen)
{
	char v[256];
	int code = 0;

	if (sscanf(head, "HTTP/1.%*d %d", &code) != 1 || code != 200)
		return false;
	if (header(head, end, "transfer-encoding:", v, sizeof v) ||
	    !header(head, end, "content-length:", v, sizeof v))
		return false;
	if (!dg_wire_u64_parse(v, strlen(v), clen))
		return false;
	struct dg_var_info i = { 0 };
	uint64_t step;
	int64_t numel;
	if (!header(head, end, "dg-dtype:", v, sizeof v) ||
	    dg_wire_dtype_parse(v, &i.dtype, NULL) != DG_OK ||
	    !header(head, end, "dg-shape:", v, sizeof v) ||
	    dg_wire_shape_parse(v, &i.shape, NULL) != DG_OK ||
	    dg_shape_numel(&i.shape, &numel, NULL) != DG_OK ||
	    !header(head, end, "dg-version:", v, sizeof v) ||
	    !dg_wire_u64_parse(v, strlen(v), &i.version))
		return false;
	i.step = header(head, end, "dg-step:", v, sizeof v) &&
		 dg_wire_u64_parse(v, strlen(v), &step) && step <= INT64_MAX ? (int64_t)step : -1;
	snprintf(i.name, sizeof i.name, "%s", name);
	i.bytes = (uint64_t)numel * dg_dtype_size(i.dtype);
	*info = i;
	return true;
}

enum dg_status dgfs_get_direct(struct dgfs *fs, int task, const char *name,
			       enum dg_encoding enc, const struct dgfs_direct_sink *sink,
			       void *ud, bool *delivered, struct dg_err *err)
{
	struct dgfs_peer peer = { 0 };
	struct dg_buf req = { 0 };
	char *head = NULL;
	const char *what = "send the request";
	int fd = -1, e = 0;
	enum dg_status st;

	*delivered = false;
	st = dgfs_peer_parse(&peer, fs->tasks[task].address, err);
	if (st == DG_OK)
		st = dg_buf_printf(&req, err, "GET /v1/vars/");
	if (st == DG_OK)
		st = dg_http_escape_path(name, &req, err);
	if (st == DG_OK)
		st = dg_buf_printf(&req, err, " HTTP/1.1\r\nHost: %s\r\nAccept: %s\r\n"
				   "Connection: close\r\n", peer.authority, dg_encoding_mime(enc));
	if (st == DG_OK && fs->cfg.token)
		st = dg_buf_printf(&req, err, "Authorization: Bearer %s\r\n", fs->cfg.token);
	if (st == DG_OK)
		st = dg_buf_printf(&req, err, "\r\n");
	if (st == DG_OK && !(head = malloc(HEAD_MAX + 1)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	if (st != DG_OK)
		goto out;
	long io_s = fs->timeout_ms > 1000 ? fs->timeout_ms / 1000 : 1;
	fd = dgfs_peer_connect(&peer, io_s, sink->stop, ud, &what, &e);
	if (fd < 0 || !send_full(fd, req.data, req.len)) {
		e = fd < 0 ? e : errno;
		goto fail;
	}
	/* the status line and headers; what follows them is the body's start */
	size_t len = 0;
	char *end = NULL;
	what = "read the reply";
	while (!end && len < HEAD_MAX) {
		ssize_t k = recv(fd, head + len, HEAD_MAX - len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			e = k < 0 ? (errno == EAGAIN ? ETIMEDOUT : errno) : ECONNRESET;
			goto fail;
		}
		len += (size_t)k;
		head[len] = '\0';
		end = strstr(head, "\r\n\r\n");
	}
	struct dg_var_info info;
	uint64_t clen = 0;
	int code = 0;
	if (end && sscanf(head, "HTTP/1.%*d %d", &code) == 1 && code == 404) {
		/* the reader asked the task the list named: the variable moved or
		 * went, which the caller handles (no second request to say so) */
		st = dg_err_set(err, DG_ENOTFOUND, "variable '%s' not found on http://%s", name,
				peer.authority);
		goto out;
	}
	if (!end || !plain_ok(head, end + 2, name, &info, &clen)) {
		st = dg_err_set(err, DG_EUNSUPPORTED, "not a plain 200 reply");
		goto out;
	}
	size_t have = len - (size_t)(end + 4 - head);
	char *dst = have <= clen ? sink->begin(ud, &info, clen) : NULL;
	*delivered = true;
	if (!dst) {
		st = dg_err_set(err, DG_ECANCELED, "the reader went away");
		goto out;
	}
	memcpy(dst, end + 4, have);
	uint64_t got = have;
	if (!sink->progress(ud, got)) {
		st = dg_err_set(err, DG_ECANCELED, "the reader went away");
		goto out;
	}
	while (got < clen) {
		size_t want = clen - got < RECV_MAX ? (size_t)(clen - got) : RECV_MAX;
		ssize_t k = recv(fd, dst + got, want, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			e = k < 0 ? (errno == EAGAIN ? ETIMEDOUT : errno) : ECONNRESET;
			goto fail;
		}
		got += (uint64_t)k;
		if (!sink->progress(ud, got)) {
			st = dg_err_set(err, DG_ECANCELED, "the reader went away");
			goto out;
		}
	}
	goto out;
fail:
	st = dg_err_set(err, e == ETIMEDOUT ? DG_ETIMEOUT : e == ECANCELED ? DG_ECANCELED
			: DG_EIO, "cannot %s for %s from http://%s: %s", what, name,
			peer.authority ? peer.authority : "?", strerror(e));
out:
	if (fd >= 0)
		close(fd);
	free(head);
	dg_buf_deinit(&req);
	dgfs_peer_free(&peer);
	return st;
}
