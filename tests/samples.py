"""Small scripts shared by the tests of the CLI, the checker and the hooks."""

from __future__ import annotations

# A checkpoint of a CUDA model restored without map_location (OOM501), shown by
# default: the size facts know the model's weights (Llama 2 7B, about 25 GiB).
_LLAMA = (
    'net = transformers.AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf").cuda()\n'
)
RISKY = 'import torch, transformers\nstate = torch.load("x.pt")\n' + _LLAMA + 'net.load_state_dict(state["net"])\n'
# RISKY after OOM501's fix.
FIXED = (
    'import torch, transformers\nstate = torch.load("x.pt", map_location="cpu")\n'
    + _LLAMA
    + 'net.load_state_dict(state["net"])\n'
)
# A model whose weights the size facts know (Llama 2 7B) moved to the GPU, as `net`:
# a checkpoint restored into it without map_location is OOM501 shown by default.
LLAMA_ON_GPU = "import transformers\n" + _LLAMA
