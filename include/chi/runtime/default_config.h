// The default runtime configuration, config/chimaera_default.yaml, embedded as
// a constant so the header-only library never needs the file at run time.
// LoadServerConfig parses it exactly like a user's file. Invariant: the raw
// string equals the YAML file byte for byte (checked by tests/test_config.cc).
#pragma once

namespace chi {

/** Text of config/chimaera_default.yaml (edit the YAML file, then paste it here). */
inline constexpr char kDefaultConfigYaml[] = R"CHI_YAML(# chi: the default runtime configuration.
# Every runtime starts from these values. A runtime reads the file named by
# CHI_SERVER_CONF instead; any key left out there keeps the value below.
# Unknown keys and bad values are errors.
# This file is embedded byte for byte in include/chi/runtime/default_config.h;
# tests/test_config.cc fails when the two differ.
# Sizes are a byte count or a number with a k, m or g suffix (powers of 1024).

# Worker threads of the runtime.
workers:
  # Threads that run low-latency lanes (client submissions); at least 1.
  low_latency: 1
  # Threads that run high-latency (long-running) lanes; may be 0.
  # low_latency + high_latency is at most 256.
  high_latency: 1

# Task slots per queue lane, 2 .. 1048576; rounded up to a power of two.
queue_depth: 1024

# Lanes each worker polls, 1 .. 64.
lanes_per_worker: 1

# Stack size of each task fiber, 16k .. 16m.
fiber_stack_size: 64k

networking:
  # TCP port of the runtime's ZeroMQ server, 1 .. 65535.
  # The environment variable CHI_PORT overrides it.
  port: 9413
  # File listing the nodes, one host per line; blank lines and '#' comments
  # are skipped and ranges such as node[01-04] are expanded.
  # Empty: a single node.
  hostfile: ""
  # How a pure client reaches the runtime on its node: shm, ipc or tcp.
  # The environment variable CHI_IPC_MODE overrides it.
  ipc_mode: shm
  # Seconds a pure client waits for its first connection to the runtime,
  # 0 .. 86400 (decimals allowed). CHI_CONNECT_TIMEOUT overrides it.
  connect_timeout_s: 5
  # Seconds tasks of a pure client wait for a runtime that went away to come
  # back (every transport reconnects), 0 .. 86400. CHI_RECONNECT_TIMEOUT
  # overrides it.
  reconnect_timeout_s: 10
  # Seconds tasks of a pure client wait on a runtime that is alive but shows
  # no sign of life (stopped with SIGSTOP, or hung): its shm poller's heartbeat
  # (stored at least every 20 ms while it serves) or its ZeroMQ heartbeats.
  # They then fail with kPeerDead, and the client reconnects as after a loss.
  # 0 = wait forever, 0 .. 86400. CHI_HANG_TIMEOUT overrides it.
  hang_timeout_s: 10
  # Microseconds a client's ZeroMQ network thread keeps polling after activity
  # before it sleeps, 0 .. 1000000. CHI_ZMQ_SPIN_US overrides it.
  zmq_spin_us: 20
  # Microseconds the runtime's ZeroMQ network worker keeps polling its sockets
  # after its last request before it sleeps in poll(), 0 .. 1000000. Each poll
  # is a system call, and a client's next request rarely comes that soon: on
  # 2 cores, 20 us of polling made ipc/tcp round trips about 15% slower.
  zmq_worker_spin_us: 0

# The persistent GPU orchestrator kernel (used only in GPU builds).
gpu:
  # Thread blocks of the orchestrator kernel, 1 .. 65535.
  blocks: 1
  # Threads per block, 1 .. 1024.
  threads_per_block: 32
  # Task slots of each CPU-GPU queue, 1 .. 1048576.
  queue_depth: 256

# Shared-memory segments of a standalone runtime, each 64k .. 1024g. /dev/shm
# must have main_size + client_data_size + runtime_data_size free when the
# runtime starts, or it refuses to (tmpfs takes a page when a message first
# writes it; a page that does not fit would kill that process with SIGBUS).
shm:
  # Client processes served over shm at once, 1 .. 1024 (one slot each; a
  # client finding every slot taken fails to connect, saying so). The sizes
  # below are split over the slots: with more slots, raise them too.
  client_slots: 32
  # Tasks shared by clients and the runtime: the runtime's owner record, and
  # (split over the client slots) the rings that carry requests and answers.
  main_size: 64m
  # Large requests of shm clients travel whole in this segment (an equal share
  # per client slot). It also bounds one message on every transport.
  client_data_size: 256m
  # Large answers to shm clients travel whole in this segment (a share per slot).
  # A message larger than a slot's share streams through the rings in pieces.
  runtime_data_size: 256m

# Memory every process (runtime and clients) keeps between large messages,
# each 0 .. 1024g. Resident memory is reused without page faults; 0 gives
# every freed buffer's pages back to the kernel at once.
memory:
  # Emptied buffers of messages past a data region's share (assembled or
  # encoded in pieces): 128m keeps the two buffers of a 64 MiB message.
  warm_message_bytes: 128m
  # Freed task payload blocks of 128 KiB and more (at most 64 blocks are kept).
  warm_payload_bytes: 64m

# Bounds on what requests may cost the runtime. Every byte a client sends is
# untrusted: these keep one request from taking unbounded memory or time.
limits:
  # Largest output a task may produce for its caller, 4k .. 1t. Handlers that
  # allocate output on request refuse more with kTooLarge, and an answer to a
  # caller in another process that takes more than this (plus 1k for its
  # headers) is replaced by a kTooLarge error. Such a caller decodes at most
  # 1g per buffer, and one message is at most shm.client_data_size.
  max_output_size: 1g
  # How deeply subtasks may nest, 1 .. 65536. A task an application or a
  # client submits is at depth 0, a subtask one deeper than the task that
  # submits it (a broadcast's replicas stay at their task's depth). A subtask
  # past the bound fails at once with kTooDeep. Each level that waits holds a
  # suspended fiber: 256 levels of 64k stacks take 16m.
  max_subtask_depth: 256
  # Largest hostfile, 1 .. 64m: as written, and as it would be written with
  # every range expanded, one host per line.
  max_hostfile_size: 1m
  # Most hosts a hostfile may name once its ranges are expanded, 1 .. 1048576.
  max_hosts: 65536

# Pools created at start, in this order, after the admin pool. Each entry:
#   mod_name:       module that implements the pool (required)
#   pool_name:      unique name of the pool (required)
#   pool_id:        unique "major.minor" id; not 0.0, not the admin pool 1.0
#   pool_query:     where the pool is created (default local), e.g. local,
#                   dynamic, broadcast, direct_id:0, range:0:4, physical:1
#   num_containers: containers of the pool (default 1)
# Example:
# compose:
#   - mod_name: chimaera_demo
#     pool_name: demo_pool
#     pool_id: "200.0"
#     pool_query: local
#     num_containers: 1
compose: []
)CHI_YAML";

}  // namespace chi
