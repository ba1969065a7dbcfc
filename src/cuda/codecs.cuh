// Every device codec (one file each), and the row types of the instance table (gpu_instances.h): the one place that
// turns a table row into the codec types its kernels are templated on.
#pragma once

#include <type_traits>
#include <utility>

#include "codecs/fp8/codec_fp8.cuh"
#include "codecs/half/codec_bf16.cuh"
#include "codecs/int/codec_int.cuh"
#include "codecs/kitty/codec_kitty.cuh"
#include "codecs/kivi/codec_kivi.cuh"
#include "codecs/llamacpp/codec_llamacpp.cuh"
#include "codecs/nexus/codec_nexus.cuh"
#include "codecs/oscar/codec_oscar.cuh"
#include "codecs/pnmix/codec_pnmix.cuh"
#include "codecs/turboquant/codec_turboquant.cuh"
#include "cuda/gpu_instances.h"

namespace kvq::cuda {

// The trait probes of cache_device.cuh read what a codec says, and false where it says nothing.
static_assert(dev::token_scaled<dev::DeviceCodecOf<CodecId::kOscarInt2>::type<128>>() &&
              dev::tensor_scaled<dev::DeviceCodecOf<CodecId::kFp8e4m3>::type<128>>() &&
              dev::hadamard_rows<dev::DeviceCodecOf<CodecId::kE8_2>::type<128>>() &&
              dev::pre_rope<dev::DeviceCodecOf<CodecId::kE8_2>::type<128>>());
static_assert(!dev::token_scaled<dev::Bf16Rows<128>>() && !dev::tensor_scaled<dev::Bf16Rows<128>>() &&
              !dev::hadamard_rows<dev::Bf16Rows<128>>() && !dev::pre_rope<dev::Bf16Rows<128>>());

// The value rows of D values of a DeviceCodecOf: its ::values<D> when it names them (OScaR), else its ::type<D>.
template <class C, int D>
struct ValueRowsOf {
  using type = typename C::template type<D>;
};
template <class C, int D>
  requires requires { typename C::template values<D>; }
struct ValueRowsOf<C, D> {
  using type = typename C::template values<D>;
};

// The device codec types of instance row I's keys and values at head dim D.
template <int I, int D>
using RowKeys = typename dev::DeviceCodecOf<kGpuInstances[I].k>::template type<D>;
template <int I, int D>
using RowValues = typename ValueRowsOf<dev::DeviceCodecOf<kGpuInstances[I].v>, D>::type;
// The window rows (sink and recent) of instance row I at head dim D: bf16 rows, or the int8 rows of a row that names
// int8 windows (KV4-RL), read at CacheGeometry::window_group.
template <int I, int D>
using RowWindows =
    std::conditional_t<kGpuInstances[I].window == CodecId::kInt8, dev::IntRows<8, D>, dev::Bf16Rows<D>>;
static_assert(std::is_same_v<RowWindows<0, 128>, dev::Bf16Rows<128>>, "windows are bf16 unless a row says int8");

template <int I>
constexpr bool row_is_valid() {
  return !RowValues<I, kGpuHeadDims[0]>::kKeyBlocks;  // values are per-token rows
}

// THE dispatch point of the cache kernels: calls f(std::integral_constant<int, I>(), std::integral_constant<int, D>())
// for the instance row I == instance compiled at head dim D == head_dim (gpu_row_compiled) and returns true; false when
// there is no such pair (-1: the host refused the cache). f instantiates the row's kernels at D from RowKeys<I, D>,
// RowValues<I, D> and kGpuInstances[I].path (or the kernels of D alone), so every .cu that expands the table compiles
// exactly the (row, d) pairs it lists.
template <int I, int J, class F>
bool with_instance_at(int instance, int head_dim, F& f) {
  constexpr int D = kGpuHeadDims[J];
  if constexpr (gpu_row_compiled(kGpuInstances[I], D)) {
    if (instance == I && head_dim == D) {
      f(std::integral_constant<int, I>(), std::integral_constant<int, D>());
      return true;
    }
  }
  return false;
}
template <int I, class F, int... J>
bool with_instance_dims(int instance, int head_dim, F& f, std::integer_sequence<int, J...>) {
  return (with_instance_at<I, J>(instance, head_dim, f) || ...);
}
template <class F, int... I>
bool with_instance_impl(int instance, int head_dim, F& f, std::integer_sequence<int, I...>) {
  static_assert((row_is_valid<I>() && ...), "an instance row's values must be per-token rows");
  return (with_instance_dims<I>(instance, head_dim, f, std::make_integer_sequence<int, kGpuHeadDimCount>()) || ...);
}
template <class F>
bool with_instance(int instance, int head_dim, F&& f) {
  return with_instance_impl(instance, head_dim, f, std::make_integer_sequence<int, kGpuInstanceCount>());
}

}  // namespace kvq::cuda
