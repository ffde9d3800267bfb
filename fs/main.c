/* The mount's loop: build the state, mount with libfuse3's high-level API,
 * detach (unless foreground), serve on FUSE's worker threads until unmounted
 * (fusermount3 -u, or SIGTERM/SIGINT/SIGHUP through FUSE's signal handlers),
 * then unmount and free everything. cli/cmd_mount.c calls dgfs_run. */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "dg/log.h"
#include "fs.h"

/* Detached mounts have no stderr: their log goes to syslog. */
static void syslog_sink(enum dg_log_level level, const char *component, const char *line,
			void *ud)
{
	static const int prio[] = { LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR };

	syslog(prio[level & 3], "%s: %s", component, line);
}

/* FUSE's argument vector: program name, our fixed options, the user's -o. */
static enum dg_status build_args(const struct dgfs_config *cfg, struct fuse_args *args,
				 struct dg_err *err)
{
	char opts[1024];
	int n = snprintf(opts, sizeof opts, "fsname=dg,subtype=dg%s%s%s",
			 cfg->read_only ? ",ro" : "", cfg->fuse_opts ? "," : "",
			 cfg->fuse_opts ? cfg->fuse_opts : "");

	if (n < 0 || (size_t)n >= sizeof opts)
		return dg_err_set(err, DG_EINVAL, "the -o options are too long");
	if (fuse_opt_add_arg(args, "dg") || fuse_opt_add_arg(args, "-o") ||
	    fuse_opt_add_arg(args, opts) || (cfg->debug && fuse_opt_add_arg(args, "-d")))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

int dgfs_run(const struct dgfs_config *cfg, struct dg_err *err)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse *f = NULL;
	struct fuse_session *se;
	struct dgfs *fs;
	int rc = 1;

	if (!(fs = dgfs_state_new(cfg, err)))
		return 1;
	if (build_args(cfg, &args, err) != DG_OK)
		goto out;
	f = fuse_new(&args, dgfs_operations(), sizeof(struct fuse_operations), fs);
	if (!f) {
		dg_err_set(err, DG_EINVAL, "FUSE refused the options '%s'", args.argv[2]);
		dg_err_hint(err, "check the -o options; FUSE printed the reason above");
		goto out;
	}
	if (fuse_mount(f, cfg->mountpoint) != 0) {
		dg_err_set(err, DG_EIO, "cannot mount on %s", cfg->mountpoint);
		dg_err_hint(err, "is it an empty directory, and is /dev/fuse usable (fuse3 "
			    "installed, root or user_allow_other)?");
		goto out_destroy;
	}
	se = fuse_get_session(f);
	/* Our own io on the same descriptor: it lets the kernel map direct-I/O
	 * opens (devio.c); without it reads use the page cache as before. */
	int io_rc = dgfs_devio_install(se);
	if (io_rc != 0)
		dg_log(DG_LOG_INFO, "fs", "libfuse refused a custom io (%s): cold reads use the "
		       "page cache", strerror(-io_rc));
	else
		dgfs_devio_landing(dgfs_landing_ops());
	if (fuse_set_signal_handlers(se) != 0) {
		dg_err_set(err, DG_EIO, "cannot install signal handlers");
		goto out_unmount;
	}
	if (!cfg->foreground) {
		/* Forks; the parent exits 0 once the child is running (mount is up). */
		if (fuse_daemonize(0) != 0) {
			dg_err_set(err, DG_EIO, "cannot detach from the terminal");
			goto out_signals;
		}
		openlog("dg-mount", LOG_PID, LOG_DAEMON);
		dg_log_set_sink(syslog_sink, NULL);
	}
	dg_log(DG_LOG_INFO, "fs", "mounted %s (%d ps task%s)", cfg->mountpoint, fs->n_tasks,
	       fs->n_tasks == 1 ? "" : "s");
	/* FUSE's signal handlers end the loop with the signal's number: a
	 * requested unmount, not a failure. */
	int lr = fuse_loop_mt(f, 0);
	dgfs_watch_stop(fs->watch);     /* its threads notify the session: before it goes */
	dgfs_devio_landing_stop();
	rc = lr == 0 || lr == SIGTERM || lr == SIGINT || lr == SIGHUP ? 0 : 1;
	if (rc)
		dg_err_set(err, DG_EIO, "the FUSE loop of %s failed", cfg->mountpoint);
out_signals:
	fuse_remove_signal_handlers(se);
out_unmount:
	fuse_unmount(f);
out_destroy:
	fuse_destroy(f);
out:
	fuse_opt_free_args(&args);
	dgfs_state_free(fs);
	if (!cfg->foreground)
		dg_log_set_sink(NULL, NULL);
	return rc;
}
