/*
 * buffer.c - pyferry.Buffer: a ferry pool buffer (struct ferry_buf) seen
 * through Python's buffer protocol, without a copy. It is released once:
 * by release(), by leaving its `with` block, by a zero-copy put (ownership
 * goes to ferry), or when the object is collected. A Buffer whose memory a
 * memoryview (or numpy array, ...) still exports cannot be released or put:
 * BufferError.
 */
#include "pyf.h"

PyObject *pyf_buffer_new(struct ferry_buf *b, int readonly)
{
	pyf_buffer *self = PyObject_New(pyf_buffer, &pyf_buffer_type);

	if (!self) {
		ferry_buf_release(b);
		return NULL;
	}
	self->b = b;
	self->data = ferry_buf_data(b);
	self->len = (Py_ssize_t)ferry_buf_len(b);
	self->exports = 0;
	self->readonly = readonly;
	self->weakrefs = NULL;
	return (PyObject *)self;
}

static int buffer_check_free(pyf_buffer *self, const char *what)
{
	if (!self->b) {
		PyErr_Format(PyExc_BufferError, "cannot %s a released Buffer", what);
		return -1;
	}
	if (self->exports > 0) {
		PyErr_Format(PyExc_BufferError,
			     "cannot %s a Buffer while %zd view(s) of its memory exist "
			     "(release the memoryview / drop the array first)",
			     what, self->exports);
		return -1;
	}
	return 0;
}

struct ferry_buf *pyf_buffer_take(pyf_buffer *self)
{
	struct ferry_buf *b;

	if (self->readonly) {
		PyErr_SetString(PyExc_BufferError,
				"a received Buffer cannot be put zero copy; put its bytes "
				"(memoryview(buf)) or a Buffer from Engine.alloc");
		return NULL;
	}
	if (buffer_check_free(self, "put"))
		return NULL;
	b = self->b;
	self->b = NULL;
	self->data = NULL;
	return b;
}

static void buffer_release_now(pyf_buffer *self)
{
	if (self->b) {
		ferry_buf_release(self->b);
		self->b = NULL;
		self->data = NULL;
	}
}

static PyObject *buffer_release(pyf_buffer *self, PyObject *noargs)
{
	(void)noargs;
	if (!self->b)
		Py_RETURN_NONE; /* idempotent */
	if (buffer_check_free(self, "release"))
		return NULL;
	buffer_release_now(self);
	Py_RETURN_NONE;
}

static PyObject *buffer_enter(pyf_buffer *self, PyObject *noargs)
{
	(void)noargs;
	if (!self->b) {
		PyErr_SetString(PyExc_BufferError, "the Buffer is released");
		return NULL;
	}
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *buffer_exit(pyf_buffer *self, PyObject *args)
{
	(void)args;
	return buffer_release(self, NULL);
}

static PyObject *buffer_set_len(pyf_buffer *self, PyObject *arg)
{
	Py_ssize_t n = PyLong_AsSsize_t(arg);
	int rc;

	if (n == -1 && PyErr_Occurred())
		return NULL;
	if (buffer_check_free(self, "resize"))
		return NULL;
	if (self->readonly) {
		PyErr_SetString(PyExc_BufferError, "a received Buffer cannot be resized");
		return NULL;
	}
	if (n < 0) {
		PyErr_SetString(PyExc_ValueError, "length must be >= 0");
		return NULL;
	}
	if ((rc = ferry_buf_set_len(self->b, (size_t)n)) < 0)
		return pyf_raise(rc, "Buffer.set_len");
	self->len = n;
	Py_RETURN_NONE;
}

/* A device buffer (Engine.get(device_buf=True)): the CPU must not read it (BufferError). */
static int device_refused(pyf_buffer *self)
{
	if (ferry_buf_mem(self->b) == FERRY_MEM_HOST)
		return 0;
	PyErr_SetString(PyExc_BufferError, "the Buffer is CUDA device memory: the CPU cannot "
			"read it (its __cuda_array_interface__ names it)");
	return 1;
}

static PyObject *buffer_tobytes(pyf_buffer *self, PyObject *noargs)
{
	(void)noargs;
	if (!self->b) {
		PyErr_SetString(PyExc_BufferError, "the Buffer is released");
		return NULL;
	}
	if (device_refused(self))
		return NULL;
	return PyBytes_FromStringAndSize(self->data, self->len);
}

static PyObject *buffer_address(pyf_buffer *self, void *closure)
{
	(void)closure;
	if (!self->b) {
		PyErr_SetString(PyExc_BufferError, "the Buffer is released");
		return NULL;
	}
	return PyLong_FromVoidPtr(self->data);
}

static PyObject *buffer_released(pyf_buffer *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->b == NULL);
}

static PyObject *buffer_readonly(pyf_buffer *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->readonly);
}

/* The CUDA device its memory is on (FERRY_SQE_DEVICE_BUF), -1 for host memory. */
static PyObject *buffer_device(pyf_buffer *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->b ? ferry_buf_device(self->b) : -1);
}

/*
 * Device memory, as CuPy, Numba and torch read a CUDA array (version 3:
 * bytes, one dimension); no such attribute for host memory.
 */
static PyObject *buffer_cuda_array_interface(pyf_buffer *self, void *closure)
{
	(void)closure;
	if (!self->b || ferry_buf_mem(self->b) != FERRY_MEM_CUDA) {
		PyErr_SetString(PyExc_AttributeError, self->b ? "the Buffer is host memory"
							      : "the Buffer is released");
		return NULL;
	}
	return Py_BuildValue("{s:(n),s:s,s:(NO),s:i,s:O}", "shape", self->len, "typestr", "|u1",
			     "data", PyLong_FromVoidPtr(self->data),
			     self->readonly ? Py_True : Py_False, "version", 3, "strides",
			     Py_None);
}

static PyObject *buffer_exports(pyf_buffer *self, void *closure)
{
	(void)closure;
	return PyLong_FromSsize_t(self->exports);
}

static Py_ssize_t buffer_length(pyf_buffer *self)
{
	return self->b ? self->len : 0;
}

static int buffer_getbuffer(pyf_buffer *self, Py_buffer *view, int flags)
{
	if (!self->b) {
		PyErr_SetString(PyExc_BufferError, "the Buffer is released");
		view->obj = NULL;
		return -1;
	}
	if (device_refused(self)) {
		view->obj = NULL;
		return -1;
	}
	if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, self->readonly,
			      flags) < 0)
		return -1;
	self->exports++;
	return 0;
}

static void buffer_releasebuffer(pyf_buffer *self, Py_buffer *view)
{
	(void)view;
	self->exports--;
}

static PyObject *buffer_repr(pyf_buffer *self)
{
	if (!self->b)
		return PyUnicode_FromString("<pyferry.Buffer released>");
	return PyUnicode_FromFormat("<pyferry.Buffer %zd bytes at %p%s>", self->len, self->data,
				    self->readonly ? " readonly" : "");
}

static void buffer_dealloc(pyf_buffer *self)
{
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	/* No view can be left: every view holds a reference to us. */
	buffer_release_now(self);
	PyObject_Free(self);
}

static PyMethodDef buffer_methods[] = {
	{ "release", (PyCFunction)buffer_release, METH_NOARGS,
	  "Give the memory back to its pool (idempotent). BufferError while views exist." },
	{ "set_len", (PyCFunction)buffer_set_len, METH_O,
	  "Set how many bytes a put of this Buffer sends (at most its capacity)." },
	{ "tobytes", (PyCFunction)buffer_tobytes, METH_NOARGS, "A copy of the bytes." },
	{ "__enter__", (PyCFunction)buffer_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)buffer_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef buffer_getset[] = {
	{ "address", (getter)buffer_address, NULL, "The address of the first byte (int).", NULL },
	{ "released", (getter)buffer_released, NULL, "True once released or put.", NULL },
	{ "readonly", (getter)buffer_readonly, NULL, "True for received data.", NULL },
	{ "exports", (getter)buffer_exports, NULL, "Views of the memory that exist now.", NULL },
	{ "device", (getter)buffer_device, NULL,
	  "The CUDA device of its memory (a get with device_buf=True), -1 for host memory.", NULL },
	{ "__cuda_array_interface__", (getter)buffer_cuda_array_interface, NULL,
	  "Device memory as a CUDA array of bytes (torch.as_tensor(buf, device='cuda') views it "
	  "without a copy: release the Buffer only once no tensor uses it); host memory has none.",
	  NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PySequenceMethods buffer_as_sequence = {
	.sq_length = (lenfunc)buffer_length,
};

static PyBufferProcs buffer_as_buffer = {
	.bf_getbuffer = (getbufferproc)buffer_getbuffer,
	.bf_releasebuffer = (releasebufferproc)buffer_releasebuffer,
};

PyTypeObject pyf_buffer_type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "pyferry.Buffer",
	.tp_basicsize = sizeof(pyf_buffer),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Memory of ferry's pool, exposed without a copy through the buffer protocol "
		  "(memoryview(buf), numpy.frombuffer(buf)). Made by Engine.alloc and by "
		  "zero-copy gets; released once (release(), `with`, a put, or collection).",
	.tp_dealloc = (destructor)buffer_dealloc,
	.tp_repr = (reprfunc)buffer_repr,
	.tp_as_sequence = &buffer_as_sequence,
	.tp_as_buffer = &buffer_as_buffer,
	.tp_methods = buffer_methods,
	.tp_getset = buffer_getset,
	.tp_weaklistoffset = offsetof(pyf_buffer, weakrefs),
};
