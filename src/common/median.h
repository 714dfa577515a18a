// The median of a sample: what the link probe and the online tuner take of
// repeated timings, so that one disturbed timing does not set the figure.
#pragma once

#include <algorithm>
#include <vector>

namespace braid {

// The middle value, or the mean of the two middle ones; `values` must not
// be empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

}  // namespace braid
