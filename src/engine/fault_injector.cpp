#include "engine/fault_injector.h"

#include <new>

#include "common/error.h"

namespace kvq {

Fault parse_fault(std::string_view name) {
  if (name == "error") return Fault::kError;
  if (name == "bad_alloc") return Fault::kBadAlloc;
  if (name == "device_lost") return Fault::kDeviceLost;
  KVQ_FAIL("unknown fault '{}' (error, bad_alloc, device_lost)", name);
}

void FaultInjectingRunner::forward(const std::vector<int>& seqs, const std::vector<int>& n, const int32_t* ids,
                                   LogitRows which, float* logits, int32_t* argmax) {
  switch (Fault(armed_.exchange(int(Fault::kNone)))) {
    case Fault::kNone: return inner_.forward(seqs, n, ids, which, logits, argmax);
    case Fault::kError: ++injected_; KVQ_FAIL("injected fault: a failed check in the step (--test-hooks)");
    case Fault::kBadAlloc: ++injected_; throw std::bad_alloc();
    case Fault::kDeviceLost:
      ++injected_;
      throw DeviceLost("injected fault: the GPU is lost: an illegal memory access was encountered (--test-hooks)");
  }
}

}  // namespace kvq
