/* --feed NAME=VALUE for `dg eval`: VALUE is a .npy file, a .txt file in the
 * text encoding, or a JSON tensor literal typed by what the graph infers for
 * NAME (so `--feed x=2` is a float32 2 for a float32 placeholder). The tensor
 * goes to worker/exec.c, which checks it against the node's declared type. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/codec.h"

#define FEED_TEXT_MAX ((size_t)1 << 30)   /* bytes of a .txt feed */

static struct dg_tensor *parse_literal(const char *text, enum dg_dtype dt, struct dg_err *err)
{
	char *fixed = cli_quote_nonfinite(text);
	json_error_t je;
	json_t *v;
	struct dg_tensor *t;

	if (!fixed) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	v = json_loads(fixed, JSON_DECODE_ANY, &je);
	free(fixed);
	if (!v) {
		dg_err_set(err, DG_EINVAL, "value is not a .npy or .txt file name nor a JSON "
			   "tensor literal (%s)", je.text);
		dg_err_hint(err, "write NAME=FILE.npy, NAME=FILE.txt or a literal such as "
			    "NAME=2, NAME=[1,2,3], NAME=nan");
		return NULL;
	}
	t = dg_json_to_tensor(v, &dt, err);
	json_decref(v);
	return t;
}

static struct dg_tensor *read_text(const char *path, const struct dg_ttype *want,
				   struct dg_err *err)
{
	struct dg_buf b = { 0 };
	struct dg_tensor *t = NULL;

	if (dg_buf_read_file(&b, path, FEED_TEXT_MAX, err) == DG_OK)
		t = dg_text_decode(b.data ? b.data : "", b.len, &want->dtype,
				   dg_shape_is_known(&want->shape) ? &want->shape : NULL, err);
	dg_buf_deinit(&b);
	return t;
}

enum dg_status cli_feed_parse(const struct dg_graph *g, const char *arg, char **ref,
			      struct dg_tensor **value, struct dg_err *err)
{
	const char *eq = strchr(arg, '=');
	const char *val;
	struct dg_edge e;
	const struct dg_ttype *want;
	enum dg_status st;

	*ref = NULL;
	*value = NULL;
	if (!eq || eq == arg) {
		dg_err_set(err, DG_EINVAL, "--feed '%.64s' is not NAME=VALUE", arg);
		dg_err_hint(err, "e.g. --feed x=2 or --feed x=data.npy");
		return DG_EINVAL;
	}
	*ref = strndup(arg, (size_t)(eq - arg));
	if (!*ref)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	val = eq + 1;
	st = dg_graph_ref(g, *ref, &e, err);
	if (st != DG_OK)
		goto fail;
	want = &g->nodes[e.node].out[e.index];
	if (cli_ends_with(val, ".npy"))
		*value = dg_npy_read_file(val, err);
	else if (cli_ends_with(val, ".txt"))
		*value = read_text(val, want, err);
	else
		*value = parse_literal(val, want->dtype, err);
	if (*value)
		return DG_OK;
	st = err && err->code != DG_OK ? err->code : DG_EINVAL;
fail:
	dg_err_prefix(err, "--feed %.80s", arg);
	free(*ref);
	*ref = NULL;
	return st;
}
