#include "cuda/gpu_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "cuda/bench_support.h"
#include "cuda/blas.h"
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "cuda/gpu_model_kernels.h"
#include "cuda/runtime.h"

namespace kvq::cuda {

GemmPrecision parse_gemm_precision(std::string_view s) {
  if (s == "bf16") return GemmPrecision::Bf16;
  if (s == "fp32") return GemmPrecision::Fp32;
  KVQ_FAIL("--gpu-gemm '{}' is not supported (bf16 or fp32)", s);
}

std::string_view gemm_precision_name(GemmPrecision p) { return p == GemmPrecision::Bf16 ? "bf16" : "fp32"; }

namespace {

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) KVQ_FAIL("{}: {}", what, cublasGetStatusString(s));
}

// A host fp32 vector uploaded as is (norm weights, biases, inverse frequencies); empty stays empty.
DeviceBuffer upload_f32(const std::vector<float>& v) {
  DeviceBuffer b(v.size() * sizeof(float));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(float));
  return b;
}

// A linear weight [out, in] in the GEMM precision.
struct DeviceLinear {
  DeviceBuffer w;  // [out, in] row-major, bf16 bits or fp32
  int out = 0, in = 0;
};

struct DeviceLayer {
  DeviceBuffer attn_norm, mlp_norm;  // [hidden] fp32
  DeviceBuffer q_norm, k_norm;       // [d] fp32 (Qwen3), else empty
  DeviceBuffer bqkv;                 // [(n_heads + 2 n_kv) d] fp32: q, k, v biases (Qwen2), else empty
  DeviceLinear wqkv;                 // [(n_heads + 2 n_kv) d, hidden]: q_proj, k_proj, v_proj stacked
  DeviceLinear w_gate_up;            // [2 intermediate, hidden]: gate_proj, up_proj stacked
  DeviceLinear wo, w_down;
};

// Where a GpuModel's weights come from, tensor by tensor of model/weights.h's table. The layer-building code
// (GpuModel::Impl::build) asks a source for every vector and linear and does not know which source it is: a host
// Weights uploaded (HostWeightSource), or random weights generated in device memory (DeviceDummySource).
class WeightSource {
 public:
  WeightSource(const ModelConfig& cfg, GemmPrecision gemm) : cfg_(cfg), gemm_(gemm), table_(model_tensors(cfg)) {
    by_stream_.assign(size_t(cfg.n_layers + 1) * size_t(TensorRole::kCount), nullptr);
    for (const TensorSpec& t : table_) by_stream_[t.stream()] = &t;
  }
  virtual ~WeightSource() = default;

  // fp32 [Σ n_i]: the vectors of parts stacked (a norm weight; the q, k, v biases); empty when the config has none.
  DeviceBuffer vector(std::initializer_list<TensorRole> parts, int layer) const {
    const std::vector<const TensorSpec*> ts = present(parts, layer);
    if (ts.empty()) return {};
    KVQ_CHECK(ts.size() == parts.size(), "GpuModel: layer {} has {} of {} stacked vectors", layer, ts.size(),
              parts.size());
    std::vector<float> all;
    for (const TensorSpec* t : ts) {
      const std::vector<float> v = host_vector(*t);
      KVQ_CHECK(v.size() == t->numel(), "GpuModel: {} has {} values, expected {}", t->name, v.size(), t->numel());
      all.insert(all.end(), v.begin(), v.end());
    }
    return upload_f32(all);
  }

  // [Σ out_i, in] in the GEMM precision: the rows of parts stacked, so one GEMM computes them all.
  DeviceLinear linear(std::initializer_list<TensorRole> parts, int layer, const char* name) const {
    const std::vector<const TensorSpec*> ts = present(parts, layer);
    KVQ_CHECK(!ts.empty() && ts.size() == parts.size(), "GpuModel: {} of layer {}: the config has {} of its {} parts",
              name, layer, ts.size(), parts.size());
    DeviceLinear d;
    d.in = int(ts[0]->shape.at(1));
    for (const TensorSpec* t : ts) {
      KVQ_CHECK(t->shape.size() == 2 && t->shape[1] == d.in, "GpuModel: {} parts of different widths", name);
      d.out += int(t->shape[0]);
    }
    d.w = DeviceBuffer(size_t(d.out) * size_t(d.in) * (gemm_ == GemmPrecision::Bf16 ? 2 : 4));
    size_t offset = 0;  // elements
    for (const TensorSpec* t : ts) {
      fill_rows(*t, d.w, offset);
      offset += t->numel();
    }
    return d;
  }

 protected:
  // The values of a small tensor (norm weights, biases) on the host.
  virtual std::vector<float> host_vector(const TensorSpec& t) const = 0;
  // Writes tensor t into dst from element `offset` on, in the GEMM precision.
  virtual void fill_rows(const TensorSpec& t, DeviceBuffer& dst, size_t offset) const = 0;

  const ModelConfig& cfg_;
  GemmPrecision gemm_;

 private:
  // The entries of parts in this layer that the config has (a Llama has no QK-norms, a Qwen3 no biases).
  std::vector<const TensorSpec*> present(std::initializer_list<TensorRole> parts, int layer) const {
    std::vector<const TensorSpec*> ts;
    for (TensorRole r : parts)
      if (const TensorSpec* t = by_stream_.at(tensor_stream(r, layer))) ts.push_back(t);
    return ts;
  }
  std::vector<TensorSpec> table_;
  std::vector<const TensorSpec*> by_stream_;  // [(n_layers + 1) * kCount] table entry of each stream, or null
};

// Two pinned host buffers and a copy stream: a tensor's bytes are staged into one buffer (copied from the mapping, or
// converted to the GEMM precision) while the other buffer's copy to the device runs. Host memory: the two buffers.
class PinnedStaging {
 public:
  static constexpr size_t kChunkBytes = size_t(32) << 20;  // a multiple of every element size

  PinnedStaging() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "weight upload: cudaStreamCreate");
    for (int b = 0; b < 2; ++b) {
      check(cudaHostAlloc(&buf_[b], kChunkBytes, cudaHostAllocDefault), "weight upload: cudaHostAlloc");
      check(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming), "weight upload: cudaEventCreate");
    }
  }
  ~PinnedStaging() {
    cudaStreamSynchronize(stream_);
    for (int b = 0; b < 2; ++b) {
      cudaEventDestroy(done_[b]);
      cudaFreeHost(buf_[b]);
    }
    cudaStreamDestroy(stream_);
  }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Device bytes [0, bytes) of dst = what stage(host, first, n) writes for bytes [first, first + n), chunk by chunk.
  template <class Stage>
  void copy(void* dst, size_t bytes, const Stage& stage) {
    for (size_t at = 0; at < bytes; at += kChunkBytes, next_ ^= 1) {
      const size_t n = std::min(kChunkBytes, bytes - at);
      check(cudaEventSynchronize(done_[next_]), "weight upload: cudaEventSynchronize");  // its last copy is done
      stage(static_cast<uint8_t*>(buf_[next_]), at, n);
      check(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + at, buf_[next_], n, cudaMemcpyHostToDevice, stream_),
            "weight upload: cudaMemcpyAsync");
      check(cudaEventRecord(done_[next_], stream_), "weight upload: cudaEventRecord");
    }
  }

 private:
  cudaStream_t stream_ = nullptr;
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int next_ = 0;
};

// A host Weights (a checkpoint's tensors where they lie in its mapping, or Weights::dummy) uploaded through pinned
// staging, chunk by chunk (PinnedStaging): no copy of the model on the host. bf16 weights go up as they lie for bf16
// GEMMs; f16 / f32 ones are converted per chunk and must be bf16 values (checked: otherwise the upload would silently
// change the model; --gpu-gemm fp32 takes them); fp32 GEMMs get every dtype widened per chunk. Once a tensor is
// staged, its mapped pages leave the process's resident set (WeightTensor::release), so host RSS stays small.
class HostWeightSource final : public WeightSource {
 public:
  // fold: the model's value-rotation fold for the cache (model/value_fold.h), whose W_V, b_V and W_O go up instead.
  HostWeightSource(const ModelConfig& cfg, GemmPrecision gemm, const Weights& w, const ValueFold* fold)
      : WeightSource(cfg, gemm), w_(w), fold_(fold) {}
  ~HostWeightSource() override = default;

 protected:
  std::vector<float> host_vector(const TensorSpec& t) const override {
    return fold_ ? fold_->vector(w_, t.role, t.layer) : w_.vector(t.role, t.layer);
  }
  void fill_rows(const TensorSpec& t, DeviceBuffer& dst, size_t offset) const override {
    const WeightTensor& w = fold_ ? fold_->matrix(w_, t.role, t.layer) : w_.matrix(t.role, t.layer);
    KVQ_CHECK(w.numel() == t.numel(), "GpuModel: weight {} has {} values, expected {}", t.name, w.numel(), t.numel());
    if (!staging_) staging_ = std::make_unique<PinnedStaging>();  // at the first upload: the device is checked by then
    PinnedStaging& staging = *staging_;
    if (gemm_ == GemmPrecision::Fp32) {
      staging.copy(dst.as<float>() + offset, w.numel() * sizeof(float), [&](uint8_t* host, size_t at, size_t n) {
        w.to_f32(at / sizeof(float), n / sizeof(float), reinterpret_cast<float*>(host));
      });
    } else if (w.dtype == DType::BF16) {
      staging.copy(dst.as<uint16_t>() + offset, w.nbytes(),
                    [&](uint8_t* host, size_t at, size_t n) { std::memcpy(host, w.data + at, n); });
    } else {
      staging.copy(dst.as<uint16_t>() + offset, w.numel() * sizeof(uint16_t), [&](uint8_t* host, size_t at, size_t n) {
        const size_t first = at / sizeof(uint16_t), count = n / sizeof(uint16_t);
        thread_local std::vector<float> values;
        values.resize(count);
        w.to_f32(first, count, values.data());
        uint16_t* bits = reinterpret_cast<uint16_t*>(host);
        for (size_t i = 0; i < count; ++i) {
          bits[i] = f32_to_bf16(values[i]);
          KVQ_CHECK(bf16_to_f32(bits[i]) == values[i] || std::isnan(values[i]),
                    "GpuModel: weight {} holds {} at {}, not a bf16 value; use --gpu-gemm fp32 for this checkpoint",
                    t.name, values[i], first + i);
        }
      });
    }
    w.release();
  }

 private:
  const Weights& w_;
  const ValueFold* fold_;
  mutable std::unique_ptr<PinnedStaging> staging_;  // made at the first upload
};

// --dummy-weights on the device: every linear generated in place by kernels::dummy_fill, the values Weights::dummy
// makes on the host for the seed (model/dummy_weights.h); the norm weights and biases (kilobytes) on the host.
class DeviceDummySource final : public WeightSource {
 public:
  DeviceDummySource(const ModelConfig& cfg, GemmPrecision gemm, uint64_t seed) : WeightSource(cfg, gemm), seed_(seed) {}

 protected:
  std::vector<float> host_vector(const TensorSpec& t) const override {
    std::vector<float> v(t.numel());
    for (size_t i = 0; i < v.size(); ++i) v[i] = dummy_value(t.init, cfg_.initializer_range, seed_, t.stream(), i);
    return v;
  }
  void fill_rows(const TensorSpec& t, DeviceBuffer& dst, size_t offset) const override {
    const kernels::RowsOut out = gemm_ == GemmPrecision::Bf16 ? kernels::RowsOut{nullptr, dst.as<uint16_t>() + offset}
                                                              : kernels::RowsOut{dst.as<float>() + offset, nullptr};
    check(kernels::dummy_fill(out, int64_t(t.numel()), t.init, cfg_.initializer_range, seed_, t.stream(), nullptr),
          "dummy weights");
  }

 private:
  uint64_t seed_;
};

// An NVTX range over one forward step, "kvq prefill" (a step with a row of more than one token) or "kvq decode" (one
// token per sequence), so that profilers can take the steps apart: e.g. `ncu --nvtx --nvtx-include "kvq decode/"`
// or the NVTX rows of nsys. No cost without a profiler attached.
struct StepRange {
  explicit StepRange(bool decode) { nvtxRangePushA(decode ? "kvq decode" : "kvq prefill"); }
  ~StepRange() { nvtxRangePop(); }
  StepRange(const StepRange&) = delete;
  StepRange& operator=(const StepRange&) = delete;
};

}  // namespace

struct GpuModel::Impl {
  ModelConfig cfg;
  GemmPrecision gemm;
  int max_seqs = 0, max_rows = 0;
  std::unique_ptr<GpuKvCache> cache;
  cudaStream_t stream = nullptr;  // the cache's stream: every kernel, GEMM and copy of a step runs on it
  cublasHandle_t blas = nullptr;
  size_t weight_bytes = 0;       // what a decode step reads: all weights but an untied embedding table (gathered)
  bool dummy = false;            // random weights (--dummy-weights): timing only

  // Weights.
  std::vector<DeviceLayer> layers;
  DeviceLinear embed;            // [vocab, hidden] (bf16 or fp32, as the GEMMs)
  DeviceLinear lm_head;          // [vocab, hidden]; empty when tied (embed is used)
  DeviceBuffer final_norm;       // [hidden] fp32
  DeviceBuffer inv_freq;         // [d / 2] fp32 RoPE inverse frequencies (llama3 scaling applied)

  // Activations of one step, R = max_rows rows.
  DeviceBuffer x, h;             // [R, hidden] fp32 residual stream, normed input / block output
  DeviceBuffer qkv;              // [R, (n_heads + 2 n_kv) d] fp32 fused q/k/v projection
  DeviceBuffer q, k, v, att;     // [R, n_heads * d], [R, n_kv * d] x2, [R, n_heads * d] fp32
  DeviceBuffer gu;               // [R, 2 intermediate] fp32 fused gate/up projection
  DeviceBuffer act;              // [R, intermediate] fp32 MLP activation (Fp32 GEMMs only; else in xb)
  DeviceBuffer xb;               // [R, max(hidden, intermediate, n_heads * d)] bf16 GEMM input (Bf16 only)
  DeviceBuffer ids, pos;         // [R] int32 token ids, positions
  DeviceBuffer last_rows;        // [max_seqs] int32 row of each sequence's last token
  DeviceBuffer logits;           // [R, vocab] fp32
  DeviceBuffer argmax, finite;   // [R] int32
  DeviceBuffer top_ids, top_vals;  // [max_seqs, kMaxSortedTopK] int32 / fp32: Runner::top_logits
  DeviceBuffer draws, drawn;     // [max_seqs] gumbel::Draw, int32: Runner::gumbel_argmax
  DeviceBuffer mass_queries, masses;  // [max_seqs] smath::MassQuery, smath::RowMass: Runner::row_mass
  int out_rows = 0;              // rows of logits the last forward returned (top_logits selects from them)
  // The rows Runner::top_logits, gumbel_argmax and row_mass read: those of the last forward, one per sequence.
  void check_kept_rows(const char* what) const {
    KVQ_CHECK(out_rows > 0 && out_rows <= max_seqs,
              "{}: the last forward returned {} rows of logits (it reads 1 to {}, the last row of each sequence)",
              what, out_rows, max_seqs);
  }
  std::vector<int32_t> h_pos, h_last, h_finite;  // host staging

  // Layer hook (Runner::set_layer_hook): null, or called per layer on host copies of the step's activations.
  Model::LayerHook* hook = nullptr;
  int hook_pos0 = 0;             // position of the step's first row (a hooked step holds one sequence)
  float* h_act = nullptr;        // [rows, hidden] pinned host copy handed to the hook (h_act_cap floats)
  size_t h_act_cap = 0;

  // Copies d[rows, hidden] into h_act (synchronously: the hook runs on the host right after). Pinned, so that the
  // copies of a hooked pass (three a layer and chunk, the referee's per-layer errors) run at the link's speed.
  float* download_act(const DeviceBuffer& d, int rows) {
    const size_t n = size_t(rows) * cfg.hidden_size;
    if (n > h_act_cap) {
      if (h_act) check(cudaFreeHost(h_act), "layer hook: cudaFreeHost");
      h_act = nullptr;
      check(cudaHostAlloc(reinterpret_cast<void**>(&h_act), n * sizeof(float), cudaHostAllocDefault),
            "layer hook: cudaHostAlloc");
      h_act_cap = n;
    }
    check(cudaMemcpyAsync(h_act, d.get(), n * sizeof(float), cudaMemcpyDeviceToHost, stream), "download activations");
    check(cudaStreamSynchronize(stream), "layer hook");
    return h_act;
  }
  // The layer's input x: a hook that may overwrite it (LayerHook::rewrites_input) has it uploaded back before the
  // layer runs.
  void hook_input(int l, int rows) {
    hook->on_layer_input(l, hook_pos0, rows, download_act(x, rows));
    if (!hook->rewrites_input()) return;
    check(cudaMemcpyAsync(x.get(), h_act, size_t(rows) * cfg.hidden_size * sizeof(float), cudaMemcpyHostToDevice,
                          stream), "upload layer input");
    check(cudaStreamSynchronize(stream), "layer hook");  // h_act is reused by the next download
  }

  ~Impl() {
    if (blas) cublasDestroy(blas);
    if (h_act) cudaFreeHost(h_act);
  }

  const DeviceLinear& output() const { return lm_head.w.bytes() ? lm_head : embed; }

  // Where a row kernel writes a GEMM's input `in` (fp32 [rows, W.in]): itself for fp32 GEMMs, xb for bf16 GEMMs.
  kernels::RowsOut gemm_input(float* in) const {
    return gemm == GemmPrecision::Bf16 ? kernels::RowsOut{nullptr, xb.as<uint16_t>()} : kernels::RowsOut{in, nullptr};
  }
  // y[rows, W.out] = x[rows, W.in] · W^T, fp32 accumulation (cuda/blas.h). x_in is fp32; for bf16 GEMMs it is
  // converted into xb first, unless the kernel that wrote it also wrote xb (staged: gemm_input(x_in) was its output).
  void linear(const float* x_in, int rows, const DeviceLinear& W, float* y, bool staged = false) {
    if (gemm == GemmPrecision::Bf16) {
      if (!staged) check(kernels::to_bf16(x_in, int64_t(rows) * W.in, xb.as<uint16_t>(), stream), "to_bf16");
      check_cublas(gemm_bf16(blas, W.w.get(), xb.get(), rows, W.out, W.in, y), "cublasGemmEx (bf16)");
    } else {
      check_cublas(gemm_f32(blas, W.w.get(), x_in, rows, W.out, W.in, y), "cublasGemmEx (fp32)");
    }
  }

  // The residual stream is updated lazily: a block leaves its output in h, pending, and the next norm adds it to x in
  // the same kernel (norm_stream); flush_stream adds it alone where x itself is read.
  bool pending = false;          // h holds a block output not yet added to x
  void norm_stream(int rows, const DeviceBuffer& w);  // x += h if pending; norm(x) * w -> the next GEMM's input
  void flush_stream(int rows);                         // x += h if pending
  void attention_block(int l, int rows);
  void mlp_block(int l, int rows);
  // The GPU work of a step whose inputs are uploaded: embedding, layers, and for out_rows > 0 the logits, their
  // finite flags and (want_argmax) argmax in device memory. Host copies and the sync are the caller's.
  void enqueue_step(int rows, int out_rows, LogitRows which, bool want_argmax);

  // CUDA graphs of decode steps: the launches of a step depend only on StepKey (the rest is device memory that the
  // step's uploads fill), so the graph captured from one step replays every later step with the same key.
  struct StepKey {
    int rows, out_rows;
    LogitRows which;
    bool argmax;
    GpuKvCache::StepSignature cache;
    bool operator==(const StepKey&) const = default;
  };
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;  // the captured step, replayable while `key` holds
    StepKey key{};
    std::optional<StepKey> seen;     // the last key run eagerly: captured when it comes again
    void reset() {
      if (exec) cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
    ~StepGraph() { reset(); }
  };
  bool graphs = true;                // set_cuda_graphs
  StepGraph graph;
  int64_t graph_replays = 0;         // steps run from graph.exec
  DeviceBuffer blas_workspace;       // cuBLAS's workspace, ours so that no allocation falls inside a capture
  void run_graphed(const StepKey& key);  // replays, captures, or runs eagerly (see run_graphed)

  // Construction (both constructors): checks, weights from src, activations, then the KV cache.
  void build(const WeightSource& src, const CacheConfig& cache_cfg, int max_ctx, int max_seqs, size_t kv_budget_bytes);
  void build_weights(const WeightSource& src);
  // The activation buffers of a step of `rows` rows for max_seqs sequences and their bytes: one list, allocated by
  // build() and counted by sequences_filling().
  using ActivationPlan = std::vector<std::pair<DeviceBuffer Impl::*, size_t>>;
  ActivationPlan activation_plan(int rows, int max_seqs) const;
  size_t activation_bytes(int rows, int max_seqs) const;
  // max_seqs 0 (bench decode --seqs max): the most sequences of max_ctx tokens whose pages and windows fit in the KV
  // budget once the activations of that many rows are allocated (see the constructor's comment).
  int sequences_filling(const CacheLayout& layout, int max_ctx, int chunk, size_t asked) const;
  // The rows of a step for n_seqs sequences: the chunks of as many sequences as kMaxStepRows rows and
  // kStepMemoryShare of `free` bytes of activations allow (so that a prefill step of several sequences gives the
  // GEMMs that many times one chunk's rows), and at least max(chunk, n_seqs).
  int step_rows_for(int n_seqs, int chunk, size_t free) const;
};

namespace {

// The KV budget: the one asked for (it must be free), or a share of the memory free now, capped at what max_seqs
// sequences of max_ctx need.
size_t kv_budget(const CacheConfig& cfg, const ModelConfig& c, int max_ctx, int max_seqs, size_t asked) {
  const size_t free = free_device_memory();
  const double gib = double(1ull << 30);
  KVQ_CHECK(asked <= free, "--kv-budget-gib {:.2f}: only {:.2f} GiB of device memory are free after the weights",
            double(asked) / gib, double(free) / gib);
  if (asked > 0) return asked;
  const CacheLayout layout = GpuKvCache::layout_of(cfg, c.n_layers, c.n_kv_heads, c.head_dim, max_ctx);
  const size_t need = PagePool::bytes_of(layout, PagePool::for_sequences(layout, max_ctx, max_seqs));
  return std::min(size_t(kGpuMemoryUtilization * double(free)), need);
}

}  // namespace

GpuModel::Impl::ActivationPlan GpuModel::Impl::activation_plan(int rows, int n_seqs) const {
  const ModelConfig& c = cfg;
  const size_t R = size_t(rows), f = sizeof(float), H = size_t(c.hidden_size), I = size_t(c.intermediate_size);
  const size_t qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
  ActivationPlan p = {{&Impl::x, R * H * f},
                      {&Impl::h, R * H * f},
                      {&Impl::qkv, R * (qd + 2 * kvd) * f},
                      {&Impl::q, R * qd * f},
                      {&Impl::att, R * qd * f},
                      {&Impl::k, R * kvd * f},
                      {&Impl::v, R * kvd * f},
                      {&Impl::gu, R * 2 * I * f},
                      {&Impl::ids, R * sizeof(int32_t)},
                      {&Impl::pos, R * sizeof(int32_t)},
                      {&Impl::last_rows, size_t(n_seqs) * sizeof(int32_t)},
                      {&Impl::logits, R * size_t(c.vocab_size) * f},
                      {&Impl::argmax, R * sizeof(int32_t)},
                      {&Impl::finite, R * sizeof(int32_t)},
                      {&Impl::top_ids, size_t(n_seqs) * kMaxSortedTopK * sizeof(int32_t)},
                      {&Impl::top_vals, size_t(n_seqs) * kMaxSortedTopK * f},
                      {&Impl::draws, size_t(n_seqs) * sizeof(gumbel::Draw)},
                      {&Impl::drawn, size_t(n_seqs) * sizeof(int32_t)},
                      {&Impl::mass_queries, size_t(n_seqs) * sizeof(smath::MassQuery)},
                      {&Impl::masses, size_t(n_seqs) * sizeof(smath::RowMass)}};
  if (gemm == GemmPrecision::Fp32) p.push_back({&Impl::act, R * I * f});
  if (gemm == GemmPrecision::Bf16) p.push_back({&Impl::xb, R * std::max({H, I, qd}) * sizeof(uint16_t)});
  return p;
}

size_t GpuModel::Impl::activation_bytes(int rows, int n_seqs) const {
  size_t bytes = 0;
  for (const auto& [buffer, b] : activation_plan(rows, n_seqs)) bytes += b;
  return bytes;
}

int GpuModel::Impl::step_rows_for(int n_seqs, int chunk, size_t free) const {
  constexpr int kMaxStepRows = 4096;         // as a serving engine's default batched-token budget
  constexpr double kStepMemoryShare = 0.05;  // of the memory free after the weights
  int k = std::max(1, std::min(n_seqs, kMaxStepRows / chunk));
  while (k > 1 && double(activation_bytes(k * chunk, n_seqs)) > kStepMemoryShare * double(free)) --k;
  return std::max(k * chunk, n_seqs);
}

int GpuModel::Impl::sequences_filling(const CacheLayout& layout, int max_ctx, int chunk, size_t asked) const {
  const size_t free = free_device_memory();
  const int64_t one_seq = layout.sequence_bytes(max_ctx);  // its windows' pages + its own: PagePool::for_budget's unit
  // n sequences fit when their activations (step_rows_for(n) rows) leave room for the budget and the budget holds them.
  constexpr size_t kSlack = size_t(64) << 20;  // cudaMalloc's rounding of the activation buffers, with room to spare
  auto fits = [&](int64_t n) {
    const size_t act = activation_bytes(step_rows_for(int(n), chunk, free), int(n)) + kSlack;
    if (act >= free || (asked > 0 && asked > free - act)) return false;
    const double budget = asked > 0 ? double(asked) : kGpuMemoryUtilization * double(free - act);
    return double(n) * double(one_seq) <= budget;
  };
  int64_t lo = 0, hi = int64_t(free / size_t(std::max<int64_t>(one_seq, 1))) + 1;  // fits(lo), !fits(hi)
  hi = std::min<int64_t>(hi, INT32_MAX);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  const double gib = double(1ull << 30);
  KVQ_CHECK(lo >= 1,
            "--seqs max: {} not hold one sequence of {} tokens ({:.2f} GiB of pages and windows; {:.2f} GiB of device "
            "memory free after the weights)",
            asked > 0 ? fmt::format("--kv-budget-gib {:.2f} does", double(asked) / gib)
                      : fmt::format("{:.0f}% of the free memory does", 100 * kGpuMemoryUtilization),
            max_ctx, double(one_seq) / gib, double(free) / gib);
  return int(lo);
}

void GpuModel::Impl::build_weights(const WeightSource& src) {
  using R = TensorRole;
  embed = src.linear({R::Embed}, -1, "embed");
  if (!cfg.tie_embeddings) lm_head = src.linear({R::LmHead}, -1, "lm_head");
  final_norm = src.vector({R::FinalNorm}, -1);
  inv_freq = upload_f32(cfg.rope_inv_freq());
  for (int l = 0; l < cfg.n_layers; ++l) {
    DeviceLayer dl;
    dl.attn_norm = src.vector({R::AttnNorm}, l);
    dl.mlp_norm = src.vector({R::MlpNorm}, l);
    dl.q_norm = src.vector({R::QNorm}, l);
    dl.k_norm = src.vector({R::KNorm}, l);
    dl.bqkv = src.vector({R::Bq, R::Bk, R::Bv}, l);
    dl.wqkv = src.linear({R::Wq, R::Wk, R::Wv}, l, "q/k/v_proj");
    dl.wo = src.linear({R::Wo}, l, "o_proj");
    dl.w_gate_up = src.linear({R::WGate, R::WUp}, l, "gate/up_proj");
    dl.w_down = src.linear({R::WDown}, l, "down_proj");
    for (const DeviceBuffer* b : {&dl.attn_norm, &dl.mlp_norm, &dl.q_norm, &dl.k_norm, &dl.bqkv, &dl.wqkv.w, &dl.wo.w,
                                  &dl.w_gate_up.w, &dl.w_down.w})
      weight_bytes += b->bytes();
    layers.push_back(std::move(dl));
  }
  // A decode step gathers its rows of an untied embedding table; a tied one is read whole as the output projection.
  weight_bytes +=
      (cfg.tie_embeddings ? embed.w.bytes() : 0) + lm_head.w.bytes() + final_norm.bytes() + inv_freq.bytes();
}

void GpuModel::Impl::build(const WeightSource& src, const CacheConfig& given_cfg, int max_ctx, int n_seqs,
                           size_t kv_budget_bytes) {
  require_device();
  const ModelConfig& c = cfg;
  KVQ_CHECK(n_seqs >= 0 && max_ctx >= 1, "GpuModel: max_seqs {} and max_ctx {} must be >= 1 (max_seqs 0: as many as "
            "fit)", n_seqs, max_ctx);
  KVQ_CHECK(c.hidden_size <= kernels::kNormMaxDim, "--device cuda: hidden_size {} is wider than the GPU norm's {}",
            c.hidden_size, kernels::kNormMaxDim);
  // The cache stores this model's keys (its RoPE, for key codecs that store keys without it) and reads through its
  // sliding windows (Mistral), as the CPU runner's does (CpuRunner::for_model).
  CacheConfig cache_cfg = given_cfg;
  cache_cfg.key_rope = c.rope_inv_freq();
  cache_cfg.attn_window = c.layer_window;
  const std::string why = gpu_unsupported(cache_cfg, c.head_dim);  // the instance table (cuda/gpu_instances.h)
  KVQ_CHECK(why.empty(), "--device cuda: cache {} is not supported on the GPU: {}", cache_cfg.describe(), why);
  // The cache's checks, before any upload.
  const CacheLayout layout = GpuKvCache::layout_of(cache_cfg, c.n_layers, c.n_kv_heads, c.head_dim, max_ctx);
  check_cublas(cublasCreate(&blas), "cublasCreate");
  blas_workspace = DeviceBuffer(kBlasWorkspaceBytes);
  check_cublas(cublasSetWorkspace(blas, blas_workspace.get(), blas_workspace.bytes()), "cublasSetWorkspace");

  build_weights(src);
  sync("GpuModel: weights");

  max_seqs = n_seqs > 0 ? n_seqs : sequences_filling(layout, max_ctx, cache_cfg.max_chunk, kv_budget_bytes);
  max_rows = step_rows_for(max_seqs, cache_cfg.max_chunk, free_device_memory());
  for (const auto& [buffer, bytes] : activation_plan(max_rows, max_seqs)) this->*buffer = DeviceBuffer(bytes);
  sync("GpuModel: activations");

  // The KV cache last, from the memory the weights and activations left.
  const size_t budget = kv_budget(cache_cfg, c, max_ctx, max_seqs, kv_budget_bytes);
  cache = std::make_unique<GpuKvCache>(cache_cfg, c.n_layers, c.n_kv_heads, c.head_dim, max_ctx, max_seqs, budget);
  stream = static_cast<cudaStream_t>(cache->stream());
  check_cublas(cublasSetStream(blas, stream), "cublasSetStream");
}

GpuModel::GpuModel(const Model& model, const CacheConfig& cache_cfg, int max_ctx, int max_seqs, GemmPrecision gemm,
                   size_t kv_budget_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = model.config();
  impl_->gemm = gemm;
  impl_->dummy = model.dummy();
  // A value rotation the model folded for this cache's transform: its weights go up, and the cache keeps the rest.
  const ValueFold* fold = model.value_fold(cache_cfg.transform.get());
  CacheConfig cfg = cache_cfg;
  if (fold) cfg.transform = fold->rest;
  impl_->build(HostWeightSource(impl_->cfg, gemm, model.weights(), fold), cfg, max_ctx, max_seqs, kv_budget_bytes);
}

GpuModel::GpuModel(const ModelConfig& cfg, DeviceDummyWeights dummy, const CacheConfig& cache_cfg, int max_ctx,
                   int max_seqs, GemmPrecision gemm, size_t kv_budget_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  impl_->gemm = gemm;
  impl_->dummy = true;
  impl_->build(DeviceDummySource(impl_->cfg, gemm, dummy.seed), cache_cfg, max_ctx, max_seqs, kv_budget_bytes);
}

GpuModel::~GpuModel() = default;

const ModelConfig& GpuModel::config() const { return impl_->cfg; }
const CacheConfig& GpuModel::cache_config() const { return impl_->cache->config(); }
std::string GpuModel::describe() const {
  return "cuda: " + device_description() + ", " + std::string(gemm_precision_name(impl_->gemm)) + " GEMMs, " +
         (impl_->graphs ? "CUDA graphs" : "no CUDA graphs") + ", " +
         gpu_path_text(impl_->cache->config(), impl_->cfg.head_dim) +
         (gpu_prefill_kernel(kGpuInstances[gpu_instance(impl_->cache->config(), impl_->cfg.head_dim)]) &&
                  !impl_->cache->prefill_kernel_available()
              ? " (but row by row on this GPU: the prefill kernel's tiles exceed its shared memory per block)"
              : "") +
         (impl_->cache->config().skip_layers.empty() ? "" : ", the skipped layers' bf16 rows on the bf16 instance") +
         (impl_->dummy ? ", dummy weights (timing only)" : "");
}
int GpuModel::max_ctx() const { return impl_->cache->max_ctx(); }
int GpuModel::max_seqs() const { return impl_->max_seqs; }
int GpuModel::max_rows() const { return impl_->max_rows; }
int GpuModel::step_rows() const { return impl_->max_rows; }
int GpuModel::new_sequence() { return impl_->cache->new_sequence(); }
void GpuModel::free_sequence(int seq) { impl_->cache->free_sequence(seq); }
void GpuModel::fork_sequence(int src, int dst) { impl_->cache->fork_sequence(src, dst); }
void GpuModel::enable_prefix_cache() { impl_->cache->enable_prefix_cache(); }
int GpuModel::prefix_match(const int32_t* ids, int n, int step) const {
  return impl_->cache->prefix_match(ids, n, step);
}
void GpuModel::prefix_attach(int seq, const int32_t* ids, int len) { impl_->cache->prefix_attach(seq, ids, len); }
void GpuModel::prefix_store(int seq, const int32_t* ids, int len) { impl_->cache->prefix_store(seq, ids, len); }
void GpuModel::prefix_count(int hit_tokens, int miss_tokens) { impl_->cache->prefix_count(hit_tokens, miss_tokens); }
PrefixCacheStats GpuModel::prefix_stats() const { return impl_->cache->prefix_stats(); }
int GpuModel::length(int seq) const { return impl_->cache->length(seq); }
CacheFootprint GpuModel::footprint(int n_tokens) const { return impl_->cache->footprint(n_tokens); }
void GpuModel::end_prompt(int seq) { impl_->cache->end_prompt(seq); }
// exact-prompt stores what decode-faithful does (the twin's rows are freed at end_prompt), quantize-after-prompt
// window rows from qe(P - 1) on, as KvCache counts them.
CacheFootprint GpuModel::prompt_footprint(int n_tokens, int prompt_tokens) const {
  return impl_->cache->footprint(n_tokens, prompt_tokens);
}
size_t GpuModel::cache_bytes() const { return impl_->cache->bytes_allocated(); }
const PagePool& GpuModel::page_pool() const { return impl_->cache->pool(); }
GemmPrecision GpuModel::gemm_precision() const { return impl_->gemm; }
void GpuModel::set_layer_hook(Model::LayerHook* hook) { impl_->hook = hook; }
size_t GpuModel::weight_bytes() const { return impl_->weight_bytes; }
GpuKvCache& GpuModel::cache() { return *impl_->cache; }
void GpuModel::synchronize() const { check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"); }

void GpuModel::Impl::norm_stream(int rows, const DeviceBuffer& w) {
  const int H = cfg.hidden_size;
  // In place for fp32 GEMMs (out = h = the pending output): each thread reads its h[c] before it writes out[c].
  const kernels::RowsOut out = gemm_input(h.as<float>());
  if (pending)
    check(kernels::residual_rms_norm(x.as<float>(), h.as<float>(), rows, H, w.as<float>(), cfg.rms_eps, out, stream),
          "residual_rms_norm");
  else
    check(kernels::rms_norm(x.as<float>(), rows, H, w.as<float>(), cfg.rms_eps, out, stream), "rms_norm");
  pending = false;
}

void GpuModel::Impl::flush_stream(int rows) {
  if (pending)
    check(kernels::residual_add(x.as<float>(), h.as<float>(), int64_t(rows) * cfg.hidden_size, stream),
          "residual_add");
  pending = false;
}

// h = o_proj(attention(norm(x))), pending.
void GpuModel::Impl::attention_block(int l, int rows) {
  const ModelConfig& c = cfg;
  const DeviceLayer& lw = layers[size_t(l)];
  const int d = c.head_dim, hq = c.n_heads;
  norm_stream(rows, lw.attn_norm);
  linear(h.as<float>(), rows, lw.wqkv, qkv.as<float>(), /*staged=*/true);
  // Plain post-RoPE queries: GpuKvCache::attention applies the softmax scale 1/sqrt(d) itself (then R_K), in the
  // CPU model's order (Model::attention_block: q * scale, then the transform).
  const kernels::QkvParams qp{hq,
                              c.n_kv_heads,
                              d,
                              lw.bqkv.bytes() ? lw.bqkv.as<float>() : nullptr,
                              c.qk_norm ? lw.q_norm.as<float>() : nullptr,
                              c.qk_norm ? lw.k_norm.as<float>() : nullptr,
                              c.rms_eps,
                              pos.as<int32_t>(),
                              inv_freq.as<float>()};
  check(kernels::qkv_finish(qkv.as<float>(), rows, qp, q.as<float>(), k.as<float>(), v.as<float>(), stream),
        "qkv_finish");
  cache->append_and_attend(l, k.as<float>(), v.as<float>(), q.as<float>(), hq, att.as<float>());
  linear(att.as<float>(), rows, lw.wo, h.as<float>());
  pending = true;
  if (hook) hook->on_attention_output(l, hook_pos0, rows, download_act(h, rows));
}

// h = down(swiglu(gate_up(norm(x)))), pending.
void GpuModel::Impl::mlp_block(int l, int rows) {
  const DeviceLayer& lw = layers[size_t(l)];
  norm_stream(rows, lw.mlp_norm);
  linear(h.as<float>(), rows, lw.w_gate_up, gu.as<float>(), /*staged=*/true);
  check(kernels::swiglu(gu.as<float>(), rows, cfg.intermediate_size, gemm_input(act.as<float>()), stream), "swiglu");
  linear(act.as<float>(), rows, lw.w_down, h.as<float>(), /*staged=*/true);
  pending = true;
}

void GpuModel::forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids, LogitRows which,
                       float* logits, int32_t* argmax) {
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg;
  check_step(*this, seqs, n);
  KVQ_CHECK(!m.hook || seqs.size() == 1, "forward: a step with a layer hook holds one sequence, not {}", seqs.size());
  int rows = 0;
  for (int nb : n) rows += nb;
  for (int r = 0; r < rows; ++r)
    KVQ_CHECK(ids[r] >= 0 && ids[r] < c.vocab_size, "token id {} is outside the vocabulary of {} tokens", ids[r],
              c.vocab_size);
  m.out_rows = 0;
  m.cache->begin_step(seqs, n);  // context overflow / exhausted pool: thrown here, before any work
  struct AbortUnlessCommitted {  // a launch that throws leaves the cache ready for the next step (and for frees)
    GpuKvCache& cache;
    bool committed = false;
    ~AbortUnlessCommitted() {
      if (!committed) cache.abort_step();
    }
  } guard{*m.cache};
  m.h_pos.resize(size_t(rows));
  m.h_last.resize(seqs.size());
  int row = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int pos0 = m.cache->length(seqs[b]);
    for (int i = 0; i < n[b]; ++i) m.h_pos[size_t(row + i)] = pos0 + i;
    row += n[b];
    m.h_last[b] = row - 1;
  }
  // Pageable-memory async copies return once the host data is staged, so the host vectors may be reused.
  check(cudaMemcpyAsync(m.ids.get(), ids, size_t(rows) * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream),
        "upload ids");
  check(cudaMemcpyAsync(m.pos.get(), m.h_pos.data(), size_t(rows) * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream),
        "upload positions");
  check(cudaMemcpyAsync(m.last_rows.get(), m.h_last.data(), seqs.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                        m.stream),
        "upload last rows");
  m.hook_pos0 = m.h_pos.front();

  const int out_rows = which == LogitRows::None ? 0 : which == LogitRows::All ? rows : int(seqs.size());
  const bool decode = std::all_of(n.begin(), n.end(), [](int nb) { return nb == 1; });
  const StepRange range(decode);
  if (m.graphs && decode && !m.hook && !m.cache->step_off_signature())
    m.run_graphed({rows, out_rows, which, argmax != nullptr, m.cache->step_signature(c.n_heads)});
  else
    m.enqueue_step(rows, out_rows, which, argmax != nullptr);
  m.cache->commit_step();
  guard.committed = true;
  if (which == LogitRows::None) return;

  const int V = c.vocab_size;
  m.h_finite.resize(size_t(out_rows));
  check(cudaMemcpyAsync(m.h_finite.data(), m.finite.get(), size_t(out_rows) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                        m.stream),
        "download finite flags");
  if (argmax)
    check(cudaMemcpyAsync(argmax, m.argmax.get(), size_t(out_rows) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                          m.stream),
          "download argmax");
  if (logits)
    check(cudaMemcpyAsync(logits, m.logits.get(), size_t(out_rows) * V * sizeof(float), cudaMemcpyDeviceToHost,
                          m.stream),
          "download logits");
  check(cudaStreamSynchronize(m.stream), "GpuModel::forward");
  for (int r = 0; r < out_rows; ++r)
    KVQ_CHECK(m.h_finite[size_t(r)], "non-finite logits in row {} of the step (numerical overflow in the model)", r);
  m.out_rows = out_rows;
}

int GpuModel::max_top_logits() const { return kMaxSortedTopK; }

void GpuModel::top_logits(int k, int32_t* ids, float* logits) {
  Impl& m = *impl_;
  const int V = m.cfg.vocab_size;
  m.check_kept_rows("top_logits");
  KVQ_CHECK(k >= 1 && k <= kMaxSortedTopK && k <= V, "top_logits: k = {} (1 to {})", k,
            std::min(kMaxSortedTopK, V));
  check(kernels::top_k_rows(m.logits.as<float>(), m.out_rows, V, k, m.top_ids.as<int32_t>(), m.top_vals.as<float>(),
                            m.stream),
        "top_k_rows");
  const size_t n = size_t(m.out_rows) * size_t(k);
  check(cudaMemcpyAsync(ids, m.top_ids.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream),
        "download top ids");
  check(cudaMemcpyAsync(logits, m.top_vals.get(), n * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
        "download top logits");
  check(cudaStreamSynchronize(m.stream), "GpuModel::top_logits");
}

bool GpuModel::gumbel_sampling() const { return true; }

void GpuModel::gumbel_argmax(const gumbel::Draw* draws, int32_t* ids) {
  Impl& m = *impl_;
  m.check_kept_rows("gumbel_argmax");
  for (int r = 0; r < m.out_rows; ++r)
    KVQ_CHECK(draws[r].temperature > 0 && std::isfinite(draws[r].temperature), "gumbel_argmax: temperature {}",
              draws[r].temperature);
  const size_t n = size_t(m.out_rows);
  check(cudaMemcpyAsync(m.draws.get(), draws, n * sizeof(gumbel::Draw), cudaMemcpyHostToDevice, m.stream),
        "upload draws");
  check(kernels::gumbel_argmax_rows(m.logits.as<float>(), m.out_rows, m.cfg.vocab_size, m.draws.as<gumbel::Draw>(),
                                    m.drawn.as<int32_t>(), m.stream),
        "gumbel_argmax_rows");
  check(cudaMemcpyAsync(ids, m.drawn.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream), "download draws");
  check(cudaStreamSynchronize(m.stream), "GpuModel::gumbel_argmax");
}

void GpuModel::row_mass(const smath::MassQuery* queries, smath::RowMass* out) {
  Impl& m = *impl_;
  m.check_kept_rows("row_mass");
  for (int r = 0; r < m.out_rows; ++r)
    KVQ_CHECK(queries[r].temperature > 0 && std::isfinite(queries[r].temperature), "row_mass: temperature {}",
              queries[r].temperature);
  const size_t n = size_t(m.out_rows);
  check(cudaMemcpyAsync(m.mass_queries.get(), queries, n * sizeof(smath::MassQuery), cudaMemcpyHostToDevice, m.stream),
        "upload mass queries");
  check(kernels::row_mass(m.logits.as<float>(), m.out_rows, m.cfg.vocab_size, m.mass_queries.as<smath::MassQuery>(),
                          m.masses.as<smath::RowMass>(), m.stream),
        "row_mass");
  check(cudaMemcpyAsync(out, m.masses.get(), n * sizeof(smath::RowMass), cudaMemcpyDeviceToHost, m.stream),
        "download masses");
  check(cudaStreamSynchronize(m.stream), "GpuModel::row_mass");
}

void GpuModel::row_logits(int row, float* out) {
  Impl& m = *impl_;
  KVQ_CHECK(row >= 0 && row < m.out_rows, "row_logits: row {} of the {} the last forward returned", row, m.out_rows);
  const size_t V = size_t(m.cfg.vocab_size);
  check(cudaMemcpyAsync(out, m.logits.as<float>() + size_t(row) * V, V * sizeof(float), cudaMemcpyDeviceToHost,
                        m.stream),
        "download a row of logits");
  check(cudaStreamSynchronize(m.stream), "GpuModel::row_logits");
}

void GpuModel::Impl::enqueue_step(int rows, int out_rows, LogitRows which, bool want_argmax) {
  const ModelConfig& c = cfg;
  const int H = c.hidden_size, V = c.vocab_size;
  if (gemm == GemmPrecision::Bf16)
    check(kernels::embed_gather_bf16(embed.w.as<uint16_t>(), ids.as<int32_t>(), rows, H, x.as<float>(), stream),
          "embed_gather");
  else
    check(kernels::embed_gather_f32(embed.w.as<float>(), ids.as<int32_t>(), rows, H, x.as<float>(), stream),
          "embed_gather");
  pending = false;
  for (int l = 0; l < c.n_layers; ++l) {
    if (hook) hook_input(l, rows);
    attention_block(l, rows);
    mlp_block(l, rows);
    if (hook) {
      flush_stream(rows);
      hook->on_layer_output(l, hook_pos0, rows, download_act(x, rows));
    }
  }
  if (which == LogitRows::None) return;
  // Final norm of the wanted rows into h, then lm_head.
  if (which == LogitRows::All)
    norm_stream(rows, final_norm);
  else {
    flush_stream(rows);
    check(kernels::gather_rows(x.as<float>(), last_rows.as<int32_t>(), out_rows, H, h.as<float>(), stream),
          "gather_rows");
    check(kernels::rms_norm(h.as<float>(), out_rows, H, final_norm.as<float>(), c.rms_eps, gemm_input(h.as<float>()),
                            stream),
          "final norm");
  }
  linear(h.as<float>(), out_rows, output(), logits.as<float>(), /*staged=*/true);
  check(kernels::finite_rows(logits.as<float>(), out_rows, V, finite.as<int32_t>(), stream), "finite_rows");
  if (want_argmax)
    check(kernels::argmax_rows(logits.as<float>(), out_rows, V, argmax.as<int32_t>(), stream), "argmax_rows");
}

void GpuModel::Impl::run_graphed(const StepKey& key) {
  if (graph.exec && graph.key == key) {
    check(cudaGraphLaunch(graph.exec, stream), "cudaGraphLaunch");
    ++graph_replays;
    return;
  }
  // A shape seen once runs eagerly (that also loads its kernels); the second time it is captured, then replayed.
  if (!graph.seen || !(*graph.seen == key)) {
    graph.seen = key;
    enqueue_step(key.rows, key.out_rows, key.which, key.argmax);
    return;
  }
  graph.reset();
  cudaGraph_t g = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    enqueue_step(key.rows, key.out_rows, key.which, key.argmax);
  } catch (...) {
    cudaStreamEndCapture(stream, &g);  // leave the stream usable; the error that stopped the capture is the one thrown
    if (g) cudaGraphDestroy(g);
    throw;
  }
  check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
  const cudaError_t e = cudaGraphInstantiate(&graph.exec, g, 0);
  cudaGraphDestroy(g);
  check(e, "cudaGraphInstantiate");
  graph.key = key;
  check(cudaGraphLaunch(graph.exec, stream), "cudaGraphLaunch");
  ++graph_replays;
}

void GpuModel::set_cuda_graphs(bool on) {
  impl_->graphs = on;
  impl_->graph.reset();
  impl_->graph.seen.reset();
}
bool GpuModel::cuda_graphs() const { return impl_->graphs; }
int64_t GpuModel::cuda_graph_replays() const { return impl_->graph_replays; }

}  // namespace kvq::cuda
