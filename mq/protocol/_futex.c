/* Futex waits and wakes on words in shared memory (Linux), for consumer wake-ups.
 *
 * The broker's state region (mq/protocol/state.py) gives each partition a 64-bit sequence
 * that changes on every publish; its low 32 bits are the futex word. A caught-up consumer
 * sleeps on the words of the partitions it reads with futex_waitv(2) (Linux 5.16), plus one
 * private word of its own that its heartbeat thread bumps to interrupt the wait; the broker
 * wakes one sleeper per word after each publish (mq/client/consumer.py has the protocol).
 *
 * Optional, like the record codec: without it (or without futex_waitv, ENOSYS) consumers
 * sleep on their POSIX semaphore instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef __linux__
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef __NR_futex_waitv
#if defined(__x86_64__) || defined(__aarch64__)
#define __NR_futex_waitv 449
#endif
#endif
#ifndef FUTEX_32
#define FUTEX_32 2
#endif
#ifndef FUTEX_WAITV_MAX
#define FUTEX_WAITV_MAX 128
struct futex_waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t __reserved;
};
#endif

/* The address of the 4-byte word at `offset` in `obj`'s buffer. The buffer is released at
 * once (a map stays closable): if it is unmapped meanwhile, the syscall says EFAULT. */
static int
word_address(PyObject *obj, Py_ssize_t offset, uint32_t **out)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    if (offset < 0 || offset % 4 != 0 || offset > view.len - 4) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "futex word at %zd is outside the buffer or not "
                     "4-byte aligned", offset);
        return -1;
    }
    *out = (uint32_t *)((char *)view.buf + offset);
    PyBuffer_Release(&view);
    return 0;
}

PyDoc_STRVAR(wake_doc,
"wake(buffer, offset, count=1, private=False) -> int\n\n"
"FUTEX_WAKE up to `count` sleepers on the 32-bit word at `offset` in `buffer` (shared\n"
"between processes unless `private`). Returns how many woke; 0 if the word is unmapped.");

static PyObject *
futex_wake(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offset", "count", "private", NULL};
    PyObject *buffer;
    Py_ssize_t offset;
    int count = 1, private = 0;
    uint32_t *addr;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On|ip", kwlist, &buffer, &offset, &count,
                                     &private))
        return NULL;
    if (word_address(buffer, offset, &addr) < 0)
        return NULL;
    long r = syscall(SYS_futex, addr, FUTEX_WAKE | (private ? FUTEX_PRIVATE_FLAG : 0), count,
                     NULL, NULL, 0);
    if (r < 0) {
        if (errno == EFAULT)
            return PyLong_FromLong(0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(r);
}

PyDoc_STRVAR(wait_any_doc,
"wait_any(buffer, offsets, values, local, local_value, timeout, spin=0.0, passed=None)\n"
"    -> int\n\n"
"Sleep (GIL released) until a sleeper on one of the shared 32-bit words at `offsets` in\n"
"`buffer`, or on the private word at the start of `local`, is woken, or `timeout` seconds\n"
"pass; at most 127 shared words. Each word must still hold its expected value (`values`,\n"
"`local_value`) for the sleep to begin. Returns the index of the word woken (len(offsets)\n"
"for `local`), -1 on timeout, -2 if a word no longer held its value, a signal came or a\n"
"word was unmapped. Raises OSError(ENOSYS) where futex_waitv(2) does not exist.\n\n"
"With `spin` > 0 it first watches the words for up to `spin` seconds without sleeping\n"
"(a busy wait, one CPU at 100%) and returns -2 as soon as one changes: that wake-up costs\n"
"no scheduler round trip, and no sleeper's wake-up was taken. Both buffers stay exported\n"
"while it spins.\n\n"
"With `passed` (a dict), a shared word's wake-up is passed on before the call returns: the\n"
"broker wakes one sleeper per publish, and the one it woke wakes the others. Each shared\n"
"word that was woken or no longer holds its value gets a FUTEX_WAKE of every sleeper, once\n"
"per value: `passed` maps a word's offset to the value last passed on, so two sleepers\n"
"cannot keep waking each other.");

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Watch the words of `w` (their addresses must stay mapped) until one no longer holds its
 * value or `until` (CLOCK_MONOTONIC ns) passes: the index of the changed word, or -1. */
static long
spin_on(const struct futex_waitv *w, Py_ssize_t count, int64_t until)
{
    for (unsigned round = 1;; round++) {
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t now = __atomic_load_n((const uint32_t *)(uintptr_t)w[i].uaddr,
                                           __ATOMIC_ACQUIRE);
            if (now != (uint32_t)w[i].val)
                return (long)i;
        }
        CPU_RELAX();
        if ((round & 63) == 0 && now_ns() >= until)
            return -1;
    }
}

/* After a sleep woken on shared word `woken`: wake every sleeper on each shared word that was
 * woken or changed, once per value (`passed`: offset -> value last passed on). The buffer is
 * exported again for the reads; one closed meanwhile has no sleepers left to pass on to. */
static int
pass_on(PyObject *buffer, const Py_ssize_t *offs, const struct futex_waitv *w, Py_ssize_t n,
        long woken, PyObject *passed)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        if (offs[i] > view.len - 4)
            continue;
        uint32_t *addr = (uint32_t *)((char *)view.buf + offs[i]);
        uint32_t now = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
        if (i != woken && now == (uint32_t)w[i].val)
            continue;
        PyObject *key = PyLong_FromSsize_t(offs[i]);
        PyObject *value = PyLong_FromUnsignedLong(now);
        if (key == NULL || value == NULL) {
            rc = -1;
        } else {
            PyObject *prev = PyDict_GetItemWithError(passed, key);      /* borrowed */
            int same = prev == NULL ? 0 : PyObject_RichCompareBool(prev, value, Py_EQ);
            if ((prev == NULL && PyErr_Occurred()) || same < 0)
                rc = -1;
            else if (!same && (rc = PyDict_SetItem(passed, key, value)) == 0)
                syscall(SYS_futex, addr, FUTEX_WAKE, 0x7FFFFFFF, NULL, NULL, 0);
        }
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    PyBuffer_Release(&view);
    return rc;
}

static PyObject *
futex_wait_any(PyObject *self, PyObject *args)
{
    PyObject *buffer, *offsets, *values, *local, *passed = Py_None;
    unsigned long long local_value;
    double timeout, spin = 0.0;
    struct futex_waitv w[FUTEX_WAITV_MAX];
    Py_ssize_t offs_at[FUTEX_WAITV_MAX];
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOKd|dO", &buffer, &offsets, &values, &local, &local_value,
                          &timeout, &spin, &passed))
        return NULL;
    if (passed != Py_None && !PyDict_Check(passed)) {
        PyErr_SetString(PyExc_TypeError, "passed must be a dict or None");
        return NULL;
    }
    PyObject *offs = PySequence_Fast(offsets, "offsets must be a sequence");
    if (offs == NULL)
        return NULL;
    PyObject *vals = PySequence_Fast(values, "values must be a sequence");
    if (vals == NULL) {
        Py_DECREF(offs);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(offs);
    if (n != PySequence_Fast_GET_SIZE(vals) || n > FUTEX_WAITV_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "offsets and values must be as long, at most 127");
        goto fail;
    }
    memset(w, 0, sizeof(w));
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t *addr;
        Py_ssize_t off = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(offs, i));
        if (off == -1 && PyErr_Occurred())
            goto fail;
        unsigned long long v = PyLong_AsUnsignedLongLongMask(PySequence_Fast_GET_ITEM(vals, i));
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        if (word_address(buffer, off, &addr) < 0)
            goto fail;
        w[i].uaddr = (uint64_t)(uintptr_t)addr;
        w[i].val = v & 0xffffffffu;
        w[i].flags = FUTEX_32;
        offs_at[i] = off;
    }
    {
        uint32_t *addr;
        if (word_address(local, 0, &addr) < 0)
            goto fail;
        w[n].uaddr = (uint64_t)(uintptr_t)addr;
        w[n].val = local_value & 0xffffffffu;
        w[n].flags = FUTEX_32 | FUTEX_PRIVATE_FLAG;
    }
    Py_DECREF(offs);
    Py_DECREF(vals);
#ifdef __NR_futex_waitv
    if (timeout < 0)
        timeout = 0;
    if (timeout > 1e9)
        timeout = 1e9;
    if (spin > 0) {
        /* Read the words directly: both buffers stay exported (mapped) while the GIL is
         * released, so a map closed meanwhile raises BufferError instead of going away. */
        Py_buffer shared, own;
        if (PyObject_GetBuffer(buffer, &shared, PyBUF_SIMPLE) < 0)
            return NULL;
        if (PyObject_GetBuffer(local, &own, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&shared);
            return NULL;
        }
        if (spin > timeout)
            spin = timeout;
        long changed;
        Py_BEGIN_ALLOW_THREADS
        changed = spin_on(w, n + 1, now_ns() + (int64_t)(spin * 1e9));
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&own);
        PyBuffer_Release(&shared);
        if (changed >= 0)
            return PyLong_FromLong(-2);
        timeout -= spin;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    time_t whole = (time_t)timeout;
    ts.tv_sec += whole;
    ts.tv_nsec += (long)((timeout - (double)whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    long r;
    int err;
    Py_BEGIN_ALLOW_THREADS
    r = syscall(__NR_futex_waitv, w, (unsigned int)(n + 1), 0, &ts, CLOCK_MONOTONIC);
    err = errno;
    Py_END_ALLOW_THREADS
    if (r >= 0) {
        if (r < n && passed != Py_None && pass_on(buffer, offs_at, w, n, r, passed) < 0)
            return NULL;
        return PyLong_FromLong(r);
    }
    if (err == ETIMEDOUT)
        return PyLong_FromLong(-1);
    if (err == EAGAIN || err == EFAULT)
        return PyLong_FromLong(-2);
    if (err == EINTR) {
        if (PyErr_CheckSignals() < 0)
            return NULL;
        return PyLong_FromLong(-2);
    }
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
#else
    errno = ENOSYS;
    return PyErr_SetFromErrno(PyExc_OSError);
#endif
fail:
    Py_DECREF(offs);
    Py_DECREF(vals);
    return NULL;
}

static PyMethodDef methods[] = {
    {"wake", (PyCFunction)(void (*)(void))futex_wake, METH_VARARGS | METH_KEYWORDS, wake_doc},
    {"wait_any", futex_wait_any, METH_VARARGS, wait_any_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mq.protocol._futex",
    "Futex waits and wakes on words in shared memory (Linux).", -1, methods,
};

PyMODINIT_FUNC
PyInit__futex(void)
{
    return PyModule_Create(&module);
}

#else  /* not Linux: no module; consumers use their semaphore */
#error "mq.protocol._futex is Linux-only (optional: the build skips it)"
#endif
