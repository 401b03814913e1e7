/*
 * pyf.h - what the files of pyferry's C extension share: the object
 * layouts (Engine, Peer, Buffer, StreamIter, AsyncQueue, Stage), the
 * exception hierarchy, and the helpers every file uses (errors, timeouts,
 * buffer arguments). Internal names carry the pyf_ prefix.
 *
 * Threads: every Python object here is changed only while its thread holds
 * the GIL; a call that waits (ferry_cq_wait, ferry_engine_destroy, the
 * blocking stage calls) releases it first. No Python code ever runs on a
 * thread of ferry's: no op carries a FERRY_SQE_CB_REACTOR callback (no op
 * carries a callback at all); completions are taken from completion queues
 * by the thread that waits for them.
 */
#ifndef PYF_H
#define PYF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ferry.h>
#include <ferry/stage.h>
#include <pthread.h>
#include <stdbool.h>

/* Most buffers a vectored put takes (ferry gathers up to 1024). */
#define PYF_IOV_MAX 1024

/* One Python thread's completion queue for its blocking calls on an engine. */
struct pyf_tctx {
	struct pyf_tctx *next;
	pthread_t thread;
	struct ferry_cq *cq;
};

/* A thread waiting in pyf_wait for an op of an engine: on that thread's
 * stack, listed in pyf_engine.waiters while it waits. Engine.cancel (another
 * thread) sets cancel; the waiter sees it within a wait slice (50 ms) and
 * cancels its op. Changed and read only under the GIL. */
struct pyf_waiter {
	struct pyf_waiter *next;
	unsigned long thread;     /* threading.get_ident() of the waiting thread */
	int cancel;
};

typedef struct {
	PyObject_HEAD
	struct ferry_engine *e;
	PyObject *owner;          /* a Stage whose engine this is (not ours to destroy) */
	uint64_t serial;          /* unique per Engine object (thread caches key on it) */
	uint64_t next_ud;         /* user_data of the next op (GIL-protected) */
	long busy;                /* blocking calls in flight (GIL released) */
	struct pyf_tctx *tctx;    /* per-thread CQs */
	struct pyf_waiter *waiters; /* threads in pyf_wait now (GIL-protected) */
	PyObject *weakrefs;
	/*
	 * Holds of device PUTs let go while their op still ran (their queue
	 * went): kept here until the engine is destroyed (aq.c). GIL-protected.
	 */
	struct pyf_held_dev *orphans;
	/*
	 * The same for host memory: the views of puts whose queue went while
	 * their op still ran (aq.c), a dict, released after ferry_engine_destroy
	 * (not in the object's __dict__, which CPython drops before this type's
	 * dealloc runs). GIL-protected.
	 */
	PyObject *orphan_held;
} pyf_engine;

/* After ferry_engine_destroy: the orphaned holds go (aq.c). */
void pyf_orphans_drop(pyf_engine *engine);

typedef struct {
	PyObject_HEAD
	struct ferry_peer *p;
	pyf_engine *engine;       /* keeps the engine object alive */
} pyf_peer;

typedef struct {
	PyObject_HEAD
	struct ferry_buf *b;      /* NULL once released or handed to ferry */
	char *data;
	Py_ssize_t len;
	Py_ssize_t exports;       /* views exported through the buffer protocol */
	int readonly;
	PyObject *weakrefs;
} pyf_buffer;

extern PyTypeObject pyf_engine_type;
extern PyTypeObject pyf_peer_type;
extern PyTypeObject pyf_buffer_type;
extern PyTypeObject pyf_stream_type;
extern PyTypeObject pyf_aq_type;
extern PyTypeObject pyf_stage_type;
extern PyTypeObject pyf_chanw_type;
extern PyTypeObject pyf_chanr_type;
/* The class Stage.engine objects are made of (pyferry.Engine once imported). */
extern PyTypeObject *pyf_engine_class;

/* Exceptions (module.c). */
extern PyObject *pyf_FerryError;
/* Raise the FerryError subclass of err (< 0) with ferry's text and what. Returns NULL. */
PyObject *pyf_raise(int err, const char *what);
/* frame.c: _ferry._small_raw(buffer) -> bytes or None. */
PyObject *pyf_small_raw(PyObject *mod, PyObject *obj);

/* seconds (None: none) -> ns for an SQE deadline (0 = none); -1 with an exception set. */
int pyf_timeout_ns(PyObject *timeout, uint64_t *out);

/* A new Buffer object owning b (readonly for received data). */
PyObject *pyf_buffer_new(struct ferry_buf *b, int readonly);
/* Take b out of a Buffer (for a zero-copy put): NULL and BufferError when exported/released. */
struct ferry_buf *pyf_buffer_take(pyf_buffer *self);

/* The Engine of a Peer or a name: *peer set, or -1 with an exception. */
int pyf_peer_arg(pyf_engine *self, PyObject *arg, struct ferry_peer **peer);
/* NULL with an exception when the engine is closed. */
int pyf_engine_check(pyf_engine *self);
/* A new Engine object around a stage's engine (owner: the Stage). */
PyObject *pyf_engine_borrowed(struct ferry_engine *e, PyObject *owner);
/* A new Peer object. */
PyObject *pyf_peer_new(pyf_engine *engine, struct ferry_peer *p);

/*
 * The data of a put: a Buffer (zero copy), one object with the buffer
 * protocol, or a list/tuple of them (vectored). Views are held until
 * pyf_data_release.
 */
struct pyf_data {
	struct ferry_buf *buf;    /* a pool buffer taken from a Buffer */
	unsigned n;               /* views / iovecs */
	Py_buffer *views;
	struct iovec *iov;
	Py_buffer one_view;       /* storage when n == 1 */
	struct iovec one_iov;
	size_t total;
};
int pyf_data_get(PyObject *obj, struct pyf_data *d, int allow_buf);
void pyf_data_release(struct pyf_data *d);

/*
 * Ops (engine.c). pyf_sqe: the calling thread's next entry (the ring full:
 * submit and retry for a while), NULL with an exception. pyf_ud: a fresh
 * user_data. pyf_wait: wait, the GIL released, for the CQE of op ud on cq
 * (CQEs of other ops there are dropped, their buffers released); on a
 * signal (KeyboardInterrupt...) the op is cancelled, its CQE still waited
 * for, and -1 returned with the exception set. pyf_cancel_drain: cancel op
 * ud and take its CQEs until its last one (and the cancel's), releasing
 * buffers. pyf_thread_cq: the calling thread's CQ for blocking calls.
 */
struct ferry_sqe *pyf_sqe(pyf_engine *self, struct ferry_sq **sq);
uint64_t pyf_ud(pyf_engine *self);
int pyf_wait(pyf_engine *self, struct ferry_cq *cq, uint64_t ud, struct ferry_cqe *out);
int pyf_cancel_drain(pyf_engine *self, struct ferry_cq *cq, uint64_t ud);
struct ferry_cq *pyf_thread_cq(pyf_engine *self);
/* ferry's "progress" argument: 'thread' / 'manual' / an int; -1 with an exception. */
int pyf_progress_arg(PyObject *o, enum ferry_progress_mode *out);

#endif
