#include "report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace trainer {
namespace {

constexpr int kBarWidth = 30;
constexpr double kRedrawSeconds = 0.1;

bool onPath(const char* program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    std::string dir =
        dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return false;
}

// gnuplot reads strings in single quotes literally, except for '' as a quote.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

Progress::Progress(bool enabled, bool terminal, int64_t epoch, int64_t epochs, int64_t steps)
    : enabled_(enabled), terminal_(terminal), epoch_(epoch), epochs_(epochs), steps_(steps) {}

void Progress::update(int64_t step, double samples, double loss, double seconds) {
  if (!enabled_ || steps_ <= 0) return;
  const double fraction = double(step) / double(steps_);
  const double rate = seconds > 0 ? samples / seconds : 0;
  if (terminal_) {
    if (step < steps_ && seconds - lastDraw_ < kRedrawSeconds) return;
    lastDraw_ = seconds;
    const int filled = int(fraction * kBarWidth);
    std::string bar(size_t(filled), '=');
    if (filled < kBarWidth) bar += '>';
    bar.resize(kBarWidth, ' ');
    char line[256];
    int width = std::snprintf(
        line, sizeof(line), "epoch %lld/%lld [%s] %3d%%  %8.0f samples/s  loss %.4f",
        (long long)epoch_, (long long)epochs_, bar.c_str(), int(fraction * 100), rate, loss);
    std::printf("\r%s", line);
    if (size_t(width) < lastWidth_) std::printf("%*s", int(lastWidth_ - size_t(width)), "");
    lastWidth_ = size_t(width);
    std::fflush(stdout);
    return;
  }
  if (nextQuarter_ <= 3 && fraction * 4 >= nextQuarter_) {
    while (nextQuarter_ <= 3 && fraction * 4 >= nextQuarter_) ++nextQuarter_;
    std::printf("epoch %lld/%lld %3d%% (%lld/%lld steps)  %.0f samples/s  loss %.4f\n",
                (long long)epoch_, (long long)epochs_, int(fraction * 100), (long long)step,
                (long long)steps_, rate, loss);
    std::fflush(stdout);
  }
}

void Progress::done() {
  if (!enabled_ || !terminal_ || lastWidth_ == 0) return;
  std::printf("\r%*s\r", int(lastWidth_), "");
  std::fflush(stdout);
}

void writeCsv(const std::string& path, const std::vector<EpochRecord>& history) {
  std::string text =
      "epoch,train_loss,train_accuracy,test_loss,test_accuracy,epoch_seconds,compute_seconds,"
      "communication_seconds,samples_per_second\n";
  for (const EpochRecord& r : history) {
    char row[512];
    std::snprintf(row, sizeof(row), "%lld,%.6f,%.6f,%.6f,%.6f,%.4f,%.4f,%.4f,%.1f\n",
                  (long long)r.epoch, r.trainLoss, r.trainAccuracy, r.testLoss, r.testAccuracy,
                  r.seconds, r.computeSeconds, r.communicationSeconds, r.samplesPerSecond);
    text += row;
  }
  writeFileAtomically(path, text);
}

std::string plotCurves(const std::string& pngPath, const std::vector<EpochRecord>& history) {
  if (!onPath("gnuplot")) return "gnuplot is not installed (apt-get install gnuplot-nox)";
  if (history.empty()) return "";
  // Inline data ('$data << EOD') keeps the script self-contained.
  std::string script = "set terminal pngcairo size 1000,420 font ',10'\n";
  script += "set output " + quoted(pngPath) + "\n";
  script += "$data << EOD\n";
  for (const EpochRecord& r : history) {
    char row[256];
    std::snprintf(row, sizeof(row), "%lld %.6f %.6f %.6f %.6f\n", (long long)r.epoch, r.trainLoss,
                  r.testLoss, 100 * r.trainAccuracy, 100 * r.testAccuracy);
    script += row;
  }
  script +=
      "EOD\n"
      "set multiplot layout 1,2 title 'braid-train'\n"
      "set grid\nset xlabel 'epoch'\nset key top right\n"
      "set title 'loss'\n"
      "plot $data using 1:2 with linespoints title 'train', "
      "$data using 1:3 with linespoints title 'test'\n"
      "set title 'accuracy (%)'\nset key bottom right\n"
      "plot $data using 1:4 with linespoints title 'train', "
      "$data using 1:5 with linespoints title 'test'\n"
      "unset multiplot\n";
  FILE* pipe = ::popen("gnuplot 2>&1", "w");
  if (pipe == nullptr) return std::string("cannot start gnuplot: ") + std::strerror(errno);
  std::fwrite(script.data(), 1, script.size(), pipe);
  int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "gnuplot failed to write " + pngPath;
  return "";
}

}  // namespace trainer
