/* Write staging of `dg mount` (ops.h): a writer's bytes stay in its handle
 * until flush, fsync or release commits them as one PUT or PATCH (a
 * compare-and-set on the version seen at open unless -o overwrite). vars/
 * keeps the written ranges, sorted and merged, over the base read at open or
 * a staging block; a large replacing write streams its PUT while the writes
 * arrive (upload.c) and may have its payloads land in the staging block
 * straight from /dev/fuse (devio.c's landings); text/ and npy/ stage the
 * whole file. The read path is handle.c's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/codec.h"
#include "dg/log.h"
#include "ops.h"

/* --- writes ------------------------------------------------------------------ */

/* Record [a, b) in the sorted, merged range list (ranges neither overlap nor
 * touch: each is separated from the next by a gap). */
static int range_add(struct dgfs_handle *h, uint64_t a, uint64_t b)
{
	int i = 0, n = h->n_ranges;

	/* Fast path: sequential writers extend the last range. */
	if (n && h->ranges[n - 1].b == a) {
		h->ranges[n - 1].b = b;
		return 0;
	}
	/* ranges before i end before a; ranges i..j-1 overlap or touch [a, b) */
	while (i < n && h->ranges[i].b < a)
		i++;
	int j = i;
	while (j < n && h->ranges[j].a <= b) {
		if (h->ranges[j].a < a)
			a = h->ranges[j].a;
		if (h->ranges[j].b > b)
			b = h->ranges[j].b;
		j++;
	}
	if (j > i) {
		/* [a, b) replaces ranges i..j-1 */
		h->ranges[i] = (struct dgfs_range){ a, b };
		memmove(h->ranges + i + 1, h->ranges + j, (size_t)(n - j) * sizeof *h->ranges);
		h->n_ranges = n - (j - i - 1);
		return 0;
	}
	if (n == h->cap_ranges) {
		int cap = h->cap_ranges ? 2 * h->cap_ranges : 8;
		struct dgfs_range *g = realloc(h->ranges, (size_t)cap * sizeof *g);
		if (!g)
			return -ENOMEM;
		h->ranges = g;
		h->cap_ranges = cap;
	}
	memmove(h->ranges + i + 1, h->ranges + i, (size_t)(n - i) * sizeof *h->ranges);
	h->ranges[i] = (struct dgfs_range){ a, b };
	h->n_ranges = n + 1;
	return 0;
}

/* The raw bytes a vars/ handle stages into: the base it read, or its stage. */
static char *vars_data(const struct dgfs_handle *h)
{
	return h->stage ? h->stage : h->buf.data;
}

static uint64_t if_match(struct dgfs *fs, const struct dgfs_handle *h);

/* Stop the streaming PUT of h (the ps changes nothing); the staged bytes
 * commit with one PUT instead. */
static void upload_drop(struct dgfs_handle *h)
{
	dgfs_upload_abort(h->upload);
	h->upload = NULL;
}

/* A replacing writer of a large value starts its PUT at its first write at
 * offset 0 and feeds it the written prefix [0, b) of its first range. */
static void upload_feed(struct dgfs_handle *h, uint64_t off)
{
	if (!h->upload && !h->upload_tried && off == 0 && h->replace && !h->has_base &&
	    h->stage && h->info.bytes >= STREAM_MIN) {
		struct dg_err err = { 0 };
		h->upload_tried = true;
		h->upload = dgfs_upload_start(h->fs, h->task, h->p.name, h->info.dtype,
					      &h->info.shape, h->stage, h->info.bytes,
					      if_match(h->fs, h), &err);
		if (!h->upload)
			dg_log(DG_LOG_DEBUG, "fs", "vars/%s: no streaming PUT (%s); the write "
			       "commits at close", h->p.name, err.msg);
	}
	if (h->upload && h->n_ranges && h->ranges[0].a == 0)
		dgfs_upload_avail(h->upload, h->ranges[0].b);
}

static int write_vars(struct dgfs_handle *h, const char *data, size_t size, off_t off)
{
	uint64_t end = (uint64_t)off + size;

	if (end > h->info.bytes) {
		dg_log(DG_LOG_WARN, "fs", "write vars/%s: bytes %" PRIu64 "..%" PRIu64 " past the "
		       "end of the tensor (%" PRIu64 " bytes); nothing of this file commits",
		       h->p.name, (uint64_t)off, end, h->info.bytes);
		return -EINVAL;
	}
	if (!h->has_base && !h->stage) {
		/* the staging block, uninitialised outside the written ranges */
		if (!(h->stage = dg_alloc_aligned(h->info.bytes)))
			return -ENOMEM;
	}
	/* bytes the stream may have sent change: it cannot take them back */
	if (h->upload && dgfs_upload_covers(h->upload, (uint64_t)off))
		upload_drop(h);
	int rc = range_add(h, (uint64_t)off, end);
	if (rc)
		return rc;
	if (dgfs_devio_landed(vars_data(h) + off, size))
		h->landed += size;
	else
		memcpy(vars_data(h) + off, data, size);
	h->dirty = true;
	upload_feed(h, (uint64_t)off);
	if (h->replace && h->stage && h->info.bytes >= STREAM_MIN && !atomic_load(&h->land_base)) {
		atomic_store(&h->land_size, h->info.bytes);
		atomic_store(&h->land_base, h->stage);
	}
	return (int)size;
}

/* A write request of fh just arrived (the mount's io, before any handler
 * sees it): the next one is expected right after it, and its payload may
 * land in the staging block there, when nothing was asked to be written
 * there yet. The file is open (its writer waits for the reply), so fh is a
 * live handle. */
static bool landing_seen(uint64_t fhv, uint64_t off, uint32_t size, struct dgfs_landing *next)
{
	struct dgfs_handle *h = (struct dgfs_handle *)(uintptr_t)fhv;
	uint64_t end = off + size, prev = atomic_load(&h->read_end);

	while (end > prev && !atomic_compare_exchange_weak(&h->read_end, &prev, end))
		;
	char *base = atomic_load(&h->land_base);
	uint64_t nb = atomic_load(&h->land_size);
	if (!base || end < prev || end >= nb || size == 0)
		return false;
	atomic_fetch_add(&h->refs, 1);
	/* any size: a writer's requests need not all be as large (a buffer
	 * that is not page aligned is sent as 1 MiB less its offset, then the
	 * rest) */
	*next = (struct dgfs_landing){ .fh = fhv, .off = end, .dst = base + end,
				       .len = nb - end < SIZE_MAX ? (size_t)(nb - end) : SIZE_MAX,
				       .obj = h };
	return true;
}

/* Still nothing asked for at l (no write past it was seen since)? */
static bool landing_valid(const struct dgfs_landing *l)
{
	const struct dgfs_handle *h = l->obj;

	return !atomic_load(&h->released) && atomic_load(&h->read_end) == l->off;
}

static void landing_put(void *obj)
{
	dgfs_handle_put(obj);
}

static const struct dgfs_landing_ops landing_ops = {
	.seen = landing_seen, .valid = landing_valid, .put = landing_put,
};

const struct dgfs_landing_ops *dgfs_landing_ops(void)
{
	return &landing_ops;
}

/* Room in a text/npy writer's buf for end bytes, growing geometrically
 * (streaming writers append). From 1 MiB on the block comes from
 * dg_alloc_aligned, whose kept large blocks spare a writer the page faults of
 * a fresh buffer (a quarter of the mount's CPU in a cp of a 256 MiB .npy);
 * an npy/ writer of an existing variable gets room for its whole .npy at
 * once, so a same-shape copy never moves the bytes. */
static int whole_reserve(struct dgfs_handle *h, uint64_t end)
{
	if (end + 1 <= h->buf.cap)
		return 0;
	uint64_t want = end;
	if (h->p.view == DGFS_NPY && h->info.bytes) {
		uint64_t whole = dg_npy_header_size(h->info.dtype, &h->info.shape) + h->info.bytes;
		if (whole > want)
			want = whole;
	}
	if (want < ((uint64_t)1 << 20) && !h->buf_aligned)
		return dg_buf_reserve(&h->buf, end - h->buf.len, NULL) == DG_OK ? 0 : -ENOMEM;
	if (want < 2 * (uint64_t)h->buf.cap)
		want = 2 * (uint64_t)h->buf.cap;
	char *p = dg_alloc_aligned(want + 1);
	if (!p)
		return -ENOMEM;
	if (h->buf.len)
		memcpy(p, h->buf.data, h->buf.len);
	if (h->buf_aligned)
		dg_free_aligned(h->buf.data);
	else
		dg_buf_deinit(&h->buf);
	h->buf.data = p;
	h->buf.cap = want + 1;
	h->buf_aligned = true;
	return 0;
}

static int write_whole(struct dgfs_handle *h, const char *data, size_t size, off_t off)
{
	uint64_t end = (uint64_t)off + size;

	if (end > ((uint64_t)1 << 36))
		return -EFBIG;
	if (end > h->buf.len) {
		size_t old = h->buf.len;
		if (whole_reserve(h, end) != 0)
			return -ENOMEM;
		h->buf.len = end;
		h->buf.data[end] = '\0';
		memset(h->buf.data + old, 0, (size_t)off > old ? (size_t)off - old : 0);
	}
	memcpy(h->buf.data + off, data, size);
	h->dirty = true;
	return (int)size;
}

/* A write of h (not read-only): staged under h->lock; a failed one spoils
 * the handle. */
int dgfs_stage_write(struct dgfs *fs, const char *path, struct dgfs_handle *h, const char *data,
		     size_t size, off_t off)
{
	int rc;

	pthread_mutex_lock(&h->lock);
	rc = h->spoiled ? -EINVAL : dgfs_handle_base_load(fs, path, h);
	if (rc == 0)
		rc = h->p.view == DGFS_VARS ? write_vars(h, data, size, off)
					    : write_whole(h, data, size, off);
	if (rc < 0 && !h->spoiled) {
		/* A tool that stops at this error must not commit what it wrote
		 * before it (dd would leave half a patch): the handle is spoiled. */
		h->spoiled = true;
		h->dirty = false;
		h->n_ranges = 0;
		upload_drop(h);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* --- commit ------------------------------------------------------------------------ */

static uint64_t if_match(struct dgfs *fs, const struct dgfs_handle *h)
{
	return fs->cfg.overwrite ? 0 : h->info.version;
}

/* vars/: one PUT (replacement) or one PATCH (the span of the written ranges). */
static enum dg_status commit_vars(struct dgfs *fs, struct dgfs_handle *h, struct dg_client *c,
				  uint64_t *version, struct dg_err *err)
{
	size_t esz = dg_dtype_size(h->info.dtype);
	uint64_t nb = h->info.bytes;

	if (h->replace && (h->n_ranges != 1 || h->ranges[0].a != 0 || h->ranges[0].b != nb)) {
		uint64_t got = 0;
		for (int i = 0; i < h->n_ranges; i++)
			got += h->ranges[i].b - h->ranges[i].a;
		upload_drop(h);         /* an incomplete body: the ps changes nothing */
		dg_err_set(err, DG_EINVAL, "vars/%s: %" PRIu64 " of the %" PRIu64 " bytes were "
			   "written; a replacing write must write all of them", h->p.name, got, nb);
		return DG_EINVAL;
	}
	for (int i = 0; i < h->n_ranges; i++) {
		if (h->ranges[i].a % esz || h->ranges[i].b % esz) {
			dg_err_set(err, DG_EINVAL, "vars/%s: bytes %" PRIu64 "..%" PRIu64
				   " leave a %s element half-written (elements are %zu bytes)",
				   h->p.name, h->ranges[i].a, h->ranges[i].b,
				   dg_dtype_name(h->info.dtype), esz);
			return DG_EINVAL;
		}
	}
	if (h->replace && h->upload) {
		struct dgfs_upload *u = h->upload;
		bool retry;
		h->upload = NULL;
		enum dg_status st = dgfs_upload_finish(u, version, &retry, err);
		if (!retry)
			return st;
		dg_log(DG_LOG_DEBUG, "fs", "vars/%s: the streaming PUT broke (%s); sending the "
		       "staged bytes in one PUT", h->p.name, err->msg);
		*err = (struct dg_err){ 0 };
	}
	if (h->replace) {
		struct dg_put_opts o = { .if_match = if_match(fs, h) };
		struct dg_tensor t = { .dtype = h->info.dtype, .shape = h->info.shape,
				       .nbytes = nb, .data = vars_data(h) };
		dg_shape_numel(&t.shape, &t.numel, NULL);
		return dg_var_put(c, h->p.name, &t, &o, version, err);
	}
	uint64_t a = h->ranges[0].a, b = h->ranges[h->n_ranges - 1].b;
	if (h->n_ranges > 1 && !h->has_base) {
		/* gaps between ranges: fill them from the version seen at open */
		struct dg_buf base = { 0 };
		struct dg_var_info v;
		enum dg_status st = dg_var_get_encoded(c, h->p.name, DG_ENC_RAW, &base, &v, err);
		if (st == DG_OK && v.version != h->info.version && !fs->cfg.overwrite)
			st = dg_err_set(err, DG_ECONFLICT, "vars/%s changed since it was opened "
					"(version %" PRIu64 ", now %" PRIu64 ")", h->p.name,
					h->info.version, v.version);
		if (st == DG_OK && base.len != nb)
			st = dg_err_set(err, DG_ECONFLICT, "vars/%s changed size", h->p.name);
		for (int i = 0; st == DG_OK && i + 1 < h->n_ranges; i++)
			memcpy(vars_data(h) + h->ranges[i].b, base.data + h->ranges[i].b,
			       h->ranges[i + 1].a - h->ranges[i].b);
		dg_buf_deinit(&base);
		if (st != DG_OK)
			return st;
	}
	return dg_var_patch(c, h->p.name, a, vars_data(h) + a, b - a, if_match(fs, h), version,
			    err);
}

/* npy/: the staged bytes must be one whole .npy. */
static enum dg_status check_npy(const struct dgfs_handle *h, struct dg_err *err)
{
	enum dg_dtype dt;
	struct dg_shape shape;
	size_t off;
	int64_t numel;
	enum dg_status st = dg_npy_parse_header(h->buf.data ? h->buf.data : "", h->buf.len, &dt,
						&shape, &off, err);

	if (st == DG_OK)
		st = dg_shape_numel(&shape, &numel, err);
	if (st == DG_OK && h->buf.len - off != (uint64_t)numel * dg_dtype_size(dt))
		st = dg_err_set(err, DG_EINVAL, "npy/%s.npy: %zu data bytes after the header, the "
				"header's dtype and shape need %" PRIu64, h->p.name,
				h->buf.len - off, (uint64_t)numel * dg_dtype_size(dt));
	if (st != DG_OK)
		dg_err_prefix(err, "npy/%s.npy is not a whole .npy file", h->p.name);
	return st;
}

/* Commit what h staged (h->lock held): one PUT or PATCH; the staged data is
 * spent either way. */
enum dg_status dgfs_stage_commit(struct dgfs *fs, struct dgfs_handle *h, struct dg_err *err)
{
	struct dg_client *c = NULL;
	uint64_t version = 0;
	enum dg_status st = DG_OK;

	if (h->p.view == DGFS_NPY)
		st = check_npy(h, err);
	if (st == DG_OK && h->created)
		st = dgfs_place_new(fs, &h->task, err);
	if (st == DG_OK && !(c = dgfs_client_get(fs, h->task, err)))
		st = err->code;
	if (st == DG_OK && h->p.view == DGFS_VARS) {
		st = commit_vars(fs, h, c, &version, err);
		if (st == DG_OK && h->landed)
			dg_log(DG_LOG_DEBUG, "fs", "vars/%s: committed; %" PRIu64 " of its %" PRIu64
			       " bytes were received in place", h->p.name, h->landed,
			       h->info.bytes);
		h->landed = 0;
	} else if (st == DG_OK) {
		struct dg_put_opts o = {
			.replace = h->p.view == DGFS_NPY,
			.create_only = h->created && !fs->cfg.overwrite,
			.if_match = h->created ? 0 : if_match(fs, h),
		};
		st = dg_var_put_encoded(c, h->p.name, dgfs_view_enc(h->p.view),
					h->buf.data ? h->buf.data : "", h->buf.len, &o, &version,
					err);
	}
	dgfs_client_put(fs, h->task, c, st);
	if (st == DG_ECONFLICT && !err->hint[0])
		dg_err_hint(err, "another writer updated it since it was opened: reopen and write "
			    "again, or mount with -o overwrite");
	/* Success or not, the staged data is spent: a failed commit changes
	 * nothing and is not retried at release. */
	h->dirty = false;
	h->n_ranges = 0;
	if (h->created)
		dgfs_pending_remove(fs, h->p.view, h->p.name);
	if (st == DG_OK) {
		h->info.version = version;
		h->info.mtime = (double)time(NULL);
		h->replace = false;
		dgfs_prefix_forget_parents(fs, h->p.name);
	}
	h->created = false;
	dgfs_list_invalidate(fs);
	return st;
}

/* --- truncate ---------------------------------------------------------------- */

/* A truncate of writer h to size (h->lock held): only to 0 (the writes start
 * over) or, in vars/, to the size it has. */
int dgfs_stage_truncate(struct dgfs *fs, const char *path, struct dgfs_handle *h, off_t size)
{
	if (h->p.view == DGFS_VARS) {
		if ((uint64_t)size == h->info.bytes)
			return 0;
		if (size != 0)
			return -EINVAL;
		h->replace = true;
		h->dirty = true;
		h->n_ranges = 0;
		upload_drop(h);         /* the writes start over */
		h->upload_tried = false;
		return 0;
	}
	if (size == 0)
		h->base_pending = false;
	int rc = dgfs_handle_base_load(fs, path, h);
	if (rc)
		return rc;
	if ((size_t)size > h->buf.len)
		return -EINVAL;
	h->buf.len = (size_t)size;
	if (h->buf.data)
		h->buf.data[size] = '\0';
	h->dirty = true;
	return 0;
}
