/* Data reader ops: IdxReader (the IDX format of MNIST and Fashion-MNIST, plain
 * or gzip-compressed, read with zlib), NpyReader (a .npy file through the
 * codec of core/) and CsvReader (a table of numbers). All are source ops that output a whole dataset as one
 * tensor; shapes are read from the file's header at validation when the file
 * is there. Every header field is checked against the bytes actually present
 * before anything large is allocated. Registered via dg_ops_data. */
#include "cpu.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dg/codec.h"

#define IDX_TYPE_U8 0x08
#define IDX_MAX_HEADER (4 + 4 * DG_MAX_DIMS)
/* Largest dataset accepted: far above Fashion-MNIST (47 MB), far below what
 * a lying header could make us try to hold. */
#define IDX_MAX_BYTES ((int64_t)1 << 36)

struct idx_header {
	int ndim;
	int64_t dim[DG_MAX_DIMS];
	int64_t numel;
};

static const char *idx_type_name(int t)
{
	switch (t) {
	case 0x08: return "uint8";
	case 0x09: return "int8";
	case 0x0B: return "int16";
	case 0x0C: return "int32";
	case 0x0D: return "float32";
	case 0x0E: return "float64";
	default: return "unknown";
	}
}

/* A path that names a directory (or anything but a file) is the request's
 * mistake, not an I/O failure: DG_EINVAL. */
static enum dg_status plain_file(const char *path, const char *kind, struct dg_err *err)
{
	struct stat st;

	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
		return dg_err_set(err, DG_EINVAL, "%s path '%s' is not a file", kind, path);
	return DG_OK;
}

static gzFile idx_open(const char *path, struct dg_err *err)
{
	gzFile f;

	if (plain_file(path, "IDX", err) != DG_OK)
		return NULL;
	f = gzopen(path, "rb");

	if (!f) {
		dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO,
			   "cannot open IDX file '%s': %s", path,
			   errno ? strerror(errno) : "out of memory");
		if (errno == ENOENT)
			dg_err_hint(err, "Fashion-MNIST is in /usr/share/datasets/fashion-mnist "
				    "(Debian package dataset-fashion-mnist)");
	}
	return f;
}

/* Read up to n bytes of a reader's file (kind: "IDX", "CSV"); returns the
 * count, or -1 with *err set on a zlib error (a corrupt gzip stream). */
static int64_t gz_read(gzFile f, const char *kind, const char *path, void *buf, int64_t n,
		       struct dg_err *err)
{
	int64_t got = 0;

	while (got < n) {
		unsigned chunk = n - got > (1 << 30) ? 1u << 30 : (unsigned)(n - got);
		int r = gzread(f, (char *)buf + got, chunk);
		if (r < 0) {
			int zerr;
			const char *msg = gzerror(f, &zerr);
			dg_err_set(err, zerr == Z_ERRNO ? DG_EIO : DG_EINVAL,
				   "%s file '%s' is not a valid gzip stream: %s", kind, path,
				   zerr == Z_ERRNO ? strerror(errno) : msg);
			dg_err_hint(err, "a damaged file: get it again (gzip -t FILE checks it)");
			return -1;
		}
		if (r == 0)
			break;
		got += r;
	}
	return got;
}

/* Parse and check the header: magic 0x0000TTNN, type uint8 only, 1..8 dims,
 * the element count within IDX_MAX_BYTES. */
static enum dg_status idx_header_read(gzFile f, const char *path, struct idx_header *h,
				      struct dg_err *err)
{
	unsigned char b[IDX_MAX_HEADER];
	int64_t got = gz_read(f, "IDX", path, b, 4, err);

	if (got < 0)
		return err ? err->code : DG_EINVAL;
	if (got < 4 || b[0] != 0 || b[1] != 0) {
		dg_err_set(err, DG_EINVAL, "'%s' is not an IDX file: magic %02x%02x%02x%02x, "
			   "want 00000801 (labels) or 00000803 (images)", path,
			   got > 0 ? b[0] : 0, got > 1 ? b[1] : 0, got > 2 ? b[2] : 0,
			   got > 3 ? b[3] : 0);
		return DG_EINVAL;
	}
	if (b[2] != IDX_TYPE_U8) {
		dg_err_set(err, DG_EDTYPE, "IDX file '%s' holds type 0x%02X (%s); IdxReader reads "
			   "0x08 (uint8) only", path, b[2], idx_type_name(b[2]));
		dg_err_hint(err, "convert it to .npy and use NpyReader");
		return DG_EDTYPE;
	}
	h->ndim = b[3];
	if (h->ndim < 1 || h->ndim > DG_MAX_DIMS)
		return dg_err_set(err, DG_EINVAL, "IDX file '%s' declares %d dims; 1..%d are "
				  "supported", path, h->ndim, DG_MAX_DIMS);
	got = gz_read(f, "IDX", path, b + 4, 4 * h->ndim, err);
	if (got < 0)
		return err ? err->code : DG_EINVAL;
	if (got < 4 * h->ndim)
		return dg_err_set(err, DG_EINVAL, "truncated: IDX file '%s' ends inside its "
				  "header (%d dims need %d bytes)", path, h->ndim, 4 + 4 * h->ndim);
	h->numel = 1;
	for (int i = 0; i < h->ndim; i++) {
		const unsigned char *p = b + 4 + 4 * i;
		h->dim[i] = (int64_t)p[0] << 24 | (int64_t)p[1] << 16 | (int64_t)p[2] << 8 | p[3];
		/* Divide before multiplying: the product of two 32-bit dims and the
		 * running count could pass int64. */
		if (h->dim[i] > 0 && h->numel > IDX_MAX_BYTES / h->dim[i]) {
			dg_err_set(err, DG_ETOOLARGE, "IDX file '%s' declares more than %lld "
				   "elements (dim %d is %lld)", path, (long long)IDX_MAX_BYTES, i,
				   (long long)h->dim[i]);
			dg_err_hint(err, "the header is corrupt or the file is not a dataset");
			return DG_ETOOLARGE;
		}
		h->numel *= h->dim[i];
	}
	return DG_OK;
}

/* "60000 images of 28x28" / "10000 labels" / "5 items of 2x3x4". */
static void idx_describe(const struct idx_header *h, char *buf, size_t n)
{
	int len = snprintf(buf, n, "%lld %s", (long long)h->dim[0],
			   h->ndim == 1 ? "labels" : h->ndim == 3 ? "images of " : "items of ");
	for (int i = 1; i < h->ndim && len > 0 && (size_t)len < n; i++)
		len += snprintf(buf + len, n - (size_t)len, i > 1 ? "x%lld" : "%lld",
				(long long)h->dim[i]);
}

/* Read the whole payload (exactly h->numel bytes, checked both ways) into an
 * owned buffer. The buffer grows as data arrives, so a lying header costs no
 * more memory than the file really holds. */
static enum dg_status idx_payload(gzFile f, const char *path, const struct idx_header *h,
				  uint8_t **out, struct dg_err *err)
{
	int64_t cap = h->numel < (1 << 20) ? h->numel : (1 << 20), have = 0;
	uint8_t *buf = malloc((size_t)(cap > 0 ? cap : 1)), *nb;
	char what[160], extra;
	enum dg_status st = DG_OK;

	while (buf && have < h->numel) {
		if (have == cap) {
			cap = cap * 2 < h->numel ? cap * 2 : h->numel;
			nb = realloc(buf, (size_t)cap);
			if (!nb)
				break;
			buf = nb;
		}
		int64_t got = gz_read(f, "IDX", path, buf + have, cap - have, err);
		if (got < 0) {
			free(buf);
			return err ? err->code : DG_EINVAL;
		}
		if (got == 0)
			break;
		have += got;
	}
	if (!buf || (have < h->numel && have == cap)) {
		free(buf);
		return dg_err_set(err, DG_ENOMEM, "out of memory reading %lld bytes of '%s'",
				  (long long)h->numel, path);
	}
	idx_describe(h, what, sizeof what);
	if (have < h->numel) {
		st = dg_err_set(err, DG_EINVAL, "truncated: header of '%s' says %s (%lld bytes), "
				"file has %lld", path, what, (long long)h->numel, (long long)have);
	} else {
		int64_t more = gz_read(f, "IDX", path, &extra, 1, err);
		if (more < 0)
			st = err ? err->code : DG_EINVAL;
		else if (more > 0)
			st = dg_err_set(err, DG_EINVAL, "IDX file '%s' has more data than its "
					"header says (%s, %lld bytes)", path, what,
					(long long)h->numel);
	}
	if (st != DG_OK) {
		dg_err_hint(err, "the file is damaged or its counts are wrong; download it again");
		free(buf);
		return st;
	}
	*out = buf;
	return DG_OK;
}

static const struct dg_attr_spec idx_attrs[] = {
	{ "path", DG_ATTR_STRING, true, "IDX file, plain or gzip-compressed (.gz)" },
	{ "scale", DG_ATTR_BOOL, false, "uint8 -> float in [0,1] (x / 255); default false" },
	{ "one_hot", DG_ATTR_INT, false, "labels -> one-hot rows of this many classes; 0 (default) "
					 "keeps class indices" },
	{ "flatten", DG_ATTR_BOOL, false, "images [N,28,28] -> [N,784]; default false" },
	{ "dtype", DG_ATTR_DTYPE, false, "output dtype; default float32 with scale or one_hot, "
					 "else int32 for labels and uint8 for images" },
	{ 0 },
};

struct idx_opts {
	const char *path;
	bool scale, flatten;
	int64_t one_hot;
	bool has_dtype;
	enum dg_dtype dtype;
};

static enum dg_status idx_opts_read(struct dg_attrs attrs, struct idx_opts *o, struct dg_err *err)
{
	bool no = false;
	int64_t zero = 0;
	enum dg_status st = dg_attrs_string(attrs, "path", NULL, &o->path, err);

	if (st == DG_OK)
		st = dg_attrs_bool(attrs, "scale", &no, &o->scale, err);
	if (st == DG_OK)
		st = dg_attrs_bool(attrs, "flatten", &no, &o->flatten, err);
	if (st == DG_OK)
		st = dg_attrs_int(attrs, "one_hot", &zero, &o->one_hot, err);
	if (st != DG_OK)
		return st;
	if (o->one_hot < 0 || o->one_hot > 1000000)
		return dg_err_set(err, DG_EINVAL, "attr 'one_hot' is %lld; use 0 (off) or a class "
				  "count up to 1000000", (long long)o->one_hot);
	o->has_dtype = dg_attrs_get(attrs, "dtype") != NULL;
	if (o->has_dtype)
		return dg_attrs_dtype(attrs, "dtype", NULL, &o->dtype, err);
	return DG_OK;
}

/* Output dtype and shape from the options and the file's header. */
static enum dg_status idx_out_type(const struct idx_opts *o, const struct idx_header *h,
				   struct dg_ttype *t, struct dg_err *err)
{
	if (o->one_hot && h->ndim != 1)
		return dg_err_set(err, DG_EINVAL, "attr 'one_hot' applies to label files (1 dim); "
				  "'%s' has %d dims", o->path, h->ndim);
	t->dtype = o->has_dtype ? o->dtype
		 : o->scale || o->one_hot ? DG_F32 : h->ndim == 1 ? DG_I32 : DG_U8;
	if (o->scale && !dg_dtype_is_float(t->dtype))
		return dg_err_set(err, DG_EDTYPE, "attr 'scale' needs a float dtype, got %s",
				  dg_dtype_name(t->dtype));
	if (t->dtype == DG_BOOL)
		return dg_err_set(err, DG_EDTYPE, "IdxReader cannot output bool");
	t->shape.ndim = h->ndim;
	memcpy(t->shape.dim, h->dim, sizeof(int64_t) * (size_t)h->ndim);
	if (o->one_hot) {
		t->shape.ndim = 2;
		t->shape.dim[1] = o->one_hot;
	} else if (o->flatten && h->ndim > 2) {
		t->shape.ndim = 2;
		t->shape.dim[1] = 1;
		for (int i = 1; i < h->ndim; i++)
			t->shape.dim[1] *= h->dim[i];
	}
	return DG_OK;
}

/* At validation the header gives the shape; a file that is not there (yet)
 * leaves the shape unknown so graphs still validate on another machine. */
static enum dg_status idx_infer(struct dg_infer_ctx *c)
{
	struct idx_opts o;
	struct idx_header h;
	enum dg_status st = idx_opts_read(dg_attrs_of_json(c->attrs), &o, c->err);
	gzFile f;

	if (st != DG_OK)
		return st;
	f = gzopen(o.path, "rb");
	if (!f) {
		c->out[0].dtype = o.has_dtype ? o.dtype : o.scale || o.one_hot ? DG_F32 : DG_U8;
		c->out[0].shape.ndim = -1;
		return DG_OK;
	}
	st = idx_header_read(f, o.path, &h, c->err);
	gzclose(f);
	if (st != DG_OK)
		return st;
	return idx_out_type(&o, &h, &c->out[0], c->err);
}

static enum dg_status idx_fill(const struct idx_opts *o, const uint8_t *raw,
			       const struct idx_header *h, struct dg_tensor *t, struct dg_err *err)
{
	if (!o->one_hot) {
		double k = o->scale ? 1.0 / 255.0 : 1.0;
		if (t->dtype == DG_F32) {
			float *p = t->data;
			for (int64_t i = 0; i < h->numel; i++)
				p[i] = (float)(raw[i] * k);
		} else if (t->dtype == DG_U8) {
			memcpy(t->data, raw, (size_t)h->numel);
		} else {
			for (int64_t i = 0; i < h->numel; i++)
				dg_tensor_set_f64(t, i, raw[i] * k);
		}
		return DG_OK;
	}
	for (int64_t i = 0; i < h->numel; i++) {
		if (raw[i] >= o->one_hot) {
			dg_err_set(err, DG_EINVAL, "label %d (item %lld of '%s') is not below "
				   "one_hot = %lld", raw[i], (long long)i, o->path,
				   (long long)o->one_hot);
			dg_err_hint(err, "set attr 'one_hot' to the number of classes");
			return DG_EINVAL;
		}
		dg_tensor_set_f64(t, i * o->one_hot + raw[i], 1.0);
	}
	return DG_OK;
}

static enum dg_status idx_cpu(struct dg_kernel_ctx *c)
{
	struct idx_opts o;
	struct idx_header h;
	struct dg_ttype tt;
	uint8_t *raw = NULL;
	gzFile f = NULL;
	struct dg_tensor *t;
	enum dg_status st = idx_opts_read(c->attrs, &o, c->err);

	if (st != DG_OK)
		return st;
	f = idx_open(o.path, c->err);
	if (!f)
		return c->err ? c->err->code : DG_EIO;
	st = idx_header_read(f, o.path, &h, c->err);
	if (st == DG_OK)
		st = idx_out_type(&o, &h, &tt, c->err);
	if (st == DG_OK)
		st = idx_payload(f, o.path, &h, &raw, c->err);
	gzclose(f);
	if (st != DG_OK)
		return st;
	t = cpu_out_zero(c, 0, tt.dtype, &tt.shape);
	st = t ? idx_fill(&o, raw, &h, t, c->err) : (c->err ? c->err->code : DG_ENOMEM);
	free(raw);
	return st;
}

/* ------------------------------------------------------------------------ */
/* NpyReader                                                                   */

static const struct dg_attr_spec npy_attrs[] = {
	{ "path", DG_ATTR_STRING, true, ".npy file (little-endian, C order)" },
	{ "dtype", DG_ATTR_DTYPE, false, "the file's dtype; checked at run time; needed only "
					 "when the file is absent at validation" },
	{ 0 },
};

/* Read the header only: the first 64 KiB always hold it. */
static enum dg_status npy_peek(const char *path, struct dg_ttype *t, struct dg_err *err)
{
	static const size_t max = 65536;
	char *buf = malloc(max);
	FILE *f;
	size_t n, off;
	enum dg_status st;

	if (!buf)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	f = fopen(path, "rb");
	if (!f) {
		free(buf);
		return dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO,
				  "cannot open '%s': %s", path, strerror(errno));
	}
	n = fread(buf, 1, max, f);
	fclose(f);
	st = dg_npy_parse_header(buf, n, &t->dtype, &t->shape, &off, err);
	free(buf);
	if (st != DG_OK)
		dg_err_prefix(err, "'%s'", path);
	return st;
}

static enum dg_status npy_infer(struct dg_infer_ctx *c)
{
	const char *path;
	enum dg_status st = dg_attrs_string(dg_attrs_of_json(c->attrs), "path", NULL, &path, c->err);
	bool has_dt = dg_attrs_get(dg_attrs_of_json(c->attrs), "dtype") != NULL;

	if (st == DG_OK && has_dt)
		st = dg_attrs_dtype(dg_attrs_of_json(c->attrs), "dtype", NULL, &c->out[0].dtype, c->err);
	if (st != DG_OK)
		return st;
	if (has_dt) {
		struct dg_ttype t;
		struct dg_err ignore = { 0 };
		c->out[0].shape.ndim = -1;
		if (npy_peek(path, &t, &ignore) == DG_OK && t.dtype == c->out[0].dtype)
			c->out[0].shape = t.shape;
		return DG_OK;
	}
	st = npy_peek(path, &c->out[0], c->err);
	if (st != DG_OK)
		dg_err_hint(c->err, "give attr 'dtype' when the file only exists where the "
			    "graph runs");
	return st;
}

static enum dg_status npy_cpu(struct dg_kernel_ctx *c)
{
	const char *path;
	enum dg_status st = dg_attrs_string(c->attrs, "path", NULL, &path, c->err);
	struct dg_tensor *t;

	if (st != DG_OK)
		return st;
	t = dg_npy_read_file(path, c->err);
	if (!t)
		return c->err ? c->err->code : DG_EIO;
	if (dg_attrs_get(c->attrs, "dtype")) {
		enum dg_dtype want;
		st = dg_attrs_dtype(c->attrs, "dtype", NULL, &want, c->err);
		if (st == DG_OK && want != t->dtype)
			st = dg_err_set(c->err, DG_EDTYPE, "'%s' holds %s, attr 'dtype' says %s",
					path, dg_dtype_name(t->dtype), dg_dtype_name(want));
		if (st != DG_OK) {
			dg_tensor_free(t);
			return st;
		}
	}
	c->out[0] = t;
	return DG_OK;
}

/* ------------------------------------------------------------------------ */
/* ShardBatch                                                                  */

/* Stateless batching: the batch of a step is a pure function of (step, seed,
 * shard), so every worker can compute its own without coordination and a
 * restarted step reads the same examples. Shard k of n owns the examples
 * i with i % n == k; each epoch visits them in a fresh order (Fisher-Yates
 * driven by Philox from (seed, epoch, shard)); the last partial batch of an
 * epoch is dropped. */
static const struct dg_attr_spec shard_attrs[] = {
	{ "batch", DG_ATTR_INT, true, "examples per batch" },
	{ "shard", DG_ATTR_INT, false, "this worker's shard, 0..num_shards-1 (default 0)" },
	{ "num_shards", DG_ATTR_INT, false, "number of shards (workers); default 1" },
	{ "seed", DG_ATTR_INT, false, "shuffle seed; each epoch reshuffles from it (default 0)" },
	{ "shuffle", DG_ATTR_BOOL, false, "shuffle every epoch (default true); false keeps file "
					  "order" },
	{ 0 },
};

struct shard_opts {
	int64_t batch, shard, num_shards, seed;
	bool shuffle;
};

static enum dg_status shard_opts_read(struct dg_attrs attrs, struct shard_opts *o,
				      struct dg_err *err)
{
	int64_t zero = 0, one = 1;
	bool yes = true;
	enum dg_status st = dg_attrs_int(attrs, "batch", NULL, &o->batch, err);

	if (st == DG_OK)
		st = dg_attrs_int(attrs, "shard", &zero, &o->shard, err);
	if (st == DG_OK)
		st = dg_attrs_int(attrs, "num_shards", &one, &o->num_shards, err);
	if (st == DG_OK)
		st = dg_attrs_int(attrs, "seed", &zero, &o->seed, err);
	if (st == DG_OK)
		st = dg_attrs_bool(attrs, "shuffle", &yes, &o->shuffle, err);
	if (st != DG_OK)
		return st;
	if (o->batch < 1)
		return dg_err_set(err, DG_EINVAL, "attr 'batch' is %lld; it must be >= 1",
				  (long long)o->batch);
	if (o->num_shards < 1 || o->shard < 0 || o->shard >= o->num_shards)
		return dg_err_set(err, DG_EINVAL, "shard %lld of %lld: need 0 <= shard < "
				  "num_shards", (long long)o->shard, (long long)o->num_shards);
	return DG_OK;
}

static enum dg_status shard_infer(struct dg_infer_ctx *c)
{
	struct shard_opts o;
	enum dg_status st = shard_opts_read(dg_attrs_of_json(c->attrs), &o, c->err);

	if (st != DG_OK)
		return st;
	for (int i = 0; i < 2; i++) {
		c->out[i] = c->in[i];
		if (c->in[i].shape.ndim == 0)
			return dg_err_set(c->err, DG_ESHAPE, "input %d is a scalar; ShardBatch "
					  "batches along dim 0", i);
		if (c->out[i].shape.ndim > 0)
			c->out[i].shape.dim[0] = o.batch;
	}
	if (c->in[0].shape.ndim > 0 && c->in[1].shape.ndim > 0 && c->in[0].shape.dim[0] >= 0 &&
	    c->in[1].shape.dim[0] >= 0 && c->in[0].shape.dim[0] != c->in[1].shape.dim[0])
		return dg_err_set(c->err, DG_ESHAPE, "examples (%lld) and labels (%lld) differ in "
				  "dim 0", (long long)c->in[0].shape.dim[0],
				  (long long)c->in[1].shape.dim[0]);
	return DG_OK;
}

/* The shard's example order for one epoch: perm[j] indexes the shard. */
static void shard_perm(const struct shard_opts *o, uint64_t epoch, int64_t *perm, int64_t n)
{
	uint32_t key[2] = { (uint32_t)o->seed, (uint32_t)((uint64_t)o->seed >> 32) };

	for (int64_t j = 0; j < n; j++)
		perm[j] = j;
	for (int64_t j = n - 1; o->shuffle && j > 0; j--) {
		uint32_t ctr[4] = { (uint32_t)j, (uint32_t)((uint64_t)j >> 32), (uint32_t)epoch,
				    (uint32_t)o->shard }, r[4];
		cpu_philox4x32_10(ctr, key, r);
		int64_t k = (int64_t)((((uint64_t)r[1] << 32) | r[0]) % (uint64_t)(j + 1));
		int64_t t = perm[j];
		perm[j] = perm[k];
		perm[k] = t;
	}
}

/* The epoch's permutation is the same for every step of the epoch, so it is
 * computed once and kept: a training step then costs the batch's row copies,
 * not a shuffle of the whole shard. A few entries (workers in one process run
 * one replica each, evaluation readers do not shuffle), shared by reference
 * count so that a step still copying from an entry keeps it alive. */
#define PERM_CACHE 8

struct perm_entry {
	struct shard_opts o;
	uint64_t epoch;
	int64_t n;
	int refs;                      /* the cache's own reference + users */
	uint64_t used;                 /* LRU clock */
	int64_t perm[];
};

static pthread_mutex_t perm_mu = PTHREAD_MUTEX_INITIALIZER;
static struct perm_entry *perm_cache[PERM_CACHE];
static uint64_t perm_clock;

static bool perm_matches(const struct perm_entry *e, const struct shard_opts *o, uint64_t epoch,
			 int64_t n)
{
	return e && e->n == n && e->epoch == epoch && e->o.seed == o->seed &&
	       e->o.shard == o->shard && e->o.num_shards == o->num_shards &&
	       e->o.shuffle == o->shuffle;
}

static void perm_put(struct perm_entry *e)
{
	bool last;

	pthread_mutex_lock(&perm_mu);
	last = --e->refs == 0;
	pthread_mutex_unlock(&perm_mu);
	if (last)
		free(e);
}

/* The permutation of (o, epoch) over n examples, referenced (perm_put it) or
 * NULL when out of memory. */
static struct perm_entry *perm_get(const struct shard_opts *o, uint64_t epoch, int64_t n)
{
	struct perm_entry *e = NULL, *old = NULL;
	int slot = 0;

	pthread_mutex_lock(&perm_mu);
	for (int i = 0; i < PERM_CACHE; i++) {
		if (perm_matches(perm_cache[i], o, epoch, n)) {
			e = perm_cache[i];
			e->refs++;
			e->used = ++perm_clock;
			pthread_mutex_unlock(&perm_mu);
			return e;
		}
	}
	pthread_mutex_unlock(&perm_mu);
	e = malloc(sizeof *e + (size_t)n * sizeof e->perm[0]);
	if (!e)
		return NULL;
	*e = (struct perm_entry){ .o = *o, .epoch = epoch, .n = n, .refs = 2 };
	shard_perm(o, epoch, e->perm, n);
	pthread_mutex_lock(&perm_mu);
	e->used = ++perm_clock;
	for (int i = 0; i < PERM_CACHE; i++) {
		if (!perm_cache[i]) {
			slot = i;
			break;
		}
		if (perm_cache[i]->used < perm_cache[slot]->used)
			slot = i;
	}
	old = perm_cache[slot];
	if (old && --old->refs > 0)
		old = NULL;                    /* a step still uses it: its last user frees it */
	perm_cache[slot] = e;
	pthread_mutex_unlock(&perm_mu);
	free(old);
	return e;
}

/* Drop the cached permutations at exit, so leak checkers see none. */
__attribute__((destructor)) static void perm_cache_free(void)
{
	pthread_mutex_lock(&perm_mu);
	for (int i = 0; i < PERM_CACHE; i++) {
		struct perm_entry *e = perm_cache[i];
		perm_cache[i] = NULL;
		if (e && --e->refs == 0)
			free(e);
	}
	pthread_mutex_unlock(&perm_mu);
}

static enum dg_status shard_cpu(struct dg_kernel_ctx *c)
{
	struct shard_opts o;
	enum dg_status st = shard_opts_read(c->attrs, &o, c->err);
	int64_t n, n_shard, per_epoch;
	struct perm_entry *pe;

	if (st != DG_OK)
		return st;
	if (c->n_in != 2 || c->n_out != 2 || !c->in[0] || !c->in[1])
		return dg_err_set(c->err, DG_EINVAL, "ShardBatch takes 2 inputs and 2 outputs");
	for (int i = 0; i < 2; i++)
		if (c->in[i]->shape.ndim == 0)
			return dg_err_set(c->err, DG_ESHAPE, "input %d is a scalar", i);
	n = c->in[0]->shape.dim[0];
	if (c->in[1]->shape.dim[0] != n)
		return dg_err_set(c->err, DG_ESHAPE, "examples (%lld) and labels (%lld) differ in "
				  "dim 0", (long long)n, (long long)c->in[1]->shape.dim[0]);
	n_shard = n > o.shard ? (n - o.shard + o.num_shards - 1) / o.num_shards : 0;
	per_epoch = n_shard / o.batch;
	if (per_epoch == 0) {
		dg_err_set(c->err, DG_EINVAL, "shard %lld of %lld holds %lld examples, fewer than "
			   "one batch of %lld", (long long)o.shard, (long long)o.num_shards,
			   (long long)n_shard, (long long)o.batch);
		dg_err_hint(c->err, "use a smaller batch or fewer shards");
		return DG_EINVAL;
	}
	pe = perm_get(&o, c->step / (uint64_t)per_epoch, n_shard);
	if (!pe)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory for %lld indices",
				  (long long)n_shard);
	const int64_t *perm = pe->perm;
	int64_t first = (int64_t)(c->step % (uint64_t)per_epoch) * o.batch;
	for (int i = 0; i < 2 && st == DG_OK; i++) {
		const struct dg_tensor *x = c->in[i];
		struct dg_shape s = x->shape;
		s.dim[0] = o.batch;
		struct dg_tensor *y = cpu_out(c, i, x->dtype, &s);
		if (!y) {
			st = c->err ? c->err->code : DG_ENOMEM;
			break;
		}
		size_t row = n > 0 ? x->nbytes / (size_t)n : 0;
		for (int64_t b = 0; b < o.batch; b++) {
			int64_t ex = o.shard + o.num_shards * perm[first + b];
			memcpy((char *)y->data + (size_t)b * row, (const char *)x->data + (size_t)ex * row,
			       row);
		}
	}
	perm_put(pe);
	return st;
}

/* ------------------------------------------------------------------------ */
/* CsvReader                                                                   */

/* Hand-written: a table of numbers needs none of CSV's quoting rules (a
 * quoted number is accepted, quotes stripped), and strtod/strtoll do the
 * number parsing; Debian's one C CSV library (libcsv) would add a
 * dependency for the rules such files do not use. The file is read whole
 * (zlib: plain or gzip), bounded by CSV_MAX_BYTES, then scanned twice: once
 * to count and check the rows, once to fill the output. */
#define CSV_MAX_BYTES ((int64_t)1 << 34)
#define CSV_MAX_SELECT 4096

static const struct dg_attr_spec csv_attrs[] = {
	{ "path", DG_ATTR_STRING, true, "CSV file of numbers (plain or gzip), one example a line" },
	{ "dtype", DG_ATTR_DTYPE, false, "the output's dtype: float32 (default), float64, int32 "
					 "or int64 (integers must then be written as such)" },
	{ "columns", DG_ATTR_INTS, false, "the columns to read (0-based, in this order; default "
					  "all): output [N, len(columns)]" },
	{ "column", DG_ATTR_INT, false, "read this one column: output [N] (labels)" },
	{ "header", DG_ATTR_BOOL, false, "skip the first line (column names; default false)" },
	{ "delimiter", DG_ATTR_STRING, false, "the field separator, one character (default \",\"; "
					      "\"\\t\" for TSV)" },
	{ 0 },
};

struct csv_opts {
	const char *path;
	enum dg_dtype dtype;
	int64_t cols[CSV_MAX_SELECT];
	int n_cols;                     /* 0: all */
	bool one;                       /* "column": output [N] */
	bool header;
	char delim;
};

static enum dg_status csv_opts_read(struct dg_attrs a, struct csv_opts *o, struct dg_err *err)
{
	static const enum dg_dtype f32 = DG_F32;
	static const bool no = false;
	const char *delim;
	enum dg_status st;

	memset(o, 0, sizeof *o);
	if ((st = dg_attrs_string(a, "path", NULL, &o->path, err)) != DG_OK ||
	    (st = dg_attrs_dtype(a, "dtype", &f32, &o->dtype, err)) != DG_OK ||
	    (st = dg_attrs_bool(a, "header", &no, &o->header, err)) != DG_OK ||
	    (st = dg_attrs_string(a, "delimiter", ",", &delim, err)) != DG_OK)
		return st;
	if (o->dtype != DG_F32 && o->dtype != DG_F64 && o->dtype != DG_I32 && o->dtype != DG_I64)
		return dg_err_set(err, DG_EDTYPE, "attr 'dtype': CsvReader outputs float32, "
				  "float64, int32 or int64, not %s", dg_dtype_name(o->dtype));
	if (strlen(delim) != 1 || strchr("\"\r\n0123456789.+-eE", delim[0]))
		return dg_err_set(err, DG_EINVAL, "attr 'delimiter' must be one character that "
				  "cannot be part of a number, not \"%s\"", delim);
	o->delim = delim[0];
	if (dg_attrs_get(a, "column")) {
		if (dg_attrs_get(a, "columns"))
			return dg_err_set(err, DG_EINVAL, "give attr 'column' (one, output [N]) or "
					  "'columns' (output [N, C]), not both");
		if ((st = dg_attrs_int(a, "column", NULL, &o->cols[0], err)) != DG_OK)
			return st;
		o->n_cols = 1;
		o->one = true;
	} else if (dg_attrs_get(a, "columns")) {
		if ((st = dg_attrs_ints(a, "columns", false, o->cols, CSV_MAX_SELECT, &o->n_cols,
					err)) != DG_OK)
			return st;
		if (o->n_cols == 0)
			return dg_err_set(err, DG_EINVAL, "attr 'columns' is empty; leave it out "
					  "to read every column");
	}
	for (int k = 0; k < o->n_cols; k++)
		if (o->cols[k] < 0)
			return dg_err_set(err, DG_EINVAL, "attr '%s': column %lld is negative "
					  "(columns count from 0)", o->one ? "column" : "columns",
					  (long long)o->cols[k]);
	return DG_OK;
}

/* The whole file into *out (NUL-terminated, *len bytes before the NUL). */
static enum dg_status csv_load(const char *path, char **out, int64_t *len, struct dg_err *err)
{
	gzFile f;
	int64_t cap = 1 << 16, n = 0, got;
	char *buf = NULL, *p;

	*out = NULL;
	if (plain_file(path, "CSV", err) != DG_OK)
		return DG_EINVAL;
	f = gzopen(path, "rb");
	if (!f)
		return dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO,
				  "cannot open CSV file '%s': %s", path,
				  errno ? strerror(errno) : "out of memory");
	for (;;) {
		if (!(p = realloc(buf, (size_t)cap + 1))) {
			free(buf);
			gzclose(f);
			return dg_err_set(err, DG_ENOMEM, "out of memory reading '%s'", path);
		}
		buf = p;
		if ((got = gz_read(f, "CSV", path, buf + n, cap - n, err)) < 0) {
			free(buf);
			gzclose(f);
			return err ? err->code : DG_EINVAL;
		}
		n += got;
		if (n < cap)
			break;
		if (cap >= CSV_MAX_BYTES) {
			free(buf);
			gzclose(f);
			return dg_err_set(err, DG_EINVAL, "CSV file '%s' is larger than %lld GiB",
					  path, (long long)(CSV_MAX_BYTES >> 30));
		}
		cap *= 2;
	}
	gzclose(f);
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return DG_OK;
}

/* The next line of [*p, end): its bounds without "\r\n"; *p moves past it. */
static bool csv_line(const char **p, const char *end, const char **b, const char **e)
{
	const char *nl;

	if (*p >= end)
		return false;
	nl = memchr(*p, '\n', (size_t)(end - *p));
	*b = *p;
	*e = nl ? nl : end;
	*p = nl ? nl + 1 : end;
	if (*e > *b && (*e)[-1] == '\r')
		(*e)--;
	return true;
}

static bool csv_blank(const char *b, const char *e)
{
	while (b < e && (*b == ' ' || *b == '\t'))
		b++;
	return b == e;
}

/* Fields of one line. */
static int64_t csv_fields(const char *b, const char *e, char delim)
{
	int64_t n = 1;

	for (; b < e; b++)
		n += *b == delim;
	return n;
}

/* Count the data rows and check that each has the first one's fields;
 * *fields = that count. */
static enum dg_status csv_scan(const struct csv_opts *o, const char *buf, int64_t len,
			       int64_t *rows, int64_t *fields, struct dg_err *err)
{
	const char *p = buf, *end = buf + len, *b, *e;
	int64_t line = 0;

	*rows = 0;
	*fields = -1;
	if (o->header && csv_line(&p, end, &b, &e))
		line++;
	while (csv_line(&p, end, &b, &e)) {
		line++;
		if (csv_blank(b, e))
			continue;
		int64_t f = csv_fields(b, e, o->delim);
		if (*fields < 0)
			*fields = f;
		else if (f != *fields)
			return dg_err_set(err, DG_EINVAL, "CSV file '%s' line %lld has %lld fields; "
					  "the first row has %lld", o->path, (long long)line,
					  (long long)f, (long long)*fields);
		(*rows)++;
	}
	if (*rows == 0) {
		dg_err_set(err, DG_EINVAL, "CSV file '%s' has no rows%s", o->path,
			   o->header ? " after its header" : "");
		return DG_EINVAL;
	}
	for (int k = 0; k < o->n_cols; k++)
		if (o->cols[k] >= *fields)
			return dg_err_set(err, DG_EINVAL, "CSV file '%s' has %lld columns; there is "
					  "no column %lld (columns count from 0)", o->path,
					  (long long)*fields, (long long)o->cols[k]);
	return DG_OK;
}

static void csv_out_type(const struct csv_opts *o, int64_t rows, int64_t fields,
			 struct dg_ttype *t)
{
	t->dtype = o->dtype;
	t->shape.ndim = o->one ? 1 : 2;
	t->shape.dim[0] = rows;
	if (!o->one)
		t->shape.dim[1] = o->n_cols ? o->n_cols : fields;
}

/* Parse field [b, e) (spaces and one pair of double quotes around it
 * allowed) into element i of t. */
static enum dg_status csv_value(const struct csv_opts *o, const char *b, const char *e,
				int64_t line, int64_t col, struct dg_tensor *t, int64_t i,
				struct dg_err *err)
{
	char tmp[512], *stop;
	size_t n;

	while (b < e && (*b == ' ' || *b == '\t'))
		b++;
	while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
		e--;
	if (e - b >= 2 && *b == '"' && e[-1] == '"') {
		b++;
		e--;
	}
	n = (size_t)(e - b);
	if (n == 0 || n >= sizeof tmp)
		goto bad;
	memcpy(tmp, b, n);
	tmp[n] = '\0';
	errno = 0;
	if (o->dtype == DG_F32 || o->dtype == DG_F64) {
		double v = strtod(tmp, &stop);
		/* ERANGE on underflow (a subnormal, or 0) is a number; overflow
		 * (also past float32's range) is not */
		if (*stop || (errno == ERANGE && fabs(v) > 1) ||
		    (o->dtype == DG_F32 && isfinite(v) && fabs(v) > FLT_MAX))
			goto bad;
		if (o->dtype == DG_F32)
			((float *)t->data)[i] = (float)v;
		else
			((double *)t->data)[i] = v;
		return DG_OK;
	}
	long long v = strtoll(tmp, &stop, 10);
	if (*stop || errno == ERANGE || (o->dtype == DG_I32 && (v < INT32_MIN || v > INT32_MAX)))
		goto bad;
	if (o->dtype == DG_I32)
		((int32_t *)t->data)[i] = (int32_t)v;
	else
		((int64_t *)t->data)[i] = v;
	return DG_OK;
bad:
	dg_err_set(err, DG_EINVAL, "CSV file '%s' line %lld column %lld: '%.*s' is not %s",
		   o->path, (long long)line, (long long)col, (int)(e - b < 40 ? e - b : 40), b,
		   o->dtype == DG_I32 ? "an int32" : o->dtype == DG_I64 ? "an int64" :
		   o->dtype == DG_F32 ? "a float32" : "a float64");
	if (o->dtype == DG_I32 || o->dtype == DG_I64)
		dg_err_hint(err, "read it as float32 and Cast, or fix the file");
	return DG_EINVAL;
}

/* Fill t ([rows, C] or [rows]) from the file's rows. */
static enum dg_status csv_fill(const struct csv_opts *o, const char *buf, int64_t len,
			       int64_t fields, struct dg_tensor *t, struct dg_err *err)
{
	const char *p = buf, *end = buf + len, *b, *e;
	const char **at = malloc((size_t)(fields + 1) * sizeof *at);
	int64_t line = 0, row = 0, width = o->n_cols ? o->n_cols : fields;
	enum dg_status st = DG_OK;

	if (!at)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (o->header && csv_line(&p, end, &b, &e))
		line++;
	while (st == DG_OK && csv_line(&p, end, &b, &e)) {
		line++;
		if (csv_blank(b, e))
			continue;
		/* at[k]: where field k starts; at[fields]: one past the line. */
		int64_t k = 0;
		at[k++] = b;
		for (const char *q = b; q < e; q++)
			if (*q == o->delim)
				at[k++] = q + 1;
		at[fields] = e + 1;
		for (int64_t c = 0; c < width && st == DG_OK; c++) {
			int64_t f = o->n_cols ? o->cols[c] : c;
			st = csv_value(o, at[f], at[f + 1] - 1, line, f, t, row * width + c, err);
		}
		row++;
	}
	free(at);
	return st;
}

/* csv_scan over a file streamed in 1 MiB pieces (inference: a large file is
 * counted, not held): the same rows, fields and errors as csv_scan. */
static enum dg_status csv_count(const struct csv_opts *o, int64_t *rows, int64_t *fields,
				struct dg_err *err)
{
	enum { CHUNK = 1 << 20 };
	char *buf = malloc(CHUNK);
	gzFile f = buf ? gzopen(o->path, "rb") : NULL;
	int64_t line = 0, cur = 1, got;
	bool blank = true, skip = o->header, eof = false;
	enum dg_status st = DG_OK;

	*rows = 0;
	*fields = -1;
	if (!buf || !f) {
		free(buf);
		return dg_err_set(err, buf ? DG_EIO : DG_ENOMEM, "cannot read CSV file '%s'",
				  o->path);
	}
	while (st == DG_OK && !eof) {
		if ((got = gz_read(f, "CSV", o->path, buf, CHUNK, err)) < 0) {
			st = err ? err->code : DG_EINVAL;
			break;
		}
		eof = got < CHUNK;
		/* a last line without a newline ends at the end of the file */
		for (int64_t i = 0; st == DG_OK && i < got + (eof && !blank); i++) {
			char ch = i < got ? buf[i] : '\n';
			if (ch != '\n') {
				cur += ch == o->delim;
				blank &= ch == ' ' || ch == '\t' || ch == '\r';
				continue;
			}
			line++;
			if (skip || blank) {
				skip = false;
			} else if (*fields < 0) {
				*fields = cur;
				(*rows)++;
			} else if (cur != *fields) {
				st = dg_err_set(err, DG_EINVAL, "CSV file '%s' line %lld has %lld "
						"fields; the first row has %lld", o->path,
						(long long)line, (long long)cur,
						(long long)*fields);
			} else {
				(*rows)++;
			}
			cur = 1;
			blank = true;
		}
	}
	gzclose(f);
	free(buf);
	if (st == DG_OK && *rows == 0)
		st = dg_err_set(err, DG_EINVAL, "CSV file '%s' has no rows%s", o->path,
				o->header ? " after its header" : "");
	for (int k = 0; st == DG_OK && k < o->n_cols; k++)
		if (o->cols[k] >= *fields)
			st = dg_err_set(err, DG_EINVAL, "CSV file '%s' has %lld columns; there is "
					"no column %lld (columns count from 0)", o->path,
					(long long)*fields, (long long)o->cols[k]);
	return st;
}

static enum dg_status csv_infer(struct dg_infer_ctx *c)
{
	struct csv_opts o;
	int64_t rows, fields;
	enum dg_status st = csv_opts_read(dg_attrs_of_json(c->attrs), &o, c->err);

	if (st != DG_OK)
		return st;
	/* The rows are counted here, so that a feeder knows its epoch: the file
	 * is streamed at validation when it is there (else the shape is unknown). */
	if (access(o.path, R_OK) != 0) {
		c->out[0].dtype = o.dtype;
		c->out[0].shape.ndim = -1;
		return DG_OK;
	}
	if ((st = plain_file(o.path, "CSV", c->err)) != DG_OK ||
	    (st = csv_count(&o, &rows, &fields, c->err)) != DG_OK)
		return st;
	csv_out_type(&o, rows, fields, &c->out[0]);
	return DG_OK;
}

static enum dg_status csv_cpu(struct dg_kernel_ctx *c)
{
	struct csv_opts o;
	struct dg_ttype tt;
	struct dg_tensor *t;
	char *buf = NULL;
	int64_t len = 0, rows, fields;
	enum dg_status st = csv_opts_read(c->attrs, &o, c->err);

	if (st == DG_OK)
		st = csv_load(o.path, &buf, &len, c->err);
	if (st == DG_OK)
		st = csv_scan(&o, buf, len, &rows, &fields, c->err);
	if (st == DG_OK) {
		csv_out_type(&o, rows, fields, &tt);
		t = cpu_out(c, 0, tt.dtype, &tt.shape);
		st = t ? csv_fill(&o, buf, len, fields, t, c->err) : c->err ? c->err->code :
		     DG_ENOMEM;
	}
	free(buf);
	return st;
}

struct dg_op_def dg_ops_data[] = {
	{ .name = "ShardBatch", .min_inputs = 2, .max_inputs = 2, .n_outputs = 2,
	  .attrs = shard_attrs, .infer = shard_infer, .cpu = shard_cpu, .flags = DG_OPF_STATEFUL,
	  .doc = "batch number `step` of this worker's shard of (examples, labels), reshuffled "
		 "every epoch from seed; a pure function of the step" },
	{ .name = "IdxReader", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = idx_attrs, .infer = idx_infer, .cpu = idx_cpu, .flags = DG_OPF_SOURCE,
	  .doc = "a whole IDX dataset (MNIST format, uint8, gzip or plain): images [N,28,28] "
		 "or labels [N], optionally scaled, flattened or one-hot" },
	{ .name = "NpyReader", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = npy_attrs, .infer = npy_infer, .cpu = npy_cpu, .flags = DG_OPF_SOURCE,
	  .doc = "the tensor stored in a .npy file" },
	{ .name = "CsvReader", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = csv_attrs, .infer = csv_infer, .cpu = csv_cpu, .flags = DG_OPF_SOURCE,
	  .doc = "a CSV file of numbers, one example a line: [N, C] (chosen columns), or one "
		 "column as [N]" },
	{ 0 },
};
