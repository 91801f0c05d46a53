#include "quant/store_build_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/expert_block.h"
#include "common/hash.h"

namespace pw::anyprec {
namespace {

namespace fs = std::filesystem;

constexpr char kCalibMagic[8] = {'P', 'W', 'C', 'A', 'L', 'I', 'B', '1'};
constexpr char kProgressMagic[8] = {'P', 'W', 'S', 'T', 'P', 'R', 'G', '1'};
constexpr char kProgressFile[] = "store-progress.bin";

Result<std::string> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot open");
  std::ostringstream s;
  s << f.rdbuf();
  if (!f && !f.eof()) return IoError(path + ": read failed");
  return s.str();
}

template <typename T>
void Append(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(tmp + ": cannot create: " + std::strerror(errno));
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return IoError(tmp + ": write failed: " + why);
    }
    at += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return IoError(tmp + ": cannot flush: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return IoError(path + ": cannot rename from " + tmp + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

Result<StoreBuildDir> StoreBuildDir::Open(const std::string& dir, const std::string& build) {
  StoreBuildDir d;
  d.dir_ = dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError(dir + ": cannot create: " + ec.message());
  const std::string build_path = dir + "/build.txt";
  auto have = ReadAll(build_path);
  if (have.ok() && *have == build) {
    d.reused_ = true;
    return d;
  }
  // Another build's parts (or a directory never finished being set up): start afresh.
  for (const auto& entry : fs::directory_iterator(dir, ec)) fs::remove_all(entry.path(), ec);
  if (ec) return IoError(dir + ": cannot empty: " + ec.message());
  PW_RETURN_IF_ERROR(WriteFileAtomically(build_path, build));
  return d;
}

Status StoreBuildDir::SaveStoreProgress(const apw::ApwWriter::Progress& p) const {
  std::string out(kProgressMagic, sizeof(kProgressMagic));
  Append(&out, p.end);
  Append(&out, static_cast<uint64_t>(p.table.size()));
  out.append(reinterpret_cast<const char*>(p.table.data()), p.table.size());
  Append(&out, Crc32(out.data(), out.size()));
  return WriteFileAtomically(dir_ + "/" + kProgressFile, out);
}

Result<std::optional<apw::ApwWriter::Progress>> StoreBuildDir::LoadStoreProgress() const {
  const std::string path = dir_ + "/" + kProgressFile;
  if (!fs::exists(path)) return std::optional<apw::ApwWriter::Progress>();
  PW_ASSIGN_OR_RETURN(std::string bytes, ReadAll(path));
  const size_t head = sizeof(kProgressMagic) + 2 * sizeof(uint64_t), tail = sizeof(uint32_t);
  apw::ApwWriter::Progress p;
  uint64_t table_bytes = 0;
  if (bytes.size() >= head + tail) std::memcpy(&table_bytes, bytes.data() + sizeof(kProgressMagic) + 8, 8);
  if (bytes.size() < head + tail || std::memcmp(bytes.data(), kProgressMagic, sizeof(kProgressMagic)) != 0 ||
      table_bytes != bytes.size() - head - tail) {
    return Corrupt(path + ": not a store build's progress");
  }
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - tail, tail);
  if (crc != Crc32(bytes.data(), bytes.size() - tail)) return Corrupt(path + ": checksum mismatch");
  std::memcpy(&p.end, bytes.data() + sizeof(kProgressMagic), 8);
  p.table.assign(bytes.begin() + static_cast<std::ptrdiff_t>(head), bytes.end() - static_cast<std::ptrdiff_t>(tail));
  return std::optional<apw::ApwWriter::Progress>(std::move(p));
}

bool StoreBuildDir::MayHoldCalibration(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && fs::exists(dir + "/calibration.bin", ec);
}

Status StoreBuildDir::SaveCalibration(const CalibrationStats& s) const {
  std::string out(kCalibMagic, sizeof(kCalibMagic));
  for (int v : {s.num_layers, s.num_experts, s.hidden, s.ffn}) Append(&out, static_cast<uint32_t>(v));
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    Append(&out, s.tokens[i]);
    out.append(reinterpret_cast<const char*>(s.sums[i].data()), s.sums[i].size() * sizeof(double));
  }
  Append(&out, Crc32(out.data(), out.size()));
  return WriteFileAtomically(dir_ + "/calibration.bin", out);
}

Result<std::optional<CalibrationStats>> StoreBuildDir::LoadCalibration(int num_layers, int num_experts,
                                                                       int hidden, int ffn) const {
  const std::string path = dir_ + "/calibration.bin";
  if (!fs::exists(path)) return std::optional<CalibrationStats>();
  PW_ASSIGN_OR_RETURN(std::string bytes, ReadAll(path));
  CalibrationStats s;
  s.num_layers = num_layers;
  s.num_experts = num_experts;
  s.hidden = hidden;
  s.ffn = ffn;
  const size_t blocks = static_cast<size_t>(num_layers) * num_experts * kProjsPerExpert;
  size_t expect = sizeof(kCalibMagic) + 4 * sizeof(uint32_t) + sizeof(uint32_t);
  for (size_t i = 0; i < blocks; ++i) {
    const int cols = ExpertBlockAt(i, num_experts).proj == ExpertProj::kGateUp ? hidden : ffn;
    expect += sizeof(uint64_t) + static_cast<size_t>(cols) * sizeof(double);
  }
  if (bytes.size() != expect || std::memcmp(bytes.data(), kCalibMagic, sizeof(kCalibMagic)) != 0) {
    return Corrupt(path + ": not the calibration statistics of this model (remove the file to recalibrate)");
  }
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - sizeof(crc), sizeof(crc));
  if (crc != Crc32(bytes.data(), bytes.size() - sizeof(crc))) {
    return Corrupt(path + ": checksum mismatch (remove the file to recalibrate)");
  }
  size_t at = sizeof(kCalibMagic);
  for (int v : {num_layers, num_experts, hidden, ffn}) {
    uint32_t got;
    std::memcpy(&got, bytes.data() + at, sizeof(got));
    at += sizeof(got);
    if (got != static_cast<uint32_t>(v)) {
      return Corrupt(path + ": made for another model shape (remove the file to recalibrate)");
    }
  }
  s.tokens.resize(blocks);
  s.sums.resize(blocks);
  for (size_t i = 0; i < blocks; ++i) {
    const int cols = ExpertBlockAt(i, num_experts).proj == ExpertProj::kGateUp ? hidden : ffn;
    std::memcpy(&s.tokens[i], bytes.data() + at, sizeof(uint64_t));
    at += sizeof(uint64_t);
    s.sums[i].resize(static_cast<size_t>(cols));
    std::memcpy(s.sums[i].data(), bytes.data() + at, static_cast<size_t>(cols) * sizeof(double));
    at += static_cast<size_t>(cols) * sizeof(double);
  }
  return std::optional<CalibrationStats>(std::move(s));
}

Status StoreBuildDir::Remove() const {
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (ec) return IoError(dir_ + ": cannot remove: " + ec.message());
  return Status::Ok();
}

}  // namespace pw::anyprec
