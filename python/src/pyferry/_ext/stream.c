/*
 * stream.c - pyferry.StreamIter: the blocking iterator over one stream's
 * chunks (Engine.stream). One multishot STREAM_GET, submitted when the
 * iterator is made, posts to a CQ of the iterator's own, so it can be
 * iterated from any thread and interleaved with other calls. Each chunk is a
 * Buffer (zero copy; releasing it returns its credit to the producer). The
 * END chunk is the last item; an abort raises FerryCancelledError carrying
 * the producer's reason; close() (or collection, or leaving a `with`)
 * cancels what is left.
 */
#include "pyf.h"

#include <errno.h>

typedef struct {
	PyObject_HEAD
	pyf_engine *engine;
	struct ferry_cq *cq;
	uint64_t ud;
	int done;
	long long last_index;
	char key[FERRY_KEY_MAX];
} pyf_stream;

PyObject *pyf_stream_open(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "stream", "timeout", "whole", NULL };
	PyObject *peer_o, *timeout_o = Py_None;
	const char *key;
	int whole = 0, rc;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	uint64_t tns;
	pyf_stream *it;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|$Op", kwlist, &peer_o, &key, &timeout_o,
					 &whole))
		return NULL;
	if (pyf_engine_check(self) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(self, peer_o, &peer))
		return NULL;
	if (!(it = PyObject_New(pyf_stream, &pyf_stream_type)))
		return NULL;
	Py_INCREF(self);
	it->engine = self;
	it->cq = NULL;
	it->done = 1;
	it->last_index = -1;
	snprintf(it->key, sizeof(it->key), "%s", key);
	cp.entries = 64;
	if ((rc = ferry_cq_create(self->e, &cp, &it->cq)) < 0) {
		it->cq = NULL;
		Py_DECREF(it);
		return pyf_raise(rc, "ferry_cq_create");
	}
	if (!(sqe = pyf_sqe(self, &sq))) {
		Py_DECREF(it);
		return NULL;
	}
	it->ud = pyf_ud(self);
	ferry_prep_stream_get(sqe, peer, key, it->ud);
	ferry_sqe_set_cq(sqe, it->cq);
	if (tns)
		ferry_sqe_set_timeout(sqe, tns);
	if (whole)
		ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_WHOLE);
	if ((rc = ferry_sq_submit(sq)) < 0) {
		Py_DECREF(it);
		return pyf_raise(rc, "ferry_sq_submit");
	}
	it->done = 0;
	return (PyObject *)it;
}

static PyObject *stream_next(pyf_stream *it)
{
	struct ferry_cqe cqe;

	if (it->done)
		return NULL; /* StopIteration */
	if (pyf_engine_check(it->engine))
		return NULL;
	if (pyf_wait(it->engine, it->cq, it->ud, &cqe)) {
		it->done = 1; /* cancelled and drained by pyf_wait */
		return NULL;
	}
	if (!(cqe.flags & FERRY_CQE_F_MORE))
		it->done = 1;
	if (cqe.res < 0) {
		char text[FERRY_KEY_MAX + 1100];

		it->done = 1;
		if (cqe.res == -ECANCELED && (cqe.flags & FERRY_CQE_F_BUF) && cqe.buf)
			snprintf(text, sizeof(text), "stream '%s' aborted: %.*s", it->key,
				 (int)ferry_buf_len(cqe.buf), (const char *)ferry_buf_data(cqe.buf));
		else
			snprintf(text, sizeof(text), "stream '%s'", it->key);
		if ((cqe.flags & FERRY_CQE_F_BUF) && cqe.buf)
			ferry_buf_release(cqe.buf);
		return pyf_raise(cqe.res, text);
	}
	it->last_index = cqe.res;
	if (!(cqe.flags & FERRY_CQE_F_BUF) || !cqe.buf) {
		PyErr_SetString(PyExc_RuntimeError, "stream chunk without a buffer");
		return NULL;
	}
	return pyf_buffer_new(cqe.buf, 1);
}

static void stream_finish(pyf_stream *it)
{
	if (!it->engine->e) { /* its CQ went with the engine */
		it->cq = NULL;
		it->done = 1;
		return;
	}
	if (!it->done) {
		/* chunks already posted to our CQ are released as they are drained */
		pyf_cancel_drain(it->engine, it->cq, it->ud);
		it->done = 1;
	}
	if (it->cq) {
		ferry_cq_destroy(it->cq);
		it->cq = NULL;
	}
}

static PyObject *stream_close(pyf_stream *it, PyObject *noargs)
{
	(void)noargs;
	stream_finish(it);
	Py_RETURN_NONE;
}

static PyObject *stream_enter(pyf_stream *it, PyObject *noargs)
{
	(void)noargs;
	Py_INCREF(it);
	return (PyObject *)it;
}

static PyObject *stream_exit(pyf_stream *it, PyObject *args)
{
	(void)args;
	stream_finish(it);
	Py_RETURN_NONE;
}

static PyObject *stream_last_index(pyf_stream *it, void *closure)
{
	(void)closure;
	return PyLong_FromLongLong(it->last_index);
}

static void stream_dealloc(pyf_stream *it)
{
	PyObject *et, *ev, *tb;

	PyErr_Fetch(&et, &ev, &tb);
	stream_finish(it);
	PyErr_Restore(et, ev, tb);
	Py_DECREF(it->engine);
	PyObject_Free(it);
}

static PyMethodDef stream_methods[] = {
	{ "close", (PyCFunction)stream_close, METH_NOARGS,
	  "Stop reading: cancel the STREAM_GET and drop the chunks not taken (idempotent)." },
	{ "__enter__", (PyCFunction)stream_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)stream_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef stream_getset[] = {
	{ "last_index", (getter)stream_last_index, NULL, "Index of the last chunk returned.",
	  NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject pyf_stream_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry.StreamIter",
	.tp_basicsize = sizeof(pyf_stream),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "The chunks of one stream, in order, as Buffers (Engine.stream).",
	.tp_dealloc = (destructor)stream_dealloc,
	.tp_iter = PyObject_SelfIter,
	.tp_iternext = (iternextfunc)stream_next,
	.tp_methods = stream_methods,
	.tp_getset = stream_getset,
};
