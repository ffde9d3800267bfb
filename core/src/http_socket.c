/* Plain TCP sockets to a dg server, for the two transfers of http_client.c
 * where libcurl's buffer would cost a copy of every byte: the GET received
 * straight into the caller's buffer (dg_http_get_into) and the PUT sent from
 * the caller's memory as it becomes final (dg_http_put_from, the mount's
 * streaming writes). Addresses are read as dg_http_client_new reads them. No
 * HTTP here: only the address, the connection, and sends and receives that a
 * stop descriptor can end. */
#include "dg/http.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#define CONNECT_MS 5000

enum dg_status dg_http_addr_parse(const char *addr, struct dg_http_addr *out, struct dg_err *err)
{
	const char *sep = strstr(addr, "://");

	*out = (struct dg_http_addr){ 0 };
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
			return dg_err_set(err, DG_EINVAL, "the address '%s' lacks a ']'", addr);
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
		return dg_err_set(err, DG_EINVAL, "the address '%s' has no host or port", addr);
	out->authority = strndup(addr, n);
	out->host = strndup(h, (size_t)(he - h));
	out->port = strndup(port, plen);
	if (!out->authority || !out->host || !out->port) {
		dg_http_addr_free(out);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return DG_OK;
}

void dg_http_addr_free(struct dg_http_addr *a)
{
	free(a->host);
	free(a->port);
	free(a->authority);
	*a = (struct dg_http_addr){ 0 };
}

/* Wait for a non-blocking connect in 100 ms slices (stop may end it early).
 * 0 when connected, else an errno. */
static int connect_wait(int fd, bool (*stop)(void *), void *ud)
{
	struct pollfd pf = { .fd = fd, .events = POLLOUT };
	socklen_t len = sizeof(int);
	int pr = 0, err = ETIMEDOUT;

	for (int waited = 0; waited < CONNECT_MS && pr == 0; waited += 100) {
		if (stop && stop(ud))
			return ECANCELED;
		pr = poll(&pf, 1, 100);
		if (pr < 0 && errno == EINTR)
			pr = 0;
	}
	if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		err = errno;
	else if (pr < 0)
		err = errno;
	return err;
}

int dg_http_connect(const struct dg_http_addr *a, long io_timeout_s, bool (*stop)(void *),
		    void *ud, const char **what, int *e)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai;
	int rc = getaddrinfo(a->host, a->port, &hints, &ai), fd = -1, err = ECONNREFUSED;

	if (rc != 0) {
		*what = "resolve the server's address";
		*e = rc == EAI_SYSTEM ? errno : EHOSTUNREACH;
		return -1;
	}
	for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			    p->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		err = connect(fd, p->ai_addr, p->ai_addrlen) == 0 ? 0 : errno;
		/* in slices, so that a stop (an abort under the mount's handle lock, a
		 * reader's close) need not wait for a slow accept */
		if (err == EINPROGRESS)
			err = connect_wait(fd, stop, ud);
		if (err != 0) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd < 0) {
		*what = "connect to the server";
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
		*what = "connect to the server";
		*e = errno;
		close(fd);
		return -1;
	}
	return fd;
}

/* Wait until fd is ready for events, for timeout_ms at most (ETIMEDOUT), or
 * until stop_fd is readable (ECANCELED). 0 when fd is ready. */
static int wait_ready(int fd, short events, int stop_fd, long timeout_ms)
{
	struct pollfd pf[2] = { { .fd = fd, .events = events }, { .fd = stop_fd, .events = POLLIN } };

	for (;;) {
		int pr = poll(pf, 2, timeout_ms > INT_MAX ? INT_MAX : (int)timeout_ms);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return errno;
		if (pr == 0)
			return ETIMEDOUT;
		if (pf[1].revents)
			return ECANCELED;
		return 0;               /* ready, or an error the next call reports */
	}
}

ssize_t dg_http_send_some(int fd, const void *p, size_t n, int stop_fd, long timeout_ms, int *e)
{
	int flags = MSG_NOSIGNAL | (stop_fd >= 0 ? MSG_DONTWAIT : 0);

	for (;;) {
		ssize_t k = send(fd, p, n, flags);
		if (k > 0)
			return k;
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN && stop_fd >= 0) {
			if ((*e = wait_ready(fd, POLLOUT, stop_fd, timeout_ms)) != 0)
				return -1;
			continue;
		}
		*e = k < 0 ? (errno == EAGAIN ? ETIMEDOUT : errno) : EPIPE;
		return -1;
	}
}

ssize_t dg_http_recv_some(int fd, void *p, size_t n, int stop_fd, long timeout_ms, int *e)
{
	int flags = stop_fd >= 0 ? MSG_DONTWAIT : 0;

	for (;;) {
		ssize_t k = recv(fd, p, n, flags);
		if (k > 0)
			return k;
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN && stop_fd >= 0) {
			if ((*e = wait_ready(fd, POLLIN, stop_fd, timeout_ms)) != 0)
				return -1;
			continue;
		}
		*e = k < 0 ? (errno == EAGAIN ? ETIMEDOUT : errno) : ECONNRESET;
		return -1;
	}
}

bool dg_http_send_all(int fd, const void *p, size_t n, int stop_fd, long timeout_ms, int *e)
{
	const char *c = p;

	while (n > 0) {
		ssize_t k = dg_http_send_some(fd, c, n, stop_fd, timeout_ms, e);
		if (k < 0)
			return false;
		c += k;
		n -= (size_t)k;
	}
	return true;
}
