/*
 * stage.c - pyferry._ferry.Stage: one rank of one stage of a vLLM-Omni
 * stage YAML (ferry/stage.h), with upstream's connector shapes: put ->
 * (ok, size, metadata), get -> (Buffer, size) or None, cleanup, health,
 * close. Every call that waits releases the GIL.
 */
#include "pyf.h"

#include <errno.h>

typedef struct {
	PyObject_HEAD
	struct ferry_stage *s;
	PyObject *engine; /* the Engine object over its engine, made on first use */
	long busy;
} pyf_stage;

int pyf_engine_detach(PyObject *o);

static int stage_check(pyf_stage *self)
{
	if (!self->s) {
		PyErr_SetString(PyExc_ValueError, "the stage is closed");
		return -1;
	}
	return 0;
}

static int stage_init(pyf_stage *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "config_path", "stage_id", "rank", "ns", "progress",
				  "pool_size", "timeout", NULL };
	struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;
	PyObject *path_o, *id_o, *progress = NULL, *timeout_o = Py_None, *path_b = NULL,
			      *id_s = NULL;
	unsigned int rank = 0;
	const char *ns = NULL;
	Py_ssize_t pool = 0;
	uint64_t tns;
	int rc;

	if (self->s) {
		PyErr_SetString(PyExc_RuntimeError, "Stage.__init__ called twice");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|I$zOnO", kwlist, &path_o, &id_o, &rank,
					 &ns, &progress, &pool, &timeout_o))
		return -1;
	if (pool < 0) {
		PyErr_SetString(PyExc_ValueError, "pool_size must be >= 0");
		return -1;
	}
	if (pyf_progress_arg(progress, &p.progress) || pyf_timeout_ns(timeout_o, &tns))
		return -1;
	if (!PyUnicode_FSConverter(path_o, &path_b))
		return -1;
	if (!(id_s = PyObject_Str(id_o))) { /* stage_id 1 or "1" */
		Py_DECREF(path_b);
		return -1;
	}
	p.config_path = PyBytes_AS_STRING(path_b);
	p.stage_id = PyUnicode_AsUTF8(id_s);
	p.rank = rank;
	p.ns = ns;
	p.pool_size = (size_t)pool;
	p.timeout_ms = (uint32_t)(tns / 1000000u);
	if (tns && !p.timeout_ms)
		p.timeout_ms = 1;
	if (!p.stage_id) {
		rc = -1;
	} else {
		Py_BEGIN_ALLOW_THREADS
		rc = ferry_stage_open(&p, &self->s);
		Py_END_ALLOW_THREADS
		if (rc < 0) {
			self->s = NULL;
			pyf_raise(rc, "ferry_stage_open");
		}
	}
	Py_DECREF(path_b);
	Py_DECREF(id_s);
	return rc < 0 ? -1 : 0;
}

/* Stage ids as str (1 and "1" alike). New references in *out. */
static int ids(PyObject *from_o, PyObject *to_o, PyObject **f, PyObject **t)
{
	*f = PyObject_Str(from_o);
	*t = *f ? PyObject_Str(to_o) : NULL;
	if (!*t) {
		Py_XDECREF(*f);
		return -1;
	}
	return 0;
}

static PyObject *stage_put(pyf_stage *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "from_stage", "to_stage", "put_key", "data", NULL };
	PyObject *from_o, *to_o, *data_o, *f, *t, *r;
	const char *key;
	struct pyf_data d;
	struct ferry_stage_meta meta;
	uint64_t size = 0;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOsO", kwlist, &from_o, &to_o, &key, &data_o))
		return NULL;
	if (stage_check(self) || ids(from_o, to_o, &f, &t))
		return NULL;
	if (pyf_data_get(data_o, &d, 1)) {
		Py_DECREF(f);
		Py_DECREF(t);
		return NULL;
	}
	if (!d.buf && d.n > 1) {
		pyf_data_release(&d);
		Py_DECREF(f);
		Py_DECREF(t);
		PyErr_SetString(PyExc_TypeError,
				"Stage.put takes one buffer (a list: use the engine's put)");
		return NULL;
	}
	{
		const char *fs = PyUnicode_AsUTF8(f), *ts = PyUnicode_AsUTF8(t);
		struct ferry_buf *b = d.buf;
		const void *data = d.n ? d.iov[0].iov_base : "";
		size_t len = d.n ? d.iov[0].iov_len : 0;

		d.buf = NULL;
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		if (b)
			rc = ferry_stage_put_buf(self->s, fs, ts, key, b, &size, &meta);
		else
			rc = ferry_stage_put(self->s, fs, ts, key, data, len, &size, &meta);
		Py_END_ALLOW_THREADS
		self->busy--;
	}
	pyf_data_release(&d);
	Py_DECREF(f);
	Py_DECREF(t);
	if (rc < 0) {
		char text[FERRY_KEY_MAX + 32];

		snprintf(text, sizeof(text), "Stage.put '%s'", key);
		return pyf_raise(rc, text);
	}
	r = Py_BuildValue("(OKy#)", Py_True, (unsigned long long)size, (const char *)meta.opaque,
			  (Py_ssize_t)sizeof(meta.opaque));
	return r;
}

static PyObject *stage_get(pyf_stage *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "from_stage", "to_stage", "get_key", "metadata", "timeout",
				  "nowait", NULL };
	PyObject *from_o, *to_o, *meta_o = Py_None, *timeout_o = Py_None, *f, *t;
	const char *key;
	int nowait = 0, rc;
	struct ferry_stage_meta meta;
	struct ferry_buf *b = NULL;
	int64_t tns;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOs|O$Op", kwlist, &from_o, &to_o, &key,
					 &meta_o, &timeout_o, &nowait))
		return NULL;
	if (stage_check(self))
		return NULL;
	if (meta_o != Py_None) {
		Py_buffer v;

		if (PyObject_GetBuffer(meta_o, &v, PyBUF_SIMPLE) < 0)
			return NULL;
		if (v.len != (Py_ssize_t)sizeof(meta.opaque)) {
			PyBuffer_Release(&v);
			PyErr_Format(PyExc_ValueError, "metadata must be the %d bytes put returned",
				     FERRY_STAGE_META_SIZE);
			return NULL;
		}
		memcpy(meta.opaque, v.buf, sizeof(meta.opaque));
		PyBuffer_Release(&v);
	}
	if (timeout_o == Py_None) {
		tns = 0; /* the edge's get timeout, else the stage's */
	} else {
		double s = PyFloat_AsDouble(timeout_o);

		if (s == -1.0 && PyErr_Occurred())
			return NULL;
		if (!(s >= 0)) {
			PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 seconds or None");
			return NULL;
		}
		tns = s > 1e9 ? -1 : (int64_t)(s * 1e9);
		if (tns == 0)
			tns = 1;
	}
	if (ids(from_o, to_o, &f, &t))
		return NULL;
	{
		const char *fs = PyUnicode_AsUTF8(f), *ts = PyUnicode_AsUTF8(t);
		const struct ferry_stage_meta *mp = meta_o != Py_None ? &meta : NULL;

		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		rc = ferry_stage_get(self->s, fs, ts, key, mp, tns,
				     nowait ? FERRY_STAGE_NOWAIT : 0, &b);
		Py_END_ALLOW_THREADS
		self->busy--;
	}
	Py_DECREF(f);
	Py_DECREF(t);
	if (rc == -EAGAIN && nowait)
		Py_RETURN_NONE; /* upstream's "not there yet: poll again" */
	if (rc < 0) {
		char text[FERRY_KEY_MAX + 32];

		snprintf(text, sizeof(text), "Stage.get '%s'", key);
		return pyf_raise(rc, text);
	}
	{
		size_t len = ferry_buf_len(b);
		PyObject *buf = pyf_buffer_new(b, 1);

		if (!buf)
			return NULL;
		return Py_BuildValue("(NK)", buf, (unsigned long long)len);
	}
}

static PyObject *stage_cleanup(pyf_stage *self, PyObject *arg)
{
	const char *req = PyUnicode_AsUTF8(arg);
	int rc;

	if (!req || stage_check(self))
		return NULL;
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	rc = ferry_stage_cleanup(self->s, req);
	Py_END_ALLOW_THREADS
	self->busy--;
	if (rc < 0)
		return pyf_raise(rc, "Stage.cleanup");
	return PyLong_FromLong(rc);
}

static PyObject *stage_health_json(pyf_stage *self, PyObject *noargs)
{
	char small[8192], *buf = small;
	int n;
	PyObject *r;

	(void)noargs;
	if (stage_check(self))
		return NULL;
	n = ferry_stage_health(self->s, small, sizeof(small));
	if (n < 0)
		return pyf_raise(n, "ferry_stage_health");
	if ((size_t)n >= sizeof(small)) {
		if (!(buf = PyMem_Malloc((size_t)n + 256)))
			return PyErr_NoMemory();
		n = ferry_stage_health(self->s, buf, (size_t)n + 256);
	}
	r = PyUnicode_FromString(buf);
	if (buf != small)
		PyMem_Free(buf);
	return r;
}

static PyObject *stage_get_engine(pyf_stage *self, void *closure)
{
	(void)closure;
	if (stage_check(self))
		return NULL;
	if (!self->engine &&
	    !(self->engine = pyf_engine_borrowed(ferry_stage_engine(self->s), (PyObject *)self)))
		return NULL;
	Py_INCREF(self->engine);
	return self->engine;
}

static PyObject *stage_edge(pyf_stage *self, PyObject *args)
{
	PyObject *from_o, *to_o, *f, *t, *eng;
	struct ferry_peer *peer;
	uint32_t flags = 0;
	int rc;

	if (!PyArg_ParseTuple(args, "OO:edge", &from_o, &to_o) || stage_check(self))
		return NULL;
	if (ids(from_o, to_o, &f, &t))
		return NULL;
	rc = ferry_stage_edge(self->s, PyUnicode_AsUTF8(f), PyUnicode_AsUTF8(t), &peer, &flags);
	Py_DECREF(f);
	Py_DECREF(t);
	if (rc < 0)
		return pyf_raise(rc, "Stage.edge");
	if (!(eng = stage_get_engine(self, NULL)))
		return NULL;
	{
		PyObject *p = pyf_peer_new((pyf_engine *)eng, peer);

		Py_DECREF(eng);
		if (!p)
			return NULL;
		return Py_BuildValue("(NO)", p,
				     (flags & FERRY_SQE_STREAM_WHOLE) ? Py_True : Py_False);
	}
}

static int stage_close_now(pyf_stage *self, int from_dealloc)
{
	int rc;

	if (!self->s)
		return 0;
	if (!from_dealloc && self->busy > 0) {
		pyf_raise(-EBUSY, "Stage.close: another thread waits in a call on this stage");
		return -1;
	}
	if (self->engine && pyf_engine_detach(self->engine) < 0) {
		if (!from_dealloc)
			return -1;
		PyErr_Clear();
	}
	Py_BEGIN_ALLOW_THREADS
	rc = ferry_stage_close(&self->s);
	Py_END_ALLOW_THREADS
	self->s = NULL;
	if (rc < 0 && !from_dealloc) {
		pyf_raise(rc, "ferry_stage_close");
		return -1;
	}
	return 0;
}

static PyObject *stage_close(pyf_stage *self, PyObject *noargs)
{
	(void)noargs;
	if (stage_close_now(self, 0))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *stage_get_closed(pyf_stage *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->s == NULL);
}

static int stage_traverse(pyf_stage *self, visitproc visit, void *arg)
{
	Py_VISIT(self->engine);
	return 0;
}

static int stage_clear(pyf_stage *self)
{
	Py_CLEAR(self->engine);
	return 0;
}

static void stage_dealloc(pyf_stage *self)
{
	PyObject *et, *ev, *tb;

	PyObject_GC_UnTrack(self);
	PyErr_Fetch(&et, &ev, &tb);
	stage_close_now(self, 1);
	PyErr_Restore(et, ev, tb);
	Py_CLEAR(self->engine);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

#define KW (METH_VARARGS | METH_KEYWORDS)
#define KWFN(f) ((PyCFunction)(void (*)(void))(f))
static PyMethodDef stage_methods[] = {
	{ "put", KWFN(stage_put), KW,
	  "put(from_stage, to_stage, put_key, data) -> (True, size, metadata bytes)." },
	{ "get", KWFN(stage_get), KW,
	  "get(from_stage, to_stage, get_key, metadata=None, *, timeout=None, nowait=False) "
	  "-> (Buffer, size); None when nowait and not there yet." },
	{ "cleanup", (PyCFunction)stage_cleanup, METH_O,
	  "cleanup(request_id) -> keys and gets dropped." },
	{ "health_json", (PyCFunction)stage_health_json, METH_NOARGS, "The health JSON text." },
	{ "edge", (PyCFunction)stage_edge, METH_VARARGS,
	  "edge(from_stage, to_stage) -> (Peer, whole): the peer of that edge for streams." },
	{ "close", (PyCFunction)stage_close, METH_NOARGS, "Close the stage (idempotent)." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef stage_getset[] = {
	{ "engine", (getter)stage_get_engine, NULL, "The stage's Engine (for streams, aio).",
	  NULL },
	{ "closed", (getter)stage_get_closed, NULL, "True once closed.", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject pyf_stage_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry._ferry.Stage",
	.tp_basicsize = sizeof(pyf_stage),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "One rank of a stage of a vLLM-Omni stage YAML (see pyferry.Stage).",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)stage_init,
	.tp_dealloc = (destructor)stage_dealloc,
	.tp_traverse = (traverseproc)stage_traverse,
	.tp_clear = (inquiry)stage_clear,
	.tp_methods = stage_methods,
	.tp_getset = stage_getset,
};
