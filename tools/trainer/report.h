// What rank 0 shows and writes: the progress of an epoch, the CSV log and
// the PNG of the curves.
#ifndef BRAID_TOOLS_TRAINER_REPORT_H_
#define BRAID_TOOLS_TRAINER_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint.h"

namespace trainer {

// On a terminal, one line redrawn with '\r'; otherwise (a pipe, a file,
// braidrun's line-by-line relay) a line at each quarter of the epoch.
class Progress {
 public:
  Progress(bool enabled, bool terminal, int64_t epoch, int64_t epochs, int64_t steps);
  // After `step` of the epoch's steps; loss is the running mean loss.
  void update(int64_t step, double samples, double loss, double seconds);
  // Clears the redrawn line so that the epoch summary takes its place.
  void done();

 private:
  bool enabled_;
  bool terminal_;
  int64_t epoch_;
  int64_t epochs_;
  int64_t steps_;
  int nextQuarter_ = 1;
  double lastDraw_ = -1;
  size_t lastWidth_ = 0;
};

// Rewrites `path` with one row per epoch.
void writeCsv(const std::string& path, const std::vector<EpochRecord>& history);

// Draws loss and accuracy per epoch into a PNG with gnuplot. Returns "" or
// the reason it could not.
std::string plotCurves(const std::string& pngPath, const std::vector<EpochRecord>& history);

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_REPORT_H_
