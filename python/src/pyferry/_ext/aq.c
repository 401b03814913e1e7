/*
 * aq.c - pyferry._ferry.AsyncQueue: a completion queue for one event loop
 * (pyferry.aio drives it). Ops are submitted from the loop's thread and
 * post here; the loop sleeps on fileno() (ferry_cq_fd) and, when it is
 * readable, takes completions with poll() and arms the fd again with arm()
 * (ferry's fd + arm protocol). No thread and no timer per op. The memory a
 * put reads from is held (its buffer views) until the op's last CQE.
 */
#include "pyf.h"

#include <errno.h>

typedef struct {
	PyObject_HEAD
	pyf_engine *engine;
	struct ferry_cq *cq;
	PyObject *held; /* user_data -> capsule holding the put's views */
} pyf_aq;

PyObject *pyf_aq_new(pyf_engine *engine)
{
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	pyf_aq *q;
	int rc;

	if (!(q = PyObject_GC_New(pyf_aq, &pyf_aq_type)))
		return NULL;
	Py_INCREF(engine);
	q->engine = engine;
	q->cq = NULL;
	q->held = NULL;
	PyObject_GC_Track(q);
	if (!(q->held = PyDict_New())) {
		Py_DECREF(q);
		return NULL;
	}
	if ((rc = ferry_cq_create(engine->e, &cp, &q->cq)) < 0) {
		q->cq = NULL;
		Py_DECREF(q);
		return pyf_raise(rc, "ferry_cq_create");
	}
	return (PyObject *)q;
}

static int aq_check(pyf_aq *q)
{
	if (!q->engine->e || !q->cq) {
		PyErr_SetString(PyExc_ValueError, "the engine is closed");
		return -1;
	}
	return 0;
}

static void held_free(PyObject *cap)
{
	struct pyf_data *d = PyCapsule_GetPointer(cap, "pyferry.held");

	if (d) {
		pyf_data_release(d);
		PyMem_Free(d);
	}
}

static PyObject *aq_fileno(pyf_aq *q, PyObject *noargs)
{
	int fd;

	(void)noargs;
	if (aq_check(q))
		return NULL;
	if ((fd = ferry_cq_fd(q->cq)) < 0)
		return pyf_raise(fd, "ferry_cq_fd");
	return PyLong_FromLong(fd);
}

static PyObject *aq_arm(pyf_aq *q, PyObject *noargs)
{
	int rc;

	(void)noargs;
	if (aq_check(q))
		return NULL;
	rc = ferry_cq_arm(q->cq);
	if (rc == 0 || rc == -EBUSY)
		return PyBool_FromLong(rc == 0);
	return pyf_raise(rc, "ferry_cq_arm");
}

/* poll() -> [(user_data, res, len, more, Buffer | None), ...] */
static PyObject *aq_poll(pyf_aq *q, PyObject *noargs)
{
	struct ferry_cqe cqes[64];
	PyObject *list, *t, *b;
	int n;

	(void)noargs;
	if (aq_check(q))
		return NULL;
	n = ferry_cq_poll(q->cq, cqes, 64);
	if (n < 0)
		return pyf_raise(n, "ferry_cq_poll");
	if (!(list = PyList_New(n))) {
		for (int i = 0; i < n; i++)
			if ((cqes[i].flags & FERRY_CQE_F_BUF) && cqes[i].buf)
				ferry_buf_release(cqes[i].buf);
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		struct ferry_cqe *c = &cqes[i];
		int more = (c->flags & FERRY_CQE_F_MORE) != 0;

		if ((c->flags & FERRY_CQE_F_BUF) && c->buf) {
			b = pyf_buffer_new(c->buf, 1);
			c->buf = NULL;
		} else {
			b = Py_NewRef(Py_None);
		}
		t = b ? Py_BuildValue("(KiKiN)", (unsigned long long)c->user_data, (int)c->res,
				      (unsigned long long)c->len, more, b)
		      : NULL;
		if (!more) { /* the op is over: let go of its memory */
			PyObject *k = PyLong_FromUnsignedLongLong(c->user_data);

			if (k && PyDict_Contains(q->held, k) == 1)
				PyDict_DelItem(q->held, k);
			Py_XDECREF(k);
		}
		if (!t) {
			for (int j = i + 1; j < n; j++)
				if ((cqes[j].flags & FERRY_CQE_F_BUF) && cqes[j].buf)
					ferry_buf_release(cqes[j].buf);
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, i, t);
	}
	return list;
}

/* A prepped entry that cannot go as it is: it is taken, so it goes as a NOP. */
static void nop_entry(pyf_aq *q, struct ferry_sq *sq, struct ferry_sqe *sqe)
{
	ferry_prep_nop(sqe, pyf_ud(q->engine));
	ferry_sqe_set_cq(sqe, q->cq);
	ferry_sq_submit(sq);
}

/*
 * Submit the prepped entry to this queue's CQ under a fresh user_data;
 * cap (a capsule holding what the op uses, or NULL; its reference is taken)
 * stays in held until the op's last CQE. The user_data, or NULL with an
 * exception (the entry then went as a NOP).
 */
static PyObject *submit_held(pyf_aq *q, struct ferry_sq *sq, struct ferry_sqe *sqe,
			     uint64_t tns, PyObject *cap)
{
	uint64_t ud = pyf_ud(q->engine);
	PyObject *k = PyLong_FromUnsignedLongLong(ud);
	int rc;

	if (!k || (cap && PyDict_SetItem(q->held, k, cap) < 0)) {
		nop_entry(q, sq, sqe);
		Py_XDECREF(k);
		Py_XDECREF(cap);
		return NULL;
	}
	Py_XDECREF(cap); /* held's now */
	sqe->user_data = ud;
	ferry_sqe_set_cq(sqe, q->cq);
	if (tns)
		ferry_sqe_set_timeout(sqe, tns);
	if ((rc = ferry_sq_submit(sq)) < 0) {
		if (cap && PyDict_DelItem(q->held, k) < 0)
			PyErr_Clear();
		Py_DECREF(k);
		return pyf_raise(rc, "ferry_sq_submit");
	}
	return k;
}

/* submit_held, hold (a put's views, or NULL) in a capsule of its own. */
static PyObject *submit(pyf_aq *q, struct ferry_sq *sq, struct ferry_sqe *sqe, uint64_t tns,
			struct pyf_data *hold)
{
	PyObject *cap = NULL;

	if (hold && !(cap = PyCapsule_New(hold, "pyferry.held", held_free))) {
		nop_entry(q, sq, sqe);
		pyf_data_release(hold);
		PyMem_Free(hold);
		return NULL;
	}
	return submit_held(q, sq, sqe, tns, cap);
}

static PyObject *aq_put_common(pyf_aq *q, PyObject *args, PyObject *kw, int chunk)
{
	static char *kwlist[] = { "peer", "key", "data", "timeout", "replace", "wait_peer",
				  "end", NULL };
	PyObject *peer_o, *data_o, *timeout_o = Py_None;
	const char *key;
	int replace = 0, wait_peer = 0, end = 0;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct pyf_data *d;
	uint64_t tns;
	uint32_t flags = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OsO|$Oppp", kwlist, &peer_o, &key, &data_o,
					 &timeout_o, &replace, &wait_peer, &end))
		return NULL;
	if (aq_check(q) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(q->engine, peer_o, &peer))
		return NULL;
	if (!(d = PyMem_Malloc(sizeof(*d))))
		return PyErr_NoMemory();
	if (pyf_data_get(data_o, d, 1)) {
		PyMem_Free(d);
		return NULL;
	}
	if (!(sqe = pyf_sqe(q->engine, &sq))) {
		pyf_data_release(d);
		PyMem_Free(d);
		return NULL;
	}
	if (d->buf) {
		if (chunk)
			ferry_prep_stream_put_buf(sqe, peer, key, d->buf, 0);
		else
			ferry_prep_put_buf(sqe, peer, key, d->buf, 0);
		d->buf = NULL;
	} else if (chunk) {
		ferry_prep_stream_put(sqe, peer, key, d->iov, d->n, 0);
	} else {
		ferry_prep_put(sqe, peer, key, d->iov, d->n, 0);
	}
	if (replace && !chunk)
		flags |= FERRY_SQE_REPLACE;
	if (wait_peer)
		flags |= FERRY_SQE_WAIT_PEER;
	if (end && chunk)
		flags |= FERRY_SQE_STREAM_END;
	if (flags)
		ferry_sqe_set_flags(sqe, flags);
	return submit(q, sq, sqe, tns, d);
}

static PyObject *aq_put(pyf_aq *q, PyObject *args, PyObject *kw)
{
	return aq_put_common(q, args, kw, 0);
}

static PyObject *aq_put_chunk(pyf_aq *q, PyObject *args, PyObject *kw)
{
	return aq_put_common(q, args, kw, 1);
}

static PyObject *aq_get(pyf_aq *q, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "key", "timeout", "nowait", NULL };
	PyObject *peer_o, *timeout_o = Py_None;
	const char *key;
	int nowait = 0;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	uint64_t tns;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|$Op", kwlist, &peer_o, &key, &timeout_o,
					 &nowait))
		return NULL;
	if (aq_check(q) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(q->engine, peer_o, &peer) || !(sqe = pyf_sqe(q->engine, &sq)))
		return NULL;
	ferry_prep_get(sqe, peer, key, NULL, 0, 0);
	if (nowait)
		ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
	return submit(q, sq, sqe, tns, NULL);
}

static PyObject *aq_stream(pyf_aq *q, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "stream", "timeout", "whole", NULL };
	PyObject *peer_o, *timeout_o = Py_None;
	const char *key;
	int whole = 0;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	uint64_t tns;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|$Op", kwlist, &peer_o, &key, &timeout_o,
					 &whole))
		return NULL;
	if (aq_check(q) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(q->engine, peer_o, &peer) || !(sqe = pyf_sqe(q->engine, &sq)))
		return NULL;
	ferry_prep_stream_get(sqe, peer, key, 0);
	if (whole)
		ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_WHOLE);
	return submit(q, sq, sqe, tns, NULL);
}

/*
 * A device PUT's hold: its region (registered for the op, released when
 * the op is over) and the object whose device memory it is (kept alive
 * until then). The engine is borrowed: the dict that holds this capsule is
 * the queue's (which holds the engine) or, orphaned, the engine's own.
 */
struct pyf_held_dev {
	pyf_engine *engine;
	struct ferry_region *r;
	struct ferry_seg seg; /* the PUT's segment: it must outlive the op */
	PyObject *obj;
	struct pyf_held_dev *next; /* on engine->orphans */
};

/*
 * The capsule goes: the op is over (its CQE was polled), or its queue went
 * first. A region an op still pins (-EBUSY) means the op runs on (a PUT by
 * CUDA IPC whose receiver has not copied yet): the hold, its segment and
 * the object stay, on the engine's orphans, until the engine is destroyed.
 */
static void held_dev_free(PyObject *cap)
{
	struct pyf_held_dev *h = PyCapsule_GetPointer(cap, "pyferry.held_dev");

	if (!h)
		return;
	if (h->engine->e && h->r && ferry_region_release(&h->r) == -EBUSY) {
		h->next = h->engine->orphans;
		h->engine->orphans = h;
		return;
	}
	Py_XDECREF(h->obj); /* (a closed engine freed its regions) */
	PyMem_Free(h);
}

void pyf_orphans_drop(pyf_engine *engine)
{
	struct pyf_held_dev *h = engine->orphans, *next;

	engine->orphans = NULL;
	for (; h; h = next) {
		next = h->next;
		Py_XDECREF(h->obj);
		PyMem_Free(h);
	}
}

/*
 * put_device(peer, key, ptr, length, device=0, *, stream=0, event=0,
 * timeout=None, replace=False, wait_peer=False, hold=None) -> user_data: a
 * PUT of CUDA device memory whose CQE comes to this queue; hold (the tensor
 * the memory belongs to) and the region stay held until then. A PUT by CUDA
 * IPC completes only once its receiver has copied the memory.
 */
static PyObject *aq_put_device(pyf_aq *q, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "key", "ptr", "length", "device", "stream", "event",
				  "timeout", "replace", "wait_peer", "hold", NULL };
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	PyObject *peer_o, *timeout_o = Py_None, *hold_o = Py_None, *cap;
	const char *key;
	unsigned long long ptr, len, stream = 0, event = 0;
	int device = 0, replace = 0, wait_peer = 0, rc;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct pyf_held_dev *h;
	uint64_t tns;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OsKK|i$KKOppO", kwlist, &peer_o, &key, &ptr,
					 &len, &device, &stream, &event, &timeout_o, &replace,
					 &wait_peer, &hold_o))
		return NULL;
	if (aq_check(q) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(q->engine, peer_o, &peer))
		return NULL;
	if (!(h = PyMem_Calloc(1, sizeof(*h))))
		return PyErr_NoMemory();
	h->engine = q->engine;
	rp.addr = (void *)(uintptr_t)ptr;
	rp.len = len ? (size_t)len : 1;
	rp.mem = FERRY_MEM_CUDA;
	rp.device = device;
	if ((rc = ferry_region_register(q->engine->e, &rp, &h->r)) < 0) {
		PyMem_Free(h);
		return pyf_raise(rc, "ferry_region_register (CUDA device memory)");
	}
	h->obj = Py_NewRef(hold_o);
	if (!(cap = PyCapsule_New(h, "pyferry.held_dev", held_dev_free))) {
		ferry_region_release(&h->r);
		Py_DECREF(h->obj);
		PyMem_Free(h);
		return NULL;
	}
	if (!(sqe = pyf_sqe(q->engine, &sq))) {
		Py_DECREF(cap); /* releases the region */
		return NULL;
	}
	h->seg = (struct ferry_seg){ h->r, 0, len };
	ferry_prep_put_segs(sqe, peer, key, &h->seg, 1, 0);
	ferry_sqe_set_flags(sqe, (replace ? FERRY_SQE_REPLACE : 0) |
				    (wait_peer ? FERRY_SQE_WAIT_PEER : 0));
	if (event)
		ferry_sqe_set_cuda_wait(sqe, FERRY_CUDA_WAIT_EVENT, (void *)(uintptr_t)event);
	else if (stream)
		ferry_sqe_set_cuda_wait(sqe, FERRY_CUDA_WAIT_STREAM, (void *)(uintptr_t)stream);
	return submit_held(q, sq, sqe, tns, cap);
}

static PyObject *aq_cancel(pyf_aq *q, PyObject *arg)
{
	unsigned long long target = PyLong_AsUnsignedLongLong(arg);
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;

	if (PyErr_Occurred() || aq_check(q) || !(sqe = pyf_sqe(q->engine, &sq)))
		return NULL;
	ferry_prep_cancel(sqe, target, 0);
	return submit(q, sq, sqe, 0, NULL);
}

static PyObject *aq_pending(pyf_aq *q, PyObject *noargs)
{
	(void)noargs;
	return PyLong_FromSsize_t(PyDict_Size(q->held));
}

/*
 * Give the CQ back to the engine now, if nothing can use it any more: no
 * put holds memory (its op is in flight) and ferry_cq_destroy agrees (no op
 * it took targets the CQ). Completions still in it are taken first and
 * their buffers released. Returns 1 when the CQ is gone (or went with the
 * engine), 0 when it stays to the engine (freed by ferry_engine_destroy).
 * Only once no event loop watches its fd.
 */
static int aq_release_cq(pyf_aq *q)
{
	struct ferry_cqe cqes[64];
	int n;

	if (!q->engine->e)
		q->cq = NULL; /* it went with the engine */
	if (!q->cq)
		return 1;
	if (q->held && PyDict_Size(q->held) > 0)
		return 0;
	while ((n = ferry_cq_poll(q->cq, cqes, 64)) > 0)
		for (int i = 0; i < n; i++)
			if ((cqes[i].flags & FERRY_CQE_F_BUF) && cqes[i].buf)
				ferry_buf_release(cqes[i].buf);
	if (ferry_cq_destroy(q->cq) < 0)
		return 0; /* -EBUSY: an op still targets it */
	q->cq = NULL;
	return 1;
}

static PyObject *aq_close(pyf_aq *q, PyObject *noargs)
{
	(void)noargs;
	return PyBool_FromLong(aq_release_cq(q));
}

/*
 * For the cycle collector: the engine refers to its queues (pyferry.aio's
 * table in its __dict__) and each queue to the engine, so an engine used
 * from asyncio and dropped without close() is found only through here. No
 * tp_clear: the Python objects of the cycle break it (their __dict__), and
 * this queue then goes by aq_dealloc, its engine still alive.
 */
static int aq_traverse(pyf_aq *q, visitproc visit, void *arg)
{
	Py_VISIT(q->engine);
	Py_VISIT(q->held);
	return 0;
}

static void aq_dealloc(pyf_aq *q)
{
	PyObject_GC_UnTrack(q);
	/*
	 * The CQ goes back now when nothing can use it (aq_release_cq); else it
	 * is left to the engine (ferry_engine_destroy frees it). Views held for
	 * puts are let go only once the engine is gone, for ferry may still
	 * read them.
	 */
	aq_release_cq(q);
	if (q->engine->e && q->held && PyDict_Size(q->held) > 0) {
		/*
		 * Keep them until the engine is destroyed (rare): added to the
		 * ones another queue left, in the engine object's orphan_held
		 * (device holds that ops still use go to its orphans when their
		 * capsule goes, held_dev_free).
		 */
		if (!q->engine->orphan_held) {
			q->engine->orphan_held = Py_NewRef(q->held);
		} else if (PyDict_Update(q->engine->orphan_held, q->held) < 0) {
			PyErr_Clear();
			Py_INCREF(q->held); /* no memory: leaked, never let go while ferry may read */
		}
	}
	Py_XDECREF(q->held);
	Py_DECREF(q->engine);
	PyObject_GC_Del(q);
}

#define KW (METH_VARARGS | METH_KEYWORDS)
#define KWFN(f) ((PyCFunction)(void (*)(void))(f))
static PyMethodDef aq_methods[] = {
	{ "fileno", (PyCFunction)aq_fileno, METH_NOARGS, "The CQ's fd (ferry_cq_fd)." },
	{ "arm", (PyCFunction)aq_arm, METH_NOARGS,
	  "ferry_cq_arm: True when it is safe to sleep on the fd, False: poll again." },
	{ "poll", (PyCFunction)aq_poll, METH_NOARGS,
	  "Completions: a list of (user_data, res, len, more, Buffer or None)." },
	{ "put", KWFN(aq_put), KW, "Submit a put; returns its user_data." },
	{ "put_chunk", KWFN(aq_put_chunk), KW, "Submit a stream chunk; returns its user_data." },
	{ "put_device", KWFN(aq_put_device), KW,
	  "Submit a PUT of CUDA device memory (ptr, length, device; stream= or event= the "
	  "producer's work first; hold= the object it belongs to, kept until the op is over); "
	  "returns its user_data." },
	{ "get", KWFN(aq_get), KW, "Submit a zero-copy get; returns its user_data." },
	{ "stream", KWFN(aq_stream), KW, "Submit a STREAM_GET; returns its user_data." },
	{ "cancel", (PyCFunction)aq_cancel, METH_O, "Cancel op user_data; returns the cancel's." },
	{ "_held", (PyCFunction)aq_pending, METH_NOARGS, "Puts whose memory is held (tests)." },
	{ "close", (PyCFunction)aq_close, METH_NOARGS,
	  "Give the CQ back now if no op can still use it (once no loop watches its fd): True "
	  "when it is gone, False when it is left to the engine." },
	{ NULL, NULL, 0, NULL },
};

PyTypeObject pyf_aq_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry._ferry.AsyncQueue",
	.tp_basicsize = sizeof(pyf_aq),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "A CQ for an event loop (used by pyferry.aio).",
	.tp_dealloc = (destructor)aq_dealloc,
	.tp_traverse = (traverseproc)aq_traverse,
	.tp_methods = aq_methods,
};
