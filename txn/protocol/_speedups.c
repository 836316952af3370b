/* Compiled hot path of txn's consumer: splitting a batch entry's payload into its messages.
 *
 * split_batch(data, count, slow, null_payload) does what txn.protocol.batch.split_batch's pure
 * Python loop does, for bytes: each message is [u32 size][SingleMessageMetadata][payload]. The
 * metadata of the common shape (one-byte tags of fields 2, 3, 4, 5, 8; short varints) is read
 * here. Anything else in a message's metadata is handed to `slow` (the Python function the pure
 * path uses for it), so both paths give the same result. A batch that is truncated or whose sizes
 * overrun the payload returns None: the caller then runs the pure Python path, which raises its
 * typed error. Nothing here raises for hostile input except what `slow` raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A varint of at most 9 bytes (values below 2^63); -1 when longer, truncated or past `end`. */
static int read_varint(const unsigned char *d, Py_ssize_t *p, Py_ssize_t end, uint64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    for (int k = 0; k < 9; k++) {
        if (*p >= end) return -1;
        unsigned char b = d[(*p)++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = v;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* The fast path for one message's metadata d[p:end]; 0 and the fields if it applies, else -1. */
static int fast_smm(const unsigned char *d, Py_ssize_t p, Py_ssize_t end, int64_t *psize, int *has_seq,
                    uint64_t *seq, uint64_t *event_time, Py_ssize_t *key_at, Py_ssize_t *key_len, int *compacted) {
    *psize = -1;
    *has_seq = 0;
    *event_time = 0;
    *key_at = -1;
    *key_len = 0;
    *compacted = 0;
    while (p < end) {
        unsigned char tag = d[p++];
        uint64_t v;
        if (read_varint(d, &p, end, &v) < 0) return -1;
        switch (tag) {
        case 0x18: /* payload_size, int32 */
            if (v >= ((uint64_t)1 << 31)) return -1;
            *psize = (int64_t)v;
            break;
        case 0x40: /* sequence_id */
            *has_seq = 1;
            *seq = v;
            break;
        case 0x28: /* event_time */
            *event_time = v;
            break;
        case 0x12: /* partition_key: v is its length */
            if (v > (uint64_t)(end - p)) return -1;
            *key_at = p;
            *key_len = (Py_ssize_t)v;
            p += (Py_ssize_t)v;
            break;
        case 0x20: /* compacted_out */
            *compacted = v != 0;
            break;
        default: /* any other field or wire type */
            return -1;
        }
    }
    return *psize == -1 ? -1 : 0;
}

static PyObject *split_batch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *slow, *null_payload;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "SnOO:split_batch", &data, &count, &slow, &null_payload)) return NULL;
    if (count < 0) Py_RETURN_NONE;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (n - pos < 4) goto fallback;
        uint32_t msize = ((uint32_t)d[pos] << 24) | ((uint32_t)d[pos + 1] << 16) | ((uint32_t)d[pos + 2] << 8) |
                         (uint32_t)d[pos + 3];
        if ((Py_ssize_t)msize > n - pos - 4) goto fallback;
        Py_ssize_t end = pos + 4 + (Py_ssize_t)msize;
        int64_t psize;
        int has_seq, compacted;
        uint64_t seq = 0, event_time;
        Py_ssize_t key_at, key_len;
        PyObject *item;
        if (fast_smm(d, pos + 4, end, &psize, &has_seq, &seq, &event_time, &key_at, &key_len, &compacted) == 0) {
            PyObject *key = Py_None;
            if (key_at >= 0) {
                key = PyUnicode_DecodeUTF8((const char *)d + key_at, key_len, NULL);
                if (key == NULL) {
                    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto error;
                    PyErr_Clear();
                    goto slow_path; /* protobuf decides, as in the pure path */
                }
            } else {
                Py_INCREF(key);
            }
            if (psize > n - end) {
                Py_DECREF(key);
                goto fallback;
            }
            PyObject *payload = PyBytes_FromStringAndSize((const char *)d + end, (Py_ssize_t)psize);
            PyObject *seq_obj = has_seq ? PyLong_FromUnsignedLongLong(seq) : (Py_INCREF(Py_None), Py_None);
            PyObject *ev = PyLong_FromUnsignedLongLong(event_time);
            if (payload == NULL || seq_obj == NULL || ev == NULL) {
                Py_XDECREF(payload);
                Py_XDECREF(seq_obj);
                Py_XDECREF(ev);
                Py_DECREF(key);
                goto error;
            }
            item = PyTuple_Pack(7, payload, seq_obj, ev, key, Py_None, compacted ? Py_True : Py_False, Py_None);
            Py_DECREF(payload);
            Py_DECREF(seq_obj);
            Py_DECREF(ev);
            Py_DECREF(key);
            if (item == NULL) goto error;
            pos = end + (Py_ssize_t)psize;
        } else {
        slow_path:;
            /* (psize, seq, event_time, key, props, compacted, okey, null) from the pure path's helper */
            PyObject *r = PyObject_CallFunction(slow, "Onnn", data, pos + 4, end, i);
            if (r == NULL) goto error;
            if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 8) {
                Py_DECREF(r);
                PyErr_SetString(PyExc_TypeError, "split_batch: slow() must return an 8-tuple");
                goto error;
            }
            Py_ssize_t ps = PyLong_AsSsize_t(PyTuple_GET_ITEM(r, 0));
            if (ps == -1 && PyErr_Occurred()) {
                Py_DECREF(r);
                goto error;
            }
            if (ps < 0 || ps > n - end) {
                Py_DECREF(r);
                goto fallback;
            }
            PyObject *payload = PyObject_IsTrue(PyTuple_GET_ITEM(r, 7))
                                    ? (Py_INCREF(null_payload), null_payload)
                                    : PyBytes_FromStringAndSize((const char *)d + end, ps);
            if (payload == NULL) {
                Py_DECREF(r);
                goto error;
            }
            item = PyTuple_Pack(7, payload, PyTuple_GET_ITEM(r, 1), PyTuple_GET_ITEM(r, 2), PyTuple_GET_ITEM(r, 3),
                                PyTuple_GET_ITEM(r, 4), PyTuple_GET_ITEM(r, 5), PyTuple_GET_ITEM(r, 6));
            Py_DECREF(payload);
            Py_DECREF(r);
            if (item == NULL) goto error;
            pos = end + ps;
        }
        if (PyList_Append(out, item) < 0) {
            Py_DECREF(item);
            goto error;
        }
        Py_DECREF(item);
    }
    return out;
fallback:
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split_batch", split_batch, METH_VARARGS,
     "split_batch(data, count, slow, null_payload) -> list of 7-tuples, or None to use the pure path"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "Compiled hot paths of txn.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
