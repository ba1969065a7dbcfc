// TEMPORARY: link stubs for cuda/gpu_cache.h so the gpumodel branch builds before GpuKvCache is merged.
// The lead deletes this file when merging the real implementation.
#include "common/error.h"
#include "cuda/gpu_cache.h"

namespace kvq::cuda {

struct GpuKvCache::Impl {};

#define KVQ_NOT_MERGED KVQ_FAIL("GpuKvCache not merged yet")

bool gpu_codec_supported(const CodecSpec&) { KVQ_NOT_MERGED; }
GpuKvCache::GpuKvCache(const CacheConfig&, int, int, int, int, int) { KVQ_NOT_MERGED; }
GpuKvCache::~GpuKvCache() = default;
const CacheConfig& GpuKvCache::config() const { KVQ_NOT_MERGED; }
int GpuKvCache::n_layers() const { KVQ_NOT_MERGED; }
int GpuKvCache::n_kv_heads() const { KVQ_NOT_MERGED; }
int GpuKvCache::head_dim() const { KVQ_NOT_MERGED; }
int GpuKvCache::max_ctx() const { KVQ_NOT_MERGED; }
int GpuKvCache::max_seqs() const { KVQ_NOT_MERGED; }
void GpuKvCache::set_transform(const KvTransform&) { KVQ_NOT_MERGED; }
int GpuKvCache::new_sequence() { KVQ_NOT_MERGED; }
void GpuKvCache::free_sequence(int) { KVQ_NOT_MERGED; }
int GpuKvCache::length(int) const { KVQ_NOT_MERGED; }
void GpuKvCache::begin_step(const std::vector<int>&, const std::vector<int>&) { KVQ_NOT_MERGED; }
int GpuKvCache::step_rows() const { KVQ_NOT_MERGED; }
void GpuKvCache::append(int, const float*, const float*) { KVQ_NOT_MERGED; }
void GpuKvCache::attention(int, const float*, int, float*) { KVQ_NOT_MERGED; }
void GpuKvCache::commit_step() { KVQ_NOT_MERGED; }
CacheFootprint GpuKvCache::footprint(int) const { KVQ_NOT_MERGED; }
size_t GpuKvCache::bytes_allocated() const { KVQ_NOT_MERGED; }
size_t GpuKvCache::step_bytes_read(int) const { KVQ_NOT_MERGED; }
void* GpuKvCache::stream() const { KVQ_NOT_MERGED; }

}  // namespace kvq::cuda
