#include "services/serve/store_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/calibration_text.h"
#include "common/hash.h"

namespace pw::serve {

namespace fs = std::filesystem;

Result<std::string> DefaultStoreDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') {
    return std::string(x) + "/pagedweight";
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] != '\0') {
    return std::string(h) + "/.cache/pagedweight";
  }
  return InvalidArgument("neither XDG_CACHE_HOME nor HOME is set: give --store-dir DIR for the store cache");
}

Result<uint64_t> CalibrationKey(const std::string& tokenizer_json) {
  std::FILE* f = std::fopen(tokenizer_json.c_str(), "rb");
  if (f == nullptr) return NotFound(tokenizer_json + ": cannot open (" + std::strerror(errno) + ")");
  Fnv1a64 h;
  uint8_t text[8];
  const uint64_t text_hash = BundledCalibrationTextHash();
  for (int i = 0; i < 8; ++i) text[i] = static_cast<uint8_t>(text_hash >> (8 * i));
  h.Update(text, sizeof(text));
  std::vector<char> buf(1 << 16);
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.Update(buf.data(), n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Internal(tokenizer_json + ": read error");
  return h.digest();
}

uint64_t StoreKey(uint64_t model_hash, uint64_t calibration_hash) {
  uint8_t bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<uint8_t>(model_hash >> (8 * i));
    bytes[8 + i] = static_cast<uint8_t>(calibration_hash >> (8 * i));
  }
  return Fnv1a64Of(bytes, sizeof(bytes));
}

StorePaths StorePathsFor(const std::string& store_dir, uint64_t store_key) {
  char key[17];
  std::snprintf(key, sizeof(key), "%016llx", static_cast<unsigned long long>(store_key));
  StorePaths p;
  p.key = key;
  const std::string base = store_dir + "/stores/" + p.key;
  p.store = base + ".apw";
  p.partial = base + ".partial";
  p.lock = base + ".lock";
  return p;
}

namespace {

// Runs argv as a child that is killed when this process dies; its exit status.
Result<int> RunChild(const std::vector<std::string>& argv) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return IoError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "pw serve: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return IoError(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st);
}

}  // namespace

Result<bool> EnsureStore(const StorePaths& paths, const StoreBuild& build) {
  std::error_code ec;
  if (fs::exists(paths.store, ec)) return false;
  fs::create_directories(fs::path(paths.store).parent_path(), ec);
  if (ec) return IoError(fs::path(paths.store).parent_path().string() + ": cannot create: " + ec.message());
  const int fd = ::open(paths.lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(paths.lock + ": cannot open: " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::fprintf(stderr, "pw serve: another process is building %s; waiting for it\n", paths.store.c_str());
    while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  // Under the lock: the other process may have published it meanwhile.
  if (fs::exists(paths.store, ec)) {
    ::close(fd);
    return false;
  }
  const bool resuming = fs::exists(paths.partial, ec);
  std::fprintf(stderr, "pw serve: %s the any-precision store %s (%d threads; progress kept in %s)\n",
               resuming ? "resuming the build of" : "building", paths.store.c_str(), build.threads,
               paths.partial.c_str());
  std::fflush(stderr);
  std::vector<std::string> argv = {build.quantize_bin, "--model", build.model_dir, "--threads",
                                   std::to_string(build.threads), "--resume-dir", paths.partial, "--out", paths.store};
  if (!build.tokenizer_json.empty()) {
    argv.push_back("--tokenizer");
    argv.push_back(build.tokenizer_json);
  }
  if (!build.model_hash_cache.empty()) {
    argv.push_back("--model-hash-cache");
    argv.push_back(build.model_hash_cache);
  }
  auto rc = RunChild(argv);
  ::close(fd);
  if (!rc.ok()) return rc.status();
  if (*rc != 0 || !fs::exists(paths.store, ec)) {
    return Internal("building the store failed (" + build.quantize_bin + " exited with " + std::to_string(*rc) +
                    "); what was done is kept in " + paths.partial + " and " + paths.store +
                    ".tmp and reused by the next start");
  }
  return true;
}

}  // namespace pw::serve
