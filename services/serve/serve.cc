#include "services/serve/serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "common/formats/model_hash_cache.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/packed_bf16.h"
#include "services/serve/model_source.h"
#include "services/serve/store_cache.h"

namespace pw::serve {

namespace fs = std::filesystem;

namespace {

// A YAML double-quoted scalar.
std::string Quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

// Binds host:port (0: any free port) and returns the port bound, released again: a port for a
// listener started right after, or the proof that `port` is free now.
Result<int> ProbePort(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(std::string("socket: ") + std::strerror(errno));
  // As the router's listener: a port whose old connections linger in TIME_WAIT is free.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    ::close(fd);
    return InvalidArgument("--host '" + host + "': not an IPv4 address");
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Unavailable(host + ":" + std::to_string(port) + " cannot be bound (" + why + "): give another --port");
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

}  // namespace

std::string NodeFileText(const ServeOptions& o, const NodePlan& p) {
  const bool store = !p.store.empty();
  std::string y;
  y += "# The node `pw serve` runs (the schema of deploy/local.yaml: services/common/node_config.h).\n";
  y += "# " + p.memory.Summary() + "\n";
  y += "model_dir: " + Quoted(p.model_dir) + "\n";
  y += "model_name: " + Quoted(p.model_name) + "\n";
  y += "host: " + Quoted(o.host) + "\n";
  y += "run_dir: " + Quoted(p.run_dir) + "\n";
  y += "bin_dir: " + Quoted(p.bin_dir) + "\n";
  y += "kv_dtype: bf16\n";
  y += std::string("dense: ") + DenseFormatName(p.dense) + "\n";
  y += std::string("lm_head: ") + DenseFormatName(p.lm_head) + "\n";
  y += "\nrouter:\n";
  y += "  port: " + std::to_string(o.port) + "\n";
  y += "  control_port: " + std::to_string(p.router_control_port) + "\n";
  if (!p.tokenizer_dir.empty()) y += "  tokenizer: " + Quoted(p.tokenizer_dir) + "\n";
  y += "\nbroker:\n";
  y += std::string("  enabled: ") + (store ? "true" : "false") + "\n";
  if (store) {
    y += "  control_port: " + std::to_string(p.broker_control_port) + "\n";
    y += "  store: " + Quoted(p.store) + "\n";
    if (!p.model_hash_cache.empty()) y += "  model_hash_cache: " + Quoted(p.model_hash_cache) + "\n";
    y += "  initial_bits: " + std::to_string(p.memory.bits) + "\n";
    y += "  planner: {enabled: true, max_bits: " + std::to_string(p.max_bits) + "}\n";
  }
  y += "\nprefill:\n";
  y += "  - id: prefill-0\n";
  y += "    kv_blocks: " + std::to_string(kPrefillKvBlocks) + "\n";
  y += "    block_size: " + std::to_string(kKvBlockSize) + "\n";
  if (store && p.memory.prefill_bits != 16) {
    y += "    store: " + Quoted(p.store) + "\n";
    y += "    expert_bits: " + std::to_string(p.memory.prefill_bits) + "\n";
    if (!p.model_hash_cache.empty()) y += "    model_hash_cache: " + Quoted(p.model_hash_cache) + "\n";
  }
  y += "\ndecode:\n";
  y += "  - id: decode-0\n";
  y += "    pool_mb: " + std::to_string(p.memory.pool >> 20) + "\n";
  y += "    max_batch: " + std::to_string(kMaxSequences) + "\n";
  y += "    block_size: " + std::to_string(kKvBlockSize) + "\n";
  return y;
}

Result<DenseChoice> ServeDense(const std::string& dense, DenseFormat lm_head, bool bf16_experts, int max_bits,
                               int fast_width, bool packed_fast) {
  DenseChoice c;
  if (dense == "auto") {
    if (bf16_experts) {
      const DenseFormat f = packed_fast ? DenseFormat::kBf16Packed : DenseFormat::kBf16;
      c = {f, f};
    } else if (max_bits <= 4) {
      c = {DenseFormat::kAp4, fast_width >= 6 ? DenseFormat::kAp6 : DenseFormat::kInt8};
    } else {
      c = {DenseFormat::kInt8, DenseFormat::kInt8};
    }
  } else {
    bool found = false;
    for (const auto& [name, f] : DenseFormatChoices()) {
      if (name == dense) c = {f, f}, found = true;
    }
    if (!found) return InvalidArgument("--dense " + dense + ": not auto or one of bf16, bf16-packed, int8, ap3..ap8");
  }
  c.lm_head = LmHeadFormat(c.lm_head, lm_head);
  return c;
}

Result<int> PlannerMaxBits(const std::string& max_bits, const std::string& bits) {
  const int given = bits == "auto" || bits == "16" ? 0 : std::stoi(bits);  // 0: no width given
  // A width given above what is fast here is the user's: the planner may keep it.
  if (max_bits == "auto") return std::max(anyprec::FastWidthLimit(anyprec::BestQ8Backend()), given);
  const int m = std::stoi(max_bits);
  if (given > m) {
    return InvalidArgument("--bits " + bits + " is above --max-bits " + max_bits +
                           ": the planner could not keep the width it starts at (give --max-bits " + bits +
                           " or more)");
  }
  return m;
}

Status RunServe(const ServeOptions& o, const std::string& bin_dir) {
  // 1. The directory and the memory, before anything is built.
  PW_ASSIGN_OR_RETURN(ModelSource src, OpenModelSource(o.model_dir, o.tokenizer));
  PW_ASSIGN_OR_RETURN(int64_t budget, ParseMemory(o.memory));
  PW_ASSIGN_OR_RETURN(const int max_bits, PlannerMaxBits(o.max_bits, o.bits));
  // Where packed bf16 pays, the dense matrices' auto is bf16-packed and the decode worker packs
  // the checkpoint's bf16 experts (its bf16_experts: auto, engine/experts/bf16_experts.h).
  const bool packing_pays = cpu::PackingPays(cpu::Kernels());
  PW_ASSIGN_OR_RETURN(const DenseChoice dense,
                      ServeDense(o.dense, o.lm_head, o.bits == "16", max_bits,
                                 anyprec::FastWidthLimit(anyprec::BestQ8Backend()), packing_pays));
  PW_ASSIGN_OR_RETURN(MemoryPlan mem,
                      PlanMemory(src.config, static_cast<int64_t>(src.checkpoint_bytes), budget, o.bits, o.memory,
                                 static_cast<int64_t>(DenseCopyBytes(src, dense.dense, dense.lm_head)), max_bits,
                                 o.prefill_bits == "16" ? 0 : anyprec::FastWidthLimit(anyprec::BestQ8Backend()),
                                 packing_pays ? PackedExpertBytes(src.config) : 0));
  PW_RETURN_IF_ERROR(ProbePort(o.host, static_cast<int>(o.port)).status());
  std::string store_dir = o.store_dir;
  if (store_dir.empty()) {
    PW_ASSIGN_OR_RETURN(store_dir, DefaultStoreDir());
  }
  const std::string name = o.served_model_name.empty() ? src.default_name : o.served_model_name;
  std::fprintf(stderr, "pw serve: %s (%s)\n", src.dir.c_str(), src.config.Summary().c_str());
  // The hash reads every expert byte; a second start of an unchanged checkpoint finds it in
  // <store_dir>/hashes/ (model_hash_cache.h).
  PW_ASSIGN_OR_RETURN(CachedModelHash hash, ModelHashCached(src.dir, store_dir));
  // The store is calibrated on the bundled text through the tokenizer served with it.
  const std::string tokenizer_json = src.tokenizer_dir + "/tokenizer.json";
  PW_ASSIGN_OR_RETURN(uint64_t calibration, CalibrationKey(tokenizer_json));
  const StorePaths paths = StorePathsFor(store_dir, StoreKey(hash.hash, calibration));
  std::fprintf(stderr, "pw serve: %s\n", mem.Summary().c_str());

  // 2. The store.
  NodePlan plan;
  plan.max_bits = max_bits;  // never below mem.bits: PlannerMaxBits and PlanMemory see to it
  plan.dense = dense.dense;
  plan.lm_head = dense.lm_head;
  std::fprintf(stderr, "pw serve: dense matrices %s, lm_head %s (--dense %s)\n", DenseFormatName(plan.dense),
               DenseFormatName(plan.lm_head), o.dense.c_str());
  if (mem.bits != 16) {
    std::fprintf(stderr, "pw serve: the planner raises experts up to %d bits (--max-bits %s; %s's fast path)\n",
                 plan.max_bits, o.max_bits.c_str(), kernels::BackendName(anyprec::BestQ8Backend()));
    StoreBuild build;
    build.quantize_bin = bin_dir + "/pw-quantize";
    build.model_dir = src.dir;
    build.tokenizer_json = tokenizer_json;
    build.model_hash_cache = store_dir;  // hashed just above: pw-quantize reads it there
    build.threads = o.quantize_threads > 0 ? static_cast<int>(o.quantize_threads)
                                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const auto t0 = std::chrono::steady_clock::now();
    PW_ASSIGN_OR_RETURN(bool built, EnsureStore(paths, build));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (built) {
      std::fprintf(stderr, "pw serve: store built in %.1fs: %s\n", s, paths.store.c_str());
    } else {
      std::fprintf(stderr, "pw serve: store found in the cache: %s\n", paths.store.c_str());
    }
    plan.store = paths.store;
    plan.model_hash_cache = store_dir;
  }

  // 3. The node file, then pw-cluster in this process's place.
  plan.model_dir = src.dir;
  if (!o.tokenizer.empty()) plan.tokenizer_dir = src.tokenizer_dir;
  plan.model_name = name;
  plan.memory = mem;
  plan.bin_dir = bin_dir;
  plan.run_dir = o.run_dir.empty() ? store_dir + "/run/" + paths.key + "-" + std::to_string(o.port) : o.run_dir;
  plan.run_dir = fs::absolute(plan.run_dir).lexically_normal().string();
  PW_ASSIGN_OR_RETURN(plan.router_control_port, ProbePort(o.host, 0));
  PW_ASSIGN_OR_RETURN(plan.broker_control_port, ProbePort(o.host, 0));
  std::error_code ec;
  fs::create_directories(plan.run_dir, ec);
  if (ec) return IoError(plan.run_dir + ": cannot create: " + ec.message());
  const std::string node_file = plan.run_dir + "/node.yaml";
  {
    std::ofstream f(node_file);
    f << NodeFileText(o, plan);
    if (!f) return IoError(node_file + ": cannot write");
  }
  const std::string url = "http://" + o.host + ":" + std::to_string(o.port);
  std::printf("pw serve: model '%s' at %s (node file %s)\n", name.c_str(), url.c_str(), node_file.c_str());
  std::printf("Chat:\n  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
              "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], "
              "\"max_tokens\": 32}'\n",
              url.c_str(), name.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  const std::string cluster = bin_dir + "/pw-cluster";
  std::vector<std::string> argv = {cluster, "up", "--config", node_file};
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  execv(cluster.c_str(), args.data());
  return IoError("cannot run " + cluster + ": " + std::strerror(errno));
}

}  // namespace pw::serve
