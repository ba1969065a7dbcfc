// Output of kvq eval: one JSON object with every number (what the referee aggregates) and readable tables.
#include <fmt/format.h>

#include "common/version.h"
#include "eval/evaluator.h"

namespace kvq {

namespace {

nlohmann::json interval_json(const Interval& i) { return nlohmann::json::array({i.lo, i.hi}); }

nlohmann::json codec_json(const CodecSpec& s) {
  return {{"type", s.type}, {"group", s.group}, {"clip", s.clip}, {"per_channel", s.per_channel}};
}

std::string depth_label(double d) { return fmt::format("{:.1f}", d); }

}  // namespace

nlohmann::json report_json(const EvalReport& r) {
  using nlohmann::json;
  const EvalConfig& c = r.config;
  json j;
  j["kvq"] = {{"version", KVQ_VERSION}, {"git", git_describe()}};
  j["model"] = {{"dir", r.model_dir}, {"fingerprint", r.model_fingerprint}};
  json fp = json::object();
  for (size_t i = 0; i < c.ctx.size() && i < r.footprint.size(); ++i)
    fp[std::to_string(c.ctx[i])] = {{"kv_bits_effective", r.footprint[i].bits_per_element},
                                    {"kv_bits_quantized", r.footprint[i].quant_bits_per_element},
                                    {"bytes_per_token_per_layer", r.footprint[i].bytes_per_token_per_layer}};
  j["cache"] = {{"description", r.cache.describe()}, {"k", codec_json(r.cache.k)},   {"v", codec_json(r.cache.v)},
                {"sink", r.cache.sink},               {"recent", r.cache.recent},      {"window", r.cache.window},
                {"page_tokens", r.cache.page_tokens}, {"chunk", r.cache.max_chunk},    {"footprint", fp},
                {"demote_block", r.cache.demote_block},  // 0: the codecs' own block
                {"transform", r.cache.transform != nullptr}, {"skip_layers", r.cache.skip_layers},
                {"reference", bf16_reference_cache(r.cache).describe()}};
  j["config"] = {{"tasks", c.tasks},           {"ctx", c.ctx},
                 {"windows", c.windows},       {"passkey_trials", c.passkey_trials},
                 {"depths", c.depths},         {"bootstrap_resamples", c.bootstrap},
                 {"confidence", 0.95},         {"decode_faithful", true}};
  json seeds = {{"seed", c.seed}};
  for (const PasskeyEntry& p : r.passkey) seeds["passkey_" + std::to_string(p.result.ctx)] = p.seed;
  j["seeds"] = seeds;
  json data = json::array();
  for (size_t i = 0; i < r.domains.size(); ++i)
    data.push_back({{"domain", r.domains[i].name},
                    {"file", r.domains[i].path},
                    {"sha256", r.domains[i].sha256},
                    {"bytes", r.domains[i].bytes},
                    {"tokens", i < r.domain_tokens.size() ? r.domain_tokens[i] : 0}});
  j["data"] = data;

  json results = json::object();
  if (c.has("ppl")) {
    json ppl = json::object();
    for (const PplEntry& e : r.ppl) {
      json o = {{"ppl", e.ppl}, {"ci95", interval_json(e.ci)}, {"windows", e.window_nll.size()},
                {"tokens", e.tokens}, {"window_nll", e.window_nll}, {"prompt_tokens", e.prompt_tokens}};
      if (e.ppl_bf16 > 0) o["ppl_bf16"] = e.ppl_bf16;
      if (e.tail_prompt_tokens > 0)  // the same windows' targets at positions >= T (EvalConfig::tail_fraction)
        o["tail"] = {{"prompt_tokens", e.tail_prompt_tokens},
                     {"tokens", int64_t(e.window_nll_tail.size()) * scored_targets(e.ctx, e.tail_prompt_tokens)},
                     {"window_nll", e.window_nll_tail}};
      ppl[std::to_string(e.ctx)][e.domain] = o;
    }
    results["ppl"] = ppl;
  }
  if (c.has("kl")) {
    json kl = json::object();
    // The per-window sums of the view f into o (window_kl_sum, window_top1_agree, window_tokens).
    auto window_arrays = [](const KlEntry& e, FidelityFields f, json& o) {
      json kl_sum = json::array(), agree = json::array(), tokens = json::array();
      for (const WindowFidelity& w : e.per_window) {
        kl_sum.push_back(w.*f.kl);
        agree.push_back(w.*f.agree);
        tokens.push_back(w.*f.tokens);
      }
      o["window_kl_sum"] = kl_sum, o["window_top1_agree"] = agree, o["window_tokens"] = tokens;
    };
    for (const KlEntry& e : r.kl) {
      json o = {{"kl_mean", e.kl.estimate}, {"kl_ci95", interval_json(e.kl)}, {"top1", e.top1.estimate},
                {"top1_ci95", interval_json(e.top1)}, {"windows", e.windows}, {"tokens", e.tokens},
                {"prompt_tokens", e.prompt_tokens}};
      window_arrays(e, kWholeWindow, o);
      if (e.tail_prompt_tokens > 0) {  // the same windows' rows predicting positions >= T (EvalConfig::tail_fraction)
        json t = {{"prompt_tokens", e.tail_prompt_tokens}, {"tokens", e.tail_tokens},
                  {"kl_mean", e.kl_tail.estimate},         {"kl_ci95", interval_json(e.kl_tail)},
                  {"top1", e.top1_tail.estimate},          {"top1_ci95", interval_json(e.top1_tail)}};
        window_arrays(e, kWindowTail, t);
        o["tail"] = t;
      }
      kl[std::to_string(e.ctx)][e.domain] = o;
    }
    results["kl"] = kl;
  }
  if (c.has("passkey")) {
    json pk = json::object();
    for (const PasskeyEntry& p : r.passkey) {
      json by = json::object();
      for (size_t i = 0; i < p.result.by_depth.size(); ++i) {
        const PasskeyCell& cell = p.result.by_depth[i];
        by[depth_label(cell.depth)] = {{"accuracy", p.by_depth[i].estimate}, {"ci95", interval_json(p.by_depth[i])},
                                       {"correct", cell.correct},            {"trials", cell.trials},
                                       {"keys", cell.keys},                  {"trial_correct", cell.correct_by_trial}};
      }
      pk[std::to_string(p.result.ctx)] = {{"accuracy", p.accuracy.estimate}, {"ci95", interval_json(p.accuracy)},
                                          {"correct", p.result.correct},      {"trials", p.result.trials},
                                          {"by_depth", by},                   {"seconds", p.result.seconds}};
    }
    results["passkey"] = pk;
  }
  if (c.has("layers")) {
    json ly = json::object();
    for (const LayerEntry& e : r.layers) {
      json rows = json::array();
      for (size_t l = 0; l < e.sums.attn_ref_sq.size(); ++l)
        rows.push_back({{"layer", l},
                        {"attn_out_rel_err", e.sums.attn_local(int(l))},
                        {"attn_out_rel_err_e2e", e.sums.attn_e2e(int(l))},
                        {"hidden_rel_err", e.sums.hidden(int(l))}});
      ly[std::to_string(e.ctx)] = {{"tokens", e.sums.tokens}, {"per_layer", rows}};
    }
    results["layers"] = ly;
  }
  j["results"] = results;
  j["runner"] = r.runner;
  j["seconds"] = r.seconds;
  return j;
}

std::string report_table(const EvalReport& r) {
  std::string s;
  s += fmt::format("kvq eval  model {} ({})\n", r.model_dir, r.model_fingerprint.substr(0, 16));
  s += fmt::format("cache     {}\n", r.cache.describe());
  s += fmt::format("runner    {}\n", r.runner);
  for (size_t i = 0; i < r.config.ctx.size() && i < r.footprint.size(); ++i)
    s += fmt::format("          ctx {}: {:.3f} effective bits/element ({:.3f} quantized region)\n", r.config.ctx[i],
                     r.footprint[i].bits_per_element, r.footprint[i].quant_bits_per_element);
  if (!r.ppl.empty()) {
    s += "\nperplexity (bootstrap 95% CI over windows)\n";
    s += fmt::format("{:>6}  {:<10} {:>10} {:>22} {:>10} {:>8} {:>10}\n", "ctx", "domain", "ppl", "95% CI", "bf16",
                     "windows", "tokens");
    for (const PplEntry& e : r.ppl)
      s += fmt::format("{:>6}  {:<10} {:>10.4f} {:>22} {:>10} {:>8} {:>10}\n", e.ctx, e.domain, e.ppl,
                       fmt::format("[{:.4f}, {:.4f}]", e.ci.lo, e.ci.hi),
                       e.ppl_bf16 > 0 ? fmt::format("{:.4f}", e.ppl_bf16) : "-", e.window_nll.size(), e.tokens);
  }
  if (!r.kl.empty()) {
    s += "\nKL(p_bf16 || p_method) per token and top-1 agreement (bootstrap 95% CI over windows)\n";
    s += fmt::format("{:>6}  {:<10} {:>12} {:>26} {:>9} {:>20} {:>10}\n", "ctx", "domain", "KL (nats)", "95% CI",
                     "top-1", "95% CI", "tokens");
    for (const KlEntry& e : r.kl)
      s += fmt::format("{:>6}  {:<10} {:>12.6f} {:>26} {:>9.5f} {:>20} {:>10}\n", e.ctx, e.domain, e.kl.estimate,
                       fmt::format("[{:.6f}, {:.6f}]", e.kl.lo, e.kl.hi), e.top1.estimate,
                       fmt::format("[{:.4f}, {:.4f}]", e.top1.lo, e.top1.hi), e.tokens);
  }
  if (!r.passkey.empty()) {
    s += "\npasskey retrieval (exact match of greedy decoding; Wilson 95% CI)\n";
    for (const PasskeyEntry& p : r.passkey) {
      s += fmt::format("{:>6}  {:6.1f}%  [{:.1f}%, {:.1f}%]  {}/{}  by depth:", p.result.ctx, 100 * p.accuracy.estimate,
                       100 * p.accuracy.lo, 100 * p.accuracy.hi, p.result.correct, p.result.trials);
      for (const PasskeyCell& cell : p.result.by_depth)
        s += fmt::format(" {}:{}/{}", depth_label(cell.depth), cell.correct, cell.trials);
      s += "\n";
    }
  }
  if (!r.layers.empty()) {
    s += "\nper-layer relative errors vs BF16 (attn: post-W_O attention output, own = BF16 layer inputs, "
         "e2e = free-running; hidden: residual after the layer)\n";
    for (const LayerEntry& e : r.layers) {
      s += fmt::format("ctx {} ({} tokens)\n{:>6} {:>14} {:>14} {:>14}\n", e.ctx, e.sums.tokens, "layer", "attn own",
                       "attn e2e", "hidden");
      for (size_t l = 0; l < e.sums.attn_ref_sq.size(); ++l)
        s += fmt::format("{:>6} {:>14.6e} {:>14.6e} {:>14.6e}\n", l, e.sums.attn_local(int(l)),
                         e.sums.attn_e2e(int(l)), e.sums.hidden(int(l)));
    }
  }
  s += fmt::format("\n{:.1f} s\n", r.seconds);
  return s;
}

}  // namespace kvq
