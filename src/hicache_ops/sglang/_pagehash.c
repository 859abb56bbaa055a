/*
 * Chained SHA-256 page keys, the hot loop of hicache_ops.keys.
 *
 * chain(tokens, page_size, prior) -> list[str]
 *   tokens: a C-contiguous buffer of integers (4- or 8-byte, signed or unsigned: a numpy array
 *           or an array.array), holding whole pages
 *   page_size: tokens per page
 *   prior: 32 raw digest bytes the chain starts from, or None
 * Page i's key is sha256(key[i-1] raw bytes || page i as 4-byte LE uint32s), lowercase hex.
 * A token outside 0..2**32-1 raises OverflowError: the caller's Python path then reports it or
 * hashes the wide page, which this loop does not do.
 *
 * Native because a Python-level loop pays ~0.5 us of interpreter overhead per page, more than
 * the hash itself; reading the caller's buffer directly also saves the conversion copies. The
 * pure-Python path in keys.py computes the same keys.
 */
#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init & co: the low-level API has no per-call fetch */
#include <Python.h>
#include <openssl/sha.h>
#include <stdint.h>

static const char HEX[] = "0123456789abcdef";

static PyObject *digest_to_str(const unsigned char *digest) {
    PyObject *s = PyUnicode_New(2 * SHA256_DIGEST_LENGTH, 127);
    if (s == NULL) return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(s);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) {
        out[2 * i] = (Py_UCS1)HEX[digest[i] >> 4];
        out[2 * i + 1] = (Py_UCS1)HEX[digest[i] & 0x0f];
    }
    return s;
}

/* Pack page `page` of the buffer as uint32 into out; 0 on success, -1 if a token is out of range. */
static int pack_page(const Py_buffer *buf, int is_signed, Py_ssize_t page_size, Py_ssize_t page,
                     uint32_t *out) {
    Py_ssize_t base = page * page_size;
    if (buf->itemsize == 8) {
        if (is_signed) {
            const int64_t *src = (const int64_t *)buf->buf + base;
            for (Py_ssize_t i = 0; i < page_size; i++) {
                if (src[i] < 0 || src[i] > (int64_t)UINT32_MAX) return -1;
                out[i] = (uint32_t)src[i];
            }
        } else {
            const uint64_t *src = (const uint64_t *)buf->buf + base;
            for (Py_ssize_t i = 0; i < page_size; i++) {
                if (src[i] > UINT32_MAX) return -1;
                out[i] = (uint32_t)src[i];
            }
        }
    } else { /* itemsize 4 */
        const int32_t *src = (const int32_t *)buf->buf + base;
        for (Py_ssize_t i = 0; i < page_size; i++) {
            if (is_signed && src[i] < 0) return -1;
            out[i] = (uint32_t)src[i];
        }
    }
    return 0;
}

static PyObject *chain(PyObject *self, PyObject *args) {
    PyObject *tokens_obj, *prior_obj;
    Py_ssize_t page_size;
    if (!PyArg_ParseTuple(args, "OnO", &tokens_obj, &page_size, &prior_obj)) return NULL;

    Py_buffer buf;
    if (PyObject_GetBuffer(tokens_obj, &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;

    unsigned char digest[SHA256_DIGEST_LENGTH];
    uint32_t *packed = NULL;
    int has_prior = 0;
    PyObject *result = NULL;
    /* One letter, optionally after a byte-order/size prefix such as '<' or '='. */
    const char *fmt = buf.format ? buf.format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    int is_signed = (*fmt == 'b' || *fmt == 'h' || *fmt == 'i' || *fmt == 'l' || *fmt == 'q');
    int is_int = is_signed || *fmt == 'B' || *fmt == 'H' || *fmt == 'I' || *fmt == 'L' || *fmt == 'Q';
    if (!is_int || fmt[1] != '\0' || (buf.itemsize != 4 && buf.itemsize != 8)) {
        PyErr_SetString(PyExc_TypeError, "tokens must be a buffer of 4- or 8-byte integers");
        goto done;
    }
    Py_ssize_t n_tokens = buf.len / buf.itemsize;
    if (page_size <= 0 || n_tokens % page_size != 0) {
        PyErr_SetString(PyExc_ValueError, "tokens must hold whole pages of page_size > 0");
        goto done;
    }
    if (prior_obj != Py_None) {
        char *prior;
        Py_ssize_t prior_len;
        if (PyBytes_AsStringAndSize(prior_obj, &prior, &prior_len) < 0) goto done;
        if (prior_len != SHA256_DIGEST_LENGTH) {
            PyErr_SetString(PyExc_ValueError, "prior must be 32 raw digest bytes");
            goto done;
        }
        memcpy(digest, prior, SHA256_DIGEST_LENGTH);
        has_prior = 1;
    }
    /* One contiguous message per page, prior digest first: a single SHA256_Update per page. */
    Py_ssize_t prior_len = has_prior ? SHA256_DIGEST_LENGTH : 0;
    unsigned char *message = PyMem_Malloc(SHA256_DIGEST_LENGTH + (size_t)page_size * 4);
    if (message == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    packed = (uint32_t *)(message + SHA256_DIGEST_LENGTH);
    int direct = buf.itemsize == 4 && !is_signed; /* already uint32 (little-endian host) */

    Py_ssize_t n_pages = n_tokens / page_size;
    result = PyList_New(n_pages);
    if (result == NULL) goto free_message;
    for (Py_ssize_t i = 0; i < n_pages; i++) {
        if (direct) {
            memcpy(packed, (const unsigned char *)buf.buf + i * page_size * 4, (size_t)page_size * 4);
        } else if (pack_page(&buf, is_signed, page_size, i, packed) < 0) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_OverflowError, "a token id is outside 0..2**32-1");
            goto free_message;
        }
        if (prior_len) memcpy(message + SHA256_DIGEST_LENGTH - prior_len, digest, SHA256_DIGEST_LENGTH);
        SHA256_CTX ctx; /* not the one-shot SHA256(): in OpenSSL 3 it fetches the algorithm per call */
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, message + SHA256_DIGEST_LENGTH - prior_len, (size_t)(prior_len + page_size * 4));
        SHA256_Final(digest, &ctx);
        prior_len = SHA256_DIGEST_LENGTH;
        PyObject *s = digest_to_str(digest);
        if (s == NULL) {
            Py_CLEAR(result);
            goto free_message;
        }
        PyList_SET_ITEM(result, i, s);
    }
free_message:
    PyMem_Free(message);
    packed = NULL;

done:
    PyMem_Free(packed);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"chain", chain, METH_VARARGS, "Chained SHA-256 keys of whole uint32 pages."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pagehash", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pagehash(void) { return PyModule_Create(&module); }
