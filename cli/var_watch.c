/* `dg var watch`: one line per change of the watched variables, as the ps
 * tasks report them through their change logs (GET /v1/vars?watch=1, one
 * long poll per task, each on a thread of its own). A task that cannot be
 * reached is retried; one that restarted (or whose log moved past what we
 * saw) is said on stderr: changes may have been missed there. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/client.h"
#include "dg/clock.h"

#define SLICE_MS 1000           /* a long poll's length: how soon a stop is seen */
#define RETRY_MS 200            /* between tries of a task that cannot be reached */

struct watch_run {
	const struct var_watch_args *a;
	struct dg_deadline until;
	pthread_mutex_t out_mu;         /* one line at a time; guards printed */
	int64_t printed;
	atomic_bool stop;
	struct dg_err fatal;            /* the first error that ends the watch */
	bool failed;
};

struct watcher {
	struct watch_run *run;
	struct cli_target *t;
	struct dg_watch_pos pos;        /* after the first (immediate) poll */
	pthread_t th;
};

static bool wanted(const struct var_watch_args *a, const char *name)
{
	if (a->n_names == 0)
		return true;    /* the prefix, if any, was applied by the server */
	for (int i = 0; i < a->n_names; i++)
		if (strcmp(a->names[i], name) == 0)
			return true;
	return a->prefix && strncmp(name, a->prefix, strlen(a->prefix)) == 0;
}

static void fail(struct watch_run *r, const struct cli_target *t, const struct dg_err *e)
{
	pthread_mutex_lock(&r->out_mu);
	if (!r->failed) {
		r->failed = true;
		r->fatal = *e;
		dg_err_prefix(&r->fatal, "%s", t->label);
	}
	pthread_mutex_unlock(&r->out_mu);
	atomic_store(&r->stop, true);
}

/* Print the wanted events; stop the run when --count is reached. */
static void print_events(struct watch_run *r, const struct cli_target *t, const json_t *evs)
{
	const json_t *ev;
	size_t i;
	char line[DG_VAR_NAME_MAX + 128];

	pthread_mutex_lock(&r->out_mu);
	json_array_foreach(evs, i, ev) {
		const char *name = json_string_value(json_object_get(ev, "name"));
		if (!name || !wanted(r->a, name) || atomic_load(&r->stop))
			continue;
		dg_watch_event_line(ev, t->label, line, sizeof line);
		fputs(line, stdout);
		fflush(stdout);
		if (++r->printed == r->a->count)
			atomic_store(&r->stop, true);
	}
	pthread_mutex_unlock(&r->out_mu);
}

static const char *server_prefix(const struct var_watch_args *a)
{
	return a->n_names ? NULL : a->prefix;
}

static void *watch_main(void *arg)
{
	struct watcher *w = arg;
	struct watch_run *r = w->run;
	bool down = false;

	while (!atomic_load(&r->stop)) {
		struct dg_err e = { 0 };
		json_t *evs = NULL;
		bool reset = false;
		int64_t left = dg_deadline_left_ms(r->until);
		enum dg_status st;

		if (left <= 0)
			break;
		st = dg_var_watch(w->t->client, server_prefix(r->a), &w->pos,
				  left < SLICE_MS ? (long)left : SLICE_MS, &evs, &reset, &e);
		if (st == DG_EUNAVAILABLE || st == DG_EIO || st == DG_ETIMEOUT) {
			if (!down)
				fprintf(stderr, "dg: %s: %s; retrying\n", w->t->label, e.msg);
			down = true;
			dg_sleep_ms(RETRY_MS);
			continue;
		}
		if (st != DG_OK) {
			fail(r, w->t, &e);
			break;
		}
		if (down)
			fprintf(stderr, "dg: %s answers again\n", w->t->label);
		down = false;
		if (reset)
			fprintf(stderr, "dg: %s restarted or its change log moved on (epoch %" PRIu64
				"): changes of its variables may have been missed\n", w->t->label,
				w->pos.epoch);
		print_events(r, w->t, evs);
		json_decref(evs);
	}
	return NULL;
}

int var_watch_run(struct cli_targets *ts, const struct var_watch_args *a)
{
	struct watch_run r = { .a = a, .until = a->timeout_ms > 0 ?
			       dg_deadline_in_ms(a->timeout_ms) : DG_DEADLINE_NEVER };
	struct watcher *w = calloc((size_t)ts->n, sizeof *w);
	struct dg_err err = { 0 };
	int started = 0, rc = 0;

	if (!w) {
		dg_err_set(&err, DG_ENOMEM, "out of memory");
		return cli_fail(&err);
	}
	pthread_mutex_init(&r.out_mu, NULL);
	/* Where every task's log stands now: events from here on are printed. */
	for (int i = 0; i < ts->n; i++) {
		json_t *evs = NULL;
		bool reset;
		w[i] = (struct watcher){ .run = &r, .t = &ts->t[i] };
		if (dg_var_watch(ts->t[i].client, server_prefix(a), &w[i].pos, 0, &evs, &reset,
				 &err) != DG_OK) {
			if (ts->n > 1)
				dg_err_prefix(&err, "%s", ts->t[i].label);
			rc = cli_fail(&err);
			goto out;
		}
		json_decref(evs);
	}
	fprintf(stderr, "dg: watching %d task%s (", ts->n, ts->n == 1 ? "" : "s");
	for (int i = 0; i < ts->n; i++)
		fprintf(stderr, "%s%s", i ? ", " : "", ts->t[i].label);
	fprintf(stderr, ")%s\n", a->count > 0 ? "" : "; ^C stops");
	for (; started < ts->n; started++) {
		if (pthread_create(&w[started].th, NULL, watch_main, &w[started]) != 0) {
			dg_err_set(&err, DG_ENOMEM, "cannot start a watch thread");
			atomic_store(&r.stop, true);
			rc = cli_fail(&err);
			break;
		}
	}
	for (int i = 0; i < started; i++)
		pthread_join(w[i].th, NULL);
	if (rc == 0 && r.failed) {
		rc = cli_fail(&r.fatal);
	} else if (rc == 0 && a->count > 0 && r.printed < a->count) {
		dg_err_set(&err, DG_ETIMEOUT, "%" PRId64 " of %" PRId64 " changes in %.3g s",
			   r.printed, a->count, (double)a->timeout_ms / 1000.0);
		dg_err_hint(&err, "give a longer --timeout, or none to wait for ever");
		rc = cli_fail(&err);
	}
out:
	pthread_mutex_destroy(&r.out_mu);
	free(w);
	return rc;
}
