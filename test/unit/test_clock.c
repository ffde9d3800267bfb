/* The shared clocks and deadlines (core/include/dg/clock.h): the units agree,
 * a negative timeout never expires, the time left rounds up so that it is 0
 * exactly when the deadline has passed, and a monotonic condition variable
 * times out at the deadline's timespec. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>

#include "dg/clock.h"

Test(clock, the_monotonic_units_agree_and_do_not_go_back)
{
	int64_t ns = dg_mono_ns(), us = dg_mono_us(), ms = dg_mono_ms();
	double s = dg_mono_s();

	cr_assert_geq(us, ns / 1000);
	cr_assert_geq(ms, ns / 1000000);
	cr_assert_geq(s, (double)ns * 1e-9);
	cr_assert_lt(s - (double)ns * 1e-9, 1.0, "ns %lld, s %f", (long long)ns, s);
	cr_assert_geq(dg_mono_ns(), ns);
}

Test(clock, wall_time_is_after_2020_and_its_units_agree)
{
	int64_t ms = dg_wall_ms();
	double s = dg_wall_s();

	cr_assert_gt(ms, (int64_t)1577836800 * 1000);      /* 2020-01-01 */
	cr_assert_lt(s - (double)ms * 1e-3, 1.0);
	cr_assert_gt(s - (double)ms * 1e-3, -1.0);
}

Test(clock, a_negative_timeout_never_expires)
{
	struct dg_deadline d = dg_deadline_in_ms(-1);

	cr_assert(dg_deadline_is_never(d));
	cr_assert_not(dg_deadline_expired(d));
	cr_assert_eq(dg_deadline_left_ms(d), INT64_MAX);
	cr_assert(dg_deadline_is_never(dg_deadline_in_ms(INT64_MAX)), "no overflow");
}

Test(clock, a_zero_timeout_has_expired_with_nothing_left)
{
	struct dg_deadline d = dg_deadline_in_ms(0);

	cr_assert(dg_deadline_expired(d));
	cr_assert_eq(dg_deadline_left_ms(d), 0);
}

Test(clock, time_left_rounds_up_and_reaches_zero_after_the_deadline)
{
	struct dg_deadline d = dg_deadline_in_ms(30);
	int64_t left = dg_deadline_left_ms(d);

	cr_assert(left >= 1 && left <= 30, "left %lld", (long long)left);
	cr_assert_not(dg_deadline_expired(d));
	d.ns = dg_mono_ns() + 1;        /* 1 ns ahead: still 1 ms left, not 0 */
	cr_assert(dg_deadline_left_ms(d) <= 1);
	dg_sleep_ms(35);
	cr_assert(dg_deadline_expired(d));
	cr_assert_eq(dg_deadline_left_ms(d), 0);
}

Test(clock, sleep_ms_sleeps_at_least_that_long)
{
	int64_t t0 = dg_mono_ns();

	dg_sleep_ms(20);
	cr_assert_geq(dg_mono_ns() - t0, 20 * 1000000LL);
	dg_sleep_ms(0);
	dg_sleep_ms(-5);
}

Test(clock, a_monotonic_condvar_times_out_at_the_deadline)
{
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cv;
	struct dg_deadline d = dg_deadline_in_ms(40);
	struct timespec ts = dg_deadline_timespec(d);
	int rc;

	cr_assert_eq(dg_cond_init_mono(&cv), 0);
	cr_assert(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
	pthread_mutex_lock(&mu);
	do
		rc = pthread_cond_timedwait(&cv, &mu, &ts);
	while (rc == 0);
	pthread_mutex_unlock(&mu);
	cr_assert_eq(rc, ETIMEDOUT);
	cr_assert(dg_deadline_expired(d), "woke %lld ns early", (long long)(d.ns - dg_mono_ns()));
	pthread_cond_destroy(&cv);
}

Test(clock, iso8601_has_milliseconds_and_utc)
{
	char buf[32], small[10];

	dg_iso8601_ms(1796454638709, buf, sizeof buf);
	cr_assert_str_eq(buf, "2026-12-05T07:10:38.709Z");
	dg_iso8601_ms(0, buf, sizeof buf);
	cr_assert_str_eq(buf, "1970-01-01T00:00:00.000Z");
	dg_iso8601_ms(1796454638709, small, sizeof small);     /* too small: empty, bounded */
	cr_assert_str_eq(small, "");
}
