/* The rendezvous on its own: put/take in both orders, timeouts that name key
 * and step, abort waking waiters with the reason, concurrent steps kept
 * apart, take_any, key checks, 8 threads exchanging through it, aborting a
 * range of steps (which keeps the aborts of other steps), waits that end on
 * a wake-up callback, and its limits: the bytes held (also over HTTP: 413) and
 * the age after which a tensor nobody takes is dropped. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/executor.h"
#include "dg/http.h"
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

/* ------------------------------------------------------------------ limits */

/* A float32 vector of n elements, element i = i. */
static struct dg_tensor *vec(int64_t n)
{
	struct dg_shape sh = dg_shape_make(1, &n);
	struct dg_tensor *t = dg_tensor_new(DG_F32, &sh, NULL);

	cr_assert_not_null(t);
	for (int64_t i = 0; i < n; i++)
		((float *)t->data)[i] = (float)i;
	return t;
}

/* What a vec(n) under key costs against the cap. */
static size_t charge_of(int64_t n, const char *key)
{
	struct dg_tensor *t = vec(n);
	size_t c = dg_rendezvous_charge(t, key);

	dg_tensor_free(t);
	return c;
}

static void set_limits(size_t max_bytes, int64_t max_age_ms)
{
	struct dg_rendezvous_limits l = { .max_bytes = max_bytes, .max_age_ms = max_age_ms };

	dg_rendezvous_set_limits(rv, &l);
}

Test(rendezvous, bytes_held_count_data_and_bookkeeping_and_go_back_to_zero)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	size_t ca = charge_of(1000, "a"), cb = charge_of(10, "bb");

	/* The data, the tensor record, and the entry with its key: under 1 KiB more. */
	cr_assert_geq(ca, 4000 + sizeof(struct dg_tensor) + 2);
	cr_assert_lt(ca, 4000 + 1024);
	cr_assert_eq(charge_of(1000, "abc"), ca + 2, "the key's bytes are charged");
	cr_assert_eq(dg_rendezvous_put(rv, 1, "a", vec(1000), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_bytes(rv), ca);
	cr_assert_eq(dg_rendezvous_put(rv, 2, "bb", vec(10), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_bytes(rv), ca + cb);
	cr_assert_eq(dg_rendezvous_take(rv, 1, "a", 0, &t, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(t, 999), 999.0, 1e-9);
	dg_tensor_free(t);
	cr_assert_eq(dg_rendezvous_bytes(rv), cb);
	dg_rendezvous_finish(rv, 2);
	cr_assert_eq(dg_rendezvous_bytes(rv), 0);
	cr_assert_eq(dg_rendezvous_put(rv, 3, "a", vec(1000), &err), DG_OK, "%s", err.msg);
	dg_rendezvous_abort(rv, 3, "test");
	cr_assert_eq(dg_rendezvous_bytes(rv), 0);
	cr_assert_eq(dg_rendezvous_count(rv), 0);
}

Test(rendezvous, a_put_past_the_byte_limit_is_refused_naming_the_limit_and_what_is_held)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	size_t c = charge_of(1000, "k0");
	char want[96];

	set_limits(2 * c + c / 2, 0);
	cr_assert_eq(dg_rendezvous_put(rv, 5, "k0", vec(1000), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(rv, 5, "k1", vec(1000), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(rv, 6, "k2", vec(1000), &err), DG_ETOOLARGE);
	snprintf(want, sizeof want, "the limit of %zu bytes; 2 tensors (%zu bytes)", 2 * c + c / 2,
		 2 * c);
	cr_assert(strstr(err.msg, want), "%s", err.msg);
	cr_assert(strstr(err.msg, "tensor 'k2' of step 6"), "%s", err.msg);
	cr_assert(strstr(err.msg, "the oldest 'k0' of step 5"), "%s", err.msg);
	cr_assert(strstr(err.hint, "DG_RENDEZVOUS_MAX_MB"), "%s", err.hint);
	cr_assert_eq(dg_rendezvous_count(rv), 2);
	cr_assert_eq(dg_rendezvous_bytes(rv), 2 * c);
	/* Taking one makes room again; the refused step was not aborted. */
	cr_assert_eq(dg_rendezvous_take(rv, 5, "k0", 0, &t, &err), DG_OK, "%s", err.msg);
	dg_tensor_free(t);
	cr_assert_eq(dg_rendezvous_put(rv, 6, "k2", vec(1000), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_bytes(rv), 2 * c);
}

Test(rendezvous, a_tensor_bigger_than_the_whole_limit_is_refused_even_when_empty)
{
	struct dg_err err = { 0 };

	set_limits(4000, 0);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "big", vec(1000), &err), DG_ETOOLARGE);
	cr_assert(strstr(err.msg, "more than this task's rendezvous may hold (4000 bytes)"), "%s",
		  err.msg);
	cr_assert_eq(dg_rendezvous_count(rv), 0);
	cr_assert_eq(dg_rendezvous_bytes(rv), 0);
	/* 0 = no cap. */
	set_limits(0, 0);
	for (int i = 0; i < 64; i++)
		cr_assert_eq(dg_rendezvous_put(rv, (uint64_t)i, "big", vec(1000), &err), DG_OK);
	cr_assert_eq(dg_rendezvous_count(rv), 64);
	cr_assert_eq(dg_rendezvous_bytes(rv), 64 * charge_of(1000, "big"));
}

Test(rendezvous, tensors_nobody_takes_are_dropped_after_the_max_age_and_their_step_aborted)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;

	set_limits(0, 100);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "old", vec(10), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "old2", vec(10), &err), DG_OK, "%s", err.msg);
	usleep(150 * 1000);
	/* The next put sweeps: both of step 1 go, the new one stays. */
	cr_assert_eq(dg_rendezvous_put(rv, 2, "new", vec(10), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_count(rv), 1);
	cr_assert_eq(dg_rendezvous_expired(rv), 2);
	cr_assert_eq(dg_rendezvous_bytes(rv), charge_of(10, "new"));
	/* A late receiver hears why at once instead of waiting out its deadline. */
	double t0 = now_s();
	cr_assert_eq(dg_rendezvous_take(rv, 1, "old", 5000, &t, &err), DG_ECANCELED);
	cr_assert_lt(now_s() - t0, 1.0);
	cr_assert_null(t);
	cr_assert(strstr(err.msg, "step 1 was aborted: tensor 'old' was not received within "
			 "100 ms"), "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "late", vec(10), &err), DG_ECANCELED);
	cr_assert_eq(dg_rendezvous_take(rv, 2, "new", 0, &t, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(t, 9), 9.0, 1e-9);
	dg_tensor_free(t);
}

Test(rendezvous, expiry_makes_room_for_a_put_that_did_not_fit)
{
	struct dg_err err = { 0 };
	size_t c = charge_of(1000, "k0");

	set_limits(c + c / 2, 200);
	cr_assert_eq(dg_rendezvous_put(rv, 1, "k0", vec(1000), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_put(rv, 2, "k1", vec(1000), &err), DG_ETOOLARGE);
	cr_assert(strstr(err.msg, "the oldest 'k0' of step 1"), "%s", err.msg);
	usleep(250 * 1000);
	cr_assert_eq(dg_rendezvous_put(rv, 2, "k1", vec(1000), &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_count(rv), 1);
	cr_assert_eq(dg_rendezvous_bytes(rv), c);
	cr_assert(dg_rendezvous_is_aborted(rv, 1));
	cr_assert_not(dg_rendezvous_is_aborted(rv, 2));
}

Test(rendezvous, default_limits_come_from_the_environment)
{
	struct dg_rendezvous_limits d, l;

	unsetenv("DG_RENDEZVOUS_MAX_MB");
	unsetenv("DG_RENDEZVOUS_MAX_AGE_S");
	dg_rendezvous_default_limits(&d);
	/* At most 4 GiB and a quarter of physical memory. */
	uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	cr_assert_gt(d.max_bytes, 0);
	cr_assert_leq(d.max_bytes, DG_RV_DEFAULT_MAX_BYTES);
	cr_assert_leq(d.max_bytes, phys / 4);
	cr_assert_eq(d.max_age_ms, DG_RV_DEFAULT_MAX_AGE_MS);
	setenv("DG_RENDEZVOUS_MAX_MB", "3", 1);
	setenv("DG_RENDEZVOUS_MAX_AGE_S", "7", 1);
	dg_rendezvous_default_limits(&l);
	cr_assert_eq(l.max_bytes, (size_t)3 << 20);
	cr_assert_eq(l.max_age_ms, 7000);
	struct dg_rendezvous *r2 = dg_rendezvous_new();
	cr_assert_not_null(r2);
	dg_rendezvous_get_limits(r2, &l);
	dg_rendezvous_free(r2);
	cr_assert_eq(l.max_bytes, (size_t)3 << 20, "a new rendezvous starts with them");
	setenv("DG_RENDEZVOUS_MAX_MB", "0", 1);
	setenv("DG_RENDEZVOUS_MAX_AGE_S", "0", 1);
	dg_rendezvous_default_limits(&l);
	cr_assert_eq(l.max_bytes, 0);
	cr_assert_eq(l.max_age_ms, 0);
	/* Malformed: the default, not 0 or 12. */
	setenv("DG_RENDEZVOUS_MAX_MB", "12x", 1);
	setenv("DG_RENDEZVOUS_MAX_AGE_S", "-1", 1);
	dg_rendezvous_default_limits(&l);
	cr_assert_eq(l.max_bytes, d.max_bytes);
	cr_assert_eq(l.max_age_ms, DG_RV_DEFAULT_MAX_AGE_MS);
	unsetenv("DG_RENDEZVOUS_MAX_MB");
	unsetenv("DG_RENDEZVOUS_MAX_AGE_S");
}

/* PUT /v1/steps/S/tensors/KEY of a raw float32 [n] vector. */
static enum dg_status put_http(struct dg_http_client *c, uint64_t step, const char *key,
			       int64_t n, struct dg_http_result *res, struct dg_err *err)
{
	struct dg_tensor *t = vec(n);
	char path[128], shape[32];

	snprintf(path, sizeof path, "/v1/steps/%" PRIu64 "/tensors/%s", step, key);
	snprintf(shape, sizeof shape, "%" PRId64, n);
	struct dg_http_header h[] = { { "Content-Type", "application/octet-stream" },
				      { "Dg-Dtype", "float32" }, { "Dg-Shape", shape } };
	dg_http_result_deinit(res);
	dg_http_result_init(res);
	enum dg_status st = dg_http_request(c, "PUT", path, h, 3, t->data, t->nbytes, res, err);
	dg_tensor_free(t);
	return st;
}

/* The worker routes with DG_RENDEZVOUS_MAX_MB=1: a sender past the limit gets
 * 413 too_large naming it; once the receiver takes a tensor there is room. */
Test(rendezvous, a_put_over_http_past_the_limit_is_413_too_large_naming_the_limit)
{
	struct dg_err err = { 0 };
	struct dg_http_result res;

	setenv("DG_RENDEZVOUS_MAX_MB", "1", 1);
	struct worker_config wc = { .job = "worker", .task = 0 };
	struct worker *w = worker_new(&wc, &err);
	unsetenv("DG_RENDEZVOUS_MAX_MB");
	cr_assert_not_null(w, "%s", err.msg);
	struct dg_http_config hc = { .server_name = "test" };
	struct dg_http_server *s = dg_http_server_new_groups(&hc, worker_route_group(w), 1, &err);
	cr_assert_not_null(s, "%s", err.msg);
	char a[64];
	snprintf(a, sizeof a, "127.0.0.1:%d", dg_http_server_port(s));
	struct dg_http_client *c = dg_http_client_new(a, NULL, 10000, &err);
	cr_assert_not_null(c, "%s", err.msg);
	dg_http_result_init(&res);

	/* 400 KB each: two fit in 1 MiB, the third does not. */
	cr_assert_eq(put_http(c, 9, "x:0", 100000, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.status, 204);
	cr_assert_eq(put_http(c, 9, "x:1", 100000, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(put_http(c, 9, "x:2", 100000, &res, &err), DG_ETOOLARGE, "%s", err.msg);
	cr_assert_eq(res.status, 413);
	json_t *j = json_loadb(res.body.data, res.body.len, 0, NULL);
	cr_assert_not_null(j, "%.*s", (int)res.body.len, res.body.data);
	json_t *e = json_object_get(j, "error");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "too_large");
	const char *msg = json_string_value(json_object_get(e, "message"));
	cr_assert(msg && strstr(msg, "the limit of 1048576 bytes; 2 tensors"), "%s", msg);
	json_decref(j);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(w)), 2);
	/* The receiver takes one: room for the third. */
	dg_http_result_deinit(&res);
	dg_http_result_init(&res);
	cr_assert_eq(dg_http_request(c, "GET", "/v1/steps/9/tensors/x:0?timeout_ms=0", NULL, 0,
				     NULL, 0, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(res.body.len, 400000);
	cr_assert_float_eq(((const float *)res.body.data)[99999], 99999.0f, 1e-3);
	cr_assert_eq(put_http(c, 9, "x:2", 100000, &res, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_rendezvous_count(worker_rendezvous(w)), 2);

	dg_http_result_deinit(&res);
	dg_http_client_free(c);
	worker_stop(w);
	dg_http_server_free(s);
	worker_free(w);
}
