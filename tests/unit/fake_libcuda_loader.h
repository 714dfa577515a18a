// Loading the stand-in CUDA driver (fake_libcuda*.c) whose path meson puts
// in FAKE_LIBCUDA, for the tests that run braid's GPU code against it.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>

namespace braid::testing {

// The stand-in, loaded globally so that braid's look for a loaded
// libcuda.so.1 finds it; null when FAKE_LIBCUDA is unset or not loadable.
inline void* openFakeLibcuda() {
  const char* path = std::getenv("FAKE_LIBCUDA");
  return path == nullptr ? nullptr : dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

// Points `entry` at the stand-in's `name`; false when it has none.
template <typename F>
bool findEntry(void* fake, F& entry, const char* name) {
  entry = reinterpret_cast<std::remove_reference_t<F>>(dlsym(fake, name));
  return entry != nullptr;
}

}  // namespace braid::testing
