/* mq/log/_crecords.h -- the C codec's shared reading helpers (varints, record heads, header
 * keys, zero-copy slices), included by _crecords.c (the records codec) and _cbatches.c (whole
 * batches, the consumer's tail take). Everything here is static inline: each file has its own
 * copy, and nothing here is exported from the extension.
 */
#ifndef MQ_CRECORDS_H
#define MQ_CRECORDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- interned attribute names ---- */

/* A file's table of the attribute names it reads, each interned once into its slot. */
typedef struct {
    PyObject **slot;
    const char *name;
} MqName;

static inline int
mq_intern(const MqName *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return 0;
}

/* ---- big-endian fields ---- */

static inline int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline int32_t
be32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline int16_t
be16(const unsigned char *p)
{
    return (int16_t)(((unsigned)p[0] << 8) | p[1]);
}

/* ---- varints ---- */

static inline int64_t
unzigzag(uint64_t r)
{
    return (r & 1) ? -(int64_t)(r >> 1) - 1 : (int64_t)(r >> 1);
}

/* Reads the raw (not yet zig-zag decoded) bits of a varint of at most `maxlen` bytes (5 or 10)
 * from p[*pos, lim). A 10-byte varlong carries 70 bits: the low 64 go to *lo, the rest to *hi.
 * Returns 0, or -1 with *why set on truncation or an overlong encoding. */
static inline int
read_raw(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t lim, int maxlen,
         uint64_t *lo, unsigned *hi, const char **why)
{
    Py_ssize_t i = *pos;
    uint64_t r = 0;
    *hi = 0;
    for (int n = 0; n < maxlen; n++) {
        if (i >= lim) {
            *why = "premature end of records";
            return -1;
        }
        unsigned b = p[i++];
        if (n < 9) {
            r |= (uint64_t)(b & 0x7F) << (7 * n);
        } else {
            r |= (uint64_t)(b & 1) << 63;
            *hi = (b & 0x7F) >> 1;
        }
        if (b < 0x80) {
            *pos = i;
            *lo = r;
            return 0;
        }
    }
    *why = maxlen == 5 ? "varint longer than 5 bytes" : "varint longer than 10 bytes";
    return -1;
}

/* A 5-byte varint: at most 35 bits, so the value always fits int64 (unlike Kafka, the Python
 * reference does not restrict it to int32, so neither does this). One-byte fast path. */
static inline int
read_varint(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t lim, int64_t *out,
            const char **why)
{
    uint64_t r;
    unsigned hi;
    if (*pos < lim && p[*pos] < 0x80) {
        *out = unzigzag(p[(*pos)++]);
        return 0;
    }
    if (read_raw(p, pos, lim, 5, &r, &hi, why) < 0)
        return -1;
    *out = unzigzag(r);
    return 0;
}

/* base + zigzag(hi:lo) as a Python int, for a 70-bit varlong beyond int64 (Python ints are
 * unbounded). With half = r >> 1 of r = hi:lo, zig-zag gives half for even r, ~half for odd. */
static inline PyObject *
sum_big(int64_t base, uint64_t lo, unsigned hi)
{
    char hex[40];
    snprintf(hex, sizeof hex, "%x%016llx", hi >> 1,
             (unsigned long long)(((uint64_t)(hi & 1) << 63) | (lo >> 1)));
    PyObject *half = PyLong_FromString(hex, NULL, 16), *b = PyLong_FromLongLong(base);
    PyObject *d = NULL, *res = NULL;
    if (half != NULL && b != NULL && (d = (lo & 1) ? PyNumber_Invert(half) : Py_NewRef(half)))
        res = PyNumber_Add(b, d);
    Py_XDECREF(half);
    Py_XDECREF(b);
    Py_XDECREF(d);
    return res;
}

/* base + delta as a Python int, without C overflow (Python ints are unbounded). */
static inline PyObject *
sum_int(int64_t base, int64_t delta)
{
    if ((delta > 0 && base > INT64_MAX - delta) || (delta < 0 && base < INT64_MIN - delta)) {
        PyObject *res = NULL, *a = PyLong_FromLongLong(base), *b = PyLong_FromLongLong(delta);
        if (a != NULL && b != NULL)
            res = PyNumber_Add(a, b);
        Py_XDECREF(a);
        Py_XDECREF(b);
        return res;
    }
    return PyLong_FromLongLong(base + delta);
}

/* ---- decode_records ---- */

#define KEY_CACHE 8        /* distinct header keys remembered per call (they repeat a lot) */
#define KEY_CACHE_MAX 64   /* longest header key worth remembering */

typedef struct {
    const unsigned char *ptr[KEY_CACHE];
    Py_ssize_t len[KEY_CACHE];
    PyObject *str[KEY_CACHE];
    int n;
} KeyCache;

/* str(p[0:n], "utf-8") (strict), shared with an earlier equal key of this call if any. */
static inline PyObject *
header_key(KeyCache *c, const unsigned char *p, Py_ssize_t n)
{
    for (int i = 0; i < c->n; i++)
        if (c->len[i] == n && memcmp(c->ptr[i], p, (size_t)n) == 0)
            return Py_NewRef(c->str[i]);
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (s != NULL && c->n < KEY_CACHE && n <= KEY_CACHE_MAX) {
        c->ptr[c->n] = p;
        c->len[c->n] = n;
        c->str[c->n++] = Py_NewRef(s);
    }
    return s;
}

/* A slice mv[a:b] of the payload memoryview: a new view on the same buffer (no copy). For a
 * 1-D view of bytes, contiguous (the log's maps and batches always are), that is mv's own
 * copy (PyMemoryView_FromObject: a view of the same managed buffer) narrowed to [a, b), as
 * memoryview slicing narrows it, without the slice object and its two ints to make and
 * parse for every key and value. 0 <= a <= b <= len(mv) (the decoders check it first). */
static inline PyObject *
slice(PyObject *mv, Py_ssize_t a, Py_ssize_t b)
{
    const Py_buffer *v = PyMemoryView_Check(mv) ? PyMemoryView_GET_BUFFER(mv) : NULL;
    if (v == NULL || v->ndim != 1 || v->itemsize != 1 || v->suboffsets != NULL ||
            (v->strides != NULL && v->strides[0] != 1) || v->shape == NULL)
        return PySequence_GetSlice(mv, a, b);
    PyObject *s = PyMemoryView_FromObject(mv);
    if (s == NULL)
        return NULL;
    Py_buffer *n = PyMemoryView_GET_BUFFER(s);
    n->buf = (char *)n->buf + a;
    n->len = n->shape[0] = b - a;
    return s;
}

/* The head of the record at p[*pos]: its length (which must fit p[*pos, end); *rec_end is where
 * the record ends), the attributes (unused), the timestamp delta, a varlong (*tsd, or 0 when
 * its 70 raw bits *tlo:*thi pass int64: *thi != 0) and the offset delta *od. Returns 0, or -1
 * with *why set (formatted into msg if need be). Shared by decode_records and decode_columns. */
static inline int
record_head(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *rec_end,
            int64_t *length, int64_t *tsd, uint64_t *tlo, unsigned *thi, int64_t *od,
            char *msg, size_t msg_size, const char **why)
{
    if (read_varint(p, pos, end, length, why) < 0)
        return -1;
    if (*length < 6 || *length > end - *pos) {
        snprintf(msg, msg_size, "record length %lld does not fit the batch", (long long)*length);
        *why = msg;
        return -1;
    }
    const Py_ssize_t lim = *rec_end = *pos + (Py_ssize_t)*length;
    *pos += 1;                                           /* attributes (unused) */
    if (*pos < lim && p[*pos] < 0x80) {                  /* timestamp delta: a varlong */
        *tlo = p[(*pos)++];
        *thi = 0;
    } else if (read_raw(p, pos, lim, 10, tlo, thi, why) < 0) {
        return -1;
    }
    *tsd = *thi == 0 ? unzigzag(*tlo) : 0;
    return read_varint(p, pos, lim, od, why);
}

/* The reason for the pending UnicodeDecodeError of a header key, formatted into msg: 0 with
 * *why = msg, or -1 with a Python error set if even that fails. */
static inline int
decode_error_reason(char *msg, size_t msg_size, const char **why)
{
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    PyObject *s = exc != NULL ? PyObject_Str(exc) : NULL;
    const char *txt = s != NULL ? PyUnicode_AsUTF8(s) : NULL;
    if (txt != NULL)
        snprintf(msg, msg_size, "%s", txt);
    Py_XDECREF(type); Py_XDECREF(exc); Py_XDECREF(tb); Py_XDECREF(s);
    if (txt == NULL)
        return -1;
    *why = msg;
    return 0;
}

/* Pins the buffer of the payload memoryview mv into *view (it cannot be released while it is
 * read) after checking it is 1-D of format 'B'. Returns 0, or -1 with TypeError set. */
static inline int
get_payload(PyObject *mv, Py_buffer *view)
{
    if (PyObject_GetBuffer(mv, view, PyBUF_SIMPLE) < 0)
        return -1;
    const Py_buffer *mvb = PyMemoryView_GET_BUFFER(mv);
    if (mvb->ndim != 1 || mvb->itemsize != 1 || (mvb->format && strcmp(mvb->format, "B"))) {
        PyErr_SetString(PyExc_TypeError, "payload must be a 1-D memoryview of format 'B'");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* What a public consumer record (mq.Record, a named tuple) adds to a decoded record: its
 * topic, partition and timestamp type; and the offsets it may have, [lo, hi). */
typedef struct {
    PyTypeObject *type;
    PyObject *topic, *partition, *timestamp_type;
    int64_t lo, hi;
} PublicRecords;

/* _crecords.c: decodes the `count` records of one records section, mv's bytes [start, end),
 * appending each to `out` (at < 0) or setting out[at + i] (a list of that many NULL slots).
 * pub == NULL: Record objects, or record_type(offset, timestamp, key, value, headers); else
 * public records, only those of offsets in [pub->lo, pub->hi). Returns 0, or -1 with
 * ValueError(reason) for malformed input or another error set. */
int mq_decode_section(PyObject *out, Py_ssize_t at, PyObject *mv, const unsigned char *p,
                      Py_ssize_t start, Py_ssize_t end, int64_t base_offset, int64_t base_ts,
                      int log_append, int64_t max_ts, Py_ssize_t count, PyObject *record_type,
                      const PublicRecords *pub);

/* _cbatches.c: the module functions take_batches, check_batch and tail_take, and the check
 * append_plain shares. */
uint32_t mq_crc32c(const unsigned char *p, size_t n);      /* _cbatches.c */
PyObject *mq_take_batches(PyObject *module, PyObject *args);
extern const char mq_take_batches_doc[];
/* A client's batch h[0:n] checked (check_batch's doc) and, if it passes, stamped with
 * base_offset and leader_epoch: 0 with *facts filled, or -1 with h untouched. */
typedef struct {
    int32_t count, last_delta, base_seq;
    int64_t max_ts, pid;
    int16_t epoch, attrs;
} BatchFacts;
int mq_check_stamp(unsigned char *h, Py_ssize_t n, int64_t base_offset, int32_t leader_epoch,
                   int64_t now_ms, Py_ssize_t max_bytes, int64_t after_max, BatchFacts *facts);
PyObject *mq_check_batch(PyObject *module, PyObject *args);
extern const char mq_check_batch_doc[];
PyObject *mq_tail_take(PyObject *module, PyObject *args);
/* _cappend.c: the module function append_plain. */
PyObject *mq_append_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char mq_append_plain_doc[];
PyObject *mq_tail_wait_take(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char mq_tail_wait_take_doc[];
PyObject *mq_publish_slot(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *mq_produce_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char mq_produce_plain_doc[];
/* _csend.c: the producer's send() into an open batch. */
PyObject *mq_send_open(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char mq_send_open_doc[];
/* _crecords.c, for _csend.c: a RecordAccumulator's size (-1: `o` is none) and its add of a
 * record of bytes (or None) with no headers, timestamped now: its future. */
Py_ssize_t mq_acc_size(PyObject *o);
PyObject *mq_acc_add(PyObject *o, PyObject *key, PyObject *value);
extern const char mq_publish_slot_doc[];
extern const char mq_tail_take_doc[];

#endif
