/*
 * engine.c - pyferry.Engine and pyferry.Peer: engine lifecycle, addresses,
 * peers, pool buffers, and the blocking ops (put, get, put_chunk,
 * abort_stream, cleanup, nop).
 *
 * A blocking op is submitted on the calling thread's submission queue
 * (ferry's SQs are per thread: ferry_sq_get on that thread, every time;
 * it is a thread-local lookup) and its completion is posted to a CQ of that
 * thread's own (struct pyf_tctx, made at its first blocking call), so two
 * Python threads never take each other's completions. The wait releases
 * the GIL; it wakes every 50 ms to let the main thread see a signal
 * (KeyboardInterrupt), which cancels the op, and to see Engine.cancel from
 * another thread (struct pyf_waiter), which does the same.
 */
#include "pyf.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

#define PYF_UD_TAG (1ull << 63) /* our user_data never meets the stage layer's */
#define PYF_WAIT_SLICE_NS (50 * 1000 * 1000)

static uint64_t engine_serials;
static __thread uint64_t tcache_serial;
static __thread struct pyf_tctx *tcache_ctx;

int pyf_engine_check(pyf_engine *self)
{
	if (!self->e) {
		PyErr_SetString(PyExc_ValueError, "the engine is closed");
		return -1;
	}
	return 0;
}

uint64_t pyf_ud(pyf_engine *self)
{
	return PYF_UD_TAG | ++self->next_ud;
}

struct ferry_cq *pyf_thread_cq(pyf_engine *self)
{
	pthread_t me = pthread_self();
	struct pyf_tctx *c;
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	int rc;

	if (tcache_serial == self->serial && tcache_ctx)
		return tcache_ctx->cq;
	for (c = self->tctx; c; c = c->next)
		if (pthread_equal(c->thread, me))
			break;
	if (!c) {
		if (!(c = PyMem_Calloc(1, sizeof(*c)))) {
			PyErr_NoMemory();
			return NULL;
		}
		cp.entries = 64;
		if ((rc = ferry_cq_create(self->e, &cp, &c->cq)) < 0) {
			PyMem_Free(c);
			pyf_raise(rc, "ferry_cq_create");
			return NULL;
		}
		c->thread = me;
		c->next = self->tctx;
		self->tctx = c;
	}
	tcache_serial = self->serial;
	tcache_ctx = c;
	return c->cq;
}

struct ferry_sqe *pyf_sqe(pyf_engine *self, struct ferry_sq **sq)
{
	struct ferry_sqe *sqe;
	int rc;

	if (pyf_engine_check(self))
		return NULL;
	/*
	 * A single_poller engine: this thread becomes its poller, or (another
	 * thread is) the call is refused before anything is submitted: a wait
	 * here would fail with the op in flight.
	 */
	if ((rc = ferry_engine_claim_poller(self->e)) < 0) {
		pyf_raise(rc, "not this engine's poller thread (single_poller)");
		return NULL;
	}
	if ((rc = ferry_sq_get(self->e, sq)) < 0) {
		pyf_raise(rc, "ferry_sq_get");
		return NULL;
	}
	for (int i = 0; !(sqe = ferry_sq_get_sqe(*sq)); i++) {
		/* The ring is full: hand it over and let the reactor take it. */
		ferry_sq_submit(*sq);
		if (i >= 100000) {
			pyf_raise(-EBUSY, "submission queue full");
			return NULL;
		}
		/*
		 * busy: a close() from another thread meanwhile is refused
		 * (EBUSY), for the engine is used here without the GIL.
		 */
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		if (ferry_progress(self->e) <= 0)
			sched_yield();
		Py_END_ALLOW_THREADS
		self->busy--;
	}
	return sqe;
}

/* Take one CQE of cq, the GIL released, for at most a slice. 1, 0 or < 0. */
static int wait_one(struct ferry_cq *cq, struct ferry_cqe *cqe, int64_t ns)
{
	int n;

	Py_BEGIN_ALLOW_THREADS
	n = ferry_cq_wait(cq, cqe, 1, ns);
	Py_END_ALLOW_THREADS
	if (n == -ETIMEDOUT || n == -EINTR)
		n = 0;
	return n;
}

static void drop_cqe(const struct ferry_cqe *cqe)
{
	if ((cqe->flags & FERRY_CQE_F_BUF) && cqe->buf)
		ferry_buf_release(cqe->buf);
}

int pyf_cancel_drain(pyf_engine *self, struct ferry_cq *cq, uint64_t ud)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	uint64_t cud;
	int n, seen_op = 0, seen_cancel = 0;
	PyObject *et, *ev, *tb;

	PyErr_Fetch(&et, &ev, &tb); /* keep an exception being raised */
	if (!self->e || !(sqe = pyf_sqe(self, &sq))) {
		PyErr_Clear();
		PyErr_Restore(et, ev, tb);
		return -1;
	}
	cud = pyf_ud(self);
	ferry_prep_cancel(sqe, ud, cud);
	ferry_sqe_set_cq(sqe, cq);
	ferry_sq_submit(sq);
	while (!seen_op || !seen_cancel) {
		n = wait_one(cq, &cqe, PYF_WAIT_SLICE_NS);
		if (n < 0)
			break;
		if (n == 0)
			continue;
		if (cqe.user_data == ud && !(cqe.flags & FERRY_CQE_F_MORE))
			seen_op = 1;
		else if (cqe.user_data == cud)
			seen_cancel = 1;
		drop_cqe(&cqe);
	}
	PyErr_Restore(et, ev, tb);
	return 0;
}

int pyf_wait(pyf_engine *self, struct ferry_cq *cq, uint64_t ud, struct ferry_cqe *out)
{
	struct pyf_waiter w = { self->waiters, PyThread_get_thread_ident(), 0 };
	struct pyf_waiter **pp;
	int n, rc = 0;

	self->busy++;
	self->waiters = &w;
	for (;;) {
		n = wait_one(cq, out, PYF_WAIT_SLICE_NS);
		if (n < 0) {
			pyf_raise(n, "ferry_cq_wait");
			rc = -1;
			break;
		}
		if (n == 1 && out->user_data == ud)
			break;
		if (n == 1)
			drop_cqe(out); /* a stale cancel's, or of an op given up */
		if (w.cancel) { /* Engine.cancel, from another thread */
			pyf_cancel_drain(self, cq, ud);
			pyf_raise(-ECANCELED, "cancelled by Engine.cancel");
			rc = -1;
			break;
		}
		if (n == 0 && PyErr_CheckSignals() < 0) {
			pyf_cancel_drain(self, cq, ud);
			rc = -1;
			break;
		}
	}
	for (pp = &self->waiters; *pp; pp = &(*pp)->next)
		if (*pp == &w) {
			*pp = w.next;
			break;
		}
	self->busy--;
	return rc;
}

/* Submit sqe (cq, deadline, user_data set here) and wait for its CQE. */
static int run_op(pyf_engine *self, struct ferry_sq *sq, struct ferry_sqe *sqe,
		  struct ferry_cq *cq, uint64_t timeout_ns, struct ferry_cqe *out)
{
	uint64_t ud = pyf_ud(self);
	int rc;

	sqe->user_data = ud;
	ferry_sqe_set_cq(sqe, cq);
	if (timeout_ns)
		ferry_sqe_set_timeout(sqe, timeout_ns);
	if ((rc = ferry_sq_submit(sq)) < 0) {
		pyf_raise(rc, "ferry_sq_submit");
		return -1;
	}
	return pyf_wait(self, cq, ud, out);
}

int pyf_progress_arg(PyObject *o, enum ferry_progress_mode *out)
{
	*out = FERRY_PROGRESS_THREAD;
	if (!o || o == Py_None)
		return 0;
	if (PyUnicode_Check(o)) {
		const char *s = PyUnicode_AsUTF8(o);

		if (!s)
			return -1;
		if (!strcmp(s, "thread"))
			return 0;
		if (!strcmp(s, "manual")) {
			*out = FERRY_PROGRESS_MANUAL;
			return 0;
		}
	} else if (PyLong_Check(o)) {
		long v = PyLong_AsLong(o);

		if (v == FERRY_PROGRESS_THREAD || v == FERRY_PROGRESS_MANUAL) {
			*out = (enum ferry_progress_mode)v;
			return 0;
		}
	}
	PyErr_SetString(PyExc_ValueError, "progress must be 'thread' or 'manual'");
	return -1;
}

/* ------------------------------------------------------------------ */
/* Engine lifecycle                                                    */
/* ------------------------------------------------------------------ */

static PyObject *engine_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	pyf_engine *self = (pyf_engine *)type->tp_alloc(type, 0);

	(void)args;
	(void)kw;
	if (self)
		self->serial = ++engine_serials;
	return (PyObject *)self;
}

static int engine_init(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name",      "ns",        "progress",  "pool_size",
				  "listen",    "control",   "secret",    "max_keys",
				  "max_bufs",  "max_ops",   "heartbeat_ms", "peer_timeout_ms",
				  "prefault",  "rdma_listen", "busy_poll", "single_poller", NULL };
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	const char *name, *ns = NULL, *listen = NULL, *control = NULL, *secret = NULL;
	const char *rdma = NULL;
	PyObject *rdma_o = Py_None;
	PyObject *progress = NULL;
	Py_ssize_t pool_size = 0;
	unsigned int max_keys = 0, max_bufs = 0, max_ops = 0, hb = 0, pto = 0;
	int prefault = 1, busy_poll = 0, single_poller = 0, rc;

	if (self->e) {
		PyErr_SetString(PyExc_RuntimeError, "Engine.__init__ called twice");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|$zOnzzzIIIIIpOpp", kwlist, &name, &ns,
					 &progress, &pool_size, &listen, &control, &secret,
					 &max_keys, &max_bufs, &max_ops, &hb, &pto, &prefault, &rdma_o,
					 &busy_poll, &single_poller))
		return -1;
	if (rdma_o != Py_None) {
		Py_ssize_t n;

		if (!PyUnicode_Check(rdma_o)) {
			PyErr_Format(PyExc_TypeError,
				     "rdma_listen must be a str ('rdma://ADDRESS:PORT') or None, not %s",
				     Py_TYPE(rdma_o)->tp_name);
			return -1;
		}
		if (!(rdma = PyUnicode_AsUTF8AndSize(rdma_o, &n)))
			return -1;
		if ((size_t)n != strlen(rdma)) {
			PyErr_SetString(PyExc_ValueError, "rdma_listen has a NUL character");
			return -1;
		}
	}
	if (rdma && strncmp(rdma, "rdma://", 7) != 0) {
		PyErr_Format(PyExc_ValueError,
			     "rdma_listen must be 'rdma://ADDRESS:PORT' (an address of an RDMA "
			     "device's interface), not '%s'", rdma);
		return -1;
	}
	if (pool_size < 0) {
		PyErr_SetString(PyExc_ValueError, "pool_size must be >= 0");
		return -1;
	}
	if (pyf_progress_arg(progress, &p.progress))
		return -1;
	if (single_poller && p.progress != FERRY_PROGRESS_MANUAL) {
		PyErr_SetString(PyExc_ValueError, "single_poller=True needs progress=\"manual\"");
		return -1;
	}
	p.name = name;
	p.ns = ns;
	p.pool_size = (size_t)pool_size;
	p.listen = listen;
	p.control = control;
	p.secret = secret;
	p.rdma_listen = rdma;
	p.max_keys = max_keys;
	p.max_bufs = max_bufs;
	p.max_ops = max_ops;
	p.heartbeat_ms = hb;
	p.peer_timeout_ms = pto;
	if (!prefault)
		p.flags |= FERRY_ENGINE_NO_PREFAULT;
	if (busy_poll)
		p.flags |= FERRY_ENGINE_BUSY_POLL;
	if (single_poller)
		p.flags |= FERRY_ENGINE_SINGLE_POLLER;
	Py_BEGIN_ALLOW_THREADS
	rc = ferry_engine_create(&p, &self->e);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		char what[256];

		self->e = NULL;
		if (rdma && rc == -EADDRNOTAVAIL)
			snprintf(what, sizeof(what), "ferry_engine_create: rdma_listen %.100s: no "
				 "RDMA device here, or no device has that address", rdma);
		else if (rdma && rc == -EPROTONOSUPPORT)
			snprintf(what, sizeof(what), "ferry_engine_create: rdma_listen %.100s: this "
				 "build has no rdma transport", rdma);
		else if (rdma && rc == -EINVAL)
			snprintf(what, sizeof(what), "ferry_engine_create: is rdma_listen %.100s "
				 "rdma://ADDRESS:PORT?", rdma);
		else
			snprintf(what, sizeof(what), "ferry_engine_create");
		pyf_raise(rc, what);
		return -1;
	}
	return 0;
}

PyObject *pyf_engine_borrowed(struct ferry_engine *e, PyObject *owner)
{
	pyf_engine *self = (pyf_engine *)engine_tp_new(pyf_engine_class, NULL, NULL);

	if (!self)
		return NULL;
	self->e = e;
	Py_INCREF(owner);
	self->owner = owner;
	return (PyObject *)self;
}

static void engine_free_tctx(pyf_engine *self)
{
	struct pyf_tctx *c, *next;

	for (c = self->tctx; c; c = next) {
		next = c->next;
		PyMem_Free(c); /* its CQ went with the engine */
	}
	self->tctx = NULL;
	tcache_serial = 0;
	tcache_ctx = NULL;
	self->serial = ++engine_serials; /* no thread's cache matches any more */
}

/* Detach (borrowed) or destroy. 0, or -1 with an exception. */
static int engine_close_now(pyf_engine *self, int from_dealloc)
{
	struct ferry_engine *e = self->e;
	int rc;

	if (!e)
		return 0;
	if (self->busy > 0 && !from_dealloc) {
		pyf_raise(-EBUSY, "Engine.close: another thread waits in a call on this engine");
		return -1;
	}
	self->e = NULL;
	if (self->owner) { /* the stage destroys it */
		engine_free_tctx(self);
		return 0;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = ferry_engine_destroy(e);
	Py_END_ALLOW_THREADS
	engine_free_tctx(self);
	pyf_orphans_drop(self); /* no op uses them now */
	Py_CLEAR(self->orphan_held);
	if (rc < 0 && !from_dealloc) {
		pyf_raise(rc, "ferry_engine_destroy");
		return -1;
	}
	return 0;
}

/* For the Stage: its engine is going, detach the object that wraps it. */
int pyf_engine_detach(PyObject *o);
int pyf_engine_detach(PyObject *o)
{
	pyf_engine *self = (pyf_engine *)o;

	if (self->busy > 0) {
		pyf_raise(-EBUSY, "Stage.close: another thread waits in a call on its engine");
		return -1;
	}
	self->e = NULL;
	engine_free_tctx(self);
	return 0;
}

static PyObject *engine_close(pyf_engine *self, PyObject *noargs)
{
	(void)noargs;
	if (self->owner && self->e) {
		PyErr_SetString(PyExc_ValueError,
				"this is a stage's engine: close the Stage instead");
		return NULL;
	}
	if (engine_close_now(self, 0))
		return NULL;
	Py_RETURN_NONE;
}

/* Engine._close_check(): raise what close() would for a call in progress, change nothing. */
static PyObject *engine_close_check(pyf_engine *self, PyObject *noargs)
{
	(void)noargs;
	if (self->e && self->busy > 0)
		return pyf_raise(-EBUSY, "close: another thread waits in a call on this engine");
	Py_RETURN_NONE;
}

static void engine_dealloc(pyf_engine *self)
{
	PyObject_GC_UnTrack(self);
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	if (!self->owner)
		engine_close_now(self, 1);
	else
		engine_free_tctx(self);
	Py_CLEAR(self->owner); /* (a stage's engine goes with the stage) */
	Py_CLEAR(self->orphan_held);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int engine_traverse(pyf_engine *self, visitproc visit, void *arg)
{
	Py_VISIT(self->owner);
	(void)visit; (void)arg;
	return 0;
}

static int engine_clear(pyf_engine *self)
{
	(void)self; /* owner is kept until dealloc: the stage must outlive us */
	return 0;
}

static PyObject *engine_get_name(pyf_engine *self, void *closure)
{
	(void)closure;
	if (pyf_engine_check(self))
		return NULL;
	return PyUnicode_FromString(ferry_engine_name(self->e));
}

static PyObject *engine_get_closed(pyf_engine *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->e == NULL);
}

typedef int addr_fn(struct ferry_engine *, char *, size_t);

static PyObject *engine_addr(pyf_engine *self, addr_fn *fn, const char *what)
{
	char buf[512];
	int rc;

	if (pyf_engine_check(self))
		return NULL;
	rc = fn(self->e, buf, sizeof(buf));
	if (rc == -ENOTCONN)
		Py_RETURN_NONE;
	if (rc < 0)
		return pyf_raise(rc, what);
	return PyUnicode_FromString(buf);
}

static PyObject *engine_address(pyf_engine *self, PyObject *noargs)
{
	(void)noargs;
	return engine_addr(self, ferry_engine_address, "ferry_engine_address");
}

static PyObject *engine_control_address(pyf_engine *self, PyObject *noargs)
{
	(void)noargs;
	return engine_addr(self, ferry_engine_control_address, "ferry_engine_control_address");
}

static PyObject *engine_addresses(pyf_engine *self, PyObject *noargs)
{
	PyObject *s, *l;

	(void)noargs;
	if (!(s = engine_addr(self, ferry_engine_addresses, "ferry_engine_addresses")))
		return NULL;
	l = PyUnicode_Split(s, NULL, -1);
	Py_DECREF(s);
	return l;
}

static PyObject *engine_health_json(pyf_engine *self, PyObject *noargs)
{
	char small[4096], *buf = small;
	int n;
	PyObject *r;

	(void)noargs;
	if (pyf_engine_check(self))
		return NULL;
	n = ferry_engine_health(self->e, small, sizeof(small));
	if (n < 0)
		return pyf_raise(n, "ferry_engine_health");
	if ((size_t)n >= sizeof(small)) {
		if (!(buf = PyMem_Malloc((size_t)n + 256)))
			return PyErr_NoMemory();
		n = ferry_engine_health(self->e, buf, (size_t)n + 256);
	}
	r = PyUnicode_FromString(buf);
	if (buf != small)
		PyMem_Free(buf);
	return r;
}

static PyObject *engine_progress(pyf_engine *self, PyObject *noargs)
{
	int n;

	(void)noargs;
	if (pyf_engine_check(self))
		return NULL;
	n = ferry_progress(self->e);
	if (n < 0)
		return pyf_raise(n, "ferry_progress");
	return PyLong_FromLong(n);
}

/* ------------------------------------------------------------------ */
/* Peers                                                               */
/* ------------------------------------------------------------------ */

PyObject *pyf_peer_new(pyf_engine *engine, struct ferry_peer *p)
{
	pyf_peer *self = PyObject_New(pyf_peer, &pyf_peer_type);

	if (!self)
		return NULL;
	self->p = p;
	Py_INCREF(engine);
	self->engine = engine;
	return (PyObject *)self;
}

int pyf_peer_arg(pyf_engine *self, PyObject *arg, struct ferry_peer **peer)
{
	int rc;

	if (PyObject_TypeCheck(arg, &pyf_peer_type)) {
		if (((pyf_peer *)arg)->engine != self) {
			PyErr_SetString(PyExc_ValueError, "the Peer belongs to another engine");
			return -1;
		}
		*peer = ((pyf_peer *)arg)->p;
		return 0;
	}
	if (PyUnicode_Check(arg)) {
		const char *name = PyUnicode_AsUTF8(arg);

		if (!name)
			return -1;
		if ((rc = ferry_peer_open(self->e, name, peer)) < 0) {
			pyf_raise(rc, "ferry_peer_open");
			return -1;
		}
		return 0;
	}
	PyErr_SetString(PyExc_TypeError, "peer must be a Peer or an engine name (str)");
	return -1;
}

static PyObject *engine_peer(pyf_engine *self, PyObject *arg)
{
	struct ferry_peer *p;

	if (pyf_engine_check(self))
		return NULL;
	if (!PyUnicode_Check(arg)) {
		PyErr_SetString(PyExc_TypeError, "peer(name): name must be a str");
		return NULL;
	}
	if (pyf_peer_arg(self, arg, &p))
		return NULL;
	return pyf_peer_new(self, p);
}

static PyObject *engine_connect(pyf_engine *self, PyObject *args)
{
	const char *name, *uri;
	struct ferry_peer *p;
	int rc;

	if (!PyArg_ParseTuple(args, "ss:connect", &name, &uri) || pyf_engine_check(self))
		return NULL;
	if ((rc = ferry_peer_open(self->e, name, &p)) < 0)
		return pyf_raise(rc, "ferry_peer_open");
	Py_BEGIN_ALLOW_THREADS /* a host name may be looked up */
	rc = ferry_peer_connect_uri(p, uri);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyf_raise(rc, "ferry_peer_connect_uri");
	return pyf_peer_new(self, p);
}

static PyObject *peer_get_name(pyf_peer *self, void *closure)
{
	(void)closure;
	if (pyf_engine_check(self->engine))
		return NULL;
	return PyUnicode_FromString(ferry_peer_name(self->p));
}

static PyObject *peer_connect(pyf_peer *self, PyObject *arg)
{
	const char *uri = PyUnicode_AsUTF8(arg);
	int rc;

	if (!uri || pyf_engine_check(self->engine))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = ferry_peer_connect_uri(self->p, uri);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyf_raise(rc, "ferry_peer_connect_uri");
	Py_RETURN_NONE;
}

static PyObject *peer_set_stream_limits(pyf_peer *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "per_stream", "per_peer", NULL };
	unsigned int ps = 0, pp = 0;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|II", kwlist, &ps, &pp) ||
	    pyf_engine_check(self->engine))
		return NULL;
	if ((rc = ferry_peer_set_stream_limits(self->p, ps, pp)) < 0)
		return pyf_raise(rc, "ferry_peer_set_stream_limits");
	Py_RETURN_NONE;
}

static PyObject *peer_repr(pyf_peer *self)
{
	if (!self->engine->e)
		return PyUnicode_FromString("<pyferry.Peer of a closed engine>");
	return PyUnicode_FromFormat("<pyferry.Peer %s>", ferry_peer_name(self->p));
}

static void peer_dealloc(pyf_peer *self)
{
	Py_DECREF(self->engine);
	PyObject_Free(self);
}

static PyObject *peer_get_engine(pyf_peer *self, void *closure)
{
	(void)closure;
	Py_INCREF(self->engine);
	return (PyObject *)self->engine;
}

static PyMethodDef peer_methods[] = {
	{ "connect", (PyCFunction)peer_connect, METH_O,
	  "Give the peer an address: 'ferry://HOST:PORT' (its control endpoint) or "
	  "'tcp://HOST:PORT' (its data address)." },
	{ "set_stream_limits", (PyCFunction)(void (*)(void))peer_set_stream_limits,
	  METH_VARARGS | METH_KEYWORDS, "Stream credits: per_stream, per_peer (0 keeps)." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef peer_getset[] = {
	{ "name", (getter)peer_get_name, NULL, "The peer's engine name.", NULL },
	{ "engine", (getter)peer_get_engine, NULL, "The Engine this handle belongs to.", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject pyf_peer_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry.Peer",
	.tp_basicsize = sizeof(pyf_peer),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Another engine, by name (Engine.peer) or by address (Engine.connect).",
	.tp_dealloc = (destructor)peer_dealloc,
	.tp_repr = (reprfunc)peer_repr,
	.tp_methods = peer_methods,
	.tp_getset = peer_getset,
};

/* ------------------------------------------------------------------ */
/* Buffers and ops                                                     */
/* ------------------------------------------------------------------ */

static PyObject *engine_alloc(pyf_engine *self, PyObject *arg)
{
	Py_ssize_t n = PyLong_AsSsize_t(arg);
	struct ferry_buf *b;
	int rc;

	if (n == -1 && PyErr_Occurred())
		return NULL;
	if (pyf_engine_check(self))
		return NULL;
	if (n < 0) {
		PyErr_SetString(PyExc_ValueError, "alloc: size must be >= 0");
		return NULL;
	}
	if ((rc = ferry_buf_alloc(self->e, (size_t)n, &b)) < 0)
		return pyf_raise(rc, "ferry_buf_alloc");
	return pyf_buffer_new(b, 0);
}

static PyObject *op_error(const struct ferry_cqe *cqe, const char *what, const char *key)
{
	char text[FERRY_KEY_MAX + 64];

	snprintf(text, sizeof(text), "%s '%s'", what, key);
	return pyf_raise(cqe->res, text);
}

/* put / put_chunk: shared body. */
static PyObject *engine_put_common(pyf_engine *self, PyObject *args, PyObject *kw, int chunk)
{
	static char *kwlist[] = { "peer", "key", "data", "timeout", "replace", "wait_peer",
				  "end", NULL };
	PyObject *peer_o, *data_o, *timeout_o = Py_None;
	const char *key;
	int replace = 0, wait_peer = 0, end = 0;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq *cq;
	struct ferry_cqe cqe;
	struct pyf_data d;
	uint64_t tns;
	uint32_t flags = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OsO|$Oppp", kwlist, &peer_o, &key, &data_o,
					 &timeout_o, &replace, &wait_peer, &end))
		return NULL;
	if (pyf_engine_check(self) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(self, peer_o, &peer))
		return NULL;
	if (chunk && replace) {
		PyErr_SetString(PyExc_TypeError, "put_chunk takes no replace");
		return NULL;
	}
	if (!chunk && end) {
		PyErr_SetString(PyExc_TypeError, "put takes no end (put_chunk does)");
		return NULL;
	}
	if (!(cq = pyf_thread_cq(self)))
		return NULL;
	if (pyf_data_get(data_o, &d, 1))
		return NULL;
	if (!(sqe = pyf_sqe(self, &sq))) {
		pyf_data_release(&d);
		return NULL;
	}
	if (d.buf) {
		if (chunk)
			ferry_prep_stream_put_buf(sqe, peer, key, d.buf, 0);
		else
			ferry_prep_put_buf(sqe, peer, key, d.buf, 0);
		d.buf = NULL; /* ferry's now, whatever happens */
	} else if (chunk) {
		ferry_prep_stream_put(sqe, peer, key, d.iov, d.n, 0);
	} else {
		ferry_prep_put(sqe, peer, key, d.iov, d.n, 0);
	}
	if (replace)
		flags |= FERRY_SQE_REPLACE;
	if (wait_peer)
		flags |= FERRY_SQE_WAIT_PEER;
	if (end)
		flags |= FERRY_SQE_STREAM_END;
	if (flags)
		ferry_sqe_set_flags(sqe, flags);
	if (run_op(self, sq, sqe, cq, tns, &cqe)) {
		pyf_data_release(&d);
		return NULL;
	}
	pyf_data_release(&d);
	if (cqe.res < 0)
		return op_error(&cqe, chunk ? "put_chunk" : "put", key);
	return PyLong_FromLongLong(chunk ? (long long)cqe.res : (long long)cqe.len);
}

static PyObject *engine_put(pyf_engine *self, PyObject *args, PyObject *kw)
{
	return engine_put_common(self, args, kw, 0);
}

static PyObject *engine_put_chunk(pyf_engine *self, PyObject *args, PyObject *kw)
{
	return engine_put_common(self, args, kw, 1);
}

static PyObject *engine_get(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "key", "timeout", "nowait", "into", "device_buf", NULL };
	PyObject *peer_o, *timeout_o = Py_None, *into = Py_None;
	const char *key;
	int nowait = 0, device_buf = 0;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq *cq;
	struct ferry_cqe cqe;
	Py_buffer view = { 0 };
	struct iovec iov;
	uint64_t tns;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|$OpOp", kwlist, &peer_o, &key, &timeout_o,
					 &nowait, &into, &device_buf))
		return NULL;
	if (device_buf && into != Py_None) {
		PyErr_SetString(PyExc_ValueError, "get: device_buf is for a get without into=");
		return NULL;
	}
	if (pyf_engine_check(self) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(self, peer_o, &peer) || !(cq = pyf_thread_cq(self)))
		return NULL;
	if (into != Py_None) {
		if (PyObject_GetBuffer(into, &view, PyBUF_WRITABLE) < 0)
			return NULL;
		iov.iov_base = view.buf;
		iov.iov_len = (size_t)view.len;
	}
	if (!(sqe = pyf_sqe(self, &sq))) {
		if (view.obj)
			PyBuffer_Release(&view);
		return NULL;
	}
	ferry_prep_get(sqe, peer, key, view.obj ? &iov : NULL, view.obj ? 1 : 0, 0);
	if (nowait || device_buf)
		ferry_sqe_set_flags(sqe, (nowait ? FERRY_SQE_NOWAIT : 0) |
					 (device_buf ? FERRY_SQE_DEVICE_BUF : 0));
	if (run_op(self, sq, sqe, cq, tns, &cqe)) {
		if (view.obj)
			PyBuffer_Release(&view);
		return NULL;
	}
	if (view.obj)
		PyBuffer_Release(&view);
	if (cqe.res < 0) {
		drop_cqe(&cqe);
		if (cqe.res == -EMSGSIZE) {
			char text[FERRY_KEY_MAX + 64];

			snprintf(text, sizeof(text), "get '%s' (%llu bytes)", key,
				 (unsigned long long)cqe.len);
			return pyf_raise(cqe.res, text);
		}
		return op_error(&cqe, "get", key);
	}
	if (cqe.flags & FERRY_CQE_F_BUF)
		return pyf_buffer_new(cqe.buf, 1);
	return PyLong_FromUnsignedLongLong(cqe.len);
}

static PyObject *engine_abort_stream(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "stream", "reason", "timeout", NULL };
	PyObject *peer_o, *timeout_o = Py_None;
	const char *key, *reason = NULL;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq *cq;
	struct ferry_cqe cqe;
	uint64_t tns;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|z$O", kwlist, &peer_o, &key, &reason,
					 &timeout_o))
		return NULL;
	if (pyf_engine_check(self) || pyf_timeout_ns(timeout_o, &tns) ||
	    pyf_peer_arg(self, peer_o, &peer) || !(cq = pyf_thread_cq(self)) ||
	    !(sqe = pyf_sqe(self, &sq)))
		return NULL;
	ferry_prep_stream_abort(sqe, peer, key, reason, 0);
	if (run_op(self, sq, sqe, cq, tns, &cqe))
		return NULL;
	if (cqe.res < 0)
		return op_error(&cqe, "abort_stream", key);
	Py_RETURN_NONE;
}

static PyObject *engine_cleanup(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "request_id", "peer", NULL };
	PyObject *peer_o = Py_None;
	const char *req;
	struct ferry_peer *peer = NULL;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq *cq;
	struct ferry_cqe cqe;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O", kwlist, &req, &peer_o))
		return NULL;
	if (pyf_engine_check(self) || (peer_o != Py_None && pyf_peer_arg(self, peer_o, &peer)) ||
	    !(cq = pyf_thread_cq(self)) || !(sqe = pyf_sqe(self, &sq)))
		return NULL;
	ferry_prep_cleanup(sqe, peer, req, 0);
	if (run_op(self, sq, sqe, cq, 0, &cqe))
		return NULL;
	if (cqe.res < 0)
		return op_error(&cqe, "cleanup", req);
	return PyLong_FromLong(cqe.res);
}

static PyObject *engine_nop(pyf_engine *self, PyObject *noargs)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq *cq;
	struct ferry_cqe cqe;

	(void)noargs;
	if (pyf_engine_check(self) || !(cq = pyf_thread_cq(self)) || !(sqe = pyf_sqe(self, &sq)))
		return NULL;
	ferry_prep_nop(sqe, 0);
	if (run_op(self, sq, sqe, cq, 0, &cqe))
		return NULL;
	if (cqe.res < 0)
		return pyf_raise(cqe.res, "nop");
	Py_RETURN_NONE;
}

/* Engine.cancel(thread=None): flag the waits in progress (of that thread,
 * or all); each cancels its op and raises FerryCancelledError. */
static PyObject *engine_cancel(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "thread", NULL };
	PyObject *th = Py_None, *ident = NULL;
	unsigned long id = 0;
	long n = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &th))
		return NULL;
	if (th != Py_None) {
		if (PyLong_Check(th)) {
			id = PyLong_AsUnsignedLong(th);
		} else {
			/* a threading.Thread: its ident (None before it started) */
			if (!(ident = PyObject_GetAttrString(th, "ident"))) {
				PyErr_Clear();
				PyErr_SetString(PyExc_TypeError,
						"cancel: thread must be a threading.Thread, an ident "
						"(int) or None");
				return NULL;
			}
			if (ident == Py_None) {
				Py_DECREF(ident);
				return PyLong_FromLong(0);
			}
			id = PyLong_AsUnsignedLong(ident);
			Py_DECREF(ident);
		}
		if (id == (unsigned long)-1 && PyErr_Occurred())
			return NULL;
	}
	for (struct pyf_waiter *w = self->waiters; w; w = w->next)
		if (th == Py_None || w->thread == id) {
			w->cancel = 1;
			n++;
		}
	return PyLong_FromLong(n);
}

static PyObject *engine_thread_cqs(pyf_engine *self, PyObject *noargs)
{
	long n = 0;

	(void)noargs;
	for (struct pyf_tctx *c = self->tctx; c; c = c->next)
		n++;
	return PyLong_FromLong(n);
}

PyObject *pyf_stream_open(pyf_engine *self, PyObject *args, PyObject *kw);
PyObject *pyf_aq_new(pyf_engine *self);

static PyObject *engine_stream(pyf_engine *self, PyObject *args, PyObject *kw)
{
	return pyf_stream_open(self, args, kw);
}

static PyObject *engine_async_queue(pyf_engine *self, PyObject *noargs)
{
	(void)noargs;
	if (pyf_engine_check(self))
		return NULL;
	return pyf_aq_new(self);
}

#define KW (METH_VARARGS | METH_KEYWORDS)
#define KWFN(f) ((PyCFunction)(void (*)(void))(f))
/*
 * put_device / get_device: CUDA device memory (ptr on device) as one
 * segment of a region registered for the op and released after it
 * (ferry_region_register vets the pointer: -EINVAL when it is not that
 * device's memory, -ENODEV without a CUDA runtime or device).
 */
struct device_op {
	struct ferry_peer *peer;
	struct ferry_region *r;
	struct ferry_seg seg;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cq *cq;
	uint64_t tns;
};

/* The checks, the region and the op's entry (to prep). 0, or -1 with an
 * exception and nothing held. */
static int device_op_begin(pyf_engine *self, PyObject *peer_o, PyObject *timeout_o,
			   unsigned long long ptr, unsigned long long len, int device,
			   struct device_op *op)
{
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	int rc;

	if (pyf_engine_check(self) || pyf_timeout_ns(timeout_o, &op->tns) ||
	    pyf_peer_arg(self, peer_o, &op->peer) || !(op->cq = pyf_thread_cq(self)))
		return -1;
	rp.addr = (void *)(uintptr_t)ptr;
	rp.len = len ? (size_t)len : 1;
	rp.mem = FERRY_MEM_CUDA;
	rp.device = device;
	if ((rc = ferry_region_register(self->e, &rp, &op->r)) < 0) {
		pyf_raise(rc, "ferry_region_register (CUDA device memory)");
		return -1;
	}
	op->seg.region = op->r;
	op->seg.offset = 0;
	op->seg.len = len;
	if (!(op->sqe = pyf_sqe(self, &op->sq))) {
		ferry_region_release(&op->r);
		return -1;
	}
	return 0;
}

/* Run the prepped op, then release the region (the op is over: its CQE
 * came, or the wait gave up and cancelled it). The bytes moved, or NULL
 * with an exception. */
static PyObject *device_op_run(pyf_engine *self, struct device_op *op, const char *what,
			       const char *key)
{
	struct ferry_cqe cqe;
	int rc = run_op(self, op->sq, op->sqe, op->cq, op->tns, &cqe);

	ferry_region_release(&op->r);
	if (rc)
		return NULL;
	if (cqe.res < 0) {
		drop_cqe(&cqe);
		return op_error(&cqe, what, key);
	}
	return PyLong_FromUnsignedLongLong(cqe.len);
}

static PyObject *engine_put_device(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "key", "ptr", "length", "device", "stream", "event",
				  "timeout", "replace", "wait_peer", NULL };
	PyObject *peer_o, *timeout_o = Py_None;
	const char *key;
	unsigned long long ptr, len, stream = 0, event = 0;
	int device = 0, replace = 0, wait_peer = 0;
	struct device_op op;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OsKK|i$KKOpp", kwlist, &peer_o, &key, &ptr, &len,
					 &device, &stream, &event, &timeout_o, &replace, &wait_peer) ||
	    device_op_begin(self, peer_o, timeout_o, ptr, len, device, &op))
		return NULL;
	ferry_prep_put_segs(op.sqe, op.peer, key, &op.seg, 1, 0);
	ferry_sqe_set_flags(op.sqe, (replace ? FERRY_SQE_REPLACE : 0) |
				    (wait_peer ? FERRY_SQE_WAIT_PEER : 0));
	if (event)
		ferry_sqe_set_cuda_wait(op.sqe, FERRY_CUDA_WAIT_EVENT, (void *)(uintptr_t)event);
	else if (stream)
		ferry_sqe_set_cuda_wait(op.sqe, FERRY_CUDA_WAIT_STREAM, (void *)(uintptr_t)stream);
	return device_op_run(self, &op, "put_device", key);
}

static PyObject *engine_get_device(pyf_engine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "peer", "key", "ptr", "capacity", "device", "timeout", NULL };
	PyObject *peer_o, *timeout_o = Py_None;
	const char *key;
	unsigned long long ptr, cap;
	int device = 0;
	struct device_op op;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OsKK|i$O", kwlist, &peer_o, &key, &ptr, &cap,
					 &device, &timeout_o) ||
	    device_op_begin(self, peer_o, timeout_o, ptr, cap, device, &op))
		return NULL;
	ferry_prep_get_segs(op.sqe, op.peer, key, &op.seg, 1, 0);
	return device_op_run(self, &op, "get_device", key);
}

static PyMethodDef engine_methods[] = {
	{ "close", (PyCFunction)engine_close, METH_NOARGS,
	  "Destroy the engine (idempotent; ops in flight end with ECANCELED; Buffers held "
	  "stay valid until released)." },
	{ "address", (PyCFunction)engine_address, METH_NOARGS,
	  "The tcp data endpoint it listens on, or None (addresses() has the rdma one)." },
	{ "control_address", (PyCFunction)engine_control_address, METH_NOARGS,
	  "The control endpoint it listens on, or None." },
	{ "addresses", (PyCFunction)engine_addresses, METH_NOARGS,
	  "Every URI it can be reached at (for Engine.connect on a peer)." },
	{ "peer", (PyCFunction)engine_peer, METH_O, "The Peer of an engine name." },
	{ "cancel", KWFN(engine_cancel), KW,
	  "cancel(thread=None) -> how many: cancel the blocking calls waiting on this engine "
	  "now (of one thread: a threading.Thread or its ident; None: all). Each cancels its "
	  "ferry op and raises FerryCancelledError within 50 ms." },
	{ "connect", (PyCFunction)engine_connect, METH_VARARGS,
	  "connect(name, uri): the Peer of that name, reached at uri "
	  "('ferry://HOST:PORT' or 'tcp://HOST:PORT')." },
	{ "alloc", (PyCFunction)engine_alloc, METH_O,
	  "A Buffer of n bytes of the pool (writable; put it zero copy)." },
	{ "put", KWFN(engine_put), KW,
	  "put(peer, key, data, *, timeout=None, replace=False, wait_peer=False) -> bytes "
	  "sent. data: a Buffer (zero copy, ownership moves), any buffer-protocol object, "
	  "or a list of them (vectored)." },
	{ "get", KWFN(engine_get), KW,
	  "get(peer, key, *, timeout=None, nowait=False, into=None) -> Buffer (zero copy), "
	  "or the byte count when into= (a writable buffer) is given." },
	{ "put_device", KWFN(engine_put_device), KW,
	  "put_device(peer, key, ptr, length, device=0, *, stream=0, event=0, timeout=None, "
	  "replace=False, wait_peer=False) -> bytes sent. CUDA device memory at ptr; stream / "
	  "event: the caller's cudaStream_t / cudaEvent_t (as int) whose work comes first." },
	{ "get_device", KWFN(engine_get_device), KW,
	  "get_device(peer, key, ptr, capacity, device=0, *, timeout=None) -> bytes received "
	  "into CUDA device memory at ptr." },
	{ "put_chunk", KWFN(engine_put_chunk), KW,
	  "put_chunk(peer, stream, data, *, end=False, timeout=None, wait_peer=False) -> "
	  "the chunk's index." },
	{ "abort_stream", KWFN(engine_abort_stream), KW,
	  "abort_stream(peer, stream, reason=None, *, timeout=None)." },
	{ "stream", KWFN(engine_stream), KW,
	  "stream(peer, stream, *, timeout=None, whole=False) -> an iterator of Buffers, "
	  "one per chunk (timeout: the gap between two chunks)." },
	{ "cleanup", KWFN(engine_cleanup), KW,
	  "cleanup(request_id, peer=None) -> keys and gets dropped." },
	{ "nop", (PyCFunction)engine_nop, METH_NOARGS, "Submit a NOP and wait for it." },
	{ "health_json", (PyCFunction)engine_health_json, METH_NOARGS,
	  "The health document (JSON text)." },
	{ "progress", (PyCFunction)engine_progress, METH_NOARGS,
	  "Drive progress (manual mode); returns the events handled." },
	{ "_close_check", (PyCFunction)engine_close_check, METH_NOARGS,
	  "Raise FerryBusyError when close() would (a call in progress); change nothing." },
	{ "_async_queue", (PyCFunction)engine_async_queue, METH_NOARGS,
	  "A new AsyncQueue (a CQ for an event loop); see pyferry.aio." },
	{ "_thread_cqs", (PyCFunction)engine_thread_cqs, METH_NOARGS,
	  "How many threads have a CQ for blocking calls (tests)." },
	{ NULL, NULL, 0, NULL },
};

static PyObject *engine_get_borrowed(pyf_engine *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->owner != NULL);
}

static PyGetSetDef engine_getset[] = {
	{ "_borrowed", (getter)engine_get_borrowed, NULL, "True for a Stage's engine.", NULL },
	{ "name", (getter)engine_get_name, NULL, "The engine's name.", NULL },
	{ "closed", (getter)engine_get_closed, NULL, "True once closed.", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject pyf_engine_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry._ferry.Engine",
	.tp_basicsize = sizeof(pyf_engine),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "A ferry engine (see pyferry.Engine).",
	.tp_new = engine_tp_new,
	.tp_init = (initproc)engine_init,
	.tp_dealloc = (destructor)engine_dealloc,
	.tp_traverse = (traverseproc)engine_traverse,
	.tp_clear = (inquiry)engine_clear,
	.tp_methods = engine_methods,
	.tp_getset = engine_getset,
	.tp_weaklistoffset = offsetof(pyf_engine, weakrefs),
};
