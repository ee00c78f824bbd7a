/* mq.log._crecords -- optional C codec for the records section of a Kafka RecordBatch v2.
 *
 * decode_records() mirrors the pure-Python reference loop of RecordBatch.records() in
 * mq/log/batch.py (which stays authoritative and runs when this module is not built, or when
 * MQ_PURE_PYTHON=1; mq/log/native.py loads this module): the same input is accepted, the same
 * values come out, the same input is rejected. Keys, values and header values are zero-copy
 * memoryview slices of the payload. Malformed input raises ValueError whose message is the
 * reason; batch.py turns it into CorruptRecordError. encode_record() produces one record's
 * bytes; RecordAccumulator, the records of a batch being built (BatchBuilder's, and through
 * add()/extend() the producer's whole per-record step, future included), mirrors
 * mq.log.builder.RecordEncoder and mq.client.accumulator.RecordAccumulator byte for byte.
 *
 * Bounds invariant: a byte is only read at an index i with i < lim, where lim is len(payload)
 * for a record's length varint and the record's end (<= len(payload)) for everything inside
 * it; every length is compared with the bytes left before a slice is taken or pos advances.
 * Reading a field across its record's end is rejected at once; the Python loop rejects the
 * same input later (the record then never consumes exactly its declared length).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ---- Record: what decode_records returns (same attributes as batch.BatchRecord) ---- */

/* All five fields are owned references. `headers` may be NULL, meaning an empty list not
 * created yet: most records have no headers, and one GC-tracked list fewer per record is
 * ~15% of the decode time. The getter creates (and keeps) the list on first access. */
typedef struct {
    PyObject_HEAD
    PyObject *offset, *timestamp, *key, *value, *headers;
} RecordObject;

static PyTypeObject RecordType;

static PyMemberDef Record_members[] = {
    {"offset", T_OBJECT_EX, offsetof(RecordObject, offset), 0, "absolute offset (int)"},
    {"timestamp", T_OBJECT_EX, offsetof(RecordObject, timestamp), 0, "milliseconds (int)"},
    {"key", T_OBJECT_EX, offsetof(RecordObject, key), 0, "memoryview or None"},
    {"value", T_OBJECT_EX, offsetof(RecordObject, value), 0, "memoryview or None"},
    {NULL}
};

static PyObject *
Record_get_headers(RecordObject *r, void *closure)
{
    (void)closure;
    if (r->headers == NULL && (r->headers = PyList_New(0)) == NULL)
        return NULL;
    return Py_NewRef(r->headers);
}

static int
Record_set_headers(RecordObject *r, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete headers");
        return -1;
    }
    Py_XSETREF(r->headers, Py_NewRef(value));
    return 0;
}

static PyGetSetDef Record_getset[] = {
    {"headers", (getter)Record_get_headers, (setter)Record_set_headers,
     "list of (str, memoryview | None)", NULL},
    {NULL}
};

/* Steals the five references (headers may be NULL); returns NULL (dropping them) on failure. */
static PyObject *
record_make(PyObject *offset, PyObject *ts, PyObject *key, PyObject *value, PyObject *headers)
{
    RecordObject *r = PyObject_GC_New(RecordObject, &RecordType);
    if (r == NULL) {
        Py_DECREF(offset); Py_DECREF(ts); Py_DECREF(key); Py_DECREF(value); Py_XDECREF(headers);
        return NULL;
    }
    r->offset = offset; r->timestamp = ts; r->key = key; r->value = value; r->headers = headers;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static PyObject *
Record_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)type;
    static char *kwlist[] = {"offset", "timestamp", "key", "value", "headers", NULL};
    PyObject *f[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:Record", kwlist,
                                     &f[0], &f[1], &f[2], &f[3], &f[4]))
        return NULL;
    for (int i = 0; i < 5; i++)
        Py_INCREF(f[i]);
    return record_make(f[0], f[1], f[2], f[3], f[4]);
}

static int
Record_traverse(RecordObject *r, visitproc visit, void *arg)
{
    Py_VISIT(r->offset); Py_VISIT(r->timestamp); Py_VISIT(r->key); Py_VISIT(r->value);
    Py_VISIT(r->headers);
    return 0;
}

static int
Record_clear(RecordObject *r)
{
    Py_CLEAR(r->offset); Py_CLEAR(r->timestamp); Py_CLEAR(r->key); Py_CLEAR(r->value);
    Py_CLEAR(r->headers);
    return 0;
}

static void
Record_dealloc(RecordObject *r)
{
    PyObject_GC_UnTrack(r);
    Record_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* `k, v = item` as Python unpacks it (any iterable of exactly two); new references. */
static int
unpack2(PyObject *item, PyObject **k, PyObject **v)
{
    PyObject *seq = PySequence_Fast(item, "a header must be a (key, value) pair");
    if (seq == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(seq) != 2) {
        PyErr_Format(PyExc_ValueError, "a header must be a (key, value) pair, not %zd items",
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return -1;
    }
    *k = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 0));
    *v = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 1));
    Py_DECREF(seq);
    return 0;
}

/* bytes(x), or None for None: what the Python BatchRecord shows and compares. */
static PyObject *
as_bytes(PyObject *x)
{
    if (x == Py_None)
        return Py_NewRef(Py_None);
    return PyBytes_FromObject(x);
}

static PyObject *
headers_as_bytes(PyObject *headers)       /* [(k, bytes(v) | None) for k, v in headers] */
{
    PyObject *seq = PySequence_Fast(headers, "headers must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *k, *v;
        if (unpack2(PySequence_Fast_GET_ITEM(seq, i), &k, &v) < 0) {
            Py_CLEAR(out);
            break;
        }
        PyObject *vb = as_bytes(v);
        PyObject *t = vb == NULL ? NULL : PyTuple_Pack(2, k, vb);
        Py_DECREF(k);
        Py_DECREF(v);
        Py_XDECREF(vb);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    Py_DECREF(seq);
    return out;
}

/* (offset, timestamp, bytes(key), bytes(value), headers-as-bytes) of any record-like object;
 * NULL with AttributeError when `o` lacks an attribute. */
static PyObject *
record_key(PyObject *o)
{
    static const char *names[] = {"offset", "timestamp", "key", "value", "headers"};
    PyObject *t = PyTuple_New(5);
    for (int i = 0; t != NULL && i < 5; i++) {
        PyObject *a = PyObject_GetAttrString(o, names[i]);
        PyObject *c = a;
        if (a != NULL && i >= 2) {
            c = i == 4 ? headers_as_bytes(a) : as_bytes(a);
            Py_DECREF(a);
        }
        if (c == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, c);
    }
    return t;
}

static PyObject *
Record_repr(RecordObject *r)
{
    PyObject *t = record_key((PyObject *)r);
    if (t == NULL)
        return NULL;
    PyObject *s = PyUnicode_FromFormat("BatchRecord(offset=%S, timestamp=%S, key=%R, value=%R, "
                                       "headers=%R)", PyTuple_GET_ITEM(t, 0),
                                       PyTuple_GET_ITEM(t, 1), PyTuple_GET_ITEM(t, 2),
                                       PyTuple_GET_ITEM(t, 3), PyTuple_GET_ITEM(t, 4));
    Py_DECREF(t);
    return s;
}

/* Equal to any object with the same five attributes when offsets and timestamps are equal and
 * keys, values and header values hold the same bytes (so batch.BatchRecord == Record works:
 * its __eq__ returns NotImplemented and Python asks this one). Not the hot path: a copy is ok. */
static PyObject *
Record_richcompare(PyObject *self, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *a = record_key(self);
    if (a == NULL)
        return NULL;
    PyObject *b = record_key(other);
    if (b == NULL) {
        Py_DECREF(a);
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *res = PyObject_RichCompare(a, b, op);
    Py_DECREF(a);
    Py_DECREF(b);
    return res;
}

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mq.log._crecords.Record",
    .tp_doc = "One decoded record (C twin of mq.log.batch.BatchRecord).",
    .tp_basicsize = sizeof(RecordObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Record_new,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_traverse = (traverseproc)Record_traverse,
    .tp_clear = (inquiry)Record_clear,
    .tp_repr = (reprfunc)Record_repr,
    .tp_richcompare = Record_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_members = Record_members,
    .tp_getset = Record_getset,
};

#include "_crecords.h"

PyDoc_STRVAR(decode_records_doc,
"decode_records(payload, base_offset, base_timestamp, log_append_time, max_timestamp, count,\n"
"               record_type=None) -> list\n\n"
"Decode `count` records from the uncompressed records section `payload` (a 1-D memoryview of\n"
"format 'B'). Records are Record objects, or record_type(offset, timestamp, key, value,\n"
"headers) when a record_type is given. Raises ValueError(reason) on malformed input.");

/* Error exits of decode_records: a corrupt-input reason (formatted into msg) or a Python error
 * already set (MemoryError and the like). Both drop whatever the current record holds. */
#define CORRUPT(...) \
    do { snprintf(msg, sizeof msg, __VA_ARGS__); why = msg; goto corrupt; } while (0)
#define VARINT(lim, out) \
    do { if (read_varint(p, &pos, lim, out, &why) < 0) goto corrupt; } while (0)
/* A length varint (-1: None), then that many bytes of the record as a zero-copy slice. */
#define BYTES(dst, what) \
    do { \
        int64_t n_; \
        VARINT(rec_end, &n_); \
        if (n_ < -1 || n_ > rec_end - pos) \
            CORRUPT("invalid " what " length %lld", (long long)n_); \
        if (n_ == -1) \
            dst = Py_NewRef(Py_None); \
        else if ((dst = slice(mv, pos, pos + (Py_ssize_t)n_)) == NULL) \
            goto fail; \
        else \
            pos += (Py_ssize_t)n_; \
    } while (0)

/* A public record: pub->type(topic, partition, offset, timestamp, timestamp_type, key, value,
 * headers), built as tuple.__new__ builds a named tuple's instances. Steals the five record
 * fields (headers NULL: a new empty list). */
static PyObject *
public_make(const PublicRecords *pub, PyObject *offset, PyObject *ts, PyObject *key,
            PyObject *value, PyObject *headers)
{
    PyObject *rec = NULL;
    if (headers == NULL)
        headers = PyList_New(0);
    if (headers != NULL)
        rec = pub->type->tp_alloc(pub->type, 8);
    if (rec == NULL) {
        Py_DECREF(offset); Py_DECREF(ts); Py_DECREF(key); Py_DECREF(value); Py_XDECREF(headers);
        return NULL;
    }
    PyObject *fields[8] = {Py_NewRef(pub->topic), Py_NewRef(pub->partition), offset, ts,
                           Py_NewRef(pub->timestamp_type), key, value, headers};
    for (int f = 0; f < 8; f++)
        PyTuple_SET_ITEM(rec, f, fields[f]);
    return rec;
}

int
mq_decode_section(PyObject *out, Py_ssize_t at, PyObject *mv, const unsigned char *p,
                  Py_ssize_t start, Py_ssize_t end, int64_t base_offset, int64_t base_ts,
                  int log_append, int64_t max_ts, Py_ssize_t count, PyObject *record_type,
                  const PublicRecords *pub)
{
    Py_ssize_t pos = start, rec_start = start, i = 0;
    const char *why = NULL;
    char msg[160];
    int rc = -1;
    KeyCache cache = {.n = 0};
    PyObject *max_ts_obj = NULL;
    /* the record being built: owned here until handed to its record object */
    PyObject *key = NULL, *value = NULL, *headers = NULL, *hkey = NULL, *hval = NULL;
    /* A batch allocates thousands of GC-tracked objects (records, memoryviews, lists), which
     * would trigger a young collection every 700 of them and half the time goes there. With
     * no Python code running in the loop (no record_type callback), the collector is paused
     * and catches up once, at the next allocation after it is resumed. */
    int gc_paused = (pub != NULL || record_type == Py_None) && PyGC_Disable();

    if (count < 0 || count > end - start) {   /* every record takes at least 7 bytes */
        PyErr_Format(PyExc_ValueError, "record count %zd exceeds the %zd bytes of records",
                     count, end - start);
        goto done;
    }
    if ((max_ts_obj = PyLong_FromLongLong(max_ts)) == NULL)
        goto done;

    for (i = 0; i < count; i++) {
        int64_t length, od, hcount, tsd;
        uint64_t tlo;
        unsigned thi;
        rec_start = pos;
        Py_ssize_t rec_end;                              /* <= end; bounds all below */
        if (record_head(p, &pos, end, &rec_end, &length, &tsd, &tlo, &thi, &od, msg,
                        sizeof msg, &why) < 0)
            goto corrupt;
        BYTES(key, "key");
        BYTES(value, "value");
        VARINT(rec_end, &hcount);
        if (hcount < 0 || hcount > rec_end - pos)
            CORRUPT("invalid header count %lld", (long long)hcount);
        if (hcount > 0 && (headers = PyList_New((Py_ssize_t)hcount)) == NULL)
            goto fail;                           /* no headers: list created lazily, if asked */
        for (Py_ssize_t h = 0; h < (Py_ssize_t)hcount; h++) {
            int64_t hklen;
            VARINT(rec_end, &hklen);
            if (hklen < 0 || hklen > rec_end - pos)
                CORRUPT("invalid header key length %lld", (long long)hklen);
            if ((hkey = header_key(&cache, p + pos, (Py_ssize_t)hklen)) == NULL) {
                /* UnicodeDecodeError: reported like the other reasons, with the place */
                if (decode_error_reason(msg, sizeof msg, &why) < 0)
                    goto fail;
                goto corrupt;
            }
            pos += (Py_ssize_t)hklen;
            BYTES(hval, "header value");
            PyObject *pair = PyTuple_New(2);
            if (pair == NULL)
                goto fail;
            PyTuple_SET_ITEM(pair, 0, hkey);                 /* steals both */
            PyTuple_SET_ITEM(pair, 1, hval);
            hkey = hval = NULL;
            PyList_SET_ITEM(headers, h, pair);
        }
        if (pos != rec_end)                              /* pos < rec_end: reads are bounded */
            CORRUPT("record consumed %lld bytes but declared %lld",
                    (long long)(length - (rec_end - pos)), (long long)length);

        if (pub != NULL) {
            int64_t off;           /* one past int64 either way is outside [lo, hi) as well */
            if (__builtin_add_overflow(base_offset, od, &off) || off < pub->lo ||
                    off >= pub->hi) {
                Py_CLEAR(key); Py_CLEAR(value); Py_CLEAR(headers);
                continue;
            }
        }
        PyObject *offset = sum_int(base_offset, od), *ts, *rec;
        if (log_append)
            ts = Py_NewRef(max_ts_obj);
        else
            ts = thi == 0 ? sum_int(base_ts, tsd) : sum_big(base_ts, tlo, thi);
        if (offset == NULL || ts == NULL) {
            Py_XDECREF(offset);
            Py_XDECREF(ts);
            goto fail;
        }
        if (pub != NULL) {
            rec = public_make(pub, offset, ts, key, value, headers);  /* steals all five */
        } else if (record_type == Py_None) {
            rec = record_make(offset, ts, key, value, headers);       /* steals all five */
        } else if (headers == NULL && (headers = PyList_New(0)) == NULL) {
            rec = NULL;
            Py_DECREF(offset); Py_DECREF(ts); Py_DECREF(key); Py_DECREF(value);
        } else {
            PyObject *fields[5] = {offset, ts, key, value, headers};
            rec = PyObject_Vectorcall(record_type, fields, 5, NULL);
            for (int f = 0; f < 5; f++)
                Py_DECREF(fields[f]);
        }
        key = value = headers = NULL;                            /* handed over or dropped */
        if (rec == NULL)
            goto fail;
        if (at >= 0) {
            PyList_SET_ITEM(out, at + i, rec);
        } else {
            int err = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (err < 0)
                goto fail;
        }
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left after %zd records (incorrect declared "
                     "batch size)", end - pos, count);
        goto fail;
    }
    rc = 0;
    goto done;

corrupt:
    PyErr_Format(PyExc_ValueError, "malformed record %zd of %zd at records byte %zd: %s",
                 i, count, rec_start - start, why);
fail:
done:
    if (gc_paused)
        PyGC_Enable();
    Py_XDECREF(key); Py_XDECREF(value); Py_XDECREF(headers); Py_XDECREF(hkey);
    Py_XDECREF(hval);
    for (int k = 0; k < cache.n; k++)
        Py_DECREF(cache.str[k]);
    Py_XDECREF(max_ts_obj);
    return rc;
}

static PyObject *
decode_records(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *mv, *record_type = Py_None;
    long long base_offset, base_ts, max_ts;
    int log_append;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!LLpLn|O:decode_records", &PyMemoryView_Type, &mv,
                          &base_offset, &base_ts, &log_append, &max_ts, &count, &record_type))
        return NULL;
    if (record_type == (PyObject *)&RecordType)
        record_type = Py_None;

    Py_buffer view;
    if (get_payload(mv, &view) < 0)
        return NULL;
    PyObject *out = NULL;
    if (count < 0 || count > view.len) {   /* every record takes at least 7 bytes */
        PyErr_Format(PyExc_ValueError, "record count %zd exceeds the %zd bytes of records",
                     count, view.len);
    } else if ((out = PyList_New(count)) != NULL &&   /* NULL slots until filled */
               mq_decode_section(out, 0, mv, (const unsigned char *)view.buf, 0, view.len,
                                 base_offset, base_ts, log_append, max_ts, count, record_type,
                                 NULL) < 0) {
        Py_CLEAR(out);
    }
    PyBuffer_Release(&view);
    return out;
}

/* ---- decode_columns: the same records, as column buffers (no object per record) ---- */

PyDoc_STRVAR(decode_columns_doc,
"decode_columns(payload, base_offset, base_timestamp, log_append_time, max_timestamp, count,\n"
"               lo, hi, columns) -> int\n\n"
"Decode `count` records as decode_records does (the same input is accepted and rejected),\n"
"but append those whose offset is in [lo, hi) to the eight bytearrays of the list `columns`\n"
"instead of building objects: offsets (int64), timestamps (int64, ms), key ends (int32: the\n"
"length of the key data column after each key), key data, key validity (one byte each: 1,\n"
"or 0 for a null key), then the same three for values; native byte order. This is the\n"
"layout of Arrow's int64 and binary columns, which Spark's data source reads take. Returns\n"
"how many records were appended. Raises ValueError(reason) on malformed input, OverflowError\n"
"when an offset or timestamp does not fit int64 or a data column would pass 2**31 - 1\n"
"bytes; the columns are then left as they were.");

/* A length varint (-1: null) and the bytes after it: *at, *len (len -1 for null). */
#define FIELD(at, len, what) \
    do { \
        int64_t n_; \
        VARINT(rec_end, &n_); \
        if (n_ < -1 || n_ > rec_end - pos) \
            CORRUPT("invalid " what " length %lld", (long long)n_); \
        *(at) = pos; \
        *(len) = (Py_ssize_t)n_; \
        if (n_ > 0) \
            pos += (Py_ssize_t)n_; \
    } while (0)

enum { C_OFF, C_TS, C_KEND, C_KDATA, C_KVALID, C_VEND, C_VDATA, C_VVALID, C_COLUMNS };

static PyObject *
decode_columns(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *mv, *cols;
    long long base_offset, base_ts, max_ts, lo, hi;
    int log_append;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!LLpLnLLO!:decode_columns", &PyMemoryView_Type, &mv,
                          &base_offset, &base_ts, &log_append, &max_ts, &count, &lo, &hi,
                          &PyList_Type, &cols))
        return NULL;
    if (PyList_GET_SIZE(cols) != C_COLUMNS) {
        PyErr_SetString(PyExc_TypeError, "columns must be a list of 8 bytearrays");
        return NULL;
    }
    PyObject *ba[C_COLUMNS];
    for (int c = 0; c < C_COLUMNS; c++) {
        ba[c] = PyList_GET_ITEM(cols, c);
        if (!PyByteArray_Check(ba[c])) {
            PyErr_SetString(PyExc_TypeError, "columns must be a list of 8 bytearrays");
            return NULL;
        }
    }
    Py_buffer view;
    if (get_payload(mv, &view) < 0)
        return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0, rec_start = 0, i = 0, n = 0;
    const char *why = NULL;
    char msg[160];
    Py_ssize_t old[C_COLUMNS], used[C_COLUMNS];
    int grown = 0;
    PyObject *result = NULL;

    if (count < 0 || count > end) {        /* every record takes at least 7 bytes */
        PyErr_Format(PyExc_ValueError, "record count %zd exceeds the %zd bytes of records",
                     count, end);
        goto fail;
    }
    /* Room for every record first (the data columns: at most the payload), trimmed at the
     * end; a bytearray overallocates as it grows, so appending batch after batch is linear. */
    const Py_ssize_t room[C_COLUMNS] = {8 * count, 8 * count, 4 * count, end, count,
                                        4 * count, end, count};
    for (int c = 0; c < C_COLUMNS; c++) {
        old[c] = PyByteArray_GET_SIZE(ba[c]);
        used[c] = 0;
    }
    for (; grown < C_COLUMNS; grown++)
        if (PyByteArray_Resize(ba[grown], old[grown] + room[grown]) < 0)
            goto fail;
    char *w[C_COLUMNS];
    for (int c = 0; c < C_COLUMNS; c++)
        w[c] = PyByteArray_AS_STRING(ba[c]) + old[c];

    for (i = 0; i < count; i++) {
        int64_t length, od, hcount, tsd;
        uint64_t tlo;
        unsigned thi;
        Py_ssize_t kat, klen, vat, vlen;
        rec_start = pos;
        Py_ssize_t rec_end;                              /* <= end; bounds all below */
        if (record_head(p, &pos, end, &rec_end, &length, &tsd, &tlo, &thi, &od, msg,
                        sizeof msg, &why) < 0)
            goto corrupt;
        FIELD(&kat, &klen, "key");
        FIELD(&vat, &vlen, "value");
        VARINT(rec_end, &hcount);
        if (hcount < 0 || hcount > rec_end - pos)
            CORRUPT("invalid header count %lld", (long long)hcount);
        for (int64_t h = 0; h < hcount; h++) {
            int64_t hklen;
            Py_ssize_t hvat, hvlen;
            VARINT(rec_end, &hklen);
            if (hklen < 0 || hklen > rec_end - pos)
                CORRUPT("invalid header key length %lld", (long long)hklen);
            /* Strict UTF-8, as decode_records checks it (headers are rare: a decode is ok) */
            PyObject *s = PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)hklen, NULL);
            if (s == NULL) {
                if (decode_error_reason(msg, sizeof msg, &why) < 0)
                    goto fail;
                goto corrupt;
            }
            Py_DECREF(s);
            pos += (Py_ssize_t)hklen;
            FIELD(&hvat, &hvlen, "header value");
        }
        if (pos != rec_end)                              /* pos < rec_end: reads are bounded */
            CORRUPT("record consumed %lld bytes but declared %lld",
                    (long long)(length - (rec_end - pos)), (long long)length);

        int64_t offset, ts;
        if ((od > 0 && base_offset > INT64_MAX - od) || (od < 0 && base_offset < INT64_MIN - od)) {
            PyErr_SetString(PyExc_OverflowError, "record offset does not fit int64");
            goto fail;
        }
        offset = base_offset + od;
        if (offset < lo || offset >= hi)
            continue;
        if (log_append) {
            ts = max_ts;
        } else if (thi != 0 || (tsd > 0 && base_ts > INT64_MAX - tsd) ||
                   (tsd < 0 && base_ts < INT64_MIN - tsd)) {
            PyErr_SetString(PyExc_OverflowError, "record timestamp does not fit int64");
            goto fail;
        } else {
            ts = base_ts + tsd;
        }
        memcpy(w[C_OFF] + 8 * n, &offset, 8);
        memcpy(w[C_TS] + 8 * n, &ts, 8);
        const Py_ssize_t at[2] = {kat, vat}, len[2] = {klen, vlen};
        const int data[2] = {C_KDATA, C_VDATA};
        for (int f = 0; f < 2; f++) {
            const int d = data[f];
            if (len[f] > 0) {
                memcpy(w[d] + used[d], p + at[f], (size_t)len[f]);
                used[d] += len[f];
            }
            if (old[d] + used[d] > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a data column would pass 2**31 - 1 bytes");
                goto fail;
            }
            const int32_t e = (int32_t)(old[d] + used[d]);
            memcpy(w[d - 1] + 4 * n, &e, 4);              /* the ends column precedes data */
            w[d + 1][n] = len[f] >= 0;                    /* validity follows it */
        }
        n++;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left after %zd records (incorrect declared "
                     "batch size)", end - pos, count);
        goto fail;
    }
    used[C_OFF] = used[C_TS] = 8 * n;
    used[C_KEND] = used[C_VEND] = 4 * n;
    used[C_KVALID] = used[C_VVALID] = n;
    for (int c = 0; c < C_COLUMNS; c++)
        if (PyByteArray_Resize(ba[c], old[c] + used[c]) < 0)
            goto fail;
    result = PyLong_FromSsize_t(n);
    goto done;

corrupt:
    PyErr_Format(PyExc_ValueError, "malformed record %zd of %zd at records byte %zd: %s",
                 i, count, rec_start, why);
fail:
    for (int c = 0; c < grown; c++) {             /* leave the columns as they were */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        if (PyByteArray_Resize(ba[c], old[c]) < 0)
            PyErr_Clear();
        PyErr_Restore(type, exc, tb);
    }
done:
    PyBuffer_Release(&view);
    return result;
}

#undef FIELD

/* ---- encode_record: one record, for BatchBuilder.append ---- */

static uint64_t
zigzag(int64_t v)
{
    return ((uint64_t)v << 1) ^ (v < 0 ? UINT64_MAX : 0);
}

/* zigzag of a Python int as varints.encode_varint_uncached computes it,
 * ((v << 1) ^ (v >> 63)) & (2**64 - 1), so that ints beyond int64 wrap the same way. */
static int
zigzag_obj(PyObject *v, uint64_t *out)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (!overflow) {
        *out = zigzag(x);
        return 0;
    }
    PyObject *s63 = PyLong_FromLong(63), *top = s63 ? PyNumber_Rshift(v, s63) : NULL;
    *out = PyLong_AsUnsignedLongLongMask(v) << 1;
    if (top != NULL)
        *out ^= PyLong_AsUnsignedLongLongMask(top);
    Py_XDECREF(s63);
    Py_XDECREF(top);
    return top == NULL || PyErr_Occurred() ? -1 : 0;
}

/* Output of encode_record. A size pass (q == NULL) only counts bytes into n; the write pass
 * writes below `end`. Both walk the same objects; should a buffer grow in between (acquiring
 * a buffer can run Python code), the write pass fails instead of overflowing. */
typedef struct {
    unsigned char *q, *end;
    Py_ssize_t n;
} Out;

static int
put(Out *o, uint64_t zz, const void *data, Py_ssize_t len)   /* a varint, then len bytes */
{
    unsigned char tmp[10], *t = tmp;
    while (zz >= 0x80) {
        *t++ = (unsigned char)(zz | 0x80);
        zz >>= 7;
    }
    *t++ = (unsigned char)zz;
    Py_ssize_t need = (t - tmp) + len;
    o->n += need;
    if (o->q == NULL)
        return 0;
    if (need > o->end - o->q) {
        PyErr_SetString(PyExc_RuntimeError, "record changed while being encoded");
        return -1;
    }
    memcpy(o->q, tmp, (size_t)(t - tmp));
    if (len > 0)
        memcpy(o->q + (t - tmp), data, (size_t)len);
    o->q += need;
    return 0;
}

/* A key, value or header value (bytes-like; None -> length -1), or a header key (str -> its
 * UTF-8 bytes, else bytes-like), with its length varint. */
static int
put_field(Out *o, PyObject *f, int is_header_key)
{
    if (f == Py_None && !is_header_key)
        return put(o, 1, NULL, 0);
    if (PyBytes_CheckExact(f))                       /* the common case, no buffer round */
        return put(o, zigzag(PyBytes_GET_SIZE(f)), PyBytes_AS_STRING(f), PyBytes_GET_SIZE(f));
    if (is_header_key && PyUnicode_Check(f)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(f, &n);    /* strict: surrogates raise */
        return s == NULL ? -1 : put(o, zigzag(n), s, n);
    }
    Py_buffer b;
    if (PyObject_GetBuffer(f, &b, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = put(o, zigzag(b.len), b.buf, b.len);
    PyBuffer_Release(&b);
    return rc;
}

/* Everything after the length varint; `headers` is a list. */
static int
put_body(Out *o, uint64_t ts, uint64_t od, PyObject *key, PyObject *value, PyObject *headers)
{
    if (put(o, 0, NULL, 0) < 0 || put(o, ts, NULL, 0) < 0 || put(o, od, NULL, 0) < 0 ||
        put_field(o, key, 0) < 0 || put_field(o, value, 0) < 0 ||
        put(o, zigzag(PyList_GET_SIZE(headers)), NULL, 0) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *hk, *hv;
        if (unpack2(PyList_GET_ITEM(headers, i), &hk, &hv) < 0)
            return -1;
        int rc = put_field(o, hk, 1) < 0 || put_field(o, hv, 0) < 0 ? -1 : 0;
        Py_DECREF(hk);
        Py_DECREF(hv);
        if (rc < 0)
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(encode_record_doc,
"encode_record(timestamp_delta, offset_delta, key, value, headers) -> bytes\n\n"
"One record, length varint first, byte for byte as the pure-Python BatchBuilder.append\n"
"encodes it. key and value are bytes-like or None; headers an iterable of\n"
"(str | bytes-like, bytes-like | None) pairs, or None.");

static PyObject *
encode_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    uint64_t ts, od;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "encode_record expected 5 arguments, got %zd", nargs);
        return NULL;
    }
    if (zigzag_obj(args[0], &ts) < 0 || zigzag_obj(args[1], &od) < 0)
        return NULL;
    /* a list snapshot of the headers, for both passes */
    PyObject *headers = args[4] == Py_None ? PyList_New(0) : PySequence_List(args[4]);
    if (headers == NULL)
        return NULL;
    Out size = {NULL, NULL, 0}, w = {NULL, NULL, 0};
    PyObject *out = NULL;
    if (put_body(&size, ts, od, args[2], args[3], headers) == 0 &&
        put(&w, zigzag(size.n), NULL, 0) == 0 &&                 /* w.n: the length varint */
        (out = PyBytes_FromStringAndSize(NULL, w.n + size.n)) != NULL) {
        w.q = (unsigned char *)PyBytes_AS_STRING(out);
        w.end = w.q + PyBytes_GET_SIZE(out);
        if (put(&w, zigzag(size.n), NULL, 0) < 0 ||
            put_body(&w, ts, od, args[2], args[3], headers) < 0 || w.q != w.end) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "record changed while being encoded");
            Py_CLEAR(out);
        }
    }
    Py_DECREF(headers);
    return out;
}

/* ---- RecordAccumulator: the records section of one batch being built ---- */

/* BatchBuilder's record state in C (accumulator.RecordAccumulator is the reference it mirrors):
 * records are encoded straight into one growing buffer, so a record costs one C call and no
 * Python object but its future. RecordFuture is the base of the producer's per-record future
 * (owner batch, offset delta, timestamp); add() allocates one without running Python code. */

#define RECORD_BATCH_OVERHEAD 61      /* records.RECORD_BATCH_OVERHEAD */

typedef struct {
    PyObject_HEAD
    PyObject *batch;
    long long delta, ts;
} FutureObject;

static PyMemberDef Future_members[] = {
    {"_batch", T_OBJECT, offsetof(FutureObject, batch), READONLY, "the record's batch"},
    {"_delta", T_LONGLONG, offsetof(FutureObject, delta), READONLY, "its offset delta"},
    {"_ts", T_LONGLONG, offsetof(FutureObject, ts), READONLY, "its timestamp (ms)"},
    {NULL}
};

static int
Future_init(FutureObject *f, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"batch", "delta", "timestamp_ms", NULL};
    PyObject *batch;
    long long delta, ts;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLL", kwlist, &batch, &delta, &ts))
        return -1;
    Py_XSETREF(f->batch, Py_NewRef(batch));
    f->delta = delta;
    f->ts = ts;
    return 0;
}

static int
Future_traverse(FutureObject *f, visitproc visit, void *arg)
{
    Py_VISIT(f->batch);        /* a heap subtype's own type: subtype_traverse visits it */
    return 0;
}

static int
Future_clear(FutureObject *f)
{
    Py_CLEAR(f->batch);
    return 0;
}

static void
Future_dealloc(FutureObject *f)
{
    PyObject_GC_UnTrack(f);    /* a heap subtype's reference to its type: subtype_dealloc */
    Future_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject FutureType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mq.log._crecords.RecordFuture",
    .tp_doc = "Base of a record's future: _batch, _delta, _ts (accumulator.RecordFuture in C).",
    .tp_basicsize = sizeof(FutureObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Future_init,
    .tp_traverse = (traverseproc)Future_traverse,
    .tp_clear = (inquiry)Future_clear,
    .tp_dealloc = (destructor)Future_dealloc,
    .tp_members = Future_members,
};

typedef struct {
    PyObject_HEAD
    PyObject *ba;                   /* bytearray: header room + records + spare (NULL: none) */
    Py_ssize_t len;                 /* bytes of records, after the header room */
    Py_ssize_t hint;                /* records room a full batch needs (0: unknown) */
    long long count, base_ts, max_ts, last_delta, horizon;
    int has_base;
    int busy;                       /* inside acc_append: Python code it runs may not re-enter */
    int handed;                     /* ba was handed in (init's buffer) and not yet adopted */
    PyTypeObject *future_type;      /* NULL: add() is not available */
    PyObject *owner;
} AccObject;

static PyObject *empty_list;          /* headers of a record without any; never mutated */

static int
Acc_init(AccObject *a, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"delete_horizon_ms", "future_type", "owner", "capacity",
                             "buffer", NULL};
    long long horizon = -1;
    Py_ssize_t capacity = 0;
    PyObject *ftype = Py_None, *owner = Py_None, *buffer = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|LOOnO", kwlist, &horizon, &ftype, &owner,
                                     &capacity, &buffer))
        return -1;
    if (buffer != Py_None && !PyByteArray_CheckExact(buffer)) {
        PyErr_SetString(PyExc_TypeError, "buffer must be a bytearray");
        return -1;
    }
    if (ftype != Py_None && !(PyType_Check(ftype) &&
                              PyType_IsSubtype((PyTypeObject *)ftype, &FutureType))) {
        PyErr_SetString(PyExc_TypeError, "future_type must be a subclass of RecordFuture");
        return -1;
    }
    if (a->busy) {
        PyErr_SetString(PyExc_RuntimeError, "record accumulator re-entered while encoding");
        return -1;
    }
    a->len = 0;
    a->count = 0;
    a->has_base = 0;
    a->base_ts = 0;
    a->max_ts = -1;                   /* records.NO_TIMESTAMP */
    a->last_delta = -1;
    a->horizon = horizon;
    a->hint = capacity > RECORD_BATCH_OVERHEAD ? capacity - RECORD_BATCH_OVERHEAD : 0;
    /* A finished batch's buffer handed back (the producer's pool): written from the start,
     * it saves a fresh allocation and the page faults of its first touch. It is only written
     * while this accumulator is its sole owner (acc_reserve), like a buffer of its own. */
    a->handed = 0;
    if (buffer != Py_None && PyByteArray_GET_SIZE(buffer) >= RECORD_BATCH_OVERHEAD) {
        Py_XSETREF(a->ba, Py_NewRef(buffer));
        a->handed = 1;                /* adopted on first use, if nothing else holds it */
    }
    Py_XSETREF(a->future_type,
               ftype == Py_None ? NULL : (PyTypeObject *)Py_NewRef(ftype));
    Py_XSETREF(a->owner, Py_NewRef(owner));
    return 0;
}

static int
Acc_traverse(AccObject *a, visitproc visit, void *arg)
{
    Py_VISIT(a->future_type);
    Py_VISIT(a->owner);
    return 0;
}

static int
Acc_clear(AccObject *a)
{
    Py_CLEAR(a->future_type);
    Py_CLEAR(a->owner);
    return 0;
}

static void
Acc_dealloc(AccObject *a)
{
    PyObject_GC_UnTrack(a);
    Acc_clear(a);
    Py_XDECREF(a->ba);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

/* The records part of the buffer (valid until the next acc_reserve). */
#define ACC_RECORDS(a) ((unsigned char *)PyByteArray_AS_STRING((a)->ba) + RECORD_BATCH_OVERHEAD)

/* Room for `need` more bytes of records. The buffer is written in place only while the
 * accumulator is its sole owner: once buffer() handed it out (a built batch being sent), the
 * records move to a new one, so a batch already built never changes under its holder. */
static int
acc_reserve(AccObject *a, Py_ssize_t need)
{
    if (a->handed) {                /* init's buffer, before anything was written to it */
        a->handed = 0;
        if (Py_REFCNT(a->ba) == 1)
            memset(PyByteArray_AS_STRING(a->ba), 0, RECORD_BATCH_OVERHEAD);
        else
            Py_CLEAR(a->ba);        /* still held elsewhere: never written, start anew */
    }
    Py_ssize_t cap = a->ba ? PyByteArray_GET_SIZE(a->ba) - RECORD_BATCH_OVERHEAD : 0;
    int own = a->ba != NULL && Py_REFCNT(a->ba) == 1;
    if (own && need <= cap - a->len)
        return 0;
    if (need > PY_SSIZE_T_MAX / 2 - a->len - RECORD_BATCH_OVERHEAD) {
        PyErr_NoMemory();
        return -1;
    }
    /* Room for 16 more records like this one, up to a full batch: 64 KiB records get the
     * whole batch at once instead of growing through 128, 256 and 512 KiB (a realloc copy
     * of each: ~1 MiB more copied per 1 MiB batch); 100-byte ones start small. */
    Py_ssize_t ahead = need > a->hint / 16 ? a->hint - a->len : need * 16;
    if (cap < a->len + ahead)
        cap = a->len + ahead;
    if (cap < 256)
        cap = 256;
    while (cap - a->len < need)
        cap *= 2;
    if (a->hint > 0 && cap > a->hint && a->len + need <= a->hint)
        cap = a->hint;                  /* doubling past a full batch: a full batch */
    if (own)
        return PyByteArray_Resize(a->ba, RECORD_BATCH_OVERHEAD + cap);
    PyObject *ba = PyByteArray_FromStringAndSize(NULL, RECORD_BATCH_OVERHEAD + cap);
    if (ba == NULL)
        return -1;
    if (a->ba != NULL)
        memcpy(PyByteArray_AS_STRING(ba), PyByteArray_AS_STRING(a->ba),
               RECORD_BATCH_OVERHEAD + a->len);
    else
        memset(PyByteArray_AS_STRING(ba), 0, RECORD_BATCH_OVERHEAD);
    Py_XSETREF(a->ba, ba);
    return 0;
}

/* The zigzag of a - b as records computes it from Python ints (exact, then masked). */
static int
zigzag_diff(long long a, long long b, uint64_t *out)
{
    long long d;
    if (!__builtin_sub_overflow(a, b, &d)) {
        *out = zigzag(d);
        return 0;
    }
    PyObject *x = PyLong_FromLongLong(a), *y = PyLong_FromLongLong(b);
    PyObject *v = x && y ? PyNumber_Subtract(x, y) : NULL;
    int rc = v ? zigzag_obj(v, out) : -1;
    Py_XDECREF(x);
    Py_XDECREF(y);
    Py_XDECREF(v);
    return rc;
}

static long long
now_ms(void)
{
    struct timespec t;                        /* int(time.time() * 1000) */
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- produce_frame: a Produce request of one record, for send() with linger_ms=0 ---- */

/* msgpack's smallest encoding of an int, as msgpack.packb chooses it. */
static unsigned char *
mp_int(unsigned char *q, long long v)
{
    uint64_t u = (uint64_t)v;
    int n;
    if (v >= 0 && v < 128) {
        *q++ = (unsigned char)v;
        return q;
    }
    if (v < 0 && v >= -32) {
        *q++ = (unsigned char)(v & 0xFF);
        return q;
    }
    if (v >= 0)
        n = v < 256 ? (*q++ = 0xcc, 1) : v < 65536 ? (*q++ = 0xcd, 2) :
            v <= 0xFFFFFFFFLL ? (*q++ = 0xce, 4) : (*q++ = 0xcf, 8);
    else
        n = v >= -128 ? (*q++ = 0xd0, 1) : v >= -32768 ? (*q++ = 0xd1, 2) :
            v >= INT32_MIN ? (*q++ = 0xd2, 4) : (*q++ = 0xd3, 8);
    for (int i = n - 1; i >= 0; i--)
        *q++ = (unsigned char)(u >> (8 * i));
    return q;
}

static unsigned char *
put_be(unsigned char *q, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--)
        *q++ = (unsigned char)(v >> (8 * i));
    return q;
}

#define TAIL_FLAG 0x80000000u     /* frames.TAIL_FLAG */
#define MP_HEAD_MAX (1 + 4 * 9 + 5)  /* fixarray, four ints, a str header */

PyDoc_STRVAR(produce_frame_doc,
"produce_frame(api, request_id, topic, partition, acks, timestamp_ms, key, value, headers,\n"
"              producer_id, producer_epoch, base_sequence, attributes)\n"
"    -> (head, batch, timestamp_ms)\n\n"
"A Produce request of one record, as send() with linger_ms=0 writes it: batch is the record's\n"
"RecordBatch v2 (base offset 0, leader epoch -1, CRC set) as a bytearray, head the tail\n"
"frame's prefix and msgpack header [api, request_id, topic, partition, acks]\n"
"(mq.protocol.frames), to be sent in that order. timestamp_ms None: now (returned). Byte for\n"
"byte encode_tail_frame(request(api, request_id, topic, partition, acks, batch)) and\n"
"BatchBuilder.build() of the one record (tests/unit/log/test_produce_frame.py).");

/* The record's batch and the frame's head, from produce_frame's 13 arguments: 0, or -1 with
 * an exception. */
static int
build_produce(PyObject *const *args, PyObject **head_out, PyObject **batch_out, long long *ts_out)
{
    long long f[13];
    for (int i = 0; i < 13; i++) {
        if (i == 2 || (i >= 5 && i <= 8))
            continue;
        if ((f[i] = PyLong_AsLongLong(args[i])) == -1 && PyErr_Occurred())
            return -1;
    }
    long long ts;
    if (args[5] == Py_None)
        ts = now_ms();
    else if ((ts = PyLong_AsLongLong(args[5])) == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t topic_len;
    if (!PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "produce_frame: topic must be a str");
        return -1;
    }
    const char *topic = PyUnicode_AsUTF8AndSize(args[2], &topic_len);
    if (topic == NULL)
        return -1;
    PyObject *hl;
    if (args[8] == Py_None || (PyTuple_CheckExact(args[8]) && PyTuple_GET_SIZE(args[8]) == 0))
        hl = Py_NewRef(empty_list);
    else if ((hl = PySequence_List(args[8])) == NULL)
        return -1;
    PyObject *batch = NULL, *head = NULL;
    int rc = -1;
    Out body = {NULL, NULL, 0}, lv = {NULL, NULL, 0};
    if (put_body(&body, 0, 0, args[6], args[7], hl) < 0 || put(&lv, zigzag(body.n), NULL, 0) < 0)
        goto done;
    Py_ssize_t size = RECORD_BATCH_OVERHEAD + lv.n + body.n;
    if ((batch = PyByteArray_FromStringAndSize(NULL, size)) == NULL)
        goto done;
    unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(batch), *q = b;
    q = put_be(q, 0, 8);                                     /* base offset */
    q = put_be(q, (uint64_t)(size - 12), 4);                 /* batch length */
    q = put_be(q, (uint64_t)-1, 4);                          /* partition leader epoch */
    *q++ = 2;                                                /* magic */
    q += 4;                                                  /* the CRC, below */
    q = put_be(q, (uint64_t)f[12], 2);                       /* attributes */
    q = put_be(q, 0, 4);                                     /* last offset delta */
    q = put_be(q, (uint64_t)ts, 8);                          /* base timestamp */
    q = put_be(q, (uint64_t)ts, 8);                          /* max timestamp */
    q = put_be(q, (uint64_t)f[9], 8);                        /* producer id */
    q = put_be(q, (uint64_t)f[10], 2);                       /* producer epoch */
    q = put_be(q, (uint64_t)f[11], 4);                       /* base sequence */
    q = put_be(q, 1, 4);                                     /* records */
    Out w = {q, b + size, 0};
    if (put(&w, zigzag(body.n), NULL, 0) < 0 || put_body(&w, 0, 0, args[6], args[7], hl) < 0)
        goto done;
    if (w.q != w.end) {
        PyErr_SetString(PyExc_RuntimeError, "record changed while being encoded");
        goto done;
    }
    put_be(b + 17, mq_crc32c(b + 21, (size_t)(size - 21)), 4);

    unsigned char mp[MP_HEAD_MAX], *m = mp;
    *m++ = 0x95;                                             /* [api, id, topic, p, acks] */
    m = mp_int(m, f[0]);
    m = mp_int(m, f[1]);
    if (topic_len < 32)
        *m++ = (unsigned char)(0xa0 | topic_len);
    else if (topic_len < 256)
        m = put_be((*m++ = 0xd9, m), (uint64_t)topic_len, 1);
    else if (topic_len < 65536)
        m = put_be((*m++ = 0xda, m), (uint64_t)topic_len, 2);
    else
        m = put_be((*m++ = 0xdb, m), (uint64_t)topic_len, 4);
    Py_ssize_t before = m - mp;                              /* the topic goes here */
    unsigned char rest[2 * 9], *r = rest;
    r = mp_int(r, f[3]);
    r = mp_int(r, f[4]);
    Py_ssize_t hlen = before + topic_len + (r - rest);
    Py_ssize_t length = 4 + hlen + size;
    if (length > (Py_ssize_t)(TAIL_FLAG - 1)) {
        PyErr_SetString(PyExc_ValueError, "produce_frame: frame too large");
        goto done;
    }
    if ((head = PyBytes_FromStringAndSize(NULL, 8 + hlen)) == NULL)
        goto done;
    q = (unsigned char *)PyBytes_AS_STRING(head);
    q = put_be(q, TAIL_FLAG | (uint32_t)length, 4);
    q = put_be(q, (uint64_t)hlen, 4);
    memcpy(q, mp, (size_t)before);
    memcpy(q + before, topic, (size_t)topic_len);
    memcpy(q + before + topic_len, rest, (size_t)(r - rest));
    *head_out = head;
    *batch_out = batch;
    *ts_out = ts;
    head = batch = NULL;
    rc = 0;
done:
    Py_DECREF(hl);
    Py_XDECREF(head);
    Py_XDECREF(batch);
    return rc;
}

static PyObject *
produce_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "produce_frame expected 13 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *head, *batch;
    long long ts;
    if (build_produce(args, &head, &batch, &ts) < 0)
        return NULL;
    PyObject *out = Py_BuildValue("(NNL)", head, batch, ts);
    return out;
}

PyDoc_STRVAR(produce_send_doc,
"produce_send(fd, limit, api, request_id, topic, partition, acks, timestamp_ms, key, value,\n"
"             headers, producer_id, producer_epoch, base_sequence, attributes)\n"
"    -> (head, batch, timestamp_ms, sent) | None\n\n"
"produce_frame's request, written to the socket fd as far as it takes it at once (sendmsg,\n"
"non-blocking, the GIL held): sent is the bytes written (the caller writes the rest), or\n"
"-errno when the write failed. None, with nothing written, when the batch is over limit\n"
"bytes. The caller holds the connection's send lock.");

static PyObject *
produce_send(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 15) {
        PyErr_Format(PyExc_TypeError, "produce_send expected 15 arguments, got %zd", nargs);
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "produce_send: bad file descriptor");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *head, *batch;
    long long ts;
    if (build_produce(args + 2, &head, &batch, &ts) < 0)
        return NULL;
    if (PyByteArray_GET_SIZE(batch) > limit) {
        Py_DECREF(head);
        Py_DECREF(batch);
        Py_RETURN_NONE;
    }
    struct iovec iov[2] = {
        {PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head)},
        {PyByteArray_AS_STRING(batch), (size_t)PyByteArray_GET_SIZE(batch)},
    };
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    ssize_t sent;
    do {
        sent = sendmsg((int)fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0)
        sent = errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -(ssize_t)errno;
    return Py_BuildValue("(NNLn)", head, batch, ts, (Py_ssize_t)sent);
}

/* Append one record: 0 and its delta and timestamp; -1 with an exception, or 1 when a
 * non-empty batch would grow past `limit` bytes (< 0: no limit), both leaving it unchanged. */
static int
acc_append(AccObject *a, PyObject *ts_obj, PyObject *key, PyObject *value, PyObject *headers,
           PyObject *delta_obj, Py_ssize_t limit, long long *delta_out, long long *ts_out)
{
    long long ts, delta;
    if (ts_obj == Py_None)
        ts = now_ms();
    else if ((ts = PyLong_AsLongLong(ts_obj)) == -1 && PyErr_Occurred())
        return -1;
    if (delta_obj == NULL || delta_obj == Py_None) {
        delta = a->last_delta + 1;
    } else {
        if ((delta = PyLong_AsLongLong(delta_obj)) == -1 && PyErr_Occurred())
            return -1;
        if (delta <= a->last_delta) {
            PyErr_Format(PyExc_ValueError, "offset delta %lld does not follow %lld", delta,
                         a->last_delta);
            return -1;
        }
    }
    /* With a delete horizon (set by the cleaner), baseTimestamp holds the horizon. */
    long long base = a->has_base ? a->base_ts : (a->horizon < 0 ? ts : a->horizon);
    uint64_t tsz;
    if (zigzag_diff(ts, base, &tsz) < 0)
        return -1;
    PyObject *hl;
    if (headers == Py_None || (PyTuple_CheckExact(headers) && PyTuple_GET_SIZE(headers) == 0)
        || (PyList_CheckExact(headers) && PyList_GET_SIZE(headers) == 0))
        hl = Py_NewRef(empty_list);
    else if ((hl = PySequence_List(headers)) == NULL)
        return -1;
    if (a->busy) {
        Py_DECREF(hl);
        PyErr_SetString(PyExc_RuntimeError, "record accumulator re-entered while encoding");
        return -1;
    }
    a->busy = 1;
    Out size = {NULL, NULL, 0}, lv = {NULL, NULL, 0};
    int rc = -1;
    if (put_body(&size, tsz, zigzag(delta), key, value, hl) == 0) {
        put(&lv, zigzag(size.n), NULL, 0);
        Py_ssize_t need = lv.n + size.n;
        if (limit >= 0 && a->count > 0 && need > limit - RECORD_BATCH_OVERHEAD - a->len)
            rc = 1;
        else if (acc_reserve(a, need) == 0) {
            unsigned char *q = ACC_RECORDS(a) + a->len;
            Out w = {q, q + need, 0};
            if (put(&w, zigzag(size.n), NULL, 0) == 0 &&
                put_body(&w, tsz, zigzag(delta), key, value, hl) == 0) {
                if (w.q == w.end) {
                    a->len += need;
                    rc = 0;
                } else {
                    PyErr_SetString(PyExc_RuntimeError, "record changed while being encoded");
                }
            }
        }
    }
    a->busy = 0;
    Py_DECREF(hl);
    if (rc != 0)
        return rc;
    a->has_base = 1;
    a->base_ts = base;
    a->last_delta = delta;
    if (ts > a->max_ts)
        a->max_ts = ts;
    a->count++;
    *delta_out = delta;
    *ts_out = ts;
    return 0;
}

PyDoc_STRVAR(Acc_append_doc,
"append(timestamp_ms, key, value, headers=(), offset_delta=None) -> int\n\n"
"Encode one record (timestamp None: now); returns its offset delta. As BatchBuilder.append.");

static PyObject *
Acc_append(AccObject *a, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"timestamp_ms", "key", "value", "headers", "offset_delta", NULL};
    PyObject *ts, *key, *value, *headers = Py_None, *delta = Py_None;
    long long d, t;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|OO", kwlist, &ts, &key, &value,
                                     &headers, &delta))
        return NULL;
    if (acc_append(a, ts, key, value, headers, delta, -1, &d, &t) < 0)
        return NULL;
    return PyLong_FromLongLong(d);
}

static PyObject *
make_future(AccObject *a, long long delta, long long ts)
{
    FutureObject *f = (FutureObject *)a->future_type->tp_alloc(a->future_type, 0);
    if (f == NULL)
        return NULL;
    f->batch = Py_NewRef(a->owner);
    f->delta = delta;
    f->ts = ts;
    return (PyObject *)f;
}

PyDoc_STRVAR(Acc_add_doc,
"add(timestamp_ms, key, value, headers) -> future\n\n"
"append() with the next offset delta; returns future_type's view of the record: _batch (the\n"
"owner), _delta, _ts. Needs future_type.");

static PyObject *
Acc_add(AccObject *a, PyObject *const *args, Py_ssize_t nargs)
{
    long long d, t;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "add expected 4 arguments, got %zd", nargs);
        return NULL;
    }
    if (a->future_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "add() needs an accumulator with a future_type");
        return NULL;
    }
    if (acc_append(a, args[0], args[1], args[2], args[3], NULL, -1, &d, &t) < 0)
        return NULL;
    return make_future(a, d, t);
}

PyDoc_STRVAR(Acc_extend_doc,
"extend(timestamp_ms, values, keys, headers, start, limit, out) -> int\n\n"
"add() for values[start:] (keys: None or a list as long as values; the same headers and\n"
"timestamp, None: now, for every record), appending each future to the list out, while the\n"
"batch stays within limit bytes (the first record of an empty batch always goes in);\n"
"returns the index of the first record left out (len(values): all in).");

static PyObject *
Acc_extend(AccObject *a, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "extend expected 7 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *values = args[1], *keys = args[2], *headers = args[3], *out = args[6];
    if (a->future_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "extend() needs an accumulator with a future_type");
        return NULL;
    }
    if (!PyList_Check(values) || !PyList_Check(out) ||
        (keys != Py_None && (!PyList_Check(keys) ||
                             PyList_GET_SIZE(keys) != PyList_GET_SIZE(values)))) {
        PyErr_SetString(PyExc_TypeError, "values, keys (or None) and out must be lists, keys "
                        "as long as values");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[4]), limit = PyLong_AsSsize_t(args[5]);
    if ((i == -1 || limit == -1) && PyErr_Occurred())
        return NULL;
    PyObject *ts = args[0], *now = NULL;
    if (ts == Py_None && (ts = now = PyLong_FromLongLong(now_ms())) == NULL)
        return NULL;
    for (; i >= 0 && i < PyList_GET_SIZE(values); i++) {
        if (keys != Py_None && i >= PyList_GET_SIZE(keys)) {
            PyErr_SetString(PyExc_RuntimeError, "keys changed while being encoded");
            goto fail;
        }
        PyObject *key = keys == Py_None ? Py_None : PyList_GET_ITEM(keys, i);
        PyObject *value = PyList_GET_ITEM(values, i);
        long long d, t;
        Py_INCREF(key);
        Py_INCREF(value);
        int rc = acc_append(a, ts, key, value, headers, NULL, limit, &d, &t);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0)
            goto fail;
        if (rc > 0)
            break;                        /* full */
        PyObject *f = make_future(a, d, t);
        if (f == NULL || PyList_Append(out, f) < 0) {
            Py_XDECREF(f);
            goto fail;
        }
        Py_DECREF(f);
    }
    Py_XDECREF(now);
    return PyLong_FromSsize_t(i);
fail:
    Py_XDECREF(now);
    return NULL;
}

PyDoc_STRVAR(Acc_records_doc, "records() -> bytes\n\nThe records section so far.");

static PyObject *
Acc_records(AccObject *a, PyObject *unused)
{
    (void)unused;
    if (a->ba == NULL)
        return PyBytes_FromStringAndSize(NULL, 0);
    return PyBytes_FromStringAndSize((const char *)ACC_RECORDS(a), a->len);
}

PyDoc_STRVAR(Acc_buffer_doc,
"buffer() -> bytearray\n\n"
"The batch so far, records.RECORD_BATCH_OVERHEAD bytes of room for its header (zeros until\n"
"the caller writes one) then the records: the accumulator's own buffer, cut to that size,\n"
"when nothing else holds it (no copy; BatchBuilder.build writes the header into it), else\n"
"a copy. Records appended later go to a new buffer; a later buffer() returns the same one\n"
"only if its holders let it go.");

static PyObject *
Acc_buffer(AccObject *a, PyObject *unused)
{
    (void)unused;
    if (a->busy) {
        PyErr_SetString(PyExc_RuntimeError, "record accumulator re-entered while encoding");
        return NULL;
    }
    if ((a->ba == NULL || a->handed) && acc_reserve(a, 0) < 0)
        return NULL;
    if (Py_REFCNT(a->ba) > 1)
        return PyByteArray_FromStringAndSize(PyByteArray_AS_STRING(a->ba),
                                             RECORD_BATCH_OVERHEAD + a->len);
    if (PyByteArray_Resize(a->ba, RECORD_BATCH_OVERHEAD + a->len) < 0)
        return NULL;
    return Py_NewRef(a->ba);
}

static PyObject *
Acc_get_size(AccObject *a, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(RECORD_BATCH_OVERHEAD + a->len);
}

static PyObject *
Acc_get_base(AccObject *a, void *c)
{
    (void)c;
    if (!a->has_base)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(a->base_ts);
}

static PyGetSetDef Acc_getset[] = {
    {"size", (getter)Acc_get_size, NULL, "the batch's size in bytes, header included", NULL},
    {"base_timestamp", (getter)Acc_get_base, NULL, "the first record's base (None: empty)",
     NULL},
    {NULL}
};

static PyMemberDef Acc_members[] = {
    {"count", T_LONGLONG, offsetof(AccObject, count), READONLY, "records appended"},
    {"max_timestamp", T_LONGLONG, offsetof(AccObject, max_ts), READONLY, "-1 when empty"},
    {"last_offset_delta", T_LONGLONG, offsetof(AccObject, last_delta), READONLY,
     "-1 when empty"},
    {NULL}
};

static PyMethodDef Acc_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Acc_append, METH_VARARGS | METH_KEYWORDS,
     Acc_append_doc},
    {"add", (PyCFunction)(void (*)(void))Acc_add, METH_FASTCALL, Acc_add_doc},
    {"extend", (PyCFunction)(void (*)(void))Acc_extend, METH_FASTCALL, Acc_extend_doc},
    {"records", (PyCFunction)Acc_records, METH_NOARGS, Acc_records_doc},
    {"buffer", (PyCFunction)Acc_buffer, METH_NOARGS, Acc_buffer_doc},
    {NULL}
};

static PyTypeObject AccType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mq.log._crecords.RecordAccumulator",
    .tp_doc = "RecordAccumulator(delete_horizon_ms=-1, future_type=None, owner=None, "
              "capacity=0, buffer=None)\n\n"
              "The records of one batch being built (accumulator.RecordAccumulator in C);\n"
              "capacity: "
              "the bytes of a full batch, header included, when known (sizes its buffer);\n"
              "buffer: a bytearray nothing else holds, to build the batch in.",
    .tp_basicsize = sizeof(AccObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Acc_init,
    .tp_traverse = (traverseproc)Acc_traverse,
    .tp_clear = (inquiry)Acc_clear,
    .tp_dealloc = (destructor)Acc_dealloc,
    .tp_methods = Acc_methods,
    .tp_members = Acc_members,
    .tp_getset = Acc_getset,
};

/* For _csend.c (declared in _crecords.h): an accumulator's size, its header included, or -1
 * when `o` is not one; and its add(None, key, value, ()) with no Python call between. */
Py_ssize_t
mq_acc_size(PyObject *o)
{
    return Py_IS_TYPE(o, &AccType) ? RECORD_BATCH_OVERHEAD + ((AccObject *)o)->len : -1;
}

PyObject *
mq_acc_add(PyObject *o, PyObject *key, PyObject *value)
{
    AccObject *a = (AccObject *)o;
    long long d, t;
    if (a->future_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "add() needs an accumulator with a future_type");
        return NULL;
    }
    if (acc_append(a, Py_None, key, value, Py_None, NULL, -1, &d, &t) < 0)
        return NULL;
    return make_future(a, d, t);
}

/* ---- take_produce: the broker's parse of the frame produce_frame writes ---- */

/* A msgpack int at p[*pos, lim) into *out (any of msgpack's int encodings whose value fits
 * int64): 0, or -1 when the next object is something else. */
static int
mp_read_int(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t lim, long long *out)
{
    Py_ssize_t i = *pos;
    if (i >= lim)
        return -1;
    unsigned b = p[i++];
    int n;
    int sign;
    if (b < 0x80 || b >= 0xe0) {                       /* positive or negative fixint */
        *out = b < 0x80 ? (long long)b : (long long)b - 256;
        *pos = i;
        return 0;
    }
    switch (b) {
    case 0xcc: n = 1; sign = 0; break;
    case 0xcd: n = 2; sign = 0; break;
    case 0xce: n = 4; sign = 0; break;
    case 0xcf: n = 8; sign = 0; break;
    case 0xd0: n = 1; sign = 1; break;
    case 0xd1: n = 2; sign = 1; break;
    case 0xd2: n = 4; sign = 1; break;
    case 0xd3: n = 8; sign = 1; break;
    default: return -1;
    }
    if (lim - i < n)
        return -1;
    uint64_t u = 0;
    for (int k = 0; k < n; k++)
        u = (u << 8) | p[i + k];
    if (sign && n < 8 && (u >> (8 * n - 1)))
        u |= ~(uint64_t)0 << (8 * n);                  /* sign-extend */
    else if (!sign && n == 8 && u > (uint64_t)INT64_MAX)
        return -1;                                     /* past int64: the Python path */
    *out = (long long)u;
    *pos = i + n;
    return 0;
}

PyDoc_STRVAR(take_produce_doc,
"take_produce(buf, start, end, max_frame_bytes)\n"
"    -> (request_id, topic, partition, acks, tail_start, frame_end) | None\n\n"
"The frame at buf[start:end] read as a Produce tail frame (mq.protocol.frames), the shape\n"
"produce_frame writes: the prefix, a header of exactly the msgpack array [0, request_id,\n"
"topic, partition, acks] (ints and a UTF-8 str), and the batch at [tail_start, frame_end).\n"
"None when the frame is not whole yet or is anything else, even malformed: the general\n"
"path (FrameReader.messages) then reads it and says what is wrong.");

static PyObject *
take_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "take_produce takes 4 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    long long max_frame = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *res = NULL, *topic = NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    if (start < 0 || end > view.len || end - start < 9)
        goto none;
    uint32_t word = (uint32_t)be32(p + start);
    long long length = word & ~TAIL_FLAG;
    if (!(word & TAIL_FLAG) || length < 5 || length > max_frame || length > end - start - 4)
        goto none;
    const Py_ssize_t frame_end = start + 4 + (Py_ssize_t)length;
    const long long head = (uint32_t)be32(p + start + 4);
    if (head > length - 4)
        goto none;
    Py_ssize_t pos = start + 8;
    const Py_ssize_t lim = pos + (Py_ssize_t)head;
    long long api, rid, partition, acks;
    if (lim - pos < 2 || p[pos] != 0x95)               /* fixarray of 5 */
        goto none;
    pos++;
    if (mp_read_int(p, &pos, lim, &api) < 0 || api != 0 ||
            mp_read_int(p, &pos, lim, &rid) < 0 || pos >= lim)
        goto none;
    unsigned b = p[pos++];
    Py_ssize_t n;
    if ((b & 0xe0) == 0xa0) {
        n = b & 0x1f;
    } else if (b == 0xd9 && lim - pos >= 1) {
        n = p[pos++];
    } else if (b == 0xda && lim - pos >= 2) {
        n = ((Py_ssize_t)p[pos] << 8) | p[pos + 1];
        pos += 2;
    } else if (b == 0xdb && lim - pos >= 4) {
        n = (Py_ssize_t)(uint32_t)be32(p + pos);
        pos += 4;
    } else {
        goto none;
    }
    if (n > lim - pos)
        goto none;
    topic = PyUnicode_DecodeUTF8((const char *)p + pos, n, NULL);
    if (topic == NULL) {
        PyErr_Clear();                                 /* msgpack raises: the Python path */
        goto none;
    }
    pos += n;
    if (mp_read_int(p, &pos, lim, &partition) < 0 || mp_read_int(p, &pos, lim, &acks) < 0 ||
            pos != lim)
        goto none;
    res = Py_BuildValue("(LOLLnn)", rid, topic, partition, acks, lim, frame_end);
    goto out;
none:
    res = Py_NewRef(Py_None);
out:
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    return res;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS, decode_records_doc},
    {"take_batches", mq_take_batches, METH_VARARGS, mq_take_batches_doc},
    {"check_batch", mq_check_batch, METH_VARARGS, mq_check_batch_doc},
    {"tail_take", mq_tail_take, METH_VARARGS, mq_tail_take_doc},
    {"tail_wait_take", (PyCFunction)(void (*)(void))mq_tail_wait_take, METH_FASTCALL,
     mq_tail_wait_take_doc},
    {"append_plain", (PyCFunction)(void (*)(void))mq_append_plain, METH_FASTCALL,
     mq_append_plain_doc},
    {"publish_slot", (PyCFunction)(void (*)(void))mq_publish_slot, METH_FASTCALL,
     mq_publish_slot_doc},
    {"produce_plain", (PyCFunction)(void (*)(void))mq_produce_plain, METH_FASTCALL,
     mq_produce_plain_doc},
    {"send_open", (PyCFunction)(void (*)(void))mq_send_open, METH_FASTCALL, mq_send_open_doc},
    {"decode_columns", decode_columns, METH_VARARGS, decode_columns_doc},
    {"produce_frame", (PyCFunction)(void (*)(void))produce_frame, METH_FASTCALL,
     produce_frame_doc},
    {"produce_send", (PyCFunction)(void (*)(void))produce_send, METH_FASTCALL,
     produce_send_doc},
    {"encode_record", (PyCFunction)(void (*)(void))encode_record, METH_FASTCALL,
     encode_record_doc},
    {"take_produce", (PyCFunction)(void (*)(void))take_produce, METH_FASTCALL,
     take_produce_doc},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mq.log._crecords",
    "Optional C codec for mq.log (batch.py, builder.py and client/accumulator.py hold "
    "the references).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    if (PyType_Ready(&RecordType) < 0 || PyType_Ready(&FutureType) < 0 ||
        PyType_Ready(&AccType) < 0)
        return NULL;
    if (empty_list == NULL && (empty_list = PyList_New(0)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Record", (PyObject *)&RecordType) < 0 ||
        PyModule_AddObjectRef(m, "RecordFuture", (PyObject *)&FutureType) < 0 ||
        PyModule_AddObjectRef(m, "RecordAccumulator", (PyObject *)&AccType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
