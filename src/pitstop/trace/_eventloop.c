/* The trace reader's event loop in C: ``_EventLoop.take`` of events.py, event for event.

Why: after msgspec has decoded a chunk of events into structs, the Python loop that sorts them into columns
cost ~1.5 CPU s per GiB of trace text (half a microsecond per complete event), a third of ``pitstop
analyze``. This loop reads the same struct fields (by their slot offsets), makes the same decisions through
the same Python memos, and calls the same Python functions for everything but the three common kinds of
event (CPU operators, runtime calls, kernels), whose columns it buffers and appends once per batch.

Exactness: every number it handles is a float, or an int of at most 2**52 in magnitude, so that doubles
hold it and every sum of two of them exactly, and comparisons and sums give what Python's give. An event
with any other time or an unexpected args object stops the loop: ``take`` returns its index and the Python
loop reads the rest of the trace (tests compare both loops bit for bit).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <stdint.h>
#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#endif

/* what an event's category makes of it: events.py's _KERNEL ... _IGNORED, checked at construction */
enum { KERNEL, MEMCPY, MEMSET, RUNTIME, CPU, STREAM_OTHER, IGNORED, N_ROLES };
enum { COMMUNICATION = 1 };
/* the columns this loop fills: runtime calls, kernels, the CPU operators' union */
enum {
    RT_TS, RT_END, RT_CORR, RT_SYNC, RT_LAUNCH, RT_DRIVER,
    K_TS, K_END, K_STREAM, K_DEVICE, K_CORR, K_EXTERNAL, K_CODE,
    CPU_TS, CPU_END,
    N_COLUMNS
};
static const char COLUMN_CODES[N_COLUMNS + 1] = "ddqbbbddqqqqbdd";  /* array typecodes, in that order */
#define N_GEMM 4
#define N_CATEGORY_SLOTS 64
#define EXACT_INT ((long long)1 << 52)

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

/* take_text's table of the strs of the last categories and names seen, by their bytes (see cached_str) */
#define N_CACHED 4096
typedef struct CachedStr {
    PyObject *str;
    uint64_t hash;
} CachedStr;

typedef struct {
    PyObject *cat;  /* the lower-cased category the memo gave (owned) */
    Py_ssize_t count;
} CategoryCount;

typedef struct {
    PyObject_HEAD
    PyTypeObject *event_type, *args_type;
    PyObject *bad_event, *no_args, *missing;
    Py_ssize_t off_cat, off_name, off_ts, off_dur, off_args;
    Py_ssize_t off_stream, off_device, off_correlation, off_external, off_external_lower;
    PyObject *cat_cache, *plain_names, *runtime_flags, *kernel_cache;  /* events.py's _Memo dicts */
    PyObject *cpu_event, *collective, *other_gpu, *to_int;             /* Python functions */
    PyObject *one;                    /* msgspec's decoder of one event (take_text's uncommon events) */
    PyObject *categories;                                              /* dict: category -> count */
    PyObject *gemm_kinds[N_GEMM];
    PyObject *targets[N_COLUMNS];
    Buffer buffers[N_COLUMNS];
    CategoryCount seen[N_CATEGORY_SLOTS];
    int n_seen;
    /* the running state, handed back by state() */
    double open_ts, open_end, gemm[N_GEMM];
    long long bad, negative;
    PyObject *vendor;
    struct Item *items;               /* take_text's events of one chunk */
    Py_ssize_t items_cap;
    struct CachedStr *strings;        /* take_text's categories and names, by their bytes */
} Loop;

static PyObject *STR_USER_ANNOTATION, *STR_CUDA_DRIVER, *STR_HIP, *STR_CU, *STR_AMD, *STR_NVIDIA, *STR_FROMBYTES,
    *STR_EMPTY;

/* -- buffers ------------------------------------------------------------------------------------------- */

static int grow(Buffer *b, Py_ssize_t size) {
    Py_ssize_t cap = b->cap ? b->cap * 2 : 1 << 14;
    while (cap < b->len + size) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

#define PUSH(loop, column, ctype, value)                                                               \
    do {                                                                                               \
        Buffer *b_ = &(loop)->buffers[column];                                                         \
        if (b_->len + (Py_ssize_t)sizeof(ctype) > b_->cap && grow(b_, sizeof(ctype)) < 0) goto error;  \
        *(ctype *)(b_->data + b_->len) = (value);                                                      \
        b_->len += sizeof(ctype);                                                                      \
    } while (0)

/* Append the buffered values to their arrays (array.frombytes) and count the categories seen. */
static int flush(Loop *self) {
    for (int c = 0; c < N_COLUMNS; c++) {
        Buffer *b = &self->buffers[c];
        if (b->len == 0) continue;
        PyObject *view = PyMemoryView_FromMemory(b->data, b->len, PyBUF_READ);  /* copied once, by the array */
        PyObject *r = view ? PyObject_CallMethodOneArg(self->targets[c], STR_FROMBYTES, view) : NULL;
        Py_XDECREF(view);
        b->len = 0;
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    /* in the order each category was first seen: the dict keeps the Python loop's insertion order */
    int ok = 0;
    for (int i = 0; i < self->n_seen; i++) {
        CategoryCount *s = &self->seen[i];
        if (ok == 0) {
            PyObject *old = PyDict_GetItemWithError(self->categories, s->cat);
            Py_ssize_t before = old ? PyLong_AsSsize_t(old) : 0;
            PyObject *count = (before < 0 && PyErr_Occurred()) ? NULL : PyLong_FromSsize_t(before + s->count);
            if (count == NULL || PyDict_SetItem(self->categories, s->cat, count) < 0) ok = -1;
            Py_XDECREF(count);
        }
        Py_CLEAR(s->cat);
    }
    self->n_seen = 0;
    return ok;
}

static int count_category(Loop *self, PyObject *cat) {
    for (int i = 0; i < self->n_seen; i++) {
        if (self->seen[i].cat == cat) {
            self->seen[i].count++;
            return 0;
        }
    }
    if (self->n_seen == N_CATEGORY_SLOTS && flush(self) < 0) return -1;
    Py_INCREF(cat);
    self->seen[self->n_seen].cat = cat;
    self->seen[self->n_seen].count = 1;
    self->n_seen++;
    return 0;
}

/* -- values -------------------------------------------------------------------------------------------- */

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* A time as a double, when it is one exactly (a float, or an int of at most 2**52). */
static inline int exact_number(PyObject *v, double *out) {
    if (PyFloat_CheckExact(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || x > EXACT_INT || x < -EXACT_INT) return 0;
        *out = (double)x;
        return 1;
    }
    return 0;
}

/* An id as the int64 columns hold it: ``v if type(v) is int and v in _IDS else _int(v)``. */
static inline int id_value(Loop *self, PyObject *v, long long *out) {
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow) {
            *out = x;
            return 0;
        }
    }
    PyObject *r = PyObject_CallOneArg(self->to_int, v);
    if (r == NULL) return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* memo[key] (a new reference): the dict's own lookup where the key is there (nearly always), the memo's
   __missing__ (through the subscript) where it is not. */
static inline PyObject *memo_get(PyObject *memo, PyObject *key) {
    PyObject *value = PyDict_GetItemWithError(memo, key);
    if (value != NULL) return Py_NewRef(value);
    return PyErr_Occurred() ? NULL : PyObject_GetItem(memo, key);
}

/* Two strs equal (a category against a constant: most differ in length, and are not compared further). */
static inline int same_str(PyObject *a, PyObject *b) {
    return a == b || (PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) && PyUnicode_Compare(a, b) == 0);
}

static inline int is_true(PyObject *v) { return v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v); }

/* -- the loop ------------------------------------------------------------------------------------------ */

/* A kernel's columns and GEMM time; info is the kernel memo's (kernel class, GEMM kind or None). */
static int kernel_columns(Loop *self, PyObject *info, double ts, double dur, long long stream, long long device,
                          long long correlation, long long external) {
    long code = PyLong_AsLong(PyTuple_GET_ITEM(info, 0));
    PyObject *gemm = PyTuple_GET_ITEM(info, 1);
    PUSH(self, K_TS, double, ts);
    PUSH(self, K_END, double, ts + dur);
    PUSH(self, K_STREAM, long long, stream);
    PUSH(self, K_DEVICE, long long, device);
    PUSH(self, K_CORR, long long, correlation);
    PUSH(self, K_EXTERNAL, long long, external);
    PUSH(self, K_CODE, signed char, (signed char)code);
    if (gemm != Py_None) {
        int k = 0, eq = 0;
        for (; k < N_GEMM; k++) {  /* the same object, nearly always: RichCompareBool tests that first */
            eq = PyObject_RichCompareBool(gemm, self->gemm_kinds[k], Py_EQ);
            if (eq != 0) break;
        }
        if (eq < 0) goto error;
        if (k == N_GEMM) {
            PyErr_SetObject(PyExc_KeyError, gemm);
            goto error;
        }
        self->gemm[k] += dur;
    }
    return 0;
error:
    return -1;
}

static int add_kernel(Loop *self, PyObject *name, double ts, double dur, PyObject *ts_obj, PyObject *dur_obj,
                      PyObject *args) {
    PyObject *info = memo_get(self->kernel_cache, name);  /* (kernel class, GEMM kind or None) */
    if (info == NULL) return -1;
    long long stream, device, correlation, external;
    PyObject *ext = SLOT(args, self->off_external);
    if (ext == self->missing) ext = SLOT(args, self->off_external_lower);
    if (id_value(self, SLOT(args, self->off_stream), &stream) < 0 ||
        id_value(self, SLOT(args, self->off_device), &device) < 0 ||
        id_value(self, SLOT(args, self->off_correlation), &correlation) < 0 || id_value(self, ext, &external) < 0 ||
        kernel_columns(self, info, ts, dur, stream, device, correlation, external) < 0)
        goto error;
    if (PyLong_AsLong(PyTuple_GET_ITEM(info, 0)) == COMMUNICATION) {
        PyObject *call[4] = {name, ts_obj, dur_obj, args};
        PyObject *r = PyObject_Vectorcall(self->collective, call, 4, NULL);
        if (r == NULL) goto error;
        Py_DECREF(r);
    }
    Py_DECREF(info);
    return 0;
error:
    Py_DECREF(info);
    return -1;
}

static int runtime_columns(Loop *self, PyObject *cat, PyObject *name, double ts, double dur, long long correlation) {
    PyObject *flags = memo_get(self->runtime_flags, name);  /* (blocking sync, kernel launch) */
    if (flags == NULL) return -1;
    long sync = PyLong_AsLong(PyTuple_GET_ITEM(flags, 0)), launch = PyLong_AsLong(PyTuple_GET_ITEM(flags, 1));
    Py_DECREF(flags);
    int driver = same_str(cat, STR_CUDA_DRIVER);
    PUSH(self, RT_TS, double, ts);
    PUSH(self, RT_END, double, ts + dur);
    PUSH(self, RT_CORR, long long, correlation);
    PUSH(self, RT_SYNC, signed char, (signed char)sync);
    PUSH(self, RT_LAUNCH, signed char, (signed char)launch);
    PUSH(self, RT_DRIVER, signed char, (signed char)driver);
    if (self->vendor == Py_None) {
        PyObject *vendor = PyUnicode_Tailmatch(name, STR_HIP, 0, PY_SSIZE_T_MAX, -1) == 1 ? STR_AMD
                           : PyUnicode_Tailmatch(name, STR_CU, 0, PY_SSIZE_T_MAX, -1) == 1 ? STR_NVIDIA
                                                                                        : Py_None;
        Py_INCREF(vendor);
        Py_SETREF(self->vendor, vendor);
    }
    return 0;
error:
    return -1;
}

static int add_runtime(Loop *self, PyObject *cat, PyObject *name, double ts, double dur, PyObject *args) {
    long long correlation;
    if (id_value(self, SLOT(args, self->off_correlation), &correlation) < 0) return -1;
    return runtime_columns(self, cat, name, ts, dur, correlation);
}

static int cpu_union(Loop *self, double ts, double dur);

/* A CPU operator or annotation: what _cpu_event keeps, then the union's open interval. */
static int add_cpu(Loop *self, PyObject *cat, PyObject *name, double ts, double dur, PyObject *ts_obj,
                   PyObject *dur_obj, PyObject *args) {
    PyObject *plain = memo_get(self->plain_names, name);
    if (plain == NULL) return -1;
    int keep = is_true(plain);
    Py_DECREF(plain);
    if (keep < 0) return -1;
    if (keep) keep = !same_str(cat, STR_USER_ANNOTATION);
    if (!keep) {
        PyObject *call[5] = {cat, name, ts_obj, dur_obj, args};
        PyObject *r = PyObject_Vectorcall(self->cpu_event, call, 5, NULL);
        if (r == NULL) return -1;
        keep = is_true(r);
        Py_DECREF(r);
        if (keep <= 0) return keep;
    }
    return cpu_union(self, ts, dur);
}

/* The CPU operators' union: an interval that overlaps the open one widens it, another closes it. */
static int cpu_union(Loop *self, double ts, double dur) {
    double end = ts + dur;
    if (ts <= self->open_end && end >= self->open_ts) {  /* overlaps the open interval: keep the hull */
        if (end > self->open_end) self->open_end = end;
        if (ts < self->open_ts) self->open_ts = ts;
    } else {
        if (self->open_ts <= self->open_end) {
            PUSH(self, CPU_TS, double, self->open_ts);
            PUSH(self, CPU_END, double, self->open_end);
        }
        self->open_ts = ts;
        self->open_end = end;
    }
    return 0;
error:
    return -1;
}

/* One complete event; 1 when it was taken, 0 when the Python loop must take it, -1 on an error. */
static int take_event(Loop *self, PyObject *ev) {
    PyObject *ts_obj = SLOT(ev, self->off_ts), *dur_obj = SLOT(ev, self->off_dur);
    PyObject *raw_cat = SLOT(ev, self->off_cat), *raw_name = SLOT(ev, self->off_name);
    PyObject *args = SLOT(ev, self->off_args);
    double ts, dur;
    if (!ts_obj || !dur_obj || !raw_cat || !raw_name || !args || !exact_number(ts_obj, &ts) ||
        !exact_number(dur_obj, &dur))
        return 0;
    if (args == Py_None)
        args = self->no_args;
    else if (Py_TYPE(args) != self->args_type)
        return 0;
    if (dur < 0) {
        self->negative++;
        return 1;
    }
    if (!(-1e18 < ts && ts < 1e18 && dur < 1e15)) {
        self->bad++;
        return 1;
    }
    if (!PyUnicode_CheckExact(raw_cat)) {  /* a list or object would not hash: a malformed event */
        self->bad++;
        return 1;
    }
    PyObject *category = memo_get(self->cat_cache, raw_cat);  /* (lower-cased, role) */
    if (category == NULL) return -1;
    PyObject *cat = PyTuple_GET_ITEM(category, 0);
    long role = PyLong_AsLong(PyTuple_GET_ITEM(category, 1));
    int rc = count_category(self, cat);
    if (rc < 0 || role == IGNORED) goto done;
    PyObject *name = PyUnicode_CheckExact(raw_name) ? Py_NewRef(raw_name) : PyObject_Str(raw_name);
    if (name == NULL) {
        rc = -1;
        goto done;
    }
    if (role == CPU) {
        rc = add_cpu(self, cat, name, ts, dur, ts_obj, dur_obj, args);
    } else if (role == RUNTIME) {
        rc = add_runtime(self, cat, name, ts, dur, args);
    } else if (role == KERNEL) {
        rc = add_kernel(self, name, ts, dur, ts_obj, dur_obj, args);
    } else {
        PyObject *call[5] = {PyTuple_GET_ITEM(category, 1), name, ts_obj, dur_obj, args};
        PyObject *r = PyObject_Vectorcall(self->other_gpu, call, 5, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(name);
done:
    Py_DECREF(category);
    return rc < 0 ? -1 : 1;
}

static PyObject *Loop_take(Loop *self, PyObject *batch) {
    if (!PyList_CheckExact(batch)) {
        PyErr_SetString(PyExc_TypeError, "take() wants a list of events");
        return NULL;
    }
    Py_ssize_t i, n = PyList_GET_SIZE(batch);
    for (i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(batch, i);
        if (Py_TYPE(ev) != self->event_type) {  /* another phase, or a complete event without a number */
            if (ev == self->bad_event) self->bad++;
            continue;
        }
        Py_INCREF(ev);
        int rc = take_event(self, ev);
        Py_DECREF(ev);
        if (rc < 0) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            flush(self);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        if (rc == 0) break;
    }
    if (flush(self) < 0) return NULL;
    return PyLong_FromSsize_t(i);
}

static PyObject *Loop_state(Loop *self, PyObject *unused) {
    return Py_BuildValue("ddOLL(dddd)", self->open_ts, self->open_end, self->vendor, self->bad, self->negative,
                         self->gemm[0], self->gemm[1], self->gemm[2], self->gemm[3]);
}

/* -- construction -------------------------------------------------------------------------------------- */

/* The slot offset of a struct field (msgspec stores fields as object member slots). */
static int field_offset(PyTypeObject *type, const char *field, Py_ssize_t *out) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, field);
    if (descr == NULL) return -1;
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (ok) *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!ok) PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, field);
    return ok ? 0 : -1;
}

static int Loop_init(Loop *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"event_type", "args_type", "bad_event", "no_args", "missing", "memos",
                             "calls", "categories", "gemm_kinds", "columns", "roles", "one", NULL};
    PyObject *event_type, *args_type, *bad_event, *no_args, *missing, *memos, *calls, *categories, *gemm_kinds,
        *columns, *roles, *one = NULL;
    if (self->event_type != NULL) {
        PyErr_SetString(PyExc_TypeError, "Loop: already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOO!O!O!O!O!O!|O", kwlist, &PyType_Type, &event_type,
                                     &PyType_Type, &args_type, &bad_event, &no_args, &missing, &PyTuple_Type,
                                     &memos, &PyTuple_Type, &calls, &PyDict_Type, &categories, &PyTuple_Type,
                                     &gemm_kinds, &PyTuple_Type, &columns, &PyTuple_Type, &roles, &one))
        return -1;
    if (PyTuple_GET_SIZE(memos) != 4 || PyTuple_GET_SIZE(calls) != 4 || PyTuple_GET_SIZE(gemm_kinds) != N_GEMM ||
        PyTuple_GET_SIZE(columns) != N_COLUMNS || PyTuple_GET_SIZE(roles) != N_ROLES) {
        PyErr_SetString(PyExc_ValueError, "Loop: wrong number of memos, calls, GEMM kinds, columns or roles");
        return -1;
    }
    for (long r = 0; r < N_ROLES; r++) {
        if (PyLong_AsLong(PyTuple_GET_ITEM(roles, r)) != r) {
            PyErr_SetString(PyExc_ValueError, "Loop: the roles are not numbered as this module numbers them");
            return -1;
        }
    }
    for (int c = 0; c < N_COLUMNS; c++) {
        PyObject *code = PyObject_GetAttrString(PyTuple_GET_ITEM(columns, c), "typecode");
        int ok = code && PyUnicode_Check(code) && PyUnicode_GetLength(code) == 1 &&
                 PyUnicode_READ_CHAR(code, 0) == (Py_UCS4)COLUMN_CODES[c];
        Py_XDECREF(code);
        if (!ok) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "Loop: column %d is not an array of '%c'", c, COLUMN_CODES[c]);
            return -1;
        }
    }
    if (field_offset((PyTypeObject *)event_type, "cat", &self->off_cat) < 0 ||
        field_offset((PyTypeObject *)event_type, "name", &self->off_name) < 0 ||
        field_offset((PyTypeObject *)event_type, "ts", &self->off_ts) < 0 ||
        field_offset((PyTypeObject *)event_type, "dur", &self->off_dur) < 0 ||
        field_offset((PyTypeObject *)event_type, "args", &self->off_args) < 0 ||
        field_offset((PyTypeObject *)args_type, "stream", &self->off_stream) < 0 ||
        field_offset((PyTypeObject *)args_type, "device", &self->off_device) < 0 ||
        field_offset((PyTypeObject *)args_type, "correlation", &self->off_correlation) < 0 ||
        field_offset((PyTypeObject *)args_type, "external", &self->off_external) < 0 ||
        field_offset((PyTypeObject *)args_type, "external_lower", &self->off_external_lower) < 0)
        return -1;
    if (Py_TYPE(no_args) != (PyTypeObject *)args_type) {
        PyErr_SetString(PyExc_TypeError, "Loop: no_args is not an args struct");
        return -1;
    }
    self->event_type = (PyTypeObject *)Py_NewRef(event_type);
    self->args_type = (PyTypeObject *)Py_NewRef(args_type);
    self->bad_event = Py_NewRef(bad_event);
    self->no_args = Py_NewRef(no_args);
    self->missing = Py_NewRef(missing);
    self->categories = Py_NewRef(categories);
    self->cat_cache = Py_NewRef(PyTuple_GET_ITEM(memos, 0));
    self->plain_names = Py_NewRef(PyTuple_GET_ITEM(memos, 1));
    self->runtime_flags = Py_NewRef(PyTuple_GET_ITEM(memos, 2));
    self->kernel_cache = Py_NewRef(PyTuple_GET_ITEM(memos, 3));
    self->cpu_event = Py_NewRef(PyTuple_GET_ITEM(calls, 0));
    self->collective = Py_NewRef(PyTuple_GET_ITEM(calls, 1));
    self->other_gpu = Py_NewRef(PyTuple_GET_ITEM(calls, 2));
    self->to_int = Py_NewRef(PyTuple_GET_ITEM(calls, 3));
    self->one = Py_XNewRef(one);
    for (int k = 0; k < N_GEMM; k++) self->gemm_kinds[k] = Py_NewRef(PyTuple_GET_ITEM(gemm_kinds, k));
    for (int c = 0; c < N_COLUMNS; c++) self->targets[c] = Py_NewRef(PyTuple_GET_ITEM(columns, c));
    self->open_ts = Py_HUGE_VAL;
    self->open_end = -Py_HUGE_VAL;
    self->vendor = Py_NewRef(Py_None);
    return 0;
}

static void Loop_dealloc(Loop *self) {
    Py_XDECREF(self->event_type);
    Py_XDECREF(self->args_type);
    Py_XDECREF(self->bad_event);
    Py_XDECREF(self->no_args);
    Py_XDECREF(self->missing);
    Py_XDECREF(self->cat_cache);
    Py_XDECREF(self->plain_names);
    Py_XDECREF(self->runtime_flags);
    Py_XDECREF(self->kernel_cache);
    Py_XDECREF(self->cpu_event);
    Py_XDECREF(self->collective);
    Py_XDECREF(self->other_gpu);
    Py_XDECREF(self->to_int);
    Py_XDECREF(self->one);
    PyMem_Free(self->items);
    if (self->strings != NULL)
        for (int i = 0; i < N_CACHED; i++) Py_XDECREF(self->strings[i].str);
    PyMem_Free(self->strings);
    Py_XDECREF(self->categories);
    Py_XDECREF(self->vendor);
    for (int k = 0; k < N_GEMM; k++) Py_XDECREF(self->gemm_kinds[k]);
    for (int c = 0; c < N_COLUMNS; c++) {
        Py_XDECREF(self->targets[c]);
        PyMem_Free(self->buffers[c].data);
    }
    for (int i = 0; i < self->n_seen; i++) Py_XDECREF(self->seen[i].cat);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- complete events read straight from the text: ``take_text``.

Why: msgspec's decoding of a chunk into structs was over half of ``pitstop analyze`` (8 CPU s per GiB of text
on the shared machine, its validation alone 3.5; inflating 1.4), most of it building fields and objects the
loop reads once. This parser validates a chunk (``[`` events ``]``) by JSON's grammar, keeps of each event
only what the loop reads (phase, category, name, times, the four ids), and the loop takes the common events
(CPU operators, runtime calls, kernels) from those values; any other complete event is decoded alone by
msgspec and taken as ``take`` takes it. Exactness: a chunk with anything this parser does not hold exactly as
msgspec's structs would (an escaped key, category or name, a duplicate field, a time that is not a number or
is an int past 2**52, args that are not an object, a phase outside the Trace Event Format's, nesting past
TEXT_MAX_DEPTH, a surrogate escape, invalid JSON) is declined before any event is taken, and goes to msgspec
as before. Numbers are converted as float() does: exactly where the digits fit a double and the power of ten
is exact (one correctly rounded operation), else by Python's own conversion. */

#define TEXT_MAX_DEPTH 64
#if defined(__GNUC__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif
enum { V_ABSENT, V_NULL, V_INT, V_FLOAT, V_STRING, V_ESCAPED, V_OTHER };
enum { ID_STREAM, ID_DEVICE, ID_CORRELATION, ID_EXTERNAL, ID_EXTERNAL_LOWER, N_IDS };

typedef struct {
    const unsigned char *s;  /* a string's bytes, between its quotes */
    Py_ssize_t n;
    union {
        double d;
        long long i;
    } v;
    unsigned char kind;
} Val;

typedef struct Item {
    Py_ssize_t start, end;  /* the event's text */
    unsigned char complete, args;
    Val cat, name, ts, dur, ids[N_IDS];
} Item;

typedef struct {
    const unsigned char *p, *end;
} Parser;

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

HOT void skip_ws(Parser *ps) {
    const unsigned char *p = ps->p, *end = ps->end;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

/* the first quote, backslash or control character from p (end if none) */
static inline const unsigned char *string_stop(const unsigned char *p, const unsigned char *end) {
#if defined(__SSE2__) && defined(__GNUC__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
    while (p + 16 <= end) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                   _mm_cmpeq_epi8(_mm_min_epu8(v, control), v));
        int bits = _mm_movemask_epi8(hit);
        if (bits) return p + __builtin_ctz(bits);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
    return p;
}

static inline int hex_digit(unsigned char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Past the string whose opening quote is at ps->p; *escaped is set where it holds an escape. -1 for what
   msgspec refuses or may: a raw control character, an unknown escape, a surrogate (paired or not). */
HOT int skip_string(Parser *ps, int *escaped) {
    const unsigned char *p = ps->p + 1, *end = ps->end;
    for (;;) {
        p = string_stop(p, end);
        if (p >= end || *p < 0x20) return -1;
        if (*p == '"') {
            ps->p = p + 1;
            return 0;
        }
        *escaped = 1;
        if (p + 1 >= end) return -1;
        unsigned char c = p[1];
        if (c == 'u') {
            if (end - p < 6) return -1;
            int code = 0;
            for (int k = 2; k < 6; k++) {
                int h = hex_digit(p[k]);
                if (h < 0) return -1;
                code = code * 16 + h;
            }
            if (code >= 0xD800 && code <= 0xDFFF) return -1;
            p += 6;
        } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            p += 2;
        } else {
            return -1;
        }
    }
}

/* A number by JSON's grammar at ps->p, and its value in out (when given): V_INT for an integer of at most 18
   digits, V_FLOAT for one with a fraction or exponent (as float() converts it), V_OTHER for a longer integer. */
static int number(Parser *ps, Val *out);

static inline int is_digit(unsigned char c) { return (unsigned char)(c - '0') < 10; }

/* Past a number by JSON's grammar, its value unread (most numbers of an event: pid, tid, indices). */
HOT int skip_number(Parser *ps) {
    const unsigned char *p = ps->p, *end = ps->end;
    if (p < end && *p == '-') p++;
    if (p >= end || !is_digit(*p)) return -1;
    if (*p++ != '0')
        while (p < end && is_digit(*p)) p++;
    if (p < end && *p == '.') {
        if (++p >= end || !is_digit(*p)) return -1;
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        if (++p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return -1;
        while (p < end && is_digit(*p)) p++;
    }
    ps->p = p;
    return 0;
}

static int number(Parser *ps, Val *out) {
    const unsigned char *p = ps->p, *end = ps->end, *start = p;
    int negative = 0, is_float = 0, lost = 0, frac = 0;
    uint64_t mant = 0;
    long exp = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return -1;
    if (*p == '0') {
        p++;
    } else {
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (mant < 100000000000000000ULL)
                mant = mant * 10 + (*p - '0');
            else
                lost = 1;
        }
    }
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (mant < 100000000000000000ULL) {
                mant = mant * 10 + (*p - '0');
                frac++;
            } else {
                lost = 1;
            }
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        int exp_negative = 0;
        if (p < end && (*p == '+' || *p == '-')) exp_negative = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9') return -1;
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (exp < 100000) exp = exp * 10 + (*p - '0');
        if (exp_negative) exp = -exp;
    }
    ps->p = p;
    if (out == NULL) return 0;
    if (!is_float) {
        out->kind = lost ? V_OTHER : V_INT;
        out->v.i = negative ? -(long long)mant : (long long)mant;
        return 0;
    }
    out->kind = V_FLOAT;
    long e10 = exp - frac;
    if (!lost && mant <= ((uint64_t)1 << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)mant;  /* exact, as is the power of ten: one correctly rounded operation */
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        out->v.d = negative ? -d : d;
        return 0;
    }
    char text[512];
    if (p - start >= (Py_ssize_t)sizeof text) return -1;
    memcpy(text, start, p - start);
    text[p - start] = 0;
    out->v.d = PyOS_string_to_double(text, NULL, NULL);
    if (out->v.d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static inline int literal(Parser *ps, const char *word, Py_ssize_t n) {
    if (ps->end - ps->p < n || memcmp(ps->p, word, n) != 0) return -1;
    ps->p += n;
    return 0;
}

static int skip_value(Parser *ps, int depth);

/* Past the object or array at ps->p, validated. */
static int skip_container(Parser *ps, int depth) {
    if (depth > TEXT_MAX_DEPTH) return -1;
    unsigned char close = *ps->p == '{' ? '}' : ']';
    int escaped = 0;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            if (ps->p >= ps->end || *ps->p != '"' || skip_string(ps, &escaped) < 0) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return -1;
            ps->p++;
            skip_ws(ps);
        }
        if (skip_value(ps, depth) < 0) return -1;
        skip_ws(ps);
        if (ps->p >= ps->end) return -1;
        if (*ps->p == ',') {
            ps->p++;
            skip_ws(ps);
        } else if (*ps->p++ == close) {
            return 0;
        } else {
            return -1;
        }
    }
}

static int skip_value(Parser *ps, int depth) {
    int escaped = 0;
    if (ps->p >= ps->end) return -1;
    switch (*ps->p) {
        case '"': return skip_string(ps, &escaped);
        case '{':
        case '[': return skip_container(ps, depth + 1);
        case 't': return literal(ps, "true", 4);
        case 'f': return literal(ps, "false", 5);
        case 'n': return literal(ps, "null", 4);
        default: return skip_number(ps);
    }
}

/* A value the loop may read: a string (its bytes), a number, null, or any other value (skipped). */
HOT int field_value(Parser *ps, Val *out, int depth) {
    if (out->kind != V_ABSENT) return -1;  /* a duplicate key: msgspec keeps the last, left to it */
    if (ps->p >= ps->end) return -1;
    unsigned char c = *ps->p;
    if (c == '"') {
        int escaped = 0;
        out->s = ps->p + 1;
        if (skip_string(ps, &escaped) < 0) return -1;
        out->n = ps->p - 1 - out->s;
        out->kind = escaped ? V_ESCAPED : V_STRING;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(ps, out);
    if (c == 'n') {
        out->kind = V_NULL;
        return literal(ps, "null", 4);
    }
    out->kind = V_OTHER;
    return skip_value(ps, depth);
}

#define KEY_IS(key, n, word) ((n) == (Py_ssize_t)sizeof(word) - 1 && memcmp((key), (word), (n)) == 0)

/* A key at ps->p (no escape in it: an escaped key may spell a field), then its colon. */
HOT int object_key(Parser *ps, const unsigned char **key, Py_ssize_t *n) {
    int escaped = 0;
    if (ps->p >= ps->end || *ps->p != '"') return -1;
    *key = ps->p + 1;
    if (skip_string(ps, &escaped) < 0 || escaped) return -1;
    *n = ps->p - 1 - *key;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') return -1;
    ps->p++;
    skip_ws(ps);
    return 0;
}

/* After a member: its comma (1) or the closing brace (0). */
HOT int next_member(Parser *ps) {
    skip_ws(ps);
    if (ps->p >= ps->end) return -1;
    if (*ps->p == ',') {
        ps->p++;
        skip_ws(ps);
        return 1;
    }
    return *ps->p++ == '}' ? 0 : -1;
}

static int parse_args(Parser *ps, Item *it) {
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (;;) {
        const unsigned char *key;
        Py_ssize_t n;
        Val *slot = NULL;
        if (object_key(ps, &key, &n) < 0) return -1;
        if (KEY_IS(key, n, "stream"))
            slot = &it->ids[ID_STREAM];
        else if (KEY_IS(key, n, "device"))
            slot = &it->ids[ID_DEVICE];
        else if (KEY_IS(key, n, "correlation"))
            slot = &it->ids[ID_CORRELATION];
        else if (KEY_IS(key, n, "External id"))
            slot = &it->ids[ID_EXTERNAL];
        else if (KEY_IS(key, n, "external id"))
            slot = &it->ids[ID_EXTERNAL_LOWER];
        if ((slot ? field_value(ps, slot, 2) : skip_value(ps, 2)) < 0) return -1;
        int more = next_member(ps);
        if (more <= 0) return more;
    }
}

static inline int is_number(const Val *v) { return v->kind == V_INT || v->kind == V_FLOAT; }
static inline int exact_time(const Val *v) { return v->kind == V_FLOAT || (v->v.i <= EXACT_INT && v->v.i >= -EXACT_INT); }

/* One event (an object at ps->p) into it; -1 where the chunk is left to msgspec. */
static int parse_item(Parser *ps, Item *it) {
    const unsigned char *phase = NULL;
    Py_ssize_t phase_n = 0;
    memset(it, 0, sizeof *it);
    if (ps->p >= ps->end || *ps->p != '{') return -1;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') return -1;  /* no phase */
    for (;;) {
        const unsigned char *key;
        Py_ssize_t n;
        Val *slot = NULL;
        if (object_key(ps, &key, &n) < 0) return -1;
        if (KEY_IS(key, n, "ph")) {
            int escaped = 0;
            if (phase != NULL || ps->p >= ps->end || *ps->p != '"') return -1;
            phase = ps->p + 1;
            if (skip_string(ps, &escaped) < 0 || escaped) return -1;
            phase_n = ps->p - 1 - phase;
        } else if (KEY_IS(key, n, "args")) {
            if (it->args != V_ABSENT || ps->p >= ps->end) return -1;
            if (*ps->p == '{') {
                it->args = V_OTHER;
                if (parse_args(ps, it) < 0) return -1;
            } else if (*ps->p == 'n') {
                it->args = V_NULL;
                if (literal(ps, "null", 4) < 0) return -1;
            } else {
                it->args = V_STRING;  /* not an object: a complete event's chunk is left to msgspec */
                if (skip_value(ps, 1) < 0) return -1;
            }
        } else {
            if (KEY_IS(key, n, "ts"))
                slot = &it->ts;
            else if (KEY_IS(key, n, "dur"))
                slot = &it->dur;
            else if (KEY_IS(key, n, "cat"))
                slot = &it->cat;
            else if (KEY_IS(key, n, "name"))
                slot = &it->name;
            if ((slot ? field_value(ps, slot, 1) : skip_value(ps, 1)) < 0) return -1;
        }
        int more = next_member(ps);
        if (more < 0) return -1;
        if (more == 0) break;
    }
    if (phase == NULL || phase_n != 1) return -1;
    if (*phase != 'X') return strchr("BEiICbnestfPNODMVvRc", *phase) != NULL && *phase ? 0 : -1;
    it->complete = 1;
    if (!is_number(&it->ts) || !exact_time(&it->ts)) return -1;
    if (it->dur.kind != V_ABSENT && (!is_number(&it->dur) || !exact_time(&it->dur))) return -1;
    if (it->cat.kind == V_ESCAPED || it->name.kind == V_ESCAPED || it->args == V_STRING) return -1;
    return 0;
}

/* The events of a chunk into self->items: their count, or -1 where the chunk is left to msgspec. */
static Py_ssize_t parse_items(Loop *self, const unsigned char *data, Py_ssize_t len) {
    Parser ps = {data, data + len};
    Py_ssize_t n = 0;
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p++ != '[') return -1;
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == ']') {
        ps.p++;
    } else {
        for (;;) {
            if (n == self->items_cap) {
                Py_ssize_t cap = self->items_cap ? 2 * self->items_cap : 4096;
                Item *items = PyMem_Realloc(self->items, cap * sizeof(Item));
                if (items == NULL) return -1;
                self->items = items;
                self->items_cap = cap;
            }
            Item *it = &self->items[n];
            const unsigned char *start = ps.p;
            if (parse_item(&ps, it) < 0) return -1;
            it->start = start - data;
            it->end = ps.p - data;
            n++;
            skip_ws(&ps);
            if (ps.p >= ps.end) return -1;
            if (*ps.p == ',') {
                ps.p++;
                skip_ws(&ps);
            } else if (*ps.p++ == ']') {
                break;
            } else {
                return -1;
            }
        }
    }
    skip_ws(&ps);
    return ps.p == ps.end ? n : -1;
}

/* The str of a category's or a name's bytes, from a table of the last ones seen (a trace repeats a few
   thousand names millions of times): no decoding, no allocation and no SipHash where it is there. */

static inline uint64_t bytes_hash(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (; n >= 8; s += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
}

static PyObject *cached_str(Loop *self, const unsigned char *s, Py_ssize_t n) {
    if (self->strings == NULL) {
        self->strings = PyMem_Calloc(N_CACHED, sizeof(CachedStr));
        if (self->strings == NULL) return PyErr_NoMemory();
    }
    uint64_t h = bytes_hash(s, n);
    CachedStr *c = &self->strings[h & (N_CACHED - 1)];
    if (c->str != NULL && c->hash == h) {
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(c->str, &len);  /* an ASCII str's own bytes */
        if (utf8 != NULL && len == n && memcmp(utf8, s, n) == 0) return Py_NewRef(c->str);
        PyErr_Clear();
    }
    PyObject *str = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (str == NULL) return NULL;
    Py_XSETREF(c->str, Py_NewRef(str));
    c->hash = h;
    return str;
}

static inline double time_of(const Val *v) { return v->kind == V_INT ? (double)v->v.i : v->v.d; }

/* An id as the columns hold it, where it is one without _int's help (absent, null or an int); 0 if not. */
static inline int plain_id(const Val *v, long long *out) {
    if (v->kind == V_INT) {
        *out = v->v.i;
        return 1;
    }
    *out = -1;
    return v->kind == V_ABSENT || v->kind == V_NULL;
}

/* One complete event read by the parser, as take_event takes it; one the parser's values do not settle
   (an operator _cpu_event reads, a collective, a memcpy, a name that is not a string, an id that is not an
   int) is decoded by msgspec and given to take_event. 1 taken, 0 left to Python, -1 an error. */
static int take_item(Loop *self, const unsigned char *data, Item *it) {
    double ts = time_of(&it->ts), dur = it->dur.kind == V_ABSENT ? 0.0 : time_of(&it->dur);
    if (dur < 0) {
        self->negative++;
        return 1;
    }
    if (!(-1e18 < ts && ts < 1e18 && dur < 1e15)) {
        self->bad++;
        return 1;
    }
    if (it->cat.kind != V_STRING && it->cat.kind != V_ABSENT) {  /* not a string: a malformed event */
        self->bad++;
        return 1;
    }
    PyObject *raw_cat = it->cat.kind == V_ABSENT ? Py_NewRef(STR_EMPTY) : cached_str(self, it->cat.s, it->cat.n);
    if (raw_cat == NULL) return -1;
    PyObject *category = memo_get(self->cat_cache, raw_cat);  /* (lower-cased, role) */
    Py_DECREF(raw_cat);
    if (category == NULL) return -1;
    PyObject *cat = PyTuple_GET_ITEM(category, 0), *name = NULL, *info = NULL;
    long role = PyLong_AsLong(PyTuple_GET_ITEM(category, 1));
    int rc = 0;
    long long ids[N_IDS];
    if (role == IGNORED) {
        rc = count_category(self, cat) < 0 ? -1 : 1;
        goto done;
    }
    if (it->name.kind != V_STRING && it->name.kind != V_ABSENT) goto uncommon;  /* str() of it: Python's */
    name = it->name.kind == V_ABSENT ? Py_NewRef(STR_EMPTY) : cached_str(self, it->name.s, it->name.n);
    if (name == NULL) goto error;
    const Val *args = it->ids;
    static const Val ABSENT = {NULL, 0, {0}, V_ABSENT};
    int plain_ids = 1;
    for (int k = 0; k < N_IDS; k++) plain_ids &= plain_id(it->args == V_OTHER ? &args[k] : &ABSENT, &ids[k]);
    if (it->args == V_OTHER && args[ID_EXTERNAL].kind == V_ABSENT) ids[ID_EXTERNAL] = ids[ID_EXTERNAL_LOWER];
    if (!plain_ids) goto uncommon;
    if (role == CPU) {
        PyObject *plain = memo_get(self->plain_names, name);
        if (plain == NULL) goto error;
        int keep = is_true(plain);
        Py_DECREF(plain);
        if (keep < 0) goto error;
        if (!keep || same_str(cat, STR_USER_ANNOTATION)) goto uncommon;
        rc = count_category(self, cat) < 0 || cpu_union(self, ts, dur) < 0 ? -1 : 1;
    } else if (role == RUNTIME) {
        rc = count_category(self, cat) < 0 || runtime_columns(self, cat, name, ts, dur, ids[ID_CORRELATION]) < 0
                 ? -1
                 : 1;
    } else if (role == KERNEL) {
        info = memo_get(self->kernel_cache, name);  /* (kernel class, GEMM kind or None) */
        if (info == NULL) goto error;
        if (PyLong_AsLong(PyTuple_GET_ITEM(info, 0)) == COMMUNICATION) goto uncommon;
        rc = count_category(self, cat) < 0 || kernel_columns(self, info, ts, dur, ids[ID_STREAM], ids[ID_DEVICE],
                                                             ids[ID_CORRELATION], ids[ID_EXTERNAL]) < 0
                 ? -1
                 : 1;
    } else {
        goto uncommon;
    }
    goto done;
uncommon: {
    PyObject *text = PyBytes_FromStringAndSize((const char *)data + it->start, it->end - it->start);
    PyObject *ev = text ? PyObject_CallOneArg(self->one, text) : NULL;
    Py_XDECREF(text);
    if (ev == NULL) goto error;
    rc = Py_TYPE(ev) == self->event_type ? take_event(self, ev) : 0;
    Py_DECREF(ev);
    goto done;
}
error:
    rc = -1;
done:
    Py_XDECREF(info);
    Py_XDECREF(name);
    Py_DECREF(category);
    return rc;
}

static PyObject *Loop_take_text(Loop *self, PyObject *arg) {
    Py_buffer view;
    if (self->one == NULL) {
        PyErr_SetString(PyExc_TypeError, "take_text() needs the Loop built with one=");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t n = parse_items(self, data, view.len), i;
    if (n < 0) {
        PyBuffer_Release(&view);
        if (PyErr_Occurred()) return NULL;  /* out of memory */
        Py_RETURN_NONE;
    }
    for (i = 0; i < n; i++) {
        if (!self->items[i].complete) continue;
        int rc = take_item(self, data, &self->items[i]);
        if (rc < 0) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            flush(self);
            PyErr_Restore(type, value, tb);
            PyBuffer_Release(&view);
            return NULL;
        }
        if (rc == 0) break;
    }
    PyBuffer_Release(&view);
    if (flush(self) < 0) return NULL;
    return Py_BuildValue("nn", n, i);
}

static PyMethodDef Loop_methods[] = {
    {"take", (PyCFunction)Loop_take, METH_O,
     "Take a batch of events; the index of the first one left to the Python loop (len(batch) when none)."},
    {"take_text", (PyCFunction)Loop_take_text, METH_O,
     "Take the events of a chunk of text ('[' events ']'): (items, taken), taken < items where the Python loop "
     "must take the rest; None where the chunk is left to msgspec (nothing taken)."},
    {"state", (PyCFunction)Loop_state, METH_NOARGS,
     "(open_ts, open_end, vendor, bad, negative, (GEMM time by kind))"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LoopType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pitstop.trace._eventloop.Loop",
    .tp_basicsize = sizeof(Loop),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The trace reader's event loop (events.py's _EventLoop.take), in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Loop_init,
    .tp_dealloc = (destructor)Loop_dealloc,
    .tp_methods = Loop_methods,
};


/* ---- event boundaries: jsonstream.py's _Reader.array cuts the text after the last comma between two items
of the event array, found by one pass over the bytes with the state a boundary needs (in a string or not,
after a backslash in one, nesting depth), so the cut never depends on whitespace or line ends. */
enum { OUT_OF_STRING, IN_STRING, AFTER_BACKSLASH };

/* what a byte is to the scan: 1 ends a run inside a string (" \), 2 ends one outside (" , { } [ ]) */
static unsigned char SCAN_CLASS[256];

static void scan_classes(void) {
    SCAN_CLASS['"'] = 3;
    SCAN_CLASS['\\'] = 1;
    SCAN_CLASS[','] = SCAN_CLASS['{'] = SCAN_CLASS['}'] = SCAN_CLASS['['] = SCAN_CLASS[']'] = 2;
}

typedef struct {
    Py_ssize_t cut, depth, max_depth;
    int state;
} ScanState;

/* the scan byte by byte from p up to stop; returns where it ended: stop, or the byte that ended the array
   (depth -1), or just past the bracket that went past max_depth */
static Py_ssize_t scan_bytes(const unsigned char *data, Py_ssize_t p, Py_ssize_t stop, ScanState *s) {
    while (p < stop) {
        if (s->state == AFTER_BACKSLASH) {
            s->state = IN_STRING;
            p++;
            continue;
        }
        if (s->state == IN_STRING) {  /* to the closing quote, past escaped characters */
            while (p < stop && !(SCAN_CLASS[data[p]] & 1)) p++;
            if (p == stop) break;
            s->state = data[p] == '"' ? OUT_OF_STRING : AFTER_BACKSLASH;
            p++;
            continue;
        }
        while (p < stop && !(SCAN_CLASS[data[p]] & 2)) p++;
        if (p == stop) break;
        unsigned char c = data[p];
        if (c == '"') {
            s->state = IN_STRING;
        } else if (c == ',') {
            if (s->depth == 0) s->cut = p;
        } else if (c == '{' || c == '[') {
            if (++s->depth > s->max_depth) return p + 1;
        } else if (--s->depth < 0) {  /* } or ]: at depth -1 the array itself ends here */
            return p;
        }
        p++;
    }
    return stop;
}

#if defined(__SSE2__) && defined(__GNUC__)
/* bits of the 64 bytes at data that equal c */
static inline uint64_t bytes_equal(const unsigned char *data, char c) {
    __m128i needle = _mm_set1_epi8(c);
    uint64_t bits = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(data + 16 * i));
        bits |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, needle)) << (16 * i);
    }
    return bits;
}

/* 64 bytes at a time: a block without a backslash (nearly all) has its strings found from its quotes at
   once (a prefix XOR), and only its commas and brackets outside strings are visited one by one */
static Py_ssize_t scan_blocks(const unsigned char *data, Py_ssize_t p, Py_ssize_t end, ScanState *s) {
    while (p + 64 <= end) {
        if (s->state == AFTER_BACKSLASH || bytes_equal(data + p, '\\')) {
            Py_ssize_t stop = scan_bytes(data, p, p + 64, s);
            if (stop != p + 64 || s->depth < 0 || s->depth > s->max_depth) return stop;
            p = stop;
            continue;
        }
        uint64_t quotes = bytes_equal(data + p, '"'), inside = quotes;
        inside ^= inside << 1;
        inside ^= inside << 2;
        inside ^= inside << 4;
        inside ^= inside << 8;
        inside ^= inside << 16;
        inside ^= inside << 32;
        if (s->state == IN_STRING) inside = ~inside;
        uint64_t brackets = bytes_equal(data + p, '{') | bytes_equal(data + p, '[') | bytes_equal(data + p, '}') |
                            bytes_equal(data + p, ']');
        uint64_t marks = (brackets | bytes_equal(data + p, ',')) & ~inside & ~quotes;
        while (marks) {
            int i = __builtin_ctzll(marks);
            marks &= marks - 1;
            unsigned char c = data[p + i];
            if (c == ',') {
                if (s->depth == 0) s->cut = p + i;
            } else if (c == '{' || c == '[') {
                if (++s->depth > s->max_depth) {
                    s->state = OUT_OF_STRING;  /* a bracket outside strings */
                    return p + i + 1;
                }
            } else if (--s->depth < 0) {
                s->state = OUT_OF_STRING;
                return p + i;
            }
        }
        s->state = inside >> 63 ? IN_STRING : OUT_OF_STRING;
        p += 64;
    }
    return p;
}
#endif

static PyObject *scan(PyObject *module, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    ScanState s = {-1, 0, 0, OUT_OF_STRING};
    if (!PyArg_ParseTuple(args, "y*nnin", &view, &start, &s.depth, &s.state, &s.max_depth)) return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len, p = start < 0 ? 0 : start > end ? end : start;
#if defined(__SSE2__) && defined(__GNUC__)
    p = scan_blocks(data, p, end, &s);
    if (s.depth >= 0 && s.depth <= s.max_depth)
#endif
        p = scan_bytes(data, p, end, &s);
    PyBuffer_Release(&view);
    return Py_BuildValue("nnni", s.cut, p, s.depth, s.state);
}

static PyMethodDef module_methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(text, start, depth, state, max_depth) -> (cut, stop, depth, state): the offset of the last comma at "
     "depth 0 outside strings from start (-1: none), where the scan stopped (the end, the array's closing "
     "bracket at depth -1, or past max_depth), and the state there."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_eventloop", "The trace reader's event loop in C (see events.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__eventloop(void) {
    scan_classes();
    if (PyType_Ready(&LoopType) < 0) return NULL;
    STR_USER_ANNOTATION = PyUnicode_InternFromString("user_annotation");
    STR_CUDA_DRIVER = PyUnicode_InternFromString("cuda_driver");
    STR_HIP = PyUnicode_InternFromString("hip");
    STR_CU = PyUnicode_InternFromString("cu");
    STR_AMD = PyUnicode_InternFromString("amd");
    STR_NVIDIA = PyUnicode_InternFromString("nvidia");
    STR_FROMBYTES = PyUnicode_InternFromString("frombytes");
    STR_EMPTY = PyUnicode_InternFromString("");
    if (!STR_EMPTY || !STR_USER_ANNOTATION || !STR_CUDA_DRIVER || !STR_HIP || !STR_CU || !STR_AMD || !STR_NVIDIA || !STR_FROMBYTES)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&LoopType);
    if (PyModule_AddObject(m, "Loop", (PyObject *)&LoopType) < 0) {
        Py_DECREF(&LoopType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
