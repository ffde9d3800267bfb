/* bench_fs_minimal: the smallest useful libfuse3 filesystem, the baseline of
 * bench_fs for what FUSE itself costs. One regular file, /data, held in memory
 * (SIZE MiB, filled with zeros), readable and writable; nothing else. Mounted
 * and unmounted by bench_fs:
 *   bench_fs_minimal MOUNTPOINT SIZE_MIB [--direct-io] [-f ...fuse options]
 * --direct-io sets direct_io and max_read=1 MiB in init() (libfuse 3.14's
 * high-level API takes direct_io only there); without it the page cache is used
 * and dropped at every open (FUSE's default), so every open reads from here. */
#define FUSE_USE_VERSION 31

#include <errno.h>
#include <fuse.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_IO (1u << 20)               /* bytes: max_read and max_write */

static struct {
	char *data;                     /* capacity bytes, one allocation */
	size_t capacity;                /* bytes */
	size_t size;                    /* bytes: the file's current size */
	bool direct_io;
	pthread_mutex_t lock;           /* size, and data against truncation */
} F = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void *mini_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	cfg->entry_timeout = 60;
	cfg->attr_timeout = 60;
	if (F.direct_io) {
		cfg->direct_io = 1;
		conn->max_read = MAX_IO;
	}
	return NULL;
}

static int mini_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	memset(st, 0, sizeof *st);
	if (strcmp(path, "/") == 0) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (strcmp(path, "/data") != 0)
		return -ENOENT;
	st->st_mode = S_IFREG | 0644;
	st->st_nlink = 1;
	pthread_mutex_lock(&F.lock);
	st->st_size = (off_t)F.size;
	pthread_mutex_unlock(&F.lock);
	return 0;
}

static int mini_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
			struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	if (strcmp(path, "/") != 0)
		return -ENOENT;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, "data", NULL, 0, 0);
	return 0;
}

static int mini_open(const char *path, struct fuse_file_info *fi)
{
	return strcmp(path, "/data") == 0 ? 0 : -ENOENT;
}

static int mini_read(const char *path, char *buf, size_t n, off_t off,
		     struct fuse_file_info *fi)
{
	size_t got = 0;

	pthread_mutex_lock(&F.lock);
	if ((size_t)off < F.size) {
		got = F.size - (size_t)off < n ? F.size - (size_t)off : n;
		memcpy(buf, F.data + off, got);
	}
	pthread_mutex_unlock(&F.lock);
	return (int)got;
}

static int mini_write(const char *path, const char *buf, size_t n, off_t off,
		      struct fuse_file_info *fi)
{
	if (off < 0 || (size_t)off > F.capacity || n > F.capacity - (size_t)off)
		return -EFBIG;
	pthread_mutex_lock(&F.lock);
	memcpy(F.data + off, buf, n);
	if ((size_t)off + n > F.size)
		F.size = (size_t)off + n;
	pthread_mutex_unlock(&F.lock);
	return (int)n;
}

static int mini_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	if (size < 0 || (size_t)size > F.capacity)
		return -EFBIG;
	pthread_mutex_lock(&F.lock);
	if ((size_t)size > F.size)
		memset(F.data + F.size, 0, (size_t)size - F.size);
	F.size = (size_t)size;
	pthread_mutex_unlock(&F.lock);
	return 0;
}

static const struct fuse_operations mini_ops = {
	.init = mini_init,
	.getattr = mini_getattr,
	.readdir = mini_readdir,
	.open = mini_open,
	.read = mini_read,
	.write = mini_write,
	.truncate = mini_truncate,
};

int main(int argc, char **argv)
{
	char *fargv[64];
	int fargc = 0, rc;
	unsigned long mib;
	char *end;

	if (argc < 3) {
		fprintf(stderr, "usage: bench_fs_minimal MOUNTPOINT SIZE_MIB [--direct-io] "
			"[FUSE OPTIONS]\n");
		return 1;
	}
	mib = strtoul(argv[2], &end, 10);
	if (*end || mib == 0 || mib > 65536) {
		fprintf(stderr, "bench_fs_minimal: SIZE_MIB '%s' is not 1..65536\n", argv[2]);
		return 1;
	}
	F.capacity = F.size = (size_t)mib << 20;
	F.data = calloc(1, F.capacity);
	if (!F.data) {
		fprintf(stderr, "bench_fs_minimal: out of memory for %lu MiB\n", mib);
		return 1;
	}
	fargv[fargc++] = argv[0];
	fargv[fargc++] = argv[1];
	for (int i = 3; i < argc && fargc < 60; i++) {
		if (strcmp(argv[i], "--direct-io") == 0)
			F.direct_io = true;
		else
			fargv[fargc++] = argv[i];
	}
	/* libfuse 3.14: max_read must be given as a mount option too (fuse_common.h) */
	if (F.direct_io) {
		fargv[fargc++] = "-o";
		fargv[fargc++] = "max_read=1048576";
	}
	fargv[fargc] = NULL;
	rc = fuse_main(fargc, fargv, &mini_ops, NULL);
	free(F.data);
	return rc;
}
