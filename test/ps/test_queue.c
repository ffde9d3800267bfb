/* Criterion suite "queue": the shared input queues of ps/queue.c: FIFO and
 * seeded-shuffle order, blocking with timeouts, close and delete semantics,
 * disjoint delivery to concurrent consumers, body layout checks and the
 * state/list/metrics views. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queue.h"

/* A spec with one int64 scalar component: examples are just numbers. */
static struct dg_queue_spec scalar_spec(int64_t capacity, bool shuffle, int64_t mad,
					uint64_t seed)
{
	struct dg_queue_spec s = { 0 };

	s.capacity = capacity;
	s.shuffle = shuffle;
	s.min_after_dequeue = mad;
	s.seed = seed;
	s.n_components = 1;
	s.dtype[0] = DG_I64;
	s.shape[0].ndim = 0;
	return s;
}

static struct ps_queues *new_with(const char *name, const struct dg_queue_spec *s)
{
	struct dg_err err = { 0 };
	struct ps_queues *qs = ps_queues_new(&err);
	bool created = false;

	cr_assert_not_null(qs, "%s", err.msg);
	cr_assert_eq(ps_queue_create(qs, name, s, &created, &err), DG_OK, "%s", err.msg);
	cr_assert(created);
	return qs;
}

/* Enqueue the int64 values first..first+n-1 as one batch. */
static enum dg_status put_range(struct ps_queues *qs, const char *name, int64_t first,
				int64_t n, int64_t timeout_ms, struct dg_err *err)
{
	int64_t v[256];

	cr_assert(n <= 256);
	for (int64_t i = 0; i < n; i++)
		v[i] = first + i;
	return ps_queue_enqueue(qs, name, n, v, (size_t)n * sizeof(int64_t), timeout_ms, err);
}

/* Dequeue n int64 examples into v (appending *got values). */
static enum dg_status take(struct ps_queues *qs, const char *name, int64_t n, int64_t timeout_ms,
			   bool allow_smaller, int64_t *v, int64_t *got, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	enum dg_status st = ps_queue_dequeue(qs, name, n, timeout_ms, allow_smaller, &b, got, err);

	if (st == DG_OK) {
		cr_assert_eq(b.len, (size_t)*got * sizeof(int64_t));
		memcpy(v, b.data, b.len);
	} else {
		cr_assert_eq(*got, 0);
		cr_assert_eq(b.len, 0);
	}
	dg_buf_deinit(&b);
	return st;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

Test(queue, fifo_queue_returns_examples_in_enqueue_order)
{
	struct dg_queue_spec s = scalar_spec(10, false, 0, 0);
	struct ps_queues *qs = new_with("fifo", &s);
	struct dg_err err = { 0 };
	int64_t v[16], got;

	/* 8 singles then a batch of 2: the ring wraps (head moves) across rounds. */
	for (int round = 0; round < 3; round++) {
		for (int64_t i = 0; i < 8; i++)
			cr_assert_eq(put_range(qs, "fifo", round * 100 + i, 1, 0, &err), DG_OK);
		cr_assert_eq(put_range(qs, "fifo", round * 100 + 8, 2, 0, &err), DG_OK, "%s",
			     err.msg);
		cr_assert_eq(take(qs, "fifo", 3, 0, false, v, &got, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(got, 3);
		cr_assert_eq(take(qs, "fifo", 7, 0, false, v + 3, &got, &err), DG_OK);
		cr_assert_eq(got, 7);
		for (int64_t i = 0; i < 10; i++)
			cr_assert_eq(v[i], round * 100 + i, "round %d position %lld: %lld", round,
				     (long long)i, (long long)v[i]);
	}
	ps_queues_free(qs);
}

/* All 100 values of a seeded shuffle queue, dequeued in batches of 7. */
static void shuffled_order(uint64_t seed, int64_t *out)
{
	struct dg_queue_spec s = scalar_spec(100, true, 0, seed);
	struct ps_queues *qs = new_with("shuf", &s);
	struct dg_err err = { 0 };
	int64_t got, n = 0;

	cr_assert_eq(put_range(qs, "shuf", 0, 100, 0, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(ps_queue_close(qs, "shuf", &err), DG_OK);
	while (take(qs, "shuf", 7, 0, true, out + n, &got, &err) == DG_OK)
		n += got;
	cr_assert_eq(err.code, DG_ECLOSED, "%s", err.msg);
	cr_assert_eq(n, 100);
	ps_queues_free(qs);
}

Test(queue, seeded_shuffle_is_a_deterministic_permutation)
{
	int64_t a[100], b[100], c[100];
	int seen[100] = { 0 }, in_place = 0;
	bool differs = false;

	shuffled_order(7, a);
	shuffled_order(7, b);
	shuffled_order(8, c);
	for (int i = 0; i < 100; i++) {
		cr_assert_eq(a[i], b[i], "seed 7 gave two orders at %d", i);
		cr_assert(a[i] >= 0 && a[i] < 100);
		seen[a[i]]++;
		in_place += a[i] == i;
		differs |= a[i] != c[i];
	}
	for (int i = 0; i < 100; i++)
		cr_assert_eq(seen[i], 1, "example %d dequeued %d times", i, seen[i]);
	/* A uniform permutation of 100 fixes about 1 element; FIFO would fix 100. */
	cr_assert_lt(in_place, 10, "%d examples came out in FIFO position", in_place);
	cr_assert(differs, "seeds 7 and 8 gave the same order");
}

Test(queue, shuffle_picks_among_all_queued_examples)
{
	/* Enqueue 0..9, take 1, 1000 times with fresh queues: every position must
	 * come first sometimes and none overwhelmingly (uniform: 100 each). */
	int first[10] = { 0 };

	for (uint64_t seed = 0; seed < 1000; seed++) {
		struct dg_queue_spec s = scalar_spec(10, true, 0, seed);
		struct ps_queues *qs = new_with("u", &s);
		struct dg_err err = { 0 };
		int64_t v, got;
		cr_assert_eq(put_range(qs, "u", 0, 10, 0, &err), DG_OK);
		cr_assert_eq(take(qs, "u", 1, 0, false, &v, &got, &err), DG_OK);
		first[v]++;
		ps_queues_free(qs);
	}
	for (int i = 0; i < 10; i++)
		cr_assert(first[i] > 50 && first[i] < 150, "example %d came first %d times of 1000",
			  i, first[i]);
}

/* ---- concurrency: 2 producers, 4 consumers, 10,000 examples ---- */

#define N_EXAMPLES 10000

struct shared {
	struct ps_queues *qs;
	atomic_int seen[N_EXAMPLES];    /* consumers: how often each value arrived */
	atomic_int taken;
	atomic_int bad_status;
};

struct prod_arg {
	struct shared *sh;
	int64_t first;                  /* this producer enqueues first..first+N/2-1 */
};

static void *producer(void *arg)
{
	struct shared *sh = ((struct prod_arg *)arg)->sh;
	int64_t first = ((struct prod_arg *)arg)->first;
	struct dg_err err = { 0 };

	/* Batches of 1..7 so that enqueues of different sizes race. */
	for (int64_t i = 0, k = 1; i < N_EXAMPLES / 2; i += k, k = k % 7 + 1) {
		if (k > N_EXAMPLES / 2 - i)
			k = N_EXAMPLES / 2 - i;
		if (put_range(sh->qs, "shared", first + i, k, 10000, &err) != DG_OK)
			atomic_fetch_add(&sh->bad_status, 1);
	}
	return NULL;
}

static void *consumer(void *arg)
{
	struct shared *sh = arg;
	struct dg_err err = { 0 };
	int64_t v[8], got;

	for (;;) {
		enum dg_status st = take(sh->qs, "shared", 8, 10000, true, v, &got, &err);
		if (st == DG_ECLOSED)
			break;
		if (st != DG_OK) {
			atomic_fetch_add(&sh->bad_status, 1);
			break;
		}
		for (int64_t i = 0; i < got; i++) {
			if (v[i] < 0 || v[i] >= N_EXAMPLES)
				atomic_fetch_add(&sh->bad_status, 1);
			else
				atomic_fetch_add(&sh->seen[v[i]], 1);
		}
		atomic_fetch_add(&sh->taken, (int)got);
	}
	return NULL;
}

Test(queue, concurrent_consumers_receive_every_example_exactly_once)
{
	struct dg_queue_spec s = scalar_spec(64, true, 16, 42);
	static struct shared sh;
	struct dg_err err = { 0 };
	pthread_t prod[2], cons[4];
	struct prod_arg pargs[2];

	memset(&sh, 0, sizeof sh);
	sh.qs = new_with("shared", &s);
	for (int i = 0; i < 4; i++)
		pthread_create(&cons[i], NULL, consumer, &sh);
	for (int i = 0; i < 2; i++) {
		pargs[i].sh = &sh;
		pargs[i].first = i * (N_EXAMPLES / 2);
		pthread_create(&prod[i], NULL, producer, &pargs[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(prod[i], NULL);
	/* min_after_dequeue keeps 16 queued until close; close lets them drain. */
	cr_assert_eq(ps_queue_close(sh.qs, "shared", &err), DG_OK);
	for (int i = 0; i < 4; i++)
		pthread_join(cons[i], NULL);
	cr_assert_eq(atomic_load(&sh.bad_status), 0);
	cr_assert_eq(atomic_load(&sh.taken), N_EXAMPLES);
	for (int i = 0; i < N_EXAMPLES; i++)
		cr_assert_eq(atomic_load(&sh.seen[i]), 1, "example %d arrived %d times", i,
			     atomic_load(&sh.seen[i]));
	ps_queues_free(sh.qs);
}

/* ---- blocking ---- */

struct waiter {
	struct ps_queues *qs;
	const char *name;
	int64_t n;
	bool allow_smaller;
	bool enqueue;
	atomic_bool done;
	enum dg_status st;
	int64_t got;
	int64_t v[16];
	struct dg_err err;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;

	if (w->enqueue) {
		w->st = put_range(w->qs, w->name, 1000, w->n, -1, &w->err);
	} else {
		w->st = take(w->qs, w->name, w->n, -1, w->allow_smaller, w->v, &w->got, &w->err);
	}
	atomic_store(&w->done, true);
	return NULL;
}

Test(queue, dequeue_keeps_min_after_dequeue_queued_until_close)
{
	struct dg_queue_spec s = scalar_spec(10, false, 3, 0);
	struct ps_queues *qs = new_with("m", &s);
	struct dg_err err = { 0 };
	struct waiter w = { .qs = qs, .name = "m", .n = 2 };
	pthread_t th;
	int64_t v[4], got;

	cr_assert_eq(put_range(qs, "m", 0, 4, 0, &err), DG_OK);
	/* 4 - 2 = 2 < 3: would go below. */
	cr_assert_eq(take(qs, "m", 2, 50, false, v, &got, &err), DG_ETIMEOUT);
	cr_assert(strstr(err.msg, "'m'") && strstr(err.msg, "min_after_dequeue 3"), "%s", err.msg);
	/* 4 - 1 = 3: allowed. */
	cr_assert_eq(take(qs, "m", 1, 0, false, v, &got, &err), DG_OK);
	cr_assert_eq(v[0], 0);

	pthread_create(&th, NULL, wait_thread, &w);
	usleep(150 * 1000);
	cr_assert(!atomic_load(&w.done), "dequeue went below min_after_dequeue");
	cr_assert_eq(ps_queue_close(qs, "m", &err), DG_OK);
	pthread_join(th, NULL);
	cr_assert_eq(w.st, DG_OK, "%s", w.err.msg);
	cr_assert_eq(w.got, 2);
	cr_assert_eq(w.v[0], 1);
	cr_assert_eq(w.v[1], 2);
	ps_queues_free(qs);
}

Test(queue, dequeue_blocked_on_too_few_wakes_when_enough_are_enqueued)
{
	struct dg_queue_spec s = scalar_spec(10, false, 0, 0);
	struct ps_queues *qs = new_with("e", &s);
	struct dg_err err = { 0 };
	struct waiter w = { .qs = qs, .name = "e", .n = 3 };
	pthread_t th;

	pthread_create(&th, NULL, wait_thread, &w);
	cr_assert_eq(put_range(qs, "e", 5, 2, 0, &err), DG_OK);
	usleep(100 * 1000);
	cr_assert(!atomic_load(&w.done), "a dequeue of 3 returned with 2 queued");
	cr_assert_eq(put_range(qs, "e", 7, 1, 0, &err), DG_OK);
	pthread_join(th, NULL);
	cr_assert_eq(w.st, DG_OK, "%s", w.err.msg);
	cr_assert_eq(w.got, 3);
	cr_assert(w.v[0] == 5 && w.v[1] == 6 && w.v[2] == 7);
	ps_queues_free(qs);
}

Test(queue, blocked_enqueue_on_a_full_queue_wakes_when_a_consumer_dequeues)
{
	struct dg_queue_spec s = scalar_spec(3, false, 0, 0);
	struct ps_queues *qs = new_with("full", &s);
	struct dg_err err = { 0 };
	struct waiter w = { .qs = qs, .name = "full", .n = 2, .enqueue = true };
	pthread_t th;
	int64_t v[4], got;
	json_t *state;

	cr_assert_eq(put_range(qs, "full", 0, 3, 0, &err), DG_OK);
	pthread_create(&th, NULL, wait_thread, &w);
	usleep(100 * 1000);
	cr_assert(!atomic_load(&w.done), "enqueue into a full queue returned");
	/* One free slot is not room for 2: still blocked. */
	cr_assert_eq(take(qs, "full", 1, 0, false, v, &got, &err), DG_OK);
	usleep(100 * 1000);
	cr_assert(!atomic_load(&w.done), "enqueue of 2 returned with room for 1");
	cr_assert_eq(take(qs, "full", 1, 0, false, v + 1, &got, &err), DG_OK);
	pthread_join(th, NULL);
	cr_assert_eq(w.st, DG_OK, "%s", w.err.msg);
	cr_assert_eq(ps_queue_state(qs, "full", &state, &err), DG_OK);
	cr_assert_eq(json_integer_value(json_object_get(state, "size")), 3);
	json_decref(state);
	cr_assert_eq(take(qs, "full", 3, 0, false, v, &got, &err), DG_OK);
	cr_assert(v[0] == 2 && v[1] == 1000 && v[2] == 1001, "%lld %lld %lld", (long long)v[0],
		  (long long)v[1], (long long)v[2]);
	ps_queues_free(qs);
}

Test(queue, waits_time_out_after_the_deadline_with_a_message_naming_the_queue)
{
	struct dg_queue_spec s = scalar_spec(2, false, 0, 0);
	struct ps_queues *qs = new_with("slow", &s);
	struct dg_err err = { 0 };
	int64_t v[2], got;
	double t0;

	/* 0 ms: try once, no wait. */
	cr_assert_eq(take(qs, "slow", 1, 0, false, v, &got, &err), DG_ETIMEOUT);
	t0 = now_ms();
	cr_assert_eq(take(qs, "slow", 1, 120, false, v, &got, &err), DG_ETIMEOUT);
	cr_assert_geq(now_ms() - t0, 119.0);
	cr_assert(strstr(err.msg, "dequeue") && strstr(err.msg, "'slow'") &&
		  strstr(err.msg, "120 ms"), "%s", err.msg);

	cr_assert_eq(put_range(qs, "slow", 0, 2, 0, &err), DG_OK);
	cr_assert_eq(put_range(qs, "slow", 2, 1, 0, &err), DG_ETIMEOUT);
	t0 = now_ms();
	cr_assert_eq(put_range(qs, "slow", 2, 1, 80, &err), DG_ETIMEOUT);
	cr_assert_geq(now_ms() - t0, 79.0);
	cr_assert(strstr(err.msg, "enqueue") && strstr(err.msg, "'slow'") &&
		  strstr(err.msg, "80 ms"), "%s", err.msg);
	/* Nothing changed: both examples still there, in order. */
	cr_assert_eq(take(qs, "slow", 2, 0, false, v, &got, &err), DG_OK);
	cr_assert(v[0] == 0 && v[1] == 1);
	ps_queues_free(qs);
}

Test(queue, closed_queue_refuses_enqueue_and_drains_with_allow_smaller)
{
	struct dg_queue_spec s = scalar_spec(10, false, 4, 0);
	struct ps_queues *qs = new_with("c", &s);
	struct dg_err err = { 0 };
	int64_t v[8], got;

	cr_assert_eq(put_range(qs, "c", 0, 5, 0, &err), DG_OK);
	cr_assert_eq(ps_queue_close(qs, "c", &err), DG_OK);
	cr_assert_eq(ps_queue_close(qs, "c", &err), DG_OK, "closing twice is fine");
	cr_assert_eq(put_range(qs, "c", 9, 1, 0, &err), DG_ECLOSED);
	cr_assert(strstr(err.msg, "'c'") && strstr(err.msg, "closed"), "%s", err.msg);
	/* Closed: min_after_dequeue (4) no longer holds examples back. */
	cr_assert_eq(take(qs, "c", 3, 0, false, v, &got, &err), DG_OK);
	cr_assert(got == 3 && v[0] == 0 && v[2] == 2);
	/* 2 left: a full batch of 3 cannot be had. */
	cr_assert_eq(take(qs, "c", 3, 0, false, v, &got, &err), DG_ECLOSED);
	cr_assert(strstr(err.msg, "holds only 2"), "%s", err.msg);
	cr_assert(strstr(err.hint, "allow_smaller"), "%s", err.hint);
	cr_assert_eq(take(qs, "c", 3, 0, true, v, &got, &err), DG_OK);
	cr_assert(got == 2 && v[0] == 3 && v[1] == 4);
	cr_assert_eq(take(qs, "c", 1, 0, true, v, &got, &err), DG_ECLOSED);
	cr_assert_eq(take(qs, "c", 1, 1000, false, v, &got, &err), DG_ECLOSED);
	ps_queues_free(qs);
}

Test(queue, close_wakes_a_blocked_enqueue_with_closed)
{
	struct dg_queue_spec s = scalar_spec(1, false, 0, 0);
	struct ps_queues *qs = new_with("ce", &s);
	struct dg_err err = { 0 };
	struct waiter w = { .qs = qs, .name = "ce", .n = 1, .enqueue = true };
	pthread_t th;

	cr_assert_eq(put_range(qs, "ce", 0, 1, 0, &err), DG_OK);
	pthread_create(&th, NULL, wait_thread, &w);
	usleep(100 * 1000);
	cr_assert_eq(ps_queue_close(qs, "ce", &err), DG_OK);
	pthread_join(th, NULL);
	cr_assert_eq(w.st, DG_ECLOSED, "%s", w.err.msg);
	ps_queues_free(qs);
}

Test(queue, enqueue_checks_the_count_and_the_exact_body_length)
{
	struct dg_queue_spec s = scalar_spec(4, false, 0, 0);
	struct ps_queues *qs = new_with("len", &s);
	struct dg_err err = { 0 };
	int64_t v[8] = { 0 }, got;

	cr_assert_eq(ps_queue_enqueue(qs, "len", 2, v, 15, 0, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "needs 16 bytes") && strstr(err.msg, "got 15"), "%s", err.msg);
	cr_assert_eq(ps_queue_enqueue(qs, "len", 2, v, 24, 0, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "got 24"), "%s", err.msg);
	cr_assert_eq(ps_queue_enqueue(qs, "len", 0, v, 0, 0, &err), DG_EINVAL);
	cr_assert_eq(ps_queue_enqueue(qs, "len", 5, v, 40, 0, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "capacity 4") && strstr(err.msg, "never fit"), "%s", err.msg);
	cr_assert_eq(take(qs, "len", 0, 0, false, v, &got, &err), DG_EINVAL);
	cr_assert_eq(take(qs, "len", 5, 0, true, v, &got, &err), DG_EINVAL);
	/* None of the refused requests queued anything. */
	cr_assert_eq(ps_queue_count(qs), 1);
	cr_assert_eq(take(qs, "len", 1, 0, false, v, &got, &err), DG_ETIMEOUT);
	ps_queues_free(qs);
}

Test(queue, create_accepts_identical_settings_and_names_what_differs)
{
	struct dg_queue_spec s = scalar_spec(8, true, 2, 5), t;
	struct ps_queues *qs = new_with("dup", &s);
	struct dg_err err = { 0 };
	bool created = true;

	cr_assert_eq(ps_queue_create(qs, "dup", &s, &created, &err), DG_OK, "%s", err.msg);
	cr_assert(!created);
	t = s;
	t.capacity = 9;
	cr_assert_eq(ps_queue_create(qs, "dup", &t, &created, &err), DG_EEXIST);
	cr_assert(strstr(err.msg, "'dup'") && strstr(err.msg, "capacity 8, not 9"), "%s", err.msg);
	t = s;
	t.seed = 6;
	cr_assert_eq(ps_queue_create(qs, "dup", &t, &created, &err), DG_EEXIST);
	cr_assert(strstr(err.msg, "seed 5, not 6"), "%s", err.msg);
	t = s;
	t.shuffle = false;
	cr_assert_eq(ps_queue_create(qs, "dup", &t, &created, &err), DG_EEXIST);
	cr_assert(strstr(err.msg, "shuffle true, not false"), "%s", err.msg);
	t = s;
	t.shape[0] = dg_shape_make(1, (int64_t[]){ 3 });
	cr_assert_eq(ps_queue_create(qs, "dup", &t, &created, &err), DG_EEXIST);
	cr_assert(strstr(err.msg, "component 0 as int64 [], not int64 [3]"), "%s", err.msg);
	cr_assert(!created);
	cr_assert_eq(ps_queue_count(qs), 1);
	ps_queues_free(qs);
}

Test(queue, create_refuses_bad_names_settings_and_sizes)
{
	struct ps_queues *qs = ps_queues_new(NULL);
	struct dg_queue_spec s = scalar_spec(8, false, 0, 0), t;
	struct dg_err err = { 0 };
	bool created = true;

	cr_assert_eq(ps_queue_create(qs, "a/../b", &s, &created, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "queue") && strstr(err.msg, "'a/../b'"), "%s", err.msg);
	cr_assert_eq(ps_queue_create(qs, "", &s, &created, &err), DG_EINVAL);
	cr_assert_eq(ps_queue_create(qs, "a b", &s, &created, &err), DG_EINVAL);
	t = s;
	t.min_after_dequeue = 8;
	cr_assert_eq(ps_queue_create(qs, "q", &t, &created, &err), DG_EINVAL);
	t = s;
	t.capacity = 0;
	cr_assert_eq(ps_queue_create(qs, "q", &t, &created, &err), DG_EINVAL);
	t = s;
	t.n_components = 0;
	cr_assert_eq(ps_queue_create(qs, "q", &t, &created, &err), DG_EINVAL);
	t = s;
	t.shape[0] = dg_shape_make(1, (int64_t[]){ -2 });
	cr_assert_eq(ps_queue_create(qs, "q", &t, &created, &err), DG_EINVAL);
	/* 2^22 examples of 1025 float32 = 16 GiB + 16 MiB: just past the limit
	 * (1024 would be exactly 16 GiB). Then 2^50-byte examples, whose
	 * product with the capacity would overflow 64 bits. */
	t = s;
	t.capacity = (int64_t)1 << 22;
	t.dtype[0] = DG_F32;
	t.shape[0] = dg_shape_make(1, (int64_t[]){ 1025 });
	cr_assert_eq(ps_queue_create(qs, "big", &t, &created, &err), DG_ETOOLARGE);
	cr_assert(strstr(err.msg, "'big'") && strstr(err.msg, "16 GiB"), "%s", err.msg);
	t.capacity = (int64_t)1 << 40;
	t.shape[0] = dg_shape_make(2, (int64_t[]){ (int64_t)1 << 24, (int64_t)1 << 24 });
	cr_assert_eq(ps_queue_create(qs, "big", &t, &created, &err), DG_ETOOLARGE);
	cr_assert(!created);
	cr_assert_eq(ps_queue_count(qs), 0);
	ps_queues_free(qs);
}

Test(queue, operations_on_a_missing_queue_are_not_found)
{
	struct ps_queues *qs = ps_queues_new(NULL);
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	int64_t v = 1, got = 5;
	json_t *j = (json_t *)1;

	cr_assert_eq(ps_queue_enqueue(qs, "nope", 1, &v, 8, 0, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "queue 'nope' not found"), "%s", err.msg);
	cr_assert_eq(ps_queue_dequeue(qs, "nope", 1, 0, false, &b, &got, &err), DG_ENOTFOUND);
	cr_assert_eq(got, 0);
	cr_assert_eq(ps_queue_close(qs, "nope", &err), DG_ENOTFOUND);
	cr_assert_eq(ps_queue_delete(qs, "nope", &err), DG_ENOTFOUND);
	cr_assert_eq(ps_queue_state(qs, "nope", &j, &err), DG_ENOTFOUND);
	cr_assert_null(j);
	cr_assert_eq(ps_queue_enqueue(qs, "../x", 1, &v, 8, 0, &err), DG_EINVAL);
	/* The codes do not depend on the caller wanting the text. */
	cr_assert_eq(ps_queue_enqueue(qs, "../x", 1, &v, 8, 0, NULL), DG_EINVAL);
	cr_assert_eq(ps_queue_close(qs, "nope", NULL), DG_ENOTFOUND);
	dg_buf_deinit(&b);
	ps_queues_free(qs);
}

Test(queue, delete_wakes_waiters_with_closed_and_forgets_the_queue)
{
	struct dg_queue_spec s = scalar_spec(1, false, 0, 0);
	struct ps_queues *qs = ps_queues_new(NULL);
	struct dg_err err = { 0 };
	struct waiter deq = { .qs = qs, .name = "d1", .n = 1 };
	struct waiter enq = { .qs = qs, .name = "d2", .n = 1, .enqueue = true };
	pthread_t t1, t2;
	bool created;

	cr_assert_eq(ps_queue_create(qs, "d1", &s, &created, &err), DG_OK);
	cr_assert_eq(ps_queue_create(qs, "d2", &s, &created, &err), DG_OK);
	cr_assert_eq(put_range(qs, "d2", 0, 1, 0, &err), DG_OK);
	pthread_create(&t1, NULL, wait_thread, &deq);
	pthread_create(&t2, NULL, wait_thread, &enq);
	usleep(200 * 1000);
	cr_assert(!atomic_load(&deq.done) && !atomic_load(&enq.done));
	cr_assert_eq(ps_queue_delete(qs, "d1", &err), DG_OK);
	cr_assert_eq(ps_queue_delete(qs, "d2", &err), DG_OK);
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	cr_assert_eq(deq.st, DG_ECLOSED, "%s", deq.err.msg);
	cr_assert(strstr(deq.err.msg, "'d1'") && strstr(deq.err.msg, "deleted"), "%s",
		  deq.err.msg);
	cr_assert_eq(enq.st, DG_ECLOSED, "%s", enq.err.msg);
	cr_assert_eq(ps_queue_count(qs), 0);
	cr_assert_eq(ps_queue_close(qs, "d1", &err), DG_ENOTFOUND);
	/* The name is free again, with other settings. */
	s.capacity = 5;
	cr_assert_eq(ps_queue_create(qs, "d1", &s, &created, &err), DG_OK, "%s", err.msg);
	cr_assert(created);
	ps_queues_free(qs);
}

Test(queue, freeing_the_registry_wakes_waiters_first)
{
	struct dg_queue_spec s = scalar_spec(4, false, 0, 0);
	struct ps_queues *qs = new_with("f", &s);
	struct waiter w = { .qs = qs, .name = "f", .n = 2 };
	pthread_t th;

	pthread_create(&th, NULL, wait_thread, &w);
	usleep(200 * 1000);
	cr_assert(!atomic_load(&w.done));
	/* Returns only once the waiter has let go of the queue (ASan would see
	 * the waiter touch freed memory otherwise). */
	ps_queues_free(qs);
	pthread_join(th, NULL);
	cr_assert_eq(w.st, DG_ECLOSED, "%s", w.err.msg);
}

Test(queue, multi_component_examples_round_trip_byte_exact)
{
	/* An MNIST-like example: float32 image [784] and an int64 label. */
	struct dg_queue_spec s = { .capacity = 16, .shuffle = true, .seed = 3, .n_components = 2 };
	struct ps_queues *qs;
	struct dg_err err = { 0 };
	enum { N = 5, PIX = 784 };
	static float img[N][PIX];
	int64_t lab[N], got;
	char body[sizeof img + sizeof lab];
	struct dg_buf out = { 0 };
	bool used[N] = { false };

	s.dtype[0] = DG_F32;
	s.shape[0] = dg_shape_make(1, (int64_t[]){ PIX });
	s.dtype[1] = DG_I64;
	s.shape[1] = dg_shape_make(0, NULL);
	qs = new_with("mnist", &s);
	for (int e = 0; e < N; e++) {
		lab[e] = 1000 + e;
		for (int p = 0; p < PIX; p++)
			img[e][p] = (float)e + (float)p / 1024.0f - 0.3f;
	}
	/* Component-major body: the [5,784] images, then the [5] labels. */
	memcpy(body, img, sizeof img);
	memcpy(body + sizeof img, lab, sizeof lab);
	cr_assert_eq(ps_queue_enqueue(qs, "mnist", N, body, sizeof body, 0, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(ps_queue_dequeue(qs, "mnist", N, 0, false, &out, &got, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(got, N);
	cr_assert_eq(out.len, sizeof body);
	/* Shuffled, so match each label to its image: every pair must come back
	 * whole (the image bytes of example k next to label k). */
	for (int t = 0; t < N; t++) {
		int64_t l;
		memcpy(&l, out.data + sizeof img + (size_t)t * sizeof l, sizeof l);
		cr_assert(l >= 1000 && l < 1000 + N, "label %lld", (long long)l);
		cr_assert(!used[l - 1000], "label %lld twice", (long long)l);
		used[l - 1000] = true;
		cr_assert_eq(memcmp(out.data + (size_t)t * sizeof img[0], img[l - 1000],
				    sizeof img[0]), 0, "image of example %d torn", t);
	}
	dg_buf_deinit(&out);
	ps_queues_free(qs);
}

Test(queue, dequeue_appends_to_what_the_buffer_already_holds)
{
	struct dg_queue_spec s = scalar_spec(4, false, 0, 0);
	struct ps_queues *qs = new_with("app", &s);
	struct dg_err err = { 0 };
	struct dg_buf out = { 0 };
	int64_t got, v;

	cr_assert_eq(dg_buf_append(&out, "hdr", 3, &err), DG_OK);
	cr_assert_eq(put_range(qs, "app", 77, 1, 0, &err), DG_OK);
	cr_assert_eq(ps_queue_dequeue(qs, "app", 1, 0, false, &out, &got, &err), DG_OK);
	cr_assert_eq(out.len, 3 + sizeof v);
	cr_assert_eq(memcmp(out.data, "hdr", 3), 0);
	memcpy(&v, out.data + 3, sizeof v);
	cr_assert_eq(v, 77);
	dg_buf_deinit(&out);
	ps_queues_free(qs);
}

Test(queue, state_list_and_metrics_describe_each_queue)
{
	struct dg_queue_spec s = scalar_spec(100, true, 10, 7);
	struct ps_queues *qs = new_with("train/q", &s);
	struct dg_err err = { 0 };
	struct dg_buf m = { 0 };
	bool created;
	json_t *j, *comps, *list;

	s.dtype[1] = DG_F32;
	s.shape[1] = dg_shape_make(2, (int64_t[]){ 28, 28 });
	s.n_components = 2;
	cr_assert_eq(ps_queue_create(qs, "a", &s, &created, &err), DG_OK);
	cr_assert_eq(put_range(qs, "train/q", 0, 5, 0, &err), DG_OK);
	cr_assert_eq(ps_queue_close(qs, "a", &err), DG_OK);

	cr_assert_eq(ps_queue_state(qs, "train/q", &j, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(json_string_value(json_object_get(j, "name")), "train/q");
	cr_assert_eq(json_integer_value(json_object_get(j, "size")), 5);
	cr_assert_eq(json_integer_value(json_object_get(j, "capacity")), 100);
	cr_assert(json_is_false(json_object_get(j, "closed")));
	cr_assert(json_is_true(json_object_get(j, "shuffle")));
	cr_assert_eq(json_integer_value(json_object_get(j, "min_after_dequeue")), 10);
	cr_assert_eq(json_integer_value(json_object_get(j, "seed")), 7);
	comps = json_object_get(j, "components");
	cr_assert_eq(json_array_size(comps), 1);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(comps, 0), "dtype")),
			 "int64");
	cr_assert_eq(json_array_size(json_object_get(json_array_get(comps, 0), "shape")), 0);
	json_decref(j);

	cr_assert_eq(ps_queue_state(qs, "a", &j, &err), DG_OK);
	cr_assert(json_is_true(json_object_get(j, "closed")));
	comps = json_object_get(j, "components");
	cr_assert_eq(json_array_size(comps), 2);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(json_array_get(comps, 1),
								       "shape"), 1)), 28);
	json_decref(j);

	list = ps_queue_list(qs);
	cr_assert_not_null(list);
	char *text = json_dumps(list, JSON_COMPACT);
	cr_assert_str_eq(text, "{\"queues\":[{\"name\":\"a\",\"size\":0,\"capacity\":100,"
			 "\"closed\":true,\"leased\":0},{\"name\":\"train/q\",\"size\":5,"
			 "\"capacity\":100,\"closed\":false,\"leased\":0}]}");
	free(text);
	json_decref(list);
	cr_assert_eq(ps_queue_count(qs), 2);

	cr_assert_eq(ps_queues_metrics(qs, &m, &err), DG_OK);
	const char *want = "# HELP dg_queue_size Examples queued.\n"
			  "# TYPE dg_queue_size gauge\n"
			  "dg_queue_size{queue=\"a\"} 0\n"
			  "dg_queue_size{queue=\"train/q\"} 5\n"
			  "# HELP dg_queue_capacity Examples a queue holds at most.\n"
			  "# TYPE dg_queue_capacity gauge\n"
			  "dg_queue_capacity{queue=\"a\"} 100\n"
			  "dg_queue_capacity{queue=\"train/q\"} 100\n";
	cr_assert(strncmp(m.data, want, strlen(want)) == 0, "%s", m.data);
	cr_assert(strstr(m.data, "dg_queue_leased{queue=\"train/q\"} 0\n"), "%s", m.data);
	cr_assert(strstr(m.data, "dg_queue_examples_total{queue=\"train/q\",event=\"enqueued\"} 5\n"),
		  "%s", m.data);
	dg_buf_deinit(&m);
	ps_queues_free(qs);
}

Test(queue, empty_registry_lists_nothing)
{
	struct ps_queues *qs = ps_queues_new(NULL);
	json_t *list = ps_queue_list(qs);
	char *text = json_dumps(list, JSON_COMPACT);

	cr_assert_str_eq(text, "{\"queues\":[]}");
	cr_assert_eq(ps_queue_count(qs), 0);
	free(text);
	json_decref(list);
	ps_queues_free(qs);
	ps_queues_free(NULL);
}

/* ---- leases ---- */

/* A leased dequeue of n int64 examples into v; *lease gets the lease. */
static enum dg_status take_leased(struct ps_queues *qs, const char *name, int64_t n,
				  int64_t lease_ms, const char *holder, int64_t timeout_ms,
				  int64_t *v, int64_t *got, uint64_t *lease, struct dg_err *err)
{
	struct ps_lease_opts lo = { .lease_ms = lease_ms, .holder = holder };
	struct dg_buf b = { 0 };
	enum dg_status st = ps_queue_dequeue_lease(qs, name, n, timeout_ms, true, &lo, &b, got,
						   lease, err);

	if (st == DG_OK) {
		cr_assert_gt(*lease, 0);
		memcpy(v, b.data, b.len);
	}
	dg_buf_deinit(&b);
	return st;
}

static int64_t state_int(struct ps_queues *qs, const char *name, const char *key)
{
	struct dg_err err = { 0 };
	json_t *j = NULL;
	int64_t v;

	cr_assert_eq(ps_queue_state(qs, name, &j, &err), DG_OK, "%s", err.msg);
	cr_assert(json_is_integer(json_object_get(j, key)), "state has no %s", key);
	v = json_integer_value(json_object_get(j, key));
	json_decref(j);
	return v;
}

Test(queue, an_acked_lease_consumes_its_examples_for_good)
{
	struct dg_queue_spec s = scalar_spec(10, false, 0, 0);
	struct ps_queues *qs = new_with("q", &s);
	struct dg_err err = { 0 };
	int64_t v[8], got, n;
	uint64_t lease;

	cr_assert_eq(put_range(qs, "q", 0, 4, 0, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(take_leased(qs, "q", 3, 60000, "r0", 0, v, &got, &lease, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(got, 3);
	cr_assert(v[0] == 0 && v[1] == 1 && v[2] == 2);
	cr_assert_eq(state_int(qs, "q", "leased"), 3);
	cr_assert_eq(state_int(qs, "q", "size"), 1);
	cr_assert_eq(ps_queue_lease_end(qs, "q", lease, PS_LEASE_ACK, &n, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_eq(n, 3);
	cr_assert_eq(state_int(qs, "q", "leased"), 0);
	cr_assert_eq(state_int(qs, "q", "acked"), 3);
	/* a second ack of the same lease is refused, naming it */
	cr_assert_eq(ps_queue_lease_end(qs, "q", lease, PS_LEASE_ACK, &n, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "not held"), "%s", err.msg);
	/* only the fourth example is left */
	cr_assert_eq(take(qs, "q", 1, 0, false, v, &got, &err), DG_OK, "%s", err.msg);
	cr_assert(got == 1 && v[0] == 3);
	ps_queues_free(qs);
}

Test(queue, an_expired_lease_goes_back_to_the_front)
{
	struct dg_queue_spec s = scalar_spec(10, false, 0, 0);
	struct ps_queues *qs = new_with("q", &s);
	struct dg_err err = { 0 };
	int64_t v[8], got;
	uint64_t lease;
	double t0;

	cr_assert_eq(put_range(qs, "q", 10, 5, 0, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(take_leased(qs, "q", 2, 150, "r1", 0, v, &got, &lease, &err), DG_OK);
	cr_assert(v[0] == 10 && v[1] == 11);
	/* a waiting dequeue of the whole queue gets the lease's examples back
	 * when it runs out, at the front, in their order */
	t0 = now_ms();
	cr_assert_eq(take(qs, "q", 5, 5000, false, v, &got, &err), DG_OK, "%s", err.msg);
	cr_assert_geq(now_ms() - t0, 100);
	cr_assert_lt(now_ms() - t0, 2000);
	cr_assert_eq(got, 5);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(v[i], 10 + i, "position %d is %lld", i, (long long)v[i]);
	cr_assert_eq(state_int(qs, "q", "expired"), 1);
	cr_assert_eq(state_int(qs, "q", "requeued"), 2);
	ps_queues_free(qs);
}

Test(queue, release_by_lease_and_by_holder_requeue_at_once)
{
	struct dg_queue_spec s = scalar_spec(10, false, 0, 0);
	struct ps_queues *qs = new_with("q", &s);
	struct dg_err err = { 0 };
	int64_t v[8], got, n, leases;
	uint64_t a, b, c;

	cr_assert_eq(put_range(qs, "q", 0, 6, 0, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j1/r0", 0, v, &got, &a, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j1/r1", 0, v, &got, &b, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j1/r1", 0, v, &got, &c, &err), DG_OK);
	cr_assert(a != b && b != c);
	cr_assert_eq(ps_queue_lease_end(qs, "q", a, PS_LEASE_RELEASE, &n, &err), DG_OK);
	cr_assert_eq(n, 2);
	cr_assert_eq(ps_queue_release_holder(qs, "q", "j1/r1", &leases, &n, &err), DG_OK);
	cr_assert(leases == 2 && n == 4);
	cr_assert_eq(state_int(qs, "q", "size"), 6);
	cr_assert_eq(state_int(qs, "q", "leased"), 0);
	cr_assert_eq(take(qs, "q", 6, 0, false, v, &got, &err), DG_OK);
	int64_t sum = 0;
	for (int i = 0; i < 6; i++)
		sum += v[i];
	cr_assert_eq(sum, 0 + 1 + 2 + 3 + 4 + 5);
	ps_queues_free(qs);
}

Test(queue, leased_examples_keep_their_room)
{
	struct dg_queue_spec s = scalar_spec(4, false, 0, 0);
	struct ps_queues *qs = new_with("q", &s);
	struct dg_err err = { 0 };
	int64_t v[8], got, n;
	uint64_t lease;

	cr_assert_eq(put_range(qs, "q", 0, 4, 0, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 3, 60000, NULL, 0, v, &got, &lease, &err), DG_OK);
	/* 1 queued + 3 leased of 4: no room until the lease ends */
	cr_assert_eq(put_range(qs, "q", 9, 1, 50, &err), DG_ETIMEOUT);
	cr_assert(strstr(err.msg, "3 leased"), "%s", err.msg);
	cr_assert_eq(ps_queue_lease_end(qs, "q", lease, PS_LEASE_DROP, &n, &err), DG_OK);
	cr_assert_eq(state_int(qs, "q", "dropped"), 3);
	cr_assert_eq(put_range(qs, "q", 9, 3, 0, &err), DG_OK, "%s", err.msg);
	ps_queues_free(qs);
}

struct ack_later {
	struct ps_queues *qs;
	uint64_t lease;
	enum ps_lease_end how;
};

static void *end_lease_later(void *arg)
{
	struct ack_later *a = arg;
	struct dg_err err = { 0 };
	int64_t n;

	usleep(150 * 1000);
	cr_assert_eq(ps_queue_lease_end(a->qs, "q", a->lease, a->how, &n, &err), DG_OK, "%s",
		     err.msg);
	return NULL;
}

Test(queue, a_closed_queue_with_leases_out_is_not_at_its_end)
{
	struct dg_queue_spec s = scalar_spec(10, false, 0, 0);
	struct ps_queues *qs = new_with("q", &s);
	struct dg_err err = { 0 };
	int64_t v[8], got;
	uint64_t lease;
	pthread_t th;

	cr_assert_eq(put_range(qs, "q", 0, 2, 0, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, NULL, 0, v, &got, &lease, &err), DG_OK);
	cr_assert_eq(ps_queue_close(qs, "q", &err), DG_OK);
	/* released later: the waiting dequeue gets the examples */
	struct ack_later rel = { qs, lease, PS_LEASE_RELEASE };
	pthread_create(&th, NULL, end_lease_later, &rel);
	cr_assert_eq(take(qs, "q", 2, 5000, true, v, &got, &err), DG_OK, "%s", err.msg);
	cr_assert(got == 2 && v[0] == 0 && v[1] == 1);
	pthread_join(th, NULL);
	/* taken again under a lease and acked later: the waiting dequeue ends */
	cr_assert_eq(ps_queue_enqueue(qs, "q", 1, v, 8, 0, &err), DG_ECLOSED);
	ps_queues_free(qs);
	qs = new_with("q", &s);
	cr_assert_eq(put_range(qs, "q", 0, 2, 0, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, NULL, 0, v, &got, &lease, &err), DG_OK);
	cr_assert_eq(ps_queue_close(qs, "q", &err), DG_OK);
	struct ack_later ack = { qs, lease, PS_LEASE_ACK };
	pthread_create(&th, NULL, end_lease_later, &ack);
	double t0 = now_ms();
	cr_assert_eq(take(qs, "q", 2, 5000, true, v, &got, &err), DG_ECLOSED);
	cr_assert_geq(now_ms() - t0, 100);
	pthread_join(th, NULL);
	ps_queues_free(qs);
}

Test(queue, ids_are_counted_at_enqueue_and_at_ack)
{
	struct dg_queue_spec s = scalar_spec(10, true, 0, 3);
	struct ps_queues *qs;
	struct dg_err err = { 0 };
	int64_t v[8], got, n;
	uint64_t lease;
	json_t *j = NULL;

	s.has_ids = true;
	s.ids = 0;
	qs = new_with("q", &s);
	cr_assert_eq(put_range(qs, "q", 0, 4, 0, &err), DG_OK);
	cr_assert_eq(put_range(qs, "q", 2, 2, 0, &err), DG_OK);      /* 2 and 3 twice */
	cr_assert_eq(take_leased(qs, "q", 6, 60000, NULL, 0, v, &got, &lease, &err), DG_OK);
	cr_assert_eq(ps_queue_lease_end(qs, "q", lease, PS_LEASE_ACK, &n, &err), DG_OK);
	cr_assert_eq(ps_queue_id_counts(qs, "q", &j, &err), DG_OK, "%s", err.msg);
	json_t *e = json_object_get(j, "enqueued"), *a = json_object_get(j, "acked");
	cr_assert_eq(json_array_size(e), 4);
	for (int i = 0; i < 4; i++) {
		int want = i < 2 ? 1 : 2;
		cr_assert_eq(json_integer_value(json_array_get(e, (size_t)i)), want);
		cr_assert_eq(json_integer_value(json_array_get(a, (size_t)i)), want);
	}
	json_decref(j);
	cr_assert_eq(state_int(qs, "q", "ids_complete"), 4);
	cr_assert_eq(state_int(qs, "q", "ids_short"), 0);
	ps_queues_free(qs);
}

/* The ids of log entry k of j's "requeues" into out (returns how many). */
static size_t entry_ids(json_t *j, size_t k, int64_t *out)
{
	json_t *ids = json_object_get(json_array_get(json_object_get(j, "requeues"), k), "ids"), *v;
	size_t i;

	json_array_foreach(ids, i, v)
		out[i] = json_integer_value(v);
	return json_array_size(ids);
}

static const char *entry_str(json_t *j, size_t k, const char *key)
{
	return json_string_value(json_object_get(json_array_get(json_object_get(j, "requeues"),
								 k), key));
}

Test(queue, the_requeue_log_names_every_lease_that_went_back_with_its_ids)
{
	struct dg_queue_spec s = scalar_spec(20, false, 0, 0);
	struct ps_queues *qs;
	struct dg_err err = { 0 };
	int64_t v[8], got, n, leases, ids[8];
	uint64_t a, b, c, d, e;
	json_t *j = NULL;

	s.has_ids = true;
	s.ids = 0;
	qs = new_with("q", &s);
	cr_assert_eq(put_range(qs, "q", 100, 10, 0, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j1/r0", 0, v, &got, &a, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j1/r1", 0, v, &got, &b, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j1/r1", 0, v, &got, &c, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 60000, "j2/r0", 0, v, &got, &d, &err), DG_OK);
	cr_assert_eq(take_leased(qs, "q", 2, 100, "j1/r0", 0, v, &got, &e, &err), DG_OK);
	/* a (ids 100, 101) acked: not in the log; b (102, 103) released; c
	 * (104, 105) dropped; d (106, 107) of another job released with its
	 * holder; e (108, 109) runs out. */
	cr_assert_eq(ps_queue_lease_end(qs, "q", a, PS_LEASE_ACK, &n, &err), DG_OK);
	cr_assert_eq(ps_queue_lease_end(qs, "q", b, PS_LEASE_RELEASE, &n, &err), DG_OK);
	cr_assert_eq(ps_queue_lease_end(qs, "q", c, PS_LEASE_DROP, &n, &err), DG_OK);
	cr_assert_eq(ps_queue_release_holder(qs, "q", "j2/r0", &leases, &n, &err), DG_OK);
	usleep(150 * 1000);
	cr_assert_eq(ps_queue_requeues(qs, "q", NULL, 0, 100, &j, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(json_array_size(json_object_get(j, "requeues")), 4);
	const char *want_reason[] = { "released", "dropped", "holder_released", "expired" };
	const uint64_t want_lease[] = { b, c, d, e };
	for (size_t k = 0; k < 4; k++) {
		json_t *x = json_array_get(json_object_get(j, "requeues"), k);
		cr_assert_str_eq(entry_str(j, k, "reason"), want_reason[k]);
		cr_assert_eq((uint64_t)json_integer_value(json_object_get(x, "lease")),
			     want_lease[k]);
		cr_assert_eq(json_integer_value(json_object_get(x, "seq")), (json_int_t)k + 1);
		cr_assert_eq(json_integer_value(json_object_get(x, "examples")), 2);
		cr_assert_eq(entry_ids(j, k, ids), 2);
		cr_assert(ids[0] == 102 + 2 * (int64_t)k && ids[1] == 103 + 2 * (int64_t)k,
			  "entry %zu: ids %lld %lld", k, (long long)ids[0], (long long)ids[1]);
	}
	cr_assert_eq(json_integer_value(json_object_get(j, "last_seq")), 4);
	cr_assert(json_is_false(json_object_get(j, "more")));
	json_decref(j);
	/* A job's own (prefix), after an entry, at most one at a time. */
	cr_assert_eq(ps_queue_requeues(qs, "q", "j1/r", 1, 1, &j, &err), DG_OK);
	cr_assert_eq(json_array_size(json_object_get(j, "requeues")), 1);
	cr_assert_str_eq(entry_str(j, 0, "reason"), "dropped");
	cr_assert(json_is_true(json_object_get(j, "more")));
	cr_assert_eq(json_integer_value(json_object_get(j, "last_seq")), 2);
	json_decref(j);
	cr_assert_eq(ps_queue_requeues(qs, "q", "j1/r", 2, 10, &j, &err), DG_OK);
	cr_assert_eq(json_array_size(json_object_get(j, "requeues")), 1);
	cr_assert_str_eq(entry_str(j, 0, "reason"), "expired");
	cr_assert_str_eq(entry_str(j, 0, "holder"), "j1/r0");
	cr_assert_eq(json_integer_value(json_object_get(j, "last_seq")), 4);
	json_decref(j);
	cr_assert_eq(ps_queue_requeues(qs, "nope", NULL, 0, 10, &j, &err), DG_ENOTFOUND);
	ps_queues_free(qs);
}

Test(queue, the_requeue_log_keeps_its_bound_and_counts_what_it_dropped)
{
	struct dg_queue_spec s = scalar_spec(4, false, 0, 0);
	struct ps_queues *qs;
	struct dg_err err = { 0 };
	int64_t v[8], got, n;
	uint64_t lease;
	const int64_t rounds = (1 << 16) + 10;
	json_t *j = NULL;

	s.has_ids = true;
	s.ids = 0;
	qs = new_with("q", &s);
	cr_assert_eq(put_range(qs, "q", 0, 1, 0, &err), DG_OK);
	/* One example leased and released over and over: one entry each. */
	for (int64_t i = 0; i < rounds; i++) {
		cr_assert_eq(take_leased(qs, "q", 1, 60000, "r", 0, v, &got, &lease, &err), DG_OK);
		cr_assert_eq(ps_queue_lease_end(qs, "q", lease, PS_LEASE_RELEASE, &n, &err),
			     DG_OK);
	}
	cr_assert_eq(ps_queue_requeues(qs, "q", NULL, 0, 5, &j, &err), DG_OK);
	cr_assert_eq(json_integer_value(json_object_get(j, "evicted")), 10);
	cr_assert_eq(json_integer_value(json_object_get(j, "first_seq")), 11);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(json_object_get(j,
		     "requeues"), 0), "seq")), 11);
	json_decref(j);
	ps_queues_free(qs);
}

Test(queue, a_queue_too_large_for_the_machine_is_a_413)
{
	struct dg_queue_spec s = scalar_spec((int64_t)1 << 32, false, 0, 0);
	struct dg_err err = { 0 };
	struct ps_queues *qs = ps_queues_new(&err);

	s.shape[0].ndim = 1;
	s.shape[0].dim[0] = 1024;      /* 2^32 x 8 KiB: far past any limit */
	cr_assert_eq(ps_queue_create(qs, "big", &s, NULL, &err), DG_ETOOLARGE);
	cr_assert_eq(dg_status_to_http(err.code), 413);
	cr_assert(strstr(err.msg, "limit"), "%s", err.msg);
	ps_queues_free(qs);
}
