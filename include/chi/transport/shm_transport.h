// The shared-memory transport, both ends: ShmServer (the runtime's poller and process
// reaper) and ShmClientTransport (a pure client's connection), which
// ShmReconnectingTransport replaces when the runtime restarts. The fastest way between
// a client and a runtime on the same node; each client owns its slot of the runtime's
// segment, so a client that dies or misbehaves can only wedge (and lose) its own slot.
#pragma once

#include "chi/transport/shm_client.h"     // ShmClientTransport
#include "chi/transport/shm_reconnect.h"  // ShmReconnectingTransport: rejoins a restart
#include "chi/transport/shm_server.h"     // ShmServer, ShmServerInfo
