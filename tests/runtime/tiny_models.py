"""Tiny random Hugging Face models for the reference scripts beside this file (hf_reference.py,
hf_weights_reference.py, generate_reference.py): transformers' Llama-family and GPT-2 models
of two layers, hidden size 32, float32, eager attention, their weights perturbed so that a
misplaced norm weight or bias shows.
"""
import inspect

import torch
from transformers import (FalconConfig, FalconForCausalLM, GPT2Config, GPT2LMHeadModel,
                          GPTJConfig, GPTJForCausalLM, LlamaConfig, LlamaForCausalLM)


def _adapt_nemotron_norm_to_old_torch():
    """transformers 4.46.3's NemotronLayerNorm1P passes nn.LayerNorm a `bias` argument, which
    torch 2.1 added; torch 1.13's LayerNorm (Debian's) always has a bias and takes no such
    argument. The constructor is adapted to it; the forward pass, the computation the tests
    compare against, stays transformers' own."""
    if "bias" in inspect.signature(torch.nn.LayerNorm.__init__).parameters:
        return
    from transformers.models.nemotron import modeling_nemotron

    def init(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None,
             dtype=None):
        if not bias:
            raise ValueError("NemotronLayerNorm1P without a bias needs torch 2.1 or later")
        torch.nn.LayerNorm.__init__(self, normalized_shape, eps, elementwise_affine, device,
                                    dtype)

    modeling_nemotron.NemotronLayerNorm1P.__init__ = init


def _adapt_stablelm_head_norms_to_old_torch():
    """transformers 4.46.3's StableLmLayerNormPerHead builds nn.LayerNorm(dim, bias=False), an
    argument torch 2.1 added. On torch 1.13 each head's LayerNorm is built with a bias and the
    bias then removed (F.layer_norm takes none): the same parameters and, in the forward pass
    (transformers' own), the same computation."""
    if "bias" in inspect.signature(torch.nn.LayerNorm.__init__).parameters:
        return
    from transformers.models.stablelm import modeling_stablelm

    def init(self, dim, num_heads, eps=1e-5, bias=False):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.num_heads = num_heads
        norms = []
        for _ in range(num_heads):
            norm = torch.nn.LayerNorm(dim, eps=eps)
            if not bias:
                norm.register_parameter("bias", None)
            norms.append(norm)
        self.norms = torch.nn.ModuleList(norms)

    modeling_stablelm.StableLmLayerNormPerHead.__init__ = init


_adapt_nemotron_norm_to_old_torch()
_adapt_stablelm_head_norms_to_old_torch()


def llama(config_class=LlamaConfig, model_class=LlamaForCausalLM, **overrides):
    """A Llama (or a model of its family: MistralConfig and MistralForCausalLM, ...)."""
    options = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.1,
                   tie_word_embeddings=False, attn_implementation="eager")
    options.update(overrides)
    return model_class(config_class(**options))


def gptj(**overrides):
    """A GPT-J of the same sizes (its own config names)."""
    options = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=64,
                   rotary_dim=4, layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
                   attn_pdrop=0.0, initializer_range=0.1, tie_word_embeddings=False,
                   attn_implementation="eager")
    options.update(overrides)
    return GPTJForCausalLM(GPTJConfig(**options))


def falcon(**overrides):
    """A Falcon of the same sizes (its own config names): Falcon-7B's layout (one key/value
    head, the attention and the MLP side by side on one norm, no biases) unless overridden."""
    options = dict(vocab_size=64, hidden_size=32, ffn_hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=64, rope_theta=10000.0,
                   layer_norm_epsilon=1e-5, initializer_range=0.1, tie_word_embeddings=False,
                   attn_implementation="eager")
    options.update(overrides)
    return FalconForCausalLM(FalconConfig(**options))


def gpt2(**overrides):
    options = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.1,
                   attn_implementation="eager")
    options.update(overrides)
    return GPT2LMHeadModel(GPT2Config(**options))


def perturb(model, seed):
    """Every parameter plus 0.05 N(0, 1) drawn from a generator seeded with `seed`: norm
    weights away from 1 and biases away from 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in model.named_parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model
