/*
 * frame.c - FerryConnector's inline bytes frame read in C: _ferry._small_raw.
 *
 * Owns: recognising the one frame FerryConnector writes for a small bytes
 * payload (pyferry/_payload.py, _encode_small_raw: the prefix "FYC1" and
 * the header's length, then msgpack [ExtType(RAW, [None, bin]), []], the
 * bytes inside the bin, zeros to the next 64 bytes) and returning a copy of
 * its bytes, so the 64 B get path costs one call instead of a dozen Python
 * operations. Any other frame (or a malformed one) gives None, and the
 * general decoder in _payload.py takes it. Only the canonical encoding is
 * accepted (what msgpack writes for those lengths, as _encode_small_raw
 * does), so this and the Python encoder agree byte for byte.
 */
#include "pyf.h"

#define EXT_RAW 1
#define SMALL_MAX 0xFF00u /* _payload.py: inline bytes roots are shorter */

static uint32_t be16(const uint8_t *p)
{
	return (uint32_t)p[0] << 8 | p[1];
}

/* The payload of an inline bytes frame in p[0..size): its offset and length, or false. */
static bool small_raw(const uint8_t *p, size_t size, size_t *off, size_t *len)
{
	const uint8_t *q, *end;
	uint32_t hlen, body, n, ext_len;

	if (size < 16 || memcmp(p, "FYC1", 4) != 0)
		return false;
	hlen = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
	if (hlen > size - 8 || hlen < 8)
		return false;
	end = p + 8 + hlen;
	if (end[-1] != 0x90) /* the empty segment table */
		return false;
	q = p + 8;
	if (*q++ != 0x92)
		return false;
	switch (*q) { /* the ext header: fixext 4/8/16, ext 8, ext 16 */
	case 0xd6: body = 4; ext_len = 2; break;
	case 0xd7: body = 8; ext_len = 2; break;
	case 0xd8: body = 16; ext_len = 2; break;
	case 0xc7: body = q[1]; ext_len = 3; break;
	case 0xc8: body = be16(q + 1); ext_len = 4; break;
	default: return false;
	}
	/* (canonical: the shortest header for body, as msgpack writes it) */
	if ((ext_len == 3 && (body == 4 || body == 8 || body == 16)) ||
	    (ext_len == 4 && body < 0x100) || q + ext_len + 4 > end)
		return false;
	q += ext_len - 1;
	if (*q++ != EXT_RAW || q[0] != 0x92 || q[1] != 0xc0)
		return false;
	q += 2;
	if (q[0] == 0xc4) {
		n = q[1];
		q += 2;
	} else if (q[0] == 0xc5 && q + 3 <= end) {
		n = be16(q + 1);
		if (n < 0x100)
			return false;
		q += 3;
	} else {
		return false;
	}
	if (n >= SMALL_MAX || body != (uint32_t)(q - (p + 8 + 1 + ext_len)) + n ||
	    q + n + 1 != end)
		return false;
	*off = (size_t)(q - p);
	*len = n;
	return true;
}

PyObject *pyf_small_raw(PyObject *mod, PyObject *obj)
{
	Py_buffer v;
	size_t off, len;
	PyObject *r;

	(void)mod;
	if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0)
		return NULL;
	if (small_raw(v.buf, (size_t)v.len, &off, &len))
		r = PyBytes_FromStringAndSize((const char *)v.buf + off, (Py_ssize_t)len);
	else
		r = Py_NewRef(Py_None);
	PyBuffer_Release(&v);
	return r;
}
