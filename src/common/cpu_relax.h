// A spin-wait pause: tells the core a thread is busy-polling, so a
// hyperthread sibling runs and the loop leaves the memory bus alone.
#pragma once

namespace braid {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace braid
