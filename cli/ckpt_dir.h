/* The checkpoint directory of `dg checkpoint save DIR` / `restore DIR`
 * (ckpt_dir.c; format in doc/persistence.md, "Exporting and restoring"): one
 * file per variable (.npy, or the bare bytes for bfloat16) and manifest.json
 * listing each with dtype, shape, version, task, byte count and CRC-32. */
#ifndef DG_CLI_CKPT_DIR_H
#define DG_CLI_CKPT_DIR_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/client.h"

#define CKPT_FORMAT "dg-checkpoint"
#define CKPT_VERSION 1
#define CKPT_MANIFEST "manifest.json"

/* One variable of a checkpoint: what the manifest says about it. */
struct ckpt_var {
	char name[DG_VAR_NAME_MAX + 1];
	char task[64];                  /* label of the task it was saved from, "ps/0" */
	char file[DG_VAR_NAME_MAX + 8]; /* path relative to DIR: NAME.npy or NAME.raw */
	enum dg_dtype dtype;
	struct dg_shape shape;
	uint64_t version;
	uint64_t bytes;                 /* data bytes: numel * dtype size */
	uint32_t crc;                   /* zlib crc32 of the data bytes (not the header) */
	bool raw;                       /* the file is the bare data (bfloat16: no .npy) */
};

/* A manifest read back: vars is owned (free()), n entries in file order. */
struct ckpt_manifest {
	struct ckpt_var *vars;
	int n;
};

/* Fail early, before any export: DIR must not exist, be an empty directory,
 * or (force) a directory holding a previous checkpoint's manifest.json.
 * DG_EEXIST / DG_EINVAL naming DIR otherwise. */
enum dg_status ckpt_dest_check(const char *dir, bool force, struct dg_err *err);

/* Make the staging directory "DIR.tmp-XXXXXX" next to DIR (parents created).
 * Returns the owned path (free()) or NULL with *err set. */
char *ckpt_stage_new(const char *dir, struct dg_err *err);

/* Stream variable name from c (one GET, so one version) into root/FILE,
 * creating its parent directories; fills *out (task copied from task). A
 * file that exists already (two tasks holding one name) is DG_EEXIST.
 * DG_ENOTFOUND when the variable was deleted since it was listed. */
enum dg_status ckpt_export_var(const char *root, struct dg_client *c, const char *name,
			       const char *task, struct ckpt_var *out, struct dg_err *err);

/* Write root/manifest.json for vars[0..n) (borrowed) and tasks (a JSON array of
 * {"task","address"}, borrowed), fsync every directory under root. */
enum dg_status ckpt_manifest_write(const char *root, const struct ckpt_var *vars, int n,
				   json_t *tasks, struct dg_err *err);

/* Move the finished staging directory to dir: a rename when dir is absent or
 * empty; with force, an atomic exchange with the old checkpoint, which is then
 * removed. Checks dir again (ckpt_dest_check) and fsyncs the parent. */
enum dg_status ckpt_install(const char *stage, const char *dir, bool force,
			    struct dg_err *err);

/* Remove a directory tree (cleanup of a failed save); errors are ignored. */
void ckpt_remove_tree(const char *path);

/* Read and check DIR/manifest.json: format, version, and for each variable a
 * valid name (once), dtype, shape, byte count, a file path inside DIR and a
 * CRC. Fills *m (caller's memory; ckpt_manifest_deinit) or DG_EINVAL naming
 * the entry and field. */
enum dg_status ckpt_manifest_read(const char *dir, struct ckpt_manifest *m, struct dg_err *err);
void ckpt_manifest_deinit(struct ckpt_manifest *m);

/* Check v's file against the manifest: it exists (DG_ENOTFOUND), its .npy
 * header parses (DG_EINVAL) and gives v's dtype (DG_EDTYPE) and shape
 * (DG_ESHAPE), its size is header + v->bytes and the data's CRC is v->crc
 * (DG_EIO). With out non-NULL the data is also loaded into *out (owned). */
enum dg_status ckpt_load_var(const char *dir, const struct ckpt_var *v, struct dg_tensor **out,
			     struct dg_err *err);

/* "8.52 MB", "512 B": a byte count for people (powers of 1000). */
void ckpt_format_bytes(double b, char *buf, size_t n);

#endif
