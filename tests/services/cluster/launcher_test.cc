// pw-cluster's pieces: the node file's validation, the process list it yields and the options
// each process loads from it, and the supervisor's restart-with-backoff and drain.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "services/broker/broker_options.h"
#include "services/common/node_config.h"
#include "services/cluster/cluster_config.h"
#include "services/cluster/launcher_state.h"
#include "services/cluster/supervisor.h"
#include "services/workers/decode/decode_options.h"
#include "services/workers/prefill/prefill_options.h"

namespace pw::cluster {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp";
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The options process `name` of the file at `path` runs with, loaded as the process loads them
// (its own --config FILE --section NAME path: node_config.h), or the error it would stop with.
Result<workers::DecodeProcessOptions> DecodeOf(const std::string& path, const std::string& name) {
  workers::DecodeProcessOptions d;
  options::OptionSet set;
  workers::DeclareDecodeOptions(&set, &d);
  PW_RETURN_IF_ERROR(workers::LoadDecodeOptions(service::ConfigFlags{path, name, false}, &set, &d));
  return d;
}

Result<workers::PrefillWorkerOptions> PrefillOf(const std::string& path, const std::string& name) {
  workers::PrefillWorkerOptions p;
  options::OptionSet set;
  workers::DeclarePrefillOptions(&set, &p);
  PW_RETURN_IF_ERROR(service::ApplyNodeConfig(service::ConfigFlags{path, name, false}, Role::kPrefill, &set));
  return p;
}

Result<broker::BrokerOptions> BrokerOf(const std::string& path) {
  broker::BrokerOptions b;
  options::OptionSet set;
  broker::DeclareBrokerOptions(&set, &b);
  PW_RETURN_IF_ERROR(service::ApplyNodeConfig(service::ConfigFlags{path, "broker", false}, Role::kBroker, &set));
  PW_RETURN_IF_ERROR(b.planner.Validate());
  return b;
}

TEST(ClusterConfig, DeployLocalYamlLoads) {
  const std::string path = std::string(PW_SOURCE_DIR) + "/deploy/local.yaml";
  auto cfg = LoadClusterConfig(path, "/opt/pw/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->host, "127.0.0.1");
  EXPECT_EQ(cfg->http_port, 8000);
  ASSERT_EQ(cfg->processes.size(), 4u);  // broker, router, prefill-0, decode-0
  EXPECT_EQ(cfg->processes[0].name, "broker");
  EXPECT_EQ(cfg->processes[0].argv[0], "/opt/pw/bin/pw-broker");
  auto decode = DecodeOf(path, "decode-0");
  ASSERT_TRUE(decode.ok()) << decode.status().ToString();
  EXPECT_EQ(decode->worker.broker_endpoint, "tcp://127.0.0.1:5556");
  EXPECT_EQ(decode->worker.router_endpoints, std::vector<std::string>{"tcp://127.0.0.1:5555"});
  EXPECT_EQ(decode->worker.num_kv_blocks, 2048);
  EXPECT_EQ(decode->worker.metrics_bind, "127.0.0.1:9102");
  // Drain order: the router first, the broker last.
  EXPECT_EQ(cfg->processes[0].stop_order, 2);
  EXPECT_EQ(cfg->processes[1].name, "router");
  EXPECT_EQ(cfg->processes[1].stop_order, 0);
}

TEST(ClusterConfig, EveryProcessStartsFromTheFileItself) {
  auto path = WriteTemp("argv.yaml", "model_dir: m\nbin_dir: /b\nprefill: [{id: p, kv_blocks: 7}]\n"
                                     "decode: [{id: d}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const std::string abs = std::filesystem::absolute(path).lexically_normal().string();
  EXPECT_EQ(cfg->config_path, abs);
  std::vector<std::vector<std::string>> want = {{"/b/pw-broker", "--config", abs, "--section", "broker"},
                                                {"/b/pw-router", "--config", abs, "--section", "router"},
                                                {"/b/pw-prefill", "--config", abs, "--section", "p"},
                                                {"/b/pw-decode", "--config", abs, "--section", "d"},
                                                {"/b/pw-decode", "--config", abs, "--section", "e"}};
  ASSERT_EQ(cfg->processes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(cfg->processes[i].argv, want[i]) << i;
  auto p = PrefillOf(path, "p");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->num_kv_blocks, 7);
  EXPECT_EQ(p->id, "p");
  auto none = PrefillOf(path, "q");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no prefill worker with id 'q' (ids: p)"), std::string::npos)
      << none.status().ToString();
}

TEST(ClusterConfig, TheLauncherChecksTheWiringAndEachProcessItsSection) {
  // A typo in a worker's section: the launcher, reading the wiring, lets it through; the worker
  // refuses it with the file's position (pw-cluster up and config --dump run that check first:
  // node_config_test).
  auto path = WriteTemp("wiring.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode:\n  - id: d\n    threds: 2\n");
  ASSERT_TRUE(LoadClusterConfig(path, "/bin").ok());
  auto d = DecodeOf(path, "d");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(path + ":5:5: decode[0].threds: unknown key"), std::string::npos)
      << d.status().ToString();
  EXPECT_TRUE(PrefillOf(path, "p").ok()) << "the decode section is not the prefill worker's to check";
  // The wiring itself: refused by the launcher.
  auto bad = LoadClusterConfig(WriteTemp("wiring_bad.yaml", "model_dir: m\nprefill: [{id: p, metrics_port: x}]\n"
                                                           "decode: [{id: d}]\n"),
                               "/bin");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":2:33: prefill[0].metrics_port: expected an integer"), std::string::npos)
      << bad.status().ToString();
}

TEST(ClusterConfig, DecodeLynxBlockReachesTheWorker) {
  auto path = WriteTemp("lynx.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, lynx: {enabled: true, alpha: 3, beta: 3, "
                        "gate_weights: mass, exempt_layers: [0, 3]}}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto d = DecodeOf(path, "d");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->worker.lynx);
  ASSERT_TRUE(d->worker.lynx_options.params.has_value());
  EXPECT_EQ(d->worker.lynx_options.params->alpha, 3.0f);
  EXPECT_EQ(d->worker.lynx_options.params->beta, 3);
  EXPECT_EQ(d->worker.lynx_options.gate_weights, lynx::GateWeights::kOriginalMass);
  EXPECT_EQ(d->worker.lynx_options.exempt_layers, (std::vector<int>{0, 3}));
  auto e = DecodeOf(path, "e");  // no lynx block: off
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_FALSE(e->worker.lynx);
  EXPECT_FALSE(e->worker.lynx_options.params.has_value());

  auto bad = WriteTemp("lynx_bad.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                        "decode: [{id: d, lynx: {enabled: true, alpha: 3}}]\n");
  ASSERT_TRUE(LoadClusterConfig(bad, "/bin").ok()) << "the launcher checks the wiring; the worker its section";
  auto r = DecodeOf(bad, "d");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("alpha and beta"), std::string::npos) << r.status().ToString();
}

TEST(ClusterConfig, DecodeTraceBlockReachesTheWorker) {
  auto path = WriteTemp("trace.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, trace: {path: /tmp/d.trace, max_mb: 2.5, sample: 4}}, "
                        "{id: e, trace: {path: /tmp/e.trace}}, {id: f}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto d = DecodeOf(path, "d"), e = DecodeOf(path, "e"), f = DecodeOf(path, "f");
  ASSERT_TRUE(d.ok() && e.ok() && f.ok());
  EXPECT_EQ(d->worker.trace.path, "/tmp/d.trace");
  EXPECT_EQ(d->worker.trace.max_bytes, 2500000u);
  EXPECT_EQ(d->worker.trace.sample_every, 4);
  EXPECT_EQ(e->worker.trace.max_bytes, 64000000u);  // bounded by default
  EXPECT_EQ(e->worker.trace.sample_every, 1);
  EXPECT_EQ(f->worker.trace.path, "");
  for (const char* bad : {"decode: [{id: d, trace: {max_mb: 1}}]\n", "decode: [{id: d, trace: {path: x, max_mb: 0}}]\n",
                          "decode: [{id: d, trace: {path: x, sample: 0}}]\n", "decode: [{id: d, trace: {path: x, rate: 2}}]\n"}) {
    auto p = WriteTemp("trace_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n") + bad);
    auto r = DecodeOf(p, "d");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("trace"), std::string::npos) << r.status().ToString();
    }
  }
}

// A bound that holds no record of any model (a trace takes its 64-byte header, a record of at
// least 52 bytes and the 48-byte end record: 164 bytes) is refused when the decode worker loads
// the file, naming the key; the smallest one that holds a record is taken. (A bound big enough
// for some model but not the one served is refused by the decode worker at start.)
TEST(ClusterConfig, TraceBoundBelowOneRecordIsRefused) {
  for (const char* mb : {"0.0001", "0.000163", "0", "-1"}) {
    auto p = WriteTemp("trace_small.yaml",
                       std::string("model_dir: m\nprefill: [{id: p}]\n"
                                   "decode: [{id: d}, {id: e, trace: {path: x, max_mb: ") +
                           mb + "}}]\n");
    auto r = DecodeOf(p, "e");
    ASSERT_FALSE(r.ok()) << mb;
    const std::string m = r.status().message();
    EXPECT_NE(m.find("decode[1].trace.max_mb"), std::string::npos) << m;
    EXPECT_NE(m.find("holds no record"), std::string::npos) << m;
    EXPECT_NE(m.find("164 bytes"), std::string::npos) << m;
  }
  auto p = WriteTemp("trace_min.yaml",
                     "model_dir: m\nprefill: [{id: p}]\n"
                     "decode: [{id: d, trace: {path: x, max_mb: 0.000164}}]\n");
  auto d = DecodeOf(p, "d");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->worker.trace.max_bytes, 164u);
}

TEST(ClusterConfig, DecodeWeightPacingReachesTheWorker) {
  auto path = WriteTemp("pacing.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, weight_pacing: steps}, {id: e, weight_pacing: free}, "
                        "{id: f, weight_pacing: fetches}, {id: g}, {id: h, weight_pacing: auto}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const std::pair<const char*, workers::MoverPacing> want[] = {
      {"d", workers::MoverPacing::kSteps}, {"e", workers::MoverPacing::kFree}, {"f", workers::MoverPacing::kFetches},
      {"g", workers::MoverPacing::kAuto},  // pw-decode's default
      {"h", workers::MoverPacing::kAuto}};
  for (const auto& [id, pacing] : want) {
    auto w = DecodeOf(path, id);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->worker.weight_pacing, pacing) << id;
  }
  auto bad = WriteTemp("pacing_bad.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d, weight_pacing: later}]\n");
  auto r = DecodeOf(bad, "d");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("weight_pacing"), std::string::npos) << r.status().ToString();
}

TEST(ClusterConfig, DecodeBf16ExpertFormReachesTheWorker) {
  auto path = WriteTemp("bf16_experts.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, bf16_experts: packed}, {id: e, bf16_experts: plain}, {id: f}]\n");
  const std::pair<const char*, engine::Bf16ExpertForm> want[] = {
      {"d", engine::Bf16ExpertForm::kPacked}, {"e", engine::Bf16ExpertForm::kPlain},
      {"f", engine::Bf16ExpertForm::kAuto}};  // pw-decode's default
  for (const auto& [id, form] : want) {
    auto w = DecodeOf(path, id);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->worker.bf16_experts, form) << id;
  }
  auto bad = WriteTemp("bf16_experts_bad.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d, bf16_experts: zip}]\n");
  auto r = DecodeOf(bad, "d");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bf16_experts"), std::string::npos) << r.status().ToString();
}

TEST(ClusterConfig, NoMmapReachesThatWorkerOnly) {
  auto path = WriteTemp("no_mmap.yaml",
                        "model_dir: m\nprefill: [{id: p, no_mmap: true}, {id: q}]\n"
                        "decode: [{id: d, no_mmap: true}, {id: e, no_mmap: false}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_TRUE(PrefillOf(path, "p")->copy_weights);
  EXPECT_FALSE(PrefillOf(path, "q")->copy_weights);
  EXPECT_TRUE(DecodeOf(path, "d")->worker.copy_weights);
  EXPECT_FALSE(DecodeOf(path, "e")->worker.copy_weights);
  auto bad = WriteTemp("no_mmap_bad.yaml", "model_dir: m\nprefill: [{id: p, no_mmap: sometimes}]\ndecode: [{id: d}]\n");
  auto r = PrefillOf(bad, "p");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no_mmap"), std::string::npos) << r.status().ToString();
}

// A prefill entry's store and expert_bits (pw serve writes them when the prefill worker reads
// the node's store) reach that worker only; one without the other, or a width that is neither
// 3..8 nor 16, is refused naming the keys.
TEST(ClusterConfig, PrefillStoreAndWidthReachThatWorker) {
  auto path = WriteTemp("prefill_store.yaml",
                        "model_dir: m\nprefill: [{id: p, store: /s.apw, expert_bits: 4, model_hash_cache: /c}, {id: q}]\n"
                        "decode: [{id: d}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto p = PrefillOf(path, "p");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->store_path, "/s.apw");
  EXPECT_EQ(p->expert_bits, 4);
  EXPECT_EQ(p->model_hash_cache, "/c");
  auto q = PrefillOf(path, "q");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_TRUE(q->store_path.empty());
  EXPECT_EQ(q->expert_bits, 16);
  struct Bad {
    const char* entry;
    const char* says;
  };
  for (const Bad& b : {Bad{"{id: p, expert_bits: 4}", "store and expert_bits 3..8 go together"},
                       Bad{"{id: p, store: /s.apw}", "store and expert_bits 3..8 go together"},
                       Bad{"{id: p, store: /s.apw, expert_bits: 12}", "expert_bits 12: 3..8, or 16"},
                       Bad{"{id: p, store: /s.apw, expert_bits: 2}", "expert_bits"}}) {
    auto bad = WriteTemp("prefill_store_bad.yaml", std::string("model_dir: m\nprefill: [") + b.entry +
                                                       "]\ndecode: [{id: d}]\n");
    auto r = PrefillOf(bad, "p");
    ASSERT_FALSE(r.ok()) << b.entry;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << b.entry << ": " << r.status().ToString();
  }
}

// `dense: int8` at the file's root reaches both workers (the router and broker accept the key),
// and so does `lm_head: ap6`; a value that is none of the formats is refused naming the key.
TEST(ClusterConfig, DenseAtTheRootReachesBothWorkers) {
  using pw::DenseFormat;
  auto path = WriteTemp("dense.yaml", "model_dir: m\ndense: int8\nprefill: [{id: p}]\ndecode: [{id: d}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_TRUE(PrefillOf(path, "p").ok());
  EXPECT_EQ(PrefillOf(path, "p")->dense, DenseFormat::kInt8);
  EXPECT_EQ(PrefillOf(path, "p")->lm_head, DenseFormat::kAsDense);
  ASSERT_TRUE(DecodeOf(path, "d").ok());
  EXPECT_EQ(DecodeOf(path, "d")->worker.dense, DenseFormat::kInt8);
  EXPECT_TRUE(BrokerOf(path).ok()) << BrokerOf(path).status().ToString();
  auto ap = WriteTemp("dense_ap.yaml",
                      "model_dir: m\ndense: ap4\nlm_head: ap6\nprefill: [{id: p}]\ndecode: [{id: d}]\n");
  ASSERT_TRUE(LoadClusterConfig(ap, "/bin").ok());
  EXPECT_EQ(PrefillOf(ap, "p")->dense, DenseFormat::kAp4);
  EXPECT_EQ(PrefillOf(ap, "p")->lm_head, DenseFormat::kAp6);
  EXPECT_EQ(DecodeOf(ap, "d")->worker.dense, DenseFormat::kAp4);
  EXPECT_EQ(DecodeOf(ap, "d")->worker.lm_head, DenseFormat::kAp6);
  EXPECT_TRUE(BrokerOf(ap).ok()) << BrokerOf(ap).status().ToString();
  auto plain = WriteTemp("dense_default.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n");
  EXPECT_EQ(PrefillOf(plain, "p")->dense, DenseFormat::kBf16);
  EXPECT_EQ(DecodeOf(plain, "d")->worker.dense, DenseFormat::kBf16);
  for (const char* bad_text : {"model_dir: m\ndense: int4\nprefill: [{id: p}]\ndecode: [{id: d}]\n",
                               "model_dir: m\nlm_head: int4\nprefill: [{id: p}]\ndecode: [{id: d}]\n",
                               "model_dir: m\ndense: dense\nprefill: [{id: p}]\ndecode: [{id: d}]\n"}) {
    auto bad = WriteTemp("dense_bad.yaml", bad_text);
    auto r = DecodeOf(bad, "d");
    ASSERT_FALSE(r.ok()) << bad_text;
    const std::string key = std::string(bad_text).find("lm_head") != std::string::npos ? "lm_head" : "dense";
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().ToString();
  }
}

TEST(ClusterConfig, DecodeMissesBlockReachesTheWorker) {
  auto path = WriteTemp("misses.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, misses: {policy: quality-first, eviction: lru, residency: 0.25, "
                        "admission_beta: 1, admission_delay: 2}}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto d = DecodeOf(path, "d");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const misses::MissSettings& m = d->worker.misses;
  EXPECT_EQ(m.policy, "quality-first");
  EXPECT_EQ(m.eviction, std::optional<std::string>("lru"));
  EXPECT_EQ(m.residency, std::optional<double>(0.25));
  EXPECT_EQ(m.admission_beta, std::optional<float>(1.0f));
  EXPECT_EQ(m.admission_delay, std::optional<int>(2));
  EXPECT_FALSE(m.threshold.has_value());
  auto e = DecodeOf(path, "e");  // no misses block: every expert resident
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_FALSE(e->worker.misses.residency.has_value());
  EXPECT_EQ(e->worker.misses.policy, "");
  for (const char* bad : {"decode: [{id: d, misses: {policy: rule-0.15}}]\n",
                          "decode: [{id: d, misses: {residency: 0.5, residency_bytes: 100}}]\n",
                          "decode: [{id: d, misses: {residency: 1.5}}]\n",
                          "decode: [{id: d, misses: {eviction: fifo, residency: 0.5}}]\n",
                          "decode: [{id: d, misses: {budget: 0.5}}]\n"}) {
    auto p = WriteTemp("misses_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n") + bad);
    auto r = DecodeOf(p, "d");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("misses"), std::string::npos) << r.status().ToString();
    }
  }
}

TEST(ClusterConfig, BrokerPlannerBlockReachesTheBroker) {
  auto path = WriteTemp("planner.yaml",
                        "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n"
                        "broker: {store: s.apw, planner: {enabled: true, low_watermark: 0.1, "
                        "high_watermark: 0.3, use_routing: false, max_bytes_per_decision: 4096}}\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->processes[0].name, "broker");
  auto b = BrokerOf(path);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->planner.enabled);
  EXPECT_EQ(b->planner.low_watermark, 0.1);
  EXPECT_EQ(b->planner.high_watermark, 0.3);
  EXPECT_EQ(b->planner.max_bytes_per_decision, 4096u);
  EXPECT_FALSE(b->planner.use_routing);
  EXPECT_FALSE(b->planner.static_mode);
  EXPECT_EQ(b->store_path, "s.apw");

  // Off by default.
  auto off_path = WriteTemp("planner_off.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                "decode: [{id: d}]\nbroker: {store: s.apw}\n");
  ASSERT_TRUE(LoadClusterConfig(off_path, "/bin").ok());
  EXPECT_FALSE(BrokerOf(off_path)->planner.enabled);

  for (const char* text : {"broker: {planner: {enabled: true}}\n",
                           "broker: {store: s.apw, planner: {low_watermark: 0.5, high_watermark: 0.1}}\n"}) {
    auto r = BrokerOf(WriteTemp("planner_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n"
                                                                "decode: [{id: d}]\n") + text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("planner"), std::string::npos) << r.status().ToString();
  }
}

TEST(ClusterConfig, DeployTightPlannerYamlLoadsWithThePlannerOn) {
  const std::string path = std::string(PW_SOURCE_DIR) + "/deploy/tight-planner.yaml";
  auto cfg = LoadClusterConfig(path, "/opt/pw/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_TRUE(BrokerOf(path)->planner.enabled);
  EXPECT_EQ(DecodeOf(path, "decode-0")->worker.reserve_wait_ms, 5000u);
}

TEST(ClusterConfig, DecodeReserveWaitReachesThatWorker) {
  auto path = WriteTemp("reserve_wait.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                             "decode: [{id: d, reserve_wait_ms: 3000}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(DecodeOf(path, "d")->worker.reserve_wait_ms, 3000u);
  EXPECT_EQ(DecodeOf(path, "e")->worker.reserve_wait_ms, 0u);
  // Past the router's 30 s reservation timeout: refused, naming the key.
  auto bad = DecodeOf(WriteTemp("reserve_wait_bad.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                          "decode: [{id: d, reserve_wait_ms: 60000}]\n"),
                      "d");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reserve_wait_ms"), std::string::npos) << bad.status().ToString();
}

TEST(ClusterConfig, PlannerWidthsHorizonAndBoundaryAblationReachTheWorkers) {
  auto path = WriteTemp("planner_floor.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "broker: {store: s.apw, planner: {enabled: true, min_bits: 4, max_bits: 7, min_mean_bits: 4.5, "
                        "max_mean_bits: 6, async_movement: false}}\n"
                        "decode: [{id: d, demand_horizon_tokens: 64}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto b = BrokerOf(path);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->planner.min_bits, 4);
  EXPECT_EQ(b->planner.max_bits, 7);
  EXPECT_EQ(b->planner.min_mean_bits, 4.5);
  EXPECT_EQ(b->planner.max_mean_bits, 6.0);
  for (const char* id : {"d", "e"}) {  // held reservations count what the floors let a lowering free
    auto w = DecodeOf(path, id);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->worker.lower_floors.min_bits, 4) << id;
    EXPECT_EQ(w->worker.lower_floors.max_bits, 7) << id;
    EXPECT_EQ(w->worker.lower_floors.min_mean_bits, 4.5) << id;
    EXPECT_TRUE(w->worker.plans_at_request_boundaries) << id << ": every decode worker";
    EXPECT_TRUE(w->worker.planner_lowers) << id << ": told the floors";
  }
  EXPECT_EQ(DecodeOf(path, "d")->worker.demand_horizon_tokens, 64);
  EXPECT_EQ(DecodeOf(path, "e")->worker.demand_horizon_tokens, 0);
  // The defaults: widths 3..8 and no ablation.
  auto def = WriteTemp("planner_default.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                               "broker: {store: s.apw, planner: {enabled: true}}\n"
                                               "decode: [{id: d}]\n");
  ASSERT_TRUE(LoadClusterConfig(def, "/bin").ok());
  EXPECT_EQ(BrokerOf(def)->planner.min_bits, 3);
  EXPECT_EQ(BrokerOf(def)->planner.max_bits, 8);
  EXPECT_EQ(DecodeOf(def, "d")->worker.lower_floors.min_bits, 3);
  EXPECT_FALSE(DecodeOf(def, "d")->worker.plans_at_request_boundaries);
  // No planner: the decode workers keep their own floors (the defaults, 3..8, no mean floor),
  // whatever the broker's planner map says.
  auto off = WriteTemp("planner_off.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                           "broker: {store: s.apw, planner: {min_bits: 5}}\ndecode: [{id: d}]\n");
  ASSERT_TRUE(LoadClusterConfig(off, "/bin").ok());
  EXPECT_EQ(DecodeOf(off, "d")->worker.lower_floors.min_bits, 3);
  EXPECT_FALSE(DecodeOf(off, "d")->worker.planner_lowers) << "no planner: no floors told";
  for (const char* text : {"{min_bits: 6, max_bits: 5}", "{min_bits: 2}", "{max_bits: 9}", "{min_mean_bits: 8.5}",
                           "{min_mean_bits: 5, max_mean_bits: 4.5}", "{max_bits: 6, max_mean_bits: 7}"}) {
    auto bad = BrokerOf(WriteTemp("planner_bits_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n"
                                                                       "decode: [{id: d}]\n"
                                                                       "broker: {store: s.apw, planner: ") +
                                                               text + "}\n"));
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find("bits"), std::string::npos) << bad.status().ToString();
  }
}

TEST(ClusterConfig, BadFilesNameTheProblem) {
  struct Case {
    const char* yaml;
    const char* expect;
  } cases[] = {
      {"prefill: [{id: p}]\ndecode: [{id: d}]\n", "model_dir"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\nrouter: {port: 70000}\n", "router.port"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: p}]\n", "used twice"},
      {"model_dir: m\nprefill: [{id: p, metrics_port: 8000}]\ndecode: [{id: d}]\n", "used twice"},
      {"model_dir: m\nprefill: []\ndecode: [{id: d}]\n", "prefill"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\nroutr: {}\n", "routr"},
      {"model_dir: m\nprefill: [{kv_blocks: 2}]\ndecode: [{id: d}]\n", "prefill[0]: id: required key is missing"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: 'decode 0'}]\n", "has ' ' at byte 6"},
      {"model_dir: m\nprefill: [{id: \"p\\x01\"}]\ndecode: [{id: d}]\n", "has '\\x01' at byte 1"},
      {"model_dir: [unclosed\n", "local"},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string path = WriteTemp("bad" + std::to_string(i++) + ".yaml", c.yaml);
    auto cfg = LoadClusterConfig(path, "/bin");
    ASSERT_FALSE(cfg.ok()) << c.yaml;
    EXPECT_NE(cfg.status().message().find(path), std::string::npos) << cfg.status().message();
    if (std::string(c.expect) != "local") {
      EXPECT_NE(cfg.status().message().find(c.expect), std::string::npos)
          << "yaml:\n" << c.yaml << "error: " << cfg.status().message();
    }
  }
}

TEST(Supervisor, RestartsWithBackoffAndDrainsOnStop) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/supervisor-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 50;
  policy.max_backoff_ms = 200;
  policy.stable_after_ms = 100000;
  policy.fail_fast_exits = 0;  // restarted forever: this test is about the backoff
  std::vector<ProcessSpec> specs = {
      {"crasher", {"/bin/sh", "-c", "echo started; exit 3"}, 1},
      {"steady", {"/bin/sh", "-c", "trap 'echo drained; exit 0' TERM; while true; do sleep 0.05; done"}, 0},
  };
  Supervisor sup(specs, policy, run_dir, 5000);
  ASSERT_TRUE(sup.Start().ok());
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500)) {
    sup.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto& states = sup.states();
  ASSERT_EQ(states[0].spec.name, "steady");  // sorted by start order
  EXPECT_EQ(states[0].restarts, 0);
  // Backoff 50, 100, 200, 200, ... ms: within 1.5 s a handful of restarts, not hundreds.
  EXPECT_GE(states[1].restarts, 3);
  EXPECT_LE(states[1].restarts, 12);
  EXPECT_EQ(states[1].backoff_ms, 200);
  sup.Stop();
  for (const auto& s : sup.states()) EXPECT_EQ(s.pid, -1);
  std::ifstream log(run_dir + "/steady.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("drained"), std::string::npos);  // it got SIGTERM, not SIGKILL
}

// The state file records every child with its pid and start time from Start() on, follows a
// restart to the new pid, and records the node stopped after Stop().
TEST(Supervisor, RecordsItsChildrenInTheStateFile) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/state-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 10;
  std::vector<ProcessSpec> specs = {
      {"second", {"/bin/sh", "-c", "while true; do sleep 0.05; done"}, 1},
      {"first", {"/bin/sh", "-c", "while true; do sleep 0.05; done"}, 0},
  };
  Supervisor sup(specs, policy, run_dir, 5000);
  ASSERT_TRUE(sup.Start().ok());
  EXPECT_EQ(sup.state_path(), run_dir + "/pw-cluster.state");
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    auto st = ReadLauncherState(sup.state_path());
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->launcher_pid, getpid());
    ASSERT_EQ(st->processes.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& rec = st->processes[i];
      const auto& s = sup.states()[i];
      EXPECT_EQ(rec.name, s.spec.name);
      EXPECT_EQ(rec.pid, s.pid);
      EXPECT_EQ(rec.restarts, s.restarts);
      if (s.pid > 0) {
        auto ticks = ProcessStartTicks(s.pid);
        ASSERT_TRUE(ticks.ok()) << ticks.status().ToString();
        EXPECT_EQ(rec.start_ticks, *ticks);
        EXPECT_TRUE(IsRecordedProcessRunning(rec.pid, rec.start_ticks));
      }
    }
  };
  check("started");
  EXPECT_EQ(sup.states()[0].spec.name, "first");
  const pid_t old_pid = sup.states()[1].pid;
  ASSERT_GT(old_pid, 0);
  kill(old_pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  while ((sup.states()[1].restarts < 1 || sup.states()[1].pid <= 0) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    sup.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(sup.states()[1].restarts, 1);
  EXPECT_NE(sup.states()[1].pid, old_pid);
  check("restarted");
  sup.Stop();
  auto st = ReadLauncherState(sup.state_path());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (const auto& p : st->processes) {
    EXPECT_EQ(p.pid, -1) << p.name;
    EXPECT_EQ(p.start_ticks, 0u) << p.name;
  }
  EXPECT_EQ(st->processes[1].restarts, 1);
}

// An unwritable run directory stops Start() before any process runs: status could not see it.
TEST(Supervisor, UnwritableStateFileIsAStartError) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/state-unwritable";
  std::filesystem::remove_all(run_dir);
  std::filesystem::create_directories(run_dir + "/pw-cluster.state");  // a directory: no rename
  Supervisor sup({{"p", {"/bin/sh", "-c", "exit 0"}, 0}}, RestartPolicy{}, run_dir, 100);
  Status st = sup.Start();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find(run_dir + "/pw-cluster.state"), std::string::npos) << st.message();
  EXPECT_EQ(sup.states()[0].pid, -1);
}

// A process that exits right after its start 3 times in a row stops the node: Run() returns
// (bounded: backoff 20, 40 ms) with its name, command line and last log lines, and the other
// processes are drained.
TEST(Supervisor, ProcessThatKeepsExitingAtStartStopsTheNode) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/failfast-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 20;
  policy.fail_fast_ms = 5000;
  policy.fail_fast_exits = 3;
  std::vector<ProcessSpec> specs = {
      {"steady", {"/bin/sh", "-c", "trap 'echo drained; exit 0' TERM; while true; do sleep 0.05; done"}, 0},
      {"prefill-0", {"/bin/sh", "-c", "echo loading; echo 'model.safetensors: truncated' >&2; exit 4"}, 1},
  };
  Supervisor sup(specs, policy, run_dir, 5000);
  ASSERT_TRUE(sup.Start().ok());
  std::atomic<bool> stop{false};
  const auto t0 = std::chrono::steady_clock::now();
  Status st = sup.Run(stop);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_EQ(st.code(), StatusCode::kUnavailable);
  const std::string& m = st.message();
  EXPECT_NE(m.find("prefill-0 exited 3 times within 5000 ms of starting (last: code 4"),
            std::string::npos) << m;
  EXPECT_NE(m.find("command: /bin/sh -c echo loading;"), std::string::npos) << m;
  EXPECT_NE(m.find("  | model.safetensors: truncated"), std::string::npos) << m;
  EXPECT_EQ(sup.states()[1].restarts, 2);
  for (const auto& s : sup.states()) EXPECT_EQ(s.pid, -1);
  std::ifstream log(run_dir + "/steady.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("drained"), std::string::npos);
}

// A process that dies after running longer than fail_fast_ms is restarted, every time.
TEST(Supervisor, ProcessThatDiesLaterIsStillRestarted) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/later-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 10;
  policy.max_backoff_ms = 10;
  policy.fail_fast_ms = 100;
  policy.fail_fast_exits = 2;
  Supervisor sup({{"worker", {"/bin/sh", "-c", "sleep 0.15; exit 1"}, 0}}, policy, run_dir, 1000);
  ASSERT_TRUE(sup.Start().ok());
  const auto t0 = std::chrono::steady_clock::now();
  while (sup.states()[0].restarts < 4 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    sup.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(sup.failure().ok()) << sup.failure().message();
  EXPECT_GE(sup.states()[0].restarts, 4);
  sup.Stop();
}

TEST(LogTail, LastLines) {
  const std::string path = WriteTemp("tail.log", "a\nb\nc\nd\n");
  EXPECT_EQ(LogTail(path, 2), "c\nd");
  EXPECT_EQ(LogTail(path, 10), "a\nb\nc\nd");
  EXPECT_EQ(LogTail(WriteTemp("one.log", "only"), 3), "only");
  EXPECT_EQ(LogTail(WriteTemp("empty.log", ""), 3), "");
  EXPECT_EQ(LogTail("/nonexistent/x.log", 3), "");
}

TEST(Supervisor, MissingBinaryIsAClearError) {
  Supervisor sup({{"ghost", {"/nonexistent/pw-ghost"}, 0}}, RestartPolicy{},
                 std::string(PW_BINARY_DIR) + "/test-tmp/ghost-run", 100);
  Status st = sup.Start();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("/nonexistent/pw-ghost"), std::string::npos);
}

TEST(ClusterConfig, PlannerResidualsReachTheBroker) {
  auto on = WriteTemp("residuals.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n"
                                        "broker: {store: s.apw, planner: {enabled: true, residuals: h.pwrh}}\n");
  auto off = WriteTemp("residuals_off.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n"
                                             "broker: {store: s.apw, planner: {enabled: true, residuals: h.pwrh, "
                                             "use_residuals: false}}\n");
  ASSERT_TRUE(LoadClusterConfig(on, "/bin").ok());
  ASSERT_TRUE(LoadClusterConfig(off, "/bin").ok());
  EXPECT_EQ(BrokerOf(on)->planner_residuals, "h.pwrh");
  EXPECT_TRUE(BrokerOf(on)->planner.use_prompt_residuals);
  EXPECT_FALSE(BrokerOf(off)->planner.use_prompt_residuals);
}

}  // namespace
}  // namespace pw::cluster
