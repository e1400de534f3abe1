import torch
import torch.nn as nn

model = build_model()
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)  # reported, never fixed: DDP needs a launcher
model = model.cuda()
