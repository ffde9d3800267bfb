/* Helpers shared by the benchmarks (bench_util.h): the clock, the median, the
 * stop of a child process and the dump of its log, once instead of in every
 * bench file. */
#include "bench_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"

double bench_now_s(void)
{
	return dg_mono_s();
}

int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_median(const double *v, int n)
{
	double *s, m;

	if (n <= 0 || !(s = malloc((size_t)n * sizeof s[0])))
		return -1;
	memcpy(s, v, (size_t)n * sizeof s[0]);
	qsort(s, (size_t)n, sizeof s[0], bench_cmp_double);
	m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
	free(s);
	return m;
}

void bench_stop_child(pid_t pid, int grace_ms)
{
	int status;

	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	/* poll every 10 ms: the servers usually exit within a few */
	for (int i = 0; i < grace_ms / 10; i++) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
}

void bench_dump_file(const char *path)
{
	char line[512];
	FILE *f = fopen(path, "r");

	if (!f)
		return;
	while (fgets(line, sizeof line, f))
		fprintf(stderr, "  | %s", line);
	fclose(f);
}
