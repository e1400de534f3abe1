"""Resume a training run: risky for GPU memory in two places."""

import torch
from torch.utils.data import DataLoader
loader = DataLoader(range(4096), batch_size=512)
state = torch.load("checkpoint.pt")
model.cuda().load_state_dict(state["model"])
