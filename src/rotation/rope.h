// Rotary position embedding (RoPE), "rotate half" (GPT-NeoX / Hugging Face) layout: the one definition of the rotary
// maths, used by the model (q and k after their projections) and by the KV cache for key codecs that store keys without
// RoPE (kv/codec_rope.h: NexusQuant, docs/guide/methods.md §5.3), so that removing RoPE at a position is the exact
// transpose of what the model applied there.
//
// Row x at position p: for f < d/2, the pair (x_f, x_{f+d/2}) is rotated by the angle p · inv_freq[f] (an fp32 product,
// as transformers computes it; cos and sin in double, rounded to fp32):
//   forward  (x_f, x_{f+d/2}) <- (x_f c - x_{f+d/2} s,  x_{f+d/2} c + x_f s)
//   inverse  (x_f, x_{f+d/2}) <- (x_f c + x_{f+d/2} s,  x_{f+d/2} c - x_f s)      (the transposed rotation)
#pragma once

namespace kvq {

// In place on rows [n, heads, d] at positions pos0 + i (row i of every head); inv_freq: d / 2 values
// (ModelConfig::rope_inv_freq). inverse: remove RoPE applied at the same positions.
void rope_rows(float* x, int n, int heads, int d, int pos0, const float* inv_freq, bool inverse = false);

// The two steps of rope_rows, for callers that keep the angles of many positions (kv/codec_rope.h):
// cs, sn [d / 2] = cos and sin of position pos's angles; then one row [d] rotated by them (inverse: by their negation).
void rope_angles(int pos, const float* inv_freq, int half, float* cs, float* sn);
void rope_row(float* x, int d, const float* cs, const float* sn, bool inverse = false);

}  // namespace kvq
