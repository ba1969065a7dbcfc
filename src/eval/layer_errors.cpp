#include "eval/layer_errors.h"

#include <algorithm>

#include "common/error.h"
#include "eval/metrics.h"

namespace kvq {

namespace {

double diff_sq(const std::vector<float>& a, const std::vector<float>& b) {
  KVQ_CHECK(a.size() == b.size(), "layer errors: recorded chunks differ in size ({} vs {})", a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    s += d * d;
  }
  return s;
}

double norm_sq(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += double(x) * x;
  return s;
}

}  // namespace

LayerRecorder::LayerRecorder(int n_layers, int hidden, const LayerRecorder* force_from)
    : hidden_(hidden), force_(force_from), input_(size_t(n_layers)), attn_(size_t(n_layers)),
      output_(size_t(n_layers)) {}

void LayerRecorder::on_layer_input(int layer, int, int n, float* x) {
  std::vector<float>& in = input_[size_t(layer)];
  const size_t sz = size_t(n) * hidden_;
  if (force_) {
    const std::vector<float>& src = force_->input(layer);
    KVQ_CHECK(src.size() == sz, "layer errors: forced input of layer {} has {} values, the chunk needs {}", layer,
              src.size(), sz);
    std::copy(src.begin(), src.end(), x);
  }
  in.assign(x, x + sz);
}

void LayerRecorder::on_attention_output(int layer, int, int n, const float* y) {
  attn_[size_t(layer)].assign(y, y + size_t(n) * hidden_);
}

void LayerRecorder::on_layer_output(int layer, int, int n, const float* x) {
  output_[size_t(layer)].assign(x, x + size_t(n) * hidden_);
}

LayerErrorSums::LayerErrorSums(int n_layers)
    : attn_ref_sq(size_t(n_layers)), attn_local_sq(size_t(n_layers)), attn_e2e_sq(size_t(n_layers)),
      hidden_ref_sq(size_t(n_layers)), hidden_diff_sq(size_t(n_layers)) {}

void LayerErrorSums::add(const LayerRecorder& ref, const LayerRecorder& forced, const LayerRecorder& free,
                         int n_tokens, ThreadPool* pool) {
  constexpr int kSums = 5;  // attn_ref, attn_local, attn_e2e, hidden_ref, hidden_diff
  const int n_layers = int(attn_ref_sq.size());
  std::vector<double> part(size_t(kSums) * n_layers);
  auto sum = [&](int64_t item, int) {
    const int l = int(item / kSums);
    switch (item % kSums) {
      case 0: part[size_t(item)] = norm_sq(ref.attn(l)); break;
      case 1: part[size_t(item)] = diff_sq(forced.attn(l), ref.attn(l)); break;
      case 2: part[size_t(item)] = diff_sq(free.attn(l), ref.attn(l)); break;
      case 3: part[size_t(item)] = norm_sq(ref.output(l)); break;
      default: part[size_t(item)] = diff_sq(free.output(l), ref.output(l)); break;
    }
  };
  if (pool)
    pool->parallel_for(int64_t(part.size()), sum);
  else
    for (int64_t i = 0; i < int64_t(part.size()); ++i) sum(i, 0);
  for (size_t l = 0; l < size_t(n_layers); ++l) {
    attn_ref_sq[l] += part[kSums * l];
    attn_local_sq[l] += part[kSums * l + 1];
    attn_e2e_sq[l] += part[kSums * l + 2];
    hidden_ref_sq[l] += part[kSums * l + 3];
    hidden_diff_sq[l] += part[kSums * l + 4];
  }
  tokens += n_tokens;
}

void LayerErrorSums::merge(const LayerErrorSums& o) {
  if (attn_ref_sq.empty()) {
    *this = o;
    return;
  }
  KVQ_CHECK(o.attn_ref_sq.size() == attn_ref_sq.size(), "layer errors: merging {} layers into {}",
            o.attn_ref_sq.size(), attn_ref_sq.size());
  for (size_t l = 0; l < attn_ref_sq.size(); ++l) {
    attn_ref_sq[l] += o.attn_ref_sq[l];
    attn_local_sq[l] += o.attn_local_sq[l];
    attn_e2e_sq[l] += o.attn_e2e_sq[l];
    hidden_ref_sq[l] += o.hidden_ref_sq[l];
    hidden_diff_sq[l] += o.hidden_diff_sq[l];
  }
  tokens += o.tokens;
}

double LayerErrorSums::attn_local(int l) const {
  return relative_error(attn_local_sq[size_t(l)], attn_ref_sq[size_t(l)]);
}
double LayerErrorSums::attn_e2e(int l) const { return relative_error(attn_e2e_sq[size_t(l)], attn_ref_sq[size_t(l)]); }
double LayerErrorSums::hidden(int l) const {
  return relative_error(hidden_diff_sq[size_t(l)], hidden_ref_sq[size_t(l)]);
}

}  // namespace kvq
