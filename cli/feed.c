/* --feed NAME=VALUE for `dg eval`: VALUE is a .npy file, a .txt file in the
 * text encoding, or a JSON tensor literal typed by what the graph infers for
 * NAME (so `--feed x=2` is a float32 2 for a float32 placeholder). The tensor
 * goes to worker/exec.c, which checks it against the node's declared type. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/codec.h"

#define FEED_TEXT_MAX ((size_t)1 << 30)   /* bytes of a .txt feed */

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* JSON has no NaN or infinity: rewrite the bare words nan, inf and infinity
 * (any case, optional sign) outside strings as the "nan", "inf", "-inf" strings
 * that dg_json_to_tensor accepts. Returns a malloc'd copy or NULL (no memory). */
static char *quote_nonfinite(const char *s)
{
	size_t n = strlen(s);
	char *out = malloc(2 * n + 8), *o = out;
	bool in_str = false;

	if (!out)
		return NULL;
	for (const char *p = s; *p;) {
		if (in_str) {
			if (*p == '\\' && p[1])
				*o++ = *p++;
			else if (*p == '"')
				in_str = false;
			*o++ = *p++;
			continue;
		}
		if (*p == '"') {
			in_str = true;
			*o++ = *p++;
			continue;
		}
		const char *w = p;
		bool neg = false;
		if ((*w == '-' || *w == '+') && isalpha((unsigned char)w[1])) {
			neg = *w == '-';
			w++;
		}
		if (!isalpha((unsigned char)*w)) {
			*o++ = *p++;
			continue;
		}
		const char *e = w;
		while (isalpha((unsigned char)*e))
			e++;
		size_t len = (size_t)(e - w);
		const char *word = NULL;
		if (len == 3 && strncasecmp(w, "nan", 3) == 0)
			word = "\"nan\"";
		else if ((len == 3 && strncasecmp(w, "inf", 3) == 0) ||
			 (len == 8 && strncasecmp(w, "infinity", 8) == 0))
			word = neg ? "\"-inf\"" : "\"inf\"";
		if (word) {
			size_t wl = strlen(word);
			memcpy(o, word, wl);
			o += wl;
		} else {
			memcpy(o, p, (size_t)(e - p));   /* left for the JSON parser to refuse */
			o += e - p;
		}
		p = e;
	}
	*o = '\0';
	return out;
}

static struct dg_tensor *parse_literal(const char *text, enum dg_dtype dt, struct dg_err *err)
{
	char *fixed = quote_nonfinite(text);
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
	if (ends_with(val, ".npy"))
		*value = dg_npy_read_file(val, err);
	else if (ends_with(val, ".txt"))
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
