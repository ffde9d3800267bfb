/* A streaming PUT for the mount's replacing writers (doc/filesystem.md,
 * "Writing"): the request starts at the first write at offset 0 and its body
 * is fed from the handle's staging block as the writes fill it, so the
 * transfer overlaps the writer instead of starting at close. The body has a
 * Content-Length of the tensor's nbytes: the ps replaces the value only once
 * that whole body arrived (an aborted upload changes nothing). dg/http.h has
 * no upload from a callback, hence libcurl directly here. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "dg/http.h"
#include "dg/log.h"
#include "dg/tensor.h"
#include "fs.h"

#define ERR_BODY_MAX ((size_t)64 << 10)  /* bytes of an error reply kept */

struct dgfs_upload {
	pthread_mutex_t lock;
	pthread_cond_t cond;            /* avail grew, or the transfer ended */
	pthread_t th;
	CURL *h;
	struct curl_slist *headers;
	char *url;
	const char *data;               /* borrowed: the writer's staging block */
	uint64_t nbytes;
	uint64_t avail;                 /* bytes [0, avail) of data are final */
	uint64_t sent;                  /* bytes given to curl */
	bool aborted;                   /* the writer gave up: abort the transfer */
	bool done;                      /* the thread finished */
	bool started;                   /* the thread was created */
	bool stalled;                   /* on_read gave up: the writer paused too long */
	long low_speed_s;               /* no byte moved for this long: give up */
	/* the outcome */
	CURLcode rc;
	long http;
	uint64_t version;               /* Dg-Version of the reply */
	struct dg_buf body;             /* the reply's body (error details) */
};

/* The body, as the writer makes it final; waits while it has not, but for
 * low_speed_s at most: curl's own low-speed check cannot run while this
 * callback blocks, so a writer that pauses that long ends the stream here
 * (the commit then sends the staged bytes in one PUT) instead of holding the
 * ps's connection until the ps drops it, which could fail the commit. */
static size_t on_read(char *out, size_t size, size_t n, void *ud)
{
	struct dgfs_upload *u = ud;
	size_t want = size * n, got = 0;
	struct timespec deadline;

	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += u->low_speed_s;
	pthread_mutex_lock(&u->lock);
	while (!u->aborted && u->avail <= u->sent) {
		if (pthread_cond_timedwait(&u->cond, &u->lock, &deadline) == ETIMEDOUT &&
		    u->avail <= u->sent) {
			u->stalled = true;
			u->aborted = true;
		}
	}
	if (!u->aborted) {
		uint64_t left = u->avail - u->sent;
		got = left < want ? (size_t)left : want;
	}
	uint64_t from = u->sent;
	u->sent += got;
	bool aborted = u->aborted;
	pthread_mutex_unlock(&u->lock);
	if (aborted)
		return CURL_READFUNC_ABORT;
	/* bytes below avail are never written again while the upload lives
	 * (the writer aborts it first), so the copy needs no lock */
	memcpy(out, u->data + from, got);
	return got;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
	struct dgfs_upload *u = ud;
	size_t len = size * n;

	if (u->body.len < ERR_BODY_MAX)
		dg_buf_append(&u->body, p, len < ERR_BODY_MAX ? len : ERR_BODY_MAX, NULL);
	return len;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
	struct dgfs_upload *u = ud;
	size_t len = size * n;
	static const char key[] = "dg-version:";

	if (len > sizeof key - 1 && strncasecmp(p, key, sizeof key - 1) == 0)
		u->version = strtoull(p + sizeof key - 1, NULL, 10);
	return len;
}

/* Aborts the transfer once the writer gave up (curl calls this about once a
 * second even while it waits in on_read's caller, and while it waits for the
 * reply). */
static int on_progress(void *ud, curl_off_t dlt, curl_off_t dln, curl_off_t ult,
		       curl_off_t uln)
{
	struct dgfs_upload *u = ud;

	pthread_mutex_lock(&u->lock);
	bool aborted = u->aborted;
	pthread_mutex_unlock(&u->lock);
	return aborted ? 1 : 0;
}

static void *upload_main(void *arg)
{
	struct dgfs_upload *u = arg;
	CURLcode rc = curl_easy_perform(u->h);
	long http = 0;

	curl_easy_getinfo(u->h, CURLINFO_RESPONSE_CODE, &http);
	pthread_mutex_lock(&u->lock);
	u->rc = rc;
	u->http = http;
	u->done = true;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	return NULL;
}

/* Headers of the PUT: those of dg_var_put (core/src/client.c) plus the token. */
static enum dg_status build_headers(struct dgfs_upload *u, const char *token,
				    enum dg_dtype dt, const struct dg_shape *shape,
				    uint64_t if_match, struct dg_err *err)
{
	char line[512], dims[256] = "";
	size_t off = 0;
	const char *fixed[] = { "Expect:", "Content-Type: application/octet-stream" };

	for (int i = 0; i < shape->ndim && off < sizeof dims; i++)
		off += (size_t)snprintf(dims + off, sizeof dims - off, "%s%" PRId64, i ? "," : "",
					shape->dim[i]);
	for (size_t i = 0; i < 2; i++)
		if (!(u->headers = curl_slist_append(u->headers, fixed[i])))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < 4; i++) {
		if (i == 0)
			snprintf(line, sizeof line, "Dg-Dtype: %s", dg_dtype_name(dt));
		else if (i == 1)
			snprintf(line, sizeof line, "Dg-Shape: %s", shape->ndim ? dims : "[]");
		else if (i == 2 && if_match)
			snprintf(line, sizeof line, "If-Match: \"%" PRIu64 "\"", if_match);
		else if (i == 3 && token)
			snprintf(line, sizeof line, "Authorization: Bearer %s", token);
		else
			continue;
		struct curl_slist *l = curl_slist_append(u->headers, line);
		if (!l)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		u->headers = l;
	}
	return DG_OK;
}

struct dgfs_upload *dgfs_upload_start(struct dgfs *fs, int task, const char *name,
				      enum dg_dtype dt, const struct dg_shape *shape,
				      const char *data, uint64_t nbytes, uint64_t if_match,
				      struct dg_err *err)
{
	struct dgfs_upload *u = calloc(1, sizeof *u);
	struct dg_buf path = { 0 };
	const char *addr = fs->tasks[task].address;
	enum dg_status st;

	if (!u) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	pthread_condattr_t ca;

	pthread_mutex_init(&u->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);         /* on_read's deadline */
	pthread_cond_init(&u->cond, &ca);
	pthread_condattr_destroy(&ca);
	u->data = data;
	u->nbytes = nbytes;
	u->low_speed_s = fs->timeout_ms > 1000 ? fs->timeout_ms / 1000 : 1;
	st = dg_buf_printf(&path, err, "%s%s/v1/vars/",
			   strncmp(addr, "http://", 7) ? "http://" : "", addr);
	if (st == DG_OK)
		st = dg_http_escape_path(name, &path, err);
	if (st == DG_OK)
		st = build_headers(u, fs->cfg.token, dt, shape, if_match, err);
	if (st == DG_OK && !(u->h = curl_easy_init()))
		st = dg_err_set(err, DG_ENOMEM, "cannot start an upload of vars/%s", name);
	if (st != DG_OK) {
		dg_buf_deinit(&path);
		dgfs_upload_abort(u);
		return NULL;
	}
	u->url = dg_buf_steal(&path, NULL);
	curl_easy_setopt(u->h, CURLOPT_URL, u->url);
	curl_easy_setopt(u->h, CURLOPT_HTTPHEADER, u->headers);
	curl_easy_setopt(u->h, CURLOPT_UPLOAD, 1L);
	curl_easy_setopt(u->h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)nbytes);
	curl_easy_setopt(u->h, CURLOPT_READFUNCTION, on_read);
	curl_easy_setopt(u->h, CURLOPT_READDATA, u);
	curl_easy_setopt(u->h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(u->h, CURLOPT_WRITEDATA, u);
	curl_easy_setopt(u->h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(u->h, CURLOPT_HEADERDATA, u);
	curl_easy_setopt(u->h, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(u->h, CURLOPT_XFERINFODATA, u);
	curl_easy_setopt(u->h, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(u->h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(u->h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
	/* a writer that stalls (or a ps that hangs) for --timeout ends the
	 * stream; the commit then falls back to one PUT of the staged bytes */
	curl_easy_setopt(u->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(u->h, CURLOPT_LOW_SPEED_TIME, u->low_speed_s);
	curl_easy_setopt(u->h, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);     /* curl's most */
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
	if (u->h)
		curl_easy_cleanup(u->h);
	curl_slist_free_all(u->headers);
	free(u->url);
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
	if (u->rc == CURLE_OK && u->http >= 200 && u->http < 300) {
		*version = u->version;
		if (!*version) {        /* as dg_var_put: else the JSON "version" */
			json_t *j = json_loadb(u->body.data ? u->body.data : "", u->body.len, 0,
					       NULL);
			*version = (uint64_t)json_integer_value(json_object_get(j, "version"));
			json_decref(j);
		}
		st = DG_OK;
	} else if (u->rc == CURLE_OK) {
		st = reply_error(u, err);       /* the ps's answer to the whole body */
	} else if (!all_sent) {
		/* the stream broke before the body was complete: the ps changed
		 * nothing; the caller sends the staged bytes again in one PUT */
		*retry = true;
		st = dg_err_set(err, DG_EUNAVAILABLE, "PUT %s: %s", u->url,
				curl_easy_strerror(u->rc));
	} else {
		st = dg_err_set(err, u->rc == CURLE_OPERATION_TIMEDOUT ? DG_ETIMEOUT
				: DG_EUNAVAILABLE, "PUT %s: no reply: %s", u->url,
				curl_easy_strerror(u->rc));
	}
	upload_free(u, true);
	return st;
}
