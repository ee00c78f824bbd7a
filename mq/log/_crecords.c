/* mq.log._crecords -- optional C decoder for the records section of a Kafka RecordBatch v2.
 *
 * Mirrors the pure-Python reference loop of RecordBatch.records() in mq/log/records.py (which
 * stays authoritative and runs when this module is not built, or when MQ_PURE_PYTHON=1): the
 * same input is accepted, the same values come out, the same input is rejected. Keys, values
 * and header values are zero-copy memoryview slices of the payload. Malformed input raises
 * ValueError whose message is the reason; records.py turns it into CorruptRecordError.
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

/* ---- Record: what decode_records returns (same attributes as records.BatchRecord) ---- */

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
        PyObject *k, *v, *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArg_ParseTuple(item, "OO:header", &k, &v)) {
            Py_CLEAR(out);
            break;
        }
        PyObject *vb = as_bytes(v);
        PyObject *t = vb == NULL ? NULL : PyTuple_Pack(2, k, vb);
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
 * keys, values and header values hold the same bytes (so records.BatchRecord == Record works:
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
    .tp_doc = "One decoded record (C twin of mq.log.records.BatchRecord).",
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

/* ---- varints ---- */

static int64_t
unzigzag(uint64_t r)
{
    return (r & 1) ? -(int64_t)(r >> 1) - 1 : (int64_t)(r >> 1);
}

/* Reads the raw (not yet zig-zag decoded) bits of a varint of at most `maxlen` bytes (5 or 10)
 * from p[*pos, lim). A 10-byte varlong carries 70 bits: the low 64 go to *lo, the rest to *hi.
 * Returns 0, or -1 with *why set on truncation or an overlong encoding. */
static int
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

/* base + zigzag(hi:lo) as a Python int; exact for any 70-bit varlong and int64 overflow. */
static PyObject *
sum_big(int64_t base, uint64_t lo, unsigned hi)
{
    PyObject *res = NULL, *b = PyLong_FromLongLong(base);
    PyObject *l = PyLong_FromUnsignedLongLong(lo), *h = PyLong_FromUnsignedLong(hi);
    PyObject *s64 = PyLong_FromLong(64), *one = PyLong_FromLong(1);
    PyObject *hs = NULL, *r = NULL, *half = NULL, *delta = NULL;
    if (b && l && h && s64 && one && (hs = PyNumber_Lshift(h, s64)) && (r = PyNumber_Or(hs, l))
        && (half = PyNumber_Rshift(r, one))) {
        /* (r >> 1) ^ -(r & 1): half for even r, -half - 1 = ~half for odd r */
        delta = (lo & 1) ? PyNumber_Invert(half) : Py_NewRef(half);
        if (delta)
            res = PyNumber_Add(b, delta);
    }
    Py_XDECREF(b); Py_XDECREF(l); Py_XDECREF(h); Py_XDECREF(s64); Py_XDECREF(one);
    Py_XDECREF(hs); Py_XDECREF(r); Py_XDECREF(half); Py_XDECREF(delta);
    return res;
}

/* base + delta as a Python int, without C overflow (Python ints are unbounded). */
static PyObject *
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
static PyObject *
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

/* A slice mv[a:b] of the payload memoryview: a new view on the same buffer (no copy). */
static inline PyObject *
slice(PyObject *mv, Py_ssize_t a, Py_ssize_t b)
{
    return PySequence_GetSlice(mv, a, b);
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(payload, base_offset, base_timestamp, log_append_time, max_timestamp, count,\n"
"               record_type=None) -> list\n\n"
"Decode `count` records from the uncompressed records section `payload` (a 1-D memoryview of\n"
"format 'B'). Records are Record objects, or record_type(offset, timestamp, key, value,\n"
"headers) when a record_type is given. Raises ValueError(reason) on malformed input.");

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

    /* Holding the buffer pins it: the memoryview cannot be released while we read it. */
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const Py_buffer *mvb = PyMemoryView_GET_BUFFER(mv);
    if (mvb->ndim != 1 || mvb->itemsize != 1) {
        PyErr_SetString(PyExc_TypeError, "payload must be a 1-D memoryview of bytes");
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0, rec_start = 0, i = 0;
    const char *why = NULL;
    char msg[160];
    KeyCache cache = {.n = 0};
    PyObject *out = NULL, *max_ts_obj = NULL;

    if (count < 0 || count > end) {        /* every record takes at least 7 bytes */
        PyErr_Format(PyExc_ValueError, "record count %zd exceeds the %zd bytes of records",
                     count, end);
        goto done;
    }
    out = PyList_New(count);               /* NULL slots until filled; safe to DECREF */
    max_ts_obj = PyLong_FromLongLong(max_ts);
    if (out == NULL || max_ts_obj == NULL)
        goto fail;

    for (i = 0; i < count; i++) {
        int64_t length, od, klen, vlen, hcount, tsd = 0;
        uint64_t tlo;
        unsigned thi;
        rec_start = pos;
        if (read_varint(p, &pos, end, &length, &why) < 0)
            goto corrupt;
        if (length < 6 || length > end - pos) {
            snprintf(msg, sizeof msg, "record length %lld does not fit the batch",
                     (long long)length);
            why = msg;
            goto corrupt;
        }
        const Py_ssize_t rec_end = pos + (Py_ssize_t)length;
        pos += 1;                                        /* attributes (unused) */
        if (pos < rec_end && p[pos] < 0x80) {            /* timestamp delta: varlong */
            tlo = p[pos++];
            thi = 0;
        } else if (read_raw(p, &pos, rec_end, 10, &tlo, &thi, &why) < 0) {
            goto corrupt;
        }
        if (thi == 0)
            tsd = unzigzag(tlo);
        if (read_varint(p, &pos, rec_end, &od, &why) < 0 ||
            read_varint(p, &pos, rec_end, &klen, &why) < 0)
            goto corrupt;

        PyObject *key, *value, *headers, *offset, *ts, *rec;
        if (klen < -1 || klen > rec_end - pos) {
            snprintf(msg, sizeof msg, "invalid key length %lld", (long long)klen);
            why = msg;
            goto corrupt;
        }
        if (klen == -1) {
            key = Py_NewRef(Py_None);
        } else if ((key = slice(mv, pos, pos + (Py_ssize_t)klen)) == NULL) {
            goto fail;
        } else {
            pos += (Py_ssize_t)klen;
        }
        /* From here `key` (and then `value`, `headers`) are owned: errors go through `drop`. */
        value = headers = NULL;
        if (read_varint(p, &pos, rec_end, &vlen, &why) < 0)
            goto corrupt_drop;
        if (vlen < -1 || vlen > rec_end - pos) {
            snprintf(msg, sizeof msg, "invalid value length %lld", (long long)vlen);
            why = msg;
            goto corrupt_drop;
        }
        if (vlen == -1) {
            value = Py_NewRef(Py_None);
        } else if ((value = slice(mv, pos, pos + (Py_ssize_t)vlen)) == NULL) {
            goto fail_drop;
        } else {
            pos += (Py_ssize_t)vlen;
        }
        if (read_varint(p, &pos, rec_end, &hcount, &why) < 0)
            goto corrupt_drop;
        if (hcount < 0 || hcount > rec_end - pos) {
            snprintf(msg, sizeof msg, "invalid header count %lld", (long long)hcount);
            why = msg;
            goto corrupt_drop;
        }
        if (hcount > 0 && (headers = PyList_New((Py_ssize_t)hcount)) == NULL)
            goto fail_drop;
        for (Py_ssize_t h = 0; h < (Py_ssize_t)hcount; h++) {
            int64_t hklen, hvlen;
            PyObject *hkey, *hval, *pair;
            if (read_varint(p, &pos, rec_end, &hklen, &why) < 0)
                goto corrupt_drop;
            if (hklen < 0 || hklen > rec_end - pos) {
                snprintf(msg, sizeof msg, "invalid header key length %lld", (long long)hklen);
                why = msg;
                goto corrupt_drop;
            }
            if ((hkey = header_key(&cache, p + pos, (Py_ssize_t)hklen)) == NULL) {
                /* UnicodeDecodeError: a ValueError, re-raised below with the record's place */
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyErr_NormalizeException(&type, &exc, &tb);
                PyObject *s = exc ? PyObject_Str(exc) : NULL;
                const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
                Py_XDECREF(type); Py_XDECREF(exc); Py_XDECREF(tb);
                if (txt == NULL) {
                    Py_XDECREF(s);
                    goto fail_drop;
                }
                snprintf(msg, sizeof msg, "%s", txt);
                Py_DECREF(s);
                why = msg;
                goto corrupt_drop;
            }
            pos += (Py_ssize_t)hklen;
            if (read_varint(p, &pos, rec_end, &hvlen, &why) < 0) {
                Py_DECREF(hkey);
                goto corrupt_drop;
            }
            if (hvlen < -1 || hvlen > rec_end - pos) {
                snprintf(msg, sizeof msg, "invalid header value length %lld", (long long)hvlen);
                why = msg;
                Py_DECREF(hkey);
                goto corrupt_drop;
            }
            if (hvlen == -1) {
                hval = Py_NewRef(Py_None);
            } else if ((hval = slice(mv, pos, pos + (Py_ssize_t)hvlen)) == NULL) {
                Py_DECREF(hkey);
                goto fail_drop;
            } else {
                pos += (Py_ssize_t)hvlen;
            }
            if ((pair = PyTuple_New(2)) == NULL) {
                Py_DECREF(hkey);
                Py_DECREF(hval);
                goto fail_drop;
            }
            PyTuple_SET_ITEM(pair, 0, hkey);
            PyTuple_SET_ITEM(pair, 1, hval);
            PyList_SET_ITEM(headers, h, pair);
        }
        if (pos != rec_end) {
            snprintf(msg, sizeof msg, "record consumed %lld bytes but declared %lld",
                     (long long)(length - (rec_end - pos)), (long long)length);
            why = msg;
            goto corrupt_drop;
        }
        offset = sum_int(base_offset, od);
        if (log_append)
            ts = Py_NewRef(max_ts_obj);
        else
            ts = thi == 0 ? sum_int(base_ts, tsd) : sum_big(base_ts, tlo, thi);
        if (offset == NULL || ts == NULL) {
            Py_XDECREF(offset);
            Py_XDECREF(ts);
            goto fail_drop;
        }
        if (record_type == Py_None) {
            rec = record_make(offset, ts, key, value, headers);     /* steals all five */
        } else {
            if (headers == NULL && (headers = PyList_New(0)) == NULL) {
                Py_DECREF(offset);
                Py_DECREF(ts);
                goto fail_drop;
            }
            PyObject *fields[5] = {offset, ts, key, value, headers};
            rec = PyObject_Vectorcall(record_type, fields, 5, NULL);
            for (int f = 0; f < 5; f++)
                Py_DECREF(fields[f]);
        }
        if (rec == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, rec);
        continue;

    corrupt_drop:
        Py_DECREF(key); Py_XDECREF(value); Py_XDECREF(headers);
        goto corrupt;
    fail_drop:
        Py_DECREF(key); Py_XDECREF(value); Py_XDECREF(headers);
        goto fail;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left after %zd records (incorrect declared "
                     "batch size)", end - pos, count);
        goto fail;
    }
    goto done;

corrupt:
    PyErr_Format(PyExc_ValueError, "malformed record %zd of %zd at records byte %zd: %s",
                 i, count, rec_start, why);
fail:
    Py_CLEAR(out);
done:
    for (int k = 0; k < cache.n; k++)
        Py_DECREF(cache.str[k]);
    Py_XDECREF(max_ts_obj);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS, decode_records_doc},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mq.log._crecords",
    "C accelerator for mq.log.records (optional; records.py has the reference decoder).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    if (PyType_Ready(&RecordType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Record", (PyObject *)&RecordType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
