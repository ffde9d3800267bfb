/* Criterion suite "data": the reader ops of kernels/cpu/data.c. IdxReader on
 * the real Fashion-MNIST files (skipped when the Debian package is absent):
 * shapes, first labels, class counts, pixel range, scaling, one-hot rows,
 * shapes inferred at validation; and on malformed files written here
 * (truncated, wrong magic, lying counts, non-uint8, gzip garbage, huge dims).
 * NpyReader round-trips a tensor written by the codec. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "dg/autodiff.h"
#include "dg/codec.h"
#include "dg/exec.h"
#include "dg/kernels.h"

#define FMNIST "/usr/share/datasets/fashion-mnist"
#define TRAIN_LABELS FMNIST "/train-labels-idx1-ubyte.gz"
#define TEST_LABELS FMNIST "/t10k-labels-idx1-ubyte.gz"
#define TRAIN_IMAGES FMNIST "/train-images-idx3-ubyte.gz"
#define TEST_IMAGES FMNIST "/t10k-images-idx3-ubyte.gz"

static char dir[64];

static void setup(void)
{
	strcpy(dir, "/tmp/dg-test-data-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(data, .init = setup, .fini = teardown);

static bool have_fmnist(void)
{
	if (access(FMNIST "/train-labels-idx1-ubyte.gz", R_OK) == 0 &&
	    access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) == 0 &&
	    access(FMNIST "/t10k-labels-idx1-ubyte.gz", R_OK) == 0)
		return true;
	cr_log_warn("skipped: %s is absent (install dataset-fashion-mnist)", FMNIST);
	return false;
}

/* Run op with attrs given as JSON text; returns the status, *out on success. */
static enum dg_status run(const char *op, const char *attrs, struct dg_tensor **out,
			  struct dg_err *err)
{
	json_t *j = json_loads(attrs, 0, NULL);
	enum dg_status st;

	cr_assert_not_null(j, "bad JSON in test: %s", attrs);
	st = dg_op_run(dg_op_find(op), j, NULL, 0, out, 1, 0, err);
	json_decref(j);
	return st;
}

static struct dg_tensor *ok(const char *op, const char *attrs)
{
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run(op, attrs, &t, &err);

	cr_assert_eq(st, DG_OK, "%s %s: %s", op, attrs, err.msg);
	return t;
}

static void shape_is(const struct dg_tensor *t, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
	int64_t want[3] = { d0, d1, d2 };

	cr_assert_eq(t->shape.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		cr_assert_eq(t->shape.dim[i], want[i], "dim %d: %lld", i,
			     (long long)t->shape.dim[i]);
}

Test(data, fashion_mnist_labels_have_the_known_first_values_and_class_counts)
{
	static const int train[10] = { 9, 0, 0, 3, 0, 2, 7, 2, 5, 5 };
	static const int test[10] = { 9, 2, 1, 1, 6, 1, 4, 6, 5, 7 };
	int count[10] = { 0 };

	if (!have_fmnist())
		return;
	struct dg_tensor *l = ok("IdxReader", "{\"path\": \"" TRAIN_LABELS "\"}");
	struct dg_tensor *t = ok("IdxReader", "{\"path\": \"" TEST_LABELS "\"}");
	cr_assert_eq(l->dtype, DG_I32, "labels default to int32");
	shape_is(l, 1, 60000, 0, 0);
	shape_is(t, 1, 10000, 0, 0);
	for (int i = 0; i < 10; i++) {
		cr_assert_eq(((int32_t *)l->data)[i], train[i], "train label %d", i);
		cr_assert_eq(((int32_t *)t->data)[i], test[i], "test label %d", i);
	}
	for (int64_t i = 0; i < l->numel; i++)
		count[((int32_t *)l->data)[i]]++;
	for (int k = 0; k < 10; k++)
		cr_assert_eq(count[k], 6000, "class %d", k);
	dg_tensor_free(l);
	dg_tensor_free(t);
}

Test(data, fashion_mnist_one_hot_rows_sum_to_one_at_the_label)
{
	if (!have_fmnist())
		return;
	struct dg_tensor *l = ok("IdxReader", "{\"path\": \"" TEST_LABELS "\"}");
	struct dg_tensor *h = ok("IdxReader", "{\"path\": \"" TEST_LABELS "\", "
				 "\"one_hot\": 10}");
	cr_assert_eq(h->dtype, DG_F32);
	shape_is(h, 2, 10000, 10, 0);
	for (int64_t r = 0; r < 10000; r++) {
		const float *row = (const float *)h->data + r * 10;
		float s = 0;
		for (int k = 0; k < 10; k++)
			s += row[k];
		cr_assert_eq(s, 1.0f, "row %lld", (long long)r);
		cr_assert_eq(row[((int32_t *)l->data)[r]], 1.0f, "row %lld", (long long)r);
	}
	dg_tensor_free(l);
	dg_tensor_free(h);
}

Test(data, fashion_mnist_images_raw_and_scaled)
{
	if (!have_fmnist())
		return;
	struct dg_tensor *raw = ok("IdxReader", "{\"path\": \"" TRAIN_IMAGES "\"}");
	cr_assert_eq(raw->dtype, DG_U8);
	shape_is(raw, 3, 60000, 28, 28);
	int64_t sum = 0;
	for (int i = 0; i < 784; i++)
		sum += ((uint8_t *)raw->data)[i];
	cr_assert_eq(sum, 76247, "pixel sum of the first image");
	dg_tensor_free(raw);

	struct dg_tensor *x = ok("IdxReader", "{\"path\": \"" TRAIN_IMAGES "\", "
				 "\"scale\": true, \"flatten\": true}");
	cr_assert_eq(x->dtype, DG_F32);
	shape_is(x, 2, 60000, 784, 0);
	float lo = 1, hi = 0;
	double first = 0;
	for (int64_t i = 0; i < x->numel; i++) {
		float v = ((float *)x->data)[i];
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
		if (i < 784)
			first += v;
	}
	cr_assert_eq(lo, 0.0f);
	cr_assert_eq(hi, 1.0f);
	cr_assert_float_eq(first, 76247.0 / 255.0, 1e-3);
	dg_tensor_free(x);
}

Test(data, graph_validation_reads_the_shape_from_the_header)
{
	if (!have_fmnist())
		return;
	const char *text = "{\"nodes\": [{\"name\": \"x\", \"op\": \"IdxReader\", \"attrs\": "
		"{\"path\": \"" FMNIST "/t10k-images-idx3-ubyte.gz\", \"scale\": true, "
		"\"flatten\": true, \"dtype\": \"float64\"}},"
		"{\"name\": \"m\", \"op\": \"Mean\", \"inputs\": [\"x\"]}], \"fetch\": [\"m\"]}";
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse(text, strlen(text), dg_op_find, &err);
	struct dg_tensor *out[1];

	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[0].out[0].dtype, DG_F64);
	cr_assert_eq(g->nodes[0].out[0].shape.ndim, 2);
	cr_assert_eq(g->nodes[0].out[0].shape.dim[0], 10000);
	cr_assert_eq(g->nodes[0].out[0].shape.dim[1], 784);
	cr_assert_eq(dg_exec_run(g, NULL, 0, NULL, 0, out, NULL, &err), DG_OK, "%s", err.msg);
	double m = dg_tensor_get_f64(out[0], 0);
	cr_assert(m > 0.2 && m < 0.4, "mean pixel %g", m);   /* Fashion-MNIST: about 0.286 */
	dg_tensor_free(out[0]);
	dg_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* Malformed files                                                            */

/* Write bytes to dir/name, gzip-compressed when gz. Returns the path (static). */
static const char *write_file(const char *name, const void *p, size_t n, bool gz)
{
	static char path[128];

	snprintf(path, sizeof path, "%s/%s", dir, name);
	if (gz) {
		gzFile f = gzopen(path, "wb");
		cr_assert_not_null(f);
		cr_assert_eq(gzwrite(f, p, (unsigned)n), (int)n);
		cr_assert_eq(gzclose(f), Z_OK);
	} else {
		FILE *f = fopen(path, "wb");
		cr_assert_not_null(f);
		cr_assert_eq(fwrite(p, 1, n, f), n);
		cr_assert_eq(fclose(f), 0);
	}
	return path;
}

/* An IDX header: type, then dims; returns its length. */
static size_t header(uint8_t *b, int type, int ndim, const uint32_t *dims)
{
	b[0] = 0;
	b[1] = 0;
	b[2] = (uint8_t)type;
	b[3] = (uint8_t)ndim;
	for (int i = 0; i < ndim; i++) {
		b[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
		b[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
		b[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
		b[7 + 4 * i] = (uint8_t)dims[i];
	}
	return 4 + 4 * (size_t)ndim;
}

/* Expect code from IdxReader on path (extra attrs appended), with want in the
 * message. */
static void idx_fails(const char *path, const char *extra, enum dg_status code,
		      const char *want)
{
	char attrs[512];
	struct dg_tensor *t = NULL;
	struct dg_err err = { 0 };

	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\"%s}", path, extra);
	enum dg_status st = run("IdxReader", attrs, &t, &err);
	cr_assert_eq(st, code, "%s: got %s: %s", path, dg_status_name(st), err.msg);
	cr_assert_null(t);
	cr_assert(strstr(err.msg, want), "message lacks '%s': %s", want, err.msg);
}

Test(data, truncated_files_say_what_the_header_promised)
{
	static uint8_t b[16 + 1234];
	uint32_t dims[3] = { 3, 28, 28 };
	size_t h = header(b, 0x08, 3, dims);

	for (size_t i = h; i < sizeof b; i++)
		b[i] = (uint8_t)i;
	idx_fails(write_file("t.idx", b, h + 1234, false), "", DG_EINVAL,
		  "truncated: header of");
	idx_fails(write_file("t.idx", b, h + 1234, false), "", DG_EINVAL,
		  "says 3 images of 28x28 (2352 bytes), file has 1234");
	idx_fails(write_file("t.idx.gz", b, h + 1234, true), "", DG_EINVAL,
		  "says 3 images of 28x28 (2352 bytes), file has 1234");
	/* Cut inside the header itself. */
	idx_fails(write_file("h.idx", b, 9, false), "", DG_EINVAL, "ends inside its header");
}

Test(data, wrong_magic_and_non_uint8_types_are_refused)
{
	uint8_t b[64] = { 0x12, 0x34, 0x08, 0x01 };
	uint32_t dims[1] = { 4 };

	idx_fails(write_file("m.idx", b, 12, false), "", DG_EINVAL,
		  "is not an IDX file: magic 12340801");
	idx_fails(write_file("e.idx", b, 0, false), "", DG_EINVAL, "is not an IDX file");
	size_t h = header(b, 0x0D, 1, dims);
	idx_fails(write_file("f.idx", b, h + 16, false), "", DG_EDTYPE, "type 0x0D (float32)");
	h = header(b, 0x08, 0, dims);
	idx_fails(write_file("z.idx", b, h, false), "", DG_EINVAL, "declares 0 dims");
}

Test(data, lying_counts_and_huge_dims_are_refused)
{
	uint8_t b[64] = { 0 };
	uint32_t five[1] = { 5 }, huge[3] = { 0xFFFFFFFFu, 0xFFFFFFFFu, 28 };
	size_t h = header(b, 0x08, 1, five);

	/* The header says 5 labels; the file holds 8. */
	idx_fails(write_file("l.idx", b, h + 8, false), "", DG_EINVAL, "more data than its header");
	idx_fails(write_file("l.idx.gz", b, h + 8, true), "", DG_EINVAL,
		  "more data than its header");
	h = header(b, 0x08, 3, huge);
	idx_fails(write_file("huge.idx", b, h + 10, false), "", DG_ETOOLARGE, "declares more than");
}

Test(data, gzip_garbage_and_missing_files)
{
	uint8_t b[256];
	uint32_t dims[1] = { 200 };
	size_t h = header(b, 0x08, 1, dims);
	char path[128];

	for (size_t i = h; i < sizeof b; i++)
		b[i] = (uint8_t)(i * 7);
	/* A valid gzip stream with its compressed body overwritten. */
	const char *p = write_file("g.idx.gz", b, sizeof b, true);
	FILE *f = fopen(p, "r+b");
	cr_assert_not_null(f);
	cr_assert_eq(fseek(f, 12, SEEK_SET), 0);
	for (int i = 0; i < 40; i++)
		fputc(0xA5 ^ i, f);
	fclose(f);
	idx_fails(p, "", DG_EINVAL, "not a valid gzip stream");
	snprintf(path, sizeof path, "%s/absent.idx.gz", dir);
	idx_fails(path, "", DG_ENOTFOUND, "cannot open IDX file");
}

Test(data, labels_beyond_one_hot_and_one_hot_on_images_are_errors)
{
	uint8_t b[64];
	uint32_t dims[1] = { 4 }, img[3] = { 1, 2, 2 };
	size_t h = header(b, 0x08, 1, dims);

	memcpy(b + h, (uint8_t[]){ 0, 1, 7, 2 }, 4);
	const char *p = write_file("l.idx", b, h + 4, false);
	idx_fails(p, ", \"one_hot\": 5", DG_EINVAL, "label 7 (item 2");
	char attrs[256];
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"one_hot\": 8, "
		 "\"dtype\": \"float64\"}", p);
	struct dg_tensor *t = ok("IdxReader", attrs);
	shape_is(t, 2, 4, 8, 0);
	cr_assert_eq(dg_tensor_get_f64(t, 2 * 8 + 7), 1.0);
	cr_assert_eq(dg_tensor_get_f64(t, 2 * 8 + 6), 0.0);
	dg_tensor_free(t);
	h = header(b, 0x08, 3, img);
	memset(b + h, 255, 4);
	p = write_file("i.idx", b, h + 4, false);
	idx_fails(p, ", \"one_hot\": 5", DG_EINVAL, "applies to label files");
	idx_fails(p, ", \"scale\": true, \"dtype\": \"int32\"", DG_EDTYPE, "needs a float dtype");
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"scale\": true, \"flatten\": true}", p);
	t = ok("IdxReader", attrs);
	shape_is(t, 2, 1, 4, 0);
	cr_assert_eq(((float *)t->data)[3], 1.0f);
	dg_tensor_free(t);
}

/* ------------------------------------------------------------------------ */
/* NpyReader                                                                  */

Test(data, npy_reader_returns_the_stored_tensor)
{
	struct dg_shape s = { .ndim = 2, .dim = { 2, 3 } };
	double v[6] = { 1, 2, 3, 4, 5, 6.5 };
	struct dg_tensor *t = dg_tensor_from_data(DG_F64, &s, v, NULL), *r;
	struct dg_err err = { 0 };
	char path[128], attrs[256];

	snprintf(path, sizeof path, "%s/x.npy", dir);
	cr_assert_eq(dg_npy_write_file(path, t, &err), DG_OK, "%s", err.msg);
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\"}", path);
	r = ok("NpyReader", attrs);
	cr_assert_eq(r->dtype, DG_F64);
	cr_assert(dg_shape_eq(&r->shape, &s));
	cr_assert_eq(memcmp(r->data, v, sizeof v), 0);
	dg_tensor_free(r);

	/* Validation takes dtype and shape from the header. */
	char text[512];
	snprintf(text, sizeof text, "{\"nodes\": [{\"name\": \"x\", \"op\": \"NpyReader\", "
		 "\"attrs\": {\"path\": \"%s\"}}]}", path);
	struct dg_graph *g = dg_graph_parse(text, strlen(text), dg_op_find, &err);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[0].out[0].dtype, DG_F64);
	cr_assert(dg_shape_eq(&g->nodes[0].out[0].shape, &s));
	dg_graph_free(g);

	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"dtype\": \"float32\"}", path);
	cr_assert_eq(run("NpyReader", attrs, &r, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "holds float64"), "%s", err.msg);
	dg_tensor_free(t);
}

Test(data, npy_reader_of_an_absent_file_validates_with_a_dtype_and_fails_at_run_time)
{
	char text[512];
	struct dg_err err = { 0 };
	struct dg_graph *g;
	struct dg_tensor *out[1];

	snprintf(text, sizeof text, "{\"nodes\": [{\"name\": \"x\", \"op\": \"NpyReader\", "
		 "\"attrs\": {\"path\": \"%s/none.npy\"}}]}", dir);
	cr_assert_null(dg_graph_parse(text, strlen(text), dg_op_find, &err));
	cr_assert(strstr(err.msg, "none.npy"), "%s", err.msg);
	snprintf(text, sizeof text, "{\"nodes\": [{\"name\": \"x\", \"op\": \"NpyReader\", "
		 "\"attrs\": {\"path\": \"%s/none.npy\", \"dtype\": \"float32\"}}], "
		 "\"fetch\": [\"x\"]}", dir);
	g = dg_graph_parse(text, strlen(text), dg_op_find, &err);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[0].out[0].shape.ndim, -1);
	cr_assert_neq(dg_exec_run(g, NULL, 0, NULL, 0, out, NULL, &err), DG_OK);
	cr_assert(strstr(err.msg, "none.npy"), "%s", err.msg);
	dg_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* CsvReader                                                                  */

static const char iris_like[] =
	"sepal_l,sepal_w,label\r\n"
	"5.1, 3.5,0\r\n"
	"\"4.9\",3.0,1\r\n"
	"6.3,2.5e0,2\r\n"
	"\n";

Test(data, csv_reader_reads_all_columns_chosen_columns_and_one_column)
{
	const char *path = write_file("t.csv", iris_like, strlen(iris_like), false);
	char attrs[256];
	struct dg_tensor *r;

	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"header\": true}", path);
	r = ok("CsvReader", attrs);
	cr_assert_eq(r->dtype, DG_F32);
	shape_is(r, 2, 3, 3, 0);
	const float want[9] = { 5.1f, 3.5f, 0, 4.9f, 3.0f, 1, 6.3f, 2.5f, 2 };
	for (int i = 0; i < 9; i++)
		cr_assert_float_eq(((float *)r->data)[i], want[i], 1e-6, "element %d", i);
	dg_tensor_free(r);
	/* columns in the order given */
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"header\": true, \"columns\": [1, 0],"
		 " \"dtype\": \"float64\"}", path);
	r = ok("CsvReader", attrs);
	shape_is(r, 2, 3, 2, 0);
	cr_assert_float_eq(((double *)r->data)[0], 3.5, 1e-12);
	cr_assert_float_eq(((double *)r->data)[5], 6.3, 1e-12);
	dg_tensor_free(r);
	/* the labels as int32 [N] */
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"header\": true, \"column\": 2,"
		 " \"dtype\": \"int32\"}", path);
	r = ok("CsvReader", attrs);
	shape_is(r, 1, 3, 0, 0);
	cr_assert(((int32_t *)r->data)[0] == 0 && ((int32_t *)r->data)[2] == 2);
	dg_tensor_free(r);
	/* gzip and tabs */
	static const char tsv[] = "1\t2\n3\t4\n";
	path = write_file("t.tsv.gz", tsv, strlen(tsv), true);
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"delimiter\": \"\\t\","
		 " \"dtype\": \"int64\"}", path);
	r = ok("CsvReader", attrs);
	shape_is(r, 2, 2, 2, 0);
	cr_assert_eq(((int64_t *)r->data)[3], 4);
	dg_tensor_free(r);
}

Test(data, csv_reader_validation_counts_the_rows_for_a_feeder)
{
	const char *path = write_file("v.csv", iris_like, strlen(iris_like), false);
	char text[512];
	struct dg_err err = { 0 };

	snprintf(text, sizeof text, "{\"nodes\": [{\"name\": \"y\", \"op\": \"CsvReader\", "
		 "\"attrs\": {\"path\": \"%s\", \"header\": true, \"column\": 2, "
		 "\"dtype\": \"int32\"}}]}", path);
	struct dg_graph *g = dg_graph_parse(text, strlen(text), dg_op_find, &err);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[0].out[0].dtype, DG_I32);
	cr_assert_eq(g->nodes[0].out[0].shape.ndim, 1);
	cr_assert_eq(g->nodes[0].out[0].shape.dim[0], 3);
	dg_graph_free(g);
	/* absent at validation: unknown shape; at run time, an error naming it */
	snprintf(text, sizeof text, "{\"nodes\": [{\"name\": \"y\", \"op\": \"CsvReader\", "
		 "\"attrs\": {\"path\": \"%s/none.csv\"}}]}", dir);
	g = dg_graph_parse(text, strlen(text), dg_op_find, &err);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[0].out[0].shape.ndim, -1);
	dg_graph_free(g);
}

/* CsvReader with attrs {"path": path + extra} fails with code, the message
 * containing want. */
static void csv_fails(const char *text, const char *extra, enum dg_status code,
		      const char *want)
{
	const char *path = write_file("bad.csv", text, strlen(text), false);
	char attrs[512];
	struct dg_tensor *r = NULL;
	struct dg_err err = { 0 };

	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\"%s}", path, extra);
	cr_assert_eq(run("CsvReader", attrs, &r, &err), code, "%s: %s", attrs, err.msg);
	cr_assert(strstr(err.msg, want), "%s: want '%s' in: %s", attrs, want, err.msg);
}

Test(data, csv_reader_errors_name_the_line_and_column)
{
	csv_fails("1,2\n3\n", "", DG_EINVAL, "line 2 has 1 fields");
	csv_fails("1,2\n3,x4\n", "", DG_EINVAL, "line 2 column 1: 'x4' is not a float32");
	csv_fails("1,2\n3,4.5\n", ", \"dtype\": \"int32\"", DG_EINVAL, "'4.5' is not an int32");
	csv_fails("1,2\n3,9999999999\n", ", \"dtype\": \"int32\"", DG_EINVAL, "not an int32");
	csv_fails("1,,2\n", ", \"dtype\": \"float64\"", DG_EINVAL,
		  "line 1 column 1: '' is not a float64");
	csv_fails("a,b\n", ", \"header\": true", DG_EINVAL, "no rows after its header");
	csv_fails("", "", DG_EINVAL, "has no rows");
	csv_fails("1,2\n", ", \"columns\": [0, 2]", DG_EINVAL, "no column 2");
	csv_fails("1,2\n", ", \"columns\": [-1]", DG_EINVAL, "negative");
	csv_fails("1,2\n", ", \"columns\": []", DG_EINVAL, "is empty");
	csv_fails("1,2\n", ", \"columns\": [0], \"column\": 1", DG_EINVAL, "not both");
	csv_fails("1,2\n", ", \"delimiter\": \";;\"", DG_EINVAL, "one character");
	csv_fails("1,2\n", ", \"delimiter\": \"-\"", DG_EINVAL, "one character");
	csv_fails("1,2\n", ", \"dtype\": \"uint8\"", DG_EDTYPE, "float32, float64, int32");
	csv_fails("1,2\n1e999,2\n", ", \"dtype\": \"float64\"", DG_EINVAL,
		  "'1e999' is not a float64");
	csv_fails("1,2\n1e39,2\n", "", DG_EINVAL, "'1e39' is not a float32");
	struct dg_tensor *r = NULL;
	struct dg_err err = { 0 };
	char attrs[256];
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s/none.csv\"}", dir);
	cr_assert_eq(run("CsvReader", attrs, &r, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "none.csv"), "%s", err.msg);
	/* a directory is the request's mistake, not an I/O failure */
	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\"}", dir);
	cr_assert_eq(run("CsvReader", attrs, &r, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "is not a file"), "%s", err.msg);
}

Test(data, csv_reader_takes_subnormals_and_counts_rows_like_it_reads_them)
{
	static const char text[] = "h1;h2\n\n1e-310;2\n  \n3;4";   /* no final newline */
	const char *path = write_file("s.csv", text, strlen(text), true);
	char attrs[256], gtext[512];
	struct dg_err err = { 0 };

	snprintf(attrs, sizeof attrs, "{\"path\": \"%s\", \"header\": true, \"delimiter\": "
		 "\";\", \"dtype\": \"float64\"}", path);
	struct dg_tensor *r = ok("CsvReader", attrs);
	shape_is(r, 2, 2, 2, 0);
	cr_assert(((double *)r->data)[0] > 0 && ((double *)r->data)[0] < 1e-300);
	dg_tensor_free(r);
	/* validation streams the file and finds the same 2 rows */
	snprintf(gtext, sizeof gtext, "{\"nodes\": [{\"name\": \"x\", \"op\": \"CsvReader\", "
		 "\"attrs\": %s}]}", attrs);
	struct dg_graph *g = dg_graph_parse(gtext, strlen(gtext), dg_op_find, &err);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert(g->nodes[0].out[0].shape.ndim == 2 && g->nodes[0].out[0].shape.dim[0] == 2 &&
		  g->nodes[0].out[0].shape.dim[1] == 2);
	dg_graph_free(g);
	/* and the same errors */
	static const char bad[] = "1;2\n3\n";
	path = write_file("sb.csv", bad, strlen(bad), false);
	snprintf(gtext, sizeof gtext, "{\"nodes\": [{\"name\": \"x\", \"op\": \"CsvReader\", "
		 "\"attrs\": {\"path\": \"%s\", \"delimiter\": \";\"}}]}", path);
	cr_assert_null(dg_graph_parse(gtext, strlen(gtext), dg_op_find, &err));
	cr_assert(strstr(err.msg, "line 2 has 1 fields"), "%s", err.msg);
}

/* ------------------------------------------------------------------------ */
/* ShardBatch                                                                 */

/* x[i] = (i, -i) float32, labels[i] = 10 i int32, i < n. */
static void dataset(int64_t n, struct dg_tensor **x, struct dg_tensor **l)
{
	struct dg_shape sx = { .ndim = 2, .dim = { n, 2 } }, sl = { .ndim = 1, .dim = { n } };

	*x = dg_tensor_new(DG_F32, &sx, NULL);
	*l = dg_tensor_new(DG_I32, &sl, NULL);
	cr_assert(*x && *l);
	for (int64_t i = 0; i < n; i++) {
		((float *)(*x)->data)[2 * i] = (float)i;
		((float *)(*x)->data)[2 * i + 1] = (float)-i;
		((int32_t *)(*l)->data)[i] = (int32_t)(10 * i);
	}
}

/* Run ShardBatch at step; returns the example indices of the batch in idx
 * after checking that rows and labels belong together. */
static enum dg_status shard_run(const char *attrs, const struct dg_tensor *x,
				const struct dg_tensor *l, uint64_t step, int64_t *idx,
				struct dg_err *err)
{
	const struct dg_tensor *in[2] = { x, l };
	struct dg_tensor *out[2] = { NULL, NULL };
	json_t *j = json_loads(attrs, 0, NULL);
	enum dg_status st = dg_op_run(dg_op_find("ShardBatch"), j, in, 2, out, 2, step, err);

	json_decref(j);
	if (st != DG_OK)
		return st;
	for (int64_t b = 0; b < out[1]->numel; b++) {
		float v = ((float *)out[0]->data)[2 * b];
		cr_assert_eq(((float *)out[0]->data)[2 * b + 1], -v);
		cr_assert_eq(((int32_t *)out[1]->data)[b], (int32_t)(10 * v), "label of row %lld",
			     (long long)b);
		idx[b] = (int64_t)v;
	}
	dg_tensor_free(out[0]);
	dg_tensor_free(out[1]);
	return DG_OK;
}

Test(data, shard_batch_covers_the_shard_once_per_epoch_and_reshuffles)
{
	struct dg_tensor *x, *l;
	struct dg_err err = { 0 };
	const char *a0 = "{\"batch\": 4, \"shard\": 0, \"num_shards\": 2, \"seed\": 7}";
	const char *a1 = "{\"batch\": 4, \"shard\": 1, \"num_shards\": 2, \"seed\": 7}";
	int64_t idx[4], again[4], order[3][20];

	dataset(41, &x, &l);   /* shard 0: 21 even examples -> 5 batches; 1 dropped */
	for (int epoch = 0; epoch < 3; epoch++) {
		bool seen[41] = { false };
		for (int s = 0; s < 5; s++) {
			cr_assert_eq(shard_run(a0, x, l, (uint64_t)(epoch * 5 + s), idx, &err), DG_OK,
				     "%s", err.msg);
			for (int b = 0; b < 4; b++) {
				cr_assert_eq(idx[b] % 2, 0, "shard 0 owns even examples");
				cr_assert(!seen[idx[b]], "example %lld twice in an epoch",
					  (long long)idx[b]);
				seen[idx[b]] = true;
				order[epoch][s * 4 + b] = idx[b];
			}
		}
	}
	cr_assert(memcmp(order[0], order[1], sizeof order[0]) != 0, "epoch 1 reshuffled");
	cr_assert(memcmp(order[1], order[2], sizeof order[0]) != 0, "epoch 2 reshuffled");
	/* A pure function of the step. */
	cr_assert_eq(shard_run(a0, x, l, 7, idx, &err), DG_OK);
	cr_assert_eq(shard_run(a0, x, l, 7, again, &err), DG_OK);
	cr_assert_eq(memcmp(idx, again, sizeof idx), 0);
	cr_assert_eq(shard_run(a1, x, l, 3, idx, &err), DG_OK, "%s", err.msg);
	for (int b = 0; b < 4; b++)
		cr_assert_eq(idx[b] % 2, 1, "shard 1 owns odd examples");
	/* Without shuffling: file order within the shard. */
	cr_assert_eq(shard_run("{\"batch\": 4, \"shard\": 1, \"num_shards\": 2, \"shuffle\": false}",
			       x, l, 1, idx, &err), DG_OK, "%s", err.msg);
	for (int b = 0; b < 4; b++)
		cr_assert_eq(idx[b], 1 + 2 * (4 + b));
	dg_tensor_free(x);
	dg_tensor_free(l);
}

Test(data, shard_batch_errors_name_the_problem)
{
	struct dg_tensor *x, *l, *l2;
	struct dg_err err = { 0 };
	int64_t idx[64];

	dataset(10, &x, &l);
	cr_assert_eq(shard_run("{\"batch\": 8, \"shard\": 1, \"num_shards\": 2}", x, l, 0, idx,
			       &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "fewer than one batch"), "%s", err.msg);
	cr_assert_eq(shard_run("{\"batch\": 2, \"shard\": 2, \"num_shards\": 2}", x, l, 0, idx,
			       &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "shard 2 of 2"), "%s", err.msg);
	cr_assert_eq(shard_run("{\"batch\": 0}", x, l, 0, idx, &err), DG_EINVAL);
	struct dg_tensor *x9;
	dataset(9, &x9, &l2);   /* labels of 9 examples against 10 rows */
	cr_assert_eq(shard_run("{\"batch\": 2}", x, l2, 0, idx, &err), DG_ESHAPE);
	cr_assert(strstr(err.msg, "differ in dim 0"), "%s", err.msg);
	dg_tensor_free(x9);
	dg_tensor_free(l2);
	dg_tensor_free(x);
	dg_tensor_free(l);
}

Test(data, shard_batch_infers_the_batch_shape)
{
	const char *text = "{\"nodes\": ["
		"{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [-1, 784]}},"
		"{\"name\": \"y\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"int32\", "
		"\"shape\": [-1]}},"
		"{\"name\": \"b\", \"op\": \"ShardBatch\", \"inputs\": [\"x\", \"y\"], "
		"\"attrs\": {\"batch\": 64, \"shard\": 1, \"num_shards\": 2}}]}";
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse(text, strlen(text), dg_op_find, &err);

	cr_assert_not_null(g, "%s", err.msg);
	const struct dg_node *b = &g->nodes[2];
	cr_assert_eq(b->n_out, 2);
	cr_assert_eq(b->out[0].shape.ndim, 2);
	cr_assert_eq(b->out[0].shape.dim[0], 64);
	cr_assert_eq(b->out[0].shape.dim[1], 784);
	cr_assert_eq(b->out[1].dtype, DG_I32);
	cr_assert_eq(b->out[1].shape.dim[0], 64);
	dg_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* End to end: the readers, ShardBatch and autodiff train a model             */

static const char softmax_regression[] = "{\"nodes\": ["
	"{\"name\": \"x\", \"op\": \"IdxReader\", \"attrs\": {\"path\": \"" TRAIN_IMAGES "\", "
	"\"scale\": true, \"flatten\": true}},"
	"{\"name\": \"y\", \"op\": \"IdxReader\", \"attrs\": {\"path\": \"" TRAIN_LABELS "\"}},"
	"{\"name\": \"batch\", \"op\": \"ShardBatch\", \"inputs\": [\"x\", \"y\"], "
	"\"attrs\": {\"batch\": 100, \"seed\": 1}},"
	"{\"name\": \"w\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [784, 10]}},"
	"{\"name\": \"b\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [10]}},"
	"{\"name\": \"xw\", \"op\": \"MatMul\", \"inputs\": [\"batch:0\", \"w\"]},"
	"{\"name\": \"logits\", \"op\": \"Add\", \"inputs\": [\"xw\", \"b\"]},"
	"{\"name\": \"ce\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
	"\"inputs\": [\"logits\", \"batch:1\"]},"
	"{\"name\": \"loss\", \"op\": \"Mean\", \"inputs\": [\"ce\"]},"
	"{\"name\": \"tx\", \"op\": \"IdxReader\", \"attrs\": {\"path\": \"" TEST_IMAGES "\", "
	"\"scale\": true, \"flatten\": true}},"
	"{\"name\": \"ty\", \"op\": \"IdxReader\", \"attrs\": {\"path\": \"" TEST_LABELS "\"}},"
	"{\"name\": \"txw\", \"op\": \"MatMul\", \"inputs\": [\"tx\", \"w\"]},"
	"{\"name\": \"tl\", \"op\": \"Add\", \"inputs\": [\"txw\", \"b\"]},"
	"{\"name\": \"pred\", \"op\": \"ArgMax\", \"inputs\": [\"tl\"], "
	"\"attrs\": {\"axis\": 1, \"output_type\": \"int32\"}},"
	"{\"name\": \"hit\", \"op\": \"Equal\", \"inputs\": [\"pred\", \"ty\"]},"
	"{\"name\": \"hitf\", \"op\": \"Cast\", \"inputs\": [\"hit\"], "
	"\"attrs\": {\"dtype\": \"float32\"}},"
	"{\"name\": \"acc\", \"op\": \"Mean\", \"inputs\": [\"hitf\"]}]}";

Test(data, softmax_regression_on_fashion_mnist_learns_in_one_epoch)
{
	if (!have_fmnist())
		return;
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse(softmax_regression, sizeof softmax_regression - 1,
					    dg_op_find, &err), *gg;
	cr_assert_not_null(g, "%s", err.msg);
	const char *wrt[2] = { "w", "b" };
	json_t *doc;
	char **refs;
	cr_assert_eq(dg_autodiff(g, "loss", wrt, 2, &doc, &refs, &err), DG_OK, "%s", err.msg);
	gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "%s", err.msg);

	/* Read the datasets once; each step feeds them back (a fed node's reader
	 * does not run). */
	const char *data_refs[4] = { "x", "y", "tx", "ty" };
	struct dg_tensor *data[4];
	cr_assert_eq(dg_exec_run(g, NULL, 0, data_refs, 4, data, NULL, &err), DG_OK, "%s",
		     err.msg);
	struct dg_shape sw = { .ndim = 2, .dim = { 784, 10 } }, sb = { .ndim = 1, .dim = { 10 } };
	struct dg_tensor *w = dg_tensor_new(DG_F32, &sw, NULL), *b = dg_tensor_new(DG_F32, &sb, NULL);
	struct dg_feed f[6] = { { "x", data[0] }, { "y", data[1] }, { "tx", data[2] },
				{ "ty", data[3] }, { "w", w }, { "b", b } };
	const char *fetch[3] = { refs[0], refs[1], "loss" };
	double first = 0, last = 0;
	for (uint64_t step = 0; step < 600; step++) {
		struct dg_tensor *out[3];
		struct dg_exec_opts o = { .step = step };
		cr_assert_eq(dg_exec_run(gg, f, 6, fetch, 3, out, &o, &err), DG_OK, "%s", err.msg);
		for (int64_t i = 0; i < w->numel; i++)
			((float *)w->data)[i] -= 0.1f * ((float *)out[0]->data)[i];
		for (int64_t i = 0; i < b->numel; i++)
			((float *)b->data)[i] -= 0.1f * ((float *)out[1]->data)[i];
		if (step == 0)
			first = dg_tensor_get_f64(out[2], 0);
		last = dg_tensor_get_f64(out[2], 0);
		for (int k = 0; k < 3; k++)
			dg_tensor_free(out[k]);
	}
	double acc = 0;
	const char *facc[1] = { "acc" };
	struct dg_tensor *out[1];
	cr_assert_eq(dg_exec_run(gg, f, 6, facc, 1, out, NULL, &err), DG_OK, "%s", err.msg);
	acc = dg_tensor_get_f64(out[0], 0);
	dg_tensor_free(out[0]);
	cr_log_info("softmax regression: loss %.3f -> %.3f, test accuracy %.4f", first, last, acc);
	cr_assert_float_eq(first, log(10.0), 1e-5, "zero weights give log(10)");
	cr_assert_lt(last, 0.8);
	cr_assert_gt(acc, 0.78, "test accuracy %.4f after one epoch", acc);
	for (int k = 0; k < 4; k++)
		dg_tensor_free(data[k]);
	dg_tensor_free(w);
	dg_tensor_free(b);
	dg_autodiff_free_refs(refs, 2);
	json_decref(doc);
	dg_graph_free(gg);
	dg_graph_free(g);
}
