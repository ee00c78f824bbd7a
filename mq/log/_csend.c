/* mq/log/_csend.c -- the producer's send() of a record into its partition's open batch, in one
 * C call (mq.client.producer.Producer.send's common case with linger_ms > 0).
 *
 * Producer.send reads its checks and its batch add as Python: about 1.2 us of the 1.7 a record
 * costs a tight loop. This is that path's common branch, and only it: a record of bytes (or
 * None) for a known topic, its partition given, by a cached key hash, or sticky; no headers, no
 * timestamp; the partition's batch open, with room for this record and one more of its size
 * after it; the producer open, its queue below max_in_flight, its lock free. Anything else
 * returns None with nothing done, and send() takes its Python path, which does it all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_crecords.h"

/* What a record adds to a batch at most beyond its key and value: Kafka's
 * MAX_RECORD_OVERHEAD (21) and the key's, value's and header count's varints (5 each), rounded
 * up. */
#define RECORD_BOUND 64
#define MAX_RECORD_OVERHEAD 21   /* mq.log.layout.MAX_RECORD_OVERHEAD: send()'s `fits` */

static PyObject *s_num_partitions, *s_big_record, *s_closed, *s_open, *s_records,
    *s_batch_limit;

static int
send_names(void)
{
    if (s_batch_limit != NULL)             /* interned last: all are */
        return 0;
    static const MqName names[] = {
        {&s_num_partitions, "num_partitions"}, {&s_big_record, "big_record"},
        {&s_closed, "closed"}, {&s_open, "open"}, {&s_records, "records"},
        {&s_batch_limit, "batch_limit"},
    };
    return mq_intern(names, sizeof names / sizeof names[0]);
}

/* v (a new reference, or NULL with an error, which it takes) as a C integer: 0, 1 when it is
 * not an int, -1 with an error. Unlike _cappend.c's get_int, anything else declines:
 * big_record is a float (inf) while the broker's request limit is unknown. */
static int
as_long(PyObject *v, long long *out)
{
    if (v == NULL)
        return -1;
    int r = 1;
    if (PyLong_CheckExact(v)) {
        *out = PyLong_AsLongLong(v);
        r = *out == -1 && PyErr_Occurred() ? -1 : 0;
    }
    Py_DECREF(v);
    return r;
}

/* obj.name as a C integer (as_long). */
static int
long_attr(PyObject *obj, PyObject *name, long long *out)
{
    return as_long(PyObject_GetAttr(obj, name), out);
}

/* A __slots__ attribute read at its offset in the object, as CPython's own LOAD_ATTR_SLOT
 * does: the member descriptor is looked up once per type, and again when the type changed
 * (its version tag). Anything else (no object slot, a type without a valid version tag, an
 * unset slot) reads through PyObject_GetAttr. `type` is only compared, never dereferenced:
 * a version tag is never reused. A new reference, or NULL with an error. */
typedef struct {
    PyObject **name;
    PyTypeObject *type;
    unsigned int version;
    Py_ssize_t offset;
} SlotRef;

static void
slot_learn(PyTypeObject *t, SlotRef *s)
{
    s->type = NULL;
    PyObject *d = PyObject_GetAttr((PyObject *)t, *s->name);    /* the descriptor itself */
    if (d == NULL) {
        PyErr_Clear();
        return;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX) {
            s->type = t;
            s->version = t->tp_version_tag;
            s->offset = m->offset;
        }
    }
    Py_DECREF(d);
}

static PyObject *
slot_get(PyObject *obj, SlotRef *s)
{
    PyTypeObject *t = Py_TYPE(obj);
    if (t != s->type || !(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ||
            t->tp_version_tag != s->version)
        slot_learn(t, s);
    PyObject *v = s->type == NULL ? NULL : *(PyObject **)((char *)obj + s->offset);
    return v != NULL ? Py_NewRef(v) : PyObject_GetAttr(obj, *s->name);
}

/* A slot as a C integer (as_long). */
static int
long_slot(PyObject *obj, SlotRef *s, long long *out)
{
    return as_long(slot_get(obj, s), out);
}

static SlotRef num_partitions_ref = {&s_num_partitions}, open_ref = {&s_open},
    records_ref = {&s_records}, batch_limit_ref = {&s_batch_limit};

/* The partition the record goes to: 0 with *p, 1 to decline, -1 with an error. */
static int
choose(PyObject *topic, PyObject *key, PyObject *partition, PyObject *sticky,
       PyObject *key_hashes, long long num_partitions, long long *p)
{
    if (partition != Py_None) {
        if (!PyLong_CheckExact(partition))
            return 1;
        int overflow;
        *p = PyLong_AsLongLongAndOverflow(partition, &overflow);
        if (*p == -1 && PyErr_Occurred())
            return -1;
        return overflow || *p < 0 || *p >= num_partitions;
    }
    if (sticky == Py_None)
        return 1;                          /* a partitioner of the user's: Python calls it */
    PyObject *got = key == Py_None ? PyDict_GetItemWithError(sticky, topic)
                                   : PyDict_GetItemWithError(key_hashes, key);
    if (got == NULL)
        return PyErr_Occurred() ? -1 : 1;  /* no sticky partition, no cached hash: Python's */
    if (!PyLong_CheckExact(got))
        return 1;
    long long v = PyLong_AsLongLong(got);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0)
        return 1;
    if (key == Py_None) {
        *p = v;
        return v >= num_partitions;        /* the topic shrank: Python picks again */
    }
    *p = v % num_partitions;               /* Kafka's: to_positive(murmur2(key)) % n */
    return 0;
}

/* Under the producer's lock: the record added to the partition's open batch, its future;
 * Py_None to decline; NULL with an error. */
static PyObject *
add_locked(PyObject *io, PyObject *ready, long long max_in_flight, PyObject *info,
           long long p, Py_ssize_t size, PyObject *key, PyObject *value)
{
    PyObject *closed = PyObject_GetAttr(io, s_closed);
    if (closed == NULL)
        return NULL;
    int is_closed = PyObject_IsTrue(closed);
    Py_DECREF(closed);
    if (is_closed != 0)
        return is_closed < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t queued = PyObject_Length(ready);
    if (queued < 0)
        return NULL;
    if (queued >= max_in_flight)
        return Py_NewRef(Py_None);         /* no room: send() waits for it */
    PyObject *open = slot_get(info, &open_ref);
    if (open == NULL)
        return NULL;
    PyObject *batch = PyList_CheckExact(open) && p < PyList_GET_SIZE(open) ?
        Py_NewRef(PyList_GET_ITEM(open, p)) : Py_NewRef(Py_None);
    Py_DECREF(open);
    PyObject *records = NULL, *res = NULL;
    long long filled, limit;
    if (batch == Py_None) {                /* a new batch: Python opens it */
        res = Py_NewRef(Py_None);
        goto out;
    }
    /* The batch's records: the C accumulator (a whole batch has None), read and added to
     * directly. */
    if ((records = slot_get(batch, &records_ref)) == NULL)
        goto out;
    int r = (filled = mq_acc_size(records)) < 0 ? 1 :
        long_slot(info, &batch_limit_ref, &limit);
    if (r != 0) {
        res = r > 0 ? Py_NewRef(Py_None) : NULL;
        goto out;
    }
    /* Room for this record and one more of its size: send()'s `fits` holds after the add, so
     * the batch stays open, as its Python path leaves it. */
    if (filled + 2 * ((long long)size + RECORD_BOUND) + MAX_RECORD_OVERHEAD > limit)
        res = Py_NewRef(Py_None);
    else
        res = mq_acc_add(records, key, value);
out:
    Py_DECREF(batch);
    Py_XDECREF(records);
    return res;
}

const char mq_send_open_doc[] =
"send_open(state, topic, value, key, partition, headers, timestamp_ms) -> future | None\n\n"
"Producer.send's common case in one call: the record added to its partition's open batch\n"
"(the C accumulator's add) under the producer's lock, its future returned. state is the\n"
"producer's (topics, sticky, key_hashes, io, acquire, release, ready, max_in_flight, meta):\n"
"its fresh TopicStates by name, the default partitioner's sticky partitions and cached key\n"
"hashes (None: a partitioner of the user's), its ProducerIO (closed), its lock's acquire and\n"
"release, the queue of batches to send, and its ProducerMetadata (big_record). None, with\n"
"nothing done, for anything else: a value or key not bytes, headers, a timestamp, an unknown\n"
"topic, a partition out of range or to be chosen by Python, a big record, the lock taken, the\n"
"producer closed or its queue full, no open batch or one that this record could fill.";

PyObject *
mq_send_open(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 9) {
        PyErr_SetString(PyExc_TypeError, "send_open(state: 9-tuple, topic, value, key, "
                        "partition, headers, timestamp_ms)");
        return NULL;
    }
    PyObject *state = args[0], *topic = args[1], *value = args[2], *key = args[3],
        *partition = args[4], *headers = args[5];
    if (args[6] != Py_None ||
            (value != Py_None && !PyBytes_CheckExact(value)) ||
            (key != Py_None && !PyBytes_CheckExact(key)) ||
            !(headers == Py_None ||
              (PyTuple_CheckExact(headers) && PyTuple_GET_SIZE(headers) == 0) ||
              (PyList_CheckExact(headers) && PyList_GET_SIZE(headers) == 0)))
        Py_RETURN_NONE;
    if (send_names() < 0)
        return NULL;
    PyObject *topics = PyTuple_GET_ITEM(state, 0), *sticky = PyTuple_GET_ITEM(state, 1),
        *key_hashes = PyTuple_GET_ITEM(state, 2), *io = PyTuple_GET_ITEM(state, 3),
        *acquire = PyTuple_GET_ITEM(state, 4), *release = PyTuple_GET_ITEM(state, 5),
        *ready = PyTuple_GET_ITEM(state, 6), *meta = PyTuple_GET_ITEM(state, 8);
    long long max_in_flight = PyLong_AsLongLong(PyTuple_GET_ITEM(state, 7));
    if (max_in_flight == -1 && PyErr_Occurred())
        return NULL;
    if (!PyDict_CheckExact(topics) || (sticky != Py_None && (!PyDict_CheckExact(sticky) ||
                                                              !PyDict_CheckExact(key_hashes))))
        Py_RETURN_NONE;
    PyObject *info = PyDict_GetItemWithError(topics, topic);
    if (info == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;                    /* metadata to fetch: Python's */
    }
    Py_INCREF(info);
    PyObject *res = NULL;
    long long num_partitions, big, p;
    int r;
    if ((r = long_slot(info, &num_partitions_ref, &num_partitions)) != 0 ||
            (r = choose(topic, key, partition, sticky, key_hashes, num_partitions, &p)) != 0 ||
            (r = long_attr(meta, s_big_record, &big)) != 0)
        goto declined;
    Py_ssize_t size = (value == Py_None ? 0 : PyBytes_GET_SIZE(value)) +
        (key == Py_None ? 0 : PyBytes_GET_SIZE(key));
    if (size > big)
        goto declined;                     /* its exact size is checked there */
    PyObject *no_wait = Py_False;
    PyObject *got = PyObject_Vectorcall(acquire, &no_wait, 1, NULL);
    if (got == NULL)
        goto out;
    int taken = got == Py_True;
    Py_DECREF(got);
    if (!taken)
        goto declined;                     /* the I/O thread has it: send() waits there */
    res = add_locked(io, ready, max_in_flight, info, p, size, key, value);
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);         /* released whatever the add did */
    PyObject *released = PyObject_Vectorcall(release, NULL, 0, NULL);
    if (released == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        Py_CLEAR(res);
        goto out;
    }
    Py_DECREF(released);
    PyErr_Restore(type, exc, tb);
    goto out;
declined:
    if (r >= 0)
        res = Py_NewRef(Py_None);
out:
    Py_DECREF(info);
    return res;
}
