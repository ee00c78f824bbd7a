/* mq.log._crecords.append_plain -- the broker's append of a client's plain batch in one call.
 *
 * PartitionLog.append, LogSegment.append and the roll rule (mq/log/log.py, segment.py,
 * policy.py) cost some 35 us of Python calls for one small batch at a low rate, where every
 * call runs with cold caches. This does the common case of the same work in C, on the same
 * Python objects, which stay the only state: a plain batch (no producer id) from a client, on
 * a CreateTime topic without message.timestamp.before.max.ms, into the active segment with its
 * files and indexes open, when neither a roll, nor an index entry, nor a new leader epoch is
 * due. It checks and stamps the batch (mq_check_stamp), writes it with pwrite at the segment's
 * size, and then moves the segment's and the log's fields as LogSegment.append and
 * PartitionLog.append do.
 *
 * Anything else returns None before the buffer or a file is touched, and the Python path does
 * the append; it stays the reference (tests/unit/log/test_append_plain.py holds the two to the
 * same files and state). A failed write is cut off again, as LogSegment.append does (the
 * segment is torn if even that fails), and raised as OSError for PartitionLog.append to count.
 */
#include "_crecords.h"

#include <errno.h>
#include <unistd.h>

#define BATCH_HEAD 61             /* RecordBatch v2 header */
#define INT32_MAX_ 2147483647LL

static PyObject *s_closed, *s_offline, *s_config, *s_ts_type, *s_before_max, *s_after_max,
    *s_max_bytes, *s_segment_bytes, *s_segment_ms, *s_interval, *s_segments, *s_next_offset,
    *s_size, *s_base_offset, *s_first_ts, *s_jitter, *s_since_index, *s_max_ts_so_far,
    *s_max_ts_offset, *s_torn, *s_read_only, *s_files, *s_fd, *s_offset_index, *s_time_index,
    *s_entries, *s_length, *s_entry_size, *s_leader_epochs, *s_hw_follows, *s_hw,
    *s_create_time, *s_producers, *s_open, *s_swap_count, *s_shape, *s_generation,
    *s_log_start, *s_log, *s_min_free, *s_refusing, *s_clock, *s_next_refresh, *s_free,
    *s_admitted, *s_produced_records, *s_produced_bytes;

static int
intern_names(void)
{
    if (s_produced_bytes != NULL)
        return 0;
    static const MqName names[] = {
        {&s_closed, "closed"}, {&s_offline, "offline"}, {&s_config, "config"},
        {&s_ts_type, "message_timestamp_type"},
        {&s_before_max, "message_timestamp_before_max_ms"},
        {&s_after_max, "message_timestamp_after_max_ms"},
        {&s_max_bytes, "max_message_bytes"}, {&s_segment_bytes, "segment_bytes"},
        {&s_segment_ms, "segment_ms"}, {&s_interval, "index_interval_bytes"},
        {&s_segments, "segments"}, {&s_next_offset, "_next_offset"}, {&s_size, "size"},
        {&s_base_offset, "base_offset"}, {&s_first_ts, "first_batch_timestamp"},
        {&s_jitter, "rolling_jitter_ms"}, {&s_since_index, "bytes_since_last_index_entry"},
        {&s_max_ts_so_far, "max_timestamp_so_far"},
        {&s_max_ts_offset, "offset_of_max_timestamp_so_far"}, {&s_torn, "torn"},
        {&s_read_only, "read_only"}, {&s_files, "_files"}, {&s_fd, "_fd"},
        {&s_offset_index, "_offset_index"}, {&s_time_index, "_time_index"},
        {&s_entries, "entries"}, {&s_length, "_length"}, {&s_entry_size, "_entry_size"},
        {&s_leader_epochs, "leader_epochs"}, {&s_hw_follows, "high_watermark_follows_log_end"},
        {&s_hw, "high_watermark"}, {&s_create_time, "CreateTime"},
        /* publish_slot's */
        {&s_producers, "producers"}, {&s_open, "_open"}, {&s_swap_count, "swap_count"},
        {&s_shape, "shape"}, {&s_generation, "generation"},
        {&s_log_start, "log_start_offset"},
        /* produce_plain's */
        {&s_log, "log"}, {&s_min_free, "min_free_bytes"}, {&s_refusing, "refusing"},
        {&s_clock, "_clock"}, {&s_next_refresh, "_next_refresh"}, {&s_free, "_free"},
        {&s_admitted, "_admitted"}, {&s_produced_records, "produced_records"},
        {&s_produced_bytes, "produced_bytes"},
    };
    return mq_intern(names, sizeof names / sizeof names[0]);
}

/* obj.name as a C integer: 0, 1 when it is None (*out untouched), or -1 with an error set. */
static int
get_int(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    if (v == Py_None) {
        Py_DECREF(v);
        return 1;
    }
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* obj.name's truth: 0 or 1, or -1 with an error set. */
static int
get_bool(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int
set_int(PyObject *obj, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

/* Whether the open index `index` (None: not open) is full, as OffsetIndex.is_full (reserve 0)
 * and TimeIndex.is_full (reserve 1: the slot kept for the entry written at roll) say:
 * 0 or 1, 2 when it is not open, -1 with an error set. */
static int
index_full(PyObject *index, long long reserve)
{
    if (index == Py_None)
        return 2;
    long long entries, length, entry_size;
    if (get_int(index, s_entries, &entries) || get_int(index, s_length, &length) ||
            get_int(index, s_entry_size, &entry_size))
        return -1;
    return entry_size <= 0 || entries >= length / entry_size - reserve;
}

/* The segment's files open for an append: its .log descriptor (>= 0), -2 when they are not
 * all open or an index is full (the Python path opens them, or rolls), -1 with an error. */
static int
open_files(PyObject *seg)
{
    PyObject *files = PyObject_GetAttr(seg, s_files);
    if (files == NULL)
        return -1;
    long long fd = -1;
    int res = -1, full;
    PyObject *oi = PyObject_GetAttr(files, s_offset_index), *ti = NULL;
    if (oi == NULL || (ti = PyObject_GetAttr(files, s_time_index)) == NULL)
        goto done;
    if (get_int(files, s_fd, &fd) < 0)
        goto done;
    res = -2;
    if (fd < 0 || fd > INT32_MAX_)
        goto done;
    if ((full = index_full(oi, 0)) != 0 || (full = index_full(ti, 1)) != 0) {
        res = full < 0 ? -1 : -2;
        goto done;
    }
    res = (int)fd;
done:
    Py_DECREF(files);
    Py_XDECREF(oi);
    Py_XDECREF(ti);
    return res;
}

/* pwrite every byte of p[0:n] at position, the GIL released (as os.pwrite does): 0, or an
 * errno (a write of nothing counts as ENOSPC, as mq.log.diskio.write_fully says). */
static int
write_fully(int fd, const unsigned char *p, Py_ssize_t n, long long position)
{
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (n > 0) {
        ssize_t w = pwrite(fd, p, (size_t)n, (off_t)position);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            err = w < 0 ? errno : ENOSPC;
            break;
        }
        p += w;
        n -= w;
        position += w;
    }
    Py_END_ALLOW_THREADS
    return err;
}

const char mq_append_plain_doc[] =
"append_plain(log, batch, leader_epoch, now_ms)\n"
"    -> (first_offset, last_offset, max_timestamp, -1, records_count, size) | None\n\n"
"PartitionLog.append of a client's plain batch (the writable buffer batch, whole) to log's\n"
"active segment, done in C on log's own objects; None, with nothing touched, when the case\n"
"is not the common one (a producer id, a roll, an index entry or a new leader epoch due,\n"
"files not open, a topic setting, a batch the checks refuse): the Python path then appends.\n"
"Raises OSError when the write fails, after cutting off what reached the file (or marking\n"
"the segment torn).";

PyObject *
mq_append_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append_plain takes 4 arguments");
        return NULL;
    }
    PyObject *plog = args[0], *batch = args[1];
    long long leader_epoch = PyLong_AsLongLong(args[2]), now_ms = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred() || intern_names() < 0)
        return NULL;
    if (leader_epoch < 0 || leader_epoch > INT32_MAX_)
        Py_RETURN_NONE;
    /* A bytearray, or a writable memoryview of bytes (PartitionLog._checked_in_c's rule). */
    if (!(PyByteArray_CheckExact(batch) ||
          (PyMemoryView_Check(batch) && !PyMemoryView_GET_BUFFER(batch)->readonly &&
           PyMemoryView_GET_BUFFER(batch)->format != NULL &&
           strcmp(PyMemoryView_GET_BUFFER(batch)->format, "B") == 0)))
        Py_RETURN_NONE;

    PyObject *config = NULL, *segments = NULL, *seg = NULL, *epochs = NULL, *res = NULL;
    Py_buffer view = {0};
    int r;
    long long before_max, after_max, max_bytes, segment_bytes, segment_ms, interval;
    long long next_offset = -1, size, seg_base, first_ts, jitter, since, max_so_far,
        max_offset;

    /* The log writable (PartitionLog._check_writable) and the topic's settings. */
    if ((r = get_bool(plog, s_closed)) != 0)
        goto out;
    PyObject *offline = PyObject_GetAttr(plog, s_offline);
    if (offline == NULL)
        goto out;
    Py_DECREF(offline);
    if (offline != Py_None)
        goto none;
    if ((config = PyObject_GetAttr(plog, s_config)) == NULL)
        goto out;
    PyObject *ts_type = PyObject_GetAttr(config, s_ts_type);
    if (ts_type == NULL)
        goto out;
    r = PyUnicode_Check(ts_type) && PyUnicode_Compare(ts_type, s_create_time) == 0;
    Py_DECREF(ts_type);
    if (!r)
        goto none;
    if (get_int(config, s_before_max, &before_max) || get_int(config, s_after_max, &after_max) ||
            get_int(config, s_max_bytes, &max_bytes) ||
            get_int(config, s_segment_bytes, &segment_bytes) ||
            get_int(config, s_segment_ms, &segment_ms) ||
            get_int(config, s_interval, &interval))
        goto out;
    if (before_max != INT64_MAX)
        goto none;

    /* The batch's header, read before anything is decided: a producer's batch (its state)
     * and one too short to be a batch are the Python path's. */
    if (PyObject_GetBuffer(batch, &view, PyBUF_WRITABLE) < 0)
        goto out;
    unsigned char *h = (unsigned char *)view.buf;
    const Py_ssize_t n = view.len;
    if (n < BATCH_HEAD || be64(h + 43) >= 0)
        goto none;
    const int64_t batch_max_ts = be64(h + 35);
    const int32_t last_delta = be32(h + 23);

    /* The active segment, and its facts the roll rule and the append read. */
    if ((segments = PyObject_GetAttr(plog, s_segments)) == NULL)
        goto out;
    if (!PyList_Check(segments) || PyList_GET_SIZE(segments) == 0)
        goto none;
    seg = Py_NewRef(PyList_GET_ITEM(segments, PyList_GET_SIZE(segments) - 1));
    if ((r = get_bool(seg, s_read_only)) != 0 || (r = get_bool(seg, s_torn)) != 0)
        goto out;
    if ((r = get_int(seg, s_next_offset, &next_offset)) != 0)
        goto out;                           /* None: not known yet (the Python path scans) */
    if (get_int(seg, s_size, &size) || get_int(seg, s_base_offset, &seg_base) ||
            get_int(seg, s_first_ts, &first_ts) || get_int(seg, s_jitter, &jitter) ||
            get_int(seg, s_since_index, &since) ||
            get_int(seg, s_max_ts_so_far, &max_so_far) ||
            get_int(seg, s_max_ts_offset, &max_offset))
        goto out;
    const long long last_offset = next_offset + last_delta;
    /* Kafka's roll rule (mq.log.policy.roll_reason), each condition left to the Python path;
     * and an index entry due (LogSegment._index_entry). */
    if (size > segment_bytes - n)
        goto none;
    if (size > 0 && (first_ts < 0 || batch_max_ts - first_ts > segment_ms - jitter))
        goto none;
    if (last_delta < 0 || last_offset - seg_base < 0 || last_offset - seg_base > INT32_MAX_)
        goto none;
    if (since > interval)
        goto none;
    /* A new leader epoch is written to the epoch file (LeaderEpochCache.assign). */
    if ((epochs = PyObject_GetAttr(plog, s_leader_epochs)) == NULL)
        goto out;
    PyObject *entries = PyObject_GetAttr(epochs, s_entries);
    if (entries == NULL)
        goto out;
    long long latest = -1;
    r = 0;
    if (!PyList_Check(entries)) {
        r = 1;
    } else if (PyList_GET_SIZE(entries) > 0) {
        PyObject *last = PyList_GET_ITEM(entries, PyList_GET_SIZE(entries) - 1);
        if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) < 1)
            r = 1;
        else
            latest = PyLong_AsLongLong(PyTuple_GET_ITEM(last, 0));
    }
    Py_DECREF(entries);
    if (PyErr_Occurred())
        goto out;
    if (r || leader_epoch > latest)
        goto none;
    int fd = open_files(seg);
    if (fd == -1)
        goto out;
    if (fd < 0)
        goto none;

    BatchFacts f;
    if (mq_check_stamp(h, n, next_offset, (int32_t)leader_epoch, now_ms,
                       max_bytes > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : (Py_ssize_t)max_bytes,
                       after_max, &f) < 0 || f.pid >= 0)
        goto none;                          /* refused: the Python path says why */
    int err = write_fully(fd, h, n, size);
    if (err) {
        /* LogSegment._truncate_back: cut off what reached the file; torn if that fails. */
        int cut;
        Py_BEGIN_ALLOW_THREADS
        cut = ftruncate(fd, (off_t)size);
        Py_END_ALLOW_THREADS
        if (cut < 0 && PyObject_SetAttr(seg, s_torn, Py_True) < 0)
            goto out;
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto out;
    }
    /* Stored: now the segment's and the log's fields move (LogSegment.append,
     * PartitionLog.append). */
    if ((size == 0 && set_int(seg, s_first_ts, f.max_ts) < 0) ||
            set_int(seg, s_size, size + n) < 0 ||
            (f.max_ts > max_so_far && (set_int(seg, s_max_ts_so_far, f.max_ts) < 0 ||
                                       set_int(seg, s_max_ts_offset, last_offset) < 0)) ||
            set_int(seg, s_since_index, since + n) < 0 ||
            set_int(seg, s_next_offset, last_offset + 1) < 0)
        goto out;
    if ((r = get_bool(plog, s_hw_follows)) < 0 ||
            (r && set_int(plog, s_hw, last_offset + 1) < 0))
        goto out;
    res = Py_BuildValue("(LLLiin)", next_offset, last_offset, (long long)f.max_ts, -1,
                        (int)f.count, n);
    goto out;

none:
    res = Py_NewRef(Py_None);
out:
    /* r > 0 from a truth test (closed, read-only, torn, next offset unknown): none. */
    if (res == NULL && !PyErr_Occurred())
        res = Py_NewRef(Py_None);
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    Py_XDECREF(config);
    Py_XDECREF(segments);
    Py_XDECREF(seg);
    Py_XDECREF(epochs);
    return res;
}


/* ---- publish_slot: a partition's slot of the broker's state region, written in C ---- */

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#define SLOT_BYTES 64             /* mq.protocol.state: a slot's sequence and its 7 fields */

/* Whether tuple `t` is exactly (a, b, c, d): 1 or 0, -1 with an error set. */
static int
same_shape(PyObject *t, const long long *want)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4)
        return 0;
    for (Py_ssize_t i = 0; i < 4; i++) {
        PyObject *v = PyTuple_GET_ITEM(t, i);
        if (!PyLong_Check(v))
            return 0;
        int overflow;
        long long got = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (got == -1 && PyErr_Occurred())
            return -1;
        if (overflow || got != want[i])
            return 0;
    }
    return 1;
}

const char mq_publish_slot_doc[] =
"publish_slot(region, slot_base, log, part) -> bool\n\n"
"The broker's publication of a partition's state (mq.broker.partitions.PartitionTable.state_of\n"
"and mq.protocol.state.StateWriter.publish) in one call: the slot at slot_base of the writable\n"
"state region written under its seqlock from part (a Partition: its segment-set generation,\n"
"moved when the segment list changed shape) and log (its PartitionLog), then one sleeper on\n"
"the slot's futex word woken. Only for the common case: the high watermark at the log end and\n"
"no transaction open (the readable end is the active segment's end, the last stable offset\n"
"the high watermark). False, with nothing touched, otherwise: the Python path publishes.";

PyObject *
mq_publish_slot(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "publish_slot takes 4 arguments");
        return NULL;
    }
    PyObject *region = args[0], *plog = args[2], *part = args[3];
    Py_ssize_t slot_base = PyLong_AsSsize_t(args[1]);
    if ((slot_base == -1 && PyErr_Occurred()) || intern_names() < 0)
        return NULL;
    PyObject *segments = NULL, *seg = NULL, *producers = NULL, *heap = NULL, *shape = NULL,
        *res = NULL;
    long long hw, log_end, size, active_base, first_base, swaps, log_start, generation;
    int r;
    if ((segments = PyObject_GetAttr(plog, s_segments)) == NULL)
        goto out;
    if (!PyList_Check(segments) || PyList_GET_SIZE(segments) == 0)
        goto declined;
    Py_ssize_t count = PyList_GET_SIZE(segments);
    seg = Py_NewRef(PyList_GET_ITEM(segments, count - 1));
    if (get_int(PyList_GET_ITEM(segments, 0), s_base_offset, &first_base) ||
            get_int(seg, s_base_offset, &active_base) || get_int(seg, s_size, &size) ||
            get_int(plog, s_swap_count, &swaps) || get_int(plog, s_hw, &hw) ||
            get_int(plog, s_log_start, &log_start))
        goto out;
    if ((r = get_int(seg, s_next_offset, &log_end)) != 0)
        goto out;                               /* None: not known yet (a property scans) */
    if (hw < log_end)
        goto declined;                          /* the readable end is in an older place */
    /* No transaction open: ProducerStateManager.first_unstable_offset is None for an empty
     * heap (a non-empty one may hold only closed ones; the property pops those). */
    if ((producers = PyObject_GetAttr(plog, s_producers)) == NULL ||
            (heap = PyObject_GetAttr(producers, s_open)) == NULL)
        goto out;
    if (!PyList_Check(heap) || PyList_GET_SIZE(heap) != 0)
        goto declined;
    if ((shape = PyObject_GetAttr(part, s_shape)) == NULL ||
            get_int(part, s_generation, &generation))
        goto out;
    const long long now_shape[4] = {first_base, active_base, (long long)count, swaps};
    if ((r = same_shape(shape, now_shape)) < 0)
        goto out;

    Py_buffer view;
    if (PyObject_GetBuffer(region, &view, PyBUF_WRITABLE) < 0)
        goto out;
    if (slot_base < 0 || slot_base % 8 != 0 || slot_base > view.len - SLOT_BYTES) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "slot at %zd is outside the region", slot_base);
        goto out;
    }
    if (!r) {                                   /* the shape changed: a new generation */
        PyObject *t = Py_BuildValue("(LLLL)", first_base, active_base, (long long)count,
                                    swaps);
        if (t == NULL || PyObject_SetAttr(part, s_shape, t) < 0 ||
                set_int(part, s_generation, generation + 1) < 0) {
            Py_XDECREF(t);
            PyBuffer_Release(&view);
            goto out;
        }
        Py_DECREF(t);
        generation += 1;
    }
    int64_t *slot = (int64_t *)((char *)view.buf + slot_base);
    const int64_t seq = __atomic_load_n(slot, __ATOMIC_RELAXED);
    const int64_t fields[7] = {hw, hw, log_start, active_base, size, generation, log_end};
    __atomic_store_n(slot, seq + 1, __ATOMIC_RELAXED);         /* odd: being written */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (int i = 0; i < 7; i++)
        __atomic_store_n(slot + 1 + i, fields[i], __ATOMIC_RELAXED);
    __atomic_store_n(slot, seq + 2, __ATOMIC_RELEASE);         /* even: stable */
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)slot, FUTEX_WAKE, 1, NULL, NULL, 0);   /* it wakes the rest */
#endif
    PyBuffer_Release(&view);
    res = Py_NewRef(Py_True);
    goto out;

declined:
    res = Py_NewRef(Py_False);
out:
    if (res == NULL && !PyErr_Occurred())
        res = Py_NewRef(Py_False);              /* r > 0: the segment's next offset unknown */
    Py_XDECREF(segments);
    Py_XDECREF(seg);
    Py_XDECREF(producers);
    Py_XDECREF(heap);
    Py_XDECREF(shape);
    return res;
}


/* ---- produce_plain: the broker's Produce of a plain batch, from its checks to its reply ---- */

/* obj.name += delta, for an int attribute: 0, or -1 with an error set. */
static int
add_int(PyObject *obj, PyObject *name, long long delta)
{
    long long v;
    int r = get_int(obj, name, &v);
    if (r != 0) {
        if (r > 0)
            PyErr_Format(PyExc_TypeError, "%U is None", name);
        return -1;
    }
    return set_int(obj, name, v + delta);
}

/* The free-space guard's admission of n bytes (mq.broker.space.FreeSpaceGuard.admit) when
 * it needs no new reading and leaves the guard as it is: 2 admitted (counted), 1 admitted
 * (the guard is off), 0 for the Python path (a reading due, too little room, refusing), -1
 * with an error set. */
static int
admit_space(PyObject *space, Py_ssize_t n)
{
    long long min_free, free_bytes, admitted;
    int r;
    if ((r = get_int(space, s_min_free, &min_free)) != 0)
        return r < 0 ? -1 : 0;
    if (min_free <= 0)
        return 1;
    if ((r = get_bool(space, s_refusing)) != 0)
        return r < 0 ? -1 : 0;
    PyObject *now = PyObject_CallMethodNoArgs(space, s_clock);
    if (now == NULL)
        return -1;
    PyObject *next = PyObject_GetAttr(space, s_next_refresh);
    if (next == NULL) {
        Py_DECREF(now);
        return -1;
    }
    int due = PyObject_RichCompareBool(now, next, Py_GE);
    Py_DECREF(now);
    Py_DECREF(next);
    if (due != 0)
        return due < 0 ? -1 : 0;
    if (get_int(space, s_free, &free_bytes) || get_int(space, s_admitted, &admitted))
        return PyErr_Occurred() ? -1 : 0;
    if (free_bytes - admitted - n < min_free)
        return 0;
    return set_int(space, s_admitted, admitted + n) < 0 ? -1 : 2;
}

#define PRODUCER_EPOCH_END 53     /* ProduceApis reads the attributes of longer batches */
#define ATTRIBUTES_LOW_AT 22      /* the low byte of the big-endian int16 at 21 */
#define TRANSACTIONAL_BIT 0x10
#define CONTROL_BIT 0x20

const char mq_produce_plain_doc[] =
"produce_plain(by_key, space, touched, topic, partition, batch, leader_epoch, now_ms,\n"
"              request_id, api) -> reply | None\n\n"
"The broker's Produce with acks=1 of a client's plain batch (mq.broker.apis.produce.\n"
"ProduceApis.append) in one call: the topic not internal, the partition found in by_key\n"
"(PartitionTable's (topic, partition) -> Partition), the batch within max.message.bytes, the\n"
"high watermark following the log end, no control or transactional bit, room by the\n"
"free-space guard space without a new reading, then append_plain's append, the partition's\n"
"counters, touched (the set of partitions to publish), and the reply message\n"
"[api, request_id, 0, None, first_offset, log_append_time, log_start_offset]. None, with\n"
"nothing touched, for anything else: the Python path then does it all. A failed write raises\n"
"OSError after the space is counted, as the Python path counts it before its write.";

PyObject *
mq_produce_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyDict_Check(args[0]) || !PySet_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "produce_plain(by_key: dict, space, touched: set, "
                        "topic, partition, batch, leader_epoch, now_ms, request_id, api)");
        return NULL;
    }
    PyObject *by_key = args[0], *space = args[1], *touched = args[2], *topic = args[3],
        *batch = args[5];
    if (intern_names() < 0)
        return NULL;
    if (!PyUnicode_Check(topic) || (PyUnicode_GET_LENGTH(topic) >= 2 &&
                                    PyUnicode_READ_CHAR(topic, 0) == '_' &&
                                    PyUnicode_READ_CHAR(topic, 1) == '_'))
        Py_RETURN_NONE;                         /* an internal topic: refused there */
    PyObject *key = PyTuple_Pack(2, topic, args[4]);
    if (key == NULL)
        return NULL;
    PyObject *part = PyDict_GetItemWithError(by_key, key);
    Py_DECREF(key);
    if (part == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;                         /* unknown: the Python path names it */
    }
    Py_INCREF(part);
    PyObject *plog = NULL, *config = NULL, *res = NULL, *done = NULL;
    Py_ssize_t n = PyObject_Length(batch);
    long long max_bytes, log_start;
    int r, admitted = 0;
    if (n < 0 || (plog = PyObject_GetAttr(part, s_log)) == NULL ||
            (config = PyObject_GetAttr(plog, s_config)) == NULL)
        goto out;
    if ((r = get_int(config, s_max_bytes, &max_bytes)) != 0 || n > max_bytes)
        goto declined;
    if ((r = get_bool(plog, s_hw_follows)) <= 0)
        goto declined;                          /* durable mode holds the reply */
    if (n > PRODUCER_EPOCH_END) {               /* control or transactional: checked there */
        Py_buffer view;
        if (PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE) < 0)
            goto out;
        unsigned char attributes = ((unsigned char *)view.buf)[ATTRIBUTES_LOW_AT];
        PyBuffer_Release(&view);
        if (attributes & (CONTROL_BIT | TRANSACTIONAL_BIT))
            goto declined;
    }
    if ((admitted = admit_space(space, n)) <= 0)
        goto declined;
    PyObject *call[4] = {plog, batch, args[6], args[7]};
    if ((done = mq_append_plain(module, call, 4)) == NULL)
        goto out;                               /* OSError: counted, as there */
    if (done == Py_None) {                      /* declined: uncounted, for the Python path */
        if (admitted == 2 && add_int(space, s_admitted, -(long long)n) < 0)
            goto out;
        goto declined;
    }
    long long first = PyLong_AsLongLong(PyTuple_GET_ITEM(done, 0)),
        last = PyLong_AsLongLong(PyTuple_GET_ITEM(done, 1));
    if (PyErr_Occurred() || add_int(part, s_produced_records, last + 1 - first) < 0 ||
            add_int(part, s_produced_bytes, n) < 0 || PySet_Add(touched, part) < 0 ||
            get_int(plog, s_log_start, &log_start))
        goto out;
    PyObject *api = PyNumber_Index(args[9]);
    if (api == NULL)
        goto out;
    res = Py_BuildValue("[NOiOLOL]", api, args[8], 0, Py_None, first,
                        PyTuple_GET_ITEM(done, 3), log_start);
    goto out;

declined:
    if (!PyErr_Occurred())
        res = Py_NewRef(Py_None);
out:
    Py_DECREF(part);
    Py_XDECREF(plog);
    Py_XDECREF(config);
    Py_XDECREF(done);
    return res;
}
