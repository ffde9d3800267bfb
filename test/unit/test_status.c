/* The error taxonomy (core/src/status.c): every code has a stable name that
 * parses back, the HTTP / errno / exit faces of the one table are distinct
 * where a client must tell causes apart, and the carrier's set / hint / prefix
 * behave, truncating rather than overflowing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "dg/status.h"

Test(status, every_code_has_a_unique_name_that_parses_back)
{
	for (int i = 0; i < DG_STATUS_COUNT; i++) {
		const char *n = dg_status_name((enum dg_status)i);
		cr_assert_not_null(n);
		cr_assert_gt(strlen(n), 1, "code %d", i);
		cr_assert_eq((int)dg_status_from_name(n), i, "%s", n);
		for (int j = 0; j < i; j++)
			cr_assert_str_neq(n, dg_status_name((enum dg_status)j));
	}
	cr_assert_str_eq(dg_status_name(DG_OK), "ok");
	cr_assert_str_eq(dg_status_name(DG_ESHAPE), "shape_mismatch");
	cr_assert_str_eq(dg_status_name(DG_ENOTFOUND), "not_found");
	cr_assert_str_eq(dg_status_name(DG_EINVAL), "invalid_argument");
}

Test(status, unknown_names_and_codes_read_as_internal)
{
	cr_assert_eq(dg_status_from_name("no_such_code"), DG_EINTERNAL);
	cr_assert_eq(dg_status_from_name(""), DG_EINTERNAL);
	cr_assert_eq(dg_status_from_name(NULL), DG_EINTERNAL);
	cr_assert_eq(dg_status_from_name("Not_Found"), DG_EINTERNAL);   /* case matters */
	/* A peer speaking a newer protocol may send a code we do not know. */
	cr_assert_str_eq(dg_status_name((enum dg_status)DG_STATUS_COUNT), "internal");
	cr_assert_str_eq(dg_status_name((enum dg_status)-1), "internal");
	cr_assert_eq(dg_status_to_http((enum dg_status)999), 500);
	cr_assert_eq(dg_status_to_errno((enum dg_status)999), EIO);
	cr_assert_eq(dg_status_to_exit((enum dg_status)999), dg_status_to_exit(DG_EINTERNAL));
}

Test(status, http_statuses_follow_the_documented_table)
{
	cr_assert_eq(dg_status_to_http(DG_OK), 200);
	cr_assert_eq(dg_status_to_http(DG_EINVAL), 400);
	cr_assert_eq(dg_status_to_http(DG_ESHAPE), 400);
	cr_assert_eq(dg_status_to_http(DG_EDTYPE), 400);
	cr_assert_eq(dg_status_to_http(DG_EUNAUTHORIZED), 401);
	cr_assert_eq(dg_status_to_http(DG_ENOTFOUND), 404);
	cr_assert_eq(dg_status_to_http(DG_EEXIST), 409);
	cr_assert_eq(dg_status_to_http(DG_ECONFLICT), 412);
	cr_assert_eq(dg_status_to_http(DG_ETOOLARGE), 413);
	cr_assert_eq(dg_status_to_http(DG_EUNSUPPORTED), 501);
	cr_assert_eq(dg_status_to_http(DG_EUNAVAILABLE), 503);
	cr_assert_eq(dg_status_to_http(DG_ETIMEOUT), 504);
	/* Every error is a 4xx (the client's fault) or a 5xx (ours). */
	for (int i = 1; i < DG_STATUS_COUNT; i++) {
		int h = dg_status_to_http((enum dg_status)i);
		cr_assert(h >= 400 && h <= 599, "%s -> %d", dg_status_name((enum dg_status)i), h);
	}
	/* Causes a client retries differently are told apart. */
	cr_assert_neq(dg_status_to_http(DG_EUNAVAILABLE), dg_status_to_http(DG_EINTERNAL));
	cr_assert_neq(dg_status_to_http(DG_ECONFLICT), dg_status_to_http(DG_EEXIST));
	cr_assert_neq(dg_status_to_http(DG_ETOOLARGE), dg_status_to_http(DG_EINVAL));
}

Test(status, errnos_are_positive_and_distinct_where_a_shell_user_needs_it)
{
	static const struct {
		enum dg_status code;
		int errnum;
	} want[] = {
		{ DG_EINVAL, EINVAL },
		{ DG_ENOTFOUND, ENOENT },
		{ DG_EEXIST, EEXIST },
		{ DG_ESHAPE, EINVAL },
		{ DG_EDTYPE, EINVAL },
		{ DG_ECONFLICT, ESTALE },
		{ DG_ETOOLARGE, EFBIG },
		{ DG_EUNAUTHORIZED, EACCES },
		{ DG_EIO, EIO },
		{ DG_ENOMEM, ENOMEM },
		{ DG_ETIMEOUT, ETIMEDOUT },
		{ DG_EUNSUPPORTED, ENOTSUP },
		{ DG_ECANCELED, ECANCELED },
	};

	cr_assert_eq(dg_status_to_errno(DG_OK), 0);
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		cr_assert_eq(dg_status_to_errno(want[i].code), want[i].errnum, "%s",
			     dg_status_name(want[i].code));
	for (int i = 1; i < DG_STATUS_COUNT; i++)
		cr_assert_gt(dg_status_to_errno((enum dg_status)i), 0);
	/* The ones FUSE users act on differ from each other. */
	enum dg_status distinct[] = { DG_EINVAL, DG_ENOTFOUND, DG_EEXIST, DG_ECONFLICT,
				      DG_ETOOLARGE, DG_EUNAUTHORIZED, DG_ENOMEM, DG_ETIMEOUT,
				      DG_EUNSUPPORTED, DG_ECANCELED, DG_EIO };
	size_t nd = sizeof distinct / sizeof distinct[0];
	for (size_t i = 0; i < nd; i++)
		for (size_t j = 0; j < i; j++)
			cr_assert_neq(dg_status_to_errno(distinct[i]),
				      dg_status_to_errno(distinct[j]), "%s and %s",
				      dg_status_name(distinct[i]), dg_status_name(distinct[j]));
}

Test(status, exit_codes_are_distinct_and_leave_1_for_usage_errors)
{
	cr_assert_eq(dg_status_to_exit(DG_OK), 0);
	for (int i = 1; i < DG_STATUS_COUNT; i++) {
		int e = dg_status_to_exit((enum dg_status)i);
		cr_assert(e >= 2 && e <= 125, "%s -> %d", dg_status_name((enum dg_status)i), e);
		for (int j = 1; j < i; j++)
			cr_assert_neq(e, dg_status_to_exit((enum dg_status)j));
	}
	cr_assert_eq(dg_status_to_exit(DG_EINVAL), 2);
	cr_assert_eq(dg_status_to_exit(DG_ECANCELED), 17);
}

Test(status, set_fills_code_and_message_and_clears_the_hint)
{
	struct dg_err err = { 0 };

	strcpy(err.hint, "stale hint");
	cr_assert_eq(dg_err_set(&err, DG_ENOTFOUND, "variable '%s' not found on %s:%d", "w1",
				"host", 7070), DG_ENOTFOUND);
	cr_assert_eq(err.code, DG_ENOTFOUND);
	cr_assert_str_eq(err.msg, "variable 'w1' not found on host:7070");
	cr_assert_str_eq(err.hint, "");
	/* NULL is a valid carrier: the code still comes back. */
	cr_assert_eq(dg_err_set(NULL, DG_EIO, "ignored %d", 1), DG_EIO);
	dg_err_hint(NULL, "nothing");
	dg_err_prefix(NULL, "nothing");
	dg_err_clear(NULL);
}

Test(status, hint_is_kept_until_the_next_set)
{
	struct dg_err err = { 0 };

	dg_err_set(&err, DG_EINVAL, "bad");
	dg_err_hint(&err, "try %s", "dg var ls");
	cr_assert_str_eq(err.hint, "try dg var ls");
	cr_assert_str_eq(err.msg, "bad");
	dg_err_set(&err, DG_EIO, "other");
	cr_assert_str_eq(err.hint, "");
}

Test(status, long_messages_and_hints_are_truncated_not_overflowed)
{
	struct dg_err err;
	char big[1000];

	memset(&err, 'x', sizeof err);
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	dg_err_set(&err, DG_EINVAL, "%s", big);
	cr_assert_eq(strlen(err.msg), sizeof err.msg - 1);
	dg_err_hint(&err, "%s", big);
	cr_assert_eq(strlen(err.hint), sizeof err.hint - 1);
}

Test(status, prefix_adds_context_before_the_message)
{
	struct dg_err err = { 0 };

	dg_err_set(&err, DG_ESHAPE, "shapes [2,3] and [4] cannot be broadcast together");
	dg_err_hint(&err, "keep me");
	dg_err_prefix(&err, "node '%s' (%s)", "y", "Add");
	cr_assert_str_eq(err.msg,
			 "node 'y' (Add): shapes [2,3] and [4] cannot be broadcast together");
	cr_assert_eq(err.code, DG_ESHAPE);
	cr_assert_str_eq(err.hint, "keep me");
	dg_err_prefix(&err, "step %d", 3);
	cr_assert_str_eq(
		err.msg,
		"step 3: node 'y' (Add): shapes [2,3] and [4] cannot be broadcast together");
}

Test(status, prefix_may_quote_the_message_itself)
{
	struct dg_err err = { 0 };

	dg_err_set(&err, DG_EIO, "disk full");
	dg_err_prefix(&err, "[%s]", err.msg);
	cr_assert_str_eq(err.msg, "[disk full]: disk full");
}

Test(status, prefix_truncates_the_old_message_to_fit)
{
	struct dg_err err = { 0 };
	char big[300], pre[300];

	memset(big, 'm', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	dg_err_set(&err, DG_EINVAL, "%s", big);
	dg_err_prefix(&err, "ctx");
	cr_assert_eq(strlen(err.msg), sizeof err.msg - 1);
	cr_assert_eq(strncmp(err.msg, "ctx: mmm", 8), 0);
	/* A prefix longer than the whole message keeps the prefix alone. */
	memset(pre, 'p', sizeof pre - 1);
	pre[sizeof pre - 1] = '\0';
	dg_err_set(&err, DG_EINVAL, "short");
	dg_err_prefix(&err, "%s", pre);
	cr_assert_eq(strlen(err.msg), sizeof err.msg - 1);
	cr_assert_null(strchr(err.msg, 's'));
}

Test(status, clear_resets_to_ok)
{
	struct dg_err err = { 0 };

	dg_err_set(&err, DG_ETIMEOUT, "slow");
	dg_err_hint(&err, "wait");
	dg_err_clear(&err);
	cr_assert_eq(err.code, DG_OK);
	cr_assert_str_eq(err.msg, "");
	cr_assert_str_eq(err.hint, "");
}

Test(status, utf8_validity_follows_rfc_3629)
{
	cr_assert(dg_utf8_valid("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 17));
	cr_assert_not(dg_utf8_valid("\xff", 1));
	cr_assert_not(dg_utf8_valid("\xc0\xaf", 2), "overlong '/'");
	cr_assert_not(dg_utf8_valid("\xe0\x80\xaf", 3), "overlong");
	cr_assert_not(dg_utf8_valid("\xed\xa0\x80", 3), "a surrogate");
	cr_assert_not(dg_utf8_valid("\xf4\x90\x80\x80", 4), "above U+10FFFF");
	cr_assert_not(dg_utf8_valid("\xc3", 1), "cut short");
	cr_assert_not(dg_utf8_valid("\xc3(", 2));
}

Test(status, bytes_that_are_not_utf8_are_escaped_whole)
{
	char out[16];

	cr_assert_eq(dg_utf8_escape("a\xff\xc3\xa9", 4, out, sizeof out), 7);
	cr_assert_str_eq(out, "a\\xff\xc3\xa9");
	/* an escape or a character that does not fit is left out, never cut */
	cr_assert_eq(dg_utf8_escape("abc\xff", 4, out, 7), 3);
	cr_assert_str_eq(out, "abc");
	cr_assert_eq(dg_utf8_escape("abcde\xc3\xa9", 7, out, 7), 5);
	cr_assert_str_eq(out, "abcde");
}

Test(status, messages_and_hints_are_always_valid_utf8)
{
	struct dg_err err;
	char name[400] = "a";

	dg_err_set(&err, DG_EINVAL, "variable '%s' is bad", "\xff\xfe");
	cr_assert_str_eq(err.msg, "variable '\\xff\\xfe' is bad");
	dg_err_hint(&err, "try '%s'", "\x80");
	cr_assert_str_eq(err.hint, "try '\\x80'");
	dg_err_prefix(&err, "PUT /v1/vars/%s", "\xc3");
	cr_assert_str_eq(err.msg, "PUT /v1/vars/\\xc3: variable '\\xff\\xfe' is bad");
	/* a message cut by its size in the middle of a character */
	for (int i = 0; i < 150; i++)
		strcat(name, "\xc3\xa9");
	dg_err_set(&err, DG_EINVAL, "%s", name);
	cr_assert(dg_utf8_valid(err.msg, strlen(err.msg)), "%s", err.msg);
	cr_assert_gt(strlen(err.msg), 240);
	dg_err_set(&err, DG_EINVAL, "x%s", name);
	cr_assert(dg_utf8_valid(err.msg, strlen(err.msg)), "%s", err.msg);
	dg_err_prefix(&err, "%s", name);
	cr_assert(dg_utf8_valid(err.msg, strlen(err.msg)), "%s", err.msg);
}
