#include "calib/calibrate.h"

#include <chrono>
#include <cmath>

#include "calib/optr.h"
#include "calib/oscar.h"
#include "calib/pnmix.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "rotation/hadamard.h"
#include "rotation/rotation_file.h"

namespace kvq {

namespace {

OptrMode optr_mode(const std::string& objective) {
  if (objective == "post-wo") return OptrMode::kTwoPhase;
  if (objective == "joint") return OptrMode::kJoint;
  if (objective == "pre-wo") return OptrMode::kPreWo;
  return OptrMode::kRecon;
}

// Everything captured from the calibration chunks, per layer and kv head.
struct Traces {
  int n_layers = 0, n_kv = 0, n_heads = 0, d = 0, n_q = 0;
  // [layer][head][chunk] (n, d) keys and values as the model computes them (post-RoPE, uncentred)
  std::vector<std::vector<std::vector<RowMat<float>>>> k, v;
  // [layer][head][chunk] (g·n_q, d) the chunk's last n_q queries of the g query heads, row j·n_q + i
  std::vector<std::vector<std::vector<RowMat<float>>>> q_last;
  std::vector<OscarAccumulator> oscar;      // [layer] query covariances (two-pass API, pass 1)
  std::vector<std::vector<double>> k_sum;   // [layer] [head * d] sum of keys
  long long n_tokens = 0;                   // tokens per (layer, head) in k_sum
};

class TraceTap final : public Model::LayerTap {
 public:
  TraceTap(Traces& t, int chunk_len) : t_(t), chunk_len_(chunk_len) {}
  void begin_chunk() {
    for (int l = 0; l < t_.n_layers; ++l)
      for (int h = 0; h < t_.n_kv; ++h) {
        t_.k[size_t(l)][size_t(h)].emplace_back(chunk_len_, t_.d);
        t_.v[size_t(l)][size_t(h)].emplace_back(chunk_len_, t_.d);
        t_.q_last[size_t(l)][size_t(h)].emplace_back((t_.n_heads / t_.n_kv) * t_.n_q, t_.d);
      }
    t_.n_tokens += chunk_len_;
  }

  void on_qkv(int layer, int pos0, int n, const float* q, const float* k, const float* v) override {
    const int d = t_.d, hq = t_.n_heads, hk = t_.n_kv, g = hq / hk;
    for (int h = 0; h < hk; ++h) {
      RowMat<float>& kc = t_.k[size_t(layer)][size_t(h)].back();
      RowMat<float>& vc = t_.v[size_t(layer)][size_t(h)].back();
      RowMat<float>& qc = t_.q_last[size_t(layer)][size_t(h)].back();
      RowMat<float> q_rows(size_t(g) * n, d);
      double* ks = t_.k_sum[size_t(layer)].data() + size_t(h) * d;
      for (int i = 0; i < n; ++i) {
        const int pos = pos0 + i;
        const float* kr = k + (size_t(i) * hk + h) * d;
        std::copy_n(kr, d, kc.row(pos).data());
        std::copy_n(v + (size_t(i) * hk + h) * d, d, vc.row(pos).data());
        for (int c = 0; c < d; ++c) ks[c] += kr[c];
        for (int j = 0; j < g; ++j) {
          const float* qr = q + (size_t(i) * hq + h * g + j) * d;
          std::copy_n(qr, d, q_rows.row(j * n + i).data());
          const int iq = pos - (chunk_len_ - t_.n_q);
          if (iq >= 0) std::copy_n(qr, d, qc.row(j * t_.n_q + iq).data());
        }
      }
      t_.oscar[size_t(layer)].add_queries(h, q_rows);
    }
  }

 private:
  Traces& t_;
  int chunk_len_;
};

RowMat<float> centred(const RowMat<float>& k, const float* mu) {
  RowMat<float> out = k;
  for (Eigen::Index r = 0; r < out.rows(); ++r)
    for (Eigen::Index c = 0; c < out.cols(); ++c) out(r, c) -= mu[c];
  return out;
}

void put_matrix(std::vector<float>& dst, int layer, int head, int n_kv, int d, const Eigen::MatrixXd& r) {
  float* out = dst.data() + (size_t(layer) * n_kv + head) * d * d;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) out[size_t(i) * d + j] = float(r(i, j));
}

}  // namespace

int capture_chunks(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg, Model::LayerTap& tap,
                   const std::function<void(int chunk)>& begin_chunk, const CalibrateProgress& progress) {
  const ModelConfig& mc = model.config();
  const int n_chunks = std::min(int(ids.size()), cfg.tokens) / cfg.chunk;
  KVQ_CHECK(n_chunks >= 1, "calibrate: the calibration text has {} tokens, fewer than one chunk of {}", ids.size(),
            cfg.chunk);
  CacheConfig bf16;
  bf16.max_chunk = std::min(512, cfg.chunk);
  KvCache cache(bf16, mc.n_layers, mc.n_kv_heads, mc.head_dim, cfg.chunk);
  std::vector<float> logits(size_t(mc.vocab_size));
  model.set_tap(&tap);
  try {
    for (int c = 0; c < n_chunks; ++c) {
      begin_chunk(c);
      const int seq = cache.new_sequence();
      for (int pos = 0; pos < cfg.chunk; pos += bf16.max_chunk) {
        const int n = std::min(bf16.max_chunk, cfg.chunk - pos);
        model.forward(cache, seq, ids.data() + size_t(c) * cfg.chunk + pos, n, logits.data(), false);
      }
      cache.free_sequence(seq);
      if (progress) progress("capture", c + 1, n_chunks);
    }
  } catch (...) {
    model.set_tap(nullptr);
    throw;
  }
  model.set_tap(nullptr);
  return n_chunks;
}

void CalibrateConfig::validate(const ModelConfig& m) const {
  KVQ_CHECK(method == "quarot" || method == "oscar" || method == "optr" || method == "pnmix" || method == "fp8-scales",
            "calibrate: unknown method '{}' (supported: quarot, oscar, optr, pnmix, fp8-scales)", method);
  if (method == "fp8-scales") {  // maxima only: any model
    KVQ_CHECK(chunk >= 2 && chunk <= m.max_ctx, "calibrate: chunk of {} tokens must be in [2, {}]", chunk, m.max_ctx);
    KVQ_CHECK(tokens >= chunk, "calibrate: --tokens {} is less than one chunk of {}", tokens, chunk);
    return;
  }
  if (method == "pnmix") {  // no rotation: any head_dim the pnmix codec takes
    KVQ_CHECK(m.head_dim % 32 == 0 && m.head_dim <= kCpuMaxHeadDim,
              "calibrate: pnmix needs head_dim a multiple of 32 up to {} (the model has {})", kCpuMaxHeadDim,
              m.head_dim);
    parse_pair_score(pnmix_score);
    pnmix_code_bits(key_bits, m.head_dim);
    KVQ_CHECK(chunk >= 2 && chunk <= m.max_ctx, "calibrate: chunk of {} tokens must be in [2, {}]", chunk, m.max_ctx);
    KVQ_CHECK(tokens >= chunk, "calibrate: --tokens {} is less than one chunk of {}", tokens, chunk);
    return;
  }
  KVQ_CHECK(base == "quarot" || base == "oscar", "calibrate: unknown base '{}' (supported: quarot, oscar)", base);
  KVQ_CHECK(objective == "post-wo" || objective == "joint" || objective == "pre-wo" || objective == "recon",
            "calibrate: unknown objective '{}' (supported: post-wo, joint, pre-wo, recon)", objective);
  KVQ_CHECK(is_power_of_two(m.head_dim), "calibrate: head_dim {} is not a power of two (Hadamard-based methods)",
            m.head_dim);
  KVQ_CHECK(chunk >= 2 && chunk <= m.max_ctx, "calibrate: chunk of {} tokens must be in [2, {}]", chunk, m.max_ctx);
  KVQ_CHECK(tokens >= chunk, "calibrate: --tokens {} is less than one chunk of {}", tokens, chunk);
  if (method != "optr") return;
  KVQ_CHECK(codec_traits(cache.k.type).fake_quant && cache.k.type == cache.v.type,
            "calibrate: optr needs the same cache type for keys and values, one of {} (got k={}, v={})",
            codec_names_if([](const CodecTraits& t) { return t.fake_quant; }), cache.k.type, cache.v.type);
  KVQ_CHECK(cache.k.group == cache.v.group, "calibrate: optr needs one group size for keys and values");
  KVQ_CHECK(n_queries >= 1 && n_queries <= chunk, "calibrate: --queries {} must be in [1, chunk]", n_queries);
  KVQ_CHECK(cache.sink + cache.recent < chunk,
            "calibrate: windows {} + {} leave nothing quantized in a chunk of {} tokens", cache.sink, cache.recent,
            chunk);
  KVQ_CHECK(calib_chunks >= 1 && heldout_chunks >= 1 && steps >= 1 && lr > 0,
            "calibrate: optr needs >= 1 calibration and held-out chunk, >= 1 step and lr > 0");
  KVQ_CHECK(tokens / chunk >= calib_chunks + heldout_chunks,
            "calibrate: --tokens {} gives {} chunks of {}, optr needs {} ({} calibration + {} held out)", tokens,
            tokens / chunk, chunk, calib_chunks + heldout_chunks, calib_chunks, heldout_chunks);
}

nlohmann::json calibration_metadata(const CalibrateConfig& c, const KvTransform& t, const CalibrateReport& rep,
                                    const std::string& model_fingerprint, const std::string& data_file,
                                    const std::string& data_sha256) {
  const bool optr = c.method == "optr";
  nlohmann::json meta = {{"method", t.name},
                         {"base", optr ? c.base : ""},
                         {"objective", optr ? c.objective : ""},
                         {"center_keys", !t.key_mean.empty()},
                         {"model_fingerprint", model_fingerprint},
                         {"calib_data", data_file},
                         {"calib_sha256", data_sha256},
                         {"calib_tokens", rep.tokens_used},
                         {"chunk", c.chunk},
                         {"capture_seconds", rep.capture_seconds},
                         {"optimise_seconds", rep.optimise_seconds}};
  if (!optr) return meta;
  meta["lambda_k"] = c.lambda_k;
  meta["steps"] = c.steps;
  meta["lr"] = c.lr;
  meta["n_queries"] = c.n_queries;
  meta["calib_chunks"] = c.calib_chunks;
  meta["heldout_chunks"] = c.heldout_chunks;
  meta["cache"] = {{"type_k", c.cache.k.type}, {"type_v", c.cache.v.type}, {"group", c.cache.k.group},
                   {"clip_k", c.cache.k.clip}, {"clip_v", c.cache.v.clip}, {"sink", c.cache.sink},
                   {"recent", c.cache.recent}};
  nlohmann::json heads = nlohmann::json::array();
  int key_kept = 0, value_kept = 0;
  for (const CalibrateHeadReport& h : rep.heads) {
    heads.push_back({{"layer", h.layer}, {"head", h.head}, {"key_before", h.key_before}, {"key_after", h.key_after},
                     {"key_kept", h.key_kept}, {"value_before", h.value_before}, {"value_after", h.value_after},
                     {"value_kept", h.value_kept}});
    key_kept += h.key_kept, value_kept += h.value_kept;
  }
  meta["heads"] = heads;
  meta["heads_total"] = rep.heads.size();
  meta["heads_key_kept"] = key_kept;
  meta["heads_value_kept"] = value_kept;
  return meta;
}

KvTransform calibrate(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg,
                      CalibrateReport* report, const CalibrateProgress& progress) {
  const ModelConfig& mc = model.config();
  cfg.validate(mc);
  KVQ_CHECK(cfg.method != "pnmix", "calibrate: pnmix allocates key widths, not rotations (calibrate_pnmix)");
  const int L = mc.n_layers, H = mc.n_kv_heads, d = mc.head_dim, hq = mc.n_heads, g = hq / H;
  const bool center = cfg.center_keys < 0 ? cfg.method == "optr" : cfg.center_keys == 1;
  const std::string label = cfg.method == "optr"
                                ? (cfg.objective == "post-wo" ? "optr" : "optr-" + cfg.objective) + "(" + cfg.base + ")"
                                : cfg.method;
  KvTransform t;
  t.n_layers = L, t.n_kv_heads = H, t.head_dim = d, t.name = label;
  CalibrateReport local;
  CalibrateReport& rep = report ? *report : local;
  const Eigen::MatrixXd hadamard = hadamard_matrix(d);
  if (cfg.method == "quarot") {
    t = hadamard_transform(L, H, d);
    t.name = label;
    return t;
  }

  // --- capture ----------------------------------------------------------------------------------------------
  Traces tr;
  tr.n_layers = L, tr.n_kv = H, tr.n_heads = hq, tr.d = d, tr.n_q = std::min(cfg.n_queries, cfg.chunk);
  tr.k.assign(size_t(L), std::vector<std::vector<RowMat<float>>>(size_t(H)));
  tr.v = tr.k;
  tr.q_last = tr.k;
  tr.k_sum.assign(size_t(L), std::vector<double>(size_t(H) * d, 0.0));
  for (int l = 0; l < L; ++l) tr.oscar.emplace_back(H, d);
  const auto t0 = std::chrono::steady_clock::now();
  TraceTap tap(tr, cfg.chunk);
  const int n_chunks = capture_chunks(model, ids, cfg, tap, [&](int) { tap.begin_chunk(); }, progress);
  rep.tokens_used = n_chunks * cfg.chunk;
  rep.chunks = n_chunks;
  rep.capture_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // --- key means and OSCAR --------------------------------------------------------------------------------------
  std::vector<float> mu(size_t(L) * H * d, 0.f);
  for (int l = 0; l < L; ++l)
    for (size_t i = 0; i < size_t(H) * d; ++i) mu[size_t(l) * H * d + i] = float(tr.k_sum[size_t(l)][i] / tr.n_tokens);
  if (center) t.key_mean = mu;
  t.r_k.assign(size_t(L) * H * d * d, 0.f);
  t.r_v = t.r_k;
  std::vector<Eigen::MatrixXd> base_k(size_t(L), hadamard), base_v(size_t(L), hadamard);
  const bool need_oscar = cfg.method == "oscar" || cfg.base == "oscar";
  for (int l = 0; l < L && need_oscar; ++l) {
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < n_chunks; ++c) {
        const RowMat<float>& k = tr.k[size_t(l)][size_t(h)][size_t(c)];
        tr.oscar[size_t(l)].add_keys_values(h, center ? centred(k, mu.data() + (size_t(l) * H + h) * d) : k,
                                            tr.v[size_t(l)][size_t(h)][size_t(c)]);
      }
    const OscarRotations r = tr.oscar[size_t(l)].build();
    base_k[size_t(l)] = r.key.r;
    base_v[size_t(l)] = r.value.r;
  }
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      put_matrix(t.r_k, l, h, H, d, base_k[size_t(l)]);
      put_matrix(t.r_v, l, h, H, d, base_v[size_t(l)]);
    }
  if (cfg.method == "oscar") return t;

  // --- OptR, layer by layer ---------------------------------------------------------------------------------------
  OptrConfig oc;
  oc.loss.bits = codec_traits(cfg.cache.k.type).code_bits;
  oc.loss.group = cfg.cache.k.group;
  oc.loss.clip_k = cfg.cache.k.clip;
  oc.loss.clip_v = cfg.cache.v.clip;
  oc.loss.sink = cfg.cache.sink;
  oc.loss.window = cfg.cache.recent;
  oc.loss.lambda_k = cfg.lambda_k;
  oc.loss.softmax_scale = 1.0 / std::sqrt(double(d));
  oc.mode = optr_mode(cfg.objective);
  oc.adam.lr = cfg.lr;
  oc.steps = cfg.steps;
  oc.n_threads = model.pool().size();
  check_optr_config(oc);
  const auto t1 = std::chrono::steady_clock::now();
  const int per_layer = cfg.calib_chunks + cfg.heldout_chunks;
  for (int l = 0; l < L; ++l) {
    // W_O of this layer widened to fp32 here, one layer at a time (the weights stay bf16 where they lie).
    const std::vector<float> wo_l = model.weights().layers[size_t(l)].wo.to_f32();
    std::vector<OptrHeadInput> heads(static_cast<size_t>(H));
    for (int h = 0; h < H; ++h) {
      std::vector<ColMat<float>> wo(static_cast<size_t>(g));
      for (int j = 0; j < g; ++j) {  // W_O^j: columns [(h g + j) d, +d) of W_O [hidden, n_heads d]
        wo[size_t(j)].resize(mc.hidden_size, d);
        for (int r = 0; r < mc.hidden_size; ++r)
          for (int c = 0; c < d; ++c)
            wo[size_t(j)](r, c) = wo_l[size_t(r) * hq * d + size_t(h * g + j) * d + c];
      }
      const float* mu_lh = mu.data() + (size_t(l) * H + h) * d;
      for (int i = 0; i < per_layer; ++i) {
        const int c = (l * per_layer + i) % n_chunks;  // layers take turns over the captured chunks
        OptrChunk<float> ch = optr_make_chunk<float>(tr.q_last[size_t(l)][size_t(h)][size_t(c)],
                                                     centred(tr.k[size_t(l)][size_t(h)][size_t(c)], mu_lh),
                                                     tr.v[size_t(l)][size_t(h)][size_t(c)], wo, oc.loss);
        (i < cfg.calib_chunks ? heads[size_t(h)].calib : heads[size_t(h)].heldout).push_back(std::move(ch));
      }
      heads[size_t(h)].r0_k = base_k[size_t(l)];
      heads[size_t(h)].r0_v = base_v[size_t(l)];
    }
    const std::vector<OptrHeadResult> res = optr_calibrate_layer(heads, oc);
    for (int h = 0; h < H; ++h) {
      put_matrix(t.r_k, l, h, H, d, res[size_t(h)].r_k.cast<double>());
      put_matrix(t.r_v, l, h, H, d, res[size_t(h)].r_v.cast<double>());
      rep.heads.push_back({l, h, res[size_t(h)].key.heldout_before, res[size_t(h)].key.heldout_after,
                           res[size_t(h)].value.heldout_before, res[size_t(h)].value.heldout_after,
                           res[size_t(h)].key.kept, res[size_t(h)].value.kept});
    }
    if (progress) progress("optimise", l + 1, L);
  }
  rep.optimise_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return t;
}

}  // namespace kvq
