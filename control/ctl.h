/*
 * control/ctl.h - the control channel as the registry sees it (private).
 *
 * Owns: the channel's ops table (the engine finds it in engine/registry.c)
 * and its directory service (engine/directory.h), which ctl_req.c
 * implements and ctl.c registers at its start. The channel reaches the
 * data path only through engine-wide peer events (engine/transport.h).
 * Built without libzmq, the table is a stub and no service is registered
 * (PUBLISH, LOOKUP and the remote ops then complete with -EOPNOTSUPP).
 */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

#include "internal.h"

/* The control channel as a transport: it carries PUTs only until a peer's handshake is done. */
extern const struct backend_ops ferry__ctl_backend;

#endif
