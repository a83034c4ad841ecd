// ModuleManager: the table of modules this process can instantiate, by name.
// A module's _runtime.h registers itself through an inline variable, so merely
// including it in one translation unit makes the module known (header-only).
#pragma once

#include <mutex>        // registration is rare and may race at static-init time
#include <string>       // names
#include <string_view>  // lookups
#include <unordered_map>  // name -> factory
#include <vector>       // Names()

#include "chi/core/fork_lock.h"     // HoldAcrossFork for the table's lock
#include "chi/module/container.h"  // Container

namespace chi {

/** Makes a fresh, uninitialised container of one module. */
using ContainerFactory = Container *(*)();

/** Process-wide registry of module factories (one instance per process). */
class ModuleManager {
 public:
  /** The process's registry. */
  static ModuleManager &Get() {
    static ModuleManager instance;
    return instance;
  }

  /** Records `factory` under `name`; a second registration of the same name is ignored. */
  bool Register(std::string_view name, ContainerFactory factory) {
    std::lock_guard<std::mutex> g(mu_);
    return factories_.emplace(std::string(name), factory).second;
  }

  /** Registers RuntimeT (a Container subclass) under `name`. */
  template <typename RuntimeT>
  static bool Register(std::string_view name) {
    return Get().Register(name, []() -> Container * { return new RuntimeT(); });
  }

  /**
   * Forgets module `name` (false when it was not registered): a program that links a
   * module's runtime but must not serve it (the standalone runtime and its test module).
   */
  bool Remove(std::string_view name) {
    std::lock_guard<std::mutex> g(mu_);
    return factories_.erase(std::string(name)) != 0;
  }

  /** The factory for `name`, or nullptr when no such module was registered. */
  ContainerFactory Find(std::string_view name) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = factories_.find(std::string(name));
    return it == factories_.end() ? nullptr : it->second;
  }

  /** Every registered module name (for error messages and the CLI). */
  std::vector<std::string> Names() const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::string> out;
    for (const auto &kv : factories_) out.push_back(kv.first);
    return out;
  }

 private:
  ModuleManager() = default;
  /** The table's lock, for HoldAcrossFork. */
  static std::mutex &Lock() { return Get().mu_; }

  mutable std::mutex mu_;
  std::unordered_map<std::string, ContainerFactory> factories_;
  /**
   * A child forked while another thread used the table can still use it. Made with the
   * table, before main: modules register from their headers' inline variables.
   */
  static inline const bool held_across_fork_ = (HoldAcrossFork<&Lock>(), true);
};

}  // namespace chi
