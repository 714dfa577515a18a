#include "dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace trainer {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension

const char* const kInstallHint =
    "install the data set with `apt-get install dataset-fashion-mnist`, or pass --data DIR "
    "naming a directory that holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
const char* const kReinstallHint =
    "the file is damaged: reinstall it with `apt-get install --reinstall dataset-fashion-mnist`, "
    "or download it again into the directory given by --data";

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// gzread reads plain files as they are, so one reader serves .gz and
// uncompressed IDX alike.
class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)) {
    errno = 0;
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) {
      std::string reason = errno != 0 ? std::strerror(errno) : "cannot open";
      throw DataError(path_ + ": " + reason + "; " + kInstallHint);
    }
    gzbuffer(file_, 1 << 20);
  }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;
  ~IdxReader() { gzclose(file_); }

  // Reads exactly `size` bytes; `what` names them in the error, which
  // counts `before` bytes of them read already.
  void read(void* out, size_t size, const char* what, size_t before = 0, size_t whole = 0) {
    auto* dst = static_cast<unsigned char*>(out);
    size_t done = 0;
    while (done < size) {
      unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
      int n = gzread(file_, dst + done, chunk);
      if (n < 0) corrupt();
      if (n == 0) {
        checkStream();
        throw DataError(path_ + ": truncated: the file ends " + std::to_string(before + done) +
                        " bytes into " + what + " (" + std::to_string(whole != 0 ? whole : size) +
                        " bytes expected); " + kReinstallHint);
      }
      done += static_cast<size_t>(n);
    }
  }

  uint32_t readBigEndian32(const char* what) {
    std::array<unsigned char, 4> b;
    read(b.data(), b.size(), what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  // After the last record: trailing bytes mean the header is wrong, and
  // reading to the end makes zlib verify the gzip checksum.
  void expectEnd() {
    unsigned char extra;
    int n = gzread(file_, &extra, 1);
    if (n < 0) corrupt();
    if (n > 0)
      throw DataError(path_ + ": more data than its header announces; " +
                      std::string(kReinstallHint));
    checkStream();
  }

  // Reads `size` bytes into `out`, which grows as they arrive (in pieces
  // that double): a header that claims more than the file holds fails as
  // truncated, having taken memory for what the file had, not for the claim.
  void readGrowing(std::vector<uint8_t>& out, size_t size, const char* what) {
    out.clear();
    while (out.size() < size) {
      const size_t done = out.size();
      const size_t piece = std::min(size - done, std::max<size_t>(size_t{64} << 20, done));
      out.resize(done + piece);
      read(out.data() + done, piece, what, done, size);
    }
  }

  const std::string& path() const { return path_; }

 private:
  void checkStream() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END) corrupt(message);
  }

  [[noreturn]] void corrupt(const char* message = nullptr) {
    int code = Z_OK;
    if (message == nullptr) message = gzerror(file_, &code);
    // zlib prefixes the path, which the message already starts with.
    std::string reason = message;
    if (reason.rfind(path_ + ": ", 0) == 0) reason.erase(0, path_.size() + 2);
    throw DataError(path_ + ": corrupt gzip data (" + reason + "); " + kReinstallHint);
  }

  std::string path_;
  gzFile file_ = nullptr;
};

std::string locate(const std::string& dir, const std::string& name) {
  std::string base = dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
  if (exists(base + ".gz") || !exists(base)) return base + ".gz";
  return base;
}

}  // namespace

LabeledImages loadIdx(const std::string& imagesPath, const std::string& labelsPath, size_t limit) {
  LabeledImages data;
  IdxReader images(imagesPath);
  if (uint32_t magic = images.readBigEndian32("the header"); magic != kImagesMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    throw DataError(imagesPath + ": not an IDX image file (magic number " + hex +
                    ", expected 0x00000803); " + kReinstallHint);
  }
  size_t count = images.readBigEndian32("the header");
  data.rows = images.readBigEndian32("the header");
  data.cols = images.readBigEndian32("the header");
  if (data.rows == 0 || data.cols == 0 || data.rows * data.cols > 1u << 20)
    throw DataError(imagesPath + ": implausible image size " + std::to_string(data.rows) + "x" +
                    std::to_string(data.cols) + "; " + kReinstallHint);

  IdxReader labels(labelsPath);
  if (uint32_t magic = labels.readBigEndian32("the header"); magic != kLabelsMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    throw DataError(labelsPath + ": not an IDX label file (magic number " + hex +
                    ", expected 0x00000801); " + kReinstallHint);
  }
  size_t labelCount = labels.readBigEndian32("the header");
  if (labelCount != count)
    throw DataError(labelsPath + " has " + std::to_string(labelCount) + " labels but " +
                    imagesPath + " has " + std::to_string(count) +
                    " images: the two files do not belong together; " + kReinstallHint);

  data.count = limit != 0 && limit < count ? limit : count;
  images.readGrowing(data.pixels, data.count * data.features(), "the pixels");
  labels.readGrowing(data.labels, data.count, "the labels");
  for (size_t i = 0; i < data.count; ++i)
    if (data.labels[i] >= kClasses)
      throw DataError(labelsPath + ": label " + std::to_string(data.labels[i]) + " of sample " +
                      std::to_string(i) + " is out of range 0.." + std::to_string(kClasses - 1) +
                      "; " + kReinstallHint);
  if (data.count == count) {
    images.expectEnd();
    labels.expectEnd();
  }
  return data;
}

FashionMnist loadFashionMnist(const std::string& dir, size_t trainLimit, size_t testLimit) {
  FashionMnist data;
  data.train = loadIdx(locate(dir, "train-images-idx3-ubyte"),
                       locate(dir, "train-labels-idx1-ubyte"), trainLimit);
  data.test = loadIdx(locate(dir, "t10k-images-idx3-ubyte"), locate(dir, "t10k-labels-idx1-ubyte"),
                      testLimit);
  if (data.train.features() != data.test.features())
    throw DataError(dir + ": training images are " + std::to_string(data.train.rows) + "x" +
                    std::to_string(data.train.cols) + " but test images are " +
                    std::to_string(data.test.rows) + "x" + std::to_string(data.test.cols) + "; " +
                    kReinstallHint);
  return data;
}

void gatherBatch(const LabeledImages& data, const uint32_t* indices, size_t n, float* out,
                 uint8_t* labels) {
  // One multiply-add per pixel: (p / 255 - mean) / std.
  constexpr float kScale = 1.0f / (255.0f * kPixelStd);
  constexpr float kShift = -kPixelMean / kPixelStd;
  const size_t features = data.features();
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* src = data.pixels.data() + size_t{indices[i]} * features;
    float* dst = out + i * features;
    for (size_t j = 0; j < features; ++j) dst[j] = static_cast<float>(src[j]) * kScale + kShift;
    labels[i] = data.labels[indices[i]];
  }
}

}  // namespace trainer
