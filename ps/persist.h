/* Durability of the variable store (private to ps/): the files of a data
 * directory (epoch, snapshot.dgs, wal.NNNNNNNN.log, lock), their formats and
 * the group-committed write-ahead log. store.c decides what to log and when;
 * persist.c only knows files and records. Formats: doc/persistence.md. */
#ifndef PS_PERSIST_H
#define PS_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/status.h"
#include "dg/tensor.h"
#include "store.h"

/* CRC-32 of zlib (IEEE polynomial), for any length. Start with 0. */
uint32_t ps_crc32(uint32_t crc, const void *p, size_t n);

/* Take the directory's lock file (flock): two servers on one data directory
 * would interleave their logs. DG_EUNAVAILABLE when another process holds it.
 * *fd gets the descriptor to close at the end. Creates dir (and parents). */
enum dg_status ps_dir_lock(const char *dir, int *fd, struct dg_err *err);
/* Read DIR/epoch (0 when absent), add one and write it atomically. DG_EIO
 * naming the file when it cannot be read, parsed or written. */
enum dg_status ps_epoch_bump(const char *dir, uint64_t *epoch, struct dg_err *err);

/* --- write-ahead log ------------------------------------------------------- */

enum ps_wal_type {
	PS_WAL_PUT = 1,                 /* whole value (create or replace) */
	PS_WAL_PATCH = 2,               /* bytes at an offset */
	PS_WAL_DELETE = 3,
	PS_WAL_ASSIGN = 4,              /* apply(assign): whole value, same dtype/shape */
	PS_WAL_RESERVE = 5,             /* versions up to ceiling may be handed out */
	PS_WAL_CREATE = 6,              /* a zero-filled value of dtype/shape (slots) */
	PS_WAL_APPLY = 7,               /* --durability strict: an update rule and its
					 * gradient, replayed onto the value and slots */
	PS_WAL_APPLY_ROWS = 8,          /* a row-wise apply (assign always, the other
					 * rules with --durability strict): the rule,
					 * the rows and their values */
};

/* Bytes of an APPLY record's data before the gradient: the encoded rule and
 * hyper-parameters (64, so the gradient stays aligned in a read block). */
#define PS_WAL_ARGS_LEN 64

/* One record, to append or as replayed. Pointers are borrowed. */
struct ps_wal_rec {
	enum ps_wal_type type;
	const char *name;               /* NULL for RESERVE */
	enum dg_dtype dtype;            /* PUT, ASSIGN, CREATE */
	struct dg_shape shape;          /* PUT, ASSIGN, CREATE */
	uint64_t version;               /* the version this change produced */
	double mtime;                   /* seconds since the Unix epoch */
	uint64_t offset;                /* PATCH: byte offset */
	uint64_t ceiling;               /* RESERVE */
	const void *data;               /* PUT, ASSIGN, PATCH; APPLY: the gradient */
	size_t nbytes;                  /* of data; CREATE: of the value (nothing is stored) */
	uint32_t data_crc;              /* ps_crc32 of data (by the caller, outside locks);
					 * APPLY: ps_wal_apply_crc */
	const struct ps_apply_args *args;   /* APPLY: the rule (its step and rows are not
					     * used) */
	const int64_t *rows;            /* APPLY_ROWS: shape.dim[0] rows; dtype and shape
					 * are the values' ([n] + the variable's rows) */
	double fill;                    /* CREATE: the value of every element */
	int64_t step;                   /* APPLY, ASSIGN: the variable's sync step after
					 * it; -1 async (ASSIGN must set it) */
};

/* The data CRC of an APPLY record of rule a and gradient g (n bytes): the
 * CRC of the encoded arguments, then of g. */
uint32_t ps_wal_apply_crc(const struct ps_apply_args *a, const void *g, size_t n);
/* The data CRC of an APPLY_ROWS record: the arguments, the n rows, the values. */
uint32_t ps_wal_rows_crc(const struct ps_apply_args *a, const int64_t *rows, int64_t n,
			 const void *vals, size_t nbytes);

struct ps_wal;

/* Create segment DIR/wal.<seq>.log (header written and fsync'ed, directory
 * fsync'ed) and return a log appending to it. Owned or NULL with *err set. */
struct ps_wal *ps_wal_open(const char *dir, uint64_t seq, struct dg_err *err);
/* fdatasync what is pending, close, free. NULL is fine. */
void ps_wal_close(struct ps_wal *w);
/* Append one record (not yet durable). *lsn gets the log position to pass to
 * ps_wal_sync. On a write error the segment is cut back to the record's start
 * (or the log is marked failed when even that fails) and DG_EIO returned.
 * Thread-safe; callers that need records of one variable in order append
 * while holding that variable's lock. */
enum dg_status ps_wal_append(struct ps_wal *w, const struct ps_wal_rec *r, uint64_t *lsn,
			     struct dg_err *err);
/* Block until everything up to lsn is on disk. Group commit: one caller
 * fdatasyncs for all that appended before it started; the others wait. An
 * fdatasync failure marks the log failed: this and later calls give DG_EIO. */
enum dg_status ps_wal_sync(struct ps_wal *w, uint64_t lsn, struct dg_err *err);
/* Create the next segment (as ps_wal_open does) without switching to it, so
 * the slow part of a rotation happens outside the store's locks. */
enum dg_status ps_wal_segment_create(const char *dir, uint64_t seq, int *fd, struct dg_err *err);
/* Remove an unused segment made by ps_wal_segment_create (its fd closed). */
void ps_wal_segment_discard(const char *dir, uint64_t seq);
/* Make everything appended so far durable, then append to the segment fd/seq
 * from now on (takes ownership of fd on success and on failure). Called with
 * the store's map lock held for writing, so no append is in progress. */
enum dg_status ps_wal_switch(struct ps_wal *w, int fd, uint64_t seq, struct dg_err *err);
/* Remove the segments numbered below seq (after a snapshot made them redundant). */
void ps_wal_remove_before(const char *dir, uint64_t seq);
uint64_t ps_wal_seq(struct ps_wal *w);
uint64_t ps_wal_fsyncs(struct ps_wal *w);
/* true once an fdatasync failed (nothing is acknowledged any more); msg (n
 * bytes) gets why. */
bool ps_wal_failed(struct ps_wal *w, char *msg, size_t n);
uint64_t ps_wal_bytes(struct ps_wal *w);      /* bytes in the current segment */

/* --- snapshot -------------------------------------------------------------- */

struct ps_snap_item {
	const char *name;
	const struct ps_value *value;   /* a held reference: its bytes do not change */
	int64_t sync_step;
};
/* Write DIR/snapshot.dgs via snapshot.dgs.tmp (fsync, rename, directory
 * fsync). wal_seq: the first log segment that is not in this snapshot;
 * ceiling: the version ceiling at the cut; cut_at: the cut's wall time
 * (seconds since the Unix epoch, kept in the head record's mtime). *bytes
 * (may be NULL) gets the file's size. */
enum dg_status ps_snapshot_write(const char *dir, uint64_t wal_seq, uint64_t ceiling,
				 double cut_at, const struct ps_snap_item *items, size_t n,
				 uint64_t *bytes, struct dg_err *err);

/* --- recovery -------------------------------------------------------------- */

/* A variable read from the snapshot; data is owned by the callee (a block from
 * dg_alloc_aligned of nbytes, adopted or freed with dg_free_aligned). */
struct ps_snap_var {
	const char *name;
	enum dg_dtype dtype;
	struct dg_shape shape;
	size_t nbytes;
	uint64_t version;
	double mtime;
	int64_t sync_step;
};
struct ps_recover_ops {
	void *ud;
	enum dg_status (*var)(void *ud, const struct ps_snap_var *v, void *data,
			      struct dg_err *err);
	/* A log record; for PUT/ASSIGN data is an owned dg_alloc_aligned block
	 * (r->data == data), for PATCH and APPLY a borrowed buffer (data NULL),
	 * else NULL. RESERVE records are not passed on (they only raise
	 * info->ceiling). */
	enum dg_status (*rec)(void *ud, const struct ps_wal_rec *r, void *data,
			      struct dg_err *err);
};
struct ps_recover_info {
	bool had_snapshot;
	double snapshot_at;             /* wall time of the snapshot's cut; 0: none (or
					 * written before dg kept it) */
	uint64_t ceiling;               /* highest version ceiling seen (snapshot or log) */
	uint64_t next_seq;              /* the segment number to start appending to */
	uint64_t n_records;             /* log records replayed */
	uint64_t torn_bytes;            /* bytes of an unacknowledged tail cut from the log */
};
/* Load DIR/snapshot.dgs and replay the log segments after it, in order,
 * through ops. A torn tail of the last segment (never acknowledged) is cut
 * off; any other damage is DG_EIO naming the file and the offset, so the
 * server refuses to start rather than start without acknowledged data. */
enum dg_status ps_persist_recover(const char *dir, const struct ps_recover_ops *ops,
				  struct ps_recover_info *info, struct dg_err *err);

#endif
