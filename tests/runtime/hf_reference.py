#!/usr/bin/env python3
"""The reference side of tests/runtime/hf_models_test.cc: tiny random Llama, Mistral, Qwen2,
Gemma, Gemma 2, Mixtral, Qwen2-MoE, Granite, GraniteMoE, Phi-3, OLMo, OLMoE, Falcon, Nemotron and GPT-2 models built and run by Hugging Face transformers (CPU, float32),
offline.

    hf_reference.py OUTPUT_FOLDER

writes for each case OUTPUT_FOLDER/<case>/ with config.json and model.safetensors
(save_pretrained) and reference.safetensors holding what transformers computes on fixed tokens:
input_ids and targets (int64 [batch, length]), logits [batch, length, vocab], loss (the mean
token cross-entropy of the logits against the targets) and, after one backward of the loss,
grad.<key> for every parameter key of the state dict (a tied embedding's is the sum over both
uses). Prints the case names, one a line. The cases in AUX_LOSS run the forward with
output_router_logits and take the gradients of the loss plus router_aux_loss_coef x aux_loss
(transformers' load-balancing loss; "loss" is still the cross-entropy alone); their
config.json keeps output_router_logits false.
"""
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM,
                          GlmConfig, GlmForCausalLM, GemmaConfig, GemmaForCausalLM,
                          GraniteConfig, GraniteForCausalLM, GraniteMoeConfig,
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

BATCH, LENGTH = 2, 16


CASES = {
    # Grouped-query attention (4 query heads, 2 key/value heads), untied head.
    "llama_gqa": lambda: llama(),
    # Tied embedding and head, Llama 3's rope scaling with every frequency band in use
    # (head_dim 8, theta 100: wavelengths 6.3 kept, 19.9 interpolated, 62.8 and 199 stretched).
    "llama_tied_rope_scaling": lambda: llama(
        tie_word_embeddings=True, rope_theta=100.0,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    # Multi-head attention with biases and a head_dim that is not hidden / heads.
    "llama_bias_head_dim": lambda: llama(num_key_value_heads=4, head_dim=16, attention_bias=True,
                                         mlp_bias=True),
    # Mistral: Llama's computation with a sliding window, here exactly the sequence's length
    # (the longest for which full causal attention is the windowed one), an explicit head_dim.
    "mistral_window": lambda: llama(MistralConfig, MistralForCausalLM, sliding_window=16,
                                           head_dim=16),
    # Qwen2: biases on q/k/v_proj only, tied, a large rope_theta.
    "qwen2_tied": lambda: llama(Qwen2Config, Qwen2ForCausalLM, tie_word_embeddings=True,
                                       rope_theta=1000000.0),
    # Mistral with a window of 5 tokens over 16: each token attends to itself and the 4
    # before it.
    "mistral_short_window": lambda: llama(MistralConfig, MistralForCausalLM, sliding_window=5),
    # Gemma: norms scaling by 1 + weight, the embedding scaled by sqrt(hidden), GELU (tanh)
    # gates, tied, multi-query attention with head_dim 16, padding row 0.
    "gemma_tied": lambda: llama(GemmaConfig, GemmaForCausalLM, tie_word_embeddings=True,
                                num_key_value_heads=1, head_dim=16,
                                hidden_activation="gelu_pytorch_tanh"),
    # Gemma 2: also the attention's and the MLP's outputs normalised, scores divided by
    # sqrt(query_pre_attn_scalar) != sqrt(head_dim), soft caps small enough to bend the scores
    # and logits of these weights, a window as long as the sequence, exact GELU.
    "gemma2_softcap": lambda: llama(Gemma2Config, Gemma2ForCausalLM, tie_word_embeddings=True,
                                    head_dim=8, query_pre_attn_scalar=12,
                                    attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
                                    sliding_window=16, hidden_activation="gelu"),
    # Gemma 2 with a window of 5 tokens on its first block (every other one), none on the
    # second.
    "gemma2_short_window": lambda: llama(Gemma2Config, Gemma2ForCausalLM,
                                         tie_word_embeddings=True, head_dim=8,
                                         query_pre_attn_scalar=8, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=30.0, sliding_window=5,
                                         hidden_activation="gelu_pytorch_tanh"),
    # Mixtral: 4 experts of 64 units in each block, 2 of them a token (32 tokens, so every
    # expert takes some), grouped-query attention, no window.
    "mixtral_experts": lambda: llama(MixtralConfig, MixtralForCausalLM, num_local_experts=4,
                                     num_experts_per_tok=2),
    # Mixtral with 3 experts, 1 a token (its weight renormalised to 1), tied, a window of 5.
    "mixtral_top1_window": lambda: llama(MixtralConfig, MixtralForCausalLM, num_local_experts=3,
                                         num_experts_per_tok=1, tie_word_embeddings=True,
                                         sliding_window=5),
    # Qwen2-MoE: 4 experts of 32 units, 2 a token, their probabilities not renormalised, a
    # shared expert of 48 units; the second block dense (mlp_only_layers), 64 units.
    "qwen2_moe_shared": lambda: llama(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=48, norm_topk_prob=False,
                                      mlp_only_layers=[1]),
    # Qwen2-MoE renormalised, every second block sparse (decoder_sparse_step 2: the first
    # dense), 3 experts, tied.
    "qwen2_moe_step2": lambda: llama(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=3,
                                     num_experts_per_tok=2, moe_intermediate_size=16,
                                     shared_expert_intermediate_size=32, norm_topk_prob=True,
                                     decoder_sparse_step=2, tie_word_embeddings=True),
    # One block of Mixtral's experts (transformers pools the routers of all blocks for its
    # load-balancing loss: with one block, that is the block's own) with the load-balancing loss
    # weighted 0.5, large enough to move the router's gradient far.
    "mixtral_aux": lambda: llama(MixtralConfig, MixtralForCausalLM, num_local_experts=4,
                                 num_experts_per_tok=2, num_hidden_layers=1,
                                 router_aux_loss_coef=0.5),
    # The same for one Qwen2-MoE block with its shared expert, 3 experts, 2 a token.
    "qwen2_moe_aux": lambda: llama(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=3,
                                   num_experts_per_tok=2, moe_intermediate_size=16,
                                   shared_expert_intermediate_size=32, num_hidden_layers=1,
                                   router_aux_loss_coef=0.5),
    # Granite: the embedding's output scaled, the residual branches scaled, scores times
    # attention_multiplier (not over sqrt(head_dim)), the logits divided, each away from 1.
    "granite_multipliers": lambda: llama(GraniteConfig, GraniteForCausalLM,
                                         embedding_multiplier=3.0, residual_multiplier=0.5,
                                         attention_multiplier=0.2, logits_scaling=4.0),
    # Granite tied, with biases, multi-head attention, the multipliers at GraniteConfig's
    # defaults (1: scores are not divided by sqrt(head_dim)).
    "granite_tied_bias": lambda: llama(GraniteConfig, GraniteForCausalLM, tie_word_embeddings=True,
                                       attention_bias=True, mlp_bias=True,
                                       num_key_value_heads=4),
    # Phi-3: q/k/v and gate/up fused in the checkpoint, a window of 5 tokens, padding row 3.
    "phi3_window": lambda: llama(Phi3Config, Phi3ForCausalLM, sliding_window=5, pad_token_id=3),
    # Phi-3 without a window, grouped-query attention, padding row 5.
    "phi3_gqa": lambda: llama(Phi3Config, Phi3ForCausalLM, pad_token_id=5),
    # Phi-3's LongRoPE past its original context (8 positions, the sequence 16): the long
    # factors, cos and sin scaled by sqrt(1 + ln 8 / ln 8) (64 positions over 8).
    "phi3_longrope": lambda: llama(Phi3Config, Phi3ForCausalLM, pad_token_id=3,
                                   original_max_position_embeddings=8,
                                   rope_scaling={"type": "longrope",
                                                 "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                 "long_factor": [1.1, 2.5, 6.0, 17.0]}),
    # Within its original context (32): the short factors, cos and sin scaled by
    # sqrt(1 + ln 2 / ln 32).
    "phi3_longrope_short": lambda: llama(Phi3Config, Phi3ForCausalLM, pad_token_id=3,
                                         original_max_position_embeddings=32,
                                         rope_scaling={"type": "su",
                                                       "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                       "long_factor": [1.1, 2.5, 6.0, 17.0]}),
    # GraniteMoE: Granite's multipliers, 4 experts of 16 units, 2 a token, stored fused.
    "granitemoe_experts": lambda: llama(GraniteMoeConfig, GraniteMoeForCausalLM,
                                        num_local_experts=4, num_experts_per_tok=2,
                                        intermediate_size=16, embedding_multiplier=2.0,
                                        residual_multiplier=0.7, attention_multiplier=0.3,
                                        logits_scaling=3.0),
    # OLMo: layer norms without weights, the query, key and value products clamped to
    # [-0.3, 0.3] (about three in five of them here), biases, padding row 3.
    "olmo_clip": lambda: llama(OlmoConfig, OlmoForCausalLM, clip_qkv=0.3, attention_bias=True,
                               pad_token_id=3),
    # OLMo tied, grouped-query attention, no clipping, OlmoConfig's padding row 1.
    "olmo_tied": lambda: llama(OlmoConfig, OlmoForCausalLM, tie_word_embeddings=True),
    # OLMoE: RMSNorms over the whole query and key products, then the clamp, 4 experts of 32
    # units, 2 a token, their probabilities not renormalised (OlmoeConfig's default).
    "olmoe_experts": lambda: llama(OlmoeConfig, OlmoeForCausalLM, num_experts=4,
                                   num_experts_per_tok=2, intermediate_size=32, clip_qkv=0.5,
                                   pad_token_id=3),
    # OLMoE renormalised, tied, with biases, no clamp, multi-head attention.
    "olmoe_tied_norm_topk": lambda: llama(OlmoeConfig, OlmoeForCausalLM, num_experts=3,
                                          num_experts_per_tok=2, intermediate_size=32,
                                          norm_topk_prob=True, tie_word_embeddings=True,
                                          attention_bias=True, num_key_value_heads=4),
    # GPT-2 as released: tied, gelu_new.
    "gpt2": lambda: gpt2(),
    # Untied, exact GELU, an explicit n_inner, scores also divided by the block's index + 1.
    "gpt2_untied_variants": lambda: gpt2(tie_word_embeddings=False, activation_function="gelu",
                                         n_inner=48, scale_attn_by_inverse_layer_idx=True),
    # StarCoder 2: layer norms with weights and biases, a plain MLP (c_fc, gelu_pytorch_tanh,
    # c_proj), biases on every product, a window of 5 positions, grouped-query attention.
    "starcoder2_window": lambda: llama(Starcoder2Config, Starcoder2ForCausalLM, sliding_window=5,
                                       norm_epsilon=1e-5),
    # StarCoder 2 tied, without biases (use_bias false: its norms keep theirs), exact GELU,
    # multi-head attention, no window.
    "starcoder2_tied_nobias": lambda: llama(Starcoder2Config, Starcoder2ForCausalLM,
                                            tie_word_embeddings=True, use_bias=False,
                                            hidden_act="gelu", num_key_value_heads=4),
    # Phi: one layer norm whose output the attention and the MLP both take, their outputs added
    # to the block's input; half of each head rotated (4 of 8 features), gelu_new, biases on
    # every product and on the LM head, grouped-query attention.
    "phi_partial": lambda: llama(PhiConfig, PhiForCausalLM, layer_norm_eps=1e-5,
                                 partial_rotary_factor=0.5),
    # Phi tied (the LM head's bias its own), 6 of 8 features rotated, the tanh GELU of torch,
    # multi-head attention.
    "phi_tied_three_quarters": lambda: llama(PhiConfig, PhiForCausalLM, layer_norm_eps=1e-5,
                                             partial_rotary_factor=0.75, tie_word_embeddings=True,
                                             hidden_act="gelu_pytorch_tanh",
                                             num_key_value_heads=4),
    # GPT-NeoX (Pythia): per-head fused query/key/value rows, a quarter of each head rotated (2
    # of 8 features), the attention and the MLP side by side on their own layer norms, exact
    # GELU, biases.
    "gpt_neox_parallel": lambda: llama(GPTNeoXConfig, GPTNeoXForCausalLM, layer_norm_eps=1e-5,
                                       rotary_pct=0.25, rotary_emb_base=10000),
    # GPT-NeoX sequential (use_parallel_residual false), tied, half of each head rotated, no
    # attention biases, gelu_new.
    "gpt_neox_sequential_tied": lambda: llama(GPTNeoXConfig, GPTNeoXForCausalLM,
                                              layer_norm_eps=1e-5, rotary_pct=0.5,
                                              use_parallel_residual=False,
                                              tie_word_embeddings=True, attention_bias=False,
                                              hidden_act="gelu_new"),
    # StableLM side by side on one layer norm (use_parallel_residual), a quarter of each head
    # rotated, q/k/v biases, SwiGLU, grouped-query attention.
    "stablelm_parallel": lambda: llama(StableLmConfig, StableLmForCausalLM, layer_norm_eps=1e-5,
                                       partial_rotary_factor=0.25, use_qkv_bias=True,
                                       use_parallel_residual=True),
    # StableLM sequential (its default), tied, half of each head rotated, no biases.
    "stablelm_sequential_tied": lambda: llama(StableLmConfig, StableLmForCausalLM,
                                              layer_norm_eps=1e-5, partial_rotary_factor=0.5,
                                              tie_word_embeddings=True),
    # GPT-J: one layer norm for the attention and the MLP side by side, the first 4 of each
    # head's 8 features rotated by pairs of neighbours, gelu_new, the LM head's bias.
    "gptj_rotary4": lambda: gptj(),
    # GPT-J tied, every feature rotated (rotary_dim 8), exact GELU.
    "gptj_tied_full": lambda: gptj(rotary_dim=8, tie_word_embeddings=True,
                                   activation_function="gelu"),
    # Cohere: one weight-only layer norm for the attention and the MLP side by side, every
    # feature rotated by pairs of neighbours, the logits times logit_scale, attention biases,
    # untied, grouped-query attention.
    "cohere_bias": lambda: llama(CohereConfig, CohereForCausalLM, layer_norm_eps=1e-5,
                                 logit_scale=0.25, attention_bias=True),
    # Cohere as CohereConfig has it: tied, padding row 0, logit_scale 0.0625.
    "cohere_tied": lambda: llama(CohereConfig, CohereForCausalLM, layer_norm_eps=1e-5,
                                 tie_word_embeddings=True, pad_token_id=0),
    # StableLM 2 12B's: each query and key head normalised apart (qk_layernorm: a LayerNorm
    # without bias per head), side by side on one norm, grouped-query attention.
    "stablelm_qk_layernorm": lambda: llama(StableLmConfig, StableLmForCausalLM,
                                           layer_norm_eps=1e-5, qk_layernorm=True,
                                           use_parallel_residual=True),
    # Command R+: each query and key head normalised apart (use_qk_norm), grouped-query
    # attention.
    "cohere_qk_norm": lambda: llama(CohereConfig, CohereForCausalLM, layer_norm_eps=1e-5,
                                    use_qk_norm=True, logit_scale=0.5),
    # GLM-4: the first half of each head rotated by pairs of neighbours, q/k/v biases, the gate
    # and up products fused in the checkpoint, padding row 3, grouped-query attention.
    "glm_gqa": lambda: llama(GlmConfig, GlmForCausalLM, head_dim=8, pad_token_id=3),
    # GLM tied, without biases, multi-head attention.
    "glm_tied_nobias": lambda: llama(GlmConfig, GlmForCausalLM, head_dim=8, pad_token_id=None,
                                     tie_word_embeddings=True, attention_bias=False,
                                     num_key_value_heads=4),
    # Falcon-7B's layout: one key/value head (multi_query), the attention and the MLP side by
    # side on one norm, no biases, tied.
    "falcon_multi_query": lambda: falcon(tie_word_embeddings=True),
    # Falcon-40B's: new_decoder_architecture with 2 key/value groups, each branch on its own
    # norm (ln_attn, ln_mlp); here with biases.
    "falcon_groups_two_norms": lambda: falcon(new_decoder_architecture=True, num_kv_heads=2,
                                              bias=True),
    # Falcon 2's: groups side by side on one norm (num_ln_in_parallel_attn 1), gelu_new.
    "falcon_groups_one_norm": lambda: falcon(new_decoder_architecture=True, num_kv_heads=2,
                                             num_ln_in_parallel_attn=1, activation="gelu_new"),
    # Sequential blocks with multi-head attention (a group per head) and biases.
    "falcon_sequential": lambda: falcon(multi_query=False, parallel_attn=False, bias=True),
    # Nemotron: layer norms scaling by 1 + the weight (perturbed from 1), squared ReLU without a
    # gate, half of each head rotated, grouped-query attention.
    "nemotron_gqa": lambda: llama(NemotronConfig, NemotronForCausalLM, norm_eps=1e-5),
    # Nemotron tied, with biases everywhere, a quarter of each head rotated, explicit head_dim.
    "nemotron_bias_tied": lambda: llama(NemotronConfig, NemotronForCausalLM, norm_eps=1e-5,
                                        tie_word_embeddings=True, attention_bias=True,
                                        mlp_bias=True, partial_rotary_factor=0.25, head_dim=16),
    # YaRN (no original context: the factor as given, the ramp over max_position_embeddings),
    # theta 100 so that the ramp falls within the 4 frequencies of head_dim 8.
    "llama_yarn": lambda: llama(rope_theta=100.0,
                                rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    # Linear scaling: every frequency divided by the factor.
    "qwen2_linear": lambda: llama(Qwen2Config, Qwen2ForCausalLM,
                                  rope_scaling={"rope_type": "linear", "factor": 4.0}),
}


AUX_LOSS = {"mixtral_aux", "qwen2_moe_aux"}


def write_cases(output, cases, aux_loss):
    """Writes each case of `cases` (name: a function making the model) into OUTPUT/<name>/;
    the cases named in `aux_loss` take their gradients with the load-balancing loss."""
    torch.set_default_dtype(torch.float32)
    for index, (name, make) in enumerate(cases.items()):
        torch.manual_seed(1000 + index)
        model = make()
        model.train()  # no dropout in any case: train and eval compute the same
        perturb(model, 2000 + index)
        folder = os.path.join(output, name)
        model.save_pretrained(folder, safe_serialization=True)
        vocab = getattr(model.config, "text_config", model.config).vocab_size
        tokens = torch.randint(0, vocab, (BATCH, LENGTH + 1),
                               generator=torch.Generator().manual_seed(3000 + index))
        input_ids, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if name in aux_loss:
            result = model(input_ids=input_ids, output_router_logits=True)
        else:
            result = model(input_ids=input_ids)
        logits = result.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        if name in aux_loss:
            (loss + model.config.router_aux_loss_coef * result.aux_loss).backward()
        else:
            loss.backward()
        tensors = {"input_ids": input_ids, "targets": targets,
                   "logits": logits.detach().contiguous(), "loss": loss.detach().reshape([])}
        for key, parameter in model.named_parameters():
            # (A multimodal model's vision tower takes no part in text: no gradient.)
            if parameter.grad is not None:
                tensors["grad." + key] = parameter.grad.detach().contiguous()
        save_file(tensors, os.path.join(folder, "reference.safetensors"),
                  metadata={"transformers": transformers.__version__,
                            "torch": torch.__version__})
        print(name)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hf_reference.py OUTPUT_FOLDER")
    write_cases(sys.argv[1], CASES, AUX_LOSS)


if __name__ == "__main__":
    main()
