/*
 * ferry.h - the public interface of ferry, an asynchronous transfer engine
 * with a completion-queue API for multi-stage inference pipelines.
 *
 * This is the only header a user includes. Everything else is private.
 *
 * Conventions (borrowed on purpose from liburing, libuv and UCX):
 *  - Every function that returns int returns 0 (or a count) on success and a
 *    negative errno on failure; errno itself is never the channel.
 *    ferry_strerror() turns a code into text.
 *  - Long-lived objects are opaque handles: struct ferry_engine, ferry_sq,
 *    ferry_cq, ferry_peer, ferry_buf.
 *  - Work is submitted as SQEs (struct ferry_sqe) into a per-thread
 *    submission queue and completes as CQEs (struct ferry_cqe) in a
 *    completion queue. An op's result is cqe->res: >= 0 on success, a
 *    negative errno on failure.
 *  - If submitting fails, the op's callback never runs and no CQE is posted.
 *  - Parameter structs start with their own size (set by the *_INIT
 *    macros), so they can grow without breaking binaries built against an
 *    older header.
 *
 * Threads (each function's comment says from which threads it may be
 * called; these are the rules behind those sentences):
 *  - "Any thread" means any thread, also at the same time as other
 *    threads calling into the same engine. The exceptions are named: a
 *    submission queue is its thread's (ferry_sq_get), and its entries are
 *    taken, filled (ferry_prep_*, ferry_sqe_set_*) and submitted on that
 *    thread only; ferry_engine_destroy wants every other thread done with
 *    the engine; a CQ is destroyed once no thread polls or waits on it.
 *  - No callback runs while ferry holds a lock of its own, so a callback
 *    (a completion's or the log sink) may call any ferry function, except:
 *    ferry_engine_destroy of its engine, ferry_cq_destroy of the CQ it
 *    was posted to, and ferry_cq_wait (a callback must not wait: on the
 *    reactor thread it would wait for itself).
 *  - Where a completion callback runs (ferry_sqe_set_callback): inside
 *    ferry_cq_poll / ferry_cq_wait of its CQ, on the polling thread; with
 *    FERRY_SQE_CB_REACTOR, on the reactor thread (THREAD mode; never on a
 *    caller's thread, also not when ferry_sq_submit runs a round itself)
 *    or on the thread driving the engine (MANUAL mode: inside
 *    ferry_progress, ferry_cq_poll or ferry_cq_wait). Two more places: in
 *    ferry_engine_destroy, on the destroying thread, for every op still
 *    there; and the callbacks of completions left in a CQ destroyed before
 *    they were polled run in the engine's next round, on whichever thread
 *    runs it (the reactor, a thread in ferry_sq_submit, ferry_cq_wait or
 *    ferry_cq_poll standing in for it, or in MANUAL mode the thread driving
 *    progress).
 *  - The log sink (ferry_log_set) runs on the thread that logs: the
 *    reactor thread, or any thread inside a ferry call (a bad argument is
 *    logged on the caller's thread).
 *  - For a binding that holds a lock while it calls ferry (Python's GIL):
 *    callbacks that can run on the reactor thread must take that lock
 *    themselves, so the binding releases it around the calls that wait
 *    for the reactor or for callbacks: ferry_engine_destroy and
 *    ferry_cq_wait (a FERRY_SQE_CB_REACTOR callback blocked on the lock
 *    would stall the reactor, and the destroy waits for it). No other
 *    call waits for the reactor.
 *
 * A walk-through for a new user is in docs/api.md.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

/*
 * The ferry_prep_* and ferry_sqe_set_* helpers are static inline for C; the
 * library also exports each of them, out of line and under the same name
 * (built from these same bodies, engine/prep.c), for a foreign-function
 * interface (cffi, ctypes) that cannot call an inline function.
 */
#ifdef FERRY_INLINE_EXPORT
#define FERRY_INLINE FERRY_API
#else
#define FERRY_INLINE static inline
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
/* A version as one number: major * 10000 + minor * 100 + patch. */
#define FERRY_VERSION_NUMBER                                                           \
	(FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

/*
 * The version of the library running (FERRY_VERSION_NUMBER's form): a
 * program built against one header may run with a newer library. Any
 * thread.
 */
FERRY_API int ferry_version(void);

/* What this build of the library can do (ferry_features, bits). */
#define FERRY_FEATURE_SHM (1u << 0)     /* engines of one host, over shared memory */
#define FERRY_FEATURE_TCP (1u << 1)     /* engines on other hosts, over tcp */
#define FERRY_FEATURE_CONTROL (1u << 2) /* the control channel (libzmq): ferry_peer_connect, LOOKUP, ... */
#define FERRY_FEATURE_YAML (1u << 3)    /* stage files (libyaml): ferry_stage_open */
#define FERRY_FEATURE_RDMA (1u << 4)    /* the rdma transport (libibverbs, librdmacm) */
#define FERRY_FEATURE_CUDA (1u << 5)    /* CUDA device memory: the runtime loaded, a device seen */

/*
 * The FERRY_FEATURE_* bits of this build. A feature without its bit is
 * refused where it is asked for, with the errno its functions document.
 * Any thread.
 */
FERRY_API uint32_t ferry_features(void);

/* Limits of names carried in SQEs. Longer names are refused (-ENAMETOOLONG). */
#define FERRY_NAME_MAX 64 /* engine and peer names, namespaces, incl. NUL */
#define FERRY_KEY_MAX 128 /* keys, incl. NUL */

struct ferry_engine;
struct ferry_sq;
struct ferry_cq;
struct ferry_peer;
struct ferry_buf;
struct ferry_cqe;

/* ------------------------------------------------------------------ */
/* Errors and logging                                                  */
/* ------------------------------------------------------------------ */

/*
 * Text for a result code: accepts a negative errno (or its positive value)
 * and returns a static string, never NULL. Codes ferry gives a specific
 * meaning (e.g. -EEXIST: key already live) are described in those terms.
 * Any thread.
 */
FERRY_API const char *ferry_strerror(int err);

/* The symbolic name of a result code ("EAGAIN", "ETIMEDOUT", ...). Any thread. */
FERRY_API const char *ferry_err_name(int err);

enum ferry_log_level {
	FERRY_LOG_ERROR = 0,
	FERRY_LOG_WARN = 1,
	FERRY_LOG_INFO = 2,
	FERRY_LOG_DEBUG = 3,
};

/*
 * A log sink: one line (NUL-terminated, no newline) at level. It runs on the
 * thread that logs (see "Threads" above), possibly on several at once.
 */
typedef void ferry_log_cb(int level, const char *line, void *arg);

/*
 * Route ferry's log lines: lines at or below level go to cb (NULL: stderr).
 * A line holds no control character (one that came in a peer's bytes, such
 * as a newline, is written '?'). level < 0 silences logging. The default
 * is stderr at FERRY_LOG_WARN, or the level named by the environment
 * variable FERRY_LOG
 * (error|warn|info|debug|none). Process-wide. Any thread: a line logged
 * meanwhile goes to the old sink with the old arg or to the new one with
 * the new arg, never a mix.
 */
FERRY_API void ferry_log_set(int level, ferry_log_cb *cb, void *arg);

/*
 * Write one line to ferry's log, as ferry's own lines are (same sink, same
 * threshold; control characters written as '?'): for layers built on ferry
 * (the stage layer, a binding) whose lines belong beside the engine's. At
 * most 511 bytes are kept. Any thread.
 */
FERRY_API void ferry_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------------ */
/* Engine                                                              */
/* ------------------------------------------------------------------ */

enum ferry_progress_mode {
	/*
	 * A reactor thread drives every transport. It spins for
	 * spin_ns while work flows, then sleeps in one io_uring wait and is
	 * woken by doorbells that are rung only once it said it sleeps.
	 */
	FERRY_PROGRESS_THREAD = 0,
	/*
	 * No thread: progress runs inside ferry_progress(), ferry_cq_poll()
	 * and ferry_cq_wait() on the caller's thread. Lowest latency; the
	 * application must call one of them for anything to move.
	 */
	FERRY_PROGRESS_MANUAL = 1,
	FERRY_PROGRESS__MAX
};

struct ferry_engine_params {
	size_t size;           /* sizeof(struct ferry_engine_params) */
	const char *name;      /* this engine's name, e.g. "stage1.rank0" (required) */
	const char *ns;        /* namespace isolating a pipeline; NULL = "default" */
	const char *config_path; /* must be NULL: open stages with ferry_stage_open() */
	size_t pool_size;      /* bytes of the registered pool (0 = 64 MiB) */
	enum ferry_progress_mode progress;
	/*
	 * THREAD mode: spin this long before sleeping (0 = 50 us), the
	 * reactor after its last round and ferry_cq_wait before it sleeps.
	 * A spin under 1 ms adapts to busy CPUs: when a yield of its CPU
	 * loses it to another thread for over 1 ms, spins sleep at once for
	 * a while (health ops.yields_lost). 1 ms or more: spins never adapt.
	 */
	uint64_t spin_ns;
	uint32_t max_ops;      /* ops in flight per engine (0 = 4096) */
	uint32_t sq_entries;   /* entries of each submission queue (0 = 256, power of 2) */
	uint32_t cq_entries;   /* entries of the default CQ (0 = 4096) */
	uint32_t max_keys;     /* arrived-but-unconsumed keys held (0 = 16384) */
	uint32_t max_bufs;     /* buffer handles in the pool (0 = 65536) */
	uint32_t flags;        /* FERRY_ENGINE_* */
	/* Fields below were added with the tcp transport (size-versioned). */
	const char *listen;        /* tcp endpoint "tcp://HOST:PORT" (HOST may be *); port 0 =
				    * the kernel picks (see ferry_engine_address); NULL = accept
				    * no tcp connections (calling out still works) */
	const char *secret;        /* cluster secret; NULL: $FERRY_SECRET, else the content of
				    * secret_file, else none: only loopback peers, with a warning */
	const char *secret_file;
	uint32_t heartbeat_ms;     /* tcp, rdma: ping an idle peer this often (0 = 1000) */
	uint32_t peer_timeout_ms;  /* tcp, rdma: a peer silent this long is dead (0 = 10000) */
	/* Added with the control channel (size-versioned). */
	const char *control;       /* control channel endpoint "tcp://HOST:PORT" (ZeroMQ):
				    * port 0 = the kernel picks (ferry_engine_control_address);
				    * NULL = accept no control connections (calling out through
				    * ferry_peer_connect still works). With control set and
				    * listen NULL, the data path listens on HOST, port 0, and
				    * the control channel publishes its address: one address
				    * per engine, no port arithmetic. */
	/* Added with the bounds on handshakes (size-versioned). */
	uint32_t handshake_ms;     /* tcp and control: a handshake not done in this long is
				    * dropped, at both ends, and a caller that has proved
				    * nothing by then is hung up on (0 = 3000) */
	/* Added with the rdma transport (size-versioned). */
	const char *rdma_listen;   /* rdma endpoint "rdma://ADDRESS:PORT" (an address of an
				    * RDMA device's interface; port 0 = rdma_cm picks, see
				    * ferry_engine_addresses); NULL = accept no rdma
				    * connections (calling out still works). Creation fails
				    * with -EADDRNOTAVAIL when this machine has no RDMA
				    * device, -EPROTONOSUPPORT when the build has no rdma
				    * transport (FERRY_FEATURE_RDMA). */
};

/* Do not fault the pool in at creation (tests with huge pools only). */
#define FERRY_ENGINE_NO_PREFAULT (1u << 0)
/*
 * Its callers poll (ferry_cq_poll in a loop, or waits that rarely sleep):
 * the fences of the busy path (each submit, round, reap; each shm PUT) are
 * compiler barriers only, and each sleep of the engine pays for both sides
 * with membarrier(2), which interrupts the CPUs running registered
 * processes (on a virtual machine 5-17 us while the peer runs). The first
 * such engine registers its process for membarrier (a process with only
 * default engines never does). Fences toward it from shm peers in
 * registered processes are light too; its fences toward a peer that is not
 * BUSY_POLL stay full. Taken only where the kernel offers membarrier
 * (health "fences" says); FERRY_MEMBARRIER=0 in the environment turns it
 * off, =1 turns it on for every engine of the process. docs/design.md §5.
 */
#define FERRY_ENGINE_BUSY_POLL (1u << 1)
/*
 * MANUAL mode only (-EINVAL with THREAD): one thread drives the engine. The
 * first thread that calls ferry_cq_poll, ferry_cq_wait, ferry_cq_arm or
 * ferry_progress on it (any of its CQs) becomes its poller; while that
 * thread lives, the same calls from any other thread fail with -EPERM
 * (logged once) and change nothing (a thread created after the poller
 * exited may be taken for it: the identity is the thread pointer, which the
 * C library reuses). ferry_engine_claim_poller claims it beforehand (or
 * says that the calling thread may not). Submit on the poller's thread
 * too, or from a thread that never waits for the op: a wait there fails
 * while the op stays in flight. In return the poller's rounds take no lock
 * and its CQs are reaped without a compare-and-swap per completion or
 * fences toward other waiters (there are none): with FERRY_ENGINE_BUSY_POLL
 * too, a busy shm round trip executes no locked instruction. Any thread may still submit,
 * allocate buffers, wake a CQ (ferry_cq_wake) and destroy the engine once
 * its poller stopped (joined, or handed over with its own synchronization).
 * docs/design.md §5.
 */
#define FERRY_ENGINE_SINGLE_POLLER (1u << 2)

#define FERRY_ENGINE_PARAMS_INIT { .size = sizeof(struct ferry_engine_params) }

/*
 * Create an engine. params->size must be set (use FERRY_ENGINE_PARAMS_INIT);
 * unknown sizes are refused with -EINVAL. The engine registers its name in
 * its namespace: a second live engine with the same (ns, name) in this
 * process gets -EADDRINUSE. Returns 0 and *out, or -EINVAL (bad params,
 * logged), -ENAMETOOLONG, -EADDRINUSE, -ENOMEM, or the -errno of a system
 * call that failed (memfd, io_uring, thread). Any thread.
 */
FERRY_API int ferry_engine_create(const struct ferry_engine_params *params,
				  struct ferry_engine **out);

/*
 * Destroy an engine. Every op still in flight, and every entry submitted
 * but not yet taken, completes with -ECANCELED: callbacks run (on the
 * destroying thread, each exactly once, also for completions that were
 * posted but never polled); completions without a callback are discarded
 * with the engine's CQs, and buffers they carried go back to their pools.
 * Keys that arrived and were never consumed are dropped. Buffers the
 * application still holds stay valid until released (release zero-copy
 * buffers from a peer in another process first: after the destroy that
 * peer may reuse their memory). Any thread, once every other thread is
 * done with the engine (it must not be called while another thread uses
 * it); it waits for the reactor thread to end, so a binding releases its
 * interpreter lock around it. Engines do not survive fork(): a child process creates
 * its own. Returns 0 or -EINVAL for NULL.
 */
FERRY_API int ferry_engine_destroy(struct ferry_engine *e);

/* The engine's name (valid while the engine lives). Any thread. */
FERRY_API const char *ferry_engine_name(const struct ferry_engine *e);

/* The engine's namespace ("default" when none was given; valid while the engine lives). Any thread. */
FERRY_API const char *ferry_engine_ns(const struct ferry_engine *e);

/*
 * Drive progress (MANUAL mode): drain submission queues, run transports,
 * fire deadlines, post completions. Never blocks. Returns the number of
 * events handled (0 if there was nothing to do), -EINVAL, or -EPERM (a
 * FERRY_ENGINE_SINGLE_POLLER engine, called from a thread not its poller).
 * In THREAD mode it does nothing and returns 0. Safe from several threads:
 * only one makes progress at a time, the others return 0 at once (a
 * FERRY_ENGINE_SINGLE_POLLER engine: its poller only).
 */
FERRY_API int ferry_progress(struct ferry_engine *e);

/*
 * Make the calling thread e's poller if e is a FERRY_ENGINE_SINGLE_POLLER
 * engine without one yet, as its first ferry_cq_poll, ferry_cq_wait,
 * ferry_cq_arm or ferry_progress would. 0 when the calling thread may make
 * those calls (always, for an engine without the flag); -EPERM when
 * another thread is its poller (not logged); -EINVAL for NULL. For a
 * binding or a library that submits on the caller's behalf and then waits:
 * claim first, so that a refused wait never leaves an op in flight behind
 * it. Any thread.
 */
FERRY_API int ferry_engine_claim_poller(struct ferry_engine *e);

/*
 * Health and metrics as one JSON object (ops submitted/completed/failed,
 * timeouts, cancels, keys held, pool stats, per-peer puts/gets/bytes, a
 * latency histogram, and "security": peers that failed to prove the cluster
 * secret to this engine or refused its proof, "peers_refused", and callers
 * hung up on before they proved anything, "handshakes_dropped"). Writes at
 * most len bytes including the NUL and returns the length of the full document (like snprintf), so a return
 * value >= len means the text was cut. -EINVAL for NULL e or buf with len>0.
 * Any thread (it takes the engine's lock briefly: not a hot-path call).
 */
FERRY_API int ferry_engine_health(struct ferry_engine *e, char *buf, size_t len);

/* ------------------------------------------------------------------ */
/* Peers                                                               */
/* ------------------------------------------------------------------ */

/*
 * The handle of another engine by name in the same namespace (also used
 * for the "from" side of GETs). Opening the same name twice returns the
 * same handle. The peer need not exist yet: it is resolved when an op
 * needs it, and a PUT to a name nobody holds completes with -EHOSTUNREACH.
 * Handles live as long as the engine. Returns 0 and *out, or -EINVAL,
 * -ENAMETOOLONG, -ENOMEM. Any thread.
 */
FERRY_API int ferry_peer_open(struct ferry_engine *e, const char *name,
			      struct ferry_peer **out);

/* The name a peer handle was opened with. Any thread. */
FERRY_API const char *ferry_peer_name(const struct ferry_peer *p);

/*
 * Reach this peer over tcp at endpoint "tcp://HOST:PORT" (the address its
 * engine was created to listen on, e.g. as its ferry_engine_address
 * reported). A peer with an address always uses tcp, even on this host.
 * Set it before the first op to the peer. HOST may be a name: it is looked
 * up here, on the calling thread, never on the reactor. The connection is
 * made when the first PUT needs it, authenticated with the cluster secret
 * (see struct ferry_engine_params), and made again after the peer was lost.
 * Returns 0, -EINVAL (NULL, or not tcp://HOST:PORT; logged), -EACCES (a
 * non-loopback address while this engine has no secret; logged). Any
 * thread (a name lookup may block that thread).
 */
FERRY_API int ferry_peer_set_address(struct ferry_peer *p, const char *endpoint);

/*
 * The tcp endpoint this engine listens on, with the port the kernel chose
 * when params.listen asked for port 0: "tcp://HOST:PORT" into buf (at most
 * len bytes incl. the NUL). Returns the length of the full text (like
 * snprintf), -ENOTCONN if the engine listens on no tcp endpoint, -EINVAL.
 * Any thread.
 */
FERRY_API int ferry_engine_address(struct ferry_engine *e, char *buf, size_t len);

/*
 * The control channel endpoint this engine listens on (params.control),
 * with the port the kernel chose for port 0: "tcp://HOST:PORT" into buf.
 * Same contract as ferry_engine_address; -ENOTCONN when the engine has no
 * control endpoint, -EOPNOTSUPP when built without libzmq. Any thread.
 */
FERRY_API int ferry_engine_control_address(struct ferry_engine *e, char *buf, size_t len);

/*
 * Reach peer p through its control channel at endpoint "tcp://HOST:PORT"
 * (the params.control it was created with, e.g. as its
 * ferry_engine_control_address reported): the only address a user gives.
 * The engine connects in the background, both sides prove the cluster
 * secret (the HMAC challenge-response of the data path, see
 * docs/design.md §12) and exchange protocol version, capabilities, names
 * and their data addresses; PUTs to p wait for that handshake, then go
 * over tcp to the data address p published. The session is watched with
 * heartbeats (heartbeat_ms / peer_timeout_ms); a silent peer is declared
 * dead (its pending ops fail with -ECONNRESET) and is called again, so a
 * restarted peer is found at the same control address. HOST may be a
 * name, looked up here. Returns 0, -EINVAL (NULL, not tcp://HOST:PORT
 * with a port; logged), -EACCES (a non-loopback address and no secret;
 * logged), -EOPNOTSUPP (built without libzmq), -ENOMEM. Any thread (a
 * name lookup may block that thread; the connecting is the reactor's).
 */
FERRY_API int ferry_peer_connect(struct ferry_peer *p, const char *control_endpoint);

/*
 * The one way to give a peer an address, whatever the transport: uri is
 * "ferry://HOST:PORT" (its control endpoint, as ferry_peer_connect: the
 * only address a user need give), or a transport's own ("tcp://HOST:PORT":
 * its data address, as ferry_peer_set_address). Returns what that call
 * returns; -EPROTONOSUPPORT for a scheme no transport of this build takes
 * (logged); -EINVAL for NULL or no "scheme://". Any thread.
 */
FERRY_API int ferry_peer_connect_uri(struct ferry_peer *p, const char *uri);

/*
 * Every address this engine can be reached at, as URIs separated by one
 * space ("ferry://HOST:PORT tcp://HOST:PORT": what to hand a peer's
 * ferry_peer_connect_uri), into buf (at most len bytes incl. the NUL).
 * Returns the length of the full text (like snprintf; 0: it listens on
 * nothing), -EINVAL. Any thread.
 */
FERRY_API int ferry_engine_addresses(struct ferry_engine *e, char *buf, size_t len);

/*
 * The port of the upstream (vLLM-Omni) scheme, for deployments that keep
 * their fixed ports: base + purpose_offset + stage + 16 * rank. Use it to
 * build a listen endpoint; ferry itself needs no port arithmetic (listen on
 * port 0 and publish ferry_engine_address). Returns the port, or -ERANGE
 * when the sum is not a port (1..65535). Any thread (it computes only).
 */
FERRY_API int ferry_port_compat(uint32_t base, uint32_t purpose_offset, uint32_t stage,
				uint32_t rank);

/*
 * Credits of the streams this engine sends to peer p: at most per_stream
 * chunks of one stream, and per_peer chunks of all its streams together,
 * sent and not yet released by the consumer (0 keeps the current value;
 * defaults 16 and 1024). Applies to chunks sent from now on. Returns 0 or
 * -EINVAL. Any thread.
 */
FERRY_API int ferry_peer_set_stream_limits(struct ferry_peer *p, uint32_t per_stream,
					   uint32_t per_peer);

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

/*
 * Allocate a buffer of len bytes from the engine's registered pool (64 B
 * aligned; 4 KiB aligned above 2 KiB). PUTting a pool buffer moves it
 * without a copy and moves its ownership with it. Returns 0 and *out,
 * -EINVAL, or -ENOMEM when the pool is exhausted (never an abort). Any
 * thread.
 */
FERRY_API int ferry_buf_alloc(struct ferry_engine *e, size_t len, struct ferry_buf **out);

/*
 * Data and length of a buffer (NULL / 0 for a NULL buffer). Any thread
 * that holds the buffer.
 */
FERRY_API void *ferry_buf_data(const struct ferry_buf *b);
FERRY_API size_t ferry_buf_len(const struct ferry_buf *b);

/*
 * Set the length that a PUT of this buffer will send (at most its
 * capacity). Returns 0, -EINVAL, or -EMSGSIZE when len > capacity. The
 * thread that holds the buffer (not while another thread reads it).
 */
FERRY_API int ferry_buf_set_len(struct ferry_buf *b, size_t len);

/*
 * Give a buffer back to the pool it came from (from any thread, also one
 * that is not the engine's, even after
 * the engine that owns the pool was destroyed). Returns 0, or -EINVAL for
 * NULL or for a buffer that is not live (a double release: logged and
 * counted, never a crash).
 */
FERRY_API int ferry_buf_release(struct ferry_buf *b);

/*
 * One block, several owners: b (a buffer of this process's pools from
 * ferry_buf_alloc, not one a GET or stream handed over from a peer, and
 * not itself from a share) becomes n buffers out[0..n-1] naming the same
 * memory, with b's length; each is released (or PUT, which moves it) on
 * its own, and the block goes back to its pool when the last is released.
 * b is no longer the caller's. n == 0 releases b. Over shm every PUT of
 * one of them lends the same block, so n readers of one host read one
 * copy (the broadcast channel, api/ferry/channel.h, is built on it). The
 * memory is the same: write it before sharing. Returns 0; -EINVAL (NULL,
 * a buffer that is not live, a peer's buffer, or one already shared;
 * logged); -ENOMEM when the pool has not n buffer handles free (b is then
 * untouched). Any thread that holds b.
 */
FERRY_API int ferry_buf_share(struct ferry_buf *b, uint32_t n, struct ferry_buf **out);

/*
 * Memory types. Every buffer and every registered region has one. CUDA
 * device memory is the application's own, registered as a region
 * (mem FERRY_MEM_CUDA, device its ordinal, addr a device pointer of that
 * device: cudaMalloc'd, or managed memory); its segments go where an
 * iovec does in PUT, PUBLISH, GET and FETCH (not in streams:
 * -EOPNOTSUPP). ferry loads the CUDA runtime (libcudart) at run time, so
 * one build runs with and without a GPU: FERRY_FEATURE_CUDA is set when
 * it loaded and sees a device. Without it, registering device memory is
 * -ENODEV (logged, and the engine's health says why under "cuda"). ferry
 * allocates no device buffers (ferry_buf_alloc_params with FERRY_MEM_CUDA
 * is -EOPNOTSUPP); a GET with FERRY_SQE_DEVICE_BUF may hand out a sender's
 * device memory, which cannot be PUT on (-EOPNOTSUPP) nor shared. FERRY_CUDA_RUNTIME=<path> names the runtime library to
 * load, FERRY_CUDA_RUNTIME=none turns CUDA off.
 */
enum ferry_mem_type {
	FERRY_MEM_HOST = 0,
	FERRY_MEM_CUDA = 1, /* CUDA device memory (device = the CUDA device ordinal) */
};

struct ferry_buf_params {
	size_t size;               /* sizeof(struct ferry_buf_params) */
	size_t len;                /* bytes */
	enum ferry_mem_type mem;   /* where the buffer lives (FERRY_MEM_HOST) */
	int device;                /* FERRY_MEM_CUDA: which device */
	uint32_t flags;            /* 0 */
};
#define FERRY_BUF_PARAMS_INIT { .size = sizeof(struct ferry_buf_params) }

/*
 * ferry_buf_alloc with parameters that can grow (a memory type, for one).
 * Returns 0 and *out; -EINVAL (NULL, a bad size or flags); -EOPNOTSUPP for
 * a memory type this build cannot give; -ENOMEM when that memory is
 * exhausted. Any thread.
 */
FERRY_API int ferry_buf_alloc_params(struct ferry_engine *e, const struct ferry_buf_params *p,
				     struct ferry_buf **out);

/*
 * The memory type of a buffer (FERRY_MEM_HOST for a NULL one), and for a
 * device buffer (FERRY_SQE_DEVICE_BUF) the CUDA device ordinal its memory
 * is on in this process (-1 for host memory). Any thread.
 */
FERRY_API enum ferry_mem_type ferry_buf_mem(const struct ferry_buf *b);
FERRY_API int ferry_buf_device(const struct ferry_buf *b);

/*
 * A registered region: memory of the application (host memory now)
 * announced to the engine once, so that every transport that must know
 * memory beforehand (RDMA registers it, CUDA pins it) does so once, not per
 * transfer. Segments of regions stand where an iovec does
 * (ferry_prep_put_segs, ferry_prep_get_segs). The memory must stay valid
 * until ferry_region_release.
 */
struct ferry_region;

struct ferry_region_params {
	size_t size;               /* sizeof(struct ferry_region_params) */
	void *addr;                /* start of the memory */
	size_t len;                /* its bytes (> 0) */
	enum ferry_mem_type mem;   /* FERRY_MEM_HOST or FERRY_MEM_CUDA */
	int device;                /* FERRY_MEM_CUDA: which device */
};
#define FERRY_REGION_PARAMS_INIT { .size = sizeof(struct ferry_region_params) }

/*
 * Register a region. Returns 0 and *out; -EINVAL (NULL, an empty region;
 * device memory that the runtime does not know as memory of that device);
 * -ENODEV for CUDA device memory without a CUDA runtime or device;
 * -EOPNOTSUPP for a memory type this build cannot move; -ENOMEM; or the
 * error of a transport that could not register it (logged). Any thread.
 */
FERRY_API int ferry_region_register(struct ferry_engine *e, const struct ferry_region_params *p,
				    struct ferry_region **out);

/*
 * Release a region (*r is set to NULL). -EBUSY while an op that names one
 * of its segments is in flight (nothing is released then); -EINVAL for
 * NULL. Any thread; regions left at ferry_engine_destroy are released.
 */
FERRY_API int ferry_region_release(struct ferry_region **r);

/* A piece of a registered region: len bytes at offset. */
struct ferry_seg {
	struct ferry_region *region;
	uint64_t offset;
	uint64_t len;
};

/* ------------------------------------------------------------------ */
/* Completion queues                                                   */
/* ------------------------------------------------------------------ */

/* The CQE flags. */
#define FERRY_CQE_F_BUF (1u << 0)  /* cqe->buf holds a buffer the caller must release */
#define FERRY_CQE_F_MORE (1u << 1) /* more CQEs follow for this op (streams) */

struct ferry_cqe {
	uint64_t user_data; /* copied from the SQE */
	int32_t res;        /* >= 0 success (op-specific), < 0 negative errno */
	uint32_t flags;     /* FERRY_CQE_F_* */
	uint64_t len;       /* bytes moved (PUT: sent; GET: received) */
	struct ferry_buf *buf; /* GET without destination: the data, zero copy */
	uint8_t opcode;     /* the op this completes */
	uint8_t resv[7];
};

/*
 * A completion callback (ferry_sqe_set_callback). cqe is valid during the
 * call only (a buffer in it is the callback's to release). Where it runs:
 * see "Threads" above.
 */
typedef void ferry_complete_cb(const struct ferry_cqe *cqe, void *arg);

struct ferry_cq_params {
	size_t size;      /* sizeof(struct ferry_cq_params) */
	uint32_t entries; /* capacity, rounded up to a power of two (0 = 4096) */
	uint32_t flags;   /* none yet: must be 0 */
};

#define FERRY_CQ_PARAMS_INIT { .size = sizeof(struct ferry_cq_params) }

/*
 * Create an extra completion queue (the engine has a default one, see
 * ferry_cq_default). A full CQ never loses a completion: completions wait
 * inside the engine until there is room. Returns 0 and *out, -EINVAL,
 * -ENOMEM or the -errno of eventfd. Any thread.
 */
FERRY_API int ferry_cq_create(struct ferry_engine *e, const struct ferry_cq_params *p,
			      struct ferry_cq **out);

/*
 * Destroy a CQ created with ferry_cq_create. Refused with -EBUSY while an op
 * the reactor has taken still targets it or completions wait for room in
 * it. Entries submitted before this call that target it and were not yet
 * taken complete with -EINVAL on the default CQ; the memory is freed by the
 * reactor once no round can reach it. Submitting to a CQ after destroying
 * it is a use-after-free. The default CQ is destroyed with its engine.
 * Any thread, once no thread polls, waits or sleeps on the CQ; the
 * callbacks of completions left in it run in a later round of the engine
 * (see "Threads" above).
 */
FERRY_API int ferry_cq_destroy(struct ferry_cq *cq);

/* The engine's default completion queue. Any thread. */
FERRY_API struct ferry_cq *ferry_cq_default(struct ferry_engine *e);

/*
 * Take up to max completions without blocking. CQEs whose op carried a
 * callback are not returned: their callback runs here, on this thread.
 * Returns the number of CQEs written to cqes (0 if none), or -EINVAL.
 * In MANUAL mode it first drives progress. In THREAD mode a caller that
 * polls in a loop runs the rounds itself: after a round without work the
 * reactor thread parks under a lease each empty poll renews, and wakes
 * when the polls stop (within 200 us; health ops.poll_leases counts those
 * sleeps). Safe from several threads (a FERRY_ENGINE_SINGLE_POLLER engine's
 * CQs: its poller only; -EPERM from any other thread).
 */
FERRY_API int ferry_cq_poll(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max);

/*
 * Like ferry_cq_poll, but waits up to timeout_ns (< 0: forever) until at
 * least one completion was handled (returned or given to its callback).
 * Returns the number of CQEs written (0 when only callbacks ran), or
 * -ETIMEDOUT, -EINVAL, or -EINTR (woken by ferry_cq_wake). Any thread,
 * several at once (a FERRY_ENGINE_SINGLE_POLLER engine's CQs: its poller
 * only; -EPERM from any other thread), but not from a callback; it blocks:
 * a binding releases its interpreter lock around it.
 */
FERRY_API int ferry_cq_wait(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max,
			    int64_t timeout_ns);

/*
 * Wake every thread sleeping in ferry_cq_wait on cq: they return -EINTR. A
 * wake that finds no thread waiting is kept: the next ferry_cq_wait on cq
 * returns -EINTR at once. Safe from any thread (a signal handler excepted).
 */
FERRY_API int ferry_cq_wake(struct ferry_cq *cq);

/*
 * A file descriptor that becomes readable when the CQ has completions, for
 * epoll, libuv or asyncio. Protocol (as in UCX): poll the CQ until it is
 * empty, call ferry_cq_arm(); if it returns 0, sleep on the fd; if it
 * returns -EBUSY, completions arrived meanwhile: poll again. The fd is
 * owned by the CQ: do not close it. In MANUAL mode the fd is the engine's
 * io_uring fd and says "progress is needed" (a submission, a peer's data,
 * a deadline); the next ferry_cq_poll provides it. A wait on it may end
 * with EINTR: go round the loop. Sleeping on it while other threads drive
 * the same MANUAL engine is not supported: use THREAD mode for that.
 * ferry_cq_fd: any thread. ferry_cq_arm: the thread that polls the CQ and
 * then sleeps on the fd (the protocol is that thread's; on a
 * FERRY_ENGINE_SINGLE_POLLER engine -EPERM from any thread but its poller).
 */
FERRY_API int ferry_cq_fd(struct ferry_cq *cq);
FERRY_API int ferry_cq_arm(struct ferry_cq *cq);

/* ------------------------------------------------------------------ */
/* Submission                                                          */
/* ------------------------------------------------------------------ */

enum ferry_op {
	FERRY_OP_NOP = 0,
	FERRY_OP_PUT = 1,    /* send data under a key to a peer */
	FERRY_OP_GET = 2,    /* receive the data a peer put under a key */
	FERRY_OP_CANCEL = 3, /* cancel the op whose user_data is given */
	FERRY_OP_STREAM_PUT = 4,    /* send the next chunk of a stream */
	FERRY_OP_STREAM_GET = 5,    /* multishot: receive every chunk of a stream */
	FERRY_OP_STREAM_ABORT = 6,  /* producer gives up a stream, with a reason */
	FERRY_OP_STREAM_ACCEPT = 7, /* multishot: learn of new streams from a peer */
	FERRY_OP_CLEANUP = 8,       /* drop what this engine holds for one request */
	FERRY_OP_PEER_HEALTH = 9,   /* a peer's health JSON, over the control channel */
	FERRY_OP_LOOKUP = 10,       /* directory: does a peer hold a key published for us? */
	FERRY_OP_REMOTE_CANCEL = 11, /* a peer drops what it holds of one request from us */
	FERRY_OP_PUBLISH = 12,      /* keep data here under a key, for a peer to fetch */
	FERRY_OP_FETCH = 13,        /* get a key a peer keeps for us (asking the holder) */
	FERRY_OP__MAX
};

/*
 * SQE flags. Each op takes only those its comment names (and
 * FERRY_SQE_CB_REACTOR, which any op takes): an op with any other flag
 * completes with -EINVAL (a PUT of a pool buffer frees the buffer).
 */
#define FERRY_SQE_NOWAIT (1u << 0)    /* GET, FETCH: complete with -EAGAIN if the key is absent */
#define FERRY_SQE_REPLACE (1u << 1)   /* PUT, PUBLISH: replace a live key instead of -EEXIST */
#define FERRY_SQE_CB_REACTOR (1u << 2) /* run the callback on the reactor thread, no CQE */
#define FERRY_SQE_STREAM_END (1u << 3) /* STREAM_PUT: this is the stream's last chunk */
#define FERRY_SQE_STREAM_WHOLE (1u << 4) /* STREAM_GET: one CQE with the whole stream */
/* (1u << 5), (1u << 6): were FERRY_SQE_PUBLISH / FERRY_SQE_LOOKUP, now FERRY_OP_PUBLISH / _FETCH */
#define FERRY_SQE_SEGS (1u << 7)      /* PUT, GET, STREAM_PUT: iov is segments (the _segs preps) */
/*
 * PUT, STREAM_PUT: when the peer cannot be reached yet (no engine holds its
 * name, or its address refuses the call: the peer is not up), wait for it
 * instead of failing with -EHOSTUNREACH, and send once it can be reached
 * (stages start in any order). Give the op a deadline: it ends with
 * -ETIMEDOUT if the peer is not up by then (a CANCEL ends it too).
 */
#define FERRY_SQE_WAIT_PEER (1u << 8)
/*
 * GET without a destination (iov NULL): when the data is another process's
 * CUDA device memory (a PUT of device segments over shm, by CUDA IPC), hand
 * out that memory itself, opened here, instead of a copy in host memory: a
 * buffer of FERRY_MEM_CUDA (ferry_buf_mem, ferry_buf_device) whose
 * ferry_buf_data is a device pointer valid in this process, read in place
 * with no copy at all. The sender's PUT ends when the buffer is released
 * (ferry_buf_release, any thread): until then its memory is the reader's,
 * as long as this engine and its connection to the sender live (destroying
 * the engine, or losing the connection, ends the sender's PUT with
 * -ECONNRESET: release device buffers first). A PUT of several device
 * segments, one past the device buffers' share of the handle cache, and
 * data in host memory still come as a host buffer. Without the flag a GET
 * for a buffer always gets host memory; with a destination the flag is
 * -EINVAL.
 */
#define FERRY_SQE_DEVICE_BUF (1u << 9)
#define FERRY_SQE__ALL ((1u << 10) - 1)

/*
 * A submission entry. Fill it with the ferry_prep_* helpers; then set the
 * optional fields with ferry_sqe_set_*. The entry lives in the submission
 * ring: it is only valid between ferry_sq_get_sqe and ferry_sq_submit.
 */
struct ferry_sqe {
	uint8_t opcode;   /* enum ferry_op */
	uint8_t cuda_wait_kind; /* PUT of device memory: FERRY_CUDA_WAIT_* (ferry_sqe_set_cuda_wait) */
	uint16_t key_len; /* strlen(key) */
	uint32_t flags;   /* FERRY_SQE_* */
	uint64_t user_data;
	uint64_t timeout_ns;      /* relative deadline, 0 = none */
	struct ferry_peer *peer;  /* PUT: destination; GET: source */
	struct ferry_cq *cq;      /* target CQ, NULL = the engine's default */
	ferry_complete_cb *cb;    /* optional callback */
	void *cb_arg;
	const struct iovec *iov;  /* PUT: source / GET: destination (optional) */
	uint32_t iovcnt;
	uint32_t resv1;
	struct ferry_buf *buf;    /* PUT of a pool buffer (zero copy) */
	uint64_t cancel_user_data; /* CANCEL: whose op */
	const char *reason;       /* STREAM_ABORT: why (text, may be NULL) */
	uint64_t cuda_wait;       /* PUT of device memory: the cudaEvent_t / cudaStream_t to wait for */
	char key[FERRY_KEY_MAX];
};

/*
 * This thread's submission queue for engine e, created on first use (one
 * SPSC ring per thread per engine; no lock on the submit path). Returns 0
 * and *out, or -EINVAL, -ENOMEM, -ESHUTDOWN when the engine is being
 * destroyed. Any thread; the queue must then only be used from the
 * calling thread.
 */
FERRY_API int ferry_sq_get(struct ferry_engine *e, struct ferry_sq **out);

/*
 * Give this thread's queue back (e.g. before the thread exits): pending
 * entries are still executed, and the queue is reused by the next thread
 * that asks. Queues not given back are freed with the engine. The
 * queue's thread only.
 */
FERRY_API int ferry_sq_put(struct ferry_sq *sq);

/*
 * The next free entry of the ring, or NULL when it is full
 * (backpressure: submit, drive progress / poll completions, then retry).
 * The entry is zeroed except nothing: always fill it with a ferry_prep_*.
 * The queue's thread only.
 */
FERRY_API struct ferry_sqe *ferry_sq_get_sqe(struct ferry_sq *sq);

/*
 * Make every entry taken since the last submit visible to the reactor,
 * ringing its doorbell only if it said it sleeps. In THREAD mode, when the
 * reactor thread sleeps or yields its CPU, one round of the engine runs here
 * on the calling thread instead (it takes the entries, and may complete
 * ops; a FERRY_SQE_CB_REACTOR callback still runs only on the reactor
 * thread, which is then woken). Entries are checked when
 * the reactor takes them: a malformed entry completes with a negative errno
 * in its CQE (-EINVAL, -ENAMETOOLONG, ...), never silently. Returns the
 * number of entries submitted, or -EINVAL. The queue's thread only; it
 * never waits for the reactor.
 */
FERRY_API int ferry_sq_submit(struct ferry_sq *sq);

/* Entries the ring can still take. The queue's thread only. */
FERRY_API unsigned ferry_sq_space(const struct ferry_sq *sq);

static inline void ferry__sqe_init(struct ferry_sqe *sqe, uint8_t op, uint64_t user_data)
{
	/*
	 * Zeroed in two parts of at most 64 bytes: gcc stores those with
	 * vector moves, where one memset of the 104 bytes becomes `rep stosq`.
	 */
	memset(sqe, 0, 64);
	memset((char *)sqe + 64, 0, offsetof(struct ferry_sqe, key) - 64);
	sqe->key[0] = '\0';
	sqe->opcode = op;
	sqe->user_data = user_data;
}

/* Copy key into the entry; an oversized key is caught at submission. */
static inline void ferry__sqe_key(struct ferry_sqe *sqe, const char *key)
{
	size_t n = key ? strlen(key) : 0;

	if (n >= FERRY_KEY_MAX) {
		sqe->key_len = (uint16_t)(n > 0xffff ? 0xffff : n);
		sqe->key[0] = '\0';
		return;
	}
	memcpy(sqe->key, key ? key : "", n + 1);
	sqe->key_len = (uint16_t)n;
}

/*
 * A NOP: completes with res 0.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_nop(struct ferry_sqe *sqe, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_NOP, user_data);
}

/*
 * PUT of an iovec: the data is copied once when the op runs, into the pool
 * (or, for at most 256 bytes over shm and tcp, into the transport's
 * descriptor); iov and the memory it points to must stay valid until the CQE.
 * Completes with res 0 and len = bytes once the destination holds the key;
 * -EEXIST if the key is live there (unless FERRY_SQE_REPLACE), -ENOMEM if
 * the pool is exhausted, -ENOSPC if the destination's key table is full,
 * -EHOSTUNREACH if no engine holds the peer's name (or, on this host, the
 * engine holding it did not answer the connection within 2 s), -ECONNRESET
 * if the peer went away meanwhile, -ENOBUFS if too many earlier PUTs are
 * still away at peers that do not answer or if the destination's pool has no
 * room for a small (eager or inline) PUT. A PUT that times out or is
 * cancelled after its data left may still be delivered.
 *
 * 0-byte payloads are legal on every transport and path: an iovec of total
 * length 0 (iovcnt 0, or pieces of length 0), a 0-byte pool buffer
 * (ferry_buf_alloc(e, 0, &b)), an empty STREAM_PUT (an END-only chunk). The
 * key is stored with a 0-byte value; a zero-copy GET of it completes with
 * res 0, len 0 and a 0-byte buffer (cqe->buf set, FERRY_CQE_F_BUF: release
 * it); a GET into an iovec completes with res 0, len 0 and writes nothing
 * (any iovec fits, also one of total length 0; a longer payload into one of
 * length 0 is -EMSGSIZE, the key stays).
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_put(struct ferry_sqe *sqe, struct ferry_peer *to,
				  const char *key, const struct iovec *iov,
				  unsigned iovcnt, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_PUT, user_data);
	sqe->peer = to;
	sqe->iov = iov;
	sqe->iovcnt = iovcnt;
	ferry__sqe_key(sqe, key);
}

/*
 * PUT of a pool buffer: zero copy; ownership of buf moves to ferry at
 * submission (do not touch or release it afterwards, whatever the result).
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_put_buf(struct ferry_sqe *sqe, struct ferry_peer *to,
				      const char *key, struct ferry_buf *buf,
				      uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_PUT, user_data);
	sqe->peer = to;
	sqe->buf = buf;
	ferry__sqe_key(sqe, key);
}

/*
 * GET of key from a peer. With iov: the data is copied into it and the CQE
 * reports len. A payload longer than the iovec completes with -EMSGSIZE and
 * cqe->len set to the size needed; the data then stays under its key, so a
 * GET with a larger iovec (or none) can still take it. With iov NULL: the
 * CQE hands over cqe->buf (zero copy; FERRY_CQE_F_BUF set), which the
 * caller releases with ferry_buf_release. A GET consumes its key; before
 * the PUT arrives it waits until its deadline (-ETIMEDOUT), or with
 * FERRY_SQE_NOWAIT completes at once with -EAGAIN. Several GETs waiting on
 * one key are served in the order they were taken.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_get(struct ferry_sqe *sqe, struct ferry_peer *from,
				  const char *key, const struct iovec *iov,
				  unsigned iovcnt, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_GET, user_data);
	sqe->peer = from;
	sqe->iov = iov;
	sqe->iovcnt = iovcnt;
	ferry__sqe_key(sqe, key);
}

/*
 * PUT and GET with segments of registered regions where an iovec stands
 * (struct ferry_seg: region, offset, len): the same ops, the same results;
 * the segments (and their regions) must stay valid until the CQE, and a
 * region named by an op in flight is not released (-EBUSY). A segment
 * outside its region, or of a released or another engine's region, is
 * -EINVAL.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_put_segs(struct ferry_sqe *sqe, struct ferry_peer *to,
				      const char *key, const struct ferry_seg *segs, unsigned nsegs,
				      uint64_t user_data)
{
	ferry_prep_put(sqe, to, key, (const struct iovec *)(const void *)segs, nsegs, user_data);
	sqe->flags |= FERRY_SQE_SEGS;
}

/*
 * A PUT (or PUBLISH) of segments that hold CUDA device memory: ferry's own
 * CUDA stream copies them out, without the caller synchronizing anything,
 * and the PUT goes on when the copy is done; kind FERRY_CUDA_WAIT_EVENT
 * (handle: a cudaEvent_t) or FERRY_CUDA_WAIT_STREAM (a cudaStream_t) names
 * work of the caller's (the producer's compute) that must finish first:
 * ferry's copy waits for it on the GPU (cudaStreamWaitEvent), never on the
 * CPU. The event or stream must stay valid until the CQE. On a PUT of no
 * device memory it is -EINVAL. The queue's thread only (it writes the entry).
 */
#define FERRY_CUDA_WAIT_NONE 0
#define FERRY_CUDA_WAIT_EVENT 1
#define FERRY_CUDA_WAIT_STREAM 2
FERRY_INLINE void ferry_sqe_set_cuda_wait(struct ferry_sqe *sqe, int kind, void *handle)
{
	sqe->cuda_wait_kind = (uint8_t)kind;
	sqe->cuda_wait = (uint64_t)(uintptr_t)handle;
}

/* GET into segments (see ferry_prep_put_segs). The queue's thread only (it writes the entry). */
FERRY_INLINE void ferry_prep_get_segs(struct ferry_sqe *sqe, struct ferry_peer *from,
				      const char *key, const struct ferry_seg *segs, unsigned nsegs,
				      uint64_t user_data)
{
	ferry_prep_get(sqe, from, key, (const struct iovec *)(const void *)segs, nsegs, user_data);
	sqe->flags |= FERRY_SQE_SEGS;
}

/*
 * Cancel the op submitted with user_data target (on this engine). The
 * cancelled op completes with -ECANCELED; the CANCEL itself completes with
 * 0, or -ENOENT if no such op is pending (already completed, or unknown),
 * or -EALREADY if it completed and only waits for room in its CQ.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_cancel(struct ferry_sqe *sqe, uint64_t target,
				     uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_CANCEL, user_data);
	sqe->cancel_user_data = target;
}

/*
 * Free everything this engine holds for one request: data that arrived
 * under a key of the request and was never taken (its buffer goes back to
 * its pool, or to the peer that lent it), and GETs still waiting for such a
 * key (they complete with -ECANCELED). A key belongs to the request when it
 * equals request_id or starts with request_id followed by '_', ':', '/'
 * or '#' (upstream's chunk keys are "{request}_{stage}_{n}"). With from
 * set, only keys from that peer; NULL: from any peer. Completes with res =
 * the number of keys and GETs dropped (0 when there were none); -EINVAL
 * for an empty request_id, -ENAMETOOLONG for one of FERRY_KEY_MAX or more.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_cleanup(struct ferry_sqe *sqe, struct ferry_peer *from,
				      const char *request_id, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_CLEANUP, user_data);
	sqe->peer = from;
	ferry__sqe_key(sqe, request_id);
}

/* ------------------------------------------------------------------ */
/* The control channel: store-like keys, directory, remote ops          */
/* ------------------------------------------------------------------ */

/*
 * Store-like keys (upstream's MooncakeStore/Yuanrong contract).
 * FERRY_OP_PUBLISH does not send. It keeps the data at this engine under
 * "{key}@{me}_{to}" (in the pool, counted against max_keys like any key)
 * and completes with res 0 at once, or -EEXIST when that key is live here
 * (unless FERRY_SQE_REPLACE); when the peer `to` already waits for it (see
 * below), it is sent to it right away, in the background (a send that
 * fails, the peer being gone, drops it: logged). Flags: REPLACE, SEGS.
 * FERRY_OP_FETCH of key from peer `from` asks `from` over the control
 * channel (ferry_peer_connect, or a session `from` opened to us) to send
 * the key; the holder sends it over the data path and takes it out of its
 * store (a get consumes). It completes as a GET does (into an iovec or
 * zero copy). If the holder has not got it: with FERRY_SQE_NOWAIT it
 * completes with -EAGAIN (after the round trip); otherwise the holder
 * remembers the request until the op's timeout (at most 1 hour) and sends
 * the key the moment it is published: no polling. The fetching engine
 * must listen for data (params.listen, or params.control which implies
 * it): the holder sends there, and answers -EHOSTUNREACH otherwise.
 * Without a control session to `from` a FETCH completes with -ENOTCONN
 * (NOWAIT: -EAGAIN); while the session is being made it waits for it
 * (NOWAIT: -EAGAIN). FERRY_OP_CLEANUP frees published keys of the request
 * too. Needs libzmq (-EOPNOTSUPP otherwise). Flags: NOWAIT, SEGS.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_publish(struct ferry_sqe *sqe, struct ferry_peer *to,
				     const char *key, const struct iovec *iov, unsigned iovcnt,
				     uint64_t user_data)
{
	ferry_prep_put(sqe, to, key, iov, iovcnt, user_data);
	sqe->opcode = FERRY_OP_PUBLISH;
}

/*
 * PUBLISH of a pool buffer: kept as it is, ownership moves at submission.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_publish_buf(struct ferry_sqe *sqe, struct ferry_peer *to,
					 const char *key, struct ferry_buf *buf, uint64_t user_data)
{
	ferry_prep_put_buf(sqe, to, key, buf, user_data);
	sqe->opcode = FERRY_OP_PUBLISH;
}

/*
 * FETCH of key from a peer (see ferry_prep_publish). The queue's thread
 * only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_fetch(struct ferry_sqe *sqe, struct ferry_peer *from,
				   const char *key, const struct iovec *iov, unsigned iovcnt,
				   uint64_t user_data)
{
	ferry_prep_get(sqe, from, key, iov, iovcnt, user_data);
	sqe->opcode = FERRY_OP_FETCH;
}

/*
 * A peer's health JSON (what ferry_engine_health says there), asked over
 * the control channel. Completes with res = its length and cqe->buf the
 * text (NUL-terminated, FERRY_CQE_F_BUF: release it); -ENOTCONN without a
 * ready control session to the peer, -ECONNRESET if the peer died
 * meanwhile, -ETIMEDOUT at the op's deadline.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_peer_health(struct ferry_sqe *sqe, struct ferry_peer *peer,
					  uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_PEER_HEALTH, user_data);
	sqe->peer = peer;
}

/*
 * Directory query: where is key waiting at peer? Completes with res 1 when
 * the peer holds it published for this engine (a FERRY_OP_PUBLISH to us: a
 * FETCH would get it), 2 when our PUT of it arrived there and was not
 * taken yet, 0 when neither; len = its size. Nothing moves. Errors as for
 * ferry_prep_peer_health.
 *
 * peer NULL asks every peer with a control session at once (one whose
 * session is still shaking hands, after ferry_peer_connect, is asked once
 * it is ready; a peer that is down, its session waiting to call again, is
 * not), and answers multishot: one CQE per peer that holds the key, with
 * res 1 or 2 (as above), len = its size, cqe->buf the holder's name as
 * text (NUL-terminated, FERRY_CQE_F_BUF: release it) and FERRY_CQE_F_MORE;
 * then a last CQE, without MORE, res = how many hold it. Each peer is asked
 * once, whatever the number of its sessions; a peer whose session ends
 * before it answers is left out (logged). -ENOTCONN when there is no such
 * session; -ENOBUFS when too many requests wait for answers; -ETIMEDOUT at
 * the op's deadline (after the holders' CQEs that came before it).
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_lookup(struct ferry_sqe *sqe, struct ferry_peer *peer,
				     const char *key, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_LOOKUP, user_data);
	sqe->peer = peer;
	ferry__sqe_key(sqe, key);
}

/*
 * Remote cancellation: peer drops what it holds of request request_id
 * that came from this engine (data that arrived and was not taken, GETs
 * of it from us that wait: they complete with -ECANCELED there, keys it
 * published for us, and our LOOKUP requests it remembers), as
 * FERRY_OP_CLEANUP does locally. Completes with res = the number of
 * things dropped there; the errors of ferry_prep_peer_health.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_remote_cancel(struct ferry_sqe *sqe, struct ferry_peer *peer,
					    const char *request_id, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_REMOTE_CANCEL, user_data);
	sqe->peer = peer;
	ferry__sqe_key(sqe, request_id);
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

/*
 * A stream is an ordered run of chunks under one stream key, from this
 * engine to a peer. Chunk n travels under the key "{stream}_{n}" (n from 0):
 * with stream = "{request}_{stage}" that is the upstream chunk key
 * "{request}_{stage}_{n}", so a plain GET of one chunk works too. A stream
 * opens with its first STREAM_PUT and ends with the chunk flagged
 * FERRY_SQE_STREAM_END (which may be empty), or an abort. The same key may
 * start a new stream once the consumer released every chunk of the old one
 * (before that a STREAM_PUT under it gets -EPIPE): use a key per request.
 * Stream keys are at most FERRY_STREAM_KEY_MAX bytes.
 *
 * Flow control (credits): at most max_inflight chunks of a stream (and
 * max_inflight_peer chunks of all streams to one peer) are sent and not yet
 * released by the consumer, see ferry_peer_set_stream_limits. Past that a
 * STREAM_PUT waits in the engine, its data not yet copied, and is sent once
 * the consumer releases a chunk: memory stays bounded however slow the
 * consumer is. A chunk is released when the consumer releases the buffer
 * its STREAM_GET CQE handed over (or, for a chunk taken by a plain GET,
 * when the GET takes it).
 */
#define FERRY_STREAM_KEY_MAX (FERRY_KEY_MAX - 12)

/*
 * STREAM_PUT of an iovec (copied once into the pool when the chunk is
 * sent; iov and its memory must stay valid until the CQE). Set
 * FERRY_SQE_STREAM_END on the last chunk. Completes with res = the chunk's
 * index and len = its bytes once the peer holds it; -EPIPE for a chunk
 * after the END; -ECONNRESET (or -EHOSTUNREACH, -EPIPE) if the peer went
 * away; the errors of a PUT otherwise (-ENOMEM when the pool has no room
 * for the copy). A deadline counts the wait for credit too.
 *
 * A stream that failed stays failed: when the peer went away, or a
 * STREAM_PUT ended before it was given an index (its copy failed, or its
 * deadline or a CANCEL came while it waited for credit), every later
 * STREAM_PUT of the stream fails at once with that error, also once the
 * peer is back (a new engine of its name). So no consumer ever gets the
 * rest of a stream renumbered from chunk 0, or a chunk under the index of
 * one that never left. ferry_prep_stream_abort still tells a consumer that
 * is there (it completes with the stream's error, unsent, when the
 * consumer went away); FERRY_OP_CLEANUP of its request (on this engine)
 * ends the stream, and the key may then start a new one. Until then the
 * failed stream holds its slot in the stream table (max_keys streams). A
 * chunk that was sent and then failed or timed out keeps its index: the
 * stream goes on (the consumer waits for that chunk until its gap
 * deadline).
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_stream_put(struct ferry_sqe *sqe, struct ferry_peer *to,
					 const char *stream, const struct iovec *iov,
					 unsigned iovcnt, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_STREAM_PUT, user_data);
	sqe->peer = to;
	sqe->iov = iov;
	sqe->iovcnt = iovcnt;
	ferry__sqe_key(sqe, stream);
}

/*
 * STREAM_PUT from segments of registered regions (as ferry_prep_put_segs).
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_stream_put_segs(struct ferry_sqe *sqe, struct ferry_peer *to,
					     const char *stream, const struct ferry_seg *segs,
					     unsigned nsegs, uint64_t user_data)
{
	ferry_prep_stream_put(sqe, to, stream, (const struct iovec *)(const void *)segs, nsegs,
			      user_data);
	sqe->flags |= FERRY_SQE_SEGS;
}

/*
 * STREAM_PUT of a pool buffer: zero copy, ownership moves at submission.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_stream_put_buf(struct ferry_sqe *sqe, struct ferry_peer *to,
					     const char *stream, struct ferry_buf *buf,
					     uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_STREAM_PUT, user_data);
	sqe->peer = to;
	sqe->buf = buf;
	ferry__sqe_key(sqe, stream);
}

/*
 * STREAM_GET, multishot: one SQE, one CQE per chunk, in order. Each chunk
 * CQE has res = the chunk's index, len = its bytes, cqe->buf = the chunk
 * (zero copy, FERRY_CQE_F_BUF; release it to return its credit) and
 * FERRY_CQE_F_MORE set, except on the last CQE of the op. The last CQE is
 * the END chunk, or an error: -ETIMEDOUT when the op's timeout passes
 * between two chunks (the timeout is a gap, re-armed at every chunk),
 * -ECANCELED when the producer aborted (cqe->buf then holds its reason as
 * text, which the caller releases), -ECONNRESET when the producer died,
 * -ECANCELED after a CANCEL. Chunks taken before a failure stay valid.
 * With FERRY_SQE_STREAM_WHOLE: one CQE at the END with the whole stream in
 * one contiguous buffer, res = the number of chunks (window_size -1).
 * One STREAM_GET per stream at a time (-EBUSY otherwise). While one reads
 * a stream it takes each chunk as it arrives: a plain GET of a chunk key is
 * for streams nobody reads with a STREAM_GET.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_stream_get(struct ferry_sqe *sqe, struct ferry_peer *from,
					 const char *stream, uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_STREAM_GET, user_data);
	sqe->peer = from;
	ferry__sqe_key(sqe, stream);
}

/*
 * Abort a stream this engine produces: chunks still waiting for credit
 * complete with -ECANCELED, and the consumer's STREAM_GET completes with
 * -ECANCELED and the reason (copied; at most 1 KiB is kept). Completes
 * with 0 once the peer knows; -EPIPE when the stream's END already left
 * (nothing is sent). An abort before the first chunk tells the consumer
 * too (it arrives as chunk 0); so does one of a stream that ended and was
 * fully released long ago, which then poisons that key: keys are per
 * request.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_stream_abort(struct ferry_sqe *sqe, struct ferry_peer *to,
					   const char *stream, const char *reason,
					   uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_STREAM_ABORT, user_data);
	sqe->peer = to;
	sqe->reason = reason;
	ferry__sqe_key(sqe, stream);
}

/*
 * STREAM_ACCEPT, multishot: one CQE (FERRY_CQE_F_MORE) for every new stream
 * whose first chunk arrives from peer `from` (NULL: from any peer), so a
 * scheduler learns of new requests without polling. cqe->buf holds the
 * stream key as text (NUL-terminated, len bytes without the NUL); release
 * it. The op lasts until cancelled (-ECANCELED) or the engine goes.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_prep_stream_accept(struct ferry_sqe *sqe, struct ferry_peer *from,
					    uint64_t user_data)
{
	ferry__sqe_init(sqe, FERRY_OP_STREAM_ACCEPT, user_data);
	sqe->peer = from;
}

/*
 * FERRY_SQE_* flags of the entry (each op takes those its comment names).
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_sqe_set_flags(struct ferry_sqe *sqe, uint32_t flags)
{
	sqe->flags |= flags;
}

/*
 * Relative deadline: the op completes with -ETIMEDOUT if not done by then.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_sqe_set_timeout(struct ferry_sqe *sqe, uint64_t timeout_ns)
{
	sqe->timeout_ns = timeout_ns;
}

/*
 * Run cb(cqe, arg) on completion instead of returning the CQE from
 * ferry_cq_poll/wait; it runs inside poll/wait of the target CQ, on the
 * polling thread (or on the reactor with FERRY_SQE_CB_REACTOR; every place
 * a callback can run is under "Threads" above). The queue's thread only
 * (it writes the entry).
 */
FERRY_INLINE void ferry_sqe_set_callback(struct ferry_sqe *sqe, ferry_complete_cb *cb,
					  void *arg)
{
	sqe->cb = cb;
	sqe->cb_arg = arg;
}

/*
 * Post the completion to cq instead of the engine's default CQ.
 * The queue's thread only (it writes the entry).
 */
FERRY_INLINE void ferry_sqe_set_cq(struct ferry_sqe *sqe, struct ferry_cq *cq)
{
	sqe->cq = cq;
}

#ifdef __cplusplus
}
#endif
#endif
