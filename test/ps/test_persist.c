/* Durability of the store (ps/persist.c, ps/store.c): close and reopen, crashes
 * simulated by child processes that _exit() or are SIGKILLed mid-stream, torn
 * and corrupt logs, corrupt snapshots, the epoch, versions that never go
 * backwards, the checkpoint thread, and group commit. Each test works in its
 * own temporary data directory. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"
#include "dg/buf.h"
#include "dg/log.h"
#include "persist.h"
#include "store.h"

static char dir[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "/tmp/dg-persist-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(persist, .init = make_dir, .fini = remove_dir, .timeout = 120);

static struct ps_store *open_dir(unsigned secs, struct dg_err *err)
{
	struct ps_store_config cfg = { .data_dir = dir, .checkpoint_secs = secs };

	return ps_store_open(&cfg, err);
}

static struct ps_store *reopen(void)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(60, &err);

	cr_assert_not_null(s, "open %s: %s", dir, err.msg);
	return s;
}

static struct dg_tensor *vec(enum dg_dtype dt, int n, double v)
{
	struct dg_shape sh = dg_shape_make(1, (int64_t[]){ n });
	struct dg_tensor *t = dg_tensor_new(dt, &sh, NULL);

	for (int i = 0; i < n; i++)
		dg_tensor_set_f64(t, i, v + i);
	return t;
}

/* Element i of a variable as double; NAN when the variable is missing. */
static double at(struct ps_store *s, const char *name, int i)
{
	struct ps_value *v;
	struct dg_tensor t;

	if (ps_store_get(s, name, &v, NULL) != DG_OK)
		return NAN;
	t = (struct dg_tensor){ .dtype = v->dtype, .data = (void *)v->data };
	double x = dg_tensor_get_f64(&t, i);
	ps_value_release(v);
	return x;
}

static uint64_t version_of(struct ps_store *s, const char *name)
{
	struct ps_value *v;

	cr_assert_eq(ps_store_get(s, name, &v, NULL), DG_OK, "%s missing", name);
	uint64_t ver = v->version;
	ps_value_release(v);
	return ver;
}

static uint64_t put(struct ps_store *s, const char *name, struct dg_tensor *t)
{
	struct dg_err err = { 0 };
	uint64_t ver = 0;

	cr_assert_eq(ps_store_put(s, name, t, NULL, &ver, NULL, &err), DG_OK, "%s", err.msg);
	return ver;
}

static struct ps_apply_args rule(enum ps_rule r)
{
	return (struct ps_apply_args){ .rule = r, .lr = 0.5, .momentum = 0.9, .beta1 = 0.9,
				       .beta2 = 0.999, .eps = 1e-8, .rho = 0.9,
				       .init = r == PS_ADAGRAD ? 0.1 : 1.0, .step = -1, .replica = -1 };
}

/* vec(dt, rows * cols, v) as [rows, cols] */
static struct dg_tensor *mat(enum dg_dtype dt, int rows, int cols, double v)
{
	struct dg_tensor *t = vec(dt, rows * cols, v);

	t->shape = dg_shape_make(2, (int64_t[]){ rows, cols });
	return t;
}

static void apply(struct ps_store *s, const char *name, struct ps_apply_args a, struct dg_tensor *g)
{
	struct dg_err err = { 0 };

	cr_assert_eq(ps_store_apply(s, name, &a, g, NULL, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(g);
}

static uint64_t metric(struct ps_store *s, const char *name)
{
	struct dg_buf b = { 0 };
	char key[80];

	cr_assert_eq(ps_store_metrics(s, &b, NULL), DG_OK);
	snprintf(key, sizeof key, "\n%s ", name);
	const char *p = strstr(b.data, key);
	cr_assert_not_null(p, "no %s in metrics", name);
	uint64_t v = strtoull(p + strlen(key), NULL, 10);
	dg_buf_deinit(&b);
	return v;
}

/* Path of the newest log segment (static buffer). */
static const char *newest_segment(void)
{
	static char path[128];
	unsigned long best = 0;
	DIR *d = opendir(dir);
	struct dirent *de;

	cr_assert_not_null(d);
	while ((de = readdir(d))) {
		unsigned long n;
		if (sscanf(de->d_name, "wal.%lu.log", &n) == 1 && n > best)
			best = n;
	}
	closedir(d);
	cr_assert_gt(best, 0, "no log segment in %s", dir);
	snprintf(path, sizeof path, "%s/wal.%08lu.log", dir, best);
	return path;
}

static int count_segments(void)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	while ((de = readdir(d))) {
		unsigned long k;
		n += sscanf(de->d_name, "wal.%lu.log", &k) == 1;
	}
	closedir(d);
	return n;
}

static off_t file_size(const char *path)
{
	struct stat sb;

	cr_assert_eq(stat(path, &sb), 0, "stat %s", path);
	return sb.st_size;
}

/* Flip one byte of a file at off. */
static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char b;

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	cr_assert_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/* Offset of the first occurrence of pattern in a file, -1 when absent. */
static off_t find_in_file(const char *path, const void *pat, size_t n)
{
	struct dg_buf b = { 0 };
	off_t at_off = -1;

	cr_assert_eq(dg_buf_read_file(&b, path, 1 << 28, NULL), DG_OK);
	for (size_t i = 0; i + n <= b.len; i++)
		if (memcmp(b.data + i, pat, n) == 0) {
			at_off = (off_t)i;
			break;
		}
	dg_buf_deinit(&b);
	return at_off;
}

/* Run fn in a child that "crashes": _exit without closing the store. *rfd
 * gets the read end of a pipe the child writes its acknowledgements to. */
static pid_t in_crashing_child(void (*fn)(int fd), int *rfd)
{
	int p[2];

	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		fn(p[1]);
		_exit(0);
	}
	close(p[1]);
	*rfd = p[0];
	return pid;
}

static int wait_child(void)
{
	int status = 0;

	while (wait(&status) < 0 && errno == EINTR)
		;
	return status;
}

/* --- basics ---------------------------------------------------------------------------------- */

Test(persist, crc32_gives_the_values_of_zlib)
{
	cr_assert_eq(ps_crc32(0, "123456789", 9), 0xCBF43926u);
	cr_assert_eq(ps_crc32(0, "", 0), 0u);
	/* incremental = one shot, across the 8-byte fast path */
	const char *text = "The quick brown fox jumps over the lazy dog";
	uint32_t c = ps_crc32(ps_crc32(0, text, 11), text + 11, strlen(text) - 11);
	cr_assert_eq(c, 0x414FA339u);
	cr_assert_eq(ps_crc32(0, text, strlen(text)), 0x414FA339u);
}

Test(persist, the_epoch_counts_opens_of_a_data_directory)
{
	for (uint64_t e = 1; e <= 3; e++) {
		struct ps_store *s = reopen();
		cr_assert_eq(ps_store_epoch(s), e);
		cr_assert_eq(metric(s, "dg_ps_epoch"), e);
		ps_store_close(s);
	}
	char path[128];
	struct dg_buf b = { 0 };
	snprintf(path, sizeof path, "%s/epoch", dir);
	cr_assert_eq(dg_buf_read_file(&b, path, 64, NULL), DG_OK);
	cr_assert_str_eq(b.data, "3\n");
	dg_buf_deinit(&b);
	/* a damaged epoch file stops the start rather than restarting the counter */
	cr_assert_eq(dg_write_file_atomic(path, "x7\n", 3, NULL), DG_OK);
	struct dg_err err = { 0 };
	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EIO, "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "epoch"), "%s", err.msg);
}

Test(persist, a_data_directory_in_use_is_refused)
{
	struct ps_store *s = reopen();
	struct dg_err err = { 0 };

	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EUNAVAILABLE, "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, dir), "%s", err.msg);
	ps_store_close(s);
	s = reopen();
	ps_store_close(s);
}

/* --- close and reopen ------------------------------------------------------------------------ */

/* Writes of every logged kind plus applies, slots and a sync step. */
static void write_everything(struct ps_store *s)
{
	struct dg_err err = { 0 };
	float patch[2] = { -7, -8 };

	put(s, "a", vec(DG_F32, 4, 1));                              /* 1 2 3 4 */
	cr_assert_eq(ps_store_patch(s, "a", 4, patch, 8, 0, NULL, &err), DG_OK);   /* 1 -7 -8 4 */
	put(s, "gone", vec(DG_I64, 2, 5));
	cr_assert_eq(ps_store_delete(s, "gone", 0, &err), DG_OK);
	put(s, "ints", vec(DG_I32, 3, 0));
	apply(s, "ints", rule(PS_ASSIGN), vec(DG_I32, 3, 40));       /* 40 41 42 */
	struct ps_put_opts rep = { .replace = true };
	cr_assert_eq(ps_store_put(s, "r", vec(DG_F64, 2, 0), NULL, NULL, NULL, &err), DG_OK);
	cr_assert_eq(ps_store_put(s, "r", vec(DG_U8, 5, 9), &rep, NULL, NULL, &err), DG_OK);
}

static void check_everything(struct ps_store *s)
{
	cr_assert_eq(at(s, "a", 0), 1.0);
	cr_assert_eq(at(s, "a", 1), -7.0);
	cr_assert_eq(at(s, "a", 2), -8.0);
	cr_assert_eq(at(s, "a", 3), 4.0);
	cr_assert(isnan(at(s, "gone", 0)), "deleted variable came back");
	cr_assert_eq(at(s, "ints", 2), 42.0);
	struct ps_value *v;
	cr_assert_eq(ps_store_get(s, "r", &v, NULL), DG_OK);
	cr_assert_eq(v->dtype, DG_U8);
	cr_assert_eq(v->shape.dim[0], 5);
	cr_assert_eq(((const uint8_t *)v->data)[4], 13);
	ps_value_release(v);
}

Test(persist, put_patch_delete_and_assign_survive_close_and_reopen)
{
	struct ps_store *s = reopen();
	uint64_t va, vi;

	write_everything(s);
	va = version_of(s, "a");
	vi = version_of(s, "ints");
	double t0 = dg_wall_s();
	ps_store_close(s);              /* writes the final snapshot */
	s = reopen();
	check_everything(s);
	/* It started from that snapshot and says when it was cut. */
	cr_assert_geq(ps_store_snapshot_at(s), t0 - 0.001);
	cr_assert_leq(ps_store_snapshot_at(s), dg_wall_s());
	/* A restart gives every variable a new version above all before it. */
	uint64_t top = va > vi ? va : vi;
	cr_assert_gt(version_of(s, "a"), top, "a's version did not move above %" PRIu64, top);
	cr_assert_gt(version_of(s, "ints"), top);
	cr_assert_neq(version_of(s, "a"), version_of(s, "ints"));
	ps_store_close(s);
}

static void child_write_everything(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(60, &err);

	if (!s)
		_exit(2);
	write_everything(s);
	char ok = 1;
	if (write(fd, &ok, 1) != 1)
		_exit(3);
	/* no close: the log is all there is */
}

Test(persist, acknowledged_writes_survive_a_crash_through_the_log)
{
	int rfd;
	char ok = 0;

	in_crashing_child(child_write_everything, &rfd);
	cr_assert_eq(read(rfd, &ok, 1), 1);
	close(rfd);
	cr_assert_eq(WEXITSTATUS(wait_child()), 0);
	struct ps_store *s = reopen();
	check_everything(s);
	ps_store_close(s);
	/* and once more from the snapshot that close wrote */
	s = reopen();
	check_everything(s);
	ps_store_close(s);
}

Test(persist, slots_and_sync_steps_survive_a_restart)
{
	struct ps_store *s = reopen();
	struct dg_err err = { 0 };
	struct ps_apply_result res;

	put(s, "w", vec(DG_F64, 2, 1));
	apply(s, "w", rule(PS_ADAM), vec(DG_F64, 2, 1));
	struct ps_apply_args a = rule(PS_SGD);
	a.step = 0;
	a.replicas = 1;
	apply(s, "w", a, vec(DG_F64, 2, 1));
	double m = at(s, "w.adam_m", 1), w = at(s, "w", 0);
	ps_store_close(s);

	s = reopen();
	cr_assert_eq(at(s, "w.adam_m", 1), m);
	cr_assert_eq(at(s, "w.adam_t", 0), 1.0);
	cr_assert_eq(at(s, "w", 0), w);
	struct dg_tensor *g = vec(DG_F64, 2, 0);
	cr_assert_eq(ps_store_apply(s, "w", &a, g, &res, &err), DG_ESTALE, "step 0 was applied");
	a.step = 1;
	cr_assert_eq(ps_store_apply(s, "w", &a, g, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.step, 2);
	dg_tensor_free(g);
	ps_store_close(s);
}

/* The child of the checkpoint test: three sync steps of w (f64 [2] = 1, 2)
 * with gradient (1, 2) at lr 0.5, a checkpoint, then an apply that no snapshot
 * holds. Writes the checkpoint's report to fd, then "crashes". */
static void child_checkpoint_then_apply(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(3600, &err);
	struct ps_apply_args a = rule(PS_SGD);
	struct ps_ckpt_info info;

	if (!s)
		_exit(2);
	put(s, "w", vec(DG_F64, 2, 1));
	a.replicas = 1;
	for (a.step = 0; a.step < 3; a.step++)
		apply(s, "w", a, vec(DG_F64, 2, 1));
	if (ps_store_checkpoint_now(s, &info, &err) != DG_OK)
		_exit(3);
	a.step = 3;
	apply(s, "w", a, vec(DG_F64, 2, 100));
	if (write(fd, &info, sizeof info) != (ssize_t)sizeof info)
		_exit(4);
}

Test(persist, a_checkpoint_on_demand_keeps_applies_and_sync_steps_through_a_crash)
{
	struct ps_ckpt_info info = { 0 };
	struct ps_apply_result res;
	struct dg_err err = { 0 };
	struct ps_value *v;
	struct stat sb;
	char path[128];
	int rfd;

	in_crashing_child(child_checkpoint_then_apply, &rfd);
	cr_assert_eq(read(rfd, &info, sizeof info), (ssize_t)sizeof info);
	close(rfd);
	cr_assert_eq(WEXITSTATUS(wait_child()), 0);
	cr_assert_eq(info.epoch, 1);
	cr_assert_eq(info.vars, 1);
	snprintf(path, sizeof path, "%s/snapshot.dgs", dir);
	cr_assert_eq(stat(path, &sb), 0);
	cr_assert_eq(info.bytes, (uint64_t)sb.st_size);
	cr_assert(info.ms >= 0);
	struct ps_store *s = reopen();
	/* w - 3 * 0.5 * g with g = w = (1, 2): the apply after the checkpoint is lost */
	cr_assert_eq(at(s, "w", 0), -0.5);
	cr_assert_eq(at(s, "w", 1), -1.0);
	cr_assert_eq(ps_store_get(s, "w", &v, &err), DG_OK);
	cr_assert_eq(v->step, 3);
	ps_value_release(v);
	struct ps_apply_args a = rule(PS_SGD);
	a.replicas = 1;
	a.step = 3;
	struct dg_tensor *g = vec(DG_F64, 2, 1);
	cr_assert_eq(ps_store_apply(s, "w", &a, g, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.step, 4);
	dg_tensor_free(g);
	ps_store_close(s);
}

static void child_slot_writes(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(60, &err);
	struct ps_put_opts rep = { .replace = true };
	float x = 42;

	if (!s)
		_exit(2);
	struct ps_apply_args a = rule(PS_MOMENTUM);
	struct dg_tensor *g4 = vec(DG_F32, 4, 1), *g8 = vec(DG_F32, 8, 1);
	/* a slot made after the snapshot, then written: the write must replay */
	if (ps_store_put(s, "w", vec(DG_F32, 4, 0), NULL, NULL, NULL, &err) != DG_OK ||
	    ps_store_apply(s, "w", &a, g4, NULL, &err) != DG_OK ||
	    ps_store_patch(s, "w.momentum", 12, &x, 4, 0, NULL, &err) != DG_OK)
		_exit(3);
	/* a slot reset to a larger shape, then written past the old size */
	if (ps_store_put(s, "w", vec(DG_F32, 8, 0), &rep, NULL, NULL, &err) != DG_OK ||
	    ps_store_apply(s, "w", &a, g8, NULL, &err) != DG_OK ||
	    ps_store_patch(s, "w.momentum", 28, &x, 4, 0, NULL, &err) != DG_OK)
		_exit(4);
	dg_tensor_free(g4);
	dg_tensor_free(g8);
	if (write(fd, "k", 1) != 1)
		_exit(5);
}

Test(persist, writes_to_slots_made_by_unlogged_applies_replay_after_a_crash)
{
	char ok;
	int rfd;

	in_crashing_child(child_slot_writes, &rfd);
	cr_assert_eq(read(rfd, &ok, 1), 1);
	close(rfd);
	cr_assert_eq(WEXITSTATUS(wait_child()), 0);
	struct ps_store *s = reopen();
	struct ps_value *v;
	cr_assert_eq(ps_store_get(s, "w.momentum", &v, NULL), DG_OK);
	cr_assert_eq(v->shape.dim[0], 8);
	/* the applies are lost (zeros where they wrote), the acknowledged patch is not */
	cr_assert_eq(((const float *)v->data)[0], 0.0f);
	cr_assert_eq(((const float *)v->data)[7], 42.0f);
	ps_value_release(v);
	cr_assert_eq(at(s, "w", 7), 7.0);
	ps_store_close(s);
}

/* --- crashes --------------------------------------------------------------------------------- */

static void child_put_forever(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(1, &err);

	if (!s)
		_exit(2);
	for (int32_t i = 0; i < 1000000; i++) {
		char name[32];
		snprintf(name, sizeof name, "k/%d", i);
		if (ps_store_put(s, name, vec(DG_F64, 2, i), NULL, NULL, NULL, &err) != DG_OK)
			_exit(4);
		struct ps_apply_args a = rule(PS_ASSIGN);
		struct dg_tensor *g = vec(DG_I64, 1, i);
		if (ps_store_apply(s, "last", &a, g, NULL, &err) != DG_OK)
			_exit(5);
		dg_tensor_free(g);
		if (write(fd, &i, sizeof i) != sizeof i)   /* acknowledged: tell the parent */
			_exit(6);
	}
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(persist, every_acknowledged_write_is_there_after_a_sigkill_mid_stream)
{
	struct ps_store *s = reopen();
	int32_t i, acked = -1;
	int rfd;

	put(s, "last", vec(DG_I64, 1, -1));
	ps_store_close(s);
	pid_t pid = in_crashing_child(child_put_forever, &rfd);
	/* run across a checkpoint (every 1 s) so that snapshot and log both matter */
	double t0 = mono_s();
	while (read(rfd, &i, sizeof i) == sizeof i) {
		acked = i;
		if (acked >= 200 && mono_s() - t0 > 1.5)
			break;
	}
	cr_assert_geq(acked, 200, "the child stopped early");
	kill(pid, SIGKILL);
	/* acknowledgements written before the kill still count */
	while (read(rfd, &i, sizeof i) == sizeof i)
		acked = i;
	close(rfd);
	int status = wait_child();
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);

	s = reopen();
	for (int32_t k = 0; k <= acked; k++) {
		char name[32];
		snprintf(name, sizeof name, "k/%d", k);
		cr_assert_eq(at(s, name, 0), (double)k, "acknowledged %s lost (acked %d)", name,
			     acked);
		cr_assert_eq(at(s, name, 1), (double)k + 1);
	}
	/* the write in flight at the kill may or may not be there; none after it */
	double last = at(s, "last", 0);
	cr_assert(last == acked || last == acked + 1, "last %g, acked %d", last, acked);
	char name[32];
	snprintf(name, sizeof name, "k/%d", acked + 2);
	cr_assert(isnan(at(s, name, 0)));
	ps_store_close(s);
}

static void child_five_puts(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(60, &err);

	if (!s)
		_exit(2);
	for (int i = 0; i < 5; i++) {
		char name[8];
		snprintf(name, sizeof name, "t%d", i);
		/* 1234.5 + i*1000 marks each record's data in the file */
		if (ps_store_put(s, name, vec(DG_F32, 16, 1234.5 + i * 1000), NULL, NULL, NULL,
				 &err) != DG_OK)
			_exit(3);
	}
	if (write(fd, "k", 1) != 1)
		_exit(4);
}

static void crash_after_five_puts(void)
{
	char ok;
	int rfd;

	in_crashing_child(child_five_puts, &rfd);
	cr_assert_eq(read(rfd, &ok, 1), 1);
	close(rfd);
	cr_assert_eq(WEXITSTATUS(wait_child()), 0);
}

static char logged[512];

static void capture(enum dg_log_level level, const char *component, const char *line, void *ud)
{
	(void)ud;
	if (level >= DG_LOG_WARN)
		snprintf(logged, sizeof logged, "%s: %s", component, line);
}

Test(persist, a_torn_record_at_the_end_of_the_log_is_ignored)
{
	crash_after_five_puts();
	const char *seg = newest_segment();
	float mark = 1234.5f + 4000;
	off_t data = find_in_file(seg, &mark, sizeof mark);
	cr_assert_gt(data, 0, "t4's data is not in %s", seg);
	/* tear the last record (a crash inside its write), then add junk */
	cr_assert_eq(truncate(seg, data + 8), 0);
	int fd = open(seg, O_WRONLY | O_APPEND);
	cr_assert_eq(write(fd, "\0\0\0\0junk", 8), 8);
	close(fd);

	dg_log_set_sink(capture, NULL);
	struct ps_store *s = reopen();
	dg_log_set_sink(NULL, NULL);
	cr_assert_not_null(strstr(logged, "unacknowledged log tail"), "logged: '%s'", logged);
	for (int i = 0; i < 4; i++) {
		char name[8];
		snprintf(name, sizeof name, "t%d", i);
		cr_assert_eq(at(s, name, 0), 1234.5 + i * 1000);
	}
	cr_assert(isnan(at(s, "t4", 0)), "the torn record was never acknowledged");
	put(s, "after", vec(DG_F32, 1, 3));
	ps_store_close(s);
	s = reopen();
	cr_assert_eq(at(s, "after", 0), 3.0);
	cr_assert_eq(at(s, "t3", 15), 1234.5 + 3000 + 15);
	ps_store_close(s);
}

Test(persist, a_record_torn_in_preallocated_space_is_cut_with_the_zeros_after_it)
{
	crash_after_five_puts();
	const char *seg = newest_segment();
	float mark = 1234.5f + 4000;
	off_t data = find_in_file(seg, &mark, sizeof mark);
	/* the record's last 56 bytes never reached the disk: zeros, as the
	 * preallocated space after it */
	cr_assert_gt(file_size(seg), data + 64 + 4096, "no preallocated tail in %s", seg);
	int fd = open(seg, O_WRONLY);
	cr_assert_eq(pwrite(fd, (char[56]){ 0 }, 56, data + 8), 56);
	close(fd);
	char path[128];
	snprintf(path, sizeof path, "%s", seg);
	struct ps_store *s = reopen();
	cr_assert_lt(file_size(path), data, "the torn record and the zeros were cut");
	cr_assert_eq(at(s, "t3", 0), 1234.5 + 3000);
	cr_assert(isnan(at(s, "t4", 0)), "the torn record was never acknowledged");
	ps_store_close(s);
}

Test(persist, zeros_after_the_records_of_an_older_segment_are_not_damage)
{
	struct dg_err err = { 0 };
	unsigned long n;
	int fd;

	/* a crash after the next segment was made, before the rotation cut the
	 * old one's preallocated tail */
	crash_after_five_puts();
	const char *seg = newest_segment();
	cr_assert_eq(sscanf(strrchr(seg, '/'), "/wal.%lu.log", &n), 1);
	cr_assert_eq(ps_wal_segment_create(dir, n + 1, &fd, &err), DG_OK, "%s", err.msg);
	close(fd);
	struct ps_store *s = reopen();
	for (int i = 0; i < 5; i++) {
		char name[8];
		snprintf(name, sizeof name, "t%d", i);
		cr_assert_eq(at(s, name, 0), 1234.5 + i * 1000);
	}
	ps_store_close(s);
}

Test(persist, a_corrupt_record_in_the_middle_of_the_log_is_refused)
{
	crash_after_five_puts();
	const char *seg = newest_segment();
	float mark = 2234.5f;   /* first element of t1 */
	off_t off = find_in_file(seg, &mark, sizeof mark);
	cr_assert_gt(off, 0);
	flip_byte(seg, off + 2);

	struct dg_err err = { 0 };
	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EIO, "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "offset"), "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "wal."), "%s", err.msg);
	cr_assert_neq(err.hint[0], '\0');
	/* the refusal changed nothing: undo the damage and everything is there */
	flip_byte(seg, off + 2);
	struct ps_store *s = reopen();
	cr_assert_eq(at(s, "t4", 1), 1234.5 + 4000 + 1);
	ps_store_close(s);
}

Test(persist, a_corrupt_or_truncated_snapshot_is_refused)
{
	struct ps_store *s = reopen();
	char snap[128];
	struct dg_err err = { 0 };
	float mark = 777.25f;

	put(s, "w", vec(DG_F32, 64, 777.25));
	put(s, "v", vec(DG_F64, 8, 1));
	ps_store_close(s);   /* writes the snapshot */
	snprintf(snap, sizeof snap, "%s/snapshot.dgs", dir);
	off_t off = find_in_file(snap, &mark, sizeof mark);
	cr_assert_gt(off, 0);
	flip_byte(snap, off + 40);
	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EIO, "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "snapshot.dgs"), "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "offset"), "%s", err.msg);
	flip_byte(snap, off + 40);

	off_t size = file_size(snap);
	cr_assert_eq(truncate(snap, size - 10), 0);
	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EIO, "%s", err.msg);
	cr_assert_eq(truncate(snap, 5), 0);
	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EIO, "%s", err.msg);
}

Test(persist, a_missing_snapshot_with_later_log_segments_is_refused)
{
	struct ps_store *s = reopen();
	char snap[128];
	struct dg_err err = { 0 };

	put(s, "w", vec(DG_F32, 4, 1));
	cr_assert_eq(ps_store_checkpoint(s, &err), DG_OK, "%s", err.msg);
	ps_store_close(s);
	snprintf(snap, sizeof snap, "%s/snapshot.dgs", dir);
	cr_assert_eq(unlink(snap), 0);
	cr_assert_null(open_dir(60, &err));
	cr_assert_eq(err.code, DG_EIO, "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "missing"), "%s", err.msg);
}

Test(persist, leftovers_of_a_crashed_checkpoint_are_cleaned_up)
{
	struct ps_store *s = reopen();
	char path[160];

	put(s, "w", vec(DG_F32, 4, 1));
	ps_store_close(s);
	crash_after_five_puts();
	/* a half-written snapshot and a segment whose header never made it */
	snprintf(path, sizeof path, "%s/snapshot.dgs.tmp", dir);
	cr_assert_eq(dg_write_file_atomic(path, "partial", 7, NULL), DG_OK);
	const char *seg = newest_segment();
	unsigned long n;
	cr_assert_eq(sscanf(strrchr(seg, '/') + 1, "wal.%lu.log", &n), 1);
	snprintf(path, sizeof path, "%s/wal.%08lu.log", dir, n + 1);
	cr_assert_eq(dg_write_file_atomic(path, "DGW", 3, NULL), DG_OK);

	s = reopen();
	cr_assert_eq(at(s, "w", 3), 4.0);
	cr_assert_eq(at(s, "t4", 0), 1234.5 + 4000);
	ps_store_close(s);
	snprintf(path, sizeof path, "%s/snapshot.dgs.tmp", dir);
	cr_assert_neq(access(path, F_OK), 0);
}

/* --- versions across restarts ---------------------------------------------------------------- */

static void child_applies(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(60, &err);
	struct ps_apply_result res = { 0 };

	if (!s)
		_exit(2);
	struct dg_tensor *g = vec(DG_F32, 4, 0.25);
	if (ps_store_put(s, "w", vec(DG_F32, 4, 0), NULL, NULL, NULL, &err) != DG_OK)
		_exit(3);
	for (int i = 0; i < 3000; i++) {
		struct ps_apply_args a = rule(PS_SGD);
		if (ps_store_apply(s, "w", &a, g, &res, &err) != DG_OK)
			_exit(4);
	}
	dg_tensor_free(g);
	if (write(fd, &res.version, sizeof res.version) != sizeof res.version)
		_exit(5);
}

Test(persist, versions_after_a_restart_are_above_every_version_handed_out_before)
{
	struct ps_store *s = reopen();
	uint64_t before = put(s, "a", vec(DG_F32, 1, 1));
	ps_store_close(s);
	s = reopen();
	uint64_t after = put(s, "a", vec(DG_F32, 1, 2));
	cr_assert_gt(after, before);
	ps_store_close(s);

	/* a crash with 3000 applies that were never checkpointed */
	int rfd;
	uint64_t last = 0;
	in_crashing_child(child_applies, &rfd);
	cr_assert_eq(read(rfd, &last, sizeof last), (ssize_t)sizeof last);
	close(rfd);
	cr_assert_eq(WEXITSTATUS(wait_child()), 0);
	cr_assert_gt(last, after + 3000);
	s = reopen();
	/* the applies are lost (not logged, not checkpointed); the put is not */
	cr_assert_eq(at(s, "w", 2), 2.0);   /* as put: [0 1 2 3] */
	uint64_t v = put(s, "b", vec(DG_F32, 1, 0));
	cr_assert_gt(v, last, "version %llu after a crash, %llu handed out before",
		     (unsigned long long)v, (unsigned long long)last);
	ps_store_close(s);
}

/* --- checkpoints ----------------------------------------------------------------------------- */

static void child_apply_then_wait(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(1, &err);

	if (!s)
		_exit(2);
	if (ps_store_put(s, "w", vec(DG_F64, 3, 0), NULL, NULL, NULL, &err) != DG_OK)
		_exit(3);
	struct ps_apply_args a = rule(PS_ASSIGN_ADD);
	struct dg_tensor *g = vec(DG_F64, 3, 5);
	if (ps_store_apply(s, "w", &a, g, NULL, &err) != DG_OK)
		_exit(4);
	dg_tensor_free(g);
	usleep(2300 * 1000);   /* more than one checkpoint period */
	if (write(fd, "k", 1) != 1)
		_exit(5);
}

Test(persist, the_checkpoint_thread_saves_applies_within_checkpoint_secs)
{
	char ok;
	int rfd;

	in_crashing_child(child_apply_then_wait, &rfd);
	cr_assert_eq(read(rfd, &ok, 1), 1);
	close(rfd);
	cr_assert_eq(WEXITSTATUS(wait_child()), 0);
	struct ps_store *s = reopen();
	cr_assert_eq(at(s, "w", 0), 5.0);   /* [0 1 2] + [5 6 7] */
	cr_assert_eq(at(s, "w", 2), 9.0);
	ps_store_close(s);
}

Test(persist, a_checkpoint_folds_the_log_into_the_snapshot)
{
	struct ps_store *s = reopen();
	struct dg_err err = { 0 };

	for (int i = 0; i < 50; i++)
		put(s, "w", vec(DG_F32, 1024, i));
	off_t big = file_size(newest_segment());
	cr_assert_gt(big, 50 * 4096);
	cr_assert_eq(ps_store_checkpoint(s, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(metric(s, "dg_ps_checkpoints_total"), 1);
	cr_assert_eq(count_segments(), 1);
	cr_assert_lt(file_size(newest_segment()), 256);
	put(s, "x", vec(DG_F32, 2, 8));
	ps_store_close(s);
	s = reopen();
	cr_assert_eq(at(s, "w", 1023), 49.0 + 1023);
	cr_assert_eq(at(s, "x", 1), 9.0);
	ps_store_close(s);
}

/* --- durability strict ----------------------------------------------------------------------- */

static struct ps_store *open_strict(unsigned secs, struct dg_err *err)
{
	struct ps_store_config cfg = { .data_dir = dir, .checkpoint_secs = secs,
				       .durability = PS_DURABILITY_STRICT };

	return ps_store_open(&cfg, err);
}

/* The variables the strict child leaves, in the order it reports them. */
static const char *const strict_vars[] = {
	"s", "m", "m.momentum", "a", "a.adam_m", "a.adam_v", "a.adam_t", "c", "y",
	"g", "g.accum", "r", "r.rms", "r.rms_momentum", "e", "e.accum", "e.adam_m", "e.adam_t",
};
#define N_STRICT_VARS (sizeof strict_vars / sizeof *strict_vars)

/* Every rule, sync steps, a slot reset by a new shape and a checkpoint in the
 * middle, all acknowledged under strict durability; then the bytes and sync
 * step of each variable go to fd (as u64 length, bytes, i64 step) and the
 * child "crashes" without a final snapshot. */
static void child_strict_applies(int fd)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_strict(3600, &err);
	struct ps_put_opts rep = { .replace = true };

	if (!s)
		_exit(2);
	put(s, "s", vec(DG_F32, 5, 1));
	put(s, "m", vec(DG_F64, 3, 0));
	put(s, "a", vec(DG_F32, 4, 2));
	put(s, "c", vec(DG_I64, 2, 10));
	put(s, "y", vec(DG_F64, 2, 0));
	put(s, "g", vec(DG_F32, 3, 1));
	put(s, "r", vec(DG_F64, 3, -1));
	put(s, "e", mat(DG_F32, 4, 2, 0));
	for (int i = 0; i < 7; i++) {
		struct ps_apply_args ra = rule(i % 2 ? PS_ADAGRAD : PS_ADAM);
		ra.rows = (const int64_t[]){ 3, (i % 4), 3 };
		ra.n_rows = 3;
		apply(s, "g", rule(PS_ADAGRAD), vec(DG_F32, 3, 0.5 * i - 1));
		apply(s, "r", rule(PS_RMSPROP), vec(DG_F64, 3, 0.1 * i));
		apply(s, "e", ra, mat(DG_F32, 3, 2, 0.5 - 0.25 * i));
		struct ps_apply_args m = rule(PS_MOMENTUM);
		m.nesterov = i % 2;
		apply(s, "s", rule(PS_SGD), vec(DG_F32, 5, 0.25 * i - 1));
		apply(s, "m", m, vec(DG_F64, 3, 1.0 / (i + 1)));
		apply(s, "a", rule(PS_ADAM), vec(DG_F32, 4, 0.1 * i - 0.3));
		apply(s, "c", rule(PS_ASSIGN_ADD), vec(DG_I64, 2, i));
		if (i == 3 && ps_store_checkpoint(s, &err) != DG_OK)
			_exit(3);
	}
	/* "a" gets a new shape: its adam slots are reset (CREATE) and used again */
	if (ps_store_put(s, "a", vec(DG_F32, 6, -1), &rep, NULL, NULL, &err) != DG_OK)
		_exit(4);
	apply(s, "a", rule(PS_ADAM), vec(DG_F32, 6, 0.5));
	/* a row-wise assign is logged in any durability */
	struct ps_apply_args as = rule(PS_ASSIGN);
	as.rows = (const int64_t[]){ 2 };
	as.n_rows = 1;
	apply(s, "e", as, mat(DG_F32, 1, 2, 7));
	/* two sync steps of two replicas: the mean is logged with the step */
	struct ps_apply_args sy = rule(PS_SGD);
	sy.replicas = 2;
	for (sy.step = 0; sy.step < 2; sy.step++)
		for (sy.replica = 0; sy.replica < 2; sy.replica++)
			apply(s, "y", sy, vec(DG_F64, 2, 1 + sy.replica + 3 * sy.step));
	for (size_t i = 0; i < N_STRICT_VARS; i++) {
		struct ps_value *v;
		if (ps_store_get(s, strict_vars[i], &v, &err) != DG_OK)
			_exit(5);
		uint64_t n = v->nbytes;
		int64_t step = v->step;
		if (write(fd, &n, 8) != 8 || write(fd, v->data, n) != (ssize_t)n ||
		    write(fd, &step, 8) != 8)
			_exit(6);
		ps_value_release(v);
	}
}

Test(persist, durability_strict_replays_every_acknowledged_apply_after_a_crash)
{
	int rfd;

	in_crashing_child(child_strict_applies, &rfd);
	FILE *f = fdopen(rfd, "rb");
	cr_assert_not_null(f);
	struct ps_store *s = NULL;
	for (size_t i = 0; i < N_STRICT_VARS; i++) {
		uint64_t n;
		int64_t step;
		char want[64];
		cr_assert_eq(fread(&n, 8, 1, f), 1, "the child reported %zu variables", i);
		cr_assert_leq(n, sizeof want);
		cr_assert_eq(fread(want, 1, n, f), n);
		cr_assert_eq(fread(&step, 8, 1, f), 1);
		if (!s) {
			cr_assert_eq(WEXITSTATUS(wait_child()), 0);
			s = reopen();
		}
		struct ps_value *v;
		cr_assert_eq(ps_store_get(s, strict_vars[i], &v, NULL), DG_OK, "%s is missing",
			     strict_vars[i]);
		cr_assert_eq(v->nbytes, n, "%s: %zu bytes, %llu before the crash", strict_vars[i],
			     v->nbytes, (unsigned long long)n);
		cr_assert_eq(memcmp(v->data, want, n), 0, "%s differs from its value before the "
			     "crash", strict_vars[i]);
		cr_assert_eq(v->step, step, "%s: sync step %lld, %lld before the crash",
			     strict_vars[i], (long long)v->step, (long long)step);
		ps_value_release(v);
	}
	fclose(f);
	cr_assert_eq(at(s, "c", 1), 11.0 + 28);   /* [10 11] + 7 applies of [i, i+1] */
	cr_assert_eq(at(s, "y", 0), -0.5 * (1.5 + 4.5));
	cr_assert_eq(at(s, "e", 4), 7.0);
	cr_assert_eq(at(s, "e", 5), 8.0);
	ps_store_close(s);
}

Test(persist, durability_strict_needs_a_data_directory)
{
	struct ps_store_config cfg = { .durability = PS_DURABILITY_STRICT };
	struct dg_err err = { 0 };
	enum ps_durability d;

	cr_assert_null(ps_store_open(&cfg, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "data directory"), "%s", err.msg);
	cr_assert_eq(ps_durability_parse("strict", &d, NULL), DG_OK);
	cr_assert_eq(d, PS_DURABILITY_STRICT);
	cr_assert_eq(ps_durability_parse("always", &d, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.hint, "snapshot"), "%s", err.hint);
}

Test(persist, durability_strict_syncs_every_acknowledged_apply)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_strict(60, &err);

	cr_assert_not_null(s, "%s", err.msg);
	put(s, "w", vec(DG_F64, 512, 0));
	uint64_t f0 = metric(s, "dg_ps_wal_fsyncs_total");
	for (int i = 0; i < 10; i++)
		apply(s, "w", rule(PS_ASSIGN_ADD), vec(DG_F64, 512, 1));
	/* one fsync per acknowledged apply when alone */
	cr_assert_geq(metric(s, "dg_ps_wal_fsyncs_total") - f0, 10);
	ps_store_close(s);
	s = reopen();
	cr_assert_eq(at(s, "w", 511), 511 + 10.0 * 512);   /* 511 + 10 applies of 512 */
	ps_store_close(s);
}

Test(persist, a_log_past_twice_the_store_and_256_mib_is_folded_before_checkpoint_secs)
{
	struct dg_err err = { 0 };
	struct ps_store *s = open_dir(3600, &err);

	cr_assert_not_null(s, "%s", err.msg);
	/* 18 PUTs of one 15 MiB variable: 270 MiB of log for a 15 MiB store. Only
	 * the last one takes the segment past 256 MiB: 17 are 255 MiB and their
	 * headers a few KiB (16 MiB PUTs passed it one PUT early, by their headers,
	 * and the last PUT could land after the cut). */
	struct dg_shape sh = dg_shape_make(1, (int64_t[]){ 15 << 18 });
	for (int i = 0; i < 18; i++) {
		struct dg_tensor *t = dg_tensor_new(DG_F32, &sh, NULL);   /* the put adopts it */
		cr_assert_not_null(t);
		memset(t->data, i, t->nbytes);
		if (i == 17)
			cr_assert_eq(metric(s, "dg_ps_checkpoints_total"), 0, "a snapshot before "
				     "the log passed 256 MiB (%lld bytes)",
				     (long long)file_size(newest_segment()));
		cr_assert_eq(ps_store_put(s, "big", t, NULL, NULL, NULL, &err), DG_OK, "%s",
			     err.msg);
	}
	double t0 = dg_mono_s();
	while (metric(s, "dg_ps_checkpoints_total") == 0 && dg_mono_s() - t0 < 10)
		usleep(20 * 1000);
	cr_assert_eq(metric(s, "dg_ps_checkpoints_total"), 1, "no snapshot %.1f s after the "
		     "log passed 256 MiB", dg_mono_s() - t0);
	cr_assert_eq(count_segments(), 1);
	/* every PUT was folded: the new segment has its header and no record */
	cr_assert_lt(file_size(newest_segment()), 256, "%lld bytes of log after the snapshot",
		     (long long)file_size(newest_segment()));
	ps_store_close(s);
}

/* --- group commit ---------------------------------------------------------------------------- */

struct writer {
	struct ps_store *s;
	int id;
	int fails;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	struct dg_err err = { 0 };
	char name[16];

	snprintf(name, sizeof name, "g%d", w->id);
	for (int i = 0; i < 200; i++)
		w->fails += ps_store_put(w->s, name, vec(DG_F32, 256, i), NULL, NULL, NULL, &err) !=
			    DG_OK;
	return NULL;
}

Test(persist, eight_writers_share_fsyncs_through_group_commit)
{
	struct ps_store *s = reopen();
	struct writer w[8];
	pthread_t th[8];

	uint64_t f0 = metric(s, "dg_ps_wal_fsyncs_total");
	for (int i = 0; i < 8; i++) {
		w[i] = (struct writer){ .s = s, .id = i };
		pthread_create(&th[i], NULL, writer_main, &w[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(w[i].fails, 0);
	}
	uint64_t fsyncs = metric(s, "dg_ps_wal_fsyncs_total") - f0;
	cr_assert_lt(fsyncs, 1600 / 2, "%llu fsyncs for 1600 acknowledged puts",
		     (unsigned long long)fsyncs);
	cr_assert_gt(fsyncs, 0);
	ps_store_close(s);
	s = reopen();
	for (int i = 0; i < 8; i++) {
		char name[16];
		snprintf(name, sizeof name, "g%d", i);
		cr_assert_eq(at(s, name, 255), 199.0 + 255);
	}
	ps_store_close(s);
}
