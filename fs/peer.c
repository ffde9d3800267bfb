/* The mount's transfers that go around libcurl's buffer, on core's plain
 * sockets (dg/http.h): the address and the connection of the streaming PUT of
 * large writes (fs/upload.c), and the GET of a cold read, whose body the typed
 * client receives straight into the handle's buffer (dg_var_get_into). No
 * HTTP is parsed here. */
#include "dg/client.h"
#include "dg/http.h"
#include "fs.h"

enum dg_status dgfs_peer_parse(struct dgfs_peer *p, const char *addr, struct dg_err *err)
{
	struct dg_http_addr a;
	enum dg_status st = dg_http_addr_parse(addr, &a, err);

	*p = st == DG_OK ? (struct dgfs_peer){ a.host, a.port, a.authority }
			 : (struct dgfs_peer){ 0 };
	return st;
}

void dgfs_peer_free(struct dgfs_peer *p)
{
	struct dg_http_addr a = { p->host, p->port, p->authority };

	dg_http_addr_free(&a);
	*p = (struct dgfs_peer){ 0 };
}

int dgfs_peer_connect(const struct dgfs_peer *p, long io_timeout_s, bool (*stop)(void *),
		      void *ud, const char **what, int *e)
{
	struct dg_http_addr a = { p->host, p->port, p->authority };

	return dg_http_connect(&a, io_timeout_s, stop, ud, what, e);
}

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
