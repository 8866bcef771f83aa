#!/usr/bin/env python3
"""The reference side of tests/runtime/hf_weights_test.cc: Hugging Face transformers (CPU,
float32, offline) saves tiny random models for `tandem train --init-from` and loads the folders
`tandem checkpoint export` writes.

    hf_weights_reference.py make OUTPUT_FOLDER
        writes OUTPUT_FOLDER/<case>/ with save_pretrained for each case and prints the case
        names, one a line: llama_gqa (grouped-query attention, untied head), llama_tied (tied
        embedding and head), gpt2 (tied, as released), llama_bf16 (llama_gqa's weights stored
        as bfloat16), llama_sharded (llama_gqa in several shards with an index), mistral (a
        sliding window of 32 tokens), qwen2_tied (q/k/v biases, tied), gemma (tied,
        multi-query attention, padding row 0), gemma2 (soft caps, query_pre_attn_scalar,
        sandwich norms, a window of 32 tokens), mistral_short (a window of 8 tokens, shorter
        than the tests' sequences), mixtral (4 experts, 2 a token), qwen2_moe (3 experts, 2 a
        token, a shared expert, the second block dense), granite (its four multipliers away
        from 1), phi3 (q/k/v and gate/up fused, a window of 8 tokens, padding row 3),
        phi3_longrope (LongRoPE with an original context of 8 tokens: the tests' sequences take
        its long factors), granitemoe (4 experts of 16 units, 2 a token, stored fused), olmo
        (weightless layer norms, q/k/v clamped to [-0.3, 0.3], biases, padding row 3), olmoe
        (q_norm and k_norm, q/k/v clamped to [-0.5, 0.5], 4 experts of 32 units, 2 a token),
        starcoder2 (layer norms with biases, a plain GELU MLP, biases everywhere, a window of 6
        tokens), phi (one layer norm for the attention and the MLP side by side, half of each
        head rotated, gelu_new, the LM head's bias), gpt_neox (per-head fused query/key/value
        rows, half of each head rotated, the attention and the MLP side by side on their own
        norms; the buffers older checkpoints hold added: the causal mask, its fill value, the
        rotary frequencies), stablelm (layer norms with biases, a quarter of each head rotated,
        q/k/v biases, sequential, a LayerNorm of each query and key head: qk_layernorm), gptj (Phi's block with the first 4 of each head's 8 features
        rotated by pairs of neighbours; its older checkpoints' mask buffers added), cohere
        (weight-only layer norms, side by side, pairs of neighbours rotated, logit_scale 0.25,
        each query and key head normalised apart: use_qk_norm),
        glm (half of each head rotated by pairs of neighbours, q/k/v biases, gate_up_proj),
        falcon (new_decoder_architecture: 2 key/value groups in one query_key_value product, the
        attention and the MLP side by side on ln_attn and ln_mlp, biases, tied), nemotron
        (layer norms scaling by 1 + the weight, squared ReLU without a gate, half of each head
        rotated, biases).

    hf_weights_reference.py loss MODEL_FOLDER TOKENS_FILE
        loads MODEL_FOLDER with from_pretrained and prints one JSON object: "loss", the mean
        token cross-entropy of its logits for TOKENS_FILE's input_ids (int64 [batch, length], a
        safetensors file) against its targets; "missing", "unexpected" and "mismatched", the
        keys from_pretrained reports; "log", every record transformers logged and every Python
        warning raised while loading.
"""
import json
import logging
import os
import sys
import warnings

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, CohereConfig, CohereForCausalLM, Gemma2Config,
                          Gemma2ForCausalLM, GlmConfig, GlmForCausalLM, GemmaConfig,
                          GemmaForCausalLM, GraniteConfig, GraniteForCausalLM, GraniteMoeConfig,
                          GraniteMoeForCausalLM, MistralConfig, MistralForCausalLM,
                          MixtralConfig, MixtralForCausalLM, NemotronConfig,
                          NemotronForCausalLM, OlmoConfig, OlmoeConfig,
                          OlmoeForCausalLM, OlmoForCausalLM, Phi3Config, Phi3ForCausalLM,
                          GPTNeoXConfig, GPTNeoXForCausalLM, PhiConfig, PhiForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, StableLmConfig, StableLmForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Starcoder2Config,
                          Starcoder2ForCausalLM)

sys.dont_write_bytecode = True  # nothing written into the source tree
from tiny_models import falcon, gpt2, gptj, llama, perturb  # noqa: E402


def add_old_buffers(model, path):
    """Adds to a GPT-NeoX or GPT-J checkpoint the buffers that older ones (Pythia's, GPT-J-6B's,
    as published) hold in each block: the causal mask (bool), its fill value and GPT-NeoX's
    rotary frequencies."""
    tensors = load_file(path)
    positions = model.config.max_position_embeddings
    if model.config.model_type == "gptj":
        for block in range(model.config.num_hidden_layers):
            prefix = f"transformer.h.{block}.attn."
            tensors[prefix + "bias"] = torch.tril(torch.ones(
                (positions, positions), dtype=torch.bool)).view(1, 1, positions, positions)
            tensors[prefix + "masked_bias"] = torch.tensor(-1e9)
        save_file(tensors, path, metadata={"format": "pt"})
        return
    rotary = int(model.config.hidden_size // model.config.num_attention_heads *
                 model.config.rotary_pct)
    for block in range(model.config.num_hidden_layers):
        prefix = f"gpt_neox.layers.{block}.attention."
        tensors[prefix + "bias"] = torch.tril(
            torch.ones((positions, positions), dtype=torch.bool)).view(1, 1, positions, positions)
        tensors[prefix + "masked_bias"] = torch.tensor(-1e9)
        tensors[prefix + "rotary_emb.inv_freq"] = 1.0 / (
            10000 ** (torch.arange(0, rotary, 2).float() / rotary))
    save_file(tensors, path, metadata={"format": "pt"})


def make(output):
    cases = [
        ("llama_gqa", lambda: llama(), {}),
        ("llama_tied", lambda: llama(tie_word_embeddings=True), {}),
        ("gpt2", lambda: gpt2(), {}),
        ("llama_bf16", lambda: llama(), {"dtype": torch.bfloat16}),
        ("llama_sharded", lambda: llama(), {"max_shard_size": "16KB"}),
        ("mistral", lambda: llama(MistralConfig, MistralForCausalLM, sliding_window=32), {}),
        ("qwen2_tied", lambda: llama(Qwen2Config, Qwen2ForCausalLM, tie_word_embeddings=True,
                                     rope_theta=1000000.0), {}),
        ("gemma", lambda: llama(GemmaConfig, GemmaForCausalLM, tie_word_embeddings=True,
                                num_key_value_heads=1, head_dim=16,
                                hidden_activation="gelu_pytorch_tanh"), {}),
        ("gemma2", lambda: llama(Gemma2Config, Gemma2ForCausalLM, tie_word_embeddings=True,
                                 head_dim=8, query_pre_attn_scalar=12,
                                 attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
                                 sliding_window=32, hidden_activation="gelu_pytorch_tanh"), {}),
        ("mistral_short", lambda: llama(MistralConfig, MistralForCausalLM, sliding_window=8), {}),
        ("mixtral", lambda: llama(MixtralConfig, MixtralForCausalLM, num_local_experts=4,
                                  num_experts_per_tok=2), {}),
        ("qwen2_moe", lambda: llama(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=3,
                                    num_experts_per_tok=2, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=32, mlp_only_layers=[1]), {}),
        ("granite", lambda: llama(GraniteConfig, GraniteForCausalLM, embedding_multiplier=3.0,
                                  residual_multiplier=0.5, attention_multiplier=0.2,
                                  logits_scaling=4.0), {}),
        ("phi3", lambda: llama(Phi3Config, Phi3ForCausalLM, sliding_window=8, pad_token_id=3), {}),
        ("phi3_longrope", lambda: llama(Phi3Config, Phi3ForCausalLM, pad_token_id=3,
                                        original_max_position_embeddings=8,
                                        rope_scaling={"type": "longrope",
                                                      "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                      "long_factor": [1.1, 2.5, 6.0, 17.0]}),
         {}),
        ("granitemoe", lambda: llama(GraniteMoeConfig, GraniteMoeForCausalLM, num_local_experts=4,
                                     num_experts_per_tok=2, intermediate_size=16,
                                     embedding_multiplier=2.0, residual_multiplier=0.7,
                                     attention_multiplier=0.3, logits_scaling=3.0), {}),
        ("olmo", lambda: llama(OlmoConfig, OlmoForCausalLM, clip_qkv=0.3, attention_bias=True,
                               pad_token_id=3), {}),
        ("olmoe", lambda: llama(OlmoeConfig, OlmoeForCausalLM, num_experts=4,
                                num_experts_per_tok=2, intermediate_size=32, clip_qkv=0.5), {}),
        ("starcoder2", lambda: llama(Starcoder2Config, Starcoder2ForCausalLM, sliding_window=6,
                                     norm_epsilon=1e-5), {}),
        ("phi", lambda: llama(PhiConfig, PhiForCausalLM, layer_norm_eps=1e-5,
                              partial_rotary_factor=0.5), {}),
        ("gpt_neox", lambda: llama(GPTNeoXConfig, GPTNeoXForCausalLM, layer_norm_eps=1e-5,
                                   rotary_pct=0.5), {"old_buffers": True}),
        ("stablelm", lambda: llama(StableLmConfig, StableLmForCausalLM, layer_norm_eps=1e-5,
                                   partial_rotary_factor=0.25, use_qkv_bias=True,
                                   qk_layernorm=True), {}),
        ("gptj", lambda: gptj(), {"old_buffers": True}),
        ("cohere", lambda: llama(CohereConfig, CohereForCausalLM, layer_norm_eps=1e-5,
                                 logit_scale=0.25, use_qk_norm=True), {}),
        ("glm", lambda: llama(GlmConfig, GlmForCausalLM, head_dim=8, pad_token_id=3), {}),
        ("falcon", lambda: falcon(new_decoder_architecture=True, num_kv_heads=2, bias=True,
                                  tie_word_embeddings=True), {}),
        ("nemotron", lambda: llama(NemotronConfig, NemotronForCausalLM, norm_eps=1e-5,
                                   attention_bias=True, mlp_bias=True), {}),
    ]
    for index, (name, build, options) in enumerate(cases):
        # llama_bf16 and llama_sharded hold llama_gqa's weights.
        seed = 0 if name in ("llama_gqa", "llama_bf16", "llama_sharded") else index
        torch.manual_seed(1000 + seed)
        model = perturb(build(), 2000 + seed)
        if "dtype" in options:
            model = model.to(options["dtype"])
        folder = os.path.join(output, name)
        model.save_pretrained(folder, safe_serialization=True,
                              max_shard_size=options.get("max_shard_size", "5GB"))
        if options.get("old_buffers"):
            add_old_buffers(model, os.path.join(folder, "model.safetensors"))
        print(name)


# transformers' Phi-3 logs this in its attention's forward whenever it runs another attention than
# flash-attention: its own notice, whatever the folder holds.
PHI3_NOTICE = ("WARNING: You are not running the flash-attention implementation, expect numerical "
               "differences.")


def loss(folder, tokens_file):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(f"{record.levelname}: {record.getMessage()}")

    transformers.logging.set_verbosity_warning()
    logger = logging.getLogger("transformers")
    logger.addHandler(Keep(level=logging.WARNING))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, output_loading_info=True, attn_implementation="eager",
            torch_dtype=torch.float32)
    records += [f"warning: {w.message}" for w in caught]
    model.eval()
    tokens = load_file(tokens_file)
    with torch.no_grad():
        # No cache: Gemma 2's (HybridCache) needs torch >= 2.
        logits = model(input_ids=tokens["input_ids"], use_cache=False).logits
        vocab = logits.shape[-1]
        value = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                  tokens["targets"].reshape(-1))
    print(json.dumps({"loss": value.item(), "missing": list(info["missing_keys"]),
                      "unexpected": list(info["unexpected_keys"]),
                      "mismatched": [list(map(str, m)) for m in info["mismatched_keys"]],
                      "log": [r for r in records if r != PHI3_NOTICE]}))


def main():
    torch.set_default_dtype(torch.float32)
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "loss":
        loss(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: hf_weights_reference.py make OUTPUT_FOLDER | "
                 "loss MODEL_FOLDER TOKENS_FILE")


if __name__ == "__main__":
    main()
