/* Criterion suite "cluster": cluster specs (core/src/cluster.c): TensorFlow's
 * dense and sparse forms, TF_CONFIG, task lookup, every rejection with the
 * text of its message, loading from a file, and host:port splitting. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dg/cluster.h"

static struct dg_cluster *parse_ok(const char *text)
{
	struct dg_err err = { 0 };
	struct dg_cluster *c = dg_cluster_parse(text, strlen(text), &err);

	cr_assert_not_null(c, "%s: %s", text, err.msg);
	return c;
}

static void assert_task(const struct dg_cluster *c, int i, const char *job, int index,
			const char *address)
{
	cr_assert_lt(i, c->n_tasks);
	cr_assert_str_eq(c->tasks[i].job, job, "task %d", i);
	cr_assert_eq(c->tasks[i].index, index, "task %d", i);
	cr_assert_str_eq(c->tasks[i].address, address, "task %d", i);
}

Test(cluster, dense_spec_lists_tasks_by_job_then_index)
{
	struct dg_cluster *c = parse_ok("{\"ps\": [\"localhost:2222\"], \"worker\": "
					"[\"localhost:2223\", \"localhost:2224\"]}");
	struct dg_err err = { 0 };
	const struct dg_task_addr *t;

	cr_assert_eq(c->n_tasks, 3);
	assert_task(c, 0, "ps", 0, "localhost:2222");
	assert_task(c, 1, "worker", 0, "localhost:2223");
	assert_task(c, 2, "worker", 1, "localhost:2224");
	cr_assert_eq(dg_cluster_job_size(c, "ps"), 1);
	cr_assert_eq(dg_cluster_job_size(c, "worker"), 2);
	cr_assert_eq(dg_cluster_job_size(c, "chief"), 0);
	t = dg_cluster_task(c, "worker", 1, &err);
	cr_assert_not_null(t);
	cr_assert_str_eq(t->address, "localhost:2224");
	dg_cluster_free(c);
	dg_cluster_free(NULL);
}

Test(cluster, jobs_keep_the_order_of_the_file)
{
	struct dg_cluster *c = parse_ok("{\"worker\": [\"w:1\"], \"ps\": [\"p:1\", \"p:2\"], "
					"\"chief\": [\"c:1\"], \"a-b_1\": [\"[::1]:9\"]}");

	cr_assert_eq(c->n_tasks, 5);
	assert_task(c, 0, "worker", 0, "w:1");
	assert_task(c, 1, "ps", 0, "p:1");
	assert_task(c, 2, "ps", 1, "p:2");
	assert_task(c, 3, "chief", 0, "c:1");
	assert_task(c, 4, "a-b_1", 0, "[::1]:9");
	dg_cluster_free(c);
}

Test(cluster, sparse_form_orders_tasks_by_index)
{
	struct dg_cluster *c = parse_ok("{\"ps\": [\"h:1\"], \"worker\": {\"12\": \"h:12\", "
					"\"3\": \"h:3\", \"0\": \"h:0\"}}");
	struct dg_err err = { 0 };

	cr_assert_eq(c->n_tasks, 4);
	assert_task(c, 1, "worker", 0, "h:0");
	assert_task(c, 2, "worker", 3, "h:3");
	assert_task(c, 3, "worker", 12, "h:12");
	cr_assert_eq(dg_cluster_job_size(c, "worker"), 3);
	cr_assert_str_eq(dg_cluster_task(c, "worker", 12, &err)->address, "h:12");
	cr_assert_null(dg_cluster_task(c, "worker", 1, &err));
	cr_assert_eq(err.code, DG_ENOTFOUND);
	dg_cluster_free(c);
}

Test(cluster, port_zero_may_repeat_across_tasks)
{
	struct dg_cluster *c = parse_ok("{\"ps\": [\"127.0.0.1:0\"], \"worker\": "
					"[\"127.0.0.1:0\", \"127.0.0.1:0\"]}");

	cr_assert_eq(c->n_tasks, 3);
	assert_task(c, 2, "worker", 1, "127.0.0.1:0");
	dg_cluster_free(c);
}

/* A server bound on a spec's port 0 writes its address into its own copy. */
Test(cluster, set_address_replaces_one_task_and_refuses_a_missing_one)
{
	struct dg_cluster *c = parse_ok("{\"local\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}");
	struct dg_err err = { 0 };

	cr_assert_eq(dg_cluster_set_address(c, "local", 1, "127.0.0.1:4321", &err), DG_OK);
	assert_task(c, 0, "local", 0, "127.0.0.1:0");
	assert_task(c, 1, "local", 1, "127.0.0.1:4321");
	cr_assert_eq(dg_cluster_set_address(c, "local", 2, "127.0.0.1:1", &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "task /job:local/task:2 is not in the cluster"), "%s", err.msg);
	dg_cluster_free(c);
}

Test(cluster, missing_task_names_the_task_and_the_jobs_there_are)
{
	struct dg_cluster *c = parse_ok("{\"ps\": [\"h:1\"], \"worker\": [\"h:2\", \"h:3\"]}");
	struct dg_err err = { 0 };

	cr_assert_null(dg_cluster_task(c, "worker", 2, &err));
	cr_assert_eq(err.code, DG_ENOTFOUND);
	cr_assert_str_eq(err.msg, "task /job:worker/task:2 is not in the cluster; jobs: "
			 "ps (1 task), worker (2 tasks)");
	cr_assert_null(dg_cluster_task(c, "chief", 0, &err));
	cr_assert(strstr(err.msg, "/job:chief/task:0"), "%s", err.msg);
	dg_cluster_free(c);
}

/* Each bad spec, the code and a piece of the message it must produce. */
static const struct {
	const char *spec;
	enum dg_status code;
	const char *msg;
} bad_specs[] = {
	{ "{\"ps\": [\"h:1\"", DG_EINVAL, "not valid JSON: line 1" },
	{ "", DG_EINVAL, "not valid JSON" },
	{ "[\"h:1\"]", DG_EINVAL, "must be a JSON object" },
	{ "\"ps\"", DG_EINVAL, "must be a JSON object" },
	{ "{}", DG_EINVAL, "has no jobs" },
	{ "{\"wor ker\": [\"h:1\"]}", DG_EINVAL, "job name 'wor ker' has the character ' '" },
	{ "{\"ps/0\": [\"h:1\"]}", DG_EINVAL, "job name 'ps/0'" },
	{ "{\"\": [\"h:1\"]}", DG_EINVAL, "job name '' must be 1 to 64" },
	{ "{\"ps\": []}", DG_EINVAL, "job 'ps' has no tasks" },
	{ "{\"ps\": {}}", DG_EINVAL, "job 'ps' has no tasks" },
	{ "{\"ps\": \"h:1\"}", DG_EINVAL, "job 'ps' must map to a list" },
	{ "{\"ps\": [\"h:1\", 5]}", DG_EINVAL, "job 'ps' task 1: the address must be" },
	{ "{\"ps\": [null]}", DG_EINVAL, "job 'ps' task 0" },
	{ "{\"ps\": [\"h:70000\"]}", DG_EINVAL, "job 'ps' task 0: address 'h:70000': port "
	  "'70000' is not a number from 0 to 65535" },
	{ "{\"ps\": [\"h\"]}", DG_EINVAL, "address 'h' has no port" },
	{ "{\"ps\": [\"::1:2222\"]}", DG_EINVAL, "more than one ':'" },
	{ "{\"ps\": [\"grpc://h:1\"]}", DG_EINVAL, "URL scheme" },
	{ "{\"ps\": [\"h:1\"], \"worker\": [\"h:2\", \"H:1\"]}", DG_EINVAL,
	  "job 'worker' task 1 has the address H:1 of job 'ps' task 0" },
	{ "{\"ps\": [\"h:1\", \"h:1\"]}", DG_EINVAL, "job 'ps' task 1 has the address h:1" },
	{ "{\"ps\": [\"h:1\"], \"ps\": [\"h:2\"]}", DG_EINVAL, "duplicate object key" },
	{ "{\"w\": {\"x\": \"h:1\"}}", DG_EINVAL, "job 'w': task index 'x' is not a number" },
	{ "{\"w\": {\"01\": \"h:1\"}}", DG_EINVAL, "task index '01'" },
	{ "{\"w\": {\"-1\": \"h:1\"}}", DG_EINVAL, "task index '-1'" },
	{ "{\"w\": {\"99999999\": \"h:1\"}}", DG_EINVAL, "task index '99999999'" },
	{ "{\"w\": {\"2\": 7}}", DG_EINVAL, "job 'w' task 2: the address must be" },
	{ "{\"w\": {\"0\": \"h:1\", \"1\": \"h:1\"}}", DG_EINVAL,
	  "job 'w' task 1 has the address" },
};

Test(cluster, bad_specs_are_refused_naming_the_job_and_entry)
{
	for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
		struct dg_err err = { 0 };
		struct dg_cluster *c = dg_cluster_parse(bad_specs[i].spec,
							strlen(bad_specs[i].spec), &err);
		cr_assert_null(c, "accepted %s", bad_specs[i].spec);
		cr_assert_eq(err.code, bad_specs[i].code, "%s: %s", bad_specs[i].spec, err.msg);
		cr_assert(strstr(err.msg, bad_specs[i].msg), "%s: got '%s', wanted '%s'",
			  bad_specs[i].spec, err.msg, bad_specs[i].msg);
	}
}

Test(cluster, tf_config_gives_the_cluster_and_the_task)
{
	const char *tf = "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\", \"w:2\"], "
			 "\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1}, "
			 "\"environment\": \"cloud\", \"rpc_layer\": \"grpc\"}";
	struct dg_err err = { 0 };
	char *job = NULL;
	int index = 7;
	struct dg_cluster *c = dg_cluster_from_tf_config(tf, &job, &index, &err);

	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_str_eq(job, "worker");
	cr_assert_eq(index, 1);
	cr_assert_eq(c->n_tasks, 4);
	assert_task(c, 0, "chief", 0, "c:1");
	assert_task(c, 2, "worker", 1, "w:2");
	assert_task(c, 3, "ps", 0, "p:1");
	free(job);
	dg_cluster_free(c);
}

Test(cluster, tf_config_without_task_gives_no_job_and_index_minus_one)
{
	struct dg_err err = { 0 };
	char *job = (char *)"x";
	int index = 7;
	struct dg_cluster *c = dg_cluster_from_tf_config("{\"cluster\": {\"worker\": "
							 "{\"1\": \"w:1\"}}}", &job, &index, &err);

	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_null(job);
	cr_assert_eq(index, -1);
	cr_assert_eq(c->n_tasks, 1);
	assert_task(c, 0, "worker", 1, "w:1");
	dg_cluster_free(c);
}

Test(cluster, tf_config_task_without_index_is_task_zero)
{
	struct dg_err err = { 0 };
	char *job = NULL;
	int index = -1;
	struct dg_cluster *c = dg_cluster_from_tf_config(
		"{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\"}}", &job, &index,
		&err);

	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_str_eq(job, "ps");
	cr_assert_eq(index, 0);
	free(job);
	dg_cluster_free(c);
}

static const struct {
	const char *tf;
	enum dg_status code;
	const char *msg;
} bad_tf[] = {
	{ "{\"task\": {\"type\": \"ps\"}}", DG_EINVAL, "TF_CONFIG has no \"cluster\"" },
	{ "[]", DG_EINVAL, "TF_CONFIG must be a JSON object" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]", DG_EINVAL, "TF_CONFIG is not valid JSON" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"tsk\": {}}", DG_EINVAL,
	  "TF_CONFIG: unknown key 'tsk'" },
	{ "{\"cluster\": {\"ps\": [\"p\"]}}", DG_EINVAL,
	  "TF_CONFIG: cluster spec: job 'ps' task 0" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}",
	  DG_ENOTFOUND, "TF_CONFIG: task /job:worker/task:0 is not in the cluster; jobs: ps" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 1}}",
	  DG_ENOTFOUND, "/job:ps/task:1" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": -1}}",
	  DG_EINVAL, "task \"index\" of job 'ps' must be an integer >= 0" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": \"0\"}}",
	  DG_EINVAL, "must be an integer" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"index\": 0}}", DG_EINVAL,
	  "needs a \"type\"" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": [\"ps\", 0]}", DG_EINVAL,
	  "\"task\" must be an object" },
	{ "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"job\": 1}}", DG_EINVAL,
	  "unknown key 'job' in \"task\"" },
};

Test(cluster, bad_tf_configs_are_refused_with_a_message)
{
	for (size_t i = 0; i < sizeof bad_tf / sizeof bad_tf[0]; i++) {
		struct dg_err err = { 0 };
		char *job = NULL;
		int index = 0;
		struct dg_cluster *c = dg_cluster_from_tf_config(bad_tf[i].tf, &job, &index, &err);
		cr_assert_null(c, "accepted %s", bad_tf[i].tf);
		cr_assert_null(job);
		cr_assert_eq(err.code, bad_tf[i].code, "%s: %s", bad_tf[i].tf, err.msg);
		cr_assert(strstr(err.msg, bad_tf[i].msg), "%s: got '%s', wanted '%s'", bad_tf[i].tf,
			  err.msg, bad_tf[i].msg);
	}
}

/* A temporary file holding text; returns its path (static buffer). */
static const char *temp_file(const char *text, off_t size)
{
	static char path[64];
	int fd;

	snprintf(path, sizeof path, "/tmp/dg_test_cluster_XXXXXX");
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	if (size > 0)
		cr_assert_eq(ftruncate(fd, size), 0);
	close(fd);
	return path;
}

Test(cluster, load_reads_a_file_and_names_it_in_errors)
{
	struct dg_err err = { 0 };
	const char *path = temp_file("{\"ps\": [\"localhost:2222\"]}\n", 0);
	struct dg_cluster *c = dg_cluster_load(path, &err);

	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_eq(c->n_tasks, 1);
	assert_task(c, 0, "ps", 0, "localhost:2222");
	dg_cluster_free(c);
	unlink(path);

	path = temp_file("{\"ps\": [\"localhost\"]}", 0);
	cr_assert_null(dg_cluster_load(path, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert(strncmp(err.msg, path, strlen(path)) == 0 && strstr(err.msg, "job 'ps' task 0"),
		  "%s", err.msg);
	unlink(path);

	cr_assert_null(dg_cluster_load("/nonexistent/dg/cluster.json", &err));
	cr_assert_eq(err.code, DG_ENOTFOUND, "%s", err.msg);
	cr_assert(strstr(err.msg, "/nonexistent/dg/cluster.json"), "%s", err.msg);

	/* Past the 16 MiB limit (a sparse file: nothing is written). */
	path = temp_file("{", ((off_t)16 << 20) + 1);
	cr_assert_null(dg_cluster_load(path, &err));
	cr_assert_eq(err.code, DG_ETOOLARGE, "%s", err.msg);
	unlink(path);
}

Test(cluster, split_host_port_accepts_names_ipv4_and_bracketed_ipv6)
{
	static const struct {
		const char *addr, *host;
		int port;
	} ok[] = {
		{ "localhost:2222", "localhost", 2222 },
		{ "10.0.0.1:0", "10.0.0.1", 0 },
		{ "node-1.example.com:65535", "node-1.example.com", 65535 },
		{ "my_host:80", "my_host", 80 },
		{ "[::1]:8080", "::1", 8080 },
		{ "[fe80::1%eth0]:1", "fe80::1%eth0", 1 },
		{ "[::ffff:10.0.0.1]:7", "::ffff:10.0.0.1", 7 },
	};

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		struct dg_err err = { 0 };
		char host[64];
		int port = -1;
		cr_assert_eq(dg_split_host_port(ok[i].addr, host, sizeof host, &port, &err), DG_OK,
			     "%s: %s", ok[i].addr, err.msg);
		cr_assert_str_eq(host, ok[i].host);
		cr_assert_eq(port, ok[i].port, "%s", ok[i].addr);
	}
}

Test(cluster, split_host_port_refuses_bad_ports_and_hosts)
{
	static const struct {
		const char *addr, *msg;
	} bad[] = {
		{ "h:65536", "port '65536' is not a number from 0 to 65535" },
		{ "h:-1", "port '-1'" },
		{ "h:+80", "port '+80'" },
		{ "h: 80", "port ' 80'" },
		{ "h:80a", "port '80a'" },
		{ "h:123456", "port '123456'" },
		{ "h:", "port ''" },
		{ ":80", "empty host" },
		{ "", "empty address" },
		{ "h", "has no port" },
		{ "::1:80", "more than one ':'" },
		{ "[::1]", "is not \"[ipv6]:port\"" },
		{ "[::1]80", "is not \"[ipv6]:port\"" },
		{ "[::1:80", "is not \"[ipv6]:port\"" },
		{ "[]:80", "'' is not an IPv6 address" },
		{ "[xyz]:80", "'xyz' is not an IPv6 address" },
		{ "[fe80::1%]:80", "is not an IPv6 address" },
		{ "ho st:80", "host has the character ' '" },
		{ "http://h:80", "URL scheme" },
	};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct dg_err err = { 0 };
		char host[64];
		int port = -1;
		cr_assert_eq(dg_split_host_port(bad[i].addr, host, sizeof host, &port, &err),
			     DG_EINVAL, "accepted '%s'", bad[i].addr);
		cr_assert(strstr(err.msg, bad[i].msg), "%s: got '%s', wanted '%s'", bad[i].addr,
			  err.msg, bad[i].msg);
	}
}

Test(cluster, split_host_port_checks_the_host_length)
{
	struct dg_err err = { 0 };
	char host[8], addr[300];
	int port;

	cr_assert_eq(dg_split_host_port("abcdefgh:1", host, sizeof host, &port, &err),
		     DG_ETOOLARGE);
	cr_assert(strstr(err.msg, "does not fit a buffer of 8"), "%s", err.msg);
	cr_assert_eq(dg_split_host_port("abcdefg:1", host, sizeof host, &port, &err), DG_OK);
	cr_assert_str_eq(host, "abcdefg");
	memset(addr, 'a', 254);
	strcpy(addr + 254, ":1");
	cr_assert_eq(dg_split_host_port(addr, host, sizeof host, &port, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "host is 254 bytes; at most 253"), "%s", err.msg);
}

Test(cluster, a_new_variable_goes_to_the_allowed_task_holding_the_fewest_bytes)
{
	const int64_t bytes[4] = { 300, 100, 100, 50 };
	const bool allowed[4] = { true, true, true, false };
	const bool none[4] = { false, false, false, false };

	cr_assert_eq(dg_cluster_pick_fewest_bytes(bytes, NULL, 4), 3);
	cr_assert_eq(dg_cluster_pick_fewest_bytes(bytes, allowed, 4), 1, "ties go to the first");
	cr_assert_eq(dg_cluster_pick_fewest_bytes(bytes, NULL, 1), 0);
	cr_assert_eq(dg_cluster_pick_fewest_bytes(bytes, none, 4), -1);
	cr_assert_eq(dg_cluster_pick_fewest_bytes(bytes, NULL, 0), -1);
}
