"""Writes what hf_llama trains, and checks what it wrote, with transformers.

    python save_hf_llama.py DIR             # the venv's Python (torch and transformers)
    python save_hf_llama.py --check DIR OUT

DIR gets transformers' own files for a LlamaForCausalLM of 4 layers (config.json and
model.safetensors, from save_pretrained) and tokens.bin: 4,000 ids as 2-byte integers, a sequence
that repeats every 37 ids, so that the next id is learnable and the loss falls within a few steps.
Exits 3 where transformers cannot be imported. --check loads DIR and hf_llama's OUT with LlamaForCausalLM.from_pretrained and fails unless
transformers' own loss over the first windows of tokens.bin is lower with OUT's weights.
"""
import os
import sys

import numpy
import torch

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as error:
    print(f"save_hf_llama.py: transformers cannot be imported: {error}")
    sys.exit(3)  # the package test then builds hf_llama without running it


def causal_lm_loss(directory, ids):
    model = LlamaForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        return model(ids, labels=ids).loss.item()


if len(sys.argv) == 4 and sys.argv[1] == "--check":
    given, trained = sys.argv[2], sys.argv[3]
    ids = numpy.fromfile(os.path.join(given, "tokens.bin"), dtype=numpy.int16)[: 8 * 16]
    ids = torch.from_numpy(ids.astype(numpy.int64)).view(8, 16)
    before, after = causal_lm_loss(given, ids), causal_lm_loss(trained, ids)
    print(f"transformers' loss over 8 windows of 16 ids: {before:.4f} before, {after:.4f} after")
    sys.exit(0 if after < before else f"{trained} does not lower transformers' loss")
if len(sys.argv) != 2:
    sys.exit("usage: save_hf_llama.py DIR | --check DIR OUT")
directory = sys.argv[1]
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     tie_word_embeddings=False)
LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
ids = (torch.arange(4000) * 7 % 37 + 3).to(torch.int16)
ids.numpy().tofile(os.path.join(directory, "tokens.bin"))
print(f"wrote {directory}: a {config.num_hidden_layers}-layer Llama and {ids.numel()} ids")
