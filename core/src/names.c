/* Rules shared by clients and servers: variable and queue names, and the JSON
 * form of a queue's settings. Kept in core so the store, the mount and the
 * CLI agree on them without linking each other. */
#include <stdio.h>
#include <string.h>

#include "dg/client.h"
#include "dg/op.h"

static bool name_char(char ch)
{
	return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
	       ch == '_' || ch == '.' || ch == '-';
}

/* The rule, with or without the limit on a segment's length. */
static enum dg_status name_check(const char *name, bool seg_limit, struct dg_err *err)
{
	size_t len = name ? strlen(name) : 0;
	const char *seg;

	if (len == 0)
		return dg_err_set(err, DG_EINVAL, "empty variable name");
	if (len > DG_VAR_NAME_MAX) {
		dg_err_set(err, DG_EINVAL, "variable name '%.40s...' is %zu bytes; at most %d",
			   name, len, DG_VAR_NAME_MAX);
		return DG_EINVAL;
	}
	seg = name;
	for (const char *p = name;; p++) {
		if (*p == '/' || *p == '\0') {
			size_t n = (size_t)(p - seg);
			if (n == 0 || (n == 1 && seg[0] == '.') ||
			    (n == 2 && seg[0] == '.' && seg[1] == '.')) {
				dg_err_set(err, DG_EINVAL,
					   "variable name '%.80s' has an empty, '.' or '..' segment",
					   name);
				dg_err_hint(err, "names are segments of [A-Za-z0-9_.-] joined by '/'");
				return DG_EINVAL;
			}
			if (seg_limit && n > DG_VAR_SEGMENT_MAX) {
				dg_err_set(err, DG_EINVAL, "variable name '%.40s...' has a segment of "
					   "%zu bytes; at most %d", name, n, DG_VAR_SEGMENT_MAX);
				dg_err_hint(err, "the mount shows each segment as a file name, "
					    "NAME.npy in npy/, and file names have at most 255 bytes");
				return DG_EINVAL;
			}
			if (*p == '\0')
				break;
			seg = p + 1;
		} else if (!name_char(*p)) {
			if (*p > 32 && *p < 127)
				dg_err_set(err, DG_EINVAL, "variable name '%.80s' has the character "
					   "'%c'", name, *p);
			else            /* the name is quoted with such bytes escaped: \xff */
				dg_err_set(err, DG_EINVAL, "variable name '%.80s' has the byte 0x%02x",
					   name, (unsigned char)*p);
			dg_err_hint(err, "names are segments of [A-Za-z0-9_.-] joined by '/'");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

enum dg_status dg_var_name_check(const char *name, struct dg_err *err)
{
	return name_check(name, true, err);
}

enum dg_status dg_var_name_check_stored(const char *name, struct dg_err *err)
{
	return name_check(name, false, err);
}

enum dg_status dg_queue_spec_from_json(const json_t *j, struct dg_queue_spec *out,
				       struct dg_err *err)
{
	static const int64_t zero = 0, one = 1000, none = -1;
	static const bool no = false;
	struct dg_queue_spec s = { 0 };
	int64_t seed, ids;
	const json_t *comps;
	const char *key;
	json_t *v;
	enum dg_status st;

	if (!json_is_object(j))
		return dg_err_set(err, DG_EINVAL, "queue settings must be a JSON object");
	json_object_foreach((json_t *)j, key, v) {
		if (strcmp(key, "capacity") && strcmp(key, "shuffle") &&
		    strcmp(key, "min_after_dequeue") && strcmp(key, "seed") &&
		    strcmp(key, "components") && strcmp(key, "ids")) {
			dg_err_set(err, DG_EINVAL, "unknown queue setting '%.64s'", key);
			dg_err_hint(err, "settings: capacity, shuffle, min_after_dequeue, seed, "
				    "components, ids");
			return DG_EINVAL;
		}
	}
	if ((st = dg_attr_int(j, "capacity", &one, &s.capacity, err)) != DG_OK ||
	    (st = dg_attr_bool(j, "shuffle", &no, &s.shuffle, err)) != DG_OK ||
	    (st = dg_attr_int(j, "min_after_dequeue", &zero, &s.min_after_dequeue, err)) != DG_OK ||
	    (st = dg_attr_int(j, "seed", &zero, &seed, err)) != DG_OK ||
	    (st = dg_attr_int(j, "ids", &none, &ids, err)) != DG_OK)
		return st;
	s.seed = (uint64_t)seed;
	if (s.capacity < 1 || s.capacity > ((int64_t)1 << 32))
		return dg_err_set(err, DG_EINVAL, "queue capacity %lld is outside 1..2^32",
				  (long long)s.capacity);
	if (s.min_after_dequeue < 0 || s.min_after_dequeue >= s.capacity)
		return dg_err_set(err, DG_EINVAL,
				  "min_after_dequeue %lld must be at least 0 and below capacity %lld",
				  (long long)s.min_after_dequeue, (long long)s.capacity);
	comps = json_object_get(j, "components");
	if (!json_is_array(comps) || json_array_size(comps) < 1 ||
	    json_array_size(comps) > DG_QUEUE_MAX_COMPONENTS) {
		dg_err_set(err, DG_EINVAL, "queue 'components' must be an array of 1 to %d "
			   "{\"dtype\", \"shape\"} objects", DG_QUEUE_MAX_COMPONENTS);
		return DG_EINVAL;
	}
	size_t i;
	json_array_foreach(comps, i, v) {
		if (!json_is_object(v))
			return dg_err_set(err, DG_EINVAL, "queue component %zu is not an object", i);
		if ((st = dg_attr_dtype(v, "dtype", NULL, &s.dtype[i], err)) != DG_OK ||
		    (st = dg_attr_shape(v, "shape", true, false, &s.shape[i], err)) != DG_OK) {
			dg_err_prefix(err, "queue component %zu", i);
			return st;
		}
	}
	s.n_components = (int)json_array_size(comps);
	if (ids < -1 || ids >= s.n_components)
		return dg_err_set(err, DG_EINVAL, "queue 'ids' is %lld: it must name one of the "
				  "%d components (0..%d)", (long long)ids, s.n_components,
				  s.n_components - 1);
	s.has_ids = ids >= 0;
	s.ids = ids >= 0 ? (int)ids : 0;
	if (s.has_ids && ((s.dtype[ids] != DG_I64 && s.dtype[ids] != DG_I32) ||
			 s.shape[ids].ndim != 0)) {
		dg_err_set(err, DG_EINVAL, "queue 'ids' names component %lld, a %s of rank %d: "
			   "an example id is an int64 or int32 scalar", (long long)ids,
			   dg_dtype_name(s.dtype[ids]), s.shape[ids].ndim);
		return DG_EINVAL;
	}
	*out = s;
	return DG_OK;
}

json_t *dg_queue_spec_to_json(const struct dg_queue_spec *s)
{
	json_t *comps = json_array();

	for (int i = 0; comps && i < s->n_components; i++) {
		json_t *shape = json_array();
		for (int d = 0; shape && d < s->shape[i].ndim; d++)
			json_array_append_new(shape, json_integer(s->shape[i].dim[d]));
		json_array_append_new(comps, json_pack("{s:s, s:o}", "dtype",
						       dg_dtype_name(s->dtype[i]), "shape", shape));
	}
	return json_pack("{s:I, s:b, s:I, s:I, s:o, s:o*}", "capacity",
			 (json_int_t)s->capacity, "shuffle", s->shuffle, "min_after_dequeue",
			 (json_int_t)s->min_after_dequeue, "seed", (json_int_t)s->seed,
			 "components", comps, "ids", s->has_ids ? json_integer(s->ids) : NULL);
}
