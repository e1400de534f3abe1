import torch
from torch.utils.data import DataLoader


@torch.inference_mode()
def predict(model, tokenizer, texts, device, batch_size=64):
    loader = DataLoader(texts, batch_size=batch_size, shuffle=False)
    all_logits = None
    all_logits_parts = []
    for batch in loader:
        enc = tokenizer(batch, padding=True, return_tensors="pt").to(device)
        logits = model(**enc).logits  # (batch, classes)
        all_logits_parts.append(logits)
    all_logits = torch.cat(all_logits_parts, dim=0) if all_logits_parts else None
    return all_logits
