import torch
from torch.utils.data import DataLoader


@torch.inference_mode()
def predict(model, tokenizer, texts, device, batch_size=64):
    loader = DataLoader(texts, batch_size=batch_size, shuffle=False)
    all_logits = None
    for batch in loader:
        enc = tokenizer(batch, padding=True, return_tensors="pt").to(device)
        logits = model(**enc).logits  # (batch, classes)
        if all_logits is None:
            all_logits = logits
        else:
            all_logits = torch.cat((all_logits, logits), dim=0)
    return all_logits
