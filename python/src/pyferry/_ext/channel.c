/*
 * channel.c - pyferry's broadcast channels: ChanWriter and ChanReader
 * around api/ferry/channel.h (pyferry.MessageQueue is built on them in
 * Python). Blocking calls release the GIL and wait in slices of 100 ms so
 * that a signal (KeyboardInterrupt) ends them. A channel object is used by
 * one thread at a time (ferry's rule): a second thread calling it while the
 * first waits gets RuntimeError. Each object keeps its Engine alive and
 * counts as a blocking call of it while it waits; an Engine closed first
 * leaves the channel's few bytes unfreed (its ops and CQs went with it).
 */
#include "pyf.h"

#include <ferry/channel.h>
#include <math.h>

#define SLICE_NS 100000000ll

typedef struct {
	PyObject_HEAD
	struct ferry_chan_writer *w;
	pyf_engine *engine;
	int busy;
} pyf_chanw;

typedef struct {
	PyObject_HEAD
	struct ferry_chan_reader *r;
	pyf_engine *engine;
	int busy;
} pyf_chanr;

/* seconds (None: forever) -> ns (< 0: forever); -2 with an exception. */
static int64_t timeout_arg(PyObject *t)
{
	double s;

	if (!t || t == Py_None)
		return -1;
	s = PyFloat_AsDouble(t);
	if (s == -1.0 && PyErr_Occurred())
		return -2;
	if (isnan(s) || s < 0) {
		PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 seconds or None");
		return -2;
	}
	if (isinf(s) || s > 1e9)
		return -1;
	return (int64_t)(s * 1e9);
}

static int enter(pyf_engine *e, int *busy)
{
	if (pyf_engine_check(e))
		return -1;
	if (*busy) {
		PyErr_SetString(PyExc_RuntimeError, "the channel is in use by another thread");
		return -1;
	}
	*busy = 1;
	e->busy++;
	return 0;
}

static void leave(pyf_engine *e, int *busy)
{
	*busy = 0;
	e->busy--;
}

/*
 * Run call(obj, slice) in slices until it returns something other than
 * -ETIMEDOUT or the timeout passed; the GIL released meanwhile. -EINTR
 * with the exception set on a signal.
 */
static int64_t sliced(int64_t (*call)(void *, int64_t, void *), void *obj, void *arg,
		      int64_t timeout)
{
	struct timespec ts;
	int64_t end = 0, rc;

	if (timeout >= 0) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		end = ts.tv_sec * 1000000000ll + ts.tv_nsec + timeout;
	}
	for (;;) {
		int64_t slice = SLICE_NS;

		if (timeout >= 0) {
			clock_gettime(CLOCK_MONOTONIC, &ts);
			slice = end - (ts.tv_sec * 1000000000ll + ts.tv_nsec);
			if (slice < 0)
				slice = 0;
			if (slice > SLICE_NS)
				slice = SLICE_NS;
		}
		Py_BEGIN_ALLOW_THREADS
		rc = call(obj, slice, arg);
		Py_END_ALLOW_THREADS
		if (rc != -ETIMEDOUT || (timeout >= 0 && slice < SLICE_NS))
			return rc;
		if (timeout == 0)
			return rc;
		if (PyErr_CheckSignals() < 0)
			return -EINTR;
	}
}

/* ------------------------------------------------------------------ */
/* ChanWriter                                                          */
/* ------------------------------------------------------------------ */

static int chanw_init(pyf_chanw *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "engine", "name", "readers", "max_outstanding", NULL };
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;
	PyObject *eng;
	const char *name;
	unsigned readers, window = 0;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!sI|I", kwlist, &pyf_engine_type, &eng, &name,
					 &readers, &window))
		return -1;
	if (self->w) {
		PyErr_SetString(PyExc_RuntimeError, "ChanWriter is initialised already");
		return -1;
	}
	if (pyf_engine_check((pyf_engine *)eng))
		return -1;
	p.readers = readers;
	p.max_outstanding = window;
	rc = ferry_chan_create(((pyf_engine *)eng)->e, name, &p, &self->w);
	if (rc) {
		pyf_raise(rc, "ferry_chan_create");
		return -1;
	}
	Py_INCREF(eng);
	self->engine = (pyf_engine *)eng;
	return 0;
}

static int chanw_check(pyf_chanw *self)
{
	if (!self->w) {
		PyErr_SetString(PyExc_ValueError, "the channel is closed");
		return -1;
	}
	return enter(self->engine, &self->busy);
}

static PyObject *chanw_handle(pyf_chanw *self, PyObject *noargs)
{
	char h[FERRY_CHAN_HANDLE_MAX];
	int n;

	(void)noargs;
	if (chanw_check(self))
		return NULL;
	n = ferry_chan_handle(self->w, h, sizeof(h));
	leave(self->engine, &self->busy);
	if (n < 0)
		return pyf_raise(n, "ferry_chan_handle");
	return PyUnicode_FromStringAndSize(h, n < (int)sizeof(h) ? n : (int)sizeof(h) - 1);
}

static int64_t call_ready(void *w, int64_t slice, void *arg)
{
	(void)arg;
	return ferry_chan_wait_ready(w, slice);
}

static int64_t call_flush(void *w, int64_t slice, void *arg)
{
	(void)arg;
	return ferry_chan_flush(w, slice);
}

static PyObject *chanw_wait(pyf_chanw *self, PyObject *args, PyObject *kw,
			    int64_t (*call)(void *, int64_t, void *), const char *what)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *t = Py_None;
	int64_t timeout, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &t))
		return NULL;
	if ((timeout = timeout_arg(t)) == -2 || chanw_check(self))
		return NULL;
	rc = sliced(call, self->w, NULL, timeout);
	leave(self->engine, &self->busy);
	if (rc == -EINTR && PyErr_Occurred())
		return NULL;
	if (rc < 0)
		return pyf_raise((int)rc, what);
	Py_RETURN_NONE;
}

static PyObject *chanw_wait_ready(pyf_chanw *self, PyObject *args, PyObject *kw)
{
	return chanw_wait(self, args, kw, call_ready, "ferry_chan_wait_ready");
}

static PyObject *chanw_flush(pyf_chanw *self, PyObject *args, PyObject *kw)
{
	return chanw_wait(self, args, kw, call_flush, "ferry_chan_flush");
}

struct write_arg {
	struct pyf_data *d;
	struct ferry_buf *buf;
};

static int64_t call_write(void *w, int64_t slice, void *arg)
{
	struct write_arg *a = arg;

	if (a->buf)
		return ferry_chan_write_buf(w, a->buf, slice);
	return ferry_chan_write(w, a->d->iov, a->d->n, slice);
}

static PyObject *chanw_write(pyf_chanw *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "data", "timeout", NULL };
	PyObject *data, *t = Py_None;
	struct pyf_data d;
	struct write_arg a = { &d, NULL };
	int64_t timeout, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &data, &t))
		return NULL;
	if ((timeout = timeout_arg(t)) == -2)
		return NULL;
	if (pyf_data_get(data, &d, 1) < 0)
		return NULL;
	if (chanw_check(self)) {
		pyf_data_release(&d);
		return NULL;
	}
	a.buf = d.buf;
	rc = sliced(call_write, self->w, &a, timeout);
	leave(self->engine, &self->busy);
	if (rc >= 0)
		d.buf = NULL; /* the channel's now */
	if (rc == -EAGAIN && timeout != 0)
		rc = -ETIMEDOUT; /* the last slice of a longer wait was 0 */
	pyf_data_release(&d);
	if (rc == -EINTR && PyErr_Occurred())
		return NULL;
	if (rc < 0)
		return pyf_raise((int)rc, "ferry_chan_write");
	return PyLong_FromLongLong(rc);
}

static PyObject *chanw_stats(pyf_chanw *self, PyObject *noargs)
{
	struct ferry_chan_stats st;
	int rc;

	(void)noargs;
	if (chanw_check(self))
		return NULL;
	rc = ferry_chan_stats(self->w, &st);
	leave(self->engine, &self->busy);
	if (rc)
		return pyf_raise(rc, "ferry_chan_stats");
	return Py_BuildValue("{sIsIsIsIsIsKsKsKsKsK}", "readers", st.readers, "attached",
			     st.attached, "live", st.live, "dead", st.dead, "left", st.left,
			     "written", (unsigned long long)st.written, "outstanding",
			     (unsigned long long)st.outstanding, "delivered",
			     (unsigned long long)st.delivered, "write_waits",
			     (unsigned long long)st.write_waits, "bytes_copied",
			     (unsigned long long)st.bytes_copied);
}

static PyObject *chanw_close(pyf_chanw *self, PyObject *noargs)
{
	struct ferry_chan_writer *w = self->w;

	(void)noargs;
	if (!w)
		Py_RETURN_NONE;
	if (self->engine->e == NULL) { /* the engine went first: nothing of ferry's is left */
		self->w = NULL;
		Py_RETURN_NONE;
	}
	if (chanw_check(self))
		return NULL;
	self->w = NULL;
	Py_BEGIN_ALLOW_THREADS
	ferry_chan_close(w);
	Py_END_ALLOW_THREADS
	leave(self->engine, &self->busy);
	Py_RETURN_NONE;
}

static void chanw_dealloc(pyf_chanw *self)
{
	if (self->w && self->engine && self->engine->e && !self->busy) {
		self->engine->busy++; /* the engine is not closed meanwhile */
		Py_BEGIN_ALLOW_THREADS /* it may wait for the messages still out */
		ferry_chan_close(self->w);
		Py_END_ALLOW_THREADS
		self->engine->busy--;
	}
	Py_XDECREF(self->engine);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef chanw_methods[] = {
	{ "handle", (PyCFunction)chanw_handle, METH_NOARGS, "The channel's handle (str)." },
	{ "wait_ready", (PyCFunction)(void (*)(void))chanw_wait_ready, METH_VARARGS | METH_KEYWORDS,
	  "wait_ready(timeout=None): until every reader attached." },
	{ "write", (PyCFunction)(void (*)(void))chanw_write, METH_VARARGS | METH_KEYWORDS,
	  "write(data, timeout=None) -> seq: bytes-like, a list of them, or a Buffer (zero copy)." },
	{ "flush", (PyCFunction)(void (*)(void))chanw_flush, METH_VARARGS | METH_KEYWORDS,
	  "flush(timeout=None): until every message reached every live reader." },
	{ "stats", (PyCFunction)chanw_stats, METH_NOARGS, "The channel's counters (dict)." },
	{ "close", (PyCFunction)chanw_close, METH_NOARGS, "End the channel (idempotent)." },
	{ NULL, NULL, 0, NULL },
};

PyTypeObject pyf_chanw_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry._ferry.ChanWriter",
	.tp_basicsize = sizeof(pyf_chanw),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "ChanWriter(engine, name, readers, max_outstanding=0): a broadcast channel's writer.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)chanw_init,
	.tp_dealloc = (destructor)chanw_dealloc,
	.tp_methods = chanw_methods,
};

/* ------------------------------------------------------------------ */
/* ChanReader                                                          */
/* ------------------------------------------------------------------ */

static int chanr_init(pyf_chanr *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "engine", "handle", "remote", "attach_timeout", NULL };
	struct ferry_chan_open_params p = FERRY_CHAN_OPEN_PARAMS_INIT;
	PyObject *eng, *t = Py_None;
	const char *handle;
	int remote = 0, rc;
	int64_t at;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!s|pO", kwlist, &pyf_engine_type, &eng, &handle,
					 &remote, &t))
		return -1;
	if (self->r) {
		PyErr_SetString(PyExc_RuntimeError, "ChanReader is initialised already");
		return -1;
	}
	if ((at = timeout_arg(t)) == -2 || pyf_engine_check((pyf_engine *)eng))
		return -1;
	p.remote = remote;
	p.attach_timeout_ns = at > 0 ? at : 0;
	rc = ferry_chan_open(((pyf_engine *)eng)->e, handle, &p, &self->r);
	if (rc) {
		pyf_raise(rc, "ferry_chan_open");
		return -1;
	}
	Py_INCREF(eng);
	self->engine = (pyf_engine *)eng;
	return 0;
}

static int chanr_check(pyf_chanr *self)
{
	if (!self->r) {
		PyErr_SetString(PyExc_ValueError, "the channel is closed");
		return -1;
	}
	return enter(self->engine, &self->busy);
}

static int64_t call_rready(void *r, int64_t slice, void *arg)
{
	(void)arg;
	return ferry_chan_reader_wait_ready(r, slice);
}

struct deq_arg {
	struct ferry_buf *buf;
	uint64_t seq;
};

static int64_t call_dequeue(void *r, int64_t slice, void *arg)
{
	struct deq_arg *a = arg;

	return ferry_chan_dequeue(r, slice, &a->buf, &a->seq);
}

static PyObject *chanr_wait_ready(pyf_chanr *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *t = Py_None;
	int64_t timeout, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &t))
		return NULL;
	if ((timeout = timeout_arg(t)) == -2 || chanr_check(self))
		return NULL;
	rc = sliced(call_rready, self->r, NULL, timeout);
	leave(self->engine, &self->busy);
	if (rc == -EINTR && PyErr_Occurred())
		return NULL;
	if (rc < 0)
		return pyf_raise((int)rc, "ferry_chan_reader_wait_ready");
	Py_RETURN_NONE;
}

static PyObject *chanr_dequeue(pyf_chanr *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *t = Py_None, *buf;
	struct deq_arg a = { NULL, 0 };
	int64_t timeout, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &t))
		return NULL;
	if ((timeout = timeout_arg(t)) == -2 || chanr_check(self))
		return NULL;
	rc = sliced(call_dequeue, self->r, &a, timeout);
	leave(self->engine, &self->busy);
	if (rc == -EINTR && PyErr_Occurred())
		return NULL;
	if (rc < 0)
		return pyf_raise((int)rc, "ferry_chan_dequeue");
	buf = pyf_buffer_new(a.buf, 1);
	if (!buf) {
		ferry_buf_release(a.buf);
		return NULL;
	}
	return Py_BuildValue("(KN)", (unsigned long long)a.seq, buf);
}

static PyObject *chanr_fileno(pyf_chanr *self, PyObject *noargs)
{
	(void)noargs;
	if (!self->r) {
		PyErr_SetString(PyExc_ValueError, "the channel is closed");
		return NULL;
	}
	return PyLong_FromLong(ferry_cq_fd(ferry_chan_reader_cq(self->r)));
}

static PyObject *chanr_close(pyf_chanr *self, PyObject *noargs)
{
	struct ferry_chan_reader *r = self->r;

	(void)noargs;
	if (!r)
		Py_RETURN_NONE;
	if (self->engine->e == NULL) {
		self->r = NULL;
		Py_RETURN_NONE;
	}
	if (chanr_check(self))
		return NULL;
	self->r = NULL;
	Py_BEGIN_ALLOW_THREADS
	ferry_chan_reader_close(r);
	Py_END_ALLOW_THREADS
	leave(self->engine, &self->busy);
	Py_RETURN_NONE;
}

static void chanr_dealloc(pyf_chanr *self)
{
	if (self->r && self->engine && self->engine->e && !self->busy) {
		self->engine->busy++; /* the engine is not closed meanwhile */
		Py_BEGIN_ALLOW_THREADS /* it may wait for the messages still out */
		ferry_chan_reader_close(self->r);
		Py_END_ALLOW_THREADS
		self->engine->busy--;
	}
	Py_XDECREF(self->engine);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef chanr_methods[] = {
	{ "wait_ready", (PyCFunction)(void (*)(void))chanr_wait_ready, METH_VARARGS | METH_KEYWORDS,
	  "wait_ready(timeout=None): until the writer holds the attach." },
	{ "dequeue", (PyCFunction)(void (*)(void))chanr_dequeue, METH_VARARGS | METH_KEYWORDS,
	  "dequeue(timeout=None) -> (seq, Buffer): the next message, zero copy (read-only)." },
	{ "fileno", (PyCFunction)chanr_fileno, METH_NOARGS,
	  "The fd of the CQ messages complete on (readable: something came)." },
	{ "close", (PyCFunction)chanr_close, METH_NOARGS, "Leave the channel (idempotent)." },
	{ NULL, NULL, 0, NULL },
};

PyTypeObject pyf_chanr_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry._ferry.ChanReader",
	.tp_basicsize = sizeof(pyf_chanr),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "ChanReader(engine, handle, remote=False, attach_timeout=None): a reader's end.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)chanr_init,
	.tp_dealloc = (destructor)chanr_dealloc,
	.tp_methods = chanr_methods,
};
