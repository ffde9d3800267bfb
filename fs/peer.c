/* The GET of a cold read, whose body the typed client receives straight into
 * the handle's buffer around libcurl's (dg_var_get_into, dg/client.h). The
 * streaming PUT of large writes is upload.c's, through dg_var_put_stream. No
 * HTTP here. */
#include "dg/client.h"
#include "fs.h"

enum dg_status dgfs_get_direct(struct dgfs *fs, int task, const char *name,
			       enum dg_encoding enc, const struct dgfs_direct_sink *sink,
			       void *ud, bool *delivered, struct dg_err *err)
{
	const struct dg_var_into into = {
		.begin = sink->begin, .progress = sink->progress, .stop = sink->stop,
	};
	struct dg_client *c = dgfs_client_get(fs, task, err);
	enum dg_status st;

	*delivered = false;
	if (!c)
		return err->code;
	st = dg_var_get_into(c, name, enc, &into, ud, delivered, err);
	dgfs_client_put(fs, task, c, st);
	return st;
}
