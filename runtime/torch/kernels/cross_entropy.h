// The token cross-entropy of a language model's logits in two passes over them, without the
// float32 copy of every logit that LibTorch's composition makes (to(float32), log_softmax,
// nll, and their gradients: for GPT-2 small's batch of 16 x 1024 tokens over 50,257 words,
// several passes over 3.3 GB). As llm.c's fused classifier: the forward reads each row once
// (an online maximum and sum of exponentials, float32) and keeps its log-sum-exp; the
// backward reads it again and writes the gradient, (softmax - one-hot) * scale, in the logits'
// own type.
//
// Plain CUDA C++ behind a header without CUDA or LibTorch types (runtime/torch/fused_ops.cc
// calls it). Rows are `row_stride` elements apart (>= vocab): a padded stride keeps the LM
// head's products on aligned leading dimensions.
#pragma once

#include <cstdint>

namespace tandem::runtime::kernels {

enum class LogitType { kFloat32, kBFloat16 };

// For each row r < rows: row_lse[r] = log(sum_v exp(logits[r, v])) over v < vocab, and
// row_loss[r] = row_lse[r] - logits[r, targets[r]], or 0 where targets[r] == ignore_index.
// A target outside [0, vocab) otherwise gives NaN for its row. Returns a cudaError_t value
// (0: launched).
int CrossEntropyForward(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                        int64_t row_stride, const int64_t* targets, int64_t ignore_index,
                        float* row_lse, float* row_loss, void* stream);

// grad[r, v] = (exp(logits[r, v] - row_lse[r]) - (v == targets[r])) * *scale, written in the
// logits' type with the logits' row stride (columns >= vocab untouched); rows whose target is
// ignore_index get zeros. `scale` is a device pointer (the loss's gradient over the count of
// targets), so nothing waits for the host. `grad` may be `logits` itself.
int CrossEntropyBackward(const void* logits, LogitType type, int64_t rows, int64_t vocab,
                         int64_t row_stride, const int64_t* targets, int64_t ignore_index,
                         const float* row_lse, const float* scale, void* grad, void* stream);

}  // namespace tandem::runtime::kernels
