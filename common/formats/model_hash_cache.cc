#include "common/formats/model_hash_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/formats/checkpoint_experts.h"
#include "common/hash.h"

namespace pw {

namespace fs = std::filesystem;

namespace {

constexpr char kHeader[] = "pagedweight model hash 1";

struct FileStat {
  std::string name;
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileStat&) const = default;
};

bool HashedFile(const std::string& name) {
  return name == "config.json" || name == "model.safetensors.index.json" ||
         (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
}

// The files the hash can depend on, sorted by name, with their stat (symlinks followed).
Result<std::vector<FileStat>> StatFiles(const std::string& dir) {
  std::vector<FileStat> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!HashedFile(name)) continue;
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0) {
      return IoError(entry.path().string() + ": cannot stat: " + std::strerror(errno));
    }
    FileStat f;
    f.name = name;
    f.dev = static_cast<uint64_t>(st.st_dev);
    f.ino = static_cast<uint64_t>(st.st_ino);
    f.size = static_cast<uint64_t>(st.st_size);
    f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    f.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    out.push_back(std::move(f));
  }
  if (ec) return IoError(dir + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end(), [](const FileStat& a, const FileStat& b) { return a.name < b.name; });
  return out;
}

std::string Serialize(const std::string& dir, uint64_t hash, const std::vector<FileStat>& files) {
  std::ostringstream s;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  s << kHeader << "\ndir " << dir << "\nhash " << hex << "\n";
  for (const FileStat& f : files) {
    s << "file " << f.dev << " " << f.ino << " " << f.size << " " << f.mtime_ns << " " << f.ctime_ns << " " << f.name
      << "\n";
  }
  return s.str();
}

// The recorded hash when `path` is an entry for exactly `dir` and `files`.
bool Lookup(const std::string& path, const std::string& dir, const std::vector<FileStat>& files, uint64_t* hash) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // The entry is what Serialize would write for its hash: re-serialize and compare.
  const std::string prefix = std::string(kHeader) + "\ndir " + dir + "\nhash ";
  if (text.compare(0, prefix.size(), prefix) != 0 || text.size() < prefix.size() + 17) return false;
  uint64_t h = 0;
  if (std::sscanf(text.c_str() + prefix.size(), "%16llx", reinterpret_cast<unsigned long long*>(&h)) != 1) {
    return false;
  }
  if (Serialize(dir, h, files) != text) return false;
  *hash = h;
  return true;
}

}  // namespace

Result<CachedModelHash> ModelHashCached(const std::string& model_dir, const std::string& store_dir,
                                        double settle_seconds) {
  std::error_code ec;
  const fs::path canonical = fs::canonical(model_dir, ec);
  const std::string dir = ec ? model_dir : canonical.string();
  char key[17];
  std::snprintf(key, sizeof(key), "%016llx", static_cast<unsigned long long>(Fnv1a64Of(dir.data(), dir.size())));
  const std::string entry = store_dir + "/hashes/" + key + ".txt";

  PW_ASSIGN_OR_RETURN(std::vector<FileStat> before, StatFiles(dir));
  CachedModelHash out;
  if (Lookup(entry, dir, before, &out.hash)) {
    out.from_cache = true;
    return out;
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  PW_ASSIGN_OR_RETURN(out.hash, ModelHash(dir));
  PW_ASSIGN_OR_RETURN(std::vector<FileStat> after, StatFiles(dir));
  const int64_t settle_ns = static_cast<int64_t>(settle_seconds * 1e9);
  bool settled = before == after;
  for (const FileStat& f : after) {
    settled = settled && f.mtime_ns <= start_ns - settle_ns && f.ctime_ns <= start_ns - settle_ns;
  }
  if (settled) {  // best effort: a cache that cannot be written only costs the next start a hash
    fs::create_directories(store_dir + "/hashes", ec);
    const std::string tmp = entry + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << Serialize(dir, out.hash, after);
    }
    fs::rename(tmp, entry, ec);
    if (ec) fs::remove(tmp, ec);
  }
  return out;
}

}  // namespace pw
