#!/usr/bin/env python3
"""The reference side of tests/runtime/generate_test.cc: Hugging Face transformers (CPU,
float32, offline) saves tiny random models and records what its greedy generate() makes of a
prompt; a byte-level BPE tokenizer (tokenizers) for the text case.

    generate_reference.py make OUTPUT_FOLDER
        writes OUTPUT_FOLDER/<case>/ with save_pretrained for each case and OUTPUT_FOLDER/
        cases.json: [{"name", "prompt": [ids], "tokens": [the new ids greedy generate gives],
        "text": the prompt text or null}]. Cases: llama_gqa (grouped-query attention, untied
        head), llama_tied, gpt2 (tied), gpt2_scaled (attention scaled by the inverse layer
        index), gpt2_text (a 320-token model with OUTPUT_FOLDER/tokenizer.json: the prompt is
        text, encoded by that tokenizer), llama_text (a Llama with a tokenizer in Llama 3's
        layout, OUTPUT_FOLDER/llama_tokenizer.json: Split by Llama 3's pattern, and a template
        that puts the beginning-of-text token first, which the prompt then starts with, as
        transformers' tokenizer(text) gives it), mistral_window (a sliding window of 6
        tokens, shorter than the prompt and new tokens), qwen2_text (q/k/v biases, tied, with a
        tokenizer in Qwen2's layout: NFC, Split by Qwen2's pattern; the prompt text has a
        decomposed accent), gemma_text (multi-query attention, with a tokenizer in Gemma's
        layout, gemma_tokenizer.json: the Replace normalizer, Split(" ", MergedWithPrevious),
        byte fallback, a <s> template; untied, as the Gemma cases are here: a tied random Gemma
        repeats its last token), gemma2_window (soft caps,
        sandwich norms, a window of 6 tokens on every other block), mixtral_window (4
        experts, 2 a token, a window of 6 tokens), qwen2_moe (3 experts, 2 a token, a shared
        expert, the second block dense), granite (its multipliers away from 1), granitemoe
        (4 experts, 2 a token, stored fused), phi3_window
        (fused products in the checkpoint, a window of 6 tokens), phi3_longrope (LongRoPE's
        long factors: the prompt is longer than its original context), olmo_clip (weightless
        layer norms, q/k/v clamped, the cached keys and values too), olmoe (q_norm and k_norm
        before the clamp, 4 experts, 2 a token), starcoder2_window (layer norms with biases, a
        plain GELU MLP, biases everywhere, a window of 6 tokens), phi (the attention and the MLP
        side by side, half of each head rotated, the cached keys rotated alike), gpt_neox (per-head
        fused query/key/value rows, a quarter of each head rotated), stablelm (side by side on one
        layer norm, a quarter of each head rotated, each query and key head normalised apart), gptj (pairs of neighbours rotated in the
        cached keys too), cohere (weight-only layer norms, pairs of neighbours rotated, the logits
        scaled, each query and key head normalised apart), glm (half of each head rotated by pairs of neighbours), falcon (2 key/value
        groups in one query_key_value product, the cached keys and values per group), nemotron
        (half of each head rotated in the cached keys, offset layer norms, squared ReLU),
        llama_eos (see end_of_text_case). "tokenizer" names the case's
        tokenizer file, "shown" the text the command prints (the prompt normalized).

    generate_reference.py generate MODEL_FOLDER PROMPT_IDS MAX_NEW_TOKENS
        prints the new ids of greedy generate (comma-separated) for PROMPT_IDS ("1,2,3") with
        the model of MODEL_FOLDER (a `tandem checkpoint export`).
"""
import json
import os
import sys
import unicodedata

import torch
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

NEW_TOKENS = 20
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views of such "
        "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
        "minds of the surrounding families, that he is considered the rightful property of some "
        "one or other of their daughters. ") * 8
PROMPT_TEXT = "However little known the feelings"


def greedy(model, prompt, new_tokens):
    model.eval()
    # Gemma 2's cache (HybridCache) needs torch >= 2 (torch._dynamo): its greedy tokens are
    # taken without a cache, each step's forward over the whole sequence.
    use_cache = model.config.model_type != "gemma2"
    if not use_cache:
        model.generation_config.cache_implementation = None
    # No end-of-text stop: exactly new_tokens tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                                                               dtype=torch.long),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, num_beams=1, use_cache=use_cache,
                             # Debian's torch 1.13 cannot import torch.distributed.fsdp under
                             # Python 3.11, which the default (None) makes generate import.
                             synced_gpus=False)
    return out[0, len(prompt):].tolist()


def train_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT], trainer=trainer)
    tokenizer.save(path)
    return tokenizer


# With a decomposed accent, which Qwen2's NFC normalizer composes.
QWEN2_PROMPT_TEXT = "However little known the fe\u0301elings"


def tokenizer_reference():
    """tests/tokens/tokenizer_reference.py: its tokenizers in Llama 3's, Qwen2's and Gemma's
    layouts."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokens"))
    import tokenizer_reference as module
    return module


def gemma_tokenizer(output):
    """A tokenizer in Gemma's layout trained on TEXT, saved as OUTPUT/gemma_tokenizer.json."""
    from tokenizers import Tokenizer
    module = tokenizer_reference()
    corpus = os.path.join(output, "gemma_corpus.txt")
    with open(corpus, "w", encoding="utf-8") as stream:
        stream.write(TEXT)
    data = module.gemma_style(module.llama2_style([corpus],
                                                  os.path.join(output, "gemma_trained.json")))
    path = os.path.join(output, "gemma_tokenizer.json")
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(data, stream, ensure_ascii=False)
    return Tokenizer.from_file(path)


def make(output):
    os.makedirs(output, exist_ok=True)
    tokenizer = train_tokenizer(os.path.join(output, "tokenizer.json"))
    text_prompt = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False).ids
    layouts = tokenizer_reference()
    llama3_style, qwen2_style = layouts.llama3_style, layouts.qwen2_style
    llama_tokenizer = llama3_style([TEXT], vocab_size=320)
    llama_tokenizer.save(os.path.join(output, "llama_tokenizer.json"))
    llama_prompt = llama_tokenizer.encode(PROMPT_TEXT).ids  # add_special_tokens by default
    qwen2_tokenizer = qwen2_style([TEXT], vocab_size=320)
    qwen2_tokenizer.save(os.path.join(output, "qwen2_tokenizer.json"))
    qwen2_prompt = qwen2_tokenizer.encode(QWEN2_PROMPT_TEXT).ids
    gemma_tokenizer_ = gemma_tokenizer(output)
    gemma_prompt = gemma_tokenizer_.encode(PROMPT_TEXT).ids
    cases = [
        ("llama_gqa", lambda: llama(), [3, 14, 15, 9, 2, 6]),
        ("llama_tied", lambda: llama(tie_word_embeddings=True), [1, 2, 3]),
        ("gpt2", lambda: gpt2(n_positions=48), [5, 40, 7, 7, 61]),
        ("gpt2_scaled", lambda: gpt2(n_positions=48, scale_attn_by_inverse_layer_idx=True), [11]),
        ("gpt2_text", lambda: gpt2(n_positions=48, vocab_size=320), text_prompt),
        ("llama_text", lambda: llama(vocab_size=320), llama_prompt),
        # A window of 6 tokens: the prompt and the new tokens run past it.
        ("mistral_window", lambda: llama(MistralConfig, MistralForCausalLM, sliding_window=6),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("qwen2_text", lambda: llama(Qwen2Config, Qwen2ForCausalLM, tie_word_embeddings=True,
                                     rope_theta=1000000.0, vocab_size=320), qwen2_prompt),
        ("gemma_text", lambda: llama(GemmaConfig, GemmaForCausalLM, tie_word_embeddings=False,
                                     num_key_value_heads=1, head_dim=16,
                                     hidden_activation="gelu_pytorch_tanh",
                                     vocab_size=gemma_tokenizer_.get_vocab_size()),
         gemma_prompt),
        ("gemma2_window", lambda: llama(Gemma2Config, Gemma2ForCausalLM,
                                        tie_word_embeddings=False, head_dim=8,
                                        query_pre_attn_scalar=12, attn_logit_softcapping=2.0,
                                        final_logit_softcapping=5.0, sliding_window=6,
                                        hidden_activation="gelu_pytorch_tanh"),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("mixtral_window", lambda: llama(MixtralConfig, MixtralForCausalLM, num_local_experts=4,
                                         num_experts_per_tok=2, sliding_window=6),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("qwen2_moe", lambda: llama(Qwen2MoeConfig, Qwen2MoeForCausalLM, num_experts=3,
                                    num_experts_per_tok=2, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=32, mlp_only_layers=[1],
                                    initializer_range=0.3),  # wide: varied tokens
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("granite", lambda: llama(GraniteConfig, GraniteForCausalLM, embedding_multiplier=3.0,
                                  residual_multiplier=0.5, attention_multiplier=0.2,
                                  logits_scaling=4.0),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("granitemoe", lambda: llama(GraniteMoeConfig, GraniteMoeForCausalLM, num_local_experts=4,
                                     num_experts_per_tok=2, intermediate_size=16,
                                     embedding_multiplier=2.0, residual_multiplier=0.7,
                                     attention_multiplier=0.3, logits_scaling=3.0,
                                     initializer_range=0.3),  # wide: varied tokens
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("phi3_window", lambda: llama(Phi3Config, Phi3ForCausalLM, sliding_window=6,
                                      pad_token_id=0),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        # LongRoPE whose original context (4) the prompt already passes: its long factors.
        ("phi3_longrope", lambda: llama(Phi3Config, Phi3ForCausalLM, pad_token_id=0,
                                        original_max_position_embeddings=4,
                                        rope_scaling={"type": "longrope",
                                                      "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                      "long_factor": [1.1, 2.5, 6.0, 17.0]}),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("olmo_clip", lambda: llama(OlmoConfig, OlmoForCausalLM, clip_qkv=0.5,
                                    attention_bias=True, pad_token_id=0,
                                    initializer_range=0.3),  # wide: varied tokens
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("olmoe", lambda: llama(OlmoeConfig, OlmoeForCausalLM, num_experts=4,
                                num_experts_per_tok=2, intermediate_size=32, clip_qkv=0.5,
                                pad_token_id=0, initializer_range=0.3),  # wide: varied tokens
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("starcoder2_window", lambda: llama(Starcoder2Config, Starcoder2ForCausalLM,
                                            sliding_window=6, norm_epsilon=1e-5,
                                            initializer_range=0.3),  # wide: varied tokens
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("phi", lambda: llama(PhiConfig, PhiForCausalLM, layer_norm_eps=1e-5,
                              partial_rotary_factor=0.5, initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("gpt_neox", lambda: llama(GPTNeoXConfig, GPTNeoXForCausalLM, layer_norm_eps=1e-5,
                                   rotary_pct=0.25, initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("stablelm", lambda: llama(StableLmConfig, StableLmForCausalLM, layer_norm_eps=1e-5,
                                   partial_rotary_factor=0.25, use_qkv_bias=True,
                                   use_parallel_residual=True, qk_layernorm=True,
                                   initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("gptj", lambda: gptj(initializer_range=0.3), [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("cohere", lambda: llama(CohereConfig, CohereForCausalLM, layer_norm_eps=1e-5,
                                 logit_scale=0.5, use_qk_norm=True, initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("glm", lambda: llama(GlmConfig, GlmForCausalLM, head_dim=8, pad_token_id=None,
                              initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("falcon", lambda: falcon(new_decoder_architecture=True, num_kv_heads=2,
                                  initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
        ("nemotron", lambda: llama(NemotronConfig, NemotronForCausalLM, norm_eps=1e-5,
                                   initializer_range=0.3),
         [7, 1, 44, 2, 9, 30, 12, 5, 5, 61]),
    ]
    tokenizers = {"gpt2_text": "tokenizer.json", "llama_text": "llama_tokenizer.json",
                  "qwen2_text": "qwen2_tokenizer.json", "gemma_text": "gemma_tokenizer.json"}
    texts = {"gpt2_text": PROMPT_TEXT, "llama_text": PROMPT_TEXT,
             "qwen2_text": QWEN2_PROMPT_TEXT, "gemma_text": PROMPT_TEXT}
    records = []
    for index, (name, build, prompt) in enumerate(cases):
        torch.manual_seed(3000 + index)
        model = perturb(build(), 4000 + index)
        model.save_pretrained(os.path.join(output, name), safe_serialization=True)
        if name == "llama_text":  # a Hugging Face folder with its tokenizer
            llama_tokenizer.save(os.path.join(output, name, "tokenizer.json"))
        records.append({"name": name, "prompt": prompt, "tokens": greedy(model, prompt, NEW_TOKENS),
                        "text": texts.get(name),
                        # What the text line shows: the tokenizer's normalization of the text.
                        "shown": (unicodedata.normalize("NFC", texts[name])
                                  if name in texts else None),
                        "tokenizer": tokenizers.get(name)})
    records.append(end_of_text_case(output))
    with open(os.path.join(output, "cases.json"), "w", encoding="utf-8") as stream:
        json.dump(records, stream)


def end_of_text_case(output):
    """llama_eos: a Llama whose generation_config.json names two end-of-text tokens, one of
    which its greedy tokens reach; "tokens" are what transformers' generate gives when left to
    stop there (the end-of-text token included), "stops": true."""
    torch.manual_seed(5000)
    model = perturb(llama(), 6000)
    prompt = [3, 14, 15, 9, 2, 6]
    free = greedy(model, prompt, NEW_TOKENS)
    # The first token to appear from the fourth new one on ends the text; the other
    # end-of-text id never comes.
    end = next(free[i] for i in range(3, len(free)) if free[i] not in free[:i])
    other = next(t for t in range(model.config.vocab_size) if t not in free)
    model.generation_config.eos_token_id = [other, end]
    model.generation_config.pad_token_id = 0
    model.save_pretrained(os.path.join(output, "llama_eos"), safe_serialization=True)
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                                                               dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                             use_cache=True, synced_gpus=False)
    tokens = out[0, len(prompt):].tolist()
    assert tokens == free[:free.index(end) + 1], (tokens, free)
    return {"name": "llama_eos", "prompt": prompt, "tokens": tokens, "text": None,
            "shown": None, "tokenizer": None, "stops": True}


def generate(folder, prompt_ids, new_tokens):
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                 torch_dtype=torch.float32)
    prompt = [int(x) for x in prompt_ids.split(",")]
    print(",".join(str(t) for t in greedy(model, prompt, int(new_tokens))))


def main():
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: generate_reference.py make OUTPUT_FOLDER | "
                 "generate MODEL_FOLDER PROMPT_IDS MAX_NEW_TOKENS")


if __name__ == "__main__":
    main()
