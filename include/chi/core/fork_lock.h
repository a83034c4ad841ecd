// A process-wide mutex held across fork. A child forked while another thread held such a
// lock would start with it locked forever (only the forking thread lives on in the child).
// Holding it in the prepare handler means no other thread is inside the lock while the
// child is made; parent and child each release it after.
#pragma once

#include <pthread.h>  // pthread_atfork

#include <mutex>  // std::mutex

namespace chi {

/**
 * Registers fork handlers that hold the mutex `Lock()` returns across every later fork.
 * Call once per mutex, when the object that owns it is made; the mutex must live as long
 * as the process (fork handlers cannot be removed). Make that object during static
 * initialization, before any thread runs: a fork while another thread is still making it
 * leaves the child waiting forever on the function-local static's construction guard.
 */
template <std::mutex &(*Lock)()>
void HoldAcrossFork() {
  pthread_atfork([] { Lock().lock(); }, [] { Lock().unlock(); }, [] { Lock().unlock(); });
}

}  // namespace chi
