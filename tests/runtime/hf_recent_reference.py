#!/usr/bin/env python3
"""The reference models of families newer than the transformers release the test environment
runs (4.46.3, the newest on Debian's torch 1.13): Qwen3, Qwen3-MoE, OLMo 2 and Gemma 3, built and
run by
transformers 4.51.3 on torch 2.5 exactly as hf_reference.py builds and runs the others (tiny
random models, perturbed weights, logits, loss and gradients on fixed tokens), and the greedy
tokens its generate() makes of a prompt (generate.json).

    hf_recent_reference.py OUTPUT_FOLDER

Its output is kept in tests/data/hf_recent/ (hf_models_test.cc and hf_weights_test.cc read it
from there; the build and CI do not run this script). To write it again:

    python3 -m venv /tmp/recent
    /tmp/recent/bin/pip install torch==2.5.1 transformers==4.51.3 safetensors "numpy<2"
    /tmp/recent/bin/python tests/runtime/hf_recent_reference.py tests/data/hf_recent
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import (AutoModelForCausalLM, Gemma3Config,  # noqa: E402
                          Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig,
                          Glm4Config, Glm4ForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from hf_reference import write_cases  # noqa: E402
from tiny_models import llama  # noqa: E402

CASES = {
    # Qwen3: grouped-query attention (4 query heads, 2 key/value heads) with a head_dim that is
    # not hidden / heads, q_norm and k_norm on each head, untied.
    "qwen3_head_dim": lambda: llama(Qwen3Config, Qwen3ForCausalLM, head_dim=16),
    # Qwen3 tied, multi-head, with attention_bias (q/k/v and o_proj), a large rope_theta.
    "qwen3_tied_bias": lambda: llama(Qwen3Config, Qwen3ForCausalLM, head_dim=8,
                                     num_key_value_heads=4, attention_bias=True,
                                     tie_word_embeddings=True, rope_theta=1000000.0),
    # Qwen3-MoE: 4 experts, 2 a token, probabilities as they are, an explicit head_dim.
    "qwen3_moe_experts": lambda: llama(Qwen3MoeConfig, Qwen3MoeForCausalLM, num_experts=4,
                                       num_experts_per_tok=2, moe_intermediate_size=24,
                                       norm_topk_prob=False, head_dim=16),
    # Qwen3-MoE tied, renormalised, its first block dense (mlp_only_layers).
    "qwen3_moe_dense_norm_topk": lambda: llama(Qwen3MoeConfig, Qwen3MoeForCausalLM,
                                               num_experts=3, num_experts_per_tok=2,
                                               moe_intermediate_size=16, norm_topk_prob=True,
                                               mlp_only_layers=[0], tie_word_embeddings=True),
    # One Qwen3-MoE block with the load-balancing loss in the gradients (hf_reference.py's
    # AUX_LOSS cases).
    "qwen3_moe_aux": lambda: llama(Qwen3MoeConfig, Qwen3MoeForCausalLM, num_experts=3,
                                   num_experts_per_tok=2, moe_intermediate_size=16,
                                   num_hidden_layers=1, router_aux_loss_coef=0.5),
    # OLMo 2: q_norm and k_norm over the whole query and key products, norms after the attention
    # and the MLP only, grouped-query attention, padding row 1 (Olmo2Config's default).
    "olmo2_gqa": lambda: llama(Olmo2Config, Olmo2ForCausalLM),
    # OLMo 2 tied, multi-head, with attention_bias and a head_dim that is not hidden / heads.
    "olmo2_tied_bias": lambda: llama(Olmo2Config, Olmo2ForCausalLM, num_key_value_heads=4,
                                     attention_bias=True, tie_word_embeddings=True,
                                     head_dim=16),
    # Gemma 3: block 0 local (a window of 8, shorter than the sequence, at its own rotary base),
    # block 1 global (sliding_window_pattern 2); q_norm and k_norm scaling by 1 + their weight;
    # tied, no soft caps.
    "gemma3_local_global": lambda: llama(Gemma3TextConfig, Gemma3ForCausalLM, head_dim=16,
                                         sliding_window=8, sliding_window_pattern=2,
                                         rope_local_base_freq=100.0, query_pre_attn_scalar=16,
                                         tie_word_embeddings=True),
    # Gemma 3 untied, multi-query, both blocks local (a window as long as the sequence), the
    # logits soft-capped (transformers 4.51's Gemma 3 takes no attn_logit_softcapping: its
    # attention never passes it on, so tandem refuses it).
    "gemma3_softcap": lambda: llama(Gemma3TextConfig, Gemma3ForCausalLM, num_key_value_heads=1,
                                    head_dim=8, sliding_window=16, sliding_window_pattern=3,
                                    query_pre_attn_scalar=12, final_logit_softcapping=3.0),
    # YaRN with an original context (16 of 64 positions): transformers 4.51 takes the factor as
    # their ratio, 4, over the 8 the file gives, and the ramp over the original context.
    "qwen3_yarn": lambda: llama(Qwen3Config, Qwen3ForCausalLM, head_dim=16, rope_theta=100.0,
                                rope_scaling={"rope_type": "yarn", "factor": 8.0,
                                              "original_max_position_embeddings": 16}),
    # Gemma 3's linear scaling (Gemma 3 4B's and larger's): the global block's frequencies
    # divided by 8, the local block's kept.
    "gemma3_linear": lambda: llama(Gemma3TextConfig, Gemma3ForCausalLM, head_dim=16,
                                   sliding_window=8, sliding_window_pattern=2,
                                   rope_local_base_freq=100.0, query_pre_attn_scalar=16,
                                   rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # Phi-3 with Phi-4-mini's partial rotation (half of each head here) and LongRoPE factors for
    # the rotated pairs only; the sequence (16) past the original context (8): the long ones.
    "phi3_partial_longrope": lambda: llama(Phi3Config, Phi3ForCausalLM, pad_token_id=3,
                                           partial_rotary_factor=0.5,
                                           original_max_position_embeddings=8,
                                           rope_scaling={"type": "longrope",
                                                         "short_factor": [1.0, 1.3],
                                                         "long_factor": [1.1, 2.5]}),
    # Gemma 3 4B's kind of checkpoint (Gemma3ForConditionalGeneration): the language model of
    # gemma3_local_global's layout under language_model., beside a tiny SigLIP vision tower
    # and projector that text does not reach; its vocabulary holds the image tokens.
    "gemma3_multimodal": lambda: Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=64, sliding_window=8,
                         sliding_window_pattern=2, rope_local_base_freq=100.0,
                         query_pre_attn_scalar=16, rms_norm_eps=1e-5, initializer_range=0.1,
                         rope_scaling={"rope_type": "linear", "factor": 4.0}),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=63, boi_token_index=61, eoi_token_index=62,
        attn_implementation="eager")),
    # GLM-4-0414: GLM's products (q/k/v biases, gate_up_proj) and rotation by pairs of
    # neighbours over half of an explicit head_dim, four norms a block under its own names.
    "glm4_bias": lambda: llama(Glm4Config, Glm4ForCausalLM, head_dim=16, pad_token_id=3,
                               partial_rotary_factor=0.5, attention_bias=True),
    # Tied, multi-head, no biases, three quarters of each head rotated.
    "glm4_tied_nobias": lambda: llama(Glm4Config, Glm4ForCausalLM, head_dim=8, pad_token_id=3,
                                      num_key_value_heads=4, partial_rotary_factor=0.75,
                                      attention_bias=False, tie_word_embeddings=True),
}

AUX_LOSS = {"qwen3_moe_aux"}


GENERATE_CASES = ["qwen3_head_dim", "qwen3_tied_bias", "qwen3_moe_experts",
                  "qwen3_moe_dense_norm_topk", "olmo2_gqa", "olmo2_tied_bias",
                  "gemma3_local_global", "gemma3_softcap", "qwen3_yarn", "gemma3_linear",
                  "phi3_partial_longrope", "gemma3_multimodal", "glm4_bias", "glm4_tied_nobias"]
NEW_TOKENS = 12


def write_generate_cases(output):
    """OUTPUT/generate.json: for each case of GENERATE_CASES, the greedy tokens transformers'
    generate() makes (with its key/value cache but for Gemma 3's, no end-of-text stop) of a
    prompt of the case's first five input tokens, as generate_reference.py records them."""
    cases = []
    for name in GENERATE_CASES:
        folder = os.path.join(output, name)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
        model.eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        prompt = load_file(os.path.join(folder, "reference.safetensors"))["input_ids"][0, :5]
        prompt = prompt.tolist()
        # Gemma 3's HybridCache in transformers 4.51 departs from the model's own forward pass
        # once the sequence passes the local window (gemma3_linear: from the sixth new token;
        # generate without the cache, and greedy decoding by whole forward passes, agree with
        # each other): its tokens are taken without the cache, as generate_reference.py takes
        # Gemma 2's.
        use_cache = not model.config.model_type.startswith("gemma3")
        if not use_cache:
            model.generation_config.cache_implementation = None
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]),
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, num_beams=1, use_cache=use_cache)
        cases.append({"name": name, "prompt": prompt, "tokens": out[0, len(prompt):].tolist()})
        print(name, "generate")
    with open(os.path.join(output, "generate.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "cases": cases}, f, indent=1)
        f.write("\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hf_recent_reference.py OUTPUT_FOLDER")
    write_cases(sys.argv[1], CASES, AUX_LOSS)
    write_generate_cases(sys.argv[1])


if __name__ == "__main__":
    main()
