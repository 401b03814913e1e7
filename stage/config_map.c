/*
 * stage/config_map.c - upstream connector names to ferry transports.
 *
 * Owns: the table of connector types ferry understands, the choice of a
 * transport for an edge from its connector and `extra` keys, and the
 * verdict on every `extra` key (honoured: stored on the edge; ignored: said
 * so, with the reason). The rules:
 *   SharedMemoryConnector            shm
 *   MooncakeTransferEngineConnector  rdma when protocol: rdma and an RDMA
 *                                    device exists, else tcp (with a
 *                                    warning when rdma was asked for)
 *   MoriTransferEngineConnector      rdma when a device exists, else tcp
 *   MooncakeStoreConnector,
 *   MooncakeConnector, YuanrongConnector
 *                                    tcp; a GET without metadata looks the
 *                                    key up through the control channel
 *   YuanrongTransferEngineConnector  tcp (no Ascend NPU path here), warned
 *   FerryConnector                   extra.transport: shm | tcp | rdma |
 *                                    auto (default): shm when extra.host is
 *                                    absent or local, else rdma when a
 *                                    device exists, else tcp
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_map.h"
#include "stage_log.h"

enum kind { K_SHM, K_TE, K_MORI, K_STORE, K_YR_TE, K_FERRY };

static const struct {
	const char *type;
	enum kind kind;
} types[] = {
	{ "SharedMemoryConnector", K_SHM },
	{ "MooncakeTransferEngineConnector", K_TE },
	{ "MoriTransferEngineConnector", K_MORI },
	{ "MooncakeStoreConnector", K_STORE },
	{ "MooncakeConnector", K_STORE },
	{ "YuanrongConnector", K_STORE },
	{ "YuanrongTransferEngineConnector", K_YR_TE },
	{ "FerryConnector", K_FERRY },
};

#define NTYPES (sizeof(types) / sizeof(types[0]))

bool config_type_known(const char *type)
{
	for (unsigned i = 0; type && i < NTYPES; i++)
		if (!strcmp(types[i].type, type))
			return true;
	return false;
}

const char *config_known_types(void)
{
	return "SharedMemoryConnector, MooncakeTransferEngineConnector, "
	       "MoriTransferEngineConnector, MooncakeStoreConnector, MooncakeConnector, "
	       "YuanrongConnector, YuanrongTransferEngineConnector, FerryConnector";
}

bool config_rdma_present(void)
{
	const char *dir = getenv("FERRY_RDMA_SYSFS");
	struct dirent *d;
	bool found = false;
	DIR *D;

	D = opendir(dir && *dir ? dir : "/sys/class/infiniband");
	if (!D)
		return false;
	while (!found && (d = readdir(D)))
		found = d->d_name[0] != '.';
	closedir(D);
	return found;
}

#ifdef FERRY_HAVE_YAML

#define PATH_MAX_LEN 256

/* Key paths for messages: cut at PATH_MAX_LEN, which is only cosmetic. */
static void pathf(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pathf(char *buf, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, PATH_MAX_LEN, fmt, ap);
	va_end(ap);
}

static bool host_is_local(const char *h)
{
	return !h || !*h || !strcmp(h, "auto") || !strcmp(h, "localhost") ||
	       !strncmp(h, "127.", 4) || !strcmp(h, "::1");
}

/* The scalar text of extra[key] (NULL if absent or not a scalar). */
static const char *extra_str(struct loader *L, yaml_node_t *extra, const char *key,
			     yaml_node_t **node)
{
	yaml_node_t *v = config_map_get(L, extra, key, NULL);

	if (node)
		*node = v;
	return v && !config_is_null(v) ? config_scalar(v) : NULL;
}

static char *dup_or_oom(struct loader *L, const char *s)
{
	char *d = strdup(s);

	if (!d)
		config_oom(L);
	return d;
}

/* The text of an extra key or value as kept for `ferry check`: cut at STAGE_EXTRA_SHOWN. */
static char *dup_shown(struct loader *L, const char *s, size_t len)
{
	size_t n = len > STAGE_EXTRA_SHOWN ? STAGE_EXTRA_SHOWN : len;
	char *d = malloc(n + 4);

	if (!d) {
		config_oom(L);
		return NULL;
	}
	memcpy(d, s, n);
	strcpy(d + n, len > n ? "..." : "");
	return d;
}

/* Decide e->transport (and e->note) from the connector kind and its extras. */
static void choose_transport(struct loader *L, struct stage_edge *e, enum kind kind,
			     yaml_node_t *extra, const char *path, bool rdma)
{
	char p[PATH_MAX_LEN];
	const char *proto, *note = NULL;
	yaml_node_t *pn;

	switch (kind) {
	case K_SHM:
		e->transport = STAGE_TRANSPORT_SHM;
		note = "shared memory";
		break;
	case K_TE:
		proto = extra_str(L, extra, "protocol", &pn);
		pathf(p, "%s.extra.protocol", path);
		if (!pn) {
			proto = extra_str(L, extra, "proto", &pn);
			pathf(p, "%s.extra.proto", path);
		}
		if (!proto) {
			e->transport = STAGE_TRANSPORT_TCP;
			config_warn(L, pn ? pn : extra, p,
				    "edge %s->%s: %s without protocol: tcp", e->from, e->to,
				    e->connector_type);
			note = "no protocol given: tcp";
			e->fell_back = true;
		} else if (!strcmp(proto, "rdma")) {
			if (rdma) {
				e->transport = STAGE_TRANSPORT_RDMA;
				note = "protocol rdma, RDMA device present";
			} else {
				e->transport = STAGE_TRANSPORT_TCP;
				e->fell_back = true;
				note = "protocol rdma but no RDMA device: tcp";
				config_warn(L, pn, p, "edge %s->%s: protocol rdma but no RDMA device "
					    "(/sys/class/infiniband is empty): tcp instead", e->from,
					    e->to);
			}
		} else if (!strcmp(proto, "tcp")) {
			e->transport = STAGE_TRANSPORT_TCP;
			note = "protocol tcp";
		} else {
			config_error(L, pn, p, "must be rdma or tcp, not '%.*s%s'",
				     CONFIG_SHOW(proto));
		}
		break;
	case K_MORI:
		if (rdma) {
			e->transport = STAGE_TRANSPORT_RDMA;
			note = "RDMA device present";
		} else {
			e->transport = STAGE_TRANSPORT_TCP;
			e->fell_back = true;
			note = "no RDMA device: tcp";
			config_warn(L, extra, path, "edge %s->%s: %s without an RDMA device: tcp",
				    e->from, e->to, e->connector_type);
		}
		break;
	case K_STORE:
		e->transport = STAGE_TRANSPORT_TCP;
		e->key_lookup = true;
		note = "store-style: tcp, keys looked up through the control channel";
		break;
	case K_YR_TE:
		e->transport = STAGE_TRANSPORT_TCP;
		e->fell_back = true;
		note = "no Ascend NPU path in ferry: tcp";
		config_warn(L, extra, path, "edge %s->%s: %s: Ascend NPU transfers are not "
			    "supported: tcp instead", e->from, e->to, e->connector_type);
		break;
	case K_FERRY: {
		const char *t = extra_str(L, extra, "transport", &pn);
		const char *host = extra_str(L, extra, "host", NULL);

		pathf(p, "%s.extra.transport", path);
		if (pn && !t) {
			config_error(L, pn, p, "must be shm, tcp, rdma or auto");
			break;
		}
		if (!t || !strcmp(t, "auto")) {
			if (host_is_local(host)) {
				e->transport = STAGE_TRANSPORT_SHM;
				note = "auto: both ends on this host: shm";
			} else if (rdma) {
				e->transport = STAGE_TRANSPORT_RDMA;
				note = "auto: remote host, RDMA device present: rdma";
			} else {
				e->transport = STAGE_TRANSPORT_TCP;
				note = "auto: remote host, no RDMA device: tcp";
			}
		} else if (!strcmp(t, "shm")) {
			e->transport = STAGE_TRANSPORT_SHM;
			note = "transport shm";
		} else if (!strcmp(t, "tcp")) {
			e->transport = STAGE_TRANSPORT_TCP;
			note = "transport tcp";
		} else if (!strcmp(t, "rdma")) {
			if (rdma) {
				e->transport = STAGE_TRANSPORT_RDMA;
				note = "transport rdma";
			} else {
				e->transport = STAGE_TRANSPORT_TCP;
				e->fell_back = true;
				note = "transport rdma but no RDMA device: tcp";
				config_warn(L, pn, p, "edge %s->%s: transport rdma but no RDMA "
					    "device (/sys/class/infiniband is empty): tcp instead",
					    e->from, e->to);
			}
		} else {
			config_error(L, pn, p, "must be shm, tcp, rdma or auto, not '%.*s%s'",
				     CONFIG_SHOW(t));
		}
		break;
	}
	}
	if (note)
		e->note = dup_or_oom(L, note);
}

/* Record extra key k = v; then decide what it means for this edge. */
static void take_extra(struct loader *L, struct stage_edge *e, enum kind kind, yaml_node_t *k,
		       yaml_node_t *v, const char *path)
{
	const char *key = config_scalar(k), *s;
	struct stage_extra *x;
	char p[PATH_MAX_LEN];
	bool shm = e->transport == STAGE_TRANSPORT_SHM;
	int64_t num;

	if (!key) {
		config_error(L, k, path, "extra keys must be strings");
		return;
	}
	pathf(p, "%s.extra.%.*s%s", path, CONFIG_SHOW(key));
	if (!config_extra_count(L, k, p))
		return;
	if (!config_grow((void **)&e->extras, e->nextras, sizeof(*e->extras))) {
		config_oom(L);
		return;
	}
	x = &e->extras[e->nextras];
	memset(x, 0, sizeof(*x));
	x->note = "invalid value (see the errors)";
	x->line = (int)k->start_mark.line + 1;
	x->column = (int)k->start_mark.column + 1;
	x->key = dup_shown(L, key, k->data.scalar.length);
	if (v->type == YAML_SCALAR_NODE)
		x->value = dup_shown(L, config_scalar(v), v->data.scalar.length);
	else
		x->value = dup_or_oom(L, v->type == YAML_MAPPING_NODE ? "<mapping>" : "<sequence>");
	if (!x->key || !x->value) {
		free(x->key);
		free(x->value);
		return;
	}
	e->nextras++;

	if (!strcmp(key, "host")) {
		if (kind == K_FERRY && shm) {
			x->honoured = true;
			x->note = "a local host: the edge stays on shm";
		} else if (shm) {
			x->note = "shm edges stay on this host";
		} else if (config_str(L, v, p, &s)) {
			x->honoured = true;
			x->note = strcmp(s, "auto") ? "address of the receiving side"
						    : "auto: the address is detected";
			if (strcmp(s, "auto"))
				e->host = dup_or_oom(L, s);
		}
	} else if (!strcmp(key, "zmq_port") || !strcmp(key, "port")) {
		if (!config_int(L, v, p, &num)) {
			x->note = "not a number";
		} else if (num < 0 || num > 65535) {
			config_error(L, v, p, "must be a port 0..65535, not %lld", (long long)num);
			x->note = "out of range";
		} else if (shm) {
			x->note = "shm engines meet by name: no port";
		} else {
			x->honoured = true;
			x->note = num ? "port of the control endpoint"
				      : "port of the control endpoint: 0, the kernel picks";
			e->port = (uint32_t)num;
		}
	} else if (!strcmp(key, "memory_pool_size")) {
		if (config_int(L, v, p, &num)) {
			if (num < 1) {
				config_error(L, v, p, "must be a positive size, not %lld",
					     (long long)num);
			} else {
				x->honoured = true;
				x->note = "size of the stage's registered pool";
				e->memory_pool_size = (uint64_t)num;
			}
		}
	} else if (!strcmp(key, "memory_pool_device")) {
		if (config_str(L, v, p, &s)) {
			if (!strcmp(s, "cpu")) {
				x->honoured = true;
				x->note = "host memory";
				e->memory_pool_device = dup_or_oom(L, s);
			} else if (!strncmp(s, "cuda", 4) && (!s[4] || s[4] == ':')) {
				/* What it means here: device tensors go through PUT/GET, staged. */
				x->honoured = true;
				x->note = "the pool stays host memory, pinned for CUDA's DMA when device "
					  "memory is registered; device tensors go through PUT/GET as "
					  "CUDA regions";
				e->memory_pool_device = dup_or_oom(L, s);
			} else {
				x->note = "device memory pools are not supported yet: host memory";
				config_warn(L, v, p, "edge %s->%s: %s pools are not supported yet: "
					    "host memory is used", e->from, e->to, s);
			}
		}
	} else if (!strcmp(key, "shm_threshold_bytes")) {
		if (config_int(L, v, p, &num)) {
			if (num < 0) {
				config_error(L, v, p, "must be >= 0, not %lld", (long long)num);
			} else if (shm) {
				x->note = "no inline path: every payload moves through the pool "
					  "without a copy";
			} else {
				x->honoured = true;
				x->note = "payloads below it are sent eagerly";
				e->eager_max = (uint64_t)num;
			}
		}
	} else if (!strcmp(key, "protocol") || !strcmp(key, "proto")) {
		if (kind == K_TE) {
			x->honoured = true;
			x->note = "chose the transport";
		} else {
			x->note = "only MooncakeTransferEngineConnector reads it";
		}
	} else if (!strcmp(key, "transport")) {
		if (kind == K_FERRY) {
			x->honoured = true;
			x->note = "chose the transport";
		} else {
			x->note = "only FerryConnector reads it";
		}
	} else if (!strcmp(key, "device_name")) {
		if (e->transport == STAGE_TRANSPORT_RDMA && !config_is_null(v) &&
		    config_str(L, v, p, &s)) {
			x->honoured = true;
			x->note = "RDMA device(s) to use";
			e->device_name = dup_or_oom(L, s);
		} else {
			x->note = "no RDMA on this edge";
		}
	} else if (!strcmp(key, "get_sub_timeout_ms")) {
		if (config_int(L, v, p, &num)) {
			if (num < 0 || num > UINT32_MAX) {
				config_error(L, v, p, "must be 0..%u, not %lld", UINT32_MAX,
					     (long long)num);
			} else {
				x->honoured = true;
				x->note = "bound of a GET on this edge (0: the stage's default)";
				e->get_timeout_ms = (uint32_t)num;
			}
		}
	} else if (!strcmp(key, "role")) {
		x->note = "set by the wiring: the from stage sends, the to stage receives";
	} else {
		x->note = "not used by ferry";
	}
	if (!x->honoured)
		log_info("%s: ignored (%s)", p, x->note);
}

void config_resolve_spec(struct loader *L, struct stage_edge *e, yaml_node_t *spec,
			 const char *path, const char *ref, bool rdma_present)
{
	char p[PATH_MAX_LEN];
	yaml_node_t *extra;
	enum kind kind = K_SHM;
	bool known = false;

	if (ref)
		pathf(p, "%s.%s", path, ref);
	else
		pathf(p, "%s", path);
	for (unsigned i = 0; i < NTYPES; i++) {
		if (!strcmp(types[i].type, e->connector_type)) {
			kind = types[i].kind;
			known = true;
		}
	}
	if (!known) {
		/* A referenced spec's type was reported with its definition. */
		if (!ref)
			config_error(L, config_map_get(L, spec, "name", NULL), p,
				     "unknown connector type '%s' (known: %s)", e->connector_type,
				     config_known_types());
		return;
	}
	extra = config_map_get(L, spec, "extra", NULL);
	if (extra && config_is_null(extra))
		extra = NULL;
	if (extra && extra->type != YAML_MAPPING_NODE) {
		if (!ref) {
			char q[PATH_MAX_LEN];

			pathf(q, "%s.extra", p);
			config_want(L, extra, YAML_MAPPING_NODE, q);
		}
		return;
	}
	choose_transport(L, e, kind, extra, p, rdma_present);
	if (!extra)
		return;
	{
		unsigned n;
		const struct config_pair *pairs = config_map_pairs(L, extra, &n);

		for (unsigned i = 0; i < n && !config_stopped(L); i++)
			take_extra(L, e, kind, pairs[i].key, pairs[i].value, p);
	}
}

void config_autofill(struct loader *L, struct stage_edge *e)
{
	e->auto_filled = true;
	e->transport = STAGE_TRANSPORT_SHM;
	e->connector_type = dup_or_oom(L, "SharedMemoryConnector");
	e->note = dup_or_oom(L, "no connector named: shm (auto-filled)");
}

#endif
