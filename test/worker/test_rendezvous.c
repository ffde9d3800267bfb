/* The rendezvous on its own: put/take in both orders, timeouts that name key
 * and step, abort waking waiters with the reason, concurrent steps kept
 * apart, take_any, key checks, 8 threads exchanging through it, aborting a
 * range of steps (which keeps the aborts of other steps) and waits that end on
 * a wake-up callback. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/rendezvous.h"

static struct dg_rendezvous *rv;

static void setup(void)
{
	rv = dg_rendezvous_new();
	cr_assert_not_null(rv);
}

static void teardown(void)
{
	dg_rendezvous_free(rv);
}

TestSuite(rendezvous, .init = setup, .fini = teardown, .timeout = 60);

static struct dg_tensor *scalar(double v)
{
	struct dg_tensor *t = dg_tensor_scalar(DG_F32, v, NULL);

	cr_assert_not_null(t);
	return t;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(rendezvous, put_then_take_returns_the_tensor_once)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	cr_assert_eq(dg_rendezvous_put(rv, 7, "y:0->worker/1", scalar(238), &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(dg_rendezvous_count(rv), 1);
	cr_assert_eq(dg_rendezvous_take(rv, 7, "y:0->worker/1", 0, &t, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(t, 0), 238.0, 1e-9);
	dg_tensor_free(t);
	cr_assert_eq(dg_rendezvous_count(rv), 0);
	cr_assert_eq(dg_rendezvous_take(rv, 7, "y:0->worker/1", 0, &t, &err), DG_ETIMEOUT);
	cr_assert_null(t);
}

struct putter {
	uint64_t step;
	const char *key;
	double value;
	int delay_ms;
};

static void *put_later(void *arg)
{
	struct putter *p = arg;

	usleep((useconds_t)p->delay_ms * 1000);
	dg_rendezvous_put(rv, p->step, p->key, scalar(p->value), NULL);
	return NULL;
}

Test(rendezvous, take_waits_for_a_later_put)
{
	struct putter p = { 3, "a/b:1", 42, 100 };
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	pthread_t th;
	double t0 = now_s();

	pthread_create(&th, NULL, put_later, &p);
	cr_assert_eq(dg_rendezvous_take(rv, 3, "a/b:1", 5000, &t, &err), DG_OK, "%s", err.msg);
	pthread_join(th, NULL);
	cr_assert_float_eq(dg_tensor_get_f64(t, 0), 42.0, 1e-9);
	cr_assert_geq(now_s() - t0, 0.08);
	dg_tensor_free(t);
}

Test(rendezvous, timeout_names_key_and_step)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	double t0 = now_s();

	cr_assert_eq(dg_rendezvous_take(rv, 17, "x:0", 150, &t, &err), DG_ETIMEOUT);
	double took = now_s() - t0;
	cr_assert_geq(took, 0.14);
	cr_assert_lt(took, 2.0);
	cr_assert(strstr(err.msg, "'x:0'") && strstr(err.msg, "step 17"), "%s", err.msg);
}

struct waiter {
	uint64_t step;
	const char *key;
	enum dg_status st;
	struct dg_err err;
	double took;
};

static void *wait_for(void *arg)
{
	struct waiter *w = arg;
	struct dg_tensor *t = NULL;
	double t0 = now_s();

	w->st = dg_rendezvous_take(rv, w->step, w->key, 20000, &t, &w->err);
	w->took = now_s() - t0;
	dg_tensor_free(t);
	return NULL;
}

Test(rendezvous, abort_wakes_every_waiter_with_the_reason)
{
	struct waiter w[3] = { { .step = 9, .key = "a" }, { .step = 9, .key = "b" },
			       { .step = 10, .key = "a" } };
	pthread_t th[3];
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, wait_for, &w[i]);
	usleep(100000);
	cr_assert_eq(dg_rendezvous_put(rv, 9, "left", scalar(1), NULL), DG_OK);
	dg_rendezvous_abort(rv, 9, "worker/1 failed");
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(w[i].st, DG_ECANCELED);
		cr_assert_str_eq(w[i].err.msg, "step 9 was aborted: worker/1 failed");
		cr_assert_lt(w[i].took, 2.0);
	}
	cr_assert_eq(dg_rendezvous_count(rv), 0, "the aborted step's tensors are dropped");
	/* Later traffic for step 9 is refused; step 10 is unaffected. */
	cr_assert_eq(dg_rendezvous_put(rv, 9, "a", scalar(1), &err), DG_ECANCELED);
	cr_assert_eq(dg_rendezvous_take(rv, 9, "a", 0, &t, &err), DG_ECANCELED);
	cr_assert(dg_rendezvous_is_aborted(rv, 9));
	cr_assert_not(dg_rendezvous_is_aborted(rv, 10));
	cr_assert_eq(dg_rendezvous_put(rv, 10, "a", scalar(5), &err), DG_OK, "%s", err.msg);
	pthread_join(th[2], NULL);
	cr_assert_eq(w[2].st, DG_OK, "%s", w[2].err.msg);
	/* A second abort keeps the first reason. */
	dg_rendezvous_abort(rv, 9, "other");
	dg_rendezvous_take(rv, 9, "a", 0, &t, &err);
	cr_assert(strstr(err.msg, "worker/1 failed"), "%s", err.msg);
}

Test(rendezvous, steps_and_keys_are_kept_apart)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	for (uint64_t s = 1; s <= 50; s++) {
		cr_assert_eq(dg_rendezvous_put(rv, s, "k", scalar((double)s), &err), DG_OK);
		cr_assert_eq(dg_rendezvous_put(rv, s, "k2", scalar((double)s + 1000), &err), DG_OK);
	}
	cr_assert_eq(dg_rendezvous_put(rv, 5, "k", scalar(0), &err), DG_EEXIST);
	for (uint64_t s = 50; s >= 1; s--) {
		cr_assert_eq(dg_rendezvous_take(rv, s, "k2", 0, &t, &err), DG_OK);
		cr_assert_float_eq(dg_tensor_get_f64(t, 0), (double)s + 1000, 1e-9);
		dg_tensor_free(t);
		cr_assert_eq(dg_rendezvous_take(rv, s, "k", 0, &t, &err), DG_OK);
		cr_assert_float_eq(dg_tensor_get_f64(t, 0), (double)s, 1e-9);
		dg_tensor_free(t);
	}
	cr_assert_eq(dg_rendezvous_count(rv), 0);
}

Test(rendezvous, finish_drops_leftovers_of_that_step_only)
{
	cr_assert_eq(dg_rendezvous_put(rv, 1, "a", scalar(1), NULL), DG_OK);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "b", scalar(1), NULL), DG_OK);
	cr_assert_eq(dg_rendezvous_put(rv, 2, "a", scalar(1), NULL), DG_OK);
	dg_rendezvous_finish(rv, 1);
	cr_assert_eq(dg_rendezvous_count(rv), 1);
	cr_assert_not(dg_rendezvous_is_aborted(rv, 1));
}

Test(rendezvous, take_any_returns_whichever_arrives)
{
	const char *keys[] = { "first", "second", "third" };
	struct putter p = { 4, "third", 3, 50 };
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };
	pthread_t th;
	int which = -1;

	pthread_create(&th, NULL, put_later, &p);
	cr_assert_eq(dg_rendezvous_take_any(rv, 4, keys, 3, 5000, &which, &t, &err), DG_OK, "%s",
		     err.msg);
	pthread_join(th, NULL);
	cr_assert_eq(which, 2);
	cr_assert_float_eq(dg_tensor_get_f64(t, 0), 3.0, 1e-9);
	dg_tensor_free(t);
	cr_assert_eq(dg_rendezvous_take_any(rv, 4, keys, 2, 50, &which, &t, &err), DG_ETIMEOUT);
	cr_assert(strstr(err.msg, "none of 2 tensors"), "%s", err.msg);
}

Test(rendezvous, bad_keys_are_refused_and_the_tensor_freed)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	char big[DG_RV_KEY_MAX + 2];

	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	cr_assert_eq(dg_rendezvous_put(rv, 1, "a b", scalar(1), &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "0x20"), "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "", scalar(1), &err), DG_EINVAL);
	cr_assert_eq(dg_rendezvous_put(rv, 1, big, scalar(1), &err), DG_EINVAL);
	cr_assert_eq(dg_rendezvous_take(rv, 1, "a?b", 0, &t, &err), DG_EINVAL);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "ok", NULL, &err), DG_EINVAL);
	cr_assert_eq(dg_rendezvous_count(rv), 0);
}

Test(rendezvous, close_releases_waiters)
{
	struct waiter w = { .step = 1, .key = "never" };
	pthread_t th;

	pthread_create(&th, NULL, wait_for, &w);
	usleep(50000);
	dg_rendezvous_close(rv);
	pthread_join(th, NULL);
	cr_assert_eq(w.st, DG_EUNAVAILABLE);
	cr_assert_lt(w.took, 2.0);
}

/* 8 threads: 4 producers each put keys 0..199 of their own step, 4 consumers
 * take them in reverse order; every value arrives once, in its own step. */
#define N_PAIRS 4
#define N_KEYS 200

static void *producer(void *arg)
{
	uint64_t step = (uint64_t)(uintptr_t)arg;
	char key[32];

	for (int k = 0; k < N_KEYS; k++) {
		snprintf(key, sizeof key, "v/%d", k);
		dg_rendezvous_put(rv, step, key, scalar((double)(step * 1000 + (uint64_t)k)), NULL);
	}
	return NULL;
}

static void *consumer(void *arg)
{
	uint64_t step = (uint64_t)(uintptr_t)arg;
	char key[32];
	intptr_t bad = 0;

	for (int k = N_KEYS - 1; k >= 0; k--) {
		struct dg_tensor *t = NULL;
		snprintf(key, sizeof key, "v/%d", k);
		if (dg_rendezvous_take(rv, step, key, 10000, &t, NULL) != DG_OK ||
		    dg_tensor_get_f64(t, 0) != (double)(step * 1000 + (uint64_t)k))
			bad++;
		dg_tensor_free(t);
	}
	return (void *)bad;
}

Test(rendezvous, eight_threads_exchange_without_mixing)
{
	pthread_t th[2 * N_PAIRS];

	for (int i = 0; i < N_PAIRS; i++) {
		pthread_create(&th[2 * i], NULL, consumer, (void *)(uintptr_t)(i + 100));
		pthread_create(&th[2 * i + 1], NULL, producer, (void *)(uintptr_t)(i + 100));
	}
	for (int i = 0; i < 2 * N_PAIRS; i++) {
		void *ret;
		pthread_join(th[i], &ret);
		if (i % 2 == 0)
			cr_assert_eq((intptr_t)ret, 0, "consumer %d saw wrong or missing values",
				     i / 2);
	}
	cr_assert_eq(dg_rendezvous_count(rv), 0);
}

/* ---------------------------------------------- multi-step runs: range abort, wake */

Test(rendezvous, abort_range_aborts_every_step_of_it_and_drops_their_tensors)
{
	struct dg_err err = { 0 };

	for (uint64_t s = 99; s <= 105; s++)
		cr_assert_eq(dg_rendezvous_put(rv, s, "k", scalar((double)s), &err), DG_OK);
	dg_rendezvous_abort_range(rv, 100, 5, "job cancelled");
	for (uint64_t s = 99; s <= 105; s++) {
		bool in = s >= 100 && s < 105;
		cr_assert_eq(dg_rendezvous_is_aborted(rv, s), in, "step %" PRIu64, s);
		enum dg_status st = dg_rendezvous_check(rv, s, &err);
		cr_assert_eq(st, in ? DG_ECANCELED : DG_OK, "step %" PRIu64, s);
		if (in) {
			char want[64];
			snprintf(want, sizeof want, "step %" PRIu64 " was aborted: job cancelled",
				 s);
			cr_assert_str_eq(err.msg, want);
		}
	}
	cr_assert_eq(dg_rendezvous_count(rv), 2);              /* steps 99 and 105 */
	/* The range may end at the last step id without wrapping. */
	dg_rendezvous_abort_range(rv, UINT64_MAX - 1, 10, NULL);
	cr_assert(dg_rendezvous_is_aborted(rv, UINT64_MAX));
	cr_assert_not(dg_rendezvous_is_aborted(rv, 0));
	cr_assert_eq(dg_rendezvous_check(rv, UINT64_MAX, &err), DG_ECANCELED);
	cr_assert(strstr(err.msg, "no reason given"), "%s", err.msg);
}

struct flag_waiter {
	atomic_bool *flag;
	enum dg_status st;
	int which;
	double took;
};

static bool flag_set(void *ud)
{
	return atomic_load((atomic_bool *)ud);
}

static void *wait_flag(void *arg)
{
	struct flag_waiter *fw = arg;
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };
	const char *key = "never";
	double t0 = now_s();

	fw->st = dg_rendezvous_wait_any(rv, 3, &key, 1, 10000, flag_set, fw->flag, &fw->which, &t,
					&err);
	fw->took = now_s() - t0;
	dg_tensor_free(t);
	return NULL;
}

Test(rendezvous, wait_any_returns_when_woken_without_a_tensor)
{
	atomic_bool flag;
	struct flag_waiter fw = { .flag = &flag };
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };
	pthread_t th;
	int which = 5;

	atomic_init(&flag, false);
	pthread_create(&th, NULL, wait_flag, &fw);
	usleep(100000);
	atomic_store(&flag, true);
	dg_rendezvous_wake(rv);
	pthread_join(th, NULL);
	cr_assert_eq(fw.st, DG_OK);
	cr_assert_eq(fw.which, -1);
	cr_assert_lt(fw.took, 2.0);
	/* No keys: only the flag, a timeout or an abort ends the wait. */
	atomic_store(&flag, false);
	cr_assert_eq(dg_rendezvous_wait_any(rv, 4, NULL, 0, 50, flag_set, &flag, &which, &t, &err),
		     DG_ETIMEOUT);
	cr_assert(strstr(err.msg, "step 4") && strstr(err.msg, "50 ms"), "%s", err.msg);
	dg_rendezvous_abort(rv, 4, "gone");
	cr_assert_eq(dg_rendezvous_wait_any(rv, 4, NULL, 0, 5000, flag_set, &flag, &which, &t,
					    &err), DG_ECANCELED);
	cr_assert(strstr(err.msg, "gone"), "%s", err.msg);
	/* A key that is there wins over the flag being set. */
	const char *key = "k";
	atomic_store(&flag, true);
	cr_assert_eq(dg_rendezvous_put(rv, 5, "k", scalar(2), &err), DG_OK);
	cr_assert_eq(dg_rendezvous_wait_any(rv, 5, &key, 1, 0, flag_set, &flag, &which, &t, &err),
		     DG_OK);
	cr_assert_eq(which, 0);
	cr_assert_float_eq(dg_tensor_get_f64(t, 0), 2.0, 1e-9);
	dg_tensor_free(t);
	/* Without a callback, no keys is a caller error. */
	cr_assert_eq(dg_rendezvous_wait_any(rv, 5, NULL, 0, 0, NULL, NULL, &which, &t, &err),
		     DG_EINVAL);
}

/* A multi-step run aborted as one range of DG_RV_ABORTED_KEEP steps must not
 * push out the aborts of other steps: a late put for such a step would then be
 * held for good, and a take would wait for its timeout instead of failing. */
Test(rendezvous, a_long_abort_range_keeps_the_aborts_of_other_steps)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	dg_rendezvous_abort(rv, 1, "first");
	dg_rendezvous_abort_range(rv, 100, DG_RV_ABORTED_KEEP, "second");
	cr_assert(dg_rendezvous_is_aborted(rv, 1));
	cr_assert_eq(dg_rendezvous_put(rv, 1, "late", scalar(1), &err), DG_ECANCELED);
	cr_assert_str_eq(err.msg, "step 1 was aborted: first");
	cr_assert_eq(dg_rendezvous_take(rv, 1, "late", 5000, &t, &err), DG_ECANCELED);
	cr_assert_null(t);
	cr_assert_eq(dg_rendezvous_count(rv), 0);
	cr_assert(dg_rendezvous_is_aborted(rv, 100));
	cr_assert(dg_rendezvous_is_aborted(rv, 100 + DG_RV_ABORTED_KEEP - 1));
	cr_assert_not(dg_rendezvous_is_aborted(rv, 100 + DG_RV_ABORTED_KEEP));
	cr_assert_not(dg_rendezvous_is_aborted(rv, 99));
	/* The first reason stays for steps aborted again inside a later range. */
	dg_rendezvous_abort_range(rv, 50, 100, "third");
	cr_assert_eq(dg_rendezvous_check(rv, 120, &err), DG_ECANCELED);
	cr_assert_str_eq(err.msg, "step 120 was aborted: second");
	cr_assert_eq(dg_rendezvous_check(rv, 60, &err), DG_ECANCELED);
	cr_assert_str_eq(err.msg, "step 60 was aborted: third");
}

/* Aborts are forgotten oldest first once DG_RV_ABORTED_KEEP of them are kept;
 * repeating an abort of a step aborted already does not use a slot. */
Test(rendezvous, repeated_aborts_use_no_slot_and_the_oldest_is_forgotten_first)
{
	struct dg_err err = { 0 };

	dg_rendezvous_abort(rv, 7, "seven");
	for (int i = 0; i < 3 * DG_RV_ABORTED_KEEP; i++)
		dg_rendezvous_abort(rv, 8, "eight");
	for (int i = 0; i < DG_RV_ABORTED_KEEP - 2; i++)
		dg_rendezvous_abort(rv, 1000 + (uint64_t)i, NULL);
	cr_assert(dg_rendezvous_is_aborted(rv, 7), "only %d aborts were made",
		  DG_RV_ABORTED_KEEP);
	cr_assert_eq(dg_rendezvous_check(rv, 8, &err), DG_ECANCELED);
	cr_assert_str_eq(err.msg, "step 8 was aborted: eight");
	dg_rendezvous_abort(rv, 999, NULL);             /* one more: 7 goes */
	cr_assert_not(dg_rendezvous_is_aborted(rv, 7));
	cr_assert(dg_rendezvous_is_aborted(rv, 8));
	cr_assert(dg_rendezvous_is_aborted(rv, 999));
	cr_assert(dg_rendezvous_is_aborted(rv, 1000));
}
