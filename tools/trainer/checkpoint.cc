#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace trainer {
namespace {

constexpr char kCheckpointMagic[8] = {'B', 'R', 'D', 'T', 'C', 'K', 'P', 'T'};
constexpr char kWeightsMagic[8] = {'B', 'R', 'D', 'T', 'W', 'G', 'H', 'T'};
// Version 2 of checkpoints holds the run's settings.
constexpr uint32_t kCheckpointVersion = 2;
constexpr uint32_t kWeightsVersion = 1;

std::string systemError(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Numbers are stored in the host's byte order: the files are for resuming
// and comparing runs on the machines that wrote them.
class Writer {
 public:
  template <typename T>
  void put(const T& value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  template <typename T>
  void putVector(const std::vector<T>& values) {
    put(uint64_t(values.size()));
    bytes_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  }
  void putMagic(const char (&magic)[8], uint32_t version) {
    bytes_.append(magic, sizeof(magic));
    put(version);
  }
  void putString(const std::string& text) {
    put(uint64_t(text.size()));
    bytes_.append(text);
  }
  std::string finish() {
    uint32_t crc =
        uint32_t(crc32(0L, reinterpret_cast<const Bytef*>(bytes_.data()), uInt(bytes_.size())));
    put(crc);
    return std::move(bytes_);
  }

 private:
  std::string bytes_;
};

class Reader {
 public:
  Reader(std::string path, const char (&magic)[8], uint32_t expectedVersion, const char* kind)
      : path_(std::move(path)) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw FileError(systemError("cannot open", path_));
    bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (bytes_.size() < sizeof(magic) + 8 || std::memcmp(bytes_.data(), magic, sizeof(magic)) != 0)
      throw FileError(path_ + " is not a braid-train " + kind + " file");
    uint32_t stored;
    std::memcpy(&stored, bytes_.data() + bytes_.size() - 4, 4);
    uint32_t actual =
        uint32_t(crc32(0L, reinterpret_cast<const Bytef*>(bytes_.data()), uInt(bytes_.size() - 4)));
    if (stored != actual) throw FileError(path_ + " is truncated or corrupt (checksum mismatch)");
    end_ = bytes_.size() - 4;
    pos_ = sizeof(magic);
    if (uint32_t version = get<uint32_t>(); version != expectedVersion)
      throw FileError(path_ + " has format version " + std::to_string(version) +
                      ", this braid-train reads version " + std::to_string(expectedVersion));
  }

  template <typename T>
  T get() {
    T value;
    need(sizeof(T));
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  template <typename T>
  std::vector<T> getVector() {
    uint64_t n = get<uint64_t>();
    if (n > (end_ - pos_) / sizeof(T)) throw FileError(path_ + " is malformed (bad length)");
    std::vector<T> values(n);
    std::memcpy(values.data(), bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return values;
  }
  std::string getString() {
    uint64_t n = get<uint64_t>();
    need(n);
    std::string text = bytes_.substr(pos_, n);
    pos_ += n;
    return text;
  }
  void expectEnd() {
    if (pos_ != end_) throw FileError(path_ + " is malformed (trailing bytes)");
  }

 private:
  void need(size_t n) {
    if (end_ - pos_ < n) throw FileError(path_ + " is malformed (too short)");
  }

  std::string path_;
  std::string bytes_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

}  // namespace

void writeFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw FileError(systemError("cannot create", temporary));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string message = systemError("cannot write", temporary);
      ::close(fd);
      ::unlink(temporary.c_str());
      throw FileError(message);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string message = systemError("cannot flush", temporary);
    ::unlink(temporary.c_str());
    throw FileError(message);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    std::string message = systemError("cannot rename " + temporary + " to", path);
    ::unlink(temporary.c_str());
    throw FileError(message);
  }
  // The rename itself is durable only once the directory is.
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
}

void writeCheckpoint(const std::string& path, const Checkpoint& c) {
  Writer w;
  w.putMagic(kCheckpointMagic, kCheckpointVersion);
  w.putVector(c.sizes);
  w.put(uint32_t(c.optimizer));
  w.put(uint64_t(c.settings.size()));
  for (const auto& [name, value] : c.settings) {
    w.putString(name);
    w.putString(value);
  }
  w.put(c.epochsDone);
  w.put(c.steps);
  w.put(c.optimizerSteps);
  w.putVector(c.params);
  w.putVector(c.first);
  w.putVector(c.second);
  w.put(uint64_t(c.history.size()));
  for (const EpochRecord& r : c.history) w.put(r);
  writeFileAtomically(path, w.finish());
}

Checkpoint readCheckpoint(const std::string& path) {
  Reader r(path, kCheckpointMagic, kCheckpointVersion, "checkpoint");
  Checkpoint c;
  c.sizes = r.getVector<int>();
  uint32_t optimizer = r.get<uint32_t>();
  if (optimizer > uint32_t(OptimizerKind::kAdam))
    throw FileError(path + " is malformed (unknown optimizer)");
  c.optimizer = OptimizerKind(optimizer);
  const uint64_t settings = r.get<uint64_t>();
  for (uint64_t i = 0; i < settings; ++i) {
    std::string name = r.getString();
    c.settings.emplace_back(std::move(name), r.getString());
  }
  c.epochsDone = r.get<int64_t>();
  c.steps = r.get<int64_t>();
  c.optimizerSteps = r.get<int64_t>();
  c.params = r.getVector<float>();
  c.first = r.getVector<float>();
  c.second = r.getVector<float>();
  uint64_t records = r.get<uint64_t>();
  for (uint64_t i = 0; i < records; ++i) c.history.push_back(r.get<EpochRecord>());
  r.expectEnd();
  return c;
}

void writeWeights(const std::string& path, const Weights& weights) {
  Writer w;
  w.putMagic(kWeightsMagic, kWeightsVersion);
  w.putVector(weights.sizes);
  w.putVector(weights.params);
  writeFileAtomically(path, w.finish());
}

Weights readWeights(const std::string& path) {
  Reader r(path, kWeightsMagic, kWeightsVersion, "weights");
  Weights weights;
  weights.sizes = r.getVector<int>();
  weights.params = r.getVector<float>();
  r.expectEnd();
  return weights;
}

}  // namespace trainer
