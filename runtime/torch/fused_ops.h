// Fused CUDA kernels for the language models (runtime/torch/kernels/): on CUDA tensors, where
// this build has them (LibTorch with CUDA and nvcc), they replace compositions of LibTorch
// operations that each read and write a whole activation; elsewhere (the CPU, a build without
// them, or switched off) the same functions run the composition, so callers need not ask.
//
// The switch is process-wide (`tandem train --fused-kernels on|off`, default on): the
// compositions stay as the reference the fused kernels are tested and measured against.
#pragma once

#include <torch/types.h>

namespace tandem::runtime::libtorch {

// Whether this build has the fused kernels (LibTorch with CUDA, compiled by nvcc).
bool FusedKernelsBuilt();
// Whether the fused kernels run where they apply: built, and not switched off.
bool FusedKernelsEnabled();
void SetFusedKernelsEnabled(bool enabled);

// The mean token cross-entropy of `logits` [..., vocab] (any floating type; rows may be
// padded: row stride >= vocab) against `targets` [...] (int64; -100 ignored, as
// torch's cross_entropy), in float32. On CUDA with the fused kernels: two passes over bf16 or
// float32 logits (kernels/cross_entropy.h), whose gradient has the logits' type and row
// stride; elsewhere cross_entropy of the logits converted to float32.
torch::Tensor TokenCrossEntropyLoss(const torch::Tensor& logits, const torch::Tensor& targets);

// An LM head's products run over a multiple of this many output features where the
// vocabulary is not one (GPT-2's 50,257 words): see DeferrableLinearPadded in
// deferred_linear.h.
constexpr int64_t kPaddedColumns = 64;

}  // namespace tandem::runtime::libtorch
