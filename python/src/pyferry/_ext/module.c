/*
 * module.c - pyferry._ferry: the module, its exception hierarchy (a
 * FerryError(OSError) subclass per errno that Python has a built-in class
 * for), and the argument helpers of every file (timeouts, the data of a put).
 */
#include "pyf.h"

#include <errno.h>
#include <math.h>

PyObject *pyf_FerryError;

/* errno -> exception class, filled at module init. */
static struct {
	int err;
	const char *name;
	PyObject **base; /* the built-in it also derives from (NULL: FerryError only) */
	PyObject *cls;
} err_classes[] = {
	{ ETIMEDOUT, "FerryTimeoutError", &PyExc_TimeoutError, NULL },
	{ EAGAIN, "FerryWouldBlockError", &PyExc_BlockingIOError, NULL },
	{ ECANCELED, "FerryCancelledError", NULL, NULL },
	{ ECONNRESET, "FerryConnectionResetError", &PyExc_ConnectionResetError, NULL },
	{ ECONNREFUSED, "FerryConnectionRefusedError", &PyExc_ConnectionRefusedError, NULL },
	{ EHOSTUNREACH, "FerryUnreachableError", &PyExc_ConnectionError, NULL },
	{ ENOTCONN, "FerryNotConnectedError", &PyExc_ConnectionError, NULL },
	{ EPIPE, "FerryBrokenPipeError", &PyExc_BrokenPipeError, NULL },
	{ EEXIST, "FerryExistsError", &PyExc_FileExistsError, NULL },
	{ ENOENT, "FerryNotFoundError", &PyExc_FileNotFoundError, NULL },
	{ EACCES, "FerryPermissionError", &PyExc_PermissionError, NULL },
	{ ENOMEM, "FerryNoMemoryError", NULL, NULL },
	{ EMSGSIZE, "FerryMessageSizeError", NULL, NULL },
	{ EINVAL, "FerryInvalidError", NULL, NULL },
	{ EBUSY, "FerryBusyError", NULL, NULL },
	{ EADDRINUSE, "FerryAddressInUseError", NULL, NULL },
	{ EOPNOTSUPP, "FerryNotSupportedError", NULL, NULL },
	{ ESHUTDOWN, "FerryShutdownError", NULL, NULL },
};

PyObject *pyf_raise(int err, const char *what)
{
	PyObject *cls = pyf_FerryError, *exc;
	int e = err < 0 ? -err : err;

	for (size_t i = 0; i < sizeof(err_classes) / sizeof(err_classes[0]); i++)
		if (err_classes[i].err == e && err_classes[i].cls) {
			cls = err_classes[i].cls;
			break;
		}
	if (what && *what)
		exc = PyObject_CallFunction(cls, "iN", e,
					    PyUnicode_FromFormat("%s (%s)", ferry_strerror(-e), what));
	else
		exc = PyObject_CallFunction(cls, "is", e, ferry_strerror(-e));
	if (!exc)
		return NULL;
	if (what && *what) {
		PyObject *s = PyUnicode_FromString(what);

		if (s) {
			PyObject_SetAttrString(exc, "op", s);
			Py_DECREF(s);
		}
	} else {
		PyObject_SetAttrString(exc, "op", Py_None);
	}
	{
		PyObject *name = PyUnicode_FromString(ferry_err_name(-e));

		if (name) {
			PyObject_SetAttrString(exc, "errname", name);
			Py_DECREF(name);
		}
	}
	PyErr_SetObject(cls, exc);
	Py_DECREF(exc);
	return NULL;
}

int pyf_timeout_ns(PyObject *timeout, uint64_t *out)
{
	double s;

	*out = 0;
	if (!timeout || timeout == Py_None)
		return 0;
	s = PyFloat_AsDouble(timeout);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (isnan(s) || s < 0) {
		PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 seconds or None");
		return -1;
	}
	if (isinf(s) || s > 1e9) /* forever */
		return 0;
	*out = (uint64_t)(s * 1e9);
	if (*out == 0)
		*out = 1; /* 0 means "no deadline" to ferry; timeout=0 means "now" */
	return 0;
}

int pyf_data_get(PyObject *obj, struct pyf_data *d, int allow_buf)
{
	memset(d, 0, sizeof(*d));
	if (PyObject_TypeCheck(obj, &pyf_buffer_type)) {
		if (!allow_buf) {
			PyErr_SetString(PyExc_TypeError,
					"a pool Buffer cannot be a piece of a vectored put");
			return -1;
		}
		if (!(d->buf = pyf_buffer_take((pyf_buffer *)obj)))
			return -1;
		d->total = ferry_buf_len(d->buf);
		return 0;
	}
	if (PyList_Check(obj) || PyTuple_Check(obj)) {
		Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
		PyObject **items = PySequence_Fast_ITEMS(obj);

		if (n > PYF_IOV_MAX) {
			PyErr_Format(PyExc_ValueError, "a vectored put takes at most %d buffers",
				     PYF_IOV_MAX);
			return -1;
		}
		if (n > 1) {
			d->views = PyMem_Calloc((size_t)n, sizeof(Py_buffer));
			d->iov = PyMem_Calloc((size_t)n, sizeof(struct iovec));
			if (!d->views || !d->iov) {
				PyMem_Free(d->views);
				PyMem_Free(d->iov);
				d->views = NULL;
				d->iov = NULL;
				PyErr_NoMemory();
				return -1;
			}
		} else {
			d->views = &d->one_view;
			d->iov = &d->one_iov;
		}
		for (Py_ssize_t i = 0; i < n; i++) {
			/* A Buffer inside a list is copied like any other memory. */
			if (PyObject_GetBuffer(items[i], &d->views[i], PyBUF_SIMPLE) < 0) {
				pyf_data_release(d);
				return -1;
			}
			d->n = (unsigned)i + 1;
			d->iov[i].iov_base = d->views[i].buf;
			d->iov[i].iov_len = (size_t)d->views[i].len;
			d->total += (size_t)d->views[i].len;
		}
		d->n = (unsigned)n;
		return 0;
	}
	d->views = &d->one_view;
	d->iov = &d->one_iov;
	if (PyObject_GetBuffer(obj, d->views, PyBUF_SIMPLE) < 0) {
		d->views = NULL;
		d->iov = NULL;
		return -1;
	}
	d->n = 1;
	d->iov[0].iov_base = d->views[0].buf;
	d->iov[0].iov_len = (size_t)d->views[0].len;
	d->total = d->iov[0].iov_len;
	return 0;
}

void pyf_data_release(struct pyf_data *d)
{
	for (unsigned i = 0; i < d->n; i++)
		PyBuffer_Release(&d->views[i]);
	if (d->views && d->views != &d->one_view)
		PyMem_Free(d->views);
	if (d->iov && d->iov != &d->one_iov)
		PyMem_Free(d->iov);
	d->views = NULL;
	d->iov = NULL;
	d->n = 0;
	if (d->buf) { /* taken but never submitted */
		ferry_buf_release(d->buf);
		d->buf = NULL;
	}
}

static PyObject *m_version(PyObject *mod, PyObject *noargs)
{
	int v = ferry_version();

	(void)mod;
	(void)noargs;
	return Py_BuildValue("(iii)", v / 10000, v / 100 % 100, v % 100);
}

static PyObject *m_features(PyObject *mod, PyObject *noargs)
{
	uint32_t f = ferry_features();
	static const struct {
		uint32_t bit;
		const char *name;
	} names[] = {
		{ FERRY_FEATURE_SHM, "shm" },         { FERRY_FEATURE_TCP, "tcp" },
		{ FERRY_FEATURE_CONTROL, "control" }, { FERRY_FEATURE_YAML, "yaml" },
		{ FERRY_FEATURE_RDMA, "rdma" },       { FERRY_FEATURE_CUDA, "cuda" },
	};
	PyObject *set = PySet_New(NULL);

	(void)mod;
	(void)noargs;
	if (!set)
		return NULL;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!(f & names[i].bit))
			continue;
		PyObject *s = PyUnicode_FromString(names[i].name);

		if (!s || PySet_Add(set, s) < 0) {
			Py_XDECREF(s);
			Py_DECREF(set);
			return NULL;
		}
		Py_DECREF(s);
	}
	return set;
}

static PyObject *m_strerror(PyObject *mod, PyObject *arg)
{
	long e = PyLong_AsLong(arg);

	(void)mod;
	if (e == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(ferry_strerror((int)(e > 0 ? -e : e)));
}

/* _error(res, what) -> the exception pyf_raise would raise, not raised. */
static PyObject *m_error(PyObject *mod, PyObject *args)
{
	int res;
	const char *what = NULL;
	PyObject *t, *v, *tb;

	(void)mod;
	if (!PyArg_ParseTuple(args, "i|z", &res, &what))
		return NULL;
	pyf_raise(res, what);
	PyErr_Fetch(&t, &v, &tb);
	PyErr_NormalizeException(&t, &v, &tb);
	Py_XDECREF(t);
	Py_XDECREF(tb);
	return v;
}

PyTypeObject *pyf_engine_class = &pyf_engine_type;

static PyObject *m_set_engine_class(PyObject *mod, PyObject *cls)
{
	(void)mod;
	if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &pyf_engine_type)) {
		PyErr_SetString(PyExc_TypeError, "not an Engine class");
		return NULL;
	}
	Py_INCREF(cls);
	pyf_engine_class = (PyTypeObject *)cls;
	Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
	{ "_error", m_error, METH_VARARGS, "The FerryError of a result code (not raised)." },
	{ "_set_engine_class", m_set_engine_class, METH_O,
	  "The class of the Engine objects made over a stage's engine." },
	{ "version", m_version, METH_NOARGS, "The library's version as (major, minor, patch)." },
	{ "features", m_features, METH_NOARGS,
	  "What this build can do: a set of 'shm', 'tcp', 'control', 'yaml', 'rdma', 'cuda'." },
	{ "strerror", m_strerror, METH_O, "ferry's text for an errno." },
	{ "_small_raw", pyf_small_raw, METH_O,
	  "The bytes of FerryConnector's inline bytes frame in a buffer, or None (frame.c)." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "pyferry._ferry",
	.m_doc = "The C extension of pyferry (use the pyferry package).",
	.m_size = -1,
	.m_methods = module_methods,
};

static int add_type(PyObject *m, PyTypeObject *t, const char *name)
{
	if (PyType_Ready(t) < 0)
		return -1;
	Py_INCREF(t);
	if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
		Py_DECREF(t);
		return -1;
	}
	return 0;
}

PyMODINIT_FUNC PyInit__ferry(void)
{
	PyObject *m = PyModule_Create(&module_def);
	char qual[96];

	if (!m)
		return NULL;
	pyf_FerryError = PyErr_NewExceptionWithDoc(
		"pyferry.FerryError",
		"An error of ferry: errno (a positive errno), strerror (ferry's text), "
		"errname ('ETIMEDOUT', ...) and op (what failed).",
		PyExc_OSError, NULL);
	if (!pyf_FerryError || PyModule_AddObjectRef(m, "FerryError", pyf_FerryError) < 0)
		goto fail;
	for (size_t i = 0; i < sizeof(err_classes) / sizeof(err_classes[0]); i++) {
		PyObject *bases = err_classes[i].base
					  ? PyTuple_Pack(2, pyf_FerryError, *err_classes[i].base)
					  : PyTuple_Pack(1, pyf_FerryError);

		if (!bases)
			goto fail;
		snprintf(qual, sizeof(qual), "pyferry.%s", err_classes[i].name);
		err_classes[i].cls = PyErr_NewException(qual, bases, NULL);
		Py_DECREF(bases);
		if (!err_classes[i].cls ||
		    PyModule_AddObjectRef(m, err_classes[i].name, err_classes[i].cls) < 0)
			goto fail;
	}
	if (add_type(m, &pyf_engine_type, "Engine") || add_type(m, &pyf_peer_type, "Peer") ||
	    add_type(m, &pyf_buffer_type, "Buffer") ||
	    add_type(m, &pyf_stream_type, "StreamIter") ||
	    add_type(m, &pyf_aq_type, "AsyncQueue") || add_type(m, &pyf_stage_type, "Stage") ||
	    add_type(m, &pyf_chanw_type, "ChanWriter") || add_type(m, &pyf_chanr_type, "ChanReader"))
		goto fail;
	if (PyModule_AddIntConstant(m, "PROGRESS_THREAD", FERRY_PROGRESS_THREAD) ||
	    PyModule_AddIntConstant(m, "PROGRESS_MANUAL", FERRY_PROGRESS_MANUAL) ||
	    PyModule_AddIntConstant(m, "CQE_F_MORE", FERRY_CQE_F_MORE) ||
	    PyModule_AddIntConstant(m, "CQE_F_BUF", FERRY_CQE_F_BUF) ||
	    PyModule_AddIntConstant(m, "STAGE_META_SIZE", FERRY_STAGE_META_SIZE))
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
