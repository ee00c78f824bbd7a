/* mq.log._crecords.take_batches -- a tailing consumer's read in one call.
 *
 * A consumer caught up with its partition reads, at each poll, the few batches the broker has
 * just published at the end of the active segment. The Python path (mq/log/reader.py's read,
 * RecordBatch, txnindex.is_visible, validate, records, the fetcher's Record) costs some 20 us
 * of calls for one record; this walks the same bytes in C: batch headers, the CRC-32C, the
 * records section, and the public records (mq.Record) a poll returns.
 *
 * It takes only what the Python path would return unchanged: plain (uncompressed, non-control)
 * RecordBatch v2 batches with sane headers. At anything else -- a control batch, a compressed
 * or malformed batch, a CRC mismatch, records that do not decode -- it stops before that batch
 * and returns what it took; the caller reads on from there with the Python path, which stays
 * the reference: it skips what it must and raises what it must (tests/unit/log/
 * test_take_batches.py holds the two to the same output).
 *
 * Bounds: a byte of buf is read only below `end` (<= len(buf)); a batch is used only whole
 * below `end`.
 */
#include "_crecords.h"

#define BATCH_OVERHEAD 61         /* RecordBatch v2 header: the records section starts here */
#define LOG_OVERHEAD 12           /* base offset + batch length */
#define MIN_BATCH_LENGTH 49       /* BATCH_OVERHEAD - LOG_OVERHEAD */
#define CRC_FROM 21               /* the CRC covers the attributes to the end */
#define ATTR_CODEC 0x07
#define ATTR_TIMESTAMP_TYPE 0x08
#define ATTR_CONTROL 0x20
#define ATTR_UNUSED (~0x7F)

enum { STOP_END, STOP_BUDGET, STOP_BOUND, STOP_OTHER };

/* ---- CRC-32C (Castagnoli), as the crc32c package computes it ---- */

static uint32_t crc_table[256];
static int crc_hw = -1;           /* -1: not decided yet */

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        crc_table[i] = c;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    crc_hw = __builtin_cpu_supports("sse4.2");
#else
    crc_hw = 0;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw(const unsigned char *p, size_t n)
{
    uint64_t c = 0xFFFFFFFFu;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n; p++, n--)
        c32 = __builtin_ia32_crc32qi(c32, *p);
    return ~c32;
}
#endif

uint32_t
mq_crc32c(const unsigned char *p, size_t n)
{
    if (crc_hw < 0)
        crc_init();
#if defined(__x86_64__) && defined(__GNUC__)
    if (crc_hw)
        return crc32c_hw(p, n);
#endif
    uint32_t c = 0xFFFFFFFFu;
    for (; n; p++, n--)
        c = crc_table[(c ^ *p) & 0xFF] ^ (c >> 8);
    return ~c;
}

const char mq_take_batches_doc[] =
"take_batches(buf, start, end, offset, bound, max_bytes, check_crc, topic, partition,\n"
"             record_type) -> (records, position, offset, stop)\n\n"
"The public records (record_type, a named tuple: topic, partition, offset, timestamp,\n"
"timestamp_type, key, value, headers) of offsets in [offset, bound) from the whole plain\n"
"batches of buf (a 1-D memoryview of format 'B') between byte start, where a batch starts,\n"
"and end; at least one batch, and no more once max_bytes of batches are taken. Keys and\n"
"values are slices of buf. Returns the records, the position after the last batch taken, the\n"
"offset after it, and why it stopped: 0 no whole batch left before end, 1 max_bytes, 2 a\n"
"batch reaching bound, 3 a batch it leaves to the Python path (control, compressed,\n"
"malformed, CRC mismatch with check_crc).";

/* The records of offsets in [*offset, bound) of the whole plain batches of view (whose object
 * is mv) between start and end, as take_batches documents; *pos and *offset move past what was
 * taken, *stop says why it stopped. A new list, or NULL with an exception. */
static PyObject *
take_core(PyObject *mv, const Py_buffer *view, Py_ssize_t start, Py_ssize_t end,
          long long *offset_io, long long bound, Py_ssize_t max_bytes, int check_crc,
          PyObject *topic, PyObject *partition, PyObject *record_type, Py_ssize_t *pos_out,
          int *stop_out)
{
    PyObject *out = NULL, *tstypes[2] = {NULL, NULL};
    int stop = STOP_END;
    long long offset = *offset_io;
    if ((out = PyList_New(0)) == NULL ||
            (tstypes[0] = PyLong_FromLong(0)) == NULL ||
            (tstypes[1] = PyLong_FromLong(1)) == NULL)
        goto fail;
    const unsigned char *p = (const unsigned char *)view->buf;
    PublicRecords pub = {(PyTypeObject *)record_type, topic, partition, NULL, offset, bound};
    Py_ssize_t pos = start, taken = 0;
    for (;;) {
        if (end - pos < BATCH_OVERHEAD) {
            stop = end - pos >= 17 && (be32(p + pos + 8) < MIN_BATCH_LENGTH || p[pos + 16] != 2)
                   ? STOP_OTHER : STOP_END;       /* a frame that cannot start a batch */
            break;
        }
        const unsigned char *h = p + pos;
        int64_t base = be64(h);
        int32_t length = be32(h + 8);
        if (length < MIN_BATCH_LENGTH || h[16] != 2) {
            stop = STOP_OTHER;
            break;
        }
        Py_ssize_t size = LOG_OVERHEAD + (Py_ssize_t)length;
        if (size > end - pos)
            break;                                  /* not whole before end */
        int16_t attrs = be16(h + 21);
        int32_t last_delta = be32(h + 23), count = be32(h + 57);
        int64_t last;
        if ((attrs & (ATTR_CODEC | ATTR_CONTROL | ATTR_UNUSED)) || last_delta < 0 || count < 0
                || __builtin_add_overflow(base, (int64_t)last_delta, &last)) {
            stop = STOP_OTHER;
            break;
        }
        if (last >= bound) {
            stop = STOP_BOUND;                      /* the Python path cuts at the bound */
            break;
        }
        if (taken > 0 && size > max_bytes - taken) {
            stop = STOP_BUDGET;
            break;
        }
        if (check_crc &&
                mq_crc32c(h + CRC_FROM, (size_t)(size - CRC_FROM)) != (uint32_t)be32(h + 17)) {
            stop = STOP_OTHER;
            break;
        }
        if (last >= offset) {
            Py_ssize_t before = PyList_GET_SIZE(out);
            pub.timestamp_type = tstypes[(attrs & ATTR_TIMESTAMP_TYPE) != 0];
            if (mq_decode_section(out, -1, mv, p, pos + BATCH_OVERHEAD, pos + size, base,
                                  be64(h + 27), (attrs & ATTR_TIMESTAMP_TYPE) != 0,
                                  be64(h + 35), count, NULL, &pub) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError))
                    goto fail;
                PyErr_Clear();                      /* malformed: the Python path raises */
                if (PyList_SetSlice(out, before, PyList_GET_SIZE(out), NULL) < 0)
                    goto fail;
                stop = STOP_OTHER;
                break;
            }
            offset = last + 1;
        }
        pos += size;
        taken += size;
        if (taken >= max_bytes) {
            stop = pos < end ? STOP_BUDGET : STOP_END;
            break;
        }
    }
    Py_DECREF(tstypes[0]);
    Py_DECREF(tstypes[1]);
    *offset_io = offset;
    *pos_out = pos;
    *stop_out = stop;
    return out;

fail:
    Py_XDECREF(out);
    Py_XDECREF(tstypes[0]);
    Py_XDECREF(tstypes[1]);
    return NULL;
}

static int
check_record_type(PyObject *record_type)
{
    if (!PyType_Check(record_type) ||
            !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return -1;
    }
    return 0;
}

PyObject *
mq_take_batches(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *mv, *topic, *partition, *record_type;
    Py_ssize_t start, end, max_bytes;
    long long offset, bound;
    int check_crc;
    if (!PyArg_ParseTuple(args, "O!nnLLnpOOO:take_batches", &PyMemoryView_Type, &mv, &start,
                          &end, &offset, &bound, &max_bytes, &check_crc, &topic, &partition,
                          &record_type))
        return NULL;
    if (check_record_type(record_type) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *res = NULL;
    if (start < 0 || end > view.len || start > end) {
        PyErr_Format(PyExc_ValueError, "window [%zd, %zd) is not within the %zd bytes of buf",
                     start, end, view.len);
    } else {
        Py_ssize_t pos;
        int stop;
        PyObject *out = take_core(mv, &view, start, end, &offset, bound, max_bytes, check_crc,
                                  topic, partition, record_type, &pos, &stop);
        if (out != NULL)
            res = Py_BuildValue("(NnLi)", out, pos, offset, stop);
    }
    PyBuffer_Release(&view);
    return res;
}


/* ---- check_batch: a client's batch at the broker's append ---- */

const char mq_check_batch_doc[] =
"check_batch(buf, base_offset, leader_epoch, now_ms, max_bytes, after_max_ms)\n"
"    -> (batch_length, records_count, last_offset_delta, max_timestamp, producer_id,\n"
"        producer_epoch, base_sequence, attributes) | None\n\n"
"A client's batch, the whole of the writable buffer buf, checked as PartitionLog.append\n"
"checks it on a CreateTime topic without message.timestamp.before.max.ms, then stamped with\n"
"base_offset and leader_epoch (fields the CRC does not cover). The checks: one RecordBatch v2\n"
"of exactly len(buf) bytes, at most max_bytes; its CRC-32C; a known codec and no unused\n"
"attribute bits; not a control batch; a record count of last offset delta + 1; timestamps\n"
"not below -1 and the largest at most after_max_ms ahead of now_ms (INT64_MAX: unlimited);\n"
"with a producer id, a base sequence and an epoch >= 0. Returns the header's facts, or None,\n"
"with buf untouched, when a check fails: the Python path then says why.";

int
mq_check_stamp(unsigned char *h, Py_ssize_t n, int64_t base_offset, int32_t leader_epoch,
               int64_t now_ms, Py_ssize_t max_bytes, int64_t after_max, BatchFacts *facts)
{
    if (n < BATCH_OVERHEAD || n > max_bytes || h[16] != 2 ||
            (Py_ssize_t)be32(h + 8) != n - LOG_OVERHEAD)
        return -1;
    int16_t attrs = be16(h + 21);
    int32_t last_delta = be32(h + 23), count = be32(h + 57), base_seq = be32(h + 53);
    int16_t epoch = be16(h + 51);
    int64_t first_ts = be64(h + 27), max_ts = be64(h + 35), pid = be64(h + 43);
    int64_t ahead;
    if ((attrs & (ATTR_CONTROL | ATTR_UNUSED)) || (attrs & ATTR_CODEC) > 4 || count <= 0 ||
            last_delta != count - 1 || first_ts < -1 || max_ts < -1 ||
            (after_max != INT64_MAX && (__builtin_sub_overflow(max_ts, now_ms, &ahead) ||
                                        ahead > after_max)) ||
            (pid >= 0 && (base_seq < 0 || epoch < 0)))
        return -1;
    if (mq_crc32c(h + CRC_FROM, (size_t)(n - CRC_FROM)) != (uint32_t)be32(h + 17))
        return -1;
    for (int i = 0; i < 8; i++)                     /* baseOffset, big-endian */
        h[i] = (unsigned char)((uint64_t)base_offset >> (56 - 8 * i));
    for (int i = 0; i < 4; i++)                     /* partitionLeaderEpoch */
        h[12 + i] = (unsigned char)((uint32_t)leader_epoch >> (24 - 8 * i));
    facts->count = count;
    facts->last_delta = last_delta;
    facts->max_ts = max_ts;
    facts->pid = pid;
    facts->epoch = epoch;
    facts->base_seq = base_seq;
    facts->attrs = attrs;
    return 0;
}

PyObject *
mq_check_batch(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer view;
    long long base_offset, now_ms, after_max;
    int leader_epoch;
    Py_ssize_t max_bytes;
    BatchFacts f;
    if (!PyArg_ParseTuple(args, "w*LiLnL:check_batch", &view, &base_offset, &leader_epoch,
                          &now_ms, &max_bytes, &after_max))
        return NULL;
    PyObject *res;
    if (mq_check_stamp((unsigned char *)view.buf, view.len, base_offset, leader_epoch, now_ms,
                       max_bytes, after_max, &f) < 0)
        res = Py_NewRef(Py_None);
    else
        res = Py_BuildValue("(niiLLiii)", view.len - LOG_OVERHEAD, f.count, f.last_delta,
                            (long long)f.max_ts, (long long)f.pid, (int)f.epoch, f.base_seq,
                            (int)f.attrs);
    PyBuffer_Release(&view);
    return res;
}


/* ---- tail_take: a caught-up consumer's poll, from the published state to its records ---- */

enum { TAIL_EMPTY, TAIL_TOOK, TAIL_PYTHON };

#define META_VERSION_AT 32        /* mq.protocol.state: the header's metadata version */
#define SLOT_FIELDS 7             /* after the slot's sequence: high watermark, last stable
                                     offset, log start, active segment base, high watermark's
                                     position, segment generation, log end offset */

const char mq_tail_take_doc[] =
"tail_take(region, slot_base, meta_version, generation, segment_base, view, mapped, fd,\n"
"          position, offset, remap_at, max_bytes, check_crc, topic, partition, record_type)\n"
"    -> (status, seq, records, position, offset)\n\n"
"A caught-up read_uncommitted consumer's take from one partition: the slot at slot_base of\n"
"the broker's state region (mq.protocol.state) read under its seqlock, then, if the high\n"
"watermark passed offset, take_batches over the new bytes of the segment the last read ended\n"
"in, at byte position: from view (the segment's map, mapped bytes) below mapped, else from\n"
"one pread of fd of at most max_bytes. status 0: nothing readable past offset yet, seq is the\n"
"slot's sequence to sleep on (whatever segment_base and the rest say: a reader without a\n"
"segment passes -1); 1: records taken (maybe none, of batches below offset), with the\n"
"position and offset after them; 2: the Python path must read (the topics changed, the\n"
"segment rolled or the set changed, a reset is due, the readable end passed remap_at, or\n"
"the next batch is one take_batches leaves to it).";

PyObject *
mq_tail_take(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *region, *view_obj, *topic, *partition, *record_type;
    Py_ssize_t slot_base, mapped, position, max_bytes;
    long long meta_version, generation, segment_base, offset, remap_at;
    int fd, check_crc;
    if (!PyArg_ParseTuple(args, "OnLLLOninLLnpOOO:tail_take", &region, &slot_base,
                          &meta_version, &generation, &segment_base, &view_obj, &mapped, &fd,
                          &position, &offset, &remap_at, &max_bytes, &check_crc, &topic,
                          &partition, &record_type))
        return NULL;
    if (check_record_type(record_type) < 0)
        return NULL;
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return Py_BuildValue("(iLOnL)", TAIL_PYTHON, 0LL, Py_None, position, offset);
#else
    Py_buffer rv;
    if (PyObject_GetBuffer(region, &rv, PyBUF_SIMPLE) < 0)
        return NULL;
    if (slot_base < META_VERSION_AT + 8 || slot_base % 8 != 0 ||
            slot_base > rv.len - 8 * (SLOT_FIELDS + 1)) {
        PyBuffer_Release(&rv);
        PyErr_Format(PyExc_ValueError, "slot at %zd is outside the region", slot_base);
        return NULL;
    }
    const unsigned char *r = (const unsigned char *)rv.buf;
    const int64_t *seqp = (const int64_t *)(r + slot_base);
    int64_t seq, f[SLOT_FIELDS];
    for (;;) {                                      /* the seqlock read (StateReader.snapshot) */
        seq = __atomic_load_n(seqp, __ATOMIC_ACQUIRE);
        if (seq & 1)
            continue;                               /* being written */
        for (int i = 0; i < SLOT_FIELDS; i++)
            f[i] = __atomic_load_n(seqp + 1 + i, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seqp, __ATOMIC_RELAXED) == seq)
            break;
    }
    int64_t meta = __atomic_load_n((const int64_t *)(r + META_VERSION_AT), __ATOMIC_ACQUIRE);
    PyBuffer_Release(&rv);
    int64_t hw = f[0], log_start = f[2], active_base = f[3], hw_position = f[4],
            gen = f[5], log_end = f[6];
    if (meta != meta_version || hw < 0 || offset < log_start || offset > log_end)
        return Py_BuildValue("(iLOnL)", TAIL_PYTHON, (long long)seq, Py_None, position, offset);
    if (offset >= hw)             /* whatever the segments: nothing to read, sleep on seq */
        return Py_BuildValue("(iLOnL)", TAIL_EMPTY, (long long)seq, Py_None, position, offset);
    if (gen != generation || active_base != segment_base || position >= hw_position ||
            hw_position >= remap_at)
        return Py_BuildValue("(iLOnL)", TAIL_PYTHON, (long long)seq, Py_None, position, offset);

    PyObject *mv, *data = NULL;
    Py_ssize_t start, end, shift;
    if (position < mapped && view_obj != Py_None) {
        Py_INCREF(view_obj);
        mv = view_obj;
        start = position;
        end = hw_position < mapped ? (Py_ssize_t)hw_position : mapped;
        shift = 0;
    } else {
        Py_ssize_t want = (Py_ssize_t)hw_position - position;
        if (want > max_bytes)
            want = max_bytes;
        if ((data = PyBytes_FromStringAndSize(NULL, want)) == NULL)
            return NULL;
        ssize_t got = pread(fd, PyBytes_AS_STRING(data), (size_t)want, (off_t)position);
        if (got != want) {                          /* an error or a short file: Python says */
            Py_DECREF(data);
            return Py_BuildValue("(iLOnL)", TAIL_PYTHON, (long long)seq, Py_None, position,
                                 offset);
        }
        mv = PyMemoryView_FromObject(data);
        Py_DECREF(data);
        if (mv == NULL)
            return NULL;
        start = 0;
        end = want;
        shift = position;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(mv);
        return NULL;
    }
    PyObject *res = NULL;
    if (end > view.len) {
        PyErr_Format(PyExc_ValueError, "mapped %zd bytes, the view has %zd", end, view.len);
    } else {
        Py_ssize_t pos;
        int stop;
        long long next = offset;
        PyObject *out = take_core(mv, &view, start, end, &next, hw, max_bytes, check_crc, topic,
                                  partition, record_type, &pos, &stop);
        if (out != NULL) {
            if (pos == start) {                     /* nothing taken: the Python path reads */
                Py_DECREF(out);
                res = Py_BuildValue("(iLOnL)", TAIL_PYTHON, (long long)seq, Py_None, position,
                                    offset);
            } else {
                res = Py_BuildValue("(iLNnL)", TAIL_TOOK, (long long)seq, out, shift + pos,
                                    next);
            }
        }
    }
    PyBuffer_Release(&view);
    Py_DECREF(mv);
    return res;
#endif
}


/* ---- tail_wait_take: the caught-up poll's sleep and its take after the wake-up ---- */

const char mq_tail_wait_take_doc[] =
"tail_wait_take(wait, wait_args, takes) -> (woken, taken)\n\n"
"A caught-up consumer's sleep and the take that follows it, with no Python frame between the\n"
"wake-up and the records: wait(*wait_args) (mq.protocol._futex.wait_any, through the\n"
"consumer's seam) returns the index of the word woken; when it is a partition's (0 <= woken <\n"
"len(takes)), taken is tail_take(*takes[woken]) (the arguments of that partition's last take,\n"
"which found nothing), run with the garbage collector paused as the Python caller runs it.\n"
"Else taken is None.";

PyObject *
mq_tail_wait_take(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "tail_wait_take(wait, wait_args: tuple, takes: list)");
        return NULL;
    }
    PyObject *got = PyObject_Call(args[0], args[1], NULL);
    if (got == NULL)
        return NULL;
    long woken = PyLong_AsLong(got);
    if (woken == -1 && PyErr_Occurred()) {
        Py_DECREF(got);
        return NULL;
    }
    PyObject *takes = args[2];
    if (woken < 0 || woken >= PyList_GET_SIZE(takes) ||
            !PyTuple_Check(PyList_GET_ITEM(takes, woken)))
        return Py_BuildValue("(NO)", got, Py_None);
    PyObject *take = Py_NewRef(PyList_GET_ITEM(takes, woken));
    int collecting = PyGC_Disable();         /* a large take creates many objects */
    PyObject *taken = mq_tail_take(module, take);
    if (collecting)
        PyGC_Enable();
    Py_DECREF(take);
    if (taken == NULL) {
        Py_DECREF(got);
        return NULL;
    }
    return Py_BuildValue("(NN)", got, taken);
}
