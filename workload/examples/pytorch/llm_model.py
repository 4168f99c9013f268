"""The decoder of the example LLM server: transformers' LlamaForCausalLM in a Llama-style
shape with random weights (speed does not depend on their values), and greedy
generation at batch 1 against a KV cache.

Shapes (--shape):
  1b    hidden 2048, 16 layers, 32 query heads and 8 key/value heads (grouped-query
        attention), SwiGLU MLP 8192, vocabulary 32,000, untied output: 1.1 B parameters,
        2.2 GB in bf16 (Llama 3.2 1B's body with Llama 2's vocabulary)
  tiny  hidden 64, 2 layers, 4 and 2 heads, MLP 128, vocabulary 32,000: for a CPU

Runners (--runner):
  eager     a DynamicCache and one eager forward per token: what a plain service runs,
            bound by the host launching each of its kernels
  compiled  PyTorch's fastest at batch 1: a StaticCache of --max-len positions and the
            decode step under torch.compile(mode="reduce-overhead", fullgraph=True),
            replayed as a CUDA graph; the prompt's prefill runs eagerly (its length
            varies); compiling takes a while on the first requests (warm-up)
"""

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

PRECISIONS = ("fp32", "bf16")
SHAPES = {
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128),
}
VOCAB = 32_000


def build(shape: str, precision: str, device: str, max_len: int):
    """Returns (model, config): the decoder in eval mode on `device` in `precision`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: use one of {', '.join(SHAPES)}")
    config = LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=max_len,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        tie_word_embeddings=False,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    # Built on the device: random initialisation of a billion weights on the CPU takes
    # a minute.
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype=dtype).eval()
    return model, config


def generate(model, prompt_ids, max_tokens: int, device: str):
    """Greedy tokens for `prompt_ids`, one at a time as each is known: prefill of the
    whole prompt with causal attention, then one decode step per token against the KV
    cache. Yields each token's id (its .item() waits for the GPU, so a token is
    yielded when it exists)."""
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], device=device)
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = out.logits[0, -1].argmax()
        yield int(token.item())
        for _ in range(max_tokens - 1):
            out = model(input_ids=token.view(1, 1), past_key_values=cache, use_cache=True)
            token = out.logits[0, -1].argmax()
            yield int(token.item())


class CompiledGenerator:
    """Greedy generation with a static KV cache and the decode step compiled and replayed
    as a CUDA graph (the transformers/gpt-fast recipe)."""

    def __init__(self, model, max_len: int, device: str):
        self.model, self.device, self.max_len = model, device, max_len
        try:
            self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        except TypeError:  # transformers before 4.56 wants the batch, device and dtype
            self.cache = StaticCache(
                config=model.config,
                max_batch_size=1,
                max_cache_len=max_len,
                device=device,
                dtype=next(model.parameters()).dtype,
            )
        self.step = torch.compile(self._step, mode="reduce-overhead", fullgraph=True)

    def _step(self, token, pos):
        out = self.model(
            input_ids=token,
            position_ids=pos.view(1, 1),
            cache_position=pos,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits[0, -1].argmax().view(1, 1)

    def __call__(self, prompt_ids, max_tokens: int):
        if len(prompt_ids) + max_tokens > self.max_len:
            raise ValueError(f"{len(prompt_ids)} prompt tokens and {max_tokens} to generate exceed --max-len {self.max_len}")
        with torch.inference_mode():
            self.cache.reset()
            n = len(prompt_ids)
            ids = torch.tensor([prompt_ids], device=self.device)
            out = self.model(
                input_ids=ids,
                cache_position=torch.arange(n, device=self.device),
                past_key_values=self.cache,
                use_cache=True,
            )
            token = out.logits[0, -1].argmax().view(1, 1)
            yield int(token.item())
            pos = torch.tensor([n], device=self.device)
            for _ in range(max_tokens - 1):
                torch.compiler.cudagraph_mark_step_begin()
                token = self.step(token, pos).clone()
                pos += 1
                yield int(token.item())
