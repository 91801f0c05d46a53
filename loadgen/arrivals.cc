#include "loadgen/arrivals.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

namespace pw::loadgen {

namespace {

int32_t DrawLen(std::mt19937_64& rng, int32_t len, double ratio) {
  if (ratio <= 0) return std::max(1, len);
  const auto lo = static_cast<int32_t>(std::floor(len * (1 - ratio)));
  const auto hi = static_cast<int32_t>(std::ceil(len * (1 + ratio)));
  return std::max(1, std::uniform_int_distribution<int32_t>(lo, hi)(rng));
}

// Days from 1970-01-01 to y-m-d (proleptic Gregorian; H. Hinnant's days_from_civil).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fraction]" -> seconds; false when malformed.
bool ParseTimestamp(const std::string& s, double* out) {
  int y, mo, d, h, mi;
  char sep;
  double sec;
  int consumed = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%c%2d:%2d:%lf%n", &y, &mo, &d, &sep, &h, &mi, &sec,
                  &consumed) != 7 ||
      static_cast<size_t>(consumed) != s.size() || (sep != ' ' && sep != 'T') || mo < 1 ||
      mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec >= 61) {
    return false;
  }
  *out = static_cast<double>(DaysFromCivil(y, mo, d)) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
  return true;
}

bool ParseCount(const std::string& s, int32_t* out) {
  if (s.empty() || s.size() > 9) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = static_cast<int32_t>(v);
  return true;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

}  // namespace

Status ValidateRandomArrivals(const RandomArrivalOptions& o) {
  if (o.num_prompts < 1 && o.duration_s <= 0) {
    return InvalidArgument("--num-prompts must be >= 1 (or give --duration)");
  }
  if (!(o.request_rate > 0)) return InvalidArgument("--request-rate must be > 0 (or inf)");
  if (!(o.burstiness > 0) || !std::isfinite(o.burstiness)) {
    return InvalidArgument("--burstiness must be a finite number > 0");
  }
  if (o.ramp_end_rps > 0 || o.ramp_start_rps > 0) {
    if (!(o.ramp_start_rps > 0) || !(o.ramp_end_rps > 0) || !std::isfinite(o.ramp_start_rps) ||
        !std::isfinite(o.ramp_end_rps)) {
      return InvalidArgument(
          "a ramp-up needs finite --ramp-up-start-rps and --ramp-up-end-rps > 0");
    }
  }
  if (o.input_len < 1 || o.output_len < 1) {
    return InvalidArgument("--random-input-len and --random-output-len must be >= 1");
  }
  if (o.range_ratio < 0 || o.range_ratio >= 1) {
    return InvalidArgument("--random-range-ratio must be in [0, 1)");
  }
  if (o.duration_s > 0 && o.num_prompts < 1 && !std::isfinite(o.request_rate) &&
      o.ramp_end_rps <= 0) {
    return InvalidArgument("--duration with --request-rate inf needs --num-prompts");
  }
  return Status::Ok();
}

std::vector<PlannedRequest> PlanRandomArrivals(const RandomArrivalOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::mt19937_64 len_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
  const bool ramp = o.ramp_end_rps > 0;
  const int64_t n_max = o.num_prompts > 0 ? o.num_prompts : std::numeric_limits<int64_t>::max();
  // For a ramp with only a duration, the index runs over the requests the duration holds at the
  // mean rate.
  const int64_t ramp_n =
      o.num_prompts > 0
          ? o.num_prompts
          : std::max<int64_t>(
                2, static_cast<int64_t>(o.duration_s * 0.5 * (o.ramp_start_rps + o.ramp_end_rps)));
  std::vector<PlannedRequest> out;
  double t = 0;
  for (int64_t i = 0; i < n_max; ++i) {
    if (o.duration_s > 0 && t >= o.duration_s) break;
    out.push_back({t, DrawLen(len_rng, o.input_len, o.range_ratio),
                   DrawLen(len_rng, o.output_len, o.range_ratio)});
    double rate = o.request_rate;
    if (ramp) {
      const double f = ramp_n > 1 ? std::min(1.0, static_cast<double>(i) / (ramp_n - 1)) : 1.0;
      rate = o.ramp_start_rps + (o.ramp_end_rps - o.ramp_start_rps) * f;
    }
    if (std::isfinite(rate)) {
      std::gamma_distribution<double> gap(o.burstiness, 1.0 / (rate * o.burstiness));
      t += gap(rng);
    }
  }
  return out;
}

Result<std::vector<TraceRow>> ParseAzureTrace(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || Trim(line) != "TIMESTAMP,ContextTokens,GeneratedTokens") {
    return InvalidArgument(name +
                           ":1: expected the header "
                           "'TIMESTAMP,ContextTokens,GeneratedTokens' of an Azure LLM inference "
                           "trace, got '" +
                           Trim(line).substr(0, 80) + "'");
  }
  std::vector<TraceRow> rows;
  int64_t lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    line = Trim(line);
    if (line.empty()) continue;
    const size_t a = line.find(','), b = a == std::string::npos ? a : line.find(',', a + 1);
    const std::string where = name + ":" + std::to_string(lineno) + ": ";
    if (b == std::string::npos || line.find(',', b + 1) != std::string::npos) {
      return InvalidArgument(where + "expected 3 comma-separated fields, got '" + line + "'");
    }
    TraceRow r;
    if (!ParseTimestamp(Trim(line.substr(0, a)), &r.t_s)) {
      return InvalidArgument(where + "bad TIMESTAMP '" + line.substr(0, a) +
                             "' (want YYYY-MM-DD HH:MM:SS[.fraction])");
    }
    if (!ParseCount(Trim(line.substr(a + 1, b - a - 1)), &r.context_tokens) ||
        !ParseCount(Trim(line.substr(b + 1)), &r.generated_tokens)) {
      return InvalidArgument(where + "ContextTokens and GeneratedTokens must be integers >= 0");
    }
    if (!rows.empty() && r.t_s < rows.back().t_s) {
      return InvalidArgument(where + "timestamp goes backwards");
    }
    rows.push_back(r);
  }
  if (rows.empty()) return InvalidArgument(name + ": no rows after the header");
  return rows;
}

Result<std::vector<TraceRow>> LoadAzureTrace(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open trace '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ParseAzureTrace(ss.str(), path);
}

Status ValidateTraceOptions(const TraceOptions& o) {
  if (!(o.speedup > 0) || !std::isfinite(o.speedup)) {
    return InvalidArgument("--trace-speedup must be a finite number > 0");
  }
  if (!(o.window_start_s >= 0) || !(o.window_end_s > o.window_start_s)) {
    return InvalidArgument("--trace-window START:END needs 0 <= START < END (seconds)");
  }
  if (o.clip_context < 0 || o.clip_output < 0) {
    return InvalidArgument("--clip-context and --clip-output must be >= 0");
  }
  return Status::Ok();
}

std::vector<PlannedRequest> PlanTrace(const std::vector<TraceRow>& rows, const TraceOptions& o) {
  std::vector<PlannedRequest> out;
  if (rows.empty()) return out;
  const double t0 = rows.front().t_s;
  double first = -1;
  for (const auto& r : rows) {
    const double rel = r.t_s - t0;
    if (rel < o.window_start_s) continue;
    if (rel >= o.window_end_s) break;
    if (first < 0) first = rel;
    const double at = (rel - first) / o.speedup;
    if (o.duration_s > 0 && at >= o.duration_s) break;
    PlannedRequest p;
    p.at_s = at;
    p.input_len = std::max(
        1, o.clip_context > 0 ? std::min(r.context_tokens, o.clip_context) : r.context_tokens);
    p.output_len = std::max(
        1, o.clip_output > 0 ? std::min(r.generated_tokens, o.clip_output) : r.generated_tokens);
    out.push_back(p);
    if (o.max_requests > 0 && static_cast<int64_t>(out.size()) >= o.max_requests) break;
  }
  return out;
}

}  // namespace pw::loadgen
