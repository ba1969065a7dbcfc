// Eviction at equal bytes (docs/guide/methods.md §5.8; LORE-KV's camp, which has no public code: the row is labelled
// AnDPro-style). Once, after the prompt of P tokens, each (layer, kv head) keeps the sinks, the recent window and the
// prompt tokens of highest score
//   score_t = Σ_{q ∈ obs} Σ_{j ∈ group} p_{q,j,t} · ⟨v_t, o_{q,j} / ‖o_{q,j}‖⟩
// where obs are the last kEvictObserve prompt queries, j the query heads of the kv head's GQA group, p_{q,j,t} the
// softmax of query (q, j) over the prompt tokens t <= q (exact rows) and o_{q,j} = Σ_t p_{q,j,t} v_t its attention
// output. (choice) Each query head's own output normalises its own term (the group is summed over the terms); a zero
// output contributes nothing. The budget holds f = bits / stored bits of a kept row (16 for bf16) of the BF16 bytes at
// a stated context N: every token after the prompt is kept, so floor(f · N) - (N - P) prompt tokens are, and a
// sequence of N tokens stores floor(f · N) tokens' rows, f × its BF16 bytes (within one token's rows). N = P (the
// default) is the prompt's budget: floor(f · P) prompt tokens, f × the prompt's BF16 bytes at context P; the referee
// states N = its context, so that the bytes equal a quantized row's there (referee/methods.h).
// (choice) Ties of score: the lower position is kept. Every kv head keeps the same number of tokens, so the bytes
// are the same for every (layer, head).
#pragma once

#include <vector>

namespace kvq {

inline constexpr int kEvictObserve = 32;  // observation window: the last 32 prompt queries

// Tokens of a prompt of P tokens that an eviction budget of `bits` per element at context N = at_ctx (0: N = P) keeps
// when a kept row stores row_bits per element: min(P, floor(bits · N / row_bits) - (N - P)). kvq::Error unless
// 0 < bits <= row_bits and P <= N, or when the N - P tokens after the prompt (all kept) exceed the budget.
int evict_budget(double bits, int row_bits, int prompt_tokens, int at_ctx = 0);

// kvq::Error unless a budget of `budget` prompt tokens holds the prompt's sinks [0, min(sink, P)) and recent window
// [max(sink, P - recent), P), which eviction always keeps.
void evict_check_windows(int budget, int sink, int recent, int prompt_tokens);

// score_t for t in [0, n_tokens) of one (layer, kv head): keys, values [n_tokens, d] (the stored rows, decoded),
// queries [n_q, group, d] already scaled by 1/sqrt(d), query i at position q_pos[i] < n_tokens (it reads t <=
// q_pos[i]). Dot products in float (codecs/float_dot.h), the softmax and the score sums in double; d a multiple of 8.
std::vector<double> evict_scores(const float* keys, const float* values, int n_tokens, int d, const float* queries,
                                 const int* q_pos, int n_q, int group);

// The prompt tokens an eviction keeps: evict_budget, once evict_check_windows has passed (the CPU and GPU caches'
// end_prompt and the footprint of the policy).
int evict_kept(double bits, int row_bits, int prompt_tokens, int at_ctx, int sink, int recent);

// The positions kept, increasing: [0, min(sink, P)), the recent window [max(sink, P - recent), P) and the
// highest-scored of the rest (ties: lower position first), budget in all. kvq::Error when the budget cannot hold the
// sinks and the recent window.
std::vector<int> evict_keep(const std::vector<double>& score, int sink, int recent, int budget);

}  // namespace kvq
