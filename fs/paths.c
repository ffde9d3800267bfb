/* Path <-> variable for the mount (doc/filesystem.md, "The tree"): which view
 * a FUSE path is in and which variable or queue name it stands for. Pure
 * string work; the handlers in ops.c decide what exists. */
#include <string.h>
#include <errno.h>

#include "fs.h"

static const struct {
	const char *dir;
	enum dgfs_view view;
} views[] = {
	{ "vars", DGFS_VARS }, { "text", DGFS_TEXT }, { "npy", DGFS_NPY },
	{ "queues", DGFS_QUEUES }, { "jobs", DGFS_JOBS }, { "rows", DGFS_ROWS },
};

bool dgfs_view_is_var(enum dgfs_view v)
{
	return v == DGFS_VARS || v == DGFS_TEXT || v == DGFS_NPY;
}

bool dgfs_rows_split(const char *name, char *var, size_t n, const char **list)
{
	const char *slash = strrchr(name, '/');
	size_t len;

	if (!slash || slash == name || !slash[1] || strlen(slash + 1) > 4096 ||
	    strspn(slash + 1, "0123456789,-") != strlen(slash + 1))
		return false;
	len = (size_t)(slash - name);
	if (len >= n)
		return false;
	memcpy(var, name, len);
	var[len] = '\0';
	*list = slash + 1;
	return true;
}

int dgfs_path_parse(const char *path, struct dgfs_path *out)
{
	memset(out, 0, sizeof *out);
	if (path[0] != '/')
		return ENOENT;
	path++;
	if (!path[0]) {
		out->view = DGFS_ROOT;
		return 0;
	}
	if (strcmp(path, "cluster") == 0) {
		out->view = DGFS_CLUSTER;
		return 0;
	}
	if (strcmp(path, "events") == 0) {
		out->view = DGFS_EVENTS;
		return 0;
	}
	for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
		size_t n = strlen(views[i].dir);
		if (strncmp(path, views[i].dir, n) != 0 || (path[n] != '/' && path[n] != '\0'))
			continue;
		out->view = views[i].view;
		const char *rest = path[n] ? path + n + 1 : "";
		size_t len = strlen(rest);
		if (len > DG_VAR_NAME_MAX + 4)
			return ENAMETOOLONG;
		/* npy/NAME.npy is the variable NAME; a directory has no suffix. */
		if (out->view == DGFS_NPY && len > 4 && strcmp(rest + len - 4, ".npy") == 0) {
			out->npy_suffix = true;
			len -= 4;
		}
		if (len > DG_VAR_NAME_MAX)
			return ENAMETOOLONG;
		memcpy(out->name, rest, len);
		out->name[len] = '\0';
		return 0;
	}
	return ENOENT;
}
