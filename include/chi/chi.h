// chi: everything an application includes. Start an embedded runtime with
// chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true), then create pools and
// submit tasks through module clients (#include <chi/mods/<name>/<name>_client.h>).
// The hot path, in include order: task/future.h (submit, wait) ->
// runtime/work_orchestrator.h (lanes) -> runtime/worker.h (route, run, complete, wake).
#pragma once

#include "chi/core/macros.h"      // CHI_CROSS_FUN, CHI_IS_GPU
#include "chi/core/types.h"       // u8..u64
#include "chi/core/atomic.h"      // chi::Atomic: host/device scoped atomics
#include "chi/core/status.h"      // chi::Status, chi::ErrorCode, chi::Error
#include "chi/core/bitfield.h"    // chi::BitField flags
#include "chi/core/ids.h"         // PoolId, TaskNode, ContainerId, ...
#include "chi/core/pool_query.h"  // chi::PoolQuery routing
#include "chi/core/fixed_string.h"  // names inside tasks
#include "chi/memory/shm_ptr.h"   // ShmPtr/FullPtr offset pointers
#include "chi/queue/spsc_ring.h"  // SpscRing
#include "chi/queue/mpsc_ring.h"  // MpscRing
#include "chi/queue/task_queue.h" // TaskQueue lanes x priorities
#include "chi/serialize/archive.h"  // OutputArchive/InputArchive, batches
#include "chi/task/task.h"        // chi::Task

#if !CHI_IS_GPU && !CHI_GPU_CUDA && !CHI_GPU_HIP
#include "chi/memory/posix_shm_backend.h"    // POSIX shared memory segments
#include "chi/memory/malloc_backend.h"       // private memory backend
#include "chi/memory/arena_allocator.h"      // bump allocator in a segment
#include "chi/memory/size_class_allocator.h" // general allocator with free
#include "chi/transport/copy_space.h"        // streaming byte ring
#include "chi/task/future.h"                 // chi::Future
#include "chi/runtime/chimaera.h"            // CHIMAERA_INIT / CHIMAERA_FINALIZE
#include "chi/runtime/hostfile.h"            // ParseHostfile: a multi-node runtime's nodes
#include "chi/runtime/co_mutex.h"            // CoMutex
#include "chi/runtime/co_rw_lock.h"          // CoRwLock
#include "chi/mods/admin/admin_client.h"     // chimaera::admin::Client
#endif
