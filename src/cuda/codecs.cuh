// Every device codec (one file each), and the row types of the instance table (gpu_instances.h): the one place that
// turns a table row into the codec types its kernels are templated on.
#pragma once

#include <utility>

#include "codecs/half/codec_bf16.cuh"
#include "codecs/int/codec_int.cuh"
#include "codecs/kivi/codec_kivi.cuh"
#include "codecs/llamacpp/codec_llamacpp.cuh"
#include "codecs/oscar/codec_oscar.cuh"
#include "codecs/turboquant/codec_turboquant.cuh"
#include "cuda/gpu_instances.h"

namespace kvq::cuda {

// The value rows of a DeviceCodecOf: its ::values when it names them (OScaR), else its ::type.
template <class C>
struct ValueRowsOf {
  using type = typename C::type;
};
template <class C>
  requires requires { typename C::values; }
struct ValueRowsOf<C> {
  using type = typename C::values;
};

// The device codec types of instance row I's keys and values.
template <int I>
using RowKeys = typename dev::DeviceCodecOf<kGpuInstances[I].k>::type;
template <int I>
using RowValues = typename ValueRowsOf<dev::DeviceCodecOf<kGpuInstances[I].v>>::type;
// The window rows (sink and recent) of every cache.
using WindowRows = dev::Bf16Rows;

template <int I>
constexpr bool row_is_valid() {
  return !RowValues<I>::kKeyBlocks;  // values are per-token rows
}

// THE dispatch point of the cache kernels: calls f(std::integral_constant<int, I>()) for the instance row
// I == instance and returns true; false when instance is no row (-1: the host refused the cache). f instantiates
// the row's kernels from RowKeys<I>, RowValues<I> and kGpuInstances[I].path, so every .cu that expands the table
// compiles exactly its rows.
template <class F, int... I>
bool with_instance_impl(int instance, F& f, std::integer_sequence<int, I...>) {
  static_assert((row_is_valid<I>() && ...), "an instance row's values must be per-token rows");
  return ((instance == I && (f(std::integral_constant<int, I>()), true)) || ...);
}
template <class F>
bool with_instance(int instance, F&& f) {
  return with_instance_impl(instance, f, std::make_integer_sequence<int, kGpuInstanceCount>());
}

}  // namespace kvq::cuda
