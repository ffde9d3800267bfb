/* Files of a parameter server's data directory: the lock, the epoch counter,
 * the write-ahead log (segments wal.NNNNNNNN.log with group commit) and the
 * snapshot (snapshot.dgs), and recovery from them at open. store.c decides
 * what goes into them (ps/persist.h); the formats and the guarantees are
 * described in doc/persistence.md. */
#include "persist.h"
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dg/buf.h"
#include "dg/client.h"

#define FILE_MAGIC_LEN 8
static const char wal_magic[FILE_MAGIC_LEN] = { 'D', 'G', 'W', 'A', 'L', '1', '\n', 0 };
static const char snap_magic[FILE_MAGIC_LEN] = { 'D', 'G', 'S', 'N', 'A', 'P', '1', '\n' };

#define REC_MAGIC 0x31524744u           /* "DGR1" little-endian: starts every record */
#define FRAME_LEN 24                    /* magic, hcrc, hdr_len, dcrc, data_len */
#define HDR_FIXED 32                    /* type .. aux; then dims and the name */
#define HDR_MAX (HDR_FIXED + 8 * DG_MAX_DIMS + DG_VAR_NAME_MAX)
#define REC_HEAD_MAX (FRAME_LEN + HDR_MAX)

/* Record types besides enum ps_wal_type (1..5). */
#define REC_SEG 32                      /* first record of a log segment: aux = seq */
#define REC_SNAP_HEAD 16                /* first of a snapshot: aux = wal_seq, version = ceiling */
#define REC_SNAP_VAR 17                 /* one variable: aux = sync_step */
#define REC_SNAP_END 18                 /* last: aux = number of variables */

#define SEG_HEADER_LEN (FILE_MAGIC_LEN + FRAME_LEN + HDR_FIXED)
#define SNAP_NAME "snapshot.dgs"
#define SNAP_TMP "snapshot.dgs.tmp"

/* --- CRC-32 ----------------------------------------------------------------- */

/* zlib's crc32 (IEEE polynomial), fed in chunks below 4 GiB because its
 * length parameter is a uInt. */
uint32_t ps_crc32(uint32_t crc, const void *p, size_t n)
{
	const unsigned char *b = p;
	uLong c = crc;

	while (n > 0) {
		uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
		c = crc32(c, b, chunk);
		b += chunk;
		n -= chunk;
	}
	return (uint32_t)c;
}

/* --- little-endian fields ----------------------------------------------------- */

static void put_u16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t f64_bits(double d)
{
	uint64_t u;

	memcpy(&u, &d, 8);
	return u;
}

static double bits_f64(uint64_t u)
{
	double d;

	memcpy(&d, &u, 8);
	return d;
}

/* APPLY's argument block (PS_WAL_ARGS_LEN bytes, little-endian):
 * 0 u8 rule, 1 u8 nesterov, 2..7 zero, 8 lr, 16 momentum, 24 beta1,
 * 32 beta2, 40 eps, 48 rho, 56 init (IEEE doubles; a log written before
 * rho and init existed has zeros there, and no rule that reads them). */
static void args_encode(unsigned char *p, const struct ps_apply_args *a)
{
	memset(p, 0, PS_WAL_ARGS_LEN);
	p[0] = (unsigned char)a->rule;
	p[1] = a->nesterov ? 1 : 0;
	put_u64(p + 8, f64_bits(a->lr));
	put_u64(p + 16, f64_bits(a->momentum));
	put_u64(p + 24, f64_bits(a->beta1));
	put_u64(p + 32, f64_bits(a->beta2));
	put_u64(p + 40, f64_bits(a->eps));
	put_u64(p + 48, f64_bits(a->rho));
	put_u64(p + 56, f64_bits(a->init));
}

/* false when the block names no rule or its values are out of range;
 * assign is logged as APPLY only row-wise (rows) */
static bool args_decode(const unsigned char *p, bool rows, struct ps_apply_args *a)
{
	*a = (struct ps_apply_args){
		.rule = (enum ps_rule)p[0], .nesterov = p[1] != 0,
		.lr = bits_f64(get_u64(p + 8)), .momentum = bits_f64(get_u64(p + 16)),
		.beta1 = bits_f64(get_u64(p + 24)), .beta2 = bits_f64(get_u64(p + 32)),
		.eps = bits_f64(get_u64(p + 40)), .rho = bits_f64(get_u64(p + 48)),
		.init = bits_f64(get_u64(p + 56)), .step = -1, .replica = -1,
	};
	return p[0] < PS_RULE_COUNT && (rows || p[0] != PS_ASSIGN) && p[1] <= 1 &&
	       ps_apply_check_args(a, "", NULL) == DG_OK;
}

uint32_t ps_wal_apply_crc(const struct ps_apply_args *a, const void *g, size_t n)
{
	unsigned char b[PS_WAL_ARGS_LEN];

	args_encode(b, a);
	return ps_crc32(ps_crc32(0, b, sizeof b), g, n);
}

uint32_t ps_wal_rows_crc(const struct ps_apply_args *a, const int64_t *rows, int64_t n,
			 const void *vals, size_t nbytes)
{
	unsigned char b[PS_WAL_ARGS_LEN];

	args_encode(b, a);
	return ps_crc32(ps_crc32(ps_crc32(0, b, sizeof b), rows, (size_t)n * 8), vals, nbytes);
}

/* DG_ENOSPC when errno e says the disk is full (or the quota used up), else
 * DG_EIO: a full disk is a state the server recovers from once there is room. */
static enum dg_status io_code(int e)
{
	return e == ENOSPC || e == EDQUOT ? DG_ENOSPC : DG_EIO;
}

static void full_hint(struct dg_err *err, const char *dir)
{
	if (err && err->code == DG_ENOSPC)
		dg_err_hint(err, "free space on the disk of '%s'; the server takes writes again "
			    "once there is room", dir);
}

/* --- records ---------------------------------------------------------------------- */

/* The decoded head of one record (frame + header). */
struct rec {
	unsigned type;
	enum dg_dtype dtype;
	struct dg_shape shape;
	uint64_t version;
	double mtime;
	uint64_t aux;
	char name[DG_VAR_NAME_MAX + 1];
	uint32_t dcrc;
	uint64_t data_len;
	uint32_t head_len;              /* frame + header bytes */
};

/* Encode frame + header into buf (REC_HEAD_MAX bytes); returns its length.
 * name may be NULL (empty); dims are written for ndim > 0. */
static size_t rec_encode(unsigned char *buf, unsigned type, enum dg_dtype dtype,
			 const struct dg_shape *shape, uint64_t version, double mtime, uint64_t aux,
			 const char *name, uint64_t data_len, uint32_t dcrc)
{
	size_t nlen = name ? strlen(name) : 0;
	int ndim = shape ? shape->ndim : 0;
	size_t hdr_len = HDR_FIXED + 8 * (size_t)ndim + nlen;
	unsigned char *h = buf + FRAME_LEN;

	put_u32(buf, REC_MAGIC);
	put_u32(buf + 8, (uint32_t)hdr_len);
	put_u32(buf + 12, dcrc);
	put_u64(buf + 16, data_len);
	memset(h, 0, HDR_FIXED);
	h[0] = (unsigned char)type;
	h[1] = (unsigned char)dtype;
	h[2] = (unsigned char)ndim;
	put_u16(h + 4, (uint16_t)nlen);
	put_u64(h + 8, version);
	put_u64(h + 16, f64_bits(mtime));
	put_u64(h + 24, aux);
	for (int i = 0; i < ndim; i++)
		put_u64(h + HDR_FIXED + 8 * i, (uint64_t)shape->dim[i]);
	if (nlen)
		memcpy(h + HDR_FIXED + 8 * ndim, name, nlen);
	put_u32(buf + 4, ps_crc32(0, buf + 8, FRAME_LEN - 8 + hdr_len));
	return FRAME_LEN + hdr_len;
}

static enum dg_status pread_all(int fd, void *p, size_t n, uint64_t off, const char *path,
				struct dg_err *err)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (char *)p + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return dg_err_set(err, DG_EIO, "reading '%s' at offset %" PRIu64 ": %s",
					  path, off + got, strerror(errno));
		if (r == 0)
			return dg_err_set(err, DG_EIO, "'%s' ends at offset %" PRIu64
					  " inside a record", path, off + got);
		got += (size_t)r;
	}
	return DG_OK;
}

/* Read and check the head of the record at off of a file of fsize bytes.
 * *valid says whether it is a whole, well-formed record head whose data fits
 * in the file (the data CRC is checked by read_data). I/O errors: DG_EIO. */
static enum dg_status rec_read_head(int fd, uint64_t off, uint64_t fsize, struct rec *r,
				    bool *valid, const char *path, struct dg_err *err)
{
	unsigned char buf[REC_HEAD_MAX];
	enum dg_status st;

	*valid = false;
	if (fsize < off || fsize - off < FRAME_LEN)
		return DG_OK;
	size_t want = fsize - off < REC_HEAD_MAX ? (size_t)(fsize - off) : REC_HEAD_MAX;
	st = pread_all(fd, buf, want, off, path, err);
	if (st != DG_OK)
		return st;
	uint32_t hdr_len = get_u32(buf + 8);
	if (get_u32(buf) != REC_MAGIC || hdr_len < HDR_FIXED || hdr_len > HDR_MAX ||
	    FRAME_LEN + hdr_len > want)
		return DG_OK;
	if (ps_crc32(0, buf + 8, FRAME_LEN - 8 + hdr_len) != get_u32(buf + 4))
		return DG_OK;
	const unsigned char *h = buf + FRAME_LEN;
	unsigned ndim = h[2], nlen = get_u16(h + 4);
	if (ndim > DG_MAX_DIMS || nlen > DG_VAR_NAME_MAX || HDR_FIXED + 8 * ndim + nlen != hdr_len)
		return DG_OK;
	r->type = h[0];
	r->dtype = (enum dg_dtype)h[1];
	r->shape.ndim = (int)ndim;
	for (unsigned i = 0; i < ndim; i++)
		r->shape.dim[i] = (int64_t)get_u64(h + HDR_FIXED + 8 * i);
	r->version = get_u64(h + 8);
	r->mtime = bits_f64(get_u64(h + 16));
	r->aux = get_u64(h + 24);
	memcpy(r->name, h + HDR_FIXED + 8 * ndim, nlen);
	r->name[nlen] = '\0';
	r->dcrc = get_u32(buf + 12);
	r->data_len = get_u64(buf + 16);
	r->head_len = FRAME_LEN + hdr_len;
	/* the data must fit in what the file holds after the head */
	if (r->data_len > fsize - off - r->head_len)
		return DG_OK;
	*valid = true;
	return DG_OK;
}

/* Read the record's data (r->data_len bytes after its head) into dst and
 * check its CRC; *valid false on a mismatch. */
static enum dg_status rec_read_data(int fd, uint64_t off, const struct rec *r, void *dst,
				    bool *valid, const char *path, struct dg_err *err)
{
	enum dg_status st = pread_all(fd, dst, r->data_len, off + r->head_len, path, err);

	if (st != DG_OK)
		return st;
	*valid = ps_crc32(0, dst, r->data_len) == r->dcrc;
	return DG_OK;
}

/* Check only that the record at off is whole (head and data CRCs), reading
 * its data in chunks: used to look for good records after a bad one. */
static enum dg_status rec_probe(int fd, uint64_t off, uint64_t fsize, bool *valid,
				uint64_t *len, const char *path, struct dg_err *err)
{
	struct rec r;
	enum dg_status st = rec_read_head(fd, off, fsize, &r, valid, path, err);
	unsigned char chunk[1 << 16];
	uint32_t c = 0;

	if (st != DG_OK || !*valid)
		return st;
	for (uint64_t done = 0; done < r.data_len;) {
		uint64_t left = r.data_len - done;
		size_t n = left < sizeof chunk ? (size_t)left : sizeof chunk;
		st = pread_all(fd, chunk, n, off + r.head_len + done, path, err);
		if (st != DG_OK)
			return st;
		c = ps_crc32(c, chunk, n);
		done += n;
	}
	*valid = c == r.dcrc;
	*len = r.head_len + r.data_len;
	return DG_OK;
}

/* --- small file helpers ------------------------------------------------------------ */

static char *path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);

	if (p)
		snprintf(p, n, "%s/%s", dir, name);
	return p;
}

static enum dg_status fsync_dir(const char *dir, struct dg_err *err)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return dg_err_set(err, DG_EIO, "cannot open directory '%s': %s", dir,
				  strerror(errno));
	int rc = fsync(fd);
	int e = errno;
	close(fd);
	if (rc != 0)
		return dg_err_set(err, DG_EIO, "cannot flush directory '%s': %s", dir, strerror(e));
	return DG_OK;
}

/* Write iov[0..n) at off completely (pwritev may write less than asked). */
static int pwritev_all(int fd, struct iovec *iov, int n, uint64_t off)
{
	while (n > 0) {
		ssize_t w = pwritev(fd, iov, n > IOV_MAX ? IOV_MAX : n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		off += (uint64_t)w;
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

static enum dg_status mkdir_p(const char *dir, struct dg_err *err)
{
	char *p = strdup(dir);
	enum dg_status st = DG_OK;

	if (!p)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (char *s = p + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char saved = *s;
		*s = '\0';
		/* the data is the model: private to the server's user */
		if (mkdir(p, 0700) == 0) {
			/* the new entry must survive a crash with the data under it */
			char *slash = strrchr(p, '/');
			if (slash && slash != p) {
				*slash = '\0';
				st = fsync_dir(p, err);
				*slash = '/';
			} else {
				st = fsync_dir(slash ? "/" : ".", err);
			}
			if (st != DG_OK)
				break;
		} else if (errno != EEXIST) {
			st = dg_err_set(err, DG_EIO, "cannot create data directory '%s': %s", p,
					strerror(errno));
			break;
		}
		*s = saved;
		if (saved == '\0')
			break;
	}
	free(p);
	if (st == DG_OK) {
		struct stat sb;
		if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
			st = dg_err_set(err, DG_EIO, "data directory '%s' is not a directory", dir);
	}
	return st;
}

enum dg_status ps_dir_lock(const char *dir, int *fd, struct dg_err *err)
{
	enum dg_status st = mkdir_p(dir, err);
	char *path;

	*fd = -1;
	if (st != DG_OK)
		return st;
	path = path_join(dir, "lock");
	if (!path)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (f < 0) {
		st = dg_err_set(err, DG_EIO, "cannot open '%s': %s", path, strerror(errno));
	} else if (flock(f, LOCK_EX | LOCK_NB) != 0) {
		if (errno == EWOULDBLOCK) {
			st = dg_err_set(err, DG_EUNAVAILABLE, "data directory '%s' is in use by "
					"another store (lock '%s')", dir, path);
			dg_err_hint(err, "stop the other dg server or pick another --data-dir");
		} else {
			st = dg_err_set(err, DG_EIO, "cannot lock '%s': %s", path, strerror(errno));
		}
		close(f);
	} else {
		*fd = f;
	}
	free(path);
	return st;
}

enum dg_status ps_epoch_bump(const char *dir, uint64_t *epoch, struct dg_err *err)
{
	char *path = path_join(dir, "epoch");
	struct dg_buf b = { 0 };
	enum dg_status st;
	uint64_t e = 0;

	if (!path)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	st = dg_buf_read_file(&b, path, 64, err);
	if (st == DG_ENOTFOUND) {
		st = DG_OK;
	} else if (st == DG_OK) {
		char *end;
		errno = 0;
		unsigned long long v = b.data ? strtoull(b.data, &end, 10) : 0;
		if (!b.data || end == b.data || errno || (*end && strcmp(end, "\n") != 0) ||
		    b.data[0] == '-' || v == UINT64_MAX) {
			st = dg_err_set(err, DG_EIO, "epoch file '%s' is damaged (%zu bytes)", path,
					b.len);
			dg_err_hint(err, "it holds the restart counter as a decimal number; write "
				    "one larger than any epoch clients saw, or remove it");
		}
		e = v;
	} else {
		dg_err_prefix(err, "reading the epoch");
	}
	if (st == DG_OK) {
		char text[32];
		int n = snprintf(text, sizeof text, "%" PRIu64 "\n", e + 1);
		st = dg_write_file_atomic_mode(path, text, (size_t)n, 0600, err);
		if (st == DG_OK)
			*epoch = e + 1;
	}
	dg_buf_deinit(&b);
	free(path);
	return st;
}

/* --- write-ahead log ----------------------------------------------------------------- */

struct ps_wal {
	char *dir;
	pthread_mutex_t mu;
	pthread_cond_t cv;              /* "synced" moved or a leader finished */
	int fd;                         /* current segment */
	uint64_t seq;
	uint64_t seg_off;               /* bytes in the current segment: next record's offset */
	uint64_t alloc_end;             /* the segment has zeros written up to here */
	uint64_t end;                   /* log position: bytes appended over the log's life */
	uint64_t synced;                /* log position known to be on disk */
	bool syncing;                   /* a leader is in fdatasync */
	bool failed;                    /* an fdatasync failed: nothing is acknowledged any more */
	char fail_msg[200];
	uint64_t fsyncs;
};

/* Preallocation of log segments. An fdatasync after an append that grew the
 * file also commits the new size and blocks (a journal commit on ext4); one
 * after an overwrite of blocks already on disk flushes only the data, which
 * measured 149 against 248 us for 4 KiB on the disk where dg is developed
 * (fallocate's unwritten extents: 219 us, as their conversion is journalled
 * too). So small records go into zeros written ahead in PREALLOC steps. A
 * zero tail is never a record (a record starts with its magic): recovery
 * skips it, and a rotation or close cuts it off. Records of PREALLOC_MAX
 * bytes or more are written as they come: zeros ahead would double their
 * writes. */
#define PREALLOC ((uint64_t)1 << 20)
#define PREALLOC_MAX ((uint64_t)64 << 10)

/* Write zeros from alloc_end so that need bytes fit after seg_off. With
 * w->mu held. Best effort: on an error the record is written as it comes
 * (its own write reports a full disk). */
static void prealloc(struct ps_wal *w, uint64_t need)
{
	static const unsigned char zeros[64 << 10];
	uint64_t to = w->seg_off + need + PREALLOC;

	to -= to % PREALLOC;
	if (w->alloc_end < w->seg_off)
		w->alloc_end = w->seg_off;
	while (w->alloc_end < to) {
		size_t n = to - w->alloc_end < sizeof zeros ? (size_t)(to - w->alloc_end)
							    : sizeof zeros;
		ssize_t k = pwrite(w->fd, zeros, n, (off_t)w->alloc_end);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return;
		w->alloc_end += (uint64_t)k;
	}
}

/* Cut a segment's zeros after its last record (rotation, close). */
static void prealloc_cut(struct ps_wal *w)
{
	if (w->alloc_end > w->seg_off && ftruncate(w->fd, (off_t)w->seg_off) == 0)
		w->alloc_end = w->seg_off;
}


static char *seg_path(const char *dir, uint64_t seq)
{
	char name[48];

	snprintf(name, sizeof name, "wal.%08" PRIu64 ".log", seq);
	return path_join(dir, name);
}

enum dg_status ps_wal_segment_create(const char *dir, uint64_t seq, int *fd, struct dg_err *err)
{
	unsigned char head[SEG_HEADER_LEN];
	char *path = seg_path(dir, seq);
	enum dg_status st = DG_OK;
	struct iovec iov;

	*fd = -1;
	if (!path)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	int f = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (f < 0) {
		st = dg_err_set(err, DG_EIO, "cannot create log segment '%s': %s", path,
				strerror(errno));
		goto out;
	}
	memcpy(head, wal_magic, FILE_MAGIC_LEN);
	rec_encode(head + FILE_MAGIC_LEN, REC_SEG, 0, NULL, 0, 0, seq, NULL, 0, 0);
	iov = (struct iovec){ head, sizeof head };
	if (pwritev_all(f, &iov, 1, 0) != 0 || fsync(f) != 0) {
		int e = errno;
		st = dg_err_set(err, io_code(e), "cannot write log segment '%s': %s", path,
				strerror(e));
		full_hint(err, dir);
		close(f);
		unlink(path);
		goto out;
	}
	st = fsync_dir(dir, err);
	if (st != DG_OK) {
		close(f);
		unlink(path);
		goto out;
	}
	*fd = f;
out:
	free(path);
	return st;
}

struct ps_wal *ps_wal_open(const char *dir, uint64_t seq, struct dg_err *err)
{
	struct ps_wal *w = calloc(1, sizeof *w);
	int fd;

	if (!w || !(w->dir = strdup(dir))) {
		free(w);
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	if (ps_wal_segment_create(dir, seq, &fd, err) != DG_OK) {
		free(w->dir);
		free(w);
		return NULL;
	}
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->fd = fd;
	w->seq = seq;
	w->seg_off = SEG_HEADER_LEN;
	return w;
}

void ps_wal_close(struct ps_wal *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	while (w->syncing)
		pthread_cond_wait(&w->cv, &w->mu);
	prealloc_cut(w);
	if (!w->failed && fdatasync(w->fd) == 0)
		w->synced = w->end;
	pthread_mutex_unlock(&w->mu);
	close(w->fd);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w->dir);
	free(w);
}

enum dg_status ps_wal_append(struct ps_wal *w, const struct ps_wal_rec *r, uint64_t *lsn,
			     struct dg_err *err)
{
	unsigned char head[REC_HEAD_MAX], args[PS_WAL_ARGS_LEN];
	struct iovec iov[4];
	int n_iov = 0;
	uint64_t aux = r->type == PS_WAL_PATCH ? r->offset : 0;
	bool rows = r->type == PS_WAL_APPLY_ROWS;
	bool apply = r->type == PS_WAL_APPLY || rows;
	bool whole = r->type == PS_WAL_PUT || r->type == PS_WAL_ASSIGN || apply;
	bool shaped = whole || r->type == PS_WAL_CREATE;
	bool has_data = whole || r->type == PS_WAL_PATCH;
	size_t rows_len = rows ? (size_t)r->shape.dim[0] * 8 : 0;
	size_t nbytes = has_data ? r->nbytes + (apply ? PS_WAL_ARGS_LEN : 0) + rows_len : 0;
	enum dg_status st = DG_OK;

	if (r->type == PS_WAL_CREATE)
		aux = f64_bits(r->fill);        /* 0.0 is all zero bits: zeros, as before */
	if (r->type == PS_WAL_RESERVE)
		aux = r->ceiling;
	if (apply)
		aux = (uint64_t)r->step;
	if (r->type == PS_WAL_ASSIGN && r->step >= 0)
		aux = (uint64_t)r->step + 1;    /* 0: written by a dg that did not keep it */
	size_t hl = rec_encode(head, (unsigned)r->type, shaped ? r->dtype : 0,
			       shaped ? &r->shape : NULL, r->version, r->mtime, aux, r->name,
			       nbytes, nbytes ? r->data_crc : 0);
	iov[n_iov++] = (struct iovec){ head, hl };
	if (apply) {
		args_encode(args, r->args);
		iov[n_iov++] = (struct iovec){ args, sizeof args };
	}
	if (rows_len)
		iov[n_iov++] = (struct iovec){ (void *)r->rows, rows_len };
	if (has_data && r->nbytes)
		iov[n_iov++] = (struct iovec){ (void *)r->data, r->nbytes };
	pthread_mutex_lock(&w->mu);
	if (!w->failed && hl + nbytes < PREALLOC_MAX && w->seg_off + hl + nbytes > w->alloc_end)
		prealloc(w, hl + nbytes);
	if (w->failed) {
		st = dg_err_set(err, DG_EIO, "%s", w->fail_msg);
	} else if (pwritev_all(w->fd, iov, n_iov, w->seg_off) != 0) {
		int e = errno;
		/* A partial record must not stay in front of later good ones. */
		w->alloc_end = w->seg_off;
		if (ftruncate(w->fd, (off_t)w->seg_off) != 0) {
			w->failed = true;
			snprintf(w->fail_msg, sizeof w->fail_msg,
				 "write-ahead log segment %" PRIu64 " in '%s' failed: %s", w->seq,
				 w->dir, strerror(e));
		}
		if (io_code(e) == DG_ENOSPC)
			st = dg_err_set(err, DG_ENOSPC, "the disk of '%s' is full: the change was "
					"not made (appending to its write-ahead log: %s)", w->dir,
					strerror(e));
		else
			st = dg_err_set(err, DG_EIO, "appending to the write-ahead log in '%s': %s",
					w->dir, strerror(e));
		if (st == DG_ENOSPC)
			full_hint(err, w->dir);
		else
			dg_err_hint(err, "check free space and the disk of the data directory");
	} else {
		w->seg_off += hl + nbytes;
		w->end += hl + nbytes;
		*lsn = w->end;
	}
	pthread_mutex_unlock(&w->mu);
	return st;
}

enum dg_status ps_wal_sync(struct ps_wal *w, uint64_t lsn, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	pthread_mutex_lock(&w->mu);
	while (!w->failed && w->synced < lsn) {
		if (w->syncing) {
			pthread_cond_wait(&w->cv, &w->mu);
			continue;
		}
		/* Leader: one fdatasync covers every record appended so far,
		 * including those of the followers now waiting on cv. */
		uint64_t target = w->end;
		int fd = w->fd;
		w->syncing = true;
		pthread_mutex_unlock(&w->mu);
		int rc = fdatasync(fd);
		int e = errno;
		pthread_mutex_lock(&w->mu);
		w->syncing = false;
		w->fsyncs++;
		if (rc != 0) {
			w->failed = true;
			snprintf(w->fail_msg, sizeof w->fail_msg,
				 "flushing the write-ahead log in '%s' failed: %s", w->dir,
				 strerror(e));
		} else if (target > w->synced) {
			w->synced = target;
		}
		pthread_cond_broadcast(&w->cv);
	}
	if (w->synced < lsn) {
		st = dg_err_set(err, DG_EIO, "%s", w->fail_msg);
		dg_err_hint(err, "the change may not be durable; restart the server once the disk "
			    "is fixed");
	}
	pthread_mutex_unlock(&w->mu);
	return st;
}

enum dg_status ps_wal_switch(struct ps_wal *w, int fd, uint64_t seq, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	pthread_mutex_lock(&w->mu);
	while (w->syncing)
		pthread_cond_wait(&w->cv, &w->mu);
	/* The old segment must be whole on disk before records go to the new
	 * one: recovery accepts a torn tail only in the last segment. */
	bool cut = w->alloc_end > w->seg_off;
	prealloc_cut(w);
	if (!w->failed && (w->synced < w->end || cut)) {
		w->fsyncs++;
		if (fdatasync(w->fd) != 0) {
			w->failed = true;
			snprintf(w->fail_msg, sizeof w->fail_msg,
				 "flushing the write-ahead log in '%s' failed: %s", w->dir,
				 strerror(errno));
		} else {
			w->synced = w->end;
		}
	}
	if (w->failed) {
		st = dg_err_set(err, DG_EIO, "%s", w->fail_msg);
		close(fd);
		/* the unused segment would block the next rotation's O_EXCL create */
		ps_wal_segment_discard(w->dir, seq);
	} else {
		close(w->fd);
		w->fd = fd;
		w->seq = seq;
		w->seg_off = SEG_HEADER_LEN;
		w->alloc_end = SEG_HEADER_LEN;  /* the new segment has no zeros yet */
	}
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return st;
}

void ps_wal_segment_discard(const char *dir, uint64_t seq)
{
	char *p = seg_path(dir, seq);

	if (p)
		unlink(p);
	free(p);
}

/* Parse "wal.<digits>.log"; false for other names. */
static bool seg_name_parse(const char *name, uint64_t *seq)
{
	char *end;

	if (strncmp(name, "wal.", 4) != 0 || name[4] < '0' || name[4] > '9')
		return false;
	errno = 0;
	unsigned long long v = strtoull(name + 4, &end, 10);
	if (errno || strcmp(end, ".log") != 0 || v == 0)
		return false;
	*seq = v;
	return true;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The segment numbers in dir, ascending; *out owned. */
static enum dg_status seg_list(const char *dir, uint64_t **out, size_t *n, struct dg_err *err)
{
	DIR *d = opendir(dir);
	uint64_t *v = NULL;
	size_t cnt = 0, cap = 0;
	struct dirent *de;

	*out = NULL;
	*n = 0;
	if (!d)
		return dg_err_set(err, DG_EIO, "cannot list data directory '%s': %s", dir,
				  strerror(errno));
	while ((de = readdir(d))) {
		uint64_t seq;
		if (!seg_name_parse(de->d_name, &seq))
			continue;
		if (cnt == cap) {
			size_t nc = cap ? 2 * cap : 16;
			uint64_t *nv = realloc(v, nc * sizeof *nv);
			if (!nv) {
				free(v);
				closedir(d);
				return dg_err_set(err, DG_ENOMEM, "out of memory");
			}
			v = nv;
			cap = nc;
		}
		v[cnt++] = seq;
	}
	closedir(d);
	if (cnt > 1)
		qsort(v, cnt, sizeof *v, cmp_u64);
	*out = v;
	*n = cnt;
	return DG_OK;
}

void ps_wal_remove_before(const char *dir, uint64_t seq)
{
	uint64_t *v;
	size_t n;

	if (seg_list(dir, &v, &n, NULL) != DG_OK)
		return;
	for (size_t i = 0; i < n && v[i] < seq; i++) {
		char *p = seg_path(dir, v[i]);
		if (p)
			unlink(p);
		free(p);
	}
	free(v);
	/* not durable by itself: a segment that survives a crash is older than
	 * the snapshot's wal_seq and recovery removes it again */
}

uint64_t ps_wal_seq(struct ps_wal *w)
{
	pthread_mutex_lock(&w->mu);
	uint64_t s = w->seq;
	pthread_mutex_unlock(&w->mu);
	return s;
}

uint64_t ps_wal_fsyncs(struct ps_wal *w)
{
	pthread_mutex_lock(&w->mu);
	uint64_t s = w->fsyncs;
	pthread_mutex_unlock(&w->mu);
	return s;
}

bool ps_wal_failed(struct ps_wal *w, char *msg, size_t n)
{
	pthread_mutex_lock(&w->mu);
	bool failed = w->failed;
	if (failed)
		snprintf(msg, n, "%s", w->fail_msg);
	pthread_mutex_unlock(&w->mu);
	return failed;
}

uint64_t ps_wal_bytes(struct ps_wal *w)
{
	pthread_mutex_lock(&w->mu);
	uint64_t s = w->seg_off;
	pthread_mutex_unlock(&w->mu);
	return s;
}

/* --- snapshot writer -------------------------------------------------------------------- */

/* A buffered sequential writer: small heads collect in buf; large data goes
 * straight to the file. */
struct writer {
	int fd;
	const char *path;
	unsigned char *buf;
	size_t len, cap;
	uint64_t off;
};

static enum dg_status wr_flush(struct writer *w, struct dg_err *err)
{
	struct iovec iov = { w->buf, w->len };

	if (w->len && pwritev_all(w->fd, &iov, 1, w->off) != 0)
		return dg_err_set(err, io_code(errno), "writing '%s': %s", w->path, strerror(errno));
	w->off += w->len;
	w->len = 0;
	return DG_OK;
}

static enum dg_status wr_put(struct writer *w, const void *p, size_t n, struct dg_err *err)
{
	enum dg_status st;

	if (w->len + n <= w->cap) {
		memcpy(w->buf + w->len, p, n);
		w->len += n;
		return DG_OK;
	}
	st = wr_flush(w, err);
	if (st != DG_OK)
		return st;
	if (n <= w->cap) {
		memcpy(w->buf, p, n);
		w->len = n;
		return DG_OK;
	}
	struct iovec iov = { (void *)p, n };
	if (pwritev_all(w->fd, &iov, 1, w->off) != 0)
		return dg_err_set(err, io_code(errno), "writing '%s': %s", w->path, strerror(errno));
	w->off += n;
	return DG_OK;
}

static enum dg_status snap_write_all(struct writer *w, uint64_t wal_seq, uint64_t ceiling,
				     double cut_at, const struct ps_snap_item *items, size_t n,
				     struct dg_err *err)
{
	unsigned char head[REC_HEAD_MAX];
	enum dg_status st = wr_put(w, snap_magic, FILE_MAGIC_LEN, err);
	size_t hl;

	if (st != DG_OK)
		return st;
	hl = rec_encode(head, REC_SNAP_HEAD, 0, NULL, ceiling, cut_at, wal_seq, NULL, 0, 0);
	st = wr_put(w, head, hl, err);
	for (size_t i = 0; i < n && st == DG_OK; i++) {
		const struct ps_value *v = items[i].value;
		/* the CRC is computed here, from a block no one changes while held */
		uint32_t dcrc = ps_crc32(0, v->data, v->nbytes);
		hl = rec_encode(head, REC_SNAP_VAR, v->dtype, &v->shape, v->version, v->mtime,
				(uint64_t)items[i].sync_step, items[i].name, v->nbytes, dcrc);
		st = wr_put(w, head, hl, err);
		if (st == DG_OK && v->nbytes)
			st = wr_put(w, v->data, v->nbytes, err);
	}
	if (st != DG_OK)
		return st;
	hl = rec_encode(head, REC_SNAP_END, 0, NULL, 0, 0, (uint64_t)n, NULL, 0, 0);
	st = wr_put(w, head, hl, err);
	if (st == DG_OK)
		st = wr_flush(w, err);
	return st;
}

enum dg_status ps_snapshot_write(const char *dir, uint64_t wal_seq, uint64_t ceiling,
				 double cut_at, const struct ps_snap_item *items, size_t n,
				 uint64_t *bytes, struct dg_err *err)
{
	char *tmp = path_join(dir, SNAP_TMP), *path = path_join(dir, SNAP_NAME);
	struct writer w = { .fd = -1, .path = tmp, .cap = 1 << 20 };
	enum dg_status st = DG_OK;

	w.buf = malloc(w.cap);
	if (!tmp || !path || !w.buf) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory writing a snapshot");
		goto out;
	}
	w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (w.fd < 0) {
		st = dg_err_set(err, DG_EIO, "cannot create '%s': %s", tmp, strerror(errno));
		goto out;
	}
	st = snap_write_all(&w, wal_seq, ceiling, cut_at, items, n, err);
	if (st == DG_OK && fsync(w.fd) != 0)
		st = dg_err_set(err, io_code(errno), "flushing '%s': %s", tmp, strerror(errno));
	if (close(w.fd) != 0 && st == DG_OK)
		st = dg_err_set(err, io_code(errno), "closing '%s': %s", tmp, strerror(errno));
	w.fd = -1;
	if (st == DG_OK && rename(tmp, path) != 0)
		st = dg_err_set(err, DG_EIO, "renaming '%s' to '%s': %s", tmp, path,
				strerror(errno));
	if (st == DG_OK)
		st = fsync_dir(dir, err);
	else
		unlink(tmp);
	if (st == DG_OK && bytes)
		*bytes = w.off;         /* every byte went through the writer */
	if (st != DG_OK && err && !err->hint[0])
		dg_err_hint(err, "the previous snapshot and the log still hold the data; %s",
			    st == DG_ENOSPC ? "a snapshot needs room for a whole copy of the "
			    "variables: free space on that disk" : "check free space in the data "
			    "directory");
out:
	free(w.buf);
	free(tmp);
	free(path);
	return st;
}

/* --- recovery ------------------------------------------------------------------------------ */

static enum dg_status file_size(int fd, const char *path, uint64_t *size, struct dg_err *err)
{
	struct stat sb;

	if (fstat(fd, &sb) != 0)
		return dg_err_set(err, DG_EIO, "cannot stat '%s': %s", path, strerror(errno));
	*size = (uint64_t)sb.st_size;
	return DG_OK;
}

static enum dg_status corrupt(struct dg_err *err, const char *path, uint64_t off, const char *what)
{
	dg_err_set(err, DG_EIO, "'%s' is corrupt at offset %" PRIu64 ": %s", path, off, what);
	dg_err_hint(err, "dg refuses to start without data it acknowledged; restore the data "
		    "directory from a backup or move the damaged file away");
	return DG_EIO;
}

/* Check dtype/shape of a record and return its value's byte count in
 * *nbytes; with_data: the record carries the value (else no data at all). */
static bool rec_tensor_ok(const struct rec *r, bool with_data, size_t *nbytes)
{
	int64_t numel;

	if ((unsigned)r->dtype >= DG_DTYPE_COUNT)
		return false;
	for (int i = 0; i < r->shape.ndim; i++)
		if (r->shape.dim[i] < 0)
			return false;
	if (dg_shape_numel(&r->shape, &numel, NULL) != DG_OK)
		return false;
	*nbytes = (size_t)numel * dg_dtype_size(r->dtype);
	return with_data ? *nbytes == r->data_len : r->data_len == 0;
}

/* Read the data of a whole-value record into a fresh aligned block: *out
 * owned, or NULL with *ok false when the data CRC does not match. */
static enum dg_status read_block(int fd, uint64_t off, const struct rec *r, void **out, bool *ok,
				 const char *path, struct dg_err *err)
{
	void *data = dg_alloc_aligned(r->data_len);
	enum dg_status st;

	*out = NULL;
	*ok = false;
	if (!data)
		return dg_err_set(err, DG_ENOMEM, "out of memory loading %" PRIu64 " bytes of '%s' "
				  "from '%s'", r->data_len, r->name, path);
	st = rec_read_data(fd, off, r, data, ok, path, err);
	if (st != DG_OK || !*ok) {
		dg_free_aligned(data);
		return st;
	}
	*out = data;
	return DG_OK;
}

static enum dg_status snap_load(int fd, const char *path, const struct ps_recover_ops *ops,
				uint64_t *wal_seq, uint64_t *ceiling, double *cut_at,
				struct dg_err *err)
{
	char magic[FILE_MAGIC_LEN];
	uint64_t size = 0, off = FILE_MAGIC_LEN, n_vars = 0;
	struct rec r;
	bool ok;
	enum dg_status st = file_size(fd, path, &size, err);

	if (st != DG_OK)
		return st;
	if (size < FILE_MAGIC_LEN)
		return corrupt(err, path, 0, "file shorter than its magic");
	st = pread_all(fd, magic, FILE_MAGIC_LEN, 0, path, err);
	if (st != DG_OK)
		return st;
	if (memcmp(magic, snap_magic, FILE_MAGIC_LEN) != 0)
		return corrupt(err, path, 0, "not a dg snapshot (bad magic)");
	st = rec_read_head(fd, off, size, &r, &ok, path, err);
	if (st != DG_OK)
		return st;
	if (!ok || r.type != REC_SNAP_HEAD)
		return corrupt(err, path, off, "bad snapshot header record");
	*wal_seq = r.aux;
	*ceiling = r.version;
	*cut_at = r.mtime;
	off += r.head_len + r.data_len;
	for (;;) {
		st = rec_read_head(fd, off, size, &r, &ok, path, err);
		if (st != DG_OK)
			return st;
		if (!ok)
			return corrupt(err, path, off,
				       off >= size ? "file ends before its end record"
						   : "bad record (checksum or framing)");
		if (r.type == REC_SNAP_END) {
			if (r.aux != n_vars)
				return corrupt(err, path, off, "variable count does not match");
			if (off + r.head_len != size)
				return corrupt(err, path, off, "data after the end record");
			return DG_OK;
		}
		size_t nbytes;
		if (r.type != REC_SNAP_VAR || !rec_tensor_ok(&r, true, &nbytes) ||
		    dg_var_name_check_stored(r.name, NULL) != DG_OK)
			return corrupt(err, path, off, "bad variable record");
		void *data;
		st = read_block(fd, off, &r, &data, &ok, path, err);
		if (st != DG_OK)
			return st;
		if (!ok)
			return corrupt(err, path, off, "data checksum mismatch");
		struct ps_snap_var v = {
			.name = r.name, .dtype = r.dtype, .shape = r.shape, .nbytes = nbytes,
			.version = r.version, .mtime = r.mtime, .sync_step = (int64_t)r.aux,
		};
		st = ops->var(ops->ud, &v, data, err);   /* data adopted or freed by the callee */
		if (st != DG_OK) {
			dg_err_prefix(err, "'%s' at offset %" PRIu64, path, off);
			return st;
		}
		n_vars++;
		off += r.head_len + r.data_len;
	}
}

/* Is there a whole record anywhere in (from, size)? Decides whether a bad
 * record is a torn tail (nothing good after it) or damage in the middle. */
/* *zero: every byte of [from, size) is zero (a segment's preallocated tail). */
static enum dg_status zero_tail(int fd, uint64_t from, uint64_t size, const char *path,
				bool *zero, struct dg_err *err)
{
	unsigned char chunk[1 << 16];

	*zero = true;
	for (uint64_t pos = from; pos < size && *zero;) {
		size_t n = size - pos < sizeof chunk ? (size_t)(size - pos) : sizeof chunk;
		enum dg_status st = pread_all(fd, chunk, n, pos, path, err);
		if (st != DG_OK)
			return st;
		for (size_t i = 0; i < n && *zero; i++)
			*zero = chunk[i] == 0;
		pos += n;
	}
	return DG_OK;
}

static enum dg_status find_good_after(int fd, uint64_t from, uint64_t size, const char *path,
				      uint64_t *found, struct dg_err *err)
{
	unsigned char magic[4], chunk[1 << 16];
	enum dg_status st;

	put_u32(magic, REC_MAGIC);
	*found = 0;
	for (uint64_t pos = from + 1; pos + FRAME_LEN <= size;) {
		size_t n = size - pos < sizeof chunk ? (size_t)(size - pos) : sizeof chunk;
		st = pread_all(fd, chunk, n, pos, path, err);
		if (st != DG_OK)
			return st;
		for (size_t i = 0; i + 4 <= n; i++) {
			if (memcmp(chunk + i, magic, 4) != 0)
				continue;
			bool ok;
			uint64_t len;
			st = rec_probe(fd, pos + i, size, &ok, &len, path, err);
			if (st != DG_OK)
				return st;
			if (ok) {
				*found = pos + i;
				return DG_OK;
			}
		}
		/* overlap by 3 bytes so a magic across chunks is seen */
		pos += n > 3 ? n - 3 : n;
	}
	return DG_OK;
}

/* Replay one segment. last: the newest segment, the only one that may end in
 * a torn (unacknowledged) record, which is cut off. */
static enum dg_status seg_replay(const char *dir, uint64_t seq, bool last,
				 const struct ps_recover_ops *ops, struct ps_recover_info *info,
				 bool *removed, struct dg_err *err)
{
	char *path = seg_path(dir, seq);
	char magic[FILE_MAGIC_LEN];
	uint64_t size = 0, off = FILE_MAGIC_LEN;
	enum dg_status st;
	struct rec r;
	bool ok;
	int fd;

	*removed = false;
	if (!path)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	fd = open(path, (last ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0) {
		st = dg_err_set(err, DG_EIO, "cannot open '%s': %s", path, strerror(errno));
		goto out;
	}
	st = file_size(fd, path, &size, err);
	if (st != DG_OK)
		goto out;
	ok = size >= SEG_HEADER_LEN;
	if (ok) {
		st = pread_all(fd, magic, FILE_MAGIC_LEN, 0, path, err);
		if (st != DG_OK)
			goto out;
		ok = memcmp(magic, wal_magic, FILE_MAGIC_LEN) == 0;
	}
	if (ok) {
		st = rec_read_head(fd, off, size, &r, &ok, path, err);
		if (st != DG_OK)
			goto out;
		ok = ok && r.type == REC_SEG && r.aux == seq;
	}
	if (!ok) {
		/* A segment whose header never reached the disk was created by
		 * a rotation or start that crashed: nothing was acknowledged in it. */
		if (last && size < SEG_HEADER_LEN + FRAME_LEN) {
			unlink(path);
			*removed = true;
			st = DG_OK;
		} else {
			st = corrupt(err, path, 0, "bad log segment header");
		}
		goto out;
	}
	off = SEG_HEADER_LEN;
	while (off < size) {
		void *data = NULL;      /* PUT/ASSIGN: aligned block; PATCH: malloc'ed */
		size_t nbytes = 0;
		memset(&r, 0, sizeof r);
		st = rec_read_head(fd, off, size, &r, &ok, path, err);
		if (st != DG_OK)
			goto out;
		if (ok && (r.type == PS_WAL_PUT || r.type == PS_WAL_ASSIGN)) {
			ok = rec_tensor_ok(&r, true, &nbytes) &&
			     dg_var_name_check_stored(r.name, NULL) == DG_OK;
			if (!ok) {
				st = corrupt(err, path, off, "bad value record");
				goto out;
			}
			/* a data CRC mismatch leaves ok false: torn tail or damage (below) */
			st = read_block(fd, off, &r, &data, &ok, path, err);
			if (st != DG_OK)
				goto out;
		} else if (ok && (r.type == PS_WAL_APPLY || r.type == PS_WAL_APPLY_ROWS)) {
			/* the gradient is the value's size, after the argument block
			 * (and the rows: 8 bytes each, the values' dim 0) */
			uint64_t pre = PS_WAL_ARGS_LEN;
			if (r.type == PS_WAL_APPLY_ROWS)
				pre += r.shape.ndim >= 1 && r.shape.dim[0] >= 0 &&
				       (uint64_t)r.shape.dim[0] < r.data_len / 8
				       ? 8 * (uint64_t)r.shape.dim[0] : r.data_len + 1;
			ok = r.data_len >= pre;
			if (ok) {
				r.data_len -= pre;
				ok = rec_tensor_ok(&r, true, &nbytes);
				r.data_len += pre;
			}
			if (!ok || dg_var_name_check_stored(r.name, NULL) != DG_OK) {
				st = corrupt(err, path, off, "bad apply record");
				goto out;
			}
			/* a data CRC mismatch leaves ok false: torn tail or damage (below) */
			st = read_block(fd, off, &r, &data, &ok, path, err);
			if (st != DG_OK)
				goto out;
		} else if (ok && r.type == PS_WAL_PATCH) {
			if (r.data_len > SIZE_MAX ||
			    !(data = malloc(r.data_len ? (size_t)r.data_len : 1))) {
				st = dg_err_set(err, DG_ENOMEM, "out of memory replaying '%s'",
						path);
				goto out;
			}
			st = rec_read_data(fd, off, &r, data, &ok, path, err);
			if (st != DG_OK) {
				free(data);
				goto out;
			}
		} else if (ok && r.type == PS_WAL_CREATE) {
			if (!rec_tensor_ok(&r, false, &nbytes)) {
				st = corrupt(err, path, off, "bad create record");
				goto out;
			}
		} else if (ok && (r.type == PS_WAL_DELETE || r.type == PS_WAL_RESERVE)) {
			ok = r.data_len == 0;
		} else {
			ok = false;
		}
		if (!ok) {
			free(data);     /* only a PATCH buffer can be left here */
			uint64_t good;
			bool zero;
			st = zero_tail(fd, off, size, path, &zero, err);
			if (st != DG_OK)
				goto out;
			if (zero) {
				/* preallocated space after the last record: cut in the
				 * last segment, which is appended to no more */
				if (last && ftruncate(fd, (off_t)off) != 0)
					st = dg_err_set(err, DG_EIO, "cannot cut the preallocated "
							"tail of '%s' at offset %" PRIu64 ": %s",
							path, off, strerror(errno));
				goto out;
			}
			st = find_good_after(fd, off, size, path, &good, err);
			if (st != DG_OK)
				goto out;
			if (good) {
				char what[120];
				snprintf(what, sizeof what, "bad record followed by a valid one at "
					 "offset %" PRIu64, good);
				st = corrupt(err, path, off, what);
			} else if (!last) {
				st = corrupt(err, path, off, "bad record in a log segment that is "
					     "followed by newer segments");
			} else if (ftruncate(fd, (off_t)off) != 0 || fsync(fd) != 0) {
				st = dg_err_set(err, DG_EIO, "cannot cut the torn tail of '%s' at "
						"offset %" PRIu64 ": %s", path, off,
						strerror(errno));
			} else {
				info->torn_bytes += size - off;
			}
			goto out;
		}
		struct ps_apply_args args;
		struct ps_wal_rec w = {
			.type = (enum ps_wal_type)r.type, .name = r.name, .dtype = r.dtype,
			.shape = r.shape, .version = r.version, .mtime = r.mtime,
			.offset = r.type == PS_WAL_PATCH ? r.aux : 0,
			.ceiling = r.type == PS_WAL_RESERVE ? r.aux : 0,
			.data = data, .data_crc = r.dcrc,
			.nbytes = r.type == PS_WAL_CREATE ? nbytes : (size_t)r.data_len,
			.step = r.type == PS_WAL_ASSIGN && r.aux > 0 && r.aux <= INT64_MAX ?
				(int64_t)r.aux - 1 : -1,
		};
		bool rows = r.type == PS_WAL_APPLY_ROWS;
		bool borrowed = r.type == PS_WAL_PATCH || r.type == PS_WAL_APPLY || rows;
		if (r.type == PS_WAL_CREATE)
			w.fill = bits_f64(r.aux);
		if (r.type == PS_WAL_APPLY || rows) {
			if (!args_decode(data, rows, &args) || (int64_t)r.aux < -1) {
				dg_free_aligned(data);
				st = corrupt(err, path, off, "bad arguments in an apply record");
				goto out;
			}
			w.args = &args;
			w.step = (int64_t)r.aux;
			w.data = (const char *)data + PS_WAL_ARGS_LEN;
			w.nbytes = nbytes;
			if (rows) {
				w.rows = w.data;
				w.data = (const char *)w.data + 8 * (size_t)r.shape.dim[0];
			}
		}
		if (r.type == PS_WAL_RESERVE) {
			if (r.aux > info->ceiling)
				info->ceiling = r.aux;
		} else {
			if (dg_var_name_check_stored(r.name, NULL) != DG_OK) {
				if (r.type == PS_WAL_PATCH)
					free(data);
				else
					dg_free_aligned(data);
				st = corrupt(err, path, off, "bad variable name in a record");
				goto out;
			}
			/* PUT/ASSIGN blocks are adopted (or freed) by the callee */
			st = ops->rec(ops->ud, &w, borrowed ? NULL : data, err);
			if (r.type == PS_WAL_PATCH)
				free(data);
			else if (r.type == PS_WAL_APPLY || rows)
				dg_free_aligned(data);
			if (st != DG_OK) {
				dg_err_prefix(err, "'%s' at offset %" PRIu64, path, off);
				goto out;
			}
		}
		info->n_records++;
		off += r.head_len + r.data_len;
	}
out:
	if (fd >= 0)
		close(fd);
	free(path);
	return st;
}

enum dg_status ps_persist_recover(const char *dir, const struct ps_recover_ops *ops,
				  struct ps_recover_info *info, struct dg_err *err)
{
	char *snap = path_join(dir, SNAP_NAME), *tmp = path_join(dir, SNAP_TMP);
	uint64_t *segs = NULL, first, ceiling = 0;
	size_t n_segs = 0, i;
	enum dg_status st;

	memset(info, 0, sizeof *info);
	if (!snap || !tmp) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	unlink(tmp);   /* an unfinished snapshot: the old one (or none) is current */
	st = seg_list(dir, &segs, &n_segs, err);
	if (st != DG_OK)
		goto out;
	int fd = open(snap, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		info->had_snapshot = true;
		st = snap_load(fd, snap, ops, &first, &ceiling, &info->snapshot_at, err);
		close(fd);
		if (st != DG_OK)
			goto out;
		info->ceiling = ceiling;
	} else if (errno != ENOENT) {
		st = dg_err_set(err, DG_EIO, "cannot open '%s': %s", snap, strerror(errno));
		goto out;
	} else {
		/* No snapshot yet: the log must start at segment 1, else a
		 * snapshot that made earlier segments redundant is missing. */
		first = n_segs ? segs[0] : 1;
		if (first != 1) {
			st = dg_err_set(err, DG_EIO, "'%s' is missing but the log starts at "
					"segment %" PRIu64, snap, first);
			dg_err_hint(err, "restore snapshot.dgs from a backup; dg refuses to start "
				    "without the data it acknowledged");
			goto out;
		}
	}
	/* Segments older than the snapshot survived a crash right after it. */
	for (i = 0; i < n_segs && segs[i] < first; i++) {
		char *p = seg_path(dir, segs[i]);
		if (p)
			unlink(p);
		free(p);
	}
	info->next_seq = first;
	for (size_t k = i; k < n_segs; k++) {
		if (segs[k] != first + (k - i)) {
			st = dg_err_set(err, DG_EIO, "log segment %" PRIu64 " is missing in '%s' "
					"(found %" PRIu64 ")", first + (k - i), dir, segs[k]);
			dg_err_hint(err, "the log must be contiguous from the snapshot on; restore "
				    "the data directory from a backup");
			goto out;
		}
		bool removed;
		st = seg_replay(dir, segs[k], k + 1 == n_segs, ops, info, &removed, err);
		if (st != DG_OK)
			goto out;
		info->next_seq = removed ? segs[k] : segs[k] + 1;
	}
	if (info->had_snapshot && n_segs == i) {
		/* The segment a snapshot names is created before the snapshot. */
		st = dg_err_set(err, DG_EIO, "log segment %" PRIu64 " named by '%s' is missing",
				first, snap);
		dg_err_hint(err, "restore the data directory from a backup");
		goto out;
	}
out:
	free(segs);
	free(snap);
	free(tmp);
	return st;
}
