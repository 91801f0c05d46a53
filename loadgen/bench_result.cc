#include "loadgen/bench_result.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace pw::loadgen {

namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

bool ParseDouble(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return *end == '\0' && std::isfinite(*v);
}

const char* MetricTitle(const std::string& m) {
  if (m == "ttft") return "Time to First Token";
  if (m == "tpot") return "Time per Output Token (excl. 1st token)";
  if (m == "itl") return "Inter-token Latency";
  return "End-to-end Latency";
}
std::string MetricUpper(const std::string& m) {
  std::string u = m;
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

}  // namespace

Result<SloSpec> ParseGoodput(const std::vector<std::string>& items) {
  SloSpec slo;
  for (const auto& it : items) {
    const size_t colon = it.find(':');
    double v = 0;
    if (colon == std::string::npos || !ParseDouble(it.substr(colon + 1), &v) || v <= 0) {
      return InvalidArgument("--goodput '" + it + "': want KEY:MS with KEY ttft, tpot or e2el");
    }
    const std::string k = it.substr(0, colon);
    if (k == "ttft")
      slo.ttft_ms = v;
    else if (k == "tpot")
      slo.tpot_ms = v;
    else if (k == "e2el")
      slo.e2el_ms = v;
    else
      return InvalidArgument("--goodput '" + it + "': KEY must be ttft, tpot or e2el");
  }
  return slo;
}

Status ParsePercentileOptions(const std::string& metrics, const std::string& percentiles,
                              SummaryOptions* out) {
  out->percentile_metrics = Split(metrics, ',');
  if (out->percentile_metrics.empty()) return InvalidArgument("--percentile-metrics is empty");
  for (const auto& m : out->percentile_metrics) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return InvalidArgument("--percentile-metrics: '" + m +
                             "' is not one of ttft, tpot, itl, e2el");
    }
  }
  out->percentiles.clear();
  for (const auto& p : Split(percentiles, ',')) {
    double v = 0;
    if (!ParseDouble(p, &v) || v < 0 || v > 100) {
      return InvalidArgument("--metric-percentiles: '" + p + "' is not a number in [0, 100]");
    }
    out->percentiles.push_back(v);
  }
  if (out->percentiles.empty()) return InvalidArgument("--metric-percentiles is empty");
  return Status::Ok();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double k = (static_cast<double>(v.size()) - 1) * q / 100.0;
  const auto lo = static_cast<size_t>(std::floor(k));
  const auto hi = static_cast<size_t>(std::ceil(k));
  return v[lo] + (v[hi] - v[lo]) * (k - static_cast<double>(lo));
}

std::string PercentileKey(double q) {
  if (q == std::floor(q)) return std::to_string(static_cast<int64_t>(q));
  std::ostringstream s;
  s << q;
  return s.str();
}

nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s,
                         int64_t max_in_flight, const SummaryOptions& opts) {
  using nlohmann::json;
  std::map<std::string, std::vector<double>> ms;  // metric -> values in ms
  int64_t completed = 0, failed = 0, cancelled = 0, in_tokens = 0, out_tokens = 0, good = 0;
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), e2els = json::array(), errors = json::array(), texts = json::array(),
       sent = json::array(), scheduled = json::array();
  std::map<std::string, int64_t> by_kind;
  for (const auto& r : records) {
    input_lens.push_back(r.input_len);
    output_lens.push_back(r.success ? r.output_len : 0);
    ttfts.push_back(r.success ? r.ttft_s : 0.0);
    itls.push_back(r.success ? json(r.itl_s) : json::array());
    e2els.push_back(r.success ? r.latency_s : 0.0);
    errors.push_back(r.success ? "" : r.error_kind + ": " + r.error);
    texts.push_back(r.text);
    sent.push_back(r.sent_s);
    scheduled.push_back(r.scheduled_s);
    if (!r.success && r.error_kind == "cancelled") {  // in flight when the duration's drain ended
      ++cancelled;
      continue;
    }
    if (!r.success) {
      ++failed;
      ++by_kind[r.error_kind];
      continue;
    }
    ++completed;
    in_tokens += r.input_len;
    out_tokens += r.output_len;
    ms["ttft"].push_back(r.ttft_s * 1e3);
    ms["e2el"].push_back(r.latency_s * 1e3);
    for (double g : r.itl_s) ms["itl"].push_back(g * 1e3);
    double tpot = 0;
    if (r.output_len > 1) {
      tpot = (r.latency_s - r.ttft_s) / (r.output_len - 1) * 1e3;
      ms["tpot"].push_back(tpot);
    }
    const SloSpec& s = opts.goodput;
    if (s.any() && (s.ttft_ms <= 0 || r.ttft_s * 1e3 <= s.ttft_ms) &&
        (s.tpot_ms <= 0 || tpot <= s.tpot_ms) &&
        (s.e2el_ms <= 0 || r.latency_s * 1e3 <= s.e2el_ms)) {
      ++good;
    }
  }
  const double d = duration_s > 0 ? duration_s : 1e-9;
  json out;
  out["duration"] = duration_s;
  out["completed"] = completed;
  out["failed"] = failed;
  out["cancelled"] = cancelled;
  out["total_input_tokens"] = in_tokens;
  out["total_output_tokens"] = out_tokens;
  out["request_throughput"] = static_cast<double>(completed) / d;
  out["request_goodput"] = opts.goodput.any() ? json(static_cast<double>(good) / d) : json(nullptr);
  out["goodput_fraction"] = opts.goodput.any() && !records.empty()
                                ? json(static_cast<double>(good) / records.size())
                                : json(nullptr);
  out["output_throughput"] = static_cast<double>(out_tokens) / d;
  out["total_token_throughput"] = static_cast<double>(in_tokens + out_tokens) / d;
  out["max_concurrent_requests"] = max_in_flight;
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    const auto& v = ms[m];
    const double mean = v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    const std::string k = m;
    out["mean_" + k + "_ms"] = mean;
    out["median_" + k + "_ms"] = Percentile(v, 50);
    out["std_" + k + "_ms"] = v.empty() ? 0 : std::sqrt(var / v.size());
    const bool listed = std::find(opts.percentile_metrics.begin(), opts.percentile_metrics.end(),
                                  k) != opts.percentile_metrics.end();
    // Percentiles of the listed metrics (vLLM), and p50/p90/p99 of every metric (ours, for the
    // plots and tables).
    std::vector<double> qs = listed ? opts.percentiles : std::vector<double>{};
    for (double q : {50.0, 90.0, 99.0}) {
      if (std::find(qs.begin(), qs.end(), q) == qs.end()) qs.push_back(q);
    }
    for (double q : qs) out["p" + PercentileKey(q) + "_" + k + "_ms"] = Percentile(v, q);
  }
  out["errors_by_kind"] = by_kind;
  out["input_lens"] = std::move(input_lens);
  out["output_lens"] = std::move(output_lens);
  out["ttfts"] = std::move(ttfts);
  out["itls"] = std::move(itls);
  out["e2els"] = std::move(e2els);
  out["errors"] = std::move(errors);
  out["generated_texts"] = std::move(texts);
  out["sent_times"] = std::move(sent);
  out["scheduled_times"] = std::move(scheduled);
  return out;
}

std::string FormatTable(const nlohmann::json& s, const SummaryOptions& opts) {
  std::string o;
  char line[160];
  auto row = [&](const char* label, const std::string& value) {
    std::snprintf(line, sizeof(line), "%-40s %-10s\n", label, value.c_str());
    o += line;
  };
  auto num = [](double v, int prec) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.*f", prec, v);
    return std::string(b);
  };
  auto title = [&](const std::string& t, char fill) {
    const int w = 50;
    const int pad = std::max(0, w - static_cast<int>(t.size()) - 2);
    std::string l(pad / 2, fill);
    std::string r(pad - pad / 2, fill);
    o += l + (t.empty() ? std::string(2, fill) : " " + t + " ") + r + "\n";
  };
  title("Serving Benchmark Result", '=');
  row("Successful requests:", std::to_string(s["completed"].get<int64_t>()));
  row("Failed requests:", std::to_string(s["failed"].get<int64_t>()));
  if (s.value("cancelled", int64_t{0}) > 0) {
    row("Cancelled at the drain's end:", std::to_string(s["cancelled"].get<int64_t>()));
  }
  if (s.value("not_sent", int64_t{0}) > 0) {
    row("Not sent (past --duration):", std::to_string(s["not_sent"].get<int64_t>()));
  }
  if (s.contains("max_concurrency") && !s["max_concurrency"].is_null()) {
    row("Maximum request concurrency:", std::to_string(s["max_concurrency"].get<int64_t>()));
  }
  row("Benchmark duration (s):", num(s["duration"].get<double>(), 2));
  row("Total input tokens:", std::to_string(s["total_input_tokens"].get<int64_t>()));
  row("Total generated tokens:", std::to_string(s["total_output_tokens"].get<int64_t>()));
  row("Request throughput (req/s):", num(s["request_throughput"].get<double>(), 2));
  if (!s["request_goodput"].is_null()) {
    row("Request goodput (req/s):", num(s["request_goodput"].get<double>(), 2));
    row("Goodput fraction of requests (%):", num(s["goodput_fraction"].get<double>() * 100, 1));
  }
  row("Output token throughput (tok/s):", num(s["output_throughput"].get<double>(), 2));
  row("Total Token throughput (tok/s):", num(s["total_token_throughput"].get<double>(), 2));
  row("Peak concurrent requests:", std::to_string(s["max_concurrent_requests"].get<int64_t>()));
  for (const auto& m : opts.percentile_metrics) {
    title(MetricTitle(m), '-');
    const std::string u = MetricUpper(m);
    row(("Mean " + u + " (ms):").c_str(), num(s["mean_" + m + "_ms"].get<double>(), 2));
    row(("Median " + u + " (ms):").c_str(), num(s["median_" + m + "_ms"].get<double>(), 2));
    for (double q : opts.percentiles) {
      const std::string k = PercentileKey(q);
      row(("P" + k + " " + u + " (ms):").c_str(),
          num(s["p" + k + "_" + m + "_ms"].get<double>(), 2));
    }
  }
  if (!s["errors_by_kind"].empty()) {
    title("Errors", '-');
    for (const auto& [k, v] : s["errors_by_kind"].items()) {
      row((k + ":").c_str(), std::to_string(v.get<int64_t>()));
    }
  }
  o += std::string(50, '=') + "\n";
  return o;
}

}  // namespace pw::loadgen
