// The element counts the reduction tests run at, shared by the test files of one executable.
#pragma once

#include <cstddef>

namespace braid {

// Around and between the 256-element fp16/bf16 staging blocks and the vector
// widths, so every prologue/epilogue path runs.
inline constexpr size_t kCounts[] = {1, 2, 3, 7, 15, 16, 17, 255, 256, 257, 511, 1000};

}  // namespace braid
