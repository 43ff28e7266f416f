// peerserve bench: load generator against an OpenAI-compatible server (see
// serve/bench_client.h), in the manner of vLLM's benchmark_serving.
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "apps/command_registry.h"
#include "apps/whole_number_validator.h"
#include "base/output_file_check.h"
#include "serve/bench_client.h"

namespace peerserve {
namespace {

struct BenchCli {
  BenchOptions options;
  std::string request_rate = "inf";
  std::vector<std::string> goodput;
  std::string token_range;
  std::string json_path;
  bool no_progress = false;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return kExitFailure;
}

int run_bench_command(BenchCli cli) {
  BenchOptions& o = cli.options;
  std::string rate = cli.request_rate;
  for (char& c : rate) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (rate == "inf" || rate == "infinity") {
    o.request_rate = std::numeric_limits<double>::infinity();
  } else if (!parse_finite_number(cli.request_rate, &o.request_rate)) {
    return fail("--request-rate '" + cli.request_rate + "': expected a number or inf");
  }
  for (const std::string& slo : cli.goodput) {
    const size_t colon = slo.find(':');
    double value = 0;
    const bool number =
        colon != std::string::npos && parse_finite_number(slo.substr(colon + 1), &value);
    const std::string name = slo.substr(0, colon);
    if (!number || value <= 0 || (name != "ttft" && name != "tpot" && name != "e2el")) {
      return fail("--goodput '" + slo + "': expected ttft:MS, tpot:MS or e2el:MS (milliseconds)");
    }
    std::optional<double>& target = name == "ttft"   ? o.slo_ttft_ms
                                    : name == "tpot" ? o.slo_tpot_ms
                                                     : o.slo_e2el_ms;
    if (target) return fail("--goodput: " + name + " given twice");  // the last one won
    target = value;
  }
  if (!cli.token_range.empty()) {
    const size_t colon = cli.token_range.find(':');
    double low = 0, high = 0;
    const bool numbers = colon != std::string::npos &&
                         parse_finite_number(cli.token_range.substr(0, colon), &low) &&
                         parse_finite_number(cli.token_range.substr(colon + 1), &high);
    if (!numbers || low != std::floor(low) || high != std::floor(high) || std::fabs(low) > 1e9 ||
        std::fabs(high) > 1e9) {
      return fail("--token-range '" + cli.token_range + "': expected LO:HI (token ids)");
    }
    o.token_low = static_cast<int>(low);
    o.token_high = static_cast<int>(high);
  }
  if (Status s = o.validate(); !s.ok()) return fail(s.message());
  if (!cli.json_path.empty()) {  // before the benchmark, not after it
    if (Status s = check_output_file("--json", cli.json_path); !s.ok()) return fail(s.message());
  }

  BenchProgress progress;
  // A bar redraws in place on a terminal only; elsewhere one line at the end.
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  if (!cli.no_progress) {
    progress = [terminal](int32_t done, int32_t total) {
      if (!terminal) {
        if (done == total) std::fprintf(stderr, "sent %d/%d requests\n", done, total);
        return;
      }
      const int width = 40, filled = done * width / total;
      std::fprintf(stderr, "\r[%s%s] %d/%d", std::string(filled, '#').c_str(),
                   std::string(width - filled, ' ').c_str(), done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  }
  Result<BenchReport> report = run_bench(o, progress);
  if (!report.ok()) return fail(report.status().message());
  std::printf("%s", report->to_text(o).c_str());
  if (!cli.json_path.empty()) {
    std::ofstream out(cli.json_path);
    out << report->to_json(o).dump(2) << "\n";
    out.close();  // the last buffer is written here: check after it
    if (!out) return fail("cannot write " + cli.json_path);
  }
  return report->failed == 0 ? 0 : 1;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* sub = root.add_subcommand("bench",
                                  "Benchmark an OpenAI-compatible server (streamed "
                                  "completions, synthetic prompts): throughput, TTFT, TPOT, "
                                  "ITL (gaps between chunks with text, as vLLM's bench), TBT "
                                  "(per token, from stream_options.continuous_usage_stats "
                                  "where the server supports it), end-to-end latency");
  auto cli = std::make_shared<BenchCli>();
  BenchOptions& o = cli->options;
  sub->add_option("--url", o.url, "Server base URL (http://host:port)")->capture_default_str();
  sub->add_option("--endpoint", o.endpoint, "API route")->capture_default_str();
  sub->add_option("--model", o.model, "Model name (default: the server's first model)");
  sub->add_option("--api-key", o.api_key, "Bearer token");
  sub->add_option("--num-prompts", o.num_prompts, "Requests to send")->capture_default_str();
  sub->add_option("--request-rate", cli->request_rate,
                  "Poisson arrival rate in requests/s (inf = all at once)")
      ->capture_default_str();
  sub->add_option("--max-concurrency", o.max_concurrency, "Requests in flight at most (0 = no cap)")
      ->capture_default_str();
  sub->add_option("--input-len", o.input_len, "Prompt tokens per request")->capture_default_str();
  sub->add_option("--output-len", o.output_len, "Generated tokens per request (ignore_eos)")
      ->capture_default_str();
  sub->add_option("--prefix-share", o.prefix_share,
                  "Fraction of the prompt shared by all requests (0..1)")
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "Seed for prompts and arrivals")
      ->check(whole_number_at_most())
      ->capture_default_str();
  sub->add_option("--token-range", cli->token_range,
                  "Prompt token ids drawn from LO:HI (default 10:250)");
  sub->add_option("--goodput", cli->goodput, "SLOs for goodput: ttft:MS tpot:MS e2el:MS");
  sub->add_option("--json", cli->json_path, "Also write the results as JSON to this file");
  sub->add_flag("--no-progress", cli->no_progress, "No progress bar");
  sub->add_flag_function(
      "--no-continuous-usage", [o = &o](int64_t) { o->continuous_usage = false; },
      "Do not ask for stream_options.continuous_usage_stats (for servers that refuse "
      "it; then no TBT is reported)");
  sub->callback([cli] { set_command_exit_code(run_bench_command(*cli)); });
});

}  // namespace
}  // namespace peerserve
